//! Which networks a node serves (one row per rule), and where they land on its interfaces.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, LabelSelectorRequirement, ObjectMeta, Time,
};
use serde_json::json;

use super::*;
use crate::model::device::{HardwareFacts, PciFacts};
use crate::model::pod_network::PodNetworkStatus;

const DRIVER: &str = "netclaim.dev";

/// A Ready network of generation 1 created `age` seconds after the epoch, with `spec`.
fn network(name: &str, age: i64, spec: serde_json::Value) -> PodNetwork {
    let mut object = json!({"metadata": {"name": name}});
    object["spec"] = spec;
    let mut network: PodNetwork = serde_json::from_value(object).unwrap();
    network.metadata = ObjectMeta {
        name: Some(name.to_owned()),
        generation: Some(1),
        creation_timestamp: Some(Time(Timestamp::from_second(age).unwrap())),
        ..ObjectMeta::default()
    };
    network.status = Some(status(1, "True", "Ready"));
    network
}

fn status(generation: i64, ready: &str, reason: &str) -> PodNetworkStatus {
    PodNetworkStatus {
        observed_generation: Some(generation),
        conditions: vec![Condition {
            type_: "Ready".to_owned(),
            status: ready.to_owned(),
            reason: reason.to_owned(),
            message: String::new(),
            observed_generation: Some(generation),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }],
        device_class_name: None,
        nodes: Vec::new(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn inputs(networks: Vec<PodNetwork>, node_labels: &[(&str, &str)]) -> NetworkInputs {
    NetworkInputs {
        pod_networks: Some(Arc::new(
            networks.into_iter().map(|n| (n.metadata.name.clone().unwrap(), n)).collect(),
        )),
        node_labels: Some(Arc::new(labels(node_labels))),
    }
}

fn expression(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
    }
}

fn selector(
    match_labels: &[(&str, &str)],
    expressions: Vec<LabelSelectorRequirement>,
) -> LabelSelector {
    LabelSelector {
        match_labels: (!match_labels.is_empty()).then(|| labels(match_labels)),
        match_expressions: (!expressions.is_empty()).then_some(expressions),
    }
}

#[test]
fn selector_operators_match_as_kubernetes_does() {
    let node = labels(&[("zone", "a"), ("rack", "r1")]);
    let cases: Vec<(LabelSelector, bool)> = vec![
        (selector(&[], vec![]), true),
        (selector(&[("zone", "a")], vec![]), true),
        (selector(&[("zone", "b")], vec![]), false),
        (selector(&[("zone", "a"), ("rack", "r2")], vec![]), false),
        (selector(&[], vec![expression("zone", "In", &["a", "b"])]), true),
        (selector(&[], vec![expression("zone", "In", &["b"])]), false),
        (selector(&[], vec![expression("missing", "In", &["a"])]), false),
        (selector(&[], vec![expression("zone", "NotIn", &["b"])]), true),
        (selector(&[], vec![expression("zone", "NotIn", &["a"])]), false),
        (selector(&[], vec![expression("missing", "NotIn", &["a"])]), true),
        (selector(&[], vec![expression("rack", "Exists", &[])]), true),
        (selector(&[], vec![expression("missing", "Exists", &[])]), false),
        (selector(&[], vec![expression("missing", "DoesNotExist", &[])]), true),
        (selector(&[], vec![expression("rack", "DoesNotExist", &[])]), false),
        (selector(&[("zone", "a")], vec![expression("rack", "In", &["r1"])]), true),
        (selector(&[("zone", "a")], vec![expression("rack", "NotIn", &["r1"])]), false),
    ];
    for (selector, want) in cases {
        assert_eq!(selector_matches(Some(&selector), &node), Ok(want), "{selector:?}");
    }
    assert_eq!(selector_matches(None, &node), Ok(true), "no selector selects every node");
}

#[test]
fn invalid_selectors_select_nothing_and_name_the_field() {
    let node = labels(&[("zone", "a")]);
    let err = selector_matches(Some(&selector(&[], vec![expression("zone", "In", &[])])), &node)
        .unwrap_err();
    assert!(err.to_string().contains("matchExpressions[0].values"), "{err}");
    let err = selector_matches(
        Some(&selector(
            &[],
            vec![expression("zone", "Exists", &[]), expression("z", "Gt", &["1"])],
        )),
        &node,
    )
    .unwrap_err();
    assert!(err.to_string().contains("matchExpressions[1].operator"), "{err}");
    let err =
        selector_matches(Some(&selector(&[], vec![expression("zone", "Exists", &["a"])])), &node)
            .unwrap_err();
    assert!(err.to_string().contains("takes no values"), "{err}");
}

/// What a network is, and whether (and why not) the node serves it; `None`: not ours.
type Row = (&'static str, PodNetwork, Option<Result<(), NotServed>>);

/// One row per rule of "served on this node".
#[test]
fn served_or_not_and_why() {
    let base = || network("net", 1, json!({"parents": ["eth1"]}));
    let node = &[("zone", "a")];
    let mut other_provider = base();
    other_provider.spec.provider = "other.dev".to_owned();
    let mut deleting = base();
    deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
    let mut disabled = base();
    disabled.spec.enabled = false;
    disabled.status = Some(status(1, "False", "Disabled"));
    let mut invalid = base();
    invalid.status = Some(status(1, "False", "Invalid"));
    let mut overlaps = base();
    overlaps.status = Some(status(1, "False", "Overlaps"));
    let mut no_status = base();
    no_status.status = None;
    let mut stale = base();
    stale.metadata.generation = Some(2);
    let mut selected = base();
    selected.spec.node_selector = Some(selector(&[("zone", "a")], vec![]));
    let mut not_selected = base();
    not_selected.spec.node_selector =
        Some(selector(&[], vec![expression("zone", "NotIn", &["a"])]));
    let mut disabled_elsewhere = not_selected.clone();
    disabled_elsewhere.spec.enabled = false;

    let rows: Vec<Row> = vec![
        ("ready, no selector", base(), Some(Ok(()))),
        ("another provider", other_provider, None),
        ("being deleted", deleting, Some(Err(NotServed::Deleting))),
        ("disabled", disabled, Some(Err(NotServed::Disabled))),
        (
            "invalid",
            invalid,
            Some(Err(NotServed::NotReady { reason: "Invalid".into(), message: String::new() })),
        ),
        (
            "overlaps",
            overlaps,
            Some(Err(NotServed::NotReady { reason: "Overlaps".into(), message: String::new() })),
        ),
        (
            "stale generation",
            stale,
            Some(Err(NotServed::StaleStatus { observed: Some(1), generation: Some(2) })),
        ),
        (
            "no status yet",
            no_status,
            Some(Err(NotServed::StaleStatus { observed: None, generation: Some(1) })),
        ),
        ("selector matches", selected, Some(Ok(()))),
        ("selector does not match", not_selected, Some(Err(NotServed::NodeNotSelected))),
        ("the selector is judged first", disabled_elsewhere, Some(Err(NotServed::NodeNotSelected))),
    ];
    for (what, network, want) in rows {
        let judged = NodeNetworks::evaluate(DRIVER, &inputs(vec![network], node));
        let got = judged.get("net").map(|n| n.state.clone());
        assert_eq!(got, want, "{what}");
    }
}

#[test]
fn unknown_inputs_mean_no_networks_and_no_labels() {
    let unknown = NetworkInputs::default();
    assert!(!unknown.is_known());
    assert_eq!(unknown.unknown(), vec!["the PodNetworks", "the Node's labels"]);
    assert!(NodeNetworks::evaluate(DRIVER, &unknown).all().is_empty());
    let mut only_networks = inputs(vec![network("net", 1, json!({"parents": ["eth1"]}))], &[]);
    only_networks.node_labels = None;
    assert!(!only_networks.is_known());
    let judged = NodeNetworks::evaluate(DRIVER, &only_networks);
    assert!(judged.get("net").unwrap().is_served(), "no selector needs no labels");
}

fn nic(index: u32, name: &str, pci: &str) -> HostInterface {
    let mut interface = HostInterface::new(index, name, 1500);
    interface.hardware = HardwareFacts {
        has_device: true,
        pci: Some(PciFacts {
            address: pci.parse().unwrap(),
            vendor: None,
            device: None,
            numa_node: None,
            pcie_root: None,
            sriov: SriovRole::None,
        }),
        driver: Some("ice".to_owned()),
        speed_mbps: None,
    };
    interface
}

fn vf(index: u32, name: &str, pci: &str, pf: &str, pf_name: &str, vf_index: u32) -> HostInterface {
    let mut interface = nic(index, name, pci);
    if let Some(facts) = interface.hardware.pci.as_mut() {
        facts.sriov = SriovRole::VirtualFunction {
            pf_address: pf.parse().unwrap(),
            pf_name: Some(pf_name.to_owned()),
            vf_index: Some(vf_index),
        };
    }
    interface
}

fn plan(networks: Vec<PodNetwork>, interfaces: &[HostInterface]) -> NetworkPlan {
    NetworkPlan::resolve(&NodeNetworks::evaluate(DRIVER, &inputs(networks, &[])), interfaces)
}

#[test]
fn parents_are_found_by_name_or_pci_address() {
    let interfaces = [nic(2, "eth1", "0000:3b:00.0"), nic(3, "eth2", "0000:3b:00.1")];
    let plan = plan(
        vec![network("a", 1, json!({"parents": ["eth1", "0000:3B:00.1", "eth9"]}))],
        &interfaces,
    );
    assert_eq!(plan.shared.keys().collect::<Vec<_>>(), ["eth1", "eth2"]);
    assert_eq!(
        plan.missing,
        vec![MissingParent { network: "a".into(), parent: "eth9".into() }],
        "a parent this node lacks is reported, not invented"
    );
}

#[test]
fn networks_on_one_parent_need_distinct_vlans_and_the_older_keeps_it() {
    let interfaces = [nic(2, "eth1", "0000:3b:00.0")];
    let plan = plan(
        vec![
            network("newer", 20, json!({"parents": ["eth1"], "vlan": 100})),
            network("older", 10, json!({"parents": ["eth1"], "vlan": 100})),
            network("other-vlan", 30, json!({"parents": ["eth1"], "vlan": 200})),
            network("untagged", 40, json!({"parents": ["eth1"], "mode": "ipvlan"})),
        ],
        &interfaces,
    );
    let on_parent: Vec<(&str, Option<u16>)> =
        plan.shared["eth1"].iter().map(|s| (s.network.as_str(), s.vlan)).collect();
    assert_eq!(on_parent, [("older", Some(100)), ("other-vlan", Some(200)), ("untagged", None)]);
    assert_eq!(
        plan.conflicts,
        vec![NetworkConflict {
            if_name: "eth1".into(),
            kept: "older".into(),
            dropped: "newer".into(),
            kind: ConflictKind::SameVlan(100),
        }]
    );
    let text = plan.conflicts[0].to_string();
    assert!(
        text.contains("older") && text.contains("newer") && text.contains("VLAN 100"),
        "{text}"
    );
}

#[test]
fn creation_time_ties_are_broken_by_name() {
    let interfaces = [nic(2, "eth1", "0000:3b:00.0")];
    let plan = plan(
        vec![
            network("b", 10, json!({"parents": ["eth1"]})),
            network("a", 10, json!({"parents": ["eth1"]})),
        ],
        &interfaces,
    );
    assert_eq!(plan.conflicts[0].kept, "a");
    assert_eq!(plan.conflicts[0].kind, ConflictKind::SameVlan(0));
}

#[test]
fn an_exclusive_device_carries_one_network() {
    let interfaces = [nic(2, "eth1", "0000:3b:00.0"), nic(3, "eth2", "0000:3b:00.1")];
    let plan = plan(
        vec![
            network("dev", 10, json!({"parents": ["eth1"], "mode": "host-device"})),
            network("dev2", 20, json!({"parents": ["eth1", "eth2"], "mode": "host-device"})),
            network("shared", 30, json!({"parents": ["eth2"]})),
        ],
        &interfaces,
    );
    assert_eq!(
        plan.exclusive,
        BTreeMap::from([
            ("eth1".to_owned(), "dev".to_owned()),
            ("eth2".to_owned(), "dev2".to_owned())
        ])
    );
    assert!(plan.shared.is_empty(), "{:?}", plan.shared);
    let lost: Vec<(&str, &str, &str)> = plan
        .conflicts
        .iter()
        .map(|c| (c.if_name.as_str(), c.kept.as_str(), c.dropped.as_str()))
        .collect();
    assert_eq!(lost, [("eth1", "dev", "dev2"), ("eth2", "dev2", "shared")]);
    assert!(plan.conflicts.iter().all(|c| c.kind == ConflictKind::OneDevice));
}

#[test]
fn sriov_vf_mode_on_a_pf_takes_its_vfs() {
    let interfaces = [
        nic(2, "ens1f0", "0000:3b:00.0"),
        vf(3, "ens1f0v0", "0000:3b:02.0", "0000:3b:00.0", "ens1f0", 0),
        vf(4, "ens1f0v1", "0000:3b:02.1", "0000:3b:00.0", "ens1f0", 1),
        vf(5, "ens1f1v0", "0000:3b:0a.0", "0000:3b:00.1", "ens1f1", 0),
    ];
    let plan = plan(
        vec![network("fast", 1, json!({"parents": ["ens1f0"], "mode": "sriov-vf"}))],
        &interfaces,
    );
    assert_eq!(plan.exclusive.keys().collect::<Vec<_>>(), ["ens1f0v0", "ens1f0v1"]);
    // A VF named directly is taken itself.
    let plan = plan_for_vf(&interfaces);
    assert_eq!(plan.exclusive.keys().collect::<Vec<_>>(), ["ens1f1v0"]);
}

fn plan_for_vf(interfaces: &[HostInterface]) -> NetworkPlan {
    plan(vec![network("one", 1, json!({"parents": ["ens1f1v0"], "mode": "sriov-vf"}))], interfaces)
}

#[test]
fn parents_of_networks_not_served_stay_reserved_only_where_selected() {
    let interfaces = [nic(2, "eth1", "0000:3b:00.0"), nic(3, "eth2", "0000:3b:00.1")];
    let mut disabled = network("off", 1, json!({"parents": ["eth1"]}));
    disabled.spec.enabled = false;
    let mut elsewhere = network("elsewhere", 1, json!({"parents": ["eth2"]}));
    elsewhere.spec.node_selector = Some(selector(&[("zone", "b")], vec![]));
    let mut exclusive_off =
        network("dev-off", 1, json!({"parents": ["eth2"], "mode": "host-device"}));
    exclusive_off.spec.enabled = false;
    let plan = plan(vec![disabled, elsewhere, exclusive_off], &interfaces);
    assert_eq!(plan.reserved, BTreeMap::from([("eth1".to_owned(), "off".to_owned())]));
    assert!(plan.shared.is_empty() && plan.exclusive.is_empty());
}

#[test]
fn a_moved_nic_keeps_its_tag_only_while_its_network_serves_it() {
    let device = |network: &str| Device {
        name: "pci-0000-3b-00-0".into(),
        if_name: "eth1".into(),
        kind: crate::model::device::DeviceKind::Physical,
        sharing: crate::model::device::Sharing::Exclusive,
        shared_capacity: None,
        bandwidth: None,
        slot_index: None,
        attributes: BTreeMap::from([
            (format!("{ATTRIBUTE_DOMAIN}/podNetwork"), AttributeValue::String(network.into())),
            (
                format!("{ATTRIBUTE_DOMAIN}/pciAddress"),
                AttributeValue::String("0000:3b:00.0".into()),
            ),
        ]),
    };
    let by_pci = network("dev", 1, json!({"parents": ["0000:3b:00.0"], "mode": "host-device"}));
    let mut off = by_pci.clone();
    off.spec.enabled = false;
    let served = NodeNetworks::evaluate(DRIVER, &inputs(vec![by_pci], &[]));
    assert!(served.keeps_tag(&device("dev")));
    assert!(!served.keeps_tag(&device("gone")));
    let disabled = NodeNetworks::evaluate(DRIVER, &inputs(vec![off], &[]));
    assert!(!disabled.keeps_tag(&device("dev")));
}
