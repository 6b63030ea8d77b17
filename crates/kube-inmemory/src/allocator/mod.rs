//! Allocator standing in for the scheduler's DRA plugin in `netclaim dev` (DESIGN §8):
//! a pure allocation core plus a controller that writes `status.allocation`.
//!
//! - [`allocate::allocate`] (pure, no I/O): complete pools (highest generation with all
//!   `resourceSliceCount` slices) visible to the node, DeviceClasses, the claims that exist
//!   (allocated ones account exclusive use and consumed capacity) and one claim → its
//!   `AllocationResult`, or an [`allocate::AllocationError`] naming the request and why.
//!   Supports `exactly` (`ExactCount` with `count`, `All`), `firstAvailable` (result
//!   `request` = `<main>/<sub>`), class AND request CEL selectors ([`selector`]), consumable
//!   capacity (KEP-5075: per-capacity request or policy default, rounded by
//!   `validValues`/`validRange`, never above the device's value summed over all shares; each
//!   share gets a fresh UUID `shareID` and `consumedCapacity`), exclusive devices used at most
//!   once, class config (`FromClass`, restricted to the request that used the class) then claim
//!   config (`FromClaim`), and `nodeSelector` `matchFields metadata.name In [node]`.
//!   Not supported (a clear error or ignored): `constraints` (error), `adminAccess`,
//!   tolerations/taints, partitionable devices (shared counters), binding conditions.
//! - [`schedule::place`] (pure): for a cluster of several nodes, the node an unbound pod goes
//!   to (one whose devices satisfy all its claims, the least loaded first), and
//!   [`schedule::consumer_node`], the node a claim is allocated for (its pod's).
//!   Its errors are worded as kube-scheduler's ("0/1 nodes are available: 1 cannot allocate
//!   all claims.", "request net: device class x does not exist"), each node's reason after.
//! - [`report`]: what a pod no node fits shows, as with kube-scheduler: `PodScheduled=False`
//!   (`Unschedulable`, the message) and one `FailedScheduling` Event whose series counts the
//!   attempts.
//! - [`controller`]: [`run`] / [`run_for_nodes`] / [`AllocatorController`] watch claims,
//!   slices and classes (and pods for several nodes) over the API, bind pods and allocate
//!   pending claims; [`reserve_for`] / [`unreserve`] edit `status.reservedFor` for the dev
//!   kubelet.

pub mod allocate;
pub mod controller;
pub mod quantity;
pub mod report;
pub mod schedule;
pub mod selector;

pub use controller::{
    AllocatorController, ControllerError, reserve_for, run, run_for_nodes, unreserve,
};

#[cfg(test)]
mod capacity_tests;
#[cfg(test)]
mod schedule_tests;
#[cfg(test)]
mod tests;
