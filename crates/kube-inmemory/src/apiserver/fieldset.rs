//! Field sets in the `FieldsV1` shape server-side apply records in `managedFields`:
//! a tree of path elements (`f:name`, `k:{"key":"value"}`, `v:value`) whose members are the
//! fields a manager owns.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::resources::{ListType, ResourceInfo};

/// A set of field paths. A node is a member when its owner owns the field itself (a leaf,
/// an atomic value, or a list item, written `"."` in `FieldsV1` when it also has children).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSet {
    member: bool,
    children: BTreeMap<String, FieldSet>,
}

/// Metadata fields the server owns; they are never part of a manager's set.
const SYSTEM_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

impl FieldSet {
    /// Parses a `fieldsV1` object.
    pub(crate) fn from_fields_v1(v: &Value) -> Self {
        let mut set = Self::default();
        let Some(obj) = v.as_object() else { return set };
        if obj.is_empty() {
            set.member = true;
        }
        for (k, child) in obj {
            if k == "." {
                set.member = true;
            } else {
                set.children.insert(k.clone(), Self::from_fields_v1(child));
            }
        }
        set
    }

    /// Renders the `fieldsV1` object.
    pub(crate) fn to_fields_v1(&self) -> Value {
        let mut obj = Map::new();
        if self.member && !self.children.is_empty() {
            obj.insert(".".into(), Value::Object(Map::new()));
        }
        for (k, child) in &self.children {
            obj.insert(k.clone(), child.to_fields_v1());
        }
        Value::Object(obj)
    }

    /// Whether the set has no member.
    pub(crate) fn is_empty(&self) -> bool {
        !self.member && self.children.values().all(Self::is_empty)
    }

    /// Every member path, parents before children.
    pub(crate) fn members(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        self.collect(&mut Vec::new(), &mut out);
        out
    }

    fn collect(&self, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if self.member && !prefix.is_empty() {
            out.push(prefix.clone());
        }
        for (k, child) in &self.children {
            prefix.push(k.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    /// Whether `path` is a member.
    pub(crate) fn contains(&self, path: &[String]) -> bool {
        let mut node = self;
        for el in path {
            match node.children.get(el) {
                Some(child) => node = child,
                None => return false,
            }
        }
        node.member
    }

    /// Whether the member at `path` has member descendants (then it is an item or a
    /// container, not a leaf value).
    pub(crate) fn has_children(&self, path: &[String]) -> bool {
        let mut node = self;
        for el in path {
            match node.children.get(el) {
                Some(child) => node = child,
                None => return false,
            }
        }
        !node.children.is_empty()
    }

    /// Adds `path` as a member.
    pub(crate) fn insert(&mut self, path: &[String]) {
        let mut node = self;
        for el in path {
            node = node.children.entry(el.clone()).or_default();
        }
        node.member = true;
    }

    /// Removes `path` as a member (descendants stay).
    pub(crate) fn remove(&mut self, path: &[String]) {
        fn go(node: &mut FieldSet, path: &[String]) {
            match path.split_first() {
                None => node.member = false,
                Some((first, rest)) => {
                    if let Some(child) = node.children.get_mut(first) {
                        go(child, rest);
                        if child.is_empty() {
                            node.children.remove(first);
                        }
                    }
                }
            }
        }
        go(self, path);
    }

    /// All members of `self` and `other`.
    pub(crate) fn union(&self, other: &Self) -> Self {
        let mut out = self.clone();
        for p in other.members() {
            out.insert(&p);
        }
        out
    }
}

/// The path element of a list-map item: `k:` and the key fields as compact JSON, sorted.
fn key_element(item: &Value, keys: &[String]) -> String {
    let mut key = Map::new();
    let mut names: Vec<&str> = keys.iter().map(String::as_str).collect();
    names.sort_unstable();
    for k in names {
        if let Some(v) = item.get(k) {
            key.insert(k.to_owned(), v.clone());
        }
    }
    format!("k:{}", Value::Object(key))
}

fn value_element(item: &Value) -> String {
    format!("v:{item}")
}

/// Schema path of a child field (`spec.devices`), with `[]` for list items.
fn child_schema(parent: &str, field: &str) -> String {
    if parent.is_empty() { field.to_owned() } else { format!("{parent}.{field}") }
}

/// The fields set in `obj`: every leaf, atomic value and list-map/set item.
pub(crate) fn set_from_value(resource: &ResourceInfo, obj: &Value) -> FieldSet {
    let mut set = FieldSet::default();
    let Some(map) = obj.as_object() else {
        return set;
    };
    for (k, v) in map {
        if k == "apiVersion" || k == "kind" {
            continue;
        }
        let mut child = if k == "metadata" {
            let mut meta = FieldSet::default();
            if let Some(m) = v.as_object() {
                for (mk, mv) in m {
                    if SYSTEM_METADATA.contains(&mk.as_str()) {
                        continue;
                    }
                    meta.children.insert(
                        format!("f:{mk}"),
                        node_set(resource, mv, &format!("metadata.{mk}")),
                    );
                }
            }
            meta
        } else {
            node_set(resource, v, k)
        };
        if k == "metadata" && child.children.is_empty() {
            continue;
        }
        child.member = child.member && k != "metadata";
        set.children.insert(format!("f:{k}"), child);
    }
    set
}

fn node_set(resource: &ResourceInfo, v: &Value, schema: &str) -> FieldSet {
    match v {
        Value::Object(m) if !m.is_empty() && !resource.is_atomic_object(schema) => {
            let mut set = FieldSet::default();
            for (k, child) in m {
                set.children
                    .insert(format!("f:{k}"), node_set(resource, child, &child_schema(schema, k)));
            }
            set
        }
        Value::Array(items) if !items.is_empty() => match resource.list_type(schema) {
            ListType::Atomic => FieldSet { member: true, children: BTreeMap::new() },
            ListType::Set => {
                let mut set = FieldSet::default();
                for item in items {
                    set.children.insert(
                        value_element(item),
                        FieldSet { member: true, children: BTreeMap::new() },
                    );
                }
                set
            }
            ListType::Map(keys) => {
                let mut set = FieldSet::default();
                let item_schema = format!("{schema}[]");
                for item in items {
                    let mut item_set = node_set(resource, item, &item_schema);
                    item_set.member = true;
                    set.children.insert(key_element(item, &keys), item_set);
                }
                set
            }
        },
        _ => FieldSet { member: true, children: BTreeMap::new() },
    }
}

/// The value at a field path, if present.
pub(crate) fn value_at<'a>(
    resource: &ResourceInfo,
    obj: &'a Value,
    path: &[String],
) -> Option<&'a Value> {
    let mut cur = obj;
    for (i, el) in path.iter().enumerate() {
        cur = if let Some(field) = el.strip_prefix("f:") {
            cur.get(field)?
        } else if let Some(key) = el.strip_prefix("k:") {
            let key: Map<String, Value> = serde_json::from_str(key).ok()?;
            let keys = key_fields_for(resource, &path[..=i]);
            cur.as_array()?.iter().find(|item| item_has_key(item, &key, &keys))?
        } else if let Some(val) = el.strip_prefix("v:") {
            let val: Value = serde_json::from_str(val).ok()?;
            cur.as_array()?.iter().find(|item| **item == val)?
        } else {
            return None;
        };
    }
    Some(cur)
}

/// Removes the field, list item or set value at `path` (no-op when absent).
pub(crate) fn remove_at(
    obj: &mut Value,
    path: &[String],
    key_fields: &dyn Fn(&[String]) -> Vec<String>,
) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for (i, el) in parent_path.iter().enumerate() {
        let next = if let Some(field) = el.strip_prefix("f:") {
            cur.get_mut(field)
        } else if let Some(key) = el.strip_prefix("k:") {
            let Ok(key) = serde_json::from_str::<Map<String, Value>>(key) else {
                return;
            };
            let keys = key_fields(&path[..=i]);
            cur.as_array_mut().and_then(|a| a.iter_mut().find(|i| item_has_key(i, &key, &keys)))
        } else if let Some(val) = el.strip_prefix("v:") {
            let Ok(val) = serde_json::from_str::<Value>(val) else {
                return;
            };
            cur.as_array_mut().and_then(|a| a.iter_mut().find(|i| **i == val))
        } else {
            None
        };
        match next {
            Some(n) => cur = n,
            None => return,
        }
    }
    if let Some(field) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(field);
        }
    } else if let Some(key) = last.strip_prefix("k:") {
        let Ok(key) = serde_json::from_str::<Map<String, Value>>(key) else {
            return;
        };
        let keys = key_fields(path);
        if let Some(a) = cur.as_array_mut() {
            a.retain(|i| !item_has_key(i, &key, &keys));
        }
    } else if let Some(val) = last.strip_prefix("v:") {
        let Ok(val) = serde_json::from_str::<Value>(val) else {
            return;
        };
        if let Some(a) = cur.as_array_mut() {
            a.retain(|i| *i != val);
        }
    }
}

/// Whether a list item has exactly the given key (fields of `keys` not in `key` absent).
fn item_has_key(item: &Value, key: &Map<String, Value>, keys: &[String]) -> bool {
    keys.iter().all(|k| item.get(k) == key.get(k))
}

/// The key field names of the list-map item element at the end of `path`.
pub(crate) fn key_fields_for(resource: &ResourceInfo, path: &[String]) -> Vec<String> {
    // The schema path of the list containing the last `k:` element.
    let mut schema = String::new();
    let mut list_schema = String::new();
    for el in path {
        if let Some(f) = el.strip_prefix("f:") {
            schema = child_schema(&schema, f);
        } else {
            list_schema.clone_from(&schema);
            schema.push_str("[]");
        }
    }
    match resource.list_type(&list_schema) {
        ListType::Map(keys) => keys,
        _ => Vec::new(),
    }
}

/// Merges an applied configuration into the live object: objects field by field, list-maps
/// item by item (by key), sets by value, everything else replaced.
pub(crate) fn merge(resource: &ResourceInfo, live: &Value, applied: &Value, schema: &str) -> Value {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) if !resource.is_atomic_object(schema) => {
            let mut out = l.clone();
            for (k, av) in a {
                let merged = match l.get(k) {
                    Some(lv) => merge(resource, lv, av, &child_schema(schema, k)),
                    None => av.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(a)) => match resource.list_type(schema) {
            ListType::Atomic => applied.clone(),
            ListType::Set => {
                let mut out = l.clone();
                for item in a {
                    if !out.contains(item) {
                        out.push(item.clone());
                    }
                }
                Value::Array(out)
            }
            ListType::Map(keys) => {
                let item_schema = format!("{schema}[]");
                let mut out = l.clone();
                for item in a {
                    let key = key_element(item, &keys);
                    match out.iter_mut().find(|i| key_element(i, &keys) == key) {
                        Some(existing) => *existing = merge(resource, existing, item, &item_schema),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
        },
        _ => applied.clone(),
    }
}

/// Removes `null` values (an applied `null` means "unset").
pub(crate) fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// Renders a path for messages: `.status.devices[driver="d",device="x"].data`.
pub(crate) fn display_path(path: &[String]) -> String {
    let mut out = String::new();
    for el in path {
        if let Some(f) = el.strip_prefix("f:") {
            out.push('.');
            out.push_str(f);
        } else if let Some(k) = el.strip_prefix("k:") {
            let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(k)
                .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default();
            out.push('[');
            out.push_str(&parts.join(","));
            out.push(']');
        } else if let Some(v) = el.strip_prefix("v:") {
            out.push_str("[=");
            out.push_str(v);
            out.push(']');
        }
    }
    out.trim_start_matches('.').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claims() -> std::sync::Arc<ResourceInfo> {
        super::super::resources::built_in_resource("resource.k8s.io", "v1", "resourceclaims")
            .unwrap()
    }

    #[test]
    fn fields_v1_round_trip_and_members() {
        let obj = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "labels": {"a": "b"}},
            "status": {"devices": [{"driver": "d", "pool": "p", "device": "x", "data": {"k": 1}, "networkData": {"ips": ["10.0.0.1/24"]}}]}
        });
        let set = set_from_value(&claims(), &obj);
        let v1 = set.to_fields_v1();
        assert_eq!(
            v1,
            json!({
                "f:metadata": {"f:labels": {"f:a": {}}},
                "f:status": {"f:devices": {"k:{\"device\":\"x\",\"driver\":\"d\",\"pool\":\"p\"}": {
                    ".": {}, "f:data": {}, "f:device": {}, "f:driver": {}, "f:networkData": {"f:ips": {}}, "f:pool": {}
                }}}
            })
        );
        assert_eq!(FieldSet::from_fields_v1(&v1), set);
        let item = vec![
            "f:status".to_owned(),
            "f:devices".to_owned(),
            "k:{\"device\":\"x\",\"driver\":\"d\",\"pool\":\"p\"}".to_owned(),
        ];
        assert!(set.contains(&item));
        assert_eq!(value_at(&claims(), &obj, &item).unwrap()["device"], "x");
        let mut ip = item.clone();
        ip.extend(["f:networkData".to_owned(), "f:ips".to_owned()]);
        assert_eq!(value_at(&claims(), &obj, &ip), Some(&json!(["10.0.0.1/24"])));
    }

    #[test]
    fn merge_list_map_by_key_including_share_id() {
        let live = json!({"devices": [
            {"driver": "d", "pool": "p", "device": "x", "data": {"a": 1}},
            {"driver": "d", "pool": "p", "device": "x", "shareID": "u1", "data": {"a": 2}},
        ]});
        let applied = json!({"devices": [
            {"driver": "d", "pool": "p", "device": "x", "shareID": "u1", "data": {"b": 3}},
            {"driver": "d", "pool": "p", "device": "y"},
        ]});
        let merged = merge(&claims(), &json!({"status": live}), &json!({"status": applied}), "");
        let devs = merged["status"]["devices"].as_array().unwrap();
        assert_eq!(devs.len(), 3);
        assert_eq!(devs[0]["data"], json!({"a": 1}));
        // `data` is atomic: replaced, not merged.
        assert_eq!(devs[1]["data"], json!({"b": 3}));
        assert_eq!(devs[2]["device"], "y");
    }

    #[test]
    fn remove_item_without_share_id_keeps_shared_entry() {
        let mut obj = json!({"status": {"devices": [
            {"driver": "d", "pool": "p", "device": "x"},
            {"driver": "d", "pool": "p", "device": "x", "shareID": "u1"},
        ]}});
        let path = vec![
            "f:status".to_owned(),
            "f:devices".to_owned(),
            "k:{\"device\":\"x\",\"driver\":\"d\",\"pool\":\"p\"}".to_owned(),
        ];
        remove_at(&mut obj, &path, &|p| key_fields_for(&claims(), p));
        assert_eq!(
            obj["status"]["devices"],
            json!([{"driver": "d", "pool": "p", "device": "x", "shareID": "u1"}])
        );
    }
}
