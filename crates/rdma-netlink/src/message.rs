//! The codec: [`NldevMessage`] (one netlink message of client `RDMA_NL_NLDEV`), its
//! attributes, and the decoded views of a device ([`Device`]) and a port ([`Port`]).

use netlink_packet_core::{
    DecodeError, DefaultNla, Emitable, NetlinkDeserializable, NetlinkHeader, NetlinkSerializable,
    Nla, NlaBuffer, NlasIterator, Parseable, emit_u32, parse_string, parse_u8, parse_u32,
    parse_u64,
};

use crate::{Error, RDMA_NL_NLDEV, attr, command};

/// `RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, op)`: the netlink message type of an operation.
#[must_use]
pub const fn message_type(op: u16) -> u16 {
    (RDMA_NL_NLDEV << 10) + op
}

/// `RDMA_NL_GET_CLIENT(type)`: the client of a message type (bits 10..16).
#[must_use]
pub const fn client_of(message_type: u16) -> u16 {
    (message_type >> 10) & 0x3f
}

/// `RDMA_NL_GET_OP(type)`: the operation of a message type (bits 0..10).
#[must_use]
pub const fn op_of(message_type: u16) -> u16 {
    message_type & 0x3ff
}

/// One attribute of an `RDMA_NL_NLDEV` message. Integers are in host byte order, strings
/// NUL-terminated on the wire (the kernel's policy for names is `NLA_NUL_STRING`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NldevAttribute {
    /// `RDMA_NLDEV_ATTR_DEV_INDEX`.
    DevIndex(u32),
    /// `RDMA_NLDEV_ATTR_DEV_NAME`.
    DevName(String),
    /// `RDMA_NLDEV_ATTR_PORT_INDEX` (the port count in a device message).
    PortIndex(u32),
    /// `RDMA_NLDEV_ATTR_FW_VERSION`.
    FwVersion(String),
    /// `RDMA_NLDEV_ATTR_NODE_GUID`.
    NodeGuid(u64),
    /// `RDMA_NLDEV_ATTR_SYS_IMAGE_GUID`.
    SysImageGuid(u64),
    /// `RDMA_NLDEV_ATTR_PORT_STATE`.
    PortState(u8),
    /// `RDMA_NLDEV_ATTR_PORT_PHYS_STATE`.
    PortPhysState(u8),
    /// `RDMA_NLDEV_ATTR_DEV_NODE_TYPE`.
    DevNodeType(u8),
    /// `RDMA_NLDEV_ATTR_NDEV_INDEX`.
    NdevIndex(u32),
    /// `RDMA_NLDEV_ATTR_NDEV_NAME`.
    NdevName(String),
    /// `RDMA_NLDEV_ATTR_LINK_TYPE`.
    LinkType(String),
    /// `RDMA_NLDEV_SYS_ATTR_NETNS_MODE`.
    NetnsMode(u8),
    /// `RDMA_NLDEV_ATTR_DEV_PROTOCOL`.
    DevProtocol(String),
    /// `RDMA_NLDEV_NET_NS_FD`.
    NetNsFd(u32),
    /// Any other attribute (padding, capabilities, counters, ...), kept raw.
    Other(DefaultNla),
}

impl Nla for NldevAttribute {
    fn value_len(&self) -> usize {
        match self {
            Self::DevIndex(_) | Self::PortIndex(_) | Self::NdevIndex(_) | Self::NetNsFd(_) => 4,
            Self::NodeGuid(_) | Self::SysImageGuid(_) => 8,
            Self::PortState(_)
            | Self::PortPhysState(_)
            | Self::DevNodeType(_)
            | Self::NetnsMode(_) => 1,
            Self::DevName(text)
            | Self::FwVersion(text)
            | Self::NdevName(text)
            | Self::LinkType(text)
            | Self::DevProtocol(text) => text.len() + 1,
            Self::Other(nla) => nla.value_len(),
        }
    }

    fn kind(&self) -> u16 {
        match self {
            Self::DevIndex(_) => attr::DEV_INDEX,
            Self::DevName(_) => attr::DEV_NAME,
            Self::PortIndex(_) => attr::PORT_INDEX,
            Self::FwVersion(_) => attr::FW_VERSION,
            Self::NodeGuid(_) => attr::NODE_GUID,
            Self::SysImageGuid(_) => attr::SYS_IMAGE_GUID,
            Self::PortState(_) => attr::PORT_STATE,
            Self::PortPhysState(_) => attr::PORT_PHYS_STATE,
            Self::DevNodeType(_) => attr::DEV_NODE_TYPE,
            Self::NdevIndex(_) => attr::NDEV_INDEX,
            Self::NdevName(_) => attr::NDEV_NAME,
            Self::LinkType(_) => attr::LINK_TYPE,
            Self::NetnsMode(_) => attr::NETNS_MODE,
            Self::DevProtocol(_) => attr::DEV_PROTOCOL,
            Self::NetNsFd(_) => attr::NET_NS_FD,
            Self::Other(nla) => nla.kind(),
        }
    }

    fn emit_value(&self, buffer: &mut [u8]) {
        match self {
            Self::DevIndex(value)
            | Self::PortIndex(value)
            | Self::NdevIndex(value)
            | Self::NetNsFd(value) => {
                // `buffer` is exactly `value_len()` = 4 bytes (netlink-packet-core's contract).
                let _ = emit_u32(buffer, *value);
            }
            Self::NodeGuid(value) | Self::SysImageGuid(value) => {
                buffer.copy_from_slice(&value.to_ne_bytes());
            }
            Self::PortState(value)
            | Self::PortPhysState(value)
            | Self::DevNodeType(value)
            | Self::NetnsMode(value) => buffer[0] = *value,
            Self::DevName(text)
            | Self::FwVersion(text)
            | Self::NdevName(text)
            | Self::LinkType(text)
            | Self::DevProtocol(text) => {
                let (body, nul) = buffer.split_at_mut(text.len());
                body.copy_from_slice(text.as_bytes());
                nul.fill(0);
            }
            Self::Other(nla) => nla.emit_value(buffer),
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Parseable<NlaBuffer<&'a T>> for NldevAttribute {
    fn parse(buf: &NlaBuffer<&'a T>) -> Result<Self, DecodeError> {
        let value = buf.value();
        Ok(match buf.kind() {
            attr::DEV_INDEX => Self::DevIndex(parse_u32(value)?),
            attr::DEV_NAME => Self::DevName(parse_string(value)?),
            attr::PORT_INDEX => Self::PortIndex(parse_u32(value)?),
            attr::FW_VERSION => Self::FwVersion(parse_string(value)?),
            attr::NODE_GUID => Self::NodeGuid(parse_u64(value)?),
            attr::SYS_IMAGE_GUID => Self::SysImageGuid(parse_u64(value)?),
            attr::PORT_STATE => Self::PortState(parse_u8(value)?),
            attr::PORT_PHYS_STATE => Self::PortPhysState(parse_u8(value)?),
            attr::DEV_NODE_TYPE => Self::DevNodeType(parse_u8(value)?),
            attr::NDEV_INDEX => Self::NdevIndex(parse_u32(value)?),
            attr::NDEV_NAME => Self::NdevName(parse_string(value)?),
            attr::LINK_TYPE => Self::LinkType(parse_string(value)?),
            attr::NETNS_MODE => Self::NetnsMode(parse_u8(value)?),
            attr::DEV_PROTOCOL => Self::DevProtocol(parse_string(value)?),
            attr::NET_NS_FD => Self::NetNsFd(parse_u32(value)?),
            _ => Self::Other(DefaultNla::parse(buf)?),
        })
    }
}

/// One `RDMA_NL_NLDEV` message: the operation (from the message type) and its attributes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NldevMessage {
    /// The operation, one of [`command`].
    pub command: u16,
    /// The attributes in wire order.
    pub attributes: Vec<NldevAttribute>,
}

impl NldevMessage {
    /// A message of operation `command` with `attributes`.
    #[must_use]
    pub fn new(command: u16, attributes: Vec<NldevAttribute>) -> Self {
        Self { command, attributes }
    }

    fn find<V>(&self, pick: impl Fn(&NldevAttribute) -> Option<V>) -> Option<V> {
        self.attributes.iter().find_map(pick)
    }

    fn required<V>(
        &self,
        attribute: u16,
        pick: impl Fn(&NldevAttribute) -> Option<V>,
    ) -> Result<V, Error> {
        self.find(pick).ok_or(Error::MissingAttribute {
            command: command::name(self.command),
            attribute: attr::name(attribute),
        })
    }

    /// The netns mode of an `RDMA_NLDEV_CMD_SYS_GET` answer (1 shared, 0 exclusive).
    pub fn netns_mode(&self) -> Result<u8, Error> {
        self.required(attr::NETNS_MODE, |a| match a {
            NldevAttribute::NetnsMode(mode) => Some(*mode),
            _ => None,
        })
    }
}

impl NetlinkSerializable for NldevMessage {
    fn message_type(&self) -> u16 {
        message_type(self.command)
    }

    fn buffer_len(&self) -> usize {
        self.attributes.as_slice().buffer_len()
    }

    fn serialize(&self, buffer: &mut [u8]) {
        self.attributes.as_slice().emit(buffer);
    }
}

impl NetlinkDeserializable for NldevMessage {
    type Error = DecodeError;

    fn deserialize(header: &NetlinkHeader, payload: &[u8]) -> Result<Self, DecodeError> {
        let client = client_of(header.message_type);
        if client != RDMA_NL_NLDEV {
            return Err(DecodeError::from(format!(
                "message type {} is of RDMA netlink client {client}, not RDMA_NL_NLDEV",
                header.message_type
            )));
        }
        let attributes = NlasIterator::new(payload)
            .map(|nla| nla.and_then(|nla| NldevAttribute::parse(&nla)))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { command: op_of(header.message_type), attributes })
    }
}

/// An RDMA device as `RDMA_NLDEV_CMD_GET` describes it (`rdma dev`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// The kernel's device index.
    pub index: u32,
    /// The device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// How many ports it has (`rdma_end_port`).
    pub ports: u32,
    /// Firmware version, when the driver reports one.
    pub firmware: Option<String>,
    /// Node GUID (host byte order).
    pub node_guid: Option<u64>,
    /// System image GUID (host byte order).
    pub sys_image_guid: Option<u64>,
    /// `enum rdma_node_type` ([`node_type_name`]).
    pub node_type: Option<u8>,
    /// `roce`, `ib`, `iw`, `opa`, `usnic`, where the kernel can tell.
    pub protocol: Option<String>,
}

impl TryFrom<&NldevMessage> for Device {
    type Error = Error;

    fn try_from(message: &NldevMessage) -> Result<Self, Error> {
        Ok(Self {
            index: message.required(attr::DEV_INDEX, |a| match a {
                NldevAttribute::DevIndex(index) => Some(*index),
                _ => None,
            })?,
            name: message.required(attr::DEV_NAME, |a| match a {
                NldevAttribute::DevName(name) => Some(name.clone()),
                _ => None,
            })?,
            ports: message.required(attr::PORT_INDEX, |a| match a {
                NldevAttribute::PortIndex(ports) => Some(*ports),
                _ => None,
            })?,
            firmware: message.find(|a| match a {
                NldevAttribute::FwVersion(text) => Some(text.clone()),
                _ => None,
            }),
            node_guid: message.find(|a| match a {
                NldevAttribute::NodeGuid(guid) => Some(*guid),
                _ => None,
            }),
            sys_image_guid: message.find(|a| match a {
                NldevAttribute::SysImageGuid(guid) => Some(*guid),
                _ => None,
            }),
            node_type: message.find(|a| match a {
                NldevAttribute::DevNodeType(kind) => Some(*kind),
                _ => None,
            }),
            protocol: message.find(|a| match a {
                NldevAttribute::DevProtocol(text) => Some(text.clone()),
                _ => None,
            }),
        })
    }
}

/// A port as `RDMA_NLDEV_CMD_PORT_GET` describes it (`rdma link`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// The device's index.
    pub device_index: u32,
    /// The device's name.
    pub device_name: String,
    /// The port number (1-based).
    pub port: u32,
    /// IBTA port state ([`port_state_name`]).
    pub state: Option<u8>,
    /// IBTA physical port state ([`phys_state_name`]).
    pub phys_state: Option<u8>,
    /// The netdev of a RoCE/iWARP port; the kernel sends it only when the netdev is in the
    /// asking socket's netns.
    pub netdev_index: Option<u32>,
    /// Its name.
    pub netdev_name: Option<String>,
}

impl TryFrom<&NldevMessage> for Port {
    type Error = Error;

    fn try_from(message: &NldevMessage) -> Result<Self, Error> {
        Ok(Self {
            device_index: message.required(attr::DEV_INDEX, |a| match a {
                NldevAttribute::DevIndex(index) => Some(*index),
                _ => None,
            })?,
            device_name: message.required(attr::DEV_NAME, |a| match a {
                NldevAttribute::DevName(name) => Some(name.clone()),
                _ => None,
            })?,
            port: message.required(attr::PORT_INDEX, |a| match a {
                NldevAttribute::PortIndex(port) => Some(*port),
                _ => None,
            })?,
            state: message.find(|a| match a {
                NldevAttribute::PortState(state) => Some(*state),
                _ => None,
            }),
            phys_state: message.find(|a| match a {
                NldevAttribute::PortPhysState(state) => Some(*state),
                _ => None,
            }),
            netdev_index: message.find(|a| match a {
                NldevAttribute::NdevIndex(index) => Some(*index),
                _ => None,
            }),
            netdev_name: message.find(|a| match a {
                NldevAttribute::NdevName(name) => Some(name.clone()),
                _ => None,
            }),
        })
    }
}

/// IBTA port states (`enum ib_port_state`), spelled as `rdma link` prints them.
#[must_use]
pub fn port_state_name(state: u8) -> &'static str {
    match state {
        0 => "NOP",
        1 => "DOWN",
        2 => "INIT",
        3 => "ARMED",
        4 => "ACTIVE",
        5 => "ACTIVE_DEFER",
        _ => "UNKNOWN",
    }
}

/// IBTA physical port states (`enum ib_port_phys_state`), spelled as `rdma link` prints
/// them.
#[must_use]
pub fn phys_state_name(state: u8) -> &'static str {
    match state {
        0 => "NOP",
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "ARMED",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVER",
        7 => "PHY_TEST",
        9 => "OPA_OFFLINE",
        11 => "OPA_TEST",
        _ => "UNKNOWN",
    }
}

/// Node types (`enum rdma_node_type`), spelled as `rdma dev` prints them.
#[must_use]
pub fn node_type_name(node_type: u8) -> &'static str {
    match node_type {
        1 => "ca",
        2 => "switch",
        3 => "router",
        4 => "rnic",
        5 => "usnic",
        6 => "usnic_udp",
        7 => "unspecified",
        _ => "unknown",
    }
}
