//! `netclaim dev --nodes 2 --parent-bandwidth uplink0=1G` (issue 35 item 5, the scheduler
//! side): the flag reaches both node daemons, whose ResourceSlices publish their uplink's
//! `netclaim.dev/bandwidth` as 1G (the veth's own speed would say 10G); claims asking for
//! more than a parent has left go to the other node, then stay pending with the reason on
//! the pod, and are placed once a claim on a node is gone. `tests/api/dev_bandwidth.rs`
//! proves the allocator's side on slices built in-process; this proves the flag's way
//! through `netclaim dev` to each daemon's slice.
//!
//! Needs root (namespaces, links, mounts): `#[ignore]`d, run by `make test` as root.

#![allow(clippy::unwrap_used, reason = "a failed step fails the test")]

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::dev_nodes::{DevCluster, client, wait_for};
use crate::kit;

const LIMIT: Duration = Duration::from_secs(30);

/// A claim on a node's uplink asking for `bandwidth`, and its pod (no node: the allocator
/// places it).
async fn claim_and_pod(client: &Client, name: &str, bandwidth: &str, address: &str) {
    let claim: ResourceClaim = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {
            "requests": [{"name": "net", "exactly": {"deviceClassName": "uplinks",
                "capacity": {"requests": {"netclaim.dev/bandwidth": bandwidth}}}}],
            "config": [{"opaque": {"driver": "netclaim.dev", "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                "mode": "macvlan", "interface": {"name": "net1"},
                "ipam": {"addresses": [address]},
            }}}],
        }},
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

/// The node (pool) and consumed bandwidth of claim `name`, once allocated.
async fn placed(claims: &Api<ResourceClaim>, name: &str) -> (String, String) {
    wait_for(&format!("{name} allocated"), LIMIT, || async {
        let claim = claims.get(name).await.ok()?;
        let result = claim.status?.allocation?.devices?.results?.into_iter().next()?;
        let consumed = result.consumed_capacity?.get("netclaim.dev/bandwidth")?.0.clone();
        Some((result.pool, consumed))
    })
    .await
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn parent_bandwidth_reaches_each_node_daemon_and_claims_wait_for_room() {
    if !kit::netns::require_root("dev_nodes_bandwidth") {
        return;
    }
    let cluster = DevCluster::start_with(&["--parent-bandwidth", "uplink0=1G"]);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let client = client(&cluster.kubeconfig).await;
        // Each daemon's slice: its uplink with the flag's bandwidth.
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        let published = wait_for("both uplinks published with 1G", LIMIT, || {
            let slices = slices.clone();
            async move {
                let list = slices.list(&ListParams::default()).await.ok()?;
                let nodes: BTreeSet<String> = list
                    .items
                    .iter()
                    .filter(|s| {
                        s.spec.devices.iter().flatten().any(|d| {
                            d.name == "uplink0"
                                && d.capacity.as_ref().is_some_and(|c| {
                                    c.get("netclaim.dev/bandwidth").is_some_and(|b| b.value.0 == "1G")
                                })
                        })
                    })
                    .filter_map(|s| s.spec.node_name.clone())
                    .collect();
                (nodes.len() == 2).then_some(nodes)
            }
        })
        .await;
        assert_eq!(
            published,
            BTreeSet::from(["dev-node-1".to_owned(), "dev-node-2".to_owned()]),
            "{}",
            cluster.log()
        );

        let class: DeviceClass = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "uplinks"},
            "spec": {"selectors": [{"cel": {"expression":
                r#"device.driver == "netclaim.dev" && device.attributes["netclaim.dev"].ifName == "uplink0""#}}]},
        }))
        .unwrap();
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

        // 600M on one node leaves 400M there: the second 600M goes to the other node.
        claim_and_pod(&client, "first", "600M", "10.78.0.11/24").await;
        let first = placed(&claims, "first").await;
        claim_and_pod(&client, "second", "600M", "10.78.0.12/24").await;
        let second = placed(&claims, "second").await;
        assert_eq!((first.1.as_str(), second.1.as_str()), ("600M", "600M"));
        assert_ne!(first.0, second.0, "one on each node: {first:?} {second:?}");

        // A third fits neither: pending, the reason on the pod.
        claim_and_pod(&client, "third", "600M", "10.78.0.13/24").await;
        wait_for("third unschedulable naming the bandwidth", LIMIT, || {
            let pods = pods.clone();
            async move {
                let pod = pods.get("third").await.ok()?;
                pod.status?.conditions?.into_iter().find(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("Unschedulable")
                        && c.message.as_deref().is_some_and(|m| {
                            m.contains("0/2 nodes are available")
                                && m.contains("capacity netclaim.dev/bandwidth")
                                && m.contains("of 1G")
                        })
                })
            }
        })
        .await;
        assert!(pods.get("third").await.unwrap().spec.unwrap().node_name.is_none());

        // The first goes away: the third takes its node.
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        pods.delete("first", &now).await.unwrap();
        claims.delete("first", &DeleteParams::default()).await.unwrap();
        let third = placed(&claims, "third").await;
        assert_eq!(third, (first.0.clone(), "600M".to_owned()), "{}", cluster.log());
        wait_for("third bound to that node", LIMIT, || {
            let (pods, node) = (pods.clone(), first.0.clone());
            async move {
                let pod = pods.get("third").await.ok()?;
                (pod.spec?.node_name? == node).then_some(())
            }
        })
        .await;
    });
}
