//! Cluster-wide rollouts: the same trigger annotations on a Cluster, a CK8sControlPlane or a
//! MachineDeployment roll the operation out over the Machines the parent covers, as
//! [`crate::rollout::RolloutPlan`] decides. The parent's controller only sets the trigger on
//! Machines (tagged with the request id); the Machine controller does the work. Machine changes
//! wake the parent through the shared Machine cache ([`super::cache`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use caretaker_agent_api::upgrade::ReleaseOption;
use caretaker_pki::Ttl;
use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};

use super::cache::{Caches, MachineChanges};

use crate::Error;
use crate::context::{Context, EventType};
use crate::machine::{self, MachineView};
use crate::names::{self, rollout_state};
use crate::rollout::{
    MachineObservation, MachineProgress, RequestState, Role, RolloutInput, RolloutPlan, Waiting,
};

/// The kinds a rollout can be asked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentKind {
    Cluster,
    ControlPlane,
    MachineDeployment,
}

impl ParentKind {
    pub fn api_resource(self) -> ApiResource {
        match self {
            ParentKind::Cluster => machine::cluster_api_resource(),
            ParentKind::ControlPlane => machine::control_plane_api_resource(),
            ParentKind::MachineDeployment => machine::machine_deployment_api_resource(),
        }
    }
}

/// The two operations, by the annotations and events that tell them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    RefreshCertificates,
    InPlaceUpgrade,
}

impl Operation {
    const ALL: [Operation; 2] = [Operation::RefreshCertificates, Operation::InPlaceUpgrade];

    fn trigger(self) -> &'static str {
        match self {
            Operation::RefreshCertificates => names::REFRESH_CERTIFICATES,
            Operation::InPlaceUpgrade => names::IN_PLACE_UPGRADE_TO,
        }
    }
    fn status(self) -> &'static str {
        match self {
            Operation::RefreshCertificates => names::REFRESH_CERTIFICATES_STATUS,
            Operation::InPlaceUpgrade => names::IN_PLACE_UPGRADE_STATUS,
        }
    }
    fn request(self) -> &'static str {
        match self {
            Operation::RefreshCertificates => rollout_state::REFRESH_REQUEST,
            Operation::InPlaceUpgrade => rollout_state::UPGRADE_REQUEST,
        }
    }
    fn request_trigger(self) -> &'static str {
        match self {
            Operation::RefreshCertificates => rollout_state::REFRESH_TRIGGER,
            Operation::InPlaceUpgrade => rollout_state::UPGRADE_TRIGGER,
        }
    }
    fn last_error(self) -> &'static str {
        match self {
            Operation::RefreshCertificates => names::refresh_state::LAST_ERROR,
            Operation::InPlaceUpgrade => names::upgrade_state::LAST_ERROR,
        }
    }
    /// (in progress, done, failed, cancelled)
    fn events(self) -> [&'static str; 4] {
        match self {
            Operation::RefreshCertificates => [
                names::EVENT_REFRESH_CERTS_IN_PROGRESS,
                names::EVENT_REFRESH_CERTS_DONE,
                names::EVENT_REFRESH_CERTS_FAILED,
                names::EVENT_REFRESH_CERTS_CANCELLED,
            ],
            Operation::InPlaceUpgrade => [
                names::EVENT_UPGRADE_IN_PROGRESS,
                names::EVENT_UPGRADE_DONE,
                names::EVENT_UPGRADE_FAILED,
                names::EVENT_UPGRADE_CANCELLED,
            ],
        }
    }
    fn validate(self, value: &str) -> Result<(), String> {
        match self {
            Operation::RefreshCertificates => {
                value.parse::<Ttl>().map(|_| ()).map_err(|e| e.to_string())
            }
            Operation::InPlaceUpgrade => ReleaseOption::parse(value)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }
}

/// The parent kinds, each with its own controller.
pub const PARENT_KINDS: [ParentKind; 3] = [
    ParentKind::Cluster,
    ParentKind::ControlPlane,
    ParentKind::MachineDeployment,
];

/// Runs the rollout controllers of all three parent kinds until their streams end; one stream
/// of Machine changes per kind, in the order of [`PARENT_KINDS`].
pub async fn run(
    ctx: Arc<Context>,
    api: impl Fn(&ApiResource) -> Api<DynamicObject>,
    caches: Caches,
    machine_changes: Vec<MachineChanges>,
) {
    let controllers = PARENT_KINDS
        .into_iter()
        .zip(machine_changes)
        .map(|(kind, changes)| {
            let parents = api(&kind.api_resource());
            run_kind(ctx.clone(), parents, kind, caches.clone(), changes)
        });
    futures::future::join_all(controllers).await;
}

async fn run_kind(
    ctx: Arc<Context>,
    parents: Api<DynamicObject>,
    kind: ParentKind,
    caches: Caches,
    machine_changes: MachineChanges,
) {
    let resource = kind.api_resource();
    let mapper_resource = resource.clone();
    Controller::new_with(parents, watcher::Config::default(), resource)
        .watches_stream_with(
            machine_changes,
            move |m| parents_of(kind, &MachineView::from_object(&m), &mapper_resource),
            machine::api_resource(),
        )
        .run(
            move |parent, ctx| reconcile(parent, ctx, kind, caches.clone()),
            error_policy,
            ctx,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "rollout reconcile failed");
            }
        })
        .await;
}

/// The parents of `kind` a Machine's change may matter to.
fn parents_of(
    kind: ParentKind,
    m: &MachineView,
    resource: &ApiResource,
) -> Vec<ObjectRef<DynamicObject>> {
    let name = match kind {
        ParentKind::Cluster => Some(m.cluster_name.clone()),
        ParentKind::MachineDeployment => m.labels.get(DEPLOYMENT_LABEL).cloned(),
        ParentKind::ControlPlane => m.labels.get(CONTROL_PLANE_NAME_LABEL).cloned(),
    };
    name.filter(|n| !n.is_empty())
        .map(|n| ObjectRef::new_with(&n, resource.clone()).within(&m.namespace))
        .into_iter()
        .collect()
}

const DEPLOYMENT_LABEL: &str = "cluster.x-k8s.io/deployment-name";
const CONTROL_PLANE_NAME_LABEL: &str = "cluster.x-k8s.io/control-plane-name";
/// Health checks of control-plane agents give up after this long.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

fn error_policy(_parent: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %error, category = error.metric_label(), "rollout reconcile failed");
    Action::requeue(ctx.settings.retry_base)
}

/// The `caretaker.dev/max-parallel` limits set on the Cluster's MachineDeployments (a malformed
/// one counts as 1).
fn deployment_limits(caches: &Caches, cluster: &DynamicObject) -> BTreeMap<String, usize> {
    caches
        .deployments_of(cluster)
        .iter()
        .filter(|d| d.annotations().contains_key(names::MAX_PARALLEL))
        .map(|d| (d.name_any(), max_parallel(d).unwrap_or(1)))
        .collect()
}

/// The object's `caretaker.dev/max-parallel`, when it is a whole number of at least 1.
fn max_parallel(object: &DynamicObject) -> Option<usize> {
    object
        .annotations()
        .get(names::MAX_PARALLEL)?
        .parse()
        .ok()
        .filter(|n| *n >= 1)
}

/// A note for each `caretaker.dev/max-parallel` this rollout reads that is not a whole number of
/// at least 1 (such a limit counts as 1).
fn malformed_limits(kind: ParentKind, parent: &DynamicObject, caches: &Caches) -> Vec<String> {
    if kind == ParentKind::ControlPlane {
        return Vec::new(); // control-plane Machines always go one at a time
    }
    let mut objects = vec![(kind.api_resource().kind, Arc::new(parent.clone()))];
    if kind == ParentKind::Cluster {
        let deployments = caches.deployments_of(parent).into_iter();
        objects.extend(deployments.map(|d| ("MachineDeployment".to_string(), d)));
    }
    objects
        .iter()
        .filter_map(|(kind, object)| {
            let value = object.annotations().get(names::MAX_PARALLEL)?;
            max_parallel(object).is_none().then(|| {
                format!(
                    "{} {value:?} on {kind} {} is not a whole number of at least 1; its workers go one at a time",
                    names::MAX_PARALLEL,
                    object.name_any()
                )
            })
        })
        .collect()
}

/// The cached Machines the parent covers.
fn covered_machines(kind: ParentKind, parent: &DynamicObject, caches: &Caches) -> Vec<MachineView> {
    caches
        .machines_in(parent.metadata.namespace.as_deref())
        .iter()
        .map(|m| MachineView::from_object(m))
        .filter(|m| covers(kind, parent, m))
        .collect()
}

/// Whether the parent covers the Machine.
fn covers(kind: ParentKind, parent: &DynamicObject, m: &MachineView) -> bool {
    let name = parent.name_any();
    match kind {
        ParentKind::Cluster => m.cluster_name == name,
        ParentKind::MachineDeployment => m.labels.get(DEPLOYMENT_LABEL) == Some(&name),
        ParentKind::ControlPlane => {
            m.control_plane && m.labels.get(CONTROL_PLANE_NAME_LABEL) == Some(&name)
        }
    }
}

async fn reconcile(
    parent: Arc<DynamicObject>,
    ctx: Arc<Context>,
    kind: ParentKind,
    caches: Caches,
) -> Result<Action, Error> {
    // An empty cache would read as a rollout with no Machines, and so as done.
    caches.wait_until_ready().await?;
    let mut next = Action::await_change();
    for operation in Operation::ALL {
        if let Some(action) = reconcile_operation(&parent, &ctx, kind, operation, &caches).await? {
            next = action;
        }
    }
    Ok(next)
}

async fn reconcile_operation(
    parent: &DynamicObject,
    ctx: &Arc<Context>,
    kind: ParentKind,
    operation: Operation,
    caches: &Caches,
) -> Result<Option<Action>, Error> {
    let annotations = parent.annotations();
    let trigger = annotations.get(operation.trigger()).cloned();
    let status = annotations.get(operation.status()).map(String::as_str);
    let resource = kind.api_resource();
    let reference = parent.object_ref(&resource);
    let [ev_progress, ev_done, ev_failed, ev_cancelled] = operation.events();

    let state = RequestState::of(
        trigger.as_deref(),
        status,
        annotations
            .get(operation.request_trigger())
            .map(String::as_str),
    );
    match state {
        RequestState::NoRequest
            if kind == ParentKind::Cluster && operation == Operation::RefreshCertificates =>
        {
            return auto_refresh(parent, ctx, caches).await;
        }
        RequestState::NoRequest | RequestState::Ended => return Ok(None),
        RequestState::ForgetEnded => {
            let changes = BTreeMap::from([(operation.request_trigger().to_string(), Value::Null)]);
            patch_parent(ctx, &resource, parent, changes).await?;
            return Ok(None);
        }
        RequestState::New { trigger: value } => {
            let mut changes = BTreeMap::new();
            if let Err(reason) = operation.validate(value) {
                changes.insert(operation.status().to_string(), json!(names::STATUS_FAILED));
                changes.insert(operation.request_trigger().to_string(), json!(value));
                patch_parent(ctx, &resource, parent, changes).await?;
                ctx.event(&reference, EventType::Warning, ev_failed, reason)
                    .await;
                return Ok(None);
            }
            let id = format!(
                "{:x}",
                time::OffsetDateTime::now_utc().unix_timestamp_nanos()
            );
            changes.insert(
                operation.status().to_string(),
                json!(names::STATUS_IN_PROGRESS),
            );
            changes.insert(operation.request().to_string(), json!(id));
            changes.insert(operation.request_trigger().to_string(), json!(value));
            changes.insert(rollout_state::WAITING.to_string(), Value::Null);
            patch_parent(ctx, &resource, parent, changes).await?;
            let note = format!(
                "rolling {} = {value} out over the Machines of {} {}",
                operation.trigger(),
                resource.kind,
                parent.name_any()
            );
            ctx.event(&reference, EventType::Normal, ev_progress, note)
                .await;
            for problem in malformed_limits(kind, parent, caches) {
                ctx.event(&reference, EventType::Warning, ev_progress, problem)
                    .await;
            }
            return Ok(None);
        }
        RequestState::InProgress => {}
    }

    // In progress (or cancelled: trigger removed while in progress).
    let request_id = annotations
        .get(operation.request())
        .cloned()
        .unwrap_or_default();
    let views = covered_machines(kind, parent, caches);
    let mut observations = observe(operation, &request_id, &views);
    let mut input = RolloutInput {
        cancelled: trigger.is_none(),
        max_parallel: max_parallel(parent).unwrap_or(1),
        deployment_limits: match kind {
            ParentKind::Cluster => deployment_limits(caches, parent),
            // A MachineDeployment's own limit is the parent's; a control plane has no workers.
            ParentKind::MachineDeployment | ParentKind::ControlPlane => BTreeMap::new(),
        },
        machines: observations.clone(),
    };
    let mut plan = RolloutPlan::decide(&input);
    // Agents are asked for their health only when a control-plane Machine would start: the
    // checks cost a TLS handshake each, and only that step is gated on them.
    let starts_control_plane = matches!(&plan, RolloutPlan::Continue { start, .. }
        if start.iter().any(|n| views.iter().any(|m| &m.name == n && m.control_plane)));
    if starts_control_plane {
        for (observation, m) in observations.iter_mut().zip(&views) {
            if m.control_plane && !m.being_deleted {
                observation.agent_healthy = agent_healthy(ctx, m).await;
            }
        }
        input.machines = observations;
        plan = RolloutPlan::decide(&input);
    }

    let mut changes = BTreeMap::new();
    let progress = match &plan {
        RolloutPlan::Continue { progress, .. }
        | RolloutPlan::Done { progress }
        | RolloutPlan::Failed { progress, .. }
        | RolloutPlan::Stopping { progress, .. }
        | RolloutPlan::Cancelled { progress } => *progress,
    };
    let progress_text = format!("{}/{}", progress.done, progress.total);
    if annotations.get(names::PROGRESS) != Some(&progress_text) {
        changes.insert(names::PROGRESS.to_string(), json!(progress_text));
    }
    let mut requeue = None;
    match plan {
        RolloutPlan::Continue { start, waiting, .. } => {
            let value = trigger.clone().unwrap_or_default();
            let starting: Vec<&MachineView> = start
                .iter()
                .filter_map(|name| views.iter().find(|m| &m.name == name))
                .collect();
            if let Started::Stale(_) =
                start_machines(&ctx.client, operation, &value, &request_id, &starting).await?
            {
                // The Machine changed since the cache saw it; its watch event wakes us.
                return Ok(None);
            }
            let waiting_text = waiting.as_ref().map(|w| match w {
                Waiting::ForNodes(names) => {
                    format!("waiting for {} to get a node", names.join(", "))
                }
                Waiting::ForControlPlaneHealth(names) => format!(
                    "waiting: control-plane Machines {} have no node or no healthy agent",
                    names.join(", ")
                ),
            });
            if let Some(text) = &waiting_text {
                if annotations.get(rollout_state::WAITING) != Some(text) {
                    changes.insert(rollout_state::WAITING.to_string(), json!(text));
                    ctx.event(&reference, EventType::Normal, ev_progress, text.clone())
                        .await;
                }
                // Agent health and node assignment are not all watched: look again.
                requeue = Some(Action::requeue(
                    ctx.settings.retry_base.max(Duration::from_secs(1)),
                ));
            }
        }
        RolloutPlan::Done { .. } => {
            changes.insert(operation.status().to_string(), json!(names::STATUS_DONE));
            changes.insert(operation.trigger().to_string(), Value::Null);
            changes.insert(rollout_state::WAITING.to_string(), Value::Null);
            if operation == Operation::InPlaceUpgrade {
                changes.insert(
                    names::IN_PLACE_UPGRADE_RELEASE.to_string(),
                    json!(trigger.clone().unwrap_or_default()),
                );
            }
            let note = format!(
                "all {} Machines of {} {} are done ({} skipped)",
                progress.total,
                resource.kind,
                parent.name_any(),
                progress.skipped
            );
            patch_parent(ctx, &resource, parent, changes).await?;
            ctx.event(&reference, EventType::Normal, ev_done, note)
                .await;
            return Ok(None);
        }
        RolloutPlan::Stopping {
            machine,
            reason,
            running,
            ..
        } => {
            // Still `in-progress`: the Machines it started change their nodes until they
            // finish, and a parent that said `failed` could get a new request that would take
            // their work for its own. Each finishing Machine wakes this parent again.
            let text = format!(
                "Machine {machine} failed: nothing new starts; the rollout ends failed once {} finish: {reason}",
                running.join(", ")
            );
            if annotations.get(rollout_state::WAITING) != Some(&text) {
                changes.insert(rollout_state::WAITING.to_string(), json!(text));
                ctx.event(&reference, EventType::Warning, ev_progress, text)
                    .await;
            }
        }
        RolloutPlan::Failed {
            machine, reason, ..
        } => {
            changes.insert(operation.status().to_string(), json!(names::STATUS_FAILED));
            changes.insert(rollout_state::WAITING.to_string(), Value::Null);
            patch_parent(ctx, &resource, parent, changes).await?;
            let note = format!("Machine {machine} failed, the rollout stopped: {reason}");
            ctx.event(&reference, EventType::Warning, ev_failed, note)
                .await;
            return Ok(None);
        }
        RolloutPlan::Cancelled { .. } => {
            changes.insert(
                operation.status().to_string(),
                json!(names::STATUS_CANCELLED),
            );
            changes.insert(rollout_state::WAITING.to_string(), Value::Null);
            patch_parent(ctx, &resource, parent, changes).await?;
            let note = format!("cancelled after {progress_text} Machines: the trigger was removed");
            ctx.event(&reference, EventType::Normal, ev_cancelled, note)
                .await;
            return Ok(None);
        }
    }
    if !changes.is_empty() {
        patch_parent(ctx, &resource, parent, changes).await?;
    }
    Ok(requeue)
}

/// How [`start_machines`] went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Started {
    /// Every Machine was started.
    All,
    /// The named Machine had changed since it was observed (the API server refused the write at
    /// the observed `resourceVersion`): neither it nor the Machines after it were started.
    Stale(String),
}

/// Starts `machines` (as the plan observed them) for request `request_id` with trigger value
/// `value`, in order, each only at the version it was observed at (see [`start_patch`]), and
/// stops at the first one that has changed since. Public so that tests can hand it a view that
/// a lagging cache would hold.
pub async fn start_machines(
    client: &kube::Client,
    operation: Operation,
    value: &str,
    request_id: &str,
    machines: &[&MachineView],
) -> Result<Started, Error> {
    for m in machines {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &m.namespace, &machine::api_resource());
        let body = start_patch(operation, value, request_id, m);
        match api
            .patch(&m.name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Started::Stale(m.name.clone())),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Started::All)
}

/// The patch that starts Machine `m` for request `request_id` with trigger value `value`.
///
/// A Machine's status is the result of the last request it ran. An ended one (`done`, `failed`,
/// `cancelled`) belongs to an earlier request: left in place beside this request's tag it would
/// read as this request's result before the Machine controller has begun (a stale `failed`
/// ended new requests at once), and the Machine controller would take an unchanged trigger for
/// the ended request. So the same write that tags the Machine clears it. The write is made only
/// on the version the plan saw untouched by this request (a lagging cache could otherwise
/// restart a Machine this request has finished), so it never clears a result this request
/// produced, and a restarted operator still finds its finished Machines finished.
/// `in-progress` stays: that work still runs on the node, and the Machine controller continues
/// or restarts it.
fn start_patch(operation: Operation, value: &str, request_id: &str, m: &MachineView) -> Value {
    let mut annotations = serde_json::Map::new();
    annotations.insert(operation.trigger().into(), json!(value));
    annotations.insert(operation.request().into(), json!(request_id));
    if m.annotation(operation.status())
        .is_some_and(|status| status != names::STATUS_IN_PROGRESS)
    {
        annotations.insert(operation.status().into(), Value::Null);
    }
    json!({ "metadata": {
        "resourceVersion": m.resource_version,
        "annotations": annotations,
    } })
}

/// What the plan needs to know about each Machine, in the order of `views`; agent health is
/// assumed good here and checked by the caller when it matters.
fn observe(
    operation: Operation,
    request_id: &str,
    views: &[MachineView],
) -> Vec<MachineObservation> {
    let mut observations = Vec::with_capacity(views.len());
    for m in views {
        let touched = m.annotation(operation.request()) == Some(request_id);
        let progress = if !touched {
            MachineProgress::Untouched
        } else if m.annotation(operation.trigger()).is_some() {
            match m.annotation(operation.status()) {
                Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED) => {
                    MachineProgress::Failed
                }
                _ => MachineProgress::Running,
            }
        } else {
            match m.annotation(operation.status()) {
                Some(names::STATUS_DONE) => MachineProgress::Done,
                Some(names::STATUS_IN_PROGRESS) => MachineProgress::Running,
                _ => MachineProgress::Failed,
            }
        };
        // Filled in by the caller when it matters.
        let agent_healthy = true;
        observations.push(MachineObservation {
            name: m.name.clone(),
            role: if m.control_plane {
                Role::ControlPlane
            } else {
                Role::Worker {
                    deployment: m.labels.get(DEPLOYMENT_LABEL).cloned().unwrap_or_default(),
                }
            },
            has_node: m.node_name.is_some(),
            agent_healthy,
            being_deleted: m.being_deleted,
            progress,
            failure: m
                .annotation(operation.last_error())
                .map(str::to_string)
                .or_else(|| {
                    (progress == MachineProgress::Failed).then(|| {
                        format!(
                            "status {}",
                            m.annotation(operation.status()).unwrap_or("unknown")
                        )
                    })
                }),
        });
    }
    observations
}

async fn agent_healthy(ctx: &Context, m: &MachineView) -> bool {
    let Ok(agent) = ctx.agent_of(m).await else {
        return false;
    };
    matches!(
        tokio::time::timeout(HEALTH_TIMEOUT, agent.client.health(&agent.url)).await,
        Ok(Ok(_))
    )
}

async fn patch_parent(
    ctx: &Context,
    resource: &ApiResource,
    parent: &DynamicObject,
    changes: BTreeMap<String, Value>,
) -> Result<(), Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        ctx.client.clone(),
        &parent.namespace().unwrap_or_default(),
        resource,
    );
    let body = json!({ "metadata": { "annotations": changes } });
    api.patch(
        &parent.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&body),
    )
    .await?;
    Ok(())
}

/// The opt-in automatic refresh of a Cluster: sets the trigger when the earliest expiry of its
/// Machines is within `before`, and otherwise comes back when it will be.
async fn auto_refresh(
    cluster: &DynamicObject,
    ctx: &Arc<Context>,
    caches: &Caches,
) -> Result<Option<Action>, Error> {
    let annotations = cluster.annotations();
    let Some(value) = annotations.get(names::AUTO_REFRESH_CERTIFICATES) else {
        return Ok(None);
    };
    let resource = ParentKind::Cluster.api_resource();
    let auto = match crate::rollout::AutoRefresh::parse(value) {
        Ok(auto) => auto,
        Err(reason) => {
            if annotations.get(rollout_state::AUTO_REFRESH_REPORTED) != Some(value) {
                let reference = cluster.object_ref(&resource);
                let note = format!(
                    "{}: {reason}; automatic refresh is off until it is fixed",
                    names::AUTO_REFRESH_CERTIFICATES
                );
                ctx.event(
                    &reference,
                    EventType::Warning,
                    names::EVENT_REFRESH_CERTS_FAILED,
                    note,
                )
                .await;
                let changes = BTreeMap::from([(
                    rollout_state::AUTO_REFRESH_REPORTED.to_string(),
                    json!(value),
                )]);
                patch_parent(ctx, &resource, cluster, changes).await?;
            }
            return Ok(None);
        }
    };
    let earliest = covered_machines(ParentKind::Cluster, cluster, caches)
        .iter()
        .filter(|m| !m.being_deleted)
        .filter_map(|m| {
            crate::machine::refresh::parse_time(m.annotation(names::CERTIFICATES_EXPIRY))
        })
        .min();
    let Some(earliest) = earliest else {
        return Ok(None);
    };
    let now = time::OffsetDateTime::now_utc();
    let due = auto.due_at(earliest);
    if due > now {
        // Nothing changes on its own as time passes: come back when it is due (at most hourly).
        let wait = Duration::try_from(due - now)
            .unwrap_or(Duration::ZERO)
            .min(Duration::from_secs(3600));
        return Ok(Some(Action::requeue(wait)));
    }
    let changes = BTreeMap::from([(
        names::REFRESH_CERTIFICATES.to_string(),
        json!(auto.ttl.to_string()),
    )]);
    patch_parent(ctx, &resource, cluster, changes).await?;
    tracing::info!(cluster = %cluster.name_any(), expiry = %earliest, "automatic certificate refresh started");
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::test_machine;
    use crate::machine::{refresh, upgrade};

    /// `m` after the merge patch `body` (a null removes an annotation).
    fn patched(m: &MachineView, body: &Value) -> MachineView {
        let mut m = m.clone();
        for (key, value) in body["metadata"]["annotations"].as_object().unwrap() {
            match value.as_str() {
                Some(text) => m.annotations.insert(key.clone(), text.to_string()),
                None => m.annotations.remove(key),
            };
        }
        m
    }

    /// Whatever an earlier request left on a Machine, starting it for a new request makes it
    /// running for that request (never failed or done by it), and the Machine controller takes
    /// it up, even when the trigger value is the earlier one.
    #[test]
    fn a_started_machine_carries_no_result_of_an_earlier_request() {
        let now = time::OffsetDateTime::now_utc();
        for (operation, value) in [
            (Operation::RefreshCertificates, "1y"),
            (Operation::InPlaceUpgrade, "channel=1.35/stable"),
        ] {
            let bookkeeping_trigger = match operation {
                Operation::RefreshCertificates => names::refresh_state::TRIGGER,
                Operation::InPlaceUpgrade => names::upgrade_state::TRIGGER,
            };
            let statuses = [
                None,
                Some(names::STATUS_DONE),
                Some(names::STATUS_FAILED),
                Some(names::STATUS_CANCELLED),
            ];
            for status in statuses {
                for earlier_trigger in [None, Some(value)] {
                    let mut earlier = vec![(operation.request(), "earlier-request")];
                    earlier.extend(status.map(|s| (operation.status(), s)));
                    earlier.extend(earlier_trigger.map(|t| (operation.trigger(), t)));
                    earlier.extend(earlier_trigger.map(|t| (bookkeeping_trigger, t)));
                    earlier.push((operation.last_error(), "the earlier request's error"));
                    let before = test_machine(&earlier);
                    let seen = observe(operation, "new", std::slice::from_ref(&before));
                    assert_eq!(seen[0].progress, MachineProgress::Untouched, "{earlier:?}");

                    let started = patched(&before, &start_patch(operation, value, "new", &before));
                    let seen = observe(operation, "new", std::slice::from_ref(&started));
                    assert_eq!(seen[0].progress, MachineProgress::Running, "{earlier:?}");
                    let taken_up = match operation {
                        Operation::RefreshCertificates => {
                            refresh::decide(&started, now)
                                == refresh::RefreshStep::Start {
                                    trigger: value.into(),
                                }
                        }
                        Operation::InPlaceUpgrade => {
                            upgrade::decide(&started, now)
                                == upgrade::UpgradeStep::Start {
                                    trigger: value.into(),
                                }
                        }
                    };
                    assert!(taken_up, "the Machine controller starts {earlier:?}");
                }
            }
        }
    }

    /// A Machine's annotations, read as where it stands for request `new`.
    #[test]
    fn observe_reads_each_machine_for_this_request_only() {
        let op = Operation::RefreshCertificates;
        let (trigger, status, tag) = (op.trigger(), op.status(), op.request());
        type Case<'a> = (&'a [(&'a str, &'a str)], MachineProgress, Option<&'a str>);
        let cases: [Case; 8] = [
            (&[], MachineProgress::Untouched, None),
            (
                &[(tag, "old"), (status, names::STATUS_FAILED)],
                MachineProgress::Untouched,
                None,
            ),
            (
                &[(tag, "new"), (trigger, "1y")],
                MachineProgress::Running,
                None,
            ),
            (
                &[
                    (tag, "new"),
                    (trigger, "1y"),
                    (status, names::STATUS_IN_PROGRESS),
                ],
                MachineProgress::Running,
                None,
            ),
            (
                &[
                    (tag, "new"),
                    (trigger, "1y"),
                    (status, names::STATUS_FAILED),
                    (op.last_error(), "boom"),
                ],
                MachineProgress::Failed,
                Some("boom"),
            ),
            (
                &[(tag, "new"), (status, names::STATUS_DONE)],
                MachineProgress::Done,
                None,
            ),
            (
                &[(tag, "new"), (status, names::STATUS_IN_PROGRESS)],
                MachineProgress::Running,
                None,
            ),
            // Tagged, trigger gone and no result: someone removed it; not done.
            (
                &[(tag, "new")],
                MachineProgress::Failed,
                Some("status unknown"),
            ),
        ];
        for (annotations, progress, failure) in cases {
            let mut m = test_machine(annotations);
            m.labels.insert(DEPLOYMENT_LABEL.into(), "md-a".into());
            let seen = observe(op, "new", std::slice::from_ref(&m));
            assert_eq!(seen[0].progress, progress, "{annotations:?}");
            assert_eq!(seen[0].failure.as_deref(), failure, "{annotations:?}");
            assert_eq!(
                seen[0].role,
                Role::Worker {
                    deployment: "md-a".into()
                }
            );
            assert!(seen[0].has_node && !seen[0].being_deleted);
        }
        let mut plane = test_machine(&[]);
        plane.control_plane = true;
        plane.node_name = None;
        let seen = observe(op, "new", &[plane]);
        assert_eq!(
            (seen[0].role.clone(), seen[0].has_node),
            (Role::ControlPlane, false)
        );
    }

    /// Work running on the node keeps its status: the Machine controller continues it.
    #[test]
    fn starting_a_machine_keeps_a_running_status() {
        let running = test_machine(&[(names::IN_PLACE_UPGRADE_STATUS, names::STATUS_IN_PROGRESS)]);
        let body = start_patch(Operation::InPlaceUpgrade, "revision=5", "new", &running);
        let started = patched(&running, &body);
        assert_eq!(
            started.annotation(names::IN_PLACE_UPGRADE_STATUS),
            Some(names::STATUS_IN_PROGRESS)
        );
        let seen = observe(Operation::InPlaceUpgrade, "new", &[started]);
        assert_eq!(seen[0].progress, MachineProgress::Running);
    }
}
