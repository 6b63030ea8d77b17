//! Validation of a merged `NetworkConfig` against the allocated device, with defaults.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::{
    Addressing, ConfigError, DeviceKind, InterfaceConfig, IpamConfig, MISSING, MacAddr,
    MacvlanMode, Mode, NetworkConfig, NodeSupport, PoolConfig, PoolSpec, ResolvedInterface,
    ResolvedMode, ResolvedNetworkConfig, Route, RouteConfig, Rule, Sharing, SriovConfig,
    SriovSettings, check_interface_name,
};

/// At most this many addresses per interface: the limit of `networkData.ips` in the claim
/// status (KEP-4817).
pub const MAX_ADDRESSES: usize = 16;
/// Routes per interface: far more than a pod network needs, few enough that checking them
/// stays cheap under the prepare lock.
pub const MAX_ROUTES: usize = 64;

/// What validation needs to know about the allocated device, gathered by the caller from
/// the inventory and the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFacts {
    /// Exclusive, shared or slot.
    pub sharing: Sharing,
    /// Device type.
    pub kind: DeviceKind,
    /// Host interface name (the parent for shared devices).
    pub if_name: String,
    /// Current MTU (the parent's MTU for shared devices).
    pub mtu: u32,
    /// Smallest MTU the device accepts (`IFLA_MIN_MTU`).
    pub min_mtu: u32,
    /// Largest MTU the device accepts (`IFLA_MAX_MTU`).
    pub max_mtu: u32,
    /// MTU of the PF, for a VF.
    pub pf_mtu: Option<u32>,
    /// macvlan children in passthru mode already on this parent.
    pub passthru_children: u32,
    /// macvlan children in other modes already on this parent.
    pub other_children: u32,
    /// ipvlan children already on this parent (a parent carries one kind of child).
    pub ipvlan_children: u32,
    /// The netdev's RDMA function (the parent's, for a shared device), with the node's RDMA
    /// netns mode; `None` when it has none.
    pub rdma: Option<super::RdmaFacts>,
}

/// The smallest MTU IPv4 allows (RFC 791); the kernel's `ETH_MIN_MTU`.
const MIN_IPV4_MTU: u32 = 68;
/// The smallest MTU IPv6 allows (RFC 8200 §5).
const MIN_IPV6_MTU: u32 = 1280;
/// The largest MTU when the device reports none (`IFLA_MAX_MTU` 0): the IP packet limit.
const MAX_IP_MTU: u32 = 65535;

pub(super) fn invalid(
    path: impl Into<String>,
    value: impl Into<String>,
    rule: Rule,
) -> ConfigError {
    ConfigError::Invalid { path: path.into(), value: value.into(), rule }
}

pub(super) fn quoted(s: &str) -> String {
    format!("{s:?}")
}

pub(super) fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("<unprintable: {e}>"))
}

/// `inherited`: the addressing a `PodNetwork` with `ipam` gives the config (it replaces
/// `cfg.ipam`, which [`super::inherit`] has checked against the network).
pub(super) fn validate(
    cfg: &NetworkConfig,
    device: &DeviceFacts,
    support: &NodeSupport,
    inherited: Option<Addressing>,
) -> Result<ResolvedNetworkConfig, ConfigError> {
    if let Some(name) = &cfg.pod_network {
        check_dns_label(name).map_err(|rule| invalid("podNetwork", quoted(name), rule))?;
    }
    let mode = resolve_mode(cfg, device, support)?;
    check_sections(cfg, mode.mode(), device.kind)?;
    if mode == ResolvedMode::Vfio {
        super::vfio::check(cfg, device, inherited.as_ref())?;
    }
    let interface_cfg = cfg.interface.clone().unwrap_or_default();
    if let Some(name) = &interface_cfg.name {
        check_interface_name(name)
            .map_err(|why| invalid("interface.name", quoted(name), Rule::InterfaceName(why)))?;
    }
    let hardware_address = resolve_mac(&interface_cfg, mode.mode())?;
    let addressing = match inherited {
        Some(addressing) => addressing,
        None => resolve_addressing(cfg.ipam.as_ref())?,
    };
    let mtu = resolve_mtu(interface_cfg.mtu, mode.mode(), device, &addressing)?;
    check_children(mode, device)?;
    let vlan = match cfg.vlan {
        None => None,
        Some(v) if !(1..=4094).contains(&v) => {
            return Err(invalid("vlan", v.to_string(), Rule::VlanOutOfRange));
        }
        Some(v) if mode.mode() == Mode::HostDevice => {
            return Err(invalid("vlan", v.to_string(), Rule::VlanNotForMode { mode: mode.mode() }));
        }
        // A shared parent's VLAN is a sub-interface the attach creates (8021q); a VF's VLAN
        // is a setting on its PF, which needs no module.
        Some(v) if matches!(mode.mode(), Mode::Macvlan | Mode::Ipvlan) => {
            if let Some(why) = support.vlan_refusal() {
                return Err(invalid("vlan", v.to_string(), Rule::VlanUnavailable(why.to_owned())));
            }
            Some(v)
        }
        Some(v) => Some(v),
    };
    let routes = resolve_routes(cfg.routes.as_deref().unwrap_or_default(), &addressing)?;
    let routing = super::routing::resolve(
        cfg.routing.as_ref(),
        cfg.vrf.as_ref(),
        cfg.sysctls.as_ref(),
        interface_cfg.name.as_deref(),
        support,
    )?;
    let sriov = match mode {
        ResolvedMode::SriovVf => Some(resolve_sriov(&cfg.sriov.clone().unwrap_or_default())?),
        // A VF bound to vfio-pci keeps its VF settings on the PF (DESIGN §3).
        ResolvedMode::Vfio if device.kind == DeviceKind::SriovVf => {
            Some(resolve_sriov(&cfg.sriov.clone().unwrap_or_default())?)
        }
        _ => None,
    };
    let bandwidth = super::bandwidth::resolve(cfg, mode, device, support)?;
    let moves = matches!(mode, ResolvedMode::HostDevice | ResolvedMode::SriovVf);
    // A function bound to vfio-pci leaves its RDMA driver too: there is no RDMA device to
    // move or share (an explicit `rdma` is refused by the vfio rules, naming it).
    let rdma = if matches!(mode, ResolvedMode::Vfio) {
        None
    } else {
        super::rdma::resolve(cfg.rdma, device.rdma.as_ref(), moves, &device.if_name).map_err(
            |refusal| {
                let value =
                    cfg.rdma.map_or_else(|| "(the default)".to_owned(), |r| quoted(r.as_str()));
                invalid("rdma", value, Rule::Rdma(refusal))
            },
        )?
    };
    Ok(ResolvedNetworkConfig {
        pod_network: cfg.pod_network.clone(),
        mode,
        interface: ResolvedInterface { name: interface_cfg.name, mtu, hardware_address },
        addressing,
        routes,
        vlan,
        sriov,
        routing,
        // A vfio device has no interface to count on.
        stats: cfg.stats.unwrap_or(mode != ResolvedMode::Vfio),
        bandwidth,
        rdma,
    })
}

/// Modes a device supports, the default first: a shared parent (or one of its slots) only
/// carries children; an exclusive device moves whole; a VF may also move as plain
/// host-device (no VF settings); a PCI NIC or VF may be bound to vfio-pci (last, so never
/// the default); a bond cannot change network namespace (the kernel marks it
/// `NETIF_F_NETNS_LOCAL`).
fn allowed_modes(device: &DeviceFacts) -> &'static [Mode] {
    match (device.sharing, device.kind) {
        (Sharing::Shared | Sharing::Slot, _) => &[Mode::Macvlan, Mode::Ipvlan],
        (Sharing::Exclusive, DeviceKind::SriovVf) => &[Mode::SriovVf, Mode::HostDevice, Mode::Vfio],
        (Sharing::Exclusive, DeviceKind::Bond) => &[],
        // A PCI NIC may go to vfio-pci whole; a virtual link or a VLAN has no PCI function.
        (Sharing::Exclusive, DeviceKind::Physical | DeviceKind::SriovPf) => {
            &[Mode::HostDevice, Mode::Vfio]
        }
        (Sharing::Exclusive, _) => &[Mode::HostDevice],
    }
}

/// The mode asked for, or the device's default, refused when the node cannot attach it. The
/// default is the first allowed mode the node can attach (for an exclusive VF `sriov-vf`, and
/// `host-device` on a node that refuses it), so a claim that names no mode never fails for a
/// mode it did not ask for while another one works.
fn resolve_mode(
    cfg: &NetworkConfig,
    device: &DeviceFacts,
    support: &NodeSupport,
) -> Result<ResolvedMode, ConfigError> {
    let allowed = allowed_modes(device);
    let not_allowed = |value: String| {
        let names: Vec<&str> = allowed.iter().map(|m| m.as_str()).collect();
        invalid(
            "mode",
            value,
            Rule::ModeNotAllowed {
                sharing: device.sharing,
                kind: device.kind,
                allowed: if names.is_empty() { "none".to_owned() } else { names.join(", ") },
            },
        )
    };
    let mode = match cfg.mode {
        Some(mode) if allowed.contains(&mode) => mode,
        Some(mode) => return Err(not_allowed(quoted(mode.as_str()))),
        None => *allowed
            .iter()
            .find(|m| support.mode_refusal(**m).is_none())
            .or_else(|| allowed.first())
            .ok_or_else(|| not_allowed(MISSING.to_owned()))?,
    };
    if let Some(why) = support.mode_refusal(mode) {
        let value = match cfg.mode {
            Some(_) => quoted(mode.as_str()),
            None => format!("{} (the default for this device)", quoted(mode.as_str())),
        };
        return Err(invalid("mode", value, Rule::ModeUnavailable(why.to_owned())));
    }
    Ok(match mode {
        Mode::Macvlan => ResolvedMode::Macvlan {
            mode: cfg.macvlan.as_ref().and_then(|m| m.mode).unwrap_or_default(),
        },
        Mode::Ipvlan => {
            let ipvlan = cfg.ipvlan.clone().unwrap_or_default();
            ResolvedMode::Ipvlan {
                mode: ipvlan.mode.unwrap_or_default(),
                flag: ipvlan.flag.unwrap_or_default(),
            }
        }
        Mode::HostDevice => ResolvedMode::HostDevice,
        Mode::SriovVf => ResolvedMode::SriovVf,
        Mode::Vfio => ResolvedMode::Vfio,
    })
}

fn check_sections(cfg: &NetworkConfig, mode: Mode, kind: DeviceKind) -> Result<(), ConfigError> {
    let sections = [
        ("macvlan", Mode::Macvlan, cfg.macvlan.as_ref().map(to_json)),
        ("ipvlan", Mode::Ipvlan, cfg.ipvlan.as_ref().map(to_json)),
        ("sriov", Mode::SriovVf, cfg.sriov.as_ref().map(to_json)),
    ];
    for (path, needs, value) in sections {
        // A VF bound to vfio-pci keeps its VF settings.
        let vfio_vf = mode == Mode::Vfio && needs == Mode::SriovVf && kind == DeviceKind::SriovVf;
        if let Some(value) = value
            && mode != needs
            && !vfio_vf
        {
            return Err(invalid(path, value, Rule::SectionNeedsMode { needs, mode }));
        }
    }
    Ok(())
}

fn check_dns_label(name: &str) -> Result<(), Rule> {
    let bytes = name.as_bytes();
    let ok = !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-');
    if ok { Ok(()) } else { Err(Rule::DnsLabel) }
}

fn resolve_mac(interface: &InterfaceConfig, mode: Mode) -> Result<Option<MacAddr>, ConfigError> {
    let Some(text) = &interface.hardware_address else {
        return Ok(None);
    };
    let path = "interface.hardwareAddress";
    if mode == Mode::Ipvlan {
        return Err(invalid(path, quoted(text), Rule::HardwareAddressWithIpvlan));
    }
    let mac: MacAddr = text.parse().map_err(|_| {
        invalid(path, quoted(text), Rule::MacAddress("six hex octets separated by ':'"))
    })?;
    if mac.is_multicast() {
        return Err(invalid(path, quoted(text), Rule::MacAddress("multicast bit set")));
    }
    if mac.0 == [0; 6] {
        return Err(invalid(path, quoted(text), Rule::MacAddress("all zero")));
    }
    Ok(Some(mac))
}

/// Parses `addr/prefix`; an address without a prefix is refused (it would silently become
/// a /32 or /128).
pub(super) fn parse_cidr(text: &str) -> Result<IpNetwork, Rule> {
    let (addr, prefix) =
        text.split_once('/').ok_or_else(|| Rule::Cidr("missing '/<prefix length>'".to_owned()))?;
    let addr: IpAddr = addr.parse().map_err(|e| Rule::Cidr(format!("{e}")))?;
    let prefix: u8 = prefix.parse().map_err(|e| Rule::Cidr(format!("prefix length: {e}")))?;
    IpNetwork::new(addr, prefix).map_err(|e| Rule::Cidr(e.to_string()))
}

/// Parses a network in CIDR form with no host bits set (the kernel refuses such a route
/// destination).
pub(super) fn parse_network(text: &str) -> Result<IpNetwork, Rule> {
    let net = parse_cidr(text)?;
    let canonical = canonical_network(net);
    if canonical.ip() == net.ip() { Ok(net) } else { Err(Rule::NotANetwork { network: canonical }) }
}

/// The network of an interface address (`10.1.1.5/24` → `10.1.1.0/24`).
pub(crate) fn canonical_network(net: IpNetwork) -> IpNetwork {
    IpNetwork::new(net.network(), net.prefix()).unwrap_or(net)
}

pub(super) fn parse_ip(text: &str) -> Result<IpAddr, Rule> {
    text.parse().map_err(|e: std::net::AddrParseError| Rule::IpAddress(e.to_string()))
}

fn family(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "IPv4" } else { "IPv6" }
}

/// Whether `ip` is the IPv4 network or broadcast address of `net` (for prefixes up to /30;
/// /31 and /32 have neither, RFC 3021), or the IPv6 subnet-router anycast address.
fn is_network_or_broadcast(net: IpNetwork, ip: IpAddr) -> Option<&'static str> {
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

fn check_interface_address(net: IpNetwork) -> Result<(), &'static str> {
    let ip = net.ip();
    if ip.is_unspecified() {
        return Err("unspecified");
    }
    if ip.is_loopback() {
        return Err("loopback");
    }
    if ip.is_multicast() {
        return Err("multicast");
    }
    if ip == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
        return Err("limited broadcast");
    }
    is_network_or_broadcast(net, ip).map_or(Ok(()), Err)
}

fn resolve_addressing(ipam: Option<&IpamConfig>) -> Result<Addressing, ConfigError> {
    let Some(ipam) = ipam else {
        return Ok(Addressing::None);
    };
    match (&ipam.addresses, &ipam.pool) {
        (Some(addresses), Some(_)) => {
            Err(invalid("ipam.addresses", to_json(addresses), Rule::AddressesAndPool))
        }
        (Some(addresses), None) if addresses.is_empty() => Ok(Addressing::None),
        (Some(addresses), None) => resolve_static(addresses).map(Addressing::Static),
        (None, Some(pool)) => resolve_pool(pool).map(Addressing::Pool),
        (None, None) => Ok(Addressing::None),
    }
}

pub(super) fn resolve_static(addresses: &[String]) -> Result<Vec<IpNetwork>, ConfigError> {
    if addresses.len() > MAX_ADDRESSES {
        return Err(invalid(
            "ipam.addresses",
            format!("{} addresses", addresses.len()),
            Rule::TooManyAddresses { max: MAX_ADDRESSES },
        ));
    }
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(addresses.len());
    for (i, text) in addresses.iter().enumerate() {
        let path = format!("ipam.addresses[{i}]");
        let net = parse_cidr(text).map_err(|rule| invalid(&path, quoted(text), rule))?;
        check_interface_address(net)
            .map_err(|why| invalid(&path, quoted(text), Rule::AddressNotUsable(why)))?;
        if !seen.insert(net.ip()) {
            return Err(invalid(&path, quoted(text), Rule::DuplicateAddress));
        }
        out.push(net);
    }
    Ok(out)
}

/// The first and last address a pool may hand out by default.
fn usable_bounds(subnet: IpNetwork) -> (IpAddr, IpAddr) {
    match subnet {
        IpNetwork::V4(v4) if v4.prefix() <= 30 => (
            IpAddr::V4((u32::from(v4.network()) + 1).into()),
            IpAddr::V4((u32::from(v4.broadcast()) - 1).into()),
        ),
        IpNetwork::V4(v4) => (IpAddr::V4(v4.network()), IpAddr::V4(v4.broadcast())),
        IpNetwork::V6(v6) if v6.prefix() <= 126 => {
            (IpAddr::V6((u128::from(v6.network()) + 1).into()), IpAddr::V6(v6.broadcast()))
        }
        IpNetwork::V6(v6) => (IpAddr::V6(v6.network()), IpAddr::V6(v6.broadcast())),
    }
}

fn pool_address(subnet: IpNetwork, path: &str, text: &str) -> Result<IpAddr, ConfigError> {
    let ip = parse_ip(text).map_err(|rule| invalid(path, quoted(text), rule))?;
    if ip.is_ipv4() != subnet.is_ipv4() {
        return Err(invalid(
            path,
            quoted(text),
            Rule::FamilyMismatch { other: format!("ipam.pool.subnet {subnet}") },
        ));
    }
    if !subnet.contains(ip) {
        return Err(invalid(path, quoted(text), Rule::NotInSubnet { subnet }));
    }
    if let Some(why) = is_network_or_broadcast(subnet, ip) {
        return Err(invalid(path, quoted(text), Rule::AddressNotUsable(why)));
    }
    Ok(ip)
}

fn resolve_pool(pool: &PoolConfig) -> Result<PoolSpec, ConfigError> {
    let Some(subnet_text) = &pool.subnet else {
        return Err(invalid("ipam.pool.subnet", MISSING, Rule::Missing));
    };
    let subnet = parse_network(subnet_text)
        .map_err(|rule| invalid("ipam.pool.subnet", quoted(subnet_text), rule))?;
    let (first, last) = usable_bounds(subnet);
    let range_start = match &pool.range_start {
        Some(text) => pool_address(subnet, "ipam.pool.rangeStart", text)?,
        None => first,
    };
    let range_end = match &pool.range_end {
        Some(text) => pool_address(subnet, "ipam.pool.rangeEnd", text)?,
        None => last,
    };
    if range_start > range_end {
        return Err(invalid(
            "ipam.pool.rangeStart",
            quoted(&range_start.to_string()),
            Rule::RangeReversed { end: range_end },
        ));
    }
    let gateway = pool
        .gateway
        .as_deref()
        .map(|t| pool_address(subnet, "ipam.pool.gateway", t))
        .transpose()?;
    let mut exclude = Vec::new();
    for (i, text) in pool.exclude.iter().flatten().enumerate() {
        let path = format!("ipam.pool.exclude[{i}]");
        let net = parse_network(text).map_err(|rule| invalid(&path, quoted(text), rule))?;
        if net.is_ipv4() != subnet.is_ipv4() {
            return Err(invalid(
                &path,
                quoted(text),
                Rule::FamilyMismatch { other: format!("ipam.pool.subnet {subnet}") },
            ));
        }
        exclude.push(net);
    }
    Ok(PoolSpec { subnet, range_start, range_end, gateway, exclude })
}

fn resolve_mtu(
    explicit: Option<u32>,
    mode: Mode,
    device: &DeviceFacts,
    addressing: &Addressing,
) -> Result<u32, ConfigError> {
    let path = "interface.mtu";
    if let Some(mtu) = explicit {
        let (min, max, why) = match mode {
            // A macvlan/ipvlan child cannot exceed its parent (the kernel checks
            // `mtu > lowerdev->mtu` in macvlan_change_mtu / ipvlan_change_mtu).
            Mode::Macvlan | Mode::Ipvlan => (MIN_IPV4_MTU, device.mtu, "68 up to the parent's MTU"),
            Mode::HostDevice | Mode::SriovVf | Mode::Vfio => (
                if device.min_mtu == 0 { MIN_IPV4_MTU } else { device.min_mtu },
                if device.max_mtu == 0 { MAX_IP_MTU } else { device.max_mtu },
                "the device's min/max MTU",
            ),
        };
        if !(min..=max).contains(&mtu) {
            return Err(invalid(path, mtu.to_string(), Rule::MtuOutOfRange { min, max, why }));
        }
        if device.kind == DeviceKind::SriovVf
            && let Some(pf_mtu) = device.pf_mtu
            && mtu > pf_mtu
        {
            return Err(invalid(
                path,
                mtu.to_string(),
                Rule::MtuOutOfRange { min, max: pf_mtu, why: "a VF may not exceed its PF's MTU" },
            ));
        }
    }
    let mtu = explicit.unwrap_or(device.mtu);
    if addressing.has_ipv6() && mtu < MIN_IPV6_MTU {
        return Err(invalid(path, mtu.to_string(), Rule::MtuTooSmallForIpv6));
    }
    Ok(mtu)
}

/// The children a parent can take (DESIGN §2). A netdev has one receive handler, which the
/// first macvlan or ipvlan child registers (`netdev_rx_handler_register`), so a parent
/// carries one kind of child: the other kind would fail with `EBUSY` at sandbox time. A
/// macvlan parent in passthru mode has exactly one child, and passthru cannot be added next
/// to other children (`macvlan_common_newlink` returns EBUSY/EINVAL): it takes the parent's
/// whole capacity.
fn check_children(mode: ResolvedMode, device: &DeviceFacts) -> Result<(), ConfigError> {
    let macvlan_children = device.passthru_children + device.other_children;
    match mode {
        ResolvedMode::Macvlan { .. } if device.ipvlan_children > 0 => Err(invalid(
            "mode",
            quoted(mode.mode().as_str()),
            Rule::ChildKindMix { existing: Mode::Ipvlan, count: device.ipvlan_children },
        )),
        ResolvedMode::Ipvlan { .. } if macvlan_children > 0 => Err(invalid(
            "mode",
            quoted(mode.mode().as_str()),
            Rule::ChildKindMix { existing: Mode::Macvlan, count: macvlan_children },
        )),
        ResolvedMode::Macvlan { mode: MacvlanMode::Passthru } if macvlan_children > 0 => {
            Err(invalid("macvlan.mode", quoted("passthru"), passthru_rule(device)))
        }
        ResolvedMode::Macvlan { .. } if device.passthru_children > 0 => {
            Err(invalid("mode", quoted(mode.mode().as_str()), passthru_rule(device)))
        }
        _ => Ok(()),
    }
}

fn passthru_rule(device: &DeviceFacts) -> Rule {
    Rule::Passthru {
        passthru_children: device.passthru_children,
        other_children: device.other_children,
    }
}

fn resolve_routes(
    routes: &[RouteConfig],
    addressing: &Addressing,
) -> Result<Vec<Route>, ConfigError> {
    let connected: Vec<IpNetwork> = match addressing {
        Addressing::None => Vec::new(),
        Addressing::Static(addrs) => addrs.iter().copied().map(canonical_network).collect(),
        Addressing::Pool(pool) => vec![pool.subnet],
        // Every subnet of the network: which one a block address comes from is decided at
        // allocation, after this check.
        Addressing::Network(network) => network
            .subnets
            .iter()
            .copied()
            .chain(network.addresses.iter().copied().map(canonical_network))
            .collect(),
    };
    if routes.len() > MAX_ROUTES {
        return Err(invalid(
            "routes",
            format!("{} routes", routes.len()),
            Rule::TooManyRoutes { max: MAX_ROUTES },
        ));
    }
    let mut out: Vec<Route> = Vec::with_capacity(routes.len());
    let mut seen: HashMap<(IpNetwork, Option<u32>), usize> = HashMap::with_capacity(routes.len());
    for (i, route) in routes.iter().enumerate() {
        let dest_path = format!("routes[{i}].destination");
        let destination = parse_network(&route.destination)
            .map_err(|rule| invalid(&dest_path, quoted(&route.destination), rule))?;
        let gateway = match &route.gateway {
            None => None,
            Some(text) => {
                let path = format!("routes[{i}].gateway");
                let gw = parse_ip(text).map_err(|rule| invalid(&path, quoted(text), rule))?;
                if gw.is_ipv4() != destination.is_ipv4() {
                    return Err(invalid(
                        &path,
                        quoted(text),
                        Rule::FamilyMismatch {
                            other: format!(
                                "the {} destination {destination}",
                                family(destination.ip())
                            ),
                        },
                    ));
                }
                // Every IPv6 interface has a link-local address, so fe80::/10 is always
                // connected (routers advertise themselves from link-local, RFC 4861 §4.2).
                let link_local = matches!(gw, IpAddr::V6(v6) if v6.is_unicast_link_local());
                if !link_local && !connected.iter().any(|net| net.contains(gw)) {
                    let list: Vec<String> = connected.iter().map(ToString::to_string).collect();
                    return Err(invalid(
                        &path,
                        quoted(text),
                        Rule::GatewayNotConnected {
                            connected: if list.is_empty() {
                                "none".to_owned()
                            } else {
                                list.join(", ")
                            },
                        },
                    ));
                }
                Some(gw)
            }
        };
        if destination.prefix() == 0 && route.metric.is_none_or(|m| m == 0) {
            return Err(invalid(
                format!("routes[{i}].metric"),
                route.metric.map_or_else(|| MISSING.to_owned(), |m| m.to_string()),
                Rule::DefaultRouteNeedsMetric,
            ));
        }
        if let Some(index) = seen.insert((destination, route.metric), i) {
            return Err(invalid(
                dest_path,
                quoted(&route.destination),
                Rule::DuplicateRoute { index },
            ));
        }
        out.push(Route { destination, gateway, metric: route.metric });
    }
    Ok(out)
}

fn resolve_sriov(sriov: &SriovConfig) -> Result<SriovSettings, ConfigError> {
    let qos = sriov.qos.unwrap_or(0);
    if qos > 7 {
        return Err(invalid("sriov.qos", qos.to_string(), Rule::OutOfRange { min: 0, max: 7 }));
    }
    let max_tx_rate_mbps = sriov.max_tx_rate_mbps.unwrap_or(0);
    let min_tx_rate_mbps = sriov.min_tx_rate_mbps.unwrap_or(0);
    if max_tx_rate_mbps > 0 && min_tx_rate_mbps > max_tx_rate_mbps {
        return Err(invalid(
            "sriov.minTxRateMbps",
            min_tx_rate_mbps.to_string(),
            Rule::MinRateAboveMax { max: max_tx_rate_mbps },
        ));
    }
    Ok(SriovSettings {
        qos,
        // The kernel's default for a new VF is spoof checking on.
        spoof_check: sriov.spoof_check.unwrap_or(true),
        trust: sriov.trust.unwrap_or(false),
        max_tx_rate_mbps,
        min_tx_rate_mbps,
        link_state: sriov.link_state.unwrap_or_default(),
        vlan_protocol: sriov.vlan_protocol.unwrap_or_default(),
    })
}
