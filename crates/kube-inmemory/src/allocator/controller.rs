//! Controller: watches ResourceClaims, slices and classes through the API and writes
//! `status.allocation` of unallocated claims (the scheduler's DRA role). For one node
//! ([`AllocatorController::new`]) every pending claim is allocated on it. For a set of nodes
//! ([`AllocatorController::for_nodes`]) it also places pods: a pod without `spec.nodeName` is
//! bound to a node whose devices can satisfy its claims, the least loaded first
//! ([`super::schedule`]), and a claim is allocated on the node of the bound pod that uses
//! it (a claim no bound pod uses waits, as with the scheduler).
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
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus,
    ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource as _};

use super::allocate::{AllocationInput, Usage, allocate_with_usage};
use super::report::SchedulingReporter;
use super::schedule::{self, NodeCandidate, PlacementError, SchedulingInput};

/// How often pending claims are retried even without a watch event (an event can be lost
/// across a watch restart; this bounds how long a claim waits).
const RETRY_INTERVAL: Duration = Duration::from_secs(2);
/// `reportingController` of our Events, and the reason of a failed allocation of a claim
/// whose pod is already bound (pods no node fits get kube-scheduler's `FailedScheduling`,
/// see [`super::report`]).
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

/// Why each pending claim (`namespace/name`) is not allocated, or each pod not placed, as
/// last computed.
pub type PendingReasons = Arc<Mutex<BTreeMap<String, String>>>;

/// Which nodes the controller allocates for.
#[derive(Debug, Clone)]
enum Nodes {
    /// Every pending claim is for this node; pods are bound by someone else.
    One(String),
    /// Pods are placed on these nodes; claims follow their pods.
    Set(Vec<String>),
}

/// The allocation controller.
#[derive(Clone)]
pub struct AllocatorController {
    client: Client,
    nodes: Nodes,
    reasons: PendingReasons,
    unscheduled: PendingReasons,
    recorder: Recorder,
    reporter: Arc<SchedulingReporter>,
}

/// Outcome of one pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PassSummary {
    /// Claims allocated in this pass.
    pub allocated: usize,
    /// Claims still unallocated (no fit, no bound consumer yet, or a write conflict).
    pub pending: usize,
    /// Pods bound to a node in this pass.
    pub scheduled: usize,
    /// Pods still without a node.
    pub unscheduled: usize,
}

/// What one pass read from the API.
struct World {
    claims: Vec<ResourceClaim>,
    slices: Vec<ResourceSlice>,
    classes: Vec<DeviceClass>,
    /// Only listed for a set of nodes.
    pods: Vec<Pod>,
    templates: Vec<ResourceClaimTemplate>,
    candidates: Vec<NodeCandidate>,
}

impl World {
    /// A hash of what kube-scheduler watches to retry an unschedulable pod (DeviceClasses,
    /// ResourceSlices, ResourceClaims and whether they are allocated, templates, Nodes):
    /// a changed signature makes a failed attempt count as a new one in the Event series.
    fn signature(&self) -> u64 {
        use std::hash::{DefaultHasher, Hash as _, Hasher as _};
        let mut hasher = DefaultHasher::new();
        let meta = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            (m.uid.clone(), m.resource_version.clone())
        };
        self.classes.iter().map(|c| meta(&c.metadata)).for_each(|k| k.hash(&mut hasher));
        self.slices.iter().map(|s| meta(&s.metadata)).for_each(|k| k.hash(&mut hasher));
        self.templates.iter().map(|t| meta(&t.metadata)).for_each(|k| k.hash(&mut hasher));
        for claim in &self.claims {
            (claim.metadata.uid.as_deref(), is_allocated(claim)).hash(&mut hasher);
        }
        for node in &self.candidates {
            (&node.name, &node.labels).hash(&mut hasher);
        }
        hasher.finish()
    }
}

fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
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
    /// A controller allocating every pending claim on `node` (pods are bound by someone
    /// else: in a one-node cluster the dev kubelet takes every pod).
    #[must_use]
    pub fn new(client: Client, node: &str) -> Self {
        Self::with_nodes(client, Nodes::One(node.to_owned()), node)
    }

    /// A controller placing pods without `spec.nodeName` on `nodes` and allocating each
    /// claim on the node of the pod that uses it.
    #[must_use]
    pub fn for_nodes(client: Client, nodes: &[String]) -> Self {
        Self::with_nodes(client, Nodes::Set(nodes.to_vec()), &nodes.join(","))
    }

    fn with_nodes(client: Client, nodes: Nodes, instance: &str) -> Self {
        let reporter =
            Reporter { controller: REPORTER.to_owned(), instance: Some(instance.to_owned()) };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            reporter: Arc::new(SchedulingReporter::new(client.clone(), REPORTER, instance)),
            client,
            nodes,
            reasons: PendingReasons::default(),
            unscheduled: PendingReasons::default(),
        }
    }

    /// Live view of why pending claims are not allocated (for logs, tests and status).
    #[must_use]
    pub fn pending_reasons(&self) -> PendingReasons {
        self.reasons.clone()
    }

    /// Live view of why pods (`namespace/name`) are not placed on a node (a set of nodes
    /// only).
    #[must_use]
    pub fn unscheduled_reasons(&self) -> PendingReasons {
        self.unscheduled.clone()
    }

    async fn list_world(&self) -> Result<World, ControllerError> {
        let lp = ListParams::default();
        let claims = Api::<ResourceClaim>::all(self.client.clone())
            .list(&lp)
            .await
            .map_err(api_error("list resourceclaims"))?
            .items;
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
        let mut world = World {
            claims,
            slices,
            classes,
            pods: Vec::new(),
            templates: Vec::new(),
            candidates: Vec::new(),
        };
        if let Nodes::Set(names) = &self.nodes {
            world.pods = Api::<Pod>::all(self.client.clone())
                .list(&lp)
                .await
                .map_err(api_error("list pods"))?
                .items;
            world.templates = Api::<ResourceClaimTemplate>::all(self.client.clone())
                .list(&lp)
                .await
                .map_err(api_error("list resourceclaimtemplates"))?
                .items;
            let objects = Api::<Node>::all(self.client.clone())
                .list(&lp)
                .await
                .map_err(api_error("list nodes"))?
                .items;
            world.candidates = names
                .iter()
                .map(|name| NodeCandidate {
                    name: name.clone(),
                    labels: objects
                        .iter()
                        .find(|n| n.metadata.name.as_deref() == Some(name.as_str()))
                        .and_then(|n| n.metadata.labels.clone())
                        .unwrap_or_default(),
                })
                .collect();
        }
        Ok(world)
    }

    /// The node a pending claim is allocated for, or why it waits.
    fn target_node(&self, claim: &ResourceClaim, pods: &[Pod]) -> Result<String, String> {
        match &self.nodes {
            Nodes::One(node) => Ok(node.clone()),
            Nodes::Set(names) => match schedule::consumer_node(claim, pods) {
                Some(node) if names.iter().any(|n| n == node) => Ok(node.to_owned()),
                Some(node) => Err(format!(
                    "its pod is bound to node {node}, which this allocator does not serve"
                )),
                None => Err("no pod that uses it is bound to a node yet".to_owned()),
            },
        }
    }

    /// One pass: lists what it needs, allocates every unallocated claim (oldest first) that
    /// fits and writes its status; for a set of nodes, then places unbound pods.
    pub async fn reconcile(&self) -> Result<PassSummary, ControllerError> {
        let mut world = self.list_world().await?;
        let mut summary = self.allocate_claims(&mut world).await;
        if matches!(self.nodes, Nodes::Set(_)) {
            let (scheduled, unscheduled) = self.schedule_pods(&world).await;
            summary.scheduled = scheduled;
            summary.unscheduled = unscheduled;
        }
        Ok(summary)
    }

    async fn allocate_claims(&self, world: &mut World) -> PassSummary {
        let mut pending: Vec<ResourceClaim> = world
            .claims
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
        // Pending claims hold nothing: one usage for the pass, each written allocation added.
        let mut usage = Usage::from_claims(&world.claims, None);
        for claim in pending {
            let key = claim_key(&claim);
            let node = match self.target_node(&claim, &world.pods) {
                Ok(node) => node,
                Err(why) => {
                    reasons.insert(key, why);
                    summary.pending += 1;
                    continue;
                }
            };
            let input = AllocationInput {
                node: &node,
                slices: &world.slices,
                classes: &world.classes,
                claims: &world.claims,
            };
            let allocation = match allocate_with_usage(&input, &claim, usage.clone(), &mut || {
                uuid::Uuid::new_v4().to_string()
            }) {
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
                    usage.add_claim(&written);
                    if let Some(slot) =
                        world.claims.iter_mut().find(|c| c.metadata.uid == written.metadata.uid)
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
        summary
    }

    /// Binds every unbound pod (oldest first) that fits a node; returns (bound, still
    /// unbound). Tentative allocations of pods placed earlier in the pass, and of template
    /// claims bound pods have not created yet, hold their devices.
    async fn schedule_pods(&self, world: &World) -> (usize, usize) {
        let mut unbound: Vec<&Pod> =
            world.pods.iter().filter(|p| schedule::is_unbound(p)).collect();
        if unbound.is_empty() {
            if let Ok(mut shared) = self.unscheduled.lock() {
                shared.clear();
            }
            self.reporter.retain(|_| false);
            return (0, 0);
        }
        let signature = world.signature();
        unbound.sort_by(|a, b| {
            (a.metadata.creation_timestamp.as_ref().map(|t| t.0), pod_key(a))
                .cmp(&(b.metadata.creation_timestamp.as_ref().map(|t| t.0), pod_key(b)))
        });
        let mut pods = world.pods.clone();
        let mut new_share_id = || uuid::Uuid::new_v4().to_string();
        let assumed = {
            let input = SchedulingInput {
                nodes: &world.candidates,
                slices: &world.slices,
                classes: &world.classes,
                claims: &world.claims,
                templates: &world.templates,
                pods: &pods,
            };
            schedule::assumed_claims(&input, &mut new_share_id)
        };
        let mut usage = Usage::from_claims(&world.claims, None);
        for claim in &assumed {
            usage.add_claim(claim);
        }
        let (mut bound, mut waiting) = (0, 0);
        let mut reasons = BTreeMap::new();
        for pod in unbound {
            let key = pod_key(pod);
            let input = SchedulingInput {
                nodes: &world.candidates,
                slices: &world.slices,
                classes: &world.classes,
                claims: &world.claims,
                templates: &world.templates,
                pods: &pods,
            };
            let placement = match schedule::place_with_usage(&input, pod, &usage, &mut new_share_id)
            {
                Ok(placement) => placement,
                Err(error) => {
                    let reason = error.to_string();
                    let previous = self.unscheduled.lock().ok().and_then(|r| r.get(&key).cloned());
                    // A claim or template that does not exist yet: kube-scheduler's
                    // PreEnqueue holds the pod back without an attempt, so no Event.
                    if !matches!(error, PlacementError::Waiting(_)) {
                        if previous.as_deref() != Some(reason.as_str()) {
                            tracing::warn!(pod = %key, %reason, "pod cannot be placed");
                        }
                        self.reporter.unschedulable(pod, &reason, signature).await;
                    }
                    reasons.insert(key, reason);
                    waiting += 1;
                    continue;
                }
            };
            match self.bind(pod, &placement.node).await {
                Ok(()) => {
                    tracing::info!(pod = %key, node = %placement.node, "pod placed");
                    self.reporter.scheduled(pod).await;
                    if let Some(slot) = pods.iter_mut().find(|p| p.metadata.uid == pod.metadata.uid)
                    {
                        slot.spec.get_or_insert_with(Default::default).node_name =
                            Some(placement.node.clone());
                    }
                    for claim in &placement.assumed {
                        usage.add_claim(claim);
                    }
                    bound += 1;
                }
                Err(error) => {
                    if !matches!(&error, ControllerError::Api { source, .. } if is_conflict(source))
                    {
                        tracing::warn!(pod = %key, %error, "binding the pod failed");
                    }
                    reasons.insert(key, format!("binding failed: {error}"));
                    waiting += 1;
                }
            }
        }
        let failing: Vec<&str> = world
            .pods
            .iter()
            .filter(|p| reasons.contains_key(&pod_key(p)))
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.reporter.retain(|uid| failing.contains(&uid));
        if let Ok(mut shared) = self.unscheduled.lock() {
            *shared = reasons;
        }
        (bound, waiting)
    }

    /// Sets `spec.nodeName` (the scheduler's binding), guarded by the resourceVersion the
    /// placement was computed from.
    async fn bind(&self, pod: &Pod, node: &str) -> Result<(), ControllerError> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": pod.metadata.resource_version},
            "spec": {"nodeName": node},
        });
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(api_error(format!("bind pod {namespace}/{name} to {node}")))?;
        Ok(())
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
    /// slices or classes (and pods, templates and Nodes for a set of nodes), and every 2 s
    /// while claims or pods are pending.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ControllerError> {
        let config = watcher::Config::default();
        let mut streams = vec![
            watcher(Api::<ResourceClaim>::all(self.client.clone()), config.clone())
                .default_backoff()
                .map(|_| ())
                .boxed(),
            watcher(Api::<ResourceSlice>::all(self.client.clone()), config.clone())
                .default_backoff()
                .map(|_| ())
                .boxed(),
            watcher(Api::<DeviceClass>::all(self.client.clone()), config.clone())
                .default_backoff()
                .map(|_| ())
                .boxed(),
        ];
        if matches!(self.nodes, Nodes::Set(_)) {
            streams.extend([
                watcher(Api::<Pod>::all(self.client.clone()), config.clone())
                    .default_backoff()
                    .map(|_| ())
                    .boxed(),
                watcher(Api::<ResourceClaimTemplate>::all(self.client.clone()), config.clone())
                    .default_backoff()
                    .map(|_| ())
                    .boxed(),
                watcher(Api::<Node>::all(self.client.clone()), config)
                    .default_backoff()
                    .map(|_| ())
                    .boxed(),
            ]);
        }
        let changes = futures::stream::select_all(streams);
        tokio::pin!(changes);
        tokio::pin!(shutdown);
        let mut pending = 0;
        loop {
            match self.reconcile().await {
                Ok(summary) => pending = summary.pending + summary.unscheduled,
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

/// Runs the allocator for a cluster of several nodes (see [`AllocatorController::for_nodes`])
/// until `shutdown` completes; the returned future can be spawned.
pub fn run_for_nodes<F>(
    client: Client,
    nodes: &[String],
    shutdown: F,
) -> impl Future<Output = Result<(), ControllerError>> + Send + use<F>
where
    F: Future<Output = ()> + Send,
{
    AllocatorController::for_nodes(client, nodes).run(shutdown)
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
