//! What the traffic counters cost a packet (DESIGN §10, issue 15), root only. Two figures,
//! in one run:
//!
//! - `BPF_PROG_TEST_RUN` of the egress program on an ICMP echo frame, 1e6 repeats per
//!   sample: the program's own time per packet (ns), the kernel's test-run harness included.
//! - The packet rate of 64-byte UDP datagrams sent from one throwaway netns to another
//!   through a veth pair, in rounds that rotate the variants: no program, the counters, the
//!   counters with bandwidth ceilings that never limit (100 Gbit/s egress pacing and ingress
//!   policing: the ceiling's code runs on every packet), each with clsact and with tcx, all
//!   hooked on the sender's end (both directions, as on a pod interface), with the per-round
//!   ratio to no program: the loss each causes (DESIGN §10: ≤ 3 %). The interface keeps its
//!   qdisc (veth's noqueue) throughout: `fq`, which a real ceiling adds, is the ceiling's own
//!   price. `NETCLAIM_BENCH_BEFORE_OBJECT=<file.o>` adds another build of the object (the
//!   counters before a change) to the same rounds.
//!
//! Without `--bench` (`cargo test --benches`, as `make test` runs it) every benchmark runs
//! once and the rounds shrink; under CI, missing root fails it instead of skipping.

#![allow(missing_docs, reason = "a bench binary has no public API")]
#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]
#![allow(
    clippy::disallowed_methods,
    reason = "the bench builds its own namespaces and enters them on threads of its own"
)]

use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aya::programs::{SchedClassifier, TestRun, TestRunOptions};
use criterion::{Criterion, SamplingMode};
use netclaim::host::bpf::{CounterPins, HookKind, ceiling_values, counters_object};
use netclaim::stats::Ceilings;

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(2) == Some("0"))
}

/// Under CI a bench that cannot run fails instead of skipping.
fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| !value.is_empty() && value != "false")
}

fn ip(args: &[&str]) {
    let status = Command::new("ip").args(args).status().expect("running ip");
    assert!(status.success(), "ip {args:?} failed");
}

/// Two netns joined by a veth pair (`a` 10.79.0.1 → `b` 10.79.0.2), a private bpffs; all
/// removed on drop.
struct Topology {
    prefix: String,
    bpffs: tempfile::TempDir,
}

impl Topology {
    fn new() -> Self {
        let prefix = format!("ncb{:05x}", std::process::id() & 0xf_ffff);
        let (a, b) = (format!("{prefix}-a"), format!("{prefix}-b"));
        ip(&["netns", "add", &a]);
        ip(&["netns", "add", &b]);
        let (ea, eb) = (format!("{prefix}a"), format!("{prefix}b"));
        ip(&["-n", &a, "link", "add", &ea, "type", "veth", "peer", "name", &eb]);
        ip(&["-n", &a, "link", "set", &eb, "netns", &b]);
        ip(&["-n", &a, "addr", "add", "10.79.0.1/24", "dev", &ea]);
        ip(&["-n", &b, "addr", "add", "10.79.0.2/24", "dev", &eb]);
        ip(&["-n", &a, "link", "set", &ea, "up"]);
        ip(&["-n", &b, "link", "set", &eb, "up"]);
        let bpffs = tempfile::tempdir().unwrap();
        let status =
            Command::new("mount").args(["-t", "bpf", "bpf"]).arg(bpffs.path()).status().unwrap();
        assert!(status.success(), "mounting a private bpffs");
        Self { prefix, bpffs }
    }

    fn netns(&self, side: &str) -> PathBuf {
        PathBuf::from(format!("/run/netns/{}-{side}", self.prefix))
    }

    fn sender_if(&self) -> String {
        format!("{}a", self.prefix)
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        let _ignored = Command::new("umount").arg("-l").arg(self.bpffs.path()).status();
        for side in ["a", "b"] {
            let _ignored = Command::new("ip")
                .args(["netns", "del", &format!("{}-{side}", self.prefix)])
                .status();
        }
    }
}

/// A UDP socket created inside the netns at `path` (a socket stays in the netns it was made
/// in, whichever thread uses it later).
fn socket_in(path: &Path, bind: SocketAddrV4) -> UdpSocket {
    let path = path.to_owned();
    std::thread::spawn(move || {
        let netns = std::fs::File::open(&path).unwrap();
        nix::sched::setns(netns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        UdpSocket::bind(bind).unwrap()
    })
    .join()
    .unwrap()
}

/// An Ethernet + IPv4 + ICMP echo request frame of 98 bytes (what `ping` sends).
fn echo_frame() -> Vec<u8> {
    let mut frame = vec![0u8; 98];
    frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    frame[14] = 0x45;
    frame[16..18].copy_from_slice(&84u16.to_be_bytes());
    frame[22] = 64;
    frame[23] = 1; // ICMP
    frame[26..30].copy_from_slice(&[10, 79, 0, 1]);
    frame[30..34].copy_from_slice(&[10, 79, 0, 2]);
    frame[34] = 8; // echo request
    frame
}

/// Sends `count` datagrams of 64 bytes; the time it took.
fn blast(sender: &UdpSocket, count: u32) -> Duration {
    let payload = [0u8; 64];
    let target = SocketAddrV4::new(Ipv4Addr::new(10, 79, 0, 2), 9);
    let started = Instant::now();
    for _ in 0..count {
        sender.send_to(&payload, target).unwrap();
    }
    started.elapsed()
}

/// The calling thread's time on a CPU so far (`/proc/thread-self/schedstat`, ns): what a
/// batch cost the sender (the veth transmit and, in its softirq, the receiving side included)
/// without the time other processes of a loaded machine held the CPU.
fn thread_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
    Duration::from_nanos(stat.split_whitespace().next().unwrap().parse().unwrap())
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = !args.iter().any(|a| a == "--bench") || args.iter().any(|a| a == "--test");
    if !is_root() {
        assert!(!under_ci(), "benches/stats needs root, and CI runs every bench");
        println!("SKIPPED: benches/stats needs root (BPF programs, network namespaces)");
        return;
    }
    let topology = Topology::new();
    let receiver = socket_in(&topology.netns("b"), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 9));
    receiver.set_nonblocking(true).unwrap();
    let sender = socket_in(&topology.netns("a"), SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
    let drain = || {
        let mut buf = [0u8; 128];
        while receiver.recv_from(&mut buf).is_ok() {}
    };

    let mut ebpf = aya::Ebpf::load(counters_object()).unwrap();
    let program: &mut SchedClassifier =
        ebpf.program_mut("netclaim_tx").unwrap().try_into().unwrap();
    program.load().unwrap();
    let frame = echo_frame();
    let repeat: u32 = if smoke { 1000 } else { 1_000_000 };
    let test_run = |program: &SchedClassifier| {
        let result = program
            .test_run(TestRunOptions { data_in: Some(&frame), repeat, ..TestRunOptions::new() })
            .unwrap();
        // The kernel reports the mean duration of one repeat.
        result.duration
    };

    let batch: u32 = if smoke { 1000 } else { 20_000 };
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let mut group = criterion.benchmark_group("counters");
    group.sampling_mode(SamplingMode::Flat);
    group.bench_function("prog-test-run-per-packet", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| test_run(program)).sum());
    });
    group.finish();
    criterion.final_summary();
    let without_ceiling = test_run(program);
    // The same program with an egress ceiling far above any rate (100 Gbit/s): the pacing
    // path runs (clock, reservation, stamp) and never holds a packet back.
    {
        let mut ceilings: aya::maps::Array<_, [u64; 5]> =
            aya::maps::Array::try_from(ebpf.map_mut("CEILINGS").unwrap()).unwrap();
        let [_, tx] =
            ceiling_values(Ceilings { egress_bps: Some(UNLIMITING_BPS), ingress_police_bps: None })
                .unwrap();
        ceilings.set(1, tx, 0).unwrap();
    }
    let program: &mut SchedClassifier =
        ebpf.program_mut("netclaim_tx").unwrap().try_into().unwrap();
    let with_ceiling = test_run(program);
    println!(
        "BPF_PROG_TEST_RUN of the egress program, {repeat} repeats: {:.1} ns per packet \
         without a ceiling, {:.1} ns with one",
        without_ceiling.as_secs_f64() * 1e9,
        with_ceiling.as_secs_f64() * 1e9
    );

    let rounds = if smoke { 2 } else { 60 };
    let before =
        std::env::var_os("NETCLAIM_BENCH_BEFORE_OBJECT").map(|path| std::fs::read(path).unwrap());
    interleaved_rounds(
        &Sides { topology: &topology, sender: &sender, drain: &drain },
        rounds,
        batch,
        before.as_deref(),
    );
    rtnl_stall(&topology, if smoke { 1 } else { 10 });
}

/// A pacing rate no veth reaches: the ceiling's code runs on every packet, none waits.
const UNLIMITING_BPS: u64 = 100_000_000_000;

/// What hooking counters costs the attaches of other pods: macvlan creations (what an attach
/// does under RTNL) timed while another thread hooks and unhooks counters in a loop, with tcx
/// (whose link create and release wait for an RCU grace period while holding RTNL) and with
/// clsact, against none; rounds rotate the three.
fn rtnl_stall(topology: &Topology, rounds: usize) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (handle, _netns) =
        runtime.block_on(netclaim::host::netlink::open_in_netns(&topology.netns("b"))).unwrap();
    let parent = runtime
        .block_on(async {
            use futures::TryStreamExt as _;
            handle
                .link()
                .get()
                .match_name(format!("{}b", topology.prefix))
                .execute()
                .try_next()
                .await
        })
        .unwrap()
        .unwrap()
        .header
        .index;
    let create = |name: &str| {
        let started = Instant::now();
        runtime
            .block_on(
                handle
                    .link()
                    .add(
                        rtnetlink::LinkMacVlan::new(
                            name,
                            parent,
                            netlink_packet_route::link::MacVlanMode::Bridge,
                        )
                        .build(),
                    )
                    .execute(),
            )
            .unwrap();
        started.elapsed()
    };
    let delete = |name: &str| {
        let _ignored = Command::new("ip")
            .args(["-n", &format!("{}-b", topology.prefix), "link", "del", name])
            .status();
    };
    let kinds = [None, Some(HookKind::Tcx), Some(HookKind::Clsact)];
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); kinds.len()];
    for round in 0..rounds {
        for turn in 0..kinds.len() {
            let index = (round + turn) % kinds.len();
            let stop = Arc::new(AtomicBool::new(false));
            let hooker = kinds[index].map(|kind| {
                let pins = CounterPins::new(topology.bpffs.path(), kind.as_str(), kind);
                let (stop, netns, interface) =
                    (Arc::clone(&stop), topology.netns("a"), topology.sender_if());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        pins.attach(&netns, "stall", &interface).unwrap();
                        pins.detach(Some(&netns), "stall", &interface).unwrap();
                    }
                })
            });
            // Let the hooker get going before the first creation.
            std::thread::sleep(Duration::from_millis(20));
            for i in 0..20 {
                let name = format!("{}m{i}", topology.prefix);
                samples[index].push(create(&name).as_secs_f64() * 1e3);
                delete(&name);
            }
            stop.store(true, Ordering::Relaxed);
            if let Some(hooker) = hooker {
                hooker.join().unwrap();
            }
        }
    }
    println!(
        "macvlan creations while counters are hooked and unhooked in a loop ({} each):",
        samples[0].len()
    );
    for (kind, values) in kinds.iter().zip(&mut samples) {
        values.sort_by(f64::total_cmp);
        let p99 = values[(values.len() * 99 / 100).min(values.len() - 1)];
        println!(
            "  {:<6} median {:.3} ms, p99 {:.3} ms",
            kind.map_or("none", HookKind::as_str),
            values[values.len() / 2],
            p99
        );
    }
}

/// What the interleaved rounds need.
struct Sides<'a> {
    topology: &'a Topology,
    sender: &'a UdpSocket,
    drain: &'a dyn Fn(),
}

/// What is on the sender's interface while a batch is sent.
#[derive(Debug, Clone, Copy)]
enum Variant {
    /// No program (the interface's qdisc as without a ceiling: veth's noqueue).
    Bare,
    /// The counters, no ceiling.
    Counters(HookKind),
    /// The counters with an egress and an ingress ceiling that never limit.
    Paced(HookKind),
    /// `NETCLAIM_BENCH_BEFORE_OBJECT`: another build of the object (the counters before a
    /// change), attached the same way, to compare in the same run.
    Before(HookKind),
}

impl Variant {
    fn label(self) -> String {
        match self {
            Self::Bare => "none".to_owned(),
            Self::Counters(kind) => format!("{} counters", kind.as_str()),
            Self::Paced(kind) => format!("{} counters+pacing", kind.as_str()),
            Self::Before(kind) => format!("{} counters (before)", kind.as_str()),
        }
    }
}

/// Programs of another object attached to the sender's interface (the `Before` variant).
struct RawHook {
    _ebpf: aya::Ebpf,
    /// tcx: the links, detached when dropped.
    _links: Vec<aya::programs::links::FdLink>,
}

/// Attaches both classifiers of `object` to `interface` in the netns at `netns`.
fn hook_raw(object: &[u8], netns: &Path, interface: &str, kind: HookKind) -> RawHook {
    use aya::programs::tc::{NlOptions, TcAttachOptions};
    use aya::programs::{LinkOrder, TcAttachType};
    let (object, netns, interface) = (object.to_vec(), netns.to_owned(), interface.to_owned());
    std::thread::spawn(move || {
        let file = std::fs::File::open(&netns).unwrap();
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut ebpf = aya::Ebpf::load(&object).unwrap();
        if kind == HookKind::Clsact {
            let _exists = aya::programs::tc::qdisc_add_clsact(&interface);
        }
        let mut links = Vec::new();
        for (name, attach) in
            [("netclaim_rx", TcAttachType::Ingress), ("netclaim_tx", TcAttachType::Egress)]
        {
            let program: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            program.load().unwrap();
            let options = match kind {
                HookKind::Tcx => TcAttachOptions::TcxOrder(LinkOrder::default()),
                HookKind::Clsact => TcAttachOptions::Netlink(NlOptions::default()),
            };
            let id = program.attach_with_options(&interface, attach, options).unwrap();
            let link = program.take_link(id).unwrap();
            if kind == HookKind::Tcx {
                links.push(link.try_into().unwrap());
            } else {
                // Removed by name in `unhook_raw`.
                std::mem::forget(link);
            }
        }
        RawHook { _ebpf: ebpf, _links: links }
    })
    .join()
    .unwrap()
}

fn unhook_raw(hook: RawHook, netns: &Path, interface: &str) {
    drop(hook);
    let (netns, interface) = (netns.to_owned(), interface.to_owned());
    std::thread::spawn(move || {
        let file = std::fs::File::open(&netns).unwrap();
        nix::sched::setns(file.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        for (name, attach) in [
            ("netclaim_rx", aya::programs::TcAttachType::Ingress),
            ("netclaim_tx", aya::programs::TcAttachType::Egress),
        ] {
            let _gone = aya::programs::tc::qdisc_detach_program(&interface, attach, name);
        }
    })
    .join()
    .unwrap();
}

/// Rounds of every variant in a rotating order, each hooked just before its batch and
/// unhooked after; each hooked variant's rate is divided by the bare rate of the same round.
/// Prints the median rates and the median per-round ratio of each.
fn interleaved_rounds(sides: &Sides<'_>, rounds: usize, batch: u32, before: Option<&[u8]>) {
    let Sides { topology, sender, drain } = sides;
    let kinds = if HookKind::for_running_kernel() == HookKind::Tcx {
        vec![HookKind::Clsact, HookKind::Tcx]
    } else {
        vec![HookKind::Clsact]
    };
    let mut variants = vec![Variant::Bare];
    for &kind in &kinds {
        variants.push(Variant::Counters(kind));
        variants.push(Variant::Paced(kind));
        if before.is_some() {
            variants.push(Variant::Before(kind));
        }
    }
    let (netns, interface) = (topology.netns("a"), topology.sender_if());
    let pins: Vec<CounterPins> = kinds
        .iter()
        .map(|&kind| CounterPins::new(topology.bpffs.path(), kind.as_str(), kind))
        .collect();
    let pins_of = |kind: HookKind| &pins[kinds.iter().position(|&k| k == kind).unwrap()];
    let measure = |variant: Variant| -> f64 {
        let mut raw = None;
        match variant {
            Variant::Bare => {}
            Variant::Counters(kind) => {
                pins_of(kind).attach(&netns, "bench-pod", &interface).unwrap();
            }
            Variant::Paced(kind) => pins_of(kind)
                .set_pacing(
                    &netns,
                    "bench-pod",
                    &interface,
                    Ceilings {
                        egress_bps: Some(UNLIMITING_BPS),
                        ingress_police_bps: Some(UNLIMITING_BPS),
                    },
                )
                .unwrap(),
            Variant::Before(kind) => {
                raw = Some(hook_raw(before.unwrap(), &netns, &interface, kind));
            }
        }
        // One small batch first: the first packets after an attach pay for cold caches.
        blast(sender, batch / 10);
        drain();
        let cpu = thread_cpu();
        blast(sender, batch);
        let took = thread_cpu().saturating_sub(cpu);
        drain();
        match variant {
            Variant::Bare => {}
            Variant::Counters(kind) | Variant::Paced(kind) => {
                pins_of(kind).detach(Some(&netns), "bench-pod", &interface).unwrap();
            }
            Variant::Before(_) => unhook_raw(raw.take().unwrap(), &netns, &interface),
        }
        f64::from(batch) / took.as_secs_f64()
    };
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        let mut this_round = vec![0.0; variants.len()];
        for turn in 0..variants.len() {
            let index = (round + turn) % variants.len();
            this_round[index] = measure(variants[index]);
        }
        for (index, rate) in this_round.iter().enumerate() {
            rates[index].push(*rate);
            ratios[index].push(rate / this_round[0]);
        }
    }
    println!(
        "rounds ({rounds}, order rotating, {batch} datagrams of 64 B each, sender's veth, packets \
         per second of the sending thread's CPU time; the machine may be loaded by other work: \
         read the ratios):"
    );
    for (index, variant) in variants.iter().enumerate() {
        let ratio = median(&mut ratios[index]);
        println!(
            "  {:<28} median {:>9.0} packets/CPU-s, per-round ratio median {ratio:.3} = {:+.1} %",
            variant.label(),
            median(&mut rates[index]),
            (ratio - 1.0) * 100.0
        );
    }
}
