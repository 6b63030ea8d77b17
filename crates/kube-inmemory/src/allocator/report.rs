//! What the dev allocator reports about a pod it cannot place, as kube-scheduler does: the
//! Pod's `PodScheduled` condition (`False`, reason `Unschedulable`, the message; `True` once
//! the pod is bound) and a Warning `FailedScheduling` Event (events.k8s.io/v1, which
//! `kubectl describe pod` and `kubectl get events` show through core/v1).
//!
//! Repeated attempts are one Event with a growing `series.count`, as client-go's event
//! recorder aggregates them, not an Event per pass. An attempt counts when kube-scheduler
//! would have retried the pod: something it watches changed (DeviceClasses, ResourceSlices,
//! ResourceClaims, Nodes: the caller's `world` signature), or [`UNSCHEDULABLE_FLUSH`] passed
//! (its `podMaxInUnschedulablePodsDuration`). The allocator's 2-second safety pass alone
//! counts nothing. When the message changes a new Event is written: client-go would keep
//! the first message in the series, which would then describe a reason that no longer holds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// kube-scheduler's `podMaxInUnschedulablePodsDuration`: an unschedulable pod is retried at
/// least this often even when nothing it waits for changed.
pub const UNSCHEDULABLE_FLUSH: Duration = Duration::from_mins(5);
/// The Event's reason and the condition's, as kube-scheduler writes them.
pub const EVENT_REASON: &str = "FailedScheduling";
/// `PodScheduled` reason of a pod no node fits.
pub const CONDITION_REASON: &str = "Unschedulable";

/// The Event series of one pod.
struct Series {
    /// The Event's name.
    name: String,
    /// Its message.
    note: String,
    /// Attempts counted.
    count: i32,
    /// The world signature of the last counted attempt.
    world: u64,
    /// When the last attempt was counted.
    at: Instant,
}

/// Writes the condition and Events of pods that cannot be placed.
pub(super) struct SchedulingReporter {
    client: Client,
    controller: String,
    instance: String,
    /// By Pod UID.
    series: Mutex<HashMap<String, Series>>,
}

fn reference(pod: &Pod) -> ObjectReference {
    // No resourceVersion: the Event is about the pod, not one version of it (our own
    // condition write would otherwise make every attempt look like another object).
    ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Pod".to_owned()),
        name: pod.metadata.name.clone(),
        namespace: pod.metadata.namespace.clone(),
        uid: pod.metadata.uid.clone(),
        ..ObjectReference::default()
    }
}

fn scheduled_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")
}

impl SchedulingReporter {
    pub(super) fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            client,
            controller: controller.to_owned(),
            instance: instance.to_owned(),
            series: Mutex::default(),
        }
    }

    /// An attempt to place `pod` failed with `message` while the watched objects had the
    /// signature `world`. Failures to write are logged, never fatal.
    pub(super) async fn unschedulable(&self, pod: &Pod, message: &str, world: u64) {
        self.write_condition(pod, "False", Some(message)).await;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let now = Instant::now();
        // (Some(name), n): attempt n of the series `name`; (None, 1): a new Event.
        let decision = {
            let series = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match series.get(&uid) {
                Some(s) if s.note == message => (s.world != world
                    || now.duration_since(s.at) >= UNSCHEDULABLE_FLUSH)
                    .then(|| (Some(s.name.clone()), s.count + 1)),
                _ => Some((None, 1)),
            }
        };
        let Some((existing, count)) = decision else { return };
        let written = if let Some(name) = existing {
            self.count_attempt(pod, name, count).await
        } else {
            self.create_event(pod, message).await
        };
        match written {
            Ok(name) => {
                let mut series =
                    self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                let entry = Series { name, note: message.to_owned(), count, world, at: now };
                series.insert(uid, entry);
            }
            Err(error) => tracing::warn!(%error, "could not record a FailedScheduling Event"),
        }
    }

    /// Sets the series of Event `name` to `count` attempts, last seen now.
    async fn count_attempt(&self, pod: &Pod, name: String, count: i32) -> kube::Result<String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let stamp = MicroTime(Timestamp::now());
        let patch = serde_json::json!({"series": {"count": count, "lastObservedTime": stamp}});
        Api::<Event>::namespaced(self.client.clone(), namespace)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| name)
    }

    /// Creates a new `FailedScheduling` Event on `pod`; returns its name.
    async fn create_event(&self, pod: &Pod, message: &str) -> kube::Result<String> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let stamp = MicroTime(Timestamp::now());
        let event = Event {
            metadata: ObjectMeta {
                // client-go's naming: the object's name and the time in hex.
                name: Some(format!("{pod_name}.{:x}", stamp.0.as_nanosecond())),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            event_time: Some(stamp),
            action: Some("Scheduling".to_owned()),
            reason: Some(EVENT_REASON.to_owned()),
            note: Some(message.to_owned()),
            type_: Some("Warning".to_owned()),
            regarding: Some(reference(pod)),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await
            .map(|e| e.metadata.name.unwrap_or_default())
    }

    /// `pod` was bound: `PodScheduled` turns True if it said otherwise (the binding
    /// subresource does this on a real API server), and its series ends.
    pub(super) async fn scheduled(&self, pod: &Pod) {
        self.forget(pod.metadata.uid.as_deref().unwrap_or_default());
        if scheduled_condition(pod).is_some_and(|c| c.status != "True") {
            self.write_condition(pod, "True", None).await;
        }
    }

    /// Ends the series of every pod whose UID `keep` rejects (bound, deleted, or placeable).
    pub(super) fn retain(&self, keep: impl Fn(&str) -> bool) {
        let mut series = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        series.retain(|uid, _| keep(uid));
    }

    fn forget(&self, uid: &str) {
        let mut series = self.series.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        series.remove(uid);
    }

    /// Writes `PodScheduled` unless it already says this (`lastTransitionTime` moves only
    /// with the status, as the scheduler's condition update keeps it).
    async fn write_condition(&self, pod: &Pod, status: &str, message: Option<&str>) {
        let current = scheduled_condition(pod);
        let reason = (status == "False").then_some(CONDITION_REASON);
        if current.is_some_and(|c| {
            c.status == status && c.reason.as_deref() == reason && c.message.as_deref() == message
        }) {
            return;
        }
        let transition = match current {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => Some(Time(Timestamp::now())),
        };
        // Strategic merge: conditions merge by `type`, so a kubelet's conditions written
        // since our read stay.
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "PodScheduled",
            "status": status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": transition,
        }]}});
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        if let Err(error) = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            tracing::warn!(%error, pod = %name, "could not write the pod's PodScheduled condition");
        }
    }
}
