//! The claim service: prepare and unprepare of the node's claims (see the module docs of
//! [`crate::claims`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures::StreamExt;
use ipnetwork::IpNetwork;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use super::{allocation, metadata, networks, parent_capacity, vf, vf_snapshots};
use super::preparer::{
    ClaimFailure, ClaimPreparer, PrepareResults, PreparedDevice, UnprepareResults,
};
use crate::ipam::{
    self, Clock, Ipam, IpamCommit, IpamError, Lease, LeaseOwner, LeaseStore, SystemClock,
};
use crate::model::ClaimRef;
use crate::model::cause::Cause;
use crate::model::device::AttributeValue;
use crate::model::network_config::{
    self, Addressing, ConfigError, DeviceFacts, DeviceKind, MacvlanMode, NetworkAddressing,
    NetworkConfig, NodeSupport, PoolSpec, ResolvedMode, ResolvedNetworkConfig, Sharing,
};
use crate::model::pod_network::PodNetwork;
use crate::model::support::KernelSupport;
use crate::podnet::plan::node_support;

use super::allocation::{AllocatedResult, ClaimAllocation};
use super::metadata::{DeviceMetadata, MetadataError};
use super::networks::{BlockApiError, NetworkPorts, NetworkReadError, StaticReservation};
use super::vf::{VfError, VfPort, VfRef, VfState};

/// Claims of one request prepared at the same time; kubelet sends one pod's claims, and a
/// bound keeps a pathological request from opening unbounded API calls.
pub const MAX_CONCURRENT_CLAIMS: usize = 16;

/// Why the API could not give a claim.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReadError {
    /// The claim does not exist (deleted after kubelet looked).
    #[error("ResourceClaim not found")]
    NotFound,
    /// The request failed (network, authorisation, server error).
    #[error("reading the ResourceClaim: {0}")]
    Failed(#[source] Cause),
}

/// Reads `ResourceClaim`s by namespace and name (a direct GET; DESIGN §10: no claim watch
/// on nodes).
pub trait ClaimReader: Send + Sync + 'static {
    /// The claim as the API server has it now.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, ReadError>> + Send;

    /// The pod's claims in `spec.resourceClaims` order, as claim names
    /// ([`allocation::pod_claim_names`]); `None` when the pod does not exist.
    fn pod_claim_names(
        &self,
        namespace: &str,
        pod: &str,
    ) -> impl Future<Output = Result<Option<Vec<String>>, ReadError>> + Send;
}

/// Why an allocated device could not be looked up.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    /// This node publishes no device of that name (any more).
    #[error("device {0:?} is not in this node's inventory")]
    NotFound(String),
    /// Discovering the node's interfaces failed.
    #[error("discovering the node's interfaces: {0}")]
    Failed(#[source] Cause),
}

/// Finds an allocated device in this node's current inventory.
pub trait DeviceLookup: Send + Sync + 'static {
    /// Facts of device `name` (a slot maps to its parent); child counts left at 0.
    fn facts(&self, name: &str) -> impl Future<Output = Result<DeviceFacts, LookupError>> + Send;
    /// The attributes device `name` is published with (for the device metadata file).
    fn attributes(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, AttributeValue>, LookupError>> + Send;
    /// How many sub-interfaces host interface `if_name` may carry in all, across every
    /// device published on it ([`parent_capacity`]); `None`: no limit known.
    fn parent_limit(
        &self,
        if_name: &str,
    ) -> impl Future<Output = Result<Option<u32>, LookupError>> + Send {
        let _ = if_name;
        async { Ok(None) }
    }
    /// The PF and index of VF device `name`, from its published `pfName` and `vfIndex`
    /// (discovered from sysfs); `None` when it has either missing.
    fn virtual_function(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<VfRef>, LookupError>> + Send {
        use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
        let attributes = self.attributes(name);
        async move {
            let attributes = attributes.await?;
            let get = |key: &str| {
                attributes.get(&format!("{ATTRIBUTE_DOMAIN}/{key}")).or_else(|| attributes.get(key))
            };
            Ok(match (get(attr::PF_NAME), get(attr::VF_INDEX)) {
                (Some(AttributeValue::String(pf)), Some(AttributeValue::Int(index))) => {
                    u32::try_from(*index).ok().map(|index| VfRef { pf: pf.clone(), index })
                }
                _ => None,
            })
        }
    }
}

/// Durable state of prepared claims; the same store keeps the IPAM's leases, release
/// records and owned blocks. Calls block on disk I/O (the service runs them on the blocking
/// pool, without its state lock).
pub trait ClaimStore:
    LeaseStore + vf_snapshots::VfSnapshotStore + Clone + Send + Sync + 'static
{
    /// Every prepared claim.
    fn load_claims(&self) -> Result<Vec<PreparedClaim>, Self::Error>;
    /// Persists prepared claims and IPAM changes (their leases, the blocks they come from,
    /// pruned release records) in one durable commit: after a crash all or none are there.
    fn save_prepared(
        &self,
        claims: &[&PreparedClaim],
        ipam: &IpamCommit,
    ) -> Result<(), Self::Error>;
    /// Forgets a prepared claim with IPAM changes (its leases removed, their release records
    /// written) in one durable commit; a missing claim succeeds.
    fn remove_prepared(&self, uid: &str, ipam: &IpamCommit) -> Result<(), Self::Error>;
    /// Commits IPAM changes alone (blocks adopted or released, records pruned).
    fn commit_ipam(&self, ipam: &IpamCommit) -> Result<(), Self::Error>;
}

/// A claim as prepared: what kubelet got back and what the attach step needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// The claim's UID (the record key).
    pub uid: String,
    /// Namespace of the claim.
    pub namespace: String,
    /// Name of the claim.
    pub name: String,
    /// One entry per allocation result of this driver on this node.
    pub devices: Vec<PreparedClaimDevice>,
    /// The pods the claim is reserved for (`status.reservedFor`, resource `pods`), as read at
    /// the first prepare; the attach step finds a pod's claims by these UIDs.
    ///
    /// A network claim serves one pod (a claim reserved for several is refused at prepare,
    /// DESIGN §3), so this holds the one pod kubelet prepared the claim for: kubelet prepares
    /// a claim only once the scheduler reserved it for a pod it is starting. A repeated
    /// prepare answers from the record without an API call (the fast path) and does not
    /// refresh the list: a pod that is added to `reservedFor` later does not get the
    /// interface. That cannot happen for a claim used by one pod; kubelet unprepares the
    /// claim once no pod on the node uses it, and a new pod's prepare reads it afresh.
    /// Older records have no list (empty): their claims attach to no pod until prepared
    /// again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved_for: Vec<PodConsumer>,
    /// `metadata.generation` at prepare, for the status conditions' `observedGeneration`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// This claim's position in its pod's `spec.resourceClaims`, read with one Pod GET at
    /// prepare so default interface names follow the pod's order (DESIGN §3) without an API
    /// call on the sandbox path. `None` when the pod could not be found, and in records of
    /// the first release (format version 1): those fall back to claim-name order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_index: Option<u32>,
    /// The pod's `spec.resourceClaims[].name` of a claim made from a template (annotation
    /// `resource.kubernetes.io/pod-claim-name`): the container path of its device metadata
    /// uses it. Absent for claims named by the pod and in records before version 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_claim_name: Option<String>,
}

/// A pod a claim is reserved for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodConsumer {
    /// Pod name.
    pub name: String,
    /// Pod UID.
    pub uid: String,
}

/// One prepared device: the attachment's plan input (resolved config, host interface,
/// addresses); the attach step derives its netlink steps from it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaimDevice {
    /// Request name of the allocation result.
    pub request: String,
    /// Pool of the device.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// `shareID` of a shared device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// Host interface (the parent for shared and slot devices).
    pub if_name: String,
    /// The validated config with defaults.
    pub config: ResolvedNetworkConfig,
    /// Interface addresses (static ones, or the pool lease), CIDR form with host bits.
    pub addresses: Vec<IpNetwork>,
    /// How the device was offered (exclusive, shared, slot); older records lack it and the
    /// attach derives it from the mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    /// The device type at prepare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<DeviceKind>,
    /// The host interface's MTU at prepare (the parent's for shared devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_mtu: Option<u32>,
    /// The device's published attributes at prepare (for its device metadata file); empty
    /// in records before version 3.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attributes: BTreeMap<String, AttributeValue>,
    /// CDI device ids returned to kubelet with this device: the device metadata of its
    /// request, on the first device of each top-level request. Kept so a repeated prepare
    /// answers the same; empty when metadata is off and in records before version 3.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_device_ids: Vec<String>,
    /// Mode `sriov-vf`: the VF on its PF and its settings as found before prepare changed
    /// them, set back at unprepare (records before version 5 have none: no release before
    /// it prepared `sriov-vf`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vf: Option<PreparedVf>,
}

/// The VF of a `sriov-vf` device and its settings before the claim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PreparedVf {
    /// The VF on its PF.
    #[serde(flatten)]
    pub vf: VfRef,
    /// Its settings as read before the first change.
    pub before: VfState,
}

impl PreparedClaim {
    /// The answer kubelet gets (the same on every repeat). `request_names` carry the
    /// top-level request: kubelet injects a device's CDI ids into the containers whose
    /// `resources.claims[].request` is in that list, and containers can only name top-level
    /// requests (a `firstAvailable` result `net/fast` is requested as `net`).
    #[must_use]
    pub fn kubelet_devices(&self) -> Vec<PreparedDevice> {
        self.devices
            .iter()
            .map(|d| PreparedDevice {
                request_names: vec![metadata::top_level(&d.request).to_owned()],
                pool_name: d.pool.clone(),
                device_name: d.device.clone(),
                cdi_device_ids: d.cdi_device_ids.clone(),
                share_id: d.share_id.clone(),
            })
            .collect()
    }
}

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

/// Identity of this node's pool.
#[derive(Debug, Clone)]
pub struct ServiceIdentity {
    /// Our driver name.
    pub driver: String,
    /// The node name (our pool name).
    pub node: String,
}

pub(super) struct State<S: LeaseStore> {
    pub(super) ipam: Ipam<S>,
    /// Changed only through [`State::add_prepared`] and [`State::remove_prepared`] (they
    /// keep `in_use` right).
    pub(super) prepared: HashMap<String, PreparedClaim>,
    /// Claims whose commit is under way (their leases are held in memory): seen by the
    /// checks of other prepares, never reported as prepared. Changed only through
    /// [`State::add_pending`] and [`State::remove_pending`].
    pub(super) pending: HashMap<String, PreparedClaim>,
    /// Where the claims in use sit, so a new claim's checks read the claims on its parent
    /// and the pool users, not every claim of the node (a scan of all of them per prepare
    /// cost ~850 µs at 15k claims).
    pub(super) in_use: InUseIndex,
}

/// Claim UIDs of the claims in use (prepared or pending) by host interface and by pool use,
/// each with how many of the two maps hold it.
#[derive(Debug, Default)]
pub(super) struct InUseIndex {
    pub(super) by_parent: HashMap<String, HashMap<String, u32>>,
    pub(super) pool_users: HashMap<String, u32>,
}

impl InUseIndex {
    fn add(&mut self, claim: &PreparedClaim) {
        let parents: BTreeSet<&str> = claim.devices.iter().map(|d| d.if_name.as_str()).collect();
        for parent in parents {
            *self
                .by_parent
                .entry(parent.to_owned())
                .or_default()
                .entry(claim.uid.clone())
                .or_default() += 1;
        }
        if claim.devices.iter().any(|d| matches!(d.config.addressing, Addressing::Pool(_))) {
            *self.pool_users.entry(claim.uid.clone()).or_default() += 1;
        }
    }

    fn remove(&mut self, claim: &PreparedClaim) {
        fn release(uids: &mut HashMap<String, u32>, uid: &str) {
            if let Some(count) = uids.get_mut(uid) {
                *count -= 1;
                if *count == 0 {
                    uids.remove(uid);
                }
            }
        }
        let parents: BTreeSet<&str> = claim.devices.iter().map(|d| d.if_name.as_str()).collect();
        for parent in parents {
            if let Some(uids) = self.by_parent.get_mut(parent) {
                release(uids, &claim.uid);
                if uids.is_empty() {
                    self.by_parent.remove(parent);
                }
            }
        }
        release(&mut self.pool_users, &claim.uid);
    }
}

impl<S: LeaseStore> State<S> {
    pub(super) fn new(ipam: Ipam<S>, prepared: HashMap<String, PreparedClaim>) -> Self {
        let mut in_use = InUseIndex::default();
        for claim in prepared.values() {
            in_use.add(claim);
        }
        Self { ipam, prepared, pending: HashMap::new(), in_use }
    }

    /// Prepared claims and claims being committed: what a new claim must fit beside.
    pub(super) fn claims_in_use(&self) -> impl Iterator<Item = &PreparedClaim> + Clone {
        self.prepared.values().chain(self.pending.values())
    }

    /// The claims in use with `uids` (prepared first, then pending).
    pub(super) fn claims_of<'a>(
        &'a self,
        uids: Option<&'a HashMap<String, u32>>,
    ) -> impl Iterator<Item = &'a PreparedClaim> + Clone {
        uids.into_iter()
            .flat_map(HashMap::keys)
            .flat_map(|uid| self.prepared.get(uid).into_iter().chain(self.pending.get(uid)))
    }

    /// The devices of claims in use on host interface `parent` (what [`Self::claims_in_use`]
    /// would give, filtered by parent, from the index).
    pub(super) fn devices_on<'a>(
        &'a self,
        parent: &'a str,
    ) -> impl Iterator<Item = &'a PreparedClaimDevice> + Clone {
        self.claims_of(self.in_use.by_parent.get(parent))
            .flat_map(|c| &c.devices)
            .filter(move |d| d.if_name == parent)
    }

    /// The claims in use with a pool-addressed device.
    pub(super) fn pool_users(&self) -> impl Iterator<Item = &PreparedClaim> + Clone {
        self.claims_of(Some(&self.in_use.pool_users))
    }

    pub(super) fn add_pending(&mut self, claim: PreparedClaim) {
        self.in_use.add(&claim);
        if let Some(old) = self.pending.insert(claim.uid.clone(), claim) {
            self.in_use.remove(&old);
        }
    }

    pub(super) fn remove_pending(&mut self, uid: &str) {
        if let Some(old) = self.pending.remove(uid) {
            self.in_use.remove(&old);
        }
    }

    pub(super) fn add_prepared(&mut self, claim: PreparedClaim) {
        self.in_use.add(&claim);
        if let Some(old) = self.prepared.insert(claim.uid.clone(), claim) {
            self.in_use.remove(&old);
        }
    }

    pub(super) fn remove_prepared(&mut self, uid: &str) {
        if let Some(old) = self.prepared.remove(uid) {
            self.in_use.remove(&old);
        }
    }
}

/// The claim preparer of the node daemon.
pub struct ClaimService<R, D, S: LeaseStore> {
    pub(super) identity: ServiceIdentity,
    pub(super) reader: R,
    pub(super) devices: D,
    pub(super) state: Arc<Mutex<State<S>>>,
    /// Device metadata files (KEP-5304); `None` when turned off.
    pub(super) metadata: Option<Arc<DeviceMetadata>>,
    /// The modes and features this node can attach; prepare refuses the others (DESIGN §2).
    pub(super) support: Arc<NodeSupport>,
    /// One async lock per claim UID in flight, so the same claim is never worked on twice
    /// at once (kubelet may repeat a call that timed out while the first still runs).
    pub(super) in_flight: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// `PodNetwork`s and their `IPBlock`s; `None`: claims naming a network are refused.
    pub(super) networks: Option<NetworkPorts>,
    /// One async lock per (network, IPv4?) serialising this node's block claims, so
    /// concurrent prepares that find the blocks full claim one block, not one each.
    pub(super) block_gates: networks::BlockGates,
    /// VF settings on the PF (mode `sriov-vf`); `None`: such claims fail at prepare.
    pub(super) vf_port: Option<Arc<dyn VfPort>>,
}

impl<R, D, S: LeaseStore> std::fmt::Debug for ClaimService<R, D, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimService").field("identity", &self.identity).finish_non_exhaustive()
    }
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // State changes are applied only after the store accepted them, so a panic elsewhere
    // while holding the lock leaves consistent data behind.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<R: ClaimReader, D: DeviceLookup, S: ClaimStore> ClaimService<R, D, S> {
    /// Loads the leases and prepared claims from `store` (blocking) and releases leases no
    /// prepared claim holds (a crash between the lease write and the claim write).
    pub fn load(
        identity: ServiceIdentity,
        reader: R,
        devices: D,
        store: S,
    ) -> Result<Self, LoadError> {
        Self::load_with_clock(identity, reader, devices, store, Arc::new(SystemClock))
    }

    /// [`ClaimService::load`] with the IPAM on `clock` (tests move time by hand).
    pub fn load_with_clock(
        identity: ServiceIdentity,
        reader: R,
        devices: D,
        store: S,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, LoadError> {
        let claims = store.load_claims().map_err(|e| LoadError::Claims(Box::new(e)))?;
        let mut ipam = Ipam::load_with_clock(store, clock)?;
        let prepared: HashMap<String, PreparedClaim> =
            claims.into_iter().map(|c| (c.uid.clone(), c)).collect();
        let orphans: BTreeSet<String> = ipam
            .leases()
            .map(|l| l.owner.claim_uid.clone())
            .filter(|uid| !prepared.contains_key(uid))
            .collect();
        for uid in orphans {
            let released = ipam.release_claim(&uid)?;
            tracing::info!(claim_uid = %uid, leases = released.len(),
                "released leases of a claim whose preparation did not complete");
        }
        // Static addresses are leases (DESIGN §4); claims prepared by a release that did not
        // lease them get their leases now, so no pool hands those addresses out.
        for claim in prepared.values() {
            for device in &claim.devices {
                let Addressing::Static(addresses) = &device.config.addressing else { continue };
                let owner = LeaseOwner {
                    claim_uid: claim.uid.clone(),
                    request: device.request.clone(),
                    device: device.device.clone(),
                    share_id: device.share_id.clone(),
                };
                for address in addresses {
                    match ipam.reserve_static(&owner, *address) {
                        Ok(_) => {}
                        Err(IpamError::AddressTaken { holder, .. }) => tracing::warn!(
                            claim = %claim.name, namespace = %claim.namespace, %address,
                            other_claim_uid = %holder.claim_uid,
                            "two prepared claims hold one static address (prepared before static addresses were leases)"
                        ),
                        Err(err) => return Err(LoadError::Ipam(err)),
                    }
                }
            }
        }
        Ok(Self {
            identity,
            reader,
            devices,
            state: Arc::new(Mutex::new(State::new(ipam, prepared))),
            metadata: None,
            // Until the daemon hands over its probe, only what this build cannot attach is
            // refused.
            support: Arc::new(node_support(&KernelSupport::unprobed())),
            in_flight: Mutex::new(HashMap::new()),
            networks: None,
            block_gates: Mutex::new(HashMap::new()),
            vf_port: None,
        })
    }

    /// Turns device metadata on: claims prepared from now on get metadata files and CDI
    /// ids, and the files of the claims already prepared are put right (blocking I/O).
    pub fn with_metadata(mut self, metadata: Arc<DeviceMetadata>) -> Result<Self, LoadError> {
        let claims: Vec<PreparedClaim> = lock(&self.state).prepared.values().cloned().collect();
        metadata.restore(&claims).map_err(LoadError::Metadata)?;
        self.metadata = Some(metadata);
        Ok(self)
    }

    /// Refuses at prepare what this node cannot attach: `kernel` is what the start-up probe
    /// found (`host::kernel_probe`), combined with what this build implements.
    #[must_use]
    pub fn with_kernel_support(mut self, kernel: &KernelSupport) -> Self {
        self.support = Arc::new(node_support(kernel));
        self
    }

    /// Applies the VF settings of `sriov-vf` claims through `port` (`host::sriov`).
    #[must_use]
    pub fn with_vf_port(mut self, port: Arc<dyn VfPort>) -> Self {
        self.vf_port = Some(port);
        self
    }

    /// The prepared claim of `uid`, if any.
    #[must_use]
    pub fn prepared(&self, uid: &str) -> Option<PreparedClaim> {
        lock(&self.state).prepared.get(uid).cloned()
    }

    /// The prepared claims reserved for the pod with `pod_uid`, ordered by claim name (the
    /// attach order when the pod's `resourceClaims` order is unknown, DESIGN §3).
    #[must_use]
    pub fn prepared_for_pod(&self, pod_uid: &str) -> Vec<PreparedClaim> {
        let mut claims: Vec<PreparedClaim> = lock(&self.state)
            .prepared
            .values()
            .filter(|c| c.reserved_for.iter().any(|p| p.uid == pod_uid))
            .cloned()
            .collect();
        claims
            .sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
        claims
    }

    /// Every prepared claim.
    #[must_use]
    pub fn all_prepared(&self) -> Vec<PreparedClaim> {
        lock(&self.state).prepared.values().cloned().collect()
    }

    /// Addresses leased per pool subnet, for `netclaim_ipam_addresses`.
    #[must_use]
    pub fn leased_per_pool(&self) -> std::collections::BTreeMap<IpNetwork, usize> {
        lock(&self.state).ipam.leased_per_pool()
    }

    /// UIDs of every prepared claim.
    #[must_use]
    pub fn prepared_uids(&self) -> Vec<String> {
        let mut uids: Vec<String> = lock(&self.state).prepared.keys().cloned().collect();
        uids.sort_unstable();
        uids
    }

    /// Whether the claim `namespace/name` with `uid` still exists in the API (`false` when
    /// it was deleted or replaced by another claim of the same name).
    pub async fn exists_in_api(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> Result<bool, ReadError> {
        match self.reader.get(namespace, name).await {
            Ok(claim) => Ok(claim.metadata.uid.as_deref() == Some(uid)),
            Err(ReadError::NotFound) => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Takes the per-UID lock of `uid` (give it back with [`Self::unlock_uid`]).
    pub(super) async fn lock_uid(&self, uid: &str) -> tokio::sync::OwnedMutexGuard<()> {
        let gate = Arc::clone(lock(&self.in_flight).entry(uid.to_owned()).or_default());
        gate.lock_owned().await
    }

    /// Gives back a lock of [`Self::lock_uid`], forgetting the UID's gate when no one else
    /// holds or waits on it.
    pub(super) fn unlock_uid(&self, uid: &str, held: tokio::sync::OwnedMutexGuard<()>) {
        drop(held);
        let mut in_flight = lock(&self.in_flight);
        // Clones are only made under this mutex: one reference means only the map's.
        if in_flight.get(uid).is_some_and(|g| Arc::strong_count(g) == 1) {
            in_flight.remove(uid);
        }
    }

    /// Runs `work` holding the per-UID lock of `uid`.
    pub(super) async fn serialised<T>(&self, uid: &str, work: impl Future<Output = T>) -> T {
        let gate = Arc::clone(lock(&self.in_flight).entry(uid.to_owned()).or_default());
        let result = {
            let _held = gate.lock().await;
            work.await
        };
        let mut in_flight = lock(&self.in_flight);
        // Clones are only made under this mutex: two references means ours and the map's.
        if in_flight.get(uid).is_some_and(|g| Arc::strong_count(g) == 2) {
            in_flight.remove(uid);
        }
        result
    }

    /// Prepares one claim (holding its UID lock): a call of one claim.
    pub async fn prepare_claim(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, ClaimError> {
        let mut answers = self.prepare_claims(std::slice::from_ref(claim)).await;
        answers.pop().map_or_else(|| Err(ClaimError::Unanswered), |(_, answer)| answer)
    }

    /// Prepares the claims of one call: each claim is checked and its addresses held on its
    /// own (holding its UID lock), then the claims that passed are committed together, in
    /// one blocking task and one durable store commit. A claim that fails its checks fails
    /// alone and keeps nothing. A UID repeated in the call is answered once.
    pub async fn prepare_claims(
        &self,
        claims: &[ClaimRef],
    ) -> Vec<(ClaimRef, Result<Vec<PreparedDevice>, ClaimError>)> {
        let mut seen = std::collections::HashSet::new();
        let unique: Vec<ClaimRef> =
            claims.iter().filter(|c| seen.insert(c.uid.as_str())).cloned().collect();
        // Every claim's UID lock stays held until its commit is done, so a concurrent call
        // for the same claim waits and then answers from memory. The locks are taken in UID
        // order before any claim is staged: two calls sharing claims cannot each hold one
        // the other waits for.
        let mut unique = unique;
        unique.sort_unstable_by(|a, b| a.uid.cmp(&b.uid));
        let mut held = Vec::with_capacity(unique.len());
        for claim in &unique {
            held.push((claim.uid.clone(), self.lock_uid(&claim.uid).await));
        }
        let staged: Vec<(ClaimRef, Result<Staged, ClaimError>)> = futures::stream::iter(unique)
            .map(|claim| async move {
                let staged = self.stage_claim(&claim).await;
                (claim, staged)
            })
            .buffer_unordered(MAX_CONCURRENT_CLAIMS)
            .collect()
            .await;
        let mut answers = Vec::with_capacity(staged.len());
        let mut ready = Vec::new();
        for (claim, outcome) in staged {
            match outcome {
                Ok(Staged::Done(answer)) => answers.push((claim, Ok(answer))),
                Err(err) => answers.push((claim, Err(err))),
                Ok(Staged::Ready(claim_ready)) => ready.push(*claim_ready),
            }
        }
        if !ready.is_empty() {
            // Kept to undo, outside the store, what a claim whose commit failed did.
            let undo: Vec<(ClaimRef, PreparedClaim, Vec<ipam::OwnedBlock>)> = ready
                .iter()
                .map(|r| (r.claim.clone(), r.reserved.prepared.clone(), r.reservations.clone()))
                .collect();
            let state = Arc::clone(&self.state);
            let metadata = self.metadata.clone();
            let committed = tokio::task::spawn_blocking(move || {
                commit_prepares(&state, metadata.as_deref(), ready)
            })
            .await;
            let outcomes: Vec<Result<Vec<PreparedDevice>, ClaimError>> = match committed {
                Ok(outcomes) => outcomes,
                Err(join) => {
                    let cause = SharedCause(Arc::new(join));
                    undo.iter().map(|_| Err(ClaimError::Persist(Box::new(cause.clone())))).collect()
                }
            };
            for ((claim, prepared, reservations), outcome) in undo.into_iter().zip(outcomes) {
                if outcome.is_err() {
                    // Nothing was recorded: the VF goes back to what it was.
                    self.restore_vf_settings(&prepared).await.ok();
                    self.drop_reservations(&reservations).await;
                }
                answers.push((claim, outcome));
            }
        }
        for (uid, guard) in held {
            self.unlock_uid(&uid, guard);
        }
        answers
    }

    /// Checks one claim and holds what it needs (addresses in memory, VF settings, static
    /// reservations in the API); on an error nothing stays held.
    pub(super) async fn stage_claim(&self, claim: &ClaimRef) -> Result<Staged, ClaimError> {
        if let Some(done) = lock(&self.state).prepared.get(&claim.uid) {
            return Ok(Staged::Done(done.kubelet_devices()));
        }
        let object = self.reader.get(&claim.namespace, &claim.name).await?;
        let allocation =
            allocation::extract(claim, &object, &self.identity.driver, &self.identity.node)?;
        let pod_claim_index = match allocation.pods.first() {
            Some(pod) => self
                .reader
                .pod_claim_names(&claim.namespace, &pod.name)
                .await?
                .and_then(|names| names.iter().position(|n| *n == claim.name))
                .and_then(|i| u32::try_from(i).ok()),
            None => None,
        };
        let mut facts = Vec::with_capacity(allocation.results.len());
        let mut vfs = Vec::with_capacity(allocation.results.len());
        for result in &allocation.results {
            let device_error =
                |source| ClaimError::Device { request: result.request.clone(), source };
            let found = self.devices.facts(&result.device).await.map_err(device_error)?;
            let parent_limit = match found.sharing {
                Sharing::Exclusive => None,
                Sharing::Shared | Sharing::Slot => {
                    self.devices.parent_limit(&found.if_name).await.map_err(device_error)?
                }
            };
            let attributes = match &self.metadata {
                Some(_) => self.devices.attributes(&result.device).await.map_err(device_error)?,
                None => BTreeMap::new(),
            };
            let vf = match found.kind {
                DeviceKind::SriovVf => {
                    self.devices.virtual_function(&result.device).await.map_err(device_error)?
                }
                _ => None,
            };
            vfs.push(vf);
            facts.push((found, attributes, parent_limit));
        }
        let merged = merged_configs(&allocation)?;
        // The PodNetworks the configs name, from the node's watch (no API call).
        let networks = self.pod_networks(&network_names(&allocation, &merged)).await?;
        let inputs = PrepareInputs {
            claim,
            allocation: &allocation,
            facts,
            merged,
            networks,
            pod_claim_index,
        };
        let mut reserved = match self.reserve_claiming_blocks(&inputs).await? {
            Ok(reserved) => reserved,
            Err(answer) => return Ok(Staged::Done(answer)),
        };
        // VF settings on the PF, before the record that keeps what they replaced.
        if let Err(err) = self.apply_vf_settings(&mut reserved.prepared, &vfs).await {
            let mut state = lock(&self.state);
            state.remove_pending(&claim.uid);
            state.ipam.forget_in_memory(&reserved.new_leases);
            return Err(err);
        }
        // Static PodNetwork addresses: reserved cluster-wide (API, without the lock).
        let reservations = match self.reserve_statics(claim, &reserved.statics).await {
            Ok(reservations) => reservations,
            Err((err, created)) => {
                {
                    let mut state = lock(&self.state);
                    state.remove_pending(&claim.uid);
                    state.ipam.forget_in_memory(&reserved.new_leases);
                }
                self.restore_vf_settings(&reserved.prepared).await.ok();
                self.drop_reservations(&created).await;
                return Err(err);
            }
        };
        Ok(Staged::Ready(Box::new(ReadyClaim { claim: claim.clone(), reserved, reservations })))
    }

    /// Validates the claim and holds its addresses in memory under the state lock; when the
    /// node's blocks of a network are full, claims a block (API, without the lock) and tries
    /// again. `Err(answer)`: the claim was prepared meanwhile.
    pub(super) async fn reserve_claiming_blocks(
        &self,
        inputs: &PrepareInputs<'_>,
    ) -> Result<Result<Reserved, Vec<PreparedDevice>>, ClaimError> {
        let mut block_claims = 0;
        loop {
            let attempt = {
                let mut state = lock(&self.state);
                reserve_claim(&mut state, self.metadata.as_deref(), &self.support, inputs)?
            };
            match attempt {
                Attempt::Done(answer) => return Ok(Err(answer)),
                Attempt::Reserved(reserved) => return Ok(Ok(reserved)),
                Attempt::NeedBlock { plan, ipv4, request } => {
                    block_claims += 1;
                    if block_claims > networks::MAX_BLOCK_CLAIMS {
                        return Err(ClaimError::Ipam {
                            request,
                            field: "podNetwork".to_owned(),
                            source: IpamError::NoFreeBlock {
                                family: if ipv4 { 4 } else { 6 },
                                block_prefix: plan.block_prefix(ipv4),
                                subnets: format!(
                                    "{} (filled by other prepares {} times in a row)",
                                    plan.pod_network,
                                    networks::MAX_BLOCK_CLAIMS
                                ),
                            },
                        });
                    }
                    self.claim_block(&plan, ipv4, &inputs.claim.uid, &request).await?;
                }
            }
        }
    }

    /// Unprepares one claim (holding its UID lock): sets its VFs back as they were found,
    /// releases its addresses and forgets it. A VF that cannot be set back fails the
    /// unprepare before anything is forgotten, so kubelet's retry tries again.
    pub async fn unprepare_claim(&self, claim: &ClaimRef) -> Result<(), ClaimError> {
        self.serialised(&claim.uid, async {
            let prepared = lock(&self.state).prepared.get(&claim.uid).cloned();
            if let Some(prepared) = prepared {
                self.restore_vf_settings(&prepared).await?;
            }
            let state = Arc::clone(&self.state);
            let metadata = self.metadata.clone();
            let owned_claim = claim.clone();
            tokio::task::spawn_blocking(move || {
                commit_unprepare(&state, metadata.as_deref(), &owned_claim)
            })
            .await
            .map_err(ClaimError::Task)??;
            // Static PodNetwork reservations go once the claim is released.
            self.drop_orphan_reservations().await;
            Ok(())
        })
        .await
    }
}

impl<R: ClaimReader, D: DeviceLookup, S: ClaimStore> ClaimService<R, D, S> {
    /// Applies the settings of each `sriov-vf` device of `prepared` on its PF and records
    /// what they replaced in the device; on a failure the devices done before are set back.
    /// `vfs` holds each allocation result's VF (in the order of `prepared.devices`).
    pub(super) async fn apply_vf_settings(
        &self,
        prepared: &mut PreparedClaim,
        vfs: &[Option<VfRef>],
    ) -> Result<(), ClaimError> {
        for index in 0..prepared.devices.len() {
            let device = &prepared.devices[index];
            if device.config.mode != ResolvedMode::SriovVf {
                continue;
            }
            let (request, name) = (device.request.clone(), device.device.clone());
            // The VF whose snapshot is durable: a failure from then on sets it back too.
            let mut snapshot_held = None;
            let outcome = match (&self.vf_port, vfs.get(index).cloned().flatten()) {
                (None, _) => Err(ClaimError::NoVfPort { request, device: name }),
                (_, None) => Err(ClaimError::NotAVf { request, device: name }),
                (Some(port), Some(vf)) => {
                    let port = port.as_ref();
                    let vf_error = |source: VfError| ClaimError::Vf {
                        request: request.clone(),
                        device: name.clone(),
                        source: Box::new(source),
                    };
                    match port.read(&vf).await {
                        Err(source) => Err(vf_error(VfError::Read { vf: vf.clone(), source })),
                        // Durable before the first change (DESIGN §6): killed before the
                        // claim's record, the daemon still knows what to set back.
                        Ok(found) => match self.hold_vf_snapshot(&prepared.uid, &vf, found).await {
                            Err(err) => Err(err),
                            Ok(before) => {
                                snapshot_held = Some(PreparedVf { vf: vf.clone(), before });
                                let wanted = vf::wanted(&before, &device.config);
                                vf::apply(port, &vf, &device.if_name, &wanted)
                                    .await
                                    .map(|_| PreparedVf { vf, before })
                                    .map_err(vf_error)
                            }
                        },
                    }
                }
            };
            match outcome {
                Ok(done) => {
                    prepared.devices[index].vf = Some(done);
                    crate::failpoint!("claims.prepare.after_vf_apply");
                }
                Err(err) => {
                    prepared.devices[index].vf = snapshot_held;
                    self.restore_vf_settings(prepared).await.ok();
                    return Err(err);
                }
            }
        }
        Ok(())
    }

    /// Sets the VFs of `prepared` back to the settings found before it and removes their
    /// snapshots ([`vf_snapshots`]); every device is tried, the first failure is returned.
    pub(super) async fn restore_vf_settings(&self, prepared: &PreparedClaim) -> Result<(), ClaimError> {
        let mut first_error = None;
        let mut restored = Vec::new();
        for device in &prepared.devices {
            let Some(done) = &device.vf else { continue };
            let Some(port) = &self.vf_port else {
                first_error.get_or_insert(ClaimError::NoVfPort {
                    request: device.request.clone(),
                    device: device.device.clone(),
                });
                continue;
            };
            match vf::restore(port.as_ref(), &done.vf, &done.before).await {
                Ok(()) => {
                    tracing::info!(vf = %done.vf, claim = %prepared.name,
                        "VF settings set back as found before the claim");
                    restored.push(done.vf.clone());
                }
                Err(source) => {
                    first_error.get_or_insert(ClaimError::Vf {
                        request: device.request.clone(),
                        device: device.device.clone(),
                        source: Box::new(source),
                    });
                }
            }
        }
        if let Err(err) = self.drop_vf_snapshots(restored).await {
            first_error.get_or_insert(err);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Child counts of the netdev a new child would sit on, from the children already planned:
/// the parent `facts.if_name` itself, or its VLAN sub-interface when `vlan` is set (each is
/// its own netdev with its own receive handler, so kinds and passthru count per netdev). A
/// macvlan parent takes one passthru child or any number of other children; a parent
/// carries macvlan or ipvlan children, not both.
pub(super) fn add_planned_children<'a>(
    facts: &mut DeviceFacts,
    vlan: Option<u16>,
    planned: impl Iterator<Item = (&'a str, &'a ResolvedNetworkConfig)>,
) {
    for (if_name, config) in planned {
        if if_name != facts.if_name || config.vlan != vlan {
            continue;
        }
        match config.mode {
            ResolvedMode::Macvlan { mode: MacvlanMode::Passthru } => facts.passthru_children += 1,
            ResolvedMode::Macvlan { .. } => facts.other_children += 1,
            ResolvedMode::Ipvlan { .. } => facts.ipvlan_children += 1,
            ResolvedMode::HostDevice | ResolvedMode::SriovVf => {}
        }
    }
}

/// The lease owner of one allocated device of a claim.
pub(super) fn owner(claim: &ClaimRef, result: &AllocatedResult) -> LeaseOwner {
    LeaseOwner {
        claim_uid: claim.uid.clone(),
        request: result.request.clone(),
        device: result.device.clone(),
        share_id: result.share_id.clone(),
    }
}

/// Refuses a pool whose subnet another prepared claim uses with other settings (DESIGN §4:
/// a pool is identified by its subnet on a node), naming the first differing field; and a
/// pool overlapping another one where either could hand out the other's gateway (leases are
/// per address across pools, so no address goes out twice, but a pod given a gateway's
/// address breaks every pod routed through it).
pub(super) fn check_pool_settings<'a>(
    in_use: impl Iterator<Item = &'a PreparedClaim>,
    claim_uid: &str,
    request: &str,
    pool: &PoolSpec,
) -> Result<(), ClaimError> {
    for other in in_use.filter(|c| c.uid != claim_uid) {
        for device in &other.devices {
            let Addressing::Pool(theirs) = &device.config.addressing else { continue };
            if theirs.subnet != pool.subnet {
                let overlapping = theirs.subnet.contains(pool.subnet.network())
                    || pool.subnet.contains(theirs.subnet.network());
                let handed_out_gateway = [(pool, theirs), (theirs, pool)]
                    .into_iter()
                    .find_map(|(a, b)| a.gateway.filter(|g| ipam::pool::is_allocatable(b, *g)));
                if let (true, Some(gateway)) = (overlapping, handed_out_gateway) {
                    return Err(ClaimError::PoolOverlap {
                        request: request.to_owned(),
                        subnet: pool.subnet,
                        other_subnet: theirs.subnet,
                        gateway,
                        other: format!("{}/{}", other.namespace, other.name),
                    });
                }
                continue;
            }
            if let Some(field) = ipam::pool::differing_setting(pool, theirs) {
                return Err(ClaimError::PoolMismatch {
                    request: request.to_owned(),
                    field,
                    subnet: pool.subnet,
                    other: format!("{}/{}", other.namespace, other.name),
                });
            }
        }
    }
    Ok(())
}

/// What a prepare reads before it reserves: the claim, its allocation, the devices' facts
/// (with their published attributes and parent limits), the merged config of each result,
/// and the `PodNetwork`s they name.
pub(super) struct PrepareInputs<'a> {
    pub(super) claim: &'a ClaimRef,
    pub(super) allocation: &'a ClaimAllocation,
    pub(super) facts: Vec<(DeviceFacts, BTreeMap<String, AttributeValue>, Option<u32>)>,
    pub(super) merged: Vec<NetworkConfig>,
    pub(super) networks: BTreeMap<String, PodNetwork>,
    pub(super) pod_claim_index: Option<u32>,
}

/// The addresses of one claim held in memory, and the claim they make.
pub(super) struct Reserved {
    pub(super) prepared: PreparedClaim,
    /// Every lease of the claim.
    pub(super) leases: Vec<Lease>,
    /// The leases new in this attempt (given back if it fails).
    pub(super) new_leases: Vec<Lease>,
    /// Static addresses to reserve cluster-wide.
    pub(super) statics: Vec<StaticReservation>,
}

/// How one in-memory reservation attempt ended.
pub(super) enum Attempt {
    /// Prepared meanwhile (a repeated call): its answer.
    Done(Vec<PreparedDevice>),
    /// Held, and the claim is pending.
    Reserved(Reserved),
    /// The node's blocks of a network's family are full: nothing is held.
    NeedBlock { plan: NetworkAddressing, ipv4: bool, request: String },
}

/// The merged config of each allocation result (class entries, then claim entries).
pub(super) fn merged_configs(allocation: &ClaimAllocation) -> Result<Vec<NetworkConfig>, ClaimError> {
    allocation
        .results
        .iter()
        .map(|result| {
            network_config::merge_for_request(&allocation.config, &result.request).map_err(
                |source| ClaimError::Config {
                    request: result.request.clone(),
                    device: result.device.clone(),
                    source: Box::new(source),
                },
            )
        })
        .collect()
}

/// The `PodNetwork`s the merged configs name, each with the first request and device that
/// names it (for the error).
pub(super) fn network_names(
    allocation: &ClaimAllocation,
    merged: &[NetworkConfig],
) -> BTreeMap<String, (String, String)> {
    let mut names = BTreeMap::new();
    for (result, config) in allocation.results.iter().zip(merged) {
        if let Some(name) = &config.pod_network {
            names
                .entry(name.clone())
                .or_insert_with(|| (result.request.clone(), result.device.clone()));
        }
    }
    names
}

/// How staging one claim of a call ended without an error.
pub(super) enum Staged {
    /// Prepared before (a repeated call): its answer.
    Done(Vec<PreparedDevice>),
    /// Checked, its addresses held in memory (pending): to be committed with the call.
    Ready(Box<ReadyClaim>),
}

/// A pending claim waiting for its call's commit.
pub(super) struct ReadyClaim {
    pub(super) claim: ClaimRef,
    pub(super) reserved: Reserved,
    /// Its new static `PodNetwork` reservations in the API (deleted by the caller if the
    /// commit fails).
    pub(super) reservations: Vec<ipam::OwnedBlock>,
}

/// One failure shared by every claim of a commit (a store error, a panicked task).
#[derive(Debug)]
pub(super) struct SharedCause<E>(pub(super) Arc<E>);

impl<E> Clone for SharedCause<E> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<E: std::fmt::Display> std::fmt::Display for SharedCause<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::error::Error + 'static> std::error::Error for SharedCause<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Commits the pending claims of one call, without the state lock: writes each claim's
/// metadata files (a claim whose files fail fails alone), then commits every other claim with
/// its leases, the blocks they come from that are not recorded yet, its new static
/// reservations and the pruned release records in one durable batch (concurrent calls share
/// `fdatasync`s: group commit); then, under the lock again, the claims become prepared, or
/// their addresses are given back (the caller deletes their reservations in the API).
/// Answers in the order of `ready`.
pub(super) fn commit_prepares<S: ClaimStore>(
    state: &Mutex<State<S>>,
    metadata: Option<&DeviceMetadata>,
    ready: Vec<ReadyClaim>,
) -> Vec<Result<Vec<PreparedDevice>, ClaimError>> {
    // Files before the record: a crash in between leaves files of a claim that is not
    // prepared, which the next start removes.
    let published: Vec<(ReadyClaim, Result<(), ClaimError>)> = ready
        .into_iter()
        .map(|r| {
            let files = metadata.map_or(Ok(()), |m| m.publish(&r.reserved.prepared));
            (r, files.map_err(ClaimError::from))
        })
        .collect();
    let (commit, store) = {
        let state = lock(state);
        let passed = published.iter().filter(|(_, files)| files.is_ok()).map(|(r, _)| r);
        let leases: Vec<Lease> =
            passed.clone().flat_map(|r| r.reserved.leases.iter().cloned()).collect();
        let mut put_blocks = state.ipam.blocks_to_record(&leases);
        put_blocks.extend(passed.flat_map(|r| r.reservations.iter().cloned()));
        let commit = IpamCommit {
            put_leases: leases,
            put_blocks,
            remove_released: state.ipam.expired_releases(),
            ..IpamCommit::default()
        };
        (commit, state.ipam.store().clone())
    };
    let records: Vec<&PreparedClaim> = published
        .iter()
        .filter(|(_, files)| files.is_ok())
        .map(|(r, _)| &r.reserved.prepared)
        .collect();
    let stored = if records.is_empty() {
        Ok(())
    } else {
        crate::failpoint!("claims.prepare.before_commit");
        store.save_prepared(&records, &commit).map_err(|e| SharedCause(Arc::new(e)))
    };
    let mut state = lock(state);
    if stored.is_ok() {
        state.ipam.mark_recorded(&commit.put_blocks);
        state.ipam.forget_released(&commit.remove_released);
    }
    published
        .into_iter()
        .map(|(r, files)| {
            let ReadyClaim { claim, reserved, .. } = r;
            state.remove_pending(&claim.uid);
            let outcome = files.and_then(|()| {
                stored.clone().map_err(|cause| ClaimError::Persist(Box::new(cause)))
            });
            if let Err(err) = outcome {
                if let Some(metadata) = metadata
                    && let Err(cleanup) = metadata.remove(&claim)
                {
                    tracing::warn!(claim = %claim, error = %cleanup, "removing device metadata after a failed prepare");
                }
                // Nothing of this claim reached the store: give its addresses back. Blocks
                // it claimed stay owned (in the API they are this node's), recorded by a
                // later commit or adopted at the next start.
                state.ipam.forget_in_memory(&reserved.new_leases);
                return Err(err);
            }
            let answer = reserved.prepared.kubelet_devices();
            state.add_prepared(reserved.prepared);
            Ok(answer)
        })
        .collect()
}

/// Validates a claim's devices and holds its addresses in memory (under the state lock);
/// the claim is then pending. On an error, or when a block must be claimed first, nothing
/// stays held.
pub(super) fn reserve_claim<S: ClaimStore>(
    state: &mut State<S>,
    metadata: Option<&DeviceMetadata>,
    support: &NodeSupport,
    inputs: &PrepareInputs<'_>,
) -> Result<Attempt, ClaimError> {
    let PrepareInputs { claim, allocation, pod_claim_index, .. } = *inputs;
    if let Some(done) = state.prepared.get(&claim.uid) {
        return Ok(Attempt::Done(done.kubelet_devices()));
    }
    let mut devices: Vec<(_, DeviceFacts, _, ResolvedNetworkConfig)> =
        Vec::with_capacity(allocation.results.len());
    let per_result =
        allocation.results.iter().zip(inputs.facts.iter().cloned()).zip(&inputs.merged);
    for ((result, (mut facts, attributes, parent_limit)), merged) in per_result {
        let config_error = |source| ClaimError::Config {
            request: result.request.clone(),
            device: result.device.clone(),
            source: Box::new(source),
        };
        let network = merged.pod_network.as_ref().and_then(|name| inputs.networks.get(name));
        // Children of other claims and of this claim's earlier results.
        let parent = facts.if_name.clone();
        let in_use = state.devices_on(&parent).map(|d| (&*d.if_name, &d.config));
        let this_claim = devices.iter().map(|(_, f, _, c)| (&*f.if_name, c));
        add_planned_children(&mut facts, merged.vlan, in_use.chain(this_claim));
        let config = merged.validate_in(network, &facts, support).map_err(config_error)?;
        parent_capacity::check_device(state, &devices, result, &facts, parent_limit, config.mode)?;
        devices.push((result, facts, attributes, config));
    }
    let mut prepared = PreparedClaim {
        uid: claim.uid.clone(),
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        devices: Vec::with_capacity(devices.len()),
        reserved_for: allocation.pods.clone(),
        generation: allocation.generation,
        pod_claim_index,
        pod_claim_name: allocation.pod_claim_name.clone(),
    };
    let mut held = Held::default();
    let mut need_block = None;
    let outcome = (|| {
        for (result, facts, attributes, config) in devices {
            let addresses = match hold_addresses(state, claim, result, &config, &mut held)? {
                Ok(addresses) => addresses,
                Err((plan, ipv4)) => {
                    need_block = Some((plan, ipv4, result.request.clone()));
                    return Ok(());
                }
            };
            prepared.devices.push(PreparedClaimDevice {
                request: result.request.clone(),
                pool: result.pool.clone(),
                device: result.device.clone(),
                share_id: result.share_id.clone(),
                sharing: Some(facts.sharing),
                kind: Some(facts.kind),
                host_mtu: Some(facts.mtu),
                if_name: facts.if_name,
                config,
                addresses,
                attributes,
                cdi_device_ids: Vec::new(),
                vf: None,
            });
        }
        Ok(())
    })();
    if let Err(err) = outcome {
        state.ipam.forget_in_memory(&held.new_leases);
        return Err(err);
    }
    if let Some((plan, ipv4, request)) = need_block {
        state.ipam.forget_in_memory(&held.new_leases);
        return Ok(Attempt::NeedBlock { plan, ipv4, request });
    }
    if let Some(metadata) = metadata {
        // The CDI id of a request goes with its first device: kubelet injects every id of
        // every device of the request, and one mount per request is enough.
        let mut seen = BTreeSet::new();
        for device in &mut prepared.devices {
            let request = metadata::top_level(&device.request).to_owned();
            if seen.insert(request.clone()) {
                device.cdi_device_ids = vec![metadata.cdi_device_id(&claim.uid, &request)];
            }
        }
    }
    state.add_pending(prepared.clone());
    let Held { leases, new_leases, statics } = held;
    Ok(Attempt::Reserved(Reserved { prepared, leases, new_leases, statics }))
}

/// The leases one reservation attempt holds.
#[derive(Default)]
pub(super) struct Held {
    pub(super) leases: Vec<Lease>,
    pub(super) new_leases: Vec<Lease>,
    pub(super) statics: Vec<StaticReservation>,
}

impl Held {
    pub(super) fn take(&mut self, lease: Lease, new: bool) {
        if new {
            self.new_leases.push(lease.clone());
        }
        self.leases.push(lease);
    }
}

/// Holds the addresses of one allocated device in memory (under the state lock): the
/// interface addresses, or `Err((plan, ipv4))` when the node's blocks of that family of a
/// network are full (what this call held stays in `held`, for the caller to give back).
pub(super) fn hold_addresses<S: LeaseStore>(
    state: &mut State<S>,
    claim: &ClaimRef,
    result: &AllocatedResult,
    config: &ResolvedNetworkConfig,
    held: &mut Held,
) -> Result<Result<Vec<IpNetwork>, (NetworkAddressing, bool)>, ClaimError> {
    let ipam_error = |field: String| {
        move |source| ClaimError::Ipam { request: result.request.clone(), field, source }
    };
    let owner = owner(claim, result);
    let addresses = match &config.addressing {
        Addressing::None => Vec::new(),
        Addressing::Static(addresses) => {
            for (i, address) in addresses.iter().enumerate() {
                let (lease, new) = state
                    .ipam
                    .reserve_static_in_memory(&owner, *address, None)
                    .map_err(ipam_error(format!("ipam.addresses[{i}]")))?;
                held.take(lease, new);
            }
            addresses.clone()
        }
        Addressing::Pool(pool) => {
            check_pool_settings(state.pool_users(), &claim.uid, &result.request, pool)?;
            let (lease, new) = state
                .ipam
                .reserve_in_memory(&owner, pool)
                .map_err(ipam_error("ipam.pool".to_owned()))?;
            let address = lease.interface_address();
            held.take(lease, new);
            vec![address]
        }
        Addressing::Network(plan) if !plan.addresses.is_empty() => {
            for (i, address) in plan.addresses.iter().enumerate() {
                let field = format!("ipam.addresses[{i}]");
                let (lease, new) = state
                    .ipam
                    .reserve_static_in_memory(&owner, *address, Some(&plan.pod_network))
                    .map_err(ipam_error(field.clone()))?;
                held.statics.push(StaticReservation {
                    request: result.request.clone(),
                    field,
                    lease: lease.clone(),
                });
                held.take(lease, new);
            }
            plan.addresses.clone()
        }
        Addressing::Network(plan) => {
            let mut addresses = Vec::with_capacity(2);
            for ipv4 in plan.families() {
                let Some((lease, new)) = state.ipam.reserve_in_blocks(&owner, plan, ipv4) else {
                    return Ok(Err((plan.clone(), ipv4)));
                };
                addresses.push(lease.interface_address());
                held.take(lease, new);
            }
            addresses
        }
    };
    Ok(Ok(addresses))
}

pub(super) fn commit_unprepare<S: ClaimStore>(
    state: &Mutex<State<S>>,
    metadata: Option<&DeviceMetadata>,
    claim: &ClaimRef,
) -> Result<(), ClaimError> {
    release_claim(state, &claim.uid)?;
    // After the record: a crash in between leaves files of a claim that is not prepared,
    // which the next start removes; a failure here fails the unprepare, and kubelet's retry
    // (for a claim no longer prepared) removes them.
    if let Some(metadata) = metadata {
        metadata.remove(claim)?;
    }
    Ok(())
}

/// Forgets a claim and releases its leases in one durable commit, made without the state
/// lock; the addresses stay held in memory until it is done, so none is handed out while
/// the claim could still come back after a crash.
///
/// The batch also records each address's release (quarantine, DESIGN §4). The claim's
/// static `PodNetwork` reservations stay recorded: the caller deletes them in the API next
/// (and the block upkeep does when that fails), so none is ever forgotten while it exists.
pub(super) fn release_claim<S: ClaimStore>(state: &Mutex<State<S>>, uid: &str) -> Result<(), ClaimError> {
    let (commit, store) = {
        let state = lock(state);
        let leases = state.ipam.leases_of_claim(uid);
        let released = state.ipam.release_records(&leases);
        let commit = IpamCommit {
            remove_leases: leases,
            put_released: released,
            remove_released: state.ipam.expired_releases(),
            ..IpamCommit::default()
        };
        (commit, state.ipam.store().clone())
    };
    store.remove_prepared(uid, &commit).map_err(|e| ClaimError::Persist(Box::new(e)))?;
    crate::failpoint!("claims.unprepare.after_commit");
    let mut state = lock(state);
    state.remove_prepared(uid);
    state.ipam.apply_release(&commit.remove_leases, &commit.put_released);
    state.ipam.forget_released(&commit.remove_released);
    Ok(())
}

pub(super) fn failure(claim: &ClaimRef, err: &ClaimError) -> ClaimFailure {
    ClaimFailure::new(format!("claim {}/{}: {err}", claim.namespace, claim.name))
}

impl<R: ClaimReader, D: DeviceLookup, S: ClaimStore> ClaimPreparer for ClaimService<R, D, S> {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        self.prepare_claims(&claims)
            .await
            .into_iter()
            .map(|(claim, result)| {
                if let Err(err) = &result {
                    tracing::warn!(claim = %claim, error = %err, "prepare failed");
                }
                (claim.uid.clone(), result.map_err(|e| failure(&claim, &e)))
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        futures::stream::iter(claims)
            .map(|claim| async move {
                let result = self.unprepare_claim(&claim).await;
                (claim.uid.clone(), result.map_err(|e| failure(&claim, &e)))
            })
            .buffer_unordered(MAX_CONCURRENT_CLAIMS)
            .collect()
            .await
    }
}
