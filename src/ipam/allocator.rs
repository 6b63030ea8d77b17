//! The allocator: leases, release records and owned blocks kept in memory, written to a
//! [`LeaseStore`] before they change.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use ipnetwork::IpNetwork;

use super::{
    BlockState, Clock, IpamError, Lease, LeaseOwner, LeaseStore, OwnedBlock, QUARANTINE_MS,
    ReleasedAddress, SystemClock,
};
use crate::model::network_config::{NetworkAddressing, PoolSpec};

/// The index under which an owner's address of one pool is found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum PoolKey {
    /// A node-local pool (and, as before blocks existed, static addresses loaded at start).
    Subnet(IpNetwork),
    /// One family of a `PodNetwork`'s blocks.
    Network { pod_network: String, ipv4: bool },
}

/// The pool key of a lease; `None` for static addresses reserved in a `PodNetwork` (one
/// owner may hold several of one network).
fn pool_key(lease: &Lease) -> Option<PoolKey> {
    match (&lease.pod_network, lease.block) {
        (Some(network), Some(block)) => {
            Some(PoolKey::Network { pod_network: network.clone(), ipv4: block.is_ipv4() })
        }
        (Some(_), None) => None,
        (None, _) => Some(PoolKey::Subnet(lease.subnet)),
    }
}

/// The node's address leases, release records and owned blocks.
#[derive(Debug)]
pub struct Ipam<S> {
    store: S,
    clock: Arc<dyn Clock>,
    /// Every lease, by address (all pools and families: `IpAddr` orders IPv4 before IPv6,
    /// numerically within a family, so range scans work per family).
    by_address: BTreeMap<IpAddr, Lease>,
    /// The keys of `by_address` as runs.
    leased_runs: super::occupancy::AddressRuns,
    /// The address each owner holds in each pool.
    by_owner: HashMap<(LeaseOwner, PoolKey), IpAddr>,
    /// The latest release of each address (quarantined while younger than [`QUARANTINE`](super::QUARANTINE);
    /// older ones wait to be pruned by a later commit).
    released: BTreeMap<IpAddr, ReleasedAddress>,
    /// The records of `released` as runs.
    released_runs: super::occupancy::ReleasedRuns,
    /// Older records of addresses released again since, waiting to be pruned.
    superseded: Vec<ReleasedAddress>,
    /// Owned blocks by `IPBlock` name.
    blocks: BTreeMap<String, BlockState>,
    /// The names of the owned blocks at each CIDR (a lease finds its block by network and
    /// CIDR: names of blocks made by older releases follow another scheme).
    at_cidr: HashMap<IpNetwork, Vec<String>>,
}

impl<S: LeaseStore> Ipam<S> {
    /// Loads every persisted lease, release and owned block, on the system clock.
    pub fn load(store: S) -> Result<Self, IpamError> {
        Ipam::load_with_clock(store, Arc::new(SystemClock))
    }

    /// [`Ipam::load`] on `clock`.
    pub fn load_with_clock(store: S, clock: Arc<dyn Clock>) -> Result<Self, IpamError> {
        let load = |e: S::Error| IpamError::Load { source: Box::new(e) };
        let leases = store.load_leases().map_err(load)?;
        let released = store.load_released().map_err(load)?;
        let blocks = store.load_blocks().map_err(load)?;
        let intents = store.load_block_releases().map_err(load)?;
        let now = clock.now_ms();
        let mut ipam = Ipam {
            store,
            clock,
            by_address: BTreeMap::new(),
            leased_runs: super::occupancy::AddressRuns::default(),
            by_owner: HashMap::new(),
            released: BTreeMap::new(),
            released_runs: super::occupancy::ReleasedRuns::default(),
            superseded: Vec::new(),
            blocks: BTreeMap::new(),
            at_cidr: HashMap::new(),
        };
        // Blocks first, so each loaded lease counts in its block.
        for block in blocks {
            let journaled = intents.iter().any(|r| r.name == block.name && r.uid == block.uid);
            ipam.index_block(&block);
            ipam.blocks.insert(
                block.name.clone(),
                BlockState {
                    block,
                    recorded: true,
                    empty_since_ms: None,
                    leased: 0,
                    releasing: journaled,
                    lost: false,
                    verified: false,
                    release_journaled: journaled,
                },
            );
        }
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
        for record in released {
            ipam.remember_release(record);
        }
        let names: Vec<String> = ipam.blocks.keys().cloned().collect();
        for name in names {
            ipam.refresh_emptiness(&name, now);
        }
        Ok(ipam)
    }

    /// Now, on the IPAM's clock.
    #[must_use]
    pub fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn insert(&mut self, lease: Lease) {
        if let Some(key) = pool_key(&lease) {
            self.by_owner.insert((lease.owner.clone(), key), lease.address);
        }
        if let Some(name) = self.block_name_of(&lease)
            && let Some(state) = self.blocks.get_mut(&name)
        {
            state.empty_since_ms = None;
            state.leased += 1;
        }
        self.leased_runs.insert(lease.address);
        self.by_address.insert(lease.address, lease);
    }

    /// The first number at or after `candidate` (of `like`'s family) that is neither leased
    /// nor quarantined for `claim_uid`, skipping runs.
    fn unoccupied_from(
        &self,
        candidate: u128,
        like: IpAddr,
        claim_uid: &str,
        now: u64,
    ) -> Option<u128> {
        let mut current = candidate;
        loop {
            let after_leases = match self.leased_runs.run_end(current, like) {
                Some(end) => end.checked_add(1)?,
                None => current,
            };
            let after_released =
                self.released_runs.first_unquarantined(after_leases, like, claim_uid, now)?;
            if after_released == current {
                return Some(current);
            }
            current = after_released;
        }
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
        if let Some(address) = self.by_owner.get(&(owner.clone(), PoolKey::Subnet(pool.subnet)))
            && let Some(lease) = self.by_address.get(address)
        {
            return Ok((lease.clone(), false));
        }
        let now = self.clock.now_ms();
        let like = pool.range_start;
        let found = super::pool::lowest_free(
            super::pool::to_u128(pool.range_start),
            super::pool::to_u128(pool.range_end),
            &super::pool::blocked_ranges(pool),
            |c| self.unoccupied_from(c, like, &owner.claim_uid, now),
        );
        let Some(address) = found.map(|n| super::pool::from_u128(n, like)) else {
            return Err(IpamError::PoolExhausted {
                subnet: pool.subnet,
                range_start: pool.range_start,
                range_end: pool.range_end,
                leased: self.by_address.keys().filter(|ip| pool.subnet.contains(**ip)).count(),
            });
        };
        let lease = Lease::new(pool.subnet, address, owner.clone());
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
        let (lease, new) = self.reserve_static_in_memory(owner, address, None)?;
        if new {
            self.persist_new(&lease)?;
        }
        Ok(lease)
    }

    /// [`Ipam::reserve_static`] without the write, as [`Ipam::reserve_in_memory`];
    /// `pod_network` names the network a static address is reserved in cluster-wide.
    pub fn reserve_static_in_memory(
        &mut self,
        owner: &LeaseOwner,
        address: IpNetwork,
        pod_network: Option<&str>,
    ) -> Result<(Lease, bool), IpamError> {
        let ip = address.ip();
        if let Some(lease) = self.by_address.get(&ip) {
            return if lease.owner == *owner {
                Ok((lease.clone(), false))
            } else {
                Err(IpamError::AddressTaken { address: ip, holder: Box::new(lease.owner.clone()) })
            };
        }
        let now = self.clock.now_ms();
        if let Some(record) = self.released.get(&ip)
            && quarantines(record, &owner.claim_uid, now)
        {
            return Err(IpamError::Quarantined {
                address: ip,
                ago_ms: now.saturating_sub(record.released_at_ms),
            });
        }
        // The network form of a valid address and prefix is always valid.
        let subnet = IpNetwork::new(address.network(), address.prefix()).unwrap_or(address);
        let mut lease = Lease::new(subnet, ip, owner.clone());
        lease.pod_network = pod_network.map(str::to_owned);
        // Not indexed by owner: one owner may hold several static addresses of one subnet,
        // and `reserve` looks owners up for pools only.
        self.leased_runs.insert(ip);
        self.by_address.insert(ip, lease.clone());
        Ok((lease, true))
    }

    /// Reserves `owner`'s address of family `ipv4` of `plan` in the first owned block of the
    /// network with room (or returns the one it holds): `None` when no owned block has
    /// room, and the caller claims a new block ([`Ipam::add_block`]) and asks again. Held in
    /// memory like [`Ipam::reserve_in_memory`].
    pub fn reserve_in_blocks(
        &mut self,
        owner: &LeaseOwner,
        plan: &NetworkAddressing,
        ipv4: bool,
    ) -> Option<(Lease, bool)> {
        let key = PoolKey::Network { pod_network: plan.pod_network.clone(), ipv4 };
        if let Some(address) = self.by_owner.get(&(owner.clone(), key))
            && let Some(lease) = self.by_address.get(address)
        {
            return Some((lease.clone(), false));
        }
        let (subnet, block, address) = self.find_in_blocks(&owner.claim_uid, plan, ipv4)?;
        let lease = Lease {
            subnet,
            address,
            owner: owner.clone(),
            pod_network: Some(plan.pod_network.clone()),
            block: Some(block),
        };
        self.insert(lease.clone());
        Some((lease, true))
    }

    /// Whether an owned block of family `ipv4` of `plan` has an address `claim_uid` may get.
    #[must_use]
    pub fn has_room(&self, plan: &NetworkAddressing, ipv4: bool, claim_uid: &str) -> bool {
        self.find_in_blocks(claim_uid, plan, ipv4).is_some()
    }

    /// The first free address for `claim_uid` in the owned blocks of family `ipv4` of
    /// `plan`: `(subnet, block, address)`.
    fn find_in_blocks(
        &self,
        claim_uid: &str,
        plan: &NetworkAddressing,
        ipv4: bool,
    ) -> Option<(IpNetwork, IpNetwork, IpAddr)> {
        let now = self.clock.now_ms();
        // What each subnet blocks, once per call (not per block).
        let blocked_of: Vec<(IpNetwork, Vec<(u128, u128)>)> = plan
            .subnets_of(ipv4)
            .map(|subnet| (subnet, super::blocks::blocked_ranges(plan, subnet)))
            .collect();
        self.blocks.values().filter(|s| allocatable_block(s, &plan.pod_network, ipv4)).find_map(
            |state| {
                let block = state.block.cidr;
                let subnet = super::blocks::subnet_of(plan, block)?;
                let (_, blocked) = blocked_of.iter().find(|(s, _)| *s == subnet)?;
                if state.leased >= super::blocks::capacity(block, blocked) {
                    // Full: no scan (a block with quarantined addresses is not full).
                    return None;
                }
                let like = block.network();
                super::blocks::first_free(block, blocked, |c| {
                    self.unoccupied_from(c, like, claim_uid, now)
                })
                .map(|address| (subnet, block, address))
            },
        )
    }

    /// Takes `block` as owned (claimed or adopted in the API, so verified); `recorded` when
    /// its record is durable. An existing entry of the same name takes the new UID and is no
    /// longer lost; one being released stays so.
    pub fn add_block(&mut self, block: OwnedBlock, recorded: bool) {
        let now = self.clock.now_ms();
        let name = block.name.clone();
        self.index_block(&block);
        match self.blocks.get_mut(&name) {
            Some(state) => {
                state.recorded = state.recorded && state.block == block;
                state.block = block;
                state.lost = false;
                state.verified = true;
            }
            None => {
                self.blocks.insert(
                    name.clone(),
                    BlockState {
                        block,
                        recorded,
                        empty_since_ms: None,
                        leased: 0,
                        releasing: false,
                        lost: false,
                        verified: true,
                        release_journaled: false,
                    },
                );
            }
        }
        // Leases taken before the block was known here (loaded ones) count in it now.
        self.refresh_emptiness(&name, now);
    }

    /// Forgets an owned block (deleted in the API, or found gone without leases).
    pub fn remove_block(&mut self, name: &str) {
        if let Some(state) = self.blocks.remove(name) {
            self.unindex_block(&state.block);
        }
    }

    fn index_block(&mut self, block: &OwnedBlock) {
        let names = self.at_cidr.entry(block.cidr).or_default();
        if !names.contains(&block.name) {
            names.push(block.name.clone());
        }
    }

    fn unindex_block(&mut self, block: &OwnedBlock) {
        if let Some(names) = self.at_cidr.get_mut(&block.cidr) {
            names.retain(|n| *n != block.name);
            if names.is_empty() {
                self.at_cidr.remove(&block.cidr);
            }
        }
    }

    /// The name of the owned block `lease` comes from (by network and CIDR), if owned.
    fn block_name_of(&self, lease: &Lease) -> Option<String> {
        let (network, cidr) = lease.block_key()?;
        self.at_cidr
            .get(&cidr)?
            .iter()
            .find(|name| self.blocks.get(*name).is_some_and(|s| s.block.pod_network == network))
            .cloned()
    }

    /// Owned blocks (and reservations), in any state, whose CIDR overlaps `cidr`.
    pub fn blocks_overlapping(&self, cidr: IpNetwork) -> impl Iterator<Item = &BlockState> {
        self.blocks.values().filter(move |s| overlaps(s.block.cidr, cidr))
    }

    /// Marks a block confirmed by the API in this process (the start-up reconcile found it
    /// with the UID recorded).
    pub fn set_block_verified(&mut self, name: &str) {
        if let Some(state) = self.blocks.get_mut(name) {
            state.verified = true;
        }
    }

    /// Whether a block loaded from the store has not been confirmed by the API yet: nothing
    /// may be handed out from it, nor a reservation in it trusted, before the reconcile.
    #[must_use]
    pub fn has_unverified_blocks(&self) -> bool {
        self.blocks.values().any(|s| !s.verified && !s.releasing)
    }

    /// Marks a block as going (chosen for release or to be forgotten): from now on it hands
    /// out nothing, under the lock of the caller that chose it.
    pub fn set_block_releasing(&mut self, name: &str) {
        if let Some(state) = self.blocks.get_mut(name) {
            state.releasing = true;
        }
    }

    /// Marks the release intents of `names` durable.
    pub fn set_release_journaled(&mut self, names: &[String]) {
        for name in names {
            if let Some(state) = self.blocks.get_mut(name) {
                state.releasing = true;
                state.release_journaled = true;
            }
        }
    }

    /// Blocks whose release intent is durable but whose deletion has not been confirmed
    /// (a failed delete, or a crash before it): the upkeep deletes them again.
    #[must_use]
    pub fn pending_releases(&self) -> Vec<OwnedBlock> {
        self.blocks.values().filter(|s| s.release_journaled).map(|s| s.block.clone()).collect()
    }

    /// Leases in lost blocks: addresses whose block the API no longer gives this node, which
    /// another node may hand out too (they stay with their pods; DESIGN §4).
    #[must_use]
    pub fn conflicting_leases(&self) -> Vec<Lease> {
        self.blocks
            .values()
            .filter(|s| s.lost)
            .flat_map(|s| self.by_address.range(s.block.cidr.network()..=s.block.cidr.broadcast()))
            .map(|(_, lease)| lease.clone())
            .collect()
    }

    /// Marks a block lost (gone from the API with live leases) or found again.
    pub fn set_block_lost(&mut self, name: &str, lost: bool) {
        if let Some(state) = self.blocks.get_mut(name) {
            state.lost = lost;
        }
    }

    /// Every owned block.
    pub fn blocks(&self) -> impl Iterator<Item = &BlockState> {
        self.blocks.values()
    }

    /// The owned block named `name`.
    #[must_use]
    pub fn block(&self, name: &str) -> Option<&BlockState> {
        self.blocks.get(name)
    }

    /// Whether any address of `cidr` is leased.
    #[must_use]
    pub fn has_leases_in(&self, cidr: IpNetwork) -> bool {
        self.by_address.range(cidr.network()..=cidr.broadcast()).next().is_some()
    }

    /// Owned blocks that `leases` use whose records are not durable yet: the caller puts
    /// them in the same commit as the leases.
    #[must_use]
    pub fn blocks_to_record(&self, leases: &[Lease]) -> Vec<OwnedBlock> {
        let names: BTreeSet<String> = leases.iter().filter_map(|l| self.block_name_of(l)).collect();
        names
            .iter()
            .filter_map(|name| self.blocks.get(name))
            .filter(|state| !state.recorded)
            .map(|state| state.block.clone())
            .collect()
    }

    /// Marks block records durable (their commit succeeded).
    pub fn mark_recorded(&mut self, blocks: &[OwnedBlock]) {
        for block in blocks {
            if let Some(state) = self.blocks.get_mut(&block.name)
                && state.block == *block
            {
                state.recorded = true;
            }
        }
    }

    /// Sets a block's lease count and `empty_since_ms` from its leases.
    fn refresh_emptiness(&mut self, name: &str, now: u64) {
        let Some(cidr) = self.blocks.get(name).map(|s| s.block.cidr) else { return };
        let leased = self.by_address.range(cidr.network()..=cidr.broadcast()).count() as u128;
        let empty = leased == 0;
        if let Some(state) = self.blocks.get_mut(name) {
            state.leased = leased;
            match (empty, state.empty_since_ms) {
                (true, None) => state.empty_since_ms = Some(now),
                (false, Some(_)) => state.empty_since_ms = None,
                _ => {}
            }
        }
    }

    /// Forgets leases held in memory only (their commit failed, or their removal was
    /// committed by the caller).
    pub fn forget_in_memory(&mut self, leases: &[Lease]) {
        let now = self.clock.now_ms();
        for lease in leases {
            if self.by_address.get(&lease.address) == Some(lease) {
                self.by_address.remove(&lease.address);
                self.leased_runs.remove(lease.address);
            }
            if let Some(key) = pool_key(lease)
                && self.by_owner.get(&(lease.owner.clone(), key.clone())) == Some(&lease.address)
            {
                self.by_owner.remove(&(lease.owner.clone(), key));
            }
            if let Some(name) = self.block_name_of(lease) {
                self.refresh_emptiness(&name, now);
            }
        }
    }

    /// The release records of `leases` released now (for the commit that removes them).
    #[must_use]
    pub fn release_records(&self, leases: &[Lease]) -> Vec<ReleasedAddress> {
        let now = self.clock.now_ms();
        leases
            .iter()
            .map(|l| ReleasedAddress {
                address: l.address,
                released_at_ms: now,
                claim_uid: l.owner.claim_uid.clone(),
            })
            .collect()
    }

    /// Keeps `record` as its address's latest release (an older one waits to be pruned).
    fn remember_release(&mut self, record: ReleasedAddress) {
        match self.released.get(&record.address) {
            Some(existing) if existing.released_at_ms > record.released_at_ms => {
                self.superseded.push(record);
            }
            _ => {
                if let Some(old) = self.released.remove(&record.address) {
                    self.released_runs.remove(&old);
                    if !self.superseded.contains(&old) {
                        self.superseded.push(old);
                    }
                }
                self.released_runs.insert(&record);
                self.released.insert(record.address, record);
            }
        }
    }

    /// Applies a committed release: the leases go, their addresses are quarantined.
    pub fn apply_release(&mut self, leases: &[Lease], records: &[ReleasedAddress]) {
        self.forget_in_memory(leases);
        for record in records {
            self.remember_release(record.clone());
        }
    }

    /// Release records past their quarantine, and superseded ones: a later commit removes
    /// them ([`Ipam::forget_released`] after it succeeded).
    #[must_use]
    pub fn expired_releases(&self) -> Vec<ReleasedAddress> {
        let now = self.clock.now_ms();
        self.released_runs
            .outside_window(now)
            .filter_map(|ip| self.released.get(ip))
            .chain(self.superseded.iter())
            .cloned()
            .collect()
    }

    /// Forgets release records whose removal was committed.
    pub fn forget_released(&mut self, records: &[ReleasedAddress]) {
        for record in records {
            self.superseded.retain(|r| r != record);
            if self.released.get(&record.address) == Some(record) {
                self.released.remove(&record.address);
                self.released_runs.remove(record);
            }
        }
    }

    /// Every release record.
    pub fn releases(&self) -> impl Iterator<Item = &ReleasedAddress> {
        self.released.values()
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
            let records = self.release_records(std::slice::from_ref(&lease));
            // Store first: a lease still on disk but gone from memory could be handed out
            // twice after a restart; the reverse only keeps an address busy.
            self.store.remove_lease(&lease, &records[0]).map_err(|e| IpamError::Persist {
                op: "remove",
                subnet: lease.subnet,
                address: lease.address,
                source: Box::new(e),
            })?;
            self.apply_release(std::slice::from_ref(&lease), &records);
            released.push(lease);
        }
        Ok(released)
    }

    /// The lease `owner` holds in the pool of `subnet`.
    #[must_use]
    pub fn lease_of(&self, owner: &LeaseOwner, subnet: IpNetwork) -> Option<&Lease> {
        self.by_owner
            .get(&(owner.clone(), PoolKey::Subnet(subnet)))
            .and_then(|a| self.by_address.get(a))
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

    /// Empty blocks to delete in the API now, marked releasing: no lease and no quarantined
    /// address in them, and either empty for `grace_ms` or of a network `deleting` (then at
    /// once, and whatever their quarantine: no node claims blocks of a network being
    /// deleted). Reservations are not included ([`Ipam::orphan_reservations`]).
    pub fn idle_blocks(
        &mut self,
        grace_ms: u64,
        deleting: impl Fn(&str) -> bool,
    ) -> Vec<OwnedBlock> {
        let now = self.clock.now_ms();
        let mut idle = Vec::new();
        for state in self.blocks.values() {
            let Some(since) = state.empty_since_ms else { continue };
            if state.releasing || state.lost || state.block.claim.is_some() {
                continue;
            }
            let cidr = state.block.cidr;
            let gone_network = deleting(&state.block.pod_network);
            let quarantined = self
                .released
                .range(cidr.network()..=cidr.broadcast())
                .any(|(_, r)| now.abs_diff(r.released_at_ms) < QUARANTINE_MS);
            if gone_network || (!quarantined && now.saturating_sub(since) >= grace_ms) {
                idle.push(state.block.clone());
            }
        }
        for block in &idle {
            if let Some(state) = self.blocks.get_mut(&block.name) {
                state.releasing = true;
            }
        }
        idle
    }

    /// Static reservations whose claim `is_live` no longer holds, marked releasing.
    pub fn orphan_reservations(&mut self, is_live: impl Fn(&str) -> bool) -> Vec<OwnedBlock> {
        let mut orphans = Vec::new();
        for state in self.blocks.values_mut() {
            let Some(claim) = &state.block.claim else { continue };
            if !state.releasing && !state.lost && !is_live(&claim.uid) {
                state.releasing = true;
                orphans.push(state.block.clone());
            }
        }
        orphans
    }

    /// Ends a release: `gone` forgets the block (its record's removal was committed), else
    /// it serves again unless its release intent is durable (then the upkeep retries).
    pub fn end_release(&mut self, name: &str, gone: bool) {
        if gone {
            self.remove_block(name);
        } else if let Some(state) = self.blocks.get_mut(name)
            && !state.release_journaled
        {
            state.releasing = false;
        }
    }

    /// The store, for callers that share it with other record kinds.
    pub fn store(&self) -> &S {
        &self.store
    }
}

/// Whether a block hands out new addresses of `pod_network`'s family `ipv4`.
fn allocatable_block(state: &BlockState, pod_network: &str, ipv4: bool) -> bool {
    state.block.pod_network == pod_network
        && state.block.cidr.is_ipv4() == ipv4
        && state.block.claim.is_none()
        && !state.releasing
        && !state.lost
        && state.verified
}

/// Whether two networks share an address (one contains the other's first address).
fn overlaps(a: IpNetwork, b: IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

/// Whether `record` keeps its address from `claim_uid` at `now`: within [`QUARANTINE`](super::QUARANTINE) of
/// the release (either way: a clock that went back does not stretch it), unless the claim is
/// the one that released it.
fn quarantines(record: &ReleasedAddress, claim_uid: &str, now: u64) -> bool {
    record.claim_uid != claim_uid && now.abs_diff(record.released_at_ms) < QUARANTINE_MS
}
