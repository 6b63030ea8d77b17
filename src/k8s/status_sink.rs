//! The node daemon's attach wiring: the [`AttachService`] over real netlink, the state store
//! and the API (claim status, Pod events); the kubelet preparer that detaches a claim before
//! unpreparing it; and the NRI plugin that feeds the service.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use tokio_util::sync::CancellationToken;

use crate::attach::{AttachService, StatusSink};
use crate::claims::ClaimService;
use crate::host::netlink::HostNetlink;
use crate::k8s::claim_status::{ClaimRef as StatusClaimRef, PodRef, StatusWriter, warn_pod};
use crate::k8s::claims::KubeClaims;
use crate::kubelet::{ClaimPreparer, ClaimRef, PrepareResults, UnprepareResults};
use crate::metrics::{IpamLabels, Metrics};
use crate::nri::{Event, EventMask, Plugin, PluginError, PluginOptions};
use crate::store::Store;

use super::preparer::DiscoveredDevices;

/// The daemon's claim service.
pub type NodeClaims = ClaimService<KubeClaims, DiscoveredDevices, Arc<Store>>;
/// The daemon's attach service.
pub type NodeAttach = AttachService<Arc<NodeClaims>, HostNetlink, Arc<Store>, KubeStatus>;

/// [`StatusSink`] over the API: the per-claim [`StatusWriter`] and Pod Warning Events.
#[derive(Clone)]
pub struct KubeStatus {
    writer: StatusWriter,
    client: kube::Client,
    driver: String,
    node: String,
}

impl KubeStatus {
    /// Writes as `driver` from `node`.
    #[must_use]
    pub fn new(writer: StatusWriter, client: kube::Client, driver: &str, node: &str) -> Self {
        Self { writer, client, driver: driver.to_owned(), node: node.to_owned() }
    }
}

impl std::fmt::Debug for KubeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStatus").field("driver", &self.driver).finish_non_exhaustive()
    }
}

impl StatusSink for KubeStatus {
    fn submit(&self, claim: StatusClaimRef, entries: Vec<AllocatedDeviceStatus>) {
        self.writer.submit(claim, entries);
    }

    fn warn_pod(&self, pod: PodRef, reason: &'static str, message: String) {
        let (client, driver, node) = (self.client.clone(), self.driver.clone(), self.node.clone());
        tokio::spawn(async move { warn_pod(client, &driver, &node, &pod, reason, message).await });
    }
}

/// The kubelet preparer of the daemon: prepares through the claim service; unprepare first
/// detaches the claim's interfaces from any pod still holding them (a pod force-deleted
/// without a sandbox stop), then releases the claim. Keeps `netclaim_ipam_addresses` current.
pub struct AttachingPreparer {
    claims: Arc<NodeClaims>,
    attach: Arc<NodeAttach>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for AttachingPreparer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachingPreparer").finish_non_exhaustive()
    }
}

impl AttachingPreparer {
    /// Wires the two services.
    #[must_use]
    pub fn new(claims: Arc<NodeClaims>, attach: Arc<NodeAttach>, metrics: Arc<Metrics>) -> Self {
        let preparer = Self { claims, attach, metrics };
        preparer.refresh_ipam_gauge();
        preparer
    }

    /// Sets `netclaim_ipam_addresses{pool,state="leased"}` from the leases.
    pub fn refresh_ipam_gauge(&self) {
        refresh_ipam_gauge(&self.claims, &self.metrics);
    }
}

/// Sets `netclaim_ipam_addresses{pool,state="leased"}` from the claim service's leases.
pub fn refresh_ipam_gauge(claims: &NodeClaims, metrics: &Metrics) {
    let counts = claims.leased_per_pool();
    metrics.ipam_addresses.clear();
    for (pool, leased) in counts {
        metrics
            .ipam_addresses
            .get_or_create(&IpamLabels { pool: pool.to_string(), state: "leased" })
            .set(i64::try_from(leased).unwrap_or(i64::MAX));
    }
}

impl ClaimPreparer for AttachingPreparer {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let results = self.claims.prepare(claims).await;
        self.refresh_ipam_gauge();
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        for claim in &claims {
            self.attach.detach_claim(&claim.uid).await;
        }
        let results = self.claims.unprepare(claims).await;
        self.refresh_ipam_gauge();
        results
    }
}

/// The events the plugin subscribes to.
#[must_use]
pub fn plugin_events() -> EventMask {
    EventMask::EMPTY
        .with(Event::RunPodSandbox)
        .with(Event::StopPodSandbox)
        .with(Event::RemovePodSandbox)
        .with(Event::CreateContainer)
}

/// The running NRI side of the daemon: the plugin connection and the sweep of claims gone
/// from the API.
#[derive(Debug)]
pub struct NriHandle {
    stop: CancellationToken,
    plugin: tokio::task::JoinHandle<()>,
    sweeper: tokio::task::JoinHandle<()>,
}

impl NriHandle {
    /// Disconnects from the runtime (interfaces stay in running pods) and stops the sweep.
    pub async fn stop(self) {
        self.stop.cancel();
        self.sweeper.abort();
        let _ignored = tokio::time::timeout(Duration::from_secs(2), self.plugin).await;
    }
}

/// Runs the attach service's start-up work, then the NRI plugin `netclaim` (reconnecting
/// whenever the runtime restarts) and the sweep of gone claims (after each `Synchronize`
/// and every `sweep_period`).
///
/// # Errors
/// [`PluginError`] when the index is not two digits.
pub async fn start_nri(
    attach: Arc<NodeAttach>,
    claims: Arc<NodeClaims>,
    metrics: Arc<Metrics>,
    socket: &std::path::Path,
    index: &str,
    sweep_period: Duration,
) -> Result<NriHandle, PluginError> {
    let options =
        PluginOptions::new("netclaim", index)?.socket_path(socket).events(plugin_events());
    attach.start().await;
    let stop = CancellationToken::new();
    let sweeper = {
        let attach = Arc::clone(&attach);
        tokio::spawn(async move {
            attach.sweep_loop(sweep_period, || refresh_ipam_gauge(&claims, &metrics)).await;
        })
    };
    let plugin = Plugin::new(attach, options);
    let token = stop.clone();
    let plugin = tokio::spawn(async move { plugin.run(token).await });
    Ok(NriHandle { stop, plugin, sweeper })
}
