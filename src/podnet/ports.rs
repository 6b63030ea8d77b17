//! The one capability `podnet::apply` needs from the kernel: link, address and route
//! operations in the host netns and in one pod netns ([`LinkPort`]), with errors that keep the
//! errno. The real implementation is `host::netlink::NetlinkOps`.

use std::future::Future;
use std::sync::Arc;

use ipnetwork::IpNetwork;

use crate::model::network_config::{MacAddr, Route};

use super::plan::ChildKind;

mod batch;
mod routing;

pub use batch::{PodRequest, apply_sequentially};
pub use routing::{ENOENT, RoutingPort, VrfState};

/// Which network namespace an operation addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The node's netns (where the daemon runs).
    Host,
    /// The pod's netns.
    Pod,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Host => "host",
            Side::Pod => "pod",
        })
    }
}

/// A link as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    /// Interface index in its netns.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// Hardware address, when the link has an Ethernet one.
    pub mac: Option<MacAddr>,
    /// MTU.
    pub mtu: u32,
    /// `IFLA_IFALIAS`, when set.
    pub alias: Option<String>,
}

/// `EEXIST`: a link name, address or route that already exists.
pub const EEXIST: i32 = 17;
/// `ENODEV`: no such link.
pub const ENODEV: i32 = 19;
/// `ENETUNREACH`: a route's gateway is not reachable through the interface.
pub const ENETUNREACH: i32 = 101;
/// `EADDRNOTAVAIL`: an address or route to delete is not there.
pub const EADDRNOTAVAIL: i32 = 99;
/// `ESRCH`: a route to delete is not there.
pub const ESRCH: i32 = 3;

/// Why a netns path was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NetnsRefusal {
    /// The path is a symbolic link (runtimes bind-mount netns files; a link is planted).
    #[error("a symbolic link (netns paths are bind mounts)")]
    Symlink,
    /// Not a file of the namespace file system (a FIFO, a regular file, a directory).
    #[error("not a namespace file (nsfs)")]
    NotNsfs,
    /// A namespace of another kind.
    #[error("not a network namespace")]
    NotNetwork,
    /// The daemon's own network namespace: the pod's addresses and routes would land on
    /// the host.
    #[error("the daemon's own network namespace")]
    DaemonOwn,
}

/// Why one kernel operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkOpError {
    /// The kernel refused the request.
    #[error("{op} in the {side} netns: {message} (errno {errno})")]
    Kernel {
        /// The operation (`RTM_NEWLINK macvlan net1`).
        op: String,
        /// Where it ran.
        side: Side,
        /// The positive errno.
        errno: i32,
        /// `strerror` of the errno.
        message: String,
    },
    /// The netlink exchange failed without an errno (decode error, closed socket).
    #[error("{op} in the {side} netns: {message}")]
    Protocol {
        /// The operation.
        op: String,
        /// Where it ran.
        side: Side,
        /// The library's message.
        message: String,
    },
    /// A link the operation needs does not exist.
    #[error("no link named {name} in the {side} netns")]
    NoSuchLink {
        /// Where it was looked up.
        side: Side,
        /// The name.
        name: String,
    },
    /// An RDMA device the operation needs is not visible in that netns.
    #[error("no RDMA device named {name} in the {side} netns")]
    NoSuchRdmaDevice {
        /// Where it was looked up.
        side: Side,
        /// The name.
        name: String,
    },
    /// The pod's netns no longer exists (the sandbox was torn down).
    #[error("the pod netns {path} is gone")]
    NetnsGone {
        /// Its path.
        path: String,
    },
    /// A netns path (from the runtime) that must not be used: not a network namespace, or
    /// the daemon's own.
    #[error("netns {path}: refused: {reason}")]
    NotPodNetns {
        /// The path.
        path: String,
        /// Why.
        reason: NetnsRefusal,
    },
    /// Opening or entering a netns failed.
    #[error("netns {path}: {source}")]
    Netns {
        /// Its path.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl LinkOpError {
    /// The kernel's errno, when the kernel refused.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            LinkOpError::Kernel { errno, .. } => Some(*errno),
            LinkOpError::Netns { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// What a pod link carries, as the kernel reports it: read back after a restart to tell a
/// finished attach from a half-done one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodLinkConfig {
    /// `IFF_UP` is set.
    pub up: bool,
    /// Every address on the link.
    pub addresses: Vec<IpNetwork>,
    /// Every main-table route through the link (the kernel's metric filled in).
    pub routes: Vec<Route>,
}

/// Kernel operations on the host netns and one pod netns. Links are addressed by index once
/// known; names are resolved with [`LinkPort::link`].
pub trait LinkPort: RoutingPort + Sync {
    /// The link named `name` on `side`, or `None` when there is none.
    fn link(
        &self,
        side: Side,
        name: &str,
    ) -> impl Future<Output = Result<Option<LinkState>, LinkOpError>> + Send;

    /// Up state, addresses and routes of pod link `index`.
    fn pod_config(
        &self,
        index: u32,
    ) -> impl Future<Output = Result<PodLinkConfig, LinkOpError>> + Send;

    /// Creates a child of host link `parent_index` directly in the pod netns with its final
    /// name, MTU and MAC.
    fn create_child(
        &self,
        kind: ChildKind,
        parent_index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Creates the VLAN sub-interface `name` (id `id`) of host link `parent_index` in the host
    /// netns, up, with alias `alias` (set after the create: the kernel ignores an alias in
    /// the creating message; a failure to set it deletes the link again).
    fn create_vlan(
        &self,
        parent_index: u32,
        name: &str,
        id: u16,
        alias: &str,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Moves host link `index` into the pod netns as `name`, with MTU, MAC and alias, in one
    /// message.
    fn move_to_pod(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
        alias: &str,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Moves pod link `index` back to the host netns: down, renamed `name`, MTU, MAC, alias
    /// cleared, in one message.
    fn move_to_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Restores a host link the kernel returned from a destroyed pod netns under its pod-side
    /// name: down, renamed `name`, MTU, MAC, alias cleared.
    fn restore_in_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Deletes link `index` on `side`.
    fn delete_link(
        &self,
        side: Side,
        index: u32,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Adds `address` to pod link `index`; `nodad` sets `IFA_F_NODAD`.
    fn add_address(
        &self,
        index: u32,
        address: IpNetwork,
        nodad: bool,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Removes `address` from pod link `index`.
    fn delete_address(
        &self,
        index: u32,
        address: IpNetwork,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Sets pod link `index` up or down.
    fn set_up(&self, index: u32, up: bool) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Adds `route` through pod link `index` (fails with `EEXIST` when it exists).
    fn add_route(
        &self,
        index: u32,
        route: &Route,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Removes `route` through pod link `index`.
    fn delete_route(
        &self,
        index: u32,
        route: &Route,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// The index of RDMA device `name` as `side`'s netns sees it (in exclusive RDMA netns
    /// mode a device is visible in its own netns only), or `None` when it sees none.
    fn rdma_device(
        &self,
        side: Side,
        name: &str,
    ) -> impl Future<Output = Result<Option<u32>, LinkOpError>> + Send;

    /// Moves RDMA device `index` (as `from` sees it) into the other side's netns
    /// (`RDMA_NLDEV_CMD_SET` with `RDMA_NLDEV_NET_NS_FD`, sent in `from`).
    fn move_rdma(
        &self,
        from: Side,
        index: u32,
    ) -> impl Future<Output = Result<(), LinkOpError>> + Send;

    /// Runs pod-side `requests` in order, every one attempted whatever the others' results
    /// (issue 36: one result per request, the caller undoes the successes). The real port
    /// pipelines them (sent back to back, acks read after); the default awaits each single
    /// call in turn ([`apply_sequentially`]).
    fn apply_batch(
        &self,
        requests: &[PodRequest<'_>],
    ) -> impl Future<Output = Vec<Result<(), LinkOpError>>> + Send {
        apply_sequentially(self, requests)
    }
}

/// A shared kernel handle is one too (the attach service hands out one per pod netns).
impl<T: LinkPort + Send> LinkPort for Arc<T> {
    async fn link(&self, side: Side, name: &str) -> Result<Option<LinkState>, LinkOpError> {
        (**self).link(side, name).await
    }

    async fn pod_config(&self, index: u32) -> Result<PodLinkConfig, LinkOpError> {
        (**self).pod_config(index).await
    }

    async fn create_child(
        &self,
        kind: ChildKind,
        parent_index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        (**self).create_child(kind, parent_index, name, mtu, mac).await
    }

    async fn create_vlan(
        &self,
        parent_index: u32,
        name: &str,
        id: u16,
        alias: &str,
    ) -> Result<(), LinkOpError> {
        (**self).create_vlan(parent_index, name, id, alias).await
    }

    async fn move_to_pod(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
        alias: &str,
    ) -> Result<(), LinkOpError> {
        (**self).move_to_pod(index, name, mtu, mac, alias).await
    }

    async fn move_to_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        (**self).move_to_host(index, name, mtu, mac).await
    }

    async fn restore_in_host(
        &self,
        index: u32,
        name: &str,
        mtu: u32,
        mac: Option<MacAddr>,
    ) -> Result<(), LinkOpError> {
        (**self).restore_in_host(index, name, mtu, mac).await
    }

    async fn delete_link(&self, side: Side, index: u32) -> Result<(), LinkOpError> {
        (**self).delete_link(side, index).await
    }

    async fn add_address(
        &self,
        index: u32,
        address: IpNetwork,
        nodad: bool,
    ) -> Result<(), LinkOpError> {
        (**self).add_address(index, address, nodad).await
    }

    async fn delete_address(&self, index: u32, address: IpNetwork) -> Result<(), LinkOpError> {
        (**self).delete_address(index, address).await
    }

    async fn set_up(&self, index: u32, up: bool) -> Result<(), LinkOpError> {
        (**self).set_up(index, up).await
    }

    async fn add_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        (**self).add_route(index, route).await
    }

    async fn delete_route(&self, index: u32, route: &Route) -> Result<(), LinkOpError> {
        (**self).delete_route(index, route).await
    }

    async fn rdma_device(&self, side: Side, name: &str) -> Result<Option<u32>, LinkOpError> {
        (**self).rdma_device(side, name).await
    }

    async fn move_rdma(&self, from: Side, index: u32) -> Result<(), LinkOpError> {
        (**self).move_rdma(from, index).await
    }

    async fn apply_batch(&self, requests: &[PodRequest<'_>]) -> Vec<Result<(), LinkOpError>> {
        (**self).apply_batch(requests).await
    }
}
