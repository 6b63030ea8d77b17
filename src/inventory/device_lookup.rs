//! [`DeviceSource`] over the node's interfaces as an [`InterfaceSource`] discovers them: one
//! recent discovery shared by the lookups of one kubelet request, checked against the
//! operator's selection and the node's PodNetworks. A claim's devices resolve from one
//! snapshot in one call ([`DeviceSource::resolve`]). The host's source is `host::discovery`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::claims::{DeviceSource, LookupError, ResolvedDevice};
use crate::inventory::Selection;
use crate::inventory::facts::{self, BuiltInventories, LookupContext};
use crate::inventory::networks::{NetworkInputs, NodeNetworks};
use crate::inventory::publish::InterfaceSource;
use crate::model::cause::cause;
use crate::model::device::{AttributeValue, HostInterface};
use crate::model::network_config::DeviceFacts;

/// How long one discovery answers device lookups: a kubelet request with many claims (or a
/// burst of pods) shares one netlink dump and sysfs walk instead of repeating it per claim,
/// while a device renamed or removed since publication is still noticed within this window.
const DISCOVERY_REUSE: Duration = Duration::from_millis(500);

/// Looks allocated devices up in a recent discovery of the node's interfaces, so a device
/// renamed or removed since publication is noticed at prepare time.
#[derive(Debug, Clone)]
pub struct DiscoveredDevices<I> {
    source: I,
    selection: Selection,
    /// The driver name (a PodNetwork of another provider is not ours) and the inputs of
    /// the node's PodNetworks; `None`: no PodNetworks.
    networks: Option<(String, watch::Receiver<NetworkInputs>)>,
    /// Every PodNetwork name seen so far, so a network's devices resolve after it was
    /// deleted (its hashed device names cannot be parsed back).
    seen_networks: Arc<Mutex<BTreeSet<String>>>,
    recent: Arc<RecentSnapshot<Vec<HostInterface>>>,
    /// The inventories built for the last context, while its interfaces (the same snapshot),
    /// networks and seen names are unchanged.
    built: Arc<Mutex<Option<BuiltFor>>>,
}

/// The inputs [`BuiltInventories`] were built from.
#[derive(Debug)]
struct BuiltFor {
    interfaces: Arc<Vec<HostInterface>>,
    networks: NodeNetworks,
    seen: BTreeSet<String>,
    built: Arc<BuiltInventories>,
}

impl<I: InterfaceSource> DiscoveredDevices<I> {
    /// Lookup over the interfaces `source` discovers.
    #[must_use]
    pub fn with_source(source: I, selection: Selection) -> Self {
        Self {
            source,
            selection,
            networks: None,
            seen_networks: Arc::new(Mutex::new(BTreeSet::new())),
            recent: Arc::new(RecentSnapshot::new(DISCOVERY_REUSE)),
            built: Arc::new(Mutex::new(None)),
        }
    }

    /// Resolves PodNetwork devices too: `driver`'s networks as `inputs` has them.
    #[must_use]
    pub fn with_networks(mut self, driver: &str, inputs: watch::Receiver<NetworkInputs>) -> Self {
        self.networks = Some((driver.to_owned(), inputs));
        self
    }

    async fn interfaces(&self) -> Result<Arc<Vec<HostInterface>>, LookupError> {
        self.recent
            .get_or_refresh(|| async {
                self.source.discover().await.map_err(|e| LookupError::Failed(cause(e)))
            })
            .await
    }

    /// The node's networks now, remembering their names.
    fn node_networks(&self) -> (NodeNetworks, BTreeSet<String>) {
        let networks =
            self.networks.as_ref().map_or_else(NodeNetworks::default, |(driver, inputs)| {
                NodeNetworks::evaluate(driver, &inputs.borrow())
            });
        let mut seen = self.seen_networks.lock().unwrap_or_else(PoisonError::into_inner);
        seen.extend(networks.all().iter().map(|n| n.name.clone()));
        (networks, seen.clone())
    }

    /// Runs `lookup` against the current interfaces, selection and networks.
    async fn with_context<T>(
        &self,
        lookup: impl FnOnce(&LookupContext<'_>) -> T,
    ) -> Result<T, LookupError> {
        let interfaces = self.interfaces().await?;
        let (networks, seen) = self.node_networks();
        let built = {
            let mut last = self.built.lock().unwrap_or_else(PoisonError::into_inner);
            match last.as_ref() {
                Some(last)
                    if Arc::ptr_eq(&last.interfaces, &interfaces)
                        && last.networks == networks
                        && last.seen == seen =>
                {
                    Arc::clone(&last.built)
                }
                _ => {
                    let built = Arc::new(BuiltInventories::default());
                    *last = Some(BuiltFor {
                        interfaces: Arc::clone(&interfaces),
                        networks: networks.clone(),
                        seen: seen.clone(),
                        built: Arc::clone(&built),
                    });
                    built
                }
            }
        };
        Ok(lookup(&LookupContext {
            interfaces: &interfaces,
            selection: &self.selection,
            networks: &networks,
            seen_networks: &seen,
            built: &built,
        }))
    }
}

impl<I: InterfaceSource + 'static> DeviceSource for DiscoveredDevices<I> {
    async fn facts(&self, name: &str) -> Result<DeviceFacts, LookupError> {
        self.with_context(|context| facts::device_facts(context, name))
            .await?
            .ok_or_else(|| LookupError::NotFound(name.to_owned()))
    }

    async fn attributes(
        &self,
        name: &str,
    ) -> Result<BTreeMap<String, AttributeValue>, LookupError> {
        self.with_context(|context| facts::device_attributes(context, name))
            .await?
            .ok_or_else(|| LookupError::NotFound(name.to_owned()))
    }

    async fn parent_limit(&self, if_name: &str) -> Result<Option<u32>, LookupError> {
        self.with_context(|context| facts::parent_limit(context, if_name)).await
    }

    async fn parent_bandwidth(
        &self,
        if_name: &str,
    ) -> Result<Option<crate::model::bandwidth::BitsPerSecond>, LookupError> {
        self.with_context(|context| facts::parent_bandwidth(context, if_name)).await
    }

    async fn resolve(
        &self,
        names: &[String],
        with_attributes: bool,
    ) -> Vec<Result<ResolvedDevice, LookupError>> {
        let resolved = self.with_context(|context| {
            names
                .iter()
                .map(|name| {
                    facts::resolve_device(context, name, with_attributes)
                        .ok_or_else(|| LookupError::NotFound(name.clone()))
                })
                .collect()
        });
        match resolved.await {
            Ok(resolved) => resolved,
            Err(err) => names.iter().map(|_| Err(err.clone())).collect(),
        }
    }
}

/// A value that is refreshed when older than `reuse`; concurrent callers wait for one refresh
/// instead of each running their own.
#[derive(Debug)]
struct RecentSnapshot<T> {
    reuse: Duration,
    current: tokio::sync::Mutex<Option<(Instant, Arc<T>)>>,
}

impl<T> RecentSnapshot<T> {
    fn new(reuse: Duration) -> Self {
        Self { reuse, current: tokio::sync::Mutex::new(None) }
    }

    async fn get_or_refresh<F, Fut, E>(&self, refresh: F) -> Result<Arc<T>, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        // Held across the refresh on purpose: callers arriving meanwhile reuse its result.
        let mut current = self.current.lock().await;
        if let Some((taken, value)) = current.as_ref()
            && taken.elapsed() < self.reuse
        {
            return Ok(Arc::clone(value));
        }
        let value = Arc::new(refresh().await?);
        *current = Some((Instant::now(), Arc::clone(&value)));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_discovery_serves_concurrent_and_recent_lookups_and_is_redone_when_old() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let refreshes = AtomicUsize::new(0);
        let refresh = || async {
            // Slow enough that the concurrent callers arrive while it runs.
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok::<_, ()>(refreshes.fetch_add(1, Ordering::SeqCst))
        };
        let recent = RecentSnapshot::new(Duration::from_hours(1));
        let all = futures::future::join_all((0..20).map(|_| recent.get_or_refresh(refresh))).await;
        assert!(all.iter().all(|v| **v.as_ref().unwrap() == 0), "20 lookups, one refresh: {all:?}");
        assert_eq!(
            *recent.get_or_refresh(refresh).await.unwrap(),
            0,
            "a recent snapshot is reused"
        );

        let expired = RecentSnapshot::new(Duration::ZERO);
        assert_eq!(*expired.get_or_refresh(refresh).await.unwrap(), 1);
        assert_eq!(*expired.get_or_refresh(refresh).await.unwrap(), 2, "an old snapshot is redone");

        let failing = RecentSnapshot::<u32>::new(Duration::from_hours(1));
        assert_eq!(
            failing.get_or_refresh(|| async { Err("dump failed") }).await,
            Err("dump failed")
        );
        let after = failing.get_or_refresh(|| async { Ok::<_, &str>(7) }).await;
        assert_eq!(*after.unwrap(), 7, "a failure is not kept");
    }
}
