//! The shipped examples (`examples/**/*.yaml`, `deploy/examples/*.yaml`) as a user finds them:
//! their objects, and the subnets each one hands addresses from. Shared by the test that they
//! never overlap (api tier) and the one that applies them all to `netclaim dev` (root tier).

use std::path::{Path, PathBuf};

use ipnetwork::IpNetwork;
use serde::Deserialize as _;
use serde_json::Value;

/// Every example manifest, sorted: the YAML files under `examples/` and `deploy/examples/`
/// (not the kustomization that lists the latter). Classes and networks sort before the pods
/// that use them within deploy/examples (`deviceclass-*`, then `*-pod`), which is also the
/// order a user applies them in.
#[must_use]
pub fn files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("the examples directory is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml")
                && path.file_name().is_some_and(|n| n != "kustomization.yaml")
            {
                out.push(path);
            }
        }
    }
    let mut out = Vec::new();
    walk(&crate::repo().join("examples"), &mut out);
    walk(&crate::repo().join("deploy/examples"), &mut out);
    out.sort();
    out
}

/// The objects of one manifest, empty documents left out.
#[must_use]
pub fn objects(file: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(file)
        .unwrap_or_else(|err| panic!("reading {}: {err}", file.display()));
    yaml_serde::Deserializer::from_str(&text)
        .map(|document| {
            Value::deserialize(document)
                .unwrap_or_else(|err| panic!("{} is not YAML: {err}", file.display()))
        })
        .filter(|v| !v.is_null())
        .collect()
}

/// The networks a manifest hands addresses from: every NetworkConfig's `ipam.pool.subnet`
/// and the networks of its static `ipam.addresses`, and every PodNetwork's `spec.ipam.subnets`
/// (found wherever they sit: a claim, a template, a class).
#[must_use]
pub fn subnets(file: &Path) -> Vec<IpNetwork> {
    fn network(text: &str, file: &Path) -> IpNetwork {
        let parsed: IpNetwork =
            text.parse().unwrap_or_else(|err| panic!("{}: {text}: {err}", file.display()));
        IpNetwork::new(parsed.network(), parsed.prefix()).expect("the prefix was valid already")
    }
    fn walk(value: &Value, file: &Path, out: &mut Vec<IpNetwork>) {
        match value {
            Value::Object(map) => {
                if let Some(ipam) = map.get("ipam") {
                    if let Some(subnet) = ipam["pool"]["subnet"].as_str() {
                        out.push(network(subnet, file));
                    }
                    for key in ["addresses", "subnets"] {
                        for text in ipam[key].as_array().into_iter().flatten() {
                            out.push(network(text.as_str().expect("a CIDR string"), file));
                        }
                    }
                }
                map.values().for_each(|v| walk(v, file, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, file, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for object in objects(file) {
        walk(&object, file, &mut out);
    }
    out
}

/// Whether two networks share an address.
#[must_use]
pub fn overlap(a: IpNetwork, b: IpNetwork) -> bool {
    a.contains(b.network()) || b.contains(a.network())
}
