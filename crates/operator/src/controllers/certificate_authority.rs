//! The CertificateAuthority controller: a pass observes the CA Secret and the bundle ConfigMap
//! (read fresh), the injection points naming the CA and the certificates it issued (from the
//! shared stores, [`super::authority_watch`]), asks [`ca::plan`], and carries the plan out:
//! its writes in order (a Secret is created with type `kubernetes.io/tls`, an existing object
//! merge-patched on the `resourceVersion` the pass read; the first write that fails ends the
//! pass, and the next one starts from what is stored), then its events, then the status when
//! it changed. It runs again when one of those objects changes, and at the plan's wake-up time;
//! nothing polls.
//!
//! The last CA seen signing is kept in memory per CertificateAuthority, so that it keeps
//! signing while the CA Secret is unreadable (and nothing is regenerated). A spec that does not
//! validate writes nothing: the status says why (`InvalidSpec`), with one Warning event per
//! distinct message. Deleting a CertificateAuthority deletes nothing: its Secret and ConfigMap
//! stay, as cert-manager leaves a Certificate's Secret.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use time::OffsetDateTime;

use super::authority_watch::{self, AuthorityFeed, Shared, Written};
use crate::Error;
use crate::authority::bundle::BundleState;
use crate::authority::ca::{
    self, AuthorityObserved, AuthorityStep, CaPlan, CaSecretState, Untrusting,
};
use crate::authority::{CA_BUNDLE_CRT, ObjectName, PkiMint};
use crate::changes::Event;
use crate::metrics::CertificateKind;
use crate::names;
use crate::ownership::Claim;
use crate::timestamp::format_time;
use crate::v1alpha1::{CertificateAuthority, CertificateAuthorityStatus, PreviousCa};

/// Runs the controller on the CertificateAuthorities and wake-ups `feed` brings.
pub(crate) async fn run(shared: Arc<Shared>, feed: AuthorityFeed) {
    let wake = futures::stream::unfold(feed.wake, |mut wake| async move {
        let name = wake.recv().await?;
        Some((ObjectRef::new(&name), wake))
    });
    let store = shared.authorities.clone();
    shared
        .run_controller(
            "certificate_authority",
            feed.objects,
            store,
            wake,
            0,
            reconcile,
        )
        .await;
}

async fn reconcile(
    authority: Arc<CertificateAuthority>,
    shared: Arc<Shared>,
) -> Result<Action, Error> {
    if authority.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let name = authority.name_any();
    let policy = match authority.spec.policy() {
        Ok(policy) => policy,
        Err(e) => {
            let message = format!("{e}; nothing was written");
            return refuse(&shared, &authority, names::REASON_INVALID_SPEC, message).await;
        }
    };
    if let Some(problem) = shared.outside_scope(&authority.spec) {
        let message = format!("{problem}; nothing was written");
        return refuse(
            &shared,
            &authority,
            names::REASON_OUTSIDE_WATCHED_NAMESPACE,
            message,
        )
        .await;
    }
    if let Some(problem) = shared.secret_namespace_refused(&authority.spec) {
        let message = format!("{problem}; nothing was written");
        return refuse(
            &shared,
            &authority,
            names::REASON_NAMESPACE_NOT_ALLOWED,
            message,
        )
        .await;
    }
    shared.authority_inputs_synced().await?;

    let client = shared.ctx.client.clone();
    let secret_key = authority_watch::ca_secret_key(&authority.spec);
    let bundle_key = authority_watch::bundle_key(&authority.spec);
    let secret = Api::<Secret>::namespaced(client.clone(), &secret_key.0)
        .get_opt(&secret_key.1)
        .await?;
    let config_map = Api::<ConfigMap>::namespaced(client, &bundle_key.0)
        .get_opt(&bundle_key.1)
        .await?;
    // Only this CertificateAuthority's objects, or absent ones (see `crate::ownership`).
    let owner = authority_watch::owner_of(&*authority);
    let claims = [
        authority_watch::claim(
            &owner,
            "Secret",
            &secret_key,
            secret.as_ref().map(|s| &s.metadata),
        ),
        authority_watch::claim(
            &owner,
            "ConfigMap",
            &bundle_key,
            config_map.as_ref().map(|c| &c.metadata),
        ),
    ];
    if let Some((reason, message)) = authority_watch::refusal(&claims) {
        return refuse(&shared, &authority, reason, message).await;
    }
    if claims.contains(&Claim::Adopt) {
        // Handed over: the mark first, alone; the next pass reads them as this CA's.
        let client = &shared.ctx.client;
        if let (Claim::Adopt, Some(version)) = (
            &claims[0],
            secret.as_ref().and_then(|s| s.resource_version()),
        ) {
            authority_watch::adopt::<Secret>(client, &owner, &secret_key, &version).await?;
        }
        if let (Claim::Adopt, Some(version)) = (
            &claims[1],
            config_map.as_ref().and_then(|c| c.resource_version()),
        ) {
            authority_watch::adopt::<ConfigMap>(client, &owner, &bundle_key, &version).await?;
        }
        tracing::info!(authority = %name, "adopted its Secret or bundle ConfigMap, as their adoption request asked");
        return Ok(Action::await_change());
    }
    let mut versions = (
        secret.as_ref().and_then(|s| s.resource_version()),
        config_map.as_ref().and_then(|c| c.resource_version()),
    );
    let old = authority.status.clone().unwrap_or_default();
    let reported_degraded = shared.degraded.reported(
        &*authority,
        authority_watch::degraded_message(&old.certificate.conditions),
    );
    let now = OffsetDateTime::now_utc();

    let observing = shared.clone();
    let uid = authority.uid().unwrap_or_default();
    let (who, who_uid, secret_name, bundle_name) = (
        name.clone(),
        uid.clone(),
        ObjectName::new(&secret_key.0, &secret_key.1),
        ObjectName::new(&bundle_key.0, &bundle_key.1),
    );
    let plan = authority_watch::blocking(move || {
        let secret = secret.as_ref().map(authority_watch::secret_content);
        let bundle = config_map.as_ref().map(authority_watch::config_map_content);
        let published = bundle
            .as_ref()
            .and_then(|(data, _)| data.get(CA_BUNDLE_CRT))
            .map(String::as_str);
        let bundle_state = BundleState::observe(bundle.as_ref().map(|(d, a)| (d, a)));
        let trusted: BTreeSet<String> = (bundle_state.certificates().iter())
            .map(|ca| ca.fingerprint().to_string())
            .collect();
        let mut untrusting = Untrusting::default();
        let mut seen = AuthorityObserved {
            secret_name,
            bundle_name,
            secret: CaSecretState::observe(secret.as_ref().map(|(d, a)| (d, a))),
            injected: observing.injected(&who, published, &bundle_state, &mut untrusting),
            bundle: bundle_state,
            in_use: BTreeSet::new(),
            certificates_missing: false,
            distributed: None,
            untrusting: Untrusting::default(),
            last_good: observing.last_good(&who, &who_uid),
            remembered: Some(observing.remembered_cas(&who, &who_uid)),
            reported_degraded,
        };
        let candidates = ca::in_use_candidates(&seen, now);
        // With no propagation time, `ca.crt` holds no next CA up (see `ca::plan`): the
        // status names only the injection points it waits for.
        let mut ca_crt_untrusting = Untrusting::default();
        (seen.in_use, seen.certificates_missing, seen.distributed) = observing.certificates_of(
            &who,
            &candidates,
            &trusted,
            match policy.trust_propagation.is_zero() {
                true => &mut ca_crt_untrusting,
                false => &mut untrusting,
            },
        );
        seen.untrusting = untrusting;
        ca::plan(&seen, &policy, now, &PkiMint)
    })
    .await
    .map_err(|source| Error::CaCreationFailed {
        authority: name.clone(),
        source,
    })
    .inspect_err(|e| {
        (shared.ctx.metrics).rotation_failed(CertificateKind::CertificateAuthority, e)
    })?;

    let total = plan.steps.len();
    for (done, step) in plan.steps.iter().enumerate() {
        let written = match step {
            AuthorityStep::WriteSecret(secret) => {
                authority_watch::write_secret(
                    &shared.ctx.client,
                    &owner,
                    &secret_key,
                    versions.0.as_deref(),
                    &secret.data(),
                    &secret.annotation_changes(),
                )
                .await
            }
            AuthorityStep::WriteBundle(bundle) => {
                authority_watch::write_config_map(
                    &shared.ctx.client,
                    &owner,
                    &bundle_key,
                    versions.1.as_deref(),
                    &bundle.data(),
                    &bundle.annotation_changes(),
                )
                .await
            }
        };
        let version = match written {
            Ok(Written::Done(version)) => version,
            Ok(Written::Conflict) => {
                tracing::info!(authority = %name, written = done, of = total, "an object changed since this pass read it; the next pass starts from what is stored");
                return Ok(Action::await_change());
            }
            Err(e) => {
                (shared.ctx.metrics).rotation_failed(CertificateKind::CertificateAuthority, &e);
                if done > 0 {
                    tracing::info!(authority = %name, written = done, of = total, "a write failed; the next pass starts from what is stored");
                }
                return Err(e);
            }
        };
        match step {
            AuthorityStep::WriteSecret(_) => versions.0 = Some(version),
            AuthorityStep::WriteBundle(_) => versions.1 = Some(version),
        }
    }

    let reference = authority.object_ref(&());
    for event in &plan.events {
        tracing::info!(authority = %name, reason = event.reason, note = %event.note, "CertificateAuthority event");
        shared.ctx.event(&reference, event.clone()).await;
    }
    shared.set_last_good(&name, &uid, plan.issuer.signer.clone().ok());
    shared.remember_cas(&name, &uid, plan.held.clone());
    let status = status_of(&plan, &old, authority.metadata.generation, now);
    shared.record_certificate(
        CertificateKind::CertificateAuthority,
        ("", &name),
        // A CA that signs now in place of another.
        (plan.events.iter()).any(|e| e.reason == names::EVENT_SIGNER_PROMOTED),
        &plan.status.certificate(),
    );
    write_status(&shared, &authority, &status, &old).await?;
    Ok(match plan.wake_at {
        Some(at) => Action::requeue(authority_watch::until(at)),
        None => Action::await_change(),
    })
}

/// The status once the plan's writes are in place.
fn status_of(
    plan: &CaPlan,
    old: &CertificateAuthorityStatus,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> CertificateAuthorityStatus {
    let status = &plan.status;
    CertificateAuthorityStatus {
        certificate: authority_watch::certificate_status(
            &status.certificate(),
            &old.certificate,
            generation,
            now,
        ),
        trusted_since: status.trusted_since.map(format_time),
        previous_cas: status
            .previous
            .iter()
            .map(|ca| PreviousCa {
                serial_number: ca.serial.clone(),
                not_after: format_time(ca.not_after),
            })
            .collect(),
    }
}

/// Writes the status subresource, only when it changed.
async fn write_status(
    shared: &Shared,
    authority: &CertificateAuthority,
    status: &CertificateAuthorityStatus,
    old: &CertificateAuthorityStatus,
) -> Result<(), Error> {
    (shared.degraded).remember(
        authority,
        authority_watch::degraded_message(&old.certificate.conditions),
        authority_watch::degraded_message(&status.certificate.conditions),
    );
    let api: Api<CertificateAuthority> = Api::all(shared.ctx.client.clone());
    shared.write_status(&api, authority, status, old).await
}

/// A spec caretaker cannot act on: Ready false and Degraded with `reason`, nothing written,
/// and a Warning unless the status already says the same.
async fn refuse(
    shared: &Shared,
    authority: &CertificateAuthority,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    let old = authority.status.clone().unwrap_or_default();
    let read = authority_watch::degraded_message(&old.certificate.conditions);
    if shared.degraded.reported(authority, read) != Some(message.clone()) {
        tracing::warn!(authority = %authority.name_any(), reason, %message, "CertificateAuthority not acted on");
        shared
            .ctx
            .event(
                &authority.object_ref(&()),
                Event::warning(reason, message.clone()),
            )
            .await;
    }
    let generation = authority.metadata.generation;
    let conditions = authority_watch::refused_conditions(
        &old.certificate.conditions,
        reason,
        &message,
        generation,
        OffsetDateTime::now_utc(),
    );
    let status = CertificateAuthorityStatus {
        certificate: old.certificate.with_conditions(conditions, generation),
        ..old.clone()
    };
    write_status(shared, authority, &status, &old).await?;
    Ok(Action::await_change())
}
