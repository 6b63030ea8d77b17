//! The operations endpoint of both processes, `netclaim node` and `netclaim controller`:
//! `/metrics` (the process's registry, in OpenMetrics or the Prometheus text format 0.0.4 as
//! the scraper's `Accept` asks: [`super::exposition`]), `/healthz` (live while
//! it serves) and `/readyz` (its [`Health`]). Each process gives [`serve`] its own registry
//! and readiness; the answers are the same for both.
//!
//! Two ways to serve ([`MetricsSecurity`], decision 0018): plain HTTP, for a loopback
//! address; or HTTPS where `/metrics` answers only a bearer token the API server
//! authenticates (TokenReview) for a user it lets `get /metrics` (SubjectAccessReview), see
//! [`super::access`]. `/healthz` and `/readyz` stay open in both: kubelet's HTTP probes
//! send no credentials (they cannot be given a token), and they tell nothing but up or down
//! and, when not ready, why.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use prometheus_client::registry::Registry;

use super::access::{Access, AccessReviewer, DelegatedAccess, Gate};
use super::tls::{TlsError, TlsListener, TlsSource, serving_certificate};
use crate::inventory::publish::ReadinessSink;

/// How `/metrics` is protected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum MetricsSecurity {
    /// Plain HTTP, anyone who reaches the address reads everything: for loopback.
    #[default]
    Plain,
    /// HTTPS with this certificate; `/metrics` only for scrapers the API server allows.
    Secure(TlsSource),
}

/// The metric families a process serves on `/metrics`.
pub trait MetricsRegistry: Send + Sync + 'static {
    /// The registry holding every family.
    fn registry(&self) -> &Registry;
}

/// `registry` in the OpenMetrics text format (`# EOF` included), as Prometheus asks for it.
#[must_use]
pub fn encode(registry: &Registry) -> String {
    super::exposition::encode_openmetrics(registry)
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
pub enum MetricsServerError {
    /// The address could not be bound.
    #[error("metrics endpoint on {address}: {source}")]
    Bind {
        /// The address.
        address: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The secure mode has no serving certificate.
    #[error("metrics endpoint on {address}: {source}")]
    Tls {
        /// The address.
        address: SocketAddr,
        /// Why.
        #[source]
        source: TlsError,
    },
}

#[derive(Clone)]
struct Endpoint {
    metrics: Arc<dyn MetricsRegistry>,
    health: Arc<Health>,
    /// `None`: plain, `/metrics` open to whoever connects.
    gate: Option<Arc<dyn Gate>>,
}

/// The serving task of the endpoint.
pub type EndpointTask = tokio::task::JoinHandle<()>;

/// Binds `address` and serves `/metrics` (from `metrics`), `/healthz` and `/readyz` (from
/// `health`) over plain HTTP until `shutdown` resolves. Returns the bound address (port 0
/// picks a free one) and the serving task.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<impl MetricsRegistry>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, EndpointTask), MetricsServerError> {
    serve_with::<NoReviews>(address, &MetricsSecurity::Plain, || None, metrics, health, shutdown)
        .await
}

/// [`serve`] as `security` says: in the secure mode over HTTPS, `/metrics` answering only
/// the scrapers `reviewer` (called once, only in that mode) lets in.
pub async fn serve_with<R: AccessReviewer>(
    address: SocketAddr,
    security: &MetricsSecurity,
    reviewer: impl FnOnce() -> Option<R>,
    metrics: Arc<impl MetricsRegistry>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, EndpointTask), MetricsServerError> {
    let tls = match security {
        MetricsSecurity::Plain => None,
        MetricsSecurity::Secure(source) => Some(
            serving_certificate(source)
                .map_err(|source| MetricsServerError::Tls { address, source })?,
        ),
    };
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| MetricsServerError::Bind { address, source })?;
    let bound =
        listener.local_addr().map_err(|source| MetricsServerError::Bind { address, source })?;
    let gate = match (&tls, reviewer()) {
        (Some(_), Some(reviewer)) => {
            Some(Arc::new(DelegatedAccess::new(reviewer)) as Arc<dyn Gate>)
        }
        // Secure without a reviewer: nobody can be let in (fail closed).
        (Some(_), None) => Some(Arc::new(DelegatedAccess::new(NoReviews)) as Arc<dyn Gate>),
        (None, _) => None,
    };
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz_handler))
        .with_state(Endpoint { metrics, health, gate });
    let task = match tls {
        None => tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
                tracing::error!(%err, "metrics endpoint stopped");
            }
        }),
        Some(certificate) => {
            tracing::info!(
                address = %bound,
                fingerprint = %certificate.fingerprint,
                "metrics endpoint: HTTPS, /metrics for scrapers the API server allows \
                 (TokenReview, SubjectAccessReview); certificate SHA-256 fingerprint"
            );
            let listener = TlsListener::new(listener, certificate.config)
                .map_err(|source| MetricsServerError::Bind { address, source })?;
            tokio::spawn(async move {
                if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await
                {
                    tracing::error!(%err, "metrics endpoint stopped");
                }
            })
        }
    };
    Ok((bound, task))
}

/// The reviewer of the plain mode (never called) and of a secure mode without an API
/// client: it knows no token.
struct NoReviews;

impl AccessReviewer for NoReviews {
    async fn authenticate(
        &self,
        _token: &str,
    ) -> Result<Option<super::access::UserInfo>, super::access::ReviewError> {
        Ok(None)
    }

    async fn authorize(
        &self,
        _user: &super::access::UserInfo,
        _verb: &str,
        _path: &str,
    ) -> Result<bool, super::access::ReviewError> {
        Ok(false)
    }
}

async fn metrics_handler(State(endpoint): State<Endpoint>, headers: HeaderMap) -> Response {
    if let Some(gate) = &endpoint.gate {
        let authorization =
            headers.get(header::AUTHORIZATION).and_then(|value| value.to_str().ok());
        match gate.check(authorization, "/metrics").await {
            Access::Allowed => {}
            Access::Unauthenticated => {
                return (
                    StatusCode::UNAUTHORIZED,
                    [(header::WWW_AUTHENTICATE, "Bearer")],
                    "Unauthorized: a bearer token the API server knows is required\n",
                )
                    .into_response();
            }
            Access::Forbidden(why) => {
                return (StatusCode::FORBIDDEN, format!("Forbidden: {why}\n")).into_response();
            }
            Access::Unavailable(why) => {
                return (
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the scraper's token could not be reviewed: {why}\n"),
                )
                    .into_response();
            }
        }
    }
    let accept = headers.get(header::ACCEPT).and_then(|value| value.to_str().ok());
    let format = super::exposition::negotiate(accept);
    (
        // `Vary`: the body depends on `Accept`, a cache between must not mix the formats.
        [(header::CONTENT_TYPE, format.content_type()), (header::VARY, "Accept")],
        super::exposition::encode_as(endpoint.metrics.registry(), format),
    )
        .into_response()
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
