//! RDMA facts of a network interface (DESIGN §2): the RDMA device on the same function, its
//! link layer, node GUID and ports, the character devices a pod needs to use it, and the
//! node's RDMA network-namespace mode. Pure data: `host::rdma` reads them from the RDMA
//! netlink family and sysfs, the inventory publishes them, prepare decides with them.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::device::PciAddress;

/// What discovery learned about the RDMA function of one netdev. Unknown facts are `None`
/// (and omitted from the published attributes). Not persisted: discovery reads it fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RdmaFacts {
    /// The RDMA device's name (`mlx5_0`, `rxe0`): `RDMA_NLDEV_ATTR_DEV_NAME`, the entry in
    /// `/sys/class/infiniband`.
    pub device: String,
    /// The kernel's index of the RDMA device (`RDMA_NLDEV_ATTR_DEV_INDEX`; the move into a
    /// netns addresses the device by it). Indexes are not reused while the device exists but
    /// change when it is registered again: look it up fresh before acting.
    pub index: Option<u32>,
    /// The port this netdev sits on (1-based, as in `/sys/class/infiniband/<dev>/ports/`).
    pub port: Option<u32>,
    /// How many ports the RDMA device has (`RDMA_NLDEV_ATTR_PORT_INDEX` of the device dump).
    pub ports: u32,
    /// Link layer of [`Self::port`] (`ports/<n>/link_layer`).
    pub link_layer: Option<RdmaLinkLayer>,
    /// Node GUID as the kernel and `rdma dev` print it: four groups of four hex digits
    /// (`5054:00ff:fe12:3456`).
    pub node_guid: Option<String>,
    /// The PCI function behind the RDMA device (`/sys/class/infiniband/<dev>/device`);
    /// `None` for a software device (`rdma_rxe`, `siw`), which has no bus device. Software
    /// devices lack `disassociate_ucontext`, so the kernel refuses to move them to another
    /// netns (`EOPNOTSUPP`).
    pub pci_address: Option<PciAddress>,
    /// The node's RDMA netns mode when discovery read it (`RDMA_NLDEV_SYS_ATTR_NETNS_MODE`).
    pub netns_mode: Option<RdmaNetnsMode>,
    /// Character devices a container needs for this RDMA device, host paths, in this order:
    /// `uverbsN` of the device, `umadN` of each of its ports (where `ib_umad` is loaded),
    /// then the node-wide `rdma_cm` (where `rdma_ucm` is loaded).
    pub char_devices: Vec<PathBuf>,
}

impl RdmaFacts {
    /// A device with only its name and port count known.
    #[must_use]
    pub fn new(device: &str, ports: u32) -> Self {
        Self {
            device: device.to_owned(),
            index: None,
            port: None,
            ports,
            link_layer: None,
            node_guid: None,
            pci_address: None,
            netns_mode: None,
            char_devices: Vec::new(),
        }
    }

    /// A software RDMA device (no bus device behind it: `rdma_rxe`, `siw`).
    #[must_use]
    pub fn is_software(&self) -> bool {
        self.pci_address.is_none()
    }
}

/// A port's link layer (`/sys/class/infiniband/<dev>/ports/<n>/link_layer`; the kernel
/// writes `InfiniBand`, `Ethernet` or `Unknown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RdmaLinkLayer {
    /// RoCE and iWARP ports (and soft-RoCE).
    Ethernet,
    /// Native InfiniBand (and OmniPath) ports.
    InfiniBand,
}

impl RdmaLinkLayer {
    /// The kernel's spelling, also the attribute value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ethernet => "Ethernet",
            Self::InfiniBand => "InfiniBand",
        }
    }

    /// Reads the kernel's spelling; `Unknown` and anything else is `None`.
    #[must_use]
    pub fn from_kernel(text: &str) -> Option<Self> {
        match text.trim() {
            "Ethernet" => Some(Self::Ethernet),
            "InfiniBand" => Some(Self::InfiniBand),
            _ => None,
        }
    }
}

impl fmt::Display for RdmaLinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The node's RDMA network-namespace mode (`ib_core`'s `netns_mode` parameter, `rdma system
/// set netns`): shared, every RDMA device is visible in every netns; exclusive, each device
/// belongs to one netns and moves with `RDMA_NLDEV_CMD_SET` + `RDMA_NLDEV_NET_NS_FD`. The
/// kernel refuses to switch modes (`EBUSY`) once a netns other than the initial one exists,
/// so on a node with pods the mode is fixed from boot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RdmaNetnsMode {
    /// Devices belong to one netns each.
    Exclusive,
    /// Devices are visible in every netns (the kernel's default).
    Shared,
}

impl RdmaNetnsMode {
    /// The attribute value (and `rdma system`'s spelling).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
        }
    }

    /// From `RDMA_NLDEV_SYS_ATTR_NETNS_MODE` (`ib_devices_shared_netns`: 1 shared, 0
    /// exclusive).
    #[must_use]
    pub fn from_kernel(value: u8) -> Self {
        if value == 0 { Self::Exclusive } else { Self::Shared }
    }
}

impl fmt::Display for RdmaNetnsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Formats a node GUID the way the kernel's sysfs and `rdma dev` do (`RDMA_NLDEV_ATTR_NODE_GUID`
/// is in host byte order).
#[must_use]
pub fn format_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_print_as_four_groups() {
        assert_eq!(format_guid(0x5054_00ff_fe12_3456), "5054:00ff:fe12:3456");
        assert_eq!(format_guid(1), "0000:0000:0000:0001");
    }

    #[test]
    fn link_layers_read_the_kernels_spelling() {
        assert_eq!(RdmaLinkLayer::from_kernel("Ethernet\n"), Some(RdmaLinkLayer::Ethernet));
        assert_eq!(RdmaLinkLayer::from_kernel("InfiniBand"), Some(RdmaLinkLayer::InfiniBand));
        assert_eq!(RdmaLinkLayer::from_kernel("Unknown"), None);
    }

    #[test]
    fn netns_mode_follows_ib_devices_shared_netns() {
        assert_eq!(RdmaNetnsMode::from_kernel(0), RdmaNetnsMode::Exclusive);
        assert_eq!(RdmaNetnsMode::from_kernel(1), RdmaNetnsMode::Shared);
        assert_eq!(RdmaNetnsMode::Exclusive.to_string(), "exclusive");
    }
}
