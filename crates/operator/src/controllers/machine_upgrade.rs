//! Per-Machine in-place upgrade: carries out [`crate::machine::upgrade::decide`]. The upgrade
//! runs on the node as an agent operation; its id is recorded in
//! `v1beta2.k8sd.io/in-place-upgrade-change-id`, so a restarted operator follows the same
//! operation instead of starting another.

use std::collections::BTreeMap;
use std::sync::Arc;

use caretaker_agent_api::client::AgentError;
use caretaker_agent_api::upgrade::{Operation, OperationState, UpgradeRequest};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{Next, busy, busy_wait_changes, failure_reason, retry_changes};
use crate::Error;
use crate::context::{Context, EventType};
use crate::machine::MachineView;
use crate::machine::refresh::format_time;
use crate::machine::upgrade::{UpgradeStep, decide};
use crate::names::{self, upgrade_state};

/// The upgrade part of a Machine reconcile.
pub async fn reconcile(
    object: &Arc<DynamicObject>,
    view: &MachineView,
    ctx: &Arc<Context>,
) -> Result<Next, Error> {
    let now = OffsetDateTime::now_utc();
    match decide(view, now) {
        UpgradeStep::Idle | UpgradeStep::WaitForNode => Ok(Next::AwaitChange),
        UpgradeStep::Backoff { until } => Ok(Next::at(until, now)),
        UpgradeStep::ForgetEndedRequest => {
            let changes = BTreeMap::from([(upgrade_state::TRIGGER.to_string(), Value::Null)]);
            ctx.patch_annotations(view, changes).await?;
            Ok(Next::AwaitChange)
        }
        UpgradeStep::Reject { trigger, reason } => {
            ctx.patch_annotations(view, failed(&trigger, &reason, now))
                .await?;
            ctx.machine_event(
                object,
                EventType::Warning,
                names::EVENT_UPGRADE_FAILED,
                format!("Machine {}: {reason}", view.name),
            )
            .await;
            Ok(Next::AwaitChange)
        }
        UpgradeStep::Start { trigger } => {
            let mut changes = clear_bookkeeping();
            changes.insert(
                names::IN_PLACE_UPGRADE_STATUS.into(),
                json!(names::STATUS_IN_PROGRESS),
            );
            changes.insert(names::IN_PLACE_UPGRADE_CHANGE_ID.into(), Value::Null);
            changes.insert(upgrade_state::TRIGGER.into(), json!(trigger));
            changes.insert(
                upgrade_state::REQUEST_ID.into(),
                json!(format!("u{:x}", now.unix_timestamp_nanos())),
            );
            changes.insert(upgrade_state::ATTEMPTS.into(), json!("0"));
            changes.insert(upgrade_state::STARTED_AT.into(), json!(format_time(now)));
            ctx.patch_annotations(view, changes).await?;
            let note = format!("upgrading Machine {} in place to {trigger}", view.name);
            ctx.machine_event(
                object,
                EventType::Normal,
                names::EVENT_UPGRADE_IN_PROGRESS,
                note,
            )
            .await;
            Ok(Next::AwaitChange)
        }
        UpgradeStep::Launch {
            release,
            request_id,
            attempt,
        } => {
            let (ctx2, view2, object2) = (ctx.clone(), view.clone(), object.clone());
            let started = ctx.spawn_for("upgrade", view, async move {
                let result = launch(&ctx2, &view2, &release, &request_id).await;
                record(&ctx2, &object2, &view2, attempt, result).await;
            });
            Ok(if started {
                Next::AwaitChange
            } else {
                busy(ctx, "upgrade", view)
            })
        }
        UpgradeStep::Poll { change_id, attempt } => {
            let (ctx2, view2, object2) = (ctx.clone(), view.clone(), object.clone());
            // Busy or not, the next poll comes after the interval.
            let _ = ctx.spawn_for("upgrade", view, async move {
                let result = poll(&ctx2, &view2, &change_id).await;
                record(&ctx2, &object2, &view2, attempt, result).await;
            });
            Ok(Next::After(ctx.settings.upgrade_poll))
        }
        UpgradeStep::Cancel { change_id } => {
            let (ctx2, view2, object2) = (ctx.clone(), view.clone(), object.clone());
            let _ = ctx.spawn_for("upgrade", view, async move {
                if let Err(e) = cancel(&ctx2, &object2, &view2, change_id.as_deref()).await {
                    tracing::warn!(machine = %view2.name, error = %e, "cannot cancel the upgrade yet; will try again");
                }
            });
            // Until the Machine says `cancelled`, look again (the agent may be unreachable).
            Ok(Next::After(ctx.settings.retry_base))
        }
    }
}

/// Stops the node's upgrade operation, then records the cancellation.
async fn cancel(
    ctx: &Context,
    object: &DynamicObject,
    view: &MachineView,
    change_id: Option<&str>,
) -> Result<(), Error> {
    if let Some(change_id) = change_id {
        let agent = ctx.agent_of(view).await?;
        match agent.client.cancel(&agent.url, change_id).await {
            Ok(_) | Err(AgentError::Status { status: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut changes = clear_bookkeeping();
    changes.insert(
        names::IN_PLACE_UPGRADE_STATUS.into(),
        json!(names::STATUS_CANCELLED),
    );
    ctx.patch_annotations(view, changes).await?;
    let note = format!(
        "the in-place upgrade of Machine {} was cancelled: its trigger was removed",
        view.name
    );
    ctx.machine_event(
        object,
        EventType::Normal,
        names::EVENT_UPGRADE_CANCELLED,
        note,
    )
    .await;
    Ok(())
}

/// What an agent call found out.
enum Progress {
    /// The operation was started (or already existed) with this id.
    Launched(Operation),
    /// The operation is still running.
    Running,
    /// The operation ended.
    Ended(Operation),
}

async fn launch(
    ctx: &Context,
    view: &MachineView,
    release: &str,
    request_id: &str,
) -> Result<Progress, Error> {
    let agent = ctx.agent_of(view).await?;
    let request = UpgradeRequest {
        release: release.to_string(),
        request_id: Some(request_id.to_string()),
    };
    let operation = agent.client.start_upgrade(&agent.url, &request).await?;
    Ok(Progress::Launched(operation))
}

async fn poll(ctx: &Context, view: &MachineView, change_id: &str) -> Result<Progress, Error> {
    let agent = ctx.agent_of(view).await?;
    match agent.client.operation(&agent.url, change_id).await {
        Ok(operation) if operation.state == OperationState::Running => Ok(Progress::Running),
        Ok(operation) => Ok(Progress::Ended(operation)),
        Err(AgentError::Status { status: 404, .. }) => Err(Error::Invalid(format!(
            "the agent no longer knows upgrade operation {change_id} (was the node reinstalled?)"
        ))),
        Err(e) => Err(e.into()),
    }
}

/// Writes the outcome of an agent call to the Machine.
async fn record(
    ctx: &Context,
    object: &DynamicObject,
    view: &MachineView,
    attempt: u32,
    result: Result<Progress, Error>,
) {
    let now = OffsetDateTime::now_utc();
    let trigger = view
        .annotation(names::IN_PLACE_UPGRADE_TO)
        .unwrap_or_default()
        .to_string();
    let written = match result {
        Ok(Progress::Running) => Ok(()),
        Ok(Progress::Launched(operation)) => {
            let mut changes = BTreeMap::new();
            changes.insert(
                names::IN_PLACE_UPGRADE_CHANGE_ID.to_string(),
                json!(operation.id),
            );
            changes.insert(upgrade_state::ATTEMPTS.to_string(), json!("0"));
            ctx.patch_annotations(view, changes).await
        }
        Ok(Progress::Ended(operation)) => match operation.state {
            OperationState::Succeeded => {
                let mut changes = clear_bookkeeping();
                changes.insert(names::IN_PLACE_UPGRADE_TO.into(), Value::Null);
                changes.insert(
                    names::IN_PLACE_UPGRADE_STATUS.into(),
                    json!(names::STATUS_DONE),
                );
                changes.insert(
                    names::IN_PLACE_UPGRADE_RELEASE.into(),
                    json!(operation.release),
                );
                let note = format!("Machine {} now runs {}", view.name, operation.release);
                let worked = view.annotation(names::IN_PLACE_UPGRADE_TO);
                let recorded = ctx
                    .record_end(view, names::IN_PLACE_UPGRADE_TO, worked, changes)
                    .await;
                if let Ok(true) = recorded {
                    ctx.machine_event(object, EventType::Normal, names::EVENT_UPGRADE_DONE, note)
                        .await;
                }
                recorded.map(|_| ())
            }
            OperationState::Cancelled => {
                let mut changes = clear_bookkeeping();
                changes.insert(
                    names::IN_PLACE_UPGRADE_STATUS.into(),
                    json!(names::STATUS_CANCELLED),
                );
                let patched = ctx.patch_annotations(view, changes).await;
                if patched.is_ok() {
                    let note = format!(
                        "the in-place upgrade of Machine {} was cancelled on the node",
                        view.name
                    );
                    ctx.machine_event(
                        object,
                        EventType::Normal,
                        names::EVENT_UPGRADE_CANCELLED,
                        note,
                    )
                    .await;
                }
                patched
            }
            OperationState::Failed | OperationState::Running => {
                let last_line = operation
                    .output_tail
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .to_string();
                let reason = format!(
                    "Machine {}: upgrade to {} failed: {}{}",
                    view.name,
                    operation.release,
                    operation.message.unwrap_or_else(|| "unknown".into()),
                    if last_line.is_empty() {
                        String::new()
                    } else {
                        format!(" ({last_line})")
                    }
                );
                fail(ctx, object, view, &trigger, &reason, now).await
            }
        },
        // Another upgrade runs on the node: wait for it, as for a busy refresh step. Not an
        // attempt, and never a failure of this Machine.
        Err(Error::Agent(e)) if e.is_busy() => {
            tracing::info!(machine = %view.name, reason = %e, "the agent is busy; waiting");
            let started_at = view.annotation(upgrade_state::STARTED_AT);
            let changes = busy_wait_changes(upgrade_state::RETRY, started_at, &e.to_string());
            ctx.patch_annotations(view, changes).await
        }
        Err(e) if e.is_transient() && attempt < ctx.settings.max_attempts => {
            tracing::warn!(machine = %view.name, attempt, error = %e, "upgrade step failed; will retry");
            let changes = retry_changes(upgrade_state::RETRY, attempt, ctx.settings.retry_base, &e);
            ctx.patch_annotations(view, changes).await
        }
        Err(e) => {
            let reason = failure_reason(&view.name, attempt, &e);
            fail(ctx, object, view, &trigger, &reason, now).await
        }
    };
    if let Err(e) = written {
        tracing::warn!(machine = %view.name, error = %e, "cannot record the upgrade's progress; it is read again on the next reconcile");
    }
}

async fn fail(
    ctx: &Context,
    object: &DynamicObject,
    view: &MachineView,
    trigger: &str,
    reason: &str,
    now: OffsetDateTime,
) -> Result<(), Error> {
    let worked = Some(trigger).filter(|t| !t.is_empty());
    let changes = failed(trigger, reason, now);
    let recorded = ctx
        .record_end(view, names::IN_PLACE_UPGRADE_TO, worked, changes)
        .await;
    if let Ok(true) = recorded {
        ctx.machine_event(
            object,
            EventType::Warning,
            names::EVENT_UPGRADE_FAILED,
            reason.to_string(),
        )
        .await;
    }
    recorded.map(|_| ())
}

fn clear_bookkeeping() -> BTreeMap<String, Value> {
    upgrade_state::ALL
        .iter()
        .map(|k| (k.to_string(), Value::Null))
        .collect()
}

fn failed(trigger: &str, reason: &str, now: OffsetDateTime) -> BTreeMap<String, Value> {
    let mut changes = clear_bookkeeping();
    changes.insert(
        names::IN_PLACE_UPGRADE_STATUS.into(),
        json!(names::STATUS_FAILED),
    );
    changes.insert(
        names::IN_PLACE_UPGRADE_LAST_FAILED_ATTEMPT_AT.into(),
        json!(format_time(now)),
    );
    changes.insert(upgrade_state::TRIGGER.into(), json!(trigger));
    changes.insert(upgrade_state::LAST_ERROR.into(), json!(reason));
    changes
}
