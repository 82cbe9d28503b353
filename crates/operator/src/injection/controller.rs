//! CA-bundle injection ([`crate::injection`]): one Controller per target kind
//! (ValidatingWebhookConfiguration, MutatingWebhookConfiguration, CustomResourceDefinition,
//! APIService). Each watches its targets, so someone overwriting a `caBundle` gets it written
//! back, and is woken by changes of what targets inject from: CertificateAuthorities, the
//! ConfigMaps they publish their bundles in, and Secrets. One watch per source kind feeds all
//! four controllers; each maps a change to the targets in its own watch-fed store that name the
//! source ([`injection::concerned`]). Nothing polls.
//!
//! A pass reads the target's source fresh (the CertificateAuthority and its bundle ConfigMap,
//! or the Secret), asks [`injection::decide`], and writes the merge patch only on the version
//! of the target it saw. A Warning is published once per target and problem, not on every
//! pass.
//!
//! The CertificateAuthority CRD may not be installed (a fleet that uses only the Cluster API
//! features): its absence is logged once, targets naming a CertificateAuthority get a Warning
//! saying so, and CertificateAuthorities are watched as soon as the CRD appears, seen through
//! the CustomResourceDefinition watch this module has anyway. A target kind that cannot be
//! watched (not served, forbidden) is logged once and retried quietly.

use std::collections::HashMap;
use std::fmt::Debug;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{
    Api, ApiResource, DynamicObject, ObjectMeta, PartialObjectMeta, Patch, PatchParams,
};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use crate::Error;
use crate::changes::Event;
use crate::context::Context;
use crate::injection::{self, Decision, SourceChange, SourceRef, Sources, TargetKind};
use crate::ownership::{Claim, Owner};
use crate::runtime::claims;
use crate::runtime::watch_failures::Failing;
use caretaker_api::v1alpha1::{self, CertificateAuthority};

/// Whose watches fail, in the log.
const INJECTION: &str = "CA-bundle injection";

/// Source changes waiting for a target controller to take them.
const CHANGES_BUFFER: usize = 1024;

/// The field manager of caretaker's writes of `caBundle` fields, as `managedFields` show it.
const FIELD_MANAGER: &str = "caretaker";

/// Runs the four injection controllers and the watches of their sources until they end.
/// `namespace`, when given, is the only namespace Secrets and ConfigMaps are read from:
/// targets naming a source elsewhere are refused, as cainjector's `--namespace` does.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let client = ctx.client.clone();
    let authorities_writer = Writer::new(authority_resource());
    let (crd_installed, crd_installed_rx) = watch::channel(None);
    let injector = Arc::new(Injector {
        ctx,
        scope: namespace.clone(),
        authorities: authorities_writer.as_reader(),
        authority_crd: crd_installed_rx.clone(),
        warned: Mutex::default(),
    });
    let (config_maps, config_map_changes) = fan_out();
    let (secrets, secret_changes) = fan_out();
    let (authorities, authority_changes) = fan_out();
    // Only names matter to the targets: the watches read metadata, and no Secret's or
    // ConfigMap's data crosses the wire for them.
    type Meta<K> = PartialObjectMeta<K>;
    let (config_map_api, secret_api): (Api<Meta<ConfigMap>>, Api<Meta<Secret>>) = match &namespace {
        Some(ns) => (
            Api::namespaced(client.clone(), ns),
            Api::namespaced(client.clone(), ns),
        ),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let bundles = injector.authorities.clone();
    let mut crd_installed = Some(crd_installed);
    let controllers = TargetKind::ALL
        .into_iter()
        .zip(config_map_changes)
        .zip(secret_changes)
        .zip(authority_changes)
        .map(|(((kind, config_maps), secrets), authorities)| {
            // The CRD watch also tells whether the CertificateAuthority CRD is installed.
            let tap = match kind {
                TargetKind::CustomResourceDefinition => crd_installed.take(),
                _ => None,
            };
            run_kind(
                kind,
                injector.clone(),
                Changes {
                    config_maps,
                    secrets,
                    authorities,
                },
                tap,
            )
        });
    futures::join!(
        futures::future::join_all(controllers),
        watch_sources(config_map_api, config_maps, move |cm: &ObjectMeta| {
            // Only a CertificateAuthority's bundle matters.
            bundles.state().iter().any(|ca| {
                injection::bundle_of(ca).is_some_and(|b| {
                    Some(&b.namespace) == cm.namespace.as_ref() && Some(&b.name) == cm.name.as_ref()
                })
            })
        }),
        watch_sources(secret_api, secrets, |_: &ObjectMeta| true),
        watch_authorities(
            Api::all_with(client, &authority_resource()),
            authorities_writer,
            crd_installed_rx,
            authorities,
        ),
    );
}

/// What every pass shares.
struct Injector {
    ctx: Arc<Context>,
    /// The only namespace sources are read from, if the operator watches only one.
    scope: Option<String>,
    /// The CertificateAuthorities, to find those whose bundle a changed ConfigMap is.
    authorities: Store<DynamicObject>,
    /// Whether the CertificateAuthority CRD is installed; `None` until the CRDs are listed.
    authority_crd: watch::Receiver<Option<bool>>,
    /// The last Warning published about each target (kind/name), so that the same one is
    /// published once, not on every pass a source change or a relist brings; forgotten when
    /// the target is served or deleted.
    warned: Mutex<HashMap<String, (&'static str, String)>>,
}

impl Injector {
    /// Notes a Warning about `key`; false if it is the one last published.
    fn first_warning(&self, key: &str, event: &Event) -> bool {
        let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
        let warning = (event.reason, event.note.clone());
        if warned.get(key) == Some(&warning) {
            return false;
        }
        warned.insert(key.to_string(), warning);
        true
    }

    fn forget_warning(&self, key: &str) {
        self.warned
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// Names a target in [`Injector::warned`].
fn warning_key(kind: TargetKind, name: &str) -> String {
    format!("{}/{name}", kind.kind())
}

fn authority_resource() -> ApiResource {
    ApiResource::erase::<CertificateAuthority>(&())
}

/// The name of the CertificateAuthority CRD.
fn authority_crd_name() -> String {
    format!("{}.{}", authority_resource().plural, v1alpha1::GROUP)
}

/// A stream of changed sources (only their kind, name and namespace), as
/// `Controller::watches_stream_with` takes it.
type SourceChanges =
    Pin<Box<dyn Stream<Item = Result<DynamicObject, watcher::Error>> + Send + 'static>>;

/// The source changes one target controller hears of.
struct Changes {
    config_maps: SourceChanges,
    secrets: SourceChanges,
    authorities: SourceChanges,
}

/// Passes each source change on to every target controller.
struct FanOut(Vec<mpsc::Sender<DynamicObject>>);

impl FanOut {
    async fn send(&self, resource: &ApiResource, meta: &ObjectMeta) {
        let Some(name) = &meta.name else { return };
        let mut change = DynamicObject::new(name, resource);
        change.metadata.namespace = meta.namespace.clone();
        for sender in &self.0 {
            let _ = sender.send(change.clone()).await;
        }
    }
}

/// A fan-out to one stream per target kind.
fn fan_out() -> (FanOut, Vec<SourceChanges>) {
    let (senders, streams) = TargetKind::ALL
        .iter()
        .map(|_| {
            let (sender, receiver) = mpsc::channel::<DynamicObject>(CHANGES_BUFFER);
            let stream = futures::stream::unfold(receiver, |mut receiver| async move {
                let change = receiver.recv().await?;
                Some((Ok(change), receiver))
            })
            .boxed();
            (sender, stream)
        })
        .unzip();
    (FanOut(senders), streams)
}

/// Watches `api`'s objects and passes on each change that `matters`, also after a (re)list,
/// so that a change missed while the watch was down is caught. Deletions matter too: targets
/// then say what went missing.
async fn watch_sources<K>(
    api: Api<PartialObjectMeta<K>>,
    changes: FanOut,
    matters: impl Fn(&ObjectMeta) -> bool,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let resource = ApiResource::erase::<K>(&());
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let events = Failing::new(INJECTION, K::kind(&())).events(events);
    futures::pin_mut!(events);
    while let Some(event) = events.next().await {
        if let watcher::Event::Apply(object)
        | watcher::Event::InitApply(object)
        | watcher::Event::Delete(object) = event
            && matters(&object.metadata)
        {
            changes.send(&resource, &object.metadata).await;
        }
    }
}

/// Keeps `store` (through its writer) of the CertificateAuthorities while their CRD is
/// installed, and passes each change on. Without the CRD nothing is watched: the CRD watch
/// says when it appears.
async fn watch_authorities(
    api: Api<DynamicObject>,
    mut store: Writer<DynamicObject>,
    mut installed: watch::Receiver<Option<bool>>,
    changes: FanOut,
) {
    let resource = authority_resource();
    loop {
        let appeared = installed.wait_for(|i| *i == Some(true)).await.is_ok();
        if !appeared {
            return;
        }
        let events = watcher(api.clone(), watcher::Config::default()).default_backoff();
        let events = Failing::new(INJECTION, "CertificateAuthority").events(events);
        futures::pin_mut!(events);
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(event) => {
                        store.apply_watcher_event(&event);
                        if let watcher::Event::Apply(ca)
                        | watcher::Event::InitApply(ca)
                        | watcher::Event::Delete(ca) = &event
                        {
                            changes.send(&resource, &ca.metadata).await;
                        }
                    }
                    None => return,
                },
                removed = async { installed.wait_for(|i| *i != Some(true)).await.is_ok() } => {
                    if !removed {
                        return;
                    }
                    // The CRD is gone, and every CertificateAuthority with it: targets that
                    // named one now say so.
                    let known = store.as_reader().state();
                    store.apply_watcher_event(&watcher::Event::Init);
                    store.apply_watcher_event(&watcher::Event::InitDone);
                    for ca in known {
                        changes.send(&resource, &ca.metadata).await;
                    }
                    break;
                }
            }
        }
    }
}

/// Follows whether the CertificateAuthority CRD is installed, from the CRD watch's events,
/// and says so in the log when that changes (once at start).
struct AuthorityCrd {
    name: String,
    installed: watch::Sender<Option<bool>>,
    /// Whether the list in progress has shown it.
    listed: bool,
}

impl AuthorityCrd {
    fn observe(&mut self, event: &watcher::Event<DynamicObject>) {
        let is_it = |crd: &DynamicObject| crd.metadata.name.as_deref() == Some(self.name.as_str());
        let now = match event {
            watcher::Event::Init => {
                self.listed = false;
                return;
            }
            watcher::Event::InitApply(crd) => {
                self.listed |= is_it(crd);
                return;
            }
            watcher::Event::InitDone => self.listed,
            watcher::Event::Apply(crd) if is_it(crd) => true,
            watcher::Event::Delete(crd) if is_it(crd) => false,
            watcher::Event::Apply(_) | watcher::Event::Delete(_) => return,
        };
        self.installed.send_if_modified(|state| {
            if *state == Some(now) {
                return false;
            }
            *state = Some(now);
            if now {
                tracing::info!(crd = %self.name, "the CertificateAuthority CRD is installed; caretaker.dev/inject-ca-from is served");
            } else {
                tracing::info!(crd = %self.name, "the CertificateAuthority CRD is not installed; targets annotated caretaker.dev/inject-ca-from wait for it (cert-manager.io/inject-ca-from-secret works without it)");
            }
            true
        });
    }
}

async fn run_kind(
    kind: TargetKind,
    injector: Arc<Injector>,
    changes: Changes,
    authority_crd: Option<watch::Sender<Option<bool>>>,
) {
    let resource = kind.api_resource();
    let api: Api<DynamicObject> = Api::all_with(injector.ctx.client.clone(), &resource);
    let writer = Writer::new(resource.clone());
    let targets = writer.as_reader();
    let mut authority_crd = authority_crd.map(|installed| AuthorityCrd {
        name: authority_crd_name(),
        installed,
        listed: false,
    });
    let forgetting = injector.clone();
    let watched = reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(injection::trim(kind)),
    )
    .default_backoff();
    let watched = Failing::new(INJECTION, kind.kind())
        .events(watched)
        .map(move |event| {
            if let Some(crd) = &mut authority_crd {
                crd.observe(&event);
            }
            if let watcher::Event::Delete(target) = &event {
                forgetting.forget_warning(&warning_key(kind, &target.name_any()));
            }
            Ok::<_, watcher::Error>(event)
        })
        .applied_objects();

    let mapper = |source: fn(DynamicObject) -> Option<SourceChange>| {
        let (targets, authorities) = (targets.clone(), injector.authorities.clone());
        let resource = resource.clone();
        move |change: DynamicObject| -> Vec<ObjectRef<DynamicObject>> {
            let Some(change) = source(change) else {
                return Vec::new();
            };
            injection::concerned(&change, &authorities.state(), &targets.state())
                .into_iter()
                .map(|target| ObjectRef::from_obj_with(&**target, resource.clone()))
                .collect()
        }
    };
    Controller::for_stream_with(watched, targets.clone(), resource.clone())
        .graceful_shutdown_on(injector.ctx.shutdown.signal())
        .watches_stream_with(
            changes.config_maps,
            mapper(config_map_change),
            ApiResource::erase::<ConfigMap>(&()),
        )
        .watches_stream_with(
            changes.secrets,
            mapper(secret_change),
            ApiResource::erase::<Secret>(&()),
        )
        .watches_stream_with(
            changes.authorities,
            mapper(authority_change),
            authority_resource(),
        )
        .run(
            move |target, injector| reconcile(target, injector, kind),
            error_policy,
            injector.clone(),
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "CA-bundle injection reconcile failed");
            }
        })
        .await;
}

fn config_map_change(change: DynamicObject) -> Option<SourceChange> {
    Some(SourceChange::ConfigMap {
        namespace: change.metadata.namespace?,
        name: change.metadata.name?,
    })
}

fn secret_change(change: DynamicObject) -> Option<SourceChange> {
    Some(SourceChange::Secret {
        namespace: change.metadata.namespace?,
        name: change.metadata.name?,
    })
}

fn authority_change(change: DynamicObject) -> Option<SourceChange> {
    Some(SourceChange::Authority {
        name: change.metadata.name?,
    })
}

/// The controllers' name in logs and metrics (one for the four target kinds).
const CONTROLLER: &str = "ca_injection";

fn error_policy(_target: Arc<DynamicObject>, error: &Error, injector: Arc<Injector>) -> Action {
    crate::runtime::requeue_after(CONTROLLER, error, &injector.ctx)
}

/// One pass over a target: what it asks for, its source read fresh, the decision carried out.
async fn reconcile(
    target: Arc<DynamicObject>,
    injector: Arc<Injector>,
    kind: TargetKind,
) -> Result<Action, Error> {
    let _timer = injector.ctx.reconcile_started(CONTROLLER);
    // As cainjector: an object on its way out is left alone.
    if target.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let decision = match injection::request(kind, &target) {
        Ok(None) => Decision::Idle,
        Ok(Some(source)) => decide(&injector, kind, &target, &source).await?,
        Err(e) => injection::refuse_annotation(&e),
    };
    apply(&injector, kind, &target, decision).await?;
    Ok(Action::await_change())
}

/// Reads the target's source (nothing outside the operator's namespace, if it has one) and
/// decides.
async fn decide(
    injector: &Injector,
    kind: TargetKind,
    target: &DynamicObject,
    source: &SourceRef,
) -> Result<Decision, Error> {
    let client = &injector.ctx.client;
    let scope = injector.scope.as_deref();
    let (mut authority, mut config_map, mut authority_secret, mut secret) =
        (None, None, None, None);
    match source {
        SourceRef::Authority { name } => {
            // Not found also when the CRD is not installed.
            authority = Api::<DynamicObject>::all_with(client.clone(), &authority_resource())
                .get_opt(name)
                .await?;
            if let Some(bundle) = authority.as_ref().and_then(injection::bundle_of)
                && injection::in_scope(&bundle.namespace, scope)
            {
                config_map = Api::<ConfigMap>::namespaced(client.clone(), &bundle.namespace)
                    .get_opt(&bundle.name)
                    .await?;
            }
            // After the bundle: a CA is stored in the Secret before it is published. (No
            // watch on it: every change of the CAs it keeps is followed by the bundle's.)
            if let Some(keeps) = authority.as_ref().and_then(injection::secret_of)
                && injection::in_scope(&keeps.namespace, scope)
            {
                authority_secret = Api::<Secret>::namespaced(client.clone(), &keeps.namespace)
                    .get_opt(&keeps.name)
                    .await?;
            }
        }
        SourceRef::Secret { namespace, name } => {
            if injection::in_scope(namespace, scope) {
                secret = Api::<Secret>::namespaced(client.clone(), namespace)
                    .get_opt(name)
                    .await?;
            }
        }
    }
    let authority_refused = authority.as_ref().and_then(|authority| {
        not_the_authoritys(
            injector,
            authority,
            config_map.as_ref().map(|c| &c.metadata),
            authority_secret.as_ref().map(|s| &s.metadata),
        )
    });
    let sources = Sources {
        // Unknown until the CRDs are listed: then it is not said to be missing.
        authority_crd_installed: *injector.authority_crd.borrow() != Some(false),
        authority: authority.as_ref(),
        config_map: config_map.as_ref(),
        authority_secret: authority_secret.as_ref(),
        secret: secret.as_ref(),
        authority_refused: authority_refused.as_deref(),
    };
    Ok(injection::decide(kind, target, source, &sources, scope))
}

/// Why CertificateAuthority `authority`'s bundle ConfigMap or Secret (those read: `None` when
/// absent) is not its own, by the signer's rule: each must carry this CertificateAuthority's
/// mark (its UID: one made again under its name is another), and its Secret must be where
/// `--authority-secret-namespaces` allows. Whoever may write a ConfigMap, or create a
/// CertificateAuthority naming someone else's Secret and bundle, must not get a CA of theirs
/// trusted by the API server.
fn not_the_authoritys(
    injector: &Injector,
    authority: &DynamicObject,
    config_map: Option<&ObjectMeta>,
    secret: Option<&ObjectMeta>,
) -> Option<String> {
    let owner = Owner::new(
        "CertificateAuthority",
        None,
        authority.name_any(),
        authority.metadata.uid.clone().unwrap_or_default(),
    );
    let allowed = injector.ctx.settings.authority_secret_namespaces.as_ref();
    if let (Some(keeps), Some(allowed)) = (injection::secret_of(authority), allowed)
        && !allowed.contains(&keeps.namespace)
    {
        return Some(format!(
            "its Secret {}/{} is in no namespace CertificateAuthority Secrets may be in (--authority-secret-namespaces)",
            keeps.namespace, keeps.name
        ));
    }
    let named = |meta: &ObjectMeta| {
        (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    };
    [("ConfigMap", config_map), ("Secret", secret)]
        .into_iter()
        .filter_map(|(kind, meta)| Some((kind, meta?)))
        .find_map(
            |(kind, meta)| match claims::claim(&owner, kind, &named(meta), Some(meta)) {
                Claim::Own => None,
                Claim::Refused { message, .. } => Some(message),
                Claim::Create | Claim::Adopt => Some(format!(
                    "{kind} {}/{} is not its own yet (handed over, not adopted)",
                    meta.namespace.as_deref().unwrap_or_default(),
                    meta.name.as_deref().unwrap_or_default()
                )),
            },
        )
}

/// Carries a decision out: the write (only on the version decided on), then its event; or the
/// Warning, once.
async fn apply(
    injector: &Injector,
    kind: TargetKind,
    target: &DynamicObject,
    decision: Decision,
) -> Result<(), Error> {
    let name = target.name_any();
    let key = warning_key(kind, &name);
    let resource = kind.api_resource();
    let event = match decision {
        Decision::Idle => {
            injector.forget_warning(&key);
            return Ok(());
        }
        Decision::Write { patch, event } => {
            let api: Api<DynamicObject> = Api::all_with(injector.ctx.client.clone(), &resource);
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            match api.patch(&name, &params, &Patch::Merge(&patch)).await {
                Ok(_) => {}
                // Changed since this pass saw it: its watch event brings a pass on the new
                // version. Or gone.
                Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => return Ok(()),
                Err(e) => return Err(e.into()),
            }
            injector.forget_warning(&key);
            tracing::info!(kind = kind.kind(), %name, note = %event.note, "caBundle injected");
            event
        }
        Decision::Refuse(event) => {
            if !injector.first_warning(&key, &event) {
                return Ok(());
            }
            tracing::warn!(kind = kind.kind(), %name, reason = event.reason, note = %event.note, "caBundle not injected");
            event
        }
    };
    injector
        .ctx
        .event(&target.object_ref(&resource), event)
        .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn crd(name: &str) -> DynamicObject {
        DynamicObject::new(name, &TargetKind::CustomResourceDefinition.api_resource())
    }

    #[test]
    fn the_certificate_authority_crd_is_seen_coming_and_going() {
        let (installed, seen) = watch::channel(None);
        let mut crd_watch = AuthorityCrd {
            name: authority_crd_name(),
            installed,
            listed: false,
        };
        assert_eq!(crd_watch.name, "certificateauthorities.caretaker.dev");
        let mut feed = |event: watcher::Event<DynamicObject>| {
            crd_watch.observe(&event);
            *seen.borrow()
        };
        assert_eq!(feed(watcher::Event::Init), None);
        assert_eq!(
            feed(watcher::Event::InitApply(crd("machines.cluster.x-k8s.io"))),
            None,
            "unknown until the list is complete"
        );
        assert_eq!(feed(watcher::Event::InitDone), Some(false));
        assert_eq!(
            feed(watcher::Event::Apply(crd("widgets.example.com"))),
            Some(false)
        );
        assert_eq!(
            feed(watcher::Event::Apply(crd(&authority_crd_name()))),
            Some(true)
        );
        // A relist that still shows it changes nothing; one that does not, removes it.
        assert_eq!(feed(watcher::Event::Init), Some(true));
        assert_eq!(
            feed(watcher::Event::InitApply(crd(&authority_crd_name()))),
            Some(true)
        );
        assert_eq!(feed(watcher::Event::InitDone), Some(true));
        assert_eq!(feed(watcher::Event::Init), Some(true));
        assert_eq!(feed(watcher::Event::InitDone), Some(false));
        assert_eq!(
            feed(watcher::Event::Apply(crd(&authority_crd_name()))),
            Some(true)
        );
        assert_eq!(
            feed(watcher::Event::Delete(crd(&authority_crd_name()))),
            Some(false)
        );
    }

    #[test]
    fn trimmed_targets_keep_everything_injection_reads() {
        let bundle = caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new("x"))
            .unwrap()
            .certificate_pem();
        let kind = TargetKind::CustomResourceDefinition;
        let mut target: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {
                "name": "widgets.example.com",
                "resourceVersion": "7",
                "annotations": {
                    "caretaker.dev/inject-ca-from": "webhooks",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"huge\": true}",
                },
                "managedFields": [{ "manager": "kubectl", "operation": "Update" }],
            },
            "spec": {
                "group": "example.com",
                "versions": [{ "name": "v1", "schema": { "openAPIV3Schema": { "type": "object" } } }],
                "conversion": { "strategy": "Webhook", "webhook": { "clientConfig": {
                    "caBundle": base64::Engine::encode(
                        &base64::engine::general_purpose::STANDARD, &bundle),
                } } },
            },
            "status": { "acceptedNames": { "kind": "Widget" } },
        }))
        .unwrap();
        let full = target.clone();
        crate::injection::trim(kind)(&mut target);
        assert_eq!(target.metadata.managed_fields, None);
        assert_eq!(
            target
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            ["caretaker.dev/inject-ca-from"]
        );
        assert_eq!(
            target.data,
            json!({ "spec": { "conversion": full.data["spec"]["conversion"] } })
        );
        assert_eq!(target.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(
            injection::request(kind, &target),
            injection::request(kind, &full)
        );
        assert!(injection::holds_bundle(kind, &target, bundle.as_bytes()));

        // Webhook configurations keep their webhooks whole: the patch writes the list back.
        let kind = TargetKind::ValidatingWebhookConfiguration;
        let webhooks = json!([{ "name": "a", "rules": [{ "operations": ["CREATE"] }],
                                "clientConfig": { "url": "https://a" } }]);
        let mut target = DynamicObject::new("v", &kind.api_resource());
        target.data = json!({ "webhooks": webhooks });
        crate::injection::trim(kind)(&mut target);
        assert_eq!(target.data, json!({ "webhooks": webhooks }));
    }
}
