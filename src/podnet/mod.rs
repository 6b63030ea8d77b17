//! Pod interfaces: planning (pure) and applying (through `LinkPort`) the attach and detach of
//! the network interfaces a pod's claims ask for.
//!
//! How the NRI handlers use it (one `host::netlink::HostNetlink` and one [`VlanUsers`] per
//! daemon):
//! - RunPodSandbox, per prepared claim of the pod: [`plan::plan_attach`] (with the default
//!   interface name assigned now), persist the [`plan::AttachPlan`], then
//!   `NetlinkOps::open(&host, &plan.pod.path)` (one per pod, reused for all its claims: it
//!   costs a thread and a socket) and [`apply::attach`]; an error is returned
//!   to the runtime (the rollback already ran) and becomes the claim's `Ready=False`.
//! - StopPodSandbox: `NetlinkOps::open_for_detach(&host, &plan.pod.path)` (tolerates a
//!   netns that is already gone) and [`apply::detach`], which never fails; log the
//!   [`apply::DetachReport`]'s failed steps.

pub mod apply;
// The fake kernel and the failure-injecting wrapper are test doubles: compiled for the unit
// tests and, with the `testkit` feature, for netclaim-testkit; never in a release build.
#[cfg(any(test, feature = "testkit"))]
pub mod failing;
#[cfg(any(test, feature = "testkit"))]
pub mod fake;
pub mod plan;
pub mod ports;

pub use apply::{AttachError, AttachedInterface, DetachReport, VlanUsers, attach, detach, quiesce};
pub use plan::{
    AttachPlan, AttachRequest, HostDevice, InterfaceSlot, PlanError, PodNetns,
    assign_interface_names, plan_attach,
};
pub use ports::{LinkOpError, LinkPort, Side};
