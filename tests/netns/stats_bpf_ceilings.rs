//! Root tests of the bandwidth ceilings the counting programs enforce (issue 35), with the real
//! eBPF object on the host's kernel: the egress program's departure times and the ingress
//! policer with `BPF_PROG_TEST_RUN`, then real floods through a veth pair with the daemon's
//! API (`CounterPins::set_pacing`) on tcx and on clsact. This host's kernel has no `fq`, so
//! here the stamps are proven as stamps (and counted as delays); `fq` holding packets until
//! their time is proven in the VMs (`tests/vm/vm_stats.rs`). The checks are in
//! `kit::ceilings`, which the VM suite runs too.

use netclaim::host::bpf::HookKind;

use crate::kit;
use crate::kit::netns::require_root;

#[test]
#[ignore = "needs root: run `make test` as root"]
fn egress_program_stamps_departures_at_the_rate() {
    require_root("egress_program_stamps_departures_at_the_rate");
    kit::ceilings::egress_program_stamps_departures_at_the_rate();
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn ingress_program_polices_above_the_burst() {
    require_root("ingress_program_polices_above_the_burst");
    kit::ceilings::ingress_program_polices_above_the_burst();
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn tcx_police_drops_a_flood_above_the_rate() {
    require_root("tcx_police_drops_a_flood_above_the_rate");
    kit::ceilings::police_drops_a_flood_above_the_rate(HookKind::Tcx).await;
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn clsact_police_drops_a_flood_above_the_rate() {
    require_root("clsact_police_drops_a_flood_above_the_rate");
    kit::ceilings::police_drops_a_flood_above_the_rate(HookKind::Clsact).await;
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn tcx_pacing_stamps_a_flood_out_of_the_pod() {
    require_root("tcx_pacing_stamps_a_flood_out_of_the_pod");
    kit::ceilings::pacing_stamps_a_flood_out_of_the_pod(HookKind::Tcx, false).await;
}

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn clsact_pacing_stamps_a_flood_out_of_the_pod() {
    require_root("clsact_pacing_stamps_a_flood_out_of_the_pod");
    kit::ceilings::pacing_stamps_a_flood_out_of_the_pod(HookKind::Clsact, false).await;
}
