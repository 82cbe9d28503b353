//! The one error type of the controllers. Each error has a category that decides whether the
//! work is retried and that labels metrics and logs.

use caretaker_agent_api::client::AgentError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cluster CA Secret {namespace}/{name}: {reason}")]
    ClusterCa {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("Machine {0} has no address and no caretaker.dev/agent-endpoint annotation")]
    NoAgentEndpoint(String),
    #[error(transparent)]
    Agent(#[from] AgentError),
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// A short label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::ClusterCa { .. } => "cluster_ca",
            Error::NoAgentEndpoint(_) => "no_agent_endpoint",
            Error::Agent(_) => "agent",
            Error::Refused(_) => "refused",
            Error::Invalid(_) => "invalid",
            Error::Internal(_) => "internal",
        }
    }

    /// Whether trying again later may help.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Kube(_)
            | Error::Internal(_)
            | Error::ClusterCa { .. }
            | Error::NoAgentEndpoint(_) => true,
            Error::Agent(e) => e.is_transient(),
            Error::Refused(_) | Error::Invalid(_) => false,
        }
    }
}
