//! The per-Machine in-place upgrade, as pure decisions: [`decide`] reads where a Machine's
//! request stands, [`plan`] turns that into one pass's [`MachinePlan`], and
//! [`after_agent_call`] and [`cancelled`] into what the node's answers record. The upgrade runs
//! on the node as an agent operation whose id is recorded in
//! `v1beta2.k8sd.io/in-place-upgrade-change-id`, so a restarted operator follows the same
//! operation instead of starting another.

use caretaker_agent_api::upgrade::{Operation as NodeOperation, OperationState, ReleaseOption};
use time::OffsetDateTime;

use super::MachineView;
use super::plan::{
    MachinePlan, MachineUpdate, Observed, after_error, cleared, done, end_failed, failed,
    forget_ended, started,
};
use crate::changes::{AnnotationChanges, Event};
use crate::schedule::Next;
use crate::timestamp::parse_time;
use crate::{Error, Settings};
use caretaker_api::names::{self, Operation, upgrade_state};

const UPGRADE: Operation = Operation::InPlaceUpgrade;

/// Calls to the agent the controller makes in the background for an upgrade.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeWork {
    /// Start the upgrade (idempotent by `request_id`).
    Launch {
        release: String,
        request_id: String,
        attempt: u32,
    },
    /// Read the state of operation `change_id`.
    Poll { change_id: String, attempt: u32 },
    /// Stop the operation, if there is one, then record the cancellation ([`cancelled`]).
    Cancel { change_id: Option<String> },
}

/// One pass of the upgrade of the observed Machine, its steps in the order a request takes
/// them.
pub fn plan(seen: &Observed, settings: &Settings) -> MachinePlan<UpgradeWork> {
    let (machine, now, running) = (seen.machine, seen.now, seen.running);
    match decide(machine, now) {
        UpgradeStep::Start { trigger } => {
            let mut changes = started(UPGRADE, &trigger, now);
            changes.remove(names::IN_PLACE_UPGRADE_CHANGE_ID).set(
                upgrade_state::REQUEST_ID,
                format!("u{:x}", now.unix_timestamp_nanos()),
            );
            let note = format!("upgrading Machine {} in place to {trigger}", machine.name);
            MachinePlan::record(
                MachineUpdate::patch(changes)
                    .telling(Event::normal(names::EVENT_UPGRADE_IN_PROGRESS, note)),
            )
        }
        UpgradeStep::Launch {
            release,
            request_id,
            attempt,
        } => {
            let launch = UpgradeWork::Launch {
                release,
                request_id,
                attempt,
            };
            MachinePlan::await_work(launch, running)
        }
        // Agents cannot notify: the operation is read again after the interval, running or not.
        UpgradeStep::Poll { change_id, attempt } => MachinePlan::poll_work(
            UpgradeWork::Poll { change_id, attempt },
            settings.upgrade_poll,
            running,
        ),
        // Until the Machine says `cancelled`, look again (the agent may be unreachable).
        UpgradeStep::Cancel { change_id } => MachinePlan::poll_work(
            UpgradeWork::Cancel { change_id },
            settings.retry_base,
            running,
        ),
        UpgradeStep::Reject { trigger, reason } => {
            let note = format!("Machine {}: {reason}", machine.name);
            MachinePlan::record(
                MachineUpdate::patch(failed(UPGRADE, &trigger, &reason, now))
                    .telling(Event::warning(names::EVENT_UPGRADE_FAILED, note)),
            )
        }
        UpgradeStep::ForgetEndedRequest => MachinePlan::record(forget_ended(UPGRADE)),
        UpgradeStep::Backoff { until } => MachinePlan::wait(Next::at(until, now)),
        UpgradeStep::Idle | UpgradeStep::WaitForNode => MachinePlan::wait(Next::AwaitChange),
    }
}

/// What a call to the agent found out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentAnswer {
    /// The operation was started (or already existed).
    Launched(NodeOperation),
    /// The operation is still running.
    Running,
    /// The operation ended.
    Ended(NodeOperation),
}

/// What to record once a call to the agent for attempt number `attempt` answered.
pub fn after_agent_call(
    machine: &MachineView,
    attempt: u32,
    answer: Result<AgentAnswer, Error>,
    now: OffsetDateTime,
    settings: &Settings,
) -> MachineUpdate {
    let operation = match answer {
        Ok(AgentAnswer::Running) => return MachineUpdate::default(),
        Ok(AgentAnswer::Launched(operation)) => {
            let mut changes = AnnotationChanges::default();
            changes
                .set(names::IN_PLACE_UPGRADE_CHANGE_ID, operation.id)
                .set(upgrade_state::ATTEMPTS, "0");
            return MachineUpdate::patch(changes);
        }
        Ok(AgentAnswer::Ended(operation)) => operation,
        // Another upgrade running on the node is waited for, never a failure of this Machine.
        Err(e) => return after_error(UPGRADE, machine, attempt, &e, now, settings),
    };
    match operation.state {
        OperationState::Succeeded => {
            let mut changes = done(UPGRADE);
            changes.set(names::IN_PLACE_UPGRADE_RELEASE, operation.release.as_str());
            let note = format!("Machine {} now runs {}", machine.name, operation.release);
            MachineUpdate::end(
                UPGRADE,
                machine.annotation(names::IN_PLACE_UPGRADE_TO),
                changes,
            )
            .telling(Event::normal(names::EVENT_UPGRADE_DONE, note))
        }
        OperationState::Cancelled => {
            let note = format!(
                "the in-place upgrade of Machine {} was cancelled on the node",
                machine.name
            );
            MachineUpdate::patch(cancelled_changes())
                .telling(Event::normal(names::EVENT_UPGRADE_CANCELLED, note))
        }
        OperationState::Failed | OperationState::Running => {
            let last_line = operation.output_tail.lines().last().unwrap_or_default();
            let reason = format!(
                "Machine {}: upgrade to {} failed: {}{}",
                machine.name,
                operation.release,
                operation.message.as_deref().unwrap_or("unknown"),
                if last_line.is_empty() {
                    String::new()
                } else {
                    format!(" ({last_line})")
                }
            );
            let trigger = machine
                .annotation(names::IN_PLACE_UPGRADE_TO)
                .unwrap_or_default();
            end_failed(UPGRADE, trigger, &reason, now)
        }
    }
}

/// The trigger was removed while the upgrade ran, and the node's operation is stopped.
pub fn cancelled(machine: &MachineView) -> MachineUpdate {
    let note = format!(
        "the in-place upgrade of Machine {} was cancelled: its trigger was removed",
        machine.name
    );
    MachineUpdate::patch(cancelled_changes())
        .telling(Event::normal(names::EVENT_UPGRADE_CANCELLED, note))
}

fn cancelled_changes() -> AnnotationChanges {
    let mut changes = cleared(UPGRADE);
    changes.set(names::IN_PLACE_UPGRADE_STATUS, names::STATUS_CANCELLED);
    changes
}

/// Where a Machine's upgrade request stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeStep {
    Idle,
    WaitForNode,
    /// The option is not one of the upstream forms: fail at once.
    Reject {
        trigger: String,
        reason: String,
    },
    /// A new request: mark it in progress.
    Start {
        trigger: String,
    },
    /// Ask the agent to start the upgrade (idempotent by `request_id`).
    Launch {
        release: String,
        request_id: String,
        attempt: u32,
    },
    /// The upgrade runs on the node as operation `change_id`: read its state.
    Poll {
        change_id: String,
        attempt: u32,
    },
    /// The trigger was removed while the upgrade ran: cancel it.
    Cancel {
        change_id: Option<String>,
    },
    /// The last agent call failed; try again at `until`.
    Backoff {
        until: OffsetDateTime,
    },
    /// The trigger of a failed or cancelled request was removed: forget which value that
    /// request was for, so that setting the trigger again, even to the same value, is new.
    ForgetEndedRequest,
}

/// Decides the next step for `machine` at `now`.
pub fn decide(machine: &MachineView, now: OffsetDateTime) -> UpgradeStep {
    let status = machine.annotation(names::IN_PLACE_UPGRADE_STATUS);
    let change_id = machine
        .annotation(names::IN_PLACE_UPGRADE_CHANGE_ID)
        .map(str::to_string);
    let Some(trigger) = machine.annotation(names::IN_PLACE_UPGRADE_TO) else {
        // `kubectl annotate --overwrite` with the same value changes nothing, so removing the
        // trigger and adding it again is how an ended request is retried.
        let ended = matches!(
            status,
            Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED)
        );
        return match status {
            Some(names::STATUS_IN_PROGRESS) => UpgradeStep::Cancel { change_id },
            _ if ended
                && machine.annotation(upgrade_state::TRIGGER).is_some()
                && !machine.being_deleted =>
            {
                UpgradeStep::ForgetEndedRequest
            }
            _ => UpgradeStep::Idle,
        };
    };
    if machine.being_deleted {
        return UpgradeStep::Idle;
    }
    let same_request = machine.annotation(upgrade_state::TRIGGER) == Some(trigger);
    if let Err(e) = ReleaseOption::parse(trigger) {
        return if same_request && status == Some(names::STATUS_FAILED) {
            UpgradeStep::Idle
        } else {
            UpgradeStep::Reject {
                trigger: trigger.to_string(),
                reason: e.to_string(),
            }
        };
    }
    match status {
        Some(names::STATUS_IN_PROGRESS) if same_request => {
            if let Some(until) =
                parse_time(machine.annotation(upgrade_state::RETRY_AT)).filter(|t| *t > now)
            {
                return UpgradeStep::Backoff { until };
            }
            let failed: u32 = machine
                .annotation(upgrade_state::ATTEMPTS)
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            match (change_id, machine.annotation(upgrade_state::REQUEST_ID)) {
                (Some(change_id), _) => UpgradeStep::Poll {
                    change_id,
                    attempt: failed + 1,
                },
                (None, Some(request_id)) => UpgradeStep::Launch {
                    release: trigger.to_string(),
                    request_id: request_id.to_string(),
                    attempt: failed + 1,
                },
                (None, None) => UpgradeStep::Start {
                    trigger: trigger.to_string(),
                },
            }
        }
        Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED) if same_request => {
            UpgradeStep::Idle
        }
        _ if machine.node_name.is_none() => UpgradeStep::WaitForNode,
        _ => UpgradeStep::Start {
            trigger: trigger.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::test_machine as machine;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-01-01 12:00 UTC);

    const TO: &str = names::IN_PLACE_UPGRADE_TO;
    const STATUS: &str = names::IN_PLACE_UPGRADE_STATUS;

    #[test]
    fn a_trigger_starts_and_bad_options_are_rejected() {
        assert_eq!(decide(&machine(&[]), NOW), UpgradeStep::Idle);
        assert_eq!(
            decide(&machine(&[(TO, "channel=1.33/stable")]), NOW),
            UpgradeStep::Start {
                trigger: "channel=1.33/stable".into()
            }
        );
        match decide(&machine(&[(TO, "1.33")]), NOW) {
            UpgradeStep::Reject { reason, .. } => {
                assert!(reason.contains("channel=<channel>"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        let rejected = [
            (TO, "1.33"),
            (STATUS, names::STATUS_FAILED),
            (upgrade_state::TRIGGER, "1.33"),
        ];
        assert_eq!(decide(&machine(&rejected), NOW), UpgradeStep::Idle);
    }

    #[test]
    fn in_progress_launches_then_polls_and_removal_cancels() {
        let mut a = vec![
            (TO, "revision=5"),
            (STATUS, names::STATUS_IN_PROGRESS),
            (upgrade_state::TRIGGER, "revision=5"),
            (upgrade_state::REQUEST_ID, "req-1"),
        ];
        assert_eq!(
            decide(&machine(&a), NOW),
            UpgradeStep::Launch {
                release: "revision=5".into(),
                request_id: "req-1".into(),
                attempt: 1
            }
        );
        a.push((names::IN_PLACE_UPGRADE_CHANGE_ID, "op-1"));
        assert_eq!(
            decide(&machine(&a), NOW),
            UpgradeStep::Poll {
                change_id: "op-1".into(),
                attempt: 1
            }
        );
        let without_trigger: Vec<_> = a.iter().copied().filter(|(k, _)| *k != TO).collect();
        assert_eq!(
            decide(&machine(&without_trigger), NOW),
            UpgradeStep::Cancel {
                change_id: Some("op-1".into())
            }
        );
        a.push((upgrade_state::RETRY_AT, "2026-01-01T12:00:30Z"));
        assert_eq!(
            decide(&machine(&a), NOW),
            UpgradeStep::Backoff {
                until: datetime!(2026-01-01 12:00:30 UTC)
            }
        );
    }

    #[test]
    fn ended_requests_stay_ended_until_the_trigger_changes() {
        for status in [names::STATUS_FAILED, names::STATUS_CANCELLED] {
            let ended = [
                (TO, "revision=5"),
                (STATUS, status),
                (upgrade_state::TRIGGER, "revision=5"),
            ];
            assert_eq!(decide(&machine(&ended), NOW), UpgradeStep::Idle);
            let changed = [
                (TO, "revision=6"),
                (STATUS, status),
                (upgrade_state::TRIGGER, "revision=5"),
            ];
            assert_eq!(
                decide(&machine(&changed), NOW),
                UpgradeStep::Start {
                    trigger: "revision=6".into()
                }
            );
        }
        let mut nodeless = machine(&[(TO, "revision=5")]);
        nodeless.node_name = None;
        assert_eq!(decide(&nodeless, NOW), UpgradeStep::WaitForNode);
    }

    #[test]
    fn removing_the_trigger_of_an_ended_request_lets_the_same_value_start_anew() {
        for status in [names::STATUS_FAILED, names::STATUS_CANCELLED] {
            let removed = [(STATUS, status), (upgrade_state::TRIGGER, "revision=5")];
            assert_eq!(
                decide(&machine(&removed), NOW),
                UpgradeStep::ForgetEndedRequest,
                "{status}"
            );
            let again = [(STATUS, status), (TO, "revision=5")];
            assert_eq!(
                decide(&machine(&again), NOW),
                UpgradeStep::Start {
                    trigger: "revision=5".into()
                },
                "{status}"
            );
            let mut leaving = machine(&removed);
            leaving.being_deleted = true;
            assert_eq!(decide(&leaving, NOW), UpgradeStep::Idle);
        }
        let done = [(STATUS, names::STATUS_DONE)];
        assert_eq!(decide(&machine(&done), NOW), UpgradeStep::Idle);
    }

    use std::time::Duration;

    fn node_operation(state: OperationState) -> NodeOperation {
        NodeOperation {
            id: "op-1".into(),
            release: "revision=5".into(),
            request_id: Some("u1".into()),
            state,
            exit_code: None,
            message: Some("exit status 1".into()),
            output_tail: "fetching\nno space left on device\n".into(),
            started_at: NOW,
            finished_at: None,
        }
    }

    fn launching() -> MachineView {
        machine(&[
            (TO, "revision=5"),
            (STATUS, names::STATUS_IN_PROGRESS),
            (upgrade_state::TRIGGER, "revision=5"),
            (upgrade_state::REQUEST_ID, "u1"),
        ])
    }

    #[test]
    fn each_step_plans_its_write_work_and_next_look() {
        let settings = Settings::default();
        let plan = |machine: &MachineView, running| {
            let seen = Observed {
                machine,
                now: NOW,
                running,
            };
            super::plan(&seen, &settings)
        };
        let busy = Some(Duration::from_secs(1));

        let start = plan(&machine(&[(TO, "revision=5")]), None);
        let changes = start.update.patched();
        assert_eq!(changes.get(STATUS), Some(Some(names::STATUS_IN_PROGRESS)));
        assert_eq!(changes.get(names::IN_PLACE_UPGRADE_CHANGE_ID), Some(None));
        let request_id = format!("u{:x}", NOW.unix_timestamp_nanos());
        assert_eq!(
            changes.get(upgrade_state::REQUEST_ID),
            Some(Some(request_id.as_str()))
        );
        assert_eq!(
            start.update.event.as_ref().unwrap().reason,
            names::EVENT_UPGRADE_IN_PROGRESS
        );
        assert_eq!((start.work, start.next), (None, Next::AwaitChange));

        let launch = plan(&launching(), None);
        assert_eq!(
            launch.work,
            Some(UpgradeWork::Launch {
                release: "revision=5".into(),
                request_id: "u1".into(),
                attempt: 1
            })
        );
        assert_eq!(launch.next, Next::AwaitChange);
        assert_eq!(
            plan(&launching(), busy),
            MachinePlan::wait(Next::After(Duration::from_millis(500)))
        );

        let mut polling = launching();
        polling
            .annotations
            .insert(names::IN_PLACE_UPGRADE_CHANGE_ID.into(), "op-1".into());
        let poll = plan(&polling, None);
        assert!(matches!(poll.work, Some(UpgradeWork::Poll { .. })));
        assert_eq!(poll.next, Next::After(settings.upgrade_poll));
        assert_eq!(
            plan(&polling, busy),
            MachinePlan::wait(Next::After(settings.upgrade_poll))
        );

        polling.annotations.remove(TO);
        let cancel = plan(&polling, None);
        assert_eq!(
            cancel.work,
            Some(UpgradeWork::Cancel {
                change_id: Some("op-1".into())
            })
        );
        assert_eq!(cancel.next, Next::After(settings.retry_base));

        let rejected = plan(&machine(&[(TO, "1.33")]), None);
        let changes = rejected.update.patched();
        assert_eq!(changes.get(STATUS), Some(Some(names::STATUS_FAILED)));
        assert_eq!(
            changes.get(names::IN_PLACE_UPGRADE_LAST_FAILED_ATTEMPT_AT),
            Some(Some("2026-01-01T12:00:00Z"))
        );
        assert!(
            rejected
                .update
                .event
                .unwrap()
                .note
                .starts_with("Machine m: ")
        );
    }

    #[test]
    fn the_agents_answers_are_recorded() {
        let settings = Settings::default();
        let m = launching();
        let answer = |a| after_agent_call(&m, 1, Ok(a), NOW, &settings);

        assert_eq!(answer(AgentAnswer::Running), MachineUpdate::default());
        let launched = answer(AgentAnswer::Launched(node_operation(
            OperationState::Running,
        )));
        let mut expected = AnnotationChanges::default();
        expected
            .set(names::IN_PLACE_UPGRADE_CHANGE_ID, "op-1")
            .set(upgrade_state::ATTEMPTS, "0");
        assert_eq!(launched, MachineUpdate::patch(expected));

        let done = answer(AgentAnswer::Ended(node_operation(
            OperationState::Succeeded,
        )));
        let (worked, changes) = done.ended();
        assert_eq!(worked, Some("revision=5"));
        assert_eq!(changes.get(TO), Some(None));
        assert_eq!(
            changes.get(names::IN_PLACE_UPGRADE_RELEASE),
            Some(Some("revision=5"))
        );
        assert_eq!(
            done.event,
            Some(Event::normal(
                names::EVENT_UPGRADE_DONE,
                "Machine m now runs revision=5"
            ))
        );

        let failed = answer(AgentAnswer::Ended(node_operation(OperationState::Failed)));
        failed.ended();
        assert_eq!(
            failed.event.unwrap().note,
            "Machine m: upgrade to revision=5 failed: exit status 1 (no space left on device)"
        );

        let cancelled_on_node = answer(AgentAnswer::Ended(node_operation(
            OperationState::Cancelled,
        )));
        let changes = cancelled_on_node.patched();
        assert_eq!(changes.get(STATUS), Some(Some(names::STATUS_CANCELLED)));
        assert_eq!(changes.get(upgrade_state::REQUEST_ID), Some(None));
        assert_eq!(
            cancelled_on_node.event.unwrap().reason,
            names::EVENT_UPGRADE_CANCELLED
        );
        assert_eq!(cancelled(&m).write, cancelled_on_node.write);
    }
}
