//! Node IPAM: addresses bound to claims, from node-local pools (`ipam.pool`), static
//! addresses (`ipam.addresses`) and the blocks this node owns of a `PodNetwork`, persisted
//! through a [`LeaseStore`] before they are handed out.
//!
//! Pools are identified by their subnet (DESIGN §3); the range, gateway and excludes come
//! from the claim's resolved config. Leases are kept per address across all pools, so even
//! two overlapping subnets never hand one address to two claims. A reservation is keyed by
//! its [`LeaseOwner`] (claim UID, request, device, shareID): the same owner gets the same
//! address back, which keeps a pod's address across sandbox restarts and makes a repeated
//! prepare idempotent. Every change is written to the store first and applied in memory
//! only when that succeeded, so after `kill -9` the loaded leases cover every address ever
//! returned.
//!
//! A released address is quarantined for [`QUARANTINE`] in every pool kind (DESIGN §4: a
//! stale ARP/neighbour entry elsewhere would send its traffic to the next holder): its
//! release time is persisted with the lease's removal, so a restart keeps the quarantine. The
//! claim that released it may take it back at once (the address is that claim's).
//!
//! `PodNetwork` addresses come from blocks this node owns ([`OwnedBlock`], claimed in the API
//! by the caller, [`blocks`] for the pure carving): the lowest free address of the first
//! owned block with room, one per family per owner, with the subnet's prefix on the
//! interface. No owned block with room is `None` from [`Ipam::reserve_in_blocks`]: the
//! caller claims a new block and asks again.
//!
//! `Ipam` is not internally synchronised; the claims service owns it behind one lock. Time
//! comes from a [`Clock`] (tests inject one).

mod allocator;
pub mod blocks;
mod clock;
mod error;
mod lease;
mod occupancy;
pub mod pool;
mod ports;

#[cfg(test)]
mod tests;

pub use allocator::Ipam;
pub use clock::{ManualClock, SystemClock};
pub use error::IpamError;
use lease::QUARANTINE_MS;
pub use lease::{
    BlockRelease, BlockState, IpamCommit, Lease, LeaseOwner, OwnedBlock, QUARANTINE,
    ReleasedAddress,
};
pub use occupancy::TakenRanges;
pub use ports::{Clock, LeaseStore};
