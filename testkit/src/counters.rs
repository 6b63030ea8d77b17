//! The traffic counter checks shared by the host's root tier (`tests/netns/stats_bpf.rs`, tcx and
//! clsact on the host's kernel) and the VM suite (`tests/vm/vm_stats.rs`, clsact on 6.1 where
//! tcx does not exist): a veth pair between a throwaway "pod" netns and a "peer" netns,
//! counters hooked on the pod end with the real eBPF object, a ping flood, and the counts held
//! against the kernel's own link counters (`ip -s`), which count the same frames. Pins live in
//! a private bpffs mounted for the test, so nothing touches the host's /sys/fs/bpf.

use std::path::{Path, PathBuf};

use netclaim::host::bpf::{CounterPins, HookKind};
use netclaim::model::stats::InterfaceStats;
use netclaim::stats::CounterPort;
use serde_json::Value;

use super::netns::{Netns, run};

/// A private bpffs, unmounted (and its directory removed) on drop.
pub struct Bpffs {
    dir: tempfile::TempDir,
}

impl Bpffs {
    pub fn mount() -> Self {
        let dir = tempfile::tempdir().unwrap();
        run("mount", &["-t", "bpf", "bpf", dir.path().to_str().unwrap()]);
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ignored = std::process::Command::new("umount").arg(self.dir.path()).status();
    }
}

/// The pod end `pod_if` (10.78.0.2/24) in `pod`, its peer (10.78.0.1/24, MTU 1500) in `peer`;
/// IPv4 only.
pub struct Pair {
    pub pod: Netns,
    pub peer: Netns,
    pub pod_if: String,
    pub peer_if: String,
}

impl Pair {
    pub fn new(pod_mtu: u32) -> Self {
        let (pod, peer) = (Netns::new(), Netns::new());
        let (pod_if, peer_if) = (pod.ifname("p0"), pod.ifname("p1"));
        pod.ip(&[
            "link",
            "add",
            &pod_if,
            "mtu",
            &pod_mtu.to_string(),
            "type",
            "veth",
            "peer",
            "name",
            &peer_if,
        ]);
        pod.ip(&["link", "set", &peer_if, "netns", &peer.name]);
        // No IPv6 on either end: at link-up the kernel sends its own router solicitations,
        // MLD reports and DAD probes, which a test counting exact packets or a policer's
        // exact burst would see as traffic (they spend the bucket the flood is measured by).
        // IPv4 sends nothing by itself: the tests set permanent neighbour entries.
        for (netns, interface) in [(&pod, &pod_if), (&peer, &peer_if)] {
            let key = format!("net.ipv6.conf.{interface}.disable_ipv6=1");
            let out = netns.exec("sysctl", &["-qw", &key]);
            assert!(out.status.success(), "disabling IPv6 on {interface}: {out:?}");
        }
        pod.ip(&["addr", "add", "10.78.0.2/24", "dev", &pod_if]);
        peer.ip(&["addr", "add", "10.78.0.1/24", "dev", &peer_if]);
        peer.ip(&["link", "set", &peer_if, "up"]);
        pod.ip(&["link", "set", &pod_if, "up"]);
        Self { pod, peer, pod_if, peer_if }
    }

    pub fn pod_path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.pod.name))
    }

    /// `(rx_packets, rx_bytes, tx_packets, tx_bytes, tx_dropped)` of the pod end, from `ip -s`.
    pub fn kernel_counters(&self) -> [u64; 5] {
        let out = self.pod.ip(&["-j", "-s", "link", "show", &self.pod_if]);
        let links: Value = serde_json::from_slice(&out.stdout).unwrap();
        let stats = &links[0]["stats64"];
        let n = |v: &Value| v.as_u64().unwrap();
        [
            n(&stats["rx"]["packets"]),
            n(&stats["rx"]["bytes"]),
            n(&stats["tx"]["packets"]),
            n(&stats["tx"]["bytes"]),
            n(&stats["tx"]["dropped"]),
        ]
    }

    pub fn ping(&self, args: &[&str]) {
        let mut full = vec!["-q"];
        full.extend_from_slice(args);
        full.push("10.78.0.1");
        let out = self.pod.exec("ping", &full);
        assert!(out.status.code().is_some(), "ping did not run: {out:?}");
    }

    /// The names of the tc filters on the pod end in `direction` (`ingress`, `egress`).
    pub fn filters(&self, direction: &str) -> String {
        let out = self.pod.exec("tc", &["filter", "show", "dev", &self.pod_if, direction]);
        assert!(out.status.success(), "tc filter show failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

fn within_one_percent(ours: u64, kernel: u64, what: &str) {
    let diff = ours.abs_diff(kernel);
    assert!(diff * 100 <= kernel.max(1), "{what}: counters {ours}, kernel {kernel}");
}

async fn read(pins: &CounterPins, pair: &Pair) -> InterfaceStats {
    let stats =
        pins.read(&pair.pod_path(), "pod-uid", std::slice::from_ref(&pair.pod_if)).await.unwrap();
    stats[0].expect("counters are hooked")
}

/// Hooks `kind` on the pod end, floods 2000 echo requests and holds the counts against the
/// link's own; then unhooks and checks the pins and the filters are gone.
pub async fn counts_match_the_kernel(kind: HookKind) {
    let bpffs = Bpffs::mount();
    let pair = Pair::new(1500);
    let pins = CounterPins::new(bpffs.path(), "node-a", kind);
    pins.hook(&pair.pod_path(), "pod-uid", &pair.pod_if).await.unwrap();
    assert_eq!(pins.hooked().unwrap(), [("pod-uid".to_owned(), pair.pod_if.clone())]);
    let dir = bpffs.path().join("netclaim/node-a/pod-uid").join(&pair.pod_if);
    assert!(dir.join("counters").exists(), "map pinned");
    assert_eq!(dir.join("rx_link").exists(), kind == HookKind::Tcx, "tcx links pinned");
    if kind == HookKind::Clsact {
        // The two direct-action filters, found by program name (`tc` prints it).
        assert!(pair.filters("ingress").contains("netclaim_rx"), "ingress filter");
        assert!(pair.filters("egress").contains("netclaim_tx"), "egress filter");
    }

    let before_kernel = pair.kernel_counters();
    let before = read(&pins, &pair).await;
    pair.ping(&["-f", "-c", "2000", "-s", "200"]);
    let after_kernel = pair.kernel_counters();
    let after = read(&pins, &pair).await;

    let d = |a: u64, b: u64| a - b;
    within_one_percent(
        d(after.rx.packets, before.rx.packets),
        d(after_kernel[0], before_kernel[0]),
        "rx packets",
    );
    within_one_percent(
        d(after.rx.bytes, before.rx.bytes),
        d(after_kernel[1], before_kernel[1]),
        "rx bytes",
    );
    within_one_percent(
        d(after.tx.packets, before.tx.packets),
        d(after_kernel[2], before_kernel[2]),
        "tx packets",
    );
    within_one_percent(
        d(after.tx.bytes, before.tx.bytes),
        d(after_kernel[3], before_kernel[3]),
        "tx bytes",
    );
    assert!(after.tx.icmp - before.tx.icmp >= 2000, "echo requests counted as ICMP: {after:?}");
    assert!(after.rx.icmp - before.rx.icmp >= 1980, "echo replies counted as ICMP: {after:?}");
    assert_eq!(after.tx.tcp + after.rx.tcp, 0, "no TCP was sent");

    pins.unhook(Some(&pair.pod_path()), "pod-uid", &pair.pod_if).await.unwrap();
    assert!(!dir.exists(), "pins removed");
    assert!(pins.hooked().unwrap().is_empty());
    // Detached: more traffic is not counted anywhere, and the filters are gone from tc.
    for direction in ["ingress", "egress"] {
        let filters = pair.filters(direction);
        assert!(!filters.contains("netclaim"), "clsact {direction} filter left: {filters}");
    }
    assert!(
        pins.read(&pair.pod_path(), "pod-uid", std::slice::from_ref(&pair.pod_if)).await.unwrap()
            [0]
        .is_none()
    );
}

/// Frames larger than the peer's MTU leave the pod's egress hook and are dropped by veth: the
/// counters see them sent, and the drop shows in `tx_dropped` from the link counters.
pub async fn drops_come_from_the_link_counters(kind: HookKind) {
    let bpffs = Bpffs::mount();
    let pair = Pair::new(9000);
    let pins = CounterPins::new(bpffs.path(), "node-a", kind);
    pins.hook(&pair.pod_path(), "pod-uid", &pair.pod_if).await.unwrap();
    // A permanent neighbour: the big echo requests need no ARP round trip to go out.
    let mac = {
        let out = pair.peer.ip(&["-j", "link", "show", &pair.peer_if]);
        let links: Value = serde_json::from_slice(&out.stdout).unwrap();
        links[0]["address"].as_str().unwrap().to_owned()
    };
    pair.pod.ip(&[
        "neigh",
        "replace",
        "10.78.0.1",
        "lladdr",
        &mac,
        "dev",
        &pair.pod_if,
        "nud",
        "permanent",
    ]);
    let before = read(&pins, &pair).await;
    pair.ping(&["-c", "20", "-i", "0.01", "-W", "1", "-s", "4000", "-M", "dont"]);
    let after = read(&pins, &pair).await;
    let dropped = after.tx_dropped - before.tx_dropped;
    assert!(dropped >= 20, "20 frames over the peer's MTU dropped, saw {dropped}: {after:?}");
    assert_eq!(dropped, pair.kernel_counters()[4] - before.tx_dropped, "the link's own count");
    assert!(after.tx.packets - before.tx.packets >= 20, "the egress hook saw them first");
    pins.unhook(Some(&pair.pod_path()), "pod-uid", &pair.pod_if).await.unwrap();
}

/// Another node's subtree on the same bpffs is never listed or removed; a pod's pins that
/// outlive their netns (the pod went while the daemon was down) are removed without it.
pub async fn a_node_sees_only_its_own_pins(kind: HookKind) {
    let bpffs = Bpffs::mount();
    let ours = CounterPins::new(bpffs.path(), "node-a", kind);
    let theirs = CounterPins::new(bpffs.path(), "node-b", kind);
    let (a, b) = (Pair::new(1500), Pair::new(1500));
    ours.hook(&a.pod_path(), "pod-a", &a.pod_if).await.unwrap();
    theirs.hook(&b.pod_path(), "pod-b", &b.pod_if).await.unwrap();
    assert_eq!(ours.hooked().unwrap(), [("pod-a".to_owned(), a.pod_if.clone())]);
    let a_if = a.pod_if.clone();
    let gone = a.pod_path();
    drop(a);
    ours.unhook(Some(&gone), "pod-a", &a_if).await.unwrap();
    assert!(ours.hooked().unwrap().is_empty());
    assert_eq!(theirs.hooked().unwrap(), [("pod-b".to_owned(), b.pod_if.clone())]);
    theirs.unhook(Some(&b.pod_path()), "pod-b", &b.pod_if).await.unwrap();
}
