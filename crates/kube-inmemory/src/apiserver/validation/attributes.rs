//! The attributes and capacities of a `ResourceSlice` device (§3.1): one typed value per
//! attribute, list attributes and their sizes, semantic versions, and capacity values with
//! their request policies.

use serde_json::Value;

use super::Errors;
use super::quantity::quantity;
use crate::apiserver::error::FieldError;

const LIST_ATTRIBUTE_MEMBERS: [&str; 4] = ["ints", "bools", "strings", "versions"];

pub(super) fn is_list_attribute(attr: &Value) -> bool {
    LIST_ATTRIBUTE_MEMBERS.iter().any(|m| attr.get(*m).is_some_and(|v| !v.is_null()))
}

/// Validates one attribute; returns how many list values it holds.
pub(super) fn validate_attribute(attr: &Value, field: &str, errs: &mut Errors) -> usize {
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

pub(super) fn validate_capacity(cap: &Value, field: &str, multi: bool, errs: &mut Errors) {
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
