//! In-process tests of the device health streams on the DRA socket (no root): both
//! `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth`, dialled as kubelet dials the DRA
//! socket (current kubelets: grpc-go `NewClient("unix:"+endpoint)`, authority `localhost`;
//! older 1.34-era ones: the bare path, percent-encoded by grpc-go), fed from a report the test
//! controls.
//!
//! Time: the streams' resend interval and device timeout are injected. The issue's "no change
//! for 45 s → still Healthy" is proven twice: here on the wire with every interval scaled by
//! 1/100 (resend every 100 ms, timeout 300 ms, watched for 450 ms), and with the production
//! 10 s / 30 s on tokio's paused, auto-advanced clock in `src/kubelet/health.rs`
//! (`an_unchanged_report_is_resent_every_interval_for_45_s`). Nothing here sleeps for long.

#![allow(clippy::unwrap_used, reason = "test helpers: a failed step fails the test")]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use netclaim::claims::UnavailablePreparer;
use netclaim::health::{DeviceHealth, HealthReport, HealthStatus};
use netclaim::kubelet::health::HealthStreamSettings;
use netclaim::kubelet::proto::{v1, v1alpha1};
use netclaim::kubelet::{KubeletPlugin, KubeletPluginConfig, KubeletPluginHandle};
use prost::Message;
use tokio::sync::watch;

use crate::kit::kubelet::{PluginDirs, RawGrpcClient, tonic_channel, weird_authorities};

const DRIVER: &str = "netclaim.dev";

fn report() -> HealthReport {
    let device = |name: &str, status, message: &str| DeviceHealth {
        device: name.into(),
        status,
        message: message.into(),
    };
    HealthReport {
        pool: "node-a".into(),
        devices: vec![
            device("eth1", HealthStatus::Healthy, "eth1 is up with carrier"),
            device(
                "eth2",
                HealthStatus::Unhealthy,
                "eth2 (net1 in pod default/web) has no carrier (operstate down)",
            ),
            device("pci-0000-3b-02-1", HealthStatus::Unknown, "cannot read the state of ens1f0v1"),
        ],
    }
}

async fn start(
    dirs: &PluginDirs,
    health: watch::Receiver<HealthReport>,
    settings: HealthStreamSettings,
) -> KubeletPluginHandle {
    let mut config = KubeletPluginConfig::new(DRIVER, &dirs.registry, &dirs.plugin);
    config.socket_check_interval = Duration::from_millis(20);
    config.health_stream = settings;
    KubeletPlugin::start(
        config.with_health(health),
        Arc::new(UnavailablePreparer::new(DRIVER)),
        std::future::pending(),
    )
    .await
    .unwrap()
}

fn now() -> i64 {
    i64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()).unwrap()
}

/// `(pool, device, health, message, timeout)` of each device, and the oldest
/// `last_updated_time`.
type Seen = (Vec<(String, String, i32, String, i64)>, i64);

macro_rules! seen {
    ($response:expr) => {{
        let response = $response;
        let oldest = response.devices.iter().map(|d| d.last_updated_time).min().unwrap();
        let devices = response
            .devices
            .into_iter()
            .map(|d| {
                let id = d.device.unwrap();
                (id.pool_name, id.device_name, d.health, d.message, d.health_check_timeout_seconds)
            })
            .collect::<Vec<_>>();
        (devices, oldest)
    }};
}

fn expected(timeout: i64) -> Vec<(String, String, i32, String, i64)> {
    report()
        .devices
        .into_iter()
        .map(|d| {
            let health = match d.status {
                HealthStatus::Unknown => v1::HealthStatus::Unknown,
                HealthStatus::Healthy => v1::HealthStatus::Healthy,
                HealthStatus::Unhealthy => v1::HealthStatus::Unhealthy,
            };
            ("node-a".to_owned(), d.device, i32::from(health), d.message, timeout)
        })
        .collect()
}

/// Opens a v1 stream over tonic (authority `localhost`, as the current kubelet sends).
async fn open_v1(handle: &KubeletPluginHandle) -> tonic::Streaming<v1::NodeWatchResourcesResponse> {
    let channel = tonic_channel(handle.dra_socket()).await;
    let mut client = v1::dra_resource_health_client::DraResourceHealthClient::new(channel);
    client.node_watch_resources(v1::NodeWatchResourcesRequest {}).await.unwrap().into_inner()
}

async fn open_v1alpha1(
    handle: &KubeletPluginHandle,
) -> tonic::Streaming<v1alpha1::NodeWatchResourcesResponse> {
    let channel = tonic_channel(handle.dra_socket()).await;
    let mut client = v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(channel);
    client.node_watch_resources(v1alpha1::NodeWatchResourcesRequest {}).await.unwrap().into_inner()
}

async fn next_v1(stream: &mut tonic::Streaming<v1::NodeWatchResourcesResponse>) -> Seen {
    let message = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    seen!(message.expect("a report within 5 s").unwrap().expect("the stream is open"))
}

async fn next_v1alpha1(
    stream: &mut tonic::Streaming<v1alpha1::NodeWatchResourcesResponse>,
) -> Seen {
    let message = tokio::time::timeout(Duration::from_secs(5), stream.message()).await;
    seen!(message.expect("a report within 5 s").unwrap().expect("the stream is open"))
}

#[tokio::test]
async fn both_versions_stream_every_device_and_resend_it_unchanged() {
    let dirs = PluginDirs::new(DRIVER);
    let (_report, health) = watch::channel(report());
    let settings = HealthStreamSettings {
        resend_interval: Duration::from_millis(200),
        check_timeout: Duration::from_secs(30),
    };
    let handle = start(&dirs, health, settings).await;

    let mut v1_stream = open_v1(&handle).await;
    let mut alpha_stream = open_v1alpha1(&handle).await;
    for (first, second, version) in [
        (next_v1(&mut v1_stream).await, next_v1(&mut v1_stream).await, "v1"),
        (
            next_v1alpha1(&mut alpha_stream).await,
            next_v1alpha1(&mut alpha_stream).await,
            "v1alpha1",
        ),
    ] {
        // Every device, pool = node, as published, with its status, message and 30 s timeout.
        assert_eq!(first.0, expected(30), "{version}");
        let before = now();
        assert!((before - 2..=before).contains(&first.1), "{version}: {} vs {before}", first.1);
        // The unchanged list again (kubelet would otherwise time it out), freshly stamped.
        assert_eq!(second.0, first.0, "{version}");
        assert!(second.1 >= first.1, "{version}");
    }
    // v1alpha1 and v1 share the enum numbering.
    assert_eq!(
        i32::from(v1alpha1::HealthStatus::Unhealthy),
        i32::from(v1::HealthStatus::Unhealthy)
    );
    handle.stop();
    handle.wait().await.unwrap();
}

/// "No change for 45 s → still Healthy", scaled by 1/100 (see the file doc): every gap
/// between two reports stays below the timeout, so kubelet never shows the device Unknown.
#[tokio::test]
async fn an_unchanged_device_never_outlives_its_timeout_on_the_wire() {
    let dirs = PluginDirs::new(DRIVER);
    let (_report, health) = watch::channel(report());
    let settings = HealthStreamSettings {
        resend_interval: Duration::from_millis(100),
        check_timeout: Duration::from_millis(300),
    };
    let handle = start(&dirs, health, settings).await;
    let mut stream = open_v1(&handle).await;
    let started = Instant::now();
    let mut last = started;
    let mut reports = 0;
    while started.elapsed() < Duration::from_millis(450) {
        let (devices, _) = next_v1(&mut stream).await;
        assert_eq!(devices[0].2, i32::from(v1::HealthStatus::Healthy), "eth1 stays Healthy");
        let gap = last.elapsed();
        assert!(gap < settings.check_timeout, "{gap:?} without a report");
        last = Instant::now();
        reports += 1;
    }
    assert!(reports >= 4, "{reports} reports in 450 ms");
    handle.stop();
    handle.wait().await.unwrap();
}

#[tokio::test]
async fn a_change_reaches_every_open_stream_at_once() {
    let dirs = PluginDirs::new(DRIVER);
    let (updates, health) = watch::channel(report());
    // Production pacing: what arrives within a second is the change, not a resend.
    let handle = start(&dirs, health, HealthStreamSettings::default()).await;
    let mut first = open_v1(&handle).await;
    let mut second = open_v1(&handle).await;
    let mut alpha = open_v1alpha1(&handle).await;
    next_v1(&mut first).await;
    next_v1(&mut second).await;
    next_v1alpha1(&mut alpha).await;

    let mut changed = report();
    changed.devices[0].status = HealthStatus::Unhealthy;
    changed.devices[0].message = "eth1 is administratively down (operstate down)".into();
    let sent = Instant::now();
    updates.send(changed).unwrap();
    let unhealthy = i32::from(v1::HealthStatus::Unhealthy);
    for (devices, _) in
        [next_v1(&mut first).await, next_v1(&mut second).await, next_v1alpha1(&mut alpha).await]
    {
        assert_eq!(devices[0].2, unhealthy);
        assert_eq!(devices[0].3, "eth1 is administratively down (operstate down)");
        assert_eq!(devices.len(), 3, "still the full list");
    }
    assert!(sent.elapsed() < Duration::from_secs(1), "{:?}", sent.elapsed());
    handle.stop();
    handle.wait().await.unwrap();
}

#[tokio::test]
async fn grpc_go_authorities_open_both_streams() {
    let dirs = PluginDirs::new(DRIVER);
    let (_report, health) = watch::channel(report());
    let handle = start(&dirs, health, HealthStreamSettings::default()).await;
    let socket = handle.dra_socket().to_owned();
    let mut authorities = weird_authorities(&socket).to_vec();
    authorities.push("localhost".into());
    for authority in authorities {
        let mut client = RawGrpcClient::connect(&socket).await;
        let message = client
            .first_streamed(&authority, "/v1.DRAResourceHealth/NodeWatchResources", &[])
            .await
            .unwrap_or_else(|outcome| panic!("{authority}: {outcome:?}"));
        let response = v1::NodeWatchResourcesResponse::decode(&message[..]).unwrap();
        assert_eq!(seen!(response).0, expected(30), "{authority}");
        let message = client
            .first_streamed(&authority, "/v1alpha1.DRAResourceHealth/NodeWatchResources", &[])
            .await
            .unwrap_or_else(|outcome| panic!("{authority}: {outcome:?}"));
        let response = v1alpha1::NodeWatchResourcesResponse::decode(&message[..]).unwrap();
        assert_eq!(seen!(response).0, expected(30), "{authority}");
    }
    handle.stop();
    handle.wait().await.unwrap();
}

#[tokio::test]
async fn stop_ends_open_streams_without_waiting_for_the_drain() {
    let dirs = PluginDirs::new(DRIVER);
    let (_report, health) = watch::channel(report());
    let handle = start(&dirs, health, HealthStreamSettings::default()).await;
    let mut stream = open_v1(&handle).await;
    next_v1(&mut stream).await;
    let stopped = Instant::now();
    handle.stop();
    let end = tokio::time::timeout(Duration::from_secs(5), stream.message()).await.unwrap();
    assert!(matches!(end, Ok(None)), "the stream ends cleanly: {end:?}");
    handle.wait().await.unwrap();
    // The server's drain waits up to 45 s for open calls: the streams must not hold it.
    assert!(stopped.elapsed() < Duration::from_secs(5), "{:?}", stopped.elapsed());
}
