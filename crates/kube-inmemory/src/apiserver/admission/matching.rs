//! Which requests a policy or binding matches (`MatchResources`: resource rules, exclusions,
//! namespace and object selectors, `matchPolicy`), and the label selectors they use.

use serde_json::Value;

use super::Write;
use crate::apiserver::resources::ResourceInfo;
use crate::apiserver::store::Txn;

/// One `NamedRuleWithOperations`.
#[derive(Debug, Default)]
struct Rule {
    groups: Vec<String>,
    versions: Vec<String>,
    resources: Vec<String>,
    operations: Vec<String>,
    names: Vec<String>,
    /// `*`, `Cluster` or `Namespaced`.
    scope: String,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
}

fn has(list: &[String], value: &str) -> bool {
    list.iter().any(|item| item == "*" || item == value)
}

impl Rule {
    fn parse(v: &Value) -> Self {
        Self {
            groups: strings(&v["apiGroups"]),
            versions: strings(&v["apiVersions"]),
            resources: strings(&v["resources"]),
            operations: strings(&v["operations"]),
            names: strings(&v["resourceNames"]),
            scope: v["scope"].as_str().unwrap_or("*").to_owned(),
        }
    }

    /// Whether a request to `resource` in `version` matches (the version is checked apart,
    /// see [`MatchResources::matches`]).
    fn matches_except_version(
        &self,
        resource: &ResourceInfo,
        write: &Write<'_>,
        name: &str,
    ) -> bool {
        let resource_ok = self.resources.iter().any(|r| match r.split_once('/') {
            None => (r == "*" || r == &resource.plural) && write.subresource.is_empty(),
            Some((main, sub)) => {
                (main == "*" || main == resource.plural) && (sub == "*" || sub == write.subresource)
            }
        });
        let scope_ok = match self.scope.as_str() {
            "Cluster" => !resource.namespaced,
            "Namespaced" => resource.namespaced,
            _ => true,
        };
        has(&self.groups, &resource.group)
            && has(&self.operations, write.operation.name())
            && resource_ok
            && scope_ok
            && (self.names.is_empty() || self.names.iter().any(|n| n == name))
    }
}

/// A `matchConstraints` or a binding's `matchResources`.
#[derive(Debug, Default)]
pub(super) struct MatchResources {
    rules: Vec<Rule>,
    excluded: Vec<Rule>,
    namespace_selector: Value,
    object_selector: Value,
    /// `matchPolicy: Equivalent` (the default): a rule for another served version of the
    /// same resource matches too.
    equivalent: bool,
    /// Whether the binding set any resource rules (a binding without them narrows nothing).
    pub(super) has_rules: bool,
}

impl MatchResources {
    /// Parses `v` (null: matches everything the rules allow).
    pub(super) fn parse(v: &Value) -> Self {
        let rules: Vec<Rule> =
            v["resourceRules"].as_array().into_iter().flatten().map(Rule::parse).collect();
        Self {
            has_rules: !rules.is_empty(),
            rules,
            excluded: v["excludeResourceRules"]
                .as_array()
                .into_iter()
                .flatten()
                .map(Rule::parse)
                .collect(),
            namespace_selector: v["namespaceSelector"].clone(),
            object_selector: v["objectSelector"].clone(),
            equivalent: v["matchPolicy"].as_str() != Some("Exact"),
        }
    }

    /// The resource (the request's, or an equivalent version of it) through which `write`
    /// matches the rules, if it does; exclusions and selectors checked.
    pub(super) fn matches(
        &self,
        txn: &Txn<'_>,
        write: &Write<'_>,
        require_rules: bool,
    ) -> Option<std::sync::Arc<ResourceInfo>> {
        let (name, namespace) = write.name_and_namespace();
        let resource = write.resource;
        // The request's own version first, then the other versions of the same storage.
        let mut candidates: Vec<std::sync::Arc<ResourceInfo>> = txn
            .registry()
            .all()
            .iter()
            .filter(|r| r.storage == resource.storage && r.plural == resource.plural)
            .cloned()
            .collect();
        candidates.sort_by_key(|r| r.version != resource.version);
        let hit = |rules: &[Rule], r: &ResourceInfo| {
            rules.iter().any(|rule| {
                rule.matches_except_version(r, write, &name) && has(&rule.versions, &r.version)
            })
        };
        let matched = if require_rules || self.has_rules {
            candidates.into_iter().find(|r| {
                (r.version == resource.version || self.equivalent) && hit(&self.rules, r)
            })?
        } else {
            candidates.into_iter().next()?
        };
        if hit(&self.excluded, resource) {
            return None;
        }
        if !self.selectors_match(txn, write, &namespace) {
            return None;
        }
        Some(matched)
    }

    fn selectors_match(&self, txn: &Txn<'_>, write: &Write<'_>, namespace: &str) -> bool {
        let labels_of = |o: Option<&Value>| o.map(|o| o.pointer("/metadata/labels").cloned());
        let object_ok = [labels_of(write.object), labels_of(write.old_object)]
            .into_iter()
            .flatten()
            .any(|labels| selector_matches(&self.object_selector, labels.as_ref()));
        if !object_ok {
            return false;
        }
        if is_empty_selector(&self.namespace_selector) {
            return true;
        }
        let resource = write.resource;
        let namespace_labels = if resource.namespaced {
            namespace_object(txn, namespace).and_then(|ns| ns.pointer("/metadata/labels").cloned())
        } else if resource.custom.is_none() && resource.kind == "Namespace" {
            write.object.or(write.old_object).and_then(|o| o.pointer("/metadata/labels").cloned())
        } else {
            // A cluster-scoped object is in no namespace: the selector does not apply.
            return true;
        };
        selector_matches(&self.namespace_selector, namespace_labels.as_ref())
    }
}

/// The Namespace object `name`, if stored.
pub(super) fn namespace_object(txn: &Txn<'_>, name: &str) -> Option<Value> {
    if name.is_empty() {
        return None;
    }
    let namespaces = txn.registry().lookup("", "v1", "namespaces")?;
    txn.get(&namespaces, &(String::new(), name.to_owned())).map(|ns| (*ns).clone())
}

fn is_empty_selector(selector: &Value) -> bool {
    selector["matchLabels"].as_object().is_none_or(serde_json::Map::is_empty)
        && selector["matchExpressions"].as_array().is_none_or(Vec::is_empty)
}

/// Whether `labels` (an object of strings, or None) satisfy a `metav1.LabelSelector`
/// (null or `{}`: everything).
pub(super) fn selector_matches(selector: &Value, labels: Option<&Value>) -> bool {
    let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    let labels_ok = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| label(k) == v.as_str());
    let expressions_ok = selector["matchExpressions"].as_array().into_iter().flatten().all(|e| {
        let key = e["key"].as_str().unwrap_or_default();
        let values = strings(&e["values"]);
        let value = label(key);
        match e["operator"].as_str() {
            Some("In") => value.is_some_and(|v| values.iter().any(|x| x == v)),
            Some("NotIn") => value.is_none_or(|v| !values.iter().any(|x| x == v)),
            Some("Exists") => value.is_some(),
            Some("DoesNotExist") => value.is_none(),
            _ => false,
        }
    });
    labels_ok && expressions_ok
}
