//! The service's in-memory state: the IPAM, the prepared and pending claims, and the index of
//! where the claims in use sit.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::record::{PreparedClaim, PreparedClaimDevice};
use crate::ipam::{Ipam, LeaseStore};
use crate::model::network_config::Addressing;

/// What the claim service holds under its state lock.
pub(super) struct State<S: LeaseStore> {
    pub(super) ipam: Ipam<S>,
    /// Changed only through [`State::add_prepared`] and [`State::remove_prepared`] (they
    /// keep `in_use` and `prepared_by_pod` right).
    pub(super) prepared: HashMap<String, PreparedClaim>,
    /// Claims whose commit is under way (their leases are held in memory): seen by the
    /// checks of other prepares, never reported as prepared. Changed only through
    /// [`State::add_pending`] and [`State::remove_pending`].
    pub(super) pending: HashMap<String, PreparedClaim>,
    /// Where the claims in use sit, so a new claim's checks read the claims on its parent
    /// and the pool users, not every claim of the node (a scan of all of them per prepare
    /// cost ~850 µs at 15k claims).
    pub(super) in_use: InUseIndex,
    /// UIDs of the prepared claims reserved for each pod, by pod UID: the attach, the
    /// CreateContainer gate and the restart's reconcile ask for one pod's claims, and a walk
    /// of every prepared claim for each was quadratic over a burst (issue 36).
    prepared_by_pod: HashMap<String, BTreeSet<String>>,
}

/// Claim UIDs of the claims in use (prepared or pending) by host interface and by pool use,
/// each with how many of the two maps hold it.
#[derive(Debug, Default)]
pub(super) struct InUseIndex {
    pub(super) by_parent: HashMap<String, HashMap<String, u32>>,
    pub(super) pool_users: HashMap<String, u32>,
}

impl InUseIndex {
    fn add(&mut self, claim: &PreparedClaim) {
        let parents: BTreeSet<&str> = claim.devices.iter().map(|d| d.if_name.as_str()).collect();
        for parent in parents {
            *self
                .by_parent
                .entry(parent.to_owned())
                .or_default()
                .entry(claim.uid.clone())
                .or_default() += 1;
        }
        if claim.devices.iter().any(|d| matches!(d.config.addressing, Addressing::Pool(_))) {
            *self.pool_users.entry(claim.uid.clone()).or_default() += 1;
        }
    }

    fn remove(&mut self, claim: &PreparedClaim) {
        fn release(uids: &mut HashMap<String, u32>, uid: &str) {
            if let Some(count) = uids.get_mut(uid) {
                *count -= 1;
                if *count == 0 {
                    uids.remove(uid);
                }
            }
        }
        let parents: BTreeSet<&str> = claim.devices.iter().map(|d| d.if_name.as_str()).collect();
        for parent in parents {
            if let Some(uids) = self.by_parent.get_mut(parent) {
                release(uids, &claim.uid);
                if uids.is_empty() {
                    self.by_parent.remove(parent);
                }
            }
        }
        release(&mut self.pool_users, &claim.uid);
    }
}

impl<S: LeaseStore> State<S> {
    pub(super) fn new(ipam: Ipam<S>, prepared: HashMap<String, PreparedClaim>) -> Self {
        let mut in_use = InUseIndex::default();
        for claim in prepared.values() {
            in_use.add(claim);
        }
        let mut prepared_by_pod: HashMap<String, BTreeSet<String>> = HashMap::new();
        for claim in prepared.values() {
            for pod in &claim.reserved_for {
                prepared_by_pod.entry(pod.uid.clone()).or_default().insert(claim.uid.clone());
            }
        }
        Self { ipam, prepared, pending: HashMap::new(), in_use, prepared_by_pod }
    }

    /// The prepared claims reserved for `pod_uid`.
    pub(super) fn prepared_for_pod<'a>(
        &'a self,
        pod_uid: &str,
    ) -> impl Iterator<Item = &'a PreparedClaim> {
        self.prepared_by_pod
            .get(pod_uid)
            .into_iter()
            .flatten()
            .filter_map(|uid| self.prepared.get(uid))
    }

    fn index_pods(&mut self, claim: &PreparedClaim) {
        for pod in &claim.reserved_for {
            self.prepared_by_pod.entry(pod.uid.clone()).or_default().insert(claim.uid.clone());
        }
    }

    fn unindex_pods(&mut self, claim: &PreparedClaim) {
        for pod in &claim.reserved_for {
            if let Some(uids) = self.prepared_by_pod.get_mut(&pod.uid) {
                uids.remove(&claim.uid);
                if uids.is_empty() {
                    self.prepared_by_pod.remove(&pod.uid);
                }
            }
        }
    }

    /// Prepared claims and claims being committed: what a new claim must fit beside.
    pub(super) fn claims_in_use(&self) -> impl Iterator<Item = &PreparedClaim> + Clone {
        self.prepared.values().chain(self.pending.values())
    }

    /// The claims in use with `uids` (prepared first, then pending).
    pub(super) fn claims_of<'a>(
        &'a self,
        uids: Option<&'a HashMap<String, u32>>,
    ) -> impl Iterator<Item = &'a PreparedClaim> + Clone {
        uids.into_iter()
            .flat_map(HashMap::keys)
            .flat_map(|uid| self.prepared.get(uid).into_iter().chain(self.pending.get(uid)))
    }

    /// The devices of claims in use on host interface `parent` (what [`Self::claims_in_use`]
    /// would give, filtered by parent, from the index).
    pub(super) fn devices_on<'a>(
        &'a self,
        parent: &'a str,
    ) -> impl Iterator<Item = &'a PreparedClaimDevice> + Clone {
        self.claims_of(self.in_use.by_parent.get(parent))
            .flat_map(|c| &c.devices)
            .filter(move |d| d.if_name == parent)
    }

    /// The claims in use with a pool-addressed device.
    pub(super) fn pool_users(&self) -> impl Iterator<Item = &PreparedClaim> + Clone {
        self.claims_of(Some(&self.in_use.pool_users))
    }

    pub(super) fn add_pending(&mut self, claim: PreparedClaim) {
        self.in_use.add(&claim);
        if let Some(old) = self.pending.insert(claim.uid.clone(), claim) {
            self.in_use.remove(&old);
        }
    }

    pub(super) fn remove_pending(&mut self, uid: &str) {
        if let Some(old) = self.pending.remove(uid) {
            self.in_use.remove(&old);
        }
    }

    pub(super) fn add_prepared(&mut self, claim: PreparedClaim) {
        self.in_use.add(&claim);
        let uid = claim.uid.clone();
        if let Some(old) = self.prepared.remove(&uid) {
            self.in_use.remove(&old);
            self.unindex_pods(&old);
        }
        self.index_pods(&claim);
        self.prepared.insert(uid, claim);
    }

    pub(super) fn remove_prepared(&mut self, uid: &str) {
        if let Some(old) = self.prepared.remove(uid) {
            self.in_use.remove(&old);
            self.unindex_pods(&old);
        }
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // State changes are applied only after the store accepted them, so a panic elsewhere
    // while holding the lock leaves consistent data behind.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
