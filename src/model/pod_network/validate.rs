//! Validation of a `PodNetwork` spec beyond what the CRD's CEL rules can say, and the
//! overlap test between networks (DESIGN §4).
//!
//! The API server's schema already refuses most malformed input at admission; this check
//! runs again in the controller because a schema can be older than the controller, CEL
//! cannot compare against other objects, and some rules (network and broadcast gateways,
//! excludes inside a subnet, route gateways on a subnet, static ranges that overlap) are
//! awkward in CEL. Every error names the field path from the object root
//! (`spec.ipam.gateways[0]`), since the message lands in the `Ready` condition an
//! administrator reads.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{BlockSize, PodNetworkSpec};
use crate::model::link::{Mode, RouteConfig, check_interface_name};

/// The smallest MTU IPv4 allows (RFC 791).
pub const MIN_MTU: u32 = 68;
/// The largest MTU of an IP packet.
pub const MAX_MTU: u32 = 65535;
/// The smallest MTU IPv6 allows (RFC 8200 §5).
pub const MIN_IPV6_MTU: u32 = 1280;
/// Largest VLAN id (802.1Q: 4095 is reserved).
pub const MAX_VLAN: u16 = 4094;
/// Largest `interfaceCapacity` (the CRD's bound).
pub const MAX_INTERFACE_CAPACITY: u32 = 4096;
/// Shortest IPv4 block prefix (the CRD's bound: a /8 block would be a whole network).
pub const MIN_BLOCK_V4: u8 = 8;
/// Shortest IPv6 block prefix (the CRD's bound).
pub const MIN_BLOCK_V6: u8 = 64;

/// One invalid field: its path from the object root and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    /// `spec.ipam.gateways[0]`.
    pub path: String,
    /// `10.9.0.1 is not inside any subnet`.
    pub message: String,
}

fn field(path: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError { path: path.into(), message: message.into() }
}

/// What a valid spec resolved to: the parsed subnets, which the overlap check compares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidNetwork {
    /// `spec.ipam.subnets`, parsed, in order (empty without `ipam`).
    pub subnets: Vec<IpNetwork>,
}

/// Checks `spec`; the first invalid field wins (the condition shows one message at a time).
pub fn validate(spec: &PodNetworkSpec) -> Result<ValidNetwork, FieldError> {
    check_parents(&spec.parents)?;
    let mode = spec.mode.unwrap_or(Mode::Macvlan);
    check_mode_sections(spec, mode)?;
    if spec.interface_capacity == 0 || spec.interface_capacity > MAX_INTERFACE_CAPACITY {
        return Err(field(
            "spec.interfaceCapacity",
            format!("{} is outside 1..{MAX_INTERFACE_CAPACITY}", spec.interface_capacity),
        ));
    }
    if let Some(bandwidth) = &spec.bandwidth {
        match bandwidth.parse() {
            Ok(rate) if rate > crate::model::bandwidth::BitsPerSecond::ZERO => {}
            Ok(_) => return Err(field("spec.bandwidth", format!("{bandwidth:?} must be above 0"))),
            Err(why) => return Err(field("spec.bandwidth", format!("{bandwidth:?}: {why}"))),
        }
    }
    check_selector("spec.nodeSelector", spec.node_selector.as_ref())?;
    check_selector("spec.namespaceSelector", spec.namespace_selector.as_ref())?;
    let subnets = match &spec.ipam {
        Some(ipam) => {
            let subnets = check_subnets(&ipam.subnets)?;
            check_block_size(ipam.block_size, &subnets)?;
            check_gateways(&ipam.gateways, &subnets)?;
            check_excludes(&ipam.exclude, &subnets)?;
            check_static_ranges(&ipam.static_ranges, ipam.block_size, &subnets)?;
            subnets
        }
        None => Vec::new(),
    };
    check_mtu(spec.mtu, &subnets)?;
    check_routes(&spec.routes, spec.ipam.is_some(), &subnets)?;
    Ok(ValidNetwork { subnets })
}

/// The first pair of overlapping subnets of two networks (`(mine, theirs)`), if any.
#[must_use]
pub fn overlap(mine: &[IpNetwork], theirs: &[IpNetwork]) -> Option<(IpNetwork, IpNetwork)> {
    mine.iter()
        .flat_map(|a| theirs.iter().map(move |b| (*a, *b)))
        .find(|(a, b)| networks_overlap(*a, *b))
}

/// Whether two CIDRs share an address (same family, one contains the other's first address).
#[must_use]
pub fn networks_overlap(a: IpNetwork, b: IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

fn check_parents(parents: &[String]) -> Result<(), FieldError> {
    if parents.is_empty() {
        return Err(field("spec.parents", "at least one parent interface is required"));
    }
    for (i, parent) in parents.iter().enumerate() {
        let path = format!("spec.parents[{i}]");
        if !is_pci_address(parent)
            && let Err(why) = check_interface_name(parent)
        {
            return Err(field(
                path,
                format!("{parent:?} is neither an interface name ({why}) nor a PCI address"),
            ));
        }
        if let Some(first) = parents[..i].iter().position(|p| p == parent) {
            return Err(field(path, format!("{parent:?} is listed twice (spec.parents[{first}])")));
        }
    }
    Ok(())
}

/// `dddd:bb:dd.f` in lowercase hex, as sysfs spells it.
fn is_pci_address(text: &str) -> bool {
    let bytes = text.as_bytes();
    let hex = |range: std::ops::Range<usize>| {
        bytes[range].iter().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(b))
    };
    bytes.len() == 12
        && bytes[4] == b':'
        && bytes[7] == b':'
        && bytes[10] == b'.'
        && hex(0..4)
        && hex(5..7)
        && hex(8..10)
        && (b'0'..=b'7').contains(&bytes[11])
}

fn check_mode_sections(spec: &PodNetworkSpec, mode: Mode) -> Result<(), FieldError> {
    if spec.macvlan.is_some() && mode != Mode::Macvlan {
        return Err(field(
            "spec.macvlan",
            format!("macvlan settings need mode macvlan, not {mode}"),
        ));
    }
    if spec.ipvlan.is_some() && mode != Mode::Ipvlan {
        return Err(field("spec.ipvlan", format!("ipvlan settings need mode ipvlan, not {mode}")));
    }
    if spec.vlan > MAX_VLAN {
        return Err(field("spec.vlan", format!("{} is outside 0..{MAX_VLAN}", spec.vlan)));
    }
    // A VLAN on a shared parent is a sub-interface the node creates; on a VF it is the VF's
    // VLAN set on the PF. A whole NIC moved into a pod has neither.
    if spec.vlan != 0 && mode == Mode::HostDevice {
        return Err(field(
            "spec.vlan",
            "host-device moves the whole interface into the pod and cannot tag a VLAN \
             (use macvlan, ipvlan or sriov-vf)",
        ));
    }
    Ok(())
}

/// A metav1 `LabelSelector` at `root` (`spec.nodeSelector`, `spec.namespaceSelector`): the
/// operators and values its `matchExpressions` may have.
fn check_selector(root: &str, selector: Option<&LabelSelector>) -> Result<(), FieldError> {
    let Some(selector) = selector else { return Ok(()) };
    for (i, requirement) in selector.match_expressions.iter().flatten().enumerate() {
        let path = format!("{root}.matchExpressions[{i}]");
        let values = requirement.values.as_deref().unwrap_or_default();
        match requirement.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(field(
                    format!("{path}.values"),
                    format!("operator {} needs at least one value", requirement.operator),
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(field(
                    format!("{path}.values"),
                    format!("operator {} takes no values", requirement.operator),
                ));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(field(
                    format!("{path}.operator"),
                    format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
                ));
            }
        }
    }
    Ok(())
}

/// Parses `addr/prefix`; a bare address is refused (it would silently become a /32).
fn parse_cidr(text: &str) -> Result<IpNetwork, String> {
    let (addr, prefix) = text
        .split_once('/')
        .ok_or_else(|| format!("{text:?} is not a CIDR (missing /<prefix length>)"))?;
    let addr: IpAddr = addr.parse().map_err(|e| format!("{text:?} is not a CIDR ({e})"))?;
    let prefix: u8 =
        prefix.parse().map_err(|e| format!("{text:?} is not a CIDR (prefix length: {e})"))?;
    IpNetwork::new(addr, prefix).map_err(|e| format!("{text:?} is not a CIDR ({e})"))
}

/// Parses a CIDR in network form (no host bits set).
fn parse_network(text: &str) -> Result<IpNetwork, String> {
    let net = parse_cidr(text)?;
    if net.ip() == net.network() {
        Ok(net)
    } else {
        Err(format!("{text} has host bits set (the network is {}/{})", net.network(), net.prefix()))
    }
}

fn family(net: IpNetwork) -> &'static str {
    if net.is_ipv4() { "IPv4" } else { "IPv6" }
}

fn check_subnets(subnets: &[String]) -> Result<Vec<IpNetwork>, FieldError> {
    if subnets.is_empty() {
        return Err(field("spec.ipam.subnets", "at least one subnet is required with ipam"));
    }
    let mut parsed: Vec<IpNetwork> = Vec::with_capacity(subnets.len());
    for (i, text) in subnets.iter().enumerate() {
        let path = format!("spec.ipam.subnets[{i}]");
        let net = parse_network(text).map_err(|why| field(&path, why))?;
        let ip = net.ip();
        if ip.is_loopback() || ip.is_multicast() || (ip.is_unspecified() && net.prefix() == 0) {
            return Err(field(path, format!("{net} is not a unicast range pods can use")));
        }
        if let Some(j) = parsed.iter().position(|other| networks_overlap(*other, net)) {
            return Err(field(
                path,
                format!("{net} overlaps spec.ipam.subnets[{j}] ({})", parsed[j]),
            ));
        }
        parsed.push(net);
    }
    Ok(parsed)
}

fn check_block_size(block: BlockSize, subnets: &[IpNetwork]) -> Result<(), FieldError> {
    if !(MIN_BLOCK_V4..=32).contains(&block.ipv4) {
        return Err(field(
            "spec.ipam.blockSize.ipv4",
            format!("/{} is outside /{MIN_BLOCK_V4}../32", block.ipv4),
        ));
    }
    if !(MIN_BLOCK_V6..=128).contains(&block.ipv6) {
        return Err(field(
            "spec.ipam.blockSize.ipv6",
            format!("/{} is outside /{MIN_BLOCK_V6}../128", block.ipv6),
        ));
    }
    for (i, subnet) in subnets.iter().enumerate() {
        let (size, path) = if subnet.is_ipv4() {
            (block.ipv4, "spec.ipam.blockSize.ipv4")
        } else {
            (block.ipv6, "spec.ipam.blockSize.ipv6")
        };
        if size < subnet.prefix() {
            return Err(field(
                path,
                format!(
                    "/{size} blocks do not fit in spec.ipam.subnets[{i}] ({subnet}): a block \
                     may not be shorter than its subnet's prefix"
                ),
            ));
        }
    }
    Ok(())
}

/// Why `ip` cannot be a host address in `net`: the IPv4 network or broadcast address (for
/// prefixes up to /30; /31 and /32 have neither, RFC 3021), or the IPv6 subnet-router anycast
/// address (RFC 4291 §2.6.1).
#[must_use]
pub fn reserved_in(net: IpNetwork, ip: IpAddr) -> Option<&'static str> {
    match net {
        IpNetwork::V4(v4) if v4.prefix() <= 30 => {
            if ip == IpAddr::V4(v4.network()) {
                Some("the network address")
            } else if ip == IpAddr::V4(v4.broadcast()) {
                Some("the broadcast address")
            } else {
                None
            }
        }
        IpNetwork::V6(v6) if v6.prefix() <= 126 && ip == IpAddr::V6(v6.network()) => {
            Some("the subnet-router anycast address")
        }
        _ => None,
    }
}

fn check_gateways(gateways: &[String], subnets: &[IpNetwork]) -> Result<(), FieldError> {
    let mut parsed: Vec<IpAddr> = Vec::with_capacity(gateways.len());
    for (i, text) in gateways.iter().enumerate() {
        let path = format!("spec.ipam.gateways[{i}]");
        let ip: IpAddr = text
            .parse()
            .map_err(|e| field(&path, format!("{text:?} is not an IP address ({e})")))?;
        let Some(subnet) = subnets.iter().find(|net| net.contains(ip)) else {
            return Err(field(path, format!("{ip} is not inside any subnet")));
        };
        if let Some(what) = reserved_in(*subnet, ip) {
            return Err(field(path, format!("{ip} is {what} of {subnet}")));
        }
        // One gateway per family: a pod gets one address per family and one default next
        // hop to go with it.
        if let Some(j) = parsed.iter().position(|other| other.is_ipv4() == ip.is_ipv4()) {
            return Err(field(
                path,
                format!(
                    "a second {} gateway (spec.ipam.gateways[{j}] is {})",
                    family(*subnet),
                    parsed[j]
                ),
            ));
        }
        parsed.push(ip);
    }
    Ok(())
}

fn check_excludes(excludes: &[String], subnets: &[IpNetwork]) -> Result<(), FieldError> {
    for (i, text) in excludes.iter().enumerate() {
        let path = format!("spec.ipam.exclude[{i}]");
        let net = parse_network(text).map_err(|why| field(&path, why))?;
        let inside = subnets.iter().any(|subnet| {
            subnet.is_ipv4() == net.is_ipv4()
                && subnet.prefix() <= net.prefix()
                && subnet.contains(net.network())
        });
        if !inside {
            return Err(field(path, format!("{net} is not inside any subnet")));
        }
    }
    Ok(())
}

/// `spec.ipam.staticRanges`: in network form, each inside one subnet, no two overlapping, and
/// each covering whole blocks: its prefix is not longer than the family's block size. A
/// CIDR inside a subnet with a prefix at most the block prefix starts and ends on block
/// boundaries (blocks are cut from the subnet's first address, and both are powers of two),
/// so no block is ever part static range, part block space: the nodes never carve a block
/// that touches a static range, and the controller marks a range that would split one
/// Invalid here rather than leaving the nodes to silently lose the rest of that block.
fn check_static_ranges(
    ranges: &[String],
    block: BlockSize,
    subnets: &[IpNetwork],
) -> Result<(), FieldError> {
    let mut parsed: Vec<IpNetwork> = Vec::with_capacity(ranges.len());
    for (i, text) in ranges.iter().enumerate() {
        let path = format!("spec.ipam.staticRanges[{i}]");
        let net = parse_network(text).map_err(|why| field(&path, why))?;
        let Some(j) = subnets.iter().position(|subnet| {
            subnet.is_ipv4() == net.is_ipv4()
                && subnet.prefix() <= net.prefix()
                && subnet.contains(net.network())
        }) else {
            return Err(field(path, format!("{net} is not inside any subnet")));
        };
        let (size, size_path) = if net.is_ipv4() {
            (block.ipv4, "spec.ipam.blockSize.ipv4")
        } else {
            (block.ipv6, "spec.ipam.blockSize.ipv6")
        };
        if net.prefix() > size {
            return Err(field(
                path,
                format!(
                    "{net} does not cover whole blocks of spec.ipam.subnets[{j}] ({}): a static \
                     range's prefix may not be longer than {size_path} (/{size}), so no block \
                     is shared between the block space and the static addresses",
                    subnets[j]
                ),
            ));
        }
        if let Some(k) = parsed.iter().position(|other| networks_overlap(*other, net)) {
            return Err(field(
                path,
                format!("{net} overlaps spec.ipam.staticRanges[{k}] ({})", parsed[k]),
            ));
        }
        parsed.push(net);
    }
    Ok(())
}

fn check_mtu(mtu: Option<u32>, subnets: &[IpNetwork]) -> Result<(), FieldError> {
    let Some(mtu) = mtu else { return Ok(()) };
    if !(MIN_MTU..=MAX_MTU).contains(&mtu) {
        return Err(field("spec.mtu", format!("{mtu} is outside {MIN_MTU}..{MAX_MTU}")));
    }
    if mtu < MIN_IPV6_MTU
        && let Some(v6) = subnets.iter().find(|net| net.is_ipv6())
    {
        return Err(field(
            "spec.mtu",
            format!("{mtu} is below {MIN_IPV6_MTU}, the least IPv6 allows (subnet {v6})"),
        ));
    }
    Ok(())
}

fn check_routes(
    routes: &[RouteConfig],
    has_ipam: bool,
    subnets: &[IpNetwork],
) -> Result<(), FieldError> {
    for (i, route) in routes.iter().enumerate() {
        let dest_path = format!("spec.routes[{i}].destination");
        let destination =
            parse_network(&route.destination).map_err(|why| field(&dest_path, why))?;
        if let Some(text) = &route.gateway {
            let path = format!("spec.routes[{i}].gateway");
            let gateway: IpAddr = text
                .parse()
                .map_err(|e| field(&path, format!("{text:?} is not an IP address ({e})")))?;
            if gateway.is_ipv4() != destination.is_ipv4() {
                return Err(field(
                    path,
                    format!("{gateway} is not of the {} destination's family", family(destination)),
                ));
            }
            // Without ipam the addresses come from each claim, so the connected networks are
            // unknown here; with it, the next hop must sit on one of the network's subnets
            // (or be IPv6 link-local, which every IPv6 interface has).
            let link_local = matches!(gateway, IpAddr::V6(v6) if v6.is_unicast_link_local());
            if has_ipam && !link_local && !subnets.iter().any(|net| net.contains(gateway)) {
                return Err(field(path, format!("{gateway} is not inside any subnet")));
            }
        }
        // The pod's primary network already has a default route; a second one without a
        // metric collides with it (EEXIST at attach time).
        if destination.prefix() == 0 && route.metric.is_none_or(|metric| metric == 0) {
            return Err(field(
                format!("spec.routes[{i}].metric"),
                "a default route needs a non-zero metric (the pod's primary network has one)",
            ));
        }
        if let Some(j) = routes[..i].iter().position(|other| {
            parse_network(&other.destination).is_ok_and(|d| d == destination)
                && other.metric == route.metric
        }) {
            return Err(field(dest_path, format!("{destination} repeats spec.routes[{j}]")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
