//! The operations endpoint of both processes, `netclaim node` and `netclaim controller`:
//! `/metrics` (the process's registry in the Prometheus text format), `/healthz` (live while
//! it serves) and `/readyz` (its [`Health`]). Each process gives [`serve`] its own registry
//! and readiness; the answers are the same for both.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::inventory::publish::ReadinessSink;

/// The metric families a process serves on `/metrics`.
pub trait MetricsRegistry: Send + Sync + 'static {
    /// The registry holding every family.
    fn registry(&self) -> &Registry;
}

/// `registry` in the text exposition format.
#[must_use]
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing into a String cannot fail.
    let _infallible = prometheus_client::encoding::text::encode(&mut text, registry);
    text
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

/// The node daemon is ready once its first publication succeeded.
impl ReadinessSink for Health {
    fn mark_ready(&self) {
        self.set_ready(true);
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
    metrics: Arc<dyn MetricsRegistry>,
    health: Arc<Health>,
}

/// Binds `address` and serves `/metrics` (from `metrics`), `/healthz` and `/readyz` (from
/// `health`) until `shutdown` resolves. Returns the bound address (port 0 picks a free one)
/// and the serving task.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<impl MetricsRegistry>,
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
        encode(endpoint.metrics.registry()),
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
