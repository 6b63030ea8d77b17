//! RDMA discovery on fixture trees shaped like the kernel's sysfs: a RoCE PF (`mlx5_0` on
//! `ens2f0np0`), an InfiniBand function with IPoIB (`mlx5_1`, `ib0`), soft-RoCE on a veth
//! (`rxe0`, no bus device), and their character devices.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use rdma_netlink::{Device, Port};

use super::*;

struct FakeSysfs {
    dir: tempfile::TempDir,
}

impl FakeSysfs {
    fn new() -> Self {
        Self { dir: tempfile::tempdir().unwrap() }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    fn write(&self, path: &str, text: &str) {
        let path = self.root().join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, format!("{text}\n")).unwrap();
    }

    /// A PCI function with a netdev (`dev_port` as the kernel numbers ports, from 0).
    fn pci_netdev(&self, address: &str, netdev: &str, dev_port: u32) -> PathBuf {
        let dir = self.root().join("devices/pci0000:5d/0000:5d:00.0").join(address);
        fs::create_dir_all(dir.join("net").join(netdev)).unwrap();
        fs::write(dir.join("net").join(netdev).join("dev_port"), format!("{dev_port}\n")).unwrap();
        let bus = self.root().join("bus/pci");
        fs::create_dir_all(&bus).unwrap();
        if !dir.join("subsystem").exists() {
            symlink(&bus, dir.join("subsystem")).unwrap();
        }
        dir
    }

    /// `class/infiniband/<name>` with its ports' link layers; `device` links to `function`.
    fn ib_device(&self, name: &str, function: Option<&Path>, link_layers: &[&str], guid: &str) {
        let dir = match function {
            Some(function) => function.join("infiniband").join(name),
            None => self.root().join("devices/virtual/infiniband").join(name),
        };
        for (index, layer) in link_layers.iter().enumerate() {
            let port = dir.join(format!("ports/{}", index + 1));
            fs::create_dir_all(port.join("gid_attrs/ndevs")).unwrap();
            fs::write(port.join("link_layer"), format!("{layer}\n")).unwrap();
        }
        fs::write(dir.join("node_guid"), format!("{guid}\n")).unwrap();
        if let Some(function) = function {
            symlink(function, dir.join("device")).unwrap();
        }
        let class = self.root().join("class/infiniband");
        fs::create_dir_all(&class).unwrap();
        symlink(&dir, class.join(name)).unwrap();
    }

    fn gid_netdev(&self, device: &str, port: u32, gid: u32, netdev: &str) {
        self.write(
            &format!("class/infiniband/{device}/ports/{port}/gid_attrs/ndevs/{gid}"),
            netdev,
        );
    }

    fn char_device(&self, class: &str, name: &str, ibdev: &str) {
        self.write(&format!("class/{class}/{name}/ibdev"), ibdev);
    }
}

/// The fixture node: `mlx5_0` (RoCE on `ens2f0np0`, GID table naming it), `mlx5_1`
/// (InfiniBand, IPoIB `ib0` on the same function), `rxe0` (soft-RoCE on `veth-rxe`, whose
/// GID entry 0 is unused and entry 1 names it), `uverbs0..2`, `umad0..2`, `issm0`, `rdma_cm`.
fn fixture() -> FakeSysfs {
    let sys = FakeSysfs::new();
    let roce = sys.pci_netdev("0000:5e:00.0", "ens2f0np0", 0);
    let ib = sys.pci_netdev("0000:5e:00.1", "ib0", 0);
    sys.ib_device("mlx5_0", Some(&roce), &["Ethernet"], "b859:9f03:00d4:1e2a");
    sys.ib_device("mlx5_1", Some(&ib), &["InfiniBand"], "b859:9f03:00d4:1e2b");
    sys.ib_device("rxe0", None, &["Ethernet"], "5054:00ff:fe12:3456");
    sys.gid_netdev("mlx5_0", 1, 0, "ens2f0np0");
    sys.gid_netdev("rxe0", 1, 1, "veth-rxe");
    // Unused GID entries read as nothing (the kernel answers EINVAL; an empty file here).
    sys.write("class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0", "");
    for (index, device) in ["mlx5_0", "mlx5_1", "rxe0"].iter().enumerate() {
        sys.char_device("infiniband_verbs", &format!("uverbs{index}"), device);
        sys.char_device("infiniband_mad", &format!("umad{index}"), device);
    }
    sys.char_device("infiniband_mad", "issm0", "mlx5_0");
    fs::create_dir_all(sys.root().join("class/misc/rdma_cm")).unwrap();
    sys
}

fn dev(name: &str) -> PathBuf {
    Path::new("/dev/infiniband").join(name)
}

#[test]
fn a_node_without_ib_core_has_no_rdma() {
    let sys = FakeSysfs::new();
    let rdma = RdmaSysfs::new(sys.root());
    assert!(!rdma.has_rdma().unwrap());
    assert!(rdma.facts(None).unwrap().is_empty());
}

#[test]
fn sysfs_alone_finds_each_netdevs_rdma_function() {
    let sys = fixture();
    let rdma = RdmaSysfs::new(sys.root());
    assert!(rdma.has_rdma().unwrap());
    let facts = rdma.facts(None).unwrap();
    assert_eq!(facts.keys().collect::<Vec<_>>(), ["ens2f0np0", "ib0", "veth-rxe"]);

    let roce = &facts["ens2f0np0"];
    assert_eq!(roce.device, "mlx5_0");
    assert_eq!(roce.port, Some(1));
    assert_eq!(roce.ports, 1);
    assert_eq!(roce.link_layer, Some(RdmaLinkLayer::Ethernet));
    assert_eq!(roce.node_guid.as_deref(), Some("b859:9f03:00d4:1e2a"));
    assert_eq!(roce.pci_address, Some("0000:5e:00.0".parse().unwrap()));
    assert!(!roce.is_software());
    // Without netlink: no index, no netns mode.
    assert_eq!((roce.index, roce.netns_mode), (None, None));
    // Its own uverbs and umad (not issm: the SM role is no pod's), then rdma_cm.
    assert_eq!(roce.char_devices, [dev("uverbs0"), dev("umad0"), dev("rdma_cm")]);

    let ib = &facts["ib0"];
    assert_eq!(ib.device, "mlx5_1");
    assert_eq!(ib.link_layer, Some(RdmaLinkLayer::InfiniBand), "IPoIB by its PCI function");
    assert_eq!(ib.char_devices, [dev("uverbs1"), dev("umad1"), dev("rdma_cm")]);

    let rxe = &facts["veth-rxe"];
    assert_eq!(rxe.device, "rxe0");
    assert_eq!(rxe.pci_address, None);
    assert!(rxe.is_software());
    assert_eq!(rxe.node_guid.as_deref(), Some("5054:00ff:fe12:3456"));
}

#[test]
fn netlink_answers_give_index_netdev_guid_and_mode() {
    let sys = fixture();
    // The GID table has not named mlx5_0's netdev yet; netlink does (another name, too:
    // netlink is the kernel's current answer).
    fs::remove_file(sys.root().join("class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/0")).unwrap();
    let device = |index: u32, name: &str, guid: u64| Device {
        index,
        name: name.to_owned(),
        ports: 1,
        firmware: None,
        node_guid: Some(guid),
        sys_image_guid: None,
        node_type: Some(1),
        protocol: None,
    };
    let port = |index: u32, name: &str, netdev: Option<&str>| Port {
        device_index: index,
        device_name: name.to_owned(),
        port: 1,
        state: Some(4),
        phys_state: Some(5),
        netdev_index: netdev.map(|_| 9),
        netdev_name: netdev.map(str::to_owned),
    };
    let view = NetlinkView {
        devices: vec![device(0, "mlx5_0", 0xb859_9f03_00d4_1e2a), device(4, "rxe0", 0x1)],
        ports: vec![port(0, "mlx5_0", Some("ens2f0np0")), port(4, "rxe0", None)],
        netns_mode: Some(RdmaNetnsMode::Exclusive),
    };
    let facts = RdmaSysfs::new(sys.root()).facts(Some(&view)).unwrap();
    let roce = &facts["ens2f0np0"];
    assert_eq!(roce.index, Some(0));
    assert_eq!(roce.netns_mode, Some(RdmaNetnsMode::Exclusive));
    let rxe = &facts["veth-rxe"];
    assert_eq!(rxe.index, Some(4));
    assert_eq!(rxe.node_guid.as_deref(), Some("0000:0000:0000:0001"), "netlink's GUID wins");
    // A device sysfs has but the dump had not (registered in between): sysfs facts only.
    assert_eq!(facts["ib0"].index, None);
    assert_eq!(facts["ib0"].netns_mode, Some(RdmaNetnsMode::Exclusive));
}

#[test]
fn a_device_whose_netdev_is_not_known_is_left_out() {
    let sys = FakeSysfs::new();
    // A two-port function with two netdevs and no dev_port: which is which cannot be told.
    let function = sys.pci_netdev("0000:3b:00.0", "ibp59s0", 0);
    fs::remove_file(function.join("net/ibp59s0/dev_port")).unwrap();
    fs::create_dir_all(function.join("net/ibp59s0d1")).unwrap();
    sys.ib_device("mlx4_0", Some(&function), &["InfiniBand", "InfiniBand"], "0002:c903:0001:0a0b");
    let facts = RdmaSysfs::new(sys.root()).facts(None).unwrap();
    assert!(facts.is_empty(), "{facts:?}");
    // With dev_port the second port's netdev is found.
    fs::write(function.join("net/ibp59s0d1/dev_port"), "1\n").unwrap();
    let facts = RdmaSysfs::new(sys.root()).facts(None).unwrap();
    assert_eq!(facts.keys().collect::<Vec<_>>(), ["ibp59s0d1"]);
    assert_eq!(facts["ibp59s0d1"].port, Some(2));
    assert_eq!(facts["ibp59s0d1"].ports, 2);
}

#[test]
fn char_devices_are_only_those_the_kernel_registered() {
    let sys = fixture();
    // ib_umad and rdma_ucm not loaded: only uverbs.
    fs::remove_dir_all(sys.root().join("class/infiniband_mad")).unwrap();
    fs::remove_dir_all(sys.root().join("class/misc")).unwrap();
    let facts = RdmaSysfs::new(sys.root()).facts(None).unwrap();
    assert_eq!(facts["ens2f0np0"].char_devices, [dev("uverbs0")]);
}

#[test]
fn an_unreadable_tree_is_an_error_naming_the_path() {
    let sys = fixture();
    // `ports` of rxe0 as a file: listing it fails with ENOTDIR, not "absent".
    let ports = sys.root().join("devices/virtual/infiniband/rxe0/ports");
    fs::remove_dir_all(&ports).unwrap();
    fs::write(&ports, "").unwrap();
    let err = RdmaSysfs::new(sys.root()).facts(None).unwrap_err();
    assert!(err.path.ends_with("rxe0/ports"), "{err}");
}
