//! A small RBAC evaluator for the RBAC test: the ClusterRoles, Roles and their bindings of a
//! rendered kustomization, checked against the requests the dev API server recorded
//! (`kube_inmemory::apiserver::request_log`). It evaluates as the real RBAC authorizer does
//! for what our rules use (apiGroups, resources with `resource/subresource`, verbs,
//! resourceNames, a Role's namespace, `*` wildcards; service-account subjects), and keeps
//! count of which (rule, verb, resource) grant allowed something, so a grant nothing used is
//! found too.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

/// One authorization check (the attributes of `authorizer.AttributesRecord` RBAC reads).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Check {
    pub user: String,
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

impl Check {
    /// `resource` or `resource/subresource`, as RBAC rules name it.
    pub fn resource_path(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.api_group.is_empty() { "core" } else { &self.api_group };
        write!(f, "{} {} {group}/{}", self.user, self.verb, self.resource_path())?;
        if !self.namespace.is_empty() {
            write!(f, " in {}", self.namespace)?;
        }
        if !self.name.is_empty() {
            write!(f, " name {}", self.name)?;
        }
        Ok(())
    }
}

/// One (rule, verb, resource) grant of a role bound to a subject.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// `ClusterRole/<name>` or `Role/<namespace>/<name>`.
    pub role: String,
    /// Index of the rule in the role.
    pub rule: usize,
    /// The subject (`system:serviceaccount:<ns>:<name>`).
    pub user: String,
    /// Namespace the grant is limited to (a RoleBinding's), `None` cluster-wide.
    pub namespace: Option<String>,
    pub api_group: String,
    pub resource: String,
    pub verb: String,
    pub resource_names: Vec<String>,
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.api_group.is_empty() { "core" } else { &self.api_group };
        write!(f, "{} rule {}: {} {group}/{}", self.role, self.rule, self.verb, self.resource)?;
        if !self.resource_names.is_empty() {
            write!(f, " resourceNames {:?}", self.resource_names)?;
        }
        write!(f, " (for {})", self.user)
    }
}

impl Grant {
    /// Whether this grant allows `check`.
    pub fn allows(&self, check: &Check) -> bool {
        self.user == check.user
            && self.namespace.as_deref().is_none_or(|ns| ns == check.namespace)
            && (self.api_group == "*" || self.api_group == check.api_group)
            && (self.resource == "*" || self.resource == check.resource_path())
            && (self.verb == "*" || self.verb == check.verb)
            && (self.resource_names.is_empty() || self.resource_names.contains(&check.name))
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

fn kind_name(object: &Value) -> (&str, &str) {
    (
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or_default(),
    )
}

/// Every (rule, verb, resource) grant of the rendered `objects`, per service-account
/// subject of the bindings. Panics on what the evaluator does not model (a rule with
/// nonResourceURLs, a subject that is not a service account, a binding to a missing role),
/// so the test never silently under-checks.
pub fn grants(objects: &[Value]) -> Vec<Grant> {
    let mut grants = Vec::new();
    for binding in objects {
        let (kind, binding_name) = kind_name(binding);
        let binding_namespace = match kind {
            "ClusterRoleBinding" => None,
            "RoleBinding" => Some(binding["metadata"]["namespace"].as_str().unwrap().to_owned()),
            _ => continue,
        };
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        let role_name = binding["roleRef"]["name"].as_str().unwrap();
        let role = objects
            .iter()
            .find(|o| {
                kind_name(o) == (role_kind, role_name)
                    && (role_kind == "ClusterRole"
                        || o["metadata"]["namespace"].as_str() == binding_namespace.as_deref())
            })
            .unwrap_or_else(|| panic!("{kind} {binding_name}: no {role_kind} {role_name}"));
        let role_label = match role_kind {
            "ClusterRole" => format!("ClusterRole/{role_name}"),
            _ => format!("Role/{}/{role_name}", binding_namespace.as_deref().unwrap_or_default()),
        };
        for subject in binding["subjects"].as_array().into_iter().flatten() {
            assert_eq!(
                subject["kind"], "ServiceAccount",
                "{kind} {binding_name}: only service-account subjects are modelled"
            );
            let user = format!(
                "system:serviceaccount:{}:{}",
                subject["namespace"].as_str().unwrap(),
                subject["name"].as_str().unwrap()
            );
            for (index, rule) in role["rules"].as_array().into_iter().flatten().enumerate() {
                assert!(
                    rule.get("nonResourceURLs").is_none(),
                    "{role_label} rule {index}: nonResourceURLs are not modelled"
                );
                let names = strings(&rule["resourceNames"]);
                for group in strings(&rule["apiGroups"]) {
                    for resource in strings(&rule["resources"]) {
                        for verb in strings(&rule["verbs"]) {
                            grants.push(Grant {
                                role: role_label.clone(),
                                rule: index,
                                user: user.clone(),
                                namespace: binding_namespace.clone(),
                                api_group: group.clone(),
                                resource: resource.clone(),
                                verb,
                                resource_names: names.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
    grants
}

/// The outcome of evaluating checks against grants.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Checks no grant allows.
    pub denied: BTreeSet<Check>,
    /// Grants that allowed no check.
    pub unused: Vec<Grant>,
}

/// Evaluates every check; a grant counts as used when it allows at least one.
pub fn evaluate(grants: &[Grant], checks: &BTreeSet<Check>) -> Verdict {
    let mut used = vec![false; grants.len()];
    let mut verdict = Verdict::default();
    for check in checks {
        let mut allowed = false;
        for (grant, used) in grants.iter().zip(used.iter_mut()) {
            if grant.allows(check) {
                *used = true;
                allowed = true;
            }
        }
        if !allowed {
            verdict.denied.insert(check.clone());
        }
    }
    verdict.unused =
        grants.iter().zip(&used).filter(|(_, used)| !**used).map(|(g, _)| g.clone()).collect();
    verdict
}
