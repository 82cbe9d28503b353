//! The IssuedCertificate controller: a pass finds the issuer ([`Shared::issuer`]: the
//! CertificateAuthority's Secret as stored, read once per version however many certificates
//! it issues), observes the certificate's Secret (from the shared Secret store), asks
//! [`leaf::plan`], and carries the plan out: at most one write (the Secret created with type
//! `kubernetes.io/tls`, or merge-patched on the `resourceVersion` the pass read), its events,
//! the status when it changed. It runs again when its Secret changes, when its
//! CertificateAuthority or what that CA issues from changes, and at the plan's wake-up time;
//! nothing polls. A missing issuer, or one that cannot sign now, shows in the status and waits
//! for the CA to change.
//!
//! The Secret carries no owner reference: deleting an IssuedCertificate keeps its Secret (and
//! the workload using it running), as cert-manager does by default for a Certificate's Secret.
//! Delete the Secret yourself when it is no longer needed.

use std::sync::Arc;

use caretaker_pki::Usage;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use time::OffsetDateTime;

use super::authority_watch::{self, CertificateFeed, Shared, Written};
use crate::Error;
use crate::authority::leaf::{self, CertificateStep, LeafObserved, LeafPlan, LeafSecretState};
use crate::authority::{self, ObjectName, PkiMint};
use crate::changes::Event;
use crate::metrics::CertificateKind;
use crate::names;
use crate::v1alpha1::{IssuedCertificate, IssuedCertificateStatus};

/// Passes at once: enough to keep the API server busy while others sign, few enough that
/// thousands of certificates due together do not hold thousands of keys in memory at once.
const CONCURRENCY: u16 = 16;

/// Runs the controller on the IssuedCertificates and wake-ups `feed` brings.
pub(crate) async fn run(shared: Arc<Shared>, feed: CertificateFeed) {
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
            reconcile,
        )
        .await;
}

async fn reconcile(
    certificate: Arc<IssuedCertificate>,
    shared: Arc<Shared>,
) -> Result<Action, Error> {
    if certificate.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let spec = &certificate.spec;
    let policy = match spec.policy() {
        Ok(policy) => policy,
        Err(e) => {
            let message = format!("{e}; nothing was written");
            return refuse(&shared, &certificate, names::REASON_INVALID_SPEC, message).await;
        }
    };
    shared.certificate_inputs_synced().await?;
    let key = (
        certificate.namespace().unwrap_or_default(),
        spec.secret_name.clone(),
    );
    let own = (key.0.clone(), certificate.name_any());
    if let Some(conflict) = shared.certificate_conflict(&own, &key) {
        let message = format!("{conflict}; nothing was written");
        return refuse(&shared, &certificate, names::REASON_OBJECT_IN_USE, message).await;
    }
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
            &shared,
            &certificate,
            names::REASON_NAMESPACE_NOT_ALLOWED,
            message,
        )
        .await;
    }
    let now = OffsetDateTime::now_utc();
    let issuer = match shared.issuer(issuer_name, now).await? {
        Ok(issuer) => issuer,
        Err(not_ready) => return wait_for_issuer(&shared, &certificate, not_ready).await,
    };

    let secret = shared.secret(&key).await?;
    let version = secret.as_ref().and_then(|s| s.resource_version());
    if let Some(wait) = shared.behind_own_write(&key, version.as_deref()) {
        // The watch has not brought this process's own write yet: deciding on the version
        // before it would issue again for nothing. Its event wakes this certificate.
        return Ok(Action::requeue(wait));
    }
    if let Some(message) = secret
        .as_ref()
        .and_then(|s| authority_watch::not_managed("Secret", &key, &s.metadata))
    {
        return refuse(
            &shared,
            &certificate,
            names::REASON_OBJECT_NOT_MANAGED,
            message,
        )
        .await;
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
                &observing.signatures,
            ),
        };
        let held_one = matches!(&seen.secret, LeafSecretState::Present(s) if s.certificate.is_ok());
        let plan = leaf::plan(&seen, &policy, &issuer, now, &PkiMint)?;
        // Signed here: its next observations need not check the signature.
        for step in &plan.steps {
            if let (CertificateStep::Issue(issued), Ok(signer)) = (step, &issuer.signer)
                && issued.issuer == signer.certificate.fingerprint()
            {
                (observing.signatures).signed(&issued.leaf.certificate, &signer.certificate);
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
                shared.note_written(key.clone(), version.clone(), after, own.clone())
            }
            Written::Conflict => return Ok(Action::await_change()),
        }
    }
    let reference = certificate.object_ref(&());
    for event in &plan.events {
        tracing::info!(certificate = %format!("{}/{}", key.0, certificate.name_any()), reason = event.reason, note = %event.note, "IssuedCertificate event");
        shared.ctx.event(&reference, event.clone()).await;
    }
    let old = certificate.status.clone().unwrap_or_default();
    let status = status_of(&plan, &old, certificate.metadata.generation, now);
    shared.record_certificate(
        CertificateKind::IssuedCertificate,
        (&key.0, &certificate.name_any()),
        held_one && (plan.steps.iter()).any(|s| matches!(s, CertificateStep::Issue(_))),
        &plan.status,
    );
    write_status(&shared, &certificate, &status, &old).await?;
    Ok(match plan.wake_at {
        Some(at) => Action::requeue(authority_watch::until(at)),
        None => Action::await_change(),
    })
}

fn status_of(
    plan: &LeafPlan,
    old: &IssuedCertificateStatus,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> IssuedCertificateStatus {
    authority_watch::certificate_status(&plan.status, old, generation, now)
}

async fn write_status(
    shared: &Shared,
    certificate: &IssuedCertificate,
    status: &IssuedCertificateStatus,
    old: &IssuedCertificateStatus,
) -> Result<(), Error> {
    (shared.degraded).remember(
        certificate,
        authority_watch::degraded_message(&old.conditions),
        authority_watch::degraded_message(&status.conditions),
    );
    let api: Api<IssuedCertificate> = Api::namespaced(
        shared.ctx.client.clone(),
        &certificate.namespace().unwrap_or_default(),
    );
    shared.write_status(&api, certificate, status, old).await
}

/// The issuer is missing or cannot be acted on: Ready false with its reason, nothing written;
/// the CertificateAuthority's change wakes this certificate.
async fn wait_for_issuer(
    shared: &Shared,
    certificate: &IssuedCertificate,
    not_ready: authority::Condition,
) -> Result<Action, Error> {
    let old = certificate.status.clone().unwrap_or_default();
    let generation = certificate.metadata.generation;
    let as_expected = authority::Condition {
        status: false,
        reason: names::REASON_AS_EXPECTED,
        message: String::new(),
    };
    let conditions = authority_watch::conditions(
        &old.conditions,
        &not_ready,
        &as_expected,
        generation,
        OffsetDateTime::now_utc(),
    );
    let status = old.with_conditions(conditions, generation);
    write_status(shared, certificate, &status, &old).await?;
    Ok(Action::await_change())
}

/// A certificate caretaker cannot act on (its spec does not validate, its Secret is another's):
/// Ready false and Degraded with `reason`, nothing written, and a Warning unless the status
/// already says the same.
async fn refuse(
    shared: &Shared,
    certificate: &IssuedCertificate,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    let old = certificate.status.clone().unwrap_or_default();
    let read = authority_watch::degraded_message(&old.conditions);
    if shared.degraded.reported(certificate, read) != Some(message.clone()) {
        tracing::warn!(certificate = %certificate.name_any(), %message, "IssuedCertificate not acted on");
        shared
            .ctx
            .event(
                &certificate.object_ref(&()),
                Event::warning(reason, message.clone()),
            )
            .await;
    }
    let generation = certificate.metadata.generation;
    let conditions = authority_watch::refused_conditions(
        &old.conditions,
        reason,
        &message,
        generation,
        OffsetDateTime::now_utc(),
    );
    let status = old.with_conditions(conditions, generation);
    write_status(shared, certificate, &status, &old).await?;
    Ok(Action::await_change())
}
