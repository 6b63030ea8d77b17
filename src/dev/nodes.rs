//! `netclaim dev --nodes N`: N nodes on one machine (DESIGN §8). One API server on host
//! loopback and one allocator placing pods across the nodes; per node a network namespace of
//! its own (its uplink `uplink0` is a veth into one bridge in a fabric netns of the cluster's
//! own), the real node daemon as a child process in that netns and in a mount namespace with
//! the node's own sysfs (the same binary and code path as `netclaim node`), an in-process NRI
//! runtime endpoint and a dev kubelet running bare network-namespace sandboxes.
//!
//! A process in a node's netns cannot reach the host's loopback, so each node gets a
//! listener on 127.0.0.1:[`NODE_API_PORT`] inside its own netns that forwards to the API
//! server, and a kubeconfig pointing there.
//!
//! Run dir (mode 0700, a shared mount so the pods' netns pins reach every node's mount
//! namespace): `kubeconfig` (host), `fabric` (bridge netns pin), `bpf` (private bpffs, when
//! counters are on) and per node `n<i>/` (short: the kubelet's sockets must fit the 108 bytes
//! of a socket path) with `netns` (pin), `kubeconfig` (inside the node), `state/`, `reg/`
//! (kubelet plugin registry), `plugin/` (`dra.sock`), `nri.sock`, `cdi/`, `pods/` (pod netns
//! pins).
//!
//! Stop order: every dev kubelet tears its pods down while the daemons run (NRI
//! `StopPodSandbox`, `NodeUnprepareResources`), then the allocator, the daemons (SIGTERM,
//! then SIGKILL), the NRI endpoints, the API listeners and server, the namespaces (with them
//! the bridge, veths and uplinks), the mounts and the run dir. A daemon that ends on its own
//! is noticed ([`NodesCluster::daemon_exited`]) and the caller stops the whole cluster.

use std::net::SocketAddr;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::Duration;

use ipnetwork::IpNetwork;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::cluster::{ClusterError, make_run_dir, private_stats};
use super::controller::InProcessController;
use super::kubelet::sandbox::SandboxBackend;
use super::kubelet::{self, DevKubelet, DevKubeletConfig, RunningSandbox, Sandboxes};
use crate::dev::kernel::nodes::{self as dev_nodes, DevNodesError, Fabric, NodeProcess};
use crate::k8s;
use kube_inmemory::apiserver::{self, ServerOptions};
use kube_inmemory::kubeconfig;
use nri_rs::{NriRuntime, RuntimeOptions};

/// The API server's port on each node's own loopback.
pub const NODE_API_PORT: u16 = 6443;
/// The node daemon's metrics port on each node's own loopback (every node has its own, so
/// they all use the daemon's default).
pub const NODE_METRICS_PORT: u16 = 9178;
/// How long start waits for every node daemon's DRA socket.
const DRIVER_READY_LIMIT: Duration = Duration::from_secs(30);
/// How long start waits for every node daemon's NRI plugin.
const PLUGIN_READY_LIMIT: Duration = Duration::from_secs(10);
/// How long a daemon has to stop after SIGTERM (and again after SIGKILL).
const DAEMON_STOP_GRACE: Duration = Duration::from_secs(10);
/// The largest `--nodes`.
pub const MAX_NODES: usize = 64;

/// Errors starting the cluster.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    /// What the one-node cluster can fail with (run dir, API server, kubeconfig, client,
    /// kubelet, NRI endpoint).
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// A namespace, link or mount could not be made, or a daemon not started.
    #[error(transparent)]
    Host(#[from] DevNodesError),
    /// A node daemon did not come up.
    #[error(
        "node {node}: the daemon's DRA socket {socket} did not appear within {DRIVER_READY_LIMIT:?}"
    )]
    DriverNotReady {
        /// The node.
        node: String,
        /// The socket waited for.
        socket: PathBuf,
    },
    /// A node daemon ended during start.
    #[error("node {node}: the daemon ended during start ({status}); see its log above")]
    DaemonExited {
        /// The node.
        node: String,
        /// How it ended.
        status: String,
    },
}

impl From<apiserver::ApiServerError> for NodesError {
    fn from(err: apiserver::ApiServerError) -> Self {
        Self::Cluster(ClusterError::ApiServer(err))
    }
}

impl From<kubeconfig::KubeconfigError> for NodesError {
    fn from(err: kubeconfig::KubeconfigError) -> Self {
        Self::Cluster(ClusterError::Kubeconfig(err))
    }
}

fn io_error(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> NodesError {
    let path = path.to_owned();
    move |source| NodesError::Cluster(ClusterError::Io { action, path, source })
}

/// The node daemons' device selection, as `netclaim node` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSelection {
    /// `--include-interfaces`.
    pub include_interfaces: Vec<String>,
    /// `--exclude-interfaces`.
    pub exclude_interfaces: Vec<String>,
    /// `--shared-parents`.
    pub shared_parents: Vec<String>,
    /// `--sharing-mode` (`auto`, `capacity`, `slots`).
    pub sharing_mode: String,
    /// `--parent-bandwidth` (each node's daemon publishes its parents' bandwidth from them).
    pub parent_bandwidth: Vec<crate::inventory::bandwidth::ParentBandwidth>,
}

impl Default for DaemonSelection {
    /// Each node's uplink, shared (macvlan/ipvlan parents).
    fn default() -> Self {
        Self {
            include_interfaces: vec![dev_nodes::UPLINK.to_owned()],
            exclude_interfaces: Vec::new(),
            shared_parents: vec![dev_nodes::UPLINK.to_owned()],
            sharing_mode: "auto".to_owned(),
            parent_bandwidth: Vec::new(),
        }
    }
}

/// Settings of the cluster.
#[derive(Debug, Clone)]
pub struct NodesOptions {
    /// How many nodes (1..=[`MAX_NODES`]).
    pub count: usize,
    /// Node names are `<base>-1` … `<base>-N`.
    pub base_name: String,
    /// API server address (host loopback).
    pub listen: SocketAddr,
    /// API server behaviour (its bearer token goes into every kubeconfig).
    pub server: ServerOptions,
    /// Also write the host kubeconfig here (removed on stop).
    pub kubeconfig_out: Option<PathBuf>,
    /// DRA driver name.
    pub driver_name: String,
    /// What each daemon publishes.
    pub selection: DaemonSelection,
    /// Parent of the run dir (default: the system temp dir).
    pub run_parent: Option<PathBuf>,
    /// `--stats-interval` of the daemons; `None` turns the counters off. They are pinned in
    /// one private bpffs (each daemon under its own node's subtree).
    pub stats_interval: Option<Duration>,
    /// The `netclaim` binary the daemons run (normally this process's own executable).
    pub daemon_program: PathBuf,
    /// `RUST_LOG` of the daemons when this process has none.
    pub daemon_log_default: String,
    /// An address on the bridge (with prefix), as a router on the nodes' segment would have.
    pub fabric_address: Option<IpNetwork>,
}

impl NodesOptions {
    /// The node names, in order.
    #[must_use]
    pub fn node_names(&self) -> Vec<String> {
        (1..=self.count).map(|i| format!("{}-{i}", self.base_name)).collect()
    }
}

/// One node.
pub struct DevNode {
    /// Its name (the Node object, the pool, `kubernetes.io/hostname`).
    pub name: String,
    /// Its directory under the run dir.
    pub dir: PathBuf,
    /// Its netns pin.
    pub netns: PathBuf,
    /// A kubeconfig for processes inside the node's netns (127.0.0.1:[`NODE_API_PORT`]).
    pub kubeconfig: PathBuf,
    daemon: Option<NodeProcess>,
    nri: Option<Arc<NriRuntime>>,
    sandboxes: Sandboxes,
    kubelet: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    api_forwarder: Option<JoinHandle<()>>,
}

impl DevNode {
    /// The node daemon's process id.
    #[must_use]
    pub fn daemon_pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(NodeProcess::pid)
    }

    /// The sandboxes this node's dev kubelet runs.
    #[must_use]
    pub fn sandboxes(&self) -> &Sandboxes {
        &self.sandboxes
    }
}

/// The allocator's task.
type AllocatorTask = JoinHandle<Result<(), kube_inmemory::allocator::ControllerError>>;

/// A running cluster of several nodes.
pub struct NodesCluster {
    /// API server URL (host loopback).
    pub url: String,
    /// A client for it.
    pub client: kube::Client,
    /// The private run dir.
    pub run_dir: PathBuf,
    /// The host kubeconfig in the run dir.
    pub kubeconfig: PathBuf,
    /// The nodes, in name order.
    pub nodes: Vec<DevNode>,
    kubeconfig_out: Option<PathBuf>,
    fabric: Option<Fabric>,
    allocator: Option<(watch::Sender<bool>, AllocatorTask)>,
    controller: Option<InProcessController>,
    server: (watch::Sender<bool>, apiserver::ServeTask),
}

async fn stopped(mut receiver: watch::Receiver<bool>) {
    let _ignored = receiver.wait_for(|stop| *stop).await;
}

/// Accepts connections on `listener` (inside a node's netns) and forwards each to the API
/// server on host loopback, until aborted (which drops every open connection).
fn forward_api(
    listener: std::net::TcpListener,
    server: SocketAddr,
) -> std::io::Result<JoinHandle<()>> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    Ok(tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let (mut inbound, _) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!(%err, "accepting an API connection inside a node");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            connections.spawn(async move {
                match tokio::net::TcpStream::connect(server).await {
                    Ok(mut outbound) => {
                        let _ignored =
                            tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                    Err(err) => tracing::warn!(%err, "forwarding an API connection"),
                }
            });
            while connections.try_join_next().is_some() {}
        }
    }))
}

impl NodesCluster {
    /// Starts everything and waits until every daemon serves its DRA socket. On error,
    /// whatever was started is stopped and removed again.
    pub async fn start(options: NodesOptions) -> Result<Self, NodesError> {
        let run_dir = make_run_dir(options.run_parent.as_deref())?;
        if let Err(err) = dev_nodes::share_mounts_below(&run_dir) {
            let _ignored = std::fs::remove_dir_all(&run_dir);
            return Err(err.into());
        }
        let (stop_server, server_stopped) = watch::channel(false);
        let served =
            apiserver::serve(options.listen, options.server.clone(), stopped(server_stopped)).await;
        let (addr, server_task) = match served {
            Ok(served) => served,
            Err(err) => {
                remove_run_dir(&run_dir);
                return Err(err.into());
            }
        };
        let url = format!("http://{addr}");
        let kubeconfig = run_dir.join("kubeconfig");
        let token = options.server.bearer_token.clone();
        let client = async {
            kubeconfig::write(&kubeconfig, &url, token.as_deref())?;
            if let Some(out) = &options.kubeconfig_out {
                kubeconfig::write(out, &url, token.as_deref())?;
            }
            let client = k8s::client(Some(&kubeconfig))
                .await
                .map_err(|e| NodesError::from(ClusterError::from(e)))?;
            // Before the node daemons start: they watch PodNetworks and IPBlocks.
            crate::dev::crds::install(&client)
                .await
                .map_err(|e| NodesError::from(ClusterError::from(e)))?;
            Ok::<_, NodesError>(client)
        }
        .await;
        let client = match client {
            Ok(client) => client,
            Err(err) => {
                let _ = stop_server.send(true);
                let _ = server_task.await;
                if let Some(out) = &options.kubeconfig_out {
                    let _ignored = std::fs::remove_file(out);
                }
                remove_run_dir(&run_dir);
                return Err(err);
            }
        };
        let mut cluster = Self {
            url,
            client,
            run_dir,
            kubeconfig,
            nodes: Vec::new(),
            kubeconfig_out: options.kubeconfig_out.clone(),
            fabric: None,
            allocator: None,
            controller: None,
            server: (stop_server, server_task),
        };
        if let Err(err) = cluster.start_nodes(&options, addr).await {
            cluster.stop().await;
            return Err(err);
        }
        Ok(cluster)
    }

    async fn start_nodes(
        &mut self,
        options: &NodesOptions,
        api: SocketAddr,
    ) -> Result<(), NodesError> {
        self.fabric = Some(Fabric::create(&self.run_dir, "fabric", options.fabric_address).await?);
        self.controller = Some(InProcessController::start(&self.client, &options.driver_name));
        let stats =
            options.stats_interval.and_then(|interval| private_stats(&self.run_dir, interval));
        let names = options.node_names();
        for (index, name) in names.iter().enumerate() {
            let node = self.start_node(options, index + 1, name, api, stats.as_ref()).await?;
            self.nodes.push(node);
        }
        let (stop, allocator_stopped) = watch::channel(false);
        let task = tokio::spawn(kube_inmemory::allocator::run_for_nodes(
            self.client.clone(),
            &names,
            stopped(allocator_stopped),
        ));
        self.allocator = Some((stop, task));
        self.wait_ready().await
    }

    /// One node: netns and uplink, Node object, API listener and kubeconfig, NRI endpoint,
    /// daemon, dev kubelet. What is made is recorded in the returned node as it goes, so a
    /// failure part-way leaves it for [`Self::stop`] (via the node pushed by the caller) or
    /// removes it here.
    async fn start_node(
        &self,
        options: &NodesOptions,
        index: usize,
        name: &str,
        api: SocketAddr,
        stats: Option<&crate::node::StatsConfig>,
    ) -> Result<DevNode, NodesError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let dir = node_dir(&self.run_dir, index);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io_error("creating the node dir", &dir))?;
        let netns = dev_nodes::create_node_netns(&dir, "netns").await?;
        let mut node = DevNode {
            name: name.to_owned(),
            kubeconfig: dir.join("kubeconfig"),
            dir: dir.clone(),
            netns: netns.clone(),
            daemon: None,
            nri: None,
            sandboxes: Sandboxes::default(),
            kubelet: None,
            api_forwarder: None,
        };
        match self.fill_node(&mut node, options, index, api, stats).await {
            Ok(()) => Ok(node),
            Err(err) => {
                stop_nodes(std::slice::from_mut(&mut node)).await;
                let _ignored = dev_nodes::remove_node_netns(&netns);
                Err(err)
            }
        }
    }

    async fn fill_node(
        &self,
        node: &mut DevNode,
        options: &NodesOptions,
        index: usize,
        api: SocketAddr,
        stats: Option<&crate::node::StatsConfig>,
    ) -> Result<(), NodesError> {
        let fabric = self.fabric.as_ref().ok_or_else(|| {
            NodesError::Host(DevNodesError::Thread("the fabric is gone".to_owned()))
        })?;
        fabric.attach(index, &node.netns).await?;
        kubelet::register_node(&self.client, &node.name)
            .await
            .map_err(|e| NodesError::from(ClusterError::from(e)))?;

        let netns = node.netns.clone();
        let listener =
            tokio::task::spawn_blocking(move || dev_nodes::bind_loopback_in(&netns, NODE_API_PORT))
                .await
                .map_err(|e| NodesError::Host(DevNodesError::Thread(e.to_string())))??;
        node.api_forwarder =
            Some(forward_api(listener, api).map_err(io_error("listening inside", &node.netns))?);
        let token =
            node_token(&options.server, &node.name).or(options.server.bearer_token.as_deref());
        kubeconfig::write(&node.kubeconfig, &format!("http://127.0.0.1:{NODE_API_PORT}"), token)?;

        let nri_socket = node.dir.join("nri.sock");
        let runtime = Arc::new(
            NriRuntime::bind(RuntimeOptions::new(&nri_socket))
                .map_err(|e| NodesError::from(ClusterError::from(e)))?,
        );
        node.nri = Some(Arc::clone(&runtime));

        let plugin_dir = node.dir.join("plugin");
        let command = daemon_command(options, node, &nri_socket, &plugin_dir, stats);
        node.daemon = Some(dev_nodes::spawn_in_node(&node.netns, command)?);

        let backend = SandboxBackend::Bare { runtime, netns_dir: node.dir.join("pods") };
        let mut config = DevKubeletConfig::new(
            &node.name,
            plugin_dir.join(crate::kubelet::DRA_SOCKET_NAME),
            backend,
        );
        // The allocator binds pods to nodes; each kubelet runs only the pods bound to it.
        config.bind_unbound_pods = false;
        let dev_kubelet = DevKubelet::new(self.client.clone(), config)
            .map_err(|e| NodesError::from(ClusterError::from(e)))?;
        node.sandboxes = dev_kubelet.sandboxes();
        let (stop, kubelet_stopped) = watch::channel(false);
        node.kubelet = Some((stop, tokio::spawn(dev_kubelet.run(stopped(kubelet_stopped)))));
        Ok(())
    }

    async fn wait_ready(&self) -> Result<(), NodesError> {
        let deadline = tokio::time::Instant::now() + DRIVER_READY_LIMIT;
        for node in &self.nodes {
            let socket = node.dir.join("plugin").join(crate::kubelet::DRA_SOCKET_NAME);
            while !socket.exists() {
                if let Some(status) = node.daemon.as_ref().and_then(NodeProcess::exit_status) {
                    return Err(NodesError::DaemonExited {
                        node: node.name.clone(),
                        status: status.to_string(),
                    });
                }
                if tokio::time::Instant::now() > deadline {
                    return Err(NodesError::DriverNotReady { node: node.name.clone(), socket });
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if let Some(runtime) = &node.nri
                && let Err(err) = runtime.wait_for_plugins(1, PLUGIN_READY_LIMIT).await
            {
                // Pods wait (visibly, in their status) until a plugin connects.
                tracing::warn!(node = %node.name, %err, "no NRI plugin connected yet; pods will wait for one");
            }
        }
        Ok(())
    }

    /// Completes when a node daemon ends on its own (crash, kill -9): which node and how.
    /// Pending for ever while all run.
    pub async fn daemon_exited(&self) -> (String, ExitStatus) {
        let waits = self.nodes.iter().filter_map(|node| {
            let mut exited = node.daemon.as_ref()?.exited();
            let name = node.name.clone();
            Some(Box::pin(async move {
                match exited.wait_for(Option::is_some).await {
                    Ok(status) => (name, status.unwrap_or_default()),
                    // The sender lives in the thread that reaps the child: gone means ended.
                    Err(_) => (name, ExitStatus::default()),
                }
            }))
        });
        let waits: Vec<_> = waits.collect();
        if waits.is_empty() {
            return std::future::pending().await;
        }
        futures::future::select_all(waits).await.0
    }

    /// The sandbox of the pod with `uid`, on whichever node runs it.
    #[must_use]
    pub fn sandbox(&self, uid: &str) -> Option<RunningSandbox> {
        self.nodes.iter().find_map(|node| node.sandboxes.get(uid))
    }

    /// Tears every pod down through its node's daemon, stops everything and removes the
    /// namespaces, links, mounts and the run dir. Errors are logged; every step is tried.
    pub async fn stop(mut self) {
        // Pods first, on every node at once, while the daemons still run.
        let kubelets: Vec<_> = self.nodes.iter_mut().filter_map(|n| n.kubelet.take()).collect();
        for (stop, _) in &kubelets {
            let _ignored = stop.send(true);
        }
        for (_, task) in kubelets {
            if let Err(err) = task.await {
                tracing::warn!(%err, "a dev kubelet task failed");
            }
        }
        if let Some((stop, task)) = self.allocator.take() {
            let _ignored = stop.send(true);
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(%err, "the allocator stopped with an error"),
                Err(err) => tracing::warn!(%err, "the allocator task failed"),
            }
        }
        if let Some(controller) = self.controller.take() {
            controller.stop().await;
        }
        stop_nodes(&mut self.nodes).await;
        let (stop_server, server) = self.server;
        let _ignored = stop_server.send(true);
        match server.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "the API server stopped with an error"),
            Err(err) => tracing::warn!(%err, "the API server task failed"),
        }
        let netns: Vec<PathBuf> = self.nodes.iter().map(|n| n.netns.clone()).collect();
        let fabric = self.fabric.take();
        let removed = tokio::task::spawn_blocking(move || {
            for path in netns {
                if let Err(err) = dev_nodes::remove_node_netns(&path) {
                    tracing::warn!(%err, "removing a node netns");
                }
            }
            if let Some(fabric) = fabric
                && let Err(err) = fabric.remove()
            {
                tracing::warn!(%err, "removing the fabric netns");
            }
        })
        .await;
        if let Err(err) = removed {
            tracing::warn!(%err, "the namespace cleanup task failed");
        }
        if let Some(out) = &self.kubeconfig_out {
            let _ignored = std::fs::remove_file(out);
        }
        remove_run_dir(&self.run_dir);
    }
}

/// Stops what each node runs, all nodes at once: its dev kubelet (tearing its pods down),
/// its daemon (SIGTERM, then SIGKILL), its NRI endpoint and its API listener.
async fn stop_nodes(nodes: &mut [DevNode]) {
    let stops = nodes.iter_mut().map(|node| async move {
        if let Some((stop, task)) = node.kubelet.take() {
            let _ignored = stop.send(true);
            if let Err(err) = task.await {
                tracing::warn!(node = %node.name, %err, "the dev kubelet task failed");
            }
        }
        if let Some(daemon) = node.daemon.take() {
            match daemon.stop(DAEMON_STOP_GRACE).await {
                Some(status) if status.success() => {}
                Some(status) => {
                    tracing::warn!(node = %node.name, %status, "the node daemon ended with an error");
                }
                None => tracing::warn!(node = %node.name, pid = daemon.pid(), "the node daemon did not end"),
            }
        }
        if let Some(runtime) = node.nri.take() {
            if let Ok(runtime) = Arc::try_unwrap(runtime) {
                runtime.shutdown().await;
            } else {
                tracing::debug!(node = %node.name, "the NRI endpoint is still shared");
            }
        }
        if let Some(forwarder) = node.api_forwarder.take() {
            forwarder.abort();
        }
    });
    futures::future::join_all(stops).await;
}

/// The `netclaim node` command of one node: every flag explicit (no setting leaks in from
/// this process's `NETCLAIM_*` environment), logs to this process's stderr, its own process
/// group (a Ctrl-C in the terminal reaches only this process, which then stops the pods
/// before the daemons).
fn daemon_command(
    options: &NodesOptions,
    node: &DevNode,
    nri_socket: &Path,
    plugin_dir: &Path,
    stats: Option<&crate::node::StatsConfig>,
) -> std::process::Command {
    use std::os::unix::process::CommandExt as _;
    let mut command = std::process::Command::new(&options.daemon_program);
    let dir = &node.dir;
    command
        .arg("node")
        .args(["--node-name", &node.name])
        .args(["--driver-name", &options.driver_name])
        .arg("--kubeconfig")
        .arg(&node.kubeconfig)
        .args(["--metrics-address", &format!("127.0.0.1:{NODE_METRICS_PORT}")])
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--kubelet-registry-dir")
        .arg(dir.join("reg"))
        .arg("--kubelet-plugin-dir")
        .arg(plugin_dir)
        .arg("--nri-socket")
        .arg(nri_socket)
        .arg("--cdi-spec-dir")
        .arg(dir.join("cdi"))
        .args(["--sharing-mode", &options.selection.sharing_mode]);
    let list = |flag: &str, values: &[String], command: &mut std::process::Command| {
        if !values.is_empty() {
            command.arg(format!("{flag}={}", values.join(",")));
        }
    };
    list("--include-interfaces", &options.selection.include_interfaces, &mut command);
    list("--exclude-interfaces", &options.selection.exclude_interfaces, &mut command);
    list("--shared-parents", &options.selection.shared_parents, &mut command);
    let bandwidth: Vec<String> =
        options.selection.parent_bandwidth.iter().map(ToString::to_string).collect();
    list("--parent-bandwidth", &bandwidth, &mut command);
    match stats {
        Some(stats) => {
            command.arg("--bpffs").arg(&stats.bpffs);
            command.args([
                "--stats-hook",
                "clsact",
                "--stats-interval",
                &format!("{}ms", stats.status_interval.as_millis()),
            ]);
        }
        None => {
            command.arg("--bpffs=");
        }
    }
    for (key, _) in std::env::vars_os() {
        let keep = ["NETCLAIM_LOG_FORMAT", "NETCLAIM_CRASH_AT"];
        if let Some(key) = key.to_str()
            && key.starts_with("NETCLAIM_")
            && !keep.contains(&key)
        {
            command.env_remove(key);
        }
    }
    if std::env::var_os("RUST_LOG").is_none() {
        command.env("RUST_LOG", &options.daemon_log_default);
    }
    // The daemon ends with this process even after a SIGKILL here (host::parent_death; the
    // thread that forks it lives until it ends, see spawn_in_node).
    command.env(crate::host::parent_death::PARENT_ENV, std::process::id().to_string());
    command.stdin(std::process::Stdio::null());
    match std::io::stderr().as_fd().try_clone_to_owned() {
        Ok(stderr) => {
            command.stdout(std::process::Stdio::from(stderr));
        }
        Err(_) => {
            command.stdout(std::process::Stdio::null());
        }
    }
    command.process_group(0);
    command
}

/// The token of a [`ServerOptions::user_tokens`] entry naming node `name` as its user, if
/// any: that node's daemon then authenticates as the node, so the request log tells each
/// daemon's requests apart from the others' and from the in-process components' (benches
/// count API requests per caller). Without one the daemon uses the cluster's bearer token.
fn node_token<'a>(server: &'a ServerOptions, name: &str) -> Option<&'a str> {
    server
        .user_tokens
        .iter()
        .find(|(_, user)| user.as_str() == name)
        .map(|(token, _)| token.as_str())
}

/// The directory of node `index` (from 1) in the run dir.
#[must_use]
pub fn node_dir(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(format!("n{index}"))
}

/// Removes the run dir: leftover pod and node namespaces (a pod that could not be torn
/// down, a start that failed half-way) and the bpffs are unmounted, then the run dir's own
/// shared mount, then the files.
fn remove_run_dir(run_dir: &Path) {
    crate::host::bpf::unmount_private_bpffs(&run_dir.join("bpf"));
    let mut pins = Vec::new();
    for index in 1..=MAX_NODES {
        let dir = node_dir(run_dir, index);
        if let Ok(pods) = std::fs::read_dir(dir.join("pods")) {
            pins.extend(pods.flatten().map(|p| p.path()));
        }
        pins.push(dir.join("netns"));
    }
    pins.push(run_dir.join("fabric"));
    for pin in pins {
        if let Err(err) = crate::host::netns::remove(&pin) {
            tracing::warn!(%err, "removing a leftover netns");
        }
    }
    if let Err(err) = dev_nodes::unshare_mounts_below(run_dir) {
        tracing::warn!(%err, "unmounting the run dir");
    }
    if let Err(err) = std::fs::remove_dir_all(run_dir) {
        tracing::warn!(path = %run_dir.display(), %err, "removing the run dir");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(count: usize) -> NodesOptions {
        NodesOptions {
            count,
            base_name: "dev-node".to_owned(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            server: ServerOptions::default(),
            kubeconfig_out: None,
            driver_name: "netclaim.dev".to_owned(),
            selection: DaemonSelection::default(),
            run_parent: None,
            stats_interval: None,
            daemon_program: PathBuf::from("/usr/bin/netclaim"),
            daemon_log_default: "info".to_owned(),
            fabric_address: None,
        }
    }

    #[test]
    fn a_node_named_in_the_user_tokens_gets_its_own_token() {
        let mut server = ServerOptions::default();
        server.user_tokens.insert("t-2".to_owned(), "dev-node-2".to_owned());
        server.user_tokens.insert("t-x".to_owned(), "someone".to_owned());
        assert_eq!(node_token(&server, "dev-node-2"), Some("t-2"));
        assert_eq!(node_token(&server, "dev-node-1"), None);
    }

    #[test]
    fn nodes_are_named_from_the_base() {
        assert_eq!(options(3).node_names(), ["dev-node-1", "dev-node-2", "dev-node-3"]);
    }

    #[test]
    fn the_daemon_gets_every_flag_of_its_node() {
        let node = DevNode {
            name: "dev-node-2".to_owned(),
            dir: PathBuf::from("/run/x/n2"),
            netns: PathBuf::from("/run/x/n2/netns"),
            kubeconfig: PathBuf::from("/run/x/n2/kubeconfig"),
            daemon: None,
            nri: None,
            sandboxes: Sandboxes::default(),
            kubelet: None,
            api_forwarder: None,
        };
        let mut options = options(2);
        options.selection.parent_bandwidth =
            vec!["uplink0=1G".parse().unwrap(), "0000:03:00.0=2500M".parse().unwrap()];
        let command = daemon_command(
            &options,
            &node,
            Path::new("/run/x/n2/nri.sock"),
            Path::new("/run/x/n2/plugin"),
            None,
        );
        let args: Vec<String> =
            command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        let text = args.join(" ");
        for expected in [
            "node --node-name dev-node-2 --driver-name netclaim.dev",
            "--kubeconfig /run/x/n2/kubeconfig",
            "--metrics-address 127.0.0.1:9178",
            "--state-dir /run/x/n2/state",
            "--kubelet-registry-dir /run/x/n2/reg",
            "--kubelet-plugin-dir /run/x/n2/plugin",
            "--nri-socket /run/x/n2/nri.sock",
            "--include-interfaces=uplink0",
            "--shared-parents=uplink0",
            "--parent-bandwidth=uplink0=1G,0000:03:00.0=2500M",
            "--bpffs=",
        ] {
            assert!(text.contains(expected), "{expected:?} missing from {text}");
        }
        assert!(!text.contains("--exclude-interfaces"), "{text}");
        // Every flag parses as `netclaim node` would.
        let parsed =
            crate::cli::parse(std::iter::once("netclaim".to_owned()).chain(args.iter().cloned()));
        let crate::cli::Parsed::Run(cli) = parsed else { panic!("{parsed:?}") };
        let crate::cli::Command::Node(node_args) = cli.command else { panic!("not node") };
        assert_eq!(node_args.selection.parent_bandwidth, options.selection.parent_bandwidth);
        let config = crate::cli::node::config(&node_args).unwrap();
        assert_eq!(config.node_name, "dev-node-2");
        assert!(config.stats.is_none());
    }
}
