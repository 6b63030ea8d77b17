//! `netclaim node`: turn the flags into a [`NodeConfig`] and run the daemon.

use super::{NodeArgs, SharingModeArg, StatsHookArg};
use crate::host::bpf::HookKind;
use crate::inventory::publish::RequestedSharing;
use crate::inventory::{InventoryError, Selection, SharingMode};
use crate::kubelet::KubeletError;
use crate::node::{self, NodeConfig, NodeError, StatsConfig};

/// Why `netclaim node` could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum NodeCommandError {
    /// Neither `--node-name`, `NETCLAIM_NODE_NAME` nor `NODE_NAME` is set.
    #[error("--node-name is required (or NETCLAIM_NODE_NAME / NODE_NAME)")]
    MissingNodeName,
    /// `NODE_NAME` is not a DNS subdomain.
    #[error("invalid NODE_NAME {0:?}: must be a lowercase DNS subdomain (RFC 1123)")]
    InvalidNodeName(String),
    /// Bad interface patterns.
    #[error(transparent)]
    Selection(#[from] InventoryError),
    /// Unusable kubelet plugin settings (a socket path too long for `sun_path`).
    #[error(transparent)]
    Kubelet(#[from] KubeletError),
    /// The async runtime could not start.
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    /// The daemon failed.
    #[error(transparent)]
    Daemon(#[from] NodeError),
}

impl NodeCommandError {
    /// Whether this is a usage error (exit code 2) rather than a runtime failure.
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::MissingNodeName
                | Self::InvalidNodeName(_)
                | Self::Selection(_)
                | Self::Kubelet(_)
        )
    }
}

/// Builds the configuration from the flags (no I/O).
pub fn config(args: &NodeArgs) -> Result<NodeConfig, NodeCommandError> {
    let node_name = if let Some(name) = &args.node_name {
        name.clone()
    } else {
        let name = std::env::var("NODE_NAME").map_err(|_| NodeCommandError::MissingNodeName)?;
        if !crate::inventory::naming::is_dns_subdomain(&name) {
            return Err(NodeCommandError::InvalidNodeName(name));
        }
        name
    };
    let sharing = match args.selection.sharing_mode {
        SharingModeArg::Auto => RequestedSharing::Auto,
        SharingModeArg::Capacity => RequestedSharing::Capacity,
        SharingModeArg::Slots => RequestedSharing::Slots,
    };
    let selection = Selection::new(
        &args.selection.include_interfaces,
        &args.selection.exclude_interfaces,
        &args.selection.shared_parents,
        SharingMode::Capacity,
    )?
    .with_parent_bandwidth(&args.selection.parent_bandwidth);
    let config = NodeConfig {
        node_name: node_name.clone(),
        driver_name: args.driver_name.clone(),
        kubeconfig: args.kubeconfig.clone(),
        selection,
        sharing,
        metrics_address: args.metrics_address,
        metrics_security: args.metrics_security.security(&[&node_name]),
        metrics_pod_labels: args.metrics_pod_labels,
        sysfs_root: args.sysfs_root.clone(),
        state_dir: args.state_dir.clone(),
        kubelet_registry_dir: args.kubelet_registry_dir.clone(),
        kubelet_plugin_dir: args.kubelet_plugin_dir.clone().unwrap_or_else(|| {
            std::path::Path::new("/var/lib/kubelet/plugins").join(&args.driver_name)
        }),
        nri_socket: args.nri_socket.clone(),
        nri_plugin_index: args.nri_plugin_index.clone(),
        cdi_spec_dir: Some(args.cdi_spec_dir.clone()).filter(|dir| !dir.as_os_str().is_empty()),
        stats: Some(args.bpffs.clone()).filter(|dir| !dir.as_os_str().is_empty()).map(|bpffs| {
            StatsConfig {
                bpffs,
                hook: match args.stats_hook {
                    StatsHookArg::Tcx => HookKind::Tcx,
                    StatsHookArg::Auto | StatsHookArg::Clsact => HookKind::Clsact,
                },
                status_interval: args.stats_interval,
            }
        }),
        block_release_grace: args.block_release_grace,
    };
    config.kubelet_plugin().validate()?;
    Ok(config)
}

/// Runs the daemon on a multi-threaded runtime until SIGTERM/SIGINT.
pub fn run(args: &NodeArgs) -> Result<(), NodeCommandError> {
    let config = config(args)?;
    raise_fd_limit();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("netclaim-worker")
        .build()
        .map_err(NodeCommandError::Runtime)?;
    runtime.block_on(node::run(config))?;
    // Background tasks (watch, netlink) end with the runtime; do not wait for them.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit before any pod is served: the daemon
/// holds descriptors per pod (docs/operations.md, "File descriptors"), and a runtime may start
/// it with a soft limit of 1024. A failure is logged, not fatal: the daemon still serves the
/// pods its limit allows.
fn raise_fd_limit() {
    match crate::host::fd_limit::raise_soft_to_hard() {
        Ok(limits) => tracing::info!(
            soft_before = limits.soft_before,
            soft = limits.soft,
            hard = limits.hard,
            "file descriptor limit (RLIMIT_NOFILE)"
        ),
        Err(err) => tracing::warn!(
            error = %crate::model::cause::chain(&err),
            "could not raise the file descriptor limit (RLIMIT_NOFILE)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_config(extra: &[&str]) -> Result<NodeConfig, NodeCommandError> {
        let args = ["netclaim", "node", "--node-name", "node-a"].iter().chain(extra);
        let crate::cli::Parsed::Run(cli) = crate::cli::parse(args) else { panic!("parses") };
        let crate::cli::Command::Node(node_args) = cli.command else { panic!("not node") };
        config(&node_args)
    }

    #[test]
    fn a_socket_path_too_long_for_sun_path_is_a_usage_error_naming_the_flag() {
        // `<plugin-dir>/dra.sock`: 100 + 9 bytes.
        let plugin_dir = format!("/{}", "p".repeat(99));
        let err = node_config(&["--kubelet-plugin-dir", &plugin_dir]).unwrap_err();
        assert!(err.is_usage(), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("--kubelet-plugin-dir: ") && text.contains(" 109 bytes"),
            "{text}"
        );

        // `<registry-dir>/netclaim.dev-reg.sock`: 90 + 22 bytes.
        let registry_dir = format!("/{}", "r".repeat(89));
        let err = node_config(&["--kubelet-registry-dir", &registry_dir]).unwrap_err();
        assert!(err.is_usage(), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("--kubelet-registry-dir: ") && text.contains(" 112 bytes"),
            "{text}"
        );

        // The defaults fit.
        node_config(&[]).unwrap();
    }

    #[test]
    fn metrics_are_plain_on_loopback_unless_the_secure_mode_is_asked_for() {
        use crate::metrics::MetricsSecurity;
        use crate::metrics::tls::TlsSource;

        let config = node_config(&[]).unwrap();
        assert_eq!(config.metrics_address.to_string(), "127.0.0.1:9178");
        assert_eq!(config.metrics_security, MetricsSecurity::Plain);
        assert!(config.metrics_pod_labels);

        let config = node_config(&["--metrics-secure", "--metrics-address=0.0.0.0:9178"]).unwrap();
        let MetricsSecurity::Secure(TlsSource::SelfSigned { names }) = config.metrics_security
        else {
            panic!("a self-signed certificate: {:?}", config.metrics_security)
        };
        assert!(names.contains(&"node-a".to_owned()), "{names:?}");
        let files =
            ["--metrics-secure=true", "--metrics-tls-cert-file=/c", "--metrics-tls-key-file=/k"];
        assert_eq!(
            node_config(&files).unwrap().metrics_security,
            MetricsSecurity::Secure(TlsSource::Files { cert: "/c".into(), key: "/k".into() })
        );
        assert!(!node_config(&["--metrics-pod-labels=false"]).unwrap().metrics_pod_labels);
        // A certificate without its key, or without the secure mode, is a usage error.
        for partial in [&["--metrics-secure", "--metrics-tls-cert-file=/c"][..], &files[1..]] {
            let args = ["netclaim", "node", "--node-name", "node-a"].iter().chain(partial);
            let parsed = crate::cli::parse(args);
            assert!(matches!(parsed, crate::cli::Parsed::Invalid(_)), "{partial:?}: {parsed:?}");
        }
    }
}
