//! `sriov-vf` claims: VF settings applied at prepare through the port, what they replaced
//! kept in the record across a restart and set back at unprepare; a field the NIC refuses
//! fails the prepare naming it and holds nothing; a state dir of the release before loads.

use super::*;
use crate::claims::vf::tests::{FakeHost, FakePf, fresh};
use crate::claims::vf::{VfChange, VfState};
use crate::model::network_config::{VfLinkState, VfVlanProtocol};

const VF_UID: &str = "uid-vf";

fn vf_claim(body: Value) -> ResourceClaim {
    claim(
        "vf-net",
        VF_UID,
        vec![result("vf", DRIVER, NODE, "eth9v1")],
        vec![config("FromClaim", DRIVER, &[], params(body))],
    )
}

fn with_pf(service: Service, pf: &Arc<FakePf>) -> Service {
    service.with_vf_port(Arc::clone(pf) as Arc<dyn crate::claims::vf::VfPort>)
}

#[tokio::test]
async fn a_vf_claim_defaults_to_sriov_vf_and_unprepare_sets_back_what_it_found() {
    let found = VfState {
        mac: "02:00:00:00:00:aa".parse().unwrap(),
        vlan: 7,
        qos: 3,
        spoof_check: Some(false),
        trust: Some(true),
        max_tx_rate_mbps: 100,
        ..fresh()
    };
    let pf = Arc::new(FakePf::new(found));
    let api = Arc::new(MapClaims::default());
    api.put(vf_claim(json!({"interface": {"hardwareAddress": "02:00:00:00:00:bb"}, "vlan": 42,
        "sriov": {"qos": 5, "maxTxRateMbps": 200}})));
    let dir = tempfile::tempdir().unwrap();
    let service = with_pf(service(&api, dir.path()), &pf);
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    let applied = VfState {
        mac: "02:00:00:00:00:bb".parse().unwrap(),
        vlan: 42,
        qos: 5,
        vlan_protocol: VfVlanProtocol::Ieee8021Q,
        spoof_check: Some(true),
        trust: Some(false),
        min_tx_rate_mbps: 0,
        max_tx_rate_mbps: 200,
        link_state: VfLinkState::Auto,
    };
    assert_eq!(pf.state(), applied);
    let device = &service.prepared(VF_UID).unwrap().devices[0];
    assert_eq!(device.config.mode, ResolvedMode::SriovVf, "the design's default for a VF");
    let record = device.vf.clone().unwrap();
    assert_eq!((record.vf.pf.as_str(), record.vf.index, record.before), ("eth9", 1, found));
    // A repeated prepare answers from the record and sends nothing.
    let sent = pf.sent.lock().unwrap().len();
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    assert_eq!(pf.sent.lock().unwrap().len(), sent);

    // After a restart the record still knows what to set back.
    drop(service);
    let service = with_pf(self::service(&api, dir.path()), &pf);
    assert_eq!(service.prepared(VF_UID).unwrap().devices[0].vf, Some(record));
    let results = service.unprepare(vec![reference("vf-net", VF_UID)]).await;
    assert!(results[VF_UID].is_ok(), "{results:?}");
    assert_eq!(pf.state(), found, "every field as found before the claim");
    assert!(service.prepared(VF_UID).is_none());
}

#[tokio::test]
async fn a_field_the_nic_cannot_set_fails_the_prepare_naming_it_and_holds_nothing() {
    for (body, message) in [
        (
            json!({"sriov": {"linkState": "enable"}, "ipam": {"addresses": ["10.9.1.7/24"]}}),
            "request vf, device eth9v1: sriov.linkState: enable: not \
             supported by this NIC (VF 1 of eth9: ",
        ),
        (
            json!({"vlan": 5, "sriov": {"vlanProtocol": "802.1ad", "trust": true},
                "ipam": {"addresses": ["10.9.1.7/24"]}}),
            "sriov.vlanProtocol: 802.1ad: not supported by this NIC",
        ),
    ] {
        let pf = Arc::new(FakePf::new(fresh()));
        let api = Arc::new(MapClaims::default());
        api.put(vf_claim(body));
        let dir = tempfile::tempdir().unwrap();
        let service = with_pf(service(&api, dir.path()), &pf);
        let err = prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap_err();
        assert!(err.contains(message), "{message:?} missing in {err}");
        assert_eq!(pf.state(), fresh(), "set back");
        assert!(service.prepared(VF_UID).is_none());
        assert_eq!(lock(&service.state).ipam.leases().count(), 0, "no address held");
    }
}

#[tokio::test]
async fn a_vf_claim_without_vf_settings_access_or_moved_as_host_device() {
    let api = Arc::new(MapClaims::default());
    api.put(vf_claim(json!({})));
    let dir = tempfile::tempdir().unwrap();
    let err =
        prepare_one(&service(&api, dir.path()), &reference("vf-net", VF_UID)).await.unwrap_err();
    assert!(err.contains("VF settings are not available in this daemon"), "{err}");
    // host-device moves the VF without touching the PF.
    let pf = Arc::new(FakePf::new(fresh()));
    api.put(vf_claim(json!({"mode": "host-device", "vlan": null})));
    let service = with_pf(service(&api, dir.path()), &pf);
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    assert_eq!(service.prepared(VF_UID).unwrap().devices[0].vf, None);
    assert!(service.unprepare(vec![reference("vf-net", VF_UID)]).await[VF_UID].is_ok());
    assert!(pf.sent.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_state_dir_of_release_6f05957_loads_and_its_vf_claim_unprepares_without_vf_settings() {
    // Written by that release (prepared-claims version 4): `web-net` (macvlan, pool lease
    // 10.9.0.1) and `vf-nic` (the VF `eth9v1` as host-device, static 10.9.1.7, a MAC).
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/state-6f05957/journal"),
        dir.path().join("journal"),
    )
    .unwrap();
    assert!(prepared_claim_versions(&dir.path().join("journal")).iter().all(|v| *v == 4));
    let api = Arc::new(MapClaims::default());
    let pf = Arc::new(FakePf::new(fresh()));
    let service = with_pf(service(&api, dir.path()), &pf);
    let mut names: Vec<String> = service.all_prepared().into_iter().map(|c| c.name).collect();
    names.sort();
    assert_eq!(names, ["vf-nic", "web-net"]);
    let vf_nic = service.prepared("9b3f2a71-6c0e-4d5a-8e27-1f4c9d0b7e22").unwrap();
    let device = &vf_nic.devices[0];
    assert_eq!(
        (device.config.mode, device.kind, device.vf.as_ref()),
        (ResolvedMode::HostDevice, Some(DeviceKind::SriovVf), None)
    );
    let leases: Vec<String> =
        lock(&service.state).ipam.leases().map(|l| l.address.to_string()).collect();
    assert_eq!(leases, ["10.9.0.1", "10.9.1.7"]);
    // A new sriov-vf claim beside them is recorded at the new version.
    api.put(vf_claim(json!({"sriov": {"trust": true}})));
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    assert_eq!(pf.state().trust, Some(true));
    assert_eq!(prepared_claim_versions(&dir.path().join("journal")).last(), Some(&6));
    let results = service
        .unprepare(vec![
            reference("vf-nic", "9b3f2a71-6c0e-4d5a-8e27-1f4c9d0b7e22"),
            reference("vf-net", VF_UID),
        ])
        .await;
    assert!(results.values().all(Result::is_ok), "{results:?}");
    assert_eq!(pf.state(), fresh());
    assert_eq!(
        *pf.sent.lock().unwrap(),
        [VfChange::Trust(true), VfChange::Trust(false)],
        "the host-device VF of the old release was never touched"
    );
}

fn vf_snapshots(service: &Service) -> Vec<crate::claims::vf_snapshots::VfSnapshot> {
    use crate::claims::vf_snapshots::VfSnapshotStore as _;
    lock(&service.state).ipam.store().load_vf_snapshots().unwrap()
}

#[tokio::test]
async fn the_vf_snapshot_goes_with_the_claims_commit_and_with_a_failed_prepare() {
    let pf = Arc::new(FakePf::new(fresh()));
    let api = Arc::new(MapClaims::default());
    let dir = tempfile::tempdir().unwrap();
    let service = with_pf(service(&api, dir.path()), &pf);
    api.put(vf_claim(json!({"sriov": {"trust": true, "linkState": "enable"}})));
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap_err();
    assert_eq!(pf.state(), fresh());
    assert!(vf_snapshots(&service).is_empty(), "removed once the VF was set back");
    api.put(vf_claim(json!({"sriov": {"trust": true}})));
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    assert!(vf_snapshots(&service).is_empty(), "removed in the batch of the claim's record");
    assert_eq!(service.prepared(VF_UID).unwrap().devices[0].vf.clone().unwrap().before, fresh());
}

/// The kill -9 of a prepare between the VF settings and the claim's record: a panic at the
/// crash point, which ends the prepare's task there (nothing after it runs, no VF is set
/// back), then the service is dropped without a commit.
#[cfg(feature = "failpoints")]
mod killed_after_vf_apply {
    use std::cell::Cell;

    use super::*;

    thread_local! {
        static CRASH_HERE: Cell<bool> = const { Cell::new(false) };
    }

    async fn prepare_killed(service: Service, claim: ClaimRef) {
        // The failpoint registry is process-wide: only the thread of this test crashes (a
        // current-thread runtime runs the spawned prepare on it).
        fail::cfg_callback("claims.prepare.after_vf_apply", || {
            assert!(!CRASH_HERE.with(Cell::get), "killed after the VF settings were applied");
        })
        .unwrap();
        CRASH_HERE.with(|c| c.set(true));
        let service = Arc::new(service);
        let task = tokio::spawn({
            let service = Arc::clone(&service);
            async move { service.prepare_claim(&claim).await }
        });
        assert!(task.await.unwrap_err().is_panic());
        CRASH_HERE.with(|c| c.set(false));
        drop(service);
    }

    fn found() -> VfState {
        VfState { mac: "02:00:00:00:00:aa".parse().unwrap(), vlan: 7, ..fresh() }
    }

    fn start(api: &Arc<MapClaims>, dir: &std::path::Path, pf: &Arc<FakePf>) -> Service {
        with_pf(service(api, dir), pf)
    }

    async fn crash(dir: &std::path::Path) -> (Arc<MapClaims>, Arc<FakePf>) {
        let pf = Arc::new(FakePf::new(found()));
        let api = Arc::new(MapClaims::default());
        api.put(vf_claim(json!({"interface": {"hardwareAddress": "02:00:00:00:00:bb"},
            "vlan": 42, "sriov": {"trust": true}})));
        prepare_killed(start(&api, dir, &pf), reference("vf-net", VF_UID)).await;
        let on_pf = pf.state();
        assert_eq!(
            (on_pf.vlan, on_pf.trust),
            (42, Some(true)),
            "the claim's settings stay applied"
        );
        (api, pf)
    }

    #[tokio::test]
    async fn start_up_sets_the_vf_back_to_its_snapshot_and_deletes_it() {
        let dir = tempfile::tempdir().unwrap();
        let (api, pf) = crash(dir.path()).await;
        let service = start(&api, dir.path(), &pf);
        assert!(service.prepared(VF_UID).is_none(), "the claim was never recorded");
        let kept = vf_snapshots(&service);
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].claim_uid.as_str(), kept[0].before), (VF_UID, found()));
        assert_eq!(service.restore_unrecorded_vfs().await.unwrap(), 1);
        assert_eq!(pf.state(), found(), "every field as found before the claim");
        assert!(vf_snapshots(&service).is_empty());
        // Kubelet prepares again, from the VF as it was; a later restart leaves it alone.
        prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
        let record = service.prepared(VF_UID).unwrap().devices[0].vf.clone().unwrap();
        assert_eq!(record.before, found());
        let applied = pf.state();
        drop(service);
        let service = start(&api, dir.path(), &pf);
        assert_eq!(service.restore_unrecorded_vfs().await.unwrap(), 0);
        assert_eq!(pf.state(), applied, "a recorded claim's VF is not touched");
    }

    #[tokio::test]
    async fn a_repeated_prepare_records_the_snapshot_not_the_settings_on_the_pf() {
        let dir = tempfile::tempdir().unwrap();
        let (api, pf) = crash(dir.path()).await;
        // No start-up recovery (say the PF did not answer then): kubelet's repeated prepare
        // reads the claim's own settings on the PF, and still records what was there before.
        let service = start(&api, dir.path(), &pf);
        prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
        let record = service.prepared(VF_UID).unwrap().devices[0].vf.clone().unwrap();
        assert_eq!(record.before, found());
        assert!(vf_snapshots(&service).is_empty(), "removed with the claim's record");
        let results = service.unprepare(vec![reference("vf-net", VF_UID)]).await;
        assert!(results[VF_UID].is_ok(), "{results:?}");
        assert_eq!(pf.state(), found(), "nothing of the claim leaks to the VF's next claim");
    }
}

/// A PF whose `set` of a VLAN never answers, so a prepare is cut while its claim is staged.
struct StallingPf(Arc<FakePf>);

impl crate::claims::vf::VfPort for StallingPf {
    fn read<'a>(
        &'a self,
        vf: &'a crate::claims::vf::VfRef,
    ) -> futures::future::BoxFuture<'a, Result<VfState, crate::claims::vf::VfPortError>> {
        self.0.read(vf)
    }

    fn set<'a>(
        &'a self,
        vf: &'a crate::claims::vf::VfRef,
        change: VfChange,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::claims::vf::VfPortError>> {
        match change {
            VfChange::Vlan { .. } => Box::pin(std::future::pending()),
            other => self.0.set(vf, other),
        }
    }

    fn set_netdev_mac<'a>(
        &'a self,
        if_name: &'a str,
        mac: crate::model::network_config::MacAddr,
    ) -> futures::future::BoxFuture<'a, Result<(), crate::claims::vf::VfPortError>> {
        self.0.set_netdev_mac(if_name, mac)
    }

    fn pci_address<'a>(
        &'a self,
        vf: &'a crate::claims::vf::VfRef,
    ) -> futures::future::BoxFuture<
        'a,
        Result<Option<crate::model::device::PciAddress>, crate::claims::vf::VfPortError>,
    > {
        self.0.pci_address(vf)
    }

    fn locate(
        &self,
        pci: crate::model::device::PciAddress,
    ) -> futures::future::BoxFuture<
        '_,
        Result<Option<crate::claims::vf::VfRef>, crate::claims::vf::VfPortError>,
    > {
        self.0.locate(pci)
    }

    fn boot_id(&self) -> Result<String, crate::claims::vf::VfPortError> {
        self.0.boot_id()
    }
}

#[tokio::test]
async fn a_prepare_dropped_while_staged_gives_its_address_back_and_leaves_the_vf_to_its_snapshot() {
    let pf = Arc::new(FakePf::new(fresh()));
    let api = Arc::new(MapClaims::default());
    api.put(vf_claim(json!({"vlan": 42, "ipam": {"addresses": ["10.9.1.7/24"]}})));
    let dir = tempfile::tempdir().unwrap();
    let stalling = Arc::new(StallingPf(Arc::clone(&pf)));
    let service =
        service(&api, dir.path()).with_vf_port(stalling as Arc<dyn crate::claims::vf::VfPort>);
    // kubelet gives up on the call: the future is dropped while the VLAN is being set.
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        prepare_one(&service, &reference("vf-net", VF_UID)),
    )
    .await;
    assert!(cut.is_err(), "the stalled prepare cannot finish: {cut:?}");
    {
        let state = lock(&service.state);
        assert_eq!(state.ipam.leases().count(), 0, "the address is given back at once");
        assert!(state.pending.is_empty(), "nothing stays pending");
    }
    assert!(service.prepared(VF_UID).is_none());
    // The snapshot taken before the first change is durable: the next start sets it back.
    drop(service);
    let service = with_pf(self::service(&api, dir.path()), &pf);
    assert_eq!(service.restore_unrecorded_vfs().await.unwrap(), 1);
    assert_eq!(pf.state(), fresh(), "the VF set back from its snapshot");
    // And the address is free for the claim's retry.
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
}

/// The claim's VF and another PF's VF, as a [`FakeHost`] names them in its first boot.
const VF_A: &str = "0000:09:00.1";
const VF_B: &str = "0000:0a:00.1";

fn admin_values() -> VfState {
    VfState {
        mac: "02:00:00:00:00:aa".parse().unwrap(),
        vlan: 7,
        qos: 3,
        spoof_check: Some(false),
        trust: Some(true),
        max_tx_rate_mbps: 100,
        ..fresh()
    }
}

fn two_pfs() -> Arc<FakeHost> {
    let other = VfState { vlan: 9, ..fresh() };
    Arc::new(FakeHost::new(&[(VF_A, "eth9", 1, admin_values()), (VF_B, "eth10", 1, other)]))
}

fn with_host(service: Service, host: &Arc<FakeHost>) -> Service {
    service.with_vf_port(Arc::clone(host) as Arc<dyn crate::claims::vf::VfPort>)
}

fn settings_claim() -> ResourceClaim {
    vf_claim(json!({"interface": {"hardwareAddress": "02:00:00:00:00:bb"}, "vlan": 42,
        "sriov": {"qos": 5, "maxTxRateMbps": 200, "linkState": "enable"}}))
}

fn sent_count(host: &FakeHost) -> usize {
    host.sent.lock().unwrap().len()
}

#[tokio::test]
async fn after_a_reboot_the_attach_puts_the_claims_settings_back_and_unprepare_leaves_the_boots() {
    let host = two_pfs();
    let api = Arc::new(MapClaims::default());
    api.put(settings_claim());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    let applied = host.state_of(VF_A);
    assert_eq!((applied.vlan, applied.spoof_check, applied.trust), (42, Some(true), Some(false)));
    let record = service.prepared(VF_UID).unwrap().devices[0].vf.clone().unwrap();
    assert_eq!(
        (record.pci.map(|p| p.to_string()), record.boot_id.as_deref(), record.before),
        (Some(VF_A.to_owned()), Some("boot-1"), admin_values())
    );
    // The attach in the same boot reads the VF back and has nothing to send.
    let sent = sent_count(&host);
    service.reapply_vf_settings(VF_UID, "vf").await.unwrap();
    assert_eq!(sent_count(&host), sent, "a no-op costs no netlink write");

    // A reboot: the VF comes back blank and the boot configures VLAN 5 on it.
    host.reboot(&[]);
    let boot_values = VfState { vlan: 5, ..fresh() };
    host.configure(VF_A, boot_values);
    drop(service);
    let service = with_host(self::service(&api, dir.path()), &host);
    assert_eq!(service.restore_unrecorded_vfs().await.unwrap(), 0);
    // kubelet's repeated prepare is answered from the record: it sets nothing.
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    assert_eq!(host.state_of(VF_A), boot_values, "only the attach puts the settings back");
    // The new sandbox's attach does.
    service.reapply_vf_settings(VF_UID, "vf").await.unwrap();
    assert_eq!(host.state_of(VF_A), applied, "the claim's settings again, VLAN 42 and all");
    let record = service.prepared(VF_UID).unwrap().devices[0].vf.clone().unwrap();
    assert_eq!((record.boot_id.as_deref(), record.before), (Some("boot-2"), boot_values));
    // Recorded durably: a restart still sets back this boot's values.
    drop(service);
    let service = with_host(self::service(&api, dir.path()), &host);
    assert_eq!(service.prepared(VF_UID).unwrap().devices[0].vf, Some(record));
    assert_eq!(host.state_of(VF_B), fresh(), "the other PF's VF as the reboot left it");
    assert!(host.sent.lock().unwrap().iter().all(|(vf, _)| vf.pf == "eth9"), "only VF 1 of eth9");
    let results = service.unprepare(vec![reference("vf-net", VF_UID)]).await;
    assert!(results[VF_UID].is_ok(), "{results:?}");
    assert_eq!(host.state_of(VF_A), boot_values, "the boot's values, not the first boot's");
}

#[tokio::test]
async fn an_unprepare_after_a_reboot_leaves_the_vf_as_the_boot_configured_it() {
    let host = two_pfs();
    let api = Arc::new(MapClaims::default());
    api.put(settings_claim());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    drop(service);
    // The pod never comes back after the reboot: kubelet only unprepares the claim.
    host.reboot(&[]);
    let boot_values = VfState { vlan: 5, trust: Some(true), ..fresh() };
    host.configure(VF_A, boot_values);
    let service = with_host(self::service(&api, dir.path()), &host);
    let sent = sent_count(&host);
    let results = service.unprepare(vec![reference("vf-net", VF_UID)]).await;
    assert!(results[VF_UID].is_ok(), "{results:?}");
    assert_eq!(
        sent_count(&host),
        sent,
        "nothing written: the values of the first boot are dropped"
    );
    assert_eq!(host.state_of(VF_A), boot_values);
    assert!(service.prepared(VF_UID).is_none());
}

#[tokio::test]
async fn a_pf_renamed_at_boot_never_gets_another_pfs_vf_rewritten() {
    let host = two_pfs();
    let api = Arc::new(MapClaims::default());
    api.put(settings_claim());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    let applied = host.state_of(VF_A);
    drop(service);
    // The next boot names the PFs the other way round: `eth9` is now the other PF.
    host.reboot(&[(VF_A, "eth10"), (VF_B, "eth9")]);
    let (a_boot, b_boot) = (VfState { vlan: 5, ..fresh() }, VfState { vlan: 6, ..fresh() });
    host.configure(VF_A, a_boot);
    host.configure(VF_B, b_boot);
    let service = with_host(self::service(&api, dir.path()), &host);
    let sent = sent_count(&host);
    service.reapply_vf_settings(VF_UID, "vf").await.unwrap();
    assert_eq!(host.state_of(VF_A), applied, "the claim's VF, now VF 1 of eth10");
    assert_eq!(host.state_of(VF_B), b_boot, "VF 1 of the new eth9 is not the claim's");
    let results = service.unprepare(vec![reference("vf-net", VF_UID)]).await;
    assert!(results[VF_UID].is_ok(), "{results:?}");
    assert_eq!(host.state_of(VF_A), a_boot);
    assert_eq!(host.state_of(VF_B), b_boot);
    let targets: Vec<String> =
        host.sent.lock().unwrap()[sent..].iter().map(|(vf, _)| vf.to_string()).collect();
    assert!(!targets.is_empty() && targets.iter().all(|t| t == "VF 1 of eth10"), "{targets:?}");
}

#[tokio::test]
async fn after_a_reboot_the_claims_mac_goes_to_the_vfs_netdev_under_its_new_name() {
    let host = two_pfs();
    let api = Arc::new(MapClaims::default());
    api.put(settings_claim());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    prepare_one(&service, &reference("vf-net", VF_UID)).await.unwrap();
    let recorded = service.prepared(VF_UID).unwrap().devices[0].if_name.clone();
    // The boot names the VF's netdev otherwise (udev, its PF renamed); the PF's view of the
    // VF is blank, its netdev has a random MAC.
    host.reboot(&[(VF_A, "eth11")]);
    host.name_netdev(VF_A, "vf-boot2");
    assert_ne!(recorded, "vf-boot2");
    host.netdev_macs.lock().unwrap().clear();
    // The attach moves the VF by the name found now.
    assert_eq!(service.vf_netdev_name(VF_UID, "vf").await.unwrap().as_deref(), Some("vf-boot2"));
    service.reapply_vf_settings(VF_UID, "vf").await.unwrap();
    let mac: crate::model::network_config::MacAddr = "02:00:00:00:00:bb".parse().unwrap();
    assert_eq!(host.state_of(VF_A).mac, mac, "the PF's view");
    assert_eq!(
        *host.netdev_macs.lock().unwrap(),
        vec![("vf-boot2".to_owned(), mac)],
        "the netdev found by PCI address, not the name recorded at prepare ({recorded})"
    );
}
