//! API errors and their wire form: a Kubernetes `Status` object with reason and code.

use serde_json::{Value, json};

/// One invalid field, reported in `details.causes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// `FieldValueInvalid`, `FieldValueRequired`, `FieldValueTooLong`, ...
    pub reason: &'static str,
    /// JSON path of the field (`spec.devices[3].name`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    /// A value that breaks a rule.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { reason: "FieldValueInvalid", field: field.into(), message: message.into() }
    }

    /// A required value that is missing.
    pub fn required(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { reason: "FieldValueRequired", field: field.into(), message: message.into() }
    }

    /// A list or map with too many entries.
    pub fn too_many(field: impl Into<String>, actual: usize, max: usize) -> Self {
        Self {
            reason: "FieldValueTooMany",
            field: field.into(),
            message: format!("must have at most {max} items, has {actual}"),
        }
    }

    /// A string or payload that is too long.
    pub fn too_long(field: impl Into<String>, actual: usize, max: usize) -> Self {
        Self {
            reason: "FieldValueTooLong",
            field: field.into(),
            message: format!("may not be more than {max} bytes, is {actual}"),
        }
    }

    /// A duplicate list entry.
    pub fn duplicate(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { reason: "FieldValueDuplicate", field: field.into(), message: message.into() }
    }

    /// A value the field may not have (one-of violations, disallowed combinations).
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { reason: "FieldValueForbidden", field: field.into(), message: message.into() }
    }

    /// A value outside the allowed set.
    pub fn not_supported(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { reason: "FieldValueNotSupported", field: field.into(), message: message.into() }
    }
}

/// An error answered to a client, rendered as a `Status`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` (`NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details` (name, group, kind, causes), if any.
    pub details: Option<Value>,
}

impl ApiError {
    pub(crate) fn with(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into(), details: None }
    }

    fn details(mut self, name: &str, group: &str, kind: &str) -> Self {
        self.details = Some(json!({"name": name, "group": group, "kind": kind}));
        self
    }

    /// 400: the request is malformed.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::with(400, "BadRequest", message)
    }

    /// 404 for an object.
    #[must_use]
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::with(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .details(name, group, plural)
    }

    /// 404 for a path that names no resource.
    #[must_use]
    pub fn no_route(path: &str) -> Self {
        Self::with(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 405: the verb is not supported on this path.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::with(405, "MethodNotAllowed", message)
    }

    /// 409 `AlreadyExists` on create.
    #[must_use]
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::with(409, "AlreadyExists", format!("{qualified} \"{name}\" already exists"))
            .details(name, group, plural)
    }

    /// 409 Conflict: a stale resourceVersion or a failed precondition.
    #[must_use]
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::with(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        )
        .details(name, group, plural)
    }

    /// 409 Conflict from server-side apply, one cause per conflicting field.
    #[must_use]
    pub fn apply_conflict(
        group: &str,
        plural: &str,
        name: &str,
        conflicts: &[(String, String)],
    ) -> Self {
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(manager, field)| format!("conflict with \"{manager}\": .{field}"))
            .collect();
        let message =
            format!("Apply failed with {} conflict(s): {}", conflicts.len(), lines.join("; "));
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(manager, field)| {
                json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{manager}\""), "field": format!(".{field}")})
            })
            .collect();
        let mut err = Self::with(409, "Conflict", message);
        err.details = Some(json!({"name": name, "group": group, "kind": plural, "causes": causes}));
        err
    }

    /// 410 Gone: the resourceVersion is older than the kept history.
    pub fn gone(message: impl Into<String>) -> Self {
        Self::with(410, "Expired", message)
    }

    /// 422 Invalid with field causes.
    #[must_use]
    pub fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let summary: Vec<String> =
            errors.iter().map(|e| format!("{}: {}", e.field, e.message)).collect();
        let causes: Vec<Value> = errors
            .iter()
            .map(|e| json!({"reason": e.reason, "message": e.message, "field": e.field}))
            .collect();
        // As apimachinery's NewInvalid: one error bare, several in brackets.
        let list = match summary.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let mut err = Self::with(
            422,
            "Invalid",
            format!(
                "{} \"{name}\" is invalid: {list}",
                if group.is_empty() { kind.to_owned() } else { format!("{kind}.{group}") },
            ),
        );
        err.details = Some(json!({"name": name, "group": group, "kind": kind, "causes": causes}));
        err
    }

    /// 415 for an unknown patch content type.
    #[must_use]
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::with(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {content_type:?}"
            ),
        )
    }

    /// 500: an invariant of the server broke.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::with(500, "InternalError", message)
    }

    /// The `Status` object.
    #[must_use]
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() { plural.to_owned() } else { format!("{plural}.{group}") }
}
