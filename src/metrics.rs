//! Prometheus metrics of the node daemon (DESIGN §1) and the HTTP endpoint that serves
//! them with `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label set `{result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `success` or `error`.
    pub result: &'static str,
}

/// Label set `{method,code}` of kubelet DRA calls.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KubeletRequestLabels {
    /// `NodePrepareResources` or `NodeUnprepareResources`.
    pub method: &'static str,
    /// `OK` when every claim succeeded, `ClaimError` when at least one claim got an error
    /// (the gRPC call itself still succeeds: kubelet reads per-claim errors).
    pub code: &'static str,
}

/// Label set `{mode}` of attach and detach durations.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    /// `macvlan`, `host-device`, ...
    pub mode: &'static str,
}

/// Label set `{event,result}` of NRI events.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NriEventLabels {
    /// `RunPodSandbox`, `StopPodSandbox`, `RemovePodSandbox`, `CreateContainer`,
    /// `Synchronize`.
    pub event: &'static str,
    /// `success` or `error`.
    pub result: &'static str,
}

/// Label set `{pool,state}` of IPAM addresses.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IpamLabels {
    /// The pool's subnet.
    pub pool: String,
    /// `leased`.
    pub state: &'static str,
}

/// A histogram family whose members share the attach buckets.
pub type DurationFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// 50 µs to ~1.6 s: a macvlan attach takes well under a millisecond, a NIC move a few, a
/// slow kernel (RCU grace periods) tens.
fn link_duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// The daemon's metric families.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `netclaim_devices_published`.
    pub devices_published: Gauge,
    /// `netclaim_pool_generation`.
    pub pool_generation: Gauge<i64, AtomicI64>,
    /// `netclaim_slice_writes_total{result}`: server-side apply calls.
    pub slice_writes: Family<ResultLabel, Counter>,
    /// `netclaim_status_writes_total{result}`: ResourceClaim status applies (`success`,
    /// `error`, `gone`, `rejected`).
    pub status_writes: Family<ResultLabel, Counter>,
    /// `netclaim_slice_syncs_total{result}`: publication rounds.
    pub slice_syncs: Family<ResultLabel, Counter>,
    /// `netclaim_consumable_capacity_dropped`: 1 once the API server dropped consumable
    /// capacity from our shared devices.
    pub capacity_dropped: Gauge,
    /// `netclaim_prepare_duration_seconds`: one NodePrepareResources call.
    pub prepare_duration: Histogram,
    /// `netclaim_unprepare_duration_seconds`: one NodeUnprepareResources call.
    pub unprepare_duration: Histogram,
    /// `netclaim_kubelet_requests_total{method,code}`.
    pub kubelet_requests: Family<KubeletRequestLabels, Counter>,
    /// `netclaim_attach_duration_seconds{mode}`: sandbox event received to link configured.
    pub attach_duration: DurationFamily<ModeLabel>,
    /// `netclaim_detach_duration_seconds{mode}`: one interface's detach.
    pub detach_duration: DurationFamily<ModeLabel>,
    /// `netclaim_nri_events_total{event,result}`.
    pub nri_events: Family<NriEventLabels, Counter>,
    /// `netclaim_ipam_addresses{pool,state}`.
    pub ipam_addresses: Family<IpamLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every family.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("netclaim");
        let devices_published = Gauge::default();
        registry.register(
            "devices_published",
            "Devices in this node's pool",
            devices_published.clone(),
        );
        let pool_generation = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "pool_generation",
            "Generation of this node's pool",
            pool_generation.clone(),
        );
        let slice_writes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "slice_writes",
            "ResourceSlice server-side apply calls",
            slice_writes.clone(),
        );
        let status_writes = Family::<ResultLabel, Counter>::default();
        registry.register(
            "status_writes",
            "ResourceClaim status server-side apply calls",
            status_writes.clone(),
        );
        let slice_syncs = Family::<ResultLabel, Counter>::default();
        registry.register("slice_syncs", "ResourceSlice publication rounds", slice_syncs.clone());
        let capacity_dropped = Gauge::default();
        registry.register(
            "consumable_capacity_dropped",
            "1 when the API server dropped allowMultipleAllocations/capacity (feature off)",
            capacity_dropped.clone(),
        );
        // 100 µs to ~3.3 s: a repeated prepare is sub-millisecond, a new one a few ms, a
        // slow API server seconds.
        let prepare_duration = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "prepare_duration_seconds",
            "Duration of NodePrepareResources calls",
            prepare_duration.clone(),
        );
        let unprepare_duration = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "unprepare_duration_seconds",
            "Duration of NodeUnprepareResources calls",
            unprepare_duration.clone(),
        );
        let kubelet_requests = Family::<KubeletRequestLabels, Counter>::default();
        registry.register(
            "kubelet_requests",
            "Kubelet DRA calls by method and outcome",
            kubelet_requests.clone(),
        );
        let attach_duration: DurationFamily<ModeLabel> =
            Family::new_with_constructor(link_duration_histogram);
        registry.register(
            "attach_duration_seconds",
            "Sandbox event received to pod interface configured, per interface",
            attach_duration.clone(),
        );
        let detach_duration: DurationFamily<ModeLabel> =
            Family::new_with_constructor(link_duration_histogram);
        registry.register(
            "detach_duration_seconds",
            "Detach of one pod interface",
            detach_duration.clone(),
        );
        let nri_events = Family::<NriEventLabels, Counter>::default();
        registry.register("nri_events", "NRI events handled, by outcome", nri_events.clone());
        let ipam_addresses = Family::<IpamLabels, Gauge>::default();
        registry.register(
            "ipam_addresses",
            "Addresses of node-local pools by state",
            ipam_addresses.clone(),
        );
        Self {
            registry,
            devices_published,
            pool_generation,
            slice_writes,
            status_writes,
            slice_syncs,
            capacity_dropped,
            prepare_duration,
            unprepare_duration,
            kubelet_requests,
            attach_duration,
            detach_duration,
            nri_events,
            ipam_addresses,
        }
    }

    /// Sets `netclaim_ipam_addresses{pool,state="leased"}` to `leased` (addresses per pool
    /// subnet), dropping the series of pools that no longer hold any.
    pub fn set_ipam_leased(&self, leased: impl IntoIterator<Item = (String, usize)>) {
        self.ipam_addresses.clear();
        for (pool, count) in leased {
            self.ipam_addresses
                .get_or_create(&IpamLabels { pool, state: "leased" })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// The text exposition format.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail.
        let _infallible = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

/// A condition that keeps `/readyz` failing while it holds: `Some(why)`.
type ReadinessCheck = Box<dyn Fn() -> Option<String> + Send + Sync>;

/// Shared health state: live as long as the process serves, ready once the daemon said so
/// and no readiness check fails.
#[derive(Default)]
pub struct Health {
    ready: AtomicBool,
    changed: tokio::sync::Notify,
    checks: std::sync::Mutex<Vec<(&'static str, ReadinessCheck)>>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").field("ready", &self.is_ready()).finish_non_exhaustive()
    }
}

impl Health {
    /// Marks the daemon ready (or not).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Returns once the daemon said it is ready (checks aside).
    pub async fn wait_until_ready(&self) {
        loop {
            let changed = self.changed.notified();
            if self.is_ready() {
                return;
            }
            changed.await;
        }
    }

    /// Whether the daemon said it is ready (checks aside).
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Adds a condition under which `/readyz` fails, with `name` and the check's reason in
    /// the answer.
    pub fn add_check(
        &self,
        name: &'static str,
        check: impl Fn() -> Option<String> + Send + Sync + 'static,
    ) {
        self.checks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((name, Box::new(check)));
    }

    /// `Ok` when `/readyz` answers 200, else why not.
    pub fn readiness(&self) -> Result<(), String> {
        if !self.is_ready() {
            return Err("not ready".to_owned());
        }
        let checks = self.checks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let failing: Vec<String> = checks
            .iter()
            .filter_map(|(name, check)| check().map(|why| format!("{name}: {why}")))
            .collect();
        if failing.is_empty() { Ok(()) } else { Err(failing.join("; ")) }
    }
}

/// A failure to serve the metrics endpoint.
#[derive(Debug, thiserror::Error)]
#[error("metrics endpoint on {address}: {source}")]
pub struct MetricsServerError {
    /// The address.
    pub address: SocketAddr,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

#[derive(Clone)]
struct Endpoint {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// Binds `address` and serves `/metrics`, `/healthz` and `/readyz` until `shutdown` resolves.
/// Returns the bound address (port 0 picks a free one) and the serving task.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), MetricsServerError> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| MetricsServerError { address, source })?;
    let bound = listener.local_addr().map_err(|source| MetricsServerError { address, source })?;
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_handler))
        .with_state(Endpoint { metrics, health });
    let task = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::error!(%err, "metrics endpoint stopped");
        }
    });
    Ok((bound, task))
}

async fn metrics_handler(State(endpoint): State<Endpoint>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        endpoint.metrics.encode(),
    )
}

async fn readyz_handler(State(endpoint): State<Endpoint>) -> impl IntoResponse {
    match endpoint.health.readiness() {
        Ok(()) => (StatusCode::OK, "ok".to_owned()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::Health;

    #[test]
    fn a_failing_check_keeps_readiness_down_and_names_its_reason() {
        let health = Health::default();
        assert_eq!(health.readiness(), Err("not ready".to_owned()));
        health.set_ready(true);
        let broken = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&broken);
        health.add_check("state", move || {
            flag.load(Ordering::Relaxed).then(|| "the journal refuses writes".to_owned())
        });
        assert_eq!(health.readiness(), Ok(()));
        broken.store(true, Ordering::Relaxed);
        assert_eq!(health.readiness(), Err("state: the journal refuses writes".to_owned()));
        broken.store(false, Ordering::Relaxed);
        assert_eq!(health.readiness(), Ok(()));
    }
}
