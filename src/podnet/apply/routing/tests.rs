//! Fake-kernel tests of the routing steps: order (sysctls and VRF before up, rules last),
//! detach (rules and the last user's VRF removed), a failure at every mutating call leaving
//! nothing behind, automatic tables per pod.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeMap;

use crate::model::network_config::{
    Addressing, MacvlanMode, PolicyRouting, ResolvedMode, ResolvedNetworkConfig, RoutingSettings,
    Sharing, Sysctl, SysctlFamily, Vrf,
};
use crate::podnet::apply::{StepError, VlanUsers, attach, detach};
use crate::podnet::failing::{FailingOps, FailurePlan};
use crate::podnet::fake::FakeKernel;
use crate::podnet::plan::tests::{config, device, pod, route};
use crate::podnet::plan::{AttachPlan, AttachRequest, Step, assign_tables, plan_attach};
use crate::podnet::ports::Side;

fn sysctl(family: SysctlFamily, attribute: &str, value: &str) -> Sysctl {
    Sysctl { family, attribute: attribute.to_owned(), value: value.to_owned() }
}

fn four_sysctls() -> Vec<Sysctl> {
    vec![
        sysctl(SysctlFamily::Ipv4Conf, "rp_filter", "2"),
        sysctl(SysctlFamily::Ipv4Conf, "arp_ignore", "1"),
        sysctl(SysctlFamily::Ipv6Conf, "accept_ra", "0"),
        sysctl(SysctlFamily::Ipv4Neigh, "base_reachable_time_ms", "15000"),
    ]
}

fn routed(routing: RoutingSettings) -> ResolvedNetworkConfig {
    let mut cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        Addressing::Static(vec!["10.10.1.5/24".parse().unwrap(), "fd00:10::5/64".parse().unwrap()]),
        vec![route("10.20.0.0/16", Some("10.10.1.1"), None)],
    );
    cfg.routing = routing;
    cfg
}

fn policy(table: u32) -> RoutingSettings {
    RoutingSettings {
        policy: Some(PolicyRouting { table, source_rules: true }),
        vrf: None,
        sysctls: four_sysctls(),
    }
}

fn vrf(name: &str, table: u32) -> RoutingSettings {
    RoutingSettings {
        policy: None,
        vrf: Some(Vrf { name: name.to_owned(), table }),
        sysctls: vec![sysctl(SysctlFamily::Ipv4Netns, "tcp_l3mdev_accept", "1")],
    }
}

fn plan(cfg: &ResolvedNetworkConfig, claim: &str, name: &str) -> AttachPlan {
    let pod = pod();
    plan_attach(&AttachRequest {
        claim_uid: claim,
        config: cfg,
        device: &device("eth1", Sharing::Shared),
        pod: &pod,
        interface_name: name,
        pool_addresses: &[],
    })
    .unwrap()
}

fn kernel() -> FakeKernel {
    let kernel = FakeKernel::new();
    kernel.add_host_link("eth1", 1500, None); // index 10
    kernel
}

#[tokio::test]
async fn policy_routing_sets_sysctls_before_up_fills_its_table_then_adds_rules() {
    let kernel = kernel();
    let vlans = VlanUsers::new();
    let plan = plan(&routed(policy(0)), "uid-1", "net1");
    let attached = attach(&kernel, &vlans, &plan).await.unwrap();
    assert_eq!(
        kernel.log(),
        [
            "create macvlan mode bridge net1 parent=10 mtu=1400 mac=-",
            "set sysctls net.ipv4.conf.net1.rp_filter,net.ipv4.conf.net1.arp_ignore,\
             net.ipv6.conf.net1.accept_ra,net.ipv4.neigh.net1.base_reachable_time_ms on 11",
            "add address 10.10.1.5/24 on 11",
            "add address fd00:10::5/64 on 11 nodad",
            "set 11 up",
            "add route 10.20.0.0/16 via 10.10.1.1 dev 11",
            "add route 10.10.1.0/24 table 1000 dev 11",
            "add route fd00:10::/64 table 1000 dev 11",
            "add route 10.20.0.0/16 via 10.10.1.1 table 1000 dev 11",
            "add rule from 10.10.1.5 lookup 1000 pref 30000",
            "add rule from fd00:10::5 lookup 1000 pref 30000",
        ]
    );
    assert_eq!(attached.routing.table, Some(1000));
    assert_eq!(
        attached.routing.rules,
        ["from 10.10.1.5 lookup 1000 pref 30000", "from fd00:10::5 lookup 1000 pref 30000"]
    );
    assert_eq!(
        attached.routing.sysctls.get("net.ipv6.conf.net1.accept_ra").map(String::as_str),
        Some("0")
    );
    assert_eq!(kernel.sysctls_of("net1").len(), 4);

    let report = detach(&kernel, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(kernel.routing_leftovers().is_empty(), "{:?}", kernel.routing_leftovers());
    assert!(kernel.links(Side::Pod).is_empty());
    assert_eq!(kernel.leftovers(), (0, 0));
}

#[tokio::test]
async fn a_pool_gateway_becomes_the_tables_default_route() {
    let mut cfg = routed(policy(77));
    cfg.addressing = Addressing::Pool(crate::model::network_config::PoolSpec {
        subnet: "10.10.1.0/24".parse().unwrap(),
        range_start: "10.10.1.10".parse().unwrap(),
        range_end: "10.10.1.20".parse().unwrap(),
        gateway: Some("10.10.1.1".parse().unwrap()),
        exclude: Vec::new(),
    });
    cfg.routes.clear();
    let pod = pod();
    let plan = plan_attach(&AttachRequest {
        claim_uid: "uid-1",
        config: &cfg,
        device: &device("eth1", Sharing::Shared),
        pod: &pod,
        interface_name: "net1",
        pool_addresses: &["10.10.1.10/24".parse().unwrap()],
    })
    .unwrap();
    let table: Vec<String> = plan.table_routes().iter().map(ToString::to_string).collect();
    assert_eq!(table, ["10.10.1.0/24 table 77", "0.0.0.0/0 via 10.10.1.1 table 77"]);
}

#[tokio::test]
async fn a_failure_at_every_call_leaves_nothing_behind() {
    for routing in [policy(0), vrf("vrf-red", 100)] {
        let plan = plan(&routed(routing.clone()), "uid-1", "net1");
        let counting = FailurePlan::new(0, 0);
        attach(&FailingOps::new(kernel(), counting.clone()), &VlanUsers::new(), &plan)
            .await
            .unwrap();
        let calls = counting.calls();
        assert!(calls >= 7, "{calls} calls");
        for n in 1..=calls {
            let kernel = std::sync::Arc::new(kernel());
            let ops = FailingOps::new(kernel.clone(), FailurePlan::new(n, 1));
            let err = attach(&ops, &VlanUsers::new(), &plan).await.expect_err("injected");
            assert!(err.undo_failures.is_empty(), "call {n}: {err}");
            assert!(kernel.links(Side::Pod).is_empty(), "call {n}: {:?}", kernel.links(Side::Pod));
            assert!(
                kernel.routing_leftovers().is_empty(),
                "call {n}: {:?}",
                kernel.routing_leftovers()
            );
            assert_eq!(kernel.leftovers(), (0, 0), "call {n}");
        }
    }
}

#[tokio::test]
async fn two_claims_share_a_vrf_that_goes_with_the_last() {
    let kernel = kernel();
    let vlans = VlanUsers::new();
    let first = plan(&routed(vrf("vrf-red", 100)), "uid-1", "net1");
    let mut second_cfg = routed(vrf("vrf-red", 100));
    second_cfg.addressing = Addressing::Static(vec!["10.10.2.5/24".parse().unwrap()]);
    second_cfg.routes = vec![route("10.30.0.0/16", Some("10.10.2.1"), None)];
    let second = plan(&second_cfg, "uid-2", "net2");
    attach(&kernel, &vlans, &first).await.unwrap();
    let attached = attach(&kernel, &vlans, &second).await.unwrap();
    assert_eq!(kernel.master_of("net1").as_deref(), Some("vrf-red"));
    assert_eq!(kernel.master_of("net2").as_deref(), Some("vrf-red"));
    let creates = kernel.log().iter().filter(|l| l.starts_with("create vrf")).count();
    assert_eq!(creates, 1, "{:?}", kernel.log());
    assert!(
        kernel.log().contains(&"add route 10.30.0.0/16 via 10.10.2.1 table 100 dev 13".to_owned()),
        "{:?}",
        kernel.log()
    );
    assert_eq!(attached.routing.vrf, Some(Vrf { name: "vrf-red".into(), table: 100 }));
    assert!(attached.routes.is_empty(), "no route in main for a VRF claim");

    assert!(detach(&kernel, &vlans, &first).await.is_clean());
    assert_eq!(kernel.routing_leftovers().vrfs, ["vrf-red"], "the second still uses it");
    assert!(detach(&kernel, &vlans, &second).await.is_clean());
    assert!(kernel.routing_leftovers().is_empty(), "{:?}", kernel.routing_leftovers());
    assert!(kernel.links(Side::Pod).is_empty());
}

#[tokio::test]
async fn a_link_with_the_vrfs_name_but_another_table_stops_the_attach() {
    let kernel = kernel();
    kernel.add_pod_vrf("vrf-red", 7);
    let plan = plan(&routed(vrf("vrf-red", 100)), "uid-1", "net1");
    let err = attach(&kernel, &VlanUsers::new(), &plan).await.expect_err("table differs");
    assert!(
        matches!(err.cause, StepError::VrfOfAnother { table: 100, found: Some(7), .. }),
        "{err}"
    );
    assert_eq!(kernel.links(Side::Pod), ["vrf-red"], "not ours: kept");
}

#[tokio::test]
async fn a_kernel_without_vrf_fails_at_the_vrf_step_naming_it() {
    let kernel = kernel();
    kernel.without_vrf();
    let plan = plan(&routed(vrf("vrf-red", 100)), "uid-1", "net1");
    let err = attach(&kernel, &VlanUsers::new(), &plan).await.expect_err("no VRF");
    assert!(matches!(err.step, Step::EnsureVrf { .. }), "{err}");
    assert!(err.to_string().contains("vrf-red"), "{err}");
}

#[test]
fn automatic_tables_skip_what_the_pods_interfaces_name() {
    let auto = routed(policy(0));
    let explicit = routed(policy(1001));
    let in_vrf = routed(vrf("vrf-red", 1002));
    let plain =
        config(ResolvedMode::Macvlan { mode: MacvlanMode::Bridge }, Addressing::None, Vec::new());
    let tables = assign_tables(&[&auto, &explicit, &plain, &in_vrf, &auto], &[1000]);
    assert_eq!(tables, [Some(1003), None, None, None, Some(1004)]);
    let plans = [
        plan(&crate::podnet::plan::with_table(&auto, 1003), "a", "net1"),
        plan(&explicit, "b", "net2"),
    ];
    let used: BTreeMap<&str, Vec<u32>> =
        [("a", plans[0].tables()), ("b", plans[1].tables())].into_iter().collect();
    assert_eq!(used["a"], [1003]);
    assert_eq!(used["b"], [1001]);
}
