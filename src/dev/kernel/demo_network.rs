//! The demo's network: a veth pair with generated names whose host end is the shared parent
//! the node daemon publishes, and whose peer sits in a namespace of its own carrying the
//! peer address (so the demo never adds an address or route to the host's own netns, and two
//! demos can run side by side).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use futures::TryStreamExt as _;
use ipnetwork::IpNetwork;
use rtnetlink::{Handle, LinkUnspec, LinkVeth};

use crate::host::netlink::link_by_name;
use crate::host::netns::{self, NetnsError};

/// Errors building or removing the demo network.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// The peer namespace could not be made or removed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A netlink request failed.
    #[error("{op}: {message}")]
    Netlink {
        /// The request (`RTM_NEWLINK veth ncd12345p`).
        op: String,
        /// The kernel's answer.
        message: String,
    },
    /// A blocking task panicked.
    #[error("the netns task failed: {0}")]
    Task(#[source] tokio::task::JoinError),
}

fn netlink(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> TopologyError {
    let op = op.into();
    move |err| TopologyError::Netlink { op, message: err.to_string() }
}

/// Names of the demo's links and namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyNames {
    /// Host end: the shared parent.
    pub parent: String,
    /// Peer end, inside the peer namespace.
    pub peer: String,
}

impl TopologyNames {
    /// Names from a random tag: `ncd<tag>p` and `ncd<tag>g` (≤ 15 bytes for a 6-char tag).
    #[must_use]
    pub fn new(tag: &str) -> Self {
        Self { parent: format!("ncd{tag}p"), peer: format!("ncd{tag}g") }
    }

    /// The prefix every demo link name of this run starts with.
    #[must_use]
    pub fn prefix(&self) -> &str {
        self.parent.strip_suffix('p').unwrap_or(&self.parent)
    }
}

/// The demo network, removed by [`Topology::remove`].
#[derive(Debug)]
pub struct Topology {
    /// Link names.
    pub names: TopologyNames,
    /// The peer's namespace.
    pub peer_netns: PathBuf,
    /// The peer's address (with prefix).
    pub peer_address: IpNetwork,
    host: Handle,
}

impl Topology {
    /// Creates the pair, moves the peer into a new namespace pinned in `dir`, gives it
    /// `peer_address` and brings both ends up. Half-built state is removed on error.
    pub async fn create(
        dir: &Path,
        names: TopologyNames,
        peer_address: IpNetwork,
    ) -> Result<Self, TopologyError> {
        let (connection, host, _) = rtnetlink::new_connection().map_err(|e| {
            TopologyError::Netlink { op: "opening a netlink socket".into(), message: e.to_string() }
        })?;
        tokio::spawn(connection);
        let dir = dir.to_owned();
        let peer_netns = tokio::task::spawn_blocking(move || netns::create(&dir, "peer"))
            .await
            .map_err(TopologyError::Task)??;
        let topology = Self { names, peer_netns, peer_address, host };
        if let Err(err) = topology.build().await {
            topology.remove().await;
            return Err(err);
        }
        Ok(topology)
    }

    async fn build(&self) -> Result<(), TopologyError> {
        let TopologyNames { parent, peer } = &self.names;
        self.host
            .link()
            .add(LinkVeth::new(parent, peer).up().build())
            .execute()
            .await
            .map_err(netlink(format!("RTM_NEWLINK veth {parent} peer {peer}")))?;
        let netns_file =
            std::fs::File::open(&self.peer_netns).map_err(|e| TopologyError::Netlink {
                op: format!("opening {}", self.peer_netns.display()),
                message: e.to_string(),
            })?;
        let peer_index = link_index(&self.host, peer).await?;
        {
            use std::os::fd::AsRawFd as _;
            let message =
                LinkUnspec::new_with_index(peer_index).setns_by_fd(netns_file.as_raw_fd()).build();
            self.host
                .link()
                .set(message)
                .execute()
                .await
                .map_err(netlink(format!("moving {peer} into the peer netns")))?;
        }
        let (inside, _netns) = crate::host::netlink::open_in_netns(&self.peer_netns)
            .await
            .map_err(|e| TopologyError::Netlink {
                op: "netlink socket in the peer netns".into(),
                message: e.to_string(),
            })?;
        let index = link_index(&inside, peer).await?;
        inside
            .address()
            .add(index, self.peer_address.ip(), self.peer_address.prefix())
            .execute()
            .await
            .map_err(netlink(format!("RTM_NEWADDR {} on {peer}", self.peer_address)))?;
        for (link, name) in [(index, peer.as_str()), (1, "lo")] {
            inside
                .link()
                .set(LinkUnspec::new_with_index(link).up().build())
                .execute()
                .await
                .map_err(netlink(format!("setting {name} up in the peer netns")))?;
        }
        Ok(())
    }

    /// The peer's address without prefix (the ping target).
    #[must_use]
    pub fn peer_ip(&self) -> IpAddr {
        self.peer_address.ip()
    }

    /// Deletes the pair (deleting one end deletes both) and the peer namespace. Best effort:
    /// errors are logged, every step is tried.
    pub async fn remove(&self) {
        if let Ok(index) = link_index(&self.host, &self.names.parent).await
            && let Err(err) = self.host.link().del(index).execute().await
        {
            tracing::warn!(link = %self.names.parent, %err, "deleting the demo's veth");
        }
        let path = self.peer_netns.clone();
        match tokio::task::spawn_blocking(move || netns::remove(&path)).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "removing the demo's peer netns"),
            Err(err) => tracing::warn!(%err, "removing the demo's peer netns"),
        }
    }
}

async fn link_index(handle: &Handle, name: &str) -> Result<u32, TopologyError> {
    let link =
        link_by_name(handle, name, &[]).await.map_err(netlink(format!("RTM_GETLINK {name}")))?;
    link.map(|l| l.header.index).ok_or_else(|| TopologyError::Netlink {
        op: format!("RTM_GETLINK {name}"),
        message: "no such link".to_owned(),
    })
}

/// Deletes every host link whose name starts with `prefix` (best effort, logged).
pub async fn remove_links_with_prefix(prefix: &str) {
    let Ok(names) = links_with_prefix(prefix).await else { return };
    let Ok((connection, handle, _)) = rtnetlink::new_connection() else { return };
    let task = tokio::spawn(connection);
    for name in names {
        if let Ok(index) = link_index(&handle, &name).await
            && let Err(err) = handle.link().del(index).execute().await
        {
            tracing::warn!(link = %name, %err, "deleting a demo link");
        }
    }
    task.abort();
}

/// Host links whose name starts with `prefix` (the clean-host check after the demo).
pub async fn links_with_prefix(prefix: &str) -> Result<Vec<String>, TopologyError> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(|e| {
        TopologyError::Netlink { op: "opening a netlink socket".into(), message: e.to_string() }
    })?;
    let task = tokio::spawn(connection);
    let mut names = Vec::new();
    let mut links = handle.link().get().execute();
    while let Some(link) = links.try_next().await.map_err(netlink("RTM_GETLINK dump"))? {
        for attribute in link.attributes {
            if let netlink_packet_route::link::LinkAttribute::IfName(name) = attribute
                && name.starts_with(prefix)
            {
                names.push(name);
            }
        }
    }
    task.abort();
    Ok(names)
}
