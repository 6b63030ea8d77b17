//! Checks of the kernel the VM tests boot (`make vmtest`, decision 0012): the link kinds and
//! the emulated SR-IOV NIC the later suites (ipvlan, VLAN, VF) stand on. They run only inside
//! the VM, where `vmtests/guest.sh` sets `NETCLAIM_VM=1`; nextest leaves this binary out
//! (`.config/nextest.toml`), and run on a host anyway they fail rather than pass.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use netclaim::model::support::Probe;

/// Fails the test outside the VM: these checks are about the VM's kernel and NICs.
fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
}

/// The netdevs bound to `driver` (`igb`, `igbvf`), sorted.
fn netdevs_of(driver: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            std::fs::read_link(path.join("device/driver"))
                .is_ok_and(|target| target.file_name().is_some_and(|n| n == driver))
        })
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn read_number(path: &Path) -> u32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|err| panic!("{}: {err}", path.display()))
        .trim()
        .parse()
        .unwrap()
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn the_kernel_probe_finds_ipvlan_and_vlan() {
    require_vm("the_kernel_probe_finds_ipvlan_and_vlan");
    let support = netclaim::host::kernel_probe::probe();
    println!("kernel {}", std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim());
    assert_eq!(support.ipvlan, Probe::Available, "ipvlan");
    assert_eq!(support.vlan, Probe::Available, "vlan");
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn each_igb_pf_offers_vfs_and_gives_igbvf_netdevs() {
    require_vm("each_igb_pf_offers_vfs_and_gives_igbvf_netdevs");
    let pfs = netdevs_of("igb");
    assert_eq!(pfs.len(), 2, "two igb PFs: {pfs:?}");
    for pf in &pfs {
        let total =
            read_number(&PathBuf::from(format!("/sys/class/net/{pf}/device/sriov_totalvfs")));
        println!("{pf}: sriov_totalvfs {total}");
        // The 82576 has 8 VF pools; QEMU's igb offers 7 of them as VFs (one stays the PF's).
        assert!(total > 0, "{pf} offers no VFs");
    }
    // Two VFs on the first PF become igbvf netdevs, and go away again.
    let numvfs = PathBuf::from(format!("/sys/class/net/{}/device/sriov_numvfs", pfs[0]));
    std::fs::write(&numvfs, "2").unwrap();
    let started = Instant::now();
    while netdevs_of("igbvf").len() < 2 {
        assert!(started.elapsed() < Duration::from_secs(20), "no igbvf netdevs after 20 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("VFs {:?} after {:?}", netdevs_of("igbvf"), started.elapsed());
    std::fs::write(&numvfs, "0").unwrap();
    assert_eq!(read_number(&numvfs), 0);
}
