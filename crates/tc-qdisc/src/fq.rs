//! `fq`: fair queueing with pacing (`net/sched/sch_fq.c`). Since Linux 4.20 it holds every
//! packet until its `skb->tstamp` (Earliest Departure Time), which is how a program that
//! stamps departure times from a rate turns into a ceiling. Settings are flat `u32`
//! attributes (`TCA_FQ_*`) set only when given; a dump answers every one. Its statistics
//! (`struct tc_fq_qd_stats`, `TCA_XSTATS`) count the packets held back (`throttled`) and those
//! dropped for a departure time beyond the horizon (`horizon_drops`).

use crate::nla::Nla;
use crate::{attr_u32, u64_at};

/// The qdisc kind.
pub const KIND: &str = "fq";
/// `TCA_FQ_PLIMIT`: packets in the whole qdisc.
pub const TCA_FQ_PLIMIT: u16 = 1;
/// `TCA_FQ_FLOW_PLIMIT`: packets per flow.
pub const TCA_FQ_FLOW_PLIMIT: u16 = 2;
/// `TCA_FQ_QUANTUM`.
pub const TCA_FQ_QUANTUM: u16 = 3;
/// `TCA_FQ_INITIAL_QUANTUM`.
pub const TCA_FQ_INITIAL_QUANTUM: u16 = 4;
/// `TCA_FQ_FLOW_MAX_RATE`: bytes per second per flow (`u32::MAX`: none).
pub const TCA_FQ_FLOW_MAX_RATE: u16 = 7;
/// `TCA_FQ_BUCKETS_LOG`.
pub const TCA_FQ_BUCKETS_LOG: u16 = 8;
/// `TCA_FQ_CE_THRESHOLD`: microseconds.
pub const TCA_FQ_CE_THRESHOLD: u16 = 12;
/// `TCA_FQ_HORIZON`: microseconds.
pub const TCA_FQ_HORIZON: u16 = 14;
/// `TCA_FQ_HORIZON_DROP`: `u8`, 1 drops beyond the horizon, 0 caps the departure time.
pub const TCA_FQ_HORIZON_DROP: u16 = 15;

/// The settings to send; `None` leaves the kernel's value (on a new qdisc, its default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fq {
    /// Packets in the whole qdisc (kernel default 10000).
    pub plimit: Option<u32>,
    /// Packets per flow (kernel default 100).
    pub flow_plimit: Option<u32>,
    /// Bytes per round (default twice the MTU).
    pub quantum: Option<u32>,
    /// Bytes a new flow may send in its first round.
    pub initial_quantum: Option<u32>,
    /// Bytes per second per flow.
    pub flow_max_rate: Option<u32>,
    /// log2 of the flow hash buckets.
    pub buckets_log: Option<u32>,
    /// How far ahead a departure time may be, microseconds (default 10 s).
    pub horizon_us: Option<u32>,
    /// Whether a packet beyond the horizon is dropped (true, the default) or sent at it.
    pub horizon_drop: Option<bool>,
    /// CE-marking threshold, microseconds.
    pub ce_threshold_us: Option<u32>,
}

impl Fq {
    /// The attributes nested in `TCA_OPTIONS`.
    #[must_use]
    pub fn options(&self) -> Vec<Nla> {
        let words = [
            (TCA_FQ_PLIMIT, self.plimit),
            (TCA_FQ_FLOW_PLIMIT, self.flow_plimit),
            (TCA_FQ_QUANTUM, self.quantum),
            (TCA_FQ_INITIAL_QUANTUM, self.initial_quantum),
            (TCA_FQ_FLOW_MAX_RATE, self.flow_max_rate),
            (TCA_FQ_BUCKETS_LOG, self.buckets_log),
            (TCA_FQ_CE_THRESHOLD, self.ce_threshold_us),
            (TCA_FQ_HORIZON, self.horizon_us),
        ];
        let mut attrs: Vec<Nla> =
            words.into_iter().filter_map(|(kind, v)| v.map(|v| Nla::u32(kind, v))).collect();
        if let Some(drop) = self.horizon_drop {
            attrs.push(Nla::u8(TCA_FQ_HORIZON_DROP, u8::from(drop)));
        }
        attrs
    }

    /// What a dump's options say (every attribute the kernel reported).
    #[must_use]
    pub fn parse(options: &[Nla]) -> Fq {
        Fq {
            plimit: attr_u32(options, TCA_FQ_PLIMIT),
            flow_plimit: attr_u32(options, TCA_FQ_FLOW_PLIMIT),
            quantum: attr_u32(options, TCA_FQ_QUANTUM),
            initial_quantum: attr_u32(options, TCA_FQ_INITIAL_QUANTUM),
            flow_max_rate: attr_u32(options, TCA_FQ_FLOW_MAX_RATE),
            buckets_log: attr_u32(options, TCA_FQ_BUCKETS_LOG),
            horizon_us: attr_u32(options, TCA_FQ_HORIZON),
            horizon_drop: options
                .iter()
                .find(|a| a.kind == TCA_FQ_HORIZON_DROP)
                .and_then(|a| a.value.first())
                .map(|v| *v != 0),
            ce_threshold_us: attr_u32(options, TCA_FQ_CE_THRESHOLD),
        }
    }
}

/// The counters of `struct tc_fq_qd_stats` a ceiling shows in (others are left out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FqStats {
    /// Times a flow was held back until its next departure time.
    pub throttled: u64,
    /// Packets dropped because their flow had `flow_plimit` packets queued.
    pub flows_plimit: u64,
    /// Packets dropped for a departure time beyond the horizon.
    pub horizon_drops: u64,
    /// Departure times capped at the horizon.
    pub horizon_caps: u64,
}

impl FqStats {
    /// Reads `TCA_XSTATS` of an `fq` qdisc. Older kernels send a shorter structure (fields are
    /// only ever appended); what is missing reads as 0, as iproute2 does.
    #[must_use]
    pub fn parse(xstats: &[u8]) -> FqStats {
        let field = |at: usize| if xstats.len() >= at + 8 { u64_at(xstats, at) } else { 0 };
        FqStats {
            throttled: field(24),
            flows_plimit: field(32),
            horizon_drops: field(88),
            horizon_caps: field(96),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_settings_given_are_sent_and_read_back() {
        let fq = Fq {
            horizon_us: Some(2_000_000),
            horizon_drop: Some(true),
            flow_plimit: Some(1000),
            ..Fq::default()
        };
        let attrs = fq.options();
        assert_eq!(attrs.len(), 3);
        assert_eq!(attrs.iter().find(|a| a.kind == TCA_FQ_HORIZON_DROP).unwrap().value, [1]);
        assert_eq!(Fq::parse(&attrs), fq);
    }

    #[test]
    fn stats_of_an_older_kernel_read_missing_fields_as_zero() {
        let mut full = vec![0u8; 136];
        full[24..32].copy_from_slice(&7u64.to_ne_bytes());
        full[88..96].copy_from_slice(&3u64.to_ne_bytes());
        assert_eq!(
            FqStats::parse(&full),
            FqStats { throttled: 7, horizon_drops: 3, ..FqStats::default() }
        );
        assert_eq!(FqStats::parse(&full[..80]), FqStats { throttled: 7, ..FqStats::default() });
    }
}
