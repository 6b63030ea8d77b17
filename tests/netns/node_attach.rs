//! Root integration tests of pod interface attach through the real `netclaim node` binary:
//! `netclaim dev --api-only` and the daemon run in a throwaway "node" netns with a veth
//! parent; claims are allocated by the dev allocator as the scheduler would, prepared over
//! kubelet's DRA socket, and pod sandboxes are announced by our in-process NRI runtime on a
//! temp socket, each pod being another throwaway netns (the harness: `testkit/src/daemon.rs`,
//! shared with the VM suite `tests/vm/vm_daemon.rs`).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::Path;
use std::time::{Duration, Instant};

use kube::Api;
use netclaim::model::support::Probe;
use nri_rs::PodSandbox;
use serde_json::json;

use crate::kit::daemon::{
    Node, PATIENCE, host_link, network_ips, pod, pod_ipv4, pod_links, published,
};
use crate::kit::netns::{Child, Netns, require_root};

#[test]
#[ignore = "needs root: run `make test` as root"]
fn run_pod_sandbox_attaches_a_macvlan_and_stop_removes_it() {
    if !require_root("run_pod_sandbox_attaches_a_macvlan_and_stop_removes_it") {
        return;
    }
    let node = Node::start();
    let _daemon = node.start_daemon("node.log");
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "web");
    let uid = node.allocated_claim("web-net", &sandbox, "10.77.0.0/24");
    let prepared = node.prepare("web-net", &uid);
    assert_eq!(prepared.error, "", "{}", node.log("node.log"));

    let started = Instant::now();
    let ran = node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox));
    println!("RunPodSandbox answered in {:?}", started.elapsed());
    assert!(ran.is_ok(), "{ran:?}\n{}", node.log("node.log"));
    // The interface is there when the event returns, not eventually.
    let address = pod_ipv4(&pod_netns, "net1").expect("net1 in the pod");
    assert!(address.starts_with("10.77.0.") && address.ends_with("/24"), "{address}");

    let claim = node.wait_for_status("web-net", "True", "NetworkReady", "node.log");
    assert_eq!(network_ips(&claim), std::slice::from_ref(&address));
    let entry = &claim.status.as_ref().unwrap().devices.as_ref().unwrap()[0];
    let data = entry.network_data.as_ref().unwrap();
    assert_eq!(data.interface_name.as_deref(), Some("net1"));
    assert!(data.hardware_address.as_deref().is_some_and(|m| m.len() == 17));
    assert_eq!(entry.data.as_ref().unwrap().0["parent"], node.parent.as_str());
    assert!(node.metric("netclaim_attach_duration_seconds_count{mode=\"macvlan\"}") >= 1.0);
    println!(
        "daemon-side attach (event received to link configured): {:.2} ms",
        node.metric("netclaim_attach_duration_seconds_sum{mode=\"macvlan\"}") * 1000.0
    );
    assert!(
        node.metric(r#"netclaim_nri_events_total{event="RunPodSandbox",result="success"}"#) >= 1.0
    );
    assert!(node.metric(r#"netclaim_ipam_addresses{pool="10.77.0.0/24",state="leased"}"#) >= 1.0);

    // A second RunPodSandbox is a no-op; a container may start.
    node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).unwrap();
    let container = nri_rs::Container {
        id: "c1".into(),
        pod_sandbox_id: sandbox.id.clone(),
        name: "app".into(),
    };
    node.runtime.block_on(node.nri().create_container(&sandbox, &container)).unwrap();

    // containerd sends no netns path at stop: the daemon remembers it.
    let stopping = PodSandbox { netns_path: None, ..sandbox.clone() };
    node.runtime.block_on(node.nri().stop_pod_sandbox(&stopping)).unwrap();
    assert_eq!(pod_ipv4(&pod_netns, "net1"), None, "net1 is gone at once");
    node.wait_for_status("web-net", "False", "PodStopped", "node.log");
    node.runtime.block_on(node.nri().remove_pod_sandbox(&stopping)).unwrap();
}

/// Whether this kernel creates a link of `kind` (`ipvlan`, `vlan`) on a veth, asked with `ip`
/// in a throwaway netns: the ground truth the daemon's probe is checked against.
fn kernel_has(kind: &str) -> bool {
    let netns = Netns::new();
    let (parent, peer) = (netns.ifname("k0"), netns.ifname("k1"));
    netns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
    let child = netns.ifname("k2");
    let mut args = vec!["-n", netns.name.as_str(), "link", "add", "link", &parent, "name", &child];
    args.extend_from_slice(if kind == "vlan" {
        &["type", "vlan", "id", "7"]
    } else {
        &["type", "ipvlan"]
    });
    std::process::Command::new("ip").args(&args).status().unwrap().success()
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn the_kernel_probe_agrees_with_the_kernel_and_leaves_no_link_behind() {
    if !require_root("the_kernel_probe_agrees_with_the_kernel_and_leaves_no_link_behind") {
        return;
    }
    let netns = Netns::new();
    let before = netns.ip(&["-o", "link", "show"]).stdout;
    // The probe makes its own private netns from whichever one it runs in.
    let path = format!("/run/netns/{}", netns.name);
    let started = Instant::now();
    let support =
        netclaim::host::netns::run_in(Path::new(&path), netclaim::host::kernel_probe::probe)
            .unwrap();
    println!("probe: ipvlan {}, vlan {} in {:?}", support.ipvlan, support.vlan, started.elapsed());
    for (kind, probe) in [("ipvlan", &support.ipvlan), ("vlan", &support.vlan)] {
        match (kernel_has(kind), probe) {
            (true, Probe::Available) => {}
            (false, Probe::Missing { detail }) => {
                assert!(detail.contains("EOPNOTSUPP"), "{detail}");
            }
            (has, other) => panic!(
                "{kind}: the kernel {} it, the probe says {other}",
                if has { "has" } else { "lacks" }
            ),
        }
    }
    assert_eq!(netns.ip(&["-o", "link", "show"]).stdout, before, "the probe left a link behind");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_mode_the_node_cannot_attach_is_refused_at_prepare_not_at_sandbox_time() {
    if !require_root("a_mode_the_node_cannot_attach_is_refused_at_prepare_not_at_sandbox_time") {
        return;
    }
    let node = Node::start();
    let _daemon = node.start_daemon("node.log");
    let log = node.log("node.log");
    assert!(log.contains("probed the kernel's child link kinds"), "{log}");
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "ipvl");
    let parent = node.parent.clone();

    let uid = node.allocated_claim_on("ipvl-net", &sandbox, &parent, json!({"mode": "ipvlan"}));
    let error = node.prepare("ipvl-net", &uid).error;
    let has_ipvlan = kernel_has("ipvlan");
    if has_ipvlan {
        // The ipvlan attach exists (its kernel tests run in the VM, `tests/vm/vm_ipvlan.rs`).
        assert_eq!(error, "", "{}", node.log("node.log"));
    } else {
        // This CI host: its kernel has no ipvlan module.
        let reason = "ipvlan is not available on this node's kernel";
        // kubelet puts the claim's name in front; the driver's message starts at the request.
        for part in ["request ", "mode: \"ipvlan\"", reason] {
            assert!(error.contains(part), "{part:?} missing in {error:?}");
        }
        assert!(node.claim("ipvl-net").status.unwrap().devices.is_none(), "nothing was attached");
    }

    let uid = node.allocated_claim_on(
        "vlan-net",
        &sandbox,
        &parent,
        json!({"mode": "macvlan", "vlan": 7}),
    );
    let error = node.prepare("vlan-net", &uid).error;
    let has_vlan = kernel_has("vlan");
    if has_vlan {
        assert_eq!(error, "", "{}", node.log("node.log"));
    } else {
        for part in ["request ", "vlan: 7", "VLAN sub-interfaces are not available"] {
            assert!(error.contains(part), "{part:?} missing in {error:?}");
        }
    }
    // The pod starts without the refused claims (lo, plus the ipvlan on a kernel with ipvlan
    // and the VLAN claim's macvlan on a kernel with 8021q).
    node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).unwrap();
    assert_eq!(
        pod_links(&pod_netns).len(),
        1 + usize::from(has_ipvlan) + usize::from(has_vlan),
        "{}",
        node.log("node.log")
    );
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_sandbox_started_while_the_daemon_was_down_is_attached_at_synchronize() {
    if !require_root("a_sandbox_started_while_the_daemon_was_down_is_attached_at_synchronize") {
        return;
    }
    let node = Node::start();
    let daemon = node.start_daemon("node1.log");
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "db");
    let uid = node.allocated_claim("db-net", &sandbox, "10.78.0.0/24");
    assert_eq!(node.prepare("db-net", &uid).error, "", "{}", node.log("node1.log"));

    // kill -9, then the sandbox starts without the plugin (the runtime goes on without it).
    drop(daemon);
    let deadline = Instant::now() + PATIENCE;
    while !node.nri().plugins().is_empty() {
        assert!(Instant::now() < deadline, "the runtime still lists the killed plugin");
        std::thread::sleep(Duration::from_millis(20));
    }
    node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).unwrap();
    assert_eq!(pod_ipv4(&pod_netns, "net1"), None);

    let _daemon = node.start_daemon("node2.log");
    let started = Instant::now();
    let address = loop {
        if let Some(address) = pod_ipv4(&pod_netns, "net1") {
            break address;
        }
        assert!(started.elapsed() < PATIENCE, "not attached:\n{}", node.log("node2.log"));
        std::thread::sleep(Duration::from_millis(20));
    };
    println!("attached {:?} after registration", started.elapsed());
    assert!(address.starts_with("10.78.0."), "{address}");
    let claim = node.wait_for_status("db-net", "True", "NetworkReady", "node2.log");
    assert_eq!(network_ips(&claim), [address]);
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_host_device_moves_into_the_pod_stays_published_and_comes_back_with_its_mtu() {
    if !require_root("a_host_device_moves_into_the_pod_stays_published_and_comes_back_with_its_mtu")
    {
        return;
    }
    let node = Node::start();
    let (nic, peer) = (node.netns.ifname("x0"), node.netns.ifname("x1"));
    node.netns.ip(&["link", "add", &nic, "mtu", "1400", "type", "veth", "peer", "name", &peer]);
    let include = format!("{}x*", node.netns.prefix);
    let _daemon = node.start_daemon_with("node.log", &["--include-interfaces", &include]);
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "nic");
    let config = json!({"mode": "host-device", "interface": {"mtu": 1300},
        "ipam": {"addresses": ["192.0.2.10/24"]}});
    let uid = node.allocated_claim_on("nic-net", &sandbox, &nic, config);
    assert_eq!(node.prepare("nic-net", &uid).error, "", "{}", node.log("node.log"));
    // The prepare's durable record cost the state dir at least one fdatasync.
    assert!(node.metric("netclaim_store_syncs_total ") >= 1.0, "no store sync counted");

    let syncs = |node: &Node| node.metric(r#"netclaim_slice_syncs_total{result="success"}"#);
    let before = syncs(&node);
    node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).unwrap();
    assert_eq!(pod_ipv4(&pod_netns, "net1").as_deref(), Some("192.0.2.10/24"));
    assert_eq!(host_link(&pod_netns, "net1").unwrap()["mtu"], 1300);
    assert!(host_link(&node.netns, &nic).is_none(), "moved out of the node netns");
    // The move is a link change: wait for the publication round it triggers, then the NIC
    // must still be published (DESIGN §5.1).
    let started = Instant::now();
    while syncs(&node) <= before {
        assert!(started.elapsed() < PATIENCE, "no publication after the move");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        published(&node, &nic),
        "the NIC left the slices while in the pod:\n{}",
        node.log("node.log")
    );
    node.wait_for_status("nic-net", "True", "NetworkReady", "node.log");

    node.runtime
        .block_on(node.nri().stop_pod_sandbox(&PodSandbox { netns_path: None, ..sandbox.clone() }))
        .unwrap();
    let back = host_link(&node.netns, &nic).expect("the NIC is back under its host name");
    assert_eq!(back["mtu"], 1400);
    assert!(back.get("ifalias").is_none_or(|a| a.as_str() == Some("")), "{back}");
    assert!(host_link(&pod_netns, "net1").is_none());
    assert!(published(&node, &nic));
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_failed_attach_fails_the_sandbox_reports_why_and_create_container_retries() {
    if !require_root("a_failed_attach_fails_the_sandbox_reports_why_and_create_container_retries") {
        return;
    }
    let node = Node::start();
    let _daemon = node.start_daemon("node.log");
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "busy");
    let uid = node.allocated_claim("busy-net", &sandbox, "10.79.0.0/24");
    assert_eq!(node.prepare("busy-net", &uid).error, "", "{}", node.log("node.log"));
    // The pod already has a net1: the kernel refuses the name (EEXIST).
    let peer = pod_netns.ifname("q");
    pod_netns.ip(&["link", "add", "net1", "type", "veth", "peer", "name", &peer]);

    let refused = node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).unwrap_err();
    let message = refused.to_string();
    for part in ["claim default/busy-net", "already has an interface named net1", "errno 17"] {
        assert!(message.contains(part), "{part:?} missing in {message}");
    }
    let claim = node.wait_for_status("busy-net", "False", "AttachFailed", "node.log");
    let condition =
        &claim.status.as_ref().unwrap().devices.as_ref().unwrap()[0].conditions.as_ref().unwrap()
            [0];
    assert!(condition.message.contains("net1"), "{}", condition.message);
    let pod_uid = sandbox.uid.clone();
    let started = Instant::now();
    loop {
        let uid = pod_uid.clone();
        let reasons = node.api(move |client| async move {
            let api: Api<k8s_openapi::api::events::v1::Event> = Api::all(client);
            let events = api.list(&kube::api::ListParams::default()).await.unwrap().items;
            events
                .into_iter()
                .filter(|e| {
                    e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == Some(uid.as_str())
                })
                .map(|e| (e.type_, e.reason))
                .collect::<Vec<_>>()
        });
        if reasons.contains(&(Some("Warning".to_owned()), Some("AttachFailed".to_owned()))) {
            break;
        }
        assert!(started.elapsed() < PATIENCE, "no Warning Event on the pod: {reasons:?}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The name is free again; the runtime (or kubelet's retry) creates a container: the
    // plugin attaches first, then lets it through.
    pod_netns.ip(&["link", "del", "net1"]);
    let container = nri_rs::Container {
        id: "c1".into(),
        pod_sandbox_id: sandbox.id.clone(),
        name: "app".into(),
    };
    node.runtime.block_on(node.nri().create_container(&sandbox, &container)).unwrap();
    assert!(pod_ipv4(&pod_netns, "net1").is_some_and(|a| a.starts_with("10.79.0.")));
    node.wait_for_status("busy-net", "True", "NetworkReady", "node.log");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn unprepare_of_a_claim_still_in_a_pod_detaches_it_and_frees_the_address() {
    if !require_root("unprepare_of_a_claim_still_in_a_pod_detaches_it_and_frees_the_address") {
        return;
    }
    let node = Node::start();
    let _daemon = node.start_daemon("node.log");
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "forced");
    let uid = node.allocated_claim("forced-net", &sandbox, "10.80.0.0/24");
    assert_eq!(node.prepare("forced-net", &uid).error, "", "{}", node.log("node.log"));
    node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).unwrap();
    assert!(pod_ipv4(&pod_netns, "net1").is_some());
    let leased = r#"netclaim_ipam_addresses{pool="10.80.0.0/24",state="leased"}"#;
    assert!((node.metric(leased) - 1.0).abs() < f64::EPSILON);

    // The pod was force-deleted: no StopPodSandbox, kubelet unprepares the claim.
    assert_eq!(node.unprepare("forced-net", &uid), "", "{}", node.log("node.log"));
    assert_eq!(pod_ipv4(&pod_netns, "net1"), None, "detached before the claim was released");
    assert!(node.metric(leased).abs() < f64::EPSILON);
}

/// Waits for a daemon armed with a crash point to die; `false` if it is still running.
fn died(daemon: &mut Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if daemon.child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
#[ignore = "needs root and the daemon built with --features failpoints: run `make test` as root"]
fn kill_9_at_each_crash_point_loses_nothing_and_leaks_nothing() {
    if !require_root("kill_9_at_each_crash_point_loses_nothing_and_leaks_nothing") {
        return;
    }
    let leased = r#"netclaim_ipam_addresses{pool="10.79.0.0/24",state="leased"}"#;
    // Every point of the claim's life where a crash leaves a half-done durable state.
    for point in [
        "claims.prepare.before_commit",
        "attach.after_record",
        "podnet.attach.after_step@1",
        "podnet.attach.after_step@2",
        "attach.before_results",
        "attach.stop.after_quiesce",
        "podnet.detach.after_step@1",
        "claims.unprepare.after_commit",
    ] {
        let node = Node::start();
        let pod_netns = Netns::new();
        let sandbox = pod(&pod_netns, "web");
        let mut daemon = node.start_daemon_env("crash.log", &[], &[("NETCLAIM_CRASH_AT", point)]);
        let uid = node.allocated_claim("web-net", &sandbox, "10.79.0.0/24");
        let mut crashed = false;
        // The life of the claim, step by step, until the daemon dies at `point`; after the
        // crash a second daemon starts and the step is retried, as kubelet and the runtime do.
        for step in ["prepare", "run", "stop", "unprepare"] {
            let outcome = match step {
                "prepare" => node.try_dra(true, "web-net", &uid).map(|e| e.is_empty()),
                "run" => Ok(node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox)).is_ok()),
                "stop" => Ok(node.runtime.block_on(node.nri().stop_pod_sandbox(&sandbox)).is_ok()),
                _ => node.try_dra(false, "web-net", &uid).map(|e| e.is_empty()),
            };
            if !crashed && died(&mut daemon) {
                crashed = true;
                println!("{point}: the daemon died during {step} ({outcome:?})");
                daemon = node.start_daemon(&format!("after-{step}.log"));
                let retried = match step {
                    "prepare" => node.try_dra(true, "web-net", &uid),
                    "unprepare" => node.try_dra(false, "web-net", &uid),
                    // The runtime keeps the sandbox; the restarted daemon's Synchronize
                    // reconciles it (attach finished, or detach finished at stop).
                    "run" => Ok(String::new()),
                    _ => Ok(node
                        .runtime
                        .block_on(node.nri().stop_pod_sandbox(&sandbox))
                        .err()
                        .map(|e| e.to_string())
                        .unwrap_or_default()),
                };
                assert_eq!(retried, Ok(String::new()), "{point}: retry of {step}");
            } else {
                assert_eq!(outcome, Ok(true), "{point}: {step}:\n{}", node.log("crash.log"));
            }
            let log = if crashed { format!("after-{step}.log") } else { "crash.log".to_owned() };
            match step {
                "prepare" => assert_eq!(node.metric(leased).to_string(), "1", "{point}: one lease"),
                "run" => {
                    let deadline = Instant::now() + PATIENCE;
                    let address = loop {
                        if let Some(address) = pod_ipv4(&pod_netns, "net1") {
                            break address;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "{point}: not attached:\n{}",
                            node.log(&log)
                        );
                        std::thread::sleep(Duration::from_millis(20));
                    };
                    let links = pod_links(&pod_netns);
                    assert_eq!(links.len(), 2, "{point}: lo and one net1: {links:?}");
                    let claim = node.wait_for_status("web-net", "True", "NetworkReady", &log);
                    assert_eq!(network_ips(&claim), [address], "{point}");
                    assert_eq!(node.metric(leased).to_string(), "1", "{point}: still one lease");
                }
                "stop" => {
                    let deadline = Instant::now() + PATIENCE;
                    while pod_ipv4(&pod_netns, "net1").is_some() {
                        assert!(
                            Instant::now() < deadline,
                            "{point}: net1 left:\n{}",
                            node.log(&log)
                        );
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
                _ => {
                    assert_eq!(
                        node.metric(leased).to_string(),
                        "0",
                        "{point}: the lease is released"
                    );
                    // ...and only after the link that carried the address is gone.
                    let links = pod_links(&pod_netns);
                    assert_eq!(links.len(), 1, "{point}: only lo is left: {links:?}");
                }
            }
        }
        assert!(crashed, "{point}: the daemon never reached its crash point");
        drop(daemon);
    }
}
