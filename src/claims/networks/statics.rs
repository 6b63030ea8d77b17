//! Static `PodNetwork` addresses reserved cluster-wide: a /32 or /128 `IPBlock` per address
//! carrying the claim, created at prepare and deleted once the claim is released.

use std::collections::HashSet;

use super::super::state::lock;
use super::super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{Created, HeldReservation, StaticReservation, host_network};
use crate::ipam::{IpamCommit, OwnedBlock};
use crate::model::ClaimRef;
use crate::model::pod_network::{IpBlock, IpBlockClaim, IpBlockSpec, ip_block_name};

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Reserves the claim's static `PodNetwork` addresses cluster-wide: a /32 or /128
    /// `IPBlock` each, named from the address, carrying the claim. The same claim gets an
    /// existing reservation back (a repeated prepare); another claim's is an error naming
    /// `ipam.addresses[i]` and the holder. Returns the reservations created by this call
    /// (which a failed prepare deletes again).
    pub(in crate::claims) async fn reserve_statics(
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
    pub(in crate::claims) async fn drop_reservations(&self, blocks: &[OwnedBlock]) {
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
    pub(in crate::claims) async fn drop_orphan_reservations(&self) {
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
}
