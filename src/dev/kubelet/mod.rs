//! The dev kubelet of `netclaim dev` (DESIGN §8): turns the Pods of its node into claims,
//! prepared resources and pod sandboxes, and reports Pod status.
//!
//! For each Pod (bound to the node, or unbound when the cluster has one node: the kubelet then
//! binds it; with several nodes the allocator binds pods): claims from
//! `resourceClaimTemplateName` entries are created like the
//! resourceclaim controller does ([`pod_claims`]) and recorded in
//! `status.resourceClaimStatuses`; once the allocator has allocated every claim, the Pod is
//! added to their `reservedFor`, `NodePrepareResources` is called over the driver's real DRA
//! socket ([`dra_client`]), and the sandbox runs ([`sandbox`]): a bare network namespace
//! announced over the in-process NRI runtime (then `CreateContainer` for each container, which
//! the plugin may refuse), or a real sandbox through CRI. Status goes `Pending` → `Running`, or
//! `Failed` with a condition naming the failing step ([`pod_status`]); errors are retried with
//! backoff (waits, e.g. for allocation, are not errors) and become Warning Events on the Pod.
//!
//! A Pod being deleted (the API server sets `deletionTimestamp` on bound pods) is torn down in
//! reverse: sandbox stopped and removed (netns too), `NodeUnprepareResources`, claims
//! unreserved, generated claims deleted (the dev API server has no garbage collector), then
//! the Pod is deleted for good. On shutdown every pod is torn down the same way, so nothing is
//! left on the host. Work on pods runs in parallel, bounded by a semaphore.

pub mod dra_client;
pub mod pod_claims;
pub mod pod_status;
pub mod sandbox;

mod worker;

pub use worker::*;
