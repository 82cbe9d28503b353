//! Timelines: a CertificateAuthority and its certificates followed through three CA lifetimes
//! of model time ([`super::model`]), with the CA Secret deleted or tampered with, the bundle
//! ConfigMap deleted, annotations and keys removed, names changed, operator restarts and
//! passes cut short between two writes, and the injection point taking up the bundle late.
//! The controllers run as the glue will run them: observe, plan, write step by step; time
//! jumps from one wake-up to the next. Checked throughout:
//!
//! - trust is never broken: after every single write, the bundle ConfigMap and the injection
//!   point hold the issuer of every certificate valid at that moment, both those in the
//!   Secrets and those still served (a workload takes up a new certificate within half of
//!   `trust_propagation`: that wait covers servers reloading as well as clients' bundles; with
//!   no propagation time there is no such promise);
//! - trust before sign: a CA signs a certificate only once it has been in the ConfigMap and
//!   the injection point for `trust_propagation` (the very first CA, made when nothing was
//!   trusted, excepted);
//! - one CA per rotation: a CA is made only when the Secret holds no next CA, and a stored
//!   next CA is never replaced but by its promotion;
//! - a plan is complete: deciding again on what its writes produced writes nothing, and a
//!   pass settles within a few rounds;
//! - timers are exact: at any moment before the earliest wake-up nothing would be written;
//! - after the last disturbance, every certificate stays valid and trusted, and the CA
//!   rotates.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use caretaker_pki::{CaSpec, LeafSpec, PkiError, RotationPolicy, Ttl, Usage};
use proptest::prelude::*;
use time::OffsetDateTime;

use super::bundle::{BundleConfigMap, BundleState};
use super::ca::{self, AuthorityObserved, AuthorityStep, CaSecret, CaSecretState, IssuerView};
use super::leaf::{self, CertificateStep, KeyState, LeafObserved, LeafSecretState};
use super::model::{Minted, Model, at};
use super::{
    AuthorityPolicy, CaKeyPair, Certificate, CertificatePolicy, IssuedLeaf, Mint, ObjectName,
};

const DAY: i64 = 86_400;

/// Something that happens to the objects besides the controllers.
#[derive(Debug, Clone, PartialEq)]
enum Disturbance {
    /// A person deletes the CA Secret (only while the bundle ConfigMap exists: see
    /// `DeleteBundle`).
    DeleteCaSecret,
    /// A person spoils the CA Secret (caretaker sees it invalid)...
    TamperCaSecret,
    /// ...and puts it back as it was.
    RestoreCaSecret,
    /// A person removes `certificate-not-after` from the CA Secret (forced rotation).
    RemoveCaNotAfter,
    /// A person deletes the bundle ConfigMap (only while the CA Secret is valid: with both
    /// gone at once, nothing says which CAs were trusted).
    DeleteBundle,
    /// The operator restarts: what it held in memory (the last good CA) is gone.
    Restart,
    /// The operator stops after this many writes of its next CA pass, and starts again this
    /// many seconds later.
    CutShort(usize, i64),
    /// A person removes one of library-go's annotations of a certificate Secret.
    RemoveLeafAnnotation(usize, usize),
    DeleteLeafKey(usize),
    DeleteLeafSecret(usize),
    /// A person adds a DNS name to an IssuedCertificate.
    AddLeafName(usize),
}

#[derive(Debug, Clone)]
struct Scenario {
    ca_days: i64,
    ca_rotation: RotationPolicy,
    propagation: Duration,
    leaf_days: i64,
    leaf_rotation: RotationPolicy,
    leaves: usize,
    /// How late the injection point takes up a new bundle; `None`: there is none.
    injection_lag: Option<i64>,
    /// Seconds from the start, in order, all within the first half of the timeline.
    disturbances: Vec<(i64, Disturbance)>,
}

fn disturbance() -> impl Strategy<Value = Disturbance> {
    prop_oneof![
        Just(Disturbance::DeleteCaSecret),
        Just(Disturbance::TamperCaSecret),
        Just(Disturbance::RestoreCaSecret),
        Just(Disturbance::RemoveCaNotAfter),
        Just(Disturbance::DeleteBundle),
        Just(Disturbance::Restart),
        (1usize..3, prop_oneof![Just(0i64), 1i64..=6 * 3600])
            .prop_map(|(k, down)| Disturbance::CutShort(k, down)),
        (0usize..3, 0usize..4).prop_map(|(i, a)| Disturbance::RemoveLeafAnnotation(i, a)),
        (0usize..3).prop_map(Disturbance::DeleteLeafKey),
        (0usize..3).prop_map(Disturbance::DeleteLeafSecret),
        (0usize..3).prop_map(Disturbance::AddLeafName),
    ]
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        30i64..=400,
        (any::<bool>(), 10u32..=50),
        prop_oneof![Just(0u32), 1u32..=30],
        (2i64..=8, 50u32..=90),
        1usize..=3,
        prop::option::of(0i64..=3 * 3600),
        prop::collection::vec((0u32..1000, disturbance()), 0..8),
    )
        .prop_map(
            |(
                ca_days,
                (before, percent),
                prop_permille,
                (leaf_div, leaf_percent),
                leaves,
                lag,
                events,
            )| {
                let life = ca_days * DAY;
                let ca_rotation = if before {
                    RotationPolicy::Before(Duration::from_secs(
                        (life * percent as i64 / 100) as u64,
                    ))
                } else {
                    RotationPolicy::fraction(1.0 - percent as f64 / 100.0).unwrap()
                };
                let window = ca_days * 3 / 2 * DAY;
                let mut disturbances: Vec<(i64, Disturbance)> = events
                    .into_iter()
                    .map(|(permille, d)| (window * permille as i64 / 1000, d))
                    .collect();
                disturbances.sort_by_key(|(t, _)| *t);
                Scenario {
                    ca_days,
                    ca_rotation,
                    propagation: Duration::from_secs((life * prop_permille as i64 / 1000) as u64),
                    leaf_days: (ca_days / leaf_div).max(2),
                    leaf_rotation: RotationPolicy::fraction(leaf_percent as f64 / 100.0).unwrap(),
                    leaves,
                    injection_lag: lag,
                    disturbances,
                }
            },
        )
}

/// The CA Secret.
#[derive(Debug, Clone)]
enum Stored {
    Absent,
    Valid(CaSecret),
    /// Invalid; what it was before, to put back.
    Tampered(CaSecret),
}

/// A mint that must not be asked: deciding again, or looking ahead, makes nothing.
struct NoMint;

impl Mint for NoMint {
    fn create_ca(&self, _: &CaSpec) -> Result<CaKeyPair, PkiError> {
        Err(PkiError::Signing(
            "a CA was made by a decision that must make nothing".into(),
        ))
    }
    fn issue(&self, _: &CaKeyPair, _: &LeafSpec) -> Result<IssuedLeaf, PkiError> {
        Err(PkiError::Signing(
            "a certificate was issued by a decision that must make nothing".into(),
        ))
    }
}

struct World {
    scenario: Scenario,
    policy: AuthorityPolicy,
    leaf_policies: Vec<CertificatePolicy>,
    mint: Model,
    now: OffsetDateTime,
    secret: Stored,
    bundle: Option<BundleConfigMap>,
    /// The injection point's CAs; `None`: there is no injection point.
    injected: Option<BTreeSet<String>>,
    injector_due: Option<OffsetDateTime>,
    /// Each certificate Secret, its `issuer` the CA that really signed it.
    leaves: Vec<LeafSecretState>,
    /// The certificate each workload serves (and its issuer), and the one it takes up next.
    served: Vec<Option<(Certificate, String)>>,
    reloads: Vec<Option<(OffsetDateTime, Certificate, String)>>,
    last_good: Option<CaKeyPair>,
    reported_degraded: Option<String>,
    cut_short: Option<(usize, i64)>,
    /// The operator is stopped until then.
    down_until: Option<OffsetDateTime>,
    // What the checks need to remember.
    published: BTreeSet<String>,
    injected_ever: BTreeSet<String>,
    trusted_since: BTreeMap<String, OffsetDateTime>,
    /// CAs made when nothing was trusted: they sign at once.
    first: BTreeSet<String>,
    promotions: Vec<OffsetDateTime>,
    issued: usize,
}

impl World {
    fn new(scenario: Scenario) -> Self {
        let policy = AuthorityPolicy {
            ca: CaSpec {
                validity: Ttl::calendar(0, 0, scenario.ca_days as u32).unwrap(),
                ..CaSpec::new("webhooks-ca")
            },
            rotation: scenario.ca_rotation,
            trust_propagation: scenario.propagation,
        };
        let leaf_policies = (0..scenario.leaves)
            .map(|i| {
                let usage = [Usage::Server, Usage::Client, Usage::Both][i % 3];
                let name = format!("leaf-{i}.demo.svc");
                CertificatePolicy {
                    leaf: LeafSpec::new(name.clone(), usage)
                        .with_dns_names([name])
                        .with_validity(Ttl::calendar(0, 0, scenario.leaf_days as u32).unwrap()),
                    rotation: scenario.leaf_rotation,
                }
            })
            .collect();
        Self {
            policy,
            leaf_policies,
            mint: Model::new(at(0)),
            now: at(0),
            secret: Stored::Absent,
            bundle: None,
            injected: scenario.injection_lag.map(|_| BTreeSet::new()),
            injector_due: None,
            leaves: vec![LeafSecretState::Absent; scenario.leaves],
            served: vec![None; scenario.leaves],
            reloads: vec![None; scenario.leaves],
            last_good: None,
            reported_degraded: None,
            cut_short: None,
            down_until: None,
            published: BTreeSet::new(),
            injected_ever: BTreeSet::new(),
            trusted_since: BTreeMap::new(),
            first: BTreeSet::new(),
            promotions: Vec::new(),
            issued: 0,
            scenario,
        }
    }

    fn stored(&self) -> Option<&CaSecret> {
        match &self.secret {
            Stored::Valid(s) => Some(s),
            Stored::Absent | Stored::Tampered(_) => None,
        }
    }

    /// The CA as its controller observes it.
    fn ca_observed(&self) -> AuthorityObserved {
        let mut seen = AuthorityObserved {
            secret_name: ObjectName::new("caretaker-system", "webhooks-ca"),
            bundle_name: ObjectName::new("caretaker-system", "webhooks-ca-bundle"),
            secret: match &self.secret {
                Stored::Absent => CaSecretState::Absent,
                Stored::Valid(s) => CaSecretState::Valid(Box::new(s.clone())),
                Stored::Tampered(_) => CaSecretState::Invalid {
                    reason: "tls.key does not belong to tls.crt".into(),
                },
            },
            bundle: match &self.bundle {
                Some(b) => BundleState::Present(b.clone()),
                None => BundleState::Absent,
            },
            injected: self.injected.clone(),
            in_use: BTreeSet::new(),
            certificates_missing: false,
            distributed: None,
            untrusting: Default::default(),
            last_good: self.last_good.clone(),
            remembered: None,
            reported_degraded: self.reported_degraded.clone(),
        };
        let issuer = ca::in_use_candidates(&seen, self.now);
        for i in 0..self.leaves.len() {
            match self.leaf_observed(i, &issuer).secret {
                LeafSecretState::Present(s) if s.certificate.is_ok() => {
                    seen.in_use.extend(s.issuer)
                }
                _ => seen.certificates_missing = true,
            }
        }
        seen
    }

    /// A certificate Secret as observed: its issuer is found only among the CAs `issuer`
    /// trusts, as `LeafSecretState::observe` finds it.
    fn leaf_observed(&self, i: usize, issuer: &IssuerView) -> LeafObserved {
        let mut secret = self.leaves[i].clone();
        if let LeafSecretState::Present(s) = &mut secret {
            let trusted = |fp: &String| {
                issuer.bundle.as_ref().is_some_and(|b| b.contains(fp))
                    || issuer.signer.as_ref().is_ok_and(|c| c.fingerprint() == fp)
            };
            s.issuer = s.issuer.take().filter(trusted);
        }
        LeafObserved {
            secret_name: ObjectName::new("demo", format!("leaf-{i}-tls")),
            secret,
        }
    }

    fn true_issuer(&self, i: usize) -> Option<(&Certificate, &str)> {
        match &self.leaves[i] {
            LeafSecretState::Present(s) => {
                Some((s.certificate.as_ref().ok()?, s.issuer.as_deref()?))
            }
            LeafSecretState::Absent => None,
        }
    }

    /// Trust is never broken: the published bundle and the injection point hold the issuer of
    /// every certificate valid now (a first CA excepted until it is first published there).
    fn check_trust(&self, after: &str) -> Result<(), TestCaseError> {
        let stored =
            (0..self.leaves.len()).filter_map(|i| self.true_issuer(i).map(|(c, s)| (i, c, s)));
        // With no propagation time at all, no workload can be waited for.
        let waits = !self.policy.trust_propagation.is_zero();
        let served = self
            .served
            .iter()
            .enumerate()
            .filter(|_| waits)
            .filter_map(|(i, s)| s.as_ref().map(|(c, s)| (i, c, s.as_str())));
        for (i, certificate, signer) in stored.chain(served) {
            if !certificate.info().is_valid_at(self.now) {
                continue;
            }
            let first = self.first.contains(signer);
            if let Some(bundle) = &self.bundle
                && (!first || self.published.contains(signer))
            {
                prop_assert!(
                    bundle
                        .certificates
                        .iter()
                        .any(|c| c.fingerprint() == signer),
                    "at {} after {after}: leaf {i} is signed by {signer}, which the bundle ConfigMap does not hold",
                    self.now
                );
            }
            if let Some(injected) = &self.injected
                && (!first || self.injected_ever.contains(signer))
            {
                prop_assert!(
                    injected.contains(signer),
                    "at {} after {after}: leaf {i} is signed by {signer}, which the injection point does not hold",
                    self.now
                );
            }
        }
        Ok(())
    }

    /// What is trusted everywhere now, and since when.
    fn note_trust(&mut self) {
        let Some(bundle) = &self.bundle else { return };
        for c in &bundle.certificates {
            let fp = c.fingerprint().to_string();
            self.published.insert(fp.clone());
            if self.injected.as_ref().is_none_or(|set| set.contains(&fp)) {
                self.trusted_since.entry(fp).or_insert(self.now);
            }
        }
    }

    /// Workloads take up the certificates written `reload` ago.
    fn run_reloads(&mut self) {
        for i in 0..self.leaves.len() {
            if let Some((due, certificate, signer)) = self.reloads[i].clone()
                && due <= self.now
            {
                self.served[i] = Some((certificate, signer));
                self.reloads[i] = None;
            }
        }
    }

    fn reload_lag(&self) -> time::Duration {
        time::Duration::seconds(self.policy.trust_propagation.as_secs() as i64 / 2)
    }

    fn run_injector(&mut self) {
        if let (Some(due), Some(bundle)) = (self.injector_due, &self.bundle)
            && due <= self.now
        {
            let fps: BTreeSet<String> = bundle.fingerprints().into_iter().collect();
            self.injected_ever.extend(fps.iter().cloned());
            self.injected = Some(fps);
            self.injector_due = None;
            self.note_trust();
        }
    }

    fn write_ca(&mut self, step: &AuthorityStep) -> Result<(), TestCaseError> {
        match step {
            AuthorityStep::WriteSecret(new) => {
                if let Some(old) = self.stored() {
                    // A stored next CA is never replaced but by its promotion.
                    if let Some(next) = &old.next {
                        prop_assert!(
                            new.next.as_ref() == Some(next) || new.current.as_ref() == Some(next),
                            "the stored next CA {} was replaced",
                            next.fingerprint()
                        );
                    }
                    if new.current != old.current {
                        prop_assert!(
                            new.current.is_some() && new.current == old.next,
                            "the CA that signs changed but by a promotion"
                        );
                        self.promotions.push(self.now);
                    }
                } else if let Some(current) = &new.current {
                    // Made from nothing: signs at once only if nothing was trusted.
                    let trusted: Vec<&Certificate> = self
                        .bundle
                        .iter()
                        .flat_map(|b| &b.certificates)
                        .filter(|c| !c.expired_at(self.now))
                        .collect();
                    if matches!(self.secret, Stored::Absent) {
                        prop_assert!(
                            trusted.is_empty(),
                            "a first CA while {} CAs are trusted",
                            trusted.len()
                        );
                        self.first.insert(current.fingerprint().to_string());
                    }
                }
                self.secret = Stored::Valid(new.clone());
            }
            AuthorityStep::WriteBundle(bundle) => {
                // Everything published is stored first.
                let stored: BTreeSet<&str> = self
                    .stored()
                    .iter()
                    .flat_map(|s| {
                        s.current
                            .iter()
                            .chain(&s.next)
                            .map(|c| &c.certificate)
                            .chain(&s.previous)
                    })
                    .map(Certificate::fingerprint)
                    .collect();
                for c in &bundle.certificates {
                    prop_assert!(
                        stored.contains(c.fingerprint()),
                        "CA {} published before it is stored",
                        c.fingerprint()
                    );
                }
                self.bundle = Some(bundle.clone());
                if let Some(lag) = self.scenario.injection_lag {
                    let due = self.now + time::Duration::seconds(lag);
                    self.injector_due = Some(self.injector_due.map_or(due, |d| d.min(due)));
                }
                self.note_trust();
            }
        }
        self.check_trust("a CA write")
    }

    /// One CA pass: plan, write step by step (or cut short), check it settles.
    fn ca_pass(&mut self) -> Result<bool, TestCaseError> {
        let seen = self.ca_observed();
        let made = self.mint.log.borrow().len();
        let plan = ca::plan(&seen, &self.policy, self.now, &self.mint).expect("model mint");
        let made_now = self.mint.log.borrow().len() - made;
        if made_now > 0 {
            prop_assert_eq!(made_now, 1, "more than one CA in a pass");
            // Only when the Secret holds no next CA, or once that one is promoted.
            if let Some(next) = self.stored().and_then(|s| s.next.as_ref()) {
                let promoted = plan.steps.iter().any(|step| {
                    matches!(step, AuthorityStep::WriteSecret(s) if s.current.as_ref() == Some(next))
                });
                prop_assert!(promoted, "a CA made while the Secret holds a next CA");
            }
            prop_assert!(
                !matches!(self.secret, Stored::Tampered(_)),
                "a tampered CA regenerated"
            );
        }
        if matches!(self.secret, Stored::Tampered(_)) {
            prop_assert!(plan.steps.is_empty(), "wrote over a tampered CA Secret");
        }
        let cut = self.cut_short.filter(|(k, _)| *k < plan.steps.len());
        let writes = cut.map_or(plan.steps.len(), |(k, _)| k);
        for step in &plan.steps[..writes] {
            self.write_ca(step)?;
        }
        if let Some((_, down)) = cut {
            // Stopped between two writes; it starts again, with nothing in memory, later.
            self.cut_short = None;
            self.last_good = None;
            self.down_until = Some(self.now + time::Duration::seconds(down));
            return Ok(writes > 0);
        }
        self.reported_degraded = plan
            .status
            .degraded
            .status
            .then(|| plan.status.degraded.message.clone());
        if let Some(current) = self.stored().and_then(|s| s.current.clone()) {
            self.last_good = Some(current);
        }
        if !plan.steps.is_empty() {
            // Complete: deciding again on what it wrote writes nothing.
            let again = ca::plan(&self.ca_observed(), &self.policy, self.now, &NoMint)
                .map_err(|e| fail("deciding the CA again", e))?;
            prop_assert!(
                again.steps.is_empty(),
                "CA pass at {} not settled: {:?} then {:?}",
                self.now,
                plan.steps,
                again.steps
            );
            prop_assert!(again.events.is_empty(), "said again: {:?}", again.events);
        }
        Ok(!plan.steps.is_empty())
    }

    fn leaf_pass(&mut self, i: usize) -> Result<bool, TestCaseError> {
        let issuer = IssuerView::for_certificates(
            &self.ca_observed(),
            self.policy.trust_propagation,
            self.now,
        );
        let seen = self.leaf_observed(i, &issuer);
        let policy = self.leaf_policies[i].clone();
        let plan = leaf::plan(&seen, &policy, &issuer, self.now, &self.mint).expect("model mint");
        for step in &plan.steps {
            if let CertificateStep::Issue(issued) = step {
                self.issued += 1;
                let taken_up = (issued.leaf.certificate.clone(), issued.issuer.clone());
                match self.served[i] {
                    // A workload starting with it.
                    None => self.served[i] = Some(taken_up),
                    Some(_) => {
                        let at = self.now + self.reload_lag();
                        self.reloads[i] = Some((at, taken_up.0, taken_up.1));
                    }
                }
                let signer = &issued.issuer;
                if !self.first.contains(signer) {
                    let since = self.trusted_since.get(signer).copied();
                    prop_assert!(
                        since.is_some_and(|t| t + self.policy.trust_propagation <= self.now),
                        "at {}: CA {signer} signs, trusted everywhere only since {since:?}",
                        self.now
                    );
                }
            }
            self.leaves[i] = self.leaves[i].after(step);
            self.check_trust("a certificate write")?;
        }
        if !plan.steps.is_empty() {
            let issuer = IssuerView::for_certificates(
                &self.ca_observed(),
                self.policy.trust_propagation,
                self.now,
            );
            let seen = self.leaf_observed(i, &issuer);
            let again = leaf::plan(&seen, &policy, &issuer, self.now, &NoMint)
                .map_err(|e| fail(&format!("deciding leaf {i} again at {}", self.now), e))?;
            prop_assert!(
                again.steps.is_empty(),
                "leaf {i} not settled at {}: {:?}",
                self.now,
                again.events
            );
        }
        Ok(!plan.steps.is_empty())
    }

    /// Every controller, round after round, until nothing more is written.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        self.mint.set_now(self.now);
        for _ in 0..8 {
            self.run_injector();
            self.run_reloads();
            if self.down_until.is_some_and(|t| t > self.now) {
                return Ok(());
            }
            let mut wrote = self.ca_pass()?;
            for i in 0..self.leaves.len() {
                wrote |= self.leaf_pass(i)?;
            }
            if !wrote {
                return Ok(());
            }
        }
        Err(TestCaseError::fail(format!("no settling at {}", self.now)))
    }

    /// The earliest wake-up of any controller, and the injector's.
    fn next_wake(&self) -> Result<Option<OffsetDateTime>, TestCaseError> {
        let seen = self.ca_observed();
        let plan = ca::plan(&seen, &self.policy, self.now, &NoMint)
            .map_err(|e| fail("the CA's wake-up", e))?;
        let issuer = IssuerView::for_certificates(&seen, self.policy.trust_propagation, self.now);
        let reloads = self.reloads.iter().flatten().map(|(at, _, _)| *at);
        let mut wakes: Vec<OffsetDateTime> = plan
            .wake_at
            .into_iter()
            .chain(self.injector_due)
            .chain(reloads)
            .collect();
        for i in 0..self.leaves.len() {
            let seen = self.leaf_observed(i, &issuer);
            let plan = leaf::plan(&seen, &self.leaf_policies[i], &issuer, self.now, &NoMint)
                .map_err(|e| fail(&format!("leaf {i}'s wake-up at {}", self.now), e))?;
            wakes.extend(plan.wake_at);
        }
        Ok(wakes.into_iter().filter(|t| *t > self.now).min())
    }

    /// Nothing would be written at `t` (before the earliest wake-up).
    fn check_quiet_at(&self, t: OffsetDateTime) -> Result<(), TestCaseError> {
        let seen = self.ca_observed();
        let plan = ca::plan(&seen, &self.policy, t, &NoMint)
            .map_err(|e| fail(&format!("the CA at {t}, before its wake-up"), e))?;
        prop_assert!(
            plan.steps.is_empty(),
            "CA writes at {t}, before its wake-up: {:?}",
            plan.steps
        );
        let issuer = IssuerView::for_certificates(&seen, self.policy.trust_propagation, t);
        for i in 0..self.leaves.len() {
            let seen = self.leaf_observed(i, &issuer);
            let plan = leaf::plan(&seen, &self.leaf_policies[i], &issuer, t, &NoMint)
                .map_err(|e| fail(&format!("leaf {i} at {t}, before its wake-up"), e))?;
            prop_assert!(
                plan.steps.is_empty(),
                "leaf {i} writes at {t}, before its wake-up: {:?}",
                plan.events
            );
        }
        Ok(())
    }

    fn disturb(&mut self, d: &Disturbance) {
        let n = self.leaves.len();
        match d.clone() {
            Disturbance::DeleteCaSecret => {
                if self.bundle.is_some() {
                    self.secret = Stored::Absent;
                }
            }
            Disturbance::TamperCaSecret => {
                if let Stored::Valid(s) = &self.secret {
                    self.secret = Stored::Tampered(s.clone());
                }
            }
            Disturbance::RestoreCaSecret => {
                if let Stored::Tampered(s) = &self.secret {
                    self.secret = Stored::Valid(s.clone());
                }
            }
            Disturbance::RemoveCaNotAfter => {
                if let Stored::Valid(s) = &mut self.secret {
                    s.annotations.not_after = None;
                }
            }
            Disturbance::DeleteBundle => {
                if matches!(self.secret, Stored::Valid(_)) {
                    self.bundle = None;
                }
            }
            Disturbance::Restart => self.last_good = None,
            Disturbance::CutShort(k, down) => self.cut_short = Some((k, down)),
            Disturbance::RemoveLeafAnnotation(i, which) => {
                if let LeafSecretState::Present(s) = &mut self.leaves[i % n] {
                    let a = &mut s.annotations;
                    *[
                        &mut a.not_after,
                        &mut a.not_before,
                        &mut a.issuer,
                        &mut a.hostnames,
                    ]
                    .into_iter()
                    .nth(which)
                    .unwrap() = None;
                }
            }
            Disturbance::DeleteLeafKey(i) => {
                if let LeafSecretState::Present(s) = &mut self.leaves[i % n] {
                    s.key = KeyState::Missing;
                }
            }
            Disturbance::DeleteLeafSecret(i) => self.leaves[i % n] = LeafSecretState::Absent,
            Disturbance::AddLeafName(i) => {
                let leaf = &mut self.leaf_policies[i % n].leaf;
                let name = format!("extra-{}.demo.svc", leaf.dns_names.len());
                leaf.dns_names.push(name);
            }
        }
    }

    /// After the disturbances: every certificate valid, with its key, from a CA the bundle
    /// and the injection point hold.
    fn check_healthy(&self) -> Result<(), TestCaseError> {
        prop_assert!(matches!(self.secret, Stored::Valid(_)));
        for i in 0..self.leaves.len() {
            let LeafSecretState::Present(s) = &self.leaves[i] else {
                return Err(TestCaseError::fail(format!(
                    "leaf {i} absent at {}",
                    self.now
                )));
            };
            let certificate = s
                .certificate
                .as_ref()
                .map_err(|e| TestCaseError::fail(e.clone()))?;
            prop_assert!(
                certificate.info().is_valid_at(self.now),
                "leaf {i} not valid at {}",
                self.now
            );
            prop_assert!(matches!(s.key, KeyState::Matches(_)));
        }
        Ok(())
    }
}

fn fail(what: &str, e: PkiError) -> TestCaseError {
    TestCaseError::fail(format!("{what}: {e}"))
}

fn run(scenario: Scenario) -> Result<(), TestCaseError> {
    let life = scenario.ca_days * DAY;
    let end = at(3 * life);
    let mut disturbances = scenario.disturbances.clone();
    // A spoiled Secret is put back (or deleted) before the window ends.
    if let Some(tamper) = disturbances
        .iter()
        .rposition(|(_, d)| *d == Disturbance::TamperCaSecret)
        && !disturbances[tamper..].iter().any(|(_, d)| {
            matches!(
                d,
                Disturbance::RestoreCaSecret | Disturbance::DeleteCaSecret
            )
        })
    {
        disturbances.push((life * 3 / 2, Disturbance::RestoreCaSecret));
    }
    let last = disturbances.last().map_or(0, |(t, _)| *t);
    let margin = scenario.propagation.as_secs() as i64 + scenario.injection_lag.unwrap_or(0) + DAY;
    let healthy_from = at(last + margin);
    let mut pending = disturbances.into_iter().peekable();
    let mut world = World::new(scenario);
    world.settle()?;
    for _ in 0..20_000 {
        if world.now >= end {
            break;
        }
        let down = world.down_until.filter(|t| *t > world.now);
        let wake = match down {
            // Stopped: only the injector and the workloads go on.
            Some(up) => world
                .reloads
                .iter()
                .flatten()
                .map(|(at, _, _)| *at)
                .chain(world.injector_due)
                .chain([up])
                .filter(|t| *t > world.now)
                .min(),
            None => world.next_wake()?,
        };
        let next = wake
            .into_iter()
            .chain(pending.peek().map(|(t, _)| at(*t)))
            .chain([end])
            .filter(|t| *t > world.now)
            .min()
            .unwrap();
        // Timers are exact: nothing is due before the earliest wake-up.
        if let Some(wake) = wake
            && down.is_none()
        {
            for t in [
                world.now + time::Duration::SECOND,
                wake - time::Duration::SECOND,
            ] {
                if t > world.now && t < wake {
                    world.check_quiet_at(t)?;
                }
            }
        }
        world.now = next;
        while let Some((t, d)) = pending.peek().cloned()
            && at(t) <= world.now
        {
            world.disturb(&d);
            pending.next();
        }
        world.settle()?;
        if world.now >= healthy_from {
            world.check_healthy()?;
        }
    }
    prop_assert!(world.now >= end, "the timeline did not reach its end");
    let rotations = world
        .promotions
        .iter()
        .filter(|t| **t >= healthy_from)
        .count();
    prop_assert!(
        rotations >= 1,
        "no rotation after {healthy_from}: {:?}",
        world.promotions
    );
    let made = world
        .mint
        .log
        .borrow()
        .iter()
        .filter(|m| matches!(m, Minted::Ca { .. }))
        .count();
    prop_assert!(made <= world.promotions.len() + 1 + world.scenario.disturbances.len() + 1);
    prop_assert!(world.issued > 0);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn trust_is_never_broken_over_timelines_with_disturbances(scenario in scenario()) {
        run(scenario)?;
    }
}

#[test]
fn a_quiet_timeline_rotates_its_ca_and_certificates_on_time() {
    let scenario = Scenario {
        ca_days: 100,
        ca_rotation: RotationPolicy::fraction(0.8).unwrap(),
        propagation: Duration::from_secs(300),
        leaf_days: 30,
        leaf_rotation: RotationPolicy::fraction(0.8).unwrap(),
        leaves: 3,
        injection_lag: Some(60),
        disturbances: Vec::new(),
    };
    run(scenario).unwrap();
}
