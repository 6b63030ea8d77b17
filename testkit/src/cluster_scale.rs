//! Many pods on `netclaim dev --nodes N` (issue 36 item 5, DESIGN §10): the harness of
//! `benches/cluster_scale.rs`. It starts the same in-process cluster `netclaim dev --nodes`
//! runs ([`NodesCluster`]: one API server, allocator and PodNetwork controller, per node a
//! netns, a dev kubelet and the node daemon as a child process of its own), creates one
//! macvlan PodNetwork (cluster IPAM, blocks) and then the pods, each with a claim from one
//! ResourceClaimTemplate, and measures:
//!
//! - the time from the first pod's creation to each pod's `PodReadyToStartContainers` and
//!   `Ready`, as the harness's own watch sees them (the dev kubelet sets both in one status
//!   write for a bare sandbox, so they arrive together);
//! - the API requests of the run, per pod, by caller (each daemon authenticates as its node
//!   through a token of its own, the in-process dev components as the admin, the harness as
//!   `bench`), verb and resource, from the API server's request log;
//! - peak memory: each daemon's `VmHWM` (its own process), the dev process's (API server,
//!   allocator, controller, every dev kubelet and NRI endpoint, and this harness), and the
//!   peak of their summed `VmRSS` sampled every 100 ms (the whole cluster at once);
//! - the IPBlocks each node holds, and that no address was handed out twice.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use kube_inmemory::apiserver::ServerOptions;
use kube_inmemory::apiserver::request_log::{RequestLog, RequestRecord};
use netclaim::dev::kernel::nodes::UPLINK;
use netclaim::dev::nodes::{DaemonSelection, NodesCluster, NodesOptions};
use netclaim::model::pod_network::{CONDITION_READY, IpBlock, LABEL_POD_NETWORK, PodNetwork};
use serde_json::json;

/// The PodNetwork of the run.
pub const NETWORK: &str = "scale-net";
/// The namespace of the pods.
const NAMESPACE: &str = "default";
/// The claim template every pod uses.
const TEMPLATE: &str = "scale-macvlan";
/// The user the harness's own requests authenticate as.
pub const BENCH_USER: &str = "bench";
/// Pod creations in flight at once (a Deployment controller's burst is of this order).
const CREATE_IN_FLIGHT: usize = 32;

/// The addresses of the network.
#[derive(Debug, Clone)]
pub struct Addressing {
    /// `spec.ipam.subnets[0]`.
    pub subnet: String,
    /// `spec.ipam.gateways`.
    pub gateways: Vec<String>,
    /// `spec.ipam.exclude`.
    pub exclude: Vec<String>,
    /// `spec.ipam.blockSize.ipv4`.
    pub block_prefix: u8,
}

impl Addressing {
    /// A /16 in /26 blocks: far more addresses than pods.
    pub fn plenty() -> Self {
        Self {
            subnet: "10.20.0.0/16".to_owned(),
            gateways: vec!["10.20.0.1".to_owned()],
            exclude: Vec::new(),
            block_prefix: 26,
        }
    }

    /// A /22 (the nearest to 1,001) in /26 blocks whose excludes leave exactly the gateway
    /// and 1,000 addresses a pod may get: 1,024 less the network and broadcast addresses,
    /// 21 excluded (10.20.3.234 to .254) and the gateway.
    pub fn as_many_as_pods() -> Self {
        let exclude = ["234/31", "236/30", "240/29", "248/30", "252/31", "254/32"];
        Self {
            subnet: "10.20.0.0/22".to_owned(),
            gateways: vec!["10.20.0.1".to_owned()],
            exclude: exclude.iter().map(|tail| format!("10.20.3.{tail}")).collect(),
            block_prefix: 26,
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    pub nodes: usize,
    pub pods: usize,
    /// The `netclaim` binary the node daemons run.
    pub daemon_program: PathBuf,
    pub addressing: Addressing,
    /// Most time from the first creation until every pod is Ready or Failed.
    pub ready_limit: Duration,
}

/// When one pod got where.
#[derive(Debug, Clone, Default)]
struct PodTimes {
    sandbox_ready: Option<Duration>,
    ready: Option<Duration>,
    failed: bool,
    node: Option<String>,
    reason: Option<String>,
}

/// A count of requests.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RequestKey {
    /// `daemons`, `dev` (allocator, controller, dev kubelets) or `bench`.
    pub caller: &'static str,
    pub verb: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
}

/// The outcome of a run.
#[derive(Debug, Clone, Default)]
pub struct ScaleReport {
    pub nodes: usize,
    pub pods: usize,
    pub cluster_start: Duration,
    pub network_ready: Duration,
    /// From the first creation until the last creation was answered.
    pub all_created: Duration,
    /// From the first creation until every pod's `PodReadyToStartContainers` (None when
    /// some never got there).
    pub all_sandbox_ready: Option<Duration>,
    /// The same for `Ready`.
    pub all_ready: Option<Duration>,
    /// How many pods were Ready when the run ended.
    pub ready: usize,
    /// How many were Failed, and the reasons of those not Ready (reason → count).
    pub failed: usize,
    pub not_ready_reasons: BTreeMap<String, usize>,
    /// Per pod, from the first creation to its `Ready`, sorted.
    pub ready_at: Vec<Duration>,
    /// Pods per node.
    pub pods_per_node: BTreeMap<String, usize>,
    /// Requests from the first creation until all Ready (or the limit), by key.
    pub requests: BTreeMap<RequestKey, usize>,
    /// The daemons' `VmHWM` (KiB), by node.
    pub daemon_hwm_kib: BTreeMap<String, u64>,
    /// The dev process's `VmHWM` (KiB).
    pub dev_process_hwm_kib: u64,
    /// The peak of the summed `VmRSS` of the dev process and every daemon (KiB).
    pub cluster_peak_rss_kib: u64,
    /// IPBlock CIDRs by node.
    pub blocks_per_node: BTreeMap<String, Vec<String>>,
    /// Addresses in the claims' status, and those found twice.
    pub addresses: usize,
    pub duplicate_addresses: Vec<String>,
    /// How long `NodesCluster::stop` took (every pod torn down, daemons stopped, namespaces
    /// removed).
    pub stop: Duration,
}

/// `VmRSS`/`VmHWM` (KiB) of a process from its `/proc/<pid>/status`.
fn status_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Samples the summed `VmRSS` of `pids` (and this process) until stopped; returns the peak.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RssSampler {
    fn start(pids: Vec<u32>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut peak = 0;
            while !stopped.load(Ordering::Relaxed) {
                let daemons: u64 =
                    pids.iter().filter_map(|pid| status_kib(&pid.to_string(), "VmRSS:")).sum();
                peak = peak.max(daemons + status_kib("self", "VmRSS:").unwrap_or(0));
                std::thread::sleep(Duration::from_millis(100));
            }
            peak
        });
        Self { stop, thread }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Runs one scale test; the cluster is stopped (and the host cleaned) before it returns,
/// also when a step panics (the cluster's stop runs from the error path).
pub async fn run(config: &ScaleConfig) -> ScaleReport {
    let run_parent = tempfile::Builder::new().prefix("ncscale").tempdir_in("/tmp").unwrap();
    let log = RequestLog::in_memory();
    let mut server = ServerOptions {
        bearer_token: Some(token("admin")),
        request_log: Some(log.clone()),
        // Every pod, claim and status write of a 1,000-pod run stays resumable by the watches.
        watch_history: 100_000,
        watch_history_bytes: 256 * 1024 * 1024,
        ..ServerOptions::default()
    };
    let options = NodesOptions {
        count: config.nodes,
        base_name: "scale".to_owned(),
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        server: server.clone(),
        kubeconfig_out: None,
        driver_name: crate::DRIVER.to_owned(),
        selection: DaemonSelection::default(),
        run_parent: Some(run_parent.path().to_owned()),
        stats_interval: None,
        daemon_program: config.daemon_program.clone(),
        daemon_log_default: "warn".to_owned(),
        fabric_address: None,
    };
    for name in options.node_names() {
        server.user_tokens.insert(token(&name), name);
    }
    let bench_token = token(BENCH_USER);
    server.user_tokens.insert(bench_token.clone(), BENCH_USER.to_owned());
    let options = NodesOptions { server, ..options };

    let started = Instant::now();
    let cluster = NodesCluster::start(options).await.unwrap();
    let cluster_start = started.elapsed();
    let kubeconfig = run_parent.path().join("bench-kubeconfig");
    kube_inmemory::kubeconfig::write(&kubeconfig, &cluster.url, Some(&bench_token)).unwrap();
    let client = netclaim::k8s::client(Some(&kubeconfig)).await.unwrap();

    let pids: Vec<(String, u32)> = cluster
        .nodes
        .iter()
        .map(|n| (n.name.clone(), n.daemon_pid().expect("a started node runs its daemon")))
        .collect();
    let sampler = RssSampler::start(pids.iter().map(|(_, pid)| *pid).collect());
    let measured = measure(&client, &cluster, config, &log).await;
    let cluster_peak_rss_kib = sampler.finish();
    let daemon_hwm_kib = pids
        .iter()
        .filter_map(|(node, pid)| Some((node.clone(), status_kib(&pid.to_string(), "VmHWM:")?)))
        .collect();
    let stopping = Instant::now();
    cluster.stop().await;
    let stop = stopping.elapsed();
    let mut report = measured.unwrap_or_else(|err| panic!("{err}"));
    report.cluster_start = cluster_start;
    report.cluster_peak_rss_kib = cluster_peak_rss_kib;
    report.daemon_hwm_kib = daemon_hwm_kib;
    report.dev_process_hwm_kib = status_kib("self", "VmHWM:").unwrap_or(0);
    report.stop = stop;
    report
}

/// A bearer token for `user`, unique in this process (the server is on loopback and lives
/// as long as the run).
fn token(user: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let serial = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{user}-{nanos:x}-{serial}-{}", std::process::id())
}

async fn measure(
    client: &Client,
    cluster: &NodesCluster,
    config: &ScaleConfig,
    log: &RequestLog,
) -> Result<ScaleReport, String> {
    let mut report = ScaleReport { nodes: config.nodes, pods: config.pods, ..Default::default() };
    let started = Instant::now();
    let class = create_network(client, &config.addressing).await?;
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    wait_for_devices(client, &names).await?;
    report.network_ready = started.elapsed();
    create_template(client, &class).await?;

    let times: Arc<Mutex<HashMap<String, PodTimes>>> = Arc::default();
    let first_record = log.records().len();
    let t0 = Instant::now();
    let watching = tokio::spawn(watch_pods(client.clone(), t0, Arc::clone(&times)));
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    futures::stream::iter(0..config.pods)
        .map(|index| {
            let pods = pods.clone();
            async move { pods.create(&PostParams::default(), &pod(index)).await }
        })
        .buffer_unordered(CREATE_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await
        .map_err(|e| format!("creating pods: {e}"))?;
    report.all_created = t0.elapsed();

    let deadline = t0 + config.ready_limit;
    loop {
        let settled = {
            let times = times.lock().unwrap();
            times.values().filter(|t| t.ready.is_some() || t.failed).count()
        };
        if settled >= config.pods || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let records = log.records();
    watching.abort();
    report.requests = count_requests(&records[first_record..]);
    let times = times.lock().unwrap().clone();
    summarise(&mut report, &times, config.pods);
    report.blocks_per_node = blocks_per_node(client).await?;
    (report.addresses, report.duplicate_addresses) = addresses(client).await?;
    Ok(report)
}

fn summarise(report: &mut ScaleReport, times: &HashMap<String, PodTimes>, pods: usize) {
    let mut ready_at: Vec<Duration> = times.values().filter_map(|t| t.ready).collect();
    ready_at.sort();
    let mut sandbox: Vec<Duration> = times.values().filter_map(|t| t.sandbox_ready).collect();
    sandbox.sort();
    report.ready = ready_at.len();
    report.all_ready = (ready_at.len() == pods).then(|| ready_at.last().copied()).flatten();
    report.all_sandbox_ready = (sandbox.len() == pods).then(|| sandbox.last().copied()).flatten();
    report.ready_at = ready_at;
    report.failed = times.values().filter(|t| t.failed).count();
    for t in times.values().filter(|t| t.ready.is_none()) {
        let reason = t.reason.clone().unwrap_or_else(|| "no status".to_owned());
        *report.not_ready_reasons.entry(reason).or_default() += 1;
    }
    for node in times.values().filter_map(|t| t.node.clone()) {
        *report.pods_per_node.entry(node).or_default() += 1;
    }
}

/// Requests by caller, verb and resource.
pub fn count_requests(records: &[RequestRecord]) -> BTreeMap<RequestKey, usize> {
    let mut counts = BTreeMap::new();
    for record in records {
        let caller = match record.user.as_str() {
            BENCH_USER => "bench",
            kube_inmemory::apiserver::ADMIN_USER => "dev",
            _ => "daemons",
        };
        let attributes = &record.attributes;
        let resource = match (attributes.resource.as_str(), attributes.subresource.as_str()) {
            ("", _) => attributes.path.clone(),
            (resource, "") => resource.to_owned(),
            (resource, sub) => format!("{resource}/{sub}"),
        };
        let key = RequestKey { caller, verb: attributes.verb.clone(), resource };
        *counts.entry(key).or_default() += 1;
    }
    counts
}

/// Watches the pods, recording when each first showed `PodReadyToStartContainers` and
/// `Ready` (from `t0`), and whether it failed.
async fn watch_pods(client: Client, t0: Instant, times: Arc<Mutex<HashMap<String, PodTimes>>>) {
    let pods: Api<Pod> = Api::namespaced(client, NAMESPACE);
    let mut events = std::pin::pin!(watcher(pods, watcher::Config::default()));
    while let Some(event) = events.next().await {
        let pod = match event {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(err) => {
                eprintln!("pod watch: {err}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let now = t0.elapsed();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let status = pod.status.as_ref();
        let is_true = |type_: &str| {
            status
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
        };
        let reason = status.and_then(|s| s.conditions.as_ref()).and_then(|c| {
            c.iter().find(|c| c.type_ == "Ready" && c.status != "True")?.reason.clone()
        });
        let mut times = times.lock().unwrap();
        let entry = times.entry(name).or_default();
        if entry.sandbox_ready.is_none() && is_true("PodReadyToStartContainers") {
            entry.sandbox_ready = Some(now);
        }
        if entry.ready.is_none() && is_true("Ready") {
            entry.ready = Some(now);
        }
        entry.failed = status.and_then(|s| s.phase.as_deref()) == Some("Failed");
        entry.node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
        entry.reason = reason;
    }
}

fn pod(index: usize) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("scale-{index:04}"), "namespace": NAMESPACE},
        "spec": {
            "containers": [{"name": "app", "image": "localhost/netclaim/pause:1.0"}],
            "resourceClaims": [{"name": "net", "resourceClaimTemplateName": TEMPLATE}],
        },
    }))
    .unwrap()
}

async fn create_template(client: &Client, class: &str) -> Result<(), String> {
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "net", "exactly": {"deviceClassName": class}}],
            "config": [{"opaque": {"driver": crate::DRIVER, "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1",
                "kind": "NetworkConfig",
                "interface": {"name": "net1"},
            }}}],
        }}},
    }))
    .unwrap();
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &template)
        .await
        .map(drop)
        .map_err(|e| format!("creating the claim template: {e}"))
}

/// Creates the macvlan PodNetwork on every node's uplink; returns its DeviceClass once Ready.
async fn create_network(client: &Client, addressing: &Addressing) -> Result<String, String> {
    let network: PodNetwork = serde_json::from_value(json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "PodNetwork",
        "metadata": {"name": NETWORK},
        "spec": {
            "mode": "macvlan",
            "macvlan": {"mode": "bridge"},
            "parents": [UPLINK],
            "interfaceCapacity": 1024,
            "ipam": {
                "subnets": [addressing.subnet],
                "gateways": addressing.gateways,
                "exclude": addressing.exclude,
                "blockSize": {"ipv4": addressing.block_prefix},
            },
        },
    }))
    .unwrap();
    let api: Api<PodNetwork> = Api::all(client.clone());
    api.create(&PostParams::default(), &network)
        .await
        .map_err(|e| format!("creating the PodNetwork: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = api.get(NETWORK).await.map_err(|e| e.to_string())?.status.unwrap_or_default();
        let ready =
            status.conditions.iter().any(|c| c.type_ == CONDITION_READY && c.status == "True");
        if let (true, Some(class)) = (ready, status.device_class_name.clone()) {
            return Ok(class);
        }
        if Instant::now() > deadline {
            return Err(format!("PodNetwork {NETWORK} not Ready within 30 s: {status:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until every node publishes the network's device.
async fn wait_for_devices(client: &Client, nodes: &[String]) -> Result<(), String> {
    let device = netclaim::model::pod_network::shared_device_name(NETWORK, UPLINK);
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = slices.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        let published = |node: &String| {
            list.items.iter().any(|s| {
                s.spec.node_name.as_ref() == Some(node)
                    && s.spec.devices.iter().flatten().any(|d| d.name == device)
            })
        };
        if nodes.iter().all(published) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{device} not published by every node within 30 s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn blocks_per_node(client: &Client) -> Result<BTreeMap<String, Vec<String>>, String> {
    let list = Api::<IpBlock>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{LABEL_POD_NETWORK}={NETWORK}")))
        .await
        .map_err(|e| format!("listing IPBlocks: {e}"))?;
    let mut blocks: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for block in list.items {
        blocks.entry(block.spec.node_name).or_default().push(block.spec.cidr);
    }
    Ok(blocks)
}

/// The addresses in the claims' device status, and those that occur more than once.
async fn addresses(client: &Client) -> Result<(usize, Vec<String>), String> {
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("listing claims: {e}"))?;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for claim in claims.items {
        let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
        for ip in devices.into_iter().filter_map(|d| d.network_data?.ips).flatten() {
            *seen.entry(ip.split('/').next().unwrap_or_default().to_owned()).or_default() += 1;
        }
    }
    let twice = seen.iter().filter(|(_, n)| **n > 1).map(|(ip, _)| ip.clone()).collect();
    Ok((seen.len(), twice))
}
