//! The root qdisc of one interface over rtnetlink (`RTM_NEWQDISC`, `RTM_DELQDISC`,
//! `RTM_GETQDISC`, and `RTM_NEWTCLASS` for htb's one class), with the options encoded by the
//! `tc-qdisc` crate, since netlink-packet-route carries them only as raw attributes. Used on a
//! socket bound to a pod netns: the ceiling of a pod interface (DESIGN §3 `bandwidth`).
//!
//! Our root qdiscs carry the handle major [`HANDLE_MAJOR`], so a reader can tell them from
//! one somebody else put there (`tc qdisc show` prints `4e43:`). The kernel drops an
//! interface's qdiscs when the interface changes network namespace (measured here on 6.18: a
//! veth with a root tbf moved into a netns and back comes back with its default qdisc), so a
//! NIC returning to the host never keeps ours; deleting a child link deletes them with it.

use futures::{StreamExt, TryStreamExt};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcOption, TcStats2, TcXstats};
use rtnetlink::Handle;
use rtnetlink::packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload, Nla as _,
};
pub use tc_qdisc as codec;
use tc_qdisc::fq::Fq;
use tc_qdisc::htb::{HtbClass, HtbQdisc};
use tc_qdisc::tbf::Tbf;
use tc_qdisc::{Nla, nla};

/// The handle major of the root qdiscs this driver creates (`0x4e43`, "NC").
pub const HANDLE_MAJOR: u16 = 0x4e43;
/// The minor number of htb's one class (`4e43:1`), also its default class.
pub const HTB_CLASS_MINOR: u16 = 1;
/// `ENOENT`: no such qdisc (deleting a root the interface does not have).
const ENOENT: i32 = 2;
/// `EINVAL`: the kernel's answer to deleting the default root qdisc of an interface.
const EINVAL: i32 = 22;

/// A root qdisc that holds an interface's egress to a ceiling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootQdisc {
    /// One token bucket.
    Tbf(Tbf),
    /// htb with one class, the default, whose rate and ceiling are the ceiling.
    Htb {
        /// The qdisc.
        qdisc: HtbQdisc,
        /// Its class `4e43:1`.
        class: HtbClass,
    },
    /// fq, which holds each packet until the departure time a program stamped on it.
    Fq(Fq),
}

impl RootQdisc {
    /// The qdisc kind (`TCA_KIND`).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            RootQdisc::Tbf(_) => tc_qdisc::tbf::KIND,
            RootQdisc::Htb { .. } => tc_qdisc::htb::KIND,
            RootQdisc::Fq(_) => tc_qdisc::fq::KIND,
        }
    }

    fn options(&self) -> Vec<Nla> {
        match self {
            RootQdisc::Tbf(tbf) => tbf.options(),
            RootQdisc::Htb { qdisc, .. } => qdisc.options(),
            RootQdisc::Fq(fq) => fq.options(),
        }
    }
}

/// Why a qdisc operation failed.
#[derive(Debug, thiserror::Error)]
pub enum QdiscError {
    /// The kernel refused the request.
    #[error("{op} on interface {ifindex}: {message} (errno {errno})")]
    Kernel {
        /// The request (`RTM_NEWQDISC tbf`).
        op: String,
        /// The interface.
        ifindex: u32,
        /// The positive errno.
        errno: i32,
        /// `strerror` of the errno.
        message: String,
    },
    /// The exchange failed without an errno (a closed socket, a decode error).
    #[error("{op} on interface {ifindex}: {message}")]
    Protocol {
        /// The request.
        op: String,
        /// The interface.
        ifindex: u32,
        /// The library's message.
        message: String,
    },
    /// The kernel's answer did not decode.
    #[error("{op} on interface {ifindex}: reading the kernel's answer: {source}")]
    Decode {
        /// The request.
        op: String,
        /// The interface.
        ifindex: u32,
        /// Why.
        #[source]
        source: tc_qdisc::DecodeError,
    },
}

impl QdiscError {
    /// The kernel's errno, when the kernel refused.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            QdiscError::Kernel { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    fn from_rtnetlink(op: impl Into<String>, ifindex: u32, err: rtnetlink::Error) -> Self {
        match err {
            rtnetlink::Error::NetlinkError(message) if message.raw_code() != 0 => {
                let errno = -message.raw_code();
                QdiscError::Kernel {
                    op: op.into(),
                    ifindex,
                    errno,
                    message: std::io::Error::from_raw_os_error(errno).to_string(),
                }
            }
            other => QdiscError::Protocol { op: op.into(), ifindex, message: other.to_string() },
        }
    }
}

/// The queue counters of a qdisc (`TCA_STATS2`: `gnet_stats_basic`, `gnet_stats_queue`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QdiscCounters {
    /// Bytes sent.
    pub bytes: u64,
    /// Packets sent.
    pub packets: u64,
    /// Packets dropped (the queue behind the ceiling was full, or beyond fq's horizon).
    pub drops: u64,
    /// Times a packet had to wait for the ceiling (tbf, htb: `overlimits`).
    pub overlimits: u64,
    /// Packets queued now.
    pub qlen: u32,
    /// Bytes queued now.
    pub backlog: u32,
}

/// A qdisc or class as a dump reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QdiscState {
    /// `TCA_KIND`.
    pub kind: String,
    /// Its handle (`major << 16 | minor`).
    pub handle: u32,
    /// Its parent (`TC_H_ROOT` for a root qdisc).
    pub parent: u32,
    /// The attributes nested in `TCA_OPTIONS`, for the `tc-qdisc` decoders.
    pub options: Vec<Nla>,
    /// `TCA_XSTATS`, the qdisc's own statistics (fq: `tc_fq_qd_stats`).
    pub xstats: Option<Vec<u8>>,
    /// The queue counters.
    pub counters: QdiscCounters,
}

impl QdiscState {
    /// Whether this driver made it (its handle major is [`HANDLE_MAJOR`]).
    #[must_use]
    pub fn is_ours(&self) -> bool {
        self.handle >> 16 == u32::from(HANDLE_MAJOR)
    }
}

/// Puts `qdisc` at the root of interface `ifindex` (replacing whatever is there, as `tc qdisc
/// replace` does), with handle `4e43:`; for htb, then its class. Ours of the same kind is
/// changed in place (no moment without a ceiling); ours of another kind is deleted first. A
/// class that cannot be made removes the qdisc again, so a failure leaves the interface with
/// its default qdisc.
pub async fn replace_root(
    handle: &Handle,
    ifindex: u32,
    qdisc: &RootQdisc,
) -> Result<(), QdiscError> {
    let op = format!("RTM_NEWQDISC {}", qdisc.kind());
    // The kernel takes a request naming an existing handle as a change of that qdisc and
    // refuses another kind for it (EINVAL, "Invalid qdisc name"): ours of another kind goes
    // first.
    if let Some(root) = root(handle, ifindex).await?
        && root.is_ours()
        && root.kind != qdisc.kind()
    {
        delete_root(handle, ifindex).await?;
    }
    let mut message =
        tc_message(ifindex, TcHandle { major: HANDLE_MAJOR, minor: 0 }, TcHandle::ROOT);
    message.attributes.push(TcAttribute::Kind(qdisc.kind().to_owned()));
    message.attributes.push(options_attribute(&qdisc.options()));
    let request = RouteNetlinkMessage::NewQueueDiscipline(message);
    send(handle, request, NLM_F_CREATE | NLM_F_REPLACE, &op, ifindex).await?;
    if let RootQdisc::Htb { class, .. } = qdisc {
        let op = "RTM_NEWTCLASS htb";
        let mut message = tc_message(
            ifindex,
            TcHandle { major: HANDLE_MAJOR, minor: HTB_CLASS_MINOR },
            TcHandle { major: HANDLE_MAJOR, minor: 0 },
        );
        message.attributes.push(TcAttribute::Kind(tc_qdisc::htb::KIND.to_owned()));
        message.attributes.push(options_attribute(&class.options()));
        let request = RouteNetlinkMessage::NewTrafficClass(message);
        // Without NLM_F_EXCL an existing class (a repeated apply) is changed in place.
        if let Err(err) = send(handle, request, NLM_F_CREATE, op, ifindex).await {
            if let Err(undo) = delete_root(handle, ifindex).await {
                tracing::warn!(ifindex, %undo, "removing an htb qdisc whose class failed");
            }
            return Err(err);
        }
    }
    Ok(())
}

/// Deletes the root qdisc of interface `ifindex` when it is ours; `Ok(false)` when there was
/// none of ours (somebody else's root is never touched).
pub async fn delete_root(handle: &Handle, ifindex: u32) -> Result<bool, QdiscError> {
    let Some(root) = root(handle, ifindex).await? else { return Ok(false) };
    if !root.is_ours() {
        return Ok(false);
    }
    let op = "RTM_DELQDISC";
    let mut message =
        tc_message(ifindex, TcHandle { major: HANDLE_MAJOR, minor: 0 }, TcHandle::ROOT);
    message.attributes.push(TcAttribute::Kind(root.kind));
    match send(handle, RouteNetlinkMessage::DelQueueDiscipline(message), 0, op, ifindex).await {
        Ok(()) => Ok(true),
        // Gone meanwhile (the interface's default root cannot be deleted: EINVAL).
        Err(err) if matches!(err.errno(), Some(ENOENT | EINVAL)) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The root qdisc of interface `ifindex`, if the dump reports one.
pub async fn root(handle: &Handle, ifindex: u32) -> Result<Option<QdiscState>, QdiscError> {
    Ok(qdiscs(handle, ifindex).await?.into_iter().find(|q| q.parent == TC_H_ROOT))
}

/// `TC_H_ROOT`.
const TC_H_ROOT: u32 = 0xffff_ffff;

/// Every qdisc of interface `ifindex` (a dump of the netns, filtered: the kernel ignores the
/// index of a qdisc dump request).
pub async fn qdiscs(handle: &Handle, ifindex: u32) -> Result<Vec<QdiscState>, QdiscError> {
    let op = "RTM_GETQDISC dump";
    let messages: Vec<TcMessage> = handle
        .qdisc()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|err| QdiscError::from_rtnetlink(op, ifindex, err))?;
    messages
        .iter()
        .filter(|m| u32::try_from(m.header.index).ok() == Some(ifindex))
        .map(|m| {
            state(m).map_err(|source| QdiscError::Decode { op: op.to_owned(), ifindex, source })
        })
        .collect()
}

/// Every class of interface `ifindex`.
pub async fn classes(handle: &Handle, ifindex: u32) -> Result<Vec<QdiscState>, QdiscError> {
    let op = "RTM_GETTCLASS dump";
    let index = i32::try_from(ifindex).map_err(|_| QdiscError::Protocol {
        op: op.to_owned(),
        ifindex,
        message: "an interface index beyond i32".to_owned(),
    })?;
    let messages: Vec<TcMessage> = handle
        .traffic_class(index)
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(|err| QdiscError::from_rtnetlink(op, ifindex, err))?;
    messages
        .iter()
        .map(|m| {
            state(m).map_err(|source| QdiscError::Decode { op: op.to_owned(), ifindex, source })
        })
        .collect()
}

fn tc_message(ifindex: u32, handle: TcHandle, parent: TcHandle) -> TcMessage {
    let mut message = TcMessage::default();
    // Interface indexes are positive i32 in the kernel (`tcm_ifindex` is an int).
    message.header.index = i32::try_from(ifindex).unwrap_or(i32::MAX);
    message.header.handle = handle;
    message.header.parent = parent;
    message
}

/// `TCA_OPTIONS` with `attrs` nested, each carried as a raw attribute.
fn options_attribute(attrs: &[Nla]) -> TcAttribute {
    TcAttribute::Options(
        attrs.iter().map(|a| TcOption::Other(DefaultNla::new(a.kind, a.value.clone()))).collect(),
    )
}

/// Sends one request and waits for its acknowledgement.
async fn send(
    handle: &Handle,
    request: RouteNetlinkMessage,
    flags: u16,
    op: &str,
    ifindex: u32,
) -> Result<(), QdiscError> {
    let mut message = NetlinkMessage::from(request);
    message.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    let mut handle = handle.clone();
    let mut answers =
        handle.request(message).map_err(|err| QdiscError::from_rtnetlink(op, ifindex, err))?;
    while let Some(answer) = answers.next().await {
        if let NetlinkPayload::Error(err) = answer.payload
            && err.code.is_some()
        {
            return Err(QdiscError::from_rtnetlink(
                op,
                ifindex,
                rtnetlink::Error::NetlinkError(err),
            ));
        }
    }
    Ok(())
}

fn state(message: &TcMessage) -> Result<QdiscState, tc_qdisc::DecodeError> {
    let mut state = QdiscState {
        kind: String::new(),
        handle: u32::from(message.header.handle),
        parent: u32::from(message.header.parent),
        options: Vec::new(),
        xstats: None,
        counters: QdiscCounters::default(),
    };
    for attribute in &message.attributes {
        match attribute {
            TcAttribute::Kind(kind) => state.kind.clone_from(kind),
            TcAttribute::Options(options) => {
                for option in options {
                    if let TcOption::Other(raw) = option {
                        state.options.extend(raw_options(raw)?);
                    }
                }
            }
            TcAttribute::Xstats(TcXstats::Other(bytes)) => state.xstats = Some(bytes.clone()),
            TcAttribute::Stats2(gnet) => {
                for stat in gnet {
                    match stat {
                        TcStats2::Basic(basic) => {
                            state.counters.bytes = basic.bytes;
                            state.counters.packets = u64::from(basic.packets);
                        }
                        TcStats2::Queue(queue) => {
                            state.counters.drops = u64::from(queue.drops);
                            state.counters.overlimits = u64::from(queue.overlimits);
                            state.counters.qlen = queue.qlen;
                            state.counters.backlog = queue.backlog;
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(state)
}

/// netlink-packet-route keeps the `TCA_OPTIONS` of a kind it does not know as one raw
/// attribute whose value is the nest: split it. (Its own kinds never reach here: they parse
/// into their own variants.)
fn raw_options(raw: &DefaultNla) -> Result<Vec<Nla>, tc_qdisc::DecodeError> {
    let mut value = vec![0; raw.value_len()];
    raw.emit_value(&mut value);
    Ok(nla::decode(&value)?)
}

/// Whether the kernel offers qdisc kind `kind`: one is created at the root of `ifindex` (a
/// link of the start-up probe's private netns) and deleted again. Asking for a kind is how
/// the kernel loads its module (`qdisc_create` calls `request_module("sch_<kind>")`);
/// `ENOENT` after that means no such qdisc ("Specified qdisc kind is unknown").
pub async fn probe_kind(handle: &Handle, ifindex: u32, kind: &str) -> crate::model::support::Probe {
    use crate::model::support::Probe;
    let op = format!("RTM_NEWQDISC {kind}");
    let mut message =
        tc_message(ifindex, TcHandle { major: HANDLE_MAJOR, minor: 0 }, TcHandle::ROOT);
    message.attributes.push(TcAttribute::Kind(kind.to_owned()));
    let request = RouteNetlinkMessage::NewQueueDiscipline(message);
    match send(handle, request, NLM_F_CREATE | NLM_F_EXCL, &op, ifindex).await {
        Ok(()) => {
            if let Err(err) = delete_root(handle, ifindex).await {
                tracing::debug!(kind, error = %err, "deleting the probe qdisc");
            }
            Probe::Available
        }
        Err(err) if err.errno() == Some(ENOENT) => Probe::Missing {
            detail: format!(
                "creating a qdisc of kind {kind} answered ENOENT: no sch_{kind} in this kernel"
            ),
        },
        Err(err) => Probe::Unknown { detail: err.to_string() },
    }
}
