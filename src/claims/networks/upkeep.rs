//! Block upkeep: releasing empty blocks and orphan reservations in the API (the intent
//! journaled before each delete), claiming lost blocks again, pruning release records, and
//! the loop that runs it after the start-up reconcile.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use super::super::state::lock;
use super::super::{ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{BlockUpkeep, Deleted, NetworkPorts, Provenance};
use crate::ipam::{BlockRelease, IpamCommit, OwnedBlock};

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// The provenance of each network of `blocks`.
    pub(super) async fn provenances(
        &self,
        ports: &NetworkPorts,
        networks: BTreeSet<String>,
    ) -> BTreeMap<String, Provenance> {
        let mut found = BTreeMap::new();
        for name in networks {
            let provenance = self.provenance(ports, &name).await;
            found.insert(name, provenance);
        }
        found
    }

    /// Deletes `doomed` (marked releasing by the caller, under the lock that chose them) in
    /// the API: only blocks of this driver's networks (others are left alone and serve
    /// again), each intent journaled before any delete, so a crash after a delete never
    /// leaves a record that serves a block the API no longer has. Returns the names gone
    /// from the API; a failed delete stays releasing and is retried by the next pass.
    pub(super) async fn release_blocks(
        &self,
        ports: &NetworkPorts,
        doomed: Vec<OwnedBlock>,
    ) -> Vec<String> {
        let names: BTreeSet<String> = doomed.iter().map(|b| b.pod_network.clone()).collect();
        let owners = self.provenances(ports, names).await;
        let (ours, not_ours): (Vec<OwnedBlock>, Vec<OwnedBlock>) = doomed
            .into_iter()
            .partition(|b| matches!(owners.get(&b.pod_network), Some(Provenance::Ours { .. })));
        if !not_ours.is_empty() {
            let mut state = lock(&self.state);
            for block in &not_ours {
                tracing::warn!(block = %block.name, pod_network = %block.pod_network,
                    "not releasing an IPBlock of a network that is not this driver's (or unknown here); left alone");
                state.ipam.end_release(&block.name, false);
            }
        }
        let unjournaled: Vec<BlockRelease> = {
            let state = lock(&self.state);
            ours.iter()
                .filter(|b| state.ipam.block(&b.name).is_some_and(|s| !s.release_journaled))
                .map(|b| BlockRelease { name: b.name.clone(), uid: b.uid.clone() })
                .collect()
        };
        let commit = IpamCommit { releasing_blocks: unjournaled.clone(), ..IpamCommit::default() };
        if let Err(err) = self.commit_blocks(&commit).await {
            tracing::warn!(error = %err, "journaling the release of IPBlocks failed; retried at the next pass");
            let mut state = lock(&self.state);
            for release in &unjournaled {
                state.ipam.end_release(&release.name, false);
            }
            return Vec::new();
        }
        let mut gone = Vec::new();
        for block in ours {
            match ports.blocks.delete(&block.name, &block.uid).await {
                Ok(outcome) => {
                    if outcome == Deleted::NotOurs {
                        tracing::warn!(block = %block.name, "an IPBlock of this name with another UID exists; forgetting ours");
                    }
                    gone.push(block.name);
                }
                Err(err) => {
                    tracing::warn!(block = %block.name, error = %err, "releasing an IPBlock failed; retried at the next pass");
                }
            }
        }
        gone
    }

    /// One pass of block upkeep: deletes in the API the blocks of this driver's networks
    /// empty past the grace (at once for a network being deleted), the reservations of claims
    /// no longer prepared and the releases journaled before (a failed delete, a crash),
    /// forgets them durably, settles block creates whose answer was lost, claims lost blocks again, and prunes release records past their
    /// quarantine.
    pub async fn release_idle_blocks(&self) -> BlockUpkeep {
        let mut upkeep = BlockUpkeep::default();
        let Some(ports) = self.ports() else { return upkeep };
        // Creates whose answer was lost: adopted here (empty, released after the grace like
        // any block) or forgotten, so none leaks while the daemon runs.
        self.settle_uncertain_creates(ports).await;
        let networks: BTreeSet<String> =
            lock(&self.state).ipam.blocks().map(|s| s.block.pod_network.clone()).collect();
        let owners = self.provenances(ports, networks).await;
        let deleting = |n: &str| matches!(owners.get(n), Some(Provenance::Ours { deleting: true }));
        let grace = u64::try_from(ports.release_grace.as_millis()).unwrap_or(u64::MAX);
        let (doomed, lost) = {
            let mut state = lock(&self.state);
            let live: HashSet<String> = state.claims_in_use().map(|c| c.uid.clone()).collect();
            // Releases journaled before (idle and orphan selection skip blocks already
            // releasing, so none comes twice).
            let mut doomed = state.ipam.pending_releases();
            doomed.extend(state.ipam.idle_blocks(grace, deleting));
            doomed.extend(state.ipam.orphan_reservations(|uid| live.contains(uid)));
            let lost: Vec<OwnedBlock> = state
                .ipam
                .blocks()
                .filter(|s| s.lost && !s.releasing)
                .filter(|s| {
                    matches!(owners.get(&s.block.pod_network), Some(Provenance::Ours { .. }))
                })
                .map(|s| s.block.clone())
                .collect();
            (doomed, lost)
        };
        let gone = self.release_blocks(ports, doomed).await;
        for block in lost {
            self.reclaim_lost(ports, &block).await;
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
                // Deleted in the API but still recorded with their intent: they stay
                // releasing (never serve again); the next pass or start deletes them again
                // (gone) and forgets them.
                tracing::warn!(error = %err, "recording released IPBlocks failed");
            }
        }
        upkeep
    }

    /// Runs block upkeep until `stop` turns true: the start-up reconcile (retried every
    /// 10 s until it succeeds, unless a prepare ran it first), then a release pass every
    /// `period` and whenever the networks change.
    pub async fn maintain_blocks(
        &self,
        period: Duration,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let Some(ports) = self.ports().cloned() else { return };
        loop {
            match self.first_reconcile().await {
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
                biased;
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(Duration::from_secs(10)) => {}
            }
        }
        loop {
            self.release_idle_blocks().await;
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                () = ports.networks.changed() => {}
                () = tokio::time::sleep(period) => {}
            }
        }
    }
}
