//! Egress ceilings by Earliest Departure Time with real TCP on the VM's kernels (issue 35
//! item 5; `make vmtest`, decision 0012): the mechanism the `CreateContainer` gate picks on a
//! kernel with `sch_fq` once the eBPF pacing is wired (`attach::bandwidth::mechanism` with
//! the start-up probe's answer) is `edt-fq`, and the node daemon's adapter
//! (`host::qdisc_ceiling::HostCeilings` with the counting programs' pacing, `CounterPins`)
//! puts it on a pod's macvlan child: the program stamps each packet's departure time from the
//! rate, `fq` (autoloaded by the kernel on the qdisc request) holds it until then.
//!
//! The parent is the first igb PF (`kit::bandwidth::Node::on_nic`): traffic between two
//! macvlan bridge children is switched by the macvlan driver and never reaches QEMU's NIC, so
//! the emulated NIC's speed does not bound it; the guest's TCG CPU does. Hence the ceilings
//! (20M, 100M; 60M + 20M or less for the ratio) sit well under what the pair carries
//! without one, which each test measures and prints first (a single ceiling not under half of
//! it is reported, not checked; 20M must be). The bands are wide for TCG below (a starved
//! guest sends less) and tight above: no ceiling may let TCP through faster than 1.10 × the
//! rate asked. The program charges a packet its `skb->len` (one set of headers per GSO
//! packet), so goodput sits closer to the ceiling than with tbf, which counts every segment's
//! headers. Figures: `vm-bandwidth` lines.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::time::Duration;

use netclaim::attach::bandwidth::{CeilingMechanism, CeilingSupport, mechanism};
use netclaim::model::bandwidth::BitsPerSecond;
use netclaim::model::network_config::Mode;
use netclaim::model::support::Probe;

use crate::kit;
use kit::bandwidth::{Measured, Node};
use kit::vm::{netdevs_of, report, require_vm};

/// Each iperf3 run (TCG: a second is too short for TCP to settle at tens of Mbit/s).
const RUN: Duration = Duration::from_secs(2);
/// Below: what a starved TCG guest may fall to. Above: the check that the ceiling holds.
const BAND: std::ops::RangeInclusive<f64> = 0.60..=1.10;

fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap().trim().to_owned()
}

fn first_igb() -> String {
    netdevs_of("igb").into_iter().next().expect("an igb PF (the VM has two)")
}

/// What the gate picks for a macvlan on this kernel with the pacing wired: `edt-fq`, the
/// start-up probe having found `sch_fq`.
async fn gates_mechanism() -> CeilingMechanism {
    let support = tokio::task::spawn_blocking(netclaim::host::kernel_probe::probe).await.unwrap();
    let fq = matches!(support.fq, Probe::Available);
    assert!(fq, "the VM kernels have sch_fq: {:?}", support.fq);
    let picked = mechanism(Mode::Macvlan, CeilingSupport { fq, pacing: true });
    assert_eq!(picked, CeilingMechanism::EdtFq);
    picked
}

#[allow(clippy::cast_precision_loss, reason = "a rate, compared within percents")]
fn ratio(achieved: f64, asked: BitsPerSecond) -> f64 {
    achieved / asked.get() as f64
}

fn row(ceiling: &str, mechanism: &str, measured: &Measured, asked: Option<BitsPerSecond>) {
    let l2 = measured.l2_bps.map_or("-".to_owned(), |l2| format!("{:.1}", l2 / 1e6));
    let of =
        asked.map_or("-".to_owned(), |asked| format!("{:.3}", ratio(measured.transfer.bps, asked)));
    report(&format!(
        "vm-bandwidth {} {ceiling} {mechanism}: goodput {:.1} Mbit/s, ratio {of}, L2 {l2} \
         Mbit/s, {} retransmits",
        kernel(),
        measured.transfer.bps / 1e6,
        measured.transfer.retransmits
    ));
}

/// Without a ceiling first (the pair's own speed in this guest), then 20M and 100M by
/// `edt-fq`: TCP goodput within [`BAND`] of each, `fq` throttled the flow (it held packets
/// until their stamps), and the ceiling's removal leaves no qdisc of ours.
#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn edt_fq_holds_tcp_to_the_ceiling_on_the_igb_parent() {
    require_vm("edt_fq_holds_tcp_to_the_ceiling_on_the_igb_parent");
    let picked = gates_mechanism().await;
    let node = Node::on_nic(&first_igb(), 2).with_pacing();
    let unshaped = node.measure(0, 1, RUN).await;
    row("none", "-", &unshaped, None);
    for mbps in [20, 100] {
        let asked = BitsPerSecond::from_mbps(mbps);
        if ratio(unshaped.transfer.bps, asked) < 2.0 {
            assert!(
                mbps > 20,
                "the guest carries {:.1} Mbit/s unshaped",
                unshaped.transfer.bps / 1e6
            );
            report(&format!("vm-bandwidth {} {asked} {picked}: not checked, under 2x", kernel()));
            continue;
        }
        node.ceiling(0, asked, picked).await;
        let throttled_before = node.fq_stats(0).await.expect("fq of ours on the pod").throttled;
        let measured = node.measure(0, 1, RUN).await;
        let fq = node.fq_stats(0).await.expect("fq of ours on the pod");
        row(&asked.to_string(), picked.as_str(), &measured, Some(asked));
        assert!(fq.throttled > throttled_before, "fq held no packet back: {fq:?}");
        let of = ratio(measured.transfer.bps, asked);
        assert!(BAND.contains(&of), "ceiling {asked}: achieved {of:.3} of it");
        node.no_ceiling(0).await;
    }
}

/// Two pods on the igb parent with 3:1 `edt-fq` ceilings sending at once to a third: 3:1 ±
/// 15 %, neither above 1.10 × its ceiling. The pair is 60M + 20M where the guest carries at
/// least three times their sum without a ceiling (measured first), else 30M + 10M or
/// 15M + 5M: two senders and their receiver share the guest's two TCG vCPUs, and a sender
/// starved of CPU falls under its ceiling (6.1 under a loaded host: 122 Mbit/s unshaped,
/// 60M + 20M shared 36.6 + 17.4).
#[tokio::test]
#[ignore = "needs the VM: run `make vmtest`"]
async fn two_pods_at_3_to_1_edt_ceilings_share_3_to_1() {
    require_vm("two_pods_at_3_to_1_edt_ceilings_share_3_to_1");
    let picked = gates_mechanism().await;
    let node = Node::on_nic(&first_igb(), 3).with_pacing();
    let unshaped = node.measure(0, 2, RUN).await;
    row("none", "-", &unshaped, None);
    let fits = |(high, low): &(u64, u64)| {
        ratio(unshaped.transfer.bps, BitsPerSecond::from_mbps(high + low)) >= 3.0
    };
    let (high, low) = [(60, 20), (30, 10), (15, 5)].into_iter().find(fits).unwrap_or_else(|| {
        panic!("the guest carries {:.1} Mbit/s unshaped", unshaped.transfer.bps / 1e6)
    });
    let (high, low) = (BitsPerSecond::from_mbps(high), BitsPerSecond::from_mbps(low));
    node.ceiling(0, high, picked).await;
    node.ceiling(1, low, picked).await;
    let transfers = node.transfers(&[(0, 2), (1, 2)], RUN);
    let shared = transfers[0].bps / transfers[1].bps;
    report(&format!(
        "vm-bandwidth {} {high}+{low} {picked} at once: {:.1} + {:.1} Mbit/s, ratio {shared:.2}",
        kernel(),
        transfers[0].bps / 1e6,
        transfers[1].bps / 1e6
    ));
    assert!(ratio(transfers[0].bps, high) <= *BAND.end(), "{high}: {transfers:?}");
    assert!(ratio(transfers[1].bps, low) <= *BAND.end(), "{low}: {transfers:?}");
    assert!((2.55..=3.45).contains(&shared), "3:1 ceilings shared {shared:.2}:1");
}
