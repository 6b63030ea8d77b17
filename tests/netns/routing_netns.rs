//! Root tests of source-based routing and interface sysctls on this host's kernel (issue 34):
//! rules and tables in the pod netns and their removal, sysctls through `IFLA_INET_CONF` and
//! through `/proc/sys` on the pod's netns thread, a moved device returning with the host's
//! defaults, a failure at every kernel call leaving nothing behind, and the reply test: a peer
//! in another subnet pings the pod's `net1` address, and the reply leaves through `net1` with
//! source routing and through `eth0` without it. VRF is not here: this host's kernel has no
//! vrf module (tests/vm/vm_routing.rs).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;

use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::model::network_config::{
    Addressing, DeviceKind, MacvlanMode, PolicyRouting, ResolvedInterface, ResolvedMode,
    ResolvedNetworkConfig, Route, RoutingSettings, Sharing, Sysctl, SysctlFamily,
};
use netclaim::podnet::failing::{FailingOps, FailurePlan};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use serde_json::Value;

use crate::kit::netns::{Netns, require_root};

fn path(netns: &Netns) -> PathBuf {
    PathBuf::from(format!("/run/netns/{}", netns.name))
}

fn sysctl(family: SysctlFamily, attribute: &str, value: &str) -> Sysctl {
    Sysctl { family, attribute: attribute.to_owned(), value: value.to_owned() }
}

/// IPv4 through netlink (a zero value among them), IPv6 and neighbour through `/proc`.
fn sysctls() -> Vec<Sysctl> {
    vec![
        sysctl(SysctlFamily::Ipv4Conf, "rp_filter", "2"),
        sysctl(SysctlFamily::Ipv4Conf, "accept_redirects", "0"),
        sysctl(SysctlFamily::Ipv4Conf, "arp_ignore", "1"),
        sysctl(SysctlFamily::Ipv6Conf, "accept_ra", "0"),
        sysctl(SysctlFamily::Ipv4Neigh, "base_reachable_time_ms", "15000"),
    ]
}

fn config(
    mode: ResolvedMode,
    addresses: &[&str],
    routes: Vec<Route>,
    routing: RoutingSettings,
) -> ResolvedNetworkConfig {
    ResolvedNetworkConfig {
        pod_network: None,
        mode,
        interface: ResolvedInterface { name: None, mtu: 1500, hardware_address: None },
        addressing: Addressing::Static(addresses.iter().map(|a| a.parse().unwrap()).collect()),
        routes,
        vlan: None,
        sriov: None,
        stats: false,
        routing,
        bandwidth: None,
        rdma: None,
    }
}

fn policy(table: u32, sysctls: Vec<Sysctl>) -> RoutingSettings {
    RoutingSettings {
        policy: Some(PolicyRouting { table, source_rules: true }),
        vrf: None,
        sysctls,
    }
}

fn device(name: &str, sharing: Sharing, mac: Option<&str>) -> HostDevice {
    HostDevice {
        if_name: name.to_owned(),
        kind: DeviceKind::Virtual,
        sharing,
        mtu: 1500,
        mac: mac.map(|m| m.parse().unwrap()),
    }
}

fn make_plan(cfg: &ResolvedNetworkConfig, device: &HostDevice, pod: &Netns) -> AttachPlan {
    let pod = PodNetns { pod_uid: format!("{}-uid", pod.name), path: path(pod) };
    plan_attach(&AttachRequest {
        claim_uid: "claim-uid-34",
        config: cfg,
        device,
        pod: &pod,
        interface_name: "net1",
        pool_addresses: &[],
    })
    .unwrap()
}

fn route(destination: &str, gateway: Option<&str>, metric: Option<u32>) -> Route {
    Route {
        destination: destination.parse().unwrap(),
        gateway: gateway.map(|g| g.parse().unwrap()),
        metric,
    }
}

fn ip_json(netns: &Netns, args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    serde_json::from_slice(&netns.ip(&full).stdout).unwrap()
}

/// `from <src> lookup <table> pref <n>` of every rule of a family that is not the kernel's.
fn rules(netns: &Netns, family: &str) -> Vec<String> {
    ip_json(netns, &[family, "rule", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| !["local", "main", "default"].contains(&r["table"].as_str().unwrap_or("")))
        .map(|r| {
            format!(
                "from {} lookup {} pref {}",
                r["src"].as_str().unwrap_or("all"),
                r["table"].as_str().unwrap_or("?"),
                r["priority"]
            )
        })
        .collect()
}

/// `dst[ via gw]` of a table's routes.
fn table(netns: &Netns, family: &str, table: &str) -> Vec<String> {
    ip_json(netns, &[family, "route", "show", "table", table])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| match r["gateway"].as_str() {
            Some(gw) => format!("{} via {gw}", r["dst"].as_str().unwrap()),
            None => r["dst"].as_str().unwrap().to_owned(),
        })
        .collect()
}

/// A sysctl read inside `netns` (`/proc/sys` shows the reader's netns).
fn read_sysctl(netns: &Netns, key: &str) -> String {
    let file = format!("/proc/sys/{}", key.replace('.', "/"));
    let out = netns.exec("cat", &[&file]);
    assert!(out.status.success(), "cat {file}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A shared parent (one end of a veth) in a "host" netns, and the pod netns.
fn parent_topology() -> (Netns, Netns, String) {
    let (host, pod) = (Netns::new(), Netns::new());
    let parent = host.ifname("p0");
    host.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &host.ifname("p1")]);
    host.ip(&["link", "set", &parent, "up"]);
    (host, pod, parent)
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn rules_tables_and_sysctls_are_applied_in_the_pod_and_rules_removed_at_detach() {
    if !require_root("rules_tables_and_sysctls_are_applied_in_the_pod_and_rules_removed_at_detach")
    {
        return;
    }
    let (host_ns, pod, parent) = parent_topology();
    let host = HostNetlink::in_netns(&path(&host_ns)).await.unwrap();
    let cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        &["10.77.0.2/24", "fd00:77::2/64"],
        vec![route("10.88.0.0/16", Some("10.77.0.1"), Some(50))],
        policy(1234, sysctls()),
    );
    let plan = make_plan(&cfg, &device(&parent, Sharing::Shared, None), &pod);
    let vlans = VlanUsers::new();
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    let attached = attach(&ops, &vlans, &plan).await.unwrap();
    assert_eq!(attached.routing.table, Some(1234));

    assert_eq!(rules(&pod, "-4"), ["from 10.77.0.2 lookup 1234 pref 30000"]);
    assert_eq!(rules(&pod, "-6"), ["from fd00:77::2 lookup 1234 pref 30000"]);
    assert_eq!(table(&pod, "-4", "1234"), ["10.77.0.0/24", "10.88.0.0/16 via 10.77.0.1"]);
    assert_eq!(table(&pod, "-6", "1234"), ["fd00:77::/64"]);
    // The config's route stays in main too.
    assert_eq!(table(&pod, "-4", "main"), ["10.77.0.0/24", "10.88.0.0/16 via 10.77.0.1"]);
    for (key, value) in [
        ("net.ipv4.conf.net1.rp_filter", "2"),
        ("net.ipv4.conf.net1.accept_redirects", "0"),
        ("net.ipv4.conf.net1.arp_ignore", "1"),
        ("net.ipv6.conf.net1.accept_ra", "0"),
        ("net.ipv4.neigh.net1.base_reachable_time_ms", "15000"),
    ] {
        assert_eq!(read_sysctl(&pod, key), value, "{key}");
    }

    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(rules(&pod, "-4").is_empty() && rules(&pod, "-6").is_empty());
    assert!(table(&pod, "-4", "1234").is_empty());
    drop(host_ns);
}

/// The sysctls of a device that leaves the pod are not restored: the kernel made its IPv4 and
/// IPv6 state afresh from the host netns's defaults when it moved back.
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_device_moved_back_has_the_hosts_defaults_not_the_pods_sysctls() {
    if !require_root("a_device_moved_back_has_the_hosts_defaults_not_the_pods_sysctls") {
        return;
    }
    let (host_ns, pod, parent) = parent_topology();
    let moved = host_ns.ifname("p1");
    let key = |name: &str, attr: &str, v6: bool| {
        format!("net.ipv{}.conf.{name}.{attr}", if v6 { 6 } else { 4 })
    };
    let before: Vec<String> = [("arp_ignore", false), ("arp_announce", false), ("accept_ra", true)]
        .iter()
        .map(|(attr, v6)| read_sysctl(&host_ns, &key(&moved, attr, *v6)))
        .collect();
    let host = HostNetlink::in_netns(&path(&host_ns)).await.unwrap();
    let settings = vec![
        sysctl(SysctlFamily::Ipv4Conf, "arp_ignore", "2"),
        sysctl(SysctlFamily::Ipv4Conf, "arp_announce", "2"),
        sysctl(SysctlFamily::Ipv6Conf, "accept_ra", "2"),
    ];
    for (value, setting) in before.iter().zip(&settings) {
        assert_ne!(value, &setting.value, "the test needs values other than the defaults");
    }
    let cfg = config(
        ResolvedMode::HostDevice,
        &["10.77.0.3/24"],
        Vec::new(),
        RoutingSettings { policy: None, vrf: None, sysctls: settings },
    );
    let mac =
        ip_json(&host_ns, &["link", "show", &moved])[0]["address"].as_str().unwrap().to_owned();
    let plan = make_plan(&cfg, &device(&moved, Sharing::Exclusive, Some(&mac)), &pod);
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    let vlans = VlanUsers::new();
    attach(&ops, &vlans, &plan).await.unwrap();
    assert_eq!(read_sysctl(&pod, "net.ipv4.conf.net1.arp_ignore"), "2");
    assert_eq!(read_sysctl(&pod, "net.ipv6.conf.net1.accept_ra"), "2");
    assert!(detach(&ops, &vlans, &plan).await.is_clean());
    let after: Vec<String> = [("arp_ignore", false), ("arp_announce", false), ("accept_ra", true)]
        .iter()
        .map(|(attr, v6)| read_sysctl(&host_ns, &key(&moved, attr, *v6)))
        .collect();
    assert_eq!(after, before, "back in the host with the host's defaults");
    drop(parent);
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_failure_at_every_kernel_call_leaves_no_link_rule_or_table_route() {
    if !require_root("a_failure_at_every_kernel_call_leaves_no_link_rule_or_table_route") {
        return;
    }
    let (host_ns, pod, parent) = parent_topology();
    let host = HostNetlink::in_netns(&path(&host_ns)).await.unwrap();
    let cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        &["10.77.0.2/24", "fd00:77::2/64"],
        vec![route("10.88.0.0/16", Some("10.77.0.1"), None)],
        policy(0, sysctls()),
    );
    let plan = make_plan(&cfg, &device(&parent, Sharing::Shared, None), &pod);
    let counting = FailurePlan::new(0, 0);
    {
        let ops = FailingOps::new(
            NetlinkOps::open(&host, &plan.pod.path).await.unwrap(),
            counting.clone(),
        );
        attach(&ops, &VlanUsers::new(), &plan).await.unwrap();
        assert!(detach(&ops, &VlanUsers::new(), &plan).await.is_clean());
    }
    // Attach calls only: detach's run after the count.
    let attach_calls = u32::try_from(plan.steps.len()).expect("a plan has few steps");
    assert!(counting.calls() >= attach_calls, "{} calls", counting.calls());
    for n in 1..=attach_calls {
        let ops = FailingOps::new(
            NetlinkOps::open(&host, &plan.pod.path).await.unwrap(),
            FailurePlan::new(n, 1),
        );
        let err = attach(&ops, &VlanUsers::new(), &plan).await.expect_err("injected");
        assert!(err.undo_failures.is_empty(), "call {n}: {err}");
        let links: Vec<String> = ip_json(&pod, &["link", "show"])
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["ifname"].as_str().unwrap().to_owned())
            .filter(|n| n != "lo")
            .collect();
        assert!(links.is_empty(), "call {n}: {links:?}");
        assert!(rules(&pod, "-4").is_empty() && rules(&pod, "-6").is_empty(), "call {n}");
        assert!(table(&pod, "-4", "1000").is_empty(), "call {n}");
    }
}

/// The reply test's world: the pod's primary `eth0` (default route) on a router, `net1` a
/// macvlan on a parent that reaches the same router from another subnet, and a peer behind
/// the router in a third subnet.
struct ReplyWorld {
    router: Netns,
    pod: Netns,
    peer: Netns,
    host: Netns,
    parent: String,
}

fn sh(netns: &Netns, script: &str) {
    let out = netns.exec("sh", &["-c", script]);
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
}

impl ReplyWorld {
    fn new() -> Self {
        let (router, pod, peer, host) = (Netns::new(), Netns::new(), Netns::new(), Netns::new());
        let (r0, r1, r2) = (router.ifname("r0"), router.ifname("r1"), router.ifname("r2"));
        let parent = host.ifname("hp");
        let q0 = peer.ifname("q0");
        // Only IPv4: no router solicitations or MLD reports in the counters.
        for ns in [&router, &pod, &peer, &host] {
            sh(
                ns,
                "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6",
            );
        }
        router
            .ip(&["link", "add", &r0, "type", "veth", "peer", "name", "eth0", "netns", &pod.name]);
        router.ip(&["link", "add", &r2, "type", "veth", "peer", "name", &q0, "netns", &peer.name]);
        host.ip(&[
            "link",
            "add",
            &parent,
            "type",
            "veth",
            "peer",
            "name",
            &r1,
            "netns",
            &router.name,
        ]);
        router.ip(&["addr", "add", "10.100.0.1/24", "dev", &r0]);
        router.ip(&["addr", "add", "10.200.0.1/24", "dev", &r1]);
        router.ip(&["addr", "add", "10.50.0.1/24", "dev", &r2]);
        for dev in [&r0, &r1, &r2] {
            router.ip(&["link", "set", dev, "up"]);
        }
        // A router that forwards whatever path a reply takes back.
        sh(
            &router,
            "echo 1 > /proc/sys/net/ipv4/ip_forward; for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done",
        );
        pod.ip(&["addr", "add", "10.100.0.2/24", "dev", "eth0"]);
        pod.ip(&["link", "set", "eth0", "up"]);
        pod.ip(&["route", "add", "default", "via", "10.100.0.1"]);
        peer.ip(&["addr", "add", "10.50.0.2/24", "dev", &q0]);
        peer.ip(&["link", "set", &q0, "up"]);
        peer.ip(&["route", "add", "default", "via", "10.50.0.1"]);
        host.ip(&["link", "set", &parent, "up"]);
        Self { router, pod, peer, host, parent }
    }

    fn tx_packets(&self, dev: &str) -> u64 {
        ip_json(&self.pod, &["-s", "link", "show", dev])[0]["stats64"]["tx"]["packets"]
            .as_u64()
            .unwrap()
    }
}

/// Attaches `net1` (10.200.0.5/24, a default route via 10.200.0.1 behind `eth0`'s) with or
/// without source routing, pings it from the peer, and returns the `tx_packets` growth of
/// (`net1`, `eth0`) in the pod over the pings.
async fn reply_counters(source_routing: bool) -> (u64, u64) {
    let world = ReplyWorld::new();
    let host = HostNetlink::in_netns(&path(&world.host)).await.unwrap();
    // Loose reverse-path filtering on net1: without source routing, the peer is reachable
    // only through eth0, and a strict filter would drop the ping itself.
    let settings = vec![sysctl(SysctlFamily::Ipv4Conf, "rp_filter", "2")];
    let routing = if source_routing {
        policy(0, settings)
    } else {
        RoutingSettings { policy: None, vrf: None, sysctls: settings }
    };
    let cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        &["10.200.0.5/24"],
        vec![route("0.0.0.0/0", Some("10.200.0.1"), Some(200))],
        routing,
    );
    let plan = make_plan(&cfg, &device(&world.parent, Sharing::Shared, None), &world.pod);
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    attach(&ops, &VlanUsers::new(), &plan).await.unwrap();
    // Resolve the neighbours first, so the counted window holds the echo replies.
    assert!(world.peer.exec("ping", &["-c", "1", "-W", "2", "10.200.0.5"]).status.success());
    let (net1, eth0) = (world.tx_packets("net1"), world.tx_packets("eth0"));
    let pings = world.peer.exec("ping", &["-c", "5", "-i", "0.2", "-W", "2", "10.200.0.5"]);
    assert!(
        pings.status.success(),
        "the peer reaches the pod's net1 address (source routing {source_routing}): {}",
        String::from_utf8_lossy(&pings.stdout)
    );
    let grown = (world.tx_packets("net1") - net1, world.tx_packets("eth0") - eth0);
    drop(world.router);
    grown
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn replies_leave_through_net1_with_source_routing_and_through_eth0_without() {
    if !require_root("replies_leave_through_net1_with_source_routing_and_through_eth0_without") {
        return;
    }
    let (net1, eth0) = reply_counters(true).await;
    eprintln!("with source routing: tx net1 +{net1}, eth0 +{eth0}");
    assert!(net1 >= 5 && eth0 < 5, "with source routing: net1 +{net1}, eth0 +{eth0}");
    let (net1, eth0) = reply_counters(false).await;
    eprintln!("without source routing: tx net1 +{net1}, eth0 +{eth0}");
    assert!(eth0 >= 5 && net1 < 5, "without source routing: net1 +{net1}, eth0 +{eth0}");
}
