//! Why a claim could not be prepared or unprepared, and why the service could not load.

use super::metadata::MetadataError;
use super::networks::{BlockApiError, NetworkReadError};
use super::ports::{LookupError, ReadError};
use super::vf::VfError;
use super::{networks, parent_capacity};
use crate::ipam::IpamError;
use crate::model::network_config::ConfigError;

/// Why one claim could not be prepared or unprepared; shown to the user prefixed with the
/// claim's namespace/name.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The API read failed.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The claim in the API is not the one kubelet means.
    #[error("uid mismatch: kubelet asked for uid {requested}, the API has uid {found:?}")]
    UidMismatch {
        /// UID from kubelet.
        requested: String,
        /// UID in the API.
        found: String,
    },
    /// `status.reservedFor` lists more than one consumer.
    #[error(
        "status.reservedFor: reserved for {} consumers ({}); a network claim can serve only one pod",
        consumers.len(), consumers.join(", ")
    )]
    SharedByPods {
        /// The consumers.
        consumers: Vec<String>,
    },
    /// No `status.allocation.devices`.
    #[error("status.allocation: the claim is not allocated")]
    NotAllocated,
    /// No result for this driver and pool.
    #[error("status.allocation.devices.results: no device of driver {driver} in pool {pool}")]
    NoResults {
        /// Our driver.
        driver: String,
        /// This node's pool.
        pool: String,
    },
    /// A config entry of this driver has an unknown `source`.
    #[error(
        "status.allocation.devices.config[{index}].source: {value:?}: expected FromClass or FromClaim"
    )]
    ConfigSource {
        /// Index in the snapshot.
        index: usize,
        /// The value.
        value: String,
    },
    /// The allocated device is not on this node.
    #[error("request {request}: {source}")]
    Device {
        /// Request name.
        request: String,
        /// The lookup error.
        #[source]
        source: LookupError,
    },
    /// The config is invalid for the device (names the field path).
    #[error("request {request}, device {device}: {source}")]
    Config {
        /// Request name.
        request: String,
        /// Device name.
        device: String,
        /// The config error (boxed: it carries the offending value and path).
        #[source]
        source: Box<ConfigError>,
    },
    /// Address reservation failed.
    #[error("request {request}: {field}: {source}")]
    Ipam {
        /// Request name.
        request: String,
        /// The config field whose addresses were reserved (`ipam.pool`, `ipam.addresses[1]`).
        field: String,
        /// The IPAM error.
        #[source]
        source: IpamError,
    },
    /// The claim's pool has the subnet of a pool another prepared claim uses on this node,
    /// with different settings: one could hand out the other's gateway or excluded range.
    #[error(
        "request {request}: {field}: pool {subnet} is in use on this node by claim {other} with another {field}"
    )]
    PoolMismatch {
        /// Request name.
        request: String,
        /// The differing field (`ipam.pool.gateway`, `ipam.pool.exclude`, ...).
        field: &'static str,
        /// The subnet.
        subnet: ipnetwork::IpNetwork,
        /// The other claim (`namespace/name`).
        other: String,
    },
    /// The claim's pool overlaps (without being equal to) a pool another prepared claim
    /// uses on this node, and one pool's gateway is an address the other may hand out.
    #[error(
        "request {request}: ipam.pool.subnet: pool {subnet} overlaps pool {other_subnet} of claim {other}, which could hand out gateway {gateway}"
    )]
    PoolOverlap {
        /// Request name.
        request: String,
        /// This claim's subnet.
        subnet: ipnetwork::IpNetwork,
        /// The other claim's subnet.
        other_subnet: ipnetwork::IpNetwork,
        /// The gateway one pool could hand out.
        gateway: std::net::IpAddr,
        /// The other claim (`namespace/name`).
        other: String,
    },
    /// The parent interface carries as many sub-interfaces as it may.
    #[error("request {request}, device {device}: {source}")]
    ParentCapacity {
        /// Request name.
        request: String,
        /// Device name.
        device: String,
        /// The parent and its limit.
        #[source]
        source: parent_capacity::ParentFull,
    },
    /// The claim may not use a network's device or the network (DESIGN §4).
    #[error(transparent)]
    Tenancy(#[from] super::tenancy::TenancyError),
    /// The claim's prepare gave no answer (cannot happen: every claim of a call is answered).
    #[error("the prepare gave no answer for this claim")]
    Unanswered,
    /// The state store failed.
    #[error("persisting the prepared claim: {0}")]
    Persist(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The device metadata files could not be written or removed.
    #[error(transparent)]
    Metadata(#[from] MetadataError),
    /// The claim is reserved for a PodGroup (KEP-5729), whose pods would all share it.
    #[error(
        "status.reservedFor: reserved for PodGroup {group} (uid {uid}); a network claim can serve only one pod (reason PodGroupUnsupported)"
    )]
    PodGroupUnsupported {
        /// The group's name.
        group: String,
        /// The group's UID.
        uid: String,
    },
    /// The `PodNetwork` a config names could not be read.
    #[error("podNetwork {pod_network}: {source}")]
    NetworkRead {
        /// The network.
        pod_network: String,
        /// Why.
        #[source]
        source: NetworkReadError,
    },
    /// An `IPBlock` call failed.
    #[error("podNetwork {pod_network}: {source}")]
    BlockApi {
        /// The network.
        pod_network: String,
        /// The API error.
        #[source]
        source: BlockApiError,
    },
    /// A static address is reserved cluster-wide by another claim.
    #[error("request {request}: {field}: {held}")]
    AddressReserved {
        /// Request name.
        request: String,
        /// `ipam.addresses[i]`.
        field: String,
        /// The reservation in the way.
        held: Box<networks::HeldReservation>,
    },
    /// The node's blocks of a `PodNetwork` cannot serve now (decision 0017).
    #[error(transparent)]
    Blocks(#[from] networks::BlocksUnavailable),
    /// A `PodNetwork` claim on a service without the network ports.
    #[error("podNetwork {pod_network}: this node does not serve PodNetworks")]
    NoNetworkPorts {
        /// The network.
        pod_network: String,
    },
    /// A blocking task died.
    #[error("internal error: {0}")]
    Task(#[source] tokio::task::JoinError),
    /// A `sriov-vf` device whose PF and VF index are not known (its `pfName` or `vfIndex`
    /// attribute is missing: the PF has no netdev, or sysfs has no `virtfn` link for it).
    #[error("request {request}, device {device}: mode sriov-vf: the VF's PF or index is unknown")]
    NotAVf {
        /// Request name.
        request: String,
        /// The device.
        device: String,
    },
    /// Mode `vfio`: the function cannot be bound or given back (names the fact and what
    /// the node needs).
    #[error("request {request}, device {device}: mode \"vfio\": {source}")]
    Vfio {
        /// Request name.
        request: String,
        /// The device.
        device: String,
        /// Why.
        #[source]
        source: Box<super::vfio::VfioError>,
    },
    /// `ethtool` settings could not be applied or restored (names the field).
    #[error("request {request}, device {device}: {source}")]
    Ethtool {
        /// Request name.
        request: String,
        /// The device.
        device: String,
        /// The cause.
        #[source]
        source: Box<super::ethtool::EthtoolError>,
    },
    /// This daemon was started without access to ethtool settings.
    #[error("request {request}, device {device}: ethtool: not available in this daemon")]
    NoEthtoolPort {
        /// Request name.
        request: String,
        /// The device.
        device: String,
    },
    /// This daemon was started without access to VF settings.
    #[error(
        "request {request}, device {device}: mode sriov-vf: VF settings are not available in this daemon"
    )]
    NoVfPort {
        /// Request name.
        request: String,
        /// The device.
        device: String,
    },
    /// VF settings could not be applied or restored (names the field).
    #[error("request {request}, device {device}: {source}")]
    Vf {
        /// Request name.
        request: String,
        /// The device.
        device: String,
        /// The cause.
        #[source]
        source: Box<VfError>,
    },
}

/// Why the service could not load its state.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Loading or cleaning up the leases failed.
    #[error(transparent)]
    Ipam(#[from] IpamError),
    /// Loading the prepared claims failed.
    #[error("loading prepared claims: {0}")]
    Claims(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The device metadata files could not be put right.
    #[error("restoring device metadata: {0}")]
    Metadata(#[source] MetadataError),
}
