//! End to end against a real containerd with NRI, each scenario on 1.7 and on 2.1
//! (`containerd_1_7::<scenario>`, `containerd_2_1::<scenario>`): the `netclaim node` daemon publishes
//! veth interfaces the test created in the host netns, the dev allocator allocates claims on
//! them as the scheduler would, the test calls `NodePrepareResources` over the DRA socket as
//! kubelet does, then runs pod sandboxes through CRI; the daemon's NRI plugin attaches the
//! interfaces in the pods' network namespaces and writes the claims' `status.devices`.
//!
//! Each test has its own containerd, `netclaim dev --api-only`, daemon, state dir, node name
//! and interface names (`nc<hex>…`), so the tests run in parallel processes. Everything is
//! removed on drop, also when a test fails: sandboxes, shims, mounts, network namespaces,
//! the test's veth pairs (which takes any macvlan child along).
//!
//! Scenarios: a macvlan claim on a shared parent (interface, address, claim status, detach
//! at stop, release at unprepare); a host-device claim moving a veth end into the pod and
//! back (name, MTU and MAC restored); 20 pods on one parent (distinct addresses; prints the
//! median `RunPodSandbox` wall time and the daemon's mean attach time); `kill -9` of the
//! daemon during a burst of 10 sandboxes, then a restart on the same state (every pod gets
//! its interface, no address twice, nothing leaked). Beyond those: pods stopped while the
//! daemon is down, a host-device pod across a daemon restart, a containerd restart, a pod
//! with two claims (`net1`, `net2` in claim-name order), and a failed attach (the sandbox
//! fails with the reason on the claim and the Pod; kubelet's retry succeeds), and no
//! container created while a pod lacks its interface; a claim's explicit name, static
//! address, MAC, MTU and route, in the pod and in the status.
//!
//! The chaos scenarios (API server hanging then refusing, containerd restarted mid-burst,
//! kill -9 at crash points over seeded rounds, a netns deleted under us) are in `chaos`.
//!
//! To prove that the daemon detaches (and not that containerd destroyed the netns), the test
//! holds an open fd of each pod's netns across `StopPodSandbox`: the namespace outlives the
//! sandbox, and whatever is still inside it is a leftover.
//!
//! Needs root and `scripts/setup/containerd.sh`: `#[ignore]`d, run by `make test` as root,
//! failing when either is missing.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]
#![allow(clippy::too_many_lines, reason = "each test is one scenario told step by step")]

mod chaos;
mod scale;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::future::Future;
use std::os::fd::AsRawFd as _;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use ipnetwork::IpNetwork;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceSlice,
};
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube_inmemory::allocator::{AllocatorController, reserve_for};
use netclaim::attach::PodAttachment;
use netclaim::claims::PreparedClaim;
use netclaim::dev::cri::CriClient;
use netclaim::ipam::LeaseStore as _;
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::v1;
use netclaim::store::Store;
use serde_json::{Value, json};

use crate::kit;
use crate::kit::claims::{DevApi, dra_client};
use crate::kit::containerd::{Containerd, Runtime, sandbox_config_with_attempt};

const DRIVER: &str = "netclaim.dev";
const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
/// Bound for "eventually" (the daemon reacts in milliseconds; the bound only keeps a broken
/// build from hanging, and is generous because four builds may share two cores).
const PATIENCE: Duration = Duration::from_mins(1);
/// containerd's per-call bound for NRI plugins. Its default is 2 s; a loaded test machine
/// gets more, so that a slow moment is not mistaken for a broken plugin (containerd drops a
/// plugin that misses it).
const NRI_TIMEOUT: Duration = Duration::from_secs(5);
/// The pod-side name of the first claim of a pod (DESIGN §3: `net1`, `net2`, …).
const POD_IFNAME: &str = "net1";

type Dra = v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

/// A veth pair in the host netns with generated names; both ends are deleted on drop (if one
/// end is in a pod, deleting the other removes the pair; a macvlan on it goes with it).
struct HostVeth {
    a: String,
    b: String,
}

impl HostVeth {
    fn new(a: String, b: String, mtu: u32) -> Self {
        let veth = Self { a, b };
        let mtu = mtu.to_string();
        kit::netns::run("ip", &["link", "add", &veth.a, "type", "veth", "peer", "name", &veth.b]);
        for end in [&veth.a, &veth.b] {
            kit::netns::run("ip", &["link", "set", end, "mtu", &mtu, "up"]);
        }
        veth
    }
}

impl Drop for HostVeth {
    fn drop(&mut self) {
        for end in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["link", "del", end]).stderr(Stdio::null()).status();
        }
    }
}

/// One test's world: containerd, the API server, the node daemon, the test's links.
/// Fields drop in order: the daemon first, then containerd (sandboxes, namespaces), then the
/// links, then the API server.
struct Cluster {
    node: Mutex<Option<std::process::Child>>,
    containerd: Containerd,
    links: Vec<HostVeth>,
    api: DevApi,
    /// `nc<6 hex>`: the prefix of every interface and object name of this test.
    prefix: String,
    node_name: String,
    node_args: Vec<String>,
    node_starts: AtomicU32,
    /// The daemon binary (the test build unless a scenario runs the release one).
    node_binary: PathBuf,
    /// The kubeconfig the daemon uses (the API server's own unless a test puts a proxy
    /// between them).
    node_kubeconfig: Option<PathBuf>,
    /// A bpffs of the test's own when the scenario turns traffic counters on (otherwise the
    /// daemon runs with `--bpffs=` and hooks nothing).
    bpffs: Option<PrivateBpffs>,
}

/// A bpffs mounted in the test's dir, unmounted on drop.
struct PrivateBpffs {
    path: PathBuf,
    /// `--stats-interval` of the daemon.
    interval: String,
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").args(["-l"]).arg(&self.path).status();
    }
}

impl Cluster {
    async fn start(tools: kit::containerd::Tools) -> Self {
        let mut containerd = Containerd::new(tools, NRI_TIMEOUT);
        containerd.start();
        let cri = containerd.cri(Duration::from_mins(1)).await;
        drop(cri);
        containerd.import_image();
        let api = DevApi::start().await;
        let prefix = kit::netns::unique_prefix();
        let node_name = format!("e2e-{prefix}");
        Self {
            node: Mutex::new(None),
            containerd,
            links: Vec::new(),
            api,
            prefix,
            node_name,
            node_args: Vec::new(),
            node_starts: AtomicU32::new(0),
            node_binary: PathBuf::from(NETCLAIM),
            node_kubeconfig: None,
            bpffs: None,
        }
    }

    async fn cri(&self) -> CriClient {
        self.containerd.cri(Duration::from_mins(2)).await
    }

    /// A veth pair `<prefix><a>` / `<prefix><b>`; returns the first name.
    fn veth(&mut self, a: &str, b: &str, mtu: u32) -> String {
        let (a, b) = (format!("{}{a}", self.prefix), format!("{}{b}", self.prefix));
        assert!(a.len() <= 15 && b.len() <= 15);
        self.links.push(HostVeth::new(a.clone(), b, mtu));
        a
    }

    fn dir(&self) -> &Path {
        self.api.dir()
    }

    fn state_dir(&self) -> PathBuf {
        self.dir().join("state")
    }

    fn dra_socket(&self) -> PathBuf {
        self.dir().join("plugin/dra.sock")
    }

    /// The log of the daemon's latest start.
    fn node_log(&self) -> String {
        let n = self.node_starts.load(Ordering::SeqCst);
        std::fs::read_to_string(self.dir().join(format!("node{n}.log"))).unwrap_or_default()
    }

    /// Turns traffic counters on for the next [`Self::start_node`]: a bpffs of the test's
    /// own, the claim status refreshed every `interval` (`--stats-interval`).
    fn enable_stats(&mut self, interval: &str) {
        let path = self.dir().join("bpf");
        std::fs::create_dir_all(&path).unwrap();
        kit::netns::run("mount", &["-t", "bpf", "bpf", path.to_str().unwrap()]);
        self.bpffs = Some(PrivateBpffs { path, interval: interval.to_owned() });
    }

    /// Starts `netclaim node` publishing `shared` as shared parents and `include` as
    /// exclusive devices, connected to our containerd's NRI socket.
    fn start_node(&mut self, shared: &str, include: &str) {
        let dir = self.dir();
        let path = |rel: &str| dir.join(rel).display().to_string();
        let kubeconfig = self.node_kubeconfig.clone().unwrap_or_else(|| dir.join("kubeconfig"));
        self.node_args = vec![
            "node".into(),
            "--node-name".into(),
            self.node_name.clone(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--metrics-address".into(),
            "127.0.0.1:0".into(),
            "--state-dir".into(),
            path("state"),
            "--kubelet-registry-dir".into(),
            path("registry"),
            "--kubelet-plugin-dir".into(),
            path("plugin"),
            "--nri-socket".into(),
            self.containerd.nri_socket().display().to_string(),
            "--nri-plugin-index".into(),
            "10".into(),
            "--cdi-spec-dir".into(),
            self.containerd.cdi_dir().display().to_string(),
            "--include-interfaces".into(),
            include.into(),
        ];
        match &self.bpffs {
            Some(bpffs) => self.node_args.extend([
                "--bpffs".into(),
                bpffs.path.display().to_string(),
                "--stats-interval".into(),
                bpffs.interval.clone(),
            ]),
            None => self.node_args.push("--bpffs=".into()),
        }
        if !shared.is_empty() {
            self.node_args.extend(["--shared-parents".into(), shared.into()]);
        }
        self.restart_node();
    }

    /// Starts the daemon again with the same flags and state (log `node<N>.log`).
    fn restart_node(&self) {
        self.restart_node_with(&[]);
    }

    /// [`Self::restart_node`] with extra environment variables (crash points).
    fn restart_node_with(&self, env: &[(&str, &str)]) {
        let mut node = self.node.lock().unwrap();
        assert!(node.is_none(), "the daemon is still running");
        self.spawn_node(&mut node, env);
    }

    fn spawn_node(&self, node: &mut Option<std::process::Child>, env: &[(&str, &str)]) {
        let n = self.node_starts.fetch_add(1, Ordering::SeqCst) + 1;
        let log = File::create(self.dir().join(format!("node{n}.log"))).unwrap();
        let child = Command::new(&self.node_binary)
            .args(&self.node_args)
            .env("RUST_LOG", "info,netclaim=debug")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting netclaim node");
        *node = Some(child);
    }

    /// If the daemon has exited (a crash point killed it), starts it again without extra
    /// environment, as its DaemonSet would; returns whether it did.
    fn respawn_if_exited(&self) -> bool {
        let mut node = self.node.lock().unwrap();
        let exited = match node.as_mut() {
            Some(child) => child.try_wait().unwrap().is_some(),
            None => true,
        };
        if exited {
            *node = None;
            self.spawn_node(&mut node, &[]);
        }
        exited
    }

    /// Whether the daemon is not running (now, without waiting).
    fn node_exited(&self) -> bool {
        match self.node.lock().unwrap().as_mut() {
            Some(child) => child.try_wait().unwrap().is_some(),
            None => true,
        }
    }

    /// Whether the daemon exits within 2 s (after a failed call: did it crash?).
    async fn node_dies(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if self.node_exited() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    /// `kill -9`: no shutdown code runs.
    fn kill_node(&self) {
        let mut child = self.node.lock().unwrap().take().expect("the daemon runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// `kill -9` if the daemon runs; returns whether it did.
    fn kill_node_if_running(&self) -> bool {
        let child = self.node.lock().unwrap().take();
        child.is_some_and(|mut child| {
            let _ = child.kill();
            child.wait().unwrap();
            true
        })
    }

    /// SIGTERM and wait (the state dir is free afterwards).
    fn stop_node(&self) {
        let child = self.node.lock().unwrap().take();
        if let Some(mut child) = child {
            kit::containerd::terminate(&mut child);
        }
    }

    /// Waits until the daemon published `if_name` and is synchronized with containerd's
    /// NRI (so the next sandbox reaches it).
    async fn wait_node_ready(&self, if_name: &str) {
        wait_until(&format!("{if_name} published"), self, || async {
            self.device_name(if_name).await.is_some()
        })
        .await;
        wait_until("the daemon's NRI plugin synchronized", self, || async {
            self.node_log().contains("synchronizing with NRI runtime")
        })
        .await;
        wait_until("the DRA socket", self, || async { self.dra_socket().exists() }).await;
    }

    /// Waits until the daemon's latest log shows `count` NRI synchronizations (one per
    /// connection to the runtime).
    async fn wait_synchronized(&self, count: usize) {
        wait_until(&format!("NRI synchronization #{count}"), self, || async {
            self.node_log().matches("synchronizing with NRI runtime").count() >= count
        })
        .await;
    }

    /// The published device whose `ifName` attribute is `if_name`.
    async fn device_name(&self, if_name: &str) -> Option<String> {
        let api: Api<ResourceSlice> = Api::all(self.api.client.clone());
        let slices = api.list(&ListParams::default()).await.ok()?.items;
        slices
            .iter()
            .filter(|s| s.spec.node_name.as_deref() == Some(self.node_name.as_str()))
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| {
                d.attributes
                    .as_ref()
                    .and_then(|a| a.get("ifName"))
                    .and_then(|a| a.string.as_deref())
                    == Some(if_name)
            })
            .map(|d| d.name.clone())
    }

    /// A DeviceClass selecting exactly the device with `if_name`, with `mode` in its config.
    async fn create_class(&self, name: &str, if_name: &str, mode: &str) {
        let class: DeviceClass = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {
                "selectors": [{"cel": {"expression": format!(
                    r#"device.driver == "{DRIVER}" && device.attributes["netclaim.dev"].ifName == "{if_name}""#
                )}}],
                "config": [{"opaque": {"driver": DRIVER, "parameters": {
                    "apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig", "mode": mode}}}],
            },
        }))
        .unwrap();
        Api::<DeviceClass>::all(self.api.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }

    /// Creates claim `name` of `class` with `config` (the claim's own NetworkConfig fields).
    async fn create_claim(&self, name: &str, class: &str, config: Value) {
        let mut parameters =
            json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"});
        let Value::Object(fields) = config else { panic!("a NetworkConfig is an object") };
        parameters.as_object_mut().unwrap().extend(fields);
        let claim: ResourceClaim = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {
                "requests": [{"name": "net", "exactly": {"deviceClassName": class}}],
                "config": [{"requests": ["net"], "opaque": {"driver": DRIVER, "parameters": parameters}}],
            }},
        }))
        .unwrap();
        self.claims().create(&PostParams::default(), &claim).await.unwrap();
    }

    fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.api.client.clone(), "default")
    }

    /// Runs allocator passes (as the scheduler would) until no claim is pending, then
    /// reserves each pod's claim for it; returns the claims as kubelet then sees them.
    async fn allocate_and_reserve(&self, pods: &[PodSpec]) -> Vec<ResourceClaim> {
        let allocator = AllocatorController::new(self.api.client.clone(), &self.node_name);
        let started = Instant::now();
        loop {
            let summary = allocator.reconcile().await.unwrap();
            if summary.pending == 0 {
                break;
            }
            assert!(
                started.elapsed() < PATIENCE,
                "claims stay unallocated: {:?}",
                allocator.pending_reasons().lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut reserved = Vec::new();
        for pod in pods {
            let consumer = ResourceClaimConsumerReference {
                resource: "pods".to_owned(),
                name: pod.name.clone(),
                uid: pod.uid.clone(),
                api_group: None,
            };
            let claim =
                reserve_for(&self.api.client, "default", &pod.claim, &consumer).await.unwrap();
            assert!(
                claim.status.as_ref().and_then(|s| s.allocation.as_ref()).is_some(),
                "claim {} is allocated",
                pod.claim
            );
            reserved.push(claim);
        }
        reserved
    }

    /// Starts the daemon on a new veth pair `<prefix><a>`/`<prefix><b>` (the first end
    /// published: as a shared parent for `macvlan`, else as an exclusive NIC) and creates a
    /// DeviceClass for it; returns the published end and the class.
    async fn node_with_device(
        &mut self,
        a: &str,
        b: &str,
        mtu: u32,
        mode: &str,
    ) -> (String, String) {
        let device = self.veth(a, b, mtu);
        let (shared, kind) =
            if mode == "macvlan" { (device.clone(), "macvlan") } else { (String::new(), "nic") };
        self.start_node(&shared, &device);
        self.wait_node_ready(&device).await;
        let class = format!("{}-{kind}", self.prefix);
        self.create_class(&class, &device, mode).await;
        (device, class)
    }

    /// One claim per pod from `class` with `config`, allocated and reserved as the scheduler
    /// would, then prepared one claim (here: one pod) per call, as kubelet prepares per pod.
    async fn prepared_claims(
        &self,
        pods: &[PodSpec],
        class: &str,
        config: &Value,
    ) -> (Vec<ResourceClaim>, Dra) {
        for pod in pods {
            self.create_claim(&pod.claim, class, config.clone()).await;
        }
        let claims = self.allocate_and_reserve(pods).await;
        let mut dra = dra_client(&self.dra_socket()).await;
        for claim in &claims {
            self.prepare(&mut dra, std::slice::from_ref(claim)).await;
        }
        (claims, dra)
    }

    /// `NodePrepareResources` for `claims`, as kubelet calls it before `RunPodSandbox`.
    async fn prepare(&self, dra: &mut Dra, claims: &[ResourceClaim]) {
        let refs: Vec<v1::Claim> = claims.iter().map(kit::claims::claim_ref).collect();
        let answer = dra
            .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: refs.clone() })
            .await
            .unwrap()
            .into_inner();
        for claim in &refs {
            let result = &answer.claims[&claim.uid];
            assert_eq!(
                result.error,
                "",
                "prepare of {}; node log:\n{}",
                claim.name,
                self.node_log()
            );
            assert_eq!(result.devices.len(), 1, "{result:?}");
        }
    }

    /// `NodeUnprepareResources`, as kubelet calls it after the pod is gone.
    async fn unprepare(&self, dra: &mut Dra, claims: &[ResourceClaim]) {
        let refs: Vec<v1::Claim> = claims.iter().map(kit::claims::claim_ref).collect();
        let answer = dra
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: refs })
            .await
            .unwrap()
            .into_inner();
        assert!(answer.claims.values().all(|c| c.error.is_empty()), "{answer:?}");
    }

    /// One sample's value from the daemon's `/metrics` (address from its log), 0 if absent.
    async fn metric(&self, sample: &str) -> f64 {
        self.metrics_text()
            .await
            .lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// The daemon's whole `/metrics` answer.
    async fn metrics_text(&self) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let log = self.node_log();
        let address = log
            .lines()
            .find(|l| l.contains("serving /metrics"))
            .and_then(|l| l.split("address=").nth(1))
            .and_then(|a| a.split_whitespace().next())
            .unwrap_or_else(|| panic!("no metrics address in the node log:\n{log}"))
            .to_owned();
        let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).await.unwrap();
        body
    }

    /// Stops the daemon and checks its state dir holds no lease, no prepared claim and no pod
    /// attachment.
    fn assert_state_empty(&self) {
        let exited = self.node.lock().unwrap().as_mut().map(|c| c.try_wait().unwrap());
        assert!(
            matches!(exited, Some(None)),
            "the daemon is not running (exit {exited:?}); log:\n{}",
            self.node_log()
        );
        self.stop_node();
        let store = Store::open(self.state_dir()).unwrap();
        let leases = store.load_leases().unwrap();
        assert!(leases.is_empty(), "leases left in the state: {leases:?}");
        let claims = store.load_all::<PreparedClaim>().unwrap();
        assert!(claims.is_empty(), "prepared claims left in the state: {claims:?}");
        let pods = store.load_all::<PodAttachment>().unwrap();
        assert!(pods.is_empty(), "pod attachments left in the state: {pods:?}");
    }

    fn print_logs(&self) {
        self.containerd.print_logs(&[]);
        for n in 1..=self.node_starts.load(Ordering::SeqCst) {
            let log = std::fs::read_to_string(self.dir().join(format!("node{n}.log")))
                .unwrap_or_default();
            println!("--- node{n}.log ---\n{log}");
        }
        let api = std::fs::read_to_string(self.dir().join("api.log")).unwrap_or_default();
        let tail: Vec<_> = api.lines().rev().take(40).collect();
        println!("--- last lines of api.log ---");
        for line in tail.into_iter().rev() {
            println!("{line}");
        }
    }
}

/// Polls `check` until it holds; on timeout fails with the daemon's log.
async fn wait_until<F, Fut>(what: &str, cluster: &Cluster, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < PATIENCE,
            "timed out waiting for {what}; node log:\n{}",
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A pod of the test and its claim.
#[derive(Debug, Clone)]
struct PodSpec {
    name: String,
    uid: String,
    claim: String,
}

impl PodSpec {
    fn new(prefix: &str, i: usize) -> Self {
        Self {
            name: format!("{prefix}-pod{i}"),
            uid: uuid::Uuid::new_v4().to_string(),
            claim: format!("{prefix}-claim{i}"),
        }
    }
}

/// A running sandbox, with an open fd of its netns so that the namespace outlives the
/// sandbox and the test can look inside after `StopPodSandbox`.
struct RunningPod {
    spec: PodSpec,
    id: String,
    netns: File,
}

impl RunningPod {
    /// A path to the netns that stays valid while we hold the fd.
    fn netns_path(&self) -> String {
        format!("/proc/{}/fd/{}", std::process::id(), self.netns.as_raw_fd())
    }
}

/// `RunPodSandbox` for `spec` (attempt `attempt`); returns the pod and the call's wall time.
async fn run_pod(
    cluster: &Cluster,
    cri: &CriClient,
    spec: &PodSpec,
    attempt: u32,
) -> Result<(RunningPod, Duration), netclaim::dev::cri::CriError> {
    let config = sandbox_config_with_attempt(&cluster.containerd, &spec.name, &spec.uid, attempt);
    let started = Instant::now();
    let id = cri.run_pod_sandbox(config, "").await?;
    let took = started.elapsed();
    let netns_path = cluster.containerd.sandbox_netns(cri, &id).await;
    let netns = File::open(&netns_path).unwrap();
    Ok((RunningPod { spec: spec.clone(), id, netns }, took))
}

/// A link as `ip -j -d addr` reports it.
#[derive(Debug, Clone)]
struct LinkInfo {
    kind: Option<String>,
    mac: String,
    mtu: u64,
    /// Global IPv4/IPv6 addresses in CIDR form.
    addresses: Vec<IpNetwork>,
}

fn parse_links(json_text: &[u8]) -> BTreeMap<String, (LinkInfo, Value)> {
    let links: Vec<Value> = serde_json::from_slice(json_text).unwrap_or_default();
    links
        .into_iter()
        .map(|link| {
            let addresses = link["addr_info"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|a| a["scope"] == "global")
                .map(|a| {
                    format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]).parse().unwrap()
                })
                .collect();
            let info = LinkInfo {
                kind: link["linkinfo"]["info_kind"].as_str().map(str::to_owned),
                mac: link["address"].as_str().unwrap_or_default().to_owned(),
                mtu: link["mtu"].as_u64().unwrap_or_default(),
                addresses,
            };
            (link["ifname"].as_str().unwrap_or_default().to_owned(), (info, link))
        })
        .collect()
}

/// The links of the netns at `netns` (a path nsenter can open).
fn links_in(netns: &str) -> BTreeMap<String, LinkInfo> {
    let output = Command::new("nsenter")
        .arg(format!("--net={netns}"))
        .args(["ip", "-j", "-d", "addr", "show"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    parse_links(&output.stdout).into_iter().map(|(name, (info, _))| (name, info)).collect()
}

/// The host netns's links, with the raw JSON (for `link`, the parent of a macvlan).
fn host_links() -> BTreeMap<String, (LinkInfo, Value)> {
    let output = kit::netns::run("ip", &["-j", "-d", "addr", "show"]);
    parse_links(&output.stdout)
}

/// Macvlan (or ipvlan) links in the host netns whose parent is `parent`.
fn host_children_of(parent: &str) -> Vec<String> {
    host_links()
        .into_iter()
        .filter(|(_, (info, raw))| {
            // A veth end also names its peer in `link`: only sub-interfaces count.
            matches!(info.kind.as_deref(), Some("macvlan" | "ipvlan"))
                && raw["link"].as_str() == Some(parent)
        })
        .map(|(name, _)| name)
        .collect()
}

/// This driver's `status.devices` entry of `claim`, once it is Ready; checks it against the
/// allocation and returns the `(ips, hardwareAddress)` it reports.
async fn wait_ready_status(
    cluster: &Cluster,
    claim: &str,
    pool: &IpNetwork,
) -> (Vec<IpNetwork>, String) {
    wait_ready_status_of(cluster, claim, pool, POD_IFNAME).await
}

/// [`wait_ready_status`] for an interface named `if_name` in the pod.
async fn wait_ready_status_of(
    cluster: &Cluster,
    claim: &str,
    pool: &IpNetwork,
    if_name: &str,
) -> (Vec<IpNetwork>, String) {
    let claims = cluster.claims();
    let started = Instant::now();
    loop {
        let current = claims.get(claim).await.unwrap();
        let status = current.status.clone().unwrap_or_default();
        let entry = status.devices.iter().flatten().find(|d| d.driver == DRIVER).cloned();
        let ready = entry.as_ref().and_then(|e| {
            e.conditions.iter().flatten().find(|c| c.type_ == "Ready" && c.status == "True")
        });
        if let (Some(entry), Some(condition)) = (entry.as_ref(), ready) {
            assert_eq!(condition.reason, "NetworkReady", "{entry:?}");
            let result = &status
                .allocation
                .as_ref()
                .unwrap()
                .devices
                .as_ref()
                .unwrap()
                .results
                .as_ref()
                .unwrap()[0];
            assert_eq!(
                (&entry.pool, &entry.device, &entry.share_id),
                (&result.pool, &result.device, &result.share_id),
                "the entry names the allocated device (and echoes the shareID)"
            );
            let data = entry.network_data.as_ref().expect("networkData");
            assert_eq!(data.interface_name.as_deref(), Some(if_name), "{entry:?}");
            let ips: Vec<IpNetwork> = data
                .ips
                .iter()
                .flatten()
                .map(|ip| ip.parse().unwrap_or_else(|e| panic!("ip {ip:?} is not CIDR: {e}")))
                .collect();
            assert!(!ips.is_empty(), "{entry:?}");
            for ip in &ips {
                assert!(pool.contains(ip.ip()), "{ip} outside the pool {pool}");
                assert_eq!(ip.prefix(), pool.prefix(), "{ip} has the pool's prefix length");
            }
            let raw = &entry.data.as_ref().expect("data").0;
            assert_eq!(raw["kind"], "NetworkStatus", "{raw}");
            assert_eq!(raw["apiVersion"], "netclaim.dev/v1alpha1", "{raw}");
            let mac = data.hardware_address.clone().expect("hardwareAddress");
            return (ips, mac);
        }
        assert!(
            started.elapsed() < PATIENCE,
            "claim {claim} never became Ready: {status:#?}\nnode log:\n{}",
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until this driver's entry of `claim` says the pod stopped: not Ready, no data and no
/// addresses of an interface that is gone.
async fn wait_stopped_status(cluster: &Cluster, claim: &str) {
    let started = Instant::now();
    loop {
        let claim = cluster.claims().get(claim).await.unwrap();
        let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
        // The dev API server's server-side apply leaves `networkData: {}` behind when
        // the applier drops the field: empty counts as gone.
        let stopped = devices.iter().any(|d| {
            d.driver == DRIVER
                && d.data.is_none()
                && d.network_data.as_ref().is_none_or(|n| {
                    n.ips.is_none() && n.interface_name.is_none() && n.hardware_address.is_none()
                })
                && d.conditions
                    .iter()
                    .flatten()
                    .any(|c| c.type_ == "Ready" && c.status == "False" && c.reason == "PodStopped")
        });
        if stopped {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the status does not say the pod stopped: {devices:#?}\nnode log:\n{}",
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the pod has `net1` with an address; returns it.
async fn wait_pod_link(cluster: &Cluster, pod: &RunningPod) -> LinkInfo {
    wait_pod_links(cluster, pod, &[POD_IFNAME]).await.remove(0)
}

/// Waits until the pod has each of `names` with an address, and no other link than those,
/// `lo` and `eth0`; returns them in the order of `names`.
async fn wait_pod_links(cluster: &Cluster, pod: &RunningPod, names: &[&str]) -> Vec<LinkInfo> {
    let started = Instant::now();
    loop {
        let links = links_in(&pod.netns_path());
        if names.iter().all(|n| links.get(*n).is_some_and(|l| !l.addresses.is_empty())) {
            let found: BTreeSet<&str> = links.keys().map(String::as_str).collect();
            let allowed: BTreeSet<&str> =
                ["lo", "eth0"].into_iter().chain(names.iter().copied()).collect();
            // `eth0` is the CNI plugin's, not ours: a sandbox whose CNI setup a containerd
            // restart interrupted has none, which is not this driver's to judge.
            assert!(
                found.is_subset(&allowed),
                "pod {}: nothing but its interfaces, lo and eth0: {found:?}",
                pod.spec.name
            );
            return names.iter().map(|n| links[*n].clone()).collect();
        }
        assert!(
            started.elapsed() < PATIENCE,
            "pod {} lacks one of {names:?} with an address; its links: {:?}\nnode log:\n{}",
            pod.spec.name,
            links.keys().collect::<Vec<_>>(),
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Stops (with the netns still held) and removes a sandbox, then checks the daemon took its
/// interface out of the namespace.
async fn stop_and_remove(cri: &CriClient, pod: &RunningPod) {
    cri.stop_pod_sandbox(&pod.id).await.unwrap();
    let left = links_in(&pod.netns_path());
    assert!(
        !left.contains_key(POD_IFNAME),
        "{POD_IFNAME} is still in pod {}'s netns after StopPodSandbox: {left:?}",
        pod.spec.name
    );
    cri.remove_pod_sandbox(&pod.id).await.unwrap();
}

fn macvlan_config(subnet: &str) -> Value {
    json!({"ipam": {"pool": {"subnet": subnet}}})
}

/// Runs `scenario` on a fresh cluster; prints the logs when it fails, then cleans up.
fn run_e2e<F>(runtime: Runtime, scenario: F)
where
    F: for<'a> FnOnce(&'a mut Cluster) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>,
{
    // Checks root as well; fails naming what is missing.
    let Some(tools) = kit::containerd::find_tools_for(runtime) else { return };
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let mut cluster = rt.block_on(Cluster::start(tools));
    let outcome = rt.block_on(AssertUnwindSafe(scenario(&mut cluster)).catch_unwind());
    if outcome.is_err() {
        cluster.print_logs();
    }
    rt.block_on(cluster.containerd.remove_all_sandboxes());
    drop(cluster);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn a_macvlan_claim_gets_its_interface_status_and_is_cleaned_up(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.1.0/24".parse().unwrap();
            let pod = PodSpec::new(&cluster.prefix, 0);
            let (claims, mut dra) = cluster
                .prepared_claims(
                    std::slice::from_ref(&pod),
                    &class,
                    &macvlan_config("10.77.1.0/24"),
                )
                .await;

            let cri = cluster.cri().await;
            let (running, took) = run_pod(cluster, &cri, &pod, 0).await.unwrap();
            eprintln!("RunPodSandbox with the macvlan attach: {took:?}");
            let link = wait_pod_link(cluster, &running).await;
            assert_eq!(link.kind.as_deref(), Some("macvlan"), "{link:?}");
            assert_eq!(link.addresses.len(), 1, "{link:?}");
            assert!(pool.contains(link.addresses[0].ip()), "{link:?}");
            let children = host_children_of(&parent);
            assert!(children.is_empty(), "no macvlan stays in the host netns: {children:?}");

            let (ips, mac) = wait_ready_status(cluster, &pod.claim, &pool).await;
            assert_eq!(ips, link.addresses, "status ips = the pod's addresses");
            assert_eq!(mac.to_lowercase(), link.mac.to_lowercase(), "hardwareAddress = link MAC");

            stop_and_remove(&cri, &running).await;
            drop(running);
            // The status follows: not Ready, and no addresses of an interface that is gone.
            wait_stopped_status(cluster, &pod.claim).await;
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty());
            assert!(host_links().contains_key(&parent), "the parent is intact");
            cluster.assert_state_empty();
        })
    });
}

fn a_host_device_claim_moves_a_veth_end_into_the_pod_and_back(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let (device, class) = cluster.node_with_device("h0", "h1", 1400, "host-device").await;
            let before = host_links()[&device].0.clone();
            let pool: IpNetwork = "10.77.2.0/24".parse().unwrap();
            let pod = PodSpec::new(&cluster.prefix, 0);
            let config =
                json!({"interface": {"mtu": 1300}, "ipam": {"pool": {"subnet": "10.77.2.0/24"}}});
            let (claims, mut dra) =
                cluster.prepared_claims(std::slice::from_ref(&pod), &class, &config).await;

            let cri = cluster.cri().await;
            let (running, took) = run_pod(cluster, &cri, &pod, 0).await.unwrap();
            eprintln!("RunPodSandbox with the host-device attach: {took:?}");
            let link = wait_pod_link(cluster, &running).await;
            assert_eq!(link.kind.as_deref(), Some("veth"), "the veth end itself: {link:?}");
            assert_eq!(link.mac, before.mac, "the same device (MAC) moved in");
            assert_eq!(link.mtu, 1300, "the claim's MTU");
            assert!(pool.contains(link.addresses[0].ip()), "{link:?}");
            assert!(!host_links().contains_key(&device), "{device} left the host netns");
            let (ips, mac) = wait_ready_status(cluster, &pod.claim, &pool).await;
            assert_eq!(ips, link.addresses);
            assert_eq!(mac.to_lowercase(), before.mac.to_lowercase());

            stop_and_remove(&cri, &running).await;
            // The netns is still held by us: the device came back because the daemon moved
            // it, under its host name and MTU.
            let hosts = host_links();
            let (back, _) = hosts.get(&device).unwrap_or_else(|| {
                panic!("{device} is not back in the host netns; node log:\n{}", cluster.node_log())
            });
            assert_eq!(
                (back.mtu, &back.mac),
                (before.mtu, &before.mac),
                "name, MTU and MAC restored"
            );
            assert!(back.addresses.is_empty(), "the pod's address did not come along: {back:?}");
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            cluster.assert_state_empty();
        })
    });
}

fn twenty_pods_on_one_parent_get_twenty_distinct_addresses(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            const PODS: usize = 20;
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.3.0/24".parse().unwrap();
            let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.3.0/24")).await;

            let cri = cluster.cri().await;
            // The baseline: pods without claims (the plugin is asked, and has nothing to do).
            let mut baseline = Vec::new();
            for i in 0..5 {
                let plain =
                    PodSpec { claim: String::new(), ..PodSpec::new(&cluster.prefix, 100 + i) };
                let (pod, took) = run_pod(cluster, &cri, &plain, 0).await.unwrap();
                baseline.push(took);
                let names: BTreeSet<String> = links_in(&pod.netns_path()).into_keys().collect();
                assert!(
                    !names.contains(POD_IFNAME),
                    "a pod without claims gets nothing: {names:?}"
                );
                stop_and_remove(&cri, &pod).await;
            }
            let mut running = Vec::new();
            let mut timings = Vec::new();
            for pod in &pods {
                let (pod, took) = run_pod(cluster, &cri, pod, 0).await.unwrap();
                timings.push(took);
                running.push(pod);
            }
            let mut addresses = BTreeSet::new();
            let mut macs = BTreeSet::new();
            for pod in &running {
                let link = wait_pod_link(cluster, pod).await;
                assert_eq!(link.addresses.len(), 1, "{link:?}");
                assert!(pool.contains(link.addresses[0].ip()));
                let (ips, mac) = wait_ready_status(cluster, &pod.spec.claim, &pool).await;
                assert_eq!(ips, link.addresses, "{}", pod.spec.name);
                assert_eq!(mac.to_lowercase(), link.mac.to_lowercase());
                addresses.insert(link.addresses[0].ip());
                macs.insert(link.mac);
            }
            assert_eq!(addresses.len(), PODS, "distinct addresses: {addresses:?}");
            assert_eq!(macs.len(), PODS, "distinct MACs");
            // Each pod was attached once, on its RunPodSandbox; the daemon's own attach time.
            let attaches =
                cluster.metric(r#"netclaim_attach_duration_seconds_count{mode="macvlan"}"#).await;
            let attach_seconds =
                cluster.metric(r#"netclaim_attach_duration_seconds_sum{mode="macvlan"}"#).await;
            let expected = f64::from(u32::try_from(PODS).unwrap());
            assert!(
                (attaches - expected).abs() < f64::EPSILON,
                "{attaches} attaches for {PODS} pods"
            );
            eprintln!(
                "daemon attach time (event received -> link configured), mean over {PODS}: {:.1} ms",
                attach_seconds * 1000.0 / attaches
            );
            let ms: Vec<u128> = timings.iter().map(Duration::as_millis).collect();
            eprintln!(
                "RunPodSandbox wall time of 5 pods without claims (baseline): median {:?}",
                median(baseline)
            );
            eprintln!(
                "RunPodSandbox wall time with the netclaim NRI attach over {PODS} pods: median {:?}, max {:?} (ms: {ms:?})",
                median(timings.clone()),
                timings.iter().max().unwrap()
            );

            for pod in &running {
                stop_and_remove(&cri, pod).await;
            }
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty());
            cluster.assert_state_empty();
        })
    });
}

fn kill_9_during_a_burst_loses_nothing_and_leaks_nothing(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            const PODS: usize = 10;
            const KILL_AFTER: usize = 3;
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.4.0/24".parse().unwrap();
            let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.4.0/24")).await;

            // The burst: all sandboxes at once, as kubelet does for pods scheduled together;
            // kill -9 of the daemon as soon as it has received three RunPodSandbox events
            // (its debug log line), or three sandboxes are up, whichever is first. containerd
            // sends the events of different sandboxes concurrently, so the kill lands while
            // attaches are in progress and the other sandboxes are still in flight.
            let cri = cluster.cri().await;
            let cluster: &Cluster = cluster;
            let done = AtomicUsize::new(0);
            let burst = futures::future::join_all(pods.iter().map(|pod| {
                let (cri, done) = (&cri, &done);
                async move {
                    let result = run_pod(cluster, cri, pod, 0).await;
                    done.fetch_add(1, Ordering::SeqCst);
                    result
                }
            }));
            let killer = async {
                let started = Instant::now();
                while done.load(Ordering::SeqCst) < KILL_AFTER
                    && cluster.node_log().matches("event=RunPodSandbox").count() < KILL_AFTER
                {
                    assert!(started.elapsed() < PATIENCE, "no sandbox of the burst finished");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                cluster.kill_node();
                done.load(Ordering::SeqCst)
            };
            let (results, done_at_kill) = tokio::join!(burst, killer);
            eprintln!("kill -9 with {done_at_kill} of {PODS} sandboxes done");
            assert!(done_at_kill < PODS, "the kill came after the burst");

            // The daemon comes back on the same state; kubelet retries the failed sandboxes.
            cluster.restart_node();
            cluster.wait_node_ready(&parent).await;
            let mut running = Vec::new();
            let mut retried = Vec::new();
            for (pod, result) in pods.iter().zip(results) {
                match result {
                    Ok((pod, _)) => running.push(pod),
                    Err(err) => {
                        eprintln!("sandbox of {} failed during the kill: {err}", pod.name);
                        retried.push(pod.name.clone());
                        running.push(run_pod(cluster, &cri, pod, 1).await.unwrap().0);
                    }
                }
            }
            eprintln!("retried after the restart: {retried:?}");
            let listed = cri.list_pod_sandbox(None).await.unwrap();
            let ready = listed.iter().filter(|s| s.state == 0).count();
            assert_eq!(ready, PODS, "one ready sandbox per pod: {listed:?}");

            // Every running pod has its interface; no address twice.
            let mut addresses = BTreeSet::new();
            for pod in &running {
                let link = wait_pod_link(cluster, pod).await;
                assert_eq!(link.addresses.len(), 1, "{}: {link:?}", pod.spec.name);
                assert!(pool.contains(link.addresses[0].ip()));
                let (ips, mac) = wait_ready_status(cluster, &pod.spec.claim, &pool).await;
                assert_eq!(ips, link.addresses, "{}", pod.spec.name);
                assert_eq!(mac.to_lowercase(), link.mac.to_lowercase());
                assert!(
                    addresses.insert(link.addresses[0].ip()),
                    "{} got an address another pod has: {link:?}",
                    pod.spec.name
                );
            }
            assert!(host_children_of(&parent).is_empty(), "no half-made macvlan in the host");

            for pod in &running {
                stop_and_remove(&cri, pod).await;
            }
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty(), "no leaked link");
            let hosts = host_links();
            let (parent_link, _) = hosts.get(&parent).expect("the parent is intact");
            assert_eq!(parent_link.mtu, 1500);
            cluster.assert_state_empty();
        })
    });
}

fn pods_stopped_while_the_daemon_is_down_are_cleaned_up_after_a_restart(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            const PODS: usize = 3;
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.5.0/24".parse().unwrap();
            let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.5.0/24")).await;
            let cri = cluster.cri().await;
            let mut running = Vec::new();
            for pod in &pods {
                let (pod, _) = run_pod(cluster, &cri, pod, 0).await.unwrap();
                wait_pod_link(cluster, &pod).await;
                wait_ready_status(cluster, &pod.spec.claim, &pool).await;
                running.push(pod);
            }

            // The daemon dies; kubelet stops and removes the pods meanwhile (containerd runs
            // them down without the plugin, and the namespaces go with the sandboxes: the
            // test lets go of them first).
            cluster.kill_node();
            let ids: Vec<String> = running.drain(..).map(|pod| pod.id).collect();
            for id in &ids {
                cri.stop_pod_sandbox(id).await.unwrap();
                cri.remove_pod_sandbox(id).await.unwrap();
            }

            // Back up: Synchronize lists none of them, so their records are dropped; kubelet
            // then unprepares the claims, which releases the addresses.
            cluster.restart_node();
            cluster.wait_node_ready(&parent).await;
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty(), "no leaked link");
            assert!(host_links().contains_key(&parent), "the parent is intact");
            cluster.assert_state_empty();
        })
    });
}

fn a_host_device_comes_back_at_stop_after_a_daemon_restart(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let (device, class) = cluster.node_with_device("h0", "h1", 1400, "host-device").await;
            let before = host_links()[&device].0.clone();
            let pool: IpNetwork = "10.77.6.0/24".parse().unwrap();
            let pod = PodSpec::new(&cluster.prefix, 0);
            let config =
                json!({"interface": {"mtu": 1300}, "ipam": {"pool": {"subnet": "10.77.6.0/24"}}});
            let (claims, mut dra) =
                cluster.prepared_claims(std::slice::from_ref(&pod), &class, &config).await;
            let cri = cluster.cri().await;
            let (running, _) = run_pod(cluster, &cri, &pod, 0).await.unwrap();
            let link = wait_pod_link(cluster, &running).await;
            wait_ready_status(cluster, &pod.claim, &pool).await;

            // kill -9 and restart while the pod runs: the pod keeps its device (same link,
            // same address), and the new daemon still knows how to give it back.
            cluster.kill_node();
            cluster.restart_node();
            cluster.wait_node_ready(&device).await;
            let after = wait_pod_link(cluster, &running).await;
            assert_eq!((&after.mac, &after.addresses), (&link.mac, &link.addresses));
            assert!(!host_links().contains_key(&device));

            stop_and_remove(&cri, &running).await;
            let hosts = host_links();
            let (back, _) = hosts.get(&device).unwrap_or_else(|| {
                panic!("{device} is not back in the host netns; node log:\n{}", cluster.node_log())
            });
            assert_eq!(
                (back.mtu, &back.mac),
                (before.mtu, &before.mac),
                "name, MTU and MAC restored"
            );
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            cluster.assert_state_empty();
        })
    });
}

fn a_containerd_restart_keeps_the_interfaces_and_unprepare_still_cleans_up(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            const PODS: usize = 3;
            let (parent, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.7.0/24".parse().unwrap();
            let pods: Vec<PodSpec> = (0..PODS).map(|i| PodSpec::new(&cluster.prefix, i)).collect();
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.7.0/24")).await;
            let cri = cluster.cri().await;
            let mut before_restart = Vec::new();
            for pod in &pods[..2] {
                let (pod, _) = run_pod(cluster, &cri, pod, 0).await.unwrap();
                let link = wait_pod_link(cluster, &pod).await;
                before_restart.push((pod, link));
            }

            // containerd restarts (the pods' shims keep running); the daemon reconnects and
            // is synchronized with both pods, which keep their interfaces.
            cluster.containerd.stop();
            cluster.containerd.start();
            let cri = cluster.cri().await;
            cluster.wait_synchronized(2).await;
            for (pod, link) in &before_restart {
                let after = wait_pod_link(cluster, pod).await;
                assert_eq!((&after.mac, &after.addresses), (&link.mac, &link.addresses));
            }

            // A pod started by the new containerd is attached and detached as usual.
            let (third, _) = run_pod(cluster, &cri, &pods[2], 0).await.unwrap();
            let link = wait_pod_link(cluster, &third).await;
            let (ips, _) = wait_ready_status(cluster, &pods[2].claim, &pool).await;
            assert_eq!(ips, link.addresses);
            stop_and_remove(&cri, &third).await;
            drop(third);

            // containerd 1.7 sends no NRI stop/remove for a sandbox it did not run since it
            // started (see nri_containerd): the first two pods go away unannounced. The test
            // lets go of their namespaces, as nothing else would hold them.
            for (pod, _) in before_restart.drain(..) {
                let id = pod.id.clone();
                drop(pod);
                cri.stop_pod_sandbox(&id).await.unwrap();
                cri.remove_pod_sandbox(&id).await.unwrap();
            }
            // kubelet unprepares the claims: addresses, claims and pod records all go.
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty(), "no leaked link");
            cluster.assert_state_empty();
        })
    });
}

fn a_pod_with_two_claims_gets_net1_and_net2_in_claim_order(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let parent = cluster.veth("p0", "p1", 1500);
            let device = cluster.veth("h0", "h1", 1400);
            cluster.start_node(&parent, &format!("{parent},{device}"));
            cluster.wait_node_ready(&parent).await;
            cluster.wait_node_ready(&device).await;
            let shared = format!("{}-macvlan", cluster.prefix);
            cluster.create_class(&shared, &parent, "macvlan").await;
            let nic = format!("{}-nic", cluster.prefix);
            cluster.create_class(&nic, &device, "host-device").await;
            let (pool_a, pool_b): (IpNetwork, IpNetwork) =
                ("10.77.8.0/24".parse().unwrap(), "10.77.9.0/24".parse().unwrap());
            // One pod, two claims: `…-a` (macvlan) sorts before `…-b` (host-device).
            let first = PodSpec {
                claim: format!("{}-a", cluster.prefix),
                ..PodSpec::new(&cluster.prefix, 0)
            };
            let second = PodSpec { claim: format!("{}-b", cluster.prefix), ..first.clone() };
            cluster.create_claim(&second.claim, &nic, macvlan_config("10.77.9.0/24")).await;
            cluster.create_claim(&first.claim, &shared, macvlan_config("10.77.8.0/24")).await;
            let claims = cluster.allocate_and_reserve(&[first.clone(), second.clone()]).await;
            let mut dra = dra_client(&cluster.dra_socket()).await;
            cluster.prepare(&mut dra, &claims).await;

            let cri = cluster.cri().await;
            let (running, _) = run_pod(cluster, &cri, &first, 0).await.unwrap();
            let links = wait_pod_links(cluster, &running, &["net1", "net2"]).await;
            assert_eq!(links[0].kind.as_deref(), Some("macvlan"), "net1 is claim a: {links:?}");
            assert_eq!(links[1].kind.as_deref(), Some("veth"), "net2 is claim b: {links:?}");
            let (ips_a, _) = wait_ready_status_of(cluster, &first.claim, &pool_a, "net1").await;
            let (ips_b, _) = wait_ready_status_of(cluster, &second.claim, &pool_b, "net2").await;
            assert_eq!((ips_a, ips_b), (links[0].addresses.clone(), links[1].addresses.clone()));

            cri.stop_pod_sandbox(&running.id).await.unwrap();
            let left = links_in(&running.netns_path());
            assert!(!left.contains_key("net1") && !left.contains_key("net2"), "{left:?}");
            assert_eq!(host_links()[&device].0.mtu, 1400, "{device} is back");
            cri.remove_pod_sandbox(&running.id).await.unwrap();
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            assert!(host_children_of(&parent).is_empty());
            cluster.assert_state_empty();
        })
    });
}

fn a_failed_attach_fails_the_sandbox_with_a_reason_and_a_retry_succeeds(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let (device, class) = cluster.node_with_device("h0", "h1", 1400, "host-device").await;
            let peer = format!("{}h1", cluster.prefix);
            let pool: IpNetwork = "10.77.11.0/24".parse().unwrap();
            let pod = PodSpec::new(&cluster.prefix, 0);
            let (claims, mut dra) = cluster
                .prepared_claims(
                    std::slice::from_ref(&pod),
                    &class,
                    &macvlan_config("10.77.11.0/24"),
                )
                .await;

            // The device vanishes between prepare and the sandbox: the attach fails, and so
            // does the sandbox (kubelet retries it), with the reason on the claim and the Pod.
            kit::netns::run("ip", &["link", "del", &device]);
            let cri = cluster.cri().await;
            let err = run_pod(cluster, &cri, &pod, 0).await.err().expect("the sandbox fails");
            let message = err.to_string();
            assert!(message.contains(&device), "the error names the device: {message}");
            eprintln!("RunPodSandbox without the device: {message}");
            let started = Instant::now();
            loop {
                let claim = cluster.claims().get(&pod.claim).await.unwrap();
                let devices = claim.status.and_then(|s| s.devices).unwrap_or_default();
                let failed = devices.iter().find_map(|d| {
                    d.conditions
                        .iter()
                        .flatten()
                        .find(|c| c.type_ == "Ready" && c.status == "False")
                });
                if let Some(condition) = failed {
                    assert_eq!(condition.reason, "AttachFailed", "{condition:?}");
                    assert!(condition.message.contains(&device), "{condition:?}");
                    break;
                }
                assert!(started.elapsed() < PATIENCE, "no failure in the status: {devices:#?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(cluster.api.client.clone(), "default");
            wait_until("a Warning Event on the Pod", cluster, || async {
                let list = events.list(&ListParams::default()).await.unwrap().items;
                list.iter().any(|e| {
                    e.reason.as_deref() == Some("AttachFailed")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.uid.as_deref())
                            == Some(pod.uid.as_str())
                })
            })
            .await;
            assert!(
                cri.list_pod_sandbox(None).await.unwrap().is_empty(),
                "containerd removed the failed sandbox"
            );

            // The device is back (same name): kubelet's next attempt gets it.
            kit::netns::run("ip", &["link", "add", &device, "type", "veth", "peer", "name", &peer]);
            kit::netns::run("ip", &["link", "set", &device, "mtu", "1400", "up"]);
            let (running, _) = run_pod(cluster, &cri, &pod, 1).await.unwrap();
            let link = wait_pod_link(cluster, &running).await;
            assert_eq!(link.kind.as_deref(), Some("veth"));
            let (ips, _) = wait_ready_status(cluster, &pod.claim, &pool).await;
            assert_eq!(ips, link.addresses);
            stop_and_remove(&cri, &running).await;
            assert_eq!(host_links()[&device].0.mtu, 1400, "{device} is back");
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            cluster.assert_state_empty();
        })
    });
}

fn no_container_starts_while_the_pod_lacks_its_interface(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let (device, class) = cluster.node_with_device("h0", "h1", 1400, "host-device").await;
            let peer = format!("{}h1", cluster.prefix);
            let pool: IpNetwork = "10.77.12.0/24".parse().unwrap();
            let pod = PodSpec::new(&cluster.prefix, 0);
            let (claims, mut dra) = cluster
                .prepared_claims(
                    std::slice::from_ref(&pod),
                    &class,
                    &macvlan_config("10.77.12.0/24"),
                )
                .await;

            // The sandbox starts while the daemon is down (no plugin: containerd runs it
            // without), and the device is gone when the daemon comes back, so the reconcile
            // cannot attach it.
            cluster.kill_node();
            let cri = cluster.cri().await;
            let (running, _) = run_pod(cluster, &cri, &pod, 0).await.unwrap();
            kit::netns::run("ip", &["link", "del", &device]);
            cluster.restart_node();
            cluster.wait_synchronized(1).await;
            assert!(!links_in(&running.netns_path()).contains_key(POD_IFNAME));

            // kubelet's CreateContainer is refused while the interface is missing...
            let config = cluster.containerd.sandbox_config(&pod.name, &pod.uid);
            let container = kit::containerd::container_config("app");
            let err = cri
                .create_container(&running.id, container.clone(), config.clone())
                .await
                .expect_err("no container without the pod's interface");
            let message = err.to_string();
            assert!(message.contains(&device), "the refusal names the device: {message}");
            eprintln!("CreateContainer refused: {message}");

            // ...and its retry, once the device is back, attaches it and creates the container.
            kit::netns::run("ip", &["link", "add", &device, "type", "veth", "peer", "name", &peer]);
            kit::netns::run("ip", &["link", "set", &device, "mtu", "1400", "up"]);
            let id = cri.create_container(&running.id, container, config).await.unwrap();
            assert!(!id.is_empty());
            let link = wait_pod_link(cluster, &running).await;
            assert_eq!(link.kind.as_deref(), Some("veth"));
            let (ips, _) = wait_ready_status(cluster, &pod.claim, &pool).await;
            assert_eq!(ips, link.addresses);
            cri.remove_container(&id).await.unwrap();
            stop_and_remove(&cri, &running).await;
            assert_eq!(host_links()[&device].0.mtu, 1400, "{device} is back");
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            cluster.assert_state_empty();
        })
    });
}

fn a_claim_with_a_name_static_address_mtu_and_route_gets_exactly_that(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let (_, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pod = PodSpec::new(&cluster.prefix, 0);
            let config = json!({
                "interface": {"name": "data0", "mtu": 1400, "hardwareAddress": "02:00:00:00:aa:01"},
                "ipam": {"addresses": ["192.168.77.5/24"]},
                "routes": [{"destination": "10.99.0.0/16", "gateway": "192.168.77.1"}],
            });
            let (claims, mut dra) =
                cluster.prepared_claims(std::slice::from_ref(&pod), &class, &config).await;
            let cri = cluster.cri().await;
            let (running, _) = run_pod(cluster, &cri, &pod, 0).await.unwrap();
            let link = wait_pod_links(cluster, &running, &["data0"]).await.remove(0);
            assert_eq!(link.mtu, 1400, "{link:?}");
            assert_eq!(link.mac, "02:00:00:00:aa:01", "{link:?}");
            assert_eq!(link.addresses, vec!["192.168.77.5/24".parse::<IpNetwork>().unwrap()]);
            let output = Command::new("nsenter")
                .arg(format!("--net={}", running.netns_path()))
                .args(["ip", "-j", "route", "show", "10.99.0.0/16"])
                .output()
                .unwrap();
            let routes: Vec<Value> = serde_json::from_slice(&output.stdout).unwrap();
            assert_eq!(routes.len(), 1, "{routes:?}");
            assert_eq!(
                (&routes[0]["gateway"], &routes[0]["dev"]),
                (&json!("192.168.77.1"), &json!("data0"))
            );
            let pool: IpNetwork = "192.168.77.0/24".parse().unwrap();
            let (ips, mac) = wait_ready_status_of(cluster, &pod.claim, &pool, "data0").await;
            assert_eq!(ips, link.addresses);
            assert_eq!(mac, "02:00:00:00:aa:01");
            let claim = cluster.claims().get(&pod.claim).await.unwrap();
            let entry = claim.status.unwrap().devices.unwrap().remove(0);
            let data = entry.data.unwrap().0;
            assert_eq!(data["mtu"], 1400, "{data}");
            assert_eq!(data["routes"][0]["destination"], "10.99.0.0/16", "{data}");

            cri.stop_pod_sandbox(&running.id).await.unwrap();
            assert!(!links_in(&running.netns_path()).contains_key("data0"));
            cri.remove_pod_sandbox(&running.id).await.unwrap();
            drop(running);
            cluster.unprepare(&mut dra, &claims).await;
            cluster.assert_state_empty();
        })
    });
}

/// The first document of a device metadata stream (the newest API version).
fn first_metadata_document(stream: &[u8]) -> Value {
    let text = String::from_utf8_lossy(stream);
    let first = text.lines().next().unwrap_or_else(|| panic!("an empty metadata file"));
    serde_json::from_str(first).unwrap_or_else(|e| panic!("metadata {text:?}: {e}"))
}

fn a_container_reads_its_interface_from_the_device_metadata_file(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            let (_, class) = cluster.node_with_device("p0", "p1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.14.0/24".parse().unwrap();
            let pod = PodSpec::new(&cluster.prefix, 0);
            cluster.create_claim(&pod.claim, &class, macvlan_config("10.77.14.0/24")).await;
            let claims = cluster.allocate_and_reserve(std::slice::from_ref(&pod)).await;
            let uid = claims[0].metadata.uid.clone().unwrap();
            let mut dra = dra_client(&cluster.dra_socket()).await;
            let answer = dra
                .node_prepare_resources(v1::NodePrepareResourcesRequest {
                    claims: vec![kit::claims::claim_ref(&claims[0])],
                })
                .await
                .unwrap()
                .into_inner();
            let prepared = &answer.claims[&uid];
            assert_eq!(prepared.error, "", "{prepared:?}");
            let device = &prepared.devices[0];
            assert_eq!(device.request_names, ["net"]);
            assert_eq!(device.cdi_device_ids, [format!("{DRIVER}/metadata={uid}_net")]);
            let host_file = cluster.dir().join(format!(
                "plugin/dra-device-metadata/default_{}/net/metadata.json",
                pod.claim
            ));
            let spec =
                cluster.containerd.cdi_dir().join(format!("{DRIVER}_metadata_{uid}_net.json"));
            assert!(host_file.exists() && spec.exists(), "metadata written at prepare");

            let cri = cluster.cri().await;
            let (running, _) = run_pod(cluster, &cri, &pod, 0).await.unwrap();
            let link = wait_pod_link(cluster, &running).await;
            let (ips, mac) = wait_ready_status(cluster, &pod.claim, &pool).await;

            // kubelet's CreateContainer for a container listing the claim (request `net`):
            // the device's CDI ids go along, and the runtime resolves them from its spec dir.
            let mut container = kit::containerd::container_config("app");
            container.cdi_devices = device
                .cdi_device_ids
                .iter()
                .map(|name| netclaim::dev::cri::proto::CdiDevice { name: name.clone() })
                .collect();
            let sandbox = cluster.containerd.sandbox_config(&pod.name, &pod.uid);
            let id = cri.create_container(&running.id, container, sandbox).await.unwrap();
            cri.start_container(&id).await.unwrap();
            let path = format!(
                "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/{}/net/{DRIVER}-metadata.json",
                pod.claim
            );
            let read = cri.exec_sync(&id, &["/cat", &path], Duration::from_secs(20)).await.unwrap();
            assert_eq!(
                read.exit_code,
                0,
                "cat {path} in the container: {}",
                String::from_utf8_lossy(&read.stderr)
            );
            let inside = first_metadata_document(&read.stdout);
            assert_eq!(inside["apiVersion"], "metadata.resource.k8s.io/v1beta1", "{inside}");
            assert_eq!(inside["kind"], "DeviceMetadata");
            assert_eq!(inside["metadata"]["name"], pod.claim.as_str());
            assert_eq!(inside["metadata"]["uid"], uid.as_str());
            let generation = inside["metadata"]["generation"].as_i64().unwrap();
            assert!(generation >= 2, "rewritten after the attach: {inside}");
            let entry = &inside["requests"][0];
            assert_eq!(entry["name"], "net");
            let found = &entry["devices"][0];
            assert_eq!(found["driver"], DRIVER);
            assert_eq!(
                found["attributes"]["netclaim.dev/ifName"]["string"],
                cluster.links[0].a.as_str()
            );
            let data = &found["networkData"];
            assert_eq!(data["interfaceName"], POD_IFNAME, "{inside}");
            let inside_ips: Vec<IpNetwork> = data["ips"]
                .as_array()
                .unwrap()
                .iter()
                .map(|ip| ip.as_str().unwrap().parse().unwrap())
                .collect();
            assert_eq!(inside_ips, ips, "the file's ips are the status's");
            assert_eq!(inside_ips, link.addresses, "and the pod's");
            let inside_mac = data["hardwareAddress"].as_str().unwrap().to_lowercase();
            assert_eq!(inside_mac, mac.to_lowercase());
            assert_eq!(inside_mac, link.mac.to_lowercase());
            // Read-only inside the container.
            let mounts = cri
                .exec_sync(&id, &["/cat", "/proc/self/mountinfo"], Duration::from_secs(20))
                .await
                .unwrap();
            let mounts = String::from_utf8_lossy(&mounts.stdout);
            let mount =
                mounts.lines().find(|l| l.contains(&path)).unwrap_or_else(|| panic!("{mounts}"));
            assert!(
                mount.split_whitespace().nth(5).is_some_and(|o| o.split(',').any(|f| f == "ro")),
                "{mount}"
            );

            cri.stop_container(&id, Duration::from_secs(2)).await.unwrap();
            cri.remove_container(&id).await.unwrap();
            stop_and_remove(&cri, &running).await;
            drop(running);
            wait_stopped_status(cluster, &pod.claim).await;
            // At stop the file lost the interface, with a higher generation, in place.
            let stopped = first_metadata_document(&std::fs::read(&host_file).unwrap());
            assert!(stopped["metadata"]["generation"].as_i64().unwrap() > generation, "{stopped}");
            assert!(stopped["requests"][0]["devices"][0].get("networkData").is_none(), "{stopped}");
            cluster.unprepare(&mut dra, &claims).await;
            assert!(!host_file.exists() && !spec.exists(), "metadata removed at unprepare");
            cluster.assert_state_empty();
        })
    });
}

/// `data.stats` of `claim`'s entry once `check` accepts it.
async fn wait_stats(cluster: &Cluster, claim: &str, check: impl Fn(&Value) -> bool) -> Value {
    let claims = cluster.claims();
    let started = Instant::now();
    loop {
        let current = claims.get(claim).await.unwrap();
        let stats = current
            .status
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.iter().find(|e| e.driver == DRIVER))
            .and_then(|e| e.data.as_ref())
            .and_then(|d| d.0.get("stats").cloned());
        if let Some(stats) = stats.filter(|s| check(s)) {
            return stats;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "claim {claim}: no matching data.stats: {:#?}\nnode log:\n{}",
            current.status,
            cluster.node_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn traffic_between_two_pods_shows_in_both_claims_and_in_metrics(runtime: Runtime) {
    run_e2e(runtime, |cluster| {
        Box::pin(async move {
            cluster.enable_stats("1s");
            let (_parent, class) = cluster.node_with_device("s0", "s1", 1500, "macvlan").await;
            let pool: IpNetwork = "10.77.9.0/24".parse().unwrap();
            let pods = [PodSpec::new(&cluster.prefix, 0), PodSpec::new(&cluster.prefix, 1)];
            let (claims, mut dra) =
                cluster.prepared_claims(&pods, &class, &macvlan_config("10.77.9.0/24")).await;
            let cri = cluster.cri().await;
            let (a, _) = run_pod(cluster, &cri, &pods[0], 0).await.unwrap();
            let (b, _) = run_pod(cluster, &cri, &pods[1], 0).await.unwrap();
            let (b_ips, _) = wait_ready_status(cluster, &pods[1].claim, &pool).await;
            wait_ready_status(cluster, &pods[0].claim, &pool).await;
            // Counters hook on after the answer: wait until both interfaces carry them before
            // the traffic that must be counted.
            let bpffs =
                cluster.bpffs.as_ref().unwrap().path.join("netclaim").join(&cluster.node_name);
            wait_until("counters pinned for both pods", cluster, || async {
                [&pods[0].uid, &pods[1].uid]
                    .iter()
                    .all(|uid| bpffs.join(uid.as_str()).join(POD_IFNAME).join("counters").exists())
            })
            .await;
            let ping = Command::new("nsenter")
                .arg(format!("--net={}", a.netns_path()))
                .args(["ping", "-q", "-c", "10", "-i", "0.05", "-W", "2"])
                .arg(b_ips[0].ip().to_string())
                .output()
                .unwrap();
            assert!(ping.status.success(), "ping a -> b: {ping:?}");

            let sent = wait_stats(cluster, &pods[0].claim, |s| {
                s["protocols"]["icmp"]["txPackets"].as_u64() >= Some(10)
            })
            .await;
            let got = wait_stats(cluster, &pods[1].claim, |s| {
                s["protocols"]["icmp"]["rxPackets"].as_u64() >= Some(10)
            })
            .await;
            eprintln!("a: {sent}\nb: {got}");
            assert!(sent["txBytes"].as_u64().unwrap() >= 10 * 84, "{sent}");
            assert!(got["txPackets"].as_u64().unwrap() >= 10, "b answered: {got}");
            assert!(sent["collectedAt"].as_str().is_some_and(|t| t.ends_with('Z')), "{sent}");

            let series = |pod: &PodSpec, claim: &str| {
                format!(
                    "netclaim_interface_tx_packets_total{{namespace=\"default\",pod=\"{}\",claim=\"{claim}\",interface=\"{POD_IFNAME}\"}}",
                    pod.name
                )
            };
            let a_series = series(&pods[0], &pods[0].claim);
            wait_until("the traffic in /metrics", cluster, || async {
                cluster.metric(&a_series).await >= 10.0
            })
            .await;

            for pod in [&a, &b] {
                stop_and_remove(&cri, pod).await;
            }
            drop((a, b));
            // The families stay declared (`# HELP`/`# TYPE`) with no interface: only their
            // samples go.
            wait_until("the series gone with the interfaces", cluster, || async {
                !cluster.metrics_text().await.lines().any(|l| l.starts_with("netclaim_interface_"))
            })
            .await;
            wait_until("the pins gone", cluster, || async {
                std::fs::read_dir(&bpffs).map_or(0, Iterator::count) == 0
            })
            .await;
            cluster.unprepare(&mut dra, &claims).await;
            cluster.assert_state_empty();
        })
    });
}

/// Each scenario as a test on each runtime: `containerd_1_7::<name>`, `containerd_2_1::<name>`.
macro_rules! on_each_runtime {
    ($($name:ident),* $(,)?) => {
        mod containerd_1_7 {
            $(
                #[test]
                #[ignore = "needs root: run `make test` as root"]
                fn $name() {
                    super::$name(super::Runtime::Containerd17);
                }
            )*
        }
        mod containerd_2_1 {
            $(
                #[test]
                #[ignore = "needs root: run `make test` as root"]
                fn $name() {
                    super::$name(super::Runtime::Containerd21);
                }
            )*
        }
    };
}

on_each_runtime!(
    a_macvlan_claim_gets_its_interface_status_and_is_cleaned_up,
    a_host_device_claim_moves_a_veth_end_into_the_pod_and_back,
    twenty_pods_on_one_parent_get_twenty_distinct_addresses,
    kill_9_during_a_burst_loses_nothing_and_leaks_nothing,
    pods_stopped_while_the_daemon_is_down_are_cleaned_up_after_a_restart,
    a_host_device_comes_back_at_stop_after_a_daemon_restart,
    a_containerd_restart_keeps_the_interfaces_and_unprepare_still_cleans_up,
    a_pod_with_two_claims_gets_net1_and_net2_in_claim_order,
    a_failed_attach_fails_the_sandbox_with_a_reason_and_a_retry_succeeds,
    no_container_starts_while_the_pod_lacks_its_interface,
    a_claim_with_a_name_static_address_mtu_and_route_gets_exactly_that,
    a_container_reads_its_interface_from_the_device_metadata_file,
    traffic_between_two_pods_shows_in_both_claims_and_in_metrics,
);
