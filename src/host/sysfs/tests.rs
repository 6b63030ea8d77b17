//! Sysfs reading on fixture trees shaped like the kernel's: a PCI NIC, an SR-IOV PF with
//! VFs, a VF, a bond with members, a veth and an interface whose name is not a DNS label.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;
use crate::inventory::{Inventory, Selection, SharingMode};
use crate::model::device::{Controller, HostInterface, LinkKind};

/// A fake `/sys` below a temp dir. Paths mirror the kernel's layout:
/// `class/net/<if>` → `devices/<bus path>/net/<if>`, `device` → the bus device, PCI functions
/// with `vendor`, `device`, `numa_node`, `driver` and `subsystem` links, SR-IOV `physfn` and
/// `virtfnN` links.
struct FakeSysfs {
    dir: tempfile::TempDir,
}

impl FakeSysfs {
    fn new() -> Self {
        let fake = Self { dir: tempfile::tempdir().unwrap() };
        fs::create_dir_all(fake.root().join("class/net")).unwrap();
        fs::create_dir_all(fake.root().join("bus/pci")).unwrap();
        fake
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn pci_function(
        &self,
        address: &str,
        vendor: &str,
        device: &str,
        driver: &str,
        numa: i32,
    ) -> PathBuf {
        let dir = self.root().join("devices/pci0000:3a/0000:3a:00.0").join(address);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
        fs::write(dir.join("device"), format!("{device}\n")).unwrap();
        fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
        let driver_dir = self.root().join("bus/pci/drivers").join(driver);
        fs::create_dir_all(&driver_dir).unwrap();
        symlink(&driver_dir, dir.join("driver")).unwrap();
        symlink(self.root().join("bus/pci"), dir.join("subsystem")).unwrap();
        dir
    }

    fn netdev(&self, if_name: &str, device_dir: Option<&Path>, speed: &str) {
        let net_dir = match device_dir {
            Some(device_dir) => device_dir.join("net").join(if_name),
            None => self.root().join("devices/virtual/net").join(if_name),
        };
        fs::create_dir_all(&net_dir).unwrap();
        fs::write(net_dir.join("speed"), format!("{speed}\n")).unwrap();
        if let Some(device_dir) = device_dir {
            symlink(device_dir, net_dir.join("device")).unwrap();
        }
        symlink(&net_dir, self.root().join("class/net").join(if_name)).unwrap();
    }

    fn make_sriov(pf_dir: &Path, vf_dirs: &[&Path], total: u32) {
        fs::write(pf_dir.join("sriov_totalvfs"), format!("{total}\n")).unwrap();
        fs::write(pf_dir.join("sriov_numvfs"), format!("{}\n", vf_dirs.len())).unwrap();
        for (index, vf_dir) in vf_dirs.iter().enumerate() {
            symlink(vf_dir, pf_dir.join(format!("virtfn{index}"))).unwrap();
            symlink(pf_dir, vf_dir.join("physfn")).unwrap();
        }
    }
}

/// The fixture node: a PCI NIC, a PF with two VFs (one with a netdev), a bond of two NICs,
/// a veth, and a VLAN interface named `eth0.100`.
fn fixture_node() -> FakeSysfs {
    let sys = FakeSysfs::new();
    let nic = sys.pci_function("0000:3b:00.0", "0x8086", "0x1572", "i40e", 1);
    sys.netdev("ens1f0", Some(&nic), "25000");

    let pf = sys.pci_function("0000:5e:00.0", "0x15b3", "0x101d", "mlx5_core", 0);
    let vf0 = sys.pci_function("0000:5e:00.2", "0x15b3", "0x101e", "mlx5_core", 0);
    let vf1 = sys.pci_function("0000:5e:00.3", "0x15b3", "0x101e", "vfio-pci", 0);
    FakeSysfs::make_sriov(&pf, &[&vf0, &vf1], 8);
    sys.netdev("ens2f0np0", Some(&pf), "100000");
    sys.netdev("ens2f0v0", Some(&vf0), "-1");

    let member_a = sys.pci_function("0000:af:00.0", "0x14e4", "0x16d7", "bnxt_en", -1);
    let member_b = sys.pci_function("0000:af:00.1", "0x14e4", "0x16d7", "bnxt_en", -1);
    sys.netdev("eno1", Some(&member_a), "10000");
    sys.netdev("eno2", Some(&member_b), "10000");
    sys.netdev("bond0", None, "20000");
    sys.netdev("veth12ab", None, "10000");
    sys.netdev("eth0.100", None, "-1");
    sys
}

#[test]
fn a_pci_nic_reports_ids_driver_numa_root_and_speed() {
    let sys = fixture_node();
    let facts = Sysfs::new(sys.root()).hardware("ens1f0").unwrap().unwrap();
    assert!(facts.has_device);
    assert_eq!(facts.driver.as_deref(), Some("i40e"));
    assert_eq!(facts.speed_mbps, Some(25_000));
    let pci = facts.pci.unwrap();
    assert_eq!(pci.address.to_string(), "0000:3b:00.0");
    assert_eq!(pci.vendor, Some(0x8086));
    assert_eq!(pci.device, Some(0x1572));
    assert_eq!(pci.numa_node, Some(1));
    assert_eq!(pci.pcie_root.as_deref(), Some("pci0000:3a"));
    assert_eq!(pci.sriov, SriovRole::None);
}

#[test]
fn an_sriov_pf_reports_its_vf_counts() {
    let sys = fixture_node();
    let pci = Sysfs::new(sys.root()).hardware("ens2f0np0").unwrap().unwrap().pci.unwrap();
    assert_eq!(pci.sriov, SriovRole::PhysicalFunction { total_vfs: 8, num_vfs: 2 });
}

#[test]
fn a_vf_reports_its_pf_and_index() {
    let sys = fixture_node();
    let facts = Sysfs::new(sys.root()).hardware("ens2f0v0").unwrap().unwrap();
    assert_eq!(facts.speed_mbps, None, "-1 means unknown");
    let pci = facts.pci.unwrap();
    assert_eq!(
        pci.sriov,
        SriovRole::VirtualFunction {
            pf_address: "0000:5e:00.0".parse().unwrap(),
            pf_name: Some("ens2f0np0".to_owned()),
            vf_index: Some(0),
        }
    );
}

#[test]
fn virtual_interfaces_have_no_device() {
    let sys = fixture_node();
    let sysfs = Sysfs::new(sys.root());
    for name in ["bond0", "veth12ab", "eth0.100"] {
        let facts = sysfs.hardware(name).unwrap().unwrap();
        assert!(!facts.has_device, "{name}");
        assert_eq!(facts.pci, None, "{name}");
    }
    assert_eq!(sysfs.hardware("bond0").unwrap().unwrap().speed_mbps, Some(20_000));
}

#[test]
fn a_missing_interface_is_none_and_a_missing_numa_is_unknown() {
    let sys = fixture_node();
    let sysfs = Sysfs::new(sys.root());
    assert_eq!(sysfs.hardware("gone0").unwrap(), None);
    let pci = sysfs.hardware("eno1").unwrap().unwrap().pci.unwrap();
    assert_eq!(pci.numa_node, None, "-1 means no NUMA affinity");
}

/// The whole pure pipeline on the fixture node: netlink facts (as discovery would report
/// them) + sysfs facts → inventory.
#[test]
fn the_fixture_node_publishes_what_an_operator_expects() {
    let sys = fixture_node();
    let sysfs = Sysfs::new(sys.root());
    let link = |index: u32, name: &str, kind: Option<LinkKind>, controller: Option<&str>| {
        let mut interface = HostInterface::new(index, name, 1500);
        interface.kind = kind;
        interface.controller =
            controller.map(|name| Controller { name: name.to_owned(), kind: Some(LinkKind::Bond) });
        interface.hardware = sysfs.hardware(name).unwrap().unwrap();
        interface
    };
    let interfaces = vec![
        link(2, "ens1f0", None, None),
        link(3, "ens2f0np0", None, None),
        link(4, "ens2f0v0", None, None),
        link(5, "eno1", None, Some("bond0")),
        link(6, "eno2", None, Some("bond0")),
        link(7, "bond0", Some(LinkKind::Bond), None),
        link(8, "veth12ab", Some(LinkKind::Veth), None),
        link(9, "eth0.100", Some(LinkKind::Vlan), None),
    ];
    let selection = Selection::new(
        &["*".to_owned()],
        &["veth*".to_owned()],
        &["bond0".to_owned()],
        SharingMode::Capacity,
    )
    .unwrap();
    let inventory = Inventory::build(&interfaces, &selection);
    let published: Vec<(&str, &str)> =
        inventory.devices.iter().map(|d| (d.name.as_str(), d.if_name.as_str())).collect();
    assert_eq!(
        published,
        [
            ("bond0", "bond0"),
            ("eth0-100-959ba6", "eth0.100"),
            ("pci-0000-3b-00-0", "ens1f0"),
            ("pci-0000-5e-00-0", "ens2f0np0"),
            ("pci-0000-5e-00-2", "ens2f0v0"),
        ]
    );
    let skipped: Vec<&str> = inventory.skipped.iter().map(|s| s.if_name.as_str()).collect();
    assert_eq!(skipped, ["eno1", "eno2", "veth12ab"]);
}

/// VFs by PCI address (decision 0018): the PF's name and the VF's index are looked up from
/// the address, so after the PFs swap names at boot each VF is still found on its own PF.
#[test]
fn a_vf_is_found_by_pci_address_on_its_pf_whatever_the_pf_is_called() {
    let sys = FakeSysfs::new();
    let devices = sys.root().join("bus/pci/devices");
    fs::create_dir_all(&devices).unwrap();
    let mut vfs = Vec::new();
    for (pf_address, vf_address, pf_name) in
        [("0000:5e:00.0", "0000:5e:00.2", "eth9"), ("0000:5f:00.0", "0000:5f:00.2", "eth10")]
    {
        let pf = sys.pci_function(pf_address, "0x8086", "0x10c9", "igb", 0);
        let vf = sys.pci_function(vf_address, "0x8086", "0x10ca", "igbvf", 0);
        FakeSysfs::make_sriov(&pf, &[&vf], 7);
        symlink(&vf, devices.join(vf_address)).unwrap();
        symlink(&pf, devices.join(pf_address)).unwrap();
        sys.netdev(pf_name, Some(&pf), "1000");
        vfs.push((pf, vf_address.parse::<PciAddress>().unwrap()));
    }
    let sysfs = Sysfs::new(sys.root());
    let (first, second) = (vfs[0].1, vfs[1].1);
    assert_eq!(sysfs.vf_pci_address("eth9", 0).unwrap(), Some(first));
    assert_eq!(sysfs.vf_pci_address("eth10", 0).unwrap(), Some(second));
    assert_eq!(sysfs.locate_vf(first).unwrap(), Some(("eth9".to_owned(), 0)));
    // The next boot names the PFs the other way round.
    for (pf, _) in &vfs {
        fs::remove_dir_all(pf.join("net")).unwrap();
    }
    fs::remove_file(sys.root().join("class/net/eth9")).unwrap();
    fs::remove_file(sys.root().join("class/net/eth10")).unwrap();
    sys.netdev("eth10", Some(&vfs[0].0), "1000");
    sys.netdev("eth9", Some(&vfs[1].0), "1000");
    assert_eq!(sysfs.locate_vf(first).unwrap(), Some(("eth10".to_owned(), 0)));
    assert_eq!(sysfs.locate_vf(second).unwrap(), Some(("eth9".to_owned(), 0)));
    assert_eq!(sysfs.vf_pci_address("eth9", 0).unwrap(), Some(second), "a name is not an identity");
    // A PF itself, and an address nobody has, are not VFs.
    assert_eq!(sysfs.locate_vf("0000:5e:00.0".parse().unwrap()).unwrap(), None);
    assert_eq!(sysfs.locate_vf("0000:77:00.1".parse().unwrap()).unwrap(), None);
    assert_eq!(sysfs.vf_pci_address("eth9", 3).unwrap(), None);
}

/// A VF's netdev by its PCI address (decision 0018): whatever udev named it this boot.
#[test]
fn a_pci_functions_netdev_is_found_by_its_address_under_its_current_name() {
    let sys = FakeSysfs::new();
    let devices = sys.root().join("bus/pci/devices");
    fs::create_dir_all(&devices).unwrap();
    let vf = sys.pci_function("0000:5e:00.2", "0x8086", "0x10ca", "igbvf", 0);
    symlink(&vf, devices.join("0000:5e:00.2")).unwrap();
    let sysfs = Sysfs::new(sys.root());
    let address: PciAddress = "0000:5e:00.2".parse().unwrap();
    assert_eq!(sysfs.pci_netdev(address).unwrap(), None, "no driver bound: no netdev");
    sys.netdev("enp94s0f0v0", Some(&vf), "1000");
    assert_eq!(sysfs.pci_netdev(address).unwrap().as_deref(), Some("enp94s0f0v0"));
    fs::remove_dir_all(vf.join("net")).unwrap();
    sys.netdev("vf-renamed", Some(&vf), "1000");
    assert_eq!(sysfs.pci_netdev(address).unwrap().as_deref(), Some("vf-renamed"));
    assert_eq!(sysfs.pci_netdev("0000:77:00.1".parse().unwrap()).unwrap(), None);
}
