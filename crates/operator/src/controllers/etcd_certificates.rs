//! The EtcdCertificates controller: a pass reads the namespace's signer, bundle and
//! certificate Secrets and ConfigMaps (fresh), the selected Nodes, and every member's answer
//! ([`super::etcd_health`]), asks [`etcd::plan`], and carries the plan out in order, stopping
//! at the first write that fails. `etcd-all-certs` is written only after the members are asked
//! once more and the quorum gate still holds.
//!
//! It runs again when one of its Secrets or ConfigMaps changes, when a Node appears, goes or
//! changes its labels or addresses ([`NodeChanges`]), at the plan's wake-up time, and, while
//! something waits on the members (the gate is closed, a revision is being installed, a next
//! signer is being taken up), after a backoff that grows from 2 s to 30 s while the gate is
//! closed; nothing polls in steady state. Deleting an EtcdCertificates deletes nothing: the
//! etcd cluster keeps its certificates; only their expiry series leave the metrics.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::Value;
use time::OffsetDateTime;

use super::authority_watch::{self, DegradedMemory, Written};
use super::etcd_health::Asker;
use crate::Error;
use crate::authority::ca::AuthorityStatus;
use crate::authority::leaf::CertificateStep;
use crate::authority::{CaKeyPair, PkiMint};
use crate::changes::{AnnotationChanges, Event};
use crate::context::Context;
use crate::etcd::members::{self, Candidate, Origin};
use crate::etcd::{
    self, ALL_CERTS, EtcdObserved, EtcdPlan, EtcdStep, Membership, Quorum, REVISION_ANNOTATION,
    Signer,
};
use crate::metrics::CertificateKind;
use crate::names;
use crate::ownership::{Claim, Owner};
use crate::timestamp::format_time;
use crate::trust::selector::Selector;
use crate::v1alpha1::{
    self, EtcdCertificates, EtcdCertificatesStatus, EtcdPolicy, MemberSpec, SignerStatus,
};

const CRD: &str = "etcdcertificates.caretaker.dev";
const CONTROLLER: &str = "etcd_certificates";

/// What passes keep between them, per object (namespace/name).
#[derive(Default)]
struct Memory {
    last_good: Mutex<HashMap<String, BTreeMap<Signer, CaKeyPair>>>,
    backoff: Mutex<HashMap<String, Duration>>,
    /// The Degraded message the last status write gave each object: a pass may read the
    /// status from before that write, and must not say its Warning again.
    degraded: DegradedMemory,
}

struct Shared {
    ctx: Arc<Context>,
    memory: Memory,
    /// The EtcdCertificates the controller follows.
    objects: Store<EtcdCertificates>,
    /// Held while expiry series are set or forgotten: a pass that ends after its object was
    /// deleted must not bring its series back.
    series: Mutex<()>,
}

/// Runs the controller once its CRD is installed, until its streams end.
pub async fn run(ctx: Arc<Context>) {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client.clone());
    if !super::bundle::crd_installed(crds, CRD).await {
        return;
    }
    let client = ctx.client.clone();
    let stop = ctx.shutdown.signal();
    let (store, writer) = reflector::store();
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        memory: Memory::default(),
        objects: store.clone(),
        series: Mutex::default(),
    });
    let forgetting = shared.clone();
    let objects = reflector(
        writer,
        watcher(
            Api::<EtcdCertificates>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff(),
    )
    .inspect_ok(move |event| {
        if matches!(event, watcher::Event::Delete(_) | watcher::Event::InitDone) {
            forget_deleted(&forgetting);
        }
    })
    .applied_objects();
    let controller = Controller::for_stream(objects, store.clone());
    let in_namespace = move |namespace: Option<String>| {
        store
            .state()
            .iter()
            .filter(|o| o.namespace() == namespace)
            .map(|o| ObjectRef::from_obj(&**o))
            .collect::<Vec<_>>()
    };
    let (for_secrets, for_config_maps) = (in_namespace.clone(), in_namespace.clone());
    let store = controller.store();
    let selecting = move |_: Node| {
        store
            .state()
            .iter()
            .filter(|o| o.spec.member_selector.is_some())
            .map(|o| ObjectRef::from_obj(&**o))
            .collect::<Vec<_>>()
    };
    // Only what makes a Node a member, or changes its certificates: not its heartbeats.
    let mut node_changes = NodeChanges::default();
    let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .try_filter_map(move |event| futures::future::ready(Ok(node_changes.wakes(event))));
    let managed = watcher::Config::default().labels(&format!(
        "{}={}",
        names::MANAGED_BY.0,
        names::MANAGED_BY.1
    ));
    let error_policy = |_: Arc<EtcdCertificates>, error: &Error, shared: Arc<Shared>| {
        super::requeue_after(CONTROLLER, error, &shared.ctx)
    };
    tracing::info!("EtcdCertificates controller starting");
    controller
        .watches(
            Api::<Secret>::all(client.clone()),
            managed.clone(),
            move |s: Secret| for_secrets(s.namespace()),
        )
        .watches(
            Api::<ConfigMap>::all(client.clone()),
            managed,
            move |c: ConfigMap| for_config_maps(c.namespace()),
        )
        .watches_stream(nodes, selecting)
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, shared)
        .for_each(|_| futures::future::ready(()))
        .await;
}

async fn reconcile(object: Arc<EtcdCertificates>, shared: Arc<Shared>) -> Result<Action, Error> {
    let timer = shared.ctx.reconcile_started(CONTROLLER);
    let result = pass(&object, &shared).await;
    drop(timer);
    result
}

async fn pass(object: &EtcdCertificates, shared: &Shared) -> Result<Action, Error> {
    if object.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = object.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", object.name_any());
    let policy = match object.spec.policy() {
        Ok(policy) => policy,
        Err(e) => {
            let message = format!("{e}; nothing was written");
            return refuse(shared, object, names::REASON_INVALID_SPEC, message).await;
        }
    };
    let client = shared.ctx.client.clone();

    // Read what the pass decides from.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let all_certs = secrets.get_opt(ALL_CERTS).await?;
    let incumbents = all_certs.as_ref().map_or_else(BTreeSet::new, |all| {
        let (data, _) = authority_watch::secret_content(all);
        let text = data
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect();
        etcd::members_in_all_certs(&text)
    });
    let membership = membership_of(&client, object, &policy, &incumbents).await?;
    let members = membership.members.clone();
    let mut names: Vec<String> = etcd::leaves(&members)
        .iter()
        .map(etcd::Leaf::secret_name)
        .chain(Signer::ALL.map(|s| s.secret().to_string()))
        .chain([policy.client_secret.clone()])
        .chain(incumbents.iter().flat_map(|m| members::member_secrets(m)))
        .collect();
    names.sort();
    names.dedup();
    let read = futures::future::try_join_all(names.iter().map(|n| secrets.get_opt(n))).await?;
    let mut found: Vec<Secret> = read.into_iter().flatten().collect();
    found.extend(all_certs);
    let bundles =
        futures::future::try_join_all(Signer::ALL.map(|s| config_maps.get_opt(s.bundle()))).await?;
    let bundles: Vec<ConfigMap> = bundles.into_iter().flatten().collect();

    // A Secret the spec names for the health checks (other than caretaker's own
    // `etcd-client`) is the user's, and only read.
    let users_client = |meta: &kube::api::ObjectMeta| {
        meta.name.as_deref() == Some(policy.client_secret.as_str())
            && policy.client_secret != etcd::CLIENT_SECRET
    };
    // Only this object's Secrets and ConfigMaps, or absent ones (see `crate::ownership`).
    let owner = authority_watch::owner_of(object);
    let claims: Vec<(&str, &kube::api::ObjectMeta, Claim)> = found
        .iter()
        .map(|s| ("Secret", &s.metadata))
        .chain(bundles.iter().map(|c| ("ConfigMap", &c.metadata)))
        .filter(|(_, meta)| !users_client(meta))
        .map(|(kind, meta)| {
            let at = (namespace.clone(), meta.name.clone().unwrap_or_default());
            (
                kind,
                meta,
                authority_watch::claim(&owner, kind, &at, Some(meta)),
            )
        })
        .collect();
    let refused: Vec<Claim> = claims.iter().map(|(_, _, c)| c.clone()).collect();
    if let Some((reason, message)) = authority_watch::refusal(&refused) {
        return refuse(shared, object, reason, message).await;
    }
    let adopting: Vec<_> = (claims.iter())
        .filter(|(_, _, claim)| *claim == Claim::Adopt)
        .collect();
    if !adopting.is_empty() {
        // Handed over: the marks first, alone; the next pass reads them as this object's.
        for (kind, meta, _) in adopting {
            let at = (namespace.clone(), meta.name.clone().unwrap_or_default());
            let version = meta.resource_version.clone().unwrap_or_default();
            match *kind {
                "Secret" => {
                    authority_watch::adopt::<Secret>(&client, &owner, &at, &version).await?
                }
                _ => authority_watch::adopt::<ConfigMap>(&client, &owner, &at, &version).await?,
            };
        }
        return Ok(Action::await_change());
    }

    let mut versions: HashMap<String, String> = found
        .iter()
        .filter_map(|s| Some((s.name_any(), s.resource_version()?)))
        .collect();
    let mut bundle_versions: HashMap<String, String> = bundles
        .iter()
        .filter_map(|c| Some((c.name_any(), c.resource_version()?)))
        .collect();
    let old = object.status.clone().unwrap_or_default();
    let mut seen = EtcdObserved {
        namespace: namespace.clone(),
        secrets: found
            .iter()
            .map(|s| (s.name_any(), authority_watch::secret_content(s)))
            .collect(),
        config_maps: bundles
            .iter()
            .map(|c| (c.name_any(), authority_watch::config_map_content(c)))
            .collect(),
        health: Vec::new(),
        last_good: lock(&shared.memory.last_good)
            .get(&key)
            .cloned()
            .unwrap_or_default(),
        reported_degraded: (shared.memory.degraded)
            .reported(object, degraded_message(&old.conditions)),
    };
    let asker = asker(&seen, &policy);
    seen.health = asker.ask_all(&policy.endpoints).await;

    let plan = {
        let (seen, policy) = (seen.clone(), policy.clone());
        authority_watch::blocking(move || {
            etcd::plan(
                &seen,
                &policy,
                &membership,
                OffsetDateTime::now_utc(),
                &PkiMint,
            )
        })
        .await
        .map_err(|source| Error::SigningFailed {
            certificate: format!("EtcdCertificates {key}"),
            source,
        })?
    };

    let reference = object.object_ref(&());
    let mut written_revision = false;
    for step in &plan.steps {
        let outcome = match step {
            EtcdStep::Signer(signer, ca_step) => {
                use crate::authority::ca::AuthorityStep;
                match ca_step {
                    AuthorityStep::WriteSecret(secret) => {
                        let name = signer.secret().to_string();
                        let written = authority_watch::write_secret(
                            &client,
                            &owner,
                            &(namespace.clone(), name.clone()),
                            versions.get(&name).map(String::as_str),
                            &secret.data(),
                            &secret.annotation_changes(),
                        )
                        .await?;
                        remember(&mut versions, name, written)
                    }
                    AuthorityStep::WriteBundle(bundle) => {
                        let name = signer.bundle().to_string();
                        let written = authority_watch::write_config_map(
                            &client,
                            &owner,
                            &(namespace.clone(), name.clone()),
                            bundle_versions.get(&name).map(String::as_str),
                            &bundle.data(),
                            &bundle.annotation_changes(),
                        )
                        .await?;
                        remember(&mut bundle_versions, name, written)
                    }
                }
            }
            EtcdStep::Certificate { secret, step } => {
                let written = authority_watch::write_secret(
                    &client,
                    &owner,
                    &(namespace.clone(), secret.clone()),
                    versions.get(secret).map(String::as_str),
                    &step.data(),
                    &step.annotation_changes(),
                )
                .await?;
                remember(&mut versions, secret.clone(), written)
            }
            EtcdStep::AllCerts(all) => {
                // Asked again right before: a member may have gone since the pass began.
                if seen.secrets.contains_key(ALL_CERTS) {
                    let again = asker.ask_all(&policy.endpoints).await;
                    let quorum = Quorum::of(&again, &members);
                    if !quorum.open() {
                        tracing::warn!(etcd = %key, unhealthy = %quorum.unhealthy.join(", "), "{}", etcd::SKIPPING_FOR_QUORUM);
                        return Ok(Action::requeue(backoff(shared, &key, true)));
                    }
                }
                let stored = seen.all_certs().unwrap_or_default();
                let written = write_all_certs(
                    &client,
                    &owner,
                    &namespace,
                    versions.get(ALL_CERTS),
                    &stored,
                    all,
                )
                .await?;
                written_revision = true;
                remember(&mut versions, ALL_CERTS.to_string(), written)
            }
            EtcdStep::Delete(name) => {
                // Only the version read, whose mark said it is this object's.
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: versions.get(name).cloned(),
                        uid: None,
                    }),
                    ..DeleteParams::default()
                };
                match secrets.delete(name, &params).await {
                    Ok(_) => true,
                    Err(kube::Error::Api(e)) if e.code == 404 => true,
                    Err(kube::Error::Api(e)) if e.code == 409 => false,
                    Err(e) => return Err(e.into()),
                }
            }
        };
        if !outcome {
            tracing::info!(etcd = %key, "an object changed since this pass read it; the next pass starts from what is stored");
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
    }

    if plan.held {
        tracing::warn!(etcd = %key, unhealthy = %plan.quorum.unhealthy.join(", "), "{}", etcd::SKIPPING_FOR_QUORUM);
    }
    for event in &plan.events {
        tracing::info!(etcd = %key, reason = event.reason, note = %event.note, "EtcdCertificates event");
        shared.ctx.event(&reference, event.clone()).await;
    }
    remember_signers(shared, &key, &seen);
    record_metrics(shared, object, &seen, &plan, &members);
    let status = status_of(object, &plan, &old, &members, written_revision);
    write_status(shared, object, &status, &old).await?;
    let wake = plan.wake_at.map(authority_watch::until);
    let wait = backoff(shared, &key, plan.held);
    Ok(if plan.waits_on_members {
        Action::requeue(wake.map_or(wait, |w| w.min(wait)))
    } else {
        wake.map_or_else(Action::await_change, Action::requeue)
    })
}

/// Which Node watch events may change the members: a Node appearing, going (deleted, or gone
/// while the watch was down and missing from the list that follows), or changing its labels
/// or addresses. Not its heartbeats, which change neither.
#[derive(Default)]
struct NodeChanges {
    /// Each Node's labels and addresses, hashed, by name.
    known: HashMap<String, u64>,
    /// During a relist: the Nodes listed so far.
    listed: Option<BTreeSet<String>>,
}

impl NodeChanges {
    /// The Node to wake the controller with, if `event` may change the members.
    fn wakes(&mut self, event: watcher::Event<Node>) -> Option<Node> {
        match event {
            watcher::Event::Apply(node) => self.changed(node),
            watcher::Event::InitApply(node) => {
                (self.listed.get_or_insert_default()).insert(node.name_any());
                self.changed(node)
            }
            watcher::Event::Delete(node) => {
                self.known.remove(&node.name_any());
                Some(node)
            }
            watcher::Event::Init => {
                self.listed = Some(BTreeSet::new());
                None
            }
            watcher::Event::InitDone => {
                let listed = self.listed.take().unwrap_or_default();
                let gone: Vec<String> = (self.known.keys())
                    .filter(|name| !listed.contains(*name))
                    .cloned()
                    .collect();
                for name in &gone {
                    self.known.remove(name);
                }
                // Any Node wakes every object that selects Nodes: one for all that went.
                gone.into_iter().next().map(|name| Node {
                    metadata: kube::api::ObjectMeta {
                        name: Some(name),
                        ..Default::default()
                    },
                    ..Default::default()
                })
            }
        }
    }

    fn changed(&mut self, node: Node) -> Option<Node> {
        let hash = membership_hash(&node);
        let before = self.known.insert(node.name_any(), hash);
        (before != Some(hash)).then_some(node)
    }
}

/// A Node's labels and addresses, hashed: a change of either may change the members.
fn membership_hash(node: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hash = std::collections::hash_map::DefaultHasher::new();
    node.metadata.labels.hash(&mut hash);
    for address in node
        .status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
    {
        address.address.hash(&mut hash);
    }
    hash.finish()
}

/// Records a write's new version; `false` when the object changed since it was read.
fn remember(versions: &mut HashMap<String, String>, name: String, written: Written) -> bool {
    match written {
        Written::Done(version) => {
            versions.insert(name, version);
            true
        }
        Written::Conflict => false,
    }
}

/// The wait before asking the members again. While the gate is closed: 2 s, doubling to
/// 30 s, so that a member down for long is not asked in a tight loop. While a revision is
/// being installed or a next signer taken up (progress that only the members show): 2 s.
fn backoff(shared: &Shared, key: &str, held: bool) -> Duration {
    const FIRST: Duration = Duration::from_secs(2);
    let mut backoff = lock(&shared.memory.backoff);
    if !held {
        backoff.remove(key);
        return FIRST;
    }
    let next = backoff
        .get(key)
        .map_or(FIRST, |d| (*d * 2).min(Duration::from_secs(30)));
    backoff.insert(key.to_string(), next);
    next
}

/// The health checks' client: the client Secret's pair, the signer's trust, and a probe
/// from the next signer during a rotation.
fn asker(seen: &EtcdObserved, policy: &EtcdPolicy) -> Asker {
    let now = OffsetDateTime::now_utc();
    let trust = etcd::server_trust(seen, now);
    let client = seen
        .secrets
        .get(&policy.client_secret)
        .and_then(|(data, _)| {
            let text = |k: &str| data.get(k).map(|v| String::from_utf8_lossy(v).into_owned());
            Some((
                text(crate::authority::TLS_CRT)?,
                text(crate::authority::TLS_KEY)?,
            ))
        });
    let next = etcd::next_signer(seen);
    Asker::new(
        trust.as_ref(),
        client.as_ref().map(|(c, k)| (c.as_str(), k.as_str())),
        next.as_ref(),
    )
}

/// The members: the spec's and the selected Nodes', each Node checked as a listed member is,
/// none sharing a Secret with another ([`members::choose`]), given the members `etcd-all-certs`
/// holds now (`incumbents`).
async fn membership_of(
    client: &kube::Client,
    object: &EtcdCertificates,
    policy: &EtcdPolicy,
    incumbents: &BTreeSet<String>,
) -> Result<Membership, Error> {
    let mut candidates: Vec<Candidate> = (policy.members.iter())
        .map(|member| Candidate {
            name: member.name.clone(),
            origin: Origin::Listed,
            checked: Ok(member.clone()),
        })
        .collect();
    let selector = object.spec.member_selector.as_ref().map(|selector| {
        Selector::parse(Some(&selector.label_selector())).inspect_err(|e| {
            tracing::warn!(error = %e, "spec.memberSelector does not parse; only the listed members count");
        })
    });
    if let Some(Ok(selector)) = selector {
        let nodes: Api<Node> = Api::all(client.clone());
        for node in nodes.list(&ListParams::default()).await? {
            if selector.matches(node.metadata.labels.as_ref().unwrap_or(&BTreeMap::new())) {
                candidates.push(node_candidate(&node));
            }
        }
    }
    Ok(members::choose(
        candidates,
        incumbents,
        &members::fixed_secrets(policy),
    ))
}

/// A selected Node as a would-be member: its name, and its `status.addresses` (IP addresses
/// as IP SANs, the rest as DNS names, beside the Node's name), checked as a listed member's.
fn node_candidate(node: &Node) -> Candidate {
    let name = node.name_any();
    let addresses: Vec<String> = (node.status.iter())
        .flat_map(|s| s.addresses.iter().flatten())
        .map(|a| a.address.clone())
        .collect();
    let at = |i: usize| format!("status.addresses[{i}].address");
    let checked = v1alpha1::member_spec("metadata.name", &name, &at, &addresses).map(|mut m| {
        m.dns_names.push(name.clone());
        m.dns_names.sort();
        m.dns_names.dedup();
        m
    });
    Candidate {
        name,
        origin: Origin::Node,
        checked,
    }
}

/// Creates `etcd-all-certs` (type Opaque), or replaces its data on `version`: keys not in
/// `all` are removed. Its annotation names the revision.
async fn write_all_certs(
    client: &kube::Client,
    owner: &Owner,
    namespace: &str,
    version: Option<&String>,
    stored: &BTreeMap<String, String>,
    all: &etcd::AllCerts,
) -> Result<Written, Error> {
    let mut annotations = AnnotationChanges::default();
    annotations.set(REVISION_ANNOTATION, all.revision.clone());
    let data = all.data.clone();
    let secret = move |metadata| Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    };
    let mut patch: serde_json::Map<String, Value> = all
        .data
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(STANDARD.encode(v))))
        .collect();
    for gone in stored.keys().filter(|k| !all.data.contains_key(*k)) {
        patch.insert(gone.clone(), Value::Null);
    }
    authority_watch::create_or_patch(
        client,
        owner,
        &(namespace.to_string(), ALL_CERTS.to_string()),
        version.map(String::as_str),
        &annotations,
        secret,
        patch,
    )
    .await
}

/// The signers seen valid, kept to sign while a Secret is unreadable.
fn remember_signers(shared: &Shared, key: &str, seen: &EtcdObserved) {
    let mut good = BTreeMap::new();
    for signer in Signer::ALL {
        if let Some((data, annotations)) = seen.secrets.get(signer.secret())
            && let crate::authority::ca::CaSecretState::Valid(secret) =
                crate::authority::ca::CaSecretState::observe(Some((data, annotations)))
            && let Some(current) = secret.current
        {
            good.insert(signer, current);
        } else if let Some(previous) = seen.last_good.get(&signer) {
            good.insert(signer, previous.clone());
        }
    }
    lock(&shared.memory.last_good).insert(key.to_string(), good);
}

/// The kinds of expiry series this controller sets, one namespace's per EtcdCertificates.
const SERIES: [CertificateKind; 2] = [
    CertificateKind::EtcdSigner,
    CertificateKind::EtcdCertificate,
];

/// The signers' and the certificates' expiry gauges, as the plan leaves them: the series of a
/// signer or certificate the object no longer has (a member removed) go.
fn record_metrics(
    shared: &Shared,
    object: &EtcdCertificates,
    seen: &EtcdObserved,
    plan: &EtcdPlan,
    members: &[MemberSpec],
) {
    let metrics = &shared.ctx.metrics;
    let namespace = &seen.namespace;
    let _series = lock(&shared.series);
    if shared.objects.get(&ObjectRef::from_obj(object)).is_none() {
        return; // deleted meanwhile: its series went with it
    }
    let mut kept = BTreeSet::new();
    for (signer, status) in &plan.status.signers {
        if let Some(not_after) = status.not_after {
            metrics.set_certificate_expiry(
                CertificateKind::EtcdSigner,
                namespace,
                signer.label(),
                not_after,
            );
            kept.insert((CertificateKind::EtcdSigner, signer.label().to_string()));
        }
    }
    for leaf in etcd::leaves(members) {
        let name = leaf.secret_name();
        let issued = plan.steps.iter().find_map(|step| match step {
            EtcdStep::Certificate {
                secret,
                step: CertificateStep::Issue(issued),
            } if *secret == name => Some(issued.leaf.certificate.not_after()),
            _ => None,
        });
        let stored = || {
            let (data, _) = seen.secrets.get(&name)?;
            let (leaf, _) = crate::authority::leaf::read_leaf(data);
            leaf.ok().map(|c| c.not_after())
        };
        if let Some(not_after) = issued.or_else(stored) {
            metrics.set_certificate_expiry(
                CertificateKind::EtcdCertificate,
                namespace,
                &name,
                not_after,
            );
            kept.insert((CertificateKind::EtcdCertificate, name));
        }
    }
    metrics.retain_certificate_expiries(|kind, series_namespace, name| {
        !SERIES.contains(&kind)
            || series_namespace != namespace
            || kept.contains(&(kind, name.to_string()))
    });
}

/// Forgets the expiry series of every namespace left without an EtcdCertificates: deleted,
/// or gone while the watch was down. Deleting one deletes nothing else: the etcd cluster keeps
/// its certificates, and nobody follows them any more.
fn forget_deleted(shared: &Shared) {
    let _series = lock(&shared.series);
    let followed: BTreeSet<String> = (shared.objects.state().iter())
        .filter_map(|o| o.namespace())
        .collect();
    (shared.ctx.metrics).retain_certificate_expiries(|kind, namespace, _| {
        !SERIES.contains(&kind) || followed.contains(namespace)
    });
}

fn signer_status(status: &AuthorityStatus) -> SignerStatus {
    SignerStatus {
        serial_number: status.serial.clone(),
        not_after: status.not_after.map(format_time),
        next_rotation: status.next_rotation.map(format_time),
        next_serial_number: status.next.as_ref().map(|n| n.serial.clone()),
        previous_serial_numbers: status.previous.iter().map(|p| p.serial.clone()).collect(),
    }
}

fn status_of(
    object: &EtcdCertificates,
    plan: &EtcdPlan,
    old: &EtcdCertificatesStatus,
    members: &[MemberSpec],
    written_revision: bool,
) -> EtcdCertificatesStatus {
    let now = OffsetDateTime::now_utc();
    let generation = object.metadata.generation;
    let status = &plan.status;
    let changed = if written_revision || old.all_certs_revision != status.revision {
        Some(format_time(now))
    } else {
        old.all_certs_last_changed.clone()
    };
    EtcdCertificatesStatus {
        conditions: conditions(old, (&status.ready, &status.degraded), generation, now),
        all_certs_revision: status.revision.clone(),
        all_certs_last_changed: changed,
        signer: status.signers.get(&Signer::Etcd).map(signer_status),
        metrics_signer: status.signers.get(&Signer::Metrics).map(signer_status),
        members: members.iter().map(|m| m.name.clone()).collect(),
        observed_generation: generation,
    }
}

/// `Ready` and `EtcdCertSignerControllerDegraded`, each keeping its transition time from `old`
/// unless its status changed.
fn conditions(
    old: &EtcdCertificatesStatus,
    (ready, degraded): (&crate::authority::Condition, &crate::authority::Condition),
    generation: Option<i64>,
    now: OffsetDateTime,
) -> Vec<v1alpha1::Condition> {
    let old = &old.conditions;
    vec![
        authority_watch::condition(old, v1alpha1::CONDITION_READY, ready, generation, now),
        authority_watch::condition(old, etcd::CONDITION_DEGRADED, degraded, generation, now),
    ]
}

fn degraded_message(conditions: &[v1alpha1::Condition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| c.type_ == etcd::CONDITION_DEGRADED && c.status == "True")
        .map(|c| c.message.as_str())
}

async fn write_status(
    shared: &Shared,
    object: &EtcdCertificates,
    status: &EtcdCertificatesStatus,
    old: &EtcdCertificatesStatus,
) -> Result<(), Error> {
    let api: Api<EtcdCertificates> = Api::namespaced(
        shared.ctx.client.clone(),
        &object.namespace().unwrap_or_default(),
    );
    authority_watch::write_status(&api, &object.name_any(), status, old).await?;
    shared.memory.degraded.remember(
        object,
        degraded_message(&old.conditions),
        degraded_message(&status.conditions),
    );
    Ok(())
}

/// A spec or object caretaker cannot act on: Degraded with `reason`, nothing written, and a
/// Warning unless the status already says the same.
async fn refuse(
    shared: &Shared,
    object: &EtcdCertificates,
    reason: &'static str,
    message: String,
) -> Result<Action, Error> {
    let old = object.status.clone().unwrap_or_default();
    let reported = (shared.memory.degraded).reported(object, degraded_message(&old.conditions));
    if reported.as_deref() != Some(message.as_str()) {
        tracing::warn!(etcd = %object.name_any(), reason, %message, "EtcdCertificates not acted on");
        shared
            .ctx
            .event(
                &object.object_ref(&()),
                Event::warning(reason, message.clone()),
            )
            .await;
    }
    let now = OffsetDateTime::now_utc();
    let generation = object.metadata.generation;
    let condition = |status| crate::authority::Condition::new(status, reason, message.clone());
    let status = EtcdCertificatesStatus {
        conditions: conditions(&old, (&condition(false), &condition(true)), generation, now),
        observed_generation: generation,
        ..old.clone()
    };
    write_status(shared, object, &status, &old).await?;
    Ok(Action::await_change())
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus};
    use watcher::Event;

    use super::*;

    fn node(name: &str, address: &str, heartbeat: &str) -> Node {
        Node {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(heartbeat.into()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: address.into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn woken(changes: &mut NodeChanges, event: Event<Node>) -> Option<String> {
        changes.wakes(event).map(|n| n.name_any())
    }

    /// A deleted Node wakes the controller though its labels and addresses did not change (the
    /// predicate that filtered Node events hid every deletion).
    #[test]
    fn a_node_going_wakes_and_a_heartbeat_does_not() {
        let mut changes = NodeChanges::default();
        let a = Some("a".to_string());
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.1", "1"))),
            a
        );
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.1", "2"))),
            None
        );
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.2", "3"))),
            a
        );
        assert_eq!(
            woken(&mut changes, Event::Delete(node("a", "10.0.0.2", "3"))),
            a
        );
        // Back with the same name, labels and addresses: a new member again.
        assert_eq!(
            woken(&mut changes, Event::Apply(node("a", "10.0.0.2", "4"))),
            a
        );
    }

    /// A Node deleted while the watch was down is missing from the relist: that wakes too.
    #[test]
    fn a_node_missing_from_a_relist_wakes() {
        let mut changes = NodeChanges::default();
        for name in ["a", "b"] {
            changes.wakes(Event::Apply(node(name, "10.0.0.1", "1")));
        }
        assert_eq!(woken(&mut changes, Event::Init), None);
        let unchanged = Event::InitApply(node("a", "10.0.0.1", "5"));
        assert_eq!(woken(&mut changes, unchanged), None);
        assert_eq!(woken(&mut changes, Event::InitDone), Some("b".into()));
        // Relisted with nothing gone: no wake.
        changes.wakes(Event::Init);
        changes.wakes(Event::InitApply(node("a", "10.0.0.1", "6")));
        assert_eq!(woken(&mut changes, Event::InitDone), None);
    }
}
