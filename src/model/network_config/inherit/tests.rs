//! Inheritance from a `PodNetwork`: a table of what each field resolves to with and without
//! the claim's own value, the addressing rules, and when a network serves claims.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde_json::{Value, json};

use super::super::{
    Addressing, ConfigEntry, ConfigSource, DeviceFacts, IpvlanFlag, IpvlanMode, MacvlanMode,
    NetworkConfig, NodeSupport, ResolvedMode, ResolvedNetworkConfig, merge_for_request,
};
use super::check_network_serves;
use crate::model::pod_network::PodNetwork;
use crate::testing::facts::{FactsBuilder as _, physical_nic};

fn parent() -> DeviceFacts {
    physical_nic("eth1").shared().mtu(9000)
}

fn network(spec: Value) -> PodNetwork {
    let mut object = json!({"metadata": {"name": "medianet", "generation": 3}});
    object["spec"] = spec;
    serde_json::from_value(object).unwrap()
}

/// A network with every inheritable field set.
fn full_network() -> PodNetwork {
    network(json!({
        "mode": "macvlan",
        "macvlan": {"mode": "private"},
        "parents": ["eth1"],
        "vlan": 100,
        "mtu": 1400,
        "ipam": {
            "subnets": ["10.10.0.0/16", "fd00:10::/64"],
            "gateways": ["10.10.0.1"],
            "exclude": ["10.10.0.0/24"],
            "staticRanges": ["10.10.1.0/24", "fd00:10::100/120"],
            "blockSize": {"ipv4": 26, "ipv6": 120}
        },
        "routes": [{"destination": "10.20.0.0/16", "gateway": "10.10.0.1"}]
    }))
}

/// Resolves class entry `{podNetwork: medianet}` plus the claim's `own` fields against
/// `network`.
fn resolve(network: &PodNetwork, own: Value) -> Result<ResolvedNetworkConfig, String> {
    let params = |body: Value| {
        let mut v = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
        v.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        v
    };
    let entries = [
        ConfigEntry {
            source: ConfigSource::Class,
            requests: vec![],
            parameters: params(json!({"podNetwork": "medianet"})),
        },
        ConfigEntry { source: ConfigSource::Claim, requests: vec![], parameters: params(own) },
    ];
    let merged: NetworkConfig = merge_for_request(&entries, "net").map_err(|e| e.to_string())?;
    merged
        .validate_in(Some(network), &parent(), &NodeSupport::everything())
        .map_err(|e| format!("{}: {e}", e.path()))
}

#[test]
fn each_field_is_inherited_and_the_claims_own_value_wins() {
    // (field, the claim's own fields, what the resolved config must show)
    type Check = fn(&ResolvedNetworkConfig) -> bool;
    let net = full_network();
    let rows: Vec<(&str, Value, Check)> = vec![
        ("mode + macvlan: inherited", json!({}), |r| {
            r.mode == ResolvedMode::Macvlan { mode: MacvlanMode::Private }
        }),
        ("macvlan.mode: the claim's", json!({"macvlan": {"mode": "vepa"}}), |r| {
            r.mode == ResolvedMode::Macvlan { mode: MacvlanMode::Vepa }
        }),
        (
            "mode: the claim's, the network's macvlan section dropped",
            json!({"mode": "ipvlan"}),
            |r| r.mode == ResolvedMode::Ipvlan { mode: IpvlanMode::L2, flag: IpvlanFlag::Bridge },
        ),
        ("vlan: inherited", json!({}), |r| r.vlan == Some(100)),
        ("vlan: the claim's", json!({"vlan": 200}), |r| r.vlan == Some(200)),
        ("mtu: inherited", json!({}), |r| r.interface.mtu == 1400),
        ("mtu: the claim's", json!({"interface": {"mtu": 1300}}), |r| r.interface.mtu == 1300),
        (
            "interface.name: the claim's, mtu still inherited",
            json!({"interface": {"name": "media0"}}),
            |r| r.interface.name.as_deref() == Some("media0") && r.interface.mtu == 1400,
        ),
        ("routes: inherited", json!({}), |r| {
            r.routes.len() == 1 && r.routes[0].destination.to_string() == "10.20.0.0/16"
        }),
        (
            "routes: the claim's list replaces the network's",
            json!({"routes": [{"destination": "10.30.0.0/16", "gateway": "10.10.0.1"}, {"destination": "10.40.0.0/16"}]}),
            |r| r.routes.len() == 2 && r.routes[0].destination.to_string() == "10.30.0.0/16",
        ),
        ("ipam: the network's blocks, both families", json!({}), |r| {
            matches!(&r.addressing, Addressing::Network(n) if n.pod_network == "medianet"
                && n.subnets.len() == 2 && n.addresses.is_empty() && n.block_v4 == 26
                && n.gateways.len() == 1 && n.exclude.len() == 1)
        }),
        (
            "ipam.addresses inside staticRanges: static in the network",
            json!({"ipam": {"addresses": ["10.10.1.5/16", "fd00:10::105/64"]}}),
            |r| {
                matches!(&r.addressing, Addressing::Network(n) if n.addresses.len() == 2
                    && n.static_ranges.len() == 2)
            },
        ),
        (
            "ipam.addresses: [] and routes: []: no address",
            json!({"ipam": {"addresses": []}, "routes": []}),
            |r| r.addressing == Addressing::None,
        ),
        ("stats: the claim's only", json!({"stats": false}), |r| !r.stats),
        ("podNetwork kept", json!({}), |r| r.pod_network.as_deref() == Some("medianet")),
    ];
    for (name, own, check) in rows {
        let resolved = resolve(&net, own).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(check(&resolved), "{name}: {resolved:#?}");
    }
}

#[test]
fn addressing_rules_name_the_field() {
    let net = full_network();
    let rows = [
        (
            json!({"ipam": {"pool": {"subnet": "10.10.0.0/24"}}}),
            "ipam.pool",
            "not allowed with podNetwork medianet",
        ),
        (
            json!({"ipam": {"addresses": ["10.10.7.5/16"]}}),
            "ipam.addresses[0]",
            "not inside podNetwork medianet's ipam.staticRanges (10.10.1.0/24, fd00:10::100/120)",
        ),
        (
            json!({"ipam": {"addresses": ["10.10.1.5/16", "fd00:10::5/64"]}}),
            "ipam.addresses[1]",
            "ipam.staticRanges",
        ),
        (json!({"ipam": {"addresses": ["10.10.0.0/24"]}}), "ipam.addresses[0]", "network address"),
    ];
    for (own, path, message) in rows {
        let err = resolve(&net, own.clone()).expect_err(&own.to_string());
        assert!(err.starts_with(&format!("{path}:")) && err.contains(message), "{own}: {err}");
    }
}

/// The findings of the ipam-trust review: a tenant's static address in a network may only
/// come from `staticRanges`, and never be the router's or a subnet's reserved addresses.
#[test]
fn statics_are_refused_on_gateways_reserved_addresses_and_outside_static_ranges() {
    let mut net = full_network();
    // The gateway inside a static range: still refused (before, any address in `exclude`
    // passed, and the example network's gateway was in its exclude).
    net.spec.ipam.as_mut().unwrap().static_ranges.push("10.10.0.0/26".into());
    let rows = [
        ("10.10.0.1/16", "10.10.0.1 is the gateway spec.ipam.gateways[0] of podNetwork medianet"),
        // The subnet's reserved addresses, whatever prefix the claim writes (with the
        // subnet's prefix they are already refused as the address's own network/broadcast).
        ("10.10.0.0/8", "10.10.0.0 is the network address of 10.10.0.0/16 of podNetwork medianet"),
        ("10.10.255.255/8", "10.10.255.255 is the broadcast address of 10.10.0.0/16"),
        ("fd00:10::/16", "fd00:10:: is the subnet-router anycast address of fd00:10::/64"),
        // Inside `exclude` but not in `staticRanges`: `exclude` no longer allows statics.
        ("10.10.0.77/16", "not inside podNetwork medianet's ipam.staticRanges"),
        ("10.10.9.9/16", "not inside podNetwork medianet's ipam.staticRanges"),
    ];
    for (address, why) in rows {
        let own = json!({"ipam": {"addresses": ["10.10.1.9/16", address]}});
        let err = resolve(&net, own).expect_err(address);
        assert!(err.starts_with("ipam.addresses[1]:") && err.contains(why), "{address}: {err}");
    }
    // The example network of deploy/examples: its gateway is refused as a static.
    let example: PodNetwork =
        yaml_serde::from_str(include_str!("../../../../deploy/examples/podnetwork.yaml")).unwrap();
    let err = resolve(&example, json!({"ipam": {"addresses": ["10.10.0.1/16"]}})).unwrap_err();
    assert!(err.starts_with("ipam.addresses[0]:") && err.contains("gateway"), "{err}");
    let ranges = &example.spec.ipam.as_ref().unwrap().static_ranges;
    assert!(!ranges.is_empty(), "the example network shows staticRanges");
    // A network without staticRanges takes no static address at all.
    let mut none = full_network();
    none.spec.ipam.as_mut().unwrap().static_ranges.clear();
    let err = resolve(&none, json!({"ipam": {"addresses": ["10.10.1.5/16"]}})).unwrap_err();
    assert!(err.contains("ipam.staticRanges (none)"), "{err}");
}

#[test]
fn a_network_without_ipam_leaves_the_claims_own_addressing() {
    let net = network(json!({"parents": ["eth1"], "vlan": 7}));
    let pool = resolve(&net, json!({"ipam": {"pool": {"subnet": "10.9.0.0/24"}}})).unwrap();
    assert!(matches!(pool.addressing, Addressing::Pool(_)));
    assert_eq!(pool.vlan, Some(7));
    let none = resolve(&net, json!({})).unwrap();
    assert_eq!(none.addressing, Addressing::None);
    assert_eq!(none.vlan, Some(7));
    // VLAN 0 is no VLAN.
    let untagged = network(json!({"parents": ["eth1"], "vlan": 0}));
    assert_eq!(resolve(&untagged, json!({})).unwrap().vlan, None);
}

#[test]
fn an_invalid_network_spec_is_refused_naming_the_networks_field() {
    let net = network(json!({"parents": ["eth1"], "ipam": {"subnets": ["10.10.0.5/16"]}}));
    let err = resolve(&net, json!({})).unwrap_err();
    assert!(err.starts_with("podNetwork:") && err.contains("spec.ipam.subnets[0]"), "{err}");
    let net = network(
        json!({"parents": ["eth1"], "ipam": {"subnets": ["10.10.0.0/16"], "exclude": ["x"]}}),
    );
    let err = resolve(&net, json!({})).unwrap_err();
    assert!(err.contains("spec.ipam.exclude[0]"), "{err}");
    let net = network(json!({"parents": ["eth1"],
        "ipam": {"subnets": ["10.10.0.0/16"], "staticRanges": ["10.11.0.0/24"]}}));
    let err = resolve(&net, json!({})).unwrap_err();
    assert!(err.contains("spec.ipam.staticRanges[0]") && err.contains("not inside"), "{err}");
}

fn ready(status: &str, reason: &str, observed: i64) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: format!("{reason} message"),
        observed_generation: Some(observed),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    }
}

fn with_condition(condition: Condition) -> PodNetwork {
    let mut net = full_network();
    net.status = Some(crate::model::pod_network::PodNetworkStatus {
        observed_generation: condition.observed_generation,
        conditions: vec![condition],
        device_class_name: None,
        nodes: Vec::new(),
    });
    net
}

#[test]
fn a_network_serves_claims_unless_missing_deleted_foreign_invalid_or_overlapping() {
    let check = |net: Option<&PodNetwork>| check_network_serves("medianet", net, "netclaim.dev");
    assert!(check(Some(&full_network())).is_ok(), "no status yet: the controller has not looked");
    assert!(check(Some(&with_condition(ready("True", "Ready", 3)))).is_ok());
    assert!(
        check(Some(&with_condition(ready("False", "Disabled", 3)))).is_ok(),
        "Disabled still serves allocated claims"
    );
    assert!(
        check(Some(&with_condition(ready("False", "Invalid", 2)))).is_ok(),
        "a verdict on an older generation"
    );
    let refused = [
        (None, "no PodNetwork of this name exists"),
        (
            Some(with_condition(ready("False", "Invalid", 3))),
            "not ready (Invalid: Invalid message)",
        ),
        (Some(with_condition(ready("False", "Overlaps", 3))), "Overlaps"),
        (
            Some({
                let mut n = full_network();
                n.metadata.deletion_timestamp =
                    Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
                n
            }),
            "being deleted",
        ),
        (
            Some({
                let mut n = full_network();
                n.spec.provider = "other.dev".into();
                n
            }),
            "provider other.dev",
        ),
    ];
    for (net, why) in refused {
        let err = check(net.as_ref()).expect_err(why);
        assert_eq!(err.path(), "podNetwork");
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
}
