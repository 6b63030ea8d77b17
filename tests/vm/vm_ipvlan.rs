//! The ipvlan attach on real kernels (`make vmtest`, decision 0012, issue 14 item 2): `podnet`
//! plans and applies an ipvlan of every mode (l2, l3, l3s) with every flag (bridge, private,
//! vepa) into two throwaway pod netns on one veth parent in a throwaway "node" netns, whose
//! peer sits in a third netns; traffic is checked from outside the code under test with
//! `ip -j` and `ping`, and detach must leave nothing. The CI host has no ipvlan module, so
//! these run only inside the VM, where `vmtests/guest.sh` sets `NETCLAIM_VM=1`; nextest leaves
//! this binary out (`.config/nextest.toml`), and run on a host anyway they fail rather than
//! pass. The macvlan equivalent on the host is `tests/netns/podnet_netns.rs`.
//!
//! Addressing differs by mode because the kernel's does. In l2 the child answers ARP itself
//! (with the parent's MAC), so the pods share the peer's subnet. In l3 and l3s the child is
//! `IFF_NOARP` (`ipvlan_set_port_mode`) and its egress is routed in the parent's netns
//! (`ipvlan_process_outbound`), so the pods get a subnet of their own, the node netns a
//! route to the peer's subnet (its connected one), and the peer a route to the pods' subnet
//! through the parent's address.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;

use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::model::network_config::{
    Addressing, DeviceKind, IpvlanFlag, IpvlanMode, Mode, ResolvedInterface, ResolvedMode,
    ResolvedNetworkConfig, Route, Sharing,
};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use serde_json::Value;

use crate::kit::netns::Netns;

/// Fails the test outside the VM: the host's kernel has no ipvlan.
fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
}

/// The node netns with the veth parent (10.79.0.1/24), its peer netns (10.79.0.2/24, and a
/// route to the l3 pods' 10.80.0.0/24 through the parent).
struct Topology {
    node: Netns,
    peer: Netns,
    parent: String,
}

impl Topology {
    fn new() -> Self {
        let (node, peer) = (Netns::new(), Netns::new());
        let parent = node.ifname("p0");
        let peer_end = node.ifname("p1");
        node.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer_end]);
        node.ip(&["link", "set", &peer_end, "netns", &peer.name]);
        node.ip(&["addr", "add", "10.79.0.1/24", "dev", &parent]);
        node.ip(&["link", "set", &parent, "up"]);
        peer.ip(&["addr", "add", "10.79.0.2/24", "dev", &peer_end]);
        peer.ip(&["link", "set", &peer_end, "up"]);
        peer.ip(&["route", "add", "10.80.0.0/24", "via", "10.79.0.1"]);
        Self { node, peer, parent }
    }
}

fn path(netns: &Netns) -> PathBuf {
    PathBuf::from(format!("/run/netns/{}", netns.name))
}

fn ip_json(netns: &Netns, args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    serde_json::from_slice(&netns.ip(&full).stdout).unwrap()
}

/// Names of the links in `netns` other than `lo`.
fn links(netns: &Netns) -> Vec<String> {
    ip_json(netns, &["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["ifname"].as_str().unwrap().to_owned())
        .filter(|n| n != "lo")
        .collect()
}

/// Whether one `ping` from `netns` reaches `target`.
fn ping(netns: &Netns, target: &str) -> bool {
    netns.exec("ping", &["-c", "1", "-W", "2", target]).status.success()
}

fn mode_name(mode: IpvlanMode) -> &'static str {
    match mode {
        IpvlanMode::L2 => "l2",
        IpvlanMode::L3 => "l3",
        IpvlanMode::L3s => "l3s",
    }
}

fn flag_name(flag: IpvlanFlag) -> &'static str {
    match flag {
        IpvlanFlag::Bridge => "bridge",
        IpvlanFlag::Private => "private",
        IpvlanFlag::Vepa => "vepa",
    }
}

/// The pod's address in `mode`: the peer's subnet for l2, the pods' own for l3 and l3s.
fn pod_address(mode: IpvlanMode, host: u8) -> String {
    match mode {
        IpvlanMode::L2 => format!("10.79.0.{host}/24"),
        IpvlanMode::L3 | IpvlanMode::L3s => format!("10.80.0.{host}/24"),
    }
}

fn plan_for(mode: IpvlanMode, flag: IpvlanFlag, parent: &str, pod: &Netns, host: u8) -> AttachPlan {
    let routes = match mode {
        IpvlanMode::L2 => vec![],
        // An on-link route to the peer's subnet: the child has no ARP; the parent's netns
        // resolves the next hop.
        IpvlanMode::L3 | IpvlanMode::L3s => vec![Route {
            destination: "10.79.0.0/24".parse().unwrap(),
            gateway: None,
            metric: None,
        }],
    };
    let config = ResolvedNetworkConfig {
        pod_network: None,
        mode: ResolvedMode::Ipvlan { mode, flag },
        interface: ResolvedInterface { name: None, mtu: 1400, hardware_address: None },
        addressing: Addressing::Static(vec![pod_address(mode, host).parse().unwrap()]),
        routes,
        vlan: None,
        sriov: None,
        stats: false,
        routing: netclaim::model::network_config::RoutingSettings::default(),
        bandwidth: None,
        rdma: None,
    };
    let device = HostDevice {
        if_name: parent.to_owned(),
        kind: DeviceKind::Virtual,
        sharing: Sharing::Shared,
        mtu: 1500,
        mac: None,
    };
    plan_attach(&AttachRequest {
        claim_uid: &format!("claim-{host}"),
        config: &config,
        device: &device,
        pod: &PodNetns { pod_uid: format!("{}-uid", pod.name), path: path(pod) },
        interface_name: "net1",
        pool_addresses: &[],
    })
    .unwrap()
}

/// Attaches an ipvlan of `mode` with each flag into two pods, checks the links, the traffic
/// the flag allows and forbids, then detaches and checks that nothing is left.
async fn every_flag_of(mode: IpvlanMode) {
    for flag in [IpvlanFlag::Bridge, IpvlanFlag::Private, IpvlanFlag::Vepa] {
        let what = format!("ipvlan {} {}", mode_name(mode), flag_name(flag));
        let topo = Topology::new();
        let (pod_a, pod_b) = (Netns::new(), Netns::new());
        let host = HostNetlink::in_netns(&path(&topo.node)).await.unwrap();
        let vlans = VlanUsers::new();
        let parent_mac = ip_json(&topo.node, &["link", "show", &topo.parent])[0]["address"]
            .as_str()
            .unwrap()
            .to_owned();

        let plan_a = plan_for(mode, flag, &topo.parent, &pod_a, 11);
        let plan_b = plan_for(mode, flag, &topo.parent, &pod_b, 12);
        let ops_a = NetlinkOps::open(&host, &plan_a.pod.path).await.unwrap();
        let ops_b = NetlinkOps::open(&host, &plan_b.pod.path).await.unwrap();
        let attached = attach(&ops_a, &vlans, &plan_a).await.unwrap();
        attach(&ops_b, &vlans, &plan_b).await.unwrap();

        assert_eq!(attached.mode, Mode::Ipvlan, "{what}");
        assert_eq!((attached.name.as_str(), attached.mtu), ("net1", 1400), "{what}");
        assert_eq!(
            attached.mac.map(|mac| mac.to_string()).as_deref(),
            Some(parent_mac.as_str()),
            "{what}: an ipvlan has its parent's MAC"
        );
        for (pod, host_part) in [(&pod_a, 11), (&pod_b, 12)] {
            let link = &ip_json(pod, &["-d", "link", "show", "net1"])[0];
            assert_eq!(link["linkinfo"]["info_kind"], "ipvlan", "{what}: {link}");
            let data = &link["linkinfo"]["info_data"];
            assert_eq!(data["mode"], mode_name(mode), "{what}: {link}");
            // iproute2 prints the flag as a boolean key: `"info_data":{"bridge":true,…}`.
            assert_eq!(data[flag_name(flag)], true, "{what}: {link}");
            assert_eq!(link["mtu"], 1400, "{what}");
            assert!(link["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{what}");
            let addr = &ip_json(pod, &["-4", "addr", "show", "dev", "net1"])[0]["addr_info"][0];
            assert_eq!(
                format!("{}/{}", addr["local"].as_str().unwrap(), addr["prefixlen"]),
                pod_address(mode, host_part),
                "{what}"
            );
        }
        assert_eq!(links(&topo.node), std::slice::from_ref(&topo.parent), "{what}: host netns");

        // Both pods reach the parent's peer; each other only in bridge (private: the kernel
        // drops traffic between children; vepa: it goes out to the wire, and the peer, a
        // plain host rather than a hairpinning switch, does not send it back).
        assert!(ping(&pod_a, "10.79.0.2"), "{what}: pod a to the peer");
        assert!(ping(&pod_b, "10.79.0.2"), "{what}: pod b to the peer");
        let b_ip = pod_address(mode, 12);
        let b_ip = b_ip.split('/').next().unwrap();
        assert_eq!(ping(&pod_a, b_ip), flag == IpvlanFlag::Bridge, "{what}: pod a to pod b");

        // The parent carries one kind of child (DESIGN §2): its rx handler is ipvlan's now.
        let macvlan = topo.node.ifname("mv");
        let refused = std::process::Command::new("ip")
            .args(["-n", &topo.node.name, "link", "add", &macvlan, "link", &topo.parent])
            .args(["type", "macvlan"])
            .output()
            .unwrap();
        assert!(!refused.status.success(), "{what}: a macvlan beside ipvlan children");

        for (ops, plan, pod) in [(&ops_a, &plan_a, &pod_a), (&ops_b, &plan_b, &pod_b)] {
            let report = detach(ops, &vlans, plan).await;
            assert!(report.is_clean(), "{what}: {report:?}");
            assert!(links(pod).is_empty(), "{what}: left in the pod: {:?}", links(pod));
        }
        assert_eq!(links(&topo.node), std::slice::from_ref(&topo.parent), "{what}: host netns");
        // The last child took the ipvlan port with it: the parent takes a macvlan again.
        topo.node.ip(&["link", "add", &macvlan, "link", &topo.parent, "type", "macvlan"]);
        topo.node.ip(&["link", "del", &macvlan]);
        drop(topo.peer);
    }
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn ipvlan_l2_with_each_flag_attaches_carries_traffic_and_detaches() {
    require_vm("ipvlan_l2_with_each_flag_attaches_carries_traffic_and_detaches");
    every_flag_of(IpvlanMode::L2).await;
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn ipvlan_l3_with_each_flag_attaches_carries_traffic_and_detaches() {
    require_vm("ipvlan_l3_with_each_flag_attaches_carries_traffic_and_detaches");
    every_flag_of(IpvlanMode::L3).await;
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn ipvlan_l3s_with_each_flag_attaches_carries_traffic_and_detaches() {
    require_vm("ipvlan_l3s_with_each_flag_attaches_carries_traffic_and_detaches");
    every_flag_of(IpvlanMode::L3s).await;
}
