//! The EtcdCertificates controller: a pass reads the namespace's signer, bundle and
//! certificate Secrets and ConfigMaps (fresh), the selected Nodes, and every member's answer
//! ([`health`]), asks [`etcd::plan`], and carries the plan out in order, stopping
//! at the first write that fails. `etcd-all-certs` is written only after the members are asked
//! once more and the quorum gate still holds.
//!
//! It runs again when one of its Secrets or ConfigMaps changes, when a Node appears, goes or
//! changes its labels or addresses ([`NodeChanges`]), at the plan's wake-up time, and, while
//! something waits on the members (the gate is closed, a revision is being installed, a next
//! signer is being taken up), after a backoff that grows from 2 s to 30 s while the gate is
//! closed; nothing polls in steady state. Deleting an EtcdCertificates deletes nothing: the
//! etcd cluster keeps its certificates; only their expiry series leave the metrics.

mod health;
mod install;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use time::OffsetDateTime;

use super::policy::{self, EtcdPolicy, MemberSpec};
use crate::Error;
use crate::authority::ca::{AuthorityStatus, AuthorityStep};
use crate::authority::leaf::CertificateStep;
use crate::authority::{CaKeyPair, PkiMint};
use crate::changes::{AnnotationChanges, Event};
use crate::context::Context;
use crate::etcd::members::{self, Candidate, Origin};
use crate::etcd::nodes::NodeChanges;
use crate::etcd::rollout;
use crate::etcd::{
    self, ALL_CERTS, EtcdObserved, EtcdPlan, EtcdStep, Membership, Quorum, REVISION_ANNOTATION,
    Signer,
};
use crate::metrics::CertificateKind;
use crate::ownership::{Claim, Owner};
use crate::runtime::refuse::{Refusal, ShowRefusal, refuse};
use crate::runtime::status::{self, DegradedMemory};
use crate::runtime::steps::{Applied, Failed, ObjectKind, Step, StepWriter};
use crate::runtime::{self, claims, write};
use crate::timestamp::format_time;
use crate::trust::selector::Selector;
use caretaker_api::names;
use caretaker_api::v1alpha1::{self, EtcdCertificates, EtcdCertificatesStatus, SignerStatus};
use health::Asker;

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
    /// Failed installs, by `object/member/revision hash` (`InstallerPodFailed`'s count).
    install_failures: Mutex<HashMap<String, u32>>,
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
    if !runtime::crd_installed(crds, CRD).await {
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
        runtime::requeue_after(CONTROLLER, error, &shared.ctx)
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
    if let Err(error) = &result {
        show_failed_pass(&object, &shared, error).await;
    }
    result
}

/// A pass that failed (an API or write error, a signing failure): Degraded True with reason
/// `Error`, as the OpenShift etcd operator says any failed sync, until a good pass says
/// `AsExpected` again. A status that cannot be written either is said in the Warning
/// `EtcdCertSignerControllerUpdatingStatus`, as upstream.
async fn show_failed_pass(object: &EtcdCertificates, shared: &Shared, error: &Error) {
    let key = format!(
        "{}/{}",
        object.namespace().unwrap_or_default(),
        object.name_any()
    );
    let message = error.to_string();
    tracing::warn!(etcd = %key, error = %message, "EtcdCertificates pass failed");
    let old = object.status.clone().unwrap_or_default();
    let now = OffsetDateTime::now_utc();
    let degraded = crate::authority::Condition::new(true, etcd::REASON_ERROR, message);
    let mut conditions = old.conditions.clone();
    conditions.retain(|c| c.type_ != etcd::CONDITION_DEGRADED);
    conditions.push(status::condition(
        &old.conditions,
        etcd::CONDITION_DEGRADED,
        &degraded,
        object.metadata.generation,
        now,
    ));
    let status = EtcdCertificatesStatus {
        conditions,
        ..old.clone()
    };
    if let Err(e) = write_status(shared, object, &status, &old).await {
        let event = Event::warning(etcd::EVENT_UPDATING_STATUS, e.to_string());
        shared.ctx.event(&object.object_ref(&()), event).await;
    }
}

async fn pass(object: &EtcdCertificates, shared: &Shared) -> Result<Action, Error> {
    if object.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let namespace = object.namespace().unwrap_or_default();
    let key = format!("{namespace}/{}", object.name_any());
    let policy = match EtcdPolicy::from_spec(&object.spec) {
        Ok(policy) => policy,
        Err(e) => {
            let message = format!("{e}; nothing was written");
            return refuse(shared, object, names::REASON_INVALID_SPEC, message).await;
        }
    };
    let client = &shared.ctx.client;
    let read = Read::of(client, object, &policy).await?;
    let owner = claims::owner_of(object);
    let claims = read.claims(&owner, &policy);
    let refused: Vec<Claim> = claims.iter().map(|(_, _, c)| c.clone()).collect();
    if let Some((reason, message)) = claims::refusal(&refused) {
        return refuse(shared, object, reason, message).await;
    }
    if adopt(client, &owner, &namespace, &claims).await? {
        return Ok(Action::await_change());
    }
    let mut writer = read.writer(client, &owner);
    let old = object.status.clone().unwrap_or_default();
    let mut seen = read.observed(shared, &key, object, &old);
    let asker = asker(&seen, &policy);
    seen.health = asker.ask_all(&policy.endpoints).await;
    let members = read.membership.members.clone();
    let plan = plan(&seen, &policy, read.membership, &key).await?;
    let step_of = |step: &EtcdStep| step_of(step, &namespace, &seen);
    let quorum_holds = || quorum_holds(&asker, &policy.endpoints, &members, &key);
    let applied = writer.apply(&plan.steps, step_of, quorum_holds, |_, _, _| {});
    if let Some(stop) = stopped(shared, &key, applied.await)? {
        return Ok(stop);
    }
    if plan.held {
        tracing::warn!(etcd = %key, unhealthy = %plan.quorum.unhealthy.join(", "), "{}", etcd::SKIPPING_FOR_QUORUM);
    }
    let reference = object.object_ref(&());
    for event in &plan.events {
        tracing::info!(etcd = %key, reason = event.reason, note = %event.note, "EtcdCertificates event");
        shared.ctx.event(&reference, event.clone()).await;
    }
    remember_signers(shared, &key, &seen);
    record_metrics(shared, object, &seen, &plan, &members);
    let mut plan = plan;
    let target = install::target_of(&plan, &old);
    let agents = (&members[..], &read.agent_endpoints, &policy, &asker);
    let rolled = install::roll_out(shared, object, agents, &seen, &plan, target.as_ref()).await;
    if let Some((member, gate)) = &rolled.held
        && !plan.status.degraded.status
    {
        // The next member waits for quorum: said as a held revision is, no Warning.
        let reason = etcd::REASON_INSUFFICIENT_QUORUM;
        plan.status.degraded = crate::authority::Condition::new(true, reason, gate.clone());
        plan.status.ready = crate::authority::Condition::new(
            false,
            etcd::REASON_WAITING,
            format!("member {member:?} waits for quorum to be installed"),
        );
    }
    if let Some((member, why)) = &rolled.stopped {
        install::stop_message(&mut plan, member, why);
        // A failed install said its own Warning; a member that is not back says one once.
        let reported = seen.reported_degraded.as_deref().unwrap_or_default();
        if !rolled.failed.contains(member) && !reported.contains(why.as_str()) {
            let note = format!("the rollout stopped at member {member:?}: {why}");
            let event = Event::warning(rollout::EVENT_INSTALL_FAILED, note);
            shared.ctx.event(&reference, event).await;
        }
    }
    let now = format_time(OffsetDateTime::now_utc());
    let member_statuses = install::member_statuses(
        &members,
        &rolled.views,
        target.as_ref(),
        &rolled.failed,
        &old.members,
        &now,
    );
    let written_revision = (plan.steps.iter()).any(|s| matches!(s, EtcdStep::AllCerts(_)));
    let mut status = status_of(object, &plan, &old, member_statuses, written_revision);
    status.latest_revision = target.as_ref().map(|t| t.number);
    if let Err(e) = write_status(shared, object, &status, &old).await {
        let event = Event::warning(etcd::EVENT_UPDATING_STATUS, e.to_string());
        shared.ctx.event(&reference, event).await;
        return Err(e);
    }
    if rolled.stopped.is_some() || rolled.held.is_some() {
        return Ok(Action::requeue(backoff(shared, &key, true)));
    }
    Ok(next_pass(shared, &key, &plan))
}

/// Whether the members still hold a quorum, asked once more right before a new
/// `etcd-all-certs` ([`EtcdStep::RecheckQuorum`]).
async fn quorum_holds(
    asker: &Asker,
    endpoints: &[String],
    members: &[MemberSpec],
    key: &str,
) -> bool {
    let quorum = Quorum::of(&asker.ask_all(endpoints).await, members);
    if !quorum.open() {
        tracing::warn!(etcd = %key, unhealthy = %quorum.unhealthy.join(", "), "{}", etcd::SKIPPING_FOR_QUORUM);
    }
    quorum.open()
}

/// How a pass goes on after its writes: `None` when all were made; else it ends (the gate
/// closed: after the backoff; a conflict: soon, from what is stored; a failure: the error).
fn stopped(
    shared: &Shared,
    key: &str,
    applied: Result<Applied, Failed>,
) -> Result<Option<Action>, Error> {
    match applied {
        Ok(Applied::All) => Ok(None),
        Ok(Applied::Gated { .. }) => Ok(Some(Action::requeue(backoff(shared, key, true)))),
        Ok(Applied::Conflict { .. }) => {
            tracing::info!(etcd = %key, "an object changed since this pass read it; the next pass starts from what is stored");
            Ok(Some(Action::requeue(Duration::from_secs(1))))
        }
        Err(Failed { error, .. }) => Err(error),
    }
}

/// When the pass after `plan`'s runs: at its wake-up time, and while something waits on the
/// members, after the backoff at the latest.
fn next_pass(shared: &Shared, key: &str, plan: &EtcdPlan) -> Action {
    let wake = plan.wake_at.map(runtime::until);
    let wait = backoff(shared, key, plan.held);
    if plan.waits_on_members {
        Action::requeue(wake.map_or(wait, |w| w.min(wait)))
    } else {
        wake.map_or_else(Action::await_change, Action::requeue)
    }
}

/// What a pass reads (fresh): the namespace's Secrets and bundle ConfigMaps it writes or
/// reads, and the members.
struct Read {
    namespace: String,
    /// The Secrets that exist, `etcd-all-certs` among them.
    found: Vec<Secret>,
    bundles: Vec<ConfigMap>,
    membership: Membership,
    /// The members' agent endpoints: listed members' `agentEndpoint`, selected Nodes'
    /// `caretaker.dev/agent-endpoint` annotation.
    agent_endpoints: BTreeMap<String, String>,
}

impl Read {
    async fn of(
        client: &kube::Client,
        object: &EtcdCertificates,
        policy: &EtcdPolicy,
    ) -> Result<Self, Error> {
        let namespace = object.namespace().unwrap_or_default();
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
        let all_certs = secrets.get_opt(ALL_CERTS).await?;
        let incumbents = all_certs.as_ref().map_or_else(BTreeSet::new, |all| {
            let (data, _) = write::secret_content(all);
            let text = data
                .iter()
                .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            etcd::members_in_all_certs(&text)
        });
        let (membership, node_endpoints) =
            membership_of(client, object, policy, &incumbents).await?;
        let mut agent_endpoints = node_endpoints;
        // A listed member's own endpoint wins over a Node's of the same name (the listing wins).
        agent_endpoints.extend(policy.agent_endpoints.clone());
        let mut names: Vec<String> = etcd::leaves(&membership.members)
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
        let bundle_names = (Signer::ALL.iter().map(|s| s.bundle()))
            .chain(etcd::OPENSHIFT_CA_CONFIG_MAPS.iter().map(|(name, _)| *name))
            .chain([etcd::ENDPOINTS_CONFIG_MAP]);
        let bundles = bundle_names.map(|name| config_maps.get_opt(name));
        let bundles = futures::future::try_join_all(bundles).await?;
        Ok(Self {
            namespace,
            found,
            bundles: bundles.into_iter().flatten().collect(),
            membership,
            agent_endpoints,
        })
    }

    /// Whether `owner` may write each object read (see `crate::ownership`). A Secret the spec
    /// names for the health checks (other than caretaker's own `etcd-client`) is the user's,
    /// and only read.
    fn claims(
        &self,
        owner: &Owner,
        policy: &EtcdPolicy,
    ) -> Vec<(&'static str, &ObjectMeta, Claim)> {
        let users_client = |meta: &ObjectMeta| {
            meta.name.as_deref() == Some(policy.client_secret.as_str())
                && policy.client_secret != etcd::CLIENT_SECRET
        };
        (self.found.iter())
            .map(|s| ("Secret", &s.metadata))
            .chain(self.bundles.iter().map(|c| ("ConfigMap", &c.metadata)))
            .filter(|(_, meta)| !users_client(meta))
            .map(|(kind, meta)| {
                let at = (
                    self.namespace.clone(),
                    meta.name.clone().unwrap_or_default(),
                );
                (kind, meta, claims::claim(owner, kind, &at, Some(meta)))
            })
            .collect()
    }

    /// The writer of the pass's steps, on the versions read.
    fn writer<'a>(&self, client: &'a kube::Client, owner: &'a Owner) -> StepWriter<'a> {
        let mut writer = StepWriter::new(client, owner);
        let objects = (self.found.iter())
            .map(|s| (ObjectKind::Secret, &s.metadata))
            .chain(
                self.bundles
                    .iter()
                    .map(|c| (ObjectKind::ConfigMap, &c.metadata)),
            );
        for (kind, meta) in objects {
            let at = (
                self.namespace.clone(),
                meta.name.clone().unwrap_or_default(),
            );
            writer.read(kind, at, meta.resource_version.clone());
        }
        writer
    }

    /// What the plan decides from, but the members' answers.
    fn observed(
        &self,
        shared: &Shared,
        key: &str,
        object: &EtcdCertificates,
        old: &EtcdCertificatesStatus,
    ) -> EtcdObserved {
        EtcdObserved {
            namespace: self.namespace.clone(),
            secrets: (self.found.iter())
                .map(|s| (s.name_any(), write::secret_content(s)))
                .collect(),
            config_maps: (self.bundles.iter())
                .map(|c| (c.name_any(), write::config_map_content(c)))
                .collect(),
            health: Vec::new(),
            last_good: lock(&shared.memory.last_good)
                .get(key)
                .cloned()
                .unwrap_or_default(),
            reported_degraded: (shared.memory.degraded)
                .reported(object, degraded_message(&old.conditions)),
        }
    }
}

/// Handed over: the marks first, alone; the next pass reads the objects as this object's.
/// Whether there were any.
async fn adopt(
    client: &kube::Client,
    owner: &Owner,
    namespace: &str,
    claims: &[(&'static str, &ObjectMeta, Claim)],
) -> Result<bool, Error> {
    let adopting: Vec<_> = (claims.iter())
        .filter(|(_, _, claim)| *claim == Claim::Adopt)
        .collect();
    for (kind, meta, _) in &adopting {
        let at = (namespace.to_string(), meta.name.clone().unwrap_or_default());
        let version = meta.resource_version.clone().unwrap_or_default();
        match *kind {
            "Secret" => write::adopt::<Secret>(client, owner, &at, &version).await?,
            _ => write::adopt::<ConfigMap>(client, owner, &at, &version).await?,
        };
    }
    Ok(!adopting.is_empty())
}

/// The plan (off the async threads: it may make keys and sign).
async fn plan(
    seen: &EtcdObserved,
    policy: &EtcdPolicy,
    membership: Membership,
    key: &str,
) -> Result<EtcdPlan, Error> {
    let (seen, policy) = (seen.clone(), policy.clone());
    let now = OffsetDateTime::now_utc();
    runtime::blocking(move || etcd::plan(&seen, &policy, &membership, now, &PkiMint))
        .await
        .map_err(|source| Error::SigningFailed {
            certificate: format!("EtcdCertificates {key}"),
            source,
        })
}

/// A step's write in `namespace`; `etcd-all-certs` replaces what `seen` holds.
fn step_of(step: &EtcdStep, namespace: &str, seen: &EtcdObserved) -> Step {
    let at = |name: &str| (namespace.to_string(), name.to_string());
    match step {
        EtcdStep::Signer(signer, AuthorityStep::WriteSecret(secret)) => Step::TlsSecret {
            key: at(signer.secret()),
            data: secret.data(),
            annotations: secret.annotation_changes(),
        },
        EtcdStep::Signer(signer, AuthorityStep::WriteBundle(bundle)) => Step::ConfigMap {
            key: at(signer.bundle()),
            data: bundle.data(),
            annotations: bundle.annotation_changes(),
        },
        EtcdStep::Certificate { secret, step } => Step::TlsSecret {
            key: at(secret),
            data: step.data(),
            annotations: step.annotation_changes(),
        },
        EtcdStep::RecheckQuorum => Step::Gate,
        EtcdStep::AllCerts(all) => {
            let mut annotations = AnnotationChanges::default();
            annotations.set(REVISION_ANNOTATION, all.revision.clone());
            Step::OpaqueSecret {
                key: at(ALL_CERTS),
                data: all.data.clone(),
                stored: seen.all_certs().unwrap_or_default().into_keys().collect(),
                annotations,
            }
        }
        // Only the version read, whose mark said it is this object's.
        EtcdStep::Delete(name) => Step::DeleteSecret { key: at(name) },
        EtcdStep::Endpoints(endpoints) => Step::ReplacedConfigMap {
            key: at(etcd::ENDPOINTS_CONFIG_MAP),
            data: endpoints.clone(),
            stored: (seen.config_maps.get(etcd::ENDPOINTS_CONFIG_MAP))
                .map(|(data, _)| data.keys().cloned().collect())
                .unwrap_or_default(),
        },
        EtcdStep::CaConfigMap { name, bundle } => Step::ConfigMap {
            key: at(name),
            data: BTreeMap::from([(caretaker_api::names::CA_BUNDLE_CRT, bundle.clone())]),
            annotations: AnnotationChanges::default(),
        },
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
                text(caretaker_api::names::TLS_CRT)?,
                text(caretaker_api::names::TLS_KEY)?,
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
/// holds now (`incumbents`); and, when `spec.agents` is set, the selected Nodes' agent
/// endpoints (their `caretaker.dev/agent-endpoint` annotation), by Node name.
async fn membership_of(
    client: &kube::Client,
    object: &EtcdCertificates,
    policy: &EtcdPolicy,
    incumbents: &BTreeSet<String>,
) -> Result<(Membership, BTreeMap<String, String>), Error> {
    let mut endpoints = BTreeMap::new();
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
                // Only where agents are used: the annotation also serves the Machine
                // controller's agents, and anyone who may annotate a Node can set it.
                if policy.agents_ca_secret.is_some()
                    && let Some(endpoint) = node.annotations().get(names::AGENT_ENDPOINT)
                {
                    endpoints.insert(node.name_any(), endpoint.clone());
                }
                candidates.push(node_candidate(&node));
            }
        }
    }
    let membership = members::choose(candidates, incumbents, &members::fixed_secrets(policy));
    Ok((membership, endpoints))
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
    let checked = policy::member_spec("metadata.name", &name, &at, &addresses).map(|mut m| {
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
    members: Vec<v1alpha1::MemberStatus>,
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
        latest_revision: old.latest_revision,
        members,
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
        status::condition(old, v1alpha1::CONDITION_READY, ready, generation, now),
        status::condition(old, etcd::CONDITION_DEGRADED, degraded, generation, now),
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
    status::write_status(&api, &object.name_any(), status, old).await?;
    shared.memory.degraded.remember(
        object,
        degraded_message(&old.conditions),
        degraded_message(&status.conditions),
    );
    Ok(())
}

impl ShowRefusal<EtcdCertificates> for Shared {
    fn reported(&self, object: &EtcdCertificates) -> Option<String> {
        let old = object.status.as_ref().map(|s| &s.conditions);
        let read = old.and_then(|conditions| degraded_message(conditions));
        self.memory.degraded.reported(object, read)
    }

    /// Degraded with the refusal's reason, nothing else written; then the Warning.
    async fn show(
        &self,
        object: &EtcdCertificates,
        refusal: &Refusal,
        warning: Option<Event>,
    ) -> Result<(), Error> {
        let old = object.status.clone().unwrap_or_default();
        let now = OffsetDateTime::now_utc();
        let generation = object.metadata.generation;
        let condition = |status| {
            crate::authority::Condition::new(status, refusal.reason, refusal.message.clone())
        };
        let status = EtcdCertificatesStatus {
            conditions: conditions(&old, (&condition(false), &condition(true)), generation, now),
            observed_generation: generation,
            ..old.clone()
        };
        write_status(self, object, &status, &old).await?;
        if let Some(warning) = warning {
            self.ctx.event(&object.object_ref(&()), warning).await;
        }
        Ok(())
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
