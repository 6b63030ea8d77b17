//! Node-local IPAM: addresses from `ipam.pool` bound to claims, persisted through a
//! [`LeaseStore`] before they are handed out.
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
//! `Ipam` is not internally synchronised; the claims service owns it behind one lock.

pub mod pool;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use crate::model::network_config::PoolSpec;

/// Who holds a lease: one allocated device of one claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseOwner {
    /// The `ResourceClaim`'s UID.
    pub claim_uid: String,
    /// The request name of the allocation result (`nic` or `nic/fast`).
    pub request: String,
    /// The allocated device.
    pub device: String,
    /// The allocation's `shareID` for a shared device (one claim can hold several shares
    /// of one parent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
}

/// One address bound to one owner.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// The pool (its subnet, network form).
    pub subnet: IpNetwork,
    /// The leased address.
    pub address: IpAddr,
    /// Who holds it.
    pub owner: LeaseOwner,
}

impl Lease {
    /// The address with the pool's prefix length, as configured on the interface.
    #[must_use]
    pub fn interface_address(&self) -> IpNetwork {
        // The prefix comes from a valid network of the same family, so it always fits.
        IpNetwork::new(self.address, self.subnet.prefix()).unwrap_or(self.subnet)
    }
}

/// Durable storage of leases (implemented by `store::Store`).
pub trait LeaseStore {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Every persisted lease.
    fn load_leases(&self) -> Result<Vec<Lease>, Self::Error>;
    /// Persists a lease durably before returning.
    fn save_lease(&self, lease: &Lease) -> Result<(), Self::Error>;
    /// Removes a lease durably; removing a missing lease succeeds.
    fn remove_lease(&self, lease: &Lease) -> Result<(), Self::Error>;
}

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
        }
    }
}

/// The node's address leases.
#[derive(Debug)]
pub struct Ipam<S> {
    store: S,
    /// Every lease, by address (all pools and families: `IpAddr` orders IPv4 before IPv6,
    /// numerically within a family, so range scans work per family).
    by_address: BTreeMap<IpAddr, Lease>,
    /// The address each owner holds in each pool.
    by_owner: HashMap<(LeaseOwner, IpNetwork), IpAddr>,
}

impl<S: LeaseStore> Ipam<S> {
    /// Loads every persisted lease.
    pub fn load(store: S) -> Result<Self, IpamError> {
        let leases = store.load_leases().map_err(|e| IpamError::Load { source: Box::new(e) })?;
        let mut ipam = Ipam { store, by_address: BTreeMap::new(), by_owner: HashMap::new() };
        for lease in leases {
            if let Some(existing) = ipam.by_address.get(&lease.address) {
                return Err(IpamError::Conflict {
                    address: lease.address,
                    first: Box::new(existing.owner.clone()),
                    second: Box::new(lease.owner),
                });
            }
            ipam.insert(lease);
        }
        Ok(ipam)
    }

    fn insert(&mut self, lease: Lease) {
        self.by_owner.insert((lease.owner.clone(), lease.subnet), lease.address);
        self.by_address.insert(lease.address, lease);
    }

    /// Reserves an address of `pool` for `owner`, or returns the one it already holds
    /// there. The lease is durable when this returns.
    pub fn reserve(&mut self, owner: &LeaseOwner, pool: &PoolSpec) -> Result<Lease, IpamError> {
        let (lease, new) = self.reserve_in_memory(owner, pool)?;
        if new {
            self.persist_new(&lease)?;
        }
        Ok(lease)
    }

    /// [`Ipam::reserve`] without the write: the lease is held in memory, so no other owner
    /// gets the address, and the caller persists it (with the records that depend on it, in
    /// one commit) or gives it back with [`Ipam::forget_in_memory`]. `(lease, whether it is
    /// new)`.
    pub fn reserve_in_memory(
        &mut self,
        owner: &LeaseOwner,
        pool: &PoolSpec,
    ) -> Result<(Lease, bool), IpamError> {
        if let Some(address) = self.by_owner.get(&(owner.clone(), pool.subnet))
            && let Some(lease) = self.by_address.get(address)
        {
            return Ok((lease.clone(), false));
        }
        let Some(address) = pool::first_free(pool, &self.by_address) else {
            return Err(IpamError::PoolExhausted {
                subnet: pool.subnet,
                range_start: pool.range_start,
                range_end: pool.range_end,
                leased: self.by_address.keys().filter(|ip| pool.subnet.contains(**ip)).count(),
            });
        };
        let lease = Lease { subnet: pool.subnet, address, owner: owner.clone() };
        self.insert(lease.clone());
        Ok((lease, true))
    }

    /// Persists a lease just reserved in memory; on failure it is forgotten again.
    fn persist_new(&mut self, lease: &Lease) -> Result<(), IpamError> {
        if let Err(e) = self.store.save_lease(lease) {
            self.forget_in_memory(std::slice::from_ref(lease));
            return Err(IpamError::Persist {
                op: "save",
                subnet: lease.subnet,
                address: lease.address,
                source: Box::new(e),
            });
        }
        Ok(())
    }

    /// Leases a static address (`ipam.addresses`) to `owner`, so no pool hands it out and no
    /// other claim gets it; the same owner gets its lease back. `address` carries its prefix:
    /// the lease's subnet is its network.
    pub fn reserve_static(
        &mut self,
        owner: &LeaseOwner,
        address: IpNetwork,
    ) -> Result<Lease, IpamError> {
        let (lease, new) = self.reserve_static_in_memory(owner, address)?;
        if new {
            self.persist_new(&lease)?;
        }
        Ok(lease)
    }

    /// [`Ipam::reserve_static`] without the write, as [`Ipam::reserve_in_memory`].
    pub fn reserve_static_in_memory(
        &mut self,
        owner: &LeaseOwner,
        address: IpNetwork,
    ) -> Result<(Lease, bool), IpamError> {
        let ip = address.ip();
        if let Some(lease) = self.by_address.get(&ip) {
            return if lease.owner == *owner {
                Ok((lease.clone(), false))
            } else {
                Err(IpamError::AddressTaken { address: ip, holder: Box::new(lease.owner.clone()) })
            };
        }
        // The network form of a valid address and prefix is always valid.
        let subnet = IpNetwork::new(address.network(), address.prefix()).unwrap_or(address);
        let lease = Lease { subnet, address: ip, owner: owner.clone() };
        // Not indexed by owner: one owner may hold several static addresses of one subnet,
        // and `reserve` looks owners up for pools only.
        self.by_address.insert(ip, lease.clone());
        Ok((lease, true))
    }

    /// Forgets leases held in memory only (their commit failed, or their removal was
    /// committed by the caller).
    pub fn forget_in_memory(&mut self, leases: &[Lease]) {
        for lease in leases {
            if self.by_address.get(&lease.address) == Some(lease) {
                self.by_address.remove(&lease.address);
            }
            if self.by_owner.get(&(lease.owner.clone(), lease.subnet)) == Some(&lease.address) {
                self.by_owner.remove(&(lease.owner.clone(), lease.subnet));
            }
        }
    }

    /// Every lease of a claim.
    #[must_use]
    pub fn leases_of_claim(&self, claim_uid: &str) -> Vec<Lease> {
        self.by_address.values().filter(|l| l.owner.claim_uid == claim_uid).cloned().collect()
    }

    /// Releases every lease of `owner`; returns them. Releasing nothing succeeds.
    pub fn release(&mut self, owner: &LeaseOwner) -> Result<Vec<Lease>, IpamError> {
        self.release_where(|o| o == owner)
    }

    /// Releases every lease of a claim (at unprepare); returns them.
    pub fn release_claim(&mut self, claim_uid: &str) -> Result<Vec<Lease>, IpamError> {
        self.release_where(|o| o.claim_uid == claim_uid)
    }

    fn release_where(
        &mut self,
        matches: impl Fn(&LeaseOwner) -> bool,
    ) -> Result<Vec<Lease>, IpamError> {
        let doomed: Vec<Lease> =
            self.by_address.values().filter(|l| matches(&l.owner)).cloned().collect();
        let mut released = Vec::with_capacity(doomed.len());
        for lease in doomed {
            // Store first: a lease still on disk but gone from memory could be handed out
            // twice after a restart; the reverse only keeps an address busy.
            self.store.remove_lease(&lease).map_err(|e| IpamError::Persist {
                op: "remove",
                subnet: lease.subnet,
                address: lease.address,
                source: Box::new(e),
            })?;
            self.by_address.remove(&lease.address);
            if self.by_owner.get(&(lease.owner.clone(), lease.subnet)) == Some(&lease.address) {
                self.by_owner.remove(&(lease.owner.clone(), lease.subnet));
            }
            released.push(lease);
        }
        Ok(released)
    }

    /// The lease `owner` holds in the pool of `subnet`.
    #[must_use]
    pub fn lease_of(&self, owner: &LeaseOwner, subnet: IpNetwork) -> Option<&Lease> {
        self.by_owner.get(&(owner.clone(), subnet)).and_then(|a| self.by_address.get(a))
    }

    /// Every lease, by address.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.by_address.values()
    }

    /// Leased addresses per pool (for `netclaim_ipam_addresses{pool,state}`).
    #[must_use]
    pub fn leased_per_pool(&self) -> BTreeMap<IpNetwork, usize> {
        let mut counts = BTreeMap::new();
        for lease in self.by_address.values() {
            *counts.entry(lease.subnet).or_default() += 1;
        }
        counts
    }

    /// The store, for callers that share it with other record kinds.
    pub fn store(&self) -> &S {
        &self.store
    }
}
