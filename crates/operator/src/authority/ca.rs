//! A CertificateAuthority's rotation as one decision: [`plan`] reads the CA Secret, the bundle
//! ConfigMap, the injection points and which CAs still sign a managed certificate, and says
//! what to write, in order, so that trust is never broken:
//!
//! 1. a CA due for rotation (or whose library-go validity annotations were removed, or whose
//!    spec asks for another name or key algorithm) gets a successor, stored as the *next* CA
//!    in the CA Secret before anything publishes it;
//! 2. the bundle (the CA that signs now, the next CA, every older CA still trusted) is
//!    published in the ConfigMap; the moment the next CA is in it and in every injection
//!    point is recorded;
//! 3. once `trust_propagation` has passed since, the next CA is promoted: it signs from then
//!    on, and the CA it replaces stays trusted;
//! 4. an older CA leaves the bundle when it expires, or once no managed certificate has been
//!    signed by it for `trust_propagation`.
//!
//! A CA Secret that does not read as caretaker wrote it is never regenerated (see the
//! module documentation of [`crate::authority`]).

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use caretaker_pki::PkiError;
use time::OffsetDateTime;

use super::bundle::{Bundle, BundleConfigMap, BundleState};
use super::{
    AuthorityPolicy, CaKeyPair, Certificate, CertificateStatus, Condition, Mint, ObjectName,
    TlsAnnotations, ceil_second, due, expiring, issuer_name, later,
};
use crate::changes::Event;
use crate::timestamp::format_time;
use caretaker_api::names;

mod issuer;
mod secret;
use issuer::fallback;
pub use issuer::{IssuerView, NoSigner, in_use_candidates};
pub use secret::{CaSecret, CaSecretState};

/// Everything a CertificateAuthority's decision reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorityObserved {
    /// `spec.secret`, for messages.
    pub secret_name: ObjectName,
    /// `spec.bundle`, for messages.
    pub bundle_name: ObjectName,
    pub secret: CaSecretState,
    pub bundle: BundleState,
    /// The CAs (fingerprints) that every injection point naming this CA trusts now (the
    /// intersection over them); `None` when no injection point names it.
    pub injected: Option<BTreeSet<String>>,
    /// The CAs (fingerprints) that signed a certificate caretaker manages for this CA and
    /// that exists now, from every IssuedCertificate naming it (its Secret's
    /// [`super::leaf::LeafSecret::issuer`]). It must come from a complete view of them (a
    /// synced cache): a CA missing here is taken for unused.
    pub in_use: BTreeSet<String>,
    /// Some IssuedCertificate naming this CA has no readable certificate in its Secret (it
    /// was deleted, say, and waits for a CA that signs). What its workload still serves is
    /// then unknown, so no CA starts counting as unused until every one has a certificate
    /// again (CAs already counting go on).
    pub certificates_missing: bool,
    /// The CAs (fingerprints) that the `ca.crt` of every managed certificate that is Ready
    /// holds (the intersection over them); `None` when none is Ready. Clients verify servers
    /// with `ca.crt`, so it is an injection point like the others: a next CA is trusted only
    /// once every one holds it. (Only Ready ones count: one whose Secret cannot be written
    /// must not hold a promotion up for ever.)
    pub distributed: Option<BTreeSet<String>>,
    /// The injection points and Ready certificates' `ca.crt` that do not hold every CA of the
    /// published bundle yet: what a next CA waits for, named in the status.
    pub untrusting: Untrusting,
    /// The last CA this process saw valid in the CA Secret, if any: it keeps signing while
    /// the Secret is invalid.
    pub last_good: Option<CaKeyPair>,
    /// The CAs (fingerprints) this process last knew this object's CA Secret to hold (what a
    /// pass saw there or wrote). When the bundle ConfigMap is in another namespace than the CA
    /// Secret, only these of the CAs it holds beyond the CA Secret are taken back in as older
    /// CAs: that namespace may be one a tenant may write, and a CA planted there must never
    /// become trusted (issue 31). A bundle ConfigMap in the CA Secret's namespace gives every
    /// CA it holds, remembered or not. `None`: every CA the bundle holds counts (views that
    /// plan nothing).
    pub remembered: Option<BTreeSet<String>>,
    /// The `Degraded` message the status shows now (`None` when not degraded), so that a
    /// Warning event is said once per problem.
    pub reported_degraded: Option<String>,
}

/// Places that do not trust every CA of the published bundle yet: the first few by name
/// ([`Untrusting::NAMED`]), and how many in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Untrusting {
    pub named: Vec<String>,
    pub count: usize,
}

impl Untrusting {
    /// How many are named; the rest are counted.
    pub const NAMED: usize = 5;

    /// One more place, its name made only when it is shown.
    pub fn add(&mut self, name: impl FnOnce() -> String) {
        if self.named.len() < Self::NAMED {
            self.named.push(name());
        }
        self.count += 1;
    }
}

impl fmt::Display for Untrusting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.named.join(", "))?;
        match self.count.saturating_sub(self.named.len()) {
            0 => Ok(()),
            more => write!(f, " and {more} more"),
        }
    }
}

/// One write of a CertificateAuthority's plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthorityStep {
    /// Create or update the CA Secret (type `kubernetes.io/tls`) with
    /// [`CaSecret::data`] and [`CaSecret::annotation_changes`].
    WriteSecret(CaSecret),
    /// Create or update the bundle ConfigMap with [`BundleConfigMap::data`] and
    /// [`BundleConfigMap::annotation_changes`].
    WriteBundle(BundleConfigMap),
}

/// A CA as the status lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustedCa {
    pub serial: String,
    pub not_after: OffsetDateTime,
}

impl TrustedCa {
    fn of(certificate: &Certificate) -> Self {
        Self {
            serial: certificate.serial().to_string(),
            not_after: certificate.not_after(),
        }
    }
}

/// What the CertificateAuthority's status says once the plan's writes are in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorityStatus {
    pub ready: Condition,
    pub degraded: Condition,
    /// The CA that signs now (the last good one while the Secret is invalid).
    pub serial: Option<String>,
    pub not_before: Option<OffsetDateTime>,
    pub not_after: Option<OffsetDateTime>,
    /// The CA a rotation in progress introduces.
    pub next: Option<TrustedCa>,
    /// Older CAs still trusted.
    pub previous: Vec<TrustedCa>,
    /// When the CA that signs now is due to be replaced; during a rotation, when the next CA
    /// will be promoted (unknown while it is not yet trusted everywhere).
    pub next_rotation: Option<OffsetDateTime>,
    /// During a rotation, when the next CA was first seen in the bundle and every injection
    /// point (`caretaker.dev/next-trusted-at`); it signs `trust_propagation` later.
    pub trusted_since: Option<OffsetDateTime>,
}

impl AuthorityStatus {
    /// What the status says of the CA that signs now, as an IssuedCertificate's says of its
    /// certificate.
    pub fn certificate(&self) -> CertificateStatus {
        CertificateStatus {
            ready: self.ready.clone(),
            degraded: self.degraded.clone(),
            serial: self.serial.clone(),
            not_before: self.not_before,
            not_after: self.not_after,
            next_rotation: self.next_rotation,
        }
    }
}

/// A pass over a CertificateAuthority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaPlan {
    /// Writes, in order; the glue stops at the first that fails.
    pub steps: Vec<AuthorityStep>,
    pub events: Vec<Event>,
    pub status: AuthorityStatus,
    /// What its certificates are issued from once the writes are in place.
    pub issuer: IssuerView,
    /// The next moment something is due without anything changing (a rotation, a promotion,
    /// an older CA expiring or unused long enough); `None`: only a change of the objects
    /// matters.
    pub wake_at: Option<OffsetDateTime>,
    /// The CAs (fingerprints) the CA Secret holds once the writes are in place, for
    /// [`AuthorityObserved::remembered`]; `None` when this pass decided nothing of it (an
    /// invalid Secret).
    pub held: Option<BTreeSet<String>>,
}

impl CaPlan {
    pub fn writes_nothing(&self) -> bool {
        self.steps.is_empty()
    }
}

/// Decides a pass over a CertificateAuthority at `now`. `mint` is asked for a new CA only when
/// one must be made (a rotation starts, or the Secret is gone).
pub fn plan(
    seen: &AuthorityObserved,
    policy: &AuthorityPolicy,
    now: OffsetDateTime,
    mint: &dyn Mint,
) -> Result<CaPlan, PkiError> {
    let prop = policy.trust_propagation;
    let mut events = Vec::new();
    let stored = match &seen.secret {
        CaSecretState::Invalid { reason } => return Ok(invalid(seen, reason, now)),
        CaSecretState::Absent => None,
        CaSecretState::Valid(secret) => Some(&**secret),
    };
    let mut desired = match stored {
        Some(secret) => adopt_published(secret, seen, now),
        None => recreate(seen, policy, now, mint, &mut events)?,
    };

    // The writes so far (a Secret is always written before the bundle), and what the objects
    // hold once they are in place.
    let mut steps = Vec::new();
    let mut secret_now = stored.cloned();
    let mut bundle_now = seen.bundle.present().cloned();
    let mut dropped = Vec::new();
    // At most: a rotation's CA trusted and promoted, a promoted CA already due (after a long
    // pause) rotated in turn, and that one promoted at once.
    for _ in 0..3 {
        // 1. A rotation starts: its CA is stored before anything publishes it.
        if desired.next.is_none()
            && let Some(current) = &desired.current
            && let Some(reason) = rotation_reason(&desired, current, policy, now)
        {
            let next = mint.create_ca(&policy.ca)?;
            events.push(Event::normal(
                names::EVENT_SIGNER_UPDATE_REQUIRED,
                format!(
                    "{} requires a new signing cert/key pair: {reason}; the new CA (serial {}) signs once trusted everywhere for {}",
                    seen.secret_name.quoted(),
                    next.certificate.serial(),
                    duration(prop)
                ),
            ));
            desired.next = Some(next);
        }
        dropped.extend(retire(&mut desired, seen, prop, now));
        desired.annotations = annotations_of(desired.current.as_ref());

        // 2. The bundle is published, after the Secret that holds its CAs is stored. (What
        // is stored here never claims more than is true: the moment a CA is trusted is only
        // set below, once the bundle holding it is written.)
        let published = bundle_configmap(&desired, now);
        if bundle_now.as_ref() != Some(&published) {
            if secret_now.as_ref() != Some(&desired) {
                steps.push(AuthorityStep::WriteSecret(desired.clone()));
                secret_now = Some(desired.clone());
            }
            steps.push(AuthorityStep::WriteBundle(published.clone()));
            bundle_now = Some(published);
        }

        // 3. Once the writes so far are in place, the next CA may take over.
        if !promote_when_trusted(
            &mut desired,
            seen,
            bundle_now.as_ref(),
            prop,
            now,
            &mut events,
        ) {
            break;
        }
        // The promoted CA's own annotations: a rotation it needs comes from its dates.
        desired.annotations = annotations_of(desired.current.as_ref());
    }
    dropped.extend(retire(&mut desired, seen, prop, now));
    desired.annotations = annotations_of(desired.current.as_ref());
    if secret_now.as_ref() != Some(&desired) {
        steps.push(AuthorityStep::WriteSecret(desired.clone()));
    }
    let bundle_final = bundle_configmap(&desired, now);
    if bundle_now.as_ref() != Some(&bundle_final) {
        steps.push(AuthorityStep::WriteBundle(bundle_final.clone()));
    }
    if steps
        .iter()
        .any(|s| matches!(s, AuthorityStep::WriteBundle(_)))
    {
        events.push(Event::normal(
            names::EVENT_CA_BUNDLE_UPDATE_REQUIRED,
            format!(
                "{} requires a new cert: {}",
                seen.bundle_name.quoted(),
                bundle_change(&seen.bundle, &bundle_final, &dropped)
            ),
        ));
    }

    Ok(CaPlan {
        steps,
        events,
        status: status_of(&desired, policy, &seen.untrusting, now),
        issuer: IssuerView::of(&desired, now),
        wake_at: wake_at(&desired, &seen.in_use, policy, now),
        held: Some(
            desired
                .certificates()
                .map(|c| c.fingerprint().to_string())
                .collect(),
        ),
    })
}

/// The next CA takes over once it is trusted everywhere for `trust_propagation`: it is in the
/// bundle ConfigMap as written so far and in every injection point, and it is trusted from
/// that moment (recorded here, after the ConfigMap is written). The certificates' `ca.crt`
/// count as injection points when there is time to propagate; with none, each takes the next
/// CA up with its new certificate ([`IssuerView::for_certificates`]). True when it took over.
fn promote_when_trusted(
    desired: &mut CaSecret,
    seen: &AuthorityObserved,
    bundle_now: Option<&BundleConfigMap>,
    prop: Duration,
    now: OffsetDateTime,
    events: &mut Vec<Event>,
) -> bool {
    let Some(next) = &desired.next else {
        return false;
    };
    let ca_crt = (!prop.is_zero()).then_some(&seen.distributed);
    let injected = [Some(&seen.injected), ca_crt]
        .into_iter()
        .flatten()
        .all(|held| {
            held.as_ref()
                .is_none_or(|trusted| trusted.contains(next.fingerprint()))
        });
    let in_bundle = bundle_now.is_some_and(|b| {
        b.certificates
            .iter()
            .any(|c| c.fingerprint() == next.fingerprint())
    });
    // Stored rounded up to the second; the wait counts from the exact moment in this pass,
    // and from the stored one after.
    let trusted_at = match desired.next_trusted_at {
        Some(stored) => Some(stored),
        None if injected && in_bundle => {
            desired.next_trusted_at = Some(ceil_second(now));
            Some(now)
        }
        None => None,
    };
    let Some(trusted_at) = trusted_at.filter(|t| later(*t, prop) <= now) else {
        return false;
    };
    let next = desired.next.take().expect("checked above");
    let replaced = desired.current.replace(next.clone());
    desired.next_trusted_at = None;
    let stays = match replaced {
        Some(old) => {
            let note = format!(
                "; CA serial {} stays trusted while certificates it signed remain",
                old.certificate.serial()
            );
            desired.previous.push(old.certificate);
            note
        }
        None => String::new(),
    };
    events.push(Event::normal(
        names::EVENT_SIGNER_PROMOTED,
        format!(
            "CA serial {} (notAfter {}) signs from now on, trusted everywhere since {}{stays}",
            next.certificate.serial(),
            format_time(next.certificate.not_after()),
            format_time(trusted_at)
        ),
    ));
    true
}

/// The CA Secret is gone: a new one, with a new CA. The CAs the bundle still holds (CA
/// certificates not expired, nothing else) stay trusted; if there are any, the new CA enters as the next CA (trust before sign), else it
/// is the first and signs at once.
fn recreate(
    seen: &AuthorityObserved,
    policy: &AuthorityPolicy,
    now: OffsetDateTime,
    mint: &dyn Mint,
    events: &mut Vec<Event>,
) -> Result<CaSecret, PkiError> {
    // Only the CAs (a leaf there would make `previous.crt` unreadable, and trust nothing),
    // and only those the bundle's namespace may vouch for (see `remembered_cas`).
    let trusted = Bundle::of(remembered_cas(seen).cloned(), now);
    let ca = mint.create_ca(&policy.ca)?;
    let serial = ca.certificate.serial().to_string();
    let mut secret = CaSecret {
        previous: trusted.certificates().to_vec(),
        ..CaSecret::default()
    };
    let what = if trusted.is_empty() {
        secret.current = Some(ca);
        format!("no CA was trusted before, so the new CA (serial {serial}) signs at once")
    } else {
        secret.next = Some(ca);
        format!(
            "the {} CAs the bundle holds stay trusted, and the new CA (serial {serial}) signs once trusted everywhere for {}; until then nothing signs",
            trusted.certificates().len(),
            duration(policy.trust_propagation)
        )
    };
    secret.annotations = annotations_of(secret.current.as_ref());
    events.push(Event::normal(
        names::EVENT_SIGNER_UPDATE_REQUIRED,
        format!(
            "{} requires a new signing cert/key pair: secret doesn't exist; {what}",
            seen.secret_name.quoted()
        ),
    ));
    Ok(secret)
}

/// The CA Secret with every CA only the published bundle holds (a backup restored, a CA
/// swapped into the Secret) taken in as an older CA: certificates it signed may still be
/// served, so it leaves as any older CA does, once expired or unused for `trust_propagation`
/// (see [`retire`]), never at once. Only CA certificates count.
fn adopt_published(secret: &CaSecret, seen: &AuthorityObserved, now: OffsetDateTime) -> CaSecret {
    let mut secret = secret.clone();
    let held: BTreeSet<&str> = secret
        .certificates()
        .map(Certificate::fingerprint)
        .collect();
    let adopted: Vec<Certificate> = remembered_cas(seen)
        .filter(|c| !c.expired_at(now) && !held.contains(c.fingerprint()))
        .cloned()
        .collect();
    secret.previous.extend(adopted);
    secret
}

/// The CA certificates of the published bundle that may be taken into `previous.crt`. A
/// bundle ConfigMap in the CA Secret's namespace gives all of them: whoever may write it may
/// write the CA Secret too, so trusting what it says gives no one a new power, and a CA Secret
/// deleted or restored while no operator ran keeps the CAs its certificates need (no outage).
/// A bundle ConfigMap elsewhere (perhaps a namespace a tenant may write) gives only those
/// [`AuthorityObserved::remembered`] knows as this CA's (all of them when it is `None`).
fn remembered_cas(seen: &AuthorityObserved) -> impl Iterator<Item = &Certificate> {
    let beside_secret = seen.bundle_name.namespace == seen.secret_name.namespace;
    seen.bundle.cas().filter(move |c| {
        beside_secret
            || (seen.remembered.as_ref()).is_none_or(|known| known.contains(c.fingerprint()))
    })
}

/// Why the CA that signs now must be replaced, if it must.
fn rotation_reason(
    secret: &CaSecret,
    current: &CaKeyPair,
    policy: &AuthorityPolicy,
    now: OffsetDateTime,
) -> Option<String> {
    let certificate = &current.certificate;
    if certificate.expired_at(now) {
        return Some(expiring(
            &policy.rotation,
            &policy.ca.validity,
            certificate,
            now,
        ));
    }
    if let Some(problem) = secret.annotations.validity_problem(certificate) {
        return Some(problem);
    }
    if now >= due(&policy.rotation, &policy.ca.validity, certificate) {
        return Some(expiring(
            &policy.rotation,
            &policy.ca.validity,
            certificate,
            now,
        ));
    }
    if certificate.common_name() != policy.ca.common_name {
        return Some(format!(
            "common name changed: {:?} -> {:?}",
            certificate.common_name(),
            policy.ca.common_name
        ));
    }
    if current.algorithm != policy.ca.algorithm {
        return Some(format!(
            "key algorithm changed: {} -> {}",
            current.algorithm, policy.ca.algorithm
        ));
    }
    None
}

/// Keeps the older CAs that stay trusted and records since when each is unused; returns those
/// dropped, and why.
fn retire(
    secret: &mut CaSecret,
    observed: &AuthorityObserved,
    prop: Duration,
    now: OffsetDateTime,
) -> Vec<(Certificate, String)> {
    let in_use = &observed.in_use;
    let mut seen: BTreeSet<String> = secret
        .current
        .iter()
        .chain(&secret.next)
        .map(|ca| ca.fingerprint().to_string())
        .collect();
    let mut kept = Vec::new();
    let mut dropped = Vec::new();
    for certificate in std::mem::take(&mut secret.previous) {
        let fingerprint = certificate.fingerprint().to_string();
        if !seen.insert(fingerprint.clone()) {
            continue;
        }
        if certificate.expired_at(now) {
            let why = format!("expired at {}", format_time(certificate.not_after()));
            dropped.push((certificate, why));
            continue;
        }
        if in_use.contains(&fingerprint) {
            kept.push(certificate);
            continue;
        }
        // Stored rounded up to the second; the wait counts from the exact moment in this
        // pass, and from the stored one after.
        let since = match secret.unused_since.get(&fingerprint) {
            Some(since) => *since,
            None if observed.certificates_missing => {
                kept.push(certificate);
                continue;
            }
            None => {
                secret.unused_since.insert(fingerprint, ceil_second(now));
                now
            }
        };
        if later(since, prop) <= now {
            let why = format!(
                "no managed certificate signed by it since {}",
                format_time(since)
            );
            dropped.push((certificate, why));
        } else {
            kept.push(certificate);
        }
    }
    let unused: BTreeSet<&str> = kept
        .iter()
        .map(Certificate::fingerprint)
        .filter(|fp| !in_use.contains(*fp))
        .collect();
    secret
        .unused_since
        .retain(|fp, _| unused.contains(fp.as_str()));
    secret.previous = Bundle::of(kept, now).certificates().to_vec();
    dropped
}

/// What library-go's annotations say of the CA Secret: its signing CA, or nothing.
fn annotations_of(current: Option<&CaKeyPair>) -> TlsAnnotations {
    current
        .map(|ca| TlsAnnotations::describing(&ca.certificate, issuer_name(&ca.certificate), false))
        .unwrap_or_default()
}

fn bundle_configmap(secret: &CaSecret, now: OffsetDateTime) -> BundleConfigMap {
    BundleConfigMap::of(
        &secret.bundle(now),
        secret.current.as_ref().map(|ca| &ca.certificate),
    )
}

/// Why the bundle ConfigMap is written, in words.
fn bundle_change(
    observed: &BundleState,
    wanted: &BundleConfigMap,
    dropped: &[(Certificate, String)],
) -> String {
    let found = match observed {
        BundleState::Absent => return "configmap doesn't exist".into(),
        BundleState::Unusable { reason } => return format!("configmap is unusable: {reason}"),
        BundleState::Present(found) => found,
    };
    let had: BTreeSet<String> = found.fingerprints().into_iter().collect();
    let has: BTreeSet<String> = wanted.fingerprints().into_iter().collect();
    let mut parts: Vec<String> = wanted
        .certificates
        .iter()
        .filter(|c| !had.contains(c.fingerprint()))
        .map(|c| format!("CA serial {} added", c.serial()))
        .collect();
    for certificate in found
        .certificates
        .iter()
        .filter(|c| !has.contains(c.fingerprint()))
    {
        let why = dropped
            .iter()
            .find(|(d, _)| d.fingerprint() == certificate.fingerprint())
            .map(|(_, why)| why.as_str())
            .unwrap_or("not a CA of this CertificateAuthority");
        parts.push(format!("CA serial {} removed: {why}", certificate.serial()));
    }
    if parts.is_empty() {
        parts.push("its content or annotations differ from the CA's".into());
    }
    parts.join("; ")
}

fn status_of(
    secret: &CaSecret,
    policy: &AuthorityPolicy,
    untrusting: &Untrusting,
    now: OffsetDateTime,
) -> AuthorityStatus {
    let prop = policy.trust_propagation;
    // A next CA not yet trusted everywhere: where it is not (a target whose injection is
    // refused, a certificate whose Secret cannot be written would hold it up for ever).
    let waiting = match (&secret.next, secret.next_trusted_at) {
        (Some(next), None) if untrusting.count > 0 => format!(
            "; CA serial {} is not trusted yet by {untrusting}",
            next.certificate.serial()
        ),
        _ => String::new(),
    };
    let ready = match (&secret.current, &secret.next) {
        (Some(ca), _) if ca.signs_at(now) => Condition::new(
            true,
            names::REASON_SIGNING,
            format!(
                "CA serial {} signs until {}{waiting}",
                ca.certificate.serial(),
                format_time(ca.certificate.not_after())
            ),
        ),
        (Some(ca), _) => Condition::new(
            false,
            names::REASON_EXPIRED,
            format!(
                "CA serial {} expired at {}; its successor signs once trusted everywhere for \
                 {}{waiting}",
                ca.certificate.serial(),
                format_time(ca.certificate.not_after()),
                duration(prop)
            ),
        ),
        (None, next) => Condition::new(
            false,
            names::REASON_WAITING_FOR_TRUST,
            format!(
                "the re-created CA (serial {}) signs once trusted everywhere for {}{waiting}",
                next.as_ref().map_or("?", |ca| ca.certificate.serial()),
                duration(prop)
            ),
        ),
    };
    let next_rotation = match (&secret.current, &secret.next) {
        (_, Some(_)) => secret.next_trusted_at.map(|t| later(t, prop)),
        (Some(ca), None) => Some(due(&policy.rotation, &policy.ca.validity, &ca.certificate)),
        (None, None) => None,
    };
    AuthorityStatus {
        ready,
        degraded: Condition::as_expected(),
        serial: secret
            .current
            .as_ref()
            .map(|ca| ca.certificate.serial().to_string()),
        not_before: secret
            .current
            .as_ref()
            .map(|ca| ca.certificate.not_before()),
        not_after: secret.current.as_ref().map(|ca| ca.certificate.not_after()),
        next: secret
            .next
            .as_ref()
            .map(|ca| TrustedCa::of(&ca.certificate)),
        previous: secret.previous.iter().map(TrustedCa::of).collect(),
        next_rotation,
        trusted_since: secret.next.as_ref().and(secret.next_trusted_at),
    }
}

/// The earliest moment after `now` at which this state calls for something.
fn wake_at(
    secret: &CaSecret,
    in_use: &BTreeSet<String>,
    policy: &AuthorityPolicy,
    now: OffsetDateTime,
) -> Option<OffsetDateTime> {
    let prop = policy.trust_propagation;
    let expiry = |c: &Certificate| c.not_after() + time::Duration::SECOND;
    let mut moments = Vec::new();
    match (&secret.current, &secret.next) {
        (Some(current), None) => moments.push(due(
            &policy.rotation,
            &policy.ca.validity,
            &current.certificate,
        )),
        (current, Some(_)) => {
            moments.extend(secret.next_trusted_at.map(|t| later(t, prop)));
            moments.extend(current.as_ref().map(|ca| expiry(&ca.certificate)));
        }
        (None, None) => {}
    }
    for certificate in &secret.previous {
        moments.push(expiry(certificate));
        if !in_use.contains(certificate.fingerprint())
            && let Some(since) = secret.unused_since.get(certificate.fingerprint())
        {
            moments.push(later(*since, prop));
        }
    }
    moments.into_iter().filter(|t| *t > now).min()
}

pub(super) fn invalid_message(seen: &AuthorityObserved, reason: &str) -> String {
    format!(
        "the CA Secret {} is invalid: {reason}; nothing was regenerated or written: restore it, or delete it to have a new CA made",
        seen.secret_name
    )
}

/// An invalid CA Secret: nothing written, the last good CA (if any) keeps signing, Degraded,
/// and a Warning once.
fn invalid(seen: &AuthorityObserved, reason: &str, now: OffsetDateTime) -> CaPlan {
    let message = invalid_message(seen, reason);
    let issuer = fallback(seen, &message, now);
    let events = if seen.reported_degraded.as_deref() == Some(message.as_str()) {
        Vec::new()
    } else {
        vec![Event::warning(
            names::EVENT_CA_SECRET_INVALID,
            message.clone(),
        )]
    };
    let signer = issuer.signer.as_ref().ok();
    let ready = match signer {
        Some(ca) => Condition::new(
            true,
            names::REASON_SIGNING,
            format!(
                "the last good CA (serial {}) signs while the CA Secret is invalid",
                ca.certificate.serial()
            ),
        ),
        None => Condition::new(false, names::REASON_CA_SECRET_INVALID, message.clone()),
    };
    CaPlan {
        steps: Vec::new(),
        events,
        status: AuthorityStatus {
            ready,
            degraded: Condition::new(true, names::REASON_CA_SECRET_INVALID, message),
            serial: signer.map(|ca| ca.certificate.serial().to_string()),
            not_before: signer.map(|ca| ca.certificate.not_before()),
            not_after: signer.map(|ca| ca.certificate.not_after()),
            next: None,
            previous: Vec::new(),
            next_rotation: None,
            trusted_since: None,
        },
        issuer,
        wake_at: None,
        held: None,
    }
}

/// A duration as a TTL (`5m`, `720h`).
fn duration(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    caretaker_pki::Ttl::from_duration(d)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| format!("{d:?}"))
}

#[cfg(test)]
mod tests;
