//! The invariants checked after every step of the simulation (DESIGN §4, §6): one address,
//! one pod, in the whole cluster; one block, one node; every address inside its node's
//! block or reservation; no gateway, network or broadcast address handed out; another
//! driver's blocks never touched.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use netclaim::ipam::LeaseStore as _;

use super::node::SimNode;
use super::world::WorldState;
use super::{DRIVER, SimClaim};

/// Blocks of this driver's networks, parsed: (name, cidr, node, reserved claim uid).
fn our_blocks(world: &WorldState) -> Vec<(String, IpNetwork, String, Option<String>)> {
    world
        .blocks
        .iter()
        .filter(|(_, b)| {
            world.networks.get(&b.spec.pod_network).is_none_or(|n| n.spec.provider == DRIVER)
        })
        .filter_map(|(name, b)| {
            let cidr: IpNetwork = b.spec.cidr.parse().ok()?;
            Some((
                name.clone(),
                cidr,
                b.spec.node_name.clone(),
                b.spec.claim.as_ref().map(|c| c.uid.clone()),
            ))
        })
        .collect()
}

fn overlaps(a: IpNetwork, b: IpNetwork) -> bool {
    a.contains(b.network()) || b.contains(a.network())
}

/// Checks every invariant; returns what is broken.
pub(super) fn check(
    world: &WorldState,
    nodes: &BTreeMap<String, SimNode>,
    claims: &BTreeMap<usize, SimClaim>,
    hostile_deleted: &BTreeSet<String>,
) -> Vec<String> {
    let mut broken: Vec<String> = world.violations.clone();
    let blocks = our_blocks(world);
    // No two live blocks (or a block and a reservation) overlap.
    for (i, (a_name, a, a_node, _)) in blocks.iter().enumerate() {
        for (b_name, b, b_node, _) in &blocks[i + 1..] {
            if overlaps(*a, *b) {
                broken.push(format!(
                    "IPBlocks {a_name} ({a} of {a_node}) and {b_name} ({b} of {b_node}) overlap"
                ));
            }
        }
    }
    // Every address of a prepared claim: unique in the cluster, inside a block or
    // reservation of its node, not in a block of another node.
    let mut holders: BTreeMap<IpAddr, String> = BTreeMap::new();
    let mut durable: BTreeMap<IpAddr, String> = BTreeMap::new();
    for node in nodes.values().filter(|n| !n.deleted) {
        let Some(service) = &node.service else {
            broken.push(format!("node {} is not running (its store did not load)", node.name));
            continue;
        };
        if let Some(store) = &node.store
            && !node.disk.powered_off()
            && let Ok(leases) = store.load_leases()
        {
            for lease in leases {
                let who = format!("{} lease of {}", node.name, lease.owner.claim_uid);
                if let Some(other) = durable.insert(lease.address, who.clone()) {
                    broken
                        .push(format!("{} leased twice on disk: {other} and {who}", lease.address));
                }
            }
        }
        for owned in service.owned_blocks() {
            if world.networks.get(&owned.pod_network).is_some_and(|n| n.spec.provider != DRIVER) {
                broken.push(format!(
                    "node {} owns block {} of network {} of another provider",
                    node.name, owned.name, owned.pod_network
                ));
            }
        }
        for prepared in service.all_prepared() {
            for device in &prepared.devices {
                for address in &device.addresses {
                    let ip = address.ip();
                    let who = format!("claim {} on {}", prepared.name, node.name);
                    if let Some(other) = holders.insert(ip, who.clone()) {
                        broken.push(format!("{ip} handed out twice: {other} and {who}"));
                    }
                    let containing: Vec<_> =
                        blocks.iter().filter(|(_, cidr, _, _)| cidr.contains(ip)).collect();
                    for (name, cidr, owner, reserved) in &containing {
                        let ours = *owner == node.name
                            && reserved.as_ref().is_none_or(|uid| *uid == prepared.uid);
                        if !ours {
                            broken.push(format!(
                                "{ip} of {who} lies in IPBlock {name} ({cidr}) of node {owner} (claim {reserved:?})"
                            ));
                        }
                    }
                    let lost_by_hand = service
                        .owned_blocks()
                        .iter()
                        .any(|b| b.cidr.contains(ip) && hostile_deleted.contains(&b.name));
                    if containing.is_empty() && !lost_by_hand {
                        broken.push(format!("{ip} of {who} lies in no IPBlock of its node"));
                    }
                }
            }
        }
    }
    // What kubelet was told stays true, and no forbidden address was handed out.
    for claim in claims.values() {
        let Some(acked) = &claim.acked else { continue };
        let Some(node) = nodes.get(&claim.node).filter(|n| !n.deleted) else { continue };
        for address in acked {
            if claim.forbidden.contains(&address.ip()) {
                broken.push(format!(
                    "claim {} on {} holds {address}: a gateway, network or broadcast address",
                    claim.name, claim.node
                ));
            }
        }
        // An unprepare in flight may have forgotten it already.
        let Some(service) = node.service.as_ref().filter(|_| claim.want_prepared) else { continue };
        let now: Option<Vec<IpNetwork>> = service
            .prepared(&claim.uid)
            .map(|p| p.devices.iter().flat_map(|d| d.addresses.clone()).collect());
        if now.as_ref() != Some(acked) {
            broken.push(format!(
                "claim {} on {}: kubelet was told {acked:?}, the node now has {now:?}",
                claim.name, claim.node
            ));
        }
    }
    broken
}

/// What is left once every claim is gone and the grace passed: leases on any node, blocks of
/// this driver's networks in the API, blocks a node still owns.
pub(super) fn leftovers(world: &WorldState, nodes: &BTreeMap<String, SimNode>) -> Vec<String> {
    let mut left = Vec::new();
    for (name, _, node, _) in our_blocks(world) {
        left.push(format!("IPBlock {name} of node {node} left in the API"));
    }
    for node in nodes.values().filter(|n| !n.deleted) {
        if let Some(store) = &node.store
            && let Ok(leases) = store.load_leases()
        {
            for lease in leases {
                left.push(format!("{} still leases {}", node.name, lease.address));
            }
        }
        if let Some(service) = &node.service {
            for owned in service.owned_blocks() {
                left.push(format!("{} still owns {}", node.name, owned.name));
            }
        }
    }
    left
}
