//! The ports of mode `vfio` ([`super::vfio`]): the PCI function's driver binding in sysfs
//! ([`VfioPort`], implemented by `host::vfio`) and the durable binding records
//! ([`VfioBindingStore`], part of the claims' store).

use futures::future::BoxFuture;

use super::vfio::VfioBinding;
use crate::ipam::LeaseStore;
use crate::model::device::PciAddress;

/// What the kernel says about a PCI function that a `vfio` claim wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfioTarget {
    /// The driver bound now (`driver` link), `None` when none is.
    pub driver: Option<String>,
    /// Its IOMMU group (`iommu_group` link); `None` when the node's IOMMU is off.
    pub group: Option<u32>,
    /// The other functions of that group (`iommu_group/devices/*`): vfio hands a userspace
    /// driver the whole group, so they would go with it.
    pub group_peers: Vec<PciAddress>,
    /// Whether the `vfio-pci` driver is loaded (`bus/pci/drivers/vfio-pci`).
    pub vfio_pci_loaded: bool,
    /// Its netdev now (`net/*`), `None` when it has none.
    pub netdev: Option<String>,
    /// VFs enabled on it (`sriov_numvfs`; 0 for a function that is not a PF): unbinding a
    /// PF's driver removes its VFs.
    pub enabled_vfs: u32,
}

/// Why the kernel refused or did not answer a sysfs step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{op}: {message}")]
pub struct VfioPortError {
    /// What was attempted (`writing 0000:01:10.0 to /sys/bus/pci/drivers_probe`).
    pub op: String,
    /// The kernel's errno, when it refused.
    pub errno: Option<i32>,
    /// The kernel's or the port's message.
    pub message: String,
}

/// A PCI function's driver binding (sysfs under `/sys/bus/pci`). Every step is idempotent:
/// a start-up that finds a bind or a rebind cut short runs it again from where it is.
pub trait VfioPort: Send + Sync + 'static {
    /// The function at `pci`; `None` when there is no such PCI device.
    fn inspect(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<VfioTarget>, VfioPortError>>;
    /// Unbinds it from its driver, sets `driver_override` to `vfio-pci`, binds it there and
    /// waits for `/dev/vfio/<group>`.
    fn bind(&self, pci: PciAddress, group: u32) -> BoxFuture<'_, Result<(), VfioPortError>>;
    /// Clears `driver_override`, unbinds it from `vfio-pci` and has the kernel probe it
    /// again (`driver`: the driver it had, bound by name when the probe picked none), then
    /// waits for its netdev when `netdev` (it had one).
    fn rebind<'a>(
        &'a self,
        pci: PciAddress,
        driver: Option<&'a str>,
        netdev: bool,
    ) -> BoxFuture<'a, Result<(), VfioPortError>>;
    /// The id of the running boot (`/proc/sys/kernel/random/boot_id`): a binding does not
    /// survive a reboot.
    fn boot_id(&self) -> Result<String, VfioPortError>;
}

/// Durable [`VfioBinding`]s, one per PCI function; part of the claims' store. Calls block
/// on disk I/O.
pub trait VfioBindingStore: LeaseStore {
    /// Every binding.
    fn load_vfio_bindings(&self) -> Result<Vec<VfioBinding>, Self::Error>;
    /// Creates or replaces the binding of its function in one synced commit.
    fn save_vfio_binding(&self, binding: &VfioBinding) -> Result<(), Self::Error>;
    /// Removes the binding with key `key` ([`VfioBinding::key`]) in one synced commit; a
    /// missing one writes nothing.
    fn remove_vfio_binding(&self, key: &str) -> Result<(), Self::Error>;
}
