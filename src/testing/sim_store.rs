//! The journal store on a simulated disk (`store::sim_disk`: a page cache in front of durable
//! storage, power loss that keeps only what was synced), for tests that run whole claim
//! services on it and crash them at any disk operation (the IPAM simulation).

use std::path::PathBuf;
use std::sync::Arc;

use crate::store::sim_disk::SimDisk;
use crate::store::{Store, StoreError};

/// One node's simulated disk; clones share it.
#[derive(Debug, Clone)]
pub struct SimStoreDisk {
    disk: SimDisk,
}

impl SimStoreDisk {
    /// An empty disk; `seed` drives how much of the unsynced bytes survive a power loss.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        SimStoreDisk { disk: SimDisk::new(seed) }
    }

    /// Opens (or reopens after [`Self::power_loss`]) the store at `/state` on this disk.
    pub fn open(&self) -> Result<Store, StoreError> {
        Store::open_on(Arc::new(self.disk.clone()), PathBuf::from("/state"))
    }

    /// Disk operations made so far.
    #[must_use]
    pub fn ops(&self) -> u64 {
        self.disk.ops()
    }

    /// The power goes off at the `after`-th disk operation from now (1: the next): that call
    /// and every later one fail with EIO and change nothing.
    pub fn cut_power_after(&self, after: u64) {
        self.disk.cut_power_at(self.disk.ops() + after.max(1));
    }

    /// Forgets a power cut not reached yet (the process was killed first; the machine
    /// stays on).
    pub fn cancel_power_cut(&self) {
        self.disk.cancel_power_cut();
    }

    /// Whether the power is off.
    #[must_use]
    pub fn powered_off(&self) -> bool {
        self.disk.powered_off()
    }

    /// Power loss and restart: only what was synced survives (plus a random prefix of what
    /// was not); handles of the store opened before are dead.
    pub fn power_loss(&self) {
        self.disk.power_loss();
    }
}
