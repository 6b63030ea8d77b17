//! The node daemon's metric families (DESIGN §1): what the driver, the kubelet plugin, the
//! NRI handler, IPAM and the stats service count, and the publisher's rounds as reported
//! through its port ([`PublishSink`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use super::endpoint::{MetricsRegistry, encode};
use super::standard::{self, declare};
use super::store_syncs::StoreSyncs;
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

/// Label set `{pod_network}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodNetworkLabel {
    /// The `PodNetwork`.
    pub pod_network: String,
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
    /// `netclaim_store_syncs_total`: the state dir's `fdatasync`/`fsync` calls.
    pub store_syncs: Arc<StoreSyncs>,
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
    /// `netclaim_ipblocks_lost_total{pod_network}`: this node's IPBlocks deleted or changed
    /// under it (decision 0017).
    pub ipblocks_lost: Family<PodNetworkLabel, Counter>,
    /// `netclaim_interface_{rx,tx}_{bytes,packets,dropped}_total` and
    /// `netclaim_interface_protocol_packets_total`, from the last collection.
    pub interface_traffic: Arc<InterfaceTraffic>,
}

/// `netclaim_{prepare,unprepare}_duration_seconds`, registered.
fn call_durations(registry: &mut Registry) -> (Histogram, Histogram) {
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
    (prepare_duration, unprepare_duration)
}

/// `netclaim_{attach,detach}_duration_seconds{mode}`, registered.
fn link_durations(
    registry: &mut Registry,
) -> (DurationFamily<ModeLabel>, DurationFamily<ModeLabel>) {
    let attach_duration: DurationFamily<ModeLabel> = declare(
        registry,
        "attach_duration_seconds",
        "Sandbox event received to pod interface configured, per interface",
        Family::new_with_constructor(link_duration_histogram),
    );
    let detach_duration: DurationFamily<ModeLabel> = declare(
        registry,
        "detach_duration_seconds",
        "Detach of one pod interface",
        Family::new_with_constructor(link_duration_histogram),
    );
    (attach_duration, detach_duration)
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every family, the pod interface series with their pod's labels.
    #[must_use]
    pub fn new() -> Self {
        Self::with_pod_labels(true)
    }

    /// [`Metrics::new`]; `pod_labels` false sums the pod interface series per interface name
    /// (`--metrics-pod-labels=false`).
    #[must_use]
    pub fn with_pod_labels(pod_labels: bool) -> Self {
        let mut root = Registry::default();
        standard::register(&mut root);
        let registry = root.sub_registry_with_prefix("netclaim");
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
        let slice_writes = declare(
            registry,
            "slice_writes",
            "ResourceSlice server-side apply calls",
            Family::<ResultLabel, Counter>::default(),
        );
        let status_writes = declare(
            registry,
            "status_writes",
            "ResourceClaim status server-side apply calls",
            Family::<ResultLabel, Counter>::default(),
        );
        let slice_syncs = declare(
            registry,
            "slice_syncs",
            "ResourceSlice publication rounds",
            Family::<ResultLabel, Counter>::default(),
        );
        let capacity_dropped = Gauge::default();
        registry.register(
            "consumable_capacity_dropped",
            "1 when the API server dropped allowMultipleAllocations/capacity (feature off)",
            capacity_dropped.clone(),
        );
        let (prepare_duration, unprepare_duration) = call_durations(registry);
        let kubelet_requests = declare(
            registry,
            "kubelet_requests",
            "Kubelet DRA calls by method and outcome",
            Family::<KubeletRequestLabels, Counter>::default(),
        );
        let (attach_duration, detach_duration) = link_durations(registry);
        let nri_events = declare(
            registry,
            "nri_events",
            "NRI events handled, by outcome",
            Family::<NriEventLabels, Counter>::default(),
        );
        let ipblocks_lost = declare(
            registry,
            "ipblocks_lost",
            "IPBlocks of this node deleted or changed under it (their addresses may be in use twice)",
            Family::<PodNetworkLabel, Counter>::default(),
        );
        let ipam_addresses = declare(
            registry,
            "ipam_addresses",
            "Addresses of node-local pools by state",
            Family::<IpamLabels, Gauge>::default(),
        );
        let interface_traffic = Arc::new(InterfaceTraffic::new(pod_labels));
        registry.register_collector(Box::new(Arc::clone(&interface_traffic)));
        let store_syncs = Arc::new(StoreSyncs::default());
        registry.register_collector(Box::new(Arc::clone(&store_syncs)));
        let metrics = Self {
            registry: root,
            devices_published,
            pool_generation,
            slice_writes,
            status_writes,
            slice_syncs,
            store_syncs,
            capacity_dropped,
            prepare_duration,
            unprepare_duration,
            kubelet_requests,
            attach_duration,
            detach_duration,
            nri_events,
            ipam_addresses,
            ipblocks_lost,
            interface_traffic,
        };
        metrics.start_known_series();
        metrics
    }

    /// Creates, at 0, the series of every label value the daemon counts (the values its
    /// callers pass), so each starts at 0 rather than at its first event: `increase()` and
    /// `rate()` see the first error (a series born at 1 shows no increase), and a dashboard
    /// shows 0 rather than no data. Families whose labels name objects (pools, PodNetworks,
    /// interfaces) have no series until there is one: only their declaration shows.
    fn start_known_series(&self) {
        for result in ["success", "error"] {
            drop(self.slice_syncs.get_or_create(&ResultLabel { result }));
        }
        // The publisher counts applied writes only; a failed round is a failed sync.
        drop(self.slice_writes.get_or_create(&ResultLabel { result: "success" }));
        // k8s::claim_status' outcomes.
        for result in ["success", "error", "gone", "rejected"] {
            drop(self.status_writes.get_or_create(&ResultLabel { result }));
        }
        // kubelet::metered's methods and codes.
        for method in ["NodePrepareResources", "NodeUnprepareResources"] {
            for code in ["OK", "ClaimError"] {
                drop(self.kubelet_requests.get_or_create(&KubeletRequestLabels { method, code }));
            }
        }
        // attach::handler's events.
        for event in [
            "RunPodSandbox",
            "StopPodSandbox",
            "RemovePodSandbox",
            "CreateContainer",
            "Synchronize",
        ] {
            for result in ["success", "error"] {
                drop(self.nri_events.get_or_create(&NriEventLabels { event, result }));
            }
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

/// Per-interface traffic counters as last collected: a collector encoded at each scrape, so
/// the series of an interface that went disappear with it (the snapshot is replaced whole).
///
/// Without pod labels (`--metrics-pod-labels=false`) the series are summed per interface
/// name. A sum must not go down when a pod leaves (Prometheus would read a counter reset and
/// count the remaining total again), so the last counters of every interface that left, or
/// whose counters restarted, are kept per name and added in.
#[derive(Debug)]
pub struct InterfaceTraffic {
    samples: std::sync::RwLock<Vec<(InterfaceLabels, InterfaceStats)>>,
    pod_labels: bool,
    /// Per interface name: the counters of interfaces gone (kept only without pod labels).
    /// One entry per name ever used on the node.
    departed: std::sync::Mutex<BTreeMap<String, InterfaceStats>>,
}

impl Default for InterfaceTraffic {
    fn default() -> Self {
        Self::new(true)
    }
}

/// Every counter of `stats`, in one order.
fn counters(stats: &InterfaceStats) -> [u64; 22] {
    let (rx, tx) = (&stats.rx, &stats.tx);
    [
        rx.bytes,
        rx.packets,
        rx.tcp,
        rx.udp,
        rx.icmp,
        rx.other,
        tx.bytes,
        tx.packets,
        tx.tcp,
        tx.udp,
        tx.icmp,
        tx.other,
        stats.rx_dropped,
        stats.tx_dropped,
        stats.ceiling.tx_delayed,
        stats.ceiling.tx_dropped,
        stats.ceiling.rx_dropped,
        stats.ceiling.qdisc.dropped,
        stats.ceiling.qdisc.overlimits,
        stats.ceiling.qdisc.throttled,
        stats.ceiling.qdisc.horizon_drops,
        stats.ceiling.qdisc.flows_plimit,
    ]
}

/// `into += stats`, counter by counter.
fn add(into: &mut InterfaceStats, stats: &InterfaceStats) {
    for (total, part) in [(&mut into.rx, &stats.rx), (&mut into.tx, &stats.tx)] {
        total.bytes = total.bytes.saturating_add(part.bytes);
        total.packets = total.packets.saturating_add(part.packets);
        total.tcp = total.tcp.saturating_add(part.tcp);
        total.udp = total.udp.saturating_add(part.udp);
        total.icmp = total.icmp.saturating_add(part.icmp);
        total.other = total.other.saturating_add(part.other);
    }
    into.rx_dropped = into.rx_dropped.saturating_add(stats.rx_dropped);
    into.tx_dropped = into.tx_dropped.saturating_add(stats.tx_dropped);
    let (total, part) = (&mut into.ceiling, &stats.ceiling);
    total.tx_delayed = total.tx_delayed.saturating_add(part.tx_delayed);
    total.tx_dropped = total.tx_dropped.saturating_add(part.tx_dropped);
    total.rx_dropped = total.rx_dropped.saturating_add(part.rx_dropped);
    let (total, part) = (&mut total.qdisc, &part.qdisc);
    total.dropped = total.dropped.saturating_add(part.dropped);
    total.overlimits = total.overlimits.saturating_add(part.overlimits);
    total.throttled = total.throttled.saturating_add(part.throttled);
    total.horizon_drops = total.horizon_drops.saturating_add(part.horizon_drops);
    total.flows_plimit = total.flows_plimit.saturating_add(part.flows_plimit);
}

type LabelPairs = Vec<(&'static str, String)>;

impl InterfaceTraffic {
    /// An empty snapshot; `pod_labels` false sums the series per interface name.
    #[must_use]
    pub fn new(pod_labels: bool) -> Self {
        Self {
            samples: std::sync::RwLock::default(),
            pod_labels,
            departed: std::sync::Mutex::default(),
        }
    }

    /// Replaces the snapshot.
    pub fn replace(&self, samples: Vec<(InterfaceLabels, InterfaceStats)>) {
        let mut current = self.samples.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !self.pod_labels {
            let mut departed =
                self.departed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for (labels, old) in current.iter() {
                let continues = samples.iter().any(|(now_labels, now)| {
                    now_labels == labels
                        && counters(now).iter().zip(counters(old)).all(|(now, old)| *now >= old)
                });
                if !continues {
                    add(departed.entry(labels.interface.clone()).or_default(), old);
                }
            }
        }
        *current = samples;
    }

    /// The snapshot as last replaced, with every label (`netclaim status` shows it per
    /// interface, whatever the flag says of the metrics).
    #[must_use]
    pub fn snapshot(&self) -> Vec<(InterfaceLabels, InterfaceStats)> {
        self.samples.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The series to encode: one per interface with pod labels, else one per interface
    /// name (departed interfaces included).
    fn series(&self) -> Vec<(LabelPairs, InterfaceStats)> {
        let samples = self.samples.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.pod_labels {
            return samples
                .iter()
                .map(|(l, stats)| {
                    let labels = vec![
                        ("namespace", l.namespace.clone()),
                        ("pod", l.pod.clone()),
                        ("claim", l.claim.clone()),
                        ("interface", l.interface.clone()),
                    ];
                    (labels, *stats)
                })
                .collect();
        }
        let mut sums =
            self.departed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        for (labels, stats) in samples.iter() {
            add(sums.entry(labels.interface.clone()).or_default(), stats);
        }
        sums.into_iter().map(|(interface, stats)| (vec![("interface", interface)], stats)).collect()
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
        // Declared even without interfaces (no series then), as every family is.
        let series = self.series();
        let families: [(&str, &str, Field); 10] = [
            ("interface_rx_bytes", "Bytes received by a pod interface", |s| s.rx.bytes),
            ("interface_rx_packets", "Packets received by a pod interface", |s| s.rx.packets),
            ("interface_rx_dropped", "Received packets the kernel dropped", |s| s.rx_dropped),
            ("interface_tx_bytes", "Bytes sent by a pod interface", |s| s.tx.bytes),
            ("interface_tx_packets", "Packets sent by a pod interface", |s| s.tx.packets),
            ("interface_tx_dropped", "Sent packets the kernel dropped", |s| s.tx_dropped),
            (
                "interface_tx_delayed",
                "Sent packets the bandwidth ceiling paced to leave later than sent",
                |s| s.ceiling.tx_delayed,
            ),
            (
                "interface_qdisc_dropped",
                "Sent packets the bandwidth ceiling's qdisc dropped (tbf, htb: its queue was \
                 full; fq: beyond its horizon or a flow's limit)",
                |s| s.ceiling.qdisc.dropped,
            ),
            (
                "interface_qdisc_overlimits",
                "Times the bandwidth ceiling's tbf or htb qdisc held a packet for want of tokens",
                |s| s.ceiling.qdisc.overlimits,
            ),
            (
                "interface_qdisc_throttled",
                "Times the bandwidth ceiling's fq qdisc held a flow until its departure time",
                |s| s.ceiling.qdisc.throttled,
            ),
        ];
        for (name, help, field) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, stats) in &series {
                ConstCounter::new(field(stats)).encode(family.encode_family(labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "interface_ceiling_dropped",
            "Packets the bandwidth ceiling dropped (tx: beyond the pacing horizon; rx: over the \
             police rate)",
            None,
            MetricType::Counter,
        )?;
        for (labels, stats) in &series {
            for (direction, dropped) in [
                (Direction::Rx, stats.ceiling.rx_dropped),
                (Direction::Tx, stats.ceiling.tx_dropped),
            ] {
                let mut set = labels.clone();
                set.push(("direction", direction.as_str().to_owned()));
                ConstCounter::new(dropped).encode(family.encode_family(&set)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "interface_protocol_packets",
            "Packets of a pod interface by direction and L4 protocol",
            None,
            MetricType::Counter,
        )?;
        for (labels, stats) in &series {
            for direction in [Direction::Rx, Direction::Tx] {
                for protocol in PROTOCOLS {
                    let mut set = labels.clone();
                    set.push(("direction", direction.as_str().to_owned()));
                    set.push(("protocol", protocol.to_owned()));
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
            ceiling: crate::model::stats::CeilingCounters {
                tx_delayed: 30,
                tx_dropped: 2,
                rx_dropped: 5,
                qdisc: crate::model::stats::CeilingQdiscCounters {
                    dropped: 8,
                    overlimits: 90,
                    throttled: 3,
                    ..Default::default()
                },
            },
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
            ("netclaim_interface_tx_delayed_total", 30),
            ("netclaim_interface_qdisc_dropped_total", 8),
            ("netclaim_interface_qdisc_overlimits_total", 90),
            ("netclaim_interface_qdisc_throttled_total", 3),
        ] {
            assert!(text.contains(&format!("{name}{series} {value}\n")), "{name} in:\n{text}");
        }
        assert!(text.contains(
            r#"netclaim_interface_protocol_packets_total{namespace="default",pod="web-0",claim="web-0-net",interface="net1",direction="rx",protocol="icmp"} 7"#
        ));
        for (direction, value) in [("rx", 5), ("tx", 2)] {
            let line = format!(
                r#"netclaim_interface_ceiling_dropped_total{{namespace="default",pod="web-0",claim="web-0-net",interface="net1",direction="{direction}"}} {value}"#
            );
            assert!(text.contains(&line), "{line} in:\n{text}");
        }
        metrics.interface_traffic.replace(Vec::new());
        let text = metrics.encode();
        assert!(!text.contains("netclaim_interface_rx_bytes_total{"), "series of a gone interface");
        assert!(text.contains("# TYPE netclaim_interface_rx_bytes counter\n"), "declared: {text}");
        for family in ["qdisc_dropped", "qdisc_overlimits", "qdisc_throttled"] {
            let declared = format!("# TYPE netclaim_interface_{family} counter\n");
            assert!(text.contains(&declared), "declared from start: {text}");
        }
    }

    fn sample(
        pod: &str,
        interface: &str,
        rx_bytes: u64,
    ) -> (super::InterfaceLabels, InterfaceStats) {
        let labels = super::InterfaceLabels {
            namespace: "default".to_owned(),
            pod: pod.to_owned(),
            claim: format!("{pod}-net"),
            interface: interface.to_owned(),
        };
        let stats = InterfaceStats {
            rx: DirectionCounters { bytes: rx_bytes, packets: 1, tcp: 1, ..Default::default() },
            ..Default::default()
        };
        (labels, stats)
    }

    use crate::model::stats::{DirectionCounters, InterfaceStats};

    /// The `# TYPE` lines of `text`.
    fn declarations(text: &str) -> Vec<&str> {
        text.lines().filter(|line| line.starts_with("# TYPE ")).collect()
    }

    #[test]
    fn every_family_is_declared_before_its_first_event() {
        use super::{
            IpamLabels, KubeletRequestLabels, ModeLabel, NriEventLabels, PodNetworkLabel,
            ResultLabel,
        };
        let fresh = super::Metrics::new().encode();
        let used = super::Metrics::new();
        used.devices_published.set(1);
        used.pool_generation.set(2);
        used.slice_writes.get_or_create(&ResultLabel { result: "success" }).inc();
        used.status_writes.get_or_create(&ResultLabel { result: "error" }).inc();
        used.slice_syncs.get_or_create(&ResultLabel { result: "error" }).inc();
        used.capacity_dropped.set(1);
        used.prepare_duration.observe(0.01);
        used.unprepare_duration.observe(0.01);
        let call = KubeletRequestLabels { method: "NodePrepareResources", code: "OK" };
        used.kubelet_requests.get_or_create(&call).inc();
        let mode = ModeLabel { mode: "macvlan" };
        used.attach_duration.get_or_create(&mode).observe(0.001);
        used.detach_duration.get_or_create(&mode).observe(0.001);
        let event = NriEventLabels { event: "RunPodSandbox", result: "success" };
        used.nri_events.get_or_create(&event).inc();
        let pool = IpamLabels { pool: "10.0.0.0/24".to_owned(), state: "leased" };
        used.ipam_addresses.get_or_create(&pool).set(1);
        let network = PodNetworkLabel { pod_network: "net".to_owned() };
        used.ipblocks_lost.get_or_create(&network).inc();
        used.interface_traffic.replace(vec![sample("web-0", "net1", 1)]);
        let used = used.encode();
        assert_eq!(declarations(&fresh), declarations(&used), "fresh:\n{fresh}\nused:\n{used}");
        for line in [
            // The counters' known series, at 0 until their first event.
            "netclaim_status_writes_total{result=\"error\"} 0\n",
            "netclaim_slice_syncs_total{result=\"error\"} 0\n",
            "netclaim_kubelet_requests_total{method=\"NodePrepareResources\",code=\"ClaimError\"} 0\n",
            "netclaim_nri_events_total{event=\"CreateContainer\",result=\"error\"} 0\n",
            // What every process serves.
            "# TYPE netclaim_build info\n",
            "# TYPE process_cpu_seconds counter\n",
            "# TYPE process_resident_memory_bytes gauge\n",
            "# TYPE process_open_fds gauge\n",
        ] {
            assert!(fresh.contains(line), "{line} in:\n{fresh}");
        }
        let build = format!("netclaim_build_info{{version=\"{}\"}} 1\n", env!("CARGO_PKG_VERSION"));
        assert!(fresh.contains(&build), "{fresh}");
    }

    #[test]
    fn without_pod_labels_the_series_are_summed_per_interface_name_and_never_go_down() {
        let metrics = super::Metrics::with_pod_labels(false);
        metrics.interface_traffic.replace(vec![
            sample("web-0", "net1", 100),
            sample("web-1", "net1", 50),
            sample("db-0", "net2", 7),
        ]);
        let text = metrics.encode();
        for pod_label in ["namespace=", "pod=", "claim="] {
            assert!(!text.contains(pod_label), "{pod_label} in:\n{text}");
        }
        assert!(
            text.contains("netclaim_interface_rx_bytes_total{interface=\"net1\"} 150\n"),
            "{text}"
        );
        assert!(
            text.contains("netclaim_interface_rx_bytes_total{interface=\"net2\"} 7\n"),
            "{text}"
        );
        assert!(text.contains(
            r#"netclaim_interface_protocol_packets_total{interface="net1",direction="rx",protocol="tcp"} 2"#
        ), "{text}");
        // web-1 leaves, web-0 counts on, web-2 arrives: the sum keeps web-1's last counters.
        metrics.interface_traffic.replace(vec![
            sample("web-0", "net1", 130),
            sample("web-2", "net1", 5),
            sample("db-0", "net2", 7),
        ]);
        let text = metrics.encode();
        assert!(
            text.contains("netclaim_interface_rx_bytes_total{interface=\"net1\"} 185\n"),
            "{text}"
        );
        // db-0's counters restart (its interface re-attached): the old ones are kept.
        metrics.interface_traffic.replace(vec![sample("db-0", "net2", 3)]);
        let text = metrics.encode();
        assert!(
            text.contains("netclaim_interface_rx_bytes_total{interface=\"net2\"} 10\n"),
            "{text}"
        );
        assert!(
            text.contains("netclaim_interface_rx_bytes_total{interface=\"net1\"} 185\n"),
            "{text}"
        );
        // `netclaim status` still sees every label.
        assert_eq!(metrics.interface_traffic.snapshot()[0].0.pod, "db-0");
    }
}
