//! Kubernetes quantities (`100m`, `1Gi`, `1e3`, `256`) as numbers, for the capacity
//! request policies of devices.

use serde_json::Value;

/// Parses a Kubernetes quantity (`100m`, `1Gi`, `1e3`, `256`) into a number.
pub(crate) fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let suffixes: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, factor) in suffixes {
        if let Some(num) = s.strip_suffix(suffix) {
            return parse_decimal(num).map(|n| n * factor);
        }
    }
    if let Some((mantissa, exp)) = s.split_once(['e', 'E']) {
        let exp: i32 = exp.parse().ok()?;
        return parse_decimal(mantissa).map(|n| n * 10f64.powi(exp));
    }
    parse_decimal(s)
}

fn parse_decimal(s: &str) -> Option<f64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || digits.matches('.').count() > 1
    {
        return None;
    }
    s.parse().ok()
}

pub(super) fn quantity(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::String(s) => parse_quantity(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}
