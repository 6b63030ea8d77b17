//! Kubernetes API adapter: client construction, ResourceSlices, ResourceClaims, Events, our custom kinds.

pub mod access_review;
pub mod claim_status;
pub mod claims;
pub mod controller_cluster;
pub mod events;
pub mod ip_blocks;
pub mod kinds;
pub mod leader_election;
pub mod namespaces;
pub mod node_networks;
pub mod pod_networks;
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

/// How long a unary API call may wait for its answer. The API server answers within its own
/// 60 s request timeout; a connection that stays silent past this is half-open (a restarted
/// or partitioned server), and kube-rs has no read timeout by default, so without this one
/// slice publication, status writes and the gone-claim sweep would hang on it for good.
pub const UNARY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The daemon's two API clients: unary calls with a read timeout, and watches without one
/// (a watch is silent for long stretches; the watcher's own idle timeout and relist cover it).
#[derive(Clone)]
pub struct ApiClients {
    /// Gets, lists, applies, patches, deletes.
    pub unary: kube::Client,
    /// Watches.
    pub watch: kube::Client,
}

/// Builds [`ApiClients`] from the configuration [`client`] finds, unary calls timing out
/// after `read_timeout`.
pub async fn clients(
    kubeconfig: Option<&Path>,
    read_timeout: std::time::Duration,
) -> Result<ApiClients, ClientError> {
    let config = config(kubeconfig).await?;
    let mut unary = config.clone();
    unary.read_timeout = Some(read_timeout);
    // The timeout counts from each request, not from when its pooled connection went idle.
    unary.reset_reader_on_write = true;
    Ok(ApiClients {
        unary: kube::Client::try_from(unary).map_err(ClientError::Client)?,
        watch: kube::Client::try_from(config).map_err(ClientError::Client)?,
    })
}

/// Builds a client: `--kubeconfig` if given, else the in-cluster service account, else
/// `KUBECONFIG`/`~/.kube/config` (DESIGN §1).
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, ClientError> {
    kube::Client::try_from(config(kubeconfig).await?).map_err(ClientError::Client)
}

async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config, ClientError> {
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
    Ok(config)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::resource::v1::ResourceClaim;

    use super::*;

    /// A kubeconfig for a plain-HTTP server on loopback.
    fn kubeconfig(dir: &Path, server: &str) -> std::path::PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: x\n\
                 clusters: [{{name: c, cluster: {{server: \"{server}\"}}}}]\n\
                 users: [{{name: u, user: {{}}}}]\n\
                 contexts: [{{name: x, context: {{cluster: c, user: u}}}}]\n"
            ),
        )
        .unwrap();
        path
    }

    #[tokio::test]
    async fn a_unary_call_to_a_half_open_server_fails_instead_of_hanging() {
        // Accepts connections and never answers, like a partitioned API server.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server = format!("http://{}", listener.local_addr().unwrap());
        let silent = tokio::spawn(async move {
            let mut held = Vec::new();
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                held.push(stream);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let clients = clients(Some(&kubeconfig(dir.path(), &server)), Duration::from_millis(300))
            .await
            .unwrap();
        let claims: kube::Api<ResourceClaim> = kube::Api::namespaced(clients.unary, "default");
        let answered = tokio::time::timeout(Duration::from_secs(20), claims.get("web")).await;
        let err = answered.expect("the unary call hung past its read timeout").unwrap_err();
        let chain = crate::model::cause::chain(&err);
        assert!(chain.to_lowercase().contains("timed out"), "{chain}");
        silent.abort();
    }
}
