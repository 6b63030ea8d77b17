//! Executing the routing steps of a plan (`podnet::plan::routing`): the VRF a pod's claims
//! share, enslaving, table routes and the rules' removal.
//!
//! A VRF is shared by the claims of a pod that name it: the first attach creates it (with its
//! table, up), the others find it and check its table; detach deletes it once no link is
//! enslaved to it any more, read from the kernel rather than counted here, so a restart needs
//! nothing to rebuild. A link of that name that is not a VRF, or a VRF with another table, fails
//! the attach rather than routing the interface through the wrong table; detach keeps such a
//! link.

use super::{StepError, UndoOutcome, ignore_missing};
use crate::model::network_config::Vrf;
use crate::podnet::plan::{RouteDisplay, SourceRule, TableRoute};
use crate::podnet::ports::{EEXIST, ENETUNREACH, ENOENT, LinkOpError, LinkPort, Side};

pub(super) async fn ensure_vrf<O: LinkPort>(ops: &O, vrf: &Vrf) -> Result<(), StepError> {
    match ops.vrf(&vrf.name).await? {
        None => Ok(ops.create_vrf(&vrf.name, vrf.table).await?),
        Some(state) if state.table == Some(vrf.table) => Ok(()),
        Some(state) => Err(StepError::VrfOfAnother {
            name: vrf.name.clone(),
            table: vrf.table,
            found: state.table,
        }),
    }
}

/// The index of the pod's VRF `name` (enslaving needs it).
pub(super) async fn vrf_index<O: LinkPort>(ops: &O, name: &str) -> Result<u32, StepError> {
    let vrf = ops
        .link(Side::Pod, name)
        .await?
        .ok_or_else(|| LinkOpError::NoSuchLink { side: Side::Pod, name: name.to_owned() })?;
    Ok(vrf.index)
}

pub(super) async fn join_vrf<O: LinkPort>(
    ops: &O,
    index: u32,
    name: &str,
) -> Result<(), StepError> {
    let master = vrf_index(ops, name).await?;
    Ok(ops.set_master(index, master).await?)
}

/// A table route's error, named as the kernel's errno says.
pub(super) fn table_route_error(route: &TableRoute, source: LinkOpError) -> StepError {
    match source.errno() {
        Some(EEXIST) => StepError::DuplicateRoute {
            destination: route.route.destination,
            metric: route.route.metric,
            source,
        },
        Some(ENETUNREACH) => StepError::GatewayUnreachable {
            route: format!("{} table {}", RouteDisplay(&route.route), route.table),
            source,
        },
        _ => StepError::Op(source),
    }
}

pub(super) async fn add_table_route<O: LinkPort>(
    ops: &O,
    index: u32,
    route: &TableRoute,
) -> Result<(), StepError> {
    ops.add_table_route(index, route).await.map_err(|source| table_route_error(route, source))
}

/// Deletes the VRF when no link is enslaved to it any more and it is the VRF the plan
/// made or joined (same table).
pub(super) async fn release_vrf<O: LinkPort>(
    ops: &O,
    vrf: &Vrf,
) -> Result<UndoOutcome, LinkOpError> {
    let state = match ops.vrf(&vrf.name).await {
        Ok(Some(state)) => state,
        Ok(None) | Err(LinkOpError::NetnsGone { .. }) => return Ok(UndoOutcome::AlreadyGone),
        Err(err) => return Err(err),
    };
    if state.table != Some(vrf.table) || state.members > 0 {
        return Ok(UndoOutcome::Kept);
    }
    match ops.delete_link(Side::Pod, state.index).await {
        Ok(()) => Ok(UndoOutcome::Done),
        Err(LinkOpError::NetnsGone { .. }) => Ok(UndoOutcome::AlreadyGone),
        Err(err) => ignore_missing(Err(err)).map(|()| UndoOutcome::AlreadyGone),
    }
}

/// Deletes a source rule: a rule belongs to the netns, not to the link, so detach removes it.
pub(super) async fn delete_rule<O: LinkPort>(
    ops: &O,
    rule: &SourceRule,
) -> Result<UndoOutcome, LinkOpError> {
    match ops.delete_rule(rule).await {
        Ok(()) => Ok(UndoOutcome::Done),
        Err(LinkOpError::NetnsGone { .. }) => Ok(UndoOutcome::AlreadyGone),
        Err(err) if err.errno() == Some(ENOENT) => Ok(UndoOutcome::AlreadyGone),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests;
