//! The routing variant (issue 34): a dual-stack macvlan attach with source-based routing
//! (its table filled with both subnets and the two routes, one rule per address) and four
//! sysctls (two IPv4 through `IFLA_INET_CONF`, one IPv6 and one neighbour setting through
//! `/proc/sys` on a thread in the pod netns), against the same attach without them, both
//! through `podnet::apply` with the pod socket. Interleaved rounds, ratio of the per-round
//! times.

use std::time::Duration;

use criterion::BenchmarkGroup;
use criterion::measurement::WallTime;
use netclaim::model::network_config::ResolvedNetworkConfig;
use netclaim::podnet::{AttachPlan, AttachRequest, HostDevice, PodNetns, plan_attach};
use serde_json::json;

use super::{Bench, PARENT, median, ratio_median};

/// The dual-stack macvlan plan of the bench with routing and sysctls.
fn routed_plan(bench: &Bench) -> AttachPlan {
    let config: ResolvedNetworkConfig = serde_json::from_value(json!({
        "mode": {"type": "macvlan", "mode": "bridge"},
        "interface": {"mtu": 1400},
        "addressing": {"static": ["10.77.0.2/24", "fd00:77::2/64"]},
        "routes": [
            {"destination": "10.88.0.0/16", "gateway": "10.77.0.1", "metric": 50},
            {"destination": "fd00:88::/64", "gateway": "fd00:77::1"}
        ],
        "stats": false,
        "routing": {
            "policy": {"table": 0, "sourceRules": true},
            "sysctls": [
                {"family": "ipv4Conf", "attribute": "rp_filter", "value": "2"},
                {"family": "ipv4Conf", "attribute": "arp_ignore", "value": "1"},
                {"family": "ipv6Conf", "attribute": "accept_ra", "value": "0"},
                {"family": "ipv4Neigh", "attribute": "base_reachable_time_ms", "value": "15000"}
            ]
        }
    }))
    .expect("a valid resolved config");
    let device = HostDevice {
        if_name: PARENT.to_owned(),
        kind: netclaim::model::network_config::DeviceKind::Virtual,
        sharing: netclaim::model::network_config::Sharing::Shared,
        mtu: 1500,
        mac: None,
    };
    let pod = PodNetns { pod_uid: "bench".to_owned(), path: bench.pod_path.clone() };
    plan_attach(&AttachRequest {
        claim_uid: "bench-claim",
        config: &config,
        device: &device,
        pod: &pod,
        interface_name: &bench.macvlan_plan.interface_name,
        pool_addresses: &[],
    })
    .expect("a valid plan")
}

/// The criterion function of the routed attach, next to `macvlan-dual-stack/podnet`.
pub(crate) fn bench_function(group: &mut BenchmarkGroup<'_, WallTime>, bench: &Bench) {
    let plan = routed_plan(bench);
    assert_eq!(plan.steps.len(), bench.macvlan_plan.steps.len() + 7, "{:?}", plan.steps);
    group.bench_function("macvlan-dual-stack/podnet+routing+4-sysctls", |b| {
        b.iter_custom(|iters| Bench::repeat(iters, || bench.runtime.block_on(bench.podnet(&plan))));
    });
}

/// Interleaved rounds of the plain and the routed attach (order alternating), printed as
/// medians and the median of the per-round ratios.
pub(crate) fn report(bench: &Bench, rounds: usize) {
    let routed = routed_plan(bench);
    let (mut plain, mut with_routing): (Vec<Duration>, Vec<Duration>) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        if round % 2 == 0 {
            plain.push(bench.runtime.block_on(bench.podnet(&bench.macvlan_plan)));
            with_routing.push(bench.runtime.block_on(bench.podnet(&routed)));
        } else {
            with_routing.push(bench.runtime.block_on(bench.podnet(&routed)));
            plain.push(bench.runtime.block_on(bench.podnet(&bench.macvlan_plan)));
        }
    }
    println!("rounds macvlan-dual-stack routing ({rounds} rounds, order alternating):");
    println!(
        "  podnet medians: plain {:?}, source routing + 4 sysctls {:?}; per-round ratio \
         median routed/plain {:.2}",
        median(&plain),
        median(&with_routing),
        ratio_median(&with_routing, &plain),
    );
}
