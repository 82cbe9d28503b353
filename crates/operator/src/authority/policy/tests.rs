//! Both policies as read from specs users write: the examples of their issues, the defaults,
//! and every way a field can be wrong.

mod certificate_authority {
    use std::time::Duration;

    use caretaker_pki::{KeyAlgorithm, RotationPolicy, Ttl};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use caretaker_api::v1alpha1::CertificateAuthoritySpec;

    use crate::authority::AuthorityPolicy;
    use crate::validation::{Problem, SpecError};

    /// The tests read a spec as the controller does, in fewer words.
    trait Policy {
        fn policy(&self) -> Result<AuthorityPolicy, SpecError>;
    }

    impl Policy for CertificateAuthoritySpec {
        fn policy(&self) -> Result<AuthorityPolicy, SpecError> {
            AuthorityPolicy::from_spec(self)
        }
    }

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
        for (name, algorithm) in crate::validation::KEY_ALGORITHMS {
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

mod issued_certificate {
    use std::net::IpAddr;
    use std::time::Duration;

    use caretaker_pki::{KeyAlgorithm, RotationPolicy, Ttl, Usage};
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use caretaker_api::v1alpha1::IssuedCertificateSpec;

    use crate::authority::CertificatePolicy;
    use crate::validation::{Problem, SpecError};

    /// The tests read a spec as the controller does, in fewer words.
    trait Policy {
        fn policy(&self) -> Result<CertificatePolicy, SpecError>;
    }

    impl Policy for IssuedCertificateSpec {
        fn policy(&self) -> Result<CertificatePolicy, SpecError> {
            CertificatePolicy::from_spec(self)
        }
    }

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
