//! The resources the in-memory API server serves: the built-in kinds, and the custom
//! resources that join (and leave) with their CustomResourceDefinitions. Each resource
//! carries its names, scope, subresources, selectable fields and the list semantics
//! server-side apply needs.

use std::borrow::Cow;
use std::cmp::Ordering;
use std::sync::Arc;
#[cfg(test)]
use std::sync::LazyLock;

use serde_json::Value;

use super::catalog;
use super::crd::CustomVersion;

/// How server-side apply treats a list (the `x-kubernetes-list-type` of the real schema).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListType {
    /// Replaced as a whole by whoever sets it (the default for lists).
    Atomic,
    /// Items are scalars, merged by value.
    Set,
    /// Items are objects identified by these key fields.
    Map(Vec<String>),
}

/// Identity of a resource's object store: one per built-in resource, one per custom
/// resource definition (shared by all its versions), never reused.
pub(crate) type StorageId = u64;

/// One REST resource (`<plural>` under a group/version).
#[derive(Debug)]
pub(crate) struct ResourceInfo {
    /// Where its objects live.
    pub(crate) storage: StorageId,
    /// API group; empty for the core group.
    pub(crate) group: String,
    /// API version.
    pub(crate) version: String,
    /// URL name (`resourceclaims`).
    pub(crate) plural: String,
    /// Singular name (`resourceclaim`).
    pub(crate) singular: String,
    /// Kind (`ResourceClaim`).
    pub(crate) kind: String,
    /// Kind of its lists (`ResourceClaimList`).
    pub(crate) list_kind: String,
    /// Whether objects live in a namespace.
    pub(crate) namespaced: bool,
    /// Whether the resource has a `/status` subresource (then the main endpoint ignores
    /// status changes and `/status` ignores everything else).
    pub(crate) has_status: bool,
    /// Whether create clears `.status` (Kubernetes does this for kinds with a status
    /// subresource whose status is owned by controllers: pods, claims, custom resources;
    /// not nodes).
    pub(crate) reset_status_on_create: bool,
    /// `kubectl` short names.
    pub(crate) short_names: Vec<String>,
    /// `kubectl get <category>` groups it belongs to.
    pub(crate) categories: Vec<String>,
    /// Fields usable in a field selector besides `metadata.name` and `metadata.namespace`.
    pub(crate) selectable_fields: Vec<String>,
    /// For a custom resource: its definition's version (schema, rules, columns).
    pub(crate) custom: Option<Arc<CustomVersion>>,
}

impl ResourceInfo {
    /// `apiVersion` of the objects as this endpoint serves them (`v1`,
    /// `resource.k8s.io/v1`).
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `apiVersion` objects are stored with: the storage version of a custom resource
    /// (its versions share one store), else the served one.
    pub(crate) fn storage_api_version(&self) -> String {
        match &self.custom {
            Some(c) => format!("{}/{}", self.group, c.storage_version),
            None => self.api_version(),
        }
    }

    /// `obj` as this endpoint serves it: a custom resource read through another version
    /// than its storage version gets this version's `apiVersion` (the `None` conversion
    /// strategy, the only one this server supports).
    pub(crate) fn present<'a>(&self, obj: &'a Value) -> Cow<'a, Value> {
        if self.custom.is_none() {
            return Cow::Borrowed(obj);
        }
        let served = self.api_version();
        if obj.get("apiVersion").and_then(Value::as_str) == Some(served.as_str()) {
            Cow::Borrowed(obj)
        } else {
            let mut converted = obj.clone();
            converted["apiVersion"] = Value::String(served);
            Cow::Owned(converted)
        }
    }

    /// `group/version` path prefix (`/api/v1`, `/apis/resource.k8s.io/v1`).
    pub(crate) fn path_prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// `<plural>.<group>` (or the plural alone for the core group), as error messages
    /// name a resource.
    pub(crate) fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The list semantics of the list at `path` (field names from the object root, `[]`
    /// for "any item"): a custom resource's schema, else the `+listType` markers of the
    /// Kubernetes API types.
    pub(crate) fn list_type(&self, path: &str) -> ListType {
        match path {
            "metadata.finalizers" => return ListType::Set,
            "metadata.ownerReferences" => return ListType::Map(vec!["uid".into()]),
            _ => {}
        }
        if let Some(custom) = &self.custom {
            return custom.schema.list_type(path);
        }
        match path {
            "status.reservedFor" => ListType::Map(vec!["uid".into()]),
            "status.conditions" | "status.devices[].conditions" => {
                ListType::Map(vec!["type".into()])
            }
            _ => self.kind_list_type(path),
        }
    }

    fn kind_list_type(&self, path: &str) -> ListType {
        let keys = |k: &[&str]| ListType::Map(k.iter().map(|s| (*s).to_owned()).collect());
        // A workload's pod template has the Pod's lists (containers merged by name, ...).
        let template = match self.kind.as_str() {
            "Deployment" | "DaemonSet" | "StatefulSet" | "ReplicaSet" | "Job" => {
                path.strip_prefix("spec.template.")
            }
            "CronJob" => path.strip_prefix("spec.jobTemplate.spec.template."),
            _ => None,
        };
        let (kind, path) = template.map_or((self.kind.as_str(), path), |rest| ("Pod", rest));
        match (kind, path) {
            ("Service", "spec.ports") => keys(&["port", "protocol"]),
            // k8s.io/api resource/v1 types.go: `+listType=map`, keys driver, device, pool,
            // shareID. Note: ResourceSlice `spec.devices` is `+listType=atomic` upstream.
            ("ResourceClaim", "status.devices") => keys(&["driver", "device", "pool", "shareID"]),
            (
                "Pod",
                "spec.containers"
                | "spec.initContainers"
                | "spec.ephemeralContainers"
                | "spec.volumes"
                | "spec.resourceClaims"
                | "spec.containers[].env"
                | "spec.initContainers[].env"
                | "status.resourceClaimStatuses",
            )
            | ("CustomResourceDefinition", "spec.versions") => keys(&["name"]),
            ("Pod", "spec.containers[].ports" | "spec.initContainers[].ports") => {
                keys(&["containerPort", "protocol"])
            }
            ("Pod", "spec.containers[].volumeMounts" | "spec.initContainers[].volumeMounts") => {
                keys(&["mountPath"])
            }
            ("Pod", "status.podIPs" | "status.hostIPs") => keys(&["ip"]),
            ("Node", "status.addresses") | ("CustomResourceDefinition", "status.conditions") => {
                keys(&["type"])
            }
            _ => ListType::Atomic,
        }
    }

    /// Whether the object at `path` is atomic (replaced whole, owned as one field), like
    /// `RawExtension` payloads, opaque parameters and `x-kubernetes-map-type: atomic`.
    pub(crate) fn is_atomic_object(&self, path: &str) -> bool {
        if let Some(custom) = &self.custom {
            return custom.schema.is_atomic_object(path);
        }
        path == "status.devices[].data"
            || path.ends_with("opaque.parameters")
            // A CRD's schemas are JSON documents, not fields of the CRD type.
            || (self.kind == "CustomResourceDefinition"
                && path.starts_with("spec.versions[].schema"))
    }

    /// Whether `field` may be used in a field selector on this resource.
    pub(crate) fn field_selectable(&self, field: &str) -> bool {
        field == "metadata.name"
            || (self.namespaced && field == "metadata.namespace")
            || self.selectable_fields.iter().any(|f| f == field)
    }
}

/// The built-in resources' names: group, version, plural, singular, kind, namespaced,
/// status subresource, status reset on create, short names, selectable fields.
type BuiltIn = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    bool,
    bool,
    &'static [&'static str],
    &'static [&'static str],
);

/// Every built-in resource, in discovery order.
const BUILT_IN: &[BuiltIn] = &[
    (
        "",
        "v1",
        "namespaces",
        "namespace",
        "Namespace",
        false,
        true,
        false,
        &["ns"],
        &["status.phase"],
    ),
    ("", "v1", "nodes", "node", "Node", false, true, false, &["no"], &["spec.unschedulable"]),
    (
        "",
        "v1",
        "pods",
        "pod",
        "Pod",
        true,
        true,
        true,
        &["po"],
        &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    ),
    (
        "",
        "v1",
        "events",
        "event",
        "Event",
        true,
        false,
        false,
        &["ev"],
        &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    ),
    (
        "events.k8s.io",
        "v1",
        "events",
        "event",
        "Event",
        true,
        false,
        false,
        &[],
        &[
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
    ),
    ("coordination.k8s.io", "v1", "leases", "lease", "Lease", true, false, false, &[], &[]),
    (
        "",
        "v1",
        "serviceaccounts",
        "serviceaccount",
        "ServiceAccount",
        true,
        false,
        false,
        &["sa"],
        &[],
    ),
    ("rbac.authorization.k8s.io", "v1", "roles", "role", "Role", true, false, false, &[], &[]),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "rolebindings",
        "rolebinding",
        "RoleBinding",
        true,
        false,
        false,
        &[],
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterroles",
        "clusterrole",
        "ClusterRole",
        false,
        false,
        false,
        &[],
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "clusterrolebinding",
        "ClusterRoleBinding",
        false,
        false,
        false,
        &[],
        &[],
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicies",
        "validatingadmissionpolicy",
        "ValidatingAdmissionPolicy",
        false,
        true,
        true,
        &[],
        &[],
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingadmissionpolicybindings",
        "validatingadmissionpolicybinding",
        "ValidatingAdmissionPolicyBinding",
        false,
        false,
        false,
        &[],
        &[],
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "customresourcedefinition",
        "CustomResourceDefinition",
        false,
        true,
        true,
        &["crd", "crds"],
        &[],
    ),
    (
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "resourceslice",
        "ResourceSlice",
        false,
        false,
        false,
        &[],
        &["spec.nodeName", "spec.driver", "spec.pool.name"],
    ),
    (
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        "deviceclass",
        "DeviceClass",
        false,
        false,
        false,
        &[],
        &[],
    ),
    (
        "resource.k8s.io",
        "v1",
        "resourceclaims",
        "resourceclaim",
        "ResourceClaim",
        true,
        true,
        true,
        &[],
        &[],
    ),
    (
        "resource.k8s.io",
        "v1",
        "resourceclaimtemplates",
        "resourceclaimtemplate",
        "ResourceClaimTemplate",
        true,
        false,
        false,
        &[],
        &[],
    ),
];

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The built-in resources, storage ids `0..`: [`BUILT_IN`], then the stored-only kinds
/// of [`catalog::KINDS`].
fn built_in() -> Vec<Arc<ResourceInfo>> {
    let core = BUILT_IN.iter().map(|b| {
        let (group, version, plural, singular, kind, namespaced, status, reset, short, fields) = *b;
        ResourceInfo {
            storage: 0,
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: singular.into(),
            kind: kind.into(),
            list_kind: format!("{kind}List"),
            namespaced,
            has_status: status,
            reset_status_on_create: reset,
            short_names: strings(short),
            // `kubectl get all` includes pods, as upstream's category does.
            categories: if kind == "Pod" { strings(&["all"]) } else { Vec::new() },
            selectable_fields: strings(fields),
            custom: None,
        }
    });
    let stored = catalog::KINDS.iter().map(|k| ResourceInfo {
        storage: 0,
        group: k.group.into(),
        version: k.version.into(),
        plural: k.plural.into(),
        singular: k.kind.to_ascii_lowercase(),
        kind: k.kind.into(),
        list_kind: format!("{}List", k.kind),
        namespaced: k.namespaced,
        has_status: k.status,
        reset_status_on_create: k.status,
        short_names: strings(k.short_names),
        categories: strings(k.categories),
        selectable_fields: Vec::new(),
        custom: None,
    });
    core.chain(stored)
        .enumerate()
        .map(|(i, r)| Arc::new(ResourceInfo { storage: i as StorageId, ..r }))
        .collect()
}

/// The built-in resource at `group/version/plural` (for unit tests).
#[cfg(test)]
pub(crate) fn built_in_resource(
    group: &str,
    version: &str,
    plural: &str,
) -> Option<Arc<ResourceInfo>> {
    static TABLE: LazyLock<Vec<Arc<ResourceInfo>>> = LazyLock::new(built_in);
    TABLE.iter().find(|r| r.group == group && r.version == version && r.plural == plural).cloned()
}

/// Kubernetes' version priority (`v2 > v1 > v1beta2 > v1beta1 > v1alpha1 > other`), as
/// discovery orders the versions of a group: GA before beta before alpha, higher numbers
/// first, names that do not look like Kubernetes versions last, alphabetically.
pub(crate) fn compare_versions(a: &str, b: &str) -> Ordering {
    fn parse(v: &str) -> Option<(u8, u64, u64)> {
        let rest = v.strip_prefix('v')?;
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let major: u64 = rest.get(..digits)?.parse().ok()?;
        if major == 0 || rest.starts_with('0') {
            return None;
        }
        let tail = &rest[digits..];
        if tail.is_empty() {
            return Some((2, major, 0));
        }
        let (stage, num) = if let Some(n) = tail.strip_prefix("beta") {
            (1, n)
        } else if let Some(n) = tail.strip_prefix("alpha") {
            (0, n)
        } else {
            return None;
        };
        if num.is_empty() || num.starts_with('0') || !num.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some((stage, major, num.parse().ok()?))
    }
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => y.cmp(&x),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// The resources served now: the built-in ones, then those of each custom resource
/// definition. Lives inside the store, so that a definition's write and its endpoints
/// change together.
#[derive(Debug)]
pub(crate) struct Registry {
    resources: Vec<Arc<ResourceInfo>>,
    next_storage: StorageId,
}

impl Registry {
    /// The built-in resources only.
    pub(crate) fn new() -> Self {
        let resources = built_in();
        let next_storage = resources.len() as StorageId;
        Self { resources, next_storage }
    }

    /// The resource served at `group/version/plural`.
    pub(crate) fn lookup(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceInfo>> {
        self.resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    /// Every resource served, in discovery order.
    pub(crate) fn all(&self) -> &[Arc<ResourceInfo>] {
        &self.resources
    }

    /// Whether objects of `storage` are still kept (their definition exists).
    pub(crate) fn has_storage(&self, storage: StorageId) -> bool {
        self.resources.iter().any(|r| r.storage == storage)
    }

    /// The `(group, version)` pairs served, core first, each group's versions by
    /// Kubernetes version priority (the first one is the preferred version).
    pub(crate) fn group_versions(&self) -> Vec<(String, String)> {
        let mut groups: Vec<&str> = Vec::new();
        for r in &self.resources {
            if !groups.contains(&r.group.as_str()) {
                groups.push(&r.group);
            }
        }
        let mut out = Vec::new();
        for g in groups {
            let mut versions: Vec<&str> = Vec::new();
            for r in self.resources.iter().filter(|r| r.group == g) {
                if !versions.contains(&r.version.as_str()) {
                    versions.push(&r.version);
                }
            }
            versions.sort_by(|a, b| compare_versions(a, b));
            out.extend(versions.into_iter().map(|v| (g.to_owned(), v.to_owned())));
        }
        out
    }

    /// The storage id of the custom resource definition `crd_name`, if installed.
    pub(crate) fn storage_of(&self, crd_name: &str) -> Option<StorageId> {
        self.resources
            .iter()
            .find(|r| r.custom.as_ref().is_some_and(|c| c.crd_name == crd_name))
            .map(|r| r.storage)
    }

    /// A fresh storage id for a new definition.
    pub(crate) fn allocate_storage(&mut self) -> StorageId {
        let id = self.next_storage;
        self.next_storage += 1;
        id
    }

    /// Serves `resources` (the served versions of definition `crd_name`) instead of what
    /// the definition served before.
    pub(crate) fn install(&mut self, crd_name: &str, resources: Vec<Arc<ResourceInfo>>) {
        self.uninstall(crd_name);
        self.resources.extend(resources);
    }

    /// Stops serving definition `crd_name`.
    pub(crate) fn uninstall(&mut self, crd_name: &str) {
        self.resources.retain(|r| r.custom.as_ref().is_none_or(|c| c.crd_name != crd_name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubernetes_version_priority() {
        let mut v = vec!["v1alpha1", "foo", "v1", "v2beta1", "v1beta2", "v2", "v1beta1", "v10"];
        v.sort_by(|a, b| compare_versions(a, b));
        assert_eq!(v, ["v10", "v2", "v1", "v2beta1", "v1beta2", "v1beta1", "v1alpha1", "foo"]);
    }

    #[test]
    fn built_ins_are_served_in_order() {
        let r = Registry::new();
        let gv = r.group_versions();
        assert_eq!(gv[0], (String::new(), "v1".to_owned()));
        assert!(gv.contains(&("apiextensions.k8s.io".to_owned(), "v1".to_owned())));
        assert!(r.lookup("resource.k8s.io", "v1", "resourceclaims").is_some());
        assert!(r.lookup("example.com", "v1", "widgets").is_none());
    }
}
