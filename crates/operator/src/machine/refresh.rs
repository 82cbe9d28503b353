//! The per-Machine certificate refresh, as pure decisions: [`decide`] reads where a Machine's
//! request stands, [`plan`] turns that into one pass's [`MachinePlan`], and [`after_attempt`]
//! into what an attempt's end records. The controller observes, talks to the node and applies
//! them; nothing here talks to anything.

use std::time::Duration;

use caretaker_agent_api::refresh::ApplyOutcome;
use caretaker_pki::Ttl;
use time::OffsetDateTime;

use super::MachineView;
use super::plan::{
    MachinePlan, MachineUpdate, Observed, after_error, busy_wait, done, end_failed, forget_ended,
    started,
};
use crate::changes::{AnnotationChanges, Event};
use crate::schedule::Next;
/// Where the binary and the tests have always found it.
pub use crate::timestamp::format_time;
use crate::timestamp::parse_time;
use crate::{Error, Settings};
use caretaker_api::names::{self, Operation, refresh_state};

const REFRESH: Operation = Operation::RefreshCertificates;

/// How often an unreadable expiry is tried again, at least.
const OBSERVE_RETRY: Duration = Duration::from_secs(60);

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

/// Work the controller runs in the background for a refresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshWork {
    /// Read the earliest expiry of the node's certificates from its agent.
    ObserveExpiry,
    /// Make the attempt the Machine is at, decided again on a fresh read of it.
    Attempt,
}

/// One pass of the refresh of the observed Machine, its steps in the order a request takes
/// them.
pub fn plan(seen: &Observed, settings: &Settings) -> MachinePlan<RefreshWork> {
    let (machine, now, running) = (seen.machine, seen.now, seen.running);
    match decide(machine, now) {
        // The first attempt starts now rather than one watch round trip later.
        RefreshStep::Start { trigger } => {
            let note = format!(
                "refreshing certificates of Machine {} with TTL {trigger}",
                machine.name
            );
            let update = MachineUpdate::patch(started(REFRESH, &trigger, now))
                .telling(Event::normal(names::EVENT_REFRESH_IN_PROGRESS, note));
            MachinePlan::await_work(RefreshWork::Attempt, running).after(update)
        }
        RefreshStep::Attempt { .. } => MachinePlan::await_work(RefreshWork::Attempt, running),
        // A success patches the Machine (and so wakes the controller); a failure does not.
        RefreshStep::ObserveExpiry => MachinePlan::await_work(RefreshWork::ObserveExpiry, running)
            .within(settings.retry_base.max(OBSERVE_RETRY)),
        RefreshStep::Reject { trigger, reason } => {
            MachinePlan::record(end_failed(REFRESH, &trigger, &reason, now))
        }
        RefreshStep::ForgetEndedRequest => MachinePlan::record(forget_ended(REFRESH)),
        RefreshStep::Backoff { until } => MachinePlan::wait(Next::at(until, now)),
        RefreshStep::Idle | RefreshStep::WaitForNode => MachinePlan::wait(Next::AwaitChange),
    }
}

/// What an attempt achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refreshed {
    /// New certificates are in place: their earliest expiry and a note for the event.
    Done {
        expiry: OffsetDateTime,
        note: String,
    },
    /// The node is still applying this request's plan: wait for it, never apply again.
    AgentBusy(String),
}

impl Refreshed {
    /// The node applied the plan.
    pub fn applied(machine: &str, outcome: &ApplyOutcome) -> Self {
        let restart = match &outcome.restart {
            None => String::new(),
            Some(hook) if hook.success => "; restart hook succeeded".into(),
            Some(hook) => format!(
                "; the restart hook FAILED (exit code {}, output: {}); the new certificates stay, old ones are backed up in {}",
                hook.exit_code.map_or("none".into(), |c| c.to_string()),
                hook.output_tail,
                outcome.backup_dir.display()
            ),
        };
        let note = format!(
            "refreshed {} certificates of Machine {machine}; they expire at {}{restart}",
            outcome.applied.len(),
            format_time(outcome.earliest_not_after)
        );
        Refreshed::Done {
            expiry: outcome.earliest_not_after,
            note,
        }
    }

    /// An earlier attempt's plan was applied; only its recording was lost.
    pub fn applied_earlier(machine: &str, outcome: &ApplyOutcome) -> Self {
        let note = format!(
            "certificates of Machine {machine} were refreshed by an earlier attempt; they expire at {}",
            format_time(outcome.earliest_not_after)
        );
        Refreshed::Done {
            expiry: outcome.earliest_not_after,
            note,
        }
    }
}

/// What to record once attempt number `attempt` of `machine`'s request ended with `outcome`.
pub fn after_attempt(
    machine: &MachineView,
    attempt: u32,
    outcome: Result<Refreshed, Error>,
    now: OffsetDateTime,
    settings: &Settings,
) -> MachineUpdate {
    match outcome {
        Ok(Refreshed::Done { expiry, note }) => {
            let mut changes = done(REFRESH);
            changes.set(names::CERTIFICATES_EXPIRY, format_time(expiry));
            let worked = machine.annotation(names::REFRESH_CERTIFICATES);
            MachineUpdate::end(REFRESH, worked, changes)
                .telling(Event::normal(names::EVENT_REFRESH_DONE, note))
        }
        Ok(Refreshed::AgentBusy(why)) => busy_wait(REFRESH, machine, &why, now),
        Err(e) => after_error(REFRESH, machine, attempt, &e, now, settings),
    }
}

/// The earliest expiry read from the node, recorded (a node without certificates records
/// nothing).
pub fn expiry_observed(expiry: Option<OffsetDateTime>) -> MachineUpdate {
    let Some(expiry) = expiry else {
        return MachineUpdate::default();
    };
    let mut changes = AnnotationChanges::default();
    changes.set(names::CERTIFICATES_EXPIRY, format_time(expiry));
    MachineUpdate::patch(changes)
}

/// Whether certificates valid for `ttl` from `now` can be signed by a CA valid until
/// `ca_not_after`; checked before anything is sent to the node.
pub fn check_ttl(
    ttl: &Ttl,
    now: OffsetDateTime,
    ca_not_after: OffsetDateTime,
) -> Result<(), Error> {
    let wanted = ttl
        .expires_at(now)
        .ok_or(Error::TtlOutOfRange { ttl: *ttl })?;
    if wanted > ca_not_after {
        return Err(Error::TtlBeyondCa {
            ttl: *ttl,
            ca_expiry: format_time(ca_not_after),
        });
    }
    Ok(())
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

    /// One pass at `NOW`, with default settings.
    fn pass(m: &MachineView, running: Option<Duration>) -> MachinePlan<RefreshWork> {
        let seen = Observed {
            machine: m,
            now: NOW,
            running,
        };
        plan(&seen, &Settings::default())
    }

    fn in_progress(extra: &[(&'static str, &'static str)]) -> MachineView {
        let mut annotations = vec![
            (names::REFRESH_CERTIFICATES, "90d"),
            (
                names::REFRESH_CERTIFICATES_STATUS,
                names::STATUS_IN_PROGRESS,
            ),
            (refresh_state::TRIGGER, "90d"),
            (refresh_state::STARTED_AT, "2026-01-01T11:59:00Z"),
        ];
        annotations.extend_from_slice(extra);
        machine(&annotations)
    }

    #[test]
    fn a_new_request_is_marked_said_and_its_first_attempt_started() {
        let m = machine(&[(names::REFRESH_CERTIFICATES, "1y")]);
        let plan = pass(&m, None);
        let changes = plan.update.patched();
        assert_eq!(
            changes.get(names::REFRESH_CERTIFICATES_STATUS),
            Some(Some(names::STATUS_IN_PROGRESS))
        );
        assert_eq!(changes.get(refresh_state::TRIGGER), Some(Some("1y")));
        assert_eq!(
            changes.get(refresh_state::STARTED_AT),
            Some(Some("2026-01-01T12:00:00Z"))
        );
        assert_eq!(
            changes.get(refresh_state::PLAN),
            Some(None),
            "no plan of an earlier request"
        );
        let event = plan.update.event.as_ref().unwrap();
        assert_eq!(event.reason, names::EVENT_REFRESH_IN_PROGRESS);
        assert_eq!(
            event.note,
            "refreshing certificates of Machine m with TTL 1y"
        );
        assert_eq!(plan.work, Some(RefreshWork::Attempt));
        assert_eq!(plan.next, Next::AwaitChange);
        // Work of this Machine still runs in this process: marked, but not started twice.
        let busy = pass(&m, Some(Duration::from_secs(1)));
        assert_eq!(busy.update, plan.update);
        assert_eq!(busy.work, None);
        assert_eq!(busy.next, Next::After(Duration::from_millis(500)));
    }

    #[test]
    fn each_step_plans_its_write_work_and_next_look() {
        let plan = |m: &MachineView| pass(m, None);

        let expiry = plan(&machine(&[]));
        assert_eq!(expiry.work, Some(RefreshWork::ObserveExpiry));
        assert_eq!(
            expiry.next,
            Next::After(Duration::from_secs(60)),
            "a failure changes nothing"
        );
        assert_eq!(expiry.update, MachineUpdate::default());

        let attempt = plan(&in_progress(&[]));
        assert_eq!(attempt.work, Some(RefreshWork::Attempt));
        assert_eq!(attempt.update, MachineUpdate::default());

        let backoff = plan(&in_progress(&[(
            refresh_state::RETRY_AT,
            "2026-01-01T12:00:40Z",
        )]));
        assert_eq!(
            backoff,
            MachinePlan::wait(Next::After(Duration::from_millis(40_050)))
        );

        let rejected = plan(&machine(&[(names::REFRESH_CERTIFICATES, "soon")]));
        let (worked, changes) = rejected.update.ended();
        assert_eq!(worked, Some("soon"));
        assert_eq!(
            changes.get(names::REFRESH_CERTIFICATES_STATUS),
            Some(Some(names::STATUS_FAILED))
        );
        assert_eq!(changes.get(refresh_state::TRIGGER), Some(Some("soon")));
        let event = rejected.update.event.as_ref().unwrap();
        assert_eq!(event.reason, names::EVENT_REFRESH_FAILED);
        assert!(event.note.contains("\"soon\""), "{}", event.note);

        let forget = plan(&machine(&[
            (names::REFRESH_CERTIFICATES_STATUS, names::STATUS_FAILED),
            (refresh_state::TRIGGER, "90d"),
        ]));
        assert_eq!(
            forget.update,
            MachineUpdate::patch(AnnotationChanges::removing(&[refresh_state::TRIGGER]))
        );
        assert_eq!(forget.work, None);
    }

    #[test]
    fn an_attempt_ends_done_or_waits_for_a_busy_node() {
        let settings = Settings::default();
        let m = in_progress(&[(refresh_state::PLAN, "p1")]);
        let expiry = datetime!(2027-01-01 0:00 UTC);
        let outcome = Ok(Refreshed::Done {
            expiry,
            note: "refreshed".into(),
        });
        let done = after_attempt(&m, 1, outcome, NOW, &settings);
        let (worked, changes) = done.ended();
        assert_eq!(
            worked,
            Some("90d"),
            "only while the trigger is the one worked on"
        );
        assert_eq!(changes.get(names::REFRESH_CERTIFICATES), Some(None));
        assert_eq!(
            changes.get(names::CERTIFICATES_EXPIRY),
            Some(Some("2027-01-01T00:00:00Z"))
        );
        assert_eq!(changes.get(refresh_state::PLAN), Some(None));
        assert_eq!(
            done.event,
            Some(Event::normal(names::EVENT_REFRESH_DONE, "refreshed"))
        );

        let applying = Ok(Refreshed::AgentBusy("still applying p1".into()));
        let busy = after_attempt(&m, 1, applying, NOW, &settings);
        let changes = busy.patched();
        assert_eq!(
            changes.get(refresh_state::LAST_ERROR),
            Some(Some("waiting: still applying p1"))
        );
        assert_eq!(changes.get(refresh_state::PLAN), None, "the plan is kept");
        assert_eq!(busy.event, None);
    }

    #[test]
    fn the_ttl_must_end_before_the_cluster_ca_and_the_year_9999() {
        let ttl: Ttl = "1y".parse().unwrap();
        assert!(check_ttl(&ttl, NOW, datetime!(2030-01-01 0:00 UTC)).is_ok());
        let beyond = check_ttl(&ttl, NOW, datetime!(2026-06-01 0:00 UTC)).unwrap_err();
        assert!(matches!(beyond, Error::TtlBeyondCa { .. }));
        assert!(beyond.to_string().contains("nothing was sent to the node"));
        let far = datetime!(9999-06-01 0:00 UTC);
        assert!(matches!(
            check_ttl(&ttl, far, far),
            Err(Error::TtlOutOfRange { .. })
        ));
    }
}
