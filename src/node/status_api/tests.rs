//! The status document from fake daemon state, and the socket API in process: served on a
//! temp socket (mode 0600, a stale socket replaced, removed at shutdown) and read back by
//! [`fetch`].

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::*;
use crate::attach::AttachedDevice;
use crate::claims::{PodConsumer, PreparedClaimDevice};
use crate::health::DeviceHealth;
use crate::model::device::{DeviceKind, Sharing};
use crate::model::network_config::{Addressing, MacvlanMode, ResolvedMode};
use crate::model::stats::DirectionCounters;
use crate::podnet::AttachedInterface;
use crate::podnet::plan::tests::{config, device, pod};
use crate::podnet::plan::{AttachRequest, plan_attach};

fn facts(readiness: Result<(), String>) -> DaemonFacts {
    DaemonFacts {
        node: "node-a".to_owned(),
        driver: "netclaim.dev".to_owned(),
        readiness,
        pool_generation: 7,
        held_sharing_changes: Vec::new(),
        counters: true,
        collected_at: "2026-11-25T10:00:00Z".to_owned(),
    }
}

fn published(name: &str, if_name: &str, sharing: Sharing, network: Option<&str>) -> Device {
    let mut attributes = BTreeMap::new();
    if let Some(network) = network {
        attributes.insert(
            format!("{ATTRIBUTE_DOMAIN}/{}", attr::POD_NETWORK),
            crate::model::device::AttributeValue::String(network.to_owned()),
        );
    }
    Device {
        name: name.to_owned(),
        if_name: if_name.to_owned(),
        kind: DeviceKind::Physical,
        sharing,
        shared_capacity: (sharing == Sharing::Shared).then_some(256),
        bandwidth: None,
        slot_index: None,
        attributes,
    }
}

fn macvlan() -> crate::model::network_config::ResolvedNetworkConfig {
    config(
        ResolvedMode::Macvlan { mode: MacvlanMode::Bridge },
        Addressing::Static(vec!["10.10.1.5/24".parse().unwrap()]),
        vec![],
    )
}

fn prepared() -> PreparedClaim {
    PreparedClaim {
        uid: "claim-uid-1".to_owned(),
        namespace: "default".to_owned(),
        name: "web-net".to_owned(),
        devices: vec![PreparedClaimDevice {
            request: "net".to_owned(),
            pool: "node-a".to_owned(),
            device: "medianet-eth1".to_owned(),
            share_id: Some("7a3e…".to_owned()),
            if_name: "eth1".to_owned(),
            config: macvlan(),
            addresses: vec!["10.10.1.5/24".parse().unwrap()],
            sharing: None,
            kind: None,
            host_mtu: Some(1500),
            attributes: BTreeMap::new(),
            cdi_device_ids: vec![],
            vf: None,
            vfio: None,
            ethtool: None,
        }],
        reserved_for: vec![PodConsumer { name: "web".to_owned(), uid: "pod-1".to_owned() }],
        generation: Some(1),
        pod_claim_index: Some(0),
        pod_claim_name: None,
    }
}

fn attachment(with_result: bool) -> PodAttachment {
    let cfg = macvlan();
    let host = device("eth1", Sharing::Shared);
    let netns = pod();
    let plan = plan_attach(&AttachRequest {
        claim_uid: "claim-uid-1",
        config: &cfg,
        device: &host,
        pod: &netns,
        interface_name: "net1",
        pool_addresses: &[],
    })
    .unwrap();
    let result = with_result.then(|| AttachedInterface {
        name: "net1".to_owned(),
        mode: plan.mode,
        host_device: "eth1".to_owned(),
        mac: Some("02:00:00:00:00:01".parse().unwrap()),
        mtu: 1400,
        addresses: vec!["10.10.1.5/24".parse().unwrap()],
        routes: vec![],
        routing: crate::podnet::plan::AppliedRouting::default(),
        rdma_device: None,
    });
    PodAttachment {
        pod_uid: "pod-1".to_owned(),
        pod_name: "web".to_owned(),
        pod_namespace: "default".to_owned(),
        sandbox_id: "sandbox-1".to_owned(),
        netns: netns.path.clone(),
        state: AttachmentState::Attached,
        devices: vec![AttachedDevice {
            claim_uid: "claim-uid-1".to_owned(),
            claim_namespace: "default".to_owned(),
            claim_name: "web-net".to_owned(),
            request: "net".to_owned(),
            pool: "node-a".to_owned(),
            device: "medianet-eth1".to_owned(),
            share_id: None,
            plan,
            result,
        }],
    }
}

fn counters() -> Vec<(InterfaceLabels, InterfaceStats)> {
    let labels = InterfaceLabels {
        namespace: "default".to_owned(),
        pod: "web".to_owned(),
        claim: "web-net".to_owned(),
        interface: "net1".to_owned(),
    };
    let stats = InterfaceStats {
        rx: DirectionCounters { bytes: 1000, packets: 10, ..DirectionCounters::default() },
        tx: DirectionCounters { bytes: 2000, packets: 20, ..DirectionCounters::default() },
        rx_dropped: 1,
        tx_dropped: 2,
        ..InterfaceStats::default()
    };
    vec![(labels, stats)]
}

fn health() -> HealthReport {
    HealthReport {
        pool: "node-a".to_owned(),
        devices: vec![DeviceHealth {
            device: "pci-0000-3b-00-1".to_owned(),
            status: HealthStatus::Unhealthy,
            message: "ens1f1: no carrier".to_owned(),
        }],
    }
}

/// A document with one device of each health, one claim, one pod with counters.
pub(crate) fn sample() -> NodeStatus {
    let devices = [
        published("pci-0000-3b-00-1", "ens1f1", Sharing::Exclusive, None),
        published("medianet-eth1", "eth1", Sharing::Shared, Some("medianet")),
    ];
    NodeStatus::assemble(
        facts(Ok(())),
        &devices,
        &health(),
        &[prepared()],
        &[attachment(true)],
        &counters(),
    )
}

#[test]
fn the_document_joins_devices_health_claims_pods_and_counters() {
    let status = sample();
    assert_eq!((status.api_version.as_str(), status.kind.as_str()), (API_VERSION, KIND));
    assert_eq!((status.node.as_str(), status.pool_generation, status.ready), ("node-a", 7, true));
    let names: Vec<&str> = status.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["medianet-eth1", "pci-0000-3b-00-1"], "sorted by name");
    let shared = &status.devices[0];
    assert_eq!(shared.health, "Unknown", "not in the health report yet");
    assert_eq!((shared.sharing.as_str(), shared.capacity), ("shared", Some(256)));
    assert_eq!(shared.pod_network.as_deref(), Some("medianet"));
    let nic = &status.devices[1];
    assert_eq!(
        (nic.health.as_str(), nic.health_message.as_str()),
        ("Unhealthy", "ens1f1: no carrier")
    );
    assert_eq!(nic.kind, "physical");

    let claim = &status.claims[0];
    assert_eq!((claim.name.as_str(), claim.pod.as_deref()), ("web-net", Some("web")));
    assert_eq!(claim.devices[0].mode, "macvlan");
    assert_eq!(claim.devices[0].addresses, ["10.10.1.5/24"]);

    let pod = &status.pods[0];
    assert_eq!((pod.name.as_str(), pod.state.as_str()), ("web", "attached"));
    let interface = &pod.interfaces[0];
    assert_eq!((interface.name.as_str(), interface.host_interface.as_str()), ("net1", "eth1"));
    assert_eq!(interface.mac.as_deref(), Some("02:00:00:00:00:01"));
    let counters = interface.counters.unwrap();
    assert_eq!((counters.rx_bytes, counters.tx_packets, counters.tx_dropped), (1000, 20, 2));
}

#[test]
fn an_interface_not_yet_attached_has_its_planned_name_and_no_kernel_facts() {
    let status = NodeStatus::assemble(
        facts(Err("state: the journal refuses writes".to_owned())),
        &[],
        &HealthReport::default(),
        &[],
        &[attachment(false)],
        &[],
    );
    assert!(!status.ready);
    assert_eq!(status.not_ready_reason.as_deref(), Some("state: the journal refuses writes"));
    let interface = &status.pods[0].interfaces[0];
    assert_eq!(interface.name, "net1");
    assert_eq!((interface.mac.as_ref(), interface.mtu, interface.counters), (None, None, None));
    assert!(interface.addresses.is_empty());
}

#[test]
fn the_document_round_trips_through_json_with_kubernetes_field_names() {
    let status = sample();
    let json = serde_json::to_value(&status).unwrap();
    assert_eq!(json["apiVersion"], API_VERSION);
    assert_eq!(json["devices"][0]["type"], "physical");
    assert_eq!(json["pods"][0]["interfaces"][0]["counters"]["rxBytes"], 1000);
    assert_eq!(serde_json::from_value::<NodeStatus>(json).unwrap(), status);
}

fn socket_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("ncstatus").tempdir().unwrap()
}

#[tokio::test]
async fn serves_the_document_on_a_private_socket_and_removes_it_at_shutdown() {
    let dir = socket_dir();
    let socket = dir.path().join(SOCKET_NAME);
    // A stale socket from a killed daemon is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let expected = sample();
    let served = expected.clone();
    let task = serve(&socket, Arc::new(move || served.clone()), async {
        let _ignored = stopped.await;
    })
    .unwrap();
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only root may read the node's pods and addresses");
    assert_eq!(fetch(&socket).await.unwrap(), expected);
    // Each request is a fresh snapshot.
    assert_eq!(fetch(&socket).await.unwrap(), expected);
    stop.send(()).unwrap();
    task.await.unwrap();
    assert!(!socket.exists(), "the socket is removed at shutdown");
}

#[tokio::test]
async fn a_file_at_the_socket_path_is_left_alone() {
    let dir = socket_dir();
    let socket = dir.path().join(SOCKET_NAME);
    std::fs::write(&socket, "not a socket").unwrap();
    let err = serve(&socket, Arc::new(sample), std::future::pending()).unwrap_err();
    assert!(matches!(err, StatusApiError::NotASocket { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&socket).unwrap(), "not a socket");
}

#[tokio::test]
async fn fetch_names_the_socket_when_no_daemon_listens() {
    let dir = socket_dir();
    let socket: PathBuf = dir.path().join(SOCKET_NAME);
    let err = fetch(&socket).await.unwrap_err();
    assert!(matches!(err, StatusClientError::Connect { .. }), "{err}");
    assert!(err.to_string().contains(&socket.display().to_string()), "{err}");
}

#[tokio::test]
async fn fetch_reports_a_non_200_answer_with_its_body() {
    let dir = socket_dir();
    let socket = dir.path().join(SOCKET_NAME);
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut request = [0_u8; 1024];
        let _read = stream.read(&mut request).await.unwrap();
        stream
            .write_all(b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nboom")
            .await
            .unwrap();
    });
    let err = fetch(&socket).await.unwrap_err();
    assert!(err.to_string().contains("500") && err.to_string().contains("boom"), "{err}");
    server.await.unwrap();
}
