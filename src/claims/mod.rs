//! NodePrepareResources / NodeUnprepareResources (DESIGN §5 steps 2 and 6): reads each
//! claim, checks it, resolves its `NetworkConfig` against the allocated device, reserves its
//! addresses, and persists the prepared claim that the attach step executes later.
//!
//! The service talks to the world through three ports ([`ports`]): [`ClaimSource`] (the
//! API), [`DeviceSource`] (the node's inventory) and [`ClaimStore`] (durable state, also the
//! IPAM's lease store). Claims of one request run concurrently (at most
//! [`MAX_CONCURRENT_CLAIMS`]); calls for the same claim UID are serialised, so a repeated
//! prepare waits for the first and returns its stored answer without an API call.
//!
//! Durability order: a prepared claim on disk always has its leases. Prepare writes the
//! leases (IPAM) before the claim; unprepare removes the claim before the leases. A crash in
//! between leaves leases without a claim, which [`ClaimService::load`] releases at start
//! (for a prepare nothing was returned to kubelet, which asks again; for an unprepare the
//! claim is already forgotten). Device metadata files ([`metadata`]) are written between the
//! leases and the claim, and removed after both; files without a prepared claim are removed
//! at start.

pub mod allocation;
pub mod bandwidth;
mod commit;
mod error;
pub mod ethtool;
pub mod ethtool_settings;
pub mod metadata;
pub mod networks;
pub mod parent_capacity;
pub mod ports;
pub mod preparer;
pub mod rdma_cdi;
mod record;
mod service;
mod staged;
mod state;
pub mod tenancy;
pub mod vf;
mod vf_reboot;
mod vf_settings;
pub mod vf_snapshots;
pub mod vfio;
pub mod vfio_cdi;
mod vfio_ports;

pub use error::{ClaimError, LoadError};
pub use ports::{
    ClaimSource, ClaimStore, DeviceSource, LookupError, ReadError, ResolvedDevice, vf_of,
};
pub use preparer::{
    ClaimFailure, ClaimPreparer, PrepareResults, PreparedDevice, UnavailablePreparer,
    UnprepareResults,
};
pub use record::{PodConsumer, PreparedClaim, PreparedClaimDevice, PreparedVf};
pub use service::{ClaimService, MAX_CONCURRENT_CLAIMS, ServiceIdentity};

#[cfg(test)]
mod tests;
