//! The state dir of release `aa949fe` (state format 3, the last before RDMA, vfio, routing,
//! ethtool and bandwidth; written by that release's own node daemon under `netclaim dev`)
//! with the current code: the journal becomes the current format, the claim keeps its pool
//! lease and answers a repeated prepare from its record, the pod's attachment still decodes
//! with its plan (no routing, RDMA or ceiling of its own), and unprepare releases the lease.

use super::*;
use crate::attach::{AttachmentStore as _, PodAttachment};
use crate::podnet::plan::Step;

const CLAIM_UID: &str = "df1bedc3-1021-400a-a07a-febfcecbdb36";
const POD_UID: &str = "a6bceab8-b505-4b16-b59a-35a5bb0bbd36";

/// The fixture copied into a temp dir.
fn fixture_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/state-aa949fe/journal"),
        dir.path().join("journal"),
    )
    .unwrap();
    let text = std::fs::read_to_string(dir.path().join("journal")).unwrap();
    assert!(text.starts_with(r#"{"format":"netclaim-state","version":3}"#), "{text}");
    dir
}

#[tokio::test]
async fn a_state_dir_of_release_aa949fe_becomes_the_current_format_with_its_claim_and_pod() {
    let dir = fixture_dir();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let text = std::fs::read_to_string(dir.path().join("journal")).unwrap();
    assert!(
        text.starts_with(&format!(
            r#"{{"format":"netclaim-state","version":{}}}"#,
            crate::store::FORMAT_VERSION
        )),
        "a release before this format refuses the journal now: {text}"
    );
    // The pod's record decodes with the plan that release executed.
    let attachments: Vec<PodAttachment> = store.load_attachments().unwrap();
    assert_eq!(attachments.len(), 1);
    let pod = &attachments[0];
    assert_eq!((pod.pod_uid.as_str(), pod.pod_name.as_str()), (POD_UID, "web"));
    let device = &pod.devices[0];
    assert_eq!((device.claim_uid.as_str(), device.device.as_str()), (CLAIM_UID, "uplink0"));
    assert!(device.plan.steps.iter().any(|s| matches!(s, Step::CreateChild { .. })));
    assert_eq!(
        device.plan.addresses(),
        vec!["10.30.1.10/24".parse::<ipnetwork::IpNetwork>().unwrap()]
    );
    assert!(
        device.plan.steps.iter().all(|s| matches!(
            s,
            Step::CreateChild { .. }
                | Step::AddAddress { .. }
                | Step::AddRoute { .. }
                | Step::SetUp
        )),
        "a plan of that release has no step of this batch: {:?}",
        device.plan.steps
    );
    drop(store);

    // The claim service: the claim, its lease and its answer as that release left them.
    let api = Arc::new(MapClaims::default());
    let devices = FixedDevices::new().device(
        "uplink0",
        physical_nic("uplink0").shared(),
        if_name_attribute("uplink0"),
    );
    let service = ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: "dev-node-1".into() },
        Arc::clone(&api),
        devices,
        Arc::new(Store::open(dir.path()).unwrap()),
    )
    .unwrap();
    let claim = service.prepared(CLAIM_UID).expect("the fixture's claim is prepared");
    assert_eq!(claim.name, "web-net-4g5bp");
    assert_eq!(claim.devices[0].addresses, vec!["10.30.1.10/24".parse().unwrap()]);
    let leases: Vec<(String, String)> = lock(&service.state)
        .ipam
        .leases()
        .map(|l| (l.address.to_string(), l.owner.claim_uid.clone()))
        .collect();
    assert_eq!(leases, [("10.30.1.10".to_owned(), CLAIM_UID.to_owned())]);
    // Kubelet's repeated prepare after the upgrade is answered from the record, with no
    // API read (the map holds no claim: a read would fail the call).
    let answer = prepare_one(&service, &reference("web-net-4g5bp", CLAIM_UID)).await.unwrap();
    assert_eq!(answer.len(), 1);
    // Unprepare gives the address back.
    let results = service.unprepare(vec![reference("web-net-4g5bp", CLAIM_UID)]).await;
    assert!(results.values().all(Result::is_ok), "{results:?}");
    assert_eq!(lock(&service.state).ipam.leases().count(), 0);
}
