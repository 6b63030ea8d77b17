//! vfio bindings in the store (`crate::claims::vfio`): one record per PCI function bound to
//! vfio-pci for a claim, written synced before the first sysfs write and removed once the
//! function is back on its driver.

use std::sync::Arc;

use super::{Batch, Record, Store, StoreError};
use crate::claims::vfio::{VfioBinding, VfioBindingStore};

impl Record for VfioBinding {
    const KIND: &'static str = "vfio-bindings";
    const VERSION: u32 = 1;

    fn migrate(from: u32, _data: serde_json::Value) -> Result<serde_json::Value, String> {
        Err(format!("no migration from version {from}"))
    }
}

impl VfioBindingStore for Arc<Store> {
    fn load_vfio_bindings(&self) -> Result<Vec<VfioBinding>, StoreError> {
        self.load_all::<VfioBinding>()?
            .into_iter()
            .map(|(stored_key, binding)| {
                if stored_key == binding.key() {
                    Ok(binding)
                } else {
                    Err(StoreError::KeyMismatch { kind: VfioBinding::KIND, key: stored_key })
                }
            })
            .collect()
    }

    fn save_vfio_binding(&self, binding: &VfioBinding) -> Result<(), StoreError> {
        self.put(&binding.key(), binding)
    }

    fn remove_vfio_binding(&self, key: &str) -> Result<(), StoreError> {
        if self.get::<VfioBinding>(key)?.is_none() {
            return Ok(());
        }
        let mut batch = Batch::new();
        batch.remove::<VfioBinding>(key)?;
        self.commit(batch)
    }
}
