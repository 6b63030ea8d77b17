//! `meta.k8s.io/v1` Table rendering, which `kubectl get` asks for (`Accept: ...;as=Table`).

use serde_json::{Value, json};

/// Whether the `Accept` header asks for a Table.
pub(crate) fn wants_table(accept: &str) -> bool {
    accept.split(',').next().is_some_and(|first| first.contains("as=Table"))
}

/// Age as kubectl prints it (`45s`, `3m20s`, `5h`, `2d`).
pub(crate) fn human_age(seconds: i64) -> String {
    if seconds < 0 {
        return "<invalid>".into();
    }
    let (m, h, d) = (seconds / 60, seconds / 3600, seconds / 86400);
    if seconds < 120 {
        format!("{seconds}s")
    } else if m < 10 {
        if seconds % 60 == 0 { format!("{m}m") } else { format!("{m}m{}s", seconds % 60) }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        if m % 60 == 0 { format!("{h}h") } else { format!("{h}h{}m", m % 60) }
    } else if h < 48 {
        format!("{h}h")
    } else {
        format!("{d}d")
    }
}

fn age_of(obj: &Value) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .map_or_else(
            || "<unknown>".to_owned(),
            |t| human_age(super::objects::unix_now() - t.as_second()),
        )
}

/// A Table of `objects` (Name and Age columns). `include_object` selects whether rows
/// carry the full object or only its metadata (`includeObject=Object|Metadata`).
pub(crate) fn table(objects: &[&Value], resource_version: &str, include_object: bool) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let name = o.pointer("/metadata/name").cloned().unwrap_or(Value::Null);
            let object = if include_object {
                (*o).clone()
            } else {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"]})
            };
            json!({"cells": [name, age_of(o)], "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "Time since creation.", "priority": 0},
        ],
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_like_kubectl() {
        assert_eq!(human_age(5), "5s");
        assert_eq!(human_age(200), "3m20s");
        assert_eq!(human_age(600), "10m");
        assert_eq!(human_age(4 * 3600 + 60), "4h1m");
        assert_eq!(human_age(10 * 3600), "10h");
        assert_eq!(human_age(3 * 86400), "3d");
    }

    #[test]
    fn table_accept_detection() {
        assert!(wants_table("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"));
        assert!(!wants_table("application/json"));
    }
}
