//! The `x-kubernetes-*` extensions of a schema node: `int-or-string`, `embedded-resource`,
//! and the list and map types (`set` items atomic, `map` lists keyed by required or
//! defaulted scalar item properties).

use serde_json::json;

use super::{Node, SchemaType};
use crate::apiserver::crd::field::{child, forbidden, invalid, key, not_supported, required};
use crate::apiserver::error::FieldError;

/// The `x-kubernetes-*` list and map types.
pub(super) fn check_extensions(node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if node.int_or_string && node.preserve_unknown {
        errs.push(invalid(
            child(path, "x-kubernetes-preserve-unknown-fields"),
            &json!(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if node.int_or_string && node.embedded {
        errs.push(invalid(
            child(path, "x-kubernetes-embedded-resource"),
            &json!(true),
            "must be false if x-kubernetes-int-or-string is true",
        ));
    }
    if let Some(map_type) = &node.map_type {
        match node.ty {
            Some(SchemaType::Object) => {}
            None => errs.push(required(
                child(path, "type"),
                "must be object if x-kubernetes-map-type is specified",
            )),
            Some(t) => errs.push(invalid(
                child(path, "type"),
                &json!(t.name()),
                "must be object if x-kubernetes-map-type is specified",
            )),
        }
        if map_type != "atomic" && map_type != "granular" {
            errs.push(not_supported(
                child(path, "x-kubernetes-map-type"),
                &json!(map_type),
                &["atomic".into(), "granular".into()],
            ));
        }
    }
    if let Some(list_type) = &node.list_type {
        match node.ty {
            Some(SchemaType::Array) => {}
            None => errs.push(required(
                child(path, "type"),
                "must be array if x-kubernetes-list-type is specified",
            )),
            Some(t) => errs.push(invalid(
                child(path, "type"),
                &json!(t.name()),
                "must be array if x-kubernetes-list-type is specified",
            )),
        }
        match list_type.as_str() {
            "atomic" => {}
            "set" => {
                if let Some(items) = &node.items {
                    if items.ty == Some(SchemaType::Object)
                        && items.map_type.as_deref() != Some("atomic")
                    {
                        errs.push(invalid(
                            child(&child(path, "items"), "x-kubernetes-map-type"),
                            &json!(items.map_type),
                            "must be atomic as item of a list with x-kubernetes-list-type=set",
                        ));
                    }
                    if items.ty == Some(SchemaType::Array)
                        && items.list_type.as_deref() != Some("atomic")
                    {
                        errs.push(invalid(
                            child(&child(path, "items"), "x-kubernetes-list-type"),
                            &json!(items.list_type),
                            "must be atomic as item of a list with x-kubernetes-list-type=set",
                        ));
                    }
                    if items.nullable {
                        errs.push(forbidden(
                            child(&child(path, "items"), "nullable"),
                            "cannot be nullable when x-kubernetes-list-type is set",
                        ));
                    }
                }
            }
            "map" => check_map_list(node, path, errs),
            other => errs.push(not_supported(
                child(path, "x-kubernetes-list-type"),
                &json!(other),
                &["atomic".into(), "set".into(), "map".into()],
            )),
        }
    }
    if !node.list_map_keys.is_empty() && node.list_type.as_deref() != Some("map") {
        match &node.list_type {
            None => errs.push(required(
                child(path, "x-kubernetes-list-type"),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
            Some(t) => errs.push(invalid(
                child(path, "x-kubernetes-list-type"),
                &json!(t),
                "must be map if x-kubernetes-list-map-keys is non-empty",
            )),
        }
    }
}

fn check_map_list(node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if node.list_map_keys.is_empty() {
        errs.push(required(
            child(path, "x-kubernetes-list-map-keys"),
            "must not be empty if x-kubernetes-list-type is map",
        ));
    }
    let Some(items) = &node.items else {
        errs.push(required(
            child(path, "items"),
            "must have a schema if x-kubernetes-list-type is map",
        ));
        return;
    };
    let items_path = child(path, "items");
    if items.ty != Some(SchemaType::Object) {
        errs.push(invalid(
            child(&items_path, "type"),
            &json!(items.ty.map_or("", SchemaType::name)),
            "must be object if parent array's x-kubernetes-list-type is map",
        ));
        return;
    }
    if items.nullable {
        errs.push(forbidden(
            child(&items_path, "nullable"),
            "cannot be nullable when x-kubernetes-list-type is map",
        ));
    }
    let mut seen = Vec::new();
    for k in &node.list_map_keys {
        if seen.contains(&k) {
            errs.push(invalid(
                child(path, "x-kubernetes-list-map-keys"),
                &json!(node.list_map_keys),
                "must not contain duplicate entries",
            ));
        }
        seen.push(k);
        let Some(prop) = items.properties.get(k) else {
            errs.push(invalid(
                child(path, "x-kubernetes-list-map-keys"),
                &json!(node.list_map_keys),
                "entries must all be names of item properties",
            ));
            continue;
        };
        let prop_path = key(&child(&items_path, "properties"), k);
        if matches!(prop.ty, Some(SchemaType::Object | SchemaType::Array) | None)
            && !prop.int_or_string
        {
            errs.push(invalid(
                child(&prop_path, "type"),
                &json!(prop.ty.map_or("", SchemaType::name)),
                "must be a scalar type if parent array's x-kubernetes-list-type is map",
            ));
        }
        if !items.required.contains(k) && prop.default.is_none() {
            errs.push(required(
                child(&prop_path, "default"),
                "this property is in x-kubernetes-list-map-keys, so it must have a default or be a required property",
            ));
        }
        if prop.nullable {
            errs.push(forbidden(
                child(&prop_path, "nullable"),
                "this property is in x-kubernetes-list-map-keys, so it cannot be nullable",
            ));
        }
    }
}
