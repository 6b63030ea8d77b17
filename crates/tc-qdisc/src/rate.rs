//! `struct tc_ratespec` and the psched tick arithmetic the token buckets use.

use crate::{DecodeError, u32_at};

/// `TC_LINKLAYER_ETHERNET`: with a link layer set, the kernel computes transmission times
/// itself (`psched_ratecfg_precompute`) and needs no rate table (`TCA_*_RTAB` is read only
/// when the link layer is `TC_LINKLAYER_UNAWARE`, the pre-2013 iproute2 convention).
pub const LINKLAYER_ETHERNET: u8 = 1;
/// `PSCHED_SHIFT`: one psched tick is `1 << 6` ns.
pub const PSCHED_SHIFT: u32 = 6;
/// `sizeof(struct tc_ratespec)`.
pub const RATESPEC_LEN: usize = 12;

/// `struct tc_ratespec`: a rate in bytes per second (saturated at `u32::MAX`; the full rate
/// travels in a `*_RATE64` attribute) and how packet sizes are accounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateSpec {
    /// `cell_log` (rate tables only; unused with a link layer).
    pub cell_log: u8,
    /// `linklayer` (lower 4 bits).
    pub linklayer: u8,
    /// Bytes added to every packet's size.
    pub overhead: u16,
    /// `cell_align`.
    pub cell_align: i16,
    /// Minimum packet size accounted.
    pub mpu: u16,
    /// Bytes per second, saturated at `u32::MAX`.
    pub rate: u32,
}

impl RateSpec {
    /// An Ethernet rate of `bytes_per_sec` (saturated into the 32-bit field).
    #[must_use]
    pub fn ethernet(bytes_per_sec: u64) -> Self {
        Self {
            linklayer: LINKLAYER_ETHERNET,
            rate: u32::try_from(bytes_per_sec).unwrap_or(u32::MAX),
            ..Self::default()
        }
    }

    /// Whether the rate needs a `*_RATE64` attribute (iproute2 sends one from 2^32 up).
    #[must_use]
    pub fn needs_rate64(bytes_per_sec: u64) -> bool {
        bytes_per_sec >= 1 << 32
    }

    /// The structure's bytes.
    #[must_use]
    pub fn to_bytes(self) -> [u8; RATESPEC_LEN] {
        let mut out = [0; RATESPEC_LEN];
        out[0] = self.cell_log;
        out[1] = self.linklayer;
        out[2..4].copy_from_slice(&self.overhead.to_ne_bytes());
        out[4..6].copy_from_slice(&self.cell_align.to_ne_bytes());
        out[6..8].copy_from_slice(&self.mpu.to_ne_bytes());
        out[8..12].copy_from_slice(&self.rate.to_ne_bytes());
        out
    }

    /// Reads the structure from the start of `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < RATESPEC_LEN {
            return Err(DecodeError::Short {
                name: "tc_ratespec",
                len: bytes.len(),
                want: RATESPEC_LEN,
            });
        }
        Ok(Self {
            cell_log: bytes[0],
            linklayer: bytes[1],
            overhead: u16::from_ne_bytes([bytes[2], bytes[3]]),
            cell_align: i16::from_ne_bytes([bytes[4], bytes[5]]),
            mpu: u16::from_ne_bytes([bytes[6], bytes[7]]),
            rate: u32_at(bytes, 8),
        })
    }
}

/// The psched ticks `bytes` take at `bytes_per_sec` (iproute2's `tc_calc_xmittime`),
/// saturated at `u32::MAX` (which iproute2 refuses as "burst out of range").
#[must_use]
pub fn xmit_ticks(bytes_per_sec: u64, bytes: u64) -> u32 {
    if bytes_per_sec == 0 {
        return u32::MAX;
    }
    let ns = u128::from(bytes) * 1_000_000_000 / u128::from(bytes_per_sec);
    u32::try_from(ns >> PSCHED_SHIFT).unwrap_or(u32::MAX)
}

/// The bytes `ticks` carry at `bytes_per_sec` (iproute2's `tc_calc_xmitsize`), rounded down.
#[must_use]
pub fn xmit_bytes(bytes_per_sec: u64, ticks: u32) -> u64 {
    let ns = u128::from(ticks) << PSCHED_SHIFT;
    u64::try_from(ns * u128::from(bytes_per_sec) / 1_000_000_000).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ratespec_round_trips() {
        let spec = RateSpec {
            cell_log: 3,
            overhead: 24,
            cell_align: -1,
            mpu: 64,
            ..RateSpec::ethernet(125_000)
        };
        assert_eq!(RateSpec::from_bytes(&spec.to_bytes()).unwrap(), spec);
        assert_eq!(spec.to_bytes()[1], LINKLAYER_ETHERNET);
    }

    #[test]
    fn rates_from_4_gib_per_second_saturate_the_32_bit_field() {
        assert_eq!(RateSpec::ethernet(1 << 32).rate, u32::MAX);
        assert!(RateSpec::needs_rate64(1 << 32));
        assert!(!RateSpec::needs_rate64((1 << 32) - 1));
    }

    #[test]
    fn ticks_are_64_ns() {
        // 1 MB at 1 MB/s: one second, 1e9 / 64 ticks.
        assert_eq!(xmit_ticks(1_000_000, 1_000_000), 15_625_000);
        assert_eq!(xmit_bytes(1_000_000, 15_625_000), 1_000_000);
        assert_eq!(xmit_ticks(0, 1), u32::MAX);
    }
}
