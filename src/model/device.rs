//! Host interfaces as discovered, and the DRA devices they become.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A host network interface with everything discovery learned about it.
///
/// Filled by `host::discovery` from netlink and sysfs; consumed by the pure `inventory`.
/// Unknown facts are `None`: we omit them from the published attributes rather than guess.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostInterface {
    /// Kernel interface index in the host network namespace.
    pub index: u32,
    /// Interface name (`IFLA_IFNAME`).
    pub name: String,
    /// The loopback interface (`IFF_LOOPBACK`).
    pub loopback: bool,
    /// Current hardware address.
    pub mac: Option<MacAddress>,
    /// Current MTU.
    pub mtu: u32,
    /// Smallest MTU the driver accepts (`IFLA_MIN_MTU`).
    pub min_mtu: Option<u32>,
    /// Largest MTU the driver accepts (`IFLA_MAX_MTU`).
    pub max_mtu: Option<u32>,
    /// Link kind from `IFLA_INFO_KIND`; `None` for a real (driver-backed) NIC.
    pub kind: Option<LinkKind>,
    /// Operational state.
    pub oper_state: OperState,
    /// Carrier detected (`IFLA_CARRIER`).
    pub carrier: Option<bool>,
    /// Administratively up (`IFF_UP`); `None` when not reported.
    pub admin_up: Option<bool>,
    /// The driver signals a working lower layer (`IFF_LOWER_UP`, the carrier as the link
    /// flags carry it); `None` when not reported.
    pub lower_up: Option<bool>,
    /// The bond or bridge this interface is enslaved to (`IFLA_MASTER`).
    pub controller: Option<Controller>,
    /// The interface carries a default route (IPv4 or IPv6, main table).
    pub has_default_route: bool,
    /// Global-scope addresses on the interface (the node's own addresses).
    pub global_addresses: Vec<String>,
    /// Facts of the backing bus device, from sysfs.
    pub hardware: HardwareFacts,
    /// The RDMA function on the same device (RoCE, InfiniBand, soft-RoCE), when it has one.
    pub rdma: Option<super::rdma::RdmaFacts>,
}

impl HostInterface {
    /// A bare interface with only the mandatory facts; tests and discovery fill in the rest.
    #[must_use]
    pub fn new(index: u32, name: &str, mtu: u32) -> Self {
        Self {
            index,
            name: name.to_owned(),
            loopback: name == "lo",
            mac: None,
            mtu,
            min_mtu: None,
            max_mtu: None,
            kind: None,
            oper_state: OperState::Unknown,
            carrier: None,
            admin_up: None,
            lower_up: None,
            controller: None,
            has_default_route: false,
            global_addresses: Vec::new(),
            hardware: HardwareFacts::default(),
            rdma: None,
        }
    }
}

/// Facts about the device behind an interface, read from `/sys/class/net/<if>/device`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HardwareFacts {
    /// The interface has a backing bus device at all (`device` link in sysfs).
    pub has_device: bool,
    /// PCI facts when the device sits on the PCI bus.
    pub pci: Option<PciFacts>,
    /// Kernel driver bound to the device (`device/driver` link).
    pub driver: Option<String>,
    /// Link speed in Mbit/s (`speed`), when known.
    pub speed_mbps: Option<u32>,
}

/// PCI facts of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciFacts {
    /// Address `dddd:bb:dd.f`.
    pub address: PciAddress,
    /// Vendor id.
    pub vendor: Option<u16>,
    /// Device id.
    pub device: Option<u16>,
    /// NUMA node; `None` when the kernel reports -1 (no affinity).
    pub numa_node: Option<u32>,
    /// PCIe root complex, `pci<domain>:<bus>` as in the sysfs device path.
    pub pcie_root: Option<String>,
    /// SR-IOV relation of this function.
    pub sriov: SriovRole,
}

/// Whether a PCI function is an SR-IOV physical function, a virtual function, or neither.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SriovRole {
    /// Not SR-IOV capable.
    None,
    /// A physical function with `total_vfs` possible and `num_vfs` enabled VFs.
    PhysicalFunction {
        /// `sriov_totalvfs`.
        total_vfs: u32,
        /// `sriov_numvfs`.
        num_vfs: u32,
    },
    /// A virtual function of `pf_address`.
    VirtualFunction {
        /// PCI address of the PF.
        pf_address: PciAddress,
        /// Interface name of the PF, when it has a netdev.
        pf_name: Option<String>,
        /// Index `N` of the PF's `virtfnN` link pointing at this VF.
        vf_index: Option<u32>,
    },
}

/// A PCI address `domain:bus:device.function`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number (0..32).
    pub device: u8,
    /// Function number (0..8).
    pub function: u8,
}

/// An invalid PCI address string.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid PCI address {value:?}: expected dddd:bb:dd.f")]
pub struct PciAddressError {
    /// The rejected text.
    pub value: String,
}

impl std::str::FromStr for PciAddress {
    type Err = PciAddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PciAddressError { value: s.to_owned() };
        let (domain, rest) = s.split_once(':').ok_or_else(err)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(err)?;
        let (device, function) = rest.split_once('.').ok_or_else(err)?;
        let hex = |text: &str, max_len: usize| {
            if text.is_empty() || text.len() > max_len {
                return Err(err());
            }
            u32::from_str_radix(text, 16).map_err(|_| err())
        };
        let device = hex(device, 2)?;
        let function = hex(function, 1)?;
        if device >= 32 || function >= 8 {
            return Err(err());
        }
        Ok(Self {
            domain: hex(domain, 4)?,
            bus: u8::try_from(hex(bus, 2)?).map_err(|_| err())?,
            device: u8::try_from(device).map_err(|_| err())?,
            function: u8::try_from(function).map_err(|_| err())?,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

/// A hardware address of any length (Ethernet: 6 bytes; InfiniBand: 20).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MacAddress(pub Vec<u8>);

impl fmt::Display for MacAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, byte) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

/// Link kinds we treat specially; anything else is kept by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    /// `veth`: one end of a pair, usually a pod's primary interface.
    Veth,
    /// `bridge`.
    Bridge,
    /// `bond`.
    Bond,
    /// `vlan` (802.1Q sub-interface).
    Vlan,
    /// `macvlan`.
    Macvlan,
    /// `ipvlan`.
    Ipvlan,
    /// Any other kind (`vxlan`, `dummy`, `tun`, ...).
    Other(String),
}

impl LinkKind {
    /// Maps the kernel's `IFLA_INFO_KIND` string.
    #[must_use]
    pub fn from_kernel(kind: &str) -> Self {
        match kind {
            "veth" => Self::Veth,
            "bridge" => Self::Bridge,
            "bond" => Self::Bond,
            "vlan" => Self::Vlan,
            "macvlan" => Self::Macvlan,
            "ipvlan" => Self::Ipvlan,
            other => Self::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for LinkKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Veth => "veth",
            Self::Bridge => "bridge",
            Self::Bond => "bond",
            Self::Vlan => "vlan",
            Self::Macvlan => "macvlan",
            Self::Ipvlan => "ipvlan",
            Self::Other(kind) => kind,
        })
    }
}

/// The interface an interface is enslaved to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    /// Controller's interface name.
    pub name: String,
    /// Controller's link kind (bond, bridge, vrf, ...), when known.
    pub kind: Option<LinkKind>,
}

/// RFC 2863 operational state, spelled as `/sys/class/net/<if>/operstate` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperState {
    /// `unknown`.
    Unknown,
    /// `notpresent`.
    NotPresent,
    /// `down`.
    Down,
    /// `lowerlayerdown`.
    LowerLayerDown,
    /// `testing`.
    Testing,
    /// `dormant`.
    Dormant,
    /// `up`.
    Up,
}

impl OperState {
    /// The sysfs spelling.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unknown => "unknown",
            Self::NotPresent => "notpresent",
            Self::Down => "down",
            Self::LowerLayerDown => "lowerlayerdown",
            Self::Testing => "testing",
            Self::Dormant => "dormant",
            Self::Up => "up",
        }
    }
}

/// The `type` attribute of a device (DESIGN §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceKind {
    /// A physical NIC without SR-IOV.
    Physical,
    /// An SR-IOV physical function.
    SriovPf,
    /// An SR-IOV virtual function.
    SriovVf,
    /// A virtual link (veth, dummy, ...).
    Virtual,
    /// A bond (cannot change network namespace).
    Bond,
    /// A VLAN link.
    Vlan,
}

impl DeviceKind {
    /// The attribute value (also the persisted form).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Physical => "physical",
            Self::SriovPf => "sriov-pf",
            Self::SriovVf => "sriov-vf",
            Self::Virtual => "virtual",
            Self::Bond => "bond",
            Self::Vlan => "vlan",
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A typed DRA device attribute value (`DeviceAttribute` has exactly one member set); its
/// serde form is the API's (`{"string": "eth0"}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AttributeValue {
    /// `string` (≤ 64 characters).
    String(String),
    /// `int`.
    Int(i64),
    /// `bool`.
    Bool(bool),
}

/// How a device may be used (from the inventory / `ResourceSlice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharing {
    /// A whole NIC or VF, moved into one pod.
    Exclusive,
    /// A parent for macvlan/ipvlan children (consumable capacity).
    Shared,
    /// One sub-interface slot of a shared parent (clusters without consumable capacity).
    Slot,
}

impl Sharing {
    /// The `sharing` attribute value (also the persisted form).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive",
            Self::Shared => "shared",
            Self::Slot => "slot",
        }
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device as this node publishes it: name, attributes and how it is shared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// DNS label, unique in the pool, stable across reboots.
    pub name: String,
    /// Host interface this device stands for.
    pub if_name: String,
    /// The `type` attribute.
    pub kind: DeviceKind,
    /// How it is offered to claims.
    pub sharing: Sharing,
    /// The `netclaim.dev/interfaces` capacity of a shared parent (`Some` only when `sharing`
    /// is [`Sharing::Shared`]).
    pub shared_capacity: Option<u32>,
    /// The `netclaim.dev/bandwidth` capacity of a shared parent in bits per second (`Some` only
    /// when `sharing` is [`Sharing::Shared`] and the bandwidth is known: `inventory::bandwidth`).
    pub bandwidth: Option<crate::model::bandwidth::BitsPerSecond>,
    /// Which of its parent's stand-ins a slot device is, `0..N` (`Some` only when `sharing`
    /// is [`Sharing::Slot`]; the parent is `if_name`).
    pub slot_index: Option<u32>,
    /// Attributes keyed by fully qualified name (`netclaim.dev/ifName`).
    pub attributes: BTreeMap<String, AttributeValue>,
}

impl Device {
    /// A string attribute by fully qualified name.
    #[must_use]
    pub fn string_attribute(&self, key: &str) -> Option<&str> {
        match self.attributes.get(key) {
            Some(AttributeValue::String(value)) => Some(value),
            _ => None,
        }
    }

    /// An int attribute by fully qualified name.
    #[must_use]
    pub fn int_attribute(&self, key: &str) -> Option<i64> {
        match self.attributes.get(key) {
            Some(AttributeValue::Int(value)) => Some(*value),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_address_parses_and_prints_canonically() {
        let address: PciAddress = "0000:3B:00.1".parse().unwrap();
        assert_eq!(address.to_string(), "0000:3b:00.1");
        assert_eq!(address.bus, 0x3b);
        assert_eq!(address.function, 1);
    }

    #[test]
    fn pci_address_rejects_malformed_text() {
        for bad in ["", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "x:3b:00.1", "00000:3b:00.1"]
        {
            let err = bad.parse::<PciAddress>().unwrap_err();
            assert_eq!(err.value, bad);
        }
    }

    #[test]
    fn mac_address_prints_lowercase_colon_separated() {
        let mac = MacAddress(vec![0x02, 0xAB, 0, 0, 0, 1]);
        assert_eq!(mac.to_string(), "02:ab:00:00:00:01");
    }
}
