//! Pod interfaces through NRI (DESIGN §5 steps 3–5, §6): attaches a pod's prepared claims
//! when its sandbox starts, refuses containers while an attachment is missing, detaches at
//! sandbox stop, reconciles the kernel and the store with the runtime's pods after a
//! restart, and reports each claim's status.
//!
//! The service reaches the world through four ports: [`PodClaims`] (the prepared claims),
//! [`NetnsAccess`] (netlink in the host and pod netns), [`AttachmentStore`] (durable pod
//! records) and [`StatusSink`] (claim status and Pod events, written off the critical path).
//! Calls for one pod are serialised; different pods run concurrently.

mod reconcile;
mod record;

#[cfg(test)]
mod tests;

pub use record::{AttachedDevice, AttachmentState, PodAttachment};

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;

use crate::claims::status::{DeviceKey, DeviceOutcome, build_entries};
use crate::claims::{
    ClaimReader, ClaimService, ClaimStore, DeviceLookup, PreparedClaim, PreparedClaimDevice,
};
use crate::k8s::claim_status::{ClaimRef as StatusClaimRef, PodRef};
use crate::kubelet::ClaimRef as KubeletClaimRef;
use crate::metrics::{Metrics, ModeLabel, NriEventLabels};
use crate::model::network_config::{Addressing, DeviceKind, ResolvedMode, Sharing};
use crate::nri::{Container, HandlerError, PluginHandler, PodSandbox};
use crate::podnet::ops::LinkState;
use crate::podnet::plan::NameError;
use crate::podnet::{
    AttachError, AttachRequest, HostDevice, InterfaceSlot, LinkOpError, LinkOps, PlanError,
    PodNetns, Side, VlanUsers, assign_interface_names, attach, detach, plan_attach,
};

/// Pods attached at the same time; more wait (each holds a netns thread and socket).
pub const MAX_CONCURRENT_ATTACHES: usize = 16;

/// Condition reason of a failed attach.
pub const REASON_ATTACH_FAILED: &str = "AttachFailed";
/// Condition reason after the pod's sandbox stopped: the interface is gone, the claim stays
/// prepared (its addresses are released at unprepare).
pub const REASON_POD_STOPPED: &str = "PodStopped";

/// Whether a prepared claim still exists in the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimPresence {
    /// The claim (same UID) is there.
    Present,
    /// Deleted, or replaced by another claim of the same name.
    Gone,
    /// The API could not tell (unreachable): keep the claim.
    Unknown,
}

/// The prepared claims, as the attach step needs them.
pub trait PodClaims: Send + Sync + 'static {
    /// Prepared claims reserved for the pod `pod_uid`, in attach order (claim name).
    fn claims_of_pod(&self, pod_uid: &str) -> Vec<PreparedClaim>;
    /// Every prepared claim.
    fn all_claims(&self) -> Vec<PreparedClaim>;
    /// Whether `claim` still exists in the API.
    fn presence(&self, claim: &PreparedClaim) -> impl Future<Output = ClaimPresence> + Send;
    /// Releases `claim` as an unprepare would (addresses freed, record forgotten).
    fn release(&self, claim: &PreparedClaim) -> impl Future<Output = Result<(), String>> + Send;
}

/// Netlink access: per-pod [`LinkOps`] and a view of the host's links.
pub trait NetnsAccess: Send + Sync + 'static {
    /// Kernel operations on the host netns and one pod netns.
    type Ops: LinkOps + Send + Sync + 'static;
    /// Ops for an attach into `path` (the netns must exist).
    fn open(&self, path: &Path) -> impl Future<Output = Result<Self::Ops, LinkOpError>> + Send;
    /// Ops for a detach from `path` (a netns that is gone is fine).
    fn open_for_detach(
        &self,
        path: &Path,
    ) -> impl Future<Output = Result<Self::Ops, LinkOpError>> + Send;
    /// Every link of the host netns.
    fn host_links(&self) -> impl Future<Output = Result<Vec<LinkState>, LinkOpError>> + Send;
    /// Ops on the host netns only (pod-side calls report the netns gone).
    fn host(&self) -> impl Future<Output = Result<Self::Ops, LinkOpError>> + Send;
}

/// Durable pod records; calls block on disk I/O (the service runs them on the blocking pool).
pub trait AttachmentStore: Clone + Send + Sync + 'static {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Every record.
    fn load_attachments(&self) -> Result<Vec<PodAttachment>, Self::Error>;
    /// Persists a record durably before returning.
    fn save_attachment(&self, attachment: &PodAttachment) -> Result<(), Self::Error>;
    /// Forgets a record; a missing one succeeds.
    fn remove_attachment(&self, pod_uid: &str) -> Result<(), Self::Error>;
}

/// Where claim statuses and Pod events go; both return at once (the writes retry in the
/// background).
pub trait StatusSink: Send + Sync + 'static {
    /// This driver's full set of `status.devices` entries of `claim`.
    fn submit(&self, claim: StatusClaimRef, entries: Vec<AllocatedDeviceStatus>);
    /// A Warning Event on the Pod.
    fn warn_pod(&self, pod: PodRef, reason: &'static str, message: String);
}

/// Why a pod's interfaces could not be attached; every variant names the claim and device,
/// and a kernel failure keeps its step and errno.
#[derive(Debug, thiserror::Error)]
pub enum AttachFailure {
    /// Two interfaces want one name.
    #[error("interface names: {0}")]
    Names(#[from] NameError),
    /// The sandbox has no network namespace (a host-network pod cannot take interfaces).
    #[error("the pod sandbox has no network namespace path")]
    NoNetns,
    /// The plan could not be made.
    #[error("claim {claim}, request {request}, device {device}: plan: {source}")]
    Plan {
        /// `namespace/name` of the claim.
        claim: String,
        /// Request name.
        request: String,
        /// Device name.
        device: String,
        /// Why.
        #[source]
        source: PlanError,
    },
    /// The host device could not be read.
    #[error("claim {claim}, device {device}: host interface {if_name}: {source}")]
    HostDevice {
        /// `namespace/name` of the claim.
        claim: String,
        /// Device name.
        device: String,
        /// Host interface.
        if_name: String,
        /// Why.
        #[source]
        source: LinkOpError,
    },
    /// The pod's netns could not be opened.
    #[error("pod netns {path}: {source}")]
    Netns {
        /// Its path.
        path: String,
        /// Why.
        #[source]
        source: LinkOpError,
    },
    /// A kernel step failed (already rolled back).
    #[error("claim {claim}, request {request}, device {device}: {source}")]
    Attach {
        /// `namespace/name` of the claim.
        claim: String,
        /// Request name.
        request: String,
        /// Device name.
        device: String,
        /// The failed step with its errno.
        #[source]
        source: Box<AttachError>,
    },
    /// The pod record could not be persisted (nothing was attached).
    #[error("persisting the pod's attachment: {0}")]
    Persist(String),
}

/// One async lock per pod UID in use, so the same pod is never worked on twice at once.
#[derive(Default)]
struct Gates(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Gates {
    async fn serialised<T>(&self, uid: &str, work: impl Future<Output = T>) -> T {
        let gate = Arc::clone(lock(&self.0).entry(uid.to_owned()).or_default());
        let result = {
            let _held = gate.lock().await;
            work.await
        };
        let mut gates = lock(&self.0);
        // Clones are only made under this mutex: two references means ours and the map's.
        if gates.get(uid).is_some_and(|g| Arc::strong_count(g) == 2) {
            gates.remove(uid);
        }
        result
    }
}

/// What the service knows of a running sandbox (from RunPodSandbox, Synchronize or
/// CreateContainer).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sandbox {
    uid: String,
    name: String,
    namespace: String,
    id: String,
    netns: Option<PathBuf>,
}

impl Sandbox {
    fn from_pod(pod: &PodSandbox) -> Self {
        Self {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            id: pod.id.clone(),
            netns: pod.netns_path.clone(),
        }
    }

    fn pod_ref(&self) -> PodRef {
        PodRef { namespace: self.namespace.clone(), name: self.name.clone(), uid: self.uid.clone() }
    }
}

#[derive(Default)]
struct Inner {
    /// Pod records by pod UID (the store's content).
    pods: HashMap<String, PodAttachment>,
    /// Sandboxes seen running, by pod UID.
    sandboxes: HashMap<String, Sandbox>,
    /// The entries last submitted per claim UID (keeps condition transition times).
    statuses: HashMap<String, Vec<AllocatedDeviceStatus>>,
}

/// The attach service: the node daemon's NRI handler.
pub struct AttachService<C, N, S, W> {
    driver: String,
    claims: C,
    netns: N,
    store: S,
    status: W,
    metrics: Arc<Metrics>,
    vlans: VlanUsers,
    inner: Arc<Mutex<Inner>>,
    gates: Arc<Gates>,
    moved: watch::Sender<BTreeSet<String>>,
    /// Set by the first `Synchronize`: only then is the set of running pods known.
    synchronized: std::sync::atomic::AtomicBool,
    /// Woken after each `Synchronize`, for the sweep of claims gone from the API.
    sweep_due: tokio::sync::Notify,
    /// Bounds the pods attached at the same time (DESIGN §6: bounded concurrency).
    kernel_slots: tokio::sync::Semaphore,
}

impl<C, N, S, W> std::fmt::Debug for AttachService<C, N, S, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachService").field("driver", &self.driver).finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps are changed only after the store accepted the change; a panic elsewhere leaves
    // consistent data behind.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn claim_label(claim: &PreparedClaim) -> String {
    format!("{}/{}", claim.namespace, claim.name)
}

/// One interface to attach: the claim and its device, with the assigned name.
struct Slot<'a> {
    claim: &'a PreparedClaim,
    device: &'a PreparedClaimDevice,
    name: String,
}

impl<C: PodClaims, N: NetnsAccess, S: AttachmentStore, W: StatusSink> AttachService<C, N, S, W> {
    /// Loads the pod records from `store` (blocking).
    ///
    /// # Errors
    /// The store's error when the records cannot be read.
    pub fn load(
        driver: &str,
        claims: C,
        netns: N,
        store: S,
        status: W,
        metrics: Arc<Metrics>,
    ) -> Result<Self, S::Error> {
        let records = store.load_attachments()?;
        let service = Self {
            driver: driver.to_owned(),
            claims,
            netns,
            store,
            status,
            metrics,
            vlans: VlanUsers::new(),
            inner: Arc::new(Mutex::new(Inner::default())),
            gates: Arc::new(Gates::default()),
            moved: watch::Sender::new(BTreeSet::new()),
            synchronized: std::sync::atomic::AtomicBool::new(false),
            sweep_due: tokio::sync::Notify::new(),
            kernel_slots: tokio::sync::Semaphore::new(MAX_CONCURRENT_ATTACHES),
        };
        {
            let mut inner = lock(&service.inner);
            for record in records {
                inner.pods.insert(record.pod_uid.clone(), record);
            }
        }
        service.refresh_moved();
        Ok(service)
    }

    /// Host interfaces currently moved into pods (for the publisher's retained devices).
    #[must_use]
    pub fn moved_devices(&self) -> watch::Receiver<BTreeSet<String>> {
        self.moved.subscribe()
    }

    /// The record of pod `pod_uid`, if any.
    #[must_use]
    pub fn attachment(&self, pod_uid: &str) -> Option<PodAttachment> {
        lock(&self.inner).pods.get(pod_uid).cloned()
    }

    fn refresh_moved(&self) {
        let moved: BTreeSet<String> = lock(&self.inner)
            .pods
            .values()
            .filter(|p| p.state == AttachmentState::Attached)
            .flat_map(PodAttachment::moved_host_devices)
            .map(str::to_owned)
            .collect();
        self.moved.send_if_modified(|current| {
            let changed = *current != moved;
            *current = moved;
            changed
        });
    }

    /// Runs `work` holding pod `uid`'s gate.
    async fn serialised<T>(&self, uid: &str, work: impl Future<Output = T>) -> T {
        self.gates.serialised(uid, work).await
    }

    async fn persist(&self, record: PodAttachment) -> Result<(), String> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.save_attachment(&record))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    async fn forget(&self, pod_uid: &str) -> Result<(), String> {
        let store = self.store.clone();
        let uid = pod_uid.to_owned();
        tokio::task::spawn_blocking(move || store.remove_attachment(&uid))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Whether pod `uid` has an attached record in `netns` covering every device of `claims`.
    fn covered(&self, uid: &str, netns: Option<&Path>, claims: &[PreparedClaim]) -> bool {
        let inner = lock(&self.inner);
        let Some(record) = inner.pods.get(uid) else {
            return claims.is_empty();
        };
        record.state == AttachmentState::Attached
            && netns.is_none_or(|path| record.netns == path)
            && claims.iter().all(|c| c.devices.iter().all(|d| record.has(&c.uid, &d.request)))
    }

    /// Attaches every prepared claim of the pod into `sandbox.netns` (holding the pod's
    /// gate). Interfaces already attached in that netns stay; a record of an older sandbox
    /// of the same pod is detached first.
    async fn attach_pod(&self, sandbox: &Sandbox, started: Instant) -> Result<(), AttachFailure> {
        self.serialised(&sandbox.uid, self.attach_pod_locked(sandbox, started)).await
    }

    async fn attach_pod_locked(
        &self,
        sandbox: &Sandbox,
        started: Instant,
    ) -> Result<(), AttachFailure> {
        lock(&self.inner).sandboxes.insert(sandbox.uid.clone(), sandbox.clone());
        let claims = self.claims.claims_of_pod(&sandbox.uid);
        if self.covered(&sandbox.uid, sandbox.netns.as_deref(), &claims) {
            return Ok(());
        }
        if claims.is_empty() {
            return Ok(());
        }
        let Some(netns) = sandbox.netns.clone() else {
            return Err(AttachFailure::NoNetns);
        };
        // A record of another sandbox of this pod (the sandbox was re-created): its netns is
        // dead or dying; give its devices back before they are planned again.
        let stale = {
            let inner = lock(&self.inner);
            inner
                .pods
                .get(&sandbox.uid)
                .filter(|r| r.state == AttachmentState::Attached && r.netns != netns)
                .cloned()
        };
        if let Some(stale) = stale {
            self.detach_record(&stale).await;
            lock(&self.inner).pods.remove(&sandbox.uid);
        }
        let existing = lock(&self.inner)
            .pods
            .get(&sandbox.uid)
            .filter(|r| r.state == AttachmentState::Attached)
            .cloned();
        let slots = assign_slots(&claims, existing.as_ref())?;
        // Each open costs an OS thread and a socket: a burst of sandboxes queues here.
        let _slot = self.kernel_slots.acquire().await;
        let ops = self
            .netns
            .open(&netns)
            .await
            .map_err(|source| AttachFailure::Netns { path: netns.display().to_string(), source })?;
        let pod = PodNetns { pod_uid: sandbox.uid.clone(), path: netns.clone() };
        let planned = plan_new(&ops, &pod, &slots, existing.as_ref()).await?;
        let mut record = existing.unwrap_or_else(|| PodAttachment {
            pod_uid: sandbox.uid.clone(),
            pod_name: sandbox.name.clone(),
            pod_namespace: sandbox.namespace.clone(),
            sandbox_id: sandbox.id.clone(),
            netns: netns.clone(),
            state: AttachmentState::Attached,
            devices: Vec::new(),
        });
        let first_new = record.devices.len();
        record.devices.extend(planned);
        // The plans are on disk before the kernel sees them: a crash mid-attach leaves a
        // record that reconcile undoes, never an interface nobody knows about.
        self.persist(record.clone()).await.map_err(AttachFailure::Persist)?;
        lock(&self.inner).pods.insert(sandbox.uid.clone(), record.clone());
        // Before the kernel moves a NIC out of the host's view, so no publication drops it.
        self.refresh_moved();

        let failure = self.execute(&ops, &mut record, first_new, started).await;
        if let Some(failure) = failure {
            record.devices.truncate(first_new);
            let saved = if record.devices.is_empty() {
                lock(&self.inner).pods.remove(&sandbox.uid);
                self.forget(&sandbox.uid).await
            } else {
                lock(&self.inner).pods.insert(sandbox.uid.clone(), record.clone());
                self.persist(record).await
            };
            if let Err(err) = saved {
                tracing::warn!(pod = %sandbox.uid, %err, "recording a rolled-back attachment (reconcile retries)");
            }
            self.refresh_moved();
            return Err(failure);
        }
        lock(&self.inner).pods.insert(sandbox.uid.clone(), record.clone());
        self.refresh_moved();
        for claim in &claims {
            self.submit_ready(claim, &record);
        }
        // The results complete the record off the critical path (a restart without them
        // attaches again). The write takes the pod's gate and stores the record as it is
        // then, so it never overwrites a newer change (a stop, an unprepare).
        let (store, inner, gates) =
            (self.store.clone(), Arc::clone(&self.inner), Arc::clone(&self.gates));
        let uid = sandbox.uid.clone();
        tokio::spawn(async move {
            gates
                .serialised(&uid.clone(), async move {
                    let Some(current) = lock(&inner).pods.get(&uid).cloned() else {
                        return;
                    };
                    let saved =
                        tokio::task::spawn_blocking(move || store.save_attachment(&current)).await;
                    if !matches!(saved, Ok(Ok(()))) {
                        tracing::warn!(pod = %uid, "persisting attach results failed (a restart attaches again)");
                    }
                })
                .await;
        });
        Ok(())
    }

    /// Executes the plans of `record.devices[first_new..]`, filling their results; on a
    /// failure undoes the ones of this attempt and returns it.
    async fn execute(
        &self,
        ops: &N::Ops,
        record: &mut PodAttachment,
        first_new: usize,
        started: Instant,
    ) -> Option<AttachFailure> {
        for index in first_new..record.devices.len() {
            let device = &record.devices[index];
            match attach(ops, &self.vlans, &device.plan).await {
                Ok(result) => {
                    self.metrics
                        .attach_duration
                        .get_or_create(&ModeLabel { mode: device.plan.mode.as_str() })
                        .observe(started.elapsed().as_secs_f64());
                    record.devices[index].result = Some(result);
                }
                Err(err) => {
                    let failure = AttachFailure::Attach {
                        claim: format!("{}/{}", device.claim_namespace, device.claim_name),
                        request: device.request.clone(),
                        device: device.device.clone(),
                        source: Box::new(err),
                    };
                    // The failed one rolled itself back; undo the others of this attempt
                    // too, so the sandbox fails cleanly and kubelet's retry starts afresh.
                    for done in record.devices[first_new..index].iter().rev() {
                        let report = detach(ops, &self.vlans, &done.plan).await;
                        log_detach(record, done, &report);
                    }
                    return Some(failure);
                }
            }
        }
        None
    }

    /// Detaches every interface of `record` (never fails; failures are logged).
    async fn detach_record(&self, record: &PodAttachment) {
        let ops = match self.netns.open_for_detach(&record.netns).await {
            Ok(ops) => ops,
            Err(err) => {
                tracing::warn!(pod = %record.pod_uid, netns = %record.netns.display(), %err,
                    "opening the pod netns for detach failed; reconcile retries");
                return;
            }
        };
        for device in record.devices.iter().rev() {
            let started = Instant::now();
            let report = detach(&ops, &self.vlans, &device.plan).await;
            self.metrics
                .detach_duration
                .get_or_create(&ModeLabel { mode: device.plan.mode.as_str() })
                .observe(started.elapsed().as_secs_f64());
            log_detach(record, device, &report);
        }
    }

    /// StopPodSandbox: detaches the pod's interfaces and marks its record stopped. A stop of
    /// another sandbox of the pod (an older one) leaves the record alone.
    async fn stop_pod(&self, pod: &PodSandbox) {
        let uid = pod.uid.as_str();
        self.serialised(uid, async {
            let record = lock(&self.inner).pods.get(uid).cloned();
            let Some(mut record) = record else {
                tracing::debug!(pod = %uid, "stop of a pod without interfaces");
                return;
            };
            if record.state == AttachmentState::Stopped || !same_sandbox(&record, pod) {
                return;
            }
            self.detach_record(&record).await;
            record.state = AttachmentState::Stopped;
            if let Err(err) = self.persist(record.clone()).await {
                tracing::warn!(pod = %uid, %err, "persisting the stopped pod (reconcile retries)");
            }
            self.submit_stopped(&record);
            lock(&self.inner).pods.insert(uid.to_owned(), record);
            self.refresh_moved();
        })
        .await;
    }

    /// RemovePodSandbox: detaches what is still attached and forgets the pod.
    async fn remove_pod(&self, pod: &PodSandbox) {
        let uid = pod.uid.as_str();
        self.serialised(uid, async {
            let record = lock(&self.inner).pods.get(uid).cloned();
            if let Some(record) = record.as_ref().filter(|r| same_sandbox(r, pod)) {
                if record.state == AttachmentState::Attached {
                    self.detach_record(record).await;
                    self.submit_stopped(record);
                }
                if let Err(err) = self.forget(uid).await {
                    tracing::warn!(pod = %uid, %err, "forgetting the pod record");
                    return;
                }
                lock(&self.inner).pods.remove(uid);
            }
            let mut inner = lock(&self.inner);
            if inner.sandboxes.get(uid).is_none_or(|s| s.id == pod.id || pod.id.is_empty()) {
                inner.sandboxes.remove(uid);
            }
            drop(inner);
            self.refresh_moved();
        })
        .await;
    }

    /// Detaches the interfaces of claim `claim_uid` from every pod (an unprepare of a claim
    /// whose pod was force-deleted without a sandbox stop).
    pub async fn detach_claim(&self, claim_uid: &str) {
        let pods: Vec<String> = lock(&self.inner)
            .pods
            .values()
            .filter(|r| r.devices.iter().any(|d| d.claim_uid == claim_uid))
            .map(|r| r.pod_uid.clone())
            .collect();
        for uid in pods {
            self.serialised(&uid, async {
                let record = lock(&self.inner).pods.get(&uid).cloned();
                let Some(mut record) = record else { return };
                let (mine, rest): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut record.devices).into_iter().partition(|d| d.claim_uid == claim_uid);
                if record.state == AttachmentState::Attached {
                    let partial = PodAttachment { devices: mine, ..record.clone() };
                    self.detach_record(&partial).await;
                    tracing::info!(pod = %uid, claim = %claim_uid, "detached the interfaces of an unprepared claim");
                }
                record.devices = rest;
                let saved = if record.devices.is_empty() {
                    self.forget(&uid).await
                } else {
                    self.persist(record.clone()).await
                };
                if let Err(err) = saved {
                    tracing::warn!(pod = %uid, %err, "persisting the pod record");
                }
                let mut inner = lock(&self.inner);
                if record.devices.is_empty() {
                    inner.pods.remove(&uid);
                } else {
                    inner.pods.insert(uid.clone(), record);
                }
                inner.statuses.remove(claim_uid);
            })
            .await;
        }
        lock(&self.inner).statuses.remove(claim_uid);
        self.refresh_moved();
    }

    fn submit(&self, claim: &AttachedClaim, outcomes: &[(DeviceKey, DeviceOutcome)]) {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let previous = lock(&self.inner).statuses.get(&claim.uid).cloned().unwrap_or_default();
        match build_entries(outcomes, &previous, claim.generation, &now) {
            Ok(entries) => {
                lock(&self.inner).statuses.insert(claim.uid.clone(), entries.clone());
                self.status.submit(
                    StatusClaimRef {
                        namespace: claim.namespace.clone(),
                        name: claim.name.clone(),
                        uid: Some(claim.uid.clone()),
                    },
                    entries,
                );
            }
            Err(err) => tracing::warn!(claim = %claim.name, %err, "building the claim status"),
        }
    }

    fn key(&self, pool: &str, device: &str, share_id: Option<&String>) -> DeviceKey {
        DeviceKey {
            driver: self.driver.clone(),
            pool: pool.to_owned(),
            device: device.to_owned(),
            share_id: share_id.cloned(),
        }
    }

    fn submit_ready(&self, claim: &PreparedClaim, record: &PodAttachment) {
        let outcomes: Vec<_> = record
            .devices
            .iter()
            .filter(|d| d.claim_uid == claim.uid)
            .map(|d| {
                let outcome = match &d.result {
                    Some(result) => DeviceOutcome::Ready(result.clone()),
                    None => DeviceOutcome::Failed {
                        reason: REASON_ATTACH_FAILED.to_owned(),
                        message: format!("{} is not attached", d.plan.interface_name),
                    },
                };
                (self.key(&d.pool, &d.device, d.share_id.as_ref()), outcome)
            })
            .collect();
        self.submit(&AttachedClaim::from_prepared(claim), &outcomes);
    }

    fn submit_failed(&self, claims: &[PreparedClaim], message: &str) {
        for claim in claims {
            let outcomes: Vec<_> = claim
                .devices
                .iter()
                .map(|d| {
                    (
                        self.key(&d.pool, &d.device, d.share_id.as_ref()),
                        DeviceOutcome::Failed {
                            reason: REASON_ATTACH_FAILED.to_owned(),
                            message: message.to_owned(),
                        },
                    )
                })
                .collect();
            self.submit(&AttachedClaim::from_prepared(claim), &outcomes);
        }
    }

    /// After a stop the interfaces are gone: `Ready=False` (reason [`REASON_POD_STOPPED`])
    /// without `networkData`, so nobody reads addresses of an interface that no longer
    /// exists. The claim stays prepared and keeps its addresses until unprepare.
    fn submit_stopped(&self, record: &PodAttachment) {
        let mut by_claim: Vec<(AttachedClaim, Vec<(DeviceKey, DeviceOutcome)>)> = Vec::new();
        for d in &record.devices {
            let outcome = DeviceOutcome::Failed {
                reason: REASON_POD_STOPPED.to_owned(),
                message: format!(
                    "the sandbox of pod {}/{} stopped; {} was removed",
                    record.pod_namespace, record.pod_name, d.plan.interface_name
                ),
            };
            let key = self.key(&d.pool, &d.device, d.share_id.as_ref());
            match by_claim.iter_mut().find(|(c, _)| c.uid == d.claim_uid) {
                Some((_, outcomes)) => outcomes.push((key, outcome)),
                None => by_claim.push((AttachedClaim::from_device(d), vec![(key, outcome)])),
            }
        }
        for (claim, outcomes) in by_claim {
            // observedGeneration: the generation seen at prepare, when the claim is still
            // prepared.
            let generation = self
                .claims
                .all_claims()
                .into_iter()
                .find(|c| c.uid == claim.uid)
                .and_then(|c| c.generation);
            self.submit(&AttachedClaim { generation, ..claim }, &outcomes);
        }
    }

    /// RunPodSandbox and CreateContainer's attach, with status and events on failure.
    async fn attach_and_report(
        &self,
        sandbox: &Sandbox,
        started: Instant,
    ) -> Result<(), HandlerError> {
        self.attach_pod(sandbox, started)
            .await
            .map_err(|err| HandlerError::new(self.report_failure(sandbox, &err)))
    }

    /// Logs a failed attach, marks the pod's claims `Ready=False` (reason
    /// [`REASON_ATTACH_FAILED`]) and records a Warning Event on the Pod; returns the message.
    fn report_failure(&self, sandbox: &Sandbox, err: &AttachFailure) -> String {
        let message = format!(
            "attaching the network interfaces of pod {}/{}: {}",
            sandbox.namespace,
            sandbox.name,
            error_chain(err)
        );
        tracing::warn!(pod = %sandbox.uid, "{message}");
        let claims = self.claims.claims_of_pod(&sandbox.uid);
        self.submit_failed(&claims, &error_chain(err));
        self.status.warn_pod(sandbox.pod_ref(), REASON_ATTACH_FAILED, message.clone());
        message
    }

    fn count(&self, event: &'static str, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.metrics.nri_events.get_or_create(&NriEventLabels { event, result }).inc();
    }
}

impl<R, D, S> PodClaims for Arc<ClaimService<R, D, S>>
where
    R: ClaimReader,
    D: DeviceLookup,
    S: ClaimStore,
{
    fn claims_of_pod(&self, pod_uid: &str) -> Vec<PreparedClaim> {
        self.prepared_for_pod(pod_uid)
    }

    fn all_claims(&self) -> Vec<PreparedClaim> {
        self.all_prepared()
    }

    async fn presence(&self, claim: &PreparedClaim) -> ClaimPresence {
        match self.exists_in_api(&claim.namespace, &claim.name, &claim.uid).await {
            Ok(true) => ClaimPresence::Present,
            Ok(false) => ClaimPresence::Gone,
            Err(err) => {
                tracing::debug!(claim = %claim.name, %err, "reading a prepared claim");
                ClaimPresence::Unknown
            }
        }
    }

    async fn release(&self, claim: &PreparedClaim) -> Result<(), String> {
        let reference = KubeletClaimRef {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        };
        self.unprepare_claim(&reference).await.map_err(|e| e.to_string())
    }
}

/// The claim identity a status write needs.
#[derive(Debug, Clone)]
struct AttachedClaim {
    uid: String,
    namespace: String,
    name: String,
    generation: Option<i64>,
}

impl AttachedClaim {
    fn from_prepared(claim: &PreparedClaim) -> Self {
        Self {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            generation: claim.generation,
        }
    }

    fn from_device(device: &AttachedDevice) -> Self {
        Self {
            uid: device.claim_uid.clone(),
            namespace: device.claim_namespace.clone(),
            name: device.claim_name.clone(),
            generation: None,
        }
    }
}

fn log_detach(
    record: &PodAttachment,
    device: &AttachedDevice,
    report: &crate::podnet::DetachReport,
) {
    for (step, outcome) in &report.steps {
        if let crate::podnet::apply::UndoOutcome::Failed(err) = outcome {
            tracing::warn!(pod = %record.pod_uid, claim = %device.claim_uid,
                interface = %device.plan.interface_name, %step, %err, "detach step failed");
        }
    }
}

/// Whether an event's sandbox is the one `record` was attached to (an event without an ID
/// is taken to be).
fn same_sandbox(record: &PodAttachment, pod: &PodSandbox) -> bool {
    pod.id.is_empty() || record.sandbox_id == pod.id
}

/// `err` with the causes its message does not already contain (the errno of a kernel
/// refusal sits at the bottom of the chain).
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

/// The pod's interfaces in attach order (claim name, then request name; DESIGN §3) with
/// their names: explicit names kept, interfaces already attached keep theirs, the others
/// get `net1`, `net2`, ….
fn assign_slots<'a>(
    claims: &'a [PreparedClaim],
    existing: Option<&PodAttachment>,
) -> Result<Vec<Slot<'a>>, NameError> {
    let mut pairs: Vec<(&PreparedClaim, &PreparedClaimDevice)> =
        claims.iter().flat_map(|c| c.devices.iter().map(move |d| (c, d))).collect();
    pairs.sort_by(|(a, x), (b, y)| {
        (&a.namespace, &a.name, &a.uid, &x.request).cmp(&(
            &b.namespace,
            &b.name,
            &b.uid,
            &y.request,
        ))
    });
    let names_in_use: Vec<Option<String>> = pairs
        .iter()
        .map(|(c, d)| {
            existing
                .and_then(|r| {
                    r.devices.iter().find(|a| a.claim_uid == c.uid && a.request == d.request)
                })
                .map(|a| a.plan.interface_name.clone())
                .or_else(|| d.config.interface.name.clone())
        })
        .collect();
    let slots: Vec<InterfaceSlot<'_>> = pairs
        .iter()
        .zip(&names_in_use)
        .map(|((c, d), name)| InterfaceSlot {
            claim_uid: &c.uid,
            request: &d.request,
            explicit_name: name.as_deref(),
        })
        .collect();
    let names = assign_interface_names(&slots)?;
    Ok(pairs
        .into_iter()
        .zip(names)
        .map(|((claim, device), name)| Slot { claim, device, name })
        .collect())
}

/// Plans the slots that `existing` does not have yet.
async fn plan_new<O: LinkOps>(
    ops: &O,
    pod: &PodNetns,
    slots: &[Slot<'_>],
    existing: Option<&PodAttachment>,
) -> Result<Vec<AttachedDevice>, AttachFailure> {
    let mut planned = Vec::new();
    for slot in
        slots.iter().filter(|s| existing.is_none_or(|r| !r.has(&s.claim.uid, &s.device.request)))
    {
        let host = host_device(ops, slot).await?;
        let pool_addresses: &[ipnetwork::IpNetwork] = match slot.device.config.addressing {
            Addressing::Pool(_) => &slot.device.addresses,
            Addressing::None | Addressing::Static(_) => &[],
        };
        let plan = plan_attach(&AttachRequest {
            claim_uid: &slot.claim.uid,
            config: &slot.device.config,
            device: &host,
            pod,
            interface_name: &slot.name,
            pool_addresses,
        })
        .map_err(|source| AttachFailure::Plan {
            claim: claim_label(slot.claim),
            request: slot.device.request.clone(),
            device: slot.device.device.clone(),
            source,
        })?;
        planned.push(AttachedDevice {
            claim_uid: slot.claim.uid.clone(),
            claim_namespace: slot.claim.namespace.clone(),
            claim_name: slot.claim.name.clone(),
            request: slot.device.request.clone(),
            pool: slot.device.pool.clone(),
            device: slot.device.device.clone(),
            share_id: slot.device.share_id.clone(),
            plan,
            result: None,
        });
    }
    Ok(planned)
}

/// The host facts of a slot's device: a moved device's MTU and MAC are read now (they are
/// restored on detach); a shared parent needs only its name.
async fn host_device<O: LinkOps>(ops: &O, slot: &Slot<'_>) -> Result<HostDevice, AttachFailure> {
    let device = slot.device;
    let sharing = device.sharing.unwrap_or(match device.config.mode {
        ResolvedMode::HostDevice | ResolvedMode::SriovVf => Sharing::Exclusive,
        ResolvedMode::Macvlan { .. } | ResolvedMode::Ipvlan { .. } => Sharing::Shared,
    });
    let kind = device.kind.unwrap_or(DeviceKind::Physical);
    if sharing != Sharing::Exclusive {
        return Ok(HostDevice {
            if_name: device.if_name.clone(),
            kind,
            sharing,
            mtu: device.host_mtu.unwrap_or(device.config.interface.mtu),
            mac: None,
        });
    }
    let failure = |source| AttachFailure::HostDevice {
        claim: claim_label(slot.claim),
        device: device.device.clone(),
        if_name: device.if_name.clone(),
        source,
    };
    let link = ops.link(Side::Host, &device.if_name).await.map_err(failure)?.ok_or_else(|| {
        failure(LinkOpError::NoSuchLink { side: Side::Host, name: device.if_name.clone() })
    })?;
    Ok(HostDevice { if_name: device.if_name.clone(), kind, sharing, mtu: link.mtu, mac: link.mac })
}

impl<C: PodClaims, N: NetnsAccess, S: AttachmentStore, W: StatusSink> PluginHandler
    for AttachService<C, N, S, W>
{
    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), HandlerError> {
        self.reconcile(&pods).await;
        self.count("Synchronize", true);
        Ok(())
    }

    async fn run_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        let started = Instant::now();
        let sandbox = Sandbox::from_pod(&pod);
        if sandbox.netns.is_none() && self.claims.claims_of_pod(&sandbox.uid).is_empty() {
            // A host-network pod without our claims: nothing to do.
            self.count("RunPodSandbox", true);
            return Ok(());
        }
        let result = self.attach_and_report(&sandbox, started).await;
        self.count("RunPodSandbox", result.is_ok());
        result
    }

    async fn stop_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        self.stop_pod(&pod).await;
        self.count("StopPodSandbox", true);
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        self.remove_pod(&pod).await;
        self.count("RemovePodSandbox", true);
        Ok(())
    }

    async fn create_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<(), HandlerError> {
        let started = Instant::now();
        let claims = self.claims.claims_of_pod(&pod.uid);
        if claims.is_empty() || self.covered(&pod.uid, None, &claims) {
            self.count("CreateContainer", true);
            return Ok(());
        }
        let mut sandbox = Sandbox::from_pod(&pod);
        if sandbox.netns.is_none() {
            let inner = lock(&self.inner);
            sandbox.netns = inner
                .sandboxes
                .get(&pod.uid)
                .and_then(|s| s.netns.clone())
                .or_else(|| inner.pods.get(&pod.uid).map(|r| r.netns.clone()));
        }
        let result = if sandbox.netns.is_some() {
            self.attach_and_report(&sandbox, started).await.map_err(|err| {
                HandlerError::new(format!("container {} refused: {err}", container.name))
            })
        } else {
            Err(HandlerError::new(format!(
                "container {} of pod {pod} refused: the pod's network interfaces are not attached \
                 and its network namespace is unknown (waiting for its sandbox)",
                container.name
            )))
        };
        self.count("CreateContainer", result.is_ok());
        result
    }
}
