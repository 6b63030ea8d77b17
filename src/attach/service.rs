//! The attach service itself: pod records in memory and on disk, per-pod gates, attaching a
//! pod's planned interfaces into its netns (undoing them on failure), detaching them at stop,
//! remove and unprepare, and the set of host NICs currently moved into pods.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use nri_rs::PodSandbox;
use tokio::sync::watch;

use super::handler::same_sandbox;
use super::plan::{assign_slots, plan_new};
use super::shared::{AttachService, Gates, Inner, Reconciles, Sandbox, log_detach};
use super::{
    AttachFailure, AttachedDevice, AttachmentState, AttachmentStore, MAX_CONCURRENT_ATTACHES,
    NetnsPort, PodAttachment, PodClaimSource, StatusSink, lock,
};
use crate::claims::PreparedClaim;
use crate::health::MovedNic;
use crate::metrics::{Metrics, ModeLabel, NriEventLabels};
use crate::model::cause::{Cause, cause};
use crate::podnet::{PodNetns, VlanUsers, attach, detach, quiesce};
use crate::stats::{AttachedInterfaceSource, WatchedInterface};

/// How long an attach's completion waits before it runs, so that the answer goes first. The
/// pod's gate is held meanwhile: a `CreateContainer` that came sooner waits this long more.
const COMPLETION_DELAY: std::time::Duration = std::time::Duration::from_millis(1);

/// The stats service follows the attached interfaces through the service.
impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> AttachedInterfaceSource
    for Arc<AttachService<C, N, S, W>>
{
    fn changes(&self) -> watch::Receiver<u64> {
        self.interface_changes()
    }

    fn snapshot(&self) -> Vec<WatchedInterface> {
        self.attached_interfaces()
    }
}

impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> AttachService<C, N, S, W> {
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
            status: Arc::new(status),
            metrics,
            vlans: Arc::new(VlanUsers::new()),
            inner: Arc::new(Mutex::new(Inner::default())),
            gates: Arc::new(Gates::default()),
            moved: watch::Sender::new(BTreeSet::new()),
            moved_nics: watch::Sender::new(BTreeMap::new()),
            interfaces_version: Arc::new(watch::Sender::new(0)),
            synchronized: std::sync::atomic::AtomicBool::new(false),
            sweep_due: tokio::sync::Notify::new(),
            reconciles: Reconciles::default(),
            kernel_slots: tokio::sync::Semaphore::new(MAX_CONCURRENT_ATTACHES),
            detach_slots: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT_ATTACHES)),
            completing: Arc::new(watch::Sender::new(0)),
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

    /// NICs currently moved into pods with their pod netns and pod-side name, by host
    /// interface name (for device health); changes together with [`Self::moved_devices`].
    #[must_use]
    pub fn moved_nics(&self) -> watch::Receiver<BTreeMap<String, MovedNic>> {
        self.moved_nics.subscribe()
    }

    /// The record of pod `pod_uid`, if any.
    #[must_use]
    pub fn attachment(&self, pod_uid: &str) -> Option<PodAttachment> {
        lock(&self.inner).pods.get(pod_uid).cloned()
    }

    /// Changes of the attached interfaces: a counter bumped on every pod record change.
    #[must_use]
    pub fn interface_changes(&self) -> watch::Receiver<u64> {
        self.interfaces_version.subscribe()
    }

    /// Every interface attached now (records attached, with results), with the `stats`
    /// setting of its claim's config.
    #[must_use]
    pub fn attached_interfaces(&self) -> Vec<WatchedInterface> {
        let stats_off = self.claims.stats_off_devices();
        let inner = lock(&self.inner);
        inner
            .pods
            .values()
            .filter(|record| record.state == AttachmentState::Attached)
            .flat_map(|record| {
                record.devices.iter().filter(|d| d.result.is_some()).map(|d| WatchedInterface {
                    pod_uid: record.pod_uid.clone(),
                    pod_namespace: record.pod_namespace.clone(),
                    pod_name: record.pod_name.clone(),
                    netns: record.netns.clone(),
                    claim_uid: d.claim_uid.clone(),
                    claim_name: d.claim_name.clone(),
                    request: d.request.clone(),
                    pool: d.pool.clone(),
                    device: d.device.clone(),
                    share_id: d.share_id.clone(),
                    interface: d.plan.interface_name.clone(),
                    stats: !stats_off.contains(&(d.claim_uid.clone(), d.request.clone())),
                })
            })
            .collect()
    }

    /// Publishes the moved host devices and NICs, and tells the stats service the attached
    /// interfaces changed.
    pub(super) fn refresh_moved(&self) {
        self.interfaces_version.send_modify(|version| *version = version.wrapping_add(1));
        self.refresh_moved_devices();
    }

    /// Publishes the moved host devices and NICs (computed from the records' plans; each
    /// watcher is woken only when its set changed).
    fn refresh_moved_devices(&self) {
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
        let nics: BTreeMap<String, MovedNic> = lock(&self.inner)
            .pods
            .values()
            .filter(|p| p.state == AttachmentState::Attached)
            .flat_map(PodAttachment::moved_nics)
            .collect();
        self.moved_nics.send_if_modified(|current| {
            let changed = *current != nics;
            *current = nics;
            changed
        });
    }

    /// Runs `work` holding pod `uid`'s gate.
    pub(super) async fn serialised<T>(&self, uid: &str, work: impl Future<Output = T>) -> T {
        self.gates.serialised(uid, work).await
    }

    /// Writes the pod record. Inline, not on the blocking pool: the write lands in the page
    /// cache (no `fdatasync`, decision 0010), cheaper than the thread hand-off would be.
    pub(super) fn persist(&self, record: &PodAttachment) -> Result<(), Cause> {
        self.store.save_attachment(record).map_err(cause)
    }

    /// Forgets the pod record (as [`Self::persist`]).
    pub(super) fn forget(&self, pod_uid: &str) -> Result<(), Cause> {
        self.store.remove_attachment(pod_uid).map_err(cause)
    }

    /// Whether pod `uid` has an attached record in `netns` covering every device of `claims`.
    pub(super) fn covered(
        &self,
        uid: &str,
        netns: Option<&Path>,
        claims: &[PreparedClaim],
    ) -> bool {
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
    pub(super) async fn attach_pod(
        &self,
        sandbox: &Sandbox,
        claims: &[PreparedClaim],
        started: Instant,
    ) -> Result<(), AttachFailure> {
        let held = self.gates.hold(&sandbox.uid).await;
        let Some(record) = self.attach_pod_locked(sandbox, claims, started).await? else {
            return Ok(());
        };
        // The rest completes the attach after the answer, holding the pod's gate, so no
        // later event of the pod overtakes it and CreateContainer waits for it (the device
        // metadata a container may read is written here): the claim statuses and the record
        // with the results (a restart without them reads the interfaces back from the kernel:
        // `completed_attach`).
        let (driver, inner, sink, store, interfaces) = (
            self.driver.clone(),
            Arc::clone(&self.inner),
            Arc::clone(&self.status),
            self.store.clone(),
            Arc::clone(&self.interfaces_version),
        );
        let claims = claims.to_vec();
        let completing = Arc::clone(&self.completing);
        completing.send_modify(|n| *n += 1);
        tokio::spawn(async move {
            // Let the answer reach the runtime first: on a busy node this work (~0.1 ms of
            // CPU) competed with the answer for the cores (decision 0010, "Profile").
            tokio::time::sleep(COMPLETION_DELAY).await;
            for claim in &claims {
                super::status::submit_ready(&driver, &inner, &*sink, claim, &record);
            }
            if let Err(err) = store.save_attachment(&record) {
                tracing::warn!(pod = %record.pod_uid, %err, "recording the attach results (a restart reads them from the kernel)");
            }
            // The stats service snapshots every attached interface when woken: off the
            // answer's path, like the rest of the completion.
            interfaces.send_modify(|version| *version = version.wrapping_add(1));
            drop(held);
            completing.send_modify(|n| *n -= 1);
        });
        Ok(())
    }

    /// Returns once every attach answered so far has completed (claim statuses submitted,
    /// device metadata and pod records written).
    pub async fn settled(&self) {
        let mut completing = self.completing.subscribe();
        // The sender lives in `self`: the wait cannot end with it dropped.
        let _ignored = completing.wait_for(|n| *n == 0).await;
    }

    /// Attaches what `claims` need and is not attached yet; the completed record, to be
    /// written, when something was attached.
    async fn attach_pod_locked(
        &self,
        sandbox: &Sandbox,
        claims: &[PreparedClaim],
        started: Instant,
    ) -> Result<Option<PodAttachment>, AttachFailure> {
        lock(&self.inner).sandboxes.insert(sandbox.uid.clone(), sandbox.clone());
        if self.covered(&sandbox.uid, sandbox.netns.as_deref(), claims) {
            return Ok(None);
        }
        if claims.is_empty() {
            return Ok(None);
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
        let replaced_stale = stale.is_some();
        if let Some(stale) = stale {
            self.detach_record(&stale).await;
            lock(&self.inner).pods.remove(&sandbox.uid);
        }
        let existing = lock(&self.inner)
            .pods
            .get(&sandbox.uid)
            .filter(|r| r.state == AttachmentState::Attached)
            .cloned();
        let claims = &self.with_current_host_names(claims).await?;
        let slots = assign_slots(claims, existing.as_ref())?;
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
        // The plans are written before the kernel sees them: a crash mid-attach leaves a
        // record that reconcile undoes, never an interface nobody knows about. Written, not
        // synced: the page cache survives kill -9, and power loss destroys the pod netns
        // with everything in it (decision 0010).
        self.persist(&record).map_err(AttachFailure::Persist)?;
        crate::failpoint!("attach.after_record");
        lock(&self.inner).pods.insert(sandbox.uid.clone(), record.clone());
        // Before the kernel moves a NIC out of the host's view, so no publication drops it.
        // The sets follow the plans, so only a record that moves a NIC, or the removal of a
        // stale one, can change them (a child-only attach skips the walk over every pod).
        if replaced_stale || record.devices[first_new..].iter().any(AttachedDevice::moves_nic) {
            self.refresh_moved_devices();
        }

        let failure = self.execute(&ops, &mut record, first_new, started).await;
        if let Some(failure) = failure {
            record.devices.truncate(first_new);
            let saved = if record.devices.is_empty() {
                lock(&self.inner).pods.remove(&sandbox.uid);
                self.forget(&sandbox.uid)
            } else {
                lock(&self.inner).pods.insert(sandbox.uid.clone(), record.clone());
                self.persist(&record)
            };
            if let Err(err) = saved {
                tracing::warn!(pod = %sandbox.uid, %err, "recording a rolled-back attachment (reconcile retries)");
            }
            self.refresh_moved();
            return Err(failure);
        }
        crate::failpoint!("attach.before_results");
        // The moved sets are unchanged (they follow the plans, published above); the stats
        // service learns of the new interfaces from the completion, after the answer.
        lock(&self.inner).pods.insert(sandbox.uid.clone(), record.clone());
        Ok(Some(record))
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
            let settings = self.device_settings(device).await;
            let attached = match settings {
                Ok(()) => attach(ops, &self.vlans, &device.plan).await.map_err(|err| {
                    AttachFailure::Attach {
                        claim: format!("{}/{}", device.claim_namespace, device.claim_name),
                        request: device.request.clone(),
                        device: device.device.clone(),
                        source: Box::new(err),
                    }
                }),
                Err(failure) => Err(failure),
            };
            match attached {
                Ok(result) => {
                    self.metrics
                        .attach_duration
                        .get_or_create(&ModeLabel { mode: device.plan.mode.as_str() })
                        .observe(started.elapsed().as_secs_f64());
                    record.devices[index].result = Some(result);
                }
                Err(failure) => {
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

    /// `claims` with each `sriov-vf` device's host interface named as the host netns names
    /// it now (found by the VF's PCI address, DESIGN §6): after a reboot or a rename the name
    /// recorded at prepare may be another's. The pod-side name is the claim's either way.
    async fn with_current_host_names(
        &self,
        claims: &[PreparedClaim],
    ) -> Result<Vec<PreparedClaim>, AttachFailure> {
        let mut claims = claims.to_vec();
        for claim in &mut claims {
            for device in &mut claim.devices {
                if device.vf.is_none() {
                    continue;
                }
                let now = self.claims.current_host_name(&claim.uid, &device.request).await;
                match now {
                    Ok(Some(name)) if name != device.if_name => {
                        tracing::info!(claim = %claim.name, request = %device.request,
                            recorded = %device.if_name, now = %name,
                            "the VF's netdev has another name than at prepare: moved by its current one");
                        device.if_name = name;
                    }
                    Ok(_) => {}
                    Err(err) => {
                        return Err(AttachFailure::DeviceSettings {
                            claim: format!("{}/{}", claim.namespace, claim.name),
                            request: device.request.clone(),
                            device: device.device.clone(),
                            source: Box::new(err),
                        });
                    }
                }
            }
        }
        Ok(claims)
    }

    /// Puts a moved VF's settings on it before the move (DESIGN §6: they do not survive a
    /// reboot, and kubelet answers a repeated prepare from the record); only `sriov-vf`
    /// devices ask the claims.
    pub(super) async fn device_settings(
        &self,
        device: &AttachedDevice,
    ) -> Result<(), AttachFailure> {
        if device.plan.mode != crate::model::network_config::Mode::SriovVf {
            return Ok(());
        }
        self.claims.apply_device_settings(&device.claim_uid, &device.request).await.map_err(|err| {
            AttachFailure::DeviceSettings {
                claim: format!("{}/{}", device.claim_namespace, device.claim_name),
                request: device.request.clone(),
                device: device.device.clone(),
                source: Box::new(err),
            }
        })
    }

    /// Detaches every interface of `record` (never fails; failures are logged).
    pub(super) async fn detach_record(&self, record: &PodAttachment) {
        let ops = match self.netns.open_for_detach(&record.netns).await {
            Ok(ops) => ops,
            Err(err) => {
                tracing::warn!(pod = %record.pod_uid, netns = %record.netns.display(), %err,
                    "opening the pod netns for detach failed; reconcile retries");
                return;
            }
        };
        for device in record.devices.iter().rev() {
            self.detach_device(&ops, record, device).await;
        }
    }

    /// StopPodSandbox: takes the pod's interfaces down and marks its record stopped. A stop of
    /// another sandbox of the pod (an older one) leaves the record alone.
    ///
    /// Moved devices go back to the host now (before the runtime destroys the netns, which
    /// would return them under their pod-side names). Children lose their addresses now and
    /// their links in the background, holding the pod's gate: deleting a link waits for an
    /// RCU grace period (~20 ms), and a later event of the pod, or the unprepare that releases
    /// its addresses, waits for the gate, so no address is handed out while a link that had
    /// it still exists.
    pub(super) async fn stop_pod(&self, pod: &PodSandbox) {
        let uid = pod.uid.as_str();
        let held = self.gates.hold(uid).await;
        let record = lock(&self.inner).pods.get(uid).cloned();
        let Some(mut record) = record else {
            tracing::debug!(pod = %uid, "stop of a pod without interfaces");
            return;
        };
        if record.state == AttachmentState::Stopped || !same_sandbox(&record, pod) {
            return;
        }
        let ops = match self.netns.open_for_detach(&record.netns).await {
            Ok(ops) => Some(ops),
            Err(err) => {
                tracing::warn!(pod = %record.pod_uid, netns = %record.netns.display(), %err,
                    "opening the pod netns for detach failed; reconcile retries");
                None
            }
        };
        let mut children = Vec::new();
        if let Some(ops) = &ops {
            for device in record.devices.iter().rev() {
                if device.plan.creates_child() {
                    if let Err(err) = quiesce(ops, &device.plan).await {
                        tracing::warn!(pod = %uid, interface = %device.plan.interface_name, %err,
                            "removing the addresses of a stopped pod's interface (its link goes next)");
                    }
                    children.push(device.clone());
                } else {
                    self.detach_device(ops, &record, device).await;
                }
            }
        }
        record.state = AttachmentState::Stopped;
        // Set again once this stop's removal finishes (an older sandbox of the pod may have
        // left the mark).
        lock(&self.inner).links_gone.remove(uid);
        if let Err(err) = self.persist(&record) {
            tracing::warn!(pod = %uid, %err, "persisting the stopped pod (reconcile retries)");
        }
        self.submit_stopped(&record);
        lock(&self.inner).pods.insert(uid.to_owned(), record.clone());
        self.refresh_moved();
        let Some(ops) = ops else { return };
        crate::failpoint!("attach.stop.after_quiesce");
        let (vlans, metrics, inner, slots) = (
            Arc::clone(&self.vlans),
            Arc::clone(&self.metrics),
            Arc::clone(&self.inner),
            Arc::clone(&self.detach_slots),
        );
        tokio::spawn(async move {
            let _slot = slots.acquire().await;
            for device in &children {
                let started = Instant::now();
                let report = detach(&ops, &vlans, &device.plan).await;
                metrics
                    .detach_duration
                    .get_or_create(&ModeLabel { mode: device.plan.mode.as_str() })
                    .observe(started.elapsed().as_secs_f64());
                log_detach(&record, device, &report);
            }
            lock(&inner).links_gone.insert(record.pod_uid.clone());
            drop(held);
        });
    }

    /// Detaches one interface of `record` and times it.
    async fn detach_device(&self, ops: &N::Ops, record: &PodAttachment, device: &AttachedDevice) {
        let started = Instant::now();
        let report = detach(ops, &self.vlans, &device.plan).await;
        self.metrics
            .detach_duration
            .get_or_create(&ModeLabel { mode: device.plan.mode.as_str() })
            .observe(started.elapsed().as_secs_f64());
        log_detach(record, device, &report);
    }

    /// Whether `record`'s links may still exist: attached, or stopped without this process
    /// having seen the removal finish.
    pub(super) fn links_may_exist(&self, record: &PodAttachment) -> bool {
        record.state == AttachmentState::Attached
            || !lock(&self.inner).links_gone.contains(&record.pod_uid)
    }

    /// RemovePodSandbox: detaches what may still be attached and forgets the pod.
    pub(super) async fn remove_pod(&self, pod: &PodSandbox) {
        let uid = pod.uid.as_str();
        self.serialised(uid, async {
            let record = lock(&self.inner).pods.get(uid).cloned();
            if let Some(record) = record.as_ref().filter(|r| same_sandbox(r, pod)) {
                if self.links_may_exist(record) {
                    self.detach_record(record).await;
                }
                if record.state == AttachmentState::Attached {
                    self.submit_stopped(record);
                }
                if let Err(err) = self.forget(uid) {
                    tracing::warn!(pod = %uid, %err, "forgetting the pod record");
                    return;
                }
                let mut inner = lock(&self.inner);
                inner.pods.remove(uid);
                inner.links_gone.remove(uid);
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
                if self.links_may_exist(&record) {
                    let partial = PodAttachment { devices: mine, ..record.clone() };
                    self.detach_record(&partial).await;
                    tracing::info!(pod = %uid, claim = %claim_uid, "detached the interfaces of an unprepared claim");
                }
                record.devices = rest;
                let saved = if record.devices.is_empty() {
                    self.forget(&uid)
                } else {
                    self.persist(&record)
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

    pub(super) fn count(&self, event: &'static str, ok: bool) {
        let result = if ok { "success" } else { "error" };
        self.metrics.nri_events.get_or_create(&NriEventLabels { event, result }).inc();
    }
}
