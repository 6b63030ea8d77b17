//! The bandwidth ceiling checks of the counting programs (issue 35), shared by the host's root
//! tier (`tests/netns/stats_bpf_ceilings.rs`) and the VM suite (`tests/vm/vm_stats.rs`, 6.1
//! clsact and 6.12 tcx, where `fq` exists):
//!
//! - the programs' own logic, with `BPF_PROG_TEST_RUN` on a copy of the object loaded here:
//!   the departure times the egress program stamps (exactly one frame's time at the rate
//!   apart, drops beyond the horizon), the ingress policer's burst;
//! - real traffic through a veth pair with the daemon's API (`CounterPins::set_pacing`): a
//!   UDP flood into the pod above the police rate is dropped down to the rate, and counted; a
//!   flood out of the pod gets future departure times (and horizon drops), counted; where the
//!   kernel has `fq`, an `fq` qdisc on the pod end holds the packets until their time;
//! - what a ceiling's `tbf` dropped and held back, in the stats the stats service reads;
//! - the ceiling as the node daemon wires it (`daemon_gate_holds_a_pod_to_its_ceiling`):
//!   the real daemon's CreateContainer gate, its choice of mechanism and its programs.

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use netclaim::host::bpf::{CounterPins, HookKind, ceiling_values, counters_object};
use netclaim::model::stats::InterfaceStats;
use netclaim::stats::{Ceilings, CounterPort, PacingPort};

use super::counters::{Bpffs, Pair};

/// `TC_ACT_UNSPEC` and `TC_ACT_SHOT` of `linux/pkt_cls.h`.
const TC_ACT_UNSPEC: u32 = u32::MAX;
const TC_ACT_SHOT: u32 = 2;

/// `offsetof(struct __sk_buff, tstamp)` and `sizeof(struct __sk_buff)` (uapi, stable).
const SKB_TSTAMP: usize = 152;
const SKB_SIZE: usize = 192;

/// An Ethernet + IPv4 + UDP frame of `len` bytes (10.78.0.2 → 10.78.0.1).
fn udp_frame(len: usize) -> Vec<u8> {
    let mut frame = vec![0u8; len];
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    frame[14] = 0x45;
    let ip_len = u16::try_from(len - 14).unwrap();
    frame[16..18].copy_from_slice(&ip_len.to_be_bytes());
    frame[22] = 64;
    frame[23] = 17;
    frame[26..30].copy_from_slice(&[10, 78, 0, 2]);
    frame[30..34].copy_from_slice(&[10, 78, 0, 1]);
    frame[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
    frame
}

/// A private copy of the object with both programs loaded and `ceilings` written the way
/// the daemon writes them.
fn loaded(ceilings: Ceilings) -> aya::Ebpf {
    let mut ebpf = aya::Ebpf::load(counters_object()).unwrap();
    for name in ["netclaim_rx", "netclaim_tx"] {
        let program: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
        program.load().unwrap();
    }
    let values = ceiling_values(ceilings).unwrap();
    let mut map: aya::maps::Array<_, [u64; 5]> =
        aya::maps::Array::try_from(ebpf.map_mut("CEILINGS").unwrap()).unwrap();
    for (slot, value) in (0u32..).zip(values) {
        map.set(slot, value, 0).unwrap();
    }
    ebpf
}

/// Runs `program` once on `frame` with `skb->tstamp` = `tstamp`: its verdict and the stamp
/// it left.
fn run_once(ebpf: &aya::Ebpf, program: &str, frame: &[u8], tstamp: u64) -> (u32, u64) {
    let program: &SchedClassifier = ebpf.program(program).unwrap().try_into().unwrap();
    let mut ctx_in = [0u8; SKB_SIZE];
    ctx_in[SKB_TSTAMP..SKB_TSTAMP + 8].copy_from_slice(&tstamp.to_ne_bytes());
    let mut ctx_out = [0u8; SKB_SIZE];
    let result = program
        .test_run(TestRunOptions {
            data_in: Some(frame),
            ctx_in: Some(&ctx_in),
            ctx_out: Some(&mut ctx_out),
            ..TestRunOptions::new()
        })
        .unwrap();
    let stamp = u64::from_ne_bytes(ctx_out[SKB_TSTAMP..SKB_TSTAMP + 8].try_into().unwrap());
    (result.return_value, stamp)
}

/// `[ceiling_drops, delayed]` of one slot of the object's counters, summed over CPUs.
fn ceiling_counts(ebpf: &aya::Ebpf, slot: u32) -> [u64; 2] {
    let map: aya::maps::PerCpuArray<_, [u64; 8]> =
        aya::maps::PerCpuArray::try_from(ebpf.map("COUNTERS").unwrap()).unwrap();
    map.get(&slot, 0).unwrap().iter().fold([0, 0], |acc, c| [acc[0] + c[6], acc[1] + c[7]])
}

/// The egress program at 8 kbit/s (1 ms a byte): 1000-byte frames sent back to back get
/// departure times exactly one second apart from the first (which leaves now), until the
/// next one would be more than the 2 s horizon away: that one is dropped and counted. A
/// stamp already later than the slot is kept. Without a ceiling the stamp is left alone.
pub fn egress_program_stamps_departures_at_the_rate() {
    let frame = udp_frame(1000);
    let ebpf = loaded(Ceilings { egress_bps: Some(8_000), ingress_police_bps: None });
    let mut stamps = Vec::new();
    for _ in 0..3 {
        let (verdict, stamp) = run_once(&ebpf, "netclaim_tx", &frame, 0);
        assert_eq!(verdict, TC_ACT_UNSPEC, "paced, not dropped");
        stamps.push(stamp);
    }
    assert!(stamps[0] > 0, "the first frame is stamped with now");
    assert_eq!(stamps[1] - stamps[0], 1_000_000_000, "one frame's time at the rate: {stamps:?}");
    assert_eq!(stamps[2] - stamps[1], 1_000_000_000, "{stamps:?}");
    // The fourth would leave 3 s after the first: beyond the horizon (2 s) unless a second
    // passed since, which three runs of a few microseconds cannot take.
    let (verdict, _) = run_once(&ebpf, "netclaim_tx", &frame, 0);
    assert_eq!(verdict, TC_ACT_SHOT, "beyond the horizon");
    assert_eq!(ceiling_counts(&ebpf, 1), [1, 2], "one drop; the 2nd and 3rd delayed");

    // 1000 s ahead: later than any slot even where loading the next copies takes seconds (TCG).
    let later = stamps[2] + 1_000_000_000_000;
    let unpaced = loaded(Ceilings::default());
    let (verdict, stamp) = run_once(&unpaced, "netclaim_tx", &frame, later);
    assert_eq!((verdict, stamp), (TC_ACT_UNSPEC, later), "no ceiling: the stamp is untouched");
    let fresh = loaded(Ceilings { egress_bps: Some(1_000_000_000), ingress_police_bps: None });
    let (_, stamp) = run_once(&fresh, "netclaim_tx", &frame, later);
    assert_eq!(stamp, later, "a later stamp (SO_TXTIME, TCP pacing) is kept");
}

/// The policer at 8 kbit/s lets a burst of 64 KiB of frames through (its floor: 65.5 s of
/// traffic at that rate), then drops: 98-byte frames, 1000 runs, and at most one more frame
/// for every 98 ms the runs took.
pub fn ingress_program_polices_above_the_burst() {
    let frame = udp_frame(98);
    let ebpf = loaded(Ceilings { egress_bps: None, ingress_police_bps: Some(8_000) });
    let started = Instant::now();
    let mut passed = 0u64;
    for _ in 0..1000 {
        let (verdict, stamp) = run_once(&ebpf, "netclaim_rx", &frame, 0);
        assert_eq!(stamp, 0, "ingress is never stamped");
        if verdict == TC_ACT_UNSPEC {
            passed += 1;
        } else {
            assert_eq!(verdict, TC_ACT_SHOT);
        }
    }
    let refill = u64::try_from(started.elapsed().as_millis() / 98).unwrap();
    // GCRA: a frame conforms while the bucket's time is at most 65 536 ms ahead; each adds 98.
    let burst = 65_536 / 98 + 1;
    assert!(passed >= burst && passed <= burst + refill + 1, "passed {passed}, burst {burst}");
    assert_eq!(ceiling_counts(&ebpf, 0), [1000 - passed, 0], "every drop counted");
}

/// A UDP socket made inside the netns at `path`.
fn socket_in(path: &Path, bind: SocketAddrV4) -> UdpSocket {
    let path = path.to_owned();
    std::thread::spawn(move || {
        let netns = std::fs::File::open(&path).unwrap();
        #[allow(clippy::disallowed_methods, reason = "a throwaway thread of the test's netns")]
        nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        UdpSocket::bind(bind).unwrap()
    })
    .join()
    .unwrap()
}

fn peer_path(pair: &Pair) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/run/netns/{}", pair.peer.name))
}

async fn read(pins: &CounterPins, pair: &Pair) -> InterfaceStats {
    let stats =
        pins.read(&pair.pod_path(), "pod-uid", std::slice::from_ref(&pair.pod_if)).await.unwrap();
    stats[0].expect("counters are hooked")
}

/// Drains `socket` (non-blocking): the datagrams waiting.
fn drain(socket: &UdpSocket) -> u64 {
    let mut buf = [0u8; 2048];
    let mut count = 0;
    while socket.recv_from(&mut buf).is_ok() {
        count += 1;
    }
    count
}

/// Drains `socket` until `expected` datagrams came (or 10 s passed): their number. The
/// receiving side may run in a softirq after the sender's call returned.
fn receive(socket: &UdpSocket, expected: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut received = drain(socket);
    while received < expected && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        received += drain(socket);
    }
    received
}

/// 1000-byte datagrams (1042-byte frames) from `from` to `to`.
fn flood(from: &UdpSocket, to: Ipv4Addr, count: u32) {
    let payload = [0u8; 1000];
    for _ in 0..count {
        from.send_to(&payload, SocketAddrV4::new(to, 9)).unwrap();
    }
}

/// A permanent neighbour entry for `ip` on `interface` of `netns`: the flood needs no ARP.
fn neighbour(pair: &Pair, from_pod: bool) {
    let (netns, other, interface, other_if, ip) = if from_pod {
        (&pair.pod, &pair.peer, &pair.pod_if, &pair.peer_if, "10.78.0.1")
    } else {
        (&pair.peer, &pair.pod, &pair.peer_if, &pair.pod_if, "10.78.0.2")
    };
    let out = other.ip(&["-j", "link", "show", other_if]);
    let links: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mac = links[0]["address"].as_str().unwrap().to_owned();
    netns.ip(&["neigh", "replace", ip, "lladdr", &mac, "dev", interface, "nud", "permanent"]);
}

/// The police ceiling through the daemon's API on a real veth: without a ceiling a flood of
/// 400 datagrams into the pod all arrive; at 80 kbit/s (its burst: 64 KiB of frames, 62
/// of them) the policer drops the rest of an instant flood, the drops are counted, and what
/// arrives is what passed; cleared, everything passes again. Set before the stats service
/// hooks: that hook keeps the programs and the ceiling.
pub async fn police_drops_a_flood_above_the_rate(kind: HookKind) {
    let bpffs = Bpffs::mount();
    let pair = Pair::new(1500);
    let pins = CounterPins::new(bpffs.path(), "node-a", kind);
    let police = Ceilings { egress_bps: None, ingress_police_bps: Some(80_000) };
    PacingPort::set_pacing(&pins, &pair.pod_path(), "pod-uid", &pair.pod_if, police).await.unwrap();
    // The stats service's hook of the same interface afterwards: kept, not replaced.
    pins.hook(&pair.pod_path(), "pod-uid", &pair.pod_if).await.unwrap();
    assert_eq!(
        pins.ceilings("pod-uid", &pair.pod_if)
            .unwrap()
            .unwrap()
            .ingress_police_bps
            .map(|b| b / 1000),
        Some(80)
    );
    if kind == HookKind::Clsact {
        assert_eq!(
            pair.filters("ingress").lines().filter(|l| l.contains("netclaim_rx")).count(),
            1,
            "hooked once"
        );
    }
    neighbour(&pair, false);
    let receiver = socket_in(&pair.pod_path(), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9));
    receiver.set_nonblocking(true).unwrap();
    let sender = socket_in(&peer_path(&pair), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

    let before = read(&pins, &pair).await;
    let started = Instant::now();
    flood(&sender, Ipv4Addr::new(10, 78, 0, 2), 400);
    let elapsed = started.elapsed();
    let after = read(&pins, &pair).await;
    let seen = after.rx.udp - before.rx.udp;
    let passed = seen - (after.ceiling.rx_dropped - before.ceiling.rx_dropped);
    assert_eq!(seen, 400, "the ingress hook saw the flood: {after:?}");
    // 64 KiB / 1042 bytes = 62.9: 63 frames fit the bucket, one more per 104 ms elapsed.
    let refill = u64::try_from(elapsed.as_millis() / 104).unwrap();
    assert!(passed >= 63 && passed <= 64 + refill, "passed {passed} in {elapsed:?}");
    assert_eq!(receive(&receiver, passed), passed, "what was not policed arrived");
    assert_eq!(after.ceiling.tx_dropped + after.ceiling.tx_delayed, 0, "egress has no ceiling");

    PacingPort::set_pacing(&pins, &pair.pod_path(), "pod-uid", &pair.pod_if, Ceilings::default())
        .await
        .unwrap();
    // 50: what the receiving socket's default buffer (208 KiB) holds of 1000-byte datagrams.
    flood(&sender, Ipv4Addr::new(10, 78, 0, 2), 50);
    let cleared = read(&pins, &pair).await;
    assert_eq!(cleared.ceiling.rx_dropped, after.ceiling.rx_dropped, "cleared: no more drops");
    assert_eq!(receive(&receiver, 50), 50);
    pins.unhook(Some(&pair.pod_path()), "pod-uid", &pair.pod_if).await.unwrap();
    assert!(!pins.dir("pod-uid", &pair.pod_if).exists(), "pins removed with the counters");
}

/// Egress pacing through the daemon's API on a real veth, 80 kbit/s (104 ms a frame): an
/// instant flood of 400 datagrams out of the pod gets departure times one frame apart; those
/// beyond the 2 s horizon (all but 20 or so) are dropped by the program and counted, the
/// others counted as delayed (all but the first). With `fq` on the pod end (`with_fq`: the
/// VM kernels) the peer receives them no faster than the rate: at any moment at most one
/// frame per 104 ms since the flood began, and in the end every one that was not dropped.
/// Without `fq` (this host's kernel has none) the stamps are ignored and all arrive at once.
pub async fn pacing_stamps_a_flood_out_of_the_pod(kind: HookKind, with_fq: bool) {
    let bpffs = Bpffs::mount();
    let pair = Pair::new(1500);
    if with_fq {
        pair.pod.exec("tc", &["qdisc", "replace", "dev", &pair.pod_if, "root", "fq"]);
        let qdiscs = pair.pod.exec("tc", &["qdisc", "show", "dev", &pair.pod_if]);
        assert!(String::from_utf8_lossy(&qdiscs.stdout).contains("qdisc fq"), "{qdiscs:?}");
    }
    let pins = CounterPins::new(bpffs.path(), "node-a", kind);
    pins.hook(&pair.pod_path(), "pod-uid", &pair.pod_if).await.unwrap();
    let pace = Ceilings { egress_bps: Some(80_000), ingress_police_bps: None };
    PacingPort::set_pacing(&pins, &pair.pod_path(), "pod-uid", &pair.pod_if, pace).await.unwrap();
    neighbour(&pair, true);
    let receiver = socket_in(&peer_path(&pair), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9));
    receiver.set_nonblocking(true).unwrap();
    let sender = socket_in(&pair.pod_path(), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));

    let started = Instant::now();
    flood(&sender, Ipv4Addr::new(10, 78, 0, 1), 400);
    let early = drain(&receiver);
    let early_bound = 2 + u64::try_from(started.elapsed().as_millis() / 104).unwrap();
    let stats = read(&pins, &pair).await;
    assert_eq!(stats.tx.udp, 400, "{stats:?}");
    let admitted = 400 - stats.ceiling.tx_dropped;
    // 2 s horizon / 104 ms: the first leaves now, about 19 more within the horizon.
    assert!((15..=30).contains(&admitted), "admitted {admitted}: {stats:?}");
    // All but the first are held back; a packet of the interface's own (ARP, IPv6 neighbour
    // discovery) may have taken the first free slot, and is paced too, so one more or all.
    assert!(
        (admitted - 1..=admitted + 1).contains(&stats.ceiling.tx_delayed),
        "all but the first held back: {stats:?}"
    );
    if with_fq {
        assert!(early <= early_bound, "fq released {early} of {admitted} too soon");
        let mut arrived = early;
        let deadline = Instant::now() + Duration::from_secs(20);
        while arrived < admitted && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
            arrived += drain(&receiver);
            let bound = 2 + u64::try_from(started.elapsed().as_millis() / 104).unwrap();
            assert!(arrived <= bound, "{arrived} arrived within {:?}", started.elapsed());
        }
        assert_eq!(arrived, admitted, "fq released every paced frame in the end");
    } else {
        let arrived = early + receive(&receiver, admitted - early);
        assert_eq!(arrived, admitted, "no fq: the stamps are ignored, all arrive");
    }
    pins.unhook(Some(&pair.pod_path()), "pod-uid", &pair.pod_if).await.unwrap();
}

/// The queue of a ceiling's `tbf` in the stats the service reads (`CounterPort::read`): a
/// pod end held to 1 Mbit/s (bucket 128 KiB, queue 256 KiB) gets an instant flood out of the
/// pod from 16 non-blocking sockets (each stops at a full send buffer, ~100 datagrams): far
/// more than the bucket and the queue hold, so `tbf` drops (the kernel swallows `ENOBUFS`
/// for UDP without `IP_RECVERR`) and holds packets for want of tokens. The drops read are
/// the kernel's own (`tc -s`), and the program counted every datagram sent before the qdisc.
pub async fn tbf_drops_and_overlimits_reach_the_stats(kind: HookKind) {
    use netclaim::attach::bandwidth::{CeilingMechanism, CeilingPort, InterfaceCeiling};
    use netclaim::host::qdisc_ceiling::HostCeilings;
    use netclaim::model::bandwidth::{BitsPerSecond, IngressPolicy};

    let bpffs = Bpffs::mount();
    let pair = Pair::new(1500);
    let pins = CounterPins::new(bpffs.path(), "node-a", kind);
    pins.hook(&pair.pod_path(), "pod-uid", &pair.pod_if).await.unwrap();
    let ceiling = InterfaceCeiling {
        interface: pair.pod_if.clone(),
        rate: BitsPerSecond::from_mbps(1),
        mechanism: CeilingMechanism::Tbf,
        ingress: IngressPolicy::None,
    };
    HostCeilings::<CounterPins>::new(None)
        .apply(&pair.pod_path(), "pod-uid", &ceiling)
        .await
        .unwrap();
    assert!(read(&pins, &pair).await.ceiling.qdisc.is_zero(), "nothing dropped yet");
    neighbour(&pair, true);
    let payload = [0u8; 1000];
    let mut sent = 0u64;
    let started = Instant::now();
    for _ in 0..16 {
        let socket = socket_in(&pair.pod_path(), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        socket.set_nonblocking(true).unwrap();
        for _ in 0..200 {
            match socket.send_to(&payload, SocketAddrV4::new(Ipv4Addr::new(10, 78, 0, 1), 9)) {
                Ok(_) => sent += 1,
                Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(err) => panic!("sending: {err}"),
            }
        }
    }
    // One 1042-byte frame's tokens come every 8.3 ms at 1 Mbit/s.
    let refill = u64::try_from(started.elapsed().as_millis() / 8).unwrap();
    let stats = read(&pins, &pair).await;
    let qdisc = stats.ceiling.qdisc;
    println!("sent {sent} in {:?}: {qdisc:?}", started.elapsed());
    assert_eq!(stats.tx.udp, sent, "the program counts before the qdisc: {stats:?}");
    assert!(qdisc.dropped > 0 && qdisc.overlimits > 0, "{sent} sent into 384 KiB: {qdisc:?}");
    // The bucket (128 KiB: 125.8 frames) and the queue (256 KiB: 251.6) take 377 or 378, and
    // one more for each refill meanwhile; the rest is dropped.
    let accepted = sent - qdisc.dropped;
    assert!((376..=379 + refill).contains(&accepted), "{sent} sent, refill {refill}: {qdisc:?}");
    let out = pair.pod.exec("tc", &["-s", "-j", "qdisc", "show", "dev", &pair.pod_if]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = all.as_array().unwrap().iter().find(|q| q["root"] == true).unwrap();
    assert_eq!((root["kind"].as_str(), root["handle"].as_str()), (Some("tbf"), Some("4e43:")));
    // Drops happen at enqueue only, all during the flood: tc reads the same number.
    assert_eq!(root["drops"].as_u64(), Some(qdisc.dropped), "tc: {root}");
    assert!(root["overlimits"].as_u64().unwrap() >= qdisc.overlimits, "tc: {root}");
    let in_status = serde_json::to_value(stats.to_status("now".to_owned())).unwrap();
    assert_eq!(in_status["ceiling"]["qdisc"]["dropped"].as_u64(), Some(qdisc.dropped));
    pins.unhook(Some(&pair.pod_path()), "pod-uid", &pair.pod_if).await.unwrap();
}

/// The ceiling as the node daemon wires it: the real daemon with its counters on a private
/// bpffs (so the CreateContainer gate has the programs), a macvlan claim with `stats: false`,
/// `bandwidth.limit: 100M` and `ingress: police`. The claim status says `expected` (edt-fq
/// where the kernel has `sch_fq`, tbf elsewhere), the gate puts that root qdisc (ours,
/// `4e43:`) on the pod's interface before the container starts, and the counting programs
/// are hooked by the gate (the stats service does not hook a `stats: false` interface) with
/// the police rate, and the EDT rate for edt-fq; once the pod stops, the programs' pins go.
pub fn daemon_gate_holds_a_pod_to_its_ceiling(
    expected: netclaim::attach::bandwidth::CeilingMechanism,
) {
    use netclaim::attach::bandwidth::CeilingMechanism;

    use super::daemon::{Node, PATIENCE, pod};
    use super::netns::Netns;

    let bpffs = Bpffs::mount();
    let node = Node::start();
    let bpffs_arg = format!("--bpffs={}", bpffs.path().display());
    let _daemon = node.start_daemon_with("node.log", &[&bpffs_arg]);
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "capped");
    let config = serde_json::json!({"mode": "macvlan", "stats": false,
        "ipam": {"pool": {"subnet": "10.77.0.0/24"}},
        "bandwidth": {"limit": "100M", "ingress": "police"}});
    let uid = node.allocated_claim_on("capped-net", &sandbox, &node.parent.clone(), config);
    let prepared = node.prepare("capped-net", &uid);
    assert_eq!(prepared.error, "", "{}", node.log("node.log"));
    let ran = node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox));
    assert!(ran.is_ok(), "{ran:?}\n{}", node.log("node.log"));
    let claim = node.wait_for_status("capped-net", "True", "NetworkReady", "node.log");
    let entry = &claim.status.as_ref().unwrap().devices.as_ref().unwrap()[0];
    assert_eq!(
        entry.data.as_ref().unwrap().0["bandwidth"],
        serde_json::json!({"ceiling": "100M", "source": "bandwidth.limit",
            "mechanism": expected.as_str(), "ingress": "police"})
    );
    let pins = CounterPins::new(bpffs.path(), "test-node", HookKind::Clsact);
    assert_eq!(pins.ceilings(&sandbox.uid, "net1").unwrap(), None, "nothing before the gate");

    let container = nri_rs::Container {
        id: "c1".into(),
        pod_sandbox_id: sandbox.id.clone(),
        name: "app".into(),
    };
    let created = node.runtime.block_on(node.nri().create_container(&sandbox, &container));
    assert!(created.is_ok(), "{created:?}\n{}", node.log("node.log"));
    let out = pod_netns.exec("tc", &["-j", "qdisc", "show", "dev", "net1"]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = all.as_array().unwrap().iter().find(|q| q["root"] == true).unwrap();
    let kind = if expected == CeilingMechanism::EdtFq { "fq" } else { "tbf" };
    assert_eq!((root["kind"].as_str(), root["handle"].as_str()), (Some(kind), Some("4e43:")));
    let ceilings = pins.ceilings(&sandbox.uid, "net1").unwrap().expect("the gate hooked them");
    let mbps = |bps: Option<u64>| bps.map(|b| (b + 500_000) / 1_000_000);
    assert_eq!(mbps(ceilings.ingress_police_bps), Some(100), "{ceilings:?}");
    let egress = (expected == CeilingMechanism::EdtFq).then_some(100);
    assert_eq!(mbps(ceilings.egress_bps), egress, "{ceilings:?}");
    assert!(pins.read_counters(&sandbox.uid, "net1").unwrap().is_some(), "the counters exist");

    node.runtime.block_on(node.nri().stop_pod_sandbox(&sandbox)).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while pins.dir(&sandbox.uid, "net1").exists() {
        assert!(Instant::now() < deadline, "the ceiling's pins outlived the interface");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The daemon without its programs (no bpffs: `--bpffs=`, as the root tests' daemons run):
/// a claim asking `bandwidth.ingress: police` is refused at prepare naming the field and why,
/// and a plain ceiling is still held by tbf at the gate.
pub fn daemon_without_programs_refuses_police_and_uses_tbf() {
    use super::daemon::{Node, pod};
    use super::netns::Netns;

    let node = Node::start();
    let _daemon = node.start_daemon("node.log");
    let pod_netns = Netns::new();
    let sandbox = pod(&pod_netns, "capped");
    let parent = node.parent.clone();
    let policed = serde_json::json!({"mode": "macvlan", "ipam": {"pool": {"subnet": "10.77.0.0/24"}},
        "bandwidth": {"limit": "100M", "ingress": "police"}});
    let uid = node.allocated_claim_on("policed-net", &sandbox, &parent, policed);
    let refused = node.prepare("policed-net", &uid);
    assert!(
        refused.error.contains("bandwidth.ingress: police: this node cannot police ingress")
            && refused.error.contains("no BPF file system"),
        "{}",
        refused.error
    );
    let capped = serde_json::json!({"mode": "macvlan", "ipam": {"pool": {"subnet": "10.77.1.0/24"}},
        "bandwidth": {"limit": "100M"}});
    let uid = node.allocated_claim_on("capped-net", &sandbox, &parent, capped);
    assert_eq!(node.prepare("capped-net", &uid).error, "", "{}", node.log("node.log"));
    let ran = node.runtime.block_on(node.nri().run_pod_sandbox(&sandbox));
    assert!(ran.is_ok(), "{ran:?}\n{}", node.log("node.log"));
    let claim = node.wait_for_status("capped-net", "True", "NetworkReady", "node.log");
    let entry = &claim.status.as_ref().unwrap().devices.as_ref().unwrap()[0];
    assert_eq!(entry.data.as_ref().unwrap().0["bandwidth"]["mechanism"], "tbf");
    let container = nri_rs::Container {
        id: "c1".into(),
        pod_sandbox_id: sandbox.id.clone(),
        name: "app".into(),
    };
    let created = node.runtime.block_on(node.nri().create_container(&sandbox, &container));
    assert!(created.is_ok(), "{created:?}\n{}", node.log("node.log"));
    let out = pod_netns.exec("tc", &["-j", "qdisc", "show", "dev", "net1"]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let root = all.as_array().unwrap().iter().find(|q| q["root"] == true).unwrap();
    assert_eq!((root["kind"].as_str(), root["handle"].as_str()), (Some("tbf"), Some("4e43:")));
}
