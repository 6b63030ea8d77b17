//! Block creates whose outcome is unknown: a create that failed after the API server may
//! have acted (a timeout, a 5xx) is remembered by name until a list of its network says
//! whether the block exists; this node's block is then adopted as an owned empty block (the
//! idle release deletes it after the grace), an absent one is forgotten. Without this such
//! a block, this node's by `spec.nodeName` but unknown to it, leaked until a restart's
//! reconcile (finding F1 of the IPAM simulation, decision 0017).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use super::super::state::lock;
use super::super::{ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{NetworkPorts, Provenance, parse_cidr};
use crate::ipam::{IpamCommit, OwnedBlock};
use crate::model::pod_network::IpBlock;

/// One create whose answer was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct UncertainCreate {
    /// The network of the block.
    pod_network: String,
    /// The block's CIDR.
    cidr: ipnetwork::IpNetwork,
    /// Which failed create this is: a list that started before a later create of the same
    /// name failed must not settle that later one.
    attempt: u64,
}

/// The creates of this node whose outcome is unknown, by block name (in memory only: a
/// restart's reconcile lists every block of this node and adopts them anyway).
#[derive(Debug, Default)]
pub(super) struct UncertainCreates {
    /// Block name to the create; ordered so that passes act in a deterministic order.
    names: Mutex<BTreeMap<String, UncertainCreate>>,
}

impl UncertainCreates {
    /// Remembers that the create of `name` failed without proving that nothing was created.
    pub(super) fn remember(&self, name: &str, pod_network: &str, cidr: ipnetwork::IpNetwork) {
        let mut names = lock(&self.names);
        let attempt = names.get(name).map_or(0, |c| c.attempt.wrapping_add(1));
        names.insert(
            name.to_owned(),
            UncertainCreate { pod_network: pod_network.to_owned(), cidr, attempt },
        );
    }

    /// The uncertain creates of `pod_network` now (taken before listing it).
    pub(super) fn of_network(&self, pod_network: &str) -> BTreeMap<String, UncertainCreate> {
        lock(&self.names)
            .iter()
            .filter(|(_, c)| c.pod_network == pod_network)
            .map(|(n, c)| (n.clone(), c.clone()))
            .collect()
    }

    /// The networks with uncertain creates.
    fn networks(&self) -> BTreeSet<String> {
        lock(&self.names).values().map(|c| c.pod_network.clone()).collect()
    }

    /// Forgets `name` if it is still the create `settled` (not one that failed since).
    fn settle(&self, name: &str, settled: &UncertainCreate) {
        let mut names = lock(&self.names);
        if names.get(name) == Some(settled) {
            names.remove(name);
        }
    }
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Settles every uncertain create (one list per network that has some); a network
    /// whose list fails keeps its names for the next pass. Returns the blocks adopted.
    pub(super) async fn settle_uncertain_creates(&self, ports: &NetworkPorts) -> usize {
        let mut adopted = 0;
        for network in self.supervision.uncertain.networks() {
            let pending = self.supervision.uncertain.of_network(&network);
            match ports.blocks.list_network(&network).await {
                Ok(listed) => adopted += self.settle_with(ports, pending, &listed).await,
                Err(err) => {
                    tracing::warn!(pod_network = %network, error = %err, uncertain = pending.len(),
                        "listing a network to learn whether IPBlock creates whose answer was lost took effect failed; retried at the next pass");
                }
            }
        }
        adopted
    }

    /// Settles `pending` (taken before `listed` was read) against the network's `listed`
    /// blocks: this node's block of the create's network and CIDR, of this driver's network
    /// and not being deleted, is adopted and recorded; anything else settles it (absent:
    /// nothing was created; another object of that name: not ours). Returns the blocks
    /// adopted.
    pub(super) async fn settle_with(
        &self,
        ports: &NetworkPorts,
        pending: BTreeMap<String, UncertainCreate>,
        listed: &[IpBlock],
    ) -> usize {
        if pending.is_empty() {
            return 0;
        }
        let networks: BTreeSet<String> = pending.values().map(|c| c.pod_network.clone()).collect();
        let owners = self.provenances(ports, networks).await;
        let node = &self.identity.node;
        let mut commit = IpamCommit::default();
        {
            let mut state = lock(&self.state);
            for (name, create) in &pending {
                self.supervision.uncertain.settle(name, create);
                let found = listed.iter().find(|o| o.metadata.name.as_deref() == Some(name));
                let Some(object) = found else {
                    tracing::debug!(block = %name, "an IPBlock create whose answer was lost did not take effect");
                    continue;
                };
                let ours = object.spec.node_name == *node
                    && object.spec.pod_network == create.pod_network
                    && parse_cidr(object) == Some(create.cidr)
                    && object.spec.claim.is_none()
                    && object.metadata.deletion_timestamp.is_none()
                    && matches!(owners.get(&create.pod_network), Some(Provenance::Ours { .. }));
                if !ours {
                    tracing::debug!(block = %name, node = %object.spec.node_name,
                        "an IPBlock create whose answer was lost: the object of that name is not this node's block; left alone");
                    continue;
                }
                // Adopted meanwhile by a block claim that listed the network.
                if state.ipam.block(name).is_some() {
                    continue;
                }
                if state.ipam.blocks_overlapping(create.cidr).any(|s| s.block.name != *name) {
                    tracing::warn!(block = %name, cidr = %create.cidr,
                        "an IPBlock created by a create whose answer was lost overlaps another block this node holds; left alone");
                    continue;
                }
                let block = OwnedBlock {
                    name: name.clone(),
                    pod_network: create.pod_network.clone(),
                    cidr: create.cidr,
                    uid: object.metadata.uid.clone().unwrap_or_default(),
                    claim: None,
                };
                tracing::info!(block = %name, pod_network = %create.pod_network,
                    "adopted an IPBlock whose create took effect though its answer was lost");
                state.ipam.add_block(block.clone(), false);
                commit.put_blocks.push(block);
            }
        }
        let adopted = commit.put_blocks.len();
        if let Err(err) = self.commit_blocks(&commit).await {
            // Owned in memory all the same (released after the grace like a block whose
            // first lease's commit failed); a restart's reconcile adopts it again.
            tracing::warn!(error = %err, "recording adopted IPBlocks failed");
        }
        adopted
    }
}
