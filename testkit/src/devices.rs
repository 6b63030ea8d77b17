//! Device facts of made-up NICs, for claim services that run without the host's inventory
//! (the claim tests' fixed devices, the IPAM tests' shared parent): one literal, so a new
//! `DeviceFacts` field is filled in one place.

use netclaim::model::network_config::{DeviceFacts, DeviceKind, Sharing};

/// A physical NIC `if_name` as discovery reports a plain one: MTU 1500 (68–9000), not a VF,
/// no children yet, offered with `sharing`.
pub(crate) fn physical_nic(if_name: &str, sharing: Sharing) -> DeviceFacts {
    DeviceFacts {
        sharing,
        kind: DeviceKind::Physical,
        if_name: if_name.to_owned(),
        mtu: 1500,
        min_mtu: 68,
        max_mtu: 9000,
        pf_mtu: None,
        passthru_children: 0,
        other_children: 0,
        ipvlan_children: 0,
    }
}
