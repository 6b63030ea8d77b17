//! The DRA device health services `v1.DRAResourceHealth` and `v1alpha1.DRAResourceHealth`
//! (KEP-4680): `NodeWatchResources` streams the node's [`HealthReport`] to kubelet.
//!
//! Each stream sends the full device list at once, again on every change, and again after
//! `resend_interval` without a change: kubelet shows a device as Unknown once its last report
//! is older than the device's `health_check_timeout_seconds`, so an unchanged Healthy device
//! must be re-reported within that time. Every device carries the timeout and, as
//! `last_updated_time`, the time of the send (the monitor keeps the report current, so the
//! send is when it was last known to hold). Streams end when the plugin stops, so they do not
//! hold up the server's graceful shutdown.

use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::Stream;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Request, Response, Status};

use super::proto::{v1, v1alpha1};
use crate::health::{HealthReport, HealthStatus};

/// How the streams pace their reports.
#[derive(Debug, Clone, Copy)]
pub struct HealthStreamSettings {
    /// Longest time between two reports of one stream (production: 10 s).
    pub resend_interval: Duration,
    /// `health_check_timeout_seconds` of every device (production: 30 s, kubelet's default).
    pub check_timeout: Duration,
}

impl Default for HealthStreamSettings {
    fn default() -> Self {
        Self { resend_interval: Duration::from_secs(10), check_timeout: Duration::from_secs(30) }
    }
}

/// Serves both health API versions from one report.
#[derive(Debug, Clone)]
pub struct HealthService {
    reports: watch::Receiver<HealthReport>,
    settings: HealthStreamSettings,
    stop: watch::Receiver<bool>,
}

impl HealthService {
    /// Streams `reports` paced by `settings` until `stop` turns true (or its sender is gone).
    #[must_use]
    pub fn new(
        reports: watch::Receiver<HealthReport>,
        settings: HealthStreamSettings,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self { reports, settings, stop }
    }

    /// The `v1.DRAResourceHealth` gRPC service (kubelet ≥ 1.37).
    #[must_use]
    pub fn v1_server(&self) -> v1::dra_resource_health_server::DraResourceHealthServer<Self> {
        v1::dra_resource_health_server::DraResourceHealthServer::new(self.clone())
    }

    /// The `v1alpha1.DRAResourceHealth` gRPC service (kubelet 1.34–1.36; 1.36 calls it on
    /// every DRA plugin and logs an error every 5 s when it is not served).
    #[must_use]
    pub fn v1alpha1_server(
        &self,
    ) -> v1alpha1::dra_resource_health_server::DraResourceHealthServer<Self> {
        v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(self.clone())
    }

    fn reports(&self) -> impl Stream<Item = HealthReport> + Send + 'static {
        paced_reports(self.reports.clone(), self.settings.resend_interval, self.stop.clone())
    }
}

/// The reports one stream sends: the current one at once, then the latest after each change,
/// or after `resend` without one; ends when `stop` turns true or its sender is gone. Once the
/// report channel is closed (the monitor ended: the daemon is stopping, or its task died) no
/// verdict is current any more: every device of the last report is then sent as
/// [`HealthStatus::Unknown`], at once and on every resend, rather than its last verdict
/// stamped with the time of the send. The stream itself goes on: kubelet would only open it
/// again, and keeps showing Unknown either way.
pub fn paced_reports(
    reports: watch::Receiver<HealthReport>,
    resend: Duration,
    stop: watch::Receiver<bool>,
) -> impl Stream<Item = HealthReport> + Send + 'static {
    struct Pace {
        reports: watch::Receiver<HealthReport>,
        stop: watch::Receiver<bool>,
        resend: Duration,
        next_due: Option<Instant>,
        open: bool,
    }
    let pace = Pace { reports, stop, resend, next_due: None, open: true };
    futures::stream::unfold(pace, |mut pace| async move {
        if let Some(due) = pace.next_due {
            loop {
                tokio::select! {
                    () = stopped(&mut pace.stop) => return None,
                    changed = pace.reports.changed(), if pace.open => match changed {
                        Ok(()) => break,
                        Err(_) => pace.open = false,
                    },
                    () = tokio::time::sleep_until(due) => break,
                }
            }
        } else if *pace.stop.borrow() {
            return None;
        }
        pace.next_due = Some(Instant::now() + pace.resend);
        let report = pace.reports.borrow_and_update().clone();
        // `has_changed` fails once every sender is gone; checked here too, so the first
        // report after the monitor ended is already Unknown.
        if !pace.open || pace.reports.has_changed().is_err() {
            pace.open = false;
            return Some((unmonitored(report), pace));
        }
        Some((report, pace))
    })
}

/// `report` with every device Unknown, saying that nothing watches it any more.
fn unmonitored(mut report: HealthReport) -> HealthReport {
    for device in &mut report.devices {
        device.status = HealthStatus::Unknown;
        device.message = format!(
            "the health monitor stopped: nothing watches this device (last seen: {})",
            device.message
        );
    }
    report
}

/// Resolves when `stop` turns true or its sender is gone (without holding its lock guard,
/// which would make the stream `!Send`).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ignored = stop.wait_for(|stopped| *stopped).await;
}

/// Unix seconds now (0 for a clock before 1970, which kubelet then treats as stale).
fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| i64::try_from(elapsed.as_secs()).unwrap_or(i64::MAX))
}

type ResponseStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

macro_rules! health_version {
    ($version:ident, $label:literal) => {
        #[tonic::async_trait]
        impl $version::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = ResponseStream<$version::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _request: Request<$version::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                tracing::info!(version = $label, "kubelet opened the device health stream");
                let timeout =
                    i64::try_from(self.settings.check_timeout.as_secs()).unwrap_or(i64::MAX);
                let stream = futures::StreamExt::map(self.reports(), move |report| {
                    let now = unix_now();
                    let devices = report
                        .devices
                        .into_iter()
                        .map(|device| $version::DeviceHealth {
                            device: Some($version::DeviceIdentifier {
                                pool_name: report.pool.clone(),
                                device_name: device.device,
                            }),
                            health: match device.status {
                                HealthStatus::Unknown => $version::HealthStatus::Unknown,
                                HealthStatus::Healthy => $version::HealthStatus::Healthy,
                                HealthStatus::Unhealthy => $version::HealthStatus::Unhealthy,
                            }
                            .into(),
                            last_updated_time: now,
                            health_check_timeout_seconds: timeout,
                            message: device.message,
                        })
                        .collect();
                    Ok($version::NodeWatchResourcesResponse { devices })
                });
                Ok(Response::new(Box::pin(stream)))
            }
        }
    };
}

health_version!(v1, "v1");
health_version!(v1alpha1, "v1alpha1");

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::health::DeviceHealth;

    fn report(status: HealthStatus) -> HealthReport {
        HealthReport {
            pool: "node-a".into(),
            devices: vec![DeviceHealth {
                device: "eth2".into(),
                status,
                message: "eth2 is up with carrier".into(),
            }],
        }
    }

    /// The "no change for 45 s → still Healthy", proven on tokio's paused clock
    /// (auto-advanced, no real waiting) with the production interval of 10 s: at every
    /// instant of 45 s the last report is younger than kubelet's 30 s timeout and Healthy.
    #[tokio::test(start_paused = true)]
    async fn an_unchanged_report_is_resent_every_interval_for_45_s() {
        let (_reports_tx, reports) = watch::channel(report(HealthStatus::Healthy));
        let (_stop_tx, stop) = watch::channel(false);
        let settings = HealthStreamSettings::default();
        let mut stream = Box::pin(paced_reports(reports, settings.resend_interval, stop));
        let started = Instant::now();
        let mut received = Vec::new();
        while started.elapsed() < Duration::from_secs(45) {
            let report = stream.next().await.unwrap();
            assert_eq!(report.devices[0].status, HealthStatus::Healthy);
            received.push(started.elapsed());
        }
        assert_eq!(received[0], Duration::ZERO, "the first report goes out at once");
        for pair in received.windows(2) {
            assert_eq!(
                pair[1].checked_sub(pair[0]),
                Some(settings.resend_interval),
                "{received:?}"
            );
        }
        // Kubelet's view at 45 s: the last report is 5 s old, well inside the 30 s timeout.
        assert!(received.len() >= 5, "{received:?}");
        let last_before_45 = received[received.len() - 2];
        assert!(Duration::from_secs(45).checked_sub(last_before_45) < Some(settings.check_timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_is_sent_at_once_and_restarts_the_interval() {
        let (reports_tx, reports) = watch::channel(report(HealthStatus::Healthy));
        let (_stop_tx, stop) = watch::channel(false);
        let mut stream = Box::pin(paced_reports(reports, Duration::from_secs(10), stop));
        let started = Instant::now();
        stream.next().await.unwrap();
        let sender = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            reports_tx.send(report(HealthStatus::Unhealthy)).unwrap();
            reports_tx
        });
        let changed = stream.next().await.unwrap();
        assert_eq!(changed.devices[0].status, HealthStatus::Unhealthy);
        assert_eq!(started.elapsed(), Duration::from_secs(3));
        let _reports_tx = sender.await.unwrap();
        let again = stream.next().await.unwrap();
        assert_eq!(again.devices[0].status, HealthStatus::Unhealthy);
        assert_eq!(started.elapsed(), Duration::from_secs(13));
    }

    /// Once the monitor has ended nobody checks the links any more: re-sending its last
    /// verdict stamped now would tell kubelet a device is Healthy that may have failed since.
    /// The stream goes on (kubelet would only reconnect) with every device Unknown, saying
    /// why, and ends at stop.
    #[tokio::test(start_paused = true)]
    async fn a_stopped_monitor_turns_every_device_unknown_until_stop() {
        let (reports_tx, reports) = watch::channel(report(HealthStatus::Healthy));
        let (stop_tx, stop) = watch::channel(false);
        let mut stream = Box::pin(paced_reports(reports, Duration::from_secs(10), stop));
        assert_eq!(stream.next().await.unwrap().devices[0].status, HealthStatus::Healthy);
        drop(reports_tx);
        for _ in 0..3 {
            let report = stream.next().await.unwrap();
            assert_eq!(report.pool, "node-a");
            assert_eq!(report.devices.len(), 1);
            let device = &report.devices[0];
            assert_eq!((device.device.as_str(), device.status), ("eth2", HealthStatus::Unknown));
            assert!(device.message.contains("health monitor stopped"), "{}", device.message);
        }
        stop_tx.send(true).unwrap();
        assert!(stream.next().await.is_none());
    }
}
