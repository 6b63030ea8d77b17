//! Object validation with field paths, as the real API server answers 422 Invalid: metadata
//! for every kind, and the resource.k8s.io/v1 rules of `ResourceSlices` and `ResourceClaims`
//! (protocols.md §3.1–§3.3).

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::{Map, Value};

use super::error::FieldError;
use super::resources::ResourceInfo;

type Errors = Vec<FieldError>;

/// Validates a create (`old` = None) or an update of `obj`.
pub(crate) fn validate(resource: &ResourceInfo, obj: &Value, old: Option<&Value>) -> Errors {
    let mut errs = Vec::new();
    validate_metadata(resource, obj, &mut errs);
    if resource.custom.is_some() {
        return errs;
    }
    match (resource.group.as_str(), resource.kind.as_str()) {
        ("resource.k8s.io", "ResourceSlice") => validate_slice(obj, old, &mut errs),
        ("resource.k8s.io", "ResourceClaim") => validate_claim(obj, old, &mut errs),
        ("resource.k8s.io", "ResourceClaimTemplate") => {
            if let Some(spec) = obj.pointer("/spec/spec") {
                validate_claim_spec(spec, "spec.spec", &mut errs);
            }
        }
        ("resource.k8s.io", "DeviceClass") => validate_device_class(obj, &mut errs),
        _ => {}
    }
    errs
}

/// `DeviceClass` (§3.4): selectors and config as in claims (≤ 32 each, CEL ≤ 10 KiB,
/// opaque parameters a JSON object ≤ 10 KiB).
fn validate_device_class(obj: &Value, errs: &mut Errors) {
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        return;
    };
    check_count(spec.get("selectors"), "spec.selectors", 32, errs);
    check_count(spec.get("config"), "spec.config", 32, errs);
    for (i, sel) in
        spec.get("selectors").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        if let Some(expr) = sel.pointer("/cel/expression").and_then(Value::as_str)
            && expr.len() > 10 * 1024
        {
            errs.push(FieldError::too_long(
                format!("spec.selectors[{i}].cel.expression"),
                expr.len(),
                10 * 1024,
            ));
        }
    }
    for (i, cfg) in spec.get("config").and_then(Value::as_array).into_iter().flatten().enumerate() {
        validate_opaque(cfg.get("opaque"), &format!("spec.config[{i}].opaque"), errs);
    }
}

// ---------------------------------------------------------------------------------------
// Names

/// RFC 1123 label: lowercase alphanumerics and '-', starting and ending alphanumeric.
pub(crate) fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// C identifier: `[A-Za-z_][A-Za-z0-9_]*`.
fn is_c_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Checks a `QualifiedName`: a C identifier (≤ 32) or `<DNS subdomain ≤ 63>/<C identifier ≤ 32>`.
fn check_qualified_name(name: &str, field: &str, errs: &mut Errors) {
    let (domain, id) = match name.split_once('/') {
        Some((d, i)) => (Some(d), i),
        None => (None, name),
    };
    if let Some(d) = domain {
        if d.len() > 63 {
            errs.push(FieldError::too_long(field, d.len(), 63));
        } else if !is_dns_subdomain(d) {
            errs.push(FieldError::invalid(
                field,
                format!("{name:?}: the domain must be a DNS subdomain"),
            ));
        }
    }
    if id.len() > 32 {
        errs.push(FieldError::too_long(field, id.len(), 32));
    } else if !is_c_identifier(id) {
        errs.push(FieldError::invalid(field, format!("{name:?}: the name must be a C identifier")));
    }
}

fn check_driver_name(v: Option<&Value>, field: &str, errs: &mut Errors) {
    match v.and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(field, "a driver name is required")),
        Some(s) if s.len() > 63 => errs.push(FieldError::too_long(field, s.len(), 63)),
        Some(s) if !is_dns_subdomain(s) => errs
            .push(FieldError::invalid(field, format!("{s:?}: must be a lowercase DNS subdomain"))),
        Some(_) => {}
    }
}

fn check_pool_name(v: Option<&Value>, field: &str, errs: &mut Errors) {
    match v.and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(field, "a pool name is required")),
        Some(s) if s.len() > 253 => errs.push(FieldError::too_long(field, s.len(), 253)),
        Some(s) if !s.split('/').all(is_dns_subdomain) => errs.push(FieldError::invalid(
            field,
            format!("{s:?}: must be one or more DNS subdomains separated by '/'"),
        )),
        Some(_) => {}
    }
}

fn check_dns_label(v: Option<&Value>, field: &str, errs: &mut Errors) {
    match v.and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(field, "a name is required")),
        Some(s) if s.len() > 63 => errs.push(FieldError::too_long(field, s.len(), 63)),
        Some(s) if !is_dns_label(s) => {
            errs.push(FieldError::invalid(field, format!("{s:?}: must be a DNS label")));
        }
        Some(_) => {}
    }
}

fn label_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}

fn validate_metadata(resource: &ResourceInfo, obj: &Value, errs: &mut Errors) {
    let name = obj.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        errs.push(FieldError::required("metadata.name", "name or generateName is required"));
    } else {
        let ok =
            if resource.kind == "Namespace" { is_dns_label(name) } else { is_dns_subdomain(name) };
        if !ok {
            errs.push(FieldError::invalid(
                "metadata.name",
                format!("{name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"),
            ));
        }
    }
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            let field = format!("metadata.labels[{k}]");
            let (prefix, key_name) =
                k.split_once('/').map_or((None, k.as_str()), |(p, n)| (Some(p), n));
            if prefix.is_some_and(|p| !is_dns_subdomain(p)) || !label_name_ok(key_name) {
                errs.push(FieldError::invalid(&field, format!("{k:?}: invalid label key")));
            }
            match v.as_str() {
                Some("") => {}
                Some(s) if label_name_ok(s) => {}
                _ => errs.push(FieldError::invalid(&field, format!("{v}: invalid label value"))),
            }
        }
    }
    if let Some(annotations) = obj.pointer("/metadata/annotations").and_then(Value::as_object) {
        let total: usize =
            annotations.iter().map(|(k, v)| k.len() + v.as_str().map_or(0, str::len)).sum();
        if total > 256 * 1024 {
            errs.push(FieldError::too_long("metadata.annotations", total, 256 * 1024));
        }
        for (k, v) in annotations {
            if !v.is_string() {
                errs.push(FieldError::invalid(
                    format!("metadata.annotations[{k}]"),
                    "must be a string",
                ));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Quantities (for capacity request policies)

/// Parses a Kubernetes quantity (`100m`, `1Gi`, `1e3`, `256`) into a number.
pub(crate) fn parse_quantity(s: &str) -> Option<f64> {
    let s = s.trim();
    let suffixes: [(&str, f64); 15] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("n", 1e-9),
        ("u", 1e-6),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    for (suffix, factor) in suffixes {
        if let Some(num) = s.strip_suffix(suffix) {
            return parse_decimal(num).map(|n| n * factor);
        }
    }
    if let Some((mantissa, exp)) = s.split_once(['e', 'E']) {
        let exp: i32 = exp.parse().ok()?;
        return parse_decimal(mantissa).map(|n| n * 10f64.powi(exp));
    }
    parse_decimal(s)
}

fn parse_decimal(s: &str) -> Option<f64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        || digits.matches('.').count() > 1
    {
        return None;
    }
    s.parse().ok()
}

fn quantity(v: Option<&Value>) -> Option<f64> {
    match v? {
        Value::String(s) => parse_quantity(s),
        Value::Number(n) => n.as_f64(),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// ResourceSlice (§3.1)

fn validate_slice(obj: &Value, old: Option<&Value>, errs: &mut Errors) {
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

const LIST_ATTRIBUTE_MEMBERS: [&str; 4] = ["ints", "bools", "strings", "versions"];

fn is_list_attribute(attr: &Value) -> bool {
    LIST_ATTRIBUTE_MEMBERS.iter().any(|m| attr.get(*m).is_some_and(|v| !v.is_null()))
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

/// `status.devices[].conditions`: ≤ 8, list-map key `type`, status True/False/Unknown.
fn validate_device_conditions(conds: &[Value], field: &str, errs: &mut Errors) {
    if conds.len() > 8 {
        errs.push(FieldError::too_many(format!("{field}.conditions"), conds.len(), 8));
    }
    let mut types = BTreeSet::new();
    for (j, c) in conds.iter().enumerate() {
        let t = c.get("type").and_then(Value::as_str).unwrap_or_default();
        if t.is_empty() {
            errs.push(FieldError::required(
                format!("{field}.conditions[{j}].type"),
                "a condition type is required",
            ));
        } else if !types.insert(t) {
            errs.push(FieldError::duplicate(
                format!("{field}.conditions[{j}].type"),
                format!("{t:?}"),
            ));
        }
        match c.get("status").and_then(Value::as_str) {
            Some("True" | "False" | "Unknown") => {}
            other => errs.push(FieldError::not_supported(
                format!("{field}.conditions[{j}].status"),
                format!("{other:?}: supported values: \"False\", \"True\", \"Unknown\""),
            )),
        }
        check_condition_meta(c, &format!("{field}.conditions[{j}]"), errs);
    }
}

/// The metav1.Condition rules the real server applies to every condition list: a
/// lastTransitionTime, a CamelCase reason (≤ 1024), a message ≤ 32768, a non-negative
/// observedGeneration, and a qualified-name type.
fn check_condition_meta(c: &Value, field: &str, errs: &mut Errors) {
    let t = c.get("type").and_then(Value::as_str).unwrap_or_default();
    let (prefix, name) = t.split_once('/').map_or((None, t), |(p, n)| (Some(p), n));
    if !t.is_empty() && (prefix.is_some_and(|p| !is_dns_subdomain(p)) || !label_name_ok(name)) {
        errs.push(FieldError::invalid(
            format!("{field}.type"),
            format!("{t:?}: must be a qualified name"),
        ));
    }
    if c.get("lastTransitionTime").and_then(Value::as_str).is_none_or(str::is_empty) {
        errs.push(FieldError::required(format!("{field}.lastTransitionTime"), "must be set"));
    }
    match c.get("reason").and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(format!("{field}.reason"), "a reason is required")),
        Some(r) if r.len() > 1024 => errs.push(FieldError::too_long(format!("{field}.reason"), r.len(), 1024)),
        Some(r) if !is_condition_reason(r) => errs.push(FieldError::invalid(
            format!("{field}.reason"),
            format!("{r:?}: a condition reason must start with a letter and contain only letters, digits, '_', ',' and ':', ending with a letter, digit or '_'"),
        )),
        Some(_) => {}
    }
    if let Some(m) = c.get("message").and_then(Value::as_str)
        && m.len() > 32768
    {
        errs.push(FieldError::too_long(format!("{field}.message"), m.len(), 32768));
    }
    if c.get("observedGeneration").and_then(Value::as_i64).is_some_and(|g| g < 0) {
        errs.push(FieldError::invalid(
            format!("{field}.observedGeneration"),
            "must be greater than or equal to zero",
        ));
    }
}

/// `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`
fn is_condition_reason(r: &str) -> bool {
    let b = r.as_bytes();
    b.first().is_some_and(u8::is_ascii_alphabetic)
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b',' | b':'))
        && b.last().is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
}

/// Validates one attribute; returns how many list values it holds.
fn validate_attribute(attr: &Value, field: &str, errs: &mut Errors) -> usize {
    let members = ["int", "bool", "string", "version", "ints", "bools", "strings", "versions"];
    let set: Vec<&str> =
        members.iter().copied().filter(|m| attr.get(*m).is_some_and(|v| !v.is_null())).collect();
    if set.len() != 1 {
        errs.push(FieldError::invalid(
            field.to_owned(),
            format!("exactly one value must be specified, found {}", set.len()),
        ));
    }
    if let Some(s) = attr.get("string").and_then(Value::as_str) {
        let n = s.chars().count();
        if n > 64 {
            errs.push(FieldError::too_long(format!("{field}.string"), n, 64));
        }
    }
    if let Some(v) = attr.get("version").and_then(Value::as_str) {
        if v.len() > 64 {
            errs.push(FieldError::too_long(format!("{field}.version"), v.len(), 64));
        } else if !is_semver(v) {
            errs.push(FieldError::invalid(
                format!("{field}.version"),
                format!("{v:?}: must be a semantic version (semver 2.0.0)"),
            ));
        }
    }
    let mut values = 0;
    for m in LIST_ATTRIBUTE_MEMBERS {
        if let Some(v) = attr.get(m).filter(|v| !v.is_null()) {
            let n = v.as_array().map_or(0, Vec::len);
            if n == 0 {
                errs.push(FieldError::required(
                    format!("{field}.{m}"),
                    "a list attribute must not be empty",
                ));
            }
            values += n;
        }
    }
    values
}

/// Semantic Versioning 2.0.0: `MAJOR.MINOR.PATCH[-pre][+build]`, no leading zeros.
pub(crate) fn is_semver(v: &str) -> bool {
    fn numeric(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
    }
    fn ident(s: &str) -> bool {
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    }
    let (rest, build) = v.split_once('+').map_or((v, None), |(r, b)| (r, Some(b)));
    let (core, pre) = rest.split_once('-').map_or((rest, None), |(c, p)| (c, Some(p)));
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| numeric(p))
        && pre.is_none_or(|p| {
            p.split('.')
                .all(|id| ident(id) && (!id.bytes().all(|b| b.is_ascii_digit()) || numeric(id)))
        })
        && build.is_none_or(|b| b.split('.').all(ident))
}

fn validate_capacity(cap: &Value, field: &str, multi: bool, errs: &mut Errors) {
    let value = quantity(cap.get("value"));
    if value.is_none() {
        errs.push(FieldError::required(format!("{field}.value"), "a quantity is required"));
    }
    let Some(policy) = cap.get("requestPolicy").filter(|p| !p.is_null()) else {
        return;
    };
    let pfield = format!("{field}.requestPolicy");
    if !multi {
        errs.push(FieldError::forbidden(
            pfield.clone(),
            "allowed only when `allowMultipleAllocations` is true",
        ));
    }
    let default = quantity(policy.get("default"));
    let valid_values =
        policy.get("validValues").and_then(Value::as_array).filter(|v| !v.is_empty());
    let valid_range = policy.get("validRange").filter(|r| !r.is_null());
    if valid_values.is_some() && valid_range.is_some() {
        errs.push(FieldError::forbidden(
            pfield.clone(),
            "only one of `validValues` and `validRange` may be set",
        ));
    }
    if (valid_values.is_some() || valid_range.is_some()) && default.is_none() {
        errs.push(FieldError::required(
            format!("{pfield}.default"),
            "required when `validValues` or `validRange` is set",
        ));
    }
    if let Some(values) = valid_values {
        if values.len() > 10 {
            errs.push(FieldError::too_many(format!("{pfield}.validValues"), values.len(), 10));
        }
        let parsed: Vec<Option<f64>> = values.iter().map(|v| quantity(Some(v))).collect();
        if parsed.windows(2).any(|w| matches!((w[0], w[1]), (Some(a), Some(b)) if a >= b)) {
            errs.push(FieldError::invalid(
                format!("{pfield}.validValues"),
                "must be sorted in ascending order without duplicates",
            ));
        }
        if let Some(d) = default
            && !parsed.contains(&Some(d))
        {
            errs.push(FieldError::invalid(
                format!("{pfield}.default"),
                "must be one of `validValues`",
            ));
        }
    }
    if let Some(range) = valid_range {
        validate_range(range, value, &pfield, errs);
    }
}

/// `validRange`: min required with 0 ≤ min ≤ value, min ≤ max ≤ value, step > 0.
fn validate_range(range: &Value, value: Option<f64>, pfield: &str, errs: &mut Errors) {
    let rfield = format!("{pfield}.validRange");
    match quantity(range.get("min")) {
        None => errs.push(FieldError::required(format!("{rfield}.min"), "min is required")),
        Some(min) => {
            if min < 0.0 || value.is_some_and(|v| min > v) {
                errs.push(FieldError::invalid(
                    format!("{rfield}.min"),
                    "must be between 0 and the capacity value",
                ));
            }
            if let Some(max) = quantity(range.get("max"))
                && max < min
            {
                errs.push(FieldError::invalid(
                    format!("{rfield}.max"),
                    "must not be less than min",
                ));
            }
        }
    }
    if let Some(max) = quantity(range.get("max"))
        && value.is_some_and(|v| max > v)
    {
        errs.push(FieldError::invalid(
            format!("{rfield}.max"),
            "must not exceed the capacity value",
        ));
    }
    if let Some(step) = quantity(range.get("step"))
        && step <= 0.0
    {
        errs.push(FieldError::invalid(format!("{rfield}.step"), "must be greater than zero"));
    }
}

// ---------------------------------------------------------------------------------------
// ResourceClaim (§3.2, §3.3)

fn validate_claim(obj: &Value, old: Option<&Value>, errs: &mut Errors) {
    match obj.get("spec") {
        Some(spec) if spec.is_object() => validate_claim_spec(spec, "spec", errs),
        _ => errs.push(FieldError::required("spec", "spec is required")),
    }
    if let Some(old) = old {
        if old.get("spec") != obj.get("spec") {
            errs.push(FieldError::invalid("spec", "field is immutable"));
        }
        let old_alloc = old.pointer("/status/allocation").filter(|a| !a.is_null());
        let new_alloc = obj.pointer("/status/allocation").filter(|a| !a.is_null());
        if old_alloc.is_some() && new_alloc.is_some() && old_alloc != new_alloc {
            errs.push(FieldError::invalid("status.allocation", "field is immutable once set"));
        }
    }
    if let Some(status) = obj.get("status").filter(|s| !s.is_null()) {
        validate_claim_status(status, errs);
    }
}

fn check_count(v: Option<&Value>, field: &str, max: usize, errs: &mut Errors) {
    if let Some(n) = v.and_then(Value::as_array).map(Vec::len).filter(|n| *n > max) {
        errs.push(FieldError::too_many(field, n, max));
    }
}

fn validate_claim_spec(spec: &Value, field: &str, errs: &mut Errors) {
    let devices = spec.get("devices");
    let dfield = format!("{field}.devices");
    let Some(devices) = devices.filter(|d| d.is_object()) else {
        return;
    };
    check_count(devices.get("requests"), &format!("{dfield}.requests"), 32, errs);
    check_count(devices.get("constraints"), &format!("{dfield}.constraints"), 32, errs);
    check_count(devices.get("config"), &format!("{dfield}.config"), 32, errs);
    let mut names = BTreeSet::new();
    for (i, req) in
        devices.get("requests").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        let rfield = format!("{dfield}.requests[{i}]");
        check_dns_label(req.get("name"), &format!("{rfield}.name"), errs);
        if let Some(n) = req.get("name").and_then(Value::as_str)
            && !names.insert(n)
        {
            errs.push(FieldError::duplicate(format!("{rfield}.name"), format!("{n:?}")));
        }
        let exactly = req.get("exactly").filter(|v| !v.is_null());
        let first = req.get("firstAvailable").and_then(Value::as_array).filter(|v| !v.is_empty());
        match (exactly, first) {
            (Some(_), Some(_)) => errs.push(FieldError::forbidden(rfield.clone(), "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set")),
            (None, None) => errs.push(FieldError::required(rfield.clone(), "exactly one of `exactly` or `firstAvailable` is required")),
            _ => {}
        }
        if let Some(ex) = exactly {
            validate_exact_request(ex, &format!("{rfield}.exactly"), true, errs);
        }
        if let Some(subs) = first {
            if subs.len() > 8 {
                errs.push(FieldError::too_many(format!("{rfield}.firstAvailable"), subs.len(), 8));
            }
            for (j, sub) in subs.iter().enumerate() {
                let sfield = format!("{rfield}.firstAvailable[{j}]");
                check_dns_label(sub.get("name"), &format!("{sfield}.name"), errs);
                validate_exact_request(sub, &sfield, false, errs);
            }
        }
    }
    for (i, cfg) in
        devices.get("config").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        validate_opaque(cfg.get("opaque"), &format!("{dfield}.config[{i}].opaque"), errs);
    }
}

fn validate_exact_request(req: &Value, field: &str, admin_allowed: bool, errs: &mut Errors) {
    if req.get("deviceClassName").and_then(Value::as_str).is_none_or(str::is_empty) {
        errs.push(FieldError::required(
            format!("{field}.deviceClassName"),
            "a device class name is required",
        ));
    }
    check_count(req.get("selectors"), &format!("{field}.selectors"), 32, errs);
    for (i, sel) in req.get("selectors").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        if let Some(expr) = sel.pointer("/cel/expression").and_then(Value::as_str)
            && expr.len() > 10 * 1024
        {
            errs.push(FieldError::too_long(
                format!("{field}.selectors[{i}].cel.expression"),
                expr.len(),
                10 * 1024,
            ));
        }
    }
    let mode = req.get("allocationMode").and_then(Value::as_str).unwrap_or("ExactCount");
    match mode {
        "ExactCount" => {
            if req.get("count").and_then(Value::as_i64).is_some_and(|c| c <= 0) {
                errs.push(FieldError::invalid(
                    format!("{field}.count"),
                    "must be greater than zero",
                ));
            }
        }
        "All" => {
            if req.get("count").and_then(Value::as_i64).is_some_and(|c| c != 0) {
                errs.push(FieldError::invalid(
                    format!("{field}.count"),
                    "must not be set when allocationMode is All",
                ));
            }
        }
        other => errs.push(FieldError::not_supported(
            format!("{field}.allocationMode"),
            format!("{other:?}: supported values: \"All\", \"ExactCount\""),
        )),
    }
    check_count(req.get("tolerations"), &format!("{field}.tolerations"), 16, errs);
    if !admin_allowed && req.get("adminAccess").is_some_and(|v| !v.is_null()) {
        errs.push(FieldError::forbidden(
            format!("{field}.adminAccess"),
            "not allowed in a subrequest",
        ));
    }
}

fn validate_opaque(opaque: Option<&Value>, field: &str, errs: &mut Errors) {
    let Some(opaque) = opaque.filter(|o| !o.is_null()) else {
        return;
    };
    check_driver_name(opaque.get("driver"), &format!("{field}.driver"), errs);
    check_raw_object(opaque.get("parameters"), &format!("{field}.parameters"), true, errs);
}

/// A `RawExtension` that must be a JSON object of at most 10 KiB.
fn check_raw_object(v: Option<&Value>, field: &str, required: bool, errs: &mut Errors) {
    match v {
        None | Some(Value::Null) => {
            if required {
                errs.push(FieldError::required(field, "parameters are required"));
            }
        }
        Some(v @ Value::Object(_)) => {
            let len = v.to_string().len();
            if len > 10 * 1024 {
                errs.push(FieldError::too_long(field, len, 10 * 1024));
            }
        }
        Some(_) => errs.push(FieldError::invalid(field, "must be a valid JSON object")),
    }
}

fn device_key(v: &Value) -> (String, String, String, Option<String>) {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    (
        s("driver"),
        s("pool"),
        s("device"),
        v.get("shareID").and_then(Value::as_str).map(str::to_owned),
    )
}

fn validate_claim_status(status: &Value, errs: &mut Errors) {
    let results = status.pointer("/allocation/devices/results").and_then(Value::as_array);
    check_count(
        status.pointer("/allocation/devices/results"),
        "status.allocation.devices.results",
        32,
        errs,
    );
    check_count(
        status.pointer("/allocation/devices/config"),
        "status.allocation.devices.config",
        64,
        errs,
    );
    check_count(status.get("reservedFor"), "status.reservedFor", 256, errs);
    let mut uids = BTreeSet::new();
    for (i, r) in
        status.get("reservedFor").and_then(Value::as_array).into_iter().flatten().enumerate()
    {
        if let Some(uid) = r.get("uid").and_then(Value::as_str)
            && !uids.insert(uid)
        {
            errs.push(FieldError::duplicate(
                format!("status.reservedFor[{i}].uid"),
                format!("{uid:?}"),
            ));
        }
    }
    let allocated: BTreeSet<_> = results.into_iter().flatten().map(device_key).collect();
    let Some(devices) = status.get("devices").and_then(Value::as_array) else {
        return;
    };
    let mut seen = BTreeSet::new();
    for (i, dev) in devices.iter().enumerate() {
        let field = format!("status.devices[{i}]");
        check_driver_name(dev.get("driver"), &format!("{field}.driver"), errs);
        check_pool_name(dev.get("pool"), &format!("{field}.pool"), errs);
        check_dns_label(dev.get("device"), &format!("{field}.device"), errs);
        if let Some(share) = dev.get("shareID").and_then(Value::as_str)
            && !is_uuid(share)
        {
            errs.push(FieldError::invalid(
                format!("{field}.shareID"),
                format!("{share:?}: must be a lowercase UUID"),
            ));
        }
        let key = device_key(dev);
        if !seen.insert(key.clone()) {
            errs.push(FieldError::duplicate(
                field.clone(),
                format!(
                    "duplicate entry for driver {:?} pool {:?} device {:?} shareID {:?}",
                    key.0, key.1, key.2, key.3
                ),
            ));
        }
        if !allocated.contains(&key) {
            errs.push(FieldError::invalid(field.clone(), format!("device status is only allowed for allocated devices: driver {:?} pool {:?} device {:?} shareID {:?} is not in status.allocation.devices.results", key.0, key.1, key.2, key.3)));
        }
        if let Some(conds) = dev.get("conditions").and_then(Value::as_array) {
            validate_device_conditions(conds, &field, errs);
        }
        check_raw_object(dev.get("data"), &format!("{field}.data"), false, errs);
        if let Some(nd) = dev.get("networkData").filter(|n| !n.is_null()) {
            validate_network_data(nd, &format!("{field}.networkData"), errs);
        }
    }
}

fn validate_network_data(nd: &Value, field: &str, errs: &mut Errors) {
    if let Some(name) = nd.get("interfaceName").and_then(Value::as_str)
        && name.len() > 256
    {
        errs.push(FieldError::too_long(format!("{field}.interfaceName"), name.len(), 256));
    }
    if let Some(hw) = nd.get("hardwareAddress").and_then(Value::as_str)
        && hw.len() > 128
    {
        errs.push(FieldError::too_long(format!("{field}.hardwareAddress"), hw.len(), 128));
    }
    if let Some(ips) = nd.get("ips").and_then(Value::as_array) {
        if ips.len() > 16 {
            errs.push(FieldError::too_many(format!("{field}.ips"), ips.len(), 16));
        }
        let mut seen = BTreeSet::new();
        for (i, ip) in ips.iter().enumerate() {
            let ifield = format!("{field}.ips[{i}]");
            let s = ip.as_str().unwrap_or_default();
            if !is_canonical_interface_cidr(s) {
                errs.push(FieldError::invalid(&ifield, format!("{s:?}: must be an interface address in canonical CIDR form (e.g. 192.0.2.5/24, 2001:db8::5/64)")));
            }
            if !seen.insert(s) {
                errs.push(FieldError::duplicate(&ifield, format!("{s:?}")));
            }
        }
    }
}

/// `addr/prefix` where the address is written canonically (RFC 5952 for IPv6, dotted quad
/// without leading zeros for IPv4) and the prefix is a plain decimal within range. Host
/// bits are allowed: these are interface addresses, not subnets.
pub(crate) fn is_canonical_interface_cidr(s: &str) -> bool {
    let Some((addr, prefix)) = s.split_once('/') else {
        return false;
    };
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return false;
    };
    let Ok(bits) = prefix.parse::<u8>() else {
        return false;
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    ip.to_string() == addr && bits.to_string() == prefix && bits <= max
}

fn is_uuid(s: &str) -> bool {
    uuid::Uuid::parse_str(s).is_ok_and(|u| u.hyphenated().to_string() == s)
}

impl FieldError {
    fn with_message(mut self, message: String) -> Self {
        self.message = message;
        self
    }
}
