//! Controller: watches ResourceClaims, slices and classes through the API and writes
//! `status.allocation` of unallocated claims for the dev node (the scheduler's DRA role).
//!
//! Every change triggers a full re-list and recomputation: used devices and consumed
//! capacity come from the claims that exist *now*, so a deleted claim's devices and capacity
//! are free on the next pass without bookkeeping. Writes carry the claim's
//! `resourceVersion`, so a claim is never allocated twice (a concurrent writer gets 409 and
//! recomputes). Cross-claim exclusivity assumes one allocator per cluster, like the one
//! scheduler it stands in for.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus, ResourceSlice,
};
use kube::api::{ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource as _};

use super::allocate::{AllocationInput, allocate};

/// How often pending claims are retried even without a watch event (an event can be lost
/// across a watch restart; this bounds how long a claim waits).
const RETRY_INTERVAL: Duration = Duration::from_secs(2);
/// `reportingController` of our Events, and the reason of a failed allocation (the
/// scheduler reports `FailedScheduling` on the Pod; we report on the claim itself).
const REPORTER: &str = "netclaim-dev-allocator";
const REASON_FAILED: &str = "FailedAllocation";
/// How many times [`reserve_for`] retries after a write conflict.
const CONFLICT_RETRIES: usize = 8;

/// The controller could not talk to the API, or a claim is not in the required state.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// An API call failed.
    #[error("{action}: {source}")]
    Api {
        /// What we were doing (`list resourceclaims`, `write status of default/c1`).
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// `reservedFor` needs an allocated claim.
    #[error("claim {claim} is not allocated yet")]
    NotAllocated {
        /// `namespace/name`.
        claim: String,
    },
    /// The claim kept changing under us.
    #[error("claim {claim}: {attempts} write conflicts in a row")]
    Conflict {
        /// `namespace/name`.
        claim: String,
        /// Attempts made.
        attempts: usize,
    },
}

/// Why each pending claim (`namespace/name`) is not allocated, as last computed.
pub type PendingReasons = Arc<Mutex<BTreeMap<String, String>>>;

/// The allocation controller for one node.
#[derive(Clone)]
pub struct AllocatorController {
    client: Client,
    node: String,
    reasons: PendingReasons,
    recorder: Recorder,
}

/// Outcome of one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassSummary {
    /// Claims allocated in this pass.
    pub allocated: usize,
    /// Claims still unallocated (no fit, or a write conflict).
    pub pending: usize,
}

fn claim_key(claim: &ResourceClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

fn is_allocated(claim: &ResourceClaim) -> bool {
    claim.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ControllerError {
    let action = action.into();
    move |source| ControllerError::Api { action, source }
}

fn is_conflict(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409)
}

impl AllocatorController {
    /// A controller allocating for `node`.
    #[must_use]
    pub fn new(client: Client, node: &str) -> Self {
        let reporter =
            Reporter { controller: REPORTER.to_owned(), instance: Some(node.to_owned()) };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node: node.to_owned(),
            reasons: PendingReasons::default(),
        }
    }

    /// Live view of why pending claims are not allocated (for logs, tests and status).
    #[must_use]
    pub fn pending_reasons(&self) -> PendingReasons {
        self.reasons.clone()
    }

    /// One pass: lists slices, classes and claims, allocates every unallocated claim
    /// (oldest first) that fits and writes its status.
    pub async fn reconcile(&self) -> Result<PassSummary, ControllerError> {
        let lp = ListParams::default();
        let claims_api: Api<ResourceClaim> = Api::all(self.client.clone());
        let mut claims =
            claims_api.list(&lp).await.map_err(api_error("list resourceclaims"))?.items;
        let slices = Api::<ResourceSlice>::all(self.client.clone())
            .list(&lp)
            .await
            .map_err(api_error("list resourceslices"))?
            .items;
        let classes = Api::<DeviceClass>::all(self.client.clone())
            .list(&lp)
            .await
            .map_err(api_error("list deviceclasses"))?
            .items;
        let mut pending: Vec<ResourceClaim> = claims
            .iter()
            .filter(|c| !is_allocated(c) && c.metadata.deletion_timestamp.is_none())
            .cloned()
            .collect();
        pending.sort_by(|a, b| {
            (a.metadata.creation_timestamp.as_ref().map(|t| t.0), claim_key(a))
                .cmp(&(b.metadata.creation_timestamp.as_ref().map(|t| t.0), claim_key(b)))
        });
        let mut summary = PassSummary::default();
        let mut reasons = BTreeMap::new();
        for claim in pending {
            let key = claim_key(&claim);
            let input = AllocationInput {
                node: &self.node,
                slices: &slices,
                classes: &classes,
                claims: &claims,
            };
            let allocation =
                match allocate(&input, &claim, &mut || uuid::Uuid::new_v4().to_string()) {
                    Ok(allocation) => allocation,
                    Err(error) => {
                        let reason = error.to_string();
                        let previous = self.reasons.lock().ok().and_then(|r| r.get(&key).cloned());
                        if previous.as_deref() != Some(reason.as_str()) {
                            tracing::warn!(claim = %key, %reason, "claim cannot be allocated");
                            self.record_failure(&claim, &reason).await;
                        }
                        reasons.insert(key, reason);
                        summary.pending += 1;
                        continue;
                    }
                };
            let mut updated = claim.clone();
            updated.status.get_or_insert_with(ResourceClaimStatus::default).allocation =
                Some(allocation);
            let namespace = claim.metadata.namespace.clone().unwrap_or_default();
            let name = claim.metadata.name.clone().unwrap_or_default();
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &namespace);
            // `updated` carries the resourceVersion we computed from: a claim changed (or
            // allocated by someone else) since the list gets 409 instead of a second allocation.
            match api.replace_status(&name, &PostParams::default(), &updated).await {
                Ok(written) => {
                    tracing::info!(claim = %key, devices = ?device_names(&written), "claim allocated");
                    if let Some(slot) =
                        claims.iter_mut().find(|c| c.metadata.uid == written.metadata.uid)
                    {
                        *slot = written;
                    }
                    summary.allocated += 1;
                }
                Err(error) if is_conflict(&error) => {
                    tracing::debug!(claim = %key, "claim changed while allocating; retrying next pass");
                    reasons.insert(key, "write conflict; retrying".to_owned());
                    summary.pending += 1;
                }
                Err(error) => {
                    tracing::warn!(claim = %key, %error, "writing the allocation failed");
                    reasons.insert(key, format!("writing the allocation failed: {error}"));
                    summary.pending += 1;
                }
            }
        }
        if let Ok(mut shared) = self.reasons.lock() {
            *shared = reasons;
        }
        Ok(summary)
    }

    /// A Warning Event on the claim (`kubectl describe resourceclaim` shows it); failures to
    /// record are logged, never fatal.
    async fn record_failure(&self, claim: &ResourceClaim, reason: &str) {
        let event = Event {
            type_: EventType::Warning,
            reason: REASON_FAILED.to_owned(),
            note: Some(reason.to_owned()),
            action: "Allocate".to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &claim.object_ref(&())).await {
            tracing::warn!(%error, "could not record an Event on the claim");
        }
    }

    /// Runs until `shutdown` completes: a pass on start, after every change to claims,
    /// slices or classes, and every 2 s while claims are pending.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ControllerError> {
        let config = watcher::Config::default();
        let changes = futures::stream::select_all([
            watcher(Api::<ResourceClaim>::all(self.client.clone()), config.clone())
                .default_backoff()
                .map(|_| ())
                .boxed(),
            watcher(Api::<ResourceSlice>::all(self.client.clone()), config.clone())
                .default_backoff()
                .map(|_| ())
                .boxed(),
            watcher(Api::<DeviceClass>::all(self.client.clone()), config)
                .default_backoff()
                .map(|_| ())
                .boxed(),
        ]);
        tokio::pin!(changes);
        tokio::pin!(shutdown);
        let mut pending = 0;
        loop {
            match self.reconcile().await {
                Ok(summary) => pending = summary.pending,
                Err(error) => tracing::warn!(%error, "allocation pass failed; retrying"),
            }
            let retry = tokio::time::sleep(RETRY_INTERVAL);
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                next = changes.next() => {
                    if next.is_none() {
                        return Ok(());
                    }
                    // Coalesce a burst (e.g. 15 claims created at once) into one pass.
                    while let Some(Some(())) = changes.next().now_or_never() {}
                }
                () = retry, if pending > 0 => {}
            }
        }
    }
}

fn device_names(claim: &ResourceClaim) -> Vec<String> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .into_iter()
        .flatten()
        .map(|r| r.device.clone())
        .collect()
}

/// Runs the allocator for `node_name` until `shutdown` completes (for `netclaim dev`). The
/// returned future owns everything it needs, so it can be spawned.
pub fn run<F>(
    client: Client,
    node_name: &str,
    shutdown: F,
) -> impl Future<Output = Result<(), ControllerError>> + Send + use<F>
where
    F: Future<Output = ()> + Send,
{
    AllocatorController::new(client, node_name).run(shutdown)
}

/// Adds `consumer` to the claim's `status.reservedFor` (idempotent: the list is keyed by
/// `uid`), retrying on write conflicts. The claim must be allocated.
pub async fn reserve_for(
    client: &Client,
    namespace: &str,
    name: &str,
    consumer: &ResourceClaimConsumerReference,
) -> Result<ResourceClaim, ControllerError> {
    update_reserved(client, namespace, name, |reserved| {
        if reserved.iter().any(|r| r.uid == consumer.uid) {
            return false;
        }
        reserved.push(consumer.clone());
        true
    })
    .await
}

/// Removes the consumer with `uid` from `status.reservedFor`, retrying on conflicts.
pub async fn unreserve(
    client: &Client,
    namespace: &str,
    name: &str,
    uid: &str,
) -> Result<ResourceClaim, ControllerError> {
    update_reserved(client, namespace, name, |reserved| {
        let before = reserved.len();
        reserved.retain(|r| r.uid != uid);
        reserved.len() != before
    })
    .await
}

async fn update_reserved(
    client: &Client,
    namespace: &str,
    name: &str,
    mut change: impl FnMut(&mut Vec<ResourceClaimConsumerReference>) -> bool,
) -> Result<ResourceClaim, ControllerError> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), namespace);
    let key = format!("{namespace}/{name}");
    for _ in 0..CONFLICT_RETRIES {
        let mut claim =
            api.get(name).await.map_err(api_error(format!("get resourceclaim {key}")))?;
        if !is_allocated(&claim) {
            return Err(ControllerError::NotAllocated { claim: key });
        }
        let status = claim.status.get_or_insert_with(ResourceClaimStatus::default);
        let mut reserved = status.reserved_for.take().unwrap_or_default();
        let changed = change(&mut reserved);
        status.reserved_for = if reserved.is_empty() { None } else { Some(reserved) };
        if !changed {
            return Ok(claim);
        }
        match api.replace_status(name, &PostParams::default(), &claim).await {
            Ok(written) => return Ok(written),
            Err(error) if is_conflict(&error) => {}
            Err(error) => return Err(api_error(format!("write status of {key}"))(error)),
        }
    }
    Err(ControllerError::Conflict { claim: key, attempts: CONFLICT_RETRIES })
}
