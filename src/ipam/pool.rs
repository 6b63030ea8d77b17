//! The pure allocator: which addresses of a pool may be handed out, and the lowest free one.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

use crate::model::network_config::PoolSpec;

/// An address as a number in its family's space, for range arithmetic.
pub(crate) fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address `n` of the same family as `like`. For IPv4 `n` always comes from a range
/// inside an IPv4 subnet, so it fits in 32 bits.
pub(crate) fn from_u128(n: u128, like: IpAddr) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::from(u32::try_from(n).unwrap_or(u32::MAX))),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// Inclusive numeric ranges that are never handed out: the IPv4 network and broadcast
/// addresses (prefixes up to /30; RFC 3021 /31s have neither), the IPv6 subnet-router
/// anycast address (RFC 4291 §2.6.1, prefixes up to /126), the gateway, and `exclude`.
pub(crate) fn blocked_ranges(spec: &PoolSpec) -> Vec<(u128, u128)> {
    let subnet = spec.subnet;
    let mut blocked = Vec::with_capacity(spec.exclude.len() + 3);
    let network = to_u128(subnet.network());
    match subnet {
        IpNetwork::V4(v4) if v4.prefix() <= 30 => {
            blocked.push((network, network));
            let broadcast = to_u128(IpAddr::V4(v4.broadcast()));
            blocked.push((broadcast, broadcast));
        }
        IpNetwork::V6(v6) if v6.prefix() <= 126 => blocked.push((network, network)),
        _ => {}
    }
    if let Some(gateway) = spec.gateway {
        let g = to_u128(gateway);
        blocked.push((g, g));
    }
    for net in &spec.exclude {
        if net.is_ipv4() == subnet.is_ipv4() {
            blocked.push((to_u128(net.network()), to_u128(net.broadcast())));
        }
    }
    blocked
}

/// Whether the pool may hand out `ip` (in range, not blocked); ignores existing leases.
#[must_use]
pub fn is_allocatable(spec: &PoolSpec, ip: IpAddr) -> bool {
    if ip.is_ipv4() != spec.subnet.is_ipv4() || !spec.subnet.contains(ip) {
        return false;
    }
    let n = to_u128(ip);
    n >= to_u128(spec.range_start)
        && n <= to_u128(spec.range_end)
        && !blocked_ranges(spec).iter().any(|&(lo, hi)| (lo..=hi).contains(&n))
}

/// The lowest address of the pool that is allocatable and not in `used`. Costs
/// O((leases + excludes) · excludes · log leases), independent of the range size, so an IPv6
/// /64 is as cheap as an IPv4 /24.
#[must_use]
pub fn first_free<V>(spec: &PoolSpec, used: &BTreeMap<IpAddr, V>) -> Option<IpAddr> {
    let like = spec.range_start;
    let found = lowest_free(
        to_u128(spec.range_start),
        to_u128(spec.range_end),
        &blocked_ranges(spec),
        |candidate| skip_run(used, candidate, like),
    )?;
    Some(from_u128(found, like))
}

/// The lowest number in `lo..=hi` outside every `blocked` range (inclusive) for which
/// `unoccupied_from(c)` (the first unoccupied number at or after `c`, skipping a run of
/// occupied ones; `None` past the family's end) returns `c` itself. The allocator of every
/// pool kind: node-local pools, blocks.
pub(crate) fn lowest_free(
    lo: u128,
    hi: u128,
    blocked: &[(u128, u128)],
    unoccupied_from: impl Fn(u128) -> Option<u128>,
) -> Option<u128> {
    let mut candidate = lo;
    loop {
        if candidate > hi {
            return None;
        }
        if let Some(&(_, end)) =
            blocked.iter().find(|(b_lo, b_hi)| (*b_lo..=*b_hi).contains(&candidate))
        {
            candidate = end.checked_add(1)?;
            continue;
        }
        let next = unoccupied_from(candidate)?;
        if next == candidate {
            return Some(candidate);
        }
        candidate = next;
    }
}

/// The first number at or after `candidate` (an address of `like`'s family) that is not a
/// key of `used`, skipping the run of consecutive keys starting at `candidate`.
pub(crate) fn skip_run<V>(
    used: &BTreeMap<IpAddr, V>,
    candidate: u128,
    like: IpAddr,
) -> Option<u128> {
    let mut next = candidate;
    let same_family = used
        .range(from_u128(candidate, like)..)
        .map(|(ip, _)| *ip)
        .take_while(|ip| ip.is_ipv4() == like.is_ipv4());
    for used_ip in same_family.map(to_u128) {
        if used_ip != next {
            break;
        }
        next = next.checked_add(1)?;
    }
    Some(next)
}

/// The first setting in which two specs of the same subnet differ, as the config field that
/// names it; `None` when they describe the same pool.
#[must_use]
pub fn differing_setting(a: &PoolSpec, b: &PoolSpec) -> Option<&'static str> {
    if a.gateway != b.gateway {
        Some("ipam.pool.gateway")
    } else if a.range_start != b.range_start {
        Some("ipam.pool.rangeStart")
    } else if a.range_end != b.range_end {
        Some("ipam.pool.rangeEnd")
    } else if a.exclude != b.exclude {
        Some("ipam.pool.exclude")
    } else {
        None
    }
}
