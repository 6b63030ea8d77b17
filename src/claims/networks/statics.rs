//! Static `PodNetwork` addresses reserved cluster-wide: a /32 or /128 `IPBlock` per address
//! carrying the claim, created at prepare and deleted once the claim is released.
//!
//! Before a reservation is created the network's blocks are listed: an address inside a live
//! block (any node's, any name) or another claim's reservation is refused, naming
//! `ipam.addresses[i]`, whatever the network's spec says (decision 0017: the spec only
//! narrows, the IPBlocks are the truth). An existing reservation is the claim's own only when
//! it is also this node's: a claim UID alone does not adopt another node's object.

use std::collections::{BTreeMap, HashSet};

use super::super::state::lock;
use super::super::{ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource};
use super::{
    BlocksUnavailable, Created, HeldReservation, StaticReservation, host_network, overlaps,
    parse_cidr,
};
use crate::ipam::{IpamCommit, OwnedBlock};
use crate::model::ClaimRef;
use crate::model::pod_network::{IpBlock, IpBlockClaim, IpBlockSpec};

/// Who holds an address in the way, for the error: `claim ns/name (uid …)` or the block.
fn holder_of(object: &IpBlock) -> String {
    object.spec.claim.as_ref().map_or_else(
        || {
            format!(
                "IPBlock {} ({}) of node {}",
                object.metadata.name.as_deref().unwrap_or_default(),
                object.spec.cidr,
                object.spec.node_name
            )
        },
        |c| format!("claim {}/{} (uid {})", c.namespace, c.name, c.uid),
    )
}

/// What the network's live objects say about reserving `cidr` for the claim `claim_uid` on
/// `node`: `Ok(Some(object))` the claim's own reservation of this node (adopted by its name),
/// `Ok(None)` nothing in the way, `Err(object)` a block or another reservation covering it.
fn in_the_way<'a>(
    objects: &'a [IpBlock],
    cidr: ipnetwork::IpNetwork,
    claim_uid: &str,
    node: &str,
) -> Result<Option<IpBlock>, &'a IpBlock> {
    let mut own = None;
    for object in objects {
        let Some(other) = parse_cidr(object) else { continue };
        if !overlaps(other, cidr) || object.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let same_claim = object.spec.claim.as_ref().is_some_and(|c| c.uid == claim_uid);
        if same_claim && object.spec.node_name == node && other == cidr {
            own = Some(object.clone());
            continue;
        }
        return Err(object);
    }
    Ok(own)
}

impl<R: ClaimSource, D: DeviceSource, S: ClaimStore> ClaimService<R, D, S> {
    /// Reserves the claim's static `PodNetwork` addresses cluster-wide: a /32 or /128
    /// `IPBlock` each, named from the address, carrying the claim. The same claim gets an
    /// existing reservation of this node back (a repeated prepare); an address inside another
    /// claim's reservation or a live block is an error naming `ipam.addresses[i]` and the
    /// holder. Returns the reservations created (or adopted) by this call, which a failed
    /// prepare deletes again.
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
        // Each network's blocks, listed once per prepare (not per address).
        let mut listed: BTreeMap<String, Vec<IpBlock>> = BTreeMap::new();
        for reservation in statics {
            let pod_network = reservation.lease.pod_network.clone().unwrap_or_default();
            let cidr = host_network(reservation.lease.address);
            let holder = IpBlockClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                uid: claim.uid.clone(),
            };
            let refuse = |holder: String, holder_node: String| ClaimError::AddressReserved {
                request: reservation.request.clone(),
                field: reservation.field.clone(),
                held: Box::new(HeldReservation {
                    address: reservation.lease.address,
                    pod_network: pod_network.clone(),
                    holder,
                    node: holder_node,
                }),
            };
            match self.own_reservation(claim, reservation, cidr) {
                Ok(true) => continue,
                Ok(false) => {}
                Err(err) => return Err((err, created)),
            }
            if !listed.contains_key(&pod_network) {
                match ports.blocks.list_network(&pod_network).await {
                    Ok(all) => {
                        listed.insert(pod_network.clone(), all);
                    }
                    Err(source) => {
                        return Err((ClaimError::BlockApi { pod_network, source }, created));
                    }
                }
            }
            let objects = listed.get(&pod_network).map_or(&[][..], Vec::as_slice);
            let adopt = match in_the_way(objects, cidr, &claim.uid, node) {
                Ok(adopt) => adopt,
                Err(object) => {
                    let node = object.spec.node_name.clone();
                    return Err((refuse(holder_of(object), node), created));
                }
            };
            let object = if let Some(existing) = adopt {
                existing
            } else {
                let object = IpBlock::new(IpBlockSpec {
                    pod_network: pod_network.clone(),
                    cidr: cidr.to_string(),
                    node_name: node.clone(),
                    claim: Some(holder.clone()),
                });
                let answer = match ports.blocks.create(object).await {
                    Ok(answer) => answer,
                    Err(source) => {
                        return Err((ClaimError::BlockApi { pod_network, source }, created));
                    }
                };
                match answer {
                    Created::Created(object) => object,
                    // The claim's own reservation of this node (a prepare before a crash).
                    Created::Exists(existing)
                        if existing.spec.claim.as_ref().is_some_and(|c| c.uid == claim.uid)
                            && existing.spec.node_name == *node
                            && existing.spec.pod_network == pod_network
                            && parse_cidr(&existing) == Some(cidr) =>
                    {
                        existing
                    }
                    Created::Exists(existing) => {
                        let node = existing.spec.node_name.clone();
                        return Err((refuse(holder_of(&existing), node), created));
                    }
                }
            };
            let block = OwnedBlock {
                name: object.metadata.name.clone().unwrap_or_default(),
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

    /// Whether this node holds the claim's reservation of `cidr` (found by CIDR: an older
    /// release named it otherwise), confirmed by the API in this process; one being released
    /// or lost is an error (kubelet retries once it is gone).
    fn own_reservation(
        &self,
        claim: &ClaimRef,
        reservation: &StaticReservation,
        cidr: ipnetwork::IpNetwork,
    ) -> Result<bool, ClaimError> {
        let pod_network = reservation.lease.pod_network.clone().unwrap_or_default();
        let own = lock(&self.state)
            .ipam
            .blocks_overlapping(cidr)
            .find(|s| {
                s.block.cidr == cidr
                    && s.block.pod_network == pod_network
                    && s.block.claim.as_ref().is_some_and(|c| c.uid == claim.uid)
            })
            .map(|s| (s.verified, s.releasing || s.lost));
        match own {
            Some((_, true)) => Err(BlocksUnavailable::ReservationReleasing {
                request: reservation.request.clone(),
                field: reservation.field.clone(),
                address: reservation.lease.address,
                pod_network,
            }
            .into()),
            Some((verified, false)) => Ok(verified),
            None => Ok(false),
        }
    }

    /// Deletes reservations a failed prepare created (best effort: they were never recorded;
    /// one left in the API is this node's, adopted by the next start's reconcile and deleted
    /// by the upkeep as its claim is not prepared).
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
    /// an unprepare; the block upkeep retries what fails), journaling the intent first, and
    /// forgets them durably.
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
        let gone = self.release_blocks(ports, doomed).await;
        let commit = IpamCommit { remove_blocks: gone, ..IpamCommit::default() };
        if let Err(err) = self.commit_blocks(&commit).await {
            tracing::warn!(error = %err, "forgetting deleted static reservations failed");
        }
    }
}
