//! Device health's watch of a NIC inside a pod ([`PodLinkSource`]): a NETLINK_ROUTE socket
//! subscribed to link notifications, created on a dedicated OS thread that entered the pod's
//! netns (the socket stays bound to that netns; no tokio worker calls `setns`), reading the
//! link by its pod-side name at start, after every link notification and every
//! 10 s (notifications can be lost when the socket's buffer overflows). The socket is
//! released when the monitor stops watching (the NIC left the pod).

use std::fs::File;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use netlink_packet_route::link::LinkMessage;
use rtnetlink::{Handle, MulticastGroup};

use super::discovery::interface_from_link;
use super::netns_file::{open_netns_file, same_namespace};
use crate::health::{LinkFacts, LinkObservation, LinkReporter, MovedNic, PodLinkSource};
use crate::podnet::LinkOpError;

/// Re-read of the watched link without a notification.
const RECHECK: Duration = Duration::from_secs(10);

/// Why a pod link watch could not start.
#[derive(Debug, thiserror::Error)]
pub enum PodLinkError {
    /// The daemon's own netns could not be opened (at construction).
    #[error("opening the daemon's network namespace {path}")]
    OwnNetns {
        /// `/proc/thread-self/ns/net`.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The pod's netns file could not be opened or is not a namespace.
    #[error(transparent)]
    Netns(#[from] LinkOpError),
    /// The path names the daemon's own netns: a moved NIC is never there.
    #[error("{path} is the daemon's own network namespace, not a pod's")]
    DaemonOwn {
        /// The netns path.
        path: PathBuf,
    },
    /// Entering the netns or opening the socket failed.
    #[error("opening a netlink socket in {path}")]
    Socket {
        /// The netns path.
        path: PathBuf,
        /// The OS error (`setns`, `socket`, `bind`).
        #[source]
        source: std::io::Error,
    },
    /// The first read of the pod's links failed.
    #[error("reading the links in {path}")]
    Dump {
        /// The netns path.
        path: PathBuf,
        /// The netlink error.
        #[source]
        source: rtnetlink::Error,
    },
}

/// [`PodLinkSource`] over rtnetlink; remembers the daemon's netns to refuse it as a pod's.
#[derive(Debug, Clone)]
pub struct PodLinkWatcher {
    own_netns: Arc<File>,
}

impl PodLinkWatcher {
    /// A watcher for a daemon running in the calling thread's netns.
    pub fn current() -> Result<Self, PodLinkError> {
        let path = PathBuf::from("/proc/thread-self/ns/net");
        let own = File::open(&path).map_err(|source| PodLinkError::OwnNetns { path, source })?;
        Ok(Self { own_netns: Arc::new(own) })
    }
}

impl PodLinkSource for PodLinkWatcher {
    type Error = PodLinkError;

    async fn watch(&self, nic: &MovedNic, reporter: LinkReporter) -> Result<(), PodLinkError> {
        let path = nic.netns.clone();
        let netns = open_netns_file(&path)?;
        if same_namespace(&netns, &self.own_netns)
            .map_err(|errno| PodLinkError::Socket { path: path.clone(), source: errno.into() })?
        {
            return Err(PodLinkError::DaemonOwn { path });
        }
        // The socket is created inside the pod's netns on a fresh OS thread; its connection
        // task then runs on this runtime.
        let runtime = tokio::runtime::Handle::current();
        let (sender, receiver) = tokio::sync::oneshot::channel();
        let socket_error = |source| PodLinkError::Socket { path: path.clone(), source };
        std::thread::Builder::new()
            .name("netns-linkwatch".to_owned())
            .spawn(move || {
                let result = (|| {
                    nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(std::io::Error::from)?;
                    // The socket registers with the runtime's reactor: it needs a context.
                    let _entered = runtime.enter();
                    rtnetlink::new_multicast_connection(&[MulticastGroup::Link])
                })();
                // The receiver only goes away when the caller was cancelled.
                let _ignored = sender.send(result);
                // The thread ends here, with its netns: it never runs anything else.
            })
            .map_err(socket_error)?;
        let (connection, handle, mut messages) = receiver
            .await
            .map_err(|_| {
                socket_error(std::io::Error::other("the netns thread ended without an answer"))
            })?
            .map_err(socket_error)?;
        let driver = tokio::spawn(connection);
        let if_name = nic.if_name.clone();
        match read_link(&handle, &if_name).await {
            Ok(observation) => reporter.report(observation),
            Err(source) => {
                driver.abort();
                return Err(PodLinkError::Dump { path, source });
            }
        }
        tokio::spawn(async move {
            let mut recheck = tokio::time::interval(RECHECK);
            recheck.tick().await;
            loop {
                tokio::select! {
                    () = reporter.closed() => break,
                    message = messages.next() => if message.is_none() {
                        reporter.report(LinkObservation::Unreadable(format!(
                            "the netlink socket in {} closed", path.display()
                        )));
                        break;
                    },
                    _ = recheck.tick() => {}
                }
                // Drain what queued up meanwhile: one read covers them all.
                while messages.try_recv().is_ok() {}
                match read_link(&handle, &if_name).await {
                    Ok(observation) => reporter.report(observation),
                    Err(err) => {
                        reporter.report(LinkObservation::Unreadable(format!(
                            "reading the links in {} failed: {err}",
                            path.display()
                        )));
                        break;
                    }
                }
            }
            // Ends the connection task and closes the socket.
            driver.abort();
        });
        Ok(())
    }
}

/// The state of link `name` in the socket's netns.
async fn read_link(handle: &Handle, name: &str) -> Result<LinkObservation, rtnetlink::Error> {
    let links: Vec<LinkMessage> = handle.link().get().execute().try_collect().await?;
    Ok(links
        .iter()
        .filter_map(interface_from_link)
        .find(|interface| interface.name == name)
        .map_or(LinkObservation::Absent, |interface| {
            LinkObservation::Present(LinkFacts::of(&interface))
        }))
}
