//! Table tests of PodNetwork validation: one accepted and one rejected spec per rule, the
//! rejection naming its field.

use serde_json::{Value, json};

use super::*;

/// A valid dual-stack network every row starts from.
fn base() -> Value {
    json!({
        "parents": ["eth1"],
        "mode": "macvlan",
        "mtu": 1500,
        "ipam": {
            "subnets": ["10.10.0.0/16", "fd00:10::/64"],
            "gateways": ["10.10.0.1", "fd00:10::1"],
            "exclude": ["10.10.0.0/24"],
            "blockSize": {"ipv4": 26, "ipv6": 120}
        },
        "routes": [{"destination": "10.20.0.0/16", "gateway": "10.10.0.1"}]
    })
}

/// `base()` with `patch` merged in (RFC 7386: null removes a field).
fn spec(patch: &Value) -> PodNetworkSpec {
    let mut doc = base();
    merge(&mut doc, patch);
    serde_json::from_value(doc).expect("the row's spec decodes")
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(key);
                } else {
                    merge(target.entry(key.clone()).or_insert(Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch.clone(),
    }
}

/// (rule, accepted patch, rejected patch, field the rejection names, text in its message)
type Row = (&'static str, Value, Value, &'static str, &'static str);

#[allow(clippy::too_many_lines, reason = "one table row per rule")]
fn rows() -> Vec<Row> {
    vec![
        ("parents non-empty", json!({}), json!({"parents": []}), "spec.parents", "at least one"),
        (
            "parent is an interface name or PCI address",
            json!({"parents": ["eth1", "0000:3b:00.1"]}),
            json!({"parents": ["eth1", "bad/name"]}),
            "spec.parents[1]",
            "neither an interface name",
        ),
        (
            "parents unique",
            json!({"parents": ["eth1", "eth2"]}),
            json!({"parents": ["eth1", "eth1"]}),
            "spec.parents[1]",
            "listed twice",
        ),
        (
            "macvlan settings need macvlan",
            json!({"macvlan": {"mode": "bridge"}}),
            json!({"mode": "ipvlan", "macvlan": {"mode": "bridge"}}),
            "spec.macvlan",
            "need mode macvlan",
        ),
        (
            "ipvlan settings need ipvlan",
            json!({"mode": "ipvlan", "ipvlan": {"mode": "l2"}}),
            json!({"ipvlan": {"mode": "l2"}}),
            "spec.ipvlan",
            "need mode ipvlan",
        ),
        (
            "vlan id range",
            json!({"vlan": 4094}),
            json!({"vlan": 4095}),
            "spec.vlan",
            "outside 0..4094",
        ),
        (
            "vlan needs a mode that can tag",
            json!({"mode": "sriov-vf", "vlan": 100}),
            json!({"mode": "host-device", "vlan": 100}),
            "spec.vlan",
            "host-device",
        ),
        (
            "interface capacity range",
            json!({"interfaceCapacity": 4096}),
            json!({"interfaceCapacity": 0}),
            "spec.interfaceCapacity",
            "outside 1..4096",
        ),
        (
            "bandwidth is a quantity of bits per second",
            json!({"bandwidth": "10G"}),
            json!({"bandwidth": "10Gbps"}),
            "spec.bandwidth",
            "not a quantity",
        ),
        (
            "bandwidth is a whole number of bits per second",
            json!({"bandwidth": 1_000_000}),
            json!({"bandwidth": "500m"}),
            "spec.bandwidth",
            "lower-case m is milli",
        ),
        (
            "node selector values follow the operator",
            json!({"nodeSelector": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}),
            json!({"nodeSelector": {"matchExpressions": [{"key": "zone", "operator": "Exists", "values": ["a"]}]}}),
            "spec.nodeSelector.matchExpressions[0].values",
            "takes no values",
        ),
        (
            "ipam needs a subnet",
            json!({"ipam": null}),
            json!({"ipam": {"subnets": [], "gateways": null, "exclude": null}}),
            "spec.ipam.subnets",
            "at least one subnet",
        ),
        (
            "subnet is a CIDR",
            json!({"ipam": {"subnets": ["10.10.0.0/16", "fd00:10::/64"]}}),
            json!({"ipam": {"subnets": ["10.10.0.0", "fd00:10::/64"]}}),
            "spec.ipam.subnets[0]",
            "missing /<prefix length>",
        ),
        (
            "subnet in network form",
            json!({"ipam": {"subnets": ["10.10.0.0/16", "fd00:10::/64"]}}),
            json!({"ipam": {"subnets": ["10.10.0.0/16", "fd00:10::1/64"]}}),
            "spec.ipam.subnets[1]",
            "host bits set",
        ),
        (
            "subnet is unicast",
            json!({"ipam": {"subnets": ["10.10.0.0/16", "fd00:10::/64"]}}),
            json!({"ipam": {"subnets": ["10.10.0.0/16", "fd00:10::/64", "224.0.0.0/24"]}}),
            "spec.ipam.subnets[2]",
            "not a unicast range",
        ),
        (
            "subnets of one network do not overlap",
            json!({"ipam": {"subnets": ["10.10.0.0/16", "fd00:10::/64", "10.11.0.0/16"]}}),
            json!({"ipam": {"subnets": ["10.10.0.0/16", "fd00:10::/64", "10.10.128.0/17"]}}),
            "spec.ipam.subnets[2]",
            "overlaps spec.ipam.subnets[0]",
        ),
        (
            "IPv4 block size within family bounds",
            json!({"ipam": {"blockSize": {"ipv4": 32}}}),
            json!({"ipam": {"blockSize": {"ipv4": 33}}}),
            "spec.ipam.blockSize.ipv4",
            "outside /8../32",
        ),
        (
            "IPv6 block size within family bounds",
            json!({"ipam": {"blockSize": {"ipv6": 128}}}),
            json!({"ipam": {"blockSize": {"ipv6": 48}}}),
            "spec.ipam.blockSize.ipv6",
            "outside /64../128",
        ),
        (
            "block not shorter than its subnet",
            json!({"ipam": {"subnets": ["10.10.0.0/26", "fd00:10::/64"], "exclude": null, "gateways": null}}),
            json!({"ipam": {"subnets": ["10.10.0.0/27", "fd00:10::/64"], "exclude": null, "gateways": null}}),
            "spec.ipam.blockSize.ipv4",
            "spec.ipam.subnets[0] (10.10.0.0/27)",
        ),
        (
            "gateway is an address",
            json!({}),
            json!({"ipam": {"gateways": ["10.10.0.1", "gw"]}}),
            "spec.ipam.gateways[1]",
            "not an IP address",
        ),
        (
            "gateway inside a subnet",
            json!({"ipam": {"gateways": ["10.10.255.254"]}}),
            json!({"ipam": {"gateways": ["10.9.0.1"]}}),
            "spec.ipam.gateways[0]",
            "10.9.0.1 is not inside any subnet",
        ),
        (
            "gateway is not the network address",
            json!({"ipam": {"gateways": ["10.10.0.1"]}}),
            json!({"ipam": {"gateways": ["10.10.0.0"]}}),
            "spec.ipam.gateways[0]",
            "the network address of 10.10.0.0/16",
        ),
        (
            "gateway is not the broadcast address",
            json!({"ipam": {"gateways": ["10.10.255.254"]}}),
            json!({"ipam": {"gateways": ["10.10.255.255"]}}),
            "spec.ipam.gateways[0]",
            "the broadcast address",
        ),
        (
            "IPv6 gateway is not the subnet-router anycast address",
            json!({"ipam": {"gateways": ["fd00:10::1"]}}),
            json!({"ipam": {"gateways": ["fd00:10::"]}}),
            "spec.ipam.gateways[0]",
            "subnet-router anycast",
        ),
        (
            "one gateway per family",
            json!({"ipam": {"gateways": ["10.10.0.1", "fd00:10::1"]}}),
            json!({"ipam": {"gateways": ["10.10.0.1", "10.10.0.2"]}}),
            "spec.ipam.gateways[1]",
            "a second IPv4 gateway",
        ),
        (
            "exclude is a network",
            json!({"ipam": {"exclude": ["10.10.1.100/30"]}}),
            json!({"ipam": {"exclude": ["10.10.1.101/30"]}}),
            "spec.ipam.exclude[0]",
            "host bits set",
        ),
        (
            "exclude inside a subnet",
            json!({"ipam": {"exclude": ["fd00:10::/120"]}}),
            json!({"ipam": {"exclude": ["10.10.0.0/24", "10.99.0.0/24"]}}),
            "spec.ipam.exclude[1]",
            "10.99.0.0/24 is not inside any subnet",
        ),
        (
            "exclude not larger than its subnet",
            json!({"ipam": {"exclude": ["10.10.0.0/16"]}}),
            json!({"ipam": {"exclude": ["10.0.0.0/8"]}}),
            "spec.ipam.exclude[0]",
            "not inside any subnet",
        ),
        (
            "static range is a network",
            json!({"ipam": {"staticRanges": ["10.10.1.0/24"]}}),
            json!({"ipam": {"staticRanges": ["10.10.1.1/24"]}}),
            "spec.ipam.staticRanges[0]",
            "host bits set",
        ),
        (
            "static range inside one subnet",
            json!({"ipam": {"staticRanges": ["10.10.1.0/24", "fd00:10::100/120"]}}),
            json!({"ipam": {"staticRanges": ["10.10.1.0/24", "10.11.0.0/24"]}}),
            "spec.ipam.staticRanges[1]",
            "10.11.0.0/24 is not inside any subnet",
        ),
        (
            "static range covers whole blocks",
            json!({"ipam": {"staticRanges": ["10.10.1.192/26"]}}),
            json!({"ipam": {"staticRanges": ["10.10.1.0/28"]}}),
            "spec.ipam.staticRanges[0]",
            "may not be longer than spec.ipam.blockSize.ipv4 (/26)",
        ),
        (
            "static range covers whole IPv6 blocks",
            json!({"ipam": {"staticRanges": ["fd00:10::1:0/112"]}}),
            json!({"ipam": {"staticRanges": ["fd00:10::1:0/124"]}}),
            "spec.ipam.staticRanges[0]",
            "spec.ipam.blockSize.ipv6 (/120)",
        ),
        (
            "static ranges do not overlap",
            json!({"ipam": {"staticRanges": ["10.10.1.0/25", "10.10.1.128/25"]}}),
            json!({"ipam": {"staticRanges": ["10.10.1.0/24", "10.10.1.128/25"]}}),
            "spec.ipam.staticRanges[1]",
            "overlaps spec.ipam.staticRanges[0] (10.10.1.0/24)",
        ),
        (
            "namespaceSelector operators",
            json!({"namespaceSelector": {"matchLabels": {"team": "media"},
                "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}]}}),
            json!({"namespaceSelector": {"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["a"]}]}}),
            "spec.namespaceSelector.matchExpressions[0].values",
            "takes no values",
        ),
        (
            "mtu bounds",
            json!({"mtu": 9000}),
            json!({"mtu": 70_000}),
            "spec.mtu",
            "outside 68..65535",
        ),
        (
            "IPv6 needs an MTU of 1280",
            json!({"mtu": 576, "ipam": {"subnets": ["10.10.0.0/16"], "gateways": ["10.10.0.1"]}}),
            json!({"mtu": 576}),
            "spec.mtu",
            "below 1280",
        ),
        (
            "route destination is a network",
            json!({"routes": [{"destination": "10.20.0.0/16"}]}),
            json!({"routes": [{"destination": "10.20.0.1/16"}]}),
            "spec.routes[0].destination",
            "host bits set",
        ),
        (
            "route gateway is an address",
            json!({"routes": [{"destination": "10.20.0.0/16", "gateway": "10.10.0.1"}]}),
            json!({"routes": [{"destination": "10.20.0.0/16", "gateway": "router"}]}),
            "spec.routes[0].gateway",
            "not an IP address",
        ),
        (
            "route gateway of the destination's family",
            json!({"routes": [{"destination": "fd00:20::/64", "gateway": "fd00:10::1"}]}),
            json!({"routes": [{"destination": "fd00:20::/64", "gateway": "10.10.0.1"}]}),
            "spec.routes[0].gateway",
            "not of the IPv6 destination's family",
        ),
        (
            "route gateway on a subnet",
            json!({"routes": [{"destination": "fd00:20::/64", "gateway": "fe80::1"}]}),
            json!({"routes": [{"destination": "10.20.0.0/16", "gateway": "10.30.0.1"}]}),
            "spec.routes[0].gateway",
            "10.30.0.1 is not inside any subnet",
        ),
        (
            "default route needs a metric",
            json!({"routes": [{"destination": "0.0.0.0/0", "gateway": "10.10.0.1", "metric": 200}]}),
            json!({"routes": [{"destination": "0.0.0.0/0", "gateway": "10.10.0.1"}]}),
            "spec.routes[0].metric",
            "needs a non-zero metric",
        ),
        (
            "routes unique",
            json!({"routes": [{"destination": "10.20.0.0/16"}, {"destination": "10.20.0.0/16", "metric": 5}]}),
            json!({"routes": [{"destination": "10.20.0.0/16"}, {"destination": "10.20.0.0/16"}]}),
            "spec.routes[1].destination",
            "repeats spec.routes[0]",
        ),
    ]
}

#[test]
fn each_rule_accepts_one_spec_and_rejects_another_naming_the_field() {
    for (rule, accepted, rejected, path, text) in rows() {
        let ok = validate(&spec(&accepted));
        assert!(ok.is_ok(), "{rule}: accepted row refused: {ok:?}");
        let err = validate(&spec(&rejected)).expect_err(rule);
        assert_eq!(err.path, path, "{rule}: {err}");
        assert!(err.message.contains(text), "{rule}: {err:?} lacks {text:?}");
        assert!(err.to_string().starts_with(&format!("{path}: ")), "{rule}: {err}");
    }
}

#[test]
fn the_condition_message_reads_field_then_reason() {
    let err = validate(&spec(&json!({"ipam": {"gateways": ["10.9.0.1"]}}))).expect_err("outside");
    assert_eq!(err.to_string(), "spec.ipam.gateways[0]: 10.9.0.1 is not inside any subnet");
}

#[test]
fn a_valid_network_resolves_its_subnets_in_order() {
    let valid = validate(&spec(&json!({}))).expect("base is valid");
    let expected: Vec<IpNetwork> =
        vec!["10.10.0.0/16".parse().expect("v4"), "fd00:10::/64".parse().expect("v6")];
    assert_eq!(valid.subnets, expected);
}

#[test]
fn overlap_finds_a_shared_address_of_the_same_family_only() {
    let net = |text: &str| -> IpNetwork { text.parse().expect("a CIDR") };
    let mine = [net("10.10.0.0/16"), net("fd00:10::/64")];
    assert_eq!(
        overlap(&mine, &[net("10.10.200.0/24")]),
        Some((net("10.10.0.0/16"), net("10.10.200.0/24")))
    );
    assert_eq!(
        overlap(&mine, &[net("10.0.0.0/8")]),
        Some((net("10.10.0.0/16"), net("10.0.0.0/8")))
    );
    assert_eq!(overlap(&mine, &[net("10.11.0.0/16"), net("fd00:11::/64")]), None);
    // ::/96 contains 0.0.0.0's bit pattern, but the families differ.
    assert_eq!(overlap(&[net("0.0.0.0/1")], &[net("::/1")]), None);
}
