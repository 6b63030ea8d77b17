//! The node daemon's metric families (DESIGN §1): what the driver, the kubelet plugin, the
//! NRI handler, IPAM and the stats service count, and the publisher's rounds as reported
//! through its port ([`PublishSink`]).

use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::endpoint::{MetricsRegistry, encode};
use crate::inventory::publish::{PublishSink, SyncReport};
use crate::model::stats::{Direction, InterfaceStats, PROTOCOLS};

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
    /// `netclaim_interface_{rx,tx}_{bytes,packets,dropped}_total` and
    /// `netclaim_interface_protocol_packets_total`, from the last collection.
    pub interface_traffic: Arc<InterfaceTraffic>,
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
        let interface_traffic = Arc::new(InterfaceTraffic::default());
        registry.register_collector(Box::new(Arc::clone(&interface_traffic)));
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
            interface_traffic,
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
        encode(&self.registry)
    }
}

impl MetricsRegistry for Metrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// The publisher's rounds: `netclaim_slice_writes_total`, `netclaim_slice_syncs_total`,
/// `netclaim_devices_published`, `netclaim_pool_generation` and
/// `netclaim_consumable_capacity_dropped`.
impl PublishSink for Metrics {
    fn round_published(&self, report: &SyncReport) {
        self.slice_writes
            .get_or_create(&ResultLabel { result: "success" })
            .inc_by(report.applied as u64);
        self.slice_syncs.get_or_create(&ResultLabel { result: "success" }).inc();
        self.devices_published.set(i64::try_from(report.devices).unwrap_or(i64::MAX));
        self.pool_generation.set(report.generation);
        // Never reset: a report names the drop only the first time the server makes it.
        if report.capacity_dropped.is_some() {
            self.capacity_dropped.set(1);
        }
    }

    fn round_failed(&self) {
        self.slice_syncs.get_or_create(&ResultLabel { result: "error" }).inc();
    }
}

/// Labels `{namespace,pod,claim,interface}` of one attached pod interface.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct InterfaceLabels {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The claim's name.
    pub claim: String,
    /// The pod-side interface name.
    pub interface: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProtocolLabels {
    namespace: String,
    pod: String,
    claim: String,
    interface: String,
    direction: &'static str,
    protocol: &'static str,
}

/// Per-interface traffic counters as last collected: a collector encoded at each scrape, so
/// the series of an interface that went disappear with it (the snapshot is replaced whole).
#[derive(Debug, Default)]
pub struct InterfaceTraffic {
    samples: std::sync::RwLock<Vec<(InterfaceLabels, InterfaceStats)>>,
}

impl InterfaceTraffic {
    /// Replaces the snapshot.
    pub fn replace(&self, samples: Vec<(InterfaceLabels, InterfaceStats)>) {
        *self.samples.write().unwrap_or_else(std::sync::PoisonError::into_inner) = samples;
    }

    /// The snapshot as last replaced (`netclaim status` shows it per interface).
    #[must_use]
    pub fn snapshot(&self) -> Vec<(InterfaceLabels, InterfaceStats)> {
        self.samples.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl prometheus_client::collector::Collector for InterfaceTraffic {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        use prometheus_client::metrics::counter::ConstCounter;

        type Field = fn(&InterfaceStats) -> u64;
        let samples = self.samples.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if samples.is_empty() {
            return Ok(());
        }
        let families: [(&str, &str, Field); 6] = [
            ("interface_rx_bytes", "Bytes received by a pod interface", |s| s.rx.bytes),
            ("interface_rx_packets", "Packets received by a pod interface", |s| s.rx.packets),
            ("interface_rx_dropped", "Received packets the kernel dropped", |s| s.rx_dropped),
            ("interface_tx_bytes", "Bytes sent by a pod interface", |s| s.tx.bytes),
            ("interface_tx_packets", "Packets sent by a pod interface", |s| s.tx.packets),
            ("interface_tx_dropped", "Sent packets the kernel dropped", |s| s.tx_dropped),
        ];
        for (name, help, field) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, stats) in samples.iter() {
                ConstCounter::new(field(stats)).encode(family.encode_family(labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "interface_protocol_packets",
            "Packets of a pod interface by direction and L4 protocol",
            None,
            MetricType::Counter,
        )?;
        for (labels, stats) in samples.iter() {
            for direction in [Direction::Rx, Direction::Tx] {
                for protocol in PROTOCOLS {
                    let set = ProtocolLabels {
                        namespace: labels.namespace.clone(),
                        pod: labels.pod.clone(),
                        claim: labels.claim.clone(),
                        interface: labels.interface.clone(),
                        direction: direction.as_str(),
                        protocol,
                    };
                    ConstCounter::new(stats.direction(direction).protocol(protocol))
                        .encode(family.encode_family(&set)?)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn interface_series_follow_the_snapshot() {
        use crate::model::stats::{DirectionCounters, InterfaceStats};

        let metrics = super::Metrics::new();
        let labels = super::InterfaceLabels {
            namespace: "default".to_owned(),
            pod: "web-0".to_owned(),
            claim: "web-0-net".to_owned(),
            interface: "net1".to_owned(),
        };
        let stats = InterfaceStats {
            rx: DirectionCounters {
                bytes: 980,
                packets: 10,
                icmp: 7,
                other: 3,
                ..Default::default()
            },
            tx: DirectionCounters { bytes: 1140, packets: 12, udp: 2, ..Default::default() },
            rx_dropped: 1,
            tx_dropped: 4,
        };
        metrics.interface_traffic.replace(vec![(labels, stats)]);
        let text = metrics.encode();
        let series = r#"{namespace="default",pod="web-0",claim="web-0-net",interface="net1"}"#;
        for (name, value) in [
            ("netclaim_interface_rx_bytes_total", 980),
            ("netclaim_interface_rx_packets_total", 10),
            ("netclaim_interface_rx_dropped_total", 1),
            ("netclaim_interface_tx_bytes_total", 1140),
            ("netclaim_interface_tx_packets_total", 12),
            ("netclaim_interface_tx_dropped_total", 4),
        ] {
            assert!(text.contains(&format!("{name}{series} {value}\n")), "{name} in:\n{text}");
        }
        assert!(text.contains(
            r#"netclaim_interface_protocol_packets_total{namespace="default",pod="web-0",claim="web-0-net",interface="net1",direction="rx",protocol="icmp"} 7"#
        ));
        metrics.interface_traffic.replace(Vec::new());
        assert!(!metrics.encode().contains("netclaim_interface_"), "series of a gone interface");
    }
}
