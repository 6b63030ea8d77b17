//! RBAC evaluation for SubjectAccessReviews: the Roles, ClusterRoles and their bindings
//! stored on the server decide whether a user (with its groups) may make a request, as the
//! real server's RBAC authorizer (`rbac.authorization.k8s.io/v1`) decides it:
//!
//! - a ClusterRoleBinding grants its ClusterRole's rules everywhere; a RoleBinding grants
//!   its Role's (or a ClusterRole's) rules in the binding's namespace only, so it never
//!   grants a cluster-scoped or non-resource request;
//! - subjects are `User` (the user name), `Group` (one of the user's groups, such as
//!   `system:authenticated` or `system:serviceaccounts:<ns>`) and `ServiceAccount`
//!   (`system:serviceaccount:<ns>:<name>`, the namespace defaulting to the binding's);
//! - a resource rule matches on `apiGroups`, `resources` (`resource/subresource`, `*`,
//!   `*/subresource`), `verbs` and `resourceNames` (a rule with names never matches a request
//!   without one); a non-resource rule on `nonResourceURLs` (exact, `*`, or a prefix ending
//!   in `*`) and `verbs`;
//! - only allows: nothing denies, and a binding whose role is missing grants nothing.
//!
//! Not modelled: aggregated ClusterRoles (`aggregationRule`: the real controller copies the
//! selected roles' rules in; here a ClusterRole has the rules it was written with) and
//! escalation checks on writes of roles and bindings. The bootstrap roles the server starts
//! with are `cluster-admin` (bound to the group `system:masters`, the group of the admin
//! token) and `system:auth-delegator`.

use std::sync::Arc;

use serde_json::{Value, json};

use super::error::ApiError;
use super::objects::{self, WriteContext};
use super::store::Txn;
use super::typed::FieldValidation;

/// The RBAC API group.
pub(crate) const GROUP: &str = "rbac.authorization.k8s.io";

/// Who asks: a user name and its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Subject {
    /// User name (`system:serviceaccount:<ns>:<name>` for a service account).
    pub(crate) user: String,
    /// Group names.
    pub(crate) groups: Vec<String>,
}

/// What is asked: a resource request or a non-resource one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Request {
    /// A request on an API resource.
    Resource {
        /// `get`, `list`, `create`, ...
        verb: String,
        /// API group, `""` for core.
        group: String,
        /// Plural resource name.
        resource: String,
        /// Subresource, `""` for none.
        subresource: String,
        /// Namespace, `""` for cluster-scoped or all namespaces.
        namespace: String,
        /// Object name, `""` for none.
        name: String,
    },
    /// A request on a path outside the API (`/metrics`, `/healthz`).
    NonResource {
        /// The lower-case HTTP method (`get`).
        verb: String,
        /// The URL path.
        path: String,
    },
}

/// The bindings and roles as stored.
pub(crate) struct Policy {
    /// ClusterRoles.
    pub(crate) cluster_roles: Vec<Arc<Value>>,
    /// ClusterRoleBindings.
    pub(crate) cluster_role_bindings: Vec<Arc<Value>>,
    /// Roles of every namespace.
    pub(crate) roles: Vec<Arc<Value>>,
    /// RoleBindings of every namespace.
    pub(crate) role_bindings: Vec<Arc<Value>>,
}

fn strings(value: &Value) -> impl Iterator<Item = &str> {
    value.as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn text<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

/// Whether `subject` (of a binding in `binding_namespace`, `""` for a ClusterRoleBinding)
/// names `who`.
fn names(subject: &Value, binding_namespace: &str, who: &Subject) -> bool {
    let name = text(subject, "/name");
    match text(subject, "/kind") {
        "User" => name == who.user,
        "Group" => who.groups.iter().any(|g| g == name),
        "ServiceAccount" => {
            let namespace = match text(subject, "/namespace") {
                "" => binding_namespace,
                ns => ns,
            };
            !name.is_empty()
                && !namespace.is_empty()
                && who.user == format!("system:serviceaccount:{namespace}:{name}")
        }
        _ => false,
    }
}

fn has(list: &Value, wanted: &str) -> bool {
    strings(list).any(|item| item == "*" || item == wanted)
}

/// Whether `rule` allows `request` (RBAC's `RuleAllows`).
fn rule_allows(rule: &Value, request: &Request) -> bool {
    match request {
        Request::Resource { verb, group, resource, subresource, name, .. } => {
            let combined = if subresource.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{subresource}")
            };
            let resource_matches = strings(&rule["resources"]).any(|r| {
                r == "*"
                    || r == combined
                    || (!subresource.is_empty() && r.strip_prefix("*/") == Some(subresource))
            });
            let names: Vec<&str> = strings(&rule["resourceNames"]).collect();
            has(&rule["verbs"], verb)
                && has(&rule["apiGroups"], group)
                && resource_matches
                && (names.is_empty() || names.contains(&name.as_str()))
        }
        Request::NonResource { verb, path } => {
            has(&rule["verbs"], verb)
                && strings(&rule["nonResourceURLs"]).any(|url| {
                    url == "*"
                        || url == path
                        || url.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
                })
        }
    }
}

fn find<'a>(objects: &'a [Arc<Value>], namespace: &str, name: &str) -> Option<&'a Value> {
    objects
        .iter()
        .map(AsRef::as_ref)
        .find(|o| text(o, "/metadata/name") == name && text(o, "/metadata/namespace") == namespace)
}

impl Policy {
    /// `Some(reason)` when a binding grants `request` to `who` (the reason names the
    /// binding and role, as the real authorizer's), `None` when nothing does.
    pub(crate) fn allows(&self, who: &Subject, request: &Request) -> Option<String> {
        let who_text =
            |subject: &Value| format!("{} {:?}", text(subject, "/kind"), text(subject, "/name"));
        for binding in &self.cluster_role_bindings {
            let role = text(binding, "/roleRef/name");
            let Some(subject) = strings_of(binding, "subjects").find(|s| names(s, "", who)) else {
                continue;
            };
            let Some(cluster_role) = find(&self.cluster_roles, "", role) else { continue };
            if rules(cluster_role).any(|rule| rule_allows(rule, request)) {
                return Some(format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of ClusterRole {role:?} to {}",
                    text(binding, "/metadata/name"),
                    who_text(subject)
                ));
            }
        }
        let Request::Resource { namespace, .. } = request else { return None };
        if namespace.is_empty() {
            return None;
        }
        for binding in &self.role_bindings {
            if text(binding, "/metadata/namespace") != namespace {
                continue;
            }
            let Some(subject) = strings_of(binding, "subjects").find(|s| names(s, namespace, who))
            else {
                continue;
            };
            let role_name = text(binding, "/roleRef/name");
            let role = match text(binding, "/roleRef/kind") {
                "ClusterRole" => find(&self.cluster_roles, "", role_name),
                "Role" => find(&self.roles, namespace, role_name),
                _ => None,
            };
            if role.is_some_and(|role| rules(role).any(|rule| rule_allows(rule, request))) {
                return Some(format!(
                    "RBAC: allowed by RoleBinding {:?} of {} {role_name:?} to {}",
                    format!("{}/{namespace}", text(binding, "/metadata/name")),
                    text(binding, "/roleRef/kind"),
                    who_text(subject)
                ));
            }
        }
        None
    }
}

fn strings_of<'a>(object: &'a Value, field: &str) -> impl Iterator<Item = &'a Value> {
    object.get(field).and_then(Value::as_array).into_iter().flatten()
}

fn rules(role: &Value) -> impl Iterator<Item = &Value> {
    strings_of(role, "rules")
}

/// Creates the bootstrap roles the real server keeps: `cluster-admin` bound to
/// `system:masters`, and `system:auth-delegator` (TokenReviews and SubjectAccessReviews, for
/// servers that delegate authentication and authorisation to this one).
pub(crate) fn create_bootstrap_policy(txn: &mut Txn<'_>) -> Result<(), ApiError> {
    let ctx = WriteContext {
        manager: "netclaim-dev-apiserver",
        subresource: "",
        field_validation: FieldValidation::Strict,
        drop_consumable_capacity: false,
        admission: None,
    };
    let labels = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    let objects = [
        (
            "clusterroles",
            json!({"kind": "ClusterRole", "metadata": {"name": "cluster-admin", "labels": labels},
                "rules": [
                    {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                    {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
        ),
        (
            "clusterroles",
            json!({"kind": "ClusterRole",
                "metadata": {"name": "system:auth-delegator", "labels": labels},
                "rules": [
                    {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
                     "verbs": ["create"]},
                    {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"],
                     "verbs": ["create"]}]}),
        ),
        (
            "clusterrolebindings",
            json!({"kind": "ClusterRoleBinding",
                "metadata": {"name": "cluster-admin", "labels": labels},
                "roleRef": {"apiGroup": GROUP, "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": GROUP, "kind": "Group", "name": "system:masters"}]}),
        ),
    ];
    for (plural, mut object) in objects {
        object["apiVersion"] = json!(format!("{GROUP}/v1"));
        let resource = txn
            .registry()
            .lookup(GROUP, "v1", plural)
            .ok_or_else(|| ApiError::internal(format!("{plural} are not in the resource table")))?;
        objects::create(txn, &resource, object, &ctx, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::{Policy, Request, Subject};

    fn objects(items: &[Value]) -> Vec<Arc<Value>> {
        items.iter().cloned().map(Arc::new).collect()
    }

    fn service_account(namespace: &str, name: &str) -> Subject {
        Subject {
            user: format!("system:serviceaccount:{namespace}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    fn get(path: &str) -> Request {
        Request::NonResource { verb: "get".into(), path: path.into() }
    }

    fn resource(verb: &str, group: &str, resource: &str, namespace: &str, name: &str) -> Request {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Request::Resource {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    fn policy() -> Policy {
        Policy {
            cluster_roles: objects(&[
                json!({"metadata": {"name": "metrics-reader"},
                    "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]}),
                json!({"metadata": {"name": "debug"},
                    "rules": [{"nonResourceURLs": ["/debug/*"], "verbs": ["get"]}]}),
                json!({"metadata": {"name": "claim-status"},
                    "rules": [{"apiGroups": ["resource.k8s.io"],
                               "resources": ["resourceclaims/status"],
                               "verbs": ["patch"], "resourceNames": ["c1"]}]}),
                json!({"metadata": {"name": "any-status"},
                    "rules": [{"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["get"]}]}),
            ]),
            cluster_role_bindings: objects(&[
                json!({"metadata": {"name": "prometheus"},
                    "roleRef": {"kind": "ClusterRole", "name": "metrics-reader"},
                    "subjects": [{"kind": "ServiceAccount", "namespace": "monitoring",
                                  "name": "prometheus"}]}),
                json!({"metadata": {"name": "everyone-debug"},
                    "roleRef": {"kind": "ClusterRole", "name": "debug"},
                    "subjects": [{"kind": "Group", "name": "system:authenticated"}]}),
                json!({"metadata": {"name": "alice-status"},
                    "roleRef": {"kind": "ClusterRole", "name": "any-status"},
                    "subjects": [{"kind": "User", "name": "alice"}]}),
                json!({"metadata": {"name": "dangling"},
                    "roleRef": {"kind": "ClusterRole", "name": "no-such-role"},
                    "subjects": [{"kind": "User", "name": "alice"}]}),
            ]),
            roles: objects(&[json!({"metadata": {"name": "pods", "namespace": "team"},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]})]),
            role_bindings: objects(&[
                json!({"metadata": {"name": "pods", "namespace": "team"},
                    "roleRef": {"kind": "Role", "name": "pods"},
                    "subjects": [{"kind": "ServiceAccount", "name": "app"}]}),
                // A ClusterRole with non-resource rules bound in a namespace grants nothing
                // outside resource requests of that namespace.
                json!({"metadata": {"name": "metrics", "namespace": "team"},
                    "roleRef": {"kind": "ClusterRole", "name": "metrics-reader"},
                    "subjects": [{"kind": "ServiceAccount", "name": "app"}]}),
                json!({"metadata": {"name": "status", "namespace": "team"},
                    "roleRef": {"kind": "ClusterRole", "name": "claim-status"},
                    "subjects": [{"kind": "Group", "name": "system:serviceaccounts:team"}]}),
            ]),
        }
    }

    #[test]
    fn non_resource_urls_are_granted_by_cluster_role_bindings_only() {
        let policy = policy();
        let prometheus = service_account("monitoring", "prometheus");
        let reason = policy.allows(&prometheus, &get("/metrics")).unwrap();
        assert!(reason.contains("ClusterRoleBinding \"prometheus\""), "{reason}");
        assert_eq!(policy.allows(&prometheus, &get("/metrics/extra")), None, "exact URL only");
        assert_eq!(
            policy.allows(
                &prometheus,
                &Request::NonResource { verb: "post".into(), path: "/metrics".into() }
            ),
            None,
            "verb"
        );
        // The same name in another namespace is another service account.
        assert_eq!(
            policy.allows(&service_account("default", "prometheus"), &get("/metrics")),
            None
        );
        // Bound through a RoleBinding: not for a non-resource URL.
        assert_eq!(policy.allows(&service_account("team", "app"), &get("/metrics")), None);
        // A prefix rule, through a group every authenticated user has.
        assert!(policy.allows(&service_account("team", "app"), &get("/debug/pprof")).is_some());
        assert_eq!(policy.allows(&service_account("team", "app"), &get("/debugger")), None);
        let anonymous = Subject {
            user: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        };
        assert_eq!(policy.allows(&anonymous, &get("/debug/pprof")), None);
    }

    #[test]
    fn resource_rules_follow_namespace_subresource_and_names() {
        let policy = policy();
        let app = service_account("team", "app");
        assert!(policy.allows(&app, &resource("get", "", "pods", "team", "web")).is_some());
        assert!(policy.allows(&app, &resource("list", "", "pods", "team", "")).is_some());
        assert_eq!(policy.allows(&app, &resource("delete", "", "pods", "team", "web")), None);
        assert_eq!(policy.allows(&app, &resource("get", "", "pods", "other", "web")), None);
        assert_eq!(policy.allows(&app, &resource("get", "", "pods", "", "")), None, "cluster-wide");
        assert_eq!(policy.allows(&app, &resource("get", "", "pods/log", "team", "web")), None);
        // resourceNames: the named object only, never a request without a name.
        let status = |name: &str| {
            resource("patch", "resource.k8s.io", "resourceclaims/status", "team", name)
        };
        assert!(policy.allows(&app, &status("c1")).is_some());
        assert_eq!(policy.allows(&app, &status("c2")), None);
        assert_eq!(policy.allows(&app, &status("")), None);
        assert_eq!(policy.allows(&service_account("other", "app"), &status("c1")), None);
        // `*/status` and `*` groups.
        let alice = Subject { user: "alice".into(), groups: vec!["system:authenticated".into()] };
        assert!(
            policy
                .allows(&alice, &resource("get", "apps", "deployments/status", "x", "d"))
                .is_some()
        );
        assert_eq!(policy.allows(&alice, &resource("get", "apps", "deployments", "x", "d")), None);
    }
}
