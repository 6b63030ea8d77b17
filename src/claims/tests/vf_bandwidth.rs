//! `bandwidth.limit` on a VF (issue 35): the ceiling becomes the VF's hardware `max_tx_rate`
//! through the PF at prepare, with the other VF settings; it is set back as found at
//! unprepare, put back by the attach after a reboot, and a rate the PF refuses at any of
//! these steps names `bandwidth.limit` and leaves the VF as it was. The claim status says
//! `vf-max-tx-rate`. Bad bandwidth input on exclusive devices is refused at prepare naming
//! the field.

use super::*;
use crate::attach::bandwidth::{CeilingMechanism, CeilingSupport, bandwidth_data};
use crate::claims::vf::VfChange;
use crate::claims::vf::VfState;
use crate::claims::vf::tests::{FakeHost, fresh};

const VF_UID: &str = "uid-vf";
/// The PCI address of `eth9v1` (VF 1 of `eth9`) in [`FakeHost`].
const VF: &str = "0000:09:00.1";

fn vf_claim(body: Value) -> ResourceClaim {
    claim(
        "vf-net",
        VF_UID,
        vec![result("vf", DRIVER, NODE, "eth9v1")],
        vec![config("FromClaim", DRIVER, &[], params(body))],
    )
}

/// An administrator's values, a rate of 100 Mb/s among them: unprepare must give them back.
fn admin_values() -> VfState {
    VfState { vlan: 7, max_tx_rate_mbps: 100, spoof_check: Some(false), ..fresh() }
}

fn host() -> Arc<FakeHost> {
    Arc::new(FakeHost::new(&[(VF, "eth9", 1, admin_values())]))
}

fn with_host(service: Service, host: &Arc<FakeHost>) -> Service {
    service.with_vf_port(Arc::clone(host) as Arc<dyn crate::claims::vf::VfPort>)
}

fn limited() -> ResourceClaim {
    vf_claim(json!({"vlan": 42, "bandwidth": {"limit": "300M"}}))
}

fn vf_ref() -> ClaimRef {
    reference("vf-net", VF_UID)
}

/// A rate of 300 Mb/s (the claim's) is refused by the PF.
fn the_claims_rate(change: &VfChange) -> bool {
    matches!(change, VfChange::Rate { max_mbps: 300, .. })
}

/// Any rate is refused by the PF (setting it back too).
fn any_rate(change: &VfChange) -> bool {
    matches!(change, VfChange::Rate { .. })
}

fn refuse(host: &FakeHost, which: Option<fn(&VfChange) -> bool>) {
    *host.refuse.lock().unwrap() = which;
}

fn snapshots(service: &Service) -> usize {
    use crate::claims::vf_snapshots::VfSnapshotStore as _;
    lock(&service.state).ipam.store().load_vf_snapshots().unwrap().len()
}

#[tokio::test]
async fn a_limit_is_the_vfs_max_tx_rate_until_unprepare_sets_back_the_one_found() {
    let host = host();
    let api = Arc::new(MapClaims::default());
    api.put(limited());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    prepare_one(&service, &vf_ref()).await.unwrap();
    let applied = host.state_of(VF);
    assert_eq!((applied.max_tx_rate_mbps, applied.min_tx_rate_mbps, applied.vlan), (300, 0, 42));
    let device = service.prepared(VF_UID).unwrap().devices[0].clone();
    assert_eq!(device.vf.unwrap().before, admin_values(), "the rate found is what goes back");
    // `data.bandwidth` of the claim status: the hardware rate, not a qdisc.
    let data = bandwidth_data(&device.config, CeilingSupport { fq: true, pacing: true }).unwrap();
    assert_eq!(data.mechanism, CeilingMechanism::VfMaxTxRate);
    assert_eq!(
        serde_json::to_value(&data).unwrap(),
        json!({"ceiling": "300M", "source": "bandwidth.limit", "mechanism": "vf-max-tx-rate",
            "ingress": "none"})
    );
    // The attach in the same boot finds the rate in place and sends nothing.
    let sent = host.sent.lock().unwrap().len();
    service.reapply_vf_settings(VF_UID, "vf").await.unwrap();
    assert_eq!(host.sent.lock().unwrap().len(), sent);

    // A restart between prepare and unprepare: the record still knows what to set back.
    drop(service);
    let service = with_host(self::service(&api, dir.path()), &host);
    let results = service.unprepare(vec![vf_ref()]).await;
    assert!(results[VF_UID].is_ok(), "{results:?}");
    assert_eq!(host.state_of(VF), admin_values(), "100 Mb/s again, and VLAN 7");
}

#[tokio::test]
async fn a_rate_the_pf_refuses_at_prepare_names_bandwidth_limit_and_leaves_the_vf_as_it_was() {
    let host = host();
    refuse(&host, Some(the_claims_rate));
    let api = Arc::new(MapClaims::default());
    api.put(limited());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    let err = prepare_one(&service, &vf_ref()).await.unwrap_err();
    assert!(
        err.contains(
            "request vf, device eth9v1: bandwidth.limit: 300M (the VF's max_tx_rate 300 Mb/s): \
             the PF refused it (VF 1 of eth9: "
        ),
        "{err}"
    );
    assert_eq!(host.state_of(VF), admin_values(), "VLAN 42 and spoof checking set back");
    assert!(service.prepared(VF_UID).is_none());
    assert_eq!(snapshots(&service), 0, "the snapshot goes once the VF is set back");
    // The PF takes it now (kubelet retries the prepare).
    refuse(&host, None);
    prepare_one(&service, &vf_ref()).await.unwrap();
    assert_eq!(host.state_of(VF).max_tx_rate_mbps, 300);
}

#[tokio::test]
async fn a_rate_the_pf_refuses_to_set_back_fails_the_unprepare_until_it_is_set_back() {
    let host = host();
    let api = Arc::new(MapClaims::default());
    api.put(limited());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    prepare_one(&service, &vf_ref()).await.unwrap();
    refuse(&host, Some(any_rate));
    let results = service.unprepare(vec![vf_ref()]).await;
    let err = &results[VF_UID].as_ref().unwrap_err().message;
    assert!(err.contains("restoring sriov.maxTxRateMbps to 100"), "{err}");
    assert!(service.prepared(VF_UID).is_some(), "kept for kubelet's retry");
    let now = host.state_of(VF);
    assert_eq!((now.vlan, now.max_tx_rate_mbps), (7, 300), "the other fields went back");
    refuse(&host, None);
    let results = service.unprepare(vec![vf_ref()]).await;
    assert!(results[VF_UID].is_ok(), "{results:?}");
    assert_eq!(host.state_of(VF), admin_values());
    assert!(service.prepared(VF_UID).is_none());
}

#[tokio::test]
async fn after_a_reboot_the_attach_puts_the_rate_back_and_a_refusal_leaves_the_boots_values() {
    let host = host();
    let api = Arc::new(MapClaims::default());
    api.put(limited());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    prepare_one(&service, &vf_ref()).await.unwrap();
    let applied = host.state_of(VF);
    drop(service);
    // A reboot blanks the VF; the boot configures VLAN 5 on it.
    host.reboot(&[]);
    let boot_values = VfState { vlan: 5, ..fresh() };
    host.configure(VF, boot_values);
    let service = with_host(self::service(&api, dir.path()), &host);
    // The PF refuses the rate this time: the attach fails naming the limit, and what it had
    // set (VLAN 42) is set back.
    refuse(&host, Some(the_claims_rate));
    let err = service.reapply_vf_settings(VF_UID, "vf").await.unwrap_err().to_string();
    assert!(err.contains("bandwidth.limit: 300M"), "{err}");
    assert_eq!(host.state_of(VF), boot_values);
    // The kubelet's next sandbox: the rate is back with the other settings.
    refuse(&host, None);
    service.reapply_vf_settings(VF_UID, "vf").await.unwrap();
    assert_eq!(host.state_of(VF), applied, "300 Mb/s again");
    let results = service.unprepare(vec![vf_ref()]).await;
    assert!(results[VF_UID].is_ok(), "{results:?}");
    assert_eq!(host.state_of(VF), boot_values, "the boot's values, no rate");
}

#[tokio::test]
async fn bandwidth_an_exclusive_device_cannot_take_is_refused_at_prepare_naming_the_field() {
    let host = host();
    let api = Arc::new(MapClaims::default());
    let dir = tempfile::tempdir().unwrap();
    let service = with_host(service(&api, dir.path()), &host);
    let cases = [
        (
            json!({"bandwidth": {"limit": "1500k"}}),
            "bandwidth.limit: \"1500k\": a VF's max_tx_rate is set in whole Mb/s",
        ),
        (
            json!({"bandwidth": {"limit": "300M"}, "sriov": {"maxTxRateMbps": 100}}),
            "bandwidth.limit: \"300M\": sriov.maxTxRateMbps 100 sets the same VF rate",
        ),
        (json!({"bandwidth": {"limit": "fast"}}), "bandwidth.limit: \"fast\": not a quantity"),
        (
            json!({"bandwidth": {"limit": "500m"}}),
            "bandwidth.limit: \"500m\": not a whole number of bits per second",
        ),
        // A function bound to vfio-pci has no netdev to hold to a rate.
        (
            json!({"mode": "vfio", "vlan": null, "bandwidth": {"limit": "300M"}}),
            "bandwidth: {\"limit\":\"300M\"}: not with mode vfio",
        ),
    ];
    for (body, expected) in cases {
        api.put(vf_claim(body.clone()));
        let err = prepare_one(&service, &vf_ref()).await.unwrap_err();
        assert!(err.contains(expected), "{body}: {expected:?} missing in {err}");
        assert!(service.prepared(VF_UID).is_none());
    }
    assert!(host.sent.lock().unwrap().is_empty(), "nothing reached the PF");
    assert_eq!(host.state_of(VF), admin_values());
}
