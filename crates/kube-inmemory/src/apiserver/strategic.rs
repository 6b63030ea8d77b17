//! Strategic merge patch (what kubectl's client-side `apply`, `edit` and `patch
//! --type=strategic` send for built-in kinds): a JSON merge patch in which lists with a
//! patch merge key merge item by item, primitive merge lists take unions, and the
//! `$patch`, `$retainKeys`, `$deleteFromPrimitiveList/` and `$setElementOrder/` directives
//! apply. Merge keys come from the same list table as server-side apply.

use serde_json::{Map, Value};

use super::resources::{ListType, ResourceInfo};

fn child(schema: &str, field: &str) -> String {
    if schema.is_empty() { field.to_owned() } else { format!("{schema}.{field}") }
}

/// Applies `patch` to `target` in place.
pub(crate) fn apply(resource: &ResourceInfo, target: &mut Value, patch: &Value) {
    merge_object(resource, target, patch, "");
}

fn merge_object(resource: &ResourceInfo, target: &mut Value, patch: &Value, schema: &str) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = patch.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return;
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return;
        }
        _ => {}
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(obj) = target.as_object_mut() else {
        return;
    };
    let mut orders: Vec<(String, Vec<Value>)> = Vec::new();
    for (key, value) in patch {
        if key == "$patch" || key == "$retainKeys" {
            continue;
        }
        if let Some(list) = key.strip_prefix("$setElementOrder/") {
            orders.push((list.to_owned(), value.as_array().cloned().unwrap_or_default()));
            continue;
        }
        if let Some(list) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(items), Some(remove)) =
                (obj.get_mut(list).and_then(Value::as_array_mut), value.as_array())
            {
                items.retain(|i| !remove.contains(i));
            }
            continue;
        }
        let field_path = child(schema, key);
        if value.is_null() {
            obj.remove(key);
            continue;
        }
        match (obj.get_mut(key), value) {
            (Some(existing @ Value::Object(_)), Value::Object(_))
                if !resource.is_atomic_object(&field_path) =>
            {
                merge_object(resource, existing, value, &field_path);
                if existing.as_object().is_some_and(Map::is_empty)
                    && value.get("$patch").and_then(Value::as_str) == Some("delete")
                {
                    obj.remove(key);
                }
            }
            (Some(Value::Array(existing)), Value::Array(items)) => {
                merge_list(resource, existing, items, &field_path);
            }
            (_, v) => {
                let mut v = v.clone();
                strip_directives(&mut v);
                obj.insert(key.clone(), v);
            }
        }
    }
    if let Some(retain) = patch.get("$retainKeys").and_then(Value::as_array) {
        obj.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
    }
    for (list, order) in orders {
        if let (ListType::Map(keys), Some(items)) = (
            resource.list_type(&child(schema, &list)),
            obj.get_mut(&list).and_then(Value::as_array_mut),
        ) {
            let position = |item: &Value| {
                order.iter().position(|o| same_key(o, item, &keys)).unwrap_or(usize::MAX)
            };
            items.sort_by_key(position);
        }
    }
}

fn same_key(a: &Value, b: &Value, keys: &[String]) -> bool {
    let present: Vec<&String> = keys.iter().filter(|k| a.get(k.as_str()).is_some()).collect();
    !present.is_empty() && present.iter().all(|k| a.get(k.as_str()) == b.get(k.as_str()))
}

fn merge_list(resource: &ResourceInfo, existing: &mut Vec<Value>, items: &[Value], path: &str) {
    match resource.list_type(path) {
        ListType::Map(keys) => {
            if items.iter().any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace")) {
                *existing = items.iter().filter(|i| i.get("$patch").is_none()).cloned().collect();
                return;
            }
            let item_schema = format!("{path}[]");
            for item in items {
                let pos = existing.iter().position(|e| same_key(item, e, &keys));
                if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                    if let Some(p) = pos {
                        existing.remove(p);
                    }
                    continue;
                }
                if let Some(p) = pos {
                    merge_object(resource, &mut existing[p], item, &item_schema);
                } else {
                    let mut v = item.clone();
                    strip_directives(&mut v);
                    existing.push(v);
                }
            }
        }
        ListType::Set => {
            for item in items {
                if !existing.contains(item) {
                    existing.push(item.clone());
                }
            }
        }
        ListType::Atomic => {
            *existing = items.to_vec();
        }
    }
}

fn strip_directives(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|k, _| !k.starts_with('$'));
            m.values_mut().for_each(strip_directives);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_directives),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pods() -> std::sync::Arc<ResourceInfo> {
        super::super::resources::built_in_resource("", "v1", "pods").unwrap()
    }

    #[test]
    fn kubectl_apply_patch_merges_containers_by_name() {
        let mut pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}, {"name": "d", "image": "nginx", "env": [{"name": "X", "value": "1"}]}]}});
        let patch = json!({"metadata": {"labels": {"b": null}},
            "spec": {"$setElementOrder/containers": [{"name": "d"}, {"name": "c"}],
                     "containers": [{"name": "d", "image": "nginx:2"}]}});
        apply(&pods(), &mut pod, &patch);
        assert_eq!(pod["metadata"]["labels"], json!({"a": "1"}));
        assert_eq!(
            pod["spec"]["containers"],
            json!([
                {"name": "d", "image": "nginx:2", "env": [{"name": "X", "value": "1"}]},
                {"name": "c", "image": "busybox"},
            ])
        );
    }

    #[test]
    fn delete_and_replace_directives() {
        let mut pod = json!({"metadata": {"finalizers": ["a"]}, "spec": {"containers": [{"name": "c"}, {"name": "d"}], "nodeSelector": {"x": "1"}}});
        let patch = json!({"metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]},
            "spec": {"containers": [{"name": "c", "$patch": "delete"}], "nodeSelector": {"$patch": "replace", "y": "2"}}});
        apply(&pods(), &mut pod, &patch);
        assert_eq!(pod["metadata"]["finalizers"], json!(["b"]));
        assert_eq!(pod["spec"]["containers"], json!([{"name": "d"}]));
        assert_eq!(pod["spec"]["nodeSelector"], json!({"y": "2"}));
    }
}
