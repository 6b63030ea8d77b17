//! Chaos on real containerd: the API server hanging and then refusing connections in the
//! middle of a burst; containerd restarted in the middle of a burst; the daemon killed at
//! each named crash point and at random moments over seeded rounds; a pod's network
//! namespace deleted under us. After each: no address twice, no leaked link, every running
//! pod has its interfaces, its claim's status says so, and once the pods and claims are
//! gone nothing is left in the daemon's state.
//!
//! These run for minutes together (one holds the API server hung for 30 s), so they run on
//! one runtime, containerd 2.1, in a serial nextest test group (`.config/nextest.toml`). The
//! crash rounds need the daemon built with the `failpoints` feature, as `make test` builds
//! it; `NETCLAIM_CHAOS_SEED` replays a printed run.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::*;

/// What the proxy in front of the API server does to the daemon's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ApiFault {
    /// Bytes flow both ways.
    None,
    /// Connections are accepted and kept open, and nothing is answered: a half-open peer or
    /// a frozen server. Requests sent meanwhile are held, not lost.
    Hang,
    /// Nothing listens (connections are refused) and open connections are closed.
    Refuse,
}

/// A TCP proxy between the daemon and the API server whose fault the test switches.
struct ApiProxy {
    address: SocketAddr,
    fault: watch::Sender<ApiFault>,
    task: tokio::task::JoinHandle<()>,
}

impl ApiProxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (fault, watcher) = watch::channel(ApiFault::None);
        let task = tokio::spawn(serve_proxy(listener, upstream, watcher));
        Self { address, fault, task }
    }

    fn set(&self, fault: ApiFault) {
        eprintln!("API server: {fault:?}");
        self.fault.send_replace(fault);
    }
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve_proxy(
    first: TcpListener,
    upstream: SocketAddr,
    mut fault: watch::Receiver<ApiFault>,
) {
    let address = first.local_addr().unwrap();
    let mut next = Some(first);
    loop {
        let listener = if let Some(listener) = next.take() {
            listener
        } else {
            if fault.wait_for(|f| *f != ApiFault::Refuse).await.is_err() {
                return;
            }
            // The same port again (listeners get SO_REUSEADDR, so closed connections in
            // TIME_WAIT do not block it).
            loop {
                match TcpListener::bind(address).await {
                    Ok(listener) => break listener,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        };
        let mut connections = JoinSet::new();
        loop {
            let mut watcher = fault.clone();
            tokio::select! {
                accepted = listener.accept() => {
                    if let Ok((client, _)) = accepted {
                        connections.spawn(relay(client, upstream, fault.clone()));
                    }
                }
                refused = watcher.wait_for(|f| *f == ApiFault::Refuse) => {
                    if refused.is_err() {
                        return;
                    }
                    break;
                }
            }
        }
        // Dropping the listener refuses new connections; aborting the relays drops (closes)
        // both ends of every open one.
        drop(listener);
        connections.abort_all();
    }
}

async fn relay(client: TcpStream, upstream: SocketAddr, fault: watch::Receiver<ApiFault>) {
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::join!(
        pump(client_read, server_write, fault.clone()),
        pump(server_read, client_write, fault)
    );
}

/// Copies bytes while there is no fault; under [`ApiFault::Hang`] holds what it has read
/// until the fault ends.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut fault: watch::Receiver<ApiFault>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if fault.wait_for(|f| *f == ApiFault::None).await.is_err() {
            break;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// Puts a proxy between the daemon (started after this) and the API server: the daemon
/// gets a kubeconfig naming the proxy, the test keeps talking to the server directly.
async fn proxy_api(cluster: &mut Cluster) -> ApiProxy {
    let kubeconfig = std::fs::read_to_string(cluster.dir().join("kubeconfig")).unwrap();
    let server = kubeconfig
        .lines()
        .find_map(|line| line.trim().strip_prefix("server: "))
        .expect("the dev kubeconfig names its server")
        .to_owned();
    let upstream: SocketAddr = server.trim_start_matches("http://").parse().unwrap();
    let proxy = ApiProxy::start(upstream).await;
    let proxied = cluster.dir().join("kubeconfig-proxied");
    std::fs::write(&proxied, kubeconfig.replace(&server, &format!("http://{}", proxy.address)))
        .unwrap();
    cluster.node_kubeconfig = Some(proxied);
    proxy
}

/// The netns of a running sandbox must already hold `net1` with an address: the daemon
/// attaches inside `RunPodSandbox`, before the call returns.
fn assert_attached_on_return(pod: &RunningPod, while_: &str) -> LinkInfo {
    let links = links_in(&pod.netns_path());
    let link = links
        .get(POD_IFNAME)
        .unwrap_or_else(|| panic!("{} has no {POD_IFNAME} {while_}: {links:?}", pod.spec.name));
    assert!(!link.addresses.is_empty(), "{} {while_}: {link:?}", pod.spec.name);
    link.clone()
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn an_api_server_that_hangs_then_refuses_mid_burst_stops_no_attach_and_statuses_catch_up() {
    run_e2e(Runtime::Containerd21, |cluster| {
        Box::pin(async move {
            const PODS: usize = 8;
            const HANG: Duration = Duration::from_secs(30);
            const REFUSE: Duration = Duration::from_secs(5);
            let proxy = proxy_api(cluster).await;
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.20.0/24".parse().unwrap();
            let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
            // kubelet prepares before the sandboxes exist; the outage comes after.
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.20.0/24")).await;
            let cri = cluster.cri().await;
            let cluster: &Cluster = cluster;

            // A burst of four sandboxes; the API server hangs as soon as the daemon has
            // received two of them, so status writes are in flight when it stops answering.
            let burst = futures::future::join_all(
                pods[..4].iter().map(|pod| run_pod(cluster, &cri, pod, 0)),
            );
            let hang = async {
                wait_until("two RunPodSandbox events", cluster, || async {
                    cluster.node_log().matches("event=RunPodSandbox").count() >= 2
                })
                .await;
                proxy.set(ApiFault::Hang);
                Instant::now()
            };
            let (results, hung_at) = tokio::join!(burst, hang);
            let mut running: Vec<(RunningPod, LinkInfo)> = Vec::new();
            for result in results {
                let (pod, _) = result.unwrap();
                let link = assert_attached_on_return(&pod, "after a burst with the API hanging");
                running.push((pod, link));
            }
            // More sandboxes while it hangs, and one stopped.
            for pod in &pods[4..6] {
                let (pod, _) = run_pod(cluster, &cri, pod, 0).await.unwrap();
                let link = assert_attached_on_return(&pod, "started while the API hangs");
                running.push((pod, link));
            }
            let (first, _) = running.remove(0);
            stop_and_remove(&cri, &first).await;
            tokio::time::sleep_until((hung_at + HANG).into()).await;
            assert!(!cluster.node_dies().await, "the daemon survives the hang");

            // Then the server refuses connections: a sandbox starts, another one stops.
            proxy.set(ApiFault::Refuse);
            let refused_at = Instant::now();
            let (pod, _) = run_pod(cluster, &cri, &pods[6], 0).await.unwrap();
            let link = assert_attached_on_return(&pod, "started while the API refuses");
            running.push((pod, link));
            let (second, _) = running.remove(0);
            stop_and_remove(&cri, &second).await;
            tokio::time::sleep_until((refused_at + REFUSE).into()).await;
            assert!(!cluster.node_dies().await, "the daemon survives the refusals");

            // The server is back: every status catches up, and the daemon works as before.
            proxy.set(ApiFault::None);
            let (pod, _) = run_pod(cluster, &cri, &pods[7], 0).await.unwrap();
            let link = wait_pod_link(cluster, &pod).await;
            running.push((pod, link));
            let mut addresses = BTreeSet::new();
            for (pod, link) in &running {
                let (ips, mac) = wait_ready_status(cluster, &pod.spec.claim, &pool).await;
                assert_eq!(ips, link.addresses, "{}: status = the pod's addresses", pod.spec.name);
                assert_eq!(mac.to_lowercase(), link.mac.to_lowercase());
                assert!(
                    addresses.insert(link.addresses[0].ip()),
                    "{} shares {link:?}",
                    pod.spec.name
                );
            }
            for stopped in [&first, &second] {
                wait_stopped_status(cluster, &stopped.spec.claim).await;
            }
            assert!(
                cluster.device_name(&parent).await.is_some(),
                "{parent} is still published after the outage"
            );
            drop((first, second));

            for (pod, _) in &running {
                stop_and_remove(&cri, pod).await;
            }
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty(), "no leaked link");
            cluster.assert_state_empty();
        })
    });
}

/// The pod netns at `path`, or `None` when it is gone: deleted, or an empty file left by an
/// unmount (not nsfs).
fn open_live_netns(path: &Path) -> Result<Option<File>, String> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(format!("opening {}: {err}", path.display())),
    };
    let fs =
        nix::sys::statfs::fstatfs(&file).map_err(|e| format!("fstatfs {}: {e}", path.display()))?;
    Ok((fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC).then_some(file))
}

/// What kubelet's pod sync does for a pod after a failure: a ready sandbox with its network
/// is kept (its netns opened); otherwise the pod's sandboxes are stopped and removed, and a
/// new one is run with the next attempt number. Returns the pod and whether its sandbox is
/// one that existed already.
///
/// A ready sandbox can have lost its network: containerd 2.1 cancels a RunPodSandbox in
/// flight when it is stopped, and the call's cleanup unmounts and deletes the netns while the
/// pause task it already started lives on (2.1.9 has no rollback of that task), so after the
/// restart the sandbox is recovered as READY with a netns path that is an empty file or gone
/// (its status then reports no IP). kubelet replaces such a sandbox
/// (`podSandboxChanged`: "Sandbox for pod has no IP address. Need to start a new one").
async fn converge_pod(cluster: &Cluster, cri: &CriClient, pod: &PodSpec) -> (RunningPod, bool) {
    // kubelet retries a pod sync that failed; a runtime that just restarted may fail a call.
    let mut last_error = String::new();
    for _ in 0..10 {
        match try_converge_pod(cluster, cri, pod).await {
            Ok(converged) => return converged,
            Err(err) => {
                eprintln!("{}: pod sync failed, retrying: {err}", pod.name);
                last_error = err;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    panic!("{}: pod sync keeps failing: {last_error}\nnode log:\n{}", pod.name, cluster.node_log())
}

async fn try_converge_pod(
    cluster: &Cluster,
    cri: &CriClient,
    pod: &PodSpec,
) -> Result<(RunningPod, bool), String> {
    let sandboxes: Vec<_> = cri
        .list_pod_sandbox(None)
        .await
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|s| s.metadata.as_ref().is_some_and(|m| m.uid == pod.uid))
        .collect();
    // SANDBOX_READY = 0.
    if let Some(ready) = sandboxes.iter().find(|s| s.state == 0) {
        let status = cri.pod_sandbox_status(&ready.id, true).await.map_err(|e| e.to_string())?;
        let path = netclaim::dev::cri::netns_path_from_verbose_info(&status)
            .ok_or("no netns path in the sandbox status")?;
        cluster.containerd.track_netns(&path);
        match open_live_netns(&path)? {
            Some(netns) => {
                return Ok((RunningPod { spec: pod.clone(), id: ready.id.clone(), netns }, true));
            }
            None => eprintln!(
                "{}: sandbox {} is ready but its netns {} is gone; replacing it",
                pod.name,
                ready.id,
                path.display()
            ),
        }
    }
    let mut attempt = 0;
    for sandbox in &sandboxes {
        attempt = attempt.max(sandbox.metadata.as_ref().map_or(0, |m| m.attempt) + 1);
        cri.stop_pod_sandbox(&sandbox.id).await.map_err(|e| e.to_string())?;
        cri.remove_pod_sandbox(&sandbox.id).await.map_err(|e| e.to_string())?;
    }
    // A sandbox that failed is removed by containerd itself: still a new attempt.
    attempt = attempt.max(1);
    let config = sandbox_config_with_attempt(&cluster.containerd, &pod.name, &pod.uid, attempt);
    let id = cri.run_pod_sandbox(config, "").await.map_err(|e| e.to_string())?;
    let status = cri.pod_sandbox_status(&id, true).await.map_err(|e| e.to_string())?;
    let path = netclaim::dev::cri::netns_path_from_verbose_info(&status)
        .ok_or("no netns path in the sandbox status")?;
    cluster.containerd.track_netns(&path);
    let netns = File::open(&path).map_err(|e| e.to_string())?;
    Ok((RunningPod { spec: pod.clone(), id, netns }, false))
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_containerd_restart_mid_burst_leaves_every_pod_attached_once() {
    run_e2e(Runtime::Containerd21, |cluster| {
        Box::pin(async move {
            const PODS: usize = 8;
            const RESTART_AFTER: usize = 3;
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.21.0/24".parse().unwrap();
            let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.21.0/24")).await;
            let cri = cluster.cri().await;

            // The burst; containerd gets SIGTERM (a service manager's restart) once the daemon
            // has received three of its sandboxes.
            let results = {
                let cluster: &Cluster = cluster;
                // Only RunPodSandbox itself: status lookups after it would race the restart.
                let burst = futures::future::join_all(pods.iter().map(|pod| {
                    let config =
                        sandbox_config_with_attempt(&cluster.containerd, &pod.name, &pod.uid, 0);
                    cri.run_pod_sandbox(config, "")
                }));
                let stopper = async {
                    // Polled every millisecond: the whole burst takes well under a second.
                    let started = Instant::now();
                    while cluster.node_log().matches("event=RunPodSandbox").count() < RESTART_AFTER
                    {
                        assert!(
                            started.elapsed() < PATIENCE,
                            "no RunPodSandbox reached the daemon"
                        );
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                    cluster.containerd.signal(nix::sys::signal::Signal::SIGTERM);
                };
                tokio::join!(burst, stopper).0
            };
            cluster.containerd.stop();
            cluster.containerd.start();
            let cri = cluster.cri().await;
            let cluster: &Cluster = cluster;
            cluster.wait_synchronized(2).await;
            let failed = results.iter().filter(|r| r.is_err()).count();
            eprintln!("{failed} of {PODS} RunPodSandbox calls failed across the restart");
            drop(results);

            // kubelet's next sync of each pod.
            let mut running = Vec::new();
            for pod in &pods {
                running.push(converge_pod(cluster, &cri, pod).await);
            }
            let kept = running.iter().filter(|(_, existed)| *existed).count();
            eprintln!("{kept} sandboxes survived the restart, {} were run again", PODS - kept);
            let listed = cri.list_pod_sandbox(None).await.unwrap();
            assert_eq!(listed.len(), PODS, "one sandbox per pod: {listed:?}");
            assert!(listed.iter().all(|s| s.state == 0), "all ready: {listed:?}");
            let mut addresses = BTreeSet::new();
            for (pod, _) in &running {
                let link = wait_pod_link(cluster, pod).await;
                let (ips, mac) = wait_ready_status(cluster, &pod.spec.claim, &pool).await;
                assert_eq!(ips, link.addresses, "{}", pod.spec.name);
                assert_eq!(mac.to_lowercase(), link.mac.to_lowercase());
                assert!(
                    addresses.insert(link.addresses[0].ip()),
                    "{} shares {link:?}",
                    pod.spec.name
                );
            }
            assert!(host_children_of(&parent).is_empty(), "no half-made macvlan in the host");

            // containerd 1.7 sends no NRI stop for a sandbox it did not run since it started
            // (see nri_containerd): those go away unannounced, and their namespaces with them
            // once the test lets go. The others are detached at stop.
            for (pod, from_before) in running {
                if from_before {
                    let id = pod.id.clone();
                    drop(pod);
                    cri.stop_pod_sandbox(&id).await.unwrap();
                    cri.remove_pod_sandbox(&id).await.unwrap();
                } else {
                    stop_and_remove(&cri, &pod).await;
                }
            }
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty(), "no leaked link");
            cluster.assert_state_empty();
        })
    });
}

/// The phases of a claim's life a crash round goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prepare,
    Run,
    Stop,
    Unprepare,
}

/// Where a round's daemon dies.
#[derive(Debug, Clone, Copy)]
enum Crash {
    /// At the `hit`-th pass of a named crash point (`NETCLAIM_CRASH_AT`).
    At(&'static str, u32),
    /// `kill -9` this long after `phase` begins.
    After(Phase, Duration),
}

const PODS_PER_ROUND: usize = 4;
const ROUNDS: usize = 10;

/// The crash of each round, drawn from `seed`: every named point once (in a shuffled order,
/// at a hit within the round's passes of it), the remaining rounds at random moments.
fn crash_plan(seed: u64) -> Vec<Crash> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let pods = u32::try_from(PODS_PER_ROUND).unwrap();
    // Every point a macvlan pod passes. `claims.prepare.after_vf_apply` is passed only by a
    // `sriov-vf` prepare, and this host has no SR-IOV VF: its crash is covered by the claims
    // unit tests over the real store (`killed_after_vf_apply`).
    let mut points: Vec<&'static str> = netclaim::failpoints::POINTS
        .iter()
        .copied()
        .filter(|point| *point != "claims.prepare.after_vf_apply")
        .collect();
    rng.shuffle(&mut points);
    let mut plan: Vec<Crash> = points
        .into_iter()
        .map(|point| {
            let passes = match point {
                // A macvlan attach is at least three steps (create, address, up), a detach
                // at least one, per pod.
                "podnet.attach.after_step" => 3 * pods,
                "store.compact.after_rename" => 1,
                _ => pods,
            };
            Crash::At(point, rng.u32(1..=passes))
        })
        .collect();
    while plan.len() < ROUNDS {
        let phase = match rng.u8(0..4) {
            0 => Phase::Prepare,
            1 => Phase::Run,
            2 => Phase::Stop,
            _ => Phase::Unprepare,
        };
        // Prepare and unprepare take milliseconds per claim; sandboxes take longer.
        let within = if matches!(phase, Phase::Run | Phase::Stop) { 400 } else { 40 };
        plan.push(Crash::After(phase, Duration::from_millis(rng.u64(0..within))));
    }
    plan
}

/// One round's kubelet and runtime, which retry what failed because the daemon died.
struct Round<'a> {
    cluster: &'a Cluster,
    parent: &'a str,
    dra: Dra,
    crashed_in: Option<Phase>,
}

impl Round<'_> {
    /// After a failed call: if the daemon died, starts it again (as its DaemonSet would)
    /// and returns true; a failure of a live daemon is a real failure.
    async fn recover(&mut self, phase: Phase, what: &str) -> bool {
        if !self.cluster.node_dies().await {
            return false;
        }
        self.restart(phase, what).await;
        true
    }

    /// At the end of a phase: if the daemon died during it (a crash point in an NRI call, a
    /// kill), starts it again; returns whether it did.
    async fn restart_if_dead(&mut self, phase: Phase) -> bool {
        if !self.cluster.node_exited() {
            return false;
        }
        self.restart(phase, "found dead at the end of the phase").await;
        true
    }

    async fn restart(&mut self, phase: Phase, what: &str) {
        eprintln!("  the daemon died during {phase:?} ({what})");
        self.crashed_in.get_or_insert(phase);
        self.cluster.respawn_if_exited();
        self.cluster.wait_node_ready(self.parent).await;
        self.dra = dra_client(&self.cluster.dra_socket()).await;
    }

    /// `NodePrepareResources` (or unprepare) for one claim until it succeeds.
    async fn kubelet_call(&mut self, phase: Phase, claim: &ResourceClaim) {
        let refs = vec![kit::claims::claim_ref(claim)];
        loop {
            let error = if phase == Phase::Prepare {
                self.dra
                    .node_prepare_resources(v1::NodePrepareResourcesRequest {
                        claims: refs.clone(),
                    })
                    .await
                    .map(|a| {
                        a.into_inner().claims.into_values().map(|c| c.error).collect::<String>()
                    })
            } else {
                self.dra
                    .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                        claims: refs.clone(),
                    })
                    .await
                    .map(|a| {
                        a.into_inner().claims.into_values().map(|c| c.error).collect::<String>()
                    })
            };
            let error = match error {
                Ok(error) if error.is_empty() => return,
                Ok(error) => error,
                Err(status) => status.to_string(),
            };
            let name = claim.metadata.name.as_deref().unwrap_or_default();
            assert!(
                self.recover(phase, name).await,
                "{phase:?} of {name} failed with the daemon alive: {error}\nnode log:\n{}",
                self.cluster.node_log()
            );
        }
    }
}

/// The crash point's churn: prepare and unprepare one claim until the journal is compacted
/// (and the daemon dies there), as a long-lived node's claims come and go.
async fn churn_until_compaction(round: &mut Round<'_>, claim: &ResourceClaim) {
    for _ in 0..5000 {
        round.kubelet_call(Phase::Prepare, claim).await;
        round.kubelet_call(Phase::Unprepare, claim).await;
        if round.crashed_in.is_some() {
            return;
        }
    }
    panic!("5000 prepare/unprepare cycles never compacted the journal");
}

#[test]
#[ignore = "needs root and the daemon built with --features failpoints: run `make test` as root"]
fn kill_9_at_each_named_point_and_at_random_moments_over_seeded_rounds() {
    let seed = std::env::var("NETCLAIM_CHAOS_SEED")
        .ok()
        .map_or_else(|| fastrand::u64(..), |s| s.parse().expect("NETCLAIM_CHAOS_SEED is a number"));
    eprintln!("NETCLAIM_CHAOS_SEED={seed}");
    let plan = crash_plan(seed);
    run_e2e(Runtime::Containerd21, |cluster| {
        Box::pin(async move {
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.22.0/24".parse().unwrap();
            let config = macvlan_config("10.77.22.0/24");
            let cri = cluster.cri().await;
            let cluster: &Cluster = cluster;
            let mut outcomes = Vec::new();
            for (number, crash) in plan.into_iter().enumerate() {
                eprintln!("round {number}: {crash:?}");
                // Each round's daemon starts afresh on the state the previous one left.
                cluster.stop_node();
                match crash {
                    Crash::At(point, hit) => cluster
                        .restart_node_with(&[("NETCLAIM_CRASH_AT", &format!("{point}@{hit}"))]),
                    Crash::After(..) => cluster.restart_node(),
                }
                cluster.wait_node_ready(&parent).await;
                let prefix = format!("{}-r{number}", cluster.prefix);
                let pods: Vec<PodSpec> =
                    (0..PODS_PER_ROUND).map(|i| PodSpec::new(&prefix, i)).collect();
                for pod in &pods {
                    cluster.create_claim(&pod.claim, &class, config.clone()).await;
                }
                let claims = cluster.allocate_and_reserve(&pods).await;
                let mut round = Round {
                    cluster,
                    parent: &parent,
                    dra: dra_client(&cluster.dra_socket()).await,
                    crashed_in: None,
                };
                let killer = |phase: Phase| async move {
                    if let Crash::After(at, after) = crash
                        && at == phase
                    {
                        tokio::time::sleep(after).await;
                        if cluster.kill_node_if_running() {
                            eprintln!("  kill -9 {after:?} into {phase:?}");
                        }
                    }
                };
                if let Crash::At("store.compact.after_rename", _) = crash {
                    churn_until_compaction(&mut round, &claims[0]).await;
                }

                // kubelet prepares each pod's claim.
                let prepare = async {
                    for claim in &claims {
                        round.kubelet_call(Phase::Prepare, claim).await;
                    }
                };
                tokio::join!(prepare, killer(Phase::Prepare));

                // The sandboxes, all at once.
                let burst = futures::future::join_all(
                    pods.iter().map(|pod| run_pod(cluster, &cri, pod, 0)),
                );
                let (results, ()) = tokio::join!(burst, killer(Phase::Run));
                drop(results);
                round.restart_if_dead(Phase::Run).await;
                let mut running = Vec::new();
                for pod in &pods {
                    running.push(converge_pod(cluster, &cri, pod).await.0);
                }
                let mut addresses = BTreeSet::new();
                for pod in &running {
                    let link = wait_pod_link(cluster, pod).await;
                    let (ips, _) = wait_ready_status(cluster, &pod.spec.claim, &pool).await;
                    assert_eq!(ips, link.addresses, "round {number}: {}", pod.spec.name);
                    assert!(
                        addresses.insert(link.addresses[0].ip()),
                        "round {number}: {} shares {link:?}",
                        pod.spec.name
                    );
                }
                assert!(host_children_of(&parent).is_empty(), "round {number}: host leak");

                // The runtime stops the pods. A stop during which the daemon died may leave
                // the interface in the (test-held) namespace: nothing else holds it, so the
                // kernel destroys it with the namespace.
                let crashed_before_stops = round.crashed_in;
                let stops = async {
                    for pod in &running {
                        while let Err(err) = cri.stop_pod_sandbox(&pod.id).await {
                            let what = err.to_string();
                            assert!(round.recover(Phase::Stop, &what).await, "{what}");
                        }
                    }
                };
                tokio::join!(stops, killer(Phase::Stop));
                let died_in_stops = round.restart_if_dead(Phase::Stop).await
                    || round.crashed_in != crashed_before_stops;
                for pod in &running {
                    if !died_in_stops {
                        let left = links_in(&pod.netns_path());
                        assert!(
                            !left.contains_key(POD_IFNAME),
                            "round {number}: {} still has {POD_IFNAME} after its stop",
                            pod.spec.name
                        );
                    }
                    cri.remove_pod_sandbox(&pod.id).await.unwrap();
                }
                drop(running);

                let unprepare = async {
                    for claim in &claims {
                        round.kubelet_call(Phase::Unprepare, claim).await;
                    }
                };
                tokio::join!(unprepare, killer(Phase::Unprepare));
                // A kill after the last call has nothing left to retry; a restart still has
                // to come up clean on what it left.
                round.restart_if_dead(Phase::Unprepare).await;
                assert!(host_children_of(&parent).is_empty(), "round {number}: leaked link");
                if let Crash::At(point, _) = crash {
                    assert!(
                        round.crashed_in.is_some(),
                        "round {number}: the daemon never reached {point}"
                    );
                }
                outcomes
                    .push(format!("round {number}: {crash:?} -> died in {:?}", round.crashed_in));
                cluster.assert_state_empty();
            }
            eprintln!("NETCLAIM_CHAOS_SEED={seed}");
            for outcome in outcomes {
                eprintln!("{outcome}");
            }
        })
    });
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn pods_whose_network_namespace_is_deleted_under_us_stop_cleanly_and_come_back() {
    run_e2e(Runtime::Containerd21, |cluster| {
        Box::pin(async move {
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.23.0/24".parse().unwrap();
            let pods: Vec<PodSpec> = (0..4).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.23.0/24")).await;
            let cri = cluster.cri().await;
            let cluster: &Cluster = cluster;
            let mut running = Vec::new();
            for pod in &pods {
                let (pod, _) = run_pod(cluster, &cri, pod, 0).await.unwrap();
                let link = wait_pod_link(cluster, &pod).await;
                wait_ready_status(cluster, &pod.spec.claim, &pool).await;
                running.push((pod, link));
            }
            let (zombie, zombie_link) = running.pop().unwrap();
            let (bystander, bystander_link) = running.pop().unwrap();
            let (unlinked, _) = running.pop().unwrap();
            let (destroyed, destroyed_link) = running.pop().unwrap();

            // Pod 0: its netns is unmounted and removed and its pause process killed, so the
            // namespace (and the macvlan in it) is gone, as after `ip netns delete` and an
            // OOM kill. kubelet sees the sandbox not ready, stops and removes it, and runs a
            // new one, which gets the claim's address again.
            let status = cri.pod_sandbox_status(&destroyed.id, true).await.unwrap();
            let path = netclaim::dev::cri::netns_path_from_verbose_info(&status).unwrap();
            let info: Value = serde_json::from_str(&status.info["info"]).unwrap();
            let pause = i32::try_from(info["pid"].as_i64().expect("the sandbox's pid")).unwrap();
            remove_netns_file(&path);
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pause), nix::sys::signal::SIGKILL)
                .unwrap();
            let (spec, id) = (destroyed.spec.clone(), destroyed.id.clone());
            drop(destroyed);
            wait_until("the sandbox not ready", cluster, || async {
                cri.pod_sandbox_status(&id, false)
                    .await
                    .is_ok_and(|s| s.status.is_some_and(|s| s.state != 0))
            })
            .await;
            let (again, existed) = converge_pod(cluster, &cri, &spec).await;
            assert!(!existed, "kubelet ran a new sandbox");
            let link = wait_pod_link(cluster, &again).await;
            assert_eq!(link.addresses, destroyed_link.addresses, "the claim's address again");
            let (ips, _) = wait_ready_status(cluster, &spec.claim, &pool).await;
            assert_eq!(ips, link.addresses);

            // Pod 1: only its netns file is removed (the pause process keeps the namespace);
            // the stop cannot reach the namespace, still succeeds, and the status follows.
            let status = cri.pod_sandbox_status(&unlinked.id, true).await.unwrap();
            remove_netns_file(&netclaim::dev::cri::netns_path_from_verbose_info(&status).unwrap());
            cri.stop_pod_sandbox(&unlinked.id).await.unwrap();
            cri.remove_pod_sandbox(&unlinked.id).await.unwrap();
            wait_stopped_status(cluster, &unlinked.spec.claim).await;
            drop(unlinked);

            // Pod 3: its netns file is removed while the sandbox stays READY (what containerd
            // 2.1 leaves after a RunPodSandbox cut short by its restart): kubelet's pod sync
            // replaces it instead of opening the missing path again and again.
            let status = cri.pod_sandbox_status(&zombie.id, true).await.unwrap();
            remove_netns_file(&netclaim::dev::cri::netns_path_from_verbose_info(&status).unwrap());
            let spec = zombie.spec.clone();
            drop(zombie);
            let (replaced, existed) = converge_pod(cluster, &cri, &spec).await;
            assert!(!existed, "a ready sandbox without its netns is replaced");
            let link = wait_pod_link(cluster, &replaced).await;
            assert_eq!(link.addresses, zombie_link.addresses, "the claim's address again");

            // The bystander kept its interface throughout.
            let now = wait_pod_link(cluster, &bystander).await;
            assert_eq!(
                (&now.mac, &now.addresses),
                (&bystander_link.mac, &bystander_link.addresses)
            );
            assert!(!cluster.node_dies().await, "the daemon is alive");
            assert!(host_children_of(&parent).is_empty(), "no leaked link");

            stop_and_remove(&cri, &again).await;
            stop_and_remove(&cri, &bystander).await;
            stop_and_remove(&cri, &replaced).await;
            drop((again, bystander, replaced));
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty(), "no leaked link");
            cluster.assert_state_empty();
        })
    });
}

/// What `ip netns delete` does to a named netns: detach the bind mount, remove the file.
fn remove_netns_file(path: &Path) {
    nix::mount::umount2(path, nix::mount::MntFlags::MNT_DETACH).unwrap();
    std::fs::remove_file(path).unwrap();
}
