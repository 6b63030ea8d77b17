//! The watch of this node's `IPBlock`s (decision 0017), wired: kube-runtime's watcher on the
//! daemon's watch client feeds the claim service, and each block found lost becomes
//! `netclaim_ipblocks_lost_total{pod_network}` and a Warning Event regarding its `PodNetwork`
//! (reason `IPBlockLost`), which the controller turns into the network's `Conflict` condition.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::watch;

use super::NodeClaims;
use crate::claims::networks::{BlockLoss, BlockLossSink, IpBlockApi, REASON_BLOCK_LOST};
use crate::k8s::ip_blocks::KubeIpBlocks;
use crate::metrics::{Metrics, PodNetworkLabel};
use crate::model::pod_network::API_VERSION;

/// Counts and reports lost blocks.
struct LossReporter {
    metrics: Arc<Metrics>,
    recorder: Recorder,
}

impl BlockLossSink for LossReporter {
    fn block_lost(&self, loss: &BlockLoss) {
        self.metrics
            .ipblocks_lost
            .get_or_create(&PodNetworkLabel { pod_network: loss.pod_network.clone() })
            .inc();
        let recorder = self.recorder.clone();
        let regarding = ObjectReference {
            api_version: Some(API_VERSION.to_owned()),
            kind: Some("PodNetwork".to_owned()),
            name: Some(loss.pod_network.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: REASON_BLOCK_LOST.to_owned(),
            note: Some(loss.to_string()),
            action: "Allocate".to_owned(),
            secondary: None,
        };
        // An Event is a report, never on the claim path: sent off the watch's loop.
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&event, &regarding).await {
                tracing::warn!(%err, "could not record an IPBlockLost Event on the PodNetwork");
            }
        });
    }
}

/// Starts the watch of this node's blocks; it ends when `stop` turns true.
pub(super) fn start(
    claims: &Arc<NodeClaims>,
    watch_client: Client,
    client: Client,
    identity: (&str, &str),
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
) {
    let (driver, node) = identity;
    let reporter = LossReporter {
        metrics: Arc::clone(metrics),
        recorder: Recorder::new(
            client,
            Reporter { controller: driver.to_owned(), instance: Some(node.to_owned()) },
        ),
    };
    let blocks = KubeIpBlocks::new(watch_client);
    let (claims, stop, node) = (Arc::clone(claims), stop.clone(), node.to_owned());
    tokio::spawn(async move {
        let events = blocks.watch_node(&node);
        claims.watch_blocks(events, &reporter, stop).await;
    });
}
