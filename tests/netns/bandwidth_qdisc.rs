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
