//! A watch of every `PodNetwork`, published as an immutable snapshot that the node's
//! publisher (which devices carry which network) and claim service (what a claim inherits)
//! read without an API call.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt as _;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::model::pod_network::PodNetwork;

/// Every `PodNetwork` as last seen, by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodNetworkSnapshot {
    /// Whether the initial list has completed: before it, a missing network may exist.
    pub synced: bool,
    /// The networks by name.
    pub networks: BTreeMap<String, PodNetwork>,
}

/// Receives every new snapshot.
pub type PodNetworkReceiver = watch::Receiver<Arc<PodNetworkSnapshot>>;

/// Starts the watch on the current runtime; it runs until `stop` is cancelled. The first
/// snapshot is empty and not `synced`.
#[must_use]
pub fn spawn_watch(watch_client: Client, stop: CancellationToken) -> PodNetworkReceiver {
    let (sender, receiver) = watch::channel(Arc::new(PodNetworkSnapshot::default()));
    let api: Api<PodNetwork> = Api::all(watch_client);
    tokio::spawn(async move {
        let events = watcher(api, watcher::Config::default()).default_backoff();
        let mut events = std::pin::pin!(events);
        let mut current = PodNetworkSnapshot::default();
        // Objects of a relist in progress: they replace `current` whole at `InitDone`, so a
        // network deleted while the watch was down goes away.
        let mut relisting: Option<BTreeMap<String, PodNetwork>> = None;
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => event,
            };
            let Some(event) = event else { return };
            let changed = match event {
                Ok(watcher::Event::Init) => {
                    relisting = Some(BTreeMap::new());
                    false
                }
                Ok(watcher::Event::InitApply(network)) => {
                    if let (Some(list), Some(name)) =
                        (relisting.as_mut(), network.metadata.name.clone())
                    {
                        list.insert(name, network);
                    }
                    false
                }
                Ok(watcher::Event::InitDone) => {
                    current.networks = relisting.take().unwrap_or_default();
                    current.synced = true;
                    true
                }
                Ok(watcher::Event::Apply(network)) => match network.metadata.name.clone() {
                    Some(name) => {
                        current.networks.insert(name, network);
                        true
                    }
                    None => false,
                },
                Ok(watcher::Event::Delete(network)) => network
                    .metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| current.networks.remove(name).is_some()),
                Err(err) => {
                    tracing::warn!(error = %err, "PodNetwork watch failed; retrying");
                    false
                }
            };
            if changed {
                sender.send_replace(Arc::new(current.clone()));
            }
        }
    });
    receiver
}
