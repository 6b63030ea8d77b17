//! Object validation with field paths, as the real API server answers 422 Invalid: metadata
//! for every kind, and the resource.k8s.io/v1 rules of `ResourceSlices` and `ResourceClaims`
//! (protocols.md §3.1–§3.3). This module picks the rules by kind; each submodule holds the
//! rules of one part of the API.

mod attributes;
mod claim;
mod claim_status;
mod metadata;
mod names;
mod quantity;
mod slice;

use serde_json::Value;

use super::error::FieldError;
use super::resources::ResourceInfo;

pub(crate) use self::names::{is_dns_label, is_dns_subdomain};

type Errors = Vec<FieldError>;

/// Validates a create (`old` = None) or an update of `obj`.
pub(crate) fn validate(resource: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Errors {
    let mut errs = Vec::new();
    metadata::validate_metadata(resource, obj, &mut errs);
    if resource.custom.is_some() {
        return errs;
    }
    match (resource.group.as_str(), resource.kind.as_str()) {
        ("resource.k8s.io", "ResourceSlice") => slice::validate_slice(obj, old, &mut errs),
        ("resource.k8s.io", "ResourceClaim") => claim::validate_claim(obj, old, &mut errs),
        ("resource.k8s.io", "ResourceClaimTemplate") => {
            if let Some(spec) = obj.pointer("/spec/spec") {
                claim::validate_claim_spec(spec, "spec.spec", &mut errs);
            }
        }
        ("resource.k8s.io", "DeviceClass") => claim::validate_device_class(obj, &mut errs),
        _ => {}
    }
    errs
}

/// Checks that the list at `field` holds at most `max` entries.
fn check_count(v: Option<&Value>, field: &str, max: usize, errs: &mut Errors) {
    if let Some(n) = v.and_then(Value::as_array).map(Vec::len).filter(|n| *n > max) {
        errs.push(FieldError::too_many(field, n, max));
    }
}
