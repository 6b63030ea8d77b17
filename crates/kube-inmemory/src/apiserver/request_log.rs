//! An opt-in, audit-like log of the requests the server answered: the user the caller
//! authenticated as, and the request's Kubernetes authorization attributes (verb, API group,
//! resource, subresource, namespace, name) derived from method, path and query exactly as the
//! real API server's `RequestInfoFactory` derives them, so a test can replay the log against
//! RBAC rules.
//!
//! The log keeps every record in memory ([`RequestLog::records`]) and, when made with
//! [`RequestLog::to_file`], also appends each one as a JSON line. It grows without bound: it is
//! meant for tests and short debugging sessions, not for a long-running server.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

/// The user of a request that presented no credentials the server knows (the real server's
/// anonymous user).
pub const ANONYMOUS_USER: &str = "system:anonymous";

/// One request, as an authorizer sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestRecord {
    /// The authenticated user name ([`ANONYMOUS_USER`] when none).
    pub user: String,
    /// The authorization attributes.
    #[serde(flatten)]
    pub attributes: RequestAttributes,
    /// The HTTP status code answered (200 for a watch that was started).
    pub code: u16,
}

/// The Kubernetes authorization attributes of a request (`authorizer.AttributesRecord`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestAttributes {
    /// `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection` for
    /// a resource request; the lower-case HTTP method for a non-resource one.
    pub verb: String,
    /// Whether the path names a resource (`/api/v1/...`, `/apis/<group>/<version>/...`);
    /// otherwise only `verb` and `path` are set (`/version`, `/apis`, discovery documents).
    pub resource_request: bool,
    /// API group (`""` for the core group).
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Resource (plural).
    pub resource: String,
    /// Subresource (`status`, ...), `""` for none.
    pub subresource: String,
    /// Namespace, `""` for cluster-scoped requests and requests across all namespaces.
    pub namespace: String,
    /// Object name: from the path, or for list/watch from a `metadata.name=<name>` field
    /// selector (what lets a `resourceNames` rule grant a single-object watch).
    pub name: String,
    /// The URL path.
    pub path: String,
}

/// Derives the authorization attributes of a request as the real server's
/// `RequestInfoFactory.NewRequestInfo` does: the verb from the HTTP method (GET on a
/// collection is `list`, or `watch` with `watch=true` or under the legacy `/watch/` prefix;
/// DELETE on a collection is `deletecollection`), `namespaces/<ns>/<resource>` paths, and the
/// namespace's own subresources (`namespaces/<ns>/status`, `finalize`).
#[must_use]
pub fn attributes<S: std::hash::BuildHasher>(
    method: &str,
    path: &str,
    query: &HashMap<String, String, S>,
) -> RequestAttributes {
    let mut attrs = RequestAttributes {
        verb: method.to_ascii_lowercase(),
        path: path.to_owned(),
        ..RequestAttributes::default()
    };
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let rest = match parts.as_slice() {
        ["api", version, rest @ ..] if !rest.is_empty() => {
            (*version).clone_into(&mut attrs.api_version);
            rest
        }
        ["apis", group, version, rest @ ..] if !rest.is_empty() => {
            (*group).clone_into(&mut attrs.api_group);
            (*version).clone_into(&mut attrs.api_version);
            rest
        }
        // `/version`, `/healthz`, `/api`, `/apis`, `/api/v1`, `/apis/<group>/<version>`.
        _ => return attrs,
    };
    attrs.resource_request = true;
    let mut rest: &[&str] = rest;
    let via_method = if rest.first() == Some(&"watch") && rest.len() > 1 {
        "watch".clone_into(&mut attrs.verb);
        rest = &rest[1..];
        false
    } else {
        match method {
            "POST" => "create",
            "GET" | "HEAD" => "get",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" => "delete",
            _ => "",
        }
        .clone_into(&mut attrs.verb);
        true
    };
    if rest.first() == Some(&"namespaces")
        && let Some(namespace) = rest.get(1)
    {
        (*namespace).clone_into(&mut attrs.namespace);
        // `namespaces/<ns>/status` and `/finalize` are the namespace's subresources.
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    if let Some(resource) = rest.first() {
        (*resource).clone_into(&mut attrs.resource);
    }
    if let Some(name) = rest.get(1) {
        (*name).clone_into(&mut attrs.name);
    }
    if let Some(subresource) = rest.get(2) {
        (*subresource).clone_into(&mut attrs.subresource);
    }
    if attrs.name.is_empty() && via_method && attrs.verb == "get" {
        let watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
        if watch { "watch" } else { "list" }.clone_into(&mut attrs.verb);
    }
    if attrs.name.is_empty() && matches!(attrs.verb.as_str(), "list" | "watch") {
        attrs.name = exact_name(query.get("fieldSelector").map_or("", String::as_str));
    }
    if attrs.name.is_empty() && attrs.verb == "delete" {
        "deletecollection".clone_into(&mut attrs.verb);
    }
    attrs
}

/// The name a field selector requires exactly (`metadata.name=x` or `metadata.name==x`,
/// alone or among other terms), else `""`.
fn exact_name(selector: &str) -> String {
    selector
        .split(',')
        .find_map(|term| {
            let (field, value) = term.split_once("==").or_else(|| term.split_once('='))?;
            (field.trim() == "metadata.name" && !value.starts_with('=')).then(|| value.trim())
        })
        .unwrap_or_default()
        .to_owned()
}

/// Errors opening the log file.
#[derive(Debug, thiserror::Error)]
#[error("opening the request log {path}: {source}")]
pub struct RequestLogError {
    /// The file.
    path: PathBuf,
    /// OS error.
    #[source]
    source: std::io::Error,
}

#[derive(Default)]
struct Inner {
    records: Vec<RequestRecord>,
    file: Option<(PathBuf, std::fs::File)>,
}

/// The log; clones share it (give one to [`super::ServerOptions::request_log`], keep one to
/// read).
#[derive(Clone, Default)]
pub struct RequestLog {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for RequestLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.lock();
        f.debug_struct("RequestLog")
            .field("records", &inner.records.len())
            .field("file", &inner.file.as_ref().map(|(path, _)| path))
            .finish()
    }
}

impl RequestLog {
    /// A log kept in memory only.
    #[must_use]
    pub fn in_memory() -> Self {
        Self::default()
    }

    /// A log kept in memory that also writes each record as one JSON line to `path`
    /// (created or truncated).
    pub fn to_file(path: &Path) -> Result<Self, RequestLogError> {
        let file = std::fs::File::create(path)
            .map_err(|source| RequestLogError { path: path.to_owned(), source })?;
        let inner = Inner { records: Vec::new(), file: Some((path.to_owned(), file)) };
        Ok(Self { inner: Arc::new(Mutex::new(inner)) })
    }

    /// Every record so far, in the order the requests were answered.
    #[must_use]
    pub fn records(&self) -> Vec<RequestRecord> {
        self.lock().records.clone()
    }

    /// Appends one record.
    pub(crate) fn record(&self, record: RequestRecord) {
        let mut inner = self.lock();
        if let Some((path, file)) = &mut inner.file {
            let mut line = serde_json::to_vec(&record).unwrap_or_default();
            line.push(b'\n');
            if let Err(err) = file.write_all(&line) {
                tracing::warn!(path = %path.display(), %err, "writing the request log failed");
            }
        }
        inner.records.push(record);
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves a complete Vec: keep using it.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(method: &str, path: &str, query: &[(&str, &str)]) -> RequestAttributes {
        let query: HashMap<String, String> =
            query.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        attributes(method, path, &query)
    }

    /// (verb, group, resource, subresource, namespace, name)
    type Short<'a> = (&'a str, &'a str, &'a str, &'a str, &'a str, &'a str);

    /// (method, path, query, expected)
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], Short<'a>);

    fn short(a: &RequestAttributes) -> Short<'_> {
        (&a.verb, &a.api_group, &a.resource, &a.subresource, &a.namespace, &a.name)
    }

    #[test]
    fn verbs_follow_method_collection_and_watch() {
        let claims = "/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims";
        let cases: &[Case<'_>] = &[
            ("GET", claims, &[], ("list", "resource.k8s.io", "resourceclaims", "", "ns", "")),
            (
                "GET",
                claims,
                &[("watch", "true")],
                ("watch", "resource.k8s.io", "resourceclaims", "", "ns", ""),
            ),
            (
                "GET",
                &format!("{claims}/c1"),
                &[],
                ("get", "resource.k8s.io", "resourceclaims", "", "ns", "c1"),
            ),
            ("POST", claims, &[], ("create", "resource.k8s.io", "resourceclaims", "", "ns", "")),
            (
                "PUT",
                &format!("{claims}/c1"),
                &[],
                ("update", "resource.k8s.io", "resourceclaims", "", "ns", "c1"),
            ),
            (
                "PATCH",
                &format!("{claims}/c1/status"),
                &[("fieldManager", "x")],
                ("patch", "resource.k8s.io", "resourceclaims", "status", "ns", "c1"),
            ),
            (
                "DELETE",
                &format!("{claims}/c1"),
                &[],
                ("delete", "resource.k8s.io", "resourceclaims", "", "ns", "c1"),
            ),
            (
                "DELETE",
                claims,
                &[],
                ("deletecollection", "resource.k8s.io", "resourceclaims", "", "ns", ""),
            ),
            ("HEAD", "/api/v1/nodes/n1", &[], ("get", "", "nodes", "", "", "n1")),
        ];
        for (method, path, query, want) in cases {
            let got = attrs(method, path, query);
            assert!(got.resource_request, "{method} {path}");
            assert_eq!(short(&got), *want, "{method} {path} {query:?}");
        }
    }

    #[test]
    fn cluster_scoped_all_namespaces_and_the_namespace_resource() {
        let got = attrs("GET", "/apis/resource.k8s.io/v1/resourceclaims", &[]);
        assert_eq!(short(&got), ("list", "resource.k8s.io", "resourceclaims", "", "", ""));
        let got = attrs("GET", "/api/v1/namespaces", &[]);
        assert_eq!(short(&got), ("list", "", "namespaces", "", "", ""));
        let got = attrs("GET", "/api/v1/namespaces/kube-system", &[]);
        assert_eq!(short(&got), ("get", "", "namespaces", "", "kube-system", "kube-system"));
        let got = attrs("PUT", "/api/v1/namespaces/ns1/finalize", &[]);
        assert_eq!(short(&got), ("update", "", "namespaces", "finalize", "ns1", "ns1"));
        let got = attrs("PATCH", "/api/v1/namespaces/ns1/status", &[]);
        assert_eq!(short(&got), ("patch", "", "namespaces", "status", "ns1", "ns1"));
        let got = attrs("POST", "/apis/events.k8s.io/v1/namespaces/default/events", &[]);
        assert_eq!(short(&got), ("create", "events.k8s.io", "events", "", "default", ""));
    }

    #[test]
    fn a_metadata_name_field_selector_names_the_object_of_a_list_or_watch() {
        let got = attrs(
            "GET",
            "/api/v1/nodes",
            &[("watch", "true"), ("fieldSelector", "metadata.name=node-a")],
        );
        assert_eq!(short(&got), ("watch", "", "nodes", "", "", "node-a"));
        let got = attrs("GET", "/api/v1/nodes", &[("fieldSelector", "spec.x=1,metadata.name==n")]);
        assert_eq!(short(&got), ("list", "", "nodes", "", "", "n"));
        // Not an exact match: no name.
        let got = attrs("GET", "/api/v1/nodes", &[("fieldSelector", "metadata.name!=n")]);
        assert_eq!(short(&got), ("list", "", "nodes", "", "", ""));
        // The legacy watch prefix.
        let got = attrs("GET", "/api/v1/watch/namespaces/ns/pods", &[]);
        assert_eq!(short(&got), ("watch", "", "pods", "", "ns", ""));
    }

    #[test]
    fn non_resource_paths_keep_the_method_as_verb() {
        for path in ["/version", "/healthz", "/api", "/apis", "/api/v1", "/apis/netclaim.dev/v1"] {
            let got = attrs("GET", path, &[]);
            assert!(!got.resource_request, "{path}");
            assert_eq!((got.verb.as_str(), got.path.as_str()), ("get", path));
            assert!(got.resource.is_empty(), "{path}");
        }
        assert_eq!(attrs("POST", "/version", &[]).verb, "post");
    }

    #[test]
    fn the_file_gets_one_json_line_per_record() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("requests.jsonl");
        let log = RequestLog::to_file(&path).unwrap();
        let record = RequestRecord {
            user: "u".to_owned(),
            attributes: attrs("GET", "/api/v1/nodes/n1", &[]),
            code: 200,
        };
        log.clone().record(record.clone());
        log.record(record.clone());
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<RequestRecord> =
            text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines, vec![record.clone(), record.clone()]);
        assert_eq!(log.records(), vec![record.clone(), record]);
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["apiGroup"], "");
        assert_eq!(first["verb"], "get");
        assert_eq!(first["resource"], "nodes");
    }
}
