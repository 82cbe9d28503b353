//! `CertificateAuthority`: a CA that lives in the cluster and rotates before it expires.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use caretaker_pki::CaSpec;

use super::validation::Problems;
use super::{NamespacedName, SpecError};
use crate::authority::AuthorityPolicy;

/// A certificate authority kept in a Secret, published in a trust bundle ConfigMap, and
/// replaced before it expires: a new CA is trusted everywhere for `trustPropagation` before
/// it signs anything, and an old one stays in the bundle while it may still be needed.
// Clippy mistakes the printcolumns' repeated `type_ = "string"` for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "caretaker.dev",
    version = "v1alpha1",
    kind = "CertificateAuthority",
    plural = "certificateauthorities",
    status = "CertificateAuthorityStatus",
    derive = "PartialEq",
    doc = "A certificate authority that caretaker creates, publishes and rotates.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(
        name = "Not After",
        type_ = "string",
        description = "When the current CA certificate expires.",
        json_path = ".status.notAfter"
    ),
    printcolumn(
        name = "Next Rotation",
        type_ = "string",
        description = "When the CA is next replaced.",
        json_path = ".status.nextRotation"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct CertificateAuthoritySpec {
    /// Subject common name (CN) of each CA certificate.
    #[schemars(length(min = 1))]
    pub common_name: String,
    /// The Secret (type kubernetes.io/tls) that holds the CA's certificate and key.
    pub secret: NamespacedName,
    /// The ConfigMap the trust bundle is published in, under the key `ca-bundle.crt`: the
    /// current CA and every older one still trusted.
    pub bundle: NamespacedName,
    /// Key algorithm of each new CA: ECDSA-P256 (the default), ECDSA-P384, Ed25519, RSA-2048,
    /// RSA-3072 or RSA-4096.
    #[serde(default = "super::default_key_algorithm")]
    #[schemars(extend("enum" = ["ECDSA-P256", "ECDSA-P384", "Ed25519", "RSA-2048", "RSA-3072", "RSA-4096"]))]
    pub key_algorithm: String,
    /// Lifetime of each CA certificate, a TTL such as 10y (the default), 1y6mo, 90d or 12h.
    #[serde(default = "super::default_ca_validity")]
    pub validity: String,
    /// Rotate once this percentage of the lifetime has passed (1 to 100). Default 80 when
    /// renewBefore is not set; set only one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub renew_at_percent: Option<i32>,
    /// Rotate this long before expiry, a TTL such as 60d; shorter than validity. Set only one
    /// of renewAtPercent and renewBefore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    /// How long a new CA is published in the bundle and every injection point before it
    /// signs anything, a TTL such as 5m (the default); 0s signs at once.
    #[serde(default = "super::default_trust_propagation")]
    pub trust_propagation: String,
    /// The namespaces whose IssuedCertificates this CA signs; empty or absent: every
    /// namespace. An IssuedCertificate elsewhere gets nothing (reason NamespaceNotAllowed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_namespaces: Vec<String>,
}

/// What caretaker last observed and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateAuthorityStatus {
    /// What an IssuedCertificate's status says too, of the CA that signs now.
    #[serde(flatten)]
    pub certificate: super::CertificateStatus,
    /// During a rotation: when the next CA was first seen in the bundle and every injection
    /// point, RFC 3339; it signs from trustPropagation later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub trusted_since: Option<String>,
    /// Older CA certificates still in the trust bundle.
    #[serde(rename = "previousCAs", default, skip_serializing_if = "Vec::is_empty")]
    pub previous_cas: Vec<PreviousCa>,
}

/// An older CA certificate that is still trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviousCa {
    /// Its serial number, colon-separated hex.
    pub serial_number: String,
    /// When it expires, RFC 3339.
    #[schemars(extend("format" = "date-time"))]
    pub not_after: String,
}

impl CertificateAuthoritySpec {
    /// Whether this CA signs IssuedCertificates of `namespace` (`spec.allowedNamespaces`).
    pub fn issues_to(&self, namespace: &str) -> bool {
        self.allowed_namespaces.is_empty() || self.allowed_namespaces.iter().any(|n| n == namespace)
    }

    /// The validated policy, or every field that is wrong.
    pub fn policy(&self) -> Result<AuthorityPolicy, SpecError> {
        let mut problems = Problems::default();
        let common_name = problems.non_empty("spec.commonName", &self.common_name);
        let algorithm = problems.key_algorithm("spec.keyAlgorithm", &self.key_algorithm);
        problems.object_name("spec.secret.name", "Secret", &self.secret.name);
        problems.namespace_name("spec.secret.namespace", &self.secret.namespace);
        problems.object_name("spec.bundle.name", "ConfigMap", &self.bundle.name);
        problems.namespace_name("spec.bundle.namespace", &self.bundle.namespace);
        for (i, namespace) in self.allowed_namespaces.iter().enumerate() {
            problems.namespace_name(&format!("spec.allowedNamespaces[{i}]"), namespace);
        }
        let (validity, rotation) = problems.lifetime(
            "spec",
            &self.validity,
            self.renew_at_percent,
            self.renew_before.as_deref(),
        );
        let trust_propagation =
            problems.duration_or_zero("spec.trustPropagation", &self.trust_propagation);
        if let (Some(propagation), Some(rotation), Some(validity)) =
            (trust_propagation, rotation, validity)
        {
            problems.propagation_fits(
                "spec.trustPropagation",
                &self.trust_propagation,
                propagation,
                rotation,
                validity,
            );
        }
        problems.finish((|| {
            Some(AuthorityPolicy {
                ca: CaSpec {
                    validity: validity?,
                    algorithm: algorithm?,
                    ..CaSpec::new(common_name?)
                },
                rotation: rotation?,
                trust_propagation: trust_propagation?,
            })
        })())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use caretaker_pki::{KeyAlgorithm, RotationPolicy, Ttl};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::v1alpha1::Problem;

    /// The issue's example, as users write it.
    fn example() -> Value {
        json!({
            "commonName": "webhooks-ca",
            "secret": {"name": "webhooks-ca", "namespace": "caretaker-system"},
            "bundle": {"name": "webhooks-ca-bundle", "namespace": "caretaker-system"},
            "keyAlgorithm": "ECDSA-P256",
            "validity": "10y",
            "renewAtPercent": 80,
            "trustPropagation": "5m",
        })
    }

    /// The example with `changes` merged in (`null` removes a field).
    fn spec(changes: Value) -> CertificateAuthoritySpec {
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

    /// The fields `changes` make wrong, in order.
    fn bad_fields(changes: Value) -> Vec<String> {
        let error = spec(changes.clone())
            .policy()
            .expect_err(&changes.to_string());
        error.errors.into_iter().map(|e| e.field).collect()
    }

    fn ttl(value: &str) -> Ttl {
        value.parse().unwrap()
    }

    #[test]
    fn the_example_gives_its_policy() {
        let policy = spec(json!({})).policy().unwrap();
        assert_eq!(policy.ca.common_name, "webhooks-ca");
        assert_eq!(policy.ca.validity, ttl("10y"));
        assert_eq!(policy.ca.algorithm, KeyAlgorithm::EcdsaP256);
        assert_eq!(policy.ca.path_len, Some(0));
        assert_eq!(policy.rotation, RotationPolicy::Fraction(0.8));
        assert_eq!(policy.trust_propagation, Duration::from_secs(300));
    }

    #[test]
    fn omitted_fields_take_the_defaults() {
        let minimal = spec(json!({
            "keyAlgorithm": null, "validity": null, "renewAtPercent": null,
            "trustPropagation": null,
        }));
        assert_eq!(minimal.key_algorithm, "ECDSA-P256");
        assert_eq!(minimal.validity, "10y");
        assert_eq!(minimal.renew_at_percent, None);
        assert_eq!(minimal.trust_propagation, "5m");
        assert_eq!(minimal.policy(), spec(json!({})).policy());
    }

    #[test]
    fn renew_before_counts_back_from_expiry() {
        let policy = spec(json!({"renewAtPercent": null, "renewBefore": "60d"}))
            .policy()
            .unwrap();
        assert_eq!(
            policy.rotation,
            RotationPolicy::Before(Duration::from_secs(60 * 86_400))
        );
    }

    #[test]
    fn every_key_algorithm_by_its_name() {
        for (name, algorithm) in crate::v1alpha1::KEY_ALGORITHMS {
            let policy = spec(json!({"keyAlgorithm": name})).policy().unwrap();
            assert_eq!(policy.ca.algorithm, algorithm);
        }
        // Names are exact, as the schema's enum is.
        assert_eq!(
            bad_fields(json!({"keyAlgorithm": "ecdsa-p256"})),
            ["spec.keyAlgorithm"]
        );
        assert_eq!(
            bad_fields(json!({"keyAlgorithm": "DSA"})),
            ["spec.keyAlgorithm"]
        );
    }

    #[test]
    fn trust_propagation_may_be_zero() {
        for zero in ["0s", "0"] {
            let policy = spec(json!({"trustPropagation": zero})).policy().unwrap();
            assert_eq!(policy.trust_propagation, Duration::ZERO, "{zero}");
        }
    }

    #[test]
    fn bad_ttls_name_field_and_value() {
        let error = spec(json!({"validity": "10x"})).policy().unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("spec.validity: invalid TTL \"10x\": unknown unit \"x\""),
            "{error}"
        );
        assert_eq!(
            bad_fields(json!({"trustPropagation": "-5m"})),
            ["spec.trustPropagation"]
        );
        assert_eq!(
            bad_fields(json!({"renewAtPercent": null, "renewBefore": "soon"})),
            ["spec.renewBefore"]
        );
    }

    #[test]
    fn renew_before_must_be_shorter_than_validity() {
        let error = spec(json!({"validity": "1y", "renewAtPercent": null, "renewBefore": "2y"}))
            .policy()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "spec.renewBefore: \"2y\" is not shorter than spec.validity \"1y\""
        );
        // Equal is not shorter either.
        assert_eq!(
            bad_fields(json!({"validity": "1y", "renewAtPercent": null, "renewBefore": "365d"})),
            ["spec.renewBefore"]
        );
    }

    #[test]
    fn only_one_of_percent_and_renew_before() {
        let error = spec(json!({"renewBefore": "60d"})).policy().unwrap_err();
        assert_eq!(
            error.errors[0].problem,
            Problem::BothRenewalSettings("spec".into())
        );
        assert_eq!(error.errors[0].field, "spec.renewBefore");
    }

    #[test]
    fn percent_from_1_to_100() {
        for bad in [0, -5, 101, 1000] {
            assert_eq!(
                bad_fields(json!({"renewAtPercent": bad})),
                ["spec.renewAtPercent"],
                "{bad}"
            );
        }
        let at = |percent: i32| {
            spec(json!({"renewAtPercent": percent, "trustPropagation": "0s"}))
                .policy()
                .map(|p| p.rotation)
        };
        assert_eq!(at(1), Ok(RotationPolicy::Fraction(0.01)));
        assert_eq!(at(99), Ok(RotationPolicy::Fraction(0.99)));
    }

    #[test]
    fn a_new_ca_must_be_able_to_sign_before_the_old_one_expires() {
        // 20% of 1h is 12 minutes between rotation and expiry.
        let error = spec(json!({"validity": "1h", "trustPropagation": "12m"}))
            .policy()
            .unwrap_err();
        assert_eq!(error.errors[0].field, "spec.trustPropagation");
        assert!(error.to_string().contains("(12m)"), "{error}");
        assert!(
            spec(json!({"validity": "1h", "trustPropagation": "11m"}))
                .policy()
                .is_ok()
        );
        // Rotating at expiry leaves no time at all.
        assert_eq!(
            bad_fields(json!({"renewAtPercent": 100, "trustPropagation": "0s"})),
            ["spec.trustPropagation"]
        );
        let error = spec(json!({"renewAtPercent": null, "renewBefore": "1d",
                                "trustPropagation": "2d"}))
        .policy()
        .unwrap_err();
        assert!(error.to_string().contains("(1d)"), "{error}");
    }

    #[test]
    fn empty_common_name() {
        assert_eq!(bad_fields(json!({"commonName": " "})), ["spec.commonName"]);
    }

    #[test]
    fn secret_and_bundle_must_be_object_names() {
        assert_eq!(
            bad_fields(json!({
                "secret": {"name": "Webhooks_CA", "namespace": ""},
                "bundle": {"name": "", "namespace": "a.b"},
            })),
            [
                "spec.secret.name",
                "spec.secret.namespace",
                "spec.bundle.name",
                "spec.bundle.namespace"
            ]
        );
    }

    #[test]
    fn allowed_namespaces_must_be_namespace_names() {
        assert_eq!(
            bad_fields(json!({"allowedNamespaces": ["demo", "Not.One", ""]})),
            ["spec.allowedNamespaces[1]", "spec.allowedNamespaces[2]"]
        );
        let fenced = spec(json!({"allowedNamespaces": ["demo"]}));
        assert!(fenced.issues_to("demo") && !fenced.issues_to("other"));
        assert!(spec(json!({})).issues_to("any"), "absent: every namespace");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let error = spec(json!({
            "commonName": "",
            "keyAlgorithm": "RSA-1024",
            "validity": "forever",
            "renewAtPercent": 0,
            "trustPropagation": "5",
        }))
        .policy()
        .unwrap_err();
        let fields: Vec<&str> = error.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.commonName",
                "spec.keyAlgorithm",
                "spec.validity",
                "spec.renewAtPercent",
                "spec.trustPropagation"
            ]
        );
        assert_eq!(error.to_string().matches("; spec.").count(), 4, "{error}");
    }

    proptest! {
        #[test]
        fn any_ttl_pki_accepts_is_the_validity(
            text in "([0-9]{1,3}(\\.[0-9]{1,2})?(ns|us|ms|s|m|h|d|w|mo|y|H|MO)){1,4}",
        ) {
            let Ok(parsed) = text.parse::<Ttl>() else {
                // What pki refuses, the spec refuses too, naming the field.
                let fields = bad_fields(json!({"validity": text, "trustPropagation": "0s"}));
                prop_assert_eq!(fields, ["spec.validity"]);
                return Ok(());
            };
            // Shorter lifetimes leave no time between rotation and expiry.
            prop_assume!(parsed.approximate() >= Duration::from_secs(1));
            let policy = spec(json!({"validity": text, "trustPropagation": "0s"})).policy();
            let policy = policy.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(policy.ca.validity, parsed);
            // Its canonical form means the same.
            let canonical = parsed.to_string();
            let again = spec(json!({"validity": canonical, "trustPropagation": "0s"})).policy();
            prop_assert_eq!(again.unwrap().ca.validity, parsed);
        }

        #[test]
        fn renew_before_shorter_than_validity_is_accepted(
            validity_hours in 2u64..=200_000, fraction in 0.0f64..1.0,
        ) {
            let before_hours = ((validity_hours as f64 * fraction) as u64).max(1);
            prop_assume!(before_hours < validity_hours);
            let policy = spec(json!({
                "validity": format!("{validity_hours}h"),
                "renewAtPercent": null,
                "renewBefore": format!("{before_hours}h"),
                "trustPropagation": "0s",
            }))
            .policy()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(
                policy.rotation,
                RotationPolicy::Before(Duration::from_secs(before_hours * 3600))
            );
        }
    }
}
