//! Pure block IPAM of a `PodNetwork` (DESIGN §4): each subnet is cut into blocks of the
//! network's `blockSize`; a node owns whole blocks (one `IPBlock` object each, claimed in
//! the API by the caller) and hands out the addresses inside them alone.
//!
//! - [`block_count`] / [`block_at`] / [`carve`]: the blocks of a subnet, by index. A block
//!   prefix at or above the subnet's prefix gives one block, the subnet itself.
//! - [`blocked_ranges`]: what is never handed out inside a subnet: the network's `exclude`,
//!   its `staticRanges` widened to the blocks they touch (no block is ever carved over one),
//!   its gateways, the IPv4 network and broadcast addresses of the *subnet* (prefixes up to
//!   /30; a block's own first and last addresses are ordinary hosts) and the IPv6
//!   subnet-router anycast address (RFC 4291 §2.6.1, prefixes up to /126).
//! - [`Candidates`]: the blocks of one family in the order a node tries to claim them: the
//!   subnets in order, each from a start derived from a hash of the node's name (so nodes do
//!   not all race for the first block), wrapping; blocks with no address a pod may get (inside
//!   `exclude` or touching a static range, or only a gateway) are skipped, runs of excluded blocks in one jump, so an
//!   IPv6 /64 of 2^56 blocks costs what its excludes cost.
//! - [`first_free`]: the lowest address of a block that may be handed out and is not
//!   occupied.
//!
//! Addresses are numbers in their family's space (`u128`), as in [`super::pool`].

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use sha2::{Digest as _, Sha256};

use super::pool::{from_u128, lowest_free, to_u128};
use crate::model::network_config::NetworkAddressing;

/// The width of a family's address space in bits.
fn family_bits(subnet: IpNetwork) -> u8 {
    if subnet.is_ipv4() { 32 } else { 128 }
}

/// The effective block prefix in `subnet`: a block never spans more than the subnet.
fn effective_prefix(subnet: IpNetwork, prefix: u8) -> u8 {
    prefix.clamp(subnet.prefix(), family_bits(subnet))
}

/// Addresses per block of `prefix` in a family of `bits`; `None` for a whole IPv6 space
/// (2^128 does not fit).
fn block_len(bits: u8, prefix: u8) -> Option<u128> {
    1u128.checked_shl(u32::from(bits - prefix))
}

/// How many blocks of `prefix` `subnet` holds (at least one).
#[must_use]
pub fn block_count(subnet: IpNetwork, prefix: u8) -> u128 {
    let prefix = effective_prefix(subnet, prefix);
    // At most 2^128 / 2^0 blocks; a /0 cut into /128s does not fit, and is clamped (no one
    // can enumerate that many blocks anyway).
    1u128.checked_shl(u32::from(prefix - subnet.prefix())).unwrap_or(u128::MAX)
}

/// The `index`-th block of `prefix` in `subnet` (`index < block_count`).
#[must_use]
pub fn block_at(subnet: IpNetwork, prefix: u8, index: u128) -> IpNetwork {
    let prefix = effective_prefix(subnet, prefix);
    let bits = family_bits(subnet);
    let start = block_len(bits, prefix)
        .and_then(|len| index.checked_mul(len))
        .and_then(|offset| to_u128(subnet.network()).checked_add(offset))
        .unwrap_or_else(|| to_u128(subnet.network()));
    // A network of a valid address and a prefix within the family is always valid.
    IpNetwork::new(from_u128(start, subnet.network()), prefix).unwrap_or(subnet)
}

/// Every block of `prefix` in `subnet`, lowest first.
pub fn carve(subnet: IpNetwork, prefix: u8) -> impl Iterator<Item = IpNetwork> {
    (0..block_count(subnet, prefix)).map(move |i| block_at(subnet, prefix, i))
}

/// The numeric range of a network.
fn range_of(net: IpNetwork) -> (u128, u128) {
    (to_u128(net.network()), to_u128(net.broadcast()))
}

/// Sorts and merges inclusive ranges (overlapping or adjacent ones become one).
fn merge_ranges(mut ranges: Vec<(u128, u128)>) -> Vec<(u128, u128)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    merged
}

/// The network's excludes within `subnet`, as merged numeric ranges.
fn excluded_ranges(plan: &NetworkAddressing, subnet: IpNetwork) -> Vec<(u128, u128)> {
    let (s_lo, s_hi) = range_of(subnet);
    merge_ranges(
        plan.exclude
            .iter()
            .filter(|e| e.is_ipv4() == subnet.is_ipv4())
            .map(|e| range_of(*e))
            .filter(|(lo, hi)| *hi >= s_lo && *lo <= s_hi)
            .map(|(lo, hi)| (lo.max(s_lo), hi.min(s_hi)))
            .collect(),
    )
}

/// The network's static ranges within `subnet`, each widened to the blocks it touches: a
/// block that shares one address with a static range is never carved, so a static /32 (/128)
/// reservation and a block never overlap (DESIGN §4). The controller refuses ranges that do
/// not cover whole blocks; a node that sees such a spec first loses the rest of those
/// blocks rather than risk it.
fn static_block_ranges(plan: &NetworkAddressing, subnet: IpNetwork) -> Vec<(u128, u128)> {
    let (s_lo, s_hi) = range_of(subnet);
    let prefix = effective_prefix(subnet, plan.block_prefix(subnet.is_ipv4()));
    // A block spanning a whole IPv6 space: any static range touches it.
    let len = block_len(family_bits(subnet), prefix);
    plan.static_ranges
        .iter()
        .filter(|r| r.is_ipv4() == subnet.is_ipv4())
        .map(|r| range_of(*r))
        .filter(|(lo, hi)| *hi >= s_lo && *lo <= s_hi)
        .map(|(lo, hi)| {
            let (lo, hi) = (lo.max(s_lo), hi.min(s_hi));
            match len {
                // Blocks start at the subnet's first address, a multiple of their length.
                Some(len) => (lo - (lo - s_lo) % len, hi + (len - 1 - (hi - s_lo) % len)),
                None => (s_lo, s_hi),
            }
        })
        .collect()
}

/// Inclusive numeric ranges of `subnet` never handed out from blocks (sorted, merged): the
/// network's `exclude`, its static ranges widened to whole blocks, its gateways, and the
/// subnet's network/broadcast (IPv4 up to /30) or subnet-router anycast (IPv6 up to /126)
/// address.
#[must_use]
pub fn blocked_ranges(plan: &NetworkAddressing, subnet: IpNetwork) -> Vec<(u128, u128)> {
    let mut ranges = excluded_ranges(plan, subnet);
    ranges.extend(static_block_ranges(plan, subnet));
    let network = to_u128(subnet.network());
    match subnet {
        IpNetwork::V4(v4) if v4.prefix() <= 30 => {
            ranges.push((network, network));
            let broadcast = to_u128(IpAddr::V4(v4.broadcast()));
            ranges.push((broadcast, broadcast));
        }
        IpNetwork::V6(v6) if v6.prefix() <= 126 => ranges.push((network, network)),
        _ => {}
    }
    for gateway in plan.gateways.iter().filter(|g| subnet.contains(**g)) {
        let g = to_u128(*gateway);
        ranges.push((g, g));
    }
    merge_ranges(ranges)
}

/// How many addresses of `block` may be handed out (its size less what `blocked`, merged
/// ranges, takes of it).
#[must_use]
pub fn capacity(block: IpNetwork, blocked: &[(u128, u128)]) -> u128 {
    let (lo, hi) = range_of(block);
    let taken: u128 = blocked
        .iter()
        .filter(|(b_lo, b_hi)| *b_hi >= lo && *b_lo <= hi)
        .map(|(b_lo, b_hi)| (*b_hi).min(hi) - (*b_lo).max(lo) + 1)
        .sum();
    // A whole IPv6 space as one block: 2^128 does not fit; nothing real is that large.
    (hi - lo).saturating_add(1).saturating_sub(taken)
}

/// The merged range of `blocked` that covers all of `lo..=hi`, if one does.
fn covering(blocked: &[(u128, u128)], lo: u128, hi: u128) -> Option<(u128, u128)> {
    blocked.iter().copied().find(|(b_lo, b_hi)| *b_lo <= lo && hi <= *b_hi)
}

/// Whether `block` has no address a pod may get (all of it blocked).
#[must_use]
pub fn is_unusable(block: IpNetwork, blocked: &[(u128, u128)]) -> bool {
    let (lo, hi) = range_of(block);
    lowest_free(lo, hi, blocked, Some).is_none()
}

/// Where `node` starts its search among `count` blocks (DESIGN §4): the first 128 bits of
/// SHA-256 of its name, modulo the count. Stable across restarts and releases.
#[must_use]
pub fn start_index(node: &str, count: u128) -> u128 {
    let digest = Sha256::digest(node.as_bytes());
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(first) % count.max(1)
}

/// The lowest address of `block` (inside `subnet`, with `blocked` from [`blocked_ranges`])
/// that may be handed out and for which `unoccupied_from` (see [`super::pool`]) says it is
/// free.
pub fn first_free(
    block: IpNetwork,
    blocked: &[(u128, u128)],
    unoccupied_from: impl Fn(u128) -> Option<u128>,
) -> Option<IpAddr> {
    let (lo, hi) = range_of(block);
    lowest_free(lo, hi, blocked, unoccupied_from).map(|n| from_u128(n, block.network()))
}

/// The blocks of one family of a network in the order a node tries them (see the module
/// docs). Finite: every block of every subnet of the family at most once.
#[derive(Debug, Clone)]
pub struct Candidates {
    /// `(subnet, its effective block prefix, its block count, blocked ranges, start)`, in
    /// order, the current one first.
    subnets: Vec<SubnetWalk>,
}

#[derive(Debug, Clone)]
struct SubnetWalk {
    subnet: IpNetwork,
    prefix: u8,
    count: u128,
    blocked: Vec<(u128, u128)>,
    start: u128,
    /// Blocks visited so far (from `start`, wrapping).
    visited: u128,
}

impl Candidates {
    /// The candidates of family `ipv4` of `plan` for `node`.
    #[must_use]
    pub fn new(plan: &NetworkAddressing, ipv4: bool, node: &str) -> Candidates {
        let prefix = plan.block_prefix(ipv4);
        let subnets = plan
            .subnets_of(ipv4)
            .map(|subnet| {
                let count = block_count(subnet, prefix);
                SubnetWalk {
                    subnet,
                    prefix: effective_prefix(subnet, prefix),
                    count,
                    blocked: blocked_ranges(plan, subnet),
                    start: start_index(node, count),
                    visited: 0,
                }
            })
            .collect::<Vec<_>>();
        // Walked from the back: the first subnet last.
        let subnets = subnets.into_iter().rev().collect();
        Candidates { subnets }
    }
}

impl SubnetWalk {
    /// The next usable block, jumping over runs of blocked ones.
    fn next_block(&mut self) -> Option<IpNetwork> {
        while self.visited < self.count {
            // Index of the current block, wrapping at the end of the subnet. `start < count`
            // and `visited < count`, so the sum fits when it wraps below `count` again.
            let until_end = self.count - self.start;
            let index = if self.visited < until_end {
                self.start + self.visited
            } else {
                self.visited - until_end
            };
            let block = block_at(self.subnet, self.prefix, index);
            let (lo, hi) = range_of(block);
            if let Some((_, cover_hi)) = covering(&self.blocked, lo, hi) {
                // Every block up to the last one inside the covering range is blocked too: skip
                // them at once, without stepping past the wrap point or the subnet's end.
                let skip = match (hi - lo).checked_add(1) {
                    Some(len) => {
                        let offset = cover_hi - to_u128(self.subnet.network());
                        let last_covered = (offset - (len - 1)) / len;
                        let segment_end =
                            if index >= self.start { self.count - 1 } else { self.start - 1 };
                        last_covered.min(segment_end) - index + 1
                    }
                    // One block spanning a whole IPv6 space: it is the only block.
                    None => 1,
                };
                self.visited += skip;
                continue;
            }
            self.visited += 1;
            if is_unusable(block, &self.blocked) {
                continue;
            }
            return Some(block);
        }
        None
    }
}

impl Iterator for Candidates {
    type Item = IpNetwork;

    fn next(&mut self) -> Option<IpNetwork> {
        loop {
            let walk = self.subnets.last_mut()?;
            if let Some(block) = walk.next_block() {
                return Some(block);
            }
            self.subnets.pop();
        }
    }
}

/// The subnet of `plan` that holds `block` (a block never spans two subnets).
#[must_use]
pub fn subnet_of(plan: &NetworkAddressing, block: IpNetwork) -> Option<IpNetwork> {
    plan.subnets.iter().copied().find(|s| {
        s.is_ipv4() == block.is_ipv4()
            && s.contains(block.network())
            && s.prefix() <= block.prefix()
    })
}

/// The block of `plan` an address of a block lease lies in (the `IPBlock` it came from):
/// the block of the subnet holding `ip`; `None` outside every subnet.
#[must_use]
pub fn block_of(plan: &NetworkAddressing, ip: IpAddr) -> Option<IpNetwork> {
    let subnet = plan.subnets.iter().copied().find(|s| s.contains(ip))?;
    let prefix = effective_prefix(subnet, plan.block_prefix(subnet.is_ipv4()));
    let network = IpNetwork::new(ip, prefix).ok()?.network();
    IpNetwork::new(network, prefix).ok()
}

#[cfg(test)]
mod tests;
