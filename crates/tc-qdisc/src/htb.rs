//! `htb`: the hierarchical token bucket (`net/sched/sch_htb.c`): the qdisc
//! (`TCA_HTB_INIT`, `struct tc_htb_glob`: version 3, the rate-to-quantum divisor and the class
//! unclassified traffic goes to) and a class (`TCA_HTB_PARMS`, `struct tc_htb_opt`: rate,
//! ceiling, their buckets as psched ticks, quantum, priority; `TCA_HTB_RATE64` and
//! `TCA_HTB_CEIL64` from 2^32 bytes/s up). No rate tables: the specs name the Ethernet link
//! layer.

use crate::nla::Nla;
use crate::rate::{RATESPEC_LEN, RateSpec, xmit_bytes, xmit_ticks};
use crate::{DecodeError, attr_struct, attr_u32, attr_u64, u32_at};

/// The qdisc kind.
pub const KIND: &str = "htb";
/// `TCA_HTB_PARMS`.
pub const TCA_HTB_PARMS: u16 = 1;
/// `TCA_HTB_INIT`.
pub const TCA_HTB_INIT: u16 = 2;
/// `TCA_HTB_DIRECT_QLEN`.
pub const TCA_HTB_DIRECT_QLEN: u16 = 5;
/// `TCA_HTB_RATE64`.
pub const TCA_HTB_RATE64: u16 = 6;
/// `TCA_HTB_CEIL64`.
pub const TCA_HTB_CEIL64: u16 = 7;
/// `TC_HTB_PROTOVER`.
pub const PROTOVER: u32 = 3;
/// `sizeof(struct tc_htb_glob)`.
pub const GLOB_LEN: usize = 20;
/// `sizeof(struct tc_htb_opt)`.
pub const OPT_LEN: usize = 2 * RATESPEC_LEN + 20;

/// The qdisc's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbQdisc {
    /// The minor number of the class unclassified packets go to (`default`); 0 sends them
    /// unshaped past every class.
    pub default_class: u32,
    /// `r2q`: a class without a quantum gets rate / r2q (iproute2's default is 10).
    pub rate2quantum: u32,
    /// Packets of the unshaped direct queue (`direct_qlen`); `None` leaves the kernel's
    /// default (the device's `tx_queue_len`).
    pub direct_qlen: Option<u32>,
}

impl HtbQdisc {
    /// The attributes nested in `TCA_OPTIONS` of the qdisc.
    #[must_use]
    pub fn options(&self) -> Vec<Nla> {
        let mut glob = Vec::with_capacity(GLOB_LEN);
        for word in [PROTOVER, self.rate2quantum, self.default_class, 0, 0] {
            glob.extend_from_slice(&word.to_ne_bytes());
        }
        let mut attrs = vec![Nla::new(TCA_HTB_INIT, glob)];
        if let Some(qlen) = self.direct_qlen {
            attrs.push(Nla::u32(TCA_HTB_DIRECT_QLEN, qlen));
        }
        attrs
    }

    /// What a dump's qdisc options say.
    pub fn parse(options: &[Nla]) -> Result<HtbQdiscDump, DecodeError> {
        let glob = attr_struct(options, TCA_HTB_INIT, "TCA_HTB_INIT", GLOB_LEN)?;
        Ok(HtbQdiscDump {
            version: u32_at(glob, 0),
            rate2quantum: u32_at(glob, 4),
            default_class: u32_at(glob, 8),
            direct_packets: u32_at(glob, 16),
            direct_qlen: attr_u32(options, TCA_HTB_DIRECT_QLEN),
        })
    }
}

/// An `htb` qdisc as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbQdiscDump {
    /// What the kernel answers as its version: `HTB_VER`, the protocol version
    /// (`TC_HTB_PROTOVER`, 3) in the upper 16 bits and its own minor below (`0x30011`); a
    /// request carries the protocol version alone.
    pub version: u32,
    /// `r2q`.
    pub rate2quantum: u32,
    /// The default class's minor number.
    pub default_class: u32,
    /// Packets sent unshaped through the direct queue so far.
    pub direct_packets: u32,
    /// The direct queue's length.
    pub direct_qlen: Option<u32>,
}

/// A class's settings (bytes and bytes per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbClass {
    /// The assured rate.
    pub rate: u64,
    /// The ceiling (borrowing from the parent stops here); at least `rate`.
    pub ceil: u64,
    /// Bytes sent at once at `rate`.
    pub burst: u32,
    /// Bytes sent at once at `ceil`.
    pub cburst: u32,
    /// Bytes dequeued per round; 0 lets the kernel derive it from the rate and `r2q`.
    pub quantum: u32,
    /// Priority among siblings (0 first).
    pub prio: u32,
}

impl HtbClass {
    /// The attributes nested in `TCA_OPTIONS` of the class.
    #[must_use]
    pub fn options(&self) -> Vec<Nla> {
        let mut opt = Vec::with_capacity(OPT_LEN);
        opt.extend_from_slice(&RateSpec::ethernet(self.rate).to_bytes());
        opt.extend_from_slice(&RateSpec::ethernet(self.ceil).to_bytes());
        let buffer = xmit_ticks(self.rate, u64::from(self.burst));
        let cbuffer = xmit_ticks(self.ceil, u64::from(self.cburst));
        for word in [buffer, cbuffer, self.quantum, 0, self.prio] {
            opt.extend_from_slice(&word.to_ne_bytes());
        }
        let mut attrs = vec![Nla::new(TCA_HTB_PARMS, opt)];
        if RateSpec::needs_rate64(self.rate) {
            attrs.push(Nla::u64(TCA_HTB_RATE64, self.rate));
        }
        if RateSpec::needs_rate64(self.ceil) {
            attrs.push(Nla::u64(TCA_HTB_CEIL64, self.ceil));
        }
        attrs
    }

    /// What a dump's class options say.
    pub fn parse(options: &[Nla]) -> Result<HtbClassDump, DecodeError> {
        let opt = attr_struct(options, TCA_HTB_PARMS, "TCA_HTB_PARMS", OPT_LEN)?;
        let rate = RateSpec::from_bytes(opt)?;
        let ceil = RateSpec::from_bytes(&opt[RATESPEC_LEN..])?;
        let words = 2 * RATESPEC_LEN;
        Ok(HtbClassDump {
            rate: attr_u64(options, TCA_HTB_RATE64).unwrap_or(u64::from(rate.rate)),
            ceil: attr_u64(options, TCA_HTB_CEIL64).unwrap_or(u64::from(ceil.rate)),
            buffer_ticks: u32_at(opt, words),
            cbuffer_ticks: u32_at(opt, words + 4),
            quantum: u32_at(opt, words + 8),
            level: u32_at(opt, words + 12),
            prio: u32_at(opt, words + 16),
        })
    }
}

/// An `htb` class as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtbClassDump {
    /// Bytes per second.
    pub rate: u64,
    /// Bytes per second.
    pub ceil: u64,
    /// The rate bucket in psched ticks.
    pub buffer_ticks: u32,
    /// The ceiling bucket in psched ticks.
    pub cbuffer_ticks: u32,
    /// The quantum the kernel uses (derived when 0 was asked).
    pub quantum: u32,
    /// The class's level in the tree (0: a leaf).
    pub level: u32,
    /// Priority.
    pub prio: u32,
}

impl HtbClassDump {
    /// The rate bucket in bytes, as `tc` prints it.
    #[must_use]
    pub fn burst(&self) -> u64 {
        xmit_bytes(self.rate, self.buffer_ticks)
    }

    /// The ceiling bucket in bytes.
    #[must_use]
    pub fn cburst(&self) -> u64 {
        xmit_bytes(self.ceil, self.cbuffer_ticks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_qdisc_options_carry_version_3_and_the_default_class() {
        let qdisc = HtbQdisc { default_class: 1, rate2quantum: 10, direct_qlen: Some(1000) };
        let attrs = qdisc.options();
        assert_eq!(attrs[0].value.len(), GLOB_LEN);
        let dump = HtbQdisc::parse(&attrs).unwrap();
        assert_eq!((dump.version, dump.rate2quantum, dump.default_class), (3, 10, 1));
        assert_eq!(dump.direct_qlen, Some(1000));
    }

    #[test]
    fn a_class_round_trips_with_64_bit_ceilings() {
        let class = HtbClass {
            rate: 6_250_000,
            ceil: 6_000_000_000,
            burst: 1 << 17,
            cburst: 1 << 20,
            quantum: 0,
            prio: 2,
        };
        let attrs = class.options();
        assert_eq!(attrs[0].value.len(), 44, "sizeof(struct tc_htb_opt)");
        assert_eq!(
            attrs.iter().map(|a| a.kind).collect::<Vec<_>>(),
            [TCA_HTB_PARMS, TCA_HTB_CEIL64]
        );
        let dump = HtbClass::parse(&attrs).unwrap();
        assert_eq!((dump.rate, dump.ceil, dump.prio), (6_250_000, 6_000_000_000, 2));
        assert!(dump.burst().abs_diff(1 << 17) <= 1, "burst {}", dump.burst());
        // Ticks round down: at 6 GB/s one tick is 384 bytes.
        assert!(dump.cburst().abs_diff(1 << 20) < 400, "cburst {}", dump.cburst());
    }
}
