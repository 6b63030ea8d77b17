//! Kubernetes API adapter: client construction, ResourceSlices, ResourceClaims, Events.

pub mod claim_status;
pub mod claims;
pub mod events;
pub mod resource_slices;
pub mod status_sink;

use std::path::Path;

/// A client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or parsed.
    #[error("reading kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No configuration could be found (no flag, not in a cluster, no KUBECONFIG).
    #[error("no Kubernetes configuration: {0}")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be created from the configuration.
    #[error("creating the Kubernetes client: {0}")]
    Client(#[source] kube::Error),
}

/// Builds a client: `--kubeconfig` if given, else the in-cluster service account, else
/// `KUBECONFIG`/`~/.kube/config` (DESIGN §1).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| {
                ClientError::Kubeconfig { path: path.display().to_string(), source }
            })?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|source| ClientError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?
        }
        None => match kube::Config::incluster() {
            Ok(config) => config,
            Err(_) => kube::Config::infer().await.map_err(ClientError::Infer)?,
        },
    };
    kube::Client::try_from(config).map_err(ClientError::Client)
}
