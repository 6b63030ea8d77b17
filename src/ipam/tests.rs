//! IPAM tests: unit cases, and property tests of the allocator against an independent oracle.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnetwork::IpNetwork;
use proptest::prelude::*;

use super::*;
use crate::model::network_config::PoolSpec;
use crate::testing::leases::MemoryLeases;

fn owner(i: usize) -> LeaseOwner {
    LeaseOwner {
        claim_uid: format!("uid-{i}"),
        request: "nic".into(),
        device: "eth1".into(),
        share_id: None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn spec(subnet: &str, start: &str, end: &str, gateway: Option<&str>, exclude: &[&str]) -> PoolSpec {
    PoolSpec {
        subnet: subnet.parse().unwrap(),
        range_start: ip(start),
        range_end: ip(end),
        gateway: gateway.map(ip),
        exclude: exclude.iter().map(|e| e.parse().unwrap()).collect(),
    }
}

/// An empty IPAM on a clock that moves only when a test says so.
fn empty_ipam() -> Ipam<MemoryLeases> {
    clocked_ipam().0
}

fn clocked_ipam() -> (Ipam<MemoryLeases>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::at(1_000_000));
    let ipam =
        Ipam::load_with_clock(MemoryLeases::new(), Arc::clone(&clock) as Arc<dyn Clock>).unwrap();
    (ipam, clock)
}

#[test]
fn hands_out_lowest_free_skipping_gateway_and_excludes() {
    let pool =
        spec("10.10.1.0/24", "10.10.1.1", "10.10.1.10", Some("10.10.1.1"), &["10.10.1.4/31"]);
    let mut ipam = empty_ipam();
    let got: Vec<IpAddr> =
        (0..6).map(|i| ipam.reserve(&owner(i), &pool).unwrap().address).collect();
    let want: Vec<IpAddr> =
        ["2", "3", "6", "7", "8", "9"].iter().map(|s| ip(&format!("10.10.1.{s}"))).collect();
    assert_eq!(got, want);
    let lease = ipam.lease_of(&owner(0), pool.subnet).unwrap();
    assert_eq!(lease.interface_address().to_string(), "10.10.1.2/24");
}

#[test]
fn never_network_or_broadcast_even_when_the_range_covers_them() {
    // A range spanning the whole /30 (as a hand-written PoolSpec could) still skips both ends.
    let pool = spec("10.0.0.0/30", "10.0.0.0", "10.0.0.3", None, &[]);
    let mut ipam = empty_ipam();
    assert_eq!(ipam.reserve(&owner(0), &pool).unwrap().address, ip("10.0.0.1"));
    assert_eq!(ipam.reserve(&owner(1), &pool).unwrap().address, ip("10.0.0.2"));
    assert!(matches!(ipam.reserve(&owner(2), &pool), Err(IpamError::PoolExhausted { .. })));
    let v6 = spec("fd00::/126", "fd00::", "fd00::3", Some("fd00::1"), &[]);
    assert_eq!(ipam.reserve(&owner(3), &v6).unwrap().address, ip("fd00::2"));
}

#[test]
fn same_owner_gets_the_same_address_without_a_second_write() {
    let pool = spec("fd00:10::/64", "fd00:10::10", "fd00:10::ff", Some("fd00:10::1"), &[]);
    let mut ipam = empty_ipam();
    let first = ipam.reserve(&owner(7), &pool).unwrap();
    let saves = ipam.store().saves();
    let again = ipam.reserve(&owner(7), &pool).unwrap();
    assert_eq!(first, again);
    assert_eq!(ipam.store().saves(), saves, "an idempotent reserve writes nothing");
    let other_device = LeaseOwner { device: "eth2".into(), ..owner(7) };
    assert_ne!(ipam.reserve(&other_device, &pool).unwrap().address, first.address);
}

#[test]
fn exhaustion_names_the_pool() {
    let pool = spec("192.168.5.0/29", "192.168.5.1", "192.168.5.2", None, &[]);
    let mut ipam = empty_ipam();
    ipam.reserve(&owner(0), &pool).unwrap();
    ipam.reserve(&owner(1), &pool).unwrap();
    let err = ipam.reserve(&owner(2), &pool).expect_err("exhausted");
    assert_eq!(err.kind(), "PoolExhausted");
    let msg = err.to_string();
    assert!(
        msg.contains("192.168.5.0/29") && msg.contains("exhausted") && msg.contains("2 leased"),
        "{msg}"
    );
}

#[test]
fn release_claim_frees_every_lease_of_the_claim_and_only_those() {
    let a = spec("10.1.0.0/24", "10.1.0.10", "10.1.0.20", None, &[]);
    let b = spec("fd00:1::/64", "fd00:1::10", "fd00:1::20", None, &[]);
    let mut ipam = empty_ipam();
    let mine = owner(1);
    let mine_other_request = LeaseOwner { request: "nic2".into(), ..owner(1) };
    ipam.reserve(&mine, &a).unwrap();
    ipam.reserve(&mine, &b).unwrap();
    ipam.reserve(&mine_other_request, &a).unwrap();
    ipam.reserve(&owner(2), &a).unwrap();
    let released = ipam.release_claim("uid-1").unwrap();
    assert_eq!(released.len(), 3);
    assert_eq!(ipam.leases().count(), 1);
    assert_eq!(ipam.store().leases().len(), 1);
    assert!(ipam.release_claim("uid-1").unwrap().is_empty(), "releasing again is a no-op");
    assert_eq!(ipam.leased_per_pool(), BTreeMap::from([(a.subnet, 1)]));
}

#[test]
fn a_failed_write_changes_nothing() {
    let pool = spec("10.2.0.0/24", "10.2.0.1", "10.2.0.254", None, &[]);
    let mut ipam = empty_ipam();
    ipam.store().set_failing(true);
    let err = ipam.reserve(&owner(0), &pool).expect_err("store fails");
    assert!(matches!(err, IpamError::Persist { op: "save", .. }), "{err}");
    assert_eq!(ipam.leases().count(), 0);
    ipam.store().set_failing(false);
    let lease = ipam.reserve(&owner(0), &pool).unwrap();
    ipam.store().set_failing(true);
    assert!(ipam.release(&owner(0)).is_err());
    assert_eq!(
        ipam.lease_of(&owner(0), pool.subnet),
        Some(&lease),
        "still leased after a failed remove"
    );
}

#[test]
fn overlapping_pools_never_share_an_address() {
    let wide = spec("10.3.0.0/16", "10.3.1.1", "10.3.1.3", None, &[]);
    let narrow = spec("10.3.1.0/24", "10.3.1.1", "10.3.1.3", None, &[]);
    let mut ipam = empty_ipam();
    let a = ipam.reserve(&owner(0), &wide).unwrap().address;
    let b = ipam.reserve(&owner(1), &narrow).unwrap().address;
    assert_ne!(a, b);
}

#[test]
fn load_rebuilds_state_and_refuses_a_double_lease() {
    // One address leased twice, as a broken release could have written it.
    let doubled = {
        let a = Lease::new("10.0.0.0/24".parse().unwrap(), ip("10.0.0.5"), owner(0));
        MemoryLeases::with_leases(vec![a.clone(), Lease { owner: owner(1), ..a }])
    };
    let pool = spec("10.4.0.0/24", "10.4.0.1", "10.4.0.254", None, &[]);
    let mut ipam = empty_ipam();
    let lease = ipam.reserve(&owner(0), &pool).unwrap();
    let mut reloaded = Ipam::load(MemoryLeases::with_leases(vec![lease.clone()])).unwrap();
    assert_eq!(reloaded.reserve(&owner(0), &pool).unwrap(), lease, "same address after restart");
    assert_ne!(reloaded.reserve(&owner(1), &pool).unwrap().address, lease.address);

    assert!(matches!(Ipam::load(doubled), Err(IpamError::Conflict { .. })));
}

#[test]
fn a_large_ipv6_pool_allocates_without_scanning_the_range() {
    let pool = spec(
        "fd00:99::/64",
        "fd00:99::1",
        "fd00:99::ffff:ffff:ffff:ffff",
        None,
        &["fd00:99::/100"],
    );
    let mut ipam = empty_ipam();
    for i in 0..1000 {
        ipam.reserve(&owner(i), &pool).unwrap();
    }
    assert_eq!(ipam.lease_of(&owner(0), pool.subnet).unwrap().address, ip("fd00:99::1000:0"));
}

// ---- property tests ----

/// Independent oracle: may `addr` be handed out by `pool`?
fn oracle_allows(pool: &PoolSpec, addr: IpAddr) -> bool {
    let in_range = addr >= pool.range_start && addr <= pool.range_end;
    let special = match pool.subnet {
        IpNetwork::V4(n) => {
            n.prefix() <= 30
                && (addr == IpAddr::V4(n.network()) || addr == IpAddr::V4(n.broadcast()))
        }
        IpNetwork::V6(n) => n.prefix() <= 126 && addr == IpAddr::V6(n.network()),
    };
    in_range
        && !special
        && Some(addr) != pool.gateway
        && !pool.exclude.iter().any(|e| e.contains(addr))
}

fn oracle_allowed(pool: &PoolSpec) -> BTreeSet<IpAddr> {
    pool.subnet.iter().filter(|a| oracle_allows(pool, *a)).collect()
}

/// Small IPv4 (/24../30) or IPv6 (/120../126) pools with a random range, gateway and excludes.
fn pool_strategy() -> impl Strategy<Value = PoolSpec> {
    (
        any::<bool>(),
        24u8..=30,
        any::<u8>(),
        any::<u8>(),
        any::<u8>(),
        any::<bool>(),
        prop::collection::vec((any::<u8>(), 29u8..=32), 0..3),
    )
        .prop_map(|(v6, prefix4, a, b, g, with_gateway, excl)| {
            let (subnet, size) = if v6 {
                let prefix = prefix4 + 96;
                (
                    IpNetwork::new(
                        IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x100)),
                        prefix,
                    )
                    .unwrap(),
                    1u32 << (128 - u32::from(prefix)),
                )
            } else {
                (
                    IpNetwork::new(IpAddr::V4(Ipv4Addr::new(10, 9, 8, 0)), prefix4).unwrap(),
                    1u32 << (32 - u32::from(prefix4)),
                )
            };
            let nth = |k: u32| -> IpAddr {
                match subnet.network() {
                    IpAddr::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n) + k % size)),
                    IpAddr::V6(n) => {
                        IpAddr::V6(Ipv6Addr::from(u128::from(n) + u128::from(k % size)))
                    }
                }
            };
            let (x, y) = (u32::from(a) % size, u32::from(b) % size);
            let (start, end) = (nth(x.min(y)), nth(x.max(y)));
            let exclude = excl
                .into_iter()
                .map(|(k, p)| {
                    let p = if v6 { p + 96 } else { p };
                    let net = IpNetwork::new(nth(u32::from(k)), p).unwrap();
                    IpNetwork::new(net.network(), p).unwrap()
                })
                .collect();
            PoolSpec {
                subnet,
                range_start: start,
                range_end: end,
                gateway: with_gateway.then(|| nth(u32::from(g))),
                exclude,
            }
        })
}

#[derive(Debug, Clone)]
enum Op {
    Reserve(usize),
    Release(usize),
    /// Seconds pass.
    Tick(u64),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..80).prop_map(Op::Reserve),
        1 => (0usize..80).prop_map(Op::Release),
        1 => (0u64..40).prop_map(Op::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn allocator_never_duplicates_never_leaves_the_pool_and_persists_first(
        pool in pool_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..200),
    ) {
        let allowed = oracle_allowed(&pool);
        let (mut ipam, clock) = clocked_ipam();
        let mut held: BTreeMap<usize, IpAddr> = BTreeMap::new();
        // The oracle's quarantine: address -> (released at, by owner).
        let mut released_at: BTreeMap<IpAddr, (u64, usize)> = BTreeMap::new();
        for op in ops {
            let now = clock.now_ms();
            let quarantined_for = |i: usize, a: &IpAddr| {
                released_at.get(a).is_some_and(|(t, by)| *by != i && now - t < 30_000)
            };
            match op {
                Op::Reserve(i) => match ipam.reserve(&owner(i), &pool) {
                    Ok(lease) => {
                        prop_assert!(allowed.contains(&lease.address), "{} not allowed in {pool:?}", lease.address);
                        if let Some(before) = held.get(&i) {
                            prop_assert_eq!(*before, lease.address, "idempotent reserve moved");
                        } else {
                            prop_assert!(!quarantined_for(i, &lease.address), "{} handed out inside its quarantine", lease.address);
                            // Lowest-free: no lower allowed address was free for this owner.
                            let lowest = allowed.iter().find(|a| !held.values().any(|h| h == *a) && !quarantined_for(i, a));
                            prop_assert_eq!(lowest, Some(&lease.address), "not the lowest free address");
                        }
                        prop_assert!(held.iter().all(|(j, a)| *j == i || *a != lease.address), "duplicate {}", lease.address);
                        held.insert(i, lease.address);
                    }
                    Err(IpamError::PoolExhausted { .. }) => {
                        prop_assert!(!held.contains_key(&i));
                        let free = allowed.iter().filter(|a| !held.values().any(|h| h == *a) && !quarantined_for(i, a)).count();
                        prop_assert_eq!(free, 0, "exhausted with free addresses left");
                    }
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                },
                Op::Release(i) => {
                    let released = ipam.release(&owner(i)).unwrap();
                    let address = held.remove(&i);
                    prop_assert_eq!(released.first().map(|l| l.address), address);
                    if let Some(address) = address {
                        released_at.insert(address, (now, i));
                    }
                }
                Op::Tick(seconds) => clock.advance(std::time::Duration::from_secs(seconds)),
            }
            // Memory and store agree after every step: nothing is handed out unpersisted.
            let stored: BTreeMap<IpAddr, LeaseOwner> =
                ipam.store().leases().iter().map(|l| (l.address, l.owner.clone())).collect();
            let expected: BTreeMap<IpAddr, LeaseOwner> = held.iter().map(|(i, a)| (*a, owner(*i))).collect();
            prop_assert_eq!(stored, expected);
        }
        // A restart sees the same leases and the same quarantine.
        let store = ipam.store().snapshot();
        let mut reloaded = Ipam::load_with_clock(store, Arc::clone(&clock) as Arc<dyn Clock>).unwrap();
        prop_assert_eq!(reloaded.leases().cloned().collect::<Vec<_>>(), ipam.leases().cloned().collect::<Vec<_>>());
        let now = clock.now_ms();
        if let Ok(lease) = reloaded.reserve(&owner(999), &pool) {
            prop_assert!(
                released_at.get(&lease.address).is_none_or(|(t, _)| now - t >= 30_000),
                "{} handed out inside its quarantine after a restart", lease.address
            );
        }
    }

    #[test]
    fn filling_hands_out_exactly_the_allowed_set_and_release_reuses(
        pool in pool_strategy(),
        victim in any::<prop::sample::Index>(),
    ) {
        let allowed = oracle_allowed(&pool);
        let (mut ipam, clock) = clocked_ipam();
        let mut got = BTreeSet::new();
        for i in 0..=allowed.len() {
            match ipam.reserve(&owner(i), &pool) {
                Ok(lease) => { got.insert(lease.address); }
                Err(IpamError::PoolExhausted { .. }) => prop_assert_eq!(i, allowed.len()),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
        prop_assert_eq!(&got, &allowed);
        if !allowed.is_empty() {
            let k = victim.index(allowed.len());
            let freed = ipam.release(&owner(k)).unwrap();
            prop_assert_eq!(freed.len(), 1);
            // Quarantined for 30 s: another claim gets nothing until then, the same claim
            // gets its address back at once.
            clock.advance(std::time::Duration::from_millis(29_999));
            let early = ipam.reserve(&owner(1000), &pool);
            prop_assert!(matches!(early, Err(IpamError::PoolExhausted { .. })), "{early:?}");
            clock.advance(std::time::Duration::from_millis(1));
            let again = ipam.reserve(&owner(1000), &pool).unwrap();
            prop_assert_eq!(again.address, freed[0].address, "the only free address is reused");
        }
    }

    #[test]
    fn is_allocatable_matches_the_oracle(pool in pool_strategy()) {
        for addr in &pool.subnet {
            prop_assert_eq!(pool::is_allocatable(&pool, addr), oracle_allows(&pool, addr), "{}", addr);
        }
    }
}
