//! Unit tests of pod placement across nodes (pure).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use serde_json::{Value, json};

use super::allocate::node_selector;
use super::schedule::{
    CANNOT_ALLOCATE, NOT_AVAILABLE_ON_NODE, NodeCandidate, PlacementError, SchedulingInput,
    assumed_claims, consumer_node, is_unbound, node_selector_matches, place,
};

const DRIVER: &str = "netclaim.dev";

fn from<T: serde::de::DeserializeOwned>(value: Value) -> T {
    serde_json::from_value(value).expect("test objects are well-formed")
}

/// A node's pool: a shared parent `uplink0` (capacity `interfaces`) and the exclusive NICs.
fn slice(node: &str, interfaces: u32, nics: &[&str]) -> ResourceSlice {
    let mut devices = vec![json!({
        "name": "uplink0",
        "attributes": {"ifName": {"string": "uplink0"}, "sharing": {"string": "shared"}},
        "allowMultipleAllocations": true,
        "capacity": {"interfaces": {"value": interfaces.to_string(), "requestPolicy": {
            "default": "1", "validValues": ["1"]}}},
    })];
    for nic in nics {
        devices.push(json!({
            "name": nic,
            "attributes": {"ifName": {"string": nic}, "sharing": {"string": "exclusive"}},
        }));
    }
    from(json!({
        "metadata": {"name": format!("{node}-slice")},
        "spec": {"driver": DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }))
}

fn class(name: &str, sharing: &str) -> DeviceClass {
    from(json!({
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.attributes[\"{DRIVER}\"].sharing == \"{sharing}\"")}}]},
    }))
}

fn classes() -> Vec<DeviceClass> {
    vec![class("shared", "shared"), class("nic", "exclusive")]
}

fn template(name: &str, class: &str) -> ResourceClaimTemplate {
    from(json!({
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "net", "exactly": {"deviceClassName": class}}]}}},
    }))
}

fn claim(name: &str, class: &str) -> ResourceClaim {
    from(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid")},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": class}}]}},
    }))
}

/// A pod using `template` (or the claim `claim:<name>`) for its entry `net`.
fn pod(name: &str, source: &str, node: Option<&str>) -> Pod {
    let entry = match source.strip_prefix("claim:") {
        Some(claim) => json!({"name": "net", "resourceClaimName": claim}),
        None => json!({"name": "net", "resourceClaimTemplateName": source}),
    };
    from(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("{name}-uid")},
        "spec": {"nodeName": node, "containers": [{"name": "app"}], "resourceClaims": [entry]},
    }))
}

fn nodes(names: &[&str]) -> Vec<NodeCandidate> {
    names.iter().map(|n| NodeCandidate::named(n)).collect()
}

struct World {
    nodes: Vec<NodeCandidate>,
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    claims: Vec<ResourceClaim>,
    templates: Vec<ResourceClaimTemplate>,
    pods: Vec<Pod>,
    assumed: Vec<ResourceClaim>,
    shares: u32,
}

impl World {
    fn new(nodes_: &[&str], slices: Vec<ResourceSlice>) -> Self {
        Self {
            nodes: nodes(nodes_),
            slices,
            classes: classes(),
            claims: Vec::new(),
            templates: vec![template("shared-net", "shared"), template("nic-net", "nic")],
            pods: Vec::new(),
            assumed: Vec::new(),
            shares: 0,
        }
    }

    fn input(&self) -> SchedulingInput<'_> {
        SchedulingInput {
            nodes: &self.nodes,
            slices: &self.slices,
            classes: &self.classes,
            claims: &self.claims,
            templates: &self.templates,
            pods: &self.pods,
        }
    }

    /// Places `pod` as the controller's pass does: binds it and keeps its tentative claims.
    fn schedule(&mut self, mut pod: Pod) -> Result<String, PlacementError> {
        let mut shares = self.shares;
        let result = place(&self.input(), &pod, &self.assumed, &mut || {
            shares += 1;
            format!("share-{shares}")
        });
        self.shares = shares;
        let placement = result?;
        pod.spec.as_mut().expect("test pods have a spec").node_name = Some(placement.node.clone());
        self.pods.push(pod);
        self.assumed.extend(placement.assumed);
        Ok(placement.node)
    }
}

#[test]
fn pods_spread_over_equal_nodes_least_loaded_first() {
    let mut world = World::new(
        &["node-1", "node-2"],
        vec![slice("node-1", 256, &[]), slice("node-2", 256, &[])],
    );
    let placed: Vec<String> = (0..5)
        .map(|i| world.schedule(pod(&format!("p{i}"), "shared-net", None)).unwrap())
        .collect();
    assert_eq!(placed, ["node-1", "node-2", "node-1", "node-2", "node-1"]);

    // A node already carrying more pods is passed over until the loads are even.
    let mut world = World::new(
        &["node-1", "node-2"],
        vec![slice("node-1", 256, &[]), slice("node-2", 256, &[])],
    );
    world.pods = (0..3).map(|i| pod(&format!("old{i}"), "shared-net", Some("node-1"))).collect();
    let placed: Vec<String> = (0..4)
        .map(|i| world.schedule(pod(&format!("p{i}"), "shared-net", None)).unwrap())
        .collect();
    assert_eq!(placed, ["node-2", "node-2", "node-2", "node-1"]);
}

#[test]
fn finished_pods_do_not_count_as_load() {
    let mut world = World::new(
        &["node-1", "node-2"],
        vec![slice("node-1", 256, &[]), slice("node-2", 256, &[])],
    );
    let mut done = pod("done", "shared-net", Some("node-1"));
    done.status = Some(from(json!({"phase": "Succeeded"})));
    world.pods.push(done);
    assert_eq!(world.schedule(pod("p", "shared-net", None)).unwrap(), "node-1");
}

#[test]
fn a_pod_goes_where_its_claims_fit_and_an_exclusive_device_is_taken_once() {
    // Only node-2 has an exclusive NIC.
    let mut world = World::new(
        &["node-1", "node-2"],
        vec![slice("node-1", 256, &[]), slice("node-2", 256, &["eth1"])],
    );
    world.pods.push(pod("busy", "shared-net", Some("node-2")));
    assert_eq!(world.schedule(pod("nic-a", "nic-net", None)).unwrap(), "node-2");
    // eth1 is held by nic-a's tentative claim: nothing is left for a second NIC pod.
    let error = world.schedule(pod("nic-b", "nic-net", None)).unwrap_err();
    let PlacementError::Unschedulable { reasons } = &error else { panic!("{error:?}") };
    assert_eq!(reasons.len(), 2, "{error}");
    assert_eq!((reasons[0].node.as_str(), reasons[0].reason), ("node-1", CANNOT_ALLOCATE));
    assert!(reasons[0].detail.contains("cannot be satisfied"), "{error}");
    assert_eq!(reasons[1].node, "node-2");
    assert!(reasons[1].detail.contains("eth1: allocated to another claim"), "{error}");
    // kube-scheduler's sentence first, then each node's reason.
    let message = error.to_string();
    assert!(
        message.starts_with("0/2 nodes are available: 2 cannot allocate all claims. Per node: node-1: claim nic-b-net: "),
        "{message}"
    );
    assert!(message.contains("; node-2: claim nic-b-net: "), "{message}");
}

#[test]
fn rejections_are_counted_per_reason_as_kube_scheduler_words_them() {
    let mut world = World::new(
        &["node-1", "node-2", "node-3"],
        vec![slice("node-1", 256, &[]), slice("node-2", 256, &[]), slice("node-3", 256, &[])],
    );
    // Allocated for node-3 only, and one more claim no node can satisfy.
    let mut pinned = claim("pinned", "shared");
    pinned.status = Some(from(json!({"allocation": {
        "devices": {"results": [{"request": "net", "driver": DRIVER, "pool": "node-3",
                                  "device": "uplink0", "shareID": "s1",
                                  "consumedCapacity": {"interfaces": "1"}}]},
        "nodeSelector": node_selector("node-3"),
    }})));
    world.claims.extend([pinned, claim("nic", "nic")]);
    let mut both = pod("p", "claim:pinned", None);
    both.spec
        .as_mut()
        .unwrap()
        .resource_claims
        .as_mut()
        .unwrap()
        .push(from(json!({"name": "nic", "resourceClaimName": "nic"})));
    let error = world.schedule(both).unwrap_err();
    let PlacementError::Unschedulable { reasons } = &error else { panic!("{error:?}") };
    let got: Vec<_> = reasons.iter().map(|r| (r.node.as_str(), r.reason)).collect();
    assert_eq!(
        got,
        [
            ("node-1", NOT_AVAILABLE_ON_NODE),
            ("node-2", NOT_AVAILABLE_ON_NODE),
            ("node-3", CANNOT_ALLOCATE)
        ]
    );
    assert!(
        error.to_string().starts_with(
            "0/3 nodes are available: 1 cannot allocate all claims, 2 resourceclaim not available on the node. Per node: node-1: claim pinned is allocated for another node; "
        ),
        "{error}"
    );
    let none = World::new(&[], Vec::new()).schedule(pod("q", "shared-net", None)).unwrap_err();
    assert_eq!(none.to_string(), "no nodes available to schedule pods");
}

#[test]
fn a_missing_device_class_rejects_the_pod_before_any_node_is_tried() {
    let mut world = World::new(&["node-1"], vec![slice("node-1", 256, &[])]);
    world.templates.push(template("ghost-net", "ghost"));
    let error = world.schedule(pod("p", "ghost-net", None)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "0/1 nodes are available: request net: device class ghost does not exist. \
         The request is in ResourceClaimTemplate ghost-net in namespace default."
    );
    // A subrequest of firstAvailable is named `<main>/<sub>`; an allocated claim's class is
    // not looked at (kube-scheduler checks only the claims it allocates).
    world.claims.push(from(json!({
        "metadata": {"name": "alt", "namespace": "default", "uid": "alt-uid"},
        "spec": {"devices": {"requests": [{"name": "net", "firstAvailable": [
            {"name": "fast", "deviceClassName": "shared"},
            {"name": "slow", "deviceClassName": "gone"}]}]}},
    })));
    let error = world.schedule(pod("q", "claim:alt", None)).unwrap_err();
    assert!(
        matches!(&error, PlacementError::MissingClass { request, class, .. } if request == "net/slow" && class == "gone"),
        "{error:?}"
    );
    world.classes.push(class("ghost", "shared"));
    assert_eq!(world.schedule(pod("p", "ghost-net", None)).unwrap(), "node-1");
}

#[test]
fn an_allocated_claim_pins_its_pod_to_the_claim_s_node() {
    let mut world = World::new(
        &["node-1", "node-2"],
        vec![slice("node-1", 256, &[]), slice("node-2", 256, &[])],
    );
    let mut allocated = claim("pinned", "shared");
    allocated.status = Some(from(json!({"allocation": {
        "devices": {"results": [{"request": "net", "driver": DRIVER, "pool": "node-2",
                                  "device": "uplink0", "shareID": "s1",
                                  "consumedCapacity": {"interfaces": "1"}}]},
        "nodeSelector": node_selector("node-2"),
    }})));
    world.claims.push(allocated);
    assert_eq!(world.schedule(pod("p", "claim:pinned", None)).unwrap(), "node-2");
    // An unallocated named claim is allocated tentatively like a template's.
    world.claims.push(claim("free", "shared"));
    assert_eq!(world.schedule(pod("q", "claim:free", None)).unwrap(), "node-1");
}

#[test]
fn missing_claims_and_templates_are_waited_for_and_bad_entries_named() {
    let world = World::new(&["node-1"], vec![slice("node-1", 256, &[])]);
    let error = place(&world.input(), &pod("p", "nope", None), &[], &mut String::new).unwrap_err();
    assert_eq!(
        error,
        PlacementError::Waiting("ResourceClaimTemplate default/nope does not exist".to_owned())
    );
    let error =
        place(&world.input(), &pod("p", "claim:gone", None), &[], &mut String::new).unwrap_err();
    assert!(matches!(&error, PlacementError::Waiting(m) if m.contains("default/gone")), "{error}");
    let mut bad = pod("p", "shared-net", None);
    bad.spec.as_mut().unwrap().resource_claims.as_mut().unwrap()[0].resource_claim_name =
        Some("both".to_owned());
    let error = place(&world.input(), &bad, &[], &mut String::new).unwrap_err();
    assert!(error.to_string().contains("spec.resourceClaims[0]"), "{error}");
}

#[test]
fn a_pod_without_claims_still_spreads() {
    let mut world = World::new(&["node-1", "node-2"], Vec::new());
    let bare: Pod = from(json!({
        "metadata": {"name": "bare", "namespace": "default", "uid": "bare-uid"},
        "spec": {"containers": [{"name": "app"}]},
    }));
    assert_eq!(world.schedule(bare.clone()).unwrap(), "node-1");
    assert_eq!(world.schedule(bare).unwrap(), "node-2");
}

#[test]
fn template_claims_of_bound_pods_hold_their_devices_until_they_exist() {
    let mut world = World::new(&["node-1"], vec![slice("node-1", 256, &["eth1"])]);
    world.pods.push(pod("bound", "nic-net", Some("node-1")));
    let assumed = assumed_claims(&world.input(), &mut String::new);
    assert_eq!(assumed.len(), 1);
    world.assumed = assumed;
    let error = world.schedule(pod("next", "nic-net", None)).unwrap_err();
    assert!(error.to_string().contains("eth1: allocated to another claim"), "{error}");

    // Once the bound pod's claim exists (recorded in its status), it is not assumed again.
    let mut made = claim("bound-net-x", "nic");
    made.metadata.owner_references = Some(vec![from(json!({
        "apiVersion": "v1", "kind": "Pod", "name": "bound", "uid": "bound-uid",
        "controller": true}))]);
    made.metadata.annotations = Some(BTreeMap::from([(
        super::schedule::POD_CLAIM_NAME_ANNOTATION.to_owned(),
        "net".to_owned(),
    )]));
    world.claims.push(made);
    assert!(assumed_claims(&world.input(), &mut String::new).is_empty());
}

#[test]
fn a_claim_is_allocated_for_the_node_of_the_bound_pod_using_it() {
    let mut named = claim("named", "shared");
    let pods =
        vec![pod("unbound", "claim:named", None), pod("bound", "claim:named", Some("node-2"))];
    assert_eq!(consumer_node(&named, &pods), Some("node-2"));
    named.metadata.namespace = Some("other".to_owned());
    assert_eq!(consumer_node(&named, &pods), None, "pods of another namespace do not count");

    // Recorded in the status, or owned as controller.
    let generated = claim("p-net-abcde", "shared");
    let mut recorded = pod("p", "shared-net", Some("node-1"));
    recorded.status = Some(from(
        json!({"resourceClaimStatuses": [{"name": "net", "resourceClaimName": "p-net-abcde"}]}),
    ));
    assert_eq!(consumer_node(&generated, &[recorded]), Some("node-1"));
    let mut owned = claim("q-net-abcde", "shared");
    owned.metadata.owner_references = Some(vec![from(json!({
        "apiVersion": "v1", "kind": "Pod", "name": "q", "uid": "q-uid", "controller": true}))]);
    assert_eq!(consumer_node(&owned, &[pod("q", "shared-net", Some("node-3"))]), Some("node-3"));
    assert_eq!(consumer_node(&owned, &[pod("q", "shared-net", None)]), None);
}

#[test]
fn unbound_means_no_node_not_deleted_not_finished() {
    assert!(is_unbound(&pod("p", "t", None)));
    assert!(is_unbound(&pod("p", "t", Some(""))));
    assert!(!is_unbound(&pod("p", "t", Some("node-1"))));
    let mut failed = pod("p", "t", None);
    failed.status = Some(from(json!({"phase": "Failed"})));
    assert!(!is_unbound(&failed));
}

#[test]
fn node_selectors_match_names_and_labels() {
    let node = NodeCandidate {
        name: "node-1".to_owned(),
        labels: BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), "node-1".to_owned()),
            ("rack".to_owned(), "7".to_owned()),
        ]),
    };
    assert!(node_selector_matches(&node_selector("node-1"), &node));
    assert!(!node_selector_matches(&node_selector("node-2"), &node));
    let selector = |terms: Value| -> NodeSelector { from(json!({"nodeSelectorTerms": terms})) };
    let by_labels = selector(json!([{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-1", "node-9"]},
        {"key": "rack", "operator": "Gt", "values": ["5"]},
        {"key": "gpu", "operator": "DoesNotExist"},
    ]}]));
    assert!(node_selector_matches(&by_labels, &node));
    let ored = selector(json!([
        {"matchExpressions": [{"key": "rack", "operator": "Lt", "values": ["5"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node-2"]}]},
    ]));
    assert!(node_selector_matches(&ored, &node));
    assert!(!node_selector_matches(&selector(json!([{}])), &node), "an empty term matches nothing");
    let unknown_field = selector(json!([{"matchFields": [
        {"key": "spec.unschedulable", "operator": "In", "values": ["false"]}]}]));
    assert!(!node_selector_matches(&unknown_field, &node));
}
