//! `tbf`: one token bucket in front of a byte-limited FIFO (`net/sched/sch_tbf.c`).
//!
//! Sent as iproute2's `tc qdisc add ... tbf rate R burst B limit L` sends it: `TCA_TBF_PARMS`
//! (`struct tc_tbf_qopt`: the rate, no peak rate, the queue limit in bytes and the bucket as
//! psched ticks), `TCA_TBF_BURST` (the bucket in bytes, which the kernel prefers to the ticks
//! when present) and `TCA_TBF_RATE64` from 2^32 bytes/s up. No rate table: the rate spec
//! names the Ethernet link layer. A dump answers `TCA_TBF_PARMS` (with the bucket as ticks the
//! kernel recomputed from the bytes) and `TCA_TBF_RATE64` when the rate needs it.

use crate::nla::Nla;
use crate::rate::{RATESPEC_LEN, RateSpec, xmit_bytes, xmit_ticks};
use crate::{DecodeError, attr_struct, attr_u64, u32_at};

/// The qdisc kind.
pub const KIND: &str = "tbf";
/// `TCA_TBF_PARMS`.
pub const TCA_TBF_PARMS: u16 = 1;
/// `TCA_TBF_RATE64`.
pub const TCA_TBF_RATE64: u16 = 4;
/// `TCA_TBF_BURST`.
pub const TCA_TBF_BURST: u16 = 6;
/// `sizeof(struct tc_tbf_qopt)`: two rate specs and three `u32`.
pub const QOPT_LEN: usize = 2 * RATESPEC_LEN + 12;

/// A token bucket's settings (bytes and bytes per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tbf {
    /// The rate tokens arrive at, bytes per second.
    pub rate: u64,
    /// The bucket's size in bytes: what may leave at once after a pause. A packet larger than
    /// it is segmented (GSO) or dropped, so it must hold at least one GSO packet.
    pub burst: u32,
    /// The FIFO behind the bucket, in bytes; beyond it packets are dropped.
    pub limit: u32,
}

impl Tbf {
    /// The attributes nested in `TCA_OPTIONS`.
    #[must_use]
    pub fn options(&self) -> Vec<Nla> {
        let mut qopt = Vec::with_capacity(QOPT_LEN);
        qopt.extend_from_slice(&RateSpec::ethernet(self.rate).to_bytes());
        qopt.extend_from_slice(&RateSpec::default().to_bytes());
        qopt.extend_from_slice(&self.limit.to_ne_bytes());
        qopt.extend_from_slice(&xmit_ticks(self.rate, u64::from(self.burst)).to_ne_bytes());
        qopt.extend_from_slice(&0u32.to_ne_bytes());
        let mut attrs = vec![Nla::new(TCA_TBF_PARMS, qopt), Nla::u32(TCA_TBF_BURST, self.burst)];
        if RateSpec::needs_rate64(self.rate) {
            attrs.push(Nla::u64(TCA_TBF_RATE64, self.rate));
        }
        attrs
    }

    /// What a dump's `TCA_OPTIONS` attributes say.
    pub fn parse(options: &[Nla]) -> Result<TbfDump, DecodeError> {
        let qopt = attr_struct(options, TCA_TBF_PARMS, "TCA_TBF_PARMS", QOPT_LEN)?;
        let spec = RateSpec::from_bytes(qopt)?;
        let rate = attr_u64(options, TCA_TBF_RATE64).unwrap_or(u64::from(spec.rate));
        let limit = u32_at(qopt, 2 * RATESPEC_LEN);
        let buffer = u32_at(qopt, 2 * RATESPEC_LEN + 4);
        Ok(TbfDump { rate, limit, buffer_ticks: buffer, linklayer: spec.linklayer })
    }
}

/// A `tbf` qdisc as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TbfDump {
    /// Bytes per second.
    pub rate: u64,
    /// The FIFO's limit in bytes.
    pub limit: u32,
    /// The bucket in psched ticks (`tc_tbf_qopt.buffer`).
    pub buffer_ticks: u32,
    /// The rate spec's link layer.
    pub linklayer: u8,
}

impl TbfDump {
    /// The bucket in bytes, as `tc` prints it (`burst`): the ticks at the rate, rounded down.
    #[must_use]
    pub fn burst(&self) -> u64 {
        xmit_bytes(self.rate, self.buffer_ticks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nla;

    #[test]
    fn the_options_carry_the_qopt_the_burst_and_no_rate64_below_4_gib() {
        let tbf = Tbf { rate: 62_500_000, burst: 262_144, limit: 3_125_000 };
        let attrs = nla::decode(&nla::encode(&tbf.options())).unwrap();
        assert_eq!(
            attrs.iter().map(|a| a.kind).collect::<Vec<_>>(),
            [TCA_TBF_PARMS, TCA_TBF_BURST]
        );
        assert_eq!(attrs[0].value.len(), 36, "sizeof(struct tc_tbf_qopt)");
        let dump = Tbf::parse(&attrs).unwrap();
        assert_eq!((dump.rate, dump.limit, dump.linklayer), (62_500_000, 3_125_000, 1));
        // 262144 B at 62.5 MB/s = 4194304 ns = 65536 ticks exactly.
        assert_eq!(dump.buffer_ticks, 65_536);
        assert_eq!(dump.burst(), 262_144);
    }

    #[test]
    fn a_rate_of_4_gib_per_second_or_more_travels_in_rate64() {
        let tbf = Tbf { rate: 5_000_000_000, burst: 1 << 20, limit: 1 << 24 };
        let attrs = tbf.options();
        assert!(attrs.iter().any(|a| a.kind == TCA_TBF_RATE64));
        assert_eq!(u32_at(&attrs[0].value, 8), u32::MAX, "the 32-bit field saturates");
        assert_eq!(Tbf::parse(&attrs).unwrap().rate, 5_000_000_000);
    }

    #[test]
    fn a_dump_without_parms_is_an_error() {
        assert_eq!(Tbf::parse(&[]), Err(DecodeError::Missing("TCA_TBF_PARMS")));
        let short = [Nla::new(TCA_TBF_PARMS, vec![0; 20])];
        assert!(matches!(Tbf::parse(&short), Err(DecodeError::Short { .. })));
    }
}
