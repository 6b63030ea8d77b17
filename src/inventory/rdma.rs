//! The RDMA attributes of a device whose netdev has an RDMA function (DESIGN §2):
//! `rdmaDevice`, `rdmaLinkLayer`, `rdmaNodeGuid`, `rdmaPorts` and the node's `rdmaNetnsMode`,
//! each omitted when discovery could not tell. Pure.

use std::collections::BTreeMap;

use super::{put_int, put_string};
use crate::model::device::{AttributeValue, HostInterface};
use crate::model::names::attr;

/// Adds the RDMA attributes of `interface` (none when it has no RDMA function).
pub(super) fn put_attributes(
    attributes: &mut BTreeMap<String, AttributeValue>,
    interface: &HostInterface,
) {
    let Some(rdma) = &interface.rdma else { return };
    put_string(attributes, attr::RDMA_DEVICE, &rdma.device);
    if let Some(link_layer) = rdma.link_layer {
        put_string(attributes, attr::RDMA_LINK_LAYER, link_layer.as_str());
    }
    if let Some(guid) = &rdma.node_guid {
        put_string(attributes, attr::RDMA_NODE_GUID, guid);
    }
    // A device without ports is not one the kernel registers; 0 would mean "not read".
    put_int(attributes, attr::RDMA_PORTS, Some(rdma.ports).filter(|ports| *ports > 0));
    if let Some(mode) = rdma.netns_mode {
        put_string(attributes, attr::RDMA_NETNS_MODE, mode.as_str());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Inventory, Selection, SharingMode};
    use crate::model::device::Device;
    use crate::model::rdma::{RdmaFacts, RdmaLinkLayer, RdmaNetnsMode};

    fn key(name: &str) -> String {
        format!("netclaim.dev/{name}")
    }

    fn publish(interface: HostInterface, shared: bool) -> Vec<Device> {
        let parents = if shared { vec![interface.name.clone()] } else { Vec::new() };
        let selection = Selection::new(&[], &[], &parents, SharingMode::Capacity).unwrap();
        let mut interface = interface;
        interface.hardware.has_device = true;
        Inventory::build(&[interface], &selection).devices
    }

    fn roce_nic() -> HostInterface {
        let mut interface = HostInterface::new(4, "ens2f0np0", 1500);
        let mut rdma = RdmaFacts::new("mlx5_0", 1);
        rdma.link_layer = Some(RdmaLinkLayer::Ethernet);
        rdma.node_guid = Some("b859:9f03:00d4:1e2a".to_owned());
        rdma.netns_mode = Some(RdmaNetnsMode::Exclusive);
        interface.rdma = Some(rdma);
        interface
    }

    #[test]
    fn an_rdma_nic_publishes_its_rdma_attributes() {
        let devices = publish(roce_nic(), false);
        let device = &devices[0];
        assert_eq!(device.string_attribute(&key("rdmaDevice")), Some("mlx5_0"));
        assert_eq!(device.string_attribute(&key("rdmaLinkLayer")), Some("Ethernet"));
        assert_eq!(device.string_attribute(&key("rdmaNodeGuid")), Some("b859:9f03:00d4:1e2a"));
        assert_eq!(device.int_attribute(&key("rdmaPorts")), Some(1));
        assert_eq!(device.string_attribute(&key("rdmaNetnsMode")), Some("exclusive"));
    }

    #[test]
    fn a_shared_parent_carries_them_too() {
        // The "RDMA shared device" pattern: macvlan children of an RDMA-capable parent.
        let devices = publish(roce_nic(), true);
        assert_eq!(devices[0].string_attribute(&key("sharing")), Some("shared"));
        assert_eq!(devices[0].string_attribute(&key("rdmaDevice")), Some("mlx5_0"));
    }

    #[test]
    fn unknown_rdma_facts_are_omitted() {
        let mut interface = roce_nic();
        let mut rdma = RdmaFacts::new("rxe0", 0);
        rdma.link_layer = None;
        interface.rdma = Some(rdma);
        let devices = publish(interface, false);
        let names: Vec<&str> = devices[0]
            .attributes
            .keys()
            .filter_map(|k| k.strip_prefix("netclaim.dev/"))
            .filter(|k| k.starts_with("rdma"))
            .collect();
        assert_eq!(names, ["rdmaDevice"]);
    }

    #[test]
    fn a_nic_without_rdma_has_no_rdma_attribute() {
        let mut interface = roce_nic();
        interface.rdma = None;
        let devices = publish(interface, false);
        assert!(
            devices[0].attributes.keys().all(|k| !k.contains("/rdma")),
            "{:?}",
            devices[0].attributes
        );
    }

    #[test]
    fn every_rdma_attribute_name_has_at_most_one_slash() {
        // DESIGN §2 and decision 0023: published names have at most one `/`.
        for device in publish(roce_nic(), false) {
            for name in device.attributes.keys() {
                assert!(name.matches('/').count() <= 1, "{name}");
            }
        }
    }
}
