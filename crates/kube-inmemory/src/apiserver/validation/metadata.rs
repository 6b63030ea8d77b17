//! The `metadata` rules every kind shares: the name's format, label keys and values, and
//! the annotations' type and total size.

use serde_json::Value;

use super::Errors;
use super::names::{is_dns_label, is_dns_subdomain, label_name_ok};
use crate::apiserver::error::FieldError;
use crate::apiserver::resources::ResourceInfo;

pub(super) fn validate_metadata(resource: &ResourceInfo, obj: &Value, errs: &mut Errors) {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        errs.push(FieldError::required("metadata.name", "name or generateName is required"));
    } else {
        let rbac = resource.group == "rbac.authorization.k8s.io";
        let ok = if resource.kind == "Namespace" {
            is_dns_label(name)
        } else if rbac {
            // RBAC objects only need a valid path segment (`system:auth-delegator`).
            !matches!(name, "." | "..") && !name.contains(['/', '%'])
        } else {
            is_dns_subdomain(name)
        };
        if !ok && rbac {
            errs.push(FieldError::invalid(
                "metadata.name",
                format!("{name:?}: may not be '.' or '..' and may not contain '/' or '%'"),
            ));
        } else if !ok {
            errs.push(FieldError::invalid(
                "metadata.name",
                format!("{name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
            ));
        }
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let field = format!("metadata.labels[{k}]");
            let (prefix, key_name) =
                k.split_once('/').map_or((None, k.as_str()), |(p, n)| (Some(p), n));
            if prefix.is_some_and(|p| !is_dns_subdomain(p)) || !label_name_ok(key_name) {
                errs.push(FieldError::invalid(&field, format!("{k:?}: invalid label key")));
            }
            match v.as_str() {
                Some("") => {}
                Some(s) if label_name_ok(s) => {}
                _ => errs.push(FieldError::invalid(&field, format!("{v}: invalid label value"))),
            }
        }
    }
    if let Some(annotations) = obj.pointer("/metadata/annotations").and_then(Value::as_object) {
        let total: usize =
            annotations.iter().map(|(k, v)| k.len() + v.as_str().map_or(0, str::len)).sum();
        if total > 256 * 1024 {
            errs.push(FieldError::too_long("metadata.annotations", total, 256 * 1024));
        }
        for (k, v) in annotations {
            if !v.is_string() {
                errs.push(FieldError::invalid(
                    format!("metadata.annotations[{k}]"),
                    "must be a string",
                ));
            }
        }
    }
}
