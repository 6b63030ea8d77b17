//! A scraper of the metrics endpoint's secure mode, as Prometheus configured with
//! `insecureSkipVerify` scrapes it: HTTPS without checking the (self-signed) certificate,
//! an optional bearer token, one HTTP/1.1 GET per connection.

use std::sync::Arc;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::rustls;
use tokio_rustls::rustls::DigitallySignedStruct;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};

/// Accepts any server certificate (the scrape's `insecureSkipVerify`); signatures are still
/// checked, so the handshake is a real one.
#[derive(Debug)]
struct SkipVerify(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `GET path` over HTTPS on `127.0.0.1:port` with `Authorization: Bearer <token>` when a
/// token is given: the status code and the body, or what failed.
pub async fn get(port: u16, path: &str, token: Option<&str>) -> Result<(u16, String), String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(SkipVerify(provider)))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = connector.connect(name, tcp).await.map_err(|e| format!("handshake: {e}"))?;
    let authorization =
        token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUser-Agent: Prometheus/3.0\r\n\
         {authorization}Connection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes()).await.map_err(|e| format!("write: {e}"))?;
    let mut response = Vec::new();
    // A server that closes without close_notify ends the read with UnexpectedEof after the
    // whole response: what was read is the answer.
    if let Err(err) = tls.read_to_end(&mut response).await
        && err.kind() != std::io::ErrorKind::UnexpectedEof
    {
        return Err(format!("read: {err}"));
    }
    let response = String::from_utf8_lossy(&response).into_owned();
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status line in {response:?}"))?;
    let body = response.split_once("\r\n\r\n").map(|(_, body)| body.to_owned()).unwrap_or_default();
    Ok((code, body))
}
