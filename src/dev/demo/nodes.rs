//! `netclaim dev --nodes N --demo`: the demo on a cluster of several nodes, on a PodNetwork.
//! It creates PodNetwork `demo-net` on every node's uplink (macvlan bridge, subnet
//! 10.10.1.0/24 cut into /28 blocks, the bridge's own address excluded); the in-process
//! controller marks it Ready and makes its DeviceClass, each node publishes its
//! `<network>-uplink0` device, and the pods use one ResourceClaimTemplate naming that class.
//! The pods are created without `spec.nodeName`, so the allocator spreads them over the
//! nodes; each node claims IPBlocks of the network and hands out addresses inside them, so
//! addresses are unique in the cluster without a per-address API call. The demo waits until
//! every pod is Running and Ready with a NetworkReady claim, pings from the first pod of each
//! node to the first pod of the next node (across the bridge) and to the bridge's own
//! address, reports (with the IPBlocks each node owns), and removes everything.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use super::report::{Cleanup, DemoReport, PodRow};
use super::{
    APP_LABEL, DemoOutput, Expect, NAMESPACE, PEER_ADDRESS, Progress, SUBNET, TEMPLATE,
    claims_by_name, demo_pods, first_address, first_claim_status, pod_name, print, run_pings,
    traffic, wait_for_pods,
};
use crate::dev::kernel::nodes::UPLINK;
use crate::dev::nodes::{NodesCluster, NodesError, NodesOptions};
use crate::model::pod_network::{CONDITION_READY, IpBlock, LABEL_POD_NETWORK, PodNetwork, reason};

/// The demo's PodNetwork (`netclaim dev --help` names it; a test checks).
pub const NETWORK: &str = "demo-net";
/// Prefix length of its per-node blocks (16 addresses: two nodes visibly own different ones).
const BLOCK_PREFIX: u8 = 28;
/// The bridge's own address, never handed to a pod.
const BRIDGE_EXCLUDE: &str = "10.10.1.254/32";

/// Settings of the demo on several nodes.
#[derive(Debug, Clone)]
pub struct NodesDemoOptions {
    /// The cluster (the demo sets the bridge's address).
    pub nodes: NodesOptions,
    /// How many pods.
    pub pods: usize,
    /// Most time for the pods to come up.
    pub ready_timeout: Duration,
    /// Output format.
    pub output: DemoOutput,
}

/// What must be cleaned up.
struct State {
    /// The cluster's start runs as a task of its own, so an interrupt during start does not
    /// drop it half-way: cleanup waits for it and stops what it started.
    starting: Option<tokio::task::JoinHandle<Result<NodesCluster, NodesError>>>,
    cluster: Option<NodesCluster>,
}

/// Runs the demo until done or `interrupted` completes (then it cleans up and fails), or until
/// a node daemon ends on its own. Prints the result; returns the report.
///
/// # Panics
///
/// Never: the only `expect`s parse constant CIDRs.
pub async fn run_nodes(
    mut options: NodesDemoOptions,
    interrupted: impl Future<Output = ()>,
) -> DemoReport {
    use std::io::IsTerminal as _;
    let started = Instant::now();
    let progress = Progress {
        human: options.output == DemoOutput::Human,
        terminal: std::io::stderr().is_terminal(),
        started,
        drawing: std::cell::Cell::new(false),
    };
    let subnet: IpNetwork = SUBNET.parse().expect("SUBNET is a valid CIDR literal");
    let peer: IpNetwork = PEER_ADDRESS.parse().expect("PEER_ADDRESS is a valid CIDR literal");
    options.nodes.fabric_address = Some(peer);
    let mut report = DemoReport {
        mode: "bare-netns".to_owned(),
        node: options.nodes.node_names().join(","),
        parent: UPLINK.to_owned(),
        peer: "the nodes' bridge".to_owned(),
        peer_address: PEER_ADDRESS.to_owned(),
        subnet: SUBNET.to_owned(),
        ..DemoReport::default()
    };
    let mut state = State { starting: None, cluster: None };
    tokio::pin!(interrupted);
    let outcome = {
        let steps = steps(&options, &progress, &mut report, &mut state);
        tokio::pin!(steps);
        tokio::select! {
            result = &mut steps => result,
            () = &mut interrupted => Err("interrupted; cleaning up".to_owned()),
        }
    };
    progress.end_bar();
    if let Err(err) = outcome {
        progress.phase(&format!("error: {err}"));
        report.errors.push(err);
    }
    let cleanup_started = Instant::now();
    progress.phase("cleaning up: pods, claims, sandboxes, daemons, namespaces, bridge, state");
    report.cleanup = cleanup(state).await;
    report.timings.cleanup_seconds = cleanup_started.elapsed().as_secs_f64();
    if !report.cleanup.ok {
        report
            .errors
            .push(format!("the host is not clean: paths {:?}", report.cleanup.leftover_paths));
    }
    report.timings.wall_seconds = started.elapsed().as_secs_f64();
    report.peak_rss_kib = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| super::report::peak_rss_kib(&status));
    if report.errors.is_empty() {
        report.errors = super::report::check(&report, options.pods, subnet);
        report.errors.extend(spread_problems(&report.pods, options.nodes.count));
    }
    report.success = report.errors.is_empty();
    print(&report, options.output, &progress);
    report
}

/// With at least as many pods as nodes, every node must run one.
fn spread_problems(rows: &[PodRow], nodes: usize) -> Vec<String> {
    let used: std::collections::BTreeSet<&str> =
        rows.iter().filter_map(|r| r.node.as_deref()).collect();
    if rows.len() >= nodes && used.len() < nodes {
        vec![format!("the pods run on {} of {nodes} nodes: {used:?}", used.len())]
    } else {
        Vec::new()
    }
}

async fn steps(
    options: &NodesDemoOptions,
    progress: &Progress,
    report: &mut DemoReport,
    state: &mut State,
) -> Result<(), String> {
    let cluster_started = Instant::now();
    let starting = state.starting.insert(tokio::spawn(NodesCluster::start(options.nodes.clone())));
    let started = starting.await;
    state.starting = None;
    let cluster = started
        .map_err(|e| format!("starting the cluster: the task failed: {e}"))?
        .map_err(|e| format!("starting the cluster: {e}"))?;
    report.timings.cluster_start_seconds = cluster_started.elapsed().as_secs_f64();
    let names: Vec<String> = cluster.nodes.iter().map(|n| n.name.clone()).collect();
    progress.phase(&format!(
        "cluster up: API server {}, allocator, and on each of {} nodes ({}: each its own netns, \
         {UPLINK} on one bridge with {PEER_ADDRESS}) a node daemon and a dev kubelet (kubeconfig {})",
        cluster.url,
        names.len(),
        names.join(", "),
        cluster.kubeconfig.display()
    ));
    let client = cluster.client.clone();
    let cluster = &*state.cluster.insert(cluster);
    let driver = &options.nodes.driver_name;

    let demo = async {
        let class = create_network(&client).await?;
        progress.phase(&format!(
            "PodNetwork {NETWORK} is Ready (subnet {SUBNET} in /{BLOCK_PREFIX} blocks on every \
             node's {UPLINK}); its controller made DeviceClass {class}"
        ));
        wait_for_network_devices(&client, &names).await?;
        progress.phase(&format!("every node published its {NETWORK}-{UPLINK} device"));
        create_pods(&client, &class, options.pods).await?;
        progress.phase(&format!(
            "created ResourceClaimTemplate {TEMPLATE} (class {class}, net1) and {} pods using \
             it, without a node",
            options.pods
        ));
        let ready_started = Instant::now();
        let netns_of = |uid: &str| cluster.sandbox(uid).and_then(|s| s.netns_path);
        let expect = Expect { pods: options.pods, ready_timeout: options.ready_timeout, driver };
        let mut rows = wait_for_pods(&client, &netns_of, &expect, progress).await?;
        report.timings.pods_ready_seconds = ready_started.elapsed().as_secs_f64();
        let pods = demo_pods(&client).await?;
        for row in &mut rows {
            row.node = pods
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(row.name.as_str()))
                .and_then(|p| p.spec.as_ref()?.node_name.clone());
        }
        progress.end_bar();
        progress.phase(&format!(
            "all {} pods Running and Ready on {} nodes, claims NetworkReady ({:.1}s)",
            rows.len(),
            names.len(),
            report.timings.pods_ready_seconds
        ));
        report.pods = rows;
        report.pings = run_pings(&report.pods, ping_plan(&report.pods, &names, peer_ip())).await;
        let answered = report.pings.iter().filter(|p| p.ok).count();
        progress.phase(&format!("pings across nodes: {answered}/{} answered", report.pings.len()));
        if let Some(interval) = options.nodes.stats_interval {
            let started = Instant::now();
            report.traffic = traffic(&client, &report.pods, &report.pings, interval).await?;
            progress.phase(&format!(
                "traffic counters of {} pods in their claim status ({:.1}s)",
                report.traffic.len(),
                started.elapsed().as_secs_f64()
            ));
        }
        report.claim_status = first_claim_status(&client, report).await;
        progress.phase(&format!("IPBlocks: {}", ip_blocks(&client).await?.join(", ")));
        Ok::<(), String>(())
    };
    tokio::select! {
        result = demo => result,
        (node, status) = cluster.daemon_exited() => {
            Err(format!("the node daemon of {node} ended ({status})"))
        }
    }
}

fn peer_ip() -> IpAddr {
    PEER_ADDRESS
        .parse::<IpNetwork>()
        .map_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED), |n| n.ip())
}

/// From the first pod of each node to the first pod of the next node (a ring over the
/// nodes that run pods), and from the first pod to the bridge's address.
fn ping_plan(
    rows: &[PodRow],
    nodes: &[String],
    bridge: IpAddr,
) -> Vec<(usize, String, Option<IpAddr>)> {
    let firsts: Vec<usize> = nodes
        .iter()
        .filter_map(|node| rows.iter().position(|r| r.node.as_deref() == Some(node.as_str())))
        .collect();
    let mut plan = Vec::new();
    if firsts.len() >= 2 {
        for (i, &from) in firsts.iter().enumerate() {
            let to = firsts[(i + 1) % firsts.len()];
            plan.push((from, rows[to].name.clone(), first_address(&rows[to])));
        }
    }
    if !rows.is_empty() {
        plan.push((0, "peer".to_owned(), Some(bridge)));
    }
    plan
}

/// Waits until every node has published the network's device on its uplink.
async fn wait_for_network_devices(client: &Client, nodes: &[String]) -> Result<(), String> {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let device = crate::model::pod_network::shared_device_name(NETWORK, UPLINK);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = slices
            .list(&ListParams::default())
            .await
            .map_err(|e| format!("listing ResourceSlices: {e}"))?;
        let missing: Vec<&String> = nodes
            .iter()
            .filter(|node| {
                !list.items.iter().any(|slice| {
                    slice.spec.node_name.as_deref() == Some(node.as_str())
                        && slice.spec.devices.iter().flatten().any(|d| d.name == device)
                })
            })
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("no {device} published within 30s by {missing:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates PodNetwork [`NETWORK`] on every node's uplink and waits until the controller
/// marks it Ready and names its DeviceClass; returns the class.
async fn create_network(client: &Client) -> Result<String, String> {
    let network: PodNetwork = serde_json::from_value(json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "PodNetwork",
        "metadata": {"name": NETWORK},
        "spec": {
            "mode": "macvlan",
            "macvlan": {"mode": "bridge"},
            "parents": [UPLINK],
            "ipam": {
                "subnets": [SUBNET],
                "exclude": [BRIDGE_EXCLUDE],
                "blockSize": {"ipv4": BLOCK_PREFIX},
            },
        },
    }))
    .map_err(|e| format!("building the PodNetwork: {e}"))?;
    let api: Api<PodNetwork> = Api::all(client.clone());
    api.create(&PostParams::default(), &network)
        .await
        .map_err(|e| format!("creating PodNetwork {NETWORK}: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let current =
            api.get(NETWORK).await.map_err(|e| format!("reading PodNetwork {NETWORK}: {e}"))?;
        let status = current.status.unwrap_or_default();
        let ready = status.conditions.iter().find(|c| c.type_ == CONDITION_READY);
        if let (Some(ready), Some(class)) = (ready, status.device_class_name) {
            if ready.status == "True" {
                return Ok(class);
            }
            if ready.reason != reason::READY {
                return Err(format!(
                    "PodNetwork {NETWORK} is not Ready: {}: {}",
                    ready.reason, ready.message
                ));
            }
        }
        if Instant::now() > deadline {
            return Err(format!("PodNetwork {NETWORK} did not become Ready within 30s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The template every pod uses (the class of the network, `net1`; mode, addresses and
/// routes come from the PodNetwork), then the pods, without a node.
async fn create_pods(client: &Client, class: &str, count: usize) -> Result<(), String> {
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "net", "exactly": {"deviceClassName": class}}],
            "config": [{"opaque": {"driver": crate::model::names::DEFAULT_DRIVER_NAME,
                "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1",
                    "kind": "NetworkConfig",
                    "interface": {"name": "net1"},
                }}}],
        }}},
    }))
    .map_err(|e| format!("building the claim template: {e}"))?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE)
        .create(&PostParams::default(), &template)
        .await
        .map_err(|e| format!("creating ResourceClaimTemplate {TEMPLATE}: {e}"))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for index in 0..count {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": pod_name(index), "namespace": NAMESPACE, "labels": {"app": APP_LABEL}},
            "spec": {
                "containers": [{"name": "app", "image": "localhost/netclaim/pause:1.0"}],
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

/// The network's IPBlocks as `<cidr> (<node>)`, by CIDR.
async fn ip_blocks(client: &Client) -> Result<Vec<String>, String> {
    let list = Api::<IpBlock>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{LABEL_POD_NETWORK}={NETWORK}")))
        .await
        .map_err(|e| format!("listing IPBlocks: {e}"))?;
    let mut blocks: Vec<String> =
        list.items.into_iter().map(|b| format!("{} ({})", b.spec.cidr, b.spec.node_name)).collect();
    blocks.sort();
    Ok(blocks)
}

/// Deletes the demo's objects (pods first, waiting until their kubelets tore them down),
/// stops the cluster (which removes its namespaces, links and run dir) and checks nothing
/// of it is left.
async fn cleanup(mut state: State) -> Cleanup {
    if let Some(starting) = state.starting.take()
        && let Ok(Ok(cluster)) = starting.await
    {
        state.cluster = Some(cluster);
    }
    let mut run_dir = None;
    if let Some(cluster) = state.cluster {
        run_dir = Some(cluster.run_dir.clone());
        delete_objects(&cluster.client).await;
        cluster.stop().await;
    }
    let mut leftover_paths: Vec<String> = Vec::new();
    if let Some(dir) = &run_dir {
        if dir.exists() {
            leftover_paths.push(dir.display().to_string());
        }
        leftover_paths.extend(mounts_under(dir).into_iter().map(|m| format!("mount {m}")));
    }
    Cleanup { ok: leftover_paths.is_empty(), leftover_links: Vec::new(), leftover_paths }
}

/// Mount points at or below `dir` in this process's mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else { return Vec::new() };
    mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mount_point| PathBuf::from(mount_point).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

async fn delete_objects(client: &Client) {
    let params = DeleteParams::default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    if let Ok(list) = demo_pods(client).await {
        for pod in list {
            let name = pod.metadata.name.unwrap_or_default();
            if let Err(err) = pods.delete(&name, &params).await {
                tracing::warn!(pod = %name, %err, "deleting a demo pod");
            }
        }
    }
    // Each node's kubelet tears its pods down, then removes them.
    let deadline = Instant::now() + Duration::from_mins(1);
    while Instant::now() < deadline {
        match demo_pods(client).await {
            Ok(list) if list.is_empty() => break,
            Ok(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(_) => break,
        }
    }
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    if let Ok(list) = claims_by_name(client).await {
        for claim in list {
            let _ignored =
                claims.delete(claim.metadata.name.as_deref().unwrap_or_default(), &params).await;
        }
    }
    let _ignored = Api::<ResourceClaimTemplate>::namespaced(client.clone(), NAMESPACE)
        .delete(TEMPLATE, &params)
        .await;
    // The controller deletes the DeviceClass and lets the network go once the nodes have
    // released its (now empty) IPBlocks.
    let _ignored = Api::<PodNetwork>::all(client.clone()).delete(NETWORK, &params).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(name: &str, node: &str, address: &str) -> PodRow {
        PodRow {
            name: name.to_owned(),
            node: Some(node.to_owned()),
            addresses: vec![address.to_owned()],
            ..PodRow::default()
        }
    }

    #[test]
    fn pings_go_from_node_to_node_and_to_the_bridge() {
        let rows = vec![
            row("demo-01", "n-1", "10.10.1.10/24"),
            row("demo-02", "n-2", "10.10.1.11/24"),
            row("demo-03", "n-1", "10.10.1.12/24"),
        ];
        let nodes = ["n-1".to_owned(), "n-2".to_owned()];
        let plan = ping_plan(&rows, &nodes, peer_ip());
        let described: Vec<(usize, String)> =
            plan.iter().map(|(f, t, _)| (*f, t.clone())).collect();
        assert_eq!(
            described,
            [(0, "demo-02".to_owned()), (1, "demo-01".to_owned()), (0, "peer".to_owned())]
        );
        assert_eq!(plan[0].2, Some("10.10.1.11".parse().unwrap()));
        assert_eq!(plan[2].2, Some(peer_ip()));
        // Three nodes: a ring.
        let rows = vec![
            row("a", "n-1", "10.10.1.10/24"),
            row("b", "n-2", "10.10.1.11/24"),
            row("c", "n-3", "10.10.1.12/24"),
        ];
        let nodes = ["n-1".to_owned(), "n-2".to_owned(), "n-3".to_owned()];
        let targets: Vec<String> =
            ping_plan(&rows, &nodes, peer_ip()).into_iter().map(|(_, t, _)| t).collect();
        assert_eq!(targets, ["b", "c", "a", "peer"]);
    }

    #[test]
    fn every_node_must_run_a_pod_when_there_are_enough_pods() {
        let rows = vec![row("a", "n-1", "x"), row("b", "n-1", "y")];
        assert_eq!(spread_problems(&rows, 2).len(), 1);
        assert!(spread_problems(&rows[..1], 2).is_empty());
        let spread = vec![row("a", "n-1", "x"), row("b", "n-2", "y")];
        assert!(spread_problems(&spread, 2).is_empty());
    }

    #[test]
    fn the_bridge_address_is_excluded_from_the_network() {
        let peer: IpNetwork = PEER_ADDRESS.parse().unwrap();
        let excluded: IpNetwork = BRIDGE_EXCLUDE.parse().unwrap();
        assert!(excluded.contains(peer.ip()));
        let subnet: IpNetwork = SUBNET.parse().unwrap();
        assert!(u32::from(BLOCK_PREFIX) >= u32::from(subnet.prefix()));
    }
}
