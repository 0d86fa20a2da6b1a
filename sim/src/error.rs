//! Kubernetes `Status` error bodies. Clients (kube-rs, kubectl) branch on `code` and `reason`,
//! so every failure the simulator reports goes through [`ApiError`].

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// `{"name": .., "group": .., "kind": ..}` — the `details` block the apiserver attaches.
fn details(group: &str, kind: &str, name: &str) -> Option<Value> {
    Some(json!({"name": name, "group": group, "kind": kind}))
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    /// `group_resource` is e.g. `pods` or `questdbs.crd.questdb.io`, as the apiserver prints it.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self {
            details: details(group, plural, name),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", group_resource(group, plural)),
            )
        }
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self {
            details: details(group, plural, name),
            ..Self::new(
                409,
                "AlreadyExists",
                format!(
                    "{} \"{name}\" already exists",
                    group_resource(group, plural)
                ),
            )
        }
    }

    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self {
            details: details(group, plural, name),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    group_resource(group, plural)
                ),
            )
        }
    }

    pub fn stale(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 with one cause per failed field, formatted like the apiserver's field errors.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<FieldCause>) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let summary: Vec<String> = causes.iter().map(FieldCause::to_string).collect();
        let summary = match summary.len() {
            1 => summary[0].clone(),
            _ => format!("[{}]", summary.join(", ")),
        };
        let causes_json: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
            .collect();
        Self {
            details: Some(
                json!({"name": name, "group": group, "kind": kind, "causes": causes_json}),
            ),
            ..Self::new(
                422,
                "Invalid",
                format!("{qualified} \"{name}\" is invalid: {summary}"),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/merge-patch+json, application/json-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"),
        )
    }

    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    pub fn gone(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

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

pub fn group_resource(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

/// One failed field of a 422 answer.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldCause {
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

impl FieldCause {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueInvalid",
            field: field.into(),
            message: message.into(),
        }
    }
    pub fn required(field: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueRequired",
            field: field.into(),
            message: "Required value".into(),
        }
    }
    pub fn forbidden(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: "FieldValueForbidden",
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (
            code,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            self.to_status().to_string(),
        )
            .into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
