//! Cluster-wide rollouts: the same trigger annotations on a Cluster, a CK8sControlPlane or a
//! MachineDeployment roll the operation out over the Machines the parent covers. The parent's
//! controller only sets the trigger on Machines (tagged with the request id); the Machine
//! controller does the work. Machine changes wake the parent through the shared Machine cache
//! ([`crate::machine::cache`]).
//!
//! A pass observes the parent and its Machines, asks [`crate::rollout::parent`] what to do
//! ([`ParentStep::of`], then [`RolloutPlan::decide`] and [`Rollout::changes`] for a running
//! request) and applies the resulting [`ParentChanges`].

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use time::OffsetDateTime;

use crate::Error;
use crate::context::Context;
use crate::machine::cache::{Caches, MachineChanges};
use crate::machine::{self, MachineView};
use crate::rollout::chain::{self, ChainPlan, observe_children};
use crate::rollout::parent::{
    MachineStart, ParentChanges, ParentKind, ParentStep, ParentView, Rollout, auto_refresh,
    blocked_by,
};
use crate::rollout::{Progress, RolloutPlan};
use crate::schedule::Next;
use caretaker_api::names::{self, Operation};

/// Runs the rollout controllers of all three parent kinds until their streams end; one stream
/// of Machine changes per kind, in the order of [`ParentKind::ALL`].
pub async fn run(
    ctx: Arc<Context>,
    api: impl Fn(&ApiResource) -> Api<DynamicObject>,
    caches: Caches,
    machine_changes: Vec<MachineChanges>,
) {
    let controllers = ParentKind::ALL
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
    let client = parents.clone().into_client();
    let metrics = ctx.metrics.clone();
    let controller = Controller::new_with(parents, watcher::Config::default(), resource.clone())
        .graceful_shutdown_on(ctx.shutdown.signal())
        .watches_stream_with(
            machine_changes,
            move |m| parents_of(kind, &MachineView::from_object(&m), &mapper_resource),
            caretaker_api::cluster_api::machine_api_resource(),
        );
    // A Cluster's request waits on its children's status: their changes wake it, and it reads
    // its control plane from a cache of its own (MachineDeployments are in `caches`).
    let (children, controller) = if kind == ParentKind::Cluster {
        let plane_resource = ParentKind::ControlPlane.api_resource();
        let plane_writer = kube::runtime::reflector::store::Writer::new(plane_resource.clone());
        let planes = plane_writer.as_reader();
        let plane_api: Api<DynamicObject> = Api::all_with(client.clone(), &plane_resource);
        let plane_changes =
            kube::runtime::reflector(plane_writer, watcher(plane_api, watcher::Config::default()))
                .applied_objects();
        // The MachineDeployments' changes wake the Cluster only once this store has them, so
        // a pass never reads one older than the change that woke it (`caches` may lag).
        let deployment_resource = ParentKind::MachineDeployment.api_resource();
        let deployment_writer =
            kube::runtime::reflector::store::Writer::new(deployment_resource.clone());
        let deployments = deployment_writer.as_reader();
        let deployment_api: Api<DynamicObject> = Api::all_with(client, &deployment_resource);
        let deployment_changes = kube::runtime::reflector(
            deployment_writer,
            watcher(deployment_api, watcher::Config::default()),
        )
        .applied_objects();
        let (to_cluster, to_cluster_too) = (resource.clone(), resource.clone());
        let controller = controller
            .watches_stream_with(
                plane_changes,
                move |child| cluster_of_child(&child, &to_cluster),
                plane_resource,
            )
            .watches_stream_with(
                deployment_changes,
                move |child| cluster_of_child(&child, &to_cluster_too),
                deployment_resource,
            );
        (
            Some(ChildStores {
                planes,
                deployments,
            }),
            controller,
        )
    } else {
        (None, controller)
    };
    controller
        .run(
            move |parent, ctx| reconcile(parent, ctx, kind, caches.clone(), children.clone()),
            error_policy,
            ctx,
        )
        .for_each(|result| {
            match result {
                // A change of a parent no longer in the cache: it is gone, and its rollout
                // series with it (a deleted failed parent is nothing to alert on).
                Err(kube::runtime::controller::Error::ObjectNotFound(gone)) => {
                    for operation in Operation::ALL {
                        metrics.remove_rollout(
                            &gone.dyntype.kind,
                            gone.namespace.as_deref().unwrap_or_default(),
                            &gone.name,
                            operation.metric_label(),
                        );
                    }
                }
                Err(e) => tracing::debug!(error = %e, "rollout reconcile failed"),
                Ok(_) => {}
            }
            std::future::ready(())
        })
        .await;
}

/// The Cluster a control plane or MachineDeployment belongs to: its `spec.clusterName`, its
/// owner Cluster, or its `cluster.x-k8s.io/cluster-name` label.
fn cluster_name_of(child: &DynamicObject) -> Option<String> {
    child.data["spec"]["clusterName"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            child
                .owner_references()
                .iter()
                .find(|o| o.kind == "Cluster")
                .map(|o| o.name.clone())
        })
        .or_else(|| child.labels().get(names::CLUSTER_NAME_LABEL).cloned())
        .filter(|name| !name.is_empty())
}

fn cluster_of_child(
    child: &DynamicObject,
    resource: &ApiResource,
) -> Option<ObjectRef<DynamicObject>> {
    let namespace = child.namespace()?;
    Some(ObjectRef::new_with(&cluster_name_of(child)?, resource.clone()).within(&namespace))
}

/// The parents of `kind` a Machine's change may matter to.
fn parents_of(
    kind: ParentKind,
    m: &MachineView,
    resource: &ApiResource,
) -> Vec<ObjectRef<DynamicObject>> {
    kind.parent_of(m)
        .map(|name| ObjectRef::new_with(name, resource.clone()).within(&m.namespace))
        .into_iter()
        .collect()
}

/// How soon a pass whose view of a Machine was stale runs again, by when the cache has that
/// Machine's new version.
const STALE_RETRY: Duration = Duration::from_millis(100);

/// Health checks of control-plane agents give up after this long.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(5);

/// The controllers' name in logs and metrics (one for the three parent kinds).
const CONTROLLER: &str = "rollout";

fn error_policy(_parent: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    crate::runtime::requeue_after(CONTROLLER, error, &ctx)
}

/// A Cluster controller's caches of its children, filled by the watches that wake it.
#[derive(Clone)]
struct ChildStores {
    planes: kube::runtime::reflector::Store<DynamicObject>,
    deployments: kube::runtime::reflector::Store<DynamicObject>,
}

type Planes = Option<ChildStores>;

async fn reconcile(
    parent: Arc<DynamicObject>,
    ctx: Arc<Context>,
    kind: ParentKind,
    caches: Caches,
    planes: Planes,
) -> Result<Action, Error> {
    let _timer = ctx.reconcile_started(CONTROLLER);
    // An empty cache would read as a rollout with no Machines, and so as done.
    caches.wait_until_ready().await?;
    let mut view = observe_parent(kind, &parent, &caches);
    view.progress_age = ctx.progress_age(&parent_key(kind, &parent));
    let mut next = Next::AwaitChange;
    for operation in Operation::ALL {
        report_status(&ctx, &parent, &view, operation);
        let wish = reconcile_operation(&parent, &view, &ctx, operation, &caches, &planes).await?;
        next = next.sooner(wish);
    }
    Ok(next.into())
}

/// One operation's pass: observe, decide, apply.
async fn reconcile_operation(
    parent: &DynamicObject,
    view: &ParentView,
    ctx: &Context,
    operation: Operation,
    caches: &Caches,
    planes: &Planes,
) -> Result<Next, Error> {
    let now = OffsetDateTime::now_utc();
    let changes = match ParentStep::of(operation, view, now) {
        ParentStep::Idle => return Ok(Next::AwaitChange),
        ParentStep::Write(changes) => changes,
        ParentStep::AutoRefresh => {
            let changes = auto_refresh(view, &covered_machines(parent, view, caches), now);
            if changes.parent.get(names::REFRESH_CERTIFICATES).is_some() {
                tracing::info!(cluster = %view.name, "automatic certificate refresh started");
            }
            changes
        }
        ParentStep::Roll(rollout) if view.kind == ParentKind::Cluster => {
            // A Cluster goes through its children; their rollouts start the Machines.
            let machines = covered_machines(parent, view, caches);
            let children = children_of(ctx, parent, caches, planes).await?;
            let input = observe_children(
                operation,
                &view.name,
                &rollout.request_id,
                rollout.max_parallel(view),
                rollout.trigger.is_none(),
                &children,
                &machines,
            );
            let plan = ChainPlan::decide(&input);
            report_progress(ctx, parent, view, operation, &plan.progress());
            chain::changes(&rollout, view, &children, &plan, ctx.settings.retry_base)
        }
        ParentStep::Roll(rollout) => {
            let mut machines = covered_machines(parent, view, caches);
            let (mut plan, starts_control_plane) =
                plan_rollout(ctx, &rollout, view, &machines, None).await;
            // Held until the starts are written, when one is a control-plane Machine.
            let mut _control_plane_guard = None;
            if matches!(&plan, RolloutPlan::Continue { start, .. } if !start.is_empty()) {
                // Of this parent's two operations, the older request runs first. (A Cluster's
                // request touches no Machine; its children's requests do.)
                let blocked = blocked_by(operation, view, &rollout.request_id, &[view]);
                if starts_control_plane {
                    // Decided again on the Machines as the API server has them now, with no
                    // other pass starting a control-plane Machine meanwhile.
                    _control_plane_guard = Some(ctx.control_plane_starts.lock().await);
                    machines = fresh_covered_machines(ctx, parent, view).await?;
                    plan = plan_rollout(ctx, &rollout, view, &machines, blocked)
                        .await
                        .0;
                } else if blocked.is_some() {
                    plan = plan_rollout(ctx, &rollout, view, &machines, blocked)
                        .await
                        .0;
                }
            }
            report_progress(ctx, parent, view, operation, &plan.progress());
            let changes = rollout.changes(view, &machines, &plan, ctx.settings.retry_base);
            return apply(ctx, parent, view.kind, changes).await;
        }
    };
    apply(ctx, parent, view.kind, changes).await
}

/// The parent's rollout progress, as a metric.
fn report_progress(
    ctx: &Context,
    parent: &DynamicObject,
    view: &ParentView,
    operation: Operation,
    progress: &Progress,
) {
    ctx.metrics.set_rollout_progress(
        &view.kind.api_resource().kind,
        &parent.namespace().unwrap_or_default(),
        &view.name,
        operation.metric_label(),
        progress.by_state(),
    );
}

/// The status the parent's annotation shows for `operation`, as a metric.
fn report_status(ctx: &Context, parent: &DynamicObject, view: &ParentView, operation: Operation) {
    ctx.metrics.set_rollout_status(
        &view.kind.api_resource().kind,
        &parent.namespace().unwrap_or_default(),
        &view.name,
        operation.metric_label(),
        view.annotation(operation.names().status),
    );
}

/// A Cluster's children: its control plane (when it is a CK8sControlPlane), then its
/// MachineDeployments in name order.
async fn children_of(
    ctx: &Context,
    parent: &DynamicObject,
    caches: &Caches,
    planes: &Planes,
) -> Result<Vec<ParentView>, Error> {
    let mut children = Vec::new();
    let namespace = parent.namespace().unwrap_or_default();
    if let Some(reference) = machine::ObjectRef::control_plane_of(parent)
        && reference.group == caretaker_api::cluster_api::CONTROL_PLANE_GROUP
    {
        let resource = ParentKind::ControlPlane.api_resource();
        let key = ObjectRef::new_with(&reference.name, resource.clone()).within(&namespace);
        let cached = planes.as_ref().and_then(|stores| stores.planes.get(&key));
        // Not in the cache (not listed yet, or just created): ask, rather than skip the
        // control plane and start on the workers.
        let plane = match cached {
            Some(plane) => Some(plane),
            None => ctx
                .api(&namespace, &resource)
                .get_opt(&reference.name)
                .await?
                .map(Arc::new),
        };
        if let Some(plane) = plane {
            children.push(observe_parent(ParentKind::ControlPlane, &plane, caches));
        }
    }
    // Which MachineDeployments: the shared cache (listed before any pass); each as the store
    // of the watch that wakes the Cluster has it, when it has it.
    let mut deployments: Vec<ParentView> = caches
        .deployments_of(parent)
        .iter()
        .map(|d| {
            let key =
                ObjectRef::from_obj_with(d.as_ref(), ParentKind::MachineDeployment.api_resource());
            let newest = planes
                .as_ref()
                .and_then(|stores| stores.deployments.get(&key))
                .unwrap_or_else(|| d.clone());
            observe_parent(ParentKind::MachineDeployment, &newest, caches)
        })
        .collect();
    deployments.sort_by(|a, b| a.name.cmp(&b.name));
    children.extend(deployments);
    Ok(children)
}

/// The Machines the parent covers, read from the API server rather than the cache.
async fn fresh_covered_machines(
    ctx: &Context,
    parent: &DynamicObject,
    view: &ParentView,
) -> Result<Vec<Arc<MachineView>>, Error> {
    let namespace = parent.namespace().unwrap_or_default();
    let list = ctx
        .api(
            &namespace,
            &caretaker_api::cluster_api::machine_api_resource(),
        )
        .list(&kube::api::ListParams::default())
        .await?;
    Ok(list
        .items
        .iter()
        .map(MachineView::from_object)
        .filter(|m| view.kind.covers(&view.name, m))
        .map(Arc::new)
        .collect())
}

/// The parent as a pass sees it: for a Cluster, with the limits of its MachineDeployments.
fn observe_parent(kind: ParentKind, parent: &DynamicObject, caches: &Caches) -> ParentView {
    let deployment_limits = match kind {
        ParentKind::Cluster => caches
            .deployments_of(parent)
            .iter()
            .filter_map(|d| {
                let limit = d.annotations().get(names::MAX_PARALLEL)?;
                Some((d.name_any(), limit.clone()))
            })
            .collect(),
        ParentKind::ControlPlane | ParentKind::MachineDeployment => Default::default(),
    };
    ParentView {
        kind,
        name: parent.name_any(),
        annotations: parent.annotations().clone(),
        deployment_limits,
        resource_version: parent.metadata.resource_version.clone(),
        progress_age: None,
        cluster: cluster_name_of(parent),
    }
}

/// `Kind/namespace/name`: how the context remembers what this process wrote on a parent.
fn parent_key(kind: ParentKind, parent: &DynamicObject) -> String {
    format!(
        "{}/{}/{}",
        kind.api_resource().kind,
        parent.namespace().unwrap_or_default(),
        parent.name_any()
    )
}

/// The cached Machines the parent covers.
fn covered_machines(
    parent: &DynamicObject,
    view: &ParentView,
    caches: &Caches,
) -> Vec<Arc<MachineView>> {
    let mut machines = caches.machines_in(parent.metadata.namespace.as_deref().unwrap_or_default());
    machines.retain(|m| view.kind.covers(&view.name, m));
    machines
}

/// The plan for a running request, and whether it starts a control-plane Machine. Agents are
/// asked for their health only when a control-plane Machine would start: the checks cost a TLS
/// handshake each, and only that step is gated on them.
async fn plan_rollout(
    ctx: &Context,
    rollout: &Rollout,
    parent: &ParentView,
    machines: &[Arc<MachineView>],
    blocked_by: Option<String>,
) -> (RolloutPlan, bool) {
    // A Machine this process works on is busy, whatever its annotations say.
    let running = ctx.work_running_now();
    let working_here = |op: Operation, m: &MachineView| running.contains(op, m);
    let mut input = rollout.input(parent, machines, &working_here);
    input.blocked_by = blocked_by;
    let plan = RolloutPlan::decide(&input);
    if !plan.starts_control_plane(&input) {
        return (plan, false);
    }
    for (observation, m) in input.machines.iter_mut().zip(machines) {
        if m.control_plane && !m.being_deleted {
            observation.agent_healthy = agent_healthy(ctx, m).await;
        }
    }
    let plan = RolloutPlan::decide(&input);
    let starts_control_plane = plan.starts_control_plane(&input);
    (plan, starts_control_plane)
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

/// Carries out a pass: starts the Machines, then writes the parent, then publishes the events.
async fn apply(
    ctx: &Context,
    parent: &DynamicObject,
    kind: ParentKind,
    changes: ParentChanges,
) -> Result<Next, Error> {
    if let Started::Stale(_) = write_starts(&ctx.client, &changes.start).await? {
        // The Machine changed since the cache saw it. Its watch event wakes the parent only
        // if the change matters to parents, so look again shortly either way.
        return Ok(Next::After(STALE_RETRY));
    }
    let namespace = parent.namespace().unwrap_or_default();
    for child in &changes.children {
        let body = child
            .annotations
            .merge_patch(child.resource_version.as_deref());
        match ctx
            .api(&namespace, &child.kind.api_resource())
            .patch(&child.name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => {}
            // The child changed since the pass saw it: its watch event brings a fresh pass.
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Next::After(STALE_RETRY)),
            Err(e) => return Err(e.into()),
        }
    }
    let resource = kind.api_resource();
    if !changes.parent.is_empty() {
        // Written only on the version this pass saw: a pass on a parent the cache has not
        // caught up with (our own last write, a user's edit) must not record a second request
        // or publish its events again; the parent's watch event brings a fresh pass.
        let namespace = parent.namespace().unwrap_or_default();
        let version = parent.metadata.resource_version.as_deref();
        let key = parent_key(kind, parent);
        if version.is_some_and(|v| ctx.parent_written_since(&key, v)) {
            // This process wrote the parent at this version, so it has changed since: the
            // write would be refused (409), as below.
            return Ok(Next::AwaitChange);
        }
        let body = changes.parent.merge_patch(version);
        match ctx
            .api(&namespace, &resource)
            .patch(
                &parent.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&body),
            )
            .await
        {
            Ok(_) => {
                if let Some(version) = version {
                    ctx.parent_written(&key, version);
                }
                if changes.parent.get(names::PROGRESS).is_some() {
                    ctx.progress_written(&key);
                }
            }
            Err(kube::Error::Api(e)) if e.code == 409 => return Ok(Next::AwaitChange),
            Err(e) => return Err(e.into()),
        }
    }
    let reference = parent.object_ref(&resource);
    for event in changes.events {
        ctx.event(&reference, event).await;
    }
    Ok(changes.next)
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

/// Starts `machines` (as a plan observed them) for request `request_id` with trigger value
/// `value`, as a pass does: [`MachineStart::for_request`] written one by one, each on its
/// observed `resourceVersion`. Public so that tests can hand it a view that a lagging cache
/// would hold.
pub async fn start_machines(
    client: &kube::Client,
    operation: Operation,
    value: &str,
    request_id: &str,
    machines: &[&MachineView],
) -> Result<Started, Error> {
    let starts: Vec<MachineStart> = machines
        .iter()
        .map(|m| MachineStart::for_request(operation, value, request_id, m))
        .collect();
    write_starts(client, &starts).await
}

/// Writes the starts in order, each only on the version its plan saw the Machine at (the
/// stale-cache guard), and stops at the first Machine that has changed since: the API server
/// refuses that write with 409 Conflict, and nothing more is written.
async fn write_starts(client: &kube::Client, starts: &[MachineStart]) -> Result<Started, Error> {
    for start in starts {
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &start.namespace,
            &caretaker_api::cluster_api::machine_api_resource(),
        );
        let body = start
            .annotations
            .merge_patch(start.resource_version.as_deref());
        match api
            .patch(
                &start.machine,
                &PatchParams::default(),
                &Patch::Merge(&body),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                return Ok(Started::Stale(start.machine.clone()));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Started::All)
}
