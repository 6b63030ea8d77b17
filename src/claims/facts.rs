//! [`DeviceFacts`] of an allocated device name, from the node's current interfaces and the
//! operator's selection (the scheduler copies no attributes into the claim, so the driver
//! re-derives its own inventory). Pure.

use crate::inventory::{Inventory, Selection, SharingMode};
use crate::model::device::{self, DeviceType, HostInterface, SriovRole};
use crate::model::network_config::{DeviceFacts, DeviceKind, Sharing};

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

fn facts_of(
    device: &device::Device,
    interface: &HostInterface,
    interfaces: &[HostInterface],
) -> DeviceFacts {
    let sharing = match device.sharing {
        device::Sharing::Exclusive => Sharing::Exclusive,
        device::Sharing::Shared { .. } => Sharing::Shared,
        device::Sharing::Slot { .. } => Sharing::Slot,
    };
    let kind = match device.device_type {
        DeviceType::Physical => DeviceKind::Physical,
        DeviceType::SriovPf => DeviceKind::SriovPf,
        DeviceType::SriovVf => DeviceKind::SriovVf,
        DeviceType::Virtual => DeviceKind::Virtual,
        DeviceType::Bond => DeviceKind::Bond,
        DeviceType::Vlan => DeviceKind::Vlan,
    };
    let pf_mtu = match interface.hardware.pci.as_ref().map(|p| &p.sriov) {
        Some(SriovRole::VirtualFunction { pf_name: Some(pf), .. }) => {
            interfaces.iter().find(|i| i.name == *pf).map(|i| i.mtu)
        }
        _ => None,
    };
    DeviceFacts {
        sharing,
        kind,
        if_name: interface.name.clone(),
        mtu: interface.mtu,
        min_mtu: interface.min_mtu.unwrap_or(DEFAULT_MIN_MTU),
        max_mtu: interface.max_mtu.unwrap_or(DEFAULT_MAX_MTU),
        pf_mtu,
        passthru_children: 0,
        other_children: 0,
    }
}
