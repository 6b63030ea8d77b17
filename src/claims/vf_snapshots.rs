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
//!   prepared claim back to it and removes it (kubelet then prepares the claim again).
//!
//! Only `sriov-vf` prepares pay the extra `fdatasync`; other modes never touch these records.

pub use super::ports::VfSnapshotStore;
use serde::{Deserialize, Serialize};

use super::state::lock;
use super::vf::{self, VfRef, VfState};
use super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};

/// A VF's settings as read before a prepare changed them, and the claim that prepare was for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfSnapshot {
    /// The VF on its PF (the record key: `<pf>/<index>`).
    #[serde(flatten)]
    pub vf: VfRef,
    /// The claim whose prepare took it.
    pub claim_uid: String,
    /// The settings before the claim.
    pub before: VfState,
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
    /// Makes the settings `found` on `vf` durable before a prepare of `claim_uid` changes
    /// them, and returns the settings to keep as "before": those of a snapshot still there
    /// (an earlier prepare changed the VF and was killed before recording its claim, so the
    /// PF now shows that prepare's settings), else `found`.
    pub(super) async fn hold_vf_snapshot(
        &self,
        claim_uid: &str,
        vf: &VfRef,
        found: VfState,
    ) -> Result<VfState, ClaimError> {
        let store = lock(&self.state).ipam.store().clone();
        let snapshot =
            VfSnapshot { vf: vf.clone(), claim_uid: claim_uid.to_owned(), before: found };
        let held = tokio::task::spawn_blocking(move || {
            let snapshot = match store.vf_snapshot(&snapshot.vf)? {
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
            tracing::info!(%vf, claim_uid,
                "VF settings kept from a prepare that did not complete are its settings before the claim");
        }
        Ok(held)
    }

    /// Removes the snapshots of `vfs` (their VFs are set back, or their claim's record
    /// holds the values); writes nothing when none has one.
    pub(super) async fn drop_vf_snapshots(&self, vfs: Vec<VfRef>) -> Result<(), ClaimError> {
        if vfs.is_empty() {
            return Ok(());
        }
        let store = lock(&self.state).ipam.store().clone();
        tokio::task::spawn_blocking(move || store.remove_vf_snapshots(&vfs))
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| ClaimError::Persist(Box::new(e)))
    }

    /// At start, before kubelet is served: every VF with a snapshot and no prepared claim
    /// was changed by a prepare that was killed before its claim was recorded. Sets each
    /// back to its snapshot through the VF port and removes the snapshot; kubelet's repeated
    /// prepare then starts from the VF as it was. A snapshot of a VF that a prepared claim
    /// holds is stale (its record has the values) and is only removed. A VF that cannot be
    /// set back now keeps its snapshot, so the claim's repeated prepare still records the
    /// right values. Returns how many VFs were set back.
    pub async fn restore_unrecorded_vfs(&self) -> Result<usize, VfSnapshotError> {
        let store = lock(&self.state).ipam.store().clone();
        let snapshots = tokio::task::spawn_blocking(move || store.load_vf_snapshots())
            .await
            .map_err(VfSnapshotError::Task)?
            .map_err(|e| VfSnapshotError::Store(Box::new(e)))?;
        let mut done = Vec::new();
        let mut restored = 0;
        for snapshot in snapshots {
            let recorded = lock(&self.state).prepared.values().any(|claim| {
                claim.devices.iter().any(|d| d.vf.as_ref().is_some_and(|v| v.vf == snapshot.vf))
            });
            if recorded {
                done.push(snapshot.vf);
                continue;
            }
            let Some(port) = &self.vf_port else {
                tracing::warn!(vf = %snapshot.vf, claim_uid = %snapshot.claim_uid,
                    "a prepare changed this VF and did not complete, and VF settings are not available in this daemon: left as is");
                continue;
            };
            match vf::restore(port.as_ref(), &snapshot.vf, &snapshot.before).await {
                Ok(()) => {
                    tracing::info!(vf = %snapshot.vf, claim_uid = %snapshot.claim_uid,
                        "VF set back as found before a prepare that did not complete");
                    restored += 1;
                    done.push(snapshot.vf);
                }
                Err(err) => tracing::warn!(vf = %snapshot.vf, claim_uid = %snapshot.claim_uid,
                    error = %err, "setting back a VF a prepare changed and did not complete; its repeated prepare keeps the values found before"),
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
