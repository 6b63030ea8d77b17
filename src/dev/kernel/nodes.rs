//! The kernel side of `netclaim dev --nodes N` (DESIGN §8): each node is a network namespace
//! of its own with an uplink veth into one bridge, and runs its node daemon as a child process
//! inside that netns and in a mount namespace with the node's own sysfs (as `ip netns exec`
//! does), so `/sys/class/net` shows the node's links.
//!
//! - [`share_mounts_below`]: the run dir becomes a shared mount (bind on itself, as `ip netns`
//!   does for `/run/netns`), so the namespace pins made below it later (pods' netns) propagate
//!   into every node's mount namespace, and their removal too.
//! - [`Fabric`]: a netns of the cluster's own holding the bridge; [`Fabric::attach`] creates
//!   a node's uplink: a veth whose bridge end stays in the fabric and whose other end is
//!   created directly inside the node's netns as [`UPLINK`] (names are per netns, so every
//!   node's uplink has the same name). Nothing is created in the host's own netns.
//! - [`create_node_netns`]: a pinned netns with loopback up.
//! - [`bind_loopback_in`]: a TCP listener on 127.0.0.1 inside a node's netns (a socket keeps
//!   the netns it was created in), so a process there can reach a server of the host process.
//! - [`spawn_in_node`]: a dedicated OS thread enters the node's netns, unshares its mount
//!   namespace (`/` made a recursive slave, a fresh sysfs on `/sys`), spawns the command (the
//!   child inherits both namespaces of the thread) and waits for it; [`NodeProcess`] reports
//!   the exit and sends signals.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use ipnetwork::IpNetwork;
use netlink_packet_route::link::{InfoData, InfoVeth};
use rtnetlink::{Handle, LinkBridge, LinkUnspec, LinkVeth};
use tokio::sync::watch;

use crate::host::netlink::link_by_name;
use crate::host::netns::{self, NetnsError};

/// The name of every node's uplink inside its own netns.
pub const UPLINK: &str = "uplink0";
/// The bridge inside the fabric netns.
const BRIDGE: &str = "br0";

/// Errors building, entering or removing the nodes' namespaces and links.
#[derive(Debug, thiserror::Error)]
pub enum DevNodesError {
    /// A namespace could not be made, entered or removed.
    #[error(transparent)]
    Netns(#[from] NetnsError),
    /// A netlink request failed.
    #[error("{op}: {message}")]
    Netlink {
        /// The request (`RTM_NEWLINK veth port1 peer uplink0`).
        op: String,
        /// The kernel's answer.
        message: String,
    },
    /// A mount syscall failed.
    #[error("{call} {path}: {source}")]
    Mount {
        /// `mount(MS_BIND)`, `mount(MS_SHARED)`, `umount2(MNT_DETACH)`.
        call: &'static str,
        /// The mount point.
        path: PathBuf,
        /// The errno.
        #[source]
        source: nix::errno::Errno,
    },
    /// A listener inside a node's netns could not be bound.
    #[error("listening on 127.0.0.1:{port} in {netns}: {source}")]
    Listen {
        /// The node's netns pin.
        netns: PathBuf,
        /// The port.
        port: u16,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Entering the node's namespaces or spawning the process failed.
    #[error("starting {program} in {netns}: {step}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// The node's netns pin.
        netns: PathBuf,
        /// `setns(CLONE_NEWNET)`, `unshare(CLONE_NEWNS)`, `mounting sysfs`, `spawn`.
        step: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A blocking task or thread died.
    #[error("a namespace thread failed: {0}")]
    Thread(String),
}

fn netlink(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> DevNodesError {
    let op = op.into();
    move |err| DevNodesError::Netlink { op, message: err.to_string() }
}

/// Bind-mounts `dir` on itself and makes the mount shared, so mounts made below it later
/// propagate into mount namespaces copied from this one after this call (and unmounts too).
pub fn share_mounts_below(dir: &Path) -> Result<(), DevNodesError> {
    use nix::mount::{MsFlags, mount};
    let error = |call| move |source| DevNodesError::Mount { call, path: dir.to_owned(), source };
    mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
        .map_err(error("mount(MS_BIND)"))?;
    if let Err(err) = mount(None::<&str>, dir, None::<&str>, MsFlags::MS_SHARED, None::<&str>)
        .map_err(error("mount(MS_SHARED)"))
    {
        let _ignored = nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH);
        return Err(err);
    }
    Ok(())
}

/// Undoes [`share_mounts_below`] (and detaches whatever is still mounted below). A dir that
/// is not a mount point is fine.
pub fn unshare_mounts_below(dir: &Path) -> Result<(), DevNodesError> {
    match nix::mount::umount2(dir, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
        Err(source) => {
            Err(DevNodesError::Mount { call: "umount2(MNT_DETACH)", path: dir.to_owned(), source })
        }
    }
}

/// Creates the netns of a node pinned at `dir/name`, with loopback up (its daemon's API
/// client and metrics use it).
pub async fn create_node_netns(dir: &Path, name: &str) -> Result<PathBuf, DevNodesError> {
    let (dir, owned) = (dir.to_owned(), name.to_owned());
    let path = tokio::task::spawn_blocking(move || netns::create(&dir, &owned))
        .await
        .map_err(|e| DevNodesError::Thread(e.to_string()))??;
    if let Err(err) = crate::host::netlink::loopback_up(&path).await {
        let _ignored = netns::remove(&path);
        return Err(DevNodesError::Netlink {
            op: format!("setting lo up in {}", path.display()),
            message: err.to_string(),
        });
    }
    Ok(path)
}

/// Removes a node's netns (and with it its uplink). Blocking.
pub fn remove_node_netns(path: &Path) -> Result<(), DevNodesError> {
    Ok(netns::remove(path)?)
}

/// A TCP listener on `127.0.0.1:<port>` inside the netns at `netns_path` (non-blocking, ready
/// for `tokio::net::TcpListener::from_std`). Blocking.
pub fn bind_loopback_in(
    netns_path: &Path,
    port: u16,
) -> Result<std::net::TcpListener, DevNodesError> {
    let path = netns_path.to_owned();
    let bound = netns::run_in(netns_path, move || {
        let listener = std::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port))?;
        listener.set_nonblocking(true)?;
        Ok::<_, std::io::Error>(listener)
    })?;
    bound.map_err(|source| DevNodesError::Listen { netns: path, port, source })
}

/// The bridge's netns, removed by [`Fabric::remove`] (which takes the bridge, every port and,
/// with the ports, every node's uplink along).
#[derive(Debug)]
pub struct Fabric {
    netns: PathBuf,
    handle: Handle,
    bridge: u32,
}

impl Fabric {
    /// Creates the fabric's netns pinned at `dir/name` and a bridge in it, up; `address`
    /// (optional) goes on the bridge, as a router on the shared segment would have one.
    pub async fn create(
        dir: &Path,
        name: &str,
        address: Option<IpNetwork>,
    ) -> Result<Self, DevNodesError> {
        let (owned_dir, owned) = (dir.to_owned(), name.to_owned());
        let netns = tokio::task::spawn_blocking(move || netns::create(&owned_dir, &owned))
            .await
            .map_err(|e| DevNodesError::Thread(e.to_string()))??;
        match Self::build(&netns, address).await {
            Ok(fabric) => Ok(fabric),
            Err(err) => {
                let _ignored = netns::remove(&netns);
                Err(err)
            }
        }
    }

    async fn build(netns: &Path, address: Option<IpNetwork>) -> Result<Self, DevNodesError> {
        let (handle, _file) = crate::host::netlink::open_in_netns(netns).await.map_err(|e| {
            DevNodesError::Netlink {
                op: format!("netlink socket in {}", netns.display()),
                message: e.to_string(),
            }
        })?;
        handle
            .link()
            .add(LinkBridge::new(BRIDGE).build())
            .execute()
            .await
            .map_err(netlink(format!("RTM_NEWLINK bridge {BRIDGE}")))?;
        let bridge = link_index(&handle, BRIDGE).await?;
        if let Some(address) = address {
            handle
                .address()
                .add(bridge, address.ip(), address.prefix())
                .execute()
                .await
                .map_err(netlink(format!("RTM_NEWADDR {address} on {BRIDGE}")))?;
        }
        for (index, name) in [(1, "lo"), (bridge, BRIDGE)] {
            handle
                .link()
                .set(LinkUnspec::new_with_index(index).up().build())
                .execute()
                .await
                .map_err(netlink(format!("setting {name} up in the fabric")))?;
        }
        Ok(Self { netns: netns.to_owned(), handle, bridge })
    }

    /// The fabric's netns pin.
    #[must_use]
    pub fn netns(&self) -> &Path {
        &self.netns
    }

    /// Gives the node whose netns is `node_netns` its uplink: a veth whose end `port<index>`
    /// joins the bridge and whose other end is created inside the node's netns as [`UPLINK`];
    /// both ends up.
    pub async fn attach(&self, index: usize, node_netns: &Path) -> Result<(), DevNodesError> {
        let port = format!("port{index}");
        let node_file = File::open(node_netns).map_err(|source| {
            DevNodesError::Netns(NetnsError::Io {
                action: "opening",
                path: node_netns.to_owned(),
                source,
            })
        })?;
        // The peer is made in the node's netns at once (IFLA_NET_NS_FD in the peer's
        // attributes, as `ip link add ... type veth peer name uplink0 netns <ns>`), so the
        // same peer name never meets itself in the fabric.
        let peer = LinkUnspec::new_with_name(UPLINK).setns_by_fd(node_file.as_raw_fd()).build();
        let message = LinkVeth::new(&port, UPLINK)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        self.handle
            .link()
            .add(message)
            .execute()
            .await
            .map_err(netlink(format!("RTM_NEWLINK veth {port} peer {UPLINK}")))?;
        let port_index = link_index(&self.handle, &port).await?;
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(port_index).controller(self.bridge).up().build())
            .execute()
            .await
            .map_err(netlink(format!("enslaving {port} to {BRIDGE}")))?;
        let (inside, _file) =
            crate::host::netlink::open_in_netns(node_netns).await.map_err(|e| {
                DevNodesError::Netlink {
                    op: format!("netlink socket in {}", node_netns.display()),
                    message: e.to_string(),
                }
            })?;
        let uplink = link_index(&inside, UPLINK).await?;
        inside
            .link()
            .set(LinkUnspec::new_with_index(uplink).up().build())
            .execute()
            .await
            .map_err(netlink(format!("setting {UPLINK} up in {}", node_netns.display())))?;
        Ok(())
    }

    /// Removes the fabric's netns (the bridge and every port go with it, and with each port
    /// its peer, a node's uplink). Blocking.
    pub fn remove(self) -> Result<(), DevNodesError> {
        remove_fabric(&self.netns)
    }
}

/// Removes a fabric netns by its pin (for cleanup after a start that failed half-way).
/// Blocking.
pub fn remove_fabric(path: &Path) -> Result<(), DevNodesError> {
    Ok(netns::remove(path)?)
}

async fn link_index(handle: &Handle, name: &str) -> Result<u32, DevNodesError> {
    let link =
        link_by_name(handle, name, &[]).await.map_err(netlink(format!("RTM_GETLINK {name}")))?;
    link.map(|l| l.header.index).ok_or_else(|| DevNodesError::Netlink {
        op: format!("RTM_GETLINK {name}"),
        message: "no such link".to_owned(),
    })
}

/// A node daemon process started by [`spawn_in_node`].
#[derive(Debug)]
pub struct NodeProcess {
    pid: nix::unistd::Pid,
    exited: watch::Receiver<Option<ExitStatus>>,
}

impl NodeProcess {
    /// Its process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid.as_raw().unsigned_abs()
    }

    /// Its exit status once it has ended.
    #[must_use]
    pub fn exit_status(&self) -> Option<ExitStatus> {
        *self.exited.borrow()
    }

    /// A receiver that changes to `Some(status)` when the process ends.
    #[must_use]
    pub fn exited(&self) -> watch::Receiver<Option<ExitStatus>> {
        self.exited.clone()
    }

    /// Sends `signal` unless the process has already ended. (Between the exit and the
    /// waiting thread's report the pid is reaped: a signal then could reach a reused pid,
    /// which needs the whole pid space to wrap within that window.)
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if self.exit_status().is_none() {
            let _ignored = nix::sys::signal::kill(self.pid, signal);
        }
    }

    /// SIGTERM, then SIGKILL if it has not ended within `grace`; returns its exit status
    /// (`None` if it did not end even after SIGKILL within another `grace`).
    pub async fn stop(&self, grace: std::time::Duration) -> Option<ExitStatus> {
        let mut exited = self.exited.clone();
        for signal in [nix::sys::signal::SIGTERM, nix::sys::signal::SIGKILL] {
            self.signal(signal);
            if let Ok(Ok(status)) =
                tokio::time::timeout(grace, exited.wait_for(Option::is_some)).await
            {
                return *status;
            }
        }
        None
    }
}

/// Starts `command` inside the node's netns (`netns_path`) and a mount namespace of its own
/// in which `/` is a recursive slave of the host's (mounts below a shared run dir still
/// arrive) and `/sys` is a fresh sysfs of that netns. A dedicated OS thread enters the
/// namespaces, spawns the child (which inherits them) and stays to reap it; no other code
/// ever runs on that thread. Staying matters beyond reaping: a child's parent-death signal
/// (`prctl(PR_SET_PDEATHSIG)`, which the node daemon sets, `host::parent_death`) fires when
/// the *thread* that forked it exits, so this thread must live as long as the child does.
pub fn spawn_in_node(
    netns_path: &Path,
    mut command: std::process::Command,
) -> Result<NodeProcess, DevNodesError> {
    let program = command.get_program().to_string_lossy().into_owned();
    let netns = netns_path.to_owned();
    let spawn_error = {
        let (program, netns) = (program.clone(), netns.clone());
        move |step, source| DevNodesError::Spawn {
            program: program.clone(),
            netns: netns.clone(),
            step,
            source,
        }
    };
    let file = File::open(netns_path).map_err(|e| spawn_error("opening the netns", e))?;
    let (started_tx, started_rx) = std::sync::mpsc::channel();
    let (exited_tx, exited) = watch::channel(None);
    let thread_error = spawn_error.clone();
    std::thread::Builder::new()
        .name("dev-node".to_owned())
        .spawn(move || {
            let entered = enter_node_namespaces(&file).map_err(|(step, e)| thread_error(step, e));
            drop(file);
            let child = entered
                .and_then(|()| command.spawn().map_err(|source| thread_error("spawn", source)));
            let mut child = match child {
                Ok(child) => child,
                Err(err) => {
                    let _ignored = started_tx.send(Err(err));
                    return;
                }
            };
            let _ignored = started_tx.send(Ok(child.id()));
            // The thread ends with the child: with it goes the last task in this mount
            // namespace besides the child, so the namespace (and its sysfs) is freed.
            let status = child.wait();
            exited_tx.send_replace(Some(status.unwrap_or_else(|_| {
                // wait(2) fails only for a child that is not ours: report it as ended with
                // exit code 1 (the wait status encodes the code in bits 8-15).
                std::os::unix::process::ExitStatusExt::from_raw(1 << 8)
            })));
        })
        .map_err(|source| spawn_error("spawning the namespace thread", source))?;
    let pid = started_rx
        .recv()
        .map_err(|_| DevNodesError::Thread(format!("the namespace thread for {program} died")))??;
    let pid =
        i32::try_from(pid).map_err(|_| DevNodesError::Thread(format!("pid {pid} out of range")))?;
    Ok(NodeProcess { pid: nix::unistd::Pid::from_raw(pid), exited })
}

/// On the calling thread (for good): enters the netns of `netns`, unshares the mount
/// namespace, makes `/` a recursive slave and mounts a fresh sysfs on `/sys` (read-only when
/// the host's is), as `ip netns exec` does.
fn enter_node_namespaces(netns: &File) -> Result<(), (&'static str, std::io::Error)> {
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    use nix::sched::{CloneFlags, setns, unshare};
    setns(netns, CloneFlags::CLONE_NEWNET).map_err(|e| ("setns(CLONE_NEWNET)", e.into()))?;
    // CLONE_NEWNS implies CLONE_FS: this thread gets its own root and cwd too, and the rest
    // of the process keeps the host's mount namespace.
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| ("unshare(CLONE_NEWNS)", e.into()))?;
    // Mounts made here (the sysfs) stay here; the host's keep arriving.
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_SLAVE, None::<&str>)
        .map_err(|e| ("making / a recursive slave", e.into()))?;
    let read_only = nix::sys::statvfs::statvfs("/sys")
        .is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
    umount2("/sys", MntFlags::MNT_DETACH).map_err(|e| ("unmounting /sys", e.into()))?;
    let flags = if read_only { MsFlags::MS_RDONLY } else { MsFlags::empty() };
    // sysfs shows the network devices of the netns of the task that mounts it.
    mount(Some("sysfs"), "/sys", Some("sysfs"), flags, None::<&str>)
        .map_err(|e| ("mounting sysfs on /sys", e.into()))?;
    Ok(())
}
