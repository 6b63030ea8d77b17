//! `netclaim dev` without `--api-only`: one process running the in-memory API server, the
//! allocator, the real node daemon and the dev kubelet, wired together under a private run
//! dir (kubeconfig, state dir, kubelet plugin sockets, NRI socket, pod netns mounts).
//!
//! Start order: API server → the project's CustomResourceDefinitions (Established) → Node
//! object → NRI runtime endpoint (bare mode) → node daemon (publishes slices, serves
//! `dra.sock`, connects its NRI plugin) → allocator → dev kubelet.
//! Stop order is the reverse where it matters: the dev kubelet tears every pod down while the
//! node daemon still runs (NRI `StopPodSandbox` detaches, `NodeUnprepareResources` frees the
//! addresses), then the daemon, the allocator and the API server stop and the run dir goes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::kubelet::sandbox::SandboxBackend;
use super::kubelet::{self, DevKubelet, DevKubeletConfig, DevKubeletError, Sandboxes};
use crate::dev::controller::InProcessController;
use crate::dev::crds::{self, CrdError};
use crate::dev::cri::{CriClient, CriError};
use crate::inventory::Selection;
use crate::inventory::publish::RequestedSharing;
use crate::k8s::{self, ClientError};
use crate::node::{self, NodeConfig, NodeError, StatsConfig};
use kube_inmemory::apiserver::{self, ApiServerError, ServerOptions};
use kube_inmemory::kubeconfig::{self, KubeconfigError};
use nri_rs::{NriRuntime, RuntimeError, RuntimeOptions};

/// How long start waits for the node daemon's DRA socket.
const DRIVER_READY_LIMIT: Duration = Duration::from_secs(30);
/// How long start waits for the node daemon's NRI plugin (bare mode).
const PLUGIN_READY_LIMIT: Duration = Duration::from_secs(10);
/// CRI per-call timeout.
const CRI_TIMEOUT: Duration = Duration::from_mins(1);

/// A containerd to run sandboxes in.
#[derive(Debug, Clone)]
pub struct ContainerdSockets {
    /// Its CRI socket.
    pub cri: PathBuf,
    /// Its NRI socket (the node daemon's plugin connects there).
    pub nri: PathBuf,
    /// A CDI spec directory this containerd reads (one of its `cdi_spec_dirs`, CDI on): the
    /// node daemon writes its device metadata specs there and the dev kubelet passes the CDI
    /// ids to the containers that use a claim, so they find their metadata file. `None`:
    /// the specs stay in the run dir and containers get no CDI ids (the runtime could not
    /// resolve them, and a runtime with CDI on would refuse the container).
    pub cdi_spec_dir: Option<PathBuf>,
}

/// Settings of the dev cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// API server address (loopback).
    pub listen: SocketAddr,
    /// API server behaviour.
    pub server: ServerOptions,
    /// Also write the kubeconfig here (removed on stop).
    pub kubeconfig_out: Option<PathBuf>,
    /// Node name (also the pool name).
    pub node_name: String,
    /// DRA driver name.
    pub driver_name: String,
    /// Which interfaces the node daemon publishes.
    pub selection: Selection,
    /// `--sharing-mode`.
    pub sharing: RequestedSharing,
    /// Run sandboxes in this containerd instead of bare network namespaces.
    pub containerd: Option<ContainerdSockets>,
    /// Parent of the run dir (default: the system temp dir).
    pub run_parent: Option<PathBuf>,
    /// `--stats-interval` of the node daemon; `None` turns the traffic counters off. They
    /// are pinned in a bpffs of the cluster's own, mounted in the run dir.
    pub stats_interval: Option<Duration>,
}

/// Errors starting or stopping the dev cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A directory or file could not be made.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we did.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The API server failed.
    #[error(transparent)]
    ApiServer(#[from] ApiServerError),
    /// The kubeconfig could not be written.
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    /// No API client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The CustomResourceDefinitions could not be installed.
    #[error(transparent)]
    Crds(#[from] CrdError),
    /// The dev kubelet failed.
    #[error(transparent)]
    Kubelet(#[from] DevKubeletError),
    /// The NRI runtime endpoint could not be bound.
    #[error(transparent)]
    Nri(#[from] RuntimeError),
    /// containerd's CRI socket could not be reached.
    #[error(transparent)]
    Cri(#[from] CriError),
    /// The node daemon stopped with an error.
    #[error("node daemon: {0}")]
    Node(#[from] NodeError),
    /// The node daemon did not come up.
    #[error("the node daemon's DRA socket {0} did not appear within {DRIVER_READY_LIMIT:?}")]
    DriverNotReady(PathBuf),
    /// The node daemon stopped during start.
    #[error("the node daemon stopped during start: {0}")]
    NodeExited(String),
}

/// A running dev cluster.
pub struct Cluster {
    /// API server URL.
    pub url: String,
    /// A client for it.
    pub client: kube::Client,
    /// The private run dir.
    pub run_dir: PathBuf,
    /// The kubeconfig in the run dir.
    pub kubeconfig: PathBuf,
    /// The node name.
    pub node_name: String,
    kubeconfig_out: Option<PathBuf>,
    sandboxes: Sandboxes,
    stop_kubelet: watch::Sender<bool>,
    kubelet: JoinHandle<()>,
    stop_node: watch::Sender<bool>,
    node: std::thread::JoinHandle<Result<(), NodeError>>,
    controller: InProcessController,
    stop_allocator: watch::Sender<bool>,
    allocator: JoinHandle<Result<(), kube_inmemory::allocator::ControllerError>>,
    nri: Option<Arc<NriRuntime>>,
    stop_server: watch::Sender<bool>,
    server: apiserver::ServeTask,
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ClusterError {
    let path = path.to_owned();
    move |source| ClusterError::Io { action, path, source }
}

/// Where the node daemon writes its CDI specs: the containerd's CDI dir when one was given,
/// else inside the run dir (a dev cluster never writes into the host's CDI dirs on its own).
fn cdi_spec_dir(options: &ClusterOptions, run_dir: &Path) -> PathBuf {
    let given = options.containerd.as_ref().and_then(|c| c.cdi_spec_dir.clone());
    given.unwrap_or_else(|| run_dir.join("cdi"))
}

async fn stopped(mut receiver: watch::Receiver<bool>) {
    let _ignored = receiver.wait_for(|stop| *stop).await;
}

/// Runs the node daemon on a thread of its own with a current-thread runtime: the daemon is
/// the same code `netclaim node` runs, isolated from the dev components' runtime (its
/// futures need not be `Send`).
fn spawn_node_daemon(
    config: NodeConfig,
    stop: watch::Receiver<bool>,
) -> Result<std::thread::JoinHandle<Result<(), NodeError>>, ClusterError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(io_error("starting the node daemon's runtime for", &config.state_dir))?;
    let state_dir = config.state_dir.clone();
    std::thread::Builder::new()
        .name("netclaim-node".to_owned())
        .spawn(move || {
            let result = runtime.block_on(node::run_until(config, stop));
            // Background tasks (watches, netlink) end with the runtime.
            runtime.shutdown_timeout(Duration::from_millis(200));
            result
        })
        .map_err(io_error("spawning the node daemon thread for", &state_dir))
}

/// A fresh private run dir: `<parent>/netclaim-dev-<pid>-<random>`, mode 0700.
pub(crate) fn make_run_dir(parent: Option<&Path>) -> Result<PathBuf, ClusterError> {
    use std::os::unix::fs::DirBuilderExt as _;
    let parent = parent.map_or_else(std::env::temp_dir, Path::to_owned);
    let random = uuid::Uuid::new_v4().simple().to_string();
    let dir = parent.join(format!("netclaim-dev-{}-{}", std::process::id(), &random[..8]));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_error("creating the run dir", &dir))?;
    Ok(dir)
}

impl Cluster {
    /// Starts everything and waits until the node daemon serves its DRA socket.
    pub async fn start(options: ClusterOptions) -> Result<Self, ClusterError> {
        let run_dir = make_run_dir(options.run_parent.as_deref())?;
        match Self::start_in(options, run_dir.clone()).await {
            Ok(cluster) => Ok(cluster),
            Err(err) => {
                let _ignored = std::fs::remove_dir_all(&run_dir);
                Err(err)
            }
        }
    }

    async fn start_in(options: ClusterOptions, run_dir: PathBuf) -> Result<Self, ClusterError> {
        let (stop_server, server_stopped) = watch::channel(false);
        let mut server_options = options.server.clone();
        // Bare pods are network namespaces pinned there: `kubectl logs`/`exec` name the path.
        if options.containerd.is_none() {
            server_options.pod_netns_dir = Some(run_dir.join("netns"));
        }
        let (addr, server) =
            apiserver::serve(options.listen, server_options, stopped(server_stopped)).await?;
        let url = format!("http://{addr}");
        let kubeconfig = run_dir.join("kubeconfig");
        let token = options.server.bearer_token.as_deref();
        kubeconfig::write(&kubeconfig, &url, token)?;
        if let Some(out) = &options.kubeconfig_out {
            kubeconfig::write(out, &url, token)?;
        }
        let client = k8s::client(Some(&kubeconfig)).await?;
        // Before the node daemon starts: it watches PodNetworks.
        crds::install(&client).await?;
        let controller = InProcessController::start(&client, &options.driver_name);
        kubelet::register_node(&client, &options.node_name).await?;

        let kubelet_dir = run_dir.join("kubelet");
        let plugin_dir = kubelet_dir.join("plugins").join(&options.driver_name);
        let (nri, nri_socket, backend) = match &options.containerd {
            None => {
                let socket = run_dir.join("nri.sock");
                let runtime = Arc::new(NriRuntime::bind(RuntimeOptions::new(&socket))?);
                let backend = SandboxBackend::Bare {
                    runtime: Arc::clone(&runtime),
                    netns_dir: run_dir.join("netns"),
                };
                (Some(runtime), socket, backend)
            }
            Some(containerd) => {
                let client = CriClient::connect(&containerd.cri, CRI_TIMEOUT).await?;
                let (log_dir, cdi_devices) =
                    (run_dir.join("pods"), containerd.cdi_spec_dir.is_some());
                let backend = SandboxBackend::Cri { client, log_dir, cdi_devices };
                (None, containerd.nri.clone(), backend)
            }
        };
        let node_config = NodeConfig {
            node_name: options.node_name.clone(),
            driver_name: options.driver_name.clone(),
            kubeconfig: Some(kubeconfig.clone()),
            selection: options.selection.clone(),
            sharing: options.sharing,
            metrics_address: SocketAddr::from(([127, 0, 0, 1], 0)),
            metrics_security: crate::metrics::MetricsSecurity::Plain,
            metrics_pod_labels: true,
            sysfs_root: PathBuf::from("/sys"),
            state_dir: run_dir.join("state"),
            kubelet_registry_dir: kubelet_dir.join("plugins_registry"),
            kubelet_plugin_dir: plugin_dir.clone(),
            nri_socket,
            nri_plugin_index: "10".to_owned(),
            cdi_spec_dir: Some(cdi_spec_dir(&options, &run_dir)),
            stats: options.stats_interval.and_then(|interval| private_stats(&run_dir, interval)),
            block_release_grace: crate::node::DEFAULT_BLOCK_RELEASE_GRACE,
        };
        let (stop_node, node_stopped) = watch::channel(false);
        let node = spawn_node_daemon(node_config, node_stopped)?;

        let (stop_allocator, allocator_stopped) = watch::channel(false);
        // The allocator is the scheduler even with one node: a pod is bound only once its
        // claims fit, and one that does not fit stays unbound with `PodScheduled=False` and
        // a `FailedScheduling` Event, as on a real cluster (the kubelet binding every pod
        // at once showed `PodScheduled=True` and no reason for a pod that could never run).
        let allocator = tokio::spawn(kube_inmemory::allocator::run_for_nodes(
            client.clone(),
            std::slice::from_ref(&options.node_name),
            stopped(allocator_stopped),
        ));

        let dra_socket = plugin_dir.join(crate::kubelet::DRA_SOCKET_NAME);
        let mut kubelet_config =
            DevKubeletConfig::new(&options.node_name, dra_socket.clone(), backend);
        kubelet_config.bind_unbound_pods = false;
        let dev_kubelet = DevKubelet::new(client.clone(), kubelet_config)?;
        let sandboxes = dev_kubelet.sandboxes();
        let (stop_kubelet, kubelet_stopped) = watch::channel(false);
        let kubelet = tokio::spawn(dev_kubelet.run(stopped(kubelet_stopped)));

        let cluster = Self {
            url,
            client,
            run_dir,
            kubeconfig,
            node_name: options.node_name.clone(),
            kubeconfig_out: options.kubeconfig_out.clone(),
            sandboxes,
            stop_kubelet,
            kubelet,
            stop_node,
            node,
            controller,
            stop_allocator,
            allocator,
            nri,
            stop_server,
            server,
        };
        if let Err(err) = cluster.wait_ready(&dra_socket).await {
            cluster.stop().await;
            return Err(err);
        }
        Ok(cluster)
    }

    async fn wait_ready(&self, dra_socket: &Path) -> Result<(), ClusterError> {
        let deadline = tokio::time::Instant::now() + DRIVER_READY_LIMIT;
        while !dra_socket.exists() {
            if self.node.is_finished() {
                return Err(ClusterError::NodeExited("see the log above".to_owned()));
            }
            if tokio::time::Instant::now() > deadline {
                return Err(ClusterError::DriverNotReady(dra_socket.to_owned()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if let Some(runtime) = &self.nri
            && let Err(err) = runtime.wait_for_plugins(1, PLUGIN_READY_LIMIT).await
        {
            // Pods wait (visibly, in their status) until a plugin connects.
            tracing::warn!(%err, "no NRI plugin connected yet; pods will wait for one");
        }
        Ok(())
    }

    /// The sandboxes the dev kubelet runs.
    #[must_use]
    pub fn sandboxes(&self) -> &Sandboxes {
        &self.sandboxes
    }

    /// Whether the node daemon is still running.
    #[must_use]
    pub fn node_running(&self) -> bool {
        !self.node.is_finished()
    }

    /// Tears every pod down, stops everything and removes the run dir. Errors are logged.
    pub async fn stop(self) {
        let _ignored = self.stop_kubelet.send(true);
        if let Err(err) = self.kubelet.await {
            tracing::warn!(%err, "the dev kubelet task failed");
        }
        let _ignored = self.stop_node.send(true);
        let node = self.node;
        match tokio::task::spawn_blocking(move || node.join()).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => tracing::warn!(%err, "the node daemon stopped with an error"),
            Ok(Err(_)) | Err(_) => tracing::warn!("the node daemon thread panicked"),
        }
        let _ignored = self.stop_allocator.send(true);
        match self.allocator.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "the allocator stopped with an error"),
            Err(err) => tracing::warn!(%err, "the allocator task failed"),
        }
        self.controller.stop().await;
        if let Some(runtime) = self.nri
            && let Ok(runtime) = Arc::try_unwrap(runtime)
        {
            runtime.shutdown().await;
        }
        let _ignored = self.stop_server.send(true);
        match self.server.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "the API server stopped with an error"),
            Err(err) => tracing::warn!(%err, "the API server task failed"),
        }
        if let Some(out) = &self.kubeconfig_out {
            let _ignored = std::fs::remove_file(out);
        }
        remove_run_dir(&self.run_dir);
    }
}

/// Counters pinned in a bpffs mounted at `<run_dir>/bpf`; `None` (with a warning) when it
/// cannot be mounted, so the cluster runs without counters rather than not at all.
pub(crate) fn private_stats(run_dir: &Path, interval: Duration) -> Option<StatsConfig> {
    let bpffs = run_dir.join("bpf");
    match crate::host::bpf::mount_private_bpffs(&bpffs) {
        Ok(()) => Some(StatsConfig {
            bpffs,
            hook: crate::host::bpf::HookKind::Clsact,
            status_interval: interval,
        }),
        Err(err) => {
            tracing::warn!(err = %crate::model::cause::chain(&err), "no traffic counters");
            None
        }
    }
}

/// Removes the run dir; namespaces still pinned in it (a pod that could not be torn down) are
/// unmounted first, so `remove_dir_all` never fails on a busy mount point.
fn remove_run_dir(run_dir: &Path) {
    crate::host::bpf::unmount_private_bpffs(&run_dir.join("bpf"));
    if let Ok(entries) = std::fs::read_dir(run_dir.join("netns")) {
        for entry in entries.flatten() {
            if let Err(err) = crate::host::netns::remove(&entry.path()) {
                tracing::warn!(%err, "removing a leftover pod netns");
            }
        }
    }
    if let Err(err) = std::fs::remove_dir_all(run_dir) {
        tracing::warn!(path = %run_dir.display(), %err, "removing the run dir");
    }
}
