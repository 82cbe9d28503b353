//! `IssuedCertificate`: a certificate signed by a CertificateAuthority, kept in a Secret and
//! issued again before it expires.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use caretaker_pki::LeafSpec;

use super::SpecError;
use super::validation::Problems;
use crate::authority::CertificatePolicy;

/// A certificate signed by a CertificateAuthority and written to a kubernetes.io/tls Secret
/// (`tls.crt`, `tls.key`, and `ca.crt` with the issuer's trust bundle), issued again when due.
// Clippy mistakes the printcolumns' repeated `type_ = "string"` for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "caretaker.dev",
    version = "v1alpha1",
    kind = "IssuedCertificate",
    namespaced,
    status = "IssuedCertificateStatus",
    derive = "PartialEq",
    doc = "A certificate that caretaker issues from a CertificateAuthority and renews.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Not After",
        type_ = "string",
        description = "When the current certificate expires.",
        json_path = ".status.notAfter"
    ),
    printcolumn(
        name = "Next Rotation",
        type_ = "string",
        description = "When the certificate is next issued again.",
        json_path = ".status.nextRotation"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct IssuedCertificateSpec {
    /// The CertificateAuthority that signs this certificate.
    pub issuer_ref: IssuerReference,
    /// The Secret, in this object's namespace, that receives the certificate.
    #[schemars(length(min = 1))]
    pub secret_name: String,
    /// Subject common name (CN).
    #[schemars(length(min = 1))]
    pub common_name: String,
    /// DNS subject alternative names; `*` may be the whole first label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    /// IP address subject alternative names, IPv4 or IPv6.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    /// What the certificate is for: `server`, `client`, or both.
    #[schemars(schema_with = "usages_schema")]
    pub usages: Vec<String>,
    /// Key algorithm of each new key: ECDSA-P256 (the default), ECDSA-P384, Ed25519, RSA-2048,
    /// RSA-3072 or RSA-4096.
    #[serde(default = "super::default_key_algorithm")]
    #[schemars(extend("enum" = ["ECDSA-P256", "ECDSA-P384", "Ed25519", "RSA-2048", "RSA-3072", "RSA-4096"]))]
    pub key_algorithm: String,
    /// Lifetime of each certificate, a TTL such as 1y (the default), 90d or 12h; cut to the
    /// issuer's own expiry.
    #[serde(default = "super::default_certificate_validity")]
    pub validity: String,
    /// Issue again once this percentage of the lifetime has passed (1 to 100). Default 80
    /// when renewBefore is not set; set only one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub renew_at_percent: Option<i32>,
    /// Issue again this long before expiry, a TTL such as 30d; shorter than validity. Set
    /// only one of renewAtPercent and renewBefore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
}

/// A CertificateAuthority, by name (they are cluster-scoped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct IssuerReference {
    /// The CertificateAuthority's name.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// What caretaker last observed and did.
pub type IssuedCertificateStatus = super::CertificateStatus;

/// `usages`: at least one of `server` and `client`.
fn usages_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = super::USAGES.iter().map(|(name, _)| *name).collect();
    schemars::json_schema!({
        "type": "array",
        "minItems": 1,
        "items": {"type": "string", "enum": names},
    })
}

impl IssuedCertificateSpec {
    /// The validated policy, or every field that is wrong. Whether `issuerRef` names an
    /// existing CertificateAuthority is not checked here: that needs the cluster.
    pub fn policy(&self) -> Result<CertificatePolicy, SpecError> {
        let mut problems = Problems::default();
        problems.object_name(
            "spec.issuerRef.name",
            "CertificateAuthority",
            &self.issuer_ref.name,
        );
        problems.object_name("spec.secretName", "Secret", &self.secret_name);
        let common_name = problems.non_empty("spec.commonName", &self.common_name);
        let dns_names = problems.dns_names("spec.dnsNames", &self.dns_names);
        let ip_addresses = problems.ip_addresses("spec.ipAddresses", &self.ip_addresses);
        let usage = problems.usage("spec.usages", &self.usages);
        let algorithm = problems.key_algorithm("spec.keyAlgorithm", &self.key_algorithm);
        let (validity, rotation) = problems.lifetime(
            "spec",
            &self.validity,
            self.renew_at_percent,
            self.renew_before.as_deref(),
        );
        problems.finish((|| {
            Some(CertificatePolicy {
                leaf: LeafSpec::new(common_name?, usage?)
                    .with_dns_names(dns_names?)
                    .with_ip_addresses(ip_addresses?)
                    .with_validity(validity?)
                    .with_algorithm(algorithm?),
                rotation: rotation?,
            })
        })())
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::Duration;

    use caretaker_pki::{KeyAlgorithm, RotationPolicy, Ttl, Usage};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::v1alpha1::Problem;

    /// The issue's example, as users write it.
    fn example() -> Value {
        json!({
            "issuerRef": {"name": "webhooks"},
            "secretName": "webhook-server-tls",
            "commonName": "webhook.demo.svc",
            "dnsNames": ["webhook.demo.svc", "webhook.demo.svc.cluster.local"],
            "ipAddresses": ["127.0.0.1"],
            "usages": ["server"],
            "keyAlgorithm": "ECDSA-P256",
            "validity": "1y",
            "renewAtPercent": 80,
        })
    }

    /// The example with `changes` merged in (`null` removes a field).
    fn spec(changes: Value) -> IssuedCertificateSpec {
        let mut value = example();
        for (key, change) in changes.as_object().unwrap() {
            if change.is_null() {
                value.as_object_mut().unwrap().remove(key);
            } else {
                value[key] = change.clone();
            }
        }
        serde_json::from_value(value).unwrap()
    }

    fn errors(changes: Value) -> Vec<(String, Problem)> {
        let error = spec(changes.clone())
            .policy()
            .expect_err(&changes.to_string());
        error
            .errors
            .into_iter()
            .map(|e| (e.field, e.problem))
            .collect()
    }

    fn bad_fields(changes: Value) -> Vec<String> {
        errors(changes)
            .into_iter()
            .map(|(field, _)| field)
            .collect()
    }

    #[test]
    fn the_example_gives_its_policy() {
        let policy = spec(json!({})).policy().unwrap();
        let leaf = &policy.leaf;
        assert_eq!(leaf.common_name, "webhook.demo.svc");
        assert_eq!(
            leaf.dns_names,
            ["webhook.demo.svc", "webhook.demo.svc.cluster.local"]
        );
        assert_eq!(leaf.ip_addresses, ["127.0.0.1".parse::<IpAddr>().unwrap()]);
        assert_eq!(leaf.usage, Usage::Server);
        assert_eq!(leaf.algorithm, KeyAlgorithm::EcdsaP256);
        assert_eq!(leaf.validity, "1y".parse::<Ttl>().unwrap());
        assert!(leaf.organizations.is_empty());
        assert_eq!(policy.rotation, RotationPolicy::Fraction(0.8));
    }

    #[test]
    fn omitted_fields_take_the_defaults() {
        let minimal = spec(json!({
            "dnsNames": null, "ipAddresses": null, "keyAlgorithm": null, "validity": null,
            "renewAtPercent": null,
        }));
        assert_eq!(minimal.key_algorithm, "ECDSA-P256");
        assert_eq!(minimal.validity, "1y");
        let policy = minimal.policy().unwrap();
        assert_eq!(policy.rotation, RotationPolicy::Fraction(0.8));
        assert!(policy.leaf.dns_names.is_empty() && policy.leaf.ip_addresses.is_empty());
    }

    #[test]
    fn usages_server_client_or_both() {
        let usage = |usages: Value| {
            spec(json!({ "usages": usages }))
                .policy()
                .unwrap()
                .leaf
                .usage
        };
        assert_eq!(usage(json!(["server"])), Usage::Server);
        assert_eq!(usage(json!(["client"])), Usage::Client);
        assert_eq!(usage(json!(["server", "client"])), Usage::Both);
        assert_eq!(usage(json!(["client", "server", "client"])), Usage::Both);
    }

    #[test]
    fn usages_must_be_known_and_not_empty() {
        assert_eq!(
            errors(json!({"usages": []})),
            [("spec.usages".to_string(), Problem::NoUsages)]
        );
        assert_eq!(
            errors(json!({"usages": ["server", "both", "signing"]})),
            [
                (
                    "spec.usages[1]".to_string(),
                    Problem::UnknownUsage("both".into())
                ),
                (
                    "spec.usages[2]".to_string(),
                    Problem::UnknownUsage("signing".into())
                ),
            ]
        );
    }

    #[test]
    fn ip_addresses_must_be_ip_addresses() {
        let error = spec(json!({"ipAddresses": ["10.0.0.1", "10.0.0.300", "::1", "fe80::zz"]}))
            .policy()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.ipAddresses[1]: \"10.0.0.300\" is not an IP address; \
             spec.ipAddresses[3]: \"fe80::zz\" is not an IP address"
        );
    }

    #[test]
    fn dns_names_must_be_dns_names() {
        let error = spec(json!({"dnsNames": ["ok.example", "not_ok.example", "*.ok.example"]}))
            .policy()
            .unwrap_err();
        assert_eq!(error.errors.len(), 1);
        assert_eq!(error.errors[0].field, "spec.dnsNames[1]");
        assert!(
            error
                .to_string()
                .contains("\"not_ok.example\" is not a DNS name"),
            "{error}"
        );
        assert_eq!(
            bad_fields(json!({"dnsNames": ["10.1.2.3"]})),
            ["spec.dnsNames[0]"]
        );
    }

    #[test]
    fn names_must_not_be_empty() {
        assert_eq!(
            errors(json!({"commonName": "", "secretName": ""})),
            [
                ("spec.secretName".to_string(), Problem::Empty),
                ("spec.commonName".to_string(), Problem::Empty),
            ]
        );
        assert_eq!(
            bad_fields(json!({"issuerRef": {"name": ""}})),
            ["spec.issuerRef.name"]
        );
    }

    #[test]
    fn secret_and_issuer_names_must_be_object_names() {
        assert_eq!(
            bad_fields(json!({"issuerRef": {"name": "Webhooks"}, "secretName": "tls_secret"})),
            ["spec.issuerRef.name", "spec.secretName"]
        );
    }

    #[test]
    fn unknown_key_algorithm() {
        let error = spec(json!({"keyAlgorithm": "RSA-1024"}))
            .policy()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.keyAlgorithm: \"RSA-1024\" is not a key algorithm; accepted: ECDSA-P256, \
             ECDSA-P384, Ed25519, RSA-2048, RSA-3072, RSA-4096"
        );
    }

    #[test]
    fn rotation_rules_as_for_the_ca() {
        assert_eq!(
            bad_fields(json!({"validity": "1y", "renewAtPercent": null, "renewBefore": "400d"})),
            ["spec.renewBefore"]
        );
        assert_eq!(
            bad_fields(json!({"renewBefore": "30d"})),
            ["spec.renewBefore"]
        );
        assert_eq!(
            bad_fields(json!({"renewAtPercent": 101})),
            ["spec.renewAtPercent"]
        );
        assert_eq!(bad_fields(json!({"validity": "1yr"})), ["spec.validity"]);
        let policy = spec(json!({"renewAtPercent": null, "renewBefore": "30d"}))
            .policy()
            .unwrap();
        assert_eq!(
            policy.rotation,
            RotationPolicy::Before(Duration::from_secs(30 * 86_400))
        );
        // A leaf has no trust to propagate: rotating at expiry is allowed.
        let policy = spec(json!({"renewAtPercent": 100})).policy().unwrap();
        assert_eq!(policy.rotation, RotationPolicy::Fraction(1.0));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let fields = bad_fields(json!({
            "issuerRef": {"name": ""},
            "secretName": "",
            "commonName": "",
            "dnsNames": ["a..b"],
            "ipAddresses": ["localhost"],
            "usages": ["peer"],
            "keyAlgorithm": "",
            "validity": "0s",
            "renewAtPercent": 0,
        }));
        assert_eq!(
            fields,
            [
                "spec.issuerRef.name",
                "spec.secretName",
                "spec.commonName",
                "spec.dnsNames[0]",
                "spec.ipAddresses[0]",
                "spec.usages[0]",
                "spec.keyAlgorithm",
                "spec.validity",
                "spec.renewAtPercent",
            ]
        );
    }

    proptest! {
        #[test]
        fn renew_before_shorter_than_validity_is_accepted(
            validity_days in 2u32..=3650, before in 1u32..=3650,
        ) {
            prop_assume!(before < validity_days);
            let policy = spec(json!({
                "validity": format!("{validity_days}d"),
                "renewAtPercent": null,
                "renewBefore": format!("{before}d"),
            }))
            .policy()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                policy.rotation,
                RotationPolicy::Before(Duration::from_secs(u64::from(before) * 86_400))
            );
        }

        #[test]
        fn any_ip_address_is_accepted(address in any::<IpAddr>()) {
            let policy = spec(json!({"ipAddresses": [address.to_string()]})).policy();
            prop_assert_eq!(policy.unwrap().leaf.ip_addresses, vec![address]);
        }
    }
}
