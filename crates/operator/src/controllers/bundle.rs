//! The Bundle controller: trust-manager's reconcile ([`crate::trust::plan`]) on watch-fed
//! stores, so caretaker can stand in for a running trust-manager.
//!
//! | watched | kept | a change wakes |
//! |---|---|---|
//! | Bundles | all | the Bundle |
//! | Namespaces | labels and phase | every Bundle (one may start or stop matching) |
//! | ConfigMaps and Secrets of the trust namespace | all | the Bundles with a source of that kind naming it or selecting it |
//! | ConfigMaps (and Secrets, with Secret targets) labelled `trust.cert-manager.io/bundle` | all | the Bundle the label names |
//!
//! Until trust-manager's Bundle CRD is installed only a watch on that CRD runs; the log says so
//! once. A pass waits until every store has listed, so a target not yet seen is never taken for
//! missing. Target data is never read, only metadata, as trust-manager does: the stores keep
//! targets without their data (and every object cut down to what a pass reads), since the
//! embedded API server does not serve metadata-only watches yet.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use crate::Error;
use crate::context::Context;
use crate::trust::api::{BUNDLE_LABEL, Bundle, FIELD_MANAGER, HASH_ANNOTATION};
use crate::trust::plan::{self, NamespaceView, Observed, Outcome, StatusChange};
use crate::trust::selector::Selector;
use crate::trust::sources::SourceContext;
use crate::trust::target::{ObservedTarget, Owner, TargetKind, cleanup_body};

/// The name of trust-manager's Bundle CRD.
pub const BUNDLE_CRD: &str = "bundles.trust.cert-manager.io";
/// The controller's name in metrics and logs.
const CONTROLLER: &str = "bundle";
/// How many target writes a pass has in flight at once.
const CONCURRENT_WRITES: usize = 8;

/// What the passes read.
struct Stores {
    ctx: Arc<Context>,
    bundles: Store<Bundle>,
    namespaces: Store<Namespace>,
    sources: Store<ConfigMap>,
    secret_sources: Store<Secret>,
    config_map_targets: Store<ConfigMap>,
    secret_targets: Option<Store<Secret>>,
}

/// Runs the Bundle controller until its streams end; idle until the Bundle CRD is installed.
pub async fn run(ctx: Arc<Context>) {
    let client = ctx.client.clone();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    if !matches!(crds.get_opt(BUNDLE_CRD).await, Ok(Some(_))) {
        tracing::info!(
            crd = BUNDLE_CRD,
            "trust-manager's Bundle CRD is not installed: the Bundle controller waits for it"
        );
        let installed = kube::runtime::wait::await_condition(
            crds,
            BUNDLE_CRD,
            |crd: Option<&CustomResourceDefinition>| crd.is_some(),
        );
        if let Err(e) = installed.await {
            tracing::warn!(error = %e, "the Bundle controller stopped waiting for its CRD");
            return;
        }
    }
    let trust = &ctx.settings.trust;
    tracing::info!(trust_namespace = %trust.namespace, "Bundle controller starting");

    let labelled = watcher::Config::default().labels(BUNDLE_LABEL);
    let (namespaces, namespace_changes) = watched(
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        trim_namespace,
    );
    let (sources, source_changes) = watched(
        Api::<ConfigMap>::namespaced(client.clone(), &trust.namespace),
        watcher::Config::default(),
        trim_source,
    );
    let (secret_sources, secret_source_changes) = watched(
        Api::<Secret>::namespaced(client.clone(), &trust.namespace),
        watcher::Config::default(),
        trim_source,
    );
    let (config_map_targets, config_map_target_changes) = watched(
        Api::<ConfigMap>::all(client.clone()),
        labelled.clone(),
        trim_config_map_target,
    );
    let (secret_targets, secret_target_changes) = if trust.bundles.secret_targets_enabled {
        let (store, changes) = watched(
            Api::<Secret>::all(client.clone()),
            labelled,
            trim_secret_target,
        );
        (Some(store), changes.boxed())
    } else {
        (None, futures::stream::empty().boxed())
    };

    let controller = Controller::new(Api::<Bundle>::all(client), watcher::Config::default());
    let stores = Arc::new(Stores {
        ctx: ctx.clone(),
        bundles: controller.store(),
        namespaces,
        sources,
        secret_sources,
        config_map_targets,
        secret_targets,
    });
    let wakes = {
        let bundles = stores.bundles.clone();
        let every_bundle = move || {
            bundles
                .state()
                .iter()
                .map(|b| ObjectRef::from_obj(&**b))
                .collect::<Vec<_>>()
        };
        let by_source = |kind: TargetKind| {
            let bundles = stores.bundles.clone();
            move |(name, labels): (String, BTreeMap<String, String>)| {
                bundles
                    .state()
                    .iter()
                    .filter(|b| reads_source(b, kind, &name, &labels))
                    .map(|b| ObjectRef::from_obj(&**b))
                    .collect::<Vec<_>>()
            }
        };
        let named = |name: Option<String>| {
            name.map(|n| ObjectRef::<Bundle>::new(&n))
                .into_iter()
                .collect::<Vec<_>>()
        };
        futures::stream::select_all([
            namespace_changes
                .map(move |_: Namespace| every_bundle())
                .boxed(),
            source_changes
                .map(|c: ConfigMap| (c.name_any(), c.labels().clone()))
                .map(by_source(TargetKind::ConfigMap))
                .boxed(),
            secret_source_changes
                .map(|s: Secret| (s.name_any(), s.labels().clone()))
                .map(by_source(TargetKind::Secret))
                .boxed(),
            config_map_target_changes
                .map(move |c: ConfigMap| named(owning_bundle(&c)))
                .boxed(),
            secret_target_changes
                .map(move |s: Secret| named(owning_bundle(&s)))
                .boxed(),
        ])
        .flat_map(futures::stream::iter)
    };
    let error_policy = |_: Arc<Bundle>, error: &Error, stores: Arc<Stores>| {
        super::requeue_after(CONTROLLER, error, &stores.ctx)
    };
    controller
        .reconcile_on(wakes)
        .run(
            |bundle, stores: Arc<Stores>| async move {
                let _timer = stores.ctx.metrics.reconcile_started(CONTROLLER);
                stores.reconcile(&bundle).await
            },
            error_policy,
            stores,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "Bundle reconcile failed");
            }
        })
        .await;
}

/// A store of `api`'s objects, each cut down by `trim` to what the passes read, and the stream of
/// what changed (added, modified or deleted).
fn watched<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (Store<K>, impl Stream<Item = K> + Send + 'static)
where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, config).default_backoff().modify(trim);
    let changes = reflector::reflector(writer, events)
        .touched_objects()
        .filter_map(|object| async move { object.ok() });
    (store, changes)
}

/// Keeps nothing of a source but what building a bundle reads.
fn trim_source<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    meta.annotations = None;
}

/// Keeps only a namespace's name, labels and phase.
fn trim_namespace(namespace: &mut Namespace) {
    namespace.metadata.managed_fields = None;
    namespace.metadata.annotations = None;
    namespace.spec = None;
    if let Some(status) = &mut namespace.status {
        status.conditions = None;
    }
}

/// Keeps only the metadata that decides whether a target needs a write ([`ObservedTarget`]):
/// its data is never read, as trust-manager keeps targets as metadata only.
fn trim_target<K: Resource>(target: &mut K) {
    let meta = target.meta_mut();
    if let Some(entries) = &mut meta.managed_fields {
        entries.retain(|e| e.manager.as_deref() == Some(FIELD_MANAGER));
    }
    if let Some(annotations) = &mut meta.annotations {
        annotations.retain(|k, _| k == HASH_ANNOTATION);
    }
}

fn trim_config_map_target(target: &mut ConfigMap) {
    target.data = None;
    target.binary_data = None;
    trim_target(target);
}

fn trim_secret_target(target: &mut Secret) {
    target.data = None;
    trim_target(target);
}

/// Whether `bundle` reads the source object `name` (with `labels`) of `kind`.
fn reads_source(
    bundle: &Bundle,
    kind: TargetKind,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> bool {
    bundle.spec.sources.iter().any(|source| {
        let reference = match kind {
            TargetKind::ConfigMap => source.config_map.as_ref(),
            TargetKind::Secret => source.secret.as_ref(),
        };
        reference.is_some_and(|r| match r.name.as_deref().filter(|n| !n.is_empty()) {
            Some(wanted) => wanted == name,
            None => Selector::parse(r.selector.as_ref()).is_ok_and(|s| s.matches(labels)),
        })
    })
}

/// The Bundle a target belongs to: its controller if that is a Bundle, else its label.
fn owning_bundle<K: Resource>(target: &K) -> Option<String> {
    let meta = target.meta();
    meta.owner_references
        .iter()
        .flatten()
        .find(|r| r.controller == Some(true) && r.kind == "Bundle")
        .map(|r| r.name.clone())
        .or_else(|| meta.labels.as_ref()?.get(BUNDLE_LABEL).cloned())
}

/// The objects of `store` by name.
fn by_name<K: Resource + Clone>(store: &Store<K>) -> BTreeMap<String, K>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let objects = store.state();
    objects
        .iter()
        .map(|o| (o.name_any(), (**o).clone()))
        .collect()
}

/// What decides the writes of Bundle `bundle`'s targets of `kind` in `store`, by namespace.
fn targets_of<K: Resource + Clone>(
    bundle: &str,
    kind: TargetKind,
    store: &Store<K>,
) -> BTreeMap<(TargetKind, String), ObservedTarget>
where
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mine = |meta: &kube::api::ObjectMeta| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(BUNDLE_LABEL))
            .map(String::as_str)
            == Some(bundle)
    };
    store
        .state()
        .iter()
        .filter(|t| mine(t.meta()))
        .map(|t| {
            let namespace = t.meta().namespace.clone().unwrap_or_default();
            (
                (kind, namespace),
                ObservedTarget::from_metadata(kind, t.meta()),
            )
        })
        .collect()
}

impl Stores {
    async fn ready(&self) -> Result<(), Error> {
        let lists = [
            self.bundles.wait_until_ready().await,
            self.namespaces.wait_until_ready().await,
            self.sources.wait_until_ready().await,
            self.secret_sources.wait_until_ready().await,
            self.config_map_targets.wait_until_ready().await,
        ];
        if let Some(secrets) = &self.secret_targets {
            secrets
                .wait_until_ready()
                .await
                .map_err(|_| Error::CacheStopped)?;
        }
        lists
            .into_iter()
            .try_for_each(|r| r.map_err(|_| Error::CacheStopped))
    }

    /// One pass: observe, [`plan::plan`], apply.
    async fn reconcile(&self, bundle: &Bundle) -> Result<Action, Error> {
        self.ready().await?;
        let trust = &self.ctx.settings.trust;
        let name = bundle.name_any();
        let config_maps = by_name(&self.sources);
        let secrets = by_name(&self.secret_sources);
        let namespaces: BTreeMap<String, NamespaceView> = self
            .namespaces
            .state()
            .iter()
            .map(|n| {
                let terminating =
                    n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating");
                (
                    n.name_any(),
                    NamespaceView {
                        labels: n.labels().clone(),
                        terminating,
                    },
                )
            })
            .collect();
        let mut targets = targets_of(&name, TargetKind::ConfigMap, &self.config_map_targets);
        if let Some(secret_targets) = &self.secret_targets {
            targets.extend(targets_of(&name, TargetKind::Secret, secret_targets));
        }
        let observed = Observed {
            bundle,
            sources: SourceContext {
                namespace: &trust.namespace,
                config_maps: &config_maps,
                secrets: &secrets,
                default_package: trust.default_package.as_ref(),
                filters: trust.filters,
                now: time::OffsetDateTime::now_utc(),
            },
            namespaces: &namespaces,
            targets: &targets,
            settings: &trust.bundles,
            now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            ),
        };
        let pass = plan::plan(&observed);

        // Targets are independent: several writes in flight keep the API server busy, and the
        // first failure, as trust-manager reports it, still ends the pass.
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        // By index: a closure over `&TargetWrite` would not be `Send` for every lifetime.
        let mut writes = futures::stream::iter(0..pass.writes.len())
            .map(|i| {
                let (apply, name, write) = (&apply, &name, &pass.writes[i]);
                async move {
                    let body = write.body();
                    let targets = self.targets_in(write.kind, &write.namespace);
                    let written = targets.patch(name, apply, &Patch::Apply(&body)).await;
                    written.map(drop).map_err(|e| (write, e))
                }
            })
            .buffer_unordered(CONCURRENT_WRITES);
        let mut failed = None;
        while let Some(written) = writes.next().await {
            if let Err(failure) = written {
                failed = Some(failure);
                break;
            }
        }
        drop(writes);
        if let Some((write, e)) = failed {
            let change =
                plan::target_failed(&observed, write.kind, &write.namespace, &e.to_string());
            let reason = change.event.reason;
            self.record(bundle, change).await?;
            return Err(Error::BundleNotSynced {
                bundle: name,
                reason,
            });
        }
        let owner = Owner {
            name: &name,
            uid: bundle.metadata.uid.as_deref().unwrap_or_default(),
        };
        for (kind, namespace) in &pass.cleanups {
            if let Err(e) = self.give_up(*kind, namespace, &owner).await {
                tracing::warn!(bundle = %name, kind = kind.as_str(), namespace, error = %e, "cannot clean up a target no longer wanted");
            }
        }
        if let Some(change) = pass.status {
            self.record(bundle, change).await?;
        }
        if let Some(event) = pass.event.clone() {
            self.ctx.event(&bundle.object_ref(&()), event).await;
        }
        match pass.outcome {
            Outcome::Done => Ok(Action::await_change()),
            Outcome::Retry => Err(Error::BundleNotSynced {
                bundle: name,
                reason: pass.event.map(|e| e.reason).unwrap_or("SourceBuildError"),
            }),
        }
    }

    /// The targets of `kind` in `namespace`. Untyped: what is written and read of a target is
    /// the same for both kinds but for the names of their data fields.
    fn targets_in(&self, kind: TargetKind, namespace: &str) -> Api<DynamicObject> {
        let resource = match kind {
            TargetKind::ConfigMap => ApiResource::erase::<ConfigMap>(&()),
            TargetKind::Secret => ApiResource::erase::<Secret>(&()),
        };
        Api::namespaced_with(self.ctx.client.clone(), namespace, &resource)
    }

    /// trust-manager's `CleanupTarget`: apply only the label and owner reference, which removes
    /// everything else it owned, then delete the target if no data is left in it.
    async fn give_up(
        &self,
        kind: TargetKind,
        namespace: &str,
        owner: &Owner<'_>,
    ) -> Result<(), kube::Error> {
        let targets = self.targets_in(kind, namespace);
        let body = cleanup_body(kind, namespace, owner);
        let apply = PatchParams::apply(FIELD_MANAGER).force();
        let left = targets
            .patch(owner.name, &apply, &Patch::Apply(&body))
            .await?;
        let empty = kind.data_fields().iter().all(|field| {
            let data = left.data.get(*field).and_then(Value::as_object);
            data.is_none_or(serde_json::Map::is_empty)
        });
        if !empty {
            return Ok(());
        }
        match targets.delete(owner.name, &DeleteParams::default()).await {
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            other => other.map(drop),
        }
    }

    /// Applies a status change (trust-manager's status apply: only `Synced`, and the default CA
    /// version when there is one) and publishes its event.
    async fn record(&self, bundle: &Bundle, change: StatusChange) -> Result<(), Error> {
        let mut status = json!({"conditions": [change.condition]});
        if let Some(version) = &change.default_ca_version {
            status["defaultCAVersion"] = json!(version);
        }
        let body = json!({
            "apiVersion": "trust.cert-manager.io/v1alpha1",
            "kind": "Bundle",
            "metadata": {"name": bundle.name_any()},
            "status": status,
        });
        let bundles: Api<Bundle> = Api::all(self.ctx.client.clone());
        bundles
            .patch_status(
                &bundle.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        self.ctx.event(&bundle.object_ref(&()), change.event).await;
        Ok(())
    }
}
