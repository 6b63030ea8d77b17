//! Root test of `examples/attach_macvlan.rs`: the library alone (no daemon, no cluster)
//! attaches a macvlan with addresses and a route into a throwaway pod netns, on a veth parent
//! in a throwaway node netns, and detaches it again. Checked from outside with `ip -j`.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::PathBuf;

use serde_json::Value;

use crate::kit::netns::{Netns, require_root};

/// The example binary cargo built beside this test (`target/<profile>/examples/`).
fn example_binary() -> PathBuf {
    let test = std::env::current_exe().unwrap();
    // target/<profile>/deps/<test> → target/<profile>/examples/attach_macvlan
    let profile_dir = test.parent().and_then(|deps| deps.parent()).unwrap();
    let binary = profile_dir.join("examples").join("attach_macvlan");
    assert!(
        binary.exists(),
        "{} is missing: cargo test / nextest build the examples with the tests",
        binary.display()
    );
    binary
}

fn pod_links(pod: &Netns) -> Vec<Value> {
    let out = pod.ip(&["-j", "-d", "addr", "show"]);
    let links: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    links.into_iter().filter(|l| l["ifname"] != "lo").collect()
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn the_example_attaches_and_detaches_a_macvlan_through_the_library() {
    if !require_root("the_example_attaches_and_detaches_a_macvlan_through_the_library") {
        return;
    }
    let (node, pod) = (Netns::new(), Netns::new());
    let parent = node.ifname("p0");
    let peer = node.ifname("p1");
    node.ip(&["link", "add", &parent, "mtu", "1500", "type", "veth", "peer", "name", &peer]);
    node.ip(&["link", "set", &parent, "up"]);
    node.ip(&["link", "set", &peer, "up"]);
    let pod_path = format!("/run/netns/{}", pod.name);
    let config = serde_json::json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "NetworkConfig",
        "interface": {"name": "net7", "mtu": 1400},
        "ipam": {"addresses": ["10.78.0.2/24", "fd00:78::2/64"]},
        "routes": [{"destination": "10.79.0.0/16", "gateway": "10.78.0.1"}],
    })
    .to_string();
    let binary = example_binary();
    let binary = binary.to_str().unwrap();
    let args = ["--parent", parent.as_str(), "--netns", pod_path.as_str(), "--config", &config];

    let attach: Vec<&str> = [&["attach"][..], &args].concat();
    let out = node.exec(binary, &attach);
    assert!(out.status.success(), "attach: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("attached net7 (mtu 1400"), "{stdout}");

    let links = pod_links(&pod);
    assert_eq!(links.len(), 1, "{links:?}");
    let link = &links[0];
    assert_eq!(link["ifname"], "net7");
    assert_eq!(link["mtu"], 1400);
    assert_eq!(link["linkinfo"]["info_kind"], "macvlan");
    let addresses: Vec<String> = link["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["scope"] == "global")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    assert_eq!(addresses, ["10.78.0.2/24", "fd00:78::2/64"]);
    let routes: Vec<Value> =
        serde_json::from_slice(&pod.ip(&["-j", "-4", "route", "show", "dev", "net7"]).stdout)
            .unwrap();
    assert!(routes.iter().any(|r| r["dst"] == "10.79.0.0/16" && r["gateway"] == "10.78.0.1"));

    // A bad config is refused with the field named, and changes nothing.
    let bad = config.replace("\"mtu\":1400", "\"mtu\":99999");
    let bad_args = ["attach", "--parent", &parent, "--netns", &pod_path, "--config", &bad];
    let out = node.exec(binary, &bad_args);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mtu"), "{out:?}");
    assert_eq!(pod_links(&pod).len(), 1);

    let detach: Vec<&str> = [&["detach"][..], &args].concat();
    let out = node.exec(binary, &detach);
    assert!(out.status.success(), "detach: {}", String::from_utf8_lossy(&out.stderr));
    assert!(pod_links(&pod).is_empty(), "the macvlan is gone from the pod");
}
