//! The claim status writer against the in-process API server: entries land, a failure
//! replaces the condition and leaves other drivers' entries alone, a write survives an API
//! outage, a deleted claim stops retries.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_inmemory::apiserver::{ServerOptions, start};
use netclaim::attach::status::{DeviceKey, DeviceOutcome, build_entries};
use netclaim::k8s::claim_status::{Backoff, StatusWriter, warn_pod};
use netclaim::metrics::{Metrics, ResultLabel};
use netclaim::model::network_config::{MacAddr, Mode, Route};
use netclaim::model::{ClaimRef, PodRef};
use netclaim::podnet::apply::AttachedInterface;
use serde_json::json;

const DRIVER: &str = "netclaim.dev";
const SHARE_ID: &str = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";

fn client_for(url: &str) -> kube::Client {
    kube::Client::try_from(kube::Config::new(url.parse().expect("server URL"))).expect("client")
}

fn fast() -> Backoff {
    Backoff {
        settle: Duration::from_millis(1),
        initial: Duration::from_millis(20),
        max: Duration::from_millis(200),
    }
}

/// Creates a claim and allocates it through `/status` as the scheduler does: a shared device
/// (shareID), an exclusive one, and one of another driver.
async fn allocated_claim(client: &kube::Client, name: &str) -> ResourceClaim {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": "netclaim"}}]}},
    }))
    .expect("claim JSON");
    claims.create(&PostParams::default(), &claim).await.expect("create claim");
    let results = json!([
        {"request": "net", "driver": DRIVER, "pool": "node-1", "device": "eth1", "shareID": SHARE_ID},
        {"request": "net", "driver": DRIVER, "pool": "node-1", "device": "eth2"},
        {"request": "net", "driver": "other.dev", "pool": "node-1", "device": "gpu0"},
    ]);
    let patch = json!({"status": {"allocation": {"devices": {"results": results}}}});
    claims
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("allocate")
}

fn keys() -> [DeviceKey; 2] {
    [
        DeviceKey {
            driver: DRIVER.into(),
            pool: "node-1".into(),
            device: "eth1".into(),
            share_id: Some(SHARE_ID.into()),
        },
        DeviceKey {
            driver: DRIVER.into(),
            pool: "node-1".into(),
            device: "eth2".into(),
            share_id: None,
        },
    ]
}

fn ready(name: &str, mode: Mode, parent: &str, address: &str) -> DeviceOutcome {
    DeviceOutcome::Ready(AttachedInterface {
        name: name.into(),
        mode,
        host_device: parent.into(),
        mac: Some(MacAddr([0x02, 0x42, 0, 0, 0, 0x07])),
        mtu: 1500,
        addresses: vec![address.parse().expect("address")],
        routes: vec![Route {
            destination: "10.20.0.0/16".parse().expect("route"),
            gateway: Some("10.10.1.1".parse().expect("gateway")),
            metric: None,
        }],
        routing: netclaim::podnet::plan::AppliedRouting::default(),
        rdma_device: None,
    })
}

fn now() -> Time {
    Time(Timestamp::now())
}

fn claim_ref(claim: &ResourceClaim) -> ClaimRef {
    ClaimRef {
        namespace: "default".into(),
        name: claim.metadata.name.clone().expect("name"),
        uid: claim.metadata.uid.clone().expect("the API server sets a uid"),
    }
}

fn devices(claim: &ResourceClaim) -> Vec<AllocatedDeviceStatus> {
    claim.status.as_ref().and_then(|s| s.devices.clone()).unwrap_or_default()
}

/// Polls the claim until `done` holds (the writer works in the background).
async fn wait_for(
    claims: &Api<ResourceClaim>,
    name: &str,
    done: impl Fn(&[AllocatedDeviceStatus]) -> bool,
) -> Vec<AllocatedDeviceStatus> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let current = devices(&claims.get(name).await.expect("get claim"));
        if done(&current) {
            return current;
        }
        assert!(Instant::now() < deadline, "status never reached the expected state: {current:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ready_of(entry: &AllocatedDeviceStatus) -> Option<(&str, &str)> {
    let c = entry.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")?;
    Some((c.status.as_str(), c.reason.as_str()))
}

fn count(metrics: &Metrics, result: &'static str) -> u64 {
    metrics.status_writes.get_or_create(&ResultLabel { result }).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_then_failed_keeps_other_drivers() {
    let srv = start("127.0.0.1:0".parse().expect("addr"), ServerOptions::default())
        .await
        .expect("server");
    let client = client_for(&srv.url());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim = allocated_claim(&client, "c1").await;

    // Another driver's entry, written by its own field manager first.
    let other = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "status": {"devices": [{"driver": "other.dev", "pool": "node-1", "device": "gpu0",
            "data": {"kind": "GpuStatus"}}]}});
    claims
        .patch_status("c1", &PatchParams::apply("other.dev").force(), &Patch::Apply(&other))
        .await
        .expect("other driver's status");

    let metrics = Metrics::new();
    let writer =
        StatusWriter::new(client.clone(), DRIVER, fast(), Some(metrics.status_writes.clone()));
    let [shared, exclusive] = keys();
    let outcomes = vec![
        (shared.clone(), ready("net1", Mode::Macvlan, "eth1", "2001:0db8::0005/64")),
        (exclusive.clone(), ready("net2", Mode::HostDevice, "eth2", "10.10.1.5/24")),
    ];
    let entries = build_entries(&outcomes, &devices(&claim), claim.metadata.generation, &now())
        .expect("entries");
    let started = Instant::now();
    writer.submit(claim_ref(&claim), entries);
    assert!(started.elapsed() < Duration::from_millis(50), "submit must not wait for the API");

    let landed =
        wait_for(&claims, "c1", |d| d.iter().filter(|e| e.driver == DRIVER).count() == 2).await;
    let eth1 = landed.iter().find(|e| e.device == "eth1").expect("eth1 entry");
    assert_eq!(eth1.share_id.as_deref(), Some(SHARE_ID));
    assert_eq!(ready_of(eth1), Some(("True", "NetworkReady")));
    let net = eth1.network_data.as_ref().expect("networkData");
    assert_eq!(net.interface_name.as_deref(), Some("net1"));
    assert_eq!(net.ips.as_deref(), Some(&["2001:db8::5/64".to_owned()][..]));
    assert_eq!(net.hardware_address.as_deref(), Some("02:42:00:00:00:07"));
    let data = &eth1.data.as_ref().expect("data").0;
    assert_eq!(
        (data["kind"].as_str(), data["mode"].as_str()),
        (Some("NetworkStatus"), Some("macvlan"))
    );
    let eth2 = landed.iter().find(|e| e.device == "eth2").expect("eth2 entry");
    assert_eq!(eth2.share_id, None);
    assert_eq!(eth2.data.as_ref().expect("data").0["mode"], "host-device");
    assert!(landed.iter().any(|e| e.driver == "other.dev"), "other driver's entry kept");

    // The exclusive device fails later: Ready=False with reason and message.
    let outcomes = vec![
        (shared, ready("net1", Mode::Macvlan, "eth1", "2001:db8::5/64")),
        (
            exclusive,
            DeviceOutcome::Failed {
                reason: "AttachFailed".into(),
                message: "eth2 vanished".into(),
            },
        ),
    ];
    let entries =
        build_entries(&outcomes, &landed, claim.metadata.generation, &now()).expect("entries");
    writer.submit(claim_ref(&claim), entries);
    let after = wait_for(&claims, "c1", |d| {
        d.iter().any(|e| e.device == "eth2" && ready_of(e) == Some(("False", "AttachFailed")))
    })
    .await;
    let eth2 = after.iter().find(|e| e.device == "eth2").expect("eth2 entry");
    let cond = &eth2.conditions.as_ref().expect("conditions")[0];
    assert_eq!(cond.message, "eth2 vanished");
    // The writer no longer applies networkData/data for the failed device, so it stops owning
    // them (a real API server then removes them; the in-memory server keeps the values: a
    // known gap of `dev::apiserver`, so ownership is what is checked here).
    let fresh = claims.get("c1").await.expect("get claim");
    let ours = fresh
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.manager.as_deref() == Some(DRIVER))
        .and_then(|m| m.fields_v1)
        .expect("netclaim.dev owns fields");
    let eth2_fields = ours.0["f:status"]["f:devices"]
        .as_object()
        .and_then(|d| d.iter().find(|(k, _)| k.contains("\"eth2\"")).map(|(_, v)| v.clone()))
        .expect("eth2 owned");
    assert!(eth2_fields.get("f:conditions").is_some());
    assert!(eth2_fields.get("f:networkData").is_none() && eth2_fields.get("f:data").is_none());
    let eth1_after = after.iter().find(|e| e.device == "eth1").expect("eth1 entry");
    assert_eq!(
        eth1_after.conditions.as_ref().expect("conditions")[0].last_transition_time,
        eth1.conditions.as_ref().expect("conditions")[0].last_transition_time,
        "unchanged Ready keeps its transition time"
    );
    let gpu = after.iter().find(|e| e.driver == "other.dev").expect("other driver's entry kept");
    assert_eq!(gpu.data.as_ref().expect("data").0["kind"], "GpuStatus");
    // The writer counts a write after the server answered it, so the test can see the
    // write land before the count moves.
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&metrics, "success") < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(count(&metrics, "success"), 2);

    srv.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warning_event_on_pod() {
    let srv = start("127.0.0.1:0".parse().expect("addr"), ServerOptions::default())
        .await
        .expect("server");
    let client = client_for(&srv.url());
    // A Warning Event on the Pod.
    let pod = PodRef { namespace: "default".into(), name: "p1".into(), uid: "u-1".into() };
    warn_pod(client.clone(), DRIVER, "node-1", &pod, "AttachFailed", "eth2 vanished".into()).await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let listed = events.list(&ListParams::default()).await.expect("list events");
    assert!(
        listed.items.iter().any(|e| e.reason.as_deref() == Some("AttachFailed")
            && e.type_.as_deref() == Some("Warning")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("p1")),
        "no Warning Event on the Pod: {:?}",
        listed.items
    );
    srv.shutdown().await.expect("shutdown");
}

/// A TCP relay to the API server that can be down (nothing listening) or up; `opened`
/// counts the connections it accepted.
async fn relay(
    listen: std::net::SocketAddr,
    target: std::net::SocketAddr,
    opened: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(listen).await.expect("relay bind");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            opened.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_lands_after_outage() {
    let srv = start("127.0.0.1:0".parse().expect("addr"), ServerOptions::default())
        .await
        .expect("server");
    let direct = client_for(&srv.url());
    let claims: Api<ResourceClaim> = Api::namespaced(direct.clone(), "default");
    let claim = allocated_claim(&direct, "c2").await;

    // A port with nothing behind it yet: the API server is "down" for the writer.
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr");
    let metrics = Metrics::new();
    let writer = StatusWriter::new(
        client_for(&format!("http://{port}")),
        DRIVER,
        fast(),
        Some(metrics.status_writes.clone()),
    );
    let [shared, _] = keys();
    let entries = build_entries(
        &[(shared, ready("net1", Mode::Macvlan, "eth1", "10.10.1.9/24"))],
        &[],
        claim.metadata.generation,
        &now(),
    )
    .expect("entries");
    writer.submit(claim_ref(&claim), entries);
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(&metrics, "error") < 2 {
        assert!(Instant::now() < deadline, "writer never tried");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(devices(&claims.get("c2").await.expect("get")).is_empty());
    assert_eq!(writer.in_flight(), 1);

    let relay = relay(port, srv.addr(), Arc::default()).await;
    let landed = wait_for(&claims, "c2", |d| d.iter().any(|e| e.device == "eth1")).await;
    assert_eq!(landed.len(), 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while writer.in_flight() != 0 {
        assert!(Instant::now() < deadline, "writer task did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count(&metrics, "success"), 1);
    relay.abort();
    srv.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_claim_stops_retries() {
    let srv = start("127.0.0.1:0".parse().expect("addr"), ServerOptions::default())
        .await
        .expect("server");
    let client = client_for(&srv.url());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim = allocated_claim(&client, "c3").await;
    claims.delete("c3", &DeleteParams::default()).await.expect("delete");
    let deadline = Instant::now() + Duration::from_secs(5);
    while claims.get_opt("c3").await.expect("get").is_some() {
        assert!(Instant::now() < deadline, "claim not deleted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let metrics = Metrics::new();
    let writer =
        StatusWriter::new(client.clone(), DRIVER, fast(), Some(metrics.status_writes.clone()));
    let [_, exclusive] = keys();
    let entries = build_entries(
        &[(
            exclusive,
            DeviceOutcome::Failed { reason: "InvalidConfig".into(), message: "bad".into() },
        )],
        &[],
        None,
        &now(),
    )
    .expect("entries");
    writer.submit(claim_ref(&claim), entries);
    let deadline = Instant::now() + Duration::from_secs(5);
    while writer.in_flight() != 0 {
        assert!(Instant::now() < deadline, "writer kept retrying a deleted claim");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count(&metrics, "gone"), 1);
    assert_eq!(count(&metrics, "error"), 0);
    srv.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_status_wins() {
    let srv = start("127.0.0.1:0".parse().expect("addr"), ServerOptions::default())
        .await
        .expect("server");
    let client = client_for(&srv.url());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim = allocated_claim(&client, "c4").await;
    let metrics = Metrics::new();
    let writer =
        StatusWriter::new(client.clone(), DRIVER, fast(), Some(metrics.status_writes.clone()));
    let [_, exclusive] = keys();
    for i in 1..=50 {
        let outcome =
            DeviceOutcome::Failed { reason: "AttachFailed".into(), message: format!("try {i}") };
        let entries =
            build_entries(&[(exclusive.clone(), outcome)], &[], None, &now()).expect("entries");
        writer.submit(claim_ref(&claim), entries);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while writer.in_flight() != 0 {
        assert!(Instant::now() < deadline, "writer did not finish");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let landed = devices(&claims.get("c4").await.expect("get"));
    let cond = &landed[0].conditions.as_ref().expect("conditions")[0];
    assert_eq!(cond.message, "try 50");
    let landed_writes = count(&metrics, "success");
    assert!(
        (1..50).contains(&landed_writes),
        "{landed_writes} writes for 50 submits: older ones not coalesced"
    );
    srv.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entry_for_unallocated_device_is_rejected_not_retried() {
    let srv = start("127.0.0.1:0".parse().expect("addr"), ServerOptions::default())
        .await
        .expect("server");
    let client = client_for(&srv.url());
    let claim = allocated_claim(&client, "c5").await;
    let metrics = Metrics::new();
    let writer =
        StatusWriter::new(client.clone(), DRIVER, fast(), Some(metrics.status_writes.clone()));
    let stranger = DeviceKey {
        driver: DRIVER.into(),
        pool: "node-1".into(),
        device: "eth9".into(),
        share_id: None,
    };
    let entries = build_entries(
        &[(stranger, ready("net9", Mode::Macvlan, "eth9", "10.10.1.9/24"))],
        &[],
        None,
        &now(),
    )
    .expect("entries");
    writer.submit(claim_ref(&claim), entries);
    let deadline = Instant::now() + Duration::from_secs(5);
    while writer.in_flight() != 0 {
        assert!(Instant::now() < deadline, "writer kept retrying a rejected status");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!((count(&metrics, "rejected"), count(&metrics, "error")), (1, 0));
    srv.shutdown().await.expect("shutdown");
}

/// After a restart every attached claim's status is submitted at once: the writer holds at
/// most `WRITES_IN_FLIGHT` API calls at a time, so 100 statuses open a handful of connections
/// (unbounded, one connection each: ~1 descriptor and ~70 KiB per claim at once), and every
/// one lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_statuses_at_once_use_a_bounded_number_of_connections() {
    use netclaim::k8s::claim_status::WRITES_IN_FLIGHT;

    let srv = start("127.0.0.1:0".parse().expect("addr"), ServerOptions::default())
        .await
        .expect("server");
    let direct = client_for(&srv.url());
    let claims: Api<ResourceClaim> = Api::namespaced(direct.clone(), "default");
    let mut allocated = Vec::new();
    for n in 0..100 {
        allocated.push(allocated_claim(&direct, &format!("burst-{n}")).await);
    }
    // A relay that counts the connections the writer opens.
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").expect("free port").local_addr().expect("addr");
    let opened = Arc::new(AtomicUsize::new(0));
    let relay = relay(port, srv.addr(), opened.clone()).await;
    let metrics = Metrics::new();
    let writer = StatusWriter::new(
        client_for(&format!("http://{port}")),
        DRIVER,
        fast(),
        Some(metrics.status_writes.clone()),
    );
    let [shared, _] = keys();
    for (n, claim) in allocated.iter().enumerate() {
        let address = format!("10.10.2.{}/24", n + 1);
        let entries = build_entries(
            &[(shared.clone(), ready("net1", Mode::Macvlan, "eth1", &address))],
            &[],
            claim.metadata.generation,
            &now(),
        )
        .expect("entries");
        writer.submit(claim_ref(claim), entries);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while writer.in_flight() != 0 {
        assert!(Instant::now() < deadline, "writes did not finish: {} left", writer.in_flight());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(count(&metrics, "success"), 100);
    for claim in &allocated {
        let name = claim.metadata.name.as_deref().expect("name");
        assert_eq!(devices(&claims.get(name).await.expect("get")).len(), 1, "{name}");
    }
    // hyper may finish dialling a connection whose request an idle one took meanwhile: at
    // most one such per permit.
    let opened = opened.load(Ordering::SeqCst);
    println!("100 statuses at once: {opened} connections");
    assert!(opened <= 2 * WRITES_IN_FLIGHT, "{opened} connections for 100 statuses");
    relay.abort();
    srv.shutdown().await.expect("shutdown");
}
