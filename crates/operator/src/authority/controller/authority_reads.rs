//! What the CertificateAuthority and IssuedCertificate passes read from what the two share
//! ([`Shared`]): the Secrets, a CA's Secret as observed (once per version), what the
//! injection points and the certificates of a CA hold, what a certificate is issued from.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use time::OffsetDateTime;
use tokio::sync::watch;

use super::authorities::{Shared, bundle_key, ca_secret_key};
use super::authority_watch::authority_named;
use crate::Error;
use crate::authority::bundle::BundleState;
use crate::authority::ca::{AuthorityObserved, CaSecretState, IssuerView, Untrusting};
use crate::authority::index::LeafUse;
use crate::authority::secret_cache::CachedSecret;
use crate::authority::{self, Certificate, ObjectName};
use crate::injection;
use crate::ownership::Owner;
use crate::runtime::claims::{not_owned, owner_of};
use crate::runtime::write::{config_map_content, secret_content};
use crate::runtime::{Key, lock};
use caretaker_api::names;
use caretaker_api::v1alpha1::{self, CertificateAuthoritySpec, IssuedCertificate};

async fn wait_synced(flag: &watch::Sender<bool>) -> Result<(), Error> {
    flag.subscribe()
        .wait_for(|synced| *synced)
        .await
        .map(|_| ())
        .map_err(|_| Error::CacheStopped)
}

impl Shared {
    /// Waits until a CertificateAuthority's pass can see every certificate it issued: the
    /// Secrets and the IssuedCertificates are listed.
    pub(crate) async fn authority_inputs_synced(&self) -> Result<(), Error> {
        wait_synced(&self.stores.synced.secrets).await?;
        wait_synced(&self.stores.synced.certificates).await
    }

    /// Waits until an IssuedCertificate's pass can find its issuer and its Secret.
    pub(crate) async fn certificate_inputs_synced(&self) -> Result<(), Error> {
        wait_synced(&self.stores.synced.secrets).await?;
        wait_synced(&self.stores.synced.authorities).await
    }

    /// Whether the CertificateAuthority CRD is known not to be installed.
    pub(crate) fn authority_crd_missing(&self) -> bool {
        self.stores.installed.borrow().authorities == Some(false)
    }

    pub(super) fn stored_secret(&self, key: &Key) -> Option<Arc<CachedSecret>> {
        self.stores.secrets.get(key)
    }

    /// A Secret as cached; or read fresh when the cache keeps it without its data (not
    /// `kubernetes.io/tls`).
    pub(crate) async fn secret(&self, key: &Key) -> Result<Option<Arc<Secret>>, Error> {
        match self.stored_secret(key) {
            None => Ok(None),
            Some(cached) if cached.has_data() => Ok(Some(Arc::new(cached.secret(key)))),
            Some(_) => {
                let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &key.0);
                Ok(api.get_opt(&key.1).await?.map(Arc::new))
            }
        }
    }

    /// The CA Secret of `authority` as observed, read once per version.
    pub(super) fn ca_secret_state(
        &self,
        authority: &Owner,
        key: &Key,
        secret: Option<&Secret>,
    ) -> Arc<CaSecretState> {
        let Some(secret) = secret else {
            return Arc::new(CaSecretState::Absent);
        };
        if let Some(reason) = not_owned(authority, "Secret", key, &secret.metadata) {
            // Not this CA's Secret: nothing signs from it.
            return Arc::new(CaSecretState::Invalid { reason });
        }
        let version = secret.resource_version().unwrap_or_default();
        self.authority_memory.ca_secret(key, &version, || {
            let (data, annotations) = secret_content(secret);
            CaSecretState::observe(Some((&data, &annotations)))
        })
    }

    /// The CA Secret `key` as observed, when the cache holds it (`authority`'s) at a version
    /// read already: every certificate pass asks, and needs no copy of the Secret for it.
    fn known_ca_secret_state(&self, authority: &Owner, key: &Key) -> Option<Arc<CaSecretState>> {
        let stored = self
            .stored_secret(key)
            .filter(|s| s.has_data() && s.claim(authority, key).owned())?;
        (self.authority_memory).known_ca_secret(key, stored.resource_version())
    }

    /// Why the operator cannot act on a CertificateAuthority's objects: one of them is
    /// outside the one namespace it watches.
    pub(crate) fn outside_scope(&self, spec: &CertificateAuthoritySpec) -> Option<String> {
        let scope = self.scope.as_deref()?;
        [
            ("spec.secret.namespace", &spec.secret.namespace),
            ("spec.bundle.namespace", &spec.bundle.namespace),
        ]
        .into_iter()
        .find(|(_, namespace)| namespace.as_str() != scope)
        .map(|(field, namespace)| {
            format!(
                "{field}: {namespace:?} is outside the namespace the operator watches ({scope:?})"
            )
        })
    }

    /// Why a CertificateAuthority with `spec` may not keep its CA there: the administrator
    /// confines CA Secrets to some namespaces (`--authority-secret-namespaces`, as
    /// cert-manager confines ClusterIssuers' to its cluster resource namespace), and its
    /// `spec.secret.namespace` is not one of them.
    pub(crate) fn secret_namespace_refused(
        &self,
        spec: &CertificateAuthoritySpec,
    ) -> Option<String> {
        let allowed = self.ctx.settings.authority_secret_namespaces.as_ref()?;
        let namespace = &spec.secret.namespace;
        (!allowed.contains(namespace)).then(|| {
            let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
            format!(
                "spec.secret.namespace: {namespace:?} is not a namespace CertificateAuthority Secrets may be in (--authority-secret-namespaces: {})",
                allowed.join(", ")
            )
        })
    }

    /// The CAs (fingerprints) every injection point naming `authority` holds, as
    /// [`AuthorityObserved::injected`] wants them: `None` when none names it; the bundle's CAs
    /// when every one holds exactly `published` (the bundle ConfigMap's `ca-bundle.crt`);
    /// none confirmed otherwise, or while a target kind is not listed yet.
    pub(crate) fn injected(
        &self,
        authority: &str,
        published: Option<&str>,
        bundle: &BundleState,
        untrusting: &mut Untrusting,
    ) -> Option<BTreeSet<String>> {
        let listed = self.stores.synced.targets.iter().all(|s| *s.borrow());
        if !listed {
            return Some(BTreeSet::new());
        }
        let mut named = false;
        let mut all_hold = true;
        for (kind, store) in &self.stores.targets {
            for target in store.state() {
                if authority_named(*kind, &target).as_deref() != Some(authority) {
                    continue;
                }
                named = true;
                let holds = published
                    .is_some_and(|text| injection::holds_bundle(*kind, &target, text.as_bytes()));
                if !holds {
                    untrusting.add(|| format!("{} {}", kind.kind(), target.name_any()));
                }
                all_hold &= holds;
            }
        }
        match (named, all_hold) {
            (false, _) => None,
            (true, true) => Some(
                bundle
                    .certificates()
                    .iter()
                    .map(|c| c.fingerprint().to_string())
                    .collect(),
            ),
            (true, false) => Some(BTreeSet::new()),
        }
    }

    /// The CAs that signed the existing certificates of every IssuedCertificate naming
    /// `authority` (among the issuer's candidates), whether one of them (with a valid spec) has
    /// no readable certificate, and the CAs the `ca.crt` of every one that is Ready holds:
    /// [`AuthorityObserved::in_use`], [`AuthorityObserved::certificates_missing`],
    /// [`AuthorityObserved::distributed`]; each Ready one whose `ca.crt` lacks a CA of
    /// `published` (fingerprints) is added to `untrusting`. Read from the stores, each Secret
    /// version once per set of candidates.
    pub(crate) fn certificates_of(
        &self,
        authority: &str,
        issuer: &IssuerView,
        published: &BTreeSet<String>,
        untrusting: &mut Untrusting,
    ) -> (BTreeSet<String>, bool, Option<BTreeSet<String>>) {
        let candidates = issuer.candidates();
        let keys = lock(&self.index).of_issuer(authority);
        let mut in_use = BTreeSet::new();
        let mut missing = false;
        let mut distributed: Option<BTreeSet<String>> = None;
        for key in keys {
            let Some(certificate) = self
                .stores
                .certificates
                .get(&ObjectRef::new(&key.1).within(&key.0))
            else {
                continue;
            };
            let secret = (key.0.clone(), certificate.spec.secret_name.clone());
            match self.leaf_use(&owner_of(&*certificate), &secret, &candidates) {
                LeafUse::Signed { signer, ca_bundle } => {
                    // Without a copy per certificate: this runs for every certificate of the
                    // CA on each of its passes.
                    if let Some(signer) = signer.map(|i| candidates[i].fingerprint())
                        && !in_use.contains(signer)
                    {
                        in_use.insert(signer.to_string());
                    }
                    // Only a Ready certificate's: its controller writes `ca.crt` (one that
                    // cannot be written, refused say, is not Ready and holds nothing up).
                    if ready(&certificate) {
                        if !ca_bundle.is_superset(published) {
                            untrusting.add(|| {
                                format!("the ca.crt of IssuedCertificate {}/{}", key.0, key.1)
                            });
                        }
                        match &mut distributed {
                            None => distributed = Some((*ca_bundle).clone()),
                            Some(all) => all.retain(|ca| ca_bundle.contains(ca)),
                        }
                    }
                }
                // One whose spec never validates never gets a certificate: it serves none.
                LeafUse::Missing => {
                    missing |= authority::CertificatePolicy::from_spec(&certificate.spec).is_ok()
                }
            }
        }
        (in_use, missing, distributed)
    }

    /// Which of `candidates` (the first, in order) signed the certificate in the Secret `key`
    /// ([`crate::authority::index::LeafUses::of`]).
    fn leaf_use(&self, certificate: &Owner, key: &Key, candidates: &[&Certificate]) -> LeafUse {
        let secret = self.stored_secret(key);
        (self.leaf_uses).of(
            certificate,
            key,
            secret.as_deref(),
            candidates,
            &self.verified,
        )
    }

    /// What the certificates of CertificateAuthority `name` are issued from now, from its
    /// Secret as stored ([`IssuerView::observed`]); or why there is nothing to issue from
    /// (the condition a certificate shows).
    pub(crate) async fn issuer(
        &self,
        name: &str,
        now: OffsetDateTime,
    ) -> Result<Result<IssuerView, authority::Condition>, Error> {
        let not_ready = |reason, message| authority::Condition {
            status: false,
            reason,
            message,
        };
        let Some(ca) = self.stores.authorities.get(&ObjectRef::new(name)) else {
            let crd = if self.authority_crd_missing() {
                " (its CRD is not installed)"
            } else {
                ""
            };
            return Ok(Err(not_ready(
                names::REASON_ISSUER_NOT_FOUND,
                format!("CertificateAuthority {name} not found{crd}; waiting for it"),
            )));
        };
        let policy = match authority::AuthorityPolicy::from_spec(&ca.spec) {
            Ok(policy) => policy,
            Err(e) => {
                return Ok(Err(not_ready(
                    names::REASON_ISSUER_INVALID,
                    format!("CertificateAuthority {name} has an invalid spec: {e}"),
                )));
            }
        };
        if let Some(problem) =
            (self.outside_scope(&ca.spec)).or_else(|| self.secret_namespace_refused(&ca.spec))
        {
            return Ok(Err(not_ready(
                names::REASON_ISSUER_INVALID,
                format!("CertificateAuthority {name}: {problem}"),
            )));
        }
        let key = ca_secret_key(&ca.spec);
        let authority = owner_of(&*ca);
        let state = match self.known_ca_secret_state(&authority, &key) {
            Some(state) => state,
            None => self.ca_secret_state(&authority, &key, self.secret(&key).await?.as_deref()),
        };
        let bundle = match *state {
            CaSecretState::Valid(_) => BundleState::Absent,
            // Only then is the published bundle what certificates trust.
            CaSecretState::Absent | CaSecretState::Invalid { .. } => {
                let (namespace, bundle_name) = bundle_key(&ca.spec);
                let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), &namespace);
                let at = (namespace.clone(), bundle_name.clone());
                let config_map = (api.get_opt(&bundle_name).await?)
                    .filter(|c| not_owned(&authority, "ConfigMap", &at, &c.metadata).is_none());
                let content = config_map.as_ref().map(config_map_content);
                BundleState::observe(content.as_ref().map(|(d, a)| (d, a)))
            }
        };
        let seen = AuthorityObserved {
            secret_name: ObjectName::new(&key.0, &key.1),
            bundle_name: ObjectName::new(&ca.spec.bundle.namespace, &ca.spec.bundle.name),
            secret: (*state).clone(),
            bundle,
            injected: None,
            in_use: BTreeSet::new(),
            certificates_missing: false,
            distributed: None,
            untrusting: Default::default(),
            last_good: self
                .authority_memory
                .last_good(name, &ca.uid().unwrap_or_default()),
            remembered: None,
            reported_degraded: None,
        };
        Ok(Ok(IssuerView::for_certificates(
            &seen,
            policy.trust_propagation,
            now,
        )))
    }

    /// Notes that the pass of `certificate` wrote the Secret `key`, from version `before` to
    /// `after`.
    pub(crate) fn note_written(
        &self,
        key: Key,
        before: Option<String>,
        after: String,
        certificate: Key,
    ) {
        lock(&self.own_writes).note(key, before, after, certificate, Instant::now());
    }

    /// Whether the store still shows the Secret `key` as it was before this process wrote it
    /// (at `stored`): then how long to wait for the watch to bring the write, at most.
    pub(crate) fn behind_own_write(&self, key: &Key, stored: Option<&str>) -> Option<Duration> {
        lock(&self.own_writes).behind(key, stored, Instant::now())
    }
}

/// Whether an IssuedCertificate's status says Ready.
fn ready(certificate: &IssuedCertificate) -> bool {
    certificate.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == v1alpha1::CONDITION_READY && c.status == "True")
    })
}
