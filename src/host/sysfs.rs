//! Hardware facts of network interfaces from sysfs (PCI, driver, NUMA, SR-IOV, speed).
//!
//! The root is injectable so unit tests run on fixture trees. Note that `/sys/class/net`
//! shows the interfaces of the network namespace that mounted sysfs, not of the reading
//! thread: callers inspecting another namespace must look at a sysfs mounted there (as
//! `ip netns exec` does).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::model::device::{HardwareFacts, PciAddress, PciFacts, SriovRole};

/// A sysfs read that failed for another reason than the file being absent.
#[derive(Debug, thiserror::Error)]
#[error("reading {path}: {source}")]
pub struct SysfsError {
    /// The file or link.
    pub path: PathBuf,
    /// The I/O error.
    #[source]
    pub source: io::Error,
}

/// Reads interface facts below a sysfs root (normally `/sys`).
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Self {
        Self::new("/sys")
    }
}

impl Sysfs {
    /// A reader below `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The sysfs root this reader reads below.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Hardware facts of interface `if_name`, or `None` when it has no sysfs entry (it was
    /// removed since the netlink dump, or lives in a namespace this sysfs does not show).
    pub fn hardware(&self, if_name: &str) -> Result<Option<HardwareFacts>, SysfsError> {
        let net_dir = self.root.join("class/net").join(if_name);
        if !exists(&net_dir)? {
            return Ok(None);
        }
        let speed_mbps = read_trimmed(&net_dir.join("speed"))?
            .and_then(|speed| speed.parse::<i64>().ok())
            .and_then(|speed| u32::try_from(speed).ok())
            .filter(|speed| *speed > 0);
        let device_link = net_dir.join("device");
        let Some(device_dir) = canonical(&device_link)? else {
            return Ok(Some(HardwareFacts { speed_mbps, ..HardwareFacts::default() }));
        };
        let driver = link_name(&device_dir.join("driver"))?;
        let subsystem = link_name(&device_dir.join("subsystem"))?;
        let pci =
            if subsystem.as_deref() == Some("pci") { self.pci_facts(&device_dir)? } else { None };
        Ok(Some(HardwareFacts { has_device: true, pci, driver, speed_mbps }))
    }

    fn pci_facts(&self, device_dir: &Path) -> Result<Option<PciFacts>, SysfsError> {
        let Some(address) = file_name(device_dir).and_then(|name| name.parse().ok()) else {
            return Ok(None);
        };
        let hex_id = |file: &str| -> Result<Option<u16>, SysfsError> {
            Ok(read_trimmed(&device_dir.join(file))?
                .and_then(|text| u16::from_str_radix(text.trim_start_matches("0x"), 16).ok()))
        };
        let numa_node = read_trimmed(&device_dir.join("numa_node"))?
            .and_then(|text| text.parse::<i64>().ok())
            .and_then(|node| u32::try_from(node).ok());
        Ok(Some(PciFacts {
            address,
            vendor: hex_id("vendor")?,
            device: hex_id("device")?,
            numa_node,
            pcie_root: pcie_root(device_dir),
            sriov: self.sriov_role(device_dir, address)?,
        }))
    }

    fn sriov_role(&self, device_dir: &Path, address: PciAddress) -> Result<SriovRole, SysfsError> {
        if let Some(pf_dir) = canonical(&device_dir.join("physfn"))? {
            let Some(pf_address) = file_name(&pf_dir).and_then(|name| name.parse().ok()) else {
                return Ok(SriovRole::None);
            };
            return Ok(SriovRole::VirtualFunction {
                pf_address,
                pf_name: first_entry(&pf_dir.join("net"))?,
                vf_index: self.vf_index(&pf_dir, address)?,
            });
        }
        let count = |file: &str| -> Result<Option<u32>, SysfsError> {
            Ok(read_trimmed(&device_dir.join(file))?.and_then(|text| text.parse().ok()))
        };
        match count("sriov_totalvfs")? {
            Some(total_vfs) if total_vfs > 0 => Ok(SriovRole::PhysicalFunction {
                total_vfs,
                num_vfs: count("sriov_numvfs")?.unwrap_or(0),
            }),
            _ => Ok(SriovRole::None),
        }
    }

    /// The PCI address of VF `index` of PF `pf` (its `device/virtfn<index>` link); `None`
    /// when there is no such PF or VF.
    pub fn vf_pci_address(&self, pf: &str, index: u32) -> Result<Option<PciAddress>, SysfsError> {
        let link = self.root.join("class/net").join(pf).join(format!("device/virtfn{index}"));
        Ok(link_name(&link)?.and_then(|name| name.parse().ok()))
    }

    /// Where the VF with PCI address `vf` is now: its PF's interface name (in the netns that
    /// mounted this sysfs) and its index (`bus/pci/devices/<vf>/physfn`, and the PF's
    /// `virtfn<N>` pointing back). `None` when there is no such VF, it is not a VF, or its PF
    /// has no netdev here. PF names change at boot; PCI addresses do not.
    pub fn locate_vf(&self, vf: PciAddress) -> Result<Option<(String, u32)>, SysfsError> {
        let device_dir = self.root.join("bus/pci/devices").join(vf.to_string());
        let Some(pf_dir) = canonical(&device_dir.join("physfn"))? else {
            return Ok(None);
        };
        let Some(pf_name) = first_entry(&pf_dir.join("net"))? else { return Ok(None) };
        Ok(self.vf_index(&pf_dir, vf)?.map(|index| (pf_name, index)))
    }

    /// The name of the netdev of the PCI function `pci` now (`bus/pci/devices/<pci>/net/*`,
    /// in the netns that mounted this sysfs); `None` when it has none here (no such device,
    /// no driver bound, or its netdev is in another netns). Names change at boot and when
    /// udev renames; the PCI address does not.
    pub fn pci_netdev(&self, pci: PciAddress) -> Result<Option<String>, SysfsError> {
        first_entry(&self.root.join("bus/pci/devices").join(pci.to_string()).join("net"))
    }

    /// The `N` of the PF's `virtfnN` link that points at `vf`.
    #[expect(clippy::unused_self, reason = "kept a method so every read goes through the root")]
    fn vf_index(&self, pf_dir: &Path, vf: PciAddress) -> Result<Option<u32>, SysfsError> {
        let entries = match fs::read_dir(pf_dir) {
            Ok(entries) => entries,
            Err(source) if source.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(SysfsError { path: pf_dir.to_owned(), source }),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(index) = name.to_str().and_then(|n| n.strip_prefix("virtfn")) else {
                continue;
            };
            let Ok(index) = index.parse::<u32>() else { continue };
            let target = link_name(&entry.path())?;
            if target.and_then(|t| t.parse::<PciAddress>().ok()) == Some(vf) {
                return Ok(Some(index));
            }
        }
        Ok(None)
    }
}

/// The `pciDDDD:BB` component of a canonical PCI device path.
fn pcie_root(device_dir: &Path) -> Option<String> {
    device_dir.components().find_map(|component| {
        let text = component.as_os_str().to_str()?;
        let rest = text.strip_prefix("pci")?;
        let (domain, bus) = rest.split_once(':')?;
        let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
        (hex(domain) && hex(bus)).then(|| text.to_owned())
    })
}

pub(super) fn exists(path: &Path) -> Result<bool, SysfsError> {
    path.try_exists().map_err(|source| SysfsError { path: path.to_owned(), source })
}

pub(super) fn file_name(path: &Path) -> Option<&str> {
    path.file_name().and_then(|name| name.to_str())
}

/// Reads a small attribute file. Absent files and attributes the driver cannot answer right
/// now (`speed` of a link that is down returns `EINVAL`) are `None`.
pub(super) fn read_trimmed(path: &Path) -> Result<Option<String>, SysfsError> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        // std maps EINVAL to InvalidInput.
        Err(source)
            if matches!(source.kind(), io::ErrorKind::NotFound | io::ErrorKind::InvalidInput) =>
        {
            Ok(None)
        }
        Err(source) => Err(SysfsError { path: path.to_owned(), source }),
    }
}

/// The final component of a symlink's target, or `None` when the link does not exist.
pub(super) fn link_name(path: &Path) -> Result<Option<String>, SysfsError> {
    match fs::read_link(path) {
        Ok(target) => Ok(file_name(&target).map(str::to_owned)),
        Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysfsError { path: path.to_owned(), source }),
    }
}

pub(super) fn canonical(path: &Path) -> Result<Option<PathBuf>, SysfsError> {
    match fs::canonicalize(path) {
        Ok(target) => Ok(Some(target)),
        Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysfsError { path: path.to_owned(), source }),
    }
}

pub(super) fn first_entry(dir: &Path) -> Result<Option<String>, SysfsError> {
    match fs::read_dir(dir) {
        Ok(entries) => {
            let mut names: Vec<String> = entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
                .collect();
            names.sort();
            Ok(names.into_iter().next())
        }
        Err(source) if source.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(SysfsError { path: dir.to_owned(), source }),
    }
}

#[cfg(test)]
mod tests;
