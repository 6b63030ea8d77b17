//! One pod's worker: brings the pod up step by step (claims, reservation, prepare, sandbox),
//! reports its status, retries with backoff, and tears down exactly what it did.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimTemplate,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource as _};
use serde_json::json;
use tokio::sync::{Semaphore, watch};

use super::cdi::{ClaimUse, PreparedClaim};
use super::dra_client::DraClient;
use super::pod_claims::{ClaimSource, object_key};
use super::pod_status::{PodProgress, Step};
use super::sandbox::{Sandbox, SandboxError};
use super::{DevKubeletConfig, RunningSandbox, Sandboxes};
use crate::model::ClaimRef;
use kube_inmemory::allocator;

/// How often a pod waiting for something outside it (allocation, the driver) looks again.
const WAIT_POLL: Duration = Duration::from_millis(200);
/// Backoff after a failed step.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// What the dispatcher wants a pod worker to do.
#[derive(Debug, Clone)]
pub(super) enum Desired {
    /// Bring this Pod (latest version) up, or tear it down if it is being deleted.
    Pod(Box<Pod>),
    /// The Pod is gone from the API: tear down.
    Gone,
    /// The kubelet stops: tear down, leave the Pod object.
    Shutdown,
}

impl Desired {
    fn is_terminal(&self) -> bool {
        match self {
            Self::Gone | Self::Shutdown => true,
            Self::Pod(pod) => pod.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// A claim of a pod, resolved.
#[derive(Debug, Clone)]
struct PodClaim {
    entry: String,
    name: String,
    uid: String,
    /// Made from a template by us: deleted with the pod.
    generated: bool,
    /// The implicit claim of the pod's extended resources (KEP-5004), with its request
    /// mappings; it has no `spec.resourceClaims` entry.
    extended: Option<super::pod_claims::ExtendedResourceRequests>,
}

impl PodClaim {
    /// How the pod's containers refer to it.
    fn usage(&self) -> ClaimUse {
        match &self.extended {
            Some(requests) => ClaimUse::Extended(requests.mappings.clone()),
            None => ClaimUse::Entry(self.entry.clone()),
        }
    }
}

/// What has been done for one pod (so a retry skips completed steps and teardown undoes
/// exactly them).
#[derive(Debug, Default)]
struct PodState {
    namespace: String,
    pod_uid: String,
    claims: Vec<PodClaim>,
    claims_recorded: bool,
    reserved: Vec<String>,
    prepared: bool,
    /// What `NodePrepareResources` answered, by claim (containers get their CDI ids).
    prepared_claims: Vec<PreparedClaim>,
    sandbox: Option<Sandbox>,
    /// `Some` once the pod is up or given up: only a deletion changes anything then.
    settled: Option<Settled>,
    attempts: u32,
    last_progress: Option<PodProgress>,
}

/// The end state of bringing a pod up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    Running,
    Failed,
}

/// Why a setup round stopped short of Running.
enum Blocked {
    /// Waiting for something outside the pod (not an error).
    Waiting(Step, String),
    /// A step failed.
    Failed(Step, String),
}

pub(super) struct Context {
    pub(super) client: Client,
    pub(super) config: DevKubeletConfig,
    pub(super) dra: DraClient,
    pub(super) limit: Semaphore,
    pub(super) recorder: Recorder,
    pub(super) sandboxes: Sandboxes,
}

/// Waits `duration`, or less if the pod must be torn down meanwhile.
async fn pause(receiver: &mut watch::Receiver<Desired>, duration: Duration) {
    let sleep = tokio::time::sleep(duration);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return,
            changed = receiver.changed() => {
                if changed.is_err() || receiver.borrow().is_terminal() {
                    return;
                }
            }
        }
    }
}

pub(super) async fn worker(context: Arc<Context>, mut receiver: watch::Receiver<Desired>) {
    let mut state = PodState::default();
    let mut backoff = BACKOFF_MIN;
    loop {
        let desired = receiver.borrow_and_update().clone();
        let pod = match desired {
            Desired::Gone | Desired::Shutdown => {
                context.teardown(&mut state).await;
                return;
            }
            Desired::Pod(pod) if pod.metadata.deletion_timestamp.is_some() => {
                context.teardown(&mut state).await;
                context.finish_deletion(&pod).await;
                return;
            }
            Desired::Pod(pod) => pod,
        };
        if state.settled.is_some() {
            // Up (or given up): only a deletion or shutdown changes anything.
            if receiver.changed().await.is_err() {
                context.teardown(&mut state).await;
                return;
            }
            continue;
        }
        let result = {
            let Ok(_permit) = context.limit.acquire().await else { return };
            context.setup(&pod, &mut state).await
        };
        match result {
            Ok(()) => {
                state.settled = Some(Settled::Running);
                context.report(&pod, &mut state, PodProgress::Running).await;
            }
            Err(Blocked::Waiting(step, message)) => {
                let progress = PodProgress::Pending { step, message, error: false };
                context.report(&pod, &mut state, progress).await;
                pause(&mut receiver, WAIT_POLL).await;
            }
            Err(Blocked::Failed(step, message)) => {
                state.attempts += 1;
                tracing::warn!(pod = %object_key(&pod.metadata), step = step.describe(), attempt = state.attempts, %message, "pod step failed");
                context.warn(&pod, step, &message).await;
                if state.attempts >= context.config.max_attempts {
                    state.settled = Some(Settled::Failed);
                    // Undo what was done; the Pod object stays Failed until it is deleted.
                    context.teardown(&mut state).await;
                    context.report(&pod, &mut state, PodProgress::Failed { step, message }).await;
                } else {
                    let progress = PodProgress::Pending { step, message, error: true };
                    context.report(&pod, &mut state, progress).await;
                    pause(&mut receiver, backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }
}

fn api_failure(step: Step, action: &str) -> impl FnOnce(kube::Error) -> Blocked {
    move |err| Blocked::Failed(step, format!("{action}: {err}"))
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

impl Context {
    fn pods(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn claims(&self, namespace: &str) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// One round of bringing `pod` up, from the first step not done yet.
    async fn setup(&self, pod: &Pod, state: &mut PodState) -> Result<(), Blocked> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        state.namespace.clone_from(&namespace);
        state.pod_uid.clone_from(&uid);
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty) {
            // The one node of the dev cluster takes every unbound pod (the scheduler's job).
            let patch = json!({"spec": {"nodeName": self.config.node_name}});
            self.pods(&namespace)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api_failure(Step::Claims, "binding the pod to the node"))?;
            return Err(Blocked::Waiting(Step::Claims, "binding the pod to the node".to_owned()));
        }
        if state.claims.is_empty() {
            state.claims = self.resolve_claims(pod).await?;
        }
        if !state.claims_recorded {
            self.record_claims(pod, state).await?;
        }
        // Allocation: the allocator writes it; we wait.
        for claim in &state.claims {
            let live = self
                .claims(&namespace)
                .get(&claim.name)
                .await
                .map_err(api_failure(Step::Allocation, &format!("reading claim {}", claim.name)))?;
            if live.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
                return Err(Blocked::Failed(
                    Step::Allocation,
                    format!("claim {namespace}/{} was replaced (UID changed)", claim.name),
                ));
            }
            if live.status.as_ref().and_then(|s| s.allocation.as_ref()).is_none() {
                return Err(Blocked::Waiting(
                    Step::Allocation,
                    format!("claim {namespace}/{} is not allocated yet", claim.name),
                ));
            }
        }
        let consumer = ResourceClaimConsumerReference {
            api_group: None,
            resource: "pods".to_owned(),
            name: name.clone(),
            uid: uid.clone(),
        };
        for claim in &state.claims {
            if state.reserved.contains(&claim.name) {
                continue;
            }
            allocator::reserve_for(&self.client, &namespace, &claim.name, &consumer)
                .await
                .map_err(|e| Blocked::Failed(Step::Reservation, e.to_string()))?;
            state.reserved.push(claim.name.clone());
        }
        if !state.prepared && !state.claims.is_empty() {
            self.prepare(&namespace, state).await?;
        }
        if state.sandbox.is_none() {
            let sandbox = match self.config.backend.run(pod).await {
                Ok(sandbox) => sandbox,
                Err(err @ SandboxError::NoPlugin(_)) => {
                    return Err(Blocked::Waiting(Step::Sandbox, err.to_string()));
                }
                Err(err) => return Err(Blocked::Failed(Step::Sandbox, err.to_string())),
            };
            self.sandboxes.lock().insert(
                uid.clone(),
                RunningSandbox {
                    pod: object_key(&pod.metadata),
                    id: sandbox.id.clone(),
                    netns_path: sandbox.netns_path.clone(),
                },
            );
            state.sandbox = Some(sandbox);
        }
        if let Some(sandbox) = state.sandbox.as_mut() {
            self.config
                .backend
                .create_containers(sandbox, pod, &state.prepared_claims)
                .await
                .map_err(|e| Blocked::Failed(Step::Containers, e.to_string()))?;
        }
        Ok(())
    }

    /// `NodePrepareResources` for the pod's claims, keeping the answer for its containers.
    async fn prepare(&self, namespace: &str, state: &mut PodState) -> Result<(), Blocked> {
        if !self.config.dra_socket.exists() {
            return Err(Blocked::Waiting(
                Step::Prepare,
                format!(
                    "the driver's DRA socket {} does not exist yet",
                    self.config.dra_socket.display()
                ),
            ));
        }
        let answers = self
            .dra
            .prepare(&claim_refs(namespace, &state.claims))
            .await
            .map_err(|e| Blocked::Failed(Step::Prepare, e.to_string()))?;
        state.prepared_claims = state
            .claims
            .iter()
            .zip(answers)
            .map(|(claim, devices)| PreparedClaim { usage: claim.usage(), devices })
            .collect();
        state.prepared = true;
        Ok(())
    }

    /// The pod's claims: named ones as they are, template ones found or created.
    async fn resolve_claims(&self, pod: &Pod) -> Result<Vec<PodClaim>, Blocked> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let entries = super::pod_claims::claim_entries(pod)
            .map_err(|e| Blocked::Failed(Step::Claims, e.to_string()))?;
        let mut resolved = Vec::new();
        for entry in entries {
            let claim = match &entry.source {
                ClaimSource::Existing(name) => {
                    match self
                        .claims(&namespace)
                        .get_opt(name)
                        .await
                        .map_err(api_failure(Step::Claims, &format!("reading claim {name}")))?
                    {
                        Some(claim) => (claim, false),
                        None => {
                            return Err(Blocked::Waiting(
                                Step::Claims,
                                format!("claim {namespace}/{name} does not exist"),
                            ));
                        }
                    }
                }
                ClaimSource::Template(template) => {
                    (self.generated_claim(pod, &entry.name, template).await?, true)
                }
            };
            let (claim, generated) = claim;
            resolved.push(PodClaim {
                entry: entry.name.clone(),
                name: claim.metadata.name.clone().unwrap_or_default(),
                uid: claim.metadata.uid.clone().unwrap_or_default(),
                generated,
                extended: None,
            });
        }
        if let Some(claim) = self.extended_resource_claim(pod).await? {
            resolved.push(claim);
        }
        Ok(resolved)
    }

    /// The implicit claim of the pod's extended resources backed by DeviceClasses (what the
    /// scheduler makes, KEP-5004): the one recorded in the Pod status or made earlier, else a
    /// new one; `None` when the pod asks for no such resource.
    async fn extended_resource_claim(&self, pod: &Pod) -> Result<Option<PodClaim>, Blocked> {
        // Extended resources are domain-qualified (`cpu` and `memory` are not): without one,
        // no DeviceClass list is needed.
        let asks_extended = pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
            .filter_map(|c| c.resources.as_ref())
            .flat_map(|r| r.limits.iter().chain(r.requests.iter()).flatten())
            .any(|(name, _)| name.contains('/'));
        if !asks_extended {
            return Ok(None);
        }
        let classes: Api<DeviceClass> = Api::all(self.client.clone());
        let classes = classes
            .list(&ListParams::default())
            .await
            .map_err(api_failure(Step::Claims, "listing DeviceClasses"))?
            .items;
        let requests = super::pod_claims::extended_resource_requests(pod, &classes)
            .map_err(|e| Blocked::Failed(Step::Claims, e.to_string()))?;
        if requests.requests.is_empty() {
            return Ok(None);
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api = self.claims(&namespace);
        let recorded = pod
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .map(|s| s.resource_claim_name.clone());
        let mut found = None;
        if let Some(name) = recorded {
            found = api
                .get_opt(&name)
                .await
                .map_err(api_failure(Step::Claims, &format!("reading claim {name}")))?;
        }
        if found.is_none() {
            let existing = api
                .list(&ListParams::default())
                .await
                .map_err(api_failure(Step::Claims, "listing claims"))?;
            found = existing
                .items
                .into_iter()
                .find(|c| super::pod_claims::is_extended_resource_claim_of(c, pod));
        }
        let claim = match found {
            Some(claim) => claim,
            None => api
                .create(
                    &PostParams::default(),
                    &super::pod_claims::implicit_extended_resource_claim(pod, &requests),
                )
                .await
                .map_err(api_failure(Step::Claims, "creating the extended-resource claim"))?,
        };
        Ok(Some(PodClaim {
            entry: String::new(),
            name: claim.metadata.name.clone().unwrap_or_default(),
            uid: claim.metadata.uid.clone().unwrap_or_default(),
            generated: true,
            extended: Some(requests),
        }))
    }

    /// The claim generated for `entry`: the one recorded in the Pod status, else one we made
    /// earlier (found by owner and annotation), else a new one from the template.
    async fn generated_claim(
        &self,
        pod: &Pod,
        entry: &str,
        template_name: &str,
    ) -> Result<ResourceClaim, Blocked> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let api = self.claims(&namespace);
        if let Some(name) = super::pod_claims::recorded_claim_name(pod, entry)
            && let Some(claim) = api
                .get_opt(&name)
                .await
                .map_err(api_failure(Step::Claims, &format!("reading claim {name}")))?
        {
            return Ok(claim);
        }
        // Only the claims generated for this pod (by label): not every claim of the namespace.
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let mine = format!("{}={uid}", super::pod_claims::GENERATED_FOR_POD_LABEL);
        let existing = api
            .list(&ListParams::default().labels(&mine))
            .await
            .map_err(api_failure(Step::Claims, "listing claims"))?;
        if let Some(claim) =
            existing.items.into_iter().find(|c| super::pod_claims::is_generated_for(c, pod, entry))
        {
            return Ok(claim);
        }
        let templates: Api<ResourceClaimTemplate> =
            Api::namespaced(self.client.clone(), &namespace);
        let Some(template) = templates.get_opt(template_name).await.map_err(api_failure(
            Step::Claims,
            &format!("reading ResourceClaimTemplate {template_name}"),
        ))?
        else {
            return Err(Blocked::Waiting(
                Step::Claims,
                format!("ResourceClaimTemplate {namespace}/{template_name} does not exist"),
            ));
        };
        let claim = super::pod_claims::claim_from_template(pod, entry, &template);
        api.create(&PostParams::default(), &claim)
            .await
            .map_err(api_failure(Step::Claims, &format!("creating the claim for entry {entry}")))
    }

    /// Records the generated claims in `status.resourceClaimStatuses`.
    async fn record_claims(&self, pod: &Pod, state: &mut PodState) -> Result<(), Blocked> {
        let mut statuses = pod.status.as_ref().and_then(|s| s.resource_claim_statuses.clone());
        for claim in state.claims.iter().filter(|c| c.generated && c.extended.is_none()) {
            statuses = Some(super::pod_claims::with_claim_status(
                statuses.as_deref(),
                &claim.entry,
                &claim.name,
            ));
        }
        let extended = state.claims.iter().find_map(|c| {
            let requests = c.extended.as_ref()?;
            Some(super::pod_claims::extended_resource_claim_status(&c.name, requests))
        });
        if statuses.is_some() || extended.is_some() {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let name = pod.metadata.name.clone().unwrap_or_default();
            let mut patch = json!({"status": {"resourceClaimStatuses": statuses}});
            if let Some(extended) = extended {
                patch["status"]["extendedResourceClaimStatus"] = json!(extended);
            }
            self.pods(&namespace)
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api_failure(Step::Claims, "recording resourceClaimStatuses"))?;
        }
        state.claims_recorded = true;
        Ok(())
    }

    /// Writes the Pod status for `progress` when it changed since the last write.
    async fn report(&self, pod: &Pod, state: &mut PodState, progress: PodProgress) {
        if state.last_progress.as_ref() == Some(&progress) {
            return;
        }
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let api = self.pods(&namespace);
        // The latest status: resourceClaimStatuses may have been written since `pod` was seen.
        let previous = match api.get_status(&name).await {
            Ok(live) => live.status,
            Err(_) => pod.status.clone(),
        };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = super::pod_status::pod_status(previous.as_ref(), &progress, &now);
        if state.claims_recorded && status.resource_claim_statuses.is_none() {
            let generated: Vec<_> =
                state.claims.iter().filter(|c| c.generated && c.extended.is_none()).collect();
            if !generated.is_empty() {
                let mut statuses = Vec::new();
                for claim in generated {
                    statuses = super::pod_claims::with_claim_status(
                        Some(&statuses),
                        &claim.entry,
                        &claim.name,
                    );
                }
                status.resource_claim_statuses = Some(statuses);
            }
        }
        let patch = json!({"status": status});
        match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => state.last_progress = Some(progress),
            Err(err) => {
                tracing::warn!(pod = %object_key(&pod.metadata), %err, "writing pod status failed");
            }
        }
    }

    /// A Warning Event on the Pod (`kubectl describe pod` shows it).
    async fn warn(&self, pod: &Pod, step: Step, message: &str) {
        let event = Event {
            type_: EventType::Warning,
            reason: step.failure_reason().to_owned(),
            note: Some(format!("{}: {message}", step.describe())),
            action: step.describe().to_owned(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &pod.object_ref(&())).await {
            tracing::debug!(%err, "recording a pod Event failed");
        }
    }

    /// Undoes what setup did, in reverse. Errors are logged: teardown always goes on, so
    /// nothing that can be released stays held.
    async fn teardown(&self, state: &mut PodState) {
        let _permit = self.limit.acquire().await;
        if let Some(sandbox) = state.sandbox.take() {
            self.remove_sandbox(&sandbox).await;
        }
        let namespace = state.namespace.clone();
        if state.prepared {
            if let Err(err) = self.dra.unprepare(&claim_refs(&namespace, &state.claims)).await {
                tracing::warn!(%err, "NodeUnprepareResources failed");
            }
            state.prepared = false;
            state.prepared_claims.clear();
        }
        for claim in std::mem::take(&mut state.reserved) {
            let uid = state.pod_uid.clone();
            match allocator::unreserve(&self.client, &namespace, &claim, &uid).await {
                Ok(_) => {}
                Err(allocator::ControllerError::Api { source, .. }) if is_not_found(&source) => {}
                Err(err) => tracing::warn!(%err, "removing the pod from reservedFor failed"),
            }
        }
        for claim in state.claims.iter().filter(|c| c.generated) {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(claim.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.claims(&namespace).delete(&claim.name, &params).await {
                Ok(_) => {}
                Err(err) if is_not_found(&err) => {}
                Err(err) => {
                    tracing::warn!(claim = %claim.name, %err, "deleting a generated claim failed");
                }
            }
        }
        state.claims.clear();
        state.claims_recorded = false;
    }

    async fn remove_sandbox(&self, sandbox: &Sandbox) {
        if let Err(err) = self.config.backend.stop_and_remove(sandbox).await {
            tracing::warn!(sandbox = %sandbox.id, %err, "removing the sandbox failed");
        }
        self.sandboxes.lock().retain(|_, s| s.id != sandbox.id);
    }

    /// Deletes a Pod whose teardown is done (grace period 0, as kubelet does when the
    /// containers are gone).
    async fn finish_deletion(&self, pod: &Pod) {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match self.pods(&namespace).delete(&name, &params).await {
            Ok(_) => {}
            Err(err) if is_not_found(&err) => {}
            Err(err) => tracing::warn!(pod = %name, %err, "deleting the torn-down pod failed"),
        }
    }
}

fn claim_refs(namespace: &str, claims: &[PodClaim]) -> Vec<ClaimRef> {
    claims
        .iter()
        .map(|c| ClaimRef {
            namespace: namespace.to_owned(),
            name: c.name.clone(),
            uid: c.uid.clone(),
        })
        .collect()
}
