//! The metrics endpoint's security flags, shared by `netclaim node` and `netclaim controller`
//! (decision 0018: plain HTTP on loopback by default; the shipped manifests turn the secure
//! mode on).

use std::path::PathBuf;

use clap::Args;

use crate::metrics::MetricsSecurity;
use crate::metrics::tls::TlsSource;

/// `--metrics-secure` and its certificate.
#[derive(Debug, Clone, Args)]
pub struct MetricsSecurityArgs {
    /// Serve /metrics over HTTPS, only to scrapers whose bearer token the API server
    /// authenticates (TokenReview) and lets `get` the non-resource URL /metrics
    /// (SubjectAccessReview). Needs `create` on tokenreviews and subjectaccessreviews.
    /// /healthz and /readyz stay open (kubelet's probes carry no token).
    #[arg(
        long,
        env = "NETCLAIM_METRICS_SECURE",
        default_value_t = false,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub metrics_secure: bool,

    /// PEM certificate chain of the secure mode (default: a self-signed certificate made at
    /// start; its SHA-256 fingerprint is logged).
    #[arg(
        long,
        env = "NETCLAIM_METRICS_TLS_CERT_FILE",
        requires = "metrics_tls_key_file",
        requires = "metrics_secure"
    )]
    pub metrics_tls_cert_file: Option<PathBuf>,

    /// PEM private key of `--metrics-tls-cert-file`.
    #[arg(long, env = "NETCLAIM_METRICS_TLS_KEY_FILE", requires = "metrics_tls_cert_file")]
    pub metrics_tls_key_file: Option<PathBuf>,
}

impl MetricsSecurityArgs {
    /// The mode the flags ask for; a self-signed certificate names `names`.
    #[must_use]
    pub fn security(&self, names: &[&str]) -> MetricsSecurity {
        if !self.metrics_secure {
            return MetricsSecurity::Plain;
        }
        MetricsSecurity::Secure(match (&self.metrics_tls_cert_file, &self.metrics_tls_key_file) {
            (Some(cert), Some(key)) => TlsSource::Files { cert: cert.clone(), key: key.clone() },
            _ => TlsSource::SelfSigned {
                names: names
                    .iter()
                    .copied()
                    .chain(["localhost", "127.0.0.1"])
                    .map(str::to_owned)
                    .collect(),
            },
        })
    }
}
