//! What a request asks of a verb, parsed from its query and body by the handlers.

use crate::error::ApiError;
use crate::selectors::{FieldSelector, LabelSelector};

/// What `fieldValidation` asks of unknown and duplicate fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    Ignore,
    #[default]
    Warn,
    Strict,
}

impl FieldValidation {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        match s {
            "" | "Warn" => Ok(FieldValidation::Warn),
            "Ignore" => Ok(FieldValidation::Ignore),
            "Strict" => Ok(FieldValidation::Strict),
            other => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other:?}: supported values are \"Ignore\", \"Warn\", \"Strict\""
            ))),
        }
    }
}

/// Per-request options of a write.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    pub dry_run: bool,
    pub field_manager: String,
    pub field_validation: FieldValidation,
    pub force: bool,
    /// Who asks, as admission webhooks are told (`userInfo`); None is the server itself or an
    /// unauthenticated request.
    pub user: Option<std::sync::Arc<crate::user::UserInfo>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PropagationPolicy {
    Orphan,
    #[default]
    Background,
    Foreground,
}

#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    pub propagation: Option<PropagationPolicy>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<u64>,
    pub dry_run: bool,
    /// `orphanDependents=false`, the deprecated way to ask for cascading deletion: the one
    /// case where kube-apiserver answers a deletion that does not finish at once with 202
    /// rather than 200.
    pub legacy_cascade: bool,
    /// As [`WriteOptions::user`].
    pub user: Option<std::sync::Arc<crate::user::UserInfo>>,
}

/// Which part of an object a request addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Main,
    Status,
    /// namespaces/{name}/finalize: only spec.finalizers.
    Finalize,
}

impl Part {
    /// The subresource this part is addressed as (what admission webhooks are told).
    pub fn subresource(self) -> Option<&'static str> {
        match self {
            Part::Main => None,
            Part::Status => Some("status"),
            Part::Finalize => Some("finalize"),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub labels: Option<LabelSelector>,
    pub fields: Option<FieldSelector>,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
}
