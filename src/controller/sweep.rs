//! The IPBlock sweep, through the [`ClusterApi`] port: reads every block and network, then
//! nodes and claims; lets [`Collector`] decide which blocks no node will release and deletes
//! them (with UID and resourceVersion preconditions, so a block re-created or changed
//! meanwhile is left alone); judges each network of this driver against its live blocks and
//! the addresses its claims report ([`super::conflicts`]) and writes `status.nodes` and the
//! `Conflict` condition when they change; refreshes the IPBlocks gauge.
//!
//! It runs every `--gc-interval` and, coalesced, soon after the reconciler sees a network or
//! block change ([`SweepTrigger`]), so a conflicting edit is reported within seconds. Time is
//! passed in: a simulation drives [`Sweeper::sweep`] with its own clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use tokio::sync::Notify;

use super::conflicts;
use super::gc::{BlockFacts, ClusterFacts, Collector};
use super::metrics::{ControllerMetrics, ReasonLabel};
use super::ports::{BlockDeleted, ClusterApi, ClusterApiError, StatusWritten};
use super::usage::{leased_addresses, node_usage, observed_status};
use crate::model::pod_network::{CONDITION_CONFLICT, IpBlock, PodNetwork, PodNetworkStatus};

/// After a trigger, the sweep waits this long for more before running, so a burst of block
/// creations costs one sweep.
const TRIGGER_COALESCE: Duration = Duration::from_secs(2);

/// A sweep failed (retried at the next one).
#[derive(Debug, thiserror::Error)]
#[error("IPBlock sweep: {0}")]
pub struct SweepError(#[from] ClusterApiError);

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Blocks deleted.
    pub deleted: usize,
    /// Networks whose status was written.
    pub statuses_written: usize,
    /// Networks with a `Conflict` now, by name, with what conflicts.
    pub conflicts: BTreeMap<String, Vec<conflicts::Conflict>>,
}

/// Asks the sweep to run soon (cloned into the reconciler).
#[derive(Debug, Clone, Default)]
pub struct SweepTrigger(Arc<Notify>);

impl SweepTrigger {
    /// A sweep runs within `TRIGGER_COALESCE` of this (one for any number of calls).
    pub fn trigger(&self) {
        self.0.notify_one();
    }
}

/// The sweep's state between passes.
#[derive(Debug)]
pub struct Sweeper {
    driver: String,
    grace: Duration,
    collector: Collector,
    metrics: Arc<ControllerMetrics>,
}

impl Sweeper {
    /// A sweeper for `driver`'s networks, collecting static reservations whose claim has
    /// been gone for `grace`.
    #[must_use]
    pub fn new(driver: &str, grace: Duration, metrics: Arc<ControllerMetrics>) -> Self {
        Self { driver: driver.to_owned(), grace, collector: Collector::default(), metrics }
    }

    /// One sweep. `now` is the collector's clock (only differences between sweeps count);
    /// `wall` stamps a condition's `lastTransitionTime`.
    ///
    /// # Errors
    ///
    /// A read failed: nothing was deleted or written after it.
    pub async fn sweep<A: ClusterApi + ?Sized>(
        &mut self,
        api: &A,
        now: Instant,
        wall: Timestamp,
    ) -> Result<SweepOutcome, SweepError> {
        let driver_name = self.driver.clone();
        let driver = driver_name.as_str();
        // Blocks first: a node listed afterwards existed when its blocks were read, so a
        // block of a node that registered meanwhile is never mistaken for one of a deleted
        // node.
        let all_blocks = api.list_ip_blocks().await?;
        let networks = api.list_pod_networks().await?;
        // Only blocks of this driver's networks: another driver's controller judges its own
        // by its own claims. A block whose network is gone (its finalizer forced away) has
        // no owner left to judge it, so it is ours too.
        let providers: BTreeMap<&str, &str> = networks
            .iter()
            .map(|network| {
                (
                    network.metadata.name.as_deref().unwrap_or_default(),
                    network.spec.provider.as_str(),
                )
            })
            .collect();
        let blocks: Vec<&IpBlock> = all_blocks
            .iter()
            .filter(|block| {
                providers
                    .get(block.spec.pod_network.as_str())
                    .is_none_or(|provider| *provider == driver)
            })
            .collect();
        self.count_blocks(&blocks);
        let facts: Vec<BlockFacts> = blocks.iter().map(|block| block_facts(block)).collect();
        let mut outcome = SweepOutcome::default();
        let mut leased = BTreeMap::new();
        if !facts.is_empty() {
            let nodes = api.node_names().await?;
            let claims = api.list_claims().await?;
            let mut cluster = ClusterFacts { nodes, ..ClusterFacts::default() };
            read_claims(&claims, driver, &mut cluster);
            leased = leased_addresses(&claims, driver);
            outcome.deleted = self.collect(api, &facts, &cluster, now).await;
        }
        for network in networks.iter().filter(|network| {
            network.spec.provider == driver && network.metadata.deletion_timestamp.is_none()
        }) {
            let name = network.name_any();
            let mine: Vec<&IpBlock> =
                blocks.iter().copied().filter(|block| block.spec.pod_network == name).collect();
            let held = leased.get(&name).map(Vec::as_slice).unwrap_or_default();
            let found = conflicts::find(network, &mine, held);
            let desired = observed_status(network, &found, node_usage(&mine, held), wall);
            if !found.is_empty() {
                outcome.conflicts.insert(name.clone(), found);
            }
            if write_if_changed(api, network, &desired).await {
                outcome.statuses_written += 1;
            }
        }
        Ok(outcome)
    }

    fn count_blocks(&self, blocks: &[&IpBlock]) {
        let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
        for block in blocks {
            *counts
                .entry((block.spec.pod_network.clone(), block.spec.node_name.clone()))
                .or_default() += 1;
        }
        self.metrics.set_ip_blocks(counts);
    }

    /// Deletes the blocks the collector chose; returns how many went.
    async fn collect<A: ClusterApi + ?Sized>(
        &mut self,
        api: &A,
        facts: &[BlockFacts],
        cluster: &ClusterFacts,
        now: Instant,
    ) -> usize {
        let planned = self.collector.plan(facts, cluster, now, self.grace);
        let mut deleted = 0;
        for (block, reason) in planned {
            match api.delete_ip_block(&block.name, &block.uid, &block.resource_version).await {
                Ok(BlockDeleted::Deleted) => {
                    deleted += 1;
                    self.metrics
                        .gc_deletions
                        .get_or_create(&ReasonLabel { reason: reason.as_str() })
                        .inc();
                    tracing::info!(
                        block = %block.name,
                        pod_network = %block.pod_network,
                        node = %block.node,
                        reason = reason.as_str(),
                        "IPBlock collected"
                    );
                }
                // Gone or changed since the list: the next sweep looks again.
                Ok(BlockDeleted::Gone | BlockDeleted::Changed) => {}
                Err(err) => tracing::warn!(block = %block.name, %err, "deleting an IPBlock failed"),
            }
        }
        deleted
    }
}

/// Writes `desired` when it differs from what `network` carries, on the resourceVersion read
/// (a status the reconciler wrote meanwhile is not overwritten: the next sweep reads it).
async fn write_if_changed<A: ClusterApi + ?Sized>(
    api: &A,
    network: &PodNetwork,
    desired: &PodNetworkStatus,
) -> bool {
    if network.status.as_ref().unwrap_or(&PodNetworkStatus::default()) == desired {
        return false;
    }
    let name = network.name_any();
    let version = network.resource_version().unwrap_or_default();
    let was_conflict = conflict_status(network.status.as_ref());
    match api.write_network_status(&name, &version, desired).await {
        Ok(StatusWritten::Written) => {
            let now_conflict = conflict_status(Some(desired));
            if now_conflict != was_conflict {
                if let Some((true, message)) = now_conflict {
                    tracing::warn!(network = %name, %message, "PodNetwork Conflict");
                } else {
                    tracing::info!(network = %name, "PodNetwork conflict resolved");
                }
            }
            true
        }
        Ok(StatusWritten::Changed | StatusWritten::Gone) => false,
        Err(err) => {
            tracing::warn!(network = %name, %err, "writing the PodNetwork status failed");
            false
        }
    }
}

fn conflict_status(status: Option<&PodNetworkStatus>) -> Option<(bool, String)> {
    status?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_CONFLICT)
        .map(|c| (c.status == "True", c.message.clone()))
}

fn block_facts(block: &IpBlock) -> BlockFacts {
    BlockFacts {
        name: block.name_any(),
        uid: block.metadata.uid.clone().unwrap_or_default(),
        resource_version: block.metadata.resource_version.clone().unwrap_or_default(),
        pod_network: block.spec.pod_network.clone(),
        node: block.spec.node_name.clone(),
        claim_uid: block.spec.claim.as_ref().map(|claim| claim.uid.clone()),
        deleting: block.metadata.deletion_timestamp.is_some(),
    }
}

/// Sweeps every `interval`, and soon after each trigger, until dropped.
pub(super) async fn run(
    api: impl ClusterApi,
    mut sweeper: Sweeper,
    interval: Duration,
    trigger: SweepTrigger,
) {
    loop {
        match sweeper.sweep(&api, Instant::now(), Timestamp::now()).await {
            Ok(outcome) if outcome.deleted > 0 || outcome.statuses_written > 0 => {
                tracing::debug!(?outcome, "IPBlock sweep");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(%err, "IPBlock sweep failed; trying again next period"),
        }
        tokio::select! {
            biased;
            () = trigger.0.notified() => tokio::time::sleep(TRIGGER_COALESCE).await,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Fills the claim UIDs and the pools (nodes) where this driver has allocated claims.
fn read_claims(
    claims: &[k8s_openapi::api::resource::v1::ResourceClaim],
    driver: &str,
    cluster: &mut ClusterFacts,
) {
    for claim in claims {
        if let Some(uid) = &claim.metadata.uid {
            cluster.claims.insert(uid.clone());
        }
        let results = claim
            .status
            .as_ref()
            .and_then(|status| status.allocation.as_ref())
            .and_then(|allocation| allocation.devices.as_ref())
            .and_then(|devices| devices.results.as_deref())
            .unwrap_or_default();
        for result in results.iter().filter(|result| result.driver == driver) {
            cluster.allocated_pools.insert(result.pool.clone());
        }
    }
}
