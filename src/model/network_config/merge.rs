//! The field-by-field merge of the config entries that apply to one request: class entries
//! first, then claim entries, a later field winning.

use super::{ConfigEntry, ConfigError, IpamConfig, NetworkConfig, SriovConfig, decode};
use crate::model::bandwidth::BandwidthConfig;

impl NetworkConfig {
    /// Applies a later entry on top of this one, field by field: a field the later entry
    /// sets wins; nested objects merge per field; lists are replaced whole. `ipam.addresses`
    /// and `ipam.pool` are alternatives, so setting one drops the other, and a pool naming a
    /// different subnet replaces the earlier pool whole (its range would not fit).
    pub fn merge(&mut self, later: NetworkConfig) {
        let NetworkConfig {
            api_version,
            kind,
            pod_network,
            mode,
            interface,
            macvlan,
            ipvlan,
            vlan,
            ipam,
            routes,
            sriov,
            stats,
            routing,
            vrf,
            sysctls,
            bandwidth,
            rdma,
            ethtool,
        } = later;
        override_with(&mut self.api_version, api_version);
        override_with(&mut self.kind, kind);
        override_with(&mut self.pod_network, pod_network);
        override_with(&mut self.mode, mode);
        merge_nested(&mut self.interface, interface, |a, b| {
            override_with(&mut a.name, b.name);
            override_with(&mut a.mtu, b.mtu);
            override_with(&mut a.hardware_address, b.hardware_address);
        });
        merge_nested(&mut self.macvlan, macvlan, |a, b| {
            override_with(&mut a.mode, b.mode);
        });
        merge_nested(&mut self.ipvlan, ipvlan, |a, b| {
            override_with(&mut a.mode, b.mode);
            override_with(&mut a.flag, b.flag);
        });
        override_with(&mut self.vlan, vlan);
        merge_nested(&mut self.ipam, ipam, merge_ipam);
        override_with(&mut self.routes, routes);
        merge_nested(&mut self.sriov, sriov, |a, b| {
            // Destructured whole so that a new VF setting cannot be left out of the merge
            // (`vlanProtocol` once was: a claim's 802.1ad became 802.1Q under a class entry).
            let SriovConfig {
                qos,
                spoof_check,
                trust,
                max_tx_rate_mbps,
                min_tx_rate_mbps,
                link_state,
                vlan_protocol,
            } = b;
            override_with(&mut a.qos, qos);
            override_with(&mut a.spoof_check, spoof_check);
            override_with(&mut a.trust, trust);
            override_with(&mut a.max_tx_rate_mbps, max_tx_rate_mbps);
            override_with(&mut a.min_tx_rate_mbps, min_tx_rate_mbps);
            override_with(&mut a.link_state, link_state);
            override_with(&mut a.vlan_protocol, vlan_protocol);
        });
        override_with(&mut self.stats, stats);
        merge_nested(&mut self.routing, routing, |a, b| {
            override_with(&mut a.table, b.table);
            override_with(&mut a.source_rules, b.source_rules);
        });
        merge_nested(&mut self.vrf, vrf, |a, b| {
            override_with(&mut a.name, b.name);
            override_with(&mut a.table, b.table);
        });
        super::routing::merge_sysctls(&mut self.sysctls, sysctls);
        merge_nested(&mut self.bandwidth, bandwidth, BandwidthConfig::merge);
        override_with(&mut self.rdma, rdma);
        merge_nested(&mut self.ethtool, ethtool, super::EthtoolConfig::merge);
    }
}

fn merge_ipam(earlier: &mut IpamConfig, later: IpamConfig) {
    if later.addresses.is_some() && later.pool.is_none() {
        earlier.pool = None;
    }
    if later.pool.is_some() && later.addresses.is_none() {
        earlier.addresses = None;
    }
    override_with(&mut earlier.addresses, later.addresses);
    if let (Some(old), Some(new)) = (&earlier.pool, &later.pool)
        && new.subnet.is_some()
        && new.subnet != old.subnet
    {
        earlier.pool = None;
    }
    merge_nested(&mut earlier.pool, later.pool, |a, b| {
        override_with(&mut a.subnet, b.subnet);
        override_with(&mut a.range_start, b.range_start);
        override_with(&mut a.range_end, b.range_end);
        override_with(&mut a.gateway, b.gateway);
        override_with(&mut a.exclude, b.exclude);
    });
}

fn override_with<T>(earlier: &mut Option<T>, later: Option<T>) {
    if later.is_some() {
        *earlier = later;
    }
}

fn merge_nested<T>(earlier: &mut Option<T>, later: Option<T>, merge: impl FnOnce(&mut T, T)) {
    match (earlier.as_mut(), later) {
        (_, None) => {}
        (None, Some(later)) => *earlier = Some(later),
        (Some(e), Some(later)) => merge(e, later),
    }
}

/// Decodes and merges the entries that apply to `request`: class entries first, then claim
/// entries, each group in its given order.
pub fn merge_for_request(
    entries: &[ConfigEntry],
    request: &str,
) -> Result<NetworkConfig, ConfigError> {
    let mut ordered: Vec<(usize, &ConfigEntry)> = entries.iter().enumerate().collect();
    // The scheduler already orders class before claim entries; a stable sort keeps that
    // guarantee even for a hand-written allocation.
    ordered.sort_by_key(|(_, e)| e.source);
    let mut merged = NetworkConfig::default();
    for (index, entry) in ordered {
        if entry.applies_to(request) {
            let config = decode(index, &entry.parameters)?;
            if entry.source == super::ConfigSource::Claim {
                super::routing::check_claim_entry(&config)?;
            }
            merged.merge(config);
        }
    }
    Ok(merged)
}
