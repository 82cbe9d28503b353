//! The Bundle and ClusterBundle controllers: trust-manager's reconcile
//! ([`crate::trust::plan`]) on watch-fed stores, so caretaker can stand in for a running
//! trust-manager, and serve the ClusterBundle API upstream has no controller for.
//!
//! | watched | kept | a change wakes |
//! |---|---|---|
//! | Bundles, ClusterBundles | all | the object |
//! | Namespaces | labels and phase ([`NamespaceView`]) | every object (one may start or stop matching) |
//! | ConfigMaps and Secrets of the trust namespace | all but annotations and managed fields | the objects with a source of that kind naming it or selecting it |
//! | ConfigMaps (and Secrets, with Secret targets) labelled `trust.cert-manager.io/bundle` or `trust-manager.io/bundle`, as metadata only | what decides a write ([`ObservedTarget`]), by target name | the Bundle and the ClusterBundle of its name |
//!
//! The namespace, source and target watches are shared by both controllers; they start once
//! either CRD is installed, and each controller starts once its own CRD is (the log says so once).
//! A pass waits until every watch has listed, so a target not yet seen is never taken for
//! missing. Namespaces and targets are kept as [`Snapshots`]: a pass over ten thousand
//! namespaces takes them without copying or decoding anything. Targets are watched as metadata
//! only, as trust-manager watches them.
//!
//! With `--bundle-mode migrate` Bundles are not served here but by [`migration`], and
//! ClusterBundles take over the targets of the Bundles of their names.

pub mod migration;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::channel::mpsc;
use futures::{Stream, StreamExt};
use k8s_openapi::ClusterResourceScope;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, PartialObjectMeta, Patch, PatchParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::Value;

use crate::Error;
use crate::context::Context;
use crate::runtime::crd_installed;
use crate::trust::api::{BUNDLE_LABEL, Bundle, FIELD_MANAGER, HASH_ANNOTATION};
use crate::trust::cluster_bundle::{CLUSTER_BUNDLE_LABEL, CLUSTER_HASH_ANNOTATION, ClusterBundle};
use crate::trust::plan::{
    self, BundleMode, NamespaceView, Observed, Outcome, StatusChange, TargetsView,
};
use crate::trust::sources::SourceContext;
use crate::trust::target::{ObservedTarget, Owner, TargetKind, cleanup_body};

/// The name of trust-manager's Bundle CRD.
pub const BUNDLE_CRD: &str = "bundles.trust.cert-manager.io";
/// The name of trust-manager's ClusterBundle CRD.
pub const CLUSTER_BUNDLE_CRD: &str = "clusterbundles.trust-manager.io";
/// How many target writes a pass has in flight at once.
const CONCURRENT_WRITES: usize = 8;

/// A served API: Bundle or ClusterBundle.
pub(super) trait Served: Watchable + Resource<Scope = ClusterResourceScope> {
    const CRD: &'static str;
    /// The controller's name in metrics and logs.
    const CONTROLLER: &'static str;
    fn object(&self) -> plan::TrustObject<'_>;
}

impl Served for Bundle {
    const CRD: &'static str = BUNDLE_CRD;
    const CONTROLLER: &'static str = "bundle";

    fn object(&self) -> plan::TrustObject<'_> {
        self.into()
    }
}

impl Served for ClusterBundle {
    const CRD: &'static str = CLUSTER_BUNDLE_CRD;
    const CONTROLLER: &'static str = "cluster_bundle";

    fn object(&self) -> plan::TrustObject<'_> {
        self.into()
    }
}

/// A watched change, as the controllers are woken by it.
#[derive(Debug, Clone)]
enum Change {
    /// A namespace: every object may start or stop matching.
    Namespace,
    /// A ConfigMap or Secret of the trust namespace.
    Source {
        kind: TargetKind,
        name: String,
        labels: BTreeMap<String, String>,
    },
    /// A target: the objects of its name.
    Target(String),
}

/// What the watches here can watch: a kind of Kubernetes objects with a static type.
pub(super) trait Watchable:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Watchable for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// What a watch keeps for the passes, by name, as `Arc` snapshots: a pass takes one without
/// copying, and a change while a pass holds one copies the map then.
struct Snapshots<V> {
    current: Mutex<Arc<BTreeMap<String, V>>>,
    /// Whether the watch has listed once.
    listed: tokio::sync::watch::Sender<bool>,
}

impl<V: Clone> Snapshots<V> {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            current: Mutex::new(Arc::default()),
            listed: tokio::sync::watch::Sender::new(false),
        })
    }

    fn snapshot(&self) -> Arc<BTreeMap<String, V>> {
        self.current.lock().expect("snapshot lock").clone()
    }

    fn update(&self, change: impl FnOnce(&mut BTreeMap<String, V>)) {
        let mut current = self.current.lock().expect("snapshot lock");
        change(Arc::make_mut(&mut current));
    }

    fn replace(&self, listed: BTreeMap<String, V>) {
        *self.current.lock().expect("snapshot lock") = Arc::new(listed);
        self.listed.send_replace(true);
    }

    async fn ready(&self) -> Result<(), Error> {
        let mut listed = self.listed.subscribe();
        let done = listed.wait_for(|listed| *listed).await;
        done.map(drop).map_err(|_| Error::CacheStopped)
    }
}

/// The targets of one name, by kind and namespace, as one watch sees them.
type TargetsOf = Arc<BTreeMap<(TargetKind, String), ObservedTarget>>;

/// What both controllers read, and the controllers that listen for its changes.
pub(super) struct Shared {
    pub(super) ctx: Arc<Context>,
    namespaces: Arc<Snapshots<NamespaceView>>,
    sources: Store<ConfigMap>,
    secret_sources: Store<Secret>,
    /// One per target kind and label (a Bundle's, then a ClusterBundle's), by target name.
    targets: Vec<Arc<Snapshots<TargetsOf>>>,
    listeners: Mutex<Vec<mpsc::UnboundedSender<Change>>>,
}

/// Runs the Bundle and ClusterBundle controllers until their streams end; idle until either
/// CRD is installed.
pub async fn run(ctx: Arc<Context>) {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    let either = futures::future::select(
        Box::pin(crd_installed(crds.clone(), BUNDLE_CRD)),
        Box::pin(crd_installed(crds, CLUSTER_BUNDLE_CRD)),
    );
    if !either.await.factor_first().0 {
        return;
    }
    let trust = &ctx.settings.trust;
    tracing::info!(trust_namespace = %trust.namespace, mode = ?trust.bundles.mode, "trust bundle controllers starting");
    let (shared, changes) = Shared::start(ctx.clone());
    let fan_out = changes.for_each(|change| {
        let mut listeners = shared.listeners.lock().expect("listeners lock");
        listeners.retain(|l| l.unbounded_send(change.clone()).is_ok());
        futures::future::ready(())
    });
    // In migrate mode Bundles are `bundle_migration`'s.
    let bundles = async {
        if trust.bundles.mode == BundleMode::Serve {
            serve::<Bundle>(shared.clone()).await;
        }
    };
    futures::join!(fan_out, bundles, serve::<ClusterBundle>(shared.clone()));
}

impl Shared {
    /// Starts the shared watches; the stream is every change they see.
    fn start(ctx: Arc<Context>) -> (Arc<Self>, impl Stream<Item = Change> + Send + 'static) {
        let client = ctx.client.clone();
        let trust = &ctx.settings.trust;
        let namespaces = Snapshots::new();
        let namespace_changes = indexed(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
            namespaces.clone(),
            |views, namespace: &Namespace| {
                let phase = namespace.status.as_ref().and_then(|s| s.phase.as_deref());
                let view = NamespaceView {
                    labels: namespace.labels().clone(),
                    terminating: phase == Some("Terminating"),
                };
                views.insert(namespace.name_any(), view);
            },
            |views, namespace| {
                views.remove(&namespace.name_any());
            },
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
        let mut targets = Vec::new();
        let mut target_changes = Vec::new();
        let mut kinds = vec![TargetKind::ConfigMap];
        if trust.bundles.secret_targets_enabled {
            kinds.push(TargetKind::Secret);
        }
        for kind in kinds {
            for label in [BUNDLE_LABEL, CLUSTER_BUNDLE_LABEL] {
                let index = Snapshots::new();
                let config = watcher::Config::default().labels(label);
                let changes = match kind {
                    TargetKind::ConfigMap => {
                        watch_targets::<ConfigMap>(&client, config, kind, &index).boxed()
                    }
                    TargetKind::Secret => {
                        watch_targets::<Secret>(&client, config, kind, &index).boxed()
                    }
                };
                targets.push(index);
                target_changes.push(changes.map(Change::Target).boxed());
            }
        }
        let source = |kind: TargetKind| {
            move |(name, labels): (String, BTreeMap<String, String>)| Change::Source {
                kind,
                name,
                labels,
            }
        };
        let changes = futures::stream::select_all([
            namespace_changes
                .map(|_: Namespace| Change::Namespace)
                .boxed(),
            source_changes
                .map(|c: ConfigMap| (c.name_any(), c.labels().clone()))
                .map(source(TargetKind::ConfigMap))
                .boxed(),
            secret_source_changes
                .map(|s: Secret| (s.name_any(), s.labels().clone()))
                .map(source(TargetKind::Secret))
                .boxed(),
            futures::stream::select_all(target_changes).boxed(),
        ]);
        let shared = Arc::new(Self {
            ctx,
            namespaces,
            sources,
            secret_sources,
            targets,
            listeners: Mutex::new(Vec::new()),
        });
        (shared, changes)
    }

    /// The changes from now on.
    fn listen(&self) -> mpsc::UnboundedReceiver<Change> {
        let (sender, receiver) = mpsc::unbounded();
        self.listeners.lock().expect("listeners lock").push(sender);
        receiver
    }
}

/// Watches `api`, keeping what passes read of each object in `index` (`apply` adds or updates
/// it, `remove` drops it; a new list replaces everything at once), and returns the stream of
/// changed objects.
fn indexed<K, V>(
    api: Api<K>,
    config: watcher::Config,
    index: Arc<Snapshots<V>>,
    apply: impl Fn(&mut BTreeMap<String, V>, &K) + Send + 'static,
    remove: impl Fn(&mut BTreeMap<String, V>, &K) + Send + 'static,
) -> impl Stream<Item = K> + Send + 'static
where
    K: Watchable,
    V: Clone + Send + Sync + 'static,
{
    let mut listing: Option<BTreeMap<String, V>> = None;
    watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let changed = match event {
                Ok(watcher::Event::Init) => {
                    listing = Some(BTreeMap::new());
                    None
                }
                Ok(watcher::Event::InitApply(object)) => {
                    if let Some(listing) = &mut listing {
                        apply(listing, &object);
                    }
                    Some(object)
                }
                Ok(watcher::Event::InitDone) => {
                    index.replace(listing.take().unwrap_or_default());
                    None
                }
                Ok(watcher::Event::Apply(object)) => {
                    index.update(|values| apply(values, &object));
                    Some(object)
                }
                Ok(watcher::Event::Delete(object)) => {
                    index.update(|values| remove(values, &object));
                    Some(object)
                }
                Err(_) => None,
            };
            futures::future::ready(changed)
        })
}

/// Watches targets of `kind` as metadata only, keeping what decides their writes
/// ([`ObservedTarget`]) in `index` by target name; returns the names of changed targets.
fn watch_targets<K>(
    client: &kube::Client,
    config: watcher::Config,
    kind: TargetKind,
    index: &Arc<Snapshots<TargetsOf>>,
) -> impl Stream<Item = String> + Send + 'static
where
    K: Watchable,
{
    let key = move |target: &PartialObjectMeta<K>| {
        let meta = target.meta();
        let namespace = meta.namespace.clone().unwrap_or_default();
        (meta.name.clone().unwrap_or_default(), (kind, namespace))
    };
    let changes = indexed(
        Api::<PartialObjectMeta<K>>::all(client.clone()),
        config,
        index.clone(),
        move |targets, target| {
            let (name, at) = key(target);
            let mut observed = ObservedTarget::from_metadata(kind, target.meta());
            observed
                .annotations
                .retain(|k, _| k == HASH_ANNOTATION || k == CLUSTER_HASH_ANNOTATION);
            let of_name = targets.entry(name).or_default();
            Arc::make_mut(of_name).insert(at, observed);
        },
        move |targets, target| {
            let (name, at) = key(target);
            if let Some(of_name) = targets.get_mut(&name) {
                Arc::make_mut(of_name).remove(&at);
                if of_name.is_empty() {
                    targets.remove(&name);
                }
            }
        },
    );
    changes.map(|target| target.name_any())
}

/// Serves `K` until its streams end; idle until its CRD is installed.
async fn serve<K: Served>(shared: Arc<Shared>) {
    let client = shared.ctx.client.clone();
    if !crd_installed(Api::all(client.clone()), K::CRD).await {
        return;
    }
    tracing::info!(controller = K::CONTROLLER, "controller starting");
    let changes = shared.listen();
    let controller = Controller::new(Api::<K>::all(client), watcher::Config::default());
    let objects = controller.store();
    let wakes = changes
        .map(move |change| {
            let all = objects.state();
            let woken = all.iter().filter(|object| match &change {
                Change::Namespace => true,
                Change::Source { kind, name, labels } => {
                    object.object().reads_source(*kind, name, labels)
                }
                Change::Target(name) => object.meta().name.as_ref() == Some(name),
            });
            woken.map(|o| ObjectRef::from_obj(&**o)).collect::<Vec<_>>()
        })
        .flat_map(futures::stream::iter);
    let error_policy = |_: Arc<K>, error: &Error, shared: Arc<Shared>| {
        crate::runtime::requeue_after(K::CONTROLLER, error, &shared.ctx)
    };
    let stop = shared.ctx.shutdown.signal();
    controller
        .reconcile_on(wakes)
        .graceful_shutdown_on(stop)
        .run(
            |object, shared: Arc<Shared>| async move {
                let _timer = shared.ctx.reconcile_started(K::CONTROLLER);
                shared.reconcile(&*object).await
            },
            error_policy,
            shared,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(controller = K::CONTROLLER, error = %e, "reconcile failed");
            }
        })
        .await;
}

/// A store of `api`'s objects, each cut down by `trim` to what the passes read, and the stream of
/// what changed (added, modified or deleted).
pub(super) fn watched<K>(
    api: Api<K>,
    config: watcher::Config,
    trim: fn(&mut K),
) -> (Store<K>, impl Stream<Item = K> + Send + 'static)
where
    K: Watchable,
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

impl Shared {
    async fn ready(&self) -> Result<(), Error> {
        let lists = [
            self.sources.wait_until_ready().await,
            self.secret_sources.wait_until_ready().await,
        ];
        lists
            .into_iter()
            .try_for_each(|r| r.map_err(|_| Error::CacheStopped))?;
        self.namespaces.ready().await?;
        for targets in &self.targets {
            targets.ready().await?;
        }
        Ok(())
    }

    /// One pass: observe, [`plan::plan`], apply.
    async fn reconcile<K: Served>(&self, object: &K) -> Result<Action, Error> {
        self.ready().await?;
        let trust = &self.ctx.settings.trust;
        let name = object.name_any();
        let config_maps = by_name(&self.sources);
        let secrets = by_name(&self.secret_sources);
        let namespaces = self.namespaces.snapshot();
        // Bundle-labelled targets first: a ClusterBundle's view of a target it took over counts.
        let targets: Vec<TargetsOf> = self
            .targets
            .iter()
            .filter_map(|index| index.snapshot().get(&name).cloned())
            .collect();
        let observed = Observed {
            object: object.object(),
            sources: SourceContext {
                namespace: &trust.namespace,
                config_maps: &config_maps,
                secrets: &secrets,
                default_package: trust.default_package.as_ref(),
                filters: trust.filters,
                now: time::OffsetDateTime::now_utc(),
            },
            namespaces: &namespaces,
            targets: TargetsView::new(targets.iter().map(|t| &**t).collect()),
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
            self.record(object, change).await?;
            return Err(Error::BundleNotSynced {
                bundle: name,
                reason,
            });
        }
        let owner = object.object().owner();
        for (kind, namespace) in &pass.cleanups {
            if let Err(e) = self.give_up(*kind, namespace, &owner).await {
                tracing::warn!(bundle = %name, kind = kind.as_str(), namespace, error = %e, "cannot clean up a target no longer wanted");
            }
        }
        if let Some(change) = pass.status {
            self.record(object, change).await?;
        }
        if let Some(event) = pass.event.clone() {
            self.ctx.event(&object.object_ref(&()), event).await;
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
    async fn record<K: Served>(&self, object: &K, change: StatusChange) -> Result<(), Error> {
        let api = object.object().api();
        let version = change.default_ca_version.as_deref();
        let body = plan::status_body(api, &object.name_any(), &change.condition, version);
        let objects: Api<K> = Api::all(self.ctx.client.clone());
        objects
            .patch_status(
                &object.name_any(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        self.ctx.event(&object.object_ref(&()), change.event).await;
        Ok(())
    }
}
