//! Names the driver gives: VLAN sub-interfaces (short enough for `IFNAMSIZ`, hashed when the
//! parent's name is long) with the alias that marks them as ours, the alias of a device moved
//! into a pod, and the pod-side names of a pod's interfaces.

use sha2::{Digest as _, Sha256};

use super::VlanLink;
use crate::model::link::MAX_IFNAME_LEN;

/// Prefix of the `IFLA_IFALIAS` of a VLAN sub-interface this driver created: the mark that
/// lets a restarted daemon tell its own sub-interfaces from an administrator's (which it never
/// deletes). The full alias ([`vlan_alias`]) also names the parent and the VLAN id, which a
/// hashed name `nc<hash6>.<id>` does not show.
pub const VLAN_ALIAS: &str = "netclaim.dev/vlan";

/// Prefix of the name of a VLAN sub-interface whose `<parent>.<id>` does not fit in
/// `IFNAMSIZ`: `nc<hash6>.<id>` ([`vlan_name`]).
pub const HASHED_VLAN_PREFIX: &str = "nc";

/// The name of VLAN sub-interface `id` on `parent`: `<parent>.<id>` (what `ip link add link
/// eth1 name eth1.100 type vlan id 100` users expect) when it fits in 15 bytes, else
/// `nc<hash6>.<id>`, where `hash6` is the first 6 lowercase hex digits of the SHA-256 of the
/// parent's name. A pure function of the parent's name and the id, so every claim, release
/// and restart of the daemon derives the same name (the plan in the store also records it).
/// At most 2 + 6 + 1 + 4 = 13 bytes.
#[must_use]
pub fn vlan_name(parent: &str, id: u16) -> String {
    let plain = format!("{parent}.{id}");
    if plain.len() <= MAX_IFNAME_LEN {
        return plain;
    }
    let hash6: String = Sha256::digest(parent.as_bytes())
        .iter()
        .take(3)
        .flat_map(|byte| [byte >> 4, byte & 0xf])
        .filter_map(|nibble| char::from_digit(u32::from(nibble), 16))
        .collect();
    format!("{HASHED_VLAN_PREFIX}{hash6}.{id}")
}

/// The `IFLA_IFALIAS` this driver puts on the VLAN sub-interface it creates:
/// `netclaim.dev/vlan parent=<parent> id=<id>` (at most 45 bytes; the kernel allows 255).
#[must_use]
pub fn vlan_alias(vlan: &VlanLink) -> String {
    format!("{VLAN_ALIAS} parent={} id={}", vlan.parent, vlan.id)
}

/// The VLAN sub-interface a host link named `name` with alias `alias` is, when the alias says
/// this driver created it and the name is the one [`vlan_name`] gives for the parent and id
/// it names (a bare [`VLAN_ALIAS`] from older releases: the name `<parent>.<id>` says them).
/// Start-up uses it to find sub-interfaces of ours that no stored pod uses any more.
#[must_use]
pub fn parse_vlan_alias(name: &str, alias: &str) -> Option<VlanLink> {
    let (parent, id) = if alias == VLAN_ALIAS {
        let (parent, id) = name.rsplit_once('.')?;
        (parent, id.parse().ok()?)
    } else {
        let rest = alias.strip_prefix(VLAN_ALIAS)?.strip_prefix(" parent=")?;
        let (parent, id) = rest.split_once(" id=")?;
        (parent, id.parse().ok()?)
    };
    let vlan = VlanLink { parent: parent.to_owned(), id, name: vlan_name(parent, id) };
    (!parent.is_empty() && vlan.name == name).then_some(vlan)
}

/// Who made the host link named like `vlan`, read from its alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VlanOwner {
    /// This driver, for this parent and id: [`vlan_alias`], or the bare [`VLAN_ALIAS`] of
    /// releases that named every sub-interface `<parent>.<id>` (the name then says both).
    Us,
    /// This driver, for another parent or id: a `nc<hash6>.<id>` collision (or a renamed
    /// link). Never used, never deleted.
    UsForAnother {
        /// The alias found.
        alias: String,
    },
    /// Someone else (no alias, or another): used as it is, never deleted.
    Foreign,
}

/// Whose VLAN sub-interface a host link with `vlan`'s name and alias `alias` is.
#[must_use]
pub fn vlan_owner(vlan: &VlanLink, alias: Option<&str>) -> VlanOwner {
    match alias {
        Some(alias) if alias == vlan_alias(vlan) => VlanOwner::Us,
        Some(VLAN_ALIAS) if vlan.name == format!("{}.{}", vlan.parent, vlan.id) => VlanOwner::Us,
        Some(alias) if alias == VLAN_ALIAS || alias.starts_with(&format!("{VLAN_ALIAS} ")) => {
            VlanOwner::UsForAnother { alias: alias.to_owned() }
        }
        _ => VlanOwner::Foreign,
    }
}

/// Prefix of the `IFLA_IFALIAS` put on a device moved into a pod. If the pod's netns is
/// destroyed while the daemon is down, the kernel returns a physical NIC to the host under its
/// pod-side name; the alias tells reconcile which host name and claim it belongs to.
pub const DEVICE_ALIAS_PREFIX: &str = "netclaim.dev/device";

/// The alias recording a moved device's host name and claim:
/// `netclaim.dev/device host=<name> claim=<uid>`.
#[must_use]
pub fn device_alias(host_name: &str, claim_uid: &str) -> String {
    format!("{DEVICE_ALIAS_PREFIX} host={host_name} claim={claim_uid}")
}

/// Parses [`device_alias`]: `(host name, claim uid)`, or `None` for any other alias.
#[must_use]
pub fn parse_device_alias(alias: &str) -> Option<(&str, &str)> {
    let rest = alias.strip_prefix(DEVICE_ALIAS_PREFIX)?.strip_prefix(" host=")?;
    let (host, claim) = rest.split_once(" claim=")?;
    (!host.is_empty() && !claim.is_empty() && !claim.contains(' ')).then_some((host, claim))
}

/// One interface a pod's claims ask for, for [`assign_interface_names`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterfaceSlot<'a> {
    /// The claim's UID.
    pub claim_uid: &'a str,
    /// The request name of the allocation result.
    pub request: &'a str,
    /// `interface.name` from the config, if set.
    pub explicit_name: Option<&'a str>,
}

/// Why the pod's interface names cannot be assigned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Two interfaces of the pod ask for the same name (never silently renamed).
    #[error("interface name {name} is asked for by claim {first} and by claim {second}")]
    Collision {
        /// The name.
        name: String,
        /// The first claim (uid/request).
        first: String,
        /// The second claim (uid/request).
        second: String,
    },
}

/// Assigns the pod-side names of all interfaces of one pod at sandbox time (DESIGN §3):
/// explicit names are kept, the others get `net1`, `net2`, … in the given order (the pod's
/// `resourceClaims` order, else claim then request name: the caller sorts), skipping names an
/// explicit config already uses. A name asked for twice is an error.
pub fn assign_interface_names(slots: &[InterfaceSlot<'_>]) -> Result<Vec<String>, NameError> {
    let mut owners: std::collections::BTreeMap<&str, String> = std::collections::BTreeMap::new();
    for slot in slots {
        if let Some(name) = slot.explicit_name {
            let owner = format!("{}/{}", slot.claim_uid, slot.request);
            if let Some(first) = owners.insert(name, owner.clone()) {
                return Err(NameError::Collision { name: name.to_owned(), first, second: owner });
            }
        }
    }
    let mut next = 1u32;
    let mut names = Vec::with_capacity(slots.len());
    for slot in slots {
        if let Some(name) = slot.explicit_name {
            names.push(name.to_owned());
            continue;
        }
        let name = loop {
            let candidate = format!("net{next}");
            next += 1;
            if !owners.contains_key(candidate.as_str()) {
                break candidate;
            }
        };
        names.push(name);
    }
    Ok(names)
}
