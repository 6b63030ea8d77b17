//! Discovery documents: `/version`, `/api`, `/apis`, group/version resource lists, and the
//! `OpenAPI` v3 index and per-group-version documents kubectl reads to learn that the server
//! validates fields itself (`fieldValidation`).

use serde_json::{Value, json};

use super::resources::{Registry, ResourceInfo};

/// Kubernetes version this server presents (resource.k8s.io/v1 with device status and
/// consumable capacity, like a 1.35 server with `DRAConsumableCapacity` on).
pub(crate) const MAJOR: &str = "1";
/// Minor version presented.
pub(crate) const MINOR: &str = "35";

/// `/version`.
pub(crate) fn version() -> Value {
    json!({
        "major": MAJOR,
        "minor": MINOR,
        "gitVersion": format!("v{MAJOR}.{MINOR}.0-netclaim.{}", env!("CARGO_PKG_VERSION")),
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "n/a (netclaim in-memory API server)",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, std::env::consts::ARCH),
    })
}

/// `/api`.
pub(crate) fn core_versions(server_address: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
    })
}

fn group_doc(registry: &Registry, group: &str) -> Value {
    let versions: Vec<Value> = registry
        .group_versions()
        .into_iter()
        .filter(|(g, _)| g == group)
        .map(|(g, v)| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = versions.first().cloned().unwrap_or(Value::Null);
    json!({"name": group, "versions": versions, "preferredVersion": preferred})
}

/// `/apis`.
pub(crate) fn group_list(registry: &Registry) -> Value {
    let mut groups: Vec<String> = Vec::new();
    for (g, _) in registry.group_versions() {
        if !g.is_empty() && !groups.contains(&g) {
            groups.push(g);
        }
    }
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups.iter().map(|g| group_doc(registry, g)).collect::<Vec<_>>(),
    })
}

/// `/apis/<group>`, if served.
pub(crate) fn group(registry: &Registry, group: &str) -> Option<Value> {
    registry.group_versions().iter().any(|(g, _)| g == group).then(|| {
        let mut doc = group_doc(registry, group);
        doc["kind"] = json!("APIGroup");
        doc["apiVersion"] = json!("v1");
        doc
    })
}

const VERBS: [&str; 8] =
    ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"];

/// `/api/v1` or `/apis/<group>/<version>`, if served.
pub(crate) fn resource_list(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let rs: Vec<&ResourceInfo> = registry
        .all()
        .iter()
        .map(AsRef::as_ref)
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for r in rs {
        let mut doc = json!({
            "name": r.plural,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": VERBS,
        });
        if !r.short_names.is_empty() {
            doc["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            doc["categories"] = json!(r.categories);
        }
        if let Some(custom) = &r.custom {
            // As the real server announces custom resources: the storage version hash
            // lets clients notice a changed definition.
            doc["storageVersionHash"] = json!(custom.storage_version_hash);
        }
        resources.push(doc);
        if super::scale::has_scale(r) {
            resources.push(super::scale::discovery_entry(r));
        }
        if r.has_status {
            resources.push(json!({
                "name": format!("{}/status", r.plural),
                "singularName": "",
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The relative `OpenAPI` v3 path of a group/version (`api/v1`, `apis/resource.k8s.io/v1`).
fn openapi_gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// Hash in the `OpenAPI` v3 URLs; changes with the crate version so caches refresh.
fn openapi_hash() -> String {
    format!("netclaim-{}", env!("CARGO_PKG_VERSION").replace('.', "-"))
}

/// `/openapi/v3`.
pub(crate) fn openapi_index(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    for (g, v) in registry.group_versions() {
        let p = openapi_gv_path(&g, &v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", openapi_hash())}),
        );
    }
    json!({"paths": paths})
}

fn param(name: &str) -> Value {
    json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}})
}

fn operation(r: &ResourceInfo, verb: &str, with_body: Option<&[&str]>) -> Value {
    let mut op = json!({
        "operationId": format!("{verb}{}", r.kind),
        "x-kubernetes-action": verb,
        "x-kubernetes-group-version-kind": {"group": r.group, "version": r.version, "kind": r.kind},
        "parameters": [param("dryRun"), param("fieldManager"), param("fieldValidation")],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{}", schema_name(r))}}}}},
    });
    if verb == "apply" {
        op["parameters"].as_array_mut().expect("built as an array above").push(param("force"));
    }
    if let Some(types) = with_body {
        let mut content = serde_json::Map::new();
        for t in types {
            content.insert(
                (*t).to_owned(),
                json!({"schema": {"$ref": format!("#/components/schemas/{}", schema_name(r))}}),
            );
        }
        op["requestBody"] = json!({"content": content, "required": true});
    }
    op
}

fn schema_name(r: &ResourceInfo) -> String {
    let group = if r.group.is_empty() { "core" } else { r.group.as_str() };
    format!("{group}.{}.{}", r.version, r.kind)
}

/// `/openapi/v3/<api|apis/group>/<version>`: paths with the `fieldValidation` parameter on
/// writes, so kubectl delegates validation to the server. Patch request bodies do not list
/// strategic merge patch (the documents carry no patch-merge-key schemas), so kubectl's
/// client-side `apply` falls back to its compiled-in types (strategic merge, which this
/// server handles) or, for kinds it does not know, to a JSON merge patch.
pub(crate) fn openapi_group_version(registry: &Registry, gv_path: &str) -> Option<Value> {
    let (group, version) = match gv_path.split('/').collect::<Vec<_>>().as_slice() {
        ["api", v] => ("", (*v).to_owned()),
        ["apis", g, v] => (*g, (*v).to_owned()),
        _ => return None,
    };
    let rs: Vec<&ResourceInfo> = registry
        .all()
        .iter()
        .map(AsRef::as_ref)
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for r in rs {
        let ns = if r.namespaced { "namespaces/{namespace}/" } else { "" };
        let base = format!("{}/{ns}{}", r.path_prefix(), r.plural);
        paths.insert(
            base.clone(),
            json!({
                "get": operation(r, "list", None),
                "post": operation(r, "post", Some(&["application/json", "application/yaml"])),
            }),
        );
        let item = json!({
            "get": operation(r, "get", None),
            "put": operation(r, "put", Some(&["application/json", "application/yaml"])),
            "patch": operation(r, "patch", Some(&["application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml"])),
            "delete": operation(r, "delete", None),
        });
        paths.insert(format!("{base}/{{name}}"), item.clone());
        if r.has_status {
            paths.insert(format!("{base}/{{name}}/status"), item);
        }
        // A custom resource's own schema (what `kubectl explain` shows); built-in kinds
        // get an open object (kubectl knows them itself).
        let mut schema = match &r.custom {
            Some(custom) => custom.schema.openapi(),
            None => json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        };
        schema["x-kubernetes-group-version-kind"] =
            json!([{"group": r.group, "version": r.version, "kind": r.kind}]);
        schemas.insert(schema_name(r), schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "netclaim in-memory API server", "version": format!("v{MAJOR}.{MINOR}.0")},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
