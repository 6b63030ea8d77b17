//! ethtool snapshots in the store (`crate::claims::ethtool_settings`): one record per host
//! interface, written synced before a prepare changes the device's ethtool values and
//! removed in the batch that records its claim.

use std::sync::Arc;

use super::{Batch, Record, Store, StoreError};
use crate::claims::PreparedClaim;
use crate::claims::ethtool_settings::{EthtoolSnapshot, EthtoolSnapshotStore};

impl Record for EthtoolSnapshot {
    const KIND: &'static str = "ethtool-snapshots";
    const VERSION: u32 = 1;

    fn migrate(from: u32, _data: serde_json::Value) -> Result<serde_json::Value, String> {
        Err(format!("no migration from version {from}"))
    }
}

/// Adds to `batch` the removal of the snapshots of `claim`'s devices (its record now holds
/// what they kept); nothing for a claim without `ethtool`.
pub(super) fn add_ethtool_snapshot_removals(
    store: &Store,
    batch: &mut Batch,
    claim: &PreparedClaim,
) -> Result<(), StoreError> {
    for device in &claim.devices {
        let Some(ethtool) = &device.ethtool else { continue };
        if ethtool.before.is_some() && store.get::<EthtoolSnapshot>(&ethtool.if_name)?.is_some() {
            batch.remove::<EthtoolSnapshot>(&ethtool.if_name)?;
        }
    }
    Ok(())
}

impl EthtoolSnapshotStore for Arc<Store> {
    fn load_ethtool_snapshots(&self) -> Result<Vec<EthtoolSnapshot>, StoreError> {
        self.load_all::<EthtoolSnapshot>()?
            .into_iter()
            .map(|(key, snapshot)| {
                if key == snapshot.if_name {
                    Ok(snapshot)
                } else {
                    Err(StoreError::KeyMismatch { kind: EthtoolSnapshot::KIND, key })
                }
            })
            .collect()
    }

    fn ethtool_snapshot(&self, if_name: &str) -> Result<Option<EthtoolSnapshot>, StoreError> {
        self.get::<EthtoolSnapshot>(if_name)
    }

    fn save_ethtool_snapshot(&self, snapshot: &EthtoolSnapshot) -> Result<(), StoreError> {
        self.put(&snapshot.if_name, snapshot)
    }

    fn remove_ethtool_snapshots(&self, if_names: &[String]) -> Result<(), StoreError> {
        let mut batch = Batch::new();
        for name in if_names {
            if self.get::<EthtoolSnapshot>(name)?.is_some() {
                batch.remove::<EthtoolSnapshot>(name)?;
            }
        }
        if batch.is_empty() {
            return Ok(());
        }
        self.commit(batch)
    }
}
