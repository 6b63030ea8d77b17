//! Mode `sriov-vf` (issue 14 item 4) on the VM kernels' emulated 82576 (QEMU's `igb`, PF
//! driver `igb`, VF driver `igbvf`; `make vmtest`, decision 0012): VF facts from sysfs; the
//! claim service with the real store, the real inventory lookup (`DiscoveredDevices` on
//! `/sys`) and the real VF port (`host::sriov`) applying the VF's settings on the PF at
//! prepare and setting back exactly what it found at unprepare; the attach service moving the
//! VF into a pod netns and, after a "restart" during which that netns was destroyed, restoring
//! the VF that came back under its pod-side name. Settings are read back with `ip -j link`
//! (iproute2's own `RTEXT_FILTER_VF` dump), not with the code under test.
//!
//! igb sets MAC, 802.1Q VLAN + `QoS`, spoof checking, trust and a maximum rate; it has no
//! `ndo_set_vf_link_state` (`EOPNOTSUPP`), refuses any minimum rate (`EINVAL`) and any VLAN
//! protocol but 802.1Q (`EPROTONOSUPPORT`): those are the named errors checked here. A
//! `bandwidth.limit` (issue 35) is the VF's maximum rate, read back from the PF (QEMU's igb
//! does not limit with it).
//!
//! Runs only inside the VM (`NETCLAIM_VM=1`); nextest leaves the binary out.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use netclaim::attach::{AttachService, StatusSink};
use netclaim::claims::vf::VfPort;
use netclaim::claims::{ClaimPreparer, ClaimService, DeviceSource, ServiceIdentity};
use netclaim::host::discovery::{HostDevices, host_devices};
use netclaim::host::netlink::HostNetlink;
use netclaim::host::sriov::NetlinkVfSettings;
use netclaim::inventory::{Selection, SharingMode};
use netclaim::model::device::AttributeValue;
use netclaim::model::{ClaimRef, PodRef};
use netclaim::store::Store;
use nri_rs::{PluginHandler, PodSandbox};
use serde_json::{Value, json};

use crate::kit::netns::Netns;
use crate::kit::testing::claims::MapClaims;

const DRIVER: &str = "netclaim.dev";
const NODE: &str = "vm-node";

fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
}

fn ip(args: &[&str]) -> Vec<u8> {
    let output = Command::new("ip").args(args).output().unwrap();
    assert!(output.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    output.stdout
}

fn ip_json(args: &[&str]) -> Value {
    let mut full = vec!["-j"];
    full.extend_from_slice(args);
    serde_json::from_slice(&ip(&full)).unwrap()
}

/// The first igb PF's netdev (the VM has two).
fn first_pf() -> String {
    let mut pfs: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            std::fs::read_link(path.join("device/driver"))
                .is_ok_and(|target| target.file_name().is_some_and(|n| n == "igb"))
        })
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    pfs.sort();
    pfs.into_iter().next().expect("an igb PF")
}

/// Two VFs on the first igb PF, removed on drop (the PF set back down if it was). The PF is
/// up while they exist: igb answers its VFs' mailbox only while it is open, and a maximum
/// rate needs its link up (`igb_ndo_set_vf_bw` checks `E1000_STATUS_LU`).
struct Vfs {
    pf: String,
    names: Vec<String>,
    pci: Vec<String>,
    numvfs: PathBuf,
    pf_was_up: bool,
}

impl Vfs {
    fn create() -> Self {
        let pf = first_pf();
        let device = PathBuf::from(format!("/sys/class/net/{pf}/device"));
        let flags = std::fs::read_to_string(format!("/sys/class/net/{pf}/flags")).unwrap();
        let pf_was_up =
            u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap() & 1 == 1;
        let numvfs = device.join("sriov_numvfs");
        let mut vfs = Self { pf: pf.clone(), names: vec![], pci: vec![], numvfs, pf_was_up };
        ip(&["link", "set", &pf, "up"]);
        let started = Instant::now();
        std::fs::write(&vfs.numvfs, "2").unwrap();
        println!("sriov_numvfs=2 written after {:?}", started.elapsed());
        for index in 0..2 {
            let virtfn = device.join(format!("virtfn{index}"));
            while !virtfn.join("net").exists() {
                assert!(started.elapsed() < Duration::from_secs(30), "no netdev for VF {index}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // udev renames the new netdevs (eth0 -> enp1s0v0): take their names once it is done.
        let settle = Command::new("udevadm").args(["settle", "--timeout=20"]).status();
        println!("udevadm settle: {settle:?} after {:?}", started.elapsed());
        for index in 0..2 {
            let virtfn = device.join(format!("virtfn{index}"));
            let name = loop {
                let found = std::fs::read_dir(virtfn.join("net"))
                    .ok()
                    .and_then(|mut entries| entries.next())
                    .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned());
                if let Some(name) = found {
                    break name;
                }
                assert!(started.elapsed() < Duration::from_secs(30), "no netdev for VF {index}");
                std::thread::sleep(Duration::from_millis(50));
            };
            let pci = std::fs::read_link(&virtfn).unwrap();
            vfs.pci.push(pci.file_name().unwrap().to_string_lossy().into_owned());
            vfs.names.push(name);
        }
        // The PF's carrier, for the rate limit.
        while std::fs::read_to_string(format!("/sys/class/net/{pf}/carrier"))
            .is_ok_and(|c| c.trim() != "1")
        {
            assert!(started.elapsed() < Duration::from_secs(30), "{pf} has no carrier");
            std::thread::sleep(Duration::from_millis(50));
        }
        println!("VFs {:?} ({:?}) of {pf} after {:?}", vfs.names, vfs.pci, started.elapsed());
        vfs
    }

    /// The DRA device name of VF `index`: `pci-<dom>-<bus>-<dev>-<fn>`.
    fn device(&self, index: usize) -> String {
        let (domain, rest) = self.pci[index].split_once(':').unwrap();
        let (bus, rest) = rest.split_once(':').unwrap();
        let (dev, function) = rest.split_once('.').unwrap();
        format!("pci-{domain}-{bus}-{dev}-{function}")
    }

    /// VF `index`'s entry of the PF's `vfinfo_list` as iproute2 reads it, without counters.
    fn settings(&self, index: u32) -> Value {
        let link = ip_json(&["link", "show", "dev", &self.pf]);
        let mut entry = link[0]["vfinfo_list"]
            .as_array()
            .unwrap_or_else(|| panic!("no vfinfo_list on {}: {link}", self.pf))
            .iter()
            .find(|vf| vf["vf"] == index)
            .unwrap_or_else(|| panic!("no VF {index} in {link}"))
            .clone();
        entry.as_object_mut().unwrap().remove("stats");
        entry
    }
}

impl Drop for Vfs {
    fn drop(&mut self) {
        // Removing the VFs unregisters their netdevs in whichever netns they are.
        let _ignored = std::fs::write(&self.numvfs, "0");
        if !self.pf_was_up {
            let _ignored = Command::new("ip").args(["link", "set", &self.pf, "down"]).status();
        }
    }
}

/// Claims by name, as the scheduler leaves them.
type Claims = Arc<MapClaims>;

/// Puts a claim `name` for `device` with `config` in `claims`, allocated on this node and
/// reserved for `pod`.
fn put_claim(
    claims: &Claims,
    name: &str,
    device: &str,
    config: Value,
    pod: &PodSandbox,
) -> ClaimRef {
    let uid = format!("uid-{name}");
    let mut parameters = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
    let Value::Object(config) = config else { panic!("a NetworkConfig is an object") };
    parameters.as_object_mut().unwrap().extend(config);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "vf", "driver": DRIVER, "pool": NODE, "device": device}],
                "config": [{"source": "FromClaim",
                    "opaque": {"driver": DRIVER, "parameters": parameters}}]
            }},
            "reservedFor": [{"resource": "pods", "name": pod.name, "uid": pod.uid}]
        }
    }))
    .unwrap();
    claims.put(claim);
    ClaimRef { namespace: "default".into(), name: name.into(), uid }
}

/// Statuses and events go nowhere (no API server in the VM).
struct NoStatus;

impl StatusSink for NoStatus {
    fn submit(&self, _claim: ClaimRef, _entries: Vec<AllocatedDeviceStatus>) {}
    fn warn_pod(&self, pod: PodRef, reason: &'static str, message: String) {
        println!("pod event {pod:?} {reason}: {message}");
    }
}

type Service = ClaimService<Claims, HostDevices, Arc<Store>>;

/// The claim service as the daemon builds it: real store, inventory and VF port.
fn service(claims: &Claims, state: &Path) -> Service {
    let selection = Selection::new(&[], &[], &[], SharingMode::Slots).unwrap();
    let devices = host_devices("/sys".into(), selection);
    let host = HostNetlink::current().unwrap();
    let port: Arc<dyn VfPort> = Arc::new(NetlinkVfSettings::new(&host));
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(claims),
        devices,
        Arc::new(Store::open(state).unwrap()),
    )
    .unwrap()
    .with_vf_port(port)
}

async fn prepare(service: &Service, claim: &ClaimRef) -> Result<(), String> {
    let mut results = service.prepare(vec![claim.clone()]).await;
    results.remove(&claim.uid).unwrap().map(|_| ()).map_err(|f| f.message)
}

async fn unprepare(service: &Service, claim: &ClaimRef) {
    let results = service.unprepare(vec![claim.clone()]).await;
    assert!(results[&claim.uid].is_ok(), "{results:?}");
}

fn sandbox(netns: &Netns, name: &str) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{name}"),
        uid: format!("pod-{name}"),
        name: name.to_owned(),
        namespace: "default".to_owned(),
        netns_path: Some(Path::new("/run/netns").join(&netns.name)),
        ..PodSandbox::default()
    }
}

fn no_pod() -> PodSandbox {
    PodSandbox { uid: "pod-none".into(), name: "none".into(), ..PodSandbox::default() }
}

/// `ip link set <pf> vf <index> <settings…>`.
fn set_vf(vfs: &Vfs, index: u32, settings: &[&str]) {
    let index = index.to_string();
    let mut args = vec!["link", "set", "dev", vfs.pf.as_str(), "vf", index.as_str()];
    args.extend_from_slice(settings);
    ip(&args);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
// Named to sort first (libtest runs them in name order, one at a time): on 6.12, after the
// other tests of this binary had run, the PF was twice never discovered again within 15 s
// (not understood yet; the diagnostics below say what the kernel shows).
fn a_pf_and_its_vfs_have_their_facts_from_sysfs() {
    require_vm("a_pf_and_its_vfs_have_their_facts_from_sysfs");
    let vfs = Vfs::create();
    runtime().block_on(async {
        let selection = Selection::new(&[], &[], &[], SharingMode::Slots).unwrap();
        let devices = host_devices("/sys".into(), selection.clone());
        let pf_pci = std::fs::read_link(format!("/sys/class/net/{}/device", vfs.pf)).unwrap();
        let pf_pci = pf_pci.file_name().unwrap().to_string_lossy().into_owned();
        let attribute = |attributes: &BTreeMap<String, AttributeValue>, name: &str| {
            attributes.get(&format!("netclaim.dev/{name}")).cloned()
        };
        let pf_device = {
            let (domain, rest) = pf_pci.split_once(':').unwrap();
            let (bus, rest) = rest.split_once(':').unwrap();
            let (dev, function) = rest.split_once('.').unwrap();
            format!("pci-{domain}-{bus}-{dev}-{function}")
        };
        // igb resets the PF after `sriov_numvfs` is written (its link goes down and up, see
        // the guest's kernel log); a discovery in that window can miss the PF's sysfs facts,
        // and the daemon would publish it at its next discovery. Wait for one that has it.
        let mut devices = devices;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        let pf = loop {
            match devices.attributes(&pf_device).await {
                Ok(pf) => break pf,
                Err(err) if std::time::Instant::now() < deadline => {
                    println!("{pf_device} not discovered yet ({err:?}); again in 0.5 s");
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    devices = host_devices("/sys".into(), selection.clone());
                }
                Err(err) => panic!(
                    "{pf_device} never discovered: {err:?}\nip -d link:\n{}\nip addr:\n{}\nroutes:\n{}{}\n/sys/class/net: {:?}",
                    String::from_utf8_lossy(&ip(&["-d", "link", "show"])),
                    String::from_utf8_lossy(&ip(&["addr", "show"])),
                    String::from_utf8_lossy(&ip(&["route", "show"])),
                    String::from_utf8_lossy(&ip(&["-6", "route", "show"])),
                    std::fs::read_dir("/sys/class/net").map(|d| d
                        .filter_map(Result::ok)
                        .map(|e| e.file_name())
                        .collect::<Vec<_>>())
                ),
            }
        };
        println!("{pf_device}: {pf:?}");
        let total: i64 =
            std::fs::read_to_string(format!("/sys/class/net/{}/device/sriov_totalvfs", vfs.pf))
                .unwrap()
                .trim()
                .parse()
                .unwrap();
        assert_eq!(attribute(&pf, "type"), Some(AttributeValue::String("sriov-pf".into())));
        assert_eq!(attribute(&pf, "sriovTotalVfs"), Some(AttributeValue::Int(total)));
        assert_eq!(attribute(&pf, "sriovVfs"), Some(AttributeValue::Int(2)));
        for index in 0..2 {
            let device = vfs.device(index);
            let vf = devices.attributes(&device).await.unwrap();
            println!("{device}: {vf:?}");
            assert_eq!(attribute(&vf, "type"), Some(AttributeValue::String("sriov-vf".into())));
            assert_eq!(
                attribute(&vf, "ifName"),
                Some(AttributeValue::String(vfs.names[index].clone()))
            );
            assert_eq!(attribute(&vf, "pfName"), Some(AttributeValue::String(vfs.pf.clone())));
            assert_eq!(
                attribute(&vf, "vfIndex"),
                Some(AttributeValue::Int(i64::try_from(index).unwrap()))
            );
            assert_eq!(
                attribute(&vf, "kernelDriver"),
                Some(AttributeValue::String("igbvf".into()))
            );
            let pci = attribute(&vf, "pciAddress");
            assert_eq!(pci, Some(AttributeValue::String(vfs.pci[index].clone())));
            // QEMU's q35 without NUMA: the kernel reports -1, which is published as nothing.
            let numa = std::fs::read_to_string(format!(
                "/sys/bus/pci/devices/{}/numa_node",
                vfs.pci[index]
            ))
            .unwrap();
            let numa: i64 = numa.trim().parse().unwrap();
            let expected = (numa >= 0).then_some(AttributeValue::Int(numa));
            assert_eq!(attribute(&vf, "numaNode"), expected);
            let facts = devices.facts(&device).await.unwrap();
            assert_eq!(facts.kind, netclaim::model::network_config::DeviceKind::SriovVf);
            assert!(facts.pf_mtu.is_some(), "{facts:?}");
        }
    });
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn each_setting_igb_supports_is_applied_on_the_pf_and_read_back() {
    require_vm("each_setting_igb_supports_is_applied_on_the_pf_and_read_back");
    let vfs = Vfs::create();
    let state = tempfile::tempdir().unwrap();
    let claims = Claims::default();
    runtime().block_on(async {
        let service = service(&claims, state.path());
        let before = vfs.settings(1);
        println!("VF 1 before: {before}");
        let claim = put_claim(
            &claims,
            "all-set",
            &vfs.device(1),
            json!({"interface": {"hardwareAddress": "02:00:00:00:11:01"}, "vlan": 100,
                "sriov": {"qos": 2, "spoofCheck": false, "trust": true, "maxTxRateMbps": 50}}),
            &no_pod(),
        );
        prepare(&service, &claim).await.unwrap();
        let after = vfs.settings(1);
        println!("VF 1 prepared: {after}");
        assert_eq!(after["address"], "02:00:00:00:11:01");
        let vlan = after["vlan_list"].as_array().map_or(&after, |list| &list[0]);
        assert_eq!((&vlan["vlan"], &vlan["qos"]), (&json!(100), &json!(2)), "{after}");
        assert_eq!(after["spoofchk"], false);
        assert_eq!(after["trust"], true);
        assert_eq!(after["rate"]["max_tx"], 50);
        unprepare(&service, &claim).await;
        assert_eq!(vfs.settings(1), before, "set back as found");

        // Issue 35: a VF's egress ceiling (`bandwidth.limit`) is its hardware `max_tx_rate`,
        // set through the PF. QEMU's igb keeps the rate register but does not limit with it:
        // the rate is read back from the PF (iproute2's dump), the traffic is not measured.
        let before = vfs.settings(0);
        println!("VF 0 before: {before}");
        assert_eq!(before["rate"]["max_tx"], 0, "a new VF has no rate: {before}");
        let claim = put_claim(
            &claims,
            "limited",
            &vfs.device(0),
            json!({"bandwidth": {"limit": "300M"}}),
            &no_pod(),
        );
        prepare(&service, &claim).await.unwrap();
        let during = vfs.settings(0);
        println!("VF 0 prepared: {during}");
        assert_eq!(
            (&during["rate"]["max_tx"], &during["rate"]["min_tx"]),
            (&json!(300), &json!(0))
        );
        let device = service.prepared(&claim.uid).unwrap().devices[0].clone();
        let support = netclaim::attach::bandwidth::CeilingSupport { fq: true, pacing: true };
        let data = netclaim::attach::bandwidth::bandwidth_data(&device.config, support).unwrap();
        assert_eq!(
            serde_json::to_value(&data).unwrap(),
            json!({"ceiling": "300M", "source": "bandwidth.limit",
                "mechanism": "vf-max-tx-rate", "ingress": "none"}),
            "data.bandwidth of the claim status"
        );
        unprepare(&service, &claim).await;
        let after = vfs.settings(0);
        assert_eq!(after["rate"]["max_tx"], 0, "{after}");
        assert_eq!(after, before, "set back as found");
    });
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn link_state_min_rate_and_802_1ad_fail_the_prepare_naming_the_field() {
    require_vm("link_state_min_rate_and_802_1ad_fail_the_prepare_naming_the_field");
    let vfs = Vfs::create();
    let state = tempfile::tempdir().unwrap();
    let claims = Claims::default();
    runtime().block_on(async {
        let service = service(&claims, state.path());
        let before = vfs.settings(0);
        let cases = [
            (
                "link-state",
                json!({"sriov": {"linkState": "enable", "trust": true}}),
                "sriov.linkState: enable: not supported by this NIC",
            ),
            (
                "min-rate",
                json!({"sriov": {"minTxRateMbps": 10, "maxTxRateMbps": 100}}),
                "sriov.minTxRateMbps: 10: the PF refused it",
            ),
            (
                "qinq",
                json!({"vlan": 5, "sriov": {"vlanProtocol": "802.1ad"}}),
                "sriov.vlanProtocol: 802.1ad: not supported by this NIC",
            ),
        ];
        for (name, config, message) in cases {
            let claim = put_claim(&claims, name, &vfs.device(0), config, &no_pod());
            let err = prepare(&service, &claim).await.unwrap_err();
            println!("{name}: {err}");
            assert!(err.contains(message), "{message:?} missing in {err}");
            assert!(err.contains(&format!("VF 0 of {}", vfs.pf)), "{err}");
            assert_eq!(vfs.settings(0), before, "{name}: what was applied before is set back");
            assert!(service.prepared(&claim.uid).is_none());
        }
    });
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn unprepare_restores_every_vf_setting_found_before_the_claim() {
    require_vm("unprepare_restores_every_vf_setting_found_before_the_claim");
    let vfs = Vfs::create();
    // Not the defaults, so a reset to assumed values would show.
    set_vf(&vfs, 1, &["spoofchk", "off", "trust", "on", "vlan", "7", "qos", "3"]);
    set_vf(&vfs, 1, &["mac", "02:00:00:00:07:07", "max_tx_rate", "100"]);
    let before = vfs.settings(1);
    println!("VF 1 before the claim: {before}");
    assert_eq!(
        (&before["spoofchk"], &before["trust"], &before["rate"]["max_tx"]),
        (&json!(false), &json!(true), &json!(100)),
        "{before}"
    );
    let state = tempfile::tempdir().unwrap();
    let claims = Claims::default();
    runtime().block_on(async {
        let service = service(&claims, state.path());
        let claim = put_claim(
            &claims,
            "changes-each",
            &vfs.device(1),
            json!({"interface": {"hardwareAddress": "02:00:00:00:09:09"}, "vlan": 9,
                "sriov": {"qos": 1, "spoofCheck": true, "trust": false, "maxTxRateMbps": 200}}),
            &no_pod(),
        );
        prepare(&service, &claim).await.unwrap();
        let during = vfs.settings(1);
        println!("VF 1 prepared: {during}");
        for key in ["address", "spoofchk", "trust", "rate"] {
            assert_ne!(during[key], before[key], "{key} changed by the claim");
        }
        let vlan =
            |s: &Value| s["vlan_list"].as_array().map_or(s["vlan"].clone(), |l| l[0].clone());
        assert_ne!(vlan(&during), vlan(&before));
        // A restart between prepare and unprepare: the record keeps what to set back.
        drop(service);
        let service = self::service(&claims, state.path());
        unprepare(&service, &claim).await;
        assert_eq!(vfs.settings(1), before, "every IFLA_VF_* as before the claim");
    });
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn a_vf_moves_into_the_pod_and_returns_from_a_netns_destroyed_while_the_daemon_was_down() {
    require_vm(
        "a_vf_moves_into_the_pod_and_returns_from_a_netns_destroyed_while_the_daemon_was_down",
    );
    let vfs = Vfs::create();
    let host_name = vfs.names[0].clone();
    let host_link = ip_json(&["link", "show", "dev", &host_name]);
    let (host_mtu, host_mac) = (host_link[0]["mtu"].clone(), host_link[0]["address"].clone());
    let before = vfs.settings(0);
    let state = tempfile::tempdir().unwrap();
    let claims = Claims::default();
    let pod_netns = Netns::new();
    let pod = sandbox(&pod_netns, "vf-pod");
    let claim = put_claim(
        &claims,
        "vf-net",
        &vfs.device(0),
        json!({"interface": {"mtu": 1400, "hardwareAddress": "02:00:00:00:05:05"},
            "vlan": 11, "ipam": {"addresses": ["192.0.2.5/24"]}}),
        &pod,
    );
    let attach = |claims: Arc<Service>| {
        let host = HostNetlink::current().unwrap();
        let store = Arc::new(Store::open(state.path().join("attach")).unwrap());
        AttachService::load(
            DRIVER,
            claims,
            host,
            store,
            NoStatus,
            Arc::new(netclaim::metrics::Metrics::new()),
        )
        .unwrap()
    };
    runtime().block_on(async {
        let service = Arc::new(service(&claims, state.path()));
        prepare(&service, &claim).await.unwrap();
        let attach = attach(Arc::clone(&service));
        attach.start().await;
        attach.run_pod_sandbox(pod.clone()).await.unwrap();
        let inside = ip_json(&["-n", &pod_netns.name, "-d", "addr", "show", "dev", "net1"]);
        println!("in the pod: {inside}");
        assert_eq!(inside[0]["mtu"], 1400);
        assert_eq!(inside[0]["address"], "02:00:00:00:05:05", "the VF netdev has the claim's MAC");
        assert_eq!(inside[0]["addr_info"][0]["local"], "192.0.2.5");
        assert_eq!(vfs.settings(0)["address"], "02:00:00:00:05:05", "and so has the PF's view");
        assert!(
            ip_json(&["link", "show"])
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["ifname"] != host_name.as_str())
        );
        // The daemon goes down (everything dropped, nothing detached).
        attach.settled().await;
    });
    // Meanwhile the pod's netns is destroyed: the kernel returns the VF to the host under its
    // pod-side name (`default_device_exit_net` renames only on a clash).
    drop(pod_netns);
    let started = Instant::now();
    let returned = loop {
        let links = ip_json(&["link", "show"]);
        let found = links
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ifalias"].as_str().is_some_and(|a| a.contains("claim=uid-vf-net")))
            .cloned();
        if let Some(link) = found {
            break link;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "the VF did not come back: {links}");
        std::thread::sleep(Duration::from_millis(100));
    };
    println!("returned after {:?}: {returned}", started.elapsed());
    assert_ne!(returned["ifname"], host_name.as_str(), "still under a pod-side name");
    runtime().block_on(async {
        // Start again: the attach service restores name, MTU and MAC.
        let service = Arc::new(service(&claims, state.path()));
        let attach = attach(Arc::clone(&service));
        attach.start().await;
        let back = ip_json(&["link", "show", "dev", &host_name]);
        println!("restored: {back}");
        assert_eq!(back[0]["mtu"], host_mtu);
        // The MAC is the PF's VF MAC of the claim, still prepared (set back at unprepare).
        assert_eq!(back[0]["address"], "02:00:00:00:05:05");
        let _ = host_mac;
        assert!(back[0]["ifalias"].as_str().is_none_or(str::is_empty), "{back}");
        // The claim is still prepared: its VF settings stay until kubelet unprepares it.
        assert_eq!(vfs.settings(0)["address"], "02:00:00:00:05:05");
        unprepare(&service, &claim).await;
        assert_eq!(vfs.settings(0), before, "VF settings set back at unprepare");
    });
}
