//! Prometheus metrics of `netclaim controller`; `crate::metrics::serve` serves them with
//! `/healthz` and `/readyz`, as it serves the node daemon's own registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::gc::Reason;
use crate::metrics::standard::{self, Declared};
use crate::metrics::{MetricsRegistry, encode};
use crate::model::pod_network::reason;

/// `{result}` of reconciles.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `success` or `error`.
    pub result: &'static str,
}

/// `{reason}` of the PodNetworks gauge and of GC deletions.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// A `Ready` condition reason, or a GC reason (`node-gone`, `claim-gone`).
    pub reason: &'static str,
}

/// `{pod_network,node}` of the IPBlocks gauge.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockLabels {
    /// `spec.podNetwork`.
    pub pod_network: String,
    /// `spec.nodeName`.
    pub node: String,
}

/// The controller's metric families (prefix `netclaim_controller_`), with
/// `netclaim_build_info` and the process families.
#[derive(Debug)]
pub struct ControllerMetrics {
    registry: Registry,
    /// `netclaim_controller_leader`: 1 while this replica acts.
    pub leader: Gauge,
    /// `netclaim_controller_reconciles_total{result}`.
    pub reconciles: Family<ResultLabel, Counter>,
    /// `netclaim_controller_pod_networks{reason}`: PodNetworks of this driver by `Ready`
    /// reason (as the leader last wrote them).
    pub pod_networks: Family<ReasonLabel, Gauge>,
    /// `netclaim_controller_ip_blocks{pod_network,node}`: as of the last sweep.
    pub ip_blocks: Family<BlockLabels, Gauge>,
    /// `netclaim_controller_gc_deletions_total{reason}`: IPBlocks the controller deleted.
    pub gc_deletions: Family<ReasonLabel, Counter>,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    /// Creates and registers every family.
    #[must_use]
    pub fn new() -> Self {
        let mut root = Registry::default();
        standard::register(&mut root);
        let registry = root.sub_registry_with_prefix("netclaim_controller");
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the lease and acts",
            leader.clone(),
        );
        let reconciles = Family::<ResultLabel, Counter>::default();
        registry.register(
            "reconciles",
            "PodNetwork reconciles by outcome",
            Declared(reconciles.clone()),
        );
        // Both outcomes from the start: an alert on `increase()` sees the first error.
        for result in ["success", "error"] {
            drop(reconciles.get_or_create(&ResultLabel { result }));
        }
        let pod_networks = Family::<ReasonLabel, Gauge>::default();
        registry.register(
            "pod_networks",
            "PodNetworks of this driver by Ready reason",
            Declared(pod_networks.clone()),
        );
        let ip_blocks = Family::<BlockLabels, Gauge>::default();
        registry.register(
            "ip_blocks",
            "IPBlocks per PodNetwork and node",
            Declared(ip_blocks.clone()),
        );
        let gc_deletions = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "gc_deletions",
            "IPBlocks deleted by the controller's garbage collection",
            Declared(gc_deletions.clone()),
        );
        for reason in [Reason::NodeGone, Reason::ClaimGone] {
            drop(gc_deletions.get_or_create(&ReasonLabel { reason: reason.as_str() }));
        }
        Self { registry: root, leader, reconciles, pod_networks, ip_blocks, gc_deletions }
    }

    /// Sets the PodNetworks gauge from the reasons of every network (each reason has a series,
    /// zero when unused, so a dashboard sees a network leave a state).
    pub fn set_pod_networks<'a>(&self, reasons: impl IntoIterator<Item = &'a str>) {
        let mut counts = [
            (reason::READY, 0_i64),
            (reason::INVALID, 0),
            (reason::DISABLED, 0),
            (reason::OVERLAPS, 0),
            (reason::DELETING, 0),
        ];
        for seen in reasons {
            if let Some((_, count)) = counts.iter_mut().find(|(name, _)| *name == seen) {
                *count += 1;
            }
        }
        for (name, count) in counts {
            self.pod_networks.get_or_create(&ReasonLabel { reason: name }).set(count);
        }
    }

    /// Replaces the IPBlocks gauge with `counts` (series of pairs without blocks go).
    pub fn set_ip_blocks(&self, counts: impl IntoIterator<Item = ((String, String), usize)>) {
        self.ip_blocks.clear();
        for ((pod_network, node), count) in counts {
            self.ip_blocks
                .get_or_create(&BlockLabels { pod_network, node })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// Clears what only the leader knows (a standby reports no networks or blocks).
    pub fn clear_leader_state(&self) {
        self.leader.set(0);
        self.pod_networks.clear();
        self.ip_blocks.clear();
    }

    /// The text exposition format.
    #[must_use]
    pub fn encode(&self) -> String {
        encode(&self.registry)
    }
}

impl MetricsRegistry for ControllerMetrics {
    fn registry(&self) -> &Registry {
        &self.registry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_named_under_the_controller_prefix() {
        let metrics = ControllerMetrics::new();
        metrics.leader.set(1);
        metrics.reconciles.get_or_create(&ResultLabel { result: "success" }).inc();
        metrics.set_pod_networks(["Ready", "Ready", "Overlaps"]);
        metrics.set_ip_blocks([(("net".to_owned(), "node-1".to_owned()), 3)]);
        metrics.gc_deletions.get_or_create(&ReasonLabel { reason: "node-gone" }).inc();
        let text = metrics.encode();
        for line in [
            "netclaim_controller_leader 1",
            "netclaim_controller_reconciles_total{result=\"success\"} 1",
            "netclaim_controller_pod_networks{reason=\"Ready\"} 2",
            "netclaim_controller_pod_networks{reason=\"Overlaps\"} 1",
            "netclaim_controller_pod_networks{reason=\"Invalid\"} 0",
            "netclaim_controller_ip_blocks{pod_network=\"net\",node=\"node-1\"} 3",
            "netclaim_controller_gc_deletions_total{reason=\"node-gone\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        metrics.clear_leader_state();
        let text = metrics.encode();
        assert!(text.contains("netclaim_controller_leader 0"), "{text}");
        assert!(!text.contains("ip_blocks{"), "{text}");
    }

    #[test]
    fn every_family_is_declared_before_its_first_event() {
        let declarations = |text: &str| -> Vec<String> {
            text.lines().filter(|line| line.starts_with("# TYPE ")).map(str::to_owned).collect()
        };
        let fresh = ControllerMetrics::new().encode();
        let used = ControllerMetrics::new();
        used.leader.set(1);
        used.reconciles.get_or_create(&ResultLabel { result: "error" }).inc();
        used.set_pod_networks(["Ready"]);
        used.set_ip_blocks([(("net".to_owned(), "node-1".to_owned()), 1)]);
        used.gc_deletions.get_or_create(&ReasonLabel { reason: "claim-gone" }).inc();
        let used = used.encode();
        assert_eq!(declarations(&fresh), declarations(&used), "fresh:\n{fresh}\nused:\n{used}");
        for line in [
            "netclaim_controller_reconciles_total{result=\"error\"} 0\n",
            "netclaim_controller_gc_deletions_total{reason=\"node-gone\"} 0\n",
            "# TYPE netclaim_build info\n",
            "# TYPE process_cpu_seconds counter\n",
        ] {
            assert!(fresh.contains(line), "{line} in:\n{fresh}");
        }
    }
}
