//! Typed decoding of built-in kinds: the object must decode as its k8s-openapi type (400
//! otherwise), and fields the type does not know are pruned, reported as warnings, or
//! rejected with `fieldValidation=Strict`, as the real server does for built-in kinds.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventsEvent;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::error::ApiError;
use super::resources::ResourceInfo;

/// The `fieldValidation` directive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FieldValidation {
    /// Drop unknown fields silently.
    Ignore,
    /// Drop unknown fields and warn (the server default).
    Warn,
    /// Reject unknown fields with 400.
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter (default Warn).
    pub(crate) fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("" | "Warn") => Ok(Self::Warn),
            Some("Ignore") => Ok(Self::Ignore),
            Some("Strict") => Ok(Self::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation must be one of Ignore, Warn or Strict, got {other:?}"
            ))),
        }
    }
}

fn roundtrip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    serde_json::to_value(typed).map_err(|e| e.to_string())
}

fn typed_form(resource: &ResourceInfo, v: &Value) -> Option<Result<Value, String>> {
    if resource.custom.is_some() {
        return None;
    }
    Some(match (resource.group.as_str(), resource.kind.as_str()) {
        ("", "Namespace") => roundtrip::<Namespace>(v),
        ("", "Node") => roundtrip::<Node>(v),
        ("", "Pod") => roundtrip::<Pod>(v),
        ("", "Event") => roundtrip::<Event>(v),
        ("events.k8s.io", "Event") => roundtrip::<EventsEvent>(v),
        ("coordination.k8s.io", "Lease") => roundtrip::<Lease>(v),
        ("", "ServiceAccount") => roundtrip::<ServiceAccount>(v),
        ("rbac.authorization.k8s.io", "Role") => roundtrip::<Role>(v),
        ("rbac.authorization.k8s.io", "RoleBinding") => roundtrip::<RoleBinding>(v),
        ("rbac.authorization.k8s.io", "ClusterRole") => roundtrip::<ClusterRole>(v),
        ("rbac.authorization.k8s.io", "ClusterRoleBinding") => roundtrip::<ClusterRoleBinding>(v),
        ("resource.k8s.io", "ResourceSlice") => roundtrip::<ResourceSlice>(v),
        ("resource.k8s.io", "DeviceClass") => roundtrip::<DeviceClass>(v),
        ("resource.k8s.io", "ResourceClaim") => roundtrip::<ResourceClaim>(v),
        ("resource.k8s.io", "ResourceClaimTemplate") => roundtrip::<ResourceClaimTemplate>(v),
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicy") => {
            roundtrip::<ValidatingAdmissionPolicy>(v)
        }
        ("admissionregistration.k8s.io", "ValidatingAdmissionPolicyBinding") => {
            roundtrip::<ValidatingAdmissionPolicyBinding>(v)
        }
        ("apiextensions.k8s.io", "CustomResourceDefinition") => {
            roundtrip::<CustomResourceDefinition>(v)
        }
        _ => return None,
    })
}

/// Collects paths present (non-null) in `input` but absent from `typed`.
fn unknown_paths(input: &Value, typed: &Value, prefix: &str, out: &mut Vec<String>) {
    match (input, typed) {
        (Value::Object(i), Value::Object(t)) => {
            for (k, v) in i {
                let path = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                match t.get(k) {
                    Some(tv) => unknown_paths(v, tv, &path, out),
                    None if v.is_null() => {}
                    None => out.push(path),
                }
            }
        }
        (Value::Array(i), Value::Array(t)) => {
            for (idx, (iv, tv)) in i.iter().zip(t).enumerate() {
                unknown_paths(iv, tv, &format!("{prefix}[{idx}]"), out);
            }
        }
        _ => {}
    }
}

fn remove_path(v: &mut Value, path: &str) {
    // Paths come from `unknown_paths`: dot-separated fields with `[i]` indexes.
    let mut cur = v;
    let parts: Vec<&str> = path.split('.').collect();
    for (n, part) in parts.iter().enumerate() {
        let (field, indexes) = match part.find('[') {
            Some(p) => (&part[..p], &part[p..]),
            None => (*part, ""),
        };
        let last = n + 1 == parts.len();
        if last && indexes.is_empty() {
            if let Some(m) = cur.as_object_mut() {
                m.remove(field);
            }
            return;
        }
        let Some(next) = cur.get_mut(field) else {
            return;
        };
        cur = next;
        for idx in indexes.split(['[', ']']).filter(|s| !s.is_empty()) {
            let Ok(i) = idx.parse::<usize>() else { return };
            let Some(next) = cur.get_mut(i) else { return };
            cur = next;
        }
    }
}

/// The unknown fields of a custom object's `metadata` (its `ObjectMeta`), removed; their
/// paths are returned (`metadata.bogus`). A `metadata` that does not decode is left to
/// validation.
pub(crate) fn prune_object_meta(obj: &mut Value) -> Vec<String> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    let Some(meta) = obj.get("metadata") else { return Vec::new() };
    let Ok(typed) = roundtrip::<ObjectMeta>(meta) else { return Vec::new() };
    let mut unknown = Vec::new();
    unknown_paths(meta, &typed, "metadata", &mut unknown);
    for p in unknown.iter().rev() {
        remove_path(obj, p);
    }
    unknown
}

/// Checks that `obj` decodes as its type and handles unknown fields per `mode`; a
/// custom resource is pruned against its schema and, with `defaults`, defaulted.
/// Returns warnings for the `Warning` header.
pub(crate) fn check(
    resource: &ResourceInfo,
    obj: &mut Value,
    mode: FieldValidation,
    defaults: bool,
) -> Result<Vec<String>, ApiError> {
    if let Some(custom) = &resource.custom {
        return super::crd::decode(custom, obj, mode, defaults);
    }
    let Some(typed) = typed_form(resource, obj) else {
        return Ok(Vec::new());
    };
    let typed = typed.map_err(|e| {
        ApiError::bad_request(format!(
            "{} in version \"{}\" cannot be handled as a {}: {e}",
            resource.kind, resource.version, resource.kind
        ))
    })?;
    // A null decodes to the Go zero value: the field is simply unset.
    super::fieldset::strip_nulls(obj);
    let mut unknown = Vec::new();
    unknown_paths(obj, &typed, "", &mut unknown);
    if unknown.is_empty() {
        return Ok(Vec::new());
    }
    if mode == FieldValidation::Strict {
        let list: Vec<String> = unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect();
        return Err(ApiError::bad_request(format!("strict decoding error: {}", list.join(", "))));
    }
    for p in unknown.iter().rev() {
        remove_path(obj, p);
    }
    Ok(if mode == FieldValidation::Warn {
        unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect()
    } else {
        Vec::new()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slices() -> std::sync::Arc<ResourceInfo> {
        super::super::resources::built_in_resource("resource.k8s.io", "v1", "resourceslices")
            .unwrap()
    }

    fn slice() -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": "s"},
               "spec": {"driver": "d", "nodeName": "n", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": "a", "bogus": 1}]}})
    }

    #[test]
    fn unknown_fields_pruned_warned_or_rejected() {
        let mut obj = slice();
        let warnings = check(&slices(), &mut obj, FieldValidation::Warn, true).unwrap();
        assert_eq!(warnings, vec!["unknown field \"spec.devices[0].bogus\""]);
        assert_eq!(obj["spec"]["devices"][0], json!({"name": "a"}));
        let mut obj = slice();
        let err = check(&slices(), &mut obj, FieldValidation::Strict, true).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains("spec.devices[0].bogus"));
    }

    #[test]
    fn wrong_types_are_bad_requests() {
        let mut obj = slice();
        obj["spec"]["pool"]["generation"] = json!("one");
        assert_eq!(
            check(&slices(), &mut obj, FieldValidation::Ignore, true).unwrap_err().code,
            400
        );
    }
}
