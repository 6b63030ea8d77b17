//! Unit tests of the selection and exclusion rules and of slice building.

use super::slices::{PoolIdentity, build_slices, slice_name};
use super::*;
use crate::model::device::{Controller, HardwareFacts, MacAddress, OperState, PciFacts};

fn nic(index: u32, name: &str, pci: &str) -> HostInterface {
    let mut interface = HostInterface::new(index, name, 1500);
    interface.mac = Some(MacAddress(vec![0x02, 0, 0, 0, 0, index.to_le_bytes()[0]]));
    interface.oper_state = OperState::Up;
    interface.min_mtu = Some(68);
    interface.max_mtu = Some(9216);
    interface.hardware = HardwareFacts {
        has_device: true,
        pci: Some(PciFacts {
            address: pci.parse().unwrap(),
            vendor: Some(0x8086),
            device: Some(0x1572),
            numa_node: Some(1),
            pcie_root: Some("pci0000:3a".to_owned()),
            sriov: SriovRole::None,
        }),
        driver: Some("i40e".to_owned()),
        speed_mbps: Some(25_000),
    };
    interface
}

fn virtual_link(index: u32, name: &str, kind: LinkKind) -> HostInterface {
    let mut interface = HostInterface::new(index, name, 1500);
    interface.kind = Some(kind);
    interface
}

fn selection(include: &[&str], exclude: &[&str], shared: &[&str]) -> Selection {
    let strings = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    Selection::new(&strings(include), &strings(exclude), &strings(shared), SharingMode::Capacity)
        .unwrap()
}

fn reason_for<'a>(inventory: &'a Inventory, if_name: &str) -> Option<&'a Exclusion> {
    inventory.skipped.iter().find(|s| s.if_name == if_name).map(|s| &s.reason)
}

fn device_for<'a>(inventory: &'a Inventory, if_name: &str) -> Option<&'a Device> {
    inventory.devices.iter().find(|d| d.if_name == if_name)
}

fn key(name: &str) -> String {
    format!("netclaim.dev/{name}")
}

#[test]
fn a_pci_nic_becomes_an_exclusive_device_with_its_attributes() {
    let inventory =
        Inventory::build(&[nic(3, "ens1f1", "0000:3b:00.1")], &selection(&[], &[], &[]));
    let device = device_for(&inventory, "ens1f1").expect("published");
    assert_eq!(device.name, "pci-0000-3b-00-1");
    assert_eq!(device.sharing, Sharing::Exclusive);
    assert_eq!(device.string_attribute(&key("ifName")), Some("ens1f1"));
    assert_eq!(device.string_attribute(&key("type")), Some("physical"));
    assert_eq!(device.string_attribute(&key("mac")), Some("02:00:00:00:00:03"));
    assert_eq!(device.int_attribute(&key("mtu")), Some(1500));
    assert_eq!(device.string_attribute(&key("kernelDriver")), Some("i40e"));
    assert_eq!(device.string_attribute(&key("operState")), Some("up"));
    assert_eq!(device.int_attribute(&key("speedMbps")), Some(25_000));
    assert_eq!(device.string_attribute(&key("pciAddress")), Some("0000:3b:00.1"));
    assert_eq!(device.string_attribute(&key("pciVendor")), Some("8086"));
    assert_eq!(device.string_attribute(&key("pciDevice")), Some("1572"));
    assert_eq!(device.int_attribute(&key("numaNode")), Some(1));
    assert_eq!(device.string_attribute(&key("sharing")), Some("exclusive"));
    assert_eq!(device.string_attribute("resource.kubernetes.io/pcieRoot"), Some("pci0000:3a"));
    assert!(inventory.skipped.is_empty());
}

#[test]
fn unknown_facts_are_omitted_not_invented() {
    let mut interface = nic(3, "ens1f1", "0000:3b:00.1");
    interface.hardware.speed_mbps = None;
    interface.mac = None;
    if let Some(pci) = interface.hardware.pci.as_mut() {
        pci.numa_node = None;
        pci.vendor = None;
    }
    let inventory = Inventory::build(&[interface], &selection(&[], &[], &[]));
    let device = device_for(&inventory, "ens1f1").unwrap();
    for absent in ["speedMbps", "mac", "numaNode", "pciVendor", "sriovTotalVfs", "pfName"] {
        assert!(!device.attributes.contains_key(&key(absent)), "{absent} must be omitted");
    }
}

#[test]
fn sriov_pf_and_vf_carry_their_relation() {
    let mut pf = nic(4, "ens2f0", "0000:5e:00.0");
    if let Some(pci) = pf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::PhysicalFunction { total_vfs: 64, num_vfs: 2 };
    }
    let mut vf = nic(9, "ens2f0v1", "0000:5e:02.1");
    vf.hardware.driver = Some("iavf".to_owned());
    if let Some(pci) = vf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::VirtualFunction {
            pf_address: "0000:5e:00.0".parse().unwrap(),
            pf_name: Some("ens2f0".to_owned()),
            vf_index: Some(1),
        };
    }
    let inventory = Inventory::build(&[pf, vf], &selection(&[], &[], &[]));
    let pf = device_for(&inventory, "ens2f0").unwrap();
    assert_eq!(pf.string_attribute(&key("type")), Some("sriov-pf"));
    assert_eq!(pf.int_attribute(&key("sriovTotalVfs")), Some(64));
    assert_eq!(pf.int_attribute(&key("sriovVfs")), Some(2));
    let vf = device_for(&inventory, "ens2f0v1").unwrap();
    assert_eq!(vf.name, "pci-0000-5e-02-1");
    assert_eq!(vf.string_attribute(&key("type")), Some("sriov-vf"));
    assert_eq!(vf.string_attribute(&key("pfName")), Some("ens2f0"));
    assert_eq!(vf.int_attribute(&key("vfIndex")), Some(1));
}

#[test]
fn exclusion_rules_each_name_their_reason() {
    let mut lo = HostInterface::new(1, "lo", 65536);
    lo.kind = None;
    let mut default_route = nic(2, "eno1", "0000:01:00.0");
    default_route.has_default_route = true;
    let mut node_address = nic(3, "eno2", "0000:01:00.1");
    node_address.global_addresses = vec!["192.0.2.10/24".to_owned()];
    let mut bond_member = nic(4, "ens3f0", "0000:02:00.0");
    bond_member.controller =
        Some(Controller { name: "bond0".to_owned(), kind: Some(LinkKind::Bond) });
    let mut bridge_port = nic(5, "ens3f1", "0000:02:00.1");
    bridge_port.controller =
        Some(Controller { name: "br0".to_owned(), kind: Some(LinkKind::Bridge) });
    let mut dpdk = nic(6, "ens4", "0000:03:00.0");
    dpdk.hardware.driver = Some("vfio-pci".to_owned());
    let interfaces = vec![
        lo,
        default_route,
        node_address,
        bond_member,
        bridge_port,
        dpdk,
        virtual_link(7, "bond0", LinkKind::Bond),
        virtual_link(8, "br0", LinkKind::Bridge),
        virtual_link(9, "veth1234", LinkKind::Veth),
        virtual_link(10, "flannel.1", LinkKind::Other("vxlan".to_owned())),
    ];
    let inventory = Inventory::build(&interfaces, &selection(&[], &[], &[]));
    assert!(inventory.devices.is_empty(), "{:?}", inventory.devices);
    assert_eq!(reason_for(&inventory, "lo"), Some(&Exclusion::Loopback));
    assert_eq!(reason_for(&inventory, "eno1"), Some(&Exclusion::DefaultRoute));
    assert_eq!(
        reason_for(&inventory, "eno2"),
        Some(&Exclusion::GlobalAddress("192.0.2.10/24".to_owned()))
    );
    assert!(matches!(
        reason_for(&inventory, "ens3f0"),
        Some(Exclusion::Enslaved { controller, kind }) if controller == "bond0" && kind == "bond"
    ));
    assert!(matches!(
        reason_for(&inventory, "ens3f1"),
        Some(Exclusion::Enslaved { controller, kind }) if controller == "br0" && kind == "bridge"
    ));
    assert_eq!(
        reason_for(&inventory, "ens4"),
        Some(&Exclusion::UserspaceDriver("vfio-pci".to_owned()))
    );
    assert_eq!(reason_for(&inventory, "bond0"), Some(&Exclusion::OnlySharedParent(LinkKind::Bond)));
    assert_eq!(reason_for(&inventory, "br0"), Some(&Exclusion::OnlySharedParent(LinkKind::Bridge)));
    assert_eq!(reason_for(&inventory, "veth1234"), Some(&Exclusion::Virtual(LinkKind::Veth)));
    assert!(matches!(reason_for(&inventory, "flannel.1"), Some(Exclusion::Virtual(_))));
    assert_eq!(inventory.skipped.len(), interfaces.len());
}

#[test]
fn bonds_bridges_and_node_interfaces_can_be_shared_parents() {
    let mut uplink = nic(2, "eno1", "0000:01:00.0");
    uplink.has_default_route = true;
    uplink.global_addresses = vec!["192.0.2.10/24".to_owned()];
    let interfaces = vec![
        uplink,
        virtual_link(7, "bond0", LinkKind::Bond),
        virtual_link(8, "br0", LinkKind::Bridge),
        virtual_link(9, "veth1", LinkKind::Veth),
    ];
    let inventory =
        Inventory::build(&interfaces, &selection(&[], &[], &["eno1", "bond0", "br0", "veth1"]));
    assert!(inventory.skipped.is_empty(), "{:?}", inventory.skipped);
    for name in ["eno1", "bond0", "br0", "veth1"] {
        let device = device_for(&inventory, name).unwrap();
        assert_eq!(
            (device.sharing, device.shared_capacity),
            (Sharing::Shared, Some(256)),
            "{name}"
        );
        assert_eq!(device.string_attribute(&key("sharing")), Some("shared"));
    }
    assert_eq!(
        device_for(&inventory, "bond0").unwrap().string_attribute(&key("type")),
        Some("bond")
    );
}

#[test]
fn a_shared_parent_may_be_named_by_pci_address() {
    let inventory = Inventory::build(
        &[nic(3, "ens1f1", "0000:3b:00.1")],
        &selection(&[], &[], &["0000:3B:00.1"]),
    );
    let device = device_for(&inventory, "ens1f1").unwrap();
    assert_eq!(device.sharing, Sharing::Shared);
}

#[test]
fn enslaved_interfaces_cannot_be_shared_parents_and_missing_ones_are_reported() {
    let mut bond_member = nic(4, "ens3f0", "0000:02:00.0");
    bond_member.controller =
        Some(Controller { name: "bond0".to_owned(), kind: Some(LinkKind::Bond) });
    let inventory = Inventory::build(&[bond_member], &selection(&[], &[], &["ens3f0", "eth9"]));
    assert!(inventory.devices.is_empty());
    assert!(matches!(reason_for(&inventory, "ens3f0"), Some(Exclusion::Enslaved { .. })));
    assert_eq!(reason_for(&inventory, "eth9"), Some(&Exclusion::SharedParentNotFound));
}

#[test]
fn one_nic_is_never_published_both_shared_and_exclusive() {
    let inventory = Inventory::build(
        &[nic(3, "ens1f1", "0000:3b:00.1"), nic(4, "ens1f0", "0000:3b:00.0")],
        &selection(&[], &[], &["ens1f1"]),
    );
    let for_f1: Vec<_> = inventory.devices.iter().filter(|d| d.if_name == "ens1f1").collect();
    assert_eq!(for_f1.len(), 1);
    assert_eq!(for_f1[0].sharing, Sharing::Shared);
    assert_eq!(device_for(&inventory, "ens1f0").unwrap().sharing, Sharing::Exclusive);
}

#[test]
fn include_and_exclude_globs_select_interfaces() {
    let interfaces = vec![
        nic(2, "ens1f0", "0000:3b:00.0"),
        nic(3, "ens1f1", "0000:3b:00.1"),
        nic(4, "eno1", "0000:01:00.0"),
        virtual_link(5, "nctest0", LinkKind::Veth),
    ];
    let inventory = Inventory::build(&interfaces, &selection(&["ens1*", "nctest*"], &["*f1"], &[]));
    let published: Vec<_> = inventory.devices.iter().map(|d| d.if_name.as_str()).collect();
    assert_eq!(published, ["nctest0", "ens1f0"], "sorted by device name");
    assert_eq!(reason_for(&inventory, "eno1"), Some(&Exclusion::NotIncluded));
    assert_eq!(
        reason_for(&inventory, "ens1f1"),
        Some(&Exclusion::ExcludedByPattern("*f1".to_owned()))
    );
    let veth = device_for(&inventory, "nctest0").unwrap();
    assert_eq!(veth.string_attribute(&key("type")), Some("virtual"));
}

#[test]
fn an_invalid_glob_names_the_flag_and_pattern() {
    let err = Selection::new(&["eth[".to_owned()], &[], &[], SharingMode::Capacity).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("--include-interfaces") && message.contains("eth["), "{message}");
}

#[test]
fn slot_mode_publishes_numbered_exclusive_stand_ins() {
    let selection = selection(&[], &[], &["ens1f1"]).with_sharing_mode(SharingMode::Slots);
    let inventory = Inventory::build(&[nic(3, "ens1f1", "0000:3b:00.1")], &selection);
    assert_eq!(inventory.devices.len(), 32);
    let names: Vec<_> = inventory.devices.iter().map(|d| d.name.clone()).collect();
    assert!(names.contains(&"pci-0000-3b-00-1-s0".to_owned()));
    assert!(names.contains(&"pci-0000-3b-00-1-s31".to_owned()));
    for device in &inventory.devices {
        assert!(device.sharing == Sharing::Slot && device.if_name == "ens1f1");
        assert!(naming::is_dns_label(&device.name), "{}", device.name);
    }
    let api = slices::api_device(&inventory.devices[0], "netclaim.dev");
    assert_eq!(api.allow_multiple_allocations, None, "slots are plain exclusive devices");
    assert_eq!(api.capacity, None);
}

#[test]
fn colliding_names_get_distinct_stable_suffixes() {
    // Two netdevs on one PCI function (dual-port ConnectX-3 style), and an interface that is
    // literally called like a PCI device.
    let a = nic(3, "ib0", "0000:3b:00.0");
    let b = nic(4, "ib1", "0000:3b:00.0");
    let mut c = virtual_link(5, "pci-0000-3b-00-0", LinkKind::Veth);
    c.kind = Some(LinkKind::Veth);
    let interfaces = vec![a, b, c];
    let selection = selection(&["*"], &[], &[]);
    let first = Inventory::build(&interfaces, &selection);
    let mut names: Vec<_> = first.devices.iter().map(|d| d.name.clone()).collect();
    names.dedup();
    assert_eq!(names.len(), 3, "{names:?}");
    let mut reversed = interfaces.clone();
    reversed.reverse();
    assert_eq!(Inventory::build(&reversed, &selection), first, "independent of dump order");
}

#[test]
fn shared_devices_carry_consumable_capacity() {
    let inventory =
        Inventory::build(&[nic(3, "ens1f1", "0000:3b:00.1")], &selection(&[], &[], &["ens1f1"]));
    let api = slices::api_device(&inventory.devices[0], "netclaim.dev");
    assert_eq!(api.allow_multiple_allocations, Some(true));
    let capacity = &api.capacity.unwrap()["netclaim.dev/interfaces"];
    assert_eq!(capacity.value.0, "256");
    let policy = capacity.request_policy.as_ref().unwrap();
    assert_eq!(policy.default.as_ref().unwrap().0, "1");
    assert_eq!(policy.valid_values.as_ref().unwrap()[0].0, "1");
}

fn pool(generation: i64) -> PoolIdentity {
    PoolIdentity { driver: "netclaim.dev".to_owned(), node: "node-a".to_owned(), generation }
}

#[test]
fn slices_split_at_128_devices_with_a_consistent_count() {
    let interfaces: Vec<_> = (0..300u32)
        .map(|i| {
            let address = format!("0000:{:02x}:{:02x}.{}", i / 32 / 8, (i / 8) % 32, i % 8);
            nic(i + 10, &format!("ens{i}"), &address)
        })
        .collect();
    let inventory = Inventory::build(&interfaces, &selection(&[], &[], &[]));
    assert_eq!(inventory.devices.len(), 300);
    let slices = build_slices(&pool(7), &inventory.devices);
    assert_eq!(slices.len(), 3);
    let sizes: Vec<_> = slices.iter().map(|s| s.spec.devices.as_ref().unwrap().len()).collect();
    assert_eq!(sizes, [128, 128, 44]);
    let mut seen = std::collections::HashSet::new();
    for (index, slice) in slices.iter().enumerate() {
        assert_eq!(slice.metadata.name.as_deref(), Some(slice_name(&pool(7), index).as_str()));
        assert_eq!(slice.spec.pool.name, "node-a");
        assert_eq!(slice.spec.pool.generation, 7);
        assert_eq!(slice.spec.pool.resource_slice_count, 3);
        assert_eq!(slice.spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice.spec.driver, "netclaim.dev");
        for device in slice.spec.devices.as_ref().unwrap() {
            assert!(seen.insert(device.name.clone()), "duplicate {}", device.name);
        }
    }
}

#[test]
fn slice_names_are_deterministic_subdomains() {
    assert_eq!(slice_name(&pool(1), 0), "node-a-netclaim-dev-0");
    let long = PoolIdentity { node: vec!["n".repeat(60); 4].join("."), ..pool(1) };
    let name = slice_name(&long, 2);
    assert!(naming::is_dns_label(&name), "{name}");
    assert!(name.ends_with("-2"), "the index stays readable: {name}");
    assert_eq!(name, slice_name(&long, 2));
    assert_ne!(name, slice_name(&long, 3));
}

#[test]
fn an_empty_inventory_publishes_one_empty_slice() {
    let slices = build_slices(&pool(1), &[]);
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.pool.resource_slice_count, 1);
    assert_eq!(slices[0].spec.devices.as_deref(), Some(&[][..]));
}

#[test]
fn attributes_and_capacity_stay_within_the_api_limit() {
    let mut vf = nic(9, "ens2f0v1", "0000:5e:02.1");
    if let Some(pci) = vf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::VirtualFunction {
            pf_address: "0000:5e:00.0".parse().unwrap(),
            pf_name: Some("ens2f0".to_owned()),
            vf_index: Some(1),
        };
    }
    let inventory = Inventory::build(&[vf], &selection(&[], &[], &["ens2f0v1"]));
    let api = slices::api_device(&inventory.devices[0], "netclaim.dev");
    let total = api.attributes.unwrap().len() + api.capacity.unwrap().len();
    assert!(total <= 32, "{total} attributes + capacities");
}

#[test]
fn overlong_string_values_are_omitted() {
    let mut interface = nic(3, "ens1f1", "0000:3b:00.1");
    interface.hardware.driver = Some("d".repeat(65));
    let inventory = Inventory::build(&[interface], &selection(&[], &[], &[]));
    assert!(!inventory.devices[0].attributes.contains_key(&key("kernelDriver")));
}

/// The node's networks judged from `(name, spec)` pairs: Ready, generation 1, created in
/// list order (the first is the oldest).
fn node_networks(specs: &[(&str, serde_json::Value)]) -> NodeNetworks {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    let networks = specs
        .iter()
        .enumerate()
        .map(|(age, (name, spec))| {
            let mut network: crate::model::pod_network::PodNetwork =
                serde_json::from_value(serde_json::json!({"spec": spec})).unwrap();
            network.metadata.name = Some((*name).to_owned());
            network.metadata.generation = Some(1);
            network.metadata.creation_timestamp =
                Some(Time(Timestamp::from_second(i64::try_from(age).unwrap()).unwrap()));
            let enabled = network.spec.enabled;
            network.status = Some(crate::model::pod_network::PodNetworkStatus {
                observed_generation: Some(1),
                conditions: vec![Condition {
                    type_: "Ready".to_owned(),
                    status: if enabled { "True" } else { "False" }.to_owned(),
                    reason: if enabled { "Ready" } else { "Disabled" }.to_owned(),
                    message: String::new(),
                    observed_generation: Some(1),
                    last_transition_time: Time(Timestamp::UNIX_EPOCH),
                }],
                device_class_name: None,
                nodes: Vec::new(),
            });
            ((*name).to_owned(), network)
        })
        .collect();
    let inputs = networks::NetworkInputs {
        pod_networks: Some(std::sync::Arc::new(networks)),
        node_labels: Some(std::sync::Arc::default()),
    };
    NodeNetworks::evaluate("netclaim.dev", &inputs)
}

#[test]
fn a_shared_network_publishes_one_device_per_parent_with_its_tag_vlan_and_capacity() {
    use serde_json::json;
    let interfaces = [nic(2, "ens1f0", "0000:3b:00.0"), virtual_link(3, "bond0", LinkKind::Bond)];
    let networks = node_networks(&[(
        "medianet",
        json!({"parents": ["0000:3b:00.0", "bond0"], "vlan": 100, "interfaceCapacity": 64}),
    )]);
    let inventory = Inventory::build_with(&interfaces, &selection(&[], &[], &[]), &networks);
    let names: Vec<&str> = inventory.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["medianet-bond0", "medianet-pci-0000-3b-00-0"]);
    for device in &inventory.devices {
        assert_eq!(device.sharing, Sharing::Shared);
        assert_eq!(device.shared_capacity, Some(64));
        assert_eq!(device.string_attribute(&key("podNetwork")), Some("medianet"));
        assert_eq!(device.int_attribute(&key("vlan")), Some(100));
        assert_eq!(device.string_attribute(&key("sharing")), Some("shared"));
    }
    let nic_device = &inventory.devices[1];
    assert_eq!(nic_device.if_name, "ens1f0");
    assert_eq!(nic_device.string_attribute(&key("pciAddress")), Some("0000:3b:00.0"));
    let api = slices::api_device(nic_device, "netclaim.dev");
    assert_eq!(api.allow_multiple_allocations, Some(true));
    assert_eq!(api.capacity.unwrap()["netclaim.dev/interfaces"].value.0, "64");
    assert!(inventory.skipped.is_empty(), "{:?}", inventory.skipped);
}

#[test]
fn an_untagged_network_has_no_vlan_attribute() {
    let networks = node_networks(&[("flat", serde_json::json!({"parents": ["ens1f0"]}))]);
    let inventory = Inventory::build_with(
        &[nic(2, "ens1f0", "0000:3b:00.0")],
        &selection(&[], &[], &[]),
        &networks,
    );
    assert_eq!(inventory.devices[0].name, "flat-pci-0000-3b-00-0");
    assert!(!inventory.devices[0].attributes.contains_key(&key("vlan")));
}

#[test]
fn a_shared_parent_that_a_network_names_is_published_only_as_network_devices() {
    use serde_json::json;
    let interfaces = [nic(2, "ens1f0", "0000:3b:00.0")];
    let networks = node_networks(&[
        ("blue", json!({"parents": ["ens1f0"], "vlan": 10})),
        ("red", json!({"parents": ["ens1f0"], "vlan": 20, "mode": "ipvlan"})),
    ]);
    let shared = selection(&[], &[], &["ens1f0"]);
    let inventory = Inventory::build_with(&interfaces, &shared, &networks);
    let names: Vec<&str> = inventory.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["blue-pci-0000-3b-00-0", "red-pci-0000-3b-00-0"]);
    // Without networks it is the plain shared parent again.
    let plain = Inventory::build(&interfaces, &shared);
    assert_eq!(plain.devices.len(), 1);
    assert_eq!(plain.devices[0].name, "pci-0000-3b-00-0");
    assert_eq!(plain.devices[0].sharing, Sharing::Shared);
}

#[test]
fn a_vlan_conflict_publishes_only_the_older_network_there() {
    use serde_json::json;
    let networks = node_networks(&[
        ("older", json!({"parents": ["ens1f0"], "vlan": 10})),
        ("newer", json!({"parents": ["ens1f0", "ens1f1"], "vlan": 10})),
    ]);
    let interfaces = [nic(2, "ens1f0", "0000:3b:00.0"), nic(3, "ens1f1", "0000:3b:00.1")];
    let inventory = Inventory::build_with(&interfaces, &selection(&[], &[], &[]), &networks);
    let names: Vec<&str> = inventory.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["newer-pci-0000-3b-00-1", "older-pci-0000-3b-00-0"]);
    assert_eq!(inventory.conflicts.len(), 1);
    let conflict = &inventory.conflicts[0];
    assert_eq!(
        (conflict.if_name.as_str(), conflict.kept.as_str(), conflict.dropped.as_str()),
        ("ens1f0", "older", "newer")
    );
}

#[test]
fn slots_mode_publishes_slot_devices_of_each_network() {
    use serde_json::json;
    let networks = node_networks(&[
        ("small", json!({"parents": ["ens1f0"], "vlan": 10, "interfaceCapacity": 3})),
        ("big", json!({"parents": ["ens1f0"], "vlan": 20})),
    ]);
    let slots = selection(&[], &[], &[]).with_sharing_mode(SharingMode::Slots);
    let inventory = Inventory::build_with(&[nic(2, "ens1f0", "0000:3b:00.0")], &slots, &networks);
    let count = |network: &str| {
        inventory
            .devices
            .iter()
            .filter(|d| d.string_attribute(&key("podNetwork")) == Some(network))
            .count()
    };
    assert_eq!(count("small"), 3, "the network's capacity");
    assert_eq!(count("big"), names::DEFAULT_SLOT_COUNT as usize, "at most the slot count");
    let slot = inventory.devices.iter().find(|d| d.name == "small-pci-0000-3b-00-0-s2").unwrap();
    assert_eq!((slot.sharing, slot.slot_index), (Sharing::Slot, Some(2)));
    assert_eq!(slices::api_device(slot, "netclaim.dev").allow_multiple_allocations, None);
}

#[test]
fn an_exclusive_network_tags_its_devices_and_keeps_their_names() {
    use serde_json::json;
    let mut pf = nic(2, "ens1f0", "0000:3b:00.0");
    if let Some(pci) = pf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::PhysicalFunction { total_vfs: 8, num_vfs: 1 };
    }
    let mut vf = nic(3, "ens1f0v0", "0000:3b:02.0");
    if let Some(pci) = vf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::VirtualFunction {
            pf_address: "0000:3b:00.0".parse().unwrap(),
            pf_name: Some("ens1f0".to_owned()),
            vf_index: Some(0),
        };
    }
    let interfaces = [pf, vf, nic(4, "ens2", "0000:5e:00.0")];
    let networks = node_networks(&[
        ("fast", json!({"parents": ["ens1f0"], "mode": "sriov-vf"})),
        ("whole", json!({"parents": ["ens2"], "mode": "host-device"})),
    ]);
    let inventory = Inventory::build_with(&interfaces, &selection(&[], &[], &[]), &networks);
    let tag = |if_name: &str| {
        let device = device_for(&inventory, if_name).unwrap();
        assert_eq!(device.sharing, Sharing::Exclusive, "{if_name}");
        device.string_attribute(&key("podNetwork")).map(str::to_owned)
    };
    assert_eq!(tag("ens1f0"), None, "the PF itself is not the network's");
    assert_eq!(tag("ens1f0v0").as_deref(), Some("fast"));
    assert_eq!(tag("ens2").as_deref(), Some("whole"));
    assert_eq!(device_for(&inventory, "ens2").unwrap().name, "pci-0000-5e-00-0");
}

#[test]
fn a_disabled_shared_network_leaves_the_slice_and_keeps_its_parent_off_exclusive_use() {
    use serde_json::json;
    let interfaces = [nic(2, "ens1f0", "0000:3b:00.0")];
    let disabled = node_networks(&[("off", json!({"parents": ["ens1f0"], "enabled": false}))]);
    let inventory = Inventory::build_with(&interfaces, &selection(&[], &[], &[]), &disabled);
    assert!(inventory.devices.is_empty(), "{:?}", inventory.devices);
    assert_eq!(
        reason_for(&inventory, "ens1f0"),
        Some(&Exclusion::PodNetworkNotServed("off".to_owned()))
    );
    // Listed in --shared-parents: the plain shared device comes back.
    let inventory =
        Inventory::build_with(&interfaces, &selection(&[], &[], &["ens1f0"]), &disabled);
    assert_eq!(inventory.devices[0].name, "pci-0000-3b-00-0");
    assert_eq!(inventory.devices[0].sharing, Sharing::Shared);
    // A disabled exclusive network just drops its tag.
    let off = node_networks(&[(
        "dev",
        json!({"parents": ["ens1f0"], "mode": "host-device", "enabled": false}),
    )]);
    let inventory = Inventory::build_with(&interfaces, &selection(&[], &[], &[]), &off);
    assert_eq!(inventory.devices[0].sharing, Sharing::Exclusive);
    assert!(!inventory.devices[0].attributes.contains_key(&key("podNetwork")));
}

#[test]
fn missing_and_unusable_parents_are_reported() {
    use serde_json::json;
    let mut port = nic(2, "ens1f0", "0000:3b:00.0");
    port.controller = Some(Controller { name: "bond0".to_owned(), kind: Some(LinkKind::Bond) });
    let networks = node_networks(&[("net", json!({"parents": ["ens1f0", "eth9"]}))]);
    let inventory = Inventory::build_with(&[port], &selection(&[], &[], &[]), &networks);
    assert!(inventory.devices.is_empty());
    assert!(matches!(reason_for(&inventory, "ens1f0"), Some(Exclusion::Enslaved { .. })));
    let missing = reason_for(&inventory, "eth9").unwrap();
    assert_eq!(missing, &Exclusion::PodNetworkParentNotFound("net".to_owned()));
    assert_eq!(missing.to_string(), "parent of PodNetwork net but not found");
}

/// A fixed set of interfaces that counts its discoveries.
#[derive(Debug, Clone)]
struct CountedInterfaces {
    interfaces: Vec<HostInterface>,
    discoveries: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl publish::InterfaceSource for CountedInterfaces {
    type Error = std::convert::Infallible;

    async fn discover(&self) -> Result<Vec<HostInterface>, Self::Error> {
        self.discoveries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(self.interfaces.clone())
    }
}

/// The port's default `resolve` (one method call per fact) over the same lookup.
struct OneByOne<L>(L);

impl<L: crate::claims::DeviceSource> crate::claims::DeviceSource for OneByOne<L> {
    async fn facts(
        &self,
        name: &str,
    ) -> Result<crate::model::network_config::DeviceFacts, crate::claims::LookupError> {
        self.0.facts(name).await
    }

    async fn attributes(
        &self,
        name: &str,
    ) -> Result<std::collections::BTreeMap<String, AttributeValue>, crate::claims::LookupError>
    {
        self.0.attributes(name).await
    }

    async fn parent_limit(&self, if_name: &str) -> Result<Option<u32>, crate::claims::LookupError> {
        self.0.parent_limit(if_name).await
    }

    async fn parent_bandwidth(
        &self,
        if_name: &str,
    ) -> Result<Option<crate::model::bandwidth::BitsPerSecond>, crate::claims::LookupError> {
        self.0.parent_bandwidth(if_name).await
    }
}

#[tokio::test]
async fn a_claims_devices_resolve_from_one_discovery_as_the_lookups_one_by_one_would() {
    use crate::claims::DeviceSource as _;
    let mut pf = nic(4, "ens2f0", "0000:5e:00.0");
    if let Some(pci) = pf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::PhysicalFunction { total_vfs: 64, num_vfs: 1 };
    }
    let mut vf = nic(9, "ens2f0v1", "0000:5e:02.1");
    if let Some(pci) = vf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::VirtualFunction {
            pf_address: "0000:5e:00.0".parse().unwrap(),
            pf_name: Some("ens2f0".to_owned()),
            vf_index: Some(1),
        };
    }
    let shared = nic(5, "ens3", "0000:5f:00.0");
    let source = CountedInterfaces {
        interfaces: vec![pf, vf, shared],
        discoveries: std::sync::Arc::default(),
    };
    let lookup = device_lookup::DiscoveredDevices::with_source(
        source.clone(),
        selection(&[], &[], &["ens3"]),
    );
    let published = Inventory::build(&source.interfaces, &selection(&[], &[], &["ens3"]));
    let mut names: Vec<String> = published.devices.iter().map(|d| d.name.clone()).collect();
    names.push("no-such-device".to_owned());
    assert!(names.len() >= 4, "the PF, the VF, the shared parent and a missing name: {names:?}");

    for with_attributes in [false, true] {
        let together = lookup.resolve(&names, with_attributes).await;
        let one_by_one = OneByOne(lookup.clone()).resolve(&names, with_attributes).await;
        let comparable = |all: &[Result<crate::claims::ResolvedDevice, _>]| {
            all.iter().map(|r| r.as_ref().map_err(ToString::to_string).cloned()).collect::<Vec<_>>()
        };
        assert_eq!(comparable(&together), comparable(&one_by_one), "attributes {with_attributes}");
        let vf = together.iter().flatten().find(|d| d.facts.if_name == "ens2f0v1").unwrap();
        assert_eq!(vf.vf.as_ref().map(|v| (v.pf.as_str(), v.index)), Some(("ens2f0", 1)));
        let parent = together.iter().flatten().find(|d| d.facts.if_name == "ens3").unwrap();
        assert!(parent.parent_limit.is_some(), "a shared parent has its limit: {parent:?}");
        assert!(matches!(together.last(), Some(Err(crate::claims::LookupError::NotFound(_)))));
    }
    assert_eq!(
        source.discoveries.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one discovery serves every lookup of the window"
    );
}

/// Every kind of device the inventory builds: a plain NIC, an SR-IOV PF and VF, a shared
/// parent, slot devices, the devices of a shared and of an exclusive PodNetwork.
fn every_kind_of_device() -> Vec<Device> {
    use serde_json::json;
    let mut pf = nic(4, "ens2f0", "0000:5e:00.0");
    if let Some(pci) = pf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::PhysicalFunction { total_vfs: 64, num_vfs: 1 };
    }
    let mut vf = nic(9, "ens2f0v1", "0000:5e:02.1");
    if let Some(pci) = vf.hardware.pci.as_mut() {
        pci.sriov = SriovRole::VirtualFunction {
            pf_address: "0000:5e:00.0".parse().unwrap(),
            pf_name: Some("ens2f0".to_owned()),
            vf_index: Some(1),
        };
    }
    let interfaces = [
        nic(2, "ens1f0", "0000:3b:00.0"),
        nic(3, "ens1f1", "0000:3b:00.1"),
        nic(5, "ens3", "0000:5f:00.0"),
        nic(6, "ens4", "0000:60:00.0"),
        pf,
        vf,
    ];
    let networks = node_networks(&[
        ("medianet", json!({"parents": ["ens1f0"], "vlan": 100})),
        ("direct", json!({"parents": ["ens4"], "mode": "host-device"})),
    ]);
    let mut devices =
        Inventory::build_with(&interfaces, &selection(&[], &[], &["ens3"]), &networks).devices;
    let slots = selection(&[], &[], &["ens3"]).with_sharing_mode(SharingMode::Slots);
    devices.extend(Inventory::build_with(&interfaces, &slots, &networks).devices);
    devices
}

/// `QualifiedName` of resource.k8s.io/v1: a C identifier of at most 32 characters, or a
/// DNS subdomain, one `/`, and such an identifier.
fn is_qualified_name(name: &str) -> bool {
    let identifier = |id: &str| {
        id.len() <= 32
            && id.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match name.split_once('/') {
        None => identifier(name),
        Some((domain, id)) => {
            naming::is_dns_subdomain(domain) && domain.len() <= 63 && identifier(id)
        }
    }
}

#[test]
fn every_published_name_is_a_qualified_name_with_at_most_one_slash() {
    let devices = every_kind_of_device();
    let kinds: std::collections::HashSet<Sharing> = devices.iter().map(|d| d.sharing).collect();
    assert_eq!(kinds.len(), 3, "exclusive, shared and slot devices: {kinds:?}");
    for driver in ["netclaim.dev", "net.example.com"] {
        let pool = PoolIdentity { driver: driver.to_owned(), ..pool(1) };
        let mut capacities = 0;
        for slice in build_slices(&pool, &devices) {
            for device in slice.spec.devices.unwrap() {
                let capacity = device.capacity.unwrap_or_default();
                capacities += capacity.len();
                for name in device.attributes.unwrap_or_default().keys().chain(capacity.keys()) {
                    assert!(name.matches('/').count() <= 1, "{driver}: {name}");
                    assert!(is_qualified_name(name), "{driver}: {name}");
                }
            }
        }
        assert!(capacities > 0, "the fixtures publish capacities");
    }
}

#[test]
fn attributes_of_the_drivers_own_domain_are_published_unqualified_capacities_stay_qualified() {
    let devices = every_kind_of_device();
    let shared = devices.iter().find(|d| d.sharing == Sharing::Shared).unwrap();
    let api = slices::api_device(shared, "netclaim.dev");
    let attributes = api.attributes.unwrap();
    assert_eq!(attributes["ifName"].string.as_deref(), Some(shared.if_name.as_str()));
    assert_eq!(attributes["sharing"].string.as_deref(), Some("shared"));
    assert_eq!(attributes["resource.kubernetes.io/pcieRoot"].string.as_deref(), Some("pci0000:3a"));
    assert!(attributes.keys().all(|k| !k.starts_with("netclaim.dev/")), "{attributes:?}");
    let capacity = api.capacity.unwrap();
    assert_eq!(
        capacity.keys().collect::<Vec<_>>(),
        ["netclaim.dev/bandwidth", "netclaim.dev/interfaces"]
    );
    // Under another driver name our domain is not the driver's: the names keep it, so CEL
    // `device.attributes["netclaim.dev"]` selects the same devices.
    let other = slices::api_device(shared, "net.example.com").attributes.unwrap();
    assert_eq!(other["netclaim.dev/ifName"].string.as_deref(), Some(shared.if_name.as_str()));
    assert!(!other.contains_key("ifName"));
}

#[test]
fn exclusive_devices_read_back_from_both_name_forms_alike() {
    let device = every_kind_of_device()
        .into_iter()
        .find(|d| d.sharing == Sharing::Exclusive && d.kind == DeviceKind::SriovVf)
        .unwrap();
    for driver in ["netclaim.dev", "net.example.com"] {
        let published = slices::api_device(&device, driver);
        assert_eq!(
            slices::exclusive_device_from_api(&published, driver).as_ref(),
            Some(&device),
            "{driver}"
        );
    }
    // A slice of an earlier release: qualified names in the driver's own domain.
    let earlier = slices::api_device(&device, "net.example.com");
    assert_eq!(slices::exclusive_device_from_api(&earlier, "netclaim.dev"), Some(device));
}
