use k8s_openapi::api::resource::v1::{
    AllocatedDeviceStatus, NetworkDeviceData, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::json;

use super::*;
use crate::model::pod_network::{IpBlockClaim, IpBlockSpec};

fn device(driver: &str, pool: &str, network: Option<&str>, ips: &[&str]) -> AllocatedDeviceStatus {
    AllocatedDeviceStatus {
        driver: driver.into(),
        pool: pool.into(),
        device: "medianet-eth1".into(),
        data: network.map(|name| RawExtension(json!({"podNetwork": {"name": name, "blocks": []}}))),
        network_data: Some(NetworkDeviceData {
            ips: Some(ips.iter().map(|ip| (*ip).to_owned()).collect()),
            ..NetworkDeviceData::default()
        }),
        ..AllocatedDeviceStatus::default()
    }
}

fn claim(name: &str, devices: Vec<AllocatedDeviceStatus>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            ..ObjectMeta::default()
        },
        status: Some(ResourceClaimStatus {
            devices: Some(devices),
            ..ResourceClaimStatus::default()
        }),
        ..ResourceClaim::default()
    }
}

fn block(cidr: &str, node: &str, reserved: bool) -> IpBlock {
    IpBlock::new(IpBlockSpec {
        pod_network: "medianet".into(),
        cidr: cidr.into(),
        node_name: node.into(),
        claim: reserved.then(|| IpBlockClaim {
            namespace: "ns".into(),
            name: "s".into(),
            uid: "u".into(),
        }),
    })
}

fn network(status: Option<PodNetworkStatus>) -> PodNetwork {
    let mut network: PodNetwork =
        serde_json::from_value(json!({"spec": {"parents": ["eth1"]}})).expect("decodes");
    network.metadata.name = Some("medianet".into());
    network.metadata.generation = Some(4);
    network.status = status;
    network
}

fn at(second: i64) -> Timestamp {
    Timestamp::from_second(second).expect("a time")
}

#[test]
fn addresses_are_counted_per_network_and_node_from_our_drivers_entries() {
    let claims = [
        claim(
            "a",
            vec![device(
                "netclaim.dev",
                "n1",
                Some("medianet"),
                &["10.10.2.1/16", "fd00:10::5/64"],
            )],
        ),
        claim(
            "b",
            vec![
                device("netclaim.dev", "n2", Some("medianet"), &["10.10.2.70/16"]),
                // No network named: a node-local address.
                device("netclaim.dev", "n2", None, &["192.168.0.5/24"]),
                // Another driver's entry naming the same network.
                device("other.example.com", "n2", Some("medianet"), &["10.10.9.9/16"]),
            ],
        ),
        claim("c", vec![device("netclaim.dev", "n1", Some("storagenet"), &["10.20.0.3/24"])]),
    ];
    let leased = leased_addresses(&claims, "netclaim.dev");
    assert_eq!(leased.keys().collect::<Vec<_>>(), ["medianet", "storagenet"]);
    let medianet = &leased["medianet"];
    assert_eq!(medianet.len(), 3);
    assert_eq!(medianet[0].claim, "ns/a");
    assert_eq!(medianet[2].address, "10.10.2.70".parse::<IpAddr>().expect("ip"));

    let blocks = [
        block("10.10.2.0/26", "n1", false),
        block("10.10.2.64/26", "n2", false),
        block("10.10.1.5/32", "n2", true),
        block("10.10.2.128/26", "n3", false),
    ];
    let refs: Vec<&IpBlock> = blocks.iter().collect();
    let usage = node_usage(&refs, medianet);
    assert_eq!(
        usage,
        [
            NodeUsage { node_name: "n1".into(), blocks: 1, reservations: 0, addresses: 2 },
            NodeUsage { node_name: "n2".into(), blocks: 1, reservations: 1, addresses: 1 },
            NodeUsage { node_name: "n3".into(), blocks: 1, reservations: 0, addresses: 0 },
        ]
    );
}

#[test]
fn the_conflict_condition_is_set_kept_and_resolved_without_touching_ready() {
    let ready = Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Ready".into(),
        message: String::new(),
        observed_generation: Some(4),
        last_transition_time: Time(at(1)),
    };
    let clean = network(Some(PodNetworkStatus {
        observed_generation: Some(4),
        conditions: vec![ready.clone()],
        ..PodNetworkStatus::default()
    }));
    // No conflict ever: no condition added, nothing to write.
    assert_eq!(observed_status(&clean, &[], vec![], at(5)), clean.status.clone().expect("status"));

    let found = [Conflict("IPBlock x overlaps IPBlock y".into())];
    let conflicted = observed_status(&clean, &found, vec![], at(5));
    assert_eq!(conflicted.conditions[0], ready);
    let condition = &conflicted.conditions[1];
    assert_eq!((condition.type_.as_str(), condition.status.as_str()), ("Conflict", "True"));
    assert!(condition.message.contains("IPBlock x overlaps IPBlock y"), "{}", condition.message);
    assert_eq!(condition.last_transition_time, Time(at(5)));
    assert_eq!(condition.observed_generation, Some(4));

    // Still conflicting later: the transition time stays.
    let again = observed_status(&network(Some(conflicted.clone())), &found, vec![], at(9));
    assert_eq!(again, conflicted);

    // Resolved: False, a new transition time, Ready untouched.
    let resolved = observed_status(&network(Some(conflicted)), &[], vec![], at(12));
    assert_eq!(resolved.conditions[0], ready);
    assert_eq!(
        (resolved.conditions[1].status.as_str(), resolved.conditions[1].reason.as_str()),
        ("False", "Resolved")
    );
    assert_eq!(resolved.conditions[1].last_transition_time, Time(at(12)));
}
