//! The routing part of an attach plan (DESIGN §3 `routing`, `vrf`, `sysctls`; decision 0020):
//! the steps that put the interface into a VRF, set its sysctls before it goes up, and copy
//! its routes into a table of its own reached through `from <address>` rules, so that replies
//! leave through the interface they arrived on; the table ids a pod's claims get; and what the
//! claim status reports as applied.
//!
//! Where the steps go in a plan:
//! `[EnsureVlan] → [EnsureVrf] → CreateChild | MoveIntoPod → [JoinVrf] → [SetSysctls] →
//! AddAddress… → SetUp → AddRoute… | AddTableRoute… (VRF) → AddTableRoute… → AddRule…`.
//! The VRF exists before the interface is enslaved, and the interface is enslaved and tuned
//! while still down (enslaving an up device cycles it, `do_vrf_add_slave`; address and
//! neighbour settings apply from the first packet). Table routes come after the link is up
//! (a nexthop on a down link is refused), and the rules last, so a rule never points at a
//! table that is still being filled.
//!
//! What detach undoes: the rules (a rule belongs to the netns, not to the link) and the VRF
//! once no interface is enslaved to it any more. Table routes and the VRF membership go with
//! the link (deleted, or moved out of the netns: `__dev_change_net_namespace` unregisters it
//! there, which flushes its routes and detaches it from its master). Sysctls too: the IPv4
//! and IPv6 per-device state (`in_device`, `inet6_dev`, with their neighbour parameters) is
//! destroyed on the move and made afresh from the target netns's defaults, so a device that
//! returns to the host comes back with the host's defaults, not the pod's values (root test
//! `tests/netns/routing_netns.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use crate::model::network_config::{
    AUTO_TABLE_FIRST, Addressing, ResolvedNetworkConfig, Route, SOURCE_RULE_PRIORITY, Sysctl, Vrf,
};

use super::{AttachPlan, RouteDisplay, Step};

/// `from <address> lookup <table>` in the pod netns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceRule {
    /// The interface address the rule matches (as a /32 or /128 source).
    pub from: IpAddr,
    /// The table it looks up.
    pub table: u32,
    /// The rule's priority.
    pub priority: u32,
}

impl fmt::Display for SourceRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "from {} lookup {} pref {}", self.from, self.table, self.priority)
    }
}

/// A route through the interface in a table other than `main`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TableRoute {
    /// The route.
    pub route: Route,
    /// Its table.
    pub table: u32,
}

impl fmt::Display for TableRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} table {}", RouteDisplay(&self.route), self.table)
    }
}

/// What the claim status reports of an attach's routing (`data.routing`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedRouting {
    /// The interface's own table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// The source rules (`from 10.10.1.5 lookup 1000 pref 30000`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// The VRF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<Vrf>,
    /// The sysctls, by full key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sysctls: BTreeMap<String, String>,
}

impl AppliedRouting {
    /// Nothing applied.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.table.is_none()
            && self.rules.is_empty()
            && self.vrf.is_none()
            && self.sysctls.is_empty()
    }
}

/// The steps before the interface exists: the VRF.
pub(super) fn before_link(config: &ResolvedNetworkConfig) -> Vec<Step> {
    config.routing.vrf.iter().map(|vrf| Step::EnsureVrf { vrf: vrf.clone() }).collect()
}

/// The steps between the interface's arrival in the pod and its addresses: enslave, sysctls.
pub(super) fn while_down(config: &ResolvedNetworkConfig) -> Vec<Step> {
    let mut steps = Vec::new();
    if let Some(vrf) = &config.routing.vrf {
        steps.push(Step::JoinVrf { vrf: vrf.name.clone() });
    }
    if !config.routing.sysctls.is_empty() {
        steps.push(Step::SetSysctls { sysctls: config.routing.sysctls.clone() });
    }
    steps
}

/// The route steps after the link is up: the config's routes into `main`, or into the VRF's
/// table; with policy routing, the interface's subnets, the config's routes and a default
/// route via the network's gateway into the interface's table, then the source rules.
pub(super) fn after_up(config: &ResolvedNetworkConfig, addresses: &[IpNetwork]) -> Vec<Step> {
    let mut steps: Vec<Step> = match &config.routing.vrf {
        Some(vrf) => config
            .routes
            .iter()
            .map(|route| Step::AddTableRoute {
                route: TableRoute { route: route.clone(), table: vrf.table },
            })
            .collect(),
        None => config.routes.iter().map(|route| Step::AddRoute { route: route.clone() }).collect(),
    };
    let Some(policy) = config.routing.policy else {
        return steps;
    };
    let table = if policy.table == 0 { AUTO_TABLE_FIRST } else { policy.table };
    let mut in_table: Vec<Route> = Vec::new();
    for address in addresses {
        let subnet = canonical_network(*address);
        let host = if address.is_ipv4() { 32 } else { 128 };
        if address.prefix() < host && !in_table.iter().any(|r| r.destination == subnet) {
            in_table.push(Route { destination: subnet, gateway: None, metric: None });
        }
    }
    in_table.extend(config.routes.iter().cloned());
    for gateway in gateways(&config.addressing, addresses) {
        let has_default = in_table
            .iter()
            .any(|r| r.destination.prefix() == 0 && r.destination.is_ipv4() == gateway.is_ipv4());
        if !has_default {
            let any: IpAddr = if gateway.is_ipv4() {
                std::net::Ipv4Addr::UNSPECIFIED.into()
            } else {
                std::net::Ipv6Addr::UNSPECIFIED.into()
            };
            // A prefix length of 0 is valid for both families.
            if let Ok(destination) = IpNetwork::new(any, 0) {
                in_table.push(Route { destination, gateway: Some(gateway), metric: None });
            }
        }
    }
    steps.extend(
        in_table
            .into_iter()
            .map(|route| Step::AddTableRoute { route: TableRoute { route, table } }),
    );
    if policy.source_rules {
        steps.extend(addresses.iter().map(|address| Step::AddRule {
            rule: SourceRule { from: address.ip(), table, priority: SOURCE_RULE_PRIORITY },
        }));
    }
    steps
}

/// The gateways of the addressing that lie on the interface's subnets, one per family: a
/// pool's gateway, or a `PodNetwork`'s `ipam.gateways`. Static addresses name none (a default
/// route for them is a `routes` entry).
fn gateways(addressing: &Addressing, addresses: &[IpNetwork]) -> Vec<IpAddr> {
    let candidates: Vec<IpAddr> = match addressing {
        Addressing::Pool(pool) => pool.gateway.into_iter().collect(),
        Addressing::Network(network) => network.gateways.clone(),
        Addressing::None | Addressing::Static(_) => Vec::new(),
    };
    let mut out: Vec<IpAddr> = Vec::new();
    for gateway in candidates {
        let connected = addresses.iter().any(|a| canonical_network(*a).contains(gateway));
        if connected && !out.iter().any(|g| g.is_ipv4() == gateway.is_ipv4()) {
            out.push(gateway);
        }
    }
    out
}

/// The network of an interface address (`10.1.1.5/24` → `10.1.1.0/24`).
fn canonical_network(net: IpNetwork) -> IpNetwork {
    IpNetwork::new(net.network(), net.prefix()).unwrap_or(net)
}

/// Table ids for the pod's interfaces that asked the driver to pick one (`routing.table` 0),
/// in the pod's interface order: consecutive from [`AUTO_TABLE_FIRST`], skipping every table
/// another interface of the pod names (policy or VRF) and `taken` (the tables of interfaces
/// attached before). `None` for an interface without an automatic table.
#[must_use]
pub fn assign_tables(configs: &[&ResolvedNetworkConfig], taken: &[u32]) -> Vec<Option<u32>> {
    let mut used: BTreeSet<u32> = taken.iter().copied().collect();
    for config in configs {
        if let Some(policy) = config.routing.policy.filter(|p| p.table != 0) {
            used.insert(policy.table);
        }
        if let Some(vrf) = &config.routing.vrf {
            used.insert(vrf.table);
        }
    }
    let mut next = AUTO_TABLE_FIRST;
    configs
        .iter()
        .map(|config| {
            config.routing.policy.filter(|p| p.table == 0)?;
            while used.contains(&next) {
                next += 1;
            }
            used.insert(next);
            Some(next)
        })
        .collect()
}

/// The config with an automatic table replaced by `table`.
#[must_use]
pub fn with_table(config: &ResolvedNetworkConfig, table: u32) -> ResolvedNetworkConfig {
    let mut config = config.clone();
    if let Some(policy) = config.routing.policy.as_mut() {
        policy.table = table;
    }
    config
}

impl AttachPlan {
    /// The tables the plan puts routes in or points rules at (policy and VRF).
    #[must_use]
    pub fn tables(&self) -> Vec<u32> {
        let mut tables: Vec<u32> = self
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::AddTableRoute { route } => Some(route.table),
                Step::AddRule { rule } => Some(rule.table),
                Step::EnsureVrf { vrf } => Some(vrf.table),
                _ => None,
            })
            .collect();
        tables.sort_unstable();
        tables.dedup();
        tables
    }

    /// What the claim status reports of this plan's routing.
    #[must_use]
    pub fn applied_routing(&self) -> AppliedRouting {
        let mut applied = AppliedRouting::default();
        for step in &self.steps {
            match step {
                Step::EnsureVrf { vrf } => applied.vrf = Some(vrf.clone()),
                Step::AddTableRoute { route } if applied.vrf.is_none() => {
                    applied.table = Some(route.table);
                }
                Step::AddRule { rule } => {
                    applied.table = Some(rule.table);
                    applied.rules.push(rule.to_string());
                }
                Step::SetSysctls { sysctls } => applied.sysctls.extend(
                    sysctls.iter().map(|s: &Sysctl| (s.key(&self.interface_name), s.value.clone())),
                ),
                _ => {}
            }
        }
        applied
    }

    /// The routes the plan adds to tables other than `main`, in plan order.
    #[must_use]
    pub fn table_routes(&self) -> Vec<TableRoute> {
        self.steps
            .iter()
            .filter_map(|step| match step {
                Step::AddTableRoute { route } => Some(route.clone()),
                _ => None,
            })
            .collect()
    }
}
