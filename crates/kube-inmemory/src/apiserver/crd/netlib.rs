//! The Kubernetes CEL libraries the `cel` crate lacks, as CRD validation rules use them:
//! IP addresses and CIDRs (`k8s.io/apiserver/pkg/cel/library/{ip,cidr}.go`) and the
//! list functions (`lists.go`).
//!
//! Upstream semantics kept here:
//! - `ip()`/`isIP()`: Go's `netip.ParseAddr`, which rejects IPv4 octets with leading
//!   zeros; zones (`fe80::1%eth0`) and IPv4-mapped IPv6 (`::ffff:1.2.3.4`) are refused.
//! - `cidr()`/`isCIDR()`: `netip.ParsePrefix`; host bits after the prefix are allowed
//!   (`cidr('10.0.0.1/24')` parses, `.masked()` clears them); IPv4-mapped IPv6 refused.
//! - `containsCIDR` compares the masked addresses (the Kubernetes 1.33 fix; earlier
//!   versions only matched subnets starting at the same address).
//! - `ip.isCanonical(s)` errors on a string that is not an IP; true iff `s` is the
//!   address's canonical text (RFC 5952 for IPv6).
//! - `family()` is 4 or 6; `isLinkLocalMulticast`, `isLinkLocalUnicast`,
//!   `isGlobalUnicast` as Go's `netip.Addr` methods.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use cel::common::types::{DYN_TYPE, LIST_TYPE, STRING_TYPE, Type};
use cel::common::value::{CowVal, Val};
use cel::objects::Opaque;
use cel::{DeclarationError, Env, ExecutionError, Value};

/// An IP address in CEL (`net.IP`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CelIp(pub(crate) IpAddr);

impl Opaque for CelIp {
    fn runtime_type_name(&self) -> &'static str {
        "net.IP"
    }
}

/// A CIDR in CEL (`net.CIDR`): the address as written and the prefix length.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct CelCidr {
    /// The address part, host bits included.
    pub(crate) addr: IpAddr,
    /// The prefix length.
    pub(crate) bits: u8,
}

impl Opaque for CelCidr {
    fn runtime_type_name(&self) -> &'static str {
        "net.CIDR"
    }
}

/// Whether an IPv6 address is IPv4-mapped (`::ffff:a.b.c.d`).
fn is_4in6(ip: &Ipv6Addr) -> bool {
    let s = ip.segments();
    s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff
}

/// Go's `netip.ParseAddr` plus the library's refusals. Rust's parsers, like Go's, reject
/// IPv4 octets with leading zeros and zones.
pub(crate) fn parse_ip(s: &str) -> Result<IpAddr, String> {
    let ip: IpAddr = s.parse().map_err(|_| {
        format!("IP Address {s:?} parse error during conversion from string: ParseAddr({s:?}): unable to parse IP")
    })?;
    if let IpAddr::V6(v6) = ip
        && is_4in6(&v6)
    {
        return Err(format!("IPv4-mapped IPv6 address {s:?} is not allowed"));
    }
    Ok(ip)
}

/// Go's `netip.ParsePrefix` (prefix length in decimal without leading zeros, within the
/// family) plus the library's refusal of IPv4-mapped IPv6.
pub(crate) fn parse_cidr(s: &str) -> Result<CelCidr, String> {
    let fail = |why: &str| {
        format!(
            "network address parse error during conversion from string: netip.ParsePrefix({s:?}): {why}"
        )
    };
    let (addr, bits) = s.split_once('/').ok_or_else(|| fail("no '/'"))?;
    let ip: IpAddr = addr.parse().map_err(|_| fail("bad address"))?;
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return Err(fail(&format!("bad bits after slash: {bits:?}")));
    }
    let max = if ip.is_ipv4() { 32 } else { 128 };
    let bits: u8 = bits
        .parse()
        .ok()
        .filter(|b| *b <= max)
        .ok_or_else(|| fail("prefix length out of range"))?;
    if let IpAddr::V6(v6) = ip
        && is_4in6(&v6)
    {
        return Err(format!("IPv4-mapped IPv6 address {s:?} is not allowed"));
    }
    Ok(CelCidr { addr: ip, bits })
}

/// `addr` with the bits after `bits` cleared.
fn mask(addr: IpAddr, bits: u8) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => {
            let m = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & m))
        }
        IpAddr::V6(v6) => {
            let m = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & m))
        }
    }
}

impl CelCidr {
    fn contains(&self, ip: IpAddr) -> bool {
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.bits) == mask(self.addr, self.bits)
    }

    fn contains_cidr(&self, other: &CelCidr) -> bool {
        other.addr.is_ipv4() == self.addr.is_ipv4()
            && self.bits <= other.bits
            && mask(other.addr, self.bits) == mask(self.addr, self.bits)
    }
}

fn error(function: &str, message: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, message)
}

fn opaque(v: impl Opaque) -> Value {
    Value::Opaque(Arc::new(v))
}

fn as_ip<'a>(function: &str, v: &'a Value) -> Result<&'a CelIp, ExecutionError> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<CelIp>(),
        _ => None,
    }
    .ok_or_else(|| error(function, format!("needs an IP address, got {v:?}")))
}

fn as_cidr<'a>(function: &str, v: &'a Value) -> Result<&'a CelCidr, ExecutionError> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<CelCidr>(),
        _ => None,
    }
    .ok_or_else(|| error(function, format!("needs a CIDR, got {v:?}")))
}

fn as_str<'a>(function: &str, v: &'a Value) -> Result<&'a str, ExecutionError> {
    match v {
        Value::String(s) => Ok(s.as_str()),
        other => Err(error(function, format!("needs a string, got {other:?}"))),
    }
}

/// Runs a library function written over [`Value`]s as an `Env` overload.
#[allow(
    clippy::needless_pass_by_value,
    reason = "the overload signature hands arguments over by value"
)]
fn run<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
    f: fn(&[Value]) -> Result<Value, ExecutionError>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let values: Vec<Value> =
        args.iter().map(|a| Value::try_from(a.as_ref())).collect::<Result<_, _>>()?;
    let out = f(&values)?;
    let boxed: Box<dyn Val> = out.try_into()?;
    Ok(CowVal::Owned(boxed))
}

macro_rules! overload {
    ($name:ident, $body:ident) => {
        fn $name<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
            run(args, $body)
        }
    };
}

fn f_ip(a: &[Value]) -> Result<Value, ExecutionError> {
    parse_ip(as_str("ip", &a[0])?).map(|ip| opaque(CelIp(ip))).map_err(|e| error("ip", e))
}
fn f_is_ip(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(parse_ip(as_str("isIP", &a[0])?).is_ok()))
}
fn f_is_canonical(a: &[Value]) -> Result<Value, ExecutionError> {
    let s = as_str("ip.isCanonical", &a[0])?;
    let ip = parse_ip(s).map_err(|e| error("ip.isCanonical", e))?;
    Ok(Value::Bool(ip.to_string() == s))
}
fn f_cidr(a: &[Value]) -> Result<Value, ExecutionError> {
    parse_cidr(as_str("cidr", &a[0])?).map(opaque).map_err(|e| error("cidr", e))
}
fn f_is_cidr(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(parse_cidr(as_str("isCIDR", &a[0])?).is_ok()))
}
fn f_cidr_ip(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(opaque(CelIp(as_cidr("ip", &a[0])?.addr)))
}
fn f_prefix_length(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(i64::from(as_cidr("prefixLength", &a[0])?.bits)))
}
fn f_masked(a: &[Value]) -> Result<Value, ExecutionError> {
    let c = as_cidr("masked", &a[0])?;
    Ok(opaque(CelCidr { addr: mask(c.addr, c.bits), bits: c.bits }))
}
fn f_contains_ip(a: &[Value]) -> Result<Value, ExecutionError> {
    let c = as_cidr("containsIP", &a[0])?;
    let ip = match &a[1] {
        Value::String(s) => parse_ip(s).map_err(|e| error("containsIP", e))?,
        other => as_ip("containsIP", other)?.0,
    };
    Ok(Value::Bool(c.contains(ip)))
}
fn f_contains_cidr(a: &[Value]) -> Result<Value, ExecutionError> {
    let c = as_cidr("containsCIDR", &a[0])?;
    let result = match &a[1] {
        Value::String(s) => c.contains_cidr(&parse_cidr(s).map_err(|e| error("containsCIDR", e))?),
        other => c.contains_cidr(as_cidr("containsCIDR", other)?),
    };
    Ok(Value::Bool(result))
}
fn f_family(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Int(if as_ip("family", &a[0])?.0.is_ipv4() { 4 } else { 6 }))
}
fn f_is_unspecified(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(as_ip("isUnspecified", &a[0])?.0.is_unspecified()))
}
fn f_is_loopback(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(as_ip("isLoopback", &a[0])?.0.is_loopback()))
}
fn f_is_link_local_multicast(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(match as_ip("isLinkLocalMulticast", &a[0])?.0 {
        IpAddr::V4(v4) => v4.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v6) => v6.octets()[0] == 0xff && v6.octets()[1] & 0x0f == 0x02,
    }))
}
fn f_is_link_local_unicast(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::Bool(match as_ip("isLinkLocalUnicast", &a[0])?.0 {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    }))
}
fn f_is_global_unicast(a: &[Value]) -> Result<Value, ExecutionError> {
    let ip = as_ip("isGlobalUnicast", &a[0])?.0;
    let link_local_unicast = match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    let broadcast = matches!(ip, IpAddr::V4(v4) if v4.is_broadcast());
    Ok(Value::Bool(
        !ip.is_unspecified()
            && !ip.is_loopback()
            && !ip.is_multicast()
            && !link_local_unicast
            && !broadcast,
    ))
}
fn f_ip_string(a: &[Value]) -> Result<Value, ExecutionError> {
    Ok(Value::String(Arc::new(as_ip("string", &a[0])?.0.to_string())))
}
fn f_cidr_string(a: &[Value]) -> Result<Value, ExecutionError> {
    let c = as_cidr("string", &a[0])?;
    Ok(Value::String(Arc::new(format!("{}/{}", c.addr, c.bits))))
}

fn list<'a>(function: &str, v: &'a Value) -> Result<&'a [Value], ExecutionError> {
    match v {
        Value::List(l) => Ok(l.as_slice()),
        other => Err(error(function, format!("needs a list, got {other:?}"))),
    }
}

fn compare(function: &str, a: &Value, b: &Value) -> Result<std::cmp::Ordering, ExecutionError> {
    use std::cmp::Ordering;
    let ord = match (a, b) {
        (Value::Int(x), Value::Int(y)) => x.cmp(y),
        (Value::UInt(x), Value::UInt(y)) => x.cmp(y),
        (Value::Float(x), Value::Float(y)) => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Bytes(x), Value::Bytes(y)) => x.cmp(y),
        _ => return Err(error(function, format!("cannot compare {a:?} and {b:?}"))),
    };
    Ok(ord)
}

fn f_is_sorted(a: &[Value]) -> Result<Value, ExecutionError> {
    let items = list("isSorted", &a[0])?;
    for w in items.windows(2) {
        if compare("isSorted", &w[0], &w[1])? == std::cmp::Ordering::Greater {
            return Ok(Value::Bool(false));
        }
    }
    Ok(Value::Bool(true))
}
fn f_sum(a: &[Value]) -> Result<Value, ExecutionError> {
    let items = list("sum", &a[0])?;
    let mut acc = Value::Int(0);
    for (i, item) in items.iter().enumerate() {
        acc = match (&acc, item) {
            (Value::Int(x), Value::Int(y)) => {
                Value::Int(x.checked_add(*y).ok_or_else(|| error("sum", "integer overflow"))?)
            }
            (Value::Int(0), Value::UInt(y)) if i == 0 => Value::UInt(*y),
            (Value::UInt(x), Value::UInt(y)) => {
                Value::UInt(x.checked_add(*y).ok_or_else(|| error("sum", "integer overflow"))?)
            }
            (Value::Int(0), Value::Float(y)) if i == 0 => Value::Float(*y),
            (Value::Float(x), Value::Float(y)) => Value::Float(x + y),
            (_, other) => return Err(error("sum", format!("cannot add {other:?}"))),
        };
    }
    Ok(acc)
}
fn extreme(function: &str, a: &[Value], want: std::cmp::Ordering) -> Result<Value, ExecutionError> {
    let items = list(function, &a[0])?;
    let mut best =
        items.first().ok_or_else(|| error(function, format!("{function} called on empty list")))?;
    for item in &items[1..] {
        if compare(function, item, best)? == want {
            best = item;
        }
    }
    Ok(best.clone())
}
fn f_min(a: &[Value]) -> Result<Value, ExecutionError> {
    extreme("min", a, std::cmp::Ordering::Less)
}
fn f_max(a: &[Value]) -> Result<Value, ExecutionError> {
    extreme("max", a, std::cmp::Ordering::Greater)
}
/// A list index as a CEL int (lists are far shorter than `i64::MAX`).
fn index_int(i: usize) -> i64 {
    i64::try_from(i).unwrap_or(i64::MAX)
}
fn f_index_of(a: &[Value]) -> Result<Value, ExecutionError> {
    let items = list("indexOf", &a[0])?;
    Ok(Value::Int(items.iter().position(|x| *x == a[1]).map_or(-1, index_int)))
}
fn f_last_index_of(a: &[Value]) -> Result<Value, ExecutionError> {
    let items = list("lastIndexOf", &a[0])?;
    Ok(Value::Int(items.iter().rposition(|x| *x == a[1]).map_or(-1, index_int)))
}

overload!(ov_ip, f_ip);
overload!(ov_is_ip, f_is_ip);
overload!(ov_is_canonical, f_is_canonical);
overload!(ov_cidr, f_cidr);
overload!(ov_is_cidr, f_is_cidr);
overload!(ov_cidr_ip, f_cidr_ip);
overload!(ov_prefix_length, f_prefix_length);
overload!(ov_masked, f_masked);
overload!(ov_contains_ip, f_contains_ip);
overload!(ov_contains_cidr, f_contains_cidr);
overload!(ov_family, f_family);
overload!(ov_is_unspecified, f_is_unspecified);
overload!(ov_is_loopback, f_is_loopback);
overload!(ov_is_link_local_multicast, f_is_link_local_multicast);
overload!(ov_is_link_local_unicast, f_is_link_local_unicast);
overload!(ov_is_global_unicast, f_is_global_unicast);
overload!(ov_ip_string, f_ip_string);
overload!(ov_cidr_string, f_cidr_string);
overload!(ov_is_sorted, f_is_sorted);
overload!(ov_sum, f_sum);
overload!(ov_min, f_min);
overload!(ov_max, f_max);
overload!(ov_index_of, f_index_of);
overload!(ov_last_index_of, f_last_index_of);

/// The global function names this library declares (for the compile-time check of
/// rules), beside member functions.
pub(crate) const FUNCTIONS: &[&str] = &[
    "ip",
    "isIP",
    "ip.isCanonical",
    "cidr",
    "isCIDR",
    "prefixLength",
    "masked",
    "containsIP",
    "containsCIDR",
    "family",
    "isUnspecified",
    "isLoopback",
    "isLinkLocalMulticast",
    "isLinkLocalUnicast",
    "isGlobalUnicast",
    "isSorted",
    "sum",
    "min",
    "max",
    "indexOf",
    "lastIndexOf",
];

/// Declares the library on `env` (public as `apiserver::cel_network_library` for code that
/// evaluates Kubernetes CEL outside the server, such as admission policy tests).
pub fn extension(env: &mut Env) -> Result<(), DeclarationError> {
    let ip_t = || Type::new_opaque_type("net.IP");
    let cidr_t = || Type::new_opaque_type("net.CIDR");
    env.add_overload("ip", "string_to_ip", vec![STRING_TYPE], ov_ip)?;
    env.add_overload("isIP", "is_ip", vec![STRING_TYPE], ov_is_ip)?;
    env.add_overload("ip.isCanonical", "ip_is_canonical", vec![STRING_TYPE], ov_is_canonical)?;
    env.add_overload("cidr", "string_to_cidr", vec![STRING_TYPE], ov_cidr)?;
    env.add_overload("isCIDR", "is_cidr", vec![STRING_TYPE], ov_is_cidr)?;
    env.add_overload("string", "ip_to_string", vec![ip_t()], ov_ip_string)?;
    env.add_overload("string", "cidr_to_string", vec![cidr_t()], ov_cidr_string)?;
    env.add_member_overload("ip", "cidr_ip", cidr_t(), vec![], ov_cidr_ip)?;
    env.add_member_overload(
        "prefixLength",
        "cidr_prefix_length",
        cidr_t(),
        vec![],
        ov_prefix_length,
    )?;
    env.add_member_overload("masked", "cidr_masked", cidr_t(), vec![], ov_masked)?;
    env.add_member_overload(
        "containsIP",
        "cidr_contains_ip",
        cidr_t(),
        vec![DYN_TYPE],
        ov_contains_ip,
    )?;
    env.add_member_overload(
        "containsCIDR",
        "cidr_contains_cidr",
        cidr_t(),
        vec![DYN_TYPE],
        ov_contains_cidr,
    )?;
    env.add_member_overload("family", "ip_family", ip_t(), vec![], ov_family)?;
    env.add_member_overload(
        "isUnspecified",
        "ip_is_unspecified",
        ip_t(),
        vec![],
        ov_is_unspecified,
    )?;
    env.add_member_overload("isLoopback", "ip_is_loopback", ip_t(), vec![], ov_is_loopback)?;
    env.add_member_overload(
        "isLinkLocalMulticast",
        "ip_is_link_local_multicast",
        ip_t(),
        vec![],
        ov_is_link_local_multicast,
    )?;
    env.add_member_overload(
        "isLinkLocalUnicast",
        "ip_is_link_local_unicast",
        ip_t(),
        vec![],
        ov_is_link_local_unicast,
    )?;
    env.add_member_overload(
        "isGlobalUnicast",
        "ip_is_global_unicast",
        ip_t(),
        vec![],
        ov_is_global_unicast,
    )?;
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], ov_is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], ov_sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], ov_min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], ov_max)?;
    env.add_member_overload("indexOf", "list_index_of", LIST_TYPE, vec![DYN_TYPE], ov_index_of)?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        ov_last_index_of,
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parsing_follows_go_netip() {
        assert!(parse_ip("10.0.0.1").is_ok());
        assert!(parse_ip("010.0.0.1").is_err(), "leading zeros");
        assert!(parse_ip("fe80::1%eth0").is_err(), "zones");
        assert!(parse_ip("::ffff:1.2.3.4").is_err(), "IPv4-mapped");
        assert!(parse_ip("::1.2.3.4").is_ok(), "IPv4-compatible is a plain IPv6 address");
        assert!(parse_cidr("10.0.0.1/24").is_ok(), "host bits are allowed");
        assert!(parse_cidr("10.0.0.0/33").is_err());
        assert!(parse_cidr("10.0.0.0/024").is_err());
        assert!(parse_cidr("10.0.0.0").is_err());
        assert!(parse_cidr("::ffff:1.2.3.0/120").is_err());
        let c = parse_cidr("192.168.0.0/16").unwrap();
        assert!(c.contains_cidr(&parse_cidr("192.168.10.0/24").unwrap()));
        assert!(c.contains_cidr(&parse_cidr("192.168.0.1/32").unwrap()));
        assert!(!c.contains_cidr(&parse_cidr("192.0.0.0/8").unwrap()));
        assert!(!c.contains(parse_ip("fd00::1").unwrap()));
    }
}
