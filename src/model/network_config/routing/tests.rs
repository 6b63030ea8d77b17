//! `routing`, `vrf` and `sysctls` through decode, merge and validation: each rule accepts and
//! refuses naming the field; administrator-only keys pass from a class entry and are refused
//! from the claim's.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use serde_json::{Value, json};

use super::super::{
    API_VERSION, ConfigEntry, ConfigError, ConfigSource, KIND, NodeSupport, ResolvedNetworkConfig,
    Rule, resolve,
};
use super::{PolicyRouting, Vrf};
use crate::testing::facts::{FactsBuilder as _, physical_nic};

fn entry(source: ConfigSource, body: Value) -> ConfigEntry {
    let mut parameters = json!({"apiVersion": API_VERSION, "kind": KIND});
    let Value::Object(fields) = body else { panic!("an object") };
    parameters.as_object_mut().unwrap().extend(fields);
    ConfigEntry { source, requests: vec![], parameters }
}

fn check_with(
    entries: &[ConfigEntry],
    support: &NodeSupport,
) -> Result<ResolvedNetworkConfig, ConfigError> {
    resolve(entries, "net", &physical_nic("eth1").shared(), support)
}

fn check(body: Value) -> Result<ResolvedNetworkConfig, ConfigError> {
    check_with(&[entry(ConfigSource::Claim, body)], &NodeSupport::everything())
}

#[test]
fn accepted_configs_resolve_with_defaults() {
    let resolved = check(json!({"routing": {}})).unwrap();
    assert_eq!(resolved.routing.policy, Some(PolicyRouting { table: 0, source_rules: true }));
    let resolved = check(json!({"routing": {"table": 300, "sourceRules": false}})).unwrap();
    assert_eq!(resolved.routing.policy, Some(PolicyRouting { table: 300, source_rules: false }));
    let resolved = check(json!({
        "vrf": {"name": "vrf-red", "table": 100},
        "sysctls": {"net.ipv4.tcp_l3mdev_accept": "1", "net.ipv4.conf.IFNAME.rp_filter": "0"}
    }))
    .unwrap();
    assert_eq!(resolved.routing.vrf, Some(Vrf { name: "vrf-red".into(), table: 100 }));
    assert_eq!(resolved.routing.sysctls.len(), 2);
    assert!(check(json!({})).unwrap().routing.is_empty());
}

#[test]
fn refusals_name_the_field() {
    let rows: &[(Value, &str)] = &[
        (json!({"routing": {"table": 254}}), "routing.table"),
        (json!({"routing": {"table": 255}}), "routing.table"),
        (json!({"routing": {"table": 253}}), "routing.table"),
        (json!({"vrf": {"table": 10}}), "vrf.name"),
        (json!({"vrf": {"name": "vrf-red"}}), "vrf.table"),
        (json!({"vrf": {"name": "vrf-red", "table": 0}}), "vrf.table"),
        (json!({"vrf": {"name": "vrf-red", "table": 254}}), "vrf.table"),
        (json!({"vrf": {"name": "a/b", "table": 10}}), "vrf.name"),
        (json!({"vrf": {"name": "net1", "table": 10}, "interface": {"name": "net1"}}), "vrf.name"),
        (json!({"vrf": {"name": "v", "table": 10}, "routing": {}}), "routing"),
        (
            json!({"sysctls": {"net.ipv4.conf.net1.rp_filter": "1"}}),
            "sysctls[\"net.ipv4.conf.net1.rp_filter\"]",
        ),
        (
            json!({"sysctls": {"net.ipv4.conf.IFNAME.bogus": "1"}}),
            "sysctls[\"net.ipv4.conf.IFNAME.bogus\"]",
        ),
        (
            json!({"sysctls": {"net.ipv4.conf.IFNAME.rp_filter": "9"}}),
            "sysctls[\"net.ipv4.conf.IFNAME.rp_filter\"]",
        ),
        (
            json!({"sysctls": {"net.ipv4.udp_l3mdev_accept": "1"}}),
            "sysctls[\"net.ipv4.udp_l3mdev_accept\"]",
        ),
        (
            json!({"sysctls": {"net.ipv4.conf.IFNAME.proxy_arp": "1"}}),
            "sysctls[\"net.ipv4.conf.IFNAME.proxy_arp\"]",
        ),
        (json!({"routing": {"table": -1}}), "routing.table"),
        (json!({"routing": {"tabel": 5}}), "routing.tabel"),
    ];
    for (body, path) in rows {
        let err = check(body.clone()).expect_err(&body.to_string());
        assert_eq!(err.path(), *path, "{body}: {err}");
        assert!(err.to_string().contains(path), "{body}: {err}");
    }
}

#[test]
fn administrator_keys_pass_from_the_class_and_are_refused_from_the_claim() {
    let key = "net.ipv4.conf.IFNAME.proxy_arp";
    let class = entry(ConfigSource::Class, json!({"sysctls": {key: "1"}}));
    let resolved = check_with(std::slice::from_ref(&class), &NodeSupport::everything()).unwrap();
    assert_eq!(resolved.routing.sysctls[0].attribute, "proxy_arp");
    // The claim may add its own keys next to the class's.
    let claim =
        entry(ConfigSource::Claim, json!({"sysctls": {"net.ipv4.conf.IFNAME.rp_filter": "2"}}));
    let merged = check_with(&[class.clone(), claim], &NodeSupport::everything()).unwrap();
    assert_eq!(merged.routing.sysctls.len(), 2);
    // But never one that acts for others, not even to the class's value.
    let claim = entry(ConfigSource::Claim, json!({"sysctls": {key: "1"}}));
    let err = check_with(&[class, claim], &NodeSupport::everything()).unwrap_err();
    assert_eq!(err.path(), format!("sysctls[{key:?}]"));
    assert!(
        matches!(err.rule(), Some(Rule::Sysctl(super::super::SysctlRefusal::AdminOnly))),
        "{err}"
    );
}

#[test]
fn a_node_without_vrf_refuses_it_at_prepare() {
    let support = NodeSupport::everything().refuse_vrf("no vrf module");
    let err = check_with(
        &[entry(ConfigSource::Claim, json!({"vrf": {"name": "vrf-red", "table": 100}}))],
        &support,
    )
    .unwrap_err();
    assert_eq!(err.path(), "vrf");
    assert!(err.to_string().contains("no vrf module"), "{err}");
}
