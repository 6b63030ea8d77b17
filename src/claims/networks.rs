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

pub use super::ports::{IpBlockApi, PodNetworkSource};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::state::lock;
use super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use crate::ipam::blocks::Candidates;
use crate::ipam::{IpamCommit, IpamError, Lease, OwnedBlock};
use crate::model::ClaimRef;
use crate::model::cause::Cause;
use crate::model::network_config::NetworkAddressing;
use crate::model::pod_network::{IpBlock, IpBlockClaim, IpBlockSpec, PodNetwork, ip_block_name};

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
    pub(super) async fn pod_networks(
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

    /// The async lock serialising block claims of one network and family on this node.
    fn block_gate(&self, pod_network: &str, ipv4: bool) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.block_gates).entry((pod_network.to_owned(), ipv4)).or_default())
    }

    /// Claims a new block of family `ipv4` of `plan` for this node (or finds that another
    /// prepare just did): afterwards an owned block has room, or this fails.
    pub(super) async fn claim_block(
        &self,
        plan: &NetworkAddressing,
        ipv4: bool,
        claim_uid: &str,
        request: &str,
    ) -> Result<(), ClaimError> {
        let Some(ports) = self.ports() else {
            return Err(ClaimError::NoNetworkPorts { pod_network: plan.pod_network.clone() });
        };
        let gate = self.block_gate(&plan.pod_network, ipv4);
        let _held = gate.lock().await;
        let owned: HashSet<String> = {
            let state = lock(&self.state);
            if state.ipam.has_room(plan, ipv4, claim_uid) {
                return Ok(());
            }
            state.ipam.blocks().map(|s| s.block.name.clone()).collect()
        };
        let node = &self.identity.node;
        let api_error =
            |source| ClaimError::BlockApi { pod_network: plan.pod_network.clone(), source };
        let mut taken: HashSet<String> = HashSet::new();
        let mut listed = false;
        let mut races = 0;
        for cidr in Candidates::new(plan, ipv4, node).take(MAX_CANDIDATES) {
            let name = ip_block_name(&plan.pod_network, &cidr.to_string());
            if owned.contains(&name) || taken.contains(&name) {
                continue;
            }
            let object = IpBlock::new(IpBlockSpec {
                pod_network: plan.pod_network.clone(),
                cidr: cidr.to_string(),
                node_name: node.clone(),
                claim: None,
            });
            match ports.blocks.create(object).await.map_err(api_error)? {
                Created::Created(block) => {
                    self.take_block(&block, cidr, None);
                    tracing::info!(pod_network = %plan.pod_network, block = %cidr, "claimed an IPBlock");
                    return Ok(());
                }
                Created::Exists(existing) => {
                    if is_ours(&existing, node, &plan.pod_network, cidr, None) {
                        // Created before a crash, not recorded yet: ours.
                        self.take_block(&existing, cidr, None);
                        tracing::info!(pod_network = %plan.pod_network, block = %cidr,
                            "adopted an IPBlock this node created before a restart");
                        return Ok(());
                    }
                    taken.insert(name);
                    races += 1;
                    if races > MAX_RACES {
                        break;
                    }
                    if !listed {
                        listed = true;
                        let all = ports
                            .blocks
                            .list_network(&plan.pod_network)
                            .await
                            .map_err(api_error)?;
                        for block in all {
                            let Some(name) = block.metadata.name.clone() else { continue };
                            let mine = block.spec.node_name == *node
                                && block.spec.claim.is_none()
                                && parse_cidr(&block).is_some_and(|c| c.is_ipv4() == ipv4);
                            if mine
                                && !owned.contains(&name)
                                && let Some(cidr) = parse_cidr(&block)
                            {
                                // Ours from before a crash and still unknown here: adopt it.
                                self.take_block(&block, cidr, None);
                                return Ok(());
                            }
                            taken.insert(name);
                        }
                    }
                }
            }
        }
        let subnets: Vec<String> = plan.subnets_of(ipv4).map(|s| s.to_string()).collect();
        Err(ClaimError::Ipam {
            request: request.to_owned(),
            field: "podNetwork".to_owned(),
            source: IpamError::NoFreeBlock {
                family: if ipv4 { 4 } else { 6 },
                block_prefix: plan.block_prefix(ipv4),
                subnets: subnets.join(", "),
            },
        })
    }

    /// Owns `object` (created or adopted) in memory, not recorded yet.
    fn take_block(
        &self,
        object: &IpBlock,
        cidr: ipnetwork::IpNetwork,
        claim: Option<IpBlockClaim>,
    ) {
        let block = OwnedBlock {
            name: object
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| ip_block_name(&object.spec.pod_network, &cidr.to_string())),
            pod_network: object.spec.pod_network.clone(),
            cidr,
            uid: object.metadata.uid.clone().unwrap_or_default(),
            claim,
        };
        lock(&self.state).ipam.add_block(block, false);
    }

    /// Reserves the claim's static `PodNetwork` addresses cluster-wide: a /32 or /128
    /// `IPBlock` each, named from the address, carrying the claim. The same claim gets an
    /// existing reservation back (a repeated prepare); another claim's is an error naming
    /// `ipam.addresses[i]` and the holder. Returns the reservations created by this call
    /// (which a failed prepare deletes again).
    pub(super) async fn reserve_statics(
        &self,
        claim: &ClaimRef,
        statics: &[StaticReservation],
    ) -> Result<Vec<OwnedBlock>, (ClaimError, Vec<OwnedBlock>)> {
        let mut created: Vec<OwnedBlock> = Vec::new();
        let Some(ports) = self.ports() else {
            return match statics.first() {
                Some(first) => Err((
                    ClaimError::NoNetworkPorts {
                        pod_network: first.lease.pod_network.clone().unwrap_or_default(),
                    },
                    created,
                )),
                None => Ok(created),
            };
        };
        let node = &self.identity.node;
        for reservation in statics {
            let pod_network = reservation.lease.pod_network.clone().unwrap_or_default();
            let cidr = host_network(reservation.lease.address);
            let name = ip_block_name(&pod_network, &cidr.to_string());
            let holder = IpBlockClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                uid: claim.uid.clone(),
            };
            let known = lock(&self.state)
                .ipam
                .block(&name)
                .is_some_and(|s| s.block.claim.as_ref().is_some_and(|c| c.uid == claim.uid));
            if known {
                continue;
            }
            let object = IpBlock::new(IpBlockSpec {
                pod_network: pod_network.clone(),
                cidr: cidr.to_string(),
                node_name: node.clone(),
                claim: Some(holder.clone()),
            });
            let answer = match ports.blocks.create(object).await {
                Ok(answer) => answer,
                Err(source) => return Err((ClaimError::BlockApi { pod_network, source }, created)),
            };
            let object = match answer {
                Created::Created(object) => object,
                Created::Exists(existing)
                    if existing.spec.claim.as_ref().is_some_and(|c| c.uid == claim.uid) =>
                {
                    existing
                }
                Created::Exists(existing) => {
                    let (holder, holder_node) = (
                        existing.spec.claim.as_ref().map_or_else(
                            || format!("no claim (a block of node {})", existing.spec.node_name),
                            |c| format!("claim {}/{} (uid {})", c.namespace, c.name, c.uid),
                        ),
                        existing.spec.node_name.clone(),
                    );
                    return Err((
                        ClaimError::AddressReserved {
                            request: reservation.request.clone(),
                            field: reservation.field.clone(),
                            held: Box::new(HeldReservation {
                                address: reservation.lease.address,
                                pod_network,
                                holder,
                                node: holder_node,
                            }),
                        },
                        created,
                    ));
                }
            };
            let block = OwnedBlock {
                name: name.clone(),
                pod_network,
                cidr,
                uid: object.metadata.uid.clone().unwrap_or_default(),
                claim: Some(holder),
            };
            lock(&self.state).ipam.add_block(block.clone(), false);
            created.push(block);
        }
        Ok(created)
    }

    /// Deletes reservations a failed prepare created (best effort: the next start deletes a
    /// reservation whose claim is not prepared).
    pub(super) async fn drop_reservations(&self, blocks: &[OwnedBlock]) {
        let Some(ports) = self.ports() else { return };
        for block in blocks {
            lock(&self.state).ipam.remove_block(&block.name);
            if let Err(err) = ports.blocks.delete(&block.name, &block.uid).await {
                tracing::warn!(block = %block.name, error = %err,
                    "deleting the reservation of a failed prepare; the next start retries");
            }
        }
    }

    /// Deletes in the API the static reservations of claims no longer prepared (right after
    /// an unprepare; the block upkeep retries what fails) and forgets them durably.
    pub(super) async fn drop_orphan_reservations(&self) {
        let Some(ports) = self.ports() else { return };
        let doomed = {
            let mut state = lock(&self.state);
            let live: HashSet<String> = state.claims_in_use().map(|c| c.uid.clone()).collect();
            state.ipam.orphan_reservations(|uid| live.contains(uid))
        };
        if doomed.is_empty() {
            return;
        }
        let mut gone = Vec::new();
        for block in doomed {
            match ports.blocks.delete(&block.name, &block.uid).await {
                Ok(_) => gone.push(block.name),
                Err(err) => {
                    tracing::warn!(block = %block.name, error = %err,
                        "deleting a released static reservation failed; the block upkeep retries");
                    lock(&self.state).ipam.end_release(&block.name, false);
                }
            }
        }
        let commit = IpamCommit { remove_blocks: gone, ..IpamCommit::default() };
        if let Err(err) = self.commit_blocks(&commit).await {
            tracing::warn!(error = %err, "forgetting deleted static reservations failed");
        }
    }

    /// Reconciles the blocks recorded here with this node's blocks in the API (once at
    /// start, retried until it succeeds): blocks the API has for this node that are not
    /// recorded are adopted (created before a crash); recorded blocks the API no longer has
    /// are forgotten when empty, and kept with their leases when not (logged as an error:
    /// the pods keep their addresses, no new address comes from such a block, and it is
    /// claimed again; if another node took it meanwhile, addresses may be in use twice, which
    /// the log says).
    pub async fn reconcile_blocks(&self) -> Result<BlockReconcile, ClaimError> {
        let Some(ports) = self.ports() else { return Ok(BlockReconcile::default()) };
        let node = self.identity.node.clone();
        let before: BTreeSet<String> = {
            let state = lock(&self.state);
            state
                .ipam
                .blocks()
                .filter(|s| s.recorded && !s.releasing)
                .map(|s| s.block.name.clone())
                .collect()
        };
        let listed = ports
            .blocks
            .list_node(&node)
            .await
            .map_err(|source| ClaimError::BlockApi { pod_network: String::new(), source })?;
        let listed: HashMap<String, IpBlock> = listed
            .into_iter()
            .filter(|b| b.spec.node_name == node)
            .filter_map(|b| b.metadata.name.clone().map(|n| (n, b)))
            .collect();
        let mut commit = IpamCommit::default();
        let mut lost = Vec::new();
        {
            let mut state = lock(&self.state);
            for (name, object) in &listed {
                let Some(cidr) = parse_cidr(object) else {
                    tracing::warn!(block = %name, cidr = %object.spec.cidr, "an IPBlock of this node with an invalid CIDR; left alone");
                    continue;
                };
                let uid = object.metadata.uid.clone().unwrap_or_default();
                if state.ipam.block(name).is_some_and(|s| s.block.uid == uid) {
                    state.ipam.set_block_lost(name, false);
                    continue;
                }
                let block = OwnedBlock {
                    name: name.clone(),
                    pod_network: object.spec.pod_network.clone(),
                    cidr,
                    uid,
                    claim: object.spec.claim.clone(),
                };
                tracing::info!(block = %name, "adopted an IPBlock of this node that was not recorded (created before a restart)");
                state.ipam.add_block(block.clone(), false);
                commit.put_blocks.push(block);
            }
            for name in before.iter().filter(|n| !listed.contains_key(*n)) {
                let Some(block) = state.ipam.block(name).map(|s| s.block.clone()) else { continue };
                let in_use = match &block.claim {
                    Some(claim) => state.claims_in_use().any(|c| c.uid == claim.uid),
                    None => state.ipam.has_leases_in(block.cidr),
                };
                if in_use {
                    tracing::error!(block = %name, cidr = %block.cidr, pod_network = %block.pod_network,
                        "an IPBlock recorded by this node is gone from the API while addresses in it are in use; \
                         keeping them (their pods run), handing out no new address from it, claiming it again");
                    state.ipam.set_block_lost(name, true);
                    lost.push(block);
                } else {
                    commit.remove_blocks.push(name.clone());
                }
            }
        }
        self.commit_blocks(&commit).await?;
        let summary = BlockReconcile {
            adopted: commit.put_blocks.len(),
            forgotten: commit.remove_blocks.len(),
            lost: lost.len(),
        };
        for block in lost {
            self.reclaim_lost(ports, &block).await;
        }
        Ok(summary)
    }

    /// Tries to claim a lost block again under its name.
    async fn reclaim_lost(&self, ports: &NetworkPorts, block: &OwnedBlock) {
        let object = IpBlock::new(IpBlockSpec {
            pod_network: block.pod_network.clone(),
            cidr: block.cidr.to_string(),
            node_name: self.identity.node.clone(),
            claim: block.claim.clone(),
        });
        let answer = ports.blocks.create(object).await;
        let object = match answer {
            Ok(Created::Created(object)) => object,
            Ok(Created::Exists(existing)) if existing.spec.node_name == self.identity.node => {
                existing
            }
            Ok(Created::Exists(existing)) => {
                tracing::error!(block = %block.name, other_node = %existing.spec.node_name,
                    "a lost IPBlock of this node is now owned by another node: addresses of its live leases may be in use twice");
                return;
            }
            Err(err) => {
                tracing::warn!(block = %block.name, error = %err, "claiming a lost IPBlock again failed; retried at the next pass");
                return;
            }
        };
        let mut renewed = block.clone();
        renewed.uid = object.metadata.uid.unwrap_or_default();
        lock(&self.state).ipam.add_block(renewed.clone(), false);
        let commit = IpamCommit { put_blocks: vec![renewed], ..IpamCommit::default() };
        if let Err(err) = self.commit_blocks(&commit).await {
            tracing::warn!(block = %block.name, error = %err, "recording a reclaimed IPBlock failed; adopted again at the next start");
        } else {
            tracing::info!(block = %block.name, "claimed a lost IPBlock again");
        }
    }

    /// Commits block records alone (without the state lock) and marks them in memory.
    async fn commit_blocks(&self, commit: &IpamCommit) -> Result<(), ClaimError> {
        if commit.is_empty() {
            return Ok(());
        }
        let store = lock(&self.state).ipam.store().clone();
        let owned = commit.clone();
        tokio::task::spawn_blocking(move || store.commit_ipam(&owned))
            .await
            .map_err(ClaimError::Task)?
            .map_err(|e| ClaimError::Persist(Box::new(e)))?;
        let mut state = lock(&self.state);
        state.ipam.mark_recorded(&commit.put_blocks);
        for name in &commit.remove_blocks {
            state.ipam.remove_block(name);
        }
        state.ipam.forget_released(&commit.remove_released);
        Ok(())
    }

    /// One pass of block upkeep: deletes in the API the blocks empty past the grace (at
    /// once for a network being deleted or gone), the reservations of claims no longer
    /// prepared, forgets them durably, and prunes release records past their quarantine.
    pub async fn release_idle_blocks(&self) -> BlockUpkeep {
        let mut upkeep = BlockUpkeep::default();
        let Some(ports) = self.ports() else { return upkeep };
        let networks: BTreeSet<String> =
            lock(&self.state).ipam.blocks().map(|s| s.block.pod_network.clone()).collect();
        let mut deleting = BTreeSet::new();
        for name in networks {
            match ports.networks.get(&name).await {
                Ok(Some(network)) if network.metadata.deletion_timestamp.is_none() => {}
                Ok(_) => {
                    deleting.insert(name);
                }
                // Unknown: treat as alive (the grace applies).
                Err(_) => {}
            }
        }
        let grace = u64::try_from(ports.release_grace.as_millis()).unwrap_or(u64::MAX);
        let doomed = {
            let mut state = lock(&self.state);
            let live: HashSet<String> = state.claims_in_use().map(|c| c.uid.clone()).collect();
            let mut doomed = state.ipam.idle_blocks(grace, |n| deleting.contains(n));
            doomed.extend(state.ipam.orphan_reservations(|uid| live.contains(uid)));
            doomed
        };
        let mut gone = Vec::new();
        for block in doomed {
            match ports.blocks.delete(&block.name, &block.uid).await {
                Ok(outcome) => {
                    if outcome == Deleted::NotOurs {
                        tracing::warn!(block = %block.name, "an IPBlock of this name with another UID exists; forgetting ours");
                    }
                    gone.push(block.name);
                }
                Err(err) => {
                    tracing::warn!(block = %block.name, error = %err, "releasing an IPBlock failed; retried at the next pass");
                    lock(&self.state).ipam.end_release(&block.name, false);
                }
            }
        }
        let expired = lock(&self.state).ipam.expired_releases();
        let commit = IpamCommit {
            remove_blocks: gone.clone(),
            remove_released: expired.clone(),
            ..IpamCommit::default()
        };
        match self.commit_blocks(&commit).await {
            Ok(()) => {
                upkeep.pruned = expired.len();
                for name in &gone {
                    tracing::info!(block = %name, "released an IPBlock");
                }
                upkeep.released = gone;
            }
            Err(err) => {
                // Deleted in the API but still recorded: they stay releasing (never serve
                // again); the next start forgets them (gone from the API, no leases).
                tracing::warn!(error = %err, "recording released IPBlocks failed");
            }
        }
        upkeep
    }

    /// Runs block upkeep until `stop` turns true: the start-up reconcile (retried every
    /// 10 s until it succeeds), then a release pass every `period` and whenever the networks
    /// change.
    pub async fn maintain_blocks(
        &self,
        period: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let Some(ports) = self.ports().cloned() else { return };
        loop {
            match self.reconcile_blocks().await {
                Ok(summary) => {
                    tracing::info!(
                        adopted = summary.adopted,
                        forgotten = summary.forgotten,
                        lost = summary.lost,
                        "IPBlocks reconciled with the API"
                    );
                    break;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "reconciling IPBlocks with the API failed; retrying in 10 s");
                }
            }
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
        loop {
            self.release_idle_blocks().await;
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(period) => {}
                () = ports.networks.changed() => {}
            }
        }
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
