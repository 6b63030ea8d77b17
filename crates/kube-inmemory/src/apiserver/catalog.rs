//! The built-in kinds an install manifest carries besides those netclaim talks to: apps/v1
//! workloads, ConfigMaps, Secrets, Services, PodDisruptionBudgets, PriorityClasses, Jobs.
//! The server stores and serves them (get, list, watch, create, update, patch, apply,
//! delete, discovery) with no controller behind them: a Deployment makes no pods, a
//! Service gets no address. That is enough for `kubectl apply -k deploy/...` to store every
//! object of the install, and for the objects to be read back as a cluster would.

/// One kind: group, version, plural, kind, namespaced, status subresource (cleared on
/// create, as upstream does for controller-owned status), short names, categories.
pub(crate) struct StoredKind {
    pub(crate) group: &'static str,
    pub(crate) version: &'static str,
    pub(crate) plural: &'static str,
    pub(crate) kind: &'static str,
    pub(crate) namespaced: bool,
    pub(crate) status: bool,
    pub(crate) short_names: &'static [&'static str],
    pub(crate) categories: &'static [&'static str],
}

const fn kind(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    status: bool,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
) -> StoredKind {
    StoredKind {
        group,
        version: "v1",
        plural,
        kind,
        namespaced: true,
        status,
        short_names,
        categories,
    }
}

/// `kubectl get all` lists the kinds in the `all` category (as upstream's do).
const ALL: &[&str] = &["all"];

/// The kinds, in discovery order after the ones of `resources`.
pub(crate) const KINDS: &[StoredKind] = &[
    kind("", "configmaps", "ConfigMap", false, &["cm"], &[]),
    kind("", "secrets", "Secret", false, &[], &[]),
    kind("", "services", "Service", true, &["svc"], ALL),
    kind("apps", "deployments", "Deployment", true, &["deploy"], ALL),
    kind("apps", "daemonsets", "DaemonSet", true, &["ds"], ALL),
    kind("apps", "statefulsets", "StatefulSet", true, &["sts"], ALL),
    kind("apps", "replicasets", "ReplicaSet", true, &["rs"], ALL),
    kind("batch", "jobs", "Job", true, &[], ALL),
    kind("batch", "cronjobs", "CronJob", true, &["cj"], ALL),
    kind("policy", "poddisruptionbudgets", "PodDisruptionBudget", true, &["pdb"], &[]),
    StoredKind {
        namespaced: false,
        ..kind("scheduling.k8s.io", "priorityclasses", "PriorityClass", false, &["pc"], &[])
    },
];
