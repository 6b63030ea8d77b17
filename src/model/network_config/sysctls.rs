//! `sysctls` (DESIGN §3): kernel settings of the claim's own pod interface, which keys a claim
//! may set, which only administrator-owned config may set, and the values each key takes.
//!
//! A key names the interface (`net.ipv4.conf.net1.rp_filter`). Default names (`net1`, …) are
//! assigned when the pod's sandbox starts, after prepare, so a key may name the interface as
//! `IFNAME` (the CNI `tuning` plugin's placeholder), which stands for whatever name the
//! interface gets; a concrete name is accepted only when it is the config's explicit
//! `interface.name`. Both are checked at prepare.
//!
//! Who may set a key: the pod's network namespace is the tenant's, so a setting that only
//! changes how the pod itself treats its traffic is the tenant's to choose. A setting that
//! makes the interface answer for addresses that are not the pod's (`proxy_arp`,
//! `proxy_arp_pvlan`, `medium_id`, `proxy_ndp`), route or relay traffic of others
//! (`forwarding`, `bc_forwarding`, `accept_source_route`, `bootp_relay`, `seg6_enabled`,
//! `rpl_seg_enabled`, `ioam6_*`, `force_forwarding`), accept traffic claiming to come from the
//! pod's own or loopback addresses (`accept_local`, `route_localnet`), or writes to the node's
//! kernel log (`log_martians`) acts on the shared segment or the node: it is accepted only from
//! a DeviceClass or a PodNetwork, which the administrator owns, never from a claim
//! ([`check_claim_keys`]). Read-only keys (`mc_forwarding`) and keys not listed here are
//! refused.

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv6Addr;

use serde::{Deserialize, Serialize};

/// The placeholder for the pod interface's name in a key.
pub const IFNAME: &str = "IFNAME";

/// Which `/proc/sys/net` subtree a key lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SysctlFamily {
    /// `net.ipv4.conf.<if>.*` (the kernel's `devinet` table).
    Ipv4Conf,
    /// `net.ipv6.conf.<if>.*` (the kernel's `addrconf` table).
    Ipv6Conf,
    /// `net.ipv4.neigh.<if>.*` (ARP parameters of the interface).
    Ipv4Neigh,
    /// `net.ipv6.neigh.<if>.*` (neighbour discovery parameters of the interface).
    Ipv6Neigh,
    /// `net.ipv4.*` of the whole pod netns: only `tcp_l3mdev_accept` and `udp_l3mdev_accept`,
    /// for a VRF claim.
    Ipv4Netns,
}

impl SysctlFamily {
    /// The dotted prefix before the interface name (or the attribute for the netns family).
    #[must_use]
    pub fn prefix(self) -> &'static str {
        match self {
            SysctlFamily::Ipv4Conf => "net.ipv4.conf",
            SysctlFamily::Ipv6Conf => "net.ipv6.conf",
            SysctlFamily::Ipv4Neigh => "net.ipv4.neigh",
            SysctlFamily::Ipv6Neigh => "net.ipv6.neigh",
            SysctlFamily::Ipv4Netns => "net.ipv4",
        }
    }
}

/// Who may set a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// The claim may set it: it only changes how the pod treats its own traffic.
    Tenant,
    /// Only a DeviceClass or PodNetwork may set it: it acts for others or on the node.
    Admin,
    /// The kernel does not accept writes (`mc_forwarding` belongs to the multicast routing
    /// daemon's socket).
    ReadOnly,
}

/// The values a key takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An integer in the inclusive range.
    Int(i64, i64),
    /// An IPv6 address (`stable_secret`).
    Ipv6,
}

const BOOL: Kind = Kind::Int(0, 1);
const NONNEG: Kind = Kind::Int(0, i32::MAX as i64);

/// One known key: family, attribute, owner, values, and for IPv4 conf keys the
/// `IPV4_DEVCONF_*` id (`include/uapi/linux/ip.h`) used with `IFLA_INET_CONF`.
struct Known {
    family: SysctlFamily,
    attribute: &'static str,
    owner: Owner,
    kind: Kind,
    devconf: Option<u16>,
}

const fn v4(attribute: &'static str, owner: Owner, kind: Kind, id: u16) -> Known {
    Known { family: SysctlFamily::Ipv4Conf, attribute, owner, kind, devconf: Some(id) }
}

const fn v6(attribute: &'static str, owner: Owner, kind: Kind) -> Known {
    Known { family: SysctlFamily::Ipv6Conf, attribute, owner, kind, devconf: None }
}

use Owner::{Admin, ReadOnly, Tenant};

/// The kernel's `devinet_sysctl` entries (net/ipv4/devinet.c), with their `IPV4_DEVCONF_*`
/// ids. `tag` is left out (no kernel user).
const IPV4_CONF: &[Known] = &[
    v4("forwarding", Admin, BOOL, 1),
    v4("mc_forwarding", ReadOnly, BOOL, 2),
    v4("proxy_arp", Admin, BOOL, 3),
    v4("accept_redirects", Tenant, BOOL, 4),
    v4("secure_redirects", Tenant, BOOL, 5),
    v4("send_redirects", Tenant, BOOL, 6),
    v4("shared_media", Tenant, BOOL, 7),
    v4("rp_filter", Tenant, Kind::Int(0, 2), 8),
    v4("accept_source_route", Admin, BOOL, 9),
    v4("bootp_relay", Admin, BOOL, 10),
    v4("log_martians", Admin, BOOL, 11),
    v4("arp_filter", Tenant, BOOL, 13),
    v4("medium_id", Admin, Kind::Int(-1, i32::MAX as i64), 14),
    v4("disable_xfrm", Tenant, BOOL, 15),
    v4("disable_policy", Tenant, BOOL, 16),
    v4("force_igmp_version", Tenant, Kind::Int(0, 3), 17),
    v4("arp_announce", Tenant, Kind::Int(0, 2), 18),
    v4("arp_ignore", Tenant, Kind::Int(0, 8), 19),
    v4("promote_secondaries", Tenant, BOOL, 20),
    v4("arp_accept", Tenant, Kind::Int(0, 2), 21),
    v4("arp_notify", Tenant, BOOL, 22),
    v4("accept_local", Admin, BOOL, 23),
    v4("src_valid_mark", Tenant, BOOL, 24),
    v4("proxy_arp_pvlan", Admin, BOOL, 25),
    v4("route_localnet", Admin, BOOL, 26),
    v4("igmpv2_unsolicited_report_interval", Tenant, NONNEG, 27),
    v4("igmpv3_unsolicited_report_interval", Tenant, NONNEG, 28),
    v4("ignore_routes_with_linkdown", Tenant, BOOL, 29),
    v4("drop_unicast_in_l2_multicast", Tenant, BOOL, 30),
    v4("drop_gratuitous_arp", Tenant, BOOL, 31),
    v4("bc_forwarding", Admin, BOOL, 32),
    v4("arp_evict_nocarrier", Tenant, BOOL, 33),
];

/// The kernel's `addrconf_sysctl` entries (net/ipv6/addrconf.c) that are per interface.
const IPV6_CONF: &[Known] = &[
    v6("forwarding", Admin, BOOL),
    v6("force_forwarding", Admin, BOOL),
    v6("mc_forwarding", ReadOnly, BOOL),
    v6("proxy_ndp", Admin, BOOL),
    v6("accept_source_route", Admin, Kind::Int(-1, 1)),
    v6("seg6_enabled", Admin, BOOL),
    v6("seg6_require_hmac", Admin, Kind::Int(-1, 1)),
    v6("rpl_seg_enabled", Admin, BOOL),
    v6("ioam6_enabled", Admin, BOOL),
    v6("ioam6_id", Admin, Kind::Int(0, 0xffff)),
    v6("ioam6_id_wide", Admin, Kind::Int(0, u32::MAX as i64)),
    v6("hop_limit", Tenant, Kind::Int(1, 255)),
    v6("mtu", Tenant, Kind::Int(1280, 65535)),
    v6("accept_ra", Tenant, Kind::Int(0, 2)),
    v6("accept_ra_defrtr", Tenant, BOOL),
    v6("ra_defrtr_metric", Tenant, Kind::Int(1, u32::MAX as i64)),
    v6("accept_ra_from_local", Tenant, BOOL),
    v6("accept_ra_min_hop_limit", Tenant, Kind::Int(0, 255)),
    v6("accept_ra_min_lft", Tenant, NONNEG),
    v6("accept_ra_pinfo", Tenant, BOOL),
    v6("ra_honor_pio_life", Tenant, BOOL),
    v6("accept_ra_rtr_pref", Tenant, BOOL),
    v6("accept_ra_rt_info_min_plen", Tenant, Kind::Int(0, 128)),
    v6("accept_ra_rt_info_max_plen", Tenant, Kind::Int(0, 128)),
    v6("accept_ra_mtu", Tenant, BOOL),
    v6("accept_redirects", Tenant, BOOL),
    v6("autoconf", Tenant, BOOL),
    v6("dad_transmits", Tenant, NONNEG),
    v6("accept_dad", Tenant, Kind::Int(0, 2)),
    v6("enhanced_dad", Tenant, BOOL),
    v6("optimistic_dad", Tenant, BOOL),
    v6("use_optimistic", Tenant, BOOL),
    v6("router_solicitations", Tenant, Kind::Int(-1, i32::MAX as i64)),
    v6("router_solicitation_interval", Tenant, NONNEG),
    v6("router_solicitation_max_interval", Tenant, NONNEG),
    v6("router_solicitation_delay", Tenant, NONNEG),
    v6("router_probe_interval", Tenant, NONNEG),
    v6("force_mld_version", Tenant, Kind::Int(0, 2)),
    v6("mldv1_unsolicited_report_interval", Tenant, NONNEG),
    v6("mldv2_unsolicited_report_interval", Tenant, NONNEG),
    v6("use_tempaddr", Tenant, Kind::Int(-1, 2)),
    v6("temp_valid_lft", Tenant, NONNEG),
    v6("temp_prefered_lft", Tenant, NONNEG),
    v6("regen_max_retry", Tenant, NONNEG),
    v6("max_desync_factor", Tenant, NONNEG),
    v6("max_addresses", Tenant, NONNEG),
    v6("disable_ipv6", Tenant, BOOL),
    v6("disable_policy", Tenant, BOOL),
    v6("force_tllao", Tenant, BOOL),
    v6("ndisc_notify", Tenant, BOOL),
    v6("ndisc_tclass", Tenant, Kind::Int(0, 255)),
    v6("ndisc_evict_nocarrier", Tenant, BOOL),
    v6("suppress_frag_ndisc", Tenant, BOOL),
    v6("drop_unicast_in_l2_multicast", Tenant, BOOL),
    v6("drop_unsolicited_na", Tenant, BOOL),
    v6("accept_untracked_na", Tenant, Kind::Int(0, 2)),
    v6("keep_addr_on_down", Tenant, Kind::Int(-1, 1)),
    v6("addr_gen_mode", Tenant, Kind::Int(0, 3)),
    v6("stable_secret", Tenant, Kind::Ipv6),
];

/// The per-interface neighbour parameters (`neigh_sysctl_template`, net/core/neighbour.c), the
/// same for ARP and NDISC; the `gc_*` thresholds exist only under `default` and are not here.
const NEIGH: &[&str] = &[
    "anycast_delay",
    "app_solicit",
    "base_reachable_time",
    "base_reachable_time_ms",
    "delay_first_probe_time",
    "gc_stale_time",
    "interval_probe_time_ms",
    "locktime",
    "mcast_resolicit",
    "mcast_solicit",
    "proxy_delay",
    "proxy_qlen",
    "queue_len_bytes",
    "retrans_time",
    "retrans_time_ms",
    "ucast_solicit",
    "unres_qlen",
    "unres_qlen_bytes",
];

/// The netns-wide keys a VRF claim may set: sockets not bound to the VRF accept connections
/// and datagrams arriving through it (Documentation/networking/vrf.rst).
const L3MDEV: &[&str] = &["tcp_l3mdev_accept", "udp_l3mdev_accept"];

/// Why a `sysctls` key or value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SysctlRefusal {
    /// Not a key this driver sets.
    #[error(
        "not a sysctl of the claim's interface (net.ipv4.conf, net.ipv6.conf, net.ipv4.neigh or \
         net.ipv6.neigh, then the interface, then a known attribute; net.ipv4.tcp_l3mdev_accept \
         and net.ipv4.udp_l3mdev_accept with vrf)"
    )]
    Unknown,
    /// A key the kernel does not let anyone write.
    #[error("read-only in the kernel")]
    ReadOnly,
    /// An administrator-only key in a claim's own config.
    #[error(
        "lets the pod answer or route for addresses that are not its own, or acts on the node: \
         only a DeviceClass or PodNetwork may set it, never a claim"
    )]
    AdminOnly,
    /// The key names another interface.
    #[error("names interface {named:?}, but this claim's interface is {expected}")]
    OtherInterface {
        /// The interface in the key.
        named: String,
        /// What the key may name.
        expected: String,
    },
    /// A netns-wide key without a VRF.
    #[error("netns-wide, accepted only together with vrf")]
    NeedsVrf,
    /// The value is not one the key takes.
    #[error("value {value:?} is not {expected}")]
    Value {
        /// The value.
        value: String,
        /// What the key takes.
        expected: String,
    },
    /// The same setting under two spellings (`IFNAME` and the explicit name).
    #[error("sets the same attribute as {other:?}")]
    Twice {
        /// The other key.
        other: String,
    },
}

/// One validated setting, the interface left open: the plan writes the key with the final
/// interface name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sysctl {
    /// The subtree.
    pub family: SysctlFamily,
    /// The attribute (`rp_filter`).
    pub attribute: String,
    /// The value as written to `/proc/sys` (a canonical integer, or an IPv6 address).
    pub value: String,
}

impl Sysctl {
    /// The dotted key for the interface `if_name` (`net.ipv4.conf.net1.rp_filter`).
    #[must_use]
    pub fn key(&self, if_name: &str) -> String {
        match self.family {
            SysctlFamily::Ipv4Netns => format!("{}.{}", self.family.prefix(), self.attribute),
            _ => format!("{}.{if_name}.{}", self.family.prefix(), self.attribute),
        }
    }

    /// The `IPV4_DEVCONF_*` id and value when the setting can go through `IFLA_INET_CONF`
    /// (every IPv4 conf key but `forwarding`, whose `/proc` handler also turns LRO off on the
    /// device, which the netlink path does not: `devinet_sysctl_forward`).
    #[must_use]
    pub fn inet_devconf(&self) -> Option<(u16, u32)> {
        if self.family != SysctlFamily::Ipv4Conf || self.attribute == "forwarding" {
            return None;
        }
        let known = IPV4_CONF.iter().find(|k| k.attribute == self.attribute)?;
        let value: i32 = self.value.parse().ok()?;
        // The kernel reads the attribute as u32 and stores it in an int.
        Some((known.devconf?, u32::from_ne_bytes(value.to_ne_bytes())))
    }
}

impl fmt::Display for Sysctl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key(IFNAME), self.value)
    }
}

/// A key split into family, interface (none for the netns family) and attribute.
struct Parsed<'k> {
    family: SysctlFamily,
    interface: Option<&'k str>,
    attribute: &'k str,
}

fn parse_key(key: &str) -> Option<Parsed<'_>> {
    for family in [
        SysctlFamily::Ipv4Conf,
        SysctlFamily::Ipv6Conf,
        SysctlFamily::Ipv4Neigh,
        SysctlFamily::Ipv6Neigh,
    ] {
        if let Some(rest) = key.strip_prefix(family.prefix()).and_then(|r| r.strip_prefix('.')) {
            // Interface names may hold dots (`net1.100`), attributes never do.
            let (interface, attribute) = rest.rsplit_once('.')?;
            if interface.is_empty() || attribute.is_empty() {
                return None;
            }
            return Some(Parsed { family, interface: Some(interface), attribute });
        }
    }
    let attribute = key.strip_prefix("net.ipv4.")?;
    L3MDEV.contains(&attribute).then_some(Parsed {
        family: SysctlFamily::Ipv4Netns,
        interface: None,
        attribute,
    })
}

fn known(family: SysctlFamily, attribute: &str) -> Option<(Owner, Kind)> {
    match family {
        SysctlFamily::Ipv4Conf | SysctlFamily::Ipv6Conf => {
            let table = if family == SysctlFamily::Ipv4Conf { IPV4_CONF } else { IPV6_CONF };
            table.iter().find(|k| k.attribute == attribute).map(|k| {
                debug_assert_eq!(k.family, family);
                (k.owner, k.kind)
            })
        }
        SysctlFamily::Ipv4Neigh | SysctlFamily::Ipv6Neigh => {
            NEIGH.contains(&attribute).then_some((Tenant, NONNEG))
        }
        SysctlFamily::Ipv4Netns => L3MDEV.contains(&attribute).then_some((Tenant, BOOL)),
    }
}

/// Who may set `key`, or `None` for a key this driver does not set.
#[must_use]
pub fn owner(key: &str) -> Option<Owner> {
    let parsed = parse_key(key)?;
    known(parsed.family, parsed.attribute).map(|(owner, _)| owner)
}

/// The `sysctls` path of a key, as errors name it: `sysctls["net.ipv4.conf.net1.rp_filter"]`.
#[must_use]
pub fn path(key: &str) -> String {
    format!("sysctls[{key:?}]")
}

/// Checks the keys of one claim-owned config entry: the first administrator-only or read-only
/// key, with the reason. Unknown keys pass here and are refused by [`resolve`].
#[must_use]
pub fn check_claim_keys(sysctls: &BTreeMap<String, String>) -> Option<(&str, SysctlRefusal)> {
    sysctls.keys().find_map(|key| match owner(key) {
        Some(Owner::Admin) => Some((key.as_str(), SysctlRefusal::AdminOnly)),
        Some(Owner::ReadOnly) => Some((key.as_str(), SysctlRefusal::ReadOnly)),
        Some(Owner::Tenant) | None => None,
    })
}

fn check_value(kind: Kind, value: &str) -> Result<String, SysctlRefusal> {
    let refuse = |expected: String| SysctlRefusal::Value { value: value.to_owned(), expected };
    match kind {
        Kind::Int(min, max) => {
            let parsed: i64 = value.trim().parse().map_err(|_| {
                refuse(if (min, max) == (0, 1) {
                    "0 or 1".to_owned()
                } else {
                    format!("an integer in {min}..={max}")
                })
            })?;
            if (min..=max).contains(&parsed) {
                Ok(parsed.to_string())
            } else {
                Err(refuse(format!("an integer in {min}..={max}")))
            }
        }
        Kind::Ipv6 => value
            .trim()
            .parse::<Ipv6Addr>()
            .map(|a| a.to_string())
            .map_err(|_| refuse("an IPv6 address".to_owned())),
    }
}

/// Validates the merged `sysctls` against the claim's explicit interface name (`None`: the
/// name is assigned at sandbox time, so keys must say `IFNAME`) and whether it has a VRF.
/// Administrator-only keys pass here: [`check_claim_keys`] refused them in claim entries.
///
/// # Errors
/// The first refused key, with its reason.
pub fn resolve(
    sysctls: &BTreeMap<String, String>,
    explicit_name: Option<&str>,
    vrf: bool,
) -> Result<Vec<Sysctl>, (String, SysctlRefusal)> {
    let mut out: Vec<Sysctl> = Vec::with_capacity(sysctls.len());
    let mut seen: BTreeMap<(SysctlFamily, &str), &str> = BTreeMap::new();
    for (key, value) in sysctls {
        let refuse = |why| (key.clone(), why);
        let parsed = parse_key(key).ok_or_else(|| refuse(SysctlRefusal::Unknown))?;
        let (owner, kind) =
            known(parsed.family, parsed.attribute).ok_or_else(|| refuse(SysctlRefusal::Unknown))?;
        if owner == Owner::ReadOnly {
            return Err(refuse(SysctlRefusal::ReadOnly));
        }
        if let Some(interface) = parsed.interface
            && interface != IFNAME
            && Some(interface) != explicit_name
        {
            return Err(refuse(SysctlRefusal::OtherInterface {
                named: interface.to_owned(),
                expected: match explicit_name {
                    Some(name) => format!("{name} (or {IFNAME})"),
                    None => format!(
                        "named at sandbox time: write {IFNAME}, or set interface.name and use it"
                    ),
                },
            }));
        }
        if parsed.family == SysctlFamily::Ipv4Netns && !vrf {
            return Err(refuse(SysctlRefusal::NeedsVrf));
        }
        if let Some(other) = seen.insert((parsed.family, parsed.attribute), key) {
            return Err(refuse(SysctlRefusal::Twice { other: other.to_owned() }));
        }
        let value = check_value(kind, value).map_err(refuse)?;
        out.push(Sysctl { family: parsed.family, attribute: parsed.attribute.to_owned(), value });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn keys_of_the_interface_resolve_with_canonical_values() {
        let resolved = resolve(
            &map(&[
                ("net.ipv4.conf.net1.rp_filter", " 02"),
                ("net.ipv6.conf.IFNAME.accept_ra", "0"),
                ("net.ipv4.neigh.net1.base_reachable_time_ms", "30000"),
                ("net.ipv6.conf.net1.stable_secret", "fd00:0::1"),
            ]),
            Some("net1"),
            false,
        )
        .expect("valid");
        let keys: Vec<String> = resolved.iter().map(ToString::to_string).collect();
        // In key order (a map), each with the interface left open.
        assert_eq!(
            keys,
            [
                "net.ipv4.conf.IFNAME.rp_filter=2",
                "net.ipv4.neigh.IFNAME.base_reachable_time_ms=30000",
                "net.ipv6.conf.IFNAME.accept_ra=0",
                "net.ipv6.conf.IFNAME.stable_secret=fd00::1",
            ]
        );
        assert_eq!(resolved[0].key("net7"), "net.ipv4.conf.net7.rp_filter");
        assert_eq!(resolved[0].inet_devconf(), Some((8, 2)));
    }

    #[test]
    fn refusals_name_the_reason() {
        let cases: &[(&str, &str, Option<&str>, bool, SysctlRefusal)] = &[
            (
                "net.ipv4.conf.net2.rp_filter",
                "1",
                Some("net1"),
                false,
                SysctlRefusal::OtherInterface {
                    named: "net2".into(),
                    expected: "net1 (or IFNAME)".into(),
                },
            ),
            (
                "net.ipv4.conf.all.rp_filter",
                "1",
                None,
                false,
                SysctlRefusal::OtherInterface {
                    named: "all".into(),
                    expected:
                        "named at sandbox time: write IFNAME, or set interface.name and use it"
                            .into(),
                },
            ),
            ("net.ipv4.conf.IFNAME.nonsense", "1", None, false, SysctlRefusal::Unknown),
            ("net.core.somaxconn", "1", None, false, SysctlRefusal::Unknown),
            ("net.ipv4.conf.IFNAME.mc_forwarding", "1", None, false, SysctlRefusal::ReadOnly),
            ("net.ipv4.tcp_l3mdev_accept", "1", None, false, SysctlRefusal::NeedsVrf),
            (
                "net.ipv4.conf.IFNAME.rp_filter",
                "3",
                None,
                false,
                SysctlRefusal::Value { value: "3".into(), expected: "an integer in 0..=2".into() },
            ),
            (
                "net.ipv4.conf.IFNAME.arp_notify",
                "yes",
                None,
                false,
                SysctlRefusal::Value { value: "yes".into(), expected: "0 or 1".into() },
            ),
        ];
        for (key, value, name, vrf, why) in cases {
            let err = resolve(&map(&[(key, value)]), *name, *vrf).expect_err(key);
            assert_eq!(err, ((*key).to_owned(), why.clone()), "{key}");
        }
        assert!(resolve(&map(&[("net.ipv4.tcp_l3mdev_accept", "1")]), None, true).is_ok());
    }

    #[test]
    fn the_same_attribute_twice_is_refused() {
        let err = resolve(
            &map(&[("net.ipv4.conf.IFNAME.rp_filter", "1"), ("net.ipv4.conf.net1.rp_filter", "2")]),
            Some("net1"),
            false,
        )
        .expect_err("twice");
        assert!(matches!(err.1, SysctlRefusal::Twice { .. }), "{err:?}");
    }

    #[test]
    fn claims_may_not_set_keys_that_act_for_others() {
        for key in [
            "net.ipv4.conf.IFNAME.proxy_arp",
            "net.ipv4.conf.net1.forwarding",
            "net.ipv4.conf.net1.route_localnet",
            "net.ipv4.conf.net1.accept_local",
            "net.ipv6.conf.IFNAME.proxy_ndp",
            "net.ipv6.conf.IFNAME.forwarding",
        ] {
            let keys = map(&[(key, "1")]);
            let checked = check_claim_keys(&keys);
            assert_eq!(checked, Some((key, SysctlRefusal::AdminOnly)), "{key}");
        }
        assert_eq!(check_claim_keys(&map(&[("net.ipv4.conf.net1.rp_filter", "1")])), None);
        // An administrator's entry may set them.
        assert!(resolve(&map(&[("net.ipv4.conf.IFNAME.proxy_arp", "1")]), None, false).is_ok());
    }

    #[test]
    fn forwarding_takes_the_proc_path_and_other_ipv4_keys_netlink() {
        let forwarding = Sysctl {
            family: SysctlFamily::Ipv4Conf,
            attribute: "forwarding".into(),
            value: "1".into(),
        };
        assert_eq!(forwarding.inet_devconf(), None);
        let v6 = Sysctl {
            family: SysctlFamily::Ipv6Conf,
            attribute: "accept_ra".into(),
            value: "0".into(),
        };
        assert_eq!(v6.inet_devconf(), None);
        let medium = Sysctl {
            family: SysctlFamily::Ipv4Conf,
            attribute: "medium_id".into(),
            value: "-1".into(),
        };
        assert_eq!(medium.inet_devconf(), Some((14, u32::MAX)));
    }
}
