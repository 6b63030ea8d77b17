//! Restart reconcile (DESIGN §6): brings the pod records, the kernel and the prepared claims
//! in line with the pods the runtime reports in `Synchronize`, and, at start, gives devices
//! that came back from destroyed pod namespaces their host name and MTU again.
//!
//! `Synchronize` is answered at once: the runtime drops a plugin that takes longer than its
//! request timeout (2 s in containerd), and a serial reconcile grows with the pod count
//! (dranet #310). The work runs in the background ([`AttachService::reconcile_loop`]), pods
//! concurrently under their gates, with one host link dump per pass; until a listed pod is
//! done, its `CreateContainer` waits (bounded by the call's deadline), so no container starts
//! without the interfaces its pod had.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use nri_rs::PodSandbox;

use super::shared::{AttachService, Sandbox, log_detach};
use super::{
    AttachFailure, AttachedDevice, AttachmentState, AttachmentStore, ClaimPresence, NetnsPort,
    PodAttachment, PodClaimSource, StatusSink, lock,
};
use crate::model::network_config::Sharing;
use crate::podnet::apply::completed_attach;
use crate::podnet::plan::{Step, VlanOwner, parse_device_alias, vlan_owner};
use crate::podnet::ports::{LinkState, NetnsRefusal};
use crate::podnet::{LinkOpError, LinkPort, Side, attach, detach};

/// Pods reconciled at the same time (each holds a netns thread and socket).
const MAX_CONCURRENT_RECONCILES: usize = 8;

/// What reconcile does with one pod record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RecordAction {
    /// The pod runs in the recorded netns: check its interfaces.
    Verify,
    /// The pod is gone (or runs in another sandbox): detach and forget the record.
    Detach,
    /// Stopped and gone: detach again (idempotent) and forget the record.
    Forget,
    /// Stopped, and the runtime still lists the pod: wait for RemovePodSandbox (after making
    /// sure the stop's link removal finished).
    Keep,
}

/// Decides what to do with `record` given the running pods (by UID). Pure.
pub(super) fn record_action(
    record: &PodAttachment,
    running: &HashMap<&str, &PodSandbox>,
) -> RecordAction {
    let pod = running.get(record.pod_uid.as_str());
    match (record.state, pod) {
        (AttachmentState::Attached, Some(pod))
            if pod.netns_path.as_deref().is_none_or(|p| p == record.netns) =>
        {
            RecordAction::Verify
        }
        (AttachmentState::Attached, _) => RecordAction::Detach,
        (AttachmentState::Stopped, None) => RecordAction::Forget,
        (AttachmentState::Stopped, Some(_)) => RecordAction::Keep,
    }
}

impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> AttachService<C, N, S, W> {
    /// Start-up work before any NRI event: counts the VLAN sub-interface users of attached
    /// pods and restores devices that came back to the host from destroyed pod netns.
    pub async fn start(&self) {
        let links = match self.netns.host_links().await {
            Ok(links) => links,
            Err(err) => {
                tracing::warn!(%err, "listing host links at start");
                return;
            }
        };
        let records: Vec<PodAttachment> = lock(&self.inner)
            .pods
            .values()
            .filter(|r| r.state == AttachmentState::Attached)
            .cloned()
            .collect();
        for record in &records {
            for device in &record.devices {
                self.adopt_vlans(device, &links).await;
            }
        }
        self.remove_unused_vlans(&links).await;
        self.restore_returned(&links).await;
    }

    /// Deletes our VLAN sub-interfaces that no stored pod uses (a crash between a pod's last
    /// detach and the deletion left them). Runs before any NRI event, so no attach can be
    /// counting a new user meanwhile.
    async fn remove_unused_vlans(&self, links: &[LinkState]) {
        let ops = match self.netns.host().await {
            Ok(ops) => ops,
            Err(err) => {
                tracing::warn!(%err, "opening the host netns to remove unused VLAN sub-interfaces");
                return;
            }
        };
        for (name, outcome) in self.vlans.remove_unused(&ops, links).await {
            match outcome {
                Ok(_) => {
                    tracing::info!(vlan = %name, "removed a VLAN sub-interface of ours that no pod uses");
                }
                Err(err) => {
                    tracing::warn!(vlan = %name, %err, "removing an unused VLAN sub-interface of ours");
                }
            }
        }
    }

    async fn adopt_vlans(&self, device: &AttachedDevice, links: &[LinkState]) {
        for step in &device.plan.steps {
            if let Step::EnsureVlan { vlan } = step {
                let owned = links.iter().any(|l| {
                    l.name == vlan.name && vlan_owner(vlan, l.alias.as_deref()) == VlanOwner::Us
                });
                self.vlans.adopt(vlan, &device.claim_uid, owned).await;
            }
        }
    }

    /// Restores every host link carrying our device alias that our state confirms: a NIC the
    /// kernel returned from a destroyed pod netns under its pod-side name. The alias is a
    /// hint, never authority (DESIGN §6; anyone with `NET_ADMIN` on the link can write it):
    /// the link is renamed only when a pod record or a prepared claim holds that device for
    /// that claim. Its MTU and MAC come from the record or the claim.
    async fn restore_returned(&self, links: &[LinkState]) {
        let returned: Vec<&LinkState> = links
            .iter()
            .filter(|l| match l.alias.as_deref().and_then(parse_device_alias) {
                Some((host_name, claim_uid)) => {
                    let known = self.original_mtu_mac(host_name, claim_uid).is_some();
                    if !known {
                        tracing::warn!(link = %l.name, alias = l.alias.as_deref().unwrap_or_default(),
                            "a host link carries our alias for a device no claim of ours holds; left alone");
                    }
                    known
                }
                None => false,
            })
            .collect();
        if returned.is_empty() {
            return;
        }
        let ops = match self.netns.host().await {
            Ok(ops) => ops,
            Err(err) => {
                tracing::warn!(%err, "opening the host netns to restore returned devices");
                return;
            }
        };
        for link in returned {
            let Some((host_name, claim_uid)) = link.alias.as_deref().and_then(parse_device_alias)
            else {
                continue;
            };
            let Some((mtu, mac)) = self.original_mtu_mac(host_name, claim_uid) else {
                continue;
            };
            match ops.restore_in_host(link.index, host_name, mtu, mac).await {
                Ok(()) => tracing::info!(link = %link.name, host_name, claim = claim_uid, mtu,
                    "restored a device returned from a destroyed pod netns"),
                Err(err) => tracing::warn!(link = %link.name, host_name, %err,
                    "restoring a device returned from a destroyed pod netns"),
            }
        }
    }

    fn original_mtu_mac(
        &self,
        host_name: &str,
        claim_uid: &str,
    ) -> Option<(u32, Option<crate::model::network_config::MacAddr>)> {
        let from_record =
            lock(&self.inner).pods.values().flat_map(|r| r.devices.iter()).find_map(|d| {
                (d.claim_uid == claim_uid && d.plan.host_device == host_name)
                    .then_some((d.plan.host_mtu, d.plan.host_mac_to_restore))
            });
        from_record.or_else(|| {
            self.claims.claim(claim_uid).and_then(|c| {
                c.devices
                    .iter()
                    .find(|d| d.if_name == host_name && d.sharing == Some(Sharing::Exclusive))
                    .and_then(|d| d.host_mtu)
                    .map(|m| (m, None))
            })
        })
    }

    /// `Synchronize`: takes the runtime's pods after a (re)registration and returns at once.
    /// The running sandboxes are known from here on; the pods that have interfaces of ours
    /// (a record, or a prepared claim reserved for them) are unverified until the reconcile
    /// loop has checked them.
    pub(super) fn accept_synchronize(&self, pods: Vec<PodSandbox>) {
        let with_claims: HashSet<String> = self
            .claims
            .all_claims()
            .into_iter()
            .flat_map(|c| c.reserved_for.into_iter().map(|p| p.uid))
            .collect();
        let unverified: Vec<String> = {
            let mut inner = lock(&self.inner);
            // The runtime's list is the truth about running sandboxes from now on.
            inner.sandboxes = pods.iter().map(|p| (p.uid.clone(), Sandbox::from_pod(p))).collect();
            pods.iter()
                .filter(|p| with_claims.contains(&p.uid) || inner.pods.contains_key(&p.uid))
                .map(|p| p.uid.clone())
                .collect()
        };
        lock(&self.reconciles.unverified).extend(unverified);
        // A newer list replaces one the loop has not taken yet.
        *lock(&self.reconciles.pending) = Some(pods);
        self.reconciles.due.notify_one();
    }

    /// Runs the reconcile of each `Synchronize`, forever (the caller aborts it).
    pub async fn reconcile_loop(&self) {
        loop {
            self.reconciles.due.notified().await;
            self.reconcile_pending().await;
        }
    }

    /// Runs the reconcile the last `Synchronize` asked for, if the loop has not taken it.
    pub async fn reconcile_pending(&self) {
        let pods = lock(&self.reconciles.pending).take();
        if let Some(pods) = pods {
            self.reconcile(&pods).await;
        }
    }

    /// Whether pod `uid` waits for the reconcile after a `Synchronize`.
    pub(super) fn unverified(&self, uid: &str) -> bool {
        lock(&self.reconciles.unverified).contains(uid)
    }

    /// Waits until pod `uid` is verified, or until `deadline`; whether it is.
    pub(super) async fn wait_verified(&self, uid: &str, deadline: tokio::time::Instant) -> bool {
        let mut progress = self.reconciles.progress.subscribe();
        loop {
            if !self.unverified(uid) {
                return true;
            }
            match tokio::time::timeout_at(deadline, progress.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return !self.unverified(uid),
            }
        }
    }

    /// The reconcile of one `Synchronize` list.
    async fn reconcile(&self, pods: &[PodSandbox]) {
        let started = Instant::now();
        let running: HashMap<&str, &PodSandbox> =
            pods.iter().map(|p| (p.uid.as_str(), p)).collect();
        // One dump for the pass: the VLAN sub-interfaces to adopt and the devices returned
        // from destroyed netns are host-side and do not change under a verify.
        let links = match self.netns.host_links().await {
            Ok(links) => links,
            Err(err) => {
                tracing::warn!(%err, "listing host links for reconcile");
                Vec::new()
            }
        };
        let records: Vec<PodAttachment> = lock(&self.inner).pods.values().cloned().collect();
        let actions: Vec<(PodAttachment, RecordAction)> = records
            .into_iter()
            .map(|record| {
                let action = record_action(&record, &running);
                (record, action)
            })
            .collect();
        let verified = actions.iter().filter(|(_, a)| *a == RecordAction::Verify).count();
        let detached = actions.iter().filter(|(_, a)| *a == RecordAction::Detach).count();
        futures::stream::iter(actions)
            .for_each_concurrent(MAX_CONCURRENT_RECONCILES, |(record, action)| {
                let links = &links;
                async move {
                    let uid = record.pod_uid.clone();
                    self.reconcile_record(record, action, links).await;
                    if action == RecordAction::Verify {
                        // A pod with interfaces of claims not in its record yet stays
                        // unverified until the attach below.
                        let claims = self.claims.claims_of_pod(&uid);
                        if self.covered(&uid, None, &claims) {
                            self.reconciles.verified([&uid]);
                        }
                    }
                }
            })
            .await;
        // Pods whose sandbox started while the daemon was down (or whose attach never
        // finished) get their interfaces now.
        let to_attach: Vec<(Sandbox, Vec<crate::claims::PreparedClaim>)> =
            pods.iter()
                .filter_map(|pod| {
                    let claims = self.claims.claims_of_pod(&pod.uid);
                    // The runtime lists stopped sandboxes until they are removed: one whose stop
                    // we saw is never attached again (a new sandbox of the pod has another ID).
                    let stopped = lock(&self.inner).pods.get(&pod.uid).is_some_and(|r| {
                        r.state == AttachmentState::Stopped && r.sandbox_id == pod.id
                    });
                    let done = stopped
                        || claims.is_empty()
                        || self.covered(&pod.uid, pod.netns_path.as_deref(), &claims);
                    if done {
                        self.reconciles.verified([&pod.uid]);
                        None
                    } else {
                        Some((Sandbox::from_pod(pod), claims))
                    }
                })
                .collect();
        let attached = to_attach.len();
        futures::stream::iter(to_attach)
            .for_each_concurrent(MAX_CONCURRENT_RECONCILES, |(sandbox, claims)| async move {
                match self.attach_pod(&sandbox, &claims, Instant::now()).await {
                    Ok(()) => {}
                    // A sandbox the runtime still lists but whose netns is already gone
                    // (stopped, not yet removed), or unmounted with its file left (a run cut
                    // short: containerd unmounts, then deletes): nothing to attach and
                    // nothing to report.
                    Err(AttachFailure::Netns {
                        source:
                            LinkOpError::NetnsGone { .. }
                            | LinkOpError::NotPodNetns { reason: NetnsRefusal::NotNsfs, .. },
                        ..
                    }) => {
                        tracing::debug!(pod = %sandbox.uid, "listed sandbox without a netns; skipped");
                    }
                    // Reported on the claims and the Pod; CreateContainer retries.
                    Err(err) => {
                        let _message = self.report_failure(&sandbox, &claims, &err);
                    }
                }
                self.reconciles.verified([&sandbox.uid]);
            })
            .await;
        self.restore_returned(&links).await;
        self.refresh_moved();
        // Every listed pod has been looked at, whatever the outcome.
        self.reconciles.verified(pods.iter().map(|p| p.uid.as_str()));
        self.synchronized.store(true, Ordering::Release);
        // Claims deleted from the API are checked off the runtime's request deadline.
        self.sweep_due.notify_one();
        tracing::info!(pods = pods.len(), verified, detached, attached,
            took = ?started.elapsed(), "reconciled with the runtime's pods");
    }

    /// One pod record's part of a reconcile pass (holding the pod's gate).
    async fn reconcile_record(
        &self,
        record: PodAttachment,
        action: RecordAction,
        links: &[LinkState],
    ) {
        let uid = record.pod_uid.clone();
        self.serialised(&uid, async {
            // An event may have changed the record since the pass listed it.
            let Some(current) = lock(&self.inner).pods.get(&uid).cloned() else { return };
            if current.sandbox_id != record.sandbox_id || current.state != record.state {
                return;
            }
            match action {
                RecordAction::Verify => self.verify(current, links).await,
                RecordAction::Detach => {
                    self.detach_record(&current).await;
                    self.submit_stopped(&current);
                    self.drop_record(&uid);
                }
                // The stop already detached; again costs nothing and catches a stop whose
                // detach could not open the netns.
                RecordAction::Forget => {
                    self.detach_record(&current).await;
                    self.drop_record(&uid);
                }
                // Stopped, not yet removed: finish a link removal a crash interrupted.
                RecordAction::Keep => {
                    if self.links_may_exist(&current) {
                        self.detach_record(&current).await;
                        lock(&self.inner).links_gone.insert(uid.clone());
                    }
                }
            }
        })
        .await;
    }

    /// Releases prepared claims that no running pod uses and whose ResourceClaim is gone from
    /// the API; waits for the first `Synchronize` (before it the running pods are unknown).
    /// Returns how many claims were released.
    pub async fn sweep_gone_claims(&self) -> usize {
        if !self.synchronized.load(Ordering::Acquire) {
            return 0;
        }
        let running: BTreeSet<String> = lock(&self.inner).sandboxes.keys().cloned().collect();
        self.release_gone_claims(&running).await
    }

    /// Runs [`Self::sweep_gone_claims`] after every `Synchronize` and every `period`, forever
    /// (the caller aborts it); `after_release` runs when claims were released.
    pub async fn sweep_loop(&self, period: Duration, after_release: impl Fn() + Send) {
        loop {
            tokio::select! {
                () = self.sweep_due.notified() => {}
                () = tokio::time::sleep(period) => {}
            }
            let released = self.sweep_gone_claims().await;
            if released > 0 {
                tracing::info!(released, "released prepared claims gone from the API");
                after_release();
            }
        }
    }

    /// Forgets the record of pod `uid` (store, then memory).
    fn drop_record(&self, uid: &str) {
        if let Err(err) = self.forget(uid) {
            tracing::warn!(pod = %uid, %err, "forgetting the pod record");
            return;
        }
        lock(&self.inner).pods.remove(uid);
    }

    /// Checks that a running pod still has its interfaces; attaches again what is missing
    /// or was not finished before a crash.
    async fn verify(&self, mut record: PodAttachment, links: &[LinkState]) {
        let uid = record.pod_uid.clone();
        let uid = uid.as_str();
        let ops = match self.netns.open(&record.netns).await {
            Ok(ops) => ops,
            Err(
                LinkOpError::NetnsGone { .. }
                | LinkOpError::NotPodNetns { reason: NetnsRefusal::NotNsfs, .. },
            ) => {
                // Listed as running, but its netns is gone (or unmounted, its file left):
                // treat it as gone.
                self.detach_record(&record).await;
                self.drop_record(uid);
                return;
            }
            Err(err) => {
                tracing::warn!(pod = %uid, %err, "opening the pod netns to verify its interfaces");
                return;
            }
        };
        let mut changed = false;
        for index in 0..record.devices.len() {
            let device = record.devices[index].clone();
            // A failed lookup says nothing about the interface: a live NIC of a running pod
            // is never detached on a guess. The next Synchronize looks again.
            let link = match ops.link(Side::Pod, &device.plan.interface_name).await {
                Ok(link) => link,
                Err(err) => {
                    tracing::warn!(pod = %uid, interface = %device.plan.interface_name, %err,
                        "reading a pod interface to verify it; left as it is");
                    continue;
                }
            };
            if link.is_some() && device.result.is_some() {
                self.adopt_vlans(&device, links).await;
                continue;
            }
            // Its result never reached the disk (written in the background after a complete
            // attach): an interface that carries everything its plan configures is adopted
            // as it is, without a blip.
            if let Some(link) = &link {
                match ops.pod_config(link.index).await {
                    Ok(config) => {
                        if let Some(result) = completed_attach(&device.plan, link, &config) {
                            tracing::info!(pod = %uid, interface = %result.name,
                                "adopted an interface whose attach finished before a restart");
                            record.devices[index].result = Some(result);
                            self.adopt_vlans(&device, links).await;
                            changed = true;
                            continue;
                        }
                    }
                    Err(err) => {
                        tracing::warn!(pod = %uid, interface = %link.name, %err,
                            "reading a pod interface's addresses and routes; left as it is");
                        continue;
                    }
                }
            }
            // Missing, or half-done (a crash during the attach): undo whatever is there and
            // attach it again.
            if link.is_some() {
                let report = detach(&ops, &self.vlans, &device.plan).await;
                log_detach(&record, &device, &report);
            }
            self.adopt_vlans(&device, links).await;
            let attached = match self.device_settings(&device).await {
                Ok(()) => attach(&ops, &self.vlans, &device.plan).await.map_err(|e| e.to_string()),
                Err(failure) => Err(failure.to_string()),
            };
            match attached {
                Ok(result) => {
                    tracing::info!(pod = %uid, interface = %result.name, "re-attached a missing interface");
                    record.devices[index].result = Some(result);
                }
                Err(err) => {
                    tracing::warn!(pod = %uid, %err, "re-attaching a missing interface");
                    record.devices[index].result = None;
                }
            }
            changed = true;
        }
        if changed && let Err(err) = self.persist(&record) {
            tracing::warn!(pod = %uid, %err, "persisting the verified pod");
        }
        let claims: Vec<_> = self.claims.claims_of_pod(uid);
        for claim in &claims {
            self.submit_ready(claim, &record);
        }
        lock(&self.inner).pods.insert(uid.to_owned(), record);
    }

    /// Releases prepared claims that no running pod uses and whose ResourceClaim is gone from
    /// the API (kubelet will not unprepare a claim of a pod it forgot). Returns how many.
    async fn release_gone_claims(&self, running: &BTreeSet<String>) -> usize {
        let mut released = 0;
        for claim in self.claims.all_claims() {
            if claim.reserved_for.iter().any(|p| running.contains(&p.uid)) {
                continue;
            }
            if self.claims.presence(&claim).await != ClaimPresence::Gone {
                continue;
            }
            self.detach_claim(&claim.uid).await;
            match self.claims.release(&claim).await {
                Ok(()) => {
                    released += 1;
                    tracing::info!(claim = %claim.name, namespace = %claim.namespace,
                        uid = %claim.uid, "released a prepared claim that is gone from the API");
                }
                Err(err) => tracing::warn!(claim = %claim.name, %err, "releasing a gone claim"),
            }
        }
        released
    }
}
