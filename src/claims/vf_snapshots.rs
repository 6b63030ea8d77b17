//! The durable snapshot of a VF's settings taken before a `sriov-vf` prepare changes them
//! (DESIGN §6: `kill -9` at any instant loses nothing).
//!
//! The prepared claim keeps the values a VF had before the claim, but it is committed only
//! after the settings are on the PF. Killed in between, the daemon would forget them: the
//! repeated prepare would read the claim's own settings as "before", and unprepare would
//! leave trust, MAC and VLAN to the next claim of the VF. So the values read are committed
//! (synced) as a [`VfSnapshot`] before the first change is sent, and the snapshot lives until
//! the claim's record holds them:
//! - the claim's commit removes it in the same batch (the store's `save_prepared`);
//! - a failed prepare removes it once the VF is set back, and so does an unprepare (a no-op
//!   by then, without a disk write);
//! - a repeated prepare of a VF that still has one takes the values from it, not from the PF;
//! - at start, [`ClaimService::restore_unrecorded_vfs`] sets each VF that has one and no
//!   prepared claim back to it and removes it (kubelet then prepares the claim again); a
//!   snapshot of another boot is removed without being set back (a reboot reset the VF).
//!
//! Snapshots are keyed by the VF's PCI address and carry the boot id (state format 3); the
//! PF name and index are looked up from the address when the VF is set back.
//!
//! Only `sriov-vf` prepares pay the extra `fdatasync`; other modes never touch these records.

pub use super::ports::VfSnapshotStore;
use serde::{Deserialize, Serialize};

use super::state::lock;
use super::vf::{self, VfPort, VfRef, VfState};
use super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use crate::model::device::PciAddress;

/// A VF's settings as read before a prepare changed them, and the claim that prepare was for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfSnapshot {
    /// The VF on its PF as named at the prepare (the key of records before version 2).
    #[serde(flatten)]
    pub vf: VfRef,
    /// The VF's PCI address (the record key); absent in records before version 2.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "super::vf::pci_serde")]
    pub pci: Option<PciAddress>,
    /// The boot the values were read in; absent in records before version 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// The claim whose prepare took it.
    pub claim_uid: String,
    /// The settings before the claim.
    pub before: VfState,
}

impl VfSnapshot {
    /// The record key: the PCI address, or `<pf>/<index>` for a record before version 2.
    #[must_use]
    pub fn key(&self) -> String {
        snapshot_key(self.pci, &self.vf)
    }
}

/// The snapshot key of a VF: its PCI address, or `<pf>/<index>` when it has none (records
/// before state format 3). The two never collide: an interface name holds no `:`.
#[must_use]
pub fn snapshot_key(pci: Option<PciAddress>, vf: &VfRef) -> String {
    match pci {
        Some(pci) => pci.to_string(),
        None => format!("{}/{}", vf.pf, vf.index),
    }
}

/// Why the VFs of unrecorded prepares could not be checked at start.
#[derive(Debug, thiserror::Error)]
pub enum VfSnapshotError {
    /// The store failed.
    #[error("VF snapshots: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The blocking task doing the store I/O failed.
    #[error("VF snapshots: the store task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Makes the settings `found` on the VF at `pci` durable before a prepare of `claim_uid`
    /// changes them, and returns the settings to keep as "before": those of a snapshot of
    /// this boot still there (an earlier prepare changed the VF and was killed before
    /// recording its claim, so the PF now shows that prepare's settings), else `found`.
    pub(super) async fn hold_vf_snapshot(
        &self,
        claim_uid: &str,
        vf: &VfRef,
        (pci, boot_id): (PciAddress, &str),
        found: VfState,
    ) -> Result<VfState, ClaimError> {
        let store = lock(&self.state).ipam.store().clone();
        let snapshot = VfSnapshot {
            vf: vf.clone(),
            pci: Some(pci),
            boot_id: Some(boot_id.to_owned()),
            claim_uid: claim_uid.to_owned(),
            before: found,
        };
        let held = tokio::task::spawn_blocking(move || {
            let snapshot = match store.vf_snapshot(&snapshot.key())? {
                // A snapshot of another boot: the reboot reset the VF, `found` is the boot's.
                Some(kept) if kept.boot_id != snapshot.boot_id => snapshot,
                Some(kept) if kept.claim_uid == snapshot.claim_uid => return Ok(kept.before),
                Some(kept) => VfSnapshot { before: kept.before, ..snapshot },
                None => snapshot,
            };
            store.save_vf_snapshot(&snapshot).map(|()| snapshot.before)
        })
        .await
        .map_err(ClaimError::Task)?
        .map_err(|e| ClaimError::Persist(Box::new(e)))?;
        if held != found {
            tracing::info!(%vf, %pci, claim_uid,
                "VF settings kept from a prepare that did not complete are its settings before the claim");
        }
        Ok(held)
    }

    /// Removes the snapshots with the keys `keys` (their VFs are set back, or their claim's
    /// record holds the values); writes nothing when none has one.
    pub(super) async fn drop_vf_snapshots(&self, keys: Vec<String>) -> Result<(), ClaimError> {
        if keys.is_empty() {
            return Ok(());
        }
        let store = lock(&self.state).ipam.store().clone();
        tokio::task::spawn_blocking(move || store.remove_vf_snapshots(&keys))
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| ClaimError::Persist(Box::new(e)))
    }

    /// At start, before kubelet is served. First the VF records of a release before state
    /// format 3 get their PCI address (`migrate_vf_records`). Then every VF with a
    /// snapshot and no prepared claim was changed by a prepare that was killed before its
    /// claim was recorded: each is set back to its snapshot through the VF port (found by
    /// PCI address) and the snapshot removed; kubelet's repeated prepare then starts from the
    /// VF as it was. A snapshot of another boot (or of a release before format 3, whose boot
    /// nobody knows) is removed without being set back: the reboot reset the VF and the boot
    /// configured it since. A snapshot of a VF that a prepared claim holds is stale (its
    /// record has the values) and is only removed. A VF that cannot be set back now keeps its
    /// snapshot, so the claim's repeated prepare still records the right values. Returns how
    /// many VFs were set back.
    pub async fn restore_unrecorded_vfs(&self) -> Result<usize, VfSnapshotError> {
        if let Some(port) = &self.vf_port {
            self.migrate_vf_records(port.as_ref()).await?;
        }
        let store = lock(&self.state).ipam.store().clone();
        let snapshots = tokio::task::spawn_blocking(move || store.load_vf_snapshots())
            .await
            .map_err(VfSnapshotError::Task)?
            .map_err(|e| VfSnapshotError::Store(Box::new(e)))?;
        let mut done = Vec::new();
        let mut restored = 0;
        for snapshot in snapshots {
            let key = snapshot.key();
            let recorded = lock(&self.state).prepared.values().any(|claim| {
                claim
                    .devices
                    .iter()
                    .any(|d| d.vf.as_ref().is_some_and(|v| snapshot_key(v.pci, &v.vf) == key))
            });
            if recorded {
                done.push(key);
                continue;
            }
            let Some(port) = &self.vf_port else {
                tracing::warn!(vf = %snapshot.vf, claim_uid = %snapshot.claim_uid,
                    "a prepare changed this VF and did not complete, and VF settings are not available in this daemon: left as is");
                continue;
            };
            match restorable(port.as_ref(), snapshot.pci, snapshot.boot_id.as_deref(), &snapshot.vf)
                .await
            {
                Ok(None) => done.push(key),
                Ok(Some(now)) => match vf::restore(port.as_ref(), &now, &snapshot.before).await {
                    Ok(()) => {
                        tracing::info!(vf = %now, claim_uid = %snapshot.claim_uid,
                            "VF set back as found before a prepare that did not complete");
                        restored += 1;
                        done.push(key);
                    }
                    Err(err) => tracing::warn!(vf = %now, claim_uid = %snapshot.claim_uid,
                        error = %err, "setting back a VF a prepare changed and did not complete; its repeated prepare keeps the values found before"),
                },
                Err(err) => tracing::warn!(vf = %snapshot.vf, claim_uid = %snapshot.claim_uid,
                    error = %err, "finding a VF a prepare changed and did not complete; kept for the next start"),
            }
        }
        if !done.is_empty() {
            let store = lock(&self.state).ipam.store().clone();
            tokio::task::spawn_blocking(move || store.remove_vf_snapshots(&done))
                .await
                .map_err(VfSnapshotError::Task)?
                .map_err(|e| VfSnapshotError::Store(Box::new(e)))?;
        }
        Ok(restored)
    }
}

/// Where to set back values read on the VF at `pci` in boot `boot_id`: the VF's place now,
/// or `None` (logged) when they must not be set back: no PCI address (a record of a release
/// before format 3 that could not be identified), another boot (the reboot reset the VF and
/// the boot configured it since: those are the values it keeps), or no such VF any more.
pub(super) async fn restorable(
    port: &dyn VfPort,
    pci: Option<PciAddress>,
    boot_id: Option<&str>,
    named: &VfRef,
) -> Result<Option<VfRef>, vf::VfError> {
    let Some(pci) = pci else {
        tracing::warn!(vf = %named,
            "VF values recorded by a release before state format 3 and never identified by PCI address: not set back");
        return Ok(None);
    };
    let boot = port.boot_id().map_err(|source| vf::VfError::BootId { source })?;
    if boot_id != Some(boot.as_str()) {
        tracing::info!(vf = %named, %pci, recorded_boot = boot_id.unwrap_or("unknown"), boot,
            "VF values read before the claim are of another boot: not set back, the VF keeps what this boot configured");
        return Ok(None);
    }
    let what = || format!("the VF at PCI {pci}");
    match port.locate(pci).await {
        Ok(Some(now)) => Ok(Some(now)),
        Ok(None) => {
            tracing::warn!(vf = %named, %pci, "the VF is gone (SR-IOV disabled or fewer VFs): nothing to set back");
            Ok(None)
        }
        Err(source) => Err(vf::VfError::Locate { what: what(), source }),
    }
}
