//! `PodNetwork` claims on the node (DESIGN §4): the ports to the networks and to the
//! `IPBlock` API, claiming a block when the node's blocks are full, reserving static
//! addresses cluster-wide, adopting and reconciling blocks at start, and releasing empty
//! blocks.
//!
//! API calls happen per block, never per address: a prepare that finds room in an owned
//! block makes none. Claiming a block: create the `IPBlock` named after its CIDR at the
//! node's start candidate ([`crate::ipam::blocks::Candidates`]); `409 AlreadyExists` means
//! another node won (or this node, before a crash: then it is adopted); after the first lost
//! race the network's blocks are listed once and every taken one skipped. The created block is
//! owned in memory at once and recorded in the store with the first commit that uses it; a
//! crash before that leaves a block in the API with this node's name, adopted at the next
//! start from the list of this node's blocks. Decision 0014 has every crash case.

mod claim;
mod reconcile;
mod statics;
mod upkeep;

pub use super::ports::{IpBlockApi, PodNetworkSource};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::state::lock;
use super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use crate::ipam::{Lease, OwnedBlock};
use crate::model::cause::Cause;
use crate::model::pod_network::{IpBlock, IpBlockClaim, PodNetwork};

/// Why the node cannot say what a `PodNetwork` is.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NetworkReadError {
    /// The node has not completed its first list of the networks.
    #[error("the node has not read the PodNetworks yet (the watch is not synced); kubelet retries")]
    NotSynced,
    /// Reading failed.
    #[error("reading the PodNetwork: {0}")]
    Failed(#[source] Cause),
}

/// A failed `IPBlock` call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{op} IPBlock {name}: {source}")]
pub struct BlockApiError {
    /// `create`, `get`, `list`, `delete`.
    pub op: &'static str,
    /// The object (or the list's selector).
    pub name: String,
    /// The API error.
    #[source]
    pub source: Cause,
}

/// What a create answered.
#[derive(Debug, Clone)]
pub enum Created {
    /// The block is ours (the object as created, with its UID).
    Created(IpBlock),
    /// An object of that name exists (409 AlreadyExists): the one the API has.
    Exists(IpBlock),
}

/// What a delete did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// Deleted now.
    Deleted,
    /// There was none.
    Gone,
    /// An object of that name with another UID exists (not ours: left alone).
    NotOurs,
}

/// What the claim service needs for `PodNetwork` claims.
#[derive(Clone)]
pub struct NetworkPorts {
    /// The networks.
    pub networks: Arc<dyn PodNetworkSource>,
    /// The blocks.
    pub blocks: Arc<dyn IpBlockApi>,
    /// `--block-release-grace`: how long an empty block is kept.
    pub release_grace: Duration,
}

impl std::fmt::Debug for NetworkPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetworkPorts")
            .field("release_grace", &self.release_grace)
            .finish_non_exhaustive()
    }
}

/// Blocks tried at most per claim of a block after the network's list (each lost race is a
/// create and a get): more means the network is full or contended, and kubelet retries.
const MAX_RACES: usize = 16;
/// Candidates looked at locally at most per claim (a huge IPv6 subnet is never walked).
const MAX_CANDIDATES: usize = 1 << 20;
/// Times a prepare claims a new block at most before it gives up (other claims can fill a
/// block between its claim and the retry only when far more prepare at once).
pub(super) const MAX_BLOCK_CLAIMS: usize = 8;

/// One async lock per (network, IPv4?) for block claims on this node.
pub(super) type BlockGates = std::sync::Mutex<HashMap<(String, bool), Arc<tokio::sync::Mutex<()>>>>;

/// A static address another claim holds cluster-wide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{address} is reserved in podNetwork {pod_network} by {holder} on node {node}")]
pub struct HeldReservation {
    /// The address.
    pub address: std::net::IpAddr,
    /// The network.
    pub pod_network: String,
    /// Who holds it (`claim ns/name (uid …)`).
    pub holder: String,
    /// The node whose reservation it is.
    pub node: String,
}

/// A static address of a claim to reserve cluster-wide.
#[derive(Debug, Clone)]
pub(super) struct StaticReservation {
    /// Request of the device.
    pub(super) request: String,
    /// `ipam.addresses[i]`.
    pub(super) field: String,
    /// The lease held in memory.
    pub(super) lease: Lease,
}

/// What the start-up reconcile did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockReconcile {
    /// Blocks of this node in the API that were not recorded (created before a crash).
    pub adopted: usize,
    /// Recorded blocks gone from the API without leases, forgotten.
    pub forgotten: usize,
    /// Recorded blocks gone from the API with live leases (kept, claimed again).
    pub lost: usize,
}

/// One pass of block upkeep: what happened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockUpkeep {
    /// Blocks deleted in the API (empty past the grace, of a network being deleted, or
    /// reservations of claims gone).
    pub released: Vec<String>,
    /// Release records pruned.
    pub pruned: usize,
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Serves `PodNetwork` claims through `ports` (without them, a claim naming a network
    /// fails its prepare naming `podNetwork`).
    #[must_use]
    pub fn with_pod_networks(mut self, ports: NetworkPorts) -> Self {
        self.networks = Some(ports);
        self
    }

    /// The blocks (and static reservations) this node owns, as it knows them.
    #[must_use]
    pub fn owned_blocks(&self) -> Vec<OwnedBlock> {
        lock(&self.state).ipam.blocks().map(|s| s.block.clone()).collect()
    }

    fn ports(&self) -> Option<&NetworkPorts> {
        self.networks.as_ref()
    }

    /// The networks named by `names`, each checked to serve claims of this driver.
    pub(in crate::claims) async fn pod_networks(
        &self,
        names: &BTreeMap<String, (String, String)>,
    ) -> Result<BTreeMap<String, PodNetwork>, ClaimError> {
        let mut found = BTreeMap::new();
        for (name, (request, device)) in names {
            let config_error = |source| ClaimError::Config {
                request: request.clone(),
                device: device.clone(),
                source: Box::new(source),
            };
            let Some(ports) = self.ports() else {
                return Err(config_error(crate::model::network_config::ConfigError::Invalid {
                    path: "podNetwork".to_owned(),
                    value: format!("{name:?}"),
                    rule: crate::model::network_config::Rule::PodNetworkUnusable(
                        "this node does not serve PodNetworks (no API connection for them)"
                            .to_owned(),
                    ),
                }));
            };
            let network = ports
                .networks
                .get(name)
                .await
                .map_err(|source| ClaimError::NetworkRead { pod_network: name.clone(), source })?;
            crate::model::network_config::check_network_serves(
                name,
                network.as_ref(),
                &self.identity.driver,
            )
            .map_err(config_error)?;
            if let Some(network) = network {
                found.insert(name.clone(), network);
            }
        }
        Ok(found)
    }
}

/// The CIDR of a block object, parsed.
fn parse_cidr(object: &IpBlock) -> Option<ipnetwork::IpNetwork> {
    object.spec.cidr.parse().ok()
}

/// Whether `object` is this node's block `cidr` of `pod_network` (and reservation `claim`).
fn is_ours(
    object: &IpBlock,
    node: &str,
    pod_network: &str,
    cidr: ipnetwork::IpNetwork,
    claim: Option<&IpBlockClaim>,
) -> bool {
    object.spec.node_name == node
        && object.spec.pod_network == pod_network
        && parse_cidr(object) == Some(cidr)
        && object.spec.claim.as_ref() == claim
}

/// The /32 or /128 network of an address.
fn host_network(address: std::net::IpAddr) -> ipnetwork::IpNetwork {
    let prefix = if address.is_ipv4() { 32 } else { 128 };
    // A host prefix of the address's own family is always valid.
    ipnetwork::IpNetwork::new(address, prefix)
        .unwrap_or_else(|_| ipnetwork::IpNetwork::from(address))
}
