//! [`StatusSink`] over the API: claim statuses go to the background [`StatusWriter`], Pod
//! Warning Events to `events.k8s.io/v1`, both off the sandbox's critical path.

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;

use crate::attach::StatusSink;
use crate::k8s::claim_status::{StatusWriter, warn_pod};
use crate::model::{ClaimRef, PodRef};

/// Claim statuses and Pod events of the node daemon.
#[derive(Clone)]
pub struct KubeStatus {
    writer: StatusWriter,
    client: kube::Client,
    driver: String,
    node: String,
}

impl KubeStatus {
    /// Writes through `writer`; events are reported by `driver` on `node`.
    #[must_use]
    pub fn new(writer: StatusWriter, client: kube::Client, driver: &str, node: &str) -> Self {
        Self { writer, client, driver: driver.to_owned(), node: node.to_owned() }
    }
}

impl std::fmt::Debug for KubeStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStatus").field("driver", &self.driver).finish_non_exhaustive()
    }
}

impl StatusSink for KubeStatus {
    fn submit(&self, claim: ClaimRef, entries: Vec<AllocatedDeviceStatus>) {
        self.writer.submit(claim, entries);
    }

    fn warn_pod(&self, pod: PodRef, reason: &'static str, message: String) {
        let (client, driver, node) = (self.client.clone(), self.driver.clone(), self.node.clone());
        tokio::spawn(async move { warn_pod(client, &driver, &node, &pod, reason, message).await });
    }
}
