//! The prepare port: [`ClaimPreparer`], which kubelet's DRA adapter calls, and its
//! version-independent result types (no gRPC types here). The claim service implements it;
//! adapters and decorators (metrics, detach before unprepare) wrap it.

use std::collections::HashMap;
use std::future::Future;

use crate::model::ClaimRef;

/// One allocated device of a prepared claim, as kubelet needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PreparedDevice {
    /// Requests of the claim this device serves; empty means all of them.
    pub request_names: Vec<String>,
    /// Pool of the device (our pools are named after the node).
    pub pool_name: String,
    /// Device name within the pool.
    pub device_name: String,
    /// Fully qualified CDI device names; a network driver usually has none.
    pub cdi_device_ids: Vec<String>,
    /// Share of a device allocated with consumable capacity (`shareID`). Only DRA v1 carries
    /// it; v1beta1 kubelets predate shares.
    pub share_id: Option<String>,
}

/// Why one claim could not be prepared or unprepared; kubelet shows the message in the pod's
/// events and retries the pod later.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFailure {
    /// Human-readable cause; names the claim's field or value at fault.
    pub message: String,
}

impl ClaimFailure {
    /// A failure with the given message.
    pub fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }
}

/// Outcome of preparing each claim of a batch, keyed by claim UID.
pub type PrepareResults = HashMap<String, Result<Vec<PreparedDevice>, ClaimFailure>>;
/// Outcome of unpreparing each claim of a batch, keyed by claim UID.
pub type UnprepareResults = HashMap<String, Result<(), ClaimFailure>>;

/// Prepares and unprepares claims for kubelet; implemented by the claim logic.
///
/// Both calls get all claims of one pod that belong to this driver. Implementations answer
/// every UID (the kubelet adapter turns a missing one into a per-claim error), must be
/// idempotent (kubelet repeats calls after restarts), and unprepare of an unknown claim
/// succeeds.
pub trait ClaimPreparer: Send + Sync + 'static {
    /// Prepares the claims (`NodePrepareResources`).
    fn prepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = PrepareResults> + Send;

    /// Releases what [`ClaimPreparer::prepare`] did (`NodeUnprepareResources`).
    fn unprepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = UnprepareResults> + Send;
}

/// The preparer used until the claim logic is wired in: answers every prepare with a
/// per-claim error saying so, never with an empty success (an empty device list would let the
/// pod start without its network). Unprepare succeeds: this preparer never prepared anything,
/// and kubelet expects unprepare of an unknown claim to succeed (else it retries forever).
#[derive(Debug, Clone, Default)]
pub struct UnavailablePreparer {
    driver_name: String,
}

impl UnavailablePreparer {
    /// A preparer that rejects every claim on behalf of `driver_name`.
    pub fn new(driver_name: impl Into<String>) -> Self {
        Self { driver_name: driver_name.into() }
    }

    fn failure(&self, claim: &ClaimRef) -> ClaimFailure {
        ClaimFailure::new(format!(
            "{}: cannot prepare claim {claim}: claim preparation is not available in this build \
             of the driver",
            self.driver_name
        ))
    }
}

impl ClaimPreparer for UnavailablePreparer {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        claims.iter().map(|c| (c.uid.clone(), Err(self.failure(c)))).collect()
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        claims.into_iter().map(|c| (c.uid, Ok(()))).collect()
    }
}

impl<P: ClaimPreparer> ClaimPreparer for std::sync::Arc<P> {
    fn prepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = PrepareResults> + Send {
        P::prepare(self, claims)
    }

    fn unprepare(&self, claims: Vec<ClaimRef>) -> impl Future<Output = UnprepareResults> + Send {
        P::unprepare(self, claims)
    }
}
