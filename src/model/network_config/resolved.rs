//! The validated config with every default applied: what `podnet::plan` and `ipam` consume.

use std::net::IpAddr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};

use super::{IpvlanFlag, IpvlanMode, MacAddr, MacvlanMode, Mode, VfLinkState, VfVlanProtocol};

/// A validated config with every default applied: what `podnet::plan` and `ipam` consume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedNetworkConfig {
    /// The `PodNetwork` named by the config, if any.
    pub pod_network: Option<String>,
    /// How the interface is made, with its mode-specific settings.
    pub mode: ResolvedMode,
    /// Pod-side interface.
    pub interface: ResolvedInterface,
    /// Static addresses, a pool, or nothing.
    pub addressing: Addressing,
    /// Routes, in config order.
    pub routes: Vec<Route>,
    /// VLAN id (sub-interface of a shared parent, or the VF's VLAN).
    pub vlan: Option<u16>,
    /// VF settings (mode `sriov-vf` only, defaulted).
    pub sriov: Option<SriovSettings>,
    /// eBPF counters on the interface.
    pub stats: bool,
    /// Source-based policy routing, VRF and sysctls (all empty when none is asked for).
    #[serde(default, skip_serializing_if = "super::RoutingSettings::is_empty")]
    pub routing: super::RoutingSettings,
    /// Egress ceiling and ingress policing (`model::bandwidth`): `None` when the config has no
    /// `bandwidth` section and the allocation consumed no bandwidth. The ceiling to enforce
    /// is `bandwidth.ceiling`, completed by the claim service at prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<crate::model::bandwidth::ResolvedBandwidth>,
    /// The netdev's RDMA function as the pod gets it (`None`: none, or `rdma: none`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<super::ResolvedRdma>,
}

/// The mode with its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum ResolvedMode {
    /// macvlan child of the device.
    Macvlan {
        /// macvlan mode.
        mode: MacvlanMode,
    },
    /// ipvlan child of the device.
    Ipvlan {
        /// ipvlan mode.
        mode: IpvlanMode,
        /// ipvlan flag.
        flag: IpvlanFlag,
    },
    /// The device itself moves into the pod.
    HostDevice,
    /// The VF moves into the pod.
    SriovVf,
    /// The PCI function is bound to `vfio-pci` (no interface in the pod).
    Vfio,
}

impl ResolvedMode {
    /// The plain mode.
    #[must_use]
    pub fn mode(self) -> Mode {
        match self {
            ResolvedMode::Macvlan { .. } => Mode::Macvlan,
            ResolvedMode::Ipvlan { .. } => Mode::Ipvlan,
            ResolvedMode::HostDevice => Mode::HostDevice,
            ResolvedMode::SriovVf => Mode::SriovVf,
            ResolvedMode::Vfio => Mode::Vfio,
        }
    }
}

/// The pod-side interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedInterface {
    /// Explicit name; `None` means a default name is assigned at sandbox time.
    pub name: Option<String>,
    /// MTU (explicit, else the device's/parent's current MTU).
    pub mtu: u32,
    /// Explicit MAC address; `None` keeps the kernel's.
    pub hardware_address: Option<MacAddr>,
}

/// Addressing of the interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Addressing {
    /// No address (the pod configures it, or L2 only).
    None,
    /// Static interface addresses (host bits kept).
    Static(Vec<IpNetwork>),
    /// One address from a node-local pool.
    Pool(PoolSpec),
    /// Addresses from a `PodNetwork`'s cluster-wide plan: one per family from the node's
    /// blocks, or the claim's static addresses reserved cluster-wide.
    Network(NetworkAddressing),
}

impl Addressing {
    /// Whether an IPv6 address will be configured.
    #[must_use]
    pub fn has_ipv6(&self) -> bool {
        match self {
            Addressing::None => false,
            Addressing::Static(addrs) => addrs.iter().any(IpNetwork::is_ipv6),
            Addressing::Pool(pool) => pool.subnet.is_ipv6(),
            Addressing::Network(network) if network.addresses.is_empty() => {
                network.subnets.iter().any(IpNetwork::is_ipv6)
            }
            Addressing::Network(network) => network.addresses.iter().any(IpNetwork::is_ipv6),
        }
    }
}

/// A `PodNetwork`'s address plan as a claim resolved it (DESIGN §4): what the node's block
/// IPAM needs, kept in the prepared claim so the claim keeps the plan it was prepared with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkAddressing {
    /// The `PodNetwork`.
    pub pod_network: String,
    /// `spec.ipam.subnets` in network form, in order: a pod gets one address per family,
    /// from the first subnet of the family with a free block.
    pub subnets: Vec<IpNetwork>,
    /// `spec.ipam.gateways`: never handed out.
    pub gateways: Vec<IpAddr>,
    /// `spec.ipam.exclude`: never handed out from blocks.
    pub exclude: Vec<IpNetwork>,
    /// `spec.ipam.staticRanges`: where static addresses come from; no block that touches one
    /// is ever carved (absent in plans recorded before the field existed: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub static_ranges: Vec<IpNetwork>,
    /// Prefix length of IPv4 blocks.
    pub block_v4: u8,
    /// Prefix length of IPv6 blocks.
    pub block_v6: u8,
    /// The claim's static addresses (`ipam.addresses`, inside `staticRanges`), each reserved
    /// cluster-wide by a /32 or /128 `IPBlock`; empty: one address per family from the
    /// node's blocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpNetwork>,
}

impl NetworkAddressing {
    /// The subnets of one family, in order.
    pub fn subnets_of(&self, ipv4: bool) -> impl Iterator<Item = IpNetwork> + '_ {
        self.subnets.iter().copied().filter(move |s| s.is_ipv4() == ipv4)
    }

    /// The block prefix length of a family.
    #[must_use]
    pub fn block_prefix(&self, ipv4: bool) -> u8 {
        if ipv4 { self.block_v4 } else { self.block_v6 }
    }

    /// The families this network gives addresses in (IPv4 first).
    #[must_use]
    pub fn families(&self) -> Vec<bool> {
        [true, false].into_iter().filter(|v4| self.subnets_of(*v4).next().is_some()).collect()
    }
}

/// A validated node-local pool; `range_start..=range_end` lies inside `subnet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    /// The subnet in network form; identifies the pool on this node.
    pub subnet: IpNetwork,
    /// First address handed out.
    pub range_start: IpAddr,
    /// Last address handed out.
    pub range_end: IpAddr,
    /// Gateway, never handed out.
    pub gateway: Option<IpAddr>,
    /// CIDRs never handed out.
    pub exclude: Vec<IpNetwork>,
}

/// A validated route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// Destination in network form.
    pub destination: IpNetwork,
    /// Next hop inside a connected subnet; `None` is on-link.
    pub gateway: Option<IpAddr>,
    /// Metric; `None` leaves the kernel default.
    pub metric: Option<u32>,
}

/// VF settings with defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SriovSettings {
    /// VLAN `QoS` priority.
    pub qos: u8,
    /// MAC spoof checking (default true).
    pub spoof_check: bool,
    /// Trusted VF (default false).
    pub trust: bool,
    /// Maximum transmit rate, 0 unlimited.
    pub max_tx_rate_mbps: u32,
    /// Minimum transmit rate, 0 none.
    pub min_tx_rate_mbps: u32,
    /// VF link state.
    pub link_state: VfLinkState,
    /// Tag protocol of the VF's VLAN (default 802.1Q).
    #[serde(default)]
    pub vlan_protocol: VfVlanProtocol,
}
