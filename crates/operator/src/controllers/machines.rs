//! The Machine controller: one watch on Cluster API Machines, each reconcile running one pass of
//! each per-Machine capability ([`super::machine_refresh`], [`super::machine_upgrade`]). A pass
//! observes, asks its pure `plan` function what to do, and hands the plan to [`apply_plan`]
//! here; work that calls a node records its end with [`apply_update`].

use std::sync::Arc;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;

use super::cache::MachineChanges;
use super::{machine_refresh, machine_upgrade};
use crate::Error;
use crate::context::Context;
use crate::machine::plan::{MachinePlan, MachineUpdate, Write};
use crate::machine::{self, MachineView};
use crate::names::Operation;
use crate::schedule::{Next, busy_retry};

/// Runs the controller over the shared Machine cache until its stream of changes ends.
pub async fn run(ctx: Arc<Context>, machines: Store<DynamicObject>, changes: MachineChanges) {
    Controller::for_stream_with(changes, machines, machine::api_resource())
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        })
        .await;
}

async fn reconcile(object: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    let view = MachineView::from_object(&object);
    let refresh = machine_refresh::reconcile(&object, &view, &ctx).await?;
    let upgrade = machine_upgrade::reconcile(&object, &view, &ctx).await?;
    Ok(refresh.sooner(upgrade).into())
}

fn error_policy(_machine: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    super::requeue_after("machine", error, &ctx)
}

/// Carries out one pass's plan of `operation` for a Machine: records its update, then starts
/// its work in the background (`run` makes the task), and says when to look again.
pub(super) async fn apply_plan<W, F>(
    ctx: &Arc<Context>,
    object: &DynamicObject,
    view: &MachineView,
    operation: Operation,
    plan: MachinePlan<W>,
    run: impl FnOnce(W) -> F,
) -> Result<Next, Error>
where
    F: Future<Output = ()> + Send + 'static,
{
    apply_update(ctx, object, view, plan.update).await?;
    if let Some(work) = plan.work
        && !ctx.spawn_for(operation, view, run(work))
    {
        // The plan saw none running and a Machine's reconciles never overlap, so this work
        // started in between: look again soon.
        return Ok(Next::After(busy_retry(std::time::Duration::ZERO)));
    }
    Ok(plan.next)
}

/// Writes an update on the Machine, then publishes its event if the write was recorded.
pub(super) async fn apply_update(
    ctx: &Context,
    object: &DynamicObject,
    view: &MachineView,
    update: MachineUpdate,
) -> Result<(), Error> {
    let recorded = match &update.write {
        None => true,
        Some(Write::Patch(changes)) => {
            ctx.patch_annotations(view, changes).await?;
            true
        }
        Some(Write::End {
            trigger,
            worked,
            changes,
        }) => {
            ctx.record_end(view, trigger, worked.as_deref(), changes)
                .await?
        }
    };
    if recorded && let Some(event) = update.event {
        ctx.machine_event(object, event).await;
    }
    Ok(())
}

/// Logs why a call to a node failed; what follows (a wait, a retry, the end) is recorded on the
/// Machine.
pub(super) fn log_failed_call(
    operation: Operation,
    view: &MachineView,
    attempt: u32,
    error: &Error,
) {
    let work = operation.names().work;
    if matches!(error, Error::Agent(e) if e.is_busy()) {
        tracing::info!(machine = %view.name, work, reason = %error, "the agent is busy; waiting");
    } else {
        tracing::warn!(machine = %view.name, work, attempt, error = %error, "a call to the node failed");
    }
}
