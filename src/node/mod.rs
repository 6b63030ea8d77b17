//! `netclaim node`: the node daemon's composition root. Builds the adapters, runs the
//! ResourceSlice publisher with its triggers (netlink events, slice watch), loads the
//! prepared claims and pod attachments, serves kubelet's DRA calls, runs the NRI plugin that
//! attaches pod interfaces, serves metrics, and shuts down on SIGTERM/SIGINT.

pub mod attach;
pub mod preparer;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::attach::AttachService;
use crate::claims::{ClaimService, ServiceIdentity};
use crate::host::discovery::{self, DiscoveryError};
use crate::host::link_events;
use crate::host::netlink::HostNetlink;
use crate::host::sysfs::Sysfs;
use crate::inventory::publish::{Publisher, RequestedSharing, SliceApiError};
use crate::inventory::slices::PoolIdentity;
use crate::inventory::{InventoryError, Selection, SharingMode};
use crate::k8s::claim_status::{Backoff, StatusWriter};
use crate::k8s::claims::KubeClaims;
use crate::k8s::events::NodeEvents;
use crate::k8s::resource_slices::{KubeSlices, SliceEvent};
use crate::k8s::{self, ClientError};
use crate::kubelet::{KubeletPlugin, KubeletPluginConfig, KubeletPluginHandle};
use crate::metrics::{Health, Metrics, MetricsServerError, ResultLabel};
use crate::store::Store;
use attach::{AttachingPreparer, KubeStatus, NodeAttach};
use preparer::{DiscoveredDevices, MeteredPreparer};

/// Quiet time after the last trigger before rediscovering: a burst of link changes (a bond
/// coming up, SR-IOV VFs being created) settles into one publication.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// Longest a continuous burst can postpone a publication.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Retry bounds after a failed publication (API server down, conflict).
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// How often prepared claims are checked against the API besides after each NRI
/// `Synchronize` (a claim deleted while its pod was gone from the runtime is released).
const GONE_CLAIM_SWEEP: Duration = Duration::from_mins(5);

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
    /// The pod attachments could not be loaded.
    #[error("loading pod attachments: {0}")]
    Attachments(#[source] crate::store::StoreError),
    /// The host netlink socket could not be opened.
    #[error("opening the host netlink socket: {0}")]
    Netlink(#[from] crate::podnet::LinkOpError),
    /// The NRI plugin options are invalid.
    #[error(transparent)]
    Nri(#[from] crate::nri::PluginError),
    /// The netlink event subscription failed.
    #[error("subscribing to netlink link events: {0}")]
    LinkEvents(#[source] std::io::Error),
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

/// Why one publication round failed (retried with backoff).
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error(transparent)]
    Discovery(#[from] DiscoveryError),
    #[error(transparent)]
    Api(#[from] SliceApiError),
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

/// Runs the daemon until `stop` turns true.
pub async fn run_until(
    config: NodeConfig,
    mut stop: watch::Receiver<bool>,
) -> Result<(), NodeError> {
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let mut metrics_stop = stop.clone();
    let (bound, metrics_task) = crate::metrics::serve(
        config.metrics_address,
        metrics.clone(),
        health.clone(),
        async move {
            let _ignored = metrics_stop.wait_for(|stopped| *stopped).await;
        },
    )
    .await?;
    tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");

    let client = k8s::client(config.kubeconfig.as_deref()).await?;
    let node_uid = node_uid(&client, &config.node_name).await;
    let owner = node_uid.clone().map(|uid| OwnerReference {
        api_version: "v1".to_owned(),
        kind: "Node".to_owned(),
        name: config.node_name.clone(),
        uid,
        controller: Some(true),
        ..OwnerReference::default()
    });
    let (kubelet, attach_service, claims) =
        start_kubelet_plugin(&config, &client, &metrics, &stop).await?;
    // Devices that came back from pods destroyed while the daemon was down get their names
    // back before the first publication; running pods are reconciled at Synchronize.
    let nri = attach::start_nri(
        Arc::clone(&attach_service),
        claims,
        Arc::clone(&metrics),
        &config.nri_socket,
        &config.nri_plugin_index,
        GONE_CLAIM_SWEEP,
    )
    .await?;
    let mut moved = attach_service.moved_devices();
    let events = NodeEvents::new(client.clone(), &config.driver_name, &config.node_name, node_uid);
    let slices = KubeSlices::new(client, &config.driver_name, &config.node_name);
    let mut slice_events = Box::pin(slices.watch());
    let pool = PoolIdentity {
        driver: config.driver_name.clone(),
        node: config.node_name.clone(),
        generation: 0,
    };
    let mut publisher =
        Publisher::new(slices, pool, config.selection.clone(), config.sharing, owner);
    let mut link_changes = link_events::subscribe().map_err(NodeError::LinkEvents)?;
    let sysfs = Sysfs::new(&config.sysfs_root);

    // Publish at once, then on triggers.
    let mut due: Option<Instant> = Some(Instant::now());
    let mut first_trigger: Option<Instant> = None;
    let mut force = false;
    let mut retry_delay = RETRY_MIN;
    let mut relisted: Option<Vec<String>> = None;
    loop {
        let sleep_until = due.unwrap_or_else(|| Instant::now() + Duration::from_hours(1));
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => break,
            Some(()) = link_changes.recv() => {
                schedule(&mut due, &mut first_trigger);
            }
            Ok(()) = moved.changed() => {
                schedule(&mut due, &mut first_trigger);
            }
            Some(event) = slice_events.next() => {
                if handle_slice_event(&publisher, event, &mut relisted) {
                    force = true;
                    schedule(&mut due, &mut first_trigger);
                }
            }
            () = tokio::time::sleep_until(sleep_until), if due.is_some() => {
                due = None;
                first_trigger = None;
                moved.mark_unchanged();
                match publish_round(&mut publisher, &sysfs, force, &metrics, &events, &moved).await {
                    Ok(()) => {
                        force = false;
                        retry_delay = RETRY_MIN;
                        health.set_ready(true);
                    }
                    Err(err) => {
                        tracing::warn!(%err, retry_in = ?retry_delay, "publishing ResourceSlices failed");
                        metrics.slice_syncs.get_or_create(&ResultLabel { result: "error" }).inc();
                        due = Some(Instant::now() + retry_delay);
                        retry_delay = (retry_delay * 2).min(RETRY_MAX);
                    }
                }
            }
        }
    }
    // Slices stay: kubelet removes a node's slices itself once the driver is gone for good,
    // and a restart continues at the next generation without an empty window.
    health.set_ready(false);
    // Interfaces stay in running pods (DESIGN §6): the plugin only disconnects.
    nri.stop().await;
    kubelet.stop();
    if let Err(err) = kubelet.wait().await {
        tracing::warn!(%err, "kubelet plugin stopped with an error");
    }
    let _ignored = tokio::time::timeout(Duration::from_secs(1), metrics_task).await;
    tracing::info!("stopped");
    Ok(())
}

/// Opens the state dir, loads the prepared claims and pod attachments, and serves the
/// kubelet sockets.
async fn start_kubelet_plugin(
    config: &NodeConfig,
    client: &kube::Client,
    metrics: &Arc<Metrics>,
    stop: &watch::Receiver<bool>,
) -> Result<(KubeletPluginHandle, Arc<NodeAttach>, Arc<attach::NodeClaims>), NodeError> {
    let identity =
        ServiceIdentity { driver: config.driver_name.clone(), node: config.node_name.clone() };
    let reader = KubeClaims::new(client.clone());
    let devices = DiscoveredDevices::new(config.sysfs_root.clone(), config.selection.clone());
    let state_dir = config.state_dir.clone();
    let (service, store) = tokio::task::spawn_blocking(move || {
        let store = Arc::new(Store::open(state_dir)?);
        let service = ClaimService::load(identity, reader, devices, Arc::clone(&store))
            .map_err(NodeError::Claims)?;
        Ok::<_, NodeError>((service, store))
    })
    .await
    .map_err(NodeError::StateTask)??;
    tracing::info!(claims = service.prepared_uids().len(), "loaded prepared claims");
    let claims = Arc::new(service);
    let writer = StatusWriter::new(
        client.clone(),
        &config.driver_name,
        Backoff::default(),
        Some(metrics.status_writes.clone()),
    );
    let status = KubeStatus::new(writer, client.clone(), &config.driver_name, &config.node_name);
    let host = HostNetlink::current()?;
    let (driver, attach_claims, attach_metrics) =
        (config.driver_name.clone(), Arc::clone(&claims), Arc::clone(metrics));
    let attach_service = tokio::task::spawn_blocking(move || {
        AttachService::load(&driver, attach_claims, host, store, status, attach_metrics)
            .map_err(NodeError::Attachments)
    })
    .await
    .map_err(NodeError::StateTask)??;
    let attach_service = Arc::new(attach_service);
    let preparer = Arc::new(MeteredPreparer::new(
        AttachingPreparer::new(
            Arc::clone(&claims),
            Arc::clone(&attach_service),
            Arc::clone(metrics),
        ),
        Arc::clone(metrics),
    ));
    let mut stopped = stop.clone();
    let handle = KubeletPlugin::start(
        KubeletPluginConfig::new(
            &config.driver_name,
            &config.kubelet_registry_dir,
            &config.kubelet_plugin_dir,
        ),
        preparer,
        async move {
            let _ignored = stopped.wait_for(|stopped| *stopped).await;
        },
    )
    .await?;
    Ok((handle, attach_service, claims))
}

/// Debounces a trigger: publish `DEBOUNCE` after the last one, at most `MAX_DELAY` after the
/// first of a burst.
fn schedule(due: &mut Option<Instant>, first_trigger: &mut Option<Instant>) {
    let now = Instant::now();
    let first = *first_trigger.get_or_insert(now);
    *due = Some((now + DEBOUNCE).min(first + MAX_DELAY));
}

/// Whether a watch event means our slices must be rewritten.
fn handle_slice_event<A: crate::inventory::publish::SliceApi>(
    publisher: &Publisher<A>,
    event: SliceEvent,
    relisted: &mut Option<Vec<String>>,
) -> bool {
    match event {
        SliceEvent::Present(slice) => {
            let name = slice.metadata.name.clone().unwrap_or_default();
            if let Some(seen) = relisted.as_mut() {
                seen.push(name.clone());
            }
            let repair = publisher.needs_repair(&name, Some(&slice.spec));
            if repair {
                tracing::info!(slice = %name, "slice changed behind our back; republishing");
            }
            repair
        }
        SliceEvent::Deleted(name) => {
            let repair = publisher.needs_repair(&name, None);
            if repair {
                tracing::info!(slice = %name, "slice deleted; republishing");
            }
            repair
        }
        SliceEvent::Relisting => {
            *relisted = Some(Vec::new());
            false
        }
        SliceEvent::Relisted => {
            let seen = relisted.take().unwrap_or_default();
            publisher.slice_names().iter().any(|name| !seen.contains(name))
        }
        SliceEvent::Error(message) => {
            tracing::debug!(%message, "slice watch error (retrying)");
            false
        }
    }
}

async fn publish_round<A: crate::inventory::publish::SliceApi>(
    publisher: &mut Publisher<A>,
    sysfs: &Sysfs,
    force: bool,
    metrics: &Metrics,
    events: &NodeEvents,
    moved: &watch::Receiver<BTreeSet<String>>,
) -> Result<(), RoundError> {
    let interfaces = discovery::discover(sysfs).await?;
    // Read after discovery: the attach service marks a NIC as moved before it moves it, so
    // a discovery that no longer sees it always finds it here.
    publisher.retain_moved(&moved.borrow());
    let report = publisher.sync(&interfaces, force).await?;
    metrics
        .slice_writes
        .get_or_create(&ResultLabel { result: "success" })
        .inc_by(report.applied as u64);
    metrics.slice_syncs.get_or_create(&ResultLabel { result: "success" }).inc();
    metrics.devices_published.set(i64::try_from(report.devices).unwrap_or(i64::MAX));
    metrics.pool_generation.set(report.generation);
    if report.applied > 0 || report.deleted > 0 {
        tracing::info!(
            generation = report.generation,
            devices = report.devices,
            written = report.applied,
            deleted = report.deleted,
            "published ResourceSlices"
        );
    }
    if let Some(message) = report.capacity_dropped {
        metrics.capacity_dropped.set(1);
        tracing::warn!("{message}");
        events.warn("ConsumableCapacityUnsupported", "PublishResourceSlices", message).await;
    }
    if publisher.sharing_mode() == SharingMode::Slots {
        tracing::debug!("shared parents published as slots");
    }
    Ok(())
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
