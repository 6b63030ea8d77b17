//! Netlink dumps read one datagram at a time, each message handed to the caller's reducer as
//! it is decoded and dropped after (issue 36).
//!
//! Why not rtnetlink's request stream: netlink-proto's connection task decodes every datagram
//! the socket holds into its own queue before the consumer's stream sees the first one, and
//! the kernel queues the next part of a dump each time the previous one is read, so a dump is
//! held decoded whole. A host has a veth per pod (the runtime's CNI), so a dump of the host's
//! links grows with the pods: at 500 pods it was ~7 MiB of the restarted daemon's 24 MiB peak
//! heap (heaptrack), the largest single part. Here at most one datagram (a few KiB: the kernel
//! fills a dump datagram up to about a page unless one message needs more) is held, plus what
//! the reducer keeps.

use std::future::poll_fn;
use std::io;

use netlink_packet_route::RouteNetlinkMessage;
use rtnetlink::packet_core::{
    ErrorBuffer, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, NetlinkBuffer, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::sys::{AsyncSocket, SocketAddr, TokioSocket, protocols::NETLINK_ROUTE};

/// Why a dump failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// Sending the request failed.
    #[error("sending the dump request: {0}")]
    Send(#[source] io::Error),
    /// Reading the dump failed (`ENOBUFS` included: the kernel dropped part of it).
    #[error("reading the dump: {0}")]
    Read(#[source] io::Error),
    /// The kernel refused the dump with this (positive) errno.
    #[error("the kernel refused the dump: {}", io::Error::from_raw_os_error(*.0))]
    Kernel(i32),
    /// A message of the dump could not be decoded.
    #[error("decoding a message of the dump: {0}")]
    Decode(String),
}

/// A `NETLINK_ROUTE` socket of the calling thread's network namespace for dumps, one at a time.
pub struct DumpSocket {
    socket: TokioSocket,
    next_sequence: u32,
}

impl std::fmt::Debug for DumpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DumpSocket")
            .field("next_sequence", &self.next_sequence)
            .finish_non_exhaustive()
    }
}

impl DumpSocket {
    /// A socket in the calling thread's netns, registered with the entered tokio runtime.
    ///
    /// # Errors
    /// The socket could not be made.
    pub fn new() -> io::Result<Self> {
        let socket = TokioSocket::new(NETLINK_ROUTE)?;
        Ok(Self { socket, next_sequence: 1 })
    }

    /// Dumps what `request` (an `RTM_GET*` message) asks for, giving each answer to `reduce`
    /// as it is decoded and collecting what it returns.
    ///
    /// A dump the kernel marks interrupted (`NLM_F_DUMP_INTR`: the table changed while it was
    /// read) is returned as read, as rtnetlink does: the change that interrupted it makes a
    /// netlink event, and the callers rediscover on every event.
    ///
    /// # Errors
    /// [`DumpError`] when the request cannot be sent, the kernel refuses it, a read fails or a
    /// message cannot be decoded.
    pub async fn dump<T>(
        &mut self,
        request: RouteNetlinkMessage,
        mut reduce: impl FnMut(RouteNetlinkMessage) -> Option<T>,
    ) -> Result<Vec<T>, DumpError> {
        let sequence = self.next_sequence;
        self.next_sequence = sequence.wrapping_add(1);
        let mut message = NetlinkMessage::from(request);
        message.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        message.header.sequence_number = sequence;
        message.finalize();
        let mut datagram = vec![0; message.buffer_len()];
        message.serialize(&mut datagram);
        self.socket
            .socket_ref()
            .send_to(&datagram, &SocketAddr::new(0, 0), 0)
            .map_err(DumpError::Send)?;
        let mut kept = Vec::new();
        loop {
            // Sized to the datagram (peeked first): no answer is ever truncated.
            let (datagram, _from) =
                poll_fn(|cx| self.socket.poll_recv_from_full(cx)).await.map_err(DumpError::Read)?;
            if read_datagram(&datagram, sequence, &mut reduce, &mut kept)? == Part::Done {
                return Ok(kept);
            }
        }
    }
}

/// Whether a datagram ended the dump.
#[derive(Debug, PartialEq, Eq)]
enum Part {
    More,
    Done,
}

/// Decodes the messages of one datagram of dump `sequence` into `kept` through `reduce`.
/// Messages of other sequence numbers (a late answer to an earlier request) are skipped.
fn read_datagram<T>(
    datagram: &[u8],
    sequence: u32,
    reduce: &mut impl FnMut(RouteNetlinkMessage) -> Option<T>,
    kept: &mut Vec<T>,
) -> Result<Part, DumpError> {
    let mut offset = 0;
    while offset < datagram.len() {
        let buffer = NetlinkBuffer::new_checked(&datagram[offset..])
            .map_err(|err| DumpError::Decode(err.to_string()))?;
        let length = buffer.length() as usize;
        if length == 0 {
            return Err(DumpError::Decode("a message of length 0".to_owned()));
        }
        let bytes = &datagram[offset..offset + length];
        // Each message starts 4-aligned (`NLMSG_ALIGN`).
        offset += length.next_multiple_of(4);
        if buffer.sequence_number() != sequence {
            continue;
        }
        match buffer.message_type() {
            NLMSG_DONE => return Ok(Part::Done),
            NLMSG_ERROR => {
                let code = ErrorBuffer::new_checked(buffer.payload())
                    .map_err(|err| DumpError::Decode(err.to_string()))?
                    .code();
                return match code {
                    Some(code) => Err(DumpError::Kernel(-code.get())),
                    // An ack (error 0) ends a request without NLM_F_DUMP; a dump ends with
                    // NLMSG_DONE, so this is the end either way.
                    None => Ok(Part::Done),
                };
            }
            _ => {}
        }
        let message = NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes)
            .map_err(|err| DumpError::Decode(err.to_string()))?;
        if let NetlinkPayload::InnerMessage(inner) = message.payload
            && let Some(value) = reduce(inner)
        {
            kept.push(value);
        }
    }
    Ok(Part::More)
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::{LinkAttribute, LinkMessage};
    use rtnetlink::packet_core::{DoneMessage, ErrorMessage, NetlinkHeader};

    use super::*;

    fn link(sequence: u32, index: u32, name: &str) -> Vec<u8> {
        let mut message = LinkMessage::default();
        message.header.index = index;
        message.attributes.push(LinkAttribute::IfName(name.to_owned()));
        encode(NetlinkMessage::from(RouteNetlinkMessage::NewLink(message)), sequence)
    }

    fn encode(mut message: NetlinkMessage<RouteNetlinkMessage>, sequence: u32) -> Vec<u8> {
        message.header.sequence_number = sequence;
        message.finalize();
        let mut bytes = vec![0; message.buffer_len().next_multiple_of(4)];
        message.serialize(&mut bytes);
        bytes
    }

    fn names(message: RouteNetlinkMessage) -> Option<String> {
        match message {
            RouteNetlinkMessage::NewLink(link) => {
                link.attributes.into_iter().find_map(|a| match a {
                    LinkAttribute::IfName(name) => Some(name),
                    _ => None,
                })
            }
            _ => None,
        }
    }

    #[test]
    fn messages_are_reduced_in_order_and_other_sequences_skipped_until_done() {
        let mut first = link(7, 1, "lo");
        first.extend(link(6, 9, "stale"));
        first.extend(link(7, 2, "eth0"));
        let mut kept = Vec::new();
        assert_eq!(read_datagram(&first, 7, &mut names, &mut kept).unwrap(), Part::More);
        let mut last = link(7, 3, "veth1");
        let done = NetlinkPayload::Done(DoneMessage::default());
        last.extend(encode(NetlinkMessage::new(NetlinkHeader::default(), done), 7));
        assert_eq!(read_datagram(&last, 7, &mut names, &mut kept).unwrap(), Part::Done);
        assert_eq!(kept, ["lo", "eth0", "veth1"]);
    }

    #[test]
    fn an_error_answer_names_the_errno() {
        let mut error = ErrorMessage::default();
        error.code = std::num::NonZeroI32::new(-22);
        let error = NetlinkPayload::Error(error);
        let bytes = encode(NetlinkMessage::new(NetlinkHeader::default(), error), 3);
        let err = read_datagram(&bytes, 3, &mut names, &mut Vec::new()).unwrap_err();
        assert!(matches!(err, DumpError::Kernel(22)), "{err:?}");
        assert!(err.to_string().contains("Invalid argument"), "{err}");
    }

    #[test]
    fn a_truncated_message_is_a_decode_error() {
        let bytes = link(1, 1, "eth0");
        let err = read_datagram(&bytes[..bytes.len() - 8], 1, &mut names, &mut Vec::new());
        assert!(matches!(err, Err(DumpError::Decode(_))), "{err:?}");
    }
}
