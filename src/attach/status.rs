//! Builds this driver's `status.devices` entries of one claim (DESIGN §5.4) from the attach
//! outcome of each allocated device (pure, no I/O), and the attach service's submission of
//! them through its [`StatusSink`] port.

use ipnetwork::IpNetwork;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, NetworkDeviceData};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde::Serialize;

use std::sync::Mutex;

use super::shared::{AttachService, Inner, Sandbox};
use super::{
    AttachFailure, AttachedDevice, AttachmentStore, NetnsPort, PodAttachment, PodClaimSource,
    REASON_ATTACH_FAILED, REASON_POD_STOPPED, StatusSink, lock,
};
use crate::claims::{PreparedClaim, PreparedClaimDevice};
use crate::metrics::InterfaceLabels;
use crate::model::ClaimRef;
use crate::model::cause::chain;
use crate::model::network_config::Addressing;
use crate::model::stats::{InterfaceStats, StatsStatus};
use crate::podnet::apply::AttachedInterface;
use crate::stats::{StatsSink, WatchedInterface};

/// The API server's limit on `status.devices[].data` (protocols.md §3.3).
pub const MAX_DATA_BYTES: usize = 10 * 1024;
/// The API server's limit on `networkData.ips`.
pub const MAX_IPS: usize = 16;
/// The API server's limit on a condition message (metav1.Condition).
const MAX_MESSAGE_BYTES: usize = 32 * 1024;
/// Condition type written for every device.
pub const READY: &str = "Ready";
/// Reason of `Ready=True`.
pub const REASON_READY: &str = "NetworkReady";

/// One allocation result of this driver (the status entry's list-map key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceKey {
    /// Driver name.
    pub driver: String,
    /// Pool name.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// Share ID of a device allocated more than once (consumable capacity).
    pub share_id: Option<String>,
}

/// What happened to one device of the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceOutcome {
    /// The interface is in the pod.
    Ready(AttachedInterface),
    /// The attach did not happen or failed.
    Failed {
        /// CamelCase reason (`AttachFailed`, `InvalidConfig`, …).
        reason: String,
        /// Human-readable explanation.
        message: String,
    },
}

/// Why entries could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StatusError {
    /// A condition reason does not match the metav1.Condition rule (CamelCase, starting with a
    /// letter).
    #[error("condition reason {0:?} is not CamelCase ([A-Za-z][A-Za-z0-9_,:]*)")]
    Reason(String),
}

/// `data` of a status entry: kind `NetworkStatus` of `netclaim.dev/v1alpha1`.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct NetworkStatus<'a> {
    api_version: &'static str,
    kind: &'static str,
    mode: &'static str,
    parent: &'a str,
    mtu: u32,
    gateways: Vec<String>,
    routes: Vec<RouteStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pod_network: Option<PodNetworkData>,
    /// `data.routing`: the interface's table, source rules, VRF and sysctls as applied.
    #[serde(skip_serializing_if = "crate::podnet::plan::AppliedRouting::is_empty")]
    routing: crate::podnet::plan::AppliedRouting,
    /// `data.rdmaDevice`: the netdev's RDMA device the pod got (`rdma`).
    #[serde(skip_serializing_if = "Option::is_none")]
    rdma_device: Option<&'a str>,
}

/// `data.podNetwork` (DESIGN §4): the `PodNetwork` a device's addresses come from and, per
/// address in `networkData.ips` order, the `IPBlock` CIDR it was taken from (a node's block,
/// or the /32 or /128 reservation of a static address), so an administrator can follow an
/// address to the object that holds it cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNetworkData {
    /// The network.
    pub name: String,
    /// The blocks, one per address (none for a claim without addresses).
    pub blocks: Vec<String>,
}

/// `data.podNetwork` of a prepared device whose addresses come from a network; `None` for a
/// device without one.
#[must_use]
pub fn pod_network_data(device: &PreparedClaimDevice) -> Option<PodNetworkData> {
    let Addressing::Network(plan) = &device.config.addressing else {
        return device
            .config
            .pod_network
            .clone()
            .map(|name| PodNetworkData { name, blocks: Vec::new() });
    };
    let blocks = device
        .addresses
        .iter()
        .filter_map(|address| {
            let ip = address.ip();
            if plan.addresses.iter().any(|s| s.ip() == ip) {
                let bits = if ip.is_ipv4() { 32 } else { 128 };
                IpNetwork::new(ip, bits).ok()
            } else {
                crate::ipam::blocks::block_of(plan, ip)
            }
        })
        .map(|block| block.to_string())
        .collect();
    Some(PodNetworkData { name: plan.pod_network.clone(), blocks })
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct RouteStatus {
    destination: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    gateway: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metric: Option<u32>,
}

/// Builds the full list of this driver's entries for one claim: one per `(key, outcome)`.
///
/// `previous` is the claim's current `status.devices` (any driver): a condition whose status
/// did not change keeps its `lastTransitionTime`, as metav1.Condition requires.
///
/// # Errors
/// [`StatusError::Reason`] when a failure reason is not CamelCase.
pub fn build_entries(
    devices: &[(DeviceKey, DeviceOutcome)],
    previous: &[AllocatedDeviceStatus],
    generation: Option<i64>,
    now: &Time,
) -> Result<Vec<AllocatedDeviceStatus>, StatusError> {
    build_entries_in(devices, &[], previous, generation, now)
}

/// [`build_entries`] with `data.podNetwork` of the devices in `networks` (by key).
///
/// # Errors
/// [`StatusError::Reason`] when a failure reason is not CamelCase.
pub fn build_entries_in(
    devices: &[(DeviceKey, DeviceOutcome)],
    networks: &[(DeviceKey, PodNetworkData)],
    previous: &[AllocatedDeviceStatus],
    generation: Option<i64>,
    now: &Time,
) -> Result<Vec<AllocatedDeviceStatus>, StatusError> {
    devices
        .iter()
        .map(|(key, outcome)| {
            let old = previous.iter().find(|entry| {
                entry.driver == key.driver
                    && entry.pool == key.pool
                    && entry.device == key.device
                    && entry.share_id == key.share_id
            });
            let network = networks.iter().find(|(k, _)| k == key).map(|(_, n)| n);
            build_entry(key, outcome, network, old, generation, now)
        })
        .collect()
}

fn build_entry(
    key: &DeviceKey,
    outcome: &DeviceOutcome,
    network: Option<&PodNetworkData>,
    old: Option<&AllocatedDeviceStatus>,
    generation: Option<i64>,
    now: &Time,
) -> Result<AllocatedDeviceStatus, StatusError> {
    let (status, reason, message) = match outcome {
        DeviceOutcome::Ready(iface) => {
            ("True", REASON_READY.to_owned(), format!("{} is up in the pod", iface.name))
        }
        DeviceOutcome::Failed { reason, message } => {
            if !is_camel_case_reason(reason) {
                return Err(StatusError::Reason(reason.clone()));
            }
            ("False", reason.clone(), truncate(message, MAX_MESSAGE_BYTES))
        }
    };
    let old_ready = old
        .and_then(|entry| entry.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == READY));
    let last_transition_time = match old_ready {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => now.clone(),
    };
    let condition = Condition {
        type_: READY.to_owned(),
        status: status.to_owned(),
        reason,
        message,
        last_transition_time,
        observed_generation: generation,
    };
    let (network_data, data) = match outcome {
        DeviceOutcome::Ready(iface) => {
            let mut data = network_status(iface, network);
            // The counters stay until the stats service reports newer ones: a rebuilt entry
            // of the same interface must not make them vanish between two collections.
            if let (Some(old_data), serde_json::Value::Object(fields)) =
                (old.and_then(|entry| entry.data.as_ref()), &mut data.0)
                && old.and_then(interface_name) == Some(iface.name.as_str())
                && let Some(stats) = old_data.0.get(STATS_FIELD)
            {
                fields.insert(STATS_FIELD.to_owned(), stats.clone());
            }
            (Some(network_data(iface)), Some(data))
        }
        DeviceOutcome::Failed { .. } => (None, None),
    };
    Ok(AllocatedDeviceStatus {
        driver: key.driver.clone(),
        pool: key.pool.clone(),
        device: key.device.clone(),
        share_id: key.share_id.clone(),
        conditions: Some(vec![condition]),
        network_data,
        data,
    })
}

/// The key of the counters in `data` (DESIGN §5 item 4).
const STATS_FIELD: &str = "stats";

fn interface_name(entry: &AllocatedDeviceStatus) -> Option<&str> {
    entry.network_data.as_ref().and_then(|d| d.interface_name.as_deref())
}

/// The counters of one interface of a device, as the status shows them: the device, the
/// pod-side interface name, `data.stats`.
pub type InterfaceCounters = (DeviceKey, String, StatsStatus);

/// Sets `data.stats` of the Ready entries of `entries` named by `stats` (pool, device,
/// shareID, interface); returns whether any entry changed. `data` stays within
/// [`MAX_DATA_BYTES`]: the counters are a fixed-size object, and an entry whose routes
/// already filled the limit gets none.
pub fn set_stats(entries: &mut [AllocatedDeviceStatus], stats: &[InterfaceCounters]) -> bool {
    let mut changed = false;
    for (key, interface, counters) in stats {
        let Some(entry) = entries.iter_mut().find(|entry| {
            entry.driver == key.driver
                && entry.pool == key.pool
                && entry.device == key.device
                && entry.share_id == key.share_id
                && interface_name(entry) == Some(interface.as_str())
        }) else {
            continue;
        };
        let Some(RawExtension(serde_json::Value::Object(fields))) = entry.data.as_mut() else {
            continue;
        };
        let value = serde_json::to_value(counters).unwrap_or(serde_json::Value::Null);
        // Only the counts make a change: a new `collectedAt` alone is no reason to write.
        let counts = |stats: Option<&serde_json::Value>| {
            stats.and_then(serde_json::Value::as_object).map(|object| {
                let mut object = object.clone();
                object.remove("collectedAt");
                object
            })
        };
        if counts(fields.get(STATS_FIELD)) == counts(Some(&value)) {
            continue;
        }
        let mut with = fields.clone();
        with.insert(STATS_FIELD.to_owned(), value);
        if serde_json::Value::Object(with.clone()).to_string().len() <= MAX_DATA_BYTES {
            *fields = with;
            changed = true;
        }
    }
    changed
}

/// `networkData`: ips in the canonical CIDR form the API server demands (host bits kept;
/// Rust's `Ipv6Addr` display is RFC 5952, the same as Go's `netip`).
fn network_data(iface: &AttachedInterface) -> NetworkDeviceData {
    let mut ips: Vec<String> = Vec::new();
    for addr in &iface.addresses {
        let ip = format!("{}/{}", addr.ip(), addr.prefix());
        if !ips.contains(&ip) && ips.len() < MAX_IPS {
            ips.push(ip);
        }
    }
    NetworkDeviceData {
        interface_name: Some(iface.name.clone()),
        ips: Some(ips),
        hardware_address: iface.mac.map(|mac| mac.to_string()),
    }
}

/// `data`: the NetworkStatus object, routes dropped if it would pass the 10 KiB limit.
fn network_status(iface: &AttachedInterface, pod_network: Option<&PodNetworkData>) -> RawExtension {
    let mut gateways: Vec<String> = Vec::new();
    for gw in iface.routes.iter().filter_map(|r| r.gateway) {
        let gw = gw.to_string();
        if !gateways.contains(&gw) {
            gateways.push(gw);
        }
    }
    let mut status = NetworkStatus {
        api_version: "netclaim.dev/v1alpha1",
        kind: "NetworkStatus",
        mode: iface.mode.as_str(),
        parent: &iface.host_device,
        mtu: iface.mtu,
        gateways,
        routes: iface
            .routes
            .iter()
            .map(|r| RouteStatus {
                destination: r.destination.to_string(),
                gateway: r.gateway.map(|g| g.to_string()),
                metric: r.metric,
            })
            .collect(),
        pod_network: pod_network.cloned(),
        routing: iface.routing.clone(),
        rdma_device: iface.rdma_device.as_deref(),
    };
    let mut value = serde_json::to_value(&status).unwrap_or(serde_json::Value::Null);
    if value.to_string().len() > MAX_DATA_BYTES {
        status.routes.clear();
        status.gateways.truncate(MAX_IPS);
        value = serde_json::to_value(&status).unwrap_or(serde_json::Value::Null);
    }
    RawExtension(value)
}

/// metav1.Condition reason rule: `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, ≤ 1024 bytes.
fn is_camel_case_reason(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    reason.len() <= 1024
        && first.is_ascii_alphabetic()
        && (last.is_ascii_alphanumeric() || *last == b'_')
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':'))
}

fn truncate(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_owned();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_owned()
}

/// The claim identity a status write needs.
#[derive(Debug, Clone)]
struct AttachedClaim {
    uid: String,
    namespace: String,
    name: String,
    generation: Option<i64>,
}

impl AttachedClaim {
    fn from_prepared(claim: &PreparedClaim) -> Self {
        Self {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            generation: claim.generation,
        }
    }

    fn from_device(device: &AttachedDevice) -> Self {
        Self {
            uid: device.claim_uid.clone(),
            namespace: device.claim_namespace.clone(),
            name: device.claim_name.clone(),
            generation: None,
        }
    }
}

/// Builds `claim`'s status entries from `outcomes` (on top of the last ones submitted,
/// kept in `inner`) and hands them to `sink`.
fn submit_entries<W: StatusSink>(
    inner: &Mutex<Inner>,
    sink: &W,
    claim: &AttachedClaim,
    outcomes: &[(DeviceKey, DeviceOutcome)],
    networks: &[(DeviceKey, PodNetworkData)],
    bandwidths: &[(DeviceKey, super::bandwidth::BandwidthData)],
    ethtools: &[(DeviceKey, crate::model::network_config::EthtoolSettings)],
) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let previous = lock(inner).statuses.get(&claim.uid).cloned().unwrap_or_default();
    match build_entries_in(outcomes, networks, &previous, claim.generation, &now) {
        Ok(mut entries) => {
            super::bandwidth::annotate(&mut entries, bandwidths);
            super::ethtool_status::annotate(&mut entries, ethtools);
            lock(inner).statuses.insert(claim.uid.clone(), entries.clone());
            sink.submit(
                ClaimRef {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    uid: claim.uid.clone(),
                },
                entries,
            );
        }
        Err(err) => tracing::warn!(claim = %claim.name, %err, "building the claim status"),
    }
}

fn device_key(driver: &str, pool: &str, device: &str, share_id: Option<&String>) -> DeviceKey {
    DeviceKey {
        driver: driver.to_owned(),
        pool: pool.to_owned(),
        device: device.to_owned(),
        share_id: share_id.cloned(),
    }
}

/// Submits `Ready` (or the failure of a device left unattached) for `claim`'s devices in
/// `record`. A free function: the attach's completion runs it after the NRI answer.
pub(super) fn submit_ready<W: StatusSink>(
    driver: &str,
    inner: &Mutex<Inner>,
    sink: &W,
    claim: &PreparedClaim,
    record: &PodAttachment,
) {
    let outcomes: Vec<_> = record
        .devices
        .iter()
        .filter(|d| d.claim_uid == claim.uid)
        .map(|d| {
            let outcome = match &d.result {
                Some(result) => DeviceOutcome::Ready(result.clone()),
                None => DeviceOutcome::Failed {
                    reason: REASON_ATTACH_FAILED.to_owned(),
                    message: format!("{} is not attached", d.plan.interface_name),
                },
            };
            (device_key(driver, &d.pool, &d.device, d.share_id.as_ref()), outcome)
        })
        .collect();
    let networks: Vec<_> = claim
        .devices
        .iter()
        .filter_map(|d| {
            let data = pod_network_data(d)?;
            Some((device_key(driver, &d.pool, &d.device, d.share_id.as_ref()), data))
        })
        .collect();
    let support = lock(inner).ceilings.support;
    let bandwidths: Vec<_> = claim
        .devices
        .iter()
        .filter_map(|d| {
            let data = super::bandwidth::bandwidth_data(&d.config, support)?;
            Some((device_key(driver, &d.pool, &d.device, d.share_id.as_ref()), data))
        })
        .collect();
    // `data.ethtool`: what the prepare applied to the device.
    let ethtools: Vec<_> = claim
        .devices
        .iter()
        .filter_map(|d| {
            let applied = d.ethtool.as_ref().filter(|e| e.before.is_some())?;
            let key = device_key(driver, &d.pool, &d.device, d.share_id.as_ref());
            Some((key, applied.settings.clone()))
        })
        .collect();
    let claim = AttachedClaim::from_prepared(claim);
    submit_entries(inner, sink, &claim, &outcomes, &networks, &bandwidths, &ethtools);
}

impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> AttachService<C, N, S, W> {
    fn submit(&self, claim: &AttachedClaim, outcomes: &[(DeviceKey, DeviceOutcome)]) {
        submit_entries(&self.inner, &*self.status, claim, outcomes, &[], &[], &[]);
    }

    fn key(&self, pool: &str, device: &str, share_id: Option<&String>) -> DeviceKey {
        device_key(&self.driver, pool, device, share_id)
    }

    pub(super) fn submit_ready(&self, claim: &PreparedClaim, record: &PodAttachment) {
        submit_ready(&self.driver, &self.inner, &*self.status, claim, record);
    }

    pub(super) fn submit_failed(&self, claims: &[PreparedClaim], message: &str) {
        for claim in claims {
            let outcomes: Vec<_> = claim
                .devices
                .iter()
                .map(|d| {
                    (
                        self.key(&d.pool, &d.device, d.share_id.as_ref()),
                        DeviceOutcome::Failed {
                            reason: REASON_ATTACH_FAILED.to_owned(),
                            message: message.to_owned(),
                        },
                    )
                })
                .collect();
            self.submit(&AttachedClaim::from_prepared(claim), &outcomes);
        }
    }

    /// After a stop the interfaces are gone: `Ready=False` (reason [`REASON_POD_STOPPED`])
    /// without `networkData`, so nobody reads addresses of an interface that no longer
    /// exists. The claim stays prepared and keeps its addresses until unprepare.
    pub(super) fn submit_stopped(&self, record: &PodAttachment) {
        let mut by_claim: Vec<(AttachedClaim, Vec<(DeviceKey, DeviceOutcome)>)> = Vec::new();
        for d in &record.devices {
            let outcome = DeviceOutcome::Failed {
                reason: REASON_POD_STOPPED.to_owned(),
                message: format!(
                    "the sandbox of pod {}/{} stopped; {} was removed",
                    record.pod_namespace, record.pod_name, d.plan.interface_name
                ),
            };
            let key = self.key(&d.pool, &d.device, d.share_id.as_ref());
            match by_claim.iter_mut().find(|(c, _)| c.uid == d.claim_uid) {
                Some((_, outcomes)) => outcomes.push((key, outcome)),
                None => by_claim.push((AttachedClaim::from_device(d), vec![(key, outcome)])),
            }
        }
        for (claim, outcomes) in by_claim {
            // observedGeneration: the generation seen at prepare, when the claim is still
            // prepared.
            let generation = self.claims.claim(&claim.uid).and_then(|c| c.generation);
            self.submit(&AttachedClaim { generation, ..claim }, &outcomes);
        }
    }

    /// Adds the counters of `samples` to the last status of their claims and submits each
    /// claim that changed once (one write per claim, whatever its number of interfaces).
    pub fn submit_stats(&self, samples: Vec<(WatchedInterface, InterfaceStats)>) {
        let collected_at = k8s_openapi::jiff::Timestamp::now().to_string();
        let mut by_claim: Vec<(WatchedInterface, Vec<InterfaceCounters>)> = Vec::new();
        for (watched, stats) in samples {
            let item = (
                self.key(&watched.pool, &watched.device, watched.share_id.as_ref()),
                watched.interface.clone(),
                stats.to_status(collected_at.clone()),
            );
            match by_claim.iter_mut().find(|(w, _)| w.claim_uid == watched.claim_uid) {
                Some((_, items)) => items.push(item),
                None => by_claim.push((watched, vec![item])),
            }
        }
        for (watched, items) in by_claim {
            let entries = {
                let mut inner = lock(&self.inner);
                let Some(entries) = inner.statuses.get_mut(&watched.claim_uid) else {
                    continue;
                };
                if !set_stats(entries, &items) {
                    continue;
                }
                entries.clone()
            };
            self.status.submit(
                ClaimRef {
                    namespace: watched.pod_namespace.clone(),
                    name: watched.claim_name.clone(),
                    uid: watched.claim_uid.clone(),
                },
                entries,
            );
        }
    }

    /// Logs a failed attach, marks the pod's claims `Ready=False` (reason
    /// [`REASON_ATTACH_FAILED`]) and records a Warning Event on the Pod; returns the message.
    pub(super) fn report_failure(
        &self,
        sandbox: &Sandbox,
        claims: &[PreparedClaim],
        err: &AttachFailure,
    ) -> String {
        let message = format!(
            "attaching the network interfaces of pod {}/{}: {}",
            sandbox.namespace,
            sandbox.name,
            chain(err)
        );
        tracing::warn!(pod = %sandbox.uid, "{message}");
        self.submit_failed(claims, &chain(err));
        self.status.warn_pod(sandbox.pod_ref(), REASON_ATTACH_FAILED, message.clone());
        message
    }
}

/// Collected counters go to Prometheus (every collection) and, when changed, to the claim
/// statuses.
impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> StatsSink
    for std::sync::Arc<AttachService<C, N, S, W>>
{
    fn collected(&self, samples: &[(WatchedInterface, InterfaceStats)]) {
        self.metrics.interface_traffic.replace(
            samples
                .iter()
                .map(|(watched, stats)| {
                    let labels = InterfaceLabels {
                        namespace: watched.pod_namespace.clone(),
                        pod: watched.pod_name.clone(),
                        claim: watched.claim_name.clone(),
                        interface: watched.interface.clone(),
                    };
                    (labels, *stats)
                })
                .collect(),
        );
    }

    fn changed(&self, samples: Vec<(WatchedInterface, InterfaceStats)>) {
        self.submit_stats(samples);
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use ipnetwork::IpNetwork;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::model::network_config::{MacAddr, Mode, Route};

    fn key(device: &str, share_id: Option<&str>) -> DeviceKey {
        DeviceKey {
            driver: "netclaim.dev".to_owned(),
            pool: "node-a".to_owned(),
            device: device.to_owned(),
            share_id: share_id.map(str::to_owned),
        }
    }

    fn iface(addresses: &[&str], routes: Vec<Route>) -> AttachedInterface {
        AttachedInterface {
            name: "net1".to_owned(),
            mode: Mode::Macvlan,
            host_device: "eth1".to_owned(),
            mac: Some(MacAddr([0x02, 0, 0, 0, 0xab, 0x01])),
            mtu: 1500,
            addresses: addresses.iter().map(|a| a.parse().expect("test address")).collect(),
            routes,
            routing: crate::podnet::plan::AppliedRouting::default(),
            rdma_device: None,
        }
    }

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).expect("valid test timestamp"))
    }

    #[test]
    fn ips_are_canonical_cidr_with_host_bits() {
        let ready = DeviceOutcome::Ready(iface(
            &["2001:0db8:0000::0005/64", "10.10.1.5/24", "::ffff:192.0.2.1/128", "fe80::1/64"],
            vec![],
        ));
        let entries = build_entries(&[(key("eth1", None), ready)], &[], Some(1), &at(10))
            .expect("valid outcome");
        let data = entries[0].network_data.as_ref().expect("ready has networkData");
        assert_eq!(
            data.ips.as_deref().expect("ips set"),
            ["2001:db8::5/64", "10.10.1.5/24", "::ffff:192.0.2.1/128", "fe80::1/64"]
        );
        assert_eq!(data.hardware_address.as_deref(), Some("02:00:00:00:ab:01"));
        assert_eq!(data.interface_name.as_deref(), Some("net1"));
    }

    /// `data.rdmaDevice` names the RDMA device the pod got; an interface without one has no
    /// such key.
    #[test]
    fn data_names_the_rdma_device() {
        let mut with = iface(&["10.10.1.5/24"], vec![]);
        with.rdma_device = Some("mlx5_0".to_owned());
        let without = DeviceOutcome::Ready(iface(&[], vec![]));
        let outcomes =
            [(key("eth1", None), DeviceOutcome::Ready(with)), (key("eth2", None), without)];
        let entries = build_entries(&outcomes, &[], Some(1), &at(10)).expect("valid outcome");
        let data = |i: usize| entries[i].data.as_ref().expect("ready has data").0.clone();
        assert_eq!(data(0)["rdmaDevice"], "mlx5_0");
        assert!(data(1).get("rdmaDevice").is_none(), "{}", data(1));
    }

    #[test]
    fn transition_time_kept_while_status_unchanged() {
        let k = key("eth1", Some("4b4c6a3e-0c9a-4b1e-9d1c-2f1f6c1a7e11"));
        let ready = DeviceOutcome::Ready(iface(&["10.10.1.5/24"], vec![]));
        let first =
            build_entries(&[(k.clone(), ready.clone())], &[], Some(1), &at(10)).expect("valid");
        let again = build_entries(&[(k.clone(), ready)], &first, Some(2), &at(20)).expect("valid");
        let cond = &again[0].conditions.as_ref().expect("conditions")[0];
        assert_eq!(cond.last_transition_time, at(10));
        assert_eq!(cond.observed_generation, Some(2));
        let failed = DeviceOutcome::Failed {
            reason: "AttachFailed".to_owned(),
            message: "parent eth1 is gone".to_owned(),
        };
        let after = build_entries(&[(k, failed)], &again, Some(2), &at(30)).expect("valid");
        let cond = &after[0].conditions.as_ref().expect("conditions")[0];
        assert_eq!((cond.status.as_str(), cond.reason.as_str()), ("False", "AttachFailed"));
        assert_eq!(cond.last_transition_time, at(30));
        assert!(after[0].network_data.is_none() && after[0].data.is_none());
    }

    #[test]
    fn stats_join_the_ready_entry_of_their_interface_and_survive_a_rebuild() {
        use crate::model::stats::{DirectionCounters, InterfaceStats};

        let k = key("eth1", Some("4b4c6a3e-0c9a-4b1e-9d1c-2f1f6c1a7e11"));
        let other = key("eth2", None);
        let ready = DeviceOutcome::Ready(iface(&["10.10.1.5/24"], vec![]));
        let failed =
            DeviceOutcome::Failed { reason: "AttachFailed".to_owned(), message: "x".to_owned() };
        let mut entries = build_entries(
            &[(k.clone(), ready.clone()), (other.clone(), failed)],
            &[],
            Some(1),
            &at(10),
        )
        .expect("valid");
        let stats = InterfaceStats {
            rx: DirectionCounters { bytes: 980, packets: 10, icmp: 10, ..Default::default() },
            tx: DirectionCounters { bytes: 980, packets: 10, icmp: 10, ..Default::default() },
            rx_dropped: 0,
            tx_dropped: 2,
            ..Default::default()
        };
        let reported = stats.to_status("2026-11-25T10:00:00Z".to_owned());
        let items = [
            (k.clone(), "net1".to_owned(), reported.clone()),
            // Not Ready, and another interface of the right device: neither gets counters.
            (other.clone(), "net1".to_owned(), reported.clone()),
            (k.clone(), "net9".to_owned(), reported),
        ];
        assert!(set_stats(&mut entries, &items));
        let data = &entries[0].data.as_ref().expect("data").0;
        assert_eq!(data["stats"]["txDropped"], 2);
        assert_eq!(data["stats"]["protocols"]["icmp"]["rxPackets"], 10);
        assert_eq!(data["mode"], "macvlan", "the rest of data stays");
        assert!(entries[1].data.is_none());
        assert!(!set_stats(&mut entries, &items[..1]), "unchanged counters are no change");
        let rebuilt = build_entries(&[(k, ready)], &entries, Some(2), &at(20)).expect("valid");
        assert_eq!(rebuilt[0].data.as_ref().expect("data").0["stats"]["txDropped"], 2);
    }

    /// The finding: the status did not name the network; now `data.podNetwork` has it and
    /// the block (or static reservation) of each address.
    #[test]
    fn data_names_the_pod_network_and_the_block_of_each_address() {
        use crate::model::network_config::{
            ConfigEntry, ConfigSource, NetworkAddressing, NodeSupport, resolve,
        };
        use crate::testing::facts::{FactsBuilder as _, physical_nic};
        let parameters = serde_json::json!({"apiVersion": "netclaim.dev/v1alpha1",
            "kind": "NetworkConfig", "mode": "macvlan"});
        let entries = [ConfigEntry { source: ConfigSource::Claim, requests: vec![], parameters }];
        let mut config =
            resolve(&entries, "net", &physical_nic("eth1").shared(), &NodeSupport::everything())
                .expect("a plain macvlan config resolves");
        let net = |s: &str| -> IpNetwork { s.parse().expect("test network") };
        let mut plan = NetworkAddressing {
            pod_network: "medianet".into(),
            subnets: vec![net("10.10.0.0/16"), net("fd00:10::/64")],
            gateways: vec![],
            exclude: vec![],
            static_ranges: vec![net("10.10.1.0/24")],
            block_v4: 26,
            block_v6: 120,
            addresses: vec![],
        };
        config.pod_network = Some("medianet".into());
        config.addressing = Addressing::Network(plan.clone());
        let mut device = PreparedClaimDevice {
            request: "net".into(),
            pool: "node-a".into(),
            device: "medianet-eth1".into(),
            share_id: None,
            if_name: "eth1".into(),
            config: config.clone(),
            addresses: vec![net("10.10.3.77/16"), net("fd00:10::1:2ff/64")],
            sharing: None,
            kind: None,
            host_mtu: None,
            attributes: std::collections::BTreeMap::new(),
            cdi_device_ids: vec![],
            vf: None,
            vfio: None,
            ethtool: None,
        };
        let data = pod_network_data(&device).expect("a network device");
        assert_eq!(data.name, "medianet");
        assert_eq!(data.blocks, ["10.10.3.64/26", "fd00:10::1:200/120"]);
        let k = key("medianet-eth1", None);
        let ready = DeviceOutcome::Ready(iface(&["10.10.3.77/16"], vec![]));
        let entries = build_entries_in(
            &[(k.clone(), ready.clone())],
            &[(k.clone(), data)],
            &[],
            Some(1),
            &at(1),
        )
        .expect("valid");
        assert_eq!(
            entries[0].data.as_ref().expect("data").0["podNetwork"],
            serde_json::json!({"name": "medianet", "blocks": ["10.10.3.64/26", "fd00:10::1:200/120"]})
        );
        // A static address: its /32 reservation.
        plan.addresses = vec![net("10.10.1.5/16")];
        config.addressing = Addressing::Network(plan);
        device.config = config;
        device.addresses = vec![net("10.10.1.5/16")];
        assert_eq!(pod_network_data(&device).expect("a network device").blocks, ["10.10.1.5/32"]);
        // A device of no network has none.
        let without = build_entries(&[(k, ready)], &[], Some(1), &at(1)).expect("valid");
        assert!(without[0].data.as_ref().expect("data").0.get("podNetwork").is_none());
    }

    #[test]
    fn bad_reason_is_rejected() {
        for reason in ["", "attach failed", "1Bad", "Trailing,"] {
            let failed =
                DeviceOutcome::Failed { reason: reason.to_owned(), message: String::new() };
            assert_eq!(
                build_entries(&[(key("eth1", None), failed)], &[], None, &at(1)),
                Err(StatusError::Reason(reason.to_owned()))
            );
        }
    }

    #[test]
    fn data_is_network_status_and_stays_within_limits() {
        let gw: IpAddr = "10.10.1.1".parse().expect("test address");
        let routes: Vec<Route> = (0..400u16)
            .map(|i| Route {
                destination: IpNetwork::new(
                    IpAddr::from([10, 20, i.to_be_bytes()[0], i.to_be_bytes()[1]]),
                    32,
                )
                .expect("valid prefix"),
                gateway: Some(gw),
                metric: Some(100),
            })
            .collect();
        let many: Vec<String> = (1..=20).map(|i| format!("10.10.1.{i}/24")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let small = DeviceOutcome::Ready(iface(&["10.10.1.5/24"], routes[..1].to_vec()));
        let big = DeviceOutcome::Ready(iface(&many, routes));
        let entries = build_entries(
            &[(key("eth1", None), small), (key("eth2", None), big)],
            &[],
            None,
            &at(1),
        )
        .expect("valid");
        let data = &entries[0].data.as_ref().expect("data").0;
        assert_eq!(data["apiVersion"], "netclaim.dev/v1alpha1");
        assert_eq!(data["kind"], "NetworkStatus");
        assert_eq!(data["mode"], "macvlan");
        assert_eq!(data["parent"], "eth1");
        assert_eq!(data["mtu"], 1500);
        assert_eq!(data["gateways"], serde_json::json!(["10.10.1.1"]));
        assert_eq!(
            data["routes"],
            serde_json::json!([{"destination": "10.20.0.0/32", "gateway": "10.10.1.1", "metric": 100}])
        );
        let big_data = entries[1].data.as_ref().expect("data").0.to_string();
        assert!(big_data.len() <= MAX_DATA_BYTES, "{} bytes", big_data.len());
        let ips = entries[1].network_data.as_ref().and_then(|d| d.ips.as_ref()).expect("ips");
        assert_eq!(ips.len(), MAX_IPS);
    }
}
