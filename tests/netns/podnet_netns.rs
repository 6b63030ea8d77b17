//! Root integration tests of `podnet` attach/detach through real rtnetlink: a throwaway "host"
//! netns with a veth parent whose peer sits in a third netns, and a throwaway "pod" netns. The
//! results are checked from outside the code under test with `ip -j` and `ping`.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;
use std::process::Command;

use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::model::network_config::{
    Addressing, DeviceKind, MacvlanMode, ResolvedInterface, ResolvedMode, ResolvedNetworkConfig,
    Route, Sharing,
};
use netclaim::podnet::apply::{StepError, UndoOutcome, completed_attach};
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, PodNetns, VlanUsers, attach, detach, plan_attach,
};
use netclaim::podnet::{LinkPort, Side};
use serde_json::Value;

use crate::kit;
use crate::kit::netns::{Netns, require_root};

/// The node side of a test: a "host" netns with a veth parent, its peer in a third netns
/// with the addresses the pod pings, and the pod netns.
struct Topology {
    host: Netns,
    peer: Netns,
    pod: Netns,
    parent: String,
}

impl Topology {
    /// `parent` (mtu `mtu`) in the host netns; its peer in the peer netns with
    /// 10.77.0.1/24 and fd00:77::1/64, up.
    fn new(mtu: u32) -> Self {
        let (host, peer, pod) = (Netns::new(), Netns::new(), Netns::new());
        let parent = host.ifname("p0");
        let peer_end = host.ifname("p1");
        let mtu = mtu.to_string();
        host.ip(&["link", "add", &parent, "mtu", &mtu, "type", "veth", "peer", "name", &peer_end]);
        host.ip(&["link", "set", &peer_end, "netns", &peer.name]);
        host.ip(&["link", "set", &parent, "up"]);
        peer.ip(&["addr", "add", "10.77.0.1/24", "dev", &peer_end]);
        peer.ip(&["addr", "add", "fd00:77::1/64", "dev", &peer_end, "nodad"]);
        peer.ip(&["link", "set", &peer_end, "up"]);
        Self { host, peer, pod, parent }
    }

    fn path(netns: &Netns) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", netns.name))
    }
}

fn route(destination: &str, gateway: Option<&str>, metric: Option<u32>) -> Route {
    Route {
        destination: destination.parse().unwrap(),
        gateway: gateway.map(|g| g.parse().unwrap()),
        metric,
    }
}

fn config(
    mode: ResolvedMode,
    mtu: u32,
    addresses: &[&str],
    routes: Vec<Route>,
) -> ResolvedNetworkConfig {
    ResolvedNetworkConfig {
        pod_network: None,
        mode,
        interface: ResolvedInterface { name: None, mtu, hardware_address: None },
        addressing: Addressing::Static(addresses.iter().map(|a| a.parse().unwrap()).collect()),
        routes,
        vlan: None,
        sriov: None,
        stats: false,
        routing: netclaim::model::network_config::RoutingSettings::default(),
        bandwidth: None,
        rdma: None,
    }
}

fn make_plan(
    cfg: &ResolvedNetworkConfig,
    device: &HostDevice,
    pod: &Netns,
    name: &str,
) -> AttachPlan {
    let pod = PodNetns { pod_uid: format!("{}-uid", pod.name), path: Topology::path(pod) };
    plan_attach(&AttachRequest {
        claim_uid: "claim-uid-1",
        config: cfg,
        device,
        pod: &pod,
        interface_name: name,
        pool_addresses: &[],
    })
    .unwrap()
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

/// `local/prefixlen` of the global addresses of `dev`.
fn addresses(netns: &Netns, dev: &str) -> Vec<String> {
    ip_json(netns, &["addr", "show", "dev", dev])[0]["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["scope"] == "global")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect()
}

/// Whether one `ping` from `netns` reaches `target` (a missing ping fails the test).
fn ping(netns: &Netns, target: &str) -> bool {
    let installed = Command::new("sh").args(["-c", "command -v ping"]).output().unwrap();
    assert!(installed.status.success(), "ping is missing: run scripts/setup/20-podnet.sh");
    netns.exec("ping", &["-c", "1", "-W", "2", target]).status.success()
}

fn shared_parent(name: &str, mtu: u32) -> HostDevice {
    HostDevice {
        if_name: name.to_owned(),
        kind: DeviceKind::Virtual,
        sharing: Sharing::Shared,
        mtu,
        mac: None,
    }
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn macvlan_is_created_in_the_pod_with_name_mtu_addresses_routes_and_carries_traffic() {
    if !require_root(
        "macvlan_is_created_in_the_pod_with_name_mtu_addresses_routes_and_carries_traffic",
    ) {
        return;
    }
    let topo = Topology::new(1500);
    let host = HostNetlink::in_netns(&Topology::path(&topo.host)).await.unwrap();
    let mut cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Private },
        1400,
        &["10.77.0.2/24", "fd00:77::2/64"],
        vec![
            route("10.88.0.0/16", Some("10.77.0.1"), Some(50)),
            route("0.0.0.0/0", Some("10.77.0.1"), Some(200)),
            route("fd00:88::/64", Some("fd00:77::1"), None),
        ],
    );
    cfg.interface.hardware_address = Some("02:00:00:77:00:02".parse().unwrap());
    let plan = make_plan(&cfg, &shared_parent(&topo.parent, 1500), &topo.pod, "net1");
    let vlans = VlanUsers::new();
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    let attached = attach(&ops, &vlans, &plan).await.unwrap();

    assert_eq!(attached.name, "net1");
    assert_eq!(attached.mtu, 1400);
    assert_eq!(attached.mac.unwrap().to_string(), "02:00:00:77:00:02");
    let cidrs: Vec<String> = attached.addresses.iter().map(ToString::to_string).collect();
    assert_eq!(cidrs, ["10.77.0.2/24", "fd00:77::2/64"]);

    let link = &ip_json(&topo.pod, &["-d", "link", "show", "net1"])[0];
    assert_eq!(link["mtu"], 1400);
    assert_eq!(link["address"], "02:00:00:77:00:02");
    assert_eq!(link["linkinfo"]["info_kind"], "macvlan");
    assert_eq!(link["linkinfo"]["info_data"]["mode"], "private");
    assert!(link["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{link}");
    assert_eq!(addresses(&topo.pod, "net1"), ["10.77.0.2/24", "fd00:77::2/64"]);
    let v6 = &ip_json(&topo.pod, &["-6", "addr", "show", "dev", "net1", "scope", "global"])[0]["addr_info"]
        [0];
    assert!(v6.get("tentative").is_none(), "NODAD: the address is usable at once: {v6}");
    let routes4 = ip_json(&topo.pod, &["-4", "route", "show", "dev", "net1"]);
    let find = |routes: &Value, dst: &str| {
        routes.as_array().unwrap().iter().find(|r| r["dst"] == dst).cloned().unwrap_or(Value::Null)
    };
    assert_eq!(find(&routes4, "10.88.0.0/16")["gateway"], "10.77.0.1");
    assert_eq!(find(&routes4, "10.88.0.0/16")["metric"], 50);
    assert_eq!(find(&routes4, "default")["metric"], 200);
    let routes6 = ip_json(&topo.pod, &["-6", "route", "show", "dev", "net1"]);
    assert_eq!(find(&routes6, "fd00:88::/64")["gateway"], "fd00:77::1");
    assert_eq!(
        links(&topo.host),
        std::slice::from_ref(&topo.parent),
        "nothing created in the host netns"
    );

    assert!(ping(&topo.pod, "10.77.0.1"), "IPv4 ping from the pod to the parent's peer");
    assert!(ping(&topo.pod, "fd00:77::1"), "IPv6 ping");

    // Read back as a restart does: the finished attach is recognised as finished, and one
    // missing route makes it half-done.
    let link = ops.link(Side::Pod, "net1").await.unwrap().unwrap();
    let config = ops.pod_config(link.index).await.unwrap();
    assert!(config.up);
    let adopted = completed_attach(&plan, &link, &config).expect("a finished attach");
    assert_eq!(adopted.addresses, attached.addresses);
    topo.pod.ip(&["route", "del", "10.88.0.0/16", "dev", "net1"]);
    let config = ops.pod_config(link.index).await.unwrap();
    assert!(completed_attach(&plan, &link, &config).is_none(), "{config:?}");

    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(links(&topo.pod).is_empty());
    assert_eq!(links(&topo.host), std::slice::from_ref(&topo.parent));
    drop(topo.peer);
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_host_device_moves_in_and_back_with_name_and_mtu_restored() {
    if !require_root("a_host_device_moves_in_and_back_with_name_and_mtu_restored") {
        return;
    }
    let topo = Topology::new(1450);
    let host = HostNetlink::in_netns(&Topology::path(&topo.host)).await.unwrap();
    let cfg = config(
        ResolvedMode::HostDevice,
        1300,
        &["10.77.0.2/24"],
        vec![route("10.88.0.0/16", Some("10.77.0.1"), None)],
    );
    let device = HostDevice {
        if_name: topo.parent.clone(),
        kind: DeviceKind::Virtual,
        sharing: Sharing::Exclusive,
        mtu: 1450,
        mac: None,
    };
    let plan = make_plan(&cfg, &device, &topo.pod, "net2");
    let vlans = VlanUsers::new();
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    let attached = attach(&ops, &vlans, &plan).await.unwrap();
    assert_eq!((attached.name.as_str(), attached.mtu), ("net2", 1300));

    assert!(links(&topo.host).is_empty(), "the device left the host netns");
    let link = &ip_json(&topo.pod, &["link", "show", "net2"])[0];
    assert_eq!(link["mtu"], 1300);
    assert_eq!(
        link["ifalias"],
        format!("netclaim.dev/device host={} claim=claim-uid-1", topo.parent).as_str(),
        "rename, MTU and alias arrived with the move"
    );
    assert_eq!(addresses(&topo.pod, "net2"), ["10.77.0.2/24"]);
    assert!(ping(&topo.pod, "10.77.0.1"), "ping through the moved device");

    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(links(&topo.pod).is_empty());
    let back = &ip_json(&topo.host, &["addr", "show", "dev", &topo.parent])[0];
    assert_eq!(back["mtu"], 1450, "original MTU");
    assert!(back.get("ifalias").is_none(), "alias cleared: {back}");
    assert!(
        back["addr_info"].as_array().unwrap().iter().all(|a| a["scope"] != "global"),
        "the kernel flushed the pod's addresses: {back}"
    );
    assert!(back["flags"].as_array().unwrap().iter().all(|f| f != "UP"), "down: {back}");
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_failed_attach_leaves_nothing_behind() {
    if !require_root("a_failed_attach_leaves_nothing_behind") {
        return;
    }
    let topo = Topology::new(1500);
    let host = HostNetlink::in_netns(&Topology::path(&topo.host)).await.unwrap();
    let vlans = VlanUsers::new();

    // A gateway on no connected subnet: the kernel answers ENETUNREACH at the last step.
    let cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        1500,
        &["10.77.0.2/24", "fd00:77::2/64"],
        vec![
            route("10.88.0.0/16", Some("10.77.0.1"), None),
            route("10.99.0.0/16", Some("10.55.0.1"), None),
        ],
    );
    let plan = make_plan(&cfg, &shared_parent(&topo.parent, 1500), &topo.pod, "net1");
    let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
    let err = attach(&ops, &vlans, &plan).await.unwrap_err();
    assert!(matches!(err.cause, StepError::GatewayUnreachable { .. }), "{err}");
    assert_eq!(err.cause.errno(), Some(101));
    assert_eq!(err.index, plan.steps.len() - 1);
    assert!(err.undo_failures.is_empty(), "{err}");
    assert!(links(&topo.pod).is_empty(), "no link left in the pod");
    assert_eq!(links(&topo.host), std::slice::from_ref(&topo.parent), "no link left in the host");

    // A host device whose last step fails comes back with its name and MTU.
    let device = HostDevice {
        if_name: topo.parent.clone(),
        kind: DeviceKind::Virtual,
        sharing: Sharing::Exclusive,
        mtu: 1500,
        mac: None,
    };
    let unreachable = config(
        ResolvedMode::HostDevice,
        1300,
        &["10.77.0.2/24"],
        vec![route("10.99.0.0/16", Some("10.55.0.1"), None)],
    );
    let plan = make_plan(&unreachable, &device, &topo.pod, "net3");
    let err = attach(&ops, &vlans, &plan).await.unwrap_err();
    assert!(matches!(err.cause, StepError::GatewayUnreachable { .. }), "{err}");
    assert!(err.undo_failures.is_empty(), "{err}");
    assert!(links(&topo.pod).is_empty());
    let back = &ip_json(&topo.host, &["addr", "show", "dev", &topo.parent])[0];
    assert_eq!(back["mtu"], 1500, "{back}");
    assert!(back.get("ifalias").is_none(), "{back}");
    assert!(back["addr_info"].as_array().unwrap().iter().all(|a| a["scope"] != "global"));

    // A name already taken in the pod: a host device is not moved, and stays as it was.
    let taken = topo.pod.ifname("x");
    topo.pod.ip(&["link", "add", "net2", "type", "veth", "peer", "name", &taken]);
    let host_device = config(ResolvedMode::HostDevice, 1400, &["10.77.0.2/24"], vec![]);
    let plan = make_plan(&host_device, &device, &topo.pod, "net2");
    let err = attach(&ops, &vlans, &plan).await.unwrap_err();
    assert!(matches!(&err.cause, StepError::NameTaken { name, .. } if name == "net2"), "{err}");
    assert_eq!(links(&topo.host), std::slice::from_ref(&topo.parent));
    assert_eq!(ip_json(&topo.host, &["link", "show", &topo.parent])[0]["mtu"], 1500);
    let mut pod_links = links(&topo.pod);
    pod_links.sort();
    let mut expected = vec![String::from("net2"), taken];
    expected.sort();
    assert_eq!(pod_links, expected, "the pod's own links are untouched");
}

/// Unmounts a bind mount the test made, even when the test fails.
struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The host parent as `ip` shows it, minus the counters that change on their own.
fn host_link_view(netns: &Netns, name: &str) -> Value {
    let mut link = ip_json(netns, &["addr", "show", "dev", name])[0].clone();
    for volatile in ["operstate", "stats64", "linkinfo"] {
        link.as_object_mut().unwrap().remove(volatile);
    }
    link
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_failure_injected_at_every_kernel_call_leaves_the_namespaces_as_they_were() {
    use netclaim::podnet::failing::{FailingOps, FailurePlan};
    use std::sync::Arc;
    if !require_root("a_failure_injected_at_every_kernel_call_leaves_the_namespaces_as_they_were") {
        return;
    }
    let topo = Topology::new(1500);
    let host = HostNetlink::in_netns(&Topology::path(&topo.host)).await.unwrap();
    let vlans = VlanUsers::new();
    let ops = Arc::new(NetlinkOps::open(&host, &Topology::path(&topo.pod)).await.unwrap());
    let macvlan = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        1400,
        &["10.77.0.2/24", "fd00:77::2/64"],
        vec![route("10.88.0.0/16", Some("10.77.0.1"), None)],
    );
    let nic = HostDevice {
        if_name: topo.parent.clone(),
        kind: DeviceKind::Virtual,
        sharing: Sharing::Exclusive,
        mtu: 1500,
        mac: None,
    };
    let moved = config(
        ResolvedMode::HostDevice,
        1300,
        &["10.77.0.2/24"],
        vec![route("10.88.0.0/16", Some("10.77.0.1"), None)],
    );
    let plans = [
        ("macvlan", make_plan(&macvlan, &shared_parent(&topo.parent, 1500), &topo.pod, "net1")),
        ("host device", make_plan(&moved, &nic, &topo.pod, "net2")),
    ];
    for (what, plan) in &plans {
        // A clean run counts the kernel calls; a failed attach must leave the host link as a
        // clean attach and detach do (a NIC comes back down, as the move back sets it).
        let counting = FailurePlan::new(0, 0);
        let clean = FailingOps::new(Arc::clone(&ops), Arc::clone(&counting));
        attach(&clean, &vlans, plan).await.unwrap();
        assert!(detach(&clean, &vlans, plan).await.is_clean());
        let before = host_link_view(&topo.host, &topo.parent);
        let attach_calls = counting.calls() - u32::try_from(plan.teardown().len()).unwrap();
        assert!(attach_calls >= 4, "{what}: {attach_calls} calls");
        for fail_at in 1..=attach_calls {
            let failing =
                FailingOps::new(Arc::clone(&ops), FailurePlan::new(fail_at, nix::libc::EBUSY));
            let err = attach(&failing, &vlans, plan).await.unwrap_err();
            let context = format!("{what}, call {fail_at} of {attach_calls} failed: {err}");
            assert_eq!(err.cause.errno(), Some(nix::libc::EBUSY), "{context}");
            assert!(err.undo_failures.is_empty(), "{context}");
            assert!(links(&topo.pod).is_empty(), "{context}: pod links {:?}", links(&topo.pod));
            assert_eq!(
                links(&topo.host),
                std::slice::from_ref(&topo.parent),
                "{context}: host links"
            );
            assert_eq!(host_link_view(&topo.host, &topo.parent), before, "{context}");
        }
    }
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn detach_succeeds_when_the_pod_netns_is_already_gone() {
    if !require_root("detach_succeeds_when_the_pod_netns_is_already_gone") {
        return;
    }
    let topo = Topology::new(1500);
    let host = HostNetlink::in_netns(&Topology::path(&topo.host)).await.unwrap();
    let vlans = VlanUsers::new();
    let cfg = config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        1500,
        &["10.77.0.2/24"],
        vec![],
    );
    let plan = make_plan(&cfg, &shared_parent(&topo.parent, 1500), &topo.pod, "net1");
    {
        let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
        attach(&ops, &vlans, &plan).await.unwrap();
    }
    kit::netns::run("ip", &["netns", "del", &topo.pod.name]);

    let ops = NetlinkOps::open_for_detach(&host, &plan.pod.path).await.unwrap();
    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(matches!(report.steps[0].1, UndoOutcome::AlreadyGone), "{report:?}");
    assert_eq!(links(&topo.host), std::slice::from_ref(&topo.parent));
    // An attach into a gone netns is a clear error, not a panic.
    let err = NetlinkOps::open(&host, &plan.pod.path).await.unwrap_err();
    assert!(matches!(err, netclaim::podnet::LinkOpError::NetnsGone { .. }), "{err}");
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn detach_of_a_host_device_whose_pod_netns_is_gone_succeeds() {
    if !require_root("detach_of_a_host_device_whose_pod_netns_is_gone_succeeds") {
        return;
    }
    let topo = Topology::new(1500);
    let host = HostNetlink::in_netns(&Topology::path(&topo.host)).await.unwrap();
    let vlans = VlanUsers::new();
    let device = HostDevice {
        if_name: topo.parent.clone(),
        kind: DeviceKind::Virtual,
        sharing: Sharing::Exclusive,
        mtu: 1500,
        mac: None,
    };
    let cfg = config(ResolvedMode::HostDevice, 1400, &["10.77.0.2/24"], vec![]);
    let plan = make_plan(&cfg, &device, &topo.pod, "net1");
    {
        let ops = NetlinkOps::open(&host, &plan.pod.path).await.unwrap();
        attach(&ops, &vlans, &plan).await.unwrap();
    }
    // A veth is destroyed with its netns (a physical NIC would come back to the host).
    kit::netns::run("ip", &["netns", "del", &topo.pod.name]);
    let ops = NetlinkOps::open_for_detach(&host, &plan.pod.path).await.unwrap();
    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    assert!(matches!(report.steps[0].1, UndoOutcome::AlreadyGone), "{report:?}");
    assert!(links(&topo.host).is_empty());
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_netns_path_that_is_not_a_pod_network_namespace_is_refused_by_name() {
    use netclaim::podnet::ports::{LinkOpError, NetnsRefusal};
    if !require_root("a_netns_path_that_is_not_a_pod_network_namespace_is_refused_by_name") {
        return;
    }
    let topo = Topology::new(1500);
    let host = HostNetlink::in_netns(&Topology::path(&topo.host)).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let regular = dir.path().join("regular");
    std::fs::write(&regular, b"").unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(Topology::path(&topo.pod), &link).unwrap();
    // A namespace of another kind, bind-mounted as runtimes mount netns files.
    let uts = dir.path().join("uts");
    std::fs::write(&uts, b"").unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["--bind", "/proc/self/ns/uts"])
        .arg(&uts)
        .status()
        .unwrap();
    assert!(mounted.success());
    let _unmount = Unmount(uts.clone());
    let cases = [
        // The host's own netns would put the pod's routes on the host.
        (Topology::path(&topo.host), NetnsRefusal::DaemonOwn),
        // Opened without O_NONBLOCK, a FIFO would hang the thread forever.
        (fifo, NetnsRefusal::NotNsfs),
        (regular, NetnsRefusal::NotNsfs),
        (link, NetnsRefusal::Symlink),
    ];
    for (path, expected) in cases {
        let opened =
            tokio::time::timeout(std::time::Duration::from_secs(5), NetlinkOps::open(&host, &path))
                .await
                .unwrap_or_else(|_| panic!("{}: open hung", path.display()));
        match opened {
            Err(LinkOpError::NotPodNetns { reason, .. }) => {
                assert_eq!(reason, expected, "{}", path.display());
            }
            other => panic!("{}: {other:?}", path.display()),
        }
    }
    // A namespace of another kind is refused by its socket thread's `setns`, which the open
    // does not wait for: by every pod-side request, and by the creation that hands it to the
    // kernel (which refuses it too: nothing is created).
    let ops = NetlinkOps::open(&host, &uts).await.unwrap();
    let not_network = |result: Result<_, LinkOpError>, what: &str| match result {
        Err(LinkOpError::NotPodNetns { reason: NetnsRefusal::NotNetwork, .. }) => {}
        other => panic!("{what} in a uts namespace: {other:?}"),
    };
    not_network(ops.link(Side::Pod, "lo").await.map(|_| ()), "lookup");
    let parent = ops.link(Side::Host, &topo.parent).await.unwrap().unwrap().index;
    let macvlan = netclaim::podnet::plan::ChildKind::Macvlan { mode: MacvlanMode::Bridge };
    not_network(ops.create_child(macvlan, parent, "net9", 1400, None).await, "macvlan creation");
    assert!(ops.link(Side::Host, "net9").await.unwrap().is_none(), "nothing created on the host");
    // The real pod netns opens.
    NetlinkOps::open(&host, &Topology::path(&topo.pod)).await.unwrap();
    // At detach, a path whose mount is gone (a plain file left behind) counts as gone.
    let gone = dir.path().join("regular");
    assert!(NetlinkOps::open_for_detach(&host, &gone).await.is_ok());
}

/// The host link dump the restart's reconcile reads, on a netns with hundreds of links (a
/// veth per pod): many datagrams, each reduced as it is read; every link once, with its MTU
/// and MAC as `ip` reports them.
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn the_host_link_dump_lists_every_one_of_hundreds_of_links() {
    if !require_root("the_host_link_dump_lists_every_one_of_hundreds_of_links") {
        return;
    }
    let netns = Netns::new();
    for n in 0..150 {
        let (a, b) = (netns.ifname(&format!("a{n}")), netns.ifname(&format!("b{n}")));
        let mtu = (1300 + n).to_string();
        netns.ip(&["link", "add", &a, "mtu", &mtu, "type", "veth", "peer", "name", &b]);
    }
    let host = HostNetlink::in_netns(&Topology::path(&netns)).await.unwrap();
    let mut dumped: Vec<(String, u32, String)> = host
        .links()
        .await
        .unwrap()
        .into_iter()
        .filter(|l| l.name != "lo")
        .map(|l| (l.name, l.mtu, l.mac.map(|m| m.to_string()).unwrap_or_default()))
        .collect();
    dumped.sort();
    let mut expected: Vec<(String, u32, String)> = ip_json(&netns, &["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["ifname"] != "lo")
        .map(|l| {
            (
                l["ifname"].as_str().unwrap().to_owned(),
                u32::try_from(l["mtu"].as_u64().unwrap()).unwrap(),
                l["address"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(dumped.len(), 300);
    assert_eq!(dumped, expected);
}
