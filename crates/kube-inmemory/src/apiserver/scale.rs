//! The `scale` subresource of Deployments, StatefulSets and ReplicaSets (`kubectl scale`):
//! an `autoscaling/v1` Scale read from and written to the object's `spec.replicas`, as the
//! real server serves it. kubectl finds it in discovery (`deployments/scale`, kind Scale of
//! group autoscaling) and PATCHes `{"spec":{"replicas":N}}` to it.

use serde_json::{Value, json};

use super::Shared;
use super::error::ApiError;
use super::objects::{self, WriteContext};
use super::resources::ResourceInfo;
use super::rest::{ApiRequest, ApiResponse};
use super::store::ObjectKey;

/// Whether `resource` has a `scale` subresource.
pub(crate) fn has_scale(resource: &ResourceInfo) -> bool {
    resource.custom.is_none()
        && resource.group == "apps"
        && matches!(resource.plural.as_str(), "deployments" | "statefulsets" | "replicasets")
}

/// The discovery entry of `<plural>/scale`.
pub(crate) fn discovery_entry(resource: &ResourceInfo) -> Value {
    json!({
        "name": format!("{}/scale", resource.plural),
        "singularName": "",
        "namespaced": resource.namespaced,
        "group": "autoscaling",
        "version": "v1",
        "kind": "Scale",
        "verbs": ["get", "patch", "update"],
    })
}

/// `object` as a Scale: `spec.replicas` (1 when unset, the workloads' default), the
/// replicas the status counts and the selector as a label selector string.
fn scale_of(object: &Value) -> Value {
    let labels = object.pointer("/spec/selector/matchLabels").and_then(Value::as_object);
    let selector: Vec<String> = labels
        .into_iter()
        .flatten()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    let metadata = &object["metadata"];
    json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "uid": metadata["uid"],
            "resourceVersion": metadata["resourceVersion"],
            "creationTimestamp": metadata["creationTimestamp"],
        },
        "spec": {"replicas": object.pointer("/spec/replicas").cloned().unwrap_or(json!(1))},
        "status": {
            "replicas": object.pointer("/status/replicas").cloned().unwrap_or(json!(0)),
            "selector": selector.join(","),
        },
    })
}

/// The Scale after the request's body: a whole Scale (PUT) or a patch of it (PATCH).
fn requested(req: &ApiRequest<'_>, current: &Value) -> Result<Value, ApiError> {
    let body: Value = serde_json::from_slice(req.body)
        .map_err(|e| ApiError::bad_request(format!("error decoding Scale: {e}")))?;
    if req.method == "PUT" {
        return Ok(body);
    }
    let mut scale = current.clone();
    match req.content_type.split(';').next().unwrap_or_default().trim() {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            json_patch::merge(&mut scale, &body);
        }
        "application/json-patch+json" => {
            let ops: json_patch::Patch = serde_json::from_value(body)
                .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
            json_patch::patch(&mut scale, &ops).map_err(|e| {
                ApiError::with(422, "Invalid", format!("the JSON patch could not be applied: {e}"))
            })?;
        }
        other => return Err(ApiError::unsupported_media_type(other)),
    }
    Ok(scale)
}

/// GET, PUT or PATCH of `<resource>/<key>/scale`.
pub(crate) fn handle(
    shared: &Shared,
    req: &ApiRequest<'_>,
    resource: &ResourceInfo,
    key: &ObjectKey,
    ctx: &WriteContext<'_>,
    dry_run: bool,
) -> Result<ApiResponse, ApiError> {
    let not_found = || ApiError::not_found(&resource.group, &resource.plural, &key.1);
    let ok = |body| ApiResponse::Json { code: 200, body, warnings: Vec::new() };
    if req.method == "GET" {
        let object =
            shared.store.transact(false, |t| t.get(resource, key)).ok_or_else(not_found)?;
        return Ok(ok(scale_of(&object)));
    }
    if req.method != "PUT" && req.method != "PATCH" {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({} {})",
            req.method, req.path
        )));
    }
    let written = shared.store.transact(dry_run, |t| {
        let old = t.get(resource, key).ok_or_else(not_found)?;
        let scale = requested(req, &scale_of(&old))?;
        let replicas = scale.pointer("/spec/replicas").and_then(Value::as_i64).unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                "Scale",
                "autoscaling",
                &key.1,
                &[super::error::FieldError::invalid(
                    "spec.replicas",
                    "must be greater than or equal to 0",
                )],
            ));
        }
        let wanted_rv = scale.pointer("/metadata/resourceVersion").and_then(Value::as_str);
        if wanted_rv.is_some_and(|rv| !rv.is_empty())
            && wanted_rv != old.pointer("/metadata/resourceVersion").and_then(Value::as_str)
        {
            return Err(ApiError::conflict(
                &resource.group,
                &resource.plural,
                &key.1,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let mut object = (*old).clone();
        object["spec"]["replicas"] = json!(replicas);
        objects::update(t, resource, &old, object, ctx, false)
    })?;
    Ok(ok(scale_of(&written.object)))
}
