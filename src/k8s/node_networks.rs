//! The inputs of this node's PodNetwork devices ([`NetworkInputs`]): the PodNetwork snapshot
//! of [`super::pod_networks`] and this node's labels from a watch of its Node object, combined
//! into one watch that the publisher and the device lookup read.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::pod_networks::PodNetworkReceiver;
use crate::inventory::networks::NetworkInputs;
use crate::model::pod_network::PodNetwork;

/// Starts the Node watch and the combination on the current runtime; both run until `stop`
/// is cancelled. `unary` makes one list of PodNetworks at start: a server without the
/// PodNetwork CRD (404) has no networks, which counts as known at once instead of after
/// the publisher's patience.
#[must_use]
pub fn spawn(
    watch_client: Client,
    unary: Client,
    node: &str,
    pod_networks: PodNetworkReceiver,
    stop: CancellationToken,
) -> watch::Receiver<NetworkInputs> {
    let (sender, receiver) = watch::channel(NetworkInputs::default());
    let labels = spawn_label_watch(watch_client, node, stop.clone());
    tokio::spawn(combine(unary, pod_networks, labels, sender, stop));
    receiver
}

/// This node's labels: `None` until the first list completed; a missing Node has none.
fn spawn_label_watch(
    client: Client,
    node: &str,
    stop: CancellationToken,
) -> watch::Receiver<Option<Arc<BTreeMap<String, String>>>> {
    let (sender, receiver) = watch::channel(None);
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={node}"));
    tokio::spawn(async move {
        let events = watcher(nodes, config).default_backoff();
        let mut events = std::pin::pin!(events);
        // The Node of a relist in progress (a relist replaces what was seen).
        let mut relisting: Option<BTreeMap<String, String>> = None;
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => event,
            };
            let Some(event) = event else { return };
            let labels = match event {
                Ok(watcher::Event::Init) => {
                    relisting = Some(BTreeMap::new());
                    continue;
                }
                Ok(watcher::Event::InitApply(node)) => {
                    relisting = Some(node.metadata.labels.unwrap_or_default());
                    continue;
                }
                Ok(watcher::Event::InitDone) => relisting.take().unwrap_or_default(),
                Ok(watcher::Event::Apply(node)) => node.metadata.labels.unwrap_or_default(),
                Ok(watcher::Event::Delete(_)) => BTreeMap::new(),
                Err(err) => {
                    tracing::warn!(error = %err, "watch of this node's Node failed; retrying");
                    continue;
                }
            };
            sender.send_if_modified(|current| {
                let changed = current.as_deref() != Some(&labels);
                if changed {
                    *current = Some(Arc::new(labels));
                }
                changed
            });
        }
    });
    receiver
}

async fn combine(
    unary: Client,
    mut pod_networks: PodNetworkReceiver,
    mut labels: watch::Receiver<Option<Arc<BTreeMap<String, String>>>>,
    sender: watch::Sender<NetworkInputs>,
    stop: CancellationToken,
) {
    let crd_missing = crd_missing(unary).await;
    if crd_missing {
        tracing::info!(
            "the PodNetwork kind is not served (its CRD is not installed): no PodNetwork devices until it is"
        );
    }
    loop {
        let inputs = {
            let snapshot = pod_networks.borrow_and_update();
            NetworkInputs {
                pod_networks: if snapshot.synced {
                    Some(Arc::new(snapshot.networks.clone()))
                } else if crd_missing {
                    Some(Arc::new(BTreeMap::new()))
                } else {
                    None
                },
                node_labels: labels.borrow_and_update().clone(),
            }
        };
        sender.send_if_modified(|current| {
            let changed = *current != inputs;
            if changed {
                *current = inputs;
            }
            changed
        });
        tokio::select! {
            () = stop.cancelled() => return,
            Ok(()) = pod_networks.changed() => {}
            Ok(()) = labels.changed() => {}
            else => return,
        }
    }
}

/// Whether the API server answers 404 for PodNetworks (the CRD is not installed). Any other
/// failure is not an answer: the watch decides once it lists.
async fn crd_missing(unary: Client) -> bool {
    let api: Api<PodNetwork> = Api::all(unary);
    matches!(
        api.list_metadata(&ListParams::default().limit(1)).await,
        Err(kube::Error::Api(status)) if status.code == 404
    )
}
