//! TLS of the secure mode: the serving certificate (PEM files, or a self-signed one made at
//! start and logged by its SHA-256 fingerprint) and a listener that completes TLS handshakes
//! beside the accept loop, so one slow or silent client cannot hold the others up.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject as _;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A handshake not done by then is dropped (a client that connects and says nothing).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once; further connections wait in the kernel's backlog.
const HANDSHAKES_IN_FLIGHT: usize = 64;

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// PEM files: the certificate chain (leaf first) and its private key (PKCS#8, PKCS#1 or
    /// SEC1), read once at start.
    Files {
        /// `--metrics-tls-cert-file`.
        cert: PathBuf,
        /// `--metrics-tls-key-file`.
        key: PathBuf,
    },
    /// A certificate made at start for these names (DNS names or IP addresses), signed by
    /// its own key: scrapers skip verification or pin the logged fingerprint.
    SelfSigned {
        /// Subject alternative names.
        names: Vec<String>,
    },
}

/// The serving certificate could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing usable.
    #[error("reading {what} {path}: {source}")]
    Pem {
        /// `certificate` or `private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("{0}: no certificate in the file")]
    NoCertificate(PathBuf),
    /// The self-signed certificate could not be made.
    #[error("making a self-signed certificate: {0}")]
    SelfSigned(#[source] rcgen::Error),
    /// rustls refused the certificate or key (a key that does not match, say).
    #[error("the serving certificate: {0}")]
    Config(#[source] rustls::Error),
}

/// A server configuration and the SHA-256 fingerprint of its leaf certificate.
#[derive(Debug, Clone)]
pub struct ServingCertificate {
    /// The rustls configuration (HTTP/1.1 only, as the endpoint serves).
    pub config: Arc<rustls::ServerConfig>,
    /// `AB:CD:...`, as `openssl x509 -fingerprint -sha256` prints it.
    pub fingerprint: String,
}

fn pem_error(
    what: &'static str,
    path: &Path,
) -> impl FnOnce(rustls::pki_types::pem::Error) -> TlsError {
    let path = path.to_owned();
    move |source| TlsError::Pem { what, path, source }
}

/// Loads or makes the serving certificate.
pub fn serving_certificate(source: &TlsSource) -> Result<ServingCertificate, TlsError> {
    let (chain, key): (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) = match source {
        TlsSource::Files { cert, key } => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(pem_error("certificate", cert))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(pem_error("certificate", cert))?;
            if chain.is_empty() {
                return Err(TlsError::NoCertificate(cert.clone()));
            }
            (chain, PrivateKeyDer::from_pem_file(key).map_err(pem_error("private key", key))?)
        }
        TlsSource::SelfSigned { names } => {
            let made =
                rcgen::generate_simple_self_signed(names.clone()).map_err(TlsError::SelfSigned)?;
            let key = PrivatePkcs8KeyDer::from(made.signing_key.serialize_der());
            (vec![made.cert.der().clone()], PrivateKeyDer::Pkcs8(key))
        }
    };
    let fingerprint = Sha256::digest(chain[0].as_ref())
        .iter()
        .map(|byte| format!("{byte:02X}"))
        .collect::<Vec<_>>()
        .join(":");
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(TlsError::Config)?
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServingCertificate { config: Arc::new(config), fingerprint })
}

/// Aborts the accepting task when the listener goes.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A TCP listener whose connections come out TLS-established (for `axum::serve`).
pub(crate) struct TlsListener {
    incoming: tokio::sync::mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    _accepting: AbortOnDrop,
}

impl TlsListener {
    /// Serves TLS with `config` on `listener`.
    pub(crate) fn new(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (sender, incoming) = tokio::sync::mpsc::channel(HANDSHAKES_IN_FLIGHT);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(tokio::sync::Semaphore::new(HANDSHAKES_IN_FLIGHT));
        let accepting = tokio::spawn(async move {
            loop {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else { return };
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // EMFILE and friends: back off rather than spin.
                        tracing::warn!(%err, "metrics endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, sender) = (acceptor.clone(), sender.clone());
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await;
                    drop(slot);
                    match handshake {
                        Ok(Ok(tls)) => {
                            let _closed = sender.send((tls, peer)).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%err, %peer, "metrics TLS handshake failed");
                        }
                        Err(_elapsed) => {
                            tracing::debug!(%peer, "metrics TLS handshake timed out");
                        }
                    }
                });
            }
        });
        Ok(Self { incoming, local, _accepting: AbortOnDrop(accepting.abort_handle()) })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.incoming.recv().await {
            Some(connection) => connection,
            // The accepting task only ends when aborted, that is with this listener.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::{TlsSource, serving_certificate};

    #[test]
    fn a_self_signed_certificate_is_made_with_its_fingerprint() {
        let names = vec!["node-a".to_owned(), "127.0.0.1".to_owned()];
        let one = serving_certificate(&TlsSource::SelfSigned { names: names.clone() }).unwrap();
        let two = serving_certificate(&TlsSource::SelfSigned { names }).unwrap();
        assert_eq!(one.fingerprint.len(), 32 * 3 - 1, "{}", one.fingerprint);
        assert_ne!(one.fingerprint, two.fingerprint, "a new key each start");
    }

    #[test]
    fn missing_or_empty_files_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("tls.crt");
        let key = dir.path().join("tls.key");
        let err = serving_certificate(&TlsSource::Files { cert: cert.clone(), key: key.clone() })
            .unwrap_err();
        assert!(err.to_string().contains("tls.crt"), "{err}");
        std::fs::write(&cert, "").unwrap();
        let err = serving_certificate(&TlsSource::Files { cert, key }).unwrap_err();
        assert!(err.to_string().contains("no certificate"), "{err}");
    }
}
