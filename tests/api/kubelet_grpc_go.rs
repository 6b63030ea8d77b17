//! The kubelet sockets against the real kubelet client library: `tests/kubelet-client`
//! (grpc-go, built from Debian packages by `scripts/setup/grpc-go-client.sh`) dials both
//! sockets by bare path exactly as kubelet does.
//!
//! Needs the client binary: `NETCLAIM_KUBELET_CLIENT`, else
//! `/opt/netclaim-test/bin/kubelet-client`. The tests are `#[ignore]`d (reported as skipped by
//! a plain `cargo nextest run`); `make test` installs the client and runs them, and a run
//! without the client fails.

#![allow(clippy::unwrap_used, reason = "test helpers: a failed step fails the test")]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use netclaim::claims::{
    ClaimPreparer, PrepareResults, PreparedDevice, UnavailablePreparer, UnprepareResults,
};
use netclaim::kubelet::KubeletPlugin;
use netclaim::kubelet::proto::pluginregistration::{
    self as reg, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use netclaim::model::ClaimRef;
use serde_json::Value;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::kit::kubelet::{PluginDirs, eventually, fast_config};

const DRIVER: &str = "netclaim.dev";

fn client_binary(test: &str) -> PathBuf {
    let path = std::env::var_os("NETCLAIM_KUBELET_CLIENT")
        .map_or_else(|| PathBuf::from("/opt/netclaim-test/bin/kubelet-client"), PathBuf::from);
    assert!(
        path.is_file(),
        "{test}: grpc-go kubelet client {} is missing; run scripts/setup/grpc-go-client.sh",
        path.display()
    );
    path
}

/// Output of one run of the Go client: exit success and its JSON report lines.
struct ClientRun {
    success: bool,
    reports: Vec<Value>,
    stderr: String,
}

impl ClientRun {
    fn calls(&self, call: &str) -> Vec<&Value> {
        self.reports.iter().filter(|r| r["call"] == call).collect()
    }
}

async fn run_client(binary: &Path, registration: &Path, extra: &[&str]) -> ClientRun {
    let mut command = std::process::Command::new(binary);
    command
        .arg("-registration")
        .arg(registration)
        .args([
            "-driver",
            DRIVER,
            "-claim-namespace",
            "ns",
            "-claim-name",
            "net",
            "-claim-uid",
            "uid-9",
        ])
        .args(extra);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("kubelet-client runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let reports = stdout
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad report {line:?}: {e}"))
        })
        .collect();
    ClientRun {
        success: output.status.success(),
        reports,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

struct FixedInfo(String);

#[tonic::async_trait]
impl reg::registration_server::Registration for FixedInfo {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(PluginInfo {
            r#type: "DRAPlugin".into(),
            name: DRIVER.into(),
            endpoint: self.0.clone(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        _: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(RegistrationStatusResponse {}))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go kubelet client (scripts/setup/grpc-go-client.sh): run `make test`"]
async fn grpc_go_cannot_reach_a_plain_tonic_server() {
    // Proves the problem with the real client library: grpc-go's bare-path dial sends the
    // percent-encoded path as :authority and plain tonic resets the stream.
    let binary = client_binary("grpc_go_cannot_reach_a_plain_tonic_server");
    let dirs = PluginDirs::new(DRIVER);
    std::fs::create_dir_all(&dirs.registry).unwrap();
    let sock = dirs.registry.join("plain-reg.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(
                FixedInfo(String::new()),
            ))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let run = run_client(&binary, &sock, &[]).await;
    assert!(!run.success, "GetInfo must fail against plain tonic: {:?}", run.reports);
    let get_info = run.calls("GetInfo");
    let error = get_info[0]["error"].as_str().unwrap();
    assert!(error.contains("PROTOCOL_ERROR"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go kubelet client (scripts/setup/grpc-go-client.sh): run `make test`"]
async fn grpc_go_registers_the_driver_and_reaches_both_dra_versions() {
    let binary = client_binary("grpc_go_registers_the_driver_and_reaches_both_dra_versions");
    let dirs = PluginDirs::new(DRIVER);
    let handle = KubeletPlugin::start(
        fast_config(&dirs),
        Arc::new(UnavailablePreparer::new(DRIVER)),
        std::future::pending(),
    )
    .await
    .unwrap();
    let run = run_client(&binary, handle.registration_socket(), &[]).await;
    assert!(run.success, "client failed: {}\n{:?}", run.stderr, run.reports);

    let info = &run.calls("GetInfo")[0]["info"];
    assert_eq!(info["type"], "DRAPlugin");
    assert_eq!(info["name"], DRIVER);
    assert_eq!(info["endpoint"], handle.dra_socket().to_str().unwrap());
    assert_eq!(
        info["supported_versions"],
        serde_json::json!([
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth"
        ])
    );
    assert_eq!(run.calls("NotifyRegistrationStatus")[0]["ok"], true);

    let prepares = run.calls("NodePrepareResources");
    assert_eq!(prepares.len(), 4, "v1 and v1beta1, each by bare path and unix: target");
    for report in prepares {
        assert_eq!(report["ok"], true, "{report}");
        let error = report["claims"]["uid-9"]["error"].as_str().unwrap();
        assert!(error.contains("ns/net (uid uid-9)") && error.contains("not available"), "{error}");
    }
    let unprepares = run.calls("NodeUnprepareResources");
    assert_eq!(unprepares.len(), 4);
    for report in unprepares {
        assert_eq!(report["ok"], true, "{report}");
        assert_eq!(report["claims"]["uid-9"]["error"], "");
    }
    handle.stop();
    handle.wait().await.unwrap();
}

struct SharedDevice;

impl ClaimPreparer for SharedDevice {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        claims
            .into_iter()
            .map(|c| {
                let device = PreparedDevice {
                    pool_name: "node-a".into(),
                    device_name: "eth1".into(),
                    share_id: Some("0b6a7c1e".into()),
                    ..PreparedDevice::default()
                };
                (c.uid, Ok(vec![device]))
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go kubelet client (scripts/setup/grpc-go-client.sh): run `make test`"]
async fn grpc_go_sees_devices_and_share_id_only_on_v1() {
    let binary = client_binary("grpc_go_sees_devices_and_share_id_only_on_v1");
    let dirs = PluginDirs::new(DRIVER);
    let handle =
        KubeletPlugin::start(fast_config(&dirs), Arc::new(SharedDevice), std::future::pending())
            .await
            .unwrap();
    let run = run_client(&binary, handle.registration_socket(), &[]).await;
    assert!(run.success, "client failed: {}\n{:?}", run.stderr, run.reports);
    for report in run.calls("NodePrepareResources") {
        let device = &report["claims"]["uid-9"]["devices"][0];
        assert_eq!(device["pool_name"], "node-a");
        assert_eq!(device["device_name"], "eth1");
        let expected =
            if report["version"] == "v1" { serde_json::json!("0b6a7c1e") } else { Value::Null };
        assert_eq!(device["share_id"], expected, "{report}");
    }
    handle.stop();
    handle.wait().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the grpc-go kubelet client (scripts/setup/grpc-go-client.sh): run `make test`"]
async fn grpc_go_registration_failure_makes_the_driver_register_again() {
    let binary = client_binary("grpc_go_registration_failure_makes_the_driver_register_again");
    let dirs = PluginDirs::new(DRIVER);
    let handle = KubeletPlugin::start(
        fast_config(&dirs),
        Arc::new(UnavailablePreparer::new(DRIVER)),
        std::future::pending(),
    )
    .await
    .unwrap();
    let sock = handle.registration_socket().to_owned();
    let inode = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).map(|m| (m.ino(), m.mtime_nsec())).ok()
    };
    let before = inode(&sock);
    let run = run_client(
        &binary,
        &sock,
        &["-notify-error", "RegisterPlugin error -- plugin validation failed"],
    )
    .await;
    assert!(run.success, "client failed: {}\n{:?}", run.stderr, run.reports);
    eventually("registration socket recreated", || {
        inode(&sock).is_some_and(|now| Some(now) != before)
    })
    .await;
    // Kubelet's next attempt (a new connection to the new socket) succeeds.
    let run = run_client(&binary, &sock, &[]).await;
    assert!(run.success, "client failed: {}\n{:?}", run.stderr, run.reports);
    handle.stop();
    handle.wait().await.unwrap();
}
