//! The per-Machine in-place upgrade, as a pure decision from a Machine's annotations to the next
//! step.

use caretaker_agent_api::upgrade::ReleaseOption;
use time::OffsetDateTime;

use super::MachineView;
use super::refresh::parse_time;
use crate::names::{self, upgrade_state};

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
}
