//! The watch of this node's own `IPBlock`s (field selector `spec.nodeName`, as the start-up
//! list): a block deleted or changed under the node stops serving at once.
//!
//! Anyone allowed to delete IPBlocks (an administrator, a controller collecting a node it
//! believes gone, before decision 0017 any node) can take a block from under a node that keeps
//! allocating from it, and another node may then claim the same CIDR. The node marks such a
//! block lost under the state lock as soon as the event arrives: nothing more is handed out
//! from it, its leases stay with their pods (taking addresses from running pods would break
//! them) but count as conflicts, and the loss is logged, counted and reported as an Event
//! (by the caller of [`ClaimService::watch_blocks`], through a [`BlockLossSink`]); the upkeep claims the block again when no live object overlaps it.
//! An empty lost block is forgotten.
//!
//! What is a loss: a `Deleted` event of the UID this node holds; an `Applied` object with that
//! UID whose spec differs (cidr, nodeName, podNetwork: the spec is immutable, so only a
//! changed CRD gets there); a relist lacking a block the watch showed before with that UID (a
//! delete missed while the watch was down). A block the watch never showed is not judged by
//! a relist, which may predate its create. An object of another UID under a held name is an
//! older or newer incarnation (events of a released block arriving late), not a loss.

use std::collections::HashMap;
use std::fmt;

use futures::StreamExt;
use futures::stream::BoxStream;
use ipnetwork::IpNetwork;

use super::super::state::lock;
use super::super::{ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{BlockApiError, BlockEvent, BlockLossSink, parse_cidr};
use crate::ipam::IpamCommit;
use crate::model::pod_network::IpBlock;

/// Why a block was found lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LossCause {
    /// Deleted in the API.
    Deleted,
    /// Its spec differs from what the node holds (named).
    Changed(String),
    /// A relist of the watch no longer has it.
    MissingFromList,
}

/// One block of this node found lost (decision 0017).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLoss {
    /// The node.
    pub node: String,
    /// The `IPBlock`'s name.
    pub name: String,
    /// Its UID as the node held it.
    pub uid: String,
    /// Its network.
    pub pod_network: String,
    /// Its CIDR.
    pub cidr: IpNetwork,
    /// Why.
    pub cause: LossCause,
    /// Addresses of it still leased to pods here (conflicts: another node may hand them out).
    pub leases: usize,
}

impl fmt::Display for BlockLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cause = match &self.cause {
            LossCause::Deleted => "was deleted".to_owned(),
            LossCause::Changed(what) => format!("changed ({what})"),
            LossCause::MissingFromList => "is gone (missing from a relist)".to_owned(),
        };
        write!(
            f,
            "IPBlock {} ({}) of podNetwork {} owned by node {} {cause}; the node hands out no \
             address from it until it owns a block for them again; {} address(es) of it stay with \
             their pods and may now be in use twice",
            self.name, self.cidr, self.pod_network, self.node, self.leases
        )
    }
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Applies one event of the watch of this node's blocks: a lost block stops serving at
    /// once (under the state lock), is logged and reported, and is forgotten durably when
    /// nothing of it is in use. Returns the losses.
    pub async fn observe_block(&self, event: BlockEvent) -> Vec<BlockLoss> {
        let losses = self.mark_losses(&event);
        for loss in &losses {
            tracing::error!(block = %loss.name, cidr = %loss.cidr, pod_network = %loss.pod_network,
                leases = loss.leases, "{loss}");
        }
        if !losses.is_empty() {
            self.forget_unused_lost().await;
        }
        losses
    }

    /// Whether the watch of this node's blocks has listed them at least once (from then on a
    /// block deleted under the node is seen as lost).
    #[must_use]
    pub fn block_watch_synced(&self) -> bool {
        self.supervision.watch_synced.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Marks the blocks `event` shows lost, under the state lock.
    fn mark_losses(&self, event: &BlockEvent) -> Vec<BlockLoss> {
        let node = &self.identity.node;
        let mut state = lock(&self.state);
        let mut seen = lock(&self.supervision.seen);
        let mut found: Vec<(String, LossCause)> = Vec::new();
        let applied = |object: &IpBlock,
                       state: &super::super::state::State<S>,
                       seen: &mut HashMap<String, String>,
                       found: &mut Vec<(String, LossCause)>| {
            let Some(name) = object.metadata.name.as_deref() else { return };
            let Some(held) = state.ipam.block(name) else { return };
            let uid = object.metadata.uid.as_deref().unwrap_or_default();
            if held.releasing || held.lost || held.block.uid != uid {
                return;
            }
            let mut changed = Vec::new();
            if parse_cidr(object) != Some(held.block.cidr) {
                changed.push(format!("cidr {} is now {}", held.block.cidr, object.spec.cidr));
            }
            if object.spec.node_name != *node {
                changed.push(format!("nodeName is now {}", object.spec.node_name));
            }
            if object.spec.pod_network != held.block.pod_network {
                changed.push(format!("podNetwork is now {}", object.spec.pod_network));
            }
            if changed.is_empty() {
                seen.insert(name.to_owned(), uid.to_owned());
            } else {
                seen.remove(name);
                found.push((name.to_owned(), LossCause::Changed(changed.join(", "))));
            }
        };
        match event {
            BlockEvent::Applied(object) => applied(object, &state, &mut seen, &mut found),
            BlockEvent::Deleted(object) => {
                if let Some(name) = object.metadata.name.as_deref()
                    && let Some(held) = state.ipam.block(name)
                    && Some(held.block.uid.as_str()) == object.metadata.uid.as_deref()
                {
                    seen.remove(name);
                    if !held.releasing && !held.lost {
                        found.push((name.to_owned(), LossCause::Deleted));
                    }
                }
            }
            BlockEvent::Relisted(objects) => {
                self.supervision.watch_synced.store(true, std::sync::atomic::Ordering::SeqCst);
                let present: HashMap<&str, &str> = objects
                    .iter()
                    .filter_map(|o| Some((o.metadata.name.as_deref()?, o.metadata.uid.as_deref()?)))
                    .collect();
                for held in state.ipam.blocks() {
                    let name = held.block.name.as_str();
                    let watched = seen.get(name).is_some_and(|uid| *uid == held.block.uid);
                    if watched
                        && !held.releasing
                        && !held.lost
                        && present.get(name) != Some(&held.block.uid.as_str())
                    {
                        found.push((name.to_owned(), LossCause::MissingFromList));
                    }
                }
                for (name, _) in &found {
                    seen.remove(name);
                }
                for object in objects {
                    applied(object, &state, &mut seen, &mut found);
                }
            }
        }
        found
            .into_iter()
            .filter_map(|(name, cause)| {
                let held = state.ipam.block(&name)?.block.clone();
                state.ipam.set_block_lost(&name, true);
                let leases = state.ipam.leases().filter(|l| held.cidr.contains(l.address)).count();
                Some(BlockLoss {
                    node: node.clone(),
                    name,
                    uid: held.uid,
                    pod_network: held.pod_network,
                    cidr: held.cidr,
                    cause,
                    leases,
                })
            })
            .collect()
    }

    /// Forgets durably the lost blocks nothing uses (no lease in a block, a reservation whose
    /// claim is not prepared): this node does not own them any more.
    async fn forget_unused_lost(&self) {
        let unused: Vec<String> = {
            let mut state = lock(&self.state);
            let names: Vec<String> = state
                .ipam
                .blocks()
                .filter(|s| s.lost && !s.releasing)
                .filter(|s| match &s.block.claim {
                    Some(claim) => !state.claims_in_use().any(|c| c.uid == claim.uid),
                    None => !state.ipam.has_leases_in(s.block.cidr),
                })
                .map(|s| s.block.name.clone())
                .collect();
            for name in &names {
                state.ipam.set_block_releasing(name);
            }
            names
        };
        if unused.is_empty() {
            return;
        }
        let commit = IpamCommit { remove_blocks: unused, ..IpamCommit::default() };
        if let Err(err) = self.commit_blocks(&commit).await {
            tracing::warn!(error = %err, "forgetting lost IPBlocks failed; the next start forgets them");
        }
    }

    /// Follows `events` (this node's blocks: [`super::IpBlockApi::watch_node`]) until `stop`
    /// turns true, applying each event ([`Self::observe_block`]) and reporting each loss to
    /// `sink`.
    pub async fn watch_blocks(
        &self,
        mut events: BoxStream<'_, Result<BlockEvent, BlockApiError>>,
        sink: &dyn BlockLossSink,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        loop {
            let next = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => return,
                next = events.next() => next,
            };
            match next {
                Some(Ok(event)) => {
                    for loss in self.observe_block(event).await {
                        sink.block_lost(&loss);
                    }
                }
                Some(Err(err)) => {
                    tracing::warn!(error = %err, "the watch of this node's IPBlocks failed; it resumes with a relist");
                }
                None => return,
            }
        }
    }
}
