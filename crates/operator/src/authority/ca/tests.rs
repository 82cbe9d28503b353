//! Each step and trigger of a CA's rotation, on model certificates where time passes and on
//! real ones where Secrets are read.

use std::collections::BTreeMap;

use super::*;
use crate::authority::model::{Model, at};
use crate::authority::{IssuedLeaf, PkiMint};
use crate::changes::EventType;
use caretaker_api::names::{NEXT_CRT, PREVIOUS_CRT, TLS_CRT, TLS_KEY};
use caretaker_pki::{CaSpec, KeyAlgorithm, LeafSpec, RotationPolicy, Ttl, Usage};

const DAY: i64 = 86_400;

/// An edit of library-go's annotations.
type Edit = fn(&mut TlsAnnotations);
/// A Secret's `data`.
type Data = BTreeMap<String, Vec<u8>>;
const PROP: Duration = Duration::from_secs(300);

fn policy() -> AuthorityPolicy {
    AuthorityPolicy {
        ca: CaSpec {
            validity: Ttl::calendar(0, 0, 100).unwrap(),
            ..CaSpec::new("webhooks-ca")
        },
        rotation: RotationPolicy::fraction(0.8).unwrap(),
        trust_propagation: PROP,
    }
}

fn nothing() -> AuthorityObserved {
    AuthorityObserved {
        secret_name: ObjectName::new("caretaker-system", "webhooks-ca"),
        bundle_name: ObjectName::new("caretaker-system", "webhooks-ca-bundle"),
        secret: CaSecretState::Absent,
        bundle: BundleState::Absent,
        injected: None,
        in_use: BTreeSet::new(),
        certificates_missing: false,
        distributed: None,
        untrusting: Default::default(),
        last_good: None,
        remembered: None,
        reported_degraded: None,
    }
}

/// A mint that must not be asked.
struct NoMint;

impl Mint for NoMint {
    fn create_ca(&self, _: &CaSpec) -> Result<CaKeyPair, PkiError> {
        panic!("a CA was made where none may be")
    }
    fn issue(&self, _: &CaKeyPair, _: &LeafSpec) -> Result<IssuedLeaf, PkiError> {
        panic!("a certificate was issued by a CA decision")
    }
}

fn decide(seen: &AuthorityObserved, policy: &AuthorityPolicy, model: &Model, now: i64) -> CaPlan {
    model.set_now(at(now));
    plan(seen, policy, at(now), model).unwrap()
}

/// The objects once `plan`'s writes are in place.
fn apply(seen: &mut AuthorityObserved, plan: &CaPlan) {
    for step in &plan.steps {
        match step {
            AuthorityStep::WriteSecret(s) => {
                seen.secret = CaSecretState::Valid(Box::new(s.clone()))
            }
            AuthorityStep::WriteBundle(b) => seen.bundle = BundleState::Present(b.clone()),
        }
    }
}

/// Deciding again at the same moment on what `plan` wrote writes and makes nothing.
fn assert_settled(seen: &AuthorityObserved, policy: &AuthorityPolicy, now: i64) {
    let again = plan(seen, policy, at(now), &NoMint).unwrap();
    assert!(again.steps.is_empty(), "wrote again: {:?}", again.steps);
    assert!(again.events.is_empty(), "said again: {:?}", again.events);
}

fn secret(seen: &AuthorityObserved) -> &CaSecret {
    match &seen.secret {
        CaSecretState::Valid(s) => s,
        other => panic!("{other:?}"),
    }
}

fn fingerprints(certificates: &[Certificate]) -> Vec<&str> {
    certificates.iter().map(Certificate::fingerprint).collect()
}

/// A CA made from nothing at time 0, published, settled.
fn started(policy: &AuthorityPolicy, model: &Model) -> AuthorityObserved {
    let mut seen = nothing();
    let first = decide(&seen, policy, model, 0);
    apply(&mut seen, &first);
    assert_settled(&seen, policy, 0);
    seen
}

/// When the first CA of `seen` falls due.
fn due_of(seen: &AuthorityObserved, policy: &AuthorityPolicy) -> i64 {
    let current = secret(seen).current.as_ref().unwrap();
    (due(&policy.rotation, &policy.ca.validity, &current.certificate) - at(0)).whole_seconds()
}

#[test]
fn the_first_ca_is_stored_then_published_and_signs_at_once() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = nothing();
    let first = decide(&seen, &policy, &model, 0);
    assert_eq!(model.log.borrow().len(), 1, "one CA made");
    let [
        AuthorityStep::WriteSecret(stored),
        AuthorityStep::WriteBundle(published),
    ] = first.steps.as_slice()
    else {
        panic!("{:?}", first.steps)
    };
    let ca = stored.current.clone().expect("the first CA signs at once");
    assert_eq!(stored.next, None);
    assert_eq!(fingerprints(&published.certificates), [ca.fingerprint()]);
    assert_eq!(
        stored.annotations,
        TlsAnnotations::describing(&ca.certificate, "webhooks-ca", false)
    );
    assert_eq!(published.annotations, stored.annotations);
    assert_eq!(first.issuer.signer, Ok(ca.clone()));
    let reasons: Vec<_> = first.events.iter().map(|e| e.reason).collect();
    assert_eq!(
        reasons,
        [
            names::EVENT_SIGNER_UPDATE_REQUIRED,
            names::EVENT_CA_BUNDLE_UPDATE_REQUIRED
        ]
    );
    assert!(
        first.events[0].note.starts_with(
            r#""webhooks-ca" in "caretaker-system" requires a new signing cert/key pair: secret doesn't exist"#
        ),
        "{}",
        first.events[0].note
    );
    assert!(
        first.events[1].note.ends_with("configmap doesn't exist"),
        "{}",
        first.events[1].note
    );
    assert!(first.status.ready.status);
    assert_eq!(
        first.status.serial.as_deref(),
        Some(ca.certificate.serial())
    );
    apply(&mut seen, &first);
    assert_settled(&seen, &policy, 0);
    assert_eq!(
        first.wake_at,
        Some(due(&policy.rotation, &policy.ca.validity, &ca.certificate))
    );
    assert_eq!(first.status.next_rotation, first.wake_at);
}

#[test]
fn a_due_ca_gets_its_successor_stored_before_anything_publishes_it() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let old = secret(&seen).current.clone().unwrap();
    let due = due_of(&seen, &policy);
    // Not a second early.
    assert!(decide(&seen, &policy, &model, due - 1).writes_nothing());
    assert_eq!(model.log.borrow().len(), 1);

    // An injection point that still holds only the old CA.
    seen.injected = Some(BTreeSet::from([old.fingerprint().to_string()]));
    let rotation = decide(&seen, &policy, &model, due);
    let [
        AuthorityStep::WriteSecret(stored),
        AuthorityStep::WriteBundle(published),
    ] = rotation.steps.as_slice()
    else {
        panic!("{:?}", rotation.steps)
    };
    let next = stored.next.clone().expect("stored as the next CA");
    assert_eq!(stored.current, Some(old.clone()), "the old CA still signs");
    assert_eq!(
        stored.next_trusted_at, None,
        "not in every injection point yet"
    );
    assert!(published.certificates.contains(&next.certificate));
    assert!(published.certificates.contains(&old.certificate));
    assert_eq!(rotation.issuer.signer, Ok(old.clone()));
    let note = &rotation.events[0].note;
    assert_eq!(
        rotation.events[0].reason,
        names::EVENT_SIGNER_UPDATE_REQUIRED
    );
    assert!(note.contains("expiring: past its refresh time"), "{note}");
    assert!(note.contains("(80% of its validity)"), "{note}");
    assert!(
        note.contains("signs once trusted everywhere for 5m"),
        "{note}"
    );
    assert_eq!(
        rotation.wake_at,
        Some(old.certificate.not_after() + time::Duration::SECOND)
    );
    assert_eq!(
        rotation.status.next.as_ref().map(|n| n.serial.as_str()),
        Some(next.certificate.serial())
    );
    assert_eq!(
        rotation.status.next_rotation, None,
        "unknown until trusted everywhere"
    );
    assert_eq!(rotation.status.trusted_since, None);

    apply(&mut seen, &rotation);
    assert_settled(&seen, &policy, due);
    // A day later, still waiting for the injection point: nothing made again.
    assert!(decide(&seen, &policy, &model, due + DAY).writes_nothing());
    assert_eq!(model.log.borrow().len(), 2, "one CA per rotation");
}

#[test]
fn the_next_ca_signs_only_once_trusted_everywhere_for_the_propagation_time() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let old = secret(&seen).current.clone().unwrap();
    let due = due_of(&seen, &policy);
    seen.injected = Some(BTreeSet::from([old.fingerprint().to_string()]));
    let rotation = decide(&seen, &policy, &model, due);
    apply(&mut seen, &rotation);
    let next = secret(&seen).next.clone().unwrap();

    // The injector takes up the bundle an hour later: that moment is recorded, nothing else.
    let trusted = due + 3600;
    seen.injected = Some(BTreeSet::from([
        old.fingerprint().to_string(),
        next.fingerprint().to_string(),
    ]));
    let record = decide(&seen, &policy, &model, trusted);
    let [AuthorityStep::WriteSecret(recorded)] = record.steps.as_slice() else {
        panic!("{:?}", record.steps)
    };
    assert_eq!(recorded.next_trusted_at, Some(at(trusted)));
    assert_eq!(recorded.current, Some(old.clone()));
    assert!(record.events.is_empty());
    assert_eq!(record.issuer.signer, Ok(old.clone()), "not yet");
    assert_eq!(record.wake_at, Some(at(trusted + 300)));
    assert_eq!(record.status.next_rotation, Some(at(trusted + 300)));
    assert_eq!(record.status.trusted_since, Some(at(trusted)));
    apply(&mut seen, &record);
    assert_settled(&seen, &policy, trusted);
    assert!(decide(&seen, &policy, &model, trusted + 299).writes_nothing());

    let promotion = decide(&seen, &policy, &model, trusted + 300);
    let promoted = promotion
        .steps
        .iter()
        .find_map(|s| match s {
            AuthorityStep::WriteSecret(s) => Some(s),
            _ => None,
        })
        .expect("the Secret is written");
    assert_eq!(promoted.current, Some(next.clone()));
    assert_eq!(promoted.next, None);
    assert_eq!(promoted.next_trusted_at, None);
    assert_eq!(promoted.previous, vec![old.certificate.clone()]);
    assert_eq!(
        promoted.annotations,
        TlsAnnotations::describing(&next.certificate, "webhooks-ca", false)
    );
    assert_eq!(promotion.issuer.signer, Ok(next.clone()));
    assert_eq!(promotion.events[0].reason, names::EVENT_SIGNER_PROMOTED);
    assert_eq!(model.log.borrow().len(), 2);
    assert_eq!(
        promotion.status.trusted_since, None,
        "no rotation in progress"
    );
    assert_eq!(
        promotion.status.not_before,
        Some(next.certificate.not_before())
    );
    apply(&mut seen, &promotion);
    assert_settled(&seen, &policy, trusted + 300);
    let published = seen.bundle.present().unwrap();
    assert_eq!(
        published.certificates.len(),
        2,
        "the old CA is still trusted"
    );
}

#[test]
fn with_no_injection_point_and_no_propagation_a_rotation_takes_one_pass() {
    let (policy, model) = (no_propagation(), Model::new(at(0)));
    let (mut seen, old, due) = due_for_rotation(&policy, &model);
    let rotation = decide(&seen, &policy, &model, due);
    let kinds: Vec<_> = rotation
        .steps
        .iter()
        .map(|s| match s {
            AuthorityStep::WriteSecret(s) => match (&s.next, &s.current) {
                (Some(_), _) => "store next",
                (None, Some(c)) if c != &old => "promote",
                _ => "other",
            },
            AuthorityStep::WriteBundle(_) => "publish",
        })
        .collect();
    // Stored, published, and only then trusted and promoted; the bundle's annotations follow.
    assert_eq!(kinds, ["store next", "publish", "promote", "publish"]);
    let AuthorityStep::WriteSecret(stored) = &rotation.steps[0] else {
        unreachable!()
    };
    assert_eq!(
        stored.next_trusted_at, None,
        "the moment of trust is written only after the bundle"
    );
    apply(&mut seen, &rotation);
    assert_settled(&seen, &policy, due);
    assert_ne!(secret(&seen).current, Some(old.clone()));
    // No propagation to wait out, but the old CA still signs a certificate: it stays.
    assert_eq!(secret(&seen).previous, vec![old.certificate.clone()]);
    // Once nothing it signed remains, it goes at once.
    seen.in_use.clear();
    let gone = decide(&seen, &policy, &model, due + 1);
    apply(&mut seen, &gone);
    assert!(secret(&seen).previous.is_empty());
    assert!(secret(&seen).unused_since.is_empty());
    assert!(
        !seen
            .bundle
            .present()
            .unwrap()
            .certificates
            .contains(&old.certificate)
    );
}

/// The `ca.crt` of the Ready certificates' Secrets is a place clients trust from: with time to
/// propagate, the wait for trust starts only once every one holds the next CA.
#[test]
fn a_next_ca_is_trusted_only_once_every_ready_certificates_ca_crt_holds_it() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let (mut seen, old, due) = due_for_rotation(&policy, &model);
    seen.distributed = Some(BTreeSet::from([old.fingerprint().to_string()]));
    let rotation = decide(&seen, &policy, &model, due);
    apply(&mut seen, &rotation);
    let next = secret(&seen)
        .next
        .clone()
        .expect("stored and published, not promoted");
    assert_eq!(secret(&seen).next_trusted_at, None);
    assert_eq!(secret(&seen).current, Some(old.clone()));
    assert_settled(&seen, &policy, due);

    // The status says what it waits for: the first few by name, the others counted.
    for i in 0..7 {
        seen.untrusting
            .add(|| format!("the ca.crt of IssuedCertificate demo/web-{i}"));
    }
    let waiting = decide(&seen, &policy, &model, due + 2 * PROP.as_secs() as i64);
    assert!(waiting.steps.is_empty(), "{:?}", waiting.steps);
    let ready = &waiting.status.ready;
    assert!(ready.status, "the old CA signs meanwhile");
    assert!(
        ready.message.ends_with(&format!(
            "; CA serial {} is not trusted yet by the ca.crt of IssuedCertificate demo/web-0, \
             the ca.crt of IssuedCertificate demo/web-1, the ca.crt of IssuedCertificate \
             demo/web-2, the ca.crt of IssuedCertificate demo/web-3, the ca.crt of \
             IssuedCertificate demo/web-4 and 2 more",
            next.certificate.serial()
        )),
        "{}",
        ready.message
    );
    seen.untrusting = Untrusting::default();

    // Every Ready certificate's ca.crt holds it now: trusted from now, promoted PROP later.
    seen.distributed = Some(BTreeSet::from([
        old.fingerprint().to_string(),
        next.fingerprint().to_string(),
    ]));
    let trusted_at = due + 3 * PROP.as_secs() as i64;
    let trusted = decide(&seen, &policy, &model, trusted_at);
    assert_eq!(trusted.issuer.signer, Ok(old.clone()));
    apply(&mut seen, &trusted);
    assert_eq!(secret(&seen).next_trusted_at, Some(at(trusted_at)));
    let promoted = decide(&seen, &policy, &model, trusted_at + PROP.as_secs() as i64);
    assert_eq!(promoted.issuer.signer, Ok(next));
    assert!(
        !promoted.status.ready.message.contains("not trusted yet"),
        "{}",
        promoted.status.ready.message
    );
}

/// With no propagation time nothing waits for `ca.crt`: the next CA signs from the pass that
/// publishes it (no injection point names the CA), and until then the certificates' view of
/// the issuer leaves it out of `ca.crt`, so that each Secret takes it up with its new
/// certificate, in one write. With propagation time, `ca.crt` holds it from the start.
#[test]
fn with_no_propagation_time_ca_crt_takes_the_next_ca_with_the_new_certificate() {
    let (policy, model) = (no_propagation(), Model::new(at(0)));
    let (mut seen, old, due) = due_for_rotation(&policy, &model);
    seen.distributed = Some(BTreeSet::from([old.fingerprint().to_string()]));

    let rotation = decide(&seen, &policy, &model, due);
    let next = rotation.issuer.signer.clone().expect("a signer");
    assert_ne!(next, old, "promoted in the pass that published it");
    let [
        AuthorityStep::WriteSecret(stored),
        AuthorityStep::WriteBundle(published),
        AuthorityStep::WriteSecret(promoted),
        // library-go's annotations describe the CA that signs.
        AuthorityStep::WriteBundle(_),
    ] = rotation.steps.as_slice()
    else {
        panic!("{:?}", rotation.steps)
    };
    assert_eq!(stored.next.as_ref(), Some(&next), "stored before published");
    assert!(published.certificates.contains(&next.certificate));
    assert_eq!(promoted.current.as_ref(), Some(&next));

    // Between the two Secret writes, a certificate pass sees the next CA stored, not signing.
    seen.secret = CaSecretState::Valid(Box::new(stored.clone()));
    seen.bundle = BundleState::Present(published.clone());
    let between = IssuerView::for_certificates(&seen, policy.trust_propagation, at(due));
    assert_eq!(between.signer, Ok(old.clone()));
    let trusted = between.bundle.expect("a bundle");
    assert_eq!(fingerprints(trusted.certificates()), [old.fingerprint()]);
    let with_time = IssuerView::for_certificates(&seen, PROP, at(due));
    assert_eq!(
        with_time.bundle.expect("a bundle").certificates().len(),
        2,
        "with propagation time ca.crt takes the next CA up at once"
    );

    // Once promoted, ca.crt holds both: the old CA signs what is not re-issued yet.
    seen.secret = CaSecretState::Valid(Box::new(promoted.clone()));
    let after = IssuerView::for_certificates(&seen, policy.trust_propagation, at(due));
    assert_eq!(after.signer, Ok(next.clone()));
    let mut held = fingerprints(after.bundle.as_ref().unwrap().certificates());
    held.sort();
    let mut both = [old.fingerprint(), next.fingerprint()];
    both.sort();
    assert_eq!(held, both);
}

fn no_propagation() -> AuthorityPolicy {
    AuthorityPolicy {
        trust_propagation: Duration::ZERO,
        ..policy()
    }
}

/// A started CA that signs one certificate, and the moment its rotation is due.
fn due_for_rotation(
    policy: &AuthorityPolicy,
    model: &Model,
) -> (AuthorityObserved, CaKeyPair, i64) {
    let mut seen = started(policy, model);
    let old = secret(&seen).current.clone().unwrap();
    seen.in_use = BTreeSet::from([old.fingerprint().to_string()]);
    let due = due_of(&seen, policy);
    (seen, old, due)
}

/// A CA promoted at `trusted + PROP` with the old one in previous, settled.
fn rotated(policy: &AuthorityPolicy, model: &Model) -> (AuthorityObserved, CaKeyPair, i64) {
    let mut seen = started(policy, model);
    let old = secret(&seen).current.clone().unwrap();
    seen.in_use = BTreeSet::from([old.fingerprint().to_string()]);
    let due = due_of(&seen, policy);
    let rotation = decide(&seen, policy, model, due);
    apply(&mut seen, &rotation);
    let promotion = decide(&seen, policy, model, due + 300);
    apply(&mut seen, &promotion);
    assert_settled(&seen, policy, due + 300);
    assert_eq!(secret(&seen).previous, vec![old.certificate.clone()]);
    (seen, old, due + 300)
}

#[test]
fn an_older_ca_stays_while_a_certificate_it_signed_remains_and_for_the_propagation_after() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let (mut seen, old, t) = rotated(&policy, &model);
    let fp = old.fingerprint().to_string();
    // Still in use a day later: kept, no bookkeeping, and no timer for it but its expiry.
    let kept = decide(&seen, &policy, &model, t + DAY);
    assert!(kept.writes_nothing());
    assert_eq!(kept.status.previous.len(), 1);

    // The last certificate it signed was issued again: since when is recorded.
    seen.in_use.clear();
    let unused = decide(&seen, &policy, &model, t + DAY);
    let [AuthorityStep::WriteSecret(recorded)] = unused.steps.as_slice() else {
        panic!("{:?}", unused.steps)
    };
    assert_eq!(recorded.unused_since.get(&fp), Some(&at(t + DAY)));
    assert_eq!(
        recorded.previous,
        vec![old.certificate.clone()],
        "still trusted"
    );
    assert_eq!(unused.wake_at, Some(at(t + DAY + 300)));
    apply(&mut seen, &unused);
    assert_settled(&seen, &policy, t + DAY);
    assert!(decide(&seen, &policy, &model, t + DAY + 299).writes_nothing());

    let gone = decide(&seen, &policy, &model, t + DAY + 300);
    let [
        AuthorityStep::WriteSecret(pruned),
        AuthorityStep::WriteBundle(published),
    ] = gone.steps.as_slice()
    else {
        panic!("{:?}", gone.steps)
    };
    assert!(pruned.previous.is_empty());
    assert!(pruned.unused_since.is_empty());
    assert!(!published.certificates.contains(&old.certificate));
    let note = &gone.events[0].note;
    assert_eq!(
        gone.events[0].reason,
        names::EVENT_CA_BUNDLE_UPDATE_REQUIRED
    );
    assert!(
        note.contains("removed: no managed certificate signed by it since"),
        "{note}"
    );
    apply(&mut seen, &gone);
    assert_settled(&seen, &policy, t + DAY + 300);
}

#[test]
fn an_older_ca_used_again_before_its_time_is_kept() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let (mut seen, old, t) = rotated(&policy, &model);
    seen.in_use.clear();
    let unused = decide(&seen, &policy, &model, t);
    apply(&mut seen, &unused);
    seen.in_use.insert(old.fingerprint().to_string());
    let used = decide(&seen, &policy, &model, t + 100);
    let [AuthorityStep::WriteSecret(cleared)] = used.steps.as_slice() else {
        panic!("{:?}", used.steps)
    };
    assert!(cleared.unused_since.is_empty());
    apply(&mut seen, &used);
    assert!(decide(&seen, &policy, &model, t + DAY).writes_nothing());
}

#[test]
fn an_older_ca_leaves_the_bundle_when_it_expires_even_while_in_use() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let (seen, old, _) = rotated(&policy, &model);
    let expiry = (old.certificate.not_after() - at(0)).whole_seconds();
    let before = decide(&seen, &policy, &model, expiry);
    assert!(before.writes_nothing());
    assert_eq!(before.wake_at, Some(at(expiry + 1)));
    let expired = decide(&seen, &policy, &model, expiry + 1);
    let published = expired
        .steps
        .iter()
        .find_map(|s| match s {
            AuthorityStep::WriteBundle(b) => Some(b),
            _ => None,
        })
        .unwrap();
    assert!(!published.certificates.contains(&old.certificate));
    assert!(expired.events[0].note.contains("removed: expired at"));
}

#[test]
fn removing_or_editing_a_validity_annotation_forces_a_rotation_that_still_waits_for_trust() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let seen = started(&policy, &model);
    let stored = secret(&seen).clone();
    let old = stored.current.clone().unwrap();
    let cases: [(&str, Edit); 4] = [
        ("missing notAfter", |a| a.not_after = None),
        ("missing notBefore", |a| a.not_before = None),
        (r#"bad expiry: "soon""#, |a| {
            a.not_after = Some("soon".into())
        }),
        (
            "notAfter annotation \"2026-02-01T00:00:00Z\" does not say",
            |a| a.not_after = Some("2026-02-01T00:00:00Z".into()),
        ),
    ];
    for (reason, edit) in cases {
        let mut edited = stored.clone();
        edit(&mut edited.annotations);
        let mut seen = AuthorityObserved {
            secret: CaSecretState::Valid(Box::new(edited)),
            injected: Some(BTreeSet::from([old.fingerprint().to_string()])),
            ..seen.clone()
        };
        let forced = decide(&seen, &policy, &model, DAY);
        let note = &forced.events[0].note;
        assert_eq!(forced.events[0].reason, names::EVENT_SIGNER_UPDATE_REQUIRED);
        assert!(
            note.contains(&format!("cert/key pair: {reason}")),
            "{reason}: {note}"
        );
        let AuthorityStep::WriteSecret(written) = &forced.steps[0] else {
            panic!("{:?}", forced.steps)
        };
        assert!(written.next.is_some(), "{reason}");
        assert_eq!(
            written.annotations, stored.annotations,
            "{reason}: annotations restored"
        );
        assert_eq!(
            forced.issuer.signer,
            Ok(old.clone()),
            "{reason}: the new CA waits"
        );
        apply(&mut seen, &forced);
        assert_settled(&seen, &policy, DAY);
    }
}

#[test]
fn an_issuer_annotation_edited_is_rewritten_without_a_rotation() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let mut edited = secret(&seen).clone();
    edited.annotations.issuer = Some("someone".into());
    seen.secret = CaSecretState::Valid(Box::new(edited));
    let fixed = plan(&seen, &policy, at(DAY), &NoMint).unwrap();
    let [AuthorityStep::WriteSecret(written)] = fixed.steps.as_slice() else {
        panic!("{:?}", fixed.steps)
    };
    assert_eq!(written.annotations.issuer.as_deref(), Some("webhooks-ca"));
    assert!(written.next.is_none());
}

#[test]
fn a_changed_common_name_or_key_algorithm_rotates() {
    let model = Model::new(at(0));
    let seen = started(&policy(), &model);
    let mut renamed = policy();
    renamed.ca.common_name = "other-ca".into();
    let plan = decide(&seen, &renamed, &model, DAY);
    assert!(
        plan.events[0]
            .note
            .contains(r#"common name changed: "webhooks-ca" -> "other-ca""#),
        "{}",
        plan.events[0].note
    );
    let mut ed25519 = policy();
    ed25519.ca.algorithm = KeyAlgorithm::Ed25519;
    let plan = decide(&seen, &ed25519, &model, DAY);
    assert!(
        plan.events[0]
            .note
            .contains("key algorithm changed: ecdsa-p256 -> ed25519"),
        "{}",
        plan.events[0].note
    );
}

#[test]
fn renew_before_rotates_that_long_before_expiry() {
    let policy = AuthorityPolicy {
        rotation: RotationPolicy::Before(Duration::from_secs(10 * DAY as u64)),
        ..policy()
    };
    let model = Model::new(at(0));
    let seen = started(&policy, &model);
    let not_after = secret(&seen)
        .current
        .as_ref()
        .unwrap()
        .certificate
        .not_after();
    let due = (not_after - at(0)).whole_seconds() - 10 * DAY;
    assert_eq!(due_of(&seen, &policy), due);
    assert!(decide(&seen, &policy, &model, due - 1).writes_nothing());
    let rotation = decide(&seen, &policy, &model, due);
    assert!(
        rotation.events[0].note.contains("(240h before notAfter)"),
        "{}",
        rotation.events[0].note
    );
}

#[test]
fn a_deleted_ca_secret_makes_a_new_ca_that_waits_for_trust_while_the_old_ones_stay() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let (mut seen, older, t) = rotated(&policy, &model);
    let lost = secret(&seen).current.clone().unwrap();
    seen.in_use = BTreeSet::from([lost.fingerprint().to_string()]);
    seen.secret = CaSecretState::Absent;
    seen.injected = Some(BTreeSet::new());
    let remade = decide(&seen, &policy, &model, t + DAY);
    let [
        AuthorityStep::WriteSecret(stored),
        AuthorityStep::WriteBundle(published),
    ] = remade.steps.as_slice()
    else {
        panic!("{:?}", remade.steps)
    };
    assert_eq!(stored.current, None, "nothing signs yet");
    let new = stored.next.clone().unwrap();
    assert_eq!(
        fingerprints(&stored.previous)
            .into_iter()
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([lost.fingerprint(), older.fingerprint()]),
        "every CA the bundle held stays trusted"
    );
    assert_eq!(published.certificates.len(), 3);
    assert_eq!(published.annotations, TlsAnnotations::default());
    let note = &remade.events[0].note;
    assert!(
        note.contains("secret doesn't exist; the 2 CAs the bundle holds stay trusted"),
        "{note}"
    );
    assert!(!remade.status.ready.status);
    assert_eq!(remade.status.ready.reason, names::REASON_WAITING_FOR_TRUST);
    let Err(waiting) = &remade.issuer.signer else {
        panic!("{:?}", remade.issuer.signer)
    };
    assert!(!waiting.degraded);
    // The data keeps the keys a kubernetes.io/tls Secret must have.
    assert_eq!(stored.data().get(TLS_CRT), Some(Some("")));
    assert_eq!(stored.data().get(TLS_KEY), Some(Some("")));
    apply(&mut seen, &remade);
    assert_settled(&seen, &policy, t + DAY);

    seen.injected = Some(BTreeSet::from([new.fingerprint().to_string()]));
    let trusted = decide(&seen, &policy, &model, t + DAY + 10);
    apply(&mut seen, &trusted);
    let promoted = decide(&seen, &policy, &model, t + DAY + 310);
    assert_eq!(promoted.issuer.signer, Ok(new));
    assert_eq!(model.log.borrow().len(), 3, "one new CA");
    apply(&mut seen, &promoted);
    assert_eq!(
        fingerprints(&secret(&seen).previous),
        [lost.fingerprint()],
        "the lost CA stays while in use; the unused older one has gone"
    );
}

#[test]
fn a_re_created_ca_secret_keeps_the_bundles_cas_and_nothing_else() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let ca = secret(&seen).current.clone().unwrap();
    let leaf = model
        .issue(&ca, &LeafSpec::new("web", Usage::Server))
        .unwrap()
        .certificate;
    let expired = model.ca_cert("old", 1);
    let mut published = seen.bundle.present().unwrap().clone();
    published.certificates.extend([leaf, expired]);
    seen.bundle = BundleState::Present(published);
    seen.secret = CaSecretState::Absent;
    let remade = decide(&seen, &policy, &model, 2 * DAY);
    let AuthorityStep::WriteSecret(stored) = &remade.steps[0] else {
        panic!("{:?}", remade.steps)
    };
    assert_eq!(
        fingerprints(&stored.previous),
        [ca.fingerprint()],
        "the CA stays; the leaf and the expired CA do not"
    );
    assert!(
        remade.events[0]
            .note
            .contains("the 1 CAs the bundle holds stay trusted"),
        "{}",
        remade.events[0].note
    );
    apply(&mut seen, &remade);
    assert_settled(&seen, &policy, 2 * DAY);
}

/// Issue 31: a CA planted in a bundle ConfigMap in another namespace than the CA Secret (one
/// a tenant may write) is never taken into `previous.crt`, with the CA Secret there or
/// re-created; only CAs the CA Secret was known to hold are.
#[test]
fn a_ca_planted_in_the_bundle_configmap_is_never_trusted() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    seen.bundle_name = ObjectName::new("team", "webhooks-ca-bundle");
    let ca = secret(&seen).current.clone().unwrap();
    let planted = model.ca_cert("planted", 100);
    let mut published = seen.bundle.present().unwrap().clone();
    published.certificates.push(planted.clone());
    seen.bundle = BundleState::Present(published);
    seen.remembered = Some([ca.fingerprint().to_string()].into());

    let rewritten = decide(&seen, &policy, &model, DAY);
    assert!(
        rewritten
            .steps
            .iter()
            .all(|s| !matches!(s, AuthorityStep::WriteSecret(_))),
        "{:?}",
        rewritten.steps
    );
    let [AuthorityStep::WriteBundle(bundle)] = rewritten.steps.as_slice() else {
        panic!("{:?}", rewritten.steps)
    };
    assert_eq!(
        fingerprints(&bundle.certificates),
        [ca.fingerprint()],
        "the planted CA is dropped"
    );

    seen.secret = CaSecretState::Absent;
    let remade = decide(&seen, &policy, &model, DAY);
    let AuthorityStep::WriteSecret(stored) = &remade.steps[0] else {
        panic!("{:?}", remade.steps)
    };
    assert_eq!(fingerprints(&stored.previous), [ca.fingerprint()]);
    // Known to nobody (the operator restarted meanwhile): nothing of the bundle is trusted.
    seen.remembered = Some(BTreeSet::new());
    let remade = decide(&seen, &policy, &model, DAY);
    let AuthorityStep::WriteSecret(stored) = &remade.steps[0] else {
        panic!("{:?}", remade.steps)
    };
    assert!(stored.previous.is_empty() && stored.current.is_some());
}

/// A bundle ConfigMap in the CA Secret's namespace gives back every CA it holds, remembered
/// or not (whoever may write it may write the CA Secret): a CA Secret deleted while no
/// operator ran keeps its old CA trusted, and the new CA waits to be trusted before it signs.
/// The same bundle in another namespace gives back only what is remembered.
#[test]
fn a_bundle_beside_the_ca_secret_gives_back_its_cas_unremembered_and_one_elsewhere_does_not() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let ca = secret(&seen).current.clone().unwrap();
    seen.secret = CaSecretState::Absent;
    // Known to nobody: the operator restarted while the Secret was gone.
    seen.remembered = Some(BTreeSet::new());

    let remade = decide(&seen, &policy, &model, DAY);
    let AuthorityStep::WriteSecret(stored) = &remade.steps[0] else {
        panic!("{:?}", remade.steps)
    };
    assert_eq!(fingerprints(&stored.previous), [ca.fingerprint()]);
    assert!(
        stored.current.is_none() && stored.next.is_some(),
        "the new CA waits to be trusted, the old one's certificates stay valid"
    );

    seen.bundle_name = ObjectName::new("team", "webhooks-ca-bundle");
    let remade = decide(&seen, &policy, &model, DAY);
    let AuthorityStep::WriteSecret(stored) = &remade.steps[0] else {
        panic!("{:?}", remade.steps)
    };
    assert!(stored.previous.is_empty() && stored.current.is_some());
    seen.remembered = Some([ca.fingerprint().to_string()].into());
    let remade = decide(&seen, &policy, &model, DAY);
    let AuthorityStep::WriteSecret(stored) = &remade.steps[0] else {
        panic!("{:?}", remade.steps)
    };
    assert_eq!(fingerprints(&stored.previous), [ca.fingerprint()]);
}

#[test]
fn a_ca_made_after_a_lost_write_is_not_made_twice() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let due = due_of(&seen, &policy);
    seen.injected = Some(BTreeSet::new());
    let rotation = decide(&seen, &policy, &model, due);
    // The operator stops after storing the next CA, before publishing it.
    let AuthorityStep::WriteSecret(stored) = &rotation.steps[0] else {
        panic!("{:?}", rotation.steps)
    };
    seen.secret = CaSecretState::Valid(Box::new(stored.clone()));
    let resumed = plan(&seen, &policy, at(due + 60), &NoMint).unwrap();
    let [AuthorityStep::WriteBundle(published)] = resumed.steps.as_slice() else {
        panic!("{:?}", resumed.steps)
    };
    assert!(
        published
            .certificates
            .contains(&stored.next.as_ref().unwrap().certificate)
    );
}

#[test]
fn a_bundle_configmap_deleted_or_edited_is_written_again_from_the_secret() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let seen = started(&policy, &model);
    let published = seen.bundle.present().unwrap().clone();
    // Not a CA: nothing to keep (a CA only the bundle holds is kept, see
    // `a_ca_only_the_published_bundle_holds_stays_while_in_use_then_for_the_propagation_time`).
    let signer = secret(&seen).current.clone().unwrap();
    let stranger = model
        .issue(&signer, &LeafSpec::new("web", Usage::Server))
        .unwrap()
        .certificate;
    let cases = [
        (BundleState::Absent, "configmap doesn't exist".to_string()),
        (
            BundleState::Unusable {
                reason: "ca-bundle.crt is missing or empty".into(),
            },
            "configmap is unusable: ca-bundle.crt is missing or empty".into(),
        ),
        (
            BundleState::Present(BundleConfigMap {
                certificates: vec![published.certificates[0].clone(), stranger.clone()],
                ..published.clone()
            }),
            format!(
                "CA serial {} removed: not a CA of this CertificateAuthority",
                stranger.serial()
            ),
        ),
        (
            BundleState::Present(BundleConfigMap {
                annotations: TlsAnnotations::default(),
                ..published.clone()
            }),
            "its content or annotations differ from the CA's".into(),
        ),
    ];
    for (bundle, why) in cases {
        let seen = AuthorityObserved {
            bundle,
            ..seen.clone()
        };
        let fixed = plan(&seen, &policy, at(DAY), &NoMint).unwrap();
        assert_eq!(
            fixed.steps,
            [AuthorityStep::WriteBundle(published.clone())],
            "{why}"
        );
        assert!(
            fixed.events[0].note.ends_with(&why),
            "{}",
            fixed.events[0].note
        );
    }
}

/// A CA in the published bundle and not in the Secret (a backup restored, a CA swapped into
/// the Secret): certificates it signed may be served, so it stays trusted while one is, then
/// for the propagation time, as any older CA; a leaf there is never kept.
#[test]
fn a_ca_only_the_published_bundle_holds_stays_while_in_use_then_for_the_propagation_time() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let signer = secret(&seen).current.clone().unwrap();
    let restored = model.ca_cert("restored", 50);
    let leaf = model
        .issue(&signer, &LeafSpec::new("web", Usage::Server))
        .unwrap()
        .certificate;
    let mut published = seen.bundle.present().unwrap().clone();
    published
        .certificates
        .extend([restored.clone(), leaf.clone()]);
    seen.bundle = BundleState::Present(published);
    seen.in_use = BTreeSet::from([
        restored.fingerprint().to_string(),
        leaf.fingerprint().to_string(),
    ]);
    let kept = decide(&seen, &policy, &model, DAY);
    apply(&mut seen, &kept);
    assert_eq!(
        fingerprints(&secret(&seen).previous),
        [restored.fingerprint()]
    );
    let bundle = seen.bundle.present().unwrap();
    assert!(bundle.certificates.contains(&restored), "still trusted");
    assert!(!bundle.certificates.contains(&leaf), "a leaf is not a CA");
    assert_settled(&seen, &policy, DAY);

    // No certificate is signed by it any more: it goes once the propagation time has passed.
    seen.in_use.clear();
    let counting = decide(&seen, &policy, &model, 2 * DAY);
    apply(&mut seen, &counting);
    assert!(
        seen.bundle
            .present()
            .unwrap()
            .certificates
            .contains(&restored)
    );
    assert_eq!(counting.wake_at, Some(at(2 * DAY) + PROP));
    let gone = decide(&seen, &policy, &model, 2 * DAY + 300);
    apply(&mut seen, &gone);
    assert!(
        !seen
            .bundle
            .present()
            .unwrap()
            .certificates
            .contains(&restored)
    );
    assert!(secret(&seen).previous.is_empty());

    // Candidates for telling what is in use include what only the bundle holds.
    let mut seen = started(&policy, &Model::new(at(0)));
    let mut published = seen.bundle.present().unwrap().clone();
    published.certificates.push(restored.clone());
    seen.bundle = BundleState::Present(published);
    let candidates = in_use_candidates(&seen, at(DAY));
    assert!(candidates.bundle.unwrap().contains(restored.fingerprint()));
}

/// Real CA Secrets spoiled in each way a person or a bug could.
fn spoiled() -> Vec<(&'static str, Data, &'static str)> {
    let ca = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let other = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let leaf = ca
        .authority()
        .unwrap()
        .issue(&LeafSpec::new("leaf", Usage::Server))
        .unwrap();
    let good = CaSecret {
        current: Some(ca.clone()),
        ..CaSecret::default()
    };
    let mut data = BTreeMap::new();
    good.data().apply_to(&mut data);
    let with = |changes: &[(&str, Option<&str>)]| {
        let mut d = data.clone();
        for (k, v) in changes {
            match v {
                Some(v) => d.insert(k.to_string(), v.as_bytes().to_vec()),
                None => d.remove(*k),
            };
        }
        d
    };
    let leaf_key = leaf.key.as_ref().unwrap().to_pem();
    vec![
        (
            "another key",
            with(&[(TLS_KEY, Some(other.key.expose()))]),
            "does not belong to the certificate",
        ),
        (
            "garbage certificate",
            with(&[(
                TLS_CRT,
                Some("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"),
            )]),
            "tls.crt/tls.key:",
        ),
        (
            "a leaf for a CA",
            with(&[
                (TLS_CRT, Some(leaf.certificate_pem.as_str())),
                (TLS_KEY, Some(leaf_key.as_str())),
            ]),
            "is not a CA certificate",
        ),
        (
            "half a pair",
            with(&[(TLS_KEY, None)]),
            "tls.key is missing or empty while tls.crt is set",
        ),
        (
            "half a next pair",
            with(&[(NEXT_CRT, Some(other.certificate.pem()))]),
            "next.key is missing or empty while next.crt is set",
        ),
        (
            "a key among previous CAs",
            with(&[(PREVIOUS_CRT, Some(other.key.expose()))]),
            "previous.crt:",
        ),
        (
            "emptied",
            with(&[(TLS_CRT, Some("")), (TLS_KEY, Some(""))]),
            "tls.crt and tls.key are empty",
        ),
    ]
}

#[test]
fn a_tampered_ca_secret_is_never_regenerated_nor_written() {
    let policy = policy();
    let last_good = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let now = OffsetDateTime::now_utc();
    for (what, data, says) in spoiled() {
        let state = CaSecretState::observe(Some((&data, &BTreeMap::new())));
        let CaSecretState::Invalid { reason } = &state else {
            panic!("{what}: {state:?}")
        };
        assert!(reason.contains(says), "{what}: {reason}");
        for key in data.values() {
            let key = String::from_utf8_lossy(key);
            if key.contains("PRIVATE KEY") {
                assert!(
                    !reason.contains(key.lines().nth(1).unwrap()),
                    "{what}: {reason}"
                );
            }
        }
        let mut seen = AuthorityObserved {
            secret: state,
            last_good: Some(last_good.clone()),
            remembered: None,
            ..nothing()
        };
        let kept = plan(&seen, &policy, now, &NoMint).unwrap();
        assert!(kept.steps.is_empty(), "{what}");
        assert_eq!(kept.wake_at, None);
        assert_eq!(
            kept.issuer.signer,
            Ok(last_good.clone()),
            "{what}: the last good CA signs"
        );
        assert!(kept.status.degraded.status);
        assert_eq!(kept.status.degraded.reason, names::REASON_CA_SECRET_INVALID);
        assert!(kept.status.ready.status, "{what}");
        let [warning] = kept.events.as_slice() else {
            panic!("{what}: {:?}", kept.events)
        };
        assert_eq!(warning.type_, EventType::Warning);
        assert_eq!(warning.reason, names::EVENT_CA_SECRET_INVALID);
        assert_eq!(warning.note, kept.status.degraded.message);
        assert!(
            warning.note.contains("nothing was regenerated"),
            "{}",
            warning.note
        );

        // Said once.
        seen.reported_degraded = Some(kept.status.degraded.message.clone());
        assert!(
            plan(&seen, &policy, now, &NoMint)
                .unwrap()
                .events
                .is_empty()
        );
        // After a restart there is no last good CA: nothing signs, still nothing written.
        seen.last_good = None;
        let restarted = plan(&seen, &policy, now, &NoMint).unwrap();
        assert!(restarted.steps.is_empty());
        assert!(!restarted.status.ready.status);
        let Err(no) = &restarted.issuer.signer else {
            panic!("{what}")
        };
        assert!(no.degraded);
    }
}

#[test]
fn a_ca_secret_reads_back_as_written() {
    let now = OffsetDateTime::now_utc().replace_nanosecond(0).unwrap();
    let [current, next, old] =
        ["a", "b", "c"].map(|cn| PkiMint.create_ca(&CaSpec::new(cn)).unwrap());
    let written = CaSecret {
        annotations: annotations_of(Some(&current)),
        current: Some(current),
        next: Some(next),
        previous: vec![old.certificate.clone()],
        next_trusted_at: Some(now),
        unused_since: BTreeMap::from([(old.fingerprint().to_string(), now)]),
    };
    let mut data = BTreeMap::new();
    written.data().apply_to(&mut data);
    let mut annotations = BTreeMap::from([("kept".to_string(), "yes".to_string())]);
    written.annotation_changes().apply_to(&mut annotations);
    assert_eq!(annotations.get("kept").map(String::as_str), Some("yes"));
    assert_eq!(
        CaSecretState::observe(Some((&data, &annotations))),
        CaSecretState::Valid(Box::new(written.clone()))
    );
    // Nothing signs: empty tls.* read back as no current CA.
    let waiting = CaSecret {
        current: None,
        annotations: TlsAnnotations::default(),
        ..written
    };
    let mut data = BTreeMap::new();
    waiting.data().apply_to(&mut data);
    let mut annotations = BTreeMap::new();
    waiting.annotation_changes().apply_to(&mut annotations);
    assert_eq!(
        CaSecretState::observe(Some((&data, &annotations))),
        CaSecretState::Valid(Box::new(waiting))
    );
    assert_eq!(CaSecretState::observe(None), CaSecretState::Absent);
}

#[test]
fn library_go_annotations_have_library_gos_formats() {
    let ca = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let a = annotations_of(Some(&ca));
    let rfc3339 = time::format_description::well_known::Rfc3339;
    let not_after = a.not_after.unwrap();
    assert!(not_after.ends_with('Z'), "{not_after}");
    assert_eq!(
        OffsetDateTime::parse(&not_after, &rfc3339).unwrap(),
        ca.certificate.not_after()
    );
    assert_eq!(a.issuer.as_deref(), Some("webhooks-ca"));
    assert_eq!(a.hostnames, None);
    let changes = annotations_of(Some(&ca)).changes();
    assert!(changes.get(names::CERTIFICATE_NOT_BEFORE).is_some());
    assert_eq!(changes.get(names::CERTIFICATE_HOSTNAMES), Some(None));
}

#[test]
fn no_private_key_in_a_plan_event_or_status() {
    let policy = policy();
    let seen = nothing();
    let now = OffsetDateTime::now_utc();
    let first = plan(&seen, &policy, now, &PkiMint).unwrap();
    let AuthorityStep::WriteSecret(stored) = &first.steps[0] else {
        panic!()
    };
    let key = stored.current.as_ref().unwrap().key.expose();
    let body = key.lines().nth(1).unwrap();
    let shown = format!("{first:?} {:?} {:?}", first.events, first.status);
    assert!(!shown.contains(body), "a key printed");
    assert!(shown.contains("KeyPem(<redacted>)"));
}

#[test]
fn a_ca_expired_before_its_successor_is_trusted_signs_nothing() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let old = secret(&seen).current.clone().unwrap();
    seen.injected = Some(BTreeSet::new());
    let expiry = (old.certificate.not_after() - at(0)).whole_seconds();
    let late = decide(&seen, &policy, &model, expiry + 1);
    assert!(
        late.events[0].note.contains("already expired"),
        "{}",
        late.events[0].note
    );
    apply(&mut seen, &late);
    let status = plan(&seen, &policy, at(expiry + 2), &NoMint).unwrap();
    assert_eq!(status.status.ready.reason, names::REASON_EXPIRED);
    assert!(status.issuer.signer.is_err());
}

#[test]
fn a_ca_signs_nothing_from_its_not_after_on_as_pki_refuses_then() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let seen = started(&policy, &model);
    let ca = secret(&seen).current.clone().unwrap();
    let expiry = (ca.certificate.not_after() - at(0)).whole_seconds();
    let before = IssuerView::observed(&seen, at(expiry - 1));
    assert!(before.signer.is_ok(), "it signs until its last second");
    let at_expiry = IssuerView::observed(&seen, at(expiry));
    assert!(
        at_expiry.signer.is_err(),
        "pki refuses to sign at notAfter itself"
    );
    // Trusted until then, though: the bundle still holds it.
    assert!(at_expiry.bundle.unwrap().contains(ca.fingerprint()));
}

#[test]
fn after_a_long_pause_a_trusted_next_ca_is_promoted_and_if_due_rotated_in_the_same_pass() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let mut seen = started(&policy, &model);
    let old = secret(&seen).current.clone().unwrap();
    let first_due = due_of(&seen, &policy);
    let rotation = decide(&seen, &policy, &model, first_due);
    apply(&mut seen, &rotation);
    let next = secret(&seen).next.clone().unwrap();
    assert!(secret(&seen).next_trusted_at.is_some());
    // The operator (or the Secret, tampered with) was away until the next CA is itself due.
    let next_due =
        (due(&policy.rotation, &policy.ca.validity, &next.certificate) - at(0)).whole_seconds();
    seen.injected = Some(BTreeSet::from([next.fingerprint().to_string()]));
    let back = decide(&seen, &policy, &model, next_due + 60);
    let secrets: Vec<&CaSecret> = back
        .steps
        .iter()
        .filter_map(|s| match s {
            AuthorityStep::WriteSecret(s) => Some(s),
            AuthorityStep::WriteBundle(_) => None,
        })
        .collect();
    let last = secrets.last().unwrap();
    assert_eq!(last.current, Some(next.clone()), "promoted");
    let newest = last.next.clone().expect("and rotated at once");
    assert!(
        !last.previous.contains(&old.certificate),
        "the expired CA is gone"
    );
    assert_eq!(
        last.next_trusted_at, None,
        "the newest CA is not in the injection point yet"
    );
    let published = back
        .steps
        .iter()
        .rev()
        .find_map(|s| match s {
            AuthorityStep::WriteBundle(b) => Some(b),
            AuthorityStep::WriteSecret(_) => None,
        })
        .unwrap();
    assert!(published.certificates.contains(&newest.certificate));
    assert_eq!(back.issuer.signer, Ok(next));
    assert_eq!(model.log.borrow().len(), 3);
    apply(&mut seen, &back);
    assert_settled(&seen, &policy, next_due + 60);
}

#[test]
fn while_a_certificate_is_missing_no_older_ca_starts_counting_as_unused() {
    let (policy, model) = (policy(), Model::new(at(0)));
    let (mut seen, old, t) = rotated(&policy, &model);
    // The one certificate's Secret is gone: its workload may still serve what the old CA
    // signed, until a new certificate is issued and taken up.
    seen.in_use.clear();
    seen.certificates_missing = true;
    let waiting = decide(&seen, &policy, &model, t + DAY);
    assert!(waiting.writes_nothing(), "{:?}", waiting.steps);
    assert!(decide(&seen, &policy, &model, t + 2 * DAY).writes_nothing());
    // Issued again: from then on it counts.
    seen.certificates_missing = false;
    let counting = decide(&seen, &policy, &model, t + 2 * DAY);
    let [AuthorityStep::WriteSecret(recorded)] = counting.steps.as_slice() else {
        panic!("{:?}", counting.steps)
    };
    assert_eq!(
        recorded.unused_since.get(old.fingerprint()),
        Some(&at(t + 2 * DAY))
    );
    // A CA already counting goes on while a certificate goes missing.
    apply(&mut seen, &counting);
    seen.certificates_missing = true;
    let gone = decide(&seen, &policy, &model, t + 2 * DAY + 300);
    assert!(
        matches!(gone.steps.as_slice(), [AuthorityStep::WriteSecret(s), _] if s.previous.is_empty())
    );
}

/// A CA asked to live `1m` is due 48 s after it is made (80%), not at once: its 5 minutes of
/// backdating are no part of its lifetime.
#[test]
fn a_short_lived_ca_is_not_due_the_moment_it_is_made() {
    let policy = AuthorityPolicy {
        ca: CaSpec {
            validity: "1m".parse().unwrap(),
            ..CaSpec::new("webhooks-ca")
        },
        rotation: RotationPolicy::fraction(0.8).unwrap(),
        trust_propagation: Duration::from_secs(5),
    };
    let model = Model::new(at(0));
    let seen = started(&policy, &model);
    let ca = secret(&seen).current.clone().unwrap();
    assert_eq!(ca.certificate.not_before(), at(-300));
    assert_eq!(due_of(&seen, &policy), 48);
    assert!(decide(&seen, &policy, &model, 47).writes_nothing());
    assert_eq!(model.log.borrow().len(), 1, "one CA");
}
