//! An IssuedCertificate as one decision: [`plan`] reads its Secret and its issuer
//! ([`IssuerView`]) and says whether it needs a new certificate and key (and why, in
//! library-go's words where it has them), only a new `ca.crt`, or nothing.
//!
//! A new certificate is issued when there is none, when it is due (its rotation policy) or
//! expired, when its issuer is not the CA that signs now, when its names or usages are not
//! what the spec asks, when its key is missing or does not match, or when a library-go
//! annotation was removed or no longer says what the certificate says (`missing notAfter`,
//! `missing notBefore`, ...: library-go's forced rotation). A `ca.crt` that is not the
//! issuer's bundle is rewritten alone, keeping the key.

use std::collections::{BTreeMap, BTreeSet};

use caretaker_pki::{KeyAlgorithm, PkiError, PrivateKey, Usage};
use time::OffsetDateTime;

use super::bundle::Bundle;
use super::ca::{IssuerView, NoSigner};
use super::verified::Verified;
use super::{
    CA_CRT, CaKeyPair, Certificate, CertificatePolicy, CertificateStatus, Condition, IssuedLeaf,
    Mint, ObjectName, SecretContent, SecretData, TLS_CRT, TLS_KEY, TlsAnnotations, due, expiring,
    hostnames, serving, wanted_hostnames,
};
use crate::changes::{AnnotationChanges, Event};
use crate::timestamp::format_time;
use caretaker_api::names;

/// The key in `tls.key`, as it relates to `tls.crt`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    Missing,
    /// Not a private key caretaker reads (the reason never quotes it).
    Unreadable(String),
    /// A key, not the certificate's.
    Mismatch,
    Matches(KeyAlgorithm),
}

/// A certificate Secret as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSecret {
    /// The first certificate of `tls.crt`, or why there is none to use.
    pub certificate: Result<Certificate, String>,
    /// Certificates after the first in `tls.crt` (it must hold the leaf alone).
    pub extra_certificates: usize,
    pub key: KeyState,
    /// The fingerprint of the CA among the issuer's trusted ones that signed it; `None` when
    /// none did.
    pub issuer: Option<String>,
    /// The fingerprints of `ca.crt`, in order; `None` when missing or unreadable.
    pub ca_bundle: Option<Vec<String>>,
    pub annotations: TlsAnnotations,
}

/// The certificate Secret, or its absence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafSecretState {
    Absent,
    Present(LeafSecret),
}

impl LeafSecretState {
    /// Reads a Secret's `data` and annotations (`None`: there is no such Secret). `serving`:
    /// whether the certificate serves TLS (and so carries the hostnames annotation);
    /// `issuers`: the CAs it may be signed by (its issuer's bundle and signer), tried in
    /// order; `verified`: what is known to verify.
    pub fn observe<'a>(
        secret: Option<SecretContent<'_>>,
        serving: bool,
        issuers: impl IntoIterator<Item = &'a Certificate>,
        verified: &Verified,
    ) -> Self {
        let Some((data, annotations)) = secret else {
            return LeafSecretState::Absent;
        };
        let text = |key: &str| text(data, key);
        let (certificate, extra_certificates) = read_leaf(data);
        let key = match (text(TLS_KEY), &certificate) {
            (None, _) => KeyState::Missing,
            (Some(pem), Ok(leaf)) => match verified.key_of(leaf, &pem) {
                Err(e) => KeyState::Unreadable(e),
                Ok(Some(algorithm)) => KeyState::Matches(algorithm),
                Ok(None) => KeyState::Mismatch,
            },
            (Some(pem), Err(_)) => match PrivateKey::from_pem(&pem) {
                Err(e) => KeyState::Unreadable(e.to_string()),
                Ok(_) => KeyState::Mismatch,
            },
        };
        let issuer = certificate.as_ref().ok().and_then(|leaf| {
            issuers
                .into_iter()
                .find(|ca| verified.is_issued_by(leaf, ca))
                .map(|ca| ca.fingerprint().to_string())
        });
        // Only which CAs it holds matters, not what they say.
        let ca_bundle = text(CA_CRT).and_then(|pem| caretaker_pki::bundle::fingerprints(&pem).ok());
        LeafSecretState::Present(LeafSecret {
            certificate,
            extra_certificates,
            key,
            issuer,
            ca_bundle,
            annotations: TlsAnnotations::read(annotations, serving),
        })
    }
}

/// The value of `key` in a Secret's `data` as text, unless missing or blank.
fn text(data: &BTreeMap<String, Vec<u8>>, key: &str) -> Option<String> {
    data.get(key)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .filter(|s| !s.trim().is_empty())
}

/// The leaf of a certificate Secret's `data`: the first certificate of `tls.crt`, or why there
/// is none to use, and how many certificates follow it.
pub fn read_leaf(data: &BTreeMap<String, Vec<u8>>) -> (Result<Certificate, String>, usize) {
    match text(data, TLS_CRT) {
        None => (Err("certificate missing".to_string()), 0),
        Some(pem) => match Certificate::parse_pem(&pem) {
            Err(e) => (Err(format!("certificate unreadable: {e}")), 0),
            Ok(mut all) => {
                let extra = all.len() - 1;
                let first = all.swap_remove(0);
                if first.info().is_ca {
                    (Err("tls.crt holds a CA certificate, not a leaf".into()), 0)
                } else {
                    (Ok(first), extra)
                }
            }
        },
    }
}

#[cfg(test)]
impl LeafSecretState {
    /// A certificate Secret once `step` is written over `before`, as observing it would find it
    /// (`a_written_certificate_reads_back_as_the_model_says` holds this to real certificates).
    pub(crate) fn after(&self, step: &CertificateStep) -> LeafSecretState {
        match step {
            CertificateStep::Issue(issued) => LeafSecretState::Present(LeafSecret {
                certificate: Ok(issued.leaf.certificate.clone()),
                extra_certificates: 0,
                key: KeyState::Matches(issued.leaf.algorithm),
                issuer: Some(issued.issuer.clone()),
                ca_bundle: Some(issued.ca_bundle.fingerprints()),
                annotations: issued.annotations.clone(),
            }),
            CertificateStep::UpdateCaBundle(bundle) => match self {
                LeafSecretState::Present(secret) => LeafSecretState::Present(LeafSecret {
                    ca_bundle: Some(bundle.fingerprints()),
                    ..secret.clone()
                }),
                LeafSecretState::Absent => LeafSecretState::Present(LeafSecret {
                    certificate: Err("certificate missing".into()),
                    extra_certificates: 0,
                    key: KeyState::Missing,
                    issuer: None,
                    ca_bundle: Some(bundle.fingerprints()),
                    annotations: Default::default(),
                }),
            },
        }
    }
}

/// Everything an IssuedCertificate's decision reads besides its issuer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafObserved {
    /// `spec.secretName` in the IssuedCertificate's namespace, for messages.
    pub secret_name: ObjectName,
    pub secret: LeafSecretState,
}

/// A freshly issued certificate as its Secret must hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedSecret {
    pub leaf: IssuedLeaf,
    /// The fingerprint of the CA that signed it.
    pub issuer: String,
    /// `ca.crt`.
    pub ca_bundle: Bundle,
    pub annotations: TlsAnnotations,
}

/// One write of an IssuedCertificate's plan (to its Secret, type `kubernetes.io/tls`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateStep {
    /// `tls.crt`, `tls.key`, `ca.crt` and library-go's annotations: a new certificate.
    Issue(IssuedSecret),
    /// `ca.crt` alone; certificate and key stay.
    UpdateCaBundle(Bundle),
}

impl CertificateStep {
    /// The Secret `data` to write (a merge patch).
    pub fn data(&self) -> SecretData {
        let mut data = SecretData::default();
        match self {
            CertificateStep::Issue(issued) => data
                .set(TLS_CRT, issued.leaf.certificate.pem())
                .set(TLS_KEY, issued.leaf.key.expose())
                .set(CA_CRT, issued.ca_bundle.text()),
            CertificateStep::UpdateCaBundle(bundle) => data.set(CA_CRT, bundle.text()),
        };
        data
    }

    /// The annotations to write.
    pub fn annotation_changes(&self) -> AnnotationChanges {
        match self {
            CertificateStep::Issue(issued) => issued.annotations.changes(),
            CertificateStep::UpdateCaBundle(_) => AnnotationChanges::default(),
        }
    }
}

impl CertificateStatus {
    /// Ready with `certificate` in place, due again at `due_at`.
    fn issued(certificate: &Certificate, due_at: OffsetDateTime) -> Self {
        Self {
            ready: Condition::new(
                true,
                names::REASON_ISSUED,
                format!(
                    "certificate serial {} valid until {}",
                    certificate.serial(),
                    format_time(certificate.not_after())
                ),
            ),
            degraded: Condition::as_expected(),
            serial: Some(certificate.serial().to_string()),
            not_before: Some(certificate.not_before()),
            not_after: Some(certificate.not_after()),
            next_rotation: Some(due_at),
        }
    }
}

/// A pass over an IssuedCertificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafPlan {
    /// At most one write.
    pub steps: Vec<CertificateStep>,
    pub events: Vec<Event>,
    pub status: CertificateStatus,
    /// When the certificate falls due (or, when issuing again would not help before its
    /// issuer rotates, when it expires), or a CA of its bundle expires, whichever is first;
    /// `None`: only a change matters.
    pub wake_at: Option<OffsetDateTime>,
}

impl LeafPlan {
    pub fn writes_nothing(&self) -> bool {
        self.steps.is_empty()
    }
}

/// Decides a pass over an IssuedCertificate at `now`. `mint` is asked for a certificate only
/// when one must be issued and `issuer` can sign.
pub fn plan(
    seen: &LeafObserved,
    policy: &CertificatePolicy,
    issuer: &IssuerView,
    now: OffsetDateTime,
    mint: &dyn Mint,
) -> Result<LeafPlan, PkiError> {
    let reasons = reissue_reasons(&seen.secret, policy, issuer, now);
    let mut plan = match &issuer.signer {
        Ok(signer) if !reasons.is_empty() => {
            issue(seen, policy, issuer, signer, &reasons, now, mint)?
        }
        _ => no_new_certificate(seen, policy, issuer, &reasons, now),
    };
    // `ca.crt` follows the bundle, which loses a CA the moment it expires.
    let bundle_changes = issuer
        .bundle
        .iter()
        .flat_map(|b| b.certificates())
        .map(|c| c.not_after() + time::Duration::SECOND);
    plan.wake_at = plan
        .wake_at
        .into_iter()
        .chain(bundle_changes)
        .filter(|t| *t > now)
        .min();
    Ok(plan)
}

/// No new certificate (none needed, or nothing can sign one): trust still follows the
/// issuer's bundle.
fn no_new_certificate(
    seen: &LeafObserved,
    policy: &CertificatePolicy,
    issuer: &IssuerView,
    reasons: &[String],
    now: OffsetDateTime,
) -> LeafPlan {
    let present = match &seen.secret {
        LeafSecretState::Present(secret) => Some(secret),
        LeafSecretState::Absent => None,
    };
    let mut steps = Vec::new();
    let mut events = Vec::new();
    if let (Some(secret), Some(bundle)) = (present, &issuer.bundle)
        && secret.ca_bundle.as_ref() != Some(&bundle.fingerprints())
    {
        events.push(Event::normal(
            names::EVENT_CA_BUNDLE_UPDATE_REQUIRED,
            format!(
                "{} requires a new {CA_CRT}: {}",
                seen.secret_name.quoted(),
                ca_bundle_change(secret.ca_bundle.as_deref(), bundle)
            ),
        ));
        steps.push(CertificateStep::UpdateCaBundle(bundle.clone()));
    }
    if let Err(no_signer) = &issuer.signer
        && !reasons.is_empty()
    {
        return LeafPlan {
            steps,
            events,
            ..waiting(present, policy, issuer, no_signer, reasons, now)
        };
    }
    let secret = present.expect("a certificate needs no new one only if its Secret exists");
    let certificate = secret
        .certificate
        .as_ref()
        .expect("a certificate needs no new one only if it reads");
    let due_at = due(&policy.rotation, &policy.leaf.validity, certificate);
    let wake_at = if due_at > now {
        due_at
    } else {
        // Due, but a new certificate from the same CA would expire no later: the CA's
        // rotation (a change) or the certificate's expiry is what comes next.
        certificate.not_after() + time::Duration::SECOND
    };
    LeafPlan {
        steps,
        events,
        status: CertificateStatus::issued(certificate, due_at),
        wake_at: Some(wake_at),
    }
}

fn issue(
    seen: &LeafObserved,
    policy: &CertificatePolicy,
    issuer: &IssuerView,
    signer: &CaKeyPair,
    reasons: &[String],
    now: OffsetDateTime,
    mint: &dyn Mint,
) -> Result<LeafPlan, PkiError> {
    let leaf = mint.issue(signer, &policy.leaf)?;
    let ca_bundle = issuer
        .bundle
        .clone()
        .filter(|b| b.contains(signer.fingerprint()))
        .unwrap_or_else(|| Bundle::of([signer.certificate.clone()], now));
    let annotations = TlsAnnotations::describing(
        &leaf.certificate,
        signer.certificate.common_name(),
        serving(policy.leaf.usage),
    );
    let certificate = leaf.certificate.clone();
    let due_at = due(&policy.rotation, &policy.leaf.validity, &certificate);
    let event = Event::normal(
        names::EVENT_TARGET_UPDATE_REQUIRED,
        format!(
            "{} requires a new target cert/key pair: {}",
            seen.secret_name.quoted(),
            reasons.join("; ")
        ),
    );
    Ok(LeafPlan {
        steps: vec![CertificateStep::Issue(IssuedSecret {
            leaf,
            issuer: signer.fingerprint().to_string(),
            ca_bundle,
            annotations,
        })],
        events: vec![event],
        status: CertificateStatus::issued(&certificate, due_at),
        wake_at: Some(due_at),
    })
}

/// A new certificate is needed and nothing can sign it now: nothing is written; a
/// certificate still usable is still Ready.
fn waiting(
    secret: Option<&LeafSecret>,
    policy: &CertificatePolicy,
    issuer: &IssuerView,
    no_signer: &NoSigner,
    reasons: &[String],
    now: OffsetDateTime,
) -> LeafPlan {
    let usable = secret.and_then(|s| {
        let certificate = s.certificate.as_ref().ok()?;
        let trusted = s
            .issuer
            .as_ref()
            .is_some_and(|fp| issuer.bundle.as_ref().is_none_or(|b| b.contains(fp)));
        (certificate.info().is_valid_at(now) && matches!(s.key, KeyState::Matches(_)) && trusted)
            .then_some(certificate)
    });
    let message = format!(
        "needs a new certificate ({}), but nothing signs: {}",
        reasons.join("; "),
        no_signer.message
    );
    let ready = match usable {
        Some(c) => Condition::new(
            true,
            names::REASON_ISSUED,
            format!(
                "certificate serial {} valid until {}; it {message}",
                c.serial(),
                format_time(c.not_after())
            ),
        ),
        None => Condition::new(false, names::REASON_WAITING_FOR_ISSUER, message.clone()),
    };
    let degraded = match no_signer.degraded {
        true => Condition::new(true, names::REASON_ISSUER_DEGRADED, message),
        false => Condition::as_expected(),
    };
    let certificate = secret.and_then(|s| s.certificate.as_ref().ok());
    LeafPlan {
        steps: Vec::new(),
        events: Vec::new(),
        status: CertificateStatus {
            ready,
            degraded,
            serial: certificate.map(|c| c.serial().to_string()),
            not_before: certificate.map(Certificate::not_before),
            not_after: certificate.map(Certificate::not_after),
            next_rotation: certificate.map(|c| due(&policy.rotation, &policy.leaf.validity, c)),
        },
        wake_at: None,
    }
}

/// Why the Secret needs a new certificate and key (empty: it does not).
fn reissue_reasons(
    secret: &LeafSecretState,
    policy: &CertificatePolicy,
    issuer: &IssuerView,
    now: OffsetDateTime,
) -> Vec<String> {
    let secret = match secret {
        LeafSecretState::Absent => return vec!["secret doesn't exist".into()],
        LeafSecretState::Present(secret) => secret,
    };
    let certificate = match &secret.certificate {
        Err(why) => return vec![why.clone()],
        Ok(certificate) => certificate,
    };
    let spec = &policy.leaf;
    let signer = issuer.signer.as_ref().ok();
    let mut reasons = Vec::new();
    if secret.extra_certificates > 0 {
        reasons.push(format!(
            "{TLS_CRT} holds {} certificates after the leaf",
            secret.extra_certificates
        ));
    }
    match &secret.key {
        KeyState::Missing => reasons.push("key missing".into()),
        KeyState::Unreadable(e) => reasons.push(format!("key unreadable: {e}")),
        KeyState::Mismatch => reasons.push("key not matching the certificate".into()),
        KeyState::Matches(algorithm) if *algorithm != spec.algorithm => reasons.push(format!(
            "key algorithm changed: {algorithm} -> {}",
            spec.algorithm
        )),
        KeyState::Matches(_) => {}
    }
    if certificate.expired_at(now) {
        reasons.push(expiring(
            &policy.rotation,
            &policy.leaf.validity,
            certificate,
            now,
        ));
    } else if now >= due(&policy.rotation, &policy.leaf.validity, certificate) {
        // Issuing again helps only if the new certificate would last longer: a certificate
        // cut at its CA's notAfter waits for the CA's successor.
        let helps = signer.is_none_or(|s| {
            secret.issuer.as_deref() != Some(s.fingerprint())
                || s.certificate.not_after() > certificate.not_after()
        });
        if helps {
            reasons.push(expiring(
                &policy.rotation,
                &policy.leaf.validity,
                certificate,
                now,
            ));
        }
    }
    let issuer_ca = secret.issuer.as_deref().and_then(|fp| {
        signer
            .filter(|s| s.fingerprint() == fp)
            .map(|s| &s.certificate)
            .or_else(|| issuer.bundle.as_ref().and_then(|b| b.get(fp)))
    });
    match (&secret.issuer, signer) {
        (None, _) => reasons.push("issuer changed: not signed by any CA its issuer trusts".into()),
        (Some(fp), Some(s)) if fp != s.fingerprint() => reasons.push(format!(
            "issuer changed: signed by CA serial {}, the CA that signs now is serial {}",
            issuer_ca.map_or(fp.as_str(), Certificate::serial),
            s.certificate.serial()
        )),
        _ => {}
    }
    if certificate.common_name() != spec.common_name {
        reasons.push(format!(
            "common name changed: {:?} -> {:?}",
            certificate.common_name(),
            spec.common_name
        ));
    }
    let set = |v: &[String]| v.iter().cloned().collect::<BTreeSet<_>>();
    if set(&certificate.info().organizations) != set(&spec.organizations) {
        reasons.push(format!(
            "organizations changed: {:?} -> {:?}",
            certificate.info().organizations,
            spec.organizations
        ));
    }
    let (existing, required) = (
        set(&hostnames(certificate.info())),
        set(&wanted_hostnames(spec)),
    );
    if existing != required {
        let join = |s: BTreeSet<&String>| {
            s.into_iter()
                .map(String::as_str)
                .collect::<Vec<_>>()
                .join(",")
        };
        reasons.push(format!(
            "hostnames changed: {:?} are existing and not required, {:?} are required and not existing",
            join(existing.difference(&required).collect()),
            join(required.difference(&existing).collect()),
        ));
    }
    let usage = usage_of(certificate);
    if usage != Some(spec.usage) {
        reasons.push(format!(
            "usages changed: {} -> {}",
            usage.map_or("none".to_string(), |u| u.to_string()),
            spec.usage
        ));
    }
    if let Some(problem) = secret.annotations.validity_problem(certificate) {
        reasons.push(problem);
    }
    match (&secret.annotations.issuer, issuer_ca) {
        (None, _) => reasons.push("missing issuer name".into()),
        (Some(found), Some(ca)) if found != ca.common_name() => reasons.push(format!(
            "issuer annotation {found:?} does not name the issuer {:?}",
            ca.common_name()
        )),
        _ => {}
    }
    if serving(spec.usage) {
        let actual = hostnames(certificate.info()).join(",");
        match &secret.annotations.hostnames {
            None => reasons.push("missing hostnames".into()),
            Some(found) if *found != actual => reasons.push(format!(
                "hostnames annotation {found:?} does not say the certificate's hostnames {actual:?}"
            )),
            Some(_) => {}
        }
    }
    reasons
}

/// What a certificate's extended key usages allow.
fn usage_of(certificate: &Certificate) -> Option<Usage> {
    let ekus = &certificate.info().extended_key_usages;
    let has = |name: &str| ekus.iter().any(|e| e == name);
    match (has("serverAuth"), has("clientAuth")) {
        (true, true) => Some(Usage::Both),
        (true, false) => Some(Usage::Server),
        (false, true) => Some(Usage::Client),
        (false, false) => None,
    }
}

fn ca_bundle_change(found: Option<&[String]>, wanted: &Bundle) -> String {
    let Some(found) = found else {
        return format!("{CA_CRT} is missing or unreadable");
    };
    let mut parts: Vec<String> = wanted
        .certificates()
        .iter()
        .filter(|c| !found.iter().any(|fp| fp == c.fingerprint()))
        .map(|c| format!("CA serial {} added", c.serial()))
        .collect();
    let removed = found.iter().filter(|fp| !wanted.contains(fp)).count();
    if removed > 0 {
        parts.push(format!("{removed} CAs no longer trusted removed"));
    }
    if parts.is_empty() {
        parts.push("not in the bundle's order".into());
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests;
