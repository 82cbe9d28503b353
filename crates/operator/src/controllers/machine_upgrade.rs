//! Per-Machine in-place upgrade: the kube-rs glue. A pass asks [`upgrade::plan`] what to do and
//! [`apply_plan`] carries it out; the calls to the agent run in the background and record what
//! [`upgrade::after_agent_call`] (or [`upgrade::cancelled`]) decides.

use std::sync::Arc;

use caretaker_agent::api::AgentError;
use caretaker_agent::upgrade::{OperationState, UpgradeRequest};
use kube::api::DynamicObject;
use time::OffsetDateTime;

use super::machines::{apply_plan, apply_update, log_failed_call};
use crate::Error;
use crate::context::Context;
use crate::machine::MachineView;
use crate::machine::upgrade::{self, AgentAnswer, UpgradeWork};
use crate::names::Operation;
use crate::schedule::Next;

const UPGRADE: Operation = Operation::InPlaceUpgrade;

/// The upgrade part of a Machine reconcile.
pub async fn reconcile(
    object: &Arc<DynamicObject>,
    view: &MachineView,
    ctx: &Arc<Context>,
) -> Result<Next, Error> {
    let running = ctx.running_for(UPGRADE, view);
    let plan = upgrade::plan(view, OffsetDateTime::now_utc(), running, &ctx.settings);
    let (task_ctx, task_object, task_view) = (ctx.clone(), object.clone(), view.clone());
    apply_plan(ctx, object, view, UPGRADE, plan, move |work| async move {
        call_agent(&task_ctx, &task_object, &task_view, work).await
    })
    .await
}

/// Makes one call to the Machine's agent and records what it found out.
async fn call_agent(ctx: &Context, object: &DynamicObject, view: &MachineView, work: UpgradeWork) {
    let (attempt, answer) = match work {
        UpgradeWork::Launch {
            release,
            request_id,
            attempt,
        } => (attempt, launch(ctx, view, release, request_id).await),
        UpgradeWork::Poll { change_id, attempt } => (attempt, poll(ctx, view, &change_id).await),
        UpgradeWork::Cancel { change_id } => {
            let result = match cancel(ctx, view, change_id.as_deref()).await {
                Ok(()) => apply_update(ctx, object, view, upgrade::cancelled(view)).await,
                Err(e) => Err(e),
            };
            if let Err(e) = result {
                tracing::warn!(machine = %view.name, error = %e, "cannot cancel the upgrade yet; will try again");
            }
            return;
        }
    };
    if let Err(e) = &answer {
        log_failed_call(UPGRADE, view, attempt, e);
    }
    let now = OffsetDateTime::now_utc();
    let update = upgrade::after_agent_call(view, attempt, answer, now, &ctx.settings);
    if let Err(e) = apply_update(ctx, object, view, update).await {
        tracing::warn!(machine = %view.name, error = %e, "cannot record the upgrade's progress; it is read again on the next reconcile");
    }
}

async fn launch(
    ctx: &Context,
    view: &MachineView,
    release: String,
    request_id: String,
) -> Result<AgentAnswer, Error> {
    let agent = ctx.agent_of(view).await?;
    let request = UpgradeRequest {
        release,
        request_id: Some(request_id),
    };
    let operation = agent.client.start_upgrade(&agent.url, &request).await?;
    Ok(AgentAnswer::Launched(operation))
}

async fn poll(ctx: &Context, view: &MachineView, change_id: &str) -> Result<AgentAnswer, Error> {
    let agent = ctx.agent_of(view).await?;
    match agent.client.operation(&agent.url, change_id).await {
        Ok(operation) if operation.state == OperationState::Running => Ok(AgentAnswer::Running),
        Ok(operation) => Ok(AgentAnswer::Ended(operation)),
        Err(AgentError::Status { status: 404, .. }) => Err(Error::UpgradeOperationLost {
            change_id: change_id.to_string(),
        }),
        Err(e) => Err(e.into()),
    }
}

/// Stops the node's upgrade operation, if there is one (one the agent no longer knows is
/// stopped).
async fn cancel(ctx: &Context, view: &MachineView, change_id: Option<&str>) -> Result<(), Error> {
    let Some(change_id) = change_id else {
        return Ok(());
    };
    let agent = ctx.agent_of(view).await?;
    match agent.client.cancel(&agent.url, change_id).await {
        Ok(_) | Err(AgentError::Status { status: 404, .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
