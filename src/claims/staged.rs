//! A staged claim: what preparing one claim holds until its call's commit (its addresses in
//! memory and its pending record, the VF settings it applied, its static `PodNetwork`
//! reservations in the API), given back in one place when the claim does not become
//! prepared.

use super::commit::{ReadyClaim, Reserved};
use super::ports::{ClaimSource, ClaimStore, DeviceSource};
use super::record::PreparedClaim;
use super::service::ClaimService;
use super::state::lock;
use crate::ipam::{self, Lease};
use crate::model::ClaimRef;

/// What one claim's staging holds. [`StagedClaim::committed`] keeps it (the claim is
/// prepared); [`StagedClaim::undo`] gives all of it back.
///
/// Dropped without either (the call's future was dropped: kubelet cancelled the request,
/// or the daemon is stopping), the in-memory part is given back at once so no address stays
/// held for a claim that will never be committed. The rest is left to the recovery a crash
/// would get: a VF's durable snapshot is set back at the next start (`vf_snapshots`), and a
/// static reservation without a prepared claim is deleted by the next unprepare or the block
/// upkeep.
#[must_use = "a staged claim is undone unless committed"]
pub(super) struct StagedClaim<'s, R, D, S: ClaimStore> {
    service: &'s ClaimService<R, D, S>,
    claim: ClaimRef,
    /// The claim as staged, whose devices carry the VF settings applied so far.
    prepared: PreparedClaim,
    /// Every lease of the claim (what the commit records).
    leases: Vec<Lease>,
    /// The leases new in this staging (what an undo forgets).
    new_leases: Vec<Lease>,
    /// Static `PodNetwork` reservations created in the API for this claim.
    reservations: Vec<ipam::OwnedBlock>,
    /// Whether anything is still held.
    armed: bool,
    /// Handed to the call's commit, which runs on a blocking thread and may record the claim
    /// even when the call's future is dropped meanwhile: then nothing may be given back in
    /// memory, or the recorded leases would be handed out again.
    committing: bool,
}

impl<'s, R: ClaimSource, D: DeviceSource, S: ClaimStore> StagedClaim<'s, R, D, S> {
    /// Takes over a claim whose addresses `reserved` holds (the claim is pending).
    pub(super) fn new(
        service: &'s ClaimService<R, D, S>,
        claim: &ClaimRef,
        reserved: Reserved,
    ) -> Self {
        let Reserved { prepared, leases, new_leases, .. } = reserved;
        Self {
            service,
            claim: claim.clone(),
            prepared,
            leases,
            new_leases,
            reservations: Vec::new(),
            armed: true,
            committing: false,
        }
    }

    /// The claim this staging is for.
    pub(super) fn claim(&self) -> &ClaimRef {
        &self.claim
    }

    /// The claim's record as staged (VF settings are recorded into its devices).
    pub(super) fn prepared_mut(&mut self) -> &mut PreparedClaim {
        &mut self.prepared
    }

    /// Records static reservations created in the API for this claim.
    pub(super) fn hold_reservations(&mut self, created: Vec<ipam::OwnedBlock>) {
        self.reservations.extend(created);
    }

    /// What the call's commit needs of this claim; from now on a drop gives nothing back
    /// (the commit may record the claim), only [`Self::undo`] after a failed commit does.
    pub(super) fn ready(&mut self) -> ReadyClaim {
        self.committing = true;
        ReadyClaim {
            claim: self.claim.clone(),
            prepared: self.prepared.clone(),
            leases: self.leases.clone(),
            reservations: self.reservations.clone(),
        }
    }

    /// The claim was committed and is prepared: everything it holds stays.
    pub(super) fn committed(mut self) {
        self.armed = false;
    }

    /// Gives back what the staging holds, in the order it was taken the other way round:
    /// the addresses and pending record (at once, under the state lock), then the VF
    /// settings, then the static reservations in the API. A claim that became prepared
    /// meanwhile (a commit whose task failed after recording it) is left as it is: its
    /// record owns all of it.
    pub(super) async fn undo(mut self) {
        self.armed = false;
        if !self.release_in_memory() {
            return;
        }
        // Nothing of this claim was recorded: the device's ethtool values and the VF go back
        // to what they were.
        if let Err(err) = self.service.restore_ethtool_settings(&self.prepared).await {
            tracing::warn!(claim = %self.claim, error = %err,
                "setting ethtool values back after a failed prepare; the snapshot is kept for the next start");
        }
        if let Err(err) = self.service.restore_vf_settings(&self.prepared).await {
            tracing::warn!(claim = %self.claim, error = %err,
                "setting a VF back after a failed prepare; its snapshot is kept for the next start");
        }
        if let Err(err) = self.service.release_vfio(&self.claim.uid).await {
            tracing::warn!(claim = %self.claim, error = %err,
                "giving a function back from vfio-pci after a failed prepare; its binding is kept for the next start");
        }
        self.service.drop_reservations(&self.reservations).await;
    }
}

impl<R, D, S: ClaimStore> StagedClaim<'_, R, D, S> {
    /// Forgets the pending record and the new leases; `false` when the claim is prepared
    /// (nothing is given back then).
    fn release_in_memory(&self) -> bool {
        let mut state = lock(&self.service.state);
        if state.prepared.contains_key(&self.claim.uid) {
            return false;
        }
        state.remove_pending(&self.claim.uid);
        state.ipam.forget_in_memory(&self.new_leases);
        true
    }
}

impl<R, D, S: ClaimStore> Drop for StagedClaim<'_, R, D, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if self.committing {
            // The commit may still record the claim: its addresses stay held (in memory
            // until the daemon restarts, which releases leases without a recorded claim).
            tracing::warn!(claim = %self.claim,
                "prepare abandoned during its commit: its addresses stay held until the claim is recorded or the daemon restarts");
            return;
        }
        if !self.release_in_memory() {
            return;
        }
        let vfs = self.prepared.devices.iter().filter(|d| d.vf.is_some()).count();
        tracing::warn!(claim = %self.claim, vfs, reservations = self.reservations.len(),
            "prepare abandoned: addresses given back; VF settings and reservations are left to \
             the recovery at the next start and the block upkeep");
    }
}
