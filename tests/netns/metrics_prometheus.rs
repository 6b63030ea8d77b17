//! `/metrics` of the running node daemon and controller as Prometheus reads it (issue 32
//! item 4): each is scraped with Prometheus' own `Accept` header and with none (curl's
//! `*/*`), and each body is parsed by the parser its `Content-Type` names, those of
//! Prometheus' Python client library (`prometheus_client.openmetrics.parser` for OpenMetrics,
//! `prometheus_client.parser` for the text format 0.0.4; scripts/setup/prometheus-client.sh
//! installs it). In both formats every family the code declares is there, before any event,
//! with the type the code gives it (a counter read as `unknown` is what the 0.0.4 parser made
//! of the OpenMetrics body this endpoint used to label 0.0.4), `netclaim_build_info` carries
//! this build's version, and the `process_*` families have their samples.

#![allow(clippy::unwrap_used, reason = "a test fails by panicking, with the location")]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use netclaim::controller::metrics::ControllerMetrics;
use netclaim::metrics::{Metrics, MetricsRegistry as _};
use prometheus_client::registry::Registry;
use serde::Deserialize;

use crate::kit::netns::{Netns, node_daemon_args, require_root, start_api_server};

const NETCLAIM: &str = env!("CARGO_BIN_EXE_netclaim");
/// The controller's metrics address inside the test's netns (the node's is
/// `NETNS_METRICS_LISTEN`).
const CONTROLLER_METRICS: &str = "127.0.0.1:19179";
const NODE_METRICS: &str = crate::kit::netns::NETNS_METRICS_LISTEN;
/// Bound for the processes to start serving; only keeps a broken build from hanging.
const PATIENCE: Duration = Duration::from_mins(1);
/// Prometheus' `Accept` with its default `scrape_protocols` (2.x).
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
/// The Debian interpreter, where the Debian package installs the library (a `python3` first
/// on PATH may be another installation without it).
const PYTHON: &str = "/usr/bin/python3";
/// Parses stdin with the parser of `argv[1]` and prints each family's name, type and the
/// names of its samples; a body the parser refuses raises.
const PARSE: &str = r#"
import json, sys
if sys.argv[1] == "openmetrics":
    from prometheus_client.openmetrics.parser import text_string_to_metric_families
else:
    from prometheus_client.parser import text_string_to_metric_families
print(json.dumps([
    {"name": f.name, "type": f.type, "samples": [s.name for s in f.samples]}
    for f in text_string_to_metric_families(sys.stdin.read())
]))
"#;

/// One family as the Python parser read it.
#[derive(Debug, Deserialize)]
struct Parsed {
    name: String,
    #[serde(rename = "type")]
    kind: String,
    samples: Vec<String>,
}

/// Family name → type, as the text format 0.0.4 parser names them. The code's declaration is
/// its OpenMetrics encoding, whose `# TYPE` lines are the crate's, untouched by our
/// translation; the 0.0.4 parser names a counter without `_total` as OpenMetrics does, and an
/// OpenMetrics info family `x` is the gauge `x_info` there.
fn declared(registry: &Registry) -> BTreeMap<String, String> {
    netclaim::metrics::encode(registry)
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .map(|rest| {
            let (name, kind) = rest.split_once(' ').unwrap();
            (name.to_owned(), kind.to_owned())
        })
        .collect()
}

fn as_text_format(openmetrics: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    openmetrics
        .iter()
        .map(|(name, kind)| match kind.as_str() {
            "info" => (format!("{name}_info"), "gauge".to_owned()),
            _ => (name.clone(), kind.clone()),
        })
        .collect()
}

/// `GET /metrics` with `accept` (none: no header): the `Content-Type` and the body.
async fn scrape(address: &str, accept: Option<&str>) -> (String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let accept = accept.map(|value| format!("Accept: {value}\r\n")).unwrap_or_default();
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{accept}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let content_type = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-type").then(|| value.trim().to_owned())
        })
        .unwrap();
    (content_type, body.to_owned())
}

/// Waits until `address` accepts connections (the process started serving).
async fn serving(address: &str, log: &Path) {
    let started = Instant::now();
    while tokio::net::TcpStream::connect(address).await.is_err() {
        assert!(
            started.elapsed() < PATIENCE,
            "nothing serves {address}:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `body` through the Python parser of `format`.
fn parse(format: &str, body: &str) -> Vec<Parsed> {
    use std::io::Write as _;
    let mut child = std::process::Command::new(PYTHON)
        .args(["-c", PARSE, format])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|err| panic!("{PYTHON}: {err} (scripts/setup/prometheus-client.sh)"));
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "the {format} parser refused the body: {}\n{body}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Scrapes `address` as Prometheus and as curl would and checks both bodies against the
/// families `registry` declares.
async fn check(process: &str, address: &str, registry: &Registry) {
    let declared = declared(registry);
    for family in ["netclaim_build", "process_cpu_seconds", "process_resident_memory_bytes"] {
        assert!(declared.contains_key(family), "{process} declares no {family}: {declared:?}");
    }

    let (content_type, openmetrics) = scrape(address, Some(PROMETHEUS_ACCEPT)).await;
    assert_eq!(content_type, "application/openmetrics-text; version=1.0.0; charset=utf-8");
    let parsed = parse("openmetrics", &openmetrics);
    let read: BTreeMap<String, String> =
        parsed.iter().map(|f| (f.name.clone(), f.kind.clone())).collect();
    assert_eq!(read, declared, "{process}, OpenMetrics:\n{openmetrics}");
    let build = parsed.iter().find(|f| f.name == "netclaim_build").unwrap();
    assert_eq!(build.samples, ["netclaim_build_info"], "{process}");
    let version = format!("netclaim_build_info{{version=\"{}\"}} 1\n", env!("CARGO_PKG_VERSION"));
    assert!(openmetrics.contains(&version), "{process}: {version} in\n{openmetrics}");

    for accept in [None, Some("text/plain;version=0.0.4")] {
        let (content_type, text) = scrape(address, accept).await;
        assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8", "{accept:?}");
        assert!(!text.contains("# EOF"), "{process}: {text}");
        let parsed = parse("text", &text);
        let read: BTreeMap<String, String> =
            parsed.iter().map(|f| (f.name.clone(), f.kind.clone())).collect();
        assert_eq!(read, as_text_format(&declared), "{process}, text 0.0.4:\n{text}");
        for family in [
            "process_cpu_seconds",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            let found = parsed.iter().find(|f| f.name == family).unwrap();
            assert_eq!(found.samples.len(), 1, "{process}: {found:?}");
        }
    }
}

#[test]
#[ignore = "needs root"]
fn prometheus_parsers_read_every_family_with_its_declared_type() {
    require_root("prometheus_parsers_read_every_family_with_its_declared_type");
    let netns = Netns::new();
    let dir = tempfile::tempdir().unwrap();
    let _api = start_api_server(&netns, NETCLAIM, dir.path(), &[]);
    let node_args = node_daemon_args(dir.path());
    let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
    let node_log = dir.path().join("node.log");
    let _node = netns.spawn(NETCLAIM, &node_args, &node_log);
    let kubeconfig = dir.path().join("kubeconfig");
    let controller_log = dir.path().join("controller.log");
    let _controller = netns.spawn(
        NETCLAIM,
        &[
            "controller",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--metrics-address",
            CONTROLLER_METRICS,
            "--leader-election-namespace",
            "default",
        ],
        &controller_log,
    );
    netns.block_on(move || async move {
        serving(NODE_METRICS, &node_log).await;
        check("node", NODE_METRICS, Metrics::new().registry()).await;
        serving(CONTROLLER_METRICS, &controller_log).await;
        check("controller", CONTROLLER_METRICS, ControllerMetrics::new().registry()).await;
    });
}
