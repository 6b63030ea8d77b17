//! Inheritance from a `PodNetwork` (DESIGN §3, §4): whether a named network serves claims,
//! and the config a claim gets from it, its own fields overriding the network's field by
//! field.
//!
//! What a claim inherits: `mode`, `macvlan`, `ipvlan`, `vlan` (0 is none), `mtu` (as
//! `interface.mtu`), `routes` (a claim's list replaces the network's whole, as between config
//! entries) and the addressing. Addressing of a network with `ipam`:
//!
//! | the claim's `ipam` | the pod gets |
//! |---|---|
//! | none | one address per family of the network's subnets, from this node's blocks |
//! | `addresses: [...]` | those static addresses, first come first served among the namespaces allowed to use the network; each must lie in the network's `staticRanges` (never carved into blocks; `exclude` does not allow statics), must not be a subnet's network or broadcast address (IPv4) or subnet-router anycast address (IPv6) nor a gateway, and is reserved cluster-wide by a /32 or /128 `IPBlock` |
//! | `addresses: []` | no address |
//! | `pool` | refused (`ipam.pool`): the network assigns the addresses |
//!
//! A network without `ipam` leaves the claim's own `ipam` as it is (node-local pool or static
//! addresses, as without a network). The parent is not inherited here: it is the allocated
//! device, which the inventory publishes per parent of the network.

use std::net::IpAddr;

use ipnetwork::IpNetwork;

use super::validate::{invalid, parse_ip, parse_network, quoted, resolve_static};
use super::{
    Addressing, ConfigError, InterfaceConfig, IpamConfig, Mode, NetworkAddressing, NetworkConfig,
    Rule,
};
use crate::model::pod_network::validate::reserved_in;
use crate::model::pod_network::{CONDITION_READY, PodNetwork, PodNetworkIpam, reason};

/// Checks that the `PodNetwork` named `name` (as looked up: `None` when it does not exist)
/// serves new claims of `driver`: it exists, is not being deleted, is served by this driver,
/// and its `Ready` condition for its current generation is not `Invalid` or `Overlaps`. A
/// `Disabled` network still serves claims that were allocated while it was enabled: its pods
/// keep working (DESIGN §4). A network the controller has not looked at yet serves (the node
/// checks what it inherits itself).
pub fn check_network_serves(
    name: &str,
    network: Option<&PodNetwork>,
    driver: &str,
) -> Result<(), ConfigError> {
    let unusable = |why: String| invalid("podNetwork", quoted(name), Rule::PodNetworkUnusable(why));
    let Some(network) = network else {
        return Err(unusable("no PodNetwork of this name exists".to_owned()));
    };
    if network.metadata.deletion_timestamp.is_some() {
        return Err(unusable("the PodNetwork is being deleted".to_owned()));
    }
    if network.spec.provider != driver {
        return Err(unusable(format!(
            "the PodNetwork is served by provider {}, not {driver}",
            network.spec.provider
        )));
    }
    let status = network.status.as_ref();
    let ready = status.and_then(|s| s.conditions.iter().find(|c| c.type_ == CONDITION_READY));
    if let Some(ready) = ready {
        let observed = ready.observed_generation.or(status.and_then(|s| s.observed_generation));
        let current = network.metadata.generation;
        let for_current_spec = current.is_none() || observed == current;
        if for_current_spec
            && ready.status == "False"
            && (ready.reason == reason::INVALID || ready.reason == reason::OVERLAPS)
        {
            return Err(unusable(format!(
                "the PodNetwork is not ready ({}: {})",
                ready.reason, ready.message
            )));
        }
    }
    Ok(())
}

/// The config `cfg` gets from `network`: the network's settings overridden by `cfg`'s, and
/// the addressing when the network has `ipam` (`None`: `cfg`'s own `ipam` applies).
pub(super) fn inherit(
    cfg: &NetworkConfig,
    network: &PodNetwork,
) -> Result<(NetworkConfig, Option<Addressing>), ConfigError> {
    let spec = &network.spec;
    let name = cfg.pod_network.clone().unwrap_or_default();
    let mut merged = NetworkConfig {
        api_version: None,
        kind: None,
        pod_network: cfg.pod_network.clone(),
        mode: spec.mode,
        interface: spec.mtu.map(|mtu| InterfaceConfig { mtu: Some(mtu), ..Default::default() }),
        macvlan: spec.macvlan.clone(),
        ipvlan: spec.ipvlan.clone(),
        vlan: (spec.vlan != 0).then_some(spec.vlan),
        ipam: None,
        routes: (!spec.routes.is_empty()).then(|| spec.routes.clone()),
        sriov: None,
        stats: None,
        // An administrator's: keys a claim may not set are accepted from here.
        routing: spec.routing.clone(),
        vrf: spec.vrf.clone(),
        sysctls: spec.sysctls.clone(),
        // A PodNetwork's `bandwidth` is its parents' capacity (DESIGN §4), not a claim's ceiling.
        bandwidth: None,
        rdma: None,
        // Tuning one device is not a network's: a PodNetwork carries no `ethtool` (DESIGN §4).
        ethtool: None,
    };
    // A claim that picks another mode than the network's takes none of the network's
    // mode-specific settings (they would be refused as belonging to another mode).
    if cfg.mode.is_some_and(|mode| mode != spec.mode.unwrap_or(Mode::Macvlan)) {
        merged.macvlan = None;
        merged.ipvlan = None;
    }
    let Some(ipam) = &spec.ipam else {
        merged.merge(cfg.clone());
        return Ok((merged, None));
    };
    let own_ipam = cfg.ipam.clone().unwrap_or_default();
    let mut own = cfg.clone();
    own.ipam = None;
    merged.merge(own);
    let addressing = network_addressing(&name, ipam, &own_ipam)?;
    Ok((merged, Some(addressing)))
}

/// The addressing a claim with `own` (its merged `ipam`) gets in a network with `ipam`.
fn network_addressing(
    name: &str,
    ipam: &PodNetworkIpam,
    own: &IpamConfig,
) -> Result<Addressing, ConfigError> {
    if let Some(pool) = &own.pool {
        return Err(invalid(
            "ipam.pool",
            super::validate::to_json(pool),
            Rule::PoolWithPodNetwork { pod_network: name.to_owned() },
        ));
    }
    let mut plan = parse_plan(name, ipam)?;
    match &own.addresses {
        None => Ok(Addressing::Network(plan)),
        Some(addresses) if addresses.is_empty() => Ok(Addressing::None),
        Some(addresses) => {
            let statics = resolve_static(addresses)?;
            for (i, address) in statics.iter().enumerate() {
                check_static(name, &plan, &ipam.gateways, address.ip()).map_err(|rule| {
                    invalid(format!("ipam.addresses[{i}]"), quoted(&addresses[i]), rule)
                })?;
            }
            plan.addresses = statics;
            Ok(Addressing::Network(plan))
        }
    }
}

/// Whether a claim may hold `ip` as a static address of the network `name` (DESIGN §4): it
/// lies in `staticRanges` (the only space no block is carved from; `exclude` never allowed
/// it, so a tenant cannot pick the router's address the administrator kept out of blocks),
/// and it is neither a subnet's network, broadcast or subnet-router anycast address nor a
/// gateway (`gateway_texts`: the spec's text, for the message).
fn check_static(
    name: &str,
    plan: &NetworkAddressing,
    gateway_texts: &[String],
    ip: IpAddr,
) -> Result<(), Rule> {
    let reserved = |what: String| Rule::ReservedInNetwork { pod_network: name.to_owned(), what };
    if let Some(g) = plan.gateways.iter().position(|gateway| *gateway == ip) {
        let text = gateway_texts.get(g).map_or_else(|| ip.to_string(), Clone::clone);
        return Err(reserved(format!("{text} is the gateway spec.ipam.gateways[{g}]")));
    }
    if let Some(subnet) = plan.subnets.iter().find(|s| s.contains(ip))
        && let Some(what) = reserved_in(*subnet, ip)
    {
        return Err(reserved(format!("{ip} is {what} of {subnet}")));
    }
    if !plan.static_ranges.iter().any(|r| r.contains(ip)) {
        let ranges: Vec<String> = plan.static_ranges.iter().map(ToString::to_string).collect();
        return Err(Rule::NotInStaticRanges {
            pod_network: name.to_owned(),
            ranges: if ranges.is_empty() { "none".to_owned() } else { ranges.join(", ") },
        });
    }
    Ok(())
}

/// The network's `spec.ipam`, parsed. The controller refuses an invalid spec (condition
/// `Invalid`), but a node may see it first, or run without a controller: every field is
/// checked again, naming the network's field.
fn parse_plan(name: &str, ipam: &PodNetworkIpam) -> Result<NetworkAddressing, ConfigError> {
    let bad = |field: String, why: String| {
        invalid(
            "podNetwork",
            quoted(name),
            Rule::PodNetworkInvalid { pod_network: name.to_owned(), field, why },
        )
    };
    if ipam.subnets.is_empty() {
        return Err(bad("spec.ipam.subnets".to_owned(), "no subnet".to_owned()));
    }
    let mut subnets: Vec<IpNetwork> = Vec::with_capacity(ipam.subnets.len());
    for (i, text) in ipam.subnets.iter().enumerate() {
        let subnet = parse_network(text)
            .map_err(|rule| bad(format!("spec.ipam.subnets[{i}]"), format!("{text:?}: {rule}")))?;
        subnets.push(subnet);
    }
    let mut gateways: Vec<IpAddr> = Vec::with_capacity(ipam.gateways.len());
    for (i, text) in ipam.gateways.iter().enumerate() {
        let gateway = parse_ip(text)
            .map_err(|rule| bad(format!("spec.ipam.gateways[{i}]"), format!("{text:?}: {rule}")))?;
        gateways.push(gateway);
    }
    let mut exclude: Vec<IpNetwork> = Vec::with_capacity(ipam.exclude.len());
    for (i, text) in ipam.exclude.iter().enumerate() {
        let net = parse_network(text)
            .map_err(|rule| bad(format!("spec.ipam.exclude[{i}]"), format!("{text:?}: {rule}")))?;
        exclude.push(net);
    }
    let mut static_ranges: Vec<IpNetwork> = Vec::with_capacity(ipam.static_ranges.len());
    for (i, text) in ipam.static_ranges.iter().enumerate() {
        let path = format!("spec.ipam.staticRanges[{i}]");
        let net =
            parse_network(text).map_err(|rule| bad(path.clone(), format!("{text:?}: {rule}")))?;
        // Outside every subnet no block would skip it; the controller says so too.
        if !subnets.iter().any(|s| {
            s.is_ipv4() == net.is_ipv4() && s.prefix() <= net.prefix() && s.contains(net.network())
        }) {
            return Err(bad(path, format!("{net} is not inside any subnet")));
        }
        static_ranges.push(net);
    }
    let (block_v4, block_v6) = (ipam.block_size.ipv4, ipam.block_size.ipv6);
    if !(1..=32).contains(&block_v4) {
        return Err(bad(
            "spec.ipam.blockSize.ipv4".to_owned(),
            format!("{block_v4} is outside 1..=32"),
        ));
    }
    if !(1..=128).contains(&block_v6) {
        return Err(bad(
            "spec.ipam.blockSize.ipv6".to_owned(),
            format!("{block_v6} is outside 1..=128"),
        ));
    }
    Ok(NetworkAddressing {
        pod_network: name.to_owned(),
        subnets,
        gateways,
        exclude,
        static_ranges,
        block_v4,
        block_v6,
        addresses: Vec::new(),
    })
}

#[cfg(test)]
mod tests;
