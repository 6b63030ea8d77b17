//! A watch of every Namespace, kept as a cache of their labels (DESIGN §4): the node judges a
//! `PodNetwork`'s `spec.namespaceSelector` at prepare from it, without an API call per claim
//! ([`crate::claims::ports::NamespaceSource`]).
//!
//! Before the first list completes a lookup waits for it up to a patience (a daemon that just
//! started), then fails as not synced; the claim is refused (the check fails closed) and
//! kubelet retries. Readiness is a `tokio::sync::watch` channel rather than the reflector's
//! own `wait_until_ready`, which wakes only the last of several waiters
//! ([`crate::controller::cache`] has the details).

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Namespace;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::claims::ports::{NamespaceReadError, NamespaceSource};

/// The Namespaces as the node's watch last saw them (labels only are kept).
#[derive(Clone)]
pub struct WatchedNamespaces {
    store: Store<Namespace>,
    ready: watch::Receiver<bool>,
    patience: Duration,
}

impl std::fmt::Debug for WatchedNamespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedNamespaces")
            .field("ready", &*self.ready.borrow())
            .field("patience", &self.patience)
            .finish_non_exhaustive()
    }
}

/// Starts the watch on the current runtime (list+watch of `namespaces`); it runs until `stop`
/// is cancelled. Lookups wait at most `patience` for the first list.
#[must_use]
pub fn spawn_watch(
    watch_client: Client,
    stop: CancellationToken,
    patience: Duration,
) -> WatchedNamespaces {
    let mut writer = reflector::store::Writer::<Namespace>::default();
    let store = writer.as_reader();
    let (ready_tx, ready_rx) = watch::channel(false);
    let api: Api<Namespace> = Api::all(watch_client);
    tokio::spawn(async move {
        // Only the labels are read: the rest is dropped before it is cached.
        let events = watcher(api, watcher::Config::default()).default_backoff().modify(
            |namespace: &mut Namespace| {
                namespace.metadata.managed_fields = None;
                namespace.metadata.annotations = None;
                namespace.spec = None;
                namespace.status = None;
            },
        );
        let mut events = std::pin::pin!(events);
        loop {
            let event = tokio::select! {
                () = stop.cancelled() => return,
                event = events.next() => event,
            };
            match event {
                None => return,
                Some(Ok(event)) => {
                    writer.apply_watcher_event(&event);
                    if matches!(event, watcher::Event::InitDone) {
                        ready_tx.send_replace(true);
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "Namespace watch failed; retrying");
                }
            }
        }
    });
    WatchedNamespaces { store, ready: ready_rx, patience }
}

impl WatchedNamespaces {
    async fn lookup(&self, name: String) -> Result<BTreeMap<String, String>, NamespaceReadError> {
        let mut ready = self.ready.clone();
        match tokio::time::timeout(self.patience, ready.wait_for(|ready| *ready)).await {
            Ok(Ok(_)) => {}
            // The watch ended (daemon stopping) or is still listing.
            Ok(Err(_)) | Err(_) => return Err(NamespaceReadError::NotSynced),
        }
        let namespace =
            self.store.get(&ObjectRef::new(&name)).ok_or(NamespaceReadError::NotFound)?;
        Ok(namespace.metadata.labels.clone().unwrap_or_default())
    }
}

impl NamespaceSource for WatchedNamespaces {
    fn labels(
        &self,
        name: &str,
    ) -> BoxFuture<'_, Result<BTreeMap<String, String>, NamespaceReadError>> {
        Box::pin(self.lookup(name.to_owned()))
    }
}
