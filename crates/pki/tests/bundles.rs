//! Trust bundles: strict parsing, de-duplication and ordering.

use caretaker_pki::bundle::{self, DropReason};
use caretaker_pki::{BundleError, CaSpec, CertificateAuthority, TrustBundle};
use proptest::prelude::*;
use time::OffsetDateTime;

fn cas(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            CertificateAuthority::create(&CaSpec::new(format!("ca-{i}")))
                .unwrap()
                .certificate_pem()
        })
        .collect()
}

#[test]
fn a_private_key_in_a_bundle_is_an_error_that_does_not_echo_it() {
    let ca = CertificateAuthority::create(&CaSpec::new("ca")).unwrap();
    let key = ca.private_key_pem();
    let text = format!("{}{}", ca.certificate_pem(), key);
    let err = bundle::parse(&text).unwrap_err();
    assert_eq!(
        err,
        BundleError::NotACertificate {
            index: 2,
            label: "PRIVATE KEY".into()
        }
    );
    let body = key.lines().nth(1).unwrap();
    assert!(!err.to_string().contains(&body[..16]));
}

#[test]
fn undecodable_and_empty_bundles_are_errors() {
    let garbage = pem::encode(&pem::Pem::new("CERTIFICATE", b"not der".to_vec()));
    assert!(matches!(
        bundle::parse(&garbage),
        Err(BundleError::Undecodable { index: 1, .. })
    ));
    assert_eq!(
        bundle::parse("just a comment\n"),
        Err(BundleError::NoCertificates)
    );
}

#[test]
fn fingerprints_without_decoding_are_those_of_the_decoded_certificates() {
    let certs = cas(2);
    let text = format!("# first\n{}\n{}", certs[0], certs[1]);
    let decoded: Vec<String> = (bundle::parse(&text).unwrap().iter())
        .map(|c| c.info().sha256_fingerprint.clone())
        .collect();
    assert_eq!(bundle::fingerprints(&text).unwrap(), decoded);

    let ca = CertificateAuthority::create(&CaSpec::new("ca")).unwrap();
    let with_key = format!("{}{}", ca.certificate_pem(), ca.private_key_pem());
    assert_eq!(
        bundle::fingerprints(&with_key),
        Err(BundleError::NotACertificate {
            index: 2,
            label: "PRIVATE KEY".into()
        })
    );
    assert_eq!(
        bundle::fingerprints("just a comment\n"),
        Err(BundleError::NoCertificates)
    );
    // Not DER: a fingerprint no certificate has.
    let garbage = pem::encode(&pem::Pem::new("CERTIFICATE", b"not der".to_vec()));
    assert!(!decoded.contains(&bundle::fingerprints(&garbage).unwrap()[0]));
}

#[test]
fn comments_between_blocks_are_ignored() {
    let certs = cas(2);
    let text = format!("# first\n{}\n# second\n{}", certs[0], certs[1]);
    assert_eq!(bundle::parse(&text).unwrap().len(), 2);
}

#[test]
fn duplicates_and_expired_certificates_are_dropped_and_reported() {
    let certs = cas(2);
    let text = format!("{}{}{}", certs[0], certs[1], certs[0]);
    let (bundle, dropped) = TrustBundle::from_pem(&text, OffsetDateTime::now_utc()).unwrap();
    assert_eq!(bundle.len(), 2);
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0].reason, DropReason::Duplicate);

    let far_future = OffsetDateTime::now_utc() + time::Duration::days(365 * 20);
    let (bundle, dropped) = TrustBundle::from_pem(&text, far_future).unwrap();
    assert!(bundle.is_empty());
    assert_eq!(
        dropped
            .iter()
            .filter(|d| d.reason == DropReason::Expired)
            .count(),
        2
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn normalizing_is_idempotent_and_order_independent(
        picks in proptest::collection::vec(0usize..5, 1..12),
        shuffle_seed in any::<u64>(),
    ) {
        static CERTS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        let certs = CERTS.get_or_init(|| cas(5));
        let now = OffsetDateTime::now_utc();
        let text: String = picks.iter().map(|&i| certs[i].as_str()).collect();

        let mut shuffled = picks.clone();
        let mut state = shuffle_seed;
        for i in (1..shuffled.len()).rev() {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            shuffled.swap(i, (state >> 33) as usize % (i + 1));
        }
        let shuffled_text: String = shuffled.iter().map(|&i| certs[i].as_str()).collect();

        let (once, _) = TrustBundle::from_pem(&text, now).unwrap();
        let (twice, dropped_again) = TrustBundle::from_pem(&once.to_pem(), now).unwrap();
        let (other_order, _) = TrustBundle::from_pem(&shuffled_text, now).unwrap();

        prop_assert_eq!(once.to_pem(), twice.to_pem());
        prop_assert!(dropped_again.is_empty());
        prop_assert_eq!(once.to_pem(), other_order.to_pem());
        let distinct: std::collections::BTreeSet<_> = picks.iter().collect();
        prop_assert_eq!(once.len(), distinct.len());
    }
}
