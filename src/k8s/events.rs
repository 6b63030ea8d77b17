//! Kubernetes Events about the node (events.k8s.io/v1), where `kubectl describe node` shows
//! them.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Records Events on this node's Node object.
#[derive(Clone)]
pub struct NodeEvents {
    recorder: Recorder,
    node: ObjectReference,
}

impl NodeEvents {
    /// A recorder reporting as `driver` on `node` (uid when known).
    #[must_use]
    pub fn new(client: Client, driver: &str, node: &str, node_uid: Option<String>) -> Self {
        let reporter = Reporter { controller: driver.to_owned(), instance: Some(node.to_owned()) };
        let node = ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(node.to_owned()),
            uid: node_uid,
            ..ObjectReference::default()
        };
        Self { recorder: Recorder::new(client, reporter), node }
    }

    /// Publishes a Warning; failures are logged, never fatal (an Event is a courtesy).
    pub async fn warn(&self, reason: &str, action: &str, note: String) {
        let event = Event {
            type_: EventType::Warning,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, &self.node).await {
            tracing::warn!(%err, reason, "could not record an Event on the Node");
        }
    }
}

impl crate::inventory::publish::WarningSink for NodeEvents {
    async fn warn(&self, reason: &str, action: &str, note: String) {
        NodeEvents::warn(self, reason, action, note).await;
    }
}
