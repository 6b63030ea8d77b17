//! Claiming a block of a `PodNetwork` for this node: one create per block, adopting this
//! node's own block after a crash, listing the network once after the first lost race.

use std::collections::HashSet;
use std::sync::Arc;

use super::super::state::lock;
use super::super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{Created, MAX_CANDIDATES, MAX_RACES, is_ours, parse_cidr};
use crate::ipam::blocks::Candidates;
use crate::ipam::{IpamError, OwnedBlock};
use crate::model::network_config::NetworkAddressing;
use crate::model::pod_network::{IpBlock, IpBlockClaim, IpBlockSpec, ip_block_name};

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// The async lock serialising block claims of one network and family on this node.
    fn block_gate(&self, pod_network: &str, ipv4: bool) -> Arc<tokio::sync::Mutex<()>> {
        Arc::clone(lock(&self.block_gates).entry((pod_network.to_owned(), ipv4)).or_default())
    }

    /// Claims a new block of family `ipv4` of `plan` for this node (or finds that another
    /// prepare just did): afterwards an owned block has room, or this fails.
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
