//! The contract between caretaker's operator and its node agents: what goes over the wire,
//! the mutual-TLS client that sends it, and the kubeadm facts both sides must agree on.
//!
//! The operator depends on this crate and not on `caretaker-agent`, so it never links the
//! agent's refresh, upgrade and hook machinery; the agent depends on it for the same types,
//! so the two cannot drift apart. It must not depend on `caretaker-agent`, on the operator or
//! on Kubernetes: nothing here reads a node's files or runs a command.
//!
//! - [`kubeadm`]: the CAs of a kubeadm cluster, the certificate slots a node may hold, node
//!   roles and the names every kube-apiserver certificate carries.
//! - [`inventory`], [`refresh`], [`upgrade`], [`etcd`] and this module: the bodies of the API below.
//! - [`client`]: [`client::AgentClient`], the operator's side of every call.
//! - [`tls`]: the client's half of mutual TLS, verifying the agent by its node's names.
//!
//! The agent's HTTPS API (mutual TLS only; the server is `caretaker_agent::server`):
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | GET | `/v1/health` | | [`Health`] |
//! | GET | `/v1/certificates` | | [`inventory::Inventory`] |
//! | POST | `/v1/certificates/plan` | [`refresh::PlanRequest`] | [`refresh::RefreshPlan`] |
//! | POST | `/v1/certificates/apply` | [`refresh::ApplyRequest`] | [`refresh::ApplyOutcome`] |
//! | GET | `/v1/certificates/plans/{id}` | | [`refresh::PlanStatus`] |
//! | POST | `/v1/upgrades` | [`upgrade::UpgradeRequest`] | 202 [`upgrade::Operation`] |
//! | GET | `/v1/operations/{id}` | | [`upgrade::Operation`] |
//! | POST | `/v1/operations/{id}/cancel` | | [`upgrade::Operation`] |
//! | GET | `/v1/etcd` | | [`etcd::Installed`] (404 without an etcd section) |
//! | POST | `/v1/etcd/revisions` | [`etcd::InstallRequest`] | [`etcd::InstallOutcome`] |
//!
//! Errors are [`ErrorBody`], `{"reason": "...", "message": "..."}`, with a 4xx or 5xx status. A
//! plan or apply while another refresh step runs, and an upgrade while another upgrade runs, is
//! answered 409 [`BUSY`]: wait and ask again.

pub mod client;
pub mod etcd;
pub mod inventory;
pub mod kubeadm;
pub mod refresh;
pub mod tls;
pub mod upgrade;

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
