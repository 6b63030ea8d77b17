//! Shared by the VM suites that use the emulated SR-IOV NIC (`tests/vm/vm_daemon.rs`,
//! `tests/vm/vm_attach_bench.rs`): the VM check, the igb PFs and VFs from sysfs, and a VF guard
//! that gives the PF back as it found it (no VFs, link state restored), so the next suite
//! of the same boot starts from a clean NIC.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// Fails the test outside the VM (`vmtests/guest.sh` sets `NETCLAIM_VM=1`): the host's
/// kernel has no ipvlan and no SR-IOV NIC.
pub fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
    // The product's log lines (udev races, retries) go with a failed test's output: a guest
    // is gone by the time anyone reads its log.
    let _already = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::new("netclaim=info"))
        .try_init();
}

/// The netdevs of the current netns bound to `driver` (`igb`, `igbvf`), sorted.
pub fn netdevs_of(driver: &str) -> Vec<String> {
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

/// VFs created on the first igb PF (in the VM's root netns), removed on drop; the PF is up
/// while they exist (igb answers its VFs' mailbox only while the PF is open, and igbvf's
/// open waits for that answer) and set back down on drop if it was down.
pub struct Vfs {
    /// The PF's netdev name.
    pub pf: String,
    /// The VFs' netdev names, by VF index.
    pub names: Vec<String>,
    /// The VFs' PCI addresses, by VF index.
    pub pci: Vec<String>,
    numvfs: PathBuf,
    pf_was_up: bool,
}

impl Vfs {
    /// Creates `count` VFs on the first igb PF and waits for their igbvf netdevs.
    pub fn create(count: u32) -> Self {
        let pfs = netdevs_of("igb");
        Self::create_on(pfs.first().expect("an igb PF (the VM has two)"), count)
    }

    /// Creates `count` VFs on the PF named `pf` and waits for their igbvf netdevs.
    pub fn create_on(pf: &str, count: u32) -> Self {
        let pf = pf.to_owned();
        let device = PathBuf::from(format!("/sys/class/net/{pf}/device"));
        let numvfs = device.join("sriov_numvfs");
        let flags = std::fs::read_to_string(format!("/sys/class/net/{pf}/flags")).unwrap();
        let pf_was_up =
            u32::from_str_radix(flags.trim().trim_start_matches("0x"), 16).unwrap() & 1 == 1;
        let mut vfs = Self { pf: pf.clone(), names: vec![], pci: vec![], numvfs, pf_was_up };
        ip(&["link", "set", &pf, "up"]);
        std::fs::write(&vfs.numvfs, count.to_string()).unwrap();
        let started = Instant::now();
        for index in 0..count {
            let virtfn = device.join(format!("virtfn{index}"));
            let netdev = || {
                std::fs::read_dir(virtfn.join("net"))
                    .ok()
                    .and_then(|mut entries| entries.next())
                    .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            };
            while netdev().is_none() {
                assert!(started.elapsed() < Duration::from_secs(30), "no netdev for VF {index}");
                std::thread::sleep(Duration::from_millis(50));
            }
            // udev renames the new `ethN` (predictable names: `<pf>v<index>`) after it
            // registered; the name is the one left once udev's queue is empty.
            let settled = Command::new("udevadm").args(["settle", "--timeout=30"]).status();
            assert!(settled.is_ok_and(|s| s.success()), "udevadm settle");
            let name = netdev().expect("the VF's netdev");
            let pci = std::fs::read_link(&virtfn).unwrap();
            vfs.pci.push(pci.file_name().unwrap().to_string_lossy().into_owned());
            vfs.names.push(name);
        }
        println!("VFs {:?} ({:?}) of {pf} after {:?}", vfs.names, vfs.pci, started.elapsed());
        vfs
    }
}

impl Drop for Vfs {
    fn drop(&mut self) {
        // Removing the VFs unregisters their netdevs in whichever netns they are.
        let _ignored = std::fs::write(&self.numvfs, "0");
        if !self.pf_was_up {
            let _ignored = Command::new("ip").args(["link", "set", &self.pf, "down"]).status();
        }
    }
}

/// Prints `line` past libtest's capture (which keeps a passing test's `println!`): the
/// figures of a VM run must reach its log.
pub fn report(line: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ignored = writeln!(out, "{line}");
}

/// `ip <args>` in the current netns, failing the test when it fails.
pub fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().unwrap();
    assert!(output.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&output.stderr));
}
