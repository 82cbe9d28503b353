//! Issuance end to end: every leaf verifies with `openssl verify`, CSR signing obeys its
//! policy, and no leaf outlives its CA.

use std::net::IpAddr;
use std::path::Path;
use std::process::Command;

use caretaker_pki::{
    CaSpec, CertificateAuthority, CertificateInfo, CertificateRequest, CsrSubject, KeyAlgorithm,
    LeafSpec, PkiError, PrivateKey, Refusal, SigningPolicy, Ttl, Usage, key_matches_certificate,
};
use proptest::prelude::*;

fn openssl_verify(dir: &Path, ca_pem: &str, leaf_pem: &str, purpose: &str) -> (bool, String) {
    std::fs::write(dir.join("ca.crt"), ca_pem).unwrap();
    std::fs::write(dir.join("leaf.crt"), leaf_pem).unwrap();
    let output = Command::new("openssl")
        .args(["verify", "-purpose", purpose, "-CAfile"])
        .arg(dir.join("ca.crt"))
        .arg(dir.join("leaf.crt"))
        .output()
        .expect("openssl is installed (CI installs it)");
    let text = String::from_utf8_lossy(&output.stdout).to_string()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.success(), text)
}

#[test]
fn every_algorithm_issues_leaves_that_openssl_verifies() {
    let dir = tempfile::tempdir().unwrap();
    for algorithm in KeyAlgorithm::ALL {
        let ca = CertificateAuthority::create(&CaSpec {
            algorithm,
            ..CaSpec::new(format!("ca-{algorithm}"))
        })
        .unwrap();
        for (usage, purpose) in [
            (Usage::Server, "sslserver"),
            (Usage::Client, "sslclient"),
            (Usage::Both, "sslserver"),
            (Usage::Both, "sslclient"),
        ] {
            let leaf = ca
                .issue(
                    &LeafSpec::new("node-1", usage)
                        .with_dns_names(["node-1.example", "localhost"])
                        .with_ip_addresses(["10.0.0.7".parse::<IpAddr>().unwrap()])
                        .with_algorithm(algorithm),
                )
                .unwrap();
            let (ok, text) = openssl_verify(
                dir.path(),
                &ca.certificate_pem(),
                &leaf.certificate_pem,
                purpose,
            );
            assert!(ok, "{algorithm} {usage} {purpose}: {text}");
            let key = leaf.key.as_ref().unwrap();
            assert!(key_matches_certificate(key, &leaf.certificate_der).unwrap());
            assert!(!key_matches_certificate(key, ca.certificate_der()).unwrap());
        }
    }
}

#[test]
fn a_wrong_ca_fails_openssl_verify() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::create(&CaSpec::new("right")).unwrap();
    let other = CertificateAuthority::create(&CaSpec::new("right")).unwrap();
    let leaf = ca.issue(&LeafSpec::new("x", Usage::Server)).unwrap();
    let (ok, _) = openssl_verify(
        dir.path(),
        &other.certificate_pem(),
        &leaf.certificate_pem,
        "sslserver",
    );
    assert!(
        !ok,
        "a leaf must not verify against a different CA with the same name"
    );
}

/// An issuer's common name is read from the name, not from its text: a `, ` in it stays.
#[test]
fn an_issuer_common_name_with_a_comma_is_read_whole() {
    let ca = CertificateAuthority::create(&CaSpec::new("webhooks, team a")).unwrap();
    let leaf = ca
        .issue(&LeafSpec::new("web", Usage::Server).with_dns_names(["web"]))
        .unwrap();
    assert_eq!(
        leaf.info().issuer_common_name.as_deref(),
        Some("webhooks, team a")
    );
}

#[test]
fn inspection_reports_what_was_issued() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let leaf = ca
        .issue(
            &LeafSpec::new("kube-apiserver", Usage::Server)
                .with_organizations(["system:masters"])
                .with_dns_names(["kubernetes.default.svc"])
                .with_ip_addresses(["10.96.0.1".parse::<IpAddr>().unwrap()]),
        )
        .unwrap();
    let info = CertificateInfo::from_pem(&leaf.certificate_pem).unwrap();
    assert_eq!(&info, leaf.info());
    assert_eq!(info.common_name.as_deref(), Some("kube-apiserver"));
    assert_eq!(info.organizations, ["system:masters"]);
    assert_eq!(info.issuer, ca.info().subject);
    assert_eq!(info.issuer_common_name.as_deref(), Some("kubernetes"));
    assert_eq!(info.dns_names, ["kubernetes.default.svc"]);
    assert_eq!(info.ip_addresses, ["10.96.0.1".parse::<IpAddr>().unwrap()]);
    assert_eq!(info.extended_key_usages, ["serverAuth"]);
    assert!(!info.is_ca);
    assert_eq!(info.key_algorithm, "ECDSA P-256");
    assert_eq!(info.authority_key_id, ca.info().subject_key_id);
    assert!(info.subject_key_id.is_some());
    // 16 serial bytes, printed as 16 hex pairs.
    assert_eq!(info.serial.split(':').count(), 16);
    assert!(ca.info().is_ca);
    assert_eq!(ca.info().path_len, Some(0));
    assert!(
        ca.info().key_usages.iter().any(|u| u == "Key Cert Sign"),
        "{:?}",
        ca.info().key_usages
    );
}

#[test]
fn serials_are_random() {
    // A counter, a timestamp or a hash of the subject would all give distinct serials; only
    // random ones spread over every bit. 64 serials of 127 random bits: each bit position is
    // set about 32 times; one set fewer than 8 or more than 56 times, at any of the 127
    // positions, happens less than once in 10^8 runs for a fair source.
    let ca = CertificateAuthority::create(&CaSpec::new("ca")).unwrap();
    let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let serials: Vec<Vec<u8>> = (0..64)
        .map(|_| {
            let issued = ca
                .issue_for_key(&LeafSpec::new("x", Usage::Client), &key)
                .unwrap();
            let hex = issued.info().serial.replace(':', "");
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            assert!(bytes.len() <= 16, "at most 128 bits: {bytes:02x?}");
            assert!(bytes[0] & 0x80 == 0, "positive: {bytes:02x?}");
            // DER drops leading zero bytes; put them back.
            let mut padded = vec![0u8; 16 - bytes.len()];
            padded.extend(bytes);
            padded
        })
        .collect();
    let unique: std::collections::BTreeSet<_> = serials.iter().collect();
    assert_eq!(
        unique.len(),
        serials.len(),
        "same key, same subject, distinct serials"
    );
    for bit in 0..127 {
        let set = serials
            .iter()
            .filter(|s| s[15 - bit / 8] & (1 << (bit % 8)) != 0)
            .count();
        assert!(
            (8..=56).contains(&set),
            "bit {bit} was set in {set} of 64 serials"
        );
    }
}

#[test]
fn ca_round_trips_through_pem_and_refuses_non_cas_and_foreign_keys() {
    let ca = CertificateAuthority::create(&CaSpec::new("ca")).unwrap();
    let loaded =
        CertificateAuthority::from_pem(&ca.certificate_pem(), &ca.private_key_pem()).unwrap();
    assert_eq!(loaded.info(), ca.info());
    let leaf = loaded.issue(&LeafSpec::new("x", Usage::Server)).unwrap();
    assert_eq!(leaf.info().authority_key_id, ca.info().subject_key_id);

    let leaf_key = leaf.key.as_ref().unwrap().to_pem();
    let err = CertificateAuthority::from_pem(&leaf.certificate_pem, &leaf_key).unwrap_err();
    assert!(matches!(err, PkiError::NotACa { .. }), "{err}");

    let other = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let err = CertificateAuthority::from_pem(&ca.certificate_pem(), &other.to_pem()).unwrap_err();
    assert!(matches!(err, PkiError::KeyMismatch { .. }), "{err}");
}

#[test]
fn validity_is_capped_at_the_ca() {
    let ca = CertificateAuthority::create(&CaSpec {
        validity: "30d".parse().unwrap(),
        ..CaSpec::new("short-lived")
    })
    .unwrap();
    let leaf = ca.issue(&LeafSpec::new("x", Usage::Server)).unwrap();
    assert!(leaf.capped_at_issuer);
    assert_eq!(leaf.info().not_after, ca.info().not_after);
    let short = ca
        .issue(&LeafSpec::new("x", Usage::Server).with_validity("1d".parse().unwrap()))
        .unwrap();
    assert!(!short.capped_at_issuer);
    assert!(short.info().not_after < ca.info().not_after);
    assert!(short.info().not_before >= ca.info().not_before);
}

fn node_policy() -> SigningPolicy {
    SigningPolicy {
        common_names: vec!["kube-apiserver".into()],
        organizations: vec![],
        dns_names: vec!["node-1".into(), "kubernetes.default".into()],
        ip_addresses: vec!["10.0.0.7".parse().unwrap()],
        usage: Some(Usage::Server),
    }
}

fn csr(dns: &[&str], ips: &[&str], usage: Usage) -> (PrivateKey, String) {
    let key = PrivateKey::generate(KeyAlgorithm::EcdsaP256).unwrap();
    let subject = CsrSubject {
        common_name: "kube-apiserver".into(),
        organizations: vec![],
        dns_names: dns.iter().map(|s| s.to_string()).collect(),
        ip_addresses: ips.iter().map(|s| s.parse().unwrap()).collect(),
        usage,
    };
    let pem = subject.to_csr_pem(&key).unwrap();
    (key, pem)
}

#[test]
fn a_csr_within_policy_is_signed_for_the_node_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let (key, pem) = csr(
        &["node-1", "KUBERNETES.default"],
        &["10.0.0.7"],
        Usage::Server,
    );
    let request = CertificateRequest::from_pem(&pem).unwrap();
    assert_eq!(request.common_name.as_deref(), Some("kube-apiserver"));
    assert_eq!(request.usage, Some(Usage::Server));

    let signed = ca
        .sign_request(&pem, &node_policy(), &"90d".parse().unwrap())
        .unwrap();
    assert!(signed.key.is_none(), "the key stays with the requester");
    assert!(key_matches_certificate(&key, &signed.certificate_der).unwrap());
    assert_eq!(signed.info().dns_names, ["node-1", "KUBERNETES.default"]);
    let (ok, text) = openssl_verify(
        dir.path(),
        &ca.certificate_pem(),
        &signed.certificate_pem,
        "sslserver",
    );
    assert!(ok, "{text}");
}

#[test]
fn csrs_asking_for_too_much_are_refused_naming_what() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let ttl: Ttl = "90d".parse().unwrap();
    let refusal = |pem: &str, policy: &SigningPolicy| match ca.sign_request(pem, policy, &ttl) {
        Err(PkiError::Refused { refusal, .. }) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    };

    let (_, foreign) = csr(&["node-1", "evil.example"], &[], Usage::Server);
    assert_eq!(
        refusal(&foreign, &node_policy()),
        Refusal::DnsName("evil.example".into())
    );
    let message = ca
        .sign_request(&foreign, &node_policy(), &ttl)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("evil.example") && message.contains("kube-apiserver"),
        "{message}"
    );

    let (_, foreign_ip) = csr(&[], &["10.0.0.8"], Usage::Server);
    assert_eq!(
        refusal(&foreign_ip, &node_policy()),
        Refusal::IpAddress("10.0.0.8".parse().unwrap())
    );

    let (_, client) = csr(&[], &[], Usage::Both);
    assert!(matches!(
        refusal(&client, &node_policy()),
        Refusal::Usage {
            requested: Usage::Both,
            ..
        }
    ));

    let (_, ok) = csr(&[], &[], Usage::Server);
    let strict = SigningPolicy {
        common_names: vec!["someone-else".into()],
        ..node_policy()
    };
    assert_eq!(
        refusal(&ok, &strict),
        Refusal::CommonName("kube-apiserver".into())
    );
}

#[test]
fn a_csr_asking_to_be_a_ca_is_never_signed() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["node-1".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let pem = params.serialize_request(&key).unwrap().pem().unwrap();
    let err = ca
        .sign_request(&pem, &node_policy(), &"1d".parse().unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            PkiError::Refused {
                refusal: Refusal::CaRequested,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn a_tampered_csr_is_rejected() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let (_, pem) = csr(&["node-1"], &[], Usage::Server);
    let block = pem::parse(&pem).unwrap();
    let mut der = block.contents().to_vec();
    // Flip a byte inside the subject; the self-signature no longer matches.
    let at = der
        .windows(14)
        .position(|w| w == b"kube-apiserver")
        .unwrap();
    der[at] = b'K';
    let tampered = pem::encode(&pem::Pem::new("CERTIFICATE REQUEST", der));
    let err = ca
        .sign_request(&tampered, &node_policy(), &"1d".parse().unwrap())
        .unwrap_err();
    assert!(matches!(err, PkiError::InvalidCsr(_)), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn a_leaf_never_outlives_its_ca(ca_days in 1u32..4000, leaf_days in 1u32..8000, leaf_years in 0u32..30) {
        let ca = CertificateAuthority::create(&CaSpec {
            validity: Ttl::calendar(0, 0, ca_days).unwrap(),
            ..CaSpec::new("ca")
        }).unwrap();
        let leaf = ca.issue(&LeafSpec::new("x", Usage::Both)
            .with_validity(Ttl::calendar(leaf_years, 0, leaf_days).unwrap())).unwrap();
        prop_assert!(leaf.info().not_after <= ca.info().not_after);
        prop_assert!(leaf.info().not_before >= ca.info().not_before);
    }
}

#[test]
fn issued_by_checks_name_and_signature() {
    let ca = CertificateAuthority::create(&CaSpec::new("same-name")).unwrap();
    let impostor = CertificateAuthority::create(&CaSpec::new("same-name")).unwrap();
    let leaf = ca.issue(&LeafSpec::new("x", Usage::Server)).unwrap();
    assert!(caretaker_pki::is_issued_by(&leaf.certificate_der, ca.certificate_der()).unwrap());
    assert!(
        !caretaker_pki::is_issued_by(&leaf.certificate_der, impostor.certificate_der()).unwrap()
    );
    let other = CertificateAuthority::create(&CaSpec::new("other-name")).unwrap();
    assert!(!caretaker_pki::is_issued_by(&leaf.certificate_der, other.certificate_der()).unwrap());
}

/// A leaf whose authority key identifier names another key than the CA's is not the CA's, even
/// with a signature that verifies (as OpenSSL says too): each rotation's CA has the same name,
/// and the identifiers tell them apart without checking signatures.
#[test]
fn issued_by_refuses_a_leaf_naming_another_key_identifier() {
    use rcgen::{CertificateParams, DnType, Issuer, KeyIdMethod, KeyPair};
    let key = KeyPair::generate().unwrap();
    let ca_params = rotating_ca_params();
    let ca = ca_params.self_signed(&key).unwrap();
    let leaf = |issuer_key_id: u8| {
        let mut issuer_params = ca_params.clone();
        issuer_params.key_identifier_method = KeyIdMethod::PreSpecified(vec![issuer_key_id; 20]);
        let issuer = Issuer::new(issuer_params, &key);
        let mut params = CertificateParams::new(vec!["leaf.example".to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, "leaf");
        params.use_authority_key_identifier_extension = true;
        params
            .signed_by(&KeyPair::generate().unwrap(), &issuer)
            .unwrap()
    };
    let (honest, naming_another) = (leaf(1), leaf(2));
    assert!(caretaker_pki::is_issued_by(honest.der(), ca.der()).unwrap());
    assert!(!caretaker_pki::is_issued_by(naming_another.der(), ca.der()).unwrap());

    let dir = tempfile::tempdir().unwrap();
    let verify =
        |leaf: &rcgen::Certificate| openssl_verify(dir.path(), &ca.pem(), &leaf.pem(), "sslserver");
    assert!(verify(&honest).0, "{}", verify(&honest).1);
    let (ok, said) = verify(&naming_another);
    assert!(!ok, "{said}");
}

/// A hostile leaf that copies the CA's name and key identifier, signed with another key, is
/// refused by its signature (as OpenSSL refuses it): the key identifiers only rule CAs out.
#[test]
fn issued_by_refuses_a_forged_leaf_naming_the_cas_key_identifier() {
    use rcgen::{CertificateParams, Issuer, KeyPair};
    let ca_params = rotating_ca_params();
    let ca = ca_params
        .self_signed(&KeyPair::generate().unwrap())
        .unwrap();
    // Same name and key identifier as the CA, another key.
    let forger = Issuer::new(ca_params, KeyPair::generate().unwrap());
    let mut params = CertificateParams::new(vec!["leaf.example".to_string()]).unwrap();
    params.use_authority_key_identifier_extension = true;
    let forged = params
        .signed_by(&KeyPair::generate().unwrap(), &forger)
        .unwrap();
    assert!(!caretaker_pki::is_issued_by(forged.der(), ca.der()).unwrap());

    let dir = tempfile::tempdir().unwrap();
    let (ok, said) = openssl_verify(dir.path(), &ca.pem(), &forged.pem(), "sslserver");
    assert!(!ok, "{said}");
}

/// A CA named `rotating` whose subject key identifier is twenty bytes of 1.
fn rotating_ca_params() -> rcgen::CertificateParams {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyIdMethod};
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "rotating");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_identifier_method = KeyIdMethod::PreSpecified(vec![1; 20]);
    params
}
