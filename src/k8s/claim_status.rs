//! Writes this driver's `status.devices` entries of ResourceClaims (DESIGN §5.4): one writer
//! task per claim, latest status wins, server-side apply on `/status` retried with backoff
//! until it lands or the claim is gone; and Warning Events on Pods.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::{AllocatedDeviceStatus, ResourceClaim};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use crate::metrics::ResultLabel;
use crate::model::{ClaimRef, PodRef};

/// Pacing of the writer.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// Delay before a claim's first write. A status is submitted just before the NRI answer
    /// that starts the pod's containers; writing it a moment later lets that answer, and the
    /// runtime's next steps, go first on a busy node (the write costs CPU here and in the
    /// API server), and a quick succession of statuses of one claim is written once.
    pub settle: Duration,
    /// Delay after the first failure.
    pub initial: Duration,
    /// Largest delay between attempts.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            settle: Duration::from_millis(5),
            initial: Duration::from_millis(200),
            max: Duration::from_secs(30),
        }
    }
}

/// Status writes in flight at once, over all claims. Each claim has its own task, and after
/// a restart every attached claim's status is submitted at once: unbounded, a node with
/// 1,000 pods opened ~1,000 API connections at the same moment (kube's HTTP/1.1 client opens
/// one per concurrent request), ~1 descriptor and ~70 KiB of buffers each (issue 36). Eight
/// keep a node's writes within a few seconds on a local API server and its connections few.
pub const WRITES_IN_FLIGHT: usize = 8;

/// Claims with a writer task, and the status each one still has to write. The key's presence
/// means a task runs for that claim; its value is the newest status not yet taken by it.
type Pending = HashMap<ClaimRef, Option<Vec<AllocatedDeviceStatus>>>;

struct Inner {
    client: kube::Client,
    driver: String,
    backoff: Backoff,
    pending: Mutex<Pending>,
    writes: Option<Family<ResultLabel, Counter>>,
    /// [`WRITES_IN_FLIGHT`] permits: one is held for each API call, not across backoffs.
    in_flight: tokio::sync::Semaphore,
}

/// Applies claim statuses in the background; cheap to clone.
#[derive(Clone)]
pub struct StatusWriter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for StatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriter").field("driver", &self.inner.driver).finish_non_exhaustive()
    }
}

enum Attempt {
    Landed,
    /// 404, or 409 on a UID mismatch: the claim is gone.
    Gone,
    /// 400/422: the server will never accept these entries.
    Rejected(kube::Error),
    Failed(kube::Error),
}

impl StatusWriter {
    /// A writer applying as field manager `driver`; `writes` counts
    /// `netclaim_status_writes_total{result}` (`success`, `error`, `gone`, `rejected`).
    #[must_use]
    pub fn new(
        client: kube::Client,
        driver: &str,
        backoff: Backoff,
        writes: Option<Family<ResultLabel, Counter>>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                client,
                driver: driver.to_owned(),
                backoff,
                pending: Mutex::new(HashMap::new()),
                writes,
                in_flight: tokio::sync::Semaphore::new(WRITES_IN_FLIGHT),
            }),
        }
    }

    /// Queues `entries`, this driver's full set for `claim` (an entry left out is removed by
    /// the apply), and returns at once. A status not yet written is replaced: only the latest
    /// is kept. Must be called inside a tokio runtime.
    pub fn submit(&self, claim: ClaimRef, entries: Vec<AllocatedDeviceStatus>) {
        let mut pending = self.inner.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = pending.get_mut(&claim) {
            *slot = Some(entries);
            return;
        }
        pending.insert(claim.clone(), Some(entries));
        drop(pending);
        tokio::spawn(run_claim(self.inner.clone(), claim));
    }

    /// Claims with a write still under way or queued.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.inner.pending.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

impl Inner {
    /// Takes the newest queued status of `claim`; when there is none, ends the claim's task
    /// (removing it under the same lock, so a concurrent submit starts a new one).
    fn take(&self, claim: &ClaimRef, finish_if_empty: bool) -> Option<Vec<AllocatedDeviceStatus>> {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let next = pending.get_mut(claim).and_then(Option::take);
        if next.is_none() && finish_if_empty {
            pending.remove(claim);
        }
        next
    }

    fn forget(&self, claim: &ClaimRef) {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(claim);
    }

    fn count(&self, result: &'static str) {
        if let Some(writes) = &self.writes {
            writes.get_or_create(&ResultLabel { result }).inc();
        }
    }

    async fn apply(&self, claim: &ClaimRef, entries: &[AllocatedDeviceStatus]) -> Attempt {
        // Never closed: the semaphore lives as long as `self`.
        let _permit = self.in_flight.acquire().await.ok();
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
        // With the UID in the body the apply fails (409) if the claim was replaced by another
        // one of the same name, instead of writing this status into the new claim.
        let metadata = serde_json::json!({
            "name": claim.name, "namespace": claim.namespace, "uid": claim.uid,
        });
        let body = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": metadata,
            "status": {"devices": entries},
        });
        let params = PatchParams::apply(&self.driver).force();
        match api.patch_status(&claim.name, &params, &Patch::Apply(body)).await {
            Ok(_) => Attempt::Landed,
            Err(kube::Error::Api(status)) if status.code == 404 => Attempt::Gone,
            Err(kube::Error::Api(status)) if status.code == 409 => Attempt::Gone,
            Err(err) => match &err {
                kube::Error::Api(status) if matches!(status.code, 400 | 422) => {
                    Attempt::Rejected(err)
                }
                _ => Attempt::Failed(err),
            },
        }
    }
}

/// The writer task of one claim: writes the newest status until none is left.
async fn run_claim(inner: Arc<Inner>, claim: ClaimRef) {
    tokio::time::sleep(inner.backoff.settle).await;
    while let Some(mut entries) = inner.take(&claim, true) {
        let mut delay = inner.backoff.initial;
        loop {
            match inner.apply(&claim, &entries).await {
                Attempt::Landed => {
                    inner.count("success");
                    break;
                }
                Attempt::Gone => {
                    inner.count("gone");
                    tracing::debug!(claim = %claim.name, namespace = %claim.namespace, "claim gone, status dropped");
                    inner.forget(&claim);
                    return;
                }
                Attempt::Rejected(err) => {
                    inner.count("rejected");
                    tracing::warn!(%err, claim = %claim.name, namespace = %claim.namespace, "claim status rejected by the API server");
                    break;
                }
                Attempt::Failed(err) => {
                    inner.count("error");
                    tracing::debug!(%err, claim = %claim.name, retry_in = ?delay, "claim status write failed");
                }
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(inner.backoff.max);
            // A newer status replaces the one being retried.
            if let Some(newer) = inner.take(&claim, false) {
                entries = newer;
            }
        }
    }
}

/// Publishes a Warning Event (events.k8s.io/v1) on a Pod, where `kubectl describe pod` shows
/// it; reported by `driver` on `node`. A failure is logged, never fatal.
pub async fn warn_pod(
    client: kube::Client,
    driver: &str,
    node: &str,
    pod: &PodRef,
    reason: &str,
    message: String,
) {
    let reporter = Reporter { controller: driver.to_owned(), instance: Some(node.to_owned()) };
    let recorder = Recorder::new(client, reporter);
    let reference = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        namespace: Some(pod.namespace.clone()),
        name: Some(pod.name.clone()),
        uid: Some(pod.uid.clone()),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: reason.to_owned(),
        note: Some(message),
        action: "AttachNetwork".to_owned(),
        secondary: None,
    };
    if let Err(err) = recorder.publish(&event, &reference).await {
        tracing::warn!(%err, reason, pod = %pod.name, "could not record an Event on the Pod");
    }
}
