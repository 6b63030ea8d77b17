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

/// The ceilings the program of one pod interface enforces (issue 35, DESIGN §3 `bandwidth`),
/// in bits per second; `None` leaves that direction unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ceilings {
    /// Egress pacing: Earliest Departure Time, the program stamps each packet's
    /// `skb->tstamp` so the interface's packets leave at this rate; an `fq` qdisc on the
    /// interface holds them until then (without `fq` the stamps are ignored).
    pub egress_bps: Option<u64>,
    /// Ingress policing: packets received above this rate (beyond a small burst) are
    /// dropped by the program and counted.
    pub ingress_police_bps: Option<u64>,
}

impl Ceilings {
    /// Whether neither direction is limited.
    #[must_use]
    pub fn is_none(&self) -> bool {
        self.egress_bps.is_none() && self.ingress_police_bps.is_none()
    }
}

/// The kernel side of bandwidth ceilings: the per-interface rates the counting programs
/// enforce (the counters and the pacing share one program per direction).
pub trait PacingPort: Send + Sync + 'static {
    /// The adapter's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Sets the ceilings of `interface` in the netns at `netns` (all `None`: removes them,
    /// the counters stay). Hooks the programs first when the interface has none yet (the
    /// stats service later adopts them, counts kept), so it may run a verifier pass: call it
    /// at the CreateContainer gate, not on the sandbox's path. Idempotent.
    fn set_pacing(
        &self,
        netns: &Path,
        pod_uid: &str,
        interface: &str,
        ceilings: Ceilings,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}
