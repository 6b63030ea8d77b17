//! Watch streams: newline-delimited JSON events from a resourceVersion, with selector
//! transitions, bookmarks, initial events, `timeoutSeconds` and 410 Gone for versions older
//! than the kept history.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::resources::ResourceInfo;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{EventType, Store, WatchEnd};
use super::table;

/// What a watch filters and how it starts.
pub(crate) struct WatchRequest {
    /// The resource watched.
    pub(crate) resource: Arc<ResourceInfo>,
    /// Only this namespace, if set.
    pub(crate) namespace: Option<String>,
    /// Label filter.
    pub(crate) labels: LabelSelector,
    /// Field filter.
    pub(crate) fields: FieldSelector,
    /// Start after this version; `None` ("" or "0"): send the current objects first.
    pub(crate) since: Option<u64>,
    /// `sendInitialEvents=true`: current objects first, then a bookmark marking their end.
    pub(crate) send_initial_events: bool,
    /// `allowWatchBookmarks`.
    pub(crate) bookmarks: bool,
    /// How often to send a bookmark when idle.
    pub(crate) bookmark_interval: Duration,
    /// When the stream ends.
    pub(crate) timeout: Duration,
    /// Render objects as Tables (kubectl get -w).
    pub(crate) as_table: bool,
}

impl WatchRequest {
    fn matches(&self, obj: &Value) -> bool {
        let ns_ok = self.namespace.as_deref().is_none_or(|ns| {
            obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
        });
        ns_ok && self.labels.matches(obj) && self.fields.matches(obj)
    }

    fn event(&self, kind: &str, obj: &Value) -> String {
        let obj = self.resource.present(obj);
        let object = if self.as_table {
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            table::table(&self.resource, &[&obj], rv, false)
        } else {
            obj.into_owned()
        };
        let mut line = json!({"type": kind, "object": object}).to_string();
        line.push('\n');
        line
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> String {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.resource.kind, "apiVersion": self.resource.api_version(), "metadata": meta});
        let mut line = json!({"type": "BOOKMARK", "object": obj}).to_string();
        line.push('\n');
        line
    }
}

fn expired_line(since: u64, oldest: u64) -> String {
    let status =
        ApiError::gone(format!("too old resource version: {since} ({oldest})")).to_status();
    let mut line = json!({"type": "ERROR", "object": status}).to_string();
    line.push('\n');
    line
}

/// Runs a watch, sending lines into `tx` until the timeout, the client leaving, the
/// server shutting down, or the history no longer covering the watcher (ERROR 410).
pub(crate) async fn run(
    store: Arc<Store>,
    req: WatchRequest,
    tx: mpsc::Sender<String>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let deadline = tokio::time::Instant::now() + req.timeout;
    let mut rv_rx = store.subscribe();
    let mut cursor = match req.since {
        Some(rv) if !req.send_initial_events => {
            if let Err(e) = store.check_resumable(rv) {
                let _ = tx.send(expired_line(rv, e.oldest)).await;
                return;
            }
            rv
        }
        _ => {
            let (objects, rv) = store
                .transact(false, |t| (t.list(&req.resource, req.namespace.as_deref()), t.rv()));
            for o in objects.iter().filter(|o| req.matches(o)) {
                if tx.send(req.event("ADDED", o)).await.is_err() {
                    return;
                }
            }
            if req.send_initial_events && tx.send(req.bookmark(rv, true)).await.is_err() {
                return;
            }
            rv
        }
    };
    let idx = req.resource.storage;
    let mut bookmark_tick = tokio::time::interval_at(
        tokio::time::Instant::now() + req.bookmark_interval,
        req.bookmark_interval,
    );
    loop {
        match store.events_since(idx, cursor) {
            Err(WatchEnd::Expired(e)) => {
                let _ = tx.send(expired_line(cursor, e.oldest)).await;
                return;
            }
            // The definition of a custom resource was deleted: its watches end, as the
            // real server's do when it tears the resource's storage down.
            Err(WatchEnd::Removed) => return,
            Ok((events, rv)) => {
                for ev in events {
                    let now_matches = req.matches(&ev.object);
                    let before_matches = ev.previous.as_deref().is_some_and(|p| req.matches(p));
                    let kind = match ev.kind {
                        EventType::Modified if now_matches && before_matches => Some("MODIFIED"),
                        // Created, or changed so that it now passes the selector.
                        EventType::Added | EventType::Modified if now_matches => Some("ADDED"),
                        EventType::Modified if before_matches => Some("DELETED"),
                        EventType::Deleted if before_matches || now_matches => Some("DELETED"),
                        _ => None,
                    };
                    if let Some(kind) = kind
                        && tx.send(req.event(kind, &ev.object)).await.is_err()
                    {
                        return;
                    }
                }
                cursor = rv;
                // The last events of a resource whose definition was deleted are out.
                if !store.with_registry(|r| r.has_storage(idx)) {
                    return;
                }
            }
        }
        tokio::select! {
            changed = rv_rx.changed() => if changed.is_err() { return },
            () = tokio::time::sleep_until(deadline) => return,
            _ = bookmark_tick.tick(), if req.bookmarks => {
                if tx.send(req.bookmark(cursor, false)).await.is_err() {
                    return;
                }
            }
            () = tx.closed() => return,
            _ = shutdown.changed() => return,
        }
    }
}
