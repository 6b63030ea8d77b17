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
/// An entry lives while anyone holds or waits on its gate: each holder and waiter is counted
/// under the map's mutex and uncounted under it when it leaves, however it leaves (a
/// `CreateContainer` wait that times out drops its wait), and the last one out removes the
/// entry. (An `Arc` count read under the mutex would not do: a waiter's clone is dropped
/// outside it, after the holder may have looked.)
#[derive(Default)]
pub(super) struct Gates(Mutex<HashMap<String, Gate>>);

/// One pod's gate and how many hold or wait on it.
struct Gate {
    lock: Arc<tokio::sync::Mutex<()>>,
    users: usize,
}

/// Pod `uid`'s gate, held until dropped (it can move into a background task).
pub(super) struct HeldGate {
    // Fields drop in order: the lock is released before the user is uncounted, so a newcomer
    // never finds the entry gone while the old gate is still held.
    _guard: tokio::sync::OwnedMutexGuard<()>,
    _user: GateUser,
}

/// One holder or waiter of pod `uid`'s gate, counted in its entry while it lives.
struct GateUser {
    uid: String,
    gates: Arc<Gates>,
}

impl Drop for GateUser {
    fn drop(&mut self) {
        let mut gates = lock(&self.gates.0);
        if let Some(gate) = gates.get_mut(&self.uid) {
            gate.users = gate.users.saturating_sub(1);
            if gate.users == 0 {
                gates.remove(&self.uid);
            }
        }
    }
}

impl Gates {
    /// Waits for pod `uid`'s gate (first come, first served) and holds it. Dropping the wait
    /// (a timeout) leaves no trace.
    pub(super) async fn hold(self: &Arc<Self>, uid: &str) -> HeldGate {
        let (gate, user) = {
            let mut gates = lock(&self.0);
            let gate = gates
                .entry(uid.to_owned())
                .or_insert_with(|| Gate { lock: Arc::new(tokio::sync::Mutex::new(())), users: 0 });
            gate.users += 1;
            (Arc::clone(&gate.lock), GateUser { uid: uid.to_owned(), gates: Arc::clone(self) })
        };
        let guard = gate.lock_owned().await;
        HeldGate { _guard: guard, _user: user }
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
    /// Bandwidth ceilings: the kernel port, the node's support, what the gate put in place.
    pub(super) ceilings: super::bandwidth::CeilingState,
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn entries(gates: &Gates) -> usize {
        lock(&gates.0).len()
    }

    /// A `CreateContainer` whose wait for the gate ends (its deadline, DESIGN §6) after the
    /// holder left: the holder found the waiter still there and kept the entry, so the
    /// waiter's end must remove it, or one entry per such pod stays for the daemon's
    /// lifetime. On a multi-threaded runtime the wait's deadline can pass between the
    /// holder's release and the waiter's next poll; here the wait is dropped in that gap.
    #[tokio::test]
    async fn a_wait_that_ends_after_the_holder_left_leaves_no_entry() {
        let gates = Arc::new(Gates::default());
        let held = gates.hold("pod-a").await;
        let mut wait = Box::pin(gates.hold("pod-a"));
        assert!(futures::poll!(&mut wait).is_pending(), "the gate is held");
        drop(held);
        assert_eq!(entries(&gates), 1, "the waiter is still there");
        drop(wait);
        assert_eq!(entries(&gates), 0);
    }

    /// A wait that times out while the holder still holds: the holder's leaving removes the
    /// entry.
    #[tokio::test(start_paused = true)]
    async fn a_wait_that_times_out_before_the_holder_left_leaves_no_entry() {
        let gates = Arc::new(Gates::default());
        let held = gates.hold("pod-a").await;
        let waited = tokio::time::timeout(Duration::from_secs(1), gates.hold("pod-a")).await;
        assert!(waited.is_err(), "the gate is held");
        assert_eq!(entries(&gates), 1, "the holder's entry stays while it holds");
        drop(held);
        assert_eq!(entries(&gates), 0);
    }

    /// An entry stays while anyone still waits on it, so a later waiter queues behind the
    /// holder instead of getting a fresh gate of its own.
    #[tokio::test(start_paused = true)]
    async fn an_entry_stays_while_someone_waits_on_it() {
        let gates = Arc::new(Gates::default());
        let held = gates.hold("pod").await;
        let patient = {
            let gates = Arc::clone(&gates);
            tokio::spawn(async move {
                let _held = gates.hold("pod").await;
            })
        };
        tokio::task::yield_now().await;
        assert!(tokio::time::timeout(Duration::from_secs(1), gates.hold("pod")).await.is_err());
        assert_eq!(entries(&gates), 1);
        // Still one gate: a third comer waits too.
        assert!(tokio::time::timeout(Duration::from_secs(1), gates.hold("pod")).await.is_err());
        drop(held);
        patient.await.unwrap();
        assert_eq!(entries(&gates), 0);
    }
}
