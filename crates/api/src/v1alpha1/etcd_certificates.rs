//! `EtcdCertificates`: an etcd cluster's TLS, as the OpenShift etcd operator keeps it: two
//! signers, a peer, serving and metrics-serving certificate per member, client certificates,
//! and every member's certificates in one Secret, written only while etcd keeps quorum.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The certificates of an etcd cluster: signers `etcd-signer` and `etcd-metric-signer`, their
/// bundles, client certificates, per member a peer, serving and metrics-serving certificate,
/// and `etcd-all-certs` holding every member's, all in the object's namespace.
// Clippy mistakes the printcolumns' repeated `type_ = "string"` for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "caretaker.dev",
    version = "v1alpha1",
    kind = "EtcdCertificates",
    plural = "etcdcertificates",
    namespaced,
    status = "EtcdCertificatesStatus",
    derive = "PartialEq",
    doc = "The certificates of an etcd cluster, kept as the OpenShift etcd operator keeps them.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="EtcdCertSignerControllerDegraded")].status"#
    ),
    printcolumn(
        name = "Revision",
        type_ = "string",
        description = "The content hash of etcd-all-certs.",
        json_path = ".status.allCertsRevision"
    ),
    printcolumn(
        name = "Latest",
        type_ = "integer",
        description = "The number of the newest etcd-all-certs revision.",
        json_path = ".status.latestRevision"
    ),
    printcolumn(
        name = "Members",
        type_ = "string",
        description = "Each member's current revision number, in members order.",
        json_path = ".status.members[*].currentRevision"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct EtcdCertificatesSpec {
    /// The members, each with the addresses (IP addresses and DNS names) its peer and
    /// serving certificates name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<EtcdMember>,
    /// Nodes whose name and addresses are members too (for example the control-plane
    /// Nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_selector: Option<MemberSelector>,
    /// The signer of the peer, serving and client certificates (Secret `etcd-signer`,
    /// bundle `etcd-ca-bundle`).
    #[serde(default)]
    pub signer: SignerSettings,
    /// The signer of the metrics certificates (Secret `etcd-metric-signer`, bundle
    /// `etcd-metric-ca-bundle`).
    #[serde(default)]
    pub metrics_signer: SignerSettings,
    /// Lifetime and renewal of every peer, serving, metrics and client certificate.
    #[serde(default)]
    pub certificates: CertificateSettings,
    /// How the cluster's health is asked before `etcd-all-certs` changes.
    pub quorum: QuorumSettings,
    /// caretaker's node agents that install each revision on their member and restart it,
    /// one member at a time. Without it (or for a member with no agent endpoint) the Secret
    /// `etcd-all-certs` is where caretaker's work ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<AgentSettings>,
}

/// How the operator reaches the members' agents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSettings {
    /// A Secret in this namespace (type kubernetes.io/tls, like a Cluster API `<cluster>-ca`)
    /// holding the CA that the agents' serving certificates chain to and that the agents trust
    /// for the operator's client certificate, which is issued from it.
    #[schemars(length(min = 1))]
    pub ca_secret_name: String,
}

/// A member of the etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMember {
    /// The member's name, used in its Secrets' names (`etcd-peer-<name>`): a DNS label.
    #[schemars(length(min = 1))]
    pub name: String,
    /// IP addresses and DNS names, put in its peer and serving certificates beside
    /// `localhost` and `127.0.0.1`.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// The URL (https://HOST:PORT) of the caretaker agent on this member's node, when it runs
    /// one (with `--etcd-member` this member's name). A Node member's is its
    /// `caretaker.dev/agent-endpoint` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_endpoint: Option<String>,
}

/// A label selector over Nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberSelector {
    /// Labels a Node must have, with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Requirements a Node's labels must meet (operators In, NotIn, Exists, DoesNotExist).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SelectorRequirement {
    pub key: String,
    /// In, NotIn, Exists or DoesNotExist.
    pub operator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl MemberSelector {
    /// As Kubernetes' own type, to be matched the way the API server matches.
    pub fn label_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: Some(self.match_labels.clone()),
            match_expressions: Some(
                self.match_expressions
                    .iter()
                    .map(|r| LabelSelectorRequirement {
                        key: r.key.clone(),
                        operator: r.operator.clone(),
                        values: Some(r.values.clone()),
                    })
                    .collect(),
            ),
        }
    }
}

/// A signer's lifetime and rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignerSettings {
    /// Lifetime of each signer certificate, a TTL such as 5y (the default).
    #[serde(default = "default_signer_validity")]
    pub validity: String,
    /// Rotate once this percentage of the lifetime has passed (1 to 100). Default 80 when
    /// renewBefore is not set; set only one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub renew_at_percent: Option<i32>,
    /// Rotate this long before expiry, a TTL such as 60d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    /// How long a new signer is trusted by every member and published in its bundle before
    /// it signs anything, a TTL such as 5m (the default).
    #[serde(default = "super::default_trust_propagation")]
    pub trust_propagation: String,
}

impl Default for SignerSettings {
    fn default() -> Self {
        Self {
            validity: default_signer_validity(),
            renew_at_percent: None,
            renew_before: None,
            trust_propagation: super::default_trust_propagation(),
        }
    }
}

/// The lifetime and renewal of the certificates the signers issue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateSettings {
    /// Lifetime of each certificate, a TTL such as 3y (the default).
    #[serde(default = "default_certificate_validity")]
    pub validity: String,
    /// Renew once this percentage of the lifetime has passed (1 to 100). Default 80.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub renew_at_percent: Option<i32>,
    /// Renew this long before expiry, a TTL such as 30d.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

impl Default for CertificateSettings {
    fn default() -> Self {
        Self {
            validity: default_certificate_validity(),
            renew_at_percent: None,
            renew_before: None,
        }
    }
}

/// Where the members' health is asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuorumSettings {
    /// The members' client URLs (https), one per member.
    #[schemars(length(min = 1))]
    pub endpoints: Vec<String>,
    /// The Secret (in this namespace) whose tls.crt and tls.key the health checks present;
    /// default `etcd-client`, the client certificate caretaker manages itself.
    #[serde(default = "default_client_secret")]
    pub client_secret_name: String,
}

/// What caretaker last observed and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdCertificatesStatus {
    /// `Ready` (every member's certificates are in etcd-all-certs) and
    /// `EtcdCertSignerControllerDegraded` (True with the reason, for example
    /// InsufficientQuorum; False after a good pass).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<super::Condition>,
    /// The content hash of etcd-all-certs (also its annotation caretaker.dev/revision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_certs_revision: Option<String>,
    /// When etcd-all-certs last changed, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub all_certs_last_changed: Option<String>,
    /// The signer of peer, serving and client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signer: Option<SignerStatus>,
    /// The signer of metrics certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_signer: Option<SignerStatus>,
    /// The number of the newest etcd-all-certs revision: one more each time its content hash
    /// changes (the OpenShift operators' `latestAvailableRevision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_revision: Option<i64>,
    /// The members whose certificates etcd-all-certs holds, with the revision each runs (as
    /// OpenShift's `nodeStatuses`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<MemberStatus>,
    /// The metadata.generation this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// A member as the status shows it. Every field is written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemberStatus {
    pub name: String,
    /// The revision the member was last seen healthy with (0: not known yet).
    #[serde(default)]
    pub current_revision: i64,
    /// The revision being installed on it now (0 when none).
    #[serde(default)]
    pub target_revision: i64,
    /// The last revision whose install on it failed (0 when none).
    #[serde(default)]
    pub last_failed_revision: i64,
    /// When one of the revisions above last changed, RFC 3339.
    #[serde(default)]
    #[schemars(extend("format" = "date-time"))]
    pub last_change_time: Option<String>,
}

/// A signer as the status shows it. Every field is written, empty ones too: a status merge
/// patch must clear what a rotation leaves behind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignerStatus {
    /// Serial number of the CA that signs now, colon-separated hex.
    #[serde(default)]
    pub serial_number: Option<String>,
    /// When it expires, RFC 3339.
    #[serde(default)]
    #[schemars(extend("format" = "date-time"))]
    pub not_after: Option<String>,
    /// When it is next replaced (during a rotation: when the next signer signs), RFC 3339.
    #[serde(default)]
    #[schemars(extend("format" = "date-time"))]
    pub next_rotation: Option<String>,
    /// During a rotation: the next signer's serial number.
    #[serde(default)]
    pub next_serial_number: Option<String>,
    /// Older signers still trusted, by serial number.
    #[serde(default)]
    pub previous_serial_numbers: Vec<String>,
}

fn default_signer_validity() -> String {
    "5y".into()
}

fn default_certificate_validity() -> String {
    "3y".into()
}

/// `etcd-client`, the client certificate caretaker manages (`etcd::CLIENT_SECRET`; written out
/// here so that the API types do not depend on the decisions).
fn default_client_secret() -> String {
    "etcd-client".into()
}
