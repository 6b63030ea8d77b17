//! Bandwidth as a Kubernetes quantity of bits per second (DESIGN §2, §3 `bandwidth`, issue 35):
//! the published `netclaim.dev/bandwidth` capacity of a shared parent, the `bandwidth` section
//! of a `NetworkConfig`, and the egress ceiling an allocation resolves to. Pure data.
//!
//! # Units
//!
//! Values are written as Kubernetes quantities and mean **bits per second**. The quantity
//! grammar is the API server's: decimal suffixes (`k` = 10³, `M` = 10⁶, `G` = 10⁹, `T`, `P`,
//! `E`), binary suffixes (`Ki` = 2¹⁰, `Mi`, `Gi`, …), exponents (`1e9`) and decimal fractions
//! (`1.5G`) are all accepted, because the scheduler compares the published capacity and the
//! requests as numbers whatever their spelling. Network rates are decimal (a link's `speed`
//! is in 10⁶ bit/s, the request policy's step is `1M`), so write `500M`, `2G`; `10Gi` is
//! 10 737 418 240 bit/s, which the scheduler rounds up to the next `1M` step. A value must be
//! a whole number of bits per second: `500m` (milli) is refused, which catches the common
//! `m`-for-`M` slip. This driver writes decimal suffixes only ([`BitsPerSecond`]'s `Display`).
//!
//! # Who reads what (for the enforcement side)
//!
//! - [`BandwidthConfig`]: the config section as written (`bandwidth: {limit, ingress}`).
//! - [`ResolvedBandwidth`]: `ResolvedNetworkConfig::bandwidth` after validation, with the
//!   claim service's [`EgressCeiling`] filled in at prepare; it is persisted in the prepared
//!   claim record and reaches the attach as `AttachRequest::config.bandwidth`. The attach and
//!   the CreateContainer gate enforce `ceiling` (never `limit` directly: the ceiling already
//!   chose between the allocation's consumed capacity and the config limit) and police
//!   ingress at the same rate when `ingress` is [`IngressPolicy::Police`].

use std::fmt;

use serde::{Deserialize, Serialize};

/// The consumable capacity of a shared parent in bits per second (DESIGN §2). Qualified while
/// Kubernetes 1.34–1.37 are supported (decision 0023): their schedulers match capacity names
/// exactly.
pub const BANDWIDTH_CAPACITY: &str = "netclaim.dev/bandwidth";

/// The request policy's step: requests are rounded up to whole megabits per second, the unit
/// a link reports its speed in and a VF's `max_tx_rate` is set in.
pub const BANDWIDTH_STEP: BitsPerSecond = BitsPerSecond(1_000_000);

/// A rate in bits per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct BitsPerSecond(pub u64);

/// Why a text is not a bandwidth.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BandwidthParseError {
    /// Not a Kubernetes quantity.
    #[error(
        "not a quantity (a number with an optional suffix: k, M, G, T, Ki, Mi, Gi, e6; e.g. 500M)"
    )]
    Syntax,
    /// Negative.
    #[error("must not be negative")]
    Negative,
    /// Not a whole number of bits per second (`500m` is half a bit per second: `m` is milli).
    #[error("not a whole number of bits per second (a lower-case m is milli; megabits are M)")]
    Fraction,
    /// More than `u64::MAX` bits per second.
    #[error("too large")]
    TooLarge,
}

impl BitsPerSecond {
    /// Zero.
    pub const ZERO: Self = Self(0);

    /// Megabits per second (a link's sysfs `speed`, a VF's `max_tx_rate`).
    #[must_use]
    pub const fn from_mbps(mbps: u64) -> Self {
        Self(mbps.saturating_mul(1_000_000))
    }

    /// The rate in bits per second.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The rate in whole megabits per second, rounded up (a VF's `max_tx_rate` unit).
    #[must_use]
    pub const fn mbps_ceil(self) -> u64 {
        self.0.div_ceil(1_000_000)
    }

    /// The rate in bytes per second, rounded up (what qdiscs and EDT pacing count in).
    #[must_use]
    pub const fn bytes_per_second(self) -> u64 {
        self.0.div_ceil(8)
    }

    /// Parses a Kubernetes quantity (see the module docs) as bits per second.
    pub fn parse(text: &str) -> Result<Self, BandwidthParseError> {
        let text = text.trim();
        let unsigned = match text.as_bytes().first() {
            Some(b'-') => {
                // "-0" is zero to the API server; anything else below zero is refused.
                return match Self::parse(&text[1..]) {
                    Ok(Self(0)) => Ok(Self(0)),
                    Ok(_) | Err(BandwidthParseError::Fraction) => {
                        Err(BandwidthParseError::Negative)
                    }
                    Err(e) => Err(e),
                };
            }
            Some(b'+') => &text[1..],
            _ => text,
        };
        let number_end =
            unsigned.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(unsigned.len());
        let (number, suffix) = unsigned.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(BandwidthParseError::Syntax);
        }
        // value = mantissa / 10^scale · base · 10^exponent, computed exactly in u128.
        let digits = format!("{whole}{fraction}");
        let digits = digits.trim_start_matches('0');
        if digits.len() > 38 {
            return Err(BandwidthParseError::TooLarge);
        }
        let mantissa: u128 = if digits.is_empty() {
            0
        } else {
            digits.parse().map_err(|_| BandwidthParseError::Syntax)?
        };
        let scale = i32::try_from(fraction.len()).map_err(|_| BandwidthParseError::TooLarge)?;
        let (base, exponent) = suffix_factor(suffix).ok_or(BandwidthParseError::Syntax)?;
        let mut numerator = mantissa.checked_mul(base).ok_or(BandwidthParseError::TooLarge)?;
        let net = exponent - scale;
        if net >= 0 {
            for _ in 0..net {
                numerator = numerator.checked_mul(10).ok_or(BandwidthParseError::TooLarge)?;
            }
        } else {
            for _ in 0..(-net) {
                if numerator % 10 != 0 {
                    return Err(BandwidthParseError::Fraction);
                }
                numerator /= 10;
            }
        }
        u64::try_from(numerator).map(Self).map_err(|_| BandwidthParseError::TooLarge)
    }
}

/// `(binary base, decimal exponent)` of a quantity suffix.
fn suffix_factor(suffix: &str) -> Option<(u128, i32)> {
    Some(match suffix {
        "" => (1, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        exponent => {
            let digits = exponent.strip_prefix(['e', 'E'])?;
            let value: i32 = digits.parse().ok()?;
            if !(-30..=30).contains(&value) {
                return None;
            }
            (1, value)
        }
    })
}

impl fmt::Display for BitsPerSecond {
    /// The shortest exact decimal quantity (`10G`, `1500M`, `999`), as the API server's
    /// canonical form writes a whole number.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SUFFIXES: [(&str, u64); 6] = [
            ("E", 1_000_000_000_000_000_000),
            ("P", 1_000_000_000_000_000),
            ("T", 1_000_000_000_000),
            ("G", 1_000_000_000),
            ("M", 1_000_000),
            ("k", 1_000),
        ];
        if self.0 != 0 {
            for (suffix, factor) in SUFFIXES {
                if self.0.is_multiple_of(factor) {
                    return write!(f, "{}{suffix}", self.0 / factor);
                }
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for BitsPerSecond {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for BitsPerSecond {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = QuantityText::deserialize(deserializer)?;
        Self::parse(&text.0).map_err(serde::de::Error::custom)
    }
}

/// A quantity as written in a config or a PodNetwork: a string (`"500M"`) or a plain
/// integer (`500000000`), kept as text so that validation can name the field and the value
/// when it is not a bandwidth.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QuantityText(pub String);

impl QuantityText {
    /// The bandwidth it spells.
    pub fn parse(&self) -> Result<BitsPerSecond, BandwidthParseError> {
        BitsPerSecond::parse(&self.0)
    }
}

impl From<&str> for QuantityText {
    fn from(text: &str) -> Self {
        Self(text.to_owned())
    }
}

impl fmt::Display for QuantityText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for QuantityText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for QuantityText {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = QuantityText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity (\"500M\") or a whole number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<QuantityText, E> {
                Ok(QuantityText(v.to_owned()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<QuantityText, E> {
                Ok(QuantityText(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<QuantityText, E> {
                Ok(QuantityText(v.to_string()))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// Policing of the pod interface's ingress (`bandwidth.ingress`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IngressPolicy {
    /// Ingress is not limited (the default).
    #[default]
    None,
    /// Packets arriving above the egress ceiling's rate are dropped (the eBPF program on the
    /// pod interface's ingress).
    Police,
}

/// The `bandwidth` section of a `NetworkConfig` as written (DESIGN §3); every field optional
/// so that entries merge field by field.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BandwidthConfig {
    /// The egress ceiling of an exclusive device (a VF's `max_tx_rate`), or a best-effort
    /// claim's own ceiling on a shared parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<QuantityText>,
    /// Ingress policing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<IngressPolicy>,
}

impl BandwidthConfig {
    /// Applies a later entry on top of this one, field by field.
    pub fn merge(&mut self, later: BandwidthConfig) {
        let BandwidthConfig { limit, ingress } = later;
        if limit.is_some() {
            self.limit = limit;
        }
        if ingress.is_some() {
            self.ingress = ingress;
        }
    }
}

/// Where an egress ceiling comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum CeilingSource {
    /// The allocation's consumed `netclaim.dev/bandwidth` capacity on a shared parent
    /// (`status.allocation.devices.results[].consumedCapacity`): the scheduler counted it.
    ConsumedCapacity,
    /// The config's `bandwidth.limit`: an exclusive device, a best-effort claim on a shared
    /// parent, or a limit below what the claim was allocated. Not counted by the scheduler.
    ConfigLimit,
}

impl CeilingSource {
    /// The name written in the claim status and logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConsumedCapacity => "consumedCapacity",
            Self::ConfigLimit => "bandwidth.limit",
        }
    }
}

/// The rate the pod interface's egress is held to, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressCeiling {
    /// The ceiling (never zero: no ceiling is `None`).
    pub rate: BitsPerSecond,
    /// Where it comes from.
    pub source: CeilingSource,
}

/// The `bandwidth` of a validated config (`ResolvedNetworkConfig::bandwidth`). Present when
/// the config has a `bandwidth` section or the allocation consumed bandwidth.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedBandwidth {
    /// `bandwidth.limit`, parsed (validated: above zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<BitsPerSecond>,
    /// `bandwidth.ingress`.
    #[serde(default)]
    pub ingress: IngressPolicy,
    /// What the node enforces on egress: the smaller of the allocation's consumed capacity
    /// (shared parents, when above zero) and `limit`. Set by validation from `limit` and
    /// lowered to the consumed capacity by the claim service at prepare
    /// (`claims::bandwidth`). `None`: no ceiling (a best-effort claim without a limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<EgressCeiling>,
    /// What the allocation consumed of the parent's `netclaim.dev/bandwidth` (above zero),
    /// whatever the ceiling: the amount the scheduler counted, which the node sums per parent
    /// across networks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed: Option<BitsPerSecond>,
}

impl ResolvedBandwidth {
    /// The resolved section for a config `limit` alone (before the allocation is known).
    #[must_use]
    pub fn from_limit(limit: Option<BitsPerSecond>, ingress: IngressPolicy) -> Self {
        let ceiling = limit
            .filter(|rate| *rate > BitsPerSecond::ZERO)
            .map(|rate| EgressCeiling { rate, source: CeilingSource::ConfigLimit });
        Self { limit, ingress, ceiling, consumed: None }
    }

    /// Applies the allocation's consumed bandwidth: a consumed amount above zero is the
    /// ceiling unless `limit` is lower (the claim holds itself below its share).
    #[must_use]
    pub fn with_consumed(mut self, consumed: BitsPerSecond) -> Self {
        if consumed == BitsPerSecond::ZERO {
            return self;
        }
        self.consumed = Some(consumed);
        let capacity = EgressCeiling { rate: consumed, source: CeilingSource::ConsumedCapacity };
        self.ceiling = Some(match self.ceiling {
            Some(limit) if limit.rate <= consumed => limit,
            _ => capacity,
        });
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_as_exact_bits_per_second() {
        let cases = [
            ("500M", 500_000_000),
            ("2G", 2_000_000_000),
            ("10G", 10_000_000_000),
            ("1.5G", 1_500_000_000),
            ("10Gi", 10_737_418_240),
            ("1Mi", 1_048_576),
            ("1e9", 1_000_000_000),
            ("1E6", 1_000_000),
            ("2500k", 2_500_000),
            ("0", 0),
            ("-0", 0),
            ("+7", 7),
            ("123", 123),
            ("0.001k", 1),
            ("1000m", 1),
        ];
        for (text, bits) in cases {
            assert_eq!(BitsPerSecond::parse(text), Ok(BitsPerSecond(bits)), "{text}");
        }
    }

    #[test]
    fn non_bandwidths_are_refused_with_the_reason() {
        let cases = [
            ("500m", BandwidthParseError::Fraction),
            ("0.5", BandwidthParseError::Fraction),
            ("-1M", BandwidthParseError::Negative),
            ("fast", BandwidthParseError::Syntax),
            ("", BandwidthParseError::Syntax),
            ("10 G", BandwidthParseError::Syntax),
            ("10Gbps", BandwidthParseError::Syntax),
            ("1.2.3", BandwidthParseError::Syntax),
            ("100E", BandwidthParseError::TooLarge),
            ("99999999999999999999999999999999999999999", BandwidthParseError::TooLarge),
        ];
        for (text, error) in cases {
            assert_eq!(BitsPerSecond::parse(text), Err(error), "{text}");
        }
    }

    #[test]
    fn display_is_the_shortest_exact_decimal_quantity_and_parses_back() {
        for (bits, text) in [
            (10_000_000_000, "10G"),
            (1_500_000_000, "1500M"),
            (1_000_000, "1M"),
            (999, "999"),
            (0, "0"),
            (10_737_418_240, "10737418240"),
        ] {
            assert_eq!(BitsPerSecond(bits).to_string(), text);
            assert_eq!(BitsPerSecond::parse(text), Ok(BitsPerSecond(bits)));
        }
        assert_eq!(BitsPerSecond::from_mbps(10_000), BitsPerSecond(10_000_000_000));
        assert_eq!(BitsPerSecond(1_000_001).mbps_ceil(), 2);
        assert_eq!(BitsPerSecond(9).bytes_per_second(), 2);
    }

    #[test]
    fn config_section_reads_strings_and_integers_and_refuses_unknown_fields() {
        let section: BandwidthConfig =
            serde_json::from_str(r#"{"limit": "500M", "ingress": "police"}"#).unwrap();
        assert_eq!(section.limit, Some(QuantityText("500M".into())));
        assert_eq!(section.ingress, Some(IngressPolicy::Police));
        let section: BandwidthConfig = serde_json::from_str(r#"{"limit": 1000000}"#).unwrap();
        assert_eq!(section.limit.unwrap().parse(), Ok(BitsPerSecond(1_000_000)));
        assert!(serde_json::from_str::<BandwidthConfig>(r#"{"rate": "1M"}"#).is_err());
        assert!(serde_json::from_str::<BandwidthConfig>(r#"{"ingress": "shape"}"#).is_err());
    }

    #[test]
    fn the_ceiling_is_the_lower_of_consumed_capacity_and_limit() {
        let m = |n| BitsPerSecond::from_mbps(n);
        let none = ResolvedBandwidth::from_limit(None, IngressPolicy::None);
        assert_eq!(none.ceiling, None, "best effort without a limit has no ceiling");
        assert_eq!(none.with_consumed(BitsPerSecond::ZERO).ceiling, None);
        let consumed = none.with_consumed(m(500)).ceiling.unwrap();
        assert_eq!((consumed.rate, consumed.source), (m(500), CeilingSource::ConsumedCapacity));
        let limited = ResolvedBandwidth::from_limit(Some(m(100)), IngressPolicy::Police);
        assert_eq!(limited.ceiling.unwrap().source, CeilingSource::ConfigLimit);
        let lower_limit = limited.with_consumed(m(500)).ceiling.unwrap();
        assert_eq!((lower_limit.rate, lower_limit.source), (m(100), CeilingSource::ConfigLimit));
        let lower_share = limited.with_consumed(m(50)).ceiling.unwrap();
        assert_eq!(
            (lower_share.rate, lower_share.source),
            (m(50), CeilingSource::ConsumedCapacity)
        );
        let round = serde_json::to_value(limited.with_consumed(m(50))).unwrap();
        assert_eq!(
            round,
            serde_json::json!({"limit": "100M", "ingress": "police",
                "ceiling": {"rate": "50M", "source": "consumedCapacity"}, "consumed": "50M"})
        );
        assert_eq!(
            serde_json::from_value::<ResolvedBandwidth>(round).unwrap(),
            limited.with_consumed(m(50))
        );
    }
}
