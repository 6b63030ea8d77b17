//! `netclaim dev --demo --output json` end to end: the binary builds its own shared parent,
//! runs the API server, allocator, node daemon and dev kubelet, brings 15 pods up with a
//! macvlan each, pings, cleans up and reports. The test checks the report (15 distinct
//! addresses in 10.10.1.0/24, Ready pods, NetworkReady claims, answered pings), the exit code,
//! and that the host is clean afterwards (no link with the demo's names, no pinned netns, no
//! run dir, no process left). It prints the demo's wall time and peak RSS.
//!
//! The containerd variant runs the same demo through a private containerd 1.7 with NRI
//! (`testkit/src/containerd.rs`), with `--containerd` pointing at its CRI socket.
//!
//! Needs root (bare network namespaces, links), and containerd from
//! `scripts/setup/containerd.sh` for the second test: `#[ignore]`d, run by `make test` as
//! root, failing when either is missing.

#![allow(clippy::unwrap_used, reason = "a failed step fails the test")]

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::kit;

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
const DEMO_LIMIT: Duration = Duration::from_mins(5);

/// Runs the demo binary with `extra` flags; returns (exit success, report, stderr).
fn run_demo(run_dir: &Path, extra: &[&str]) -> (bool, Value, String) {
    let mut child = Command::new(NETCLAIM)
        .args(["dev", "--demo", "--output", "json", "--listen", "127.0.0.1:0", "--run-dir"])
        .arg(run_dir)
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if started.elapsed() > DEMO_LIMIT {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "the demo did not finish within {DEMO_LIMIT:?}; stderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let report: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "the demo printed no JSON report ({err}); stdout:\n{}\nstderr:\n{stderr}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    (output.status.success(), report, stderr)
}

fn host_links() -> Vec<String> {
    let output = kit::netns::run("ip", &["-o", "link", "show"]);
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect()
}

/// Mount points under `dir` (pinned namespaces the demo might have left).
fn mounts_under(dir: &Path) -> Vec<String> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.display().to_string();
    mounts
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|mount_point| mount_point.starts_with(&dir))
        .map(str::to_owned)
        .collect()
}

/// Processes whose command line mentions `needle`.
fn processes_mentioning(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains(needle) {
            found.push(format!("{}: {text}", entry.file_name().to_string_lossy()));
        }
    }
    found
}

/// The checks every mode shares.
fn check_report(success: bool, report: &Value, stderr: &str, run_dir: &Path) {
    assert!(success && report["success"] == true, "demo failed: {report:#}\nstderr:\n{stderr}");
    let pods = report["pods"].as_array().unwrap();
    assert_eq!(pods.len(), 15, "{report:#}");
    let subnet: ipnetwork::IpNetwork = "10.10.1.0/24".parse().unwrap();
    let mut addresses = BTreeSet::new();
    for pod in pods {
        assert_eq!(pod["phase"], "Running", "{pod}");
        assert_eq!(pod["ready"], true, "{pod}");
        assert_eq!(pod["networkReady"], true, "{pod}");
        assert_eq!(pod["interface"], "net1", "{pod}");
        assert!(pod["mac"].as_str().unwrap().len() == 17, "{pod}");
        let address: ipnetwork::IpNetwork = pod["addresses"][0].as_str().unwrap().parse().unwrap();
        assert!(subnet.contains(address.ip()), "{address} outside {subnet}");
        assert_ne!(address.ip().to_string(), "10.10.1.254", "the peer's address was handed out");
        addresses.insert(address.ip());
    }
    assert_eq!(addresses.len(), 15, "addresses are not distinct: {addresses:?}");
    let pings = report["pings"].as_array().unwrap();
    assert!(pings.len() >= 2, "{report:#}");
    assert!(pings.iter().any(|p| p["to"] == "peer"), "no ping to the parent's peer");
    assert!(pings.iter().any(|p| p["to"] != "peer"), "no ping between pods");
    for ping in pings {
        assert_eq!(ping["ok"], true, "{ping}");
    }
    let devices = report["claimStatus"]["devices"].as_array().unwrap();
    let ready =
        devices[0]["conditions"].as_array().unwrap().iter().any(|c| {
            c["type"] == "Ready" && c["status"] == "True" && c["reason"] == "NetworkReady"
        });
    assert!(ready, "{devices:?}");
    assert_eq!(report["cleanup"]["ok"], true, "{report:#}");

    // The host is clean: no link with the demo's prefix, nothing mounted or left in the run
    // dir, no process of the demo.
    let parent = report["parent"].as_str().unwrap();
    let prefix = parent.strip_suffix('p').unwrap();
    let leftovers: Vec<String> =
        host_links().into_iter().filter(|l| l.starts_with(prefix)).collect();
    assert!(leftovers.is_empty(), "links left: {leftovers:?}");
    assert!(mounts_under(run_dir).is_empty(), "mounts left: {:?}", mounts_under(run_dir));
    let entries: Vec<_> = std::fs::read_dir(run_dir).unwrap().flatten().map(|e| e.path()).collect();
    assert!(entries.is_empty(), "run dir not empty: {entries:?}");
    let processes = processes_mentioning(&run_dir.display().to_string());
    assert!(processes.is_empty(), "processes left: {processes:?}");
    println!(
        "demo ({}) wall {:.2}s (cluster {:.2}s, pods ready {:.2}s, cleanup {:.2}s), peak RSS {} KiB",
        report["mode"],
        report["timings"]["wallSeconds"].as_f64().unwrap(),
        report["timings"]["clusterStartSeconds"].as_f64().unwrap(),
        report["timings"]["podsReadySeconds"].as_f64().unwrap(),
        report["timings"]["cleanupSeconds"].as_f64().unwrap(),
        report["peakRssKib"],
    );
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn demo_in_bare_netns_mode_brings_up_15_pods_that_ping_and_leaves_the_host_clean() {
    if !kit::netns::require_root("dev_demo bare netns") {
        return;
    }
    let run_dir = tempfile::Builder::new().prefix("ncdemo").tempdir_in("/tmp").unwrap();
    let (success, report, stderr) = run_demo(run_dir.path(), &[]);
    assert_eq!(report["mode"], "bare-netns");
    check_report(success, &report, &stderr, run_dir.path());
}

#[test]
#[ignore = "needs root: run `make test` as root"]
fn demo_through_containerd_brings_up_15_pods_that_ping_and_leaves_the_host_clean() {
    let Some(tools) = kit::containerd::find_tools() else { return };
    let mut containerd = kit::containerd::Containerd::new(tools, Duration::from_secs(2));
    containerd.start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    drop(runtime.block_on(containerd.cri(Duration::from_secs(30))));
    containerd.import_image();
    let run_dir = tempfile::Builder::new().prefix("ncdemo").tempdir_in("/tmp").unwrap();
    let cri = containerd.cri_socket();
    let nri = containerd.nri_socket();
    let (success, report, stderr) = run_demo(
        run_dir.path(),
        &[
            "--containerd",
            cri.to_str().unwrap(),
            "--containerd-nri-socket",
            nri.to_str().unwrap(),
            "--pod-image",
            kit::containerd::IMAGE,
        ],
    );
    if !success {
        containerd.print_logs(&[]);
    }
    assert_eq!(report["mode"], "containerd");
    check_report(success, &report, &stderr, run_dir.path());
    // Every sandbox the demo started through CRI is gone again.
    let sandboxes = runtime.block_on(async {
        let client = containerd.cri(Duration::from_secs(30)).await;
        client.list_pod_sandbox(None).await.unwrap()
    });
    assert!(sandboxes.is_empty(), "sandboxes left in containerd: {sandboxes:?}");
}
