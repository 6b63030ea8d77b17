//! [`DeviceFacts`] of an allocated device name, from the node's current interfaces and the
//! operator's selection (the scheduler copies no attributes into the claim, so the driver
//! re-derives its own inventory). Pure.

use std::collections::BTreeMap;

use crate::inventory::{Inventory, Selection, SharingMode};
use crate::model::device::{self, AttributeValue, HostInterface, SriovRole};
#[cfg(test)]
use crate::model::device::{DeviceKind, Sharing};
use crate::model::network_config::DeviceFacts;

/// Smallest MTU Linux accepts on an Ethernet device without `IFLA_MIN_MTU` (`ETH_MIN_MTU`).
const DEFAULT_MIN_MTU: u32 = 68;
/// Largest MTU when the driver reports none (`IP_MAX_MTU`).
const DEFAULT_MAX_MTU: u32 = 65535;

/// Facts of device `name` as this node would publish it now. Both sharing modes are tried:
/// slot names (`<parent>-s<N>`) and shared-parent names never collide, and a claim
/// allocated before the publisher fell back to slots still names its device. A slot maps to
/// its parent interface. Child counts are left at 0: the caller adds the children it
/// planned itself.
#[must_use]
pub fn device_facts(
    interfaces: &[HostInterface],
    selection: &Selection,
    name: &str,
) -> Option<DeviceFacts> {
    [SharingMode::Capacity, SharingMode::Slots].into_iter().find_map(|mode| {
        let inventory = Inventory::build(interfaces, &selection.clone().with_sharing_mode(mode));
        let device = inventory.devices.into_iter().find(|d| d.name == name)?;
        let interface = interfaces.iter().find(|i| i.name == device.if_name)?;
        Some(facts_of(&device, interface, interfaces))
    })
}

/// The attributes device `name` is published with now (both sharing modes tried, as
/// [`device_facts`] does).
#[must_use]
pub fn device_attributes(
    interfaces: &[HostInterface],
    selection: &Selection,
    name: &str,
) -> Option<BTreeMap<String, AttributeValue>> {
    [SharingMode::Capacity, SharingMode::Slots].into_iter().find_map(|mode| {
        let inventory = Inventory::build(interfaces, &selection.clone().with_sharing_mode(mode));
        inventory.devices.into_iter().find(|d| d.name == name).map(|d| d.attributes)
    })
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
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

    use super::*;

    fn nic(index: u32, name: &str, mtu: u32) -> HostInterface {
        let mut interface = HostInterface::new(index, name, mtu);
        interface.hardware.has_device = true;
        interface.min_mtu = Some(68);
        interface.max_mtu = Some(9216);
        interface
    }

    fn names(
        interfaces: &[HostInterface],
        selection: &Selection,
        mode: SharingMode,
    ) -> Vec<String> {
        Inventory::build(interfaces, &selection.clone().with_sharing_mode(mode))
            .devices
            .into_iter()
            .map(|d| d.name)
            .collect()
    }

    #[test]
    fn exclusive_shared_and_slot_devices_map_to_their_interface() {
        let interfaces = vec![nic(2, "eth1", 1500), nic(3, "eth2", 9000)];
        let selection =
            Selection::new(&[], &[], &["eth2".to_owned()], SharingMode::Capacity).unwrap();
        let capacity = names(&interfaces, &selection, SharingMode::Capacity);
        let slots = names(&interfaces, &selection, SharingMode::Slots);
        let exclusive = capacity.iter().find(|n| n.contains("eth1")).unwrap();
        let shared = capacity.iter().find(|n| n.contains("eth2")).unwrap();
        let slot = slots.iter().find(|n| n.contains("eth2") && !capacity.contains(n)).unwrap();

        let facts = device_facts(&interfaces, &selection, exclusive).unwrap();
        assert_eq!(
            (facts.sharing, facts.kind, facts.if_name.as_str()),
            (Sharing::Exclusive, DeviceKind::Physical, "eth1")
        );
        assert_eq!((facts.mtu, facts.min_mtu, facts.max_mtu), (1500, 68, 9216));
        let facts = device_facts(&interfaces, &selection, shared).unwrap();
        assert_eq!(
            (facts.sharing, facts.if_name.as_str(), facts.mtu),
            (Sharing::Shared, "eth2", 9000)
        );
        let facts = device_facts(&interfaces, &selection, slot).unwrap();
        assert_eq!((facts.sharing, facts.if_name.as_str()), (Sharing::Slot, "eth2"), "slot {slot}");
        assert_eq!(device_facts(&interfaces, &selection, "nope"), None);
    }

    #[test]
    fn a_vf_carries_its_pf_mtu() {
        let pf = nic(2, "ens1f0", 9000);
        let mut vf = nic(3, "ens1f0v0", 1500);
        vf.hardware.pci = Some(device::PciFacts {
            address: "0000:3b:02.0".parse().unwrap(),
            vendor: None,
            device: None,
            numa_node: None,
            pcie_root: None,
            sriov: SriovRole::VirtualFunction {
                pf_address: "0000:3b:00.0".parse().unwrap(),
                pf_name: Some("ens1f0".into()),
                vf_index: Some(0),
            },
        });
        let interfaces = vec![pf, vf];
        let selection = Selection::new(&[], &[], &[], SharingMode::Capacity).unwrap();
        let name = names(&interfaces, &selection, SharingMode::Capacity)
            .into_iter()
            .find(|n| n != "ens1f0" && !n.contains("ens1f0-"))
            .unwrap();
        let facts = device_facts(&interfaces, &selection, &name).unwrap();
        assert_eq!((facts.kind, facts.pf_mtu), (DeviceKind::SriovVf, Some(9000)), "{name}");
    }
}
