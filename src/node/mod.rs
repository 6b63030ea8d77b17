//! `netclaim node`: the node daemon's composition root. Builds the adapters, runs the
//! ResourceSlice publisher with its triggers (netlink events, slice watch), loads the
//! prepared claims and pod attachments, serves kubelet's DRA calls and the device health
//! streams (fed by the health monitor), runs the NRI plugin that attaches pod interfaces,
//! serves metrics and the status API (`netclaim status`), and shuts down on SIGTERM/SIGINT.

mod block_watch;
pub mod status_api;
mod vfio_moved;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use nri_rs::{Plugin, PluginError, PluginOptions};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::attach::{AttachService, DetachingPreparer, WithDeviceMetadata, plugin_events};
use crate::cdi::LocalFiles;
use crate::claims::metadata::{DeviceMetadata, MetadataLayout};
use crate::claims::networks::NetworkPorts;
use crate::claims::{ClaimService, ServiceIdentity};
use crate::health::{self as device_health, HealthReport, MonitorInputs, MonitorSettings};
use crate::host::bpf::{CounterPins, HookKind};
use crate::host::discovery::HostInterfaces;
use crate::host::discovery::{HostDevices, host_devices};
use crate::host::link_events;
use crate::host::netlink::HostNetlink;
use crate::host::pod_links::{PodLinkError, PodLinkWatcher};
use crate::host::sysfs::Sysfs;
use crate::inventory::networks::NetworkInputs;
use crate::inventory::publish::{self, Publisher, RequestedSharing, Triggers};
use crate::inventory::slices::PoolIdentity;
use crate::inventory::{InventoryError, Selection};
use crate::k8s::claim_status::{Backoff, StatusWriter};
use crate::k8s::claims::KubeClaims;
use crate::k8s::events::NodeEvents;
use crate::k8s::ip_blocks::{KubeIpBlocks, WatchedPodNetworks};
use crate::k8s::pod_networks::PodNetworkReceiver;
use crate::k8s::resource_slices::KubeSlices;
use crate::k8s::status_sink::KubeStatus;
use crate::k8s::{self, ClientError};
use crate::kubelet::metered::MeteredPreparer;
use crate::kubelet::{KubeletPlugin, KubeletPluginConfig, KubeletPluginHandle};
use crate::metrics::{Health, Metrics, MetricsServerError};
use crate::stats::{StatsService, StatsSettings};
use crate::store::Store;

/// The daemon's claim service.
pub type NodeClaims = ClaimService<KubeClaims, HostDevices, Arc<Store>>;
/// The daemon's attach service.
pub type NodeAttach =
    AttachService<Arc<NodeClaims>, HostNetlink, Arc<Store>, WithDeviceMetadata<KubeStatus>>;

/// How often prepared claims are checked against the API besides after each NRI
/// `Synchronize` (a claim deleted while its pod was gone from the runtime is released).
const GONE_CLAIM_SWEEP: Duration = Duration::from_mins(5);
/// How long kubelet registration waits for the first publication. Nothing can be allocated
/// on this node before it, but claims prepared before a restart must stay reachable when the
/// API server is down, so registration goes ahead after this.
const FIRST_PUBLICATION_PATIENCE: Duration = Duration::from_secs(10);

/// Settings of the node daemon, validated by the CLI.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Node name, also the pool name.
    pub node_name: String,
    /// DRA driver name (also the field manager).
    pub driver_name: String,
    /// Kubeconfig file; `None` for in-cluster or `KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// Interface selection.
    pub selection: Selection,
    /// What `--sharing-mode` asked for.
    pub sharing: RequestedSharing,
    /// `/metrics`, `/healthz`, `/readyz`.
    pub metrics_address: SocketAddr,
    /// `--metrics-secure` and its certificate.
    pub metrics_security: crate::metrics::MetricsSecurity,
    /// `--metrics-pod-labels`: the pod interface series name their pod.
    pub metrics_pod_labels: bool,
    /// Sysfs root.
    pub sysfs_root: PathBuf,
    /// `--state-dir`.
    pub state_dir: PathBuf,
    /// `--kubelet-registry-dir`.
    pub kubelet_registry_dir: PathBuf,
    /// `--kubelet-plugin-dir`.
    pub kubelet_plugin_dir: PathBuf,
    /// `--nri-socket`: the runtime's NRI socket.
    pub nri_socket: PathBuf,
    /// `--nri-plugin-index`: two digits.
    pub nri_plugin_index: String,
    /// `--cdi-spec-dir`; `None` turns device metadata off.
    pub cdi_spec_dir: Option<PathBuf>,
    /// Traffic counters; `None` (an empty `--bpffs`) turns them off.
    pub stats: Option<StatsConfig>,
    /// `--block-release-grace`: how long an empty `IPBlock` of this node is kept.
    pub block_release_grace: Duration,
}

impl NodeConfig {
    /// The kubelet plugin's settings (sockets, driver name); [`KubeletPluginConfig::validate`]
    /// on them checks the socket paths against `sun_path`, naming the flag.
    #[must_use]
    pub fn kubelet_plugin(&self) -> KubeletPluginConfig {
        KubeletPluginConfig::new(
            &self.driver_name,
            &self.kubelet_registry_dir,
            &self.kubelet_plugin_dir,
        )
    }
}

/// The default `--block-release-grace` (DESIGN §1).
pub const DEFAULT_BLOCK_RELEASE_GRACE: Duration = Duration::from_mins(10);
/// How long a prepare naming a `PodNetwork` waits for the daemon's first list of them.
const POD_NETWORK_PATIENCE: Duration = Duration::from_secs(10);

/// Settings of the traffic counters.
#[derive(Debug, Clone)]
pub struct StatsConfig {
    /// `--bpffs`: where the BPF file system is mounted.
    pub bpffs: PathBuf,
    /// `--stats-hook`, resolved for the running kernel.
    pub hook: HookKind,
    /// `--stats-interval`: zero keeps the counters out of the claim status.
    pub status_interval: Duration,
}

/// A fatal daemon error.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No API client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Bad selection.
    #[error(transparent)]
    Selection(#[from] InventoryError),
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] MetricsServerError),
    /// The state dir could not be opened.
    #[error("opening the state dir: {0}")]
    State(#[from] crate::store::StoreError),
    /// The prepared claims could not be loaded.
    #[error("loading prepared claims: {0}")]
    Claims(#[from] crate::claims::LoadError),
    /// The kubelet plugin could not start or failed.
    #[error(transparent)]
    Kubelet(#[from] crate::kubelet::KubeletError),
    /// Loading the state panicked.
    #[error("loading the state: {0}")]
    StateTask(#[source] tokio::task::JoinError),
    /// The VFs of prepares that did not complete could not be checked.
    #[error("setting back VFs of prepares that did not complete: {0}")]
    VfSnapshots(#[source] crate::claims::vf_snapshots::VfSnapshotError),
    /// The pod attachments could not be loaded.
    #[error("loading pod attachments: {0}")]
    Attachments(#[source] crate::store::StoreError),
    /// The host netlink socket could not be opened.
    #[error("opening the host netlink socket: {0}")]
    Netlink(#[from] crate::podnet::LinkOpError),
    /// The NRI plugin options are invalid.
    #[error(transparent)]
    Nri(#[from] nri_rs::PluginError),
    /// The netlink event subscription failed.
    #[error("subscribing to netlink link events: {0}")]
    LinkEvents(#[source] std::io::Error),
    /// Device health could not start.
    #[error("device health: {0}")]
    DeviceHealth(#[source] PodLinkError),
    /// Installing a signal handler failed.
    #[error("installing the {signal} handler: {source}")]
    Signal {
        /// Which signal.
        signal: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Runs the daemon until SIGTERM or SIGINT.
pub async fn run(config: NodeConfig) -> Result<(), NodeError> {
    let (stop_sender, stop) = watch::channel(false);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| NodeError::Signal { signal: "SIGTERM", source })?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|source| NodeError::Signal { signal: "SIGINT", source })?;
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
        }
        let _ignored = stop_sender.send(true);
    });
    run_until(config, stop).await
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `stop` turns true; in the secure mode
/// scrapers' tokens are reviewed through `clients`.
async fn serve_metrics(
    config: &NodeConfig,
    clients: &k8s::ApiClients,
    metrics: &Arc<Metrics>,
    health: &Arc<Health>,
    stop: &watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, NodeError> {
    let mut metrics_stop = stop.clone();
    let (bound, task) = crate::metrics::serve_with(
        config.metrics_address,
        &config.metrics_security,
        || Some(k8s::access_review::KubeAccessReview::new(clients.unary.clone())),
        Arc::clone(metrics),
        Arc::clone(health),
        async move {
            let _ignored = metrics_stop.wait_for(|stopped| *stopped).await;
        },
    )
    .await?;
    tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");
    Ok(task)
}

/// Runs the daemon until `stop` turns true.
pub async fn run_until(config: NodeConfig, stop: watch::Receiver<bool>) -> Result<(), NodeError> {
    // Before anything is published or registered: a socket path kubelet cannot use would
    // otherwise leave slices of a node whose driver never registers.
    config.kubelet_plugin().validate()?;
    let metrics = Arc::new(Metrics::with_pod_labels(config.metrics_pod_labels));
    let health = Arc::new(Health::default());
    // Before the endpoint: its secure mode reviews scrapers' tokens through the API (building
    // the clients reads the configuration only; nothing is asked of the server yet).
    let clients = k8s::clients(config.kubeconfig.as_deref(), k8s::UNARY_READ_TIMEOUT).await?;
    let metrics_task = serve_metrics(&config, &clients, &metrics, &health, &stop).await?;

    let client = clients.unary.clone();
    let node_uid = node_uid(&client, &config.node_name).await;
    let owner = node_uid.clone().map(|uid| node_owner(&config.node_name, uid));
    // Every PodNetwork (one watch for the daemon) and, with this Node's labels, the inputs
    // of the node's PodNetwork devices (publisher and device lookup).
    let watches_stop = cancel_on(&stop);
    let pod_networks = k8s::pod_networks::spawn_watch(clients.watch.clone(), watches_stop.clone());
    // Namespace labels for PodNetworks' namespaceSelector, judged at prepare (DESIGN §4).
    let namespaces = k8s::namespaces::spawn_watch(
        clients.watch.clone(),
        watches_stop.clone(),
        POD_NETWORK_PATIENCE,
    );
    let network_inputs = k8s::node_networks::spawn(
        clients.watch.clone(),
        client.clone(),
        &config.node_name,
        pod_networks.clone(),
        watches_stop,
    );
    // DESIGN §6, in this order: load the state; put host-side leftovers right (devices that
    // came back from pods destroyed while the daemon was down get their names back, VLAN
    // users are counted); publish; then register with kubelet and the runtime. Running pods
    // are verified at Synchronize, off this path.
    // One set of pins for the counters and the ceilings: one program per direction does both.
    let pins = counter_pins(&config);
    let inputs = (&network_inputs, &pod_networks);
    let (attach_service, claims, store) =
        load_state(&config, pins.clone(), &client, &metrics, inputs, namespaces).await?;
    start_block_upkeep(&config, &claims, &stop);
    let identity = (config.driver_name.as_str(), config.node_name.as_str());
    block_watch::start(&claims, clients.watch.clone(), client.clone(), identity, &metrics, &stop);
    // fsyncgate: after a failed fdatasync the store refuses writes until a restart reloads
    // it from disk; the DaemonSet pod shows not ready, with the reason, until then.
    health.add_check("state", move || {
        store.is_poisoned().then(|| {
            "the state dir's journal refuses writes after a failed write or fdatasync; \
             restart the daemon"
                .to_owned()
        })
    });
    attach_service.start().await;
    let events = NodeEvents::new(client.clone(), &config.driver_name, &config.node_name, node_uid);
    let slices = KubeSlices::new(client, clients.watch, &config.driver_name, &config.node_name);
    let triggers = Triggers {
        link_changes: link_events::subscribe().map_err(NodeError::LinkEvents)?,
        moved: vfio_moved::union(attach_service.moved_devices(), claims.vfio_bound()),
        slice_events: Box::pin(slices.watch()),
        networks: network_inputs,
        stop: stop.clone(),
    };
    let publisher = new_publisher(&config, slices, owner, &claims);
    let interfaces = HostInterfaces::new(Sysfs::new(&config.sysfs_root));
    let reports = start_device_health(&config, &interfaces, &publisher, &attach_service, &stop)?;
    // What `netclaim status` shows (DESIGN §5 item 9).
    let holds = publisher.holds();
    let parts = status_api::DaemonParts::new(&claims, &attach_service, &metrics, &health, holds);
    status_api::start(&config, publisher.devices(), reports.clone(), parts, &stop);
    let publishing = publish::run(publisher, &interfaces, &events, triggers, &*metrics, &*health);
    tokio::pin!(publishing);
    let serving = async {
        if tokio::time::timeout(FIRST_PUBLICATION_PATIENCE, health.wait_until_ready())
            .await
            .is_err()
        {
            tracing::warn!(waited = ?FIRST_PUBLICATION_PATIENCE,
                "no publication yet; registering with kubelet anyway (prepared claims stay reachable)");
        }
        let kubelet =
            start_kubelet_plugin(&config, &claims, &attach_service, &metrics, reports, &stop)
                .await?;
        let nri = start_nri(
            Arc::clone(&attach_service),
            Arc::clone(&claims),
            Arc::clone(&metrics),
            &config.nri_socket,
            &config.nri_plugin_index,
            GONE_CLAIM_SWEEP,
        )?;
        Ok::<_, NodeError>((kubelet, nri))
    };
    let stats = start_stats(&config, pins, &attach_service, &stop);
    let (kubelet, nri) = tokio::select! {
        served = serving => served?,
        // Stopped before the first publication.
        () = &mut publishing => return Ok(()),
    };
    publishing.await;
    // Slices stay: kubelet removes a node's slices itself once the driver is gone for good,
    // and a restart continues at the next generation without an empty window.
    health.set_ready(false);
    // Interfaces stay in running pods (DESIGN §6): the plugin only disconnects. Attaches
    // already answered finish their statuses, metadata and records first.
    nri.stop().await;
    let _ignored = tokio::time::timeout(Duration::from_secs(2), attach_service.settled()).await;
    // Counters stay on running pods (pinned); the service only stops reading them.
    if let Some(stats) = stats {
        let _ignored = tokio::time::timeout(Duration::from_secs(1), stats).await;
    }
    kubelet.stop();
    if let Err(err) = kubelet.wait().await {
        tracing::warn!(%err, "kubelet plugin stopped with an error");
    }
    let _ignored = tokio::time::timeout(Duration::from_secs(1), metrics_task).await;
    tracing::info!("stopped");
    Ok(())
}

/// The ResourceSlice publisher of this node's pool, holding sharing changes of devices that
/// claims prepared here use (DESIGN §2).
fn new_publisher(
    config: &NodeConfig,
    slices: KubeSlices,
    owner: Option<OwnerReference>,
    claims: &Arc<NodeClaims>,
) -> Publisher<KubeSlices> {
    let pool = PoolIdentity {
        driver: config.driver_name.clone(),
        node: config.node_name.clone(),
        generation: 0,
    };
    let prepared = PreparedOnNode { claims: Arc::clone(claims), pool: pool.node.clone() };
    Publisher::new(slices, pool, config.selection.clone(), config.sharing, owner)
        .with_prepared(Arc::new(prepared))
}

/// Starts the IPBlock upkeep, which ends when `stop` turns true: adopt blocks created before
/// a restart, then release empty ones (no lock held across its API calls; a pass every
/// `grace/10`, 1 to 30 s, and on every network change).
fn start_block_upkeep(config: &NodeConfig, claims: &Arc<NodeClaims>, stop: &watch::Receiver<bool>) {
    let (claims, stop) = (Arc::clone(claims), stop.clone());
    let period =
        (config.block_release_grace / 10).clamp(Duration::from_secs(1), Duration::from_secs(30));
    tokio::spawn(async move { claims.maintain_blocks(period, stop).await });
}

/// The pinned programs' subtree when counters are on and a bpffs is mounted where they go:
/// the stats service counts through it, the CreateContainer gate paces and polices through it.
fn counter_pins(config: &NodeConfig) -> Option<CounterPins> {
    config.stats.as_ref().filter(|settings| {
        let mounted = crate::host::bpf::is_bpffs(&settings.bpffs);
        if !mounted {
            tracing::warn!(bpffs = %settings.bpffs.display(),
                "traffic counters off: no BPF file system is mounted there (mount it, or pass --bpffs)");
        }
        mounted
    }).map(|settings| {
        let hook = if settings.hook == HookKind::Tcx
            && HookKind::for_running_kernel() != HookKind::Tcx
        {
            tracing::warn!("--stats-hook tcx: this kernel has no tcx (Linux 6.6+); using clsact");
            HookKind::Clsact
        } else {
            settings.hook
        };
        tracing::info!(hook = hook.as_str(), bpffs = %settings.bpffs.display(),
            "traffic counters on");
        CounterPins::new(&settings.bpffs, &config.node_name, hook)
    })
}

/// Starts the stats service over `pins` (see [`counter_pins`]).
fn start_stats(
    config: &NodeConfig,
    pins: Option<CounterPins>,
    attach_service: &Arc<NodeAttach>,
    stop: &watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let settings = config.stats.as_ref()?;
    pins.map(|hooks| {
        let service =
            StatsService::new(hooks, StatsSettings::from_status_interval(settings.status_interval));
        tokio::spawn(service.run(
            Arc::clone(attach_service),
            Arc::clone(attach_service),
            stop.clone(),
        ))
    })
}

/// Opens the state dir and loads the prepared claims and pod attachments.
async fn load_state(
    config: &NodeConfig,
    pins: Option<CounterPins>,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
    (network_inputs, pod_networks): (&watch::Receiver<NetworkInputs>, &PodNetworkReceiver),
    namespaces: k8s::namespaces::WatchedNamespaces,
) -> Result<(Arc<NodeAttach>, Arc<NodeClaims>, Arc<Store>), NodeError> {
    let identity =
        ServiceIdentity { driver: config.driver_name.clone(), node: config.node_name.clone() };
    let reader = KubeClaims::new(client.clone());
    let devices = host_devices(config.sysfs_root.clone(), config.selection.clone())
        .with_networks(&config.driver_name, network_inputs.clone());
    let state_dir = config.state_dir.clone();
    let metadata = config.cdi_spec_dir.as_ref().map(|cdi_dir| {
        let layout = MetadataLayout::new(&config.driver_name, &config.kubelet_plugin_dir, cdi_dir);
        Arc::new(DeviceMetadata::new(layout, LocalFiles))
    });
    let claim_metadata = metadata.clone();
    // PodNetwork claims: the daemon's watch, and blocks claimed per block (DESIGN §4).
    let network_ports = NetworkPorts {
        networks: Arc::new(WatchedPodNetworks::new(pod_networks.clone(), POD_NETWORK_PATIENCE)),
        blocks: Arc::new(KubeIpBlocks::new(client.clone())),
        release_grace: config.block_release_grace,
    };
    let reconcile_patience =
        config.kubelet_plugin().call_timeout.saturating_sub(Duration::from_secs(10));
    // VF settings of sriov-vf claims, on the PFs in the host netns (DESIGN §3).
    let vf_port: Arc<dyn crate::claims::vf::VfPort> =
        Arc::new(crate::host::sriov::NetlinkVfSettings::new(&HostNetlink::current()?));
    // Mode vfio: PCI functions to and from vfio-pci through sysfs (DESIGN §3).
    let vfio_port: Arc<dyn crate::claims::vfio::VfioPort> =
        Arc::new(crate::host::vfio::SysfsVfio::on(config.sysfs_root.clone()));
    let (service, store, ceilings) = tokio::task::spawn_blocking(move || {
        let store = Arc::new(Store::open(state_dir)?);
        // Once at start (DESIGN §2): prepare refuses a mode the kernel lacks, so no claim is
        // accepted that would fail every pod at sandbox time.
        let kernel = crate::host::kernel_probe::probe();
        // Bandwidth ceilings (DESIGN §3): edt-fq where the kernel has sch_fq and the programs
        // load, else tbf; ingress policing wherever the programs load, refused at prepare
        // elsewhere.
        let fq = kernel.fq == crate::model::support::Probe::Available;
        let ceilings = crate::host::qdisc_ceiling::node_ceilings(pins, fq);
        let mut service = ClaimService::load(identity, reader, devices, Arc::clone(&store))
            .map_err(NodeError::Claims)?
            .with_kernel_support(&kernel)
            .with_pod_networks(network_ports)
            // Below the DRA call deadline, so a prepare waiting for the start-up reconcile
            // answers with its own error (decision 0017).
            .with_reconcile_patience(reconcile_patience)
            .with_namespaces(Arc::new(namespaces))
            .with_vf_port(vf_port)
            .with_vfio_port(vfio_port)
            // ethtool settings of exclusive devices, in the host netns (DESIGN §3).
            .with_ethtool_port(Arc::new(crate::host::ethtool::NetlinkEthtool::new()));
        if let Some(metadata) = claim_metadata {
            service = service.with_metadata(metadata).map_err(NodeError::Claims)?;
        }
        if let Some(why) = &ceilings.no_police {
            service = service.with_police_refused(why);
        }
        Ok::<_, NodeError>((service, store, ceilings))
    })
    .await
    .map_err(NodeError::StateTask)??;
    tracing::info!(claims = service.prepared_uids().len(), "loaded prepared claims");
    let synced = Arc::clone(&store);
    metrics.store_syncs.read_from(move || synced.syncs());
    // A prepare killed between changing a VF and recording its claim (DESIGN §6): the VF goes
    // back as it was before kubelet, which asks again, is served.
    let vfs_restored = service.restore_unrecorded_vfs().await.map_err(NodeError::VfSnapshots)?;
    if vfs_restored > 0 {
        tracing::info!(vfs = vfs_restored, "set back VFs of prepares that did not complete");
    }
    // A prepare or unprepare killed while a function was off its driver (DESIGN §6): back to
    // its driver, or bound again for its claim after a reboot; logged, not fatal.
    match service.restore_vfio_bindings().await {
        Ok(0) => {}
        Ok(functions) => tracing::info!(functions, "gave back functions left bound to vfio-pci"),
        Err(err) => tracing::warn!(error = %err, "vfio bindings could not be checked at start"),
    }
    // The same for a device's ethtool values (`claims::ethtool_settings`); a failure here is
    // logged, not fatal: the snapshot stays for the next start.
    match service.restore_unrecorded_ethtool().await {
        Ok(0) => {}
        Ok(devices) => {
            tracing::info!(devices, "set back ethtool values of prepares that did not complete");
        }
        Err(err) => tracing::warn!(error = %err, "ethtool snapshots could not be checked at start"),
    }
    let claims = Arc::new(service);
    let writer = StatusWriter::new(
        client.clone(),
        &config.driver_name,
        Backoff::default(),
        Some(metrics.status_writes.clone()),
    );
    let status = WithDeviceMetadata::new(
        KubeStatus::new(writer, client.clone(), &config.driver_name, &config.node_name),
        metadata,
    );
    let host = HostNetlink::current()?;
    let (driver, attach_claims, attach_metrics) =
        (config.driver_name.clone(), Arc::clone(&claims), Arc::clone(metrics));
    let attach_store = Arc::clone(&store);
    let attach_service = tokio::task::spawn_blocking(move || {
        AttachService::load(&driver, attach_claims, host, attach_store, status, attach_metrics)
            .map_err(NodeError::Attachments)
    })
    .await
    .map_err(NodeError::StateTask)??
    // Bandwidth ceilings at the CreateContainer gate (DESIGN §3).
    .with_ceilings(Arc::new(ceilings.port), ceilings.support);
    Ok((Arc::new(attach_service), claims, store))
}

/// Starts the device health monitor (DESIGN §5 item 8) over the devices `publisher` publishes,
/// the host's links (a netlink subscription of its own, so health does not wait for the
/// publisher's API writes) and the NICs inside pods; returns the reports the kubelet plugin
/// streams. The monitor stops by itself when `stop` turns true.
fn start_device_health(
    config: &NodeConfig,
    interfaces: &HostInterfaces,
    publisher: &Publisher<KubeSlices>,
    attach_service: &NodeAttach,
    stop: &watch::Receiver<bool>,
) -> Result<watch::Receiver<HealthReport>, NodeError> {
    let (out, reports) = watch::channel(HealthReport::default());
    tokio::spawn(device_health::run(
        MonitorSettings::new(&config.node_name),
        interfaces.clone(),
        PodLinkWatcher::current().map_err(NodeError::DeviceHealth)?,
        MonitorInputs {
            devices: publisher.devices(),
            moved: attach_service.moved_nics(),
            link_changes: link_events::subscribe().map_err(NodeError::LinkEvents)?,
            stop: stop.clone(),
        },
        out,
    ));
    Ok(reports)
}

/// Serves the kubelet sockets (registration last).
async fn start_kubelet_plugin(
    config: &NodeConfig,
    claims: &Arc<NodeClaims>,
    attach_service: &Arc<NodeAttach>,
    metrics: &Arc<Metrics>,
    health: watch::Receiver<HealthReport>,
    stop: &watch::Receiver<bool>,
) -> Result<KubeletPluginHandle, NodeError> {
    let gauge = {
        let (claims, metrics) = (Arc::clone(claims), Arc::clone(metrics));
        move || refresh_ipam_gauge(&claims, &metrics)
    };
    let preparer = Arc::new(MeteredPreparer::new(
        DetachingPreparer::new(Arc::clone(claims), Arc::clone(attach_service), gauge),
        Arc::clone(metrics),
    ));
    let mut stopped = stop.clone();
    let handle =
        KubeletPlugin::start(config.kubelet_plugin().with_health(health), preparer, async move {
            let _ignored = stopped.wait_for(|stopped| *stopped).await;
        })
        .await?;
    Ok(handle)
}

/// The devices of this node's pool that prepared claims use, read from the claim service at
/// each publication: the publisher holds a sharing change of such a device (DESIGN §2).
/// Claims allocated but not yet prepared are not seen here (docs/operations.md).
struct PreparedOnNode {
    claims: Arc<NodeClaims>,
    /// This node's pool (the node name).
    pool: String,
}

impl std::fmt::Debug for PreparedOnNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedOnNode").field("pool", &self.pool).finish_non_exhaustive()
    }
}

impl publish::PreparedDeviceSource for PreparedOnNode {
    fn prepared_devices(&self) -> std::collections::BTreeSet<String> {
        self.claims.prepared_devices_in_pool(&self.pool)
    }
}

/// A token cancelled when `stop` turns true (for tasks that stop on a token).
fn cancel_on(stop: &watch::Receiver<bool>) -> CancellationToken {
    let token = CancellationToken::new();
    let (mut stop, cancel) = (stop.clone(), token.clone());
    tokio::spawn(async move {
        let _ignored = stop.wait_for(|stopped| *stopped).await;
        cancel.cancel();
    });
    token
}

/// The Node's uid, for owner references (slices are garbage-collected with their Node).
async fn node_uid(client: &kube::Client, node: &str) -> Option<String> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    match nodes.get_opt(node).await {
        Ok(Some(found)) => found.metadata.uid,
        Ok(None) => {
            tracing::warn!(node, "Node object not found; slices get no owner reference");
            None
        }
        Err(err) => {
            tracing::warn!(node, %err, "reading the Node failed; slices get no owner reference");
            None
        }
    }
}

/// The Node as the controlling owner of our slices.
fn node_owner(node: &str, uid: String) -> OwnerReference {
    OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: node.to_owned(),
        uid,
        controller: Some(true),
        ..OwnerReference::default()
    }
}

/// Sets `netclaim_ipam_addresses{pool,state="leased"}` from the claim service's leases.
fn refresh_ipam_gauge(claims: &NodeClaims, metrics: &Metrics) {
    metrics.set_ipam_leased(
        claims.leased_per_pool().into_iter().map(|(pool, leased)| (pool.to_string(), leased)),
    );
}

/// The running NRI side of the daemon: the plugin connection and the sweep of claims gone
/// from the API.
#[derive(Debug)]
struct NriHandle {
    stop: CancellationToken,
    plugin: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
    reconciler: tokio::task::JoinHandle<()>,
}

impl NriHandle {
    /// Disconnects from the runtime (interfaces stay in running pods) and stops the sweep.
    async fn stop(self) {
        self.stop.cancel();
        self.sweeper.abort();
        self.reconciler.abort();
        let _ignored = tokio::time::timeout(Duration::from_secs(2), self.plugin).await;
    }
}

/// Runs the NRI plugin `netclaim` (reconnecting whenever the runtime restarts), the
/// reconcile of each `Synchronize`, and the sweep of gone claims (after each reconcile and
/// every `sweep_period`).
fn start_nri(
    attach: Arc<NodeAttach>,
    claims: Arc<NodeClaims>,
    metrics: Arc<Metrics>,
    socket: &std::path::Path,
    index: &str,
    sweep_period: Duration,
) -> Result<NriHandle, PluginError> {
    let options =
        PluginOptions::new("netclaim", index)?.socket_path(socket).events(plugin_events());
    let stop = CancellationToken::new();
    let sweeper = {
        let attach = Arc::clone(&attach);
        tokio::spawn(async move {
            attach.sweep_loop(sweep_period, || refresh_ipam_gauge(&claims, &metrics)).await;
        })
    };
    // Each Synchronize is answered at once and reconciled here.
    let reconciler = {
        let attach = Arc::clone(&attach);
        tokio::spawn(async move { attach.reconcile_loop().await })
    };
    let plugin = Plugin::new(attach, options);
    let token = stop.clone();
    let plugin = tokio::spawn(async move { plugin.run(token).await });
    Ok(NriHandle { stop, plugin, sweeper, reconciler })
}
