//! Bandwidth ceilings as the node daemon wires them (issue 35), on the host's kernel (6.18
//! here: no `sch_fq`, so tbf): the real daemon's CreateContainer gate with its programs on a
//! private bpffs, and a ceiling qdisc's drops in the stats the stats service reads. The checks
//! are in `kit::ceilings`; the VM suite runs the gate's with `fq` (edt-fq).

use netclaim::attach::bandwidth::CeilingMechanism;
use netclaim::host::bpf::HookKind;

use crate::kit::bandwidth::kernel_has_fq;
use crate::kit::netns::require_root;

/// The daemon's own wiring (`node::load_state`, `host::qdisc_ceiling::node_ceilings`): with
/// its programs on a bpffs, the gate chooses edt-fq where the kernel has `sch_fq` and tbf
/// elsewhere, polices ingress with the programs it hooked, and the claim status says so.
#[test]
#[ignore = "needs root: run `make test` as root"]
fn the_daemon_gate_applies_its_mechanism_and_hooks_the_policing_programs() {
    require_root("the_daemon_gate_applies_its_mechanism_and_hooks_the_policing_programs");
    let fq = tokio::runtime::Runtime::new().unwrap().block_on(kernel_has_fq());
    let expected = if fq { CeilingMechanism::EdtFq } else { CeilingMechanism::Tbf };
    crate::kit::ceilings::daemon_gate_holds_a_pod_to_its_ceiling(expected);
}

/// tbf's drops and overlimits under a flood reach the stats the service reads.
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn a_flood_through_tbf_shows_qdisc_drops_in_the_stats() {
    require_root("a_flood_through_tbf_shows_qdisc_drops_in_the_stats");
    crate::kit::ceilings::tbf_drops_and_overlimits_reach_the_stats(HookKind::Clsact).await;
}

/// Without its programs (no bpffs) the daemon refuses `ingress: police` at prepare and
/// holds ceilings by tbf.
#[test]
#[ignore = "needs root: run `make test` as root"]
fn the_daemon_without_programs_refuses_police_at_prepare_and_uses_tbf() {
    require_root("the_daemon_without_programs_refuses_police_at_prepare_and_uses_tbf");
    crate::kit::ceilings::daemon_without_programs_refuses_police_and_uses_tbf();
}
