//! Every shipped example (`examples/`, `deploy/examples/`) applied with the real kubectl to one
//! `netclaim dev`, all at once, as a user trying them would: each pod that can run there gets
//! Running with an address from its own example's subnet, and no two pods share an address.
//!
//! The cluster runs inside a throwaway netns whose NICs are veths named as the examples and
//! docs/operations.md name them: `eth1`, the shared parent (`--shared-parents`) the generic
//! macvlan classes take, and each PodNetwork's `parents` (`eth2`); a network's parent is
//! published as that network's device only, so the two must differ. The node carries the
//! label `netclaim.dev/medianet=true` the example PodNetwork selects.
//! The host-device example cannot run on a dev node: its class takes only NICs with a device
//! behind them (`type: physical`) and a dev node's are veths (`virtual`); its objects must be
//! accepted and its pod must wait (Pending), not fail.
//!
//! Needs root and kubectl: `#[ignore]`d, run by `make test` as root.

#![allow(clippy::unwrap_used, reason = "a failed step fails the test")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use ipnetwork::IpNetwork;
use serde_json::Value;

use crate::kit;
use crate::kit::examples;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
const NODE: &str = "dev-node";
/// The shared parent of the generic macvlan examples (the node's `--shared-parents`).
const PARENT: &str = "eth1";
/// The host-device example's pod: it waits on a dev node (module docs).
const WAITS: &str = "host-device-example";
const WAIT: Duration = Duration::from_mins(1);

struct Kubectl<'a> {
    ns: &'a kit::netns::Netns,
    kubeconfig: PathBuf,
}

impl Kubectl<'_> {
    /// kubectl inside the test's netns (the API server listens on its loopback).
    fn run(&self, args: &[&str]) -> Output {
        let program = kit::kustomize::kubectl();
        let kubeconfig = format!("--kubeconfig={}", self.kubeconfig.display());
        let mut full = vec![kubeconfig.as_str()];
        full.extend_from_slice(args);
        self.ns.exec(program.to_str().unwrap(), &full)
    }

    fn ok(&self, args: &[&str]) -> String {
        let output = self.run(args);
        assert!(
            output.status.success(),
            "kubectl {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn list(&self, resource: &str) -> Vec<Value> {
        let text = self.ok(&["get", resource, "--all-namespaces", "-o", "json"]);
        let list: Value = serde_json::from_str(&text).unwrap();
        list["items"].as_array().unwrap().clone()
    }
}

/// Each pod of the examples → the subnets its addresses must come from: those of its own
/// file, or, for a pod on a PodNetwork (its file declares none), that network's subnets.
fn expected_subnets(files: &[PathBuf]) -> BTreeMap<String, Vec<IpNetwork>> {
    let networks: BTreeMap<String, Vec<IpNetwork>> = files
        .iter()
        .flat_map(|file| {
            examples::objects(file)
                .into_iter()
                .filter(|o| o["kind"] == "PodNetwork")
                .map(|o| {
                    (o["metadata"]["name"].as_str().unwrap().to_owned(), examples::subnets(file))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let mut out = BTreeMap::new();
    for file in files {
        let objects = examples::objects(file);
        let mut subnets = examples::subnets(file);
        if subnets.is_empty() {
            // A class named `<network>.podnetwork.netclaim.dev` is that network's.
            let text = serde_json::to_string(&objects).unwrap();
            for (network, network_subnets) in &networks {
                if text.contains(&format!("\"{network}.podnetwork.netclaim.dev\"")) {
                    subnets.extend(network_subnets);
                }
            }
        }
        for pod in objects.iter().filter(|o| o["kind"] == "Pod") {
            let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
            assert!(!subnets.is_empty(), "{}: pod {name} has no subnet", file.display());
            out.insert(name, subnets.clone());
        }
    }
    out
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The pods' phases, and the addresses the driver reported in their claims' status.
fn pods_and_addresses(kubectl: &Kubectl<'_>) -> BTreeMap<String, (String, Vec<IpNetwork>)> {
    let claims = kubectl.list("resourceclaims");
    let mut out = BTreeMap::new();
    for pod in kubectl.list("pods") {
        let name = pod["metadata"]["name"].as_str().unwrap().to_owned();
        let phase = pod["status"]["phase"].as_str().unwrap_or("").to_owned();
        let claim_names: Vec<&str> = pod["status"]["resourceClaimStatuses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["resourceClaimName"].as_str())
            .chain(
                pod["spec"]["resourceClaims"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|c| c["resourceClaimName"].as_str()),
            )
            .collect();
        let addresses = claims
            .iter()
            .filter(|c| claim_names.contains(&c["metadata"]["name"].as_str().unwrap()))
            .flat_map(|c| c["status"]["devices"].as_array().cloned().unwrap_or_default())
            .flat_map(|d| d["networkData"]["ips"].as_array().cloned().unwrap_or_default())
            .map(|ip| ip.as_str().unwrap().parse::<IpNetwork>().unwrap())
            .collect();
        out.insert(name, (phase, addresses));
    }
    out
}

fn scenario(kubectl: &Kubectl<'_>, files: &[PathBuf]) {
    let expected = expected_subnets(files);
    wait_for("the dev node", || kubectl.run(&["get", "node", NODE]).status.success());
    kubectl.ok(&["label", "node", NODE, "netclaim.dev/medianet=true"]);
    // All of them, one file after another as the docs say, without waiting in between.
    for file in files {
        kubectl.ok(&["apply", "-f", file.to_str().unwrap()]);
    }
    let runnable: Vec<&String> = expected.keys().filter(|name| *name != WAITS).collect();
    assert!(runnable.len() >= 3, "{expected:?}");
    let mut seen = BTreeMap::new();
    wait_for("every example pod but host-device Running with an address", || {
        seen = pods_and_addresses(kubectl);
        runnable.iter().all(|name| {
            seen.get(*name).is_some_and(|(phase, ips)| phase == "Running" && !ips.is_empty())
        }) || seen.values().any(|(phase, _)| phase == "Failed")
    });
    let mut all = Vec::new();
    for (name, subnets) in &expected {
        let (phase, ips) = seen.get(name).unwrap_or_else(|| panic!("no pod {name}: {seen:?}"));
        if name == WAITS {
            assert_eq!(phase, "Pending", "{name} waits for a physical NIC: {seen:?}");
            continue;
        }
        assert_eq!(phase, "Running", "{name}: {seen:?}");
        for ip in ips {
            assert!(
                subnets.iter().any(|s| s.contains(ip.ip())),
                "{name} has {ip}, outside its example's subnets {subnets:?}"
            );
            all.push((ip.ip(), name.clone()));
        }
        let shown: Vec<String> = ips.iter().map(ToString::to_string).collect();
        println!("{name}: {phase} {}", shown.join(", "));
    }
    all.sort();
    for pair in all.windows(2) {
        assert_ne!(pair[0].0, pair[1].0, "{} and {} share an address", pair[0].1, pair[1].1);
    }
}

#[test]
#[ignore = "needs root and kubectl: run `make test` as root"]
fn every_shipped_example_runs_side_by_side_in_one_dev_cluster() {
    if !kit::netns::require_root("examples_dev") {
        return;
    }
    let files = examples::files();
    let mut nics = vec![PARENT.to_owned()];
    for file in &files {
        for network in examples::objects(file).iter().filter(|o| o["kind"] == "PodNetwork") {
            for parent in network["spec"]["parents"].as_array().unwrap() {
                nics.push(parent.as_str().unwrap().to_owned());
            }
        }
    }
    nics.sort();
    nics.dedup();
    assert!(nics.len() >= 2, "the PodNetwork example has a parent of its own: {nics:?}");
    let ns = kit::netns::Netns::new();
    for (i, nic) in nics.iter().enumerate() {
        let peer = ns.ifname(&format!("q{i}"));
        ns.ip(&["link", "add", nic, "type", "veth", "peer", "name", &peer]);
        ns.ip(&["link", "set", nic, "up"]);
        ns.ip(&["link", "set", &peer, "up"]);
    }
    let include = nics.join(",");
    let dir = tempfile::Builder::new().prefix("ncexd").tempdir_in("/tmp").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    let run_parent = dir.path().join("run");
    std::fs::create_dir(&run_parent).unwrap();
    let args = [
        "dev",
        "--listen",
        "127.0.0.1:0",
        "--node-name",
        NODE,
        "--include-interfaces",
        &include,
        "--shared-parents",
        PARENT,
        "--kubeconfig-out",
        kubeconfig.to_str().unwrap(),
        "--run-dir",
        run_parent.to_str().unwrap(),
    ];
    let log = dir.path().join("dev.log");
    let mut dev = ns.spawn(NETCLAIM, &args, &log);
    let started = Instant::now();
    wait_for("the kubeconfig", || kubeconfig.exists());
    let kubectl = Kubectl { ns: &ns, kubeconfig: kubeconfig.clone() };
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| scenario(&kubectl, &files)));
    if let Err(panic) = result {
        eprintln!("netclaim dev log:\n{}", std::fs::read_to_string(&log).unwrap_or_default());
        std::panic::resume_unwind(panic);
    }
    println!("{} example files applied and running in {:?}", files.len(), started.elapsed());
    let took = dev.terminate(Duration::from_secs(30));
    assert!(took.is_some(), "netclaim dev did not stop on SIGTERM");
    assert!(!Path::new(&kubeconfig).exists(), "the kubeconfig was left behind");
}
