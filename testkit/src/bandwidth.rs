//! Bandwidth ceilings against the kernel and with real traffic (issue 35), shared by the host's
//! root tier (`tests/netns/bandwidth_*.rs`), the VM suite (`tests/vm/vm_bandwidth.rs`) and the
//! figures bench (`benches/bandwidth.rs`).
//!
//! - [`qdisc_round_trips`]: what `host::qdisc` sets is what the kernel answers, both through
//!   our decoder and through `tc -j` (iproute2's own reading of the same attributes).
//! - [`Node`]: a throwaway "node" netns holding a veth pair whose first end is the shared
//!   parent, and "pods" (netns of their own) each with a macvlan child of that parent in
//!   bridge mode, so pod-to-pod traffic crosses the parent's macvlan switch as two pods on one
//!   NIC do. Ceilings are put on a pod's child by the node daemon's own adapter
//!   (`host::qdisc_ceiling::HostCeilings`), and TCP is measured with iperf3.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use netclaim::attach::bandwidth::{CeilingMechanism, CeilingPort, InterfaceCeiling};
use netclaim::host::bpf::CounterPins;
use netclaim::host::qdisc::codec::fq::Fq;
use netclaim::host::qdisc::codec::htb::{HtbClass, HtbQdisc};
use netclaim::host::qdisc::codec::tbf::Tbf;
use netclaim::host::qdisc::{self, RootQdisc};
use netclaim::host::qdisc_ceiling::HostCeilings;
use netclaim::model::bandwidth::{BitsPerSecond, IngressPolicy};
use serde_json::Value;

use super::netns::{Netns, run};

/// The iperf3 port of the `i`-th receiver.
const PORT_BASE: u16 = 5301;

/// The node: a veth pair (`<prefix>v0` the parent, `<prefix>v1` its peer), both up, in a
/// netns of its own.
pub struct Node {
    pub netns: Netns,
    pub parent: String,
    pub pods: Vec<Pod>,
}

/// A pod: its netns, its macvlan child of the parent and its address.
pub struct Pod {
    pub netns: Netns,
    pub interface: String,
    pub address: String,
}

impl Pod {
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}", self.netns.name))
    }
}

impl Node {
    /// A node with `pods` pods on one parent (10.79.0.10+i/24).
    pub fn new(pods: usize) -> Self {
        let netns = Netns::new();
        let (parent, peer) = (netns.ifname("v0"), netns.ifname("v1"));
        netns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
        netns.ip(&["link", "set", &parent, "up"]);
        netns.ip(&["link", "set", &peer, "up"]);
        let pods = (0..pods)
            .map(|i| {
                let pod = Netns::new();
                let interface = pod.ifname("m0");
                let address = format!("10.79.0.{}", 10 + i);
                netns.ip(&[
                    "link", "add", "link", &parent, "name", &interface, "netns", &pod.name, "type",
                    "macvlan", "mode", "bridge",
                ]);
                pod.ip(&["addr", "add", &format!("{address}/24"), "dev", &interface]);
                pod.ip(&["link", "set", &interface, "up"]);
                Pod { netns: pod, interface, address }
            })
            .collect();
        Self { netns, parent, pods }
    }

    /// Holds pod `i`'s egress to `rate` by `mechanism` with the daemon's adapter.
    pub async fn ceiling(&self, i: usize, rate: BitsPerSecond, mechanism: CeilingMechanism) {
        let pod = &self.pods[i];
        let ceiling = InterfaceCeiling {
            interface: pod.interface.clone(),
            rate,
            mechanism,
            ingress: IngressPolicy::None,
        };
        HostCeilings::<CounterPins>::new(None).apply(&pod.path(), "pod", &ceiling).await.unwrap();
    }

    /// Removes pod `i`'s ceiling.
    pub async fn no_ceiling(&self, i: usize) {
        let pod = &self.pods[i];
        let (handle, _file) = netclaim::host::netlink::open_in_netns(&pod.path()).await.unwrap();
        qdisc::delete_root(&handle, ifindex(&pod.netns, &pod.interface)).await.unwrap();
    }

    /// The bytes pod `i`'s root qdisc has sent (its L2 bytes; 0 without one of ours).
    pub async fn qdisc_bytes(&self, i: usize) -> u64 {
        let pod = &self.pods[i];
        let (handle, _file) = netclaim::host::netlink::open_in_netns(&pod.path()).await.unwrap();
        let root = qdisc::root(&handle, ifindex(&pod.netns, &pod.interface)).await.unwrap();
        root.filter(qdisc::QdiscState::is_ours).map_or(0, |r| r.counters.bytes)
    }

    /// TCP from each `(sender, receiver)` pod at once for `duration`: the bits per second each
    /// receiver got (iperf3's `sum_received`), in the order given.
    pub fn iperf(&self, pairs: &[(usize, usize)], duration: Duration) -> Vec<f64> {
        let servers: Vec<_> = pairs
            .iter()
            .enumerate()
            .map(|(n, (_, receiver))| {
                let pod = &self.pods[*receiver];
                let port = (PORT_BASE + u16::try_from(n).unwrap()).to_string();
                let child = Command::new("ip")
                    .args(["netns", "exec", &pod.netns.name, "iperf3", "-s", "-1", "-p", &port])
                    .args(["-B", &pod.address])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .expect("spawning iperf3 -s (apt install iperf3; scripts/setup/20-podnet.sh)");
                wait_listening(&pod.netns, &port);
                super::netns::Child { child }
            })
            .collect();
        let seconds = format!("{:.1}", duration.as_secs_f64());
        let clients: Vec<_> = pairs
            .iter()
            .enumerate()
            .map(|(n, (sender, receiver))| {
                let port = (PORT_BASE + u16::try_from(n).unwrap()).to_string();
                Command::new("ip")
                    .args(["netns", "exec", &self.pods[*sender].netns.name, "iperf3", "-J"])
                    .args(["-c", &self.pods[*receiver].address, "-p", &port, "-t", &seconds])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("spawning iperf3 -c")
            })
            .collect();
        let rates = clients
            .into_iter()
            .map(|client| {
                let out = client.wait_with_output().unwrap();
                let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|err| {
                    panic!("iperf3 -J: {err}: {}", String::from_utf8_lossy(&out.stderr))
                });
                assert!(report.get("error").is_none(), "iperf3: {}", report["error"]);
                report["end"]["sum_received"]["bits_per_second"].as_f64().unwrap()
            })
            .collect();
        drop(servers);
        rates
    }
}

/// Waits (≤ 2 s) until something listens on TCP `port` in `netns`.
fn wait_listening(netns: &Netns, port: &str) {
    for _ in 0..200 {
        let out = netns.exec("ss", &["-Hltn", "sport", "=", &format!(":{port}")]);
        if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("iperf3 -s never listened on {port} in {}", netns.name);
}

/// The index of `interface` in `netns`.
pub fn ifindex(netns: &Netns, interface: &str) -> u32 {
    let out = netns.ip(&["-j", "link", "show", interface]);
    let links: Value = serde_json::from_slice(&out.stdout).unwrap();
    u32::try_from(links[0]["ifindex"].as_u64().unwrap()).unwrap()
}

/// `tc -j qdisc show dev <interface>` in `netns`: the root qdisc's JSON.
fn tc_root(netns: &Netns, interface: &str) -> Value {
    let out = netns.exec("tc", &["-j", "qdisc", "show", "dev", interface]);
    assert!(out.status.success(), "tc qdisc show: {out:?}");
    let all: Value = serde_json::from_slice(&out.stdout).unwrap();
    all.as_array().unwrap().iter().find(|q| q["root"] == true).cloned().unwrap()
}

/// Whether the running kernel has `sch_fq` (asked of the kernel, as the probe does).
pub async fn kernel_has_fq() -> bool {
    let netns = Netns::new();
    let dev = netns.ifname("f0");
    netns.ip(&["link", "add", &dev, "type", "veth", "peer", "name", &netns.ifname("f1")]);
    let path = PathBuf::from(format!("/run/netns/{}", netns.name));
    let (handle, _file) = netclaim::host::netlink::open_in_netns(&path).await.unwrap();
    let result =
        qdisc::replace_root(&handle, ifindex(&netns, &dev), &RootQdisc::Fq(Fq::default())).await;
    match result {
        Ok(()) => true,
        // qdisc_create: no Qdisc_ops of the kind, even after request_module("sch_fq").
        Err(err) if err.errno() == Some(2) => false,
        Err(err) => panic!("probing fq: {err}"),
    }
}

/// Sets tbf, htb (with its class) and fq (or, on a kernel without it, sees it refused with
/// `ENOENT` and the previous root kept) on a veth end, and holds each against the kernel's
/// dump (our decoder) and `tc -j`; deletes ours at the end and checks that someone else's
/// root is never deleted.
#[allow(
    clippy::too_many_lines,
    reason = "one kernel round trip per qdisc kind, read top to bottom"
)]
pub async fn qdisc_round_trips(fq_expected: Option<bool>) {
    let netns = Netns::new();
    let dev = netns.ifname("q0");
    netns.ip(&["link", "add", &dev, "type", "veth", "peer", "name", &netns.ifname("q1")]);
    netns.ip(&["link", "set", &dev, "up"]);
    let path = PathBuf::from(format!("/run/netns/{}", netns.name));
    let (handle, _file) = netclaim::host::netlink::open_in_netns(&path).await.unwrap();
    let index = ifindex(&netns, &dev);

    // tbf at 500 Mbit/s, and at 40 Gbit/s (5 GB/s: beyond the 32-bit field, TCA_TBF_RATE64).
    for (rate, burst, limit) in
        [(62_500_000, 262_144, 3_125_000), (5_000_000_000, 1 << 22, 1 << 26)]
    {
        let tbf = Tbf { rate, burst, limit };
        qdisc::replace_root(&handle, index, &RootQdisc::Tbf(tbf)).await.unwrap();
        let root = qdisc::root(&handle, index).await.unwrap().unwrap();
        assert_eq!((root.kind.as_str(), root.handle >> 16), ("tbf", 0x4e43));
        let dump = Tbf::parse(&root.options).unwrap();
        assert_eq!((dump.rate, dump.limit), (rate, limit));
        // The kernel keeps the bucket as 64 ns ticks: one tick's bytes of rounding.
        let tick_bytes = rate / 15_625_000 + 1;
        assert!(dump.burst().abs_diff(u64::from(burst)) <= tick_bytes, "burst {}", dump.burst());
        let tc = tc_root(&netns, &dev);
        assert_eq!(tc["kind"], "tbf");
        assert_eq!(tc["handle"], "4e43:");
        assert_eq!(tc["options"]["rate"].as_u64(), Some(rate), "tc reads the rate: {tc}");
        let tc_burst = tc["options"]["burst"].as_u64().unwrap();
        // iproute2 converts ticks through a floating-point tick length and truncates (it
        // prints 65531 for a 64k bucket): a few ticks' bytes of its own rounding.
        let tc_slack = u64::from(burst) / 1000 + tick_bytes;
        assert!(tc_burst.abs_diff(u64::from(burst)) <= tc_slack, "tc burst {tc_burst}");
    }

    // htb: the qdisc and its one class 4e43:1.
    let class = HtbClass {
        rate: 25_000_000,
        ceil: 25_000_000,
        burst: 131_072,
        cburst: 131_072,
        quantum: 200_000,
        prio: 0,
    };
    let htb = RootQdisc::Htb {
        qdisc: HtbQdisc { default_class: 1, rate2quantum: 10, direct_qlen: Some(1000) },
        class,
    };
    qdisc::replace_root(&handle, index, &htb).await.unwrap();
    let root = qdisc::root(&handle, index).await.unwrap().unwrap();
    let glob = HtbQdisc::parse(&root.options).unwrap();
    assert_eq!((glob.version >> 16, glob.default_class, glob.direct_qlen), (3, 1, Some(1000)));
    let classes = qdisc::classes(&handle, index).await.unwrap();
    let ours = classes.iter().find(|c| c.handle == 0x4e43_0001).expect("class 4e43:1");
    let dump = HtbClass::parse(&ours.options).unwrap();
    assert_eq!(
        (dump.rate, dump.ceil, dump.quantum, dump.level),
        (25_000_000, 25_000_000, 200_000, 0)
    );
    assert!(dump.burst().abs_diff(131_072) <= 2, "burst {}", dump.burst());
    // iproute2 6.1 prints classes as text only (`-j` is ignored for `class show`).
    let out = netns.exec("tc", &["class", "show", "dev", &dev]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("class htb 4e43:1 root"), "{text}");
    assert!(text.contains("rate 200Mbit ceil 200Mbit"), "tc reads the rates: {text}");
    assert_eq!(tc_root(&netns, &dev)["options"]["default"], "0x1");

    // fq with a horizon, or its refusal.
    let fq = Fq {
        horizon_us: Some(2_000_000),
        horizon_drop: Some(true),
        flow_plimit: Some(500),
        ..Fq::default()
    };
    let has_fq = match qdisc::replace_root(&handle, index, &RootQdisc::Fq(fq)).await {
        Ok(()) => {
            let root = qdisc::root(&handle, index).await.unwrap().unwrap();
            let dump = Fq::parse(&root.options);
            assert_eq!(
                (dump.horizon_us, dump.horizon_drop, dump.flow_plimit),
                (Some(2_000_000), Some(true), Some(500))
            );
            let tc = tc_root(&netns, &dev);
            assert_eq!(
                (tc["kind"].as_str(), tc["options"]["flow_limit"].as_u64()),
                (Some("fq"), Some(500)),
                "{tc}"
            );
            assert!(root.xstats.is_some(), "fq reports its xstats");
            true
        }
        Err(err) => {
            assert_eq!(err.errno(), Some(2), "a kernel without sch_fq answers ENOENT: {err}");
            // Ours of the other kind went first (the kernel refuses a change of kind under
            // one handle): nothing of ours is left, the default qdisc is back.
            assert_ne!(tc_root(&netns, &dev)["handle"], "4e43:", "nothing of ours is left");
            false
        }
    };
    if let Some(expected) = fq_expected {
        assert_eq!(has_fq, expected, "sch_fq on this kernel");
    }

    let tbf = Tbf { rate: 1_000_000, burst: 131_072, limit: 262_144 };
    qdisc::replace_root(&handle, index, &RootQdisc::Tbf(tbf)).await.unwrap();
    assert_eq!(tc_root(&netns, &dev)["kind"], "tbf");
    assert!(qdisc::delete_root(&handle, index).await.unwrap(), "ours is deleted");
    assert!(!qdisc::delete_root(&handle, index).await.unwrap(), "nothing of ours is left");
    assert_ne!(tc_root(&netns, &dev)["handle"], "4e43:");
    // Someone else's root (handle 1:) is never deleted.
    run(
        "ip",
        &[
            "netns",
            "exec",
            &netns.name,
            "tc",
            "qdisc",
            "add",
            "dev",
            &dev,
            "root",
            "handle",
            "1:",
            "tbf",
            "rate",
            "1mbit",
            "burst",
            "32k",
            "limit",
            "64k",
        ],
    );
    assert!(!qdisc::delete_root(&handle, index).await.unwrap());
    assert_eq!(tc_root(&netns, &dev)["handle"], "1:");
}

/// `achieved / asked` within −10 %/+5 % (DESIGN §10), with the figures in the message.
pub fn assert_within_ceiling(achieved: f64, asked: BitsPerSecond) {
    #[allow(clippy::cast_precision_loss, reason = "a rate, compared within percents")]
    let ratio = achieved / asked.get() as f64;
    assert!(
        (0.90..=1.05).contains(&ratio),
        "ceiling {asked}: achieved {:.1} Mbit/s ({:.1} % of it)",
        achieved / 1e6,
        ratio * 100.0
    );
}
