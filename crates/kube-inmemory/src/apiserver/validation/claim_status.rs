//! `ResourceClaim` status (§3.3): allocation results and reservations, and the device
//! status a driver writes: conditions, raw data and network data.

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde_json::Value;

use super::claim::check_raw_object;
use super::names::{
    check_dns_label, check_driver_name, check_pool_name, is_dns_subdomain, label_name_ok,
};
use super::{Errors, check_count};
use crate::apiserver::error::FieldError;

fn device_key(v: &Value) -> (String, String, String, Option<String>) {
    let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or_default().to_owned();
    (
        s("driver"),
        s("pool"),
        s("device"),
        v.get("shareID").and_then(Value::as_str).map(str::to_owned),
    )
}

pub(super) fn validate_claim_status(status: &Value, errs: &mut Errors) {
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
