//! `routing`, `vrf` and `sysctls` of the pod interface (DESIGN §3) as written and as
//! resolved: source-based policy routing into a table of its own, a VRF in the pod netns,
//! and the interface's kernel settings ([`super::sysctls`]).
//!
//! Table ids: 253 (`default`), 254 (`main`) and 255 (`local`) are the kernel's own tables
//! (`RT_TABLE_DEFAULT`, `RT_TABLE_MAIN`, `RT_TABLE_LOCAL`) and are refused; 0
//! (`RT_TABLE_UNSPEC`) is not a table: `routing.table: 0` (or no table) asks the driver to pick
//! one per pod at sandbox time ([`AUTO_TABLE_FIRST`] upwards, skipping the tables the pod's
//! other claims name), and a VRF must name its table.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::sysctls::{self, Sysctl};
use super::validate::{invalid, quoted};
use super::{ConfigError, NodeSupport, Rule, check_interface_name};

/// The first table id the driver picks for `routing.table: 0`; the pod's claims get
/// consecutive ids from here, skipping ids another claim of the pod names.
pub const AUTO_TABLE_FIRST: u32 = 1000;
/// Priority of the `from <address> lookup <table>` rules: after the `local` rule (0) and the
/// l3mdev rule of VRFs (1000), before `main` (32766).
pub const SOURCE_RULE_PRIORITY: u32 = 30000;

/// `routing` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RoutingConfig {
    /// Table id; 0 or absent: picked per pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
    /// `from <each address> lookup <table>` rules (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_rules: Option<bool>,
}

/// `vrf` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VrfConfig {
    /// The VRF device's name in the pod netns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The VRF's routing table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table: Option<u32>,
}

/// Routing, VRF and sysctls with defaults applied (all empty: none of them asked for).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingSettings {
    /// Source-based policy routing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRouting>,
    /// The VRF the interface is enslaved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<Vrf>,
    /// Kernel settings of the interface (and, with a VRF, the netns-wide l3mdev keys).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sysctls: Vec<Sysctl>,
}

impl RoutingSettings {
    /// Nothing asked for.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.policy.is_none() && self.vrf.is_none() && self.sysctls.is_empty()
    }
}

/// Source-based policy routing of the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyRouting {
    /// The table; 0: picked per pod at sandbox time.
    pub table: u32,
    /// Whether each address gets a `from` rule into the table.
    pub source_rules: bool,
}

/// A VRF in the pod netns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Vrf {
    /// Device name.
    pub name: String,
    /// Its table.
    pub table: u32,
}

/// Why `routing` or `vrf` was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutingRefusal {
    /// One of the kernel's own tables.
    #[error(
        "table {0} is the kernel's {1} table (253 default, 254 main and 255 local are reserved)"
    )]
    ReservedTable(u32, &'static str),
    /// A VRF without a table.
    #[error("a VRF needs a table id other than 0")]
    VrfTableZero,
    /// Not a valid interface name.
    #[error("invalid VRF name: {0}")]
    VrfName(&'static str),
    /// The VRF would take the interface's own name.
    #[error("the VRF cannot have the interface's own name")]
    VrfIsInterface,
    /// Both policy routing and a VRF.
    #[error(
        "not together with vrf: the VRF's table already keeps this interface's routes apart, \
         and its l3mdev rule decides the lookups"
    )]
    WithVrf,
    /// The kernel has no VRF.
    #[error("not available on this node: {0}")]
    VrfUnavailable(String),
}

fn reserved(table: u32) -> Option<&'static str> {
    match table {
        253 => Some("default"),
        254 => Some("main"),
        255 => Some("local"),
        _ => None,
    }
}

fn refused(path: &str, value: impl Into<String>, why: RoutingRefusal) -> ConfigError {
    invalid(path, value, Rule::Routing(why))
}

/// Resolves `routing`, `vrf` and `sysctls` of a merged config; `explicit_name` is
/// `interface.name`.
pub(super) fn resolve(
    routing: Option<&RoutingConfig>,
    vrf: Option<&VrfConfig>,
    sysctl_map: Option<&BTreeMap<String, String>>,
    explicit_name: Option<&str>,
    support: &NodeSupport,
) -> Result<RoutingSettings, ConfigError> {
    let vrf = vrf.map(|v| resolve_vrf(v, explicit_name, support)).transpose()?;
    let policy = match routing {
        None => None,
        Some(_) if vrf.is_some() => {
            return Err(refused("routing", "set", RoutingRefusal::WithVrf));
        }
        Some(routing) => {
            let table = routing.table.unwrap_or(0);
            if let Some(name) = reserved(table) {
                return Err(refused(
                    "routing.table",
                    table.to_string(),
                    RoutingRefusal::ReservedTable(table, name),
                ));
            }
            Some(PolicyRouting { table, source_rules: routing.source_rules.unwrap_or(true) })
        }
    };
    let sysctls = match sysctl_map {
        None => Vec::new(),
        Some(map) => {
            sysctls::resolve(map, explicit_name, vrf.is_some()).map_err(|(key, why)| {
                let value = map.get(&key).map_or_else(String::new, |v| quoted(v));
                invalid(sysctls::path(&key), value, Rule::Sysctl(why))
            })?
        }
    };
    Ok(RoutingSettings { policy, vrf, sysctls })
}

fn resolve_vrf(
    vrf: &VrfConfig,
    explicit_name: Option<&str>,
    support: &NodeSupport,
) -> Result<Vrf, ConfigError> {
    let Some(name) = &vrf.name else {
        return Err(invalid("vrf.name", super::MISSING, Rule::Missing));
    };
    check_interface_name(name)
        .map_err(|why| refused("vrf.name", quoted(name), RoutingRefusal::VrfName(why)))?;
    if explicit_name == Some(name.as_str()) {
        return Err(refused("vrf.name", quoted(name), RoutingRefusal::VrfIsInterface));
    }
    let table = match vrf.table {
        None => return Err(invalid("vrf.table", super::MISSING, Rule::Missing)),
        Some(0) => return Err(refused("vrf.table", "0", RoutingRefusal::VrfTableZero)),
        Some(table) => table,
    };
    if let Some(reserved) = reserved(table) {
        return Err(refused(
            "vrf.table",
            table.to_string(),
            RoutingRefusal::ReservedTable(table, reserved),
        ));
    }
    if let Some(why) = support.vrf_refusal() {
        return Err(refused(
            "vrf",
            format!("{{name: {name}, table: {table}}}"),
            RoutingRefusal::VrfUnavailable(why.to_owned()),
        ));
    }
    Ok(Vrf { name: name.clone(), table })
}

/// Merges a later `sysctls` map into an earlier one key by key (a later value wins).
pub(super) fn merge_sysctls(
    earlier: &mut Option<BTreeMap<String, String>>,
    later: Option<BTreeMap<String, String>>,
) {
    match (earlier.as_mut(), later) {
        (_, None) => {}
        (None, Some(later)) => *earlier = Some(later),
        (Some(e), Some(later)) => e.extend(later),
    }
}

/// Refuses, in a claim's own config entry, the `sysctls` keys only an administrator may set
/// (DESIGN §3): a DeviceClass entry or the PodNetwork may, the claim never.
pub(super) fn check_claim_entry(config: &super::NetworkConfig) -> Result<(), ConfigError> {
    let Some(map) = &config.sysctls else {
        return Ok(());
    };
    match sysctls::check_claim_keys(map) {
        None => Ok(()),
        Some((key, why)) => Err(invalid(
            sysctls::path(key),
            map.get(key).map_or_else(String::new, |v| quoted(v)),
            Rule::Sysctl(why),
        )),
    }
}

#[cfg(test)]
mod tests;
