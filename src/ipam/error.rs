//! Why an IPAM operation failed.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::LeaseOwner;

/// Why an IPAM operation failed.
#[derive(Debug, thiserror::Error)]
pub enum IpamError {
    /// Every allocatable address of the pool is leased.
    #[error("address pool {subnet} exhausted (range {range_start}-{range_end}, {leased} leased)")]
    PoolExhausted {
        /// The pool.
        subnet: IpNetwork,
        /// Its first address.
        range_start: IpAddr,
        /// Its last address.
        range_end: IpAddr,
        /// How many addresses of the subnet are leased.
        leased: usize,
    },
    /// Persisting a change failed; nothing changed in memory.
    #[error("{op} lease {address} in pool {subnet}: {source}")]
    Persist {
        /// `save` or `remove`.
        op: &'static str,
        /// The pool.
        subnet: IpNetwork,
        /// The address.
        address: IpAddr,
        /// The store's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Loading the leases failed.
    #[error("load leases: {source}")]
    Load {
        /// The store's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A static address another owner holds (DESIGN §4: static addresses are leases).
    #[error("{address} is held by claim {holder_claim} (request {holder_request}, device {holder_device})", holder_claim = holder.claim_uid, holder_request = holder.request, holder_device = holder.device)]
    AddressTaken {
        /// The address.
        address: IpAddr,
        /// Who holds it.
        holder: Box<LeaseOwner>,
    },
    /// A released address another claim asks for inside its quarantine.
    #[error(
        "{address} was released {ago_ms} ms ago and is not handed out again for 30 s (a stale neighbour entry elsewhere may still point at its previous holder)"
    )]
    Quarantined {
        /// The address.
        address: IpAddr,
        /// How long ago it was released.
        ago_ms: u64,
    },
    /// No block of the network's family is free cluster-wide.
    #[error(
        "no free IPv{family} /{block_prefix} block in {subnets} (every block is owned by a node, excluded, or being released)"
    )]
    NoFreeBlock {
        /// 4 or 6.
        family: u8,
        /// The block prefix length.
        block_prefix: u8,
        /// The family's subnets, comma separated.
        subnets: String,
    },
    /// The store holds two leases for one address (written by something else).
    #[error("address {address} leased twice: to {first:?} and to {second:?}")]
    Conflict {
        /// The address.
        address: IpAddr,
        /// One holder.
        first: Box<LeaseOwner>,
        /// The other holder.
        second: Box<LeaseOwner>,
    },
}

impl IpamError {
    /// A short, stable label for metrics and per-claim errors.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            IpamError::PoolExhausted { .. } => "PoolExhausted",
            IpamError::Persist { .. } => "PersistFailed",
            IpamError::Load { .. } => "LoadFailed",
            IpamError::Conflict { .. } => "Conflict",
            IpamError::AddressTaken { .. } => "AddressTaken",
            IpamError::Quarantined { .. } => "Quarantined",
            IpamError::NoFreeBlock { .. } => "NoFreeBlock",
        }
    }
}
