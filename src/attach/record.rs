//! The durable record of one pod's attachment: which interfaces of which claims were planned
//! into which network namespace, so that StopPodSandbox (whose event carries no netns path)
//! and a restarted daemon can undo or verify them.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::health::MovedNic;
use crate::podnet::{AttachPlan, AttachedInterface};

/// Where a pod's interfaces stand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum AttachmentState {
    /// The plans are (being) executed in the pod's netns.
    Attached,
    /// StopPodSandbox detached them; the record waits for RemovePodSandbox.
    Stopped,
}

/// One pod's interfaces, keyed by pod UID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAttachment {
    /// Kubernetes pod UID (the record key).
    pub pod_uid: String,
    /// Pod name.
    pub pod_name: String,
    /// Pod namespace.
    pub pod_namespace: String,
    /// CRI sandbox ID the interfaces went into.
    pub sandbox_id: String,
    /// The sandbox's network namespace (remembered: it is empty at stop time).
    pub netns: PathBuf,
    /// Attached or stopped.
    pub state: AttachmentState,
    /// The interfaces, in attach order.
    pub devices: Vec<AttachedDevice>,
}

/// One interface of a pod: the claim device it serves, its plan, and (once known) what the
/// kernel made of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachedDevice {
    /// The claim's UID.
    pub claim_uid: String,
    /// The claim's namespace.
    pub claim_namespace: String,
    /// The claim's name.
    pub claim_name: String,
    /// Request name of the allocation result.
    pub request: String,
    /// Pool of the device.
    pub pool: String,
    /// Device name.
    pub device: String,
    /// `shareID` of a shared device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// The executed plan (its teardown is the detach).
    pub plan: AttachPlan,
    /// The interface as attached. The record is written before the plan runs (so a crash
    /// in between leaves a trace reconcile can undo); the result follows off the critical
    /// path, and a restarted daemon reads it back from the kernel when it is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<AttachedInterface>,
}

impl AttachedDevice {
    /// Whether the plan moves a host NIC into the pod (rather than creating a child there).
    #[must_use]
    pub fn moves_nic(&self) -> bool {
        self.plan.steps.iter().any(|s| matches!(s, crate::podnet::plan::Step::MoveIntoPod { .. }))
    }
}

impl PodAttachment {
    /// Host interfaces of exclusive devices inside the pod (moved NICs), which must stay
    /// published while the host no longer sees them (DESIGN §5.1).
    pub fn moved_host_devices(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().filter(|d| d.moves_nic()).map(|d| d.plan.host_device.as_str())
    }

    /// The moved NICs with where they are inside the pod (for device health), keyed by host
    /// interface name.
    pub fn moved_nics(&self) -> impl Iterator<Item = (String, MovedNic)> + '_ {
        self.devices.iter().flat_map(move |d| {
            d.plan.steps.iter().filter_map(move |step| match step {
                crate::podnet::plan::Step::MoveIntoPod { host_name, pod_name, .. } => Some((
                    host_name.clone(),
                    MovedNic {
                        netns: self.netns.clone(),
                        pod: format!("{}/{}", self.pod_namespace, self.pod_name),
                        if_name: pod_name.clone(),
                    },
                )),
                _ => None,
            })
        })
    }

    /// Whether the record has an interface for `(claim_uid, request)`.
    #[must_use]
    pub fn has(&self, claim_uid: &str, request: &str) -> bool {
        self.devices.iter().any(|d| d.claim_uid == claim_uid && d.request == request)
    }
}
