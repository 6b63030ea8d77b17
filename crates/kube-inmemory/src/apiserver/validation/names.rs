//! The name formats of the API (RFC 1123 labels and subdomains, C identifiers, qualified
//! names, label keys and values) and the checks of the name fields that use them.

use serde_json::Value;

use super::Errors;
use crate::apiserver::error::FieldError;

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
pub(super) fn check_qualified_name(name: &str, field: &str, errs: &mut Errors) {
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

pub(super) fn check_driver_name(v: Option<&Value>, field: &str, errs: &mut Errors) {
    match v.and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(field, "a driver name is required")),
        Some(s) if s.len() > 63 => errs.push(FieldError::too_long(field, s.len(), 63)),
        Some(s) if !is_dns_subdomain(s) => errs
            .push(FieldError::invalid(field, format!("{s:?}: must be a lowercase DNS subdomain"))),
        Some(_) => {}
    }
}

pub(super) fn check_pool_name(v: Option<&Value>, field: &str, errs: &mut Errors) {
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

pub(super) fn check_dns_label(v: Option<&Value>, field: &str, errs: &mut Errors) {
    match v.and_then(Value::as_str) {
        None | Some("") => errs.push(FieldError::required(field, "a name is required")),
        Some(s) if s.len() > 63 => errs.push(FieldError::too_long(field, s.len(), 63)),
        Some(s) if !is_dns_label(s) => {
            errs.push(FieldError::invalid(field, format!("{s:?}: must be a DNS label")));
        }
        Some(_) => {}
    }
}

pub(super) fn label_name_ok(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.as_bytes()[s.len() - 1].is_ascii_alphanumeric()
}
