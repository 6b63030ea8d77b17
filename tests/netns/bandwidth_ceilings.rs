//! Egress ceilings with real TCP on the host's kernel (issue 35 item 5, DESIGN §10): pods on
//! one veth parent (macvlan children in netns of their own, `kit::bandwidth::Node`), a ceiling
//! put on the sender's child by the node daemon's own adapter (`host::qdisc_ceiling`: tbf here,
//! this kernel has no `sch_fq`), and iperf3 between the pods. CI's checks, 1 s runs, about
//! 7 s in all; the figures (3 s runs, rounds, medians, the L2 rate) come from
//! `benches/bandwidth.rs`, the EDT ones from `tests/vm/vm_bandwidth.rs`.
//!
//! The bands are checks that the ceiling is enforced at the rate asked, not timing
//! assertions. Above, tight: nothing may pass more than 1.05 × the ceiling (a ceiling not
//! applied, or one in bytes for bits, lets the 8+ Gbit/s of the unshaped pair through).
//! Below, wider than the issue's −10 % (CI runs these beside other tests on two cores): 75 %
//! of the ceiling, which a wrong unit, a bucket too small for a GSO packet or a queue that
//! drops TCP into a collapse still fall under. Goodput sits ~4.4 % under the ceiling by
//! itself (the ceiling counts the Ethernet, IP and TCP headers of each 1514-byte frame,
//! iperf3 only the 1448 bytes of payload). The unshaped run shows the pair is not what limits
//! them; two pods at 3:1 must share 3:1 ± 15 % (1:1 if the ceilings were not applied).

use std::time::Duration;

use netclaim::attach::bandwidth::CeilingMechanism;
use netclaim::model::bandwidth::BitsPerSecond;

use crate::kit::bandwidth::{Measured, Node, assert_within_ceiling};
use crate::kit::netns::require_root;

const RUN: Duration = Duration::from_secs(1);
/// The lowest achieved/asked CI accepts (see the module doc).
const LOW: f64 = 0.75;

fn print(what: &str, measured: &Measured) {
    let l2 = measured.l2_bps.map_or("-".to_owned(), |l2| format!("{:.1}", l2 / 1e6));
    println!(
        "{what}: goodput {:.1} Mbit/s, L2 {l2} Mbit/s, {} retransmits",
        measured.transfer.bps / 1e6,
        measured.transfer.retransmits
    );
}

/// Three ceilings one after the other on the same pair, then none.
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn tbf_ceilings_hold_tcp_to_the_rate_asked() {
    require_root("tbf_ceilings_hold_tcp_to_the_rate_asked");
    let node = Node::new(2);
    for mbps in [50, 500, 2000] {
        let ceiling = BitsPerSecond::from_mbps(mbps);
        node.ceiling(0, ceiling, CeilingMechanism::Tbf).await;
        let measured = node.measure(0, 1, RUN).await;
        print(&format!("tbf {ceiling}"), &measured);
        assert_within_ceiling(measured.transfer.bps, ceiling, LOW);
    }
    node.no_ceiling(0).await;
    let unshaped = node.measure(0, 1, RUN).await;
    print("no ceiling", &unshaped);
    assert!(
        unshaped.transfer.bps > 2_100_000_000.0,
        "without a ceiling the pair carries {:.0} Mbit/s: the 2G ceiling's check measured the \
         machine, not the ceiling",
        unshaped.transfer.bps / 1e6
    );
}

/// Two pods on one parent with 300M and 100M ceilings sending at once.
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn two_pods_at_3_to_1_ceilings_share_3_to_1() {
    require_root("two_pods_at_3_to_1_ceilings_share_3_to_1");
    let node = Node::new(3);
    let (high, low) = (BitsPerSecond::from_mbps(300), BitsPerSecond::from_mbps(100));
    node.ceiling(0, high, CeilingMechanism::Tbf).await;
    node.ceiling(1, low, CeilingMechanism::Tbf).await;
    let rates = node.iperf(&[(0, 2), (1, 2)], RUN);
    let ratio = rates[0] / rates[1];
    println!(
        "300M: {:.1} Mbit/s, 100M: {:.1} Mbit/s, ratio {ratio:.2}",
        rates[0] / 1e6,
        rates[1] / 1e6
    );
    assert_within_ceiling(rates[0], high, LOW);
    assert_within_ceiling(rates[1], low, LOW);
    assert!((2.55..=3.45).contains(&ratio), "3:1 ceilings shared {ratio:.2}:1");
}

/// htb holds the same ceiling (the alternative mechanism, kept working).
#[tokio::test]
#[ignore = "needs root: run `make test` as root"]
async fn an_htb_ceiling_holds_tcp_too() {
    require_root("an_htb_ceiling_holds_tcp_too");
    let node = Node::new(2);
    let ceiling = BitsPerSecond::from_mbps(200);
    node.ceiling(0, ceiling, CeilingMechanism::Htb).await;
    let measured = node.measure(0, 1, RUN).await;
    print(&format!("htb {ceiling}"), &measured);
    assert_within_ceiling(measured.transfer.bps, ceiling, LOW);
}
