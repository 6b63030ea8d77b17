//! Field errors as the real API server words them (`k8s.io/apimachinery` field errors:
//! `Invalid value: 5000: ...`, `Required value`, `Unsupported value: "x": supported
//! values: ...`), and the field paths they name (`spec.ipam.subnets[0]`,
//! `properties[spec]`).

use serde_json::Value;

use crate::apiserver::error::FieldError;

/// `path.name` (or `name` at the root).
pub(crate) fn child(path: &str, name: &str) -> String {
    if path.is_empty() { name.to_owned() } else { format!("{path}.{name}") }
}

/// `path[key]`, how a map key or a named schema property is written.
pub(crate) fn key(path: &str, key: &str) -> String {
    format!("{path}[{key}]")
}

/// `path[i]`.
pub(crate) fn index(path: &str, i: usize) -> String {
    format!("{path}[{i}]")
}

/// A bad value as Go's field errors print it: strings quoted, numbers and booleans as
/// they are, anything else as JSON.
pub(crate) fn value_text(value: &Value) -> String {
    match value {
        Value::String(s) => Value::String(s.clone()).to_string(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => other.to_string(),
    }
}

fn with_detail(head: String, detail: &str) -> String {
    if detail.is_empty() { head } else { format!("{head}: {detail}") }
}

/// `FieldValueInvalid`: `Invalid value: <value>: <detail>`.
pub(crate) fn invalid(field: impl Into<String>, value: &Value, detail: &str) -> FieldError {
    FieldError {
        reason: "FieldValueInvalid",
        field: field.into(),
        message: with_detail(format!("Invalid value: {}", value_text(value)), detail),
    }
}

/// `FieldValueInvalid` without the value (objects and lists): `Invalid value: <detail>`.
pub(crate) fn invalid_omitted(field: impl Into<String>, detail: &str) -> FieldError {
    FieldError {
        reason: "FieldValueInvalid",
        field: field.into(),
        message: with_detail("Invalid value".to_owned(), detail),
    }
}

/// `FieldValueTypeInvalid`: `Invalid value: <value>: <detail>`.
pub(crate) fn type_invalid(field: impl Into<String>, value: &Value, detail: &str) -> FieldError {
    FieldError {
        reason: "FieldValueTypeInvalid",
        field: field.into(),
        message: with_detail(format!("Invalid value: {}", value_text(value)), detail),
    }
}

/// `FieldValueRequired`: `Required value[: detail]`.
pub(crate) fn required(field: impl Into<String>, detail: &str) -> FieldError {
    FieldError {
        reason: "FieldValueRequired",
        field: field.into(),
        message: with_detail("Required value".to_owned(), detail),
    }
}

/// `FieldValueForbidden`: `Forbidden: <detail>`.
pub(crate) fn forbidden(field: impl Into<String>, detail: &str) -> FieldError {
    FieldError {
        reason: "FieldValueForbidden",
        field: field.into(),
        message: with_detail("Forbidden".to_owned(), detail),
    }
}

/// `FieldValueNotSupported`: `Unsupported value: <value>: supported values: "a", "b"`.
pub(crate) fn not_supported(
    field: impl Into<String>,
    value: &Value,
    supported: &[String],
) -> FieldError {
    let quoted: Vec<String> =
        supported.iter().map(|s| Value::String(s.clone()).to_string()).collect();
    let detail = if quoted.is_empty() {
        String::new()
    } else {
        format!("supported values: {}", quoted.join(", "))
    };
    FieldError {
        reason: "FieldValueNotSupported",
        field: field.into(),
        message: with_detail(format!("Unsupported value: {}", value_text(value)), &detail),
    }
}

/// `FieldValueTooLong`: `Too long: may not be more than <max> bytes`.
pub(crate) fn too_long(field: impl Into<String>, max: u64) -> FieldError {
    let unit = if max == 1 { "byte" } else { "bytes" };
    FieldError {
        reason: "FieldValueTooLong",
        field: field.into(),
        message: format!("Too long: may not be more than {max} {unit}"),
    }
}

/// `FieldValueTooMany`: `Too many: <actual>: must have at most <max> items`.
pub(crate) fn too_many(field: impl Into<String>, actual: usize, max: u64) -> FieldError {
    let unit = if max == 1 { "item" } else { "items" };
    FieldError {
        reason: "FieldValueTooMany",
        field: field.into(),
        message: format!("Too many: {actual}: must have at most {max} {unit}"),
    }
}

/// `FieldValueDuplicate`: `Duplicate value: <value>`.
pub(crate) fn duplicate(field: impl Into<String>, value: &Value) -> FieldError {
    FieldError {
        reason: "FieldValueDuplicate",
        field: field.into(),
        message: format!("Duplicate value: {}", value_text(value)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_read_like_upstream() {
        assert_eq!(
            invalid(
                "spec.vlan",
                &json!(5000),
                "spec.vlan in body should be less than or equal to 4094"
            )
            .message,
            "Invalid value: 5000: spec.vlan in body should be less than or equal to 4094"
        );
        assert_eq!(required("spec.parents", "").message, "Required value");
        assert_eq!(
            not_supported("spec.mode", &json!("x"), &["a".into(), "b".into()]).message,
            "Unsupported value: \"x\": supported values: \"a\", \"b\""
        );
        assert_eq!(too_many("spec.a", 3, 2).message, "Too many: 3: must have at most 2 items");
        assert_eq!(too_long("spec.a", 63).message, "Too long: may not be more than 63 bytes");
        assert_eq!(key("properties", "spec"), "properties[spec]");
    }
}
