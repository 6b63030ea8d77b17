//! Evaluating compiled rules on an object: its values as CEL sees them, `self` and
//! `oldSelf` bound at each node that declares rules, and failures turned into field errors,
//! or into warnings when ratcheting applies.

use std::collections::HashMap;
use std::sync::Arc;

use cel::Context;
use cel::objects::OptionalValue;
use serde_json::{Value, json};

use super::{ENV, Rule};
use crate::apiserver::crd::field::{
    child, duplicate, forbidden, index, invalid, invalid_omitted, key, required,
};
use crate::apiserver::crd::schema::{Node, SchemaType};
use crate::apiserver::error::FieldError;

/// The most bytes of an evaluated `messageExpression` (upstream's limit).
const MAX_MESSAGE_BYTES: usize = 5 * 1024;

/// A JSON value as CEL sees it under `node`: integers as `int`, `number` fields as
/// `double`, objects as maps; at a resource root `metadata` shows only `name` and
/// `generateName`, as upstream exposes it.
fn to_cel(v: &Value, node: Option<&Node>, resource_root: bool) -> cel::Value {
    match v {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => {
            let double = node.is_some_and(|s| s.ty == Some(SchemaType::Number));
            match (n.as_i64(), n.as_u64()) {
                (Some(i), _) if !double => cel::Value::Int(i),
                (None, Some(u)) if !double => cel::Value::UInt(u),
                _ => cel::Value::Float(n.as_f64().unwrap_or(0.0)),
            }
        }
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => {
            let item = node.and_then(|n| n.items.as_deref());
            cel::Value::List(Arc::new(
                items.iter().map(|i| to_cel(i, item, item.is_some_and(|n| n.embedded))).collect(),
            ))
        }
        Value::Object(m) => {
            let mut out: HashMap<String, cel::Value> = HashMap::with_capacity(m.len());
            for (k, child_v) in m {
                if resource_root && k == "metadata" {
                    let mut meta: HashMap<String, cel::Value> = HashMap::new();
                    for f in ["name", "generateName"] {
                        if let Some(Value::String(s)) = child_v.get(f) {
                            meta.insert(f.to_owned(), cel::Value::String(Arc::new(s.clone())));
                        }
                    }
                    out.insert(k.clone(), meta.into());
                    continue;
                }
                let sub = node.and_then(|n| n.field(k));
                out.insert(k.clone(), to_cel(child_v, sub, sub.is_some_and(|n| n.embedded)));
            }
            out.into()
        }
    }
}

/// Where a rule's errors go.
struct Outcome {
    errors: Vec<FieldError>,
    warnings: Vec<String>,
}

/// Evaluates every rule of `root` on `obj` (an update when `old` is given). Returns the
/// errors and the warnings of ratcheted failures.
pub(crate) fn validate(
    root: &Node,
    obj: &Value,
    old: Option<&Value>,
) -> (Vec<FieldError>, Vec<String>) {
    let mut out = Outcome { errors: Vec::new(), warnings: Vec::new() };
    if root.has_rules() {
        let context = Context::with_env(Arc::clone(&ENV));
        let unchanged = old.is_some_and(|o| o == obj);
        walk(root, obj, old, None, true, unchanged, &context, &mut out);
    }
    (out.errors, out.warnings)
}

/// Evaluates the rules of `node` and below on a value found at `path` (a schema
/// default, say).
pub(crate) fn validate_at(
    node: &Node,
    value: &Value,
    old: Option<&Value>,
    path: &str,
    resource_root: bool,
) -> (Vec<FieldError>, Vec<String>) {
    let mut out = Outcome { errors: Vec::new(), warnings: Vec::new() };
    if node.has_rules() {
        let context = Context::with_env(Arc::clone(&ENV));
        let unchanged = old.is_some_and(|o| o == value);
        walk(node, value, old, Some(path), resource_root, unchanged, &context, &mut out);
    }
    (out.errors, out.warnings)
}

#[allow(clippy::too_many_arguments, reason = "the walk's state, threaded through the recursion")]
fn walk(
    node: &Node,
    v: &Value,
    old: Option<&Value>,
    path: Option<&str>,
    resource_root: bool,
    unchanged: bool,
    context: &Context<'_, '_>,
    out: &mut Outcome,
) {
    if v.is_null() || !node.has_rules() {
        return;
    }
    let mut self_value = None;
    for rule in node.rules.iter().chain(node.all_of.iter().flat_map(|n| n.rules.iter())) {
        let self_cel =
            self_value.get_or_insert_with(|| to_cel(v, Some(node), resource_root)).clone();
        evaluate(rule, node, v, self_cel, old, path, resource_root, unchanged, context, out);
    }
    match v {
        Value::Object(m) => {
            let old_map = old.and_then(Value::as_object);
            for (k, child_v) in m {
                let Some(sub) = node.properties.get(k).or(node.additional.as_deref()) else {
                    continue;
                };
                if resource_root && ["apiVersion", "kind", "metadata"].contains(&k.as_str()) {
                    continue;
                }
                let old_child = old_map.and_then(|o| o.get(k));
                let child_path = match path {
                    None => k.clone(),
                    Some(p) if node.properties.contains_key(k) => child(p, k),
                    Some(p) => key(p, k),
                };
                let child_unchanged = old_child.map_or(unchanged, |o| o == child_v);
                walk(
                    sub,
                    child_v,
                    old_child,
                    Some(&child_path),
                    sub.embedded,
                    child_unchanged,
                    context,
                    out,
                );
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = node.items.as_deref() else { return };
            let old_items = old.and_then(Value::as_array);
            for (i, item) in items.iter().enumerate() {
                let old_item = match (node.map_keys(), old_items) {
                    (Some(keys), Some(olds)) => {
                        olds.iter().find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
                    }
                    _ => None,
                };
                let item_path = index(path.unwrap_or("<nil>"), i);
                let item_unchanged = old_item.map_or(unchanged, |o| o == item);
                walk(
                    item_schema,
                    item,
                    old_item,
                    Some(&item_path),
                    item_schema.embedded,
                    item_unchanged,
                    context,
                    out,
                );
            }
        }
        _ => {}
    }
}

#[allow(clippy::too_many_arguments, reason = "the walk's state for one rule")]
fn evaluate(
    rule: &Rule,
    node: &Node,
    v: &Value,
    self_cel: cel::Value,
    old: Option<&Value>,
    path: Option<&str>,
    resource_root: bool,
    unchanged: bool,
    context: &Context<'_, '_>,
    out: &mut Outcome,
) {
    if rule.uses_old_self && old.is_none() && !rule.optional_old_self {
        return;
    }
    let mut scope = context.new_inner_scope();
    scope.add_variable_from_value("self", self_cel);
    if rule.uses_old_self {
        let old_cel = old.map(|o| to_cel(o, Some(node), resource_root));
        if rule.optional_old_self {
            let optional = match old_cel {
                Some(o) => OptionalValue::of(o),
                None => OptionalValue::none(),
            };
            scope.add_variable_from_value("oldSelf", cel::Value::Opaque(Arc::new(optional)));
        } else if let Some(o) = old_cel {
            scope.add_variable_from_value("oldSelf", o);
        }
    }
    let node_field = path.unwrap_or("<nil>").to_owned();
    let node_type = json!(node.ty.map_or("", SchemaType::name));
    let passed = match rule.program.execute(&scope) {
        Ok(cel::Value::Bool(true)) => return,
        Ok(cel::Value::Bool(false)) => false,
        Ok(other) => {
            out.errors.push(invalid(
                &node_field,
                &node_type,
                &format!(
                    "rule did not evaluate to a bool (got {other:?}) evaluating rule: {}",
                    rule.error_string()
                ),
            ));
            return;
        }
        Err(e) => {
            out.errors.push(invalid(
                &node_field,
                &node_type,
                &format!("{e} evaluating rule: {}", rule.error_string()),
            ));
            return;
        }
    };
    debug_assert!(!passed);
    let detail = rule
        .message_expression
        .as_ref()
        .and_then(|p| match p.execute(&scope) {
            Ok(cel::Value::String(s)) => {
                let t = s.trim();
                (!t.is_empty() && !t.contains('\n') && t.len() <= MAX_MESSAGE_BYTES)
                    .then(|| t.to_owned())
            }
            _ => None,
        })
        .unwrap_or_else(|| match &rule.message {
            Some(m) => m.clone(),
            None => format!("failed rule: {}", rule.source),
        });
    let field = match (&rule.field_path, path) {
        (Some(fp), Some(p)) => child(p, fp),
        (Some(fp), None) => fp.clone(),
        (None, _) => node_field,
    };
    let scalar = !matches!(v, Value::Object(_) | Value::Array(_));
    let error = match rule.reason.as_deref() {
        Some("FieldValueForbidden") => forbidden(&field, &detail),
        Some("FieldValueRequired") => required(&field, &detail),
        Some("FieldValueDuplicate") if scalar => duplicate(&field, v),
        Some("FieldValueDuplicate") => FieldError {
            reason: "FieldValueDuplicate",
            field: field.clone(),
            message: "Duplicate value".to_owned(),
        },
        _ if scalar => invalid(&field, v, &detail),
        _ => invalid_omitted(&field, &detail),
    };
    if !rule.uses_old_self && unchanged {
        out.warnings.push(format!("{}: {}", error.field, error.message));
    } else {
        out.errors.push(error);
    }
}
