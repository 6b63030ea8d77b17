//! One binding of one policy evaluated on one write: matching, parameters, then per
//! parameter the match conditions, variables and validations, in kube-apiserver's order.

use std::collections::HashMap;
use std::sync::Arc;

use cel::Context;
use serde_json::{Value, json};

use super::matching::{MatchResources, namespace_object, selector_matches};
use super::policy::{Compiled, Expression, Validation};
use super::{Caller, Operation, Write};
use crate::apiserver::crd::rules::ENV;
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::store::Txn;

/// The most bytes of an evaluated `messageExpression` (upstream's limit).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// Why a request is refused (or warned about).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// The validation's message (or the error).
    pub(crate) message: String,
    /// `Forbidden`, `Invalid`, `Unauthorized` or `RequestEntityTooLarge`.
    pub(crate) reason: &'static str,
}

/// What a binding says about a write.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The write is not what the policy or binding is about (or a match condition is false).
    NotMatched,
    /// Every validation held.
    Admitted,
    /// Failed validations (and errors under `failurePolicy: Fail`), in order.
    Refused(Vec<Decision>),
}

/// JSON as CEL sees unstructured objects: whole numbers are `int`, others `double`.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| (k.clone(), to_cel(v)))
            .collect::<HashMap<String, cel::Value>>()
            .into(),
    }
}

fn run(expression: &Expression, context: &Context<'_, '_>) -> Result<cel::Value, String> {
    let program = expression.program.as_ref().map_err(Clone::clone)?;
    program.execute(context).map_err(|e| e.to_string())
}

/// An error under the policy's failure policy: a refusal, or nothing with `Ignore`.
fn failure(compiled: &Compiled, message: String) -> Option<Decision> {
    (!compiled.ignore_failures).then_some(Decision { message, reason: "Invalid" })
}

fn refused(decisions: Vec<Decision>) -> Outcome {
    if decisions.is_empty() { Outcome::Admitted } else { Outcome::Refused(decisions) }
}

/// Evaluates the policy `compiled` through the binding `binding_spec` on `write`.
pub(super) fn binding(
    txn: &Txn<'_>,
    caller: &Caller<'_>,
    write: &Write<'_>,
    compiled: &Compiled,
    binding_spec: &Value,
) -> Outcome {
    let Some(matched) = compiled.constraints.matches(txn, write, true) else {
        return Outcome::NotMatched;
    };
    let narrowed = MatchResources::parse(&binding_spec["matchResources"]);
    if binding_spec.get("matchResources").is_some_and(Value::is_object)
        && narrowed.matches(txn, write, false).is_none()
    {
        return Outcome::NotMatched;
    }
    let params = match params(txn, write, compiled, binding_spec) {
        Ok(params) => params,
        Err(message) => return refused(failure(compiled, message).into_iter().collect()),
    };
    let (name, namespace) = write.name_and_namespace();
    let mut context = Context::with_env(Arc::clone(&ENV));
    let present = |o: Option<&Value>| o.map_or(cel::Value::Null, |o| to_cel(&matched.present(o)));
    context.add_variable_from_value("object", present(write.object));
    context.add_variable_from_value("oldObject", present(write.old_object));
    context.add_variable_from_value(
        "request",
        to_cel(&request(caller, write, &matched, &name, &namespace)),
    );
    let namespace_object = if write.resource.namespaced {
        namespace_object(txn, &namespace).unwrap_or(Value::Null)
    } else {
        Value::Null
    };
    context.add_variable_from_value("namespaceObject", to_cel(&namespace_object));
    let mut decisions = Vec::new();
    let mut matched_any = false;
    for param in &params {
        let mut scope = context.new_inner_scope();
        scope.add_variable_from_value("params", to_cel(param));
        if let Some(outcome) = with_params(compiled, &mut scope) {
            matched_any = true;
            decisions.extend(outcome);
        }
    }
    if !matched_any && !params.is_empty() {
        return Outcome::NotMatched;
    }
    refused(decisions)
}

/// The match conditions, variables and validations with `params` bound: None when a match
/// condition is false, else the decisions.
fn with_params(compiled: &Compiled, scope: &mut Context<'_, '_>) -> Option<Vec<Decision>> {
    let mut condition_error = None;
    for (name, condition) in &compiled.conditions {
        match run(condition, scope) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return None,
            Ok(other) => {
                condition_error.get_or_insert(format!(
                    "matchCondition '{name}' did not evaluate to a bool: {other:?}"
                ));
            }
            Err(e) => {
                condition_error.get_or_insert(format!("matchCondition '{name}': {e}"));
            }
        }
    }
    if let Some(message) = condition_error {
        return Some(failure(compiled, message).into_iter().collect());
    }
    // Each variable sees the ones before it; one that fails is left out, so an expression
    // using it fails (an error, as upstream's lazily evaluated variables give).
    let mut variables: HashMap<String, cel::Value> = HashMap::new();
    for (name, expression) in &compiled.variables {
        scope.add_variable_from_value("variables", variables.clone());
        if let Ok(value) = run(expression, scope) {
            variables.insert(name.clone(), value);
        }
    }
    scope.add_variable_from_value("variables", variables);
    Some(compiled.validations.iter().filter_map(|v| validate(compiled, v, scope)).collect())
}

fn validate(
    compiled: &Compiled,
    validation: &Validation,
    scope: &Context<'_, '_>,
) -> Option<Decision> {
    let source = &validation.expression.source;
    match run(&validation.expression, scope) {
        Ok(cel::Value::Bool(true)) => None,
        Ok(cel::Value::Bool(false)) => {
            Some(Decision { message: message(validation, scope), reason: validation.reason })
        }
        Ok(other) => failure(
            compiled,
            format!(
                "expression '{source}' resulted in error: no such overload: {other:?} is not a bool"
            ),
        ),
        Err(e) => failure(compiled, format!("expression '{source}' resulted in error: {e}")),
    }
}

/// A failed validation's message: its `messageExpression`'s (when that gives a non-empty
/// single line within the limit), else `message`, else `failed expression: <expression>`.
fn message(validation: &Validation, scope: &Context<'_, '_>) -> String {
    validation
        .message_expression
        .as_ref()
        .and_then(|expression| match run(expression, scope) {
            Ok(cel::Value::String(s)) => {
                let t = s.trim();
                (!t.is_empty() && !t.contains('\n') && t.len() <= MAX_MESSAGE_BYTES)
                    .then(|| t.to_owned())
            }
            _ => None,
        })
        .or_else(|| validation.message.clone())
        .unwrap_or_else(|| format!("failed expression: {}", validation.expression.source))
}

/// `request`, as `admission.k8s.io/v1` AdmissionRequest: `matched` is the resource the
/// rules matched (another version under `matchPolicy: Equivalent`).
fn request(
    caller: &Caller<'_>,
    write: &Write<'_>,
    matched: &ResourceInfo,
    name: &str,
    namespace: &str,
) -> Value {
    let kind = |r: &ResourceInfo| json!({"group": r.group, "version": r.version, "kind": r.kind});
    let resource =
        |r: &ResourceInfo| json!({"group": r.group, "version": r.version, "resource": r.plural});
    let user = caller.user;
    let options = match write.operation {
        Operation::Create => "CreateOptions",
        Operation::Update => "UpdateOptions",
        Operation::Delete => "DeleteOptions",
    };
    json!({
        "uid": uuid::Uuid::new_v4().to_string(),
        "kind": kind(matched),
        "resource": resource(matched),
        "subResource": write.subresource,
        "requestKind": kind(write.resource),
        "requestResource": resource(write.resource),
        "requestSubResource": write.subresource,
        "name": name,
        "namespace": namespace,
        "operation": write.operation.name(),
        "userInfo": {
            "username": user.name,
            "uid": user.uid,
            "groups": user.groups,
            "extra": user.extra,
        },
        "dryRun": caller.dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": options},
    })
}

/// The parameter objects the binding selects: `[null]` for a policy without `paramKind`;
/// possibly none (`parameterNotFoundAction: Allow`). Err: a configuration error.
fn params(
    txn: &Txn<'_>,
    write: &Write<'_>,
    compiled: &Compiled,
    binding_spec: &Value,
) -> Result<Vec<Value>, String> {
    let Some((api_version, kind)) = &compiled.param_kind else {
        return Ok(vec![Value::Null]);
    };
    let reference = binding_spec.get("paramRef").filter(|r| r.is_object()).ok_or_else(|| {
        format!("failed to configure binding: paramKind {api_version}, Kind={kind} is set but the binding has no paramRef")
    })?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let resource = txn
        .registry()
        .all()
        .iter()
        .find(|r| r.group == group && r.version == version && r.kind == *kind)
        .cloned()
        .ok_or_else(|| {
            format!("failed to find resource referenced by paramKind: '{api_version}, Kind={kind}'")
        })?;
    let (_, request_namespace) = write.name_and_namespace();
    let namespace = match reference["namespace"].as_str().filter(|n| !n.is_empty()) {
        _ if !resource.namespaced => None,
        Some(n) => Some(n.to_owned()),
        None if request_namespace.is_empty() => {
            return Err("cannot use a namespaced paramRef in a policy binding that matches cluster-scoped resources".to_owned());
        }
        None => Some(request_namespace),
    };
    let found: Vec<Value> = match reference["name"].as_str().filter(|n| !n.is_empty()) {
        Some(name) => txn
            .get(&resource, &(namespace.clone().unwrap_or_default(), name.to_owned()))
            .into_iter()
            .map(|o| resource.present(&o).into_owned())
            .collect(),
        None => txn
            .list(&resource, namespace.as_deref())
            .iter()
            .filter(|o| selector_matches(&reference["selector"], o.pointer("/metadata/labels")))
            .map(|o| resource.present(o).into_owned())
            .collect(),
    };
    if found.is_empty() && reference["parameterNotFoundAction"].as_str() != Some("Allow") {
        return Err("no params found for policy binding with `Deny` parameterNotFoundAction".into());
    }
    Ok(found)
}
