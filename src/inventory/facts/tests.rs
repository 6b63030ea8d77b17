//! Device names back to facts: published devices, slots, and PodNetwork devices that left
//! the slice.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

use super::*;
use crate::inventory::networks::NetworkInputs;
use crate::model::device::DeviceKind;
use crate::model::pod_network::{PodNetwork, PodNetworkStatus};

fn nic(index: u32, name: &str, mtu: u32) -> HostInterface {
    let mut interface = HostInterface::new(index, name, mtu);
    interface.hardware.has_device = true;
    interface.min_mtu = Some(68);
    interface.max_mtu = Some(9216);
    interface
}

fn names(interfaces: &[HostInterface], selection: &Selection, mode: SharingMode) -> Vec<String> {
    Inventory::build(interfaces, &selection.clone().with_sharing_mode(mode))
        .devices
        .into_iter()
        .map(|d| d.name)
        .collect()
}

fn no_networks() -> NodeNetworks {
    NodeNetworks::default()
}

fn context<'a>(
    interfaces: &'a [HostInterface],
    selection: &'a Selection,
    networks: &'a NodeNetworks,
    seen: &'a BTreeSet<String>,
) -> LookupContext<'a> {
    // A memo of its own per context: the tests change networks between lookups.
    let built = Box::leak(Box::default());
    LookupContext { interfaces, selection, networks, seen_networks: seen, built }
}

/// A Ready macvlan network on `parents` with `capacity`.
fn network(name: &str, parents: &[&str], enabled: bool, capacity: u32) -> PodNetwork {
    let mut network: PodNetwork = serde_json::from_value(json!({
        "metadata": {"name": name, "generation": 1,
                     "creationTimestamp": "2025-01-01T00:00:00Z"},
        "spec": {"parents": parents, "enabled": enabled, "interfaceCapacity": capacity},
    }))
    .unwrap();
    network.status = Some(PodNetworkStatus {
        observed_generation: Some(1),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: if enabled { "True" } else { "False" }.into(),
            reason: if enabled { "Ready" } else { "Disabled" }.into(),
            message: String::new(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }],
        device_class_name: None,
        nodes: Vec::new(),
    });
    network
}

fn judged(networks: Vec<PodNetwork>) -> NodeNetworks {
    let inputs = NetworkInputs {
        pod_networks: Some(Arc::new(
            networks.into_iter().map(|n| (n.metadata.name.clone().unwrap(), n)).collect(),
        )),
        node_labels: Some(Arc::new(BTreeMap::new())),
    };
    NodeNetworks::evaluate("netclaim.dev", &inputs)
}

#[test]
fn exclusive_shared_and_slot_devices_map_to_their_interface() {
    let interfaces = vec![nic(2, "eth1", 1500), nic(3, "eth2", 9000)];
    let selection = Selection::new(&[], &[], &["eth2".to_owned()], SharingMode::Capacity).unwrap();
    let capacity = names(&interfaces, &selection, SharingMode::Capacity);
    let slots = names(&interfaces, &selection, SharingMode::Slots);
    let exclusive = capacity.iter().find(|n| n.contains("eth1")).unwrap();
    let shared = capacity.iter().find(|n| n.contains("eth2")).unwrap();
    let slot = slots.iter().find(|n| n.contains("eth2") && !capacity.contains(n)).unwrap();
    let (networks, seen) = (no_networks(), BTreeSet::new());
    let context = context(&interfaces, &selection, &networks, &seen);

    let facts = device_facts(&context, exclusive).unwrap();
    assert_eq!(
        (facts.sharing, facts.kind, facts.if_name.as_str()),
        (Sharing::Exclusive, DeviceKind::Physical, "eth1")
    );
    assert_eq!((facts.mtu, facts.min_mtu, facts.max_mtu), (1500, 68, 9216));
    let facts = device_facts(&context, shared).unwrap();
    assert_eq!((facts.sharing, facts.if_name.as_str(), facts.mtu), (Sharing::Shared, "eth2", 9000));
    let facts = device_facts(&context, slot).unwrap();
    assert_eq!((facts.sharing, facts.if_name.as_str()), (Sharing::Slot, "eth2"), "slot {slot}");
    assert_eq!(device_facts(&context, "nope"), None);
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
    let (networks, seen) = (no_networks(), BTreeSet::new());
    let facts = device_facts(&context(&interfaces, &selection, &networks, &seen), &name).unwrap();
    assert_eq!((facts.kind, facts.pf_mtu), (DeviceKind::SriovVf, Some(9000)), "{name}");
}

#[test]
fn a_network_device_resolves_to_its_parent_while_published_and_after_it_left() {
    let interfaces = vec![nic(2, "eth1", 9000), nic(3, "eth2", 1500)];
    // eth1 is also a --shared-parents entry: published only as the network's device.
    let selection = Selection::new(&[], &[], &["eth1".to_owned()], SharingMode::Capacity).unwrap();
    let seen = BTreeSet::new();
    let served = judged(vec![network("medianet", &["eth1"], true, 100)]);
    let context_now = context(&interfaces, &selection, &served, &seen);
    let facts = device_facts(&context_now, "medianet-eth1").unwrap();
    assert_eq!((facts.sharing, facts.if_name.as_str(), facts.mtu), (Sharing::Shared, "eth1", 9000));
    let attributes = device_attributes(&context_now, "medianet-eth1").unwrap();
    assert_eq!(
        attributes.get("netclaim.dev/podNetwork"),
        Some(&AttributeValue::String("medianet".into()))
    );
    assert_eq!(parent_limit(&context_now, "eth1"), Some(100));
    assert_eq!(parent_limit(&context_now, "eth2"), None, "eth2 is exclusive");
    // The plain shared device of eth1 is gone from the slice but still resolves.
    let facts = device_facts(&context_now, "eth1").unwrap();
    assert_eq!((facts.sharing, facts.if_name.as_str()), (Sharing::Shared, "eth1"));

    // Disabled: the device leaves the slice, a claim allocated on it still resolves.
    let disabled = judged(vec![network("medianet", &["eth1"], false, 100)]);
    let context_disabled = context(&interfaces, &selection, &disabled, &seen);
    assert!(
        !Inventory::build_with(&interfaces, &selection, &disabled)
            .devices
            .iter()
            .any(|d| d.name == "medianet-eth1")
    );
    let facts = device_facts(&context_disabled, "medianet-eth1").unwrap();
    assert_eq!((facts.sharing, facts.if_name.as_str()), (Sharing::Shared, "eth1"));
    let attributes = device_attributes(&context_disabled, "medianet-eth1").unwrap();
    assert_eq!(
        attributes.get("netclaim.dev/podNetwork"),
        Some(&AttributeValue::String("medianet".into()))
    );
    assert_eq!(
        parent_limit(&context_disabled, "eth1"),
        Some(crate::model::names::DEFAULT_SHARED_CAPACITY),
        "eth1 is a plain shared parent again"
    );

    // Deleted, never seen by this process: parsed against the parents; slots too.
    let none = no_networks();
    let context_gone = context(&interfaces, &selection, &none, &seen);
    let facts = device_facts(&context_gone, "medianet-eth1").unwrap();
    assert_eq!(facts.if_name, "eth1");
    let facts = device_facts(&context_gone, "medianet-eth2-s3").unwrap();
    assert_eq!((facts.sharing, facts.if_name.as_str()), (Sharing::Slot, "eth2"));
    assert_eq!(device_facts(&context_gone, "medianet-eth9"), None, "no such parent");
    assert_eq!(device_facts(&context_gone, "-eth1"), None, "no network name");
}

#[test]
fn a_hashed_network_device_resolves_when_the_network_was_seen() {
    let interfaces = vec![nic(2, "eth1", 1500)];
    let selection = Selection::new(&[], &[], &[], SharingMode::Capacity).unwrap();
    let long = "n".repeat(60);
    let name = shared_device_name(&long, "eth1");
    assert!(name.len() <= 63 && !name.ends_with("-eth1"), "{name}");
    let (networks, unseen) = (no_networks(), BTreeSet::new());
    assert_eq!(device_facts(&context(&interfaces, &selection, &networks, &unseen), &name), None);
    let seen = BTreeSet::from([long]);
    let facts = device_facts(&context(&interfaces, &selection, &networks, &seen), &name).unwrap();
    assert_eq!(facts.if_name, "eth1");
}

#[test]
fn the_parent_limit_is_the_largest_capacity_of_the_networks_on_it() {
    let interfaces = vec![nic(2, "eth1", 1500)];
    let selection = Selection::new(&[], &[], &[], SharingMode::Slots).unwrap();
    let mut a = network("a", &["eth1"], true, 40);
    a.spec.vlan = 10;
    let mut b = network("b", &["eth1"], true, 300);
    b.spec.vlan = 20;
    let networks = judged(vec![a, b]);
    let seen = BTreeSet::new();
    // Whatever the publisher's mode, the limit is the configured capacity.
    assert_eq!(
        parent_limit(&context(&interfaces, &selection, &networks, &seen), "eth1"),
        Some(300)
    );
}
