//! The state dir of release `bf41b58` (state format 2: VF records by PF name and index,
//! without boot id) with the current code: the journal becomes format 3, every claim keeps
//! its leases and blocks, the quarantine still runs, and the VF records get their PCI address
//! at start through the VF port (or are kept, never set back, when it cannot be found).

use std::collections::BTreeMap;
use std::time::Duration;

use super::networks::{FakeBlocks, FakeNetworks, medianet};
use super::*;
use crate::claims::networks::{IpBlockApi, NetworkPorts, PodNetworkSource};
use crate::claims::vf::tests::{FakeHost, fresh};
use crate::claims::vf::{VfPort, VfState};
use crate::ipam::{Clock, ManualClock};
use crate::model::device::AttributeValue;
use crate::model::network_config::{VfLinkState, VfVlanProtocol};
use crate::model::pod_network::IpBlock;

const VF_NET: &str = "uid-vf-net";

/// What the fixture's `vf-net` found on VF 1 of `eth9` before it.
fn before() -> VfState {
    VfState {
        mac: "02:00:00:00:00:aa".parse().unwrap(),
        vlan: 7,
        qos: 3,
        spoof_check: Some(true),
        trust: Some(false),
        max_tx_rate_mbps: 100,
        ..fresh()
    }
}

/// What `vf-net` asks of its VF.
fn applied() -> VfState {
    VfState {
        mac: "02:00:00:00:00:bb".parse().unwrap(),
        vlan: 42,
        qos: 5,
        vlan_protocol: VfVlanProtocol::Ieee8021Q,
        spoof_check: Some(false),
        trust: Some(true),
        min_tx_rate_mbps: 0,
        max_tx_rate_mbps: 200,
        link_state: VfLinkState::Auto,
    }
}

/// The API as the fixture's writer left it: `medianet` and the node's three blocks.
async fn api_of_the_fixture() -> (Arc<FakeBlocks>, Arc<FakeNetworks>) {
    let networks = Arc::new(FakeNetworks::default());
    networks.put(medianet(json!({})));
    let blocks = Arc::new(FakeBlocks::default());
    // Created in this order they get the fixture's UIDs `block-uid-0` to `-2`.
    for (name, cidr, claim) in [
        ("medianet-10-10-251-192-26", "10.10.251.192/26", None),
        ("medianet-fd00-10--84d4-aca9-4293-ef00-120", "fd00:10::84d4:aca9:4293:ef00/120", None),
        (
            "medianet-10-10-0-50-32",
            "10.10.0.50/32",
            Some(json!({"namespace": "default", "name": "db-net", "uid": "uid-db-net"})),
        ),
    ] {
        let mut spec = json!({"podNetwork": "medianet", "cidr": cidr, "nodeName": NODE});
        if let Some(claim) = claim {
            spec["claim"] = claim;
        }
        let block: IpBlock = serde_json::from_value(json!({
            "apiVersion": "netclaim.dev/v1alpha1", "kind": "IPBlock",
            "metadata": {"name": name, "labels": {"netclaim.dev/node": NODE,
                "netclaim.dev/pod-network": "medianet"}},
            "spec": spec,
        }))
        .unwrap();
        blocks.create(block).await.unwrap();
    }
    (blocks, networks)
}

/// The fixture's devices: those of the claims tests and VF 2 of `eth9`.
fn devices() -> FixedDevices {
    let mut attributes = if_name_attribute("eth9v2");
    attributes.insert("netclaim.dev/pfName".into(), AttributeValue::String("eth9".into()));
    attributes.insert("netclaim.dev/vfIndex".into(), AttributeValue::Int(2));
    fixed_devices().device("eth9v2", physical_nic("eth9v2").vf(9000), attributes)
}

/// The fixture copied to a temp dir, opened by the current code on the fixture's clock.
async fn open_fixture(host: &Arc<FakeHost>) -> (tempfile::TempDir, Arc<MapClaims>, Service) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/state-bf41b58/journal"),
        dir.path().join("journal"),
    )
    .unwrap();
    assert!(prepared_claim_versions(&dir.path().join("journal")).iter().all(|v| *v == 5));
    let (blocks, networks) = api_of_the_fixture().await;
    let api = Arc::new(MapClaims::default());
    let clock = Arc::new(ManualClock::at(1_700_000_000_000));
    let service = ClaimService::load_with_clock(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(&api),
        devices(),
        Arc::new(Store::open(dir.path()).unwrap()),
        clock as Arc<dyn Clock>,
    )
    .unwrap()
    .with_pod_networks(NetworkPorts {
        networks: networks as Arc<dyn PodNetworkSource>,
        blocks: blocks as Arc<dyn IpBlockApi>,
        release_grace: Duration::from_mins(10),
    })
    .with_vf_port(Arc::clone(host) as Arc<dyn VfPort>);
    (dir, api, service)
}

fn leases(service: &Service) -> BTreeMap<String, String> {
    lock(&service.state)
        .ipam
        .leases()
        .map(|l| (l.address.to_string(), l.owner.claim_uid.clone()))
        .collect()
}

#[tokio::test]
async fn a_state_dir_of_release_bf41b58_becomes_the_current_format_and_its_vf_records_are_found_by_pci()
 {
    // The same boot as the release before (an upgrade without a reboot): VF 1 still carries
    // the claim's settings; VF 2 is as the cut prepare left it.
    let vf2 = VfState {
        mac: "02:00:00:00:00:ab".parse().unwrap(),
        vlan: 8,
        qos: 3,
        max_tx_rate_mbps: 100,
        ..fresh()
    };
    let host = Arc::new(FakeHost::new(&[
        ("0000:09:00.1", "eth9", 1, applied()),
        ("0000:09:00.2", "eth9", 2, vf2),
    ]));
    let (dir, api, service) = open_fixture(&host).await;
    let journal = std::fs::read_to_string(dir.path().join("journal")).unwrap();
    assert!(
        journal.starts_with(&format!(
            r#"{{"format":"netclaim-state","version":{}}}"#,
            crate::store::FORMAT_VERSION
        )),
        "{journal}"
    );
    let mut names: Vec<String> = service.all_prepared().into_iter().map(|c| c.name).collect();
    names.sort();
    assert_eq!(names, ["db-net", "media-net", "vf-net", "web-net"]);
    let expected: BTreeMap<String, String> = [
        ("10.10.0.50", "uid-db-net"),
        ("10.10.251.192", "uid-media-net"),
        ("10.9.0.2", "uid-web-net"),
        ("10.9.1.7", VF_NET),
        ("fd00:10::84d4:aca9:4293:ef00", "uid-media-net"),
    ]
    .into_iter()
    .map(|(a, c)| (a.to_owned(), c.to_owned()))
    .collect();
    assert_eq!(leases(&service), expected, "every claim keeps its addresses");

    // At start: the record gets its PCI address and this boot (the VF still carries the
    // claim's settings); the snapshot of the cut prepare, of a boot nobody knows, is dropped
    // without touching VF 2.
    assert_eq!(service.restore_unrecorded_vfs().await.unwrap(), 0);
    let record = service.prepared(VF_NET).unwrap().devices[0].vf.clone().unwrap();
    assert_eq!(
        (record.pci.map(|p| p.to_string()), record.boot_id.as_deref(), record.unresolved),
        (Some("0000:09:00.1".to_owned()), Some("boot-1"), false)
    );
    assert_eq!(record.before, before());
    assert!(host.sent.lock().unwrap().is_empty(), "nothing written at the migration");
    {
        use crate::claims::vf_snapshots::VfSnapshotStore as _;
        assert!(lock(&service.state).ipam.store().load_vf_snapshots().unwrap().is_empty());
    }
    assert_eq!(prepared_claim_versions(&dir.path().join("journal")).last(), Some(&6));

    // 10.9.0.1 is still in quarantine (released at the fixture's clock): a new claim on the
    // pool gets 10.9.0.3.
    api.put(claim(
        "new-net",
        "uid-new-net",
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config(
            "FromClaim",
            DRIVER,
            &[],
            params(json!({"mode": "macvlan",
            "ipam": {"pool": {"subnet": "10.9.0.0/24"}}})),
        )],
    ));
    prepare_one(&service, &reference("new-net", "uid-new-net")).await.unwrap();
    assert_eq!(
        service.prepared("uid-new-net").unwrap().devices[0].addresses[0].to_string(),
        "10.9.0.3/24"
    );

    // The migrated record sets the VF back, found by PCI address.
    let results = service.unprepare(vec![reference("vf-net", VF_NET)]).await;
    assert!(results[VF_NET].is_ok(), "{results:?}");
    assert_eq!(host.state_of("0000:09:00.1"), before());
    assert_eq!(host.state_of("0000:09:00.2"), vf2, "VF 2 never touched");
}

#[tokio::test]
async fn a_vf_record_that_cannot_be_identified_is_kept_and_never_set_back_or_re_applied() {
    // After the upgrade `eth9` has no VF 1 (SR-IOV not set up yet, or another PF).
    let host = Arc::new(FakeHost::new(&[("0000:0a:00.1", "eth10", 1, fresh())]));
    let (_dir, _api, service) = open_fixture(&host).await;
    service.restore_unrecorded_vfs().await.unwrap();
    let record = service.prepared(VF_NET).unwrap().devices[0].vf.clone().unwrap();
    assert_eq!((record.pci, record.boot_id.as_deref(), record.unresolved), (None, None, true));
    assert_eq!(record.before, before(), "kept for the claim");
    let err = service.reapply_vf_settings(VF_NET, "vf").await.unwrap_err().to_string();
    assert!(err.contains("not found by PCI address at the upgrade"), "{err}");
    let results = service.unprepare(vec![reference("vf-net", VF_NET)]).await;
    assert!(results[VF_NET].is_ok(), "{results:?}");
    assert!(host.sent.lock().unwrap().is_empty(), "no VF written");
    assert_eq!(host.state_of("0000:0a:00.1"), fresh());
}
