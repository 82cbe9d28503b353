//! The IssuedCertificate controller: a pass finds the issuer ([`Shared::issuer`]: the
//! CertificateAuthority's Secret as stored, read once per version however many certificates
//! it issues), observes the certificate's Secret (from the shared Secret store), asks
//! [`leaf::plan`], and carries the plan out: at most one write (the Secret created with type
//! `kubernetes.io/tls`, or merge-patched on the `resourceVersion` the pass read); its events
//! and status are left to [`super::certificate_reports`], written once the Secret writes
//! pause. It runs again when its Secret changes, when its CertificateAuthority or what that CA
//! issues from changes, and at the plan's wake-up time; nothing polls. A missing issuer, or
//! one that cannot sign now, shows in the status and waits for the CA to change.
//!
//! The Secret carries no owner reference: deleting an IssuedCertificate keeps its Secret (and
//! the workload using it running), as cert-manager does by default for a Certificate's Secret.
//! Delete the Secret yourself when it is no longer needed.

use std::sync::Arc;

use caretaker_pki::Usage;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use time::OffsetDateTime;

use super::authorities::{CertificateFeed, Shared};
use super::certificate_reports::{CertificateReports, PlannedStatus, StatusUpdate};
use crate::Error;
use crate::authority::ca::IssuerView;
use crate::authority::leaf::{self, CertificateStep, LeafObserved, LeafPlan, LeafSecretState};
use crate::authority::{self, CertificatePolicy, ObjectName, PkiMint};
use crate::changes::Event;
use crate::metrics::CertificateKind;
use crate::ownership::{Claim, Owner};
use crate::runtime::refuse::{Refusal, ShowRefusal, refuse};
use crate::runtime::steps::{Applied, Failed, ObjectKind, Step, StepWriter, no_gate};
use crate::runtime::{self, Key, claims, status, write};
use caretaker_api::names;
use caretaker_api::v1alpha1::IssuedCertificate;

/// Passes at once: enough to keep the API server busy while others sign, few enough that
/// thousands of certificates due together do not hold thousands of keys in memory at once.
const CONCURRENCY: u16 = 16;

/// Runs the controller on the IssuedCertificates and wake-ups `feed` brings; the passes leave
/// their statuses and events in `reports`.
pub(crate) async fn run(
    shared: Arc<Shared>,
    feed: CertificateFeed,
    reports: Arc<CertificateReports>,
) {
    let wake = futures::stream::unfold(feed.wake, |mut wake| async move {
        let (namespace, name) = wake.recv().await?;
        Some((ObjectRef::new(&name).within(&namespace), wake))
    });
    let store = shared.stores.certificates.clone();
    shared
        .run_controller(
            "issued_certificate",
            feed.objects,
            store,
            wake,
            CONCURRENCY,
            move |certificate, shared| reconcile(certificate, shared, reports.clone()),
        )
        .await;
}

async fn reconcile(
    certificate: Arc<IssuedCertificate>,
    shared: Arc<Shared>,
    reports: Arc<CertificateReports>,
) -> Result<Action, Error> {
    if certificate.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let pass = CertificatePass {
        shared: &shared,
        reports: &reports,
    };
    let policy = match CertificatePolicy::from_spec(&certificate.spec) {
        Ok(policy) => policy,
        Err(e) => {
            let message = format!("{e}; nothing was written");
            return refuse(&pass, &*certificate, names::REASON_INVALID_SPEC, message).await;
        }
    };
    shared.certificate_inputs_synced().await?;
    let key = (
        certificate.namespace().unwrap_or_default(),
        certificate.spec.secret_name.clone(),
    );
    if let Some((reason, message)) = namespace_refused(&shared, &certificate, &key.0) {
        return refuse(&pass, &*certificate, reason, message).await;
    }
    let (now, issuer_name) = (OffsetDateTime::now_utc(), &certificate.spec.issuer_ref.name);
    let issuer = match shared.issuer(issuer_name, now).await? {
        Ok(issuer) => issuer,
        Err(not_ready) => return wait_for_issuer(&reports, &shared, &certificate, not_ready),
    };
    let secret = shared.secret(&key).await?;
    let version = secret.as_ref().and_then(|s| s.resource_version());
    if let Some(wait) = shared.behind_own_write(&key, version.as_deref()) {
        // The watch has not brought this process's own write yet: deciding on the version
        // before it would issue again for nothing. Its event wakes this certificate.
        return Ok(Action::requeue(wait));
    }
    // Only this certificate's Secret, or an absent one (see `crate::ownership`).
    let owner = claims::owner_of(&*certificate);
    let claim = claims::claim(&owner, "Secret", &key, secret.as_ref().map(|s| &s.metadata));
    if let Some((reason, message)) = claims::refusal(std::slice::from_ref(&claim)) {
        return refuse(&pass, &*certificate, reason, message).await;
    }
    if let (Claim::Adopt, Some(version)) = (&claim, &version) {
        // Handed over: the mark first, alone; the next pass reads the Secret as this
        // certificate's.
        write::adopt::<Secret>(&shared.ctx.client, &owner, &key, version).await?;
        return Ok(Action::await_change());
    }
    let (plan, held_one) = plan(&shared, &key, secret, policy, issuer, now)
        .await
        .inspect_err(|e| rotation_failed(&shared, e))?;
    if let Some(stop) = write(&pass, &certificate, (&key, &owner, version), &plan).await? {
        return Ok(stop);
    }
    Ok(finish(&pass, &certificate, plan, held_one, now))
}

/// Writes the plan's steps to the Secret `key` (of `owner`, read at `version`); the action
/// that ends the pass when they did not all go through.
async fn write(
    pass: &CertificatePass<'_>,
    certificate: &IssuedCertificate,
    (key, owner, version): (&Key, &Owner, Option<String>),
    plan: &LeafPlan,
) -> Result<Option<Action>, Error> {
    let CertificatePass { shared, reports } = *pass;
    let mut writer = StepWriter::new(&shared.ctx.client, owner);
    writer.read(ObjectKind::Secret, key.clone(), version);
    let own = (key.0.clone(), certificate.name_any());
    let step_of = |step: &CertificateStep| Step::TlsSecret {
        key: key.clone(),
        data: step.data(),
        annotations: step.annotation_changes(),
    };
    let written = |_: &CertificateStep, before, after: &str| {
        reports.secret_written();
        shared.note_written(key.clone(), before, after.to_string(), own.clone());
    };
    match writer.apply(&plan.steps, step_of, no_gate, written).await {
        Ok(Applied::All) => Ok(None),
        Ok(Applied::Conflict { .. } | Applied::Gated { .. }) => Ok(Some(Action::await_change())),
        Err(Failed { error, .. }) => {
            rotation_failed(shared, &error);
            Err(error)
        }
    }
}

/// What a pass leaves once its writes are in place: the metrics, its events and status (to
/// be written after the Secrets), and when it runs again.
fn finish(
    pass: &CertificatePass<'_>,
    certificate: &IssuedCertificate,
    plan: LeafPlan,
    held_one: bool,
    now: OffsetDateTime,
) -> Action {
    let own = (
        certificate.namespace().unwrap_or_default(),
        certificate.name_any(),
    );
    for event in &plan.events {
        tracing::info!(certificate = %format!("{}/{}", own.0, own.1), reason = event.reason, note = %event.note, "IssuedCertificate event");
    }
    pass.shared.record_certificate(
        CertificateKind::IssuedCertificate,
        (&own.0, &own.1),
        held_one && (plan.steps.iter()).any(|s| matches!(s, CertificateStep::Issue(_))),
        &plan.status,
    );
    let status = planned(certificate, StatusUpdate::Planned(plan.status), now);
    report(pass.reports, pass.shared, certificate, plan.events, status);
    match plan.wake_at {
        Some(at) => Action::requeue(runtime::until(at)),
        None => Action::await_change(),
    }
}

/// Why the issuer does not issue to the certificate's namespace (`namespace`), when it is
/// known and does not: the reason and the message.
fn namespace_refused(
    shared: &Shared,
    certificate: &IssuedCertificate,
    namespace: &str,
) -> Option<(&'static str, String)> {
    let issuer_name = &certificate.spec.issuer_ref.name;
    let ca = shared
        .stores
        .authorities
        .get(&ObjectRef::new(issuer_name))?;
    (!ca.spec.issues_to(namespace)).then(|| {
        let message = format!(
            "CertificateAuthority {issuer_name} issues only to namespaces {}, not to {namespace}; \
             nothing was written",
            ca.spec.allowed_namespaces.join(", "),
        );
        (names::REASON_NAMESPACE_NOT_ALLOWED, message)
    })
}

/// Counts a failed rotation.
fn rotation_failed(shared: &Shared, error: &Error) {
    (shared.ctx.metrics).rotation_failed(CertificateKind::IssuedCertificate, error);
}

/// The plan for the certificate whose Secret is `key` (`secret`, as read), from `issuer`
/// (off the async threads: it may make a key and sign), and whether the Secret held a
/// readable certificate. What it issues is noted as verified.
async fn plan(
    shared: &Arc<Shared>,
    key: &Key,
    secret: Option<Arc<Secret>>,
    policy: CertificatePolicy,
    issuer: IssuerView,
    now: OffsetDateTime,
) -> Result<(LeafPlan, bool), Error> {
    let serving = matches!(policy.leaf.usage, Usage::Server | Usage::Both);
    let secret_name = ObjectName::new(&key.0, &key.1);
    let observing = shared.clone();
    runtime::blocking(move || {
        let content = secret.as_deref().map(write::secret_content);
        let seen = LeafObserved {
            secret_name,
            secret: LeafSecretState::observe(
                content.as_ref().map(|(d, a)| (d, a)),
                serving,
                issuer.candidates(),
                &observing.verified,
            ),
        };
        let held_one = matches!(&seen.secret, LeafSecretState::Present(s) if s.certificate.is_ok());
        let plan = leaf::plan(&seen, &policy, &issuer, now, &PkiMint)?;
        // Issued here: its next observations need not check its signature or its key.
        for step in &plan.steps {
            if let (CertificateStep::Issue(issued), Ok(signer)) = (step, &issuer.signer)
                && issued.issuer == signer.certificate.fingerprint()
            {
                let leaf = &issued.leaf;
                (observing.verified).issued(
                    &leaf.certificate,
                    &leaf.key,
                    leaf.algorithm,
                    &signer.certificate,
                );
            }
        }
        Ok((plan, held_one))
    })
    .await
    .map_err(|source| Error::SigningFailed {
        certificate: format!("{}/{}", key.0, key.1),
        source,
    })
}

fn planned(
    certificate: &IssuedCertificate,
    update: StatusUpdate,
    at: OffsetDateTime,
) -> PlannedStatus {
    PlannedStatus {
        update,
        generation: certificate.metadata.generation,
        at,
    }
}

/// Leaves the pass's events and status to be written after the Secrets
/// ([`super::certificate_reports`]). The Degraded message is remembered now: a pass that reads
/// the status before the write must not say the same Warning again.
fn report(
    reports: &CertificateReports,
    shared: &Shared,
    certificate: &IssuedCertificate,
    events: Vec<Event>,
    status: PlannedStatus,
) {
    let old = certificate.status.clone().unwrap_or_default();
    shared.record_degraded(
        CertificateKind::IssuedCertificate,
        certificate,
        status::degraded_message(&old.conditions),
        status.degraded_message(),
    );
    let key = (
        certificate.namespace().unwrap_or_default(),
        certificate.name_any(),
    );
    let uid = certificate.metadata.uid.clone();
    reports.add(key, uid, events, status, &old);
}

/// The issuer is missing or cannot be acted on: Ready false with its reason, nothing written;
/// the CertificateAuthority's change wakes this certificate.
fn wait_for_issuer(
    reports: &CertificateReports,
    shared: &Shared,
    certificate: &IssuedCertificate,
    not_ready: authority::Condition,
) -> Result<Action, Error> {
    let now = OffsetDateTime::now_utc();
    let status = planned(certificate, StatusUpdate::Waiting(not_ready), now);
    report(reports, shared, certificate, Vec::new(), status);
    Ok(Action::await_change())
}

/// What an IssuedCertificate's pass shows its status and events through: the reports
/// written after the Secrets.
struct CertificatePass<'a> {
    shared: &'a Shared,
    reports: &'a CertificateReports,
}

impl ShowRefusal<IssuedCertificate> for CertificatePass<'_> {
    fn reported(&self, certificate: &IssuedCertificate) -> Option<String> {
        let old = certificate.status.as_ref().map(|s| &s.conditions);
        let read = old.and_then(|conditions| status::degraded_message(conditions));
        self.shared.statuses.degraded.reported(certificate, read)
    }

    /// Ready false and Degraded with the refusal's reason, nothing else written; the status
    /// and the Warning are one report, the status written first.
    async fn show(
        &self,
        certificate: &IssuedCertificate,
        refusal: &Refusal,
        warning: Option<Event>,
    ) -> Result<(), Error> {
        let now = OffsetDateTime::now_utc();
        let update = StatusUpdate::Refused {
            reason: refusal.reason,
            message: refusal.message.clone(),
        };
        let status = planned(certificate, update, now);
        let events = warning.into_iter().collect();
        report(self.reports, self.shared, certificate, events, status);
        Ok(())
    }
}
