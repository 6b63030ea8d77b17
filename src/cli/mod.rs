//! Command-line interface: flags, environment variables and their validation (DESIGN §1).
//!
//! Every flag of a subcommand also reads `NETCLAIM_<FLAG>` from the environment, except
//! `-o/--output`, which reads `NETCLAIM_<COMMAND>_OUTPUT` ([`ENVIRONMENT_HELP`]). Parse
//! errors are reported by [`parse`] as one line naming the flag or value, with exit code 2;
//! so are the values only checked after parsing (an interface glob).

pub mod controller;
#[cfg(feature = "dev")]
pub mod dev;
pub mod document;
pub mod inventory;
pub mod metrics;
pub mod node;
pub mod status;
pub mod version;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use self::metrics::MetricsSecurityArgs;
use crate::inventory::naming;
use crate::model::names::DEFAULT_DRIVER_NAME;

/// How flags map to environment variables, printed under `netclaim --help`.
pub const ENVIRONMENT_HELP: &str = "\
Environment: every flag also reads NETCLAIM_<FLAG> (--state-dir: NETCLAIM_STATE_DIR), a flag \
on the command line wins. -o/--output (table, json or yaml on every command that prints data) \
reads NETCLAIM_<COMMAND>_OUTPUT instead (NETCLAIM_STATUS_OUTPUT, NETCLAIM_INVENTORY_OUTPUT, \
NETCLAIM_DEV_OUTPUT, NETCLAIM_VERSION_OUTPUT), so a format set for one command leaves the \
others alone. NO_COLOR=1 turns log colours off (they are only used on a terminal).

Exit codes: 0 success, 1 failure, 2 invalid command line or flag value (one line naming the \
flag).";

/// netclaim: pod network interfaces through Kubernetes DRA, without CNI.
#[derive(Debug, Parser)]
#[command(
    name = "netclaim",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = ENVIRONMENT_HELP
)]
pub struct Cli {
    /// Log line format (level from RUST_LOG, default info).
    #[arg(long, global = true, env = "NETCLAIM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node daemon: publish this node's devices as ResourceSlices.
    Node(NodeArgs),
    /// Run the cluster controller: PodNetwork conditions, DeviceClasses, IPBlock collection
    /// (one acting replica per cluster, elected on a Lease).
    Controller(ControllerArgs),
    /// Run Kubernetes in a box: API server, allocator, node daemon and dev kubelet (`--demo`
    /// shows it working; `--api-only` serves just the API).
    #[cfg(feature = "dev")]
    Dev(DevArgs),
    /// Print the ResourceSlices this node would publish, without any cluster.
    Inventory(InventoryArgs),
    /// Show what the node daemon on this node is doing (devices, claims, pods), read from
    /// its status socket `<state-dir>/netclaim.sock`.
    Status(StatusArgs),
    /// Print version and supported API versions.
    Version(VersionArgs),
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// `--sharing-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SharingModeArg {
    /// Consumable capacity, falling back to slots when the API server drops it.
    Auto,
    /// Consumable capacity (Kubernetes 1.36+, or 1.34/1.35 with DRAConsumableCapacity).
    Capacity,
    /// N exclusive slot devices per shared parent.
    Slots,
}

/// Device-selection flags shared by `netclaim node` and `netclaim inventory`.
#[derive(Debug, Clone, Args)]
pub struct DeviceSelectionArgs {
    /// Comma list of interface-name globs to publish (default: every non-virtual
    /// interface). A pattern here also admits virtual interfaces (veth, vxlan, ...).
    #[arg(long, env = "NETCLAIM_INCLUDE_INTERFACES", value_delimiter = ',', value_name = "GLOBS")]
    pub include_interfaces: Vec<String>,

    /// Comma list of interface-name globs never to publish for exclusive use.
    #[arg(long, env = "NETCLAIM_EXCLUDE_INTERFACES", value_delimiter = ',', value_name = "GLOBS")]
    pub exclude_interfaces: Vec<String>,

    /// Comma list of host interfaces (names or PCI addresses) published as shared parents
    /// for macvlan/ipvlan.
    #[arg(long, env = "NETCLAIM_SHARED_PARENTS", value_delimiter = ',', value_name = "INTERFACES")]
    pub shared_parents: Vec<String>,

    /// How shared parents are published.
    #[arg(long, env = "NETCLAIM_SHARING_MODE", value_enum, default_value_t = SharingModeArg::Auto)]
    pub sharing_mode: SharingModeArg,

    /// The netclaim.dev/bandwidth capacity of a shared parent, `<interface>=<quantity>` in
    /// bits per second (eth1=10G); repeatable or a comma list. Wins over the link's speed.
    #[arg(
        long,
        env = "NETCLAIM_PARENT_BANDWIDTH",
        value_delimiter = ',',
        value_name = "IF=QUANTITY"
    )]
    pub parent_bandwidth: Vec<crate::inventory::bandwidth::ParentBandwidth>,
}

/// Flags of `netclaim inventory`.
#[derive(Debug, Clone, Args)]
pub struct InventoryArgs {
    /// Device selection, as for `netclaim node`.
    #[command(flatten)]
    pub selection: DeviceSelectionArgs,

    /// Node name, also the pool name (default: $NODE_NAME, else the host name).
    #[arg(long, env = "NETCLAIM_NODE_NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,

    /// DRA driver name.
    #[arg(long, env = "NETCLAIM_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME, value_parser = parse_driver_name)]
    pub driver_name: String,

    /// Output: a table with the reason for every interface left out, or the ResourceSlices
    /// as a JSON `List` or YAML documents (`kubectl apply -f` takes both).
    #[arg(short, long, env = "NETCLAIM_INVENTORY_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    /// Root of the sysfs tree to read (for tests and for inspecting another mount).
    #[arg(long, env = "NETCLAIM_SYSFS_ROOT", default_value = "/sys", hide = true)]
    pub sysfs_root: PathBuf,

    /// Kubeconfig file: also read the PodNetworks and this node's labels, and show the
    /// network devices the daemon would publish (without it, no cluster is contacted).
    #[arg(long, env = "NETCLAIM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Flags of `netclaim node`.
#[derive(Debug, Clone, Args)]
pub struct NodeArgs {
    /// Device selection.
    #[command(flatten)]
    pub selection: DeviceSelectionArgs,

    /// Node name, also the pool name (required; $NODE_NAME is read too).
    #[arg(long, env = "NETCLAIM_NODE_NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,

    /// DRA driver name.
    #[arg(long, env = "NETCLAIM_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME, value_parser = parse_driver_name)]
    pub driver_name: String,

    /// Kubeconfig file (default: in-cluster service account, else $KUBECONFIG).
    #[arg(long, env = "NETCLAIM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Address of /metrics, /healthz and /readyz (loopback by default: /metrics names pods
    /// and their traffic; see --metrics-secure).
    #[arg(long, env = "NETCLAIM_METRICS_ADDRESS", default_value = "127.0.0.1:9178")]
    pub metrics_address: std::net::SocketAddr,

    /// How /metrics is protected.
    #[command(flatten)]
    pub metrics_security: MetricsSecurityArgs,

    /// Label the pod interface series (`netclaim_interface_*`) with the pod's namespace,
    /// name and claim; `false` sums them per interface name, for clusters that export no
    /// per-pod data.
    #[arg(
        long,
        env = "NETCLAIM_METRICS_POD_LABELS",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub metrics_pod_labels: bool,

    /// Root of the sysfs tree to read.
    #[arg(long, env = "NETCLAIM_SYSFS_ROOT", default_value = "/sys", hide = true)]
    pub sysfs_root: PathBuf,

    /// Durable state (prepared claims, address leases).
    #[arg(long, env = "NETCLAIM_STATE_DIR", default_value = "/var/lib/netclaim")]
    pub state_dir: PathBuf,

    /// Kubelet's plugin registry directory (our registration socket goes here).
    #[arg(
        long,
        env = "NETCLAIM_KUBELET_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub kubelet_registry_dir: PathBuf,

    /// Our kubelet plugin directory, holding dra.sock (default:
    /// `/var/lib/kubelet/plugins/<driver-name>`).
    #[arg(long, env = "NETCLAIM_KUBELET_PLUGIN_DIR")]
    pub kubelet_plugin_dir: Option<PathBuf>,

    /// The container runtime's NRI socket (pod sandbox events).
    #[arg(long, env = "NETCLAIM_NRI_SOCKET", default_value = "/var/run/nri/nri.sock")]
    pub nri_socket: PathBuf,

    /// Where CDI specs for device metadata go (KEP-5304; one of the runtime's
    /// `cdi_spec_dirs`). An empty value turns device metadata off.
    #[arg(long, env = "NETCLAIM_CDI_SPEC_DIR", default_value = "/var/run/cdi")]
    pub cdi_spec_dir: PathBuf,

    /// Our NRI plugin index: two digits; plugins run in index order.
    #[arg(long, env = "NETCLAIM_NRI_PLUGIN_INDEX", default_value = "10", value_parser = parse_nri_plugin_index)]
    pub nri_plugin_index: String,

    /// How often changed traffic counters are written to the claim status (`300s`, `5m`,
    /// `1h`); `0` keeps them out of the status (Prometheus keeps them).
    #[arg(long, env = "NETCLAIM_STATS_INTERVAL", default_value = "300s", value_parser = parse_duration)]
    pub stats_interval: std::time::Duration,

    /// Where the BPF file system is mounted (the traffic counters are pinned under
    /// `<bpffs>/netclaim/<node>/`). An empty value turns the counters off.
    #[arg(long, env = "NETCLAIM_BPFFS", default_value = "/sys/fs/bpf", value_parser = parse_path_or_empty)]
    pub bpffs: PathBuf,

    /// How counters hook onto pod interfaces: `clsact` filters, or `tcx` links (Linux 6.6+;
    /// each attach and release waits for an RCU grace period holding RTNL, which stalls
    /// every other pod's attach meanwhile). `auto` is clsact.
    #[arg(long, env = "NETCLAIM_STATS_HOOK", value_enum, default_value_t = StatsHookArg::Auto)]
    pub stats_hook: StatsHookArg,

    /// How long an empty IPBlock of this node is kept before it is given back (`10m`,
    /// `600s`); a block of a PodNetwork being deleted goes at once.
    #[arg(long, env = "NETCLAIM_BLOCK_RELEASE_GRACE", default_value = "10m", value_parser = parse_duration)]
    pub block_release_grace: std::time::Duration,
}

/// Flags of `netclaim controller`.
#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    /// Kubeconfig file (default: in-cluster service account, else $KUBECONFIG).
    #[arg(long, env = "NETCLAIM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// DRA driver name: PodNetworks with this `spec.provider`, the DeviceClasses' driver.
    #[arg(long, env = "NETCLAIM_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME, value_parser = parse_driver_name)]
    pub driver_name: String,

    /// Address of /metrics, /healthz and /readyz (loopback by default; see
    /// --metrics-secure).
    #[arg(long, env = "NETCLAIM_METRICS_ADDRESS", default_value = "127.0.0.1:9179")]
    pub metrics_address: std::net::SocketAddr,

    /// How /metrics is protected.
    #[command(flatten)]
    pub metrics_security: MetricsSecurityArgs,

    /// How long an empty IPBlock is kept (nodes), and how long a static reservation whose
    /// claim is gone is kept before the controller collects it (`10m`, `600s`).
    #[arg(long, env = "NETCLAIM_BLOCK_RELEASE_GRACE", default_value = "10m", value_parser = parse_duration)]
    pub block_release_grace: std::time::Duration,

    /// Hold the `coordination.k8s.io` Lease before acting (`--leader-election=false` for a
    /// single replica).
    #[arg(
        long,
        env = "NETCLAIM_LEADER_ELECTION",
        default_value_t = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub leader_election: bool,

    /// Namespace of the Lease (default: $POD_NAMESPACE, the pod's own namespace from the
    /// downward API, else kube-system).
    #[arg(long, env = "NETCLAIM_LEADER_ELECTION_NAMESPACE", value_parser = parse_namespace)]
    pub leader_election_namespace: Option<String>,

    /// How often the IPBlock garbage collection runs.
    #[arg(long, env = "NETCLAIM_GC_INTERVAL", default_value = "30s", value_parser = parse_positive_duration, hide = true)]
    pub gc_interval: std::time::Duration,
}

/// A namespace name: a DNS label.
fn parse_namespace(value: &str) -> Result<String, String> {
    if naming::is_dns_label(value) {
        Ok(value.to_owned())
    } else {
        Err("must be a lowercase DNS label (RFC 1123)".to_owned())
    }
}

/// A duration that is not zero.
fn parse_positive_duration(text: &str) -> Result<std::time::Duration, String> {
    let duration = parse_duration(text)?;
    if duration.is_zero() {
        Err(format!("{text:?} must be longer than zero"))
    } else {
        Ok(duration)
    }
}

/// `--stats-hook`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StatsHookArg {
    /// clsact (decision 0013: tcx stalls concurrent attaches).
    Auto,
    /// tcx links.
    Tcx,
    /// clsact filters.
    Clsact,
}

/// A path where an empty value means "off" (clap's own path parser refuses empty values).
#[allow(clippy::unnecessary_wraps, reason = "clap calls value parsers that return a Result")]
fn parse_path_or_empty(text: &str) -> Result<PathBuf, String> {
    Ok(PathBuf::from(text))
}

/// `300s`, `5m`, `1h`, `250ms` or a bare number of seconds.
fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (a whole number with ms, s, m or h)"))?;
    let duration = match unit {
        "" | "s" => std::time::Duration::from_secs(value),
        "ms" => std::time::Duration::from_millis(value),
        "m" => std::time::Duration::from_mins(value),
        "h" => std::time::Duration::from_hours(value),
        other => return Err(format!("unknown unit {other:?} in {text:?} (ms, s, m or h)")),
    };
    Ok(duration)
}

/// `--nri-plugin-index`: NRI orders plugins by a two-digit index.
fn parse_nri_plugin_index(value: &str) -> Result<String, String> {
    if value.len() == 2 && value.bytes().all(|b| b.is_ascii_digit()) {
        Ok(value.to_owned())
    } else {
        Err(format!("{value:?} is not a two-digit NRI plugin index (00-99)"))
    }
}

/// Flags of `netclaim dev`.
#[derive(Debug, Clone, Args)]
pub struct DevArgs {
    /// Serve only the in-memory Kubernetes API server (no allocator, node daemon or kubelet).
    #[arg(long, env = "NETCLAIM_API_ONLY", conflicts_with = "demo")]
    pub api_only: bool,

    /// Run the demo: a shared parent, a DeviceClass, a ResourceClaimTemplate and 15 pods
    /// with a macvlan each; ping between them; clean up; exit 0 only if all of it worked.
    /// With --nodes: the pods get their addresses from PodNetwork demo-net (each node
    /// claims IPBlocks of 10.10.1.0/24) and ping across nodes.
    #[arg(long, env = "NETCLAIM_DEMO")]
    pub demo: bool,

    /// Run N nodes on this machine: each a network namespace of its own (with its own sysfs)
    /// running its own node daemon, with an uplink `uplink0` into one bridge; the allocator
    /// places pods across them. Nodes are named `<node-name>-1..N` (default `dev-node-1..N`).
    #[arg(
        long,
        env = "NETCLAIM_NODES",
        value_name = "N",
        value_parser = clap::value_parser!(u16).range(1..=64),
        conflicts_with_all = ["api_only", "containerd"]
    )]
    pub nodes: Option<u16>,

    /// How often the node daemon writes changed traffic counters to the claim status (`0`:
    /// never). Short by default so the dev cluster shows them soon after traffic; counters
    /// are pinned in a bpffs the cluster mounts in its run dir.
    #[arg(long = "stats-interval", env = "NETCLAIM_STATS_INTERVAL", default_value = "2s", value_parser = parse_duration)]
    pub dev_stats_interval: std::time::Duration,

    /// Address the API server listens on (port 0 picks a free one; loopback only by design:
    /// there is no authentication).
    #[arg(long, env = "NETCLAIM_LISTEN", default_value = "127.0.0.1:6443")]
    pub listen: std::net::SocketAddr,

    /// Write a kubeconfig for the server here (removed again on exit).
    #[arg(long, env = "NETCLAIM_KUBECONFIG_OUT")]
    pub kubeconfig_out: Option<PathBuf>,

    /// Behave like Kubernetes 1.34/1.35 with DRAConsumableCapacity off: drop
    /// allowMultipleAllocations and capacity request policies from ResourceSlices.
    #[arg(long, env = "NETCLAIM_DROP_CONSUMABLE_CAPACITY")]
    pub drop_consumable_capacity: bool,

    /// Run pod sandboxes through this containerd CRI socket (NRI enabled) instead of bare
    /// network namespaces.
    #[arg(long, env = "NETCLAIM_CONTAINERD", value_name = "SOCKET")]
    pub containerd: Option<PathBuf>,

    /// With --containerd: containerd's NRI socket, where the node daemon's plugin connects.
    #[arg(
        long,
        env = "NETCLAIM_CONTAINERD_NRI_SOCKET",
        default_value = "/var/run/nri/nri.sock",
        value_name = "SOCKET"
    )]
    pub containerd_nri_socket: PathBuf,

    /// With --containerd: a CDI spec dir that containerd reads (one of its `cdi_spec_dirs`,
    /// CDI on). The node daemon writes its device metadata specs there and containers that
    /// use a claim get its CDI ids, so they read their metadata file (KEP-5304). Unset: the
    /// specs stay in the run dir and containers get no CDI ids.
    #[arg(long, env = "NETCLAIM_CONTAINERD_CDI_SPEC_DIR", value_name = "DIR")]
    pub containerd_cdi_spec_dir: Option<PathBuf>,

    /// Node name, also the pool name (default: the host name if it is a DNS subdomain, else
    /// dev-node); with --nodes, the base of the node names.
    #[arg(long, env = "NETCLAIM_NODE_NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,

    /// DRA driver name.
    #[arg(long, env = "NETCLAIM_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME, value_parser = parse_driver_name)]
    pub driver_name: String,

    /// The node daemon's device selection (the demo publishes only its own veth; with
    /// --nodes every daemon publishes its uplink0, shared, unless these are given).
    #[command(flatten)]
    pub selection: DeviceSelectionArgs,

    /// Where the run dir (state, sockets, pod namespaces) is made (default: the temp dir).
    #[arg(long, env = "NETCLAIM_RUN_DIR")]
    pub run_dir: Option<PathBuf>,

    /// Demo: progress lines and tables for people, or the report as one JSON or YAML
    /// document (`human` is accepted for `table`).
    #[arg(short, long, env = "NETCLAIM_DEV_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,

    /// Demo: number of pods.
    #[arg(long, env = "NETCLAIM_DEMO_PODS", default_value_t = 15, value_parser = clap::value_parser!(u16).range(1..=200))]
    pub pods: u16,

    /// Demo: the pods' container image (with --containerd it must already be in containerd).
    #[arg(long, env = "NETCLAIM_DEMO_IMAGE", default_value = "localhost/netclaim/pause:1.0")]
    pub pod_image: String,

    /// Demo: seconds the pods have to come up.
    #[arg(long, env = "NETCLAIM_DEMO_TIMEOUT", default_value_t = 120)]
    pub ready_timeout: u64,
}

/// `-o/--output` of every command that prints data: one vocabulary, so a value that works
/// for one command works for all (each command reads its own `NETCLAIM_<COMMAND>_OUTPUT`,
/// so a setting meant for one does not change another).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// For people: tables (and the demo's progress lines).
    #[value(alias = "human")]
    Table,
    /// One JSON document.
    Json,
    /// YAML.
    Yaml,
}

/// Flags of `netclaim status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The node daemon's `--state-dir`: its status socket is `<state-dir>/netclaim.sock`.
    #[arg(long, env = "NETCLAIM_STATE_DIR", default_value = "/var/lib/netclaim")]
    pub state_dir: PathBuf,

    /// Output: a summary, then devices, claims and pods as tables; or the daemon's
    /// `NodeStatus` document as JSON or YAML.
    #[arg(short, long, env = "NETCLAIM_STATUS_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// Flags of `netclaim version`.
#[derive(Debug, Clone, Args)]
pub struct VersionArgs {
    /// Output: lines for people, or one JSON or YAML document.
    #[arg(short, long, env = "NETCLAIM_VERSION_OUTPUT", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// A Kubernetes node name: a DNS subdomain.
fn parse_node_name(value: &str) -> Result<String, String> {
    if naming::is_dns_subdomain(value) {
        Ok(value.to_owned())
    } else {
        Err("must be a lowercase DNS subdomain (RFC 1123)".to_owned())
    }
}

/// A DRA driver name: a lowercase DNS subdomain of at most 63 characters.
fn parse_driver_name(value: &str) -> Result<String, String> {
    if value.len() <= 63 && naming::is_dns_subdomain(value) {
        Ok(value.to_owned())
    } else {
        Err("must be a lowercase DNS subdomain of at most 63 characters".to_owned())
    }
}

/// Outcome of command-line parsing.
#[derive(Debug)]
pub enum Parsed {
    /// Run this.
    Run(Box<Cli>),
    /// Print this (help or version) to stdout and exit 0.
    Print(String),
    /// Print this one line to stderr and exit 2.
    Invalid(String),
}

/// Parses the command line; errors become one line that names the flag or value.
pub fn parse<I, T>(args: I) -> Parsed
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::error::ErrorKind;
    match Cli::try_parse_from(args) {
        Ok(cli) => Parsed::Run(Box::new(cli)),
        Err(err) if matches!(err.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Parsed::Print(err.to_string())
        }
        Err(err) => Parsed::Invalid(one_line(&err.to_string())),
    }
}

/// clap's message is several lines (usage, tips); keep the line that names the problem and
/// the list of accepted values when there is one.
fn one_line(message: &str) -> String {
    let mut lines = message.lines().map(str::trim).filter(|line| !line.is_empty());
    let mut summary = lines.next().unwrap_or("error: invalid command line").to_owned();
    if let Some(values) = lines.find(|line| line.starts_with("[possible values:")) {
        summary.push(' ');
        summary.push_str(values);
    }
    if !summary.starts_with("error:") {
        summary.insert_str(0, "error: ");
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    fn invalid(args: &[&str]) -> String {
        match parse(std::iter::once("netclaim").chain(args.iter().copied())) {
            Parsed::Invalid(line) => line,
            other => panic!("expected an error for {args:?}, got {other:?}"),
        }
    }

    #[test]
    fn unknown_flags_are_named_on_one_line() {
        let line = invalid(&["inventory", "--bogus"]);
        assert!(line.contains("--bogus"), "{line}");
        assert!(!line.contains('\n'));
    }

    #[test]
    fn invalid_values_are_named_with_the_accepted_ones() {
        let line = invalid(&["inventory", "-o", "xml"]);
        assert!(line.contains("xml") && line.contains("--output"), "{line}");
        assert!(line.contains("yaml"), "{line}");
        let line = invalid(&["inventory", "--sharing-mode", "sometimes"]);
        assert!(line.contains("sometimes") && line.contains("--sharing-mode"), "{line}");
        let line = invalid(&["inventory", "--driver-name", "Not_A_Name"]);
        assert!(line.contains("Not_A_Name") && line.contains("--driver-name"), "{line}");
        let line = invalid(&["inventory", "--node-name", "node_1"]);
        assert!(line.contains("node_1") && line.contains("--node-name"), "{line}");
    }

    #[test]
    fn comma_lists_split_into_values() {
        let Parsed::Run(cli) = parse([
            "netclaim",
            "inventory",
            "--shared-parents",
            "eth1,eth2",
            "--include-interfaces=ens*,enp*",
        ]) else {
            panic!("valid command line rejected");
        };
        let Command::Inventory(args) = cli.command else { panic!("wrong subcommand") };
        assert_eq!(args.selection.shared_parents, ["eth1", "eth2"]);
        assert_eq!(args.selection.include_interfaces, ["ens*", "enp*"]);
        assert_eq!(args.driver_name, "netclaim.dev");
        assert_eq!(args.output, OutputFormat::Table);
    }

    #[test]
    fn help_and_version_are_printed_not_errors() {
        assert!(
            matches!(parse(["netclaim", "--help"]), Parsed::Print(text) if text.contains("inventory"))
        );
        assert!(
            matches!(parse(["netclaim", "inventory", "--help"]), Parsed::Print(text) if text.contains("--shared-parents"))
        );
        assert!(
            matches!(parse(["netclaim", "--version"]), Parsed::Print(text) if text.contains("netclaim"))
        );
    }

    #[test]
    fn every_output_flag_reads_its_commands_variable_and_takes_the_same_values() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let mut commands = 0;
        for command in cli.get_subcommands() {
            let Some(output) = command.get_arguments().find(|a| a.get_id() == "output") else {
                continue;
            };
            commands += 1;
            let name = command.get_name().to_uppercase();
            let env = output.get_env().map(|e| e.to_string_lossy().into_owned());
            assert_eq!(env.as_deref(), Some(format!("NETCLAIM_{name}_OUTPUT").as_str()));
            let values: Vec<String> =
                output.get_possible_values().iter().map(|v| v.get_name().to_owned()).collect();
            assert_eq!(values, ["table", "json", "yaml"], "{name}");
        }
        let expected = if cfg!(feature = "dev") { 4 } else { 3 };
        assert_eq!(commands, expected, "status, inventory, version (and dev) print data");
    }

    #[cfg(feature = "dev")]
    #[test]
    fn the_demos_old_output_value_still_works() {
        let Parsed::Run(cli) = parse(["netclaim", "dev", "--demo", "-o", "human"]) else {
            panic!("-o human rejected");
        };
        let Command::Dev(args) = cli.command else { panic!("wrong subcommand") };
        assert_eq!(args.output, OutputFormat::Table);
    }

    #[test]
    fn the_cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
