//! The NRI side of the attach service: the sandbox and container events it handles and the
//! event mask the plugin subscribes to.

use std::time::{Duration, Instant};

use nri_rs::{Container, Event, EventMask, HandlerError, PluginHandler, PodSandbox};

use super::shared::{AttachService, Sandbox};
use super::{AttachmentStore, NetnsPort, PodAttachment, PodClaimSource, StatusSink, lock};
use crate::claims::PreparedClaim;

/// How long a `CreateContainer` waits for its pod's reconcile: until just before the call's
/// deadline (the runtime's request timeout minus the plugin's reserve), so the refusal is
/// ours and retryable; the runtime's own timeout would drop the plugin. Outside a plugin call
/// (tests), the default request timeout's deadline.
fn verify_deadline() -> tokio::time::Instant {
    const OWN_ANSWER: Duration = Duration::from_millis(20);
    let deadline = nri_rs::call_deadline().unwrap_or_else(|| {
        tokio::time::Instant::now() + nri_rs::plugin::DEFAULT_REQUEST_TIMEOUT
            - Duration::from_millis(250)
    });
    deadline - OWN_ANSWER
}

/// The events the plugin subscribes to.
#[must_use]
pub fn plugin_events() -> EventMask {
    EventMask::EMPTY
        .with(Event::RunPodSandbox)
        .with(Event::StopPodSandbox)
        .with(Event::RemovePodSandbox)
        .with(Event::CreateContainer)
}

/// Whether an event's sandbox is the one `record` was attached to (an event without an ID
/// is taken to be).
pub(super) fn same_sandbox(record: &PodAttachment, pod: &PodSandbox) -> bool {
    pod.id.is_empty() || record.sandbox_id == pod.id
}

impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> AttachService<C, N, S, W> {
    /// RunPodSandbox and CreateContainer's attach, with status and events on failure.
    async fn attach_and_report(
        &self,
        sandbox: &Sandbox,
        claims: &[PreparedClaim],
        started: Instant,
    ) -> Result<(), HandlerError> {
        self.attach_pod(sandbox, claims, started)
            .await
            .map_err(|err| HandlerError::new(self.report_failure(sandbox, claims, &err)))
    }
}

impl<C: PodClaimSource, N: NetnsPort, S: AttachmentStore, W: StatusSink> PluginHandler
    for AttachService<C, N, S, W>
{
    async fn synchronize(&self, pods: Vec<PodSandbox>) -> Result<(), HandlerError> {
        self.accept_synchronize(pods);
        self.count("Synchronize", true);
        Ok(())
    }

    async fn run_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        let started = Instant::now();
        tracing::debug!(event = %"RunPodSandbox", pod = %pod.uid, netns = ?pod.netns_path, "NRI pod event");
        let sandbox = Sandbox::from_pod(&pod);
        // Read once per event: the same list serves planning, status and failure reports.
        let claims = self.claims.claims_of_pod(&sandbox.uid);
        if sandbox.netns.is_none() && claims.is_empty() {
            // A host-network pod without our claims: nothing to do.
            self.count("RunPodSandbox", true);
            return Ok(());
        }
        let result = self.attach_and_report(&sandbox, &claims, started).await;
        self.count("RunPodSandbox", result.is_ok());
        result
    }

    async fn stop_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        tracing::debug!(event = %"StopPodSandbox", pod = %pod.uid, netns = ?pod.netns_path, "NRI pod event");
        self.stop_pod(&pod).await;
        self.count("StopPodSandbox", true);
        Ok(())
    }

    async fn remove_pod_sandbox(&self, pod: PodSandbox) -> Result<(), HandlerError> {
        tracing::debug!(event = %"RemovePodSandbox", pod = %pod.uid, "NRI pod event");
        self.remove_pod(&pod).await;
        self.count("RemovePodSandbox", true);
        Ok(())
    }

    async fn create_container(
        &self,
        pod: PodSandbox,
        container: Container,
    ) -> Result<(), HandlerError> {
        let started = Instant::now();
        let deadline = verify_deadline();
        if self.unverified(&pod.uid) && !self.wait_verified(&pod.uid, deadline).await {
            self.count("CreateContainer", false);
            return Err(HandlerError::new(format!(
                "container {} of pod {pod} refused for now: the daemon restarted and is still \
                 verifying the pod's network interfaces; the kubelet retries",
                container.name
            )));
        }
        // RunPodSandbox is answered before the attach's completion (claim statuses, the
        // device metadata files a container may read) has run; it holds the pod's gate.
        if tokio::time::timeout_at(deadline, self.gates.hold(&pod.uid)).await.is_err() {
            self.count("CreateContainer", false);
            return Err(HandlerError::new(format!(
                "container {} of pod {pod} refused for now: the pod's network interfaces are \
                 still being set up; the kubelet retries",
                container.name
            )));
        }
        let claims = self.claims.claims_of_pod(&pod.uid);
        if claims.is_empty() || self.covered(&pod.uid, None, &claims) {
            // Bandwidth ceilings before any container of the pod runs (DESIGN §3).
            let result = self.enforce_ceilings(&pod.uid, &claims).await.map_err(|err| {
                HandlerError::new(format!(
                    "container {} of pod {pod} refused: {err}",
                    container.name
                ))
            });
            self.count("CreateContainer", result.is_ok());
            return result;
        }
        let mut sandbox = Sandbox::from_pod(&pod);
        if sandbox.netns.is_none() {
            let inner = lock(&self.inner);
            sandbox.netns = inner
                .sandboxes
                .get(&pod.uid)
                .and_then(|s| s.netns.clone())
                .or_else(|| inner.pods.get(&pod.uid).map(|r| r.netns.clone()));
        }
        let result = if sandbox.netns.is_some() {
            match self.attach_and_report(&sandbox, &claims, started).await {
                Ok(()) => self.enforce_ceilings(&pod.uid, &claims).await.map_err(|err| {
                    HandlerError::new(format!("container {} refused: {err}", container.name))
                }),
                Err(err) => {
                    Err(HandlerError::new(format!("container {} refused: {err}", container.name)))
                }
            }
        } else {
            Err(HandlerError::new(format!(
                "container {} of pod {pod} refused: the pod's network interfaces are not attached \
                 and its network namespace is unknown (waiting for its sandbox)",
                container.name
            )))
        };
        self.count("CreateContainer", result.is_ok());
        result
    }
}
