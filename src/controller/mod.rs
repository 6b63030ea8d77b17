//! `netclaim controller`: one acting replica per cluster (leader-elected on a Lease) that
//! validates PodNetworks and writes their `Ready` condition, keeps one DeviceClass per
//! network, holds a network's deletion behind a finalizer while IPBlocks of it exist, and
//! collects IPBlocks that no node will release (DESIGN §4).
//!
//! [`run`] is the composition: the metrics endpoint, the election, and — only while this
//! replica leads — the reconciler (a kube-runtime `Controller` on PodNetworks, triggered by
//! IPBlocks and DeviceClasses too) and the periodic IPBlock sweep. Losing the lease aborts
//! both at once; SIGTERM aborts them and then releases the lease so a standby takes over
//! without waiting it out. The pure parts are [`status`], [`device_class`] and [`gc`].

pub mod cache;
pub mod conflicts;
pub mod device_class;
pub mod gc;
pub mod metrics;
pub mod ports;
mod reconcile;
pub mod status;
pub mod sweep;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, WatchStreamExt as _, watcher};
use kube::{Api, ResourceExt as _};

pub use self::metrics::ControllerMetrics;
use crate::k8s::ApiClients;
use crate::k8s::controller_cluster::KubeCluster;
use crate::k8s::leader_election::{self, LeaderElector, LeaseConfig};
use crate::metrics::{Health, MetricsServerError};
use crate::model::names::DEFAULT_DRIVER_NAME;
use crate::model::pod_network::{IpBlock, LABEL_MANAGED_FOR, PodNetwork};

/// Name of the Lease of the default driver's controller.
pub const LEASE_NAME: &str = "netclaim-controller";
/// Default `--block-release-grace`.
pub const DEFAULT_BLOCK_RELEASE_GRACE: Duration = Duration::from_mins(10);
/// How often the IPBlock sweep runs.
pub const DEFAULT_GC_INTERVAL: Duration = Duration::from_secs(30);
/// Pause before restarting the acting loops when they ended on their own while leading.
const RESTART_PAUSE: Duration = Duration::from_secs(1);

/// The Lease name for `driver`: [`LEASE_NAME`], suffixed with the driver name for any other
/// driver, so two drivers in one cluster elect their controllers separately.
#[must_use]
pub fn lease_name(driver: &str) -> String {
    if driver == DEFAULT_DRIVER_NAME {
        LEASE_NAME.to_owned()
    } else {
        format!("{LEASE_NAME}.{driver}")
    }
}

/// What the controller needs to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// The DRA driver name: PodNetworks with this `spec.provider`, the DeviceClass driver,
    /// the field manager.
    pub driver_name: String,
    /// Where `/metrics`, `/healthz` and `/readyz` are served; `None`: not served (the dev
    /// cluster runs the controller in-process).
    pub metrics_address: Option<SocketAddr>,
    /// `--metrics-secure` and its certificate.
    pub metrics_security: crate::metrics::MetricsSecurity,
    /// How long a static reservation whose claim is gone stays before the sweep deletes it
    /// (see [`gc`]).
    pub block_release_grace: Duration,
    /// The Lease to hold before acting; `None`: act at once (a single replica).
    pub leader_election: Option<LeaseConfig>,
    /// How often the IPBlock sweep runs.
    pub gc_interval: Duration,
}

impl ControllerConfig {
    /// A single replica for `driver_name` with the default timing and no metrics endpoint.
    #[must_use]
    pub fn new(driver_name: &str) -> Self {
        Self {
            driver_name: driver_name.to_owned(),
            metrics_address: None,
            metrics_security: crate::metrics::MetricsSecurity::Plain,
            block_release_grace: DEFAULT_BLOCK_RELEASE_GRACE,
            leader_election: None,
            gc_interval: DEFAULT_GC_INTERVAL,
        }
    }
}

/// Why the controller could not run.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The metrics endpoint could not start.
    #[error(transparent)]
    Metrics(#[from] MetricsServerError),
    /// The election task ended without being asked to (it panicked).
    #[error("the leader election stopped unexpectedly")]
    ElectionEnded,
}

/// Runs the controller until `shutdown` resolves; see the module doc.
pub async fn run(
    clients: ApiClients,
    config: ControllerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControllerError> {
    run_with_metrics(clients, config, Arc::new(ControllerMetrics::new()), shutdown).await
}

/// [`run`] reporting into `metrics` (tests and an embedding process read them there).
pub async fn run_with_metrics(
    clients: ApiClients,
    config: ControllerConfig,
    metrics: Arc<ControllerMetrics>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ControllerError> {
    let health = Arc::new(Health::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let metrics_task = match config.metrics_address {
        Some(address) => {
            let mut stop = stop_rx.clone();
            let (bound, task) = crate::metrics::serve_with(
                address,
                &config.metrics_security,
                || Some(crate::k8s::access_review::KubeAccessReview::new(clients.unary.clone())),
                Arc::clone(&metrics),
                Arc::clone(&health),
                async move {
                    let _stopped = stop.wait_for(|stopped| *stopped).await;
                },
            )
            .await?;
            tracing::info!(address = %bound, "serving /metrics, /healthz, /readyz");
            Some(task)
        }
        None => None,
    };

    let (leading_tx, mut leading) = tokio::sync::watch::channel(false);
    // Without an election this replica leads for good: the sender stays alive with it.
    let mut always_leading = None;
    let election = if let Some(lease) = config.leader_election.clone() {
        tracing::info!(
            identity = %lease.identity,
            namespace = %lease.namespace,
            lease = %lease.name,
            "leader election: candidate"
        );
        let elector = LeaderElector::new(clients.unary.clone(), lease);
        let stop = stop_rx.clone();
        Some(tokio::spawn(async move { leader_election::run(elector, &leading_tx, stop).await }))
    } else {
        leading_tx.send_replace(true);
        always_leading = Some(leading_tx);
        None
    };
    // A standby is ready too: it is healthy and waits to take over.
    health.set_ready(true);

    let mut shutdown = std::pin::pin!(shutdown);
    let mut election_ended = false;
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            result = leading.wait_for(|leading| *leading) => if result.is_err() {
                election_ended = true;
                break;
            },
        }
        metrics.leader.set(1);
        tracing::info!(driver = %config.driver_name, "acting as the controller");
        let mut work = tokio::spawn(act(clients.clone(), config.clone(), Arc::clone(&metrics)));
        let mut ended_on_its_own = false;
        let shutting_down = tokio::select! {
            biased;
            () = &mut shutdown => true,
            _ = leading.wait_for(|leading| !*leading) => false,
            result = &mut work => {
                tracing::error!(?result, "the controller's loops ended while leading; restarting them");
                ended_on_its_own = true;
                false
            }
        };
        // Stop acting before anything else: reconciles in flight are cancelled with the task.
        work.abort();
        let _aborted = work.await;
        metrics.clear_leader_state();
        if shutting_down {
            break;
        }
        if ended_on_its_own {
            tokio::time::sleep(RESTART_PAUSE).await;
        } else {
            tracing::warn!("stopped acting: this replica no longer holds the lease");
        }
    }

    let _stopped = stop_tx.send(true);
    drop(always_leading);
    if let Some(task) = election {
        match task.await {
            Ok(mut elector) => match elector.release().await {
                Ok(()) => tracing::info!("leader election: lease released"),
                Err(err) => tracing::warn!(%err, "leader election: releasing the lease failed"),
            },
            Err(err) => tracing::warn!(%err, "leader election task failed"),
        }
    }
    if let Some(task) = metrics_task {
        let _ignored = tokio::time::timeout(Duration::from_secs(1), task).await;
    }
    if election_ended { Err(ControllerError::ElectionEnded) } else { Ok(()) }
}

/// What the leader does: the reconciler and the sweep, until aborted.
async fn act(clients: ApiClients, config: ControllerConfig, metrics: Arc<ControllerMetrics>) {
    let trigger = sweep::SweepTrigger::default();
    let sweeper =
        sweep::Sweeper::new(&config.driver_name, config.block_release_grace, Arc::clone(&metrics));
    let sweep = sweep::run(
        KubeCluster::new(clients.unary.clone(), &config.driver_name),
        sweeper,
        config.gc_interval,
        trigger.clone(),
    );
    let reconciler = run_reconciler(clients, config.driver_name, metrics, trigger);
    futures::future::join(sweep, reconciler).await;
}

/// The PodNetwork controller: reconciles each network on its own changes, on changes of its
/// IPBlocks and DeviceClass, and every network on any PodNetwork change (an overlap verdict
/// depends on the others).
async fn run_reconciler(
    clients: ApiClients,
    driver: String,
    metrics: Arc<ControllerMetrics>,
    sweep: sweep::SweepTrigger,
) {
    let config = watcher::Config::default();
    let networks: Api<PodNetwork> = Api::all(clients.watch.clone());
    // Every network, for the overlap check. The cache stores a change before passing it on,
    // so the reconciles it triggers see it; its readiness wakes every waiting reconcile.
    let (all_networks, mut writer) = cache::NetworkCache::new();
    let network_changes = watcher(networks.clone(), config.clone())
        .default_backoff()
        .inspect(move |event| {
            if let Ok(event) = event {
                writer.apply(event);
            }
        })
        .touched_objects()
        .filter_map(|change| futures::future::ready(change.ok().map(|_| ())));
    let context = Arc::new(reconcile::Context::new(
        driver,
        clients.unary.clone(),
        all_networks,
        metrics,
        sweep,
    ));
    Controller::new(networks, config.clone())
        .watches(Api::<IpBlock>::all(clients.watch.clone()), config.clone(), |block| {
            Some(ObjectRef::<PodNetwork>::new(&block.spec.pod_network))
        })
        .watches(
            Api::<DeviceClass>::all(clients.watch.clone()),
            config.labels(LABEL_MANAGED_FOR),
            |class| class.labels().get(LABEL_MANAGED_FOR).map(|name| ObjectRef::new(name)),
        )
        .reconcile_all_on(network_changes)
        .run(reconcile::reconcile, reconcile::error_policy, context)
        .for_each(|result| {
            if let Err(err) = result {
                // Objects gone before their turn and watch hiccups (the watcher retries).
                tracing::debug!(%err, "controller event");
            }
            futures::future::ready(())
        })
        .await;
}
