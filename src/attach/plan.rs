//! Planning a pod's attachment: which interface each prepared device becomes (names in the
//! pod's claim order) and the plan of each interface not attached yet, from the host facts
//! read through the pod's [`LinkPort`].

use super::{AttachFailure, AttachedDevice, PodAttachment};
use crate::claims::{PreparedClaim, PreparedClaimDevice};
use crate::model::network_config::{Addressing, DeviceKind, ResolvedMode, Sharing};
use crate::podnet::plan::NameError;
use crate::podnet::plan::{assign_tables, with_table};
use crate::podnet::{
    AttachRequest, HostDevice, InterfaceSlot, LinkOpError, LinkPort, PodNetns, Side,
    assign_interface_names, plan_attach,
};

/// One interface to attach: the claim and its device, with the assigned name.
pub(super) struct Slot<'a> {
    pub(super) claim: &'a PreparedClaim,
    pub(super) device: &'a PreparedClaimDevice,
    pub(super) name: String,
}

pub(super) fn claim_label(claim: &PreparedClaim) -> String {
    format!("{}/{}", claim.namespace, claim.name)
}

/// The pod's interfaces in attach order (the pod's `spec.resourceClaims` order, then request
/// name; claims of unknown position after the others, by name; DESIGN §3) with
/// their names: explicit names kept, interfaces already attached keep theirs, the others
/// get `net1`, `net2`, ….
pub(super) fn assign_slots<'a>(
    claims: &'a [PreparedClaim],
    existing: Option<&PodAttachment>,
) -> Result<Vec<Slot<'a>>, NameError> {
    let mut pairs: Vec<(&PreparedClaim, &PreparedClaimDevice)> =
        claims.iter().flat_map(|c| c.devices.iter().map(move |d| (c, d))).collect();
    pairs.sort_by(|(a, x), (b, y)| {
        let position = |c: &PreparedClaim| c.pod_claim_index.unwrap_or(u32::MAX);
        (position(a), &a.namespace, &a.name, &a.uid, &x.request).cmp(&(
            position(b),
            &b.namespace,
            &b.name,
            &b.uid,
            &y.request,
        ))
    });
    let names_in_use: Vec<Option<String>> = pairs
        .iter()
        .map(|(c, d)| {
            existing
                .and_then(|r| {
                    r.devices.iter().find(|a| a.claim_uid == c.uid && a.request == d.request)
                })
                .map(|a| a.plan.interface_name.clone())
                .or_else(|| d.config.interface.name.clone())
        })
        .collect();
    let slots: Vec<InterfaceSlot<'_>> = pairs
        .iter()
        .zip(&names_in_use)
        .map(|((c, d), name)| InterfaceSlot {
            claim_uid: &c.uid,
            request: &d.request,
            explicit_name: name.as_deref(),
        })
        .collect();
    let names = assign_interface_names(&slots)?;
    Ok(pairs
        .into_iter()
        .zip(names)
        .map(|((claim, device), name)| Slot { claim, device, name })
        .collect())
}

/// Plans the slots that `existing` does not have yet.
pub(super) async fn plan_new<O: LinkPort>(
    ops: &O,
    pod: &PodNetns,
    slots: &[Slot<'_>],
    existing: Option<&PodAttachment>,
) -> Result<Vec<AttachedDevice>, AttachFailure> {
    let tables = auto_tables(slots, existing);
    let mut planned = Vec::new();
    for slot in
        slots.iter().filter(|s| existing.is_none_or(|r| !r.has(&s.claim.uid, &s.device.request)))
    {
        let host = host_device(ops, slot).await?;
        let pool_addresses: &[ipnetwork::IpNetwork] = match slot.device.config.addressing {
            Addressing::Pool(_) | Addressing::Network(_) => &slot.device.addresses,
            Addressing::None | Addressing::Static(_) => &[],
        };
        // `routing.table: 0`: the table picked for the pod (`podnet::plan::assign_tables`).
        let picked = slot_table(slots, &tables, slot);
        let routed = picked.map(|table| with_table(&slot.device.config, table));
        let plan = plan_attach(&AttachRequest {
            claim_uid: &slot.claim.uid,
            config: routed.as_ref().unwrap_or(&slot.device.config),
            device: &host,
            pod,
            interface_name: &slot.name,
            pool_addresses,
        })
        .map_err(|source| AttachFailure::Plan {
            claim: claim_label(slot.claim),
            request: slot.device.request.clone(),
            device: slot.device.device.clone(),
            source,
        })?;
        planned.push(AttachedDevice {
            claim_uid: slot.claim.uid.clone(),
            claim_namespace: slot.claim.namespace.clone(),
            claim_name: slot.claim.name.clone(),
            request: slot.device.request.clone(),
            pool: slot.device.pool.clone(),
            device: slot.device.device.clone(),
            share_id: slot.device.share_id.clone(),
            plan,
            result: None,
        });
    }
    Ok(planned)
}

/// The tables picked for the slots whose config asks for one (`routing.table: 0`), in slot
/// order, avoiding the tables every slot names and those of interfaces attached before.
fn auto_tables(slots: &[Slot<'_>], existing: Option<&PodAttachment>) -> Vec<Option<u32>> {
    let taken: Vec<u32> =
        existing.iter().flat_map(|r| r.devices.iter().flat_map(|d| d.plan.tables())).collect();
    let configs: Vec<_> = slots
        .iter()
        .map(|s| {
            match existing.and_then(|r| {
                r.devices
                    .iter()
                    .find(|a| a.claim_uid == s.claim.uid && a.request == s.device.request)
            }) {
                // Attached before: its table is in `taken`, it needs no new one.
                Some(_) => None,
                None => Some(&s.device.config),
            }
        })
        .collect();
    let asking: Vec<&crate::model::network_config::ResolvedNetworkConfig> =
        configs.iter().flatten().copied().collect();
    let mut picked = assign_tables(&asking, &taken).into_iter();
    configs.iter().map(|c| c.and_then(|_| picked.next().flatten())).collect()
}

fn slot_table(slots: &[Slot<'_>], tables: &[Option<u32>], slot: &Slot<'_>) -> Option<u32> {
    let position = slots.iter().position(|s| std::ptr::eq(s, slot))?;
    tables.get(position).copied().flatten()
}

/// The host facts of a slot's device: a moved device's MTU and MAC are read now (they are
/// restored on detach); a shared parent needs only its name.
async fn host_device<O: LinkPort>(ops: &O, slot: &Slot<'_>) -> Result<HostDevice, AttachFailure> {
    let device = slot.device;
    let sharing = device.sharing.unwrap_or(match device.config.mode {
        ResolvedMode::HostDevice | ResolvedMode::SriovVf | ResolvedMode::Vfio => Sharing::Exclusive,
        ResolvedMode::Macvlan { .. } | ResolvedMode::Ipvlan { .. } => Sharing::Shared,
    });
    let kind = device.kind.unwrap_or(DeviceKind::Physical);
    if sharing != Sharing::Exclusive {
        return Ok(HostDevice {
            if_name: device.if_name.clone(),
            kind,
            sharing,
            mtu: device.host_mtu.unwrap_or(device.config.interface.mtu),
            mac: None,
        });
    }
    let failure = |source| AttachFailure::HostDevice {
        claim: claim_label(slot.claim),
        device: device.device.clone(),
        if_name: device.if_name.clone(),
        source,
    };
    let link = ops.link(Side::Host, &device.if_name).await.map_err(failure)?.ok_or_else(|| {
        failure(LinkOpError::NoSuchLink { side: Side::Host, name: device.if_name.clone() })
    })?;
    Ok(HostDevice { if_name: device.if_name.clone(), kind, sharing, mtu: link.mtu, mac: link.mac })
}
