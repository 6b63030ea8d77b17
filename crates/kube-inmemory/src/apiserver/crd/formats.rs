//! The string `format`s a CustomResourceDefinition schema may use, checked as the real
//! API server checks them (kube-openapi's `strfmt` registry, names compared without
//! dashes). Formats it does not know are ignored, as upstream strips them from schemas.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `s` is valid for `format`. Unknown formats accept everything; `isbn`,
/// `isbn10`, `isbn13` and `creditcard` are accepted unchecked (nothing here needs them).
pub(crate) fn check(format: &str, s: &str) -> bool {
    match format.replace('-', "").as_str() {
        "datetime" => is_date_time(s),
        "date" => s.len() == 10 && s.parse::<k8s_openapi::jiff::civil::Date>().is_ok(),
        "ipv4" => s.parse::<Ipv4Addr>().is_ok(),
        "ipv6" => s.contains(':') && s.parse::<Ipv6Addr>().is_ok(),
        "cidr" => is_cidr(s),
        "mac" => is_mac(s),
        "uuid" => is_uuid(s, None),
        "uuid3" => is_uuid(s, Some('3')),
        "uuid4" => is_uuid(s, Some('4')),
        "uuid5" => is_uuid(s, Some('5')),
        "hostname" => is_hostname(s),
        "byte" => is_base64(s),
        "duration" => is_duration(s),
        "email" => is_email(s),
        "uri" => is_uri(s),
        "hexcolor" => is_hex_color(s),
        "rgbcolor" => is_rgb_color(s),
        "ssn" => is_ssn(s),
        "bsonobjectid" => s.len() == 24 && s.bytes().all(|b| b.is_ascii_hexdigit()),
        "k8sshortname" => crate::apiserver::validation::is_dns_label(s),
        "k8slongname" => is_long_name(s),
        _ => true,
    }
}

/// RFC 3339 with or without fractional seconds and offset (strfmt also accepts a local
/// time without offset).
fn is_date_time(s: &str) -> bool {
    s.parse::<k8s_openapi::jiff::Timestamp>().is_ok()
        || (s.contains('T') && s.parse::<k8s_openapi::jiff::civil::DateTime>().is_ok())
}

/// Go's `net.ParseCIDR`: an address, `/`, a prefix length within the family.
fn is_cidr(s: &str) -> bool {
    let Some((addr, bits)) = s.split_once('/') else { return false };
    let Ok(ip) = addr.parse::<IpAddr>() else { return false };
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return false;
    }
    let max = if ip.is_ipv4() { 32 } else { 128 };
    bits.parse::<u32>().is_ok_and(|b| b <= max)
}

/// Go's `net.ParseMAC`: 6, 8 or 20 octets separated by `:` or `-`, or dotted groups of
/// four hex digits.
fn is_mac(s: &str) -> bool {
    let octets_ok = |sep: char| {
        let parts: Vec<&str> = s.split(sep).collect();
        [6, 8, 20].contains(&parts.len())
            && parts.iter().all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    let dotted_ok = || {
        let parts: Vec<&str> = s.split('.').collect();
        [3, 4, 10].contains(&parts.len())
            && parts.iter().all(|p| p.len() == 4 && p.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    octets_ok(':') || octets_ok('-') || dotted_ok()
}

/// A UUID, any case, hyphens optional, with the version digit when given.
fn is_uuid(s: &str, version: Option<char>) -> bool {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    let hyphens_ok = s.len() == 32
        || (s.len() == 36 && [8, 13, 18, 23].iter().all(|i| s.as_bytes()[*i] == b'-'));
    if hex.len() != 32 || !hyphens_ok || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return false;
    }
    match version {
        None => true,
        Some(v) => {
            let variant_ok = v == '3'
                || matches!(hex.as_bytes()[16].to_ascii_lowercase(), b'8' | b'9' | b'a' | b'b');
            hex.as_bytes()[12] as char == v && variant_ok
        }
    }
}

/// RFC 1034 host names: dot-separated labels of letters, digits and inner dashes.
fn is_hostname(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 255
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Standard base64 with padding.
fn is_base64(s: &str) -> bool {
    if !s.len().is_multiple_of(4) {
        return false;
    }
    let body = s.trim_end_matches('=');
    s.len() - body.len() <= 2
        && body.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'/')
}

/// Go's `time.ParseDuration` (`1h30m`, `-1.5s`, `300ms`, `0`).
fn is_duration(s: &str) -> bool {
    let s = s.strip_prefix(['-', '+']).unwrap_or(s);
    if s == "0" {
        return true;
    }
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(|b| b.is_ascii_digit() || *b == b'.').count();
        if digits == 0
            || rest[..digits].bytes().filter(|b| *b == b'.').count() > 1
            || &rest[..digits] == "."
        {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ns", "us", "µs", "μs", "ms", "s", "m", "h"]
            .iter()
            .filter(|u| rest.starts_with(*u))
            .max_by_key(|u| u.len());
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

fn is_email(s: &str) -> bool {
    let s = s.rsplit_once('<').map_or(s, |(_, addr)| addr.trim_end_matches('>'));
    match s.rsplit_once('@') {
        Some((local, domain)) => {
            !local.is_empty() && !domain.is_empty() && !s.contains(char::is_whitespace)
        }
        None => false,
    }
}

/// Go's `url.ParseRequestURI`: an absolute URI or an absolute path.
fn is_uri(s: &str) -> bool {
    if s.starts_with('/') {
        return !s.contains(char::is_whitespace);
    }
    match s.split_once(':') {
        Some((scheme, rest)) => {
            scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
                && !rest.is_empty()
                && !s.contains(char::is_whitespace)
        }
        None => false,
    }
}

fn is_hex_color(s: &str) -> bool {
    let h = s.strip_prefix('#').unwrap_or(s);
    (h.len() == 3 || h.len() == 6) && h.bytes().all(|b| b.is_ascii_hexdigit())
}

fn is_rgb_color(s: &str) -> bool {
    let Some(inner) = s.strip_prefix("rgb(").and_then(|r| r.strip_suffix(')')) else {
        return false;
    };
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    parts.len() == 3 && parts.iter().all(|p| p.parse::<u8>().is_ok())
}

fn is_ssn(s: &str) -> bool {
    let digits: String = s.chars().filter(char::is_ascii_digit).collect();
    let seps_ok = s.chars().all(|c| c.is_ascii_digit() || c == '-' || c == ' ');
    digits.len() == 9 && seps_ok && s.len() <= 11
}

/// `k8s-long-name`: dot-separated lowercase alphanumeric segments with inner dashes,
/// at most 253 characters.
fn is_long_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn formats() {
        for (format, good, bad) in [
            ("date-time", "2026-01-02T03:04:05Z", "yesterday"),
            ("date-time", "2026-01-02T03:04:05.123456+02:00", "2026-13-02T03:04:05Z"),
            ("date", "2026-01-02", "2026-1-2"),
            ("ipv4", "10.0.0.1", "10.0.0.256"),
            ("ipv6", "fd00::1", "10.0.0.1"),
            ("cidr", "10.0.0.1/24", "10.0.0.0/33"),
            ("mac", "02:00:00:00:00:01", "02:00:00:00:00"),
            ("uuid", "6ba7b810-9dad-11d1-80b4-00c04fd430c8", "6ba7b810-9dad"),
            ("hostname", "node-1.example", "-bad"),
            ("byte", "aGVsbG8=", "aGVsbG8"),
            ("duration", "1h30m", "1x"),
            ("k8s-short-name", "abc-1", "Abc"),
            ("k8s-long-name", "a.b-c", "a..b"),
        ] {
            assert!(check(format, good), "{format} {good}");
            assert!(!check(format, bad), "{format} {bad}");
        }
        assert!(check("some-unknown-format", "anything"));
    }
}
