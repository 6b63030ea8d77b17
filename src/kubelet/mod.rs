//! Kubelet plugin adapter: plugin registration and the DRA gRPC services on Unix sockets.
//!
//! [`KubeletPlugin::start`] binds `<plugin-dir>/dra.sock` (DRA `v1` and `v1beta1`, answered by
//! a [`ClaimPreparer`]; device health `v1` and `v1alpha1`, streamed from a [`HealthReport`]
//! watch) and then `<registry-dir>/<driver>-reg.sock` (registration), in that
//! order: kubelet connects to the DRA socket as soon as registration succeeds. Both sockets
//! accept any `:authority` kubelet's grpc-go sends ([`authority`]), are mode 0600 in 0700
//! directories, replace stale sockets at start and are removed on shutdown.

pub mod authority;
pub mod dra;
pub mod health;
pub mod metered;
pub mod proto;
pub mod registration;
pub mod transport;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use authority::{AuthorityRewriteError, ClientStreamRewriter};

use crate::claims::ClaimPreparer;
use crate::health::HealthReport;
use dra::DraService;
use health::{HealthService, HealthStreamSettings};
use registration::{RegistrationSettings, run_registration};
use transport::{adapted_incoming, bind_private_socket, create_private_dir, remove_socket_if_ours};

/// File name of the DRA service socket inside the plugin directory.
pub const DRA_SOCKET_NAME: &str = "dra.sock";

/// Errors of the kubelet adapter; each names the path or field concerned.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// A configuration value is unusable.
    #[error("invalid kubelet plugin setting {field}: {reason}")]
    InvalidConfig {
        /// The setting (flag) at fault.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A socket directory could not be created.
    #[error("cannot create directory {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Something that is not a socket sits where a socket must go; we never delete it.
    #[error("{path} exists and is not a socket; refusing to replace it")]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// A socket path under a flag's directory does not fit in `sun_path`: checked before
    /// anything is published or registered, so the flag is named.
    #[error(
        "{flag}: socket path {path} is {len} bytes, longer than the {max} a Unix socket path \
         can hold (sun_path is 108 bytes with the NUL); choose a shorter directory"
    )]
    SocketPathTooLongForFlag {
        /// The flag whose directory holds the socket.
        flag: &'static str,
        /// The socket path.
        path: PathBuf,
        /// Its length in bytes.
        len: usize,
        /// The kernel's limit.
        max: usize,
    },
    /// The socket path does not fit in `sun_path`.
    #[error("socket path {path} is longer than {max} bytes")]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
        /// The kernel's limit.
        max: usize,
    },
    /// `lstat` of a socket path failed.
    #[error("cannot inspect {path}")]
    Stat {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A stale socket could not be removed.
    #[error("cannot remove stale socket {path}")]
    RemoveSocket {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `bind` failed.
    #[error("cannot listen on {path}")]
    Bind {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Restricting a socket to mode 0600 failed.
    #[error("cannot set mode 0600 on {path}")]
    Chmod {
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A gRPC server failed.
    #[error("gRPC server on {path} failed")]
    Serve {
        /// Its socket.
        path: PathBuf,
        /// tonic's error.
        #[source]
        source: tonic::transport::Error,
    },
    /// A gRPC server ended without being asked to.
    #[error("gRPC server on {path} stopped unexpectedly")]
    ServerStopped {
        /// Its socket.
        path: PathBuf,
    },
    /// A server task panicked or was cancelled.
    #[error("kubelet plugin task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Where and as whom the plugin registers with kubelet.
#[derive(Debug, Clone)]
pub struct KubeletPluginConfig {
    /// DRA driver name (`--driver-name`); also the registration socket's file name prefix.
    pub driver_name: String,
    /// Kubelet's plugin registry directory (`--kubelet-registry-dir`), watched by kubelet.
    pub registry_dir: PathBuf,
    /// Our plugin directory (`--kubelet-plugin-dir`), holding `dra.sock`. Must be the path as
    /// kubelet sees it: it is sent to kubelet as the endpoint.
    pub plugin_dir: PathBuf,
    /// How often to check that the registration socket still exists.
    pub socket_check_interval: Duration,
    /// Delay before registering again after kubelet reported a failure (doubles per
    /// consecutive failure, at most 60 s).
    pub reregister_delay: Duration,
    /// Deadline for one prepare/unprepare call; below kubelet's own 45 s.
    pub call_timeout: Duration,
    /// The device health report the health streams send (DESIGN §5 item 8). [`Self::new`]
    /// sets one without devices.
    pub health: watch::Receiver<HealthReport>,
    /// Pacing of the health streams: re-sent at least every 10 s, each device valid for
    /// 30 s (kubelet shows it Unknown after that).
    pub health_stream: HealthStreamSettings,
}

impl KubeletPluginConfig {
    /// Settings with the production defaults: a 1 s socket check, a 1 s initial
    /// re-registration delay, a 40 s call deadline, and health re-sent every 10 s with a
    /// 30 s timeout (of a report without devices until [`Self::with_health`]).
    pub fn new(
        driver_name: impl Into<String>,
        registry_dir: impl Into<PathBuf>,
        plugin_dir: impl Into<PathBuf>,
    ) -> Self {
        Self {
            driver_name: driver_name.into(),
            registry_dir: registry_dir.into(),
            plugin_dir: plugin_dir.into(),
            socket_check_interval: Duration::from_secs(1),
            reregister_delay: Duration::from_secs(1),
            call_timeout: Duration::from_secs(40),
            health: watch::channel(HealthReport::default()).1,
            health_stream: HealthStreamSettings::default(),
        }
    }

    /// The same settings streaming `health` to kubelet.
    #[must_use]
    pub fn with_health(mut self, health: watch::Receiver<HealthReport>) -> Self {
        self.health = health;
        self
    }

    /// `<registry-dir>/<driver>-reg.sock`.
    #[must_use]
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver_name))
    }

    /// `<plugin-dir>/dra.sock`.
    #[must_use]
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join(DRA_SOCKET_NAME)
    }

    /// Checks the settings, socket paths included: the daemon calls it before it publishes
    /// anything, so a path kubelet could not dial (or that breaks kubelet's seamless
    /// upgrade of the plugin near the limit, kubernetes #141815) stops it at once.
    pub fn validate(&self) -> Result<(), KubeletError> {
        let name = &self.driver_name;
        // A DNS subdomain (the driver name is one in ResourceSlices), which also keeps it a
        // single path component.
        let valid_label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if name.is_empty() || name.len() > 253 || !name.split('.').all(valid_label) {
            return Err(KubeletError::InvalidConfig {
                field: "driver-name",
                reason: format!("{name:?} is not a DNS subdomain (lowercase, digits, '-', '.')"),
            });
        }
        for (field, dir) in
            [("kubelet-registry-dir", &self.registry_dir), ("kubelet-plugin-dir", &self.plugin_dir)]
        {
            if !dir.is_absolute() {
                return Err(KubeletError::InvalidConfig {
                    field,
                    reason: format!("{} is not an absolute path", dir.display()),
                });
            }
        }
        // `sun_path` holds 107 bytes and the NUL; the DRA socket also serves device health.
        for (flag, path) in [
            ("--kubelet-plugin-dir", self.dra_socket()),
            ("--kubelet-registry-dir", self.registration_socket()),
        ] {
            let len = path.as_os_str().len();
            if len > transport::MAX_SOCKET_PATH {
                return Err(KubeletError::SocketPathTooLongForFlag {
                    flag,
                    path,
                    len,
                    max: transport::MAX_SOCKET_PATH,
                });
            }
        }
        for (field, value) in [
            ("socket-check-interval", self.socket_check_interval),
            ("call-timeout", self.call_timeout),
            ("health-resend-interval", self.health_stream.resend_interval),
        ] {
            if value.is_zero() {
                return Err(KubeletError::InvalidConfig {
                    field,
                    reason: "must be positive".into(),
                });
            }
        }
        // A report re-sent less often than kubelet's timeout would flap to Unknown between
        // two sends.
        if self.health_stream.check_timeout <= self.health_stream.resend_interval {
            return Err(KubeletError::InvalidConfig {
                field: "health-check-timeout",
                reason: format!(
                    "{:?} must be longer than the resend interval {:?}",
                    self.health_stream.check_timeout, self.health_stream.resend_interval
                ),
            });
        }
        Ok(())
    }
}

/// The kubelet plugin: entry point for the composition root.
#[derive(Debug)]
pub struct KubeletPlugin;

impl KubeletPlugin {
    /// Binds both sockets (DRA first, so it accepts before kubelet learns about it), then
    /// serves them in background tasks until `shutdown` resolves or [`KubeletPluginHandle::stop`]
    /// is called. Returns once both sockets exist.
    pub async fn start<P: ClaimPreparer>(
        config: KubeletPluginConfig,
        preparer: Arc<P>,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<KubeletPluginHandle, KubeletError> {
        config.validate()?;
        create_private_dir(&config.plugin_dir)?;
        create_private_dir(&config.registry_dir)?;

        let dra_socket = config.dra_socket();
        let registration_socket = config.registration_socket();
        let (dra_listener, dra_identity) = bind_private_socket(&dra_socket)?;
        tracing::info!(path = %dra_socket.display(), "DRA socket ready");

        let (stop_tx, stop_rx) = watch::channel(false);
        let external = stop_tx.clone();
        tokio::spawn(async move {
            shutdown.await;
            let _ = external.send(true);
        });

        let service = DraService::new(preparer, config.call_timeout);
        // Health streams never end by themselves: they end at stop, before the drain below.
        let health =
            HealthService::new(config.health.clone(), config.health_stream, stop_rx.clone());
        let dra_path = dra_socket.clone();
        let mut dra_stop = stop_rx.clone();
        // In-flight calls may take up to the call deadline; a client that never lets the
        // connection close (no PING ack after GOAWAY) is dropped after that.
        let drain = config.call_timeout + Duration::from_secs(5);
        let dra_task = tokio::spawn(async move {
            let (stopped_tx, stopped_rx) = tokio::sync::oneshot::channel::<()>();
            let server = tonic::transport::Server::builder()
                .add_service(service.v1_server())
                .add_service(service.v1beta1_server())
                .add_service(health.v1_server())
                .add_service(health.v1alpha1_server())
                .serve_with_incoming_shutdown(adapted_incoming(dra_listener), async {
                    let _ = stopped_rx.await;
                });
            tokio::pin!(server);
            let result = tokio::select! {
                result = &mut server => Some(result),
                _ = dra_stop.wait_for(|stop| *stop) => None,
            };
            let result = if let Some(result) = result {
                result
                    .map_err(|source| KubeletError::Serve { path: dra_path.clone(), source })
                    .and(Err(KubeletError::ServerStopped { path: dra_path.clone() }))
            } else {
                let _ = stopped_tx.send(());
                if let Ok(result) = tokio::time::timeout(drain, &mut server).await {
                    result.map_err(|source| KubeletError::Serve { path: dra_path.clone(), source })
                } else {
                    tracing::warn!(path = %dra_path.display(),
                        "DRA connections still open after {drain:?}; dropping them");
                    Ok(())
                }
            };
            remove_socket_if_ours(&dra_path, dra_identity);
            tracing::info!(path = %dra_path.display(), "DRA socket removed");
            result
        });

        // Bound here so that a bind error is returned to the caller.
        let registration_listener = match bind_private_socket(&registration_socket) {
            Ok(bound) => bound,
            Err(err) => {
                let _ = stop_tx.send(true);
                let _ = dra_task.await;
                return Err(err);
            }
        };
        let settings = RegistrationSettings {
            driver_name: config.driver_name.clone(),
            socket: registration_socket.clone(),
            dra_endpoint: dra_socket.clone(),
            socket_check_interval: config.socket_check_interval,
            reregister_delay: config.reregister_delay,
        };
        let registration_task =
            tokio::spawn(run_registration(settings, registration_listener, stop_rx));

        Ok(KubeletPluginHandle {
            registration_socket,
            dra_socket,
            stop: stop_tx,
            dra_task,
            registration_task,
        })
    }
}

/// A running kubelet plugin.
#[derive(Debug)]
pub struct KubeletPluginHandle {
    registration_socket: PathBuf,
    dra_socket: PathBuf,
    stop: watch::Sender<bool>,
    dra_task: JoinHandle<Result<(), KubeletError>>,
    registration_task: JoinHandle<Result<(), KubeletError>>,
}

impl KubeletPluginHandle {
    /// Path of the registration socket.
    #[must_use]
    pub fn registration_socket(&self) -> &Path {
        &self.registration_socket
    }

    /// Path of the DRA service socket.
    #[must_use]
    pub fn dra_socket(&self) -> &Path {
        &self.dra_socket
    }

    /// Asks both servers to stop (as the `shutdown` future would).
    pub fn stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits until both servers have stopped and their sockets are removed. If one fails, the
    /// other is stopped too and the first error is returned.
    pub async fn wait(self) -> Result<(), KubeletError> {
        let Self { stop, mut dra_task, mut registration_task, .. } = self;
        let (first, other) = tokio::select! {
            r = &mut dra_task => (r, registration_task),
            r = &mut registration_task => (r, dra_task),
        };
        let _ = stop.send(true);
        let second = other.await;
        first.map_err(KubeletError::Task)??;
        second.map_err(KubeletError::Task)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_driver_name_is_rejected_naming_the_flag() {
        for bad in ["", "Netclaim.dev", "a/b", "-x.dev", "x..dev"] {
            let config = KubeletPluginConfig::new(bad, "/r", "/p");
            let err = config.validate().unwrap_err();
            assert!(err.to_string().contains("driver-name"), "{bad}: {err}");
        }
        assert!(KubeletPluginConfig::new("netclaim.dev", "/r", "/p").validate().is_ok());
    }

    #[test]
    fn relative_directories_are_rejected() {
        let err = KubeletPluginConfig::new("netclaim.dev", "reg", "/p").validate().unwrap_err();
        assert!(err.to_string().contains("kubelet-registry-dir"), "{err}");
    }

    #[test]
    fn socket_paths_longer_than_sun_path_are_refused_naming_the_flag_and_length() {
        // `<dir>/dra.sock` at 107 bytes fits; one more byte does not.
        let fits = format!("/{}", "p".repeat(107 - "/".len() - "/dra.sock".len()));
        let config = KubeletPluginConfig::new("netclaim.dev", "/r", &fits);
        assert_eq!(config.dra_socket().as_os_str().len(), 107);
        config.validate().unwrap();
        let long = format!("{fits}p");
        let err = KubeletPluginConfig::new("netclaim.dev", "/r", &long).validate().unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("--kubelet-plugin-dir: "), "{text}");
        assert!(text.contains(" is 108 bytes") && text.contains(&long), "{text}");

        // `<dir>/<driver>-reg.sock`: the driver name counts too.
        let registry = format!("/{}", "r".repeat(100));
        let err = KubeletPluginConfig::new("netclaim.dev", &registry, "/p").validate().unwrap_err();
        let text = err.to_string();
        assert!(text.starts_with("--kubelet-registry-dir: "), "{text}");
        let len = registry.len() + "/netclaim.dev-reg.sock".len();
        assert!(text.contains(&format!(" is {len} bytes")), "{text}");
    }

    #[test]
    fn socket_paths_follow_the_kubelet_conventions() {
        let config = KubeletPluginConfig::new(
            "netclaim.dev",
            "/var/lib/kubelet/plugins_registry",
            "/var/lib/kubelet/plugins/netclaim.dev",
        );
        assert_eq!(
            config.registration_socket(),
            Path::new("/var/lib/kubelet/plugins_registry/netclaim.dev-reg.sock")
        );
        assert_eq!(
            config.dra_socket(),
            Path::new("/var/lib/kubelet/plugins/netclaim.dev/dra.sock")
        );
    }
}
