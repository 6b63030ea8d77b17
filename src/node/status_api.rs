//! The node daemon's local read-only status API (DESIGN §5 item 9), what `netclaim status`
//! reads: `GET /v1/status` on `<state-dir>/netclaim.sock` (a Unix socket, mode 0600, JSON
//! over HTTP/1) answers a [`NodeStatus`]: the published devices with their health, the
//! prepared claims, and the pods with their interfaces, addresses and counters.
//!
//! [`NodeStatus::assemble`] builds the document from plain snapshots of the daemon's state
//! (no I/O); [`serve`] answers it on the socket from a [`StatusSource`]; [`fetch`] is the
//! client. The daemon serves it from snapshots of its running parts (`start`).

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

use crate::attach::{AttachmentState, PodAttachment};
use crate::claims::PreparedClaim;
use crate::health::{HealthReport, HealthStatus};
use crate::inventory::publish::SharingHold;
use crate::metrics::{Health, InterfaceLabels, Metrics};
use crate::model::device::Device;
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
use crate::model::stats::InterfaceStats;

use super::{NodeAttach, NodeClaims, NodeConfig};

/// The socket's file name in the state dir.
pub const SOCKET_NAME: &str = "netclaim.sock";
/// The path of the status document.
pub const STATUS_PATH: &str = "/v1/status";
/// `apiVersion` of [`NodeStatus`].
pub const API_VERSION: &str = "netclaim.dev/v1alpha1";
/// `kind` of [`NodeStatus`].
pub const KIND: &str = "NodeStatus";
/// How long [`fetch`] waits for the whole answer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer [`fetch`] reads (250 pods with counters are ~200 KiB).
const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

/// What a node daemon reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// [`API_VERSION`].
    pub api_version: String,
    /// [`KIND`].
    pub kind: String,
    /// The node (also the pool name).
    pub node: String,
    /// The DRA driver name.
    pub driver: String,
    /// The daemon's version.
    pub version: String,
    /// When this document was assembled (RFC 3339).
    pub collected_at: String,
    /// Whether `/readyz` answers ready.
    pub ready: bool,
    /// Why not, when not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_reason: Option<String>,
    /// The pool's generation as last published.
    pub pool_generation: i64,
    /// Sharing changes that wait until claims prepared on a shared device are unprepared
    /// (`inventory::publish::SharingHold`), one sentence each; empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held_sharing_changes: Vec<String>,
    /// Whether traffic counters are on.
    pub counters: bool,
    /// The published devices, by name.
    pub devices: Vec<DeviceStatus>,
    /// The prepared claims, by namespace and name.
    pub claims: Vec<ClaimStatus>,
    /// The pods with interfaces of this driver, by namespace and name.
    pub pods: Vec<PodStatus>,
}

/// One published device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceStatus {
    /// Device name in the ResourceSlice.
    pub name: String,
    /// Host interface it stands for (the parent of a shared or slot device).
    pub interface: String,
    /// The `type` attribute.
    #[serde(rename = "type")]
    pub kind: String,
    /// `exclusive`, `shared` or `slot`.
    pub sharing: String,
    /// `netclaim.dev/interfaces` of a shared parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
    /// The PodNetwork the device carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_network: Option<String>,
    /// `Healthy`, `Unhealthy` or `Unknown` (KEP-4680).
    pub health: String,
    /// Why, naming the interface.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub health_message: String,
}

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimStatus {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim UID.
    pub uid: String,
    /// The pod it is reserved for (`name`; same namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// Its devices.
    pub devices: Vec<ClaimDeviceStatus>,
}

/// One device of a prepared claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimDeviceStatus {
    /// Request of the allocation result.
    pub request: String,
    /// Device name.
    pub device: String,
    /// `shareID` of a shared device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Host interface (the parent of a child interface).
    pub host_interface: String,
    /// `macvlan`, `ipvlan`, `host-device` or `sriov-vf`.
    pub mode: String,
    /// Addresses reserved for it (CIDR form).
    pub addresses: Vec<String>,
}

/// One pod with interfaces.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
    /// `attached` or `stopped`.
    pub state: String,
    /// The sandbox's network namespace.
    pub netns: String,
    /// Its interfaces, in attach order.
    pub interfaces: Vec<InterfaceStatus>,
}

/// One pod interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    /// Pod-side name.
    pub name: String,
    /// The claim's name.
    pub claim: String,
    /// Request of the allocation result.
    pub request: String,
    /// Device name.
    pub device: String,
    /// How it was made.
    pub mode: String,
    /// Host device or parent.
    pub host_interface: String,
    /// MAC address as the kernel reported it (once attached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// MTU as the kernel reported it (once attached).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Addresses (CIDR form).
    pub addresses: Vec<String>,
    /// Traffic counters as last collected, when counters are on for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<InterfaceCounters>,
}

/// Counters of one pod interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceCounters {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Received packets the kernel dropped.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Sent packets the kernel dropped.
    pub tx_dropped: u64,
}

impl From<&InterfaceStats> for InterfaceCounters {
    fn from(stats: &InterfaceStats) -> Self {
        Self {
            rx_bytes: stats.rx.bytes,
            rx_packets: stats.rx.packets,
            rx_dropped: stats.rx_dropped,
            tx_bytes: stats.tx.bytes,
            tx_packets: stats.tx.packets,
            tx_dropped: stats.tx_dropped,
        }
    }
}

/// Who is reporting, and its state besides devices, claims and pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonFacts {
    /// Node name.
    pub node: String,
    /// Driver name.
    pub driver: String,
    /// `/readyz`: `Err(why)` when not ready.
    pub readiness: Result<(), String>,
    /// The pool's generation.
    pub pool_generation: i64,
    /// The sharing changes held now, one sentence each.
    pub held_sharing_changes: Vec<String>,
    /// Whether counters are on.
    pub counters: bool,
    /// Now, RFC 3339.
    pub collected_at: String,
}

fn health_name(status: HealthStatus) -> &'static str {
    match status {
        HealthStatus::Healthy => "Healthy",
        HealthStatus::Unhealthy => "Unhealthy",
        HealthStatus::Unknown => "Unknown",
    }
}

impl NodeStatus {
    /// The document for these snapshots. A device the health report does not list yet is
    /// `Unknown`; counters are matched to interfaces by pod and interface name.
    #[must_use]
    pub fn assemble(
        facts: DaemonFacts,
        devices: &[Device],
        health: &HealthReport,
        claims: &[PreparedClaim],
        pods: &[PodAttachment],
        counters: &[(InterfaceLabels, InterfaceStats)],
    ) -> Self {
        let (ready, not_ready_reason) = match facts.readiness {
            Ok(()) => (true, None),
            Err(why) => (false, Some(why)),
        };
        Self {
            api_version: API_VERSION.to_owned(),
            kind: KIND.to_owned(),
            node: facts.node,
            driver: facts.driver,
            version: env!("CARGO_PKG_VERSION").to_owned(),
            collected_at: facts.collected_at,
            ready,
            not_ready_reason,
            pool_generation: facts.pool_generation,
            held_sharing_changes: facts.held_sharing_changes,
            counters: facts.counters,
            devices: device_rows(devices, health),
            claims: claim_rows(claims),
            pods: pod_rows(pods, counters),
        }
    }
}

/// The devices by name, each with its health (`Unknown` until the report lists it).
fn device_rows(devices: &[Device], health: &HealthReport) -> Vec<DeviceStatus> {
    let health: BTreeMap<&str, (HealthStatus, &str)> = health
        .devices
        .iter()
        .map(|d| (d.device.as_str(), (d.status, d.message.as_str())))
        .collect();
    let network_key = format!("{ATTRIBUTE_DOMAIN}/{}", attr::POD_NETWORK);
    let mut rows: Vec<DeviceStatus> = devices
        .iter()
        .map(|device| {
            let (status, message) =
                health.get(device.name.as_str()).copied().unwrap_or((HealthStatus::Unknown, ""));
            DeviceStatus {
                name: device.name.clone(),
                interface: device.if_name.clone(),
                kind: device.kind.as_str().to_owned(),
                sharing: device.sharing.as_str().to_owned(),
                capacity: device.shared_capacity,
                pod_network: device.string_attribute(&network_key).map(str::to_owned),
                health: health_name(status).to_owned(),
                health_message: message.to_owned(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    rows
}

/// The prepared claims by namespace and name.
fn claim_rows(claims: &[PreparedClaim]) -> Vec<ClaimStatus> {
    let mut rows: Vec<ClaimStatus> = claims
        .iter()
        .map(|claim| ClaimStatus {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
            pod: claim.reserved_for.first().map(|pod| pod.name.clone()),
            devices: claim
                .devices
                .iter()
                .map(|d| ClaimDeviceStatus {
                    request: d.request.clone(),
                    device: d.device.clone(),
                    share_id: d.share_id.clone(),
                    host_interface: d.if_name.clone(),
                    mode: d.config.mode.mode().as_str().to_owned(),
                    addresses: d.addresses.iter().map(ToString::to_string).collect(),
                })
                .collect(),
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// The pods by namespace and name, each interface with its counters (matched by pod and
/// interface name).
fn pod_rows(
    pods: &[PodAttachment],
    counters: &[(InterfaceLabels, InterfaceStats)],
) -> Vec<PodStatus> {
    let counters: BTreeMap<(&str, &str, &str), &InterfaceStats> = counters
        .iter()
        .map(|(l, s)| ((l.namespace.as_str(), l.pod.as_str(), l.interface.as_str()), s))
        .collect();
    let mut rows: Vec<PodStatus> = pods
        .iter()
        .map(|pod| PodStatus {
            namespace: pod.pod_namespace.clone(),
            name: pod.pod_name.clone(),
            uid: pod.pod_uid.clone(),
            state: match pod.state {
                AttachmentState::Attached => "attached",
                AttachmentState::Stopped => "stopped",
            }
            .to_owned(),
            netns: pod.netns.display().to_string(),
            interfaces: pod
                .devices
                .iter()
                .map(|d| {
                    // Before the kernel's answer is recorded: the planned name, no facts.
                    let name = d
                        .result
                        .as_ref()
                        .map_or_else(|| d.plan.interface_name.clone(), |r| r.name.clone());
                    let key = (pod.pod_namespace.as_str(), pod.pod_name.as_str(), name.as_str());
                    InterfaceStatus {
                        counters: counters.get(&key).map(|s| InterfaceCounters::from(*s)),
                        claim: d.claim_name.clone(),
                        request: d.request.clone(),
                        device: d.device.clone(),
                        mode: d.plan.mode.as_str().to_owned(),
                        host_interface: d.plan.host_device.clone(),
                        mac: d.result.as_ref().and_then(|r| r.mac).map(|m| m.to_string()),
                        mtu: d.result.as_ref().map(|r| r.mtu),
                        addresses: d
                            .result
                            .iter()
                            .flat_map(|r| r.addresses.iter().map(ToString::to_string))
                            .collect(),
                        name,
                    }
                })
                .collect(),
        })
        .collect();
    rows.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    rows
}

/// Produces the current document on each request.
pub type StatusSource = Arc<dyn Fn() -> NodeStatus + Send + Sync>;

/// The running daemon's parts the document is read from, besides the published devices
/// and their health.
pub(super) struct DaemonParts {
    claims: Arc<NodeClaims>,
    attach: Arc<NodeAttach>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    holds: watch::Receiver<BTreeSet<SharingHold>>,
}

impl DaemonParts {
    pub(super) fn new(
        claims: &Arc<NodeClaims>,
        attach: &Arc<NodeAttach>,
        metrics: &Arc<Metrics>,
        health: &Arc<Health>,
        holds: watch::Receiver<BTreeSet<SharingHold>>,
    ) -> Self {
        Self {
            claims: Arc::clone(claims),
            attach: Arc::clone(attach),
            metrics: Arc::clone(metrics),
            health: Arc::clone(health),
            holds,
        }
    }
}

/// A [`StatusSource`] over the running daemon: each call takes a snapshot of each part
/// (no API calls, no kernel calls).
fn daemon_source(
    config: &NodeConfig,
    devices: watch::Receiver<Vec<Device>>,
    device_health: watch::Receiver<HealthReport>,
    parts: DaemonParts,
) -> StatusSource {
    let (node, driver, counters_on) =
        (config.node_name.clone(), config.driver_name.clone(), config.stats.is_some());
    Arc::new(move || {
        let devices = devices.borrow().clone();
        let device_health = device_health.borrow().clone();
        let claims = parts.claims.all_prepared();
        let pod_uids: std::collections::BTreeSet<String> =
            parts.attach.attached_interfaces().into_iter().map(|i| i.pod_uid).collect();
        let pods: Vec<PodAttachment> =
            pod_uids.iter().filter_map(|uid| parts.attach.attachment(uid)).collect();
        let counters = parts.metrics.interface_traffic.snapshot();
        let facts = DaemonFacts {
            node: node.clone(),
            driver: driver.clone(),
            readiness: parts.health.readiness(),
            pool_generation: parts.metrics.pool_generation.get(),
            held_sharing_changes: parts.holds.borrow().iter().map(ToString::to_string).collect(),
            counters: counters_on,
            collected_at: k8s_openapi::jiff::Timestamp::now().to_string(),
        };
        NodeStatus::assemble(facts, &devices, &device_health, &claims, &pods, &counters)
    })
}

/// Serves the daemon's status on `<state-dir>/netclaim.sock` until `stop` turns true. A
/// socket that cannot be served is logged and the daemon runs on: the API is for operators.
pub(super) fn start(
    config: &NodeConfig,
    devices: watch::Receiver<Vec<Device>>,
    device_health: watch::Receiver<HealthReport>,
    parts: DaemonParts,
    stop: &watch::Receiver<bool>,
) {
    let socket = config.state_dir.join(SOCKET_NAME);
    let mut stop = stop.clone();
    let shutdown = async move {
        let _ignored = stop.wait_for(|stopped| *stopped).await;
    };
    let source = daemon_source(config, devices, device_health, parts);
    match serve(&socket, source, shutdown) {
        Ok(_serving) => tracing::info!(socket = %socket.display(), "serving the status API"),
        Err(err) => {
            tracing::warn!(%err, "no status API: `netclaim status` cannot reach this daemon");
        }
    }
}

/// The status API could not start.
#[derive(Debug, thiserror::Error)]
pub enum StatusApiError {
    /// Something other than a stale socket is at the socket's path.
    #[error("{path} exists and is not a socket")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Removing the stale socket, binding or setting its mode failed.
    #[error("{action} {path}: {source}")]
    Socket {
        /// What we did.
        action: &'static str,
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Serves `GET /v1/status` on `socket` (mode 0600, replacing a stale socket left by a
/// killed daemon) until `shutdown` resolves, then removes the socket. Must be called within
/// a tokio runtime.
pub fn serve(
    socket: &Path,
    source: StatusSource,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::task::JoinHandle<()>, StatusApiError> {
    let io = |action: &'static str| {
        let path = socket.to_owned();
        move |source| StatusApiError::Socket { action, path, source }
    };
    match std::fs::symlink_metadata(socket) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(socket).map_err(io("removing the stale socket"))?;
        }
        Ok(_) => return Err(StatusApiError::NotASocket { path: socket.to_owned() }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(io("inspecting")(err)),
    }
    let listener = tokio::net::UnixListener::bind(socket).map_err(io("binding"))?;
    // Only root reads it: it names pods, claims and addresses of the node.
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(io("setting the mode of"))?;
    let app = Router::new().route(STATUS_PATH, get(status_handler)).with_state(source);
    let path = socket.to_owned();
    Ok(tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(%err, socket = %path.display(), "status API stopped");
        }
        let _ignored = std::fs::remove_file(&path);
    }))
}

async fn status_handler(State(source): State<StatusSource>) -> impl IntoResponse {
    // Snapshots take locks held only briefly; the document is built off the runtime's
    // worker anyway, as 250 pods make it a few hundred KiB.
    let built = tokio::task::spawn_blocking(move || serde_json::to_vec(&source()))
        .await
        .map_err(|err| err.to_string())
        .and_then(|encoded| encoded.map_err(|err| err.to_string()));
    match built {
        Ok(body) => (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body),
        Err(why) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            why.into_bytes(),
        ),
    }
}

/// Reading the status from a daemon failed.
#[derive(Debug, thiserror::Error)]
pub enum StatusClientError {
    /// The socket could not be reached (no daemon, or not root).
    #[error(
        "connecting to {path}: {source} (is `netclaim node` running with this --state-dir, and are you root?)"
    )]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Sending or reading failed.
    #[error("talking to {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("{path}: no answer within {timeout:?}")]
    Timeout {
        /// The socket path.
        path: PathBuf,
        /// How long we waited.
        timeout: Duration,
    },
    /// Not an HTTP answer, or not 200.
    #[error("{path}: {detail}")]
    Answer {
        /// The socket path.
        path: PathBuf,
        /// What was wrong.
        detail: String,
    },
    /// The body is not a NodeStatus.
    #[error("{path}: the answer is not a {KIND}: {source}")]
    Decode {
        /// The socket path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the status from the daemon listening on `socket`.
pub async fn fetch(socket: &Path) -> Result<NodeStatus, StatusClientError> {
    tokio::time::timeout(FETCH_TIMEOUT, fetch_inner(socket)).await.map_err(|_| {
        StatusClientError::Timeout { path: socket.to_owned(), timeout: FETCH_TIMEOUT }
    })?
}

async fn fetch_inner(socket: &Path) -> Result<NodeStatus, StatusClientError> {
    let path = socket.to_owned();
    let mut stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|source| StatusClientError::Connect { path: path.clone(), source })?;
    let io = |source| StatusClientError::Io { path: path.clone(), source };
    // HTTP/1.0: the server answers with the whole body and closes, no chunked encoding.
    let request = format!(
        "GET {STATUS_PATH} HTTP/1.0\r\nHost: localhost\r\nAccept: application/json\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    let mut answer = Vec::new();
    stream.take(MAX_ANSWER_BYTES).read_to_end(&mut answer).await.map_err(io)?;
    let answer_error = |detail: String| StatusClientError::Answer { path: path.clone(), detail };
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| answer_error("the answer has no HTTP header".to_owned()))?;
    let head = String::from_utf8_lossy(&answer[..split]);
    let body = &answer[split + 4..];
    let status_line = head.lines().next().unwrap_or_default();
    let code = status_line.split_whitespace().nth(1).unwrap_or_default();
    if code != "200" {
        return Err(answer_error(format!(
            "{status_line}: {}",
            String::from_utf8_lossy(body).trim()
        )));
    }
    serde_json::from_slice(body).map_err(|source| StatusClientError::Decode { path, source })
}

#[cfg(test)]
pub(crate) mod tests;
