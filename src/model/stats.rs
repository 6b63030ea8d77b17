//! Traffic counters of one pod interface (DESIGN §5 items 4 and 8): what the eBPF programs
//! count per direction, the drops the kernel's link counters add, and the `data.stats` object
//! of the claim status built from them. Pure data.

use serde::Serialize;

/// A traffic direction, seen from the pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Received by the pod (the interface's ingress).
    Rx,
    /// Sent by the pod (egress).
    Tx,
}

impl Direction {
    /// `rx` or `tx`, as metric labels spell it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rx => "rx",
            Self::Tx => "tx",
        }
    }
}

/// What the counting program saw in one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DirectionCounters {
    /// Bytes (the whole frame, as `skb->len` counts it).
    pub bytes: u64,
    /// Packets.
    pub packets: u64,
    /// TCP packets (IPv4 protocol or IPv6 next header 6).
    pub tcp: u64,
    /// UDP packets (17).
    pub udp: u64,
    /// ICMP and ICMPv6 packets (1, 58).
    pub icmp: u64,
    /// Everything else: ARP, IPv6 extension headers, other protocols.
    pub other: u64,
}

/// The L4 protocols the programs tell apart.
pub const PROTOCOLS: [&str; 4] = ["tcp", "udp", "icmp", "other"];

impl DirectionCounters {
    /// Packets of protocol `name` (one of [`PROTOCOLS`]); 0 for another name.
    #[must_use]
    pub fn protocol(&self, name: &str) -> u64 {
        match name {
            "tcp" => self.tcp,
            "udp" => self.udp,
            "icmp" => self.icmp,
            "other" => self.other,
            _ => 0,
        }
    }
}

/// All counters of one pod interface at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InterfaceStats {
    /// Received.
    pub rx: DirectionCounters,
    /// Sent.
    pub tx: DirectionCounters,
    /// Received packets the kernel dropped (`IFLA_STATS64` `rx_dropped`): drops happen after
    /// the tc hook, so the program cannot count them.
    pub rx_dropped: u64,
    /// Sent packets the kernel dropped (`tx_dropped`).
    pub tx_dropped: u64,
    /// What the interface's bandwidth ceiling did (all 0 without one).
    pub ceiling: CeilingCounters,
}

/// What a bandwidth ceiling did to an interface's packets (DESIGN §3 `bandwidth`), as the
/// programs count it: these drops happen in the tc hook, so the link counters
/// (`rx_dropped`, `tx_dropped`) do not include them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CeilingCounters {
    /// Sent packets held back: given a departure time later than when they were sent
    /// (egress pacing; the `fq` qdisc releases them then).
    pub tx_delayed: u64,
    /// Sent packets dropped because their departure time would have been beyond the
    /// pacing horizon (the sender outran the ceiling by that much).
    pub tx_dropped: u64,
    /// Received packets dropped by the ingress policer (`bandwidth.ingress: police`).
    pub rx_dropped: u64,
    /// What the ceiling's root qdisc did (all 0 without one of ours).
    pub qdisc: CeilingQdiscCounters,
}

/// What the root qdisc of an interface's bandwidth ceiling (ours, handle `4e43:`: `tbf`,
/// `htb` or `fq`) did, from the kernel's statistics of that qdisc (`TCA_STATS2` and, for
/// `fq`, `TCA_XSTATS`). A qdisc's drops are not in the link counters (`tx_dropped`) either:
/// the packet never reached the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CeilingQdiscCounters {
    /// Packets the qdisc dropped: `tbf`/`htb` when the queue behind the ceiling was full;
    /// `fq` beyond its horizon or over a flow's packet limit (both counted below too).
    pub dropped: u64,
    /// `tbf`/`htb`: times a packet found too few tokens and waited (`overlimits`); the
    /// throttling measure of those qdiscs.
    pub overlimits: u64,
    /// `fq`: times a flow was held back until its next departure time (the EDT throttling).
    pub throttled: u64,
    /// `fq`: packets dropped for a departure time beyond the horizon.
    pub horizon_drops: u64,
    /// `fq`: packets dropped because their flow had its limit of packets queued.
    pub flows_plimit: u64,
}

impl CeilingQdiscCounters {
    /// Whether the qdisc did nothing (or there is none).
    #[must_use]
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl CeilingCounters {
    /// Whether the ceiling did nothing (or there is none).
    #[must_use]
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

impl InterfaceStats {
    /// The counters of `direction`.
    #[must_use]
    pub fn direction(&self, direction: Direction) -> &DirectionCounters {
        match direction {
            Direction::Rx => &self.rx,
            Direction::Tx => &self.tx,
        }
    }

    /// `data.stats` of the claim status, stamped `collected_at` (RFC 3339).
    #[must_use]
    pub fn to_status(&self, collected_at: String) -> StatsStatus {
        let split = |name: &str| ProtocolPackets {
            rx_packets: self.rx.protocol(name),
            tx_packets: self.tx.protocol(name),
        };
        StatsStatus {
            rx_bytes: self.rx.bytes,
            rx_packets: self.rx.packets,
            tx_bytes: self.tx.bytes,
            tx_packets: self.tx.packets,
            rx_dropped: self.rx_dropped,
            tx_dropped: self.tx_dropped,
            collected_at,
            ceiling: CeilingStatus {
                tx_delayed: self.ceiling.tx_delayed,
                tx_dropped: self.ceiling.tx_dropped,
                rx_dropped: self.ceiling.rx_dropped,
                qdisc: QdiscStatus {
                    dropped: self.ceiling.qdisc.dropped,
                    overlimits: self.ceiling.qdisc.overlimits,
                    throttled: self.ceiling.qdisc.throttled,
                    horizon_drops: self.ceiling.qdisc.horizon_drops,
                    flows_plimit: self.ceiling.qdisc.flows_plimit,
                },
            },
            protocols: ProtocolSplit {
                tcp: split("tcp"),
                udp: split("udp"),
                icmp: split("icmp"),
                other: split("other"),
            },
        }
    }
}

/// `data.stats` (DESIGN §5 item 4, with the protocol split of item 8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatsStatus {
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Received packets dropped by the kernel.
    pub rx_dropped: u64,
    /// Sent packets dropped by the kernel.
    pub tx_dropped: u64,
    /// When the counters were read (RFC 3339, UTC).
    pub collected_at: String,
    /// What the bandwidth ceiling did; left out when it did nothing.
    #[serde(skip_serializing_if = "CeilingStatus::is_zero")]
    pub ceiling: CeilingStatus,
    /// Packets per L4 protocol.
    pub protocols: ProtocolSplit,
}

/// `data.stats.ceiling`: packets the bandwidth ceiling held back or dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CeilingStatus {
    /// Sent packets paced later than sent.
    pub tx_delayed: u64,
    /// Sent packets dropped beyond the pacing horizon.
    pub tx_dropped: u64,
    /// Received packets dropped by the policer.
    pub rx_dropped: u64,
    /// What the ceiling's qdisc did; left out when it did nothing.
    #[serde(skip_serializing_if = "QdiscStatus::is_zero")]
    pub qdisc: QdiscStatus,
}

impl CeilingStatus {
    fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// `data.stats.ceiling.qdisc`: the ceiling qdisc's drops and throttling
/// ([`CeilingQdiscCounters`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QdiscStatus {
    /// Packets the qdisc dropped.
    pub dropped: u64,
    /// `tbf`/`htb`: times a packet waited for tokens.
    pub overlimits: u64,
    /// `fq`: times a flow was held back until its departure time.
    pub throttled: u64,
    /// `fq`: dropped beyond the horizon.
    pub horizon_drops: u64,
    /// `fq`: dropped over a flow's packet limit.
    pub flows_plimit: u64,
}

impl QdiscStatus {
    fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// Packets per L4 protocol, both directions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProtocolSplit {
    /// TCP.
    pub tcp: ProtocolPackets,
    /// UDP.
    pub udp: ProtocolPackets,
    /// ICMP and ICMPv6.
    pub icmp: ProtocolPackets,
    /// Everything else.
    pub other: ProtocolPackets,
}

/// Packets of one protocol.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolPackets {
    /// Received.
    pub rx_packets: u64,
    /// Sent.
    pub tx_packets: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_object_names_every_field_of_the_design() {
        let stats = InterfaceStats {
            rx: DirectionCounters { bytes: 980, packets: 10, tcp: 0, udp: 2, icmp: 5, other: 3 },
            tx: DirectionCounters { bytes: 1140, packets: 12, tcp: 1, udp: 2, icmp: 5, other: 4 },
            rx_dropped: 1,
            tx_dropped: 7,
            ceiling: CeilingCounters::default(),
        };
        let json = serde_json::to_value(stats.to_status("2026-11-25T10:00:00Z".to_owned()))
            .expect("plain data serialises");
        assert_eq!(
            json,
            serde_json::json!({
                "rxBytes": 980, "rxPackets": 10, "txBytes": 1140, "txPackets": 12,
                "rxDropped": 1, "txDropped": 7, "collectedAt": "2026-11-25T10:00:00Z",
                "protocols": {
                    "tcp": {"rxPackets": 0, "txPackets": 1},
                    "udp": {"rxPackets": 2, "txPackets": 2},
                    "icmp": {"rxPackets": 5, "txPackets": 5},
                    "other": {"rxPackets": 3, "txPackets": 4},
                }
            })
        );
    }

    #[test]
    fn ceiling_object_appears_once_the_ceiling_acted() {
        let stats = InterfaceStats {
            ceiling: CeilingCounters {
                tx_delayed: 40,
                tx_dropped: 2,
                rx_dropped: 9,
                ..CeilingCounters::default()
            },
            ..InterfaceStats::default()
        };
        let json = serde_json::to_value(stats.to_status("2026-11-25T10:00:00Z".to_owned()))
            .expect("plain data serialises");
        assert_eq!(
            json["ceiling"],
            serde_json::json!({"txDelayed": 40, "txDropped": 2, "rxDropped": 9})
        );
    }

    #[test]
    fn a_qdisc_that_dropped_or_throttled_shows_under_the_ceiling() {
        let stats = InterfaceStats {
            ceiling: CeilingCounters {
                qdisc: CeilingQdiscCounters { dropped: 12, overlimits: 340, ..Default::default() },
                ..CeilingCounters::default()
            },
            ..InterfaceStats::default()
        };
        let json = serde_json::to_value(stats.to_status("2026-11-25T10:00:00Z".to_owned()))
            .expect("plain data serialises");
        assert_eq!(
            json["ceiling"],
            serde_json::json!({"txDelayed": 0, "txDropped": 0, "rxDropped": 0, "qdisc": {
                "dropped": 12, "overlimits": 340, "throttled": 0, "horizonDrops": 0,
                "flowsPlimit": 0}})
        );
    }
}
