//! The object store: every object of every resource in memory, the registry of served
//! resources, one global resourceVersion counter, and a bounded history of change events
//! that watches resume from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use serde_json::Value;
use tokio::sync::watch;

use super::resources::{Registry, ResourceInfo, StorageId};

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// Object created.
    Added,
    /// Object changed.
    Modified,
    /// Object removed.
    Deleted,
}

/// One change, kept in the history for watchers.
#[derive(Debug, Clone)]
pub(crate) struct ChangeEvent {
    /// The resourceVersion the change produced.
    pub(crate) rv: u64,
    /// The store of the resource.
    pub(crate) resource: StorageId,
    /// What happened.
    pub(crate) kind: EventType,
    /// The object after the change (for deletes: the final state).
    pub(crate) object: Arc<Value>,
    /// The object before the change (selector transitions need it).
    pub(crate) previous: Option<Arc<Value>>,
    /// JSON size of `object`, for the history byte budget.
    pub(crate) size: usize,
}

/// Bounds of the change history.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HistoryLimits {
    /// Most events kept.
    pub(crate) events: usize,
    /// Most bytes kept, counting each event's object at its JSON size. Old object
    /// versions stay alive only through the history, so this bounds their memory.
    pub(crate) bytes: usize,
}

/// Key of an object: (namespace or "", name).
pub(crate) type ObjectKey = (String, String);

struct Inner {
    rv: u64,
    registry: Registry,
    objects: HashMap<StorageId, BTreeMap<ObjectKey, Arc<Value>>>,
    history: VecDeque<ChangeEvent>,
    history_bytes: usize,
    /// Highest resourceVersion whose event left the history; watches from an older
    /// version get 410 Gone.
    dropped_through: u64,
}

/// The in-memory store shared by all request handlers.
pub(crate) struct Store {
    inner: Mutex<Inner>,
    rv_tx: watch::Sender<u64>,
    limits: HistoryLimits,
}

/// Bytes of the compact JSON form of `v`, counted without allocating it.
fn json_size(v: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    // Writing into a counter cannot fail, and a Value always serialises.
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A read-write transaction under the store lock. Changes are visible to readers and
/// watchers when it ends.
pub(crate) struct Txn<'a> {
    inner: MutexGuard<'a, Inner>,
    limits: HistoryLimits,
    dry_run: bool,
    changed: bool,
}

impl Txn<'_> {
    /// The current global resourceVersion.
    pub(crate) fn rv(&self) -> u64 {
        self.inner.rv
    }

    /// The registry of served resources.
    pub(crate) fn registry(&self) -> &Registry {
        &self.inner.registry
    }

    /// The registry, to install or remove custom resources. In a dry run the changes
    /// are not made.
    pub(crate) fn registry_mut(&mut self) -> Option<&mut Registry> {
        if self.dry_run {
            return None;
        }
        self.changed = true;
        Some(&mut self.inner.registry)
    }

    /// The stored object, if any.
    pub(crate) fn get(&self, resource: &ResourceInfo, key: &ObjectKey) -> Option<Arc<Value>> {
        self.inner.objects.get(&resource.storage)?.get(key).cloned()
    }

    /// Number of objects of a resource.
    pub(crate) fn count(&self, resource: &ResourceInfo) -> usize {
        self.inner.objects.get(&resource.storage).map_or(0, BTreeMap::len)
    }

    /// Drops the objects of a store that is no longer served (their DELETED events were
    /// recorded already).
    pub(crate) fn drop_storage(&mut self, storage: StorageId) {
        if !self.dry_run {
            self.inner.objects.remove(&storage);
        }
    }

    /// All objects of a resource, optionally in one namespace, in key order.
    pub(crate) fn list(&self, resource: &ResourceInfo, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let Some(map) = self.inner.objects.get(&resource.storage) else {
            return Vec::new();
        };
        match namespace {
            Some(ns) => map
                .range((ns.to_owned(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => map.values().cloned().collect(),
        }
    }

    fn record(&mut self, event: ChangeEvent) {
        self.inner.history_bytes += event.size;
        self.inner.history.push_back(event);
        while self.inner.history.len() > self.limits.events
            || (self.inner.history_bytes > self.limits.bytes && self.inner.history.len() > 1)
        {
            if let Some(old) = self.inner.history.pop_front() {
                self.inner.history_bytes -= old.size;
                self.inner.dropped_through = old.rv;
            }
        }
    }

    /// Stores `object` (stamping a new resourceVersion) and records ADDED or MODIFIED.
    /// In a dry run nothing is stored and the version is not advanced.
    pub(crate) fn put(
        &mut self,
        resource: &ResourceInfo,
        key: ObjectKey,
        mut object: Value,
    ) -> Arc<Value> {
        let rv = self.inner.rv + 1;
        object["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let object = Arc::new(object);
        if self.dry_run {
            return object;
        }
        self.inner.rv = rv;
        self.changed = true;
        let idx = resource.storage;
        let previous = self.inner.objects.entry(idx).or_default().insert(key, object.clone());
        let size = json_size(&object);
        let kind = if previous.is_some() { EventType::Modified } else { EventType::Added };
        self.record(ChangeEvent {
            rv,
            resource: idx,
            kind,
            object: object.clone(),
            previous,
            size,
        });
        object
    }

    /// Removes the object and records DELETED with `final_state` (stamped with a new
    /// resourceVersion, as the real server does).
    pub(crate) fn remove(
        &mut self,
        resource: &ResourceInfo,
        key: &ObjectKey,
        mut final_state: Value,
    ) -> Arc<Value> {
        let rv = self.inner.rv + 1;
        final_state["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        let object = Arc::new(final_state);
        if self.dry_run {
            return object;
        }
        self.inner.rv = rv;
        self.changed = true;
        let idx = resource.storage;
        let previous = self.inner.objects.get_mut(&idx).and_then(|m| m.remove(key));
        let size = json_size(&object);
        self.record(ChangeEvent {
            rv,
            resource: idx,
            kind: EventType::Deleted,
            object: object.clone(),
            previous,
            size,
        });
        object
    }
}

/// Why a watch cannot resume.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expired {
    /// The oldest resourceVersion a watch can still start from.
    pub(crate) oldest: u64,
}

/// Why a watch stops.
#[derive(Debug, Clone, Copy)]
pub(crate) enum WatchEnd {
    /// The history no longer reaches back to the watcher's version.
    Expired(Expired),
    /// The resource is no longer served (its definition was deleted).
    Removed,
}

impl Store {
    /// An empty store whose change history stays within `limits`.
    pub(crate) fn new(limits: HistoryLimits) -> Self {
        let (rv_tx, _) = watch::channel(1);
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                registry: Registry::new(),
                objects: HashMap::new(),
                history: VecDeque::new(),
                history_bytes: 0,
                dropped_through: 0,
            }),
            rv_tx,
            limits: HistoryLimits { events: limits.events.max(1), bytes: limits.bytes },
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every mutation is a
        // single insert/remove), so poisoning is not a reason to stop serving.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `f` under the lock; watchers are woken if it changed anything.
    pub(crate) fn transact<T>(&self, dry_run: bool, f: impl FnOnce(&mut Txn<'_>) -> T) -> T {
        let mut txn = Txn { inner: self.lock(), limits: self.limits, dry_run, changed: false };
        let out = f(&mut txn);
        let changed = txn.changed;
        let rv = txn.inner.rv;
        drop(txn);
        if changed {
            self.rv_tx.send_replace(rv);
        }
        out
    }

    /// A receiver that changes whenever the global resourceVersion advances.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.rv_tx.subscribe()
    }

    /// Events of `resource` after `since`, and the version they bring the caller to.
    /// A store that is no longer served ends the watch once its last events (the
    /// deletions of its objects) were handed out.
    pub(crate) fn events_since(
        &self,
        resource: StorageId,
        since: u64,
    ) -> Result<(Vec<ChangeEvent>, u64), WatchEnd> {
        let inner = self.lock();
        if since < inner.dropped_through {
            return Err(WatchEnd::Expired(Expired { oldest: inner.dropped_through }));
        }
        let start = inner.history.partition_point(|e| e.rv <= since);
        let events: Vec<ChangeEvent> =
            inner.history.range(start..).filter(|e| e.resource == resource).cloned().collect();
        if events.is_empty() && !inner.registry.has_storage(resource) {
            return Err(WatchEnd::Removed);
        }
        Ok((events, inner.rv.max(since)))
    }

    /// Runs `f` on the registry of served resources.
    pub(crate) fn with_registry<T>(&self, f: impl FnOnce(&Registry) -> T) -> T {
        f(&self.lock().registry)
    }

    /// Whether a watch could start at `since`.
    pub(crate) fn check_resumable(&self, since: u64) -> Result<(), Expired> {
        let inner = self.lock();
        if since < inner.dropped_through {
            Err(Expired { oldest: inner.dropped_through })
        } else {
            Ok(())
        }
    }

    /// The current global resourceVersion.
    pub(crate) fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Number of events held in the history (for tests of the memory bound).
    #[cfg(test)]
    pub(crate) fn history_len(&self) -> usize {
        self.lock().history.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pods() -> Arc<ResourceInfo> {
        super::super::resources::built_in_resource("", "v1", "pods").unwrap()
    }

    #[test]
    fn history_is_bounded_and_old_versions_expire() {
        let store = Store::new(HistoryLimits { events: 3, bytes: usize::MAX });
        for i in 0..5 {
            store.transact(false, |t| {
                t.put(
                    &pods(),
                    ("ns".into(), format!("p{i}")),
                    json!({"metadata": {"name": format!("p{i}")}}),
                );
            });
        }
        assert_eq!(store.history_len(), 3);
        assert_eq!(store.current_rv(), 6);
        // Events with rv 2 and 3 were dropped: resuming from 2 would miss rv 3.
        assert!(store.events_since(pods().storage, 2).is_err());
        let (events, rv) = store.events_since(pods().storage, 3).unwrap();
        assert_eq!(events.iter().map(|e| e.rv).collect::<Vec<_>>(), vec![4, 5, 6]);
        assert_eq!(rv, 6);
    }

    #[test]
    fn history_byte_budget_drops_old_events() {
        let store = Store::new(HistoryLimits { events: 1000, bytes: 2000 });
        let big = "x".repeat(900);
        for i in 0..5 {
            store.transact(false, |t| {
                t.put(&pods(), ("ns".into(), format!("p{i}")), json!({"metadata": {"name": big}}));
            });
        }
        assert_eq!(store.history_len(), 2);
        assert!(store.events_since(pods().storage, 3).is_err());
        assert!(store.events_since(pods().storage, 4).is_ok());
    }

    #[test]
    fn dry_run_changes_nothing() {
        let store = Store::new(HistoryLimits { events: 10, bytes: usize::MAX });
        let obj = store
            .transact(true, |t| t.put(&pods(), ("ns".into(), "a".into()), json!({"metadata": {}})));
        assert_eq!(obj["metadata"]["resourceVersion"], "2");
        assert_eq!(store.current_rv(), 1);
        assert!(store.transact(false, |t| t.list(&pods(), None)).is_empty());
    }

    #[test]
    fn namespace_listing_is_exact() {
        let store = Store::new(HistoryLimits { events: 10, bytes: usize::MAX });
        store.transact(false, |t| {
            for (ns, n) in [("a", "x"), ("ab", "y"), ("a", "z"), ("b", "w")] {
                t.put(&pods(), (ns.into(), n.into()), json!({"metadata": {"name": n}}));
            }
        });
        let names: Vec<_> = store
            .transact(false, |t| t.list(&pods(), Some("a")))
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(names, vec!["x", "z"]);
    }
}
