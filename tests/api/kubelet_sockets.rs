//! In-process tests of the kubelet sockets over temp-dir Unix sockets (no root): what a plain
//! tonic server does with grpc-go's authorities, and that ours accepts them on both sockets,
//! registers correctly, recreates its registration socket and cleans up.

#![allow(clippy::unwrap_used, reason = "test helpers: a failed step fails the test")]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::time::Duration;

use netclaim::claims::{
    ClaimFailure, ClaimPreparer, PrepareResults, PreparedDevice, UnavailablePreparer,
    UnprepareResults,
};
use netclaim::kubelet::proto::k8s::io::kubelet::pkg::apis::dra::{v1, v1beta1};
use netclaim::kubelet::proto::pluginregistration::{
    self as reg, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use netclaim::kubelet::{KubeletPlugin, KubeletPluginHandle};
use netclaim::model::ClaimRef;
use prost::Message;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::kit::kubelet::{
    Outcome, PluginDirs, RawGrpcClient, eventually, fast_config, tonic_channel, weird_authorities,
};

const DRIVER: &str = "netclaim.dev";
const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

/// A registration service answering a fixed `PluginInfo`, for the plain-tonic baseline.
struct FixedInfo;

#[tonic::async_trait]
impl reg::registration_server::Registration for FixedInfo {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(PluginInfo { name: DRIVER.into(), ..PluginInfo::default() }))
    }

    async fn notify_registration_status(
        &self,
        _: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(RegistrationStatusResponse {}))
    }
}

async fn start_unavailable(dirs: &PluginDirs) -> KubeletPluginHandle {
    KubeletPlugin::start(
        fast_config(dirs),
        Arc::new(UnavailablePreparer::new(DRIVER)),
        std::future::pending(),
    )
    .await
    .unwrap()
}

fn expect_ok(outcome: Outcome) -> Vec<u8> {
    match outcome {
        Outcome::Response { grpc_status, message, grpc_message } => {
            assert_eq!(grpc_status, "0", "gRPC status (message {grpc_message:?})");
            message
        }
        other => panic!("expected a response, got {other:?}"),
    }
}

fn claims_request() -> Vec<u8> {
    v1::NodePrepareResourcesRequest {
        claims: vec![v1::Claim { namespace: "ns".into(), uid: "uid-7".into(), name: "net".into() }],
    }
    .encode_to_vec()
}

#[tokio::test]
async fn plain_tonic_resets_grpc_go_authorities() {
    // The failure the adapter exists for: without it, h2 rejects the authority.
    let dirs = PluginDirs::new(DRIVER);
    std::fs::create_dir_all(&dirs.registry).unwrap();
    let sock = dirs.registry.join("plain.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(FixedInfo))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    for authority in weird_authorities(&sock) {
        let mut client = RawGrpcClient::connect(&sock).await;
        assert_eq!(client.call(&authority, GET_INFO, &[]).await, Outcome::Reset(1), "{authority}");
    }
    // The same client succeeds with an ordinary authority, so the request itself is fine.
    let mut client = RawGrpcClient::connect(&sock).await;
    let info =
        PluginInfo::decode(&expect_ok(client.call("localhost", GET_INFO, &[]).await)[..]).unwrap();
    assert_eq!(info.name, DRIVER);
}

#[tokio::test]
async fn registration_socket_accepts_grpc_go_authorities_and_reports_the_driver() {
    let dirs = PluginDirs::new(DRIVER);
    let handle = start_unavailable(&dirs).await;
    let sock = handle.registration_socket().to_owned();
    assert_eq!(sock, dirs.registry.join("netclaim.dev-reg.sock"));
    for authority in weird_authorities(&sock) {
        let mut client = RawGrpcClient::connect(&sock).await;
        // Two calls on one connection: the second one's headers reference the dynamic table.
        for _ in 0..2 {
            let info =
                PluginInfo::decode(&expect_ok(client.call(&authority, GET_INFO, &[]).await)[..])
                    .unwrap();
            assert_eq!(info.r#type, "DRAPlugin");
            assert_eq!(info.name, DRIVER);
            assert_eq!(info.endpoint, dirs.plugin.join("dra.sock").to_str().unwrap());
            assert_eq!(
                info.supported_versions,
                [
                    "v1.DRAPlugin",
                    "v1beta1.DRAPlugin",
                    "v1.DRAResourceHealth",
                    "v1alpha1.DRAResourceHealth"
                ]
            );
        }
        let status = RegistrationStatus { plugin_registered: true, error: String::new() };
        expect_ok(
            client
                .call(
                    &authority,
                    "/pluginregistration.Registration/NotifyRegistrationStatus",
                    &status.encode_to_vec(),
                )
                .await,
        );
    }
    handle.stop();
    handle.wait().await.unwrap();
}

#[tokio::test]
async fn dra_socket_accepts_grpc_go_authorities_on_both_versions() {
    let dirs = PluginDirs::new(DRIVER);
    let handle = start_unavailable(&dirs).await;
    let sock = handle.dra_socket().to_owned();
    for authority in weird_authorities(&sock) {
        let mut client = RawGrpcClient::connect(&sock).await;
        for version in ["v1", "v1beta1"] {
            let path =
                format!("/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources");
            let reply = expect_ok(client.call(&authority, &path, &claims_request()).await);
            // v1 and v1beta1 responses share field numbers, so one decoder serves both.
            let reply = v1::NodePrepareResourcesResponse::decode(&reply[..]).unwrap();
            let claim = &reply.claims["uid-7"];
            assert!(claim.devices.is_empty());
            assert!(claim.error.contains("ns/net (uid uid-7)"), "{}", claim.error);
            assert!(claim.error.contains("not available"), "{}", claim.error);

            let path =
                format!("/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources");
            let reply = expect_ok(client.call(&authority, &path, &claims_request()).await);
            let reply = v1::NodeUnprepareResourcesResponse::decode(&reply[..]).unwrap();
            assert_eq!(reply.claims["uid-7"].error, "");
        }
    }
    handle.stop();
    handle.wait().await.unwrap();
}

/// Answers every claim with one device, with a share ID, to check both versions' mapping.
struct OneDevice;

impl ClaimPreparer for OneDevice {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        claims
            .into_iter()
            .map(|c| {
                let device = PreparedDevice {
                    request_names: vec!["net".into()],
                    pool_name: "node-a".into(),
                    device_name: format!("dev-{}", c.name),
                    cdi_device_ids: vec![],
                    share_id: Some("share-1".into()),
                };
                (c.uid, Ok(vec![device]))
            })
            .collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        // Leaves out every claim but the first, to check the adapter completes the answer.
        claims.into_iter().take(1).map(|c| (c.uid, Err(ClaimFailure::new("link busy")))).collect()
    }
}

#[tokio::test]
async fn dra_services_map_the_preparer_answers_for_each_version() {
    let dirs = PluginDirs::new(DRIVER);
    let handle =
        KubeletPlugin::start(fast_config(&dirs), Arc::new(OneDevice), std::future::pending())
            .await
            .unwrap();
    let channel = tonic_channel(handle.dra_socket()).await;

    let claims = vec![
        v1::Claim { namespace: "ns".into(), uid: "u1".into(), name: "a".into() },
        v1::Claim { namespace: "ns".into(), uid: "u2".into(), name: "b".into() },
    ];
    let mut client = v1::dra_plugin_client::DraPluginClient::new(channel.clone());
    let reply = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest { claims: claims.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.claims.len(), 2);
    let device = &reply.claims["u2"].devices[0];
    assert_eq!((device.pool_name.as_str(), device.device_name.as_str()), ("node-a", "dev-b"));
    assert_eq!(device.share_id.as_deref(), Some("share-1"));
    let reply = client
        .node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.claims["u1"].error, "link busy");
    assert!(reply.claims["u2"].error.contains("no result"), "{}", reply.claims["u2"].error);

    let mut client = v1beta1::dra_plugin_client::DraPluginClient::new(channel);
    let reply = client
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ns".into(),
                uid: "u3".into(),
                name: "c".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.claims["u3"].devices[0].device_name, "dev-c");

    let err = client
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ns".into(),
                uid: String::new(),
                name: "c".into(),
            }],
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    handle.stop();
    handle.wait().await.unwrap();
}

#[tokio::test]
async fn sockets_are_private_stale_ones_replaced_and_all_removed_on_shutdown() {
    let dirs = PluginDirs::new(DRIVER);
    // The registry directory exists (kubelet's); ours does not yet. A crashed run left its
    // registration socket behind.
    std::fs::create_dir_all(&dirs.registry).unwrap();
    drop(
        std::os::unix::net::UnixListener::bind(dirs.registry.join("netclaim.dev-reg.sock"))
            .unwrap(),
    );

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let handle = KubeletPlugin::start(
        fast_config(&dirs),
        Arc::new(UnavailablePreparer::new(DRIVER)),
        async {
            let _ = stop_rx.await;
        },
    )
    .await
    .unwrap();
    for sock in [handle.registration_socket(), handle.dra_socket()] {
        let mode = std::fs::metadata(sock).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", sock.display());
        // A live socket: a tonic client gets an answer.
        tonic_channel(sock).await;
    }
    let plugin_mode = std::fs::metadata(&dirs.plugin).unwrap().permissions().mode() & 0o777;
    assert_eq!(plugin_mode, 0o700);

    let (reg, dra) = (handle.registration_socket().to_owned(), handle.dra_socket().to_owned());
    stop_tx.send(()).unwrap();
    handle.wait().await.unwrap();
    assert!(!reg.exists() && !dra.exists(), "sockets removed on shutdown");
}

#[tokio::test]
async fn deleted_registration_socket_is_recreated() {
    let dirs = PluginDirs::new(DRIVER);
    let handle = start_unavailable(&dirs).await;
    let sock = handle.registration_socket().to_owned();
    std::fs::remove_file(&sock).unwrap();
    eventually("registration socket recreated", || sock.exists()).await;
    let mut client = reg::registration_client::RegistrationClient::new(tonic_channel(&sock).await);
    let info = client.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.name, DRIVER);
    handle.stop();
    handle.wait().await.unwrap();
    assert!(!sock.exists());
}

#[tokio::test]
async fn failed_registration_recreates_the_socket() {
    let dirs = PluginDirs::new(DRIVER);
    let handle = start_unavailable(&dirs).await;
    let sock = handle.registration_socket().to_owned();
    let before = std::fs::metadata(&sock).unwrap();
    let identity = |m: &std::fs::Metadata| (m.ino(), m.mtime(), m.mtime_nsec());
    let mut client = reg::registration_client::RegistrationClient::new(tonic_channel(&sock).await);
    client
        .notify_registration_status(RegistrationStatus {
            plugin_registered: false,
            error: "plugin validation failed".into(),
        })
        .await
        .unwrap();
    drop(client);
    eventually("a new registration socket", || {
        std::fs::metadata(&sock).is_ok_and(|now| identity(&now) != identity(&before))
    })
    .await;
    let mut client = reg::registration_client::RegistrationClient::new(tonic_channel(&sock).await);
    assert_eq!(client.get_info(InfoRequest {}).await.unwrap().into_inner().name, DRIVER);
    handle.stop();
    handle.wait().await.unwrap();
}

#[tokio::test]
async fn start_refuses_to_replace_a_file_that_is_not_a_socket() {
    let dirs = PluginDirs::new(DRIVER);
    std::fs::create_dir_all(&dirs.plugin).unwrap();
    std::fs::write(dirs.plugin.join("dra.sock"), b"keep me").unwrap();
    let err = KubeletPlugin::start(
        fast_config(&dirs),
        Arc::new(UnavailablePreparer::new(DRIVER)),
        std::future::pending(),
    )
    .await
    .unwrap_err();
    assert!(err.to_string().contains("dra.sock"), "{err}");
    assert_eq!(std::fs::read(dirs.plugin.join("dra.sock")).unwrap(), b"keep me");
    assert!(!dirs.registry.join("netclaim.dev-reg.sock").exists());
}

#[tokio::test]
async fn shutdown_completes_while_kubelet_keeps_its_connections_open() {
    // Kubelet holds its DRA connection for as long as the plugin is registered. Like grpc-go,
    // tonic's client answers the server's GOAWAY/PING, so the server can close promptly.
    let dirs = PluginDirs::new(DRIVER);
    let handle = start_unavailable(&dirs).await;
    let mut dra =
        v1::dra_plugin_client::DraPluginClient::new(tonic_channel(handle.dra_socket()).await);
    dra.node_unprepare_resources(v1::NodeUnprepareResourcesRequest { claims: vec![] })
        .await
        .unwrap();
    let mut registration = reg::registration_client::RegistrationClient::new(
        tonic_channel(handle.registration_socket()).await,
    );
    registration.get_info(InfoRequest {}).await.unwrap();
    handle.stop();
    // Well below the 5 s after which the servers drop connections that do not close.
    tokio::time::timeout(Duration::from_secs(4), handle.wait())
        .await
        .expect("graceful shutdown with live kubelet connections")
        .unwrap();
    drop((dra, registration));
}
