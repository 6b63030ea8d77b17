//! `ResourceSlice` (§3.1): the driver and pool, node selection (of the slice or per
//! device), shared counters, and each device's name, taints and binding conditions
//! (attributes and capacities are checked in `attributes`).

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::Errors;
use super::attributes::{is_list_attribute, validate_attribute, validate_capacity};
use super::names::{
    check_dns_label, check_driver_name, check_pool_name, check_qualified_name, is_dns_subdomain,
};
use crate::apiserver::error::FieldError;

pub(super) fn validate_slice(obj: &Value, old: Option<&Value>, errs: &mut Errors) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        errs.push(FieldError::required("spec", "spec is required"));
        return;
    };
    check_driver_name(spec.get("driver"), "spec.driver", errs);
    match spec.get("pool") {
        Some(pool) if pool.is_object() => {
            check_pool_name(pool.get("name"), "spec.pool.name", errs);
            match pool.get("generation").and_then(Value::as_i64) {
                Some(g) if g < 0 => errs.push(FieldError::invalid(
                    "spec.pool.generation",
                    "must be greater than or equal to 0",
                )),
                _ => {}
            }
            match pool.get("resourceSliceCount").and_then(Value::as_i64) {
                Some(c) if c > 0 => {}
                _ => errs.push(FieldError::invalid(
                    "spec.pool.resourceSliceCount",
                    "must be greater than zero",
                )),
            }
        }
        _ => errs.push(FieldError::required("spec.pool", "pool is required")),
    }
    if let Some(old_spec) = old.and_then(|o| o.get("spec")) {
        for (field, path) in [("driver", "spec.driver"), ("nodeName", "spec.nodeName")] {
            if old_spec.get(field) != spec.get(field) {
                errs.push(FieldError::invalid(path, "field is immutable"));
            }
        }
        if old_spec.pointer("/pool/name") != spec.pointer("/pool/name") {
            errs.push(FieldError::invalid("spec.pool.name", "field is immutable"));
        }
    }

    let per_device = validate_node_selection(spec, errs);

    let devices = spec.get("devices").and_then(Value::as_array);
    let counters = spec.get("sharedCounters").and_then(Value::as_array);
    if devices.is_some_and(|d| !d.is_empty()) && counters.is_some_and(|c| !c.is_empty()) {
        errs.push(FieldError::invalid(
            "spec",
            "only one of `devices` and `sharedCounters` may be set",
        ));
    }
    if let Some(sets) = counters {
        validate_shared_counters(sets, errs);
    }
    if let Some(devices) = devices {
        let limited = devices.iter().any(|d| {
            d.get("taints").and_then(Value::as_array).is_some_and(|t| !t.is_empty())
                || d.get("consumesCounters")
                    .and_then(Value::as_array)
                    .is_some_and(|c| !c.is_empty())
                || d.get("attributes")
                    .and_then(Value::as_object)
                    .is_some_and(|a| a.values().any(is_list_attribute))
        });
        let max = if limited { 64 } else { 128 };
        if devices.len() > max {
            errs.push(FieldError::too_many("spec.devices", devices.len(), max));
        }
        let mut names = BTreeSet::new();
        for (i, dev) in devices.iter().enumerate() {
            let field = format!("spec.devices[{i}]");
            if let Some(n) = dev.get("name").and_then(Value::as_str)
                && !names.insert(n)
            {
                errs.push(FieldError::duplicate(format!("{field}.name"), format!("{n:?}")));
            }
            validate_device(dev, &field, per_device, errs);
        }
    }
}

fn check_node_selector(sel: &Value, field: &str, errs: &mut Errors) {
    let terms = sel.get("nodeSelectorTerms").and_then(Value::as_array).map_or(0, Vec::len);
    if terms != 1 {
        errs.push(FieldError::invalid(
            format!("{field}.nodeSelectorTerms"),
            format!("must have exactly one node selector term, has {terms}"),
        ));
    }
}

fn validate_device(dev: &Value, field: &str, per_device: bool, errs: &mut Errors) {
    check_dns_label(dev.get("name"), &format!("{field}.name"), errs);
    let attributes = dev.get("attributes").and_then(Value::as_object);
    let capacity = dev.get("capacity").and_then(Value::as_object);
    let total = attributes.map_or(0, Map::len) + capacity.map_or(0, Map::len);
    if total > 32 {
        errs.push(FieldError::too_many(format!("{field}.attributes"), total, 32).with_message(
            format!(
                "the total number of attributes and capacities must not exceed 32, has {total}"
            ),
        ));
    }
    let mut list_values = 0;
    if let Some(attrs) = attributes {
        for (name, attr) in attrs {
            let afield = format!("{field}.attributes[{name}]");
            check_qualified_name(name, &afield, errs);
            list_values += validate_attribute(attr, &afield, errs);
        }
    }
    if list_values > 48 {
        errs.push(FieldError::too_many(format!("{field}.attributes"), list_values, 48).with_message(format!("the total number of values in list attributes must not exceed 48, has {list_values}")));
    }
    let multi = dev.get("allowMultipleAllocations").and_then(Value::as_bool) == Some(true);
    if let Some(caps) = capacity {
        for (name, cap) in caps {
            let cfield = format!("{field}.capacity[{name}]");
            check_qualified_name(name, &cfield, errs);
            validate_capacity(cap, &cfield, multi, errs);
        }
    }
    if let Some(cc) = dev.get("consumesCounters").and_then(Value::as_array)
        && cc.len() > 2
    {
        errs.push(FieldError::too_many(format!("{field}.consumesCounters"), cc.len(), 2));
    }
    let dev_node_fields = ["nodeName", "nodeSelector", "allNodes"];
    let dev_set = dev_node_fields
        .iter()
        .filter(|f| match dev.get(**f) {
            None | Some(Value::Null | Value::Bool(false)) => false,
            Some(Value::String(s)) => !s.is_empty(),
            Some(_) => true,
        })
        .count();
    if per_device {
        if dev_set != 1 {
            errs.push(FieldError::invalid(field.to_owned(), "exactly one of `nodeName`, `nodeSelector`, `allNodes` is required when `perDeviceNodeSelection` is set"));
        }
    } else if dev_set > 0 {
        errs.push(FieldError::forbidden(field.to_owned(), "`nodeName`, `nodeSelector` and `allNodes` on a device need `spec.perDeviceNodeSelection`"));
    }
    validate_taints_and_binding(dev, field, errs);
}

/// The node-selection one-of of a slice; returns whether `perDeviceNodeSelection` is set.
fn validate_node_selection(spec: &Value, errs: &mut Errors) -> bool {
    let node_name = spec.get("nodeName").and_then(Value::as_str).filter(|s| !s.is_empty());
    let selector = spec.get("nodeSelector").filter(|v| !v.is_null());
    let all_nodes = spec.get("allNodes").and_then(Value::as_bool) == Some(true);
    let per_device = spec.get("perDeviceNodeSelection").and_then(Value::as_bool) == Some(true);
    let set_count = usize::from(node_name.is_some())
        + usize::from(selector.is_some())
        + usize::from(all_nodes)
        + usize::from(per_device);
    if set_count == 0 {
        errs.push(FieldError::required("spec", "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"));
    } else if set_count > 1 {
        errs.push(FieldError::invalid("spec", "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, but multiple fields are set"));
    }
    if let Some(n) = node_name.filter(|n| !is_dns_subdomain(n)) {
        errs.push(FieldError::invalid("spec.nodeName", format!("{n:?}: must be a DNS subdomain")));
    }
    if let Some(sel) = selector {
        check_node_selector(sel, "spec.nodeSelector", errs);
    }

    per_device
}

fn validate_shared_counters(sets: &[Value], errs: &mut Errors) {
    if sets.len() > 8 {
        errs.push(FieldError::too_many("spec.sharedCounters", sets.len(), 8));
    }
    let mut seen = BTreeSet::new();
    for (i, set) in sets.iter().enumerate() {
        let field = format!("spec.sharedCounters[{i}]");
        check_dns_label(set.get("name"), &format!("{field}.name"), errs);
        if let Some(n) = set.get("name").and_then(Value::as_str)
            && !seen.insert(n)
        {
            errs.push(FieldError::duplicate(format!("{field}.name"), format!("{n:?}")));
        }
        let count = set.get("counters").and_then(Value::as_object).map_or(0, Map::len);
        if count == 0 {
            errs.push(FieldError::required(
                format!("{field}.counters"),
                "at least one counter is required",
            ));
        } else if count > 32 {
            errs.push(FieldError::too_many(format!("{field}.counters"), count, 32));
        }
    }
}

/// Device taints (≤ 16, known effects) and binding conditions (≤ 4 each, both or neither, disjoint).
fn validate_taints_and_binding(dev: &Value, field: &str, errs: &mut Errors) {
    if let Some(taints) = dev.get("taints").and_then(Value::as_array) {
        if taints.len() > 16 {
            errs.push(FieldError::too_many(format!("{field}.taints"), taints.len(), 16));
        }
        for (i, t) in taints.iter().enumerate() {
            let tfield = format!("{field}.taints[{i}]");
            match t.get("effect").and_then(Value::as_str) {
                Some("NoSchedule" | "NoExecute" | "None") => {}
                other => errs.push(FieldError::not_supported(
                    format!("{tfield}.effect"),
                    format!("{other:?}: supported values: \"NoSchedule\", \"NoExecute\", \"None\""),
                )),
            }
            if t.get("key").and_then(Value::as_str).is_none_or(str::is_empty) {
                errs.push(FieldError::required(format!("{tfield}.key"), "a taint key is required"));
            }
        }
    }
    let conds = dev.get("bindingConditions").and_then(Value::as_array);
    let fail = dev.get("bindingFailureConditions").and_then(Value::as_array);
    for (list, name) in [(conds, "bindingConditions"), (fail, "bindingFailureConditions")] {
        if let Some(l) = list
            && l.len() > 4
        {
            errs.push(FieldError::too_many(format!("{field}.{name}"), l.len(), 4));
        }
    }
    let has = |l: Option<&Vec<Value>>| l.is_some_and(|l| !l.is_empty());
    if has(conds) != has(fail) {
        errs.push(FieldError::invalid(
            format!("{field}.bindingFailureConditions"),
            "`bindingConditions` and `bindingFailureConditions` must be set together",
        ));
    }
    if let (Some(c), Some(f)) = (conds, fail)
        && let Some(dup) = c.iter().find(|x| f.contains(x))
    {
        errs.push(FieldError::invalid(
            format!("{field}.bindingFailureConditions"),
            format!("{dup} is also a binding condition"),
        ));
    }
}

impl FieldError {
    fn with_message(mut self, message: String) -> Self {
        self.message = message;
        self
    }
}
