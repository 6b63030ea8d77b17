//! The claim service's ports, with their errors: the API ([`ClaimSource`]), the node's
//! inventory ([`DeviceSource`]), durable state ([`ClaimStore`], with the VF snapshots of
//! [`VfSnapshotStore`]), the pod's device metadata files ([`MetadataStore`]), the PodNetworks
//! and their IPBlocks ([`PodNetworkSource`], [`IpBlockApi`]), the namespaces' labels
//! ([`NamespaceSource`]) and a VF's settings on its PF ([`VfPort`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::networks::{BlockApiError, BlockEvent, Created, Deleted, NetworkReadError};
use super::record::PreparedClaim;
use super::vf::{VfChange, VfPortError, VfRef, VfState};
use super::vf_snapshots::VfSnapshot;
use crate::ipam::{IpamCommit, LeaseStore};
use crate::model::bandwidth::BitsPerSecond;
use crate::model::cause::Cause;
use crate::model::device::{AttributeValue, PciAddress};
use crate::model::names::{ATTRIBUTE_DOMAIN, attr};
use crate::model::network_config::{DeviceFacts, DeviceKind, MacAddr, Sharing};
use crate::model::pod_network::{IpBlock, PodNetwork};

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
pub trait ClaimSource: Send + Sync + 'static {
    /// The claim as the API server has it now.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, ReadError>> + Send;

    /// The pod's claims in `spec.resourceClaims` order, as claim names
    /// ([`super::allocation::pod_claim_names`]); `None` when the pod does not exist.
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
pub trait DeviceSource: Send + Sync + 'static {
    /// Facts of device `name` (a slot maps to its parent); child counts left at 0.
    fn facts(&self, name: &str) -> impl Future<Output = Result<DeviceFacts, LookupError>> + Send;
    /// The attributes device `name` is published with (for the device metadata file).
    fn attributes(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<BTreeMap<String, AttributeValue>, LookupError>> + Send;
    /// How many sub-interfaces host interface `if_name` may carry in all, across every
    /// device published on it ([`super::parent_capacity`]); `None`: no limit known.
    fn parent_limit(
        &self,
        if_name: &str,
    ) -> impl Future<Output = Result<Option<u32>, LookupError>> + Send {
        let _ = if_name;
        async { Ok(None) }
    }
    /// The most any device published on host interface `if_name` offers as
    /// `netclaim.dev/bandwidth` (`claims::bandwidth`); `None`: none is published.
    fn parent_bandwidth(
        &self,
        if_name: &str,
    ) -> impl Future<Output = Result<Option<BitsPerSecond>, LookupError>> + Send {
        let _ = if_name;
        async { Ok(None) }
    }
    /// The PF and index of VF device `name`, from its published `pfName` and `vfIndex`
    /// (discovered from sysfs); `None` when it has either missing.
    fn virtual_function(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<VfRef>, LookupError>> + Send {
        let attributes = self.attributes(name);
        async move { Ok(vf_of(&attributes.await?)) }
    }

    /// Everything a prepare needs of each device in `names` ([`ResolvedDevice`]), one
    /// answer per name in order; the attributes only `with_attributes` (device metadata on).
    /// This default asks the methods above one by one; a lookup over a discovery answers
    /// every device of a claim from one snapshot of the node's interfaces.
    fn resolve(
        &self,
        names: &[String],
        with_attributes: bool,
    ) -> impl Future<Output = Vec<Result<ResolvedDevice, LookupError>>> + Send {
        async move {
            let mut resolved = Vec::with_capacity(names.len());
            for name in names {
                resolved.push(self.resolve_one(name, with_attributes).await);
            }
            resolved
        }
    }

    /// [`Self::resolve`] of one device through the methods above.
    #[doc(hidden)]
    fn resolve_one(
        &self,
        name: &str,
        with_attributes: bool,
    ) -> impl Future<Output = Result<ResolvedDevice, LookupError>> + Send {
        async move {
            let facts = self.facts(name).await?;
            let parent_limit = match facts.sharing {
                Sharing::Exclusive => None,
                Sharing::Shared | Sharing::Slot => self.parent_limit(&facts.if_name).await?,
            };
            let parent_bandwidth = match facts.sharing {
                Sharing::Exclusive => None,
                Sharing::Shared | Sharing::Slot => self.parent_bandwidth(&facts.if_name).await?,
            };
            let attributes =
                if with_attributes { self.attributes(name).await? } else { BTreeMap::new() };
            let vf = match facts.kind {
                DeviceKind::SriovVf => self.virtual_function(name).await?,
                _ => None,
            };
            Ok(ResolvedDevice { facts, parent_limit, parent_bandwidth, attributes, vf })
        }
    }
}

/// What a prepare needs of one allocated device, from one look at the node's inventory.
#[derive(Debug, Clone, PartialEq)]
pub struct ResolvedDevice {
    /// Its facts (a slot maps to its parent); child counts left at 0.
    pub facts: DeviceFacts,
    /// How many sub-interfaces its host interface may carry across every device published
    /// on it ([`DeviceSource::parent_limit`]); `None` for an exclusive device or no limit.
    pub parent_limit: Option<u32>,
    /// The `netclaim.dev/bandwidth` published on its host interface
    /// ([`DeviceSource::parent_bandwidth`]); `None` for an exclusive device or none known.
    pub parent_bandwidth: Option<BitsPerSecond>,
    /// The attributes it is published with; empty unless asked for.
    pub attributes: BTreeMap<String, AttributeValue>,
    /// The VF of a `sriov-vf` device ([`DeviceSource::virtual_function`]).
    pub vf: Option<VfRef>,
}

/// The VF a device's published attributes name (`pfName` and `vfIndex`, qualified or not);
/// `None` when either is missing.
#[must_use]
pub fn vf_of(attributes: &BTreeMap<String, AttributeValue>) -> Option<VfRef> {
    let get = |key: &str| {
        attributes.get(&format!("{ATTRIBUTE_DOMAIN}/{key}")).or_else(|| attributes.get(key))
    };
    match (get(attr::PF_NAME), get(attr::VF_INDEX)) {
        (Some(AttributeValue::String(pf)), Some(AttributeValue::Int(index))) => {
            u32::try_from(*index).ok().map(|index| VfRef { pf: pf.clone(), index })
        }
        _ => None,
    }
}

/// Durable state of prepared claims; the same store keeps the IPAM's leases, release
/// records and owned blocks. Calls block on disk I/O (the service runs them on the blocking
/// pool, without its state lock).
pub trait ClaimStore:
    LeaseStore
    + VfSnapshotStore
    + super::ethtool_settings::EthtoolSnapshotStore
    + super::vfio_ports::VfioBindingStore
    + Clone
    + Send
    + Sync
    + 'static
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
    /// Announces a durable commit the caller will make soon (a prepare call, from its
    /// start), so that a commit ready earlier may wait a moment and share one `fdatasync`
    /// with it (group commit); dropping the notice withdraws the announcement. The default
    /// announces nothing.
    fn announce_commit(&self) -> CommitNotice {
        Box::new(())
    }
}

/// An announced commit ([`ClaimStore::announce_commit`]), withdrawn when dropped.
pub type CommitNotice = Box<dyn Send>;

/// Reads and sets VF settings on the PF (`host::sriov` over rtnetlink; a fake in tests).
pub trait VfPort: Send + Sync + 'static {
    /// The VF's current settings.
    fn read<'a>(&'a self, vf: &'a VfRef) -> BoxFuture<'a, Result<VfState, VfPortError>>;
    /// One change on the PF.
    fn set<'a>(&'a self, vf: &'a VfRef, change: VfChange)
    -> BoxFuture<'a, Result<(), VfPortError>>;
    /// Sets the MAC of the VF's own netdev `if_name` in the host netns (`IFLA_ADDRESS`).
    fn set_netdev_mac<'a>(
        &'a self,
        if_name: &'a str,
        mac: MacAddr,
    ) -> BoxFuture<'a, Result<(), VfPortError>>;
    /// The PCI address of VF `vf` now (the PF's `virtfn<index>` in sysfs); `None` when the PF
    /// or the VF does not exist.
    fn pci_address<'a>(
        &'a self,
        vf: &'a VfRef,
    ) -> BoxFuture<'a, Result<Option<PciAddress>, VfPortError>>;
    /// Where the VF with PCI address `pci` is now: its PF's interface name and its index
    /// (sysfs `physfn`); `None` when there is no such VF (or its PF has no netdev).
    fn locate(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<VfRef>, VfPortError>>;
    /// The name the netdev of the VF at PCI address `pci` has now in the host netns (sysfs
    /// `bus/pci/devices/<pci>/net`); `None` when it has none there. The name recorded at
    /// prepare may be another after a reboot (DESIGN §6).
    fn netdev(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<String>, VfPortError>> {
        let _ = pci;
        Box::pin(async { Ok(None) })
    }
    /// The id of the running boot (`/proc/sys/kernel/random/boot_id`): VF settings do not
    /// survive a reboot, so values read in another boot are not this VF's any more.
    fn boot_id(&self) -> Result<String, VfPortError>;
}

/// The filesystem as device metadata needs it. Calls block on I/O.
pub trait MetadataStore: Send + Sync + 'static {
    /// Writes `contents` into the file at `path` in place: the same inode when the file
    /// exists (a container's bind mount follows the inode, so a replaced file would not be
    /// seen), written from offset 0 and then cut to length, so a reader never sees an empty
    /// file. Creates the file and its directories when missing.
    fn write_in_place(&self, path: &Path, contents: &[u8]) -> Result<(), Cause>;
    /// Replaces the file at `path` atomically (a runtime watching the directory never reads
    /// half a spec). Creates its directory when missing.
    fn replace(&self, path: &Path, contents: &[u8]) -> Result<(), Cause>;
    /// The file's contents; `None` when it does not exist.
    fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, Cause>;
    /// Removes a file; a missing one is fine.
    fn remove_file(&self, path: &Path) -> Result<(), Cause>;
    /// Removes a directory tree; a missing one is fine.
    fn remove_dir_all(&self, path: &Path) -> Result<(), Cause>;
    /// Names of the entries of a directory; a missing directory has none.
    fn list(&self, dir: &Path) -> Result<Vec<String>, Cause>;
}

/// The `PodNetwork`s as the node last saw them (a watch on the daemon).
pub trait PodNetworkSource: Send + Sync + 'static {
    /// The network named `name`; `None` when it does not exist.
    fn get(&self, name: &str) -> BoxFuture<'_, Result<Option<PodNetwork>, NetworkReadError>>;
    /// Resolves when the networks may have changed since the last call (the block release
    /// loop wakes on it, so a network being deleted gives its empty blocks back at once).
    fn changed(&self) -> BoxFuture<'_, ()>;
}

/// Why the node cannot say which labels a namespace has (a `namespaceSelector` then refuses
/// the claim: the check fails closed).
#[derive(Debug, Clone, thiserror::Error)]
pub enum NamespaceReadError {
    /// The node has not completed its first list of the namespaces.
    #[error("the node has not read the Namespaces yet (the watch is not synced); kubelet retries")]
    NotSynced,
    /// The node's watch has no namespace of that name.
    #[error("no Namespace of this name is known to the node")]
    NotFound,
    /// This node runs without a namespace watch.
    #[error("this node does not watch Namespaces")]
    NotWatched,
}

/// The Namespaces' labels as the node last saw them (a watch on the daemon, not one GET per
/// claim), for `PodNetwork.spec.namespaceSelector` (adapter: `k8s::namespaces`).
pub trait NamespaceSource: Send + Sync + 'static {
    /// The labels of namespace `name`.
    fn labels(
        &self,
        name: &str,
    ) -> BoxFuture<'_, Result<BTreeMap<String, String>, NamespaceReadError>>;
}

/// The `IPBlock` API (adapter: `k8s::ip_blocks`).
pub trait IpBlockApi: Send + Sync + 'static {
    /// Every block whose `spec.nodeName` is `node`.
    fn list_node(&self, node: &str) -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>>;
    /// Every block of `pod_network`.
    fn list_network(&self, pod_network: &str)
    -> BoxFuture<'_, Result<Vec<IpBlock>, BlockApiError>>;
    /// Creates `block` (named by its metadata); an existing object of that name is returned as
    /// [`Created::Exists`].
    fn create(&self, block: IpBlock) -> BoxFuture<'_, Result<Created, BlockApiError>>;
    /// Deletes `name` if its UID is `uid` (a precondition: never someone else's object).
    fn delete<'a>(
        &'a self,
        name: &'a str,
        uid: &'a str,
    ) -> BoxFuture<'a, Result<Deleted, BlockApiError>>;
    /// The changes of every block whose `spec.nodeName` is `node`, starting with a
    /// [`BlockEvent::Relisted`] and relisting after the watch lost its place; an error item
    /// does not end the stream. The default never yields (an API without watches: blocks are
    /// then checked only by the start-up reconcile).
    fn watch_node(&self, node: &str) -> BoxStream<'_, Result<BlockEvent, BlockApiError>> {
        let _ = node;
        Box::pin(futures::stream::pending())
    }
}

/// Durable [`VfSnapshot`]s, one per VF; part of the claims' store ([`ClaimStore`]). Calls
/// block on disk I/O.
pub trait VfSnapshotStore: LeaseStore {
    /// Every snapshot.
    fn load_vf_snapshots(&self) -> Result<Vec<VfSnapshot>, Self::Error>;
    /// The snapshot with key `key` ([`VfSnapshot::key`]), if there is one (no disk I/O).
    fn vf_snapshot(&self, key: &str) -> Result<Option<VfSnapshot>, Self::Error>;
    /// Creates or replaces the snapshot of its VF in one synced commit.
    fn save_vf_snapshot(&self, snapshot: &VfSnapshot) -> Result<(), Self::Error>;
    /// Removes the snapshots with the keys `keys` in one synced commit; without any, writes
    /// nothing.
    fn remove_vf_snapshots(&self, keys: &[String]) -> Result<(), Self::Error>;
}
