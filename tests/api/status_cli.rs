//! `netclaim status` against a status socket served in this process from a fixed document:
//! the table and the JSON output, `--state-dir` and `NETCLAIM_STATE_DIR`, and the one-line
//! error (exit 1) naming the socket when no daemon listens.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::path::Path;
use std::process::{Command, Output};

use netclaim::node::status_api::{self, NodeStatus};
use serde_json::json;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");

fn document() -> NodeStatus {
    serde_json::from_value(json!({
        "apiVersion": "netclaim.dev/v1alpha1",
        "kind": "NodeStatus",
        "node": "worker-3",
        "driver": "netclaim.dev",
        "version": "9.9.9",
        "collectedAt": "2026-11-25T10:00:00Z",
        "ready": true,
        "poolGeneration": 4,
        "counters": true,
        "devices": [
            {"name": "eth1", "interface": "eth1", "type": "physical", "sharing": "shared",
             "capacity": 256, "health": "Healthy"},
            {"name": "pci-0000-3b-00-1", "interface": "ens1f1", "type": "sriov-pf",
             "sharing": "exclusive", "health": "Unhealthy", "healthMessage": "ens1f1: link down"}
        ],
        "claims": [
            {"namespace": "media", "name": "cam-net", "uid": "u1", "pod": "cam-0",
             "devices": [{"request": "net", "device": "eth1", "shareId": "s1",
                          "hostInterface": "eth1", "mode": "macvlan",
                          "addresses": ["10.10.1.5/24"]}]}
        ],
        "pods": [
            {"namespace": "media", "name": "cam-0", "uid": "p1", "state": "attached",
             "netns": "/var/run/netns/cni-1",
             "interfaces": [{"name": "net1", "claim": "cam-net", "request": "net",
                             "device": "eth1", "mode": "macvlan", "hostInterface": "eth1",
                             "mac": "02:00:00:00:00:05", "mtu": 1500,
                             "addresses": ["10.10.1.5/24"],
                             "counters": {"rxBytes": 3_145_728, "rxPackets": 3000,
                                          "rxDropped": 0, "txBytes": 512, "txPackets": 4,
                                          "txDropped": 1}}]}
        ]
    }))
    .unwrap()
}

fn netclaim(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(NETCLAIM);
    command.args(args).env_remove("NETCLAIM_STATE_DIR").env_remove("NETCLAIM_STATUS_OUTPUT");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().unwrap()
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn prints_the_daemons_status_as_a_table_or_json() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join(status_api::SOCKET_NAME);
    let served = document();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = status_api::serve(&socket, std::sync::Arc::new(move || served.clone()), async {
        let _ignored = stopped.await;
    })
    .unwrap();

    let state_dir = dir.path().to_owned();
    let output =
        blocking(move || netclaim(&["status", "--state-dir", state_dir.to_str().unwrap()], &[]))
            .await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(
        table.starts_with("Node:      worker-3 (driver netclaim.dev, netclaim 9.9.9)\n"),
        "{table}"
    );
    for expected in [
        "Devices:   2 published, pool generation 4 (1 healthy, 1 unhealthy, 0 unknown)",
        "Claims:    1 prepared",
        "Pods:      1 with 1 interface",
        "Unhealthy: ens1f1: link down",
        "media/cam-net",
        "3.0 MiB 3000 pkt",
        "512 B 4 pkt",
    ] {
        assert!(table.contains(expected), "{expected:?} missing from\n{table}");
    }

    // -o json, and --state-dir through the environment (every flag reads NETCLAIM_<FLAG>).
    let state_dir = dir.path().to_owned();
    let output = blocking(move || {
        let mut command = Command::new(NETCLAIM);
        command.args(["status", "-o", "json"]).env("NETCLAIM_STATE_DIR", &state_dir);
        command.output().unwrap()
    })
    .await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let parsed: NodeStatus = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(parsed, document());

    // YAML through the command's own output variable (-o reads NETCLAIM_STATUS_OUTPUT).
    let state_dir = dir.path().to_owned();
    let output = blocking(move || {
        let mut command = Command::new(NETCLAIM);
        command
            .args(["status", "--state-dir", state_dir.to_str().unwrap()])
            .env("NETCLAIM_STATUS_OUTPUT", "yaml");
        command.output().unwrap()
    })
    .await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let parsed: NodeStatus = yaml_serde::from_slice(&output.stdout).unwrap();
    assert_eq!(parsed, document());

    stop.send(()).unwrap();
    task.await.unwrap();
}

#[test]
fn without_a_daemon_it_fails_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let output = netclaim(&["status"], &[("NETCLAIM_STATE_DIR", dir.path())]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let socket = dir.path().join("netclaim.sock");
    assert!(stderr.contains(&socket.display().to_string()), "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn a_bad_output_format_is_a_usage_error() {
    let output = netclaim(&["status", "-o", "xml"], &[]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("xml") && stderr.contains("table, json, yaml"), "{stderr}");
}
