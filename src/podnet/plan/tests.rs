//! Unit tests of attach planning.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use super::*;
use crate::model::link::MAX_IFNAME_LEN;
use crate::model::network_config::{IpvlanFlag, IpvlanMode, PoolSpec, ResolvedInterface};

pub(crate) fn config(
    mode: ResolvedMode,
    addressing: Addressing,
    routes: Vec<Route>,
) -> ResolvedNetworkConfig {
    ResolvedNetworkConfig {
        pod_network: None,
        mode,
        interface: ResolvedInterface { name: None, mtu: 1400, hardware_address: None },
        addressing,
        routes,
        vlan: None,
        sriov: None,
        stats: true,
        routing: crate::model::network_config::RoutingSettings::default(),
        bandwidth: None,
        rdma: None,
    }
}

pub(crate) fn route(destination: &str, gateway: Option<&str>, metric: Option<u32>) -> Route {
    Route {
        destination: destination.parse().unwrap(),
        gateway: gateway.map(|g| g.parse().unwrap()),
        metric,
    }
}

pub(crate) fn device(name: &str, sharing: Sharing) -> HostDevice {
    HostDevice {
        if_name: name.to_owned(),
        kind: DeviceKind::Virtual,
        sharing,
        mtu: 1500,
        mac: Some("02:00:00:00:00:aa".parse().unwrap()),
    }
}

pub(crate) fn pod() -> PodNetns {
    PodNetns { pod_uid: "pod-1".to_owned(), path: PathBuf::from("/run/netns/pod-1") }
}

fn request<'a>(
    config: &'a ResolvedNetworkConfig,
    device: &'a HostDevice,
    pod: &'a PodNetns,
    pool: &'a [IpNetwork],
) -> AttachRequest<'a> {
    AttachRequest {
        claim_uid: "uid-1",
        config,
        device,
        pod,
        interface_name: "net1",
        pool_addresses: pool,
    }
}

fn lines<T: fmt::Display>(items: &[T]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

fn static_v4_v6() -> Addressing {
    Addressing::Static(vec!["10.10.1.5/24".parse().unwrap(), "fd00:10::5/64".parse().unwrap()])
}

#[test]
fn macvlan_on_a_vlan_is_ensure_create_addresses_up_routes_in_that_order() {
    let mut cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Private },
        static_v4_v6(),
        vec![
            route("10.20.0.0/16", Some("10.10.1.1"), None),
            route("0.0.0.0/0", Some("10.10.1.1"), Some(200)),
        ],
    );
    cfg.vlan = Some(100);
    cfg.interface.hardware_address = Some("02:00:00:00:00:01".parse().unwrap());
    let (dev, pod) = (device("eth1", Sharing::Shared), pod());
    let plan = plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap();
    assert_eq!(
        lines(&plan.steps),
        [
            "ensure VLAN sub-interface eth1.100",
            "create macvlan mode private net1 on eth1.100 (mtu 1400) in the pod",
            "add address 10.10.1.5/24",
            "add address fd00:10::5/64",
            "set link up",
            "add route 10.20.0.0/16 via 10.10.1.1",
            "add route 0.0.0.0/0 via 10.10.1.1 metric 200",
        ]
    );
    assert_eq!(
        plan.steps[1],
        Step::CreateChild {
            kind: ChildKind::Macvlan { mode: MacvlanMode::Private },
            parent: "eth1.100".to_owned(),
            name: "net1".to_owned(),
            mtu: 1400,
            hardware_address: Some("02:00:00:00:00:01".parse().unwrap()),
        }
    );
    assert_eq!(
        plan.steps[2],
        Step::AddAddress { address: "10.10.1.5/24".parse().unwrap(), nodad: false }
    );
    assert_eq!(
        plan.steps[3],
        Step::AddAddress { address: "fd00:10::5/64".parse().unwrap(), nodad: true }
    );
    assert_eq!(
        lines(&plan.teardown()),
        ["delete net1 in the pod", "release VLAN sub-interface eth1.100"]
    );
    assert_eq!(plan.addresses().len(), 2);
    assert_eq!(plan.routes().len(), 2);
}

#[test]
fn macvlan_without_vlan_uses_the_parent_and_every_macvlan_mode() {
    for (mode, name) in [
        (MacvlanMode::Bridge, "bridge"),
        (MacvlanMode::Private, "private"),
        (MacvlanMode::Vepa, "vepa"),
        (MacvlanMode::Passthru, "passthru"),
    ] {
        let cfg = config(ResolvedMode::Macvlan { mode }, Addressing::None, vec![]);
        let (dev, pod) = (device("eth1", Sharing::Slot), pod());
        let plan = plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap();
        assert_eq!(
            lines(&plan.steps),
            [
                format!("create macvlan mode {name} net1 on eth1 (mtu 1400) in the pod"),
                "set link up".to_owned()
            ]
        );
        assert_eq!(lines(&plan.teardown()), ["delete net1 in the pod"]);
    }
}

#[test]
fn ipvlan_is_created_in_the_pod_with_every_mode_and_flag_and_never_a_mac() {
    for (mode, mode_name) in
        [(IpvlanMode::L2, "l2"), (IpvlanMode::L3, "l3"), (IpvlanMode::L3s, "l3s")]
    {
        for (flag, flag_name) in [
            (IpvlanFlag::Bridge, "bridge"),
            (IpvlanFlag::Private, "private"),
            (IpvlanFlag::Vepa, "vepa"),
        ] {
            let cfg = config(
                ResolvedMode::Ipvlan { mode, flag },
                static_v4_v6(),
                vec![route("0.0.0.0/0", Some("10.10.1.1"), None)],
            );
            let (dev, pod) = (device("eth1", Sharing::Shared), pod());
            let plan = plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap();
            assert_eq!(plan.mode, Mode::Ipvlan);
            assert_eq!(
                lines(&plan.steps),
                [
                    format!(
                        "create ipvlan mode {mode_name} {flag_name} net1 on eth1 (mtu 1400) in the pod"
                    ),
                    "add address 10.10.1.5/24".to_owned(),
                    "add address fd00:10::5/64".to_owned(),
                    "set link up".to_owned(),
                    "add route 0.0.0.0/0 via 10.10.1.1".to_owned(),
                ]
            );
            assert_eq!(
                plan.steps[0],
                Step::CreateChild {
                    kind: ChildKind::Ipvlan { mode, flag },
                    parent: "eth1".to_owned(),
                    name: "net1".to_owned(),
                    mtu: 1400,
                    hardware_address: None,
                }
            );
            assert!(plan.creates_child());
            assert_eq!(lines(&plan.teardown()), ["delete net1 in the pod"]);
            let json = serde_json::to_string(&plan).unwrap();
            assert_eq!(serde_json::from_str::<AttachPlan>(&json).unwrap(), plan, "{json}");
        }
    }
}

#[test]
fn ipvlan_on_a_vlan_ensures_the_sub_interface_first() {
    let mut cfg = config(
        ResolvedMode::Ipvlan { mode: IpvlanMode::L3, flag: IpvlanFlag::Private },
        Addressing::None,
        vec![],
    );
    cfg.vlan = Some(42);
    let (dev, pod) = (device("eth1", Sharing::Slot), pod());
    let plan = plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap();
    assert_eq!(
        lines(&plan.steps),
        [
            "ensure VLAN sub-interface eth1.42",
            "create ipvlan mode l3 private net1 on eth1.42 (mtu 1400) in the pod",
            "set link up",
        ]
    );
    assert_eq!(
        lines(&plan.teardown()),
        ["delete net1 in the pod", "release VLAN sub-interface eth1.42"]
    );
}

#[test]
fn every_mode_is_implemented() {
    assert_eq!(not_implemented(Mode::Ipvlan), None);
    assert_eq!(not_implemented(Mode::Macvlan), None);
    assert_eq!(not_implemented(Mode::HostDevice), None);
    assert_eq!(not_implemented(Mode::SriovVf), None);
}

#[test]
fn a_vf_moves_like_a_host_device_and_leaves_its_mac_to_the_vf_settings() {
    let mut vf = device("enp1s0v1", Sharing::Exclusive);
    vf.kind = DeviceKind::SriovVf;
    vf.mac = Some("02:aa:00:00:00:01".parse().unwrap());
    let mut cfg = config(ResolvedMode::SriovVf, Addressing::None, vec![]);
    cfg.interface.hardware_address = Some("02:00:00:00:00:07".parse().unwrap());
    let plan = plan_attach(&request(&cfg, &vf, &pod(), &[])).unwrap();
    assert_eq!(plan.mode, Mode::SriovVf);
    // The MAC was set at prepare (on the netdev, then on the PF); the move leaves it.
    assert!(matches!(
        &plan.steps[0],
        Step::MoveIntoPod { host_name, hardware_address: None, .. } if host_name == "enp1s0v1"
    ));
    // The MAC is a VF setting, set back on the PF at unprepare, not by the detach.
    assert_eq!(plan.host_mac_to_restore, None);
    assert!(
        matches!(&plan.teardown()[..], [UndoStep::MoveToHost { host_name, .. }] if host_name == "enp1s0v1")
    );
}

#[test]
fn host_device_moves_with_alias_and_comes_back_with_its_name_and_mtu() {
    let cfg = config(
        ResolvedMode::HostDevice,
        static_v4_v6(),
        vec![route("10.20.0.0/16", None, Some(5))],
    );
    let (dev, pod) = (device("ens4f1", Sharing::Exclusive), pod());
    let plan = plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap();
    assert_eq!(
        plan.steps[0],
        Step::MoveIntoPod {
            host_name: "ens4f1".to_owned(),
            pod_name: "net1".to_owned(),
            mtu: 1400,
            hardware_address: None,
            alias: "netclaim.dev/device host=ens4f1 claim=uid-1".to_owned(),
        }
    );
    assert_eq!(
        lines(&plan.steps[1..]),
        [
            "add address 10.10.1.5/24",
            "add address fd00:10::5/64",
            "set link up",
            "add route 10.20.0.0/16 metric 5",
        ]
    );
    assert_eq!(
        plan.teardown(),
        [UndoStep::MoveToHost {
            pod_name: "net1".to_owned(),
            host_name: "ens4f1".to_owned(),
            mtu: 1500,
            hardware_address: None,
        }]
    );
}

#[test]
fn a_changed_mac_of_a_host_device_is_restored_on_detach() {
    let mut cfg = config(ResolvedMode::HostDevice, Addressing::None, vec![]);
    cfg.interface.hardware_address = Some("02:00:00:00:00:01".parse().unwrap());
    let (mut dev, pod) = (device("ens4f1", Sharing::Exclusive), pod());
    let plan = plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap();
    assert_eq!(plan.host_mac_to_restore, Some("02:00:00:00:00:aa".parse().unwrap()));
    dev.mac = None;
    assert_eq!(
        plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap_err(),
        PlanError::UnknownOriginalMac { device: "ens4f1".to_owned() }
    );
}

#[test]
fn pool_addressing_takes_exactly_one_leased_address_inside_the_pool() {
    let pool = PoolSpec {
        subnet: "10.10.1.0/24".parse().unwrap(),
        range_start: "10.10.1.10".parse().unwrap(),
        range_end: "10.10.1.200".parse().unwrap(),
        gateway: Some("10.10.1.1".parse().unwrap()),
        exclude: vec![],
    };
    let cfg =
        config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, Addressing::Pool(pool), vec![]);
    let (dev, pod) = (device("eth1", Sharing::Shared), pod());
    let leased: Vec<IpNetwork> = vec!["10.10.1.10/24".parse().unwrap()];
    let plan = plan_attach(&request(&cfg, &dev, &pod, &leased)).unwrap();
    assert_eq!(plan.addresses(), leased);
    assert_eq!(
        plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap_err(),
        PlanError::PoolAddresses { expected: "with one pool address", given: 0 }
    );
    let outside: Vec<IpNetwork> = vec!["10.10.2.10/24".parse().unwrap()];
    assert!(matches!(
        plan_attach(&request(&cfg, &dev, &pod, &outside)).unwrap_err(),
        PlanError::PoolAddressOutsidePool { .. }
    ));
    let static_cfg =
        config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, static_v4_v6(), vec![]);
    assert_eq!(
        plan_attach(&request(&static_cfg, &dev, &pod, &leased)).unwrap_err(),
        PlanError::PoolAddresses { expected: "without a pool", given: 1 }
    );
}

#[test]
fn unsupported_and_mismatched_modes_are_refused_with_the_reason() {
    let (shared, exclusive, pod) =
        (device("eth1", Sharing::Shared), device("eth2", Sharing::Exclusive), pod());
    let ipvlan = config(
        ResolvedMode::Ipvlan { mode: IpvlanMode::L2, flag: IpvlanFlag::Bridge },
        Addressing::None,
        vec![],
    );
    assert!(matches!(
        plan_attach(&request(&ipvlan, &exclusive, &pod, &[])).unwrap_err(),
        PlanError::ModeDoesNotFitDevice { mode: Mode::Ipvlan, sharing: Sharing::Exclusive, .. }
    ));
    let vf = config(ResolvedMode::SriovVf, Addressing::None, vec![]);
    assert!(matches!(
        plan_attach(&request(&vf, &shared, &pod, &[])).unwrap_err(),
        PlanError::ModeDoesNotFitDevice { mode: Mode::SriovVf, .. }
    ));
    let macvlan =
        config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, Addressing::None, vec![]);
    assert!(matches!(
        plan_attach(&request(&macvlan, &exclusive, &pod, &[])).unwrap_err(),
        PlanError::ModeDoesNotFitDevice { mode: Mode::Macvlan, sharing: Sharing::Exclusive, .. }
    ));
    let host = config(ResolvedMode::HostDevice, Addressing::None, vec![]);
    assert!(matches!(
        plan_attach(&request(&host, &shared, &pod, &[])).unwrap_err(),
        PlanError::ModeDoesNotFitDevice { mode: Mode::HostDevice, .. }
    ));
    let mut bond = device("bond0", Sharing::Exclusive);
    bond.kind = DeviceKind::Bond;
    assert!(matches!(
        plan_attach(&request(&host, &bond, &pod, &[])).unwrap_err(),
        PlanError::CannotMove { .. }
    ));
}

#[test]
fn bad_names_are_refused() {
    let (dev, pod) = (device("eth1", Sharing::Shared), pod());
    let cfg = config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, Addressing::None, vec![]);
    for bad in ["", "eth0", "a/b", "averyveryverylongname"] {
        let mut req = request(&cfg, &dev, &pod, &[]);
        req.interface_name = bad;
        assert!(matches!(plan_attach(&req).unwrap_err(), PlanError::InterfaceName { .. }), "{bad}");
    }
}

/// `<parent>.<id>` when it fits in 15 bytes; else `nc` + the first 6 hex digits of the
/// SHA-256 of the parent's name (`printf enp129s0f1np1 | sha256sum` starts with 303449).
#[test]
fn a_vlan_name_too_long_for_ifnamsiz_becomes_nc_hash6_dot_id() {
    assert_eq!(vlan_name("eth1", 100), "eth1.100");
    assert_eq!(vlan_name("enp129s0f1", 4094), "enp129s0f1.4094");
    assert_eq!(vlan_name("enp129s0f1np1", 4094), "nc303449.4094");
    assert_eq!(vlan_name("enp129s0f1np1", 10), "nc303449.10");
    assert_eq!(vlan_name("enp129s0f1np1", 9), "enp129s0f1np1.9");
    assert_ne!(vlan_name("enp129s0f1np0", 10), vlan_name("enp129s0f1np1", 10));
    for parent in ["enp129s0f1np1", "a-fifteen-bytes", "x"] {
        for id in [1, 4094] {
            assert!(vlan_name(parent, id).len() <= MAX_IFNAME_LEN, "{parent} {id}");
        }
    }

    let mut cfg =
        config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, Addressing::None, vec![]);
    cfg.vlan = Some(4094);
    let (long_parent, pod) = (device("enp129s0f1np1", Sharing::Shared), pod());
    let plan = plan_attach(&request(&cfg, &long_parent, &pod, &[])).unwrap();
    let vlan =
        VlanLink { parent: "enp129s0f1np1".to_owned(), id: 4094, name: "nc303449.4094".to_owned() };
    assert_eq!(plan.steps[0], Step::EnsureVlan { vlan: vlan.clone() });
    assert!(
        matches!(&plan.steps[1], Step::CreateChild { parent, .. } if parent == "nc303449.4094")
    );
    assert_eq!(vlan_alias(&vlan), "netclaim.dev/vlan parent=enp129s0f1np1 id=4094");
}

#[test]
fn the_vlan_alias_tells_ours_from_another_parents_and_foreign_links() {
    let long =
        VlanLink { parent: "enp129s0f1np1".to_owned(), id: 10, name: "nc303449.10".to_owned() };
    let plain = VlanLink { parent: "eth1".to_owned(), id: 10, name: "eth1.10".to_owned() };
    assert_eq!(vlan_owner(&long, Some(&vlan_alias(&long))), VlanOwner::Us);
    assert_eq!(vlan_owner(&plain, Some(&vlan_alias(&plain))), VlanOwner::Us);
    // The bare alias of older releases: the plain name says parent and id.
    assert_eq!(vlan_owner(&plain, Some(VLAN_ALIAS)), VlanOwner::Us);
    assert!(matches!(vlan_owner(&long, Some(VLAN_ALIAS)), VlanOwner::UsForAnother { .. }));
    let other = "netclaim.dev/vlan parent=enp129s0f1np0 id=10";
    assert_eq!(vlan_owner(&long, Some(other)), VlanOwner::UsForAnother { alias: other.to_owned() });
    assert_eq!(vlan_owner(&plain, None), VlanOwner::Foreign);
    assert_eq!(vlan_owner(&plain, Some("uplink trunk")), VlanOwner::Foreign);
    assert_eq!(vlan_owner(&plain, Some("netclaim.dev/vlanx")), VlanOwner::Foreign);

    assert_eq!(parse_vlan_alias("nc303449.10", &vlan_alias(&long)), Some(long.clone()));
    assert_eq!(parse_vlan_alias("eth1.10", VLAN_ALIAS), Some(plain.clone()));
    assert_eq!(parse_vlan_alias("eth1.10", &vlan_alias(&plain)), Some(plain));
    // Renamed, or an alias whose parent and id give another name: not ours to collect.
    assert_eq!(parse_vlan_alias("renamed", &vlan_alias(&long)), None);
    assert_eq!(parse_vlan_alias("eth1.11", "netclaim.dev/vlan parent=eth1 id=10"), None);
    assert_eq!(parse_vlan_alias("eth1.10", "netclaim.dev/vlan parent=eth1 id=x"), None);
    assert_eq!(parse_vlan_alias("eth1", VLAN_ALIAS), None);
    assert_eq!(parse_vlan_alias("eth1.10", "admin"), None);
}

#[test]
fn device_alias_round_trips_and_rejects_foreign_aliases() {
    let alias = device_alias("ens4f1", "5f0c-uid");
    assert_eq!(parse_device_alias(&alias), Some(("ens4f1", "5f0c-uid")));
    assert_eq!(parse_device_alias("uplink to switch 3"), None);
    assert_eq!(parse_device_alias(VLAN_ALIAS), None);
    assert_eq!(parse_device_alias("netclaim.dev/device host= claim=x"), None);
}

#[test]
fn a_plan_survives_the_store_round_trip() {
    let mut cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Vepa },
        static_v4_v6(),
        vec![route("0.0.0.0/0", Some("10.10.1.1"), Some(200))],
    );
    cfg.vlan = Some(7);
    let (dev, pod) = (device("eth1", Sharing::Shared), pod());
    let plan = plan_attach(&request(&cfg, &dev, &pod, &[])).unwrap();
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<AttachPlan>(&json).unwrap(), plan);
}

#[test]
fn default_names_follow_the_pod_order_and_skip_explicit_ones() {
    let slot =
        |claim, request, explicit_name| InterfaceSlot { claim_uid: claim, request, explicit_name };
    let names = assign_interface_names(&[
        slot("a", "nic", None),
        slot("b", "nic", Some("net2")),
        slot("c", "nic", None),
        slot("c", "fast", Some("data0")),
        slot("d", "nic", None),
    ])
    .unwrap();
    assert_eq!(names, ["net1", "net2", "net3", "data0", "net4"]);
    assert_eq!(
        assign_interface_names(&[slot("a", "nic", Some("x1")), slot("b", "nic", Some("x1"))])
            .unwrap_err(),
        NameError::Collision {
            name: "x1".to_owned(),
            first: "a/nic".to_owned(),
            second: "b/nic".to_owned()
        }
    );
    assert!(assign_interface_names(&[]).unwrap().is_empty());
}
