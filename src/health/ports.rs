//! The health monitor's port: watching a link inside a pod's network namespace
//! ([`PodLinkSource`]); the host's links come through the inventory's `InterfaceSource`.

use std::future::Future;

use super::monitor::{LinkReporter, MovedNic};

/// Watching one link inside a pod's network namespace.
pub trait PodLinkSource: Send + Sync {
    /// Why a watch could not start.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Starts watching interface `nic.if_name` in `nic.netns`. Returns after the first
    /// observation was reported; then reports every change until `reporter` is closed (the
    /// watch's socket is released then) or the watch fails (reported as
    /// [`super::LinkObservation::Unreadable`] before it ends).
    fn watch(
        &self,
        nic: &MovedNic,
        reporter: LinkReporter,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}
