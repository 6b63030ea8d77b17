//! The stats service's ports: the kernel's counters ([`CounterPort`]), the attached
//! interfaces to count ([`AttachedInterfaceSource`]) and where collected counters go ([`StatsSink`]).

use std::future::Future;
use std::path::Path;

use tokio::sync::watch;

use super::WatchedInterface;
use crate::model::stats::InterfaceStats;

/// The kernel side: counters hooked onto pod interfaces.
pub trait CounterPort: Send + Sync + 'static {
    /// The adapter's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Hooks fresh counters onto `interface` in the netns at `netns`.
    fn hook(
        &self,
        netns: &Path,
        pod_uid: &str,
        interface: &str,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Removes the counters of `interface` (idempotent; `netns` when it may still exist).
    fn unhook(
        &self,
        netns: Option<&Path>,
        pod_uid: &str,
        interface: &str,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Reads the counters of `interfaces` of one pod, with the kernel's drop counters;
    /// `None` for an interface without counters.
    fn read(
        &self,
        netns: &Path,
        pod_uid: &str,
        interfaces: &[String],
    ) -> impl Future<Output = Result<Vec<Option<InterfaceStats>>, Self::Error>> + Send;

    /// The `(pod UID, interface)` pairs with counters hooked (after a restart: the pins).
    ///
    /// # Errors
    /// The adapter's error when they cannot be listed.
    fn hooked(&self) -> Result<Vec<(String, String)>, Self::Error>;
}

/// The attached interfaces: a change counter, and a snapshot taken when it moved.
pub trait AttachedInterfaceSource: Send + Sync + 'static {
    /// Bumped whenever the set of attached interfaces may have changed.
    fn changes(&self) -> watch::Receiver<u64>;
    /// Every interface attached now.
    fn snapshot(&self) -> Vec<WatchedInterface>;
}

/// Where collected stats go.
pub trait StatsSink: Send + Sync + 'static {
    /// Every hooked interface's counters, after each collection (Prometheus).
    fn collected(&self, samples: &[(WatchedInterface, InterfaceStats)]);
    /// The interfaces whose counters changed since they were last handed over, at most
    /// once per status interval (the claim status).
    fn changed(&self, samples: Vec<(WatchedInterface, InterfaceStats)>);
}
