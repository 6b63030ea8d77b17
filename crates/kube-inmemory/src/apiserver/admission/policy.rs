//! A ValidatingAdmissionPolicy compiled: its expressions parsed once per stored version
//! (a compile error is kept and reported when the policy is used, under its failure policy).

use cel::Program;
use serde_json::Value;

use super::matching::MatchResources;
use crate::apiserver::crd::rules::ENV;

/// An expression and its program (or why it does not compile).
pub(super) struct Expression {
    /// The source, trimmed.
    pub(super) source: String,
    /// The program.
    pub(super) program: Result<Program, String>,
}

impl Expression {
    fn new(source: &str) -> Self {
        let source = source.trim().to_owned();
        let program = ENV.compile(&source).map_err(|e| format!("compilation failed: {e}"));
        Self { source, program }
    }
}

/// One `validations` entry.
pub(super) struct Validation {
    /// `expression`.
    pub(super) expression: Expression,
    /// `message`, trimmed.
    pub(super) message: Option<String>,
    /// `messageExpression`.
    pub(super) message_expression: Option<Expression>,
    /// `reason` (one of the four the API allows; Invalid when unset).
    pub(super) reason: &'static str,
}

/// A policy ready to evaluate.
pub(crate) struct Compiled {
    /// `metadata.name`.
    pub(super) name: String,
    /// `failurePolicy` is `Ignore` (errors skip the policy instead of refusing).
    pub(super) ignore_failures: bool,
    /// `paramKind` (apiVersion, kind).
    pub(super) param_kind: Option<(String, String)>,
    /// `matchConstraints`.
    pub(super) constraints: MatchResources,
    /// `matchConditions` (name, expression).
    pub(super) conditions: Vec<(String, Expression)>,
    /// `variables` (name, expression), in order.
    pub(super) variables: Vec<(String, Expression)>,
    /// `validations`.
    pub(super) validations: Vec<Validation>,
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// `reason` as the API allows it (Unauthorized, Forbidden, Invalid, RequestEntityTooLarge).
fn reason(v: &Value) -> &'static str {
    match v.get("reason").and_then(Value::as_str) {
        Some("Forbidden") => "Forbidden",
        Some("Unauthorized") => "Unauthorized",
        Some("RequestEntityTooLarge") => "RequestEntityTooLarge",
        _ => "Invalid",
    }
}

fn named(spec: &Value, key: &str) -> Vec<(String, Expression)> {
    spec[key]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                text(v, "name").unwrap_or_default(),
                Expression::new(&text(v, "expression").unwrap_or_default()),
            )
        })
        .collect()
}

/// Compiles the policy object `policy`.
pub(super) fn compile(policy: &Value) -> Compiled {
    let spec = &policy["spec"];
    let validations = spec["validations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| Validation {
            expression: Expression::new(&text(v, "expression").unwrap_or_default()),
            message: text(v, "message").map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()),
            message_expression: text(v, "messageExpression").map(|m| Expression::new(&m)),
            reason: reason(v),
        })
        .collect();
    let param_kind = spec
        .get("paramKind")
        .filter(|p| p.is_object())
        .map(|p| (text(p, "apiVersion").unwrap_or_default(), text(p, "kind").unwrap_or_default()));
    Compiled {
        name: policy.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().into(),
        ignore_failures: spec["failurePolicy"].as_str() == Some("Ignore"),
        param_kind,
        constraints: MatchResources::parse(&spec["matchConstraints"]),
        conditions: named(spec, "matchConditions"),
        variables: named(spec, "variables"),
        validations,
    }
}
