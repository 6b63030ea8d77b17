//! The `PodNetwork` and `IPBlock` kinds (`netclaim.dev/v1alpha1`, cluster-scoped; DESIGN §4)
//! as data, and the names derived from them: IPBlock object names, labels, the finalizer and
//! the DeviceClass of a network.
//!
//! These are the shapes of `deploy/crds/`: the API server prunes unknown fields and applies
//! the schema's defaults before anything reads them, so the types here accept what the schema
//! accepts and fill the same defaults for objects built in code (tests, `netclaim dev`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::link::{IpvlanConfig, MacvlanConfig, Mode, RouteConfig};

mod block_name;
pub mod validate;

pub use block_name::{MAX_OBJECT_NAME, ip_block_name, is_dns_subdomain, legacy_ip_block_name};

/// API group of our custom kinds.
pub const GROUP: &str = "netclaim.dev";
/// API version of our custom kinds.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of our custom kinds.
pub const API_VERSION: &str = "netclaim.dev/v1alpha1";

/// Finalizer the controller keeps on a `PodNetwork` while any `IPBlock` of it exists.
pub const FINALIZER: &str = "netclaim.dev/ipblocks";
/// Label on an `IPBlock`: the `PodNetwork` it belongs to.
pub const LABEL_POD_NETWORK: &str = "netclaim.dev/pod-network";
/// Label on an `IPBlock`: the node that owns it.
pub const LABEL_NODE: &str = "netclaim.dev/node";
/// Label on the `DeviceClass` the controller manages: the `PodNetwork` it serves.
pub const LABEL_MANAGED_FOR: &str = "netclaim.dev/pod-network";

/// Default `spec.interfaceCapacity` (DESIGN §4).
pub const DEFAULT_INTERFACE_CAPACITY: u32 = 256;
/// Default IPv4 block prefix length.
pub const DEFAULT_BLOCK_SIZE_V4: u8 = 26;
/// Default IPv6 block prefix length.
pub const DEFAULT_BLOCK_SIZE_V6: u8 = 120;
/// Longest object name derived from a CIDR before it is hashed (DESIGN §4).
pub const MAX_DERIVED_NAME: usize = 63;

/// A `PodNetwork` object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNetwork {
    /// Always `netclaim.dev/v1alpha1` on the wire.
    #[serde(default = "api_version")]
    pub api_version: String,
    /// Always `PodNetwork` on the wire.
    #[serde(default = "pod_network_kind")]
    pub kind: String,
    /// Standard metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the administrator asked for.
    pub spec: PodNetworkSpec,
    /// What the controller observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<PodNetworkStatus>,
}

fn api_version() -> String {
    API_VERSION.to_owned()
}

fn pod_network_kind() -> String {
    "PodNetwork".to_owned()
}

fn ip_block_kind() -> String {
    "IPBlock".to_owned()
}

fn default_true() -> bool {
    true
}

fn default_provider() -> String {
    super::names::DEFAULT_DRIVER_NAME.to_owned()
}

fn default_capacity() -> u32 {
    DEFAULT_INTERFACE_CAPACITY
}

/// `PodNetwork.spec`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNetworkSpec {
    /// `false`: devices lose the `podNetwork` tag (no new claims), running pods keep working.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// The driver that serves the network (the driver name; immutable).
    #[serde(default = "default_provider")]
    pub provider: String,
    /// How pods attach (immutable); default macvlan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// macvlan settings inherited by claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macvlan: Option<MacvlanConfig>,
    /// ipvlan settings inherited by claims.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipvlan: Option<IpvlanConfig>,
    /// Host interfaces (names or PCI addresses) that carry the network on each node.
    #[serde(default)]
    pub parents: Vec<String>,
    /// Nodes that carry the network; absent or empty selects every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Namespaces whose claims may use the network; absent or empty selects every namespace.
    /// Checked by the node at prepare against its watch of the Namespaces, failing closed
    /// (a device selector cannot see the claim's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// VLAN id (0: untagged; immutable).
    #[serde(default)]
    pub vlan: u16,
    /// Interface MTU; absent: the parent's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Shared modes: `netclaim.dev/interfaces` capacity published per parent.
    #[serde(default = "default_capacity")]
    pub interface_capacity: u32,
    /// Shared modes: the `netclaim.dev/bandwidth` capacity (bits per second, a quantity)
    /// published per parent whose link reports no speed (`inventory::bandwidth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth: Option<crate::model::bandwidth::QuantityText>,
    /// Cluster-wide addressing; absent: pods get no address from the network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipam: Option<PodNetworkIpam>,
    /// Routes every pod of the network gets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteConfig>,
    /// Source-based policy routing every pod of the network gets (as `NetworkConfig.routing`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<super::network_config::RoutingConfig>,
    /// The VRF every pod's interface is enslaved to (as `NetworkConfig.vrf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vrf: Option<super::network_config::VrfConfig>,
    /// Interface sysctls (as `NetworkConfig.sysctls`; administrator-owned, so keys a claim may
    /// not set are accepted here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sysctls: Option<BTreeMap<String, String>>,
}

/// `PodNetwork.spec.ipam`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNetworkIpam {
    /// Subnets (CIDR strings), at most one family each in use at a time is not required: a
    /// pod gets one address per family, from the family's subnets in order. Append-only.
    #[serde(default)]
    pub subnets: Vec<String>,
    /// Gateways (one per family at most), inside a subnet; never handed out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gateways: Vec<String>,
    /// CIDRs never handed out from blocks (freely editable: they only narrow what new
    /// addresses come from).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// CIDRs a claim's static `ipam.addresses` must lie in, first come first served; never
    /// carved into blocks, each inside one subnet and covering whole blocks (prefix not longer
    /// than the family's `blockSize`). Immutable, so a /32 (/128) reservation and a block
    /// never overlap whatever two nodes believe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub static_ranges: Vec<String>,
    /// Prefix length of the per-node blocks (immutable).
    #[serde(default)]
    pub block_size: BlockSize,
}

/// Per-family block prefix lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockSize {
    /// IPv4 block prefix length.
    #[serde(default = "default_block_v4")]
    pub ipv4: u8,
    /// IPv6 block prefix length.
    #[serde(default = "default_block_v6")]
    pub ipv6: u8,
}

fn default_block_v4() -> u8 {
    DEFAULT_BLOCK_SIZE_V4
}

fn default_block_v6() -> u8 {
    DEFAULT_BLOCK_SIZE_V6
}

impl Default for BlockSize {
    fn default() -> Self {
        BlockSize { ipv4: DEFAULT_BLOCK_SIZE_V4, ipv6: DEFAULT_BLOCK_SIZE_V6 }
    }
}

/// `PodNetwork.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodNetworkStatus {
    /// The generation the conditions describe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` (reasons `Ready`, `Invalid`, `Disabled`, `Overlaps`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The DeviceClass claims name to get an interface on this network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class_name: Option<String>,
    /// What each node holds of the network, by node name (written by the controller's
    /// sweep when it changes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeUsage>,
}

/// One node's share of a network in `PodNetwork.status.nodes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeUsage {
    /// The node (the IPBlocks' `spec.nodeName`, the claims' pool).
    pub node_name: String,
    /// Its IPBlocks of the network that are blocks, not static reservations.
    pub blocks: u32,
    /// Its static reservations (IPBlocks with `spec.claim`).
    pub reservations: u32,
    /// Addresses of the network its claims hold (`networkData.ips` of the claims' device
    /// statuses naming the network in `data.podNetwork.name`).
    pub addresses: u32,
}

/// Condition type set by the controller when live IPBlocks or leases contradict the spec (an
/// edit that bypassed the CRD's rules); nodes hand out no new address of the network while it
/// is `True`.
pub const CONDITION_CONFLICT: &str = "Conflict";
/// Reasons of the `Conflict` condition.
pub mod conflict_reason {
    /// Live objects contradict the spec; the message names them.
    pub const CONFLICT: &str = "Conflict";
    /// Resolved (the condition stays, `False`, once it has been `True`).
    pub const RESOLVED: &str = "Resolved";
}

/// Condition type of a `PodNetwork`.
pub const CONDITION_READY: &str = "Ready";
/// Reasons of the `Ready` condition.
pub mod reason {
    /// Valid, enabled, no overlap.
    pub const READY: &str = "Ready";
    /// A field is invalid; the message names it.
    pub const INVALID: &str = "Invalid";
    /// `spec.enabled: false`.
    pub const DISABLED: &str = "Disabled";
    /// A subnet overlaps another `PodNetwork`'s; the message names it.
    pub const OVERLAPS: &str = "Overlaps";
    /// Being deleted: the finalizer waits for the network's IPBlocks, which the message
    /// names with their nodes (a node releases a block once no address in it is in use).
    pub const DELETING: &str = "Deleting";
}

/// An `IPBlock` object: one CIDR of a `PodNetwork` owned by one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpBlock {
    /// Always `netclaim.dev/v1alpha1` on the wire.
    #[serde(default = "api_version")]
    pub api_version: String,
    /// Always `IPBlock` on the wire.
    #[serde(default = "ip_block_kind")]
    pub kind: String,
    /// Standard metadata; the name is [`ip_block_name`] of the network and CIDR.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The block (immutable).
    pub spec: IpBlockSpec,
}

/// `IPBlock.spec` (immutable once created).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpBlockSpec {
    /// The `PodNetwork`.
    pub pod_network: String,
    /// The block, canonical network form (`10.10.0.64/26`); a /32 or /128 reserves one
    /// static address.
    pub cidr: String,
    /// The node that owns the block.
    pub node_name: String,
    /// A static reservation: the claim that holds the address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<IpBlockClaim>,
}

/// The claim a static-address `IPBlock` is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpBlockClaim {
    /// Namespace of the `ResourceClaim`.
    pub namespace: String,
    /// Name of the `ResourceClaim`.
    pub name: String,
    /// UID of the `ResourceClaim`.
    pub uid: String,
}

impl IpBlock {
    /// A new block object named after its network and CIDR, labelled for list filters.
    #[must_use]
    pub fn new(spec: IpBlockSpec) -> IpBlock {
        let labels = BTreeMap::from([
            (LABEL_POD_NETWORK.to_owned(), spec.pod_network.clone()),
            (LABEL_NODE.to_owned(), spec.node_name.clone()),
        ]);
        IpBlock {
            api_version: api_version(),
            kind: ip_block_kind(),
            metadata: ObjectMeta {
                name: Some(ip_block_name(&spec.pod_network, &spec.cidr)),
                labels: Some(labels),
                ..ObjectMeta::default()
            },
            spec,
        }
    }
}

/// The first 16 hex digits of the SHA-256 of `input`: the suffix that keeps cut names
/// distinct.
fn short_hash(input: &str) -> String {
    Sha256::digest(input.as_bytes())
        .iter()
        .take(8)
        .flat_map(|byte| [byte >> 4, byte & 0xf])
        .filter_map(|nibble| char::from_digit(u32::from(nibble), 16))
        .collect()
}

/// The `DeviceClass` the controller manages for a `PodNetwork`.
#[must_use]
pub fn device_class_name(pod_network: &str) -> String {
    format!("{pod_network}.podnetwork.{GROUP}")
}

/// Name of a shared device that carries `pod_network` on `parent_device` (the parent's own
/// device name; DESIGN §2: `<podnetwork>-<parent>`). Device names are DNS labels: a network
/// name with dots (object names are DNS subdomains) has them mapped to `-`, and a name that
/// had to change or is longer than 63 characters is cut and ends in
/// `-<first 16 hex of sha256(podnetwork/parent)>`, so two networks or parents never share a
/// device name.
#[must_use]
pub fn shared_device_name(pod_network: &str, parent_device: &str) -> String {
    let name = format!("{pod_network}-{parent_device}");
    let is_label = name.len() <= MAX_DERIVED_NAME
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if is_label {
        return name;
    }
    let mapped: String = name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    let hex = short_hash(&format!("{pod_network}/{parent_device}"));
    let prefix: String = mapped.chars().take(MAX_DERIVED_NAME - 17).collect();
    let prefix = prefix.trim_matches('-');
    if prefix.is_empty() { format!("pn-{hex}") } else { format!("{prefix}-{hex}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_device_names_are_dns_labels() {
        assert_eq!(shared_device_name("medianet", "eth1"), "medianet-eth1");
        assert_eq!(shared_device_name("medianet", "pci-0000-3b-00-1"), "medianet-pci-0000-3b-00-1");
        let dotted = shared_device_name("media.net", "eth1");
        assert!(dotted.starts_with("media-net-eth1-") && dotted.len() == 31, "{dotted}");
        let long = shared_device_name(&"n".repeat(60), "pci-0000-3b-00-1");
        assert_eq!(long.len(), MAX_DERIVED_NAME, "{long}");
        assert_ne!(long, shared_device_name(&"n".repeat(60), "pci-0000-3b-00-2"));
        for name in [dotted, long] {
            assert!(
                name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !name.starts_with('-')
                    && !name.ends_with('-'),
                "{name}"
            );
        }
    }

    #[test]
    fn defaults_fill_what_the_schema_defaults() {
        let pn: PodNetwork = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"parents": ["eth1"], "ipam": {"subnets": ["10.0.0.0/16"]}}
        }))
        .expect("minimal spec decodes");
        assert!(pn.spec.enabled);
        assert_eq!(pn.spec.provider, "netclaim.dev");
        assert_eq!(pn.spec.interface_capacity, DEFAULT_INTERFACE_CAPACITY);
        let ipam = pn.spec.ipam.expect("ipam given");
        assert_eq!(ipam.block_size, BlockSize { ipv4: 26, ipv6: 120 });
    }
}
