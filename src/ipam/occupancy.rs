//! Occupied addresses as runs: leases and release records kept as coalesced numeric ranges
//! per family, so the allocator skips a whole run in one lookup.
//!
//! Why: allocation is lowest-free (decision 0014), so a node's leases pile up from the
//! bottom of its pools and recent releases sit among and above them. Walking those one
//! address at a time on every reservation cost 15–50 µs per claim with a few hundred
//! leases and a churn of quarantined releases, most of a prepare's own work (decision 0010).

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use rangemap::RangeInclusiveSet;

use super::pool::{from_u128, to_u128};
use super::{QUARANTINE_MS, ReleasedAddress};

/// CIDRs taken in the API (every live `IPBlock` of a network, whatever its name or node,
/// and this node's own blocks in any state), as runs: a candidate block or static address
/// overlapping one is not taken again (decision 0017: the IPBlocks are the truth, not the
/// names derived from them). One lookup per candidate, however many blocks the network has.
#[derive(Debug, Default, Clone)]
pub struct TakenRanges {
    v4: RangeInclusiveSet<u128>,
    v6: RangeInclusiveSet<u128>,
}

impl TakenRanges {
    /// Adds `cidr`.
    pub fn insert(&mut self, cidr: ipnetwork::IpNetwork) {
        let range = to_u128(cidr.network())..=to_u128(cidr.broadcast());
        if cidr.is_ipv4() { self.v4.insert(range) } else { self.v6.insert(range) }
    }

    /// Whether an address of `cidr` is taken.
    #[must_use]
    pub fn overlaps(&self, cidr: ipnetwork::IpNetwork) -> bool {
        let range = to_u128(cidr.network())..=to_u128(cidr.broadcast());
        if cidr.is_ipv4() { self.v4.overlaps(&range) } else { self.v6.overlaps(&range) }
    }
}

/// Addresses as coalesced runs of numbers, IPv4 and IPv6 apart (their numbers overlap).
#[derive(Debug, Default)]
pub(crate) struct AddressRuns {
    v4: RangeInclusiveSet<u128>,
    v6: RangeInclusiveSet<u128>,
}

impl AddressRuns {
    fn family(&self, like: IpAddr) -> &RangeInclusiveSet<u128> {
        if like.is_ipv4() { &self.v4 } else { &self.v6 }
    }

    fn family_mut(&mut self, like: IpAddr) -> &mut RangeInclusiveSet<u128> {
        if like.is_ipv4() { &mut self.v4 } else { &mut self.v6 }
    }

    pub(crate) fn insert(&mut self, ip: IpAddr) {
        let n = to_u128(ip);
        self.family_mut(ip).insert(n..=n);
    }

    pub(crate) fn remove(&mut self, ip: IpAddr) {
        let n = to_u128(ip);
        self.family_mut(ip).remove(n..=n);
    }

    /// The last number of the run holding `n` (an address of `like`'s family); `None` when
    /// `n` is in none.
    pub(crate) fn run_end(&self, n: u128, like: IpAddr) -> Option<u128> {
        self.family(like).get(&n).map(|run| *run.end())
    }
}

/// The smallest and largest `IpAddr` (every IPv4 address orders before every IPv6 one).
const LOWEST_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
const HIGHEST_ADDRESS: IpAddr = IpAddr::V6(Ipv6Addr::from_bits(u128::MAX));

/// The addresses of the latest release records as runs, with what lets a run be skipped
/// without reading each record: the addresses each claim released (it may take them back at
/// once) and the records by release time (those outside the quarantine window are free).
#[derive(Debug, Default)]
pub(crate) struct ReleasedRuns {
    runs: AddressRuns,
    by_claim: HashMap<String, BTreeSet<IpAddr>>,
    by_time: BTreeSet<(u64, IpAddr)>,
}

impl ReleasedRuns {
    pub(crate) fn insert(&mut self, record: &ReleasedAddress) {
        self.runs.insert(record.address);
        self.by_claim.entry(record.claim_uid.clone()).or_default().insert(record.address);
        self.by_time.insert((record.released_at_ms, record.address));
    }

    pub(crate) fn remove(&mut self, record: &ReleasedAddress) {
        self.runs.remove(record.address);
        if let Some(addresses) = self.by_claim.get_mut(&record.claim_uid) {
            addresses.remove(&record.address);
            if addresses.is_empty() {
                self.by_claim.remove(&record.claim_uid);
            }
        }
        self.by_time.remove(&(record.released_at_ms, record.address));
    }

    /// The addresses whose record is outside the quarantine window at `now`: released at
    /// least [`QUARANTINE_MS`] before it, or as long after it (a clock that went back). The
    /// first kind waits only for the next commit's prune (`Ipam::expired_releases`), so
    /// there are few.
    pub(crate) fn outside_window(&self, now: u64) -> impl Iterator<Item = &IpAddr> {
        let before =
            now.checked_sub(QUARANTINE_MS).map(|t| self.by_time.range(..=(t, HIGHEST_ADDRESS)));
        let after =
            now.checked_add(QUARANTINE_MS).map(|t| self.by_time.range((t, LOWEST_ADDRESS)..));
        before.into_iter().flatten().chain(after.into_iter().flatten()).map(|(_, ip)| ip)
    }

    /// The first number at or after `candidate` (an address of `like`'s family) that no
    /// record quarantines for `claim_uid` at `now` (see `quarantines`): `candidate` itself
    /// when it was not released. `None` past the family's end.
    pub(crate) fn first_unquarantined(
        &self,
        candidate: u128,
        like: IpAddr,
        claim_uid: &str,
        now: u64,
    ) -> Option<u128> {
        let Some(end) = self.runs.run_end(candidate, like) else { return Some(candidate) };
        // Every address of `candidate..=end` was released; the free ones are this claim's
        // own and those released outside the window.
        let span = from_u128(candidate, like)..=from_u128(end, like);
        let own = self.by_claim.get(claim_uid).and_then(|own| own.range(span.clone()).next());
        let outside = self.outside_window(now).filter(|ip| span.contains(*ip));
        match own.into_iter().chain(outside).min() {
            Some(free) => Some(to_u128(*free)),
            None => end.checked_add(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// What the allocator did before the runs: one record at a time.
    fn walked(
        records: &BTreeMap<IpAddr, ReleasedAddress>,
        candidate: u128,
        like: IpAddr,
        claim_uid: &str,
        now: u64,
    ) -> Option<u128> {
        let mut next = candidate;
        while let Some(record) = records.get(&from_u128(next, like)) {
            let quarantined = record.claim_uid != claim_uid
                && now.abs_diff(record.released_at_ms) < QUARANTINE_MS;
            if !quarantined {
                break;
            }
            next = next.checked_add(1)?;
        }
        Some(next)
    }

    fn record(address: IpAddr, claim: usize, released_at_ms: u64) -> ReleasedAddress {
        ReleasedAddress { address, released_at_ms, claim_uid: format!("uid-{claim}") }
    }

    #[test]
    fn a_run_is_skipped_to_its_end_and_stops_at_the_claims_own_address() {
        let mut runs = ReleasedRuns::default();
        let base = IpAddr::from([10, 0, 0, 0]);
        let now = 100_000;
        for i in 1..=5u8 {
            let claim = if i == 4 { 7 } else { 1 };
            runs.insert(&record(IpAddr::from([10, 0, 0, i]), claim, now - 1_000));
        }
        let n = |last: u8| to_u128(IpAddr::from([10, 0, 0, last]));
        assert_eq!(runs.first_unquarantined(n(1), base, "uid-2", now), Some(n(6)));
        assert_eq!(runs.first_unquarantined(n(1), base, "uid-7", now), Some(n(4)));
        assert_eq!(runs.first_unquarantined(n(1), base, "uid-1", now), Some(n(1)));
        assert_eq!(runs.first_unquarantined(n(9), base, "uid-2", now), Some(n(9)));
        // 30 s later every record is outside the window.
        assert_eq!(runs.first_unquarantined(n(2), base, "uid-2", now + 29_000), Some(n(2)));
        runs.remove(&record(IpAddr::from([10, 0, 0, 3]), 1, now - 1_000));
        assert_eq!(runs.first_unquarantined(n(1), base, "uid-2", now), Some(n(3)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Inserting, replacing and removing records in any order, the runs answer what
        /// the one-at-a-time walk answers, for every candidate, claim and time (including
        /// a clock far behind the records), IPv4 and IPv6 side by side.
        #[test]
        fn runs_answer_as_the_walk_does(
            ops in prop::collection::vec(
                (any::<bool>(), 0u8..24, 0usize..4, 0u64..120_000, any::<bool>()),
                1..80,
            ),
            queries in prop::collection::vec((any::<bool>(), 0u8..26, 0usize..4, 0u64..150_000), 1..40),
        ) {
            let address = |v6: bool, n: u8| -> IpAddr {
                if v6 { IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, u16::from(n)]) } else { IpAddr::from([10, 0, 0, n]) }
            };
            let mut runs = ReleasedRuns::default();
            let mut records: BTreeMap<IpAddr, ReleasedAddress> = BTreeMap::new();
            for (v6, n, claim, at, remove) in ops {
                let ip = address(v6, n);
                if let Some(old) = records.remove(&ip) {
                    runs.remove(&old);
                }
                if !remove {
                    let new = record(ip, claim, at);
                    runs.insert(&new);
                    records.insert(ip, new);
                }
            }
            for (v6, n, claim, now) in queries {
                let outside: BTreeSet<IpAddr> = runs.outside_window(now).copied().collect();
                let expected: BTreeSet<IpAddr> = records
                    .values()
                    .filter(|r| now.abs_diff(r.released_at_ms) >= QUARANTINE_MS)
                    .map(|r| r.address)
                    .collect();
                prop_assert_eq!(outside, expected, "outside the window at {}", now);
                let like = address(v6, 0);
                let candidate = to_u128(address(v6, n));
                let uid = format!("uid-{claim}");
                prop_assert_eq!(
                    runs.first_unquarantined(candidate, like, &uid, now),
                    walked(&records, candidate, like, &uid, now),
                    "candidate {} claim {} at {}", address(v6, n), uid, now
                );
            }
        }
    }
}
