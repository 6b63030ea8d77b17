//! Who reads `/metrics` (issue 31 item 4, decision 0018), against the dev API server's
//! TokenReview and SubjectAccessReview: in the secure mode the endpoint answers 200 with the
//! series to a token of a ServiceAccount bound to deploy/monitoring's
//! `netclaim-metrics-reader`, 403 to the token of one without it, 401 without a token or
//! with one the API server does not know, and `/healthz`, `/readyz` to anyone (kubelet's
//! probes carry no token). In the default mode (the binary's flag defaults) it serves plain
//! HTTP on loopback.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::PostParams;
use kube_inmemory::apiserver::{ServerOptions, start};
use netclaim::k8s::access_review::KubeAccessReview;
use netclaim::metrics::tls::TlsSource;
use netclaim::metrics::{Health, InterfaceLabels, Metrics, MetricsSecurity, serve_with};
use netclaim::model::stats::{DirectionCounters, InterfaceStats};
use serde::Deserialize as _;
use serde_json::json;

use crate::kit;

const ADMIN_TOKEN: &str = "admin-token";

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
    serde_json::from_value(value).unwrap()
}

/// deploy/monitoring's ClusterRole for scrapers, as shipped.
fn metrics_reader() -> ClusterRole {
    let path = kit::repo().join("deploy/monitoring/metrics-reader-rbac.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    yaml_serde::Deserializer::from_str(&text)
        .map(|document| serde_json::Value::deserialize(document).unwrap())
        .find(|o| o["kind"] == "ClusterRole")
        .map(object)
        .expect("metrics-reader-rbac.yaml has the ClusterRole")
}

async fn token_for(client: &kube::Client, name: &str) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "monitoring");
    accounts
        .create(&PostParams::default(), &object(json!({"metadata": {"name": name}})))
        .await
        .unwrap();
    let request: TokenRequest = object(json!({"spec": {"audiences": []}}));
    let issued =
        accounts.create_token_request(name, &PostParams::default(), &request).await.unwrap();
    issued.status.unwrap().token.unwrap()
}

/// A registry with one pod interface's traffic.
fn metrics() -> Arc<Metrics> {
    let metrics = Arc::new(Metrics::new());
    let labels = InterfaceLabels {
        namespace: "default".into(),
        pod: "web-0".into(),
        claim: "web-0-net".into(),
        interface: "net1".into(),
    };
    let stats = InterfaceStats {
        rx: DirectionCounters { bytes: 4242, packets: 3, ..Default::default() },
        ..Default::default()
    };
    metrics.interface_traffic.replace(vec![(labels, stats)]);
    metrics
}

#[tokio::test]
async fn the_secure_endpoint_serves_metrics_only_to_scrapers_rbac_allows() {
    let options =
        ServerOptions { bearer_token: Some(ADMIN_TOKEN.to_owned()), ..ServerOptions::default() };
    let server = start("127.0.0.1:0".parse().unwrap(), options).await.unwrap();
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.auth_info.token = Some(ADMIN_TOKEN.to_owned().into());
    let admin = kube::Client::try_from(config).unwrap();
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &object(json!({"metadata": {"name": "monitoring"}})))
        .await
        .unwrap();
    let permitted = token_for(&admin, "prometheus").await;
    let unbound = token_for(&admin, "nobody").await;
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &metrics_reader())
        .await
        .unwrap();
    let binding: ClusterRoleBinding = object(json!({
        "metadata": {"name": "prometheus-netclaim-metrics"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "netclaim-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}],
    }));
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let health = Arc::new(Health::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let security = MetricsSecurity::Secure(TlsSource::SelfSigned { names: vec!["node-a".into()] });
    let reviewer = KubeAccessReview::new(admin.clone());
    let (bound, task) = serve_with(
        "127.0.0.1:0".parse().unwrap(),
        &security,
        || Some(reviewer),
        metrics(),
        Arc::clone(&health),
        async move {
            let _ = stopped.await;
        },
    )
    .await
    .unwrap();
    let port = bound.port();

    let (code, body) = kit::https::get(port, "/metrics", Some(&permitted)).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains(
            r#"netclaim_interface_rx_bytes_total{namespace="default",pod="web-0",claim="web-0-net",interface="net1"} 4242"#
        ),
        "{body}"
    );
    // Asked again: the same answer (from the cache).
    assert_eq!(kit::https::get(port, "/metrics", Some(&permitted)).await.unwrap().0, 200);
    let (code, body) = kit::https::get(port, "/metrics", Some(&unbound)).await.unwrap();
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("system:serviceaccount:monitoring:nobody"), "{body}");
    assert!(!body.contains("netclaim_"), "{body}");
    let (code, body) = kit::https::get(port, "/metrics", None).await.unwrap();
    assert_eq!(code, 401, "{body}");
    assert!(!body.contains("netclaim_"), "{body}");
    assert_eq!(kit::https::get(port, "/metrics", Some("not-a-token")).await.unwrap().0, 401);
    // The probes' paths: no token needed.
    assert_eq!(kit::https::get(port, "/healthz", None).await.unwrap().0, 200);
    assert_eq!(kit::https::get(port, "/readyz", None).await.unwrap().0, 503);
    health.set_ready(true);
    assert_eq!(kit::https::get(port, "/readyz", None).await.unwrap().0, 200);
    // Plain HTTP on the TLS port gets no metrics.
    let plain = plain_get(port, "/metrics").await;
    assert!(!plain.contains("netclaim_"), "{plain}");

    let _ = stop.send(());
    task.await.unwrap();
    server.shutdown().await.unwrap();
}

/// A plain HTTP GET on loopback: the raw response (empty when the peer closes).
async fn plain_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    String::from_utf8_lossy(&response).into_owned()
}

#[tokio::test]
async fn by_default_the_endpoint_is_plain_http_on_loopback() {
    let netclaim::cli::Parsed::Run(cli) =
        netclaim::cli::parse(["netclaim", "node", "--node-name", "node-a"])
    else {
        panic!("the defaults parse")
    };
    let netclaim::cli::Command::Node(args) = cli.command else { panic!("not node") };
    let config = netclaim::cli::node::config(&args).unwrap();
    let address = config.metrics_address;
    assert!(address.ip().is_loopback(), "{address}");
    assert_eq!(address.port(), 9178);
    assert_eq!(config.metrics_security, MetricsSecurity::Plain);
    assert!(config.metrics_pod_labels);
    let health = Arc::new(Health::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (bound, task) = netclaim::metrics::serve(
        std::net::SocketAddr::new(address.ip(), 0),
        metrics(),
        health,
        async move {
            let _ = stopped.await;
        },
    )
    .await
    .unwrap();
    let response = plain_get(bound.port(), "/metrics").await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    // The sample, not only the family's `# TYPE` line (every family is declared from start).
    assert!(
        response
            .lines()
            .any(|l| l.starts_with("netclaim_interface_rx_bytes_total{") && l.ends_with(" 4242")),
        "{response}"
    );
    let _ = stop.send(());
    task.await.unwrap();
}
