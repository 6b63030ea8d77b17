//! A pod netns's NETLINK_ROUTE sockets (rtnetlink's and the pipelined batches'), made on a
//! thread of their own while the attach goes on without them.
//!
//! A socket belongs to the netns of the thread that created it, so each pod's sockets cost a
//! thread that enters the netns (`setns` only on such a dedicated thread). Most of an attach's
//! start needs no pod socket: the plan, the pod record and the link's creation or move, which
//! goes through the host socket with the netns given by file descriptor (`IFLA_NET_NS_FD`). So
//! the thread is started as soon as the netns file is open and checked, and the first pod-side
//! request waits for its answer: the thread's start, `setns` and the two sockets (a median of
//! ~0.15 ms on the 2-core machine, decision 0010) overlap the host-side work instead of
//! preceding it (issue 36).
//!
//! The checks that refuse a path run before the thread starts, on the caller's thread: gone, a
//! symlink, not nsfs, the daemon's own netns. One is left to the thread: whether the nsfs file
//! is a *network* namespace, which only `setns` with `CLONE_NEWNET` tells without an `ioctl`
//! (`NS_GET_NSTYPE`, which needs `unsafe`). Nothing is lost by that: the kernel refuses any
//! other namespace wherever a netns is handed to it by descriptor (`get_net_ns_by_fd` answers
//! `EINVAL`), so a link is never created or moved into one, and the requests that hand it over
//! report the thread's refusal by name ([`PodSockets::refusal`]).

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use rtnetlink::Handle;
use tokio::sync::{Mutex, OnceCell, oneshot};

use super::netlink_batch::BatchSocket;
use super::netns_file::{open_netns_file, same_namespace};
use crate::podnet::ports::{LinkOpError, NetnsRefusal};

/// What the thread sends back: rtnetlink's connection (to be spawned) and handle, and the
/// batch socket, all bound to the pod netns.
type Made =
    (rtnetlink::proto::Connection<netlink_packet_route::RouteNetlinkMessage>, Handle, BatchSocket);

/// One pod netns: its file, at once, and its sockets, once the thread has made them.
pub(super) struct PodSockets {
    path: PathBuf,
    netns: File,
    /// The thread's answer, awaited by the first pod-side request (behind an async lock, so a
    /// request cancelled while it waits leaves the answer to the next one).
    pending: Mutex<oneshot::Receiver<Result<Made, ThreadFailure>>>,
    made: OnceCell<Result<Sockets, ThreadFailure>>,
}

impl std::fmt::Debug for PodSockets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodSockets")
            .field("path", &self.path)
            .field("netns", &self.netns)
            .field("made", &self.made)
            .finish_non_exhaustive()
    }
}

/// The pod's sockets.
#[derive(Debug)]
struct Sockets {
    handle: Handle,
    batch: BatchSocket,
}

/// Why the thread made no sockets, kept to be reported to every pod-side request.
#[derive(Debug)]
struct ThreadFailure {
    step: Step,
    errno: Option<i32>,
    message: String,
}

/// Where the thread failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// `setns` into the file: `EINVAL` there means a namespace of another kind.
    Enter,
    /// Making the sockets inside the netns.
    Sockets,
    /// The thread ended without an answer.
    Lost,
}

impl ThreadFailure {
    fn new(step: Step, err: &io::Error) -> Self {
        Self { step, errno: err.raw_os_error(), message: err.to_string() }
    }
}

impl PodSockets {
    /// Opens and checks the netns at `path` and starts the thread making its sockets. `host`
    /// is the daemon's own netns, which a pod's path must not be (a runtime bug or a forged
    /// event would otherwise put the pod's addresses and routes on the host).
    pub(super) fn open(path: &Path, host: &File) -> Result<Self, LinkOpError> {
        let display = || path.display().to_string();
        let netns = open_netns_file(path)?;
        let own = same_namespace(&netns, host)
            .map_err(|errno| LinkOpError::Netns { path: display(), source: errno.into() })?;
        if own {
            return Err(LinkOpError::NotPodNetns {
                path: display(),
                reason: NetnsRefusal::DaemonOwn,
            });
        }
        let for_thread =
            netns.try_clone().map_err(|source| LinkOpError::Netns { path: display(), source })?;
        let runtime = tokio::runtime::Handle::current();
        let (sender, receiver) = oneshot::channel();
        std::thread::Builder::new()
            .name("netns-socket".to_owned())
            .spawn(move || {
                let made =
                    nix::sched::setns(for_thread.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|errno| ThreadFailure::new(Step::Enter, &errno.into()))
                        .and_then(|()| {
                            // The sockets register with the runtime's reactor: it needs a
                            // context here.
                            let _entered = runtime.enter();
                            let failed = |err| ThreadFailure::new(Step::Sockets, &err);
                            let (connection, handle, _) =
                                rtnetlink::new_connection().map_err(failed)?;
                            Ok((connection, handle, BatchSocket::new().map_err(failed)?))
                        });
                // The receiver is gone only when the attach ended without a pod-side request.
                let _ignored = sender.send(made);
                // The thread ends here, with its netns: it never runs anything else.
            })
            .map_err(|source| LinkOpError::Netns { path: display(), source })?;
        Ok(Self {
            path: path.to_owned(),
            netns,
            pending: Mutex::new(receiver),
            made: OnceCell::new(),
        })
    }

    /// The pod netns (for `IFLA_NET_NS_FD`, and for threads that must enter it).
    pub(super) fn netns(&self) -> &File {
        &self.netns
    }

    /// rtnetlink's handle in the pod netns.
    pub(super) async fn handle(&self) -> Result<&Handle, LinkOpError> {
        Ok(&self.sockets().await?.handle)
    }

    /// The pod netns's batch socket (`super::netlink_batch`).
    pub(super) async fn batch(&self) -> Result<&BatchSocket, LinkOpError> {
        Ok(&self.sockets().await?.batch)
    }

    /// When the path is not a network namespace (the thread's `setns` refused it), that
    /// refusal by name: what a host-side request that handed the netns to the kernel reports
    /// instead of the kernel's bare `EINVAL`.
    pub(super) async fn refusal(&self) -> Option<LinkOpError> {
        match self.sockets().await {
            Err(refused @ LinkOpError::NotPodNetns { .. }) => Some(refused),
            _ => None,
        }
    }

    async fn sockets(&self) -> Result<&Sockets, LinkOpError> {
        let made = self
            .made
            .get_or_init(|| async {
                let mut pending = self.pending.lock().await;
                match (&mut *pending).await {
                    Ok(Ok((connection, handle, batch))) => {
                        tokio::spawn(connection);
                        Ok(Sockets { handle, batch })
                    }
                    Ok(Err(failure)) => Err(failure),
                    Err(_) => Err(ThreadFailure {
                        step: Step::Lost,
                        errno: None,
                        message: "the netns thread ended without an answer".to_owned(),
                    }),
                }
            })
            .await;
        made.as_ref().map_err(|failure| {
            let path = self.path.display().to_string();
            match (failure.step, failure.errno) {
                (Step::Enter, Some(nix::libc::EINVAL)) => {
                    LinkOpError::NotPodNetns { path, reason: NetnsRefusal::NotNetwork }
                }
                (_, Some(errno)) => {
                    LinkOpError::Netns { path, source: io::Error::from_raw_os_error(errno) }
                }
                (_, None) => {
                    LinkOpError::Netns { path, source: io::Error::other(failure.message.clone()) }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `PodSockets` whose thread is played by the test through the returned sender.
    fn played(path: &str) -> (PodSockets, oneshot::Sender<Result<Made, ThreadFailure>>) {
        let (sender, receiver) = oneshot::channel();
        let sockets = PodSockets {
            path: PathBuf::from(path),
            netns: File::open("/proc/self/ns/net").unwrap(),
            pending: Mutex::new(receiver),
            made: OnceCell::new(),
        };
        (sockets, sender)
    }

    #[tokio::test]
    async fn a_request_cancelled_while_the_thread_works_leaves_its_answer_to_the_next() {
        let (pod, thread) = played("/run/netns/p");
        let waited = tokio::time::timeout(std::time::Duration::from_millis(20), pod.handle()).await;
        assert!(waited.is_err(), "nothing answered yet");
        let refused = io::Error::from_raw_os_error(nix::libc::EINVAL);
        assert!(thread.send(Err(ThreadFailure::new(Step::Enter, &refused))).is_ok());
        match pod.refusal().await {
            Some(LinkOpError::NotPodNetns { reason: NetnsRefusal::NotNetwork, path }) => {
                assert_eq!(path, "/run/netns/p");
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_thread_without_an_answer_fails_every_request_alike_and_is_no_refusal() {
        let (pod, thread) = played("/run/netns/q");
        drop(thread);
        for _ in 0..2 {
            match pod.batch().await {
                Err(LinkOpError::Netns { path, source }) => {
                    assert_eq!(path, "/run/netns/q");
                    assert!(source.to_string().contains("without an answer"), "{source}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(pod.refusal().await.is_none(), "not a refusal of the path");
    }

    #[tokio::test]
    async fn sockets_that_could_not_be_made_report_their_errno() {
        let (pod, thread) = played("/run/netns/r");
        let exhausted = io::Error::from_raw_os_error(nix::libc::EMFILE);
        assert!(thread.send(Err(ThreadFailure::new(Step::Sockets, &exhausted))).is_ok());
        match pod.handle().await {
            Err(LinkOpError::Netns { source, .. }) => {
                assert_eq!(source.raw_os_error(), Some(nix::libc::EMFILE));
            }
            other => panic!("{other:?}"),
        }
    }
}
