//! The one error type of the controllers. Every variant is a bounded category with a stable
//! [`Error::metric_label`]; the details a person needs are in its fields and its message,
//! which reaches them in the failure's event. Whether trying again may help
//! ([`Error::is_transient`]) decides both a Machine's retries and how a failed reconcile is
//! requeued ([`Error::requeue`]).

use std::time::Duration;

use caretaker_agent_api::client::AgentError;
use caretaker_agent_api::tls::TlsError;
use caretaker_pki::{PkiError, Ttl};

use crate::machine::signing::{RoleMismatch, SigningRefusal};
use crate::schedule::Next;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("a watch cache of the controllers stopped")]
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
    /// The CA refused a CSR the table allowed, or could not sign an IssuedCertificate's
    /// certificate.
    #[error("refused to sign {certificate}: {source}")]
    SigningFailed {
        certificate: String,
        source: PkiError,
    },
    /// A CertificateAuthority's new CA could not be made; nothing was written.
    #[error(
        "cannot make a new CA for CertificateAuthority {authority}: {source}; nothing was written"
    )]
    CaCreationFailed { authority: String, source: PkiError },
    /// A Bundle could not be synced (a malformed source, a namespace selector that does not
    /// parse, a target write refused); its status and events say which.
    #[error("Bundle {bundle} is not synced: {reason}")]
    BundleNotSynced {
        bundle: String,
        reason: &'static str,
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
            Error::CaCreationFailed { .. } => "ca_creation_failed",
            Error::BundleNotSynced { .. } => "bundle_not_synced",
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
            | Error::NoAgentEndpoint { .. }
            | Error::BundleNotSynced { .. } => true,
            Error::Agent(e) => e.is_transient(),
            Error::NoNode { .. }
            | Error::UpgradeOperationLost { .. }
            | Error::TtlOutOfRange { .. }
            | Error::TtlBeyondCa { .. }
            | Error::RoleNotVerified(_)
            | Error::SigningRefused { .. }
            | Error::SigningFailed { .. }
            | Error::CaCreationFailed { .. } => false,
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Every category that can be made without a network, with whether retrying may help.
    fn categories() -> Vec<(Error, bool)> {
        let machine = || "m".to_string();
        let ttl: Ttl = "1y".parse().unwrap();
        vec![
            (Error::CacheStopped, true),
            (
                Error::ClusterCa {
                    namespace: "default".into(),
                    name: "c1-ca".into(),
                    reason: "not found".into(),
                },
                true,
            ),
            (
                Error::OperatorCertificate {
                    reason: "bad key".into(),
                },
                true,
            ),
            (Error::NoAgentEndpoint { machine: machine() }, true),
            (Error::Agent(AgentError::BadUrl("ftp://x".into())), false),
            (Error::NoNode { machine: machine() }, false),
            (
                Error::UpgradeOperationLost {
                    change_id: "op-1".into(),
                },
                false,
            ),
            (Error::TtlOutOfRange { ttl }, false),
            (
                Error::TtlBeyondCa {
                    ttl,
                    ca_expiry: "2026-06-01T00:00:00Z".into(),
                },
                false,
            ),
            (
                Error::RoleNotVerified(RoleMismatch::LabelWithoutOwner {
                    machine: machine(),
                    label: caretaker_api::names::CONTROL_PLANE_LABEL,
                    control_plane: "(none)".into(),
                }),
                false,
            ),
            (
                Error::SigningRefused {
                    machine: machine(),
                    refusal: SigningRefusal::Unknown {
                        name: "../../ca".into(),
                    },
                },
                false,
            ),
            (
                Error::SigningFailed {
                    certificate: "kubelet".into(),
                    source: PkiError::InvalidCsr("truncated".into()),
                },
                false,
            ),
            (
                Error::CaCreationFailed {
                    authority: "webhooks".into(),
                    source: PkiError::InvalidCsr("truncated".into()),
                },
                false,
            ),
            (
                Error::BundleNotSynced {
                    bundle: "trust".into(),
                    reason: "SourceBuildError",
                },
                true,
            ),
        ]
    }

    #[test]
    fn each_category_has_its_own_stable_label_and_retry_policy() {
        let base = Duration::from_secs(10);
        let mut labels = BTreeSet::new();
        for (error, transient) in categories() {
            let label = error.metric_label();
            assert!(labels.insert(label), "{label} twice");
            assert!(
                label.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{label}"
            );
            assert_eq!(error.is_transient(), transient, "{error}");
            let requeue = if transient {
                Next::After(base)
            } else {
                Next::AwaitChange
            };
            assert_eq!(error.requeue(base), requeue, "{error}");
        }
    }

    /// What users read in the failure's event.
    #[test]
    fn refusals_say_what_was_refused_and_that_nothing_was_signed() {
        let messages: Vec<String> = categories()
            .into_iter()
            .map(|(error, _)| error.to_string())
            .collect();
        let find = |needle: &str| messages.iter().find(|m| m.contains(needle)).unwrap();
        assert_eq!(
            find("refused to sign"),
            "refused to sign \"../../ca\" is not a certificate caretaker signs; nothing was signed for Machine m"
        );
        assert!(find("refused to refresh: Machine m is labelled").contains("(none)"));
        assert!(
            find("TTL 1y reaches past the cluster CA").ends_with("nothing was sent to the node")
        );
    }
}
