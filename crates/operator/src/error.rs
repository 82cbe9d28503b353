//! The one error type of the controllers. Every variant is a bounded category with a stable
//! [`Error::metric_label`]; the details a person needs are in its fields and its message,
//! which reaches them in the failure's event. Whether trying again may help
//! ([`Error::is_transient`]) decides both a Machine's retries and how a failed reconcile is
//! requeued ([`Error::requeue`]).

use std::time::Duration;

use caretaker_agent::api::AgentError;
use caretaker_agent::tls::TlsError;
use caretaker_pki::{PkiError, Ttl};

use crate::schedule::Next;
use crate::signing::{RoleMismatch, SigningRefusal};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("a watch cache of the rollout controllers stopped")]
    CacheStopped,
    #[error("cluster CA Secret {namespace}/{name}: {reason}")]
    ClusterCa {
        namespace: String,
        name: String,
        reason: String,
    },
    /// The operator's client certificate for a cluster's agents could not be made.
    #[error("cannot make the operator's client certificate: {reason}")]
    OperatorCertificate { reason: String },
    #[error("cannot make the agent client: {0}")]
    AgentClient(#[source] TlsError),
    #[error("Machine {machine} has no address and no caretaker.dev/agent-endpoint annotation")]
    NoAgentEndpoint { machine: String },
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("Machine {machine} has no node")]
    NoNode { machine: String },
    #[error("the agent no longer knows upgrade operation {change_id} (was the node reinstalled?)")]
    UpgradeOperationLost { change_id: String },
    #[error("TTL {ttl} reaches past the year 9999")]
    TtlOutOfRange { ttl: Ttl },
    #[error(
        "TTL {ttl} reaches past the cluster CA's own expiry ({ca_expiry}); nothing was sent to the node"
    )]
    TtlBeyondCa { ttl: Ttl, ca_expiry: String },
    /// The Machine's control-plane role does not hold (label and owner disagree).
    #[error("refused to refresh: {0}")]
    RoleNotVerified(#[from] RoleMismatch),
    /// The node asked for a certificate its Machine may not have.
    #[error("refused to sign {refusal}; nothing was signed for Machine {machine}")]
    SigningRefused {
        machine: String,
        refusal: SigningRefusal,
    },
    /// The CA refused a CSR the table allowed.
    #[error("refused to sign {certificate}: {source}")]
    SigningFailed {
        certificate: String,
        source: PkiError,
    },
}

impl Error {
    /// A short, stable label of the error's category, for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::CacheStopped => "cache_stopped",
            Error::ClusterCa { .. } => "cluster_ca",
            Error::OperatorCertificate { .. } => "operator_certificate",
            Error::AgentClient(_) => "agent_client",
            Error::NoAgentEndpoint { .. } => "no_agent_endpoint",
            Error::Agent(_) => "agent",
            Error::NoNode { .. } => "no_node",
            Error::UpgradeOperationLost { .. } => "upgrade_operation_lost",
            Error::TtlOutOfRange { .. } => "ttl_out_of_range",
            Error::TtlBeyondCa { .. } => "ttl_beyond_ca",
            Error::RoleNotVerified(_) => "role_not_verified",
            Error::SigningRefused { .. } => "signing_refused",
            Error::SigningFailed { .. } => "signing_failed",
        }
    }

    /// Whether trying again later may help: the API server, a CA Secret or an agent may come
    /// back; a refusal or an impossible request stays what it is.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kube(_)
            | Error::CacheStopped
            | Error::ClusterCa { .. }
            | Error::OperatorCertificate { .. }
            | Error::AgentClient(_)
            | Error::NoAgentEndpoint { .. } => true,
            Error::Agent(e) => e.is_transient(),
            Error::NoNode { .. }
            | Error::UpgradeOperationLost { .. }
            | Error::TtlOutOfRange { .. }
            | Error::TtlBeyondCa { .. }
            | Error::RoleNotVerified(_)
            | Error::SigningRefused { .. }
            | Error::SigningFailed { .. } => false,
        }
    }

    /// When a reconcile that failed with this error runs again: after `base` when trying again
    /// may help, otherwise once the object changes.
    pub fn requeue(&self, base: Duration) -> Next {
        if self.is_transient() {
            Next::After(base)
        } else {
            Next::AwaitChange
        }
    }
}
