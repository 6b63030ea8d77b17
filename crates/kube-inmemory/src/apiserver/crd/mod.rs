//! CustomResourceDefinitions (`apiextensions.k8s.io/v1`): a definition's life (defaults,
//! validation, status, installing its resources, deleting it with its objects) and what
//! its resources need on every write (pruning, defaulting and validating custom objects
//! against the version's structural schema and CEL rules).
//!
//! As the real server: creating a definition installs one resource per served version
//! (REST endpoints, discovery, `kubectl get` columns from `additionalPrinterColumns`,
//! field selectors from `selectableFields`, the status subresource from
//! `subresources.status`) and sets `Established` and `NamesAccepted` to True. Deleting
//! it puts the `customresourcecleanup.apiextensions.k8s.io` finalizer on it, deletes every
//! object (objects with finalizers of their own wait for them), then removes the
//! definition and its endpoints; creates are refused in between. Versions share one
//! store; the only conversion is `None` (the `apiVersion` is rewritten).
//!
//! Differences: a definition whose names clash with another resource of its group is
//! refused with 422 (upstream accepts it with `NamesAccepted=False`); conversion
//! webhooks and the scale subresource are not supported (a webhook strategy is refused;
//! `subresources.scale` is accepted and ignored); objects are validated against the
//! schema of the version they are written through, and defaults apply when an object is
//! written, not again when it is read.

mod definition;
pub(crate) mod field;
mod formats;
pub(crate) mod jsonpath;
pub(crate) mod netlib;
pub(crate) mod rules;
pub(crate) mod schema;
pub(crate) mod values;

use std::sync::Arc;

use serde_json::{Value, json};

use self::jsonpath::JsonPath;
use self::schema::Schema;
use super::error::{ApiError, FieldError};
use super::objects::{self, DeleteOptions};
use super::resources::ResourceInfo;
use super::store::Txn;
use super::typed::FieldValidation;

pub(crate) use self::definition::Definition;

/// The finalizer that holds a definition while its objects are deleted.
pub(crate) const CLEANUP_FINALIZER: &str = "customresourcecleanup.apiextensions.k8s.io";

/// One version of a custom resource, as its definition declares it.
#[derive(Debug)]
pub(crate) struct CustomVersion {
    /// The definition's name (`widgets.example.com`).
    pub(crate) crd_name: String,
    /// The version objects are stored in.
    pub(crate) storage_version: String,
    /// Discovery's `storageVersionHash`.
    pub(crate) storage_version_hash: String,
    /// The version's structural schema with its compiled rules.
    pub(crate) schema: Schema,
    /// `additionalPrinterColumns`.
    pub(crate) columns: Vec<Column>,
}

/// An `additionalPrinterColumns` entry.
#[derive(Debug)]
pub(crate) struct Column {
    /// Header.
    pub(crate) name: String,
    /// `integer`, `number`, `string`, `boolean` or `date`.
    pub(crate) ty: String,
    /// `format`.
    pub(crate) format: String,
    /// `description`.
    pub(crate) description: String,
    /// 0: always shown; more: `-o wide` only.
    pub(crate) priority: i64,
    /// Where the value is.
    pub(crate) path: JsonPath,
}

/// Whether `resource` is the CustomResourceDefinition resource itself.
pub(crate) fn is_definition(resource: &ResourceInfo) -> bool {
    resource.group == "apiextensions.k8s.io" && resource.plural == "customresourcedefinitions"
}

fn condition(ty: &str, reason: &str, message: &str, previous: Option<&Value>) -> Value {
    let kept = previous
        .filter(|p| p["status"] == "True")
        .and_then(|p| p.get("lastTransitionTime").cloned())
        .unwrap_or_else(|| json!(objects::now()));
    json!({"type": ty, "status": "True", "lastTransitionTime": kept, "reason": reason, "message": message})
}

/// The server's part of a definition before it is validated: defaults, and a status
/// with the accepted names, the stored versions and the `NamesAccepted` and
/// `Established` conditions (and `Terminating` while it is being deleted).
pub(crate) fn prepare(obj: &mut Value) {
    definition::apply_defaults(obj);
    let names = obj.pointer("/spec/names").cloned().unwrap_or_else(|| json!({}));
    let storage: Option<String> = obj
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| vs.iter().find(|v| v["storage"] == true))
        .and_then(|v| v.get("name").and_then(Value::as_str))
        .map(str::to_owned);
    let mut stored: Vec<Value> = obj
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(s) = storage
        && !stored.iter().any(|v| v == s.as_str())
    {
        stored.push(json!(s));
    }
    let previous: Vec<Value> =
        obj.pointer("/status/conditions").and_then(Value::as_array).cloned().unwrap_or_default();
    let find = |ty: &str| previous.iter().find(|c| c["type"] == ty);
    let mut conditions: Vec<Value> = previous
        .iter()
        .filter(|c| {
            !matches!(c["type"].as_str(), Some("NamesAccepted" | "Established" | "Terminating"))
        })
        .cloned()
        .collect();
    conditions.push(condition(
        "NamesAccepted",
        "NoConflicts",
        "no conflicts found",
        find("NamesAccepted"),
    ));
    conditions.push(condition(
        "Established",
        "InitialNamesAccepted",
        "the initial names have been accepted",
        find("Established"),
    ));
    if obj.pointer("/metadata/deletionTimestamp").is_some() {
        conditions.push(condition(
            "Terminating",
            "InstanceDeletionInProgress",
            "CustomResource deletion is in progress",
            find("Terminating"),
        ));
    }
    obj["status"] =
        json!({"acceptedNames": names, "storedVersions": stored, "conditions": conditions});
}

/// Validates a definition and builds what it serves.
pub(crate) fn check(
    txn: &Txn<'_>,
    obj: &Value,
    old: Option<&Value>,
) -> Result<Definition, Vec<FieldError>> {
    definition::check(txn.registry(), obj, old)
}

/// Serves a stored definition's resources (its objects keep their store across
/// updates of the definition).
pub(crate) fn install(txn: &mut Txn<'_>, def: Definition) {
    let existing = txn.registry().storage_of(&def.name);
    let Some(registry) = txn.registry_mut() else { return };
    let storage = existing.unwrap_or_else(|| registry.allocate_storage());
    let resources = def
        .resources
        .into_iter()
        .map(|mut r| {
            r.storage = storage;
            Arc::new(r)
        })
        .collect();
    registry.install(&def.name, resources);
}

/// Refuses a create through a resource whose definition is being deleted (the real
/// server answers 405 then), or that is no longer served.
pub(crate) fn check_create(txn: &Txn<'_>, resource: &ResourceInfo) -> Result<(), ApiError> {
    let Some(custom) = &resource.custom else { return Ok(()) };
    if !txn.registry().has_storage(resource.storage) {
        return Err(ApiError::no_route(&format!("{}/{}", resource.path_prefix(), resource.plural)));
    }
    let terminating = definition_resource(txn)
        .and_then(|d| txn.get(&d, &(String::new(), custom.crd_name.clone())))
        .is_some_and(|crd| crd.pointer("/metadata/deletionTimestamp").is_some());
    if terminating {
        return Err(ApiError::method_not_allowed(
            "create not allowed while custom resource definition is terminating",
        ));
    }
    Ok(())
}

fn definition_resource(txn: &Txn<'_>) -> Option<Arc<ResourceInfo>> {
    txn.registry().lookup("apiextensions.k8s.io", "v1", "customresourcedefinitions")
}

/// Prunes unknown fields of a custom object (400 with `fieldValidation=Strict`, warnings
/// with `Warn`), then, with `defaults`, applies the schema's defaults. An applied
/// configuration is pruned but not defaulted: defaults are not the applier's fields.
pub(crate) fn decode(
    custom: &CustomVersion,
    obj: &mut Value,
    mode: FieldValidation,
    defaults: bool,
) -> Result<Vec<String>, ApiError> {
    let root = &custom.schema.root;
    if let Some(meta) = obj.get_mut("metadata") {
        super::fieldset::strip_nulls(meta);
    }
    let mut unknown = super::typed::prune_object_meta(obj);
    unknown.extend(values::prune(obj, root));
    if mode == FieldValidation::Strict && !unknown.is_empty() {
        let list: Vec<String> = unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect();
        return Err(ApiError::bad_request(format!("strict decoding error: {}", list.join(", "))));
    }
    if defaults {
        values::apply_defaults(obj, root);
    }
    values::prune_nulls(obj, Some(root));
    Ok(if mode == FieldValidation::Warn {
        unknown.iter().map(|p| format!("unknown field \"{p}\"")).collect()
    } else {
        Vec::new()
    })
}

/// Kinds of errors after which the real server does not run the CEL rules.
fn is_blocking(e: &FieldError) -> bool {
    matches!(
        e.reason,
        "FieldValueNotSupported"
            | "FieldValueRequired"
            | "FieldValueTooLong"
            | "FieldValueTooMany"
            | "FieldValueTypeInvalid"
    )
}

/// Validates a custom object (an update when `old` is given; only its status for a
/// `/status` write): schema, list uniqueness, then the CEL rules. Returns errors and
/// warnings.
pub(crate) fn validate_object(
    custom: &CustomVersion,
    obj: &Value,
    old: Option<&Value>,
    status_only: bool,
) -> (Vec<FieldError>, Vec<String>) {
    let root = &custom.schema.root;
    let mut errs = if status_only {
        match (obj.get("status"), root.properties.get("status")) {
            (Some(status), Some(node)) => {
                values::validate_schema(node, status, old.and_then(|o| o.get("status")), "status")
            }
            _ => Vec::new(),
        }
    } else {
        values::validate_schema(root, obj, old, "")
    };
    let mut list_errs = Vec::new();
    values::validate_list_types(root, obj, "", &mut list_errs);
    if !list_errs.is_empty() {
        // As upstream: an object whose stored version already broke the list rules is
        // not held to them on update.
        let mut old_errs = Vec::new();
        if let Some(o) = old {
            values::validate_list_types(root, o, "", &mut old_errs);
        }
        if old_errs.is_empty() {
            errs.extend(list_errs);
        }
    }
    if errs.iter().any(is_blocking) {
        errs.push(field::invalid(
            "<nil>",
            &Value::Null,
            "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation",
        ));
        return (errs, Vec::new());
    }
    let (rule_errs, warnings) = rules::validate(root, obj, old);
    errs.extend(rule_errs);
    (errs, warnings)
}

/// Deletes a definition: marks it (deletion timestamp, cleanup finalizer, `Terminating`),
/// deletes its objects, and finishes at once when none is left.
pub(crate) fn delete(
    txn: &mut Txn<'_>,
    crds: &ResourceInfo,
    old: &Arc<Value>,
) -> Result<Arc<Value>, ApiError> {
    let name = objects::key_of(old).1;
    let mut obj = (**old).clone();
    if obj.pointer("/metadata/deletionTimestamp").is_none() {
        obj["metadata"]["deletionTimestamp"] = json!(objects::now());
        obj["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        let generation = obj.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0);
        obj["metadata"]["generation"] = json!(generation + 1);
    }
    let finalizers = obj["metadata"]["finalizers"].as_array().cloned().unwrap_or_default();
    if !finalizers.iter().any(|f| f == CLEANUP_FINALIZER) {
        let mut f = finalizers;
        f.push(json!(CLEANUP_FINALIZER));
        obj["metadata"]["finalizers"] = json!(f);
    }
    prepare(&mut obj);
    let marked = txn.put(crds, (String::new(), name.clone()), obj);
    let served = txn
        .registry()
        .all()
        .iter()
        .find(|r| r.custom.as_ref().is_some_and(|c| c.crd_name == name))
        .cloned();
    if let Some(resource) = served {
        for o in txn.list(&resource, None) {
            if o.pointer("/metadata/deletionTimestamp").is_none() {
                objects::delete_object(txn, &resource, &o, &DeleteOptions::default(), false)?;
            }
        }
        if txn.count(&resource) > 0 {
            return Ok(marked);
        }
    }
    Ok(finish_cleanup(txn, &name).unwrap_or(marked))
}

/// After an object of a custom resource left the store: finishes its definition's
/// deletion when it was the last one.
pub(crate) fn after_removal(txn: &mut Txn<'_>, resource: &ResourceInfo) {
    let Some(custom) = &resource.custom else { return };
    if txn.count(resource) > 0 {
        return;
    }
    let terminating = definition_resource(txn)
        .and_then(|d| txn.get(&d, &(String::new(), custom.crd_name.clone())))
        .is_some_and(|crd| crd.pointer("/metadata/deletionTimestamp").is_some());
    if terminating {
        finish_cleanup(txn, &custom.crd_name);
    }
}

/// Stops serving a definition whose objects are gone, drops the cleanup finalizer, and
/// removes the definition when no other finalizer holds it. Returns its final state.
fn finish_cleanup(txn: &mut Txn<'_>, name: &str) -> Option<Arc<Value>> {
    uninstall(txn, name);
    let crds = definition_resource(txn)?;
    let key = (String::new(), name.to_owned());
    let current = txn.get(&crds, &key)?;
    let mut obj = (*current).clone();
    if let Some(f) = obj.pointer_mut("/metadata/finalizers").and_then(Value::as_array_mut) {
        f.retain(|x| x != CLEANUP_FINALIZER);
    }
    let done =
        obj.pointer("/metadata/finalizers").and_then(Value::as_array).is_none_or(Vec::is_empty);
    if done { Some(txn.remove(&crds, &key, obj)) } else { Some(txn.put(&crds, key, obj)) }
}

/// Stops serving definition `name` and forgets its objects.
pub(crate) fn uninstall(txn: &mut Txn<'_>, name: &str) {
    let storage = txn.registry().storage_of(name);
    if let Some(registry) = txn.registry_mut() {
        registry.uninstall(name);
    }
    if let Some(s) = storage {
        txn.drop_storage(s);
    }
}
