//! trust-manager's bundle bytes and trust stores: the certificate pool against upstream's own
//! test certificates (`tests/fixtures/trust-manager/`, recreated from trust-manager's
//! `test/dummy`), the PEM checked against openssl's encoding, and the JKS and PKCS#12 stores
//! read back by openssl and by the JDK's keytool.
//!
//! keytool comes from a JRE; without one the keytool checks print why they are skipped, unless
//! CARETAKER_REQUIRE_KEYTOOL=1 (which CI sets) makes that a failure.

use std::path::Path;
use std::process::Command;

use caretaker_pki::truststore::{Pkcs12Profile, jks, pkcs12};
use caretaker_pki::{CertificatePool, PoolError, PoolFilters};
use time::OffsetDateTime;

fn fixture(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/trust-manager")
        .join(format!("{name}.pem"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn join(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| fixture(n))
        .collect::<Vec<_>>()
        .join("\n")
}

fn pool_of(text: &str, filters: PoolFilters) -> Result<CertificatePool, PoolError> {
    let mut pool = CertificatePool::new(filters, OffsetDateTime::now_utc());
    pool.add_pem(text.as_bytes())?;
    Ok(pool)
}

fn pool(names: &[&str]) -> CertificatePool {
    pool_of(&join(names), PoolFilters::default()).expect("upstream's certificates parse")
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the command starts");
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The keytool on this machine, or `None` (with the reason printed) when tests may skip it.
fn keytool(test: &str) -> Option<&'static str> {
    let found = Command::new("keytool").arg("-help").output().is_ok();
    match found {
        true => Some("keytool"),
        false if std::env::var("CARETAKER_REQUIRE_KEYTOOL").is_ok_and(|v| v == "1") => {
            panic!("{test}: keytool is not installed and CARETAKER_REQUIRE_KEYTOOL=1")
        }
        false => {
            eprintln!(
                "{test}: skipped the keytool checks: keytool is not installed (a JRE has it)"
            );
            None
        }
    }
}

#[test]
fn the_bundle_is_sorted_by_sha256_deduplicated_and_has_no_trailing_newline() {
    let forwards = pool(&["TestCertificate1", "TestCertificate2", "TestCertificate3"]);
    let backwards = pool(&[
        "TestCertificate3Duplicate",
        "TestCertificate3",
        "TestCertificate2",
        "TestCertificate1",
        "TestCertificate2",
    ]);
    assert_eq!(forwards.len(), 3);
    assert_eq!(forwards.to_pem(), backwards.to_pem());

    let hashes: Vec<_> = forwards.certificates().map(|c| *c.sha256()).collect();
    let mut sorted = hashes.clone();
    sorted.sort();
    assert_eq!(hashes, sorted);

    let text = forwards.to_pem();
    assert!(!text.ends_with('\n'));
    assert_eq!(
        text.matches("-----END CERTIFICATE-----\n-----BEGIN")
            .count(),
        2
    );
    assert!(text.lines().all(|l| l.len() <= 64));
}

#[test]
fn each_block_is_what_openssl_writes_for_the_certificate() {
    let pool = pool(&["TestCertificate1", "TestCertificate3", "TestCertificate4"]);
    let dir = tempfile::tempdir().unwrap();
    let mut expected = String::new();
    for (i, certificate) in pool.certificates().enumerate() {
        let der = dir.path().join(format!("{i}.der"));
        std::fs::write(&der, certificate.der()).unwrap();
        expected.push_str(&run(Command::new("openssl")
            .args(["x509", "-inform", "DER", "-in"])
            .arg(&der)));
    }
    assert_eq!(pool.to_pem(), expected.trim_end());
}

#[test]
fn formatting_comments_and_crlf_do_not_change_the_bytes() {
    let plain = pool(&["TestCertificate1", "TestCertificate2"]).to_pem();
    let messy = format!(
        "# a comment\r\n{}\r\n\r\nsome junk\n{}\n\n",
        fixture("TestCertificate2").replace('\n', "\r\n"),
        fixture("TestCertificate1")
    );
    assert_eq!(
        pool_of(&messy, PoolFilters::default()).unwrap().to_pem(),
        plain
    );
}

#[test]
fn text_without_a_valid_block_is_an_empty_pool_not_an_error() {
    // trust-manager's "if invalid certificate / invalid PEM data, should return empty bundle".
    for text in [
        fixture("TestCertificateInvalid7"),
        "qwerty".to_string(),
        String::new(),
    ] {
        let pool = pool_of(&text, PoolFilters::default()).unwrap();
        assert!(pool.is_empty());
        assert_eq!(pool.to_pem(), "");
    }
}

#[test]
fn a_private_key_or_pem_headers_refuse_the_source_without_showing_it() {
    let key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0LWtleS1ieXRlcw==\n-----END PRIVATE KEY-----";
    let with_key = format!("{}\n{key}", fixture("TestCertificate1"));
    let error = pool_of(&with_key, PoolFilters::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid PEM block in bundle: only CERTIFICATE blocks are permitted but found 'PRIVATE KEY'"
    );
    assert!(!error.to_string().contains("c2VjcmV0"));

    let headers = fixture("TestCertificate1").replacen(
        "-----BEGIN CERTIFICATE-----\n",
        "-----BEGIN CERTIFICATE-----\nComment: secret\n",
        1,
    );
    assert_eq!(
        pool_of(&headers, PoolFilters::default())
            .unwrap_err()
            .to_string(),
        "invalid PEM block in bundle; blocks are not permitted to have PEM headers"
    );

    let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----";
    let error = pool_of(garbage, PoolFilters::default()).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("invalid PEM block in bundle; invalid PEM certificate: "),
        "{error}"
    );
}

#[test]
fn a_negative_serial_number_is_refused_as_go_refuses_it() {
    let certificate = pool(&["TestCertificate1"])
        .certificates()
        .next()
        .unwrap()
        .der()
        .to_vec();
    // TestCertificate1's serial is 0f:7a:09:a8:...; make its first byte negative.
    let at = certificate
        .windows(3)
        .position(|w| w == [0x02, 0x10, 0x0f])
        .expect("the serial number")
        + 2;
    let mut negative = certificate.clone();
    negative[at] = 0x8f;
    let pem = pem::encode(&pem::Pem::new("CERTIFICATE", negative));
    let error = pool_of(&pem, PoolFilters::default()).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid PEM block in bundle; invalid PEM certificate: x509: negative serial number"
    );
}

#[test]
fn the_filters_drop_expired_and_non_ca_certificates() {
    let expired = fixture("TestExpiredCertificate");
    assert_eq!(pool_of(&expired, PoolFilters::default()).unwrap().len(), 1);
    let filtered = PoolFilters {
        expired: true,
        non_ca: false,
    };
    assert!(pool_of(&expired, filtered).unwrap().is_empty());

    let mixed = join(&[
        "TestCertificate1",
        "TestCertificateNonCA1",
        "TestCertificate2",
        "TestCertificate3",
        "TestCertificateNonCA2",
    ]);
    assert_eq!(pool_of(&mixed, PoolFilters::default()).unwrap().len(), 5);
    let only_cas = pool_of(
        &mixed,
        PoolFilters {
            expired: false,
            non_ca: true,
        },
    )
    .unwrap();
    assert_eq!(only_cas.len(), 3);
    assert!(only_cas.certificates().all(|c| c.is_ca()));
}

#[test]
fn aliases_are_trust_managers() {
    // Upstream's Test_certAlias.
    let pool = pool(&["TestCertificate1"]);
    let certificate = pool.certificates().next().unwrap();
    assert_eq!(
        certificate.alias(),
        "548b988f|CN=cmct-test-root,O=cert-manager"
    );
    let isrg = pool_of(&fixture("TestCertificate3"), PoolFilters::default()).unwrap();
    assert_eq!(
        isrg.certificates().next().unwrap().go_subject(),
        "CN=ISRG Root X1,O=Internet Security Research Group,C=US"
    );
}

#[test]
fn jks_stores_are_deterministic_and_keytool_reads_them() {
    let pool = pool(&["TestCertificate1", "TestCertificate2", "TestCertificate3"]);
    let store = jks::encode(&pool, "changeit");
    assert_eq!(
        store,
        jks::encode(&pool, "changeit"),
        "the same pool gives the same bytes"
    );
    assert_eq!(&store[..4], [0xfe, 0xed, 0xfe, 0xed]);
    assert_ne!(
        store,
        jks::encode(&pool, "other"),
        "the password is in the checksum"
    );

    let Some(keytool) = keytool("jks_stores_are_deterministic_and_keytool_reads_them") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bundle.jks");
    std::fs::write(&file, &store).unwrap();
    let listing = run(Command::new(keytool)
        .args([
            "-list",
            "-storetype",
            "JKS",
            "-storepass",
            "changeit",
            "-keystore",
        ])
        .arg(&file));
    assert!(listing.contains("contains 3 entries"), "{listing}");
    assert_eq!(listing.matches("trustedCertEntry").count(), 3, "{listing}");
    for certificate in pool.certificates() {
        let alias = certificate.alias().to_lowercase();
        assert!(listing.contains(&alias), "{alias} in {listing}");
    }
    let wrong = Command::new(keytool)
        .args([
            "-list",
            "-storetype",
            "JKS",
            "-storepass",
            "wrongpass",
            "-keystore",
        ])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        !wrong.status.success(),
        "keytool must check the integrity digest"
    );
}

#[test]
fn passwordless_pkcs12_is_deterministic_and_readable_without_a_password() {
    let pool = pool(&["TestCertificate1", "TestCertificate2", "TestCertificate3"]);
    let store = pkcs12::encode(&pool, "", Pkcs12Profile::LegacyRc2).unwrap();
    assert_eq!(
        store,
        pkcs12::encode(&pool, "", Pkcs12Profile::Modern2023).unwrap()
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bundle.p12");
    std::fs::write(&file, &store).unwrap();
    let certificates = run(Command::new("openssl")
        .args(["pkcs12", "-nokeys", "-passin", "pass:", "-in"])
        .arg(&file));
    assert_eq!(
        certificates.matches("-----BEGIN CERTIFICATE-----").count(),
        3
    );
    for certificate in pool.certificates() {
        assert!(
            certificates.contains(&certificate.alias()),
            "friendlyName {}",
            certificate.alias()
        );
    }

    let Some(keytool) =
        keytool("passwordless_pkcs12_is_deterministic_and_readable_without_a_password")
    else {
        return;
    };
    let listing = run(Command::new(keytool)
        .args(["-list", "-storetype", "PKCS12", "-keystore"])
        .arg(&file)
        .stdin(std::process::Stdio::null()));
    assert_eq!(listing.matches("trustedCertEntry").count(), 3, "{listing}");
}

#[test]
fn password_protected_pkcs12_opens_with_its_password_in_every_profile() {
    let pool = pool(&["TestCertificate1", "TestCertificate2", "TestCertificate4"]);
    let dir = tempfile::tempdir().unwrap();
    let keytool = keytool("password_protected_pkcs12_opens_with_its_password_in_every_profile");
    for (profile, openssl_extra) in [
        (Pkcs12Profile::LegacyRc2, Some("-legacy")),
        (Pkcs12Profile::LegacyDes, None),
        (Pkcs12Profile::Modern2023, None),
    ] {
        let store = pkcs12::encode(&pool, "s3cret-pass", profile).unwrap();
        let file = dir.path().join(format!("{profile:?}.p12"));
        std::fs::write(&file, &store).unwrap();

        let mut command = Command::new("openssl");
        command.arg("pkcs12");
        command.args(openssl_extra);
        command
            .args(["-nokeys", "-passin", "pass:s3cret-pass", "-in"])
            .arg(&file);
        let certificates = run(&mut command);
        assert_eq!(
            certificates.matches("-----BEGIN CERTIFICATE-----").count(),
            3,
            "{profile:?}"
        );

        let mut wrong = Command::new("openssl");
        wrong.arg("pkcs12");
        wrong.args(openssl_extra);
        wrong
            .args(["-nokeys", "-passin", "pass:wrong", "-in"])
            .arg(&file);
        assert!(
            !wrong.output().unwrap().status.success(),
            "{profile:?}: the MAC is checked"
        );

        if let Some(keytool) = keytool {
            let listing = run(Command::new(keytool)
                .args([
                    "-list",
                    "-storetype",
                    "PKCS12",
                    "-storepass",
                    "s3cret-pass",
                    "-keystore",
                ])
                .arg(&file));
            assert_eq!(
                listing.matches("trustedCertEntry").count(),
                3,
                "{profile:?}: {listing}"
            );
        }
    }
}
