//! Claiming a block of a `PodNetwork` for this node: the network's blocks listed, then one
//! create per candidate not taken by CIDR (listed again when other nodes win too many of them
//! meanwhile), adopting this node's own block after a crash.

use std::sync::Arc;

use super::super::state::lock;
use super::super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{Created, MAX_CANDIDATES, MAX_LISTS, MAX_RACES, NetworkPorts, is_ours, parse_cidr};
use crate::ipam::blocks::Candidates;
use crate::ipam::{IpamError, OwnedBlock, TakenRanges};
use crate::model::network_config::NetworkAddressing;
use crate::model::pod_network::{IpBlock, IpBlockClaim, IpBlockSpec, ip_block_name};

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// The async lock serialising block claims of one network and family on this node.
    fn block_gate(&self, pod_network: &str, ipv4: bool) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.block_gates).entry((pod_network.to_owned(), ipv4)).or_default())
    }

    /// Claims a new block of family `ipv4` of `plan` for this node (or finds that another
    /// prepare just did): afterwards an owned block has room, or this fails.
    ///
    /// The network's blocks are listed first and every candidate overlapping a live object
    /// of any name (another node's block, an older release's name for the same CIDR, a
    /// reservation inside it) or a block this node holds in any state is skipped: the name
    /// collision of the create alone cannot see an object of another name.
    pub(in crate::claims) async fn claim_block(
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
        if lock(&self.state).ipam.has_room(plan, ipv4, claim_uid) {
            return Ok(());
        }
        // Blocks other nodes created after the list, found one create and one get each: past
        // MAX_RACES a new list learns the rest at once (16 nodes starting together race for
        // the same candidates), at most MAX_LISTS times.
        let mut lost = 0;
        for _listing in 0..MAX_LISTS {
            let Some(taken) = self.list_taken(ports, plan, ipv4, claim_uid).await? else {
                return Ok(());
            };
            match self.walk_candidates(ports, plan, ipv4, taken).await? {
                Walk::Claimed => return Ok(()),
                Walk::Full { lost: races } => {
                    lost += races;
                    break;
                }
                Walk::Contended { lost: races } => lost += races,
            }
        }
        let mut subnets =
            plan.subnets_of(ipv4).map(|s| s.to_string()).collect::<Vec<_>>().join(", ");
        if lost > 0 {
            let raced =
                format!(" ({lost} candidate blocks taken by other nodes during this claim)");
            subnets.push_str(&raced);
        }
        Err(ClaimError::Ipam {
            request: request.to_owned(),
            field: "podNetwork".to_owned(),
            source: IpamError::NoFreeBlock {
                family: if ipv4 { 4 } else { 6 },
                block_prefix: plan.block_prefix(ipv4),
                subnets,
            },
        })
    }

    /// Lists the network's blocks and returns the ranges a new block must not overlap, or
    /// `None` when the list settled an uncertain create that gives room, or showed a block of
    /// this node from before a crash, now adopted.
    async fn list_taken(
        &self,
        ports: &NetworkPorts,
        plan: &NetworkAddressing,
        ipv4: bool,
        claim_uid: &str,
    ) -> Result<Option<TakenRanges>, ClaimError> {
        let node = &self.identity.node;
        let api_error =
            |source| ClaimError::BlockApi { pod_network: plan.pod_network.clone(), source };
        // Taken before the list: a create failing after the list started is not settled by it.
        let pending = self.supervision.uncertain.of_network(&plan.pod_network);
        let listed = ports.blocks.list_network(&plan.pod_network).await.map_err(api_error)?;
        if self.settle_with(ports, pending, &listed).await > 0
            && lock(&self.state).ipam.has_room(plan, ipv4, claim_uid)
        {
            return Ok(None);
        }
        let mut taken = TakenRanges::default();
        let state = lock(&self.state);
        for held in state.ipam.blocks() {
            taken.insert(held.block.cidr);
        }
        for object in &listed {
            let Some(cidr) = parse_cidr(object) else { continue };
            let known = object.metadata.name.as_ref().and_then(|n| state.ipam.block(n));
            let mine = object.spec.node_name == *node
                && object.spec.claim.is_none()
                && object.spec.pod_network == plan.pod_network
                && cidr.is_ipv4() == ipv4
                && object.metadata.deletion_timestamp.is_none()
                && known.is_none()
                && !state.ipam.blocks_overlapping(cidr).any(|_| true);
            if mine {
                // This node's, from before a crash, and unknown here: adopt it (by the name
                // it has, whatever scheme made it).
                drop(state);
                self.take_block(object, cidr, None);
                tracing::info!(pod_network = %plan.pod_network, block = %cidr,
                    "adopted an IPBlock this node created before a restart");
                return Ok(None);
            }
            taken.insert(cidr);
        }
        Ok(Some(taken))
    }

    /// Creates this node's candidates not `taken`, in order, until one is created (or found
    /// created by this node before a crash), none is left, or more than MAX_RACES were lost.
    async fn walk_candidates(
        &self,
        ports: &NetworkPorts,
        plan: &NetworkAddressing,
        ipv4: bool,
        mut taken: TakenRanges,
    ) -> Result<Walk, ClaimError> {
        let node = &self.identity.node;
        let mut races = 0;
        for cidr in Candidates::new(plan, ipv4, node).take(MAX_CANDIDATES) {
            if taken.overlaps(cidr) {
                continue;
            }
            let object = IpBlock::new(IpBlockSpec {
                pod_network: plan.pod_network.clone(),
                cidr: cidr.to_string(),
                node_name: node.clone(),
                claim: None,
            });
            let name = object
                .metadata
                .name
                .clone()
                .unwrap_or_else(|| ip_block_name(&plan.pod_network, &cidr.to_string()));
            let answer = match ports.blocks.create(object).await {
                Ok(answer) => answer,
                Err(source) => {
                    // The port does not say whether the server acted (a timeout or a 5xx
                    // after the write; a 4xx refusal, which proves it did not, costs one
                    // list): the name stays uncertain until a list settles it.
                    self.supervision.uncertain.remember(&name, &plan.pod_network, cidr);
                    return Err(ClaimError::BlockApi {
                        pod_network: plan.pod_network.clone(),
                        source,
                    });
                }
            };
            match answer {
                Created::Created(block) => {
                    self.take_block(&block, cidr, None);
                    tracing::info!(pod_network = %plan.pod_network, block = %cidr,
                        "claimed an IPBlock");
                    return Ok(Walk::Claimed);
                }
                Created::Exists(existing) => {
                    if is_ours(&existing, node, &plan.pod_network, cidr, None) {
                        // Created before a crash, not recorded yet: ours.
                        self.take_block(&existing, cidr, None);
                        tracing::info!(pod_network = %plan.pod_network, block = %cidr,
                            "adopted an IPBlock this node created before a restart");
                        return Ok(Walk::Claimed);
                    }
                    taken.insert(cidr);
                    races += 1;
                    if races > MAX_RACES {
                        return Ok(Walk::Contended { lost: races });
                    }
                }
            }
        }
        Ok(Walk::Full { lost: races })
    }

    /// Owns `object` (created or adopted) in memory, not recorded yet; addressed by the name
    /// the object has in the API.
    pub(super) fn take_block(
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
}

/// How a walk over the candidates ended.
enum Walk {
    /// This node owns a new block.
    Claimed,
    /// Every candidate was taken; `lost` of them by creates of other nodes after the list.
    Full { lost: usize },
    /// More than MAX_RACES candidates were taken by other nodes after the list.
    Contended { lost: usize },
}
