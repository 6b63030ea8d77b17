//! CustomResourceDefinition objects: the validation the real API server applies to them
//! (names, versions, structural schemas, CEL rules that must compile, printer columns,
//! selectable fields, immutable fields on update) and the resources they define. A
//! definition whose names clash with another resource of its group is refused with 422
//! here, where the real server would accept it and report `NamesAccepted=False`.

use std::sync::Arc;

use serde_json::{Value, json};

use super::field::{child, duplicate, index, invalid, key, not_supported, required, too_many};
use super::jsonpath::JsonPath;
use super::schema::{self, Node, Schema, SchemaType};
use super::{Column, CustomVersion, rules, values};
use crate::apiserver::error::FieldError;
use crate::apiserver::resources::{Registry, ResourceInfo, compare_versions};
use crate::apiserver::validation::{is_dns_label, is_dns_subdomain};

/// The annotation a definition in a Kubernetes-owned group needs.
const APPROVAL_ANNOTATION: &str = "api-approved.kubernetes.io";

/// Most selectable fields per version (upstream's limit).
const MAX_SELECTABLE_FIELDS: usize = 8;

const PRINTER_TYPES: [&str; 5] = ["boolean", "date", "integer", "number", "string"];
const PRINTER_FORMATS: [&str; 8] =
    ["byte", "date", "date-time", "double", "float", "int32", "int64", "password"];

/// A valid definition, ready to be served.
#[derive(Debug)]
pub(crate) struct Definition {
    /// `metadata.name`.
    pub(crate) name: String,
    /// One resource per served version (storage id not yet assigned).
    pub(crate) resources: Vec<ResourceInfo>,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or_default()
}

fn strings_at(v: &Value, pointer: &str) -> Vec<String> {
    v.pointer(pointer)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// RFC 1035 label (what plural, singular and version names must be).
fn is_dns1035_label(s: &str) -> bool {
    is_dns_label(s) && s.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
}

const DNS1035_MESSAGE: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')";

/// Fills what the real server defaults: `listKind`, the conversion strategy,
/// `served`/`storage` flags as given.
pub(crate) fn apply_defaults(obj: &mut Value) {
    let kind = str_at(obj, "/spec/names/kind").to_owned();
    if !kind.is_empty()
        && str_at(obj, "/spec/names/listKind").is_empty()
        && let Some(names) = obj.pointer_mut("/spec/names").and_then(Value::as_object_mut)
    {
        names.insert("listKind".into(), json!(format!("{kind}List")));
    }
    if let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut) {
        spec.entry("conversion").or_insert_with(|| json!({"strategy": "None"}));
    }
}

/// Validates a definition (`old`: the stored one on update) and builds its resources.
pub(crate) fn check(
    registry: &Registry,
    obj: &Value,
    old: Option<&Value>,
) -> Result<Definition, Vec<FieldError>> {
    let mut errs = Vec::new();
    let name = str_at(obj, "/metadata/name").to_owned();
    let group = str_at(obj, "/spec/group").to_owned();
    let plural = str_at(obj, "/spec/names/plural").to_owned();
    if !name.is_empty() && name != format!("{plural}.{group}") {
        errs.push(invalid(
            "metadata.name",
            &json!(name),
            "must be spec.names.plural+\".\"+spec.group",
        ));
    }
    check_group(obj, &group, &mut errs);
    let scope = str_at(obj, "/spec/scope");
    match scope {
        "" => errs.push(required("spec.scope", "")),
        "Cluster" | "Namespaced" => {}
        other => errs.push(not_supported(
            "spec.scope",
            &json!(other),
            &["Cluster".into(), "Namespaced".into()],
        )),
    }
    if obj.pointer("/spec/preserveUnknownFields").and_then(Value::as_bool) == Some(true) {
        errs.push(invalid(
            "spec.preserveUnknownFields",
            &json!(true),
            "cannot set to true, set x-kubernetes-preserve-unknown-fields to true in spec.versions[*].schema instead",
        ));
    }
    match str_at(obj, "/spec/conversion/strategy") {
        "" | "None" => {}
        other => {
            errs.push(not_supported("spec.conversion.strategy", &json!(other), &["None".into()]));
        }
    }
    check_names(obj, "/spec/names", "spec.names", true, &mut errs);
    check_conflicts(registry, obj, &name, &group, &mut errs);
    if let Some(old) = old {
        check_update(obj, old, &mut errs);
    }
    let resources = check_versions(obj, &name, &group, &mut errs);
    if errs.is_empty() { Ok(Definition { name, resources }) } else { Err(errs) }
}

fn check_group(obj: &Value, group: &str, errs: &mut Vec<FieldError>) {
    if group.is_empty() {
        errs.push(required("spec.group", ""));
    } else if !is_dns_subdomain(group) {
        errs.push(invalid(
            "spec.group",
            &json!(group),
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        ));
    } else if !group.contains('.') {
        errs.push(invalid("spec.group", &json!(group), "should be a domain with at least one dot"));
    } else {
        let protected = ["k8s.io", "kubernetes.io"]
            .iter()
            .any(|p| group == *p || group.ends_with(&format!(".{p}")));
        let approved = obj
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(APPROVAL_ANNOTATION))
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty());
        if protected && !approved {
            errs.push(required(
                key("metadata.annotations", APPROVAL_ANNOTATION),
                &format!("protected groups must have approval annotation {APPROVAL_ANNOTATION:?}, see https://github.com/kubernetes/enhancements/pull/1111"),
            ));
        }
    }
}

fn check_names(obj: &Value, pointer: &str, path: &str, require: bool, errs: &mut Vec<FieldError>) {
    let get = |f: &str| str_at(obj, &format!("{pointer}/{f}")).to_owned();
    let (plural, singular, kind, list_kind) =
        (get("plural"), get("singular"), get("kind"), get("listKind"));
    if require {
        for (f, v) in [
            ("plural", &plural),
            ("singular", &singular),
            ("kind", &kind),
            ("listKind", &list_kind),
        ] {
            if v.is_empty() {
                errs.push(required(child(path, f), ""));
            }
        }
    }
    for (f, v) in [("plural", &plural), ("singular", &singular)] {
        if !v.is_empty() && !is_dns1035_label(v) {
            errs.push(invalid(child(path, f), &json!(v), DNS1035_MESSAGE));
        }
    }
    for (f, v) in [("kind", &kind), ("listKind", &list_kind)] {
        if !v.is_empty() && !is_dns1035_label(&v.to_lowercase()) {
            errs.push(invalid(
                child(path, f),
                &json!(v),
                &format!("may have mixed case, but should otherwise match: {DNS1035_MESSAGE}"),
            ));
        }
    }
    if !kind.is_empty() && kind == list_kind {
        errs.push(invalid(
            child(path, "listKind"),
            &json!(list_kind),
            "kind and listKind may not be the same",
        ));
    }
    for (f, list) in [
        ("shortNames", strings_at(obj, &format!("{pointer}/shortNames"))),
        ("categories", strings_at(obj, &format!("{pointer}/categories"))),
    ] {
        for (i, v) in list.iter().enumerate() {
            if !is_dns1035_label(v) {
                errs.push(invalid(index(&child(path, f), i), &json!(v), DNS1035_MESSAGE));
            }
        }
    }
}

/// Names must not clash within the group: plural, singular and short names share one
/// pool, kind and listKind another (built-in resources of the group included).
fn check_conflicts(
    registry: &Registry,
    obj: &Value,
    name: &str,
    group: &str,
    errs: &mut Vec<FieldError>,
) {
    let mut resource_names: Vec<(String, String)> = Vec::new();
    let mut kind_names: Vec<(String, String)> = Vec::new();
    for r in registry.all().iter().filter(|r| r.group == group) {
        let owner = r.custom.as_ref().map_or_else(|| r.qualified(), |c| c.crd_name.clone());
        if owner == name {
            continue;
        }
        for n in [&r.plural, &r.singular].into_iter().chain(&r.short_names) {
            resource_names.push((n.clone(), owner.clone()));
        }
        kind_names.push((r.kind.clone(), owner.clone()));
        kind_names.push((r.list_kind.clone(), owner.clone()));
    }
    let clash = |pool: &[(String, String)], v: &str| {
        pool.iter().find(|(n, _)| n == v).map(|(_, o)| o.clone())
    };
    for f in ["plural", "singular"] {
        let v = str_at(obj, &format!("/spec/names/{f}"));
        if let Some(owner) = clash(&resource_names, v).filter(|_| !v.is_empty()) {
            errs.push(invalid(
                child("spec.names", f),
                &json!(v),
                &format!("{v:?} is already in use by {owner}"),
            ));
        }
    }
    for (i, v) in strings_at(obj, "/spec/names/shortNames").iter().enumerate() {
        if let Some(owner) = clash(&resource_names, v) {
            errs.push(invalid(
                index("spec.names.shortNames", i),
                &json!(v),
                &format!("{v:?} is already in use by {owner}"),
            ));
        }
    }
    for f in ["kind", "listKind"] {
        let v = str_at(obj, &format!("/spec/names/{f}"));
        if let Some(owner) = clash(&kind_names, v).filter(|_| !v.is_empty()) {
            errs.push(invalid(
                child("spec.names", f),
                &json!(v),
                &format!("{v:?} is already in use by {owner}"),
            ));
        }
    }
}

fn check_update(obj: &Value, old: &Value, errs: &mut Vec<FieldError>) {
    let established = old
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Established" && c["status"] == "True"));
    let mut immutable =
        vec![("/spec/group", "spec.group"), ("/spec/names/plural", "spec.names.plural")];
    if established {
        immutable.push(("/spec/scope", "spec.scope"));
        immutable.push(("/spec/names/kind", "spec.names.kind"));
    }
    for (pointer, field) in immutable {
        let now = obj.pointer(pointer).cloned().unwrap_or(Value::Null);
        if old.pointer(pointer).cloned().unwrap_or(Value::Null) != now {
            errs.push(invalid(field, &now, "field is immutable"));
        }
    }
    let versions: Vec<String> = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .map(|v| v.iter().map(|v| str_at(v, "/name").to_owned()).collect())
        .unwrap_or_default();
    for (i, stored) in strings_at(obj, "/status/storedVersions").iter().enumerate() {
        if !versions.contains(stored) {
            errs.push(invalid(
                index("status.storedVersions", i),
                &json!(stored),
                &format!("missing from spec.versions; {stored} was previously a storage version, and must remain in spec.versions until a storage migration ensures no data remains persisted in {stored} and removes {stored} from status.storedVersions"),
            ));
        }
    }
}

#[allow(clippy::too_many_lines, reason = "one check after the other, as upstream orders them")]
fn check_versions(
    obj: &Value,
    name: &str,
    group: &str,
    errs: &mut Vec<FieldError>,
) -> Vec<ResourceInfo> {
    let versions =
        obj.pointer("/spec/versions").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut seen: Vec<&str> = Vec::new();
    let mut unique = true;
    let storage: Vec<&Value> = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .collect();
    for (i, v) in versions.iter().enumerate() {
        let vname = str_at(v, "/name");
        if seen.contains(&vname) {
            unique = false;
        }
        seen.push(vname);
        if !is_dns1035_label(vname) {
            errs.push(invalid(
                child(&index("spec.versions", i), "name"),
                &json!(vname),
                DNS1035_MESSAGE,
            ));
        }
    }
    if !unique {
        errs.push(invalid("spec.versions", &json!(versions), "must contain unique version names"));
    }
    if storage.len() != 1 {
        errs.push(invalid(
            "spec.versions",
            &json!(versions),
            "must have exactly one version marked as storage version",
        ));
    }
    let storage_version =
        storage.first().map(|v| str_at(v, "/name").to_owned()).unwrap_or_default();
    let names = obj.pointer("/spec/names").cloned().unwrap_or(Value::Null);
    let namespaced = str_at(obj, "/spec/scope") == "Namespaced";
    let mut resources = Vec::new();
    for (i, v) in versions.iter().enumerate() {
        let path = index("spec.versions", i);
        let served = v.get("served").and_then(Value::as_bool).unwrap_or(false);
        let has_status = v.pointer("/subresources/status").is_some_and(|s| !s.is_null());
        let Some(source) = v.pointer("/schema/openAPIV3Schema").filter(|s| !s.is_null()) else {
            errs.push(required(child(&child(&path, "schema"), "openAPIV3Schema"), ""));
            continue;
        };
        let schema_path = child(&child(&path, "schema"), "openAPIV3Schema");
        let before = errs.len();
        let mut parsed: Schema = schema::parse(source, &schema_path, errs);
        if errs.len() == before {
            rules::compile_all(&mut parsed.root, &schema_path, true, None, errs);
        }
        if errs.len() == before {
            check_defaults(&parsed.root, &schema_path, errs);
        }
        let columns = check_columns(v, &path, errs);
        let selectable = check_selectable(v, &parsed, &path, errs);
        if v.pointer("/deprecationWarning").is_some_and(|w| !w.is_null())
            && v.get("deprecated").and_then(Value::as_bool) != Some(true)
        {
            errs.push(invalid(
                child(&path, "deprecationWarning"),
                &v["deprecationWarning"],
                "can only be set for deprecated versions",
            ));
        }
        if !served || errs.len() != before {
            continue;
        }
        let kind = str_at(&names, "/kind").to_owned();
        resources.push(ResourceInfo {
            storage: 0,
            group: group.to_owned(),
            version: str_at(v, "/name").to_owned(),
            plural: str_at(&names, "/plural").to_owned(),
            singular: str_at(&names, "/singular").to_owned(),
            list_kind: str_at(&names, "/listKind").to_owned(),
            namespaced,
            has_status,
            // Custom resources always start without a status when they have a status
            // subresource (PrepareForCreate drops it).
            reset_status_on_create: has_status,
            short_names: strings_at(&names, "/shortNames"),
            categories: strings_at(&names, "/categories"),
            selectable_fields: selectable,
            custom: Some(Arc::new(CustomVersion {
                crd_name: name.to_owned(),
                storage_version: storage_version.clone(),
                storage_version_hash: storage_version_hash(group, &storage_version, &kind),
                schema: parsed,
                columns,
            })),
            kind,
        });
    }
    resources.sort_by(|a, b| compare_versions(&a.version, &b.version));
    resources
}

/// A stable token for discovery's `storageVersionHash`, like upstream's (a hash of
/// group, version and kind).
fn storage_version_hash(group: &str, version: &str, kind: &str) -> String {
    // FNV-1a: small, stable across runs.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in format!("{group}/{version}/{kind}").bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Every `default` must be pruned already and valid against its own schema (and rules).
fn check_defaults(node: &Node, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(default) = &node.default {
        let at = child(path, "default");
        let mut pruned = default.clone();
        let unknown = values::prune_node_value(&mut pruned, node);
        if unknown.is_empty() {
            let mut defaulted = default.clone();
            values::apply_defaults(&mut defaulted, node);
            let schema_errs = values::validate_schema(node, &defaulted, None, &at);
            if schema_errs.is_empty() {
                let (rule_errs, _) = rules::validate_at(node, &defaulted, None, &at, node.embedded);
                errs.extend(rule_errs);
            } else {
                errs.extend(schema_errs);
            }
        } else {
            errs.push(invalid(&at, default, "must not have unknown fields"));
        }
    }
    for (name, prop) in &node.properties {
        check_defaults(prop, &key(&child(path, "properties"), name), errs);
    }
    if let Some(extra) = node.additional.as_deref() {
        check_defaults(extra, &child(path, "additionalProperties"), errs);
    }
    if let Some(items) = node.items.as_deref() {
        check_defaults(items, &child(path, "items"), errs);
    }
}

fn check_columns(v: &Value, path: &str, errs: &mut Vec<FieldError>) -> Vec<Column> {
    let mut out = Vec::new();
    for (i, col) in v
        .get("additionalPrinterColumns")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = index(&child(path, "additionalPrinterColumns"), i);
        let name = str_at(col, "/name");
        let ty = str_at(col, "/type");
        let format = str_at(col, "/format");
        let json_path = str_at(col, "/jsonPath");
        let types = PRINTER_TYPES.join(",");
        if name.is_empty() {
            errs.push(required(child(&at, "name"), ""));
        }
        if ty.is_empty() {
            errs.push(required(child(&at, "type"), &format!("must be one of {types}")));
        } else if !PRINTER_TYPES.contains(&ty) {
            errs.push(invalid(child(&at, "type"), &json!(ty), &format!("must be one of {types}")));
        }
        if !format.is_empty() && !PRINTER_FORMATS.contains(&format) {
            errs.push(invalid(
                child(&at, "format"),
                &json!(format),
                &format!("must be one of {}", PRINTER_FORMATS.join(",")),
            ));
        }
        let parsed = if json_path.is_empty() {
            errs.push(required(child(&at, "JSONPath"), ""));
            None
        } else {
            match JsonPath::parse(json_path) {
                Ok(p) => Some(p),
                Err(e) => {
                    errs.push(invalid(child(&at, "JSONPath"), &json!(json_path), &e));
                    None
                }
            }
        };
        if let Some(json_path) = parsed {
            out.push(Column {
                name: name.to_owned(),
                ty: ty.to_owned(),
                format: format.to_owned(),
                description: str_at(col, "/description").to_owned(),
                priority: col.get("priority").and_then(Value::as_i64).unwrap_or(0),
                path: json_path,
            });
        }
    }
    out
}

fn check_selectable(
    v: &Value,
    schema: &Schema,
    path: &str,
    errs: &mut Vec<FieldError>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let at_list = child(path, "selectableFields");
    for (i, sf) in
        v.get("selectableFields").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        let at = child(&index(&at_list, i), "jsonPath");
        let text = str_at(sf, "/jsonPath");
        if text.is_empty() {
            errs.push(required(at, ""));
            continue;
        }
        let fields = JsonPath::parse(text)
            .ok()
            .and_then(|p| p.fields().map(|f| f.into_iter().map(str::to_owned).collect::<Vec<_>>()));
        let Some(fields) = fields else {
            errs.push(invalid(
                at,
                &json!(text),
                "is an invalid path: does not refer to a valid field",
            ));
            continue;
        };
        let found = fields.iter().try_fold(&schema.root, |n, f| n.field(f));
        let Some(node) = found else {
            errs.push(invalid(
                at,
                &json!(text),
                "is an invalid path: does not refer to a valid field",
            ));
            continue;
        };
        if fields.first().map(String::as_str) == Some("metadata") {
            errs.push(invalid(at.clone(), &json!(text), "must not point to fields in metadata"));
        }
        if !matches!(node.ty, Some(SchemaType::String | SchemaType::Boolean | SchemaType::Integer))
        {
            errs.push(invalid(
                at.clone(),
                &json!(text),
                "must point to a field of type string, boolean or integer. Enum string fields and strings with formats are allowed.",
            ));
        }
        let name = fields.join(".");
        if out.contains(&name) {
            errs.push(duplicate(at, &json!(text)));
            continue;
        }
        out.push(name);
    }
    if out.len() > MAX_SELECTABLE_FIELDS {
        errs.push(too_many(at_list, out.len(), MAX_SELECTABLE_FIELDS as u64));
    }
    out
}
