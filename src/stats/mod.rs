//! Traffic stats of attached pod interfaces (DESIGN §5 items 4 and 8): hooks counters onto
//! each interface once the attach service reports it attached (so never on the sandbox's
//! path), unhooks them when the interface goes, collects every interface's counters on a
//! timer for Prometheus, and hands the ones that changed to the claim status every
//! `--stats-interval`.
//!
//! It reaches the kernel through [`CounterPort`] and the rest of the daemon through
//! [`AttachedInterfaceSource`] (the attach service bumps a counter on every change, and the
//! snapshot is taken here, off the sandbox's path) and [`StatsSink`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::model::stats::InterfaceStats;

mod ports;

pub use ports::{AttachedInterfaceSource, Ceilings, CounterPort, PacingPort, StatsSink};

/// One attached pod interface, as the attach service reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchedInterface {
    /// Pod UID.
    pub pod_uid: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// Pod name.
    pub pod_name: String,
    /// The sandbox's network namespace.
    pub netns: PathBuf,
    /// Claim UID.
    pub claim_uid: String,
    /// Claim name (in the pod's namespace).
    pub claim_name: String,
    /// Request of the allocation result.
    pub request: String,
    /// Pool of the device.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// `shareID` of a shared device.
    pub share_id: Option<String>,
    /// Pod-side interface name.
    pub interface: String,
    /// `stats` of the interface's NetworkConfig.
    pub stats: bool,
}

impl WatchedInterface {
    fn key(&self) -> InterfaceKey {
        (self.pod_uid.clone(), self.interface.clone())
    }
}

/// `(pod UID, interface)`: what the kernel side knows an interface by.
type InterfaceKey = (String, String);

/// Timing of the collection.
#[derive(Debug, Clone, Copy)]
pub struct StatsSettings {
    /// How often counters are read for Prometheus.
    pub collect_every: Duration,
    /// How often changed counters go to the claim status; `None`: never (`--stats-interval 0`).
    pub status_every: Option<Duration>,
}

impl StatsSettings {
    /// Counters are read at least every 15 s, and at least as often as the status interval.
    #[must_use]
    pub fn from_status_interval(interval: Duration) -> Self {
        const PROMETHEUS: Duration = Duration::from_secs(15);
        if interval.is_zero() {
            Self { collect_every: PROMETHEUS, status_every: None }
        } else {
            Self { collect_every: interval.min(PROMETHEUS), status_every: Some(interval) }
        }
    }
}

/// The stats service.
#[derive(Debug)]
pub struct StatsService<H> {
    hooks: Arc<H>,
    settings: StatsSettings,
    /// Interfaces with counters hooked, by key.
    hooked: BTreeMap<InterfaceKey, WatchedInterface>,
    /// What was last handed to the claim status, by key.
    submitted: BTreeMap<InterfaceKey, InterfaceStats>,
    /// The attached interfaces of the last snapshot followed: the pins are listed for
    /// leftover ceiling programs only once one of them is gone (see [`Self::follow`]).
    attached: BTreeSet<InterfaceKey>,
}

impl<H: CounterPort> StatsService<H> {
    /// A service over `hooks`.
    pub fn new(hooks: H, settings: StatsSettings) -> Self {
        Self {
            hooks: Arc::new(hooks),
            settings,
            hooked: BTreeMap::new(),
            submitted: BTreeMap::new(),
            attached: BTreeSet::new(),
        }
    }

    /// Runs until `shutdown` fires: follows `interfaces`, collects, reports to `sink`.
    ///
    /// Counters hooked before a restart are adopted when their interface is still attached
    /// (the programs kept counting while the daemon was down), and removed otherwise.
    pub async fn run(
        mut self,
        source: impl AttachedInterfaceSource,
        sink: impl StatsSink,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut versions = source.changes();
        versions.borrow_and_update();
        let current = source.snapshot();
        self.adopt(&current).await;
        self.follow(&current).await;
        let mut collect = tokio::time::interval(self.settings.collect_every);
        collect.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut status_due =
            self.settings.status_every.map(|every| tokio::time::Instant::now() + every);
        loop {
            tokio::select! {
                moved = versions.changed() => {
                    if moved.is_err() {
                        break;
                    }
                    versions.borrow_and_update();
                    let current = source.snapshot();
                    self.follow(&current).await;
                }
                _ = collect.tick() => {
                    // A ceiling's programs hooked onto an interface that never showed up
                    // attached (its attach failed after the gate) go at the latest here. From
                    // a fresh snapshot: the gate hooks an interface once it is attached,
                    // perhaps before that change reached this loop, and `self.attached`
                    // would not have it yet.
                    let attached: BTreeSet<InterfaceKey> =
                        source.snapshot().iter().map(WatchedInterface::key).collect();
                    self.unhook_ceilings_of_gone(&attached).await;
                    let samples = self.collect().await;
                    sink.collected(&samples);
                    if let (Some(due), Some(every)) = (status_due, self.settings.status_every)
                        && tokio::time::Instant::now() >= due
                    {
                        status_due = Some(due + every);
                        let fresh = self.changed(samples);
                        if !fresh.is_empty() {
                            sink.changed(fresh);
                        }
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
    }

    /// Takes over the counters a previous process hooked: those of interfaces still attached
    /// are kept (and counted on when `stats` is on; with it off they were hooked for a
    /// bandwidth ceiling, which the programs keep enforcing), the others removed.
    async fn adopt(&mut self, interfaces: &[WatchedInterface]) {
        let pinned = match self.hooks.hooked() {
            Ok(pinned) => pinned,
            Err(err) => {
                tracing::warn!(err = %crate::model::cause::chain(&err), "listing the counters of an earlier run");
                return;
            }
        };
        let by_key: BTreeMap<InterfaceKey, &WatchedInterface> =
            interfaces.iter().map(|i| (i.key(), i)).collect();
        for (pod_uid, interface) in pinned {
            let key = (pod_uid, interface);
            match by_key.get(&key).copied() {
                Some(watched) => {
                    if watched.stats {
                        self.hooked.insert(key, watched.clone());
                    }
                }
                None => {
                    if let Err(err) = self.hooks.unhook(None, &key.0, &key.1).await {
                        tracing::warn!(pod = %key.0, interface = %key.1, err = %crate::model::cause::chain(&err),
                            "removing counters of an interface that is gone");
                    }
                }
            }
        }
    }

    /// Hooks the new interfaces, unhooks the gone ones (and the programs a bandwidth ceiling
    /// hooked onto an interface without counters, once it is gone).
    ///
    /// Listing the pins is a directory read per pod: done on every change it made a burst of
    /// attaches quadratic in system calls (issue 36), so only when an interface left the
    /// attached set (and on the collection tick).
    async fn follow(&mut self, interfaces: &[WatchedInterface]) {
        let attached: BTreeSet<InterfaceKey> =
            interfaces.iter().map(WatchedInterface::key).collect();
        if self.attached.is_empty() || !self.attached.is_subset(&attached) {
            self.unhook_ceilings_of_gone(&attached).await;
        }
        self.attached = attached;
        let wanted: BTreeMap<InterfaceKey, &WatchedInterface> =
            interfaces.iter().filter(|i| i.stats).map(|i| (i.key(), i)).collect();
        let gone: Vec<InterfaceKey> = self
            .hooked
            .iter()
            .filter(|(key, old)| wanted.get(*key).is_none_or(|new| new.netns != old.netns))
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            if let Some(old) = self.hooked.remove(&key) {
                self.submitted.remove(&key);
                if let Err(err) = self.hooks.unhook(Some(&old.netns), &key.0, &key.1).await {
                    tracing::warn!(pod = %key.0, interface = %key.1, err = %crate::model::cause::chain(&err),
                        "removing the counters of a detached interface");
                }
            }
        }
        for (key, watched) in wanted {
            if self.hooked.contains_key(&key) {
                continue;
            }
            match self.hooks.hook(&watched.netns, &key.0, &key.1).await {
                Ok(()) => {
                    self.hooked.insert(key, watched.clone());
                }
                // Not retried until the interface is attached again: the pod keeps its
                // network; only its counters are missing, which the log says.
                Err(err) => {
                    tracing::warn!(pod = %key.0, interface = %key.1,
                        err = %crate::model::cause::chain(&err), "hooking traffic counters");
                }
            }
        }
    }

    /// Removes the pins of interfaces this service did not hook (the ceilings' port hooked
    /// them: `stats: false` with a bandwidth ceiling) once they are no longer attached.
    async fn unhook_ceilings_of_gone(&self, attached: &BTreeSet<InterfaceKey>) {
        let pinned = match self.hooks.hooked() {
            Ok(pinned) => pinned,
            Err(err) => {
                tracing::debug!(err = %crate::model::cause::chain(&err), "listing the hooked interfaces");
                return;
            }
        };
        for key in pinned {
            if self.hooked.contains_key(&key) || attached.contains(&key) {
                continue;
            }
            if let Err(err) = self.hooks.unhook(None, &key.0, &key.1).await {
                tracing::warn!(pod = %key.0, interface = %key.1, err = %crate::model::cause::chain(&err),
                    "removing the ceiling programs of a detached interface");
            }
        }
    }

    /// Reads every hooked interface, one pod at a time.
    async fn collect(&self) -> Vec<(WatchedInterface, InterfaceStats)> {
        let mut by_pod: BTreeMap<&str, Vec<&WatchedInterface>> = BTreeMap::new();
        for watched in self.hooked.values() {
            by_pod.entry(watched.pod_uid.as_str()).or_default().push(watched);
        }
        let mut samples = Vec::new();
        for (pod_uid, watched) in by_pod {
            let names: Vec<String> = watched.iter().map(|w| w.interface.clone()).collect();
            match self.hooks.read(&watched[0].netns, pod_uid, &names).await {
                Ok(stats) => samples.extend(
                    watched
                        .into_iter()
                        .zip(stats)
                        .filter_map(|(w, stats)| stats.map(|stats| (w.clone(), stats))),
                ),
                // A pod stopping while it is read: its interfaces leave the watch next.
                Err(err) => {
                    tracing::debug!(pod = %pod_uid, err = %crate::model::cause::chain(&err),
                    "reading traffic counters");
                }
            }
        }
        samples
    }

    /// The samples that differ from what the status last got, remembered as submitted.
    fn changed(
        &mut self,
        samples: Vec<(WatchedInterface, InterfaceStats)>,
    ) -> Vec<(WatchedInterface, InterfaceStats)> {
        let live: BTreeSet<InterfaceKey> = samples.iter().map(|(w, _)| w.key()).collect();
        self.submitted.retain(|key, _| live.contains(key));
        samples
            .into_iter()
            .filter(|(watched, stats)| {
                let key = watched.key();
                if self.submitted.get(&key) == Some(stats) {
                    return false;
                }
                self.submitted.insert(key, *stats);
                true
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
