//! Exact Kubernetes quantities (`250m`, `1Gi`, `1e3`) for capacity accounting and CEL.
//!
//! Values are held as signed nano-units in an `i128`, which covers every quantity the API
//! server accepts (up to `Ei` with nine decimal places) without floating-point rounding, so
//! capacity sums never drift.

use std::fmt;

/// A parsed quantity in nano-units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity(i128);

const NANO: i128 = 1_000_000_000;

/// The text is not a Kubernetes quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid quantity {0:?}: expected a number with an optional suffix (m, k, M, G, Ki, Mi, Gi, e3, …)"
)]
pub struct QuantityError(pub String);

impl Quantity {
    /// Zero.
    pub const ZERO: Self = Self(0);

    /// Parses `text` (the API's quantity syntax; fractions below one nano-unit round up,
    /// as the API server does).
    pub fn parse(text: &str) -> Result<Self, QuantityError> {
        let bad = || QuantityError(text.to_owned());
        let trimmed = text.trim();
        let (negative, unsigned) = match trimmed.as_bytes().first() {
            Some(b'-') => (true, &trimmed[1..]),
            Some(b'+') => (false, &trimmed[1..]),
            _ => (false, trimmed),
        };
        let number_end =
            unsigned.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(unsigned.len());
        let (number, suffix) = unsigned.split_at(number_end);
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && fraction.is_empty() {
            return Err(bad());
        }
        // mantissa / 10^scale is the number.
        let digits = format!("{whole}{fraction}");
        let mantissa: i128 = digits.parse().map_err(|_| bad())?;
        let scale = i32::try_from(fraction.len()).map_err(|_| bad())?;
        let (base, exponent): (i128, i32) = match suffix {
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
            other => {
                let exp = other.strip_prefix(['e', 'E']).ok_or_else(bad)?;
                (1, exp.parse::<i32>().map_err(|_| bad())?)
            }
        };
        // nano-units = mantissa * base * 10^(exponent + 9 - scale)
        let shift = exponent + 9 - scale;
        let scaled = mantissa.checked_mul(base).ok_or_else(bad)?;
        let nanos = if shift >= 0 {
            let factor = 10_i128.checked_pow(shift.unsigned_abs()).ok_or_else(bad)?;
            scaled.checked_mul(factor).ok_or_else(bad)?
        } else {
            let divisor = 10_i128.checked_pow(shift.unsigned_abs()).ok_or_else(bad)?;
            // Round up: a request for 1.0000000001 must not be satisfied by 1.
            (scaled + divisor - 1) / divisor
        };
        Ok(Self(if negative { -nanos } else { nanos }))
    }

    /// Nano-units.
    #[must_use]
    pub fn nanos(self) -> i128 {
        self.0
    }

    /// From nano-units.
    #[must_use]
    pub fn from_nanos(nanos: i128) -> Self {
        Self(nanos)
    }

    /// From a whole number.
    #[must_use]
    pub fn from_int(value: i64) -> Self {
        Self(i128::from(value) * NANO)
    }

    /// The value as a whole number when it is one and fits an `i64`.
    #[must_use]
    pub fn as_integer(self) -> Option<i64> {
        if self.0 % NANO == 0 { i64::try_from(self.0 / NANO).ok() } else { None }
    }

    /// Sum, saturating (quantities near the `i128` limit are not real capacities).
    #[must_use]
    pub fn saturating_add(self, other: Self) -> Self {
        Self(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Quantity {
    /// Canonical-enough form: a whole number with the largest decimal suffix that keeps it
    /// exact (`8G`, `1500M`, `256`, as the API server writes a decimal quantity), else
    /// milli-units, else nano-units.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SUFFIXES: [(&str, i128); 6] = [
            ("E", 1_000_000_000_000_000_000),
            ("P", 1_000_000_000_000_000),
            ("T", 1_000_000_000_000),
            ("G", 1_000_000_000),
            ("M", 1_000_000),
            ("k", 1_000),
        ];
        if self.0 % NANO == 0 {
            let whole = self.0 / NANO;
            if whole != 0 {
                for (suffix, factor) in SUFFIXES {
                    if whole % factor == 0 {
                        return write!(f, "{}{suffix}", whole / factor);
                    }
                }
            }
            write!(f, "{whole}")
        } else if self.0 % 1_000_000 == 0 {
            write!(f, "{}m", self.0 / 1_000_000)
        } else {
            write!(f, "{}n", self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes_exactly() {
        let q = |s: &str| Quantity::parse(s).unwrap();
        assert_eq!(q("1Gi"), Quantity::from_int(1 << 30));
        assert_eq!(q("1G"), Quantity::from_int(1_000_000_000));
        assert_eq!(q("250m").nanos(), 250_000_000);
        assert_eq!(q("1.5k"), Quantity::from_int(1500));
        assert_eq!(q("1e3"), Quantity::from_int(1000));
        assert_eq!(q("-2"), Quantity::from_int(-2));
        assert_eq!(q("0.5Ki"), Quantity::from_int(512));
        assert!(q("1Gi") > q("1G"));
        assert_eq!(q("256").as_integer(), Some(256));
        assert_eq!(q("1.5").as_integer(), None);
    }

    #[test]
    fn rejects_garbage_and_formats() {
        for bad in ["", "Gi", "1x", "1.2.3", "--1", "1ee3"] {
            assert!(Quantity::parse(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(Quantity::parse("1.5").unwrap().to_string(), "1500m");
        assert_eq!(Quantity::parse("2k").unwrap().to_string(), "2k");
        assert_eq!(Quantity::parse("2500M").unwrap().to_string(), "2500M");
        assert_eq!(Quantity::parse("10e9").unwrap().to_string(), "10G");
        assert_eq!(Quantity::parse("1Gi").unwrap().to_string(), "1073741824");
        assert_eq!(Quantity::parse("-3000").unwrap().to_string(), "-3k");
        assert_eq!(Quantity::parse("0").unwrap().to_string(), "0");
        assert_eq!(Quantity::parse("1n").unwrap().to_string(), "1n");
    }
}
