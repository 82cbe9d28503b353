//! The CertificateAuthority controller: a pass observes the CA Secret and the bundle ConfigMap
//! (read fresh), the injection points naming the CA and the certificates it issued (from the
//! shared stores, [`super::authorities`]), asks [`ca::plan`], and carries the plan out:
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

use super::authorities::{self, AuthorityFeed, Shared};
use crate::Error;
use crate::authority::bundle::BundleState;
use crate::authority::ca::{
    self, AuthorityObserved, AuthorityStep, CaPlan, CaSecretState, Untrusting,
};
use crate::authority::{AuthorityPolicy, ObjectName, PkiMint};
use crate::changes::Event;
use crate::metrics::CertificateKind;
use crate::ownership::{Claim, Owner};
use crate::runtime::refuse::{Refusal, ShowRefusal, refuse};
use crate::runtime::steps::{Applied, Failed, ObjectKind, Step, StepWriter, no_gate};
use crate::runtime::{self, Key, claims, status, write};
use crate::timestamp::format_time;
use caretaker_api::names;
use caretaker_api::names::CA_BUNDLE_CRT;
use caretaker_api::v1alpha1::{
    CertificateAuthority, CertificateAuthoritySpec, CertificateAuthorityStatus, PreviousCa,
};

/// Runs the controller on the CertificateAuthorities and wake-ups `feed` brings.
pub(crate) async fn run(shared: Arc<Shared>, feed: AuthorityFeed) {
    let wake = futures::stream::unfold(feed.wake, |mut wake| async move {
        let name = wake.recv().await?;
        Some((ObjectRef::new(&name), wake))
    });
    let store = shared.stores.authorities.clone();
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
    let policy = match acceptable(&shared, &authority.spec) {
        Ok(policy) => policy,
        Err((reason, problem)) => {
            let message = format!("{problem}; nothing was written");
            return refuse(&*shared, &*authority, reason, message).await;
        }
    };
    shared.authority_inputs_synced().await?;
    let objects = Objects::read(&shared, &authority).await?;
    if let Some((reason, message)) = claims::refusal(&objects.claims) {
        return refuse(&*shared, &*authority, reason, message).await;
    }
    if objects.claims.contains(&Claim::Adopt) {
        return adopt(&shared, &authority, &objects).await;
    }
    let (name, uid) = (authority.name_any(), authority.uid().unwrap_or_default());
    let owner = claims::owner_of(&*authority);
    let (mut writer, keys) = objects.writer(&shared.ctx.client, &owner);
    let old = authority.status.clone().unwrap_or_default();
    let now = OffsetDateTime::now_utc();
    let plan = plan(&shared, &authority, objects, policy, now).await?;
    let to_step = |step: &AuthorityStep| step_of(step, &keys);
    let applied = writer
        .apply(&plan.steps, to_step, no_gate, |_, _, _| {})
        .await;
    if let Some(stop) = stopped(&shared, &name, plan.steps.len(), applied)? {
        return Ok(stop);
    }
    let reference = authority.object_ref(&());
    for event in &plan.events {
        tracing::info!(authority = %name, reason = event.reason, note = %event.note, "CertificateAuthority event");
        shared.ctx.event(&reference, event.clone()).await;
    }
    let memory = &shared.authority_memory;
    memory.set_last_good(&name, &uid, plan.issuer.signer.clone().ok());
    memory.remember_cas(&name, &uid, plan.held.clone());
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
        Some(at) => Action::requeue(runtime::until(at)),
        None => Action::await_change(),
    })
}

/// The policy of a spec the operator may act on; or why not (a reason and the problem): the
/// spec does not validate, names a namespace outside the one watched, or keeps its CA in a
/// namespace CA Secrets may not be in.
fn acceptable(
    shared: &Shared,
    spec: &CertificateAuthoritySpec,
) -> Result<AuthorityPolicy, (&'static str, String)> {
    let policy = AuthorityPolicy::from_spec(spec)
        .map_err(|e| (names::REASON_INVALID_SPEC, e.to_string()))?;
    if let Some(problem) = shared.outside_scope(spec) {
        return Err((names::REASON_OUTSIDE_WATCHED_NAMESPACE, problem));
    }
    if let Some(problem) = shared.secret_namespace_refused(spec) {
        return Err((names::REASON_NAMESPACE_NOT_ALLOWED, problem));
    }
    Ok(policy)
}

/// The CA Secret and the bundle ConfigMap as a pass reads them (fresh), and whether the
/// CertificateAuthority may write each.
struct Objects {
    secret_key: Key,
    bundle_key: Key,
    secret: Option<Secret>,
    config_map: Option<ConfigMap>,
    /// The Secret's, then the ConfigMap's (see `crate::ownership`).
    claims: [Claim; 2],
}

impl Objects {
    async fn read(shared: &Shared, authority: &CertificateAuthority) -> Result<Self, Error> {
        let client = shared.ctx.client.clone();
        let secret_key = authorities::ca_secret_key(&authority.spec);
        let bundle_key = authorities::bundle_key(&authority.spec);
        let secret = Api::<Secret>::namespaced(client.clone(), &secret_key.0)
            .get_opt(&secret_key.1)
            .await?;
        let config_map = Api::<ConfigMap>::namespaced(client, &bundle_key.0)
            .get_opt(&bundle_key.1)
            .await?;
        // Only this CertificateAuthority's objects, or absent ones.
        let owner = claims::owner_of(authority);
        let claims = [
            claims::claim(
                &owner,
                "Secret",
                &secret_key,
                secret.as_ref().map(|s| &s.metadata),
            ),
            claims::claim(
                &owner,
                "ConfigMap",
                &bundle_key,
                config_map.as_ref().map(|c| &c.metadata),
            ),
        ];
        Ok(Self {
            secret_key,
            bundle_key,
            secret,
            config_map,
            claims,
        })
    }

    /// The writer of the pass's steps, on the versions read, and where they write (the
    /// Secret, the ConfigMap).
    fn writer<'a>(
        &self,
        client: &'a kube::Client,
        owner: &'a Owner,
    ) -> (StepWriter<'a>, (Key, Key)) {
        let mut writer = StepWriter::new(client, owner);
        let keys = (self.secret_key.clone(), self.bundle_key.clone());
        writer.read(ObjectKind::Secret, keys.0.clone(), self.version(0));
        writer.read(ObjectKind::ConfigMap, keys.1.clone(), self.version(1));
        (writer, keys)
    }

    /// The version read of the Secret (0) or the ConfigMap (1).
    fn version(&self, which: usize) -> Option<String> {
        match which {
            0 => self.secret.as_ref().and_then(|s| s.resource_version()),
            _ => self.config_map.as_ref().and_then(|c| c.resource_version()),
        }
    }
}

/// Handed over: the marks first, alone; the next pass reads the objects as this CA's.
async fn adopt(
    shared: &Shared,
    authority: &CertificateAuthority,
    objects: &Objects,
) -> Result<Action, Error> {
    let client = &shared.ctx.client;
    let owner = claims::owner_of(authority);
    if let (Claim::Adopt, Some(version)) = (&objects.claims[0], objects.version(0)) {
        write::adopt::<Secret>(client, &owner, &objects.secret_key, &version).await?;
    }
    if let (Claim::Adopt, Some(version)) = (&objects.claims[1], objects.version(1)) {
        write::adopt::<ConfigMap>(client, &owner, &objects.bundle_key, &version).await?;
    }
    tracing::info!(authority = %authority.name_any(), "adopted its Secret or bundle ConfigMap, as their adoption request asked");
    Ok(Action::await_change())
}

/// What the plan decides from `objects`, the injection points and the certificates of the CA
/// (off the async threads: it parses, and may make a key); a failure is counted.
async fn plan(
    shared: &Arc<Shared>,
    authority: &CertificateAuthority,
    objects: Objects,
    policy: AuthorityPolicy,
    now: OffsetDateTime,
) -> Result<CaPlan, Error> {
    let name = authority.name_any();
    let reported_degraded = shared.reported(authority);
    let (observing, who, uid) = (shared.clone(), name.clone(), authority.uid());
    let uid = uid.unwrap_or_default();
    runtime::blocking(move || {
        let memory = &observing.authority_memory;
        let secret = objects.secret.as_ref().map(write::secret_content);
        let bundle = objects.config_map.as_ref().map(write::config_map_content);
        let published = bundle
            .as_ref()
            .and_then(|(data, _)| data.get(CA_BUNDLE_CRT))
            .map(String::as_str);
        let bundle_state = BundleState::observe(bundle.as_ref().map(|(d, a)| (d, a)));
        let trusted: BTreeSet<String> = (bundle_state.certificates().iter())
            .map(|ca| ca.fingerprint().to_string())
            .collect();
        let mut untrusting = Untrusting::default();
        let (secret_key, bundle_key) = (&objects.secret_key, &objects.bundle_key);
        let mut seen = AuthorityObserved {
            secret_name: ObjectName::new(&secret_key.0, &secret_key.1),
            bundle_name: ObjectName::new(&bundle_key.0, &bundle_key.1),
            secret: CaSecretState::observe(secret.as_ref().map(|(d, a)| (d, a))),
            injected: observing.injected(&who, published, &bundle_state, &mut untrusting),
            bundle: bundle_state,
            in_use: BTreeSet::new(),
            certificates_missing: false,
            distributed: None,
            untrusting: Untrusting::default(),
            last_good: memory.last_good(&who, &uid),
            remembered: Some(memory.remembered_cas(&who, &uid)),
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
        authority: name,
        source,
    })
    .inspect_err(|e| (shared.ctx.metrics).rotation_failed(CertificateKind::CertificateAuthority, e))
}

/// A step's write: the CA Secret or the bundle ConfigMap (`keys`).
fn step_of(step: &AuthorityStep, (secret_key, bundle_key): &(Key, Key)) -> Step {
    match step {
        AuthorityStep::WriteSecret(secret) => Step::TlsSecret {
            key: secret_key.clone(),
            data: secret.data(),
            annotations: secret.annotation_changes(),
        },
        AuthorityStep::WriteBundle(bundle) => Step::ConfigMap {
            key: bundle_key.clone(),
            data: bundle.data(),
            annotations: bundle.annotation_changes(),
        },
    }
}

/// How a pass goes on after its writes: `None` when all were made; else it ends (a conflict:
/// the next pass starts from what is stored; a failure: the error).
fn stopped(
    shared: &Shared,
    name: &str,
    total: usize,
    applied: Result<Applied, Failed>,
) -> Result<Option<Action>, Error> {
    match applied {
        Ok(Applied::All) => Ok(None),
        Ok(Applied::Conflict { written } | Applied::Gated { written }) => {
            tracing::info!(authority = %name, written, of = total, "an object changed since this pass read it; the next pass starts from what is stored");
            Ok(Some(Action::await_change()))
        }
        Err(Failed { written, error }) => {
            (shared.ctx.metrics).rotation_failed(CertificateKind::CertificateAuthority, &error);
            if written > 0 {
                tracing::info!(authority = %name, written, of = total, "a write failed; the next pass starts from what is stored");
            }
            Err(error)
        }
    }
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
        certificate: authorities::certificate_status(
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
    shared.record_degraded(
        CertificateKind::CertificateAuthority,
        authority,
        status::degraded_message(&old.certificate.conditions),
        status::degraded_message(&status.certificate.conditions),
    );
    let api: Api<CertificateAuthority> = Api::all(shared.ctx.client.clone());
    shared
        .statuses
        .written
        .write(&api, authority, status, old)
        .await
}

impl ShowRefusal<CertificateAuthority> for Shared {
    fn reported(&self, authority: &CertificateAuthority) -> Option<String> {
        let old = authority.status.as_ref().map(|s| &s.certificate.conditions);
        let read = old.and_then(|conditions| status::degraded_message(conditions));
        self.statuses.degraded.reported(authority, read)
    }

    /// Ready false and Degraded with the refusal's reason, nothing else written; then the
    /// Warning.
    async fn show(
        &self,
        authority: &CertificateAuthority,
        refusal: &Refusal,
        warning: Option<Event>,
    ) -> Result<(), Error> {
        let old = authority.status.clone().unwrap_or_default();
        let generation = authority.metadata.generation;
        let conditions = status::refused_conditions(
            &old.certificate.conditions,
            refusal.reason,
            &refusal.message,
            generation,
            OffsetDateTime::now_utc(),
        );
        let status = CertificateAuthorityStatus {
            certificate: old.certificate.with_conditions(conditions, generation),
            ..old.clone()
        };
        let api: Api<CertificateAuthority> = Api::all(self.ctx.client.clone());
        self.statuses
            .written
            .write(&api, authority, &status, &old)
            .await?;
        if let Some(warning) = warning {
            self.ctx.event(&authority.object_ref(&()), warning).await;
        }
        self.record_degraded(
            CertificateKind::CertificateAuthority,
            authority,
            status::degraded_message(&old.certificate.conditions),
            Some(&refusal.message),
        );
        Ok(())
    }
}
