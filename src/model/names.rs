//! Names other tools depend on (DESIGN §1): driver name, attribute domain, capacity keys.
//!
//! Every such constant lives here and nowhere else, so that a rename is one edit.

/// Default DRA driver name (`--driver-name`).
pub const DEFAULT_DRIVER_NAME: &str = "netclaim.dev";

/// Domain of the device attributes we publish (`device.attributes["netclaim.dev"]` in CEL).
///
/// Attributes are written fully qualified, so CEL selectors keep working when an operator
/// runs the driver under another `--driver-name`.
pub const ATTRIBUTE_DOMAIN: &str = "netclaim.dev";

/// Consumable capacity of a shared parent: how many sub-interfaces it may carry.
pub const CAPACITY_INTERFACES: &str = "netclaim.dev/interfaces";

/// Standard Kubernetes attribute naming the PCIe root complex of a device
/// (`resource.kubernetes.io/pcieRoot`), used by schedulers to align NICs with GPUs.
pub const ATTRIBUTE_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// At most this many devices go into one ResourceSlice (resource.k8s.io/v1 limit).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Default capacity `netclaim.dev/interfaces` of a shared parent with consumable capacity.
pub const DEFAULT_SHARED_CAPACITY: u32 = 256;

/// Default number of slot devices per shared parent in `--sharing-mode slots`.
pub const DEFAULT_SLOT_COUNT: u32 = 32;

/// Attribute names (the identifier after `netclaim.dev/`), DESIGN §2.
pub mod attr {
    /// Host interface name.
    pub const IF_NAME: &str = "ifName";
    /// Hardware address, `aa:bb:cc:dd:ee:ff`.
    pub const MAC: &str = "mac";
    /// Current MTU.
    pub const MTU: &str = "mtu";
    /// `physical`, `sriov-pf`, `sriov-vf`, `virtual`, `bond`, `vlan`.
    pub const TYPE: &str = "type";
    /// Kernel driver bound to the backing device.
    pub const KERNEL_DRIVER: &str = "kernelDriver";
    /// RFC 2863 operational state as the kernel reports it (`up`, `down`, ...).
    pub const OPER_STATE: &str = "operState";
    /// Link speed in Mbit/s, when the driver reports one.
    pub const SPEED_MBPS: &str = "speedMbps";
    /// PCI address `dddd:bb:dd.f`.
    pub const PCI_ADDRESS: &str = "pciAddress";
    /// PCI vendor id, four lowercase hex digits.
    pub const PCI_VENDOR: &str = "pciVendor";
    /// PCI device id, four lowercase hex digits.
    pub const PCI_DEVICE: &str = "pciDevice";
    /// NUMA node of the PCI device.
    pub const NUMA_NODE: &str = "numaNode";
    /// SR-IOV PF: how many VFs the device supports.
    pub const SRIOV_TOTAL_VFS: &str = "sriovTotalVfs";
    /// SR-IOV PF: how many VFs are enabled.
    pub const SRIOV_VFS: &str = "sriovVfs";
    /// SR-IOV VF: interface name of its PF.
    pub const PF_NAME: &str = "pfName";
    /// SR-IOV VF: its index on the PF.
    pub const VF_INDEX: &str = "vfIndex";
    /// PodNetwork that selected this device.
    pub const POD_NETWORK: &str = "podNetwork";
    /// VLAN id of a PodNetwork's shared device (omitted when untagged).
    pub const VLAN: &str = "vlan";
    /// `exclusive` or `shared`.
    pub const SHARING: &str = "sharing";
}
