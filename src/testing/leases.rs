//! Leases behind the [`LeaseStore`] port without a disk: kept in memory (or not at all), saves
//! counted, and every write failing on demand.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use crate::ipam::{Lease, LeaseStore, OwnedBlock, ReleasedAddress};

/// The error of a write while [`MemoryLeases::set_failing`] is on.
#[derive(Debug, thiserror::Error)]
#[error("injected store failure")]
pub struct InjectedFailure;

/// Leases and release records in memory; no owned blocks.
#[derive(Debug)]
pub struct MemoryLeases {
    /// In the order given; a save replaces the lease of the same address.
    leases: Mutex<Vec<Lease>>,
    released: Mutex<Vec<ReleasedAddress>>,
    /// Whether writes are kept (off: the allocator's floor, a store that costs nothing).
    keep: bool,
    saves: AtomicUsize,
    failing: AtomicBool,
}

impl Default for MemoryLeases {
    fn default() -> Self {
        MemoryLeases {
            leases: Mutex::default(),
            released: Mutex::default(),
            keep: true,
            saves: AtomicUsize::new(0),
            failing: AtomicBool::new(false),
        }
    }
}

/// A test's store stays usable after a panicking test thread poisoned it.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryLeases {
    /// Empty, keeping what is written.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Empty, and every write succeeds and is forgotten: nothing durable to restart from.
    #[must_use]
    pub fn forgetful() -> Self {
        MemoryLeases { keep: false, ..Self::default() }
    }

    /// Holding `leases` as a store would load them, duplicates included (a double lease
    /// written by a broken release).
    #[must_use]
    pub fn with_leases(leases: Vec<Lease>) -> Self {
        MemoryLeases { leases: Mutex::new(leases), ..Self::default() }
    }

    /// A store holding what this one holds now: the state a restarted service loads.
    #[must_use]
    pub fn snapshot(&self) -> Self {
        MemoryLeases {
            leases: Mutex::new(lock(&self.leases).clone()),
            released: Mutex::new(lock(&self.released).clone()),
            ..Self::default()
        }
    }

    /// Every write fails with [`InjectedFailure`] while `failing`.
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// How many leases were saved.
    pub fn saves(&self) -> usize {
        self.saves.load(Ordering::SeqCst)
    }

    /// The leases held, by address.
    pub fn leases(&self) -> Vec<Lease> {
        let mut leases = lock(&self.leases).clone();
        leases.sort_by_key(|lease| lease.address);
        leases
    }

    /// The release records held, oldest first.
    pub fn released(&self) -> Vec<ReleasedAddress> {
        lock(&self.released).clone()
    }

    fn write(&self) -> Result<(), InjectedFailure> {
        if self.failing.load(Ordering::SeqCst) { Err(InjectedFailure) } else { Ok(()) }
    }
}

impl LeaseStore for MemoryLeases {
    type Error = InjectedFailure;

    fn load_leases(&self) -> Result<Vec<Lease>, InjectedFailure> {
        Ok(self.leases())
    }

    fn load_released(&self) -> Result<Vec<ReleasedAddress>, InjectedFailure> {
        Ok(self.released())
    }

    fn load_blocks(&self) -> Result<Vec<OwnedBlock>, InjectedFailure> {
        Ok(Vec::new())
    }

    fn save_lease(&self, lease: &Lease) -> Result<(), InjectedFailure> {
        self.write()?;
        self.saves.fetch_add(1, Ordering::SeqCst);
        if self.keep {
            let mut leases = lock(&self.leases);
            leases.retain(|held| held.address != lease.address);
            leases.push(lease.clone());
        }
        Ok(())
    }

    fn remove_lease(
        &self,
        lease: &Lease,
        released: &ReleasedAddress,
    ) -> Result<(), InjectedFailure> {
        self.write()?;
        if self.keep {
            lock(&self.leases).retain(|held| held.address != lease.address);
            lock(&self.released).push(released.clone());
        }
        Ok(())
    }
}
