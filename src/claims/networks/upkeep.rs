//! Block upkeep: releasing empty blocks and orphan reservations in the API, pruning release
//! records, and the loop that runs it after the start-up reconcile.

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use super::super::state::lock;
use super::super::{ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{BlockUpkeep, Deleted};
use crate::ipam::IpamCommit;

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
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
