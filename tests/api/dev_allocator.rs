//! The dev allocator end to end: the in-memory API server, ResourceSlices built by our
//! inventory code from fixture devices, DeviceClasses with CEL selectors, and claims
//! created through the kube client; the controller allocates them over the API.
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]
#![allow(clippy::too_many_lines, reason = "each test is one scenario told step by step")]

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceSlice,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_inmemory::allocator::{AllocatorController, reserve_for};
use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};
use netclaim::inventory::slices::{PoolIdentity, build_slices};
use netclaim::model::device::{AttributeValue, Device, DeviceKind, Sharing};
use serde_json::json;
use tokio::sync::oneshot;

const NODE: &str = "dev-node";
const DRIVER: &str = "netclaim.dev";

async fn server() -> (ApiServer, kube::Client) {
    let srv = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(srv.url().parse().unwrap())).unwrap();
    (srv, client)
}

fn device(name: &str, if_name: &str, kind: DeviceKind, shared_capacity: Option<u32>) -> Device {
    let sharing = if shared_capacity.is_some() { Sharing::Shared } else { Sharing::Exclusive };
    Device {
        name: name.to_owned(),
        if_name: if_name.to_owned(),
        kind,
        sharing,
        shared_capacity,
        bandwidth: None,
        slot_index: None,
        attributes: BTreeMap::from([
            ("netclaim.dev/ifName".to_owned(), AttributeValue::String(if_name.to_owned())),
            ("netclaim.dev/type".to_owned(), AttributeValue::String(kind.as_str().to_owned())),
            ("netclaim.dev/mtu".to_owned(), AttributeValue::Int(1500)),
            (
                "netclaim.dev/sharing".to_owned(),
                AttributeValue::String(sharing.as_str().to_owned()),
            ),
        ]),
    }
}

/// Publishes a shared parent (`parent0`, 256 interfaces) and one exclusive NIC (`eth1`).
async fn publish(client: &kube::Client) {
    let devices = vec![
        device("parent0", "parent0", DeviceKind::Virtual, Some(256)),
        device("eth1", "eth1", DeviceKind::Physical, None),
    ];
    let pool = PoolIdentity { driver: DRIVER.to_owned(), node: NODE.to_owned(), generation: 1 };
    let api: Api<ResourceSlice> = Api::all(client.clone());
    for slice in build_slices(&pool, &devices) {
        api.create(&PostParams::default(), &slice).await.unwrap();
    }
}

async fn create_class(client: &kube::Client, name: &str, expression: &str) {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {
            "selectors": [{"cel": {"expression": expression}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig", "mode": "macvlan"}}}],
        },
    }))
    .unwrap();
    Api::<DeviceClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
}

async fn create_claim(client: &kube::Client, name: &str, class: &str) {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "net", "exactly": {"deviceClassName": class}}],
            "config": [{"requests": ["net"], "opaque": {"driver": DRIVER, "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                "ipam": {"pool": {"subnet": "10.10.1.0/24"}}}}}],
        }},
    }))
    .unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

fn results(
    claim: &ResourceClaim,
) -> Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
}

async fn wait_until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifteen_macvlan_claims_share_one_parent_and_an_exclusive_nic_is_used_once() {
    let (srv, client) = server().await;
    publish(&client).await;
    create_class(
        &client,
        "netclaim-macvlan",
        r#"device.driver == "netclaim.dev" && device.allowMultipleAllocations
           && device.attributes["netclaim.dev"].sharing == "shared"
           && device.capacity["netclaim.dev"].interfaces.isGreaterThan(quantity("10"))"#,
    )
    .await;
    create_class(
        &client,
        "netclaim-nic",
        r#"device.attributes["netclaim.dev"].sharing == "exclusive" && device.attributes["netclaim.dev"].type == "physical""#,
    )
    .await;

    let controller = AllocatorController::new(client.clone(), NODE);
    let reasons = controller.pending_reasons();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(async move {
        let _ = stop_rx.await;
    }));

    let started = std::time::Instant::now();
    for i in 0..15 {
        create_claim(&client, &format!("macvlan-{i}"), "netclaim-macvlan").await;
    }
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    wait_until("15 allocated claims", || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&ListParams::default()).await.unwrap().items;
            list.iter().filter(|c| !results(c).is_empty()).count() == 15
        }
    })
    .await;
    println!("15 claims created and allocated in {:?}", started.elapsed());
    let list = claims.list(&ListParams::default()).await.unwrap().items;
    let mut share_ids = BTreeSet::new();
    for claim in &list {
        let allocation = claim.status.as_ref().unwrap().allocation.as_ref().unwrap();
        let found = results(claim);
        assert_eq!(found.len(), 1);
        let result = &found[0];
        assert_eq!(
            (
                result.request.as_str(),
                result.driver.as_str(),
                result.pool.as_str(),
                result.device.as_str()
            ),
            ("net", DRIVER, NODE, "parent0")
        );
        assert_eq!(result.consumed_capacity.as_ref().unwrap()["netclaim.dev/interfaces"].0, "1");
        let share_id = result.share_id.clone().unwrap();
        assert!(uuid::Uuid::parse_str(&share_id).is_ok(), "shareID {share_id} is not a UUID");
        share_ids.insert(share_id);
        let config = allocation.devices.as_ref().unwrap().config.as_ref().unwrap();
        let sources: Vec<&str> = config.iter().map(|c| c.source.as_str()).collect();
        assert_eq!(sources, ["FromClass", "FromClaim"]);
        let term = &allocation.node_selector.as_ref().unwrap().node_selector_terms[0];
        assert_eq!(
            term.match_fields.as_ref().unwrap()[0].values.as_deref(),
            Some(&[NODE.to_owned()][..])
        );
    }
    assert_eq!(share_ids.len(), 15, "every share of the parent has its own shareID");

    // The exclusive NIC: the first claim gets it, the second waits with a reason.
    create_claim(&client, "nic-a", "netclaim-nic").await;
    wait_until("nic-a allocated", || {
        let claims = claims.clone();
        async move { !results(&claims.get("nic-a").await.unwrap()).is_empty() }
    })
    .await;
    assert_eq!(results(&claims.get("nic-a").await.unwrap())[0].device, "eth1");
    assert_eq!(results(&claims.get("nic-a").await.unwrap())[0].share_id, None);
    create_claim(&client, "nic-b", "netclaim-nic").await;
    wait_until("a reason for nic-b", || {
        let reasons = reasons.clone();
        async move { reasons.lock().unwrap().contains_key("default/nic-b") }
    })
    .await;
    let reason = reasons.lock().unwrap()["default/nic-b"].clone();
    assert!(reason.contains("eth1: allocated to another claim"), "{reason}");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    wait_until("a FailedAllocation Event on nic-b", || {
        let events = events.clone();
        async move {
            events.list(&ListParams::default()).await.unwrap().items.iter().any(|e| {
                e.reason.as_deref() == Some("FailedAllocation")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("nic-b")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("eth1: allocated to another claim"))
            })
        }
    })
    .await;
    // Past a retry interval it is still unallocated.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(results(&claims.get("nic-b").await.unwrap()).is_empty());

    // A pod reserves nic-a (the dev kubelet's job later).
    let consumer = ResourceClaimConsumerReference {
        resource: "pods".to_owned(),
        name: "pod-a".to_owned(),
        uid: "0b8e9f4e-1111-4c2f-9d1a-000000000001".to_owned(),
        api_group: None,
    };
    let reserved = reserve_for(&client, "default", "nic-a", &consumer).await.unwrap();
    assert_eq!(reserved.status.unwrap().reserved_for.unwrap(), vec![consumer.clone()]);
    let again = reserve_for(&client, "default", "nic-a", &consumer).await.unwrap();
    assert_eq!(
        again.status.unwrap().reserved_for.unwrap().len(),
        1,
        "reserving twice is idempotent"
    );

    // Deleting nic-a frees eth1 for nic-b.
    claims.delete("nic-a", &DeleteParams::default()).await.unwrap();
    wait_until("nic-b allocated after nic-a is gone", || {
        let claims = claims.clone();
        async move { !results(&claims.get("nic-b").await.unwrap()).is_empty() }
    })
    .await;
    assert!(!reasons.lock().unwrap().contains_key("default/nic-b"));

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap().unwrap();
    srv.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_allocators_racing_never_allocate_a_claim_twice() {
    let (srv, client) = server().await;
    publish(&client).await;
    create_class(&client, "netclaim-macvlan", "device.allowMultipleAllocations").await;
    for i in 0..6 {
        create_claim(&client, &format!("c-{i}"), "netclaim-macvlan").await;
    }
    // Two passes from the same listing race on every claim: each claim is written once.
    let first = AllocatorController::new(client.clone(), NODE);
    let second = AllocatorController::new(client.clone(), NODE);
    let (a, b) = tokio::join!(first.reconcile(), second.reconcile());
    let (a, b) = (a.unwrap(), b.unwrap());
    println!("racing passes: {a:?} {b:?}");
    assert_eq!(a.allocated + b.allocated, 6, "{a:?} {b:?}");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let list = claims.list(&ListParams::default()).await.unwrap().items;
    assert!(list.iter().all(|c| results(c).len() == 1));

    // The entry point `netclaim dev` spawns allocates a claim created later.
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let node = NODE.to_owned();
    let task = tokio::spawn(kube_inmemory::allocator::run(client.clone(), &node, async move {
        let _ = stop_rx.await;
    }));
    drop(node);
    create_claim(&client, "late", "netclaim-macvlan").await;
    wait_until("the late claim allocated", || {
        let claims = claims.clone();
        async move { results(&claims.get("late").await.unwrap()).len() == 1 }
    })
    .await;
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap().unwrap();
    srv.shutdown().await.unwrap();
}

/// Publishes a shared parent on `node` (and the exclusive `eth1` when `nic`).
async fn publish_node(client: &kube::Client, node: &str, nic: bool) {
    let mut devices = vec![device("parent0", "parent0", DeviceKind::Virtual, Some(256))];
    if nic {
        devices.push(device("eth1", "eth1", DeviceKind::Physical, None));
    }
    let pool = PoolIdentity { driver: DRIVER.to_owned(), node: node.to_owned(), generation: 1 };
    let api: Api<ResourceSlice> = Api::all(client.clone());
    for slice in build_slices(&pool, &devices) {
        api.create(&PostParams::default(), &slice).await.unwrap();
    }
}

async fn create_pod(client: &kube::Client, name: &str, claim: &str) {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [{"name": "app", "image": "pause"}],
            "resourceClaims": [{"name": "net", "resourceClaimName": claim}],
        },
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_spread_over_two_nodes_and_their_claims_are_allocated_there() {
    use k8s_openapi::api::core::v1::Pod;
    let (srv, client) = server().await;
    publish_node(&client, "node-1", false).await;
    publish_node(&client, "node-2", true).await;
    create_class(&client, "netclaim-macvlan", "device.allowMultipleAllocations").await;
    create_class(
        &client,
        "netclaim-nic",
        r#"device.attributes["netclaim.dev"].sharing == "exclusive""#,
    )
    .await;
    let nodes = ["node-1".to_owned(), "node-2".to_owned()];
    let controller = AllocatorController::for_nodes(client.clone(), &nodes);
    let claim_reasons = controller.pending_reasons();
    let pod_reasons = controller.unscheduled_reasons();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(async move {
        let _ = stop_rx.await;
    }));

    for i in 0..4 {
        create_claim(&client, &format!("c-{i}"), "netclaim-macvlan").await;
        create_pod(&client, &format!("p-{i}"), &format!("c-{i}")).await;
    }
    create_claim(&client, "unused", "netclaim-macvlan").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    wait_until("4 pods bound and their claims allocated", || {
        let (pods, claims) = (pods.clone(), claims.clone());
        async move {
            let bound = pods.list(&ListParams::default()).await.unwrap().items.iter().all(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty())
            });
            let allocated = claims
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
                .iter()
                .filter(|c| !results(c).is_empty())
                .count();
            bound && allocated == 4
        }
    })
    .await;
    let mut per_node = BTreeMap::<String, usize>::new();
    for i in 0..4 {
        let pod = pods.get(&format!("p-{i}")).await.unwrap();
        let node = pod.spec.unwrap().node_name.unwrap();
        let claim = claims.get(&format!("c-{i}")).await.unwrap();
        assert_eq!(results(&claim)[0].pool, node, "claim c-{i} follows its pod to {node}");
        let selector = claim.status.unwrap().allocation.unwrap().node_selector.unwrap();
        assert_eq!(
            selector.node_selector_terms[0].match_fields.as_ref().unwrap()[0].values,
            Some(vec![node.clone()])
        );
        *per_node.entry(node).or_default() += 1;
    }
    assert_eq!(per_node, BTreeMap::from([("node-1".to_owned(), 2), ("node-2".to_owned(), 2)]));
    // A claim no pod uses waits, as with the scheduler.
    assert!(results(&claims.get("unused").await.unwrap()).is_empty());
    let reason = claim_reasons.lock().unwrap().get("default/unused").cloned().unwrap_or_default();
    assert!(reason.contains("no pod that uses it is bound"), "{reason:?}");

    // The exclusive NIC is on node-2 only: the first pod goes there, the second fits nowhere.
    create_claim(&client, "nic-a", "netclaim-nic").await;
    create_pod(&client, "nic-pod-a", "nic-a").await;
    wait_until("nic-a allocated on node-2", || {
        let claims = claims.clone();
        async move {
            results(&claims.get("nic-a").await.unwrap())
                .first()
                .is_some_and(|r| r.pool == "node-2" && r.device == "eth1")
        }
    })
    .await;
    assert_eq!(
        pods.get("nic-pod-a").await.unwrap().spec.unwrap().node_name.as_deref(),
        Some("node-2")
    );
    create_claim(&client, "nic-b", "netclaim-nic").await;
    create_pod(&client, "nic-pod-b", "nic-b").await;
    wait_until("nic-pod-b reported unschedulable", || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("nic-pod-b").await.unwrap();
            pod.status.and_then(|s| s.conditions).into_iter().flatten().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref().is_some_and(|m| m.contains("0/2 nodes are available"))
            })
        }
    })
    .await;
    let reason = pod_reasons.lock().unwrap()["default/nic-pod-b"].clone();
    assert!(reason.contains("node-2: claim nic-b") && reason.contains("eth1"), "{reason}");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let failed = events.list(&ListParams::default()).await.unwrap().items.into_iter().any(|e| {
        e.reason.as_deref() == Some("FailedScheduling")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("nic-pod-b")
    });
    assert!(failed, "no FailedScheduling Event on nic-pod-b");
    assert!(pods.get("nic-pod-b").await.unwrap().spec.unwrap().node_name.is_none());

    // Once nic-pod-a and its claim are gone, eth1 is free and nic-pod-b is placed.
    pods.delete(
        "nic-pod-a",
        &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() },
    )
    .await
    .unwrap();
    claims.delete("nic-a", &DeleteParams::default()).await.unwrap();
    wait_until("nic-pod-b placed on node-2", || {
        let pods = pods.clone();
        async move {
            pods.get("nic-pod-b").await.unwrap().spec.unwrap().node_name.as_deref()
                == Some("node-2")
        }
    })
    .await;

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap().unwrap();
    srv.shutdown().await.unwrap();
}
