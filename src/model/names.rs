//! Names other tools depend on (DESIGN §1): driver name, attribute domain, capacity keys.
//!
//! Every such constant lives here and nowhere else, so that a rename is one edit.

/// Default DRA driver name (`--driver-name`).
pub const DEFAULT_DRIVER_NAME: &str = "netclaim.dev";

/// Domain of the device attributes we publish (`device.attributes["netclaim.dev"]` in CEL).
///
/// Inside the daemon attributes are keyed fully qualified (`netclaim.dev/ifName`). On the
/// wire ([`published_name`]) a name in the driver's own domain is written unqualified, as
/// the 1.38 slice helper demands (the API reads an unqualified name as the driver's domain,
/// so CEL sees the same `device.attributes["netclaim.dev"].ifName`). Under another
/// `--driver-name` the names stay qualified, so selectors written for `netclaim.dev` keep
/// working (decision 0023).
pub const ATTRIBUTE_DOMAIN: &str = "netclaim.dev";

/// Consumable capacity of a shared parent: how many sub-interfaces it may carry.
///
/// Stays qualified on the wire, even in the driver's own domain, while Kubernetes
/// 1.34–1.37 are supported: their schedulers match capacity names exactly, so renaming it
/// would make existing claims stop fitting and uncount what is allocated (decision 0023).
pub const CAPACITY_INTERFACES: &str = "netclaim.dev/interfaces";

/// Standard Kubernetes attribute naming the PCIe root complex of a device
/// (`resource.kubernetes.io/pcieRoot`), used by schedulers to align NICs with GPUs.
pub const ATTRIBUTE_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";

/// Standard Kubernetes attribute holding a PCI device's address in extended BDF notation
/// (`resource.kubernetes.io/pciBusID`, `dddd:bb:dd.f`): DPDK and KubeVirt find the function
/// a pod got by it (its device metadata repeats it).
pub const ATTRIBUTE_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// How an attribute keyed `qualified` inside the daemon is named in a ResourceSlice of
/// `driver`: without the domain when the domain is the driver's own (the 1.38 helper rejects
/// the qualified form there; the API treats both as one name), otherwise unchanged.
/// Capacity names never go through here: they stay qualified ([`CAPACITY_INTERFACES`]).
#[must_use]
pub fn published_name<'a>(qualified: &'a str, driver: &str) -> &'a str {
    match qualified.split_once('/') {
        Some((domain, name)) if domain == driver => name,
        _ => qualified,
    }
}

/// The daemon's key of an attribute named `name` in a ResourceSlice of `driver` (the
/// inverse of [`published_name`]): an unqualified name is in the driver's domain. Slices of
/// earlier releases carry the qualified form, which is kept as it is.
#[must_use]
pub fn qualified_name(name: &str, driver: &str) -> String {
    if name.contains('/') { name.to_owned() } else { format!("{driver}/{name}") }
}

/// At most this many devices go into one ResourceSlice (resource.k8s.io/v1 limit).
pub const MAX_DEVICES_PER_SLICE: usize = 128;

/// Default capacity `netclaim.dev/interfaces` of a shared parent with consumable capacity.
pub const DEFAULT_SHARED_CAPACITY: u32 = 256;

/// Default number of slot devices per shared parent in `--sharing-mode slots`.
pub const DEFAULT_SLOT_COUNT: u32 = 32;

/// Attribute names (the identifier after `netclaim.dev/`; published without it under the
/// default driver name), DESIGN §2.
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
    /// Name of the RDMA device on the same function (`mlx5_0`, `rxe0`).
    pub const RDMA_DEVICE: &str = "rdmaDevice";
    /// Link layer of the netdev's RDMA port: `Ethernet` (RoCE) or `InfiniBand`.
    pub const RDMA_LINK_LAYER: &str = "rdmaLinkLayer";
    /// Node GUID of the RDMA device, `xxxx:xxxx:xxxx:xxxx`.
    pub const RDMA_NODE_GUID: &str = "rdmaNodeGuid";
    /// How many ports the RDMA device has.
    pub const RDMA_PORTS: &str = "rdmaPorts";
    /// The node's RDMA netns mode: `exclusive` or `shared`.
    pub const RDMA_NETNS_MODE: &str = "rdmaNetnsMode";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_the_drivers_own_domain_are_published_unqualified() {
        assert_eq!(published_name("netclaim.dev/ifName", DEFAULT_DRIVER_NAME), "ifName");
        assert_eq!(published_name(ATTRIBUTE_PCIE_ROOT, DEFAULT_DRIVER_NAME), ATTRIBUTE_PCIE_ROOT);
        // Another driver name: our domain is not its own, the name keeps it.
        assert_eq!(published_name("netclaim.dev/ifName", "net.example.com"), "netclaim.dev/ifName");
        assert_eq!(published_name("ifName", DEFAULT_DRIVER_NAME), "ifName");
    }

    #[test]
    fn published_names_read_back_to_the_same_key() {
        for driver in [DEFAULT_DRIVER_NAME, "net.example.com"] {
            for key in ["netclaim.dev/ifName", ATTRIBUTE_PCIE_ROOT] {
                assert_eq!(qualified_name(published_name(key, driver), driver), key, "{driver}");
            }
        }
        // A slice of an earlier release: qualified in the driver's own domain.
        assert_eq!(qualified_name("netclaim.dev/type", DEFAULT_DRIVER_NAME), "netclaim.dev/type");
    }
}
