//! The traffic counters on the VM's kernels (`make vmtest`, decision 0012, issue 15 item 2):
//! on 6.1 there is no tcx (it came with 6.6), so `HookKind::for_running_kernel` (which the
//! daemon consults before honouring `--stats-hook tcx`) must say clsact, a tcx attach must
//! fail and leave nothing behind, and the counters must still match the kernel's link
//! counters through clsact; on 6.12 both hooks count. The checks are those of
//! the host's root tier (`kit::counters`, also run by `tests/netns/stats_bpf.rs`). They run only
//! inside the VM, where `vmtests/guest.sh` sets `NETCLAIM_VM=1`; nextest leaves this binary
//! out (`.config/nextest.toml`), and run on a host anyway they fail rather than pass.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use netclaim::host::bpf::{BpfError, CounterPins, HookKind};
use netclaim::stats::CounterPort;

use crate::kit;

/// Fails the test outside the VM: these checks are about the VM's kernel.
fn require_vm(test: &str) {
    assert_eq!(
        std::env::var("NETCLAIM_VM").as_deref(),
        Ok("1"),
        "{test}: runs inside the VM only (make vmtest)"
    );
}

/// `(major, minor)` of the running kernel, from its release string (`6.1.0-50-amd64`).
fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release.trim().split(['.', '-']);
    let mut next = || parts.next().unwrap().parse::<u32>().unwrap();
    let version = (next(), next());
    println!("kernel {}", release.trim());
    version
}

/// tcx links (`BPF_TCX_INGRESS`/`EGRESS` attach types, the `bpf_mprog` code) came with 6.6.
fn has_tcx() -> bool {
    kernel_version() >= (6, 6)
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn tcx_is_offered_from_6_6_only() {
    require_vm("tcx_is_offered_from_6_6_only");
    let expected = if has_tcx() { HookKind::Tcx } else { HookKind::Clsact };
    assert_eq!(HookKind::for_running_kernel(), expected);
}

/// On 6.1 the kernel does not know the tcx attach types (`bpf_link_create` answers EINVAL):
/// the attach fails naming the hook, and neither a pin nor a filter stays. Where tcx exists
/// it counts like on the host.
#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn tcx_fails_cleanly_before_6_6_and_counts_from_it() {
    require_vm("tcx_fails_cleanly_before_6_6_and_counts_from_it");
    if has_tcx() {
        kit::counters::counts_match_the_kernel(HookKind::Tcx).await;
        return;
    }
    let bpffs = kit::counters::Bpffs::mount();
    let pair = kit::counters::Pair::new(1500);
    let pins = CounterPins::new(bpffs.path(), "node-a", HookKind::Tcx);
    let err = pins.attach(&pair.pod_path(), "pod-uid", &pair.pod_if).unwrap_err();
    println!("tcx on this kernel: {}", netclaim::model::cause::chain(&err));
    assert!(
        matches!(err, BpfError::Attach { kind: "tcx", ref interface, .. } if *interface == pair.pod_if),
        "a tcx attach error naming the interface: {err:?}"
    );
    assert!(pins.hooked().unwrap().is_empty(), "nothing hooked");
    assert!(!pins.dir("pod-uid", &pair.pod_if).exists(), "no pin directory left");
    assert!(!bpffs.path().join("netclaim/node-a/pod-uid").exists(), "no pod directory left either");
    for direction in ["ingress", "egress"] {
        let filters = pair.filters(direction);
        assert!(!filters.contains("netclaim"), "{direction} filter left: {filters}");
    }
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn clsact_counts_match_the_kernels_link_counters() {
    require_vm("clsact_counts_match_the_kernels_link_counters");
    kit::counters::counts_match_the_kernel(HookKind::Clsact).await;
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn drops_come_from_the_link_counters() {
    require_vm("drops_come_from_the_link_counters");
    kit::counters::drops_come_from_the_link_counters(HookKind::for_running_kernel()).await;
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn a_node_sees_only_its_own_pins_and_removes_those_of_a_gone_netns() {
    require_vm("a_node_sees_only_its_own_pins_and_removes_those_of_a_gone_netns");
    kit::counters::a_node_sees_only_its_own_pins(HookKind::for_running_kernel()).await;
}

/// The ceiling code of the programs passes this kernel's verifier (the compare-and-swap of
/// the departure time needs BPF atomics, 5.12+) and stamps departures exactly one frame's
/// time at the rate apart (`kit::ceilings`, as on the host).
#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn egress_program_stamps_departures_at_the_rate() {
    require_vm("egress_program_stamps_departures_at_the_rate");
    kit::ceilings::egress_program_stamps_departures_at_the_rate();
}

#[test]
#[ignore = "needs the VM: run `make vmtest`"]
fn ingress_program_polices_above_the_burst() {
    require_vm("ingress_program_polices_above_the_burst");
    kit::ceilings::ingress_program_polices_above_the_burst();
}

/// Earliest Departure Time for real: with `fq` on the pod end (the VM kernels have
/// `sch_fq`; this host's has not), a flood paced at 80 kbit/s reaches the peer no faster than
/// the rate, and every frame the program admitted arrives. The hook the daemon picks: clsact
/// on 6.1, tcx on 6.12.
#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn fq_releases_paced_packets_at_their_departure_time() {
    require_vm("fq_releases_paced_packets_at_their_departure_time");
    kit::ceilings::pacing_stamps_a_flood_out_of_the_pod(HookKind::for_running_kernel(), true).await;
}

#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn police_drops_a_flood_above_the_rate() {
    require_vm("police_drops_a_flood_above_the_rate");
    kit::ceilings::police_drops_a_flood_above_the_rate(HookKind::for_running_kernel()).await;
}
