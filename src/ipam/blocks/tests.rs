//! Block IPAM tests: carving and the candidate order (pure), and allocation inside owned
//! blocks, each with property tests against an independent oracle.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnetwork::IpNetwork;
use proptest::prelude::*;

use super::*;
use crate::ipam::{Clock, Ipam, LeaseOwner, ManualClock, OwnedBlock};
use crate::testing::leases::MemoryLeases;

fn net(s: &str) -> IpNetwork {
    s.parse().unwrap()
}

fn plan(
    subnets: &[&str],
    gateways: &[&str],
    exclude: &[&str],
    v4: u8,
    v6: u8,
) -> NetworkAddressing {
    NetworkAddressing {
        pod_network: "medianet".into(),
        subnets: subnets.iter().map(|s| net(s)).collect(),
        gateways: gateways.iter().map(|g| g.parse().unwrap()).collect(),
        exclude: exclude.iter().map(|e| net(e)).collect(),
        static_ranges: Vec::new(),
        block_v4: v4,
        block_v6: v6,
        addresses: Vec::new(),
    }
}

/// Every address of a network (small ones only).
fn addresses(n: IpNetwork) -> Vec<IpAddr> {
    n.iter().collect()
}

/// The oracle: may a pod of `plan` get `ip` of `subnet`?
fn oracle_allows(plan: &NetworkAddressing, subnet: IpNetwork, ip: IpAddr) -> bool {
    if !subnet.contains(ip)
        || plan.exclude.iter().any(|e| e.contains(ip))
        || plan.gateways.contains(&ip)
    {
        return false;
    }
    // The block holding `ip` (masked to the block prefix, at most the subnet) must not touch a
    // static range.
    let prefix = plan.block_prefix(subnet.is_ipv4()).max(subnet.prefix());
    let block = IpNetwork::new(ip, prefix).unwrap();
    let block = IpNetwork::new(block.network(), prefix).unwrap();
    if plan.static_ranges.iter().any(|r| r.contains(block.network()) || block.contains(r.network()))
    {
        return false;
    }
    match subnet {
        IpNetwork::V4(v4) if v4.prefix() <= 30 => {
            ip != IpAddr::V4(v4.network()) && ip != IpAddr::V4(v4.broadcast())
        }
        IpNetwork::V6(v6) if v6.prefix() <= 126 => ip != IpAddr::V6(v6.network()),
        _ => true,
    }
}

#[test]
fn a_subnet_is_cut_into_blocks_of_the_block_size() {
    let blocks: Vec<String> = carve(net("10.10.0.0/24"), 26).map(|b| b.to_string()).collect();
    assert_eq!(blocks, ["10.10.0.0/26", "10.10.0.64/26", "10.10.0.128/26", "10.10.0.192/26"]);
    assert_eq!(block_count(net("fd00:10::/64"), 120), 1 << 56);
    assert_eq!(block_at(net("fd00:10::/64"), 120, 3).to_string(), "fd00:10::300/120");
    // What a block can hand out: its size less the subnet's network address and the gateway.
    let p = plan(&["10.10.0.0/24"], &["10.10.0.1"], &[], 26, 120);
    let blocked = blocked_ranges(&p, net("10.10.0.0/24"));
    assert_eq!(capacity(net("10.10.0.0/26"), &blocked), 62);
    assert_eq!(capacity(net("10.10.0.64/26"), &blocked), 64);
    assert_eq!(capacity(net("10.10.0.192/26"), &blocked), 63, "the broadcast address");
    // A block size larger than the subnet: the subnet is the one block.
    assert_eq!(carve(net("10.1.0.0/28"), 26).collect::<Vec<_>>(), [net("10.1.0.0/28")]);
}

#[test]
fn the_search_starts_at_a_hash_of_the_node_name_and_wraps() {
    let p = plan(&["10.10.0.0/24"], &[], &[], 26, 120);
    let order = |node: &str| Candidates::new(&p, true, node).collect::<Vec<_>>();
    let start = start_index("node-a", 4);
    assert_eq!(order("node-a")[0], block_at(net("10.10.0.0/24"), 26, start));
    assert_eq!(order("node-a").len(), 4, "every block once");
    // Nodes spread: of 16 nodes on 64 blocks, not all start at the same block.
    let p = plan(&["10.10.0.0/20"], &[], &[], 26, 120);
    let starts: BTreeSet<IpNetwork> =
        (0..16).map(|i| Candidates::new(&p, true, &format!("node-{i}")).next().unwrap()).collect();
    assert!(starts.len() > 8, "{starts:?}");
}

#[test]
fn excluded_and_gateway_only_blocks_are_never_candidates() {
    // The first /26 is excluded, the second holds only... the whole of the third is the
    // gateway's /32 block in a /32-block network.
    let p = plan(&["10.10.0.0/24"], &["10.10.0.65"], &["10.10.0.0/26"], 26, 120);
    let got: BTreeSet<String> = Candidates::new(&p, true, "n").map(|b| b.to_string()).collect();
    assert_eq!(
        got,
        BTreeSet::from(["10.10.0.64/26".into(), "10.10.0.128/26".into(), "10.10.0.192/26".into()])
    );
    let p = plan(&["10.10.0.0/30"], &["10.10.0.1"], &[], 32, 128);
    let got: Vec<String> = Candidates::new(&p, true, "n").map(|b| b.to_string()).collect();
    // .0 network, .1 gateway, .3 broadcast: only .2 is a usable /32.
    assert_eq!(got, ["10.10.0.2/32"]);
}

#[test]
fn no_block_is_carved_over_a_static_range() {
    // A static range covering whole blocks: those blocks are never candidates.
    let mut p = plan(&["10.10.0.0/24"], &[], &[], 26, 120);
    p.static_ranges = vec![net("10.10.0.64/26")];
    let got: BTreeSet<String> = Candidates::new(&p, true, "n").map(|b| b.to_string()).collect();
    assert_eq!(
        got,
        BTreeSet::from(["10.10.0.0/26".into(), "10.10.0.128/26".into(), "10.10.0.192/26".into()])
    );
    // One that splits a block (the controller refuses it): the whole block is skipped, so a
    // static /32 of it never lies in a block another node owns.
    p.static_ranges = vec![net("10.10.0.200/29")];
    let got: Vec<String> = Candidates::new(&p, true, "n").map(|b| b.to_string()).collect();
    assert!(!got.contains(&"10.10.0.192/26".to_owned()) && got.len() == 3, "{got:?}");
    let blocked = blocked_ranges(&p, net("10.10.0.0/24"));
    assert_eq!(capacity(net("10.10.0.192/26"), &blocked), 0);
    // IPv6: a /112 static range in a /64 of /120 blocks takes 256 blocks, skipped in one jump.
    let mut p = plan(&["fd00:10::/64"], &[], &[], 26, 120);
    p.static_ranges = vec![net("fd00:10::/112")];
    let first = Candidates::new(&p, false, "node-a").take(1000);
    assert!(first.into_iter().all(|b| !net("fd00:10::/112").contains(b.network())));
    // The block an address came from, for the claim status.
    let p = plan(&["10.10.0.0/16", "fd00:10::/64"], &[], &[], 26, 120);
    assert_eq!(block_of(&p, "10.10.3.77".parse().unwrap()), Some(net("10.10.3.64/26")));
    assert_eq!(block_of(&p, "fd00:10::1:2ff".parse().unwrap()), Some(net("fd00:10::1:200/120")));
    assert_eq!(block_of(&p, "10.11.0.1".parse().unwrap()), None);
}

#[test]
fn a_huge_ipv6_subnet_mostly_excluded_is_walked_in_jumps() {
    // 2^56 blocks, all but the last 2^40 excluded: the walk finds one without visiting them.
    let p = plan(
        &["fd00:10::/64"],
        &[],
        &["fd00:10::/65", "fd00:10:0:0:8000::/66", "fd00:10:0:0:c000::/67"],
        120,
        120,
    );
    let first = Candidates::new(&p, false, "node-a").next().unwrap();
    assert!(!p.exclude.iter().any(|e| e.contains(first.network())), "{first}");
    let ten: Vec<IpNetwork> = Candidates::new(&p, false, "node-a").take(10).collect();
    assert_eq!(ten.len(), 10);
}

#[test]
fn later_subnets_of_a_family_come_after_the_first() {
    let p = plan(&["10.1.0.0/26", "fd00::/120", "10.2.0.0/26"], &[], &[], 27, 121);
    let v4: Vec<String> = Candidates::new(&p, true, "x").map(|b| b.to_string()).collect();
    assert_eq!(v4.len(), 4);
    assert!(
        v4[..2].iter().all(|b| b.starts_with("10.1."))
            && v4[2..].iter().all(|b| b.starts_with("10.2.")),
        "{v4:?}"
    );
    let v6: Vec<String> = Candidates::new(&p, false, "x").map(|b| b.to_string()).collect();
    assert_eq!(v6.len(), 2);
    assert_eq!(p.families(), [true, false]);
}

fn owner(i: usize) -> LeaseOwner {
    LeaseOwner {
        claim_uid: format!("uid-{i}"),
        request: "net".into(),
        device: "medianet-eth1".into(),
        share_id: None,
    }
}

fn owned(p: &NetworkAddressing, cidr: IpNetwork) -> OwnedBlock {
    OwnedBlock {
        name: crate::model::pod_network::ip_block_name(&p.pod_network, &cidr.to_string()),
        pod_network: p.pod_network.clone(),
        cidr,
        uid: format!("uid-{cidr}"),
        claim: None,
    }
}

/// An IPAM for block tests on a store that remembers nothing durable (the claims tests use
/// the real one).
fn ipam_with_clock() -> (Ipam<MemoryLeases>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::at(5_000_000));
    let store = MemoryLeases::forgetful();
    (Ipam::load_with_clock(store, Arc::clone(&clock) as Arc<dyn Clock>).unwrap(), clock)
}

#[test]
fn dual_stack_gives_one_address_per_family_with_the_subnet_prefix() {
    let p = plan(&["10.10.0.0/16", "fd00:10::/64"], &["10.10.0.1"], &["10.10.0.0/24"], 26, 120);
    let (mut ipam, _) = ipam_with_clock();
    for ipv4 in [true, false] {
        let block = Candidates::new(&p, ipv4, "node-a").next().unwrap();
        ipam.add_block(owned(&p, block), false);
    }
    let v4 = ipam.reserve_in_blocks(&owner(0), &p, true).unwrap().0;
    let v6 = ipam.reserve_in_blocks(&owner(0), &p, false).unwrap().0;
    assert_eq!(v4.interface_address().prefix(), 16, "the subnet's prefix, not the block's");
    assert_eq!(v6.interface_address().prefix(), 64);
    assert!(v4.block.unwrap().contains(v4.address) && v6.block.unwrap().contains(v6.address));
    // The same owner asking again gets the same addresses, new = false.
    assert_eq!(ipam.reserve_in_blocks(&owner(0), &p, true), Some((v4, false)));
}

#[test]
fn an_address_released_in_a_block_waits_30_seconds_for_another_claim() {
    let p = plan(&["10.10.0.0/30"], &[], &[], 31, 120);
    let (mut ipam, clock) = ipam_with_clock();
    // Blocks /31: 10.10.0.0/31 holds .1 only (.0 is the subnet's network), the other .2 only.
    let block = net("10.10.0.0/31");
    ipam.add_block(owned(&p, block), true);
    let (lease, _) = ipam.reserve_in_blocks(&owner(0), &p, true).unwrap();
    assert_eq!(lease.address.to_string(), "10.10.0.1");
    let records = ipam.release_records(std::slice::from_ref(&lease));
    ipam.apply_release(std::slice::from_ref(&lease), &records);
    assert!(
        ipam.reserve_in_blocks(&owner(1), &p, true).is_none(),
        "quarantined: a new block is needed"
    );
    clock.advance(std::time::Duration::from_secs(30));
    assert_eq!(ipam.reserve_in_blocks(&owner(1), &p, true).unwrap().0.address, lease.address);
}

#[test]
fn empty_blocks_are_released_after_the_grace_and_at_once_when_the_network_goes() {
    let p = plan(&["10.10.0.0/24"], &[], &[], 26, 120);
    let (mut ipam, clock) = ipam_with_clock();
    let block = net("10.10.0.0/26");
    ipam.add_block(owned(&p, block), true);
    let (lease, _) = ipam.reserve_in_blocks(&owner(0), &p, true).unwrap();
    assert!(ipam.idle_blocks(0, |_| false).is_empty(), "a block with a lease stays");
    let records = ipam.release_records(std::slice::from_ref(&lease));
    ipam.apply_release(std::slice::from_ref(&lease), &records);
    clock.advance(std::time::Duration::from_secs(20));
    assert!(ipam.idle_blocks(0, |_| false).is_empty(), "an address in quarantine keeps its block");
    assert_eq!(
        ipam.idle_blocks(0, |n| n == "medianet").len(),
        1,
        "a network being deleted: at once"
    );
    ipam.end_release(&owned(&p, block).name, false);
    clock.advance(std::time::Duration::from_secs(20));
    assert!(ipam.idle_blocks(600_000, |_| false).is_empty(), "inside the grace");
    clock.advance(std::time::Duration::from_mins(10));
    let idle = ipam.idle_blocks(600_000, |_| false);
    assert_eq!(idle.len(), 1);
    assert!(
        ipam.reserve_in_blocks(&owner(1), &p, true).is_none(),
        "a releasing block hands out nothing"
    );
}

/// A network plan over one small subnet of one family, with a gateway and excludes, and a
/// block size.
fn plan_strategy() -> impl Strategy<Value = NetworkAddressing> {
    (
        any::<bool>(),
        20u8..=28,
        0u8..=4,
        any::<u16>(),
        prop::collection::vec((any::<u16>(), 0u8..=4), 0..3),
        any::<bool>(),
        prop::collection::vec((any::<u16>(), 0u8..=8), 0..3),
    )
        .prop_map(|(v6, prefix, extra, g, excludes, with_gateway, statics)| {
            let (subnet, bits) = if v6 {
                (
                    IpNetwork::new(
                        IpAddr::V6(Ipv6Addr::new(0xfd00, 0x10, 0, 0, 0, 0, 0, 0)),
                        prefix + 96,
                    )
                    .unwrap(),
                    128u8,
                )
            } else {
                (IpNetwork::new(IpAddr::V4(Ipv4Addr::new(10, 10, 0, 0)), prefix).unwrap(), 32u8)
            };
            let size = 1u32 << (u32::from(bits) - u32::from(subnet.prefix()));
            let nth = |k: u32| -> IpAddr {
                match subnet.network() {
                    IpAddr::V4(n) => IpAddr::V4(Ipv4Addr::from(u32::from(n) + k % size)),
                    IpAddr::V6(n) => {
                        IpAddr::V6(Ipv6Addr::from(u128::from(n) + u128::from(k % size)))
                    }
                }
            };
            let block = (subnet.prefix() + extra).min(bits);
            let exclude = excludes
                .into_iter()
                .map(|(k, width)| {
                    let p = (block + width).min(bits).max(subnet.prefix());
                    let e = IpNetwork::new(nth(u32::from(k)), p).unwrap();
                    IpNetwork::new(e.network(), p).unwrap()
                })
                .collect();
            // Aligned to whole blocks or not: the nodes must skip every block one touches.
            let static_ranges = statics
                .into_iter()
                .map(|(k, width)| {
                    let p = (subnet.prefix() + width).min(bits);
                    let r = IpNetwork::new(nth(u32::from(k)), p).unwrap();
                    IpNetwork::new(r.network(), p).unwrap()
                })
                .collect();
            NetworkAddressing {
                pod_network: "net".into(),
                subnets: vec![subnet],
                gateways: if with_gateway { vec![nth(u32::from(g))] } else { vec![] },
                exclude,
                static_ranges,
                block_v4: if v6 { 26 } else { block },
                block_v6: if v6 { block } else { 120 },
                addresses: Vec::new(),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn carved_blocks_are_disjoint_inside_and_cover_the_subnet(p in plan_strategy()) {
        let subnet = p.subnets[0];
        let prefix = p.block_prefix(subnet.is_ipv4());
        let blocks: Vec<IpNetwork> = carve(subnet, prefix).collect();
        prop_assert_eq!(blocks.len() as u128, block_count(subnet, prefix));
        let mut seen = BTreeSet::new();
        for block in &blocks {
            prop_assert!(subnet.contains(block.network()) && subnet.contains(block.broadcast()), "{block} outside {subnet}");
            for ip in addresses(*block) {
                prop_assert!(seen.insert(ip), "{ip} in two blocks");
            }
        }
        prop_assert_eq!(seen.len(), addresses(subnet).len(), "the blocks cover the subnet");
    }

    #[test]
    fn candidates_are_exactly_the_usable_blocks_each_once(p in plan_strategy(), node in "[a-z]{1,8}") {
        let subnet = p.subnets[0];
        let ipv4 = subnet.is_ipv4();
        let got: Vec<IpNetwork> = Candidates::new(&p, ipv4, &node).collect();
        let unique: BTreeSet<IpNetwork> = got.iter().copied().collect();
        prop_assert_eq!(unique.len(), got.len(), "a block twice");
        let expected: BTreeSet<IpNetwork> = carve(subnet, p.block_prefix(ipv4))
            .filter(|b| addresses(*b).into_iter().any(|ip| oracle_allows(&p, subnet, ip)))
            .collect();
        prop_assert_eq!(&unique, &expected);
        for block in &got {
            let inside_exclude = p.exclude.iter().any(|e| e.contains(block.network()) && e.contains(block.broadcast()));
            prop_assert!(!inside_exclude, "{block} lies inside an exclude");
            let touches_static = p.static_ranges.iter().any(|r| r.contains(block.network()) || block.contains(r.network()));
            prop_assert!(!touches_static, "{block} touches a static range");
        }
    }

    #[test]
    fn allocation_never_hands_out_a_blocked_address_or_one_twice_and_exhausts_before_a_new_block(
        p in plan_strategy(),
        node in "[a-z]{1,8}",
        releases in prop::collection::vec(any::<prop::sample::Index>(), 0..8),
    ) {
        let subnet = p.subnets[0];
        let ipv4 = subnet.is_ipv4();
        let (mut ipam, clock) = ipam_with_clock();
        let mut candidates = Candidates::new(&p, ipv4, &node);
        let mut held: BTreeMap<IpAddr, usize> = BTreeMap::new();
        let mut owned_blocks: Vec<IpNetwork> = Vec::new();
        let total_allowed = addresses(subnet).into_iter().filter(|ip| oracle_allows(&p, subnet, *ip)).count();
        let mut i = 0;
        loop {
            match ipam.reserve_in_blocks(&owner(i), &p, ipv4) {
                Some((lease, true)) => {
                    prop_assert!(oracle_allows(&p, subnet, lease.address), "{} may not be handed out", lease.address);
                    prop_assert!(owned_blocks.iter().any(|b| b.contains(lease.address)), "outside every owned block");
                    prop_assert_eq!(lease.interface_address().prefix(), subnet.prefix());
                    prop_assert!(held.insert(lease.address, i).is_none(), "{} twice", lease.address);
                    i += 1;
                }
                Some((_, false)) => prop_assert!(false, "a new owner got an old lease"),
                None => {
                    // Exhausted: every allowed address of the owned blocks is held.
                    for block in &owned_blocks {
                        for ip in addresses(*block).into_iter().filter(|ip| oracle_allows(&p, subnet, *ip)) {
                            prop_assert!(held.contains_key(&ip), "{ip} free in an owned block, yet a new block was asked for");
                        }
                    }
                    match candidates.next() {
                        Some(block) => {
                            owned_blocks.push(block);
                            ipam.add_block(owned(&p, block), true);
                        }
                        None => break,
                    }
                }
            }
        }
        prop_assert_eq!(held.len(), total_allowed, "every allowed address handed out once");
        // Released addresses come back only after their quarantine.
        let leased: Vec<IpAddr> = held.keys().copied().collect();
        let mut freed = BTreeSet::new();
        for index in releases.iter().filter(|_| !leased.is_empty()) {
            let address = leased[index.index(leased.len())];
            let found = ipam.leases().find(|l| l.address == address).cloned();
            if let Some(lease) = found {
                let records = ipam.release_records(std::slice::from_ref(&lease));
                ipam.apply_release(std::slice::from_ref(&lease), &records);
                freed.insert(address);
            }
        }
        prop_assert!(ipam.reserve_in_blocks(&owner(100_000), &p, ipv4).is_none());
        clock.advance(std::time::Duration::from_secs(30));
        for k in 0..freed.len() {
            let (lease, _) = ipam.reserve_in_blocks(&owner(200_000 + k), &p, ipv4).unwrap();
            prop_assert!(freed.contains(&lease.address));
        }
    }
}
