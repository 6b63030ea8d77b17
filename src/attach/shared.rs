//! The attach service's state, shared by the files that implement it: the service itself
//! ([`AttachService`], its fields), the pod records in memory ([`Inner`]), the per-pod gates
//! ([`Gates`]) and the reconcile a `Synchronize` asked for ([`Reconciles`]). `service`,
//! `status`, `reconcile` and `handler` each add their methods in their own file and import
//! the state from here, not from each other.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;
use nri_rs::PodSandbox;
use tokio::sync::{Notify, watch};

use super::{AttachedDevice, PodAttachment, lock};
use crate::health::MovedNic;
use crate::metrics::Metrics;
use crate::model::PodRef;
use crate::podnet::VlanUsers;

/// What the service knows of a running sandbox (from RunPodSandbox, Synchronize or
/// CreateContainer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sandbox {
    pub(super) uid: String,
    pub(super) name: String,
    pub(super) namespace: String,
    pub(super) id: String,
    pub(super) netns: Option<PathBuf>,
}

impl Sandbox {
    pub(super) fn from_pod(pod: &PodSandbox) -> Self {
        Self {
            uid: pod.uid.clone(),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            id: pod.id.clone(),
            netns: pod.netns_path.clone(),
        }
    }

    pub(super) fn pod_ref(&self) -> PodRef {
        PodRef { namespace: self.namespace.clone(), name: self.name.clone(), uid: self.uid.clone() }
    }
}

/// One async lock per pod UID in use, so the same pod is never worked on twice at once.
#[derive(Default)]
pub(super) struct Gates(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

/// Pod `uid`'s gate, held until dropped (it can move into a background task).
pub(super) struct HeldGate {
    uid: String,
    gates: Arc<Gates>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for HeldGate {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut gates = lock(&self.gates.0);
        // Clones are only made under this mutex: one reference left means only the map's.
        if gates.get(&self.uid).is_some_and(|g| Arc::strong_count(g) == 1) {
            gates.remove(&self.uid);
        }
    }
}

impl Gates {
    /// Waits for pod `uid`'s gate (first come, first served) and holds it.
    pub(super) async fn hold(self: &Arc<Self>, uid: &str) -> HeldGate {
        let gate = Arc::clone(lock(&self.0).entry(uid.to_owned()).or_default());
        let guard = gate.lock_owned().await;
        HeldGate { uid: uid.to_owned(), gates: Arc::clone(self), guard: Some(guard) }
    }

    pub(super) async fn serialised<T>(
        self: &Arc<Self>,
        uid: &str,
        work: impl Future<Output = T>,
    ) -> T {
        let _held = self.hold(uid).await;
        work.await
    }
}

/// What the service keeps in memory behind one mutex.
#[derive(Default)]
pub(super) struct Inner {
    /// Pod records by pod UID (the store's content).
    pub(super) pods: HashMap<String, PodAttachment>,
    /// Sandboxes seen running, by pod UID.
    pub(super) sandboxes: HashMap<String, Sandbox>,
    /// The entries last submitted per claim UID (keeps condition transition times).
    pub(super) statuses: HashMap<String, Vec<AllocatedDeviceStatus>>,
    /// Stopped pods whose interfaces this process saw removed; a stopped record not in here
    /// (the removal was still running when the daemon died) is detached again before its
    /// claim's addresses can be released.
    pub(super) links_gone: BTreeSet<String>,
}

/// The attach service: the node daemon's NRI handler.
pub struct AttachService<C, N, S, W> {
    pub(super) driver: String,
    pub(super) claims: C,
    pub(super) netns: N,
    pub(super) store: S,
    pub(super) status: Arc<W>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) vlans: Arc<VlanUsers>,
    pub(super) inner: Arc<Mutex<Inner>>,
    pub(super) gates: Arc<Gates>,
    pub(super) moved: watch::Sender<BTreeSet<String>>,
    /// The same NICs with their pod netns and pod-side name (device health watches them).
    pub(super) moved_nics: watch::Sender<BTreeMap<String, MovedNic>>,
    /// Bumped whenever a pod record changes (cheap on the sandbox path); the stats service
    /// then takes [`Self::attached_interfaces`] off that path.
    pub(super) interfaces_version: Arc<watch::Sender<u64>>,
    /// Set by the first `Synchronize`: only then is the set of running pods known.
    pub(super) synchronized: std::sync::atomic::AtomicBool,
    /// Woken after each `Synchronize`, for the sweep of claims gone from the API.
    pub(super) sweep_due: tokio::sync::Notify,
    /// The reconcile a `Synchronize` asked for, and the pods waiting for it.
    pub(super) reconciles: Reconciles,
    /// Bounds the pods attached at the same time (DESIGN §6: bounded concurrency).
    pub(super) kernel_slots: tokio::sync::Semaphore,
    /// Bounds the pods whose links are being removed in the background at the same time.
    pub(super) detach_slots: Arc<tokio::sync::Semaphore>,
    /// Attach completions (statuses, device metadata, the record's results) still running
    /// after their sandbox was answered.
    pub(super) completing: Arc<watch::Sender<usize>>,
}

impl<C, N, S, W> std::fmt::Debug for AttachService<C, N, S, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttachService").field("driver", &self.driver).finish_non_exhaustive()
    }
}

/// The reconcile a `Synchronize` asked for, and the pods whose `CreateContainer` waits for it.
#[derive(Debug)]
pub(super) struct Reconciles {
    /// The runtime's pods of the last `Synchronize` not yet taken by the reconcile loop.
    pub(super) pending: Mutex<Option<Vec<PodSandbox>>>,
    /// Wakes the reconcile loop.
    pub(super) due: Notify,
    /// Pods listed by a `Synchronize` whose interfaces are not verified yet.
    pub(super) unverified: Mutex<HashSet<String>>,
    /// Sent whenever pods leave `unverified`.
    pub(super) progress: watch::Sender<()>,
}

impl Default for Reconciles {
    fn default() -> Self {
        Self {
            pending: Mutex::default(),
            due: Notify::new(),
            unverified: Mutex::default(),
            progress: watch::Sender::new(()),
        }
    }
}

impl Reconciles {
    /// Takes `uids` out of the unverified pods and wakes the `CreateContainer`s waiting.
    pub(super) fn verified(&self, uids: impl IntoIterator<Item = impl AsRef<str>>) {
        let mut unverified = lock(&self.unverified);
        let before = unverified.len();
        for uid in uids {
            unverified.remove(uid.as_ref());
        }
        if unverified.len() != before {
            drop(unverified);
            self.progress.send_replace(());
        }
    }
}

/// Logs the failed steps of one interface's detach (a detach never fails as a whole).
pub(super) fn log_detach(
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
