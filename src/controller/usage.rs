//! What the cluster holds of a network (pure): the addresses its claims report, the blocks
//! and reservations per node, and the status the sweep writes from them (`status.nodes` and
//! the `Conflict` condition), leaving the reconciler's `Ready` condition as it is.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use super::conflicts::{self, Conflict, LeasedAddress};
use crate::model::pod_network::{
    CONDITION_CONFLICT, IpBlock, NodeUsage, PodNetwork, PodNetworkStatus, conflict_reason,
};

/// Every address the claims' device statuses of `driver` report for a network, by network
/// name: entries whose `data.podNetwork.name` names it, their `networkData.ips` (CIDR
/// notation, the address before the `/`), on the node the entry's pool names.
#[must_use]
pub fn leased_addresses(
    claims: &[ResourceClaim],
    driver: &str,
) -> BTreeMap<String, Vec<LeasedAddress>> {
    let mut out: BTreeMap<String, Vec<LeasedAddress>> = BTreeMap::new();
    for claim in claims {
        let devices = claim.status.as_ref().and_then(|status| status.devices.as_deref());
        for device in devices.unwrap_or_default().iter().filter(|d| d.driver == driver) {
            let Some(network) = device
                .data
                .as_ref()
                .and_then(|data| data.0.pointer("/podNetwork/name"))
                .and_then(serde_json::Value::as_str)
            else {
                continue;
            };
            let ips = device.network_data.as_ref().and_then(|data| data.ips.as_deref());
            for ip in ips.unwrap_or_default() {
                let text = ip.split_once('/').map_or(ip.as_str(), |(address, _)| address);
                let Ok(address) = text.parse::<IpAddr>() else { continue };
                out.entry(network.to_owned()).or_default().push(LeasedAddress {
                    address,
                    claim: format!(
                        "{}/{}",
                        claim.metadata.namespace.as_deref().unwrap_or_default(),
                        claim.metadata.name.as_deref().unwrap_or_default()
                    ),
                    node: device.pool.clone(),
                });
            }
        }
    }
    out
}

/// Per node (sorted by name): its blocks and reservations among `blocks`, and its addresses
/// among `leased`. A node with none of them is not listed.
#[must_use]
pub fn node_usage(blocks: &[&IpBlock], leased: &[LeasedAddress]) -> Vec<NodeUsage> {
    let mut nodes: BTreeMap<&str, NodeUsage> = BTreeMap::new();
    for block in blocks {
        let usage = nodes.entry(block.spec.node_name.as_str()).or_insert_with(|| NodeUsage {
            node_name: block.spec.node_name.clone(),
            ..NodeUsage::default()
        });
        if block.spec.claim.is_some() {
            usage.reservations += 1;
        } else {
            usage.blocks += 1;
        }
    }
    for lease in leased {
        nodes
            .entry(lease.node.as_str())
            .or_insert_with(|| NodeUsage { node_name: lease.node.clone(), ..NodeUsage::default() })
            .addresses += 1;
    }
    nodes.into_values().collect()
}

/// The status `network` should have after a sweep found `conflicts` and `usage`: `nodes`
/// replaced, the `Conflict` condition `True` naming them, or `False` once resolved (absent
/// while there never was one, so a network without trouble carries no extra condition);
/// everything else as it is. `lastTransitionTime` changes only with the condition's status.
#[must_use]
pub fn observed_status(
    network: &PodNetwork,
    conflicts: &[Conflict],
    usage: Vec<NodeUsage>,
    now: Timestamp,
) -> PodNetworkStatus {
    let mut status = network.status.clone().unwrap_or_default();
    status.nodes = usage;
    let position = status.conditions.iter().position(|c| c.type_ == CONDITION_CONFLICT);
    let (value, reason, message) = if conflicts.is_empty() {
        (
            "False",
            conflict_reason::RESOLVED,
            "no live IPBlock or address contradicts the spec".to_owned(),
        )
    } else {
        ("True", conflict_reason::CONFLICT, conflicts::message(conflicts))
    };
    let previous = position.map(|i| &status.conditions[i]);
    if previous.is_none() && conflicts.is_empty() {
        return status;
    }
    let last_transition_time = match previous {
        Some(previous) if previous.status == value => previous.last_transition_time.clone(),
        _ => Time(now),
    };
    let condition = Condition {
        type_: CONDITION_CONFLICT.to_owned(),
        status: value.to_owned(),
        reason: reason.to_owned(),
        message,
        observed_generation: network.metadata.generation,
        last_transition_time,
    };
    match position {
        Some(i) => status.conditions[i] = condition,
        None => status.conditions.push(condition),
    }
    status
}

#[cfg(test)]
mod tests;
