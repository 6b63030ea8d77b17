//! `netclaim controller` against the in-process API server: conditions (Ready, Invalid,
//! Disabled, Overlaps), the DeviceClass per network, the finalizer held while an IPBlock
//! exists, garbage collection of IPBlocks, and the Lease election's takeover and release.
#![allow(clippy::unwrap_used, reason = "test helpers: a failed setup step should panic")]
#![allow(clippy::too_many_lines, reason = "each test is one scenario told step by step")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_inmemory::apiserver::{ApiServer, ServerOptions, start};
use netclaim::controller::metrics::ReasonLabel;
use netclaim::controller::{self, ControllerConfig, ControllerMetrics};
use netclaim::k8s::ApiClients;
use netclaim::k8s::leader_election::{self, LeaderElector, LeaseConfig};
use netclaim::model::pod_network::{
    FINALIZER, IpBlock, IpBlockClaim, IpBlockSpec, PodNetwork, device_class_name,
};
use serde_json::json;
use tokio::sync::oneshot;

use crate::kit::api_server::{client_for, install_crds};

const DRIVER: &str = "netclaim.dev";
/// Bound for "eventually": the controller reacts within milliseconds; this only keeps a
/// broken build from hanging.
const PATIENCE: Duration = Duration::from_secs(20);

struct Cluster {
    _server: ApiServer,
    client: kube::Client,
}

impl Cluster {
    async fn start() -> Self {
        let server = start("127.0.0.1:0".parse().unwrap(), ServerOptions::default()).await.unwrap();
        let client = client_for(&server);
        install_crds(&client).await;
        Self { _server: server, client }
    }

    fn clients(&self) -> ApiClients {
        ApiClients { unary: self.client.clone(), watch: self.client.clone() }
    }

    fn networks(&self) -> Api<PodNetwork> {
        Api::all(self.client.clone())
    }

    fn classes(&self) -> Api<DeviceClass> {
        Api::all(self.client.clone())
    }

    fn blocks(&self) -> Api<IpBlock> {
        Api::all(self.client.clone())
    }

    /// Runs a controller (no leader election) until the returned sender is dropped.
    fn spawn_controller(&self, config: ControllerConfig) -> (Arc<ControllerMetrics>, Running) {
        let metrics = Arc::new(ControllerMetrics::new());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(controller::run_with_metrics(
            self.clients(),
            config,
            Arc::clone(&metrics),
            async move {
                let _ = stopped.await;
            },
        ));
        (metrics, Running { stop: Some(stop), task: Some(task) })
    }

    async fn create_network(&self, name: &str, spec: serde_json::Value) -> PodNetwork {
        let network: PodNetwork =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap();
        self.networks().create(&PostParams::default(), &network).await.unwrap()
    }

    async fn create_block(
        &self,
        network: &str,
        cidr: &str,
        node: &str,
        claim: Option<IpBlockClaim>,
    ) {
        let block = IpBlock::new(IpBlockSpec {
            pod_network: network.to_owned(),
            cidr: cidr.to_owned(),
            node_name: node.to_owned(),
            claim,
        });
        self.blocks().create(&PostParams::default(), &block).await.unwrap();
    }

    /// Polls the network until `check` holds; returns it.
    async fn wait_network(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&PodNetwork) -> bool,
    ) -> PodNetwork {
        let started = Instant::now();
        loop {
            let current = self.networks().get_opt(name).await.unwrap();
            if let Some(network) = current.as_ref().filter(|n| check(n)) {
                return network.clone();
            }
            assert!(
                started.elapsed() < PATIENCE,
                "{name}: timed out waiting for {what}: {current:#?}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn wait_gone<K>(&self, api: &Api<K>, name: &str)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let started = Instant::now();
        while let Some(object) = api.get_opt(name).await.unwrap() {
            assert!(started.elapsed() < PATIENCE, "{name} was never deleted: {object:#?}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

/// Stops a controller started by [`Cluster::spawn_controller`] when dropped.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), controller::ControllerError>>>,
}

impl Running {
    async fn stop(mut self) {
        drop(self.stop.take());
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

fn ready(network: &PodNetwork) -> Option<(String, String, String, Option<i64>)> {
    let condition = network.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((
        condition.status.clone(),
        condition.reason.clone(),
        condition.message.clone(),
        condition.observed_generation,
    ))
}

fn reason_is(network: &PodNetwork, reason: &str) -> bool {
    let current = network.metadata.generation;
    ready(network).is_some_and(|(_, r, _, generation)| r == reason && generation == current)
        && network.status.as_ref().and_then(|s| s.observed_generation) == current
}

fn spec(subnet: &str, gateway: &str) -> serde_json::Value {
    json!({"parents": ["eth1"], "ipam": {"subnets": [subnet], "gateways": [gateway]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_disabled_and_invalid_networks_and_their_device_class() {
    let cluster = Cluster::start().await;
    let (metrics, running) = cluster.spawn_controller(ControllerConfig::new(DRIVER));

    cluster.create_network("medianet", spec("10.10.0.0/16", "10.10.0.1")).await;
    let network = cluster.wait_network("medianet", "Ready", |n| reason_is(n, "Ready")).await;
    let (status, _, _, _) = ready(&network).unwrap();
    assert_eq!(status, "True");
    assert!(network.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER));
    let class_name = device_class_name("medianet");
    assert_eq!(
        network.status.as_ref().unwrap().device_class_name.as_deref(),
        Some(class_name.as_str())
    );
    let class = cluster.classes().get(&class_name).await.unwrap();
    let class = serde_json::to_value(&class).unwrap();
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == \"netclaim.dev\" && has(device.attributes[\"netclaim.dev\"].podNetwork) \
         && device.attributes[\"netclaim.dev\"].podNetwork == \"medianet\""
    );
    assert_eq!(
        class["spec"]["config"],
        json!([{"opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig", "podNetwork": "medianet"
        }}}])
    );
    assert_eq!(class["metadata"]["labels"]["netclaim.dev/pod-network"], "medianet");
    assert_eq!(class["metadata"]["ownerReferences"][0]["uid"], json!(network.metadata.uid));

    // A DeviceClass someone deleted comes back.
    cluster.classes().delete(&class_name, &DeleteParams::default()).await.unwrap();
    let started = Instant::now();
    while cluster.classes().get_opt(&class_name).await.unwrap().is_none() {
        assert!(started.elapsed() < PATIENCE, "the DeviceClass was not re-created");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // Disabled: False with reason Disabled, at the new generation; the class stays. (A
    // condition's time has one-second resolution: let a second pass so the transition shows.)
    let before = ready(&network).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    cluster
        .networks()
        .patch(
            "medianet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"enabled": false}})),
        )
        .await
        .unwrap();
    let disabled = cluster.wait_network("medianet", "Disabled", |n| reason_is(n, "Disabled")).await;
    assert!(disabled.metadata.generation > network.metadata.generation);
    let (status, _, message, _) = ready(&disabled).unwrap();
    assert_eq!(status, "False");
    assert!(message.contains("spec.enabled"), "{message}");
    assert!(cluster.classes().get_opt(&class_name).await.unwrap().is_some());
    let transition =
        |n: &PodNetwork| n.status.as_ref().unwrap().conditions[0].last_transition_time.clone();
    assert_ne!(transition(&disabled), transition(&network), "{before:?}");

    // Invalid (what CEL cannot see: a gateway on the broadcast address): the message names
    // the field; no DeviceClass is made.
    // (A gateway added to a live network must lie in its staticRanges, so it has one.)
    let mut broken_spec = spec("10.30.0.0/24", "10.30.0.255");
    broken_spec["ipam"]["staticRanges"] = json!(["10.30.0.0/26"]);
    cluster.create_network("broken", broken_spec).await;
    let broken = cluster.wait_network("broken", "Invalid", |n| reason_is(n, "Invalid")).await;
    let (status, _, message, _) = ready(&broken).unwrap();
    assert_eq!(status, "False");
    assert_eq!(
        message,
        "spec.ipam.gateways[0]: 10.30.0.255 is the broadcast address of 10.30.0.0/24"
    );
    assert!(cluster.classes().get_opt(&device_class_name("broken")).await.unwrap().is_none());
    assert_eq!(broken.status.as_ref().unwrap().device_class_name, None);

    // Fixed: Ready, with its class.
    cluster
        .networks()
        .patch(
            "broken",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ipam": {"gateways": ["10.30.0.1"]}}})),
        )
        .await
        .unwrap();
    cluster.wait_network("broken", "Ready", |n| reason_is(n, "Ready")).await;
    assert!(cluster.classes().get_opt(&device_class_name("broken")).await.unwrap().is_some());

    // Metrics: networks by reason, reconciles counted.
    let text = metrics.encode();
    assert!(text.contains("netclaim_controller_pod_networks{reason=\"Ready\"} 1"), "{text}");
    assert!(text.contains("netclaim_controller_pod_networks{reason=\"Disabled\"} 1"), "{text}");
    assert!(text.contains("netclaim_controller_leader 1"), "{text}");
    assert!(text.contains("netclaim_controller_reconciles_total{result=\"success\"}"), "{text}");
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newer_of_two_overlapping_networks_gets_overlaps_until_the_older_goes() {
    let cluster = Cluster::start().await;
    let (_metrics, running) = cluster.spawn_controller(ControllerConfig::new(DRIVER));
    // Names in creation order, so a tie on the one-second creation time agrees with it.
    cluster.create_network("net-a", spec("10.20.0.0/16", "10.20.0.1")).await;
    cluster.wait_network("net-a", "Ready", |n| reason_is(n, "Ready")).await;
    cluster
        .create_network(
            "net-b",
            json!({"parents": ["eth2"], "ipam": {"subnets": ["fd00:20::/64", "10.20.128.0/17"]}}),
        )
        .await;
    let b = cluster.wait_network("net-b", "Overlaps", |n| reason_is(n, "Overlaps")).await;
    let (status, _, message, _) = ready(&b).unwrap();
    assert_eq!(status, "False");
    assert!(
        message.contains("\"net-a\"")
            && message.contains("10.20.128.0/17")
            && message.contains("10.20.0.0/16"),
        "{message}"
    );
    assert!(cluster.classes().get_opt(&device_class_name("net-b")).await.unwrap().is_none());
    // The older one is untouched.
    let a = cluster.networks().get("net-a").await.unwrap();
    assert!(reason_is(&a, "Ready"));

    // The older network goes (no IPBlocks: the finalizer lets it go at once); the newer one
    // becomes Ready and gets its class, the older one's class is deleted.
    cluster.networks().delete("net-a", &DeleteParams::default()).await.unwrap();
    cluster.wait_gone(&cluster.networks(), "net-a").await;
    cluster.wait_network("net-b", "Ready", |n| reason_is(n, "Ready")).await;
    assert!(cluster.classes().get_opt(&device_class_name("net-b")).await.unwrap().is_some());
    cluster.wait_gone(&cluster.classes(), &device_class_name("net-a")).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletion_waits_behind_the_finalizer_while_an_ipblock_exists() {
    let cluster = Cluster::start().await;
    let (metrics, running) = cluster.spawn_controller(ControllerConfig::new(DRIVER));
    cluster.create_network("held", spec("10.40.0.0/16", "10.40.0.1")).await;
    cluster
        .wait_network("held", "Ready with the finalizer", |n| {
            reason_is(n, "Ready") && n.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)
        })
        .await;
    cluster.create_block("held", "10.40.0.64/26", "node-1", None).await;
    // A block of another network does not hold this one.
    cluster.create_network("other", spec("10.41.0.0/16", "10.41.0.1")).await;
    cluster.create_block("other", "10.41.0.0/26", "node-1", None).await;

    cluster.networks().delete("held", &DeleteParams::default()).await.unwrap();
    // The DeviceClass goes at once; the network stays while its block exists.
    cluster.wait_gone(&cluster.classes(), &device_class_name("held")).await;
    let deleting = cluster.networks().get("held").await.unwrap();
    assert!(deleting.metadata.deletion_timestamp.is_some());
    // While it waits, Ready says so and names the block and its node (it said Ready).
    let block = netclaim::model::pod_network::ip_block_name("held", "10.40.0.64/26");
    let waiting = cluster
        .wait_network("held", "Ready=False Deleting", |n| {
            ready(n).is_some_and(|(status, reason, _, _)| status == "False" && reason == "Deleting")
        })
        .await;
    let (_, _, message, _) = ready(&waiting).unwrap();
    assert!(
        message.contains("waiting for 1 IPBlock(s)")
            && message.contains(&format!("{block} (node node-1)")),
        "{message}"
    );
    assert_eq!(waiting.status.as_ref().unwrap().device_class_name, None);
    let text = metrics.encode();
    assert!(text.contains("netclaim_controller_pod_networks{reason=\"Deleting\"} 1"), "{text}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let still = cluster.networks().get_opt("held").await.unwrap();
    assert!(
        still.is_some_and(|n| n.metadata.finalizers.iter().flatten().any(|f| f == FINALIZER)),
        "the finalizer must hold while an IPBlock of the network exists"
    );

    // The node releases the block: the network goes.
    cluster.blocks().delete(&block, &DeleteParams::default()).await.unwrap();
    cluster.wait_gone(&cluster.networks(), "held").await;
    assert!(cluster.networks().get_opt("other").await.unwrap().is_some());
    running.stop().await;
}

async fn create_node(client: &kube::Client, name: &str) {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
}

/// A claim allocated by the scheduler on `pool` (through /status, as it does).
async fn allocated_claim(client: &kube::Client, name: &str, pool: &str) -> ResourceClaim {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": "x"}}]}},
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let results = json!([{"request": "net", "driver": DRIVER, "pool": pool, "device": "eth1"}]);
    claims
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": results}}}})),
        )
        .await
        .unwrap()
}

fn claim_ref(claim: &ResourceClaim) -> IpBlockClaim {
    IpBlockClaim {
        namespace: "default".to_owned(),
        name: claim.metadata.name.clone().unwrap(),
        uid: claim.metadata.uid.clone().unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_of_deleted_nodes_are_collected_only_when_no_claim_uses_them() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    create_node(&client, "live").await;
    cluster
        .create_network(
            "gcnet",
            json!({"parents": ["eth1"], "ipam": {"subnets": ["10.50.0.0/16"], "exclude": ["10.50.255.0/24"]}}),
        )
        .await;
    // On the deleted node "gone": an ordinary block, and a static reservation of a claim
    // that still exists; a claim is allocated there.
    let on_gone = allocated_claim(&client, "on-gone", "gone").await;
    let reserved = allocated_claim(&client, "reserved", "gone").await;
    cluster.create_block("gcnet", "10.50.0.0/26", "gone", None).await;
    cluster.create_block("gcnet", "10.50.255.5/32", "gone", Some(claim_ref(&reserved))).await;
    // On the live node: an ordinary block (the node's business), and a static reservation
    // whose claim is gone (collected after the grace).
    cluster.create_block("gcnet", "10.50.0.64/26", "live", None).await;
    // Another driver's network on the gone node: its controller's business, never ours.
    cluster
        .create_network(
            "othernet",
            json!({"provider": "other.example.com", "parents": ["eth9"], "ipam": {"subnets": ["10.60.0.0/16"]}}),
        )
        .await;
    cluster.create_block("othernet", "10.60.0.0/26", "gone", None).await;
    let vanished = IpBlockClaim {
        namespace: "default".into(),
        name: "vanished".into(),
        uid: "0d8a5c8e-2b7f-4d6c-9a55-000000000001".into(),
    };
    cluster.create_block("gcnet", "10.50.255.9/32", "live", Some(vanished)).await;

    let config = ControllerConfig {
        gc_interval: Duration::from_millis(100),
        block_release_grace: Duration::from_secs(1),
        ..ControllerConfig::new(DRIVER)
    };
    let (metrics, running) = cluster.spawn_controller(config);
    let names = |client: kube::Client| async move {
        let mut names: Vec<String> = Api::<IpBlock>::all(client)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|b| b.spec.cidr)
            .collect();
        names.sort();
        names
    };
    // The live node's reservation of a vanished claim goes after the grace.
    let started = Instant::now();
    while names(client.clone()).await.contains(&"10.50.255.9/32".to_owned()) {
        assert!(started.elapsed() < PATIENCE, "the stale reservation was never collected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Many sweeps later the gone node's blocks are still there: claims are allocated on it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        names(client.clone()).await,
        ["10.50.0.0/26", "10.50.0.64/26", "10.50.255.5/32", "10.60.0.0/26"]
    );
    let text = metrics.encode();
    assert!(
        text.contains("netclaim_controller_ip_blocks{pod_network=\"gcnet\",node=\"gone\"} 2"),
        "{text}"
    );
    assert!(!text.contains("pod_network=\"othernet\""), "{text}");

    // The pod on the gone node is gone: its claim goes. The reservation's claim still exists,
    // so only the ordinary block goes.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    claims.delete(&on_gone.metadata.name.clone().unwrap(), &DeleteParams::default()).await.unwrap();
    // The reserved claim still has an allocation on "gone": it holds the node's blocks. Drop
    // its allocation (deallocated, not yet deleted): the ordinary block goes, the reservation
    // stays while its claim exists.
    claims
        .patch_status(
            "reserved",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"allocation": null}})),
        )
        .await
        .unwrap();
    let started = Instant::now();
    while names(client.clone()).await.contains(&"10.50.0.0/26".to_owned()) {
        assert!(started.elapsed() < PATIENCE, "the gone node's block was never collected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(names(client.clone()).await, ["10.50.0.64/26", "10.50.255.5/32", "10.60.0.0/26"]);
    // The reservation's claim goes: so does the reservation.
    claims.delete("reserved", &DeleteParams::default()).await.unwrap();
    let started = Instant::now();
    while names(client.clone()).await.contains(&"10.50.255.5/32".to_owned()) {
        assert!(started.elapsed() < PATIENCE, "the gone node's reservation was never collected");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(names(client.clone()).await, ["10.50.0.64/26", "10.60.0.0/26"]);
    let deletions =
        |reason: &'static str| metrics.gc_deletions.get_or_create(&ReasonLabel { reason }).get();
    assert_eq!((deletions("node-gone"), deletions("claim-gone")), (2, 1));
    running.stop().await;
}

/// A short lease (`leaseDurationSeconds` is whole seconds) renewed every 100 ms.
fn fast_lease(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_secs(1),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new("default", "netclaim-controller", identity)
    }
}

/// One elector running on its own task, as `controller::run` drives it.
struct Candidate {
    leading: tokio::sync::watch::Receiver<bool>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<LeaderElector>,
}

fn candidate(client: &kube::Client, identity: &str) -> Candidate {
    let (leading_tx, leading) = tokio::sync::watch::channel(false);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let elector = LeaderElector::new(client.clone(), fast_lease(identity));
    let task =
        tokio::spawn(async move { leader_election::run(elector, &leading_tx, stop_rx).await });
    Candidate { leading, stop, task }
}

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases.get_opt("netclaim-controller").await.unwrap()?.spec?.holder_identity
}

async fn wait_leading(candidate: &mut Candidate) -> Instant {
    tokio::time::timeout(PATIENCE, candidate.leading.wait_for(|leading| *leading))
        .await
        .expect("took the lease in time")
        .unwrap();
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_elector_leads_a_silent_leader_is_waited_out_and_a_released_lease_is_taken_at_once() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    let mut first = candidate(&client, "first");
    wait_leading(&mut first).await;
    let mut second = candidate(&client, "second");
    // The second never leads while the first renews.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(*first.leading.borrow() && !*second.leading.borrow());
    assert_eq!(holder(&client).await.as_deref(), Some("first"));

    // The first goes silent (as after kill -9: no release): the second waits out a whole
    // lease from the last renewal it saw.
    let silenced = Instant::now();
    first.task.abort();
    let took = wait_leading(&mut second).await.duration_since(silenced);
    // The last renewal it saw was at most a period (and a request) before the silence.
    assert!(
        took >= Duration::from_millis(1800),
        "took over after {took:?}, before the lease ran out"
    );
    assert_eq!(holder(&client).await.as_deref(), Some("second"));

    // A third candidate waits; the second releases (SIGTERM): the third takes over at once.
    let mut third = candidate(&client, "third");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!*third.leading.borrow());
    second.stop.send_replace(true);
    let mut elector = second.task.await.unwrap();
    let released = Instant::now();
    elector.release().await.unwrap();
    let took = wait_leading(&mut third).await.duration_since(released);
    assert!(took < Duration::from_secs(1), "took over {took:?} after the release");
    assert_eq!(holder(&client).await.as_deref(), Some("third"));
    let transitions = Api::<Lease>::namespaced(client.clone(), "default")
        .get("netclaim-controller")
        .await
        .unwrap()
        .spec
        .unwrap()
        .lease_transitions;
    assert_eq!(transitions, Some(2));
    third.stop.send_replace(true);
}

/// The `Conflict` condition: (status, reason, message) when present.
fn conflict(network: &PodNetwork) -> Option<(String, String, String)> {
    let condition = network.status.as_ref()?.conditions.iter().find(|c| c.type_ == "Conflict")?;
    Some((condition.status.clone(), condition.reason.clone(), condition.message.clone()))
}

/// Live objects that contradict a network's spec, as an old API server or `kubectl replace`
/// lets through (the in-memory server runs no admission policy, so a hostile block gets in):
/// the controller names them in a `Conflict` condition, leaves `Ready` alone, clears it once
/// resolved, and counts blocks, reservations and addresses per node in `status.nodes`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_objects_contradicting_the_spec_raise_conflict_and_status_counts_each_node() {
    let cluster = Cluster::start().await;
    let client = cluster.client.clone();
    cluster
        .create_network(
            "editnet",
            json!({"parents": ["eth1"], "ipam": {
                "subnets": ["10.70.0.0/16"],
                "exclude": ["10.70.0.0/24"],
                "staticRanges": ["10.70.1.0/24"],
            }}),
        )
        .await;
    cluster.create_block("editnet", "10.70.2.0/26", "node-a", None).await;
    cluster.create_block("editnet", "10.70.2.64/26", "node-b", None).await;
    let holder = allocated_claim(&client, "holder", "node-a").await;
    cluster.create_block("editnet", "10.70.1.5/32", "node-b", Some(claim_ref(&holder))).await;
    // The claim on node-a holds two addresses of the network (its device status names it).
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    claims
        .patch_status(
            "holder",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"devices": [{
                "driver": DRIVER, "pool": "node-a", "device": "eth1",
                "data": {"podNetwork": {"name": "editnet", "blocks": ["10.70.2.0/26"]}},
                "networkData": {"interfaceName": "net1", "ips": ["10.70.2.1/16", "10.70.2.2/16"]}
            }]}})),
        )
        .await
        .unwrap();

    let config = ControllerConfig {
        gc_interval: Duration::from_millis(100),
        ..ControllerConfig::new(DRIVER)
    };
    let (_metrics, running) = cluster.spawn_controller(config);
    let counted = cluster
        .wait_network("editnet", "per-node counts", |n| {
            n.status.as_ref().is_some_and(|s| s.nodes.len() == 2) && reason_is(n, "Ready")
        })
        .await;
    let nodes: Vec<(String, u32, u32, u32)> = counted
        .status
        .unwrap()
        .nodes
        .into_iter()
        .map(|n| (n.node_name, n.blocks, n.reservations, n.addresses))
        .collect();
    assert_eq!(nodes, [("node-a".into(), 1, 0, 2), ("node-b".into(), 1, 1, 0)]);
    assert_eq!(conflict(&cluster.networks().get("editnet").await.unwrap()), None);

    // A block over node-a's under a name no node derives, and an exclude added over an
    // address a pod holds.
    cluster.create_block("editnet", "10.70.2.0/25", "node-c", None).await;
    cluster
        .networks()
        .patch(
            "editnet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ipam": {"exclude": ["10.70.0.0/24", "10.70.2.2/32"]}}})),
        )
        .await
        .unwrap();
    let conflicted = cluster
        .wait_network("editnet", "Conflict", |n| {
            conflict(n).is_some_and(|(status, _, message)| {
                status == "True" && message.contains("10.70.2.2/32") && message.contains("node-c")
            })
        })
        .await;
    let (_, reason, message) = conflict(&conflicted).unwrap();
    assert_eq!(reason, "Conflict");
    assert!(
        message.contains(
            "(10.70.2.0/25, node node-c) overlaps IPBlock editnet.v4-10-70-2-0-26 (10.70.2.0/26, \
             node node-a)"
        ),
        "{message}"
    );
    assert!(
        message.contains("address 10.70.2.2 of claim default/holder on node node-a lies in spec.ipam.exclude entry 10.70.2.2/32"),
        "{message}"
    );
    assert_eq!(ready(&conflicted).unwrap().0, "True", "Ready is left as it is");
    let nodes = &conflicted.status.as_ref().unwrap().nodes;
    assert_eq!(nodes.len(), 3, "{nodes:?}");

    // Resolved: the odd block deleted, the exclude edit undone.
    let odd = cluster
        .blocks()
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|b| b.spec.node_name == "node-c")
        .unwrap();
    cluster.blocks().delete(&odd.metadata.name.unwrap(), &DeleteParams::default()).await.unwrap();
    cluster
        .networks()
        .patch(
            "editnet",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ipam": {"exclude": ["10.70.0.0/24"]}}})),
        )
        .await
        .unwrap();
    let resolved = cluster
        .wait_network("editnet", "Conflict resolved", |n| {
            conflict(n).is_some_and(|(status, _, _)| status == "False")
        })
        .await;
    assert_eq!(conflict(&resolved).unwrap().1, "Resolved");
    assert_eq!(resolved.status.as_ref().unwrap().nodes.len(), 2);
    running.stop().await;
}
