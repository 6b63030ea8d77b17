//! `netclaim dev`: the API server alone (`--api-only`), the whole single-node cluster, N nodes
//! (`--nodes N`), or the demo (`--demo`, on one node or on N), until SIGTERM/SIGINT.

use std::path::Path;
use std::time::Duration;

use super::{DevArgs, OutputFormat, SharingModeArg};
use crate::dev::api_only::{self, ApiOnlyError};
use crate::dev::cluster::{Cluster, ClusterError, ClusterOptions, ContainerdSockets};
use crate::dev::demo::{self, DemoOptions, DemoOutput};
use crate::dev::nodes::{DaemonSelection, NodesCluster, NodesError, NodesOptions};
use crate::inventory::publish::RequestedSharing;
use crate::inventory::{InventoryError, Selection, SharingMode};
use kube_inmemory::apiserver::ServerOptions;

/// Name of the node when the host name is not a DNS subdomain.
const FALLBACK_NODE_NAME: &str = "dev-node";

/// Why `netclaim dev` failed.
#[derive(Debug, thiserror::Error)]
pub enum DevCommandError {
    /// The address is not loopback.
    #[error("--listen {0}: the dev API server has no authentication; listen on loopback only")]
    NotLoopback(std::net::SocketAddr),
    /// Bad interface patterns.
    #[error(transparent)]
    Selection(#[from] InventoryError),
    /// The async runtime could not start.
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    /// The server failed.
    #[error(transparent)]
    Server(#[from] ApiOnlyError),
    /// The cluster failed to start.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    /// The cluster of several nodes failed to start.
    #[error(transparent)]
    Nodes(#[from] NodesError),
    /// This process's executable (the node daemons run it) could not be found.
    #[error("finding this program's executable for the node daemons")]
    Executable(#[source] std::io::Error),
    /// A node daemon ended while the cluster ran (everything was stopped and removed).
    #[error("node {node}: the node daemon ended ({status}); the cluster was stopped")]
    DaemonExited {
        /// The node.
        node: String,
        /// How it ended.
        status: String,
    },
    /// A signal handler could not be installed.
    #[error("installing a signal handler")]
    Signal(#[source] std::io::Error),
    /// The demo ran but something did not work (the report says what).
    #[error("the demo failed: {0}")]
    DemoFailed(String),
}

impl DevCommandError {
    /// Whether this is a usage error (exit code 2).
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::NotLoopback(_) | Self::Selection(_))
    }
}

/// The node name: `--node-name`, else the host name if it is a DNS subdomain, else
/// `dev-node`.
#[must_use]
pub fn node_name(flag: Option<&str>, hostname: Option<&str>) -> String {
    if let Some(name) = flag {
        return name.to_owned();
    }
    hostname
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| crate::inventory::naming::is_dns_subdomain(h))
        .unwrap_or_else(|| FALLBACK_NODE_NAME.to_owned())
}

/// A fresh bearer token for the dev API server: 244 random bits (two v4 UUIDs).
fn new_token() -> String {
    format!("{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple())
}

fn cluster_options(args: &DevArgs) -> Result<ClusterOptions, DevCommandError> {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").ok();
    let sharing = match args.selection.sharing_mode {
        SharingModeArg::Auto => RequestedSharing::Auto,
        SharingModeArg::Capacity => RequestedSharing::Capacity,
        SharingModeArg::Slots => RequestedSharing::Slots,
    };
    Ok(ClusterOptions {
        listen: args.listen,
        server: ServerOptions {
            drop_consumable_capacity: args.drop_consumable_capacity,
            // Only holders of the kubeconfig (mode 0600) and processes of this user may drive
            // a daemon that moves NICs (kubectl sends no token over plain HTTP).
            bearer_token: Some(new_token()),
            same_user: true,
            ..ServerOptions::default()
        },
        kubeconfig_out: args.kubeconfig_out.clone(),
        node_name: node_name(args.node_name.as_deref(), hostname.as_deref()),
        driver_name: args.driver_name.clone(),
        selection: Selection::new(
            &args.selection.include_interfaces,
            &args.selection.exclude_interfaces,
            &args.selection.shared_parents,
            SharingMode::Capacity,
        )?
        .with_parent_bandwidth(&args.selection.parent_bandwidth),
        sharing,
        containerd: args.containerd.as_ref().map(|cri| ContainerdSockets {
            cri: cri.clone(),
            nri: args.containerd_nri_socket.clone(),
            cdi_spec_dir: args.containerd_cdi_spec_dir.clone(),
        }),
        run_parent: args.run_dir.clone(),
        // Zero keeps the counters out of the status, but the demo still reads them there:
        // an explicit 0 turns them off altogether in the dev cluster.
        stats_interval: Some(args.dev_stats_interval).filter(|interval| !interval.is_zero()),
    })
}

fn nodes_options(args: &DevArgs, count: u16) -> Result<NodesOptions, DevCommandError> {
    let flags = &args.selection;
    let given = !(flags.include_interfaces.is_empty()
        && flags.exclude_interfaces.is_empty()
        && flags.shared_parents.is_empty());
    // Checked here, so a bad pattern is a usage error rather than N daemons failing.
    Selection::new(
        &flags.include_interfaces,
        &flags.exclude_interfaces,
        &flags.shared_parents,
        SharingMode::Capacity,
    )?;
    let mut selection = DaemonSelection::default();
    if given {
        selection.include_interfaces.clone_from(&flags.include_interfaces);
        selection.exclude_interfaces.clone_from(&flags.exclude_interfaces);
        selection.shared_parents.clone_from(&flags.shared_parents);
    }
    let sharing_mode = match flags.sharing_mode {
        SharingModeArg::Auto => "auto",
        SharingModeArg::Capacity => "capacity",
        SharingModeArg::Slots => "slots",
    };
    sharing_mode.clone_into(&mut selection.sharing_mode);
    // Whatever the interfaces: the default selection's `uplink0` takes it too.
    selection.parent_bandwidth.clone_from(&flags.parent_bandwidth);
    Ok(NodesOptions {
        count: usize::from(count),
        base_name: args.node_name.clone().unwrap_or_else(|| FALLBACK_NODE_NAME.to_owned()),
        listen: args.listen,
        server: ServerOptions {
            drop_consumable_capacity: args.drop_consumable_capacity,
            bearer_token: Some(new_token()),
            same_user: true,
            ..ServerOptions::default()
        },
        kubeconfig_out: args.kubeconfig_out.clone(),
        driver_name: args.driver_name.clone(),
        selection,
        run_parent: args.run_dir.clone(),
        stats_interval: Some(args.dev_stats_interval).filter(|interval| !interval.is_zero()),
        daemon_program: std::env::current_exe().map_err(DevCommandError::Executable)?,
        daemon_log_default: if args.demo { "warn" } else { "info" }.to_owned(),
        fabric_address: None,
    })
}

/// Runs the command.
pub fn run(args: &DevArgs) -> Result<(), DevCommandError> {
    if !args.listen.ip().is_loopback() {
        return Err(DevCommandError::NotLoopback(args.listen));
    }
    let nodes = args.nodes.map(|count| nodes_options(args, count)).transpose()?;
    let options = cluster_options(args)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("netclaim-worker")
        .build()
        .map_err(DevCommandError::Runtime)?;
    let result = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).map_err(DevCommandError::Signal)?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(DevCommandError::Signal)?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        if args.api_only {
            api_only::run(
                args.listen,
                options.server,
                args.kubeconfig_out.as_deref(),
                |url| tracing::info!(%url, "API server ready"),
                shutdown,
            )
            .await?;
            Ok(())
        } else if let Some(nodes) = nodes {
            if args.demo {
                // Boxed: the demo's state machine is large (clippy::large_futures).
                let report = Box::pin(demo::run_nodes(
                    demo::NodesDemoOptions {
                        nodes,
                        pods: usize::from(args.pods),
                        ready_timeout: Duration::from_secs(args.ready_timeout),
                        output: demo_output(args.output),
                    },
                    shutdown,
                ))
                .await;
                if report.success {
                    Ok(())
                } else {
                    Err(DevCommandError::DemoFailed(report.errors.join("; ")))
                }
            } else {
                serve_nodes(nodes, shutdown).await
            }
        } else if args.demo {
            let demo_options = DemoOptions {
                cluster: options,
                pods: usize::from(args.pods),
                image: args.pod_image.clone(),
                ready_timeout: Duration::from_secs(args.ready_timeout),
                output: demo_output(args.output),
            };
            let report = demo::run(demo_options, shutdown).await;
            if report.success {
                Ok(())
            } else {
                Err(DevCommandError::DemoFailed(report.errors.join("; ")))
            }
        } else {
            serve_cluster(options, shutdown).await
        }
    });
    // Watches and netlink tasks end with the runtime; do not wait for them.
    runtime.shutdown_timeout(Duration::from_millis(200));
    result
}

/// The demo's report in the format `-o` names.
fn demo_output(format: OutputFormat) -> DemoOutput {
    match format {
        OutputFormat::Table => DemoOutput::Human,
        OutputFormat::Json => DemoOutput::Json,
        OutputFormat::Yaml => DemoOutput::Yaml,
    }
}

async fn serve_cluster(
    options: ClusterOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DevCommandError> {
    let kubeconfig_out = options.kubeconfig_out.clone();
    let cluster = Cluster::start(options).await?;
    let kubeconfig: &Path = kubeconfig_out.as_deref().unwrap_or(&cluster.kubeconfig);
    tracing::info!(
        url = %cluster.url,
        node = %cluster.node_name,
        kubeconfig = %kubeconfig.display(),
        run_dir = %cluster.run_dir.display(),
        "dev cluster ready"
    );
    eprintln!(
        "netclaim dev: API server {} on node {}; try: kubectl --kubeconfig {} get resourceslices,resourceclaims,pods -o wide",
        cluster.url,
        cluster.node_name,
        kubeconfig.display()
    );
    shutdown.await;
    tracing::info!("shutting down: tearing pods down");
    cluster.stop().await;
    Ok(())
}

async fn serve_nodes(
    options: NodesOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DevCommandError> {
    let kubeconfig_out = options.kubeconfig_out.clone();
    let cluster = NodesCluster::start(options).await?;
    let kubeconfig: &Path = kubeconfig_out.as_deref().unwrap_or(&cluster.kubeconfig);
    tracing::info!(
        url = %cluster.url,
        nodes = cluster.nodes.len(),
        kubeconfig = %kubeconfig.display(),
        run_dir = %cluster.run_dir.display(),
        "dev cluster ready"
    );
    eprintln!(
        "netclaim dev: API server {} with {} nodes; try: kubectl --kubeconfig {} get nodes,resourceslices,resourceclaims,pods -o wide",
        cluster.url,
        cluster.nodes.len(),
        kubeconfig.display()
    );
    for node in &cluster.nodes {
        eprintln!(
            "  node {}: kubeconfig {} (inside the node's netns), netns {}, daemon pid {}",
            node.name,
            node.kubeconfig.display(),
            node.netns.display(),
            node.daemon_pid().map_or_else(|| "?".to_owned(), |pid| pid.to_string()),
        );
    }
    let outcome = tokio::select! {
        () = shutdown => None,
        (node, status) = cluster.daemon_exited() => Some((node, status)),
    };
    if let Some((node, status)) = &outcome {
        tracing::error!(%node, %status, "a node daemon ended; stopping the cluster");
    }
    tracing::info!("shutting down: tearing pods down");
    cluster.stop().await;
    match outcome {
        None => Ok(()),
        Some((node, status)) => {
            Err(DevCommandError::DaemonExited { node, status: status.to_string() })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_name_prefers_the_flag_then_a_valid_host_name() {
        assert_eq!(node_name(Some("n1"), Some("host")), "n1");
        assert_eq!(node_name(None, Some("Build-Box-7\n")), "build-box-7");
        assert_eq!(node_name(None, Some("under_score")), FALLBACK_NODE_NAME);
        assert_eq!(node_name(None, None), FALLBACK_NODE_NAME);
    }

    #[test]
    fn parent_bandwidth_reaches_every_node_daemon_of_dev_nodes() {
        let parsed = crate::cli::parse(
            ["netclaim", "dev", "--nodes", "2", "--parent-bandwidth", "uplink0=1G"]
                .map(str::to_owned),
        );
        let crate::cli::Parsed::Run(cli) = parsed else { panic!("{parsed:?}") };
        let crate::cli::Command::Dev(args) = cli.command else { panic!("not dev") };
        let options = nodes_options(&args, 2).unwrap();
        let flags: Vec<String> =
            options.selection.parent_bandwidth.iter().map(ToString::to_string).collect();
        assert_eq!(flags, ["uplink0=1G"]);
        // The default selection (each node's uplink, shared) is kept beside it.
        assert_eq!(options.selection.shared_parents, ["uplink0"]);
    }
}
