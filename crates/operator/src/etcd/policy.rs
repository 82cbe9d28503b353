//! What an `EtcdCertificates` asks for, read from the spec users write
//! (`caretaker_api::v1alpha1`): every field checked, every bad one reported; and the one check
//! of a member's name and addresses, wherever the member comes from.

use std::net::IpAddr;
use std::time::Duration;

use caretaker_api::v1alpha1::{EtcdCertificatesSpec, SignerSettings};
use caretaker_pki::{CaSpec, RotationPolicy, Ttl};

use crate::authority::AuthorityPolicy;
use crate::validation::{Problems, SpecError};

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
    /// `spec.agents.caSecretName`: the agents' CA Secret; no agent is asked without it.
    pub agents_ca_secret: Option<String>,
    /// The listed members' `agentEndpoint`s, by member name.
    pub agent_endpoints: std::collections::BTreeMap<String, String>,
}

impl EtcdPolicy {
    /// What an EtcdCertificates' spec asks for, validated; or every field that is wrong.
    pub fn from_spec(spec: &EtcdCertificatesSpec) -> Result<Self, SpecError> {
        let mut problems = Problems::default();
        let mut members = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (i, member) in spec.members.iter().enumerate() {
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
            if let Some(endpoint) = &member.agent_endpoint {
                problems.https_url(&format!("{at}.agentEndpoint"), endpoint);
            }
            members.extend(checked);
        }
        let signer = signer_policy(&mut problems, "spec.signer", &spec.signer, "etcd-signer");
        let metrics_signer = signer_policy(
            &mut problems,
            "spec.metricsSigner",
            &spec.metrics_signer,
            "etcd-metric-signer",
        );
        let c = &spec.certificates;
        let (validity, rotation) = problems.lifetime(
            "spec.certificates",
            &c.validity,
            c.renew_at_percent,
            c.renew_before.as_deref(),
        );
        if spec.quorum.endpoints.is_empty() {
            problems.empty("spec.quorum.endpoints");
        }
        for (i, endpoint) in spec.quorum.endpoints.iter().enumerate() {
            problems.https_url(&format!("spec.quorum.endpoints[{i}]"), endpoint);
        }
        problems.object_name(
            "spec.quorum.clientSecretName",
            "Secret",
            &spec.quorum.client_secret_name,
        );
        if let Some(agents) = &spec.agents {
            problems.object_name("spec.agents.caSecretName", "Secret", &agents.ca_secret_name);
        }
        let agent_endpoints = (spec.members.iter())
            .filter_map(|m| Some((m.name.clone(), m.agent_endpoint.clone()?)))
            .collect();
        problems.finish((|| {
            Some(EtcdPolicy {
                members,
                signer: signer?,
                metrics_signer: metrics_signer?,
                certificates: (validity?, rotation?),
                endpoints: spec.quorum.endpoints.clone(),
                client_secret: spec.quorum.client_secret_name.clone(),
                agents_ca_secret: spec.agents.as_ref().map(|a| a.ca_secret_name.clone()),
                agent_endpoints,
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

    /// The tests read a spec as the controller does, in fewer words.
    trait Policy {
        fn policy(&self) -> Result<EtcdPolicy, SpecError>;
    }

    impl Policy for EtcdCertificatesSpec {
        fn policy(&self) -> Result<EtcdPolicy, SpecError> {
            EtcdPolicy::from_spec(self)
        }
    }

    /// The example, as users write it.
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
