//! `NetworkConfig` (DESIGN §3): strict decoding of the opaque claim/class parameters, the
//! field-by-field merge of the allocation's config entries, and validation against the
//! allocated device into a fully defaulted [`ResolvedNetworkConfig`].
//!
//! The input is the snapshot the scheduler copied into `status.allocation.devices.config`
//! (class entries first, then claim entries), already filtered to `driver: netclaim.dev`.
//! Every error names the field path (`interface.name`, `routes[1].gateway`) and the
//! offending value, because the message ends up in the claim status and in a Pod Event.

mod bandwidth;
mod config;
mod decode;
mod error;
mod ethtool;
mod inherit;
mod mac;
mod merge;
mod rdma;
mod resolved;
mod routing;
pub mod sysctls;
mod validate;
mod vfio;

#[cfg(test)]
mod tests;

pub use bandwidth::BandwidthRule;
pub use config::{
    InterfaceConfig, IpamConfig, NetworkConfig, PoolConfig, SriovConfig, VfLinkState,
    VfVlanProtocol,
};
use decode::MISSING;
pub use decode::{ConfigEntry, ConfigSource, MAX_PARAMETERS_BYTES, decode};
pub use error::{ConfigError, Rule};
pub use ethtool::{
    EthtoolChannels, EthtoolConfig, EthtoolRefusal, EthtoolRings, EthtoolSettings,
    MAX_FEATURE_NAME, feature_path, resolve_ethtool,
};
pub use inherit::check_network_serves;
pub use mac::{MacAddr, MacAddrParseError};
pub use merge::merge_for_request;
pub use rdma::{RdmaConfig, RdmaFacts, RdmaMode, RdmaNetnsMode, RdmaRefusal, ResolvedRdma};
pub use resolved::{
    Addressing, NetworkAddressing, PoolSpec, ResolvedInterface, ResolvedMode,
    ResolvedNetworkConfig, Route, SriovSettings,
};
pub use routing::{
    AUTO_TABLE_FIRST, PolicyRouting, RoutingConfig, RoutingRefusal, RoutingSettings,
    SOURCE_RULE_PRIORITY, Vrf, VrfConfig,
};
pub use sysctls::{Sysctl, SysctlFamily, SysctlRefusal};
pub use validate::{DeviceFacts, MAX_ADDRESSES, MAX_ROUTES};
// The device vocabulary is the model's one (`model::device`); validation speaks it too.
pub use crate::model::device::{DeviceKind, Sharing};
// The link vocabulary is shared with `PodNetwork` (`model::link`); configs are written in it.
pub use crate::model::link::{
    IpvlanConfig, IpvlanFlag, IpvlanMode, MacvlanConfig, MacvlanMode, Mode, RouteConfig,
    check_interface_name,
};
pub use crate::model::support::NodeSupport;

/// The only `apiVersion` this driver understands.
pub const API_VERSION: &str = "netclaim.dev/v1alpha1";
/// The `kind` of the opaque parameters.
pub const KIND: &str = "NetworkConfig";

impl NetworkConfig {
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

/// Decodes, merges and validates the config for one allocation result.
pub fn resolve(
    entries: &[ConfigEntry],
    request: &str,
    device: &DeviceFacts,
    support: &NodeSupport,
) -> Result<ResolvedNetworkConfig, ConfigError> {
    merge_for_request(entries, request)?.validate(device, support)
}
