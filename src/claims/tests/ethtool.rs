//! `ethtool` claims: applied at prepare through the port after a durable snapshot, what they
//! replaced kept in the record across a restart and set back at unprepare (in the same boot
//! only); a value the device refuses fails the prepare naming it and leaves nothing behind
//! (device, addresses, snapshot); a prepare killed after its changes is set back at start.

use super::*;
use crate::claims::ethtool::{EthtoolBefore, EthtoolPort};
use crate::claims::ethtool_settings::{EthtoolSnapshot, EthtoolSnapshotStore as _};
use crate::testing::ethtool::{FakeEthtool, FakeEthtoolDevice};

const UID: &str = "uid-et";

fn ethtool_claim(device: &str, body: Value) -> ResourceClaim {
    claim(
        "et-net",
        UID,
        vec![result("nic", DRIVER, NODE, device)],
        vec![config("FromClaim", DRIVER, &[], params(body))],
    )
}

fn with_kernel(service: Service, kernel: &Arc<FakeEthtool>) -> Service {
    service.with_ethtool_port(Arc::clone(kernel) as Arc<dyn EthtoolPort>)
}

fn kernel() -> Arc<FakeEthtool> {
    Arc::new(FakeEthtool::default().with("eth1", FakeEthtoolDevice::nic()))
}

fn body() -> Value {
    json!({"mode": "host-device", "ipam": {"addresses": ["10.9.1.7/24"]},
        "ethtool": {"features": {"rx-gro": false}, "rings": {"rx": 1024}, "channels": {"combined": 2}}})
}

fn snapshots(service: &Service) -> Vec<EthtoolSnapshot> {
    service.store.load_ethtool_snapshots().unwrap()
}

#[tokio::test]
async fn prepare_applies_and_unprepare_after_a_restart_sets_back_what_it_found() {
    let kernel = kernel();
    let api = Arc::new(MapClaims::default());
    api.put(ethtool_claim("eth1", body()));
    let dir = tempfile::tempdir().unwrap();
    let service = with_kernel(service(&api, dir.path()), &kernel);
    prepare_one(&service, &reference("et-net", UID)).await.unwrap();
    let now = kernel.device("eth1");
    assert!(!now.features["rx-gro"].active);
    assert_eq!(now.rings.unwrap().current.rx, Some(1024));
    assert_eq!(now.channels.unwrap().current.combined, Some(2));
    let record = service.prepared(UID).unwrap().devices[0].ethtool.clone().unwrap();
    assert_eq!(record.boot_id.as_deref(), Some("boot-1"));
    assert_eq!(record.before.as_ref().unwrap().features, [("rx-gro".to_owned(), true)].into());
    assert!(snapshots(&service).is_empty(), "the claim's commit removed the snapshot");
    // A repeated prepare answers from the record and sends nothing.
    let sent = kernel.sets.lock().unwrap().len();
    prepare_one(&service, &reference("et-net", UID)).await.unwrap();
    assert_eq!(kernel.sets.lock().unwrap().len(), sent);

    drop(service);
    let service = with_kernel(self::service(&api, dir.path()), &kernel);
    assert_eq!(service.prepared(UID).unwrap().devices[0].ethtool, Some(record));
    let results = service.unprepare(vec![reference("et-net", UID)]).await;
    assert!(results[UID].is_ok(), "{results:?}");
    assert_eq!(kernel.device("eth1"), FakeEthtoolDevice::nic(), "as found before the claim");
}

#[tokio::test]
async fn a_value_the_device_refuses_fails_the_prepare_naming_it_and_leaves_nothing() {
    let cases: [(Value, Option<&'static str>, &str); 5] = [
        (
            json!({"features": {"rx-gro": false, "rx-chksum": true}}),
            None,
            "request nic, device eth1: ethtool.features[\"rx-chksum\"]: true: the node's kernel has no such feature",
        ),
        (
            json!({"rings": {"rx": 8192}}),
            None,
            "ethtool.rings.rx: 8192: above the maximum of eth1, 4096",
        ),
        (
            json!({"features": {"rx-gro": false}, "rings": {"rx": 1024}}),
            Some("rings"),
            "ethtool.rings: {\"rx\":1024}: eth1 refused it",
        ),
        (
            json!({"features": {"rx-gro": false}, "rings": {"rx": 1024}, "channels": {"combined": 2}}),
            Some("channels"),
            "ethtool.channels: {\"combined\":2}: eth1 refused it",
        ),
        (
            json!({"features": {"tx-scatter-gather": false, "tx-tcp-segmentation": true}}),
            None,
            "ethtool.features[\"tx-tcp-segmentation\"]: true: eth1 kept it false",
        ),
    ];
    for (ethtool, failing, message) in cases {
        let kernel = kernel();
        if let Some(what) = failing {
            kernel.fail_next(what, 22);
        }
        let api = Arc::new(MapClaims::default());
        api.put(ethtool_claim(
            "eth1",
            json!({"mode": "host-device", "ipam": {"addresses": ["10.9.1.7/24"]}, "ethtool": ethtool}),
        ));
        let dir = tempfile::tempdir().unwrap();
        let service = with_kernel(service(&api, dir.path()), &kernel);
        let err = prepare_one(&service, &reference("et-net", UID)).await.unwrap_err();
        assert!(err.contains(message), "{message:?} missing in {err}");
        assert_eq!(kernel.device("eth1"), FakeEthtoolDevice::nic(), "{message}: set back");
        assert!(service.prepared(UID).is_none());
        assert_eq!(lock(&service.state).ipam.leases().count(), 0, "{message}: no address held");
        assert!(snapshots(&service).is_empty(), "{message}: no snapshot left");
    }
}

#[tokio::test]
async fn ethtool_on_a_shared_parent_or_without_the_port_is_refused_at_prepare() {
    let api = Arc::new(MapClaims::default());
    api.put(ethtool_claim("eth2", json!({"ethtool": {"features": {"rx-gro": false}}})));
    let dir = tempfile::tempdir().unwrap();
    let kernel = kernel();
    let service = with_kernel(service(&api, dir.path()), &kernel);
    let err = prepare_one(&service, &reference("et-net", UID)).await.unwrap_err();
    assert!(
        err.contains("ethtool: {\"features\":{\"rx-gro\":false}}: only for a device that moves whole into the pod (mode host-device or sriov-vf), but the mode is macvlan"),
        "{err}"
    );
    assert!(kernel.sets.lock().unwrap().is_empty());
    drop(service);
    api.put(ethtool_claim("eth1", body()));
    let err =
        prepare_one(&self::service(&api, dir.path()), &reference("et-net", UID)).await.unwrap_err();
    assert!(err.contains("ethtool: not available in this daemon"), "{err}");
}

#[tokio::test]
async fn an_unprepare_after_a_reboot_leaves_the_device_as_the_boot_configured_it() {
    let kernel = kernel();
    let api = Arc::new(MapClaims::default());
    api.put(ethtool_claim("eth1", body()));
    let dir = tempfile::tempdir().unwrap();
    let service = with_kernel(service(&api, dir.path()), &kernel);
    prepare_one(&service, &reference("et-net", UID)).await.unwrap();
    // The reboot: a new boot id, the NIC as its driver and the boot configured it.
    kernel.set_boot_id("boot-2");
    let mut booted = FakeEthtoolDevice::nic();
    booted.rings.as_mut().unwrap().current.rx = Some(512);
    kernel.set_device("eth1", booted.clone());
    let sent = kernel.sets.lock().unwrap().len();
    let results = service.unprepare(vec![reference("et-net", UID)]).await;
    assert!(results[UID].is_ok(), "{results:?}");
    assert_eq!(kernel.sets.lock().unwrap().len(), sent, "nothing written");
    assert_eq!(kernel.device("eth1"), booted);
}

#[tokio::test]
async fn a_prepare_killed_after_its_changes_is_set_back_at_start_and_another_boots_is_not() {
    for (boot, restored) in [("boot-1", 1), ("boot-0", 0)] {
        let kernel = kernel();
        let api = Arc::new(MapClaims::default());
        let dir = tempfile::tempdir().unwrap();
        let service = with_kernel(service(&api, dir.path()), &kernel);
        // What a prepare leaves when killed between its changes and its record: the snapshot
        // (synced first) and the device changed.
        let before = EthtoolBefore {
            features: [("rx-gro".to_owned(), true)].into(),
            ..EthtoolBefore::default()
        };
        service
            .store
            .save_ethtool_snapshot(&EthtoolSnapshot {
                if_name: "eth1".into(),
                boot_id: boot.into(),
                claim_uid: UID.into(),
                before,
            })
            .unwrap();
        let mut changed = FakeEthtoolDevice::nic();
        let gro = changed.features.get_mut("rx-gro").unwrap();
        (gro.active, gro.wanted) = (false, false);
        kernel.set_device("eth1", changed.clone());
        drop(service);
        let service = with_kernel(self::service(&api, dir.path()), &kernel);
        assert_eq!(service.restore_unrecorded_ethtool().await.unwrap(), restored, "{boot}");
        let expected = if restored == 1 { FakeEthtoolDevice::nic() } else { changed };
        assert_eq!(kernel.device("eth1"), expected, "{boot}");
        assert!(snapshots(&service).is_empty(), "{boot}: removed either way");
    }
}
