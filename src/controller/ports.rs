//! The controller's port: the cluster objects its IPBlock sweep reads and the writes it makes
//! ([`ClusterApi`]). The production adapter is `k8s::controller_cluster::KubeCluster`; a
//! simulation implements it in memory and drives [`super::sweep::Sweeper::sweep`] step by step.

use std::collections::BTreeSet;

use futures::future::BoxFuture;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::model::cause::Cause;
use crate::model::pod_network::{IpBlock, PodNetwork, PodNetworkStatus};

/// A call through [`ClusterApi`] failed (the sweep gives up this pass and tries the next).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{action}: {source}")]
pub struct ClusterApiError {
    /// What was being done: `listing IPBlocks`, ...
    pub action: &'static str,
    /// The adapter's error.
    #[source]
    pub source: Cause,
}

/// What a conditional delete of an IPBlock did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockDeleted {
    /// Deleted now.
    Deleted,
    /// There was no object of that name.
    Gone,
    /// The object's UID or resourceVersion differs from the precondition (re-created or
    /// changed since it was read): left alone.
    Changed,
}

/// What a conditional status write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusWritten {
    /// Written.
    Written,
    /// The object changed since it was read (resourceVersion precondition failed): nothing
    /// was written; the next pass reads it again.
    Changed,
    /// The object is gone.
    Gone,
}

/// The cluster as the sweep sees it: every call is one API request (or one paged list) and
/// nothing is cached, so a sweep judges what the API server holds now. Lists are in the
/// server's order; the sweep does not depend on it.
pub trait ClusterApi: Send + Sync + 'static {
    /// Every `IPBlock`, of every network and provider.
    fn list_ip_blocks(&self) -> BoxFuture<'_, Result<Vec<IpBlock>, ClusterApiError>>;
    /// Every `PodNetwork`, of every provider (with status and resourceVersion).
    fn list_pod_networks(&self) -> BoxFuture<'_, Result<Vec<PodNetwork>, ClusterApiError>>;
    /// Names of the Nodes that exist.
    fn node_names(&self) -> BoxFuture<'_, Result<BTreeSet<String>, ClusterApiError>>;
    /// Every ResourceClaim (all namespaces, every page).
    fn list_claims(&self) -> BoxFuture<'_, Result<Vec<ResourceClaim>, ClusterApiError>>;
    /// Deletes the IPBlock `name` only if its UID is `uid` and its resourceVersion is
    /// `resource_version` (a block re-created or changed since it was read is left alone).
    fn delete_ip_block<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
        resource_version: &'a str,
    ) -> BoxFuture<'a, Result<BlockDeleted, ClusterApiError>>;
    /// Replaces the status of the PodNetwork `name` with `status` only if its resourceVersion
    /// is still `resource_version` (the reconciler writes the same object's status: neither
    /// may overwrite a condition the other wrote after its read).
    fn write_network_status<'a>(
        &'a self,
        name: &'a str,
        resource_version: &'a str,
        status: &'a PodNetworkStatus,
    ) -> BoxFuture<'a, Result<StatusWritten, ClusterApiError>>;
}
