//! Live objects that contradict a network's spec (pure): the CRD's CEL rules keep most edits
//! safe, but an old API server or `kubectl replace` can bypass them, so the controller
//! compares each spec with what the cluster holds whatever the API server accepted.
//!
//! What it can see is the spec, the network's `IPBlock`s (every node's) and the addresses
//! the claims' device statuses report for the network. It reports:
//!
//! - an IPBlock whose CIDR does not parse, a block (no `spec.claim`) outside every subnet or
//!   overlapping a `staticRanges` entry (a node could hand out an address a claim may
//!   reserve), a reservation (`spec.claim`) outside every `staticRanges` entry;
//! - a reservation that is a gateway, a subnet's network or broadcast address (IPv4) or its
//!   subnet-router anycast address (IPv6);
//! - two IPBlocks of the network overlapping, whatever their names and nodes;
//! - an address handed out (in a claim's status) that is a gateway, a network, broadcast or
//!   subnet-router anycast address, or inside `exclude` without being inside `staticRanges`.
//!
//! A gateway or excluded address inside a block is not by itself a conflict: nodes skip
//! those inside their blocks, so only one actually handed out is (the last rule).

use std::collections::BTreeSet;
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use crate::model::pod_network::{IpBlock, PodNetwork};

/// An address a claim's status reports for the network.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LeasedAddress {
    /// The address.
    pub address: IpAddr,
    /// `<namespace>/<name>` of the claim.
    pub claim: String,
    /// The node (the device's pool).
    pub node: String,
}

/// One contradiction, as the condition's message says it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict(pub String);

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The spec's address sets, parsed leniently: an entry that does not parse is left out (the
/// `Ready` verdict names it as Invalid).
struct Spec {
    subnets: Vec<IpNetwork>,
    gateways: Vec<IpAddr>,
    exclude: Vec<IpNetwork>,
    static_ranges: Vec<IpNetwork>,
}

impl Spec {
    fn of(network: &PodNetwork) -> Spec {
        let ipam = network.spec.ipam.as_ref();
        let nets = |list: Option<&Vec<String>>| -> Vec<IpNetwork> {
            list.into_iter().flatten().filter_map(|cidr| cidr.parse().ok()).collect()
        };
        Spec {
            subnets: nets(ipam.map(|ipam| &ipam.subnets)),
            gateways: ipam
                .into_iter()
                .flat_map(|ipam| &ipam.gateways)
                .filter_map(|gateway| gateway.parse().ok())
                .collect(),
            exclude: nets(ipam.map(|ipam| &ipam.exclude)),
            static_ranges: nets(ipam.map(|ipam| &ipam.static_ranges)),
        }
    }

    /// Why `address` may never be held by a pod, if it may not.
    fn forbidden(&self, address: IpAddr) -> Option<String> {
        if self.gateways.contains(&address) {
            return Some("a gateway".to_owned());
        }
        for subnet in &self.subnets {
            if !subnet.contains(address) {
                continue;
            }
            match subnet {
                IpNetwork::V4(v4) if v4.prefix() < 31 => {
                    if address == IpAddr::V4(v4.network()) {
                        return Some(format!("the network address of subnet {subnet}"));
                    }
                    if address == IpAddr::V4(v4.broadcast()) {
                        return Some(format!("the broadcast address of subnet {subnet}"));
                    }
                }
                IpNetwork::V6(v6) if v6.prefix() < 127 && address == IpAddr::V6(v6.network()) => {
                    return Some(format!("the subnet-router anycast address of subnet {subnet}"));
                }
                _ => {}
            }
        }
        None
    }
}

fn overlap(a: &IpNetwork, b: &IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

fn inside(inner: &IpNetwork, outer: &IpNetwork) -> bool {
    inner.is_ipv4() == outer.is_ipv4()
        && outer.prefix() <= inner.prefix()
        && outer.contains(inner.network())
}

fn describe(block: &IpBlock) -> String {
    let name = block.metadata.name.as_deref().unwrap_or_default();
    match &block.spec.claim {
        Some(claim) => format!(
            "reservation {name} ({}, node {}, claim {}/{})",
            block.spec.cidr, block.spec.node_name, claim.namespace, claim.name
        ),
        None => format!("IPBlock {name} ({}, node {})", block.spec.cidr, block.spec.node_name),
    }
}

/// Every contradiction between `network`'s spec, its live `blocks` (every node's; blocks of
/// other networks are ignored) and the addresses `leased` from it, sorted and without
/// duplicates.
#[must_use]
pub fn find(network: &PodNetwork, blocks: &[&IpBlock], leased: &[LeasedAddress]) -> Vec<Conflict> {
    let name = network.metadata.name.as_deref().unwrap_or_default();
    let spec = Spec::of(network);
    let mut found = BTreeSet::new();
    let mut parsed: Vec<(&IpBlock, IpNetwork)> = Vec::new();
    for block in blocks.iter().copied().filter(|block| block.spec.pod_network == name) {
        let Ok(cidr) = block.spec.cidr.parse::<IpNetwork>() else {
            found.insert(format!("{} does not hold a CIDR", describe(block)));
            continue;
        };
        parsed.push((block, cidr));
        if block.spec.claim.is_some() {
            if !spec.static_ranges.iter().any(|range| inside(&cidr, range)) {
                found.insert(format!(
                    "{} lies outside every spec.ipam.staticRanges entry",
                    describe(block)
                ));
            }
            if let Some(why) = spec.forbidden(cidr.network()) {
                found.insert(format!("{} reserves {}, {why}", describe(block), cidr.network()));
            }
        } else {
            if !spec.subnets.iter().any(|subnet| inside(&cidr, subnet)) {
                found.insert(format!(
                    "{} lies outside every spec.ipam.subnets entry",
                    describe(block)
                ));
            }
            for range in spec.static_ranges.iter().filter(|range| overlap(&cidr, range)) {
                found.insert(format!(
                    "{} overlaps spec.ipam.staticRanges entry {range}, from which claims reserve \
                     static addresses",
                    describe(block)
                ));
            }
        }
    }
    for (i, (a, a_cidr)) in parsed.iter().enumerate() {
        for (b, b_cidr) in &parsed[i + 1..] {
            if overlap(a_cidr, b_cidr) {
                let (first, second) = if describe(a) <= describe(b) { (a, b) } else { (b, a) };
                found.insert(format!("{} overlaps {}", describe(first), describe(second)));
            }
        }
    }
    for lease in leased {
        let holder =
            format!("address {} of claim {} on node {}", lease.address, lease.claim, lease.node);
        if let Some(why) = spec.forbidden(lease.address) {
            found.insert(format!("{holder} is {why}"));
        } else if let Some(entry) = spec.exclude.iter().find(|entry| entry.contains(lease.address))
            && !spec.static_ranges.iter().any(|range| range.contains(lease.address))
        {
            found.insert(format!("{holder} lies in spec.ipam.exclude entry {entry}"));
        }
    }
    found.into_iter().map(Conflict).collect()
}

/// The condition message for `conflicts`: the first few, then how many more.
#[must_use]
pub fn message(conflicts: &[Conflict]) -> String {
    const SHOWN: usize = 8;
    let mut text =
        conflicts.iter().take(SHOWN).map(ToString::to_string).collect::<Vec<_>>().join("; ");
    if conflicts.len() > SHOWN {
        let _ = write!(text, "; and {} more", conflicts.len() - SHOWN);
    }
    text.push_str(": nodes hand out no new address of this network until this is resolved");
    text
}

#[cfg(test)]
mod tests;
