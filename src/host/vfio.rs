//! `claims::vfio::VfioPort` over sysfs: a PCI function moved between its kernel driver and
//! `vfio-pci` the way the kernel's driver core offers it (Documentation/ABI/testing/
//! sysfs-bus-pci), below an injectable sysfs root so the steps run on a fixture tree.
//!
//! Bind: `driver_override` set to `vfio-pci` first (so nothing that probes the function in
//! between, udev included, can give it back to its old driver), then `driver/unbind`, then
//! `bus/pci/drivers_probe` (the driver core now matches `vfio-pci` only), and if the probe
//! left it unbound, `drivers/vfio-pci/bind`. Then the group device: `vfio-pci` registers
//! the group's character device (`/dev/vfio/<group>`, class `vfio` in sysfs) when it binds
//! the first function of the group; the wait watches `class/vfio/<group>`, which the kernel
//! creates with the device node, so the daemon needs no `/dev` of the host. Rebind: the
//! override cleared (a write of a newline), `unbind` from `vfio-pci`, `drivers_probe` (the
//! kernel picks the driver whose id table matches, the one it had), and if none took it,
//! `drivers/<driver>/bind` by name; then a wait for its netdev (`net/*`) when it had one.
//!
//! Every step looks at where the function is first, so a bind or rebind cut short (the
//! daemon killed between two writes) runs again from there. Writes of sysfs attributes block
//! (the driver's probe or remove runs inside the write): they run on the blocking pool.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;

use crate::claims::vfio::{VFIO_PCI, VfioPort, VfioPortError, VfioTarget};
use crate::model::device::PciAddress;

/// The kernel's id of the running boot.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";
/// How long the group device or the netdev may take to appear: a driver's probe is
/// synchronous in the write, but igbvf's netdev registration and udev's rename follow it.
const APPEAR_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll interval of those waits (sysfs has no notification for a new entry).
const POLL: Duration = Duration::from_millis(20);

/// How an attribute is written: one `write(2)` of the file, or (tests) a stand-in of the
/// kernel's driver core over a fixture tree.
pub(crate) type AttrWriter = Arc<dyn Fn(&Path, &str) -> io::Result<()> + Send + Sync>;

/// The sysfs side of mode `vfio`.
#[derive(Clone)]
pub struct SysfsVfio {
    sys: PathBuf,
    boot_id: PathBuf,
    timeout: Duration,
    writer: AttrWriter,
}

impl std::fmt::Debug for SysfsVfio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SysfsVfio").field("sys", &self.sys).finish_non_exhaustive()
    }
}

impl Default for SysfsVfio {
    fn default() -> Self {
        Self::new()
    }
}

impl SysfsVfio {
    /// On `/sys` and the kernel's boot id.
    #[must_use]
    pub fn new() -> Self {
        Self::with_roots("/sys", BOOT_ID)
    }

    /// Below the sysfs root `sys` (`--sysfs-root`), with the kernel's boot id.
    #[must_use]
    pub fn on(sys: impl Into<PathBuf>) -> Self {
        Self::with_roots(sys, BOOT_ID)
    }

    /// As [`Self::new`] below another sysfs root and boot id file (tests).
    #[must_use]
    pub fn with_roots(sys: impl Into<PathBuf>, boot_id: impl Into<PathBuf>) -> Self {
        Self {
            sys: sys.into(),
            boot_id: boot_id.into(),
            timeout: APPEAR_TIMEOUT,
            writer: Arc::new(write_file),
        }
    }

    /// The same with another attribute writer (the tests' driver core).
    #[cfg(test)]
    pub(crate) fn with_writer(mut self, writer: AttrWriter) -> Self {
        self.writer = writer;
        self
    }

    /// The same with another patience for the group device and the netdev (tests).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn device_dir(&self, pci: PciAddress) -> PathBuf {
        self.sys.join("bus/pci/devices").join(pci.to_string())
    }

    fn driver_dir(&self, driver: &str) -> PathBuf {
        self.sys.join("bus/pci/drivers").join(driver)
    }

    /// The driver bound to `pci` now.
    fn driver_of(&self, pci: PciAddress) -> Result<Option<String>, VfioPortError> {
        link_name(&self.device_dir(pci).join("driver"))
    }

    /// What the function is now; `None` when sysfs has no such PCI device.
    pub fn inspect_now(&self, pci: PciAddress) -> Result<Option<VfioTarget>, VfioPortError> {
        let dir = self.device_dir(pci);
        if !dir.exists() {
            return Ok(None);
        }
        let group = link_name(&dir.join("iommu_group"))?.and_then(|name| name.parse().ok());
        let group_peers = match group {
            Some(_) => entries(&dir.join("iommu_group/devices"))?
                .iter()
                .filter_map(|name| name.parse::<PciAddress>().ok())
                .filter(|peer| *peer != pci)
                .collect(),
            None => Vec::new(),
        };
        let enabled_vfs = fs::read_to_string(dir.join("sriov_numvfs"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0);
        Ok(Some(VfioTarget {
            driver: self.driver_of(pci)?,
            group,
            group_peers,
            vfio_pci_loaded: self.driver_dir(VFIO_PCI).is_dir(),
            netdev: entries(&dir.join("net"))?.into_iter().next(),
            enabled_vfs,
        }))
    }

    /// Binds `pci` to vfio-pci and waits for its group device (blocking).
    pub fn bind_now(&self, pci: PciAddress, group: u32) -> Result<(), VfioPortError> {
        let dir = self.device_dir(pci);
        if self.driver_of(pci)?.as_deref() != Some(VFIO_PCI) {
            self.write_attr(&dir.join("driver_override"), VFIO_PCI)?;
            if self.driver_of(pci)?.is_some() {
                self.write_attr(&dir.join("driver/unbind"), &pci.to_string())?;
            }
            crate::failpoint!("host.vfio.after_unbind");
            self.write_attr(&self.sys.join("bus/pci/drivers_probe"), &pci.to_string())?;
            if self.driver_of(pci)?.is_none() {
                self.write_attr(&self.driver_dir(VFIO_PCI).join("bind"), &pci.to_string())?;
            }
            match self.driver_of(pci)? {
                Some(driver) if driver == VFIO_PCI => {}
                other => {
                    return Err(VfioPortError {
                        op: format!("binding {pci} to {VFIO_PCI}"),
                        errno: None,
                        message: format!(
                            "the function is bound to {} after the probe",
                            other.as_deref().unwrap_or("no driver")
                        ),
                    });
                }
            }
        }
        let class = self.sys.join("class/vfio").join(group.to_string());
        self.wait_for(&format!("the group device /dev/vfio/{group}"), || class.exists())
    }

    /// Gives `pci` back to `driver` (blocking): see the module documentation.
    pub fn rebind_now(
        &self,
        pci: PciAddress,
        driver: Option<&str>,
        netdev: bool,
    ) -> Result<(), VfioPortError> {
        let dir = self.device_dir(pci);
        if !dir.exists() {
            // The function is gone (its PF's VFs were disabled): nothing to give back.
            return Ok(());
        }
        // A newline clears the override (`driver_set_override`).
        self.write_attr(&dir.join("driver_override"), "\n")?;
        let now = self.driver_of(pci)?;
        if now.is_some() && now.as_deref() != driver {
            self.write_attr(&dir.join("driver/unbind"), &pci.to_string())?;
        }
        let Some(driver) = driver else { return Ok(()) };
        if self.driver_of(pci)?.is_none() {
            self.write_attr(&self.sys.join("bus/pci/drivers_probe"), &pci.to_string())?;
        }
        if self.driver_of(pci)?.is_none() {
            self.write_attr(&self.driver_dir(driver).join("bind"), &pci.to_string())?;
        }
        let bound = self.driver_of(pci)?;
        if bound.as_deref() != Some(driver) {
            return Err(VfioPortError {
                op: format!("giving {pci} back to {driver}"),
                errno: None,
                message: format!(
                    "the function is bound to {} after the probe",
                    bound.as_deref().unwrap_or("no driver")
                ),
            });
        }
        if netdev {
            let net = dir.join("net");
            self.wait_for(&format!("the netdev of {pci}"), || {
                entries(&net).is_ok_and(|names| !names.is_empty())
            })?;
        }
        Ok(())
    }

    fn write_attr(&self, path: &Path, value: &str) -> Result<(), VfioPortError> {
        (self.writer)(path, value)
            .map_err(|err| io_error(&format!("writing {value:?} to {}", path.display()), &err))
    }

    fn wait_for(&self, what: &str, mut present: impl FnMut() -> bool) -> Result<(), VfioPortError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if present() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(VfioPortError {
                    op: format!("waiting for {what}"),
                    errno: None,
                    message: format!("not there after {:?}", self.timeout),
                });
            }
            std::thread::sleep(POLL);
        }
    }
}

/// The last component of a symlink's target; `None` when there is no link.
fn link_name(path: &Path) -> Result<Option<String>, VfioPortError> {
    match fs::read_link(path) {
        Ok(target) => Ok(target.file_name().and_then(|n| n.to_str()).map(str::to_owned)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(io_error(&format!("reading the link {}", path.display()), &err)),
    }
}

/// The sorted entry names of a directory; none when it does not exist.
fn entries(dir: &Path) -> Result<Vec<String>, VfioPortError> {
    match fs::read_dir(dir) {
        Ok(list) => {
            let mut names: Vec<String> = list
                .flatten()
                .filter_map(|entry| entry.file_name().to_str().map(str::to_owned))
                .collect();
            names.sort();
            Ok(names)
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(err) => Err(io_error(&format!("listing {}", dir.display()), &err)),
    }
}

/// One write of a sysfs attribute, in one `write(2)` (sysfs takes a store per write).
fn write_file(path: &Path, value: &str) -> io::Result<()> {
    fs::OpenOptions::new().write(true).open(path)?.write_all(value.as_bytes())
}

fn io_error(op: &str, err: &io::Error) -> VfioPortError {
    VfioPortError { op: op.to_owned(), errno: err.raw_os_error(), message: err.to_string() }
}

fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, VfioPortError> + Send + 'static,
) -> BoxFuture<'static, Result<T, VfioPortError>> {
    Box::pin(async move {
        tokio::task::spawn_blocking(work).await.map_err(|err| VfioPortError {
            op: "the blocking sysfs task".to_owned(),
            errno: None,
            message: err.to_string(),
        })?
    })
}

impl VfioPort for SysfsVfio {
    fn inspect(&self, pci: PciAddress) -> BoxFuture<'_, Result<Option<VfioTarget>, VfioPortError>> {
        let this = self.clone();
        blocking(move || this.inspect_now(pci))
    }

    fn bind(&self, pci: PciAddress, group: u32) -> BoxFuture<'_, Result<(), VfioPortError>> {
        let this = self.clone();
        blocking(move || this.bind_now(pci, group))
    }

    fn rebind<'a>(
        &'a self,
        pci: PciAddress,
        driver: Option<&'a str>,
        netdev: bool,
    ) -> BoxFuture<'a, Result<(), VfioPortError>> {
        let this = self.clone();
        let driver = driver.map(str::to_owned);
        blocking(move || this.rebind_now(pci, driver.as_deref(), netdev))
    }

    fn boot_id(&self) -> Result<String, VfioPortError> {
        fs::read_to_string(&self.boot_id)
            .map(|text| text.trim().to_owned())
            .map_err(|err| io_error(&format!("reading {}", self.boot_id.display()), &err))
    }
}

#[cfg(test)]
mod tests;
