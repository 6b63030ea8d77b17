//! RDMA discovery against a real kernel (issue 33 items 1 and 4, decision 0019): soft-RoCE
//! (`rdma_rxe`) on a veth of the guest's root netns, created with generated names and deleted
//! even when a test fails. Our RDMA netlink codec (`crates/rdma-netlink`) is checked against
//! what iproute2's `rdma -j dev`, `rdma -j link` and `rdma system` print for the same
//! kernel, the discovery (`host::rdma` through `host::discovery`) and the published
//! attributes against the same answers and sysfs, and the RDMA uevents that keep the
//! inventory live against an add and a delete. The CI host has no RDMA modules, so these run
//! only inside the VM, where `vmtests/guest.sh` sets `NETCLAIM_VM=1`; nextest leaves this
//! binary out (`.config/nextest.toml`), and run on a host anyway they fail rather than pass.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]
#![allow(
    clippy::disallowed_methods,
    reason = "the test opens the RDMA netlink socket itself, to check the codec"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use netclaim::host::discovery::discover;
use netclaim::host::rdma_events;
use netclaim::host::sysfs::Sysfs;
use netclaim::inventory::{Inventory, Selection, SharingMode};
use netclaim::model::device::HostInterface;
use netclaim::model::rdma::{RdmaLinkLayer, RdmaNetnsMode, format_guid};
use rdma_netlink::{RdmaSocket, node_type_name, phys_state_name, port_state_name};
use serde_json::Value;

use crate::kit::vm::{ip, report, require_vm};

/// `rdma -j <args>`: the kernel's answer as iproute2 prints it.
fn rdma_json(args: &[&str]) -> Value {
    let output = Command::new("rdma").arg("-j").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "rdma -j {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!("rdma -j {args:?}: {err}: {:?}", String::from_utf8_lossy(&output.stdout))
    })
}

/// The netns mode `rdma system show` prints (`netns shared copy-on-fork on`; iproute2 6.1
/// prints this text even with `-j`, so the text is read).
fn rdma_system_netns() -> String {
    let output = rdma(&["system", "show"]);
    assert!(
        output.status.success(),
        "rdma system show: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "netns").unwrap_or_else(|| panic!("no netns in {text:?}"));
    words.next().unwrap_or_else(|| panic!("no netns value in {text:?}")).to_owned()
}

fn rdma(args: &[&str]) -> std::process::Output {
    Command::new("rdma").args(args).output().unwrap()
}

/// The RDMA modules: soft-RoCE, and the character-device clients (`uverbs`, `umad`,
/// `rdma_cm`) a pod needs.
fn load_modules() {
    let output = Command::new("modprobe")
        .args(["-a", "rdma_rxe", "ib_uverbs", "ib_umad", "rdma_ucm"])
        .output()
        .unwrap();
    assert!(output.status.success(), "modprobe: {}", String::from_utf8_lossy(&output.stderr));
}

/// A veth pair in the root netns and a soft-RoCE device on its first end, all with generated
/// names; everything is deleted on drop, test failure or not.
struct RxeLink {
    netdev: String,
    peer: String,
    device: String,
}

impl RxeLink {
    fn names() -> Self {
        let tag = format!("{:04x}", fastrand::u16(..));
        Self {
            netdev: format!("nrx{tag}a"),
            peer: format!("nrx{tag}b"),
            device: format!("nrx{tag}"),
        }
    }

    /// The veth pair only (the RDMA link is added by the test, through `rdma` or our codec).
    fn veth() -> Self {
        load_modules();
        let link = Self::names();
        ip(&["link", "add", &link.netdev, "type", "veth", "peer", "name", &link.peer]);
        ip(&["link", "set", &link.netdev, "up"]);
        ip(&["link", "set", &link.peer, "up"]);
        link
    }

    /// The veth pair and `rdma link add <device> type rxe netdev <netdev>`.
    fn with_rxe() -> Self {
        let link = Self::veth();
        let output = rdma(&["link", "add", &link.device, "type", "rxe", "netdev", &link.netdev]);
        assert!(
            output.status.success(),
            "rdma link add: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        link
    }

    fn ib_dir(&self) -> PathBuf {
        Path::new("/sys/class/infiniband").join(&self.device)
    }
}

impl Drop for RxeLink {
    fn drop(&mut self) {
        // Deleting the RDMA link first; a veth deleted under it also unregisters it.
        if self.ib_dir().exists() {
            let _ignored = rdma(&["link", "delete", &self.device]);
        }
        let _ignored = Command::new("ip").args(["link", "del", &self.netdev]).status();
    }
}

fn str_of<'a>(value: &'a Value, key: &str) -> &'a str {
    value[key].as_str().unwrap_or_else(|| panic!("{key} in {value}"))
}

fn u64_of(value: &Value, key: &str) -> u64 {
    value[key].as_u64().unwrap_or_else(|| panic!("{key} in {value}"))
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn the_codec_reads_what_the_rdma_tool_reads() {
    require_vm("the_codec_reads_what_the_rdma_tool_reads");
    let link = RxeLink::with_rxe();
    let mut socket = RdmaSocket::open().unwrap();

    // rdma -j dev show <dev>: [{ifindex, ifname, node_type, node_guid, sys_image_guid, ...}]
    let devices = socket.devices().unwrap();
    let ours = devices.iter().find(|d| d.name == link.device).unwrap_or_else(|| {
        panic!("{} not in the dump: {devices:?}", link.device);
    });
    let tool = &rdma_json(&["dev", "show", &link.device])[0];
    report(&format!("vm-rdma dev: codec {ours:?}; rdma {tool}"));
    assert_eq!(u64::from(ours.index), u64_of(tool, "ifindex"));
    assert_eq!(ours.name, str_of(tool, "ifname"));
    assert_eq!(ours.ports, 1, "rxe has one port");
    assert_eq!(ours.node_guid.map(format_guid).as_deref(), Some(str_of(tool, "node_guid")));
    assert_eq!(
        ours.sys_image_guid.map(format_guid).as_deref(),
        Some(str_of(tool, "sys_image_guid"))
    );
    assert_eq!(ours.node_type.map(node_type_name), Some(str_of(tool, "node_type")));
    // The whole dump lists what `rdma dev` lists, in the kernel's order.
    let all = rdma_json(&["dev"]);
    let names: Vec<&str> = all.as_array().unwrap().iter().map(|d| str_of(d, "ifname")).collect();
    let ours_names: Vec<&str> = devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(ours_names, names);

    // rdma -j link show <dev>/1: [{ifindex, ifname, port, state, physical_state, netdev,
    // netdev_index}]
    let ports = socket.ports(ours.index).unwrap();
    let tool = &rdma_json(&["link", "show", &format!("{}/1", link.device)])[0];
    report(&format!("vm-rdma link: codec {ports:?}; rdma {tool}"));
    assert_eq!(ports.len(), 1);
    let port = &ports[0];
    assert_eq!(u64::from(port.port), u64_of(tool, "port"));
    assert_eq!(port.device_name, link.device);
    assert_eq!(port.state.map(port_state_name), Some(str_of(tool, "state")));
    assert_eq!(port.phys_state.map(phys_state_name), Some(str_of(tool, "physical_state")));
    assert_eq!(port.netdev_name.as_deref(), Some(link.netdev.as_str()));
    assert_eq!(port.netdev_name.as_deref(), Some(str_of(tool, "netdev")));
    assert_eq!(port.netdev_index.map(u64::from), Some(u64_of(tool, "netdev_index")));

    // rdma system show: netns <mode> ...
    let mode = socket.netns_mode().unwrap();
    let tool = rdma_system_netns();
    report(&format!("vm-rdma system: codec netns mode {mode}; rdma netns {tool}"));
    let name = match mode {
        0 => "exclusive",
        1 => "shared",
        other => panic!("netns mode {other}"),
    };
    assert_eq!(name, tool);

    // A device index that does not exist: the kernel's refusal comes back with its errno.
    let missing = devices.iter().map(|d| d.index).max().unwrap() + 1000;
    let err = socket.ports(missing).unwrap_err();
    report(&format!("vm-rdma ports of index {missing}: {err}"));
    assert!(err.errno().is_some(), "{err}");
}

/// The node's interfaces as the daemon discovers them (netlink + sysfs + RDMA).
fn discover_now() -> Vec<HostInterface> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(discover(&Sysfs::default())).unwrap()
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn discovery_publishes_the_rdma_attributes_and_follows_add_and_delete() {
    require_vm("discovery_publishes_the_rdma_attributes_and_follows_add_and_delete");
    let link = RxeLink::veth();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (sender, mut uevents) = tokio::sync::mpsc::channel(1);
    runtime.block_on(async { rdma_events::forward(sender) }).unwrap();

    // Added through our codec (RDMA_NLDEV_CMD_NEWLINK), as `rdma link add` does.
    let mut socket = RdmaSocket::open().unwrap();
    socket.add_link(&link.device, "rxe", &link.netdev).unwrap();
    assert!(link.ib_dir().exists(), "{} registered", link.device);
    let woke = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), uevents.recv()).await });
    assert_eq!(woke, Ok(Some(())), "an RDMA uevent for the add");

    let interfaces = discover_now();
    let interface = interfaces.iter().find(|i| i.name == link.netdev).unwrap();
    let rdma = interface.rdma.as_ref().unwrap_or_else(|| panic!("no RDMA facts: {interface:?}"));
    report(&format!("vm-rdma facts of {}: {rdma:?}", link.netdev));
    let tool = &rdma_json(&["dev", "show", &link.device])[0];
    assert_eq!(rdma.device, link.device);
    assert_eq!(rdma.index.map(u64::from), Some(u64_of(tool, "ifindex")));
    assert_eq!(rdma.port, Some(1));
    assert_eq!(rdma.ports, 1);
    assert_eq!(rdma.link_layer, Some(RdmaLinkLayer::Ethernet), "soft-RoCE is Ethernet");
    assert_eq!(rdma.node_guid.as_deref(), Some(str_of(tool, "node_guid")));
    // The kernel's sysfs spelling is the same as rdma's.
    let sysfs_guid = std::fs::read_to_string(link.ib_dir().join("node_guid")).unwrap();
    assert_eq!(rdma.node_guid.as_deref(), Some(sysfs_guid.trim()));
    assert_eq!(rdma.pci_address, None, "rxe has no bus device");
    let system = rdma_system_netns();
    assert_eq!(rdma.netns_mode.map(RdmaNetnsMode::as_str), Some(system.as_str()));
    // Its uverbs and umad nodes (the kernel's own names) and rdma_cm, all present in /dev.
    let uverbs = find_class_entry("infiniband_verbs", "uverbs", &link.device);
    let umad = find_class_entry("infiniband_mad", "umad", &link.device);
    let expected: Vec<PathBuf> = [uverbs.as_str(), umad.as_str(), "rdma_cm"]
        .iter()
        .map(|name| Path::new("/dev/infiniband").join(name))
        .collect();
    assert_eq!(rdma.char_devices, expected);
    for node in &rdma.char_devices {
        assert!(node.exists(), "{} exists", node.display());
    }
    // The peer end has no RDMA function.
    assert_eq!(interfaces.iter().find(|i| i.name == link.peer).unwrap().rdma, None);

    // Published (a veth is published when named by --include-interfaces).
    let selection =
        Selection::new(std::slice::from_ref(&link.netdev), &[], &[], SharingMode::Capacity)
            .unwrap();
    let inventory = Inventory::build(&interfaces, &selection);
    let device = inventory.devices.iter().find(|d| d.if_name == link.netdev).unwrap();
    report(&format!("vm-rdma attributes: {:?}", device.attributes));
    let attribute = |name: &str| device.string_attribute(&format!("netclaim.dev/{name}"));
    assert_eq!(attribute("rdmaDevice"), Some(link.device.as_str()));
    assert_eq!(attribute("rdmaLinkLayer"), Some("Ethernet"));
    assert_eq!(attribute("rdmaNodeGuid"), Some(str_of(tool, "node_guid")));
    assert_eq!(attribute("rdmaNetnsMode"), Some(system.as_str()));
    assert_eq!(device.int_attribute("netclaim.dev/rdmaPorts"), Some(1));

    // Deleted through our codec (RDMA_NLDEV_CMD_DELLINK): a uevent, and gone from discovery.
    let index = rdma.index.unwrap();
    while uevents.try_recv().is_ok() {}
    socket.delete_link(index).unwrap();
    assert!(!link.ib_dir().exists(), "{} unregistered", link.device);
    let woke = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(20), uevents.recv()).await });
    assert_eq!(woke, Ok(Some(())), "an RDMA uevent for the delete");
    let interfaces = discover_now();
    let interface = interfaces.iter().find(|i| i.name == link.netdev).unwrap();
    assert_eq!(interface.rdma, None, "no RDMA function after the delete");
    let inventory = Inventory::build(&interfaces, &selection);
    let device = inventory.devices.iter().find(|d| d.if_name == link.netdev).unwrap();
    assert!(
        device.attributes.keys().all(|k| !k.contains("/rdma")),
        "no rdma attribute left: {:?}",
        device.attributes
    );
    // And the codec no longer lists it.
    assert!(socket.devices().unwrap().iter().all(|d| d.name != link.device));
}

/// The entry `<prefix>N` of `/sys/class/<class>` whose `ibdev` is `device`.
fn find_class_entry(class: &str, prefix: &str, device: &str) -> String {
    let dir = Path::new("/sys/class").join(class);
    let mut entries: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(prefix))
        .filter(|name| {
            std::fs::read_to_string(dir.join(name).join("ibdev")).unwrap().trim() == device
        })
        .collect();
    assert_eq!(entries.len(), 1, "one {prefix} of {device}: {entries:?}");
    entries.remove(0)
}
