//! `netclaim controller` inside the dev cluster: one replica without leader election (there
//! is one process) on the cluster's runtime, so PodNetworks get their conditions and
//! DeviceClass as in a real cluster. Started after the CRDs are installed, stopped after
//! the pods are gone (a PodNetwork's finalizer waits for IPBlocks the nodes release).

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::controller::{self, ControllerConfig, ControllerError};
use crate::k8s::ApiClients;

/// The running controller.
pub struct InProcessController {
    stop: watch::Sender<bool>,
    task: JoinHandle<Result<(), ControllerError>>,
}

impl InProcessController {
    /// Starts the controller for `driver_name` on the current runtime.
    #[must_use]
    pub fn start(client: &kube::Client, driver_name: &str) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let clients = ApiClients { unary: client.clone(), watch: client.clone() };
        let task = tokio::spawn(controller::run(
            clients,
            ControllerConfig::new(driver_name),
            async move {
                let _ignored = stopped.wait_for(|stop| *stop).await;
            },
        ));
        Self { stop, task }
    }

    /// Stops it and waits; an error it ended with is logged.
    pub async fn stop(self) {
        let _ignored = self.stop.send(true);
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "the PodNetwork controller stopped with an error"),
            Err(err) => tracing::warn!(%err, "the PodNetwork controller task failed"),
        }
    }
}
