//! The node's `IPBlock` calls and its view of the `PodNetwork`s, as the claim service's
//! ports ([`crate::claims::networks`]): list this node's blocks or one network's (field
//! selectors on `spec.nodeName` / `spec.podNetwork`, the CRD's `selectableFields`), create a
//! block by its derived name (409 AlreadyExists answers with the existing object, so the
//! caller sees who won), delete with a UID precondition (never another node's object of the
//! same name); watch this node's blocks (the same field selector) as
//! [`BlockEvent`]s, a relist gathered into one [`BlockEvent::Relisted`].

use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};

use super::pod_networks::PodNetworkReceiver;
use crate::claims::networks::{
    BlockApiError, BlockEvent, Created, Deleted, IpBlockApi, NetworkReadError, PodNetworkSource,
};
use crate::model::cause::cause;
use crate::model::pod_network::{IpBlock, PodNetwork};

/// Creates tried at most when the object a create collided with is gone by the time it is
/// read (deleted in between): the name is free again.
const CREATE_ATTEMPTS: usize = 3;

/// `IPBlock` calls on a unary client (with the daemon's read timeout).
#[derive(Clone)]
pub struct KubeIpBlocks {
    api: Api<IpBlock>,
    /// For the watch: a client without the unary read timeout (a watch is idle for long).
    watch_api: Api<IpBlock>,
}

impl KubeIpBlocks {
    /// Blocks through `client` (also for the watch, unless [`Self::with_watch_client`]).
    #[must_use]
    pub fn new(client: Client) -> Self {
        Self { api: Api::all(client.clone()), watch_api: Api::all(client) }
    }

    /// Watches through `client` (the daemon's watch client, without a read timeout).
    #[must_use]
    pub fn with_watch_client(mut self, client: Client) -> Self {
        self.watch_api = Api::all(client);
        self
    }

    async fn list(&self, selector: String) -> Result<Vec<IpBlock>, BlockApiError> {
        let params = ListParams::default().fields(&selector);
        self.api.list(&params).await.map(|list| list.items).map_err(|err| BlockApiError {
            op: "list",
            name: selector,
            source: cause(err),
        })
    }

    async fn create_block(&self, block: IpBlock) -> Result<Created, BlockApiError> {
        let name = block.metadata.name.clone().unwrap_or_default();
        let error = |op, err| BlockApiError { op, name: name.clone(), source: cause(err) };
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.api.create(&PostParams::default(), &block).await {
                Ok(created) => return Ok(Created::Created(created)),
                Err(kube::Error::Api(status)) if status.is_already_exists() => {}
                Err(err) => return Err(error("create", err)),
            }
            match self.api.get_opt(&name).await {
                Ok(Some(existing)) => return Ok(Created::Exists(existing)),
                // Deleted since the create collided: the name is free again.
                Ok(None) if attempts < CREATE_ATTEMPTS => {}
                Ok(None) => {
                    return Err(BlockApiError {
                        op: "create",
                        name: name.clone(),
                        source: cause(std::io::Error::other(
                            "the name collided and the object was gone when read, three times",
                        )),
                    });
                }
                Err(err) => return Err(error("get", err)),
            }
        }
    }

    async fn delete_block(&self, name: &str, uid: &str) -> Result<Deleted, BlockApiError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.api.delete(name, &params).await {
            Ok(_) => Ok(Deleted::Deleted),
            Err(kube::Error::Api(status)) if status.is_not_found() => Ok(Deleted::Gone),
            // A failed precondition: an object of that name with another UID.
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(Deleted::NotOurs),
            Err(err) => {
                Err(BlockApiError { op: "delete", name: name.to_owned(), source: cause(err) })
            }
        }
    }
}

/// This node's blocks as [`BlockEvent`]s: kube-runtime's watcher (a list, then a watch from
/// its resourceVersion, relisting with backoff when the watch fails or its place expired),
/// whose `Init`/`InitApply`/`InitDone` are gathered into one `Relisted`.
fn watch_events(
    api: Api<IpBlock>,
    node: &str,
) -> BoxStream<'static, Result<BlockEvent, BlockApiError>> {
    let selector = format!("spec.nodeName={node}");
    let config = watcher::Config::default().fields(&selector);
    let events = watcher(api, config).default_backoff();
    let mut relisting: Option<Vec<IpBlock>> = None;
    events
        .filter_map(move |event| {
            let out = match event {
                Ok(watcher::Event::Init) => {
                    relisting = Some(Vec::new());
                    None
                }
                Ok(watcher::Event::InitApply(block)) => {
                    relisting.get_or_insert_with(Vec::new).push(block);
                    None
                }
                Ok(watcher::Event::InitDone) => {
                    Some(Ok(BlockEvent::Relisted(relisting.take().unwrap_or_default())))
                }
                Ok(watcher::Event::Apply(block)) => Some(Ok(BlockEvent::Applied(block))),
                Ok(watcher::Event::Delete(block)) => Some(Ok(BlockEvent::Deleted(block))),
                Err(err) => Some(Err(BlockApiError {
                    op: "watch",
                    name: selector.clone(),
                    source: cause(err),
                })),
            };
            std::future::ready(out)
        })
        .boxed()
}

impl IpBlockApi for KubeIpBlocks {
    fn list_node(&self, node: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        let selector = format!("spec.nodeName={node}");
        Box::pin(self.list(selector))
    }

    fn list_network(
        &self,
        pod_network: &str,
    ) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>> {
        let selector = format!("spec.podNetwork={pod_network}");
        Box::pin(self.list(selector))
    }

    fn create(&self, block: IpBlock) -> BoxFuture<'_, Result<Created, BlockApiError>> {
        Box::pin(self.create_block(block))
    }

    fn delete<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Deleted, BlockApiError>> {
        Box::pin(self.delete_block(name, uid))
    }

    fn watch_node(&self, node: &str) -> BoxStream<'_, Result<BlockEvent, BlockApiError>> {
        watch_events(self.watch_api.clone(), node)
    }
}

/// The `PodNetwork`s from the daemon's watch ([`super::pod_networks`]): no API call per
/// prepare. Before the watch's first list completes, a lookup waits for it up to `patience`
/// (a daemon that just started), then fails as not synced (kubelet retries the prepare).
#[derive(Debug)]
pub struct WatchedPodNetworks {
    receiver: PodNetworkReceiver,
    patience: Duration,
    /// The receiver `changed` waits on (its own, so lookups do not consume changes; behind a
    /// lock because waiting marks what it saw).
    changes: tokio::sync::Mutex<PodNetworkReceiver>,
}

impl WatchedPodNetworks {
    /// Lookups on `receiver`, waiting at most `patience` for the first list.
    #[must_use]
    pub fn new(receiver: PodNetworkReceiver, patience: Duration) -> Self {
        let changes = tokio::sync::Mutex::new(receiver.clone());
        Self { receiver, patience, changes }
    }

    async fn lookup(&self, name: String) -> Result<Option<PodNetwork>, NetworkReadError> {
        let mut receiver = self.receiver.clone();
        let synced = tokio::time::timeout(self.patience, receiver.wait_for(|s| s.synced)).await;
        match synced {
            Ok(Ok(snapshot)) => Ok(snapshot.networks.get(&name).cloned()),
            // The watch ended (daemon stopping) or is still listing.
            Ok(Err(_)) | Err(_) => Err(NetworkReadError::NotSynced),
        }
    }
}

impl PodNetworkSource for WatchedPodNetworks {
    fn get(&self, name: &str) -> BoxFuture<'_, Result<Option<PodNetwork>, NetworkReadError>> {
        Box::pin(self.lookup(name.to_owned()))
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let mut changes = self.changes.lock().await;
            if changes.changed().await.is_err() {
                // The watch is gone: never wake again.
                std::future::pending::<()>().await;
            }
        })
    }
}
