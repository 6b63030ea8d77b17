//! Consumable capacity as kube-scheduler applies it (KEP-5075), with the two capacities a
//! netclaim shared parent publishes: `interfaces` (default 1, only 1) and `bandwidth`
//! (default 0, `validRange {min: 0, step: 1M}`): defaults when a claim names no amount,
//! rounding up to the step, `max` and `validValues`, sums per device across allocations, and
//! the `consumedCapacity` and `shareID` recorded.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    AllocationResult, CapacityRequestPolicy, CapacityRequestPolicyRange, CapacityRequirements,
    DeviceCapacity, DeviceRequest, DeviceSubRequest, ExactDeviceRequest,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;

use super::allocate::Usage;
use super::tests::{World, allocated, claim, class, exact, request, shared};

const BANDWIDTH: &str = "netclaim.dev/bandwidth";

fn q(text: &str) -> ApiQuantity {
    ApiQuantity(text.to_owned())
}

/// A shared parent `name` with `interfaces` sub-interfaces and `bandwidth` bits per second,
/// both with netclaim's request policies.
fn parent(name: &str, interfaces: &str, bandwidth: &str) -> k8s_openapi::api::resource::v1::Device {
    let mut device = shared(name, interfaces, Some(super::tests::default_one()));
    device.capacity.as_mut().unwrap().insert(
        BANDWIDTH.to_owned(),
        DeviceCapacity {
            value: q(bandwidth),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q("0")),
                valid_values: None,
                valid_range: Some(CapacityRequestPolicyRange {
                    min: q("0"),
                    max: None,
                    step: Some(q("1M")),
                }),
            }),
        },
    );
    device
}

fn asking(name: &str, amount: &str) -> ExactDeviceRequest {
    let mut req = exact("net");
    req.capacity = Some(CapacityRequirements {
        requests: Some(BTreeMap::from([(name.to_owned(), q(amount))])),
    });
    req
}

/// `(device, consumed bandwidth, consumed interfaces, has a shareID)` of the one result.
fn consumed(result: &AllocationResult) -> (String, String, String, bool) {
    let entry = &result.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    let capacity = entry.consumed_capacity.as_ref().unwrap();
    (
        entry.device.clone(),
        capacity[BANDWIDTH].0.clone(),
        capacity["netclaim.dev/interfaces"].0.clone(),
        entry.share_id.is_some(),
    )
}

fn world(devices: Vec<k8s_openapi::api::resource::v1::Device>) -> World {
    World::new(devices, vec![class("net", &["device.allowMultipleAllocations"])])
}

#[test]
fn a_claim_naming_no_amount_consumes_the_defaults_and_gets_a_share() {
    let mut world = world(vec![parent("eth1", "256", "10G")]);
    let result = world.commit(claim("c1", vec![request("nic", exact("net"))])).unwrap();
    assert_eq!(consumed(&result), ("eth1".into(), "0".into(), "1".into(), true));
}

#[test]
fn requests_round_up_to_the_step_and_are_recorded_exactly() {
    let mut world = world(vec![parent("eth1", "256", "10G")]);
    for (asked, recorded) in [
        ("500M", "500M"),
        ("2.5G", "2500M"),
        ("1500001", "2M"),
        ("10Mi", "11M"), // 10 485 760 bit/s: the next whole megabit.
        ("1", "1M"),
        ("0", "0"),
    ] {
        let name = format!("c-{asked}");
        let result =
            world.commit(claim(&name, vec![request("nic", asking(BANDWIDTH, asked))])).unwrap();
        assert_eq!(consumed(&result).1, recorded, "{asked}");
    }
}

#[test]
fn the_sum_per_device_stays_within_its_capacity_and_best_effort_still_fits() {
    let mut world = world(vec![parent("eth1", "4", "10G")]);
    world.commit(claim("a", vec![request("nic", asking(BANDWIDTH, "6G"))])).unwrap();
    world.commit(claim("b", vec![request("nic", asking(BANDWIDTH, "3G"))])).unwrap();
    let err = world
        .allocate(&claim("c", vec![request("nic", asking(BANDWIDTH, "2G"))]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "capacity netclaim.dev/bandwidth: 9G of 10G already consumed, 2G more requested"
        ),
        "{err}"
    );
    // What is left still fits exactly, and a claim naming no amount takes none of it.
    world.commit(claim("d", vec![request("nic", asking(BANDWIDTH, "1G"))])).unwrap();
    let best_effort = world.commit(claim("e", vec![request("nic", exact("net"))])).unwrap();
    assert_eq!(consumed(&best_effort).1, "0");
    // Now the interfaces run out (4), whatever the bandwidth.
    let err =
        world.allocate(&claim("f", vec![request("nic", exact("net"))])).unwrap_err().to_string();
    assert!(err.contains("capacity netclaim.dev/interfaces: 4 of 4"), "{err}");
    // A claim that goes away gives its bandwidth back.
    world.claims.retain(|c| c.metadata.name.as_deref() != Some("a"));
    world.commit(claim("g", vec![request("nic", asking(BANDWIDTH, "6G"))])).unwrap();
}

#[test]
fn a_request_goes_to_the_device_with_room_and_never_to_one_without_the_capacity() {
    let mut unknown = shared("eth0", "256", Some(super::tests::default_one()));
    unknown.name = "eth0".into();
    let mut world = world(vec![unknown, parent("eth1", "256", "1G"), parent("eth2", "256", "10G")]);
    let first = world.commit(claim("a", vec![request("nic", asking(BANDWIDTH, "800M"))])).unwrap();
    assert_eq!(consumed(&first).0, "eth1", "eth0 has no bandwidth capacity");
    let second = world.commit(claim("b", vec![request("nic", asking(BANDWIDTH, "800M"))])).unwrap();
    assert_eq!(consumed(&second).0, "eth2", "eth1 has 200M left");
    // A best-effort claim may land on the parent without a bandwidth capacity.
    let best = world.commit(claim("c", vec![request("nic", exact("net"))])).unwrap();
    let entry = &best.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(entry.device, "eth0");
    let err = world
        .allocate(&claim("d", vec![request("nic", asking(BANDWIDTH, "20G"))]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("eth0: has no capacity netclaim.dev/bandwidth"), "{err}");
    assert!(err.contains("eth2: capacity netclaim.dev/bandwidth: 800M of 10G"), "{err}");
}

#[test]
fn an_unqualified_capacity_name_is_the_drivers_own() {
    let mut world = world(vec![parent("eth1", "256", "10G")]);
    let result = world.commit(claim("a", vec![request("nic", asking("bandwidth", "3G"))])).unwrap();
    assert_eq!(consumed(&result).1, "3G");
}

#[test]
fn first_available_takes_the_first_sub_request_that_fits_with_its_capacity() {
    let mut world = world(vec![parent("eth1", "256", "1G")]);
    let sub = |name: &str, amount: &str| DeviceSubRequest {
        name: name.to_owned(),
        device_class_name: "net".to_owned(),
        capacity: Some(CapacityRequirements {
            requests: Some(BTreeMap::from([(BANDWIDTH.to_owned(), q(amount))])),
        }),
        ..DeviceSubRequest::default()
    };
    let fallback = DeviceRequest {
        name: "nic".to_owned(),
        first_available: Some(vec![sub("fast", "5G"), sub("slow", "100M")]),
        ..DeviceRequest::default()
    };
    let result = world.commit(claim("a", vec![fallback])).unwrap();
    let entry = &result.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(entry.request, "nic/slow");
    assert_eq!(entry.consumed_capacity.as_ref().unwrap()[BANDWIDTH].0, "100M");
}

#[test]
fn max_and_valid_values_bound_a_request() {
    let mut device = parent("eth1", "256", "10G");
    let capacities = device.capacity.as_mut().unwrap();
    capacities.get_mut(BANDWIDTH).unwrap().request_policy.as_mut().unwrap().valid_range =
        Some(CapacityRequestPolicyRange {
            min: q("100M"),
            max: Some(q("2G")),
            step: Some(q("100M")),
        });
    capacities.insert(
        "netclaim.dev/queues".to_owned(),
        DeviceCapacity {
            value: q("8"),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(q("1")),
                valid_values: Some(vec![q("1"), q("2"), q("4")]),
                valid_range: None,
            }),
        },
    );
    let mut world = world(vec![device]);
    let err = world
        .allocate(&claim("a", vec![request("nic", asking(BANDWIDTH, "3G"))]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("above the valid range's max 2G"), "{err}");
    let result = world.commit(claim("b", vec![request("nic", asking(BANDWIDTH, "150M"))])).unwrap();
    assert_eq!(consumed(&result).1, "200M", "min + 1 step");
    let entry = &result.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
    assert_eq!(entry.consumed_capacity.as_ref().unwrap()["netclaim.dev/queues"].0, "1");
    let three = world.commit(claim("c", vec![request("nic", asking("netclaim.dev/queues", "3"))]));
    let entry = &three.unwrap().devices.unwrap().results.unwrap()[0];
    assert_eq!(entry.consumed_capacity.as_ref().unwrap()["netclaim.dev/queues"].0, "4");
    let err = world
        .allocate(&claim("d", vec![request("nic", asking("netclaim.dev/queues", "5"))]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("above every valid value"), "{err}");
}

#[test]
fn a_usage_kept_through_a_pass_holds_each_allocation_added_to_it() {
    // Room for two sub-interfaces; the first is recorded, the second only added to the
    // pass's usage (as the allocator does after writing it).
    let mut world = world(vec![parent("eth1", "2", "10G")]);
    world.commit(claim("c1", vec![request("nic", exact("net"))])).unwrap();
    let mut usage = Usage::from_claims(&world.claims, None);
    let second = claim("c2", vec![request("nic", exact("net"))]);
    let result = world.allocate_against(&second, usage.clone()).unwrap();
    usage.add_claim(&allocated(second, result));
    let third = claim("c3", vec![request("nic", exact("net"))]);
    let refused = world.allocate_against(&third, usage).unwrap_err();
    assert!(refused.to_string().contains("eth1"), "{refused}");
    // Rebuilt from the recorded claims alone (no second), the parent has room.
    assert!(world.allocate_against(&third, Usage::from_claims(&world.claims, None)).is_ok());
}
