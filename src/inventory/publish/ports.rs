//! The publisher's ports: the slice API ([`SliceApi`]), the node's interfaces
//! ([`InterfaceSource`]), the devices claims prepared here use ([`PreparedDeviceSource`]), and
//! what it reports: Warning Events ([`WarningSink`]), each round's outcome
//! ([`PublishSink`]) and readiness ([`ReadinessSink`]).

use std::collections::BTreeSet;
use std::fmt;
use std::future::Future;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::SyncReport;
use crate::model::device::HostInterface;

/// A failed API call, as the port reports it.
#[derive(Debug, thiserror::Error)]
#[error("{operation} ResourceSlice {name}: {message}")]
pub struct SliceApiError {
    /// `list`, `apply` or `delete`.
    pub operation: &'static str,
    /// Slice name (empty for list).
    pub name: String,
    /// HTTP status code, when the server answered.
    pub code: Option<u16>,
    /// What went wrong.
    pub message: String,
}

/// The API operations the publisher needs: this node's and driver's slices only.
pub trait SliceApi: Send + Sync {
    /// Lists the slices of this node and driver.
    fn list(&self) -> impl Future<Output = Result<Vec<ResourceSlice>, SliceApiError>> + Send;
    /// Server-side applies one slice and returns it as the server stored it.
    fn apply(
        &self,
        slice: &ResourceSlice,
    ) -> impl Future<Output = Result<ResourceSlice, SliceApiError>> + Send;
    /// Deletes one slice; deleting a missing slice succeeds.
    fn delete(&self, name: &str) -> impl Future<Output = Result<(), SliceApiError>> + Send;
}

/// The devices of this node's pool that claims prepared here use (from the claim service):
/// a shared device among them keeps `allowMultipleAllocations` and its capacity.
pub trait PreparedDeviceSource: Send + Sync + fmt::Debug {
    /// Names of this pool's devices with prepared claims.
    fn prepared_devices(&self) -> BTreeSet<String>;
}

/// The node's network interfaces as discovery sees them now.
pub trait InterfaceSource: Send + Sync {
    /// Why discovery failed.
    type Error: std::error::Error + Send + Sync + 'static;
    /// Every interface of the host netns with its facts.
    fn discover(&self) -> impl Future<Output = Result<Vec<HostInterface>, Self::Error>> + Send;
}

/// Warning Events on this node's Node object.
pub trait WarningSink: Send + Sync {
    /// Records a Warning (`reason`, `action`, `note`); failures are the adapter's to log.
    fn warn(&self, reason: &str, action: &str, note: String) -> impl Future<Output = ()> + Send;
}

/// The outcome of each publication round, for whoever counts them (the daemon's metrics).
pub trait PublishSink: Send + Sync {
    /// A round succeeded and left the pool as `report` says: slices written, devices and
    /// generation published, consumable capacity dropped by the server (the first time).
    fn round_published(&self, report: &SyncReport);
    /// A round failed (discovery or the API); it is retried with backoff.
    fn round_failed(&self);
}

/// The daemon's readiness, which the first successful round establishes.
pub trait ReadinessSink: Send + Sync {
    /// A round succeeded: the node's devices are published.
    fn mark_ready(&self);
}
