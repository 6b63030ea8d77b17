//! A physical NIC moved into a pod and back on a real kernel (`make vmtest`, decision 0012,
//! issue 14 item 5): the VM's second emulated Intel 82576 PF (driver `igb`, a PCI function,
//! unlike the veth of `tests/netns/podnet_netns.rs`) goes into a throwaway pod netns in host-device
//! mode through `podnet` and real rtnetlink: renamed, MTU, MAC, alias, address, up, and a ping
//! to QEMU's user-network gateway through it; detach gives it back under its original name,
//! MTU and MAC. A pod netns destroyed with the NIC inside returns it to the host under its
//! pod-side name with our alias; detach (daemon up) and the restore start-up runs (daemon
//! down: `attach::reconcile::restore_returned`, `LinkPort::restore_in_host`) name it back.
//!
//! The NIC is the VM's, so a failing test still gives it back (see [`Borrowed`]). Runs only
//! inside the VM (`NETCLAIM_VM=1`); nextest leaves this binary out (`.config/nextest.toml`).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::model::network_config::{
    Addressing, DeviceKind, MacAddr, ResolvedInterface, ResolvedMode, ResolvedNetworkConfig,
    Sharing,
};
use netclaim::podnet::plan::parse_device_alias;
use netclaim::podnet::{
    AttachPlan, AttachRequest, HostDevice, LinkPort, PodNetns, VlanUsers, attach, detach,
    plan_attach,
};
use serde_json::Value;

use crate::kit;
use crate::kit::netns::Netns;

const CLAIM: &str = "claim-pf";
const POD_MAC: &str = "02:00:00:00:10:01";

/// Fails the test outside the VM: it moves the VM's own NIC.
fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
}

/// The netdevs bound to `driver`, sorted.
fn netdevs_of(driver: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            std::fs::read_link(path.join("device/driver"))
                .is_ok_and(|target| target.file_name().is_some_and(|n| n == driver))
        })
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// `ip -j <args>` in the VM's own (the "host") netns.
fn host_ip_json(args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    serde_json::from_slice(&kit::netns::run("ip", &full).stdout).unwrap()
}

/// `ip -j -d link show` of the host link `name`, or `None`.
fn host_link(name: &str) -> Option<Value> {
    let all = host_ip_json(&["-d", "link", "show"]);
    all.as_array().unwrap().iter().find(|l| l["ifname"] == name).cloned()
}

/// The host link whose alias names our claim (a NIC returned from a destroyed netns).
fn host_link_with_our_alias() -> Option<Value> {
    let all = host_ip_json(&["link", "show"]);
    all.as_array()
        .unwrap()
        .iter()
        .find(|l| l["ifalias"].as_str().is_some_and(|a| a.ends_with(&format!("claim={CLAIM}"))))
        .cloned()
}

fn ip_json(netns: &Netns, args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    serde_json::from_slice(&netns.ip(&full).stdout).unwrap()
}

fn path(netns: &Netns) -> PathBuf {
    PathBuf::from(format!("/run/netns/{}", netns.name))
}

/// The PF as it was before the test.
#[derive(Debug, Clone)]
struct Original {
    name: String,
    mtu: u32,
    mac: MacAddr,
    pci: String,
}

impl Original {
    fn of_second_pf() -> Self {
        let pfs = netdevs_of("igb");
        assert_eq!(pfs.len(), 2, "two igb PFs: {pfs:?}");
        let name = pfs[1].clone();
        let link = host_link(&name).unwrap();
        let pci = std::fs::read_link(format!("/sys/class/net/{name}/device")).unwrap();
        Self {
            mtu: u32::try_from(link["mtu"].as_u64().unwrap()).unwrap(),
            mac: link["address"].as_str().unwrap().parse().unwrap(),
            pci: pci.file_name().unwrap().to_string_lossy().into_owned(),
            name,
        }
    }

    /// Checks the host has the NIC back as it was (down, no alias, no address).
    fn assert_back(&self, what: &str) {
        let link = host_link(&self.name).unwrap_or_else(|| panic!("{what}: {} is back", self.name));
        assert_eq!(link["mtu"], self.mtu, "{what}: MTU {link}");
        assert_eq!(link["address"], self.mac.to_string().as_str(), "{what}: MAC {link}");
        assert!(link.get("ifalias").is_none(), "{what}: alias cleared {link}");
        assert!(link["flags"].as_array().unwrap().iter().all(|f| f != "UP"), "{what}: down {link}");
        assert_eq!(link["parentdev"], self.pci.as_str(), "{what}: the same PCI function {link}");
        assert!(host_link("net1").is_none(), "{what}: no net1 left on the host");
    }
}

/// The PF lent to a pod netns: dropped (also when the test panics), it deletes the netns and
/// names the NIC back the way the test expects the product to, so the VM's later suites find
/// it as they left it.
struct Borrowed {
    /// `None` once destroyed on purpose.
    pod: Option<Netns>,
    original: Original,
}

impl Borrowed {
    fn pod(&self) -> &Netns {
        self.pod.as_ref().unwrap()
    }

    /// Destroys the pod netns (its `Drop` runs `ip netns del`) with the NIC inside.
    fn destroy_netns(&mut self) {
        drop(self.pod.take());
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        self.destroy_netns();
        let started = Instant::now();
        while host_link(&self.original.name).is_none()
            && started.elapsed() < Duration::from_secs(10)
        {
            if let Some(link) = host_link_with_our_alias() {
                let name = link["ifname"].as_str().unwrap().to_owned();
                let mtu = self.original.mtu.to_string();
                let mac = self.original.mac.to_string();
                let _ignored = std::process::Command::new("ip")
                    .args(["link", "set", "dev", &name, "down", "name", &self.original.name])
                    .args(["mtu", &mtu, "address", &mac, "alias", ""])
                    .status();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn plan_for(original: &Original, pod: &Netns) -> AttachPlan {
    let config = ResolvedNetworkConfig {
        pod_network: None,
        mode: ResolvedMode::HostDevice,
        interface: ResolvedInterface {
            name: None,
            mtu: 1400,
            hardware_address: Some(POD_MAC.parse().unwrap()),
        },
        // QEMU's user network: the guest is 10.0.2.15, the gateway 10.0.2.2.
        addressing: Addressing::Static(vec!["10.0.2.15/24".parse().unwrap()]),
        routes: vec![],
        vlan: None,
        sriov: None,
        stats: false,
        routing: netclaim::model::network_config::RoutingSettings::default(),
        bandwidth: None,
        rdma: None,
    };
    let device = HostDevice {
        if_name: original.name.clone(),
        kind: DeviceKind::Physical,
        sharing: Sharing::Exclusive,
        mtu: original.mtu,
        mac: Some(original.mac),
    };
    plan_attach(&AttachRequest {
        claim_uid: CLAIM,
        config: &config,
        device: &device,
        pod: &PodNetns { pod_uid: format!("{}-uid", pod.name), path: path(pod) },
        interface_name: "net1",
        pool_addresses: &[],
    })
    .unwrap()
}

/// Attaches the PF into a new pod netns and checks it there.
async fn move_in(
    host: &HostNetlink,
    original: &Original,
    vlans: &VlanUsers,
) -> (Borrowed, AttachPlan) {
    let borrowed = Borrowed { pod: Some(Netns::new()), original: original.clone() };
    let plan = plan_for(original, borrowed.pod());
    let ops = NetlinkOps::open(host, &plan.pod.path).await.unwrap();
    let attached = attach(&ops, vlans, &plan).await.unwrap();
    assert_eq!((attached.name.as_str(), attached.mtu), ("net1", 1400));
    assert_eq!(attached.mac.map(|m| m.to_string()).as_deref(), Some(POD_MAC));

    assert!(host_link(&original.name).is_none(), "{} left the host netns", original.name);
    let link = &ip_json(borrowed.pod(), &["-d", "addr", "show", "dev", "net1"])[0];
    assert_eq!(link["mtu"], 1400, "{link}");
    assert_eq!(link["address"], POD_MAC, "{link}");
    assert_eq!(link["parentdev"], original.pci.as_str(), "the PF itself: {link}");
    assert_eq!(
        link["ifalias"],
        format!("netclaim.dev/device host={} claim={CLAIM}", original.name).as_str(),
        "{link}"
    );
    assert!(link["flags"].as_array().unwrap().iter().any(|f| f == "UP"), "{link}");
    let addresses: Vec<String> = link["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["scope"] == "global")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    assert_eq!(addresses, ["10.0.2.15/24"]);
    (borrowed, plan)
}

/// Waits for the NIC to come back to the host from a destroyed pod netns (the kernel's
/// netns cleanup runs in a workqueue) and returns its index there.
fn wait_for_return() -> (u32, Value) {
    let started = Instant::now();
    loop {
        if let Some(link) = host_link_with_our_alias() {
            return (u32::try_from(link["ifindex"].as_u64().unwrap()).unwrap(), link);
        }
        assert!(started.elapsed() < Duration::from_secs(10), "the PF never came back");
        std::thread::sleep(Duration::from_millis(50));
    }
}

// Multi-threaded: the pod netns dies only when the pod socket's connection task, on the
// runtime, has closed it; the test thread blocks in `ip` and sleeps meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the VM: run `make vmtest`"]
async fn the_second_igb_pf_moves_into_a_pod_carries_traffic_and_comes_back_as_it_was() {
    require_vm("the_second_igb_pf_moves_into_a_pod_carries_traffic_and_comes_back_as_it_was");
    let original = Original::of_second_pf();
    println!("PF {original:?}");
    let host = HostNetlink::current().unwrap();
    let vlans = VlanUsers::new();
    let (borrowed, plan) = move_in(&host, &original, &vlans).await;

    // Through the emulated NIC to QEMU's user-network gateway, which answers ICMP echo
    // itself (with `restrict=on` nothing leaves the VM). The igb driver reports carrier
    // from its watchdog, some seconds after the link is up under TCG.
    let started = Instant::now();
    while !borrowed.pod().exec("ping", &["-c", "1", "-W", "1", "10.0.2.2"]).status.success() {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no ping through the moved PF: {}",
            String::from_utf8_lossy(&borrowed.pod().ip(&["-s", "link", "show", "net1"]).stdout)
        );
    }
    println!("ping through the PF after {:?}", started.elapsed());

    let ops = NetlinkOps::open_for_detach(&host, &plan.pod.path).await.unwrap();
    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    let left: Vec<Value> = ip_json(borrowed.pod(), &["link", "show"])
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["ifname"] != "lo")
        .cloned()
        .collect();
    assert!(left.is_empty(), "left in the pod: {left:?}");
    original.assert_back("detach");
    assert!(
        host_ip_json(&["addr", "show", "dev", &original.name])[0]["addr_info"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["scope"] != "global"),
        "the pod's address did not come back with it"
    );
}

// Multi-threaded: the pod netns dies only when the pod socket's connection task, on the
// runtime, has closed it; the test thread blocks in `ip` and sleeps meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the VM: run `make vmtest`"]
async fn a_pf_whose_pod_netns_is_destroyed_comes_back_and_is_named_back() {
    require_vm("a_pf_whose_pod_netns_is_destroyed_comes_back_and_is_named_back");
    let original = Original::of_second_pf();
    let host = HostNetlink::current().unwrap();
    let vlans = VlanUsers::new();

    // Daemon up: the pod netns is destroyed first, then StopPodSandbox's detach finds the
    // NIC on the host under its pod-side name with our alias and restores it.
    let (mut borrowed, plan) = move_in(&host, &original, &vlans).await;
    borrowed.destroy_netns();
    let (_, returned) = wait_for_return();
    assert_eq!(returned["ifname"], "net1", "the kernel keeps the pod-side name: {returned}");
    // udev may have given it its predictable name as an altname meanwhile (restore drops it).
    println!("returned: {returned}");
    assert_eq!(returned["mtu"], 1400, "{returned}");
    let ops = NetlinkOps::open_for_detach(&host, &plan.pod.path).await.unwrap();
    let report = detach(&ops, &vlans, &plan).await;
    assert!(report.is_clean(), "{report:?}");
    original.assert_back("detach after the netns was destroyed");
    drop(borrowed);

    // Daemon down: at start, the alias says which host name and claim the link is; the
    // record says MTU and MAC; `restore_in_host` is the call `restore_returned` makes.
    let (mut borrowed, plan) = move_in(&host, &original, &vlans).await;
    borrowed.destroy_netns();
    let (index, returned) = wait_for_return();
    let alias = returned["ifalias"].as_str().unwrap();
    assert_eq!(parse_device_alias(alias), Some((original.name.as_str(), CLAIM)), "{alias}");
    NetlinkOps::host_only(&host)
        .restore_in_host(index, &plan.host_device, plan.host_mtu, plan.host_mac_to_restore)
        .await
        .unwrap_or_else(|err| {
            // Which link holds the name (altnames are listed): udev adds them behind us.
            panic!("{err:?}\nhost links: {}", host_ip_json(&["-d", "link", "show"]))
        });
    original.assert_back("restore at start");
    drop(borrowed);
}
