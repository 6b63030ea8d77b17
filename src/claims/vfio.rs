//! Mode `vfio` (DESIGN §3): the PCI function of a claim's device (a VF, or a whole NIC) is
//! unbound from its kernel driver and bound to `vfio-pci` at prepare, its group device
//! injected into the pod's containers through CDI ([`super::vfio_cdi`]), and rebound to the
//! driver it had at unprepare. A VF's VF settings are applied on its PF first, as for
//! `sriov-vf` (`claims::vf_settings`), and set back before the rebind, so the kernel driver
//! starts again from the values it had. Nothing moves into the pod's network namespace: the
//! attach leaves these devices out.
//!
//! Crash safety (DESIGN §6): a [`VfioBinding`] (the PCI address, the driver found, whether
//! it had a netdev, the IOMMU group, the boot id) is made durable (synced) **before the
//! first sysfs write**, and removed only once the function is back on its driver. Unprepare
//! marks it `releasing` (synced) before it starts undoing. At start
//! ([`ClaimService::restore_vfio_bindings`]) a binding whose claim is not prepared (a
//! prepare killed before its record, mid-bind included) or is `releasing` (an unprepare
//! killed half-way) is completed: the function goes back to its driver and the record goes.
//! A binding of a prepared claim from another boot (a reboot put the function back on its
//! driver) is bound again for the claim.
//!
//! The functions bound (by the name their netdev had) are published to the inventory
//! ([`ClaimService::vfio_bound`]): a VF bound for a claim has no netdev, and stays published
//! while it is (DESIGN §2).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::error::ClaimError;
use super::ports::{ClaimSource, ClaimStore, DeviceSource};
use super::record::PreparedClaim;
use super::service::ClaimService;
use super::state::lock;
use super::vfio_cdi;
pub use super::vfio_ports::{VfioBindingStore, VfioPort, VfioPortError, VfioTarget};
use crate::model::device::{AttributeValue, PciAddress};
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
use crate::model::network_config::ResolvedMode;

/// The driver a `vfio` function is bound to.
pub const VFIO_PCI: &str = "vfio-pci";

/// Serde of a [`PciAddress`] as its `dddd:bb:dd.f` text.
mod pci_text {
    use serde::{Deserialize, Deserializer, Serializer};

    use crate::model::device::PciAddress;

    #[expect(
        clippy::trivially_copy_pass_by_ref,
        reason = "serde's `with` hands the field by reference"
    )]
    pub(super) fn serialize<S: Serializer>(pci: &PciAddress, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(pci)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<PciAddress, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// A function bound (or being bound, or being given back) for a claim: durable from before
/// the first sysfs write until it is back on its driver. Keyed by PCI address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfioBinding {
    /// The function (the key).
    #[serde(with = "pci_text")]
    pub pci: PciAddress,
    /// The claim it is bound for.
    pub claim_uid: String,
    /// The published device.
    pub device: String,
    /// Its netdev's name when it was published (kept published under it).
    pub if_name: String,
    /// The driver it had (bound again by name when the kernel's probe picks none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// Whether it had a netdev (the rebind waits for it to come back).
    #[serde(default)]
    pub had_netdev: bool,
    /// Its IOMMU group.
    pub group: u32,
    /// The boot it was bound in: a binding does not survive a reboot.
    pub boot_id: String,
    /// An unprepare started giving it back: a start completes that.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub releasing: bool,
}

impl VfioBinding {
    /// The record key: the PCI address.
    #[must_use]
    pub fn key(&self) -> String {
        self.pci.to_string()
    }
}

/// A prepared device's function bound to `vfio-pci`: what CDI, the status and the device
/// metadata show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedVfio {
    /// The function.
    #[serde(with = "pci_text")]
    pub pci: PciAddress,
    /// Its IOMMU group (`/dev/vfio/<group>`).
    pub group: u32,
}

/// Why a function cannot be bound or given back; shown after "mode \"vfio\": ".
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// The daemon runs without the sysfs port.
    #[error("binding to vfio-pci is not available in this daemon")]
    NoPort,
    /// Device metadata (CDI) is off, so the group device could not reach the pod.
    #[error(
        "the group device reaches the pod through CDI, which is off in this daemon (--cdi-spec-dir \"\")"
    )]
    NoCdi,
    /// The device has no PCI function.
    #[error("the device has no PCI address: only a PCI function can be bound to vfio-pci")]
    NotPci,
    /// sysfs has no such function.
    #[error("there is no PCI device {pci} on this node")]
    NoSuchDevice {
        /// The function.
        pci: PciAddress,
    },
    /// No IOMMU group: the node's IOMMU is off.
    #[error(
        "{pci} has no IOMMU group: the node's IOMMU is off; boot it with intel_iommu=on (Intel) \
         or amd_iommu=on (AMD) on the kernel command line, with VT-d or AMD-Vi enabled in the \
         firmware"
    )]
    NoIommuGroup {
        /// The function.
        pci: PciAddress,
    },
    /// `vfio-pci` is not loaded.
    #[error(
        "the vfio-pci driver is not loaded on this node: run modprobe vfio-pci (and list it in \
         /etc/modules-load.d so it is loaded at boot)"
    )]
    NoVfioPci,
    /// The function shares its IOMMU group.
    #[error(
        "IOMMU group {group} of {pci} also holds {peers}: vfio hands a userspace driver the \
         whole group, so those would go with it; the device needs a group of its own (a slot \
         or root port with ACS)"
    )]
    GroupShared {
        /// The function.
        pci: PciAddress,
        /// Its group.
        group: u32,
        /// The other functions, comma separated.
        peers: String,
    },
    /// A PF with VFs: unbinding its driver removes them.
    #[error("{pci} has {vfs} VFs enabled, which unbinding its driver would remove")]
    PfWithVfs {
        /// The function.
        pci: PciAddress,
        /// Enabled VFs.
        vfs: u32,
    },
    /// Bound for another claim.
    #[error("{pci} is bound to vfio-pci for claim {claim_uid}")]
    TakenBy {
        /// The function.
        pci: PciAddress,
        /// The claim holding it.
        claim_uid: String,
    },
    /// Already on vfio-pci without a record of ours.
    #[error("{pci} is already bound to vfio-pci, not by this driver")]
    BoundElsewhere {
        /// The function.
        pci: PciAddress,
    },
    /// A sysfs step failed.
    #[error(transparent)]
    Port(#[from] VfioPortError),
    /// The CDI spec could not be written or removed.
    #[error(transparent)]
    Cdi(#[from] vfio_cdi::VfioCdiError),
}

/// Why the bindings could not be completed at start.
#[derive(Debug, thiserror::Error)]
pub enum VfioRestoreError {
    /// The store failed.
    #[error("vfio bindings: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The blocking task failed.
    #[error("vfio bindings: the store task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// The functions bound for claims, in memory (the store has them too), and what the
/// inventory is told.
pub struct VfioBindings {
    pub(super) port: Arc<dyn VfioPort>,
    bindings: Mutex<BTreeMap<String, VfioBinding>>,
    bound: watch::Sender<BTreeSet<String>>,
}

impl std::fmt::Debug for VfioBindings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VfioBindings").finish_non_exhaustive()
    }
}

impl VfioBindings {
    /// Bindings through `port`, none known yet ([`ClaimService::restore_vfio_bindings`]
    /// loads them).
    #[must_use]
    pub fn new(port: Arc<dyn VfioPort>) -> Self {
        Self {
            port,
            bindings: Mutex::new(BTreeMap::new()),
            bound: watch::Sender::new(BTreeSet::new()),
        }
    }

    fn get(&self, key: &str) -> Option<VfioBinding> {
        lock(&self.bindings).get(key).cloned()
    }

    fn of_claim(&self, uid: &str) -> Vec<VfioBinding> {
        lock(&self.bindings).values().filter(|b| b.claim_uid == uid).cloned().collect()
    }

    fn set(&self, binding: VfioBinding) {
        lock(&self.bindings).insert(binding.key(), binding);
        self.announce();
    }

    fn forget(&self, key: &str) {
        lock(&self.bindings).remove(key);
        self.announce();
    }

    fn announce(&self) {
        let names: BTreeSet<String> =
            lock(&self.bindings).values().map(|b| b.if_name.clone()).collect();
        self.bound.send_if_modified(|current| {
            let changed = *current != names;
            *current = names;
            changed
        });
    }
}

/// The PCI address a device is published with (`pciAddress`, qualified or not).
#[must_use]
pub fn pci_of(attributes: &BTreeMap<String, AttributeValue>) -> Option<PciAddress> {
    let value = attributes
        .get(&format!("{ATTRIBUTE_DOMAIN}/{}", attr::PCI_ADDRESS))
        .or_else(|| attributes.get(attr::PCI_ADDRESS));
    match value {
        Some(AttributeValue::String(text)) => text.parse().ok(),
        _ => None,
    }
}

/// What blocks a bind of `target` at `pci`, checked before anything is written.
fn refusal(pci: PciAddress, target: &VfioTarget) -> Option<VfioError> {
    if target.driver.as_deref() == Some(VFIO_PCI) {
        return Some(VfioError::BoundElsewhere { pci });
    }
    let Some(group) = target.group else { return Some(VfioError::NoIommuGroup { pci }) };
    if !target.vfio_pci_loaded {
        return Some(VfioError::NoVfioPci);
    }
    if !target.group_peers.is_empty() {
        let peers: Vec<String> = target.group_peers.iter().map(ToString::to_string).collect();
        return Some(VfioError::GroupShared { pci, group, peers: peers.join(", ") });
    }
    if target.enabled_vfs > 0 {
        return Some(VfioError::PfWithVfs { pci, vfs: target.enabled_vfs });
    }
    None
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Binds `vfio` devices through `port` (`host::vfio`); without it such claims fail at
    /// prepare.
    #[must_use]
    pub fn with_vfio_port(mut self, port: Arc<dyn VfioPort>) -> Self {
        self.vfio = Some(Arc::new(VfioBindings::new(port)));
        self
    }

    /// The netdev names of the functions bound to vfio-pci for claims (and being bound or
    /// given back): the inventory keeps them published (DESIGN §2).
    #[must_use]
    pub fn vfio_bound(&self) -> watch::Receiver<BTreeSet<String>> {
        match &self.vfio {
            Some(vfio) => vfio.bound.subscribe(),
            None => watch::Sender::new(BTreeSet::new()).subscribe(),
        }
    }

    /// Every binding known (for `netclaim status` and tests).
    #[must_use]
    pub fn vfio_bindings(&self) -> Vec<VfioBinding> {
        self.vfio
            .as_ref()
            .map(|v| lock(&v.bindings).values().cloned().collect())
            .unwrap_or_default()
    }

    async fn save_binding(&self, binding: VfioBinding) -> Result<(), ClaimError> {
        let store = self.store.clone();
        let saved = binding.clone();
        tokio::task::spawn_blocking(move || store.save_vfio_binding(&saved))
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| ClaimError::Persist(Box::new(e)))?;
        if let Some(vfio) = &self.vfio {
            vfio.set(binding);
        }
        Ok(())
    }

    async fn drop_binding(&self, key: String) -> Result<(), ClaimError> {
        let store = self.store.clone();
        let removed = key.clone();
        tokio::task::spawn_blocking(move || store.remove_vfio_binding(&removed))
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| ClaimError::Persist(Box::new(e)))?;
        if let Some(vfio) = &self.vfio {
            vfio.forget(&key);
        }
        Ok(())
    }

    /// Binds the function of each `vfio` device of `prepared` to vfio-pci (after its VF
    /// settings, [`Self::apply_vf_settings`]): checks, the durable binding, the sysfs steps,
    /// the CDI spec. `pcis` holds each device's published PCI address. On a failure the
    /// bindings made durable stay for the caller's undo ([`Self::release_vfio`]).
    pub(super) async fn bind_vfio(
        &self,
        prepared: &mut PreparedClaim,
        pcis: &[Option<PciAddress>],
    ) -> Result<(), ClaimError> {
        for index in 0..prepared.devices.len() {
            let device = &prepared.devices[index];
            if device.config.mode != ResolvedMode::Vfio {
                continue;
            }
            let fail = |source: VfioError| ClaimError::Vfio {
                request: device.request.clone(),
                device: device.device.clone(),
                source: Box::new(source),
            };
            let Some(vfio) = &self.vfio else { return Err(fail(VfioError::NoPort)) };
            if self.metadata.is_none() {
                return Err(fail(VfioError::NoCdi));
            }
            let Some(pci) = pcis.get(index).copied().flatten() else {
                return Err(fail(VfioError::NotPci));
            };
            let binding = match vfio.get(&pci.to_string()) {
                // An earlier prepare of this claim was undone without giving it back: go on
                // from its record, which knows the driver it had.
                Some(held) if held.claim_uid == prepared.uid => held,
                Some(held) => {
                    return Err(fail(VfioError::TakenBy { pci, claim_uid: held.claim_uid }));
                }
                None => {
                    let target = vfio
                        .port
                        .inspect(pci)
                        .await
                        .map_err(|e| fail(e.into()))?
                        .ok_or_else(|| fail(VfioError::NoSuchDevice { pci }))?;
                    if let Some(refused) = refusal(pci, &target) {
                        return Err(fail(refused));
                    }
                    let binding = VfioBinding {
                        pci,
                        claim_uid: prepared.uid.clone(),
                        device: device.device.clone(),
                        if_name: device.if_name.clone(),
                        driver: target.driver.clone(),
                        had_netdev: target.netdev.is_some(),
                        group: target.group.unwrap_or_default(),
                        boot_id: vfio.port.boot_id().map_err(|e| fail(e.into()))?,
                        releasing: false,
                    };
                    // Durable before the first sysfs write (DESIGN §6).
                    self.save_binding(binding.clone()).await?;
                    binding
                }
            };
            crate::failpoint!("claims.vfio.after_record");
            vfio.port.bind(pci, binding.group).await.map_err(|e| fail(e.into()))?;
            tracing::info!(claim = %prepared.name, %pci, group = binding.group,
                driver = binding.driver.as_deref().unwrap_or("none"), "bound to vfio-pci");
            let driver = self.identity.driver.clone();
            let device = &mut prepared.devices[index];
            device.vfio = Some(PreparedVfio { pci, group: binding.group });
            let id = vfio_cdi::cdi_id(&driver, &prepared.uid, &device.device);
            if !device.cdi_device_ids.contains(&id) {
                device.cdi_device_ids.push(id);
            }
        }
        if let Some(metadata) = self.metadata.clone()
            && prepared.devices.iter().any(|d| d.vfio.is_some())
        {
            let claim = prepared.clone();
            let driver = self.identity.driver.clone();
            tokio::task::spawn_blocking(move || {
                vfio_cdi::write(metadata.files(), metadata.layout().cdi_dir(), &driver, &claim)
            })
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| {
                let device = prepared.devices.iter().find(|d| d.vfio.is_some());
                ClaimError::Vfio {
                    request: device.map(|d| d.request.clone()).unwrap_or_default(),
                    device: device.map(|d| d.device.clone()).unwrap_or_default(),
                    source: Box::new(e.into()),
                }
            })?;
        }
        Ok(())
    }

    /// Gives back every function bound for claim `uid` (an unprepare, or a prepare undone):
    /// each binding marked `releasing` (synced), its function rebound to the driver it had,
    /// its record removed; every binding is tried, the first failure returned (kubelet's
    /// retry tries again). Removes the claim's CDI spec.
    pub(super) async fn release_vfio(&self, uid: &str) -> Result<(), ClaimError> {
        let Some(vfio) = &self.vfio else { return Ok(()) };
        let mut first_error = None;
        for binding in vfio.of_claim(uid) {
            if let Err(err) = self.give_back(binding).await {
                first_error.get_or_insert(err);
            }
        }
        if let Some(metadata) = self.metadata.clone() {
            let (driver, uid) = (self.identity.driver.clone(), uid.to_owned());
            let removed = tokio::task::spawn_blocking(move || {
                vfio_cdi::remove(metadata.files(), metadata.layout().cdi_dir(), &driver, &uid)
            })
            .await
            .map_err(ClaimError::Task)?;
            if let Err(err) = removed {
                first_error.get_or_insert(ClaimError::Vfio {
                    request: String::new(),
                    device: String::new(),
                    source: Box::new(err.into()),
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// One function back on its driver, then its record removed. A binding of another boot is
    /// only removed: the reboot gave the function back to its driver already.
    async fn give_back(&self, mut binding: VfioBinding) -> Result<(), ClaimError> {
        let Some(vfio) = &self.vfio else { return Ok(()) };
        let fail = |source: VfioError, b: &VfioBinding| ClaimError::Vfio {
            request: String::new(),
            device: b.device.clone(),
            source: Box::new(source),
        };
        if !binding.releasing {
            binding.releasing = true;
            self.save_binding(binding.clone()).await?;
        }
        crate::failpoint!("claims.vfio.after_releasing");
        let boot = vfio.port.boot_id().map_err(|e| fail(e.into(), &binding))?;
        if boot == binding.boot_id {
            vfio.port
                .rebind(binding.pci, binding.driver.as_deref(), binding.had_netdev)
                .await
                .map_err(|e| fail(e.into(), &binding))?;
            tracing::info!(pci = %binding.pci, driver = binding.driver.as_deref().unwrap_or("none"),
                claim_uid = %binding.claim_uid, "given back to its driver");
        } else {
            tracing::info!(pci = %binding.pci, claim_uid = %binding.claim_uid,
                "bound to vfio-pci in another boot: the reboot gave it back to its driver");
        }
        self.drop_binding(binding.key()).await
    }

    /// At start, before kubelet is served: loads the bindings and completes those whose claim
    /// is not prepared or whose unprepare did not finish (back to their driver, record
    /// removed); binds again, for their claim, the functions of prepared claims bound in
    /// another boot; puts the claims' CDI specs right. A function that cannot be given back
    /// now keeps its record for the next start and is logged. Returns how many were given
    /// back.
    pub async fn restore_vfio_bindings(&self) -> Result<usize, VfioRestoreError> {
        let Some(vfio) = &self.vfio else { return Ok(0) };
        let store = self.store.clone();
        let bindings = tokio::task::spawn_blocking(move || store.load_vfio_bindings())
            .await
            .map_err(VfioRestoreError::Task)?
            .map_err(|e| VfioRestoreError::Store(Box::new(e)))?;
        for binding in &bindings {
            vfio.set(binding.clone());
        }
        let mut given_back = 0;
        for binding in bindings {
            let prepared = lock(&self.state).prepared.contains_key(&binding.claim_uid);
            if prepared && !binding.releasing {
                self.bind_again_after_reboot(binding).await;
                continue;
            }
            let (pci, claim_uid) = (binding.pci, binding.claim_uid.clone());
            match self.give_back(binding).await {
                Ok(()) => {
                    given_back += 1;
                    tracing::info!(%pci, %claim_uid,
                        "gave back a function a prepare or unprepare left bound to vfio-pci");
                }
                Err(err) => tracing::warn!(%pci, %claim_uid, error = %err,
                    "giving back a function left bound to vfio-pci; kept for the next start"),
            }
        }
        if let Some(metadata) = self.metadata.clone() {
            let claims: Vec<PreparedClaim> = lock(&self.state).prepared.values().cloned().collect();
            let driver = self.identity.driver.clone();
            let restored = tokio::task::spawn_blocking(move || {
                vfio_cdi::restore(metadata.files(), metadata.layout().cdi_dir(), &driver, &claims)
            })
            .await
            .map_err(VfioRestoreError::Task)?;
            if let Err(err) = restored {
                tracing::warn!(error = %err, "putting the vfio CDI specs right");
            }
        }
        Ok(given_back)
    }

    /// A prepared claim's binding: kept as it is in the same boot; after a reboot (the
    /// function is on its boot driver again) bound again with the new boot's driver and id.
    async fn bind_again_after_reboot(&self, mut binding: VfioBinding) {
        let Some(vfio) = &self.vfio else { return };
        let Ok(boot) = vfio.port.boot_id() else { return };
        if boot == binding.boot_id {
            return;
        }
        let pci = binding.pci;
        let target = match vfio.port.inspect(pci).await {
            Ok(Some(target)) => target,
            Ok(None) => {
                tracing::warn!(%pci, claim_uid = %binding.claim_uid,
                    "a prepared vfio claim's function is gone after a reboot");
                return;
            }
            Err(err) => {
                tracing::warn!(%pci, error = %err, "inspecting a vfio claim's function after a reboot");
                return;
            }
        };
        if target.driver.as_deref() != Some(VFIO_PCI) {
            if let Some(refused) = refusal(pci, &target) {
                tracing::warn!(%pci, error = %refused, "binding a vfio claim's function again after a reboot");
                return;
            }
            binding.driver = target.driver.clone();
            binding.had_netdev = target.netdev.is_some();
        }
        if target.group != Some(binding.group) {
            tracing::warn!(%pci, recorded = binding.group, now = ?target.group,
                "the function's IOMMU group changed at the reboot: the claim's CDI spec names the old one; unprepare the claim");
        }
        binding.boot_id = boot;
        if let Err(err) = self.save_binding(binding.clone()).await {
            tracing::warn!(%pci, error = %err, "recording a vfio binding after a reboot");
            return;
        }
        match vfio.port.bind(pci, binding.group).await {
            Ok(()) => tracing::info!(%pci, claim_uid = %binding.claim_uid,
                "bound to vfio-pci again for its prepared claim after a reboot"),
            Err(err) => {
                tracing::warn!(%pci, error = %err, "binding a vfio claim's function again after a reboot");
            }
        }
    }
}

/// `claims` without their `vfio` devices, and without the claims left with none: what the
/// attach plans (a vfio device has no interface in the pod).
#[must_use]
pub fn with_interfaces(claims: Vec<PreparedClaim>) -> Vec<PreparedClaim> {
    claims
        .into_iter()
        .filter_map(|mut claim| {
            claim.devices.retain(|d| d.config.mode != ResolvedMode::Vfio);
            (!claim.devices.is_empty()).then_some(claim)
        })
        .collect()
}
