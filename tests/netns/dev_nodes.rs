//! `netclaim dev --nodes 2` end to end: the built binary starts two nodes, each a netns of its
//! own running its own `netclaim node` child in a mount namespace with its own sysfs; the test
//! checks both Nodes and both nodes' ResourceSlices, runs pods (no `spec.nodeName`) that the
//! allocator spreads over both nodes, pings between pods on different nodes over their
//! macvlans on the nodes' uplinks, stops the binary with SIGTERM and asserts nothing is left:
//! no mount under the run dir (namespace pins, bpffs, the run dir's own mount), no run dir, no
//! process, no link of the cluster's names in the host netns. A second test kills one node
//! daemon with SIGKILL: the binary notices, stops the whole cluster, exits non-zero and
//! leaves nothing either.
//!
//! Needs root (namespaces, links, mounts): `#[ignore]`d, run by `make test` as root.

#![allow(clippy::unwrap_used, reason = "a failed step fails the test")]

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::kit;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
const START_LIMIT: Duration = Duration::from_mins(1);
const PODS: usize = 4;
/// Link names the cluster uses inside its own namespaces; none may ever show up in the host's.
const CLUSTER_LINK_NAMES: &[&str] = &["uplink0", "br0", "port1", "port2"];

/// `netclaim dev --nodes 2` with its stderr collected; killed on drop if still running.
pub(crate) struct DevCluster {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    run_parent: tempfile::TempDir,
    pub(crate) kubeconfig: PathBuf,
    _kubeconfig_dir: tempfile::TempDir,
}

impl DevCluster {
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// `netclaim dev --nodes 2` with the flags `extra` too.
    pub(crate) fn start_with(extra: &[&str]) -> Self {
        let run_parent = tempfile::Builder::new().prefix("ncnodes").tempdir_in("/tmp").unwrap();
        let kubeconfig_dir = tempfile::tempdir().unwrap();
        let kubeconfig = kubeconfig_dir.path().join("kubeconfig");
        let mut child = Command::new(NETCLAIM)
            .args(["dev", "--nodes", "2", "--listen", "127.0.0.1:0", "--run-dir"])
            .arg(run_parent.path())
            .arg("--kubeconfig-out")
            .arg(&kubeconfig)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&stderr);
        let pipe = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let mut cluster =
            Self { child, stderr, run_parent, kubeconfig, _kubeconfig_dir: kubeconfig_dir };
        let started = Instant::now();
        while cluster.daemon_pids().len() < 2 {
            assert!(
                started.elapsed() < START_LIMIT,
                "the cluster did not come up within {START_LIMIT:?}:\n{}",
                cluster.log()
            );
            if let Some(status) = cluster.child.try_wait().unwrap() {
                panic!("netclaim dev ended during start ({status}):\n{}", cluster.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    pub(crate) fn log(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// Node name → daemon pid, from the ready lines (`node <name>: ... daemon pid <pid>`).
    pub(crate) fn daemon_pids(&self) -> BTreeMap<String, i32> {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .filter_map(|line| {
                let rest = line.trim().strip_prefix("node ")?;
                let (name, rest) = rest.split_once(':')?;
                let pid = rest.rsplit_once("daemon pid ")?.1.trim().parse().ok()?;
                Some((name.to_owned(), pid))
            })
            .collect()
    }

    /// The one run dir inside the run parent.
    fn run_dir(&self) -> PathBuf {
        let dirs: Vec<PathBuf> = std::fs::read_dir(self.run_parent.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("netclaim-dev-"))
            })
            .collect();
        assert_eq!(dirs.len(), 1, "{dirs:?}");
        dirs[0].clone()
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Waits for the exit; returns the status and the whole log.
    fn wait(&mut self, limit: Duration) -> (std::process::ExitStatus, String) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The stderr reader may still be draining.
                std::thread::sleep(Duration::from_millis(200));
                return (status, self.log());
            }
            assert!(started.elapsed() < limit, "netclaim dev did not exit:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Nothing of the run is left: no mount at or below the run parent, no file in it, no
    /// process mentioning it, no link of the cluster's names in the host netns that was not
    /// there before.
    fn assert_clean(&self, links_before: &BTreeSet<String>) {
        let parent = self.run_parent.path();
        let mounts = mounts_under(parent);
        assert!(mounts.is_empty(), "mounts left: {mounts:?}");
        let entries: Vec<_> =
            std::fs::read_dir(parent).unwrap().flatten().map(|e| e.path()).collect();
        assert!(entries.is_empty(), "files left: {entries:?}");
        let processes = processes_mentioning(&parent.display().to_string());
        assert!(processes.is_empty(), "processes left: {processes:?}");
        let new_links: Vec<String> = host_links()
            .into_iter()
            .filter(|l| CLUSTER_LINK_NAMES.contains(&l.as_str()) && !links_before.contains(l))
            .collect();
        assert!(new_links.is_empty(), "links in the host netns: {new_links:?}");
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SIGTERM first, so even a failed test cleans up after itself.
            let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(0));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGTERM);
            let started = Instant::now();
            while started.elapsed() < Duration::from_mins(1) {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn host_links() -> BTreeSet<String> {
    let output = kit::netns::run("ip", &["-o", "link", "show"]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

/// Mount points at or below `dir` in this process's mount namespace.
fn mounts_under(dir: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mount_point| Path::new(mount_point).starts_with(dir))
        .map(str::to_owned)
        .collect()
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

pub(crate) async fn client(kubeconfig: &Path) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).unwrap();
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

pub(crate) async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A DeviceClass on every node's uplink, and per pod a claim with a static address and a pod
/// without a node.
async fn create_pods(client: &Client) {
    let class: DeviceClass = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "uplinks"},
        "spec": {"selectors": [{"cel": {"expression":
            r#"device.driver == "netclaim.dev" && device.attributes["netclaim.dev"].ifName == "uplink0""#}}]},
    }))
    .unwrap();
    Api::<DeviceClass>::all(client.clone()).create(&PostParams::default(), &class).await.unwrap();
    for i in 0..PODS {
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("p{i}-net"), "namespace": "default"},
            "spec": {"devices": {
                "requests": [{"name": "net", "exactly": {"deviceClassName": "uplinks"}}],
                "config": [{"opaque": {"driver": "netclaim.dev", "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig",
                    "mode": "macvlan", "macvlan": {"mode": "bridge"},
                    "interface": {"name": "net1"},
                    "ipam": {"addresses": [format!("10.77.0.{}/24", 10 + i)]},
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
            "metadata": {"name": format!("p{i}"), "namespace": "default"},
            "spec": {
                "containers": [{"name": "app", "image": "pause"}],
                "resourceClaims": [{"name": "net", "resourceClaimName": format!("p{i}-net")}],
            },
        }))
        .unwrap();
        Api::<Pod>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }
}

/// `ping -c 3` from inside the netns at `netns` (a thread of its own enters it; the child
/// inherits the thread's namespace).
fn ping_from(netns: &Path, address: &str) -> Result<String, String> {
    let (netns, address) = (netns.to_owned(), address.to_owned());
    std::thread::spawn(move || {
        let file =
            std::fs::File::open(&netns).map_err(|e| format!("opening {}: {e}", netns.display()))?;
        #[allow(
            clippy::disallowed_methods,
            reason = "test: a throwaway thread enters the pod's netns to run ping"
        )]
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| format!("setns: {e}"))?;
        let output = Command::new("ping")
            .args(["-c", "3", "-i", "0.2", "-W", "2", &address])
            .output()
            .map_err(|e| format!("running ping: {e}"))?;
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() { Ok(text) } else { Err(text) }
    })
    .join()
    .unwrap()
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn two_nodes_run_pods_that_ping_across_nodes_and_sigterm_leaves_nothing() {
    if !kit::netns::require_root("dev_nodes") {
        return;
    }
    let links_before = host_links();
    let mut cluster = DevCluster::start();
    let pids = cluster.daemon_pids();
    assert_eq!(pids.keys().cloned().collect::<Vec<_>>(), ["dev-node-1", "dev-node-2"]);
    // Each daemon sees its own node's links through its own sysfs, and is its own process.
    for (node, pid) in &pids {
        let links: BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/root/sys/class/net"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(links, BTreeSet::from(["lo".to_owned(), "uplink0".to_owned()]), "{node}");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        assert!(cmdline.contains(&format!(" node --node-name {node} ")), "{cmdline}");
        let own_netns = std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
        assert_ne!(own_netns, std::fs::read_link("/proc/self/ns/net").unwrap(), "{node}");
    }
    let run_dir = cluster.run_dir();

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let kubeconfig = cluster.kubeconfig.clone();
    let placed: Vec<(String, String, String)> = runtime.block_on(async {
        let client = client(&kubeconfig).await;
        let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.unwrap();
        let names: BTreeSet<String> =
            nodes.items.iter().filter_map(|n| n.metadata.name.clone()).collect();
        assert_eq!(names, BTreeSet::from(["dev-node-1".to_owned(), "dev-node-2".to_owned()]));
        for node in &nodes.items {
            let labels = node.metadata.labels.clone().unwrap_or_default();
            assert_eq!(labels.get("kubernetes.io/hostname"), node.metadata.name.as_ref());
        }
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        wait_for("both nodes' ResourceSlices with uplink0", Duration::from_secs(30), || {
            let slices = slices.clone();
            async move {
                let list = slices.list(&ListParams::default()).await.ok()?;
                let nodes: BTreeSet<String> = list
                    .items
                    .iter()
                    .filter(|s| s.spec.devices.iter().flatten().any(|d| d.name == "uplink0"))
                    .filter_map(|s| s.spec.node_name.clone())
                    .collect();
                (nodes.len() == 2).then_some(())
            }
        })
        .await;

        create_pods(&client).await;
        let pod_api: Api<Pod> = Api::namespaced(client.clone(), "default");
        wait_for("pods Running on their nodes", Duration::from_secs(90), || {
            let pod_api = pod_api.clone();
            async move {
                let list = pod_api.list(&ListParams::default()).await.ok()?;
                let placed: Vec<(String, String, String)> = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .filter_map(|p| {
                        Some((
                            p.metadata.name.clone()?,
                            p.spec.as_ref()?.node_name.clone()?,
                            p.metadata.uid.clone()?,
                        ))
                    })
                    .collect();
                (placed.len() == PODS).then_some(placed)
            }
        })
        .await
    });
    let per_node: BTreeMap<&str, usize> =
        placed.iter().fold(BTreeMap::new(), |mut m, (_, n, _)| {
            *m.entry(n.as_str()).or_default() += 1;
            m
        });
    assert_eq!(per_node, BTreeMap::from([("dev-node-1", 2), ("dev-node-2", 2)]), "{placed:?}");

    // Ping from a pod on each node to a pod on the other, over net1 and the bridge.
    let netns_of = |name: &str| {
        let (_, node, uid) = placed.iter().find(|(n, _, _)| n == name).unwrap();
        let index = node.strip_prefix("dev-node-").unwrap();
        run_dir.join(format!("n{index}")).join("pods").join(uid)
    };
    let address_of = |name: &str| format!("10.77.0.{}", 10 + name[1..].parse::<usize>().unwrap());
    let on = |node: &str| placed.iter().find(|(_, n, _)| n == node).unwrap().0.clone();
    let (a, b) = (on("dev-node-1"), on("dev-node-2"));
    for (from, to) in [(&a, &b), (&b, &a)] {
        let result = ping_from(&netns_of(from), &address_of(to));
        assert!(result.is_ok(), "ping {from} -> {to} failed: {result:?}\n{}", cluster.log());
    }

    cluster.signal(nix::sys::signal::SIGTERM);
    let (status, log) = cluster.wait(Duration::from_mins(2));
    assert!(status.success(), "netclaim dev exited with {status}:\n{log}");
    cluster.assert_clean(&links_before);
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_node_daemon_killed_with_sigkill_stops_the_cluster_and_leaves_nothing() {
    if !kit::netns::require_root("dev_nodes kill -9") {
        return;
    }
    let links_before = host_links();
    let mut cluster = DevCluster::start();
    let pids = cluster.daemon_pids();
    let victim = pids["dev-node-2"];
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(victim), nix::sys::signal::SIGKILL).unwrap();
    let (status, log) = cluster.wait(Duration::from_mins(2));
    assert!(!status.success(), "netclaim dev should fail when a daemon dies:\n{log}");
    assert!(
        log.contains("node dev-node-2: the node daemon ended"),
        "the error names the node:\n{log}"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{}", pids["dev-node-1"])).exists(),
        "the other daemon still runs"
    );
    cluster.assert_clean(&links_before);
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn the_demo_on_two_nodes_pings_across_nodes_and_leaves_nothing() {
    if !kit::netns::require_root("dev_nodes demo") {
        return;
    }
    let links_before = host_links();
    let run_parent = tempfile::Builder::new().prefix("ncnodes").tempdir_in("/tmp").unwrap();
    let output = Command::new(NETCLAIM)
        .args(["dev", "--nodes", "2", "--demo", "--pods", "6", "--output", "json"])
        .args(["--listen", "127.0.0.1:0", "--run-dir"])
        .arg(run_parent.path())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("no JSON report ({err}); stderr:\n{stderr}"));
    assert!(output.status.success() && report["success"] == true, "{report:#}\n{stderr}");
    assert_eq!(report["node"], "dev-node-1,dev-node-2");
    let pods = report["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 6);
    let nodes: BTreeSet<&str> = pods.iter().filter_map(|p| p["node"].as_str()).collect();
    assert_eq!(nodes, BTreeSet::from(["dev-node-1", "dev-node-2"]), "{report:#}");
    let addresses: BTreeSet<&str> =
        pods.iter().filter_map(|p| p["addresses"][0].as_str()).collect();
    assert_eq!(addresses.len(), 6, "addresses are not unique in the cluster: {addresses:?}");
    let node_of = |pod: &str| {
        pods.iter().find(|p| p["name"] == pod).and_then(|p| p["node"].as_str()).unwrap()
    };
    let pings = report["pings"].as_array().unwrap();
    let across = pings
        .iter()
        .filter(|p| p["to"] != "peer")
        .filter(|p| node_of(p["from"].as_str().unwrap()) != node_of(p["to"].as_str().unwrap()))
        .count();
    assert_eq!(across, 2, "one ping each way between the nodes: {pings:?}");
    assert!(pings.iter().all(|p| p["ok"] == true), "{pings:?}");
    assert_eq!(report["cleanup"]["ok"], true, "{report:#}");
    let leftovers = mounts_under(run_parent.path());
    assert!(leftovers.is_empty(), "mounts left: {leftovers:?}");
    let entries: Vec<_> =
        std::fs::read_dir(run_parent.path()).unwrap().flatten().map(|e| e.path()).collect();
    assert!(entries.is_empty(), "files left: {entries:?}");
    let processes = processes_mentioning(&run_parent.path().display().to_string());
    assert!(processes.is_empty(), "processes left: {processes:?}");
    let new_links: Vec<String> = host_links()
        .into_iter()
        .filter(|l| CLUSTER_LINK_NAMES.contains(&l.as_str()) && !links_before.contains(l))
        .collect();
    assert!(new_links.is_empty(), "links in the host netns: {new_links:?}");
}

/// `netclaim dev --nodes 2` killed with SIGKILL cannot stop its node daemons itself: each
/// daemon asked the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG, set by the
/// daemon at start), so both end. What else the killed parent leaves (mounts of the run dir,
/// namespace pins) is removed by the test, as an operator would.
#[test]
#[ignore = "needs root: run `make test` as root"]
fn the_node_daemons_end_when_netclaim_dev_is_killed_with_sigkill() {
    if !kit::netns::require_root("dev_nodes parent kill -9") {
        return;
    }
    let mut cluster = DevCluster::start();
    let pids = cluster.daemon_pids();
    assert_eq!(pids.len(), 2, "{pids:?}");
    for pid in pids.values() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let parent = status.lines().find_map(|l| l.strip_prefix("PPid:")).unwrap().trim();
        assert_eq!(parent, cluster.child.id().to_string(), "the daemon is netclaim dev's child");
    }
    cluster.signal(nix::sys::signal::SIGKILL);
    let _ = cluster.wait(Duration::from_secs(30));
    // Each daemon gets SIGTERM and stops as usual; its API server is gone with the parent,
    // which its stop does not wait for.
    let deadline = Instant::now() + Duration::from_mins(1);
    let mut alive: Vec<(String, i32)> = pids.clone().into_iter().collect();
    while !alive.is_empty() && Instant::now() < deadline {
        alive.retain(|(_, pid)| is_running(*pid));
        std::thread::sleep(Duration::from_millis(100));
    }
    let leftover_daemons = alive.clone();
    for (_, pid) in &alive {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::SIGKILL);
    }
    remove_what_a_killed_cluster_left(cluster.run_parent.path());
    assert!(leftover_daemons.is_empty(), "node daemons still running: {leftover_daemons:?}");
}

/// Whether `pid` runs (a zombie, reaped by init soon, counts as ended).
fn is_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // The state follows the command name in parentheses: `pid (comm) S ...`.
        stat.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// Detaches every mount at or below `dir`, deepest first, and removes what is in it.
fn remove_what_a_killed_cluster_left(dir: &Path) {
    let mut mounts = mounts_under(dir);
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in mounts {
        let _ = nix::mount::umount2(mount.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let _ = std::fs::remove_dir_all(entry.path());
    }
}
