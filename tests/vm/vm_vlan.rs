//! VLAN sub-interfaces on a real 8021q kernel (`make vmtest`, decision 0012, issue 14 item 3):
//! `podnet` plans and applies macvlans with `vlan` set on a veth parent in a throwaway "node"
//! netns, whose peer netns carries the matching VLAN link; the sub-interface is checked from
//! outside the code under test with `ip -d -j` and traffic with `ping`. The CI host has no
//! 8021q module, so these run only inside the VM, where `vmtests/guest.sh` sets
//! `NETCLAIM_VM=1`; nextest leaves this binary out (`.config/nextest.toml`), and run on a
//! host anyway they fail rather than pass.
//!
//! The daemon restart is simulated as the daemon does it at start (`attach::reconcile`): the
//! plans come back from their stored JSON, a new [`VlanUsers`] adopts their users with the
//! ownership read from the kernel's aliases, and our sub-interfaces without a user are removed.
//! The `AttachService` path of the same restart is a unit test on the fake kernel
//! (`attach::tests::vlan_users_survive_a_restart_and_the_last_release_removes_it`).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;

use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::model::network_config::{
    Addressing, DeviceKind, MacvlanMode, ResolvedInterface, ResolvedMode, ResolvedNetworkConfig,
    Sharing,
};
use netclaim::podnet::plan::{Step, VlanOwner, vlan_owner};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::kit::netns::Netns;

/// Fails the test outside the VM: the host's kernel has no 8021q.
fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
}

/// The node netns with the veth parent `parent` (no address: only VLAN traffic is carried)
/// and the peer netns with the other end.
struct Topology {
    node: Netns,
    peer: Netns,
    parent: String,
    peer_end: String,
}

impl Topology {
    /// `parent_suffix` makes the parent's name (after the netns's 8-byte prefix).
    fn new(parent_suffix: &str) -> Self {
        let (node, peer) = (Netns::new(), Netns::new());
        let parent = node.ifname(parent_suffix);
        let peer_end = node.ifname("q");
        node.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer_end]);
        node.ip(&["link", "set", &peer_end, "netns", &peer.name]);
        node.ip(&["link", "set", &parent, "up"]);
        peer.ip(&["link", "set", &peer_end, "up"]);
        Self { node, peer, parent, peer_end }
    }

    /// VLAN `id` on the peer's end with address `10.81.<id % 256>.2/24`, the far side of
    /// every pod on that VLAN.
    fn peer_vlan(&self, id: u16) {
        let name = format!("pv{id}");
        let id_text = id.to_string();
        self.peer.ip(&[
            "link",
            "add",
            "link",
            &self.peer_end,
            "name",
            &name,
            "type",
            "vlan",
            "id",
            &id_text,
        ]);
        self.peer.ip(&["addr", "add", &format!("10.81.{}.2/24", id % 256), "dev", &name]);
        self.peer.ip(&["link", "set", &name, "up"]);
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

/// Names of the links in `netns` other than `lo`, sorted.
fn links(netns: &Netns) -> Vec<String> {
    let mut names: Vec<String> = ip_json(netns, &["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["ifname"].as_str().unwrap().to_owned())
        .filter(|n| n != "lo")
        .collect();
    names.sort();
    names
}

/// `ip -d -j link show dev <name>` in `netns`.
fn link_details(netns: &Netns, name: &str) -> Value {
    ip_json(netns, &["-d", "link", "show", "dev", name])[0].clone()
}

/// Whether one `ping` from `netns` reaches `target`.
fn ping(netns: &Netns, target: &str) -> bool {
    netns.exec("ping", &["-c", "1", "-W", "2", target]).status.success()
}

/// A macvlan (bridge) on VLAN `vlan` of `parent` for claim `claim`, named `name` in `pod`,
/// with address `10.81.<vlan % 256>.<host>/24`.
fn plan_for(parent: &str, vlan: u16, claim: &str, pod: &Netns, name: &str, host: u8) -> AttachPlan {
    let config = ResolvedNetworkConfig {
        pod_network: None,
        mode: ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        interface: ResolvedInterface { name: None, mtu: 1500, hardware_address: None },
        addressing: Addressing::Static(vec![
            format!("10.81.{}.{host}/24", vlan % 256).parse().unwrap(),
        ]),
        routes: vec![],
        vlan: Some(vlan),
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
        claim_uid: claim,
        config: &config,
        device: &device,
        pod: &PodNetns { pod_uid: format!("{}-uid", pod.name), path: path(pod) },
        interface_name: name,
        pool_addresses: &[],
    })
    .unwrap()
}

/// The VLAN sub-interface name in `plan`.
fn vlan_in(plan: &AttachPlan) -> String {
    match &plan.steps[0] {
        Step::EnsureVlan { vlan } => vlan.name.clone(),
        other => panic!("the plan starts with {other}, not the VLAN"),
    }
}

/// Checks that `name` in the node netns is an 802.1Q sub-interface `id` of `parent`, up,
/// with alias `alias` (`None`: no alias).
fn assert_vlan(topo: &Topology, name: &str, id: u16, alias: Option<&str>) {
    let link = link_details(&topo.node, name);
    assert_eq!(link["linkinfo"]["info_kind"], "vlan", "{link}");
    assert_eq!(link["linkinfo"]["info_data"]["protocol"], "802.1Q", "{link}");
    assert_eq!(link["linkinfo"]["info_data"]["id"], id, "{link}");
    assert_eq!(link["link"], topo.parent.as_str(), "the parent: {link}");
    assert!(link["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "up: {link}");
    assert_eq!(link["ifalias"].as_str(), alias, "{link}");
}

/// The daemon's start after a restart: the stored plans (their JSON) adopted by a new
/// `VlanUsers` with the ownership the kernel's aliases say, then our unused sub-interfaces
/// removed (`AttachService::start`).
async fn restart(host: &HostNetlink, stored: &[String]) -> (VlanUsers, Vec<AttachPlan>) {
    let plans: Vec<AttachPlan> = stored.iter().map(|j| serde_json::from_str(j).unwrap()).collect();
    let links = host.links().await.unwrap();
    let vlans = VlanUsers::new();
    for plan in &plans {
        for step in &plan.steps {
            if let Step::EnsureVlan { vlan } = step {
                let owned = links.iter().any(|l| {
                    l.name == vlan.name && vlan_owner(vlan, l.alias.as_deref()) == VlanOwner::Us
                });
                vlans.adopt(vlan, &plan.claim_uid, owned).await;
            }
        }
    }
    for (name, outcome) in vlans.remove_unused(&NetlinkOps::host_only(host), &links).await {
        println!("restart removed {name}: {outcome:?}");
        outcome.unwrap();
    }
    (vlans, plans)
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn a_vlan_is_made_on_first_use_shared_kept_across_a_restart_and_removed_after_the_last_user()
{
    require_vm(
        "a_vlan_is_made_on_first_use_shared_kept_across_a_restart_and_removed_after_the_last_user",
    );
    let topo = Topology::new("p");
    topo.peer_vlan(100);
    let (pod_a, pod_b) = (Netns::new(), Netns::new());
    let host = HostNetlink::in_netns(&path(&topo.node)).await.unwrap();
    let vlans = VlanUsers::new();
    let plan_a = plan_for(&topo.parent, 100, "claim-a", &pod_a, "net1", 11);
    let plan_b = plan_for(&topo.parent, 100, "claim-b", &pod_b, "net1", 12);
    let name = vlan_in(&plan_a);
    assert_eq!(name, format!("{}.100", topo.parent));
    let alias = format!("netclaim.dev/vlan parent={} id=100", topo.parent);

    let ops_a = NetlinkOps::open(&host, &plan_a.pod.path).await.unwrap();
    attach(&ops_a, &vlans, &plan_a).await.unwrap();
    assert_vlan(&topo, &name, 100, Some(&alias));
    let index = link_details(&topo.node, &name)["ifindex"].clone();
    let ops_b = NetlinkOps::open(&host, &plan_b.pod.path).await.unwrap();
    attach(&ops_b, &vlans, &plan_b).await.unwrap();
    assert_eq!(link_details(&topo.node, &name)["ifindex"], index, "the second claim shares it");
    assert_eq!(links(&topo.node), [topo.parent.clone(), name.clone()]);
    let child = link_details(&pod_a, "net1");
    assert_eq!(child["linkinfo"]["info_kind"], "macvlan", "{child}");
    assert!(ping(&pod_a, "10.81.100.2"), "pod a to the peer across VLAN 100");
    assert!(ping(&pod_b, "10.81.100.2"), "pod b to the peer across VLAN 100");
    assert!(ping(&pod_a, "10.81.100.12"), "pod a to pod b (macvlan bridge on the VLAN)");
    // Tagged on the wire: the peer's untagged end has no address and sees none of it, its
    // VLAN link does (the kernel counts what the 8021q rx path delivered to it).
    let rx =
        ip_json(&topo.peer, &["-s", "link", "show", "dev", "pv100"])[0]["stats64"]["rx"]["packets"]
            .as_u64()
            .unwrap();
    assert!(rx >= 2, "the peer's VLAN 100 link received the pings: {rx}");

    // Before the restart: a sub-interface of ours that no stored pod uses (a crash between a
    // pod's last detach and the deletion) and an administrator's, without our alias.
    let orphan = format!("{}.7", topo.parent);
    let admins = format!("{}.200", topo.parent);
    for (link, id) in [(&orphan, "7"), (&admins, "200")] {
        topo.node.ip(&[
            "link",
            "add",
            "link",
            &topo.parent,
            "name",
            link,
            "type",
            "vlan",
            "id",
            id,
        ]);
        topo.node.ip(&["link", "set", link, "up"]);
    }
    topo.node.ip(&[
        "link",
        "set",
        "dev",
        &orphan,
        "alias",
        &format!("netclaim.dev/vlan parent={} id=7", topo.parent),
    ]);
    let stored = [serde_json::to_string(&plan_a).unwrap(), serde_json::to_string(&plan_b).unwrap()];
    drop(vlans);
    let (vlans, plans) = restart(&host, &stored).await;
    assert_eq!(vlans.users(&name).await, ["claim-a", "claim-b"]);
    assert_eq!(links(&topo.node), [topo.parent.clone(), name.clone(), admins.clone()]);

    // The first release keeps it for the other pod, whose traffic still flows.
    let report = detach(&ops_a, &vlans, &plans[0]).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(links(&pod_a).is_empty());
    assert_eq!(link_details(&topo.node, &name)["ifindex"], index, "kept for claim b");
    assert!(ping(&pod_b, "10.81.100.2"), "pod b still reaches the peer");
    // The last one removes it; the administrator's stays.
    let report = detach(&ops_b, &vlans, &plans[1]).await;
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(links(&topo.node), [topo.parent.clone(), admins.clone()]);
    assert_vlan(&topo, &admins, 200, None);
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn a_vlan_we_did_not_create_carries_traffic_and_is_never_deleted() {
    require_vm("a_vlan_we_did_not_create_carries_traffic_and_is_never_deleted");
    let topo = Topology::new("p");
    topo.peer_vlan(300);
    let name = format!("{}.300", topo.parent);
    topo.node.ip(&[
        "link",
        "add",
        "link",
        &topo.parent,
        "name",
        &name,
        "type",
        "vlan",
        "id",
        "300",
    ]);
    topo.node.ip(&["link", "set", &name, "up"]);
    let pod = Netns::new();
    let host = HostNetlink::in_netns(&path(&topo.node)).await.unwrap();
    let vlans = VlanUsers::new();
    let plan = plan_for(&topo.parent, 300, "claim-a", &pod, "net1", 11);
    assert_eq!(vlan_in(&plan), name);
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    attach(&ops, &vlans, &plan).await.unwrap();
    assert_vlan(&topo, &name, 300, None);
    assert!(ping(&pod, "10.81.44.2"), "pod to the peer across VLAN 300 (10.81.44.0/24)");
    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(links(&topo.node), [topo.parent.clone(), name.clone()], "never deleted");
    assert_vlan(&topo, &name, 300, None);
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn a_parent_too_long_for_parent_dot_id_gets_nc_hash6_dot_id() {
    require_vm("a_parent_too_long_for_parent_dot_id_gets_nc_hash6_dot_id");
    // 8-byte netns prefix + 7 = 15 bytes, the longest name a link can have.
    let topo = Topology::new("longpar");
    assert_eq!(topo.parent.len(), 15);
    topo.peer_vlan(100);
    let pod = Netns::new();
    let host = HostNetlink::in_netns(&path(&topo.node)).await.unwrap();
    let vlans = VlanUsers::new();
    let plan = plan_for(&topo.parent, 100, "claim-a", &pod, "net1", 11);
    // The documented derivation, computed here independently of the code under test.
    let digest = Sha256::digest(topo.parent.as_bytes());
    let expected = format!("nc{:02x}{:02x}{:02x}.100", digest[0], digest[1], digest[2]);
    assert_eq!(vlan_in(&plan), expected);
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    attach(&ops, &vlans, &plan).await.unwrap();
    assert_vlan(
        &topo,
        &expected,
        100,
        Some(&format!("netclaim.dev/vlan parent={} id=100", topo.parent)),
    );
    assert!(ping(&pod, "10.81.100.2"), "pod to the peer across the hashed-name VLAN");
    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(links(&topo.node), std::slice::from_ref(&topo.parent));
}
