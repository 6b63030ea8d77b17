//! `NetworkConfig` as written by a user or an administrator: every field optional, so that
//! the entries of an allocation can be merged before defaults are applied.

use serde::{Deserialize, Serialize};

use super::{IpvlanConfig, MacvlanConfig, Mode, RouteConfig};

/// One `NetworkConfig` as written by a user or an administrator; every field optional so
/// that entries can be merged before defaults are applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkConfig {
    /// Must be [`API_VERSION`](super::API_VERSION); checked before decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Must be [`KIND`](super::KIND); checked before decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// A `PodNetwork` this config inherits from: its mode, macvlan/ipvlan settings, VLAN,
    /// MTU, addressing and routes, each overridden by this config's own field
    /// ([`NetworkConfig::validate_in`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_network: Option<String>,
    /// How the pod interface is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// Pod-side interface settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<InterfaceConfig>,
    /// macvlan settings (mode `macvlan` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macvlan: Option<MacvlanConfig>,
    /// ipvlan settings (mode `ipvlan` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipvlan: Option<IpvlanConfig>,
    /// VLAN id: a sub-interface of a shared parent, or the VF's VLAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// Addressing: static addresses or a node-local pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<IpamConfig>,
    /// Routes added in the pod through this interface (a later entry replaces the list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routes: Option<Vec<RouteConfig>>,
    /// VF settings applied on the PF (mode `sriov-vf` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sriov: Option<SriovConfig>,
    /// eBPF per-interface counters (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<bool>,
    /// Source-based policy routing of the interface (`super::routing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<super::RoutingConfig>,
    /// A VRF in the pod netns the interface is enslaved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<super::VrfConfig>,
    /// Kernel settings of the interface, by dotted key (`super::sysctls`); merged key by key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sysctls: Option<std::collections::BTreeMap<String, String>>,
    /// Egress ceiling and ingress policing (DESIGN §3 `bandwidth`; `model::bandwidth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<crate::model::bandwidth::BandwidthConfig>,
    /// The netdev's RDMA function: `exclusive`, `shared` or `none` (`super::rdma`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma: Option<super::RdmaConfig>,
    /// Offload features, rings and channels of an exclusive device (`super::ethtool`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ethtool: Option<super::EthtoolConfig>,
}

/// Pod-side interface settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InterfaceConfig {
    /// Pod-side name; default names are assigned at sandbox time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// MTU of the pod interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// MAC address of the pod interface (`02:00:00:00:00:01`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_address: Option<String>,
}

/// Addressing of the pod interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpamConfig {
    /// Static interface addresses in CIDR form (`10.10.1.5/24`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addresses: Option<Vec<String>>,
    /// A node-local pool, identified by its subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<PoolConfig>,
}

/// A node-local address pool as written in the config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    /// The subnet (network form, `10.10.1.0/24`); identifies the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// First address handed out (default: first usable address of the subnet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<String>,
    /// Last address handed out (default: last usable address of the subnet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    /// Gateway of the subnet, never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// CIDRs never handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Vec<String>>,
}

/// SR-IOV VF settings as written in the config.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SriovConfig {
    /// VLAN `QoS` priority (0..7).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<u8>,
    /// MAC spoof checking on the VF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spoof_check: Option<bool>,
    /// Trusted VF (may change its MAC, enter promiscuous mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust: Option<bool>,
    /// Maximum transmit rate in Mbit/s (0: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tx_rate_mbps: Option<u32>,
    /// Minimum transmit rate in Mbit/s (0: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tx_rate_mbps: Option<u32>,
    /// VF link state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_state: Option<VfLinkState>,
    /// Tag protocol of the VF's VLAN (`802.1Q`, the default, or `802.1ad`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan_protocol: Option<VfVlanProtocol>,
}

/// Tag protocol of a VF's VLAN (`IFLA_VF_VLAN_INFO.vlan_proto`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum VfVlanProtocol {
    /// IEEE 802.1Q (`ETH_P_8021Q`), the kernel's default.
    #[default]
    #[serde(rename = "802.1Q")]
    Ieee8021Q,
    /// IEEE 802.1ad (`ETH_P_8021AD`, QinQ service tag).
    #[serde(rename = "802.1ad")]
    Ieee8021Ad,
}

impl VfVlanProtocol {
    /// The config spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ieee8021Q => "802.1Q",
            Self::Ieee8021Ad => "802.1ad",
        }
    }
}

/// VF link state (`IFLA_VF_LINK_STATE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VfLinkState {
    /// Follows the PF's link.
    #[default]
    Auto,
    /// Always up.
    Enable,
    /// Always down.
    Disable,
}
