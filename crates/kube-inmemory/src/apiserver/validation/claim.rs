//! `ResourceClaim` (§3.2) and the claim spec it shares with `ResourceClaimTemplate`:
//! device requests, their selectors and allocation modes, and opaque driver configuration,
//! with `DeviceClass` (§3.4), whose selectors and configuration follow the same rules.

use std::collections::BTreeSet;

use serde_json::Value;

use super::claim_status::validate_claim_status;
use super::names::{check_dns_label, check_driver_name};
use super::{Errors, check_count};
use crate::apiserver::error::FieldError;

/// `DeviceClass` (§3.4): selectors and config as in claims (≤ 32 each, CEL ≤ 10 KiB,
/// opaque parameters a JSON object ≤ 10 KiB).
pub(super) fn validate_device_class(obj: &Value, errs: &mut Errors) {
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

pub(super) fn validate_claim(obj: &Value, old: Option<&Value>, errs: &mut Errors) {
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

pub(super) fn validate_claim_spec(spec: &Value, field: &str, errs: &mut Errors) {
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
pub(super) fn check_raw_object(v: Option<&Value>, field: &str, required: bool, errs: &mut Errors) {
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
