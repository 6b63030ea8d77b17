//! Keeping a node's pool of ResourceSlices equal to its inventory: generations, stale slices,
//! read-back of every write, the fallback to slot devices, the node's PodNetworks, and
//! sharing changes held while claims prepared on a shared device exist.
//!
//! The publisher talks to the API through the [`SliceApi`] port, so this logic is tested
//! against an in-memory fake; `k8s::resource_slices` is the real adapter. [`run`] is the
//! loop that publishes on the node's triggers.

mod ports;
mod run;

pub use ports::{
    InterfaceSource, PreparedDeviceSource, PublishSink, ReadinessSink, SliceApi, SliceApiError,
    WarningSink,
};
pub use run::{HOLD_RECHECK, NETWORKS_PATIENCE, SliceEvent, Triggers, run};

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{ResourceSlice, ResourceSliceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tokio::sync::watch;

use super::networks::{NetworkConflict, NetworkInputs, NodeNetworks};
use super::slices::{
    PoolIdentity, build_slices, exclusive_device_from_api, shared_device_from_api,
};
use super::{Inventory, Selection, SharingMode};
use crate::model::device::{Device, HostInterface, Sharing};
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};

/// A shared device published as before although the inventory now has it otherwise (slot
/// devices after the `--sharing-mode auto` fallback, an exclusive device after a PodNetwork
/// or `--shared-parents` turned its NIC exclusive): claims prepared on it exist, and a
/// device must not stop allowing multiple allocations while shared allocations of it exist
/// (kubernetes #140798). Its whole host interface keeps its earlier devices until they are
/// unprepared.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct SharingHold {
    /// The shared device.
    pub device: String,
    /// Its host interface (the parent).
    pub if_name: String,
}

impl fmt::Display for SharingHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shared device {} on {} keeps allowMultipleAllocations and its capacity while claims \
             prepared on it exist; the change of how {} is published waits until they are \
             unprepared",
            self.device, self.if_name, self.if_name
        )
    }
}

/// What `--sharing-mode` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestedSharing {
    /// Capacity, falling back to slots when the server drops it.
    Auto,
    /// Capacity only; a server that drops it is reported, not worked around.
    Capacity,
    /// Slots only.
    Slots,
}

/// What one [`Publisher::sync`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncReport {
    /// Slices written (server-side apply calls).
    pub applied: usize,
    /// Stale slices deleted.
    pub deleted: usize,
    /// The generation now published.
    pub generation: i64,
    /// Devices now published.
    pub devices: usize,
    /// The server dropped `allowMultipleAllocations`/`capacity` for the first time; the text
    /// says what happened and what the publisher did about it.
    pub capacity_dropped: Option<String>,
    /// PodNetwork conflicts that appeared since the last sync (reported once each, again
    /// only after they were resolved and came back).
    pub new_conflicts: Vec<NetworkConflict>,
    /// Sharing changes held since this sync (reported once each).
    pub new_holds: Vec<SharingHold>,
    /// Holds released by this sync: the change they held is published now.
    pub released_holds: Vec<SharingHold>,
}

/// Publishes one node's pool.
#[derive(Debug)]
pub struct Publisher<A> {
    api: A,
    pool: PoolIdentity,
    selection: Selection,
    requested: RequestedSharing,
    owner: Option<OwnerReference>,
    started: bool,
    /// Devices of the last successful publication.
    published_devices: Option<Vec<Device>>,
    /// Specs as the server stored them, by slice name: the reference for "was it changed
    /// behind our back".
    stored: BTreeMap<String, ResourceSliceSpec>,
    /// Devices kept published although discovery no longer sees them (moved into a pod).
    retained: BTreeMap<String, Device>,
    /// Host interfaces currently moved into pods (from the attach service).
    moved: BTreeSet<String>,
    /// Exclusive devices of this pool as the API held them when the publisher started: the
    /// source for devices that were already inside a pod when the daemon (re)started.
    found_at_start: Vec<Device>,
    capacity_drop_reported: bool,
    /// The PodNetworks of this node, as last judged.
    networks: NodeNetworks,
    /// PodNetwork conflicts already reported.
    conflicts: BTreeSet<NetworkConflict>,
    /// The devices of the pool as last computed (for device health).
    devices: watch::Sender<Vec<Device>>,
    /// Where the devices with prepared claims come from; without one nothing is held.
    prepared: Option<Arc<dyn PreparedDeviceSource>>,
    /// Shared devices of this pool as the API held them when the publisher started.
    shared_at_start: Vec<Device>,
    /// Sharing changes held now (for the status API).
    holds: watch::Sender<BTreeSet<SharingHold>>,
}

impl<A: SliceApi> Publisher<A> {
    /// A publisher for `pool` (its generation is replaced at start by the existing one + 1).
    pub fn new(
        api: A,
        pool: PoolIdentity,
        selection: Selection,
        requested: RequestedSharing,
        owner: Option<OwnerReference>,
    ) -> Self {
        let selection = match requested {
            RequestedSharing::Slots => selection.with_sharing_mode(SharingMode::Slots),
            RequestedSharing::Auto | RequestedSharing::Capacity => {
                selection.with_sharing_mode(SharingMode::Capacity)
            }
        };
        Self {
            api,
            pool,
            selection,
            requested,
            owner,
            started: false,
            published_devices: None,
            stored: BTreeMap::new(),
            retained: BTreeMap::new(),
            moved: BTreeSet::new(),
            found_at_start: Vec::new(),
            capacity_drop_reported: false,
            networks: NodeNetworks::default(),
            conflicts: BTreeSet::new(),
            devices: watch::Sender::new(Vec::new()),
            prepared: None,
            shared_at_start: Vec::new(),
            holds: watch::Sender::new(BTreeSet::new()),
        }
    }

    /// The same publisher holding sharing changes of devices `prepared` names ([`SharingHold`]).
    #[must_use]
    pub fn with_prepared(mut self, prepared: Arc<dyn PreparedDeviceSource>) -> Self {
        self.prepared = Some(prepared);
        self
    }

    /// The sharing changes held now, updated at each [`Self::sync`].
    #[must_use]
    pub fn holds(&self) -> watch::Receiver<BTreeSet<SharingHold>> {
        self.holds.subscribe()
    }

    /// Whether a sharing change is held: the loop syncs again after a while to see whether
    /// the claims holding it are gone.
    #[must_use]
    pub fn is_holding(&self) -> bool {
        !self.holds.borrow().is_empty()
    }

    /// The devices this node publishes, updated at each [`Self::sync`] as soon as they are
    /// computed (before the API writes, so device health does not wait for the API server).
    #[must_use]
    pub fn devices(&self) -> watch::Receiver<Vec<Device>> {
        self.devices.subscribe()
    }

    fn announce(&self, devices: &[Device]) {
        self.devices.send_if_modified(|current| {
            let changed = current.as_slice() != devices;
            if changed {
                *current = devices.to_vec();
            }
            changed
        });
    }

    /// The port, for callers that need it (tests).
    pub fn api(&self) -> &A {
        &self.api
    }

    /// The generation last published (or about to be, before the first sync).
    #[must_use]
    pub fn generation(&self) -> i64 {
        self.pool.generation
    }

    /// The sharing mode in effect (after a fallback, `Slots`).
    #[must_use]
    pub fn sharing_mode(&self) -> SharingMode {
        self.selection.sharing_mode()
    }

    /// Judges the node's PodNetworks from `inputs` for the next [`Self::sync`]; returns
    /// whether that changed anything (a status or label change that serves the same
    /// networks on the same terms does not).
    pub fn set_networks(&mut self, inputs: &NetworkInputs) -> bool {
        let networks = NodeNetworks::evaluate(&self.pool.driver, inputs);
        let changed = networks != self.networks;
        self.networks = networks;
        changed
    }

    /// Devices that must stay published while discovery cannot see them (a NIC moved into a
    /// pod's namespace disappears from the host dump). Keyed by interface name.
    pub fn set_retained(&mut self, devices: Vec<Device>) {
        self.retained = devices.into_iter().map(|d| (d.if_name.clone(), d)).collect();
    }

    /// Keeps published the devices whose host interface is in `moved` (moved into a pod),
    /// taking them from the last publication; a device no longer moved is no longer
    /// retained (discovery sees it again, or it is gone for good).
    ///
    /// After a restart the last publication is the one the API server still holds (read at
    /// the first [`Self::sync`]), so a NIC that stayed in its pod is not unpublished while
    /// the pod runs.
    pub fn retain_moved(&mut self, moved: &BTreeSet<String>) {
        self.moved.clone_from(moved);
        self.refresh_retained();
    }

    fn refresh_retained(&mut self) {
        let moved = &self.moved;
        self.retained.retain(|if_name, _| moved.contains(if_name));
        let source = self.published_devices.as_deref().unwrap_or(&self.found_at_start);
        for device in source {
            if moved.contains(&device.if_name) && !self.retained.contains_key(&device.if_name) {
                self.retained.insert(device.if_name.clone(), device.clone());
            }
        }
    }

    /// Names of the slices this publisher wrote last.
    #[must_use]
    pub fn slice_names(&self) -> BTreeSet<String> {
        self.stored.keys().cloned().collect()
    }

    /// Whether a slice seen on a watch differs from what we stored (or is ours and gone).
    #[must_use]
    pub fn needs_repair(&self, name: &str, seen: Option<&ResourceSliceSpec>) -> bool {
        match (self.stored.get(name), seen) {
            // A watch event of an older generation is one of our own earlier writes arriving
            // late; the write that superseded it has its own event.
            (Some(_), Some(seen)) if seen.pool.generation < self.pool.generation => false,
            (Some(stored), Some(seen)) => stored != seen,
            (Some(_), None) => true,
            // Not ours at this generation: a leftover that the next sync deletes.
            (None, Some(seen)) => seen.pool.generation < self.pool.generation,
            (None, None) => false,
        }
    }

    /// Makes the pool match `interfaces`. Writes only when the devices changed since the
    /// last publication, or when `force` (a slice was changed or deleted behind our back).
    pub async fn sync(
        &mut self,
        interfaces: &[HostInterface],
        force: bool,
    ) -> Result<SyncReport, SliceApiError> {
        if !self.started {
            let existing = self.api.list().await?;
            let highest = existing.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
            self.pool.generation = highest + 1;
            let latest: Vec<_> = existing
                .iter()
                .filter(|slice| slice.spec.pool.generation == highest)
                .flat_map(|slice| slice.spec.devices.iter().flatten())
                .collect();
            let driver = &self.pool.driver;
            self.found_at_start = latest
                .iter()
                .filter_map(|device| exclusive_device_from_api(device, driver))
                .collect();
            self.shared_at_start =
                latest.iter().filter_map(|device| shared_device_from_api(device, driver)).collect();
            self.started = true;
            self.refresh_retained();
        }
        let prepared = self.prepared.as_ref().map(|p| p.prepared_devices()).unwrap_or_default();
        let (devices, conflicts, holds) = self.inventory_for(interfaces, &prepared);
        let new_conflicts = self.note_conflicts(conflicts);
        self.announce(&devices);
        let changed = self.published_devices.as_ref() != Some(&devices);
        if !changed && !force {
            let (new_holds, released_holds) = self.note_holds(holds);
            return Ok(SyncReport {
                generation: self.pool.generation,
                devices: devices.len(),
                new_conflicts,
                new_holds,
                released_holds,
                ..SyncReport::default()
            });
        }
        if changed && self.published_devices.is_some() {
            self.pool.generation += 1;
        }
        let mut report = self.write(&devices).await?;
        report.new_conflicts = new_conflicts;
        let mut holds = holds;
        if let Some(message) = report.capacity_dropped.clone()
            && self.requested == RequestedSharing::Auto
            && self.selection.sharing_mode() == SharingMode::Capacity
        {
            self.selection = self.selection.clone().with_sharing_mode(SharingMode::Slots);
            let (devices, _, slot_holds) = self.inventory_for(interfaces, &prepared);
            holds = slot_holds;
            self.announce(&devices);
            self.pool.generation += 1;
            let again = self.write(&devices).await?;
            report.applied += again.applied;
            report.deleted += again.deleted;
            report.generation = again.generation;
            report.devices = again.devices;
            report.capacity_dropped = Some(format!(
                "{message}; --sharing-mode auto: shared parents are now published as slot \
                     devices"
            ));
        }
        (report.new_holds, report.released_holds) = self.note_holds(holds);
        Ok(report)
    }

    /// The devices to publish, the PodNetwork conflicts met on the way, and the sharing
    /// changes held because devices in `prepared` are shared now ([`SharingHold`]).
    fn inventory_for(
        &self,
        interfaces: &[HostInterface],
        prepared: &BTreeSet<String>,
    ) -> (Vec<Device>, Vec<NetworkConflict>, BTreeSet<SharingHold>) {
        let inventory = Inventory::build_with(interfaces, &self.selection, &self.networks);
        let mut devices = inventory.devices;
        let seen: BTreeSet<&str> = interfaces.iter().map(|i| i.name.as_str()).collect();
        let names: BTreeSet<String> = devices.iter().map(|d| d.name.clone()).collect();
        let pod_network = format!("{ATTRIBUTE_DOMAIN}/{}", attr::POD_NETWORK);
        for device in self.retained.values() {
            if !seen.contains(device.if_name.as_str()) && !names.contains(&device.name) {
                let mut device = device.clone();
                // A NIC in a pod keeps the tag it was published with only while its network
                // still serves it; a network disabled meanwhile drops it now (DESIGN §4).
                if !self.networks.keeps_tag(&device) {
                    device.attributes.remove(&pod_network);
                }
                devices.push(device);
            }
        }
        let holds = self.hold_shared(&mut devices, prepared);
        devices.sort_by(|a, b| a.name.cmp(&b.name));
        (devices, inventory.conflicts, holds)
    }

    /// Puts back the earlier devices of every host interface whose shared device, with claims
    /// prepared on it, the new inventory publishes as slot or exclusive devices (the
    /// `--sharing-mode auto` fallback, a PodNetwork or `--shared-parents` turning the NIC
    /// exclusive, also across a restart). An interface the new inventory publishes nothing
    /// on (NIC gone, network disabled or deleted) is not held: that is no sharing change.
    fn hold_shared(
        &self,
        devices: &mut Vec<Device>,
        prepared: &BTreeSet<String>,
    ) -> BTreeSet<SharingHold> {
        let earlier: Vec<&Device> = match &self.published_devices {
            Some(published) => published.iter().collect(),
            None => self.shared_at_start.iter().collect(),
        };
        let holds: BTreeSet<SharingHold> = earlier
            .iter()
            .filter(|old| old.sharing == Sharing::Shared && prepared.contains(&old.name))
            .filter(|old| {
                let still_shared =
                    devices.iter().any(|d| d.name == old.name && d.sharing == Sharing::Shared);
                let unshared = devices
                    .iter()
                    .any(|d| d.if_name == old.if_name && d.sharing != Sharing::Shared);
                unshared && !still_shared
            })
            .map(|old| SharingHold { device: old.name.clone(), if_name: old.if_name.clone() })
            .collect();
        let frozen: BTreeSet<&str> = holds.iter().map(|hold| hold.if_name.as_str()).collect();
        if frozen.is_empty() {
            return holds;
        }
        let kept: Vec<Device> = earlier
            .into_iter()
            .filter(|old| frozen.contains(old.if_name.as_str()))
            .cloned()
            .collect();
        devices.retain(|d| {
            !frozen.contains(d.if_name.as_str()) && !kept.iter().any(|old| old.name == d.name)
        });
        devices.extend(kept);
        holds
    }

    /// Records the holds in effect and returns those new since the last sync and those
    /// released by it.
    fn note_holds(&mut self, holds: BTreeSet<SharingHold>) -> (Vec<SharingHold>, Vec<SharingHold>) {
        let current = self.holds.borrow().clone();
        let new = holds.difference(&current).cloned().collect();
        let released = current.difference(&holds).cloned().collect();
        self.holds.send_if_modified(|now| {
            let changed = *now != holds;
            *now = holds;
            changed
        });
        (new, released)
    }

    /// Remembers `conflicts` and returns those not reported before; a conflict that is gone
    /// is forgotten, so it is reported again if it comes back.
    fn note_conflicts(&mut self, conflicts: Vec<NetworkConflict>) -> Vec<NetworkConflict> {
        let current: BTreeSet<NetworkConflict> = conflicts.into_iter().collect();
        let new = current.difference(&self.conflicts).cloned().collect();
        self.conflicts = current;
        new
    }

    async fn write(&mut self, devices: &[Device]) -> Result<SyncReport, SliceApiError> {
        let mut slices = build_slices(&self.pool, devices);
        if let Some(owner) = &self.owner {
            for slice in &mut slices {
                slice.metadata.owner_references = Some(vec![owner.clone()]);
            }
        }
        let mut report = SyncReport {
            generation: self.pool.generation,
            devices: devices.len(),
            ..SyncReport::default()
        };
        let mut stored = BTreeMap::new();
        for slice in &slices {
            let written = self.api.apply(slice).await?;
            report.applied += 1;
            if let Some(message) = self.dropped_sharing_fields(slice, &written) {
                report.capacity_dropped.get_or_insert(message);
            }
            let name = slice.metadata.name.clone().unwrap_or_default();
            stored.insert(name, written.spec);
        }
        // Stale slices go only after the new generation is complete, so consumers never see a
        // pool with fewer slices than its resourceSliceCount promises.
        let existing = self.api.list().await?;
        for slice in existing {
            let Some(name) = slice.metadata.name else { continue };
            if !stored.contains_key(&name) {
                self.api.delete(&name).await?;
                report.deleted += 1;
            }
        }
        self.stored = stored;
        self.published_devices = Some(devices.to_vec());
        if report.capacity_dropped.is_some() {
            if self.capacity_drop_reported {
                report.capacity_dropped = None;
            } else {
                self.capacity_drop_reported = true;
            }
        }
        Ok(report)
    }

    /// The read-back check: a shared device that came back without
    /// `allowMultipleAllocations` or `capacity` means the API server has the
    /// DRAConsumableCapacity feature off and silently dropped the fields.
    #[expect(clippy::unused_self, reason = "a method so it reads as part of the write")]
    fn dropped_sharing_fields(
        &self,
        sent: &ResourceSlice,
        stored: &ResourceSlice,
    ) -> Option<String> {
        let stored_devices: BTreeMap<&str, _> = stored
            .spec
            .devices
            .iter()
            .flatten()
            .map(|device| (device.name.as_str(), device))
            .collect();
        let dropped: Vec<&str> = sent
            .spec
            .devices
            .iter()
            .flatten()
            .filter(|device| device.allow_multiple_allocations == Some(true))
            .filter(|device| {
                stored_devices.get(device.name.as_str()).is_none_or(|back| {
                    back.allow_multiple_allocations != Some(true) || back.capacity.is_none()
                })
            })
            .map(|device| device.name.as_str())
            .collect();
        (!dropped.is_empty()).then(|| {
            format!(
                "the API server dropped allowMultipleAllocations/capacity of shared device(s) {} \
                 (feature DRAConsumableCapacity is off: Kubernetes 1.36+, or the gate on 1.34/1.35)",
                dropped.join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests;
