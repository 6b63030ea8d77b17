//! Root tests of the traffic counters with the real eBPF object (`host::bpf`) on the host's
//! kernel: a veth pair between a throwaway "pod" netns and a "peer" netns, counters hooked on
//! the pod end with tcx and with clsact, a ping flood, and the counts held against the
//! kernel's own link counters (`ip -s`), which count the same frames. Drops come from the link
//! counters: a frame larger than the peer's MTU is dropped by veth after the egress hook saw
//! it. Pins live in a private bpffs mounted for the test, so nothing touches the host's
//! /sys/fs/bpf. The checks themselves are in `kit::counters`, which the 6.1 VM suite
//! (`tests/vm/vm_stats.rs`) runs too.

use netclaim::host::bpf::HookKind;

use crate::kit;
use crate::kit::netns::require_root;

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn tcx_counts_match_the_kernels_link_counters() {
    require_root("tcx_counts_match_the_kernels_link_counters");
    kit::counters::counts_match_the_kernel(HookKind::Tcx).await;
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn clsact_counts_match_the_kernels_link_counters() {
    require_root("clsact_counts_match_the_kernels_link_counters");
    kit::counters::counts_match_the_kernel(HookKind::Clsact).await;
}

/// Frames larger than the peer's MTU leave the pod's egress hook and are dropped by veth: the
/// counters see them sent, and the drop shows in `tx_dropped` from the link counters.
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn drops_come_from_the_link_counters() {
    require_root("drops_come_from_the_link_counters");
    kit::counters::drops_come_from_the_link_counters(HookKind::for_running_kernel()).await;
}

/// Another node's subtree on the same bpffs is never listed or removed; a pod's pins that
/// outlive their netns (the pod went while the daemon was down) are removed without it.
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_node_sees_only_its_own_pins_and_removes_those_of_a_gone_netns() {
    require_root("a_node_sees_only_its_own_pins_and_removes_those_of_a_gone_netns");
    kit::counters::a_node_sees_only_its_own_pins(HookKind::for_running_kernel()).await;
}
