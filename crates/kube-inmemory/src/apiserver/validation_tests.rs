//! Table tests of the limits in protocols.md §3.1 (`ResourceSlice`) and §3.3 (`ResourceClaim`
//! status), with a few §3.2 spec rules: for every limit one accepted case (at the limit) and
//! one rejected case (past it) naming the field path the server must report.

use serde_json::{Value, json};

use super::resources::built_in_resource as lookup;
use super::validation::validate;

type Mutate = fn(&mut Value);
/// (case name, mutation of the base object, field path of the expected error or None).
type Case<'a> = (&'a str, &'a dyn Fn(&mut Value), Option<&'a str>);

fn slice() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "node-1-netclaim.dev-0"},
        "spec": {
            "driver": "netclaim.dev",
            "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1},
            "nodeName": "node-1",
            "devices": [{
                "name": "eth1",
                "attributes": {"ifName": {"string": "eth1"}},
                "capacity": {"netclaim.dev/interfaces": {"value": "256"}},
            }],
        },
    })
}

fn claim() -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "net", "exactly": {"deviceClassName": "netclaim"}}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "net", "driver": "netclaim.dev", "pool": "node-1", "device": "eth1"},
                {"request": "net", "driver": "netclaim.dev", "pool": "node-1", "device": "eth2", "shareID": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"},
            ]}},
            "devices": [{"driver": "netclaim.dev", "pool": "node-1", "device": "eth1"}],
        },
    })
}

fn dev0(v: &mut Value) -> &mut Value {
    &mut v["spec"]["devices"][0]
}

fn st0(v: &mut Value) -> &mut Value {
    &mut v["status"]["devices"][0]
}

fn devices(n: usize, extra: &Value) -> Value {
    Value::Array(
        (0..n)
            .map(|i| {
                let mut d = json!({"name": format!("dev{i}")});
                if let (Some(d), Some(e)) = (d.as_object_mut(), extra.as_object()) {
                    d.extend(e.clone());
                }
                d
            })
            .collect(),
    )
}

fn attrs(n: usize) -> Value {
    Value::Object((0..n).map(|i| (format!("a{i}"), json!({"int": i}))).collect())
}

fn caps(n: usize) -> Value {
    Value::Object((0..n).map(|i| (format!("netclaim.dev/c{i}"), json!({"value": "1"}))).collect())
}

fn strings(n: usize, prefix: &str) -> Value {
    Value::Array((0..n).map(|i| json!(format!("{prefix}{i}"))).collect())
}

fn taints(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!({"key": format!("k{i}"), "effect": "NoSchedule"})).collect())
}

fn counter_sets(n: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"name": format!("set{i}"), "counters": {"mem": {"value": "1"}}}))
            .collect(),
    )
}

fn ips(n: usize) -> Value {
    Value::Array((0..n).map(|i| json!(format!("10.0.0.{}/24", i + 1))).collect())
}

fn set_policy(v: &mut Value, policy: Value) {
    dev0(v)["allowMultipleAllocations"] = json!(true);
    dev0(v)["capacity"]["netclaim.dev/interfaces"]["requestPolicy"] = policy;
}

fn data_of_len(total: usize) -> Value {
    // `{"k":"..."}` serialises to 8 bytes plus the string.
    json!({"k": "x".repeat(total - 8)})
}

/// (name, mutation, expected: None = valid, Some(field) = rejected at that field path)
fn run(base: fn() -> Value, kind: (&str, &str), cases: &[Case<'_>]) {
    let resource = lookup(kind.0, "v1", kind.1).unwrap();
    let mut failures = Vec::new();
    for (name, mutate, expect) in cases {
        let mut obj = base();
        mutate(&mut obj);
        let errs = validate(&resource, &obj, None);
        match expect {
            None if !errs.is_empty() => {
                failures.push(format!("{name}: expected valid, got {errs:?}"));
            }
            Some(field) if !errs.iter().any(|e| e.field == *field) => {
                failures.push(format!("{name}: expected an error at {field}, got {errs:?}"));
            }
            _ => {}
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
#[allow(clippy::too_many_lines, reason = "one table row per documented limit")]
fn resource_slice_limits() {
    let cases: Vec<Case<'_>> = vec![
        ("base slice is valid", &|_| {}, None),
        (
            "spec required",
            &|v| {
                v.as_object_mut().unwrap().remove("spec");
            },
            Some("spec"),
        ),
        // driver: DNS subdomain, ≤ 63, lowercase
        (
            "driver 63 chars",
            &|v| v["spec"]["driver"] = json!(format!("{}.dev", "d".repeat(59))),
            None,
        ),
        (
            "driver 64 chars",
            &|v| v["spec"]["driver"] = json!(format!("{}.dev", "d".repeat(60))),
            Some("spec.driver"),
        ),
        ("driver uppercase", &|v| v["spec"]["driver"] = json!("Netclaim.dev"), Some("spec.driver")),
        (
            "driver missing",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("driver");
            },
            Some("spec.driver"),
        ),
        // pool required; name ≤ 253, DNS subdomains separated by '/'
        (
            "pool required",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("pool");
            },
            Some("spec.pool"),
        ),
        (
            "pool name with slashes",
            &|v| v["spec"]["pool"]["name"] = json!("zone-a/rack.1/node-1"),
            None,
        ),
        (
            "pool name 253 chars",
            &|v| {
                v["spec"]["pool"]["name"] = json!(format!(
                    "{}/{}/{}/{}",
                    "a".repeat(63),
                    "b".repeat(63),
                    "c".repeat(63),
                    "d".repeat(61)
                ));
            },
            None,
        ),
        (
            "pool name 254 chars",
            &|v| {
                v["spec"]["pool"]["name"] = json!(format!(
                    "{}/{}/{}/{}",
                    "a".repeat(63),
                    "b".repeat(63),
                    "c".repeat(63),
                    "d".repeat(62)
                ));
            },
            Some("spec.pool.name"),
        ),
        (
            "pool name empty segment",
            &|v| v["spec"]["pool"]["name"] = json!("a//b"),
            Some("spec.pool.name"),
        ),
        (
            "pool name uppercase",
            &|v| v["spec"]["pool"]["name"] = json!("Node-1"),
            Some("spec.pool.name"),
        ),
        // resourceSliceCount > 0
        ("slice count 1", &|v| v["spec"]["pool"]["resourceSliceCount"] = json!(1), None),
        (
            "slice count 0",
            &|v| v["spec"]["pool"]["resourceSliceCount"] = json!(0),
            Some("spec.pool.resourceSliceCount"),
        ),
        ("generation 0", &|v| v["spec"]["pool"]["generation"] = json!(0), None),
        (
            "generation negative",
            &|v| v["spec"]["pool"]["generation"] = json!(-1),
            Some("spec.pool.generation"),
        ),
        // exactly one of nodeName, nodeSelector, allNodes, perDeviceNodeSelection
        (
            "allNodes only",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("nodeName");
                v["spec"]["allNodes"] = json!(true);
            },
            None,
        ),
        (
            "nodeSelector one term",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("nodeName");
                v["spec"]["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]});
            },
            None,
        ),
        (
            "nodeSelector two terms",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("nodeName");
                v["spec"]["nodeSelector"] = json!({"nodeSelectorTerms": [{}, {}]});
            },
            Some("spec.nodeSelector.nodeSelectorTerms"),
        ),
        (
            "no node selection",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("nodeName");
            },
            Some("spec"),
        ),
        ("nodeName and allNodes", &|v| v["spec"]["allNodes"] = json!(true), Some("spec")),
        // devices ≤ 128
        ("128 devices", &|v| v["spec"]["devices"] = devices(128, &json!({})), None),
        ("129 devices", &|v| v["spec"]["devices"] = devices(129, &json!({})), Some("spec.devices")),
        // ≤ 64 when a device uses taints or consumes counters
        (
            "64 devices with taints",
            &|v| v["spec"]["devices"] = devices(64, &json!({"taints": taints(1)})),
            None,
        ),
        (
            "65 devices with taints",
            &|v| v["spec"]["devices"] = devices(65, &json!({"taints": taints(1)})),
            Some("spec.devices"),
        ),
        (
            "65 devices consuming counters",
            &|v| {
                v["spec"]["devices"] = devices(
                    65,
                    &json!({"consumesCounters": [{"counterSet": "s", "counters": {"mem": {"value": "1"}}}]}),
                );
            },
            Some("spec.devices"),
        ),
        // devices or sharedCounters; ≤ 8 sets; set name DNS label; ≤ 32 counters
        (
            "8 counter sets",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("devices");
                v["spec"]["sharedCounters"] = counter_sets(8);
            },
            None,
        ),
        (
            "9 counter sets",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("devices");
                v["spec"]["sharedCounters"] = counter_sets(9);
            },
            Some("spec.sharedCounters"),
        ),
        (
            "devices and sharedCounters",
            &|v| v["spec"]["sharedCounters"] = counter_sets(1),
            Some("spec"),
        ),
        (
            "counter set name not a label",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("devices");
                v["spec"]["sharedCounters"] =
                    json!([{"name": "Set_0", "counters": {"mem": {"value": "1"}}}]);
            },
            Some("spec.sharedCounters[0].name"),
        ),
        (
            "32 counters",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("devices");
                v["spec"]["sharedCounters"] = json!([{"name": "s", "counters": (0..32).map(|i| (format!("c{i}"), json!({"value": "1"}))).collect::<serde_json::Map<_, _>>()}]);
            },
            None,
        ),
        (
            "33 counters",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("devices");
                v["spec"]["sharedCounters"] = json!([{"name": "s", "counters": (0..33).map(|i| (format!("c{i}"), json!({"value": "1"}))).collect::<serde_json::Map<_, _>>()}]);
            },
            Some("spec.sharedCounters[0].counters"),
        ),
        // device name: DNS label ≤ 63, unique
        ("device name 63", &|v| dev0(v)["name"] = json!("a".repeat(63)), None),
        (
            "device name 64",
            &|v| dev0(v)["name"] = json!("a".repeat(64)),
            Some("spec.devices[0].name"),
        ),
        (
            "device name uppercase",
            &|v| dev0(v)["name"] = json!("Eth1"),
            Some("spec.devices[0].name"),
        ),
        ("device name dot", &|v| dev0(v)["name"] = json!("eth1.100"), Some("spec.devices[0].name")),
        (
            "duplicate device names",
            &|v| v["spec"]["devices"] = json!([{"name": "a"}, {"name": "a"}]),
            Some("spec.devices[1].name"),
        ),
        // attributes + capacity ≤ 32
        (
            "16 attributes + 16 capacities",
            &|v| {
                dev0(v)["attributes"] = attrs(16);
                dev0(v)["capacity"] = caps(16);
            },
            None,
        ),
        (
            "17 attributes + 16 capacities",
            &|v| {
                dev0(v)["attributes"] = attrs(17);
                dev0(v)["capacity"] = caps(16);
            },
            Some("spec.devices[0].attributes"),
        ),
        // consumesCounters ≤ 2
        (
            "2 counter consumptions",
            &|v| {
                dev0(v)["consumesCounters"] = json!([{"counterSet": "a", "counters": {}}, {"counterSet": "b", "counters": {}}]);
            },
            None,
        ),
        (
            "3 counter consumptions",
            &|v| dev0(v)["consumesCounters"] = json!([{"counterSet": "a", "counters": {}}, {"counterSet": "b", "counters": {}}, {"counterSet": "c", "counters": {}}]),
            Some("spec.devices[0].consumesCounters"),
        ),
        // per-device node selection only with perDeviceNodeSelection
        (
            "per-device nodeName with perDeviceNodeSelection",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("nodeName");
                v["spec"]["perDeviceNodeSelection"] = json!(true);
                dev0(v)["nodeName"] = json!("node-1");
            },
            None,
        ),
        (
            "per-device nodeName without perDeviceNodeSelection",
            &|v| dev0(v)["nodeName"] = json!("node-1"),
            Some("spec.devices[0]"),
        ),
        (
            "perDeviceNodeSelection but device has none",
            &|v| {
                v["spec"].as_object_mut().unwrap().remove("nodeName");
                v["spec"]["perDeviceNodeSelection"] = json!(true);
            },
            Some("spec.devices[0]"),
        ),
        // taints ≤ 16, effects
        ("16 taints", &|v| dev0(v)["taints"] = taints(16), None),
        ("17 taints", &|v| dev0(v)["taints"] = taints(17), Some("spec.devices[0].taints")),
        (
            "taint effect None",
            &|v| dev0(v)["taints"] = json!([{"key": "k", "effect": "None"}]),
            None,
        ),
        (
            "taint effect unknown",
            &|v| dev0(v)["taints"] = json!([{"key": "k", "effect": "PreferNoSchedule"}]),
            Some("spec.devices[0].taints[0].effect"),
        ),
        // binding conditions ≤ 4 each, both or neither, no overlap
        (
            "4 + 4 binding conditions",
            &|v| {
                dev0(v)["bindingConditions"] = strings(4, "ok");
                dev0(v)["bindingFailureConditions"] = strings(4, "fail");
            },
            None,
        ),
        (
            "5 binding conditions",
            &|v| {
                dev0(v)["bindingConditions"] = strings(5, "ok");
                dev0(v)["bindingFailureConditions"] = strings(1, "fail");
            },
            Some("spec.devices[0].bindingConditions"),
        ),
        (
            "5 binding failure conditions",
            &|v| {
                dev0(v)["bindingConditions"] = strings(1, "ok");
                dev0(v)["bindingFailureConditions"] = strings(5, "fail");
            },
            Some("spec.devices[0].bindingFailureConditions"),
        ),
        (
            "binding conditions without failure conditions",
            &|v| dev0(v)["bindingConditions"] = strings(1, "ok"),
            Some("spec.devices[0].bindingFailureConditions"),
        ),
        (
            "overlapping binding conditions",
            &|v| {
                dev0(v)["bindingConditions"] = strings(1, "x");
                dev0(v)["bindingFailureConditions"] = strings(1, "x");
            },
            Some("spec.devices[0].bindingFailureConditions"),
        ),
        // attribute: exactly one member; string ≤ 64; version semver ≤ 64
        (
            "attribute two members",
            &|v| dev0(v)["attributes"]["ifName"] = json!({"string": "eth1", "int": 1}),
            Some("spec.devices[0].attributes[ifName]"),
        ),
        (
            "attribute no member",
            &|v| dev0(v)["attributes"]["ifName"] = json!({}),
            Some("spec.devices[0].attributes[ifName]"),
        ),
        (
            "string 64 chars",
            &|v| dev0(v)["attributes"]["ifName"] = json!({"string": "s".repeat(64)}),
            None,
        ),
        (
            "string 65 chars",
            &|v| dev0(v)["attributes"]["ifName"] = json!({"string": "s".repeat(65)}),
            Some("spec.devices[0].attributes[ifName].string"),
        ),
        (
            "semver with pre-release and build",
            &|v| dev0(v)["attributes"]["fw"] = json!({"version": "1.2.3-rc.1+build.5"}),
            None,
        ),
        (
            "not semver",
            &|v| dev0(v)["attributes"]["fw"] = json!({"version": "1.2"}),
            Some("spec.devices[0].attributes[fw].version"),
        ),
        (
            "semver leading zero",
            &|v| dev0(v)["attributes"]["fw"] = json!({"version": "1.02.3"}),
            Some("spec.devices[0].attributes[fw].version"),
        ),
        (
            "version 65 chars",
            &|v| {
                dev0(v)["attributes"]["fw"] =
                    json!({"version": format!("1.2.3-{}", "a".repeat(59))});
            },
            Some("spec.devices[0].attributes[fw].version"),
        ),
        // list attributes: non-empty, ≤ 48 values per device
        (
            "48 list values",
            &|v| dev0(v)["attributes"] = json!({"a": {"ints": (0..24).collect::<Vec<_>>()}, "b": {"strings": strings(24, "s")}}),
            None,
        ),
        (
            "49 list values",
            &|v| dev0(v)["attributes"] = json!({"a": {"ints": (0..25).collect::<Vec<_>>()}, "b": {"strings": strings(24, "s")}}),
            Some("spec.devices[0].attributes"),
        ),
        (
            "empty list attribute",
            &|v| dev0(v)["attributes"] = json!({"a": {"ints": []}}),
            Some("spec.devices[0].attributes[a].ints"),
        ),
        // QualifiedName: C identifier ≤ 32 or <DNS subdomain ≤ 63>/<C identifier ≤ 32>
        (
            "qualified with domain",
            &|v| dev0(v)["attributes"] = json!({"netclaim.dev/ifName": {"string": "x"}}),
            None,
        ),
        (
            "identifier 32 chars",
            &|v| dev0(v)["attributes"] = json!({"a".repeat(32): {"string": "x"}}),
            None,
        ),
        (
            "identifier 33 chars",
            &|v| dev0(v)["attributes"] = json!({"a".repeat(33): {"string": "x"}}),
            Some(&*Box::leak(
                format!("spec.devices[0].attributes[{}]", "a".repeat(33)).into_boxed_str(),
            )),
        ),
        (
            "identifier with dash",
            &|v| dev0(v)["attributes"] = json!({"if-name": {"string": "x"}}),
            Some("spec.devices[0].attributes[if-name]"),
        ),
        (
            "domain 64 chars",
            &|v| {
                dev0(v)["attributes"] =
                    json!({format!("{}.io/x", "d".repeat(61)): {"string": "x"}});
            },
            Some(&*Box::leak(
                format!("spec.devices[0].attributes[{}.io/x]", "d".repeat(61)).into_boxed_str(),
            )),
        ),
        // request policy only with allowMultipleAllocations; default/validValues/validRange rules
        (
            "policy with allowMultipleAllocations",
            &|v| {
                set_policy(
                    v,
                    json!({"default": "1", "validRange": {"min": "1", "max": "256", "step": "1"}}),
                );
            },
            None,
        ),
        (
            "policy without allowMultipleAllocations",
            &|v| {
                dev0(v)["capacity"]["netclaim.dev/interfaces"]["requestPolicy"] =
                    json!({"default": "1"});
            },
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy"),
        ),
        (
            "validValues without default",
            &|v| set_policy(v, json!({"validValues": ["1", "2"]})),
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy.default"),
        ),
        (
            "10 valid values",
            &|v| {
                set_policy(
                    v,
                    json!({"default": "1", "validValues": (1..=10).map(|i| i.to_string()).collect::<Vec<_>>()}),
                );
            },
            None,
        ),
        (
            "11 valid values",
            &|v| {
                set_policy(
                    v,
                    json!({"default": "1", "validValues": (1..=11).map(|i| i.to_string()).collect::<Vec<_>>()}),
                );
            },
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy.validValues"),
        ),
        (
            "valid values not ascending",
            &|v| set_policy(v, json!({"default": "1", "validValues": ["2", "1"]})),
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy.validValues"),
        ),
        (
            "default not in valid values",
            &|v| set_policy(v, json!({"default": "3", "validValues": ["1", "2"]})),
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy.default"),
        ),
        (
            "validValues and validRange",
            &|v| {
                set_policy(
                    v,
                    json!({"default": "1", "validValues": ["1"], "validRange": {"min": "1"}}),
                );
            },
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy"),
        ),
        (
            "range without min",
            &|v| set_policy(v, json!({"default": "1", "validRange": {"max": "2"}})),
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy.validRange.min"),
        ),
        (
            "range min above value",
            &|v| set_policy(v, json!({"default": "1", "validRange": {"min": "257"}})),
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy.validRange.min"),
        ),
        (
            "range max above value",
            &|v| {
                set_policy(v, json!({"default": "1", "validRange": {"min": "0", "max": "1Ki"}}));
            },
            Some("spec.devices[0].capacity[netclaim.dev/interfaces].requestPolicy.validRange.max"),
        ),
    ];
    run(slice, ("resource.k8s.io", "resourceslices"), &cases);
}

#[test]
fn resource_slice_immutable_fields() {
    let r = lookup("resource.k8s.io", "v1", "resourceslices").unwrap();
    let old = slice();
    let mutations: [(&str, Mutate); 3] = [
        ("spec.driver", |v| v["spec"]["driver"] = json!("other.dev")),
        ("spec.pool.name", |v| {
            v["spec"]["pool"]["name"] = json!("node-2");
        }),
        ("spec.nodeName", |v| v["spec"]["nodeName"] = json!("node-2")),
    ];
    for (field, mutate) in mutations {
        let mut new = old.clone();
        mutate(&mut new);
        let errs = validate(&r, &new, Some(&old));
        assert!(errs.iter().any(|e| e.field == field), "{field}: {errs:?}");
    }
    let mut bumped = old.clone();
    bumped["spec"]["pool"]["generation"] = json!(2);
    assert!(validate(&r, &bumped, Some(&old)).is_empty());
}

#[test]
#[allow(clippy::too_many_lines, reason = "one table row per documented limit")]
fn resource_claim_status_limits() {
    let cases: Vec<Case<'_>> = vec![
        ("base claim is valid", &|_| {}, None),
        // reservedFor ≤ 256, key uid
        (
            "256 consumers",
            &|v| {
                v["status"]["reservedFor"] = Value::Array((0..256).map(|i| json!({"resource": "pods", "name": format!("p{i}"), "uid": format!("u{i}")})).collect());
            },
            None,
        ),
        (
            "257 consumers",
            &|v| {
                v["status"]["reservedFor"] = Value::Array((0..257).map(|i| json!({"resource": "pods", "name": format!("p{i}"), "uid": format!("u{i}")})).collect());
            },
            Some("status.reservedFor"),
        ),
        (
            "duplicate consumer uid",
            &|v| v["status"]["reservedFor"] = json!([{"resource": "pods", "name": "a", "uid": "u"}, {"resource": "pods", "name": "b", "uid": "u"}]),
            Some("status.reservedFor[1].uid"),
        ),
        // results ≤ 32, config ≤ 64
        (
            "32 results",
            &|v| {
                v["status"]["allocation"]["devices"]["results"] = Value::Array((0..32).map(|i| json!({"request": "net", "driver": "netclaim.dev", "pool": "node-1", "device": if i == 0 { "eth1".to_owned() } else { format!("d{i}") }})).collect());
            },
            None,
        ),
        (
            "33 results",
            &|v| {
                v["status"]["allocation"]["devices"]["results"] = Value::Array((0..33).map(|i| json!({"request": "net", "driver": "netclaim.dev", "pool": "node-1", "device": if i == 0 { "eth1".to_owned() } else { format!("d{i}") }})).collect());
            },
            Some("status.allocation.devices.results"),
        ),
        (
            "64 configs",
            &|v| {
                v["status"]["allocation"]["devices"]["config"] = Value::Array((0..64).map(|_| json!({"source": "FromClass", "opaque": {"driver": "netclaim.dev", "parameters": {}}})).collect());
            },
            None,
        ),
        (
            "65 configs",
            &|v| {
                v["status"]["allocation"]["devices"]["config"] = Value::Array((0..65).map(|_| json!({"source": "FromClass", "opaque": {"driver": "netclaim.dev", "parameters": {}}})).collect());
            },
            Some("status.allocation.devices.config"),
        ),
        // driver / pool / device name rules, shareID UUID
        (
            "driver uppercase",
            &|v| st0(v)["driver"] = json!("Netclaim.dev"),
            Some("status.devices[0].driver"),
        ),
        (
            "driver 64 chars",
            &|v| st0(v)["driver"] = json!(format!("{}.dev", "d".repeat(60))),
            Some("status.devices[0].driver"),
        ),
        (
            "pool name invalid",
            &|v| st0(v)["pool"] = json!("node_1"),
            Some("status.devices[0].pool"),
        ),
        (
            "device not a DNS label",
            &|v| st0(v)["device"] = json!("Eth1"),
            Some("status.devices[0].device"),
        ),
        (
            "allocated shared entry with UUID",
            &|v| v["status"]["devices"] = json!([{"driver": "netclaim.dev", "pool": "node-1", "device": "eth2", "shareID": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"}]),
            None,
        ),
        (
            "shareID not a UUID",
            &|v| v["status"]["devices"] = json!([{"driver": "netclaim.dev", "pool": "node-1", "device": "eth2", "shareID": "not-a-uuid"}]),
            Some("status.devices[0].shareID"),
        ),
        (
            "shareID uppercase",
            &|v| v["status"]["devices"] = json!([{"driver": "netclaim.dev", "pool": "node-1", "device": "eth2", "shareID": "6BA7B810-9DAD-11D1-80B4-00C04FD430C8"}]),
            Some("status.devices[0].shareID"),
        ),
        // entries must match an allocation result
        ("device not allocated", &|v| st0(v)["device"] = json!("eth9"), Some("status.devices[0]")),
        (
            "shared device without its shareID",
            &|v| st0(v)["device"] = json!("eth2"),
            Some("status.devices[0]"),
        ),
        (
            "status without allocation",
            &|v| {
                v["status"].as_object_mut().unwrap().remove("allocation");
            },
            Some("status.devices[0]"),
        ),
        (
            "duplicate status entry",
            &|v| v["status"]["devices"] = json!([{"driver": "netclaim.dev", "pool": "node-1", "device": "eth1"}, {"driver": "netclaim.dev", "pool": "node-1", "device": "eth1"}]),
            Some("status.devices[1]"),
        ),
        // conditions ≤ 8, unique type
        (
            "8 conditions",
            &|v| {
                st0(v)["conditions"] = Value::Array((0..8).map(|i| json!({"type": format!("T{i}"), "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})).collect());
            },
            None,
        ),
        (
            "9 conditions",
            &|v| {
                st0(v)["conditions"] = Value::Array((0..9).map(|i| json!({"type": format!("T{i}"), "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})).collect());
            },
            Some("status.devices[0].conditions"),
        ),
        (
            "duplicate condition type",
            &|v| {
                st0(v)["conditions"] = json!([{"type": "Ready", "status": "True"}, {"type": "Ready", "status": "False"}]);
            },
            Some("status.devices[0].conditions[1].type"),
        ),
        // metav1.Condition rules (applied by the real server to every condition list)
        (
            "condition complete",
            &|v| st0(v)["conditions"] = json!([{"type": "Ready", "status": "True", "reason": "NetworkReady", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]),
            None,
        ),
        (
            "condition without reason",
            &|v| st0(v)["conditions"] = json!([{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
            Some("status.devices[0].conditions[0].reason"),
        ),
        (
            "condition reason with space",
            &|v| st0(v)["conditions"] = json!([{"type": "Ready", "status": "True", "reason": "Not ready", "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
            Some("status.devices[0].conditions[0].reason"),
        ),
        (
            "condition without lastTransitionTime",
            &|v| st0(v)["conditions"] = json!([{"type": "Ready", "status": "True", "reason": "R"}]),
            Some("status.devices[0].conditions[0].lastTransitionTime"),
        ),
        (
            "condition status lowercase",
            &|v| st0(v)["conditions"] = json!([{"type": "Ready", "status": "true", "reason": "R", "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
            Some("status.devices[0].conditions[0].status"),
        ),
        // data: JSON object ≤ 10 KiB (10240 bytes)
        ("data exactly 10240 bytes", &|v| st0(v)["data"] = data_of_len(10240), None),
        (
            "data 10241 bytes",
            &|v| st0(v)["data"] = data_of_len(10241),
            Some("status.devices[0].data"),
        ),
        ("data not an object", &|v| st0(v)["data"] = json!([1, 2]), Some("status.devices[0].data")),
        // networkData
        (
            "interfaceName 256 bytes",
            &|v| st0(v)["networkData"] = json!({"interfaceName": "i".repeat(256)}),
            None,
        ),
        (
            "interfaceName 257 bytes",
            &|v| st0(v)["networkData"] = json!({"interfaceName": "i".repeat(257)}),
            Some("status.devices[0].networkData.interfaceName"),
        ),
        (
            "hardwareAddress 128 bytes",
            &|v| st0(v)["networkData"] = json!({"hardwareAddress": "h".repeat(128)}),
            None,
        ),
        (
            "hardwareAddress 129 bytes",
            &|v| st0(v)["networkData"] = json!({"hardwareAddress": "h".repeat(129)}),
            Some("status.devices[0].networkData.hardwareAddress"),
        ),
        ("16 ips", &|v| st0(v)["networkData"] = json!({"ips": ips(16)}), None),
        (
            "17 ips",
            &|v| st0(v)["networkData"] = json!({"ips": ips(17)}),
            Some("status.devices[0].networkData.ips"),
        ),
        (
            "duplicate ip",
            &|v| st0(v)["networkData"] = json!({"ips": ["10.0.0.1/24", "10.0.0.1/24"]}),
            Some("status.devices[0].networkData.ips[1]"),
        ),
        (
            "canonical v4 and v6 with host bits",
            &|v| st0(v)["networkData"] = json!({"ips": ["192.0.2.5/24", "2001:db8::5/64"]}),
            None,
        ),
        (
            "non-canonical v6",
            &|v| st0(v)["networkData"] = json!({"ips": ["2001:0db8::5/64"]}),
            Some("status.devices[0].networkData.ips[0]"),
        ),
        (
            "uppercase v6",
            &|v| st0(v)["networkData"] = json!({"ips": ["2001:DB8::5/64"]}),
            Some("status.devices[0].networkData.ips[0]"),
        ),
        (
            "no prefix",
            &|v| st0(v)["networkData"] = json!({"ips": ["192.0.2.5"]}),
            Some("status.devices[0].networkData.ips[0]"),
        ),
        (
            "prefix too long",
            &|v| st0(v)["networkData"] = json!({"ips": ["192.0.2.5/33"]}),
            Some("status.devices[0].networkData.ips[0]"),
        ),
        (
            "v4 leading zero",
            &|v| st0(v)["networkData"] = json!({"ips": ["192.0.2.05/24"]}),
            Some("status.devices[0].networkData.ips[0]"),
        ),
    ];
    run(claim, ("resource.k8s.io", "resourceclaims"), &cases);
}

#[test]
#[allow(clippy::too_many_lines, reason = "one table row per documented limit")]
fn resource_claim_spec_rules() {
    let cases: Vec<Case<'_>> = vec![
        (
            "32 requests",
            &|v| {
                v["spec"]["devices"]["requests"] = Value::Array((0..32).map(|i| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "c"}})).collect());
            },
            None,
        ),
        (
            "33 requests",
            &|v| {
                v["spec"]["devices"]["requests"] = Value::Array((0..33).map(|i| json!({"name": format!("r{i}"), "exactly": {"deviceClassName": "c"}})).collect());
            },
            Some("spec.devices.requests"),
        ),
        (
            "request name not a label",
            &|v| v["spec"]["devices"]["requests"][0]["name"] = json!("Net"),
            Some("spec.devices.requests[0].name"),
        ),
        (
            "exactly and firstAvailable",
            &|v| {
                v["spec"]["devices"]["requests"][0]["firstAvailable"] =
                    json!([{"name": "a", "deviceClassName": "c"}]);
            },
            Some("spec.devices.requests[0]"),
        ),
        (
            "8 subrequests",
            &|v| v["spec"]["devices"]["requests"][0] = json!({"name": "net", "firstAvailable": (0..8).map(|i| json!({"name": format!("s{i}"), "deviceClassName": "c"})).collect::<Vec<_>>()}),
            None,
        ),
        (
            "9 subrequests",
            &|v| v["spec"]["devices"]["requests"][0] = json!({"name": "net", "firstAvailable": (0..9).map(|i| json!({"name": format!("s{i}"), "deviceClassName": "c"})).collect::<Vec<_>>()}),
            Some("spec.devices.requests[0].firstAvailable"),
        ),
        (
            "missing device class",
            &|v| v["spec"]["devices"]["requests"][0]["exactly"] = json!({}),
            Some("spec.devices.requests[0].exactly.deviceClassName"),
        ),
        (
            "count zero",
            &|v| v["spec"]["devices"]["requests"][0]["exactly"]["count"] = json!(0),
            Some("spec.devices.requests[0].exactly.count"),
        ),
        (
            "parameters 10 KiB object",
            &|v| {
                v["spec"]["devices"]["config"] = json!([{"opaque": {"driver": "netclaim.dev", "parameters": data_of_len(10240)}}]);
            },
            None,
        ),
        (
            "parameters over 10 KiB",
            &|v| {
                v["spec"]["devices"]["config"] = json!([{"opaque": {"driver": "netclaim.dev", "parameters": data_of_len(10241)}}]);
            },
            Some("spec.devices.config[0].opaque.parameters"),
        ),
        (
            "parameters not an object",
            &|v| {
                v["spec"]["devices"]["config"] =
                    json!([{"opaque": {"driver": "netclaim.dev", "parameters": "mode: macvlan"}}]);
            },
            Some("spec.devices.config[0].opaque.parameters"),
        ),
    ];
    run(claim, ("resource.k8s.io", "resourceclaims"), &cases);
    let r = lookup("resource.k8s.io", "v1", "resourceclaims").unwrap();
    let old = claim();
    let mut new = old.clone();
    new["spec"]["devices"]["requests"][0]["name"] = json!("other");
    assert!(validate(&r, &new, Some(&old)).iter().any(|e| e.field == "spec"));
}

#[test]
fn device_class_rules() {
    let r = lookup("resource.k8s.io", "v1", "deviceclasses").unwrap();
    let class = |selectors: usize, params: Value| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "netclaim"},
               "spec": {"selectors": (0..selectors).map(|_| json!({"cel": {"expression": "true"}})).collect::<Vec<_>>(),
                        "config": [{"opaque": {"driver": "netclaim.dev", "parameters": params}}]}})
    };
    assert!(validate(&r, &class(32, data_of_len(10240)), None).is_empty());
    assert!(validate(&r, &class(33, json!({})), None).iter().any(|e| e.field == "spec.selectors"));
    assert!(
        validate(&r, &class(1, data_of_len(10241)), None)
            .iter()
            .any(|e| e.field == "spec.config[0].opaque.parameters")
    );
}
