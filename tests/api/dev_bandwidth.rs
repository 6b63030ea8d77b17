//! The scheduler side of bandwidth (issue 35 item 5), in the dev cluster: ResourceSlices
//! built by the node's inventory code (a parent's `netclaim.dev/bandwidth` from its link
//! speed or `--parent-bandwidth`), claims asking with `capacity.requests`, and the dev
//! allocator placing pods as kube-scheduler would. A claim asking for more than any parent
//! has left keeps its pod pending with the reason on it (PodScheduled=False and a
//! FailedScheduling Event), and goes where room opens.
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube_inmemory::allocator::AllocatorController;
use kube_inmemory::apiserver::{ServerOptions, start};
use netclaim::inventory::bandwidth::ParentBandwidth;
use netclaim::inventory::slices::{PoolIdentity, build_slices};
use netclaim::inventory::{Inventory, Selection, SharingMode};
use netclaim::model::device::{HostInterface, LinkKind};
use serde_json::json;
use tokio::sync::oneshot;

const DRIVER: &str = "netclaim.dev";

fn veth(index: u32, name: &str, speed_mbps: Option<u32>) -> HostInterface {
    let mut interface = HostInterface::new(index, name, 1500);
    interface.kind = Some(LinkKind::Veth);
    interface.hardware.speed_mbps = speed_mbps;
    interface
}

/// Publishes `node`'s shared parents as the daemon would, with `--parent-bandwidth` `flags`.
async fn publish(client: &kube::Client, node: &str, interfaces: &[HostInterface], flags: &[&str]) {
    let parents: Vec<String> = interfaces.iter().map(|i| i.name.clone()).collect();
    let flags: Vec<ParentBandwidth> = flags.iter().map(|f| f.parse().unwrap()).collect();
    let selection = Selection::new(&[], &[], &parents, SharingMode::Capacity)
        .unwrap()
        .with_parent_bandwidth(&flags);
    let inventory = Inventory::build(interfaces, &selection);
    let pool = PoolIdentity { driver: DRIVER.to_owned(), node: node.to_owned(), generation: 1 };
    let api: Api<ResourceSlice> = Api::all(client.clone());
    for slice in build_slices(&pool, &inventory.devices) {
        api.create(&PostParams::default(), &slice).await.unwrap();
    }
}

/// A claim for a shared parent asking for `bandwidth` (none: best effort), and its pod.
async fn claim_and_pod(client: &kube::Client, name: &str, bandwidth: Option<&str>) {
    let mut exactly = json!({"deviceClassName": "netclaim-shared"});
    if let Some(amount) = bandwidth {
        exactly["capacity"] = json!({"requests": {"netclaim.dev/bandwidth": amount}});
    }
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": exactly}]}},
    }))
    .unwrap();
    Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [{"name": "app", "image": "pause"}],
            "resourceClaims": [{"name": "net", "resourceClaimName": name}],
        },
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
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

/// The claim's one result, once allocated.
async fn allocated(
    claims: &Api<ResourceClaim>,
    name: &str,
) -> Option<DeviceRequestAllocationResult> {
    let claim = claims.get(name).await.unwrap();
    claim.status?.allocation?.devices?.results?.into_iter().next()
}

/// `(node, device, consumed bandwidth)` of an allocated claim; waits for it.
async fn placed(claims: &Api<ResourceClaim>, name: &str) -> (String, String, String) {
    wait_until(&format!("{name} allocated"), || async { allocated(claims, name).await.is_some() })
        .await;
    let result = allocated(claims, name).await.unwrap();
    // A parent without a bandwidth capacity records none.
    let consumed = result
        .consumed_capacity
        .unwrap()
        .get("netclaim.dev/bandwidth")
        .map_or_else(|| "none".to_owned(), |q| q.0.clone());
    assert!(result.share_id.is_some(), "{name}: a share of the parent");
    (result.pool, result.device, consumed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_for_bandwidth_and_go_where_a_parent_has_room() {
    let srv = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
    let client = kube::Client::try_from(kube::Config::new(srv.url().parse().unwrap())).unwrap();
    // node-1: eth1 runs at 1000 Mb/s; eth2 reports no speed, so it publishes no bandwidth.
    publish(&client, "node-1", &[veth(2, "eth1", Some(1000)), veth(3, "eth2", None)], &[]).await;
    // node-2: eth1 is a 10G veth held to 3G by --parent-bandwidth.
    publish(&client, "node-2", &[veth(2, "eth1", Some(10_000))], &["eth1=3G"]).await;
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "netclaim-shared"},
        "spec": {"selectors": [{"cel": {"expression": "device.allowMultipleAllocations"}}]},
    }))
    .unwrap();
    Api::<DeviceClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    let nodes = ["node-1".to_owned(), "node-2".to_owned()];
    let controller = AllocatorController::for_nodes(client.clone(), &nodes);
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(async move {
        let _ = stop_rx.await;
    }));
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // 2G fits only node-2's 3G parent.
    claim_and_pod(&client, "big", Some("2G")).await;
    let big = placed(&claims, "big").await;
    assert_eq!(big, ("node-2".into(), "eth1".into(), "2G".into()));
    // 900M fits node-1's eth1 (1G) or node-2 (1G left): one each, never node-1's eth2.
    claim_and_pod(&client, "mid", Some("900M")).await;
    let mid = placed(&claims, "mid").await;
    claim_and_pod(&client, "more", Some("900M")).await;
    let more = placed(&claims, "more").await;
    for (name, at) in [("mid", &mid), ("more", &more)] {
        assert_eq!((at.1.as_str(), at.2.as_str()), ("eth1", "900M"), "{name}: {at:?}");
    }
    assert_ne!(mid.0, more.0, "the second 900M goes to the other node's parent: {mid:?} {more:?}");
    // Rounded up to the policy's step: 1.5 Mb/s takes 2M.
    claim_and_pod(&client, "odd", Some("1500001")).await;
    assert_eq!(placed(&claims, "odd").await.2, "2M");

    // 500M fits no parent now (100M and 98M left): the pod stays pending, saying why.
    claim_and_pod(&client, "over", Some("500M")).await;
    wait_until("over reported unschedulable with the bandwidth reason", || {
        let pods = pods.clone();
        async move {
            let pod = pods.get("over").await.unwrap();
            pod.status.and_then(|s| s.conditions).into_iter().flatten().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
                    && c.message.as_deref().is_some_and(|m| {
                        m.contains("0/2 nodes are available")
                            && m.contains("capacity netclaim.dev/bandwidth")
                            && m.contains("500M more requested")
                            && m.contains("eth2: has no capacity netclaim.dev/bandwidth")
                    })
            })
        }
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let failed = events.list(&ListParams::default()).await.unwrap().items.into_iter().any(|e| {
        e.reason.as_deref() == Some("FailedScheduling")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("over")
            && e.note.as_deref().is_some_and(|n| n.contains("netclaim.dev/bandwidth"))
    });
    assert!(failed, "no FailedScheduling Event on pod over naming the bandwidth");
    assert!(allocated(&claims, "over").await.is_none());
    assert!(pods.get("over").await.unwrap().spec.unwrap().node_name.is_none());
    // A best-effort claim (no request) still fits: it consumes no bandwidth.
    claim_and_pod(&client, "best", None).await;
    let best = placed(&claims, "best").await;
    assert!(["0", "none"].contains(&best.2.as_str()), "{best:?}");

    // "mid" goes away: its parent has room again and "over" is placed there.
    pods.delete("mid", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .unwrap();
    claims.delete("mid", &DeleteParams::default()).await.unwrap();
    let over = placed(&claims, "over").await;
    assert_eq!((&over.0, over.1.as_str(), over.2.as_str()), (&mid.0, "eth1", "500M"));
    wait_until("over bound to its claim's node", || {
        let (pods, node) = (pods.clone(), over.0.clone());
        async move {
            pods.get("over").await.unwrap().spec.unwrap().node_name.as_deref() == Some(&node)
        }
    })
    .await;

    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap().unwrap();
    srv.shutdown().await.unwrap();
}
