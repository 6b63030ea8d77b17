//! Pipelined netlink requests in a pod netns (issue 36): the requests of one attach or detach
//! that need nothing from each other's answers go to the kernel in ONE datagram, and their
//! acks are read after.
//!
//! Why one datagram on a socket of its own, not rtnetlink's handle: netlink-proto's connection
//! task sends one queued request per wake-up (`poll_send_messages` pops one) and is woken
//! again by the ack, so futures issued together still cross the wire one round trip at a time
//! (strace: `sendto`, `recvfrom`, `sendto`, ...). The kernel processes every message of a
//! datagram in order inside that `sendmsg` (`netlink_rcv_skb`, under the RTNL lock), acking
//! each (a failed one too) and going on with the next, so when `sendmsg` returns every ack is
//! already queued on the socket: they are read at once, without waiting, with no task in
//! between. Acks are matched to requests by sequence number.
//!
//! `NETLINK_CAP_ACK` is set: an error ack then carries only the failed request's header instead
//! of the whole request, and a batch is at most [`MAX_BATCH`] messages, so the acks of one batch
//! stay far below the socket's receive buffer (an ack the kernel cannot queue is dropped, with
//! `ENOBUFS` on the next read, and its request's outcome would be unknown).

use std::future::poll_fn;
use std::io;
use std::net::IpAddr;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{LinkAttribute, LinkMessage};
use rtnetlink::packet_core::{
    ErrorBuffer, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST, NLMSG_ERROR, NetlinkBuffer,
    NetlinkMessage, NetlinkPayload,
};
use rtnetlink::sys::{AsyncSocket, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE};
use rtnetlink::{AddressMessageBuilder, LinkUnspec};

use super::netlink::{NetlinkOps, link_state, route_message};
use super::netns_file::open_netns_file;
use super::routing::{rule_message, sysctl_parts, table_route_message, write_proc};
use crate::podnet::ports::{LinkOpError, LinkState, NetnsRefusal, PodRequest, Side};

/// Most messages in one datagram (a larger batch is sent in several, in order): their acks,
/// ~100 bytes of buffer each with `NETLINK_CAP_ACK`, stay far below the receive buffer.
pub const MAX_BATCH: usize = 64;
/// How long acks missing after `sendmsg` are waited for: never needed with rtnetlink, which
/// answers inside `sendmsg`; a bound, so a lost ack cannot hang an attach.
const ACK_WAIT: Duration = Duration::from_secs(2);
/// A read buffer: an ack is 36 bytes with `NETLINK_CAP_ACK`, a few hundred without.
const READ_BUFFER: usize = 8192;
/// The read buffer of a link's answer (~1.5 KiB for a macvlan, more with statistics).
const QUERY_BUFFER: usize = 32 * 1024;
/// `ENODEV`: no link of that name.
const ENODEV: i32 = 19;

/// Why one request of a batch has no success.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchFailure {
    /// The kernel refused it with this (positive) errno.
    Kernel(i32),
    /// No ack came (the socket failed, or the ack was dropped); the outcome is unknown.
    NoAck(String),
}

/// A NETLINK_ROUTE socket of one netns for pipelined batches, used by one batch at a time.
#[derive(Debug)]
pub struct BatchSocket {
    socket: tokio::sync::Mutex<Inner>,
}

struct Inner {
    socket: TokioSocket,
    next_sequence: u32,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner").field("next_sequence", &self.next_sequence).finish_non_exhaustive()
    }
}

impl BatchSocket {
    /// A socket in the calling thread's netns, registered with the entered tokio runtime.
    ///
    /// # Errors
    /// The socket could not be made.
    pub fn new() -> io::Result<Self> {
        let socket = TokioSocket::new(NETLINK_ROUTE)?;
        // Since Linux 4.3; without it error acks echo the whole request (larger, nothing
        // else changes), so a kernel that refuses it still works.
        if let Err(err) = socket.socket_ref().set_cap_ack(true) {
            tracing::debug!(%err, "NETLINK_CAP_ACK refused; error acks carry the request");
        }
        Ok(Self { socket: tokio::sync::Mutex::new(Inner { socket, next_sequence: 1 }) })
    }

    /// The link named `name` in the socket's netns: one `RTM_GETLINK` by name, its answer read
    /// at once (the kernel answers inside `sendmsg`); `Ok(None)` when there is none (`ENODEV`).
    ///
    /// # Errors
    /// The kernel's refusal, or no answer.
    pub async fn link(&self, name: &str) -> Result<Option<LinkMessage>, BatchFailure> {
        let mut message = LinkMessage::default();
        message.attributes.push(LinkAttribute::IfName(name.to_owned()));
        let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetLink(message));
        request.header.flags = NLM_F_REQUEST;
        match self.socket.lock().await.query(request).await {
            Err(BatchFailure::Kernel(ENODEV)) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Sends `messages` (requests with `NLM_F_ACK`) back to back, in order, in datagrams of
    /// at most [`MAX_BATCH`], and returns one outcome per message, in their order.
    pub async fn send(
        &self,
        messages: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> Vec<Result<(), BatchFailure>> {
        let mut inner = self.socket.lock().await;
        let mut results = Vec::with_capacity(messages.len());
        let mut messages = messages.into_iter().peekable();
        while messages.peek().is_some() {
            let chunk: Vec<_> = messages.by_ref().take(MAX_BATCH).collect();
            results.extend(inner.exchange(chunk).await);
        }
        results
    }
}

impl Inner {
    /// Reads one datagram into `buffer`: at once when one is queued, else waiting at most
    /// [`ACK_WAIT`] for one.
    async fn read(&self, buffer: &mut Vec<u8>) -> io::Result<()> {
        buffer.clear();
        match self.socket.socket_ref().recv(buffer, nix::libc::MSG_DONTWAIT) {
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                let wait = poll_fn(|cx| self.socket.poll_recv(cx, buffer));
                match tokio::time::timeout(ACK_WAIT, wait).await {
                    Ok(read) => read,
                    Err(_elapsed) => Err(io::Error::from(io::ErrorKind::TimedOut)),
                }
            }
            other => other.map(|_| ()),
        }
    }

    /// Sends `request` (a `RTM_GET*` without `NLM_F_DUMP`) and returns its one answer.
    async fn query(
        &mut self,
        mut request: NetlinkMessage<RouteNetlinkMessage>,
    ) -> Result<LinkMessage, BatchFailure> {
        let sequence = self.next_sequence;
        self.next_sequence = sequence.wrapping_add(1);
        request.header.sequence_number = sequence;
        request.finalize();
        let mut datagram = vec![0; request.buffer_len()];
        request.serialize(&mut datagram);
        if let Err(err) = self.socket.socket_ref().send_to(&datagram, &SocketAddr::new(0, 0), 0) {
            return Err(BatchFailure::NoAck(format!("sendto: {err}")));
        }
        let mut buffer = Vec::with_capacity(QUERY_BUFFER);
        loop {
            self.read(&mut buffer)
                .await
                .map_err(|err| BatchFailure::NoAck(format!("reading the answer: {err}")))?;
            let Ok(answer) = NetlinkBuffer::new_checked(buffer.as_slice()) else { continue };
            if answer.sequence_number() != sequence {
                // An earlier batch's late ack: not ours.
                continue;
            }
            if answer.message_type() == NLMSG_ERROR {
                let code = ErrorBuffer::new_checked(answer.payload()).ok().and_then(|e| e.code());
                return Err(code.map_or_else(
                    || BatchFailure::NoAck("an ack instead of the answer".to_owned()),
                    |code| BatchFailure::Kernel(-code.get()),
                ));
            }
            let length = answer.length() as usize;
            return match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&buffer[..length]) {
                Ok(NetlinkMessage {
                    payload: NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)),
                    ..
                }) => Ok(link),
                Ok(other) => Err(BatchFailure::NoAck(format!("unexpected answer {other:?}"))),
                Err(err) => Err(BatchFailure::NoAck(format!("decoding the answer: {err}"))),
            };
        }
    }

    async fn exchange(
        &mut self,
        messages: Vec<NetlinkMessage<RouteNetlinkMessage>>,
    ) -> Vec<Result<(), BatchFailure>> {
        let count = messages.len();
        let first = self.next_sequence;
        // Sequence numbers never repeat within a batch; wrapping is harmless (matched by
        // offset from `first`).
        self.next_sequence = first.wrapping_add(u32::try_from(count).unwrap_or(u32::MAX));
        let mut datagram = Vec::new();
        for (offset, mut message) in (0u32..).zip(messages) {
            message.header.sequence_number = first.wrapping_add(offset);
            message.finalize();
            let start = datagram.len();
            let length = message.buffer_len();
            // Each message starts 4-aligned (`NLMSG_ALIGN`), as `netlink_rcv_skb` reads them.
            datagram.resize(start + length.next_multiple_of(4), 0);
            message.serialize(&mut datagram[start..start + length]);
        }
        let mut results: Vec<Option<Result<(), BatchFailure>>> = vec![None; count];
        if let Err(err) = self.socket.socket_ref().send_to(&datagram, &SocketAddr::new(0, 0), 0) {
            // Nothing of the datagram reached the kernel.
            return vec![Err(BatchFailure::NoAck(format!("sendto: {err}"))); count];
        }
        let mut missing = count;
        let mut buffer = Vec::with_capacity(READ_BUFFER);
        while missing > 0 {
            if let Err(err) = self.read(&mut buffer).await {
                let why = format!("reading the acks: {err}");
                for result in results.iter_mut().filter(|r| r.is_none()) {
                    *result = Some(Err(BatchFailure::NoAck(why.clone())));
                }
                break;
            }
            missing -= record_acks(&buffer, first, &mut results);
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(BatchFailure::NoAck("no ack".to_owned()))))
            .collect()
    }
}

/// Records the acks in `datagram` (requests `first`.. by sequence number) not seen yet;
/// returns how many.
fn record_acks(
    datagram: &[u8],
    first: u32,
    results: &mut [Option<Result<(), BatchFailure>>],
) -> usize {
    let mut recorded = 0;
    let mut offset = 0;
    while offset < datagram.len() {
        let Ok(message) = NetlinkBuffer::new_checked(&datagram[offset..]) else { break };
        let length = message.length() as usize;
        if message.message_type() == NLMSG_ERROR {
            let slot = usize::try_from(message.sequence_number().wrapping_sub(first))
                .ok()
                .and_then(|index| results.get_mut(index))
                .filter(|slot| slot.is_none());
            if let (Some(slot), Ok(error)) = (slot, ErrorBuffer::new_checked(message.payload())) {
                // The kernel's code is a negative errno; zero is the ack of a success.
                *slot = Some(match error.code() {
                    None => Ok(()),
                    Some(code) => Err(BatchFailure::Kernel(-code.get())),
                });
                recorded += 1;
            }
        }
        if length == 0 {
            break;
        }
        offset += length.next_multiple_of(4);
    }
    recorded
}

/// [`super::netlink::open_in_netns`], with `extra` also run on the thread in the netns (with the caller's
/// runtime entered): more sockets of that netns at the price of one thread
/// (`super::netlink_batch`).
pub(super) async fn open_in_netns_with<T: Send + 'static>(
    path: &Path,
    extra: fn() -> std::io::Result<T>,
) -> Result<(rtnetlink::Handle, T, std::fs::File), LinkOpError> {
    let runtime = tokio::runtime::Handle::current();
    let (sender, receiver) = tokio::sync::oneshot::channel();
    let netns_error = |source| LinkOpError::Netns { path: path.display().to_string(), source };
    let netns = open_netns_file(path)?;
    std::thread::Builder::new()
        .name("netns-socket".to_owned())
        .spawn(move || {
            let result = (|| {
                nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                // The socket registers with the runtime's reactor, which needs a context here.
                let _entered = runtime.enter();
                let (connection, handle, _) = rtnetlink::new_connection()?;
                let extra = extra()?;
                Ok((connection, handle, extra, netns))
            })();
            // The receiver only goes away when the caller was cancelled; nothing to report to.
            let _ignored = sender.send(result);
            // The thread ends here, with its netns: it never runs anything else.
        })
        .map_err(netns_error)?;
    let result = receiver.await.map_err(|_| {
        netns_error(std::io::Error::other("the netns thread ended without an answer"))
    })?;
    let (connection, handle, extra, netns) =
        result.map_err(|source: std::io::Error| match source.raw_os_error() {
            Some(nix::libc::ENOENT) => LinkOpError::NetnsGone { path: path.display().to_string() },
            Some(nix::libc::EINVAL) => LinkOpError::NotPodNetns {
                path: path.display().to_string(),
                reason: NetnsRefusal::NotNetwork,
            },
            _ => netns_error(source),
        })?;
    tokio::spawn(connection);
    Ok((handle, extra, netns))
}

/// Opens `path` with rtnetlink's socket and a [`BatchSocket`], both made on one thread that
/// entered the netns (the bench's pipelined floor; the attach path opens them through
/// `NetlinkOps`).
///
/// # Errors
/// The netns could not be entered, or a socket not made.
pub async fn open_batched_in_netns(
    path: &Path,
) -> Result<(rtnetlink::Handle, BatchSocket, std::fs::File), LinkOpError> {
    open_in_netns_with(path, BatchSocket::new).await
}

/// A request message with its flags.
fn request(message: RouteNetlinkMessage, create: bool) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut request = NetlinkMessage::from(message);
    // As rtnetlink's single requests: an add or set fails on an existing entry.
    request.header.flags = if create {
        NLM_F_REQUEST | NLM_F_ACK | NLM_F_EXCL | NLM_F_CREATE
    } else {
        NLM_F_REQUEST | NLM_F_ACK
    };
    request
}

fn address_message(index: u32, address: ipnetwork::IpNetwork) -> AddressMessage {
    match address.ip() {
        IpAddr::V4(ip) => AddressMessageBuilder::<std::net::Ipv4Addr>::new()
            .index(index)
            .address(ip, address.prefix())
            .build(),
        IpAddr::V6(ip) => AddressMessageBuilder::<std::net::Ipv6Addr>::new()
            .index(index)
            .address(ip, address.prefix())
            .build(),
    }
}

/// The message of `request` and its op name for errors; `None` for a [`PodRequest::SetSysctls`]
/// whose settings all go through `/proc/sys`.
fn message_of(
    pod_request: &PodRequest<'_>,
) -> Option<(NetlinkMessage<RouteNetlinkMessage>, String)> {
    use RouteNetlinkMessage as M;
    let set_link = |message: LinkMessage| request(M::SetLink(message), true);
    Some(match *pod_request {
        PodRequest::AddAddress { index, address, nodad } => {
            let mut message = address_message(index, address);
            if nodad {
                message.attributes.push(AddressAttribute::Flags(AddressFlags::Nodad));
            }
            (request(M::NewAddress(message), true), format!("RTM_NEWADDR {address}"))
        }
        PodRequest::DeleteAddress { index, address } => (
            request(M::DelAddress(address_message(index, address)), false),
            format!("RTM_DELADDR {address}"),
        ),
        PodRequest::SetUp { index, up } => {
            let builder = LinkUnspec::new_with_index(index);
            let message = if up { builder.up() } else { builder.down() }.build();
            (set_link(message), format!("RTM_NEWLINK {index} up={up}"))
        }
        PodRequest::AddRoute { index, route } => (
            request(M::NewRoute(route_message(index, route)), true),
            format!("RTM_NEWROUTE {}", route.destination),
        ),
        PodRequest::DeleteRoute { index, route } => (
            request(M::DelRoute(route_message(index, route)), false),
            format!("RTM_DELROUTE {}", route.destination),
        ),
        PodRequest::AddTableRoute { index, route } => (
            request(M::NewRoute(table_route_message(index, route)), true),
            format!("RTM_NEWROUTE {route}"),
        ),
        PodRequest::DeleteTableRoute { index, route } => (
            request(M::DelRoute(table_route_message(index, route)), false),
            format!("RTM_DELROUTE {route}"),
        ),
        PodRequest::AddRule { rule } => {
            (request(M::NewRule(rule_message(rule)), true), format!("RTM_NEWRULE {rule}"))
        }
        PodRequest::DeleteRule { rule } => {
            (request(M::DelRule(rule_message(rule)), false), format!("RTM_DELRULE {rule}"))
        }
        PodRequest::SetMaster { index, master } => (
            set_link(LinkUnspec::new_with_index(index).controller(master).build()),
            format!("RTM_NEWLINK {index} master {master}"),
        ),
        PodRequest::SetSysctls { index, if_name, sysctls } => {
            let (inet, _writes) = sysctl_parts(index, if_name, sysctls);
            let (message, op) = inet?;
            (set_link(message), op)
        }
        PodRequest::DeleteLink { index } => {
            let mut message = LinkMessage::default();
            message.header.index = index;
            (request(M::DelLink(message), false), format!("RTM_DELLINK {index}"))
        }
    })
}

fn failure(op: String, failure: BatchFailure) -> LinkOpError {
    failure_on(op, Side::Pod, failure)
}

fn failure_on(op: String, side: Side, failure: BatchFailure) -> LinkOpError {
    match failure {
        BatchFailure::Kernel(errno) => LinkOpError::Kernel {
            op,
            side,
            errno,
            message: io::Error::from_raw_os_error(errno).to_string(),
        },
        BatchFailure::NoAck(message) => LinkOpError::Protocol { op, side, message },
    }
}

async fn lookup(
    socket: &BatchSocket,
    name: &str,
    side: Side,
) -> Result<Option<LinkState>, LinkOpError> {
    match socket.link(name).await {
        Ok(link) => Ok(link.as_ref().map(link_state)),
        Err(why) => Err(failure_on(format!("RTM_GETLINK {name}"), side, why)),
    }
}

impl NetlinkOps {
    /// [`crate::podnet::ports::LinkPort::link`] on the pod side, through the batch socket: no
    /// connection task between the request and its answer.
    pub(super) async fn pod_link(&self, name: &str) -> Result<Option<LinkState>, LinkOpError> {
        lookup(self.batch_socket().await?, name, Side::Pod).await
    }

    /// [`crate::podnet::ports::LinkPort::link`] on the host side, likewise.
    pub(super) async fn host_link(&self, name: &str) -> Result<Option<LinkState>, LinkOpError> {
        lookup(self.host_batch_socket(), name, Side::Host).await
    }

    /// [`crate::podnet::ports::LinkPort::apply_batch`]: the `/proc/sys` writes of any
    /// [`PodRequest::SetSysctls`] first (in order, on a thread in the pod netns; a failed one
    /// fails its request, whose netlink part is then not sent), then every netlink message in
    /// one datagram.
    pub(super) async fn send_pod_batch(
        &self,
        requests: &[PodRequest<'_>],
    ) -> Vec<Result<(), LinkOpError>> {
        if requests.is_empty() {
            return Vec::new();
        }
        let socket = match self.batch_socket().await {
            Ok(socket) => socket,
            Err(unusable) => {
                // Every request fails alike (the netns gone, or its sockets not made): the
                // error is asked for again for each, as it is kept, not found again.
                let mut failed = vec![Err(unusable)];
                while failed.len() < requests.len() {
                    failed.push(self.batch_socket().await.map(|_| ()));
                }
                return failed;
            }
        };
        let mut results: Vec<Option<Result<(), LinkOpError>>> =
            requests.iter().map(|_| None).collect();
        for (slot, request) in results.iter_mut().zip(requests) {
            if let PodRequest::SetSysctls { index, if_name, sysctls } = *request {
                let (_inet, writes) = sysctl_parts(index, if_name, sysctls);
                if writes.is_empty() {
                    continue;
                }
                let written = match self.pod_netns() {
                    Ok(netns) => write_proc(netns, writes).await,
                    Err(err) => Err(err),
                };
                if let Err(err) = written {
                    *slot = Some(Err(err));
                }
            }
        }
        let mut sent = Vec::new();
        let mut messages = Vec::new();
        for (position, request) in requests.iter().enumerate() {
            if results[position].is_some() {
                continue;
            }
            match message_of(request) {
                Some((message, op)) => {
                    messages.push(message);
                    sent.push((position, op));
                }
                // Sysctls all written through /proc.
                None => results[position] = Some(Ok(())),
            }
        }
        if !messages.is_empty() {
            let acks = socket.send(messages).await;
            for ((position, op), ack) in sent.into_iter().zip(acks) {
                results[position] = Some(ack.map_err(|why| failure(op, why)));
            }
        }
        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(LinkOpError::Protocol {
                        op: "batch".to_owned(),
                        side: Side::Pod,
                        message: "no outcome".to_owned(),
                    })
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(sequence: u32, code: i32) -> Vec<u8> {
        let mut bytes = vec![0u8; 36];
        bytes[0..4].copy_from_slice(&36u32.to_ne_bytes());
        bytes[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        bytes[8..12].copy_from_slice(&sequence.to_ne_bytes());
        bytes[16..20].copy_from_slice(&code.to_ne_bytes());
        bytes
    }

    #[test]
    fn acks_are_matched_by_sequence_number_and_foreign_ones_ignored() {
        let mut results = vec![None; 3];
        let mut datagram = ack(12, -17);
        datagram.extend(ack(10, 0));
        // Not of this batch (an earlier one's), and a repeat: both ignored.
        datagram.extend(ack(9, 0));
        datagram.extend(ack(10, -1));
        assert_eq!(record_acks(&datagram, 10, &mut results), 2);
        assert_eq!(results, [Some(Ok(())), None, Some(Err(BatchFailure::Kernel(17)))]);
        assert_eq!(record_acks(&ack(11, -101), 10, &mut results), 1);
        assert_eq!(results[1], Some(Err(BatchFailure::Kernel(101))));
    }

    #[test]
    fn sequence_numbers_wrap_around() {
        let mut results = vec![None; 2];
        let mut datagram = ack(u32::MAX, 0);
        datagram.extend(ack(0, -3));
        assert_eq!(record_acks(&datagram, u32::MAX, &mut results), 2);
        assert_eq!(results, [Some(Ok(())), Some(Err(BatchFailure::Kernel(3)))]);
    }
}
