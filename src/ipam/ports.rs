//! The IPAM's ports: durable storage of its leases ([`LeaseStore`]) and where its time comes
//! from ([`Clock`]).

use super::lease::{BlockRelease, Lease, OwnedBlock, ReleasedAddress};

/// Durable storage of leases (implemented by `store::Store`).
pub trait LeaseStore {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Every persisted lease.
    fn load_leases(&self) -> Result<Vec<Lease>, Self::Error>;
    /// Every persisted release (quarantine) record.
    fn load_released(&self) -> Result<Vec<ReleasedAddress>, Self::Error>;
    /// Every persisted owned block.
    fn load_blocks(&self) -> Result<Vec<OwnedBlock>, Self::Error>;
    /// Every persisted release intent of an owned block; a store without block records has
    /// none.
    fn load_block_releases(&self) -> Result<Vec<BlockRelease>, Self::Error> {
        Ok(Vec::new())
    }
    /// Persists a lease durably before returning.
    fn save_lease(&self, lease: &Lease) -> Result<(), Self::Error>;
    /// Removes a lease and records its release in one durable commit; removing a missing
    /// lease succeeds.
    fn remove_lease(&self, lease: &Lease, released: &ReleasedAddress) -> Result<(), Self::Error>;
}

/// Wall-clock time in milliseconds since the Unix epoch: release times must survive a
/// restart, which a monotonic clock does not.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}
