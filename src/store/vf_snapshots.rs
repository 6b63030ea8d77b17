//! VF snapshots in the store (`crate::claims::vf_snapshots`): one record per VF, keyed by
//! the VF's PCI address (records of version 1, before state format 3: `<pf>/<index>`),
//! written synced before a `sriov-vf` prepare changes the VF and removed in the batch that
//! records its claim.

use std::sync::Arc;

use super::{Batch, Record, Store, StoreError};
use crate::claims::PreparedClaim;
use crate::claims::vf_snapshots::{VfSnapshot, VfSnapshotStore, snapshot_key};

impl Record for VfSnapshot {
    const KIND: &'static str = "vf-snapshots";
    /// 2: `pci` (the key) and `bootId`. A version-1 record lacks both and keeps its
    /// `<pf>/<index>` key: its values are of a boot nobody knows, so they are never set back
    /// (`ClaimService::restore_unrecorded_vfs` removes it).
    const VERSION: u32 = 2;

    fn migrate(from: u32, data: serde_json::Value) -> Result<serde_json::Value, String> {
        match from {
            // The new fields are optional: a version-1 record reads as one without them.
            1 => Ok(data),
            _ => Err(format!("no migration from version {from}")),
        }
    }
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
        let key = snapshot_key(done.pci, &done.vf);
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
                if stored_key == snapshot.key() {
                    Ok(snapshot)
                } else {
                    Err(StoreError::KeyMismatch { kind: VfSnapshot::KIND, key: stored_key })
                }
            })
            .collect()
    }

    fn vf_snapshot(&self, key: &str) -> Result<Option<VfSnapshot>, StoreError> {
        self.get::<VfSnapshot>(key)
    }

    fn save_vf_snapshot(&self, snapshot: &VfSnapshot) -> Result<(), StoreError> {
        self.put(&snapshot.key(), snapshot)
    }

    fn remove_vf_snapshots(&self, keys: &[String]) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        for key in keys {
            if self.get::<VfSnapshot>(key)?.is_some() {
                batch.remove::<VfSnapshot>(key)?;
            }
        }
        self.commit(batch)
    }
}
