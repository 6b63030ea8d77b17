//! The pod subresources a kubelet streams (`log`, `exec`, `attach`, `portforward`): the
//! in-memory server has no kubelet to proxy them to, and the dev cluster's pods run no
//! containers (a pod is a network namespace of its own). Each gets the pod's 404 when the
//! pod does not exist, else a 400 `BadRequest` Status, the code a real API server answers
//! when a pod's containers cannot serve the stream (`container ... is waiting to start`),
//! saying where the pod's network namespace is so that the user can look inside it.

use serde_json::Value;

use super::Shared;
use super::error::ApiError;

/// The subresources answered here.
pub(crate) const SUBRESOURCES: &[&str] = &["log", "exec", "attach", "portforward"];

/// The answer to `<verb>` on pod `namespace/name`: always an error.
pub(crate) fn answer(shared: &Shared, namespace: &str, name: &str, subresource: &str) -> ApiError {
    let pods = shared.store.with_registry(|r| r.lookup("", "v1", "pods"));
    let pod = pods.and_then(|pods| {
        shared.store.transact(false, |t| t.get(&pods, &(namespace.to_owned(), name.to_owned())))
    });
    let Some(pod) = pod else {
        return ApiError::not_found("", "pods", name);
    };
    let what = match subresource {
        "log" => "no container logs",
        "portforward" => "no container ports to forward",
        _ => "no container to run commands in",
    };
    // An unbound pod has no sandbox, so no network namespace to point at: say why it waits.
    if pod.pointer("/spec/nodeName").and_then(Value::as_str).is_none_or(str::is_empty) {
        return ApiError::with(
            400,
            "BadRequest",
            format!(
                "pod {namespace}/{name} has {what}: it is not scheduled to a node yet, so it has no network namespace (its PodScheduled condition says why)"
            ),
        );
    }
    let uid = pod.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("<pod uid>");
    let look = match &shared.options.pod_netns_dir {
        Some(dir) => format!("nsenter --net={} ip address", dir.join(uid).display()),
        None => format!(
            "nsenter --net=<run dir>/netns/{uid} ip address (with --nodes: <run dir>/n<i>/pods/{uid}; netclaim dev logs its run dir when the cluster is ready)"
        ),
    };
    ApiError::with(
        400,
        "BadRequest",
        format!(
            "pod {namespace}/{name} has {what}: netclaim dev runs no containers, each pod is a network namespace of its own. Look inside it with: {look}"
        ),
    )
}
