//! The health monitor: keeps the node's [`HealthReport`] current.
//!
//! Inputs: the devices the publisher publishes, the host's interfaces (a discovery through
//! [`InterfaceSource`] after each netlink change, debounced, and every `refresh` as a safety
//! net against lost notifications), and the NICs the attach service moved into pods, each
//! watched inside its pod's netns through the [`PodLinkSource`] port from the moment it is marked
//! moved until it leaves the pod. Output: a `watch` of the report, changed only when a
//! verdict or message changes (the kubelet adapter re-sends it on its own schedule).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::{
    DeviceHealth, HealthReport, LinkFacts, LinkObservation, Placement, PodLinkSource, assess,
};
use crate::inventory::publish::InterfaceSource;
use crate::model::cause::Chain;
use crate::model::device::Device;

/// A NIC the attach service moved (or is about to move) into a pod; it stays published
/// (DESIGN §5.1), so its health is read inside the pod. Keyed by its host interface name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedNic {
    /// The pod's network namespace.
    pub netns: PathBuf,
    /// `namespace/name` of the pod (for messages).
    pub pod: String,
    /// The interface's name inside the pod.
    pub if_name: String,
}

/// Where a pod link watch reports what it sees. Reports that change nothing are dropped.
#[derive(Debug)]
pub struct LinkReporter {
    value: watch::Sender<LinkObservation>,
    dirty: mpsc::Sender<()>,
}

impl LinkReporter {
    /// Records the link's current state and wakes the monitor when it changed.
    pub fn report(&self, observation: LinkObservation) {
        let changed = self.value.send_if_modified(|current| {
            let changed = *current != observation;
            *current = observation;
            changed
        });
        if changed {
            // Capacity 1: a pending wake-up already makes the monitor read every watch.
            let _ignored = self.dirty.try_send(());
        }
    }

    /// Whether the monitor stopped watching this link (the NIC left the pod, or the daemon
    /// stops): the watch should then release its socket.
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.value.is_closed()
    }

    /// Resolves when [`Self::is_closed`] becomes true.
    pub async fn closed(&self) {
        self.value.closed().await;
    }
}

/// The monitor's settings.
#[derive(Debug, Clone)]
pub struct MonitorSettings {
    /// The pool the devices belong to (the node name).
    pub pool: String,
    /// Rediscovery without a netlink notification, and the retry of failed pod watches.
    pub refresh: Duration,
    /// Quiet time after a netlink notification before rediscovering (bounded: counted from
    /// the first notification of a burst).
    pub debounce: Duration,
    /// Least time between the starts of two rediscoveries caused by notifications. Every
    /// pod's host-side veth (the runtime's CNI) makes link notifications, so a burst of pod
    /// starts is a continuous stream of them, and each rediscovery dumps and parses every
    /// host link, address and route: at 1,000 pods, back-to-back rediscoveries were a
    /// large part of the daemon's CPU during the burst (issue 36). A verdict change of a
    /// published device is seen within this plus the debounce.
    pub min_interval: Duration,
    /// How long a device whose interface disappeared (and was unpublished) is still
    /// reported Unhealthy, so a pod holding it sees why rather than just Unknown.
    pub removed_retention: Duration,
}

impl MonitorSettings {
    /// Production settings: refresh every 10 s (the resend interval kubelet gets), 50 ms
    /// debounce, at most one rediscovery a second (the inventory's own bound), removed
    /// devices reported for 5 minutes.
    #[must_use]
    pub fn new(pool: impl Into<String>) -> Self {
        Self {
            pool: pool.into(),
            refresh: Duration::from_secs(10),
            debounce: Duration::from_millis(50),
            min_interval: Duration::from_secs(1),
            removed_retention: Duration::from_mins(5),
        }
    }
}

/// What the monitor listens to.
#[derive(Debug)]
pub struct MonitorInputs {
    /// The devices being published (from the publisher).
    pub devices: watch::Receiver<Vec<Device>>,
    /// NICs moved into pods, by host interface name (from the attach service).
    pub moved: watch::Receiver<BTreeMap<String, MovedNic>>,
    /// A netlink change in the host netns (coalesced).
    pub link_changes: mpsc::Receiver<()>,
    /// Becomes `true` when the daemon stops.
    pub stop: watch::Receiver<bool>,
}

/// Runs the monitor until `inputs.stop`, publishing each changed report on `out`. `out` is
/// dropped when it returns (or its task dies): the kubelet stream then reports every device
/// Unknown instead of its last verdict.
pub async fn run<I: InterfaceSource, P: PodLinkSource>(
    settings: MonitorSettings,
    interfaces: I,
    pods: P,
    mut inputs: MonitorInputs,
    out: watch::Sender<HealthReport>,
) {
    let (dirty, mut wakeups) = mpsc::channel(1);
    let mut state = State::new();
    state.discover(&interfaces).await;
    state.set_devices(inputs.devices.borrow_and_update().clone(), Instant::now());
    let moved = inputs.moved.borrow_and_update().clone();
    state.watch_pods(&pods, moved, &dirty).await;
    publish(&out, state.report(&settings, Instant::now()));

    let mut refresh = tokio::time::interval_at(Instant::now() + settings.refresh, settings.refresh);
    refresh.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut discover_due: Option<Instant> = None;
    let mut last_discovery = Instant::now();
    loop {
        let sleep_until = discover_due.unwrap_or_else(|| Instant::now() + Duration::from_hours(1));
        tokio::select! {
            () = stopped(&mut inputs.stop) => break,
            Ok(()) = inputs.devices.changed() => {
                let devices = inputs.devices.borrow_and_update().clone();
                state.set_devices(devices, Instant::now());
            }
            Ok(()) = inputs.moved.changed() => {
                let moved = inputs.moved.borrow_and_update().clone();
                state.watch_pods(&pods, moved, &dirty).await;
            }
            Some(()) = inputs.link_changes.recv() => {
                discover_due.get_or_insert_with(|| {
                    (Instant::now() + settings.debounce).max(last_discovery + settings.min_interval)
                });
                continue;
            }
            Some(()) = wakeups.recv() => {}
            () = tokio::time::sleep_until(sleep_until), if discover_due.is_some() => {
                discover_due = None;
                last_discovery = Instant::now();
                state.discover(&interfaces).await;
            }
            _ = refresh.tick() => {
                last_discovery = Instant::now();
                state.discover(&interfaces).await;
                state.retry_pods(&pods, &dirty).await;
            }
        }
        publish(&out, state.report(&settings, Instant::now()));
    }
    tracing::debug!("health monitor stopped");
}

/// Resolves when `stop` turns true or its sender is gone (without holding its lock guard,
/// which would make the monitor's future `!Send`).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ignored = stop.wait_for(|stopped| *stopped).await;
}

fn publish(out: &watch::Sender<HealthReport>, report: HealthReport) {
    out.send_if_modified(|current| {
        let changed = *current != report;
        if changed {
            for device in &report.devices {
                let before = current.devices.iter().find(|d| d.device == device.device);
                if before.is_none_or(|b| b.status != device.status) {
                    tracing::info!(device = %device.device, status = ?device.status,
                        message = %device.message, "device health");
                }
            }
            *current = report;
        }
        changed
    });
}

/// One pod link watch.
#[derive(Debug)]
struct PodWatch {
    nic: MovedNic,
    observed: watch::Receiver<LinkObservation>,
    /// Why the watch could not start (retried at each refresh).
    failed: Option<String>,
}

impl PodWatch {
    /// Whether the watch must be started again: it never started, or it ended.
    fn broken(&self) -> bool {
        self.failed.is_some() || self.observed.has_changed().is_err()
    }

    fn observation(&self) -> LinkObservation {
        match &self.failed {
            Some(reason) => LinkObservation::Unreadable(reason.clone()),
            None => self.observed.borrow().clone(),
        }
    }
}

#[derive(Debug)]
struct State {
    devices: Vec<Device>,
    /// The host's interfaces by name, or why discovery failed.
    host: Result<HashMap<String, LinkFacts>, String>,
    /// Pod watches by host interface name.
    pods: BTreeMap<String, PodWatch>,
    /// Devices no longer published whose interface disappeared, and since when.
    removed: BTreeMap<String, (Device, Instant)>,
}

impl State {
    fn new() -> Self {
        Self {
            devices: Vec::new(),
            host: Err("the host's interfaces were not read yet".to_owned()),
            pods: BTreeMap::new(),
            removed: BTreeMap::new(),
        }
    }

    async fn discover<I: InterfaceSource>(&mut self, interfaces: &I) {
        self.host = match interfaces.discover().await {
            Ok(found) => Ok(found.iter().map(|i| (i.name.clone(), LinkFacts::of(i))).collect()),
            Err(err) => {
                let reason = format!("discovering the host's interfaces failed: {}", Chain(&err));
                tracing::warn!("{reason}");
                Err(reason)
            }
        };
    }

    fn set_devices(&mut self, devices: Vec<Device>, now: Instant) {
        let names: BTreeSet<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        for old in &self.devices {
            if !names.contains(old.name.as_str()) {
                // Kept only while its interface stays gone (see `report`): a device that was
                // republished under another name (slot fallback) is not "removed".
                self.removed.entry(old.name.clone()).or_insert_with(|| (old.clone(), now));
            }
        }
        self.removed.retain(|name, _| !names.contains(name.as_str()));
        self.devices = devices;
    }

    async fn watch_pods<P: PodLinkSource>(
        &mut self,
        pods: &P,
        moved: BTreeMap<String, MovedNic>,
        dirty: &mpsc::Sender<()>,
    ) {
        // Dropping a watch's receiver closes its reporter: the adapter releases the socket.
        self.pods.retain(|host_name, watch| moved.get(host_name) == Some(&watch.nic));
        for (host_name, nic) in moved {
            if let std::collections::btree_map::Entry::Vacant(entry) = self.pods.entry(host_name) {
                let watch = start_watch(pods, entry.key(), nic, dirty).await;
                entry.insert(watch);
            }
        }
    }

    async fn retry_pods<P: PodLinkSource>(&mut self, pods: &P, dirty: &mpsc::Sender<()>) {
        let broken: Vec<(String, MovedNic)> = self
            .pods
            .iter()
            .filter(|(_, watch)| watch.broken())
            .map(|(host_name, watch)| (host_name.clone(), watch.nic.clone()))
            .collect();
        for (host_name, nic) in broken {
            let watch = start_watch(pods, &host_name, nic, dirty).await;
            self.pods.insert(host_name, watch);
        }
    }

    /// Where `device`'s interface is and what is known of it. A moved NIC is read in its pod;
    /// while it is not there (about to be moved, or moved back) the host netns tells.
    fn observe(&self, device: &Device) -> (Placement<'_>, LinkObservation) {
        let host = match &self.host {
            Ok(interfaces) => interfaces
                .get(&device.if_name)
                .map_or(LinkObservation::Absent, |facts| LinkObservation::Present(*facts)),
            Err(reason) => LinkObservation::Unreadable(reason.clone()),
        };
        let Some(watch) = self.pods.get(&device.if_name) else {
            return (Placement::Host, host);
        };
        let in_pod = watch.observation();
        let placement = Placement::Pod { pod: &watch.nic.pod, if_name: &watch.nic.if_name };
        match (in_pod, host) {
            (in_pod @ LinkObservation::Present(_), _) => (placement, in_pod),
            (_, host @ LinkObservation::Present(_)) => (Placement::Host, host),
            (in_pod, _) => (placement, in_pod),
        }
    }

    fn report(&mut self, settings: &MonitorSettings, now: Instant) -> HealthReport {
        let (host, pods) = (&self.host, &self.pods);
        // A removed device is reported only while its interface is really gone; when the host
        // cannot be read it is kept, unreported, until it can.
        let gone = |if_name: &str| match host {
            Ok(interfaces) => {
                Some(!interfaces.contains_key(if_name) && !pods.contains_key(if_name))
            }
            Err(_) => None,
        };
        self.removed.retain(|_, (device, since)| {
            now.duration_since(*since) < settings.removed_retention
                && gone(&device.if_name) != Some(false)
        });
        let mut devices: Vec<DeviceHealth> = self
            .devices
            .iter()
            .map(|device| {
                let (placement, observation) = self.observe(device);
                assess(device, placement, &observation)
            })
            .collect();
        devices.extend(
            self.removed
                .values()
                .filter(|(device, _)| gone(&device.if_name) == Some(true))
                .map(|(device, _)| assess(device, Placement::Host, &LinkObservation::Absent)),
        );
        devices.sort_by(|a, b| a.device.cmp(&b.device));
        HealthReport { pool: settings.pool.clone(), devices }
    }
}

async fn start_watch<P: PodLinkSource>(
    pods: &P,
    host_name: &str,
    nic: MovedNic,
    dirty: &mpsc::Sender<()>,
) -> PodWatch {
    let (value, observed) =
        watch::channel(LinkObservation::Unreadable("the pod link watch has not reported".into()));
    let reporter = LinkReporter { value, dirty: dirty.clone() };
    let failed = match pods.watch(&nic, reporter).await {
        Ok(()) => {
            tracing::debug!(interface = host_name, pod = %nic.pod, "watching a NIC inside its pod");
            None
        }
        Err(err) => {
            let reason =
                format!("cannot watch {} in {}: {}", nic.if_name, nic.netns.display(), Chain(&err));
            tracing::warn!(interface = host_name, pod = %nic.pod, "{reason}");
            Some(reason)
        }
    };
    PodWatch { nic, observed, failed }
}
