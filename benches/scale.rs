//! 1,000 pods on one node (DESIGN §10 "Bursts", issue 36 item 4), on a private containerd 2.1
//! with NRI, root only: the scenario of the 250-pod CI guard (`kit::scale::run`: claims
//! prepared one call per pod, a burst of `RunPodSandbox` calls 16 at a time, every pod read
//! back, `kill -9` of the daemon and a restart that must verify every pod and re-attach none,
//! then everything stopped, unprepared and checked for leaks), at the size of the target:
//! 1,000 pods spread over four macvlan parents (veth ends in the host netns, removed on drop).
//! It prints the figures against the targets: attach p99 < 50 ms (the daemon's
//! `netclaim_attach_duration_seconds`, and the sandbox round trip beside it), `VmHWM` < 64 MiB,
//! `Synchronize` answered < 100 ms after `kill -9`, every pod verified < 5 s, nothing
//! re-attached; and the daemon's descriptors per pod.
//!
//! `cargo bench --bench scale` runs the daemon the image ships (`NETCLAIM_RELEASE_BIN`, or
//! `target/release/netclaim` built with `cargo build --release --no-default-features --bin
//! netclaim`). `NETCLAIM_SCALE_PODS`, `NETCLAIM_SCALE_PARENTS` and `NETCLAIM_SCALE_IN_FLIGHT`
//! change the size (250, 500 and 1,000 compared show what does not scale linearly);
//! `NETCLAIM_SCALE_STATS=0` turns the counters off. `NETCLAIM_SCALE_PLACEMENT=node` places
//! the processes as a node does (`kit::cgroup`): the daemon in a CPU cgroup of its own (its
//! DaemonSet pod's) beside one holding containerd, its shims, runc, the CNI plugins, the API
//! server and this process (kubelet's side), with equal weights; by default (`shared`) all of
//! them share one, so each of a burst's runc and CNI processes weighs as much as the daemon.
//! Without `--bench` (`cargo test --benches`,
//! as `make test` runs it) it runs 10 pods on two parents with the test build of the daemon
//! (unless `NETCLAIM_RELEASE_BIN` is set): the smoke mode, seconds; outside CI it skips when
//! root or containerd 2.1 is missing, under CI (`CI` set) it fails naming what is missing.

#![allow(missing_docs, reason = "a bench binary has no public API")]
#![allow(clippy::unwrap_used, reason = "a failed benchmark step should stop the run")]

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use netclaim_testkit as kit;

use kit::containerd::Runtime;
use kit::scale::{Params, Report};

/// The targets of DESIGN §10 for 1,000 pods on one node.
const TARGET_ATTACH_P99_S: f64 = 0.050;
const TARGET_VMHWM_KIB: u64 = 64 * 1024;
const TARGET_SYNCHRONIZE_S: f64 = 0.100;
const TARGET_VERIFY_S: f64 = 5.0;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
}

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let (pods, parents) = if full { (1000, 4) } else { (10, 2) };
    let params = Params {
        pods: env_usize("NETCLAIM_SCALE_PODS", pods),
        in_flight: env_usize("NETCLAIM_SCALE_IN_FLIGHT", 16),
        parents: env_usize("NETCLAIM_SCALE_PARENTS", parents),
        stats: std::env::var("NETCLAIM_SCALE_STATS").as_deref() != Ok("0"),
    };
    if !kit::containerd::available(Runtime::Containerd21) && std::env::var_os("CI").is_none() {
        eprintln!("scale: skipped (needs root and containerd 2.1: scripts/setup/containerd.sh)");
        return;
    }
    let binary = if full || std::env::var_os("NETCLAIM_RELEASE_BIN").is_some() {
        kit::scale::release_binary()
    } else {
        PathBuf::from(kit::netclaim_bin())
    };
    eprintln!("scale: daemon {}; load {}", binary.display(), load());
    let placement = std::env::var("NETCLAIM_SCALE_PLACEMENT").unwrap_or_else(|_| "shared".into());
    let groups = match placement.as_str() {
        "shared" => None,
        "node" => Some(node_placement()),
        other => panic!("NETCLAIM_SCALE_PLACEMENT={other:?}: expected shared or node"),
    };
    eprintln!("scale: placement {placement}");
    let node_group = groups.as_ref().map(|(_, pod)| Arc::clone(pod));
    let report: Arc<Mutex<Option<Report>>> = Arc::default();
    let out = Arc::clone(&report);
    kit::e2e::run_e2e(Runtime::Containerd21, move |cluster| {
        Box::pin(async move {
            cluster.node_binary = binary;
            cluster.node_cgroup = node_group;
            let report = kit::scale::run(cluster, params).await;
            *out.lock().unwrap() = Some(report);
        })
    });
    // Back to the root and removed, now that the daemon and containerd are gone.
    drop(groups);
    let report = report.lock().unwrap().take().expect("the scenario returned its report");
    println!("placement: {placement}");
    println!("{report}");
    println!("load after the run: {}", load());
    print_targets(&report);
}

/// Two sibling CPU cgroups, as a node has them: the runtime's (this process moves in, so
/// containerd, the API server and everything they start are born there) and the daemon
/// pod's (each start of the daemon moves in).
fn node_placement() -> (kit::cgroup::CpuGroup, Arc<kit::cgroup::CpuGroup>) {
    let name = format!("netclaim-bench-{}", std::process::id());
    let runtime = kit::cgroup::CpuGroup::create(&format!("{name}-runtime")).unwrap();
    let pod = kit::cgroup::CpuGroup::create(&format!("{name}-pod")).unwrap();
    runtime.add(std::process::id()).unwrap();
    (runtime, Arc::new(pod))
}

/// The load averages (`/proc/loadavg`): the machine is shared, every figure goes with them.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn print_targets(report: &Report) {
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    let p99 = report.attach_p99.0;
    let synchronize = report.synchronize.as_secs_f64();
    let verify = report.reconcile.as_secs_f64();
    println!("targets (DESIGN §10, 1,000 pods on one node, 16 in flight):");
    println!("  attach p99 {:.2} ms < 50 ms: {}", p99 * 1e3, verdict(p99 < TARGET_ATTACH_P99_S));
    println!(
        "  VmHWM {} KiB (burst), {} KiB (restart) < 64 MiB: {}",
        report.peak_rss_burst_kib,
        report.peak_rss_restart_kib,
        verdict(report.peak_rss_burst_kib.max(report.peak_rss_restart_kib) < TARGET_VMHWM_KIB)
    );
    println!(
        "  Synchronize after kill -9 {:.2} ms < 100 ms: {}",
        synchronize * 1e3,
        verdict(synchronize < TARGET_SYNCHRONIZE_S)
    );
    println!("  every pod verified in {verify:.3} s < 5 s: {}", verdict(verify < TARGET_VERIFY_S));
    println!("  re-attached {}: {}", report.reattached, verdict(report.reattached == 0));
}
