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

use super::authority_watch::{self, CertificateFeed, Shared, Written};
use super::certificate_reports::{CertificateReports, PlannedStatus, StatusUpdate};
use crate::Error;
use crate::authority::leaf::{self, CertificateStep, LeafObserved, LeafSecretState};
use crate::authority::{self, ObjectName, PkiMint};
use crate::changes::Event;
use crate::metrics::CertificateKind;
use crate::names;
use crate::ownership::Claim;
use crate::v1alpha1::IssuedCertificate;

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
    let store = shared.certificates.clone();
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
    let spec = &certificate.spec;
    let policy = match spec.policy() {
        Ok(policy) => policy,
        Err(e) => {
            let message = format!("{e}; nothing was written");
            return refuse(
                &reports,
                &shared,
                &certificate,
                names::REASON_INVALID_SPEC,
                message,
            );
        }
    };
    shared.certificate_inputs_synced().await?;
    let key = (
        certificate.namespace().unwrap_or_default(),
        spec.secret_name.clone(),
    );
    let own = (key.0.clone(), certificate.name_any());
    let issuer_name = &spec.issuer_ref.name;
    if let Some(ca) = shared.authorities.get(&ObjectRef::new(issuer_name))
        && !ca.spec.issues_to(&key.0)
    {
        let message = format!(
            "CertificateAuthority {issuer_name} issues only to namespaces {}, not to {}; \
             nothing was written",
            ca.spec.allowed_namespaces.join(", "),
            key.0
        );
        return refuse(
            &reports,
            &shared,
            &certificate,
            names::REASON_NAMESPACE_NOT_ALLOWED,
            message,
        );
    }
    let now = OffsetDateTime::now_utc();
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
    let owner = authority_watch::owner_of(&*certificate);
    let claim =
        authority_watch::claim(&owner, "Secret", &key, secret.as_ref().map(|s| &s.metadata));
    if let Some((reason, message)) = authority_watch::refusal(std::slice::from_ref(&claim)) {
        return refuse(&reports, &shared, &certificate, reason, message);
    }
    if let (Claim::Adopt, Some(version)) = (&claim, &version) {
        // Handed over: the mark first, alone; the next pass reads the Secret as this
        // certificate's.
        authority_watch::adopt::<Secret>(&shared.ctx.client, &owner, &key, version).await?;
        return Ok(Action::await_change());
    }
    let serving = matches!(policy.leaf.usage, Usage::Server | Usage::Both);
    let secret_name = ObjectName::new(&key.0, &key.1);
    let observing = shared.clone();
    let (plan, held_one) = authority_watch::blocking(move || {
        let content = secret.as_deref().map(authority_watch::secret_content);
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
    .inspect_err(|e| (shared.ctx.metrics).rotation_failed(CertificateKind::IssuedCertificate, e))?;

    for step in &plan.steps {
        match authority_watch::write_secret(
            &shared.ctx.client,
            &owner,
            &key,
            version.as_deref(),
            &step.data(),
            &step.annotation_changes(),
        )
        .await
        .inspect_err(|e| {
            (shared.ctx.metrics).rotation_failed(CertificateKind::IssuedCertificate, e)
        })? {
            Written::Done(after) => {
                reports.secret_written();
                shared.note_written(key.clone(), version.clone(), after, own.clone())
            }
            Written::Conflict => return Ok(Action::await_change()),
        }
    }
    for event in &plan.events {
        tracing::info!(certificate = %format!("{}/{}", key.0, certificate.name_any()), reason = event.reason, note = %event.note, "IssuedCertificate event");
    }
    shared.record_certificate(
        CertificateKind::IssuedCertificate,
        (&key.0, &certificate.name_any()),
        held_one && (plan.steps.iter()).any(|s| matches!(s, CertificateStep::Issue(_))),
        &plan.status,
    );
    let status = planned(&certificate, StatusUpdate::Planned(plan.status), now);
    report(&reports, &shared, &certificate, plan.events, status);
    Ok(match plan.wake_at {
        Some(at) => Action::requeue(authority_watch::until(at)),
        None => Action::await_change(),
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
    (shared.degraded).remember(
        certificate,
        authority_watch::degraded_message(&old.conditions),
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

/// A certificate caretaker cannot act on (its spec does not validate, its Secret is another's):
/// Ready false and Degraded with `reason`, nothing written, and a Warning unless the status
/// already says the same.
fn refuse(
    reports: &CertificateReports,
    shared: &Shared,
    certificate: &IssuedCertificate,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    let old = certificate.status.clone().unwrap_or_default();
    let read = authority_watch::degraded_message(&old.conditions);
    let mut events = Vec::new();
    if shared.degraded.reported(certificate, read) != Some(message.clone()) {
        tracing::warn!(certificate = %certificate.name_any(), %message, "IssuedCertificate not acted on");
        events.push(Event::warning(reason, message.clone()));
    }
    let now = OffsetDateTime::now_utc();
    let status = planned(certificate, StatusUpdate::Refused { reason, message }, now);
    report(reports, shared, certificate, events, status);
    Ok(Action::await_change())
}
