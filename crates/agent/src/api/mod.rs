//! The agent's HTTPS API (mutual TLS only) and the client the operator uses.
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | GET | `/v1/health` | | [`Health`] |
//! | GET | `/v1/certificates` | | [`crate::inventory::Inventory`] |
//! | POST | `/v1/certificates/plan` | [`crate::refresh::PlanRequest`] | [`crate::refresh::RefreshPlan`] |
//! | POST | `/v1/certificates/apply` | [`crate::refresh::ApplyRequest`] | [`crate::refresh::ApplyOutcome`] |
//! | GET | `/v1/certificates/plans/{id}` | | [`crate::refresh::PlanStatus`] |
//! | POST | `/v1/upgrades` | [`crate::upgrade::UpgradeRequest`] | 202 [`crate::upgrade::Operation`] |
//! | GET | `/v1/operations/{id}` | | [`crate::upgrade::Operation`] |
//! | POST | `/v1/operations/{id}/cancel` | | [`crate::upgrade::Operation`] |
//!
//! Errors are `{"reason": "...", "message": "..."}` with a 4xx or 5xx status. A plan or apply
//! while another refresh step runs, and an upgrade while another upgrade runs, is answered 409
//! [`BUSY`]: wait and ask again.

mod client;
mod server;

pub use client::{AgentClient, AgentError, MAX_REPLY_BYTES};
pub use server::{AgentService, ServeLimits, serve, serve_with};

use serde::{Deserialize, Serialize};

/// Body of `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub status: String,
    /// The release the last successful in-place upgrade installed.
    pub release: Option<String>,
    pub version: String,
}

/// Body of every error answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// `BadRequest`, `NotFound`, `Conflict`, `Busy`, `Rejected` or `Internal`.
    pub reason: String,
    pub message: String,
}

/// The reason of a 409 answer meaning "another refresh step (or upgrade) is running on this
/// node: wait and ask again". It is not a failure of the request.
pub const BUSY: &str = "Busy";

impl AgentError {
    /// Whether the agent answered [`BUSY`]: the caller should wait, not count a failure.
    pub fn is_busy(&self) -> bool {
        matches!(self, AgentError::Status { status: 409, reason, .. } if reason == BUSY)
    }
}
