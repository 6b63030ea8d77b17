//! Test support for the kubelet sockets: a raw HTTP/2 gRPC client that can send any
//! `:authority` (the `http` crate, hence `h2` and tonic clients, cannot build the ones grpc-go
//! sends), tonic clients over Unix sockets, and temp-dir plugin layouts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use httlib_hpack::{Decoder, Encoder};
use netclaim::kubelet::KubeletPluginConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How one raw request ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The server reset the stream with this HTTP/2 error code (1 = `PROTOCOL_ERROR`).
    Reset(u32),
    /// The server closed the connection with GOAWAY and this error code.
    GoAway(u32),
    /// A complete response: the gRPC status from the trailers and the message bytes.
    Response { grpc_status: String, grpc_message: String, message: Vec<u8> },
}

/// A hand-driven HTTP/2 client connection speaking just enough gRPC for unary calls.
pub struct RawGrpcClient {
    stream: UnixStream,
    encoder: Encoder<'static>,
    decoder: Decoder<'static>,
    next_stream: u32,
    inbuf: Vec<u8>,
}

fn frame(frame_type: u8, flags: u8, stream_id: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap();
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.push(frame_type);
    out.push(flags);
    out.extend_from_slice(&stream_id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

impl RawGrpcClient {
    /// Connects and sends the preface and an empty SETTINGS frame.
    pub async fn connect(path: &Path) -> Self {
        let mut stream = UnixStream::connect(path).await.unwrap();
        let mut hello = PREFACE.to_vec();
        hello.extend(frame(0x4, 0, 0, &[]));
        stream.write_all(&hello).await.unwrap();
        Self {
            stream,
            encoder: Encoder::default(),
            decoder: Decoder::default(),
            next_stream: 1,
            inbuf: vec![],
        }
    }

    /// One unary call with the given `:authority`. The client's HPACK encoder indexes fields,
    /// so later calls on the same connection reference its dynamic table, like grpc-go.
    pub async fn call(&mut self, authority: &str, path: &str, message: &[u8]) -> Outcome {
        let stream_id = self.send_request(authority, path, message).await;
        tokio::time::timeout(Duration::from_secs(10), self.read_outcome(stream_id))
            .await
            .expect("server answered within 10 s")
    }

    /// Opens a server-streaming call with the given `:authority` and returns its first
    /// message (the stream stays open), or how the call ended without one.
    pub async fn first_streamed(
        &mut self,
        authority: &str,
        path: &str,
        message: &[u8],
    ) -> Result<Vec<u8>, Outcome> {
        let stream_id = self.send_request(authority, path, message).await;
        tokio::time::timeout(Duration::from_secs(10), async {
            let mut data = Vec::new();
            loop {
                let Some((ty, flags, sid, payload)) = self.read_frame().await else {
                    panic!("connection closed before stream {stream_id} sent a message");
                };
                match ty {
                    0x4 if flags & 0x1 == 0 => {
                        self.stream.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap();
                    }
                    0x7 => {
                        let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                        return Err(Outcome::GoAway(code));
                    }
                    0x3 if sid == stream_id => {
                        let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                        return Err(Outcome::Reset(code));
                    }
                    0x0 if sid == stream_id => {
                        data.extend_from_slice(&payload);
                        if data.len() >= 5 {
                            let len = u32::from_be_bytes(data[1..5].try_into().unwrap());
                            let end = 5 + usize::try_from(len).unwrap();
                            if data.len() >= end {
                                return Ok(data[5..end].to_vec());
                            }
                        }
                    }
                    0x1 if sid == stream_id && flags & 0x1 != 0 => {
                        return Err(Outcome::Response {
                            grpc_status: "headers ended the stream".into(),
                            grpc_message: String::new(),
                            message: data,
                        });
                    }
                    _ => {}
                }
            }
        })
        .await
        .expect("server sent a message within 10 s")
    }

    /// Sends the HEADERS and the one DATA frame of a request; returns its stream id.
    async fn send_request(&mut self, authority: &str, path: &str, message: &[u8]) -> u32 {
        let stream_id = self.next_stream;
        self.next_stream += 2;
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.as_bytes()),
            (b":authority", authority.as_bytes()),
            (b"content-type", b"application/grpc"),
            (b"user-agent", b"grpc-go/1.64.0"),
            (b"te", b"trailers"),
        ];
        // Like grpc-go: Huffman strings, incremental indexing, references to the table.
        let mut block = Vec::new();
        for (name, value) in headers {
            let flags = Encoder::HUFFMAN_NAME
                | Encoder::HUFFMAN_VALUE
                | Encoder::WITH_INDEXING
                | Encoder::BEST_FORMAT;
            self.encoder.encode((name.to_vec(), value.to_vec(), flags), &mut block).unwrap();
        }
        let mut grpc = vec![0];
        grpc.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        grpc.extend_from_slice(message);
        let mut out = frame(0x1, 0x4, stream_id, &block);
        out.extend(frame(0x0, 0x1, stream_id, &grpc));
        self.stream.write_all(&out).await.unwrap();
        stream_id
    }

    async fn read_frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        loop {
            if self.inbuf.len() >= 9 {
                let len = usize::from(self.inbuf[0]) << 16
                    | usize::from(self.inbuf[1]) << 8
                    | usize::from(self.inbuf[2]);
                if self.inbuf.len() >= 9 + len {
                    let f: Vec<u8> = self.inbuf.drain(..9 + len).collect();
                    let sid = u32::from_be_bytes([f[5], f[6], f[7], f[8]]) & 0x7fff_ffff;
                    return Some((f[3], f[4], sid, f[9..].to_vec()));
                }
            }
            self.inbuf.reserve(16_384);
            let n = self.stream.read_buf(&mut self.inbuf).await.ok()?;
            if n == 0 {
                return None;
            }
        }
    }

    async fn read_outcome(&mut self, stream_id: u32) -> Outcome {
        let mut message = Vec::new();
        let mut grpc_status = String::new();
        let mut grpc_message = String::new();
        loop {
            let Some((ty, flags, sid, payload)) = self.read_frame().await else {
                panic!("connection closed before stream {stream_id} ended");
            };
            if ty == 0x0 && !payload.is_empty() {
                // Give the connection window back, or the server stalls after 64 KiB.
                let increment = u32::try_from(payload.len()).unwrap().to_be_bytes();
                self.stream.write_all(&frame(0x8, 0, 0, &increment)).await.unwrap();
            }
            match ty {
                0x4 if flags & 0x1 == 0 => {
                    self.stream.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap();
                }
                0x6 if flags & 0x1 == 0 => {
                    self.stream.write_all(&frame(0x6, 0x1, 0, &payload)).await.unwrap();
                }
                0x7 => {
                    return Outcome::GoAway(u32::from_be_bytes(payload[4..8].try_into().unwrap()));
                }
                0x3 if sid == stream_id => {
                    return Outcome::Reset(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                }
                0x1 if sid == stream_id => {
                    assert_ne!(flags & 0x4, 0, "test client expects single-frame header blocks");
                    let mut fields = Vec::new();
                    self.decoder.decode(&mut payload.clone(), &mut fields).unwrap();
                    for (name, value, _) in fields {
                        match &name[..] {
                            b"grpc-status" => grpc_status = String::from_utf8(value).unwrap(),
                            b"grpc-message" => grpc_message = String::from_utf8(value).unwrap(),
                            _ => {}
                        }
                    }
                    if flags & 0x1 != 0 {
                        break;
                    }
                }
                0x0 if sid == stream_id => {
                    message.extend_from_slice(&payload);
                    if flags & 0x1 != 0 {
                        break;
                    }
                }
                _ => {}
            }
        }
        // Strip the gRPC length prefix.
        let message = if message.len() >= 5 { message[5..].to_vec() } else { message };
        Outcome::Response { grpc_status, grpc_message, message }
    }
}

/// The two authorities grpc-go may derive from a bare socket path.
pub fn weird_authorities(socket: &Path) -> [String; 2] {
    let raw = socket.to_str().unwrap().to_owned();
    [raw.replace('/', "%2F"), raw]
}

/// A temp dir with `registry` and `plugins/<driver>` paths (not yet created).
pub struct PluginDirs {
    pub tmp: tempfile::TempDir,
    pub registry: PathBuf,
    pub plugin: PathBuf,
}

impl PluginDirs {
    pub fn new(driver: &str) -> Self {
        // Short base path: socket paths must fit in 107 bytes.
        let tmp = tempfile::Builder::new().prefix("nck").tempdir_in("/tmp").unwrap();
        let registry = tmp.path().join("registry");
        let plugin = tmp.path().join("plugins").join(driver);
        Self { tmp, registry, plugin }
    }
}

/// The plugin's config for `dirs` with the driver [`DRIVER`](super::DRIVER), checking its
/// sockets and registering again fast enough for a test (20 ms, 50 ms).
pub fn fast_config(dirs: &PluginDirs) -> KubeletPluginConfig {
    let mut config = KubeletPluginConfig::new(super::DRIVER, &dirs.registry, &dirs.plugin);
    config.socket_check_interval = Duration::from_millis(20);
    config.reregister_delay = Duration::from_millis(50);
    config
}

/// A tonic channel over a Unix socket (authority "localhost", what tonic sends).
pub async fn tonic_channel(path: &Path) -> tonic::transport::Channel {
    let path = path.to_owned();
    tonic::transport::Endpoint::try_from("http://localhost")
        .unwrap()
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .unwrap()
}

/// Waits up to 5 s for `check` to hold.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..500 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for: {what}");
}
