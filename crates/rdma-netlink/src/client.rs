//! [`RdmaSocket`]: requests over a blocking `NETLINK_RDMA` socket.
//!
//! Blocking is enough: the kernel handles an RDMA netlink request inside `sendmsg`
//! (`rdma_nl_rcv` runs synchronously under the socket's send path), so the answer, or the
//! first part of a dump, is queued before `send` returns; later parts of a dump are filled in
//! by the `recvmsg` that reads them. No read waits for anything but the kernel's own work.

use std::os::fd::{AsRawFd, BorrowedFd};

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_DUMP, NLM_F_MULTIPART, NLM_F_REQUEST, NetlinkBuffer, NetlinkHeader,
    NetlinkMessage, NetlinkPayload,
};
use netlink_sys::{Socket, SocketAddr};

use crate::message::{Device, NldevAttribute, NldevMessage, Port};
use crate::{Error, NETLINK_RDMA, command};

/// A `NETLINK_RDMA` socket connected to the kernel, in the network namespace of the thread
/// that opened it.
#[derive(Debug)]
pub struct RdmaSocket {
    socket: Socket,
    sequence: u32,
}

impl RdmaSocket {
    /// Opens a socket. Fails with `EPROTONOSUPPORT` when `ib_core` is not loaded (the
    /// kernel then has no `NETLINK_RDMA`).
    pub fn open() -> Result<Self, Error> {
        let mut socket = Socket::new(NETLINK_RDMA).map_err(Error::Socket)?;
        socket.bind_auto().map_err(Error::Socket)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(Error::Socket)?;
        Ok(Self { socket, sequence: 0 })
    }

    /// Every RDMA device this netns sees (`rdma dev`).
    pub fn devices(&mut self) -> Result<Vec<Device>, Error> {
        let answers = self.request(NldevMessage::new(command::GET, Vec::new()), NLM_F_DUMP)?;
        answers.iter().map(Device::try_from).collect()
    }

    /// The ports of device `device_index` (`rdma link show <dev>`).
    pub fn ports(&mut self, device_index: u32) -> Result<Vec<Port>, Error> {
        let request =
            NldevMessage::new(command::PORT_GET, vec![NldevAttribute::DevIndex(device_index)]);
        let answers = self.request(request, NLM_F_DUMP)?;
        answers.iter().map(Port::try_from).collect()
    }

    /// The node's netns mode as the kernel encodes it (`ib_devices_shared_netns`: 1
    /// shared, 0 exclusive).
    pub fn netns_mode(&mut self) -> Result<u8, Error> {
        let answers = self.request(NldevMessage::new(command::SYS_GET, Vec::new()), 0)?;
        let name = command::name(command::SYS_GET);
        answers
            .first()
            .ok_or(Error::MissingAttribute { command: name, attribute: "an answer" })?
            .netns_mode()
    }

    /// Moves device `device_index` into the network namespace `netns` (an open
    /// `/proc/<pid>/ns/net` or `/run/netns/<name>`). Needs `CAP_NET_ADMIN`, the node in
    /// exclusive netns mode, and a driver that can disassociate user contexts: the kernel
    /// answers `EOPNOTSUPP` otherwise (software devices such as `rdma_rxe`).
    pub fn move_to_netns(&mut self, device_index: u32, netns: BorrowedFd<'_>) -> Result<(), Error> {
        // The kernel reads the descriptor as a u32 (`RDMA_NLDEV_NET_NS_FD`, NLA_U32); an
        // open descriptor is never negative.
        let fd = netns.as_raw_fd().cast_unsigned();
        let request = NldevMessage::new(
            command::SET,
            vec![NldevAttribute::DevIndex(device_index), NldevAttribute::NetNsFd(fd)],
        );
        self.request(request, NLM_F_ACK).map(drop)
    }

    /// Adds a software RDMA link (`rdma link add <name> type <kind> netdev <netdev>`).
    pub fn add_link(&mut self, name: &str, kind: &str, netdev: &str) -> Result<(), Error> {
        let request = NldevMessage::new(
            command::NEWLINK,
            vec![
                NldevAttribute::DevName(name.to_owned()),
                NldevAttribute::LinkType(kind.to_owned()),
                NldevAttribute::NdevName(netdev.to_owned()),
            ],
        );
        self.request(request, NLM_F_ACK).map(drop)
    }

    /// Deletes a software RDMA link (`rdma link delete <name>`).
    pub fn delete_link(&mut self, device_index: u32) -> Result<(), Error> {
        let request =
            NldevMessage::new(command::DELLINK, vec![NldevAttribute::DevIndex(device_index)]);
        self.request(request, NLM_F_ACK).map(drop)
    }

    /// Sends `request` with `NLM_F_REQUEST | flags` and collects the answers until the
    /// kernel is done: the end of a dump, an ACK, or the one answer of a plain get.
    fn request(&mut self, request: NldevMessage, flags: u16) -> Result<Vec<NldevMessage>, Error> {
        let name = command::name(request.command);
        self.sequence = self.sequence.wrapping_add(1);
        let sequence = self.sequence;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = sequence;
        let mut message = NetlinkMessage::new(header, NetlinkPayload::InnerMessage(request));
        message.finalize();
        let mut buffer = vec![0; message.buffer_len()];
        message.serialize(&mut buffer);
        self.socket.send(&buffer, 0).map_err(|source| Error::Send { command: name, source })?;

        let mut answers = Vec::new();
        loop {
            let (datagram, _) = self
                .socket
                .recv_from_full()
                .map_err(|source| Error::Receive { command: name, source })?;
            let messages =
                split(&datagram).map_err(|source| Error::Decode { command: name, source })?;
            for message in messages {
                if absorb(message, sequence, flags, &mut answers)
                    .map_err(|source| Error::Kernel { command: name, source })?
                {
                    return Ok(answers);
                }
            }
        }
    }
}

/// Takes one received message of the request with `sequence` sent with `flags` into
/// `answers`; `Ok(true)` when the request is complete (the end of a dump, an ACK, or the one
/// answer of a plain get), the kernel's errno as an error when it refused.
pub(crate) fn absorb(
    message: NetlinkMessage<NldevMessage>,
    sequence: u32,
    flags: u16,
    answers: &mut Vec<NldevMessage>,
) -> Result<bool, std::io::Error> {
    if message.header.sequence_number != sequence {
        // An answer to an earlier request whose reader gave up early.
        return Ok(false);
    }
    let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
    let multipart = message.header.flags & NLM_F_MULTIPART != 0;
    match message.payload {
        NetlinkPayload::InnerMessage(answer) => {
            answers.push(answer);
            Ok(!dump && !multipart && flags & NLM_F_ACK == 0)
        }
        NetlinkPayload::Error(error) if error.code.is_none() => Ok(true),
        NetlinkPayload::Error(error) => Err(error.to_io()),
        NetlinkPayload::Done(done) if done.code < 0 => {
            Err(std::io::Error::from_raw_os_error(-done.code))
        }
        NetlinkPayload::Done(_) => Ok(true),
        _ => Ok(false),
    }
}

/// The messages of one datagram (the kernel packs several answers of a dump into one).
pub(crate) fn split(
    datagram: &[u8],
) -> Result<Vec<NetlinkMessage<NldevMessage>>, netlink_packet_core::DecodeError> {
    let mut messages = Vec::new();
    let mut offset = 0;
    while offset < datagram.len() {
        let rest = &datagram[offset..];
        // `new_checked` refuses a length shorter than the header or longer than the rest.
        let length = NetlinkBuffer::new_checked(rest)?.length() as usize;
        messages.push(NetlinkMessage::deserialize(&rest[..length])?);
        // NLMSG_ALIGN: messages start on 4-byte boundaries.
        offset += (length + 3) & !3;
    }
    Ok(messages)
}
