//! Device metadata (KEP-5304) through the claim service: files and CDI specs on a real
//! filesystem in a temp dir, written at prepare, rewritten from statuses, removed at
//! unprepare, put right at start. Also the 1.37 request and consumer semantics that decide
//! what kubelet gets back.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, NetworkDeviceData};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::*;
use crate::cdi::LocalFiles;
use crate::claims::metadata::{
    DeviceMetadata, MetadataLayout, MetadataStore, POD_CLAIM_NAME_ANNOTATION, WrittenMetadata,
};
use crate::model::cause::Cause;

const UID: &str = "7a0f00be-daef-426e-901c-c8766c92ab18";

/// A claim from the template entry `net` with a `firstAvailable` result `net/fast` (a share
/// of `eth2` from a pool) and a plain request `mgmt` (`eth1`).
fn template_claim() -> ResourceClaim {
    let mut fast = result("net/fast", DRIVER, NODE, "eth2");
    fast.share_id = Some("3f1c0c3e-0000-4000-8000-000000000001".into());
    let mut claim = claim(
        "web-net-x7k2p",
        UID,
        vec![fast, result("mgmt", DRIVER, NODE, "eth1")],
        vec![
            config("FromClaim", DRIVER, &["net"], pool_config()),
            config("FromClaim", DRIVER, &["mgmt"], params(json!({"mode": "host-device"}))),
        ],
    );
    claim.metadata.annotations =
        Some([(POD_CLAIM_NAME_ANNOTATION.to_owned(), "net".to_owned())].into());
    claim.metadata.owner_references = Some(vec![pod_owner()]);
    claim
}

/// The owner reference the resourceclaim controller puts on a claim it makes for a pod.
fn pod_owner() -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "pod-1".into(),
        uid: "pod-1-uid".into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The container path of the `net` request's metadata after preparing `claim`.
async fn container_path_of(claim: ResourceClaim) -> (Value, Value) {
    let api = Arc::new(MapClaims::default());
    api.put(claim);
    let dirs = dirs();
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap();
    let spec: Value = serde_json::from_slice(
        &std::fs::read(dirs.cdi.join(format!("netclaim.dev_metadata_{UID}_net.json"))).unwrap(),
    )
    .unwrap();
    let file = dirs.plugin.join("dra-device-metadata/default_web-net-x7k2p/net/metadata.json");
    (
        spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"].clone(),
        documents(&file)[0].get("podClaimName").cloned().unwrap_or(Value::Null),
    )
}

/// `resource.kubernetes.io/pod-claim-name` goes into the container path: a value that is not
/// a DNS label (`../..` climbed out of the metadata directory inside the container), or one
/// on a claim no Pod owns (anyone who can create a claim can annotate it), is not used; the
/// claim is then mounted under its own name, as one the pod names directly.
#[tokio::test]
async fn a_pod_claim_name_is_trusted_only_as_a_dns_label_on_a_claim_a_pod_owns() {
    let by_name = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/web-net-x7k2p/net/netclaim.dev-metadata.json";
    for hostile in ["../..", "../../../etc", "net/../../x", "NET", "", &"a".repeat(64)] {
        let mut claim = template_claim();
        claim.metadata.annotations =
            Some([(POD_CLAIM_NAME_ANNOTATION.to_owned(), hostile.to_owned())].into());
        assert_eq!(container_path_of(claim).await, (json!(by_name), Value::Null), "{hostile:?}");
    }
    let mut unowned = template_claim();
    unowned.metadata.owner_references = None;
    assert_eq!(container_path_of(unowned).await, (json!(by_name), Value::Null));
    let mut owned_by_other_kind = template_claim();
    owned_by_other_kind.metadata.owner_references =
        Some(vec![OwnerReference { kind: "ReplicaSet".into(), ..pod_owner() }]);
    assert_eq!(container_path_of(owned_by_other_kind).await, (json!(by_name), Value::Null));
    assert_eq!(
        container_path_of(template_claim()).await,
        (
            json!(
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/net/net/netclaim.dev-metadata.json"
            ),
            json!("net")
        )
    );
}

struct Dirs {
    _temp: tempfile::TempDir,
    state: PathBuf,
    plugin: PathBuf,
    cdi: PathBuf,
}

fn dirs() -> Dirs {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().to_owned();
    Dirs {
        state: root.join("state"),
        plugin: root.join("plugin"),
        cdi: root.join("cdi"),
        _temp: temp,
    }
}

fn layout(dirs: &Dirs) -> MetadataLayout {
    MetadataLayout::new(DRIVER, &dirs.plugin, &dirs.cdi)
}

fn service_with_metadata(
    api: &Arc<MapClaims>,
    dirs: &Dirs,
    files: impl MetadataStore,
) -> (Service, Arc<DeviceMetadata>) {
    let metadata = Arc::new(DeviceMetadata::new(layout(dirs), files));
    let service = service(api, &dirs.state).with_metadata(Arc::clone(&metadata)).unwrap();
    (service, metadata)
}

fn read_written(path: &Path) -> WrittenMetadata {
    WrittenMetadata::parse(&std::fs::read(path).unwrap()).expect("our metadata file")
}

fn documents(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn ready(device: &str, share_id: Option<&str>, ip: &str) -> AllocatedDeviceStatus {
    AllocatedDeviceStatus {
        driver: DRIVER.into(),
        pool: NODE.into(),
        device: device.into(),
        share_id: share_id.map(str::to_owned),
        network_data: Some(NetworkDeviceData {
            interface_name: Some("net1".into()),
            ips: Some(vec![ip.into()]),
            hardware_address: Some("02:00:00:00:00:01".into()),
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn prepare_writes_one_file_and_spec_per_top_level_request_and_returns_their_cdi_ids() {
    let api = Arc::new(MapClaims::default());
    api.put(template_claim());
    let dirs = dirs();
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    let devices = prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap();
    let ids: Vec<(Vec<String>, Vec<String>)> =
        devices.iter().map(|d| (d.request_names.clone(), d.cdi_device_ids.clone())).collect();
    assert_eq!(
        ids,
        [
            (vec!["net".to_owned()], vec![format!("netclaim.dev/metadata={UID}_net")]),
            (vec!["mgmt".to_owned()], vec![format!("netclaim.dev/metadata={UID}_mgmt")]),
        ]
    );
    let file = dirs.plugin.join("dra-device-metadata/default_web-net-x7k2p/net/metadata.json");
    let stream = documents(&file);
    assert_eq!(stream.len(), 2);
    assert_eq!(stream[0]["apiVersion"], "metadata.resource.k8s.io/v1beta1");
    assert_eq!(stream[1]["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    let first = &stream[0];
    assert_eq!(first["kind"], "DeviceMetadata");
    assert_eq!(
        first["metadata"],
        json!({"name": "web-net-x7k2p", "namespace": "default", "uid": UID, "generation": 1})
    );
    assert_eq!(first["podClaimName"], "net");
    assert_eq!(
        first["requests"],
        json!([{"name": "net/fast", "devices": [{
            "driver": DRIVER, "pool": NODE, "name": "eth2",
            "attributes": {"netclaim.dev/ifName": {"string": "eth2"}},
        }]}])
    );
    let spec: Value = serde_json::from_slice(
        &std::fs::read(dirs.cdi.join(format!("netclaim.dev_metadata_{UID}_net.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(spec["cdiVersion"], "0.5.0");
    assert_eq!(spec["kind"], "netclaim.dev/metadata");
    assert_eq!(spec["devices"][0]["name"], format!("{UID}_net"));
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"][0],
        json!({
            "hostPath": file,
            "containerPath": "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/net/net/netclaim.dev-metadata.json",
            "options": ["ro", "bind"],
        })
    );
    assert!(dirs.cdi.join(format!("netclaim.dev_metadata_{UID}_mgmt.json")).exists());
    // A repeat answers the same, from the record.
    assert_eq!(prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap(), devices);
    // Kept across a restart, with the same answer.
    drop(service);
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    assert_eq!(prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap(), devices);
}

#[tokio::test]
async fn a_claim_named_by_the_pod_is_mounted_under_resourceclaims() {
    let api = Arc::new(MapClaims::default());
    api.put(simple_claim("db", "u-db"));
    let dirs = dirs();
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    prepare_one(&service, &reference("db", "u-db")).await.unwrap();
    let spec: Value = serde_json::from_slice(
        &std::fs::read(dirs.cdi.join("netclaim.dev_metadata_u-db_nic.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"],
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/db/nic/netclaim.dev-metadata.json"
    );
    let file = dirs.plugin.join("dra-device-metadata/default_db/nic/metadata.json");
    assert!(documents(&file)[0].get("podClaimName").is_none());
}

#[tokio::test]
async fn statuses_rewrite_the_file_in_place_with_a_growing_generation() {
    let api = Arc::new(MapClaims::default());
    api.put(template_claim());
    let dirs = dirs();
    let (service, metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap();
    let file = dirs.plugin.join("dra-device-metadata/default_web-net-x7k2p/net/metadata.json");
    let mgmt = dirs.plugin.join("dra-device-metadata/default_web-net-x7k2p/mgmt/metadata.json");
    let inode = std::fs::metadata(&file).unwrap().ino();
    let share = Some("3f1c0c3e-0000-4000-8000-000000000001");

    let attached = ready("eth2", share, "10.9.0.1/24");
    metadata.update_network(UID, std::slice::from_ref(&attached));
    assert_eq!(std::fs::metadata(&file).unwrap().ino(), inode, "rewritten in place");
    let stream = documents(&file);
    assert_eq!(stream[0]["metadata"]["generation"], 2);
    assert_eq!(
        stream[1]["requests"][0]["devices"][0]["networkData"],
        json!({"interfaceName": "net1", "ips": ["10.9.0.1/24"], "hardwareAddress": "02:00:00:00:00:01"})
    );
    // The other request's file did not change.
    assert_eq!(read_written(&mgmt).generation, 1);
    // The same status again writes nothing; a status of another share matches nothing.
    metadata.update_network(UID, std::slice::from_ref(&attached));
    metadata.update_network(UID, &[ready("eth2", Some("another-share"), "10.9.0.9/24")]);
    assert_eq!(read_written(&file).generation, 2);
    // Stopped: the entry has no networkData any more.
    let stopped = AllocatedDeviceStatus { network_data: None, ..attached };
    metadata.update_network(UID, &[stopped]);
    let written = read_written(&file);
    assert_eq!((written.generation, written.network.len()), (3, 0));
    // A claim this service does not know is ignored.
    metadata.update_network("other-uid", &[ready("eth2", share, "10.9.0.1/24")]);
}

#[tokio::test]
async fn unprepare_removes_the_files_and_specs_and_a_retry_removes_what_is_left() {
    let api = Arc::new(MapClaims::default());
    api.put(template_claim());
    let dirs = dirs();
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap();
    let claim_dir = dirs.plugin.join("dra-device-metadata/default_web-net-x7k2p");
    assert!(claim_dir.exists());
    assert!(service.unprepare(vec![reference("web-net-x7k2p", UID)]).await[UID].is_ok());
    assert!(!claim_dir.exists());
    assert!(std::fs::read_dir(&dirs.cdi).unwrap().next().is_none(), "no spec left");
    // Files of a claim that is no longer prepared (a crash after the record was removed)
    // go with kubelet's repeated unprepare.
    let spec = dirs.cdi.join(format!("netclaim.dev_metadata_{UID}_net.json"));
    std::fs::write(&spec, b"{}").unwrap();
    assert!(service.unprepare(vec![reference("web-net-x7k2p", UID)]).await[UID].is_ok());
    assert!(!spec.exists());
}

#[tokio::test]
async fn a_new_claim_of_the_same_name_keeps_its_files_when_the_old_one_is_unprepared() {
    let api = Arc::new(MapClaims::default());
    api.put(simple_claim("db", "u-old"));
    let dirs = dirs();
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    prepare_one(&service, &reference("db", "u-old")).await.unwrap();
    // Deleted and created again under the same name; kubelet prepares the new one first.
    api.put(simple_claim("db", "u-new"));
    prepare_one(&service, &reference("db", "u-new")).await.unwrap();
    let file = dirs.plugin.join("dra-device-metadata/default_db/nic/metadata.json");
    let written = read_written(&file);
    assert_eq!((written.uid.as_str(), written.generation), ("u-new", 2), "generation grows");
    assert!(service.unprepare(vec![reference("db", "u-old")]).await["u-old"].is_ok());
    assert_eq!(read_written(&file).uid, "u-new", "the new claim's file stays");
    assert!(!dirs.cdi.join("netclaim.dev_metadata_u-old_nic.json").exists());
    assert!(dirs.cdi.join("netclaim.dev_metadata_u-new_nic.json").exists());
}

#[tokio::test]
async fn a_restart_keeps_generation_and_network_data_rewrites_what_is_missing_and_removes_leftovers()
 {
    let api = Arc::new(MapClaims::default());
    api.put(template_claim());
    let dirs = dirs();
    let (service, metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap();
    let share = Some("3f1c0c3e-0000-4000-8000-000000000001");
    metadata.update_network(UID, &[ready("eth2", share, "10.9.0.1/24")]);
    drop((service, metadata));
    let file = dirs.plugin.join("dra-device-metadata/default_web-net-x7k2p/net/metadata.json");
    let inode = std::fs::metadata(&file).unwrap().ino();
    // A reboot emptied the CDI dir; a crashed prepare left files of a claim never recorded.
    let spec = dirs.cdi.join(format!("netclaim.dev_metadata_{UID}_net.json"));
    std::fs::remove_file(&spec).unwrap();
    let ghost_spec = dirs.cdi.join("netclaim.dev_metadata_ghost-uid_nic.json");
    std::fs::write(&ghost_spec, b"{}").unwrap();
    let other_driver = dirs.cdi.join("gpu.example.com_metadata_ghost-uid_gpu.json");
    std::fs::write(&other_driver, b"{}").unwrap();
    let ghost_dir = dirs.plugin.join("dra-device-metadata/default_ghost/nic");
    std::fs::create_dir_all(&ghost_dir).unwrap();

    let (_service, metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    assert!(spec.exists(), "missing spec written again");
    assert!(!ghost_spec.exists() && !ghost_dir.exists(), "leftovers removed");
    assert!(other_driver.exists(), "another driver's spec is not ours to remove");
    assert_eq!(std::fs::metadata(&file).unwrap().ino(), inode, "the file was kept");
    let written = read_written(&file);
    assert_eq!((written.generation, written.network.len()), (2, 1));
    // The same status after the restart changes nothing; a stop writes generation 3.
    metadata.update_network(UID, &[ready("eth2", share, "10.9.0.1/24")]);
    assert_eq!(read_written(&file).generation, 2);
    metadata.update_network(
        UID,
        &[AllocatedDeviceStatus { network_data: None, ..ready("eth2", share, "10.9.0.1/24") }],
    );
    assert_eq!(read_written(&file).generation, 3);
}

/// Local files, except that CDI specs cannot be written.
struct ReadOnlyCdiDir(PathBuf);

impl MetadataStore for ReadOnlyCdiDir {
    fn write_in_place(&self, path: &Path, contents: &[u8]) -> Result<(), Cause> {
        LocalFiles.write_in_place(path, contents)
    }
    fn replace(&self, path: &Path, _contents: &[u8]) -> Result<(), Cause> {
        assert!(path.starts_with(&self.0));
        Err(crate::model::cause::cause(std::io::Error::from_raw_os_error(30)))
    }
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, Cause> {
        LocalFiles.read(path)
    }
    fn remove_file(&self, path: &Path) -> Result<(), Cause> {
        LocalFiles.remove_file(path)
    }
    fn remove_dir_all(&self, path: &Path) -> Result<(), Cause> {
        LocalFiles.remove_dir_all(path)
    }
    fn list(&self, dir: &Path) -> Result<Vec<String>, Cause> {
        LocalFiles.list(dir)
    }
}

#[tokio::test]
async fn a_metadata_write_failure_fails_prepare_and_leaves_nothing_behind() {
    let api = Arc::new(MapClaims::default());
    api.put(template_claim());
    let dirs = dirs();
    let (service, _metadata) = service_with_metadata(&api, &dirs, ReadOnlyCdiDir(dirs.cdi.clone()));
    let err = prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap_err();
    assert!(
        err.contains("writing device metadata")
            && err.contains(&format!("netclaim.dev_metadata_{UID}_net.json")),
        "{err}"
    );
    assert!(service.prepared(UID).is_none());
    assert_eq!(lock(&service.state).ipam.leases().count(), 0, "the lease was given back");
    assert!(!dirs.plugin.join("dra-device-metadata/default_web-net-x7k2p").exists());
}

#[tokio::test]
async fn without_metadata_request_names_are_still_top_level_and_there_are_no_cdi_ids() {
    let api = Arc::new(MapClaims::default());
    api.put(template_claim());
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let devices = prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap();
    assert_eq!(devices[0].request_names, ["net"]);
    assert!(devices.iter().all(|d| d.cdi_device_ids.is_empty()));
    // The record keeps the full request name (config and status use it).
    assert_eq!(service.prepared(UID).unwrap().devices[0].request, "net/fast");
}

#[tokio::test]
async fn a_claim_reserved_for_a_pod_group_is_refused_naming_the_group() {
    let api = Arc::new(MapClaims::default());
    let mut claim = simple_claim("gang", "u-gang");
    claim.status.as_mut().unwrap().reserved_for = Some(vec![ResourceClaimConsumerReference {
        api_group: Some("scheduling.k8s.io".into()),
        resource: "podgroups".into(),
        name: "trainers".into(),
        uid: "pg-uid-1".into(),
    }]);
    api.put(claim);
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let err = prepare_one(&service, &reference("gang", "u-gang")).await.unwrap_err();
    assert!(
        err.contains("PodGroupUnsupported") && err.contains("trainers") && err.contains("pg-uid-1"),
        "{err}"
    );
    assert!(service.prepared("u-gang").is_none());
}

#[tokio::test]
async fn config_with_an_empty_requests_list_applies_to_every_request() {
    let api = Arc::new(MapClaims::default());
    let mut empty = config("FromClass", DRIVER, &[], params(json!({"interface": {"mtu": 1400}})));
    // Kubernetes 1.37 writes an explicit empty list when a config covers every request.
    empty.requests = Some(vec![]);
    api.put(claim(
        "both",
        "u-both",
        vec![result("net/fast", DRIVER, NODE, "eth2"), result("mgmt", DRIVER, NODE, "eth1")],
        vec![empty, config("FromClaim", DRIVER, &["net"], params(json!({"mode": "macvlan"})))],
    ));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    prepare_one(&service, &reference("both", "u-both")).await.unwrap();
    let prepared = service.prepared("u-both").unwrap();
    let mtus: Vec<(String, u32)> =
        prepared.devices.iter().map(|d| (d.request.clone(), d.config.interface.mtu)).collect();
    assert_eq!(mtus, [("net/fast".to_owned(), 1400), ("mgmt".to_owned(), 1400)]);
    // The entry naming `net` reached the result `net/fast`.
    assert_eq!(prepared.devices[0].config.mode.mode(), crate::model::network_config::Mode::Macvlan);
}

#[tokio::test]
async fn an_implicit_extended_resource_claim_prepares_with_class_config_only() {
    let api = Arc::new(MapClaims::default());
    // What the scheduler makes for `resources.limits: {netclaim.dev/macvlan: 1}` (KEP-5004):
    // a request per container and resource, config only from the DeviceClass.
    let mut claim = claim(
        "web-extended-resources-q8x2z",
        "u-ext",
        vec![result("container-0-request-0", DRIVER, NODE, "eth2")],
        vec![config(
            "FromClass",
            DRIVER,
            &["container-0-request-0"],
            params(json!({"mode": "macvlan", "ipam": {"pool": {"subnet": "10.9.0.0/24"}}})),
        )],
    );
    claim.metadata.annotations = Some(
        [("resource.kubernetes.io/extended-resource-claim".to_owned(), "true".to_owned())].into(),
    );
    api.put(claim);
    let dirs = dirs();
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    let devices =
        prepare_one(&service, &reference("web-extended-resources-q8x2z", "u-ext")).await.unwrap();
    assert_eq!(devices[0].request_names, ["container-0-request-0"]);
    assert_eq!(
        service.prepared("u-ext").unwrap().devices[0].addresses,
        ["10.9.0.1/24".parse().unwrap()]
    );
    // Not from a template: the metadata is found under the claim's own name.
    let spec: Value = serde_json::from_slice(
        &std::fs::read(dirs.cdi.join("netclaim.dev_metadata_u-ext_container-0-request-0.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        spec["devices"][0]["containerEdits"]["mounts"][0]["containerPath"],
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/web-extended-resources-q8x2z/container-0-request-0/netclaim.dev-metadata.json"
    );
}

#[tokio::test]
async fn a_state_dir_of_release_58860b2_loads_with_its_claims_unchanged_and_without_metadata() {
    let dirs = dirs();
    std::fs::create_dir_all(&dirs.state).unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/state-58860b2/journal");
    std::fs::copy(&fixture, dirs.state.join("journal")).unwrap();
    let api = Arc::new(MapClaims::default());
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    let web = service.prepared(UID).unwrap();
    assert_eq!((web.pod_claim_index, web.pod_claim_name.as_deref()), (Some(1), None));
    assert_eq!(web.devices[0].request, "net/fast");
    assert!(web.devices[0].attributes.is_empty() && web.devices[0].cdi_device_ids.is_empty());
    // Prepared before metadata existed: kubelet keeps getting the answer it got, no files.
    let devices = prepare_one(&service, &reference("web-net-x7k2p", UID)).await.unwrap();
    assert!(devices[0].cdi_device_ids.is_empty());
    assert_eq!(devices[0].request_names, ["net"]);
    assert!(!dirs.plugin.join("dra-device-metadata").exists());
    let leases: Vec<String> =
        lock(&service.state).ipam.leases().map(|l| l.address.to_string()).collect();
    assert_eq!(leases, ["10.9.0.2", "10.9.1.5"]);
    drop(service);
    let versions = prepared_claim_versions(&dirs.state.join("journal"));
    let current = u64::from(<PreparedClaim as crate::store::Record>::VERSION);
    assert_eq!(versions.iter().filter(|v| **v == current).count(), 2, "written back: {versions:?}");
    // Unprepare of such a claim works and removes nothing it does not own.
    let (service, _metadata) = service_with_metadata(&api, &dirs, LocalFiles);
    assert!(service.unprepare(vec![reference("web-net-x7k2p", UID)]).await[UID].is_ok());
}
