//! Plugin side of NRI: connects to a runtime, registers, and hands lifecycle events to a handler.
//!
//! One [`Plugin`] keeps one connection to the runtime's NRI socket. On that connection it serves
//! the `Plugin` ttrpc service (logical connection 1) and calls the runtime's `RegisterPlugin`
//! (logical connection 2). When the runtime goes away (it restarts, or it drops the plugin after
//! a timeout) the plugin reconnects with exponential backoff and registers again; the runtime
//! then configures it and synchronizes the pods that exist.
//!
//! Runtimes with NRI 0.11 and older announce pod events only through `StateChange`; NRI 0.12
//! runtimes call `RunPodSandbox`/`StopPodSandbox`/`RemovePodSandbox`. Both reach the same handler
//! methods; [`event_entry`] tells a handler which one delivered its event. The subscription sent in `Configure` is cut to the bits the runtime's NRI version
//! knows, since older runtimes reject unknown bits.
//!
//! Every handler call has a deadline below the runtime's request timeout (the runtime drops a
//! plugin that does not answer in time): when it passes, the runtime gets an error answer and
//! the handler keeps running in the background; its late result is only logged.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{FutureExt as _, StreamExt as _};
use tokio::net::UnixStream;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, TtrpcContext};
use ttrpc::{Code, get_status};

use super::mux::{Mux, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use super::proto::{api, api_ttrpc};
use super::types::{Container, Event, EventMask, NriVersion, PodSandbox};

/// Default NRI socket of containerd and CRI-O.
pub const DEFAULT_SOCKET_PATH: &str = "/var/run/nri/nri.sock";
/// The runtime's request timeout when it does not tell (NRI before 0.7): 2 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The runtime's registration timeout (5 s by default); our `RegisterPlugin` call uses this.
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// A handler's refusal or failure, reported to the runtime as the RPC's error.
///
/// For `RunPodSandbox` this fails the sandbox; for `CreateContainer` the container is not
/// created.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

impl HandlerError {
    /// A handler error with this message.
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// What a driver implements to follow pod sandboxes through NRI.
///
/// Calls for one connection may run concurrently. Every method has a deadline (see the module
/// docs); slow work belongs elsewhere.
pub trait PluginHandler: Send + Sync + 'static {
    /// The runtime's current pods, after each (re)registration. Containers are not passed.
    fn synchronize(
        &self,
        pods: Vec<PodSandbox>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = pods;
        async { Ok(()) }
    }

    /// A pod sandbox started: its network namespace exists (`pod.netns_path`).
    fn run_pod_sandbox(
        &self,
        pod: PodSandbox,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// A pod sandbox stopped. containerd 1.7 sends no netns path here, and sends neither
    /// stop nor remove for sandboxes that existed before it restarted (its NRI layer only
    /// tracks sandboxes it ran itself): reconcile those through [`Self::synchronize`].
    fn stop_pod_sandbox(
        &self,
        pod: PodSandbox,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// A pod sandbox was removed.
    fn remove_pod_sandbox(
        &self,
        pod: PodSandbox,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = pod;
        async { Ok(()) }
    }

    /// A container is about to be created; an error refuses it (the CRI call fails and
    /// kubelet retries). Only called when the subscription includes
    /// [`Event::CreateContainer`].
    fn create_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        let _ = (pod, container);
        async { Ok(()) }
    }
}

/// Why the plugin could not be set up or a connection ended badly.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// `plugin_idx` must be exactly two ASCII digits.
    #[error("invalid plugin index {0:?}: want two ASCII digits (\"00\" to \"99\")")]
    InvalidIndex(String),
    /// `plugin_name` must be non-empty and use only `[A-Za-z0-9_.+-]`.
    #[error("invalid plugin name {0:?}: want a non-empty name of [A-Za-z0-9_.+-]")]
    InvalidName(String),
    /// Connecting to the runtime's socket failed.
    #[error("connecting to NRI socket {path}")]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The multiplexed connection failed.
    #[error("NRI connection")]
    Mux(#[from] MuxError),
    /// A ttrpc call or the ttrpc server failed.
    #[error("ttrpc {op}")]
    Ttrpc {
        /// What was being done.
        op: &'static str,
        /// The cause.
        #[source]
        source: ttrpc::Error,
    },
    /// The runtime accepted the registration but sent no `Synchronize` in time.
    #[error("the NRI runtime accepted the registration but sent no Synchronize within {waited:?}")]
    Unconfirmed {
        /// How long the plugin waited.
        waited: Duration,
    },
}

/// Settings of an NRI plugin.
#[derive(Debug, Clone)]
pub struct PluginOptions {
    name: String,
    index: String,
    socket_path: PathBuf,
    events: EventMask,
    reconnect_initial: Duration,
    reconnect_max: Duration,
    registration_timeout: Duration,
    confirmation_timeout: Duration,
}

impl PluginOptions {
    /// Options for plugin `index-name` (e.g. `10-netclaim`), subscribed to pod sandbox
    /// run/stop/remove, on the default socket.
    pub fn new(name: impl Into<String>, index: impl Into<String>) -> Result<Self, PluginError> {
        let name = name.into();
        let index = index.into();
        if index.len() != 2 || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(PluginError::InvalidIndex(index));
        }
        if name.is_empty()
            || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.+-".contains(&b))
        {
            return Err(PluginError::InvalidName(name));
        }
        Ok(Self {
            name,
            index,
            socket_path: PathBuf::from(DEFAULT_SOCKET_PATH),
            events: EventMask::POD_SANDBOX_LIFECYCLE,
            reconnect_initial: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            confirmation_timeout: DEFAULT_REGISTRATION_TIMEOUT,
        })
    }

    /// Uses the runtime socket at `path`.
    #[must_use]
    pub fn socket_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.socket_path = path.into();
        self
    }

    /// Subscribes to `events` (cut to what the runtime knows at `Configure` time).
    #[must_use]
    pub fn events(mut self, events: EventMask) -> Self {
        self.events = events;
        self
    }

    /// Sets the reconnect backoff: first delay, doubled up to `max`.
    #[must_use]
    pub fn reconnect_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.reconnect_initial = initial;
        self.reconnect_max = max.max(initial);
        self
    }

    /// How long the plugin waits, after the runtime accepted `RegisterPlugin`, for the
    /// runtime's `Synchronize` before it gives the connection up and reconnects. A runtime
    /// sends `Configure` and `Synchronize` right after the registration; a plugin that is
    /// registered but never synchronized gets no pod events, so pods would start without
    /// what the plugin does for them. Default: the runtime's registration timeout (5 s).
    #[must_use]
    pub fn confirmation_timeout(mut self, timeout: Duration) -> Self {
        self.confirmation_timeout = timeout;
        self
    }

    /// The full plugin name the runtime logs: `<index>-<name>`.
    #[must_use]
    pub fn full_name(&self) -> String {
        format!("{}-{}", self.index, self.name)
    }
}

/// What the runtime told the plugin in `Configure`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeInfo {
    /// Runtime name, e.g. `containerd`.
    pub name: String,
    /// Runtime version, e.g. `1.7.24~ds1`.
    pub version: String,
    /// The runtime's NRI version (unknown before NRI 0.12).
    pub nri_version: NriVersion,
    /// The runtime's per-request timeout.
    pub request_timeout: Duration,
    /// The event mask the plugin subscribed with.
    pub events: EventMask,
}

/// Where the plugin's current connection stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginStatus {
    /// Not connected (yet, or again).
    Disconnected,
    /// Connected and registered; waiting for `Configure`.
    Registered,
    /// Configured by the runtime.
    Configured(RuntimeInfo),
    /// Configured and synchronized: events flow.
    Synchronized(RuntimeInfo),
}

/// How one connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// The caller asked the plugin to stop.
    LocalShutdown,
    /// The runtime sent `Shutdown`.
    RuntimeShutdown,
    /// The runtime closed the connection.
    Disconnected,
}

/// An NRI plugin driving a [`PluginHandler`].
pub struct Plugin<H> {
    handler: Arc<H>,
    options: PluginOptions,
    status: watch::Sender<PluginStatus>,
}

impl<H: PluginHandler> Plugin<H> {
    /// A plugin that calls `handler`.
    pub fn new(handler: Arc<H>, options: PluginOptions) -> Self {
        Self { handler, options, status: watch::Sender::new(PluginStatus::Disconnected) }
    }

    /// Follows the plugin's connection state.
    #[must_use]
    pub fn status(&self) -> watch::Receiver<PluginStatus> {
        self.status.subscribe()
    }

    /// Runs until `shutdown` is cancelled: connects, registers, serves events, and reconnects
    /// with exponential backoff whenever the connection ends or cannot be made.
    pub async fn run(&self, shutdown: CancellationToken) {
        let mut delay = self.options.reconnect_initial;
        loop {
            let outcome = self.run_once(&shutdown).await;
            self.status.send_if_modified(|s| {
                let changed = *s != PluginStatus::Disconnected;
                *s = PluginStatus::Disconnected;
                changed
            });
            match outcome {
                Ok(SessionEnd::LocalShutdown) => return,
                Ok(end) => {
                    tracing::info!(plugin = %self.options.full_name(), ?end, "NRI connection ended; reconnecting");
                    // The connection had registered: start the backoff afresh.
                    delay = self.options.reconnect_initial;
                }
                Err(err) => {
                    tracing::warn!(
                        plugin = %self.options.full_name(),
                        error = %error_chain(&err),
                        retry_in = ?delay,
                        "NRI connection failed"
                    );
                }
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(self.options.reconnect_max);
        }
    }

    /// One connection: connect, register, serve until it ends. Errors before registration
    /// completes are returned; ends after it are [`SessionEnd`]s.
    pub async fn run_once(&self, shutdown: &CancellationToken) -> Result<SessionEnd, PluginError> {
        let path = &self.options.socket_path;
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| PluginError::Connect { path: path.clone(), source })?;
        let mux = Mux::new(stream);
        let plugin_conn = mux.open(PLUGIN_SERVICE_CONN)?;
        let runtime_conn = mux.open(RUNTIME_SERVICE_CONN)?;

        let session = Arc::new(Session {
            handler: Arc::clone(&self.handler),
            events: self.options.events,
            status: self.status.clone(),
            request_timeout: Mutex::new(DEFAULT_REQUEST_TIMEOUT),
            runtime: Mutex::new(None),
            pending_sync: Mutex::new(Vec::new()),
            runtime_shutdown: Notify::new(),
            synchronize_seen: watch::Sender::new(false),
        });
        // The listener yields our one logical connection and then stays open: ttrpc's
        // `Server::shutdown` expects its accept loop to still be running.
        let listener = Listener::new(
            futures::stream::iter([Ok(plugin_conn)]).chain(futures::stream::pending()),
        );
        let mut server = Server::new()
            .add_listener(listener)
            .register_service(api_ttrpc::create_plugin(Arc::clone(&session) as _));
        server
            .start()
            .await
            .map_err(|source| PluginError::Ttrpc { op: "starting plugin service", source })?;

        let result = self.register_and_serve(&mux, runtime_conn, &session, shutdown).await;
        let _ = server.shutdown().await;
        mux.shutdown();
        result
    }

    async fn register_and_serve(
        &self,
        mux: &Mux,
        runtime_conn: super::mux::MuxConn,
        session: &Session<H>,
        shutdown: &CancellationToken,
    ) -> Result<SessionEnd, PluginError> {
        let runtime = api_ttrpc::RuntimeClient::new(Client::new(Socket::new(runtime_conn)));
        let request = api::RegisterPluginRequest {
            plugin_name: self.options.name.clone(),
            plugin_idx: self.options.index.clone(),
            ..Default::default()
        };
        let registration = runtime.register_plugin(
            ttrpc::context::with_timeout(duration_nanos(self.options.registration_timeout)),
            &request,
        );
        tokio::select! {
            () = shutdown.cancelled() => return Ok(SessionEnd::LocalShutdown),
            registered = registration => {
                registered.map_err(|source| PluginError::Ttrpc { op: "RegisterPlugin", source })?;
            }
        }
        // Configure may already have arrived; only move forward from Disconnected.
        self.status.send_if_modified(|s| {
            if *s == PluginStatus::Disconnected {
                *s = PluginStatus::Registered;
                true
            } else {
                false
            }
        });
        tracing::info!(plugin = %self.options.full_name(), socket = %self.options.socket_path.display(), "registered with NRI runtime");
        // Registered but never synchronized means no pod events: give up and reconnect.
        let mut seen = session.synchronize_seen.subscribe();
        let waited = self.options.confirmation_timeout;
        let unconfirmed = async move {
            if tokio::time::timeout(waited, seen.wait_for(|seen| *seen)).await.is_ok() {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = shutdown.cancelled() => Ok(SessionEnd::LocalShutdown),
            () = unconfirmed => Err(PluginError::Unconfirmed { waited }),
            () = session.runtime_shutdown.notified() => Ok(SessionEnd::RuntimeShutdown),
            closed = mux.closed() => match closed {
                Ok(()) => Ok(SessionEnd::Disconnected),
                Err(err) => Err(err.into()),
            },
        }
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn duration_nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

tokio::task_local! {
    /// When the running handler call's answer is due (see [`handler_deadline`]).
    static CALL_DEADLINE: tokio::time::Instant;
    /// Which runtime call delivered the pod event the running handler call handles.
    static EVENT_ENTRY: EventEntry;
}

/// Which runtime call delivered a pod event (run, stop, remove). Both reach the same handler
/// methods; this tells them apart for a driver that wants to see when its runtime moves from
/// one to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventEntry {
    /// `StateChange` carrying the event: all that runtimes with NRI 0.11 and older send
    /// (containerd 1.7 and 2.1 among them). NRI 0.12 deprecates it.
    StateChange,
    /// The event's own call (`RunPodSandbox`, `StopPodSandbox`, `RemovePodSandbox`), NRI 0.12
    /// and later.
    PodSandboxCall,
}

impl EventEntry {
    /// `state_change` or `pod_sandbox_call`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::StateChange => "state_change",
            Self::PodSandboxCall => "pod_sandbox_call",
        }
    }
}

/// Which runtime call delivered the pod event that the handler call running on this task
/// handles; `None` outside [`PluginHandler::run_pod_sandbox`], [`PluginHandler::stop_pod_sandbox`]
/// and [`PluginHandler::remove_pod_sandbox`].
#[must_use]
pub fn event_entry() -> Option<EventEntry> {
    EVENT_ENTRY.try_with(|entry| *entry).ok()
}

/// When the answer of the handler call running on this task is due: the plugin answers the
/// runtime with a deadline error at this instant if the handler has not returned. A handler
/// that waits for something can stop a little before and refuse with its own message.
/// `None` outside a handler call.
#[must_use]
pub fn call_deadline() -> Option<tokio::time::Instant> {
    CALL_DEADLINE.try_with(|deadline| *deadline).ok()
}

/// The part of the runtime's timeout a handler may use: a quarter is kept for the answer to
/// travel back, and at most 250 ms.
fn handler_deadline(request_timeout: Duration) -> Duration {
    let reserve = (request_timeout / 4).min(Duration::from_millis(250));
    request_timeout.saturating_sub(reserve)
}

/// Per-connection state behind the `Plugin` ttrpc service.
struct Session<H> {
    handler: Arc<H>,
    events: EventMask,
    status: watch::Sender<PluginStatus>,
    request_timeout: Mutex<Duration>,
    runtime: Mutex<Option<RuntimeInfo>>,
    /// Pods of a split `Synchronize` (NRI 0.8+) collected until the last chunk.
    pending_sync: Mutex<Vec<PodSandbox>>,
    runtime_shutdown: Notify,
    /// Whether the runtime's `Synchronize` arrived (its first part, for a split one).
    synchronize_seen: watch::Sender<bool>,
}

impl<H: PluginHandler> Session<H> {
    /// Runs a handler call bounded by the handler deadline. The call runs on the request's
    /// own task (a task of its own would cost a wake-up of that task's thread and one back on
    /// every request, tens of microseconds each on an idle node); a call still running at the
    /// deadline, or when ttrpc drops the request (the runtime's connection closed), moves to a
    /// task of its own and runs to its end there: a handler is never cut off between two of
    /// its steps.
    async fn call<F, Fut>(&self, what: &'static str, call: F) -> ttrpc::Result<()>
    where
        F: FnOnce(Arc<H>) -> Fut,
        Fut: Future<Output = Result<(), HandlerError>> + Send + 'static,
    {
        let deadline =
            handler_deadline(*self.request_timeout.lock().unwrap_or_else(PoisonError::into_inner));
        let due = tokio::time::Instant::now() + deadline;
        let mut work =
            RunToCompletion::new(CALL_DEADLINE.scope(due, call(Arc::clone(&self.handler))));
        let outcome =
            tokio::time::timeout_at(due, AssertUnwindSafe(&mut work).catch_unwind()).await;
        // Past the deadline `work` is dropped here unfinished, which moves it to a task.
        drop(work);
        match outcome {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(err))) => {
                tracing::info!(event = what, error = %err, "NRI handler refused");
                Err(ttrpc::Error::RpcStatus(get_status(Code::UNKNOWN, err.0)))
            }
            Ok(Err(panic)) => {
                let message = panic
                    .downcast_ref::<&str>()
                    .map(|m| (*m).to_owned())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                tracing::error!(event = what, panic = %message, "NRI handler panicked");
                Err(ttrpc::Error::RpcStatus(get_status(
                    Code::INTERNAL,
                    format!("{what} handler panicked"),
                )))
            }
            Err(_elapsed) => {
                tracing::warn!(
                    event = what,
                    ?deadline,
                    "NRI handler missed its deadline; it keeps running"
                );
                Err(ttrpc::Error::RpcStatus(get_status(
                    Code::DEADLINE_EXCEEDED,
                    format!("{what} handler did not finish within {deadline:?}"),
                )))
            }
        }
    }

    async fn pod_event(
        &self,
        event: Event,
        entry: EventEntry,
        pod: PodSandbox,
    ) -> ttrpc::Result<()> {
        tracing::debug!(?event, %pod, netns = ?pod.netns_path, via = entry.as_str(), "NRI pod event");
        match event {
            Event::RunPodSandbox => {
                self.call("RunPodSandbox", |h| {
                    EVENT_ENTRY.scope(entry, async move { h.run_pod_sandbox(pod).await })
                })
                .await
            }
            Event::StopPodSandbox => {
                self.call("StopPodSandbox", |h| {
                    EVENT_ENTRY.scope(entry, async move { h.stop_pod_sandbox(pod).await })
                })
                .await
            }
            Event::RemovePodSandbox => {
                self.call("RemovePodSandbox", |h| {
                    EVENT_ENTRY.scope(entry, async move { h.remove_pod_sandbox(pod).await })
                })
                .await
            }
            Event::CreateContainer | Event::UpdatePodSandbox => Ok(()),
        }
    }
}

fn pod_of(pod: &protobuf::MessageField<api::PodSandbox>) -> PodSandbox {
    pod.as_ref().map(PodSandbox::from).unwrap_or_default()
}

/// A future polled where it is awaited that, dropped before it finished (its deadline passed,
/// or ttrpc dropped the request because the runtime's connection closed), is not cancelled:
/// it is spawned to finish on a task of its own.
struct RunToCompletion<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    /// `None` once finished (or after it panicked: a panicked future is not run again).
    work: Option<Pin<Box<F>>>,
}

impl<F> RunToCompletion<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn new(work: F) -> Self {
        Self { work: Some(Box::pin(work)) }
    }
}

impl<F> Future for RunToCompletion<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // Out while it runs: if it panics, it is dropped here and never spawned.
        let Some(mut work) = self.work.take() else {
            return Poll::Pending;
        };
        match work.as_mut().poll(cx) {
            Poll::Ready(output) => Poll::Ready(output),
            Poll::Pending => {
                self.work = Some(work);
                Poll::Pending
            }
        }
    }
}

impl<F> Drop for RunToCompletion<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        if let Some(work) = self.work.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            drop(runtime.spawn(work));
        }
    }
}

#[async_trait::async_trait]
impl<H: PluginHandler> api_ttrpc::Plugin for Session<H> {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let request_timeout = u64::try_from(req.request_timeout)
            .ok()
            .filter(|ms| *ms > 0)
            .map_or(DEFAULT_REQUEST_TIMEOUT, Duration::from_millis);
        let nri_version = NriVersion::parse(&req.NRI_version);
        let mut events = self.events.for_runtime(&nri_version);
        if events == EventMask::EMPTY {
            // On the wire 0 means "every event"; a plugin that asked for nothing the runtime
            // knows gets the pod lifecycle instead.
            tracing::warn!(
                "no subscribed event is known to the runtime; subscribing to pod lifecycle"
            );
            events = EventMask::POD_SANDBOX_LIFECYCLE;
        }
        if events != self.events {
            tracing::warn!(
                wanted = format_args!("{:#x}", self.events.0),
                sent = format_args!("{:#x}", events.0),
                %nri_version,
                "runtime does not know some subscribed events; leaving them out"
            );
        }
        let info = RuntimeInfo {
            name: req.runtime_name.clone(),
            version: req.runtime_version.clone(),
            nri_version,
            request_timeout,
            events,
        };
        tracing::info!(runtime = %info.name, version = %info.version, nri = %info.nri_version, ?request_timeout, "configured by NRI runtime");
        *self.request_timeout.lock().unwrap_or_else(PoisonError::into_inner) = request_timeout;
        *self.runtime.lock().unwrap_or_else(PoisonError::into_inner) = Some(info.clone());
        self.status.send_replace(PluginStatus::Configured(info));
        Ok(api::ConfigureResponse {
            events: i32::try_from(events.0).expect("masks are below bit 15"),
            ..Default::default()
        })
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        self.synchronize_seen.send_replace(true);
        let pods = {
            let mut pending = self.pending_sync.lock().unwrap_or_else(PoisonError::into_inner);
            pending.extend(req.pods.iter().map(PodSandbox::from));
            if req.more {
                // Split sync: answer `more` with no updates until the last chunk.
                return Ok(api::SynchronizeResponse { more: true, ..Default::default() });
            }
            std::mem::take(&mut *pending)
        };
        tracing::info!(
            pods = pods.len(),
            containers = req.containers.len(),
            "synchronizing with NRI runtime"
        );
        let started = std::time::Instant::now();
        self.call("Synchronize", |h| async move { h.synchronize(pods).await }).await?;
        if let Some(info) = self.runtime.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            self.status.send_replace(PluginStatus::Synchronized(info));
        }
        tracing::info!(took = ?started.elapsed(), "answered Synchronize");
        Ok(api::SynchronizeResponse::default())
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        tracing::info!("NRI runtime is shutting down");
        self.runtime_shutdown.notify_one();
        Ok(api::Empty::default())
    }

    async fn run_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RunPodSandboxRequest,
    ) -> ttrpc::Result<api::RunPodSandboxResponse> {
        self.pod_event(Event::RunPodSandbox, EventEntry::PodSandboxCall, pod_of(&req.pod)).await?;
        Ok(api::RunPodSandboxResponse::default())
    }

    async fn update_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        _req: api::UpdatePodSandboxRequest,
    ) -> ttrpc::Result<api::UpdatePodSandboxResponse> {
        // Resource updates do not concern a network driver; answered so that a runtime that
        // sends it anyway does not see an error.
        Ok(api::UpdatePodSandboxResponse::default())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        self.pod_event(Event::StopPodSandbox, EventEntry::PodSandboxCall, pod_of(&req.pod)).await?;
        Ok(api::StopPodSandboxResponse::default())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        self.pod_event(Event::RemovePodSandbox, EventEntry::PodSandboxCall, pod_of(&req.pod))
            .await?;
        Ok(api::RemovePodSandboxResponse::default())
    }

    async fn create_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::CreateContainerRequest,
    ) -> ttrpc::Result<api::CreateContainerResponse> {
        let pod = pod_of(&req.pod);
        let container = req.container.as_ref().map(Container::from).unwrap_or_default();
        tracing::debug!(%pod, container = %container.name, "NRI CreateContainer");
        self.call("CreateContainer", |h| async move { h.create_container(pod, container).await })
            .await?;
        Ok(api::CreateContainerResponse::default())
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let event = match req.event.enum_value() {
            Ok(api::Event::RUN_POD_SANDBOX) => Some(Event::RunPodSandbox),
            Ok(api::Event::STOP_POD_SANDBOX) => Some(Event::StopPodSandbox),
            Ok(api::Event::REMOVE_POD_SANDBOX) => Some(Event::RemovePodSandbox),
            _ => None,
        };
        if let Some(event) = event {
            self.pod_event(event, EventEntry::StateChange, pod_of(&req.pod)).await?;
        } else {
            tracing::debug!(event = ?req.event, "ignoring NRI state change");
        }
        Ok(api::Empty::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names_and_indexes_are_validated() {
        assert!(PluginOptions::new("netclaim", "10").is_ok());
        assert!(PluginOptions::new("a_b.c+d-e", "00").is_ok());
        for idx in ["1", "100", "ab", "", "1x"] {
            assert!(
                matches!(PluginOptions::new("x", idx), Err(PluginError::InvalidIndex(_))),
                "{idx}"
            );
        }
        for name in ["", "has space", "slash/y", "ünï"] {
            assert!(
                matches!(PluginOptions::new(name, "10"), Err(PluginError::InvalidName(_))),
                "{name}"
            );
        }
        assert_eq!(PluginOptions::new("netclaim", "10").unwrap().full_name(), "10-netclaim");
    }

    #[test]
    fn handler_deadline_stays_below_the_runtime_timeout() {
        assert_eq!(handler_deadline(Duration::from_secs(2)), Duration::from_millis(1750));
        assert_eq!(handler_deadline(Duration::from_millis(200)), Duration::from_millis(150));
        assert!(handler_deadline(Duration::from_secs(30)) < Duration::from_secs(30));
    }
}
