//! Object lifecycle rules shared by every write: system metadata, generation, status
//! subresource semantics, validation, field ownership, finalizers and graceful deletion.

use std::sync::Arc;

use serde_json::{Value, json};

use super::admission;
use super::apply::{self, ApplyOutcome, Operation, Writer};
use super::crd;
use super::error::ApiError;
use super::resources::ResourceInfo;
use super::store::{ObjectKey, Txn};
use super::typed::{self, FieldValidation};
use super::validation;

/// The current time as Kubernetes writes it (RFC 3339, seconds, UTC).
pub(crate) fn now() -> String {
    now_plus(0)
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

fn now_plus(seconds: i64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(unix_now().saturating_add(seconds))
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The name and namespace of an object.
pub(crate) fn key_of(obj: &Value) -> ObjectKey {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).unwrap_or_default().to_owned();
    (s("/metadata/namespace"), s("/metadata/name"))
}

/// Who writes, how, and with which options.
pub(crate) struct WriteContext<'a> {
    /// Field manager.
    pub(crate) manager: &'a str,
    /// `""` or `"status"`.
    pub(crate) subresource: &'a str,
    /// Unknown-field handling.
    pub(crate) field_validation: FieldValidation,
    /// Drop consumable-capacity fields from `ResourceSlices`, like a server with the
    /// `DRAConsumableCapacity` gate off.
    pub(crate) drop_consumable_capacity: bool,
    /// Who writes, for the admission policies (None: the server's own writes).
    pub(crate) admission: Option<admission::Caller<'a>>,
}

/// The result of a write: the stored (or unchanged) object and warnings.
pub(crate) struct Written {
    /// The object as stored now (for deletes: its final state).
    pub(crate) object: Arc<Value>,
    /// Whether a new object was created (201).
    pub(crate) created: bool,
    /// `Warning` header values.
    pub(crate) warnings: Vec<String>,
}

impl Written {
    fn with_warnings(mut self, mut earlier: Vec<String>) -> Self {
        earlier.append(&mut self.warnings);
        self.warnings = earlier;
        self
    }
}

/// Checks `apiVersion`/`kind` of a body against the resource and fills them in.
pub(crate) fn check_type_meta(resource: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    }
    let api_version = resource.api_version();
    if let Some(av) = obj.get("apiVersion").and_then(Value::as_str).filter(|s| !s.is_empty())
        && av != api_version
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({api_version})"
        )));
    }
    if let Some(kind) = obj.get("kind").and_then(Value::as_str).filter(|s| !s.is_empty())
        && kind != resource.kind.as_str()
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            resource.kind
        )));
    }
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(resource.kind);
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    Ok(())
}

/// Sets the namespace from the URL (checking a body namespace agrees).
pub(crate) fn set_namespace(
    resource: &ResourceInfo,
    obj: &mut Value,
    url_ns: Option<&str>,
) -> Result<(), ApiError> {
    let body_ns =
        obj.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default().to_owned();
    if resource.namespaced {
        let ns = url_ns.ok_or_else(|| {
            ApiError::bad_request("a namespace is required for a namespaced resource")
        })?;
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        obj["metadata"]["namespace"] = json!(ns);
    } else if let Some(m) = obj["metadata"].as_object_mut() {
        m.remove("namespace");
    }
    Ok(())
}

fn spec_part(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

fn drop_consumable_capacity(resource: &ResourceInfo, obj: &mut Value) {
    if resource.custom.is_some() || resource.kind != "ResourceSlice" {
        return;
    }
    if let Some(devices) = obj.pointer_mut("/spec/devices").and_then(Value::as_array_mut) {
        for d in devices {
            if let Some(m) = d.as_object_mut() {
                m.remove("allowMultipleAllocations");
            }
            if let Some(caps) = d.get_mut("capacity").and_then(Value::as_object_mut) {
                for c in caps.values_mut() {
                    if let Some(m) = c.as_object_mut() {
                        m.remove("requestPolicy");
                    }
                }
            }
        }
    }
}

fn invalid(resource: &ResourceInfo, obj: &Value, errs: &[super::error::FieldError]) -> ApiError {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    ApiError::invalid(&resource.kind, &resource.group, name, errs)
}

/// Validates the object a write is about to store (`old`: the stored one on update):
/// the kind's rules, a custom resource's schema and rules, a definition's own rules
/// (its server-owned status set first). Returns the definition to install, if `obj` is
/// one.
fn validate_write(
    txn: &Txn<'_>,
    resource: &ResourceInfo,
    obj: &mut Value,
    old: Option<&Value>,
    subresource: &str,
    warnings: &mut Vec<String>,
) -> Result<Option<crd::Definition>, ApiError> {
    let is_definition = crd::is_definition(resource);
    if is_definition {
        crd::prepare(obj);
    }
    let mut errs = validation::validate(resource, obj, old);
    if let Some(custom) = &resource.custom {
        let (e, w) = crd::validate_object(custom, obj, old, subresource == "status");
        errs.extend(e);
        warnings.extend(w);
    }
    let definition = if is_definition {
        match crd::check(txn, obj, old) {
            Ok(d) => Some(d),
            Err(e) => {
                errs.extend(e);
                None
            }
        }
    } else {
        None
    };
    if errs.is_empty() { Ok(definition) } else { Err(invalid(resource, obj, &errs)) }
}

/// Creates `obj` (type meta and namespace already checked). Handles `generateName`.
pub(crate) fn create(
    txn: &mut Txn<'_>,
    resource: &ResourceInfo,
    mut obj: Value,
    ctx: &WriteContext<'_>,
    applied_managed_fields: Option<Value>,
) -> Result<Written, ApiError> {
    crd::check_create(txn, resource)?;
    let mut warnings = typed::check(resource, &mut obj, ctx.field_validation, true)?;
    if ctx.drop_consumable_capacity {
        drop_consumable_capacity(resource, &mut obj);
    }
    let ts = now();
    let meta = obj["metadata"]
        .as_object_mut()
        .ok_or_else(|| ApiError::internal("metadata is not an object"))?;
    for f in [
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "managedFields",
        "selfLink",
    ] {
        meta.remove(f);
    }
    meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    meta.insert("creationTimestamp".into(), json!(ts));
    meta.insert("generation".into(), json!(1));
    let name_empty = meta.get("name").and_then(Value::as_str).is_none_or(str::is_empty);
    let generate = meta.get("generateName").and_then(Value::as_str).unwrap_or_default().to_owned();
    if name_empty && !generate.is_empty() {
        // The real server appends 5 characters from an alphabet without vowels.
        const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
        let (ns, _) = key_of(&obj);
        loop {
            let suffix: String = uuid::Uuid::new_v4().as_bytes()[..5]
                .iter()
                .map(|b| ALPHABET[usize::from(*b) % ALPHABET.len()] as char)
                .collect();
            let candidate = format!("{generate}{suffix}");
            if txn.get(resource, &(ns.clone(), candidate.clone())).is_none() {
                obj["metadata"]["name"] = json!(candidate);
                break;
            }
        }
    }
    if resource.reset_status_on_create {
        if let Some(m) = obj.as_object_mut() {
            m.remove("status");
        }
        if resource.custom.is_none() && resource.kind == "Pod" {
            obj["status"] = json!({"phase": "Pending"});
        }
    }
    if resource.custom.is_none()
        && resource.kind == "Namespace"
        && obj.pointer("/status/phase").is_none()
    {
        obj["status"] = json!({"phase": "Active"});
    }
    label_namespace_name(resource, &mut obj);
    secret_string_data(resource, &mut obj);
    obj["apiVersion"] = json!(resource.storage_api_version());
    let definition = validate_write(txn, resource, &mut obj, None, "", &mut warnings)?;
    let write = admission::Write {
        resource,
        operation: admission::Operation::Create,
        subresource: "",
        object: Some(&obj),
        old_object: None,
    };
    admission::admit(txn, ctx.admission.as_ref(), &write, &mut warnings)?;
    let key = key_of(&obj);
    if txn.get(resource, &key).is_some() {
        return Err(ApiError::already_exists(&resource.group, &resource.plural, &key.1));
    }
    match applied_managed_fields {
        Some(mf) => obj["metadata"]["managedFields"] = mf,
        None => apply::record_update(
            resource,
            None,
            &mut obj,
            &Writer {
                manager: ctx.manager,
                operation: Operation::Update,
                subresource: "",
                now: &ts,
            },
        ),
    }
    let object = txn.put(resource, key, obj);
    if let Some(d) = definition {
        crd::install(txn, d);
    }
    Ok(Written { object, created: true, warnings })
}

/// The object to store from a write's `candidate`: `/status` takes only the status,
/// the main endpoint everything but the status (when the kind has a status subresource);
/// server-owned metadata always comes from `old`. Refuses new finalizers on an object
/// being deleted (as the real server does).
fn merge_for_subresource(
    resource: &ResourceInfo,
    old: &Value,
    candidate: Value,
    ctx: &WriteContext<'_>,
) -> Result<Value, ApiError> {
    let new = if ctx.subresource == "status" {
        let mut n = old.clone();
        match candidate.get("status") {
            Some(s) => n["status"] = s.clone(),
            None => {
                if let Some(m) = n.as_object_mut() {
                    m.remove("status");
                }
            }
        }
        n
    } else {
        let mut n = candidate;
        if resource.has_status {
            match old.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "namespace",
            "name",
        ] {
            match old["metadata"].get(f) {
                Some(v) => n["metadata"][f] = v.clone(),
                None => {
                    if let Some(m) = n["metadata"].as_object_mut() {
                        m.remove(f);
                    }
                }
            }
        }
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            let old_fin = old
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let new_fin = n
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            if new_fin.iter().any(|f| !old_fin.contains(f)) {
                return Err(ApiError::invalid(
                    &resource.kind,
                    &resource.group,
                    &key_of(old).1,
                    &[super::error::FieldError::forbidden(
                        "metadata.finalizers",
                        "no new finalizers can be added if the object is being deleted",
                    )],
                ));
            }
        }
        n
    };
    Ok(new)
}

/// A Namespace always carries its own name as the label `kubernetes.io/metadata.name`: the
/// real API server sets it on every create and update (GA in Kubernetes 1.24), so label
/// selectors can pick namespaces by name.
fn label_namespace_name(resource: &ResourceInfo, obj: &mut Value) {
    if resource.custom.is_some() || resource.kind != "Namespace" {
        return;
    }
    let Some(name) = obj.pointer("/metadata/name").and_then(Value::as_str).map(str::to_owned)
    else {
        return;
    };
    let Some(meta) = obj["metadata"].as_object_mut() else { return };
    let labels = meta.entry("labels").or_insert_with(|| json!({}));
    if !labels.is_object() {
        *labels = json!({});
    }
    labels["kubernetes.io/metadata.name"] = json!(name);
}

/// A Secret's `stringData` is write-only, as the real server treats it: each entry is
/// merged into `data` (base64), winning over a `data` entry of the same key, and the field
/// is not stored; an absent `type` is `Opaque`.
fn secret_string_data(resource: &ResourceInfo, obj: &mut Value) {
    if resource.custom.is_some() || !resource.group.is_empty() || resource.kind != "Secret" {
        return;
    }
    if obj.get("type").is_none_or(Value::is_null) {
        obj["type"] = json!("Opaque");
    }
    let Some(object) = obj.as_object_mut() else { return };
    let Some(string_data) = object.remove("stringData") else { return };
    let data = object.entry("data").or_insert_with(|| json!({}));
    if data.is_null() {
        *data = json!({});
    }
    // A `data` that is not an object is left for validation to refuse.
    let Some(data) = data.as_object_mut() else { return };
    for (key, value) in string_data.as_object().into_iter().flatten() {
        if let Some(text) = value.as_str()
            && let Ok(encoded) = serde_json::to_value(k8s_openapi::ByteString(text.into()))
        {
            data.insert(key.clone(), encoded);
        }
    }
}

/// Stores `candidate` as the new state of `old` (an update, patch or apply result):
/// restores server-owned metadata, applies status subresource rules, validates, bumps the
/// generation, records field ownership (unless `apply_managed` already did), skips no-op
/// writes, and completes deletion when the last finalizer goes.
pub(crate) fn update(
    txn: &mut Txn<'_>,
    resource: &ResourceInfo,
    old: &Arc<Value>,
    mut candidate: Value,
    ctx: &WriteContext<'_>,
    applied: bool,
) -> Result<Written, ApiError> {
    if resource.custom.is_some() && !txn.registry().has_storage(resource.storage) {
        return Err(ApiError::no_route(&format!("{}/{}", resource.path_prefix(), resource.plural)));
    }
    let mut warnings = typed::check(resource, &mut candidate, ctx.field_validation, true)?;
    if ctx.drop_consumable_capacity {
        drop_consumable_capacity(resource, &mut candidate);
    }
    let managed = candidate.pointer("/metadata/managedFields").cloned();
    let mut new = merge_for_subresource(resource, old, candidate, ctx)?;
    if let Some(m) = new["metadata"].as_object_mut() {
        m.remove("managedFields");
        m.remove("resourceVersion");
        m.remove("selfLink");
    }
    label_namespace_name(resource, &mut new);
    secret_string_data(resource, &mut new);
    new["apiVersion"] = json!(resource.storage_api_version());
    new["kind"] = json!(resource.kind);
    let is_definition = crd::is_definition(resource);
    let definition =
        validate_write(txn, resource, &mut new, Some(old), ctx.subresource, &mut warnings)?;
    let write = admission::Write {
        resource,
        operation: admission::Operation::Update,
        subresource: ctx.subresource,
        object: Some(&new),
        old_object: Some(old),
    };
    admission::admit(txn, ctx.admission.as_ref(), &write, &mut warnings)?;
    if spec_part(&new) != spec_part(old) {
        let generation = old.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
        new["metadata"]["generation"] = json!(generation + 1);
    }
    let ts = now();
    if applied {
        new["metadata"]["managedFields"] = managed.unwrap_or_else(|| json!([]));
    } else {
        apply::record_update(
            resource,
            Some(old),
            &mut new,
            &Writer {
                manager: ctx.manager,
                operation: Operation::Update,
                subresource: ctx.subresource,
                now: &ts,
            },
        );
    }
    if new.pointer("/metadata/managedFields").and_then(Value::as_array).is_some_and(Vec::is_empty)
        && let Some(m) = new["metadata"].as_object_mut()
    {
        m.remove("managedFields");
    }
    new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
    if new == **old {
        return Ok(Written {
            object: old.clone(),
            created: false,
            warnings: std::mem::take(&mut warnings),
        });
    }
    let key = key_of(old);
    let deleting = new.pointer("/metadata/deletionTimestamp").is_some();
    let no_finalizers =
        new.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty);
    let grace_done =
        new.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0)
            == 0;
    let object = if deleting && no_finalizers && grace_done {
        let removed = txn.remove(resource, &key, new);
        if is_definition {
            crd::uninstall(txn, &key.1);
        }
        crd::after_removal(txn, resource);
        removed
    } else {
        let stored = txn.put(resource, key, new);
        if let Some(d) = definition
            && stored.pointer("/metadata/deletionTimestamp").is_none()
        {
            crd::install(txn, d);
        }
        stored
    };
    Ok(Written { object, created: false, warnings })
}

/// Server-side apply of a parsed configuration to `live` (None: create).
pub(crate) fn server_side_apply(
    txn: &mut Txn<'_>,
    resource: &ResourceInfo,
    live: Option<&Arc<Value>>,
    mut config: Value,
    ctx: &WriteContext<'_>,
    force: bool,
) -> Result<Written, ApiError> {
    // Only the subresource's fields count: status for /status, everything but status
    // otherwise (when the kind has a status subresource).
    let mut applied = json!({"apiVersion": config["apiVersion"], "kind": config["kind"]});
    if ctx.subresource == "status" {
        if let Some(s) = config.get("status") {
            applied["status"] = s.clone();
        }
    } else {
        if resource.has_status
            && let Some(m) = config.as_object_mut()
        {
            m.remove("status");
        }
        applied = config;
    }
    // Unknown fields are pruned (or rejected) before ownership is computed, so no
    // manager owns a field the type does not have.
    let warnings = typed::check(resource, &mut applied, ctx.field_validation, false)?;
    let ts = now();
    let writer = Writer {
        manager: ctx.manager,
        operation: Operation::Apply,
        subresource: ctx.subresource,
        now: &ts,
    };
    let key_name = key_of(&applied).1;
    match live {
        None => {
            if ctx.subresource == "status" {
                return Err(ApiError::not_found(&resource.group, &resource.plural, &key_name));
            }
            let merged = match apply::apply(resource, None, &applied, &writer, force) {
                ApplyOutcome::Applied(v) => v,
                ApplyOutcome::Conflicts(c) => {
                    return Err(ApiError::apply_conflict(
                        &resource.group,
                        &resource.plural,
                        &key_name,
                        &c,
                    ));
                }
            };
            let managed =
                merged.pointer("/metadata/managedFields").cloned().unwrap_or_else(|| json!([]));
            create(txn, resource, merged, ctx, Some(managed)).map(|w| w.with_warnings(warnings))
        }
        Some(live) => match apply::apply(resource, Some(live), &applied, &writer, force) {
            ApplyOutcome::Applied(merged) => {
                update(txn, resource, live, merged, ctx, true).map(|w| w.with_warnings(warnings))
            }
            ApplyOutcome::Conflicts(c) => {
                Err(ApiError::apply_conflict(&resource.group, &resource.plural, &key_name, &c))
            }
        },
    }
}

/// Creates the namespaces every cluster starts with.
pub(crate) fn create_initial_namespaces(txn: &mut Txn<'_>) -> Result<(), ApiError> {
    let resource = txn
        .registry()
        .lookup("", "v1", "namespaces")
        .ok_or_else(|| ApiError::internal("namespaces are not in the resource table"))?;
    let resource = &*resource;
    let ctx = WriteContext {
        manager: "netclaim-dev-apiserver",
        subresource: "",
        field_validation: FieldValidation::Strict,
        drop_consumable_capacity: false,
        admission: None,
    };
    for name in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let obj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
        create(txn, resource, obj, &ctx, None)?;
    }
    Ok(())
}

/// Options of a delete.
#[derive(Debug, Default)]
pub(crate) struct DeleteOptions {
    /// `gracePeriodSeconds`.
    pub(crate) grace_period: Option<i64>,
    /// `preconditions.uid`.
    pub(crate) uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub(crate) resource_version: Option<String>,
}

/// Deletes one object: graceful for pods bound to a node, behind finalizers for anything
/// that has them (deletionTimestamp set, object kept), otherwise removed at once; a
/// CustomResourceDefinition takes its objects with it.
pub(crate) fn delete(
    txn: &mut Txn<'_>,
    resource: &ResourceInfo,
    old: &Arc<Value>,
    opts: &DeleteOptions,
) -> Result<Arc<Value>, ApiError> {
    delete_object(txn, resource, old, opts, true)
}

/// [`delete`]; `finish_definitions`: whether removing the last object of a custom
/// resource whose definition is being deleted finishes that deletion (not while the
/// definition's own deletion is deleting its objects).
pub(crate) fn delete_object(
    txn: &mut Txn<'_>,
    resource: &ResourceInfo,
    old: &Arc<Value>,
    opts: &DeleteOptions,
    finish_definitions: bool,
) -> Result<Arc<Value>, ApiError> {
    let (_, name) = key_of(old);
    if let Some(uid) = &opts.uid
        && old.pointer("/metadata/uid").and_then(Value::as_str) != Some(uid)
    {
        return Err(ApiError::conflict(
            &resource.group,
            &resource.plural,
            &name,
            &format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                old.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or_default()
            ),
        ));
    }
    if let Some(rv) = &opts.resource_version
        && old.pointer("/metadata/resourceVersion").and_then(Value::as_str) != Some(rv)
    {
        return Err(ApiError::conflict(
            &resource.group,
            &resource.plural,
            &name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    if crd::is_definition(resource) {
        return crd::delete(txn, resource, old);
    }
    let key = key_of(old);
    let mut obj = (**old).clone();
    let generation = obj.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
    if resource.custom.is_none() && resource.kind == "Pod" {
        let bound =
            obj.pointer("/spec/nodeName").and_then(Value::as_str).is_some_and(|n| !n.is_empty());
        let terminal = matches!(
            obj.pointer("/status/phase").and_then(Value::as_str),
            Some("Succeeded" | "Failed")
        );
        let grace = opts
            .grace_period
            .or_else(|| obj.pointer("/spec/terminationGracePeriodSeconds").and_then(Value::as_i64))
            .unwrap_or(30);
        if bound && !terminal && grace > 0 {
            let current =
                obj.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64);
            if obj.pointer("/metadata/deletionTimestamp").is_none()
                || current.is_some_and(|c| grace < c)
            {
                obj["metadata"]["deletionTimestamp"] = json!(now_plus(grace));
                obj["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
                obj["metadata"]["generation"] = json!(generation + 1);
                return Ok(txn.put(resource, key, obj));
            }
            return Ok(old.clone());
        }
    }
    let has_finalizers = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty());
    if has_finalizers {
        let grace_now = obj.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64);
        if obj.pointer("/metadata/deletionTimestamp").is_none() || grace_now.is_some_and(|g| g > 0)
        {
            if obj.pointer("/metadata/deletionTimestamp").is_none() {
                obj["metadata"]["deletionTimestamp"] = json!(now());
                obj["metadata"]["generation"] = json!(generation + 1);
            }
            obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            return Ok(txn.put(resource, key, obj));
        }
        return Ok(old.clone());
    }
    let removed = txn.remove(resource, &key, obj);
    if finish_definitions {
        crd::after_removal(txn, resource);
    }
    Ok(removed)
}
