//! The real node daemon on the VM's kernels (`make vmtest`, decision 0012, issue 14 item 5):
//! `netclaim node` (the binary cargo built on the host, which the guest sees through the
//! shared root) registers with a kubelet stand-in, publishes, prepares claims over `dra.sock`
//! and attaches and detaches at our NRI runtime's sandbox events, with the harness of the
//! root tests (`testkit/src/daemon.rs`: dev API server, allocator, daemon in a throwaway node
//! netns, pods as throwaway netns). What the CI host's kernel cannot do is done here: an
//! ipvlan claim on a veth parent, a VLAN claim through an 8021q sub-interface shared by two
//! pods, and a VF of the first emulated igb PF moved into a pod as host-device. Traffic and
//! kernel state are checked from outside the code under test (`ip -d -j`, `ping`). The tests
//! run only inside the VM, where `vmtests/guest.sh` sets `NETCLAIM_VM=1`; nextest leaves this
//! binary out (`.config/nextest.toml`).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::time::{Duration, Instant};

use netclaim::kubelet::proto::pluginregistration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use nri_rs::PodSandbox;
use serde_json::{Value, json};

use crate::kit;
use crate::kit::daemon::{
    Node, PATIENCE, host_link, network_ips, pod, pod_ipv4, pod_links, published,
};
use crate::kit::netns::Netns;
use crate::kit::vm::{Vfs, require_vm};

/// What kubelet's plugin watcher does with a new registration socket: `GetInfo`, then
/// `NotifyRegistrationStatus` with success. Checks what the daemon reports.
pub(crate) fn register_as_kubelet(node: &Node) {
    let socket = node.dir.path().join("registry").join("netclaim.dev-reg.sock");
    let endpoint = node.dir.path().join("plugin").join("dra.sock");
    node.runtime.block_on(async move {
        let deadline = Instant::now() + PATIENCE;
        while tokio::net::UnixStream::connect(&socket).await.is_err() {
            assert!(Instant::now() < deadline, "no registration socket at {}", socket.display());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let channel = kit::kubelet::tonic_channel(&socket).await;
        let mut client = RegistrationClient::new(channel);
        let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
        assert_eq!(info.r#type, "DRAPlugin");
        assert_eq!(info.name, "netclaim.dev");
        assert_eq!(info.endpoint, endpoint.to_str().unwrap());
        assert!(info.supported_versions.iter().any(|v| v == "v1.DRAPlugin"), "{info:?}");
        client
            .notify_registration_status(RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
    });
}

/// Waits until the daemon publishes a device of interface `if_name`.
pub(crate) fn wait_published(node: &Node, if_name: &str, log: &str) {
    let started = Instant::now();
    while !published(node, if_name) {
        assert!(started.elapsed() < PATIENCE, "{if_name} never published:\n{}", node.log(log));
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("{if_name} published {:?} after the daemon registered", started.elapsed());
}

/// `ping -c 1` from `pod` to `address`.
pub(crate) fn pings(pod: &Netns, address: &str) -> bool {
    pod.exec("ping", &["-c", "1", "-W", "5", address]).status.success()
}

/// The stop containerd sends (no netns path: the daemon remembers it), then the remove.
pub(crate) fn stop_pod(node: &Node, sandbox: &PodSandbox) {
    let stopping = PodSandbox { netns_path: None, ..sandbox.clone() };
    node.runtime.block_on(node.nri().stop_pod_sandbox(&stopping)).unwrap();
    node.runtime.block_on(node.nri().remove_pod_sandbox(&stopping)).unwrap();
}

pub(crate) fn kind_of(link: &Value) -> &str {
    link["linkinfo"]["info_kind"].as_str().unwrap_or("")
}

/// An ipvlan claim on the veth parent: attached at `RunPodSandbox`, reaches the node side of
/// the parent, detached at stop, released at unprepare.
fn ipvlan_on_the_veth_parent(node: &Node) {
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "ipvl");
    let config = json!({"mode": "ipvlan", "ipvlan": {"mode": "l2", "flag": "bridge"},
        "interface": {"mtu": 1400}, "ipam": {"addresses": ["10.79.0.10/24"]}});
    let uid = node.allocated_claim_on("ipvl-net", &sandbox, &node.parent.clone(), config);
    assert_eq!(node.prepare("ipvl-net", &uid).error, "", "{}", node.log("node.log"));

    let started = Instant::now();
    let ran = node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox));
    println!("RunPodSandbox answered in {:?}", started.elapsed());
    assert!(ran.is_ok(), "{ran:?}\n{}", node.log("node.log"));
    let link = host_link(&pod_netns, "net1").expect("net1 in the pod when the event returns");
    assert_eq!(kind_of(&link), "ipvlan", "{link}");
    assert_eq!(link["linkinfo"]["info_data"]["mode"], "l2", "{link}");
    assert_eq!(link["mtu"], 1400);
    // ipvlan children carry the parent's MAC (`ipvlan_link_new`).
    let parent = host_link(&node.netns, &node.parent).unwrap();
    assert_eq!(link["address"], parent["address"]);
    assert_eq!(pod_ipv4(&pod_netns, "net1").as_deref(), Some("10.79.0.10/24"));
    assert!(pings(&pod_netns, "10.79.0.1"), "the pod reaches the node side of the parent");
    let claim = node.wait_for_status("ipvl-net", "True", "NetworkReady", "node.log");
    assert_eq!(network_ips(&claim), ["10.79.0.10/24"]);

    stop_pod(node, &sandbox);
    assert!(host_link(&pod_netns, "net1").is_none(), "net1 is gone at stop");
    node.wait_for_status("ipvl-net", "False", "PodStopped", "node.log");
    assert_eq!(node.unprepare("ipvl-net", &uid), "", "{}", node.log("node.log"));
    assert_eq!(pod_links(&pod_netns).len(), 1, "only lo is left in the pod");
    assert!(host_link(&node.netns, &node.parent).is_some(), "the parent stays");
    assert!(node.metric(r#"netclaim_attach_duration_seconds_count{mode="ipvlan"}"#) >= 1.0);
}

/// The 802.1Q sub-interfaces in the node netns: (name, VLAN id, parent name).
fn vlans(node: &Node) -> Vec<(String, u64, String)> {
    let output = node.netns.ip(&["-d", "-j", "link", "show", "type", "vlan"]);
    let links: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
    links
        .iter()
        .map(|l| {
            (
                l["ifname"].as_str().unwrap().to_owned(),
                l["linkinfo"]["info_data"]["id"].as_u64().unwrap(),
                l["link"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Two claims with `vlan: 7` on the veth parent: one 8021q sub-interface of the parent for
/// both pods, tagged traffic to the far end, kept while a pod uses it, deleted after the last.
fn two_vlan_claims_on_one_sub_interface(node: &Node, peer_vlan: &str) {
    let mut pods = vec![];
    for (name, address) in [("va", "10.81.0.10/24"), ("vb", "10.81.0.11/24")] {
        let pod_netns = Netns::new();
        let sandbox = pod(&pod_netns, name);
        let config = json!({"mode": "macvlan", "vlan": 7, "ipam": {"addresses": [address]}});
        let claim = format!("{name}-net");
        let uid = node.allocated_claim_on(&claim, &sandbox, &node.parent.clone(), config);
        assert_eq!(node.prepare(&claim, &uid).error, "", "{}", node.log("node.log"));
        let ran = node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox));
        assert!(ran.is_ok(), "{ran:?}\n{}", node.log("node.log"));
        let link = host_link(&pod_netns, "net1").expect("net1 in the pod");
        assert_eq!(kind_of(&link), "macvlan", "{link}");
        assert_eq!(pod_ipv4(&pod_netns, "net1").as_deref(), Some(address));
        assert!(pings(&pod_netns, "10.81.0.1"), "{name} reaches the far end over VLAN 7");
        pods.push((pod_netns, sandbox, claim, uid));
    }
    let ours: Vec<_> = vlans(node).into_iter().filter(|(name, ..)| name != peer_vlan).collect();
    assert_eq!(ours.len(), 1, "one sub-interface for both pods: {ours:?}");
    let (sub_interface, id, parent) = ours[0].clone();
    assert_eq!((id, parent.as_str()), (7, node.parent.as_str()));

    let (first, second) = (&pods[0], &pods[1]);
    stop_pod(node, &first.1);
    assert!(host_link(&first.0, "net1").is_none());
    assert!(host_link(&node.netns, &sub_interface).is_some(), "kept while the second pod runs");
    assert!(pings(&second.0, "10.81.0.1"), "the second pod still reaches the far end");
    stop_pod(node, &second.1);
    assert!(host_link(&second.0, "net1").is_none());
    assert!(
        host_link(&node.netns, &sub_interface).is_none(),
        "{sub_interface} is deleted after its last pod:\n{}",
        node.log("node.log")
    );
    for (_, _, claim, uid) in &pods {
        assert_eq!(node.unprepare(claim, uid), "", "{}", node.log("node.log"));
    }
    assert!(host_link(&node.netns, peer_vlan).is_some(), "a VLAN link not ours is kept");
}

/// The VF (a NIC of the node netns) moved into a pod as host-device: the same PCI function
/// is the pod's `net1`, still published, and comes back under its name and MTU at stop.
fn a_vf_as_host_device(node: &Node, vf: &str, vf_pci: &str) {
    let before = host_link(&node.netns, vf).unwrap();
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "vf");
    let config = json!({"mode": "host-device", "interface": {"mtu": 1400},
        "ipam": {"addresses": ["192.0.2.10/24"]}});
    let uid = node.allocated_claim_on("vf-net", &sandbox, vf, config);
    assert_eq!(node.prepare("vf-net", &uid).error, "", "{}", node.log("node.log"));
    let started = Instant::now();
    let ran = node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox));
    println!("RunPodSandbox answered in {:?}", started.elapsed());
    assert!(ran.is_ok(), "{ran:?}\n{}", node.log("node.log"));

    let link = host_link(&pod_netns, "net1").expect("the VF is net1 in the pod");
    assert_eq!(link["parentbus"], "pci", "{link}");
    assert_eq!(link["parentdev"].as_str(), Some(vf_pci), "{link}");
    assert_eq!(link["mtu"], 1400);
    assert_eq!(
        pod_ipv4(&pod_netns, "net1").as_deref(),
        Some("192.0.2.10/24"),
        "{:#?}\n{}",
        pod_links(&pod_netns),
        node.log("node.log")
    );
    assert!(host_link(&node.netns, vf).is_none(), "moved out of the node netns");
    let claim = node.wait_for_status("vf-net", "True", "NetworkReady", "node.log");
    assert_eq!(network_ips(&claim), ["192.0.2.10/24"]);
    assert!(published(node, vf), "the VF stays published while in the pod");

    stop_pod(node, &sandbox);
    let back = host_link(&node.netns, vf).expect("the VF is back under its host name");
    assert_eq!(back["parentdev"].as_str(), Some(vf_pci));
    assert_eq!(back["mtu"], before["mtu"], "its MTU restored");
    assert!(host_link(&pod_netns, "net1").is_none());
    assert_eq!(node.unprepare("vf-net", &uid), "", "{}", node.log("node.log"));
}

/// One node and one daemon for every claim (under TCG the debug build's API server and
/// daemon take 10–20 s each to start): the node netns holds the veth parent, its peer with
/// the ipvlan pods' gateway and a VLAN 7 sub-interface as the far end of the tagged
/// traffic, and a VF of the first igb PF as its NIC (a PCI netdev, published without an
/// include pattern; deleting the netns gives it back to the root netns, dropping `vfs`
/// removes it).
#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn the_daemon_registers_publishes_and_attaches_ipvlan_vlan_and_a_vf() {
    require_vm("the_daemon_registers_publishes_and_attaches_ipvlan_vlan_and_a_vf");
    let vfs = Vfs::create(1);
    let (vf, vf_pci) = (vfs.names[0].clone(), vfs.pci[0].clone());
    let started = Instant::now();
    let node = Node::start();
    kit::vm::report(&format!("vm_daemon: API server up after {:?}", started.elapsed()));
    let peer = node.netns.ifname("p1");
    node.netns.ip(&["addr", "add", "10.79.0.1/24", "dev", &peer]);
    let peer_vlan = node.netns.ifname("p1v");
    node.netns.ip(&["link", "add", "link", &peer, "name", &peer_vlan, "type", "vlan", "id", "7"]);
    node.netns.ip(&["addr", "add", "10.81.0.1/24", "dev", &peer_vlan]);
    node.netns.ip(&["link", "set", &peer_vlan, "up"]);
    kit::vm::ip(&["link", "set", &vf, "netns", &node.netns.name]);

    let started = Instant::now();
    let _daemon = node.start_daemon("node.log");
    kit::vm::report(&format!(
        "vm_daemon: the daemon's NRI plugin registered after {:?}",
        started.elapsed()
    ));
    register_as_kubelet(&node);
    assert!(node.log("node.log").contains("probed the kernel's child link kinds"));
    wait_published(&node, &node.parent, "node.log");
    wait_published(&node, &vf, "node.log");

    for (phase, run) in [
        ("ipvlan", &(|| ipvlan_on_the_veth_parent(&node)) as &dyn Fn()),
        ("vlan", &|| two_vlan_claims_on_one_sub_interface(&node, &peer_vlan)),
        ("vf host-device", &|| a_vf_as_host_device(&node, &vf, &vf_pci)),
    ] {
        let started = Instant::now();
        run();
        kit::vm::report(&format!("vm_daemon: {phase} passed in {:?}", started.elapsed()));
    }
    drop(node);
    drop(vfs);
}
