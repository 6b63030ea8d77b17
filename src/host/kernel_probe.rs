//! The start-up probe of the link kinds the node's kernel offers (DESIGN §2): ipvlan, 802.1Q
//! VLAN and VRF links are created and deleted on a veth inside a private, unnamed network
//! namespace that dies with the probe's thread, so the host never sees a probe link and a
//! crash leaves nothing behind. The result is handed to the core as data
//! ([`KernelSupport`]).
//!
//! Asking for a link kind is also how the kernel loads its module: `rtnl_newlink` calls
//! `request_module("rtnl-link-<kind>")` for an unknown `IFLA_INFO_KIND` and answers
//! `EOPNOTSUPP` only when no `rtnl_link_ops` is registered afterwards. That answer is the one
//! that means "missing"; any other failure leaves the kind unknown (accepted at prepare, with
//! the attach's own error if it really fails).

use std::time::Instant;

use netlink_packet_route::link::IpVlanMode;
use rtnetlink::{Handle, LinkIpVlan, LinkVeth, LinkVlan};

use crate::host::netlink::link_by_name;
use crate::model::cause;
use crate::model::support::{KernelSupport, Probe};

/// `EOPNOTSUPP`: `rtnl_newlink` found no link ops for the kind, even after `request_module`.
const EOPNOTSUPP: i32 = 95;
/// The veth pair the children are probed on (names are per netns: the private one is empty).
const PARENT: &str = "probe0";
const PEER: &str = "probe1";
/// Any valid VLAN id (the sub-interface `probe0.7` never carries traffic).
const VLAN_ID: u16 = 7;

/// Why the probe could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The private netns could not be made (the daemon lacks `CAP_SYS_ADMIN`).
    #[error("unshare(CLONE_NEWNET) for the probe: {0}")]
    Unshare(#[source] nix::errno::Errno),
    /// The probe thread or its runtime or socket could not be set up.
    #[error("setting up the probe: {0}")]
    Setup(#[source] std::io::Error),
    /// A netlink request other than the probed one failed.
    #[error("{op}: {source}")]
    Netlink {
        /// The request.
        op: &'static str,
        /// The cause.
        #[source]
        source: rtnetlink::Error,
    },
    /// The probe thread panicked.
    #[error("the probe thread died")]
    Thread,
}

/// Probes ipvlan and 802.1Q VLAN support. Blocking (a thread of its own, tens of
/// milliseconds, more when the kernel loads a module): call from `spawn_blocking` or a plain
/// thread. Never fails: what could not be told is [`Probe::Unknown`] with the reason.
#[must_use]
pub fn probe() -> KernelSupport {
    let started = Instant::now();
    let support = std::thread::Builder::new()
        .name("kernel-probe".to_owned())
        .spawn(probe_in_private_netns)
        .map_err(ProbeError::Setup)
        .and_then(|thread| thread.join().map_err(|_| ProbeError::Thread))
        .and_then(|result| result)
        .unwrap_or_else(|err| {
            let detail = cause::chain(&err);
            KernelSupport {
                ipvlan: Probe::Unknown { detail: detail.clone() },
                vlan: Probe::Unknown { detail: detail.clone() },
                vrf: Probe::Unknown { detail: detail.clone() },
                fq: Probe::Unknown { detail },
            }
        });
    tracing::info!(
        ipvlan = %support.ipvlan,
        vlan = %support.vlan,
        vrf = %support.vrf,
        fq = %support.fq,
        elapsed_ms = started.elapsed().as_millis(),
        "probed the kernel's child link kinds"
    );
    support
}

/// The probe thread: `unshare` moves only this thread into a new netns (it changes the
/// calling thread for good, which is why the thread exists), and the netns is freed with
/// every link in it when the thread's socket closes and the thread ends.
fn probe_in_private_netns() -> Result<KernelSupport, ProbeError> {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).map_err(ProbeError::Unshare)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .map_err(ProbeError::Setup)?;
    runtime.block_on(async {
        let (connection, handle, _) = rtnetlink::new_connection().map_err(ProbeError::Setup)?;
        tokio::spawn(connection);
        handle
            .link()
            .add(LinkVeth::new(PARENT, PEER).build())
            .execute()
            .await
            .map_err(|source| ProbeError::Netlink { op: "creating a veth pair", source })?;
        let parent = index_of(&handle, PARENT).await?;
        let ipvlan = try_kind(
            &handle,
            ("ipvlan", "ipvlan module"),
            "probeipvl",
            LinkIpVlan::new("probeipvl", parent, IpVlanMode::L2).build(),
        )
        .await;
        let vlan = try_kind(
            &handle,
            ("vlan", "8021q module"),
            "probe0.7",
            LinkVlan::new("probe0.7", parent, VLAN_ID).build(),
        )
        .await;
        // A VRF needs no parent; its table id is any free one (the netns is private).
        let vrf = try_kind(
            &handle,
            ("vrf", "vrf module"),
            "probevrf",
            rtnetlink::LinkVrf::new("probevrf", 10).build(),
        )
        .await;
        let fq = super::qdisc::probe_kind(&handle, parent, "fq").await;
        Ok(KernelSupport { ipvlan, vlan, vrf, fq })
    })
}

async fn index_of(handle: &Handle, name: &str) -> Result<u32, ProbeError> {
    let op = "reading the probe's veth";
    let message = link_by_name(handle, name, &[])
        .await
        .map_err(|source| ProbeError::Netlink { op, source })?;
    message
        .map(|m| m.header.index)
        .ok_or(ProbeError::Netlink { op, source: rtnetlink::Error::RequestFailed })
}

/// Creates one link of a kind and deletes it again; the answer to the creation is the probe.
async fn try_kind(
    handle: &Handle,
    (kind, module): (&str, &str),
    name: &str,
    message: netlink_packet_route::link::LinkMessage,
) -> Probe {
    match handle.link().add(message).execute().await {
        Ok(()) => {
            // The netns goes away with the thread anyway; deleting keeps the probe honest
            // about "create and delete" and frees the module's per-netns state early.
            if let Ok(index) = index_of(handle, name).await
                && let Err(err) = handle.link().del(index).execute().await
            {
                tracing::debug!(kind, error = %err, "deleting the probe link");
            }
            Probe::Available
        }
        Err(rtnetlink::Error::NetlinkError(message)) if message.raw_code() == -EOPNOTSUPP => {
            Probe::Missing {
                detail: format!(
                    "creating a link of kind {kind} answered EOPNOTSUPP: no {module} in this kernel"
                ),
            }
        }
        Err(err) => Probe::Unknown { detail: format!("creating a link of kind {kind}: {err}") },
    }
}
