//! `ethtool` (issue 34 item 4) on the VM kernels' emulated 82576 PFs (QEMU's `igb`, driver
//! `igb`; `make vmtest`, decision 0012), through the claim service as the daemon builds it
//! (real store, the inventory on `/sys`, `host::ethtool` over `crates/ethtool-genl`):
//!
//! - the second PF (no VFs) as `host-device` with features (`rx-gro`, `rx-checksum` turned
//!   the other way), rings (rx/tx 512) and combined channels changed at prepare; the values
//!   stay with the netdev when it moves into a netns and back (read there with the port); the
//!   service "restarts" (dropped, loaded again on the same state dir), and its unprepare sets
//!   every value back as found;
//! - a ring above igb's maximum refused at prepare naming `ethtool.rings.rx` and the
//!   maximum, the device untouched;
//! - the first PF with a VF: igb then allows fewer channels than without (QEMU's 82576 on
//!   6.12: 2 instead of 8), so one more is refused naming `ethtool.channels.combined`, and the
//!   features asked with it are never changed.
//!
//! Values are read back with the port and, independently, with `ethtool -k/-g/-l` when the
//! host's root (the guest's `/`) has it (`vmtests/install.sh` installs it; igb keeps its
//! `queues/rx-N` in sysfs at the allocated maximum, so sysfs says nothing here). The PFs
//! are the VM's: whatever a failing test left is set back from what it read first (see
//! [`Restore`]). Runs only inside the VM (`NETCLAIM_VM=1`); nextest leaves the binary out.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use netclaim::claims::ethtool::{EthtoolPort, FeatureState, Limited};
use netclaim::claims::{ClaimPreparer, ClaimService, ServiceIdentity};
use netclaim::host::discovery::{HostDevices, host_devices};
use netclaim::host::ethtool::NetlinkEthtool;
use netclaim::inventory::{Selection, SharingMode};
use netclaim::model::ClaimRef;
use netclaim::model::network_config::{EthtoolChannels, EthtoolRings};
use netclaim::store::Store;
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

/// The igb PFs' netdevs, sorted (01:00.0 first).
fn pfs() -> Vec<String> {
    let mut pfs: Vec<(String, String)> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            std::fs::read_link(path.join("device/driver"))
                .is_ok_and(|target| target.file_name().is_some_and(|n| n == "igb"))
        })
        .map(|path| {
            let pci = std::fs::read_link(path.join("device")).unwrap();
            let pci = pci.file_name().unwrap().to_string_lossy().into_owned();
            (pci, path.file_name().unwrap().to_string_lossy().into_owned())
        })
        .collect();
    pfs.sort();
    assert_eq!(pfs.len(), 2, "two igb PFs: {pfs:?}");
    pfs.into_iter().map(|(_, name)| name).collect()
}

/// The DRA device name of netdev `dev`: `pci-<dom>-<bus>-<dev>-<fn>`.
fn device_name(dev: &str) -> String {
    let pci = std::fs::read_link(format!("/sys/class/net/{dev}/device")).unwrap();
    let pci = pci.file_name().unwrap().to_string_lossy().into_owned();
    format!("pci-{}", pci.replace([':', '.'], "-"))
}

/// What the test reads of a device with the port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    features: BTreeMap<String, FeatureState>,
    rings: Limited<EthtoolRings>,
    channels: Limited<EthtoolChannels>,
}

/// `ethtool <flag> dev` in the VM, or `None` when the guest has no ethtool.
fn ethtool_cli(flag: &str, dev: &str) -> Option<String> {
    let out = Command::new("ethtool").args([flag, dev]).output().ok()?;
    assert!(out.status.success(), "ethtool {flag} {dev}: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The "Current hardware settings" value of `field` (`RX:`, `Combined:`) in `ethtool -g/-l`.
fn current(text: &str, field: &str) -> Option<u32> {
    let current = text.split("Current hardware settings:").nth(1)?;
    current.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().parse().ok())
}

/// Sets a PF back to what the test first read, whatever a failing test left (features by
/// their wanted bit, rings, channels).
struct Restore {
    dev: String,
    seen: Seen,
}

impl Drop for Restore {
    fn drop(&mut self) {
        let port = NetlinkEthtool::new();
        let (dev, seen) = (self.dev.clone(), self.seen.clone());
        let restore = async move {
            let changes: Vec<(String, bool)> = seen
                .features
                .iter()
                .filter(|(_, f)| f.changeable)
                .map(|(n, f)| (n.clone(), f.wanted))
                .collect();
            let _ignored = port.set_features(&dev, &changes).await;
            let _ignored = port.set_rings(&dev, seen.rings.current).await;
            let _ignored = port.set_channels(&dev, seen.channels.current).await;
        };
        std::thread::spawn(move || runtime().block_on(restore)).join().ok();
    }
}

type Claims = Arc<MapClaims>;
type Service = ClaimService<Claims, HostDevices, Arc<Store>>;

/// The claim service as the daemon builds it: real store, inventory and ethtool port.
fn service(claims: &Claims, state: &Path) -> Service {
    let selection = Selection::new(&[], &[], &[], SharingMode::Slots).unwrap();
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(claims),
        host_devices("/sys".into(), selection),
        Arc::new(Store::open(state).unwrap()),
    )
    .unwrap()
    .with_ethtool_port(Arc::new(NetlinkEthtool::new()))
}

/// A claim `name` for `device` with `config` (mode host-device), allocated on this node.
fn put_claim(claims: &Claims, name: &str, device: &str, config: &Value) -> ClaimRef {
    let uid = format!("uid-{name}");
    let mut parameters = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
        "mode": "host-device"});
    parameters.as_object_mut().unwrap().extend(config.as_object().unwrap().clone());
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {},
        "status": {
            "allocation": {"devices": {
                "results": [{"request": "nic", "driver": DRIVER, "pool": NODE, "device": device}],
                "config": [{"source": "FromClaim",
                    "opaque": {"driver": DRIVER, "parameters": parameters}}]
            }},
            "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"),
                "uid": format!("pod-uid-{name}")}]
        }
    }))
    .unwrap();
    claims.put(claim);
    ClaimRef { namespace: "default".into(), name: name.into(), uid }
}

async fn prepare(service: &Service, claim: &ClaimRef) -> Result<(), String> {
    let mut results = service.prepare(vec![claim.clone()]).await;
    results.remove(&claim.uid).unwrap().map(|_| ()).map_err(|f| f.message)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// Waits until `dev` answers the port again (igb resets itself after a ring or channel
/// change).
async fn settled(port: &dyn EthtoolPort, dev: &str) -> Seen {
    let started = Instant::now();
    loop {
        let (features, rings, channels) =
            (port.features(dev).await, port.rings(dev).await, port.channels(dev).await);
        if let (Ok(features), Ok(rings), Ok(channels)) = (features, rings, channels) {
            return Seen { features, rings, channels };
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{dev} does not answer");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn a_pf_gets_its_features_rings_and_channels_and_they_come_back_after_a_restart() {
    require_vm("a_pf_gets_its_features_rings_and_channels_and_they_come_back_after_a_restart");
    let dev = pfs()[1].clone();
    let port = NetlinkEthtool::new();
    let rt = runtime();
    let found = rt.block_on(settled(&port, &dev));
    let _restore = Restore { dev: dev.clone(), seen: found.clone() };
    println!("{dev} before: rings {:?} channels {:?}", found.rings, found.channels);
    let (gro, csum) = (found.features["rx-gro"], found.features["rx-checksum"]);
    assert!(gro.changeable && csum.changeable, "igb lets both change: {gro:?} {csum:?}");
    let combined = found.channels.current.combined.unwrap();
    let max_combined = found.channels.max.combined.unwrap();
    let target = if combined > 1 { 1 } else { 2 };
    assert!(target <= max_combined, "igb without VFs allows {max_combined} channels");
    let config = json!({"ethtool": {
        "features": {"rx-gro": !gro.active, "rx-checksum": !csum.active},
        "rings": {"rx": 512, "tx": 512},
        "channels": {"combined": target}}});

    let claims: Claims = Arc::new(MapClaims::default());
    let state = tempfile::tempdir().unwrap();
    let claim = put_claim(&claims, "et-pf", &device_name(&dev), &config);
    let started = Instant::now();
    rt.block_on(async {
        let service = service(&claims, state.path());
        prepare(&service, &claim).await.unwrap();
        println!("prepare with ethtool took {:?}", started.elapsed());
        let now = settled(&port, &dev).await;
        assert_eq!(now.features["rx-gro"].active, !gro.active);
        assert_eq!(now.features["rx-checksum"].active, !csum.active);
        assert_eq!((now.rings.current.rx, now.rings.current.tx), (Some(512), Some(512)));
        assert_eq!(now.channels.current.combined, Some(target));
        if let Some(g) = ethtool_cli("-g", &dev) {
            assert_eq!((current(&g, "RX:"), current(&g, "TX:")), (Some(512), Some(512)), "{g}");
            let l = ethtool_cli("-l", &dev).unwrap();
            assert_eq!(current(&l, "Combined:"), Some(target), "{l}");
            let k = ethtool_cli("-k", &dev).unwrap();
            let on = |name: &str| k.lines().any(|l| l.trim() == format!("{name}: on"));
            assert_eq!(on("generic-receive-offload"), !gro.active, "{k}");
            assert_eq!(on("rx-checksumming"), !csum.active, "{k}");
        } else {
            println!("no ethtool in the guest: read back with the port and sysfs only");
        }
        // The values are the netdev's: they go with it into a netns and back.
        let pod = Netns::new();
        crate::kit::netns::run("ip", &["link", "set", "dev", &dev, "netns", &pod.name]);
        let in_pod =
            NetlinkEthtool::in_netns(PathBuf::from(format!("/run/netns/{}", pod.name)), None);
        let there = settled(&in_pod, &dev).await;
        assert_eq!(
            (there.rings.current, there.channels.current),
            (now.rings.current, now.channels.current)
        );
        assert_eq!(there.features["rx-gro"].active, !gro.active);
        pod.ip(&["link", "set", "dev", &dev, "netns", "1"]);
        // The restart: the service goes, a new one loads the same state dir.
        drop(service);
        let service = self::service(&claims, state.path());
        let record = service.prepared(&claim.uid).unwrap().devices[0].ethtool.clone().unwrap();
        println!("recorded before: {:?}", record.before);
        let results = service.unprepare(vec![claim.clone()]).await;
        assert!(results[&claim.uid].is_ok(), "{results:?}");
        let back = settled(&port, &dev).await;
        assert_eq!(back.features, found.features, "every feature as found");
        assert_eq!(back.rings, found.rings);
        assert_eq!(back.channels, found.channels);

        // Above igb's maximum: refused at prepare naming the field, nothing changed.
        let max_rx = found.rings.max.rx.unwrap();
        let too_big = put_claim(
            &claims,
            "et-big",
            &device_name(&dev),
            &json!({"ethtool": {"features": {"rx-gro": !gro.active}, "rings": {"rx": max_rx + 8}}}),
        );
        let err = prepare(&service, &too_big).await.unwrap_err();
        let expected =
            format!("ethtool.rings.rx: {}: above the maximum of {dev}, {max_rx}", max_rx + 8);
        assert!(err.contains(&expected), "{expected:?} missing in {err}");
        assert_eq!(settled(&port, &dev).await, found, "untouched");
    });
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn a_pf_with_vfs_allows_fewer_channels_and_a_claim_for_more_is_refused_naming_it() {
    /// Takes the PF's VFs away again, even when the test fails.
    struct NoVfs(PathBuf);
    impl Drop for NoVfs {
        fn drop(&mut self) {
            let _ignored = std::fs::write(&self.0, "0");
        }
    }
    require_vm("a_pf_with_vfs_allows_fewer_channels_and_a_claim_for_more_is_refused_naming_it");
    let [dev, other] = <[String; 2]>::try_from(pfs()).unwrap();
    let numvfs = PathBuf::from(format!("/sys/class/net/{dev}/device/sriov_numvfs"));
    std::fs::write(&numvfs, "1").unwrap();
    let _vfs = NoVfs(numvfs);
    let port = NetlinkEthtool::new();
    let rt = runtime();
    rt.block_on(async {
        let found = settled(&port, &dev).await;
        let _restore = Restore { dev: dev.clone(), seen: found.clone() };
        let without = settled(&port, &other).await.channels.max.combined.unwrap();
        println!("{dev} with a VF: channels {:?}; {other} without: max {without}", found.channels);
        let max = found.channels.max.combined.unwrap();
        assert!(max < without, "igb with VFs allows fewer channels: {max} vs {without}");
        let gro = found.features["rx-gro"].active;
        let claims: Claims = Arc::new(MapClaims::default());
        let state = tempfile::tempdir().unwrap();
        let claim = put_claim(
            &claims,
            "et-vfs",
            &device_name(&dev),
            &json!({"ethtool": {"features": {"rx-gro": !gro}, "channels": {"combined": max + 1}}}),
        );
        let err = prepare(&service(&claims, state.path()), &claim).await.unwrap_err();
        let expected =
            format!("ethtool.channels.combined: {}: above the maximum of {dev}, {max}", max + 1);
        assert!(err.contains(&expected), "{expected:?} missing in {err}");
        assert_eq!(settled(&port, &dev).await, found, "rx-gro never changed");
    });
}
