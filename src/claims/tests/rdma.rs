//! `rdma` through the claim service: validation at prepare against the devices' RDMA
//! functions (refusals name `rdma` and the fact, nothing is left held), and the CDI spec of
//! the RDMA character devices with its id in kubelet's answer, removed at unprepare and put
//! right at start.

use std::path::{Path, PathBuf};

use super::*;
use crate::cdi::LocalFiles;
use crate::claims::metadata::{DeviceMetadata, MetadataLayout};
use crate::model::device::PciAddress;
use crate::model::rdma::{RdmaFacts, RdmaNetnsMode};

const UID: &str = "5c2b8d4e-1f00-4a6b-9c3d-aa00bb11cc22";

/// An RDMA function with its two character devices; `hardware`: a PCI function behind it
/// (else software, as rxe).
fn rdma(name: &str, mode: RdmaNetnsMode, hardware: bool) -> RdmaFacts {
    let mut facts = RdmaFacts::new(name, 1);
    facts.netns_mode = Some(mode);
    facts.pci_address = hardware.then(|| "0000:3b:00.0".parse::<PciAddress>().unwrap());
    facts.char_devices =
        vec![PathBuf::from("/dev/infiniband/uverbs0"), PathBuf::from("/dev/infiniband/rdma_cm")];
    facts
}

/// `eth3`: an exclusive NIC with a hardware RDMA device, node in exclusive mode; `eth4`: a
/// shared parent with a soft-RoCE device, node in shared mode; `eth5`: an exclusive NIC with
/// a soft-RoCE device, node in exclusive mode.
fn rdma_devices() -> FixedDevices {
    FixedDevices::new()
        .device(
            "eth3",
            physical_nic("eth3").rdma(rdma("mlx5_0", RdmaNetnsMode::Exclusive, true)),
            if_name_attribute("eth3"),
        )
        .device(
            "eth4",
            physical_nic("eth4").shared().rdma(rdma("rxe0", RdmaNetnsMode::Shared, false)),
            if_name_attribute("eth4"),
        )
        .device(
            "eth5",
            physical_nic("eth5").rdma(rdma("rxe1", RdmaNetnsMode::Exclusive, false)),
            if_name_attribute("eth5"),
        )
}

struct Dirs {
    _temp: tempfile::TempDir,
    state: PathBuf,
    cdi: PathBuf,
    plugin: PathBuf,
}

fn dirs() -> Dirs {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().to_owned();
    Dirs {
        state: root.join("state"),
        cdi: root.join("cdi"),
        plugin: root.join("plugin"),
        _temp: temp,
    }
}

fn rdma_service(api: &Arc<MapClaims>, dirs: &Dirs) -> Service {
    let store = Arc::new(Store::open(&dirs.state).unwrap());
    let metadata = Arc::new(DeviceMetadata::new(
        MetadataLayout::new(DRIVER, &dirs.plugin, &dirs.cdi),
        LocalFiles,
    ));
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(api),
        rdma_devices(),
        store,
    )
    .unwrap()
    .with_metadata(metadata)
    .unwrap()
}

fn spec_path(cdi: &Path) -> PathBuf {
    cdi.join(format!("netclaim.dev_rdma_{UID}.json"))
}

fn one_device_claim(device: &str, parameters: Value) -> ResourceClaim {
    claim(
        "rdma-net",
        UID,
        vec![result("net", DRIVER, NODE, device)],
        vec![config("FromClaim", DRIVER, &["net"], params(parameters))],
    )
}

#[tokio::test]
async fn a_child_on_an_rdma_parent_gets_the_char_devices_through_a_cdi_spec_until_unprepare() {
    let api = Arc::new(MapClaims::default());
    let mut share = result("net", DRIVER, NODE, "eth4");
    share.share_id = Some("3f1c0c3e-0000-4000-8000-0000000000aa".into());
    let config = config("FromClaim", DRIVER, &["net"], params(json!({"mode": "macvlan"})));
    let claim = claim("rdma-net", UID, vec![share], vec![config]);
    api.put(claim);
    let dirs = dirs();
    let service = rdma_service(&api, &dirs);
    let devices = prepare_one(&service, &reference("rdma-net", UID)).await.unwrap();
    let rdma_id = format!("netclaim.dev/rdma={UID}_eth4");
    assert!(devices[0].cdi_device_ids.contains(&rdma_id), "{devices:?}");
    let spec: Value =
        serde_json::from_slice(&std::fs::read(spec_path(&dirs.cdi)).unwrap()).unwrap();
    assert_eq!(spec["kind"], "netclaim.dev/rdma");
    assert_eq!(spec["devices"][0]["name"], format!("{UID}_eth4"));
    assert_eq!(
        spec["devices"][0]["containerEdits"]["deviceNodes"],
        json!([{"path": "/dev/infiniband/uverbs0"}, {"path": "/dev/infiniband/rdma_cm"}])
    );
    let prepared = lock(&service.state).prepared[UID].clone();
    let rdma = prepared.devices[0].config.rdma.clone().unwrap();
    assert_eq!(
        (rdma.mode, rdma.device.as_str()),
        (crate::model::network_config::RdmaMode::Shared, "rxe0")
    );

    // A repeated prepare answers the same; a restart with the spec gone writes it again.
    assert_eq!(prepare_one(&service, &reference("rdma-net", UID)).await.unwrap(), devices);
    drop(service);
    std::fs::remove_file(spec_path(&dirs.cdi)).unwrap();
    std::fs::write(dirs.cdi.join("netclaim.dev_rdma_gone-claim.json"), b"{}").unwrap();
    let service = rdma_service(&api, &dirs);
    assert!(spec_path(&dirs.cdi).exists(), "the spec is put back at start");
    assert!(
        !dirs.cdi.join("netclaim.dev_rdma_gone-claim.json").exists(),
        "a stale spec is removed"
    );

    assert!(service.unprepare(vec![reference("rdma-net", UID)]).await[UID].is_ok());
    assert!(!spec_path(&dirs.cdi).exists(), "the spec goes at unprepare");
}

#[tokio::test]
async fn an_exclusive_nic_moves_its_rdma_device_and_gets_its_char_devices() {
    let api = Arc::new(MapClaims::default());
    api.put(one_device_claim("eth3", json!({"mode": "host-device"})));
    let dirs = dirs();
    let service = rdma_service(&api, &dirs);
    let devices = prepare_one(&service, &reference("rdma-net", UID)).await.unwrap();
    assert!(devices[0].cdi_device_ids.contains(&format!("netclaim.dev/rdma={UID}_eth3")));
    let prepared = lock(&service.state).prepared[UID].clone();
    let rdma = prepared.devices[0].config.rdma.clone().unwrap();
    assert_eq!(rdma.mode, crate::model::network_config::RdmaMode::Exclusive);
}

/// Bad input is refused at prepare naming `rdma` and the fact; nothing is written.
#[tokio::test]
async fn wrong_rdma_values_are_refused_at_prepare_naming_the_field() {
    for (device, parameters, fact) in [
        ("eth4", json!({"mode": "macvlan", "rdma": "exclusive"}), "eth4 is a shared parent"),
        ("eth5", json!({"mode": "host-device", "rdma": "exclusive"}), "rxe1 is a software device"),
        ("eth3", json!({"mode": "host-device", "rdma": "shared"}), "netns mode is exclusive"),
        ("eth2", json!({"mode": "macvlan", "rdma": "shared"}), "eth2 has no RDMA function"),
    ] {
        let api = Arc::new(MapClaims::default());
        let devices =
            rdma_devices().device("eth2", physical_nic("eth2").shared(), if_name_attribute("eth2"));
        let dirs = dirs();
        let store = Arc::new(Store::open(&dirs.state).unwrap());
        let service = ClaimService::load(
            ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
            Arc::clone(&api),
            devices,
            store,
        )
        .unwrap();
        api.put(one_device_claim(device, parameters.clone()));
        let err = prepare_one(&service, &reference("rdma-net", UID)).await.unwrap_err();
        assert!(err.contains("rdma: ") && err.contains(fact), "{parameters}: {err}");
        assert!(lock(&service.state).prepared.is_empty());
        assert!(!spec_path(&dirs.cdi).exists());
    }
}
