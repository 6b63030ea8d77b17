//! Parsing `openAPIV3Schema` into [`Node`]s: each keyword read into its field, keywords
//! Kubernetes does not support refused, and each node's place (root, item, field, nested
//! value validation, resource metadata) carried down to the checks that depend on it.

use regex::Regex;
use serde_json::{Number, Value, json};

use super::extensions::check_extensions;
use super::structural::{check_nested, check_structural};
use super::{Node, Schema, SchemaType};
use crate::apiserver::crd::field::{child, forbidden, index, invalid, key, not_supported};
use crate::apiserver::error::FieldError;

/// Where in a schema a node sits, as far as the structural rules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Level {
    Root,
    Item,
    Field,
}

/// What the parser knows about a node's surroundings.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools, reason = "independent facts about a node's place")]
pub(super) struct Ctx {
    pub(super) level: Level,
    /// Inside `allOf`/`anyOf`/`oneOf`/`not`: value validations only.
    nested: bool,
    /// CEL rules allowed in a nested node (`allOf` only).
    pub(super) nested_rules: bool,
    /// Why defaults are not allowed here, if they are not.
    no_defaults: Option<String>,
    /// Inside the apiVersion/kind/metadata of a resource.
    inside_meta: bool,
    /// The node is the root of a resource (the schema root or an embedded resource).
    resource_root: bool,
}

const SUPPORTED_TYPES: [&str; 6] = ["array", "boolean", "integer", "number", "object", "string"];

fn string_list(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn count(v: &Value, name: &str) -> Option<u64> {
    v.get(name).and_then(Value::as_u64)
}

fn number(v: &Value, name: &str) -> Option<Number> {
    match v.get(name) {
        Some(Value::Number(n)) => Some(n.clone()),
        _ => None,
    }
}

fn flag(v: &Value, name: &str) -> bool {
    v.get(name).and_then(Value::as_bool).unwrap_or(false)
}

/// Parses and checks `openAPIV3Schema` (at `path` in the definition). CEL rules are
/// not compiled here.
pub(crate) fn parse(source: &Value, path: &str, errs: &mut Vec<FieldError>) -> Schema {
    let ctx = Ctx {
        level: Level::Root,
        nested: false,
        nested_rules: false,
        no_defaults: None,
        inside_meta: false,
        resource_root: true,
    };
    if flag(source, "nullable") {
        errs.push(forbidden(child(path, "nullable"), "nullable cannot be true at the root"));
    }
    let root = parse_node(source, path, &ctx, errs);
    Schema { root, source: source.clone() }
}

#[allow(
    clippy::too_many_lines,
    reason = "one check per keyword, in the order upstream checks them"
)]
fn parse_node(v: &Value, path: &str, ctx: &Ctx, errs: &mut Vec<FieldError>) -> Node {
    let Some(obj) = v.as_object() else {
        errs.push(invalid(path, v, "must be a schema object"));
        return Node::default();
    };
    let mut node = Node::default();
    // type
    match obj.get("type").and_then(Value::as_str) {
        Some("null") => errs.push(forbidden(
            child(path, "type"),
            "type cannot be set to null, use nullable as an alternative",
        )),
        Some(t) if !t.is_empty() => match SchemaType::parse(t) {
            Some(ty) => node.ty = Some(ty),
            None => errs.push(not_supported(
                child(path, "type"),
                &json!(t),
                &SUPPORTED_TYPES.map(str::to_owned),
            )),
        },
        _ => {}
    }
    node.nullable = flag(v, "nullable");
    node.format =
        obj.get("format").and_then(Value::as_str).filter(|f| !f.is_empty()).map(str::to_owned);
    node.required = string_list(obj.get("required"));
    node.enumeration = obj.get("enum").and_then(Value::as_array).cloned();
    node.maximum = number(v, "maximum");
    node.minimum = number(v, "minimum");
    node.exclusive_maximum = flag(v, "exclusiveMaximum");
    node.exclusive_minimum = flag(v, "exclusiveMinimum");
    node.multiple_of = number(v, "multipleOf");
    node.max_length = count(v, "maxLength");
    node.min_length = count(v, "minLength");
    node.max_items = count(v, "maxItems");
    node.min_items = count(v, "minItems");
    node.max_properties = count(v, "maxProperties");
    node.min_properties = count(v, "minProperties");
    node.default = obj.get("default").cloned();
    node.int_or_string = flag(v, "x-kubernetes-int-or-string");
    node.embedded = flag(v, "x-kubernetes-embedded-resource");
    node.list_type = obj.get("x-kubernetes-list-type").and_then(Value::as_str).map(str::to_owned);
    node.list_map_keys = string_list(obj.get("x-kubernetes-list-map-keys"));
    node.map_type = obj.get("x-kubernetes-map-type").and_then(Value::as_str).map(str::to_owned);
    node.raw_rules =
        obj.get("x-kubernetes-validations").and_then(Value::as_array).cloned().unwrap_or_default();
    match obj.get("x-kubernetes-preserve-unknown-fields") {
        Some(Value::Bool(true)) => node.preserve_unknown = true,
        Some(other @ Value::Bool(false)) => errs.push(invalid(
            child(path, "x-kubernetes-preserve-unknown-fields"),
            other,
            "must be true or undefined",
        )),
        _ => {}
    }
    if let Some(pattern) = obj.get("pattern").and_then(Value::as_str) {
        match Regex::new(pattern) {
            Ok(re) => node.pattern = Some((pattern.to_owned(), re)),
            Err(e) => errs.push(invalid(
                child(path, "pattern"),
                &json!(pattern),
                &format!("must be a valid regular expression, but isn't: {e}"),
            )),
        }
    }

    // Keywords Kubernetes does not support.
    for (name, message) in [
        ("id", "id is not supported"),
        ("additionalItems", "additionalItems is not supported"),
        ("patternProperties", "patternProperties is not supported"),
        ("definitions", "definitions is not supported"),
        ("dependencies", "dependencies is not supported"),
        ("$ref", "$ref is not supported"),
    ] {
        if obj.get(name).is_some_and(|x| !x.is_null()) {
            errs.push(forbidden(child(path, name), message));
        }
    }
    if flag(v, "uniqueItems") {
        errs.push(forbidden(
            child(path, "uniqueItems"),
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        ));
    }
    if node.default.is_some()
        && let Some(reason) = &ctx.no_defaults
    {
        errs.push(forbidden(child(path, "default"), &format!("must not be set {reason}")));
    }
    if ctx.inside_meta && node.embedded {
        errs.push(forbidden(
            child(path, "x-kubernetes-embedded-resource"),
            "must not be used inside of resource meta",
        ));
    }

    // Children.
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, schema) in props {
            let mut sub = ctx.clone();
            sub.level = Level::Field;
            sub.resource_root = false;
            if (ctx.resource_root || node.embedded)
                && ["apiVersion", "kind", "metadata"].contains(&name.as_str())
            {
                sub.inside_meta = true;
                if ctx.level == Level::Root {
                    sub.no_defaults = Some(format!("in top-level {name}"));
                }
            }
            if node.embedded {
                sub.resource_root = false;
            }
            let parsed = parse_node(schema, &key(&child(path, "properties"), name), &sub, errs);
            node.properties.insert(name.clone(), parsed);
        }
    }
    match obj.get("additionalProperties") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(allows)) => {
            if !node.properties.is_empty() && !allows {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "additionalProperties and properties are mutual exclusive",
                ));
            }
            if *allows {
                node.additional = Some(Box::default());
            }
        }
        Some(schema) => {
            if !node.properties.is_empty() {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "additionalProperties and properties are mutual exclusive",
                ));
            }
            if ctx.level == Level::Root && !ctx.nested {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "must not be used at the root",
                ));
            }
            if ctx.nested {
                errs.push(forbidden(
                    child(path, "additionalProperties"),
                    "must be undefined to be structural",
                ));
            }
            let mut sub = ctx.clone();
            sub.level = Level::Field;
            sub.resource_root = false;
            if ctx.inside_meta {
                sub.no_defaults =
                    Some("inside additionalProperties applying to object metadata".to_owned());
            }
            node.additional = Some(Box::new(parse_node(
                schema,
                &child(path, "additionalProperties"),
                &sub,
                errs,
            )));
        }
    }
    match obj.get("items") {
        None | Some(Value::Null) => {}
        Some(Value::Array(_)) => errs.push(forbidden(
            child(path, "items"),
            "items must be a schema object and not an array",
        )),
        Some(schema) => {
            let mut sub = ctx.clone();
            sub.level = Level::Item;
            sub.resource_root = false;
            node.items = Some(Box::new(parse_node(schema, &child(path, "items"), &sub, errs)));
        }
    }
    for (name, list) in
        [("allOf", &mut node.all_of), ("anyOf", &mut node.any_of), ("oneOf", &mut node.one_of)]
    {
        for (i, schema) in obj.get(name).and_then(Value::as_array).into_iter().flatten().enumerate()
        {
            let mut sub = ctx.clone();
            sub.nested = true;
            sub.nested_rules = name == "allOf" && (!ctx.nested || ctx.nested_rules);
            list.push(parse_node(schema, &index(&child(path, name), i), &sub, errs));
        }
    }
    if let Some(schema) = obj.get("not").filter(|n| !n.is_null()) {
        let mut sub = ctx.clone();
        sub.nested = true;
        sub.nested_rules = false;
        node.not = Some(Box::new(parse_node(schema, &child(path, "not"), &sub, errs)));
    }

    if ctx.nested {
        check_nested(obj, &node, path, ctx, errs);
    } else {
        check_structural(&node, path, ctx, errs);
    }
    check_extensions(&node, path, errs);
    node
}
