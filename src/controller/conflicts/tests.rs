use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

use super::*;
use crate::model::pod_network::{IpBlockClaim, IpBlockSpec};

/// `10.10.0.0/16`, gateway `.0.1`, exclude `10.10.0.0/24` (the gateway's run), static
/// range `10.10.1.0/24`; IPv6 `fd00:10::/64`.
fn network() -> PodNetwork {
    let mut network: PodNetwork = serde_json::from_value(json!({"spec": {
        "parents": ["eth1"],
        "ipam": {
            "subnets": ["10.10.0.0/16", "fd00:10::/64"],
            "gateways": ["10.10.0.1"],
            "exclude": ["10.10.0.0/24"],
            "staticRanges": ["10.10.1.0/24"],
        },
    }}))
    .expect("the test's spec decodes");
    network.metadata = ObjectMeta { name: Some("medianet".into()), ..ObjectMeta::default() };
    network
}

fn block(name: &str, cidr: &str, node: &str) -> IpBlock {
    let mut block = IpBlock::new(IpBlockSpec {
        pod_network: "medianet".into(),
        cidr: cidr.into(),
        node_name: node.into(),
        claim: None,
    });
    block.metadata.name = Some(name.into());
    block
}

fn reservation(name: &str, cidr: &str, node: &str) -> IpBlock {
    let mut block = block(name, cidr, node);
    block.spec.claim =
        Some(IpBlockClaim { namespace: "ns".into(), name: "c".into(), uid: "u".into() });
    block
}

fn lease(address: &str, node: &str) -> LeasedAddress {
    LeasedAddress {
        address: address.parse().expect("an address"),
        claim: "ns/c".into(),
        node: node.into(),
    }
}

fn texts(found: &[Conflict]) -> Vec<&str> {
    found.iter().map(|c| c.0.as_str()).collect()
}

#[test]
fn blocks_and_reservations_where_the_spec_puts_them_are_no_conflict() {
    let blocks = [
        block("b1", "10.10.2.0/26", "n1"),
        block("b2", "10.10.2.64/26", "n2"),
        // The first block of a subnet holds its network address: nodes skip it.
        block("b3", "fd00:10::/120", "n1"),
        reservation("r1", "10.10.1.5/32", "n2"),
    ];
    let refs: Vec<&IpBlock> = blocks.iter().collect();
    let leases = [lease("10.10.2.1", "n1"), lease("10.10.1.5", "n2")];
    assert_eq!(texts(&find(&network(), &refs, &leases)), Vec::<&str>::new());
}

#[test]
fn overlapping_blocks_are_named_whatever_their_names_and_nodes() {
    // A /25 created under a name that does not match its CIDR, over another node's /26.
    let blocks = [block("b1", "10.10.2.0/26", "n1"), block("odd", "10.10.2.0/25", "n2")];
    let refs: Vec<&IpBlock> = blocks.iter().collect();
    assert_eq!(
        texts(&find(&network(), &refs, &[])),
        ["IPBlock b1 (10.10.2.0/26, node n1) overlaps IPBlock odd (10.10.2.0/25, node n2)"]
    );
}

#[test]
fn a_block_outside_the_subnets_or_over_a_static_range_is_a_conflict() {
    let blocks = [block("far", "10.99.0.0/26", "n1"), block("st", "10.10.1.0/26", "n2")];
    let refs: Vec<&IpBlock> = blocks.iter().collect();
    assert_eq!(
        texts(&find(&network(), &refs, &[])),
        [
            "IPBlock far (10.99.0.0/26, node n1) lies outside every spec.ipam.subnets entry",
            "IPBlock st (10.10.1.0/26, node n2) overlaps spec.ipam.staticRanges entry \
             10.10.1.0/24, from which claims reserve static addresses",
        ]
    );
}

#[test]
fn a_reservation_outside_static_ranges_or_of_a_gateway_is_a_conflict() {
    let blocks = [
        reservation("gw", "10.10.0.1/32", "n1"),
        reservation("in-blocks", "10.10.3.7/32", "n2"),
        block("b", "10.10.3.0/26", "n1"),
    ];
    let refs: Vec<&IpBlock> = blocks.iter().collect();
    let found = find(&network(), &refs, &[]);
    assert_eq!(
        texts(&found),
        [
            "IPBlock b (10.10.3.0/26, node n1) overlaps reservation in-blocks (10.10.3.7/32, \
             node n2, claim ns/c)",
            "reservation gw (10.10.0.1/32, node n1, claim ns/c) lies outside every \
             spec.ipam.staticRanges entry",
            "reservation gw (10.10.0.1/32, node n1, claim ns/c) reserves 10.10.0.1, a gateway",
            "reservation in-blocks (10.10.3.7/32, node n2, claim ns/c) lies outside every \
             spec.ipam.staticRanges entry",
        ]
    );
}

#[test]
fn a_handed_out_gateway_broadcast_or_newly_excluded_address_is_a_conflict() {
    // Live edit: a gateway and an exclude added over addresses pods already hold.
    let mut edited = network();
    let ipam = edited.spec.ipam.as_mut().expect("ipam");
    ipam.gateways.push("10.10.2.9".into());
    ipam.exclude.push("10.10.4.0/28".into());
    let blocks = [block("b", "10.10.2.0/26", "n1"), block("c", "10.10.4.0/26", "n2")];
    let refs: Vec<&IpBlock> = blocks.iter().collect();
    let leases = [
        lease("10.10.2.9", "n1"),
        lease("10.10.4.3", "n2"),
        lease("10.10.255.255", "n2"),
        lease("fd00:10::", "n1"),
        lease("10.10.4.20", "n2"),
    ];
    assert_eq!(
        texts(&find(&edited, &refs, &leases)),
        [
            "address 10.10.2.9 of claim ns/c on node n1 is a gateway",
            "address 10.10.255.255 of claim ns/c on node n2 is the broadcast address of subnet \
             10.10.0.0/16",
            "address 10.10.4.3 of claim ns/c on node n2 lies in spec.ipam.exclude entry \
             10.10.4.0/28",
            "address fd00:10:: of claim ns/c on node n1 is the subnet-router anycast address of \
             subnet fd00:10::/64",
        ]
    );
}

#[test]
fn blocks_of_other_networks_and_unparsable_cidrs() {
    let mut other = block("o", "10.10.2.0/26", "n1");
    other.spec.pod_network = "othernet".into();
    let blocks = [other, block("b", "10.10.2.0/26", "n2"), block("bad", "10.10.2.0/33", "n2")];
    let refs: Vec<&IpBlock> = blocks.iter().collect();
    assert_eq!(
        texts(&find(&network(), &refs, &[])),
        ["IPBlock bad (10.10.2.0/33, node n2) does not hold a CIDR"]
    );
}

#[test]
fn the_message_names_the_first_conflicts_and_counts_the_rest() {
    let many: Vec<Conflict> = (0..10).map(|i| Conflict(format!("c{i}"))).collect();
    let text = message(&many);
    assert!(text.starts_with("c0; c1;"), "{text}");
    assert!(text.contains("c7; and 2 more"), "{text}");
}
