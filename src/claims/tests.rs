//! Claim logic tests with an in-memory API, a fixed inventory and a real store in a temp dir.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, OpaqueDeviceConfiguration, ResourceClaim,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::{Value, json};

use ipnetwork::IpNetwork;

use super::state::lock;
use super::*;
use crate::ipam::{Ipam, LeaseOwner};
use crate::model::ClaimRef;
use crate::model::network_config::{Addressing, DeviceKind, ResolvedMode, Sharing};
use crate::model::support::KernelSupport;
use crate::store::{Record, Store};
use crate::testing::claims::MapClaims;
use crate::testing::devices::{FixedDevices, if_name_attribute};
use crate::testing::facts::{FactsBuilder as _, physical_nic};

mod bandwidth;
mod ethtool;
mod format4_migration;
mod metadata;
mod networks;
mod rdma;
mod tenancy;
mod vf;
mod vf_bandwidth;
mod vf_migration;
mod vfio;

const DRIVER: &str = "netclaim.dev";
const NODE: &str = "node-a";

/// `eth1` exclusive, `eth2` shared parent, `eth2-s0` a slot of `eth2`, `eth9v1` VF 1 of the
/// PF `eth9` (PF MTU 9000); each published with its name as `ifName`, the VF with its PF and
/// index.
fn fixed_devices() -> FixedDevices {
    use crate::model::device::AttributeValue;
    let mut vf_attributes = if_name_attribute("eth9v1");
    vf_attributes.insert("netclaim.dev/pfName".into(), AttributeValue::String("eth9".into()));
    vf_attributes.insert("netclaim.dev/vfIndex".into(), AttributeValue::Int(1));
    FixedDevices::new()
        .device("eth1", physical_nic("eth1"), if_name_attribute("eth1"))
        .device("eth2", physical_nic("eth2").shared(), if_name_attribute("eth2"))
        .device("eth2-s0", physical_nic("eth2").slot(), if_name_attribute("eth2-s0"))
        .device("eth9v1", physical_nic("eth9v1").vf(9000), vf_attributes)
}

type Service = ClaimService<Arc<MapClaims>, FixedDevices, Arc<Store>>;

fn service(api: &Arc<MapClaims>, dir: &std::path::Path) -> Service {
    let store = Arc::new(Store::open(dir).unwrap());
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(api),
        fixed_devices(),
        store,
    )
    .unwrap()
}

/// [`service`] on `clock` (quarantines end when a test moves it).
fn clocked_service(
    api: &Arc<MapClaims>,
    dir: &std::path::Path,
    clock: &Arc<crate::ipam::ManualClock>,
) -> Service {
    let store = Arc::new(Store::open(dir).unwrap());
    ClaimService::load_with_clock(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        Arc::clone(api),
        fixed_devices(),
        store,
        Arc::clone(clock) as Arc<dyn crate::ipam::Clock>,
    )
    .unwrap()
}

fn result(request: &str, driver: &str, pool: &str, device: &str) -> DeviceRequestAllocationResult {
    DeviceRequestAllocationResult {
        request: request.into(),
        driver: driver.into(),
        pool: pool.into(),
        device: device.into(),
        ..Default::default()
    }
}

fn config(
    source: &str,
    driver: &str,
    requests: &[&str],
    parameters: Value,
) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.into(),
        requests: if requests.is_empty() {
            None
        } else {
            Some(requests.iter().map(|r| (*r).to_owned()).collect())
        },
        opaque: Some(OpaqueDeviceConfiguration {
            driver: driver.into(),
            parameters: RawExtension(parameters),
        }),
    }
}

fn params(extra: Value) -> Value {
    let mut base = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
    let Value::Object(extra) = extra else { panic!("params take an object") };
    base.as_object_mut().unwrap().extend(extra);
    base
}

fn claim(
    name: &str,
    uid: &str,
    results: Vec<DeviceRequestAllocationResult>,
    configs: Vec<DeviceAllocationConfiguration>,
) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(results),
                    config: Some(configs),
                }),
                ..Default::default()
            }),
            reserved_for: Some(vec![consumer("pod-1")]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn consumer(name: &str) -> ResourceClaimConsumerReference {
    ResourceClaimConsumerReference {
        resource: "pods".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        ..Default::default()
    }
}

fn reference(name: &str, uid: &str) -> ClaimRef {
    ClaimRef { namespace: "default".into(), name: name.into(), uid: uid.into() }
}

fn simple_claim(name: &str, uid: &str) -> ResourceClaim {
    claim(name, uid, vec![result("nic", DRIVER, NODE, "eth1")], vec![])
}

fn pool_config() -> Value {
    params(json!({"mode": "macvlan", "ipam": {"pool": {"subnet": "10.9.0.0/24"}}}))
}

/// The record version of every prepared-claim write in a journal, in order.
fn prepared_claim_versions(journal: &std::path::Path) -> Vec<u64> {
    std::fs::read_to_string(journal)
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|line| serde_json::from_str::<Value>(line.split_once(' ')?.1).ok())
        .flat_map(|entry| entry["ops"].as_array().cloned().unwrap_or_default())
        .filter(|op| op["kind"] == "prepared-claims" && op["op"] == "put")
        .map(|op| op["version"].as_u64().unwrap())
        .collect()
}

async fn prepare_one(service: &Service, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
    let mut results = service.prepare(vec![claim.clone()]).await;
    assert_eq!(results.len(), 1);
    results.remove(&claim.uid).unwrap().map_err(|f| f.message)
}

#[tokio::test]
async fn only_our_driver_and_pool_results_are_prepared_and_share_id_is_kept() {
    let api = Arc::new(MapClaims::default());
    let mut shared = result("shared", DRIVER, NODE, "eth2");
    shared.share_id = Some("3f1c0c3e-0000-4000-8000-000000000001".into());
    api.put(claim(
        "mixed",
        "u1",
        vec![
            result("gpu", "gpu.example.com", NODE, "gpu0"),
            result("nic", DRIVER, "node-b", "eth1"),
            result("nic", DRIVER, NODE, "eth1"),
            shared,
        ],
        vec![config("FromClaim", DRIVER, &["shared"], params(json!({"mode": "macvlan"})))],
    ));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let devices = prepare_one(&service, &reference("mixed", "u1")).await.unwrap();
    assert_eq!(
        devices,
        vec![
            PreparedDevice {
                request_names: vec!["nic".into()],
                pool_name: NODE.into(),
                device_name: "eth1".into(),
                cdi_device_ids: vec![],
                share_id: None,
            },
            PreparedDevice {
                request_names: vec!["shared".into()],
                pool_name: NODE.into(),
                device_name: "eth2".into(),
                cdi_device_ids: vec![],
                share_id: Some("3f1c0c3e-0000-4000-8000-000000000001".into()),
            },
        ]
    );
    let stored = service.prepared("u1").unwrap();
    assert_eq!(stored.devices[0].config.mode, ResolvedMode::HostDevice);
    assert_eq!(stored.devices[1].config.mode.mode(), crate::model::network_config::Mode::Macvlan);
}

#[tokio::test]
async fn a_claim_without_results_for_this_node_is_refused() {
    let api = Arc::new(MapClaims::default());
    api.put(claim("other", "u1", vec![result("nic", DRIVER, "node-b", "eth1")], vec![]));
    let dir = tempfile::tempdir().unwrap();
    let err = prepare_one(&service(&api, dir.path()), &reference("other", "u1")).await.unwrap_err();
    assert!(err.starts_with("status.allocation.devices.results"), "{err}");
    assert!(err.contains("pool node-a"), "{err}");
}

#[tokio::test]
async fn reserved_for_two_pods_is_refused_with_the_reason() {
    let api = Arc::new(MapClaims::default());
    let mut shared = simple_claim("two", "u2");
    shared.status.as_mut().unwrap().reserved_for = Some(vec![consumer("a"), consumer("b")]);
    api.put(shared);
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let err = prepare_one(&service, &reference("two", "u2")).await.unwrap_err();
    assert!(err.contains("reserved for 2 consumers"), "{err}");
    assert!(err.contains("pods a (uid uid-a)") && err.contains("only one pod"), "{err}");
    assert!(service.prepared("u2").is_none());
}

#[tokio::test]
async fn uid_mismatch_and_missing_claims_are_named_errors() {
    let api = Arc::new(MapClaims::default());
    api.put(simple_claim("foo", "new-uid"));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let err = prepare_one(&service, &reference("foo", "old-uid")).await.unwrap_err();
    assert!(err.starts_with("uid mismatch"), "{err}");
    assert!(err.contains("old-uid") && err.contains("new-uid"), "{err}");
    let err = prepare_one(&service, &reference("gone", "u3")).await.unwrap_err();
    assert_eq!(err, "ResourceClaim not found");
    let mut unallocated = simple_claim("pending", "u4");
    unallocated.status.as_mut().unwrap().allocation = None;
    api.put(unallocated);
    let err = prepare_one(&service, &reference("pending", "u4")).await.unwrap_err();
    assert!(err.contains("status.allocation: the claim is not allocated"), "{err}");
    let err = {
        api.put(claim("nodev", "u5", vec![result("nic", DRIVER, NODE, "eth9")], vec![]));
        prepare_one(&service, &reference("nodev", "u5")).await.unwrap_err()
    };
    assert!(err.contains("request nic: device \"eth9\" is not in this node's inventory"), "{err}");
}

#[tokio::test]
async fn config_merges_class_then_claim_entries_for_the_matching_request_only() {
    let api = Arc::new(MapClaims::default());
    api.put(claim(
        "cfg",
        "u1",
        vec![result("a", DRIVER, NODE, "eth2"), result("b", DRIVER, NODE, "eth2-s0")],
        vec![
            // Claim entry listed first: class entries still apply first.
            config("FromClaim", DRIVER, &["a"], params(json!({"interface": {"mtu": 1400}}))),
            config(
                "FromClass",
                DRIVER,
                &[],
                params(json!({"mode": "macvlan", "interface": {"mtu": 1300, "name": "net1"}})),
            ),
            config("FromClaim", DRIVER, &["b"], params(json!({"macvlan": {"mode": "vepa"}}))),
            // Another driver's entry is not ours to decode (it would fail strict decoding).
            config("FromClaim", "other.example.com", &[], json!({"whatever": true})),
        ],
    ));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    prepare_one(&service, &reference("cfg", "u1")).await.unwrap();
    let stored = service.prepared("u1").unwrap();
    let a = &stored.devices[0];
    assert_eq!(a.config.interface.mtu, 1400, "claim entry wins over class entry");
    assert_eq!(a.config.interface.name.as_deref(), Some("net1"), "class field kept");
    assert_eq!(a.config.mode.mode(), crate::model::network_config::Mode::Macvlan);
    let b = &stored.devices[1];
    assert_eq!(
        b.config.mode,
        ResolvedMode::Macvlan { mode: crate::model::network_config::MacvlanMode::Vepa }
    );
    assert_eq!(b.config.interface.mtu, 1300, "entry for request a does not apply to b");
    assert_eq!(b.if_name, "eth2", "a slot maps to its parent");
}

/// Claim `long` with UID `uid`, whose config asks for an interface name over the kernel's
/// 15 bytes after naming a pool: it fails its checks once the pool part was read.
fn claim_with_too_long_interface_name(uid: &str) -> ResourceClaim {
    claim(
        "long",
        uid,
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config(
            "FromClaim",
            DRIVER,
            &[],
            params(json!({
                "mode": "macvlan",
                "interface": {"name": "this-name-is-far-too-long"},
                "ipam": {"pool": {"subnet": "10.9.0.0/24"}}
            })),
        )],
    )
}

#[tokio::test]
async fn invalid_config_names_the_field_and_reserves_nothing() {
    let api = Arc::new(MapClaims::default());
    api.put(claim_with_too_long_interface_name("u1"));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let err = prepare_one(&service, &reference("long", "u1")).await.unwrap_err();
    assert!(err.starts_with("request nic, device eth2: interface.name:"), "{err}");
    assert!(err.contains("this-name-is-far-too-long"), "{err}");
    assert_eq!(lock(&service.state).ipam.leases().count(), 0);
    // An unknown source of our own entry is an error naming the field.
    api.put(claim(
        "src",
        "u2",
        vec![result("nic", DRIVER, NODE, "eth1")],
        vec![config("FromSomewhere", DRIVER, &[], params(json!({})))],
    ));
    let err = prepare_one(&service, &reference("src", "u2")).await.unwrap_err();
    assert!(err.contains("status.allocation.devices.config[0].source: \"FromSomewhere\""), "{err}");
}

#[tokio::test]
async fn passthru_takes_the_parent_alone_across_claims() {
    let api = Arc::new(MapClaims::default());
    let passthru = params(json!({"mode": "macvlan", "macvlan": {"mode": "passthru"}}));
    api.put(claim(
        "p1",
        "u1",
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config("FromClaim", DRIVER, &[], passthru.clone())],
    ));
    api.put(claim(
        "p2",
        "u2",
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config("FromClaim", DRIVER, &[], passthru)],
    ));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    prepare_one(&service, &reference("p1", "u1")).await.unwrap();
    let err = prepare_one(&service, &reference("p2", "u2")).await.unwrap_err();
    assert!(err.contains("macvlan.mode"), "{err}");
}

#[tokio::test]
async fn a_passthru_child_on_a_vlan_sub_interface_leaves_the_parent_itself_free() {
    // `eth2.7` is a netdev of its own, with its own receive handler: passthru on it does not
    // take `eth2`, but it does take `eth2.7` from a later claim on the same VLAN.
    let api = Arc::new(MapClaims::default());
    let on = |name: &str, uid: &str, body: Value| {
        api.put(claim(
            name,
            uid,
            vec![result("nic", DRIVER, NODE, "eth2")],
            vec![config("FromClaim", DRIVER, &[], params(body))],
        ));
    };
    on("p7", "u1", json!({"macvlan": {"mode": "passthru"}, "vlan": 7}));
    on("plain", "u2", json!({"macvlan": {"mode": "bridge"}}));
    on("b7", "u3", json!({"macvlan": {"mode": "bridge"}, "vlan": 7}));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    prepare_one(&service, &reference("p7", "u1")).await.unwrap();
    prepare_one(&service, &reference("plain", "u2")).await.unwrap();
    let err = prepare_one(&service, &reference("b7", "u3")).await.unwrap_err();
    assert!(err.contains("request nic, device eth2: mode: \"macvlan\": passthru"), "{err}");
}

#[tokio::test]
async fn a_mode_the_node_cannot_attach_fails_the_prepare_naming_mode_and_reserves_nothing() {
    use crate::model::support::Probe;
    let api = Arc::new(MapClaims::default());
    let on = |name: &str, uid: &str, device: &str, body: Value| {
        api.put(claim(
            name,
            uid,
            vec![result("nic", DRIVER, NODE, device)],
            vec![config("FromClaim", DRIVER, &[], params(body))],
        ));
    };
    on(
        "ipvl",
        "u1",
        "eth2",
        json!({"mode": "ipvlan", "ipam": {"pool": {"subnet": "10.9.0.0/24"}}}),
    );
    on("tagged", "u2", "eth2-s0", json!({"vlan": 7, "ipam": {"addresses": ["10.8.0.5/24"]}}));
    on("plain", "u3", "eth2", json!({"ipam": {"pool": {"subnet": "10.9.0.0/24"}}}));
    let dir = tempfile::tempdir().unwrap();
    let missing = Probe::Missing { detail: "EOPNOTSUPP".to_owned() };
    let service = service(&api, dir.path()).with_kernel_support(&KernelSupport {
        ipvlan: missing.clone(),
        vlan: missing.clone(),
        vrf: missing,
        ..KernelSupport::unprobed()
    });
    let err = prepare_one(&service, &reference("ipvl", "u1")).await.unwrap_err();
    assert!(
        err.starts_with(
            "request nic, device eth2: mode: \"ipvlan\": not available on \
             this node: ipvlan is not available on this node's kernel (EOPNOTSUPP)"
        ),
        "{err}"
    );
    let err = prepare_one(&service, &reference("tagged", "u2")).await.unwrap_err();
    assert!(err.contains("device eth2-s0: vlan: 7: not available on this node: VLAN"), "{err}");
    assert_eq!(lock(&service.state).ipam.leases().count(), 0, "no address held");
    assert!(service.prepared("u1").is_none() && service.prepared("u2").is_none());
    // The first address of the pool is still free for a claim the node can attach.
    prepare_one(&service, &reference("plain", "u3")).await.unwrap();
    assert_eq!(
        service.prepared("u3").unwrap().devices[0].addresses,
        vec!["10.9.0.1/24".parse().unwrap()]
    );
}

#[tokio::test]
async fn repeated_prepare_returns_the_stored_answer_without_an_api_call() {
    let api = Arc::new(MapClaims::default());
    api.put(claim(
        "ip",
        "u1",
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config("FromClaim", DRIVER, &[], pool_config())],
    ));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let first = prepare_one(&service, &reference("ip", "u1")).await.unwrap();
    let address = service.prepared("u1").unwrap().devices[0].addresses.clone();
    assert_eq!(address, vec!["10.9.0.1/24".parse().unwrap()]);
    // Even a changed claim in the API does not change a prepared answer.
    api.clear();
    let second = prepare_one(&service, &reference("ip", "u1")).await.unwrap();
    assert_eq!(first, second);
    assert_eq!(api.gets(), 1);
    // Same UID twice in one request (and concurrently): one GET, both answered.
    let twice = service.prepare(vec![reference("ip", "u1"), reference("ip", "u1")]).await;
    assert_eq!(twice["u1"].as_ref().unwrap(), &first);
    assert_eq!(api.gets(), 1);
}

#[tokio::test]
async fn a_restarted_service_knows_its_claims_and_their_addresses() {
    let api = Arc::new(MapClaims::default());
    api.put(claim(
        "ip",
        "u1",
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config("FromClaim", DRIVER, &[], pool_config())],
    ));
    let dir = tempfile::tempdir().unwrap();
    let first = {
        let service = service(&api, dir.path());
        prepare_one(&service, &reference("ip", "u1")).await.unwrap()
    };
    let service = service(&api, dir.path());
    assert_eq!(service.prepared_uids(), vec!["u1".to_owned()]);
    assert_eq!(prepare_one(&service, &reference("ip", "u1")).await.unwrap(), first);
    assert_eq!(api.gets(), 1, "the restarted service made no API call");
    assert_eq!(lock(&service.state).ipam.leases().count(), 1);
}

#[tokio::test]
async fn leases_without_a_prepared_claim_are_released_at_load() {
    let api = Arc::new(MapClaims::default());
    let dir = tempfile::tempdir().unwrap();
    {
        // A crash after the lease write and before the claim write leaves this behind.
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let mut ipam = Ipam::load(Arc::clone(&store)).unwrap();
        let owner = LeaseOwner {
            claim_uid: "half".into(),
            request: "nic".into(),
            device: "eth2".into(),
            share_id: None,
        };
        let pool = crate::model::network_config::PoolSpec {
            subnet: "10.9.0.0/24".parse().unwrap(),
            range_start: "10.9.0.1".parse().unwrap(),
            range_end: "10.9.0.254".parse().unwrap(),
            gateway: None,
            exclude: vec![],
        };
        ipam.reserve(&owner, &pool).unwrap();
    }
    let service = service(&api, dir.path());
    assert_eq!(lock(&service.state).ipam.leases().count(), 0);
}

#[tokio::test]
async fn unprepare_releases_addresses_and_unknown_claims_succeed() {
    let api = Arc::new(MapClaims::default());
    api.put(claim(
        "ip",
        "u1",
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config("FromClaim", DRIVER, &[], pool_config())],
    ));
    api.put(claim(
        "ip2",
        "u2",
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config("FromClaim", DRIVER, &[], pool_config())],
    ));
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(crate::ipam::ManualClock::at(1_700_000_000_000));
    let service = clocked_service(&api, dir.path(), &clock);
    prepare_one(&service, &reference("ip", "u1")).await.unwrap();
    let results = service.unprepare(vec![reference("ip", "u1"), reference("never", "u9")]).await;
    assert_eq!(results.len(), 2);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    assert!(service.prepared("u1").is_none());
    assert_eq!(lock(&service.state).ipam.leases().count(), 0);
    // The released address goes to the next claim once its 30 s quarantine is over; a
    // second unprepare still succeeds.
    clock.advance(Duration::from_secs(30));
    prepare_one(&service, &reference("ip2", "u2")).await.unwrap();
    assert_eq!(
        service.prepared("u2").unwrap().devices[0].addresses,
        vec!["10.9.0.1/24".parse().unwrap()]
    );
    assert!(service.unprepare(vec![reference("ip", "u1")]).await["u1"].is_ok());
    // Forgotten durably.
    drop(service);
    let service = self::service(&api, dir.path());
    assert_eq!(service.prepared_uids(), vec!["u2".to_owned()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_claims_in_one_request_run_concurrently_with_distinct_addresses() {
    let api = Arc::new(MapClaims::default().with_delay(Duration::from_millis(20)));
    let mut refs = Vec::new();
    for i in 0..50 {
        let name = format!("c{i}");
        let uid = format!("u{i}");
        api.put(claim(
            &name,
            &uid,
            vec![result("nic", DRIVER, NODE, "eth2")],
            vec![config("FromClaim", DRIVER, &[], pool_config())],
        ));
        refs.push(reference(&name, &uid));
    }
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let results = service.prepare(refs).await;
    assert_eq!(results.len(), 50);
    assert!(results.values().all(Result::is_ok), "{results:?}");
    let max = api.max_in_flight();
    assert!(max > 1 && max <= MAX_CONCURRENT_CLAIMS, "GETs in flight at once: {max}");
    let mut addresses: Vec<IpNetwork> = (0..50)
        .flat_map(|i| service.prepared(&format!("u{i}")).unwrap().devices[0].addresses.clone())
        .collect();
    addresses.sort_unstable();
    addresses.dedup();
    assert_eq!(addresses.len(), 50, "every claim has its own address");
}

/// Per journal entry that writes prepared claims, how many it writes.
fn prepared_claims_per_commit(journal: &std::path::Path) -> Vec<usize> {
    std::fs::read_to_string(journal)
        .unwrap()
        .lines()
        .skip(1)
        .filter_map(|line| serde_json::from_str::<Value>(line.split_once(' ')?.1).ok())
        .map(|entry| {
            let ops = entry["ops"].as_array().cloned().unwrap_or_default();
            ops.iter().filter(|op| op["kind"] == "prepared-claims" && op["op"] == "put").count()
        })
        .filter(|&puts| puts > 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_commits_its_claims_at_once_and_a_bad_claim_fails_alone() {
    let api = Arc::new(MapClaims::default());
    let mut refs = Vec::new();
    for i in 0..20 {
        let (name, uid) = (format!("c{i}"), format!("u{i}"));
        api.put(claim(
            &name,
            &uid,
            vec![result("nic", DRIVER, NODE, "eth2")],
            vec![config("FromClaim", DRIVER, &[], pool_config())],
        ));
        refs.push(reference(&name, &uid));
    }
    // Fails its checks after the pool part of its config was read: among the good ones.
    api.put(claim_with_too_long_interface_name("bad"));
    refs.insert(7, reference("long", "bad"));
    // A UID twice in one call is answered once.
    refs.push(reference("c3", "u3"));
    let dir = tempfile::tempdir().unwrap();
    let service = service(&api, dir.path());
    let journal = dir.path().join("journal");
    let results = service.prepare(refs.clone()).await;
    assert_eq!(results.len(), 21);
    let err = results["bad"].as_ref().unwrap_err();
    assert!(err.message.contains("interface.name"), "{err:?}");
    assert!((0..20).all(|i| results[&format!("u{i}")].is_ok()), "{results:?}");
    assert_eq!(prepared_claims_per_commit(&journal), vec![20], "one commit for the call");
    assert!(service.prepared("bad").is_none());
    assert_eq!(lock(&service.state).ipam.leases().count(), 20, "the bad claim keeps no lease");
    assert!(lock(&service.state).pending.is_empty());
    // Repeated: answered from memory, nothing committed.
    let again = service.prepare(refs).await;
    assert_eq!(again.len(), 21);
    assert_eq!(prepared_claims_per_commit(&journal), vec![20]);
    // The one commit holds every claim and its lease.
    drop(service);
    let restarted = self::service(&api, dir.path());
    assert_eq!(restarted.prepared_uids().len(), 20);
    assert_eq!(lock(&restarted.state).ipam.leases().count(), 20);
}

#[tokio::test]
async fn the_pod_of_reserved_for_is_recorded_and_finds_its_claims_after_a_restart() {
    let api = Arc::new(MapClaims::default());
    for (name, uid) in [("b", "ub"), ("a", "ua")] {
        let mut found = claim(
            name,
            uid,
            vec![result("nic", DRIVER, NODE, "eth2")],
            vec![config("FromClaim", DRIVER, &[], pool_config())],
        );
        found.metadata.generation = Some(4);
        api.put(found);
    }
    let mut other = simple_claim("other", "uo");
    other.status.as_mut().unwrap().reserved_for = Some(vec![consumer("pod-2")]);
    api.put(other);
    let dir = tempfile::tempdir().unwrap();
    {
        let service = service(&api, dir.path());
        for (name, uid) in [("b", "ub"), ("a", "ua"), ("other", "uo")] {
            prepare_one(&service, &reference(name, uid)).await.unwrap();
        }
    }
    let service = service(&api, dir.path());
    let mine = service.prepared_for_pod("uid-pod-1");
    let names: Vec<&str> = mine.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["a", "b"], "ordered by claim name");
    assert_eq!(
        mine[0].reserved_for,
        [PodConsumer { name: "pod-1".into(), uid: "uid-pod-1".into() }]
    );
    assert_eq!(mine[0].generation, Some(4));
    let device = &mine[0].devices[0];
    assert_eq!(
        (device.sharing, device.kind, device.host_mtu),
        (Some(Sharing::Shared), Some(DeviceKind::Physical), Some(1500))
    );
    assert_eq!(service.prepared_for_pod("uid-pod-2")[0].name, "other");
    assert!(service.prepared_for_pod("uid-nobody").is_empty());
    assert_eq!(service.leased_per_pool().values().sum::<usize>(), 2);
    // The index by pod follows unprepare and a new prepare.
    assert!(service.unprepare(vec![reference("a", "ua")]).await["ua"].is_ok());
    let names: Vec<String> =
        service.prepared_for_pod("uid-pod-1").into_iter().map(|c| c.name).collect();
    assert_eq!(names, ["b"]);
    assert!(service.unprepare(vec![reference("other", "uo")]).await["uo"].is_ok());
    assert!(service.prepared_for_pod("uid-pod-2").is_empty());
    prepare_one(&service, &reference("a", "ua")).await.unwrap();
    assert_eq!(service.prepared_for_pod("uid-pod-1").len(), 2);
}

#[test]
fn a_record_written_before_reserved_for_was_kept_still_loads() {
    // The shape of a prepared claim as the first release wrote it.
    let old = json!({
        "uid": "u1", "namespace": "default", "name": "c",
        "devices": [{"request": "nic", "pool": "node-a", "device": "eth2", "ifName": "eth2",
            "config": serde_json::to_value(
                crate::model::network_config::resolve(
                    &[crate::model::network_config::ConfigEntry {
                        source: crate::model::network_config::ConfigSource::Claim,
                        requests: Vec::new(),
                        parameters: params(json!({"mode": "macvlan"})),
                    }],
                    "nic",
                    &physical_nic("eth2").shared(),
                    &crate::model::network_config::NodeSupport::everything(),
                )
                .unwrap(),
            )
            .unwrap(),
            "addresses": []}],
    });
    let loaded: PreparedClaim = serde_json::from_value(old).unwrap();
    assert!(loaded.reserved_for.is_empty() && loaded.generation.is_none());
    assert_eq!(loaded.devices[0].sharing, None);
}

fn static_config(addresses: &[&str]) -> Value {
    params(json!({"mode": "macvlan", "ipam": {"addresses": addresses}}))
}

#[tokio::test]
async fn a_static_address_is_a_lease_no_pool_and_no_other_claim_gets() {
    let dir = tempfile::tempdir().unwrap();
    let api = Arc::new(MapClaims::default());
    let on_eth2 = |name: &str, uid: &str, parameters: Value| {
        claim(
            name,
            uid,
            vec![result("nic", DRIVER, NODE, "eth2")],
            vec![config("FromClaim", DRIVER, &[], parameters)],
        )
    };
    // The pool's first free address is 10.9.0.1; a static claim holds it first.
    api.put(on_eth2("fixed", "u-static", static_config(&["10.9.0.1/24", "10.9.0.2/24"])));
    api.put(on_eth2("twin", "u-twin", static_config(&["10.9.0.7/24", "10.9.0.2/24"])));
    api.put(on_eth2("pooled", "u-pool", pool_config()));
    let clock = Arc::new(crate::ipam::ManualClock::at(1_700_000_000_000));
    let service = clocked_service(&api, dir.path(), &clock);
    prepare_one(&service, &reference("fixed", "u-static")).await.unwrap();
    // Idempotent for its owner.
    prepare_one(&service, &reference("fixed", "u-static")).await.unwrap();
    let err = prepare_one(&service, &reference("twin", "u-twin")).await.unwrap_err();
    assert!(
        err.contains("ipam.addresses[1]") && err.contains("10.9.0.2") && err.contains("u-static"),
        "{err}"
    );
    let pooled = prepare_one(&service, &reference("pooled", "u-pool")).await.unwrap();
    let leases: Vec<String> =
        lock(&service.state).ipam.leases().map(|l| l.address.to_string()).collect();
    assert!(!leases.contains(&"10.9.0.7".to_owned()), "the refused claim leaked {leases:?}");
    assert_eq!(pooled.len(), 1);
    let pool_address = lock(&service.state)
        .ipam
        .leases()
        .find(|l| l.owner.claim_uid == "u-pool")
        .map(|l| l.address.to_string());
    assert_eq!(pool_address.as_deref(), Some("10.9.0.3"), "the pool skips static addresses");

    // After a restart the static leases still hold, and unprepare frees them after their
    // 30 s quarantine.
    drop(service);
    let service = clocked_service(&api, dir.path(), &clock);
    assert!(prepare_one(&service, &reference("twin", "u-twin")).await.is_err());
    service.unprepare_claim(&reference("fixed", "u-static")).await.unwrap();
    let err = prepare_one(&service, &reference("twin", "u-twin")).await.unwrap_err();
    assert!(err.contains("ipam.addresses[1]") && err.contains("30 s"), "{err}");
    clock.advance(Duration::from_secs(30));
    prepare_one(&service, &reference("twin", "u-twin")).await.unwrap();
}

/// A macvlan claim on `eth2` whose config names `pool`.
fn claim_with_pool(name: &str, uid: &str, pool: &Value) -> ResourceClaim {
    claim(
        name,
        uid,
        vec![result("nic", DRIVER, NODE, "eth2")],
        vec![config(
            "FromClaim",
            DRIVER,
            &[],
            params(json!({"mode": "macvlan", "ipam": {"pool": pool}})),
        )],
    )
}

#[tokio::test]
async fn two_claims_naming_one_subnet_with_other_gateways_or_excludes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let api = Arc::new(MapClaims::default());

    api.put(claim_with_pool("a", "u-a", &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.1"})));
    api.put(claim_with_pool(
        "b",
        "u-b",
        &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.254"}),
    ));
    api.put(claim_with_pool(
        "c",
        "u-c",
        &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.1", "exclude": ["10.9.0.0/28"]}),
    ));
    api.put(claim_with_pool("d", "u-d", &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.1"})));
    let service = service(&api, dir.path());
    prepare_one(&service, &reference("a", "u-a")).await.unwrap();
    let err = prepare_one(&service, &reference("b", "u-b")).await.unwrap_err();
    assert!(err.contains("ipam.pool.gateway") && err.contains("default/a"), "{err}");
    let err = prepare_one(&service, &reference("c", "u-c")).await.unwrap_err();
    assert!(err.contains("ipam.pool.exclude"), "{err}");
    // The same settings share the pool.
    prepare_one(&service, &reference("d", "u-d")).await.unwrap();
    assert_eq!(lock(&service.state).ipam.leases().count(), 2);
}

/// The checks read the claims in use from an index (by parent, by pool use): it follows
/// prepare, unprepare and a restart, so what they see is what a scan of every claim saw.
#[tokio::test]
async fn the_claims_a_new_claim_is_checked_against_follow_unprepare_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let api = Arc::new(MapClaims::default());
    api.put(claim_with_pool("a", "u-a", &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.1"})));
    api.put(claim_with_pool(
        "b",
        "u-b",
        &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.254"}),
    ));
    {
        let service = service(&api, dir.path());
        prepare_one(&service, &reference("a", "u-a")).await.unwrap();
        let state = lock(&service.state);
        assert_eq!(state.devices_on("eth2").count(), 1);
        assert_eq!(state.pool_users().count(), 1);
        assert_eq!(state.devices_on("eth1").count(), 0);
    }
    // After a restart the index is built from the store: b is still refused beside a.
    let service = service(&api, dir.path());
    let err = prepare_one(&service, &reference("b", "u-b")).await.unwrap_err();
    assert!(err.contains("ipam.pool.gateway") && err.contains("default/a"), "{err}");
    assert!(lock(&service.state).pending.is_empty(), "a refused claim leaves nothing pending");
    assert_eq!(lock(&service.state).in_use.pool_users.len(), 1);
    // Once a is unprepared nothing is left in use, and b's settings make a pool of their own.
    let results = service.unprepare(vec![reference("a", "u-a")]).await;
    assert!(results.values().all(Result::is_ok), "{results:?}");
    {
        let state = lock(&service.state);
        assert!(state.in_use.by_parent.is_empty() && state.in_use.pool_users.is_empty());
    }
    prepare_one(&service, &reference("b", "u-b")).await.unwrap();
    assert_eq!(lock(&service.state).devices_on("eth2").count(), 1);
}

#[tokio::test]
async fn overlapping_pools_that_could_hand_out_each_others_gateway_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let api = Arc::new(MapClaims::default());

    api.put(claim_with_pool(
        "wide",
        "u-wide",
        &json!({"subnet": "10.9.0.0/24", "gateway": "10.9.0.1"}),
    ));
    // Its range holds the wide pool's gateway.
    api.put(claim_with_pool(
        "low",
        "u-low",
        &json!({"subnet": "10.9.0.0/25", "gateway": "10.9.0.126"}),
    ));
    // The wide pool's range holds its gateway.
    api.put(claim_with_pool(
        "high",
        "u-high",
        &json!({"subnet": "10.9.0.128/25", "gateway": "10.9.0.129"}),
    ));
    // Overlapping, but neither pool can hand out a gateway: allowed.
    api.put(claim_with_pool(
        "inner",
        "u-inner",
        &json!({"subnet": "10.9.0.0/25", "rangeStart": "10.9.0.2"}),
    ));
    let service = service(&api, dir.path());
    prepare_one(&service, &reference("wide", "u-wide")).await.unwrap();
    let err = prepare_one(&service, &reference("low", "u-low")).await.unwrap_err();
    assert!(
        err.contains("ipam.pool.subnet")
            && err.contains("10.9.0.126")
            && err.contains("default/wide"),
        "{err}"
    );
    let err = prepare_one(&service, &reference("high", "u-high")).await.unwrap_err();
    assert!(err.contains("10.9.0.129") && err.contains("10.9.0.128/25"), "{err}");
    assert_eq!(lock(&service.state).ipam.leases().count(), 1, "refused claims lease nothing");
    prepare_one(&service, &reference("inner", "u-inner")).await.unwrap();
    assert_eq!(lock(&service.state).ipam.leases().count(), 2);
}

#[tokio::test]
async fn a_state_dir_of_the_previous_release_loads_and_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/state-0e47c90/journal");
    std::fs::copy(&fixture, dir.path().join("journal")).unwrap();
    let api = Arc::new(MapClaims::default());
    let service = service(&api, dir.path());
    let mut names: Vec<(String, Option<u32>)> =
        service.all_prepared().into_iter().map(|c| (c.name, c.pod_claim_index)).collect();
    names.sort();
    assert_eq!(names, [("db-nic".to_owned(), None), ("web-net".to_owned(), None)]);
    let leases: Vec<(String, String)> = lock(&service.state)
        .ipam
        .leases()
        .map(|l| (l.address.to_string(), l.owner.request.clone()))
        .collect();
    // The pool lease kept its address; the static address is a lease now.
    assert_eq!(
        leases,
        [("10.9.0.2".to_owned(), "nic".to_owned()), ("10.9.1.5".to_owned(), "dev".to_owned())]
    );
    drop(service);
    // The records were written back at the current version.
    let versions = prepared_claim_versions(&dir.path().join("journal"));
    assert_eq!(
        versions.iter().filter(|v| **v == u64::from(PreparedClaim::VERSION)).count(),
        2,
        "{versions:?}"
    );
    let service = self::service(&api, dir.path());
    assert_eq!(service.all_prepared().len(), 2);
}

#[tokio::test]
async fn prepare_records_the_claims_position_in_its_pods_spec() {
    let dir = tempfile::tempdir().unwrap();
    let api = Arc::new(MapClaims::default());
    for (name, uid) in [("first", "u1"), ("second", "u2"), ("other", "u3")] {
        api.put(claim(
            name,
            uid,
            vec![result("nic", DRIVER, NODE, "eth2")],
            vec![config("FromClaim", DRIVER, &[], pool_config())],
        ));
    }
    // The pod lists `second` before `first`; `other` is not in its spec.
    api.put_pod("default", "pod-1", vec!["second".to_owned(), "first".to_owned()]);
    let service = service(&api, dir.path());
    for (name, uid) in [("first", "u1"), ("second", "u2"), ("other", "u3")] {
        prepare_one(&service, &reference(name, uid)).await.unwrap();
    }
    let index = |uid: &str| service.prepared(uid).unwrap().pod_claim_index;
    assert_eq!((index("u1"), index("u2"), index("u3")), (Some(1), Some(0), None));
    // Kept across a restart.
    drop(service);
    let service = self::service(&api, dir.path());
    assert_eq!(service.prepared("u2").unwrap().pod_claim_index, Some(0));
}

#[test]
fn pod_claim_names_follow_the_spec_and_resolve_templates() {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"containers": [], "resourceClaims": [
            {"name": "data", "resourceClaimTemplateName": "data-net"},
            {"name": "mgmt", "resourceClaimName": "shared-mgmt"},
            {"name": "later", "resourceClaimTemplateName": "t"},
        ]},
        "status": {"resourceClaimStatuses": [
            {"name": "data", "resourceClaimName": "web-data-x7k2p"},
        ]},
    }))
    .unwrap();
    assert_eq!(
        allocation::pod_claim_names(&pod),
        ["web-data-x7k2p".to_owned(), "shared-mgmt".to_owned(), String::new()]
    );
}
