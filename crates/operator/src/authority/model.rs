//! A model of `caretaker_pki` for tests that follow a CA through years in a few milliseconds:
//! certificates are facts (subject, dates, a made-up fingerprint), dated by a clock the test
//! moves, with pki's rules (notBefore 5 minutes back, a leaf's notAfter capped at its
//! issuer's). The real certificates' side (observing Secrets, rendering writes) is tested on
//! real pki certificates; this model only stands in where time must pass.

use std::cell::{Cell, RefCell};
use std::net::IpAddr;

use caretaker_pki::{CaSpec, CertificateInfo, LeafSpec, PkiError, Usage};
use time::OffsetDateTime;
use time::macros::datetime;

use super::{CaKeyPair, Certificate, IssuedLeaf, KeyPem, Mint};

/// Where model time starts.
pub const EPOCH: OffsetDateTime = datetime!(2026-01-01 0:00 UTC);

/// `EPOCH` plus `seconds`.
pub fn at(seconds: i64) -> OffsetDateTime {
    EPOCH + time::Duration::seconds(seconds)
}

/// pki's clock-skew allowance: certificates start this long before they are made.
const BACKDATE: time::Duration = time::Duration::minutes(5);

/// What the model made, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Minted {
    Ca {
        fingerprint: String,
        at: OffsetDateTime,
    },
    Leaf {
        fingerprint: String,
        signer: String,
        at: OffsetDateTime,
    },
}

/// A [`Mint`] of model certificates at a clock the test sets.
#[derive(Debug)]
pub struct Model {
    now: Cell<OffsetDateTime>,
    serial: Cell<u64>,
    pub log: RefCell<Vec<Minted>>,
}

impl Model {
    pub fn new(now: OffsetDateTime) -> Self {
        Self {
            now: Cell::new(now),
            serial: Cell::new(0),
            log: RefCell::new(Vec::new()),
        }
    }

    pub fn set_now(&self, now: OffsetDateTime) {
        self.now.set(now);
    }

    /// The clock, in whole seconds as pki stamps certificates.
    pub fn now(&self) -> OffsetDateTime {
        let now = self.now.get();
        now.replace_nanosecond(0).unwrap_or(now)
    }

    fn next_serial(&self) -> u64 {
        let n = self.serial.get() + 1;
        self.serial.set(n);
        n
    }

    /// A CA certificate valid for `days` from now, without logging it.
    pub fn ca_cert(&self, common_name: &str, days: i64) -> Certificate {
        let now = self.now();
        let n = self.next_serial();
        certificate(Facts {
            serial: n,
            common_name,
            issuer: common_name,
            not_before: now - BACKDATE,
            not_after: now + time::Duration::days(days),
            is_ca: true,
            dns_names: &[],
            ip_addresses: &[],
            usage: None,
            organizations: &[],
        })
    }

    /// A CA key pair valid for `days` from now, without logging it.
    pub fn ca(&self, common_name: &str, days: i64) -> CaKeyPair {
        let certificate = self.ca_cert(common_name, days);
        let key = KeyPem::new(format!("model key of {}", certificate.serial()));
        CaKeyPair::new(certificate, key, caretaker_pki::KeyAlgorithm::EcdsaP256)
    }
}

impl Mint for Model {
    fn create_ca(&self, spec: &CaSpec) -> Result<CaKeyPair, PkiError> {
        let now = self.now();
        let n = self.next_serial();
        let certificate = certificate(Facts {
            serial: n,
            common_name: &spec.common_name,
            issuer: &spec.common_name,
            not_before: now - BACKDATE,
            not_after: spec.validity.expires_at(now).expect("model dates"),
            is_ca: true,
            dns_names: &[],
            ip_addresses: &[],
            usage: None,
            organizations: &[],
        });
        self.log.borrow_mut().push(Minted::Ca {
            fingerprint: certificate.fingerprint().to_string(),
            at: now,
        });
        let key = KeyPem::new(format!("model key of {n}"));
        Ok(CaKeyPair::new(certificate, key, spec.algorithm))
    }

    fn issue(&self, signer: &CaKeyPair, spec: &LeafSpec) -> Result<IssuedLeaf, PkiError> {
        let now = self.now();
        let ca = &signer.certificate;
        if ca.not_after() <= now {
            return Err(PkiError::CaExpired {
                subject: ca.info().subject.clone(),
                not_after: ca.not_after(),
            });
        }
        let n = self.next_serial();
        let wanted = spec.validity.expires_at(now).expect("model dates");
        let certificate = certificate(Facts {
            serial: n,
            common_name: &spec.common_name,
            issuer: ca.common_name(),
            not_before: (now - BACKDATE).max(ca.not_before()),
            not_after: wanted.min(ca.not_after()),
            is_ca: false,
            dns_names: &spec.dns_names,
            ip_addresses: &spec.ip_addresses,
            usage: Some(spec.usage),
            organizations: &spec.organizations,
        });
        self.log.borrow_mut().push(Minted::Leaf {
            fingerprint: certificate.fingerprint().to_string(),
            signer: signer.fingerprint().to_string(),
            at: now,
        });
        Ok(IssuedLeaf {
            certificate,
            key: KeyPem::new(format!("model key of {n}")),
            algorithm: spec.algorithm,
        })
    }
}

struct Facts<'a> {
    serial: u64,
    common_name: &'a str,
    issuer: &'a str,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    is_ca: bool,
    dns_names: &'a [String],
    ip_addresses: &'a [IpAddr],
    usage: Option<Usage>,
    organizations: &'a [String],
}

fn certificate(facts: Facts<'_>) -> Certificate {
    let fingerprint = format!("model:{:08}", facts.serial);
    let extended_key_usages = match facts.usage {
        None => vec![],
        Some(Usage::Server) => vec!["serverAuth".to_string()],
        Some(Usage::Client) => vec!["clientAuth".to_string()],
        Some(Usage::Both) => vec!["serverAuth".to_string(), "clientAuth".to_string()],
    };
    let info = CertificateInfo {
        subject: format!("CN={}", facts.common_name),
        common_name: Some(facts.common_name.to_string()),
        organizations: facts.organizations.to_vec(),
        issuer: format!("CN={}", facts.issuer),
        issuer_common_name: Some(facts.issuer.to_string()),
        serial: format!("{:02x}", facts.serial),
        not_before: facts.not_before,
        not_after: facts.not_after,
        dns_names: facts.dns_names.to_vec(),
        ip_addresses: facts.ip_addresses.to_vec(),
        is_ca: facts.is_ca,
        path_len: None,
        key_usages: vec![],
        extended_key_usages,
        subject_key_id: None,
        authority_key_id: None,
        key_algorithm: "model".into(),
        sha256_fingerprint: fingerprint.clone(),
    };
    Certificate::from_parts(
        format!("-----BEGIN CERTIFICATE-----\n{fingerprint}\n-----END CERTIFICATE-----\n"),
        fingerprint.into_bytes(),
        info,
    )
}
