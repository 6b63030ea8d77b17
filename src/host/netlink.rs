//! `podnet::LinkPort` over rtnetlink: one NETLINK_ROUTE socket in the host netns and one in the
//! pod netns, the latter created on a dedicated OS thread that entered the pod netns (a socket
//! stays bound to the netns it was created in, so no tokio worker ever calls `setns`).

use std::fs::File;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use ipnetwork::IpNetwork;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    IpVlanFlags as NlIpVlanFlags, IpVlanMode as NlIpVlanMode, LinkAttribute, LinkExtentMask,
    LinkFlags, LinkMessage, MacVlanMode as NlMacVlanMode,
};
use netlink_packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{
    AddressMessageBuilder, Handle, LinkIpVlan, LinkMacVlan, LinkUnspec, LinkVlan,
    RouteMessageBuilder,
};

use super::netlink_batch::{BatchSocket, open_in_netns_with};
use super::netlink_dump::{DumpError, DumpSocket};
use super::pod_sockets::PodSockets;
use crate::model::network_config::{IpvlanFlag, IpvlanMode, MacAddr, MacvlanMode, Route};
use crate::podnet::plan::ChildKind;
use crate::podnet::ports::{
    LinkOpError, LinkPort, LinkState, NetnsRefusal, PodLinkConfig, PodRequest, Side,
};

/// `EEXIST`: a link (or an altname) already has the name.
const EEXIST: i32 = 17;
/// Renames a NIC returning to the host tries again after dropping its own altname, while
/// udev may still be adding it: at most this many times.
const RESTORE_NAME_ATTEMPTS: u32 = 10;
/// The pause between those tries.
const RESTORE_NAME_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The daemon's netlink socket in the host netns and a handle on that netns (the target of
/// moves back). One per daemon; cheap to clone.
#[derive(Clone, Debug)]
pub struct HostNetlink {
    handle: Handle,
    netns: Arc<File>,
    /// Link lookups without a connection task (`super::netlink_batch`).
    batch: Arc<BatchSocket>,
    /// The reconcile's link dump, read a datagram at a time (`super::netlink_dump`).
    dumps: Arc<tokio::sync::Mutex<DumpSocket>>,
}

impl HostNetlink {
    /// The netns of the calling thread (the daemon's, i.e. the host's). Must run inside a
    /// tokio runtime, which drives the socket.
    pub fn current() -> Result<Self, LinkOpError> {
        let path = PathBuf::from("/proc/thread-self/ns/net");
        let netns = File::open(&path)
            .map_err(|source| LinkOpError::Netns { path: path.display().to_string(), source })?;
        let (connection, handle, _) = rtnetlink::new_connection()
            .map_err(|source| LinkOpError::Netns { path: path.display().to_string(), source })?;
        let (batch, dumps) = batch_and_dump_sockets()
            .map_err(|source| LinkOpError::Netns { path: path.display().to_string(), source })?;
        tokio::spawn(connection);
        Ok(Self::from_parts(handle, netns, batch, dumps))
    }

    fn from_parts(handle: Handle, netns: File, batch: BatchSocket, dumps: DumpSocket) -> Self {
        Self {
            handle,
            netns: Arc::new(netns),
            batch: Arc::new(batch),
            dumps: Arc::new(tokio::sync::Mutex::new(dumps)),
        }
    }

    /// Another netns standing in for the host (tests and benchmarks build the node's
    /// topology in a throwaway netns).
    pub async fn in_netns(path: &Path) -> Result<Self, LinkOpError> {
        let (handle, (batch, dumps), netns) =
            open_in_netns_with(path, batch_and_dump_sockets).await?;
        Ok(Self::from_parts(handle, netns, batch, dumps))
    }

    /// The rtnetlink handle on the host netns.
    #[must_use]
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Every link of the host netns (name, index, MTU, MAC, alias).
    pub async fn links(&self) -> Result<Vec<LinkState>, LinkOpError> {
        // Statistics left out (RTEXT_FILTER_SKIP_STATS): `link_state` reads none, and with a
        // host veth per pod they were most of each message's decoding; each message reduced
        // as it is read (issue 36).
        let mut request = LinkMessage::default();
        request.attributes.push(LinkAttribute::ExtMask(vec![LinkExtentMask::SkipStats]));
        let op = "RTM_GETLINK dump";
        self.dumps
            .lock()
            .await
            .dump(RouteNetlinkMessage::GetLink(request), |message| match message {
                RouteNetlinkMessage::NewLink(link) => Some(link_state(&link)),
                _ => None,
            })
            .await
            .map_err(|err| match err {
                DumpError::Kernel(errno) => LinkOpError::Kernel {
                    op: op.to_owned(),
                    side: Side::Host,
                    errno,
                    message: std::io::Error::from_raw_os_error(errno).to_string(),
                },
                other => LinkOpError::Protocol {
                    op: op.to_owned(),
                    side: Side::Host,
                    message: other.to_string(),
                },
            })
    }
}

/// The pipelined-batch and dump sockets of the calling thread's netns.
fn batch_and_dump_sockets() -> std::io::Result<(BatchSocket, DumpSocket)> {
    Ok((BatchSocket::new()?, DumpSocket::new()?))
}

/// The link named `name` in `handle`'s netns: one `RTM_GETLINK` by name (`IFLA_IFNAME`), its
/// first answer. `ext_mask` asks for more in that answer (`IFLA_EXT_MASK`, e.g. the VF list of
/// a PF); empty sends no mask. The kernel answers a name it does not have with `ENODEV` (an
/// error, not `None`); each caller maps errors to its own, so this returns rtnetlink's.
pub(crate) async fn link_by_name(
    handle: &Handle,
    name: &str,
    ext_mask: &[LinkExtentMask],
) -> Result<Option<LinkMessage>, rtnetlink::Error> {
    let mut request = handle.link().get().match_name(name.to_owned());
    if !ext_mask.is_empty() {
        request.message_mut().attributes.push(LinkAttribute::ExtMask(ext_mask.to_vec()));
    }
    request.execute().try_next().await
}

/// `(rx_dropped, tx_dropped)` of each of `names` in the netns at `path` (`IFLA_STATS64`), one
/// socket for all of them; `None` for a name the netns does not have.
pub async fn link_drops(
    path: &Path,
    names: &[String],
) -> Result<Vec<Option<(u64, u64)>>, LinkOpError> {
    let (handle, _netns) = open_in_netns(path).await?;
    let links: Vec<LinkMessage> = handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|err| op_error("RTM_GETLINK dump", Side::Pod, err))?;
    Ok(names
        .iter()
        .map(|name| {
            let message = links.iter().find(|link| {
                link.attributes.iter().any(|a| matches!(a, LinkAttribute::IfName(n) if n == name))
            })?;
            message.attributes.iter().find_map(|a| match a {
                LinkAttribute::Stats64(stats) => Some((stats.rx_dropped, stats.tx_dropped)),
                _ => None,
            })
        })
        .collect())
}

/// `ip link set lo up` inside the netns at `path`, as a CNI runtime does for every pod.
pub async fn loopback_up(path: &Path) -> Result<(), LinkOpError> {
    let (handle, _netns) = open_in_netns(path).await?;
    // Loopback is always ifindex 1 in a fresh namespace.
    let message = rtnetlink::LinkUnspec::new_with_index(1).up().build();
    handle
        .link()
        .set(message)
        .execute()
        .await
        .map_err(|err| op_error("RTM_NEWLINK lo up", Side::Pod, err))
}

/// Opens `path` and creates a NETLINK_ROUTE socket inside that netns on a fresh OS thread; the
/// socket's connection task then runs on the caller's tokio runtime.
pub async fn open_in_netns(path: &Path) -> Result<(Handle, File), LinkOpError> {
    let (handle, (), netns) = open_in_netns_with(path, || Ok(())).await?;
    Ok((handle, netns))
}

/// [`LinkPort`] for one pod: the host socket plus two sockets in the pod's netns (rtnetlink's,
/// and the one of pipelined batches), made while the host-side work goes on
/// (`super::pod_sockets`).
#[derive(Debug)]
pub struct NetlinkOps {
    host: HostNetlink,
    pod: Option<PodSockets>,
    pod_path: PathBuf,
}

impl NetlinkOps {
    /// For an attach: the pod netns must exist, and be a netns other than the daemon's.
    #[allow(
        clippy::unused_async,
        reason = "async so that it runs inside the runtime its sockets register with"
    )]
    pub async fn open(host: &HostNetlink, pod_netns: &Path) -> Result<Self, LinkOpError> {
        let pod = PodSockets::open(pod_netns, &host.netns)?;
        Ok(Self { host: host.clone(), pod: Some(pod), pod_path: pod_netns.to_owned() })
    }

    /// For a detach: a pod netns that is already gone is fine (pod-side operations then
    /// report [`LinkOpError::NetnsGone`], which detach treats as "the kernel cleaned up").
    #[allow(
        clippy::unused_async,
        reason = "async so that it runs inside the runtime its sockets register with"
    )]
    pub async fn open_for_detach(
        host: &HostNetlink,
        pod_netns: &Path,
    ) -> Result<Self, LinkOpError> {
        let pod = match PodSockets::open(pod_netns, &host.netns) {
            Ok(pod) => Some(pod),
            // A path that no longer holds a namespace mount (the runtime unmounted it and
            // left the file) is a netns that is gone as far as this pod is concerned.
            Err(
                LinkOpError::NetnsGone { .. }
                | LinkOpError::NotPodNetns { reason: NetnsRefusal::NotNsfs, .. },
            ) => None,
            Err(err) => return Err(err),
        };
        Ok(Self { host: host.clone(), pod, pod_path: pod_netns.to_owned() })
    }

    /// For host-side work only (restoring a returned device): pod-side operations report
    /// [`LinkOpError::NetnsGone`].
    #[must_use]
    pub fn host_only(host: &HostNetlink) -> Self {
        Self { host: host.clone(), pod: None, pod_path: PathBuf::new() }
    }

    pub(super) async fn handle(&self, side: Side) -> Result<&Handle, LinkOpError> {
        match side {
            Side::Host => Ok(&self.host.handle),
            Side::Pod => self.pod()?.handle().await,
        }
    }

    /// The pod's sockets, or [`LinkOpError::NetnsGone`] when its netns was gone at the open.
    fn pod(&self) -> Result<&PodSockets, LinkOpError> {
        self.pod
            .as_ref()
            .ok_or_else(|| LinkOpError::NetnsGone { path: self.pod_path.display().to_string() })
    }

    /// The host netns' batch socket (`super::netlink_batch`).
    pub(super) fn host_batch_socket(&self) -> &BatchSocket {
        &self.host.batch
    }

    /// The pod netns' batch socket (`super::netlink_batch`).
    pub(super) async fn batch_socket(&self) -> Result<&BatchSocket, LinkOpError> {
        self.pod()?.batch().await
    }

    /// The netns file of `side` (for the RDMA socket of `super::rdma_move`).
    fn netns_file(&self, side: Side) -> Result<&File, LinkOpError> {
        match side {
            Side::Host => Ok(&self.host.netns),
            Side::Pod => self.pod_netns(),
        }
    }

    /// The pod netns (for threads that must enter it: `host::routing`).
    pub(super) fn pod_netns(&self) -> Result<&File, LinkOpError> {
        Ok(self.pod()?.netns())
    }

    fn pod_fd(&self) -> Result<i32, LinkOpError> {
        Ok(self.pod_netns()?.as_raw_fd())
    }

    /// `err` of a host-side request that handed the pod netns to the kernel by descriptor:
    /// when the kernel's `EINVAL` is the netns itself (not a network namespace, which the
    /// pod's socket thread finds: `super::pod_sockets`), that refusal by name instead.
    async fn pod_refusal_or(&self, err: LinkOpError) -> LinkOpError {
        if let LinkOpError::Kernel { errno: nix::libc::EINVAL, .. } = err
            && let Some(pod) = &self.pod
            && let Some(refused) = pod.refusal().await
        {
            return refused;
        }
        err
    }
}

/// Maps an rtnetlink error to ours, keeping the errno.
pub(super) fn op_error(op: impl Into<String>, side: Side, err: rtnetlink::Error) -> LinkOpError {
    match err {
        rtnetlink::Error::NetlinkError(message) if message.raw_code() != 0 => {
            let errno = -message.raw_code();
            LinkOpError::Kernel {
                op: op.into(),
                side,
                errno,
                message: std::io::Error::from_raw_os_error(errno).to_string(),
            }
        }
        other => LinkOpError::Protocol { op: op.into(), side, message: other.to_string() },
    }
}

pub(super) fn link_state(message: &LinkMessage) -> LinkState {
    let mut state = LinkState {
        index: message.header.index,
        name: String::new(),
        mac: None,
        mtu: 0,
        alias: None,
    };
    for attribute in &message.attributes {
        match attribute {
            LinkAttribute::IfName(name) => state.name.clone_from(name),
            LinkAttribute::Mtu(mtu) => state.mtu = *mtu,
            LinkAttribute::IfAlias(alias) if !alias.is_empty() => state.alias = Some(alias.clone()),
            LinkAttribute::Address(bytes) => {
                state.mac = <[u8; 6]>::try_from(bytes.as_slice()).ok().map(MacAddr);
            }
            _ => {}
        }
    }
    state
}

/// The address of an `RTM_NEWADDR` message with its prefix.
fn address_of(message: &AddressMessage) -> Option<IpNetwork> {
    let ip = message.attributes.iter().find_map(|attribute| match attribute {
        AddressAttribute::Address(ip) => Some(*ip),
        _ => None,
    })?;
    IpNetwork::new(ip, message.header.prefix_len).ok()
}

/// A main-table unicast route through link `index`, as the plan writes routes.
fn route_of(message: &RouteMessage, index: u32) -> Option<Route> {
    if !super::discovery::is_main_unicast(message) {
        return None;
    }
    let ip = |address: &RouteAddress| match address {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    };
    let (mut oif, mut destination, mut gateway, mut metric) = (None, None, None, None);
    for attribute in &message.attributes {
        match attribute {
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Destination(address) => destination = ip(address),
            RouteAttribute::Gateway(address) => gateway = ip(address),
            RouteAttribute::Priority(p) => metric = Some(*p),
            _ => {}
        }
    }
    if oif != Some(index) {
        return None;
    }
    let unspecified = match message.header.address_family {
        AddressFamily::Inet6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    };
    let destination = IpNetwork::new(
        destination.unwrap_or(unspecified),
        message.header.destination_prefix_length,
    )
    .ok()?;
    Some(Route { destination, gateway, metric })
}

fn nl_macvlan_mode(mode: MacvlanMode) -> NlMacVlanMode {
    match mode {
        MacvlanMode::Bridge => NlMacVlanMode::Bridge,
        MacvlanMode::Private => NlMacVlanMode::Private,
        MacvlanMode::Vepa => NlMacVlanMode::Vepa,
        MacvlanMode::Passthru => NlMacVlanMode::Passthrough,
    }
}

fn nl_ipvlan_mode(mode: IpvlanMode) -> NlIpVlanMode {
    match mode {
        IpvlanMode::L2 => NlIpVlanMode::L2,
        IpvlanMode::L3 => NlIpVlanMode::L3,
        IpvlanMode::L3s => NlIpVlanMode::L3S,
    }
}

/// `IFLA_IPVLAN_FLAGS`: bridge is the absence of both flags (`IPVLAN_F_PRIVATE`,
/// `IPVLAN_F_VEPA`; the kernel refuses both at once).
fn nl_ipvlan_flags(flag: IpvlanFlag) -> NlIpVlanFlags {
    match flag {
        IpvlanFlag::Bridge => NlIpVlanFlags::empty(),
        IpvlanFlag::Private => NlIpVlanFlags::Private,
        IpvlanFlag::Vepa => NlIpVlanFlags::Vepa,
    }
}

/// The route message for `route` through link `index`: main table, static protocol, metric as
/// `RTA_PRIORITY`, link scope for an on-link IPv4 route (as `ip route` does).
pub(super) fn route_message(index: u32, route: &Route) -> RouteMessage {
    let prefix = route.destination.prefix();
    match (route.destination.network(), route.gateway) {
        (IpAddr::V4(destination), gateway) => {
            let mut builder = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(destination, prefix)
                .output_interface(index);
            builder = match gateway {
                Some(IpAddr::V4(gateway)) => builder.gateway(gateway),
                Some(IpAddr::V6(via)) => builder.via(via),
                None => builder.scope(RouteScope::Link),
            };
            if let Some(metric) = route.metric {
                builder = builder.priority(metric);
            }
            builder.build()
        }
        (IpAddr::V6(destination), gateway) => {
            let mut builder = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(destination, prefix)
                .output_interface(index);
            if let Some(IpAddr::V6(gateway)) = gateway {
                builder = builder.gateway(gateway);
            }
            if let Some(metric) = route.metric {
                builder = builder.priority(metric);
            }
            builder.build()
        }
    }
}

impl LinkPort for NetlinkOps {
    async fn link(&self, side: Side, name: &str) -> Result<Option<LinkState>, LinkOpError> {
        match side {
            Side::Pod => self.pod_link(name).await,
            Side::Host => self.host_link(name).await,
        }
    }

    async fn pod_config(&self, index: u32) -> Result<PodLinkConfig, LinkOpError> {
        let handle = self.handle(Side::Pod).await?;
        let op = |what: &str| format!("{what} of link {index}");
        let link = handle
            .link()
            .get()
            .match_index(index)
            .execute()
            .try_next()
            .await
            .map_err(|err| op_error(op("RTM_GETLINK"), Side::Pod, err))?;
        let up = link.is_some_and(|m| m.header.flags.contains(LinkFlags::Up));
        let addresses = handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_filter_map(|message| async move { Ok(address_of(&message)) })
            .try_collect()
            .await
            .map_err(|err| op_error(op("RTM_GETADDR dump"), Side::Pod, err))?;
        let mut routes = Vec::new();
        for query in [
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        ] {
            let family: Vec<Route> = handle
                .route()
                .get(query)
                .execute()
                .try_filter_map(|message| async move { Ok(route_of(&message, index)) })
                .try_collect()
                .await
                .map_err(|err| op_error(op("RTM_GETROUTE dump"), Side::Pod, err))?;
            routes.extend(family);
        }
        Ok(PodLinkConfig { up, addresses, routes })
    }

    async fn create_child(
        &self,
        kind: ChildKind,
        parent_index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        let pod_fd = self.pod_fd()?;
        let message = match kind {
            ChildKind::Macvlan { mode } => {
                let mut builder = LinkMacVlan::new(name, parent_index, nl_macvlan_mode(mode))
                    .mtu(mtu)
                    .setns_by_fd(pod_fd);
                if let Some(mac) = mac {
                    builder = builder.address(mac.0.to_vec());
                }
                builder.build()
            }
            // No IFLA_ADDRESS: `ipvlan_link_new` overwrites the child's address with the
            // parent's, so a requested MAC would be dropped silently (the plan never sets
            // one). An MTU above the parent's is refused with EINVAL, as for macvlan.
            ChildKind::Ipvlan { mode, flag } => {
                LinkIpVlan::new(name, parent_index, nl_ipvlan_mode(mode))
                    .flag(nl_ipvlan_flags(flag))
                    .mtu(mtu)
                    .setns_by_fd(pod_fd)
                    .build()
            }
        };
        // Sent on the host socket: IFLA_LINK resolves in the sender's netns.
        let created = self.host.handle.link().add(message).execute().await;
        match created {
            Ok(()) => Ok(()),
            Err(err) => Err(self
                .pod_refusal_or(op_error(format!("RTM_NEWLINK {kind} {name}"), Side::Host, err))
                .await),
        }
    }

    async fn create_vlan(
        &self,
        parent_index: u32,
        name: &str,
        id: u16,
        alias: &str,
    ) -> Result<(), LinkOpError> {
        // The kernel ignores IFLA_IFALIAS when it creates a link (`rtnl_create_link` does
        // not read it; only `do_setlink` does): the alias is set by a second message, which
        // also brings the link up, so a link that is up carries the alias. A crash in between
        // leaves it down and unmarked: foreign to us, never deleted (DESIGN §3).
        let message = LinkVlan::new(name, parent_index, id).build();
        self.host
            .handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_NEWLINK vlan {name}"), Side::Host, err))?;
        let mark = LinkUnspec::new_with_name(name).alias(alias).up().build();
        let marked = self.host.handle.link().set(mark).execute().await;
        if let Err(err) = marked {
            // Not left behind unmarked: it would pass for an administrator's.
            if let Ok(Some(link)) = self.link(Side::Host, name).await {
                let _ignored = self.delete_link(Side::Host, link.index).await;
            }
            return Err(op_error(format!("RTM_NEWLINK alias and up {name}"), Side::Host, err));
        }
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
        let mut builder = LinkUnspec::new_with_index(index)
            .name(name)
            .mtu(mtu)
            .alias(alias)
            .setns_by_fd(self.pod_fd()?);
        if let Some(mac) = mac {
            builder = builder.address(mac.0.to_vec());
        }
        let moved = self.host.handle.link().set(builder.build()).execute().await;
        match moved {
            Ok(()) => Ok(()),
            Err(err) => Err(self
                .pod_refusal_or(op_error(
                    format!("RTM_NEWLINK move {index} as {name}"),
                    Side::Host,
                    err,
                ))
                .await),
        }
    }

    async fn move_to_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        let mut builder = LinkUnspec::new_with_index(index)
            .down()
            .name(name)
            .mtu(mtu)
            // An empty IFLA_IFALIAS clears the alias.
            .alias("")
            .setns_by_fd(self.host.netns.as_raw_fd());
        if let Some(mac) = mac {
            builder = builder.address(mac.0.to_vec());
        }
        self.handle(Side::Pod).await?.link().set(builder.build()).execute().await.map_err(|err| {
            op_error(format!("RTM_NEWLINK move {index} back as {name}"), Side::Pod, err)
        })
    }

    async fn restore_in_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        let restore = || {
            let mut builder =
                LinkUnspec::new_with_index(index).down().name(name).mtu(mtu).alias("");
            if let Some(mac) = mac {
                builder = builder.address(mac.0.to_vec());
            }
            self.host.handle.link().set(builder.build()).execute()
        };
        let op = || format!("RTM_NEWLINK restore {index} as {name}");
        let mut attempt = 0;
        loop {
            let err = match restore().await {
                Ok(()) => return Ok(()),
                Err(err) => op_error(op(), Side::Host, err),
            };
            attempt += 1;
            if err.errno() != Some(EEXIST) || attempt > RESTORE_NAME_ATTEMPTS {
                return Err(err);
            }
            // udev gives a device that comes back to the host netns its predictable name as
            // an altname (systemd's `AlternativeNamesPolicy`, applied on the netdev's "add"
            // uevent, some time after the kernel moved it), and altnames share the name space
            // with names: the rename to that very name fails with EEXIST. The kernel resolves
            // a name lookup through altnames too, so the holder's index says whose it is: our
            // own altname is dropped (the kernel refuses to drop another link's) and the
            // rename tried again; another link's name fails the restore at once.
            match link_by_name(&self.host.handle, name, &[]).await {
                Ok(Some(holder)) if holder.header.index != index => {
                    tracing::warn!(
                        index,
                        name,
                        holder = holder.header.index,
                        "another host link holds the name to restore"
                    );
                    return Err(err);
                }
                Ok(Some(_)) => {
                    let dropped = self
                        .host
                        .handle
                        .link()
                        .property_del(index)
                        .alt_ifname(&[name])
                        .execute()
                        .await;
                    match dropped {
                        Ok(()) => tracing::info!(
                            index,
                            name,
                            "dropped our own altname to restore the host name"
                        ),
                        // Dropped meanwhile by someone else, or re-added: the next try says.
                        Err(drop_err) => tracing::info!(index, name, error = %drop_err,
                            "dropping our own altname failed; trying the rename again"),
                    }
                }
                // The name is free again (it was in flux: udev renaming or a link going):
                // the next rename may pass.
                Ok(None) | Err(_) => {}
            }
            // A short pause: udev works on the uevent meanwhile.
            tokio::time::sleep(RESTORE_NAME_PAUSE).await;
        }
    }

    async fn delete_link(&self, side: Side, index: u32) -> Result<(), LinkOpError> {
        self.handle(side)
            .await?
            .link()
            .del(index)
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_DELLINK {index}"), side, err))
    }

    async fn add_address(
        &self,
        index: u32,
        address: IpNetwork,
        nodad: bool,
    ) -> Result<(), LinkOpError> {
        let mut request =
            self.handle(Side::Pod).await?.address().add(index, address.ip(), address.prefix());
        if nodad {
            request.message_mut().attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        request
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_NEWADDR {address}"), Side::Pod, err))
    }

    async fn delete_address(&self, index: u32, address: IpNetwork) -> Result<(), LinkOpError> {
        let message = match address.ip() {
            IpAddr::V4(ip) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
                .index(index)
                .address(ip, address.prefix())
                .build(),
            IpAddr::V6(ip) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
                .index(index)
                .address(ip, address.prefix())
                .build(),
        };
        self.handle(Side::Pod)
            .await?
            .address()
            .del(message)
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_DELADDR {address}"), Side::Pod, err))
    }

    async fn set_up(&self, index: u32, up: bool) -> Result<(), LinkOpError> {
        let builder = LinkUnspec::new_with_index(index);
        let message = if up { builder.up() } else { builder.down() }.build();
        self.handle(Side::Pod)
            .await?
            .link()
            .set(message)
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_NEWLINK {index} up={up}"), Side::Pod, err))
    }

    async fn add_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        self.handle(Side::Pod)
            .await?
            .route()
            .add(route_message(index, route))
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_NEWROUTE {}", route.destination), Side::Pod, err))
    }

    async fn delete_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        self.handle(Side::Pod)
            .await?
            .route()
            .del(route_message(index, route))
            .execute()
            .await
            .map_err(|err| op_error(format!("RTM_DELROUTE {}", route.destination), Side::Pod, err))
    }

    async fn rdma_device(&self, side: Side, name: &str) -> Result<Option<u32>, LinkOpError> {
        super::rdma_move::device_index(self.netns_file(side)?, side, name).await
    }

    async fn move_rdma(&self, from: Side, index: u32) -> Result<(), LinkOpError> {
        let to = match from {
            Side::Host => Side::Pod,
            Side::Pod => Side::Host,
        };
        super::rdma_move::move_device(self.netns_file(from)?, from, index, self.netns_file(to)?)
            .await
    }

    async fn apply_batch(&self, requests: &[PodRequest<'_>]) -> Vec<Result<(), LinkOpError>> {
        self.send_pod_batch(requests).await
    }
}
