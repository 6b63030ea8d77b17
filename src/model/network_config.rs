//! `NetworkConfig` (DESIGN §3): strict decoding of the opaque claim/class parameters, the
//! field-by-field merge of the allocation's config entries, and validation against the
//! allocated device into a fully defaulted [`ResolvedNetworkConfig`].
//!
//! The input is the snapshot the scheduler copied into `status.allocation.devices.config`
//! (class entries first, then claim entries), already filtered to `driver: netclaim.dev`.
//! Every error names the field path (`interface.name`, `routes[1].gateway`) and the
//! offending value, because the message ends up in the claim status and in a Pod Event.

mod inherit;
mod validate;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use ipnetwork::IpNetwork;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use inherit::check_network_serves;
pub use validate::{MAX_ADDRESSES, MAX_ROUTES, check_interface_name};
// The device vocabulary is the model's one (`model::device`); validation speaks it too.
pub use crate::model::device::{DeviceKind, Sharing};
pub use crate::model::support::NodeSupport;

/// The only `apiVersion` this driver understands.
pub const API_VERSION: &str = "netclaim.dev/v1alpha1";
/// The `kind` of the opaque parameters.
pub const KIND: &str = "NetworkConfig";

/// One `NetworkConfig` as written by a user or an administrator; every field optional so
/// that entries can be merged before defaults are applied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NetworkConfig {
    /// Must be [`API_VERSION`]; checked before decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Must be [`KIND`]; checked before decoding.
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
}

/// How the pod interface is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// A macvlan child of a shared parent.
    Macvlan,
    /// An ipvlan child of a shared parent.
    Ipvlan,
    /// The whole device moves into the pod.
    HostDevice,
    /// An SR-IOV VF moves into the pod, with VF settings applied on its PF.
    SriovVf,
}

impl Mode {
    /// The name used in the config (`host-device`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Macvlan => "macvlan",
            Mode::Ipvlan => "ipvlan",
            Mode::HostDevice => "host-device",
            Mode::SriovVf => "sriov-vf",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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

/// macvlan settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MacvlanConfig {
    /// macvlan mode (default bridge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<MacvlanMode>,
}

/// macvlan mode (`IFLA_MACVLAN_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MacvlanMode {
    /// Children of one parent talk to each other directly.
    #[default]
    Bridge,
    /// No traffic between children of one parent.
    Private,
    /// Traffic between children goes through the external switch.
    Vepa,
    /// The single child takes over the parent.
    Passthru,
}

/// ipvlan settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IpvlanConfig {
    /// ipvlan mode (default l2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<IpvlanMode>,
    /// ipvlan flag (default bridge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flag: Option<IpvlanFlag>,
}

/// ipvlan mode (`IFLA_IPVLAN_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpvlanMode {
    /// Layer 2 switching between children.
    #[default]
    L2,
    /// Layer 3 routing, no multicast.
    L3,
    /// Layer 3 with netfilter (conntrack) on the parent.
    L3s,
}

/// ipvlan flag (`IFLA_IPVLAN_FLAGS`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IpvlanFlag {
    /// Children talk to each other directly.
    #[default]
    Bridge,
    /// No traffic between children.
    Private,
    /// Traffic between children goes through the external switch.
    Vepa,
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

/// One route as written in the config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteConfig {
    /// Destination in network form (`10.20.0.0/16`, `0.0.0.0/0`).
    pub destination: String,
    /// Next hop; none means on-link through the interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Route metric (priority).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
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

/// Where a config entry came from (`DeviceAllocationConfiguration.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConfigSource {
    /// `FromClass`: the `DeviceClass` config.
    #[serde(rename = "FromClass")]
    Class,
    /// `FromClaim`: the claim's own config.
    #[serde(rename = "FromClaim")]
    Claim,
}

impl ConfigSource {
    /// Parses `DeviceAllocationConfiguration.source` (`FromClass` / `FromClaim`).
    #[must_use]
    pub fn from_api(source: &str) -> Option<ConfigSource> {
        match source {
            "FromClass" => Some(ConfigSource::Class),
            "FromClaim" => Some(ConfigSource::Claim),
            _ => None,
        }
    }
}

/// One entry of `status.allocation.devices.config` for this driver.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigEntry {
    /// Class or claim.
    pub source: ConfigSource,
    /// The requests it applies to; empty means every request.
    pub requests: Vec<String>,
    /// The opaque `parameters` object.
    pub parameters: Value,
}

impl ConfigEntry {
    /// Whether this entry applies to the allocation result of `request`. A result of a
    /// `firstAvailable` request is named `<req>/<sub>`, and an entry naming `<req>` applies
    /// to it (Kubernetes matches config to the main request name).
    #[must_use]
    pub fn applies_to(&self, request: &str) -> bool {
        if self.requests.is_empty() {
            return true;
        }
        let main = request.split_once('/').map_or(request, |(main, _)| main);
        self.requests.iter().any(|r| r == request || r == main)
    }
}

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
}

/// A MAC address (EUI-48).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    /// Group (multicast/broadcast) bit of the first octet.
    #[must_use]
    pub fn is_multicast(self) -> bool {
        self.0[0] & 1 == 1
    }
}

/// Why a string is not a MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a MAC address of six hex octets separated by ':'")]
pub struct MacAddrParseError;

impl FromStr for MacAddr {
    type Err = MacAddrParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut octets = [0u8; 6];
        let mut parts = s.split(':');
        for octet in &mut octets {
            let part = parts.next().ok_or(MacAddrParseError)?;
            if part.len() != 2 {
                return Err(MacAddrParseError);
            }
            *octet = u8::from_str_radix(part, 16).map_err(|_| MacAddrParseError)?;
        }
        if parts.next().is_some() {
            return Err(MacAddrParseError);
        }
        Ok(MacAddr(octets))
    }
}

impl TryFrom<String> for MacAddr {
    type Error = MacAddrParseError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<MacAddr> for String {
    fn from(mac: MacAddr) -> String {
        mac.to_string()
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, octet) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{octet:02x}")?;
        }
        Ok(())
    }
}

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
    /// `spec.ipam.exclude`: never carved into blocks; static addresses live here.
    pub exclude: Vec<IpNetwork>,
    /// Prefix length of IPv4 blocks.
    pub block_v4: u8,
    /// Prefix length of IPv6 blocks.
    pub block_v6: u8,
    /// The claim's static addresses (`ipam.addresses`, inside `exclude`), each reserved
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

/// Which rule a value broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rule {
    /// The mode cannot be used on this device.
    #[error("mode not allowed on this device ({sharing}, {kind}; allowed: {allowed})")]
    ModeNotAllowed {
        /// Device sharing.
        sharing: Sharing,
        /// Device type.
        kind: DeviceKind,
        /// The allowed modes, comma separated.
        allowed: String,
    },
    /// A mode-specific section used with another mode.
    #[error("only allowed with mode {needs}, but the mode is {mode}")]
    SectionNeedsMode {
        /// The mode the section belongs to.
        needs: Mode,
        /// The resolved mode.
        mode: Mode,
    },
    /// A required field is missing.
    #[error("required")]
    Missing,
    /// Invalid interface name.
    #[error("invalid interface name: {0}")]
    InterfaceName(&'static str),
    /// MTU out of the allowed range.
    #[error("MTU outside {min}..={max} ({why})")]
    MtuOutOfRange {
        /// Lowest allowed.
        min: u32,
        /// Highest allowed.
        max: u32,
        /// Where the limits come from.
        why: &'static str,
    },
    /// IPv6 needs MTU >= 1280 (RFC 8200 §5; the kernel removes IPv6 from smaller links).
    #[error("an IPv6 address needs an MTU of at least 1280")]
    MtuTooSmallForIpv6,
    /// macvlan passthru takes over the whole parent.
    #[error(
        "passthru allows one child per parent, and no other child next to it \
         (parent has {passthru_children} passthru and {other_children} other children)"
    )]
    Passthru {
        /// Existing passthru children.
        passthru_children: u32,
        /// Existing other children.
        other_children: u32,
    },
    /// The node cannot attach this mode (its kernel lacks the link kind, or this build does
    /// not implement the attach yet): refused at prepare, never at sandbox time.
    #[error("not available on this node: {0}")]
    ModeUnavailable(String),
    /// The node cannot create VLAN sub-interfaces (no 8021q in its kernel).
    #[error("not available on this node: {0}")]
    VlanUnavailable(String),
    /// A parent carries one kind of child: macvlan and ipvlan each take the parent's one
    /// receive handler (`netdev_rx_handler_register` answers `EBUSY` to the second kind).
    #[error(
        "a parent carries one kind of child, and this one already has {count} {existing} \
         children"
    )]
    ChildKindMix {
        /// The kind already on the parent.
        existing: Mode,
        /// How many of them.
        count: u32,
    },
    /// ipvlan children share the parent's MAC address.
    #[error("not allowed with ipvlan (ipvlan children share the parent's MAC address)")]
    HardwareAddressWithIpvlan,
    /// Invalid MAC address.
    #[error("invalid MAC address: {0}")]
    MacAddress(&'static str),
    /// Not an address in CIDR form.
    #[error("invalid CIDR: {0}")]
    Cidr(String),
    /// Not an IP address.
    #[error("invalid IP address: {0}")]
    IpAddress(String),
    /// An address that cannot be given to an interface.
    #[error("address not usable on an interface: {0}")]
    AddressNotUsable(&'static str),
    /// The same address twice.
    #[error("duplicate address")]
    DuplicateAddress,
    /// More addresses than the claim status can report.
    #[error("more than {max} addresses (the limit of networkData.ips)")]
    TooManyAddresses {
        /// The limit.
        max: usize,
    },
    /// Static addresses and a pool in one config.
    #[error("static addresses and a pool are mutually exclusive")]
    AddressesAndPool,
    /// A network with host bits set.
    #[error("host bits set, the network is {network}")]
    NotANetwork {
        /// The network form.
        network: IpNetwork,
    },
    /// An address outside its subnet.
    #[error("not inside {subnet}")]
    NotInSubnet {
        /// The subnet.
        subnet: IpNetwork,
    },
    /// rangeStart after rangeEnd.
    #[error("range start is after the range end {end}")]
    RangeReversed {
        /// The range end.
        end: IpAddr,
    },
    /// Mixed IPv4 and IPv6.
    #[error("address family differs from {other}")]
    FamilyMismatch {
        /// What it was compared with.
        other: String,
    },
    /// A gateway outside every connected subnet.
    #[error("gateway not inside a subnet of the interface ({connected})")]
    GatewayNotConnected {
        /// The connected subnets, comma separated (or "none").
        connected: String,
    },
    /// A default route without a metric would collide with the pod's primary default route.
    #[error(
        "a default route needs a metric > 0 (the pod's primary network already has a \
         default route)"
    )]
    DefaultRouteNeedsMetric,
    /// The same destination and metric twice.
    #[error("duplicate route (same destination and metric as routes[{index}])")]
    DuplicateRoute {
        /// The earlier route.
        index: usize,
    },
    /// More routes than an interface takes.
    #[error("more than {max} routes")]
    TooManyRoutes {
        /// The limit.
        max: usize,
    },
    /// VLAN id out of 1..=4094 (802.1Q reserves 0 and 4095).
    #[error("VLAN id outside 1..=4094")]
    VlanOutOfRange,
    /// VLAN only on shared parents (macvlan/ipvlan) and VFs.
    #[error("VLAN not supported with mode {mode} (only macvlan, ipvlan or sriov-vf)")]
    VlanNotForMode {
        /// The resolved mode.
        mode: Mode,
    },
    /// A number out of range.
    #[error("outside {min}..={max}")]
    OutOfRange {
        /// Lowest allowed.
        min: u64,
        /// Highest allowed.
        max: u64,
    },
    /// Minimum rate above maximum rate.
    #[error("above maxTxRateMbps {max}")]
    MinRateAboveMax {
        /// The maximum rate.
        max: u32,
    },
    /// Not a DNS label (a Kubernetes object name).
    #[error("not a DNS label (lowercase alphanumerics and '-', at most 63)")]
    DnsLabel,
    /// A node-local pool in a config whose `PodNetwork` assigns the addresses.
    #[error(
        "not allowed with podNetwork {pod_network}, which assigns addresses from its subnets \
         (static addresses inside its ipam.exclude go in ipam.addresses)"
    )]
    PoolWithPodNetwork {
        /// The network.
        pod_network: String,
    },
    /// A static address of a `PodNetwork` claim outside the network's `exclude` (the only
    /// part of the network never carved into blocks, so no node hands it out).
    #[error("not inside podNetwork {pod_network}'s ipam.exclude ({exclude})")]
    NotInNetworkExclude {
        /// The network.
        pod_network: String,
        /// Its excludes, comma separated (or "none").
        exclude: String,
    },
    /// The named `PodNetwork` cannot serve claims (missing, being deleted, invalid, ...).
    #[error("{0}")]
    PodNetworkUnusable(String),
    /// The `PodNetwork`'s own spec is invalid where the claim inherits from it.
    #[error("PodNetwork {pod_network}: {field}: {why}")]
    PodNetworkInvalid {
        /// The network.
        pod_network: String,
        /// The field of the network (`spec.ipam.subnets[0]`).
        field: String,
        /// What is wrong.
        why: String,
    },
}

/// Why a config was rejected; every variant names the field and the offending value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `parameters` is larger than the API server accepts for opaque device configuration
    /// (resource.k8s.io `OpaqueParametersMaxLength`): bounded work under the state lock.
    #[error("config entry {entry}: parameters: {value}, more than the {max} bytes allowed")]
    TooLarge {
        /// Index of the entry.
        entry: usize,
        /// Its encoded size (`12000 bytes`).
        value: String,
        /// The limit.
        max: usize,
    },
    /// `parameters` is not a JSON object.
    #[error("config entry {entry}: parameters: {value}: not a JSON object")]
    NotAnObject {
        /// Index of the entry in the allocation's config list.
        entry: usize,
        /// The value (JSON).
        value: String,
    },
    /// Missing or unsupported `apiVersion`.
    #[error("config entry {entry}: apiVersion: {value}: expected {API_VERSION}")]
    ApiVersion {
        /// Index of the entry.
        entry: usize,
        /// The value (JSON), `<missing>` when absent.
        value: String,
    },
    /// Missing or unsupported `kind`.
    #[error("config entry {entry}: kind: {value}: expected {KIND}")]
    Kind {
        /// Index of the entry.
        entry: usize,
        /// The value (JSON), `<missing>` when absent.
        value: String,
    },
    /// Strict decoding failed: unknown field, wrong type, unknown enum value.
    #[error("config entry {entry}: {path}: {value}: {source}")]
    Decode {
        /// Index of the entry.
        entry: usize,
        /// Field path (`interface.mtu`).
        path: String,
        /// The offending value (JSON), `<missing>` when absent.
        value: String,
        /// The decoder's message.
        #[source]
        source: serde_json::Error,
    },
    /// The merged config breaks a rule.
    #[error("{path}: {value}: {rule}")]
    Invalid {
        /// Field path (`routes[1].gateway`).
        path: String,
        /// The offending value.
        value: String,
        /// The rule.
        rule: Rule,
    },
}

impl ConfigError {
    /// The field path the error is about.
    #[must_use]
    pub fn path(&self) -> &str {
        match self {
            ConfigError::NotAnObject { .. } | ConfigError::TooLarge { .. } => "parameters",
            ConfigError::ApiVersion { .. } => "apiVersion",
            ConfigError::Kind { .. } => "kind",
            ConfigError::Decode { path, .. } | ConfigError::Invalid { path, .. } => path,
        }
    }

    /// The offending value.
    #[must_use]
    pub fn value(&self) -> &str {
        match self {
            ConfigError::NotAnObject { value, .. }
            | ConfigError::TooLarge { value, .. }
            | ConfigError::ApiVersion { value, .. }
            | ConfigError::Kind { value, .. }
            | ConfigError::Decode { value, .. }
            | ConfigError::Invalid { value, .. } => value,
        }
    }

    /// The broken rule, for errors found after decoding.
    #[must_use]
    pub fn rule(&self) -> Option<&Rule> {
        match self {
            ConfigError::Invalid { rule, .. } => Some(rule),
            _ => None,
        }
    }
}

const MISSING: &str = "<missing>";

/// The API server's limit on one opaque device configuration's `parameters`
/// (resource.k8s.io `OpaqueParametersMaxLength`, 10 KiB).
pub const MAX_PARAMETERS_BYTES: usize = 10 * 1024;

/// Strictly decodes one entry's `parameters`; `entry` is its index, for messages.
pub fn decode(entry: usize, parameters: &Value) -> Result<NetworkConfig, ConfigError> {
    let size = serde_json::to_string(parameters).map_or(usize::MAX, |text| text.len());
    if size > MAX_PARAMETERS_BYTES {
        return Err(ConfigError::TooLarge {
            entry,
            value: format!("{size} bytes"),
            max: MAX_PARAMETERS_BYTES,
        });
    }
    let Some(object) = parameters.as_object() else {
        return Err(ConfigError::NotAnObject { entry, value: parameters.to_string() });
    };
    match object.get("apiVersion") {
        Some(Value::String(v)) if v == API_VERSION => {}
        other => {
            return Err(ConfigError::ApiVersion {
                entry,
                value: other.map_or_else(|| MISSING.to_owned(), Value::to_string),
            });
        }
    }
    match object.get("kind") {
        Some(Value::String(v)) if v == KIND => {}
        other => {
            return Err(ConfigError::Kind {
                entry,
                value: other.map_or_else(|| MISSING.to_owned(), Value::to_string),
            });
        }
    }
    serde_path_to_error::deserialize(parameters).map_err(|err| {
        let path = err.path().clone();
        ConfigError::Decode {
            entry,
            path: path.to_string(),
            value: value_at(parameters, &path).map_or_else(|| MISSING.to_owned(), Value::to_string),
            source: err.into_inner(),
        }
    })
}

/// The JSON value at a decoder path, to quote it in the error.
fn value_at<'v>(root: &'v Value, path: &serde_path_to_error::Path) -> Option<&'v Value> {
    use serde_path_to_error::Segment;
    let mut current = root;
    for segment in path {
        current = match segment {
            Segment::Seq { index } => current.get(*index)?,
            Segment::Map { key } => current.get(key.as_str())?,
            Segment::Enum { .. } | Segment::Unknown => return Some(current),
        };
    }
    Some(current)
}

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
            override_with(&mut a.qos, b.qos);
            override_with(&mut a.spoof_check, b.spoof_check);
            override_with(&mut a.trust, b.trust);
            override_with(&mut a.max_tx_rate_mbps, b.max_tx_rate_mbps);
            override_with(&mut a.min_tx_rate_mbps, b.min_tx_rate_mbps);
            override_with(&mut a.link_state, b.link_state);
        });
        override_with(&mut self.stats, stats);
    }

    /// Checks this (merged) config against the allocated device and what the node can
    /// attach (`support`), and applies defaults. A `podNetwork` is checked as a name only;
    /// [`NetworkConfig::validate_in`] inherits from it.
    pub fn validate(
        &self,
        device: &DeviceFacts,
        support: &NodeSupport,
    ) -> Result<ResolvedNetworkConfig, ConfigError> {
        validate::validate(self, device, support, None)
    }

    /// [`NetworkConfig::validate`] after inheriting from `network`, the `PodNetwork` this
    /// config names (the caller looked it up and checked that it serves claims,
    /// [`check_network_serves`]): the network's mode, macvlan/ipvlan settings, VLAN, MTU,
    /// addressing and routes, each overridden field by field by this config (DESIGN §3).
    /// Addressing: a network with `ipam` assigns one address per family from its blocks;
    /// `ipam.addresses` here are static addresses inside its `exclude` instead; `ipam.pool`
    /// is refused. `None`, or a config naming no network, is [`NetworkConfig::validate`].
    pub fn validate_in(
        &self,
        network: Option<&crate::model::pod_network::PodNetwork>,
        device: &DeviceFacts,
        support: &NodeSupport,
    ) -> Result<ResolvedNetworkConfig, ConfigError> {
        match (network, &self.pod_network) {
            (Some(network), Some(_)) => {
                let (merged, addressing) = inherit::inherit(self, network)?;
                validate::validate(&merged, device, support, addressing)
            }
            _ => self.validate(device, support),
        }
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
            merged.merge(decode(index, &entry.parameters)?);
        }
    }
    Ok(merged)
}

/// Decodes, merges and validates the config for one allocation result.
pub fn resolve(
    entries: &[ConfigEntry],
    request: &str,
    device: &DeviceFacts,
    support: &NodeSupport,
) -> Result<ResolvedNetworkConfig, ConfigError> {
    merge_for_request(entries, request)?.validate(device, support)
}
