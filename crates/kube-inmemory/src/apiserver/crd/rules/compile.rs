//! Compiling the `x-kubernetes-validations` entries of a schema into [`Rule`]s: each
//! entry's fields checked (`message`, `messageExpression`, `reason`, `fieldPath`), its
//! expressions compiled, and `oldSelf` refused where no old value can correlate.

use serde_json::{Value, json};

use super::Rule;
use super::check::compile_expression;
use crate::apiserver::crd::field::{child, index, invalid, key, not_supported, required};
use crate::apiserver::crd::schema::Node;
use crate::apiserver::error::FieldError;

/// `reason`s a rule may give.
const REASONS: [&str; 4] =
    ["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"];

/// Normalises a rule's `fieldPath` (`.provider`, `['a.b']`, `.labels['x']`) against the
/// node, as upstream's `ValidFieldPath` does.
fn normalize_field_path(path: &str, node: &Node) -> Result<String, String> {
    let mut out = String::new();
    let mut n = node;
    let mut rest = path;
    while !rest.is_empty() {
        let name;
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            name = r[..end].to_owned();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix("['") {
            let end = r.find("']").ok_or("expected ]")?;
            name = r[..end].replace("\\'", "'").replace("\\\\", "\\");
            rest = &r[end + 2..];
        } else {
            return Err(format!("expected [ or . but got: {rest}"));
        }
        if name.is_empty() {
            return Err("unexpected end of JSON path".into());
        }
        if let Some(p) = n.properties.get(&name) {
            out = child(&out, &name);
            n = p;
        } else if !n.properties.is_empty() || n.additional.is_none() {
            return Err("does not refer to a valid field".into());
        } else if let Some(extra) = n.additional.as_deref() {
            out = format!("{out}[{name}]");
            n = extra;
        }
    }
    Ok(out)
}

/// Compiles every `x-kubernetes-validations` entry of `node` and below (`path` is the
/// node's place in the definition). `uncorrelatable` names the list whose items have no
/// old value to compare with, where `oldSelf` is refused.
pub(crate) fn compile_all(
    node: &mut Node,
    path: &str,
    resource_root: bool,
    uncorrelatable: Option<&str>,
    errs: &mut Vec<FieldError>,
) {
    let rules = compile_node(node, node, path, resource_root, uncorrelatable, errs);
    node.rules = rules;
    for (name, prop) in &mut node.properties {
        let p = key(&child(path, "properties"), name);
        let embedded = prop.embedded;
        compile_all(prop, &p, embedded, uncorrelatable, errs);
    }
    if let Some(extra) = node.additional.as_deref_mut() {
        let embedded = extra.embedded;
        compile_all(extra, &child(path, "additionalProperties"), embedded, uncorrelatable, errs);
    }
    let items_uncorrelatable = if node.list_type.as_deref() == Some("map") {
        uncorrelatable.map(str::to_owned)
    } else {
        Some(uncorrelatable.map_or_else(|| path.to_owned(), str::to_owned))
    };
    if let Some(items) = node.items.as_deref_mut() {
        let embedded = items.embedded;
        compile_all(items, &child(path, "items"), embedded, items_uncorrelatable.as_deref(), errs);
    }
    // Rules in `allOf` run at this node's value.
    let mut all_of = std::mem::take(&mut node.all_of);
    for (i, nested) in all_of.iter_mut().enumerate() {
        nested.rules = compile_node(
            nested,
            node,
            &index(&child(path, "allOf"), i),
            resource_root,
            uncorrelatable,
            errs,
        );
    }
    node.all_of = all_of;
}

/// The fields of a `x-kubernetes-validations` entry, checked.
struct Entry {
    rule: String,
    message: Option<String>,
    message_expression: Option<String>,
    reason: Option<String>,
    field_path: Option<String>,
}

/// Checks an entry's fields other than the expressions (`at`: its path).
fn check_entry(
    raw: &Value,
    at: &str,
    structural: &Node,
    errs: &mut Vec<FieldError>,
) -> Option<Entry> {
    let text = |name: &str| raw.get(name).and_then(Value::as_str).map(str::to_owned);
    let source = text("rule").unwrap_or_default();
    let trimmed = source.trim().to_owned();
    let message = text("message");
    let message_trimmed = message.as_deref().map(str::trim);
    let mut ok = true;
    if trimmed.is_empty() {
        errs.push(required(child(at, "rule"), "rule is not specified"));
        ok = false;
    } else if message.as_deref().is_some_and(|m| !m.is_empty()) && message_trimmed == Some("") {
        errs.push(invalid(child(at, "message"), &json!(message), "must be non-empty if specified"));
        ok = false;
    } else if message_trimmed.is_some_and(|m| m.contains('\n')) {
        errs.push(invalid(child(at, "message"), &json!(message), "must not contain line breaks"));
        ok = false;
    } else if trimmed.contains('\n') && message_trimmed.is_none_or(str::is_empty) {
        errs.push(required(
            child(at, "message"),
            "message must be specified if rule contains line breaks",
        ));
        ok = false;
    }
    let message_expression = text("messageExpression");
    if message_expression.as_deref().is_some_and(|m| !m.is_empty() && m.trim().is_empty()) {
        errs.push(required(
            child(at, "messageExpression"),
            "messageExpression must be non-empty if specified",
        ));
        ok = false;
    }
    let reason = text("reason");
    if let Some(r) = &reason
        && !REASONS.contains(&r.as_str())
    {
        errs.push(not_supported(child(at, "reason"), &json!(r), &REASONS.map(str::to_owned)));
        ok = false;
    }
    let field_path = match text("fieldPath") {
        Some(fp) if fp.trim().is_empty() => {
            errs.push(invalid(
                child(at, "fieldPath"),
                &json!(fp),
                "must be non-empty if specified",
            ));
            ok = false;
            None
        }
        Some(fp) if fp.contains('\n') => {
            errs.push(invalid(child(at, "fieldPath"), &json!(fp), "must not contain line breaks"));
            ok = false;
            None
        }
        Some(fp) => {
            let normalized = normalize_field_path(fp.trim(), structural).ok();
            if normalized.is_none() {
                errs.push(invalid(child(at, "fieldPath"), &json!(fp), "must be a valid path"));
                ok = false;
            }
            normalized
        }
        None => None,
    };
    ok.then_some(Entry { rule: trimmed, message, message_expression, reason, field_path })
}

fn compile_node(
    declared: &Node,
    structural: &Node,
    path: &str,
    resource_root: bool,
    uncorrelatable: Option<&str>,
    errs: &mut Vec<FieldError>,
) -> Vec<Rule> {
    let mut out = Vec::new();
    for (i, raw) in declared.raw_rules.iter().enumerate() {
        let at = index(&child(path, "x-kubernetes-validations"), i);
        let Some(entry) = check_entry(raw, &at, structural, errs) else { continue };
        let Entry { rule: trimmed, message, message_expression, reason, field_path } = entry;
        let optional_old_self = raw.get("optionalOldSelf").and_then(Value::as_bool);
        let compiled = compile_expression(
            &trimmed,
            structural,
            resource_root,
            optional_old_self == Some(true),
        );
        let (program, mut uses_old_self) = match compiled {
            Ok(c) => c,
            Err(detail) => {
                errs.push(invalid(child(&at, "rule"), raw, &detail));
                continue;
            }
        };
        let message_program =
            match message_expression.as_deref().map(str::trim).filter(|m| !m.is_empty()) {
                Some(src) => match compile_expression(
                    src,
                    structural,
                    resource_root,
                    optional_old_self == Some(true),
                ) {
                    Ok((p, uses)) => {
                        uses_old_self |= uses;
                        Some(p)
                    }
                    Err(detail) => {
                        errs.push(invalid(child(&at, "messageExpression"), raw, &detail));
                        continue;
                    }
                },
                None => None,
            };
        if uses_old_self {
            if let Some(list) = uncorrelatable {
                errs.push(invalid(
                    child(&at, "rule"),
                    &json!(trimmed),
                    &format!("oldSelf cannot be used on the uncorrelatable portion of the schema within {list}"),
                ));
                continue;
            }
        } else if let Some(flag) = optional_old_self {
            errs.push(invalid(
                child(&at, "optionalOldSelf"),
                &json!(flag),
                "may not be set if oldSelf is not used in rule",
            ));
            continue;
        }
        out.push(Rule {
            source: trimmed,
            program,
            message: message.map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()),
            message_expression: message_program,
            field_path,
            reason,
            optional_old_self: optional_old_self == Some(true),
            uses_old_self,
        });
    }
    out
}
