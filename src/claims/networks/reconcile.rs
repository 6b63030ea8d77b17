//! The start-up reconcile of the blocks recorded here with this node's blocks in the API:
//! adopting, forgetting and claiming again lost blocks; block records committed alone.

use std::collections::{BTreeSet, HashMap};

use super::super::state::lock;
use super::super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{BlockReconcile, Created, NetworkPorts, parse_cidr};
use crate::ipam::{IpamCommit, OwnedBlock};
use crate::model::pod_network::{IpBlock, IpBlockSpec};

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
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
    pub(super) async fn reclaim_lost(&self, ports: &NetworkPorts, block: &OwnedBlock) {
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
        state.ipam.forget_released(&commit.remove_released);
        Ok(())
    }
}
