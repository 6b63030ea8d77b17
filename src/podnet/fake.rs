//! A recording in-memory kernel implementing `LinkPort` for unit tests (and netclaim-testkit,
//! with the `testkit` feature): it keeps links per netns, addresses and routes, answers with
//! the errno the kernel would, logs every mutating call, and fails the call whose log line
//! starts with an injected prefix.

#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "a test double: its lock is poisoned only after a test panicked, failing it anyway"
)]

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use ipnetwork::IpNetwork;

use crate::model::network_config::{MacAddr, Route};

use super::plan::{ChildKind, RouteDisplay};
use super::ports::{
    EADDRNOTAVAIL, EEXIST, ENETUNREACH, ENODEV, ESRCH, LinkOpError, LinkPort, LinkState,
    PodLinkConfig, PodRequest, Side, apply_sequentially,
};

mod routing;
pub use routing::RoutingLeftovers;

#[derive(Debug, Default)]
struct Kernel {
    links: BTreeMap<(SideKey, String), LinkState>,
    addresses: Vec<(u32, IpNetwork)>,
    routes: Vec<(u32, Route)>,
    up: Vec<u32>,
    next_index: u32,
    log: Vec<String>,
    fail: Option<(String, i32)>,
    /// Every pod-side link lookup fails with this errno.
    fail_lookups: Option<i32>,
    netns_gone: bool,
    /// Rules, table routes, VRFs, masters and sysctls (`fake::routing`).
    routing: routing::State,
    /// RDMA devices by name: where each is and its (netns-independent) index.
    rdma: BTreeMap<String, (SideKey, u32)>,
    /// The size of each batch handed to `apply_batch`, in order.
    batches: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum SideKey {
    Host,
    Pod,
}

fn key(side: Side) -> SideKey {
    match side {
        Side::Host => SideKey::Host,
        Side::Pod => SideKey::Pod,
    }
}

/// The fake kernel.
#[derive(Debug, Default)]
pub struct FakeKernel {
    inner: Mutex<Kernel>,
}

fn kernel_error(op: &str, side: Side, errno: i32) -> LinkOpError {
    LinkOpError::Kernel { op: op.to_owned(), side, errno, message: format!("errno {errno}") }
}

impl FakeKernel {
    /// An empty kernel: no links, no addresses, no routes.
    #[must_use]
    pub fn new() -> Self {
        let fake = Self::default();
        fake.inner.lock().unwrap().next_index = 10;
        fake
    }

    /// Adds a host link (a parent or an exclusive device).
    pub fn add_host_link(&self, name: &str, mtu: u32, alias: Option<&str>) {
        let mut k = self.inner.lock().unwrap();
        let index = k.next_index;
        k.next_index += 1;
        k.links.insert(
            (SideKey::Host, name.to_owned()),
            LinkState {
                index,
                name: name.to_owned(),
                mac: Some(MacAddr([2, 0, 0, 0, 0, u8::try_from(index).unwrap()])),
                mtu,
                alias: alias.map(str::to_owned),
            },
        );
    }

    /// Adds an RDMA device in the host netns.
    pub fn add_rdma_device(&self, name: &str) {
        let mut k = self.inner.lock().unwrap();
        let index = k.next_index;
        k.next_index += 1;
        k.rdma.insert(name.to_owned(), (SideKey::Host, index));
    }

    /// Where RDMA device `name` is, `None` when there is none.
    pub fn rdma_side(&self, name: &str) -> Option<Side> {
        let k = self.inner.lock().unwrap();
        k.rdma.get(name).map(|(side, _)| match side {
            SideKey::Host => Side::Host,
            SideKey::Pod => Side::Pod,
        })
    }

    /// Adds a pod link (a name collision).
    pub fn add_pod_link(&self, name: &str) {
        let mut k = self.inner.lock().unwrap();
        let index = k.next_index;
        k.next_index += 1;
        k.links.insert(
            (SideKey::Pod, name.to_owned()),
            LinkState { index, name: name.to_owned(), mac: None, mtu: 1500, alias: None },
        );
    }

    /// Adds a route that already exists in the pod.
    pub fn add_pod_route(&self, route: Route) {
        self.inner.lock().unwrap().routes.push((1, route));
    }

    /// Fails the first call whose log line starts with `prefix` with `errno`.
    pub fn fail_on(&self, prefix: &str, errno: i32) {
        self.inner.lock().unwrap().fail = Some((prefix.to_owned(), errno));
    }

    /// Makes every pod-side link lookup fail with `errno` (`None`: lookups work again).
    pub fn fail_lookups(&self, errno: Option<i32>) {
        self.inner.lock().unwrap().fail_lookups = errno;
    }

    /// Makes every pod-side call fail as if the pod's netns were destroyed.
    pub fn destroy_pod_netns(&self) {
        let mut k = self.inner.lock().unwrap();
        k.netns_gone = true;
        let pod: Vec<_> = k.links.keys().filter(|(s, _)| *s == SideKey::Pod).cloned().collect();
        for name in pod {
            k.links.remove(&name);
        }
        // As `rdma_dev_exit_net`: the RDMA devices of a destroyed netns return to the
        // initial one.
        for (side, _) in k.rdma.values_mut() {
            *side = SideKey::Host;
        }
    }

    /// The size of each batch of pod requests so far (each request is also logged as its
    /// single call), in order.
    pub fn batches(&self) -> Vec<usize> {
        self.inner.lock().unwrap().batches.clone()
    }

    /// The mutating calls so far.
    pub fn log(&self) -> Vec<String> {
        self.inner.lock().unwrap().log.clone()
    }

    /// Names of the links on `side`.
    pub fn links(&self, side: Side) -> Vec<String> {
        let k = self.inner.lock().unwrap();
        k.links.keys().filter(|(s, _)| *s == key(side)).map(|(_, n)| n.clone()).collect()
    }

    /// The link named `name` on `side`.
    pub fn get(&self, side: Side, name: &str) -> Option<LinkState> {
        self.inner.lock().unwrap().links.get(&(key(side), name.to_owned())).cloned()
    }

    /// Addresses and routes still configured (excluding pre-seeded routes on index 1).
    pub fn leftovers(&self) -> (usize, usize) {
        let k = self.inner.lock().unwrap();
        (k.addresses.len(), k.routes.iter().filter(|(i, _)| *i != 1).count())
    }

    fn call(
        &self,
        side: Side,
        line: String,
    ) -> Result<std::sync::MutexGuard<'_, Kernel>, LinkOpError> {
        let mut k = self.inner.lock().unwrap();
        if side == Side::Pod && k.netns_gone {
            return Err(LinkOpError::NetnsGone { path: "/run/netns/gone".to_owned() });
        }
        if let Some((prefix, errno)) = k.fail.clone()
            && line.starts_with(&prefix)
        {
            k.fail = None;
            k.log.push(line.clone());
            return Err(refuse(&mut k, &line, side, errno));
        }
        k.log.push(line);
        Ok(k)
    }
}

/// A refusal by the modelled kernel: marks the logged call as failed.
fn refuse(k: &mut Kernel, line: &str, side: Side, errno: i32) -> LinkOpError {
    if let Some(last) = k.log.last_mut() {
        let _ = write!(last, " -> errno {errno}");
    }
    kernel_error(line, side, errno)
}

fn find_by_index(k: &Kernel, side: Side, index: u32) -> Option<(SideKey, String)> {
    k.links.iter().find(|((s, _), l)| *s == key(side) && l.index == index).map(|(k, _)| k.clone())
}

fn mac_text(mac: Option<MacAddr>) -> String {
    mac.map_or_else(|| "-".to_owned(), |m| m.to_string())
}

impl LinkPort for FakeKernel {
    async fn link(&self, side: Side, name: &str) -> Result<Option<LinkState>, LinkOpError> {
        let k = self.inner.lock().unwrap();
        if side == Side::Pod && k.netns_gone {
            return Err(LinkOpError::NetnsGone { path: "/run/netns/gone".to_owned() });
        }
        if let Some(errno) = k.fail_lookups.filter(|_| side == Side::Pod) {
            return Err(kernel_error(&format!("RTM_GETLINK {name}"), side, errno));
        }
        Ok(k.links.get(&(key(side), name.to_owned())).cloned())
    }

    async fn create_child(
        &self,
        kind: ChildKind,
        parent_index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        let line =
            format!("create {kind} {name} parent={parent_index} mtu={mtu} mac={}", mac_text(mac));
        let mut k = self.call(Side::Pod, line.clone())?;
        if k.links.contains_key(&(SideKey::Pod, name.to_owned())) {
            return Err(refuse(&mut k, &line, Side::Pod, EEXIST));
        }
        let index = k.next_index;
        k.next_index += 1;
        let generated = Some(MacAddr([6, 0, 0, 0, 0, u8::try_from(index).unwrap()]));
        let mac = match kind {
            ChildKind::Macvlan { .. } => mac.or(generated),
            // As `ipvlan_link_new`: the child takes the parent's address, whatever was asked.
            ChildKind::Ipvlan { .. } => k
                .links
                .iter()
                .find(|((side, _), link)| *side == SideKey::Host && link.index == parent_index)
                .map_or(generated, |(_, parent)| parent.mac),
        };
        k.links.insert(
            (SideKey::Pod, name.to_owned()),
            LinkState { index, name: name.to_owned(), mac, mtu, alias: None },
        );
        Ok(())
    }

    async fn create_vlan(
        &self,
        parent_index: u32,
        name: &str,
        id: u16,
        alias: &str,
    ) -> Result<(), LinkOpError> {
        let line = format!("create vlan {name} parent={parent_index} id={id}");
        let mut k = self.call(Side::Host, line.clone())?;
        if k.links.contains_key(&(SideKey::Host, name.to_owned())) {
            return Err(refuse(&mut k, &line, Side::Host, EEXIST));
        }
        let index = k.next_index;
        k.next_index += 1;
        k.links.insert(
            (SideKey::Host, name.to_owned()),
            LinkState {
                index,
                name: name.to_owned(),
                mac: None,
                mtu: 1500,
                alias: Some(alias.to_owned()),
            },
        );
        Ok(())
    }

    async fn move_to_pod(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
        alias: &str,
    ) -> Result<(), LinkOpError> {
        let line =
            format!("move {index} to pod as {name} mtu={mtu} mac={} alias={alias}", mac_text(mac));
        let mut k = self.call(Side::Host, line.clone())?;
        let host_key = find_by_index(&k, Side::Host, index)
            .ok_or(ENODEV)
            .map_err(|errno| refuse(&mut k, &line, Side::Host, errno))?;
        let mut moved = k.links.remove(&host_key).unwrap();
        // A netns move may change the index: model that.
        moved.index += 100;
        if k.links.contains_key(&(SideKey::Pod, name.to_owned())) {
            // As do_setlink: moved under the current name with the new MTU, then the rename
            // fails.
            moved.mtu = mtu;
            k.links.insert((SideKey::Pod, moved.name.clone()), moved);
            return Err(refuse(&mut k, &line, Side::Host, EEXIST));
        }
        name.clone_into(&mut moved.name);
        moved.mtu = mtu;
        moved.mac = mac.or(moved.mac);
        moved.alias = Some(alias.to_owned());
        k.links.insert((SideKey::Pod, name.to_owned()), moved);
        Ok(())
    }

    async fn move_to_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        let line = format!("move {index} to host as {name} mtu={mtu} mac={}", mac_text(mac));
        let mut k = self.call(Side::Pod, line.clone())?;
        let pod_key = find_by_index(&k, Side::Pod, index)
            .ok_or(ENODEV)
            .map_err(|errno| refuse(&mut k, &line, Side::Pod, errno))?;
        let mut moved = k.links.remove(&pod_key).unwrap();
        k.addresses.retain(|(i, _)| *i != index);
        k.routes.retain(|(i, _)| *i != index);
        moved.index -= 100;
        name.clone_into(&mut moved.name);
        moved.mtu = mtu;
        moved.mac = mac.or(moved.mac);
        moved.alias = None;
        k.links.insert((SideKey::Host, name.to_owned()), moved);
        Ok(())
    }

    async fn restore_in_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        let line = format!("restore {index} in host as {name} mtu={mtu} mac={}", mac_text(mac));
        let mut k = self.call(Side::Host, line.clone())?;
        let host_key = find_by_index(&k, Side::Host, index)
            .ok_or(ENODEV)
            .map_err(|errno| refuse(&mut k, &line, Side::Host, errno))?;
        let mut moved = k.links.remove(&host_key).unwrap();
        name.clone_into(&mut moved.name);
        moved.mtu = mtu;
        moved.mac = mac.or(moved.mac);
        moved.alias = None;
        k.links.insert((SideKey::Host, name.to_owned()), moved);
        Ok(())
    }

    async fn delete_link(&self, side: Side, index: u32) -> Result<(), LinkOpError> {
        let line = format!("delete {side} link {index}");
        let mut k = self.call(side, line.clone())?;
        let link_key = find_by_index(&k, side, index)
            .ok_or(ENODEV)
            .map_err(|errno| refuse(&mut k, &line, side, errno))?;
        k.links.remove(&link_key);
        k.addresses.retain(|(i, _)| *i != index);
        k.routes.retain(|(i, _)| *i != index);
        Ok(())
    }

    async fn pod_config(&self, index: u32) -> Result<PodLinkConfig, LinkOpError> {
        let k = self.inner.lock().unwrap();
        if k.netns_gone {
            return Err(LinkOpError::NetnsGone { path: "/run/netns/gone".to_owned() });
        }
        Ok(PodLinkConfig {
            up: k.up.contains(&index),
            addresses: k.addresses.iter().filter(|(i, _)| *i == index).map(|(_, a)| *a).collect(),
            routes: k.routes.iter().filter(|(i, _)| *i == index).map(|(_, r)| r.clone()).collect(),
        })
    }

    async fn add_address(
        &self,
        index: u32,
        address: IpNetwork,
        nodad: bool,
    ) -> Result<(), LinkOpError> {
        let line = format!("add address {address} on {index}{}", if nodad { " nodad" } else { "" });
        let mut k = self.call(Side::Pod, line.clone())?;
        if k.addresses.contains(&(index, address)) {
            return Err(refuse(&mut k, &line, Side::Pod, EEXIST));
        }
        k.addresses.push((index, address));
        Ok(())
    }

    async fn delete_address(&self, index: u32, address: IpNetwork) -> Result<(), LinkOpError> {
        let line = format!("delete address {address} on {index}");
        let mut k = self.call(Side::Pod, line.clone())?;
        let before = k.addresses.len();
        k.addresses.retain(|entry| *entry != (index, address));
        if before == k.addresses.len() {
            return Err(refuse(&mut k, &line, Side::Pod, EADDRNOTAVAIL));
        }
        Ok(())
    }

    async fn set_up(&self, index: u32, up: bool) -> Result<(), LinkOpError> {
        let mut k =
            self.call(Side::Pod, format!("set {index} {}", if up { "up" } else { "down" }))?;
        k.up.retain(|i| *i != index);
        if up {
            k.up.push(index);
        }
        Ok(())
    }

    async fn add_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        let line = format!("add route {} dev {index}", RouteDisplay(route));
        let mut k = self.call(Side::Pod, line.clone())?;
        if k.routes
            .iter()
            .any(|(_, r)| r.destination == route.destination && r.metric == route.metric)
        {
            return Err(refuse(&mut k, &line, Side::Pod, EEXIST));
        }
        if let Some(gateway) = route.gateway
            && !k.addresses.iter().any(|(i, a)| *i == index && a.contains(gateway))
        {
            return Err(refuse(&mut k, &line, Side::Pod, ENETUNREACH));
        }
        k.routes.push((index, route.clone()));
        Ok(())
    }

    async fn delete_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        let line = format!("delete route {} dev {index}", RouteDisplay(route));
        let mut k = self.call(Side::Pod, line.clone())?;
        let before = k.routes.len();
        k.routes.retain(|(i, r)| !(*i == index && r == route));
        if before == k.routes.len() {
            return Err(refuse(&mut k, &line, Side::Pod, ESRCH));
        }
        Ok(())
    }

    async fn rdma_device(&self, side: Side, name: &str) -> Result<Option<u32>, LinkOpError> {
        let k = self.inner.lock().unwrap();
        if side == Side::Pod && k.netns_gone {
            return Err(LinkOpError::NetnsGone { path: "/run/netns/gone".to_owned() });
        }
        Ok(k.rdma.get(name).filter(|(s, _)| *s == key(side)).map(|(_, index)| *index))
    }

    async fn move_rdma(&self, from: Side, index: u32) -> Result<(), LinkOpError> {
        let line = format!("move rdma {index} from {from}");
        let mut k = self.call(from, line.clone())?;
        let Some((side, _)) = k.rdma.values_mut().find(|(s, i)| *s == key(from) && *i == index)
        else {
            return Err(refuse(&mut k, &line, from, ENODEV));
        };
        *side = match from {
            Side::Host => SideKey::Pod,
            Side::Pod => SideKey::Host,
        };
        Ok(())
    }

    async fn apply_batch(&self, requests: &[PodRequest<'_>]) -> Vec<Result<(), LinkOpError>> {
        self.inner.lock().unwrap().batches.push(requests.len());
        apply_sequentially(self, requests).await
    }
}
