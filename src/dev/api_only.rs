//! `netclaim dev --api-only`: serve the in-memory API server with the project's
//! CustomResourceDefinitions installed, write its kubeconfig, run until shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use kube_inmemory::apiserver::{self, ApiServerError, ServerOptions};
use kube_inmemory::kubeconfig::{self, KubeconfigError};

use super::crds::{self, CrdError};

/// Errors of `netclaim dev --api-only`.
#[derive(Debug, thiserror::Error)]
pub enum ApiOnlyError {
    /// The server failed to start or to serve.
    #[error(transparent)]
    Server(#[from] ApiServerError),
    /// The kubeconfig could not be written.
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    /// The CustomResourceDefinitions could not be installed.
    #[error(transparent)]
    Crds(#[from] CrdError),
}

/// Serves on `listen` (e.g. `127.0.0.1:0`), installs the project's definitions, writes a
/// kubeconfig to `kubeconfig_out`, calls `on_ready` with the server URL (print it, signal
/// readiness), and serves until `shutdown` completes. The kubeconfig is removed on the way
/// out, so a stale file never points at a dead server.
pub async fn run(
    listen: SocketAddr,
    options: ServerOptions,
    kubeconfig_out: Option<&Path>,
    on_ready: impl FnOnce(&str),
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ApiOnlyError> {
    let token = options.bearer_token.clone();
    let (addr, task) = apiserver::serve(listen, options, shutdown).await?;
    let url = format!("http://{addr}");
    // Before anyone is told the server is ready: clients find PodNetworks served.
    if let Err(err) = install_definitions(addr, token.as_deref()).await {
        task.abort();
        return Err(err);
    }
    let written: Option<PathBuf> = match kubeconfig_out {
        Some(path) => {
            kubeconfig::write(path, &url, token.as_deref())?;
            Some(path.to_owned())
        }
        None => None,
    };
    on_ready(&url);
    let result = match task.await {
        Ok(r) => r.map_err(ApiOnlyError::from),
        Err(join) => Err(ApiOnlyError::Server(ApiServerError::Serve(std::io::Error::other(join)))),
    };
    if let Some(path) = written {
        // Best effort: the file may already be gone; the serve result matters more.
        let _ = std::fs::remove_file(path);
    }
    result
}

async fn install_definitions(addr: SocketAddr, token: Option<&str>) -> Result<(), ApiOnlyError> {
    let client = crds::client_for(addr, token)?;
    crds::install(&client).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn writes_kubeconfig_serves_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (url_tx, url_rx) = tokio::sync::oneshot::channel::<String>();
        let p = path.clone();
        let task = tokio::spawn(async move {
            run(
                "127.0.0.1:0".parse().unwrap(),
                ServerOptions::default(),
                Some(&p),
                |url| url_tx.send(url.to_owned()).unwrap(),
                async move {
                    let _ = stop_rx.await;
                },
            )
            .await
        });
        let url = url_rx.await.unwrap();
        let config = std::fs::read_to_string(&path).unwrap();
        assert!(config.contains(&url), "{config}");
        // The server answers on the URL in the kubeconfig.
        let addr = url.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /version HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut resp = String::new();
        stream.read_to_string(&mut resp).await.unwrap();
        assert!(resp.starts_with("HTTP/1.1 200") && resp.contains("\"minor\":\"35\""), "{resp}");
        stop_tx.send(()).unwrap();
        task.await.unwrap().unwrap();
        assert!(!path.exists());
    }
}
