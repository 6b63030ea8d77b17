//! `netclaim dev`: serve the in-memory API server until SIGTERM/SIGINT.

use super::DevArgs;
use crate::dev::api_only::{self, ApiOnlyError};
use crate::dev::apiserver::ServerOptions;

/// Why `netclaim dev` failed.
#[derive(Debug, thiserror::Error)]
pub enum DevCommandError {
    /// Only `--api-only` exists so far.
    #[error(
        "netclaim dev needs --api-only: the allocator, dev kubelet and --demo are not built yet"
    )]
    NotApiOnly,
    /// The address is not loopback.
    #[error("--listen {0}: the dev API server has no authentication; listen on loopback only")]
    NotLoopback(std::net::SocketAddr),
    /// The async runtime could not start.
    #[error("starting the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The server failed.
    #[error(transparent)]
    Server(#[from] ApiOnlyError),
    /// A signal handler could not be installed.
    #[error("installing a signal handler: {0}")]
    Signal(#[source] std::io::Error),
}

impl DevCommandError {
    /// Whether this is a usage error (exit code 2).
    #[must_use]
    pub fn is_usage(&self) -> bool {
        matches!(self, Self::NotApiOnly | Self::NotLoopback(_))
    }
}

/// Runs the command.
pub fn run(args: &DevArgs) -> Result<(), DevCommandError> {
    if !args.api_only {
        return Err(DevCommandError::NotApiOnly);
    }
    if !args.listen.ip().is_loopback() {
        return Err(DevCommandError::NotLoopback(args.listen));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(DevCommandError::Runtime)?;
    runtime.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut terminate = signal(SignalKind::terminate()).map_err(DevCommandError::Signal)?;
        let mut interrupt = signal(SignalKind::interrupt()).map_err(DevCommandError::Signal)?;
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        let options = ServerOptions {
            drop_consumable_capacity: args.drop_consumable_capacity,
            ..ServerOptions::default()
        };
        api_only::run(
            args.listen,
            options,
            args.kubeconfig_out.as_deref(),
            |url| tracing::info!(%url, "API server ready"),
            shutdown,
        )
        .await?;
        Ok(())
    })
}
