//! The kernel's RDMA netlink family (`NETLINK_RDMA`), client `RDMA_NL_NLDEV`: what
//! `rdma dev`, `rdma link` and `rdma system` ask, as a small codec over netlink-packet-core
//! and a blocking client over netlink-sys. No Rust crate covers this family.
//!
//! Covered: the device dump (`RDMA_NLDEV_CMD_GET`), the port dump of one device
//! (`RDMA_NLDEV_CMD_PORT_GET`), the node's netns mode (`RDMA_NLDEV_CMD_SYS_GET`), moving a
//! device into a network namespace (`RDMA_NLDEV_CMD_SET` with `RDMA_NLDEV_NET_NS_FD`), and
//! adding or deleting a software RDMA link (`RDMA_NLDEV_CMD_NEWLINK`/`DELLINK`: `rdma_rxe`,
//! `siw`). Other attributes the kernel sends are kept as raw [`NldevAttribute::Other`].
//!
//! Unlike generic netlink there is no family header: the attributes follow the netlink
//! header directly, and the message type carries both the client and the operation
//! (`RDMA_NL_GET_TYPE(client, op) = (client << 10) + op`). Numbers are from the kernel's
//! `include/uapi/rdma/rdma_netlink.h`, which is ABI ("don't change the order or add anything
//! between").
//!
//! The socket answers for the network namespace of the thread that opened it: in exclusive
//! netns mode a dump lists only the devices of that namespace.

mod client;
mod message;

use std::io;

pub use client::RdmaSocket;
pub use message::{
    Device, NldevAttribute, NldevMessage, Port, client_of, message_type, node_type_name, op_of,
    phys_state_name, port_state_name,
};
pub use netlink_packet_core::DecodeError;

/// `NETLINK_RDMA`: the netlink protocol number of the RDMA subsystem.
pub const NETLINK_RDMA: isize = 20;

/// `RDMA_NL_NLDEV`: the RDMA device interface client.
pub const RDMA_NL_NLDEV: u16 = 5;

/// Operations of `RDMA_NL_NLDEV` (`enum rdma_nldev_command`).
pub mod command {
    /// `RDMA_NLDEV_CMD_GET`: one device, or all of them as a dump.
    pub const GET: u16 = 1;
    /// `RDMA_NLDEV_CMD_SET`: rename a device, or move it into a netns.
    pub const SET: u16 = 2;
    /// `RDMA_NLDEV_CMD_NEWLINK`: add a software RDMA link (`rxe`, `siw`) on a netdev.
    pub const NEWLINK: u16 = 3;
    /// `RDMA_NLDEV_CMD_DELLINK`: delete a software RDMA link.
    pub const DELLINK: u16 = 4;
    /// `RDMA_NLDEV_CMD_PORT_GET`: the ports of one device (a dump needs the device index).
    pub const PORT_GET: u16 = 5;
    /// `RDMA_NLDEV_CMD_SYS_GET`: system-wide settings (netns mode).
    pub const SYS_GET: u16 = 6;

    /// The uapi name of an operation, for messages.
    #[must_use]
    pub fn name(op: u16) -> &'static str {
        match op {
            GET => "RDMA_NLDEV_CMD_GET",
            SET => "RDMA_NLDEV_CMD_SET",
            NEWLINK => "RDMA_NLDEV_CMD_NEWLINK",
            DELLINK => "RDMA_NLDEV_CMD_DELLINK",
            PORT_GET => "RDMA_NLDEV_CMD_PORT_GET",
            SYS_GET => "RDMA_NLDEV_CMD_SYS_GET",
            _ => "RDMA_NLDEV_CMD_?",
        }
    }
}

/// Attribute numbers of `enum rdma_nldev_attr` this crate decodes.
pub mod attr {
    /// `RDMA_NLDEV_ATTR_PAD` (= `UNSPEC`): alignment padding before 64-bit values.
    pub const PAD: u16 = 0;
    /// `RDMA_NLDEV_ATTR_DEV_INDEX`, u32.
    pub const DEV_INDEX: u16 = 1;
    /// `RDMA_NLDEV_ATTR_DEV_NAME`, string.
    pub const DEV_NAME: u16 = 2;
    /// `RDMA_NLDEV_ATTR_PORT_INDEX`, u32: the port count in a device message, the port in a
    /// port message (1-based).
    pub const PORT_INDEX: u16 = 3;
    /// `RDMA_NLDEV_ATTR_FW_VERSION`, string.
    pub const FW_VERSION: u16 = 5;
    /// `RDMA_NLDEV_ATTR_NODE_GUID`, u64 in host byte order.
    pub const NODE_GUID: u16 = 6;
    /// `RDMA_NLDEV_ATTR_SYS_IMAGE_GUID`, u64 in host byte order.
    pub const SYS_IMAGE_GUID: u16 = 7;
    /// `RDMA_NLDEV_ATTR_PORT_STATE`, u8 (IBTA port state).
    pub const PORT_STATE: u16 = 12;
    /// `RDMA_NLDEV_ATTR_PORT_PHYS_STATE`, u8 (IBTA physical port state).
    pub const PORT_PHYS_STATE: u16 = 13;
    /// `RDMA_NLDEV_ATTR_DEV_NODE_TYPE`, u8 (`enum rdma_node_type`).
    pub const DEV_NODE_TYPE: u16 = 14;
    /// `RDMA_NLDEV_ATTR_NDEV_INDEX`, u32: the netdev of a RoCE/iWARP port.
    pub const NDEV_INDEX: u16 = 50;
    /// `RDMA_NLDEV_ATTR_NDEV_NAME`, string.
    pub const NDEV_NAME: u16 = 51;
    /// `RDMA_NLDEV_ATTR_LINK_TYPE`, string: the software driver of a new link (`rxe`).
    pub const LINK_TYPE: u16 = 65;
    /// `RDMA_NLDEV_SYS_ATTR_NETNS_MODE`, u8: 1 shared, 0 exclusive.
    pub const NETNS_MODE: u16 = 66;
    /// `RDMA_NLDEV_ATTR_DEV_PROTOCOL`, string (`roce`, `ib`, `iw`, ...).
    pub const DEV_PROTOCOL: u16 = 67;
    /// `RDMA_NLDEV_NET_NS_FD`, u32: a file descriptor of the target netns.
    pub const NET_NS_FD: u16 = 68;

    /// The uapi name of an attribute, for messages.
    #[must_use]
    pub fn name(kind: u16) -> &'static str {
        match kind {
            DEV_INDEX => "RDMA_NLDEV_ATTR_DEV_INDEX",
            DEV_NAME => "RDMA_NLDEV_ATTR_DEV_NAME",
            PORT_INDEX => "RDMA_NLDEV_ATTR_PORT_INDEX",
            NETNS_MODE => "RDMA_NLDEV_SYS_ATTR_NETNS_MODE",
            _ => "RDMA_NLDEV_ATTR_?",
        }
    }
}

/// A request the kernel refused or answered in a way this crate cannot use.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `NETLINK_RDMA` socket could not be opened (`EPROTONOSUPPORT` when `ib_core` is
    /// not loaded).
    #[error("opening a NETLINK_RDMA socket: {0}")]
    Socket(#[source] io::Error),
    /// Sending the request failed.
    #[error("sending {command}: {source}")]
    Send {
        /// The operation's uapi name.
        command: &'static str,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// Receiving the answer failed.
    #[error("reading the answer to {command}: {source}")]
    Receive {
        /// The operation's uapi name.
        command: &'static str,
        /// The socket error.
        #[source]
        source: io::Error,
    },
    /// The answer does not decode.
    #[error("decoding the answer to {command}: {source}")]
    Decode {
        /// The operation's uapi name.
        command: &'static str,
        /// The codec's complaint.
        #[source]
        source: DecodeError,
    },
    /// The kernel answered with an error (`NLMSG_ERROR` or a failed `NLMSG_DONE`).
    #[error("the kernel refused {command}: {source}")]
    Kernel {
        /// The operation's uapi name.
        command: &'static str,
        /// The errno, as an I/O error (`raw_os_error` gives the number).
        #[source]
        source: io::Error,
    },
    /// An answer lacks an attribute the kernel always sends.
    #[error("the answer to {command} lacks {attribute}")]
    MissingAttribute {
        /// The operation's uapi name.
        command: &'static str,
        /// The attribute's uapi name.
        attribute: &'static str,
    },
}

impl Error {
    /// The errno the kernel answered with, if this is a kernel refusal (`EOPNOTSUPP` = 95
    /// when a device's driver cannot change netns, `EPERM` without `CAP_NET_ADMIN`, ...).
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
