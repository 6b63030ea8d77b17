//! The attach service's ports: the prepared claims ([`PodClaimSource`]), netlink in the host and
//! pod namespaces ([`NetnsPort`]), durable pod records ([`AttachmentStore`]) and where claim
//! statuses and Pod events go ([`StatusSink`]). Each speaks model types only.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::AllocatedDeviceStatus;

use super::PodAttachment;
use crate::claims::metadata::DeviceMetadata;
use crate::claims::{
    ClaimError, ClaimService, ClaimSource, ClaimStore, DeviceSource, PreparedClaim,
};
use crate::model::{ClaimRef, PodRef};
use crate::podnet::ports::LinkState;
use crate::podnet::{LinkOpError, LinkPort};

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
pub trait PodClaimSource: Send + Sync + 'static {
    /// Prepared claims reserved for the pod `pod_uid`, in attach order (claim name).
    fn claims_of_pod(&self, pod_uid: &str) -> Vec<PreparedClaim>;
    /// Every prepared claim.
    fn all_claims(&self) -> Vec<PreparedClaim>;
    /// The prepared claim with `uid`, if any. The default walks [`Self::all_claims`]; a
    /// source with an index answers in one lookup (the attach completion asks once per
    /// claim: a walk made the burst quadratic in the node's claims).
    fn claim(&self, uid: &str) -> Option<PreparedClaim> {
        self.all_claims().into_iter().find(|c| c.uid == uid)
    }
    /// `(claim UID, request)` of every prepared device whose config turns its counters off
    /// (`stats: false`). The default walks [`Self::all_claims`]; a source holding the claims
    /// answers without copying them (the stats service asks on every change of the attached
    /// interfaces: a copy of every claim each time made a burst quadratic, issue 36).
    fn stats_off_devices(&self) -> BTreeSet<(String, String)> {
        self.all_claims()
            .into_iter()
            .flat_map(|claim| {
                claim
                    .devices
                    .into_iter()
                    .filter(|d| !d.config.stats)
                    .map(move |d| (claim.uid.clone(), d.request))
            })
            .collect()
    }
    /// Whether `claim` still exists in the API.
    fn presence(&self, claim: &PreparedClaim) -> impl Future<Output = ClaimPresence> + Send;
    /// Releases `claim` as an unprepare would (addresses freed, record forgotten).
    fn release(&self, claim: &PreparedClaim)
    -> impl Future<Output = Result<(), ClaimError>> + Send;
    /// Puts the settings the claim asks of the device of `request` on it, right before the
    /// attach moves it into a pod (a VF's VLAN, spoof checking, trust, rates, MAC: they do
    /// not survive a reboot, DESIGN §6); nothing to do for a device without such settings.
    fn apply_device_settings(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> impl Future<Output = Result<(), ClaimError>> + Send {
        let _ = (claim_uid, request);
        async { Ok(()) }
    }
    /// The name the host netns gives the device of `request` now, when the claims know it
    /// by an identity that survives a reboot (a VF's PCI address; DESIGN §6: never by a name
    /// that can change at boot). `None`: the name recorded at prepare holds.
    fn current_host_name(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> impl Future<Output = Result<Option<String>, ClaimError>> + Send {
        let _ = (claim_uid, request);
        async { Ok(None) }
    }
}

/// Netlink access: per-pod [`LinkPort`] and a view of the host's links.
pub trait NetnsPort: Send + Sync + 'static {
    /// Kernel operations on the host netns and one pod netns.
    type Ops: LinkPort + Send + Sync + 'static;
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

/// Pod records that outlive the daemon's process, not the machine (decision 0010): every
/// pod netns, and every interface a record describes, is gone after power loss or a kernel
/// crash too, so a record must survive `kill -9` (the page cache does) and never waits for
/// the disk. Calls write into the page cache and return; the service makes them inline.
pub trait AttachmentStore: Clone + Send + Sync + 'static {
    /// The store's error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Every record.
    fn load_attachments(&self) -> Result<Vec<PodAttachment>, Self::Error>;
    /// Writes a record; it survives `kill -9` of the daemon once this returns.
    fn save_attachment(&self, attachment: &PodAttachment) -> Result<(), Self::Error>;
    /// Forgets a record (as [`AttachmentStore::save_attachment`]); a missing one succeeds.
    fn remove_attachment(&self, pod_uid: &str) -> Result<(), Self::Error>;
}

/// Where claim statuses and Pod events go; both return at once (the writes retry in the
/// background).
pub trait StatusSink: Send + Sync + 'static {
    /// This driver's full set of `status.devices` entries of `claim`.
    fn submit(&self, claim: ClaimRef, entries: Vec<AllocatedDeviceStatus>);
    /// A Warning Event on the Pod.
    fn warn_pod(&self, pod: PodRef, reason: &'static str, message: String);
}

/// A [`StatusSink`] that also takes each status's `networkData` into the claim's device
/// metadata files (DESIGN §5 item 7) before passing it on. The rewrite is a small write in
/// place without fsync, done before the sandbox is answered, so a container created right
/// after finds its interface in the file.
#[derive(Debug)]
pub struct WithDeviceMetadata<W> {
    inner: W,
    metadata: Option<Arc<DeviceMetadata>>,
}

impl<W: StatusSink> WithDeviceMetadata<W> {
    /// Statuses go to `inner`, their `networkData` also into `metadata` (when it is on).
    pub fn new(inner: W, metadata: Option<Arc<DeviceMetadata>>) -> Self {
        Self { inner, metadata }
    }
}

impl<W: StatusSink> StatusSink for WithDeviceMetadata<W> {
    fn submit(&self, claim: ClaimRef, entries: Vec<AllocatedDeviceStatus>) {
        if let Some(metadata) = &self.metadata {
            metadata.update_network(&claim.uid, &entries);
        }
        self.inner.submit(claim, entries);
    }

    fn warn_pod(&self, pod: PodRef, reason: &'static str, message: String) {
        self.inner.warn_pod(pod, reason, message);
    }
}

impl<R, D, S> PodClaimSource for Arc<ClaimService<R, D, S>>
where
    R: ClaimSource,
    D: DeviceSource,
    S: ClaimStore,
{
    /// Without `vfio` devices: they get no interface (their group device reaches the
    /// containers through CDI), so the attach neither plans nor waits for them.
    fn claims_of_pod(&self, pod_uid: &str) -> Vec<PreparedClaim> {
        crate::claims::vfio::with_interfaces(self.prepared_for_pod(pod_uid))
    }

    fn all_claims(&self) -> Vec<PreparedClaim> {
        self.all_prepared()
    }

    fn stats_off_devices(&self) -> BTreeSet<(String, String)> {
        ClaimService::stats_off_devices(self)
    }

    fn claim(&self, uid: &str) -> Option<PreparedClaim> {
        self.prepared(uid)
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

    async fn release(&self, claim: &PreparedClaim) -> Result<(), ClaimError> {
        let reference = ClaimRef {
            namespace: claim.namespace.clone(),
            name: claim.name.clone(),
            uid: claim.uid.clone(),
        };
        self.unprepare_claim(&reference).await
    }

    async fn apply_device_settings(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> Result<(), ClaimError> {
        self.reapply_vf_settings(claim_uid, request).await
    }

    async fn current_host_name(
        &self,
        claim_uid: &str,
        request: &str,
    ) -> Result<Option<String>, ClaimError> {
        self.vf_netdev_name(claim_uid, request).await
    }
}
