//! Cost of the `:authority` adapter per call: `GetInfo` round trips over a Unix socket to a
//! plain tonic server and to the same server behind `AuthorityAdapter`.
//!
//! Two clients: tonic (authority `localhost`, nothing to rewrite, so this isolates the cost of
//! re-framing and re-encoding every header block) and the raw HTTP/2 test client, which can send
//! kubelet's percent-encoded socket path (accepted only behind the adapter, so the plain server
//! is measured with `localhost` from the same client).

use netclaim_testkit as kit;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use criterion::{Criterion, criterion_group, criterion_main};
use kit::kubelet::{Outcome, RawGrpcClient, tonic_channel};
use netclaim::kubelet::ClientStreamRewriter;
use netclaim::kubelet::proto::pluginregistration::{
    self as reg, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use netclaim::kubelet::transport::adapted_incoming;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

const GET_INFO: &str = "/pluginregistration.Registration/GetInfo";

struct FixedInfo;

#[tonic::async_trait]
impl reg::registration_server::Registration for FixedInfo {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "netclaim.dev".into(),
            endpoint: "/var/lib/kubelet/plugins/netclaim.dev/dra.sock".into(),
            supported_versions: vec!["v1.DRAPlugin".into(), "v1beta1.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        _: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(RegistrationStatusResponse {}))
    }
}

fn server() -> reg::registration_server::RegistrationServer<FixedInfo> {
    reg::registration_server::RegistrationServer::new(FixedInfo)
}

/// Starts a plain server and an adapted one on `rt`; returns their socket paths.
fn start_servers(rt: &tokio::runtime::Runtime, dir: &Path) -> (PathBuf, PathBuf) {
    let _runtime = rt.enter();
    let plain = dir.join("plain.sock");
    let adapted = dir.join("adapted.sock");
    let plain_listener = UnixListener::bind(&plain).expect("bind in a fresh temp dir");
    let adapted_listener = UnixListener::bind(&adapted).expect("bind in a fresh temp dir");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server())
            .serve_with_incoming(UnixListenerStream::new(plain_listener)),
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server())
            .serve_with_incoming(adapted_incoming(adapted_listener)),
    );
    (plain, adapted)
}

fn assert_ok(outcome: &Outcome) {
    assert!(
        matches!(outcome, Outcome::Response { grpc_status, .. } if grpc_status == "0"),
        "{outcome:?}"
    );
}

/// Latencies of single calls, recorded next to criterion's own measurement.
#[derive(Default)]
struct Latencies(Vec<Duration>);

impl Latencies {
    fn median(&mut self) -> Duration {
        self.0.sort_unstable();
        self.0.get(self.0.len() / 2).copied().unwrap_or_default()
    }
}

/// Times `iters` calls of `timed` for criterion, each paired with a call of `other`; both
/// calls' latencies are also logged. Load from other processes drifts over time (measured one
/// after the other, the plain and adapter medians moved by ±40 % between runs), so the paired
/// log, where both sides share every time window, is what compares them.
fn interleaved(
    iters: u64,
    (timed, timed_log): (&mut dyn FnMut(), &mut Latencies),
    (other, other_log): (&mut dyn FnMut(), &mut Latencies),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        other();
        let middle = Instant::now();
        timed();
        let elapsed = middle.elapsed();
        other_log.0.push(middle - start);
        timed_log.0.push(elapsed);
        total += elapsed;
    }
    total
}

fn print_paired(client: &str, plain: &mut Latencies, adapter: &mut Latencies) {
    let (p, a) = (plain.median(), adapter.median());
    let overhead = a.as_secs_f64() - p.as_secs_f64();
    println!(
        "paired medians, {client}, {} calls each: plain {:.1} us, adapter {:.1} us, \
         overhead {:+.1} us ({:+.1} %)",
        plain.0.len(),
        p.as_secs_f64() * 1e6,
        a.as_secs_f64() * 1e6,
        overhead * 1e6,
        overhead / p.as_secs_f64() * 100.0
    );
}

fn getinfo(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = tempfile::Builder::new().prefix("nckb").tempdir_in("/tmp").expect("temp dir");
    let (plain, adapted) = start_servers(&rt, dir.path());
    let percent_path = adapted.to_str().expect("utf-8 temp path").replace('/', "%2F");

    let mut group = c.benchmark_group("kubelet_getinfo");
    group.measurement_time(Duration::from_secs(4)).warm_up_time(Duration::from_secs(1));

    let mut tonic_plain =
        reg::registration_client::RegistrationClient::new(rt.block_on(tonic_channel(&plain)));
    let mut tonic_adapted =
        reg::registration_client::RegistrationClient::new(rt.block_on(tonic_channel(&adapted)));
    let mut call_tonic_plain = || {
        rt.block_on(tonic_plain.get_info(InfoRequest {})).expect("GetInfo succeeds");
    };
    let mut call_tonic_adapted = || {
        rt.block_on(tonic_adapted.get_info(InfoRequest {})).expect("GetInfo succeeds");
    };
    let (mut plain_log, mut adapter_log) = (Latencies::default(), Latencies::default());
    group.bench_function("tonic_client/plain", |b| {
        b.iter_custom(|n| {
            interleaved(
                n,
                (&mut call_tonic_plain, &mut plain_log),
                (&mut call_tonic_adapted, &mut adapter_log),
            )
        });
    });
    group.bench_function("tonic_client/adapter", |b| {
        b.iter_custom(|n| {
            interleaved(
                n,
                (&mut call_tonic_adapted, &mut adapter_log),
                (&mut call_tonic_plain, &mut plain_log),
            )
        });
    });
    print_paired("tonic client", &mut plain_log, &mut adapter_log);

    let mut raw_plain = rt.block_on(RawGrpcClient::connect(&plain));
    let mut raw_adapted = rt.block_on(RawGrpcClient::connect(&adapted));
    let mut call_raw_plain = || assert_ok(&rt.block_on(raw_plain.call("localhost", GET_INFO, &[])));
    let mut call_raw_adapted =
        || assert_ok(&rt.block_on(raw_adapted.call(&percent_path, GET_INFO, &[])));
    let (mut plain_log, mut adapter_log) = (Latencies::default(), Latencies::default());
    group.bench_function("raw_client/plain_localhost", |b| {
        b.iter_custom(|n| {
            interleaved(
                n,
                (&mut call_raw_plain, &mut plain_log),
                (&mut call_raw_adapted, &mut adapter_log),
            )
        });
    });
    group.bench_function("raw_client/adapter_percent_encoded_path", |b| {
        b.iter_custom(|n| {
            interleaved(
                n,
                (&mut call_raw_adapted, &mut adapter_log),
                (&mut call_raw_plain, &mut plain_log),
            )
        });
    });
    print_paired("raw client (adapter: percent-encoded path)", &mut plain_log, &mut adapter_log);
    group.finish();
}

fn frame(frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).expect("small payload").to_be_bytes();
    let mut out = len[1..].to_vec();
    out.extend([frame_type, flags]);
    out.extend(stream_id.to_be_bytes());
    out.extend(payload);
    out
}

/// CPU cost of the rewriter alone for kubelet's `GetInfo` request: the first request of a
/// connection (literal fields, new decoder) and a later one (dynamic-table references).
fn rewriter(c: &mut Criterion) {
    let authority = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fnetclaim.dev-reg.sock";
    let headers: [(&[u8], &[u8]); 7] = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", GET_INFO.as_bytes()),
        (b":authority", authority),
        (b"content-type", b"application/grpc"),
        (b"user-agent", b"grpc-go/1.64.0"),
        (b"te", b"trailers"),
    ];
    // Encoded like grpc-go: Huffman strings, incremental indexing, table references.
    let mut encoder = httlib_hpack::Encoder::default();
    let mut encode = |out: &mut Vec<u8>| {
        for (name, value) in headers {
            let flags = httlib_hpack::Encoder::HUFFMAN_NAME
                | httlib_hpack::Encoder::HUFFMAN_VALUE
                | httlib_hpack::Encoder::WITH_INDEXING
                | httlib_hpack::Encoder::BEST_FORMAT;
            encoder.encode((name.to_vec(), value.to_vec(), flags), out).expect("encodable");
        }
    };
    let (mut first_block, mut later_block) = (Vec::new(), Vec::new());
    encode(&mut first_block);
    encode(&mut later_block);
    let mut first = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    first.extend(frame(0x4, 0, 0, &[]));
    first.extend(frame(0x1, 0x4, 1, &first_block));
    first.extend(frame(0x0, 0x1, 1, &[0; 5]));
    let mut later = frame(0x1, 0x4, 3, &later_block);
    later.extend(frame(0x0, 0x1, 3, &[0; 5]));

    let mut group = c.benchmark_group("authority_rewriter");
    group.measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    group.bench_function("first_getinfo_of_a_connection", |b| {
        b.iter(|| {
            let mut rewriter = ClientStreamRewriter::new();
            let mut output = BytesMut::with_capacity(512);
            rewriter.process(&mut BytesMut::from(&first[..]), &mut output).expect("valid input");
            output
        });
    });
    let mut rewriter = ClientStreamRewriter::new();
    rewriter.process(&mut BytesMut::from(&first[..]), &mut BytesMut::new()).expect("valid input");
    group.bench_function("later_getinfo_on_the_connection", |b| {
        b.iter(|| {
            let mut output = BytesMut::with_capacity(512);
            rewriter.process(&mut BytesMut::from(&later[..]), &mut output).expect("valid input");
            output
        });
    });
    group.finish();
}

criterion_group!(benches, rewriter, getinfo);
criterion_main!(benches);
