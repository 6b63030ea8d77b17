//! Unix-socket transport for the kubelet-facing gRPC servers: owner-only sockets and
//! directories, and the accepted-stream adapter that applies [`ClientStreamRewriter`].

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::BytesMut;
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::Connected;

use super::KubeletError;
use super::authority::ClientStreamRewriter;

/// Longest socket path the kernel accepts (`sun_path` is 108 bytes including the NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// An accepted connection whose client-to-server bytes pass through a
/// [`ClientStreamRewriter`]; the server-to-client direction is the inner stream's own.
#[derive(Debug)]
pub struct AuthorityAdapter<S> {
    inner: S,
    rewriter: ClientStreamRewriter,
    /// Bytes read from the client and not yet processed (an incomplete frame).
    raw: BytesMut,
    /// Processed bytes not yet handed to the server.
    ready: BytesMut,
}

impl<S> AuthorityAdapter<S> {
    /// Wraps an accepted stream.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            rewriter: ClientStreamRewriter::new(),
            raw: BytesMut::new(),
            ready: BytesMut::new(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityAdapter<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if buf.remaining() == 0 {
            return Poll::Ready(Ok(()));
        }
        loop {
            if !this.ready.is_empty() {
                let n = buf.remaining().min(this.ready.len());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            // Borrow the caller's buffer for the raw read, then take the bytes back out of it:
            // they must go through the rewriter before the server may see them.
            let before = buf.filled().len();
            match Pin::new(&mut this.inner).poll_read(cx, buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => return Poll::Ready(Err(err)),
                Poll::Ready(Ok(())) => {}
            }
            let read = buf.filled().len() - before;
            if read == 0 {
                // End of stream. A frame cut short stays unsent; the server sees the
                // connection end either way.
                return Poll::Ready(Ok(()));
            }
            this.raw.extend_from_slice(&buf.filled()[before..]);
            buf.set_filled(before);
            this.rewriter
                .process(&mut this.raw, &mut this.ready)
                .map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))?;
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityAdapter<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for AuthorityAdapter<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The accepted connections of `listener`, each wrapped in an [`AuthorityAdapter`].
pub fn adapted_incoming(
    listener: UnixListener,
) -> impl Stream<Item = io::Result<AuthorityAdapter<UnixStream>>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(AuthorityAdapter::new))
}

/// Identity of a socket file we bound, so we only ever remove our own. Device and inode alone
/// are not enough: a file system reuses the inode number of a socket deleted a moment ago, so
/// the creation time (a socket's mtime never changes afterwards) is part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketIdentity {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl SocketIdentity {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// Creates `dir` and missing parents with mode 0700. Existing directories keep their mode:
/// the registry directory belongs to kubelet.
pub(crate) fn create_private_dir(dir: &Path) -> Result<(), KubeletError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| KubeletError::CreateDir { path: dir.to_owned(), source })
}

/// Binds a listening socket at `path` with mode 0600, replacing a stale socket left by an
/// earlier run. Refuses to replace anything that is not a socket.
pub(crate) fn bind_private_socket(
    path: &Path,
) -> Result<(UnixListener, SocketIdentity), KubeletError> {
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(KubeletError::SocketPathTooLong {
            path: path.to_owned(),
            max: MAX_SOCKET_PATH,
        });
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            tracing::info!(path = %path.display(), "removing stale socket");
            std::fs::remove_file(path)
                .map_err(|source| KubeletError::RemoveSocket { path: path.to_owned(), source })?;
        }
        Ok(_) => {
            return Err(KubeletError::NotASocket { path: path.to_owned() });
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(KubeletError::Stat { path: path.to_owned(), source });
        }
    }
    let listener = UnixListener::bind(path)
        .map_err(|source| KubeletError::Bind { path: path.to_owned(), source })?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|source| KubeletError::Chmod { path: path.to_owned(), source })?;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|source| KubeletError::Stat { path: path.to_owned(), source })?;
    Ok((listener, SocketIdentity::of(&meta)))
}

/// Whether `path` still is the socket we bound (not deleted, not replaced).
pub(crate) fn socket_is_ours(path: &Path, identity: SocketIdentity) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|meta| SocketIdentity::of(&meta) == identity)
}

/// Removes the socket at `path` if it is still the one we bound; removal is how kubelet learns
/// that the plugin is gone.
pub(crate) fn remove_socket_if_ours(path: &Path, identity: SocketIdentity) {
    if socket_is_ours(path, identity)
        && let Err(err) = std::fs::remove_file(path)
    {
        tracing::warn!(path = %path.display(), error = %err, "cannot remove socket");
    }
}

/// Resolves once `path` is no longer the socket we bound, checking every `interval`
/// (one `lstat` per check).
pub(crate) async fn socket_gone(
    path: PathBuf,
    identity: SocketIdentity,
    interval: std::time::Duration,
) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        if !socket_is_ours(&path, identity) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn socket_is_0600_and_directory_0700() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        create_private_dir(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
        let sock = dir.join("x.sock");
        let (_listener, id) = bind_private_socket(&sock).unwrap();
        assert_eq!(std::fs::metadata(&sock).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(socket_is_ours(&sock, id));
        remove_socket_if_ours(&sock, id);
        assert!(!sock.exists());
    }

    #[tokio::test]
    async fn stale_socket_is_replaced_but_a_regular_file_is_not() {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("stale.sock");
        let old = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        drop(old);
        let (_listener, id) = bind_private_socket(&sock).unwrap();
        assert!(socket_is_ours(&sock, id));

        let file = tmp.path().join("file.sock");
        std::fs::write(&file, b"not a socket").unwrap();
        let err = bind_private_socket(&file).unwrap_err();
        assert!(matches!(err, KubeletError::NotASocket { .. }), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"not a socket");
    }

    #[tokio::test]
    async fn removal_spares_a_socket_that_replaced_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let sock = tmp.path().join("s.sock");
        let (first, id) = bind_private_socket(&sock).unwrap();
        drop(first);
        let (_second, id2) = bind_private_socket(&sock).unwrap();
        assert_ne!(id, id2);
        remove_socket_if_ours(&sock, id);
        assert!(sock.exists());
    }

    #[test]
    fn too_long_socket_path_is_rejected_with_the_path() {
        let long = PathBuf::from(format!("/tmp/{}/dra.sock", "d".repeat(120)));
        let err = bind_private_socket(&long).unwrap_err();
        assert!(err.to_string().contains("dra.sock"), "{err}");
    }
}
