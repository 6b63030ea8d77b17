//! VF snapshots in the store (`crate::claims::vf_snapshots`): one record per VF, keyed
//! `<pf>/<index>`, written synced before a `sriov-vf` prepare changes the VF and removed in
//! the batch that records its claim.
//!
//! A kind added after the journal format 2 without a format bump: a release before it keeps
//! the records it does not know through compaction and never reads them, which is what it
//! did before (it had no snapshot), so it need not refuse the journal.

use std::sync::Arc;

use super::{Batch, Record, Store, StoreError};
use crate::claims::PreparedClaim;
use crate::claims::vf::VfRef;
use crate::claims::vf_snapshots::{VfSnapshot, VfSnapshotStore};

impl Record for VfSnapshot {
    const KIND: &'static str = "vf-snapshots";
    const VERSION: u32 = 1;
}

/// The record key of `vf`. Interface names hold no `/`, so keys are unique.
fn key(vf: &VfRef) -> String {
    format!("{}/{}", vf.pf, vf.index)
}

/// Adds to `batch` the removal of the snapshots of `claim`'s VFs (its record now holds
/// what they kept); nothing for a claim without a VF.
pub(super) fn add_vf_snapshot_removals(
    store: &Store,
    batch: &mut Batch,
    claim: &PreparedClaim,
) -> Result<(), StoreError> {
    for device in &claim.devices {
        let Some(done) = &device.vf else { continue };
        let key = key(&done.vf);
        if store.get::<VfSnapshot>(&key)?.is_some() {
            batch.remove::<VfSnapshot>(&key)?;
        }
    }
    Ok(())
}

impl VfSnapshotStore for Arc<Store> {
    fn load_vf_snapshots(&self) -> Result<Vec<VfSnapshot>, StoreError> {
        self.load_all::<VfSnapshot>()?
            .into_iter()
            .map(|(stored_key, snapshot)| {
                if stored_key == key(&snapshot.vf) {
                    Ok(snapshot)
                } else {
                    Err(StoreError::KeyMismatch { kind: VfSnapshot::KIND, key: stored_key })
                }
            })
            .collect()
    }

    fn vf_snapshot(&self, vf: &VfRef) -> Result<Option<VfSnapshot>, StoreError> {
        self.get::<VfSnapshot>(&key(vf))
    }

    fn save_vf_snapshot(&self, snapshot: &VfSnapshot) -> Result<(), StoreError> {
        self.put(&key(&snapshot.vf), snapshot)
    }

    fn remove_vf_snapshots(&self, vfs: &[VfRef]) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        for vf in vfs {
            let key = key(vf);
            if self.get::<VfSnapshot>(&key)?.is_some() {
                batch.remove::<VfSnapshot>(&key)?;
            }
        }
        self.commit(batch)
    }
}
