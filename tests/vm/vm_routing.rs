//! VRF on a real vrf kernel (`make vmtest`, issue 34): the start-up probe finds it, and two
//! claims of one pod enslave their macvlans to one VRF that the first creates with its table
//! and the last detach deletes; the routes go into the VRF's table, the netns-wide
//! `tcp_l3mdev_accept` is set, and a ping bound to the VRF reaches the peer. The CI host has
//! no vrf module (tests/netns/routing_netns.rs covers rules, tables and sysctls there); run on
//! a host these fail rather than pass.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;

use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::model::network_config::{
    Addressing, DeviceKind, MacvlanMode, ResolvedInterface, ResolvedMode, ResolvedNetworkConfig,
    Route, RoutingSettings, Sharing, Sysctl, SysctlFamily, Vrf,
};
use netclaim::model::support::Probe;
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use serde_json::Value;

use crate::kit::netns::Netns;

fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
}

fn path(netns: &Netns) -> PathBuf {
    PathBuf::from(format!("/run/netns/{}", netns.name))
}

fn ip_json(netns: &Netns, args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    serde_json::from_slice(&netns.ip(&full).stdout).unwrap()
}

fn plan(
    parent: &str,
    pod: &Netns,
    claim: &str,
    name: &str,
    address: &str,
    routes: Vec<Route>,
) -> AttachPlan {
    let config = ResolvedNetworkConfig {
        pod_network: None,
        mode: ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        interface: ResolvedInterface { name: None, mtu: 1500, hardware_address: None },
        addressing: Addressing::Static(vec![address.parse().unwrap()]),
        routes,
        vlan: None,
        sriov: None,
        stats: false,
        routing: RoutingSettings {
            policy: None,
            vrf: Some(Vrf { name: "vrf-red".to_owned(), table: 100 }),
            sysctls: vec![Sysctl {
                family: SysctlFamily::Ipv4Netns,
                attribute: "tcp_l3mdev_accept".to_owned(),
                value: "1".to_owned(),
            }],
        },
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
    let pod = PodNetns { pod_uid: format!("{}-uid", pod.name), path: path(pod) };
    plan_attach(&AttachRequest {
        claim_uid: claim,
        config: &config,
        device: &device,
        pod: &pod,
        interface_name: name,
        pool_addresses: &[],
    })
    .unwrap()
}

#[test]
#[ignore = "needs the VM: make vmtest"]
fn the_kernel_probe_finds_vrf() {
    require_vm("the_kernel_probe_finds_vrf");
    let support = netclaim::host::kernel_probe::probe();
    assert_eq!(support.vrf, Probe::Available, "{support:?}");
}

#[tokio::test]
#[ignore = "needs the VM: make vmtest"]
async fn two_claims_share_a_vrf_with_its_table_and_the_last_detach_deletes_it() {
    require_vm("two_claims_share_a_vrf_with_its_table_and_the_last_detach_deletes_it");
    let (node, peer, pod) = (Netns::new(), Netns::new(), Netns::new());
    let parent = node.ifname("p0");
    let peer_end = node.ifname("q");
    node.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer_end]);
    node.ip(&["link", "set", &peer_end, "netns", &peer.name]);
    node.ip(&["link", "set", &parent, "up"]);
    peer.ip(&["addr", "add", "10.77.0.1/24", "dev", &peer_end]);
    peer.ip(&["addr", "add", "10.88.0.1/16", "dev", "lo"]);
    peer.ip(&["link", "set", &peer_end, "up"]);

    let host = HostNetlink::in_netns(&path(&node)).await.unwrap();
    let first = plan(
        &parent,
        &pod,
        "claim-1",
        "net1",
        "10.77.0.2/24",
        vec![Route {
            destination: "10.88.0.0/16".parse().unwrap(),
            gateway: Some("10.77.0.1".parse().unwrap()),
            metric: None,
        }],
    );
    let second = plan(&parent, &pod, "claim-2", "net2", "10.77.0.3/24", Vec::new());
    let ops = NetlinkOps::open(&host, &first.pod.path).await.unwrap();
    let vlans = VlanUsers::new();
    let attached = attach(&ops, &vlans, &first).await.unwrap();
    attach(&ops, &vlans, &second).await.unwrap();
    assert_eq!(attached.routing.vrf, Some(Vrf { name: "vrf-red".into(), table: 100 }));

    let vrf = &ip_json(&pod, &["-d", "link", "show", "vrf-red"])[0];
    assert_eq!(vrf["linkinfo"]["info_kind"], "vrf", "{vrf}");
    assert_eq!(vrf["linkinfo"]["info_data"]["table"], 100, "{vrf}");
    for name in ["net1", "net2"] {
        assert_eq!(ip_json(&pod, &["link", "show", name])[0]["master"], "vrf-red", "{name}");
    }
    let table: Vec<String> = ip_json(&pod, &["-4", "route", "show", "table", "100"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["type"].is_null() || r["type"] == "unicast")
        .map(|r| r["dst"].as_str().unwrap().to_owned())
        .collect();
    assert!(table.contains(&"10.88.0.0/16".to_owned()), "{table:?}");
    assert!(table.contains(&"10.77.0.0/24".to_owned()), "{table:?}");
    let main = ip_json(&pod, &["-4", "route", "show", "table", "main"]);
    assert!(main.as_array().unwrap().is_empty(), "nothing of the VRF in main: {main}");
    let accept = pod.exec("cat", &["/proc/sys/net/ipv4/tcp_l3mdev_accept"]);
    assert_eq!(String::from_utf8_lossy(&accept.stdout).trim(), "1");
    let ping = pod.exec("ping", &["-c", "1", "-W", "2", "-I", "vrf-red", "10.88.0.1"]);
    assert!(
        ping.status.success(),
        "ping through the VRF: {}",
        String::from_utf8_lossy(&ping.stdout)
    );

    assert!(detach(&ops, &vlans, &first).await.is_clean());
    assert_eq!(
        ip_json(&pod, &["link", "show", "vrf-red"]).as_array().unwrap().len(),
        1,
        "kept for net2"
    );
    assert!(detach(&ops, &vlans, &second).await.is_clean());
    let links: Vec<String> = ip_json(&pod, &["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["ifname"].as_str().unwrap().to_owned())
        .filter(|n| n != "lo")
        .collect();
    assert!(links.is_empty(), "the last detach deletes the VRF: {links:?}");
}
