//! A small blocking client of the kernel's ethtool generic netlink family (Linux 5.6+;
//! `Documentation/networking/ethtool-netlink.rst`): offload features, ring sizes and channel
//! counts of one network device, read and set.
//!
//! Features are named as the kernel names them (string set `ETH_SS_FEATURES`, e.g.
//! `rx-checksum`, `tx-tcp-segmentation`); the names are read from the running kernel, never
//! compiled in, so a kernel that adds or renames one is answered truthfully.
//!
//! A netlink socket works on the network namespace it was created in: open the [`Client`] on
//! a thread that is in the namespace of the device. Every call is one request and its answer
//! on that socket; the kernel's error and its extended-ACK message come back in
//! [`Error::Kernel`].

mod wire;

use netlink_packet_core::{
    DecodeError, Emitable, NLM_F_ACK, NLM_F_REQUEST, NetlinkMessage, NetlinkPayload,
    ParseableParametrized,
};
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_packet_generic::{GenlFamily, GenlHeader, GenlMessage};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};

use wire::{Attr, Message};

/// `NLM_F_CAPPED`: the error message echoes only the request's header.
const NLM_F_CAPPED: u16 = 0x100;
/// `NLM_F_ACK_TLVS`: extended-ACK attributes follow the echoed request.
const NLM_F_ACK_TLVS: u16 = 0x200;
/// `NLMSGERR_ATTR_MSG`: the kernel's message (`NL_SET_ERR_MSG`).
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Size of `struct nlmsghdr`.
const NLMSG_HDRLEN: usize = 16;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket failed (open, send, receive).
    #[error("{op}: netlink socket: {source}")]
    Io {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The kernel refused the request.
    #[error("{op}: {}{}", std::io::Error::from_raw_os_error(*errno), message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Kernel {
        /// What was attempted.
        op: String,
        /// The errno (positive: `EOPNOTSUPP` is 95).
        errno: i32,
        /// The extended-ACK message, when the kernel gave one.
        message: Option<String>,
    },
    /// The kernel's answer could not be read.
    #[error("{op}: reading the kernel's answer: {source}")]
    Decode {
        /// What was attempted.
        op: String,
        /// The cause.
        #[source]
        source: DecodeError,
    },
    /// The kernel has no ethtool family (built without `CONFIG_ETHTOOL_NETLINK`, or older
    /// than 5.6).
    #[error(
        "the kernel has no generic netlink family \"ethtool\" (Linux 5.6+ with CONFIG_ETHTOOL_NETLINK)"
    )]
    NoFamily,
}

impl Error {
    /// The kernel's errno, when the kernel refused.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kernel { errno, .. } => Some(*errno),
            Error::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// The kernel's extended-ACK message, when it gave one.
    #[must_use]
    pub fn kernel_message(&self) -> Option<&str> {
        match self {
            Error::Kernel { message, .. } => message.as_deref(),
            _ => None,
        }
    }
}

/// The offload features of a device (`ETHTOOL_MSG_FEATURES_GET`), by feature name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features {
    /// The kernel's feature names, by bit index (`ETH_SS_FEATURES`).
    names: Vec<String>,
    /// Features the user may change (`hw_features`).
    hw: Vec<bool>,
    /// Features the user asked for (`wanted_features`).
    wanted: Vec<bool>,
    /// Features in effect (`features`).
    active: Vec<bool>,
    /// Features never changeable (`NETIF_F_NEVER_CHANGE`).
    nochange: Vec<bool>,
}

/// One feature of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feature {
    /// In effect now.
    pub active: bool,
    /// Asked for (differs from `active` when a dependency keeps it off).
    pub wanted: bool,
    /// The user may change it (in `hw_features` and not in `NETIF_F_NEVER_CHANGE`); a
    /// feature that is not is "fixed" in `ethtool -k`.
    pub changeable: bool,
}

impl Features {
    /// The feature `name`, or `None` when this kernel has no feature of that name.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<Feature> {
        let bit = self.names.iter().position(|n| n == name)?;
        let at = |set: &[bool]| set.get(bit).copied().unwrap_or(false);
        Some(Feature {
            active: at(&self.active),
            wanted: at(&self.wanted),
            changeable: at(&self.hw) && !at(&self.nochange),
        })
    }

    /// Every feature name the kernel knows, in bit order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str).filter(|n| !n.is_empty())
    }
}

/// Ring sizes of a device (`ETHTOOL_MSG_RINGS_GET`); `None` where the driver has no such
/// ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rings {
    /// The current sizes.
    pub current: RingSizes,
    /// The largest sizes the device allows.
    pub max: RingSizes,
}

/// One value per ring kind, in the kernel's order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingSizes {
    /// `rx`.
    pub rx: Option<u32>,
    /// `rx-mini`.
    pub rx_mini: Option<u32>,
    /// `rx-jumbo`.
    pub rx_jumbo: Option<u32>,
    /// `tx`.
    pub tx: Option<u32>,
}

impl RingSizes {
    fn array(self) -> [Option<u32>; 4] {
        [self.rx, self.rx_mini, self.rx_jumbo, self.tx]
    }

    fn from_array([rx, rx_mini, rx_jumbo, tx]: [Option<u32>; 4]) -> Self {
        Self { rx, rx_mini, rx_jumbo, tx }
    }
}

/// Channel counts of a device (`ETHTOOL_MSG_CHANNELS_GET`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Channels {
    /// The current counts.
    pub current: ChannelCounts,
    /// The largest counts the device allows.
    pub max: ChannelCounts,
}

/// One value per channel kind, in the kernel's order; `None` where the driver reports none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelCounts {
    /// `rx`: receive-only channels.
    pub rx: Option<u32>,
    /// `tx`: transmit-only channels.
    pub tx: Option<u32>,
    /// `other`: link interrupts, SR-IOV coordination.
    pub other: Option<u32>,
    /// `combined`: channels with both a receive and a transmit queue.
    pub combined: Option<u32>,
}

impl ChannelCounts {
    fn array(self) -> [Option<u32>; 4] {
        [self.rx, self.tx, self.other, self.combined]
    }

    fn from_array([rx, tx, other, combined]: [Option<u32>; 4]) -> Self {
        Self { rx, tx, other, combined }
    }
}

/// A netlink socket on the ethtool family, in the network namespace of the thread that
/// opened it.
#[derive(Debug)]
pub struct Client {
    socket: Socket,
    family: u16,
    seq: u32,
}

impl Client {
    /// Opens a `NETLINK_GENERIC` socket (extended ACKs on, ACKs capped) and resolves the
    /// ethtool family's id.
    pub fn open() -> Result<Self, Error> {
        let op = "opening a generic netlink socket";
        let io = |source| Error::Io { op: op.to_owned(), source };
        let mut socket = Socket::new(NETLINK_GENERIC).map_err(io)?;
        socket.bind_auto().map_err(io)?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(io)?;
        // Best effort: without them errors still carry the errno.
        let _ = socket.set_ext_ack(true);
        let _ = socket.set_cap_ack(true);
        let mut client = Client { socket, family: 0, seq: 0 };
        let ctrl = GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(wire::FAMILY.to_owned())],
        };
        let replies =
            match client.exchange(GenlMessage::from_payload(ctrl), "CTRL_CMD_GETFAMILY ethtool") {
                Ok(replies) => replies,
                // ENOENT: no such family.
                Err(Error::Kernel { errno: 2, .. }) => return Err(Error::NoFamily),
                Err(err) => return Err(err),
            };
        client.family = replies
            .iter()
            .flat_map(|m| m.payload.nlas.iter())
            .find_map(|a| match a {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or(Error::NoFamily)?;
        Ok(client)
    }

    /// The offload features of `dev` with their names.
    pub fn features(&mut self, dev: &str) -> Result<Features, Error> {
        let op = format!("ETHTOOL_MSG_STRSET_GET ETH_SS_FEATURES ({dev})");
        let strset = self.request(
            wire::MSG_STRSET_GET,
            vec![
                Attr::header(dev, 0),
                Attr::Nest(
                    wire::A_STRSET_STRINGSETS,
                    vec![Attr::Nest(
                        wire::A_STRINGSETS_STRINGSET,
                        vec![Attr::U32(wire::A_STRINGSET_ID, wire::ETH_SS_FEATURES)],
                    )],
                ),
            ],
            &op,
        )?;
        let names = wire::string_set(&strset, wire::ETH_SS_FEATURES)
            .map_err(|source| Error::Decode { op, source })?;
        let op = format!("ETHTOOL_MSG_FEATURES_GET {dev}");
        let raw = self.request(
            wire::MSG_FEATURES_GET,
            vec![Attr::header(dev, wire::FLAG_COMPACT_BITSETS)],
            &op,
        )?;
        let decode = |source| Error::Decode { op: op.clone(), source };
        let mut features = Features {
            names,
            hw: Vec::new(),
            wanted: Vec::new(),
            active: Vec::new(),
            nochange: Vec::new(),
        };
        for (kind, payload) in wire::attrs(&raw).map_err(decode)? {
            let slot = match kind {
                wire::A_FEATURES_HW => &mut features.hw,
                wire::A_FEATURES_WANTED => &mut features.wanted,
                wire::A_FEATURES_ACTIVE => &mut features.active,
                wire::A_FEATURES_NOCHANGE => &mut features.nochange,
                _ => continue,
            };
            *slot = wire::compact_bitset(payload).map_err(decode)?;
        }
        Ok(features)
    }

    /// Asks for each named feature on or off (`ETHTOOL_MSG_FEATURES_SET`, only the named
    /// bits). The kernel silently keeps a feature that is fixed or held off by a dependency
    /// as it is: read [`Client::features`] afterwards to see what took.
    pub fn set_features(&mut self, dev: &str, changes: &[(String, bool)]) -> Result<(), Error> {
        let names: Vec<&str> = changes.iter().map(|(n, _)| n.as_str()).collect();
        let op = format!("ETHTOOL_MSG_FEATURES_SET {dev} {}", names.join(","));
        self.request(
            wire::MSG_FEATURES_SET,
            vec![
                Attr::header(dev, wire::FLAG_OMIT_REPLY),
                wire::named_bits(wire::A_FEATURES_WANTED, changes),
            ],
            &op,
        )
        .map(drop)
    }

    /// The ring sizes of `dev` and their maxima.
    pub fn rings(&mut self, dev: &str) -> Result<Rings, Error> {
        let op = format!("ETHTOOL_MSG_RINGS_GET {dev}");
        let raw = self.request(wire::MSG_RINGS_GET, vec![Attr::header(dev, 0)], &op)?;
        let decode = |source| Error::Decode { op: op.clone(), source };
        Ok(Rings {
            current: RingSizes::from_array(wire::four_u32(&raw, wire::A_RINGS_RX).map_err(decode)?),
            max: RingSizes::from_array(wire::four_u32(&raw, wire::A_RINGS_RX_MAX).map_err(decode)?),
        })
    }

    /// Sets the ring sizes that are `Some` (`ETHTOOL_MSG_RINGS_SET`).
    pub fn set_rings(&mut self, dev: &str, sizes: RingSizes) -> Result<(), Error> {
        let op = format!("ETHTOOL_MSG_RINGS_SET {dev} {sizes:?}");
        let mut attrs = vec![Attr::header(dev, 0)];
        attrs.extend(wire::four_u32_attrs(wire::A_RINGS_RX, sizes.array()));
        self.request(wire::MSG_RINGS_SET, attrs, &op).map(drop)
    }

    /// The channel counts of `dev` and their maxima.
    pub fn channels(&mut self, dev: &str) -> Result<Channels, Error> {
        let op = format!("ETHTOOL_MSG_CHANNELS_GET {dev}");
        let raw = self.request(wire::MSG_CHANNELS_GET, vec![Attr::header(dev, 0)], &op)?;
        let decode = |source| Error::Decode { op: op.clone(), source };
        Ok(Channels {
            current: ChannelCounts::from_array(
                wire::four_u32(&raw, wire::A_CHANNELS_RX_COUNT).map_err(decode)?,
            ),
            max: ChannelCounts::from_array(
                wire::four_u32(&raw, wire::A_CHANNELS_RX_MAX).map_err(decode)?,
            ),
        })
    }

    /// Sets the channel counts that are `Some` (`ETHTOOL_MSG_CHANNELS_SET`).
    pub fn set_channels(&mut self, dev: &str, counts: ChannelCounts) -> Result<(), Error> {
        let op = format!("ETHTOOL_MSG_CHANNELS_SET {dev} {counts:?}");
        let mut attrs = vec![Attr::header(dev, 0)];
        attrs.extend(wire::four_u32_attrs(wire::A_CHANNELS_RX_COUNT, counts.array()));
        self.request(wire::MSG_CHANNELS_SET, attrs, &op).map(drop)
    }

    /// One ethtool request; the attributes of its reply (empty for a SET).
    fn request(&mut self, cmd: u8, attrs: Vec<Attr>, op: &str) -> Result<Vec<u8>, Error> {
        let mut message = GenlMessage::from_payload(Message { cmd, attrs, raw: Vec::new() });
        message.set_resolved_family_id(self.family);
        let replies = self.exchange(message, op)?;
        Ok(replies.into_iter().next().map(|m| m.payload.raw).unwrap_or_default())
    }

    /// Sends `message` with `NLM_F_REQUEST | NLM_F_ACK` and collects the replies until the
    /// ACK (or the error).
    fn exchange<F>(
        &mut self,
        message: GenlMessage<F>,
        op: &str,
    ) -> Result<Vec<GenlMessage<F>>, Error>
    where
        F: GenlFamily + Emitable + ParseableParametrized<[u8], GenlHeader> + std::fmt::Debug,
    {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut packet = NetlinkMessage::from(message);
        packet.header.flags = NLM_F_REQUEST | NLM_F_ACK;
        packet.header.sequence_number = seq;
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        let io = |source| Error::Io { op: op.to_owned(), source };
        self.socket.send(&out, 0).map_err(io)?;
        let decode = |source| Error::Decode { op: op.to_owned(), source };
        let mut replies = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let len = self.socket.recv(&mut &mut buf[..], 0).map_err(io)?;
            let mut offset = 0;
            while offset + NLMSG_HDRLEN <= len {
                let bytes = &buf[offset..len];
                let parsed =
                    NetlinkMessage::<GenlMessage<F>>::deserialize(bytes).map_err(decode)?;
                let length = usize::try_from(parsed.header.length).unwrap_or(usize::MAX);
                if length < NLMSG_HDRLEN {
                    return Err(decode(DecodeError::from(
                        "a netlink message shorter than its header",
                    )));
                }
                offset += length.div_ceil(4) * 4;
                if parsed.header.sequence_number != seq {
                    continue;
                }
                match parsed.payload {
                    NetlinkPayload::InnerMessage(reply) => replies.push(reply),
                    NetlinkPayload::Error(err) => {
                        let Some(code) = err.code else { return Ok(replies) };
                        return Err(Error::Kernel {
                            op: op.to_owned(),
                            errno: code.get().abs(),
                            message: extack_message(parsed.header.flags, &err.header),
                        });
                    }
                    NetlinkPayload::Done(_) => return Ok(replies),
                    _ => {}
                }
            }
        }
    }
}

/// The `NLMSGERR_ATTR_MSG` of an error's extended ACK: after the echoed request (only its
/// header when `NLM_F_CAPPED`), when `NLM_F_ACK_TLVS` says attributes follow.
fn extack_message(flags: u16, echoed_and_tlvs: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let echoed = if flags & NLM_F_CAPPED != 0 {
        NLMSG_HDRLEN
    } else {
        let len = echoed_and_tlvs.get(..4)?;
        usize::try_from(u32::from_ne_bytes([len[0], len[1], len[2], len[3]])).ok()?
    };
    let tlvs = echoed_and_tlvs.get(echoed.div_ceil(4) * 4..)?;
    wire::attrs(tlvs)
        .ok()?
        .into_iter()
        .find(|(kind, _)| *kind == NLMSGERR_ATTR_MSG)
        .and_then(|(_, value)| wire::string_of(value).ok())
        .filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests;
