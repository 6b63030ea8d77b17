//! Cluster-wide IPAM against the in-process API server (DESIGN §4): the real `IPBlock`
//! adapter and `PodNetwork` watch, one claim service per "node" with its own state dir.
//! Sixteen nodes racing for the blocks of one network own every block once and never share
//! an address; a restarted node keeps its blocks and leases; a static address reserved on one
//! node is refused on another, naming `ipam.addresses[0]` and the holder; a node killed with
//! SIGKILL at random moments of prepares, unprepares and block releases never hands one
//! address out twice and never leaks a block.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use netclaim::claims::networks::NetworkPorts;
use netclaim::claims::{ClaimPreparer, ClaimService, ServiceIdentity};
use netclaim::ipam::{Clock, ManualClock, QUARANTINE};
use netclaim::k8s::ip_blocks::{KubeIpBlocks, WatchedPodNetworks};
use netclaim::model::ClaimRef;
use netclaim::model::pod_network::IpBlock;
use netclaim::store::Store;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::kit::ipam::{
    Cluster, Configs, DRIVER, Node, PATIENCE, Service, claim_ref, made_up_claims, parent,
    prepare_all,
};
use crate::kit::testing::claims::MapClaims;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_nodes_racing_for_blocks_own_each_block_once_and_never_share_an_address() {
    // 32 IPv4 blocks of 32 addresses, 1024 IPv6 blocks of 64: 16 nodes × 40 pods need two
    // IPv4 blocks each, so the nodes end up owning the whole IPv4 subnet between them.
    let cluster = Cluster::start(json!({
        "parents": ["eth2"],
        "ipam": {"subnets": ["10.60.0.0/22", "fd00:60::/112"], "gateways": ["10.60.0.1"],
                 "blockSize": {"ipv4": 27, "ipv6": 122}}
    }))
    .await;
    let dirs: Vec<tempfile::TempDir> = (0..16).map(|_| tempfile::tempdir().unwrap()).collect();
    let nodes: Vec<Node> = dirs
        .iter()
        .enumerate()
        .map(|(i, d)| cluster.node(&format!("node-{i:02}"), d.path()))
        .collect();
    let claims: Vec<String> = (0..40).map(|i| format!("pod-{i}")).collect();
    let started = Instant::now();
    let results = futures::future::join_all(nodes.iter().map(|n| prepare_all(n, &claims))).await;
    let elapsed = started.elapsed();

    let mut holder: HashMap<IpAddr, String> = HashMap::new();
    for (node, prepared) in nodes.iter().zip(&results) {
        for (claim, addresses) in prepared {
            assert_eq!(addresses.len(), 2, "{claim}: one address per family");
            for address in addresses {
                if let Some(other) = holder.insert(address.ip(), format!("{}/{claim}", node.name)) {
                    panic!("{} given to {other} and {}/{claim}", address.ip(), node.name);
                }
            }
        }
    }
    // Every block in the API is owned by exactly the node that recorded it, and every
    // address lies in a block its node owns.
    let api_blocks = cluster.blocks().await;
    let mut owner_of: BTreeMap<String, String> = BTreeMap::new();
    for block in &api_blocks {
        owner_of.insert(block.metadata.name.clone().unwrap(), block.spec.node_name.clone());
    }
    let mut recorded_by: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for node in &nodes {
        node.service.reconcile_blocks().await.unwrap();
        for cidr in owned_cidrs(&cluster, &node.name).await {
            recorded_by.entry(cidr.to_string()).or_default().push(node.name.clone());
        }
    }
    assert!(recorded_by.values().all(|owners| owners.len() == 1), "{recorded_by:?}");
    for (node, prepared) in nodes.iter().zip(&results) {
        let mine = owned_cidrs(&cluster, &node.name).await;
        for (_, addresses) in prepared {
            for address in addresses {
                assert!(
                    mine.iter().any(|b| b.contains(address.ip())),
                    "{address} of {} outside its blocks",
                    node.name
                );
            }
        }
    }
    let v4_blocks = api_blocks.iter().filter(|b| !b.spec.cidr.contains(':')).count();
    let (creates, races, lists): (usize, usize, usize) = nodes.iter().fold((0, 0, 0), |acc, n| {
        (
            acc.0 + n.blocks.creates.load(Ordering::SeqCst),
            acc.1 + n.blocks.lost_races.load(Ordering::SeqCst),
            acc.2 + n.blocks.lists.load(Ordering::SeqCst),
        )
    });
    eprintln!(
        "16 nodes × 40 pods dual-stack in {elapsed:?}: {} blocks ({v4_blocks} IPv4), {creates} creates ({races} lost races), {lists} lists, {} addresses",
        api_blocks.len(),
        holder.len()
    );
    assert_eq!(holder.len(), 16 * 40 * 2);
    assert_eq!(creates - races, api_blocks.len(), "every won create is a block");
    cluster.stop().await;
}

/// The CIDRs of the blocks the API has for `node`.
async fn owned_cidrs(cluster: &Cluster, node: &str) -> Vec<IpNetwork> {
    cluster
        .blocks()
        .await
        .into_iter()
        .filter(|b| b.spec.node_name == node)
        .map(|b| b.spec.cidr.parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_keeps_its_blocks_and_leases_and_hands_out_no_address_twice() {
    let cluster = Cluster::start(json!({
        "parents": ["eth2"],
        "ipam": {"subnets": ["10.61.0.0/24"], "gateways": ["10.61.0.1"], "blockSize": {"ipv4": 28}}
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let node = cluster.node("node-a", dir.path());
    let first: Vec<String> = (0..20).map(|i| format!("a-{i}")).collect();
    let before = prepare_all(&node, &first).await;
    let blocks_before: BTreeSet<String> =
        cluster.blocks().await.into_iter().map(|b| b.metadata.name.unwrap()).collect();
    drop(node);
    let node = cluster.node("node-a", dir.path());
    node.service.reconcile_blocks().await.unwrap();
    // The same answers for the same claims (kubelet repeats prepares after a restart).
    let again = prepare_all(&node, &first).await;
    assert_eq!(before, again);
    let second: Vec<String> = (0..20).map(|i| format!("b-{i}")).collect();
    let after = prepare_all(&node, &second).await;
    let all: BTreeSet<IpAddr> =
        before.iter().chain(&after).flat_map(|(_, a)| a.iter().map(IpNetwork::ip)).collect();
    assert_eq!(all.len(), 40, "no address twice across the restart");
    let blocks_after: BTreeSet<String> =
        cluster.blocks().await.into_iter().map(|b| b.metadata.name.unwrap()).collect();
    assert!(blocks_before.is_subset(&blocks_after));
    assert!(node.blocks.lists.load(Ordering::SeqCst) >= 1, "the restart listed this node's blocks");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_address_reserved_on_one_node_is_refused_on_another() {
    let cluster = Cluster::start(json!({
        "parents": ["eth2"],
        "ipam": {"subnets": ["10.62.0.0/16"], "gateways": ["10.62.0.1"], "exclude": ["10.62.0.0/24"],
                 "staticRanges": ["10.62.0.0/24"]}
    }))
    .await;
    cluster
        .configs
        .lock()
        .unwrap()
        .insert("db".into(), json!({"ipam": {"addresses": ["10.62.0.20/16"]}}));
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (cluster.node("node-a", dir_a.path()), cluster.node("node-b", dir_b.path()));
    let on_a = claim_ref("node-a", "db");
    assert!(a.service.prepare(vec![on_a.clone()]).await[&on_a.uid].is_ok());
    let on_b = claim_ref("node-b", "db");
    let refused =
        b.service.prepare(vec![on_b.clone()]).await.remove(&on_b.uid).unwrap().unwrap_err();
    assert!(
        refused.message.contains("ipam.addresses[0]")
            && refused.message.contains("default/node-a--db")
            && refused.message.contains("on node node-a"),
        "{}",
        refused.message
    );
    let reservations: Vec<IpBlock> =
        cluster.blocks().await.into_iter().filter(|b| b.spec.claim.is_some()).collect();
    assert_eq!(reservations.len(), 1);
    assert_eq!(reservations[0].spec.cidr, "10.62.0.20/32");
    assert!(a.service.unprepare(vec![on_a.clone()]).await[&on_a.uid].is_ok());
    assert!(cluster.blocks().await.iter().all(|b| b.spec.claim.is_none()), "deleted at unprepare");
    assert!(b.service.prepare(vec![on_b.clone()]).await[&on_b.uid].is_ok());
    cluster.stop().await;
}

/// Set in the child of the crash test: the API server's URL, the state dir, the round.
const CHILD_SERVER: &str = "NETCLAIM_IPAM_CHILD_SERVER";
const CHILD_DIR: &str = "NETCLAIM_IPAM_CHILD_DIR";
const CHILD_ROUND: &str = "NETCLAIM_IPAM_CHILD_ROUND";
/// The crash test's full name in this binary (`--exact` takes the module path too).
const CRASH_TEST: &str =
    "podnetwork_ipam::kill_9_anywhere_never_gives_one_address_twice_nor_leaks_a_block";

/// A service of `node-a` on `dir` against the server at `url` (no grace), its clock `ahead`
/// of the system's.
fn crash_node(
    url: &str,
    dir: &Path,
    claims: &Arc<MapClaims>,
    ahead: Duration,
) -> (Service, CancellationToken, Arc<ManualClock>) {
    let client = kube::Client::try_from(kube::Config::new(url.parse().unwrap())).unwrap();
    let stop = CancellationToken::new();
    let receiver = netclaim::k8s::pod_networks::spawn_watch(client.clone(), stop.clone());
    let now = netclaim::ipam::SystemClock.now_ms() + u64::try_from(ahead.as_millis()).unwrap();
    let clock = Arc::new(ManualClock::at(now));
    let service = ClaimService::load_with_clock(
        ServiceIdentity { driver: DRIVER.into(), node: "node-a".into() },
        Arc::clone(claims),
        parent(),
        Arc::new(Store::open(dir).unwrap()),
        Arc::clone(&clock) as Arc<dyn Clock>,
    )
    .unwrap()
    .with_pod_networks(NetworkPorts {
        networks: Arc::new(WatchedPodNetworks::new(receiver, PATIENCE)),
        blocks: Arc::new(KubeIpBlocks::new(client)),
        release_grace: Duration::ZERO,
    });
    (service, stop, clock)
}

/// The child: prepares new claims and unprepares the one ten before (with 30 claims' worth of
/// quarantine, about seven blocks of 6 addresses are busy and roll over all the time),
/// releasing empty blocks now and then; prints `ack`/`rel` after each call returned.
async fn crash_child(url: String, dir: String, round: String) {
    let (service, _stop, clock) =
        crash_node(&url, Path::new(&dir), &made_up_claims(Configs::default()), Duration::ZERO);
    service.reconcile_blocks().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut i = 0u64;
    while Instant::now() < deadline {
        // The child's clock moves 1 s per claim: quarantines end, blocks empty and go.
        clock.advance(Duration::from_secs(1));
        let claim = claim_ref("node-a", &format!("r{round}-{i}"));
        let result = service.prepare(vec![claim.clone()]).await.remove(&claim.uid).unwrap();
        result.unwrap_or_else(|f| panic!("{}", f.message));
        let addresses = service.prepared(&claim.uid).unwrap().devices[0].addresses.clone();
        let text: Vec<String> = addresses.iter().map(|a| a.ip().to_string()).collect();
        println!("ack {} {}", claim.name, text.join(" "));
        if i >= 10 {
            let old = claim_ref("node-a", &format!("r{round}-{}", i - 10));
            println!("releasing {}", old.name);
            service.unprepare(vec![old.clone()]).await[&old.uid].as_ref().unwrap();
            println!("rel {}", old.name);
        }
        if i % 5 == 4 {
            service.release_idle_blocks().await;
        }
        i += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(clippy::too_many_lines, reason = "one crash scenario: the rounds and their checks")]
async fn kill_9_anywhere_never_gives_one_address_twice_nor_leaks_a_block() {
    if let (Ok(url), Ok(dir), Ok(round)) =
        (std::env::var(CHILD_SERVER), std::env::var(CHILD_DIR), std::env::var(CHILD_ROUND))
    {
        crash_child(url, dir, round).await;
        return;
    }
    // /29 blocks: 6 addresses, so blocks are claimed and released every few claims.
    let cluster = Cluster::start(json!({
        "parents": ["eth2"],
        "ipam": {"subnets": ["10.63.0.0/22"], "gateways": ["10.63.0.1"], "blockSize": {"ipv4": 29}}
    }))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let seed = std::env::var("NETCLAIM_IPAM_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("ipam crash test seed {seed} (NETCLAIM_IPAM_CRASH_SEED replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut live: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let mut releasing: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    let mut acks = 0;
    // The most claims one child's clock moved for (1 s each, from its own start).
    let mut most_claims_of_a_child = 0u64;
    let mut reconciled = netclaim::claims::networks::BlockReconcile::default();
    for round in 0..12 {
        let url = cluster.server.url();
        let envs = [
            (CHILD_SERVER, url),
            (CHILD_DIR, dir.path().display().to_string()),
            (CHILD_ROUND, round.to_string()),
        ];
        let lines = tokio::task::spawn_blocking({
            let kill_after = Duration::from_micros(rng.u64(0..400_000));
            move || run_child_and_kill(&envs, kill_after)
        })
        .await
        .unwrap();
        let mut claims_of_child = 0u64;
        for line in lines {
            // libtest prints `test <name> ... ` without a newline before the child's output.
            let parts: Vec<&str> = line.split_whitespace().collect();
            let start = parts.iter().position(|p| matches!(*p, "ack" | "releasing" | "rel"));
            match start.map_or(&[][..], |i| &parts[i..]) {
                ["ack", claim, addresses @ ..] => {
                    acks += 1;
                    claims_of_child += 1;
                    live.insert(
                        (*claim).to_owned(),
                        addresses.iter().map(|a| a.parse().unwrap()).collect(),
                    );
                }
                ["releasing", claim] => {
                    let held = live.remove(*claim).expect("releasing an acknowledged claim");
                    releasing.insert((*claim).to_owned(), held);
                }
                ["rel", claim] => {
                    releasing.remove(*claim);
                }
                _ => {}
            }
        }
        // The prepare in flight at the kill moved the clock too.
        most_claims_of_a_child = most_claims_of_a_child.max(claims_of_child + 1);
        // After the restart: every acknowledged claim is prepared with its addresses, an
        // unprepare in flight is done or not, no address is held twice, every lease lies in a
        // block this node owns in the API, and every block the API has for this node is
        // recorded (adopted) after the reconcile.
        let (service, stop, _) = crash_node(
            &cluster.server.url(),
            dir.path(),
            &made_up_claims(Configs::default()),
            Duration::ZERO,
        );
        let summary =
            service.reconcile_blocks().await.unwrap_or_else(|e| panic!("round {round}: {e}"));
        reconciled.adopted += summary.adopted;
        reconciled.forgotten += summary.forgotten;
        assert_eq!(summary.lost, 0, "round {round}: no one else deletes this node's blocks");
        for (claim, addresses) in &live {
            let prepared = service.prepared(&format!("uid-{claim}"));
            let got: Vec<IpAddr> = prepared
                .map(|p| p.devices[0].addresses.iter().map(IpNetwork::ip).collect())
                .unwrap_or_default();
            assert_eq!(&got, addresses, "round {round}: {claim} lost its addresses");
        }
        for (claim, addresses) in &releasing {
            if let Some(p) = service.prepared(&format!("uid-{claim}")) {
                let got: Vec<IpAddr> = p.devices[0].addresses.iter().map(IpNetwork::ip).collect();
                assert_eq!(&got, addresses, "round {round}: {claim} moved");
            }
        }
        let mut distinct = BTreeSet::new();
        let mut leased_addresses = Vec::new();
        for claim in service.all_prepared() {
            for address in &claim.devices[0].addresses {
                assert!(
                    distinct.insert(address.ip()),
                    "round {round}: {} held twice",
                    address.ip()
                );
                leased_addresses.push(address.ip());
            }
        }
        let mine = owned_cidrs(&cluster, "node-a").await;
        for address in &leased_addresses {
            assert!(
                mine.iter().any(|b| b.contains(*address)),
                "round {round}: {address} outside this node's blocks {mine:?}"
            );
        }
        // Every block the API has for this node is known to it now (so it will be released).
        let known: BTreeSet<IpNetwork> =
            service.owned_blocks().into_iter().map(|b| b.cidr).collect();
        for block in &mine {
            assert!(
                known.contains(block),
                "round {round}: {block} in the API, unknown to the node"
            );
        }
        stop.cancel();
        drop(service);
        // Releases in flight were done or not; either way they are settled now.
        releasing.clear();
    }
    // In the end: everything unprepared, empty blocks released: nothing of this node is
    // left in the API (no block leaked).
    // Past every release the children recorded: each child's clock ran ahead of the real
    // one by 1 s per claim (a fast child does a hundred claims before its kill), and a
    // release is quarantined within 30 s of its time either way (a clock that went back does
    // not shorten it), so the node starts that far ahead plus the quarantine.
    let ahead = Duration::from_secs(most_claims_of_a_child) + QUARANTINE + Duration::from_secs(1);
    let (service, stop, clock) =
        crash_node(&cluster.server.url(), dir.path(), &made_up_claims(Configs::default()), ahead);
    service.reconcile_blocks().await.unwrap();
    let refs: Vec<ClaimRef> = service
        .all_prepared()
        .into_iter()
        .map(|c| ClaimRef { namespace: c.namespace, name: c.name, uid: c.uid })
        .collect();
    let results = service.unprepare(refs).await;
    assert!(results.values().all(Result::is_ok));
    // The addresses just released keep their blocks while quarantined; 30 s on, the empty
    // blocks go.
    clock.advance(QUARANTINE);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        service.release_idle_blocks().await;
        if owned_cidrs(&cluster, "node-a").await.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "blocks of node-a left in the API: {:?}",
            owned_cidrs(&cluster, "node-a").await
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "ipam crash test: 12 rounds, {acks} acknowledged prepares (at most {most_claims_of_a_child} by one child); restarts adopted {} blocks created but not recorded, forgot {} deleted but still recorded",
        reconciled.adopted, reconciled.forgotten
    );
    assert!(acks >= 12, "the children prepared too little to test anything: {acks}");
    stop.cancel();
    cluster.stop().await;
}

/// Runs this test binary's crash test as a child with `envs`, kills it (SIGKILL) `kill_after`
/// its first `ack`, and returns its output lines.
fn run_child_and_kill(envs: &[(&str, String)], kill_after: Duration) -> Vec<String> {
    use std::io::{BufRead as _, BufReader};
    let exe = std::env::current_exe().unwrap();
    let mut child = std::process::Command::new(exe)
        .args(["--exact", CRASH_TEST, "--nocapture", "--test-threads=1"])
        .envs(envs.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let started = Instant::now();
    let mut lines: Vec<String> = Vec::new();
    while !lines.iter().any(|l| l.contains("ack ")) {
        match rx.recv_timeout(Duration::from_secs(30).saturating_sub(started.elapsed())) {
            Ok(line) => lines.push(line),
            Err(e) => {
                let _ = child.kill();
                panic!("child printed no ack within 30 s ({e}); output: {lines:?}");
            }
        }
    }
    std::thread::sleep(kill_after);
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    lines
}
