//! The start-up reconcile of the blocks recorded here with this node's blocks in the API:
//! adopting, forgetting and claiming again lost blocks, only of this driver's networks;
//! block records committed alone.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::Ordering;

use super::super::state::lock;
use super::super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{BlockReconcile, Created, NetworkPorts, Provenance, parse_cidr, takes_over};
use crate::ipam::{IpamCommit, OwnedBlock};
use crate::model::pod_network::{IpBlock, IpBlockSpec};

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// The start-up reconcile, once: a later call after one succeeded does nothing.
    pub(super) async fn first_reconcile(&self) -> Result<BlockReconcile, ClaimError> {
        let _gate = self.supervision.reconcile_gate.lock().await;
        if self.supervision.reconciled.load(Ordering::SeqCst) {
            return Ok(BlockReconcile::default());
        }
        self.reconcile_locked().await
    }

    /// Reconciles the blocks recorded here with this node's blocks in the API (once at
    /// start, retried until it succeeds): blocks of this driver's networks the API has for
    /// this node that are not recorded are adopted (created before a crash); recorded blocks
    /// the API no longer has are forgotten when empty, and kept with their leases when not
    /// (logged as an error: the pods keep their addresses, no new address comes from such a
    /// block, and it is claimed again; if another node took it meanwhile, addresses may be in
    /// use twice, which the log says). Blocks the API confirms serve from now on. A block of
    /// a network that is another driver's, or unknown here, is left alone.
    pub async fn reconcile_blocks(&self) -> Result<BlockReconcile, ClaimError> {
        let _gate = self.supervision.reconcile_gate.lock().await;
        self.reconcile_locked().await
    }

    async fn reconcile_locked(&self) -> Result<BlockReconcile, ClaimError> {
        let result = match self.ports() {
            Some(ports) => self.reconcile_once(ports).await,
            None => Ok(BlockReconcile::default()),
        };
        match &result {
            Ok(_) => {
                self.supervision.reconciled.store(true, Ordering::SeqCst);
                *lock(&self.supervision.last_error) = None;
            }
            Err(err) => *lock(&self.supervision.last_error) = Some(err.to_string()),
        }
        result
    }

    async fn reconcile_once(&self, ports: &NetworkPorts) -> Result<BlockReconcile, ClaimError> {
        let node = self.identity.node.clone();
        let before: BTreeSet<String> = {
            let state = lock(&self.state);
            state.ipam.blocks().filter(|s| s.recorded).map(|s| s.block.name.clone()).collect()
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
        let networks: BTreeSet<String> = {
            let state = lock(&self.state);
            listed
                .values()
                .map(|b| b.spec.pod_network.clone())
                .chain(state.ipam.blocks().map(|s| s.block.pod_network.clone()))
                .collect()
        };
        let owners = self.provenances(ports, networks).await;
        let ours = |network: &str| matches!(owners.get(network), Some(Provenance::Ours { .. }));
        let mut commit = IpamCommit::default();
        let mut lost = Vec::new();
        {
            let mut state = lock(&self.state);
            for (name, object) in &listed {
                if !ours(&object.spec.pod_network) {
                    tracing::debug!(block = %name, pod_network = %object.spec.pod_network,
                        "an IPBlock of this node of a network that is not this driver's (or unknown here); left alone");
                    continue;
                }
                let Some(cidr) = parse_cidr(object) else {
                    tracing::warn!(block = %name, cidr = %object.spec.cidr, "an IPBlock of this node with an invalid CIDR; left alone");
                    continue;
                };
                let uid = object.metadata.uid.clone().unwrap_or_default();
                match state.ipam.block(name).map(|s| (s.block.uid == uid, s.releasing)) {
                    // Ours as recorded: it serves from now on (unless it is going).
                    Some((true, _)) => {
                        state.ipam.set_block_verified(name);
                        state.ipam.set_block_lost(name, false);
                        continue;
                    }
                    // Being released: the upkeep's delete (with the recorded UID) decides.
                    Some((false, true)) => continue,
                    Some((false, false)) | None => {}
                }
                // A block this node holds at that CIDR under another name stays as it is.
                if state.ipam.blocks_overlapping(cidr).any(|s| s.block.name != *name) {
                    tracing::warn!(block = %name, %cidr, "an IPBlock of this node overlaps another block it holds; left alone");
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
                let Some(held) = state.ipam.block(name) else { continue };
                let block = held.block.clone();
                let in_use = !held.release_journaled
                    && match &block.claim {
                        Some(claim) => state.claims_in_use().any(|c| c.uid == claim.uid),
                        None => state.ipam.has_leases_in(block.cidr),
                    };
                if in_use {
                    tracing::error!(block = %name, cidr = %block.cidr, pod_network = %block.pod_network,
                        "an IPBlock recorded by this node is gone from the API while addresses in it are in use; \
                         keeping them (their pods run), handing out no new address from it, claiming it again");
                    state.ipam.set_block_lost(name, true);
                    if ours(&block.pod_network) {
                        lost.push(block);
                    }
                } else {
                    // Chosen to be forgotten: it hands out nothing from now on, under this
                    // lock, though its record goes only with the commit below.
                    state.ipam.set_block_releasing(name);
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

    /// Tries to claim a lost block again, unless a live object of the network overlaps it by
    /// CIDR (another node took it, under any name). A claim is a create, so it races on the
    /// name this release derives (the one the admission policy allows); a block an older
    /// release named otherwise is recorded under its new name from then on.
    pub(super) async fn reclaim_lost(&self, ports: &NetworkPorts, block: &OwnedBlock) {
        match ports.blocks.list_network(&block.pod_network).await {
            Ok(all) => {
                if let Some(other) = all.iter().find(|o| takes_over(o, block, &self.identity.node))
                {
                    tracing::error!(block = %block.name, other = ?other.metadata.name, other_node = %other.spec.node_name,
                        "a lost IPBlock of this node is now held by another object: addresses of its live leases may be in use twice");
                    return;
                }
            }
            Err(err) => {
                tracing::warn!(block = %block.name, error = %err, "listing the network to claim a lost IPBlock again failed; retried at the next pass");
                return;
            }
        }
        let object = IpBlock::new(IpBlockSpec {
            pod_network: block.pod_network.clone(),
            cidr: block.cidr.to_string(),
            node_name: self.identity.node.clone(),
            claim: block.claim.clone(),
        });
        let answer = ports.blocks.create(object).await;
        let object = match answer {
            Ok(Created::Created(object)) => object,
            Ok(Created::Exists(existing))
                if existing.spec.node_name == self.identity.node
                    && existing.spec.pod_network == block.pod_network
                    && parse_cidr(&existing) == Some(block.cidr) =>
            {
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
        renewed.name = object.metadata.name.unwrap_or_else(|| block.name.clone());
        let renamed = renewed.name != block.name;
        {
            let mut state = lock(&self.state);
            if renamed {
                state.ipam.remove_block(&block.name);
            }
            state.ipam.add_block(renewed.clone(), false);
        }
        lock(&self.supervision.seen).remove(&block.name);
        let remove_blocks = if renamed { vec![block.name.clone()] } else { Vec::new() };
        let commit =
            IpamCommit { put_blocks: vec![renewed], remove_blocks, ..IpamCommit::default() };
        if let Err(err) = self.commit_blocks(&commit).await {
            tracing::warn!(block = %block.name, error = %err, "recording a reclaimed IPBlock failed; adopted again at the next start");
        } else {
            tracing::info!(block = %block.name, "claimed a lost IPBlock again");
        }
    }

    /// Commits block records alone (without the state lock) and marks them in memory.
    pub(super) async fn commit_blocks(&self, commit: &IpamCommit) -> Result<(), ClaimError> {
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
        let journaled: Vec<String> =
            commit.releasing_blocks.iter().map(|r| r.name.clone()).collect();
        state.ipam.set_release_journaled(&journaled);
        state.ipam.forget_released(&commit.remove_released);
        Ok(())
    }
}
