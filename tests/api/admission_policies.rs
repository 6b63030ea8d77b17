//! The ValidatingAdmissionPolicies in deploy/base, evaluated with the `cel` crate as the API
//! server evaluates them: the match conditions, then the variables in order, then each
//! validation (its message or messageExpression when it fails). Every expression must
//! compile; every validation gets at least one request it accepts and one it rejects, and a
//! rejection must come from the rule meant (not from an earlier one or an evaluation error).
//!
//! The Kubernetes CEL library functions the policies use (`isCIDR`, `isIP`) come from the
//! in-memory API server's library (`kube_inmemory::apiserver::cel_network_library`, Go's
//! netip parsing as upstream), the one its CRD rules run with.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, LazyLock};

use cel::{Context, Env, Program, Value};
use serde::Deserialize as _;
use serde_json::{Value as Json, json};

/// The standard library and Kubernetes' IP/CIDR library, built once.
static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| {
    let mut env = Env::stdlib();
    env.add_extension(kube_inmemory::apiserver::cel_network_library)
        .expect("the network library declares once on a fresh environment");
    // Kubernetes' CEL environment has the strings library (replace, join, ...).
    env.add_extension(cel::extensions::strings).expect("the strings extension declares once");
    Arc::new(env)
});

/// One validation of a policy.
struct Rule {
    expression: String,
    program: Program,
    message: Option<String>,
    message_expression: Option<Program>,
    /// The message, or the messageExpression's source.
    described: String,
}

/// A policy, compiled.
struct Policy {
    conditions: Vec<Program>,
    variables: Vec<(String, Program)>,
    rules: Vec<Rule>,
}

#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A match condition was false: the policy does not apply.
    NotMatched,
    /// Every validation held.
    Allowed,
    /// Validation `rule` was false (or failed to evaluate: `error`).
    Denied { rule: usize, message: String, error: bool },
}

fn compile(expression: &str) -> Program {
    Program::compile(expression)
        .unwrap_or_else(|e| panic!("CEL expression does not compile: {expression}\n{e}"))
}

fn text(value: &yaml_serde::Value, key: &str) -> Option<String> {
    value.get(key).and_then(yaml_serde::Value::as_str).map(str::to_owned)
}

/// The policy named `name` from deploy/base/admission-*.yaml (or an overlay's).
fn policy(name: &str) -> Policy {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("deploy/base");
    let overlay = root.join("deploy/overlays/k8s-1.34");
    let entries = std::fs::read_dir(&dir).unwrap().chain(std::fs::read_dir(&overlay).unwrap());
    for entry in entries {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        if !file.starts_with("admission-") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for document in yaml_serde::Deserializer::from_str(&source) {
            let doc = yaml_serde::Value::deserialize(document).unwrap();
            if text(&doc, "kind").as_deref() != Some("ValidatingAdmissionPolicy")
                || text(&doc["metadata"], "name").as_deref() != Some(name)
            {
                continue;
            }
            let spec = &doc["spec"];
            assert_eq!(text(spec, "failurePolicy").as_deref(), Some("Fail"), "{name}");
            let list = |key: &str| spec.get(key).and_then(|v| v.as_sequence()).cloned();
            let conditions = list("matchConditions")
                .unwrap_or_default()
                .iter()
                .map(|c| compile(&text(c, "expression").unwrap()))
                .collect();
            let variables = list("variables")
                .unwrap_or_default()
                .iter()
                .map(|v| (text(v, "name").unwrap(), compile(&text(v, "expression").unwrap())))
                .collect();
            let rules: Vec<Rule> = list("validations")
                .unwrap()
                .iter()
                .map(|v| {
                    let expression = text(v, "expression").unwrap();
                    let message = text(v, "message");
                    let source = text(v, "messageExpression");
                    let described =
                        message.clone().or_else(|| source.clone()).unwrap_or_else(|| {
                            panic!("{name}: a validation without a message: {expression}")
                        });
                    let message_expression = source.as_deref().map(compile);
                    Rule {
                        program: compile(&expression),
                        expression,
                        message,
                        message_expression,
                        described,
                    }
                })
                .collect();
            assert!(!rules.is_empty(), "{name} has no validations");
            return Policy { conditions, variables, rules };
        }
    }
    panic!("no ValidatingAdmissionPolicy {name} in {}", dir.display());
}

/// JSON as CEL sees Kubernetes objects: integers are `int`.
fn to_cel(value: &Json) -> Value {
    match value {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => n.as_i64().map_or_else(|| Value::Float(n.as_f64().unwrap()), Value::Int),
        Json::String(s) => Value::String(Arc::new(s.clone())),
        Json::Array(items) => Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Json::Object(map) => map
            .iter()
            .map(|(k, v)| (k.clone(), to_cel(v)))
            .collect::<HashMap<String, Value>>()
            .into(),
    }
}

/// Evaluates `policy` for one admission request.
fn evaluate(policy: &Policy, request: &Json, object: &Json, old_object: &Json) -> Verdict {
    evaluate_with(policy, request, object, old_object, &Json::Null)
}

/// Evaluates `policy` for one admission request against one parameter object (`params`).
fn evaluate_with(
    policy: &Policy,
    request: &Json,
    object: &Json,
    old_object: &Json,
    params: &Json,
) -> Verdict {
    let mut context = Context::with_env(Arc::clone(&ENV));
    context.add_variable_from_value("request", to_cel(request));
    context.add_variable_from_value("object", to_cel(object));
    context.add_variable_from_value("oldObject", to_cel(old_object));
    context.add_variable_from_value("params", to_cel(params));
    for condition in &policy.conditions {
        match condition.execute(&context) {
            Ok(Value::Bool(true)) => {}
            Ok(Value::Bool(false)) => return Verdict::NotMatched,
            other => panic!("a match condition gave {other:?}"),
        }
    }
    let mut variables: HashMap<String, Value> = HashMap::new();
    for (name, program) in &policy.variables {
        context.add_variable_from_value("variables", variables.clone());
        let value = program
            .execute(&context)
            .unwrap_or_else(|e| panic!("variable {name} failed on {object}: {e}"));
        variables.insert(name.clone(), value);
    }
    context.add_variable_from_value("variables", variables);
    for (index, rule) in policy.rules.iter().enumerate() {
        let (held, error) = match rule.program.execute(&context) {
            Ok(Value::Bool(held)) => (held, None),
            Ok(other) => panic!("{} gave {other:?}, not a bool", rule.expression),
            Err(e) => (false, Some(e.to_string())),
        };
        if held {
            continue;
        }
        let message = match (&error, &rule.message_expression, &rule.message) {
            (Some(e), _, _) => format!("evaluation error: {e}"),
            (None, Some(program), _) => match program.execute(&context) {
                Ok(Value::String(s)) => s.to_string(),
                other => panic!("messageExpression of {} gave {other:?}", rule.expression),
            },
            (None, None, Some(message)) => message.clone(),
            (None, None, None) => unreachable!("checked at load"),
        };
        return Verdict::Denied { rule: index, message, error: error.is_some() };
    }
    Verdict::Allowed
}

/// The index of the one rule whose message (or messageExpression's source) mentions `about`.
fn rule_about(policy: &Policy, about: &str) -> usize {
    let matching: Vec<usize> = policy
        .rules
        .iter()
        .enumerate()
        .filter(|(_, r)| r.described.contains(about))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(matching.len(), 1, "rules about {about}: {matching:?}");
    matching[0]
}

/// Asserts that `verdict` is a rejection by rule `rule` (not an evaluation error) and
/// returns its message.
fn assert_denied_by(verdict: Verdict, rule: usize, case: &str) -> String {
    match verdict {
        Verdict::Denied { rule: got, message, error: false } if got == rule => message,
        other => panic!("{case}: expected a rejection by rule {rule}, got {other:?}"),
    }
}

// --- netclaim-node-slices --------------------------------------------------------------

const NODE_SA: &str = "system:serviceaccount:netclaim-system:netclaim-node";

fn slice(node: &str, pool: &str, driver: &str) -> Json {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{driver}-0")},
        "spec": {"driver": driver, "nodeName": node, "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1}, "devices": []}
    })
}

fn slice_request(operation: &str, username: &str, node_claim: Option<&str>) -> Json {
    let extra = node_claim.map_or_else(
        || json!({"authentication.kubernetes.io/pod-name": ["x"]}),
        |node| {
            json!({
                "authentication.kubernetes.io/node-name": [node],
                "authentication.kubernetes.io/pod-name": ["netclaim-node-abcde"]
            })
        },
    );
    json!({
        "operation": operation,
        "userInfo": {"username": username, "groups": ["system:serviceaccounts"], "extra": extra},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"}
    })
}

#[test]
fn the_node_driver_writes_only_its_own_nodes_slices() {
    let policy = policy("netclaim-node-slices");
    let own = slice("node-a", "node-a", "netclaim.dev");
    let as_node = |op: &str| slice_request(op, NODE_SA, Some("node-a"));
    let mut rejected = BTreeSet::new();

    // Accepted: its own slice, created, updated, deleted (object null: oldObject is read).
    assert_eq!(evaluate(&policy, &as_node("CREATE"), &own, &Json::Null), Verdict::Allowed);
    assert_eq!(evaluate(&policy, &as_node("UPDATE"), &own, &own), Verdict::Allowed);
    assert_eq!(evaluate(&policy, &as_node("DELETE"), &Json::Null, &own), Verdict::Allowed);
    // Not matched: kubelet and anyone else keep their rights (kubelet deletes slices).
    let other = slice("node-b", "node-b", "netclaim.dev");
    let kubelet = slice_request("DELETE", "system:node:node-a", None);
    assert_eq!(evaluate(&policy, &kubelet, &Json::Null, &other), Verdict::NotMatched);
    let admin = slice_request("CREATE", "kubernetes-admin", None);
    assert_eq!(evaluate(&policy, &admin, &other, &Json::Null), Verdict::NotMatched);

    // A token without the node claim.
    let rule = rule_about(&policy, "names no node");
    let request = slice_request("CREATE", NODE_SA, None);
    assert_denied_by(evaluate(&policy, &request, &own, &Json::Null), rule, "no node claim");
    rejected.insert(rule);

    // Another node's slice: create, and delete (through oldObject).
    let rule = rule_about(&policy, "of its own node");
    let message = assert_denied_by(
        evaluate(&policy, &as_node("CREATE"), &other, &Json::Null),
        rule,
        "other node",
    );
    assert!(message.contains("node-a") && message.contains("node-b"), "{message}");
    assert_denied_by(
        evaluate(&policy, &as_node("DELETE"), &Json::Null, &other),
        rule,
        "delete other",
    );
    let mut no_node = own.clone();
    no_node["spec"].as_object_mut().unwrap().remove("nodeName");
    no_node["spec"]["allNodes"] = json!(true);
    let message = assert_denied_by(
        evaluate(&policy, &as_node("CREATE"), &no_node, &Json::Null),
        rule,
        "allNodes",
    );
    assert!(message.contains("no spec.nodeName"), "{message}");
    rejected.insert(rule);

    // Its node, but another pool.
    let rule = rule_about(&policy, "its own pool");
    let foreign_pool = slice("node-a", "node-b", "netclaim.dev");
    assert_denied_by(evaluate(&policy, &as_node("UPDATE"), &foreign_pool, &own), rule, "pool");
    rejected.insert(rule);

    // Its node, another driver's slice.
    let rule = rule_about(&policy, "of driver netclaim.dev");
    let foreign_driver = slice("node-a", "node-a", "gpu.example.com");
    let message = assert_denied_by(
        evaluate(&policy, &as_node("DELETE"), &Json::Null, &foreign_driver),
        rule,
        "driver",
    );
    assert!(message.contains("gpu.example.com"), "{message}");
    rejected.insert(rule);

    assert_eq!(rejected, (0..policy.rules.len()).collect(), "every rule rejects something");
}

// --- netclaim-network-config -----------------------------------------------------------

fn good_pool_config() -> Json {
    json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "NetworkConfig",
        "mode": "macvlan",
        "macvlan": {"mode": "bridge"},
        "interface": {"name": "net1", "mtu": 1500, "hardwareAddress": "02:00:00:00:00:01"},
        "vlan": 100,
        "ipam": {"pool": {
            "subnet": "10.10.1.0/24", "rangeStart": "10.10.1.10", "rangeEnd": "10.10.1.200",
            "gateway": "10.10.1.1", "exclude": ["10.10.1.100/30"]
        }},
        "routes": [
            {"destination": "10.20.0.0/16", "gateway": "10.10.1.1"},
            {"destination": "0.0.0.0/0", "gateway": "10.10.1.1", "metric": 200}
        ],
        "stats": true
    })
}

fn good_static_config() -> Json {
    json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "NetworkConfig",
        "mode": "ipvlan",
        "ipvlan": {"mode": "l3s", "flag": "private"},
        "interface": {"name": "data.0", "mtu": 9000},
        "ipam": {"addresses": ["10.10.1.5/24", "fd00:10::5/64"]},
        "routes": [{"destination": "fd00:20::/64"}]
    })
}

fn opaque(driver: &str, parameters: &Json) -> Json {
    json!({"opaque": {"driver": driver, "parameters": parameters}})
}

/// `parameters` inside an object of `resource` (resourceclaims, resourceclaimtemplates,
/// deviceclasses), next to another driver's config that must be ignored.
fn object_with(resource: &str, parameters: &Json) -> Json {
    let config = json!([
        opaque("gpu.example.com", &json!({"mode": "whatever", "interface": 7})),
        opaque("netclaim.dev", parameters),
    ]);
    let devices = json!({
        "requests": [{"name": "net", "exactly": {"deviceClassName": "macvlan.netclaim.dev"}}],
        "config": config
    });
    match resource {
        "deviceclasses" => json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "c"}, "spec": {"config": config}}),
        "resourceclaimtemplates" => json!({"apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate", "metadata": {"name": "t", "namespace": "default"},
            "spec": {"spec": {"devices": devices}}}),
        "resourceclaims" => json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "default"}, "spec": {"devices": devices}}),
        other => panic!("{other}"),
    }
}

fn config_request(resource: &str) -> Json {
    json!({
        "operation": "CREATE",
        "userInfo": {"username": "alice", "groups": ["system:authenticated"], "extra": {}},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": resource}
    })
}

const KINDS: [&str; 3] = ["resourceclaims", "resourceclaimtemplates", "deviceclasses"];

fn check(policy: &Policy, parameters: &Json) -> Vec<Verdict> {
    KINDS
        .iter()
        .map(|resource| {
            evaluate(
                policy,
                &config_request(resource),
                &object_with(resource, parameters),
                &Json::Null,
            )
        })
        .collect()
}

/// `edit` applied to a good config.
fn bad(base: fn() -> Json, edit: impl FnOnce(&mut Json)) -> Json {
    let mut config = base();
    edit(&mut config);
    config
}

#[test]
fn well_formed_network_configs_are_accepted_in_claims_templates_and_classes() {
    let policy = policy("netclaim-network-config");
    for config in [
        good_pool_config(),
        good_static_config(),
        json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "NetworkConfig"}),
    ] {
        for verdict in check(&policy, &config) {
            assert_eq!(verdict, Verdict::Allowed, "{config}");
        }
    }
    // Objects without any config, and with only another driver's, are not ours to judge.
    for resource in KINDS {
        let mut object = object_with(resource, &json!({}));
        let strip = |config: &mut Json| {
            config.as_array_mut().unwrap().retain(|c| c["opaque"]["driver"] != "netclaim.dev");
        };
        match resource {
            "deviceclasses" => strip(&mut object["spec"]["config"]),
            "resourceclaimtemplates" => strip(&mut object["spec"]["spec"]["devices"]["config"]),
            _ => strip(&mut object["spec"]["devices"]["config"]),
        }
        assert_eq!(
            evaluate(&policy, &config_request(resource), &object, &Json::Null),
            Verdict::Allowed
        );
        let bare = match resource {
            "deviceclasses" => json!({"spec": {"selectors": []}}),
            "resourceclaimtemplates" => json!({"spec": {"spec": {"devices": {"requests": []}}}}),
            _ => json!({"spec": {"devices": {"requests": []}}}),
        };
        assert_eq!(
            evaluate(&policy, &config_request(resource), &bare, &Json::Null),
            Verdict::Allowed
        );
    }
}

#[test]
#[allow(clippy::too_many_lines, reason = "one table of cases, one per line")]
fn each_malformed_network_config_field_is_rejected_by_its_rule() {
    let policy = policy("netclaim-network-config");
    let cases: Vec<(&str, &str, Json)> = vec![
        (
            "apiVersion",
            "wrong apiVersion",
            bad(good_pool_config, |c| c["apiVersion"] = json!("netclaim.dev/v1")),
        ),
        (
            "apiVersion",
            "no kind",
            bad(good_pool_config, |c| {
                c.as_object_mut().unwrap().remove("kind");
            }),
        ),
        (
            "apiVersion",
            "wrong kind",
            bad(good_static_config, |c| c["kind"] = json!("NetworkStatus")),
        ),
        ("mode must be", "unknown mode", bad(good_pool_config, |c| c["mode"] = json!("bridge"))),
        (
            "mode must be",
            "unknown macvlan mode",
            bad(good_pool_config, |c| c["macvlan"]["mode"] = json!("vpn")),
        ),
        (
            "mode must be",
            "unknown ipvlan flag",
            bad(good_static_config, |c| c["ipvlan"]["flag"] = json!("l2")),
        ),
        (
            "interface.name",
            "eth0",
            bad(good_pool_config, |c| c["interface"]["name"] = json!("eth0")),
        ),
        (
            "interface.name",
            "a slash",
            bad(good_pool_config, |c| c["interface"]["name"] = json!("net/1")),
        ),
        (
            "interface.name",
            "whitespace",
            bad(good_pool_config, |c| c["interface"]["name"] = json!("net 1")),
        ),
        (
            "interface.name",
            "16 bytes",
            bad(good_pool_config, |c| c["interface"]["name"] = json!("net1234567890123")),
        ),
        ("interface.name", "empty", bad(good_pool_config, |c| c["interface"]["name"] = json!(""))),
        ("interface.name", "..", bad(good_pool_config, |c| c["interface"]["name"] = json!(".."))),
        ("interface.mtu", "below 68", bad(good_pool_config, |c| c["interface"]["mtu"] = json!(67))),
        (
            "interface.mtu",
            "above 65535",
            bad(good_pool_config, |c| c["interface"]["mtu"] = json!(65536)),
        ),
        (
            "interface.mtu",
            "not whole",
            bad(good_pool_config, |c| c["interface"]["mtu"] = json!(1500.5)),
        ),
        (
            "interface.mtu",
            "IPv6 below 1280",
            bad(good_static_config, |c| c["interface"]["mtu"] = json!(1200)),
        ),
        ("vlan must be", "vlan 4095", bad(good_pool_config, |c| c["vlan"] = json!(4095))),
        ("vlan must be", "vlan 0", bad(good_pool_config, |c| c["vlan"] = json!(0))),
        (
            "routes[].destination",
            "subnet without prefix",
            bad(good_pool_config, |c| c["ipam"]["pool"]["subnet"] = json!("10.10.1.0")),
        ),
        (
            "routes[].destination",
            "address without prefix",
            bad(good_static_config, |c| c["ipam"]["addresses"][1] = json!("fd00:10::5")),
        ),
        (
            "routes[].destination",
            "prefix too long",
            bad(good_pool_config, |c| c["routes"][0]["destination"] = json!("10.20.0.0/33")),
        ),
        (
            "routes[].destination",
            "exclude not a CIDR",
            bad(good_pool_config, |c| c["ipam"]["pool"]["exclude"][0] = json!("10.10.1.100-103")),
        ),
        (
            "routes[].destination",
            "IPv4-mapped",
            bad(good_static_config, |c| {
                c["routes"][0]["destination"] = json!("::ffff:10.0.0.0/104");
            }),
        ),
        (
            "routes[].gateway",
            "bad gateway",
            bad(good_pool_config, |c| c["ipam"]["pool"]["gateway"] = json!("10.10.1.256")),
        ),
        (
            "routes[].gateway",
            "range start with a prefix",
            bad(good_pool_config, |c| c["ipam"]["pool"]["rangeStart"] = json!("10.10.1.10/24")),
        ),
        (
            "routes[].gateway",
            "route gateway with a zone",
            bad(good_pool_config, |c| c["routes"][1]["gateway"] = json!("fe80::1%eth0")),
        ),
    ];
    let mut rejected = BTreeSet::new();
    for (about, case, config) in cases {
        let rule = rule_about(&policy, about);
        for (resource, verdict) in KINDS.iter().zip(check(&policy, &config)) {
            assert_denied_by(verdict, rule, &format!("{case} in {resource}"));
        }
        rejected.insert(rule);
    }
    assert_eq!(rejected, (0..policy.rules.len()).collect(), "every rule rejects something");
}

#[test]
fn the_cidr_and_ip_functions_follow_kubernetes_rules() {
    let eval = |expression: &str| {
        let context = Context::with_env(Arc::clone(&ENV));
        compile(expression).execute(&context).unwrap()
    };
    for accepted in ["10.10.1.5/24", "0.0.0.0/0", "fd00::5/64", "10.0.0.0/32"] {
        assert_eq!(eval(&format!("isCIDR('{accepted}')")), Value::Bool(true), "{accepted}");
    }
    for refused in ["10.0.0.0", "10.0.0.0/", "10.0.0.0/33", "010.0.0.0/8", "::ffff:1.2.3.4/128"] {
        assert_eq!(eval(&format!("isCIDR('{refused}')")), Value::Bool(false), "{refused}");
    }
    for (text, valid) in
        [("10.10.1.1", true), ("fd00::1", true), ("10.10.1.1/32", false), ("fe80::1%eth0", false)]
    {
        assert_eq!(eval(&format!("isIP('{text}')")), Value::Bool(valid), "{text}");
    }
}

// --- netclaim-node-ipblocks ------------------------------------------------------------

fn ip_block(name: &str, network: &str, cidr: &str, node: &str, claim: bool) -> Json {
    let mut spec = json!({"podNetwork": network, "cidr": cidr, "nodeName": node});
    if claim {
        spec["claim"] = json!({"namespace": "ns", "name": "c", "uid": "u-1"});
    }
    json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "IPBlock",
        "metadata": {"name": name},
        "spec": spec
    })
}

fn ip_block_request(operation: &str, username: &str, node_claim: Option<&str>) -> Json {
    let mut request = slice_request(operation, username, node_claim);
    request["resource"] =
        json!({"group": "netclaim.dev", "version": "v1alpha1", "resource": "ipblocks"});
    request
}

#[test]
fn the_node_driver_creates_and_deletes_only_its_own_nodes_ipblocks() {
    let policy = policy("netclaim-node-ipblocks");
    let as_node = |op: &str| ip_block_request(op, NODE_SA, Some("node-a"));
    let own = ip_block("medianet.v4-10-10-3-64-26", "medianet", "10.10.3.64/26", "node-a", false);
    let own_v6 = ip_block(
        "medianet.v6-fd00-10--1-200-120",
        "medianet",
        "fd00:10::1:200/120",
        "node-a",
        false,
    );
    let reservation =
        ip_block("medianet.v4-10-10-1-5-32", "medianet", "10.10.1.5/32", "node-a", true);
    let mut rejected = BTreeSet::new();

    // Accepted: its own blocks and reservations, created and deleted; blocks named before
    // the current scheme are still deleted by their node.
    for block in [&own, &own_v6, &reservation] {
        assert_eq!(evaluate(&policy, &as_node("CREATE"), block, &Json::Null), Verdict::Allowed);
        assert_eq!(evaluate(&policy, &as_node("DELETE"), &Json::Null, block), Verdict::Allowed);
    }
    let legacy = ip_block("medianet-10-10-3-64-26", "medianet", "10.10.3.64/26", "node-a", false);
    assert_eq!(evaluate(&policy, &as_node("DELETE"), &Json::Null, &legacy), Verdict::Allowed);
    // Not matched: the controller (collecting a deleted node's blocks) and administrators.
    let other =
        ip_block("medianet.v4-10-10-3-128-26", "medianet", "10.10.3.128/26", "node-b", false);
    let controller = ip_block_request(
        "DELETE",
        "system:serviceaccount:netclaim-system:netclaim-controller",
        None,
    );
    assert_eq!(evaluate(&policy, &controller, &Json::Null, &other), Verdict::NotMatched);

    let rule = rule_about(&policy, "names no node");
    let request = ip_block_request("CREATE", NODE_SA, None);
    assert_denied_by(evaluate(&policy, &request, &own, &Json::Null), rule, "no node claim");
    rejected.insert(rule);

    // Another node's block: create, and delete (through oldObject).
    let rule = rule_about(&policy, "of its own node");
    let message = assert_denied_by(
        evaluate(&policy, &as_node("CREATE"), &other, &Json::Null),
        rule,
        "create other",
    );
    assert!(message.contains("node-a") && message.contains("node-b"), "{message}");
    assert_denied_by(
        evaluate(&policy, &as_node("DELETE"), &Json::Null, &other),
        rule,
        "delete other",
    );
    let other_reservation =
        ip_block("medianet.v4-10-10-1-5-32", "medianet", "10.10.1.5/32", "node-b", true);
    assert_denied_by(
        evaluate(&policy, &as_node("DELETE"), &Json::Null, &other_reservation),
        rule,
        "delete other's reservation",
    );
    rejected.insert(rule);

    // A CIDR not in canonical form (host bits set, or not a CIDR).
    let rule = rule_about(&policy, "canonical CIDR");
    for cidr in ["10.10.3.65/26", "fd00:10:0::1:200/120", "10.10.3.64"] {
        let name = format!("medianet.v4-{}", cidr.replace(['.', ':', '/'], "-"));
        let block = ip_block(&name, "medianet", cidr, "node-a", false);
        assert_denied_by(evaluate(&policy, &as_node("CREATE"), &block, &Json::Null), rule, cidr);
    }
    rejected.insert(rule);

    // A name that is not the one derived from network and CIDR: the old scheme, another
    // network's prefix, another CIDR, the wrong family tag.
    let rule = rule_about(&policy, "names an IPBlock after");
    for name in [
        "medianet-10-10-3-64-26",
        "othernet.v4-10-10-3-64-26",
        "medianet.v4-10-10-3-0-26",
        "medianet.v6-10-10-3-64-26",
        "mine",
    ] {
        let block = ip_block(name, "medianet", "10.10.3.64/26", "node-a", false);
        let message = assert_denied_by(
            evaluate(&policy, &as_node("CREATE"), &block, &Json::Null),
            rule,
            name,
        );
        assert!(message.contains("medianet.v4-10-10-3-64-26"), "{message}");
    }
    rejected.insert(rule);

    assert_eq!(rejected, (0..policy.rules.len()).collect(), "every rule rejects something");
}

fn pod_network_param(name: &str, provider: &str) -> Json {
    json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "PodNetwork",
        "metadata": {"name": name},
        "spec": {
            "provider": provider,
            "parents": ["eth1"],
            "ipam": {
                "subnets": ["10.10.0.0/16", "fd00:10::/64"],
                "exclude": ["10.10.0.0/24"],
                "staticRanges": ["10.10.1.0/24"],
                "blockSize": {"ipv4": 26, "ipv6": 120}
            }
        }
    })
}

/// The binding's verdict: the policy evaluated against every PodNetwork (each a parameter),
/// every evaluation must allow.
fn against_every_network(
    policy: &Policy,
    request: &Json,
    block: &Json,
    networks: &[Json],
) -> Verdict {
    for network in networks {
        let verdict = evaluate_with(policy, request, block, &Json::Null, network);
        if verdict != Verdict::Allowed {
            return verdict;
        }
    }
    Verdict::Allowed
}

#[test]
fn a_node_creates_blocks_of_the_networks_block_size_and_reservations_in_static_ranges() {
    let policy = policy("netclaim-node-ipblocks-network");
    let create = ip_block_request("CREATE", NODE_SA, Some("node-a"));
    let networks = [
        pod_network_param("medianet", "netclaim.dev"),
        // Another network, whose rules must not apply to medianet's blocks.
        json!({"apiVersion": "netclaim.dev/v1alpha1", "kind": "PodNetwork",
               "metadata": {"name": "tiny"},
               "spec": {"provider": "netclaim.dev", "parents": ["eth2"],
                        "ipam": {"subnets": ["10.30.0.0/24"], "blockSize": {"ipv4": 28, "ipv6": 124}}}}),
        pod_network_param("foreign", "other.example.com"),
    ];
    let mut rejected = BTreeSet::new();
    let block = |network: &str, cidr: &str, claim: bool| {
        ip_block(&format!("{network}.v4-x"), network, cidr, "node-a", claim)
    };

    for accepted in [
        block("medianet", "10.10.3.64/26", false),
        block("medianet", "fd00:10::1:200/120", false),
        block("medianet", "10.10.1.5/32", true),
        block("tiny", "10.30.0.16/28", false),
        // Without a network to judge against, the other policy's checks are all there is.
        block("gone", "10.99.0.0/24", false),
    ] {
        assert_eq!(
            against_every_network(&policy, &create, &accepted, &networks),
            Verdict::Allowed,
            "{accepted}"
        );
    }
    // Not matched: the controller or an administrator.
    let admin = ip_block_request("CREATE", "kubernetes-admin", None);
    assert_eq!(
        evaluate_with(
            &policy,
            &admin,
            &block("medianet", "10.0.0.0/8", false),
            &Json::Null,
            &networks[0]
        ),
        Verdict::NotMatched
    );

    let judge = |b: &Json| against_every_network(&policy, &create, b, &networks);

    let rule = rule_about(&policy, "only of netclaim.dev networks");
    let message =
        assert_denied_by(judge(&block("foreign", "10.40.0.0/26", false)), rule, "provider");
    assert!(message.contains("other.example.com"), "{message}");
    rejected.insert(rule);

    let rule = rule_about(&policy, "(its blockSize)");
    for cidr in ["10.10.3.0/24", "10.10.3.64/27", "fd00:10::/64", "10.10.3.7/32"] {
        let message = assert_denied_by(judge(&block("medianet", cidr, false)), rule, cidr);
        assert!(message.contains("medianet"), "{message}");
    }
    // tiny's blocks are /28s: a /26 is refused there, by tiny's rule.
    assert_denied_by(judge(&block("tiny", "10.30.0.0/26", false)), rule, "tiny /26");
    rejected.insert(rule);

    let rule = rule_about(&policy, "lies inside one of its subnets");
    assert_denied_by(judge(&block("medianet", "10.11.0.0/26", false)), rule, "outside");
    rejected.insert(rule);

    let rule = rule_about(&policy, "single address inside its staticRanges");
    for (cidr, why) in [
        ("10.10.3.7/32", "a reservation in the block space"),
        ("10.10.0.1/32", "a reservation in exclude but outside staticRanges"),
        ("10.10.1.0/26", "a reservation of more than one address"),
    ] {
        assert_denied_by(judge(&block("medianet", cidr, true)), rule, why);
    }
    rejected.insert(rule);

    assert_eq!(rejected, (0..policy.rules.len()).collect(), "every rule rejects something");
}

// --- netclaim-node-claim-status (deploy/overlays/k8s-1.34) -----------------------------

fn device_status(driver: &str, pool: &str, device: &str, ready: bool) -> Json {
    json!({
        "driver": driver, "pool": pool, "device": device,
        "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                        "reason": "Attached", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "networkData": {"interfaceName": "net1", "ips": ["10.10.3.77/16"]}
    })
}

/// A claim allocated `medianet-eth1` on node-a by netclaim.dev and `gpu0` on node-a by
/// another driver, reserved for one pod, with `devices` as its device statuses.
fn allocated_claim(devices: &[Json]) -> Json {
    json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "claim-uid"},
        "spec": {"devices": {"requests": [{"name": "net"}, {"name": "gpu"}]}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "net", "driver": "netclaim.dev", "pool": "node-a", "device": "medianet-eth1"},
                {"request": "gpu", "driver": "gpu.example.com", "pool": "node-a", "device": "gpu0"}
            ]}, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-uid"}],
            "devices": devices
        }
    })
}

fn status_request(username: &str, node: Option<&str>) -> Json {
    let mut request = slice_request("UPDATE", username, node);
    request["resource"] =
        json!({"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"});
    request["subResource"] = json!("status");
    request
}

#[test]
fn on_1_34_the_node_writes_only_its_own_drivers_and_pools_device_statuses() {
    let policy = policy("netclaim-node-claim-status");
    let as_node = status_request(NODE_SA, Some("node-a"));
    let theirs = device_status("gpu.example.com", "node-a", "gpu0", true);
    let ours = device_status("netclaim.dev", "node-a", "medianet-eth1", true);
    let before = allocated_claim(std::slice::from_ref(&theirs));
    let mut rejected = BTreeSet::new();

    // Accepted: adding, changing and removing its own entry; another driver's stays as it was.
    let added = allocated_claim(&[theirs.clone(), ours.clone()]);
    assert_eq!(evaluate(&policy, &as_node, &added, &before), Verdict::Allowed);
    let changed = allocated_claim(&[
        theirs.clone(),
        device_status("netclaim.dev", "node-a", "medianet-eth1", false),
    ]);
    assert_eq!(evaluate(&policy, &as_node, &changed, &added), Verdict::Allowed);
    assert_eq!(evaluate(&policy, &as_node, &before, &added), Verdict::Allowed);
    // Not matched: the scheduler, kubelet, another driver's daemon.
    for username in
        ["system:kube-scheduler", "system:node:node-a", "system:serviceaccount:gpu:gpu-node"]
    {
        let request = status_request(username, Some("node-a"));
        let mut deallocated = before.clone();
        deallocated["status"].as_object_mut().unwrap().remove("allocation");
        assert_eq!(evaluate(&policy, &request, &deallocated, &before), Verdict::NotMatched);
    }

    let rule = rule_about(&policy, "names no node");
    let request = status_request(NODE_SA, None);
    assert_denied_by(evaluate(&policy, &request, &added, &before), rule, "no node claim");
    rejected.insert(rule);

    let rule = rule_about(&policy, "status.allocation");
    let mut moved = added.clone();
    moved["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("node-b");
    assert_denied_by(evaluate(&policy, &as_node, &moved, &before), rule, "allocation edited");
    let mut deallocated = before.clone();
    deallocated["status"].as_object_mut().unwrap().remove("allocation");
    assert_denied_by(evaluate(&policy, &as_node, &deallocated, &before), rule, "deallocated");
    rejected.insert(rule);

    let rule = rule_about(&policy, "status.reservedFor");
    let mut reserved = added.clone();
    reserved["status"]["reservedFor"] = json!([
        {"resource": "pods", "name": "p", "uid": "pod-uid"},
        {"resource": "pods", "name": "intruder", "uid": "other-uid"}
    ]);
    assert_denied_by(evaluate(&policy, &as_node, &reserved, &before), rule, "reservedFor added");
    let mut unreserved = before.clone();
    unreserved["status"].as_object_mut().unwrap().remove("reservedFor");
    assert_denied_by(
        evaluate(&policy, &as_node, &unreserved, &before),
        rule,
        "reservedFor removed",
    );
    rejected.insert(rule);

    let rule = rule_about(&policy, "of driver netclaim.dev and pool");
    // Another driver's entry rewritten, removed; an entry of our driver on another node.
    let rewritten = allocated_claim(&[device_status("gpu.example.com", "node-a", "gpu0", false)]);
    let message =
        assert_denied_by(evaluate(&policy, &as_node, &rewritten, &before), rule, "rewritten");
    assert!(message.contains("gpu.example.com/node-a/gpu0"), "{message}");
    let removed = allocated_claim(&[]);
    assert_denied_by(evaluate(&policy, &as_node, &removed, &before), rule, "removed");
    let other_node = allocated_claim(&[
        theirs.clone(),
        device_status("netclaim.dev", "node-b", "medianet-eth1", true),
    ]);
    let message =
        assert_denied_by(evaluate(&policy, &as_node, &other_node, &before), rule, "other pool");
    assert!(message.contains("netclaim.dev/node-b/medianet-eth1"), "{message}");
    rejected.insert(rule);

    let rule = rule_about(&policy, "allocated to this claim");
    let unallocated =
        allocated_claim(&[theirs, device_status("netclaim.dev", "node-a", "eth9", true)]);
    let message =
        assert_denied_by(evaluate(&policy, &as_node, &unallocated, &before), rule, "not allocated");
    assert!(message.contains("eth9"), "{message}");
    rejected.insert(rule);

    assert_eq!(rejected, (0..policy.rules.len()).collect(), "every rule rejects something");
}
