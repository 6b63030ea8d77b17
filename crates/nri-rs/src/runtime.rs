//! Runtime side of NRI: accepts plugins on a socket and sends them pod and container events.
//!
//! This is the part of a container runtime that `netclaim dev` needs to announce bare network
//! namespaces as pod sandboxes, and that tests use instead of containerd. It follows what
//! containerd does: a plugin must register within the registration timeout, is then configured
//! and synchronized with the current pods, and receives the events it subscribed to in index
//! order. An error answer fails the event; a plugin that times out or whose connection breaks
//! is dropped and the event goes on without it.
//!
//! The runtime can speak like NRI 0.12 (per-event pod RPCs, falling back to `StateChange` when a
//! plugin answers `UNIMPLEMENTED`) or like older runtimes such as containerd 1.7 (`StateChange`
//! only, no NRI version in `Configure`).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, TtrpcContext};
use ttrpc::{Code, get_status};

use super::mux::{Mux, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use super::plugin::{DEFAULT_REGISTRATION_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, PluginOptions};
use super::proto::{api, api_ttrpc};
use super::types::{Container, Event, EventMask, PodSandbox};

/// Which NRI generation the runtime behaves like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuntimeProtocol {
    /// NRI 0.11 and older (containerd 1.7 to 2.2): pod events only as `StateChange`, no
    /// `NRI_version` in `Configure`, events 12 to 14 unknown.
    Legacy,
    /// NRI 0.12 (containerd 2.3): per-event pod RPCs, `NRI_version` = `v0.12.0`.
    V0_12,
}

impl RuntimeProtocol {
    fn nri_version(self) -> &'static str {
        match self {
            Self::Legacy => "",
            Self::V0_12 => "v0.12.0",
        }
    }

    fn valid_events(self) -> EventMask {
        match self {
            Self::Legacy => EventMask::VALID_BEFORE_NRI_0_10,
            Self::V0_12 => EventMask::VALID_FROM_NRI_0_10,
        }
    }
}

/// Settings of an NRI runtime endpoint.
#[derive(Debug, Clone)]
pub struct RuntimeOptions {
    /// Socket plugins connect to.
    pub socket_path: PathBuf,
    /// Name reported in `Configure`.
    pub runtime_name: String,
    /// Version reported in `Configure`.
    pub runtime_version: String,
    /// Which NRI generation to speak.
    pub protocol: RuntimeProtocol,
    /// Time a plugin has from connecting to registering.
    pub registration_timeout: Duration,
    /// Time a plugin has to answer one request.
    pub request_timeout: Duration,
    /// Most pods per `Synchronize` message; more pods are sent in several messages with
    /// `more = true` on all but the last, as NRI 0.8+ runtimes do for large states. `None`
    /// sends everything at once.
    pub sync_chunk_pods: Option<usize>,
    /// Fault injection for plugin tests: this many connections, the first to register, get
    /// their `RegisterPlugin` answered and then nothing (no `Configure`, no `Synchronize`),
    /// as from a runtime stuck after the registration. 0 outside such tests.
    pub stall_after_registration: usize,
}

impl RuntimeOptions {
    /// NRI 0.12 behaviour with containerd's default timeouts.
    pub fn new(socket_path: impl Into<PathBuf>) -> Self {
        Self {
            socket_path: socket_path.into(),
            runtime_name: "netclaim".to_owned(),
            runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
            protocol: RuntimeProtocol::V0_12,
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            sync_chunk_pods: None,
            stall_after_registration: 0,
        }
    }
}

/// Errors of the runtime side.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The socket could not be created.
    #[error("binding NRI socket {path}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A plugin answered an event with an error (containerd then fails the CRI call).
    #[error("NRI plugin {plugin} failed {event}: {message}")]
    PluginFailed {
        /// Full plugin name, `<index>-<name>`.
        plugin: String,
        /// The event, e.g. `RunPodSandbox`.
        event: &'static str,
        /// The plugin's error message.
        message: String,
    },
    /// Fewer plugins than expected registered in time.
    #[error("{have} of {want} NRI plugins registered within {timeout:?}")]
    PluginsMissing {
        /// Plugins expected.
        want: usize,
        /// Plugins registered.
        have: usize,
        /// How long we waited.
        timeout: Duration,
    },
}

/// A plugin that registered and was configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredPlugin {
    /// Plugin name.
    pub name: String,
    /// Plugin index (two digits).
    pub index: String,
    /// Events it subscribed to.
    pub events: EventMask,
}

impl RegisteredPlugin {
    /// `<index>-<name>`.
    #[must_use]
    pub fn full_name(&self) -> String {
        format!("{}-{}", self.index, self.name)
    }
}

struct Connected {
    info: RegisteredPlugin,
    client: api_ttrpc::PluginClient,
    /// Cancelling it closes the connection (its serving task owns the mux).
    close: CancellationToken,
}

struct Shared {
    options: RuntimeOptions,
    /// Registered plugins in call order (ascending index).
    plugins: Mutex<Vec<Arc<Connected>>>,
    /// Pods that ran and were not removed, for `Synchronize`.
    pods: Mutex<BTreeMap<String, PodSandbox>>,
    registered: watch::Sender<usize>,
    stop: CancellationToken,
    /// Registrations stalled so far ([`RuntimeOptions::stall_after_registration`]).
    stalled: std::sync::atomic::AtomicUsize,
}

/// The runtime end of NRI: a listening socket and the plugins connected to it.
///
/// Dropping it stops accepting, closes every plugin connection and removes the socket file.
pub struct NriRuntime {
    shared: Arc<Shared>,
}

impl NriRuntime {
    /// Binds the socket (replacing a stale socket file) and starts accepting plugins. Must be
    /// called inside a tokio runtime.
    pub fn bind(options: RuntimeOptions) -> Result<Self, RuntimeError> {
        let path = options.socket_path.clone();
        let bind_err = |source| RuntimeError::Bind { path: path.clone(), source };
        remove_stale_socket(&path).map_err(bind_err)?;
        let listener = UnixListener::bind(&path).map_err(bind_err)?;
        let shared = Arc::new(Shared {
            options,
            plugins: Mutex::new(Vec::new()),
            pods: Mutex::new(BTreeMap::new()),
            registered: watch::Sender::new(0),
            stop: CancellationToken::new(),
            stalled: std::sync::atomic::AtomicUsize::new(0),
        });
        tokio::spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self { shared })
    }

    /// The socket plugins connect to.
    #[must_use]
    pub fn socket_path(&self) -> &Path {
        &self.shared.options.socket_path
    }

    /// Plugins currently registered, in call order.
    #[must_use]
    pub fn plugins(&self) -> Vec<RegisteredPlugin> {
        lock(&self.shared.plugins).iter().map(|p| p.info.clone()).collect()
    }

    /// Waits until at least `count` plugins are registered.
    pub async fn wait_for_plugins(
        &self,
        count: usize,
        timeout: Duration,
    ) -> Result<(), RuntimeError> {
        let mut registered = self.shared.registered.subscribe();
        let waited = tokio::time::timeout(timeout, registered.wait_for(|n| *n >= count)).await;
        match waited {
            Ok(Ok(_)) => Ok(()),
            _ => Err(RuntimeError::PluginsMissing {
                want: count,
                have: lock(&self.shared.plugins).len(),
                timeout,
            }),
        }
    }

    /// Announces a started pod sandbox; an error means a plugin refused it.
    pub async fn run_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), RuntimeError> {
        lock(&self.shared.pods).insert(pod.id.clone(), pod.clone());
        let result = self.pod_event(Event::RunPodSandbox, pod).await;
        if result.is_err() {
            lock(&self.shared.pods).remove(&pod.id);
        }
        result
    }

    /// Announces a stopped pod sandbox.
    pub async fn stop_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), RuntimeError> {
        self.pod_event(Event::StopPodSandbox, pod).await
    }

    /// Announces a removed pod sandbox.
    pub async fn remove_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), RuntimeError> {
        lock(&self.shared.pods).remove(&pod.id);
        self.pod_event(Event::RemovePodSandbox, pod).await
    }

    /// Announces a pod resource update (NRI 0.10+ only; a legacy runtime sends nothing).
    pub async fn update_pod_sandbox(&self, pod: &PodSandbox) -> Result<(), RuntimeError> {
        if self.shared.options.protocol == RuntimeProtocol::Legacy {
            return Ok(());
        }
        let request = api::UpdatePodSandboxRequest {
            pod: Some(api::PodSandbox::from(pod)).into(),
            ..Default::default()
        };
        for plugin in self.subscribed(Event::UpdatePodSandbox) {
            let call = plugin.client.update_pod_sandbox(no_ctx(), &request);
            self.settle(&plugin, "UpdatePodSandbox", call).await?;
        }
        Ok(())
    }

    /// Asks plugins whether `container` of `pod` may be created; an error is a refusal.
    pub async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<(), RuntimeError> {
        let request = api::CreateContainerRequest {
            pod: Some(api::PodSandbox::from(pod)).into(),
            container: Some(api::Container::from(container)).into(),
            ..Default::default()
        };
        for plugin in self.subscribed(Event::CreateContainer) {
            let call = plugin.client.create_container(no_ctx(), &request);
            self.settle(&plugin, "CreateContainer", call).await?;
        }
        Ok(())
    }

    /// Tells every plugin the runtime is going down, then closes all connections.
    pub async fn shutdown(self) {
        let plugins: Vec<_> = lock(&self.shared.plugins).drain(..).collect();
        for plugin in plugins {
            let _ = tokio::time::timeout(
                self.shared.options.request_timeout,
                plugin.client.shutdown(no_ctx(), &api::Empty::new()),
            )
            .await;
            plugin.close.cancel();
        }
        // Drop does the rest.
    }

    fn subscribed(&self, event: Event) -> Vec<Arc<Connected>> {
        lock(&self.shared.plugins)
            .iter()
            .filter(|p| p.info.events.contains(event))
            .cloned()
            .collect()
    }

    async fn pod_event(&self, event: Event, pod: &PodSandbox) -> Result<(), RuntimeError> {
        let wire = api::PodSandbox::from(pod);
        for plugin in self.subscribed(event) {
            let (name, result) = self.send_pod_event(&plugin, event, &wire).await;
            self.settle(&plugin, name, async { result }).await?;
        }
        Ok(())
    }

    async fn send_pod_event(
        &self,
        plugin: &Connected,
        event: Event,
        pod: &api::PodSandbox,
    ) -> (&'static str, ttrpc::Result<()>) {
        let pod = || Some(pod.clone()).into();
        let (name, wire_event) = match event {
            Event::RunPodSandbox => ("RunPodSandbox", api::Event::RUN_POD_SANDBOX),
            Event::StopPodSandbox => ("StopPodSandbox", api::Event::STOP_POD_SANDBOX),
            Event::RemovePodSandbox => ("RemovePodSandbox", api::Event::REMOVE_POD_SANDBOX),
            Event::CreateContainer | Event::UpdatePodSandbox => return ("", Ok(())),
        };
        let timeout = self.shared.options.request_timeout;
        if self.shared.options.protocol == RuntimeProtocol::V0_12 {
            let c = &plugin.client;
            let call = async {
                match event {
                    Event::RunPodSandbox => c
                        .run_pod_sandbox(
                            no_ctx(),
                            &api::RunPodSandboxRequest { pod: pod(), ..Default::default() },
                        )
                        .await
                        .map(drop),
                    Event::StopPodSandbox => c
                        .stop_pod_sandbox(
                            no_ctx(),
                            &api::StopPodSandboxRequest { pod: pod(), ..Default::default() },
                        )
                        .await
                        .map(drop),
                    _ => c
                        .remove_pod_sandbox(
                            no_ctx(),
                            &api::RemovePodSandboxRequest { pod: pod(), ..Default::default() },
                        )
                        .await
                        .map(drop),
                }
            };
            let result = with_timeout(timeout, call).await;
            // NRI 0.12 falls back to StateChange for plugins built against older NRI.
            if !matches!(&result, Err(ttrpc::Error::RpcStatus(s)) if s.code() == Code::UNIMPLEMENTED)
            {
                return (name, result);
            }
        }
        let request =
            api::StateChangeEvent { event: wire_event.into(), pod: pod(), ..Default::default() };
        let result = with_timeout(timeout, plugin.client.state_change(no_ctx(), &request)).await;
        (name, result.map(drop))
    }

    /// Turns a plugin's answer into the event's outcome: an error status fails the event;
    /// a timeout or a broken connection drops the plugin and the event goes on.
    async fn settle<T>(
        &self,
        plugin: &Arc<Connected>,
        event: &'static str,
        call: impl Future<Output = ttrpc::Result<T>>,
    ) -> Result<(), RuntimeError> {
        match with_timeout(self.shared.options.request_timeout, call).await {
            Ok(_) => Ok(()),
            Err(ttrpc::Error::RpcStatus(status)) if !status.message().starts_with(TIMEOUT_MARK) => {
                Err(RuntimeError::PluginFailed {
                    plugin: plugin.info.full_name(),
                    event,
                    message: status.message().to_owned(),
                })
            }
            Err(err) => {
                tracing::warn!(plugin = %plugin.info.full_name(), event, error = %err, "dropping NRI plugin");
                self.drop_plugin(plugin);
                Ok(())
            }
        }
    }

    fn drop_plugin(&self, plugin: &Arc<Connected>) {
        lock(&self.shared.plugins).retain(|p| !Arc::ptr_eq(p, plugin));
        plugin.close.cancel();
    }
}

impl Drop for NriRuntime {
    fn drop(&mut self) {
        self.shared.stop.cancel();
        for plugin in lock(&self.shared.plugins).drain(..) {
            plugin.close.cancel();
        }
        let _ = std::fs::remove_file(&self.shared.options.socket_path);
    }
}

/// Marks a timeout that happened on our side (as opposed to a plugin's own error answer).
const TIMEOUT_MARK: &str = "netclaim-nri-runtime: request timed out";

async fn with_timeout<T>(
    timeout: Duration,
    call: impl Future<Output = ttrpc::Result<T>>,
) -> ttrpc::Result<T> {
    tokio::time::timeout(timeout, call).await.unwrap_or_else(|_| {
        Err(ttrpc::Error::RpcStatus(get_status(
            Code::DEADLINE_EXCEEDED,
            format!("{TIMEOUT_MARK} after {timeout:?}"),
        )))
    })
}

fn no_ctx() -> ttrpc::context::Context {
    ttrpc::context::Context::default()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes a leftover socket file from an earlier run; refuses to remove anything else.
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::FileTypeExt as _;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path),
        Ok(_) => {
            Err(io::Error::new(io::ErrorKind::AlreadyExists, "path exists and is not a socket"))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

async fn accept_loop(listener: UnixListener, shared: Arc<Shared>) {
    loop {
        let accepted = tokio::select! {
            () = shared.stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _)) => {
                tokio::spawn(serve_plugin(stream, Arc::clone(&shared)));
            }
            Err(err) => {
                tracing::warn!(error = %err, "accepting NRI plugin connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The `Runtime` ttrpc service of one plugin connection.
struct RuntimeService {
    registration: Mutex<Option<oneshot::Sender<api::RegisterPluginRequest>>>,
}

#[async_trait::async_trait]
impl api_ttrpc::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        let Some(tx) = lock(&self.registration).take() else {
            return Err(ttrpc::Error::RpcStatus(get_status(
                Code::ALREADY_EXISTS,
                "plugin already registered on this connection",
            )));
        };
        if let Err(err) = PluginOptions::new(req.plugin_name.clone(), req.plugin_idx.clone()) {
            return Err(ttrpc::Error::RpcStatus(get_status(
                Code::INVALID_ARGUMENT,
                err.to_string(),
            )));
        }
        let _ = tx.send(req);
        Ok(api::Empty::new())
    }

    async fn update_containers(
        &self,
        _ctx: &TtrpcContext,
        req: api::UpdateContainersRequest,
    ) -> ttrpc::Result<api::UpdateContainersResponse> {
        // This runtime manages no container resources: every requested update fails.
        Ok(api::UpdateContainersResponse { failed: req.update, ..Default::default() })
    }
}

async fn serve_plugin(stream: UnixStream, shared: Arc<Shared>) {
    let mux = Mux::new(stream);
    let (Ok(plugin_conn), Ok(runtime_conn)) =
        (mux.open(PLUGIN_SERVICE_CONN), mux.open(RUNTIME_SERVICE_CONN))
    else {
        return;
    };
    let (reg_tx, reg_rx) = oneshot::channel();
    let service = Arc::new(RuntimeService { registration: Mutex::new(Some(reg_tx)) });
    let listener =
        Listener::new(futures::stream::iter([Ok(runtime_conn)]).chain(futures::stream::pending()));
    let mut server =
        Server::new().add_listener(listener).register_service(api_ttrpc::create_runtime(service));
    if let Err(err) = server.start().await {
        tracing::warn!(error = %err, "starting NRI runtime service failed");
        return;
    }
    let client = api_ttrpc::PluginClient::new(Client::new(Socket::new(plugin_conn)));
    let close = CancellationToken::new();

    let setup = async {
        let registration = tokio::time::timeout(shared.options.registration_timeout, reg_rx)
            .await
            .map_err(|_| "plugin did not register in time".to_owned())?
            .map_err(|_| "connection ended before registration".to_owned())?;
        let stall = shared.stalled.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |stalled| {
            (stalled < shared.options.stall_after_registration).then_some(stalled + 1)
        });
        if stall.is_ok() {
            tracing::info!("stalling after the registration (test fault)");
            std::future::pending::<()>().await;
        }
        let plugin = configure_and_sync(&shared, &client, registration).await?;
        Ok::<_, String>(plugin)
    };
    let setup = tokio::select! {
        () = shared.stop.cancelled() => Err("runtime stopping".to_owned()),
        closed = mux.closed() => Err(format!("connection closed during setup: {closed:?}")),
        s = setup => s,
    };
    match setup {
        Err(why) => tracing::warn!(reason = %why, "rejecting NRI plugin"),
        Ok(info) => {
            tracing::info!(plugin = %info.full_name(), events = format_args!("{:#x}", info.events.0), "NRI plugin registered");
            let connected = Arc::new(Connected { info, client, close: close.clone() });
            {
                let mut plugins = lock(&shared.plugins);
                plugins.push(Arc::clone(&connected));
                plugins.sort_by(|a, b| a.info.index.cmp(&b.info.index));
                shared.registered.send_replace(plugins.len());
            }
            tokio::select! {
                () = shared.stop.cancelled() => {}
                () = close.cancelled() => {}
                closed = mux.closed() => {
                    tracing::info!(plugin = %connected.info.full_name(), result = ?closed, "NRI plugin disconnected");
                }
            }
            let mut plugins = lock(&shared.plugins);
            plugins.retain(|p| !Arc::ptr_eq(p, &connected));
            shared.registered.send_replace(plugins.len());
        }
    }
    let _ = server.shutdown().await;
    mux.shutdown();
}

async fn configure_and_sync(
    shared: &Shared,
    client: &api_ttrpc::PluginClient,
    registration: api::RegisterPluginRequest,
) -> Result<RegisteredPlugin, String> {
    let options = &shared.options;
    let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    let configure = api::ConfigureRequest {
        runtime_name: options.runtime_name.clone(),
        runtime_version: options.runtime_version.clone(),
        registration_timeout: millis(options.registration_timeout),
        request_timeout: millis(options.request_timeout),
        NRI_version: options.protocol.nri_version().to_owned(),
        ..Default::default()
    };
    let reply = with_timeout(options.request_timeout, client.configure(no_ctx(), &configure))
        .await
        .map_err(|e| format!("Configure failed: {e}"))?;
    let valid = options.protocol.valid_events();
    let events = match u32::try_from(reply.events) {
        Ok(0) => valid,
        Ok(mask) if mask & !valid.0 == 0 => EventMask(mask),
        _ => return Err(format!("invalid plugin events {:#x}", reply.events)),
    };
    let pods: Vec<api::PodSandbox> =
        lock(&shared.pods).values().map(api::PodSandbox::from).collect();
    let chunk = options.sync_chunk_pods.unwrap_or(usize::MAX).max(1);
    let chunks: Vec<&[api::PodSandbox]> =
        if pods.is_empty() { vec![&[]] } else { pods.chunks(chunk).collect() };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        let more = i < last;
        let sync = api::SynchronizeRequest { pods: chunk.to_vec(), more, ..Default::default() };
        let reply = with_timeout(options.request_timeout, client.synchronize(no_ctx(), &sync))
            .await
            .map_err(|e| format!("Synchronize failed: {e}"))?;
        if more && !reply.more {
            return Err("plugin does not handle split sync requests".to_owned());
        }
    }
    Ok(RegisteredPlugin { name: registration.plugin_name, index: registration.plugin_idx, events })
}
