//! Cluster-wide IPAM (DESIGN §4, §10; issue 16 item 6): what a node pays per address inside
//! the blocks it owns, and what the API pays per pod.
//!
//! - `ipam_blocks/prepare_*`: new claims of a `PodNetwork` prepared by a node's claim service
//!   that keeps 250 pods (the oldest unprepared before each step, untimed; released addresses
//!   come back after their 30 s): config inheritance, the reservation in memory and the
//!   durable commit of the claim with its lease (the real store on disk in a temp dir; 16
//!   claims in one call share `fdatasync`s by group commit, as prepare does it). The claims
//!   are made up in memory (no API GET: that cost is the prepare bench's), so this is the IPAM
//!   and durability cost alone, reported as addresses per second per node.
//! - `ipam_blocks/reserve_in_memory`: the allocator alone (no disk, no API), on a node with
//!   1000 addresses of the network leased: the floor.
//! - After criterion: the API requests per 100 pods, counted at the `IPBlock` port against
//!   the in-process API server (each port call is one request, a lost race two): one node,
//!   IPv4 and dual stack; 16 nodes preparing 100 pods each at once; next to what Whereabouts
//!   users report.
//!
//! Without `--bench` (`cargo test --benches`) every benchmark runs once.

#![allow(missing_docs, reason = "criterion macros generate undocumented items")]
#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]

use netclaim_testkit as kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kit::ipam::{Cluster, Node, claim_ref, prepare_all};
use kit::testing::leases::MemoryLeases;
use netclaim::claims::ClaimPreparer;
use netclaim::ipam::blocks::Candidates;
use netclaim::ipam::{Clock, Ipam, LeaseOwner, ManualClock, OwnedBlock};
use netclaim::model::ClaimRef;
use netclaim::model::network_config::NetworkAddressing;
use serde_json::{Value, json};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A /8 cut into /24 blocks: a new block every 254 addresses (one API create, amortised
/// over the block as in a real node), every other address from an owned block.
fn wide_network() -> Value {
    json!({"parents": ["eth2"], "ipam": {"subnets": ["10.0.0.0/8"], "gateways": ["10.0.0.1"],
        "blockSize": {"ipv4": 24}}})
}

/// Claim names never used before on this node.
struct Names(AtomicU64);

impl Names {
    fn next(&self, node: &str, count: usize) -> Vec<ClaimRef> {
        (0..count)
            .map(|_| claim_ref(node, &format!("c{}", self.0.fetch_add(1, Ordering::SeqCst))))
            .collect()
    }
}

async fn prepare(node: &Node, claims: Vec<ClaimRef>) -> Duration {
    let started = Instant::now();
    let results = node.service.prepare(claims).await;
    let elapsed = started.elapsed();
    assert!(results.values().all(Result::is_ok), "{results:?}");
    elapsed
}

/// Pods kept on the node while the benchmark runs: a busy node's steady state (every
/// prepared claim is scanned by a prepare's per-parent checks, so an ever-growing set would
/// measure that instead).
const LIVE: usize = 250;

fn allocation(c: &mut Criterion) {
    let rt = runtime();
    let cluster = rt.block_on(Cluster::start(wide_network()));
    let dir = tempfile::tempdir().unwrap();
    let node = cluster.node("node-a", dir.path());
    let names = Names(AtomicU64::new(0));
    let live = std::sync::Mutex::new(std::collections::VecDeque::new());
    // The node's first block and its steady state, outside the measurement.
    let first = names.next("node-a", LIVE);
    rt.block_on(prepare(&node, first.clone()));
    live.lock().unwrap().extend(first);

    let mut group = c.benchmark_group("ipam_blocks");
    for batch in [1usize, 16] {
        group.throughput(Throughput::Elements(batch as u64));
        let id = if batch == 1 { "prepare_1_claim_durable" } else { "prepare_16_claims_durable" };
        group.bench_function(id, |b| {
            b.to_async(&rt).iter_custom(|iters| {
                let (node, names, live, clock) = (&node, &names, &live, &cluster.clock);
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        // Untimed: the oldest pods go and a second passes, so released
                        // addresses come back after their 30 s like on a real node.
                        let old: Vec<ClaimRef> = {
                            let mut live = live.lock().unwrap();
                            (0..batch).filter_map(|_| live.pop_front()).collect()
                        };
                        let gone = node.service.unprepare(old).await;
                        assert!(gone.values().all(Result::is_ok));
                        clock.advance(Duration::from_secs(1));
                        let new = names.next("node-a", batch);
                        total += prepare(node, new.clone()).await;
                        live.lock().unwrap().extend(new);
                    }
                    total
                }
            });
        });
    }
    let plan = NetworkAddressing {
        pod_network: "medianet".into(),
        subnets: vec!["10.0.0.0/8".parse().unwrap()],
        gateways: vec!["10.0.0.1".parse().unwrap()],
        exclude: Vec::new(),
        static_ranges: Vec::new(),
        block_v4: 24,
        block_v6: 120,
        addresses: Vec::new(),
    };
    let mut ipam = Ipam::load_with_clock(
        MemoryLeases::forgetful(),
        Arc::new(ManualClock::at(0)) as Arc<dyn Clock>,
    )
    .unwrap();
    for cidr in Candidates::new(&plan, true, "node-a").take(8) {
        ipam.add_block(
            OwnedBlock {
                name: netclaim::model::pod_network::ip_block_name("medianet", &cidr.to_string()),
                pod_network: "medianet".into(),
                cidr,
                uid: String::new(),
                claim: None,
            },
            true,
        );
    }
    let owner = |n: u64| LeaseOwner {
        claim_uid: format!("uid-{n}"),
        request: "net".into(),
        device: "medianet-eth2".into(),
        share_id: None,
    };
    // A node with 1000 pods on the network; each iteration reserves one more address and
    // gives it back (without quarantine), so the occupancy stays where it is.
    for n in 0..1000 {
        ipam.reserve_in_blocks(&owner(n), &plan, true).unwrap();
    }
    let mut n = 1000u64;
    group.throughput(Throughput::Elements(1));
    group.bench_function("reserve_in_memory", |b| {
        b.iter(|| {
            n += 1;
            let (lease, _) = ipam.reserve_in_blocks(&owner(n), &plan, true).unwrap();
            ipam.forget_in_memory(std::slice::from_ref(&lease));
        });
    });
    group.finish();
    rt.block_on(cluster.stop());
}

/// Prepares `pods` pods (one claim each) on `node`, as kubelet would: 8 sandboxes at a time.
async fn pods(node: &Node, pods: usize) {
    let claims: Vec<String> = (0..pods).map(|i| format!("pod-{i}")).collect();
    prepare_all(node, &claims).await;
}

/// Starts a node (its start-up reconcile lists its blocks, as the daemon does) and prepares
/// 100 pods: its API requests.
async fn requests_per_100_pods(network: Value) -> (usize, usize) {
    let cluster = Cluster::start(network).await;
    let dir = tempfile::tempdir().unwrap();
    let node = cluster.node("node-a", dir.path());
    node.service.reconcile_blocks().await.unwrap();
    pods(&node, 100).await;
    let blocks = cluster.blocks().await.len();
    let requests = node.blocks.requests();
    cluster.stop().await;
    (requests, blocks)
}

fn api_requests() {
    let rt = runtime();
    let v4 = json!({"parents": ["eth2"], "ipam": {"subnets": ["10.10.0.0/16"], "gateways": ["10.10.0.1"]}});
    let dual = json!({"parents": ["eth2"], "ipam": {"subnets": ["10.10.0.0/16", "fd00:10::/64"],
        "gateways": ["10.10.0.1"]}});
    let (v4_requests, v4_blocks) = rt.block_on(requests_per_100_pods(v4.clone()));
    let (dual_requests, dual_blocks) = rt.block_on(requests_per_100_pods(dual));
    // 16 nodes, 100 pods each, all at once, on one /16 of /26 blocks.
    let (race_requests, race_blocks, race_elapsed) = rt.block_on(async {
        let cluster = Cluster::start(v4).await;
        let dirs: Vec<tempfile::TempDir> = (0..16).map(|_| tempfile::tempdir().unwrap()).collect();
        let nodes: Vec<Node> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| cluster.node(&format!("node-{i:02}"), d.path()))
            .collect();
        futures::future::join_all(nodes.iter().map(|n| async move {
            n.service.reconcile_blocks().await.unwrap();
        }))
        .await;
        let started = Instant::now();
        futures::future::join_all(nodes.iter().map(|n| pods(n, 100))).await;
        let elapsed = started.elapsed();
        let requests: usize = nodes.iter().map(|n| n.blocks.requests()).sum();
        let blocks = cluster.blocks().await.len();
        cluster.stop().await;
        (requests, blocks, elapsed)
    });
    println!();
    println!(
        "API requests for IPAM per 100 pods (IPBlock list/create/get/delete; no request per address):"
    );
    println!(
        "  one node, IPv4 /26 blocks:                 {v4_requests} ({v4_blocks} blocks: a list at start, a create per block)"
    );
    println!("  one node, dual stack (/26 + /120 blocks):  {dual_requests} ({dual_blocks} blocks)");
    println!(
        "  16 nodes × 100 pods at once, IPv4:         {:.1} per node ({race_requests} in all, {race_blocks} blocks, lost races included); 1600 pods prepared in {race_elapsed:?}",
        f64::from(u32::try_from(race_requests).unwrap()) / 16.0
    );
    println!(
        "Whereabouts (reference/peers.md): a cluster-wide lease plus an IPPool update per address;"
    );
    println!(
        "  500 pods / 100 nodes took 4 m 34 s (PR #127), 128 pods × 16 networks hit kubelet's 4 min limit (#313),"
    );
    println!("  node-slice mode stalls near 50 of 100 pods with 8 networks (#558).");
}

fn benches(c: &mut Criterion) {
    allocation(c);
    api_requests();
}

criterion_group!(ipam, benches);
criterion_main!(ipam);
