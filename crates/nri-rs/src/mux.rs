//! Multiplexer: carries NRI's two logical ttrpc connections over one Unix stream.
//!
//! Wire format (the same in both directions): frames of an 8-byte header, connection ID
//! (`u32` big-endian) then payload length (`u32` big-endian), followed by the payload. There is
//! no open/close signalling: both ends simply use ID 1 (the plugin's ttrpc service, runtime is
//! the client) and ID 2 (the runtime's ttrpc service, plugin is the client). Frames for an ID
//! that was not opened are dropped, as the Go implementation does.
//!
//! Writing follows what the Go reader can take: it hands one whole frame to each `Read` and
//! fails with `ENOMEM` when the reader's buffer is smaller, and Go ttrpc reads through a
//! 4096-byte `bufio.Reader`. So each ttrpc message we send is cut the way Go's 4096-byte
//! `bufio.Writer` cuts it: a first frame with the first `min(4096, len)` bytes, then one frame
//! with the rest. Each logical connection therefore reassembles whole ttrpc messages (10-byte
//! header + body) from what its user writes, and the socket writer frames them. Reading treats
//! each connection as a byte stream, so frames of any size and split messages are accepted.
//!
//! A logical connection reads the frames the socket reader routes to it and hands whole
//! messages to the socket writer itself, inside its user's `poll_read`/`poll_write`: no task
//! of its own sits between the socket and the user, so a request and its reply each cross two
//! tasks (socket reader or writer, and the user), not four. On a node whose cores are mostly
//! idle each hand-off to a parked thread is a wake-up of tens of microseconds on the pod's
//! sandbox path.
//!
//! Buffers are bounded: each logical connection has a bounded queue of received frames and the
//! socket writer a bounded queue of messages, so a slow consumer slows the socket down rather
//! than growing memory. When the socket ends (EOF, error, or a peer that dies in the middle of
//! a frame), every logical connection sees end-of-file and [`Mux::closed`] reports why.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::{CancellationToken, PollSender};

/// Logical connection ID on which the plugin serves `nri.pkg.api.v1alpha1.Plugin`.
pub const PLUGIN_SERVICE_CONN: ConnId = ConnId(1);
/// Logical connection ID on which the runtime serves `nri.pkg.api.v1alpha1.Runtime`.
pub const RUNTIME_SERVICE_CONN: ConnId = ConnId(2);

/// Size of a mux frame header: connection ID and payload length, both `u32` big-endian.
pub const FRAME_HEADER_LEN: usize = 8;
/// Size of a ttrpc message header: length, stream ID, type, flags.
pub const TTRPC_HEADER_LEN: usize = 10;
/// Largest ttrpc message body (ttrpc's limit, 4 MiB).
pub const TTRPC_MAX_BODY: usize = 4 << 20;
/// Largest frame payload we accept: one whole ttrpc message (header + 4 MiB body).
pub const MAX_FRAME_PAYLOAD: usize = TTRPC_HEADER_LEN + TTRPC_MAX_BODY;
/// Go ttrpc's `bufio` buffer size, which bounds the first frame of every message we send.
pub const GO_BUFIO_SIZE: usize = 4096;

/// Frames received for one logical connection and not read yet, before the socket reader waits.
const CONN_QUEUE_FRAMES: usize = 16;
/// Whole messages queued for the socket writer before writers wait.
const WRITE_QUEUE_MESSAGES: usize = 64;
/// How long a stopping multiplexer keeps writing queued frames to a slow peer.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// A logical connection ID inside the multiplexed stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnId(pub u32);

impl std::fmt::Display for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a multiplexed connection ended or could not be used.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MuxError {
    /// Connection ID 0 is reserved by the protocol.
    #[error("connection id 0 is reserved")]
    ReservedConnId,
    /// The logical connection was opened twice.
    #[error("logical connection {0} is already open")]
    AlreadyOpen(ConnId),
    /// The multiplexer has stopped; no connection can be opened.
    #[error("multiplexer is closed")]
    Closed,
    /// The peer closed the socket in the middle of a frame.
    #[error("peer closed the socket mid-frame (connection {conn}, {got} of {want} bytes)")]
    TruncatedFrame {
        /// Connection the frame was for (0 if the header itself was cut).
        conn: u32,
        /// Bytes of the frame (header or payload) received.
        got: usize,
        /// Bytes announced.
        want: usize,
    },
    /// The peer announced a frame larger than any valid ttrpc message.
    #[error("frame for connection {conn} announces {len} bytes (limit {MAX_FRAME_PAYLOAD})")]
    FrameTooLarge {
        /// Connection the frame was for.
        conn: u32,
        /// Announced payload length.
        len: usize,
    },
    /// A local writer produced a ttrpc message larger than ttrpc allows.
    #[error(
        "outgoing ttrpc message on connection {conn} has a {len}-byte body (limit {TTRPC_MAX_BODY})"
    )]
    MessageTooLarge {
        /// Connection the message was written to.
        conn: ConnId,
        /// Body length from the ttrpc header.
        len: usize,
    },
    /// Reading from or writing to the socket failed.
    #[error("socket {op} failed: {kind}: {message}")]
    Io {
        /// `read` or `write`.
        op: &'static str,
        /// The I/O error kind.
        kind: io::ErrorKind,
        /// The I/O error text (errors are cloned to every waiter, so the source is flattened).
        message: String,
    },
}

impl MuxError {
    fn io(op: &'static str, err: &io::Error) -> Self {
        Self::Io { op, kind: err.kind(), message: err.to_string() }
    }
}

/// How the multiplexer ended.
#[derive(Debug, Clone)]
enum MuxState {
    Running,
    /// Clean end: local shutdown or peer EOF at a frame boundary.
    Ended,
    Failed(MuxError),
}

/// Most bytes kept for connections the local side has not opened yet.
const EARLY_FRAMES_LIMIT: usize = 1024 * 1024;

/// Where received frames go, shared by the socket reader and [`Mux::open`].
#[derive(Debug, Default)]
struct InboundRoutes {
    /// Open connections.
    open: HashMap<ConnId, mpsc::Sender<Vec<u8>>>,
    /// Frames that arrived before their connection was opened. The peer may write as soon as
    /// the socket connects (an NRI plugin sends RegisterPlugin at once), and the reader task
    /// runs on another worker before the local side opens its connections: dropping these
    /// frames lost the registration.
    early: HashMap<ConnId, Vec<Vec<u8>>>,
    /// Bytes held in `early`.
    early_bytes: usize,
    /// Set when the reader stopped: no frame will arrive any more.
    closed: bool,
}

type Inbound = Arc<Mutex<InboundRoutes>>;

/// One Unix stream carrying several logical connections; see the module docs.
///
/// Dropping the `Mux` stops it, which ends every logical connection.
#[derive(Debug)]
pub struct Mux {
    inbound: Inbound,
    messages_tx: mpsc::Sender<(ConnId, Vec<u8>)>,
    state: watch::Receiver<MuxState>,
    cancel: CancellationToken,
    /// Cancelled when the socket writer has finished (flushed or given up) and shut the
    /// socket down; the read side may record the end state earlier.
    writer_done: CancellationToken,
}

impl Mux {
    /// Starts multiplexing `stream`. Must be called inside a tokio runtime.
    pub fn new<S>(stream: S) -> Self
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = tokio::io::split(stream);
        let inbound: Inbound = Arc::default();
        let (messages_tx, messages_rx) = mpsc::channel(WRITE_QUEUE_MESSAGES);
        let (state_tx, state) = watch::channel(MuxState::Running);
        let state_tx = Arc::new(state_tx);
        let cancel = CancellationToken::new();
        let writer_done = CancellationToken::new();

        tokio::spawn(read_loop(
            reader,
            Arc::clone(&inbound),
            Arc::clone(&state_tx),
            cancel.clone(),
        ));
        let cancel_for_writer = cancel.clone();
        let done = writer_done.clone();
        tokio::spawn(async move {
            write_loop(writer, messages_rx, state_tx, cancel_for_writer).await;
            done.cancel();
        });
        Self { inbound, messages_tx, state, cancel, writer_done }
    }

    /// Opens logical connection `id` and returns it as a byte stream.
    ///
    /// Bytes written must form ttrpc messages (they are framed per message, see the module
    /// docs); bytes read are the peer's stream for this ID.
    pub fn open(&self, id: ConnId) -> Result<MuxConn, MuxError> {
        if id.0 == 0 {
            return Err(MuxError::ReservedConnId);
        }
        if !matches!(*self.state.borrow(), MuxState::Running) {
            return Err(MuxError::Closed);
        }
        let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(CONN_QUEUE_FRAMES);
        let early = {
            let mut inbound = self.inbound.lock().unwrap_or_else(PoisonError::into_inner);
            if inbound.open.contains_key(&id) {
                return Err(MuxError::AlreadyOpen(id));
            }
            let early = inbound.early.remove(&id).unwrap_or_default();
            inbound.early_bytes -= early.iter().map(Vec::len).sum::<usize>();
            // After the reader stopped, the connection only sees what arrived early, then EOF.
            if !inbound.closed {
                inbound.open.insert(id, in_tx);
            }
            early
        };
        Ok(MuxConn {
            id,
            early: early.into(),
            inbound: in_rx,
            reading: Vec::new(),
            read_at: 0,
            outbound: PollSender::new(self.messages_tx.clone()),
            message: Vec::new(),
        })
    }

    /// Waits until the multiplexer stops and the socket is shut down; `Ok` for a clean end
    /// (local shutdown or the peer closing the socket between frames), the cause otherwise.
    ///
    /// The reader usually sees the end first; waiting for the writer too means that when this
    /// returns, queued frames were flushed or abandoned after the grace period, never still
    /// trickling out.
    pub async fn closed(&self) -> Result<(), MuxError> {
        let mut state = self.state.clone();
        let result = state.wait_for(|s| !matches!(s, MuxState::Running)).await.map(|s| s.clone());
        self.writer_done.cancelled().await;
        match result {
            Ok(MuxState::Failed(err)) => Err(err),
            // The sender lives in the I/O tasks; if both are gone the mux has ended.
            Ok(MuxState::Ended | MuxState::Running) | Err(_) => Ok(()),
        }
    }

    /// Whether the multiplexer is still running.
    #[must_use]
    pub fn is_running(&self) -> bool {
        matches!(*self.state.borrow(), MuxState::Running)
    }

    /// Stops the multiplexer: frames already queued are written, then the socket is shut down
    /// and every logical connection ends.
    pub fn shutdown(&self) {
        self.cancel.cancel();
    }
}

impl Drop for Mux {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Records the first terminal state; later ones are ignored.
fn finish(state: &watch::Sender<MuxState>, end: MuxState) {
    state.send_if_modified(|s| {
        if matches!(s, MuxState::Running) {
            *s = end;
            true
        } else {
            false
        }
    });
}

/// Reads `buf.len()` bytes; returns how many were read before EOF.
async fn read_full<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = reader.read(&mut buf[got..]).await?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
) -> Result<Option<(ConnId, Vec<u8>)>, MuxError> {
    let mut header = [0u8; FRAME_HEADER_LEN];
    let got = read_full(reader, &mut header).await.map_err(|e| MuxError::io("read", &e))?;
    if got == 0 {
        return Ok(None);
    }
    if got < FRAME_HEADER_LEN {
        return Err(MuxError::TruncatedFrame { conn: 0, got, want: FRAME_HEADER_LEN });
    }
    let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
    if len > MAX_FRAME_PAYLOAD {
        return Err(MuxError::FrameTooLarge { conn, len });
    }
    let mut payload = vec![0u8; len];
    let got = read_full(reader, &mut payload).await.map_err(|e| MuxError::io("read", &e))?;
    if got < len {
        return Err(MuxError::TruncatedFrame { conn, got, want: len });
    }
    Ok(Some((ConnId(conn), payload)))
}

async fn read_loop<R: AsyncRead>(
    reader: R,
    inbound: Inbound,
    state: Arc<watch::Sender<MuxState>>,
    cancel: CancellationToken,
) {
    let mut reader = std::pin::pin!(reader);
    let end = loop {
        let frame = tokio::select! {
            () = cancel.cancelled() => break MuxState::Ended,
            frame = read_frame(&mut reader) => frame,
        };
        match frame {
            Ok(None) => break MuxState::Ended,
            Err(err) => break MuxState::Failed(err),
            Ok(Some((conn, payload))) => {
                if payload.is_empty() {
                    continue;
                }
                let sender = {
                    let mut routes = inbound.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(sender) = routes.open.get(&conn) {
                        sender.clone()
                    } else {
                        if routes.early_bytes + payload.len() > EARLY_FRAMES_LIMIT {
                            tracing::warn!(%conn, len = payload.len(), "dropping frame for a connection that is not open (early buffer full)");
                        } else {
                            routes.early_bytes += payload.len();
                            routes.early.entry(conn).or_default().push(payload);
                        }
                        continue;
                    }
                };
                // Waiting here is the back-pressure: the socket is not read while a logical
                // connection's pipe is full.
                tokio::select! {
                    () = cancel.cancelled() => break MuxState::Ended,
                    sent = sender.send(payload) => {
                        if sent.is_err() {
                            tracing::debug!(%conn, "logical connection closed locally; dropping frame");
                        }
                    }
                }
            }
        }
    };
    finish(&state, end);
    // Dropping the senders ends every delivery loop, so readers see EOF.
    {
        let mut routes = inbound.lock().unwrap_or_else(PoisonError::into_inner);
        routes.open.clear();
        routes.closed = true;
    }
    cancel.cancel();
}

async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    conn: ConnId,
    payload: &[u8],
) -> io::Result<()> {
    let len = u32::try_from(payload.len()).expect("frames are at most MAX_FRAME_PAYLOAD");
    let mut buf = Vec::with_capacity(FRAME_HEADER_LEN + payload.len());
    buf.extend_from_slice(&conn.0.to_be_bytes());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(payload);
    writer.write_all(&buf).await
}

/// Writes one whole ttrpc message as the frames a Go peer can read ([`go_frames`]).
async fn write_message<W: AsyncWrite + Unpin>(
    writer: &mut W,
    conn: ConnId,
    message: Vec<u8>,
) -> io::Result<()> {
    for frame in go_frames(message) {
        write_frame(writer, conn, &frame).await?;
    }
    Ok(())
}

async fn write_loop<W: AsyncWrite>(
    writer: W,
    mut messages: mpsc::Receiver<(ConnId, Vec<u8>)>,
    state: Arc<watch::Sender<MuxState>>,
    cancel: CancellationToken,
) {
    let mut writer = std::pin::pin!(writer);
    let result: io::Result<()> = async {
        loop {
            let next = tokio::select! {
                biased;
                next = messages.recv() => next,
                () = cancel.cancelled() => break,
            };
            let Some((conn, message)) = next else { break };
            let write = write_message(&mut writer, conn, message);
            tokio::pin!(write);
            tokio::select! {
                written = &mut write => written?,
                // Stopping while a peer does not read: finish this frame within the grace
                // period (never leave half a frame), then give up.
                () = cancel.cancelled() => {
                    tokio::time::timeout(SHUTDOWN_GRACE, &mut write).await.map_err(|_| {
                        io::Error::new(io::ErrorKind::TimedOut, "peer stopped reading")
                    })??;
                    break;
                }
            }
        }
        // Clean stop: frames already queued go out, within the grace period.
        tokio::time::timeout(SHUTDOWN_GRACE, async {
            while let Ok((conn, message)) = messages.try_recv() {
                write_message(&mut writer, conn, message).await?;
            }
            writer.flush().await?;
            writer.shutdown().await
        })
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "peer stopped reading"))?
    }
    .await;
    if let Err(err) = result {
        // A peer that went away also surfaces on the read side; keep the first cause.
        finish(&state, MuxState::Failed(MuxError::io("write", &err)));
    } else {
        finish(&state, MuxState::Ended);
    }
    cancel.cancel();
}

/// Splits one ttrpc message into the frames a Go peer expects: the first
/// `min(GO_BUFIO_SIZE, len)` bytes, then the rest (if any) as a single frame.
#[must_use]
pub fn go_frames(mut message: Vec<u8>) -> Vec<Vec<u8>> {
    if message.len() <= GO_BUFIO_SIZE {
        return vec![message];
    }
    let rest = message.split_off(GO_BUFIO_SIZE);
    vec![message, rest]
}

/// One logical connection of a [`Mux`], usable as a byte stream (e.g. as a ttrpc socket).
///
/// Reading returns the payloads the socket reader routed here, in order (those that arrived
/// before the connection was opened first), then end-of-file once the socket has ended and
/// every received frame was read. Writing collects one ttrpc message at a time and queues it
/// for the socket writer when its last byte is written; that last write waits while the
/// writer's queue is full, so nothing is buffered here beyond the message being written.
#[derive(Debug)]
pub struct MuxConn {
    id: ConnId,
    /// Frames that arrived before the connection was opened, read first.
    early: VecDeque<Vec<u8>>,
    /// Frames the socket reader routes here; closed when the socket ends.
    inbound: mpsc::Receiver<Vec<u8>>,
    /// The frame being read and how much of it was.
    reading: Vec<u8>,
    read_at: usize,
    /// The socket writer's queue of whole messages.
    outbound: PollSender<(ConnId, Vec<u8>)>,
    /// The outgoing ttrpc message written so far (header, then body).
    message: Vec<u8>,
}

impl MuxConn {
    /// Body length announced by a complete ttrpc header.
    fn body_len(header: &[u8]) -> usize {
        u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize
    }

    /// How many of `buf`'s bytes belong to the message being written, and whether they end it.
    /// A header announcing a body over ttrpc's limit is refused before anything is taken.
    fn next_part(&self, buf: &[u8]) -> io::Result<(usize, bool)> {
        let have = self.message.len();
        if have < TTRPC_HEADER_LEN {
            let take = (TTRPC_HEADER_LEN - have).min(buf.len());
            if have + take < TTRPC_HEADER_LEN {
                return Ok((take, false));
            }
            let mut header = [0u8; TTRPC_HEADER_LEN];
            header[..have].copy_from_slice(&self.message);
            header[have..].copy_from_slice(&buf[..take]);
            let len = Self::body_len(&header);
            if len > TTRPC_MAX_BODY {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    MuxError::MessageTooLarge { conn: self.id, len },
                ));
            }
            return Ok((take, len == 0));
        }
        let missing = TTRPC_HEADER_LEN + Self::body_len(&self.message) - have;
        let take = missing.min(buf.len());
        Ok((take, take == missing))
    }
}

fn mux_stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, MuxError::Closed)
}

impl AsyncRead for MuxConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        let this = &mut *self;
        while this.read_at == this.reading.len() {
            let next = match this.early.pop_front() {
                Some(frame) => frame,
                None => match this.inbound.poll_recv(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Some(frame)) => frame,
                    // The socket ended and every frame received was read: end-of-file.
                    Poll::Ready(None) => return Poll::Ready(Ok(())),
                },
            };
            this.reading = next;
            this.read_at = 0;
        }
        let take = (this.reading.len() - this.read_at).min(buf.remaining());
        buf.put_slice(&this.reading[this.read_at..this.read_at + take]);
        this.read_at += take;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for MuxConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = &mut *self;
        let (take, ends_message) = this.next_part(buf)?;
        if ends_message {
            // A slot in the writer's queue before the last bytes are taken: when the queue
            // is full the caller waits here, and nothing is left behind that only a later
            // write or flush would send.
            match this.outbound.poll_reserve(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(Err(mux_stopped())),
                Poll::Ready(Ok(())) => {}
            }
            this.message.extend_from_slice(&buf[..take]);
            let message = std::mem::take(&mut this.message);
            if this.outbound.send_item((this.id, message)).is_err() {
                return Poll::Ready(Err(mux_stopped()));
            }
        } else {
            this.message.extend_from_slice(&buf[..take]);
        }
        Poll::Ready(Ok(take))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Whole messages are queued as soon as they are written; a partial one cannot go.
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The protocol has no per-connection close: the connection just stops sending. A
        // message cut off by the shutdown is dropped (a Go peer could not parse it).
        self.message.clear();
        self.outbound.close();
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::UnixStream;

    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    /// A ttrpc-shaped message (10-byte header with the body length) with a recognisable body.
    fn ttrpc_message(stream_id: u32, body_len: usize) -> Vec<u8> {
        let mut m = Vec::with_capacity(TTRPC_HEADER_LEN + body_len);
        m.extend_from_slice(&u32::try_from(body_len).unwrap().to_be_bytes());
        m.extend_from_slice(&stream_id.to_be_bytes());
        m.extend_from_slice(&[1, 0]);
        m.extend((0..body_len).map(|i| u8::try_from(i % 251).unwrap()));
        m
    }

    fn raw_frame(conn: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = conn.to_be_bytes().to_vec();
        f.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    async fn read_raw_frame(s: &mut UnixStream) -> (u32, Vec<u8>) {
        let mut h = [0u8; 8];
        s.read_exact(&mut h).await.unwrap();
        let len = u32::from_be_bytes([h[4], h[5], h[6], h[7]]) as usize;
        let mut p = vec![0u8; len];
        s.read_exact(&mut p).await.unwrap();
        (u32::from_be_bytes([h[0], h[1], h[2], h[3]]), p)
    }

    #[test]
    fn messages_are_cut_like_go_bufio_writes_them() {
        let sizes = |m: Vec<u8>| go_frames(m).iter().map(Vec::len).collect::<Vec<_>>();
        assert_eq!(sizes(vec![0; 10]), [10]);
        assert_eq!(sizes(vec![0; 4096]), [4096]);
        assert_eq!(sizes(vec![0; 4097]), [4096, 1]);
        assert_eq!(sizes(vec![0; 8192]), [4096, 4096]);
        assert_eq!(sizes(vec![0; MAX_FRAME_PAYLOAD]), [4096, MAX_FRAME_PAYLOAD - 4096]);
        let message = ttrpc_message(1, 10_000);
        assert_eq!(go_frames(message.clone()).concat(), message);
    }

    #[tokio::test]
    async fn large_message_goes_out_as_two_frames_and_arrives_whole() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        let mut conn = mux.open(PLUGIN_SERVICE_CONN).unwrap();
        let small = ttrpc_message(1, 20);
        let large = ttrpc_message(3, 3 << 20);
        // Written in odd pieces: the framer must find message boundaries itself.
        let both = [small.clone(), large.clone()].concat();
        let writer = tokio::spawn(async move {
            for piece in both.chunks(7_777) {
                conn.write_all(piece).await.unwrap();
            }
            conn
        });
        let frames: Vec<_> = tokio::time::timeout(WAIT, async {
            let mut frames = Vec::new();
            for _ in 0..3 {
                frames.push(read_raw_frame(&mut peer).await);
            }
            frames
        })
        .await
        .unwrap();
        let _conn = writer.await.unwrap();
        assert!(frames.iter().all(|(id, _)| *id == 1));
        assert_eq!(frames[0].1, small);
        assert_eq!(frames[1].1.len(), GO_BUFIO_SIZE);
        assert_eq!(frames[2].1.len(), large.len() - GO_BUFIO_SIZE);
        assert_eq!([frames[1].1.clone(), frames[2].1.clone()].concat(), large);
    }

    #[tokio::test]
    async fn split_and_merged_frames_read_as_one_byte_stream() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        let mut plugin = mux.open(PLUGIN_SERVICE_CONN).unwrap();
        let mut runtime = mux.open(RUNTIME_SERVICE_CONN).unwrap();
        let a = ttrpc_message(1, 50_000);
        let b = ttrpc_message(2, 300);
        // conn 1 gets `a` in 1-byte, 13-byte and large pieces; conn 2's bytes are interleaved;
        // a frame for an unopened connection (7) is dropped.
        let mut wire = Vec::new();
        wire.extend(raw_frame(1, &a[..1]));
        wire.extend(raw_frame(2, &b[..100]));
        wire.extend(raw_frame(1, &a[1..14]));
        wire.extend(raw_frame(7, b"ignored"));
        wire.extend(raw_frame(1, &[]));
        wire.extend(raw_frame(1, &a[14..]));
        wire.extend(raw_frame(2, &b[100..]));
        peer.write_all(&wire).await.unwrap();
        let mut got_a = vec![0u8; a.len()];
        let mut got_b = vec![0u8; b.len()];
        tokio::time::timeout(WAIT, async {
            plugin.read_exact(&mut got_a).await.unwrap();
            runtime.read_exact(&mut got_b).await.unwrap();
        })
        .await
        .unwrap();
        assert_eq!(got_a, a);
        assert_eq!(got_b, b);
        drop(peer);
        assert!(tokio::time::timeout(WAIT, mux.closed()).await.unwrap().is_ok());
        // Clean EOF reaches the logical connections.
        let mut rest = Vec::new();
        let n = tokio::time::timeout(WAIT, plugin.read_to_end(&mut rest)).await.unwrap().unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn peer_dying_mid_frame_is_an_error_not_a_hang() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        let mut conn = mux.open(PLUGIN_SERVICE_CONN).unwrap();
        let mut partial = 1u32.to_be_bytes().to_vec();
        partial.extend_from_slice(&5000u32.to_be_bytes());
        partial.extend_from_slice(&[0u8; 100]);
        peer.write_all(&partial).await.unwrap();
        drop(peer);
        let closed = tokio::time::timeout(WAIT, mux.closed()).await.unwrap();
        assert!(
            matches!(closed, Err(MuxError::TruncatedFrame { conn: 1, got: 100, want: 5000 })),
            "{closed:?}"
        );
        let mut buf = Vec::new();
        let n = tokio::time::timeout(WAIT, conn.read_to_end(&mut buf)).await.unwrap().unwrap();
        assert_eq!(n, 0, "the logical connection ends at the failure");
        assert!(matches!(mux.open(ConnId(3)), Err(MuxError::Closed)));
    }

    #[tokio::test]
    async fn peer_dying_mid_header_is_an_error() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        peer.write_all(&[0, 0, 0, 1, 0]).await.unwrap();
        drop(peer);
        let closed = tokio::time::timeout(WAIT, mux.closed()).await.unwrap();
        assert!(
            matches!(closed, Err(MuxError::TruncatedFrame { conn: 0, got: 5, want: 8 })),
            "{closed:?}"
        );
    }

    #[tokio::test]
    async fn oversized_frame_is_refused() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        let mut header = 2u32.to_be_bytes().to_vec();
        header.extend_from_slice(&u32::MAX.to_be_bytes());
        peer.write_all(&header).await.unwrap();
        let closed = tokio::time::timeout(WAIT, mux.closed()).await.unwrap();
        assert!(matches!(closed, Err(MuxError::FrameTooLarge { conn: 2, .. })), "{closed:?}");
    }

    #[tokio::test]
    async fn an_outgoing_message_over_the_ttrpc_limit_fails_its_writer_and_sends_nothing() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        let mut conn = mux.open(PLUGIN_SERVICE_CONN).unwrap();
        let mut header = u32::try_from(TTRPC_MAX_BODY + 1).unwrap().to_be_bytes().to_vec();
        header.extend_from_slice(&[0, 0, 0, 1, 1, 0]);
        let err = conn.write_all(&header).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        assert!(err.to_string().contains("connection 1"), "{err}");
        // A message within the limit still goes out whole, and is the first frame sent.
        let message = ttrpc_message(3, 5);
        conn.write_all(&message).await.unwrap();
        assert_eq!(read_raw_frame(&mut peer).await, (1, message));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_that_arrive_before_the_connection_is_opened_are_kept() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        // The peer speaks first, as an NRI plugin does with RegisterPlugin.
        let first = ttrpc_message(1, 100);
        let second = ttrpc_message(2, 5000);
        for message in [&first, &second] {
            for frame in go_frames(message.clone()) {
                peer.write_all(&raw_frame(2, &frame)).await.unwrap();
            }
        }
        let mux = Mux::new(ours);
        // Let the reader route the frames before anything is open.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut conn = mux.open(RUNTIME_SERVICE_CONN).unwrap();
        let expected = [first, second].concat();
        let mut got = vec![0u8; expected.len()];
        tokio::time::timeout(WAIT, conn.read_exact(&mut got)).await.unwrap().unwrap();
        assert!(got == expected, "early frames are delivered in order and whole");
        // Frames after the open still flow.
        let third = ttrpc_message(3, 10);
        peer.write_all(&raw_frame(2, &third)).await.unwrap();
        let mut got = vec![0u8; third.len()];
        tokio::time::timeout(WAIT, conn.read_exact(&mut got)).await.unwrap().unwrap();
        assert_eq!(got, third);
    }

    #[tokio::test]
    async fn connection_ids_are_checked() {
        let (ours, _peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        assert!(matches!(mux.open(ConnId(0)), Err(MuxError::ReservedConnId)));
        let _c = mux.open(PLUGIN_SERVICE_CONN).unwrap();
        assert!(matches!(
            mux.open(PLUGIN_SERVICE_CONN),
            Err(MuxError::AlreadyOpen(PLUGIN_SERVICE_CONN))
        ));
    }

    #[tokio::test]
    async fn shutdown_flushes_queued_frames_then_closes_the_socket() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        let mut conn = mux.open(RUNTIME_SERVICE_CONN).unwrap();
        let message = ttrpc_message(1, 64);
        conn.write_all(&message).await.unwrap();
        let (id, payload) = tokio::time::timeout(WAIT, read_raw_frame(&mut peer)).await.unwrap();
        assert_eq!((id, payload), (2, message));
        mux.shutdown();
        assert!(tokio::time::timeout(WAIT, mux.closed()).await.unwrap().is_ok());
        let mut rest = Vec::new();
        let n = tokio::time::timeout(WAIT, peer.read_to_end(&mut rest)).await.unwrap().unwrap();
        assert_eq!(n, 0, "the peer sees EOF after shutdown");
    }

    #[tokio::test]
    async fn shutdown_does_not_hang_on_a_peer_that_stopped_reading() {
        let (ours, mut peer) = UnixStream::pair().unwrap();
        let mux = Mux::new(ours);
        let mut conn = mux.open(PLUGIN_SERVICE_CONN).unwrap();
        // Several MiB: more than the socket buffer and our pipes hold.
        let writer = tokio::spawn(async move {
            for i in 0..4 {
                if conn.write_all(&ttrpc_message(i, 2 << 20)).await.is_err() {
                    break;
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        mux.shutdown();
        assert!(tokio::time::timeout(WAIT, mux.closed()).await.unwrap().is_ok());
        // The stuck write is abandoned after the grace period: the local writer gets an error
        // and the socket closes (the peer reads what was sent, then EOF).
        tokio::time::timeout(WAIT, writer).await.unwrap().unwrap();
        let mut sink = Vec::new();
        tokio::time::timeout(WAIT, peer.read_to_end(&mut sink))
            .await
            .expect("socket closed after the grace period")
            .unwrap();
        assert!(sink.len() < 4 * (2 << 20), "not everything was delivered");
    }

    #[tokio::test]
    async fn two_muxes_carry_both_directions_with_back_pressure() {
        let (a, b) = UnixStream::pair().unwrap();
        let (left, right) = (Mux::new(a), Mux::new(b));
        let mut l1 = left.open(PLUGIN_SERVICE_CONN).unwrap();
        let mut r1 = right.open(PLUGIN_SERVICE_CONN).unwrap();
        // Far more than all buffers together: the writer must wait for the reader.
        let messages: Vec<_> = (0..40).map(|i| ttrpc_message(i, 100_000)).collect();
        let expected = messages.concat();
        let writer = tokio::spawn(async move {
            for m in messages {
                l1.write_all(&m).await.unwrap();
            }
            l1
        });
        let mut got = vec![0u8; expected.len()];
        tokio::time::timeout(WAIT, r1.read_exact(&mut got)).await.unwrap().unwrap();
        assert!(got == expected);
        let _l1 = writer.await.unwrap();
    }
}
