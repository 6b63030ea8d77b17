//! The fake kernel's rules, table routes, VRFs, masters and sysctls (`RoutingPort`). VRFs are
//! pod links (so lookups by name find them) with a table here; table routes, masters and
//! sysctls are kept by link index and count only while that link exists, as the kernel drops
//! them with the link.

#![allow(
    clippy::unwrap_used,
    reason = "a test double: its lock is poisoned only after a test panicked, failing it anyway"
)]

use std::collections::BTreeMap;

use super::{FakeKernel, Kernel, SideKey, refuse};
use crate::model::network_config::Sysctl;
use crate::podnet::plan::{SourceRule, TableRoute};
use crate::podnet::ports::{
    EEXIST, ENETUNREACH, ENOENT, ESRCH, LinkOpError, LinkState, RoutingPort, Side, VrfState,
};

/// `EOPNOTSUPP`: the fake kernel's answer to a VRF when built without one.
const EOPNOTSUPP: i32 = 95;

#[derive(Debug, Default)]
pub(super) struct State {
    rules: Vec<SourceRule>,
    table_routes: Vec<(u32, TableRoute)>,
    /// VRF name → table.
    vrfs: BTreeMap<String, u32>,
    /// Link index → master index.
    masters: BTreeMap<u32, u32>,
    /// (link index, key) → value.
    sysctls: BTreeMap<(u32, String), String>,
    /// The kernel refuses VRFs (no module).
    no_vrf: bool,
}

fn pod_link_exists(k: &Kernel, index: u32) -> bool {
    k.links.iter().any(|((side, _), link)| *side == SideKey::Pod && link.index == index)
}

/// What routing state is left in the pod after detach (only what outlives a link counts:
/// rules and VRF devices; routes and sysctls of existing links too).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RoutingLeftovers {
    /// Rules still installed.
    pub rules: Vec<String>,
    /// Table routes on links that still exist.
    pub table_routes: Vec<String>,
    /// VRF devices still there.
    pub vrfs: Vec<String>,
}

impl RoutingLeftovers {
    /// Nothing left.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty() && self.table_routes.is_empty() && self.vrfs.is_empty()
    }
}

impl FakeKernel {
    /// The rules, table routes of live links and VRFs left in the pod.
    pub fn routing_leftovers(&self) -> RoutingLeftovers {
        let k = self.inner.lock().unwrap();
        RoutingLeftovers {
            rules: k.routing.rules.iter().map(ToString::to_string).collect(),
            table_routes: k
                .routing
                .table_routes
                .iter()
                .filter(|(index, _)| pod_link_exists(&k, *index))
                .map(|(index, route)| format!("{route} dev {index}"))
                .collect(),
            vrfs: k
                .routing
                .vrfs
                .keys()
                .filter(|name| k.links.contains_key(&(SideKey::Pod, (*name).clone())))
                .cloned()
                .collect(),
        }
    }

    /// The sysctls set on the pod link named `name`, by full key.
    pub fn sysctls_of(&self, name: &str) -> BTreeMap<String, String> {
        let k = self.inner.lock().unwrap();
        let Some(index) = k.links.get(&(SideKey::Pod, name.to_owned())).map(|l| l.index) else {
            return BTreeMap::new();
        };
        k.routing
            .sysctls
            .iter()
            .filter(|((i, _), _)| *i == index)
            .map(|((_, key), value)| (key.clone(), value.clone()))
            .collect()
    }

    /// The master of the pod link named `name`, by name.
    pub fn master_of(&self, name: &str) -> Option<String> {
        let k = self.inner.lock().unwrap();
        let index = k.links.get(&(SideKey::Pod, name.to_owned()))?.index;
        let master = *k.routing.masters.get(&index)?;
        k.links
            .iter()
            .find(|((side, _), link)| *side == SideKey::Pod && link.index == master)
            .map(|((_, n), _)| n.clone())
    }

    /// Makes the kernel refuse VRF devices (`EOPNOTSUPP`, as without the vrf module).
    pub fn without_vrf(&self) {
        self.inner.lock().unwrap().routing.no_vrf = true;
    }

    /// Adds a VRF in the pod that the driver did not create.
    pub fn add_pod_vrf(&self, name: &str, table: u32) {
        self.add_pod_link(name);
        self.inner.lock().unwrap().routing.vrfs.insert(name.to_owned(), table);
    }
}

impl RoutingPort for FakeKernel {
    async fn add_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        let line = format!("add rule {rule}");
        let mut k = self.call(Side::Pod, line.clone())?;
        if k.routing.rules.contains(rule) {
            return Err(refuse(&mut k, &line, Side::Pod, EEXIST));
        }
        k.routing.rules.push(rule.clone());
        Ok(())
    }

    async fn delete_rule(&self, rule: &SourceRule) -> Result<(), LinkOpError> {
        let line = format!("delete rule {rule}");
        let mut k = self.call(Side::Pod, line.clone())?;
        let before = k.routing.rules.len();
        k.routing.rules.retain(|r| r != rule);
        if before == k.routing.rules.len() {
            return Err(refuse(&mut k, &line, Side::Pod, ENOENT));
        }
        Ok(())
    }

    async fn add_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        let line = format!("add route {route} dev {index}");
        let mut k = self.call(Side::Pod, line.clone())?;
        let existing: Vec<(u32, TableRoute)> = k
            .routing
            .table_routes
            .iter()
            .filter(|(i, _)| pod_link_exists(&k, *i))
            .cloned()
            .collect();
        if existing.iter().any(|(_, r)| {
            r.table == route.table
                && r.route.destination == route.route.destination
                && r.route.metric == route.route.metric
        }) {
            return Err(refuse(&mut k, &line, Side::Pod, EEXIST));
        }
        if let Some(gateway) = route.route.gateway
            && !k.addresses.iter().any(|(i, a)| *i == index && a.contains(gateway))
        {
            return Err(refuse(&mut k, &line, Side::Pod, ENETUNREACH));
        }
        k.routing.table_routes = existing;
        k.routing.table_routes.push((index, route.clone()));
        Ok(())
    }

    async fn delete_table_route(&self, index: u32, route: &TableRoute) -> Result<(), LinkOpError> {
        let line = format!("delete route {route} dev {index}");
        let mut k = self.call(Side::Pod, line.clone())?;
        let before = k.routing.table_routes.len();
        k.routing.table_routes.retain(|(i, r)| !(*i == index && r == route));
        if before == k.routing.table_routes.len() {
            return Err(refuse(&mut k, &line, Side::Pod, ESRCH));
        }
        Ok(())
    }

    async fn vrf(&self, name: &str) -> Result<Option<VrfState>, LinkOpError> {
        let k = self.inner.lock().unwrap();
        if k.netns_gone {
            return Err(LinkOpError::NetnsGone { path: "/run/netns/gone".to_owned() });
        }
        let Some(link) = k.links.get(&(SideKey::Pod, name.to_owned())) else {
            return Ok(None);
        };
        let members = k
            .routing
            .masters
            .iter()
            .filter(|(slave, master)| **master == link.index && pod_link_exists(&k, **slave))
            .count();
        Ok(Some(VrfState {
            index: link.index,
            table: k.routing.vrfs.get(name).copied(),
            members: u32::try_from(members).unwrap(),
        }))
    }

    async fn create_vrf(&self, name: &str, table: u32) -> Result<(), LinkOpError> {
        let line = format!("create vrf {name} table {table}");
        let mut k = self.call(Side::Pod, line.clone())?;
        if k.routing.no_vrf {
            return Err(refuse(&mut k, &line, Side::Pod, EOPNOTSUPP));
        }
        if k.links.contains_key(&(SideKey::Pod, name.to_owned())) {
            return Err(refuse(&mut k, &line, Side::Pod, EEXIST));
        }
        let index = k.next_index;
        k.next_index += 1;
        k.links.insert(
            (SideKey::Pod, name.to_owned()),
            LinkState { index, name: name.to_owned(), mac: None, mtu: 65575, alias: None },
        );
        k.up.push(index);
        k.routing.vrfs.insert(name.to_owned(), table);
        Ok(())
    }

    async fn set_master(&self, index: u32, master: u32) -> Result<(), LinkOpError> {
        let line = format!("set {index} master {master}");
        let mut k = self.call(Side::Pod, line.clone())?;
        if master == 0 {
            k.routing.masters.remove(&index);
        } else if !pod_link_exists(&k, master) {
            return Err(refuse(&mut k, &line, Side::Pod, super::ENODEV));
        } else {
            k.routing.masters.insert(index, master);
        }
        Ok(())
    }

    async fn set_sysctls(
        &self,
        index: u32,
        if_name: &str,
        sysctls: &[Sysctl],
    ) -> Result<(), LinkOpError> {
        let keys: Vec<String> = sysctls.iter().map(|s| s.key(if_name)).collect();
        let line = format!("set sysctls {} on {index}", keys.join(","));
        let mut k = self.call(Side::Pod, line)?;
        for (sysctl, key) in sysctls.iter().zip(keys) {
            k.routing.sysctls.insert((index, key), sysctl.value.clone());
        }
        Ok(())
    }
}
