//! `EtcdCertificates`: an etcd cluster's TLS, as the OpenShift etcd operator keeps it: two
//! signers, a peer, serving and metrics-serving certificate per member, client certificates,
//! and every member's certificates in one Secret, written only while etcd keeps quorum.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use caretaker_pki::{CaSpec, RotationPolicy, Ttl};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::SpecError;
use super::validation::Problems;
use crate::authority::AuthorityPolicy;

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
}

/// A member of the etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EtcdMember {
    /// The member's name, used in its Secrets' names (`etcd-peer-<name>`): a DNS label.
    #[schemars(length(min = 1))]
    pub name: String,
    /// IP addresses and DNS names, put in its peer and serving certificates beside
    /// `localhost` and `127.0.0.1`.
    #[serde(default)]
    pub addresses: Vec<String>,
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
    /// The members whose certificates etcd-all-certs holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// The metadata.generation this status was written for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
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

/// A member as validated: its name and the addresses its certificates name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSpec {
    pub name: String,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
}

/// What an `EtcdCertificates` asks for, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdPolicy {
    /// The members listed in the spec (the selected Nodes are added by the controller).
    pub members: Vec<MemberSpec>,
    pub signer: AuthorityPolicy,
    pub metrics_signer: AuthorityPolicy,
    pub certificates: (Ttl, RotationPolicy),
    pub endpoints: Vec<String>,
    pub client_secret: String,
}

impl EtcdCertificatesSpec {
    /// The validated policy, or every field that is wrong.
    pub fn policy(&self) -> Result<EtcdPolicy, SpecError> {
        let mut problems = Problems::default();
        let mut members = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (i, member) in self.members.iter().enumerate() {
            let at = format!("spec.members[{i}]");
            let address_field = |a: usize| format!("{at}.addresses[{a}]");
            let checked = check_member(
                &mut problems,
                &format!("{at}.name"),
                &member.name,
                &address_field,
                &member.addresses,
            );
            if !names.insert(member.name.as_str()) {
                problems.duplicate(&format!("{at}.name"), &member.name);
            }
            members.extend(checked);
        }
        let signer = signer_policy(&mut problems, "spec.signer", &self.signer, "etcd-signer");
        let metrics_signer = signer_policy(
            &mut problems,
            "spec.metricsSigner",
            &self.metrics_signer,
            "etcd-metric-signer",
        );
        let c = &self.certificates;
        let (validity, rotation) = problems.lifetime(
            "spec.certificates",
            &c.validity,
            c.renew_at_percent,
            c.renew_before.as_deref(),
        );
        if self.quorum.endpoints.is_empty() {
            problems.empty("spec.quorum.endpoints");
        }
        for (i, endpoint) in self.quorum.endpoints.iter().enumerate() {
            problems.https_url(&format!("spec.quorum.endpoints[{i}]"), endpoint);
        }
        problems.object_name(
            "spec.quorum.clientSecretName",
            "Secret",
            &self.quorum.client_secret_name,
        );
        problems.finish((|| {
            Some(EtcdPolicy {
                members,
                signer: signer?,
                metrics_signer: metrics_signer?,
                certificates: (validity?, rotation?),
                endpoints: self.quorum.endpoints.clone(),
                client_secret: self.quorum.client_secret_name.clone(),
            })
        })())
    }
}

/// A member's name and addresses, checked as they must be to go into Secret names and
/// certificates: the name a DNS label, each address an IP address or a DNS name. The one check
/// for `spec.members[]` and for the members taken from Nodes (whose names and addresses anyone
/// who may write a Node chooses); `name_field` and `address_field(i)` say where the name and
/// the i-th address were read, for the messages.
pub fn member_spec(
    name_field: &str,
    name: &str,
    address_field: &dyn Fn(usize) -> String,
    addresses: &[String],
) -> Result<MemberSpec, SpecError> {
    let mut problems = Problems::default();
    let member = check_member(&mut problems, name_field, name, address_field, addresses);
    problems.finish(member)
}

/// [`member_spec`], recording its problems among a whole spec's.
fn check_member(
    problems: &mut Problems,
    name_field: &str,
    name: &str,
    address_field: &dyn Fn(usize) -> String,
    addresses: &[String],
) -> Option<MemberSpec> {
    let before = problems.count();
    problems.member_name(name_field, name);
    let (mut dns_names, mut ip_addresses) = (Vec::new(), Vec::new());
    for (index, address) in addresses.iter().enumerate() {
        match address.parse::<IpAddr>() {
            Ok(ip) => ip_addresses.push(ip),
            Err(_) if problems.dns_name(&address_field(index), address) => {
                dns_names.push(address.clone())
            }
            Err(_) => {}
        }
    }
    (problems.count() == before).then(|| MemberSpec {
        name: name.to_string(),
        dns_names,
        ip_addresses,
    })
}

/// A signer's policy: an ECDSA P-256 CA named after its Secret.
fn signer_policy(
    problems: &mut Problems,
    at: &str,
    settings: &SignerSettings,
    common_name: &str,
) -> Option<AuthorityPolicy> {
    let (validity, rotation) = problems.lifetime(
        at,
        &settings.validity,
        settings.renew_at_percent,
        settings.renew_before.as_deref(),
    );
    let field = format!("{at}.trustPropagation");
    let propagation = problems.duration_or_zero(&field, &settings.trust_propagation);
    if let (Some(p), Some(r), Some(v)) = (propagation, rotation, validity) {
        problems.propagation_fits(&field, &settings.trust_propagation, p, r, v);
    }
    Some(AuthorityPolicy {
        ca: CaSpec {
            validity: validity?,
            ..CaSpec::new(common_name)
        },
        rotation: rotation?,
        trust_propagation: propagation.unwrap_or(Duration::ZERO),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The issue's example, as users write it.
    fn example() -> Value {
        json!({
            "members": [{"name": "m0", "addresses": ["127.0.0.1", "m0.etcd.example"]}],
            "memberSelector": {"matchLabels": {"node-role.kubernetes.io/control-plane": ""}},
            "signer": {"validity": "5y", "renewAtPercent": 80, "trustPropagation": "5m"},
            "metricsSigner": {"validity": "5y", "renewAtPercent": 80, "trustPropagation": "5m"},
            "certificates": {"validity": "3y", "renewAtPercent": 80},
            "quorum": {"endpoints": ["https://127.0.0.1:2379"], "clientSecretName": "etcd-client"},
        })
    }

    fn spec(value: Value) -> EtcdCertificatesSpec {
        serde_json::from_value(value).unwrap()
    }

    fn bad_fields(value: Value) -> Vec<String> {
        let error = spec(value.clone()).policy().expect_err(&value.to_string());
        error.errors.into_iter().map(|e| e.field).collect()
    }

    #[test]
    fn the_example_gives_its_policy() {
        let policy = spec(example()).policy().unwrap();
        assert_eq!(
            policy.members,
            [MemberSpec {
                name: "m0".into(),
                dns_names: vec!["m0.etcd.example".into()],
                ip_addresses: vec!["127.0.0.1".parse().unwrap()],
            }]
        );
        assert_eq!(policy.signer.ca.common_name, "etcd-signer");
        assert_eq!(policy.metrics_signer.ca.common_name, "etcd-metric-signer");
        assert_eq!(policy.signer.ca.validity, "5y".parse().unwrap());
        assert_eq!(policy.signer.trust_propagation, Duration::from_secs(300));
        assert_eq!(policy.certificates.0, "3y".parse().unwrap());
        assert_eq!(policy.certificates.1, RotationPolicy::Fraction(0.8));
        assert_eq!(policy.client_secret, "etcd-client");
    }

    #[test]
    fn only_the_quorum_endpoints_are_required() {
        let minimal = spec(json!({"quorum": {"endpoints": ["https://10.0.0.1:2379"]}}));
        let policy = minimal.policy().unwrap();
        assert_eq!(policy.signer, spec(example()).policy().unwrap().signer);
        assert_eq!(policy.certificates.0, "3y".parse().unwrap());
        assert_eq!(policy.client_secret, "etcd-client");
        assert!(policy.members.is_empty());
    }

    #[test]
    fn every_bad_field_is_named() {
        let fields = bad_fields(json!({
            "members": [
                {"name": "M_0", "addresses": ["not a name"]},
                {"name": "m1", "addresses": []},
                {"name": "m1", "addresses": []},
            ],
            "signer": {"validity": "5x"},
            "metricsSigner": {"renewAtPercent": 80, "renewBefore": "1d"},
            "certificates": {"validity": "1y", "renewBefore": "2y"},
            "quorum": {"endpoints": ["http://127.0.0.1:2379", "https://"], "clientSecretName": "Bad_Name"},
        }));
        assert_eq!(
            fields,
            [
                "spec.members[0].name",
                "spec.members[0].addresses[0]",
                "spec.members[2].name",
                "spec.signer.validity",
                "spec.metricsSigner.renewBefore",
                "spec.certificates.renewBefore",
                "spec.quorum.endpoints[0]",
                "spec.quorum.endpoints[1]",
                "spec.quorum.clientSecretName",
            ]
        );
    }

    #[test]
    fn messages_name_the_value_and_where_it_is() {
        let error = spec(json!({
            "certificates": {"validity": "1y", "renewBefore": "2y"},
            "quorum": {"endpoints": ["http://127.0.0.1:2379"]},
        }))
        .policy()
        .unwrap_err()
        .to_string();
        assert!(
            error.contains(
                "spec.certificates.renewBefore: \"2y\" is not shorter than spec.certificates.validity \"1y\""
            ),
            "{error}"
        );
        assert!(
            error.contains("spec.quorum.endpoints[0]: \"http://127.0.0.1:2379\""),
            "{error}"
        );
        let both = spec(json!({
            "signer": {"renewAtPercent": 80, "renewBefore": "1d"},
            "quorum": {"endpoints": ["https://a:2379"]},
        }))
        .policy()
        .unwrap_err()
        .to_string();
        assert!(
            both.contains("set only one of spec.signer.renewAtPercent and spec.signer.renewBefore"),
            "{both}"
        );
    }

    #[test]
    fn a_bad_address_is_named_by_its_own_index() {
        let fields = bad_fields(json!({
            "members": [{"name": "m0", "addresses": ["10.0.0.1", "m0.example", "nœud.example"]}],
            "quorum": {"endpoints": ["https://10.0.0.1:2379"]},
        }));
        assert_eq!(fields, ["spec.members[0].addresses[2]"]);
    }

    /// Members from Nodes go through the same check as listed ones.
    #[test]
    fn a_member_from_anywhere_is_checked_as_a_listed_one() {
        let at = |i: usize| format!("status.addresses[{i}].address");
        let member = member_spec(
            "name",
            "cp-0",
            &at,
            &["10.0.0.1".into(), "cp-0.example".into()],
        )
        .unwrap();
        assert_eq!(member.dns_names, ["cp-0.example"]);
        assert_eq!(member.ip_addresses, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        for (name, addresses, field) in [
            ("cp-0", vec!["nœud.example"], "status.addresses[0].address"),
            (
                "cp-0",
                vec!["10.0.0.1", "a b"],
                "status.addresses[1].address",
            ),
            ("cp-0.example", vec![], "name"),
            ("CP-0", vec![], "name"),
            ("", vec![], "name"),
        ] {
            let addresses: Vec<String> = addresses.into_iter().map(String::from).collect();
            let error = member_spec("name", name, &at, &addresses).unwrap_err();
            let fields: Vec<&str> = error.errors.iter().map(|e| e.field.as_str()).collect();
            assert_eq!(fields, [field], "{name} {addresses:?}");
        }
    }

    #[test]
    fn no_endpoints_is_refused() {
        assert_eq!(
            bad_fields(json!({"quorum": {"endpoints": []}})),
            ["spec.quorum.endpoints"]
        );
    }
}
