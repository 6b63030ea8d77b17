//! `netclaim dev --demo` (DESIGN §8): a shared parent (a veth it creates), a DeviceClass, a
//! ResourceClaimTemplate (macvlan bridge, node-local pool) and 15 pods on the dev cluster;
//! waits until every pod is Running and Ready with a NetworkReady claim, pings between two
//! pods' interfaces and to the parent's peer, reports, and removes everything again.
//!
//! Pings run the `ping` binary from a thread that entered the pod's netns (the child inherits
//! the thread's namespace); the no-exec rule is for the attach path, not for the demo.

pub mod nodes;
pub mod report;

pub use self::nodes::{NodesDemoOptions, run_nodes};

use std::io::{IsTerminal as _, Write as _};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use self::report::{Cleanup, DemoReport, PingResult, PodRow, TrafficRow};
use super::cluster::{Cluster, ClusterOptions};
use super::kubelet::pod_claims;
use crate::dev::kernel::demo_network::{self as topology, Topology, TopologyNames};

/// The demo's address pool and the peer's address in it (outside the pool's range);
/// `netclaim dev --help` names the subnet (a test checks).
pub const SUBNET: &str = "10.10.1.0/24";
const PEER_ADDRESS: &str = "10.10.1.254/24";
const RANGE_START: &str = "10.10.1.10";
const RANGE_END: &str = "10.10.1.200";
const CLASS: &str = "netclaim-demo";
const TEMPLATE: &str = "netclaim-demo-macvlan";
const NAMESPACE: &str = "default";
const APP_LABEL: &str = "netclaim-demo";
/// Width of the progress bar.
const BAR_WIDTH: usize = 30;

/// How the demo reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoOutput {
    /// Phase lines and a progress bar on stderr, table and claim status on stdout.
    Human,
    /// One JSON document on stdout.
    Json,
    /// The same document as YAML on stdout.
    Yaml,
}

/// Settings of the demo.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// The cluster; the demo sets the node daemon's device selection to its parent.
    pub cluster: ClusterOptions,
    /// How many pods.
    pub pods: usize,
    /// Container image of the pods (pulled by nobody: containerd must have it).
    pub image: String,
    /// Most time for the pods to come up.
    pub ready_timeout: Duration,
    /// Output format.
    pub output: DemoOutput,
}

/// Reports progress to people (stderr) unless the output is JSON.
struct Progress {
    human: bool,
    terminal: bool,
    started: Instant,
    /// A bar is on the current line (ended before the next phase line).
    drawing: std::cell::Cell<bool>,
}

impl Progress {
    fn phase(&self, text: &str) {
        self.end_bar();
        if self.human {
            eprintln!("[{:>5.1}s] {text}", self.started.elapsed().as_secs_f64());
        }
    }

    fn bar(&self, done: usize, total: usize, waiting: &str) {
        if !(self.human && self.terminal) {
            return;
        }
        let filled = (done * BAR_WIDTH).checked_div(total).unwrap_or(BAR_WIDTH).min(BAR_WIDTH);
        let bar: String = "#".repeat(filled) + &".".repeat(BAR_WIDTH - filled);
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K  pods ready [{bar}] {done}/{total} {waiting}");
        let _ = err.flush();
        self.drawing.set(true);
    }

    fn end_bar(&self) {
        if self.drawing.replace(false) {
            eprintln!();
        }
    }
}

/// Runs the demo until done or `interrupted` completes (then it cleans up and fails). Prints
/// the result; returns the report (`success` decides the exit code).
///
/// # Panics
///
/// Never: the only `expect` parses a constant CIDR.
pub async fn run(options: DemoOptions, interrupted: impl Future<Output = ()>) -> DemoReport {
    let started = Instant::now();
    let progress = Progress {
        human: options.output == DemoOutput::Human,
        terminal: std::io::stderr().is_terminal(),
        started,
        drawing: std::cell::Cell::new(false),
    };
    let tag = &uuid::Uuid::new_v4().simple().to_string()[..6];
    let names = TopologyNames::new(tag);
    let subnet: IpNetwork = SUBNET.parse().expect("SUBNET is a valid CIDR literal");
    let mut report = DemoReport {
        mode: if options.cluster.containerd.is_some() { "containerd" } else { "bare-netns" }
            .to_owned(),
        node: options.cluster.node_name.clone(),
        parent: names.parent.clone(),
        peer: names.peer.clone(),
        peer_address: PEER_ADDRESS.to_owned(),
        subnet: SUBNET.to_owned(),
        ..DemoReport::default()
    };
    let demo_dir = options
        .cluster
        .run_parent
        .clone()
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("netclaim-demo-{}-{tag}", std::process::id()));
    let mut state = DemoState { topology: None, starting: None, cluster: None };
    tokio::pin!(interrupted);
    let steps = steps(&options, &names, &demo_dir, &progress, &mut report, &mut state);
    let outcome = tokio::select! {
        result = steps => result,
        () = &mut interrupted => Err("interrupted; cleaning up".to_owned()),
    };
    progress.end_bar();
    if let Err(err) = outcome {
        progress.phase(&format!("error: {err}"));
        report.errors.push(err);
    }
    let cleanup_started = Instant::now();
    progress.phase("cleaning up: pods, claims, sandboxes, links, namespaces, state");
    report.cleanup = cleanup(state, &names, &demo_dir).await;
    report.timings.cleanup_seconds = cleanup_started.elapsed().as_secs_f64();
    if !report.cleanup.ok {
        report.errors.push(format!(
            "the host is not clean: links {:?}, paths {:?}",
            report.cleanup.leftover_links, report.cleanup.leftover_paths
        ));
    }
    report.timings.wall_seconds = started.elapsed().as_secs_f64();
    report.peak_rss_kib = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| report::peak_rss_kib(&status));
    if report.errors.is_empty() {
        report.errors = report::check(&report, options.pods, subnet);
    }
    report.success = report.errors.is_empty();
    print(&report, options.output, &progress);
    report
}

/// What must be cleaned up.
struct DemoState {
    topology: Option<Topology>,
    /// The cluster's start runs as a task of its own, so an interrupt during start does not
    /// drop it half-way: cleanup waits for it and stops what it started.
    starting: Option<tokio::task::JoinHandle<Result<Cluster, super::cluster::ClusterError>>>,
    cluster: Option<Cluster>,
}

async fn steps(
    options: &DemoOptions,
    names: &TopologyNames,
    demo_dir: &Path,
    progress: &Progress,
    report: &mut DemoReport,
    state: &mut DemoState,
) -> Result<(), String> {
    let peer: IpNetwork = PEER_ADDRESS.parse().expect("PEER_ADDRESS is a valid CIDR literal");
    let topology = Topology::create(demo_dir, names.clone(), peer)
        .await
        .map_err(|e| format!("creating the shared parent: {e}"))?;
    progress.phase(&format!(
        "created shared parent {} (veth; peer {} with {PEER_ADDRESS} in its own netns)",
        names.parent, names.peer
    ));
    let peer_ip = topology.peer_ip();
    state.topology = Some(topology);

    let mut cluster_options = options.cluster.clone();
    cluster_options.selection = crate::inventory::Selection::new(
        std::slice::from_ref(&names.parent),
        &[],
        std::slice::from_ref(&names.parent),
        crate::inventory::SharingMode::Capacity,
    )
    .map_err(|e| format!("device selection: {e}"))?;
    let cluster_started = Instant::now();
    let starting = state.starting.insert(tokio::spawn(Cluster::start(cluster_options)));
    let started = starting.await;
    state.starting = None;
    let cluster = started
        .map_err(|e| format!("starting the cluster: the task failed: {e}"))?
        .map_err(|e| format!("starting the cluster: {e}"))?;
    report.timings.cluster_start_seconds = cluster_started.elapsed().as_secs_f64();
    progress.phase(&format!(
        "cluster up: API server {}, node daemon, allocator and dev kubelet on node {} (kubeconfig {})",
        cluster.url,
        cluster.node_name,
        cluster.kubeconfig.display()
    ));
    let client = cluster.client.clone();
    let sandboxes = cluster.sandboxes().clone();
    state.cluster = Some(cluster);

    wait_for_device(&client, &names.parent).await?;
    progress.phase(&format!("ResourceSlice published with shared device {}", names.parent));

    create_objects(&client, options, names).await?;
    progress.phase(&format!(
        "created DeviceClass {CLASS}, ResourceClaimTemplate {TEMPLATE} (macvlan bridge on {}, pool {SUBNET}) and {} pods",
        names.parent, options.pods
    ));

    let ready_started = Instant::now();
    let netns_of = |uid: &str| sandboxes.get(uid).and_then(|s| s.netns_path);
    let expect = Expect {
        pods: options.pods,
        ready_timeout: options.ready_timeout,
        driver: &options.cluster.driver_name,
    };
    let rows = wait_for_pods(&client, &netns_of, &expect, progress).await?;
    report.timings.pods_ready_seconds = ready_started.elapsed().as_secs_f64();
    progress.end_bar();
    progress.phase(&format!(
        "all {} pods Running and Ready, claims NetworkReady ({:.1}s)",
        rows.len(),
        report.timings.pods_ready_seconds
    ));
    report.pods = rows;

    report.pings = pings(&report.pods, peer_ip).await;
    let answered = report.pings.iter().filter(|p| p.ok).count();
    progress.phase(&format!("pings: {answered}/{} answered", report.pings.len()));
    if let Some(interval) = options.cluster.stats_interval {
        let started = Instant::now();
        report.traffic = traffic(&client, &report.pods, &report.pings, interval).await?;
        progress.phase(&format!(
            "traffic counters of {} pods in their claim status ({:.1}s)",
            report.traffic.len(),
            started.elapsed().as_secs_f64()
        ));
    }
    // Read last, so it shows the counters too.
    report.claim_status = first_claim_status(&client, report).await;
    Ok(())
}

/// Waits until every pod's claim status carries counters and every pod that pinged shows
/// its echo requests sent (`txPackets` ≥ 3), at most three stats intervals and 10 s; returns
/// one row per pod.
async fn traffic(
    client: &Client,
    rows: &[PodRow],
    pings: &[PingResult],
    interval: Duration,
) -> Result<Vec<TrafficRow>, String> {
    let limit = interval * 3 + Duration::from_secs(10);
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let claims = claims_by_name(client).await?;
        let traffic: Vec<TrafficRow> = rows
            .iter()
            .filter_map(|row| {
                let claim =
                    claims.iter().find(|c| c.metadata.name.as_deref() == Some(&row.claim))?;
                TrafficRow::from_status(row, claim)
            })
            .collect();
        let pinged = |pod: &str| pings.iter().any(|p| p.ok && p.from == pod);
        let complete = traffic.len() == rows.len()
            && traffic.iter().all(|t| !pinged(&t.pod) || t.tx_packets >= 3);
        if complete {
            return Ok(traffic);
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "traffic counters: {} of {} claims show them after {limit:?}, the pinging pods' \
                 echo requests not all counted",
                traffic.len(),
                rows.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the node daemon published `device` (so the allocator can use it).
async fn wait_for_device(client: &Client, device: &str) -> Result<(), String> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = slices
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing ResourceSlices: {e}"))?;
        let found = list
            .items
            .iter()
            .any(|slice| slice.spec.devices.iter().flatten().any(|d| d.name == device));
        if found {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the node daemon published no device {device} within 30s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pod_name(index: usize) -> String {
    format!("demo-{:02}", index + 1)
}

async fn create_objects(
    client: &Client,
    options: &DemoOptions,
    names: &TopologyNames,
) -> Result<(), String> {
    let driver = &options.cluster.driver_name;
    // The attributes are in the `netclaim.dev` domain under any `--driver-name` (decision
    // 0023), so the selector names that domain, not the driver.
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": CLASS},
        // A PodNetwork's device on the same parent carries its ifName too: it serves only
        // that network's claims, so a generic class leaves out devices with podNetwork.
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.driver == \"{driver}\" && device.attributes[\"{domain}\"].ifName == \"{}\" \
             && !(\"{}\" in device.attributes[\"{domain}\"])",
            names.parent,
            crate::model::names::attr::POD_NETWORK,
            domain = crate::model::names::ATTRIBUTE_DOMAIN,
        )}}]},
    }))
    .map_err(|e| format!("building the DeviceClass: {e}"))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .map_err(|e| format!("creating DeviceClass {CLASS}: {e}"))?;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "net", "exactly": {"deviceClassName": CLASS}}],
            "config": [{"opaque": {"driver": driver, "parameters": {
                "apiVersion": "netclaim.dev/v1alpha1",
                "kind": "NetworkConfig",
                "mode": "macvlan",
                "macvlan": {"mode": "bridge"},
                "interface": {"name": "net1"},
                "ipam": {"pool": {"subnet": SUBNET, "rangeStart": RANGE_START, "rangeEnd": RANGE_END}},
            }}}],
        }}},
    }))
    .map_err(|e| format!("building the ResourceClaimTemplate: {e}"))?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &template)
        .await
        .map_err(|e| format!("creating ResourceClaimTemplate {TEMPLATE}: {e}"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for index in 0..options.pods {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name(index), "namespace": NAMESPACE, "labels": {"app": APP_LABEL}},
            "spec": {
                "nodeName": options.cluster.node_name,
                "containers": [{"name": "app", "image": options.image}],
                "resourceClaims": [{"name": "net", "resourceClaimTemplateName": TEMPLATE}],
            },
        }))
        .map_err(|e| format!("building a pod: {e}"))?;
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| format!("creating pod {}: {e}", pod_name(index)))?;
    }
    Ok(())
}

/// The claims of the demo pods, by claim name.
async fn claims_by_name(client: &Client) -> Result<Vec<ResourceClaim>, String> {
    Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| format!("listing claims: {e}"))
}

async fn demo_pods(client: &Client) -> Result<Vec<Pod>, String> {
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&format!("app={APP_LABEL}")))
        .await
        .map(|l| l.items)
        .map_err(|e| format!("listing pods: {e}"))
}

/// The pod's claim for its `net` entry: the one named in its spec, else the one generated
/// from the template and recorded in its status.
fn net_claim_name(pod: &Pod) -> Option<String> {
    let named = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .find(|e| e.name == "net")
        .and_then(|e| e.resource_claim_name.clone());
    named.or_else(|| pod_claims::recorded_claim_name(pod, "net"))
}

/// Where a pod's sandbox is (its netns), by Pod UID.
type NetnsOf<'a> = &'a dyn Fn(&str) -> Option<PathBuf>;

fn rows_of(
    pods: &[Pod],
    claims: &[ResourceClaim],
    driver: &str,
    netns_of: NetnsOf<'_>,
) -> Vec<PodRow> {
    let mut rows: Vec<PodRow> = pods
        .iter()
        .map(|pod| {
            let claim_name = net_claim_name(pod);
            let claim = claim_name
                .as_deref()
                .and_then(|name| claims.iter().find(|c| c.metadata.name.as_deref() == Some(name)));
            let mut row = report::pod_row(pod, claim, driver);
            row.netns =
                pod.metadata.uid.as_deref().and_then(netns_of).map(|p| p.display().to_string());
            row
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// What [`wait_for_pods`] waits for.
struct Expect<'a> {
    /// How many pods.
    pods: usize,
    /// For how long at most.
    ready_timeout: Duration,
    /// Whose device status counts.
    driver: &'a str,
}

/// Waits until every demo pod is Running and Ready and its claim NetworkReady; fails early
/// when a pod is Failed.
async fn wait_for_pods(
    client: &Client,
    netns_of: NetnsOf<'_>,
    options: &Expect<'_>,
    progress: &Progress,
) -> Result<Vec<PodRow>, String> {
    let deadline = Instant::now() + options.ready_timeout;
    let driver = options.driver;
    loop {
        let pods = demo_pods(client).await?;
        let claims = claims_by_name(client).await?;
        let rows = rows_of(&pods, &claims, driver, netns_of);
        if let Some(failed) = pods
            .iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed"))
        {
            let message =
                failed.status.as_ref().and_then(|s| s.message.clone()).unwrap_or_default();
            return Err(format!(
                "pod {} failed: {message}",
                failed.metadata.name.as_deref().unwrap_or_default()
            ));
        }
        let done = rows.iter().filter(|r| r.ready && r.network_ready).count();
        let waiting = pods
            .iter()
            .find(|p| !pod_claims_ready(p, &rows))
            .and_then(pending_message)
            .unwrap_or_default();
        progress.bar(done, options.pods, &waiting);
        if done == options.pods && rows.len() == options.pods {
            return Ok(rows);
        }
        if Instant::now() > deadline {
            let stuck: Vec<String> = rows
                .iter()
                .filter(|r| !(r.ready && r.network_ready))
                .map(|r| {
                    let pod = pods.iter().find(|p| p.metadata.name.as_deref() == Some(&r.name));
                    let why = if r.ready {
                        format!("claim {:?} has no NetworkReady device status", r.claim)
                    } else {
                        pod.and_then(pending_message).unwrap_or_default()
                    };
                    format!(
                        "{} (phase {}, ready {}, networkReady {}: {why})",
                        r.name, r.phase, r.ready, r.network_ready
                    )
                })
                .collect();
            return Err(format!(
                "{done}/{} pods ready after {:?}; not ready: {}",
                options.pods,
                options.ready_timeout,
                stuck.join("; ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn pod_claims_ready(pod: &Pod, rows: &[PodRow]) -> bool {
    rows.iter().any(|r| {
        Some(r.name.as_str()) == pod.metadata.name.as_deref() && r.ready && r.network_ready
    })
}

/// The message of the pod's Ready condition (what it waits for).
fn pending_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status != "True")
        .and_then(|c| c.message.clone())
}

async fn first_claim_status(client: &Client, report: &DemoReport) -> Option<serde_json::Value> {
    let name = &report.pods.first()?.claim;
    let claim = Api::<ResourceClaim>::namespaced(client.clone(), NAMESPACE).get(name).await.ok()?;
    Some(json!({
        "claim": name,
        "devices": claim.status.and_then(|s| s.devices),
    }))
}

/// A row's first address, without prefix.
fn first_address(row: &PodRow) -> Option<IpAddr> {
    row.addresses.first().and_then(|a| a.parse::<IpNetwork>().ok()).map(|n| n.ip())
}

/// First pod → second pod, second → first, first → the parent's peer.
async fn pings(rows: &[PodRow], peer: IpAddr) -> Vec<PingResult> {
    let mut plan: Vec<(usize, String, Option<IpAddr>)> = Vec::new();
    if rows.len() >= 2 {
        plan.push((0, rows[1].name.clone(), first_address(&rows[1])));
        plan.push((1, rows[0].name.clone(), first_address(&rows[0])));
    }
    if !rows.is_empty() {
        plan.push((0, "peer".to_owned(), Some(peer)));
    }
    run_pings(rows, plan).await
}

/// Runs each `(source row, target name, target address)` of `plan` at once.
async fn run_pings(rows: &[PodRow], plan: Vec<(usize, String, Option<IpAddr>)>) -> Vec<PingResult> {
    // The pings are independent: run them at once (each takes ~0.4 s).
    let runs = plan.into_iter().map(|(from, to, address)| {
        let source = &rows[from];
        async move {
            let (ok, detail, address) = match (address, &source.netns) {
                (Some(address), Some(netns)) => {
                    let netns = PathBuf::from(netns);
                    match tokio::task::spawn_blocking(move || ping_from(&netns, address)).await {
                        Ok(Ok(summary)) => (true, summary, address.to_string()),
                        Ok(Err(why)) => (false, why, address.to_string()),
                        Err(err) => {
                            (false, format!("ping task failed: {err}"), address.to_string())
                        }
                    }
                }
                (None, _) => (false, format!("{to} has no address"), String::new()),
                (_, None) => (false, format!("{} has no known netns", source.name), String::new()),
            };
            PingResult { from: source.name.clone(), to, address, ok, detail }
        }
    });
    futures::future::join_all(runs).await
}

/// Runs `ping -c 3 -i 0.2 -W 2 <address>` from a thread inside `netns`; Ok(summary line) when
/// replies came back.
fn ping_from(netns: &Path, address: IpAddr) -> Result<String, String> {
    crate::host::netns::run_in(netns, move || {
        // The child inherits this thread's network namespace.
        let output = std::process::Command::new("ping")
            .args(["-c", "3", "-i", "0.2", "-W", "2", &address.to_string()])
            .output()
            .map_err(|e| format!("running ping: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let summary = stdout
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .unwrap_or_default()
            .to_owned();
        if output.status.success() {
            Ok(summary)
        } else {
            Err(format!("{summary} {}", String::from_utf8_lossy(&output.stderr).trim()))
        }
    })
    .map_err(|e| e.to_string())?
}

/// Deletes the demo's objects (pods first, waiting until the kubelet tore them down), stops
/// the cluster, removes the links and namespaces, and checks the host is clean.
async fn cleanup(mut state: DemoState, names: &TopologyNames, demo_dir: &Path) -> Cleanup {
    let mut run_dir = None;
    if let Some(starting) = state.starting.take()
        && let Ok(Ok(cluster)) = starting.await
    {
        state.cluster = Some(cluster);
    }
    if let Some(cluster) = state.cluster {
        let client = cluster.client.clone();
        run_dir = Some(cluster.run_dir.clone());
        delete_demo_objects(&client).await;
        cluster.stop().await;
    }
    if let Some(topology) = state.topology {
        topology.remove().await;
    }
    // An interrupt during the topology's creation leaves no handle: remove by name (the
    // names are generated for this run, so they are ours).
    topology::remove_links_with_prefix(names.prefix()).await;
    let peer_netns = demo_dir.join("peer");
    if let Err(err) = crate::host::netns::remove(&peer_netns) {
        tracing::warn!(%err, "removing the demo's peer netns");
    }
    let _ignored = std::fs::remove_dir_all(demo_dir);
    let leftover_links = topology::links_with_prefix(names.prefix())
        .await
        .unwrap_or_else(|e| vec![format!("(could not list links: {e})")]);
    let leftover_paths: Vec<String> = [Some(demo_dir.to_owned()), run_dir]
        .into_iter()
        .flatten()
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    Cleanup {
        ok: leftover_links.is_empty() && leftover_paths.is_empty(),
        leftover_links,
        leftover_paths,
    }
}

async fn delete_demo_objects(client: &Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let params = DeleteParams::default();
    if let Ok(list) = demo_pods(client).await {
        for pod in list {
            let name = pod.metadata.name.unwrap_or_default();
            if let Err(err) = pods.delete(&name, &params).await {
                tracing::warn!(pod = %name, %err, "deleting a demo pod");
            }
        }
    }
    // The kubelet tears each pod down, then removes it.
    let deadline = Instant::now() + Duration::from_mins(1);
    while Instant::now() < deadline {
        match demo_pods(client).await {
            Ok(list) if list.is_empty() => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => break,
        }
    }
    let _ignored = Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE)
        .delete(TEMPLATE, &params)
        .await;
    let _ignored = Api::<DeviceClass>::all(client.clone()).delete(CLASS, &params).await;
}

fn print(report: &DemoReport, output: DemoOutput, progress: &Progress) {
    let mut out = std::io::stdout().lock();
    match output {
        DemoOutput::Json => {
            let text = serde_json::to_string_pretty(report).unwrap_or_else(|e| {
                format!("{{\"success\": false, \"errors\": [\"serializing the report: {e}\"]}}")
            });
            let _ = writeln!(out, "{text}");
        }
        DemoOutput::Yaml => {
            // A JSON string is a YAML scalar, whatever the message holds.
            let text = yaml_serde::to_string(report).unwrap_or_else(|e| {
                let message = serde_json::Value::from(format!("serializing the report: {e}"));
                format!("success: false\nerrors:\n- {message}\n")
            });
            let _ = write!(out, "{text}");
        }
        DemoOutput::Human => {
            if !report.pods.is_empty() {
                let _ = writeln!(out, "\n{}", report::render_table(&report.pods));
            }
            for ping in &report.pings {
                let verdict = if ping.ok { "ok" } else { "FAILED" };
                let _ = writeln!(
                    out,
                    "ping {} -> {} ({}): {verdict} {}",
                    ping.from, ping.to, ping.address, ping.detail
                );
            }
            if !report.traffic.is_empty() {
                let _ = writeln!(
                    out,
                    "\ntraffic counters (eBPF, from each claim's status.devices[].data.stats):\n{}",
                    report::render_traffic(&report.traffic)
                );
            }
            if let Some(status) = &report.claim_status {
                let yaml = yaml_serde::to_string(status).unwrap_or_default();
                let _ = writeln!(out, "\nstatus.devices of one claim:\n{yaml}");
            }
            let _ = out.flush();
            progress.phase(&format!(
                "{}: wall {:.1}s (cluster {:.1}s, pods ready {:.1}s, cleanup {:.1}s), peak RSS {} KiB, host clean: {}",
                if report.success { "demo succeeded" } else { "demo FAILED" },
                report.timings.wall_seconds,
                report.timings.cluster_start_seconds,
                report.timings.pods_ready_seconds,
                report.timings.cleanup_seconds,
                report.peak_rss_kib.map_or_else(|| "?".to_owned(), |k| k.to_string()),
                report.cleanup.ok,
            ));
            for error in &report.errors {
                progress.phase(&format!("error: {error}"));
            }
        }
    }
}
