//! Label and field selectors as list and watch filters (`labelSelector=`, `fieldSelector=`).

use serde_json::Value;

use super::error::ApiError;
use super::resources::ResourceInfo;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelRequirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` (all requirements must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    requirements: Vec<LabelRequirement>,
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0_i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_set(key: &str, rest: &str, raw: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest.strip_prefix('(').and_then(|r| r.strip_suffix(')')).ok_or_else(|| {
        ApiError::bad_request(format!(
            "unable to parse requirement: {raw:?}: expected '(' ... ')' after {key:?}"
        ))
    })?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()).collect())
}

fn check_key(key: &str, raw: &str) -> Result<String, ApiError> {
    let key = key.trim();
    if key.is_empty() || key.contains(char::is_whitespace) {
        return Err(ApiError::bad_request(format!(
            "unable to parse requirement: {raw:?}: invalid label key {key:?}"
        )));
    }
    Ok(key.to_owned())
}

impl LabelSelector {
    /// Parses the Kubernetes label selector syntax: `a=b`, `a==b`, `a!=b`, `a in (x,y)`,
    /// `a notin (x)`, `a`, `!a`, comma-separated.
    pub(crate) fn parse(s: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for raw in split_top_level(s) {
            let part = raw.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some(key) = part.strip_prefix('!') {
                LabelRequirement::NotExists(check_key(key, raw)?)
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelRequirement::NotEquals(check_key(k, raw)?, v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelRequirement::Equals(check_key(k, raw)?, v.trim().to_owned())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelRequirement::Equals(check_key(k, raw)?, v.trim().to_owned())
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                LabelRequirement::NotIn(check_key(k, raw)?, parse_set(k, rest, raw)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                LabelRequirement::In(check_key(k, raw)?, parse_set(k, rest, raw)?)
            } else {
                LabelRequirement::Exists(check_key(part, raw)?)
            };
            requirements.push(req);
        }
        Ok(Self { requirements })
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.requirements.iter().all(|req| match req {
            LabelRequirement::Equals(k, v) => get(k) == Some(v.as_str()),
            LabelRequirement::NotEquals(k, v) => get(k) != Some(v.as_str()),
            LabelRequirement::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelRequirement::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelRequirement::Exists(k) => get(k).is_some(),
            LabelRequirement::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `field=value`, `field==value`, `field!=value`, comma-separated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    /// `(field, value, equal)` triples.
    terms: Vec<(String, String, bool)>,
}

impl FieldSelector {
    /// Parses and checks every field against what the resource supports (the real server
    /// answers 400 `field label not supported` otherwise).
    pub(crate) fn parse(s: &str, resource: &ResourceInfo) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, value, equal) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                )));
            };
            let field = field.trim();
            if !resource.field_selectable(field) {
                return Err(ApiError::bad_request(format!("field label not supported: {field}")));
            }
            terms.push((field.to_owned(), value.trim().to_owned(), equal));
        }
        Ok(Self { terms })
    }

    /// Whether the object satisfies every term. A missing field compares as `""`.
    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.terms.iter().all(|(field, value, equal)| {
            let pointer = format!("/{}", field.replace('.', "/"));
            let actual = match obj.pointer(&pointer) {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(Value::Bool(b)) => b.to_string(),
                Some(Value::Number(n)) => n.to_string(),
                // `source` on core events is an object; the real server selects on
                // `source.component`.
                Some(other) => {
                    other.get("component").and_then(Value::as_str).unwrap_or_default().to_owned()
                }
            };
            (actual == *value) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: &Value) -> Value {
        json!({"metadata": {"name": "a", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn label_operators() {
        let o = obj(&json!({"app": "web", "tier": "front"}));
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("missing!=x", true),
            ("app in (db, web)", true),
            ("app in (db)", false),
            ("app notin (db)", true),
            ("app notin (web,db)", false),
            ("missing notin (web)", true),
            ("tier", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier in (front,back)", true),
            ("app=web,tier=back", false),
            ("", true),
        ];
        for (sel, want) in cases {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&o), want, "{sel}");
        }
    }

    #[test]
    fn bad_label_selector() {
        assert!(LabelSelector::parse("app in web").is_err());
    }

    #[test]
    fn field_selectors_checked_per_resource() {
        let pods = &*super::super::resources::built_in_resource("", "v1", "pods").unwrap();
        let nodes = &*super::super::resources::built_in_resource("", "v1", "nodes").unwrap();
        let o = obj(&json!({}));
        assert!(FieldSelector::parse("spec.nodeName=n1", pods).unwrap().matches(&o));
        assert!(!FieldSelector::parse("spec.nodeName!=n1", pods).unwrap().matches(&o));
        assert!(
            FieldSelector::parse("metadata.name=a,spec.nodeName==n1", pods).unwrap().matches(&o)
        );
        assert!(FieldSelector::parse("status.phase=", pods).unwrap().matches(&o));
        let err = FieldSelector::parse("spec.nodeName=n1", nodes).unwrap_err();
        assert_eq!(err.code, 400);
        assert!(err.message.contains("field label not supported"));
        assert!(FieldSelector::parse("metadata.namespace=x", nodes).is_err());
    }
}
