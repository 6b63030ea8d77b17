//! Custom objects against their schema, in the real API server's order: unknown fields
//! pruned (unless `x-kubernetes-preserve-unknown-fields`), `default`s applied, nulls of
//! non-nullable fields without a default dropped; then the `OpenAPI` value validations
//! with kube-openapi's messages (`spec.vlan in body should be less than or equal to
//! 4094`), the uniqueness of `set` and `map` lists, and the CEL rules. On updates, errors
//! in parts the write did not change are ratcheted away (CRDValidationRatcheting, on by
//! default since Kubernetes 1.30).

use serde_json::{Map, Number, Value, json};

use super::field::{
    child, duplicate, index, invalid, not_supported, required, too_long, too_many, type_invalid,
};
use super::formats;
use super::schema::{Node, SchemaType};
use crate::apiserver::error::FieldError;

const META_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Removes the fields the schema does not know; returns their paths (`spec.bogus`,
/// `spec.routes[0].x`), sorted. At a resource root (and in embedded resources)
/// `apiVersion`, `kind` and `metadata` are kept.
pub(crate) fn prune(obj: &mut Value, root: &Node) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_node(obj, Some(root), true, "", &mut unknown);
    unknown.sort();
    unknown
}

/// Prunes a value under `node` (a default, say); returns the unknown fields' paths.
pub(crate) fn prune_node_value(v: &mut Value, node: &Node) -> Vec<String> {
    let mut unknown = Vec::new();
    prune_node(v, Some(node), node.embedded, "", &mut unknown);
    unknown
}

fn prune_node(
    v: &mut Value,
    node: Option<&Node>,
    resource_root: bool,
    path: &str,
    unknown: &mut Vec<String>,
) {
    if let Some(n) = node
        && n.preserve_unknown
    {
        keep_unknown(v, n, resource_root, path, unknown);
        return;
    }
    match v {
        Value::Object(m) => {
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let embedded_root = resource_root || node.is_some_and(|n| n.embedded);
                if embedded_root && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(sub) = node.and_then(|n| n.field(&k)) {
                    if let Some(child_v) = m.get_mut(&k) {
                        prune_node(child_v, Some(sub), false, &child(path, &k), unknown);
                    }
                } else {
                    if !META_FIELDS.contains(&k.as_str()) || !path.is_empty() {
                        unknown.push(child(path, &k));
                    }
                    m.remove(&k);
                }
            }
        }
        Value::Array(items) => {
            let sub = node.and_then(|n| n.items.as_deref());
            for (i, item) in items.iter_mut().enumerate() {
                prune_node(item, sub, false, &index(path, i), unknown);
            }
        }
        _ => {}
    }
}

/// Below `x-kubernetes-preserve-unknown-fields`: unknown fields stay, known ones are
/// pruned as their schema says; list items keep this treatment.
fn keep_unknown(
    v: &mut Value,
    n: &Node,
    resource_root: bool,
    path: &str,
    unknown: &mut Vec<String>,
) {
    match v {
        Value::Object(m) => {
            for (k, child_v) in m.iter_mut() {
                if (resource_root || n.embedded) && META_FIELDS.contains(&k.as_str()) {
                    continue;
                }
                if let Some(sub) = n.field(k) {
                    prune_node(child_v, Some(sub), false, &child(path, k), unknown);
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = n.items.as_deref() {
                for (i, item) in items.iter_mut().enumerate() {
                    keep_unknown(item, sub, false, &index(path, i), unknown);
                }
            }
        }
        _ => {}
    }
}

/// Applies `default`s: a missing field (or a null one that is not nullable) gets its
/// schema's default, then defaults apply inside it too.
pub(crate) fn apply_defaults(v: &mut Value, node: &Node) {
    match v {
        Value::Object(m) => {
            for (k, prop) in &node.properties {
                let Some(default) = &prop.default else { continue };
                let missing = match m.get(k) {
                    None => true,
                    Some(Value::Null) => !prop.nullable,
                    Some(_) => false,
                };
                if missing {
                    m.insert(k.clone(), default.clone());
                }
            }
            for (k, child_v) in m.iter_mut() {
                if let Some(prop) = node.properties.get(k) {
                    apply_defaults(child_v, prop);
                } else if let Some(extra) = node.additional.as_deref() {
                    if child_v.is_null()
                        && !extra.nullable
                        && let Some(d) = &extra.default
                    {
                        *child_v = d.clone();
                    }
                    apply_defaults(child_v, extra);
                }
            }
        }
        Value::Array(items) => {
            let Some(item_schema) = node.items.as_deref() else { return };
            for item in items.iter_mut() {
                if item.is_null()
                    && !item_schema.nullable
                    && let Some(d) = &item_schema.default
                {
                    *item = d.clone();
                }
                apply_defaults(item, item_schema);
            }
        }
        _ => {}
    }
}

/// Drops object fields that are null where the schema is not nullable and has no
/// default (a null means "unset" to the real server's decoder).
pub(crate) fn prune_nulls(v: &mut Value, node: Option<&Node>) {
    match v {
        Value::Object(m) => {
            m.retain(|k, val| {
                let schema = node.and_then(|n| n.field(k));
                !(val.is_null() && schema.is_some_and(|s| !s.nullable && s.default.is_none()))
            });
            for (k, val) in m.iter_mut() {
                prune_nulls(val, node.and_then(|n| n.field(k)));
            }
        }
        Value::Array(items) => {
            let schema = node.and_then(|n| n.items.as_deref());
            for item in items {
                prune_nulls(item, schema);
            }
        }
        _ => {}
    }
}

/// The JSON type name kube-openapi reports for a value.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() && n.as_f64().is_some_and(|f| f.fract() != 0.0) => "number",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integral(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

/// A bound as Go's `%v` prints it: integral numbers without a fraction.
fn bound_text(n: &Number) -> String {
    match n.as_f64() {
        // Integral and far below 2^53: exact as an integer.
        #[allow(clippy::cast_possible_truncation, reason = "integral and within i64")]
        Some(f) if f.fract() == 0.0 && f.abs() < 1e15 => format!("{}", f as i64),
        Some(f) => format!("{f}"),
        None => n.to_string(),
    }
}

/// Numeric JSON equality (1 == 1.0), as Go compares decoded values for `enum`.
pub(crate) fn json_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| json_equal(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_equal(v, w)))
        }
        _ => a == b,
    }
}

/// Where a validation runs: the field path prefix of errors and how paths are written
/// inside messages (relative to the validated value, as kube-openapi writes them).
struct Walk<'e> {
    errs: &'e mut Vec<FieldError>,
    /// Field prefix of the validated value (`""`, or `status` for `/status` writes).
    prefix: &'e str,
}

impl Walk<'_> {
    fn field(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_owned()
        } else if rel.is_empty() {
            self.prefix.to_owned()
        } else {
            format!("{}.{rel}", self.prefix)
        }
    }

    fn body(rel: &str, detail: &str) -> String {
        format!("{rel} in body {detail}")
    }
}

/// The items of an old list that correlate with the new list's items: by key for `map`
/// lists, by value for `set` lists; none for atomic lists (their items have no identity).
fn old_item<'a>(node: &Node, old: Option<&'a Value>, item: &Value) -> Option<&'a Value> {
    let old_items = old?.as_array()?;
    match node.list_type.as_deref() {
        Some("map") => {
            let keys = &node.list_map_keys;
            old_items.iter().find(|o| keys.iter().all(|k| o.get(k) == item.get(k)))
        }
        Some("set") => old_items.iter().find(|o| *o == item),
        _ => None,
    }
}

/// Validates `value` against `node` (kube-openapi semantics). `old` is the correlated
/// old value: when it equals `value`, nothing below is reported (ratcheting).
fn check(node: &Node, value: &Value, old: Option<&Value>, rel: &str, w: &mut Walk<'_>) {
    if old.is_some_and(|o| o == value) {
        return;
    }
    check_value(node, value, old, rel, w);
}

#[allow(clippy::too_many_lines, reason = "one branch per keyword, in kube-openapi's order")]
fn check_value(node: &Node, value: &Value, old: Option<&Value>, rel: &str, w: &mut Walk<'_>) {
    let field = w.field(rel);
    // Type.
    if value.is_null() {
        if (node.ty.is_some() || node.int_or_string) && !node.nullable {
            let expected = if node.int_or_string {
                "integer,string"
            } else {
                node.ty.map_or("", SchemaType::name)
            };
            w.errs.push(type_invalid(
                &field,
                &json!("null"),
                &Walk::body(rel, &format!("must be of type {expected}: \"null\"")),
            ));
        }
        return;
    }
    let actual = type_of(value);
    let type_ok = if node.int_or_string {
        matches!(value, Value::String(_)) || is_integral(value)
    } else {
        match node.ty {
            None => true,
            Some(SchemaType::Integer) => is_integral(value),
            Some(SchemaType::Number) => matches!(value, Value::Number(_)),
            Some(t) => t.name() == actual,
        }
    };
    if !type_ok {
        let expected = if node.int_or_string {
            "integer,string"
        } else {
            node.ty.map_or("", SchemaType::name)
        };
        w.errs.push(type_invalid(
            &field,
            &json!(actual),
            &Walk::body(rel, &format!("must be of type {expected}: \"{actual}\"")),
        ));
        return;
    }
    // Enum.
    if let Some(allowed) = &node.enumeration
        && !allowed.iter().any(|a| json_equal(a, value))
    {
        let names: Vec<String> = allowed
            .iter()
            .map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_owned))
            .collect();
        w.errs.push(not_supported(&field, value, &names));
    }
    match value {
        Value::String(s) => {
            let chars = s.chars().count() as u64;
            if let Some(max) = node.max_length
                && chars > max
            {
                w.errs.push(too_long(&field, max));
            }
            if let Some(min) = node.min_length
                && chars < min
            {
                w.errs.push(invalid(
                    &field,
                    value,
                    &Walk::body(rel, &format!("should be at least {min} chars long")),
                ));
            }
            if let Some((src, re)) = &node.pattern
                && !re.is_match(s)
            {
                w.errs.push(invalid(
                    &field,
                    value,
                    &Walk::body(rel, &format!("should match '{src}'")),
                ));
            }
            if let Some(format) = &node.format
                && !formats::check(format, s)
            {
                w.errs.push(type_invalid(
                    &field,
                    value,
                    &Walk::body(
                        rel,
                        &format!("must be of type {format}: {}", Value::String(s.clone())),
                    ),
                ));
            }
        }
        Value::Number(n) => check_number(node, value, n, rel, &field, w),
        Value::Array(items) => {
            if let Some(min) = node.min_items
                && (items.len() as u64) < min
            {
                w.errs.push(invalid(
                    &field,
                    &json!(items.len()),
                    &Walk::body(rel, &format!("should have at least {min} items")),
                ));
            }
            if let Some(max) = node.max_items
                && items.len() as u64 > max
            {
                w.errs.push(too_many(&field, items.len(), max));
            }
            if let Some(item_schema) = node.items.as_deref() {
                for (i, item) in items.iter().enumerate() {
                    let old_i = old_item(node, old, item);
                    check(item_schema, item, old_i, &index(rel, i), w);
                }
            }
        }
        Value::Object(m) => check_object(node, m, old, rel, &field, w),
        Value::Bool(_) | Value::Null => {}
    }
    check_composition(node, value, old, rel, w);
}

fn check_number(node: &Node, value: &Value, n: &Number, rel: &str, field: &str, w: &mut Walk<'_>) {
    let x = n.as_f64().unwrap_or(0.0);
    if let Some(max) = &node.maximum {
        let m = max.as_f64().unwrap_or(f64::MAX);
        if (node.exclusive_maximum && x >= m) || (!node.exclusive_maximum && x > m) {
            let how = if node.exclusive_maximum { "less than" } else { "less than or equal to" };
            w.errs.push(invalid(
                field,
                value,
                &Walk::body(rel, &format!("should be {how} {}", bound_text(max))),
            ));
        }
    }
    if let Some(min) = &node.minimum {
        let m = min.as_f64().unwrap_or(f64::MIN);
        if (node.exclusive_minimum && x <= m) || (!node.exclusive_minimum && x < m) {
            let how =
                if node.exclusive_minimum { "greater than" } else { "greater than or equal to" };
            w.errs.push(invalid(
                field,
                value,
                &Walk::body(rel, &format!("should be {how} {}", bound_text(min))),
            ));
        }
    }
    if let Some(factor) = &node.multiple_of {
        let f = factor.as_f64().unwrap_or(1.0);
        if f > 0.0 && ((x / f).fract()).abs() > 1e-9 {
            w.errs.push(invalid(
                field,
                value,
                &Walk::body(rel, &format!("should be a multiple of {}", bound_text(factor))),
            ));
        }
    }
}

fn check_object(
    node: &Node,
    m: &Map<String, Value>,
    old: Option<&Value>,
    rel: &str,
    field: &str,
    w: &mut Walk<'_>,
) {
    let n = m.len() as u64;
    if let Some(min) = node.min_properties
        && n < min
    {
        w.errs.push(invalid(
            field,
            &json!(n),
            &Walk::body(rel, &format!("should have at least {min} properties")),
        ));
    }
    if let Some(max) = node.max_properties
        && n > max
    {
        w.errs.push(too_many(field, m.len(), max));
    }
    let old_map = old.and_then(Value::as_object);
    for (k, v) in m {
        let sub = node.properties.get(k).or(node.additional.as_deref());
        if let Some(sub) = sub {
            check(sub, v, old_map.and_then(|o| o.get(k)), &child(rel, k), w);
        }
    }
    for k in &node.required {
        if !m.contains_key(k) {
            w.errs.push(required(w.field(&child(rel, k)), ""));
        }
    }
}

/// `allOf`, `anyOf`, `oneOf` and `not`: composite errors name no field (`<nil>`), as
/// kube-openapi's composite errors reach the API as `field.Invalid(nil, "", ...)`.
fn check_composition(node: &Node, value: &Value, old: Option<&Value>, rel: &str, w: &mut Walk<'_>) {
    let run = |n: &Node, prefix: &str| {
        let mut errs = Vec::new();
        let mut sub = Walk { errs: &mut errs, prefix };
        check_value(n, value, old, rel, &mut sub);
        errs
    };
    let composite = |detail: String| invalid("<nil>", &json!(""), &detail);
    let mut failed_all = Vec::new();
    for n in &node.all_of {
        failed_all.extend(run(n, w.prefix));
    }
    if !failed_all.is_empty() {
        w.errs.push(composite(format!("{rel:?} must validate all the schemas (allOf)")));
        w.errs.extend(failed_all);
    }
    if !node.any_of.is_empty() {
        let results: Vec<Vec<FieldError>> = node.any_of.iter().map(|n| run(n, w.prefix)).collect();
        if results.iter().all(|r| !r.is_empty()) {
            w.errs.push(composite(format!("{rel:?} must validate at least one schema (anyOf)")));
            if let Some(best) = results.into_iter().min_by_key(Vec::len) {
                w.errs.extend(best);
            }
        }
    }
    if !node.one_of.is_empty() {
        let results: Vec<Vec<FieldError>> = node.one_of.iter().map(|n| run(n, w.prefix)).collect();
        let valid = results.iter().filter(|r| r.is_empty()).count();
        if valid != 1 {
            let more = if valid == 0 {
                "Found none valid".to_owned()
            } else {
                format!("Found {valid} valid alternatives")
            };
            w.errs.push(composite(format!(
                "{rel:?} must validate one and only one schema (oneOf). {more}"
            )));
            if valid == 0
                && let Some(best) = results.into_iter().min_by_key(Vec::len)
            {
                w.errs.extend(best);
            }
        }
    }
    if let Some(not) = &node.not
        && run(not, w.prefix).is_empty()
    {
        w.errs.push(composite(format!("{rel:?} must not validate the schema (not)")));
    }
}

/// Validates a whole object (or, with `prefix = "status"`, its status) against `node`.
pub(crate) fn validate_schema(
    node: &Node,
    value: &Value,
    old: Option<&Value>,
    prefix: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let mut w = Walk { errs: &mut errs, prefix };
    // The resource root's metadata is validated as ObjectMeta elsewhere.
    if prefix.is_empty()
        && let Value::Object(m) = value
    {
        let mut without_meta = m.clone();
        without_meta.remove("metadata");
        without_meta.remove("apiVersion");
        without_meta.remove("kind");
        let old_without = old.and_then(Value::as_object).map(|o| {
            let mut o = o.clone();
            for f in META_FIELDS {
                o.remove(f);
            }
            Value::Object(o)
        });
        check_root(node, &Value::Object(without_meta), old_without.as_ref(), &mut w);
        return errs;
    }
    check(node, value, old, "", &mut w);
    errs
}

fn check_root(node: &Node, value: &Value, old: Option<&Value>, w: &mut Walk<'_>) {
    let Some(m) = value.as_object() else { return };
    let old_map = old.and_then(Value::as_object);
    for (k, v) in m {
        if let Some(sub) = node.properties.get(k).or(node.additional.as_deref()) {
            check(sub, v, old_map.and_then(|o| o.get(k)), k, w);
        }
    }
    for k in node.required.iter().filter(|k| !META_FIELDS.contains(&k.as_str())) {
        if !m.contains_key(k) {
            w.errs.push(required(w.field(k), ""));
        }
    }
    check_composition(node, value, old, "", w);
}

/// Duplicate items of `set` lists and duplicate keys of `map` lists.
pub(crate) fn validate_list_types(
    node: &Node,
    value: &Value,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                if let Some(sub) = node.properties.get(k) {
                    validate_list_types(sub, v, &child(path, k), errs);
                } else if let Some(extra) = node.additional.as_deref() {
                    validate_list_types(extra, v, &format!("{path}[{k}]"), errs);
                }
            }
        }
        Value::Array(items) => {
            match node.list_type.as_deref() {
                Some("set") => {
                    for i in duplicates(items.iter().map(Some).collect::<Vec<_>>().as_slice()) {
                        errs.push(duplicate(index(path, i), &items[i]));
                    }
                }
                Some("map") => {
                    if let Some(i) = items.iter().position(|x| !x.is_object() && !x.is_null()) {
                        errs.push(invalid(
                            index(path, i),
                            &items[i],
                            "must be an object for an array of list-type map",
                        ));
                        return;
                    }
                    let keys: Vec<Value> = items
                        .iter()
                        .map(|x| {
                            let mut key = Map::new();
                            for k in &node.list_map_keys {
                                if let Some(v) = x.get(k) {
                                    key.insert(k.clone(), v.clone());
                                }
                            }
                            Value::Object(key)
                        })
                        .collect();
                    for i in duplicates(keys.iter().map(Some).collect::<Vec<_>>().as_slice()) {
                        errs.push(duplicate(index(path, i), &keys[i]));
                    }
                }
                _ => {}
            }
            if let Some(item_schema) = node.items.as_deref() {
                for (i, item) in items.iter().enumerate() {
                    validate_list_types(item_schema, item, &index(path, i), errs);
                }
            }
        }
        _ => {}
    }
}

/// Indexes of the second occurrence of each repeated value.
fn duplicates(items: &[Option<&Value>]) -> Vec<usize> {
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let earlier = items[..i].iter().filter(|e| json_eq_opt(**e, *item)).count();
        if earlier == 1 {
            out.push(i);
        }
    }
    out
}

fn json_eq_opt(a: Option<&Value>, b: Option<&Value>) -> bool {
    match (a, b) {
        (Some(x), Some(y)) => json_equal(x, y),
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::crd::schema;

    fn node(s: &Value) -> Node {
        let mut errs = Vec::new();
        let parsed = schema::parse(s, "", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");
        parsed.root
    }

    #[test]
    fn prune_default_and_nulls() {
        let n = node(&json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "a": {"type": "integer", "default": 3},
                "b": {"type": "object", "default": {}, "properties": {"c": {"type": "string", "default": "x"}}},
                "keep": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"k": {"type": "object", "properties": {}}}},
                "n": {"type": "string"}}}}}));
        let mut obj = json!({"apiVersion": "g/v1", "kind": "K", "metadata": {"name": "x"},
            "spec": {"bogus": 1, "keep": {"free": 1, "k": {"gone": 2}}, "n": null, "a": null}, "extra": true});
        let unknown = prune(&mut obj, &n);
        assert_eq!(unknown, ["extra", "spec.bogus", "spec.keep.k.gone"]);
        apply_defaults(&mut obj, &n);
        prune_nulls(&mut obj, Some(&n));
        assert_eq!(obj["spec"], json!({"keep": {"free": 1, "k": {}}, "a": 3, "b": {"c": "x"}}));
    }

    #[test]
    fn messages_follow_kube_openapi() {
        let n = node(
            &json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["r"], "properties": {
            "r": {"type": "string"},
            "vlan": {"type": "integer", "maximum": 4094},
            "mode": {"type": "string", "enum": ["a", "b"]},
            "name": {"type": "string", "maxLength": 3, "pattern": "^[a-z]+$"},
            "list": {"type": "array", "maxItems": 1, "items": {"type": "string"}}}}}}),
        );
        let obj = json!({"spec": {"vlan": 5000, "mode": "c", "name": "ABCD", "list": ["x", "y"]}});
        let errs = validate_schema(&n, &obj, None, "");
        let text: Vec<String> =
            errs.iter().map(|e| format!("{} {} {}", e.reason, e.field, e.message)).collect();
        for want in [
            "FieldValueInvalid spec.vlan Invalid value: 5000: spec.vlan in body should be less than or equal to 4094",
            "FieldValueNotSupported spec.mode Unsupported value: \"c\": supported values: \"a\", \"b\"",
            "FieldValueTooLong spec.name Too long: may not be more than 3 bytes",
            "FieldValueInvalid spec.name Invalid value: \"ABCD\": spec.name in body should match '^[a-z]+$'",
            "FieldValueTooMany spec.list Too many: 2: must have at most 1 item",
            "FieldValueRequired spec.r Required value",
        ] {
            assert!(text.iter().any(|t| t == want), "{want} not in {text:#?}");
        }
        let errs = validate_schema(&n, &json!({"spec": {"r": "x", "vlan": "ten"}}), None, "");
        assert_eq!(errs[0].reason, "FieldValueTypeInvalid");
        assert_eq!(
            errs[0].message,
            "Invalid value: \"string\": spec.vlan in body must be of type integer: \"string\""
        );
        // Ratcheting: an unchanged invalid field is not reported on update.
        let old = json!({"spec": {"r": "x", "vlan": 5000}});
        assert!(validate_schema(&n, &old, Some(&old), "").is_empty());
        // Per field: the unchanged vlan still ratchets while another field changes...
        assert!(
            validate_schema(&n, &json!({"spec": {"r": "y", "vlan": 5000}}), Some(&old), "")
                .is_empty()
        );
        // ...a changed one does not.
        assert_eq!(
            validate_schema(&n, &json!({"spec": {"r": "x", "vlan": 5001}}), Some(&old), "").len(),
            1
        );
    }

    #[test]
    fn list_uniqueness() {
        let n = node(&json!({"type": "object", "properties": {
            "s": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "m": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["k"],
                  "items": {"type": "object", "required": ["k"], "properties": {"k": {"type": "string"}, "v": {"type": "integer"}}}}}}));
        let mut errs = Vec::new();
        validate_list_types(
            &n,
            &json!({"s": ["a", "b", "a", "a"], "m": [{"k": "x", "v": 1}, {"k": "x", "v": 2}]}),
            "",
            &mut errs,
        );
        let mut text: Vec<String> =
            errs.iter().map(|e| format!("{} {}", e.field, e.message)).collect();
        text.sort();
        assert_eq!(text, ["m[1] Duplicate value: {\"k\":\"x\"}", "s[2] Duplicate value: \"a\""]);
    }
}
