//! Unit tests of the pure allocation core.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    AllocationResult, CELDeviceSelector, CapacityRequestPolicy, CapacityRequestPolicyRange,
    CapacityRequirements, Device, DeviceAttribute, DeviceCapacity, DeviceClaim,
    DeviceClaimConfiguration, DeviceClass, DeviceClassConfiguration, DeviceClassSpec,
    DeviceRequest, DeviceSelector, DeviceSubRequest, ExactDeviceRequest, OpaqueDeviceConfiguration,
    ResourceClaim, ResourceClaimSpec, ResourceClaimStatus, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;

use super::allocate::{
    AllocationError, AllocationInput, Usage, allocate, allocate_with_usage, complete_pools,
};

const NODE: &str = "node-a";
const DRIVER: &str = "netclaim.dev";

fn string_attr(value: &str) -> DeviceAttribute {
    DeviceAttribute { string: Some(value.to_owned()), ..DeviceAttribute::default() }
}

fn exclusive(name: &str, kind: &str) -> Device {
    Device {
        name: name.to_owned(),
        attributes: Some(BTreeMap::from([
            ("netclaim.dev/type".to_owned(), string_attr(kind)),
            ("netclaim.dev/sharing".to_owned(), string_attr("exclusive")),
        ])),
        ..Device::default()
    }
}

pub(super) fn shared(name: &str, capacity: &str, policy: Option<CapacityRequestPolicy>) -> Device {
    Device {
        name: name.to_owned(),
        attributes: Some(BTreeMap::from([
            ("netclaim.dev/type".to_owned(), string_attr("physical")),
            ("netclaim.dev/sharing".to_owned(), string_attr("shared")),
        ])),
        allow_multiple_allocations: Some(true),
        capacity: Some(BTreeMap::from([(
            "netclaim.dev/interfaces".to_owned(),
            DeviceCapacity { value: ApiQuantity(capacity.to_owned()), request_policy: policy },
        )])),
        ..Device::default()
    }
}

pub(super) fn default_one() -> CapacityRequestPolicy {
    CapacityRequestPolicy {
        default: Some(ApiQuantity("1".to_owned())),
        valid_values: Some(vec![ApiQuantity("1".to_owned())]),
        valid_range: None,
    }
}

fn slice(name: &str, generation: i64, count: i64, devices: Vec<Device>) -> ResourceSlice {
    ResourceSlice {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        spec: ResourceSliceSpec {
            driver: DRIVER.to_owned(),
            node_name: Some(NODE.to_owned()),
            pool: ResourcePool { name: NODE.to_owned(), generation, resource_slice_count: count },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
}

pub(super) fn class(name: &str, expressions: &[&str]) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
        spec: Some(DeviceClassSpec {
            selectors: Some(expressions.iter().map(|e| selector(e)).collect()),
            ..DeviceClassSpec::default()
        }),
    }
}

fn selector(expression: &str) -> DeviceSelector {
    DeviceSelector { cel: Some(CELDeviceSelector { expression: expression.to_owned() }) }
}

pub(super) fn exact(class: &str) -> ExactDeviceRequest {
    ExactDeviceRequest { device_class_name: class.to_owned(), ..ExactDeviceRequest::default() }
}

pub(super) fn request(name: &str, exactly: ExactDeviceRequest) -> DeviceRequest {
    DeviceRequest { name: name.to_owned(), exactly: Some(exactly), ..DeviceRequest::default() }
}

pub(super) fn claim(uid: &str, requests: Vec<DeviceRequest>) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(uid.to_owned()),
            namespace: Some("default".to_owned()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim { requests: Some(requests), ..DeviceClaim::default() }),
        }),
        status: None,
    }
}

pub(super) fn allocated(mut claim: ResourceClaim, allocation: AllocationResult) -> ResourceClaim {
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(allocation),
        ..ResourceClaimStatus::default()
    });
    claim
}

pub(super) struct World {
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    pub(super) claims: Vec<ResourceClaim>,
    next_share: u32,
}

impl World {
    pub(super) fn new(devices: Vec<Device>, classes: Vec<DeviceClass>) -> Self {
        Self {
            slices: vec![slice("s0", 1, 1, devices)],
            classes,
            claims: Vec::new(),
            next_share: 0,
        }
    }

    pub(super) fn allocate(
        &mut self,
        claim: &ResourceClaim,
    ) -> Result<AllocationResult, AllocationError> {
        let input = AllocationInput {
            node: NODE,
            slices: &self.slices,
            classes: &self.classes,
            claims: &self.claims,
        };
        let mut counter = self.next_share;
        let result = allocate(&input, claim, &mut || {
            counter += 1;
            format!("share-{counter}")
        });
        self.next_share = counter;
        result
    }

    /// [`allocate_with_usage`] against `usage` rather than the recorded claims.
    pub(super) fn allocate_against(
        &self,
        claim: &ResourceClaim,
        usage: Usage,
    ) -> Result<AllocationResult, AllocationError> {
        let input = AllocationInput {
            node: NODE,
            slices: &self.slices,
            classes: &self.classes,
            claims: &[],
        };
        allocate_with_usage(&input, claim, usage, &mut || "share".to_owned())
    }

    /// Allocates and records the claim as allocated.
    pub(super) fn commit(
        &mut self,
        claim: ResourceClaim,
    ) -> Result<AllocationResult, AllocationError> {
        let result = self.allocate(&claim)?;
        self.claims.push(allocated(claim, result.clone()));
        Ok(result)
    }
}

fn devices_of(result: &AllocationResult) -> Vec<(String, String)> {
    result
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| (r.request.clone(), r.device.clone()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter().map(|(a, b)| ((*a).to_owned(), (*b).to_owned())).collect()
}

#[test]
fn only_the_newest_complete_generation_of_a_pool_counts() {
    let slices = vec![
        slice("old", 1, 1, vec![exclusive("old-dev", "physical")]),
        slice("new-0", 2, 2, vec![exclusive("new-dev", "physical")]),
    ];
    // Generation 2 announces two slices but only one is there: nothing is offered yet, and
    // generation 1 is stale.
    assert!(complete_pools(&slices, NODE).is_empty());
    let mut whole = slices.clone();
    whole.push(slice("new-1", 2, 2, vec![exclusive("other", "physical")]));
    let names: Vec<_> =
        complete_pools(&whole, NODE).iter().map(|c| c.device.name.clone()).collect();
    assert_eq!(names, ["new-dev", "other"]);
    assert!(complete_pools(&whole, "node-b").is_empty(), "another node's slices are not ours");
}

#[test]
fn class_and_request_selectors_are_anded() {
    let mut world = World::new(
        vec![
            exclusive("eth1", "physical"),
            exclusive("eth2", "sriov-vf"),
            exclusive("eth3", "physical"),
        ],
        vec![class("nics", &[r#"device.attributes["netclaim.dev"].sharing == "exclusive""#])],
    );
    let mut req = exact("nics");
    req.selectors = Some(vec![selector(r#"device.attributes["netclaim.dev"].type == "sriov-vf""#)]);
    let result = world.commit(claim("c1", vec![request("vf", req.clone())])).unwrap();
    assert_eq!(devices_of(&result), pairs(&[("vf", "eth2")]));
    let node_terms = &result.node_selector.as_ref().unwrap().node_selector_terms;
    let field = &node_terms[0].match_fields.as_ref().unwrap()[0];
    assert_eq!((field.key.as_str(), field.operator.as_str()), ("metadata.name", "In"));
    assert_eq!(field.values.as_deref(), Some(&[NODE.to_owned()][..]));
    // The only VF is taken: the second claim fails and says why.
    let err = world.commit(claim("c2", vec![request("vf", req)])).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("\"vf\"") && text.contains("eth2: allocated to another claim"), "{text}");
}

#[test]
fn exact_count_and_all() {
    let devices =
        vec![exclusive("a", "physical"), exclusive("b", "physical"), exclusive("c", "physical")];
    let mut world = World::new(devices, vec![class("nics", &["true"])]);
    let mut two = exact("nics");
    two.count = Some(2);
    assert_eq!(
        devices_of(&world.commit(claim("c1", vec![request("pair", two.clone())])).unwrap()),
        pairs(&[("pair", "a"), ("pair", "b")])
    );
    assert!(matches!(
        world.allocate(&claim("c2", vec![request("pair", two)])),
        Err(AllocationError::NoFit { .. })
    ));
    let mut all = exact("nics");
    all.allocation_mode = Some("All".to_owned());
    // `c` is free, but All needs every matching device.
    let err = world.allocate(&claim("c3", vec![request("every", all.clone())])).unwrap_err();
    assert!(err.to_string().contains("allocationMode All"), "{err}");
    world.claims.clear();
    assert_eq!(
        devices_of(&world.commit(claim("c4", vec![request("every", all)])).unwrap()).len(),
        3
    );
    let mut zero = exact("nics");
    zero.count = Some(0);
    assert!(matches!(
        world.allocate(&claim("c5", vec![request("x", zero)])),
        Err(AllocationError::InvalidClaim { .. })
    ));
}

#[test]
fn first_available_takes_the_first_alternative_that_fits() {
    let mut world = World::new(
        vec![exclusive("vf0", "sriov-vf"), shared("parent", "2", Some(default_one()))],
        vec![
            class("vfs", &[r#"device.attributes["netclaim.dev"].type == "sriov-vf""#]),
            class("shared", &["device.allowMultipleAllocations"]),
        ],
    );
    let subs = vec![
        DeviceSubRequest {
            name: "vf".to_owned(),
            device_class_name: "vfs".to_owned(),
            ..DeviceSubRequest::default()
        },
        DeviceSubRequest {
            name: "macvlan".to_owned(),
            device_class_name: "shared".to_owned(),
            ..DeviceSubRequest::default()
        },
    ];
    let nic = || DeviceRequest {
        name: "nic".to_owned(),
        first_available: Some(subs.clone()),
        ..DeviceRequest::default()
    };
    assert_eq!(
        devices_of(&world.commit(claim("c1", vec![nic()])).unwrap()),
        pairs(&[("nic/vf", "vf0")])
    );
    assert_eq!(
        devices_of(&world.commit(claim("c2", vec![nic()])).unwrap()),
        pairs(&[("nic/macvlan", "parent")])
    );
    assert_eq!(
        devices_of(&world.commit(claim("c3", vec![nic()])).unwrap()),
        pairs(&[("nic/macvlan", "parent")])
    );
    let err = world.allocate(&claim("c4", vec![nic()])).unwrap_err().to_string();
    assert!(
        err.contains("nic/vf")
            && err.contains("nic/macvlan")
            && err.contains("2 of 2 already consumed"),
        "{err}"
    );
}

#[test]
fn shared_device_is_allocated_up_to_its_capacity_with_distinct_share_ids() {
    let mut world = World::new(
        vec![shared("parent", "5", Some(default_one()))],
        vec![class("shared", &["device.allowMultipleAllocations"])],
    );
    let mut share_ids = Vec::new();
    for i in 0..5 {
        let result =
            world.commit(claim(&format!("c{i}"), vec![request("net", exact("shared"))])).unwrap();
        let entry = &result.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
        assert_eq!(entry.device, "parent");
        assert_eq!(
            entry.consumed_capacity,
            Some(BTreeMap::from([(
                "netclaim.dev/interfaces".to_owned(),
                ApiQuantity("1".to_owned())
            )]))
        );
        share_ids.push(entry.share_id.clone().unwrap());
    }
    share_ids.sort();
    share_ids.dedup();
    assert_eq!(share_ids.len(), 5);
    let err = world
        .allocate(&claim("c5", vec![request("net", exact("shared"))]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("5 of 5 already consumed"), "{err}");
    // A claim goes away: its share is free again.
    world.claims.remove(2);
    assert!(world.commit(claim("c5", vec![request("net", exact("shared"))])).is_ok());
    assert!(world.allocate(&claim("c6", vec![request("net", exact("shared"))])).is_err());
}

#[test]
fn requested_capacity_is_rounded_by_policy_and_checked() {
    let range = Some(CapacityRequestPolicy {
        default: Some(ApiQuantity("1Gi".to_owned())),
        valid_values: None,
        valid_range: Some(CapacityRequestPolicyRange {
            min: ApiQuantity("1Gi".to_owned()),
            max: Some(ApiQuantity("4Gi".to_owned())),
            step: Some(ApiQuantity("1Gi".to_owned())),
        }),
    });
    let mut world = World::new(vec![shared("mem", "8Gi", range)], vec![class("c", &["true"])]);
    let asking = |amount: &str| {
        let mut req = exact("c");
        req.capacity = Some(CapacityRequirements {
            requests: Some(BTreeMap::from([(
                "interfaces".to_owned(),
                ApiQuantity(amount.to_owned()),
            )])),
        });
        req
    };
    // 1.5Gi rounds up to 2Gi (min + 1 step).
    let result = world.commit(claim("c1", vec![request("r", asking("1536Mi"))])).unwrap();
    let consumed = result.devices.unwrap().results.unwrap()[0].consumed_capacity.clone().unwrap();
    assert_eq!(consumed["netclaim.dev/interfaces"].0, (2_u64 << 30).to_string());
    let over =
        world.allocate(&claim("c2", vec![request("r", asking("5Gi"))])).unwrap_err().to_string();
    assert!(over.contains("above the valid range's max"), "{over}");
    world.commit(claim("c3", vec![request("r", asking("4Gi"))])).unwrap();
    // 6Gi used of 8Gi; the default (1Gi) still fits twice, then no more.
    world.commit(claim("c4", vec![request("r", exact("c"))])).unwrap();
    world.commit(claim("c5", vec![request("r", exact("c"))])).unwrap();
    assert!(world.allocate(&claim("c6", vec![request("r", exact("c"))])).is_err());
    let unknown = world
        .allocate(&claim(
            "c7",
            vec![request("r", {
                let mut req = exact("c");
                req.capacity = Some(CapacityRequirements {
                    requests: Some(BTreeMap::from([(
                        "gpus".to_owned(),
                        ApiQuantity("1".to_owned()),
                    )])),
                });
                req
            })],
        ))
        .unwrap_err()
        .to_string();
    assert!(unknown.contains("has no capacity gpus"), "{unknown}");
}

#[test]
fn slot_devices_are_exclusive() {
    let slots: Vec<Device> = (0..3).map(|i| exclusive(&format!("eth0-s{i}"), "virtual")).collect();
    let mut world = World::new(
        slots,
        vec![class("slots", &[r#"device.attributes["netclaim.dev"].sharing == "exclusive""#])],
    );
    let mut seen = Vec::new();
    for i in 0..3 {
        let result =
            world.commit(claim(&format!("c{i}"), vec![request("net", exact("slots"))])).unwrap();
        let entry = &result.devices.as_ref().unwrap().results.as_ref().unwrap()[0];
        assert_eq!((entry.share_id.as_ref(), entry.consumed_capacity.as_ref()), (None, None));
        seen.push(entry.device.clone());
    }
    assert_eq!(seen, ["eth0-s0", "eth0-s1", "eth0-s2"]);
    assert!(world.allocate(&claim("c3", vec![request("net", exact("slots"))])).is_err());
}

#[test]
fn class_config_comes_before_claim_config() {
    let opaque = |tag: &str| OpaqueDeviceConfiguration {
        driver: DRIVER.to_owned(),
        parameters: RawExtension(serde_json::json!({ "tag": tag })),
    };
    let mut cls = class("nics", &["true"]);
    cls.spec.as_mut().unwrap().config = Some(vec![
        DeviceClassConfiguration { opaque: Some(opaque("class-1")) },
        DeviceClassConfiguration { opaque: Some(opaque("class-2")) },
    ]);
    let mut world =
        World::new(vec![exclusive("a", "physical"), exclusive("b", "physical")], vec![cls]);
    let mut c = claim("c1", vec![request("one", exact("nics")), request("two", exact("nics"))]);
    c.spec.as_mut().unwrap().devices.as_mut().unwrap().config = Some(vec![
        DeviceClaimConfiguration {
            requests: Some(vec!["two".to_owned()]),
            opaque: Some(opaque("claim-two")),
        },
        DeviceClaimConfiguration { requests: None, opaque: Some(opaque("claim-all")) },
    ]);
    let result = world.allocate(&c).unwrap();
    let config = result.devices.unwrap().config.unwrap();
    let summary: Vec<(String, Option<Vec<String>>, String)> = config
        .iter()
        .map(|e| {
            (
                e.source.clone(),
                e.requests.clone(),
                e.opaque.as_ref().unwrap().parameters.0["tag"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let r = |names: &[&str]| Some(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>());
    assert_eq!(
        summary,
        vec![
            ("FromClass".to_owned(), r(&["one"]), "class-1".to_owned()),
            ("FromClass".to_owned(), r(&["one"]), "class-2".to_owned()),
            ("FromClass".to_owned(), r(&["two"]), "class-1".to_owned()),
            ("FromClass".to_owned(), r(&["two"]), "class-2".to_owned()),
            ("FromClaim".to_owned(), r(&["two"]), "claim-two".to_owned()),
            ("FromClaim".to_owned(), None, "claim-all".to_owned()),
        ]
    );
}

#[test]
fn errors_name_the_request_class_and_expression() {
    let mut world = World::new(
        vec![exclusive("a", "physical")],
        vec![class("broken", &[r#"device.attributes["netclaim.dev"].nope == 1"#])],
    );
    let err = world
        .allocate(&claim("c1", vec![request("net", exact("broken"))]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("\"net\"") && err.contains("DeviceClass \"broken\"") && err.contains("nope"),
        "{err}"
    );
    let err = world.allocate(&claim("c2", vec![request("net", exact("missing"))])).unwrap_err();
    assert_eq!(
        err,
        AllocationError::UnknownClass { request: "net".to_owned(), class: "missing".to_owned() }
    );
    world.classes.push(class("ok", &["true"]));
    let mut req = exact("ok");
    req.selectors = Some(vec![selector("device.driver ==")]);
    let err = world.allocate(&claim("c3", vec![request("net", req)])).unwrap_err().to_string();
    assert!(err.contains("request selector") && err.contains("does not compile"), "{err}");
}
