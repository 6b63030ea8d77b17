//! The prepare port as the node daemon serves it: prepare through the claim logic; unprepare
//! first detaches the claim's interfaces from any pod still holding them (a pod force-deleted
//! without a sandbox stop, so no StopPodSandbox ever came), then releases the claim.

use std::future::Future;
use std::sync::Arc;

use super::{AttachService, AttachmentStore, NetnsPort, PodClaimSource, StatusSink};
use crate::claims::{ClaimPreparer, PrepareResults, UnprepareResults};
use crate::model::ClaimRef;

/// Takes a claim's interfaces out of every pod that holds them.
pub trait ClaimDetacher: Send + Sync + 'static {
    /// Detaches the interfaces of claim `claim_uid` (never fails: failures are logged and
    /// retried by reconcile).
    fn detach_claim(&self, claim_uid: &str) -> impl Future<Output = ()> + Send;
}

impl<C, N, S, W> ClaimDetacher for Arc<AttachService<C, N, S, W>>
where
    C: PodClaimSource,
    N: NetnsPort,
    S: AttachmentStore,
    W: StatusSink,
{
    async fn detach_claim(&self, claim_uid: &str) {
        AttachService::detach_claim(self, claim_uid).await;
    }
}

/// A [`ClaimPreparer`] whose unprepare detaches before it releases; `after_change` runs after
/// every call (the daemon refreshes its IPAM gauge there).
pub struct DetachingPreparer<P, A> {
    claims: P,
    attach: A,
    after_change: Box<dyn Fn() + Send + Sync>,
}

impl<P, A> std::fmt::Debug for DetachingPreparer<P, A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DetachingPreparer").finish_non_exhaustive()
    }
}

impl<P: ClaimPreparer, A: ClaimDetacher> DetachingPreparer<P, A> {
    /// Prepares through `claims`, detaches through `attach`.
    pub fn new(claims: P, attach: A, after_change: impl Fn() + Send + Sync + 'static) -> Self {
        after_change();
        Self { claims, attach, after_change: Box::new(after_change) }
    }
}

impl<P: ClaimPreparer, A: ClaimDetacher> ClaimPreparer for DetachingPreparer<P, A> {
    async fn prepare(&self, claims: Vec<ClaimRef>) -> PrepareResults {
        let results = self.claims.prepare(claims).await;
        (self.after_change)();
        results
    }

    async fn unprepare(&self, claims: Vec<ClaimRef>) -> UnprepareResults {
        for claim in &claims {
            self.attach.detach_claim(&claim.uid).await;
        }
        let results = self.claims.unprepare(claims).await;
        (self.after_change)();
        results
    }
}
