//! Cluster-wide IPAM with two real `netclaim node` daemons (DESIGN §4): two throwaway
//! netns, each with a veth `uplink0` and its own daemon (`node-a`, `node-b`), one
//! `netclaim dev --api-only` (our CRDs installed) in node-a's netns that node-b reaches through
//! a forwarder on its own loopback, one dual-stack PodNetwork on `uplink0` made Ready by the test. 250 claims per
//! node, allocated as the scheduler writes them, are prepared over each daemon's `dra.sock`
//! as kubelet does (10 claims per call, several calls in flight on both nodes at once).
//! Every claim gets one IPv4 and one IPv6 address (read from `GET /v1/status`), no address is
//! handed out twice, every address lies in an IPBlock its node owns, the nodes' blocks are
//! disjoint and few; after the unprepares no claim and no lease is left (the blocks stay
//! until the release grace).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use ipnetwork::IpNetwork;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use netclaim::model::pod_network::{IpBlock, PodNetwork};
use netclaim::node::status_api;
use serde_json::json;

use crate::kit;
use crate::kit::netns::{Child, Netns, node_daemon_args, require_root};

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
const DRIVER: &str = "netclaim.dev";
const NETWORK: &str = "net70";
const DEVICE: &str = "net70-uplink0";
const CLAIMS_PER_NODE: usize = 250;
/// Claims per NodePrepareResources call, and calls in flight per node.
const BATCH: usize = 10;
const IN_FLIGHT: usize = 4;
/// Bound for "eventually"; only keeps a broken build from hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// One node: its netns (with `uplink0`), dirs and daemon.
struct TestNode {
    name: &'static str,
    // Dropped in this order: the daemon, its netns, its dirs.
    daemon: Option<Child>,
    netns: Netns,
    dir: tempfile::TempDir,
}

impl TestNode {
    fn new(name: &'static str) -> Self {
        let netns = Netns::new();
        let peer = netns.ifname("u1");
        netns.ip(&["link", "add", "uplink0", "type", "veth", "peer", "name", &peer]);
        netns.ip(&["link", "set", "uplink0", "up"]);
        netns.ip(&["link", "set", &peer, "up"]);
        Self { name, dir: tempfile::tempdir().unwrap(), daemon: None, netns }
    }

    fn start_daemon(&mut self, kubeconfig: &Path) {
        let mut args = node_daemon_args(self.dir.path());
        // The shared flags name node `test-node` and a kubeconfig in the node's own dir.
        let value_of = |args: &[String], flag: &str| {
            args.iter().position(|a| a == flag).expect("node_daemon_args has the flag") + 1
        };
        let at = value_of(&args, "--node-name");
        self.name.clone_into(&mut args[at]);
        let at = value_of(&args, "--kubeconfig");
        kubeconfig.to_str().unwrap().clone_into(&mut args[at]);
        args.extend([
            "--nri-socket".to_owned(),
            self.dir.path().join("nri.sock").to_str().unwrap().to_owned(),
            "--include-interfaces=uplink0".to_owned(),
            "--shared-parents=uplink0".to_owned(),
        ]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.daemon = Some(self.netns.spawn(NETCLAIM, &args, &self.log_path()));
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("node.log")
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn dra_socket(&self) -> PathBuf {
        self.dir.path().join("plugin").join("dra.sock")
    }

    fn status_socket(&self) -> PathBuf {
        self.dir.path().join("state").join(status_api::SOCKET_NAME)
    }
}

/// Forwards connections to 127.0.0.1:16443 inside node-b's netns to the API server on
/// node-a's loopback (the dev API server listens on loopback only, as `netclaim dev --nodes`
/// forwards to it); ends when dropped.
struct ApiForwarder {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApiForwarder {
    fn start(from: &Netns, to: &Netns) -> Self {
        let (from, to) = (format!("/run/netns/{}", from.name), format!("/run/netns/{}", to.name));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            #[allow(
                clippy::disallowed_methods,
                reason = "test support: a throwaway thread binds in one test netns, connects in the other"
            )]
            let enter = |path: &str| {
                let file = std::fs::File::open(path).unwrap();
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            };
            // A socket stays in the namespace it was created in.
            enter(&from);
            let listener = std::net::TcpListener::bind(kit::netns::NETNS_API_LISTEN).unwrap();
            listener.set_nonblocking(true).unwrap();
            enter(&to);
            let runtime =
                tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                let accept = async {
                    loop {
                        let (mut inbound, _) = listener.accept().await.unwrap();
                        tokio::spawn(async move {
                            let mut outbound =
                                tokio::net::TcpStream::connect(kit::netns::NETNS_API_LISTEN)
                                    .await
                                    .unwrap();
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        });
                    }
                };
                tokio::select! {
                    () = accept => {}
                    _ = stopped => {}
                }
            });
        });
        Self { stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for ApiForwarder {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Node objects, the PodNetwork and its Ready status (as the controller writes it).
async fn set_up_cluster(client: &kube::Client) {
    for node in ["node-a", "node-b"] {
        let object: Node = serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
        Api::<Node>::all(client.clone()).create(&PostParams::default(), &object).await.unwrap();
    }
    let networks: Api<PodNetwork> = Api::all(client.clone());
    let network: PodNetwork = serde_json::from_value(json!({
        "apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
        "metadata": {"name": NETWORK},
        "spec": {"parents": ["uplink0"], "ipam": {
            "subnets": ["10.70.0.0/16", "fd00:70::/64"], "gateways": ["10.70.0.1"],
            "blockSize": {"ipv4": 26, "ipv6": 120}}},
    }))
    .unwrap();
    let created = networks.create(&PostParams::default(), &network).await.unwrap();
    let generation = created.metadata.generation.unwrap();
    let patch = json!({"status": {
        "observedGeneration": generation,
        "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                        "observedGeneration": generation}],
    }});
    networks.patch_status(NETWORK, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Waits until `node`'s pool publishes the network's device.
async fn wait_for_device(client: &kube::Client, node: &str) {
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let deadline = Instant::now() + PATIENCE;
    loop {
        let all = slices.list(&ListParams::default()).await.unwrap().items;
        let published = all
            .iter()
            .filter(|s| s.spec.pool.name == node)
            .any(|s| s.spec.devices.iter().flatten().any(|d| d.name == DEVICE));
        if published {
            return;
        }
        assert!(Instant::now() < deadline, "{node} never published {DEVICE}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates the claims of `node` and writes their allocation and reservation as the
/// scheduler does; returns kubelet's references.
async fn allocated_claims(client: &kube::Client, node: &str) -> Vec<v1::Claim> {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let names: Vec<String> = (0..CLAIMS_PER_NODE).map(|i| format!("{node}-c{i:03}")).collect();
    futures::stream::iter(names)
        .map(|name| {
            let claims = claims.clone();
            async move {
                let claim: ResourceClaim = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"devices": {"requests": [{"name": "net",
                        "exactly": {"deviceClassName": "net70.podnetwork.netclaim.dev"}}]}},
                }))
                .unwrap();
                let created = claims.create(&PostParams::default(), &claim).await.unwrap();
                let uid = created.metadata.uid.unwrap();
                let config = json!({"apiVersion": "netclaim.dev/v1alpha1",
                                    "kind": "NetworkConfig", "podNetwork": NETWORK});
                let status = json!({"status": {
                    "allocation": {"devices": {
                        "results": [{"request": "net", "driver": DRIVER, "pool": node,
                                     "device": DEVICE, "shareID": format!("share-{uid}")}],
                        "config": [{"source": "FromClass",
                                    "opaque": {"driver": DRIVER, "parameters": config}}],
                    }},
                    "reservedFor": [{"resource": "pods", "name": format!("pod-{name}"),
                                     "uid": format!("pod-uid-{name}")}],
                }});
                claims
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                    .await
                    .unwrap();
                v1::Claim { namespace: "default".into(), name, uid }
            }
        })
        .buffer_unordered(8)
        .collect()
        .await
}

/// Prepares (or unprepares) `claims` over `socket` in batches of [`BATCH`], [`IN_FLIGHT`]
/// calls at a time; returns each claim's error text (empty on success).
async fn dra_calls(
    socket: PathBuf,
    claims: Vec<v1::Claim>,
    prepare: bool,
) -> Vec<(String, String)> {
    let dra = kit::claims::dra_client_when_listening(&socket, PATIENCE).await;
    let batches: Vec<Vec<v1::Claim>> = claims.chunks(BATCH).map(<[v1::Claim]>::to_vec).collect();
    let answers: Vec<Vec<(String, String)>> = futures::stream::iter(batches)
        .map(|batch| {
            let mut dra = dra.clone();
            async move {
                let names: HashMap<String, String> =
                    batch.iter().map(|c| (c.uid.clone(), c.name.clone())).collect();
                let errors: Vec<(String, String)> = if prepare {
                    let request = v1::NodePrepareResourcesRequest { claims: batch };
                    let answer = dra.node_prepare_resources(request).await.unwrap().into_inner();
                    answer.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect()
                } else {
                    let request = v1::NodeUnprepareResourcesRequest { claims: batch };
                    let answer = dra.node_unprepare_resources(request).await.unwrap().into_inner();
                    answer.claims.into_iter().map(|(uid, r)| (uid, r.error)).collect()
                };
                assert_eq!(errors.len(), names.len(), "one answer per claim");
                errors.into_iter().map(|(uid, error)| (names[&uid].clone(), error)).collect()
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    answers.into_iter().flatten().collect()
}

/// The sum of `netclaim_ipam_addresses{state="leased"}` on the daemon's /metrics (run inside
/// the node's netns).
async fn leased_addresses() -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream =
        tokio::net::TcpStream::connect(kit::netns::NETNS_METRICS_LISTEN).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body.lines()
        .filter(|l| l.starts_with("netclaim_ipam_addresses{") && l.contains("state=\"leased\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `work` with an API client inside `netns`.
fn api<F, Fut, T>(netns: &Netns, kubeconfig: &Path, work: F) -> T
where
    F: FnOnce(kube::Client) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = T>,
    T: Send + 'static,
{
    let kubeconfig = kubeconfig.to_owned();
    netns.block_on(move || async move {
        work(netclaim::k8s::client(Some(&kubeconfig)).await.unwrap()).await
    })
}

#[test]
#[ignore = "root: two node daemons in throwaway netns"]
#[allow(clippy::too_many_lines, reason = "one scenario: setup, prepares, checks, unprepares")]
fn two_daemons_share_one_podnetwork_without_sharing_an_address() {
    require_root("two_daemons_share_one_podnetwork_without_sharing_an_address");
    let mut a = TestNode::new("node-a");
    let mut b = TestNode::new("node-b");
    let api_dir = tempfile::tempdir().unwrap();
    let _api = kit::netns::start_api_server(&a.netns, NETCLAIM, api_dir.path(), &[]);
    let _forwarder = ApiForwarder::start(&b.netns, &a.netns);
    let kubeconfig = api_dir.path().join("kubeconfig");
    api(&a.netns, &kubeconfig, |client| async move { set_up_cluster(&client).await });
    a.start_daemon(&kubeconfig);
    b.start_daemon(&kubeconfig);
    let (log_a, log_b) = (a.log_path(), b.log_path());
    let kc = kubeconfig.clone();
    let (claims_a, claims_b) = a.netns.block_on(move || async move {
        let client = netclaim::k8s::client(Some(&kc)).await.unwrap();
        for (node, log) in [("node-a", &log_a), ("node-b", &log_b)] {
            let waited = tokio::time::timeout(PATIENCE, wait_for_device(&client, node)).await;
            assert!(
                waited.is_ok(),
                "{node} did not publish {DEVICE}:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        (allocated_claims(&client, "node-a").await, allocated_claims(&client, "node-b").await)
    });

    // Both nodes prepare at once, as two kubelets would.
    let started = Instant::now();
    let (socket_a, socket_b) = (a.dra_socket(), b.dra_socket());
    let (ca, cb) = (claims_a.clone(), claims_b.clone());
    let (prepared_a, prepared_b) = a.netns.block_on(move || async move {
        futures::join!(dra_calls(socket_a, ca, true), dra_calls(socket_b, cb, true))
    });
    let prepare_time = started.elapsed();
    for (node, prepared, log) in [(&a, &prepared_a, a.log()), (&b, &prepared_b, b.log())] {
        assert_eq!(prepared.len(), CLAIMS_PER_NODE);
        let failed: Vec<_> = prepared.iter().filter(|(_, e)| !e.is_empty()).collect();
        assert!(failed.is_empty(), "{}: failed prepares {failed:?}\n{log}", node.name);
    }

    // The addresses, from each daemon's status socket.
    let (status_a, status_b) = (a.status_socket(), b.status_socket());
    let (status_a, status_b) = a.netns.block_on(move || async move {
        (status_api::fetch(&status_a).await.unwrap(), status_api::fetch(&status_b).await.unwrap())
    });
    let blocks: Vec<IpBlock> = api(&a.netns, &kubeconfig, |client| async move {
        Api::<IpBlock>::all(client).list(&ListParams::default()).await.unwrap().items
    });
    let mut blocks_of: BTreeMap<String, Vec<IpNetwork>> = BTreeMap::new();
    for block in &blocks {
        assert_eq!(block.spec.pod_network, NETWORK);
        assert!(block.spec.claim.is_none(), "no static reservations here");
        blocks_of
            .entry(block.spec.node_name.clone())
            .or_default()
            .push(block.spec.cidr.parse().unwrap());
    }
    let mut holder: HashMap<IpAddr, String> = HashMap::new();
    for status in [&status_a, &status_b] {
        assert_eq!(status.claims.len(), CLAIMS_PER_NODE, "{}: prepared claims", status.node);
        let mine = blocks_of.get(&status.node).cloned().unwrap_or_default();
        for claim in &status.claims {
            assert_eq!(claim.devices.len(), 1, "{}", claim.name);
            let addresses: Vec<IpNetwork> =
                claim.devices[0].addresses.iter().map(|a| a.parse().unwrap()).collect();
            assert_eq!(addresses.iter().filter(|a| a.is_ipv4()).count(), 1, "{}", claim.name);
            assert_eq!(addresses.iter().filter(|a| a.is_ipv6()).count(), 1, "{}", claim.name);
            for address in &addresses {
                let ip = address.ip();
                let who = format!("{}/{}", status.node, claim.name);
                if let Some(other) = holder.insert(ip, who.clone()) {
                    panic!("{ip} given to {other} and {who}");
                }
                assert!(mine.iter().any(|b| b.contains(ip)), "{ip} of {who} outside {mine:?}");
            }
        }
    }
    assert_eq!(holder.len(), 4 * CLAIMS_PER_NODE);
    let (owned_a, owned_b) = (&blocks_of["node-a"], &blocks_of["node-b"]);
    for x in owned_a {
        for y in owned_b {
            assert!(!x.contains(y.network()) && !y.contains(x.network()), "{x} and {y} overlap");
        }
    }
    let count =
        |blocks: &[IpNetwork], v4: bool| blocks.iter().filter(|b| b.is_ipv4() == v4).count();
    // 250 claims need 4 /26 (62 usable) IPv4 and 1 /120 (256) IPv6 blocks; a node takes a
    // block when its last is full, so a few more at most.
    for (node, owned) in [("node-a", owned_a), ("node-b", owned_b)] {
        assert!((4..=6).contains(&count(owned, true)), "{node}: IPv4 blocks {owned:?}");
        assert!((1..=3).contains(&count(owned, false)), "{node}: IPv6 blocks {owned:?}");
    }
    // Every block a daemon created is one it logged (no create beyond the blocks it holds).
    for (node, owned) in [(&a, owned_a), (&b, owned_b)] {
        let created = node.log().matches("claimed an IPBlock").count();
        assert_eq!(created, owned.len(), "{}: blocks created vs owned", node.name);
    }
    let leased_before = (a.netns.block_on(leased_addresses), b.netns.block_on(leased_addresses));

    // Unprepare everything: no claim and no lease is left; the blocks stay for the grace.
    let started = Instant::now();
    let (socket_a, socket_b) = (a.dra_socket(), b.dra_socket());
    let (done_a, done_b) = a.netns.block_on(move || async move {
        futures::join!(dra_calls(socket_a, claims_a, false), dra_calls(socket_b, claims_b, false))
    });
    let unprepare_time = started.elapsed();
    for done in [&done_a, &done_b] {
        assert_eq!(done.len(), CLAIMS_PER_NODE);
        assert!(done.iter().all(|(_, e)| e.is_empty()), "failed unprepares {done:?}");
    }
    let (status_a, status_b) = (a.status_socket(), b.status_socket());
    let (after_a, after_b) = a.netns.block_on(move || async move {
        (status_api::fetch(&status_a).await.unwrap(), status_api::fetch(&status_b).await.unwrap())
    });
    assert!(after_a.claims.is_empty() && after_b.claims.is_empty(), "claims left prepared");
    let leased_after = (a.netns.block_on(leased_addresses), b.netns.block_on(leased_addresses));
    assert_eq!(leased_before, (500.0, 500.0), "each node leased two addresses per claim");
    assert_eq!(leased_after, (0.0, 0.0), "leases left after the unprepares");
    let blocks_after: usize = api(&a.netns, &kubeconfig, |client| async move {
        Api::<IpBlock>::all(client).list(&ListParams::default()).await.unwrap().items.len()
    });
    eprintln!(
        "podnetwork two daemons: {} claims prepared in {prepare_time:?}, unprepared in \
         {unprepare_time:?}; IPBlocks node-a {} IPv4 + {} IPv6, node-b {} IPv4 + {} IPv6 \
         ({} created in the API, {blocks_after} left after the unprepares)",
        2 * CLAIMS_PER_NODE,
        count(owned_a, true),
        count(owned_a, false),
        count(owned_b, true),
        count(owned_b, false),
        blocks.len(),
    );
    drop(a.daemon.take());
    drop(b.daemon.take());
}
