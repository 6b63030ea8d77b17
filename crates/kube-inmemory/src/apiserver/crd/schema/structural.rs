//! The rules of a structural schema: a type on every specified field, `items` on arrays,
//! an object root, metadata limited to name and generateName, and value validations
//! (`allOf`, `anyOf`, `oneOf`, `not`) that carry no structure of their own and name only
//! fields the structural part declares.

use serde_json::{Value, json};

use super::parser::{Ctx, Level};
use super::{Node, SchemaType};
use crate::apiserver::crd::field::{child, forbidden, index, invalid, key, required};
use crate::apiserver::error::FieldError;

/// The rules of the structural part of a schema.
pub(super) fn check_structural(node: &Node, path: &str, ctx: &Ctx, errs: &mut Vec<FieldError>) {
    if node.ty == Some(SchemaType::Array) && node.items.is_none() {
        errs.push(required(child(path, "items"), "must be specified"));
    }
    if node.embedded && node.ty != Some(SchemaType::Object) {
        match node.ty {
            None => errs.push(required(
                child(path, "type"),
                "must be object if x-kubernetes-embedded-resource is true",
            )),
            Some(t) => errs.push(invalid(
                child(path, "type"),
                &json!(t.name()),
                "must be object if x-kubernetes-embedded-resource is true",
            )),
        }
    } else if node.ty.is_none() && !node.int_or_string && !node.preserve_unknown {
        let detail = match ctx.level {
            Level::Root => "must not be empty at the root",
            Level::Item => "must not be empty for specified array items",
            Level::Field => "must not be empty for specified object fields",
        };
        errs.push(required(child(path, "type"), detail));
    }
    if node.embedded && node.additional.is_some() {
        errs.push(forbidden(
            child(path, "additionalProperties"),
            "must not be used if x-kubernetes-embedded-resource is set",
        ));
    }
    if ctx.level == Level::Root && node.ty.is_some_and(|t| t != SchemaType::Object) {
        errs.push(invalid(
            child(path, "type"),
            &json!(node.ty.map(SchemaType::name)),
            "must be object at the root",
        ));
    }
    let check_meta = ctx.level == Level::Root || node.embedded;
    if check_meta {
        for name in ["kind", "apiVersion"] {
            if let Some(p) = node.properties.get(name)
                && p.ty != Some(SchemaType::String)
            {
                errs.push(invalid(
                    child(&key(&child(path, "properties"), name), "type"),
                    &json!(p.ty.map_or("", SchemaType::name)),
                    "must be string",
                ));
            }
        }
    }
    if let Some(meta) = node.properties.get("metadata") {
        let meta_path = key(&child(path, "properties"), "metadata");
        if check_meta && meta.ty != Some(SchemaType::Object) {
            errs.push(invalid(
                child(&meta_path, "type"),
                &json!(meta.ty.map_or("", SchemaType::name)),
                "must be object",
            ));
        }
        if ctx.level == Level::Root {
            let only_names = meta.properties.keys().all(|k| k == "name" || k == "generateName");
            let plain = meta.additional.is_none()
                && meta.items.is_none()
                && meta.required.is_empty()
                && meta.enumeration.is_none()
                && meta.raw_rules.is_empty()
                && meta.all_of.is_empty()
                && meta.any_of.is_empty()
                && meta.one_of.is_empty()
                && meta.not.is_none()
                && !meta.preserve_unknown
                && !meta.embedded
                && meta.list_type.is_none()
                && meta.map_type.is_none();
            if !only_names || !plain {
                errs.push(forbidden(
                    meta_path,
                    "must not specify anything other than name and generateName, but metadata is implicitly specified",
                ));
            }
        }
    }
    if node.embedded && !node.preserve_unknown && node.properties.is_empty() {
        errs.push(required(
            child(path, "properties"),
            "must not be empty if x-kubernetes-embedded-resource is true without x-kubernetes-preserve-unknown-fields",
        ));
    }
    // Value validations must not name fields the structural part does not have.
    for (name, list) in [("allOf", &node.all_of), ("anyOf", &node.any_of), ("oneOf", &node.one_of)]
    {
        for (i, nested) in list.iter().enumerate() {
            check_complete(nested, node, path, &index(&child(path, name), i), errs);
        }
    }
    if let Some(not) = &node.not {
        check_complete(not, node, path, &child(path, "not"), errs);
    }
}

fn check_complete(
    nested: &Node,
    structural: &Node,
    s_path: &str,
    v_path: &str,
    errs: &mut Vec<FieldError>,
) {
    for (name, sub) in &nested.properties {
        let v_child = key(&child(v_path, "properties"), name);
        match structural.properties.get(name) {
            Some(s) => {
                check_complete(sub, s, &key(&child(s_path, "properties"), name), &v_child, errs);
            }
            None => errs.push(required(
                key(&child(s_path, "properties"), name),
                &format!("because it is defined in {v_child}"),
            )),
        }
    }
    if let Some(items) = &nested.items {
        match &structural.items {
            Some(s) => {
                check_complete(items, s, &child(s_path, "items"), &child(v_path, "items"), errs);
            }
            None => errs.push(required(
                child(s_path, "items"),
                &format!("because it is defined in {}", child(v_path, "items")),
            )),
        }
    }
    for (name, list) in
        [("allOf", &nested.all_of), ("anyOf", &nested.any_of), ("oneOf", &nested.one_of)]
    {
        for (i, n) in list.iter().enumerate() {
            check_complete(n, structural, s_path, &index(&child(v_path, name), i), errs);
        }
    }
}

/// What value validations (inside `allOf`, `anyOf`, `oneOf`, `not`) may not carry.
pub(super) fn check_nested(
    obj: &serde_json::Map<String, Value>,
    node: &Node,
    path: &str,
    ctx: &Ctx,
    errs: &mut Vec<FieldError>,
) {
    if node.ty.is_some() {
        errs.push(forbidden(child(path, "type"), "must be empty to be structural"));
    }
    if node.default.is_some() {
        errs.push(forbidden(child(path, "default"), "must be undefined to be structural"));
    }
    for name in ["title", "description"] {
        if obj.get(name).and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
            errs.push(forbidden(child(path, name), "must be empty to be structural"));
        }
    }
    if node.nullable {
        errs.push(forbidden(child(path, "nullable"), "must be false to be structural"));
    }
    for (name, set, message) in [
        (
            "x-kubernetes-preserve-unknown-fields",
            node.preserve_unknown,
            "must be false to be structural",
        ),
        ("x-kubernetes-embedded-resource", node.embedded, "must be false to be structural"),
        ("x-kubernetes-int-or-string", node.int_or_string, "must be false to be structural"),
        (
            "x-kubernetes-list-map-keys",
            !node.list_map_keys.is_empty(),
            "must be empty to be structural",
        ),
        ("x-kubernetes-list-type", node.list_type.is_some(), "must be undefined to be structural"),
        ("x-kubernetes-map-type", node.map_type.is_some(), "must be undefined to be structural"),
        (
            "x-kubernetes-validations",
            !node.raw_rules.is_empty() && !ctx.nested_rules,
            "must be empty to be structural",
        ),
    ] {
        if set {
            errs.push(forbidden(child(path, name), message));
        }
    }
    if node.properties.contains_key("metadata") {
        errs.push(forbidden(
            key(&child(path, "properties"), "metadata"),
            "must not be specified in a nested context",
        ));
    }
}
