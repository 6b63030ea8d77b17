//! Table tests for `NetworkConfig`: one accept and one reject row per rule, plus merge tests.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde_json::{Value, json};

use super::*;
use crate::model::support::{KernelSupport, Probe};
use crate::podnet::plan::node_support;
use crate::testing::facts::{FactsBuilder as _, physical_nic};

/// [`super::resolve`] on a node that can attach everything: these tests are about the
/// config's own rules.
fn resolve(
    entries: &[ConfigEntry],
    request: &str,
    device: &DeviceFacts,
) -> Result<ResolvedNetworkConfig, ConfigError> {
    super::resolve(entries, request, device, &NodeSupport::everything())
}

fn shared() -> DeviceFacts {
    physical_nic("eth1").shared()
}

fn slot() -> DeviceFacts {
    physical_nic("eth1").slot()
}

fn exclusive() -> DeviceFacts {
    physical_nic("eth1")
}

fn vf() -> DeviceFacts {
    exclusive().vf(1500)
}

fn bond() -> DeviceFacts {
    exclusive().kind(DeviceKind::Bond)
}

fn with_children(passthru: u32, other: u32) -> DeviceFacts {
    shared().macvlan_children(passthru, other)
}

fn with_ipvlan_children(count: u32) -> DeviceFacts {
    shared().ipvlan_children(count)
}

/// Adds `apiVersion` and `kind` to a parameters object.
fn params(body: Value) -> Value {
    let mut v = json!({"apiVersion": API_VERSION, "kind": KIND});
    let (Value::Object(map), Value::Object(extra)) = (&mut v, body) else {
        panic!("test parameters must be objects");
    };
    map.extend(extra);
    v
}

fn claim_entry(body: Value) -> ConfigEntry {
    ConfigEntry { source: ConfigSource::Claim, requests: vec![], parameters: params(body) }
}

fn check(body: Value, device: &DeviceFacts) -> Result<ResolvedNetworkConfig, ConfigError> {
    resolve(&[claim_entry(body)], "nic", device)
}

/// One row: a config, a device, and `None` (accepted) or the field path the error names.
struct Case {
    name: &'static str,
    device: DeviceFacts,
    body: Value,
    rejects_at: Option<&'static str>,
}

fn accept(name: &'static str, device: DeviceFacts, body: Value) -> Case {
    Case { name, device, body, rejects_at: None }
}

fn reject(name: &'static str, device: DeviceFacts, body: Value, path: &'static str) -> Case {
    Case { name, device, body, rejects_at: Some(path) }
}

#[allow(clippy::too_many_lines, reason = "one table row per rule")]
fn cases() -> Vec<Case> {
    let v4_pool = json!({"subnet": "10.10.1.0/24", "rangeStart": "10.10.1.10",
        "rangeEnd": "10.10.1.200", "gateway": "10.10.1.1", "exclude": ["10.10.1.100/30"]});
    let with_pool = |pool: Value| json!({"ipam": {"pool": pool}});
    vec![
        // decoding
        accept("minimal config", shared(), json!({})),
        reject("unknown top-level field", shared(), json!({"colour": "red"}), "colour"),
        reject(
            "unknown nested field",
            shared(),
            json!({"interface": {"nmae": "x"}}),
            "interface.nmae",
        ),
        reject("wrong type", shared(), json!({"interface": {"mtu": "big"}}), "interface.mtu"),
        reject("unknown mode", shared(), json!({"mode": "bridge"}), "mode"),
        reject("negative vlan", shared(), json!({"vlan": -1}), "vlan"),
        reject(
            "route without destination",
            shared(),
            json!({"routes": [{"gateway": "10.0.0.1"}]}),
            "routes[0]",
        ),
        // mode per device
        accept("shared: macvlan", shared(), json!({"mode": "macvlan"})),
        accept("shared: ipvlan", shared(), json!({"mode": "ipvlan"})),
        reject("shared: host-device", shared(), json!({"mode": "host-device"}), "mode"),
        accept("slot: ipvlan", slot(), json!({"mode": "ipvlan"})),
        reject("slot: sriov-vf", slot(), json!({"mode": "sriov-vf"}), "mode"),
        accept("exclusive: host-device", exclusive(), json!({"mode": "host-device"})),
        reject("exclusive: macvlan", exclusive(), json!({"mode": "macvlan"}), "mode"),
        reject("exclusive non-VF: sriov-vf", exclusive(), json!({"mode": "sriov-vf"}), "mode"),
        accept("VF: sriov-vf", vf(), json!({"mode": "sriov-vf"})),
        accept("VF: host-device", vf(), json!({"mode": "host-device"})),
        reject("bond cannot move", bond(), json!({}), "mode"),
        // mode-specific sections
        accept("macvlan section with macvlan", shared(), json!({"macvlan": {"mode": "vepa"}})),
        reject(
            "macvlan section with ipvlan",
            shared(),
            json!({"mode": "ipvlan", "macvlan": {"mode": "vepa"}}),
            "macvlan",
        ),
        accept(
            "ipvlan section with ipvlan",
            shared(),
            json!({"mode": "ipvlan", "ipvlan": {"mode": "l3", "flag": "private"}}),
        ),
        reject(
            "ipvlan section with macvlan",
            shared(),
            json!({"ipvlan": {"mode": "l3"}}),
            "ipvlan",
        ),
        accept("sriov with sriov-vf", vf(), json!({"sriov": {"trust": true}})),
        reject("sriov with host-device", exclusive(), json!({"sriov": {"trust": true}}), "sriov"),
        // interface name
        accept("name net1", shared(), json!({"interface": {"name": "net1"}})),
        accept("name of 15 bytes", shared(), json!({"interface": {"name": "abcdefghijklmno"}})),
        reject(
            "name too long",
            shared(),
            json!({"interface": {"name": "this-name-is-far-too-long"}}),
            "interface.name",
        ),
        reject("empty name", shared(), json!({"interface": {"name": ""}}), "interface.name"),
        reject("name with /", shared(), json!({"interface": {"name": "a/b"}}), "interface.name"),
        reject("name with :", shared(), json!({"interface": {"name": "a:b"}}), "interface.name"),
        reject(
            "name with space",
            shared(),
            json!({"interface": {"name": "a b"}}),
            "interface.name",
        ),
        reject("name eth0", shared(), json!({"interface": {"name": "eth0"}}), "interface.name"),
        reject("name lo", shared(), json!({"interface": {"name": "lo"}}), "interface.name"),
        reject("name ..", shared(), json!({"interface": {"name": ".."}}), "interface.name"),
        // MTU
        accept("macvlan MTU = parent", shared(), json!({"interface": {"mtu": 1500}})),
        accept("macvlan MTU 68", shared(), json!({"interface": {"mtu": 68}})),
        reject(
            "macvlan MTU above parent",
            shared(),
            json!({"interface": {"mtu": 1501}}),
            "interface.mtu",
        ),
        reject(
            "macvlan MTU below 68",
            shared(),
            json!({"interface": {"mtu": 67}}),
            "interface.mtu",
        ),
        reject(
            "ipvlan MTU above parent",
            shared(),
            json!({"mode": "ipvlan", "interface": {"mtu": 9000}}),
            "interface.mtu",
        ),
        accept("host-device MTU = device max", exclusive(), json!({"interface": {"mtu": 9000}})),
        reject(
            "host-device MTU above device max",
            exclusive(),
            json!({"interface": {"mtu": 9001}}),
            "interface.mtu",
        ),
        reject(
            "host-device MTU below device min",
            exclusive().mtu_range(576, 9000),
            json!({"interface": {"mtu": 575}}),
            "interface.mtu",
        ),
        accept("VF MTU = PF MTU", vf(), json!({"interface": {"mtu": 1500}})),
        reject("VF MTU above PF MTU", vf(), json!({"interface": {"mtu": 1600}}), "interface.mtu"),
        accept(
            "IPv6 with MTU 1280",
            shared(),
            json!({"interface": {"mtu": 1280}, "ipam": {"addresses": ["fd00::5/64"]}}),
        ),
        reject(
            "IPv6 with MTU 1279",
            shared(),
            json!({"interface": {"mtu": 1279}, "ipam": {"addresses": ["fd00::5/64"]}}),
            "interface.mtu",
        ),
        reject(
            "IPv6 pool on a parent with MTU 1000",
            shared().mtu(1000),
            with_pool(json!({"subnet": "fd00:10::/64"})),
            "interface.mtu",
        ),
        // passthru
        accept(
            "passthru on a parent without children",
            shared(),
            json!({"macvlan": {"mode": "passthru"}}),
        ),
        reject(
            "passthru next to another child",
            with_children(0, 1),
            json!({"macvlan": {"mode": "passthru"}}),
            "macvlan.mode",
        ),
        reject(
            "second passthru child",
            with_children(1, 0),
            json!({"macvlan": {"mode": "passthru"}}),
            "macvlan.mode",
        ),
        accept(
            "bridge next to other children",
            with_children(0, 5),
            json!({"macvlan": {"mode": "bridge"}}),
        ),
        reject(
            "bridge next to a passthru child",
            with_children(1, 0),
            json!({"macvlan": {"mode": "bridge"}}),
            "mode",
        ),
        // one kind of child per parent
        accept(
            "ipvlan next to ipvlan children",
            with_ipvlan_children(3),
            json!({"mode": "ipvlan"}),
        ),
        reject("macvlan next to ipvlan children", with_ipvlan_children(1), json!({}), "mode"),
        reject(
            "ipvlan next to macvlan children",
            with_children(0, 2),
            json!({"mode": "ipvlan"}),
            "mode",
        ),
        reject(
            "ipvlan next to a passthru child",
            with_children(1, 0),
            json!({"mode": "ipvlan"}),
            "mode",
        ),
        reject(
            "passthru next to ipvlan children",
            with_ipvlan_children(1),
            json!({"macvlan": {"mode": "passthru"}}),
            "mode",
        ),
        // hardware address
        accept(
            "MAC on macvlan",
            shared(),
            json!({"interface": {"hardwareAddress": "02:00:00:00:00:01"}}),
        ),
        accept(
            "MAC on host-device",
            exclusive(),
            json!({"interface": {"hardwareAddress": "02:AB:00:00:00:01"}}),
        ),
        reject(
            "MAC with ipvlan",
            shared(),
            json!({"mode": "ipvlan", "interface": {"hardwareAddress": "02:00:00:00:00:01"}}),
            "interface.hardwareAddress",
        ),
        reject(
            "multicast MAC",
            shared(),
            json!({"interface": {"hardwareAddress": "01:00:5e:00:00:01"}}),
            "interface.hardwareAddress",
        ),
        reject(
            "all-zero MAC",
            shared(),
            json!({"interface": {"hardwareAddress": "00:00:00:00:00:00"}}),
            "interface.hardwareAddress",
        ),
        reject(
            "malformed MAC",
            shared(),
            json!({"interface": {"hardwareAddress": "02:00:00:00:00"}}),
            "interface.hardwareAddress",
        ),
        // static addresses
        accept(
            "dual-stack static",
            shared(),
            json!({"ipam": {"addresses": ["10.10.1.5/24", "fd00:10::5/64"]}}),
        ),
        reject(
            "address without prefix",
            shared(),
            json!({"ipam": {"addresses": ["10.10.1.5"]}}),
            "ipam.addresses[0]",
        ),
        reject(
            "address with bad prefix",
            shared(),
            json!({"ipam": {"addresses": ["10.10.1.5/33"]}}),
            "ipam.addresses[0]",
        ),
        reject(
            "network address as interface address",
            shared(),
            json!({"ipam": {"addresses": ["fd00::1/64", "10.10.1.0/24"]}}),
            "ipam.addresses[1]",
        ),
        reject(
            "multicast address",
            shared(),
            json!({"ipam": {"addresses": ["224.0.0.1/4"]}}),
            "ipam.addresses[0]",
        ),
        reject(
            "duplicate address",
            shared(),
            json!({"ipam": {"addresses": ["10.0.0.5/24", "10.0.0.5/16"]}}),
            "ipam.addresses[1]",
        ),
        reject(
            "17 addresses",
            shared(),
            json!({"ipam": {"addresses": (1..=17).map(|i| format!("10.0.0.{i}/24")).collect::<Vec<_>>()}}),
            "ipam.addresses",
        ),
        reject(
            "addresses and pool in one entry",
            shared(),
            json!({"ipam": {"addresses": ["10.10.1.5/24"], "pool": {"subnet": "10.10.1.0/24"}}}),
            "ipam.addresses",
        ),
        // pool
        accept("full pool", shared(), with_pool(v4_pool.clone())),
        accept("IPv6 pool with defaults", shared(), with_pool(json!({"subnet": "fd00:10::/64"}))),
        reject(
            "pool without subnet",
            shared(),
            with_pool(json!({"rangeStart": "10.10.1.10"})),
            "ipam.pool.subnet",
        ),
        reject(
            "pool subnet with host bits",
            shared(),
            with_pool(json!({"subnet": "10.10.1.1/24"})),
            "ipam.pool.subnet",
        ),
        reject(
            "rangeStart outside subnet",
            shared(),
            with_pool(json!({"subnet": "10.10.1.0/24", "rangeStart": "10.10.2.10"})),
            "ipam.pool.rangeStart",
        ),
        reject(
            "rangeEnd is the broadcast address",
            shared(),
            with_pool(json!({"subnet": "10.10.1.0/24", "rangeEnd": "10.10.1.255"})),
            "ipam.pool.rangeEnd",
        ),
        reject(
            "rangeEnd of the other family",
            shared(),
            with_pool(json!({"subnet": "10.10.1.0/24", "rangeEnd": "fd00::1"})),
            "ipam.pool.rangeEnd",
        ),
        reject(
            "rangeStart after rangeEnd",
            shared(),
            with_pool(
                json!({"subnet": "10.10.1.0/24", "rangeStart": "10.10.1.20", "rangeEnd": "10.10.1.10"}),
            ),
            "ipam.pool.rangeStart",
        ),
        reject(
            "gateway outside subnet",
            shared(),
            with_pool(json!({"subnet": "10.10.1.0/24", "gateway": "10.10.2.1"})),
            "ipam.pool.gateway",
        ),
        reject(
            "exclude of the other family",
            shared(),
            with_pool(json!({"subnet": "10.10.1.0/24", "exclude": ["fd00::/120"]})),
            "ipam.pool.exclude[0]",
        ),
        reject(
            "exclude not a CIDR",
            shared(),
            with_pool(json!({"subnet": "10.10.1.0/24", "exclude": ["10.10.1.0/24", "10.10.1.7"]})),
            "ipam.pool.exclude[1]",
        ),
        // routes
        accept(
            "routes with gateways in the pool subnet",
            shared(),
            json!({"ipam": {"pool": v4_pool},
            "routes": [{"destination": "10.20.0.0/16", "gateway": "10.10.1.1"},
                       {"destination": "0.0.0.0/0", "gateway": "10.10.1.1", "metric": 200}]}),
        ),
        accept("on-link route", shared(), json!({"routes": [{"destination": "10.30.0.0/16"}]})),
        accept(
            "IPv6 route via static address",
            shared(),
            json!({"ipam": {"addresses": ["fd00:10::5/64"]},
            "routes": [{"destination": "fd00:20::/64", "gateway": "fd00:10::1"}]}),
        ),
        accept(
            "IPv6 link-local gateway",
            shared(),
            json!({
            "routes": [{"destination": "::/0", "gateway": "fe80::1", "metric": 100}]}),
        ),
        reject(
            "IPv6 gateway outside every subnet",
            shared(),
            json!({"ipam": {"addresses": ["fd00:10::5/64"]},
            "routes": [{"destination": "fd00:20::/64", "gateway": "fd00:11::1"}]}),
            "routes[0].gateway",
        ),
        reject(
            "destination with host bits",
            shared(),
            json!({"routes": [{"destination": "10.20.0.1/16"}]}),
            "routes[0].destination",
        ),
        reject(
            "destination not a CIDR",
            shared(),
            json!({"routes": [{"destination": "default"}]}),
            "routes[0].destination",
        ),
        reject(
            "gateway not connected",
            shared(),
            json!({"ipam": {"addresses": ["10.10.1.5/24"]},
            "routes": [{"destination": "10.20.0.0/16", "gateway": "10.10.1.1"},
                       {"destination": "10.21.0.0/16", "gateway": "10.99.0.1"}]}),
            "routes[1].gateway",
        ),
        reject(
            "gateway without any address",
            shared(),
            json!({"routes": [{"destination": "10.20.0.0/16", "gateway": "10.10.1.1"}]}),
            "routes[0].gateway",
        ),
        reject(
            "gateway family differs",
            shared(),
            json!({"ipam": {"addresses": ["10.10.1.5/24", "fd00::5/64"]},
            "routes": [{"destination": "10.20.0.0/16", "gateway": "fd00::1"}]}),
            "routes[0].gateway",
        ),
        reject(
            "default route without metric",
            shared(),
            json!({"ipam": {"addresses": ["10.10.1.5/24"]},
            "routes": [{"destination": "10.20.0.0/16"}, {"destination": "0.0.0.0/0", "gateway": "10.10.1.1"}]}),
            "routes[1].metric",
        ),
        reject(
            "duplicate route",
            shared(),
            json!({
            "routes": [{"destination": "10.20.0.0/16"}, {"destination": "10.20.0.0/16"}]}),
            "routes[1].destination",
        ),
        // VLAN
        accept("VLAN on a shared parent", shared(), json!({"vlan": 100})),
        accept("VLAN 4094 on a VF", vf(), json!({"vlan": 4094})),
        reject("VLAN 0", shared(), json!({"vlan": 0}), "vlan"),
        reject("VLAN 4095", shared(), json!({"vlan": 4095}), "vlan"),
        reject("VLAN with host-device", exclusive(), json!({"vlan": 100}), "vlan"),
        // SR-IOV settings
        accept(
            "all VF settings",
            vf(),
            json!({"sriov": {"qos": 7, "spoofCheck": false, "trust": true,
            "maxTxRateMbps": 1000, "minTxRateMbps": 100, "linkState": "enable",
            "vlanProtocol": "802.1ad"}}),
        ),
        reject(
            "unknown VLAN protocol",
            vf(),
            json!({"sriov": {"vlanProtocol": "802.1x"}}),
            "sriov.vlanProtocol",
        ),
        reject("qos 8", vf(), json!({"sriov": {"qos": 8}}), "sriov.qos"),
        reject(
            "min rate above max",
            vf(),
            json!({"sriov": {"maxTxRateMbps": 100, "minTxRateMbps": 200}}),
            "sriov.minTxRateMbps",
        ),
        reject(
            "unknown link state",
            vf(),
            json!({"sriov": {"linkState": "up"}}),
            "sriov.linkState",
        ),
        // podNetwork
        accept("podNetwork name", shared(), json!({"podNetwork": "medianet"})),
        reject(
            "podNetwork not a DNS label",
            shared(),
            json!({"podNetwork": "Media_Net"}),
            "podNetwork",
        ),
    ]
}

#[test]
fn every_rule_accepts_and_rejects_naming_the_field() {
    let mut failures = Vec::new();
    for case in cases() {
        let result = check(case.body.clone(), &case.device);
        match (case.rejects_at, result) {
            (None, Ok(_)) => {}
            (None, Err(e)) => failures.push(format!("{}: expected accept, got: {e}", case.name)),
            (Some(path), Ok(r)) => {
                failures
                    .push(format!("{}: expected rejection at {path}, accepted: {r:?}", case.name));
            }
            (Some(path), Err(e)) => {
                if e.path() != path {
                    failures.push(format!(
                        "{}: error names {:?}, expected {path:?}: {e}",
                        case.name,
                        e.path()
                    ));
                }
                let message = e.to_string();
                if !message.contains(path) {
                    failures
                        .push(format!("{}: message does not name {path}: {message}", case.name));
                }
                if e.value().is_empty() {
                    failures.push(format!("{}: error carries no value: {message}", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} failing rows:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn the_table_has_an_accept_and_a_reject_row_per_rule_group() {
    let rows = cases();
    assert!(rows.iter().filter(|c| c.rejects_at.is_none()).count() >= 30);
    assert!(rows.iter().filter(|c| c.rejects_at.is_some()).count() >= 50);
}

#[test]
fn too_long_interface_name_message_names_field_and_value() {
    let err = check(json!({"interface": {"name": "this-name-is-far-too-long"}}), &shared())
        .expect_err("name is too long");
    let msg = err.to_string();
    assert!(
        msg.starts_with("interface.name: \"this-name-is-far-too-long\": invalid interface name"),
        "{msg}"
    );
    assert!(matches!(err.rule(), Some(Rule::InterfaceName(_))));
}

#[test]
fn wrong_api_version_and_kind_are_rejected_by_name() {
    let mut p = params(json!({}));
    p["apiVersion"] = json!("netclaim.dev/v1");
    let entry = ConfigEntry { source: ConfigSource::Claim, requests: vec![], parameters: p };
    let err = resolve(&[entry], "nic", &shared()).expect_err("wrong apiVersion");
    assert!(matches!(err, ConfigError::ApiVersion { entry: 0, .. }), "{err}");
    assert_eq!(err.path(), "apiVersion");
    assert_eq!(err.value(), "\"netclaim.dev/v1\"");

    let missing = json!({"apiVersion": API_VERSION});
    let err = decode(3, &missing).expect_err("kind missing");
    assert!(matches!(err, ConfigError::Kind { entry: 3, .. }), "{err}");
    assert_eq!(err.value(), "<missing>");

    let err = decode(0, &json!(["not", "an", "object"])).expect_err("array");
    assert_eq!(err.path(), "parameters");
}

#[test]
fn decode_error_quotes_the_offending_value_and_entry() {
    let entries = [
        claim_entry(json!({"mode": "macvlan"})),
        claim_entry(
            json!({"routes": [{"destination": "10.0.0.0/8"}, {"destination": "10.1.0.0/16", "gateway": 7}]}),
        ),
    ];
    let err = merge_for_request(&entries, "nic").expect_err("gateway is a number");
    let ConfigError::Decode { entry, path, value, .. } = &err else { panic!("{err}") };
    assert_eq!((*entry, path.as_str(), value.as_str()), (1, "routes[1].gateway", "7"));
}

#[test]
fn defaults_follow_the_device() {
    let r = check(json!({}), &shared()).expect("valid");
    assert_eq!(r.mode, ResolvedMode::Macvlan { mode: MacvlanMode::Bridge });
    assert_eq!(r.interface, ResolvedInterface { name: None, mtu: 1500, hardware_address: None });
    assert_eq!((r.addressing, r.stats, r.vlan, r.sriov), (Addressing::None, true, None, None));
    assert_eq!(check(json!({}), &exclusive()).expect("valid").mode, ResolvedMode::HostDevice);
    let vf = check(json!({}), &vf()).expect("valid");
    assert_eq!(vf.mode, ResolvedMode::SriovVf);
    assert_eq!(
        vf.sriov,
        Some(SriovSettings {
            qos: 0,
            spoof_check: true,
            trust: false,
            max_tx_rate_mbps: 0,
            min_tx_rate_mbps: 0,
            link_state: VfLinkState::Auto,
            vlan_protocol: super::VfVlanProtocol::Ieee8021Q,
        })
    );
    let ipvlan = check(json!({"mode": "ipvlan"}), &shared()).expect("valid");
    assert_eq!(
        ipvlan.mode,
        ResolvedMode::Ipvlan { mode: IpvlanMode::L2, flag: IpvlanFlag::Bridge }
    );
}

#[test]
fn pool_defaults_skip_network_and_broadcast() {
    let r = check(
        json!({"ipam": {"pool": {"subnet": "10.10.1.0/24", "exclude": ["10.10.1.100/30"]}}}),
        &shared(),
    )
    .expect("valid");
    let Addressing::Pool(pool) = r.addressing else { panic!("pool expected") };
    assert_eq!(pool.range_start, "10.10.1.1".parse::<IpAddr>().unwrap());
    assert_eq!(pool.range_end, "10.10.1.254".parse::<IpAddr>().unwrap());
    assert_eq!(pool.exclude, vec!["10.10.1.100/30".parse::<IpNetwork>().unwrap()]);
    let r =
        check(json!({"ipam": {"pool": {"subnet": "fd00:10::/120"}}}), &shared()).expect("valid");
    let Addressing::Pool(pool) = r.addressing else { panic!("pool expected") };
    assert_eq!(pool.range_start, "fd00:10::1".parse::<IpAddr>().unwrap());
    assert_eq!(pool.range_end, "fd00:10::ff".parse::<IpAddr>().unwrap());
}

#[test]
fn later_entries_override_field_by_field() {
    let class = ConfigEntry {
        source: ConfigSource::Class,
        requests: vec![],
        parameters: params(json!({"mode": "macvlan", "macvlan": {"mode": "vepa"},
            "interface": {"name": "net1", "mtu": 1400}, "stats": false,
            "routes": [{"destination": "10.20.0.0/16"}]})),
    };
    let claim = claim_entry(
        json!({"interface": {"mtu": 1450}, "routes": [{"destination": "10.30.0.0/16"}]}),
    );
    // Given claim-first, the class entry still applies first.
    let r = resolve(&[claim, class], "nic", &shared()).expect("valid");
    assert_eq!(r.mode, ResolvedMode::Macvlan { mode: MacvlanMode::Vepa });
    assert_eq!(r.interface.name.as_deref(), Some("net1"));
    assert_eq!(r.interface.mtu, 1450);
    assert!(!r.stats);
    assert_eq!(r.routes.len(), 1, "lists are replaced, not appended");
    assert_eq!(r.routes[0].destination, "10.30.0.0/16".parse::<IpNetwork>().unwrap());
}

#[test]
fn entries_apply_only_to_their_requests() {
    let entries = [
        ConfigEntry {
            source: ConfigSource::Claim,
            requests: vec!["other".into()],
            parameters: params(json!({"interface": {"name": "other0"}})),
        },
        ConfigEntry {
            source: ConfigSource::Claim,
            requests: vec!["nic".into()],
            parameters: params(json!({"interface": {"mtu": 1400}})),
        },
    ];
    let r = resolve(&entries, "nic", &shared()).expect("valid");
    assert_eq!((r.interface.name, r.interface.mtu), (None, 1400));
    // A firstAvailable result `<req>/<sub>` takes the config of `<req>`.
    let r = resolve(&entries, "nic/fast", &shared()).expect("valid");
    assert_eq!(r.interface.mtu, 1400);
    let r = resolve(&entries, "other", &shared()).expect("valid");
    assert_eq!((r.interface.name.as_deref(), r.interface.mtu), (Some("other0"), 1500));
    // An invalid entry for another request does not fail this one.
    let bad = ConfigEntry {
        source: ConfigSource::Claim,
        requests: vec!["other".into()],
        parameters: json!({"apiVersion": "v0"}),
    };
    assert!(resolve(&[bad], "nic", &shared()).is_ok());
}

#[test]
fn claim_addresses_replace_class_pool_and_a_new_subnet_replaces_the_pool() {
    let class = ConfigEntry {
        source: ConfigSource::Class,
        requests: vec![],
        parameters: params(
            json!({"ipam": {"pool": {"subnet": "10.10.1.0/24", "rangeStart": "10.10.1.10"}}}),
        ),
    };
    let r = resolve(
        &[class.clone(), claim_entry(json!({"ipam": {"addresses": ["10.10.1.5/24"]}}))],
        "nic",
        &shared(),
    )
    .expect("valid");
    assert_eq!(r.addressing, Addressing::Static(vec!["10.10.1.5/24".parse().unwrap()]));

    let r = resolve(
        &[class.clone(), claim_entry(json!({"ipam": {"pool": {"subnet": "10.20.0.0/24"}}}))],
        "nic",
        &shared(),
    )
    .expect("a different subnet drops the class range");
    let Addressing::Pool(pool) = r.addressing else { panic!("pool") };
    assert_eq!(pool.range_start, "10.20.0.1".parse::<IpAddr>().unwrap());

    let r = resolve(
        &[class, claim_entry(json!({"ipam": {"pool": {"rangeEnd": "10.10.1.20"}}}))],
        "nic",
        &shared(),
    )
    .expect("same pool merges per field");
    let Addressing::Pool(pool) = r.addressing else { panic!("pool") };
    assert_eq!(
        (pool.range_start, pool.range_end),
        ("10.10.1.10".parse().unwrap(), "10.10.1.20".parse().unwrap())
    );
}

#[test]
fn every_vf_setting_of_a_claim_entry_wins_over_the_class_entry() {
    let decode = |value: Value| {
        serde_json::from_value::<NetworkConfig>(params(value)).expect("a valid config entry")
    };
    let mut merged = decode(json!({"sriov": {"trust": true, "vlanProtocol": "802.1Q"}}));
    merged.merge(decode(json!({"sriov": {"vlanProtocol": "802.1ad", "qos": 3}})));
    let sriov = merged.sriov.expect("both entries set sriov");
    assert_eq!(sriov.vlan_protocol, Some(VfVlanProtocol::Ieee8021Ad));
    assert_eq!((sriov.trust, sriov.qos), (Some(true), Some(3)));
}

#[test]
fn resolved_config_round_trips_through_json() {
    let r = check(
        json!({"interface": {"name": "net1", "hardwareAddress": "02:00:00:00:00:01"},
               "ipam": {"pool": {"subnet": "10.10.1.0/24", "gateway": "10.10.1.1"}},
               "routes": [{"destination": "0.0.0.0/0", "gateway": "10.10.1.1", "metric": 100}]}),
        &shared(),
    )
    .expect("valid");
    let text = serde_json::to_string(&r).expect("serialisable");
    assert!(text.contains("\"02:00:00:00:00:01\""), "{text}");
    let back: ResolvedNetworkConfig = serde_json::from_str(&text).expect("round trip");
    assert_eq!(back, r);
}

#[test]
fn mac_parse_and_display_are_inverse() {
    let mac: MacAddr = "02:AB:cd:00:00:01".parse().expect("valid");
    assert_eq!(mac.to_string(), "02:ab:cd:00:00:01");
    for bad in [
        "",
        "02:00:00:00:00",
        "02:00:00:00:00:00:00",
        "0200:00:00:00:00",
        "02-00-00-00-00-01",
        "g2:00:00:00:00:00",
    ] {
        assert!(bad.parse::<MacAddr>().is_err(), "{bad}");
    }
}

#[test]
fn config_source_parses_the_api_names() {
    assert_eq!(ConfigSource::from_api("FromClass"), Some(ConfigSource::Class));
    assert_eq!(ConfigSource::from_api("FromClaim"), Some(ConfigSource::Claim));
    assert_eq!(ConfigSource::from_api("fromclaim"), None);
}

#[test]
fn routes_and_parameters_past_their_limits_are_refused_by_name() {
    let routes = |n: usize| -> Vec<Value> {
        (0..n).map(|i| json!({"destination": format!("10.{}.{}.0/24", i / 256, i % 256)})).collect()
    };
    check(json!({"routes": routes(MAX_ROUTES)}), &shared()).unwrap();
    let err = check(json!({"routes": routes(MAX_ROUTES + 1)}), &shared()).unwrap_err();
    assert_eq!(err.path(), "routes");
    assert_eq!(err.value(), "65 routes");
    assert!(err.to_string().contains("more than 64 routes"), "{err}");

    // Tens of thousands of routes are refused at decode, by size, before any check runs.
    let huge = params(json!({"routes": routes(20_000)}));
    let err = decode(3, &huge).unwrap_err();
    assert_eq!(err.path(), "parameters");
    assert!(err.to_string().starts_with("config entry 3: parameters: "), "{err}");
    assert!(err.to_string().ends_with("more than the 10240 bytes allowed"), "{err}");
    let just_fits = params(json!({"interface": {"name": "net1"}, "x": "y".repeat(10_000)}));
    assert!(!matches!(decode(0, &just_fits), Err(ConfigError::TooLarge { .. })));
}

mod decoder_props {
    //! NetworkConfig decoding and validation over outside input (a claim's opaque
    //! parameters, JSON or YAML): never a panic, and every error names a field path.

    use proptest::prelude::*;

    use super::*;

    /// Arbitrary JSON, a few levels deep.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
            "[a-z0-9./:-]{0,20}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 32, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A config-shaped object: the real field names with arbitrary values, so decoding
    /// gets past the unknown-field check and validation runs.
    fn config_like() -> impl Strategy<Value = Value> {
        let field = prop_oneof![
            Just("mode"),
            Just("interface"),
            Just("macvlan"),
            Just("vlan"),
            Just("ipam"),
            Just("routes"),
            Just("sriov"),
            Just("stats"),
        ];
        let plausible = prop_oneof![
            json_value(),
            Just(json!("macvlan")),
            Just(json!("host-device")),
            Just(json!({"pool": {"subnet": "10.1.0.0/24", "gateway": "10.1.0.1"}})),
            Just(json!({"addresses": ["10.1.0.5/24", "fd00::5/64"]})),
            Just(json!([{"destination": "0.0.0.0/0", "gateway": "10.1.0.1"}])),
            Just(json!({"name": "net1", "mtu": 1400})),
        ];
        proptest::collection::btree_map(field, plausible, 0..6).prop_map(|m| {
            let mut object = serde_json::Map::new();
            object.insert("apiVersion".into(), json!(API_VERSION));
            object.insert("kind".into(), json!(KIND));
            for (k, v) in m {
                object.insert(k.to_owned(), v);
            }
            Value::Object(object)
        })
    }

    fn exercise(parameters: &Value) -> Result<(), TestCaseError> {
        match decode(0, parameters) {
            Ok(config) => {
                for device in [shared(), exclusive(), vf(), slot()] {
                    if let Err(err) = config.validate(&device, &NodeSupport::everything()) {
                        prop_assert!(!err.path().is_empty(), "{err}");
                    }
                }
            }
            Err(err) => prop_assert!(!err.path().is_empty(), "{err}"),
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_json_never_panics_and_errors_name_a_field(parameters in json_value()) {
            exercise(&parameters)?;
        }

        #[test]
        fn config_shaped_json_never_panics_and_errors_name_a_field(parameters in config_like()) {
            exercise(&parameters)?;
        }

        #[test]
        fn arbitrary_yaml_text_never_panics(text in "[ -~\n]{0,400}") {
            if let Ok(parameters) = yaml_serde::from_str::<Value>(&text) {
                exercise(&parameters)?;
            }
        }
    }
}

/// A node whose kernel lacks ipvlan and 8021q, as the start-up probe reports it.
fn node_without_ipvlan_and_8021q() -> NodeSupport {
    let missing = || Probe::Missing { detail: "the kernel answered EOPNOTSUPP".to_owned() };
    node_support(&KernelSupport {
        ipvlan: missing(),
        vlan: missing(),
        vrf: missing(),
        ..KernelSupport::unprobed()
    })
}

fn refused_on(support: &NodeSupport, body: Value, device: &DeviceFacts) -> ConfigError {
    super::resolve(&[claim_entry(body)], "nic", device, support).expect_err("refused")
}

#[test]
fn a_mode_the_kernel_lacks_is_refused_naming_mode_with_the_kernel_reason() {
    let support = node_without_ipvlan_and_8021q();
    for device in [shared(), slot()] {
        let err = refused_on(&support, json!({"mode": "ipvlan"}), &device);
        assert_eq!(err.path(), "mode");
        let message = err.to_string();
        assert!(
            message.contains("ipvlan is not available on this node's kernel")
                && message.contains("EOPNOTSUPP"),
            "{message}"
        );
    }
    // macvlan (the shared default) is not affected.
    let r = super::resolve(&[claim_entry(json!({}))], "nic", &shared(), &support).unwrap();
    assert_eq!(r.mode.mode(), Mode::Macvlan);
}

#[test]
fn a_vlan_without_8021q_is_refused_naming_vlan_but_passes_on_an_unprobed_kernel() {
    let support = node_without_ipvlan_and_8021q();
    let err = refused_on(&support, json!({"mode": "macvlan", "vlan": 7}), &shared());
    assert_eq!(err.path(), "vlan");
    assert!(err.to_string().contains("VLAN sub-interfaces are not available"), "{err}");
    let unprobed = node_support(&KernelSupport::unprobed());
    let r = super::resolve(
        &[claim_entry(json!({"mode": "macvlan", "vlan": 7}))],
        "nic",
        &shared(),
        &unprobed,
    )
    .unwrap();
    assert_eq!(r.vlan, Some(7));
}

#[test]
fn every_mode_is_attachable_on_a_capable_kernel_and_a_missing_kind_is_refused() {
    let available = node_support(&KernelSupport {
        ipvlan: Probe::Available,
        vlan: Probe::Available,
        vrf: Probe::Available,
        fq: Probe::Available,
    });
    let r = super::resolve(&[claim_entry(json!({"mode": "ipvlan"}))], "nic", &shared(), &available)
        .unwrap();
    assert_eq!(r.mode.mode(), Mode::Ipvlan, "the ipvlan attach exists");
    let r = super::resolve(&[claim_entry(json!({"mode": "sriov-vf"}))], "nic", &vf(), &available)
        .unwrap();
    assert_eq!(r.mode, ResolvedMode::SriovVf, "the sriov-vf attach exists");
    // Where the kernel lacks it, ipvlan is refused with the kernel's reason.
    let err = refused_on(&node_without_ipvlan_and_8021q(), json!({"mode": "ipvlan"}), &shared());
    assert!(err.to_string().contains("not available on this node's kernel"), "{err}");
}

#[test]
fn a_vf_without_a_mode_gets_sriov_vf_with_its_settings() {
    // DESIGN §3: an exclusive VF defaults to sriov-vf, also on a node whose kernel was not
    // probed (VF settings need no module); host-device stays available by name.
    let support = node_support(&KernelSupport::unprobed());
    let r = super::resolve(&[claim_entry(json!({}))], "nic", &vf(), &support).unwrap();
    assert_eq!(r.mode, ResolvedMode::SriovVf);
    assert!(r.sriov.is_some());
    let r =
        super::resolve(&[claim_entry(json!({"sriov": {"trust": true}}))], "nic", &vf(), &support)
            .unwrap();
    assert!(r.sriov.is_some_and(|s| s.trust));
    let r = super::resolve(&[claim_entry(json!({"mode": "host-device"}))], "nic", &vf(), &support)
        .unwrap();
    assert_eq!((r.mode, r.sriov), (ResolvedMode::HostDevice, None));
}

#[test]
fn a_refused_default_mode_says_it_was_the_default() {
    let support = NodeSupport::everything()
        .refuse_mode(Mode::Macvlan, "no macvlan here")
        .refuse_mode(Mode::Ipvlan, "no ipvlan here");
    let err = refused_on(&support, json!({}), &shared());
    assert_eq!(err.path(), "mode");
    assert!(err.value().contains("the default for this device"), "{err}");
    assert!(err.to_string().contains("no macvlan here"), "{err}");
}
