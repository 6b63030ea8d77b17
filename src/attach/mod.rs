//! Pod interfaces through NRI (DESIGN §5 steps 3–5, §6): attaches a pod's prepared claims
//! when its sandbox starts, refuses containers while an attachment is missing, detaches at
//! sandbox stop, reconciles the kernel and the store with the runtime's pods after a
//! restart, and reports each claim's status.
//!
//! The service reaches the world through four ports ([`ports`]): [`PodClaimSource`] (the prepared
//! claims), [`NetnsPort`] (netlink in the host and pod netns), [`AttachmentStore`] (durable
//! pod records) and [`StatusSink`] (claim status and Pod events, written off the critical
//! path). Calls for one pod are serialised; different pods run concurrently.
//!
//! - [`ports`]: the four ports.
//! - `plan`: interface names and plans of a pod's devices.
//! - `shared`: the [`AttachService`]'s state (its fields, pod records, gates, pending
//!   reconcile), which the other files implement without importing each other.
//! - `service`: records, gates, attach, detach.
//! - [`status`]: the claim status entries and their submission.
//! - [`handler`]: the NRI events the service handles.
//! - `reconcile`: start-up and `Synchronize` reconcile, the sweep of gone claims.
//! - [`preparer`]: the prepare port decorated with detach-before-unprepare.
//! - [`bandwidth`]: the egress ceilings put in place at the `CreateContainer` gate.

pub mod bandwidth;
mod ethtool_status;
pub mod handler;
mod plan;
pub mod ports;
pub mod preparer;
mod reconcile;
mod record;
mod service;
mod shared;
pub mod status;

#[cfg(test)]
mod tests;

pub use handler::plugin_events;
pub use ports::{
    AttachmentStore, ClaimPresence, NetnsPort, PodClaimSource, StatusSink, WithDeviceMetadata,
};
pub use preparer::{ClaimDetacher, DetachingPreparer};
pub use record::{AttachedDevice, AttachmentState, PodAttachment};
pub use shared::AttachService;

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::model::cause::Cause;
use crate::podnet::plan::NameError;
use crate::podnet::{AttachError, LinkOpError, PlanError};

/// Pods attached at the same time; more wait (each holds a netns thread and socket).
pub const MAX_CONCURRENT_ATTACHES: usize = 16;

/// Condition reason of a failed attach.
pub const REASON_ATTACH_FAILED: &str = "AttachFailed";
/// Condition reason after the pod's sandbox stopped: the interface is gone, the claim stays
/// prepared (its addresses are released at unprepare).
pub const REASON_POD_STOPPED: &str = "PodStopped";

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
    /// The device's settings could not be put on it before the move (a VF's VLAN, spoof
    /// checking, ...): it is not handed to the pod without them.
    #[error("claim {claim}, request {request}, device {device}: device settings: {source}")]
    DeviceSettings {
        /// `namespace/name` of the claim.
        claim: String,
        /// Request name.
        request: String,
        /// Device name.
        device: String,
        /// Why.
        #[source]
        source: Box<crate::claims::ClaimError>,
    },
    /// The pod record could not be persisted (nothing was attached).
    #[error("persisting the pod's attachment: {0}")]
    Persist(#[source] Cause),
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps are changed only after the store accepted the change; a panic elsewhere leaves
    // consistent data behind.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
