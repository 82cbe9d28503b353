//! The per-Machine certificate refresh, as a pure decision from a Machine's annotations to the
//! next step. The controller carries the step out; nothing here talks to anything.

use caretaker_pki::Ttl;
use time::OffsetDateTime;

use super::MachineView;
use crate::names::{self, refresh_state};
/// Where the binary and the tests have always found it.
pub use crate::timestamp::format_time;
use crate::timestamp::parse_time;

/// The next thing to do for one Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefreshStep {
    /// Nothing until the Machine changes.
    Idle,
    /// A refresh is asked for but the Machine has no node yet.
    WaitForNode,
    /// The Machine's expiry has never been read: read it from the agent.
    ObserveExpiry,
    /// The trigger value is unusable: fail the request at once.
    Reject { trigger: String, reason: String },
    /// A new request: mark it in progress.
    Start { trigger: String },
    /// Make (or resume) attempt number `attempt` of the request started at `started_at`.
    Attempt {
        ttl: Ttl,
        attempt: u32,
        started_at: OffsetDateTime,
    },
    /// The last attempt failed; try again at `until`.
    Backoff { until: OffsetDateTime },
    /// The trigger of a failed request was removed: forget which value that request was for,
    /// so that setting the trigger again, even to the same value, is a new request.
    ForgetEndedRequest,
}

/// Decides the next step for `machine` at `now`.
pub fn decide(machine: &MachineView, now: OffsetDateTime) -> RefreshStep {
    let Some(trigger) = machine.annotation(names::REFRESH_CERTIFICATES) else {
        // `kubectl annotate --overwrite` with the same value changes nothing, so removing the
        // trigger and adding it again is how a failed request is retried.
        if machine.annotation(names::REFRESH_CERTIFICATES_STATUS) == Some(names::STATUS_FAILED)
            && machine.annotation(refresh_state::TRIGGER).is_some()
            && !machine.being_deleted
        {
            return RefreshStep::ForgetEndedRequest;
        }
        let never_observed = machine.annotation(names::CERTIFICATES_EXPIRY).is_none();
        return if never_observed && machine.node_name.is_some() && !machine.being_deleted {
            RefreshStep::ObserveExpiry
        } else {
            RefreshStep::Idle
        };
    };
    if machine.being_deleted {
        return RefreshStep::Idle;
    }
    let status = machine.annotation(names::REFRESH_CERTIFICATES_STATUS);
    let same_request = machine.annotation(refresh_state::TRIGGER) == Some(trigger);
    let ttl = match trigger.parse::<Ttl>() {
        Ok(ttl) => ttl,
        Err(e) if !(same_request && status == Some(names::STATUS_FAILED)) => {
            return RefreshStep::Reject {
                trigger: trigger.to_string(),
                reason: e.to_string(),
            };
        }
        Err(_) => return RefreshStep::Idle,
    };
    match status {
        Some(names::STATUS_IN_PROGRESS) if same_request => {
            let Some(started_at) = parse_time(machine.annotation(refresh_state::STARTED_AT)) else {
                return RefreshStep::Start {
                    trigger: trigger.to_string(),
                };
            };
            if let Some(until) =
                parse_time(machine.annotation(refresh_state::RETRY_AT)).filter(|t| *t > now)
            {
                return RefreshStep::Backoff { until };
            }
            let failed: u32 = machine
                .annotation(refresh_state::ATTEMPTS)
                .and_then(|a| a.parse().ok())
                .unwrap_or(0);
            RefreshStep::Attempt {
                ttl,
                attempt: failed + 1,
                started_at,
            }
        }
        // This request already ended in failure; a new trigger value starts a new one, and so
        // does the same value once the trigger has been removed (see `ForgetEndedRequest`).
        Some(names::STATUS_FAILED) if same_request => RefreshStep::Idle,
        _ if machine.node_name.is_none() => RefreshStep::WaitForNode,
        _ => RefreshStep::Start {
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

    #[test]
    fn without_a_trigger_only_the_expiry_is_filled_in() {
        assert_eq!(decide(&machine(&[]), NOW), RefreshStep::ObserveExpiry);
        assert_eq!(
            decide(
                &machine(&[(names::CERTIFICATES_EXPIRY, "2027-01-01T00:00:00Z")]),
                NOW
            ),
            RefreshStep::Idle
        );
        let mut nodeless = machine(&[]);
        nodeless.node_name = None;
        assert_eq!(decide(&nodeless, NOW), RefreshStep::Idle);
    }

    #[test]
    fn a_trigger_starts_a_request_and_bad_values_are_rejected() {
        assert_eq!(
            decide(&machine(&[(names::REFRESH_CERTIFICATES, "1y")]), NOW),
            RefreshStep::Start {
                trigger: "1y".into()
            }
        );
        for bad in ["1 year", "-1y", "0s", "10"] {
            match decide(&machine(&[(names::REFRESH_CERTIFICATES, bad)]), NOW) {
                RefreshStep::Reject { trigger, reason } => {
                    assert_eq!(trigger, bad);
                    assert!(reason.contains(&format!("{bad:?}")), "{reason}");
                }
                other => panic!("{bad}: {other:?}"),
            }
        }
        let mut nodeless = machine(&[(names::REFRESH_CERTIFICATES, "1y")]);
        nodeless.node_name = None;
        assert_eq!(decide(&nodeless, NOW), RefreshStep::WaitForNode);
        let mut deleting = machine(&[(names::REFRESH_CERTIFICATES, "1y")]);
        deleting.being_deleted = true;
        assert_eq!(decide(&deleting, NOW), RefreshStep::Idle);
    }

    #[test]
    fn in_progress_requests_attempt_back_off_and_end() {
        let started = "2026-01-01T11:59:00Z";
        let base = [
            (names::REFRESH_CERTIFICATES, "90d"),
            (
                names::REFRESH_CERTIFICATES_STATUS,
                names::STATUS_IN_PROGRESS,
            ),
            (refresh_state::TRIGGER, "90d"),
            (refresh_state::STARTED_AT, started),
        ];
        let step = decide(&machine(&base), NOW);
        assert_eq!(
            step,
            RefreshStep::Attempt {
                ttl: "90d".parse().unwrap(),
                attempt: 1,
                started_at: datetime!(2026-01-01 11:59 UTC)
            }
        );

        let mut retrying = base.to_vec();
        retrying.extend([
            (refresh_state::ATTEMPTS, "2"),
            (refresh_state::RETRY_AT, "2026-01-01T12:00:40Z"),
        ]);
        assert_eq!(
            decide(&machine(&retrying), NOW),
            RefreshStep::Backoff {
                until: datetime!(2026-01-01 12:00:40 UTC)
            }
        );
        assert!(matches!(
            decide(&machine(&retrying), datetime!(2026-01-01 12:01 UTC)),
            RefreshStep::Attempt { attempt: 3, .. }
        ));

        // A changed trigger while in progress is a new request.
        let mut changed = base.to_vec();
        changed[0] = (names::REFRESH_CERTIFICATES, "2y");
        assert_eq!(
            decide(&machine(&changed), NOW),
            RefreshStep::Start {
                trigger: "2y".into()
            }
        );

        // A failed request stays failed until the trigger changes.
        let failed = [
            (names::REFRESH_CERTIFICATES, "90d"),
            (names::REFRESH_CERTIFICATES_STATUS, names::STATUS_FAILED),
            (refresh_state::TRIGGER, "90d"),
        ];
        assert_eq!(decide(&machine(&failed), NOW), RefreshStep::Idle);
        let rejected = [
            (names::REFRESH_CERTIFICATES, "bogus"),
            (names::REFRESH_CERTIFICATES_STATUS, names::STATUS_FAILED),
            (refresh_state::TRIGGER, "bogus"),
        ];
        assert_eq!(decide(&machine(&rejected), NOW), RefreshStep::Idle);
        // Done with the trigger set again: a new request.
        let again = [
            (names::REFRESH_CERTIFICATES, "90d"),
            (names::REFRESH_CERTIFICATES_STATUS, names::STATUS_DONE),
        ];
        assert_eq!(
            decide(&machine(&again), NOW),
            RefreshStep::Start {
                trigger: "90d".into()
            }
        );
    }

    #[test]
    fn removing_the_trigger_of_a_failed_request_lets_the_same_value_start_anew() {
        let failed = [
            (names::REFRESH_CERTIFICATES, "90d"),
            (names::REFRESH_CERTIFICATES_STATUS, names::STATUS_FAILED),
            (refresh_state::TRIGGER, "90d"),
            (names::CERTIFICATES_EXPIRY, "2027-01-01T00:00:00Z"),
        ];
        assert_eq!(decide(&machine(&failed), NOW), RefreshStep::Idle);
        let removed: Vec<_> = failed[1..].to_vec();
        assert_eq!(
            decide(&machine(&removed), NOW),
            RefreshStep::ForgetEndedRequest
        );
        // Once forgotten (the controller removes the record), nothing more to do, and the same
        // value set again is a new request.
        let forgotten: Vec<_> = removed
            .iter()
            .copied()
            .filter(|(k, _)| *k != refresh_state::TRIGGER)
            .collect();
        assert_eq!(decide(&machine(&forgotten), NOW), RefreshStep::Idle);
        let mut again = forgotten.clone();
        again.push((names::REFRESH_CERTIFICATES, "90d"));
        assert_eq!(
            decide(&machine(&again), NOW),
            RefreshStep::Start {
                trigger: "90d".into()
            }
        );
        // Done requests keep no record to forget; deleted Machines are left alone.
        let done = [
            (names::REFRESH_CERTIFICATES_STATUS, names::STATUS_DONE),
            (names::CERTIFICATES_EXPIRY, "2027-01-01T00:00:00Z"),
        ];
        assert_eq!(decide(&machine(&done), NOW), RefreshStep::Idle);
        let mut leaving = machine(&removed);
        leaving.being_deleted = true;
        assert_eq!(decide(&leaving, NOW), RefreshStep::Idle);
    }
}
