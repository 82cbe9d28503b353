//! What the CertificateAuthority and IssuedCertificate controllers
//! ([`super::certificate_authority`], [`super::issued_certificate`]) share, as records that say
//! what they hold: the watch-fed stores ([`Stores`], kept by [`super::authority_watch`]), the
//! certificate index and what each certificate Secret says of the CAs in use
//! ([`crate::authority::index`]), what passes remember ([`crate::authority::memory`],
//! [`crate::runtime::status`]), and the controllers' inputs ([`Feeds`]). What a pass reads
//! from them is [`super::authority_reads`].

use std::fmt;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::DynamicObject;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use serde::de::DeserializeOwned;
use std::future::Future;
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::authority;
use crate::authority::index::{CertificateIndex, LeafUses};
use crate::authority::memory::{AuthorityMemory, OwnWrites};
use crate::authority::secret_cache::SecretCache;
use crate::authority::verified::Verified;
use crate::context::Context;
use crate::injection::TargetKind;
use crate::metrics::CertificateKind;
use crate::runtime::status::{Statuses, conditions};
use crate::runtime::{Key, lock};
use crate::timestamp::format_time;
use caretaker_api::v1alpha1::{
    self, CertificateAuthority, CertificateAuthoritySpec, IssuedCertificate,
};

/// The inputs of the two controllers: the objects they act on, and wake-ups of those objects
/// from changes of what they read.
pub(crate) struct AuthorityFeed {
    pub objects: mpsc::UnboundedReceiver<CertificateAuthority>,
    pub wake: mpsc::UnboundedReceiver<String>,
}

pub(crate) struct CertificateFeed {
    pub objects: mpsc::UnboundedReceiver<IssuedCertificate>,
    pub wake: mpsc::UnboundedReceiver<Key>,
}

/// Whether each of caretaker's CRDs is installed; `None` until the CRDs are listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Installed {
    pub authorities: Option<bool>,
    pub certificates: Option<bool>,
}

impl Installed {
    pub(super) fn any(&self) -> bool {
        self.authorities == Some(true) || self.certificates == Some(true)
    }
}

/// Whether each store has been listed.
pub(crate) struct Synced {
    pub(super) secrets: watch::Sender<bool>,
    /// Also true while the CRD is not installed: there is nothing to list.
    pub(super) authorities: watch::Sender<bool>,
    pub(super) certificates: watch::Sender<bool>,
    pub(super) targets: Vec<watch::Sender<bool>>,
}

/// caretaker's own kinds (CertificateAuthority, IssuedCertificate), as the watches and the
/// controller runner take them.
pub(crate) trait OwnKind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

impl<K> OwnKind for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

/// The store writers, for [`super::authority_watch::run`].
pub(crate) struct Writers {
    pub authorities: Writer<CertificateAuthority>,
    pub certificates: Writer<IssuedCertificate>,
    pub targets: Vec<(TargetKind, Writer<DynamicObject>)>,
}

/// Everything the two controllers share.
pub(crate) struct Shared {
    pub ctx: Arc<Context>,
    /// The only namespace Secrets, ConfigMaps and IssuedCertificates are read from, if the
    /// operator watches only one.
    pub scope: Option<String>,
    /// What the watches keep.
    pub stores: Stores,
    /// The IssuedCertificates by Secret and by issuer.
    pub(super) index: Mutex<CertificateIndex>,
    /// What each certificate Secret says of the CAs in use.
    pub(super) leaf_uses: LeafUses,
    /// Signatures and keys known to verify: those of the leaves this process issued, and
    /// those checked.
    pub verified: Verified,
    /// What the CertificateAuthority passes remember of each CA.
    pub authority_memory: AuthorityMemory,
    /// Secrets a certificate pass wrote, until the store shows the write.
    pub(super) own_writes: Mutex<OwnWrites>,
    /// What each object's last pass said in its status.
    pub statuses: Statuses,
    /// Where the watches send the controllers their objects and wake-ups.
    pub(super) feeds: FeedSenders,
    /// Held while a certificate's expiry series is set or removed (see
    /// [`Shared::record_certificate`]).
    pub(super) series: Mutex<()>,
}

/// What the watches keep: caretaker's two kinds, the Secrets, the injection targets, whether
/// caretaker's CRDs are installed and whether each store has been listed.
pub(crate) struct Stores {
    pub(super) installed: watch::Sender<Installed>,
    pub authorities: Store<CertificateAuthority>,
    pub certificates: Store<IssuedCertificate>,
    /// The Secrets of CAs and certificates (every Secret in scope, small).
    pub(super) secrets: SecretCache,
    pub(super) targets: Vec<(TargetKind, Store<DynamicObject>)>,
    pub(super) synced: Synced,
}

/// The sending ends of the controllers' inputs ([`AuthorityFeed`], [`CertificateFeed`]).
pub(crate) struct FeedSenders {
    pub(super) wake_authorities: mpsc::UnboundedSender<String>,
    pub(super) wake_certificates: mpsc::UnboundedSender<Key>,
    pub(super) authority_objects: mpsc::UnboundedSender<CertificateAuthority>,
    pub(super) certificate_objects: mpsc::UnboundedSender<IssuedCertificate>,
    /// CAs to be woken once their certificates' Secrets settle
    /// ([`super::authority_watch::CERTIFICATES_SETTLE`]).
    pub(super) settling: Mutex<std::collections::HashSet<String>>,
}

/// The shared state, the writers [`super::authority_watch::run`] fills it with, and the controllers' inputs.
pub(crate) fn start(
    ctx: Arc<Context>,
    scope: Option<String>,
) -> (Arc<Shared>, Writers, AuthorityFeed, CertificateFeed) {
    let authorities = Writer::new(());
    let certificates = Writer::new(());
    let targets: Vec<(TargetKind, Writer<DynamicObject>)> = TargetKind::ALL
        .into_iter()
        .map(|kind| (kind, Writer::new(kind.api_resource())))
        .collect();
    let (authority_objects, authority_objects_rx) = mpsc::unbounded_channel();
    let (wake_authorities, wake_authorities_rx) = mpsc::unbounded_channel();
    let (certificate_objects, certificate_objects_rx) = mpsc::unbounded_channel();
    let (wake_certificates, wake_certificates_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        ctx,
        scope,
        stores: Stores {
            installed: watch::Sender::new(Installed::default()),
            authorities: authorities.as_reader(),
            certificates: certificates.as_reader(),
            secrets: SecretCache::default(),
            targets: targets.iter().map(|(k, w)| (*k, w.as_reader())).collect(),
            synced: Synced {
                secrets: watch::Sender::new(false),
                authorities: watch::Sender::new(false),
                certificates: watch::Sender::new(false),
                targets: targets.iter().map(|_| watch::Sender::new(false)).collect(),
            },
        },
        index: Mutex::default(),
        leaf_uses: LeafUses::default(),
        verified: Verified::default(),
        authority_memory: AuthorityMemory::default(),
        own_writes: Mutex::default(),
        statuses: Statuses::default(),
        feeds: FeedSenders {
            wake_authorities,
            wake_certificates,
            authority_objects,
            certificate_objects,
            settling: Mutex::default(),
        },
        series: Mutex::default(),
    });
    let writers = Writers {
        authorities,
        certificates,
        targets,
    };
    (
        shared,
        writers,
        AuthorityFeed {
            objects: authority_objects_rx,
            wake: wake_authorities_rx,
        },
        CertificateFeed {
            objects: certificate_objects_rx,
            wake: wake_certificates_rx,
        },
    )
}

impl Shared {
    /// Runs one of the two controllers until its feed ends: on `objects` when their generation
    /// changed (status writes, its own, wake nothing) and on `wake`, at most `concurrency`
    /// passes at once (0: no limit). A failed pass shows in the object's status and events,
    /// and is counted under `controller`.
    pub(crate) async fn run_controller<K, Fut>(
        self: &Arc<Self>,
        controller: &'static str,
        objects: mpsc::UnboundedReceiver<K>,
        store: Store<K>,
        wake: impl Stream<Item = ObjectRef<K>> + Send + 'static,
        concurrency: u16,
        reconcile: impl FnMut(Arc<K>, Arc<Shared>) -> Fut,
    ) where
        K: OwnKind,
        Fut: Future<Output = Result<Action, Error>> + Send + 'static,
    {
        let objects = futures::stream::unfold(objects, |mut objects| async move {
            let object = objects.recv().await?;
            Some((Ok::<_, watcher::Error>(object), objects))
        })
        .predicate_filter(predicates::generation, Default::default());
        let error_policy = move |_: Arc<K>, error: &Error, shared: Arc<Shared>| {
            crate::runtime::requeue_after(controller, error, &shared.ctx)
        };
        let mut reconcile = reconcile;
        let timed = move |object: Arc<K>, shared: Arc<Shared>| {
            let timer = shared.ctx.reconcile_started(controller);
            let pass = reconcile(object, shared);
            async move {
                let _timer = timer;
                pass.await
            }
        };
        Controller::for_stream_with(objects, store, ())
            .reconcile_on(wake)
            .with_config(Config::default().concurrency(concurrency))
            .graceful_shutdown_on(self.ctx.shutdown.signal())
            .run(timed, error_policy, self.clone())
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "{} reconcile failed", K::kind(&()));
                }
            })
            .await;
    }

    /// Records in the metrics what a pass left in place: when the certificate of `kind`
    /// `namespace`/`name` expires (its series goes when it has none), and whether the pass
    /// replaced a certificate (`rotated`).
    pub(crate) fn record_certificate(
        &self,
        kind: CertificateKind,
        (namespace, name): (&str, &str),
        rotated: bool,
        now: &authority::CertificateStatus,
    ) {
        let metrics = &self.ctx.metrics;
        {
            // A pass that ends after its object was deleted must not bring its series back:
            // the watch removes it, under this lock, once the store no longer holds it.
            let _series = lock(&self.series);
            match now.not_after {
                Some(not_after) if self.exists(kind, namespace, name) => metrics
                    .set_certificate_expiry_and_renewal(
                        kind,
                        namespace,
                        name,
                        not_after,
                        now.next_rotation,
                    ),
                _ => metrics.remove_certificate_expiry(kind, namespace, name),
            }
        }
        if rotated {
            metrics.rotated(kind);
        }
    }

    /// Remembers the Degraded message a pass gives `object`'s status (`now`; `read`: the one
    /// it was read with), and shows it in `caretaker_degraded`.
    pub(crate) fn record_degraded<K: Resource<DynamicType = ()>>(
        &self,
        kind: CertificateKind,
        object: &K,
        read: Option<&str>,
        now: Option<&str>,
    ) {
        self.statuses.degraded.remember(object, read, now);
        let namespace = object.meta().namespace.as_deref().unwrap_or_default();
        let name = object.meta().name.as_deref().unwrap_or_default();
        // As with the expiry series: none for an object deleted meanwhile.
        let _series = lock(&self.series);
        let degraded = now.is_some() && self.exists(kind, namespace, name);
        (self.ctx.metrics).set_degraded(kind.as_str(), namespace, name, degraded);
    }

    /// Whether the store still holds the `kind` object `namespace`/`name`.
    fn exists(&self, kind: CertificateKind, namespace: &str, name: &str) -> bool {
        match kind {
            CertificateKind::CertificateAuthority => {
                self.stores.authorities.get(&ObjectRef::new(name)).is_some()
            }
            _ => (self.stores.certificates)
                .get(&ObjectRef::new(name).within(namespace))
                .is_some(),
        }
    }
}

/// The CA Secret a CertificateAuthority names.
pub(crate) fn ca_secret_key(spec: &CertificateAuthoritySpec) -> Key {
    (spec.secret.namespace.clone(), spec.secret.name.clone())
}

/// The bundle ConfigMap a CertificateAuthority names.
pub(crate) fn bundle_key(spec: &CertificateAuthoritySpec) -> Key {
    (spec.bundle.namespace.clone(), spec.bundle.name.clone())
}

/// The status of a certificate (an IssuedCertificate's, or a CertificateAuthority's CA that
/// signs now) once a plan's writes are in place.
pub(crate) fn certificate_status(
    planned: &authority::CertificateStatus,
    old: &v1alpha1::CertificateStatus,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> v1alpha1::CertificateStatus {
    v1alpha1::CertificateStatus {
        conditions: conditions(
            &old.conditions,
            &planned.ready,
            &planned.degraded,
            generation,
            now,
        ),
        serial_number: planned.serial.clone(),
        not_before: planned.not_before.map(format_time),
        not_after: planned.not_after.map(format_time),
        next_rotation: planned.next_rotation.map(format_time),
        observed_generation: generation,
    }
}
