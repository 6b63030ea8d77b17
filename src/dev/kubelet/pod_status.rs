//! The Pod status the dev kubelet reports for each step of bringing a pod up (pure, no I/O):
//! phase `Pending` → `Running` (or `Failed`), and the kubelet's conditions `PodScheduled`,
//! `PodReadyToStartContainers`, `Initialized`, `ContainersReady` and `Ready`, whose
//! `lastTransitionTime` only moves when their status changes (as kubelet's status manager).

use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The step of bringing a pod up that the pod is at (or failed in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Creating claims from templates and recording them in the Pod status.
    Claims,
    /// Waiting for the allocator to allocate the claims.
    Allocation,
    /// Adding the Pod to the claims' `reservedFor`.
    Reservation,
    /// `NodePrepareResources` over the DRA socket.
    Prepare,
    /// Creating the pod sandbox (network namespace, NRI `RunPodSandbox` or CRI).
    Sandbox,
    /// Creating the containers (NRI `CreateContainer` or CRI).
    Containers,
}

impl Step {
    /// Condition reason while waiting in this step.
    #[must_use]
    pub fn waiting_reason(self) -> &'static str {
        match self {
            Self::Claims => "WaitingForResourceClaims",
            Self::Allocation => "WaitingForAllocation",
            Self::Reservation => "WaitingForReservation",
            Self::Prepare => "PreparingResources",
            Self::Sandbox => "CreatingPodSandbox",
            Self::Containers => "CreatingContainers",
        }
    }

    /// Condition reason after an error in this step (kubelet's reasons where it has one).
    #[must_use]
    pub fn failure_reason(self) -> &'static str {
        match self {
            Self::Claims => "ResourceClaimCreationFailed",
            Self::Allocation => "AllocationFailed",
            Self::Reservation => "ReservationFailed",
            Self::Prepare => "FailedPrepareDynamicResources",
            Self::Sandbox => "CreatePodSandboxError",
            Self::Containers => "CreateContainerError",
        }
    }

    /// What the step does, for messages (`NodePrepareResources`, `RunPodSandbox`).
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::Claims => "creating ResourceClaims",
            Self::Allocation => "allocating ResourceClaims",
            Self::Reservation => "reserving ResourceClaims",
            Self::Prepare => "NodePrepareResources",
            Self::Sandbox => "RunPodSandbox",
            Self::Containers => "CreateContainer",
        }
    }
}

/// Where a pod is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodProgress {
    /// Not up yet: waiting in `step`, or retrying it after an error (`error: true`).
    Pending {
        /// The step.
        step: Step,
        /// Why (the error, or what it waits for).
        message: String,
        /// Whether the last attempt failed (then it is retried with backoff).
        error: bool,
    },
    /// Sandbox and containers are up.
    Running,
    /// `step` failed for good.
    Failed {
        /// The step.
        step: Step,
        /// The error.
        message: String,
    },
}

impl PodProgress {
    fn phase(&self) -> &'static str {
        match self {
            Self::Pending { .. } => "Pending",
            Self::Running => "Running",
            Self::Failed { .. } => "Failed",
        }
    }

    /// Whether the sandbox (with its network) is up.
    fn sandbox_ready(&self) -> bool {
        match self {
            Self::Running => true,
            Self::Pending { step, .. } => *step == Step::Containers,
            Self::Failed { .. } => false,
        }
    }
}

/// The status to write for `progress`, keeping what `previous` has that this kubelet does not
/// decide (`resourceClaimStatuses`, `startTime`) and the transition times of unchanged
/// conditions.
#[must_use]
pub fn pod_status(previous: Option<&PodStatus>, progress: &PodProgress, now: &Time) -> PodStatus {
    let ready = *progress == PodProgress::Running;
    let (reason, message) = match progress {
        PodProgress::Running => (None, None),
        PodProgress::Pending { step, message, error } => {
            let reason = if *error { step.failure_reason() } else { step.waiting_reason() };
            (Some(reason), Some(format!("{}: {message}", step.describe())))
        }
        PodProgress::Failed { step, message } => {
            (Some(step.failure_reason()), Some(format!("{}: {message}", step.describe())))
        }
    };
    let condition = |type_: &str, status: bool, reason: Option<&str>, message: Option<&String>| {
        let status = if status { "True" } else { "False" };
        let old = previous
            .and_then(|p| p.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == type_));
        let transition = match old {
            Some(old) if old.status == status => old.last_transition_time.clone(),
            _ => Some(now.clone()),
        };
        PodCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            last_transition_time: transition,
            reason: if status == "True" { None } else { reason.map(str::to_owned) },
            message: if status == "True" { None } else { message.cloned() },
            ..PodCondition::default()
        }
    };
    let sandbox_ready = progress.sandbox_ready();
    let sandbox_reason = if sandbox_ready { None } else { reason };
    let conditions = vec![
        condition("PodScheduled", true, None, None),
        condition("PodReadyToStartContainers", sandbox_ready, sandbox_reason, message.as_ref()),
        condition("Initialized", true, None, None),
        condition("ContainersReady", ready, reason, message.as_ref()),
        condition("Ready", ready, reason, message.as_ref()),
    ];
    PodStatus {
        phase: Some(progress.phase().to_owned()),
        conditions: Some(conditions),
        reason: match progress {
            PodProgress::Failed { step, .. } => Some(step.failure_reason().to_owned()),
            _ => None,
        },
        message: match progress {
            PodProgress::Failed { .. } => message,
            _ => None,
        },
        start_time: previous.and_then(|p| p.start_time.clone()).or_else(|| Some(now.clone())),
        resource_claim_statuses: previous.and_then(|p| p.resource_claim_statuses.clone()),
        ..PodStatus::default()
    }
}

/// Whether the Pod status says Running and Ready.
#[must_use]
pub fn is_running_and_ready(status: Option<&PodStatus>) -> bool {
    let Some(status) = status else { return false };
    status.phase.as_deref() == Some("Running")
        && status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000 + seconds).unwrap())
    }

    fn condition<'a>(status: &'a PodStatus, type_: &str) -> &'a PodCondition {
        status.conditions.as_ref().unwrap().iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn pending_names_the_step_and_running_turns_everything_ready() {
        let waiting = PodProgress::Pending {
            step: Step::Allocation,
            message: "claim default/web-net-x is not allocated yet".into(),
            error: false,
        };
        let pending = pod_status(None, &waiting, &at(0));
        assert_eq!(pending.phase.as_deref(), Some("Pending"));
        assert!(!is_running_and_ready(Some(&pending)));
        let ready = condition(&pending, "Ready");
        assert_eq!(ready.status, "False");
        assert_eq!(ready.reason.as_deref(), Some("WaitingForAllocation"));
        assert!(ready.message.as_deref().unwrap().contains("web-net-x"), "{ready:?}");
        assert_eq!(condition(&pending, "PodScheduled").status, "True");
        assert_eq!(condition(&pending, "PodReadyToStartContainers").status, "False");

        let running = pod_status(Some(&pending), &PodProgress::Running, &at(5));
        assert_eq!(running.phase.as_deref(), Some("Running"));
        assert!(is_running_and_ready(Some(&running)));
        for type_ in ["PodScheduled", "PodReadyToStartContainers", "Initialized", "Ready"] {
            let c = condition(&running, type_);
            assert_eq!(c.status, "True", "{type_}");
            assert_eq!(c.reason, None);
        }
        // Unchanged conditions keep their transition time; changed ones move.
        assert_eq!(condition(&running, "PodScheduled").last_transition_time, Some(at(0)));
        assert_eq!(condition(&running, "Ready").last_transition_time, Some(at(5)));
        assert_eq!(running.start_time, Some(at(0)));
    }

    #[test]
    fn a_retried_error_uses_the_failure_reason_and_failed_is_terminal() {
        let retry = PodProgress::Pending {
            step: Step::Sandbox,
            message: "NRI plugin 10-netclaim failed RunPodSandbox: no such parent".into(),
            error: true,
        };
        let status = pod_status(None, &retry, &at(0));
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(condition(&status, "Ready").reason.as_deref(), Some("CreatePodSandboxError"));
        let failed = PodProgress::Failed {
            step: Step::Sandbox,
            message: "NRI plugin 10-netclaim failed RunPodSandbox: no such parent".into(),
        };
        let status = pod_status(Some(&status), &failed, &at(3));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("CreatePodSandboxError"));
        let message = status.message.as_deref().unwrap();
        assert!(message.starts_with("RunPodSandbox: NRI plugin"), "{message}");
        // Ready was False before and is still False: same transition time.
        assert_eq!(condition(&status, "Ready").last_transition_time, Some(at(0)));
    }

    #[test]
    fn the_sandbox_is_ready_while_containers_are_created() {
        let creating =
            PodProgress::Pending { step: Step::Containers, message: "app".into(), error: false };
        let status = pod_status(None, &creating, &at(0));
        assert_eq!(condition(&status, "PodReadyToStartContainers").status, "True");
        assert_eq!(condition(&status, "ContainersReady").status, "False");
    }

    #[test]
    fn claim_statuses_are_kept() {
        let previous = PodStatus {
            resource_claim_statuses: Some(vec![
                k8s_openapi::api::core::v1::PodResourceClaimStatus {
                    name: "net".into(),
                    resource_claim_name: Some("p-net-abcde".into()),
                },
            ]),
            ..PodStatus::default()
        };
        let status = pod_status(Some(&previous), &PodProgress::Running, &at(0));
        assert_eq!(status.resource_claim_statuses, previous.resource_claim_statuses);
    }
}
