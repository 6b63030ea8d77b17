//! Field ownership (`metadata.managedFields`) and server-side apply: merging an applied
//! configuration, detecting conflicts with other managers, and removing fields a manager
//! stopped applying.

use serde_json::{Value, json};

use super::fieldset::{self, FieldSet};
use super::resources::ResourceInfo;

/// `Apply` or `Update`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Server-side apply.
    Apply,
    /// Create, update or non-apply patch.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Self::Apply => "Apply",
            Self::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    manager: String,
    operation: String,
    subresource: String,
    api_version: String,
    time: String,
    set: FieldSet,
}

fn parse_entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .map(|e| Entry {
                    manager: str_field(e, "manager"),
                    operation: str_field(e, "operation"),
                    subresource: str_field(e, "subresource"),
                    api_version: str_field(e, "apiVersion"),
                    time: str_field(e, "time"),
                    set: FieldSet::from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
                })
                .collect()
        })
        .unwrap_or_default()
}

fn str_field(v: &Value, k: &str) -> String {
    v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn render_entries(entries: &[Entry]) -> Value {
    Value::Array(
        entries
            .iter()
            .filter(|e| !e.set.is_empty())
            .map(|e| {
                let mut v = json!({
                    "manager": e.manager,
                    "operation": e.operation,
                    "apiVersion": e.api_version,
                    "time": e.time,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": e.set.to_fields_v1(),
                });
                if !e.subresource.is_empty() {
                    v["subresource"] = Value::String(e.subresource.clone());
                }
                v
            })
            .collect(),
    )
}

/// Who is writing: manager name, operation and subresource (`""` or `status`).
pub(crate) struct Writer<'a> {
    /// Field manager name.
    pub(crate) manager: &'a str,
    /// Apply or Update.
    pub(crate) operation: Operation,
    /// `""` for the main resource, `"status"` for `/status`.
    pub(crate) subresource: &'a str,
    /// Timestamp for changed entries.
    pub(crate) now: &'a str,
}

impl Writer<'_> {
    fn matches(&self, e: &Entry) -> bool {
        e.manager == self.manager
            && e.operation == self.operation.as_str()
            && e.subresource == self.subresource
    }
}

/// Sets `new.metadata.managedFields` after a create, update or non-apply patch from `old`
/// to `new`: the writer gains every field it changed, other managers lose them, and
/// removed fields leave every set.
pub(crate) fn record_update(
    resource: &ResourceInfo,
    old: Option<&Value>,
    new: &mut Value,
    writer: &Writer<'_>,
) {
    let mut entries = old.map(parse_entries).unwrap_or_default();
    let new_set = fieldset::set_from_value(resource, new);
    let old_set = old.map(|o| fieldset::set_from_value(resource, o)).unwrap_or_default();
    // A write owns only the fields of its endpoint: `/status` the status, the main endpoint
    // everything else when the kind has a status subresource (the server resets or keeps
    // the status itself; the writer did not set it).
    let in_scope = |path: &[String]| {
        let is_status = path.first().is_some_and(|p| p == "f:status");
        if writer.subresource == "status" { is_status } else { !(resource.has_status && is_status) }
    };
    let mut changed = Vec::new();
    for path in new_set.members().into_iter().filter(|p| in_scope(p)) {
        let is_item = new_set.has_children(&path);
        let was = old.and_then(|o| fieldset::value_at(resource, o, &path));
        let now = fieldset::value_at(resource, new, &path);
        let differs = if is_item { was.is_none() } else { was != now };
        if differs {
            changed.push(path);
        }
    }
    let removed: Vec<Vec<String>> =
        old_set.members().into_iter().filter(|p| !new_set.contains(p)).collect();
    let before = entries.clone();
    for e in &mut entries {
        for p in changed.iter().chain(&removed) {
            e.set.remove(p);
        }
    }
    if !changed.is_empty() {
        let api_version = resource.api_version();
        let idx = if let Some(i) = entries.iter().position(|e| writer.matches(e)) {
            i
        } else {
            entries.push(Entry {
                manager: writer.manager.to_owned(),
                operation: writer.operation.as_str().to_owned(),
                subresource: writer.subresource.to_owned(),
                api_version,
                time: writer.now.to_owned(),
                set: FieldSet::default(),
            });
            entries.len() - 1
        };
        for p in &changed {
            entries[idx].set.insert(p);
        }
    }
    touch_changed(&before, &mut entries, writer.now);
    new["metadata"]["managedFields"] = render_entries(&entries);
}

/// Gives entries whose set changed the current time (unchanged entries keep theirs, so a
/// no-op write stays byte-identical and is not stored).
fn touch_changed(before: &[Entry], entries: &mut [Entry], now: &str) {
    for e in entries {
        let same = before.iter().any(|b| {
            b.manager == e.manager
                && b.operation == e.operation
                && b.subresource == e.subresource
                && b.set == e.set
        });
        if !same {
            now.clone_into(&mut e.time);
        }
    }
}

/// The outcome of an apply: the new object, or conflicts `(manager, field path)`.
pub(crate) enum ApplyOutcome {
    /// The merged object (managedFields set).
    Applied(Value),
    /// Fields owned by other managers whose values the apply would change.
    Conflicts(Vec<(String, String)>),
}

/// Value equality as server-side apply sees it: numbers compare by value, an integer equal
/// to a float (`1` and `1.0`) as upstream's structured-merge-diff compares them. A client
/// that decodes a schema into typed structs re-encodes `minimum: 1` as `1.0`; exact JSON
/// equality made the same value a conflict.
fn same_value(a: Option<&Value>, b: Option<&Value>) -> bool {
    fn eq(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => {
                x == y || ((x.is_f64() || y.is_f64()) && x.as_f64() == y.as_f64())
            }
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(x, y)| eq(x, y))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| eq(v, w)))
            }
            _ => a == b,
        }
    }
    match (a, b) {
        (Some(a), Some(b)) => eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Server-side apply of `applied` (already restricted to the subresource's fields) onto
/// `live` (`None`: the object is being created).
pub(crate) fn apply(
    resource: &ResourceInfo,
    live: Option<&Value>,
    applied: &Value,
    writer: &Writer<'_>,
    force: bool,
) -> ApplyOutcome {
    let empty = json!({});
    let live_v = live.unwrap_or(&empty);
    let mut entries = parse_entries(live_v);
    let before = entries.clone();
    let new_set = fieldset::set_from_value(resource, applied);
    let me = entries.iter().position(|e| writer.matches(e));
    let previous = me.map(|i| entries[i].set.clone()).unwrap_or_default();

    // Conflicts: a field another manager owns whose value this apply changes.
    let mut conflicts = Vec::new();
    let mut conflict_paths = Vec::new();
    for path in new_set.members() {
        if new_set.has_children(&path) {
            continue;
        }
        let live_val = fieldset::value_at(resource, live_v, &path);
        let applied_val = fieldset::value_at(resource, applied, &path);
        if same_value(live_val, applied_val) {
            continue;
        }
        for (i, e) in entries.iter().enumerate() {
            if Some(i) != me && e.set.contains(&path) {
                conflicts.push((e.manager.clone(), fieldset::display_path(&path)));
                conflict_paths.push(path.clone());
            }
        }
    }
    if !conflicts.is_empty() && !force {
        return ApplyOutcome::Conflicts(conflicts);
    }
    for e in &mut entries {
        for p in &conflict_paths {
            e.set.remove(p);
        }
    }

    let mut merged = fieldset::merge(resource, live_v, applied, "");
    // Fields this manager applied before, applies no more, and nobody else owns.
    let others = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != me)
        .fold(FieldSet::default(), |acc, (_, e)| acc.union(&e.set));
    let mut to_remove: Vec<Vec<String>> = previous
        .members()
        .into_iter()
        // Not a field another manager owns, nor one holding fields another manager owns
        // (a manager that once applied `labels: {}` must not take others' labels away).
        .filter(|p| !new_set.contains(p) && !others.contains(p) && !others.has_children(p))
        .collect();
    // Shallowest first: removing a list item takes its fields with it, whereas removing
    // a key field first would make the item unfindable.
    to_remove.sort_by_key(Vec::len);
    for p in &to_remove {
        fieldset::remove_at(&mut merged, p, &|q| fieldset::key_fields_for(resource, q));
    }
    fieldset::strip_nulls(&mut merged);

    match me {
        Some(i) => entries[i].set = new_set,
        None => entries.push(Entry {
            manager: writer.manager.to_owned(),
            operation: writer.operation.as_str().to_owned(),
            subresource: writer.subresource.to_owned(),
            api_version: resource.api_version(),
            time: writer.now.to_owned(),
            set: new_set,
        }),
    }
    touch_changed(&before, &mut entries, writer.now);
    if merged.get("metadata").is_none() {
        merged["metadata"] = json!({});
    }
    merged["metadata"]["managedFields"] = render_entries(&entries);
    ApplyOutcome::Applied(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims() -> std::sync::Arc<ResourceInfo> {
        super::super::resources::built_in_resource("resource.k8s.io", "v1", "resourceclaims")
            .unwrap()
    }

    fn w(manager: &str, op: Operation) -> Writer<'_> {
        Writer { manager, operation: op, subresource: "status", now: "2026-01-01T00:00:00Z" }
    }

    fn applied(devices: &Value) -> Value {
        json!({"status": {"devices": devices}})
    }

    fn unwrap(o: ApplyOutcome) -> Value {
        match o {
            ApplyOutcome::Applied(v) => v,
            ApplyOutcome::Conflicts(c) => panic!("unexpected conflicts {c:?}"),
        }
    }

    #[test]
    fn two_managers_own_their_entries_and_removal_is_per_manager() {
        let live = json!({"metadata": {"name": "c"}, "status": {}});
        let a1 = applied(
            &json!([{"driver": "a", "pool": "p", "device": "x", "data": {"v": 1}}, {"driver": "a", "pool": "p", "device": "y"}]),
        );
        let o1 = unwrap(apply(&claims(), Some(&live), &a1, &w("a", Operation::Apply), false));
        let b1 = applied(&json!([{"driver": "b", "pool": "p", "device": "z"}]));
        let o2 = unwrap(apply(&claims(), Some(&o1), &b1, &w("b", Operation::Apply), false));
        assert_eq!(o2["status"]["devices"].as_array().unwrap().len(), 3);
        // Manager a stops applying y: only y goes; b's z stays.
        let a2 = applied(&json!([{"driver": "a", "pool": "p", "device": "x", "data": {"v": 2}}]));
        let o3 = unwrap(apply(&claims(), Some(&o2), &a2, &w("a", Operation::Apply), false));
        let names: Vec<&str> = o3["status"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["device"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["x", "z"]);
        assert_eq!(o3["status"]["devices"][0]["data"], json!({"v": 2}));
        assert_eq!(o3["metadata"]["managedFields"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn conflict_unless_forced_or_same_value() {
        let live = json!({"metadata": {"name": "c"}});
        let a = applied(&json!([{"driver": "a", "pool": "p", "device": "x", "data": {"v": 1}}]));
        let o1 = unwrap(apply(&claims(), Some(&live), &a, &w("a", Operation::Apply), false));
        // Same value from another manager: shared ownership, no conflict.
        let o2 = unwrap(apply(&claims(), Some(&o1), &a, &w("b", Operation::Apply), false));
        let changed =
            applied(&json!([{"driver": "a", "pool": "p", "device": "x", "data": {"v": 9}}]));
        match apply(&claims(), Some(&o2), &changed, &w("c", Operation::Apply), false) {
            ApplyOutcome::Conflicts(c) => {
                let managers: Vec<&str> = c.iter().map(|(m, _)| m.as_str()).collect();
                assert_eq!(managers, vec!["a", "b"]);
                assert!(c[0].1.rsplit('.').next() == Some("data"), "{}", c[0].1);
            }
            ApplyOutcome::Applied(_) => panic!("expected a conflict"),
        }
        let forced = unwrap(apply(&claims(), Some(&o2), &changed, &w("c", Operation::Apply), true));
        assert_eq!(forced["status"]["devices"][0]["data"], json!({"v": 9}));
    }

    #[test]
    fn dropping_an_empty_map_keeps_entries_owned_by_others() {
        let live = json!({"metadata": {"name": "c"}});
        let a = json!({"metadata": {"labels": {}}});
        let main =
            |m| Writer { manager: m, operation: Operation::Apply, subresource: "", now: "t" };
        let o1 = unwrap(apply(&claims(), Some(&live), &a, &main("a"), false));
        let o2 = unwrap(apply(
            &claims(),
            Some(&o1),
            &json!({"metadata": {"labels": {"x": "1"}}}),
            &main("b"),
            false,
        ));
        let o3 = unwrap(apply(&claims(), Some(&o2), &json!({}), &main("a"), false));
        assert_eq!(o3["metadata"]["labels"], json!({"x": "1"}));
    }

    #[test]
    fn update_takes_ownership() {
        let old = json!({"metadata": {"name": "c", "labels": {"a": "1"}}});
        let mut created = old.clone();
        record_update(
            &claims(),
            None,
            &mut created,
            &Writer { manager: "m1", operation: Operation::Update, subresource: "", now: "t" },
        );
        let mut new = created.clone();
        new["metadata"]["labels"]["a"] = json!("2");
        new["metadata"]["labels"]["b"] = json!("3");
        record_update(
            &claims(),
            Some(&created),
            &mut new,
            &Writer { manager: "m2", operation: Operation::Update, subresource: "", now: "t2" },
        );
        let mf = new["metadata"]["managedFields"].as_array().unwrap();
        assert_eq!(mf.len(), 1, "{mf:?}");
        assert_eq!(mf[0]["manager"], "m2");
        assert_eq!(mf[0]["fieldsV1"], json!({"f:metadata": {"f:labels": {"f:a": {}, "f:b": {}}}}));
    }
}
