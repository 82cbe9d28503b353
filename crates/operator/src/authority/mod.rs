//! Self-managed certificate authorities (`CertificateAuthority`, `IssuedCertificate`): when a CA
//! rotates, what its trust bundle holds, when a certificate it signed is issued again. Decisions
//! from observed state and the clock, no Kubernetes; the glue in
//! `controller::certificate_authority` and `controller::issued_certificate` observes and
//! applies them.
//!
//! Trust before sign: a new CA is first published in the bundle (beside every older CA that has
//! not expired) and in every injection point; only once `trust_propagation` has passed since
//! does it sign anything. Until then the CA it replaces keeps signing.
//!
//! # Layers
//!
//! - *Observation* turns a Secret's `data` and annotations, or a ConfigMap's, into facts:
//!   [`ca::CaSecretState::observe`], [`bundle::BundleState::observe`],
//!   [`leaf::LeafSecretState::observe`]. Only this layer parses certificates and keys.
//! - *Decisions* go from facts and `now` to a plan: [`ca::plan`] → [`ca::CaPlan`],
//!   [`leaf::plan`] → [`leaf::LeafPlan`]. The one thing they draw from outside is fresh key
//!   material, from a [`Mint`] ([`PkiMint`] in the operator, a model in the tests), and only
//!   when they decide to make a CA or a certificate.
//! - *Writes*: a plan's steps are complete object contents, in the order they must be
//!   written; the glue writes them one after the other and stops at the first failure (the
//!   next pass starts again from what is stored). Each step renders itself as Secret `data`
//!   ([`SecretData`]) or ConfigMap `data`, plus [`AnnotationChanges`]; both are merge
//!   patches: keys not named are left alone. The CA Secret is always written before the
//!   bundle ConfigMap (a CA is stored before anything publishes it), and the moment a next CA
//!   is trusted is written only in a Secret write that follows the ConfigMap write holding
//!   it; so a pass cut short anywhere leaves nothing that claims more than is true.
//!
//! A plan brings the objects to the state the observations and `now` call for in one pass:
//! deciding again on what its writes produce writes nothing. What is left is only what waits
//! for time ([`ca::CaPlan::wake_at`], [`leaf::LeafPlan::wake_at`]: exact moments, nothing
//! periodic) or for someone else (the injection points taking up a new bundle, a person fixing
//! a Secret).
//!
//! # For the glue
//!
//! ```text
//! // A CertificateAuthority (woken by its objects, its injection points, its certificates'
//! // Secrets, and at plan.wake_at):
//! seen = AuthorityObserved {
//!     secret: CaSecretState::observe(ca secret's (data, annotations)),
//!     bundle: BundleState::observe(bundle configmap's (data, annotations)),
//!     injected: fingerprints every injection point naming the CA holds (None if none does),
//!     in_use / certificates_missing / distributed: from the leaf (leaf::read_leaf) and ca.crt
//!         of every IssuedCertificate naming it whose Secret is caretaker's, and the first of
//!         ca::in_use_candidates(&seen, now)'s bundle and signer that signed it,
//!     last_good: the last CaSecretState::Valid current this process saw,
//!     reported_degraded: the Degraded condition's message in its status, ..
//! }
//! plan = ca::plan(&seen, &policy, now, &PkiMint)?
//! for step in plan.steps: write it (WriteSecret: type kubernetes.io/tls, data(),
//!     annotation_changes(); WriteBundle: data(), annotation_changes()); stop at a failure
//! publish plan.events on the CertificateAuthority; write plan.status; requeue at plan.wake_at
//!
//! // An IssuedCertificate (woken by its Secret, its CA's objects, and at plan.wake_at):
//! issuer = IssuerView::for_certificates(&its CA's AuthorityObserved, trust_propagation, now)
//! seen = LeafObserved { secret: LeafSecretState::observe(.., serving, candidates), .. }
//! plan = leaf::plan(&seen, &policy, &issuer, now, &PkiMint)?
//! at most one step: write data() and annotation_changes(); events, status, wake_at as above
//! ```
//!
//! # Storage
//!
//! Every fact needed after a restart is in the objects; nothing lives only in memory or in a
//! status.
//!
//! **CA Secret** (`spec.secret`, type `kubernetes.io/tls`):
//! - `tls.crt`, `tls.key`: the CA that signs now. Both empty only while a re-created CA (see
//!   below) waits to be trusted: then nothing signs.
//! - `next.crt`, `next.key`: the CA a rotation introduces, stored here before anything
//!   publishes it, so a restart mid-rotation finds it and never makes a second one. Present
//!   only during a rotation.
//! - `previous.crt`: the certificates (never keys) of older CAs still trusted, in bundle order.
//!   Absent when there are none.
//! - annotation `caretaker.dev/next-trusted-at` ([`names::authority_state::NEXT_TRUSTED_AT`]):
//!   when the next CA was first seen in the bundle ConfigMap, in every injection point and
//!   in the `ca.crt` of every Ready certificate's Secret (RFC 3339, rounded up to the second). Once `trust_propagation` has passed since, the next
//!   CA is promoted: it becomes `tls.crt`/`tls.key`, the CA it replaces moves to
//!   `previous.crt`, and `next.*` and this annotation go.
//! - annotation `caretaker.dev/unused-since` ([`names::authority_state::UNUSED_SINCE`]): for
//!   each older CA that no managed certificate is signed by any more, since when
//!   (`<SHA-256 fingerprint>=<RFC 3339>`, comma separated). It leaves the bundle once
//!   `trust_propagation` has passed since (time for workloads to take up their new
//!   certificates), or when it expires, whichever comes first; a certificate signed by it seen
//!   again clears its entry. While some managed certificate is missing altogether (its
//!   Secret deleted, say), what its workload still serves is unknown, and no CA starts
//!   counting.
//! - library-go's annotations (below) describe `tls.crt`. Removing `certificate-not-after` or
//!   `certificate-not-before`, or editing either so that it no longer says what the
//!   certificate says, starts a rotation at once (library-go's forced rotation); the new CA
//!   still waits to be trusted before it signs.
//!
//! **Bundle ConfigMap** (`spec.bundle`): `ca-bundle.crt` holds the CA that signs now, the next
//! CA and every older CA of `previous.crt`, de-duplicated, expired ones dropped, in
//! `caretaker_pki::TrustBundle`'s order, so the same set always renders the same bytes. It is
//! written from the CA Secret and read back to find out whether it already says that, and
//! which CAs it trusts that the CA Secret does not hold (all of them when the CA Secret is
//! gone): certificates they signed may still be served, so such a CA (a CA certificate, not
//! expired; from a ConfigMap in another namespace than the CA Secret, perhaps one a tenant may
//! write, only one the glue knew this CA's Secret to hold: [`ca::AuthorityObserved::remembered`])
//! is taken into
//! `previous.crt` and leaves as any older CA does. Its library-go
//! annotations describe the CA that signs now.
//!
//! **Certificate Secret** (`IssuedCertificate`'s `secretName`, type `kubernetes.io/tls`):
//! `tls.crt` (the leaf alone), `tls.key`, `ca.crt` (the issuer's bundle, as above), and
//! library-go's annotations, `certificate-hostnames` only on serving certificates.
//!
//! library-go's annotations ([`names::CERTIFICATE_NOT_BEFORE`], [`names::CERTIFICATE_NOT_AFTER`],
//! [`names::CERTIFICATE_ISSUER`], [`names::CERTIFICATE_HOSTNAMES`]) have library-go's formats:
//! times in RFC 3339 (UTC, whole seconds), the issuer as the signing CA's common name, and
//! hostnames as the sorted, de-duplicated DNS names and IP addresses joined with `,`.
//!
//! # A CA Secret that is not what caretaker wrote
//!
//! - **Not this CertificateAuthority's** (an existing Secret or ConfigMap without its
//!   [`names::OWNER`] mark: someone's data, or another object's, see [`crate::ownership`]):
//!   the glue writes nothing to it, signs nothing from it, and says so (`ObjectNotManaged`,
//!   or `ObjectInUse` naming the owner).
//! - **Unreadable or tampered with** (a certificate or key that does not parse, a key that
//!   does not belong to its certificate, a certificate that is not a CA, half a key pair):
//!   nothing is regenerated and nothing is written. The CA keeps being what the glue last saw
//!   valid ([`ca::AuthorityObserved::last_good`]; after a restart there is none, and nothing
//!   signs), `Degraded` says why, and a Warning event says it once.
//! - **Absent** (deleted on purpose, or never made): a new CA is made, with an event. The CAs
//!   the bundle ConfigMap still holds (CA certificates not expired, nothing else; from a ConfigMap in another namespace, only those known as this CA's) stay trusted (they are copied into `previous.crt`). If
//!   there are any, the new CA enters as the *next* CA and follows trust before sign: nothing
//!   signs until it is promoted (the old key is gone with the Secret, and a certificate from an
//!   untrusted CA would break every client; certificates already issued keep working, since
//!   their CAs stay in the bundle). If there are none, nothing trusts anything yet and there
//!   is nothing to break: the new CA signs at once (first start).

pub mod bundle;
pub mod ca;
pub mod controller;
pub(crate) mod index;
pub mod leaf;
pub(crate) mod memory;
#[cfg(test)]
mod model;
pub mod policy;
pub(crate) mod secret_cache;
#[cfg(test)]
mod timeline;
pub mod verified;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use caretaker_pki::bundle::BundleCertificate;
use caretaker_pki::{
    CaSpec, CertificateAuthority, CertificateInfo, KeyAlgorithm, LeafSpec, PkiError,
    RotationPolicy, Ttl, Usage,
};
use time::OffsetDateTime;

use crate::changes::AnnotationChanges;
use crate::timestamp::{format_time, parse_time};
use caretaker_api::names;
use caretaker_api::names::{CA_BUNDLE_CRT, CA_CRT, TLS_CRT, TLS_KEY};

/// What a `CertificateAuthority` asks for, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthorityPolicy {
    /// Subject, validity and key algorithm of each CA generated.
    pub ca: CaSpec,
    /// When a CA is due to be replaced.
    pub rotation: RotationPolicy,
    /// How long a new CA is trusted everywhere before it signs.
    pub trust_propagation: Duration,
}

/// What an `IssuedCertificate` asks for, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct CertificatePolicy {
    /// Subject, names, usage, validity and key algorithm of each certificate issued.
    pub leaf: LeafSpec,
    /// When a certificate is due to be issued again.
    pub rotation: RotationPolicy,
}

/// A Secret or ConfigMap, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectName {
    pub namespace: String,
    pub name: String,
}

impl ObjectName {
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// As library-go's event messages name an object: `"name" in "namespace"`.
    fn quoted(&self) -> String {
        format!("{:?} in {:?}", self.name, self.namespace)
    }
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A Secret as the glue reads it: its `data` and its annotations.
pub type SecretContent<'a> = (&'a BTreeMap<String, Vec<u8>>, &'a BTreeMap<String, String>);
/// A ConfigMap as the glue reads it: its `data` and its annotations.
pub type ConfigMapContent<'a> = (&'a BTreeMap<String, String>, &'a BTreeMap<String, String>);

/// One X.509 certificate, without any key: a CA in a bundle, or a leaf. Shared, so copies
/// (one per certificate Secret's `ca.crt`, say) cost a pointer.
#[derive(Clone, PartialEq, Eq)]
pub struct Certificate(Arc<Parsed>);

#[derive(PartialEq, Eq)]
struct Parsed {
    pem: String,
    der: Vec<u8>,
    info: CertificateInfo,
}

impl Certificate {
    /// Reads one DER certificate; its PEM is rendered canonically, so equal certificates
    /// always render equal bytes.
    pub fn from_der(der: Vec<u8>) -> Result<Self, PkiError> {
        Ok(Self::from_bundle_certificate(&BundleCertificate::from_der(
            der,
        )?))
    }

    fn from_bundle_certificate(certificate: &BundleCertificate) -> Self {
        Self(Arc::new(Parsed {
            pem: certificate.to_pem(),
            der: certificate.der().to_vec(),
            info: certificate.info().clone(),
        }))
    }

    /// Every certificate of a PEM text, strictly (a key or anything else in it is an error
    /// that never echoes it).
    pub fn parse_pem(text: &str) -> Result<Vec<Self>, PkiError> {
        Ok(caretaker_pki::bundle::parse(text)?
            .iter()
            .map(Self::from_bundle_certificate)
            .collect())
    }

    pub fn pem(&self) -> &str {
        &self.0.pem
    }

    pub fn der(&self) -> &[u8] {
        &self.0.der
    }

    pub fn info(&self) -> &CertificateInfo {
        &self.0.info
    }

    /// The SHA-256 fingerprint of the DER, as `caretaker_pki` prints it: what identifies a
    /// certificate everywhere here.
    pub fn fingerprint(&self) -> &str {
        &self.0.info.sha256_fingerprint
    }

    pub fn serial(&self) -> &str {
        &self.0.info.serial
    }

    pub fn not_before(&self) -> OffsetDateTime {
        self.0.info.not_before
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.0.info.not_after
    }

    /// The subject's common name (empty when it has none).
    pub fn common_name(&self) -> &str {
        self.0.info.common_name.as_deref().unwrap_or_default()
    }

    /// Expired at `now`: past its notAfter (as `caretaker_pki::TrustBundle` prunes).
    pub fn expired_at(&self, now: OffsetDateTime) -> bool {
        self.0.info.not_after < now
    }

    /// Certificate-only parts, for tests that model certificates without signing any.
    #[cfg(test)]
    pub(crate) fn from_parts(pem: String, der: Vec<u8>, info: CertificateInfo) -> Self {
        Self(Arc::new(Parsed { pem, der, info }))
    }
}

impl fmt::Debug for Certificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Certificate")
            .field("subject", &self.0.info.subject)
            .field("serial", &self.0.info.serial)
            .field("not_after", &self.0.info.not_after)
            .finish_non_exhaustive()
    }
}

/// A private key in PEM. It never prints: `Debug` shows only that it is there, and there is
/// no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyPem(String);

impl KeyPem {
    pub fn new(pem: String) -> Self {
        Self(pem)
    }

    /// The PEM, for writing to a Secret or loading a signer.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for KeyPem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyPem(<redacted>)")
    }
}

/// A CA: its certificate, its key and the key's algorithm.
#[derive(Debug, Clone)]
pub struct CaKeyPair {
    pub certificate: Certificate,
    pub key: KeyPem,
    pub algorithm: KeyAlgorithm,
    /// The CA read from the fields, once, and shared by every copy: a CA that issues
    /// thousands of certificates would otherwise read and check its key for each. (So a
    /// pair's fields are never changed once it exists: a different CA is a new pair.)
    signer: Arc<OnceLock<CertificateAuthority>>,
}

impl PartialEq for CaKeyPair {
    fn eq(&self, other: &Self) -> bool {
        (&self.certificate, &self.key, self.algorithm)
            == (&other.certificate, &other.key, other.algorithm)
    }
}

impl Eq for CaKeyPair {}

impl CaKeyPair {
    /// A CA from its parts, read into a signer when it first signs.
    pub fn new(certificate: Certificate, key: KeyPem, algorithm: KeyAlgorithm) -> Self {
        Self {
            certificate,
            key,
            algorithm,
            signer: Arc::default(),
        }
    }

    /// Whether it can still sign at `now`: before its notAfter, as pki's issuance requires
    /// (a certificate cut at the CA's expiry would have no lifetime left). At notAfter itself
    /// it is still trusted ([`Certificate::expired_at`]) but signs nothing.
    pub fn signs_at(&self, now: OffsetDateTime) -> bool {
        now < self.certificate.not_after()
    }

    /// Reads a CA from PEM, checking that the certificate is a CA and the key is its own.
    pub fn from_pem(certificate_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        Self::from_authority(CertificateAuthority::from_pem(certificate_pem, key_pem)?)
    }

    pub fn from_authority(authority: CertificateAuthority) -> Result<Self, PkiError> {
        let pair = Self::new(
            Certificate::from_der(authority.certificate_der().to_vec())?,
            KeyPem(authority.private_key_pem()),
            authority.algorithm(),
        );
        let _ = pair.signer.set(authority);
        Ok(pair)
    }

    /// The CA, ready to sign.
    pub fn authority(&self) -> Result<&CertificateAuthority, PkiError> {
        if let Some(signer) = self.signer.get() {
            return Ok(signer);
        }
        let read = CertificateAuthority::from_pem(self.certificate.pem(), self.key.expose())?;
        Ok(self.signer.get_or_init(|| read))
    }

    pub fn fingerprint(&self) -> &str {
        self.certificate.fingerprint()
    }
}

/// A certificate freshly issued, with its new key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedLeaf {
    pub certificate: Certificate,
    pub key: KeyPem,
    pub algorithm: KeyAlgorithm,
}

/// Where fresh key material comes from: the one input of a decision that is not observed.
pub trait Mint {
    /// A new self-signed CA as `spec` says.
    fn create_ca(&self, spec: &CaSpec) -> Result<CaKeyPair, PkiError>;
    /// A new certificate and key as `spec` says, signed by `signer`.
    fn issue(&self, signer: &CaKeyPair, spec: &LeafSpec) -> Result<IssuedLeaf, PkiError>;
}

/// The operator's [`Mint`]: `caretaker_pki`, at the real time.
#[derive(Debug, Clone, Copy, Default)]
pub struct PkiMint;

impl Mint for PkiMint {
    fn create_ca(&self, spec: &CaSpec) -> Result<CaKeyPair, PkiError> {
        CaKeyPair::from_authority(CertificateAuthority::create(spec)?)
    }

    fn issue(&self, signer: &CaKeyPair, spec: &LeafSpec) -> Result<IssuedLeaf, PkiError> {
        let issued = signer.authority()?.issue(spec)?;
        let key = issued.key.as_ref().expect("issue makes a key");
        Ok(IssuedLeaf {
            certificate: Certificate::from_der(issued.certificate_der.clone())?,
            key: KeyPem(key.to_pem()),
            algorithm: key.algorithm(),
        })
    }
}

/// library-go's annotations, as found on an object or as they must be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsAnnotations {
    pub not_before: Option<String>,
    pub not_after: Option<String>,
    pub issuer: Option<String>,
    /// Serving certificates only.
    pub hostnames: Option<String>,
}

impl TlsAnnotations {
    /// The values found in `annotations`; `hostnames` only when `serving`. A blank validity
    /// annotation reads as missing (`missing notAfter`, library-go's forced rotation), not as
    /// a malformed time. (A blank hostnames annotation is what a certificate without names
    /// carries; a blank issuer names no issuer: both stay as found.)
    pub fn read(annotations: &BTreeMap<String, String>, serving: bool) -> Self {
        let get = |key: &str| annotations.get(key).cloned();
        let moment = |key: &str| get(key).filter(|v| !v.trim().is_empty());
        Self {
            not_before: moment(names::CERTIFICATE_NOT_BEFORE),
            not_after: moment(names::CERTIFICATE_NOT_AFTER),
            issuer: get(names::CERTIFICATE_ISSUER),
            hostnames: if serving {
                get(names::CERTIFICATE_HOSTNAMES)
            } else {
                None
            },
        }
    }

    /// What they must say of `certificate`, signed by a CA named `issuer`.
    pub fn describing(certificate: &Certificate, issuer: &str, serving: bool) -> Self {
        Self {
            not_before: Some(format_time(certificate.not_before())),
            not_after: Some(format_time(certificate.not_after())),
            issuer: Some(issuer.to_string()),
            hostnames: serving.then(|| hostnames(certificate.info()).join(",")),
        }
    }

    /// The changes that make an object's annotations say this: set what is here, remove
    /// what is not.
    pub fn changes(&self) -> AnnotationChanges {
        let mut changes = AnnotationChanges::default();
        for (key, value) in [
            (names::CERTIFICATE_NOT_BEFORE, &self.not_before),
            (names::CERTIFICATE_NOT_AFTER, &self.not_after),
            (names::CERTIFICATE_ISSUER, &self.issuer),
            (names::CERTIFICATE_HOSTNAMES, &self.hostnames),
        ] {
            match value {
                Some(value) => changes.set(key, value.clone()),
                None => changes.remove(key),
            };
        }
        changes
    }

    /// Why the validity annotations force a new certificate, in library-go's words where it
    /// has them: missing, malformed, or not what `certificate` says.
    fn validity_problem(&self, certificate: &Certificate) -> Option<String> {
        for (name, found, actual) in [
            ("notAfter", &self.not_after, certificate.not_after()),
            ("notBefore", &self.not_before, certificate.not_before()),
        ] {
            let Some(found) = found else {
                return Some(format!("missing {name}"));
            };
            match parse_time(Some(found)) {
                None => return Some(format!("bad expiry: {found:?}")),
                // Certificates hold whole seconds, and so do the annotations.
                Some(t) if format_time(t) != format_time(actual) => {
                    return Some(format!(
                        "{name} annotation {found:?} does not say what the certificate says ({})",
                        format_time(actual)
                    ));
                }
                Some(_) => {}
            }
        }
        None
    }
}

/// A certificate's DNS names and IP addresses, sorted and de-duplicated, as library-go writes
/// them (IPv4-mapped IPv6 addresses as IPv4, as Go prints them).
pub fn hostnames(info: &CertificateInfo) -> Vec<String> {
    hostname_list(&info.ip_addresses, &info.dns_names)
}

/// The hostnames a [`LeafSpec`] asks for, as [`hostnames`] writes them.
fn wanted_hostnames(spec: &LeafSpec) -> Vec<String> {
    hostname_list(&spec.ip_addresses, &spec.dns_names)
}

fn hostname_list(ip_addresses: &[IpAddr], dns_names: &[String]) -> Vec<String> {
    let names: BTreeSet<String> = ip_addresses
        .iter()
        .map(|ip| ip.to_canonical().to_string())
        .chain(dns_names.iter().cloned())
        .collect();
    names.into_iter().collect()
}

/// The issuer's common name, as library-go records it: a self-signed CA's own name, else the
/// common name of its issuer.
fn issuer_name(certificate: &Certificate) -> &str {
    let info = certificate.info();
    if info.issuer == info.subject {
        return certificate.common_name();
    }
    info.issuer_common_name.as_deref().unwrap_or_default()
}

/// Whether certificates of `usage` serve TLS (and so carry the hostnames annotation).
fn serving(usage: Usage) -> bool {
    matches!(usage, Usage::Server | Usage::Both)
}

/// Secret `data` to write: each key set to a value or removed, as one merge patch. `Debug`
/// shows the keys and sizes, never a value.
pub type SecretData = crate::changes::KeyChanges;

pub use crate::changes::Condition;

/// What the status of a certificate says once a plan's writes are in place: an
/// IssuedCertificate's, or the CA that signs now for a CertificateAuthority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateStatus {
    /// For an IssuedCertificate: the Secret holds a certificate valid now, with its key, from a
    /// CA its bundle trusts. For a CertificateAuthority: a CA signs now.
    pub ready: Condition,
    pub degraded: Condition,
    pub serial: Option<String>,
    pub not_before: Option<OffsetDateTime>,
    pub not_after: Option<OffsetDateTime>,
    /// When the certificate is due to be replaced (for a CertificateAuthority during a
    /// rotation: when the next CA will be promoted).
    pub next_rotation: Option<OffsetDateTime>,
}

/// The first moment at or after `t` that an annotation can hold (whole seconds): recorded
/// moments are rounded up, so waits counted from them are never shortened.
fn ceil_second(t: OffsetDateTime) -> OffsetDateTime {
    match t.nanosecond() {
        0 => t,
        _ => t.replace_nanosecond(0).unwrap_or(t) + time::Duration::SECOND,
    }
}

/// `t + d`, saturating at the end of time.
fn later(t: OffsetDateTime, d: Duration) -> OffsetDateTime {
    time::Duration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d))
        .unwrap_or(time::PrimitiveDateTime::MAX.assume_utc())
}

/// When a certificate asked to live `validity` falls due under `policy`. Its lifetime counts
/// from when it was issued: `validity` before its notAfter (when it was cut to its CA's
/// expiry, that is before its notBefore, and its notBefore counts), never from the notBefore
/// alone. pki starts every certificate 5 minutes in the past (clock skew); counted as
/// lifetime, that made a certificate with a short validity (`1m` at 80%, `4s` at 50%) due the
/// moment it was issued, and every pass issued another.
fn due(policy: &RotationPolicy, validity: &Ttl, certificate: &Certificate) -> OffsetDateTime {
    let (not_before, not_after) = (certificate.not_before(), certificate.not_after());
    let issued = time::Duration::try_from(validity.approximate())
        .ok()
        .and_then(|v| not_after.checked_sub(v))
        // Years and months step the calendar: correct the approximation by what it misses.
        .map(|t| match validity.expires_at(t) {
            Some(end) => t.checked_add(not_after - end).unwrap_or(t),
            None => t,
        })
        .map_or(not_before, |t| t.clamp(not_before, not_after));
    policy.due_at(issued, not_after)
}

/// Why a certificate at or past its due time must be replaced, in words that say "expiring".
fn expiring(
    policy: &RotationPolicy,
    validity: &Ttl,
    certificate: &Certificate,
    now: OffsetDateTime,
) -> String {
    if certificate.expired_at(now) {
        return format!(
            "already expired (notAfter {})",
            format_time(certificate.not_after())
        );
    }
    let at = format_time(due(policy, validity, certificate));
    match policy {
        RotationPolicy::Fraction(f) => {
            let percent = (f * 1000.0).round() / 10.0;
            format!("expiring: past its refresh time {at} ({percent}% of its validity)")
        }
        RotationPolicy::Before(before) => {
            let before = caretaker_pki::Ttl::from_duration(*before)
                .map(|t| t.to_string())
                .unwrap_or_else(|_| format!("{before:?}"));
            format!("expiring: past its refresh time {at} ({before} before notAfter)")
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use caretaker_api::names::{NEXT_CRT, NEXT_KEY, PREVIOUS_CRT};

    #[test]
    fn keys_never_print() {
        let key = KeyPem::new("-----BEGIN PRIVATE KEY-----\nsecret\n".into());
        assert_eq!(format!("{key:?}"), "KeyPem(<redacted>)");
        let mut data = SecretData::default();
        data.set(TLS_KEY, key.expose()).remove(NEXT_KEY);
        let shown = format!("{data:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert_eq!(shown, r#"{"next.key": <removed>, "tls.key": <35 bytes>}"#);
    }

    #[test]
    fn secret_data_applies_as_a_merge_patch() {
        let mut data = SecretData::default();
        data.set(TLS_CRT, "c").remove(NEXT_CRT);
        let mut stored = BTreeMap::from([
            (NEXT_CRT.to_string(), b"n".to_vec()),
            ("other".to_string(), b"o".to_vec()),
        ]);
        data.apply_to(&mut stored);
        assert_eq!(
            stored,
            BTreeMap::from([
                (TLS_CRT.to_string(), b"c".to_vec()),
                ("other".to_string(), b"o".to_vec()),
            ])
        );
        assert_eq!(data.get(NEXT_CRT), Some(None));
        assert_eq!(data.get(TLS_KEY), None);
    }
    #[test]
    fn recorded_moments_round_up_to_the_second() {
        use time::macros::datetime;
        assert_eq!(
            ceil_second(datetime!(2026-01-01 12:00:00.2 UTC)),
            datetime!(2026-01-01 12:00:01 UTC)
        );
        assert_eq!(
            ceil_second(datetime!(2026-01-01 12:00:00 UTC)),
            datetime!(2026-01-01 12:00:00 UTC)
        );
    }
    /// A Secret's `data` and annotations.
    type Secret = (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>);
    /// A ConfigMap's `data` and annotations.
    type ConfigMap = (BTreeMap<String, String>, BTreeMap<String, String>);

    /// Objects as the API server holds them.
    #[derive(Default)]
    struct Objects {
        ca: Option<Secret>,
        bundle: Option<ConfigMap>,
        leaf: Option<Secret>,
    }

    impl Objects {
        fn secret(o: &Option<Secret>) -> Option<SecretContent<'_>> {
            o.as_ref().map(|(d, a)| (d, a))
        }

        fn authority(&self, last_good: Option<CaKeyPair>) -> ca::AuthorityObserved {
            let mut seen = ca::AuthorityObserved {
                secret_name: ObjectName::new("caretaker-system", "webhooks-ca"),
                bundle_name: ObjectName::new("caretaker-system", "webhooks-ca-bundle"),
                secret: ca::CaSecretState::observe(Self::secret(&self.ca)),
                bundle: bundle::BundleState::observe(self.bundle.as_ref().map(|(d, a)| (d, a))),
                injected: None,
                in_use: BTreeSet::new(),
                certificates_missing: false,
                distributed: None,
                untrusting: Default::default(),
                last_good,
                remembered: None,
                reported_degraded: None,
            };
            match self.certificate(&ca::in_use_candidates(&seen, OffsetDateTime::now_utc())) {
                leaf::LeafSecretState::Present(s) if s.certificate.is_ok() => {
                    seen.in_use.extend(s.issuer)
                }
                _ => seen.certificates_missing = true,
            }
            seen
        }

        fn certificate(&self, issuer: &ca::IssuerView) -> leaf::LeafSecretState {
            let candidates = issuer
                .bundle
                .iter()
                .flat_map(|b| b.certificates())
                .chain(issuer.signer.as_ref().ok().map(|s| &s.certificate));
            let verified = verified::Verified::default();
            leaf::LeafSecretState::observe(Self::secret(&self.leaf), true, candidates, &verified)
        }

        /// One pass of both controllers, as the glue runs them; the events they publish.
        fn pass(
            &mut self,
            policy: &AuthorityPolicy,
            certificate: &CertificatePolicy,
        ) -> Vec<String> {
            let now = OffsetDateTime::now_utc();
            let seen = self.authority(None);
            let plan = ca::plan(&seen, policy, now, &PkiMint).unwrap();
            for step in &plan.steps {
                match step {
                    ca::AuthorityStep::WriteSecret(s) => {
                        let (data, annotations) = self.ca.get_or_insert_default();
                        s.data().apply_to(data);
                        s.annotation_changes().apply_to(annotations);
                    }
                    ca::AuthorityStep::WriteBundle(b) => {
                        let (data, annotations) = self.bundle.get_or_insert_default();
                        data.extend(b.data().into_iter().map(|(k, v)| (k.to_string(), v)));
                        b.annotation_changes().apply_to(annotations);
                    }
                }
            }
            let issuer = ca::IssuerView::for_certificates(
                &self.authority(None),
                policy.trust_propagation,
                now,
            );
            let seen = leaf::LeafObserved {
                secret_name: ObjectName::new("demo", "web-tls"),
                secret: self.certificate(&issuer),
            };
            let leaf_plan = leaf::plan(&seen, certificate, &issuer, now, &PkiMint).unwrap();
            for step in &leaf_plan.steps {
                let (data, annotations) = self.leaf.get_or_insert_default();
                step.data().apply_to(data);
                step.annotation_changes().apply_to(annotations);
            }
            plan.events
                .iter()
                .chain(&leaf_plan.events)
                .map(|e| e.reason.to_string())
                .collect()
        }

        fn bundle_text(&self) -> &str {
            &self.bundle.as_ref().unwrap().0[CA_BUNDLE_CRT]
        }
    }

    /// The whole way on real certificates, through Secret and ConfigMap data as the glue will
    /// read and write it: a first CA and certificate, a rotation forced by removing
    /// `certificate-not-after` (no propagation time, no injection point), the certificate
    /// issued again by the new CA, the old CA leaving the bundle, then nothing more to do.
    #[test]
    fn real_certificates_through_secret_data_from_first_start_to_a_forced_rotation() {
        let policy = AuthorityPolicy {
            ca: CaSpec::new("webhooks-ca"),
            rotation: RotationPolicy::fraction(0.8).unwrap(),
            trust_propagation: Duration::ZERO,
        };
        let certificate = CertificatePolicy {
            leaf: LeafSpec::new("web.demo.svc", Usage::Server).with_dns_names(["web.demo.svc"]),
            rotation: RotationPolicy::fraction(0.8).unwrap(),
        };
        let mut objects = Objects::default();
        assert_eq!(
            objects.pass(&policy, &certificate),
            [
                names::EVENT_SIGNER_UPDATE_REQUIRED,
                names::EVENT_CA_BUNDLE_UPDATE_REQUIRED,
                names::EVENT_TARGET_UPDATE_REQUIRED
            ]
        );
        let first = objects.bundle_text().to_string();
        let leaf_data = objects.leaf.as_ref().unwrap().0.clone();
        assert_eq!(leaf_data[CA_CRT], first.as_bytes());
        let old_leaf = leaf_data[TLS_CRT].clone();
        let annotations = &objects.leaf.as_ref().unwrap().1;
        assert_eq!(annotations[names::CERTIFICATE_ISSUER], "webhooks-ca");
        assert_eq!(annotations[names::CERTIFICATE_HOSTNAMES], "web.demo.svc");
        assert!(
            objects.pass(&policy, &certificate).is_empty(),
            "steady state"
        );

        objects
            .ca
            .as_mut()
            .unwrap()
            .1
            .remove(names::CERTIFICATE_NOT_AFTER);
        assert_eq!(
            objects.pass(&policy, &certificate),
            [
                names::EVENT_SIGNER_UPDATE_REQUIRED,
                names::EVENT_SIGNER_PROMOTED,
                names::EVENT_CA_BUNDLE_UPDATE_REQUIRED,
                names::EVENT_TARGET_UPDATE_REQUIRED
            ]
        );
        let both = Certificate::parse_pem(objects.bundle_text()).unwrap();
        assert_eq!(both.len(), 2, "old and new CA trusted");
        let leaf_data = objects.leaf.as_ref().unwrap().0.clone();
        assert_ne!(leaf_data[TLS_CRT], old_leaf);
        let new_leaf = Certificate::parse_pem(std::str::from_utf8(&leaf_data[TLS_CRT]).unwrap())
            .unwrap()
            .remove(0);
        let ca_data = &objects.ca.as_ref().unwrap().0;
        let signer = Certificate::parse_pem(std::str::from_utf8(&ca_data[TLS_CRT]).unwrap())
            .unwrap()
            .remove(0);
        assert!(caretaker_pki::is_issued_by(new_leaf.der(), signer.der()).unwrap());
        assert!(ca_data.contains_key(PREVIOUS_CRT));

        // The old CA signs nothing any more: it goes, and ca.crt follows.
        assert_eq!(
            objects.pass(&policy, &certificate),
            [
                names::EVENT_CA_BUNDLE_UPDATE_REQUIRED,
                names::EVENT_CA_BUNDLE_UPDATE_REQUIRED
            ]
        );
        assert_eq!(
            Certificate::parse_pem(objects.bundle_text()).unwrap(),
            [signer]
        );
        assert_eq!(
            objects.leaf.as_ref().unwrap().0[CA_CRT],
            objects.bundle_text().as_bytes()
        );
        assert!(!objects.ca.as_ref().unwrap().0.contains_key(PREVIOUS_CRT));
        assert!(
            objects.pass(&policy, &certificate).is_empty(),
            "steady state"
        );
    }
}
