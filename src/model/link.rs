//! The link vocabulary a claim's `NetworkConfig` and a `PodNetwork` share: how the pod
//! interface is made (the mode, macvlan and ipvlan settings), routes as written, and which
//! names a pod interface may take. Both kinds speak it; neither owns it, so `pod_network`
//! does not depend on `network_config` (which inherits from `pod_network`).

use std::fmt;

use serde::{Deserialize, Serialize};

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
    /// The PCI function (a VF, or a whole NIC) is bound to `vfio-pci` for a userspace driver
    /// (DPDK, a KubeVirt VM): `/dev/vfio/<group>` goes into the pod's containers through CDI,
    /// nothing moves into the pod's network namespace.
    Vfio,
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
            Mode::Vfio => "vfio",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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

/// `IFNAMSIZ` (16) minus the terminating NUL.
pub(crate) const MAX_IFNAME_LEN: usize = 15;

/// The kernel's `dev_valid_name` rules, plus names a pod already has (`eth0` from its
/// primary network, `lo`) and `%` (the kernel would treat `net%d` as a template).
pub fn check_interface_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > MAX_IFNAME_LEN {
        return Err("longer than 15 bytes (IFNAMSIZ)");
    }
    if name == "." || name == ".." {
        return Err("'.' and '..' are not allowed");
    }
    if name.chars().any(|c| c == '/' || c == ':' || c == '%' || c.is_whitespace()) {
        return Err("contains '/', ':', '%' or whitespace");
    }
    if name == "eth0" || name == "lo" {
        return Err("eth0 and lo are taken in every pod");
    }
    Ok(())
}
