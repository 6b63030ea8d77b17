//! A parent's total capacity (DESIGN §2, §4): the sub-interfaces on one parent interface — of
//! every PodNetwork published on it and of plain `--shared-parents` use — count together
//! against the largest `netclaim.dev/interfaces` this node publishes for that parent. The
//! scheduler checks each device's capacity alone, so two networks on one parent could
//! otherwise place twice what the parent was declared to carry.

use std::collections::BTreeMap;

use super::ClaimError;
use super::allocation::AllocatedResult;
use super::state::State;
use crate::ipam::LeaseStore;
use crate::model::device::AttributeValue;
use crate::model::network_config::{DeviceFacts, ResolvedMode, ResolvedNetworkConfig};

/// A device of the claim being reserved, as the claim service plans it.
type Planned<'a> =
    (&'a AllocatedResult, DeviceFacts, BTreeMap<String, AttributeValue>, ResolvedNetworkConfig);

/// The parent already carries as many sub-interfaces as it may.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "parent {parent} already carries {children} sub-interfaces, its limit of {limit} (the largest netclaim.dev/interfaces published for it, shared by every network on it)"
)]
pub struct ParentFull {
    /// The parent interface.
    pub parent: String,
    /// Its limit.
    pub limit: u32,
    /// Sub-interfaces already on it (prepared claims and this claim's earlier devices).
    pub children: u32,
}

/// Checks that one more child of `mode` fits on `parent`, whose limit is `limit` (`None`:
/// nothing shared is published on it now, so nothing is refused), beside the children
/// `planned` already (host interface and mode of every prepared device).
pub fn check<'a>(
    parent: &str,
    limit: Option<u32>,
    mode: ResolvedMode,
    planned: impl Iterator<Item = (&'a str, &'a ResolvedMode)>,
) -> Result<(), ParentFull> {
    let Some(limit) = limit else { return Ok(()) };
    if !is_child(mode) {
        return Ok(());
    }
    // Every VLAN sub-interface of the parent counts: its children sit on the same NIC.
    let children = planned.filter(|(if_name, mode)| *if_name == parent && is_child(**mode)).count();
    let children = u32::try_from(children).unwrap_or(u32::MAX);
    if children >= limit {
        return Err(ParentFull { parent: parent.to_owned(), limit, children });
    }
    Ok(())
}

/// [`check`] for one more device (`result` on `facts.if_name`, `mode`) of a claim being
/// reserved, beside the devices of every claim in use and the claim's own `planned` ones.
pub(super) fn check_device<S: LeaseStore>(
    state: &State<S>,
    planned: &[Planned<'_>],
    result: &AllocatedResult,
    facts: &DeviceFacts,
    limit: Option<u32>,
    mode: ResolvedMode,
) -> Result<(), ClaimError> {
    let in_use = state.devices_on(&facts.if_name).map(|d| (&*d.if_name, &d.config.mode));
    let this_claim = planned.iter().map(|(_, f, _, c)| (&*f.if_name, &c.mode));
    check(&facts.if_name, limit, mode, in_use.chain(this_claim)).map_err(|source| {
        ClaimError::ParentCapacity {
            request: result.request.clone(),
            device: result.device.clone(),
            source,
        }
    })
}

fn is_child(mode: ResolvedMode) -> bool {
    matches!(mode, ResolvedMode::Macvlan { .. } | ResolvedMode::Ipvlan { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::network_config::{IpvlanFlag, IpvlanMode, MacvlanMode};

    const MACVLAN: ResolvedMode = ResolvedMode::Macvlan { mode: MacvlanMode::Bridge };
    const IPVLAN: ResolvedMode =
        ResolvedMode::Ipvlan { mode: IpvlanMode::L2, flag: IpvlanFlag::Bridge };

    #[test]
    fn children_of_every_network_on_the_parent_count_against_its_limit() {
        let planned = [
            ("eth1", MACVLAN),
            ("eth1", MACVLAN),
            ("eth1", ResolvedMode::HostDevice),
            ("eth2", MACVLAN),
        ];
        let on = || planned.iter().map(|(parent, mode)| (*parent, mode));
        assert_eq!(check("eth1", Some(3), MACVLAN, on()), Ok(()));
        let err = check("eth1", Some(2), IPVLAN, on()).unwrap_err();
        assert_eq!(err, ParentFull { parent: "eth1".into(), limit: 2, children: 2 });
        let text = err.to_string();
        assert!(text.contains("parent eth1") && text.contains("limit of 2"), "{text}");
        assert_eq!(check("eth1", None, MACVLAN, on()), Ok(()), "no known limit");
        assert_eq!(
            check("eth1", Some(2), ResolvedMode::HostDevice, on()),
            Ok(()),
            "a device taken whole is no child"
        );
    }
}
