//! The sysfs steps of mode `vfio` on a fixture tree shaped like the kernel's, with a stand-in
//! of the driver core answering the writes as `drivers/base` does: `driver_override` is kept,
//! `unbind` drops the `driver` link (and the netdev, or the vfio group device), a probe binds
//! the override or else the driver whose id table matches, `bind` by name is refused while an
//! override names another driver. A failure is injected at every write of a bind and of a
//! rebind: running the step again from where it stopped, or the start-up's rebind, always
//! ends with the function on the right driver and nothing of ours left.

#![allow(clippy::unwrap_used, reason = "tests fail by panicking")]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::*;

const VF: &str = "0000:01:10.0";
const PEER: &str = "0000:01:10.2";
const GROUP: u32 = 7;
const NETDEV: &str = "enp1s0v0";

fn pci(text: &str) -> PciAddress {
    text.parse().unwrap()
}

/// A fake `/sys` with one VF on `igbvf` in IOMMU group 7, and the driver core's answers.
struct Node {
    dir: tempfile::TempDir,
    /// The write that fails (1-based), if any.
    fail_at: Arc<Mutex<Option<usize>>>,
    /// Writes seen, as `<attribute path below sys>=<value>`.
    log: Arc<Mutex<Vec<String>>>,
}

impl Node {
    fn new() -> Self {
        let node = Self {
            dir: tempfile::tempdir().unwrap(),
            fail_at: Arc::default(),
            log: Arc::default(),
        };
        let sys = node.sys();
        for driver in ["igbvf", "vfio-pci"] {
            fs::create_dir_all(sys.join("bus/pci/drivers").join(driver)).unwrap();
        }
        fs::write(sys.join("bus/pci/drivers_probe"), "").unwrap();
        fs::create_dir_all(sys.join("class/vfio")).unwrap();
        node.add_device(VF);
        node.bind_link(VF, "igbvf");
        fs::create_dir_all(node.dev(VF).join("net").join(NETDEV)).unwrap();
        fs::write(node.dev(VF).join("sriov_numvfs"), "0\n").unwrap();
        node
    }

    fn sys(&self) -> PathBuf {
        self.dir.path().join("sys")
    }

    fn dev(&self, bdf: &str) -> PathBuf {
        self.sys().join("bus/pci/devices").join(bdf)
    }

    fn add_device(&self, bdf: &str) {
        let dir = self.dev(bdf);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("driver_override"), "(null)\n").unwrap();
        let group = self.sys().join(format!("kernel/iommu_groups/{GROUP}/devices"));
        fs::create_dir_all(&group).unwrap();
        symlink(format!("../../../../kernel/iommu_groups/{GROUP}"), dir.join("iommu_group"))
            .unwrap();
        symlink(format!("../../../../bus/pci/devices/{bdf}"), group.join(bdf)).unwrap();
    }

    fn bind_link(&self, bdf: &str, driver: &str) {
        symlink(format!("../../drivers/{driver}"), self.dev(bdf).join("driver")).unwrap();
    }

    fn driver(&self, bdf: &str) -> Option<String> {
        fs::read_link(self.dev(bdf).join("driver"))
            .ok()
            .map(|t| t.file_name().unwrap().to_str().unwrap().to_owned())
    }

    fn override_of(&self, bdf: &str) -> String {
        fs::read_to_string(self.dev(bdf).join("driver_override")).unwrap()
    }

    fn netdevs(&self, bdf: &str) -> Vec<String> {
        entries(&self.dev(bdf).join("net")).unwrap()
    }

    fn group_device(&self) -> bool {
        self.sys().join("class/vfio").join(GROUP.to_string()).exists()
    }

    /// The port on this tree, its writes answered by [`driver_core`].
    fn port(&self) -> SysfsVfio {
        let (sys, fail_at, log) = (self.sys(), Arc::clone(&self.fail_at), Arc::clone(&self.log));
        SysfsVfio::with_roots(self.sys(), self.dir.path().join("boot_id"))
            .with_timeout(Duration::from_millis(200))
            .with_writer(Arc::new(move |path: &Path, value: &str| {
                let mut log = log.lock().unwrap();
                let relative = path.strip_prefix(&sys).unwrap().display().to_string();
                log.push(format!("{relative}={}", value.trim()));
                if *fail_at.lock().unwrap() == Some(log.len()) {
                    return Err(io::Error::from_raw_os_error(libc_eio()));
                }
                driver_core(&sys, path, value)
            }))
    }

    fn fail_at(&self, write: Option<usize>) {
        *self.fail_at.lock().unwrap() = write;
        self.log.lock().unwrap().clear();
    }

    fn writes(&self) -> usize {
        self.log.lock().unwrap().len()
    }
}

fn libc_eio() -> i32 {
    5
}

/// The driver core's answer to a write below `sys` (drivers/base/bus.c, dd.c; pci-driver.c's
/// `driver_override` match): only what the steps use.
fn driver_core(sys: &Path, path: &Path, value: &str) -> io::Result<()> {
    let relative = path.strip_prefix(sys).unwrap().to_str().unwrap().to_owned();
    let bdf = value.trim();
    let device = |bdf: &str| sys.join("bus/pci/devices").join(bdf);
    let bound = |bdf: &str| fs::read_link(device(bdf).join("driver")).ok();
    let bind = |bdf: &str, driver: &str| -> io::Result<()> {
        symlink(format!("../../drivers/{driver}"), device(bdf).join("driver"))?;
        if driver == VFIO_PCI {
            fs::create_dir_all(sys.join("class/vfio").join(GROUP.to_string()))
        } else {
            fs::create_dir_all(device(bdf).join("net").join(NETDEV))
        }
    };
    let unbind = |bdf: &str| -> io::Result<()> {
        if bound(bdf).is_none() {
            return Err(io::Error::from_raw_os_error(19)); // ENODEV
        }
        fs::remove_file(device(bdf).join("driver"))?;
        let _ = fs::remove_dir_all(device(bdf).join("net"));
        let _ = fs::remove_dir_all(sys.join("class/vfio").join(GROUP.to_string()));
        Ok(())
    };
    let override_of = |bdf: &str| {
        let text = fs::read_to_string(device(bdf).join("driver_override")).unwrap_or_default();
        let text = text.trim().to_owned();
        (text != "(null)" && !text.is_empty()).then_some(text)
    };
    if let Some(rest) = relative.strip_prefix("bus/pci/devices/") {
        let (bdf, attribute) = rest.split_once('/').unwrap();
        return match attribute {
            // A newline clears it; the kernel shows "(null)" then.
            "driver_override" if value.trim().is_empty() => {
                fs::write(device(bdf).join("driver_override"), "(null)\n")
            }
            "driver_override" => fs::write(device(bdf).join("driver_override"), value),
            "driver/unbind" => unbind(bdf),
            other => panic!("no such attribute {other}"),
        };
    }
    if relative == "bus/pci/drivers_probe" {
        if bound(bdf).is_some() {
            return Ok(());
        }
        // The override, else the driver whose id table matches: igbvf for a VF.
        let driver = override_of(bdf).unwrap_or_else(|| "igbvf".to_owned());
        if sys.join("bus/pci/drivers").join(&driver).is_dir() {
            bind(bdf, &driver)?;
        }
        return Ok(());
    }
    let (driver, action) = relative
        .strip_prefix("bus/pci/drivers/")
        .and_then(|rest| rest.split_once('/'))
        .unwrap_or_else(|| panic!("unexpected write to {relative}"));
    match action {
        "bind" if bound(bdf).is_some() => Err(io::Error::from_raw_os_error(16)), // EBUSY
        "bind" if override_of(bdf).is_some_and(|o| o != driver) => {
            Err(io::Error::from_raw_os_error(19))
        }
        "bind" => bind(bdf, driver),
        "unbind" => unbind(bdf),
        other => panic!("no such driver attribute {other}"),
    }
}

#[test]
fn a_vf_goes_to_vfio_pci_with_its_group_device_and_back_to_igbvf_with_its_netdev() {
    let node = Node::new();
    let port = node.port();
    let target = port.inspect_now(pci(VF)).unwrap().unwrap();
    assert_eq!(
        target,
        VfioTarget {
            driver: Some("igbvf".to_owned()),
            group: Some(GROUP),
            group_peers: vec![],
            vfio_pci_loaded: true,
            netdev: Some(NETDEV.to_owned()),
            enabled_vfs: 0,
        }
    );
    port.bind_now(pci(VF), GROUP).unwrap();
    assert_eq!(node.driver(VF).as_deref(), Some(VFIO_PCI));
    assert!(node.group_device(), "the group device is there");
    assert!(node.netdevs(VF).is_empty(), "the netdev went with igbvf");
    assert_eq!(node.override_of(VF), VFIO_PCI);
    assert_eq!(
        *node.log.lock().unwrap(),
        [
            format!("bus/pci/devices/{VF}/driver_override=vfio-pci"),
            format!("bus/pci/devices/{VF}/driver/unbind={VF}"),
            format!("bus/pci/drivers_probe={VF}"),
        ],
        "the override before the unbind, then the probe"
    );
    node.fail_at(None);
    port.bind_now(pci(VF), GROUP).unwrap();
    assert_eq!(node.writes(), 0, "bound already: nothing written");

    port.rebind_now(pci(VF), Some("igbvf"), true).unwrap();
    assert_eq!(node.driver(VF).as_deref(), Some("igbvf"));
    assert_eq!(node.netdevs(VF), [NETDEV]);
    assert!(!node.group_device());
    assert_eq!(node.override_of(VF), "(null)\n", "the override is cleared");
}

#[test]
fn a_group_with_other_functions_no_iommu_and_no_vfio_pci_are_seen() {
    let node = Node::new();
    node.add_device(PEER);
    let target = node.port().inspect_now(pci(VF)).unwrap().unwrap();
    assert_eq!(target.group_peers, [pci(PEER)]);
    assert_eq!(node.port().inspect_now(pci("0000:09:00.0")).unwrap(), None, "no such device");

    let node = Node::new();
    fs::remove_file(node.dev(VF).join("iommu_group")).unwrap();
    fs::remove_dir(node.sys().join("bus/pci/drivers/vfio-pci")).unwrap();
    let target = node.port().inspect_now(pci(VF)).unwrap().unwrap();
    assert_eq!((target.group, target.vfio_pci_loaded), (None, false));
}

#[test]
fn a_bind_cut_at_any_write_is_completed_or_given_back() {
    let whole = {
        let node = Node::new();
        node.port().bind_now(pci(VF), GROUP).unwrap();
        node.writes()
    };
    assert!(whole >= 3);
    for cut in 1..=whole {
        // Completed by running it again (a repeated prepare).
        let node = Node::new();
        node.fail_at(Some(cut));
        assert!(node.port().bind_now(pci(VF), GROUP).is_err(), "write {cut} fails");
        node.fail_at(None);
        node.port().bind_now(pci(VF), GROUP).unwrap();
        assert_eq!(node.driver(VF).as_deref(), Some(VFIO_PCI), "cut at {cut}, bound again");
        assert!(node.group_device());

        // Given back (the start-up's completion of a prepare that did not finish).
        let node = Node::new();
        node.fail_at(Some(cut));
        assert!(node.port().bind_now(pci(VF), GROUP).is_err());
        node.fail_at(None);
        node.port().rebind_now(pci(VF), Some("igbvf"), true).unwrap();
        assert_eq!(node.driver(VF).as_deref(), Some("igbvf"), "cut at {cut}, given back");
        assert_eq!(node.netdevs(VF), [NETDEV]);
        assert_eq!(node.override_of(VF), "(null)\n", "cut at {cut}: no override left");
        assert!(!node.group_device());
    }
}

#[test]
fn a_rebind_cut_at_any_write_is_completed_by_the_next_one() {
    let whole = {
        let node = Node::new();
        node.port().bind_now(pci(VF), GROUP).unwrap();
        node.fail_at(None);
        node.port().rebind_now(pci(VF), Some("igbvf"), true).unwrap();
        node.writes()
    };
    assert!(whole >= 3);
    for cut in 1..=whole {
        let node = Node::new();
        node.port().bind_now(pci(VF), GROUP).unwrap();
        node.fail_at(Some(cut));
        assert!(node.port().rebind_now(pci(VF), Some("igbvf"), true).is_err(), "write {cut}");
        node.fail_at(None);
        node.port().rebind_now(pci(VF), Some("igbvf"), true).unwrap();
        assert_eq!(node.driver(VF).as_deref(), Some("igbvf"), "cut at {cut}");
        assert_eq!(node.netdevs(VF), [NETDEV]);
        assert_eq!(node.override_of(VF), "(null)\n");
    }
}

#[test]
fn a_driver_the_probe_does_not_pick_is_bound_by_name_and_a_missing_function_is_left_alone() {
    let node = Node::new();
    node.port().bind_now(pci(VF), GROUP).unwrap();
    // A driver whose id table does not list the function (bound by hand once, or by
    // new_id): the probe binds nothing, the bind by name does.
    fs::remove_dir_all(node.sys().join("bus/pci/drivers/igbvf")).unwrap();
    fs::create_dir_all(node.sys().join("bus/pci/drivers/byhand")).unwrap();
    node.fail_at(None);
    node.port().rebind_now(pci(VF), Some("byhand"), true).unwrap();
    assert_eq!(node.driver(VF).as_deref(), Some("byhand"));
    assert!(node.log.lock().unwrap().contains(&format!("bus/pci/drivers/byhand/bind={VF}")));

    let node = Node::new();
    fs::remove_dir_all(node.dev(VF)).unwrap();
    node.fail_at(None);
    node.port().rebind_now(pci(VF), Some("igbvf"), true).unwrap();
    assert_eq!(node.writes(), 0, "a function that is gone is left alone");
}
