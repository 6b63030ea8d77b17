//! The qdisc codecs against the host's kernel (issue 35): tbf (with and without
//! `TCA_TBF_RATE64`), htb with its class and fq set through `host::qdisc`, read back through our
//! decoder and through `tc -j` (iproute2's reading of the same attributes). This kernel has no
//! `sch_fq`: its refusal (`ENOENT`) must keep the previous root. The checks are in
//! `kit::bandwidth`, which the VM suite runs with fq.

use crate::kit;
use crate::kit::netns::require_root;

#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn qdisc_options_read_back_as_set_by_our_decoder_and_by_tc() {
    require_root("qdisc_options_read_back_as_set_by_our_decoder_and_by_tc");
    kit::bandwidth::qdisc_round_trips(None).await;
}

/// The start-up probe says what the kernel answers to an `fq` qdisc (missing on this host's
/// kernel, present on the VM kernels), and leaves nothing behind (its netns is private).
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn the_kernel_probe_learns_sch_fq_as_the_kernel_answers() {
    require_root("the_kernel_probe_learns_sch_fq_as_the_kernel_answers");
    let has_fq = kit::bandwidth::kernel_has_fq().await;
    let probed = tokio::task::spawn_blocking(netclaim::host::kernel_probe::probe).await.unwrap();
    match probed.fq {
        netclaim::model::support::Probe::Available => assert!(has_fq, "probe says fq, kernel not"),
        netclaim::model::support::Probe::Missing { detail } => {
            assert!(!has_fq, "probe says no fq, kernel has it");
            assert!(detail.contains("ENOENT"), "{detail}");
        }
        netclaim::model::support::Probe::Unknown { detail } => panic!("fq unknown: {detail}"),
    }
}
