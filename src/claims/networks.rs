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
//! start from the list of this node's blocks. Decision 0014 has every crash case. A create that
//! fails without proving nothing was created (a timeout, a 5xx) leaves its name uncertain
//! until the next upkeep pass or block claim lists the network: adopted if it is this node's
//! block, forgotten if absent.
//!
//! Decision 0017 (trust): the node acts only on blocks of networks whose `provider` is its
//! driver (`Provenance`); the IPBlocks are the truth, so a block or reservation is created
//! only where the network's list has no live object overlapping it by CIDR (whatever its
//! name); a release is journaled before its delete; blocks loaded from the store serve only
//! after the first reconcile confirmed them (a prepare waits for it); a watch of this node's
//! blocks marks one deleted or changed under it lost at once; a network with a `Conflict`
//! condition gets no new claims.

mod claim;
mod reconcile;
mod statics;
mod uncertain;
mod upkeep;
mod watch;

pub use watch::{BlockLoss, LossCause};

pub use super::ports::{IpBlockApi, PodNetworkSource};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// One change of this node's `IPBlock`s, as its watch (field selector `spec.nodeName`) sees
/// them ([`IpBlockApi::watch_node`]).
#[derive(Debug, Clone)]
pub enum BlockEvent {
    /// Added or modified.
    Applied(IpBlock),
    /// Deleted (or no longer this node's).
    Deleted(IpBlock),
    /// The watch listed again (at its start, and after it lost its place): every block of
    /// this node now. A block the watch showed before and this list lacks was deleted.
    Relisted(Vec<IpBlock>),
}

/// Where the node reports a block lost (the daemon: `netclaim_ipblocks_lost_total` and a
/// Warning Event with reason [`REASON_BLOCK_LOST`] regarding the `PodNetwork`, which the
/// controller turns into its `Conflict` condition).
pub trait BlockLossSink: Send + Sync + 'static {
    /// Reports one loss (called once per loss, without the service's locks held; must not
    /// block: an adapter spawns its API calls).
    fn block_lost(&self, loss: &BlockLoss);
}

/// Reason of the Warning Event a node records on a `PodNetwork` when it finds one of its
/// blocks of that network lost (the note is [`BlockLoss`]'s text).
pub const REASON_BLOCK_LOST: &str = "IPBlockLost";

/// The condition type the controller sets (`status: "True"`) on a `PodNetwork` whose spec
/// conflicts with its live `IPBlock`s (an edit that bypassed the CRD's rules); nodes hand
/// out no new address on it until it is resolved. One constant, the model's, for both sides.
pub use crate::model::pod_network::CONDITION_CONFLICT;

/// Why a prepare cannot get addresses of a `PodNetwork`'s blocks now (decision 0017).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BlocksUnavailable {
    /// Blocks loaded from the store are not confirmed by the API yet.
    #[error(
        "podNetwork {pod_network}: this node has not confirmed its IPBlocks with the API since it \
         started (waited {waited:?}{}); no address is handed out from them before; kubelet retries",
        last_error.as_ref().map(|e| format!("; last attempt: {e}")).unwrap_or_default()
    )]
    Unverified {
        /// The network.
        pod_network: String,
        /// How long the prepare waited.
        waited: Duration,
        /// Why the last reconcile failed, if one did.
        last_error: Option<String>,
    },
    /// The controller marked the network conflicting.
    #[error(
        "podNetwork {pod_network}: condition Conflict is True ({message}); no new address is \
         handed out on this network until the conflict is resolved"
    )]
    Conflict {
        /// The network.
        pod_network: String,
        /// The condition's message.
        message: String,
    },
    /// The claim's own reservation of a static address is being deleted (it was released).
    #[error(
        "request {request}: {field}: the reservation of {address} in podNetwork {pod_network} is \
         being released; kubelet retries once it is gone"
    )]
    ReservationReleasing {
        /// Request name.
        request: String,
        /// `ipam.addresses[i]`.
        field: String,
        /// The address.
        address: std::net::IpAddr,
        /// The network.
        pod_network: String,
    },
}

/// Whose a network is, for acting on its blocks: only a network whose `provider` is this
/// driver's name is ours; a block of a network the node does not know is left alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Provenance {
    /// Ours; `deleting` when its deletion is under way.
    Ours {
        /// `metadata.deletionTimestamp` is set.
        deleting: bool,
    },
    /// Another driver's network.
    NotOurs,
    /// No such network, or the node cannot read it now.
    Unknown,
}

/// How long a prepare waits at most for the start-up reconcile of blocks loaded from the
/// store: below the DRA service's call deadline (40 s, itself below kubelet's 45 s), so the
/// refusal is ours and names why, and kubelet retries.
pub const FIRST_RECONCILE_PATIENCE: Duration = Duration::from_secs(30);
/// How often a waiting prepare tries the start-up reconcile again.
const RECONCILE_RETRY: Duration = Duration::from_secs(1);

/// What the service keeps about confirming its blocks with the API: the start-up reconcile
/// and the watch of this node's blocks.
pub(super) struct Supervision {
    /// One reconcile at a time (the upkeep's or a waiting prepare's).
    reconcile_gate: tokio::sync::Mutex<()>,
    /// The first reconcile succeeded.
    reconciled: AtomicBool,
    /// Why the last reconcile failed.
    last_error: std::sync::Mutex<Option<String>>,
    /// Blocks the watch has shown, name to UID: one a later relist lacks was deleted.
    seen: std::sync::Mutex<HashMap<String, String>>,
    /// How long a prepare waits for the first reconcile.
    patience: Duration,
    /// The watch of this node's blocks has listed them at least once.
    watch_synced: AtomicBool,
    /// Block creates whose answer was lost, until a list settles them.
    uncertain: uncertain::UncertainCreates,
}

impl Default for Supervision {
    fn default() -> Self {
        Supervision {
            reconcile_gate: tokio::sync::Mutex::new(()),
            reconciled: AtomicBool::new(false),
            last_error: std::sync::Mutex::new(None),
            seen: std::sync::Mutex::new(HashMap::new()),
            patience: FIRST_RECONCILE_PATIENCE,
            watch_synced: AtomicBool::new(false),
            uncertain: uncertain::UncertainCreates::default(),
        }
    }
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

/// Races lost at most after one list of the network's blocks before it is listed again (each
/// lost race is a create and a get; a list learns every block created since at once).
const MAX_RACES: usize = 16;
/// Lists of the network's blocks at most per claim of a block: more means the network is
/// contended beyond reason, and kubelet retries.
const MAX_LISTS: usize = 4;
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

    /// Waits at most `patience` in a prepare for the start-up reconcile of blocks loaded from
    /// the store (default [`FIRST_RECONCILE_PATIENCE`]).
    #[must_use]
    pub fn with_reconcile_patience(mut self, patience: Duration) -> Self {
        self.supervision.patience = patience;
        self
    }

    /// Whether a network is this driver's ([`Provenance`]), from the node's watch.
    pub(super) async fn provenance(&self, ports: &NetworkPorts, name: &str) -> Provenance {
        match ports.networks.get(name).await {
            Ok(Some(network)) if network.spec.provider == self.identity.driver => {
                Provenance::Ours { deleting: network.metadata.deletion_timestamp.is_some() }
            }
            Ok(Some(_)) => Provenance::NotOurs,
            Ok(None) | Err(_) => Provenance::Unknown,
        }
    }

    /// Waits until blocks loaded from the store are confirmed by the API (the start-up
    /// reconcile, run here when the upkeep has not run it yet), at most the patience: before
    /// that a loaded block may be one deleted or taken by another node while the daemon was
    /// down.
    async fn await_first_reconcile(&self, pod_network: &str) -> Result<(), ClaimError> {
        if self.supervision.reconciled.load(Ordering::SeqCst)
            || !lock(&self.state).ipam.has_unverified_blocks()
        {
            return Ok(());
        }
        let patience = self.supervision.patience;
        let attempts = async {
            loop {
                if self.first_reconcile().await.is_ok() {
                    return;
                }
                tokio::time::sleep(RECONCILE_RETRY).await;
            }
        };
        tokio::time::timeout(patience, attempts).await.map_err(|_| {
            ClaimError::from(BlocksUnavailable::Unverified {
                pod_network: pod_network.to_owned(),
                waited: patience,
                last_error: lock(&self.supervision.last_error).clone(),
            })
        })
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
                if let Some(message) = conflict(&network) {
                    return Err(
                        BlocksUnavailable::Conflict { pod_network: name.clone(), message }.into()
                    );
                }
                self.await_first_reconcile(name).await?;
                found.insert(name.clone(), network);
            }
        }
        Ok(found)
    }
}

/// The message of the network's `Conflict` condition when it is `True`.
fn conflict(network: &PodNetwork) -> Option<String> {
    network
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_CONFLICT && c.status == "True")
        .map(|c| c.message.clone())
}

/// Whether two networks share an address.
fn overlaps(a: ipnetwork::IpNetwork, b: ipnetwork::IpNetwork) -> bool {
    a.is_ipv4() == b.is_ipv4() && (a.contains(b.network()) || b.contains(a.network()))
}

/// Whether `object` is a live object other than `block` itself (this node's object of its
/// name) whose CIDR overlaps it.
fn takes_over(object: &IpBlock, block: &OwnedBlock, node: &str) -> bool {
    let Some(cidr) = parse_cidr(object) else { return false };
    let itself = object.metadata.name.as_deref() == Some(block.name.as_str())
        && object.spec.node_name == node;
    overlaps(cidr, block.cidr) && !itself && object.metadata.deletion_timestamp.is_none()
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
