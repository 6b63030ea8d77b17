//! Kubelet plugin registration: the `pluginregistration.Registration` service and the loop
//! that keeps `<registry-dir>/<driver>-reg.sock` present until shutdown.
//!
//! Kubelet's plugin watcher registers a plugin when its socket appears and deregisters it when
//! the socket disappears, so the socket's presence *is* the registration. The loop recreates it
//! when it is deleted (checked with one `lstat` per interval) and when kubelet reports a failed
//! registration (after a back-off), which makes kubelet try again from `GetInfo`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{Notify, watch};
use tonic::{Request, Response, Status};

use super::KubeletError;
use super::proto::pluginregistration::{
    self, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::transport::{
    SocketIdentity, adapted_incoming, bind_private_socket, remove_socket_if_ours, socket_gone,
};

/// `PluginInfo.type` of DRA drivers.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// DRA services we serve, in our order of preference (kubelet ≥ 1.34 takes the first
/// `DRAPlugin` entry it supports; 1.32/1.33 only know v1beta1), then the device health
/// services (DESIGN §1): kubelet 1.37+ opens the health stream only when one is advertised
/// and prefers v1; 1.34–1.36 call v1alpha1.
pub const SUPPORTED_DRA_SERVICES: [&str; 4] =
    ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"];
/// How long a registration server may take to finish in-flight calls when it is replaced or
/// stopped; kubelet closes its registration connection after each attempt.
const SERVER_DRAIN: Duration = Duration::from_secs(5);
/// Upper bound of the re-registration back-off.
const MAX_REREGISTER_DELAY: Duration = Duration::from_mins(1);

/// State shared between the gRPC handler and the loop that owns the socket.
#[derive(Debug, Default)]
struct RegistrationEvents {
    /// Woken when kubelet reports a failed registration.
    rejected: Notify,
    /// Failed registrations since the last success (drives the back-off).
    consecutive_failures: AtomicU32,
}

/// The `pluginregistration.Registration` service of one driver.
#[derive(Debug, Clone)]
struct RegistrationService {
    info: PluginInfo,
    events: Arc<RegistrationEvents>,
}

#[tonic::async_trait]
impl pluginregistration::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<InfoRequest>,
    ) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(driver = %self.info.name, "kubelet called GetInfo");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            self.events.consecutive_failures.store(0, Ordering::Relaxed);
            tracing::info!(driver = %self.info.name, endpoint = %self.info.endpoint,
                "kubelet registered the driver");
        } else {
            self.events.consecutive_failures.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(driver = %self.info.name, error = %status.error,
                "kubelet rejected the registration; registering again");
            self.events.rejected.notify_one();
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// What ended one incarnation of the registration socket.
#[derive(Debug)]
enum Restart {
    Shutdown,
    Rejected,
    SocketGone,
}

/// Settings of the registration loop.
#[derive(Debug, Clone)]
pub(crate) struct RegistrationSettings {
    pub(crate) driver_name: String,
    pub(crate) socket: PathBuf,
    pub(crate) dra_endpoint: PathBuf,
    pub(crate) socket_check_interval: Duration,
    pub(crate) reregister_delay: Duration,
}

/// Serves registration on `first` (already bound at `settings.socket`) and its successors
/// until `shutdown` turns true, then removes the socket.
pub(crate) async fn run_registration(
    settings: RegistrationSettings,
    first: (UnixListener, SocketIdentity),
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), KubeletError> {
    let events = Arc::new(RegistrationEvents::default());
    let service = RegistrationService {
        info: PluginInfo {
            r#type: DRA_PLUGIN_TYPE.to_owned(),
            name: settings.driver_name.clone(),
            endpoint: settings.dra_endpoint.to_string_lossy().into_owned(),
            supported_versions: SUPPORTED_DRA_SERVICES.map(str::to_owned).to_vec(),
        },
        events: Arc::clone(&events),
    };
    let mut first = Some(first);
    loop {
        let (listener, identity) = match first.take() {
            Some(bound) => bound,
            None => bind_private_socket(&settings.socket)?,
        };
        tracing::info!(path = %settings.socket.display(), "registration socket ready");
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(pluginregistration::registration_server::RegistrationServer::new(
                service.clone(),
            ))
            .serve_with_incoming_shutdown(adapted_incoming(listener), async {
                let _ = stop_rx.await;
            });
        tokio::pin!(server);
        let restart = tokio::select! {
            result = &mut server => {
                remove_socket_if_ours(&settings.socket, identity);
                return Err(match result {
                    Ok(()) => KubeletError::ServerStopped { path: settings.socket.clone() },
                    Err(source) => KubeletError::Serve { path: settings.socket.clone(), source },
                });
            }
            _ = shutdown.wait_for(|stop| *stop) => Restart::Shutdown,
            () = events.rejected.notified() => Restart::Rejected,
            () = socket_gone(settings.socket.clone(), identity, settings.socket_check_interval) =>
                Restart::SocketGone,
        };
        let _ = stop_tx.send(());
        if tokio::time::timeout(SERVER_DRAIN, &mut server).await.is_err() {
            tracing::warn!(path = %settings.socket.display(),
                "registration connections still open after {SERVER_DRAIN:?}; dropping them");
        }
        remove_socket_if_ours(&settings.socket, identity);
        match restart {
            Restart::Shutdown => {
                tracing::info!(path = %settings.socket.display(), "registration socket removed");
                return Ok(());
            }
            Restart::SocketGone => {
                tracing::warn!(path = %settings.socket.display(),
                    "registration socket was deleted or replaced; recreating it");
            }
            Restart::Rejected => {
                let failures = events.consecutive_failures.load(Ordering::Relaxed);
                let delay = reregister_delay(settings.reregister_delay, failures);
                tracing::info!(?delay, failures, "registering again after a rejection");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait_for(|stop| *stop) => return Ok(()),
                }
            }
        }
    }
}

/// Back-off after `failures` consecutive rejections: `base`, doubled per further failure,
/// at most [`MAX_REREGISTER_DELAY`].
fn reregister_delay(base: Duration, failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    base.saturating_mul(1 << doublings).min(MAX_REREGISTER_DELAY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reregister_delay_doubles_and_is_capped() {
        let base = Duration::from_millis(500);
        assert_eq!(reregister_delay(base, 1), base);
        assert_eq!(reregister_delay(base, 3), Duration::from_secs(2));
        assert_eq!(reregister_delay(base, 40), MAX_REREGISTER_DELAY);
    }
}
