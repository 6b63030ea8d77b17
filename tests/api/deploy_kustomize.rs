//! deploy/ renders with kubectl's built-in kustomize, every kustomization of it (the base,
//! each overlay, the examples, monitoring), and the rendered manifests hold together: every
//! CRD file is in, cluster-scoped objects carry no namespace, the image is the one
//! `make image` names, each host path the node daemon is told about is mounted at the same
//! path, the admission policy names the daemon's ServiceAccount, and the overlays change
//! what they say they change.
//!
//! `#[ignore]`d: they need kubectl (scripts/setup/kubectl.sh; `make test` installs it).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::kit::kustomize::kustomize as render;

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy")
}

fn kind_name(object: &Value) -> (String, String) {
    (
        object["kind"].as_str().unwrap().to_owned(),
        object["metadata"]["name"].as_str().unwrap().to_owned(),
    )
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    objects.iter().find(|o| kind_name(o) == (kind.to_owned(), name.to_owned()))
}

/// Every directory under deploy/ with a kustomization.yaml.
fn kustomizations() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        if dir.join("kustomization.yaml").exists() {
            out.push(dir.to_owned());
        }
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&deploy(), &mut out);
    out.sort();
    out
}

const CLUSTER_SCOPED: [&str; 9] = [
    "Namespace",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "DeviceClass",
    "PodNetwork",
    "IPBlock",
];

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn every_kustomization_renders() {
    let dirs = kustomizations();
    for expected in ["base", "overlays/slots", "overlays/k8s-1.34", "examples", "monitoring"] {
        assert!(dirs.contains(&deploy().join(expected)), "deploy/{expected} has no kustomization");
    }
    for dir in dirs {
        let objects = render(&dir);
        assert!(!objects.is_empty(), "{} renders nothing", dir.display());
        for object in &objects {
            let (kind, name) = kind_name(object);
            let namespace = object["metadata"].get("namespace");
            if CLUSTER_SCOPED.contains(&kind.as_str()) {
                assert!(namespace.is_none(), "{kind} {name} is cluster-scoped but has a namespace");
            }
        }
        println!("{}: {} objects", dir.display(), objects.len());
    }
}

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn the_base_holds_together() {
    let objects = render(&deploy().join("base"));
    // Every CRD file of deploy/crds is rendered.
    let crd_files = std::fs::read_dir(deploy().join("crds"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| {
            Path::new(f).extension().is_some_and(|e| e == "yaml") && f != "kustomization.yaml"
        })
        .count();
    let crds = objects.iter().filter(|o| o["kind"] == "CustomResourceDefinition").count();
    assert_eq!(crds, crd_files, "a CRD file of deploy/crds is missing from its kustomization");

    let image = format!("localhost/netclaim:{}", env!("CARGO_PKG_VERSION"));
    for (kind, name) in [("DaemonSet", "netclaim-node"), ("Deployment", "netclaim-controller")] {
        let workload = find(&objects, kind, name).unwrap_or_else(|| panic!("no {kind} {name}"));
        let container = &workload["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            container["image"],
            image.as_str(),
            "{kind} {name} runs the image make image names"
        );
        let service_account =
            workload["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();
        assert!(find(&objects, "ServiceAccount", service_account).is_some(), "{service_account}");
    }

    let daemonset = find(&objects, "DaemonSet", "netclaim-node").unwrap();
    let pod = &daemonset["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let args: Vec<&str> =
        container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert_eq!(args[0], "node");
    let flag = |name: &str| {
        args.iter()
            .find_map(|a| a.strip_prefix(&format!("--{name}=")))
            .unwrap_or_else(|| panic!("the DaemonSet does not pass --{name}"))
    };
    let mounts: Vec<(&str, &str)> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), m["mountPath"].as_str().unwrap()))
        .collect();
    let volumes = pod["volumes"].as_array().unwrap();
    // The daemon hands these paths to kubelet and the runtime (sockets, CDI specs, metadata
    // files), so each must be mounted from the same host path.
    for name in [
        "state-dir",
        "kubelet-registry-dir",
        "kubelet-plugin-dir",
        "nri-socket",
        "cdi-spec-dir",
        "bpffs",
    ] {
        let path = Path::new(flag(name));
        let (volume, mount) = mounts
            .iter()
            .find(|(_, mount)| path.starts_with(mount))
            .unwrap_or_else(|| panic!("--{name}={} is not under a volume mount", path.display()));
        let host = volumes
            .iter()
            .find(|v| v["name"] == *volume)
            .and_then(|v| v["hostPath"]["path"].as_str())
            .unwrap_or_else(|| panic!("volume {volume} is not a hostPath"));
        assert_eq!(host, *mount, "volume {volume} is mounted at another path than the host's");
    }
    let propagation = |path: &str| {
        container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == path)
            .and_then(|m| m["mountPropagation"].as_str())
            .map(str::to_owned)
    };
    assert_eq!(propagation("/var/run/netns").as_deref(), Some("HostToContainer"));
    assert_eq!(propagation("/sys/fs/bpf").as_deref(), Some("HostToContainer"));
    assert_eq!(pod["hostNetwork"], true);
    assert_ne!(pod["hostPID"], true, "pod netns are opened by path; no host PID namespace");
    let env = container["env"].as_array().unwrap();
    let node_name = env.iter().find(|e| e["name"] == "NODE_NAME").expect("NODE_NAME");
    assert_eq!(node_name["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(security["capabilities"]["drop"], serde_json::json!(["ALL"]));
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    assert_eq!(container["ports"][0]["containerPort"], 9178);
    assert_eq!(daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"], 1);

    admission_policies_name_the_daemon(&objects, daemonset);
}

/// The node policies match the DaemonSet's ServiceAccount, and every policy is bound.
fn admission_policies_name_the_daemon(objects: &[Value], daemonset: &Value) {
    let pod = &daemonset["spec"]["template"]["spec"];
    // The node policies (slices, IPBlocks) match the ServiceAccount the DaemonSet runs as.
    let service_account = pod["serviceAccountName"].as_str().unwrap();
    let namespace = daemonset["metadata"]["namespace"].as_str().unwrap();
    for name in ["netclaim-node-slices", "netclaim-node-ipblocks", "netclaim-node-ipblocks-network"]
    {
        let policy = find(objects, "ValidatingAdmissionPolicy", name)
            .unwrap_or_else(|| panic!("no policy {name}"));
        let condition = policy["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
        assert!(
            condition.contains(&format!("'system:serviceaccount:{namespace}:{service_account}'")),
            "{name}: {condition}"
        );
    }
    // The IPBlock network policy's parameters are the PodNetworks, all of them.
    let binding =
        find(objects, "ValidatingAdmissionPolicyBinding", "netclaim-node-ipblocks-network")
            .unwrap();
    assert_eq!(binding["spec"]["paramRef"]["selector"], serde_json::json!({}));
    for policy in objects.iter().filter(|o| o["kind"] == "ValidatingAdmissionPolicy") {
        let name = policy["metadata"]["name"].as_str().unwrap();
        let binding = find(objects, "ValidatingAdmissionPolicyBinding", name)
            .unwrap_or_else(|| panic!("policy {name} has no binding"));
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
    }
}

fn has_granular_status_grant(objects: &[Value]) -> bool {
    objects.iter().filter(|o| o["kind"] == "ClusterRole").any(|role| {
        role["rules"].as_array().into_iter().flatten().any(|rule| {
            rule["resources"].as_array().into_iter().flatten().any(|r| r == "resourceclaims/driver")
        })
    })
}

fn daemonset_args(objects: &[Value]) -> Vec<String> {
    find(objects, "DaemonSet", "netclaim-node").unwrap()["spec"]["template"]["spec"]["containers"]
        [0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

#[test]
#[ignore = "needs kubectl (scripts/setup/kubectl.sh): run `make test`"]
fn the_overlays_change_what_they_name() {
    let base = render(&deploy().join("base"));
    assert!(has_granular_status_grant(&base), "the base grants resourceclaims/driver (1.36+)");
    assert!(!daemonset_args(&base).iter().any(|a| a.starts_with("--sharing-mode")));

    let old = render(&deploy().join("overlays/k8s-1.34"));
    assert!(!has_granular_status_grant(&old), "1.34/1.35 have no resourceclaims/driver");
    assert!(find(&old, "ClusterRoleBinding", "netclaim-node-claim-status").is_none());
    // The claim status policy pins what RBAC cannot there; it matches the node's identity.
    let policy = find(&old, "ValidatingAdmissionPolicy", "netclaim-node-claim-status")
        .expect("1.34/1.35 pin the node's claim status writes");
    let condition = policy["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(
        condition.contains("'system:serviceaccount:netclaim-system:netclaim-node'"),
        "{condition}"
    );
    assert!(find(&old, "ValidatingAdmissionPolicyBinding", "netclaim-node-claim-status").is_some());
    assert!(find(&base, "ValidatingAdmissionPolicy", "netclaim-node-claim-status").is_none());
    assert_eq!(
        old.len(),
        base.len(),
        "the granular role and its binding go, the claim status policy and its binding come"
    );

    let slots = render(&deploy().join("overlays/slots"));
    assert!(daemonset_args(&slots).contains(&"--sharing-mode=slots".to_owned()));
    assert_eq!(slots.len(), base.len());
}
