//! [`DeviceFacts`] of an allocated device name, from the node's current interfaces, the
//! operator's selection and the PodNetworks of the node (the scheduler copies no attributes
//! into the claim, so the driver re-derives its own inventory). Pure.
//!
//! A device that left the slice still resolves: a PodNetwork's shared device
//! (`<podnetwork>-<parent>`) after its network was disabled, deleted or stopped selecting the
//! node, and a plain `--shared-parents` device after a PodNetwork took its parent over,
//! resolve to their parent's facts, so a claim allocated just before the change is still
//! prepared and its pod keeps working (DESIGN §4: `enabled: false` keeps running pods).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use crate::claims::{ResolvedDevice, vf_of};
use crate::inventory::networks::NodeNetworks;
use crate::inventory::{
    Inventory, Selection, SharingMode, base_device_name, device_kind, put_string,
    shared_parent_exclusion,
};
use crate::model::bandwidth::BitsPerSecond;
use crate::model::device::{self, AttributeValue, Device, HostInterface, Sharing, SriovRole};
use crate::model::names::attr;
use crate::model::network_config::{DeviceFacts, DeviceKind, Sharing as ConfigSharing};
use crate::model::pod_network::shared_device_name;

/// Smallest MTU Linux accepts on an Ethernet device without `IFLA_MIN_MTU` (`ETH_MIN_MTU`).
const DEFAULT_MIN_MTU: u32 = 68;
/// Largest MTU when the driver reports none (`IP_MAX_MTU`).
const DEFAULT_MAX_MTU: u32 = 65535;

/// What a device name is looked up in: the node's interfaces, the selection, its PodNetworks
/// now, and the names of networks seen before (which may be gone from the API).
#[derive(Debug, Clone, Copy)]
pub struct LookupContext<'a> {
    /// The node's interfaces now.
    pub interfaces: &'a [HostInterface],
    /// The operator's selection.
    pub selection: &'a Selection,
    /// The node's PodNetworks now.
    pub networks: &'a NodeNetworks,
    /// Names of PodNetworks seen earlier (for devices of networks deleted since).
    pub seen_networks: &'a BTreeSet<String>,
    /// The inventories built from the four above so far; share one between contexts only
    /// while those four are unchanged.
    pub built: &'a BuiltInventories,
}

/// The node's inventory in each sharing mode, with and without its PodNetworks, each built at
/// most once: the lookups of one kubelet request (facts, attributes and parent limit of each
/// of its claims, up to a hundred) read the same few instead of rebuilding the node's whole
/// inventory several times per claim.
#[derive(Debug, Default)]
pub struct BuiltInventories {
    capacity: OnceLock<Inventory>,
    slots: OnceLock<Inventory>,
    capacity_without_networks: OnceLock<Inventory>,
    slots_without_networks: OnceLock<Inventory>,
}

impl LookupContext<'_> {
    /// The inventory this node publishes in `mode`, with its PodNetworks or without any.
    fn inventory(&self, mode: SharingMode, with_networks: bool) -> &Inventory {
        let built = self.built;
        let cell = match (mode, with_networks) {
            (SharingMode::Capacity, true) => &built.capacity,
            (SharingMode::Slots, true) => &built.slots,
            (SharingMode::Capacity, false) => &built.capacity_without_networks,
            (SharingMode::Slots, false) => &built.slots_without_networks,
        };
        cell.get_or_init(|| {
            let selection = self.selection.clone().with_sharing_mode(mode);
            if with_networks {
                Inventory::build_with(self.interfaces, &selection, self.networks)
            } else {
                Inventory::build_with(self.interfaces, &selection, &NodeNetworks::default())
            }
        })
    }
}

/// Facts of device `name` as this node would publish it now. Both sharing modes are tried:
/// slot names (`<parent>-s<N>`) and shared-parent names never collide, and a claim
/// allocated before the publisher fell back to slots still names its device. A slot maps to
/// its parent interface. A shared device that left the slice resolves to its parent (see the
/// module doc). Child counts are left at 0: the caller adds the children it planned itself.
#[must_use]
pub fn device_facts(context: &LookupContext<'_>, name: &str) -> Option<DeviceFacts> {
    let device = find_device(context, name)?;
    let interface = context.interfaces.iter().find(|i| i.name == device.if_name)?;
    Some(facts_of(&device, interface, context.interfaces))
}

/// The attributes device `name` is published with now, or was published with (a shared
/// device that left the slice: its parent's, with `podNetwork`).
#[must_use]
pub fn device_attributes(
    context: &LookupContext<'_>,
    name: &str,
) -> Option<BTreeMap<String, AttributeValue>> {
    find_device(context, name).map(|device| device.attributes)
}

/// How many sub-interfaces parent `if_name` may carry in all: the largest
/// `netclaim.dev/interfaces` this node publishes for it (each PodNetwork's
/// `interfaceCapacity`, or the `--shared-parents` capacity). Networks on one parent share
/// it: the scheduler counts each device's capacity alone. `None` when nothing shared is
/// published on it now (claims already there keep working; nothing is refused).
#[must_use]
pub fn parent_limit(context: &LookupContext<'_>, if_name: &str) -> Option<u32> {
    context
        .inventory(SharingMode::Capacity, true)
        .devices
        .iter()
        .filter(|d| d.if_name == if_name)
        .filter_map(|d| d.shared_capacity)
        .max()
}

/// The most any device published on parent `if_name` offers as `netclaim.dev/bandwidth`
/// (networks on one parent share it, as they share [`parent_limit`]); `None` when none is.
#[must_use]
pub fn parent_bandwidth(context: &LookupContext<'_>, if_name: &str) -> Option<BitsPerSecond> {
    context
        .inventory(SharingMode::Capacity, true)
        .devices
        .iter()
        .filter(|d| d.if_name == if_name)
        .filter_map(|d| d.bandwidth)
        .max()
}

/// Everything a prepare needs of device `name` from one context ([`ResolvedDevice`]): its
/// facts, its parent's limit (shared and slot devices), the VF it is (from its `pfName` and
/// `vfIndex`), and its published attributes when `with_attributes`; `None` when no device of
/// that name resolves.
#[must_use]
pub fn resolve_device(
    context: &LookupContext<'_>,
    name: &str,
    with_attributes: bool,
) -> Option<ResolvedDevice> {
    let device = find_device(context, name)?;
    let interface = context.interfaces.iter().find(|i| i.name == device.if_name)?;
    let facts = facts_of(&device, interface, context.interfaces);
    let parent_limit = match facts.sharing {
        ConfigSharing::Exclusive => None,
        ConfigSharing::Shared | ConfigSharing::Slot => parent_limit(context, &facts.if_name),
    };
    let parent_bandwidth = match facts.sharing {
        ConfigSharing::Exclusive => None,
        ConfigSharing::Shared | ConfigSharing::Slot => parent_bandwidth(context, &facts.if_name),
    };
    let vf = match facts.kind {
        DeviceKind::SriovVf => vf_of(&device.attributes),
        _ => None,
    };
    let attributes = if with_attributes { device.attributes } else { BTreeMap::new() };
    Some(ResolvedDevice { facts, parent_limit, parent_bandwidth, attributes, vf })
}

/// The device `name` stands for: published now (with the node's networks, then as a plain
/// shared device without them), else a PodNetwork device that left the slice.
fn find_device(context: &LookupContext<'_>, name: &str) -> Option<Device> {
    let published = |with_networks: bool| {
        [SharingMode::Capacity, SharingMode::Slots].into_iter().find_map(|mode| {
            context.inventory(mode, with_networks).devices.iter().find(|d| d.name == name).cloned()
        })
    };
    published(true)
        // A `--shared-parents` device whose parent a PodNetwork took over; never an
        // exclusive device that only exists without the networks (its NIC now carries a
        // network's children, or is kept for them).
        .or_else(|| published(false).filter(|d| d.sharing != Sharing::Exclusive))
        .or_else(|| departed_network_device(context, name))
}

/// A PodNetwork's shared (or slot) device that is not published now: `name` is
/// `<podnetwork>-<parent>[-s<N>]` for a parent that could carry one, the network one the
/// node knows (exact, hashed names too) or any DNS label before the parent's name.
fn departed_network_device(context: &LookupContext<'_>, name: &str) -> Option<Device> {
    let slots = context.selection.slot_count();
    let known: BTreeSet<&str> = context
        .networks
        .all()
        .iter()
        .map(|n| n.name.as_str())
        .chain(context.seen_networks.iter().map(String::as_str))
        .collect();
    let parents: Vec<(&HostInterface, String)> = context
        .interfaces
        .iter()
        .filter(|i| shared_parent_exclusion(i).is_none())
        .map(|i| (i, base_device_name(i)))
        .collect();
    let matches = |device: &str| -> Option<Option<u32>> {
        if device == name {
            return Some(None);
        }
        (0..slots)
            .find(|index| {
                super::naming::fit_label(
                    &format!("{device}-s{index}"),
                    super::naming::MAX_LABEL_LEN,
                ) == name
            })
            .map(Some)
    };
    // Networks the node knows of: exact names, hashed ones included.
    for network in &known {
        for (interface, parent) in &parents {
            if let Some(slot) = matches(&shared_device_name(network, parent)) {
                return Some(departed_device(interface, name, Some(network), slot));
            }
        }
    }
    // A network deleted before this process saw it: `<label>-<parent>[-s<N>]`, the longest
    // parent name first (`a-b-eth1` is network `a` on `b-eth1` when both parents exist).
    let (body, slot) = match name.rsplit_once("-s") {
        Some((body, index)) if index.parse::<u32>().is_ok_and(|i| i < slots) => {
            (body, index.parse::<u32>().ok())
        }
        _ => (name, None),
    };
    let mut by_length = parents.clone();
    by_length.sort_by_key(|(_, parent)| std::cmp::Reverse(parent.len()));
    [(body, slot), (name, None)].into_iter().find_map(|(body, slot)| {
        by_length.iter().find_map(|(interface, parent)| {
            let network = body.strip_suffix(parent.as_str())?.strip_suffix('-')?;
            super::naming::is_dns_label(network)
                .then(|| departed_device(interface, name, Some(network), slot))
        })
    })
}

fn departed_device(
    interface: &HostInterface,
    name: &str,
    network: Option<&str>,
    slot: Option<u32>,
) -> Device {
    let kind = device_kind(interface);
    let mut attributes = super::attributes(interface, kind);
    put_string(&mut attributes, attr::SHARING, "shared");
    if let Some(network) = network {
        put_string(&mut attributes, attr::POD_NETWORK, network);
    }
    Device {
        name: name.to_owned(),
        if_name: interface.name.clone(),
        kind,
        sharing: if slot.is_some() { Sharing::Slot } else { Sharing::Shared },
        shared_capacity: None,
        bandwidth: None,
        slot_index: slot,
        attributes,
    }
}

fn facts_of(
    device: &device::Device,
    interface: &HostInterface,
    interfaces: &[HostInterface],
) -> DeviceFacts {
    let pf_mtu = match interface.hardware.pci.as_ref().map(|p| &p.sriov) {
        Some(SriovRole::VirtualFunction { pf_name: Some(pf), .. }) => {
            interfaces.iter().find(|i| i.name == *pf).map(|i| i.mtu)
        }
        _ => None,
    };
    DeviceFacts {
        sharing: device.sharing,
        kind: device.kind,
        if_name: interface.name.clone(),
        mtu: interface.mtu,
        min_mtu: interface.min_mtu.unwrap_or(DEFAULT_MIN_MTU),
        max_mtu: interface.max_mtu.unwrap_or(DEFAULT_MAX_MTU),
        pf_mtu,
        passthru_children: 0,
        other_children: 0,
        ipvlan_children: 0,
        // A shared device's interface is its parent: a child gets the parent's RDMA function
        // (the "RDMA shared device" pattern).
        rdma: interface.rdma.clone(),
    }
}

#[cfg(test)]
mod tests;
