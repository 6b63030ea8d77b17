//! The table of resources the in-memory API server knows: names, scope, subresources,
//! selectable fields and the list semantics server-side apply needs.

/// How server-side apply treats a list (the `x-kubernetes-list-type` of the real schema).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListType {
    /// Replaced as a whole by whoever sets it (the default for lists).
    Atomic,
    /// Items are scalars, merged by value.
    Set,
    /// Items are objects identified by these key fields.
    Map(&'static [&'static str]),
}

/// One REST resource (`<plural>` under a group/version).
#[derive(Debug)]
pub(crate) struct ResourceInfo {
    /// API group; empty for the core group.
    pub(crate) group: &'static str,
    /// API version.
    pub(crate) version: &'static str,
    /// URL name (`resourceclaims`).
    pub(crate) plural: &'static str,
    /// Singular name (`resourceclaim`).
    pub(crate) singular: &'static str,
    /// Kind (`ResourceClaim`).
    pub(crate) kind: &'static str,
    /// Whether objects live in a namespace.
    pub(crate) namespaced: bool,
    /// Whether the resource has a `/status` subresource (then the main endpoint ignores
    /// status changes and `/status` ignores everything else).
    pub(crate) has_status: bool,
    /// Whether create clears `.status` (Kubernetes does this for kinds with a status
    /// subresource whose status is owned by controllers: pods, claims, CRDs; not nodes).
    pub(crate) reset_status_on_create: bool,
    /// `kubectl` short names.
    pub(crate) short_names: &'static [&'static str],
    /// Fields usable in a field selector besides `metadata.name` and `metadata.namespace`.
    pub(crate) selectable_fields: &'static [&'static str],
}

impl ResourceInfo {
    /// `apiVersion` of the objects (`v1`, `resource.k8s.io/v1`).
    pub(crate) fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
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

    /// The list semantics of the list at `path` (field names from the object root, `[]`
    /// for "any item"), taken from the `+listType` markers of the Kubernetes API types.
    pub(crate) fn list_type(&self, path: &str) -> ListType {
        match path {
            "metadata.finalizers" => ListType::Set,
            "metadata.ownerReferences" | "status.reservedFor" => ListType::Map(&["uid"]),
            "status.conditions" | "status.devices[].conditions" => ListType::Map(&["type"]),
            _ => self.kind_list_type(path),
        }
    }

    fn kind_list_type(&self, path: &str) -> ListType {
        match (self.kind, path) {
            // k8s.io/api resource/v1 types.go: `+listType=map`, keys driver, device, pool,
            // shareID. Note: ResourceSlice `spec.devices` is `+listType=atomic` upstream.
            ("ResourceClaim", "status.devices") => {
                ListType::Map(&["driver", "device", "pool", "shareID"])
            }
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
            ) => ListType::Map(&["name"]),
            ("Pod", "spec.containers[].ports" | "spec.initContainers[].ports") => {
                ListType::Map(&["containerPort", "protocol"])
            }
            ("Pod", "status.podIPs" | "status.hostIPs") => ListType::Map(&["ip"]),
            ("Node", "status.addresses") => ListType::Map(&["type"]),
            _ => ListType::Atomic,
        }
    }

    /// Whether the object at `path` is atomic (replaced whole, owned as one field), like
    /// `RawExtension` payloads and opaque parameters.
    pub(crate) fn is_atomic_object(&self, path: &str) -> bool {
        let _ = self;
        path == "status.devices[].data" || path.ends_with("opaque.parameters")
    }

    /// Whether `field` may be used in a field selector on this resource.
    pub(crate) fn field_selectable(&self, field: &str) -> bool {
        field == "metadata.name"
            || (self.namespaced && field == "metadata.namespace")
            || self.selectable_fields.contains(&field)
    }
}

/// Every resource served, in discovery order.
pub(crate) static RESOURCES: &[ResourceInfo] = &[
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        has_status: true,
        reset_status_on_create: false,
        short_names: &["ns"],
        selectable_fields: &["status.phase"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        has_status: true,
        reset_status_on_create: false,
        short_names: &["no"],
        selectable_fields: &["spec.unschedulable"],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        has_status: true,
        reset_status_on_create: true,
        short_names: &["po"],
        selectable_fields: &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
    },
    ResourceInfo {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        has_status: false,
        reset_status_on_create: false,
        short_names: &["ev"],
        selectable_fields: &[
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
    },
    ResourceInfo {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        has_status: false,
        reset_status_on_create: false,
        short_names: &[],
        selectable_fields: &[
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
    },
    ResourceInfo {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        has_status: false,
        reset_status_on_create: false,
        short_names: &[],
        selectable_fields: &[],
    },
    ResourceInfo {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceslices",
        singular: "resourceslice",
        kind: "ResourceSlice",
        namespaced: false,
        has_status: false,
        reset_status_on_create: false,
        short_names: &[],
        selectable_fields: &["spec.nodeName", "spec.driver", "spec.pool.name"],
    },
    ResourceInfo {
        group: "resource.k8s.io",
        version: "v1",
        plural: "deviceclasses",
        singular: "deviceclass",
        kind: "DeviceClass",
        namespaced: false,
        has_status: false,
        reset_status_on_create: false,
        short_names: &[],
        selectable_fields: &[],
    },
    ResourceInfo {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaims",
        singular: "resourceclaim",
        kind: "ResourceClaim",
        namespaced: true,
        has_status: true,
        reset_status_on_create: true,
        short_names: &[],
        selectable_fields: &[],
    },
    ResourceInfo {
        group: "resource.k8s.io",
        version: "v1",
        plural: "resourceclaimtemplates",
        singular: "resourceclaimtemplate",
        kind: "ResourceClaimTemplate",
        namespaced: true,
        has_status: false,
        reset_status_on_create: false,
        short_names: &[],
        selectable_fields: &[],
    },
    ResourceInfo {
        group: "netclaim.dev",
        version: "v1alpha1",
        plural: "podnetworks",
        singular: "podnetwork",
        kind: "PodNetwork",
        namespaced: false,
        has_status: true,
        reset_status_on_create: true,
        short_names: &["pn"],
        selectable_fields: &[],
    },
    ResourceInfo {
        group: "netclaim.dev",
        version: "v1alpha1",
        plural: "ipblocks",
        singular: "ipblock",
        kind: "IPBlock",
        namespaced: false,
        has_status: true,
        reset_status_on_create: true,
        short_names: &[],
        selectable_fields: &["spec.nodeName", "spec.podNetwork"],
    },
];

/// Finds the resource served at `group/version/plural`.
pub(crate) fn lookup(group: &str, version: &str, plural: &str) -> Option<&'static ResourceInfo> {
    RESOURCES.iter().find(|r| r.group == group && r.version == version && r.plural == plural)
}

/// The distinct `(group, version)` pairs served, core first, in table order.
pub(crate) fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}
