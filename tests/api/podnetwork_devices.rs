//! PodNetwork devices end to end without root: the real publisher loop, slice adapter,
//! PodNetwork and Node watches and device lookup against the in-process API server, over a
//! fixed list of node interfaces. A Ready network's `<network>-<parent>` device appears with
//! `podNetwork`, `vlan` and capacity; disabling it or relabelling the node takes it away; a
//! claim allocated on it before still prepares and resolves afterwards; the parent's
//! capacity bounds the claims on it; a restarted publisher's first generation already
//! carries it; a VLAN conflict is warned about once.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{Device as ApiDevice, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};
use netclaim::claims::networks::NetworkPorts;
use netclaim::claims::{ClaimService, DeviceSource, ServiceIdentity};
use netclaim::inventory::device_lookup::DiscoveredDevices;
use netclaim::inventory::networks::NetworkInputs;
use netclaim::inventory::publish::{
    self, InterfaceSource, Publisher, RequestedSharing, SliceApi, SliceApiError, Triggers,
    WarningSink,
};
use netclaim::inventory::slices::PoolIdentity;
use netclaim::inventory::{Selection, SharingMode};
use netclaim::k8s::claims::KubeClaims;
use netclaim::k8s::ip_blocks::{KubeIpBlocks, WatchedPodNetworks};
use netclaim::k8s::resource_slices::KubeSlices;
use netclaim::metrics::{Health, Metrics};
use netclaim::model::ClaimRef;
use netclaim::model::device::HostInterface;
use netclaim::model::pod_network::PodNetwork;
use netclaim::store::Store;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::kit::api_server::{client_for, install_crds};

const DRIVER: &str = "netclaim.dev";
const NODE: &str = "node-a";
/// Bound for "eventually" (the publisher reacts within its 200 ms debounce; the bound only
/// keeps a broken build from hanging).
const PATIENCE: Duration = Duration::from_secs(20);

/// The node's interfaces: `eth1` and `eth2`, two plain NICs.
#[derive(Clone)]
struct FixedInterfaces;

fn nic(index: u32, name: &str) -> HostInterface {
    let mut interface = HostInterface::new(index, name, 1500);
    interface.hardware.has_device = true;
    interface.min_mtu = Some(68);
    interface.max_mtu = Some(9000);
    interface
}

impl InterfaceSource for FixedInterfaces {
    type Error = std::io::Error;

    async fn discover(&self) -> Result<Vec<HostInterface>, std::io::Error> {
        Ok(vec![nic(2, "eth1"), nic(3, "eth2")])
    }
}

/// The real slice adapter, recording every slice it writes.
struct Recording {
    inner: KubeSlices,
    written: Arc<Mutex<Vec<ResourceSlice>>>,
}

impl SliceApi for Recording {
    async fn list(&self) -> Result<Vec<ResourceSlice>, SliceApiError> {
        self.inner.list().await
    }

    async fn apply(&self, slice: &ResourceSlice) -> Result<ResourceSlice, SliceApiError> {
        self.written.lock().unwrap().push(slice.clone());
        self.inner.apply(slice).await
    }

    async fn delete(&self, name: &str) -> Result<(), SliceApiError> {
        self.inner.delete(name).await
    }
}

/// Warnings the publisher would record as Events on the Node.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<(String, String)>>>);

impl WarningSink for Warnings {
    async fn warn(&self, reason: &str, _action: &str, note: String) {
        self.0.lock().unwrap().push((reason.to_owned(), note));
    }
}

/// The node side of the daemon as `netclaim node` wires it, minus kubelet and NRI.
struct NodeSide {
    stop: watch::Sender<bool>,
    watches: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    written: Arc<Mutex<Vec<ResourceSlice>>>,
    warnings: Warnings,
    lookup: DiscoveredDevices<FixedInterfaces>,
    _link_changes: mpsc::Sender<()>,
}

impl NodeSide {
    fn start(client: &kube::Client) -> Self {
        let watches = CancellationToken::new();
        let pod_networks =
            netclaim::k8s::pod_networks::spawn_watch(client.clone(), watches.clone());
        let inputs: watch::Receiver<NetworkInputs> = netclaim::k8s::node_networks::spawn(
            client.clone(),
            client.clone(),
            NODE,
            pod_networks,
            watches.clone(),
        );
        let slices = KubeSlices::new(client.clone(), client.clone(), DRIVER, NODE);
        let slice_events = Box::pin(slices.watch());
        let written = Arc::new(Mutex::new(Vec::new()));
        let api = Recording { inner: slices, written: Arc::clone(&written) };
        let selection = Selection::new(&[], &[], &[], SharingMode::Capacity).unwrap();
        let pool = PoolIdentity { driver: DRIVER.into(), node: NODE.into(), generation: 0 };
        let publisher = Publisher::new(api, pool, selection.clone(), RequestedSharing::Auto, None);
        let (link_sender, link_changes) = mpsc::channel(1);
        let (_moved_sender, moved) = watch::channel(BTreeSet::new());
        let (stop, stop_receiver) = watch::channel(false);
        let triggers = Triggers {
            link_changes,
            moved,
            slice_events,
            networks: inputs.clone(),
            stop: stop_receiver,
        };
        let warnings = Warnings::default();
        let task_warnings = warnings.clone();
        // The loop's future is not `Send` (a `watch` guard in its select), as in the daemon,
        // which runs it on its own task tree: here it gets a thread of the blocking pool.
        let runtime = tokio::runtime::Handle::current();
        let task = tokio::task::spawn_blocking(move || {
            let (metrics, health) = (Metrics::new(), Health::default());
            runtime.block_on(publish::run(
                publisher,
                &FixedInterfaces,
                &task_warnings,
                triggers,
                &metrics,
                &health,
            ));
        });
        let lookup = DiscoveredDevices::with_source(FixedInterfaces, selection)
            .with_networks(DRIVER, inputs);
        Self { stop, watches, task, written, warnings, lookup, _link_changes: link_sender }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
        self.watches.cancel();
    }
}

/// The devices of the newest generation of this node's pool.
async fn published(client: &kube::Client) -> Vec<ApiDevice> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let all = slices.list(&ListParams::default()).await.unwrap().items;
    let newest = all.iter().map(|s| s.spec.pool.generation).max().unwrap_or(0);
    all.into_iter()
        .filter(|s| s.spec.pool.generation == newest)
        .flat_map(|s| s.spec.devices.unwrap_or_default())
        .collect()
}

async fn wait_for(what: &str, client: &kube::Client, check: impl Fn(&[ApiDevice]) -> bool) {
    let started = Instant::now();
    loop {
        let devices = published(client).await;
        if check(&devices) {
            return;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "timed out waiting for {what}; published: {:?}",
            devices.iter().map(|d| &d.name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn named<'a>(devices: &'a [ApiDevice], name: &str) -> Option<&'a ApiDevice> {
    devices.iter().find(|d| d.name == name)
}

fn attribute(device: &ApiDevice, name: &str) -> Option<Value> {
    let value = device.attributes.as_ref()?.get(name)?;
    value.string.clone().map(Value::from).or(value.int.map(Value::from))
}

/// Writes the status the controller would: `Ready` for the current generation.
async fn judge(client: &kube::Client, name: &str, ready: bool) {
    let networks: Api<PodNetwork> = Api::all(client.clone());
    let generation = networks.get(name).await.unwrap().metadata.generation.unwrap();
    let (status, reason) = if ready { ("True", "Ready") } else { ("False", "Disabled") };
    let patch = json!({"status": {
        "observedGeneration": generation,
        "conditions": [{"type": "Ready", "status": status, "reason": reason, "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "observedGeneration": generation}],
    }});
    networks.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

async fn create_network(client: &kube::Client, name: &str, spec: Value) {
    let networks: Api<PodNetwork> = Api::all(client.clone());
    let network: PodNetwork = serde_json::from_value(json!({
        "apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap();
    networks.create(&PostParams::default(), &network).await.unwrap();
    judge(client, name, true).await;
}

async fn patch_spec(client: &kube::Client, name: &str, spec: Value) {
    let networks: Api<PodNetwork> = Api::all(client.clone());
    let patch = json!({"spec": spec});
    networks.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

async fn label_node(client: &kube::Client, zone: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {"zone": zone}}});
    nodes.patch(NODE, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// A macvlan claim allocated on `device` with `share` as the scheduler writes it.
async fn allocated_claim(client: &kube::Client, name: &str, device: &str, share: &str) -> ClaimRef {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "net",
            "exactly": {"deviceClassName": "medianet.podnetwork.netclaim.dev"}}]}},
    }))
    .unwrap();
    let created = claims.create(&PostParams::default(), &claim).await.unwrap();
    // The config the network's DeviceClass carries (`controller::device_class`): a network's
    // device serves only claims naming that network (decision 0017).
    let config = json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                        "podNetwork": "medianet"});
    let status = json!({"status": {
        "allocation": {"devices": {
            "results": [{"request": "net", "driver": DRIVER, "pool": NODE, "device": device,
                         "shareID": share}],
            "config": [{"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": config}}],
        }},
        "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"),
                         "uid": format!("pod-uid-{name}")}],
    }});
    claims.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
    ClaimRef { namespace: "default".into(), name: name.into(), uid: created.metadata.uid.unwrap() }
}

/// The API server with our CRDs, Node `node-a` in zone `a`, and PodNetwork `medianet` on
/// `eth1` (VLAN 100, capacity 64, nodes of zone `a`), Ready.
async fn cluster() -> (ApiServer, kube::Client) {
    let server = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
    let client = client_for(&server);
    install_crds(&client).await;
    let node: Node =
        serde_json::from_value(json!({"metadata": {"name": NODE, "labels": {"zone": "a"}}}))
            .unwrap();
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    create_network(
        &client,
        "medianet",
        json!({"parents": ["eth1"], "vlan": 100, "interfaceCapacity": 64,
               "nodeSelector": {"matchLabels": {"zone": "a"}}}),
    )
    .await;
    (server, client)
}

/// The node's claim service on `state` with the network ports, reading devices through the
/// node side's lookup.
fn claim_service(
    client: &kube::Client,
    node_side: &NodeSide,
    state: &std::path::Path,
) -> ClaimService<KubeClaims, DiscoveredDevices<FixedInterfaces>, Arc<Store>> {
    ClaimService::load(
        ServiceIdentity { driver: DRIVER.into(), node: NODE.into() },
        KubeClaims::new(client.clone()),
        node_side.lookup.clone(),
        Arc::new(Store::open(state).unwrap()),
    )
    .unwrap()
    .with_pod_networks(NetworkPorts {
        networks: Arc::new(WatchedPodNetworks::new(
            netclaim::k8s::pod_networks::spawn_watch(client.clone(), node_side.watches.clone()),
            PATIENCE,
        )),
        blocks: Arc::new(KubeIpBlocks::new(client.clone())),
        release_grace: Duration::ZERO,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_podnetwork_device_follows_its_network_and_its_claims_outlive_it() {
    let (server, client) = cluster().await;
    let node_side = NodeSide::start(&client);
    wait_for("the network's device", &client, |d| named(d, "medianet-eth1").is_some()).await;
    let devices = published(&client).await;
    let device = named(&devices, "medianet-eth1").unwrap();
    assert_eq!(attribute(device, "podNetwork"), Some(json!("medianet")));
    assert_eq!(attribute(device, "vlan"), Some(json!(100)));
    assert_eq!(attribute(device, "ifName"), Some(json!("eth1")));
    assert_eq!(attribute(device, "sharing"), Some(json!("shared")));
    assert_eq!(device.allow_multiple_allocations, Some(true));
    assert_eq!(device.capacity.as_ref().unwrap()["netclaim.dev/interfaces"].value.0, "64");
    assert!(named(&devices, "eth1").is_none(), "the parent is not also an exclusive device");
    assert!(named(&devices, "eth2").is_some(), "other NICs stay exclusive");
    // The first publication already carried it: no generation without the network.
    let first = node_side.written.lock().unwrap().first().cloned().unwrap();
    assert!(first.spec.devices.iter().flatten().any(|d| d.name == "medianet-eth1"));

    // Claims on the device: one prepared now, one allocated now and prepared after the
    // network is disabled (kubelet may be slower than the administrator).
    let state = tempfile::tempdir().unwrap();
    let service = claim_service(&client, &node_side, state.path());
    let early = allocated_claim(&client, "early", "medianet-eth1", "share-1").await;
    let late = allocated_claim(&client, "late", "medianet-eth1", "share-2").await;
    let answer = service.prepare_claim(&early).await.unwrap();
    assert_eq!(answer[0].device_name, "medianet-eth1");
    assert_eq!(service.prepared(&early.uid).unwrap().devices[0].if_name, "eth1");

    // Disabled: the device leaves the slice, the parent is not offered for exclusive use.
    patch_spec(&client, "medianet", json!({"enabled": false})).await;
    judge(&client, "medianet", false).await;
    wait_for("the device to go", &client, |d| named(d, "medianet-eth1").is_none()).await;
    assert!(named(&published(&client).await, "eth1").is_none());
    let facts = node_side.lookup.facts("medianet-eth1").await.unwrap();
    assert_eq!(facts.if_name, "eth1", "a device that left the slice still resolves");
    assert_eq!(service.prepare_claim(&early).await.unwrap(), answer, "prepared: same answer");
    let late_answer = service.prepare_claim(&late).await.unwrap();
    assert_eq!(late_answer[0].device_name, "medianet-eth1");
    assert_eq!(service.prepared(&late.uid).unwrap().devices[0].if_name, "eth1");

    // Enabled again, then the node stops matching the selector.
    patch_spec(&client, "medianet", json!({"enabled": true})).await;
    judge(&client, "medianet", true).await;
    wait_for("the device to return", &client, |d| named(d, "medianet-eth1").is_some()).await;
    label_node(&client, "b").await;
    wait_for("the device to go with the label", &client, |d| {
        named(d, "medianet-eth1").is_none() && named(d, "eth1").is_some()
    })
    .await;
    label_node(&client, "a").await;
    wait_for("the device to return with the label", &client, |d| {
        named(d, "medianet-eth1").is_some()
    })
    .await;

    // The parent's capacity counts the children of every claim on it: two are there.
    patch_spec(&client, "medianet", json!({"interfaceCapacity": 2})).await;
    judge(&client, "medianet", true).await;
    wait_for("the smaller capacity", &client, |d| {
        named(d, "medianet-eth1")
            .is_some_and(|d| d.capacity.as_ref().unwrap()["netclaim.dev/interfaces"].value.0 == "2")
    })
    .await;
    let third = allocated_claim(&client, "third", "medianet-eth1", "share-3").await;
    let err = service.prepare_claim(&third).await.unwrap_err().to_string();
    assert!(err.contains("parent eth1") && err.contains("limit of 2"), "{err}");

    // A restarted publisher continues with the device in its first generation.
    node_side.stop().await;
    let node_side = NodeSide::start(&client);
    let started = Instant::now();
    while node_side.written.lock().unwrap().is_empty() {
        assert!(started.elapsed() < PATIENCE, "the restarted publisher wrote nothing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let written = node_side.written.lock().unwrap().clone();
    for slice in &written {
        assert!(
            slice.spec.devices.iter().flatten().any(|d| d.name == "medianet-eth1"),
            "generation {} was written without the network's device",
            slice.spec.pool.generation
        );
    }

    // A newer network with the same VLAN on eth1: only the older one is published there,
    // and the conflict is warned about once.
    create_network(&client, "copycat", json!({"parents": ["eth1", "eth2"], "vlan": 100})).await;
    wait_for("the newer network on eth2", &client, |d| named(d, "copycat-eth2").is_some()).await;
    let devices = published(&client).await;
    assert!(
        named(&devices, "medianet-eth1").is_some() && named(&devices, "copycat-eth1").is_none()
    );
    // The Warning goes out from the publisher's round that left copycat-eth1 out, which may
    // finish after the slice it wrote is visible: wait for it, then count.
    let started = Instant::now();
    while node_side.warnings.0.lock().unwrap().is_empty() {
        assert!(started.elapsed() < PATIENCE, "no PodNetworkConflict warning");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warnings = node_side.warnings.0.lock().unwrap().clone();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert_eq!(warnings[0].0, "PodNetworkConflict");
    assert!(
        warnings[0].1.contains("medianet") && warnings[0].1.contains("copycat"),
        "{warnings:?}"
    );
    node_side.stop().await;
    server.shutdown().await.unwrap();
}
