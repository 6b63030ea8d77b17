//! `netclaim controller`: turn the flags into a [`ControllerConfig`] and run the controller
//! until SIGTERM/SIGINT.

use super::ControllerArgs;
use crate::controller::{self, ControllerConfig, ControllerError, lease_name};
use crate::k8s::leader_election::{LeaseConfig, default_identity};
use crate::k8s::{self, ClientError};

/// Namespace of the Lease when neither the flag nor `POD_NAMESPACE` says.
pub const DEFAULT_LEASE_NAMESPACE: &str = "kube-system";

/// Why `netclaim controller` could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ControllerCommandError {
    /// `POD_NAMESPACE` is not a namespace name.
    #[error("invalid POD_NAMESPACE {0:?}: must be a lowercase DNS label (RFC 1123)")]
    InvalidPodNamespace(String),
    /// The async runtime could not start.
    #[error("starting the async runtime")]
    Runtime(#[source] std::io::Error),
    /// A signal handler could not be installed.
    #[error("installing a signal handler")]
    Signal(#[source] std::io::Error),
    /// No API client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The controller failed.
    #[error(transparent)]
    Controller(#[from] ControllerError),
}

impl ControllerCommandError {
    /// Whether this is a usage error (exit code 2) rather than a runtime failure.
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::InvalidPodNamespace(_))
    }
}

/// The Lease namespace: the flag, else `pod_namespace` (the downward API's `POD_NAMESPACE`,
/// so the Lease lives beside the Deployment), else [`DEFAULT_LEASE_NAMESPACE`].
pub fn lease_namespace(
    flag: Option<&str>,
    pod_namespace: Option<&str>,
) -> Result<String, ControllerCommandError> {
    if let Some(namespace) = flag {
        return Ok(namespace.to_owned());
    }
    match pod_namespace.map(str::trim).filter(|ns| !ns.is_empty()) {
        Some(ns) if crate::inventory::naming::is_dns_label(ns) => Ok(ns.to_owned()),
        Some(ns) => Err(ControllerCommandError::InvalidPodNamespace(ns.to_owned())),
        None => Ok(DEFAULT_LEASE_NAMESPACE.to_owned()),
    }
}

/// Builds the configuration from the flags and `POD_NAMESPACE` (no API calls).
pub fn config(
    args: &ControllerArgs,
    pod_namespace: Option<&str>,
) -> Result<ControllerConfig, ControllerCommandError> {
    let leader_election = if args.leader_election {
        let namespace = lease_namespace(args.leader_election_namespace.as_deref(), pod_namespace)?;
        Some(LeaseConfig::new(&namespace, &lease_name(&args.driver_name), &default_identity()))
    } else {
        None
    };
    Ok(ControllerConfig {
        driver_name: args.driver_name.clone(),
        metrics_address: Some(args.metrics_address),
        metrics_security: args.metrics_security.security(&["netclaim-controller"]),
        block_release_grace: args.block_release_grace,
        leader_election,
        gc_interval: args.gc_interval,
    })
}

/// Runs the controller on a multi-threaded runtime until SIGTERM/SIGINT.
pub fn run(args: &ControllerArgs) -> Result<(), ControllerCommandError> {
    let pod_namespace = std::env::var("POD_NAMESPACE").ok();
    let config = config(args, pod_namespace.as_deref())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("netclaim-controller")
        .build()
        .map_err(ControllerCommandError::Runtime)?;
    let result = runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate =
            signal(SignalKind::terminate()).map_err(ControllerCommandError::Signal)?;
        let mut interrupt =
            signal(SignalKind::interrupt()).map_err(ControllerCommandError::Signal)?;
        let clients = k8s::clients(args.kubeconfig.as_deref(), k8s::UNARY_READ_TIMEOUT).await?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM: stopping"),
                _ = interrupt.recv() => tracing::info!("SIGINT: stopping"),
            }
        };
        controller::run(clients, config, shutdown).await?;
        Ok(())
    });
    // Watches end with the runtime; do not wait for them.
    runtime.shutdown_timeout(std::time::Duration::from_millis(200));
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Command, Parsed, parse};
    use crate::metrics::MetricsSecurity;

    fn args(argv: &[&str]) -> ControllerArgs {
        let Parsed::Run(cli) = parse(["netclaim", "controller"].iter().chain(argv)) else {
            panic!("{argv:?} refused")
        };
        let Command::Controller(parsed) = cli.command else { panic!("wrong subcommand") };
        parsed
    }

    fn invalid(argv: &[&str]) -> String {
        match parse(["netclaim", "controller"].iter().chain(argv)) {
            Parsed::Invalid(line) => line,
            other => panic!("expected an error for {argv:?}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_design() {
        let args = args(&[]);
        assert_eq!(args.driver_name, "netclaim.dev");
        assert_eq!(args.metrics_address.to_string(), "127.0.0.1:9179");
        assert_eq!(config(&args, None).expect("valid").metrics_security, MetricsSecurity::Plain);
        assert_eq!(args.block_release_grace, std::time::Duration::from_mins(10));
        assert!(args.leader_election);
        let config = config(&args, None).expect("valid");
        let lease = config.leader_election.expect("leader election is on by default");
        assert_eq!(
            (lease.namespace.as_str(), lease.name.as_str()),
            ("kube-system", "netclaim-controller")
        );
        assert_eq!(lease.lease_duration, std::time::Duration::from_secs(15));
        assert_eq!(lease.retry_period, std::time::Duration::from_secs(2));
    }

    #[test]
    fn leader_election_can_be_turned_off_and_the_namespace_chosen() {
        assert!(!args(&["--leader-election=false"]).leader_election);
        assert!(args(&["--leader-election"]).leader_election);
        assert!(
            config(&args(&["--leader-election=false"]), None)
                .expect("valid")
                .leader_election
                .is_none()
        );
        let from_pod = config(&args(&[]), Some("netclaim-system")).expect("valid");
        assert_eq!(from_pod.leader_election.expect("on").namespace, "netclaim-system");
        let flag = config(&args(&["--leader-election-namespace", "ops"]), Some("netclaim-system"))
            .expect("valid");
        assert_eq!(flag.leader_election.expect("on").namespace, "ops");
        let other = config(&args(&["--driver-name", "net.example.com"]), None).expect("valid");
        assert_eq!(other.leader_election.expect("on").name, "netclaim-controller.net.example.com");
        assert!(matches!(
            config(&args(&[]), Some("Bad_NS")),
            Err(ControllerCommandError::InvalidPodNamespace(_))
        ));
    }

    #[test]
    fn bad_flags_are_one_line_naming_the_flag() {
        let line = invalid(&["--leader-election=maybe"]);
        assert!(line.contains("maybe") && line.contains("--leader-election"), "{line}");
        let line = invalid(&["--block-release-grace", "10 minutes"]);
        assert!(line.contains("--block-release-grace"), "{line}");
        let line = invalid(&["--metrics-address", "nowhere"]);
        assert!(line.contains("--metrics-address"), "{line}");
        let line = invalid(&["--leader-election-namespace", "Kube_System"]);
        assert!(line.contains("--leader-election-namespace"), "{line}");
        assert!(!line.contains('\n'));
    }
}
