//! Each trigger of a new certificate, on model certificates where time passes and on real ones
//! where Secrets are read.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::*;
use crate::authority::PkiMint;
use crate::authority::model::{Model, at};
use crate::authority::verified::Verified;
use caretaker_pki::{CaSpec, LeafSpec, RotationPolicy, Ttl};

const DAY: i64 = 86_400;

/// An edit of library-go's annotations.
type Edit = fn(&mut TlsAnnotations);

fn policy() -> CertificatePolicy {
    CertificatePolicy {
        leaf: LeafSpec::new("webhook.demo.svc", Usage::Server)
            .with_dns_names(["webhook.demo.svc", "webhook.demo.svc.cluster.local"])
            .with_ip_addresses(["127.0.0.1".parse::<IpAddr>().unwrap()])
            .with_validity(Ttl::calendar(0, 0, 30).unwrap()),
        rotation: RotationPolicy::fraction(0.8).unwrap(),
    }
}

fn name() -> ObjectName {
    ObjectName::new("demo", "webhook-server-tls")
}

fn absent() -> LeafObserved {
    LeafObserved {
        secret_name: name(),
        secret: LeafSecretState::Absent,
    }
}

/// The issuer of `ca`, trusting `also` besides.
fn issuer_of(ca: &CaKeyPair, also: &[&Certificate]) -> IssuerView {
    IssuerView {
        signer: Ok(ca.clone()),
        bundle: Some(Bundle::of(
            std::iter::once(&ca.certificate)
                .chain(also.iter().copied())
                .cloned(),
            ca.certificate.not_before(),
        )),
    }
}

struct NoMint;

impl Mint for NoMint {
    fn create_ca(&self, _: &caretaker_pki::CaSpec) -> Result<CaKeyPair, PkiError> {
        panic!("a certificate decision made a CA")
    }
    fn issue(&self, _: &CaKeyPair, _: &LeafSpec) -> Result<IssuedLeaf, PkiError> {
        panic!("a certificate was issued where none may be")
    }
}

fn decide(
    seen: &LeafObserved,
    policy: &CertificatePolicy,
    issuer: &IssuerView,
    model: &Model,
    now: i64,
) -> LeafPlan {
    model.set_now(at(now));
    plan(seen, policy, issuer, at(now), model).unwrap()
}

fn apply(seen: &mut LeafObserved, plan: &LeafPlan) {
    for step in &plan.steps {
        seen.secret = seen.secret.after(step);
    }
}

fn assert_settled(seen: &LeafObserved, policy: &CertificatePolicy, issuer: &IssuerView, now: i64) {
    let again = plan(seen, policy, issuer, at(now), &NoMint).unwrap();
    assert!(again.steps.is_empty(), "wrote again: {:?}", again.steps);
    assert!(again.events.is_empty(), "said again: {:?}", again.events);
}

/// The one reason a pass gives for a new certificate.
fn reasons_of(plan: &LeafPlan) -> String {
    let [event] = plan.events.as_slice() else {
        panic!("{:?}", plan.events)
    };
    assert_eq!(event.reason, names::EVENT_TARGET_UPDATE_REQUIRED);
    assert!(matches!(plan.steps.as_slice(), [CertificateStep::Issue(_)]));
    event
        .note
        .strip_prefix(r#""webhook-server-tls" in "demo" requires a new target cert/key pair: "#)
        .unwrap_or_else(|| panic!("{}", event.note))
        .to_string()
}

fn secret(seen: &LeafObserved) -> &LeafSecret {
    match &seen.secret {
        LeafSecretState::Present(s) => s,
        LeafSecretState::Absent => panic!("absent"),
    }
}

/// A certificate issued at time 0 by a one-year CA, settled.
fn issued(model: &Model) -> (LeafObserved, CaKeyPair, IssuerView) {
    let ca = model.ca("webhooks-ca", 365);
    let issuer = issuer_of(&ca, &[]);
    let mut seen = absent();
    let first = decide(&seen, &policy(), &issuer, model, 0);
    apply(&mut seen, &first);
    assert_settled(&seen, &policy(), &issuer, 0);
    (seen, ca, issuer)
}

#[test]
fn a_missing_secret_gets_a_certificate_from_the_ca_that_signs_now() {
    let model = Model::new(at(0));
    let ca = model.ca("webhooks-ca", 365);
    let old = model.ca_cert("webhooks-ca", 200);
    let issuer = issuer_of(&ca, &[&old]);
    let first = decide(&absent(), &policy(), &issuer, &model, 0);
    assert_eq!(reasons_of(&first), "secret doesn't exist");
    let CertificateStep::Issue(written) = &first.steps[0] else {
        unreachable!()
    };
    assert_eq!(written.issuer, ca.fingerprint());
    assert_eq!(written.ca_bundle, issuer.bundle.clone().unwrap());
    let a = &written.annotations;
    assert_eq!(a.issuer.as_deref(), Some("webhooks-ca"));
    assert_eq!(
        a.hostnames.as_deref(),
        Some("127.0.0.1,webhook.demo.svc,webhook.demo.svc.cluster.local")
    );
    assert_eq!(a.not_after.as_deref(), Some("2026-01-31T00:00:00Z"));
    assert_eq!(a.not_before.as_deref(), Some("2025-12-31T23:55:00Z"));
    let data = first.steps[0].data();
    assert_eq!(
        data.get(TLS_CRT),
        Some(Some(written.leaf.certificate.pem()))
    );
    assert_eq!(
        data.get(CA_CRT),
        Some(Some(issuer.bundle.as_ref().unwrap().text().as_str()))
    );
    assert!(first.status.ready.status);
    let due_at = due(
        &policy().rotation,
        &policy().leaf.validity,
        &written.leaf.certificate,
    );
    assert_eq!(first.wake_at, Some(due_at));
    assert_eq!(first.status.next_rotation, Some(due_at));

    let mut seen = absent();
    apply(&mut seen, &first);
    assert_settled(&seen, &policy(), &issuer, 0);
}

#[test]
fn a_certificate_is_issued_again_when_due_and_not_a_second_before() {
    let model = Model::new(at(0));
    let (seen, _, issuer) = issued(&model);
    let certificate = secret(&seen).certificate.clone().unwrap();
    let due_at =
        (due(&policy().rotation, &policy().leaf.validity, &certificate) - at(0)).whole_seconds();
    let early = decide(&seen, &policy(), &issuer, &model, due_at - 1);
    assert!(early.writes_nothing());
    assert_eq!(early.wake_at, Some(at(due_at)));
    let due = decide(&seen, &policy(), &issuer, &model, due_at);
    let why = reasons_of(&due);
    assert!(why.starts_with("expiring: past its refresh time"), "{why}");
    assert!(why.ends_with("(80% of its validity)"), "{why}");
    let expired = (certificate.not_after() - at(0)).whole_seconds() + 1;
    let why = reasons_of(&decide(&seen, &policy(), &issuer, &model, expired));
    assert!(why.starts_with("already expired"), "{why}");
}

#[test]
fn a_certificate_from_another_ca_than_the_one_that_signs_now_is_issued_again() {
    let model = Model::new(at(0));
    let (seen, old, _) = issued(&model);
    let new = model.ca("webhooks-ca", 365);
    let rotated = issuer_of(&new, &[&old.certificate]);
    let plan = decide(&seen, &policy(), &rotated, &model, DAY);
    assert_eq!(
        reasons_of(&plan),
        format!(
            "issuer changed: signed by CA serial {}, the CA that signs now is serial {}",
            old.certificate.serial(),
            new.certificate.serial()
        )
    );
    let mut unknown = seen.clone();
    if let LeafSecretState::Present(s) = &mut unknown.secret {
        s.issuer = None;
    }
    assert_eq!(
        reasons_of(&decide(&unknown, &policy(), &rotated, &model, DAY)),
        "issuer changed: not signed by any CA its issuer trusts"
    );
}

#[test]
fn changed_names_usages_or_key_algorithm_issue_again() {
    let model = Model::new(at(0));
    let (seen, _, issuer) = issued(&model);
    let changed = |edit: fn(&mut LeafSpec)| {
        let mut policy = policy();
        edit(&mut policy.leaf);
        reasons_of(&decide(&seen, &policy, &issuer, &model, DAY))
    };
    assert_eq!(
        changed(|l| l.dns_names.push("extra.demo.svc".into())),
        r#"hostnames changed: "" are existing and not required, "extra.demo.svc" are required and not existing"#
    );
    assert_eq!(
        changed(|l| l.ip_addresses = vec!["10.0.0.1".parse().unwrap()]),
        r#"hostnames changed: "127.0.0.1" are existing and not required, "10.0.0.1" are required and not existing"#
    );
    assert_eq!(
        changed(|l| l.common_name = "other".into()),
        r#"common name changed: "webhook.demo.svc" -> "other""#
    );
    assert_eq!(
        changed(|l| l.usage = Usage::Both),
        "usages changed: server -> both"
    );
    assert_eq!(
        changed(|l| l.organizations = vec!["demo".into()]),
        r#"organizations changed: [] -> ["demo"]"#
    );
    assert_eq!(
        changed(|l| l.algorithm = caretaker_pki::KeyAlgorithm::Ed25519),
        "key algorithm changed: ecdsa-p256 -> ed25519"
    );
    // The same names in another order are the same names.
    assert!(
        decide(
            &seen,
            &CertificatePolicy {
                leaf: LeafSpec {
                    dns_names: vec![
                        "webhook.demo.svc.cluster.local".into(),
                        "webhook.demo.svc".into(),
                        "webhook.demo.svc".into()
                    ],
                    ..policy().leaf
                },
                ..policy()
            },
            &issuer,
            &model,
            DAY
        )
        .writes_nothing()
    );
}

#[test]
fn a_missing_or_foreign_key_issues_again() {
    let model = Model::new(at(0));
    let (seen, _, issuer) = issued(&model);
    for (key, why) in [
        (KeyState::Missing, "key missing"),
        (KeyState::Mismatch, "key not matching the certificate"),
        (
            KeyState::Unreadable("not a usable private key: bad".into()),
            "key unreadable: not a usable private key: bad",
        ),
    ] {
        let mut spoiled = seen.clone();
        if let LeafSecretState::Present(s) = &mut spoiled.secret {
            s.key = key;
        }
        assert_eq!(
            reasons_of(&decide(&spoiled, &policy(), &issuer, &model, DAY)),
            why
        );
    }
    let mut chained = seen.clone();
    if let LeafSecretState::Present(s) = &mut chained.secret {
        s.extra_certificates = 1;
    }
    assert_eq!(
        reasons_of(&decide(&chained, &policy(), &issuer, &model, DAY)),
        "tls.crt holds 1 certificates after the leaf"
    );
    let mut unreadable = seen.clone();
    if let LeafSecretState::Present(s) = &mut unreadable.secret {
        s.certificate = Err("certificate missing".into());
    }
    assert_eq!(
        reasons_of(&decide(&unreadable, &policy(), &issuer, &model, DAY)),
        "certificate missing"
    );
}

#[test]
fn removing_or_editing_a_library_go_annotation_issues_again() {
    let model = Model::new(at(0));
    let (seen, _, issuer) = issued(&model);
    let cases: [(Edit, &str); 7] = [
        (|a| a.not_after = None, "missing notAfter"),
        (|a| a.not_before = None, "missing notBefore"),
        (
            |a| a.not_after = Some("later".into()),
            r#"bad expiry: "later""#,
        ),
        (
            |a| a.not_before = Some("2025-01-01T00:00:00Z".into()),
            r#"notBefore annotation "2025-01-01T00:00:00Z" does not say what the certificate says (2025-12-31T23:55:00Z)"#,
        ),
        (|a| a.issuer = None, "missing issuer name"),
        (
            |a| a.issuer = Some("other".into()),
            r#"issuer annotation "other" does not name the issuer "webhooks-ca""#,
        ),
        (|a| a.hostnames = None, "missing hostnames"),
    ];
    for (edit, why) in cases {
        let mut edited = seen.clone();
        if let LeafSecretState::Present(s) = &mut edited.secret {
            edit(&mut s.annotations);
        }
        let plan = decide(&edited, &policy(), &issuer, &model, DAY);
        assert_eq!(reasons_of(&plan), why);
        apply(&mut edited, &plan);
        assert_settled(&edited, &policy(), &issuer, DAY);
    }
}

#[test]
fn client_certificates_carry_no_hostnames_annotation() {
    let model = Model::new(at(0));
    let ca = model.ca("webhooks-ca", 365);
    let issuer = issuer_of(&ca, &[]);
    let policy = CertificatePolicy {
        leaf: LeafSpec::new("client", Usage::Client),
        ..policy()
    };
    let mut seen = absent();
    let first = decide(&seen, &policy, &issuer, &model, 0);
    let CertificateStep::Issue(written) = &first.steps[0] else {
        unreachable!()
    };
    assert_eq!(written.annotations.hostnames, None);
    assert_eq!(
        first.steps[0]
            .annotation_changes()
            .get(names::CERTIFICATE_HOSTNAMES),
        Some(None),
        "removed if a serving certificate left one"
    );
    apply(&mut seen, &first);
    assert_settled(&seen, &policy, &issuer, 0);
}

#[test]
fn a_stale_ca_crt_alone_is_rewritten_and_the_key_kept() {
    let model = Model::new(at(0));
    let (mut seen, ca, _) = issued(&model);
    let next = model.ca_cert("webhooks-ca", 365);
    let trusting = issuer_of(&ca, &[&next]);
    let plan = plan(&seen, &policy(), &trusting, at(DAY), &NoMint).unwrap();
    let [CertificateStep::UpdateCaBundle(bundle)] = plan.steps.as_slice() else {
        panic!("{:?}", plan.steps)
    };
    assert_eq!(Some(bundle), trusting.bundle.as_ref());
    let data = plan.steps[0].data();
    assert_eq!(data.iter().map(|(k, _)| k).collect::<Vec<_>>(), [CA_CRT]);
    assert!(plan.steps[0].annotation_changes().is_empty());
    let [event] = plan.events.as_slice() else {
        panic!("{:?}", plan.events)
    };
    assert_eq!(event.reason, names::EVENT_CA_BUNDLE_UPDATE_REQUIRED);
    assert_eq!(
        event.note,
        format!(
            r#""webhook-server-tls" in "demo" requires a new ca.crt: CA serial {} added"#,
            next.serial()
        )
    );
    apply(&mut seen, &plan);
    assert_settled(&seen, &policy(), &trusting, DAY);
}

#[test]
fn a_certificate_cut_at_its_cas_expiry_waits_for_the_cas_successor() {
    let model = Model::new(at(0));
    let ca = model.ca("webhooks-ca", 10);
    let issuer = issuer_of(&ca, &[]);
    let mut seen = absent();
    let first = decide(&seen, &policy(), &issuer, &model, 0);
    apply(&mut seen, &first);
    let certificate = secret(&seen).certificate.clone().unwrap();
    assert_eq!(
        certificate.not_after(),
        ca.certificate.not_after(),
        "cut at the CA's"
    );
    let due_at =
        (due(&policy().rotation, &policy().leaf.validity, &certificate) - at(0)).whole_seconds();
    // Due, but a new certificate from the same CA would expire no later.
    let waiting = plan(&seen, &policy(), &issuer, at(due_at), &NoMint).unwrap();
    assert!(waiting.writes_nothing());
    assert_eq!(
        waiting.wake_at,
        Some(certificate.not_after() + time::Duration::SECOND)
    );
    // Its successor signs: a new certificate at once.
    let next = model.ca("webhooks-ca", 365);
    let why = reasons_of(&decide(
        &seen,
        &policy(),
        &issuer_of(&next, &[&ca.certificate]),
        &model,
        due_at,
    ));
    assert!(why.starts_with("expiring: "), "{why}");
    assert!(why.contains("; issuer changed: "), "{why}");
}

#[test]
fn a_needed_certificate_waits_while_nothing_signs() {
    let model = Model::new(at(0));
    let (seen, ca, _) = issued(&model);
    let certificate = secret(&seen).certificate.clone().unwrap();
    let due_at =
        (due(&policy().rotation, &policy().leaf.validity, &certificate) - at(0)).whole_seconds();
    let next = model.ca_cert("webhooks-ca", 365);
    for degraded in [false, true] {
        let no_signer = IssuerView {
            signer: Err(NoSigner {
                message: "nothing signs".into(),
                degraded,
            }),
            bundle: Some(Bundle::of([ca.certificate.clone(), next.clone()], at(0))),
        };
        // Due: the certificate still works; only the bundle is followed.
        let due = plan(&seen, &policy(), &no_signer, at(due_at), &NoMint).unwrap();
        assert!(matches!(
            due.steps.as_slice(),
            [CertificateStep::UpdateCaBundle(_)]
        ));
        assert!(due.status.ready.status, "still usable");
        assert!(due.status.ready.message.contains("nothing signs"));
        assert_eq!(due.status.degraded.status, degraded);
        assert_eq!(
            due.wake_at,
            Some(ca.certificate.not_after() + time::Duration::SECOND),
            "only when its bundle changes by itself"
        );
        // No certificate at all: not ready.
        let none = plan(&absent(), &policy(), &no_signer, at(due_at), &NoMint).unwrap();
        assert!(none.steps.is_empty());
        assert!(!none.status.ready.status);
        assert_eq!(none.status.ready.reason, names::REASON_WAITING_FOR_ISSUER);
    }
}

/// Writing what a plan says and reading it back gives what the model says it gives (the
/// timeline tests rely on that), for real certificates and keys.
#[test]
fn a_written_certificate_reads_back_as_the_model_says() {
    let ca = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let old = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let now = OffsetDateTime::now_utc();
    let issuer = IssuerView {
        signer: Ok(ca.clone()),
        bundle: Some(Bundle::of(
            [ca.certificate.clone(), old.certificate.clone()],
            now,
        )),
    };
    for policy in [
        policy(),
        CertificatePolicy {
            leaf: LeafSpec::new("client", Usage::Client),
            ..policy()
        },
    ] {
        let first = plan(&absent(), &policy, &issuer, now, &PkiMint).unwrap();
        let [step] = first.steps.as_slice() else {
            panic!("{:?}", first.steps)
        };
        let mut data = BTreeMap::new();
        step.data().apply_to(&mut data);
        let mut annotations = BTreeMap::new();
        step.annotation_changes().apply_to(&mut annotations);
        let serving = serving(policy.leaf.usage);
        let candidates = issuer.bundle.as_ref().unwrap().certificates();
        let read = LeafSecretState::observe(
            Some((&data, &annotations)),
            serving,
            candidates,
            &Verified::default(),
        );
        assert_eq!(read, LeafSecretState::Absent.after(step));
        let seen = LeafObserved {
            secret_name: name(),
            secret: read,
        };
        let again = plan(&seen, &policy, &issuer, now, &NoMint).unwrap();
        assert!(again.writes_nothing(), "{:?}", again.events);
        let shown = format!("{first:?}");
        let CertificateStep::Issue(issued) = step else {
            unreachable!()
        };
        let body = issued.leaf.key.expose().lines().nth(1).unwrap();
        assert!(!shown.contains(body), "a key printed");
    }
}

/// An empty validity annotation, on a certificate Secret or a CA Secret, reads as missing:
/// library-go's forced rotation with its reason, not `bad expiry: ""`.
#[test]
fn an_empty_validity_annotation_reads_as_missing() {
    let ca = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let now = OffsetDateTime::now_utc();
    let issuer = IssuerView::of(
        &crate::authority::ca::CaSecret {
            current: Some(ca.clone()),
            ..Default::default()
        },
        now,
    );
    let first = plan(&absent(), &policy(), &issuer, now, &PkiMint).unwrap();
    let [step] = first.steps.as_slice() else {
        panic!("{:?}", first.steps)
    };
    let mut data = BTreeMap::new();
    step.data().apply_to(&mut data);
    for (key, reason) in [
        (names::CERTIFICATE_NOT_AFTER, "missing notAfter"),
        (names::CERTIFICATE_NOT_BEFORE, "missing notBefore"),
    ] {
        let mut annotations = BTreeMap::new();
        step.annotation_changes().apply_to(&mut annotations);
        annotations.insert(key.to_string(), String::new());
        let candidates = issuer.bundle.as_ref().unwrap().certificates();
        let seen = LeafObserved {
            secret_name: name(),
            secret: LeafSecretState::observe(
                Some((&data, &annotations)),
                true,
                candidates,
                &Verified::default(),
            ),
        };
        let again = plan(&seen, &policy(), &issuer, now, &PkiMint).unwrap();
        assert_eq!(reasons_of(&again), reason);

        // The CA Secret's: a rotation, for the same reason.
        let mut ca_data = BTreeMap::new();
        let stored = crate::authority::ca::CaSecret {
            current: Some(ca.clone()),
            annotations: TlsAnnotations::describing(&ca.certificate, "webhooks-ca", false),
            ..Default::default()
        };
        stored.data().apply_to(&mut ca_data);
        let mut ca_annotations = BTreeMap::new();
        stored.annotation_changes().apply_to(&mut ca_annotations);
        ca_annotations.insert(key.to_string(), " ".to_string());
        let crate::authority::ca::CaSecretState::Valid(read) =
            crate::authority::ca::CaSecretState::observe(Some((&ca_data, &ca_annotations)))
        else {
            panic!("a CA Secret with a blank annotation is still valid")
        };
        assert_eq!(
            read.annotations
                .validity_problem(&ca.certificate)
                .as_deref(),
            Some(reason)
        );
    }
}

#[test]
fn observing_finds_the_issuer_and_what_is_wrong_without_echoing_keys() {
    let ca = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let stranger = PkiMint.create_ca(&CaSpec::new("webhooks-ca")).unwrap();
    let leaf = PkiMint.issue(&ca, &policy().leaf).unwrap();
    let other = PkiMint.issue(&ca, &policy().leaf).unwrap();
    let observe = |changes: &[(&str, Option<String>)], issuers: &[&Certificate]| {
        let mut data = BTreeMap::from([
            (
                TLS_CRT.to_string(),
                leaf.certificate.pem().as_bytes().to_vec(),
            ),
            (TLS_KEY.to_string(), leaf.key.expose().as_bytes().to_vec()),
        ]);
        for (k, v) in changes {
            match v {
                Some(v) => data.insert(k.to_string(), v.clone().into_bytes()),
                None => data.remove(*k),
            };
        }
        match LeafSecretState::observe(
            Some((&data, &BTreeMap::new())),
            true,
            issuers.iter().copied(),
            &Verified::default(),
        ) {
            LeafSecretState::Present(s) => s,
            LeafSecretState::Absent => unreachable!(),
        }
    };
    let good = observe(&[], &[&stranger.certificate, &ca.certificate]);
    assert_eq!(good.issuer.as_deref(), Some(ca.fingerprint()));
    assert_eq!(
        good.key,
        KeyState::Matches(caretaker_pki::KeyAlgorithm::EcdsaP256)
    );
    assert_eq!(good.ca_bundle, None);
    assert_eq!(observe(&[], &[&stranger.certificate]).issuer, None);

    let chain = format!("{}{}", leaf.certificate.pem(), ca.certificate.pem());
    assert_eq!(
        observe(&[(TLS_CRT, Some(chain))], &[]).extra_certificates,
        1
    );
    assert_eq!(
        observe(&[(TLS_KEY, Some(other.key.expose().into()))], &[]).key,
        KeyState::Mismatch
    );
    assert_eq!(observe(&[(TLS_KEY, None)], &[]).key, KeyState::Missing);
    let garbage = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0c2VjcmV0\n-----END PRIVATE KEY-----\n";
    match observe(&[(TLS_KEY, Some(garbage.into()))], &[]).key {
        KeyState::Unreadable(why) => assert!(!why.contains("c2VjcmV0"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        observe(&[(TLS_CRT, None)], &[]).certificate,
        Err("certificate missing".into())
    );
    let as_ca = observe(&[(TLS_CRT, Some(ca.certificate.pem().into()))], &[]);
    assert_eq!(
        as_ca.certificate,
        Err("tls.crt holds a CA certificate, not a leaf".into())
    );
    let pasted = observe(&[(TLS_CRT, Some(garbage.into()))], &[]);
    let why = pasted.certificate.unwrap_err();
    assert!(why.starts_with("certificate unreadable:"), "{why}");
    assert!(!why.contains("c2VjcmV0"), "{why}");
    let bundled = observe(
        &[(
            CA_CRT,
            Some(format!(
                "{}{}",
                ca.certificate.pem(),
                stranger.certificate.pem()
            )),
        )],
        &[],
    );
    assert_eq!(
        bundled.ca_bundle,
        Some(vec![
            ca.fingerprint().to_string(),
            stranger.fingerprint().to_string()
        ])
    );
    assert_eq!(
        LeafSecretState::observe(None, true, [], &Verified::default()),
        LeafSecretState::Absent
    );
}

/// pki starts certificates 5 minutes early; a validity short beside that still counts from
/// the issuance: a `4s` certificate at 50% is due 2 s after it is issued, not at once (which
/// issued a new one on every pass, each write waking the next).
#[test]
fn a_short_validity_is_due_after_its_share_of_the_time_asked_not_at_once() {
    let policy = CertificatePolicy {
        leaf: policy().leaf.with_validity("4s".parse().unwrap()),
        rotation: RotationPolicy::fraction(0.5).unwrap(),
    };
    let model = Model::new(at(0));
    let ca = model.ca("webhooks-ca", 365);
    let issuer = issuer_of(&ca, &[]);
    let mut seen = absent();
    let first = decide(&seen, &policy, &issuer, &model, 0);
    let CertificateStep::Issue(written) = &first.steps[0] else {
        unreachable!()
    };
    assert_eq!(written.leaf.certificate.not_before(), at(-300), "backdated");
    assert_eq!(first.wake_at, Some(at(2)));
    assert_eq!(first.status.next_rotation, Some(at(2)));
    apply(&mut seen, &first);
    assert_settled(&seen, &policy, &issuer, 0);
    assert_settled(&seen, &policy, &issuer, 1);
    let again = decide(&seen, &policy, &issuer, &model, 2);
    assert!(
        reasons_of(&again).starts_with("expiring"),
        "{:?}",
        again.events
    );

    // Cut to its CA's expiry, a certificate's lifetime counts from its notBefore.
    let short_ca = model.ca("webhooks-ca", 10);
    let year = CertificatePolicy {
        leaf: policy
            .leaf
            .clone()
            .with_validity(Ttl::calendar(1, 0, 0).unwrap()),
        rotation: RotationPolicy::fraction(0.5).unwrap(),
    };
    let cut = decide(&absent(), &year, &issuer_of(&short_ca, &[]), &model, 2);
    let CertificateStep::Issue(written) = &cut.steps[0] else {
        unreachable!()
    };
    let certificate = &written.leaf.certificate;
    assert_eq!(certificate.not_after(), short_ca.certificate.not_after());
    let lifetime = certificate.not_after() - certificate.not_before();
    assert_eq!(cut.wake_at, Some(certificate.not_before() + lifetime / 2));
}
