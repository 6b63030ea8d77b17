//! The containerd end-to-end harness (`tests/containerd/e2e_containerd.rs`, its `chaos` and
//! `scale` scenarios, and `benches/scale.rs`): one world per test, [`Cluster`] (a private
//! containerd 2.1 or 1.7 with NRI, `netclaim dev --api-only`, the node daemon as a child
//! process, the test's veth pairs), and the pod helpers of [`pods`] (sandboxes through CRI,
//! their links read back with `ip -j`, claim statuses). Everything is removed on drop, also
//! when a test fails: sandboxes, shims, mounts, network namespaces, the veth pairs (which take
//! any macvlan child along).
//!
//! Needs root and `scripts/setup/containerd.sh` (see [`crate::containerd`]).

use std::fs::File;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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

use crate as kit;
use crate::claims::{DevApi, dra_client};
use crate::containerd::Containerd;

pub mod pods;
pub use pods::*;

pub use crate::DRIVER;
/// Bound for "eventually" (the daemon reacts in milliseconds; the bound only keeps a broken
/// build from hanging, and is generous because four builds may share two cores).
pub const PATIENCE: Duration = Duration::from_mins(1);
/// containerd's per-call bound for NRI plugins. Its default is 2 s; a loaded test machine
/// gets more, so that a slow moment is not mistaken for a broken plugin (containerd drops a
/// plugin that misses it).
pub const NRI_TIMEOUT: Duration = Duration::from_secs(5);
/// The pod-side name of the first claim of a pod (DESIGN §3: `net1`, `net2`, …).
pub const POD_IFNAME: &str = "net1";

pub type Dra = v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>;

/// A veth pair in the host netns with generated names; both ends are deleted on drop (if one
/// end is in a pod, deleting the other removes the pair; a macvlan on it goes with it).
pub struct HostVeth {
    pub a: String,
    pub b: String,
}

impl HostVeth {
    pub fn new(a: String, b: String, mtu: u32) -> Self {
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
pub struct Cluster {
    pub node: Mutex<Option<std::process::Child>>,
    pub containerd: Containerd,
    pub links: Vec<HostVeth>,
    pub api: DevApi,
    /// `nc<6 hex>`: the prefix of every interface and object name of this test.
    pub prefix: String,
    pub node_name: String,
    pub node_args: Vec<String>,
    pub node_starts: AtomicU32,
    /// The daemon binary (the test build unless a scenario runs the release one).
    pub node_binary: PathBuf,
    /// The kubeconfig the daemon uses (the API server's own unless a test puts a proxy
    /// between them).
    pub node_kubeconfig: Option<PathBuf>,
    /// A bpffs of the test's own when the scenario turns traffic counters on (otherwise the
    /// daemon runs with `--bpffs=` and hooks nothing).
    pub bpffs: Option<PrivateBpffs>,
    /// The CPU cgroup every start of the daemon is moved into (a DaemonSet pod's own cgroup,
    /// [`kit::cgroup`]); `None`: the daemon stays in the test's.
    pub node_cgroup: Option<std::sync::Arc<kit::cgroup::CpuGroup>>,
}

/// A bpffs mounted in the test's dir, unmounted on drop.
pub struct PrivateBpffs {
    pub path: PathBuf,
    /// `--stats-interval` of the daemon.
    pub interval: String,
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        let _ = Command::new("umount").args(["-l"]).arg(&self.path).status();
    }
}

impl Cluster {
    pub async fn start(tools: kit::containerd::Tools) -> Self {
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
            node_binary: PathBuf::from(crate::netclaim_bin()),
            node_kubeconfig: None,
            bpffs: None,
            node_cgroup: None,
        }
    }

    pub async fn cri(&self) -> CriClient {
        self.containerd.cri(Duration::from_mins(2)).await
    }

    /// A veth pair `<prefix><a>` / `<prefix><b>`; returns the first name.
    pub fn veth(&mut self, a: &str, b: &str, mtu: u32) -> String {
        let (a, b) = (format!("{}{a}", self.prefix), format!("{}{b}", self.prefix));
        assert!(a.len() <= 15 && b.len() <= 15);
        self.links.push(HostVeth::new(a.clone(), b, mtu));
        a
    }

    pub fn dir(&self) -> &Path {
        self.api.dir()
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir().join("state")
    }

    pub fn dra_socket(&self) -> PathBuf {
        self.dir().join("plugin/dra.sock")
    }

    /// The log of the daemon's latest start.
    pub fn node_log(&self) -> String {
        let n = self.node_starts.load(Ordering::SeqCst);
        std::fs::read_to_string(self.dir().join(format!("node{n}.log"))).unwrap_or_default()
    }

    /// Turns traffic counters on for the next [`Self::start_node`]: a bpffs of the test's
    /// own, the claim status refreshed every `interval` (`--stats-interval`).
    pub fn enable_stats(&mut self, interval: &str) {
        let path = self.dir().join("bpf");
        std::fs::create_dir_all(&path).unwrap();
        kit::netns::run("mount", &["-t", "bpf", "bpf", path.to_str().unwrap()]);
        self.bpffs = Some(PrivateBpffs { path, interval: interval.to_owned() });
    }

    /// Starts `netclaim node` publishing `shared` as shared parents and `include` as
    /// exclusive devices, connected to our containerd's NRI socket.
    pub fn start_node(&mut self, shared: &str, include: &str) {
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
    pub fn restart_node(&self) {
        self.restart_node_with(&[]);
    }

    /// [`Self::restart_node`] with extra environment variables (crash points).
    pub fn restart_node_with(&self, env: &[(&str, &str)]) {
        let mut node = self.node.lock().unwrap();
        assert!(node.is_none(), "the daemon is still running");
        self.spawn_node(&mut node, env);
    }

    pub fn spawn_node(&self, node: &mut Option<std::process::Child>, env: &[(&str, &str)]) {
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
        if let Some(group) = &self.node_cgroup {
            group.add(child.id()).expect("moving the daemon into its CPU cgroup");
        }
        *node = Some(child);
    }

    /// If the daemon has exited (a crash point killed it), starts it again without extra
    /// environment, as its DaemonSet would; returns whether it did.
    pub fn respawn_if_exited(&self) -> bool {
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

    /// The running daemon's process ID.
    pub fn node_pid(&self) -> u32 {
        self.node.lock().unwrap().as_ref().expect("the daemon runs").id()
    }

    /// Whether the daemon is not running (now, without waiting).
    pub fn node_exited(&self) -> bool {
        match self.node.lock().unwrap().as_mut() {
            Some(child) => child.try_wait().unwrap().is_some(),
            None => true,
        }
    }

    /// Whether the daemon exits within 2 s (after a failed call: did it crash?).
    pub async fn node_dies(&self) -> bool {
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
    pub fn kill_node(&self) {
        let mut child = self.node.lock().unwrap().take().expect("the daemon runs");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// `kill -9` if the daemon runs; returns whether it did.
    pub fn kill_node_if_running(&self) -> bool {
        let child = self.node.lock().unwrap().take();
        child.is_some_and(|mut child| {
            let _ = child.kill();
            child.wait().unwrap();
            true
        })
    }

    /// SIGTERM and wait (the state dir is free afterwards).
    pub fn stop_node(&self) {
        let child = self.node.lock().unwrap().take();
        if let Some(mut child) = child {
            kit::containerd::terminate(&mut child);
        }
    }

    /// Waits until the daemon published `if_name` and is synchronized with containerd's
    /// NRI (so the next sandbox reaches it).
    pub async fn wait_node_ready(&self, if_name: &str) {
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
    pub async fn wait_synchronized(&self, count: usize) {
        wait_until(&format!("NRI synchronization #{count}"), self, || async {
            self.node_log().matches("synchronizing with NRI runtime").count() >= count
        })
        .await;
    }

    /// The published device whose `ifName` attribute is `if_name`.
    pub async fn device_name(&self, if_name: &str) -> Option<String> {
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
    pub async fn create_class(&self, name: &str, if_name: &str, mode: &str) {
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
    pub async fn create_claim(&self, name: &str, class: &str, config: Value) {
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

    pub fn claims(&self) -> Api<ResourceClaim> {
        Api::namespaced(self.api.client.clone(), "default")
    }

    /// Runs allocator passes (as the scheduler would) until no claim is pending, then
    /// reserves each pod's claim for it; returns the claims as kubelet then sees them.
    pub async fn allocate_and_reserve(&self, pods: &[PodSpec]) -> Vec<ResourceClaim> {
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
    pub async fn node_with_device(
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
    pub async fn prepared_claims(
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
    pub async fn prepare(&self, dra: &mut Dra, claims: &[ResourceClaim]) {
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
    pub async fn unprepare(&self, dra: &mut Dra, claims: &[ResourceClaim]) {
        let refs: Vec<v1::Claim> = claims.iter().map(kit::claims::claim_ref).collect();
        let answer = dra
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: refs })
            .await
            .unwrap()
            .into_inner();
        assert!(answer.claims.values().all(|c| c.error.is_empty()), "{answer:?}");
    }

    /// One sample's value from the daemon's `/metrics` (address from its log), 0 if absent.
    pub async fn metric(&self, sample: &str) -> f64 {
        self.metrics_text()
            .await
            .lines()
            .find_map(|line| line.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// The daemon's whole `/metrics` answer.
    pub async fn metrics_text(&self) -> String {
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
    pub fn assert_state_empty(&self) {
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

    pub fn print_logs(&self) {
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
pub async fn wait_until<F, Fut>(what: &str, cluster: &Cluster, mut check: F)
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
