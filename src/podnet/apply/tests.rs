//! Unit tests of attach/rollback/detach against the recording fake kernel.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use super::*;
use crate::model::network_config::{
    Addressing, IpvlanFlag, IpvlanMode, MacvlanMode, ResolvedMode, ResolvedNetworkConfig, Sharing,
};
use crate::podnet::fake::FakeKernel;
use crate::podnet::plan::tests::{config, device, pod, route};
use crate::podnet::plan::{AttachRequest, HostDevice, plan_attach};

fn static_addresses() -> Addressing {
    Addressing::Static(vec!["10.10.1.5/24".parse().unwrap(), "fd00:10::5/64".parse().unwrap()])
}

fn macvlan_config(vlan: Option<u16>, routes: Vec<Route>) -> ResolvedNetworkConfig {
    let mut cfg =
        config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, static_addresses(), routes);
    cfg.vlan = vlan;
    cfg
}

fn make_plan(cfg: &ResolvedNetworkConfig, dev: &HostDevice, claim: &str, name: &str) -> AttachPlan {
    let pod = pod();
    plan_attach(&AttachRequest {
        claim_uid: claim,
        config: cfg,
        device: dev,
        pod: &pod,
        interface_name: name,
        pool_addresses: &[],
    })
    .unwrap()
}

fn kernel_with_parent() -> FakeKernel {
    let kernel = FakeKernel::new();
    kernel.add_host_link("eth1", 1500, None); // index 10
    kernel
}

#[tokio::test]
async fn macvlan_on_a_new_vlan_attaches_and_reports_the_interface() {
    let kernel = kernel_with_parent();
    let vlans = VlanUsers::new();
    let cfg = macvlan_config(Some(100), vec![route("0.0.0.0/0", Some("10.10.1.1"), Some(200))]);
    let plan = make_plan(&cfg, &device("eth1", Sharing::Shared), "uid-1", "net1");
    let attached = attach(&kernel, &vlans, &plan).await.unwrap();
    assert_eq!(
        kernel.log(),
        [
            "create vlan eth1.100 parent=10 id=100",
            "create macvlan mode bridge net1 parent=11 mtu=1400 mac=-",
            "add address 10.10.1.5/24 on 12",
            "add address fd00:10::5/64 on 12 nodad",
            "set 12 up",
            "add route 0.0.0.0/0 via 10.10.1.1 metric 200 dev 12",
        ]
    );
    assert_eq!(attached.name, "net1");
    assert_eq!(attached.mtu, 1400);
    assert_eq!(attached.mac, Some("06:00:00:00:00:0c".parse().unwrap()));
    assert_eq!(
        attached.addresses.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.10.1.5/24", "fd00:10::5/64"]
    );
    assert_eq!(attached.routes, plan.routes());
    assert_eq!(
        kernel.get(Side::Host, "eth1.100").unwrap().alias.as_deref(),
        Some("netclaim.dev/vlan parent=eth1 id=100")
    );
    assert_eq!(vlans.users("eth1.100").await, ["uid-1"]);
}

/// An ipvlan is created in the pod under its final name with mode and flag in the one
/// `RTM_NEWLINK`, takes the parent's MAC, gets addresses, up and routes as a macvlan, and
/// goes with its delete at detach.
#[tokio::test]
async fn ipvlan_attaches_with_the_parents_mac_and_detaches_leaving_nothing() {
    let kernel = kernel_with_parent();
    let vlans = VlanUsers::new();
    let cfg = config(
        ResolvedMode::Ipvlan { mode: IpvlanMode::L3s, flag: IpvlanFlag::Vepa },
        static_addresses(),
        vec![route("0.0.0.0/0", None, Some(10))],
    );
    let plan = make_plan(&cfg, &device("eth1", Sharing::Shared), "uid-1", "net1");
    let attached = attach(&kernel, &vlans, &plan).await.unwrap();
    assert_eq!(
        kernel.log(),
        [
            "create ipvlan mode l3s vepa net1 parent=10 mtu=1400 mac=-",
            "add address 10.10.1.5/24 on 11",
            "add address fd00:10::5/64 on 11 nodad",
            "set 11 up",
            "add route 0.0.0.0/0 metric 10 dev 11",
        ]
    );
    assert_eq!(attached.mode, crate::model::network_config::Mode::Ipvlan);
    assert_eq!((attached.name.as_str(), attached.mtu), ("net1", 1400));
    assert_eq!(attached.mac, kernel.get(Side::Host, "eth1").unwrap().mac, "the parent's MAC");
    assert_eq!(kernel.links(Side::Host), ["eth1"], "nothing created in the host netns");

    let report = detach(&kernel, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(kernel.log().last().unwrap(), "delete pod link 11");
    assert!(kernel.links(Side::Pod).is_empty());
    assert_eq!(kernel.leftovers(), (0, 0));
    assert_eq!(kernel.links(Side::Host), ["eth1"]);
}

#[tokio::test]
async fn a_failed_route_undoes_every_completed_step_in_reverse_order() {
    let kernel = kernel_with_parent();
    let vlans = VlanUsers::new();
    // The second route's gateway is on no connected subnet: ENETUNREACH.
    let cfg = macvlan_config(
        Some(100),
        vec![
            route("10.20.0.0/16", Some("10.10.1.1"), None),
            route("10.30.0.0/16", Some("10.99.0.1"), None),
        ],
    );
    let plan = make_plan(&cfg, &device("eth1", Sharing::Shared), "uid-1", "net1");
    let err = attach(&kernel, &vlans, &plan).await.unwrap_err();
    assert_eq!(err.index, 6);
    assert!(matches!(err.cause, StepError::GatewayUnreachable { .. }), "{err}");
    assert_eq!(err.cause.errno(), Some(ENETUNREACH));
    assert!(err.undo_failures.is_empty());
    assert_eq!(
        kernel.log(),
        [
            "create vlan eth1.100 parent=10 id=100",
            "create macvlan mode bridge net1 parent=11 mtu=1400 mac=-",
            "add address 10.10.1.5/24 on 12",
            "add address fd00:10::5/64 on 12 nodad",
            "set 12 up",
            "add route 10.20.0.0/16 via 10.10.1.1 dev 12",
            "add route 10.30.0.0/16 via 10.99.0.1 dev 12 -> errno 101",
            // rollback, newest first
            "delete route 10.20.0.0/16 via 10.10.1.1 dev 12",
            "set 12 down",
            "delete address fd00:10::5/64 on 12",
            "delete address 10.10.1.5/24 on 12",
            "delete pod link 12",
            "delete host link 11",
        ]
    );
    assert_eq!(kernel.links(Side::Host), ["eth1"]);
    assert!(kernel.links(Side::Pod).is_empty());
    assert_eq!(kernel.leftovers(), (0, 0));
    assert!(vlans.users("eth1.100").await.is_empty());
}

#[tokio::test]
async fn a_duplicate_default_route_is_a_named_error() {
    let kernel = kernel_with_parent();
    kernel.add_pod_route(route("0.0.0.0/0", Some("192.168.0.1"), Some(200)));
    let cfg = macvlan_config(None, vec![route("0.0.0.0/0", Some("10.10.1.1"), Some(200))]);
    let plan = make_plan(&cfg, &device("eth1", Sharing::Shared), "uid-1", "net1");
    let err = attach(&kernel, &VlanUsers::new(), &plan).await.unwrap_err();
    assert!(matches!(&err.cause, StepError::DuplicateRoute { metric: Some(200), .. }), "{err}");
    assert_eq!(err.cause.errno(), Some(EEXIST));
    assert!(err.to_string().contains("a second default route needs a distinct metric"), "{err}");
    assert!(kernel.links(Side::Pod).is_empty());
}

#[tokio::test]
async fn a_name_collision_in_the_pod_fails_and_releases_the_new_vlan() {
    let kernel = kernel_with_parent();
    kernel.add_pod_link("net1");
    let vlans = VlanUsers::new();
    let cfg = macvlan_config(Some(5), vec![]);
    let plan = make_plan(&cfg, &device("eth1", Sharing::Shared), "uid-1", "net1");
    let err = attach(&kernel, &vlans, &plan).await.unwrap_err();
    assert_eq!(err.index, 1);
    assert!(matches!(&err.cause, StepError::NameTaken { name, .. } if name == "net1"), "{err}");
    assert_eq!(
        kernel.log(),
        [
            "create vlan eth1.5 parent=10 id=5",
            "create macvlan mode bridge net1 parent=12 mtu=1400 mac=- -> errno 17",
            "delete host link 12",
        ]
    );
    assert_eq!(kernel.links(Side::Host), ["eth1"]);
    assert_eq!(kernel.links(Side::Pod), ["net1"], "the pod's own link is untouched");
}

#[tokio::test]
async fn a_host_device_failure_moves_it_back_with_name_and_mtu() {
    let kernel = FakeKernel::new();
    kernel.add_host_link("ens4", 9000, None); // index 10
    let mut cfg = config(ResolvedMode::HostDevice, static_addresses(), vec![]);
    cfg.interface.mtu = 1500;
    let mut dev = device("ens4", Sharing::Exclusive);
    dev.mtu = 9000;
    let plan = make_plan(&cfg, &dev, "uid-7", "net2");
    kernel.fail_on("set 110 up", 1);
    let err = attach(&kernel, &VlanUsers::new(), &plan).await.unwrap_err();
    assert_eq!(err.index, 3);
    assert_eq!(err.cause.errno(), Some(1));
    assert_eq!(
        kernel.log(),
        [
            "move 10 to pod as net2 mtu=1500 mac=- alias=netclaim.dev/device host=ens4 claim=uid-7",
            "add address 10.10.1.5/24 on 110",
            "add address fd00:10::5/64 on 110 nodad",
            "set 110 up -> errno 1",
            "delete address fd00:10::5/64 on 110",
            "delete address 10.10.1.5/24 on 110",
            "move 110 to host as ens4 mtu=9000 mac=-",
        ]
    );
    let back = kernel.get(Side::Host, "ens4").unwrap();
    assert_eq!((back.mtu, back.alias), (9000, None));
    assert!(kernel.links(Side::Pod).is_empty());
}

#[tokio::test]
async fn a_failing_undo_is_reported_and_the_rollback_goes_on() {
    let kernel = kernel_with_parent();
    let cfg = macvlan_config(None, vec![route("10.30.0.0/16", Some("10.99.0.1"), None)]);
    let plan = make_plan(&cfg, &device("eth1", Sharing::Shared), "uid-1", "net1");
    kernel.fail_on("set 11 down", 16);
    let err = attach(&kernel, &VlanUsers::new(), &plan).await.unwrap_err();
    assert_eq!(err.undo_failures.len(), 1);
    assert_eq!(err.undo_failures[0].step, UndoStep::SetDown);
    assert_eq!(err.undo_failures[0].error.errno(), Some(16));
    assert!(err.to_string().contains("rollback incomplete: set link down"), "{err}");
    assert!(kernel.log().ends_with(&["delete pod link 11".to_owned()]));
    assert!(kernel.links(Side::Pod).is_empty());
}

#[tokio::test]
async fn a_shared_vlan_is_removed_after_its_last_user_only() {
    let kernel = kernel_with_parent();
    let vlans = VlanUsers::new();
    let cfg = macvlan_config(Some(100), vec![]);
    let dev = device("eth1", Sharing::Shared);
    let first = make_plan(&cfg, &dev, "uid-1", "net1");
    let mut second = make_plan(&cfg, &dev, "uid-2", "net1");
    second.pod.pod_uid = "pod-2".to_owned();
    attach(&kernel, &vlans, &first).await.unwrap();
    // The fake has one pod netns: free the name for the second pod's interface.
    let first_report = detach(&kernel, &vlans, &first).await;
    assert!(first_report.is_clean());
    assert!(!kernel.links(Side::Host).contains(&"eth1.100".to_owned()));
    attach(&kernel, &vlans, &first).await.unwrap();
    let mut third = make_plan(&cfg, &dev, "uid-2", "net2");
    third.pod.pod_uid = "pod-2".to_owned();
    attach(&kernel, &vlans, &third).await.unwrap();
    assert_eq!(vlans.users("eth1.100").await, ["uid-1", "uid-2"]);
    let report = detach(&kernel, &vlans, &first).await;
    assert!(
        matches!(report.steps[1], (UndoStep::ReleaseVlan { .. }, UndoOutcome::Kept)),
        "{report:?}"
    );
    assert!(kernel.links(Side::Host).contains(&"eth1.100".to_owned()));
    let report = detach(&kernel, &vlans, &third).await;
    assert!(
        matches!(report.steps[1], (UndoStep::ReleaseVlan { .. }, UndoOutcome::Done)),
        "{report:?}"
    );
    assert_eq!(kernel.links(Side::Host), ["eth1"]);
    assert_eq!(kernel.log().iter().filter(|l| l.starts_with("create vlan")).count(), 2);
}

#[tokio::test]
async fn a_vlan_we_did_not_create_is_used_but_never_deleted() {
    let kernel = kernel_with_parent();
    kernel.add_host_link("eth1.100", 1500, Some("admin made this"));
    let vlans = VlanUsers::new();
    let plan = make_plan(
        &macvlan_config(Some(100), vec![]),
        &device("eth1", Sharing::Shared),
        "uid-1",
        "net1",
    );
    attach(&kernel, &vlans, &plan).await.unwrap();
    assert!(!kernel.log().iter().any(|l| l.starts_with("create vlan")));
    let report = detach(&kernel, &vlans, &plan).await;
    assert!(matches!(report.steps[1].1, UndoOutcome::Kept), "{report:?}");
    assert!(kernel.links(Side::Host).contains(&"eth1.100".to_owned()));
}

/// A parent whose `<parent>.<id>` exceeds 15 bytes gets `nc<hash6>.<id>`, created with the
/// alias naming parent and id, shared and removed after its last user like any other.
#[tokio::test]
async fn a_long_parent_gets_a_hashed_vlan_name_with_an_alias_naming_it() {
    let kernel = FakeKernel::new();
    kernel.add_host_link("enp129s0f1np1", 1500, None); // index 10
    let vlans = VlanUsers::new();
    let cfg = macvlan_config(Some(4094), vec![]);
    let dev = device("enp129s0f1np1", Sharing::Shared);
    let first = make_plan(&cfg, &dev, "uid-1", "net1");
    let second = make_plan(&cfg, &dev, "uid-2", "net2");
    attach(&kernel, &vlans, &first).await.unwrap();
    attach(&kernel, &vlans, &second).await.unwrap();
    assert_eq!(kernel.log()[0], "create vlan nc303449.4094 parent=10 id=4094");
    assert_eq!(kernel.log().iter().filter(|l| l.starts_with("create vlan")).count(), 1);
    assert_eq!(
        kernel.get(Side::Host, "nc303449.4094").unwrap().alias.as_deref(),
        Some("netclaim.dev/vlan parent=enp129s0f1np1 id=4094")
    );
    assert_eq!(vlans.users("nc303449.4094").await, ["uid-1", "uid-2"]);
    assert!(detach(&kernel, &vlans, &first).await.is_clean());
    assert!(kernel.links(Side::Host).contains(&"nc303449.4094".to_owned()));
    assert!(detach(&kernel, &vlans, &second).await.is_clean());
    assert_eq!(kernel.links(Side::Host), ["enp129s0f1np1"]);
}

/// A link with the name and our alias for another parent (two long names hashing alike) is
/// neither used nor deleted: the attach fails naming both.
#[tokio::test]
async fn our_vlan_of_another_parent_under_the_same_name_is_refused_and_kept() {
    let kernel = FakeKernel::new();
    kernel.add_host_link("enp129s0f1np1", 1500, None);
    kernel.add_host_link(
        "nc303449.50",
        1500,
        Some("netclaim.dev/vlan parent=other0123456789 id=50"),
    );
    let vlans = VlanUsers::new();
    let plan = make_plan(
        &macvlan_config(Some(50), vec![]),
        &device("enp129s0f1np1", Sharing::Shared),
        "uid-1",
        "net1",
    );
    let err = attach(&kernel, &vlans, &plan).await.unwrap_err();
    assert!(matches!(err.cause, StepError::VlanOfAnother { id: 50, .. }), "{err}");
    assert!(err.to_string().contains("parent=other0123456789"), "{err}");
    assert!(kernel.log().is_empty(), "{:?}", kernel.log());
    assert!(vlans.users("nc303449.50").await.is_empty());
    assert!(kernel.links(Side::Host).contains(&"nc303449.50".to_owned()));
}

/// Users counted here but the link gone (deleted by hand, or missing when reconcile adopted
/// the users): the next user creates it again, and the last one deletes it.
#[tokio::test]
async fn a_vlan_deleted_under_its_users_is_created_again_by_the_next_one() {
    let kernel = kernel_with_parent();
    let vlans = VlanUsers::new();
    let cfg = macvlan_config(Some(100), vec![]);
    let dev = device("eth1", Sharing::Shared);
    let vlan = VlanLink { parent: "eth1".to_owned(), id: 100, name: "eth1.100".to_owned() };
    vlans.adopt(&vlan, "uid-1", false).await;
    let second = make_plan(&cfg, &dev, "uid-2", "net2");
    attach(&kernel, &vlans, &second).await.unwrap();
    assert_eq!(kernel.log()[0], "create vlan eth1.100 parent=10 id=100");
    assert_eq!(vlans.users("eth1.100").await, ["uid-1", "uid-2"]);
    let first = make_plan(&cfg, &dev, "uid-1", "net1");
    let report = detach(&kernel, &vlans, &first).await;
    assert!(matches!(report.steps.last().unwrap().1, UndoOutcome::Kept), "{report:?}");
    assert!(detach(&kernel, &vlans, &second).await.is_clean());
    assert_eq!(kernel.links(Side::Host), ["eth1"]);
}

/// At start, our sub-interfaces without a user are deleted; used ones, foreign ones and ones
/// whose name does not match their alias stay.
#[tokio::test]
async fn remove_unused_deletes_only_our_vlans_without_users() {
    let kernel = kernel_with_parent();
    kernel.add_host_link("eth1.7", 1500, Some("netclaim.dev/vlan parent=eth1 id=7"));
    kernel.add_host_link("eth1.8", 1500, Some("netclaim.dev/vlan"));
    kernel.add_host_link("eth1.9", 1500, Some("netclaim.dev/vlan parent=eth1 id=9"));
    kernel.add_host_link("eth1.10", 1500, None);
    kernel.add_host_link("renamed", 1500, Some("netclaim.dev/vlan parent=eth1 id=11"));
    let vlans = VlanUsers::new();
    let used = VlanLink { parent: "eth1".to_owned(), id: 9, name: "eth1.9".to_owned() };
    vlans.adopt(&used, "uid-1", true).await;
    let links: Vec<LinkState> =
        kernel.links(Side::Host).iter().filter_map(|n| kernel.get(Side::Host, n)).collect();
    let removed = vlans.remove_unused(&kernel, &links).await;
    let names: Vec<&str> = removed.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["eth1.7", "eth1.8"]);
    assert!(removed.iter().all(|(_, r)| matches!(r, Ok(UndoOutcome::Done))));
    assert_eq!(kernel.links(Side::Host), ["eth1", "eth1.10", "eth1.9", "renamed"]);
}

#[tokio::test]
async fn detach_after_the_pod_netns_is_gone_succeeds() {
    let kernel = kernel_with_parent();
    let vlans = VlanUsers::new();
    let plan = make_plan(
        &macvlan_config(Some(9), vec![]),
        &device("eth1", Sharing::Shared),
        "uid-1",
        "net1",
    );
    attach(&kernel, &vlans, &plan).await.unwrap();
    kernel.destroy_pod_netns();
    let report = detach(&kernel, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(matches!(report.steps[0].1, UndoOutcome::AlreadyGone));
    assert!(matches!(report.steps[1].1, UndoOutcome::Done));
    assert_eq!(kernel.links(Side::Host), ["eth1"]);
}

#[tokio::test]
async fn a_nic_returned_by_a_destroyed_netns_gets_its_name_back() {
    let kernel = FakeKernel::new();
    kernel.add_host_link("ens4", 9000, None);
    let mut dev = device("ens4", Sharing::Exclusive);
    dev.mtu = 9000;
    let plan = make_plan(
        &config(ResolvedMode::HostDevice, Addressing::None, vec![]),
        &dev,
        "uid-3",
        "net1",
    );
    attach(&kernel, &VlanUsers::new(), &plan).await.unwrap();
    // The kernel returns a physical NIC to the host under its pod-side name, alias kept.
    kernel.destroy_pod_netns();
    kernel.add_host_link("net1", 1400, Some("netclaim.dev/device host=ens4 claim=uid-3"));
    let report = detach(&kernel, &VlanUsers::new(), &plan).await;
    assert!(matches!(report.steps[0].1, UndoOutcome::Done), "{report:?}");
    assert!(kernel.log().last().unwrap().starts_with("restore 11 in host as ens4 mtu=9000"));
    let back = kernel.get(Side::Host, "ens4").unwrap();
    assert_eq!((back.mtu, back.alias), (9000, None));

    // A host link of that name that is not ours is left alone.
    kernel.add_host_link("net1", 1400, Some("someone else"));
    let report = detach(&kernel, &VlanUsers::new(), &plan).await;
    assert!(matches!(report.steps[0].1, UndoOutcome::AlreadyGone), "{report:?}");
    assert!(kernel.links(Side::Host).contains(&"net1".to_owned()));
}

#[tokio::test]
async fn a_host_device_whose_pod_name_is_taken_comes_back_from_the_half_done_move() {
    let kernel = FakeKernel::new();
    kernel.add_host_link("ens4", 9000, None); // index 10
    kernel.add_pod_link("net2");
    let mut dev = device("ens4", Sharing::Exclusive);
    dev.mtu = 9000;
    let plan = make_plan(
        &config(ResolvedMode::HostDevice, Addressing::None, vec![]),
        &dev,
        "uid-7",
        "net2",
    );
    let err = attach(&kernel, &VlanUsers::new(), &plan).await.unwrap_err();
    assert!(matches!(&err.cause, StepError::NameTaken { name, .. } if name == "net2"), "{err}");
    assert!(err.undo_failures.is_empty());
    assert_eq!(
        kernel.log(),
        [
            "move 10 to pod as net2 mtu=1400 mac=- alias=netclaim.dev/device host=ens4 claim=uid-7 -> errno 17",
            "move 110 to host as ens4 mtu=9000 mac=-",
        ]
    );
    assert_eq!(kernel.get(Side::Host, "ens4").unwrap().mtu, 9000);
    assert_eq!(kernel.links(Side::Pod), ["net2"]);
}

/// What a host device and its parent look like before any attach: compared after each
/// injected failure.
fn host_view(kernel: &FakeKernel) -> Vec<(String, u32, Option<String>)> {
    kernel
        .links(Side::Host)
        .into_iter()
        .map(|name| {
            let link = kernel.get(Side::Host, &name).unwrap();
            (name, link.mtu, link.alias)
        })
        .collect()
}

#[tokio::test]
async fn a_failure_injected_at_every_step_leaves_the_kernel_as_it_was() {
    use crate::podnet::failing::{FailingOps, FailurePlan};
    let vlan_plan = make_plan(
        &macvlan_config(Some(100), vec![route("10.20.0.0/16", Some("10.10.1.1"), None)]),
        &device("eth1", Sharing::Shared),
        "uid-1",
        "net1",
    );
    let mut nic = device("ens4", Sharing::Exclusive);
    nic.mtu = 9000;
    let mut nic_cfg = config(
        ResolvedMode::HostDevice,
        static_addresses(),
        vec![route("10.20.0.0/16", Some("10.10.1.1"), None)],
    );
    nic_cfg.interface.mtu = 1500;
    let nic_plan = make_plan(&nic_cfg, &nic, "uid-2", "net2");
    let mut ipvlan_cfg = config(
        ResolvedMode::Ipvlan { mode: IpvlanMode::L2, flag: IpvlanFlag::Private },
        static_addresses(),
        vec![route("10.20.0.0/16", Some("10.10.1.1"), None)],
    );
    ipvlan_cfg.vlan = Some(100);
    let ipvlan_plan = make_plan(&ipvlan_cfg, &device("eth1", Sharing::Shared), "uid-3", "net3");
    for (what, plan) in [
        ("macvlan on a new VLAN", &vlan_plan),
        ("host device", &nic_plan),
        ("ipvlan on a new VLAN", &ipvlan_plan),
    ] {
        let fresh = || {
            let kernel = FakeKernel::new();
            kernel.add_host_link("eth1", 1500, None);
            kernel.add_host_link("ens4", 9000, None);
            std::sync::Arc::new(kernel)
        };
        // A clean run counts the mutating calls.
        let counting = FailurePlan::new(0, 0);
        let ops = FailingOps::new(fresh(), std::sync::Arc::clone(&counting));
        attach(&ops, &VlanUsers::new(), plan).await.unwrap();
        let steps = counting.calls();
        assert!(steps >= 5, "{what}: {steps} calls");
        for fail_at in 1..=steps {
            let kernel = fresh();
            let before = host_view(&kernel);
            let vlans = VlanUsers::new();
            let failing = FailingOps::new(
                std::sync::Arc::clone(&kernel),
                FailurePlan::new(fail_at, nix::libc::EBUSY),
            );
            let err = attach(&failing, &vlans, plan).await.unwrap_err();
            let context = format!("{what}, call {fail_at} of {steps} failed: {err}");
            assert_eq!(err.cause.errno(), Some(nix::libc::EBUSY), "{context}");
            assert!(err.undo_failures.is_empty(), "{context}");
            assert!(kernel.links(Side::Pod).is_empty(), "{context}: pod links left");
            assert_eq!(kernel.leftovers(), (0, 0), "{context}: addresses or routes left");
            assert_eq!(host_view(&kernel), before, "{context}: host links changed");
            assert!(vlans.users("eth1.100").await.is_empty(), "{context}");
        }
    }
}
