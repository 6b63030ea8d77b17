//! RDMA in the pod against a real kernel (issue 33 items 2, 4 and 5, decision 0019): soft-RoCE
//! (`rdma_rxe`) on a veth of the guest's root netns, created with generated names and deleted
//! even when a test fails. With the node in shared RDMA netns mode, a macvlan claim on the
//! RDMA-capable parent (the "RDMA shared device" pattern) is prepared by the daemon's claim
//! service (real store, discovery on `/sys`, device metadata on): its CDI spec lists the RDMA
//! device's character devices, each a character device node with the numbers sysfs gives, and
//! the id is in kubelet's answer; unprepare removes it. With the node switched to exclusive
//! mode (`rdma system set netns exclusive`, which the kernel allows only while no other netns
//! exists: this suite needs a guest of its own), `rdma: exclusive` on the rxe netdev is refused
//! at prepare naming `rdma` and the fact, the netdev and the RDMA device left as they were; and
//! our move (`RDMA_NLDEV_CMD_SET` + `RDMA_NLDEV_NET_NS_FD` from `host::rdma_move`) gets the
//! kernel's `EOPNOTSUPP` for it, leaving it in the host. rxe cannot move (no
//! `disassociate_ucontext` in 6.1 and 6.12): the move itself is proven on the fake kernel only.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use netclaim::cdi::LocalFiles;
use netclaim::claims::metadata::{DeviceMetadata, MetadataLayout};
use netclaim::claims::{ClaimPreparer as _, ClaimService, ServiceIdentity};
use netclaim::host::discovery::{HostDevices, discover, host_devices};
use netclaim::host::netlink::{HostNetlink, NetlinkOps};
use netclaim::host::sysfs::Sysfs;
use netclaim::inventory::{Inventory, Selection, SharingMode};
use netclaim::model::ClaimRef;
use netclaim::podnet::{LinkPort, Side};
use netclaim::store::Store;
use serde_json::{Value, json};

use crate::kit::netns::Netns;
use crate::kit::testing::claims::MapClaims;
use crate::kit::vm::{ip, report, require_vm};

const DRIVER: &str = "netclaim.dev";
const NODE: &str = "vm-node";
/// `EOPNOTSUPP`: the kernel's answer to moving a device whose driver cannot change netns.
const EOPNOTSUPP: i32 = 95;

fn rdma(args: &[&str]) -> std::process::Output {
    Command::new("rdma").args(args).output().unwrap()
}

/// `rdma system set netns <mode>`, retried while a destroyed netns is still being cleaned up
/// (the kernel refuses a switch with `EBUSY` while any netns but the initial one exists).
fn set_netns_mode(mode: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let output = rdma(&["system", "set", "netns", mode]);
        if output.status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "rdma system set netns {mode}: {} (another netns exists: this suite needs a guest \
             of its own)",
            String::from_utf8_lossy(&output.stderr)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Puts the node back in shared mode (the kernel's default) when a test ends, failed or not.
struct ModeGuard;

impl Drop for ModeGuard {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !rdma(&["system", "set", "netns", "shared"]).status.success()
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A veth pair with a soft-RoCE device on its first end, generated names, deleted on drop.
struct RxeLink {
    netdev: String,
    device: String,
}

impl RxeLink {
    fn create() -> Self {
        let output = Command::new("modprobe")
            .args(["-a", "rdma_rxe", "ib_uverbs", "ib_umad", "rdma_ucm"])
            .output()
            .unwrap();
        assert!(output.status.success(), "modprobe: {}", String::from_utf8_lossy(&output.stderr));
        let tag = format!("{:04x}", fastrand::u16(..));
        let link = Self { netdev: format!("nrp{tag}a"), device: format!("nrp{tag}") };
        let peer = format!("nrp{tag}b");
        ip(&["link", "add", &link.netdev, "type", "veth", "peer", "name", &peer]);
        ip(&["link", "set", &link.netdev, "up"]);
        ip(&["link", "set", &peer, "up"]);
        let output = rdma(&["link", "add", &link.device, "type", "rxe", "netdev", &link.netdev]);
        assert!(
            output.status.success(),
            "rdma link add: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        link
    }

    fn registered(&self) -> bool {
        Path::new("/sys/class/infiniband").join(&self.device).exists()
    }
}

impl Drop for RxeLink {
    fn drop(&mut self) {
        if self.registered() {
            let _ignored = rdma(&["link", "delete", &self.device]);
        }
        let _ignored = Command::new("ip").args(["link", "del", &self.netdev]).status();
    }
}

/// The daemon's claim service with device metadata (and so CDI specs) under `dir`.
fn service(
    claims: &Arc<MapClaims>,
    dir: &Path,
    selection: Selection,
) -> ClaimService<Arc<MapClaims>, HostDevices, Arc<Store>> {
    let metadata = Arc::new(DeviceMetadata::new(
        MetadataLayout::new(DRIVER, &dir.join("plugin"), &dir.join("cdi")),
        LocalFiles,
    ));
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(claims),
        host_devices("/sys".into(), selection),
        Arc::new(Store::open(dir.join("state")).unwrap()),
    )
    .unwrap()
    .with_metadata(metadata)
    .unwrap()
}

/// The published name of the device on `netdev`.
async fn device_name(netdev: &str, selection: &Selection) -> String {
    let interfaces = discover(&Sysfs::new(PathBuf::from("/sys"))).await.unwrap();
    let inventory = Inventory::build(&interfaces, selection);
    let device = inventory.devices.iter().find(|d| d.if_name == netdev).unwrap();
    report(&format!("vm-rdma-pod device {}: {:?}", device.name, device.attributes));
    device.name.clone()
}

/// A claim `name` allocated `device` (a share when `share_id` is set) with `config`.
fn put_claim(
    claims: &MapClaims,
    name: &str,
    device: &str,
    share_id: Option<&str>,
    config: &Value,
) -> ClaimRef {
    let uid = format!("uid-{name}");
    let mut parameters = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
    parameters.as_object_mut().unwrap().extend(config.as_object().unwrap().clone());
    let mut result = json!({"request": "net", "driver": DRIVER, "pool": NODE, "device": device});
    if let Some(share) = share_id {
        result["shareID"] = json!(share);
    }
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {},
        "status": {
            "allocation": {"devices": {
                "results": [result],
                "config": [{"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}}]
            }},
            "reservedFor": [{"resource": "pods", "name": "pod", "uid": "pod-uid"}]
        }
    }))
    .unwrap();
    claims.put(claim);
    ClaimRef { namespace: "default".into(), name: name.into(), uid }
}

/// The `dev` numbers (`major:minor`) sysfs gives the character device `/dev/infiniband/<name>`.
fn sysfs_numbers(node: &Path) -> (u64, u64) {
    let name = node.file_name().unwrap().to_string_lossy().into_owned();
    let class = if name.starts_with("uverbs") {
        "infiniband_verbs"
    } else if name.starts_with("umad") || name.starts_with("issm") {
        "infiniband_mad"
    } else {
        "misc"
    };
    let text = std::fs::read_to_string(Path::new("/sys/class").join(class).join(&name).join("dev"))
        .unwrap_or_else(|err| panic!("sysfs dev of {name}: {err}"));
    let (major, minor) = text.trim().split_once(':').unwrap();
    (major.parse().unwrap(), minor.parse().unwrap())
}

/// Whether `/sys/class/<class>/<name>` belongs to RDMA device `device`.
fn owns(class: &str, name: &str, device: &str) -> bool {
    std::fs::read_to_string(Path::new("/sys/class").join(class).join(name).join("ibdev"))
        .is_ok_and(|ibdev| ibdev.trim() == device)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn a_child_on_an_rdma_parent_gets_its_char_devices_through_the_cdi_spec() {
    require_vm("a_child_on_an_rdma_parent_gets_its_char_devices_through_the_cdi_spec");
    let _mode = ModeGuard;
    set_netns_mode("shared");
    let link = RxeLink::create();
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(MapClaims::default());
    let parents = [link.netdev.clone()];
    let selection = Selection::new(&parents, &[], &parents, SharingMode::Capacity).unwrap();
    runtime().block_on(async {
        let device = device_name(&link.netdev, &selection).await;
        let service = service(&claims, dir.path(), selection);
        let claim = put_claim(
            &claims,
            "child",
            &device,
            Some("3f1c0c3e-0000-4000-8000-00000000c0de"),
            &json!({"mode": "macvlan"}),
        );
        let mut answers = service.prepare(vec![claim.clone()]).await;
        let answer = answers.remove(&claim.uid).unwrap().map_err(|f| f.message).unwrap();
        let id = format!("{DRIVER}/rdma={}_{device}", claim.uid);
        assert!(answer[0].cdi_device_ids.contains(&id), "{answer:?}");

        let spec_path = dir.path().join("cdi").join(format!("{DRIVER}_rdma_{}.json", claim.uid));
        let spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
        report(&format!("vm-rdma-pod spec: {spec}"));
        assert_eq!(spec["kind"], format!("{DRIVER}/rdma"));
        assert_eq!(spec["devices"][0]["name"], format!("{}_{device}", claim.uid));
        let nodes: Vec<PathBuf> = spec["devices"][0]["containerEdits"]["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|node| PathBuf::from(node["path"].as_str().unwrap()))
            .collect();
        // The device's own uverbs and umad, and the node's rdma_cm.
        let named = |class: &str, prefix: &str| {
            nodes.iter().any(|n| {
                let name = n.file_name().unwrap().to_string_lossy();
                name.starts_with(prefix) && owns(class, &name, &link.device)
            })
        };
        assert!(named("infiniband_verbs", "uverbs"), "{nodes:?}");
        assert!(named("infiniband_mad", "umad"), "{nodes:?}");
        assert!(nodes.contains(&PathBuf::from("/dev/infiniband/rdma_cm")), "{nodes:?}");
        for node in &nodes {
            let meta =
                std::fs::metadata(node).unwrap_or_else(|err| panic!("{}: {err}", node.display()));
            assert!(meta.file_type().is_char_device(), "{} is a character device", node.display());
            let (major, minor) = sysfs_numbers(node);
            let rdev = meta.rdev();
            assert_eq!(
                (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)),
                (major, minor),
                "{}",
                node.display()
            );
        }

        let results = service.unprepare(vec![claim.clone()]).await;
        assert!(results[&claim.uid].is_ok(), "{results:?}");
        assert!(!spec_path.exists(), "the spec goes at unprepare");
    });
    assert!(link.registered());
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn the_exclusive_move_of_an_rxe_device_is_refused_and_both_stay_in_the_host() {
    require_vm("the_exclusive_move_of_an_rxe_device_is_refused_and_both_stay_in_the_host");
    let _mode = ModeGuard;
    set_netns_mode("exclusive");
    let link = RxeLink::create();
    let dir = tempfile::tempdir().unwrap();
    let claims = Arc::new(MapClaims::default());
    let selection =
        Selection::new(std::slice::from_ref(&link.netdev), &[], &[], SharingMode::Capacity)
            .unwrap();
    runtime().block_on(async {
        let device = device_name(&link.netdev, &selection).await;
        let service = service(&claims, dir.path(), selection);
        let claim = put_claim(
            &claims,
            "moved",
            &device,
            None,
            &json!({"mode": "host-device", "rdma": "exclusive"}),
        );
        let mut answers = service.prepare(vec![claim.clone()]).await;
        let message = answers.remove(&claim.uid).unwrap().unwrap_err().message;
        report(&format!("vm-rdma-pod refusal: {message}"));
        assert!(message.contains("rdma: \"exclusive\""), "{message}");
        assert!(
            message.contains(&format!("RDMA device {} is a software device", link.device)),
            "{message}"
        );
        assert!(!dir.path().join("cdi").join(format!("{DRIVER}_rdma_{}.json", claim.uid)).exists());

        // The same claim without `rdma`: the default leaves the RDMA device alone.
        let plain = put_claim(&claims, "plain", &device, None, &json!({"mode": "host-device"}));
        let mut answers = service.prepare(vec![plain.clone()]).await;
        let answer = answers.remove(&plain.uid).unwrap().map_err(|f| f.message).unwrap();
        assert!(answer[0].cdi_device_ids.iter().all(|id| !id.contains("/rdma=")), "{answer:?}");
        let results = service.unprepare(vec![plain.clone()]).await;
        assert!(results[&plain.uid].is_ok(), "{results:?}");

        // Our move, asked anyway: the kernel's EOPNOTSUPP, and the device stays in the host.
        let pod = Netns::new();
        let host = HostNetlink::current().unwrap();
        let ops = NetlinkOps::open(&host, &Path::new("/run/netns").join(&pod.name)).await.unwrap();
        let index =
            ops.rdma_device(Side::Host, &link.device).await.unwrap().expect("visible in the host");
        assert_eq!(
            ops.rdma_device(Side::Pod, &link.device).await.unwrap(),
            None,
            "exclusive mode hides it from the pod"
        );
        let err = ops.move_rdma(Side::Host, index).await.unwrap_err();
        assert_eq!(err.errno(), Some(EOPNOTSUPP), "{err}");
        assert_eq!(ops.rdma_device(Side::Host, &link.device).await.unwrap(), Some(index));
        drop(ops);
        drop(pod);
    });
    // The netdev and the RDMA device as they were.
    let shown = Command::new("ip").args(["-j", "link", "show", &link.netdev]).output().unwrap();
    assert!(shown.status.success(), "{} is in the host netns", link.netdev);
    assert!(link.registered(), "{} is still registered", link.device);
    let dev = rdma(&["dev", "show", &link.device]);
    assert!(dev.status.success(), "rdma dev show: {}", String::from_utf8_lossy(&dev.stderr));
}
