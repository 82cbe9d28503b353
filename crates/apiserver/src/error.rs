//! Errors, rendered as Kubernetes `Status` objects.
//!
//! The reason strings, codes and message shapes follow kube-apiserver
//! (k8s.io/apimachinery/pkg/api/errors), because clients branch on them:
//! kube-rs retries on 409 `Conflict`, relists on 410, kubectl prints the message.

use serde_json::{Value, json};

/// A failed API request: what kube-apiserver would put in a `Status` object.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason} ({code}): {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// The static form of a Status reason a webhook returned ("" when it is not a known reason).
pub fn known_reason(reason: &str) -> &'static str {
    const KNOWN: &[&str] = &[
        "Unauthorized",
        "Forbidden",
        "NotFound",
        "AlreadyExists",
        "Conflict",
        "Gone",
        "Invalid",
        "ServerTimeout",
        "Timeout",
        "TooManyRequests",
        "BadRequest",
        "MethodNotAllowed",
        "NotAcceptable",
        "RequestEntityTooLarge",
        "UnsupportedMediaType",
        "InternalError",
        "Expired",
        "ServiceUnavailable",
    ];
    KNOWN.iter().find(|k| **k == reason).copied().unwrap_or("")
}

/// Names a resource the way kube-apiserver does in messages: `configmaps` or `clusters.cluster.x-k8s.io`.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

fn details(group: &str, plural: &str, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": plural });
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", qualified(group, plural)),
            )
        }
    }

    /// A path that names no resource this server serves.
    pub fn unknown_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", qualified(group, plural)),
            )
        }
    }

    /// Optimistic concurrency failure: the client's resourceVersion is stale.
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict_because(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict_because(group: &str, plural: &str, name: &str, why: &str) -> Self {
        ApiError {
            details: Some(details(group, plural, name)),
            ..Self::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {} \"{name}\": {why}",
                    qualified(group, plural)
                ),
            )
        }
    }

    /// 422: the object failed validation. `causes` are (field, message) pairs.
    pub fn invalid(group: &str, kind: &str, name: &str, causes: &[FieldError]) -> Self {
        let summary: Vec<String> = causes.iter().map(|c| c.to_string()).collect();
        let summary = if summary.len() == 1 {
            summary[0].clone()
        } else {
            format!("[{}]", summary.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|c| json!({ "reason": c.kind.reason(), "message": c.message_with_kind(), "field": c.field }))
            .collect();
        let mut d = json!({ "name": name, "kind": kind, "causes": causes });
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        let qualified_kind = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        ApiError {
            details: Some(d),
            ..Self::new(
                422,
                "Invalid",
                format!("{qualified_kind} \"{name}\" is invalid: {summary}"),
            )
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 415: a request body in a format that cannot be decoded here; `accepted` lists the media
    /// types that can, in kube-apiserver's message.
    pub fn unsupported_media_type(content_type: &str, accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {} (got {content_type:?})",
                accepted.join(", ")
            ),
        )
    }

    /// 410 for a resourceVersion older than the retained watch history.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// The `Status` object for this error, as a JSON value (its keys sorted: answers are
    /// written by [`Self::status_body`], in kube-apiserver's order).
    #[cfg(test)]
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// A `Status` as kube-apiserver writes it, field for field in its order (clients that compare
/// bytes exist): kind, apiVersion, metadata, status, message, reason, details, code.
#[derive(serde::Serialize)]
struct StatusBody<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: serde_json::Map<String, Value>,
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<StatusDetails>,
    code: u16,
}

/// `StatusDetails`, in kube's field order.
#[derive(serde::Serialize)]
struct StatusDetails {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    group: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    causes: Option<Vec<StatusCause>>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<Value>,
}

#[derive(serde::Serialize)]
struct StatusCause {
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<Value>,
}

impl StatusDetails {
    fn of(details: &Value) -> StatusDetails {
        let field = |v: &Value, key: &str| v.get(key).filter(|x| !x.is_null()).cloned();
        StatusDetails {
            name: field(details, "name"),
            group: field(details, "group"),
            kind: field(details, "kind"),
            uid: field(details, "uid"),
            causes: details
                .get("causes")
                .and_then(Value::as_array)
                .map(|causes| {
                    causes
                        .iter()
                        .map(|c| StatusCause {
                            reason: field(c, "reason"),
                            message: field(c, "message"),
                            field: field(c, "field"),
                        })
                        .collect()
                }),
            retry_after_seconds: field(details, "retryAfterSeconds"),
        }
    }
}

impl ApiError {
    /// The body of this error's answer: its `Status` in kube-apiserver's field order, ending
    /// in a newline as kube-apiserver's JSON encoder ends every answer.
    pub fn status_body(&self) -> String {
        let body = StatusBody {
            kind: "Status",
            api_version: "v1",
            metadata: serde_json::Map::new(),
            status: "Failure",
            message: &self.message,
            reason: self.reason,
            details: self.details.as_ref().map(StatusDetails::of),
            code: self.code,
        };
        let mut text = serde_json::to_string(&body).unwrap_or_default();
        text.push('\n');
        text
    }
}

impl From<crate::store::storage::StoreError> for ApiError {
    fn from(e: crate::store::storage::StoreError) -> Self {
        ApiError::internal(e.to_string())
    }
}

/// Kinds of field validation failures, with the wording of k8s.io/apimachinery field errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    Required,
    Invalid,
    NotSupported,
    TooLong,
    TooMany,
    TypeInvalid,
    Forbidden,
    Duplicate,
}

impl FieldErrorKind {
    fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
        }
    }

    fn label(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::TypeInvalid => "Invalid value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::Duplicate => "Duplicate value",
        }
    }
}

/// One invalid field: `spec.replicas: Invalid value: -1: must be greater than or equal to 0`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub field: String,
    pub kind: FieldErrorKind,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, kind: FieldErrorKind, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            kind,
            message: message.into(),
        }
    }

    fn message_with_kind(&self) -> String {
        if self.message.is_empty() {
            self.kind.label().to_string()
        } else {
            format!("{}: {}", self.kind.label(), self.message)
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message_with_kind())
    }
}

#[cfg(test)]
mod status_body_tests {
    #[test]
    fn status_bodies_are_in_kube_apiservers_field_order_and_end_in_a_newline() {
        let e = super::ApiError::not_found("", "configmaps", "x");
        assert_eq!(
            e.status_body(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"configmaps \\\"x\\\" not found\",\"reason\":\"NotFound\",\"details\":{\"name\":\"x\",\"kind\":\"configmaps\"},\"code\":404}\n"
        );
        let body: serde_json::Value = serde_json::from_str(&e.status_body()).unwrap();
        assert_eq!(body, e.to_status());
    }
}
