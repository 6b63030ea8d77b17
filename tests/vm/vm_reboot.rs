//! A node reboot (issue 31 item 2, DESIGN §6 "Reboots"): two boots of the guest share a
//! host directory (`NETCLAIM_VM_SHARE`, mounted writable by `vmtests/run.sh`; the guest's
//! `/tmp` is an overlay that dies with each boot) holding the daemon's state dir and kubelet's
//! registry and plugin dirs, as `/var/lib` survives a real reboot; the NRI socket, the CDI dir
//! and every netns, link and VF are per boot, as `/run` and the kernel are. The one test runs
//! twice, once per boot, `NETCLAIM_VM_REBOOT_PHASE` (1 or 2) saying which;
//! `vmtests/after-nextest.sh` boots phase 2 only after phase 1 passed.
//!
//! Boot 1: the real `netclaim node` in the guest's root netns (an `sriov-vf` claim's settings
//! go through its PF, which a daemon in a netns of its own cannot see), with the dev API
//! server, prepares four claims over `dra.sock` and attaches them at our NRI runtime's
//! sandbox events: a macvlan and two macvlans on VLANs 7 and 9 (8021q sub-interfaces of the veth
//! parent), and VF 0 of the first igb PF as `sriov-vf` (MAC, VLAN + `QoS`, spoof
//! checking off, trust on), each in a pod of its own. Then the power goes: the daemon is killed, nothing is
//! stopped or unprepared, and the guest ends.
//!
//! Boot 2: the PFs are renamed (the first PF gets a new name, the second takes the first's
//! old one: a record that names VFs by PF name would now rewrite the second PF's VF), the VFs
//! are created again (`sriov_numvfs` does not survive a reboot) and given boot-time settings
//! that differ from boot 1's and from the claim's, and an administrator makes a VLAN 9 link
//! under the very name the daemon's sub-interface had in boot 1. There is no API server: the
//! dev API server keeps everything in memory and died with boot 1. That is enough because
//! kubelet's repeated prepare after a reboot is answered from our record, never from the
//! API, and a claim whose API server does not answer is never released as gone (a fresh,
//! empty API server would instead answer 404 and the daemon would rightly release the
//! claims; a real cluster's API server keeps them). Checked: each repeated prepare answers
//! what boot 1 answered; the pods' new sandboxes (same pod UIDs, new sandbox ids and netns)
//! get their interfaces again, the VLAN 7 sub-interface made again, the administrator's VLAN 9
//! link used and never deleted; the VF, found by its PCI address under its renamed PF, gets
//! the claim's settings when it moves into the pod (read back with `ip -j link` on the PF,
//! whose `vfinfo_list` is iproute2's own dump), the second PF's VF keeps its boot-time
//! settings throughout, and unprepare leaves the first VF with the values this boot gave
//! it (the "before" values of boot 1 are stale: restoring them would undo the boot's own
//! configuration).
//!
//! Runs only inside the VM (`NETCLAIM_VM=1`); nextest leaves the binary out.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};
use std::time::Instant;

use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use nri_rs::PodSandbox;
use serde_json::{Value, json};

use crate::kit::daemon::{Node, host_link, pod, pod_ipv4};
use crate::kit::netns::{Netns, unique_prefix};
use crate::kit::vm::{Vfs, ip, netdevs_of, report, require_vm};
use crate::vm_daemon::{kind_of, pings, register_as_kubelet, stop_pod, wait_published};

/// The claim's VF settings, and the boot-time ones of boot 2 (each field different from the
/// claim's and from what a fresh igb VF reports in boot 1: no MAC, no VLAN, spoof checking on,
/// trust off).
const CLAIM_MAC: &str = "02:00:00:00:c1:01";
const CLAIM_VLAN: u64 = 100;
const CLAIM_QOS: u64 = 2;
const BOOT_MAC_A: &str = "02:00:00:00:b2:01";
const BOOT_VLAN_A: &str = "42";
const BOOT_MAC_B: &str = "02:00:00:00:b2:02";
const BOOT_VLAN_B: &str = "43";

/// The shared host directory, as the guest sees it.
fn share() -> PathBuf {
    let share = std::env::var("NETCLAIM_VM_SHARE")
        .expect("NETCLAIM_VM_SHARE: the host directory both boots share (vmtests/run.sh)");
    PathBuf::from(share)
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim().to_owned()
}

/// The PCI address of netdev `name` (`/sys/class/net/<name>/device`).
fn pci_of(name: &str) -> String {
    let target = std::fs::read_link(format!("/sys/class/net/{name}/device")).unwrap();
    target.file_name().unwrap().to_string_lossy().into_owned()
}

/// The netdev of PCI function `pci`.
fn netdev_of(pci: &str) -> String {
    let mut entries = std::fs::read_dir(format!("/sys/bus/pci/devices/{pci}/net")).unwrap();
    entries.next().unwrap().unwrap().file_name().to_string_lossy().into_owned()
}

/// `ip -j link show dev <name>`'s one link.
fn link_json(name: &str) -> Value {
    let output = std::process::Command::new("ip")
        .args(["-j", "link", "show", "dev", name])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "ip link show {name}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Value>(&output.stdout).unwrap()[0].clone()
}

/// VF `index`'s entry of `pf`'s `vfinfo_list` as iproute2 reads it, without counters.
fn vf_settings(pf: &str, index: u64) -> Value {
    let output =
        std::process::Command::new("ip").args(["-j", "link", "show", "dev", pf]).output().unwrap();
    let link: Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut entry = link[0]["vfinfo_list"]
        .as_array()
        .unwrap_or_else(|| panic!("no vfinfo_list on {pf}: {link}"))
        .iter()
        .find(|vf| vf["vf"] == index)
        .unwrap_or_else(|| panic!("no VF {index} on {pf}: {link}"))
        .clone();
    entry.as_object_mut().unwrap().remove("stats");
    entry
}

/// (VLAN id, `QoS`) of a `vfinfo_list` entry (iproute2 prints `vlan_list` where the kernel
/// sends `IFLA_VF_VLAN_LIST`, else `vlan`/`qos`).
fn vf_vlan(entry: &Value) -> (Value, Value) {
    let vlan = entry["vlan_list"].as_array().map_or(entry, |list| &list[0]);
    (vlan["vlan"].clone(), vlan["qos"].clone())
}

/// The node in the guest's root netns (named with `ip netns attach` so the kit's helpers can
/// address it), its per-boot files in a temp dir of the guest's `/tmp` and its state and
/// kubelet dirs linked into the shared directory. The veth parent and its peer are named
/// from `prefix`, the same in both boots, as a node's NIC keeps its name.
fn node(share: &Path, prefix: &str, api: bool) -> Node {
    let root = Netns { name: format!("{prefix}-root"), prefix: prefix.to_owned() };
    ip(&["netns", "attach", &root.name, &std::process::id().to_string()]);
    let dir = tempfile::tempdir().unwrap();
    for shared in ["state", "registry", "plugin"] {
        std::fs::create_dir_all(share.join(shared)).unwrap();
        std::os::unix::fs::symlink(share.join(shared), dir.path().join(shared)).unwrap();
    }
    if !api {
        // Boot 1's kubeconfig: its server died with that boot.
        std::fs::copy(share.join("kubeconfig"), dir.path().join("kubeconfig")).unwrap();
    }
    let node = Node::start_in(root, dir, api);
    // The far ends: the parent's peer, with a VLAN 7 and a VLAN 9 link (kernel state, made
    // again in each boot).
    let peer = node.netns.ifname("p1");
    node.netns.ip(&["addr", "add", "10.79.0.1/24", "dev", &peer]);
    for (id, address) in [("7", "10.81.0.1/24"), ("9", "10.82.0.1/24")] {
        let far = node.netns.ifname(&format!("p1v{id}"));
        node.netns.ip(&["link", "add", "link", &peer, "name", &far, "type", "vlan", "id", id]);
        node.netns.ip(&["addr", "add", address, "dev", &far]);
        node.netns.ip(&["link", "set", &far, "up"]);
    }
    node
}

/// The VLAN links on `parent` in the root netns: (name, id, alias).
fn vlans_on(parent: &str) -> Vec<(String, u64, String)> {
    let output = std::process::Command::new("ip")
        .args(["-d", "-j", "link", "show", "type", "vlan"])
        .output();
    let links: Vec<Value> = serde_json::from_slice(&output.unwrap().stdout).unwrap();
    links
        .iter()
        .filter(|l| l["link"].as_str() == Some(parent))
        .map(|l| {
            (
                l["ifname"].as_str().unwrap().to_owned(),
                l["linkinfo"]["info_data"]["id"].as_u64().unwrap(),
                l["ifalias"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// The shared parent's claims, one pod each (a pod of its own keeps each `RunPodSandbox`
/// within the NRI request timeout under TCG): (claim, pod, interface in the pod, address, far
/// end).
const NETS: [(&str, &str, &str, &str, &str); 3] = [
    ("mv-net", "mv", "mv0", "10.79.0.10/24", "10.79.0.1"),
    ("v7-net", "v7", "v7", "10.81.0.10/24", "10.81.0.1"),
    ("v9-net", "v9", "v9", "10.82.0.10/24", "10.82.0.1"),
];

/// Every claim: (claim, pod, config).
fn claims() -> Vec<(&'static str, &'static str, Value)> {
    let mut claims: Vec<_> = NETS
        .iter()
        .map(|&(claim, pod, ifname, address, _)| {
            let mut config = json!({"mode": "macvlan", "interface": {"name": ifname},
                "ipam": {"addresses": [address]}});
            match pod {
                "v7" => config["vlan"] = json!(7),
                "v9" => config["vlan"] = json!(9),
                _ => {}
            }
            (claim, pod, config)
        })
        .collect();
    claims.push((
        "vf-net",
        "vf",
        json!({"mode": "sriov-vf",
            "interface": {"name": "vf0", "hardwareAddress": CLAIM_MAC}, "vlan": CLAIM_VLAN,
            "sriov": {"qos": CLAIM_QOS, "spoofCheck": false, "trust": true},
            "ipam": {"addresses": ["192.0.2.10/24"]}}),
    ));
    claims
}

/// A prepare answer as JSON, to compare the two boots'.
fn answer(response: &v1::NodePrepareResourceResponse) -> Value {
    let devices: Vec<Value> = response
        .devices
        .iter()
        .map(|d| {
            json!({"requests": d.request_names, "pool": d.pool_name, "device": d.device_name,
                "cdi": d.cdi_device_ids})
        })
        .collect();
    json!({"devices": devices, "error": response.error})
}

/// Runs the sandbox of each shared-parent pod and checks its interface: kind, address, a
/// ping to its far end. Returns the names of the VLAN 7 and 9 links the macvlans sit on.
fn run_nets(node: &Node, pods: &[(PodSandbox, Netns)], log: &str) -> (String, String) {
    for ((sandbox, pod_netns), (_, _, name, address, far)) in pods.iter().zip(NETS) {
        run_sandbox(node, sandbox, log);
        let link = host_link(pod_netns, name)
            .unwrap_or_else(|| panic!("{name} in the pod\n{}", node.log(log)));
        assert_eq!(kind_of(&link), "macvlan", "{link}");
        assert_eq!(pod_ipv4(pod_netns, name).as_deref(), Some(address), "{name}");
        assert!(pings(pod_netns, far), "{name} reaches {far}");
    }
    let vlans = vlans_on(&node.parent);
    let named = |id: u64| {
        vlans
            .iter()
            .find(|(_, i, _)| *i == id)
            .unwrap_or_else(|| panic!("no VLAN {id} link on {}: {vlans:?}", node.parent))
            .0
            .clone()
    };
    (named(7), named(9))
}

/// The VF pod's `vf0`: the VF's PCI function, its address.
fn check_vf_in_pod(node: &Node, pod_netns: &Netns, vf_pci: &str, log: &str) -> Value {
    let link =
        host_link(pod_netns, "vf0").unwrap_or_else(|| panic!("vf0 in the pod\n{}", node.log(log)));
    assert_eq!(link["parentdev"].as_str(), Some(vf_pci), "{link}");
    assert_eq!(pod_ipv4(pod_netns, "vf0").as_deref(), Some("192.0.2.10/24"), "{link}");
    link
}

/// The claim's settings on the PF's view of the VF.
fn assert_claim_settings(pf: &str, entry: &Value) {
    assert_eq!(entry["address"], CLAIM_MAC, "{pf}: {entry}");
    assert_eq!(vf_vlan(entry), (json!(CLAIM_VLAN), json!(CLAIM_QOS)), "{pf}: {entry}");
    assert_eq!(entry["spoofchk"], false, "{pf}: {entry}");
    assert_eq!(entry["trust"], true, "{pf}: {entry}");
}

fn run_sandbox(node: &Node, sandbox: &PodSandbox, log: &str) {
    let started = Instant::now();
    let ran = node.runtime.block_on(node.nri().run_pod_sandbox(sandbox));
    report(&format!(
        "vm_reboot: RunPodSandbox {} answered in {:?}",
        sandbox.name,
        started.elapsed()
    ));
    assert!(ran.is_ok(), "{ran:?}\n{}", node.log(log));
}

fn boot_1(share: &Path) {
    let pfs = netdevs_of("igb");
    assert_eq!(pfs.len(), 2, "two igb PFs: {pfs:?}");
    let (pf_a, pf_b) = (pfs[0].clone(), pfs[1].clone());
    let vfs = Vfs::create_on(&pf_a, 1);
    let (vf, vf_pci) = (vfs.names[0].clone(), vfs.pci[0].clone());
    let before = vf_settings(&pf_a, 0);
    report(&format!(
        "vm_reboot: boot 1 {}: VF 0 of {pf_a} ({vf}, {vf_pci}) before: {before}",
        boot_id()
    ));
    let prefix = unique_prefix();
    let started = Instant::now();
    let node = node(share, &prefix, true);
    std::fs::copy(node.kubeconfig(), share.join("kubeconfig")).unwrap();
    report(&format!("vm_reboot: API server up after {:?}", started.elapsed()));
    let daemon = node.start_daemon("node.log");
    register_as_kubelet(&node);
    wait_published(&node, &node.parent, "node.log");
    wait_published(&node, &vf, "node.log");

    let nets: Vec<(PodSandbox, Netns)> = NETS
        .iter()
        .map(|&(_, name, ..)| {
            let netns = Netns::new();
            (pod(&netns, name), netns)
        })
        .collect();
    let vf_ns = Netns::new();
    let vf_pod = pod(&vf_ns, "vf");
    let mut prepared = vec![];
    for (name, pod_name, config) in claims() {
        let (sandbox, device) = match nets.iter().find(|(p, _)| p.name == pod_name) {
            Some((sandbox, _)) => (sandbox, node.parent.clone()),
            None => (&vf_pod, vf.clone()),
        };
        let uid = node.allocated_claim_on(name, sandbox, &device, config);
        let response = node.prepare(name, &uid);
        assert_eq!(response.error, "", "{name}: {}", node.log("node.log"));
        prepared.push(json!({"name": name, "uid": uid, "answer": answer(&response)}));
    }
    let (vlan7, vlan9) = run_nets(&node, &nets, "node.log");
    for name in [&vlan7, &vlan9] {
        let (_, _, alias) = vlans_on(&node.parent).into_iter().find(|(n, ..)| n == name).unwrap();
        assert!(alias.starts_with("netclaim.dev/vlan"), "{name} is ours: {alias:?}");
    }
    run_sandbox(&node, &vf_pod, "node.log");
    let inside = check_vf_in_pod(&node, &vf_ns, &vf_pci, "node.log");
    let entry = vf_settings(&pf_a, 0);
    assert_claim_settings(&pf_a, &entry);
    report(&format!("vm_reboot: boot 1: VF in the pod {}, {pf_a} VF 0 {entry}", inside["address"]));

    let facts = json!({
        "bootId": boot_id(), "prefix": prefix, "parent": node.parent,
        "pfA": {"name": pf_a, "pci": pci_of(&pf_a)}, "pfB": {"name": pf_b, "pci": pci_of(&pf_b)},
        "vf": {"name": vf, "pci": vf_pci}, "vlan7": vlan7, "vlan9": vlan9,
        "pods": nets.iter().map(|(p, _)| p).chain([&vf_pod])
            .map(|p| (p.name.clone(), json!(p.uid))).collect::<serde_json::Map<_, _>>(),
        "claims": prepared,
    });
    std::fs::write(share.join("facts.json"), serde_json::to_vec_pretty(&facts).unwrap()).unwrap();
    report(&format!("vm_reboot: boot 1 facts {facts}"));
    // The power goes: the daemon gets no SIGTERM, no pod stops, nothing is unprepared.
    drop(daemon);
    std::mem::forget((nets, vf_ns, vfs));
    drop(node);
}

/// A new sandbox of boot 1's pod `which`: the same pod UID, a new sandbox id and netns.
fn sandbox_again(facts: &Value, which: &str, netns: &Netns) -> PodSandbox {
    let fresh = pod(netns, which);
    PodSandbox { uid: facts["pods"][which].as_str().unwrap().to_owned(), ..fresh }
}

fn claim_of<'a>(facts: &'a Value, name: &str) -> &'a Value {
    facts["claims"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap()
}

#[allow(clippy::too_many_lines, reason = "one boot's story, told in order")]
fn boot_2(share: &Path) {
    let facts: Value =
        serde_json::from_slice(&std::fs::read(share.join("facts.json")).unwrap()).unwrap();
    assert_ne!(facts["bootId"], boot_id(), "a second boot");
    let text = |v: &Value| v.as_str().unwrap().to_owned();
    let (old_a, pci_a, pci_b) =
        (text(&facts["pfA"]["name"]), text(&facts["pfA"]["pci"]), text(&facts["pfB"]["pci"]));
    let prefix = text(&facts["prefix"]);
    // The boot names the PFs otherwise: A gets a new name, B takes A's old one.
    let new_a = format!("{prefix}pfa");
    let (pf_a, pf_b) = (netdev_of(&pci_a), netdev_of(&pci_b));
    for (from, to) in [(&pf_a, &new_a), (&pf_b, &old_a)] {
        ip(&["link", "set", from, "down"]);
        ip(&["link", "set", from, "name", to]);
        // udev keeps a renamed NIC's predictable name as an altname, and altnames share the
        // name space: A's old name is free for B only once A's altname of it is dropped.
        let settled =
            std::process::Command::new("udevadm").args(["settle", "--timeout=30"]).status();
        assert!(settled.unwrap().success(), "udevadm settle");
        if link_json(to)["altnames"]
            .as_array()
            .is_some_and(|a| a.iter().any(|n| n == from.as_str()))
        {
            ip(&["link", "property", "del", "dev", to, "altname", from]);
        }
    }
    let pf_b = old_a;
    let vfs_a = Vfs::create_on(&new_a, 1);
    let vfs_b = Vfs::create_on(&pf_b, 1);
    assert_eq!(vfs_a.pci[0], text(&facts["vf"]["pci"]), "the same PCI function as in boot 1");
    // What this boot configures on the VFs, before the daemon runs.
    for (pf, mac, vlan) in [(&new_a, BOOT_MAC_A, BOOT_VLAN_A), (&pf_b, BOOT_MAC_B, BOOT_VLAN_B)] {
        ip(&["link", "set", "dev", pf, "vf", "0", "mac", mac, "vlan", vlan, "qos", "1"]);
    }
    let (boot_a, boot_b) = (vf_settings(&new_a, 0), vf_settings(&pf_b, 0));
    report(&format!(
        "vm_reboot: boot 2 {}: {new_a} ({pci_a}) VF 0 at boot {boot_a}; {pf_b} ({pci_b}) VF 0 at boot {boot_b}",
        boot_id()
    ));

    let node = node(share, &prefix, false);
    assert_eq!(node.parent, text(&facts["parent"]));
    // The administrator's VLAN 9 link, under the name our sub-interface had in boot 1.
    let admin = text(&facts["vlan9"]);
    ip(&["link", "add", "link", &node.parent, "name", &admin, "type", "vlan", "id", "9"]);
    ip(&["link", "set", &admin, "up"]);
    let started = Instant::now();
    let daemon = node.start_daemon("node.log");
    register_as_kubelet(&node);
    report(&format!(
        "vm_reboot: boot 2: daemon registered after {:?} (no API server)",
        started.elapsed()
    ));

    // kubelet's repeated prepare, answered from the record.
    for (name, ..) in claims() {
        let claim = claim_of(&facts, name);
        let response = node.prepare(name, claim["uid"].as_str().unwrap());
        assert_eq!(
            answer(&response),
            claim["answer"],
            "{name}: as in boot 1\n{}",
            node.log("node.log")
        );
    }
    report("vm_reboot: boot 2: the four repeated prepares answered as in boot 1");
    let cdi = defined_cdi_ids(&node.dir.path().join("cdi"));
    for (name, ..) in claims() {
        for id in claim_of(&facts, name)["answer"]["devices"][0]["cdi"].as_array().unwrap() {
            assert!(
                cdi.iter().any(|d| d == id),
                "{name}: CDI device {id} defined in this boot: {cdi:?}"
            );
        }
    }

    let nets: Vec<(PodSandbox, Netns)> = NETS
        .iter()
        .map(|&(_, name, ..)| {
            let netns = Netns::new();
            (sandbox_again(&facts, name, &netns), netns)
        })
        .collect();
    let (vlan7, vlan9) = run_nets(&node, &nets, "node.log");
    assert_eq!(vlan9, admin, "the administrator's VLAN 9 link carries the pod's VLAN 9");
    let on_parent = vlans_on(&node.parent);
    report(&format!(
        "vm_reboot: boot 2: VLAN links on {} with the pods: {on_parent:?}",
        node.parent
    ));
    let alias =
        |name: &str| vlans_on(&node.parent).into_iter().find(|(n, ..)| n == name).map(|l| l.2);
    assert!(
        alias(&vlan7).unwrap().starts_with("netclaim.dev/vlan"),
        "VLAN 7 made again: {on_parent:?}"
    );
    assert_eq!(alias(&admin).as_deref(), Some(""), "the administrator's link is left as made");
    for (sandbox, _) in &nets {
        stop_pod(&node, sandbox);
    }
    assert!(alias(&vlan7).is_none(), "our VLAN 7 sub-interface goes with its last pod");
    for name in ["mv-net", "v7-net", "v9-net"] {
        let uid = claim_of(&facts, name)["uid"].as_str().unwrap().to_owned();
        assert_eq!(node.unprepare(name, &uid), "", "{}", node.log("node.log"));
    }
    assert_eq!(alias(&admin).as_deref(), Some(""), "the administrator's link survives");
    report("vm_reboot: boot 2: macvlan and VLAN claims attached again, stopped and unprepared");

    let vf_ns = Netns::new();
    let vf_pod = sandbox_again(&facts, "vf", &vf_ns);
    run_sandbox(&node, &vf_pod, "node.log");
    let inside = check_vf_in_pod(&node, &vf_ns, &vfs_a.pci[0], "node.log");
    let (entry_a, entry_b) = (vf_settings(&new_a, 0), vf_settings(&pf_b, 0));
    report(&format!(
        "vm_reboot: boot 2: VF in the pod {}; {new_a} VF 0 {entry_a}; {pf_b} VF 0 {entry_b}",
        inside["address"]
    ));
    assert_claim_settings(&new_a, &entry_a);
    assert_eq!(entry_b, boot_b, "the other PF's VF 0 is not touched");
    stop_pod(&node, &vf_pod);
    let uid = claim_of(&facts, "vf-net")["uid"].as_str().unwrap().to_owned();
    assert_eq!(node.unprepare("vf-net", &uid), "", "{}", node.log("node.log"));
    let (after_a, after_b) = (vf_settings(&new_a, 0), vf_settings(&pf_b, 0));
    report(&format!(
        "vm_reboot: boot 2: after unprepare {new_a} VF 0 {after_a}; {pf_b} VF 0 {after_b}"
    ));
    assert_eq!(after_a, boot_a, "unprepare leaves the VF as this boot configured it");
    assert_eq!(after_b, boot_b, "the other PF's VF 0 is not touched");
    let log = node.log("node.log");
    for line in log.lines().filter(|l| l.contains("boot")) {
        report(&format!("vm_reboot: node.log: {line}"));
    }
    drop(daemon);
    drop(node);
    drop((vf_ns, nets, vfs_a, vfs_b));
}

/// The CDI device ids the spec files in `dir` define (`<kind>=<device name>`).
fn defined_cdi_ids(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut ids = vec![];
    for entry in entries {
        let Ok(spec) =
            serde_json::from_slice::<Value>(&std::fs::read(entry.unwrap().path()).unwrap())
        else {
            continue;
        };
        for device in spec["devices"].as_array().into_iter().flatten() {
            ids.push(format!(
                "{}={}",
                spec["kind"].as_str().unwrap_or(""),
                device["name"].as_str().unwrap_or("")
            ));
        }
    }
    ids
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn vf_macvlan_and_vlan_claims_come_back_after_a_reboot_with_the_pf_renamed() {
    require_vm("vf_macvlan_and_vlan_claims_come_back_after_a_reboot_with_the_pf_renamed");
    let share = share();
    match std::env::var("NETCLAIM_VM_REBOOT_PHASE").as_deref() {
        Ok("1") => boot_1(&share),
        Ok("2") => boot_2(&share),
        other => panic!("NETCLAIM_VM_REBOOT_PHASE is {other:?}: 1 or 2 (vmtests/after-nextest.sh)"),
    }
}
