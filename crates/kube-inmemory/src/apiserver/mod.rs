//! The in-memory Kubernetes API server of `netclaim dev`: the real REST protocol over HTTP
//! on loopback for the built-in resources netclaim uses and for the custom resources of
//! any `apiextensions.k8s.io/v1` CustomResourceDefinition created on it, with watches,
//! server-side apply, the status subresource, finalizers and validation.
//!
//! Faithful where clients depend on behaviour: one global resourceVersion, watches
//! that resume from it (410 Gone past the bounded history), selectors, bookmarks, 409 on
//! stale versions and on apply conflicts, list-map merges keyed as upstream
//! (`ResourceClaim.status.devices` by driver/pool/device/shareID; `ResourceSlice.spec.devices`
//! is `listType=atomic` upstream and so here), unknown fields pruned (or 400 with
//! `fieldValidation=Strict`), and 422 causes with field paths.
//!
//! Custom resources (`crd`): a definition is validated as upstream validates it (structural
//! schema, CEL rules that must compile) and installs one resource per served version
//! (endpoints, discovery, OpenAPI v3, printer columns, selectable fields, status
//! subresource); objects are pruned, defaulted and validated against the version's
//! `openAPIV3Schema` and `x-kubernetes-validations` with the real server's causes; deleting
//! a definition deletes its objects. See the `crd` module for what differs from upstream.
//!
//! Callers and who they are: an optional bearer token, tokens per user name, ServiceAccount
//! tokens issued through TokenRequest, and [`request_log`], which records each request's user
//! and authorization attributes (for a test that checks RBAC rules against what clients
//! really ask for). Servers that delegate to this one ask it through TokenReview and
//! SubjectAccessReview, the latter answered from the stored Roles, ClusterRoles and bindings
//! by Kubernetes' RBAC rules (`reviews`, `rbac`).
//!
//! kubectl's usual calls work: request bodies in protobuf are decoded for the kinds
//! `kubectl create <kind>` sends that way (`protobuf`; responses are JSON); workloads,
//! ConfigMaps, Secrets, Services and the like are stored with every verb and no controller
//! behind them (`catalog`), Deployments and their kin with the `scale` subresource;
//! `logs`/`exec`/`attach`/`portforward` answer 400 naming the pod's network namespace
//! (`pod_streams`: the dev cluster runs no containers).
//!
//! Known gaps: requests themselves are not authorised (an authenticated caller may do
//! everything: RBAC answers SubjectAccessReviews only); of admission only
//! ValidatingAdmissionPolicies (`admission`; namespaces need not exist); no garbage
//! collection of owned objects and no cascading namespace deletion;
//! strategic-merge-patch merge keys come from the server-side apply list table (a subset
//! of the built-in schemas); list pages and `resourceVersionMatch=Exact` are served from
//! the current state; core and events.k8s.io Events are separate stores; no defaulting of
//! built-in kinds beyond pod `status.phase`, namespace `status.phase` and the metadata the
//! server owns; no `/openapi/v2` (kubectl falls back to its compiled-in types or JSON merge
//! patch); no aggregated discovery (kubectl falls back to the per-group documents).

mod admission;
mod apply;
mod catalog;
mod crd;
mod discovery;
pub mod error;
mod fieldset;
mod impersonation;
mod objects;
pub mod peer;
mod pod_streams;
mod protobuf;
mod rbac;
pub mod request_log;
mod resources;
mod rest;
mod reviews;
mod scale;
mod selectors;
mod store;
mod strategic;
mod table;
mod typed;
mod validation;
#[cfg(test)]
mod validation_tests;
mod watch;

/// The Kubernetes CEL IP, CIDR and list libraries (`isIP`, `isCIDR`, `cidr()`, …) the CRD
/// rules use, to declare on a `cel::Env` (`env.add_extension(cel_network_library)`).
pub use crd::netlib::extension as cel_network_library;
pub use reviews::DEFAULT_AUDIENCE;

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use self::error::ApiError;
use self::request_log::{ANONYMOUS_USER, RequestLog, RequestRecord};
use self::rest::{ApiRequest, ApiResponse};
use self::store::Store;

/// Errors starting or running the server.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    /// The listen address could not be bound.
    #[error("binding the API server to {address}: {source}")]
    Bind {
        /// Address asked for.
        address: SocketAddr,
        /// OS error.
        source: std::io::Error,
    },
    /// The bound address could not be read back.
    #[error("reading the API server's bound address: {0}")]
    LocalAddr(std::io::Error),
    /// The initial objects could not be created.
    #[error("creating the initial objects: {0}")]
    Init(#[source] ApiError),
    /// Serving failed.
    #[error("serving the API server: {0}")]
    Serve(std::io::Error),
}

/// Tunables of the server.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Change events kept for watch resumption; a watch from an older resourceVersion gets
    /// 410 Gone.
    pub watch_history: usize,
    /// Byte budget of the same history (objects counted at their JSON size): old object
    /// versions live only there, so this bounds the memory beyond the live objects.
    pub watch_history_bytes: usize,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
    /// Watch duration when the client sets no `timeoutSeconds`.
    pub default_watch_timeout: Duration,
    /// Behave like a 1.34/1.35 server with the `DRAConsumableCapacity` gate off: drop
    /// `allowMultipleAllocations` and `capacity.*.requestPolicy` from `ResourceSlices`.
    pub drop_consumable_capacity: bool,
    /// Largest request body accepted (the real server's limit is 3 MiB).
    pub max_body_bytes: usize,
    /// When set, a request carrying `Authorization: Bearer <token>` is served. Without a
    /// caller check any local process (and any web page, were it not for the Host and Origin
    /// checks) could drive whatever acts on this server's objects.
    pub bearer_token: Option<String>,
    /// Serve connections whose client socket belongs to this server's own user (Linux,
    /// loopback). kubectl sends no bearer token over plain HTTP, so this is how it gets in.
    pub same_user: bool,
    /// More bearer tokens, each naming the user it authenticates (token → user name, like
    /// the real server's static token file), so several clients can be told apart in the
    /// [`request_log`](Self::request_log). They are served whatever the other options say;
    /// the caller of [`bearer_token`](Self::bearer_token) or of [`same_user`](Self::same_user)
    /// is [`ADMIN_USER`]. Nothing is authorised per user: every authenticated caller may do
    /// everything.
    pub user_tokens: HashMap<String, String>,
    /// When set, every request is recorded there with its user and authorization
    /// attributes (see [`request_log`]).
    pub request_log: Option<RequestLog>,
    /// Where the dev cluster pins each pod's network namespace (a file named by the pod's
    /// uid), named in the answer to `kubectl logs`/`exec` (the pods run no containers).
    pub pod_netns_dir: Option<std::path::PathBuf>,
}

/// The user of [`ServerOptions::bearer_token`] and of [`ServerOptions::same_user`] callers.
pub const ADMIN_USER: &str = "admin";

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            watch_history: 10_000,
            watch_history_bytes: 16 * 1024 * 1024,
            bookmark_interval: Duration::from_secs(10),
            default_watch_timeout: Duration::from_mins(30),
            drop_consumable_capacity: false,
            max_body_bytes: 3 * 1024 * 1024,
            bearer_token: None,
            same_user: false,
            user_tokens: HashMap::new(),
            request_log: None,
            pod_netns_dir: None,
        }
    }
}

/// State shared by every request.
pub(crate) struct Shared {
    store: Arc<Store>,
    options: ServerOptions,
    address: String,
    addr: SocketAddr,
    shutdown: tokio::sync::watch::Receiver<bool>,
    active_watches: Arc<AtomicUsize>,
    /// ServiceAccount tokens issued by TokenRequest.
    tokens: reviews::IssuedTokens,
    /// The ValidatingAdmissionPolicies compiled so far.
    admission: admission::PolicyCache,
}

/// A running server (from [`start`]).
pub struct ApiServer {
    addr: SocketAddr,
    shutdown: tokio::sync::watch::Sender<bool>,
    task: JoinHandle<Result<(), ApiServerError>>,
    active_watches: Arc<AtomicUsize>,
}

impl ApiServer {
    /// The bound address.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, the URL clients use.
    #[must_use]
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Number of watch streams open now (tests use it to know a client is watching).
    #[must_use]
    pub fn active_watches(&self) -> usize {
        self.active_watches.load(Ordering::SeqCst)
    }

    /// Stops serving: ends every watch, closes connections and waits for the task.
    pub async fn shutdown(self) -> Result<(), ApiServerError> {
        let _ = self.shutdown.send(true);
        match self.task.await {
            Ok(result) => result,
            Err(join) => Err(ApiServerError::Serve(std::io::Error::other(join))),
        }
    }
}

/// The serving task of [`serve`].
pub type ServeTask = JoinHandle<Result<(), ApiServerError>>;

/// Binds `listen` (port 0 picks a free port) and serves until `shutdown` completes.
/// Returns the bound address and the serving task. Watches end when shutdown begins.
pub async fn serve(
    listen: SocketAddr,
    options: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, ServeTask), ApiServerError> {
    let (addr, task, _) = bind_and_serve(listen, options, shutdown).await?;
    Ok((addr, task))
}

async fn bind_and_serve(
    listen: SocketAddr,
    options: ServerOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, ServeTask, Arc<AtomicUsize>), ApiServerError> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ApiServerError::Bind { address: listen, source })?;
    let addr = listener.local_addr().map_err(ApiServerError::LocalAddr)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let store = Store::new(store::HistoryLimits {
        events: options.watch_history,
        bytes: options.watch_history_bytes,
    });
    store.transact(false, objects::create_initial_namespaces).map_err(ApiServerError::Init)?;
    store.transact(false, rbac::create_bootstrap_policy).map_err(ApiServerError::Init)?;
    let shared = Arc::new(Shared {
        store: Arc::new(store),
        options,
        address: addr.to_string(),
        addr,
        shutdown: stop_rx,
        active_watches: Arc::new(AtomicUsize::new(0)),
        tokens: reviews::IssuedTokens::default(),
        admission: admission::PolicyCache::default(),
    });
    let active_watches = shared.active_watches.clone();
    let app = axum::Router::new().fallback(handle).with_state(shared);
    let task = tokio::spawn(async move {
        let graceful = async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        };
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .with_graceful_shutdown(graceful)
            .await
            .map_err(ApiServerError::Serve)
    });
    Ok((addr, task, active_watches))
}

/// Starts a server on `listen` and returns a handle that stops it.
pub async fn start(
    listen: SocketAddr,
    options: ServerOptions,
) -> Result<ApiServer, ApiServerError> {
    let (tx, mut rx) = tokio::sync::watch::channel(false);
    let (addr, task, active_watches) = bind_and_serve(listen, options, async move {
        let _ = rx.wait_for(|stop| *stop).await;
    })
    .await?;
    Ok(ApiServer { addr, shutdown: tx, task, active_watches })
}

fn json_response(code: u16, body: &serde_json::Value, warnings: &[String]) -> Response {
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append(header::WARNING, v);
        }
    }
    resp
}

/// Refuses requests that do not come from a local API client: a wrong or missing bearer
/// token (when one is configured); a `Host` that is not a loopback name (a web page that
/// rebinds its DNS name to 127.0.0.1 sends its own name); any `Origin` (browsers send it on
/// cross-site requests, kubectl and client libraries never do). Returns the caller's user
/// identity.
fn check_caller(
    shared: &Shared,
    headers: &axum::http::HeaderMap,
    client: SocketAddr,
) -> Result<reviews::UserInfo, ApiError> {
    let (options, server) = (&shared.options, shared.addr);
    if let Some(origin) = headers.get(header::ORIGIN) {
        return Err(ApiError::with(
            403,
            "Forbidden",
            format!("requests from a web page (Origin {origin:?}) are not served"),
        ));
    }
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    if !is_loopback_host(host) {
        return Err(ApiError::with(
            403,
            "Forbidden",
            format!(
                "Host {host:?} is not a loopback address; this server serves loopback clients only"
            ),
        ));
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Static user tokens and the ServiceAccount tokens issued here (the admin token below).
    if let Some(user) = presented
        .filter(|token| options.bearer_token.as_deref() != Some(*token))
        .and_then(|token| reviews::authenticate(shared, token))
    {
        return Ok(user);
    }
    if options.bearer_token.is_none() && !options.same_user && options.user_tokens.is_empty() {
        return Ok(reviews::anonymous());
    }
    let token_ok = options.bearer_token.as_deref().is_some_and(|t| presented == Some(t));
    // Only without the token: reading `/proc/net/tcp` walks the kernel's whole TCP hash
    // table, milliseconds on a large machine, for every request.
    let user_ok = || {
        options.same_user
            && peer::own_uid().is_some_and(|own| peer::owner_uid(client, server) == Some(own))
    };
    if token_ok || user_ok() {
        Ok(reviews::admin())
    } else {
        Err(ApiError::with(401, "Unauthorized", "Unauthorized"))
    }
}

/// `127.0.0.1:8080`, `localhost`, `[::1]:6443`: a loopback literal or `localhost`, with an
/// optional port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(name, _port)| name)
    };
    name.eq_ignore_ascii_case("localhost")
        || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn error_response(err: &ApiError) -> Response {
    json_response(err.code, &err.to_status(), &[])
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    axum::extract::ConnectInfo(client): axum::extract::ConnectInfo<SocketAddr>,
    Query(query): Query<HashMap<String, String>>,
    req: Request,
) -> Response {
    let (accept, content_type, user_agent) = {
        let header = |name: header::HeaderName| {
            req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned()
        };
        (header(header::ACCEPT), header(header::CONTENT_TYPE), header(header::USER_AGENT))
    };
    let caller = check_caller(&shared, req.headers(), client)
        .and_then(|user| impersonation::apply(user, req.headers()));
    let method = req.method().as_str().to_owned();
    let path = req.uri().path().to_owned();
    let log = |user: &str, code: u16| {
        if let Some(log) = &shared.options.request_log {
            log.record(RequestRecord {
                user: user.to_owned(),
                attributes: request_log::attributes(&method, &path, &query),
                code,
            });
        }
    };
    let user_info = match caller {
        Ok(user) => user,
        Err(refused) => {
            log(ANONYMOUS_USER, refused.code);
            return error_response(&refused);
        }
    };
    let user = user_info.name.clone();
    let body = match axum::body::to_bytes(req.into_body(), shared.options.max_body_bytes).await {
        Ok(b) => b,
        Err(e) => {
            log(&user, 413);
            return error_response(&ApiError {
                code: 413,
                reason: "RequestEntityTooLarge",
                message: format!("request body too large or unreadable: {e}"),
                details: None,
            });
        }
    };
    let api_req = ApiRequest {
        method: &method,
        path: &path,
        query: &query,
        accept: &accept,
        content_type: &content_type,
        user_agent: &user_agent,
        body: &body,
        user: &user_info,
    };
    let result = rest::handle(&shared, &api_req);
    tracing::debug!(method = %method, path = %path, ok = result.is_ok(), "api request");
    log(
        &user,
        match &result {
            Ok(ApiResponse::Json { code, .. } | ApiResponse::Bytes { code, .. }) => *code,
            Ok(ApiResponse::Watch(_)) => 200,
            Err(e) => e.code,
        },
    );
    match result {
        Ok(ApiResponse::Json { code, body, warnings }) => json_response(code, &body, &warnings),
        Ok(ApiResponse::Bytes { code, body }) => {
            let mut resp = Response::new(Body::from(body));
            *resp.status_mut() =
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp
        }
        Ok(ApiResponse::Watch(watch_req)) => {
            let (tx, rx) = mpsc::channel::<String>(256);
            let store = shared.store.clone();
            let stop = shared.shutdown.clone();
            let counter = shared.active_watches.clone();
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                watch::run(store, watch_req, tx, stop).await;
                counter.fetch_sub(1, Ordering::SeqCst);
            });
            let stream = futures::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|line| (Ok::<_, std::convert::Infallible>(line), rx))
            });
            let mut resp = Response::new(Body::from_stream(stream));
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            resp.headers_mut()
                .insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
            resp
        }
        Err(e) => error_response(&e),
    }
}
