//! Root integration tests: `netclaim inventory` inside throwaway network namespaces with
//! veth, macvlan and bridge topologies (this kernel has no bond, dummy or vlan modules).

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use serde_json::Value;

use crate::kit::netns::{Netns, require_root};

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");

fn inventory_json(netns: &Netns, args: &[&str]) -> Value {
    let mut full = vec!["inventory", "-o", "json", "--node-name", "test-node"];
    full.extend_from_slice(args);
    let output = netns.exec(NETCLAIM, &full);
    assert!(
        output.status.success(),
        "inventory failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("inventory -o json prints JSON")
}

fn inventory_table(netns: &Netns, args: &[&str]) -> String {
    let mut full = vec!["inventory", "--node-name", "test-node"];
    full.extend_from_slice(args);
    let output = netns.exec(NETCLAIM, &full);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).unwrap()
}

/// All devices of all slices in a `List`.
fn devices(list: &Value) -> Vec<Value> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|slice| slice["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn device_for(list: &Value, if_name: &str) -> Option<Value> {
    devices(list).into_iter().find(|d| d["attributes"]["ifName"]["string"] == if_name)
}

fn mac_of(netns: &Netns, if_name: &str) -> String {
    let output = netns.ip(&["-j", "link", "show", if_name]);
    let links: Value = serde_json::from_slice(&output.stdout).unwrap();
    links[0]["address"].as_str().unwrap().to_owned()
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_veth_shared_parent_is_published_with_capacity() {
    if !require_root("a_veth_shared_parent_is_published_with_capacity") {
        return;
    }
    let netns = Netns::new();
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    netns.ip(&["link", "add", &parent, "mtu", "1400", "type", "veth", "peer", "name", &peer]);
    netns.ip(&["link", "set", &parent, "up"]);

    let list = inventory_json(&netns, &["--shared-parents", &parent]);
    assert_eq!(list["kind"], "List");
    let slice = &list["items"][0];
    assert_eq!(slice["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(slice["kind"], "ResourceSlice");
    assert_eq!(slice["spec"]["driver"], "netclaim.dev");
    assert_eq!(slice["spec"]["nodeName"], "test-node");
    assert_eq!(slice["spec"]["pool"]["name"], "test-node");
    assert_eq!(slice["spec"]["pool"]["resourceSliceCount"], 1);

    let device = device_for(&list, &parent).expect("the shared parent is published");
    assert_eq!(device["name"], parent.as_str());
    assert_eq!(device["allowMultipleAllocations"], true);
    assert_eq!(device["capacity"]["netclaim.dev/interfaces"]["value"], "256");
    assert_eq!(device["capacity"]["netclaim.dev/interfaces"]["requestPolicy"]["default"], "1");
    let attributes = &device["attributes"];
    assert_eq!(attributes["mac"]["string"], mac_of(&netns, &parent).as_str());
    assert_eq!(attributes["mtu"]["int"], 1400);
    assert_eq!(attributes["type"]["string"], "virtual");
    assert_eq!(attributes["sharing"]["string"], "shared");
    assert!(attributes.get("pciAddress").is_none(), "a veth has no PCI address");
    assert!(device_for(&list, &peer).is_none(), "an unlisted veth is left to the node");
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn exclusion_rules_hold_on_a_real_topology() {
    if !require_root("exclusion_rules_hold_on_a_real_topology") {
        return;
    }
    let netns = Netns::new();
    let bridge = netns.ifname("br");
    let (port, port_peer) = (netns.ifname("bp0"), netns.ifname("bp1"));
    let (uplink, uplink_peer) = (netns.ifname("up0"), netns.ifname("up1"));
    let (addressed, addressed_peer) = (netns.ifname("ad0"), netns.ifname("ad1"));
    let (lower, lower_peer) = (netns.ifname("lw0"), netns.ifname("lw1"));
    let macvlan = netns.ifname("mv");
    netns.ip(&["link", "add", &bridge, "type", "bridge"]);
    for (a, b) in [
        (&port, &port_peer),
        (&uplink, &uplink_peer),
        (&addressed, &addressed_peer),
        (&lower, &lower_peer),
    ] {
        netns.ip(&["link", "add", a, "type", "veth", "peer", "name", b]);
        netns.ip(&["link", "set", a, "up"]);
        netns.ip(&["link", "set", b, "up"]);
    }
    netns.ip(&["link", "set", &port, "master", &bridge]);
    netns.ip(&["addr", "add", "198.51.100.2/24", "dev", &uplink]);
    netns.ip(&["route", "add", "default", "via", "198.51.100.1", "dev", &uplink]);
    netns.ip(&["addr", "add", "203.0.113.7/24", "dev", &addressed]);
    netns.ip(&["link", "add", &macvlan, "link", &lower, "type", "macvlan", "mode", "bridge"]);

    let include = format!("{}*", netns.prefix);
    let table = inventory_table(&netns, &["--include-interfaces", &include]);
    let reason = |name: &str| {
        table
            .lines()
            .find(|line| line.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing from\n{table}"))
            .to_owned()
    };
    assert!(reason(&bridge).contains("cannot move to a pod"), "{table}");
    assert!(reason(&port).contains(&format!("port of bridge {bridge}")), "{table}");
    assert!(reason(&uplink).contains("default route"), "{table}");
    assert!(reason(&addressed).contains("203.0.113.7/24"), "{table}");
    assert!(reason("lo").contains("loopback"), "{table}");

    let list = inventory_json(&netns, &["--include-interfaces", &include]);
    let published = device_for(&list, &macvlan).expect("an included macvlan is published");
    assert_eq!(published["attributes"]["sharing"]["string"], "exclusive");
    assert!(published.get("allowMultipleAllocations").is_none());
    for excluded in [&bridge, &port, &uplink, &addressed] {
        assert!(device_for(&list, excluded).is_none(), "{excluded} must not be published");
    }

    // The same interfaces as shared parents: the bridge and the node's uplink qualify, the
    // bridge port does not (the kernel would refuse a macvlan on it).
    let parents = format!("{bridge},{uplink},{port}");
    let list = inventory_json(&netns, &["--shared-parents", &parents]);
    assert_eq!(device_for(&list, &bridge).unwrap()["allowMultipleAllocations"], true);
    assert_eq!(device_for(&list, &uplink).unwrap()["allowMultipleAllocations"], true);
    assert!(device_for(&list, &port).is_none());
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn changes_in_the_kernel_show_in_the_next_inventory() {
    if !require_root("changes_in_the_kernel_show_in_the_next_inventory") {
        return;
    }
    let netns = Netns::new();
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    netns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
    let before = inventory_json(&netns, &["--shared-parents", &parent]);
    let device = device_for(&before, &parent).unwrap();
    assert_eq!(device["attributes"]["mtu"]["int"], 1500);
    assert_eq!(device["attributes"]["operState"]["string"], "down");

    netns.ip(&["link", "set", &parent, "mtu", "9000"]);
    netns.ip(&["link", "set", &parent, "up"]);
    netns.ip(&["link", "set", &peer, "up"]);
    let after = inventory_json(&netns, &["--shared-parents", &parent]);
    let device = device_for(&after, &parent).unwrap();
    assert_eq!(device["attributes"]["mtu"]["int"], 9000);
    assert_eq!(device["attributes"]["operState"]["string"], "up");

    netns.ip(&["link", "del", &parent]);
    let gone = inventory_json(&netns, &["--shared-parents", &parent]);
    assert!(device_for(&gone, &parent).is_none());
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn slot_mode_and_environment_variables() {
    if !require_root("slot_mode_and_environment_variables") {
        return;
    }
    let netns = Netns::new();
    let (parent, peer) = (netns.ifname("p0"), netns.ifname("p1"));
    netns.ip(&["link", "add", &parent, "type", "veth", "peer", "name", &peer]);
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", &netns.name, NETCLAIM, "inventory", "-o", "yaml"])
        .env("NETCLAIM_SHARED_PARENTS", &parent)
        .env("NETCLAIM_SHARING_MODE", "slots")
        .env("NETCLAIM_NODE_NAME", "env-node")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    let slices: Vec<Value> = text
        .split("---\n")
        .filter(|doc| !doc.trim().is_empty())
        .map(|doc| yaml_serde::from_str(doc).expect("each document is YAML"))
        .collect();
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0]["spec"]["pool"]["name"], "env-node");
    let names: Vec<String> = slices[0]["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 32, "{names:?}");
    for index in 0..32 {
        assert!(names.contains(&format!("{parent}-s{index}")), "{names:?}");
    }
    assert!(slices[0]["spec"]["devices"][0].get("allowMultipleAllocations").is_none());
}

/// A host with hundreds of links (a veth per pod): the dumps span many datagrams, each read
/// and reduced as it arrives (`host::netlink_dump`); every link is found, and the one with
/// the default route is still recognised as the node's uplink.
#[test]
#[ignore = "needs root: run `make test` as root"]
fn three_hundred_links_are_all_discovered_and_the_uplink_recognised() {
    if !require_root("three_hundred_links_are_all_discovered_and_the_uplink_recognised") {
        return;
    }
    let netns = Netns::new();
    let mut names = Vec::new();
    for n in 0..150 {
        let (a, b) = (netns.ifname(&format!("a{n}")), netns.ifname(&format!("b{n}")));
        netns.ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        names.push(a);
        names.push(b);
    }
    let uplink = names[0].clone();
    netns.ip(&["link", "set", &uplink, "up"]);
    netns.ip(&["link", "set", &names[1], "up"]);
    netns.ip(&["addr", "add", "10.99.0.2/24", "dev", &uplink]);
    netns.ip(&["route", "add", "default", "via", "10.99.0.1"]);
    let pattern = format!("{}*", netns.ifname(""));
    let list = inventory_json(&netns, &["--include-interfaces", &pattern]);
    let mut published: Vec<String> = devices(&list)
        .iter()
        .map(|d| d["attributes"]["ifName"]["string"].as_str().unwrap().to_owned())
        .collect();
    published.sort();
    let mut expected: Vec<String> = names.iter().filter(|n| **n != uplink).cloned().collect();
    expected.sort();
    assert_eq!(published, expected, "every link but the uplink, once");
    let table = inventory_table(&netns, &["--include-interfaces", &pattern]);
    assert!(
        table.lines().any(|l| l.starts_with(&uplink) && l.contains("default route")),
        "{table}"
    );
}

/// The notifications that keep the inventory live, on a real kernel: nothing while the
/// namespace is quiet; a link added, an address added, the link set up and a route added each
/// wake the
/// subscriber (their content is never decoded).
#[test]
#[ignore = "needs root: run `make test` as root"]
fn link_address_and_route_changes_each_wake_the_subscriber() {
    use std::time::Duration;
    if !require_root("link_address_and_route_changes_each_wake_the_subscriber") {
        return;
    }
    let netns = Netns::new();
    let (a, b) = (netns.ifname("a0"), netns.ifname("b0"));
    let steps: Vec<Vec<String>> = vec![
        vec![
            "link".into(),
            "add".into(),
            a.clone(),
            "type".into(),
            "veth".into(),
            "peer".into(),
            "name".into(),
            b.clone(),
        ],
        vec!["addr".into(), "add".into(), "10.98.0.2/24".into(), "dev".into(), a.clone()],
        vec!["link".into(), "set".into(), a.clone(), "up".into()],
        vec!["route".into(), "add".into(), "10.97.0.0/24".into(), "dev".into(), a.clone()],
    ];
    let name = netns.name.clone();
    netns.block_on(move || async move {
        let mut changes = netclaim::host::link_events::subscribe().unwrap();
        // Quiet namespace: nothing arrives.
        let quiet = tokio::time::timeout(Duration::from_millis(200), changes.recv()).await;
        assert!(quiet.is_err(), "a notification without a change");
        for step in steps {
            let mut args = vec!["-n".to_owned(), name.clone()];
            args.extend(step.iter().cloned());
            let out = std::process::Command::new("ip").args(&args).output().unwrap();
            assert!(out.status.success(), "ip {args:?}: {out:?}");
            let woke = tokio::time::timeout(Duration::from_secs(5), changes.recv()).await;
            assert_eq!(woke, Ok(Some(())), "no notification after ip {step:?}");
            // Drain what the same change sent more (several messages per change).
            tokio::time::sleep(Duration::from_millis(50)).await;
            while changes.try_recv().is_ok() {}
        }
    });
}

/// A pod's veth (its peer in another namespace) is discovered without reading sysfs, where
/// each `speed` read waits for the RTNL lock; a veth pair with both ends here is still read.
/// The sysfs root is an empty directory, so a link whose facts were read is dropped as "gone
/// since the dump" and the pod's veth is the only one kept.
#[test]
#[ignore = "needs root: run `make test` as root"]
fn a_pods_veth_is_discovered_without_reading_sysfs() {
    if !require_root("a_pods_veth_is_discovered_without_reading_sysfs") {
        return;
    }
    let (node, pod) = (Netns::new(), Netns::new());
    let (host_end, pod_end) = (node.ifname("h0"), node.ifname("c0"));
    let (local_a, local_b) = (node.ifname("a0"), node.ifname("b0"));
    node.ip(&["link", "add", &host_end, "type", "veth", "peer", "name", &pod_end]);
    node.ip(&["link", "set", &pod_end, "netns", &pod.name]);
    node.ip(&["link", "add", &local_a, "type", "veth", "peer", "name", &local_b]);
    let empty_sysfs = tempfile::tempdir().unwrap();
    let root = empty_sysfs.path().to_owned();
    let found = node.block_on(move || async move {
        netclaim::host::discovery::discover(&netclaim::host::sysfs::Sysfs::new(root)).await.unwrap()
    });
    let names: Vec<&str> = found.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, vec![host_end.as_str()], "only the pod's veth skips sysfs");
    assert!(!found[0].hardware.has_device);
}
