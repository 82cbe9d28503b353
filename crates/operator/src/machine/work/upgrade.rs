//! Per-Machine in-place upgrade: the calls to the agent a pass ([`upgrade::plan`]) starts in
//! the background; each records what [`upgrade::after_agent_call`] (or [`upgrade::cancelled`])
//! decides.

use caretaker_agent_api::client::AgentError;
use caretaker_agent_api::upgrade::{OperationState, UpgradeRequest};
use time::OffsetDateTime;

use crate::Error;
use crate::context::Context;
use crate::machine::MachineView;
use crate::machine::handle::{MachineHandle, log_failed_call};
use crate::machine::upgrade::{self, AgentAnswer, UpgradeWork};
use caretaker_api::names::Operation;

const UPGRADE: Operation = Operation::InPlaceUpgrade;

/// Makes one call to the Machine's agent, as a pass's work in the background, and records what
/// it found out.
pub(in crate::machine) async fn run(machine: MachineHandle, work: UpgradeWork) {
    let (ctx, view) = (&machine.ctx, &machine.view);
    let (attempt, answer) = match work {
        UpgradeWork::Launch {
            release,
            request_id,
            attempt,
        } => (attempt, launch(ctx, view, release, request_id).await),
        UpgradeWork::Poll { change_id, attempt } => (attempt, poll(ctx, view, &change_id).await),
        UpgradeWork::Cancel { change_id } => {
            let result = match cancel(ctx, view, change_id.as_deref()).await {
                Ok(()) => machine.record(upgrade::cancelled(view)).await,
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
    if let Err(e) = machine.record(update).await {
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
