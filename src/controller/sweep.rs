//! The periodic IPBlock sweep (API calls): reads this driver's blocks, then nodes and
//! claims, lets [`super::gc::Collector`] decide, deletes what it chose (with UID and resourceVersion
//! preconditions, so a block re-created or changed meanwhile is left alone), and refreshes
//! the IPBlocks gauge.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{DeleteParams, ListParams, Preconditions};
use kube::{Api, ResourceExt as _};

use super::gc::{BlockFacts, ClusterFacts, Collector};
use super::metrics::{ControllerMetrics, ReasonLabel};
use crate::model::pod_network::{IpBlock, PodNetwork};

/// Page size of the cluster-wide claim list.
const CLAIM_PAGE: u32 = 500;

/// A sweep failed (retried at the next one).
#[derive(Debug, thiserror::Error)]
#[error("IPBlock sweep: {action}: {source}")]
pub(super) struct SweepError {
    /// `listing IPBlocks`, ...
    action: &'static str,
    /// The cause.
    #[source]
    source: kube::Error,
}

fn sweep_error(action: &'static str) -> impl FnOnce(kube::Error) -> SweepError {
    move |source| SweepError { action, source }
}

/// Sweeps every `interval` until dropped.
pub(super) async fn run(
    client: kube::Client,
    driver: String,
    grace: Duration,
    interval: Duration,
    metrics: Arc<ControllerMetrics>,
) {
    let mut collector = Collector::default();
    loop {
        if let Err(err) = sweep(&client, &driver, grace, &mut collector, &metrics).await {
            tracing::warn!(%err, "IPBlock sweep failed; trying again next period");
        }
        tokio::time::sleep(interval).await;
    }
}

/// One sweep; returns how many blocks it deleted.
pub(super) async fn sweep(
    client: &kube::Client,
    driver: &str,
    grace: Duration,
    collector: &mut Collector,
    metrics: &ControllerMetrics,
) -> Result<usize, SweepError> {
    // Blocks first: a node listed afterwards existed when its blocks were read, so a block
    // of a node that registered meanwhile is never mistaken for one of a deleted node.
    let blocks_api: Api<IpBlock> = Api::all(client.clone());
    let all_blocks = blocks_api
        .list(&ListParams::default())
        .await
        .map_err(sweep_error("listing IPBlocks"))?
        .items;
    // Only blocks of this driver's networks: another driver's controller judges its own by
    // its own claims. A block whose network is gone (its finalizer forced away) has no
    // owner left to judge it, so it is ours too.
    let providers: BTreeMap<String, String> = Api::<PodNetwork>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(sweep_error("listing PodNetworks"))?
        .items
        .into_iter()
        .map(|network| (network.name_any(), network.spec.provider))
        .collect();
    let blocks: Vec<IpBlock> = all_blocks
        .into_iter()
        .filter(|block| {
            providers.get(&block.spec.pod_network).is_none_or(|provider| provider == driver)
        })
        .collect();
    let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
    for block in &blocks {
        *counts
            .entry((block.spec.pod_network.clone(), block.spec.node_name.clone()))
            .or_default() += 1;
    }
    metrics.set_ip_blocks(counts);
    let facts: Vec<BlockFacts> = blocks
        .iter()
        .map(|block| BlockFacts {
            name: block.name_any(),
            uid: block.metadata.uid.clone().unwrap_or_default(),
            resource_version: block.metadata.resource_version.clone().unwrap_or_default(),
            pod_network: block.spec.pod_network.clone(),
            node: block.spec.node_name.clone(),
            claim_uid: block.spec.claim.as_ref().map(|claim| claim.uid.clone()),
            deleting: block.metadata.deletion_timestamp.is_some(),
        })
        .collect();
    if facts.is_empty() {
        return Ok(0);
    }
    let nodes: BTreeSet<String> = Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(sweep_error("listing Nodes"))?
        .items
        .into_iter()
        .map(|node| node.name_any())
        .collect();
    let needs_claims =
        facts.iter().any(|block| block.claim_uid.is_some() || !nodes.contains(&block.node));
    let mut cluster = ClusterFacts { nodes, ..ClusterFacts::default() };
    if needs_claims {
        read_claims(client, driver, &mut cluster).await?;
    }
    let planned = collector.plan(&facts, &cluster, Instant::now(), grace);
    let mut deleted = 0;
    for (block, reason) in planned {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(block.uid.clone()),
                resource_version: Some(block.resource_version.clone()),
            }),
            ..DeleteParams::default()
        };
        match blocks_api.delete(&block.name, &params).await {
            Ok(_) => {
                deleted += 1;
                metrics.gc_deletions.get_or_create(&ReasonLabel { reason: reason.as_str() }).inc();
                tracing::info!(
                    block = %block.name,
                    pod_network = %block.pod_network,
                    node = %block.node,
                    reason = reason.as_str(),
                    "IPBlock collected"
                );
            }
            // Gone or changed since the list: the next sweep looks again.
            Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {}
            Err(err) => tracing::warn!(block = %block.name, %err, "deleting an IPBlock failed"),
        }
    }
    Ok(deleted)
}

/// Fills the claim UIDs and the pools (nodes) where this driver has allocated claims.
async fn read_claims(
    client: &kube::Client,
    driver: &str,
    cluster: &mut ClusterFacts,
) -> Result<(), SweepError> {
    let api: Api<ResourceClaim> = Api::all(client.clone());
    let mut params = ListParams::default().limit(CLAIM_PAGE);
    loop {
        let page = api.list(&params).await.map_err(sweep_error("listing ResourceClaims"))?;
        for claim in &page.items {
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
        match page.metadata.continue_.filter(|token| !token.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}
