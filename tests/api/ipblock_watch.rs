//! The watch of a node's own `IPBlock`s against the in-process API server (decision 0017):
//! the real adapter (kube-runtime's watcher with the `spec.nodeName` field selector) feeds the
//! claim service; a block deleted in the API is lost on the node as soon as the event
//! arrives, reported once, its pod keeps its address, and no new address comes from it.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Api;
use kube::api::DeleteParams;
use netclaim::claims::networks::{BlockLoss, BlockLossSink, IpBlockApi, LossCause};
use netclaim::k8s::ip_blocks::KubeIpBlocks;
use netclaim::model::pod_network::IpBlock;
use serde_json::json;

use crate::kit::ipam::{Cluster, prepare_all};

#[derive(Default)]
struct Recorded(Mutex<Vec<BlockLoss>>);

impl BlockLossSink for Recorded {
    fn block_lost(&self, loss: &BlockLoss) {
        self.0.lock().unwrap().push(loss.clone());
    }
}

/// Waits (bounded) until `done` holds; the bound only keeps a broken build from hanging.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    for _ in 0..1000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{what} never happened");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_block_deleted_in_the_api_is_lost_on_its_node_through_the_watch() {
    let cluster = Cluster::start(json!({
        "parents": ["eth2"],
        "ipam": {"subnets": ["10.64.0.0/24"], "gateways": ["10.64.0.1"],
                 "blockSize": {"ipv4": 28}}
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let node = cluster.node("node-a", dir.path());
    let first = prepare_all(&node, &["pod-0".to_owned()]).await;
    let address = first[0].1[0].ip();
    let block = node.service.owned_blocks().pop().unwrap();
    assert!(block.cidr.contains(address));

    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let sink = Arc::new(Recorded::default());
    let (service, recorded) = (Arc::clone(&node.service), Arc::clone(&sink));
    let blocks = KubeIpBlocks::new(cluster.client.clone());
    let watching = tokio::spawn(async move {
        service.watch_blocks(blocks.watch_node("node-a"), &*recorded, stop).await;
    });
    eventually("the watch's first list", || node.service.block_watch_synced()).await;

    let api: Api<IpBlock> = Api::all(cluster.client.clone());
    api.delete(&block.name, &DeleteParams::default()).await.unwrap();
    eventually("the loss", || !sink.0.lock().unwrap().is_empty()).await;
    let losses = sink.0.lock().unwrap().clone();
    assert_eq!(losses.len(), 1, "{losses:?}");
    assert_eq!(
        (&losses[0].name, &losses[0].cause, losses[0].leases),
        (&block.name, &LossCause::Deleted, 1)
    );

    // The pod keeps its address; the next one comes from another block, claimed anew.
    let next = prepare_all(&node, &["pod-1".to_owned()]).await;
    assert!(!block.cidr.contains(next[0].1[0].ip()), "{next:?} from the lost block");
    assert_eq!(
        node.service.prepared("uid-node-a--pod-0").unwrap().devices[0].addresses[0].ip(),
        address
    );

    stop_tx.send(true).unwrap();
    watching.await.unwrap();
    cluster.stop().await;
}
