//! What a pass decides for one Machine and one capability, as data: a [`MachinePlan`] (what to
//! write and say, what work to start, when to look again), and the [`MachineUpdate`] that
//! records how that work ended. The pieces both capabilities build them from follow the
//! operation's row of names ([`caretaker_api::names::OperationNames`]), so a refresh and an upgrade
//! start, fail, retry and wait alike.

use std::time::Duration;

use serde_json::Value;
use time::OffsetDateTime;

use super::MachineView;
use crate::changes::{AnnotationChanges, Event};
use crate::schedule::{Next, busy_retry, retry_at};
use crate::timestamp::{format_time, parse_time};
use crate::{Error, Settings};
use caretaker_api::names::{self, Operation};

/// What a pass observed of one Machine for one capability.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The Machine as the controller's cache has it.
    pub machine: &'a MachineView,
    pub now: OffsetDateTime,
    /// How long the capability's work for the Machine has been running in this process, if it
    /// is.
    pub running: Option<Duration>,
}

/// One pass's decision for one Machine, carried out in order: `update`, then `work` in the
/// background, then the controller looks again as `next` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachinePlan<W> {
    pub update: MachineUpdate,
    /// Calls to the node, too long to wait for in a reconcile; what they find out is
    /// recorded by a [`MachineUpdate`] of their own.
    pub work: Option<W>,
    pub next: Next,
}

impl<W> MachinePlan<W> {
    /// Nothing to do but look again as `next` says.
    pub fn wait(next: Next) -> Self {
        Self {
            update: MachineUpdate::default(),
            work: None,
            next,
        }
    }

    /// Record `update`; writing it wakes the controller.
    pub fn record(update: MachineUpdate) -> Self {
        Self {
            update,
            ..Self::wait(Next::AwaitChange)
        }
    }

    /// Start `work`, whose end writes the Machine and so wakes the controller. When the
    /// Machine's work already runs in this process (`running`: for how long), nothing is
    /// started twice, and the Machine is looked at again as [`busy_retry`] says: that work's
    /// end may change nothing.
    pub fn await_work(work: W, running: Option<Duration>) -> Self {
        match running {
            None => Self {
                work: Some(work),
                ..Self::wait(Next::AwaitChange)
            },
            Some(running_for) => Self::wait(Next::After(busy_retry(running_for))),
        }
    }

    /// Start `work` unless it runs already, and look again after `every` either way.
    pub fn poll_work(work: W, every: Duration, running: Option<Duration>) -> Self {
        Self {
            work: running.is_none().then_some(work),
            ..Self::wait(Next::After(every))
        }
    }

    /// Look again within `at_most`, whatever changes.
    pub fn within(self, at_most: Duration) -> Self {
        Self {
            next: self.next.sooner(Next::After(at_most)),
            ..self
        }
    }

    /// Record `update` first.
    pub fn after(self, update: MachineUpdate) -> Self {
        Self { update, ..self }
    }
}

/// What to write on a Machine, and the event that tells of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MachineUpdate {
    pub write: Option<Write>,
    /// Published once `write` is recorded; not at all when it is not.
    pub event: Option<Event>,
}

impl MachineUpdate {
    pub fn patch(changes: AnnotationChanges) -> Self {
        Self {
            write: Some(Write::Patch(changes)),
            event: None,
        }
    }

    /// Records the end of the work the Machine did for trigger value `worked` (see
    /// [`Write::End`]).
    pub fn end(operation: Operation, worked: Option<&str>, changes: AnnotationChanges) -> Self {
        Self {
            write: Some(Write::End {
                trigger: operation.names().trigger,
                worked: worked.map(str::to_string),
                changes,
            }),
            event: None,
        }
    }

    pub fn telling(self, event: Event) -> Self {
        Self {
            event: Some(event),
            ..self
        }
    }
}

#[cfg(test)]
impl MachineUpdate {
    /// The changes of a `Patch` write, for tests.
    pub(crate) fn patched(&self) -> &AnnotationChanges {
        match &self.write {
            Some(Write::Patch(changes)) => changes,
            other => panic!("not a patch: {other:?}"),
        }
    }

    /// The trigger value worked on and the changes of an `End` write, for tests.
    pub(crate) fn ended(&self) -> (Option<&str>, &AnnotationChanges) {
        match &self.write {
            Some(Write::End {
                worked, changes, ..
            }) => (worked.as_deref(), changes),
            other => panic!("not an end: {other:?}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Merge these changes into the Machine's annotations.
    Patch(AnnotationChanges),
    /// Record the end (done or failed) of work the Machine did for `trigger` value `worked`:
    /// written on a fresh read, and not at all when the trigger now asks for something else
    /// (see [`end_patch`]).
    End {
        trigger: &'static str,
        worked: Option<String>,
        changes: AnnotationChanges,
    },
}

/// The merge patch that records the end (done or failed) of work a Machine did for trigger
/// value `worked` (`None`: it had none), written on exactly the version `fresh` was read at; or
/// nothing, when the trigger has since been set to another value. Work takes time: meanwhile a
/// rollout may start the Machine for a new request with a new value, and writing this end
/// then would remove (or fail) that request's trigger as if its work were done. The new value
/// is left to start its own work. A trigger removed meanwhile does not stop the end from being
/// recorded: the work did end.
pub fn end_patch(
    fresh: &MachineView,
    trigger_key: &str,
    worked: Option<&str>,
    changes: &AnnotationChanges,
) -> Option<Value> {
    let current = fresh.annotation(trigger_key);
    if current.is_some() && current != worked {
        return None;
    }
    Some(changes.merge_patch(fresh.resource_version.as_deref()))
}

/// The bookkeeping of the operation's request, all removed.
pub fn cleared(operation: Operation) -> AnnotationChanges {
    AnnotationChanges::removing(operation.names().state.all)
}

/// A new request for trigger value `trigger`, in progress from `now`.
pub fn started(operation: Operation, trigger: &str, now: OffsetDateTime) -> AnnotationChanges {
    let names = operation.names();
    let mut changes = cleared(operation);
    changes
        .set(names.status, names::STATUS_IN_PROGRESS)
        .set(names.state.trigger, trigger)
        .set(names.state.started_at, format_time(now))
        .set(names.state.attempts, "0");
    changes
}

/// The request is done: its trigger goes.
pub fn done(operation: Operation) -> AnnotationChanges {
    let names = operation.names();
    let mut changes = cleared(operation);
    changes
        .remove(names.trigger)
        .set(names.status, names::STATUS_DONE);
    changes
}

/// The request for `trigger` failed with `reason` at `now`. The value it was for is kept, so the
/// same value is not tried again until the trigger is removed.
pub fn failed(
    operation: Operation,
    trigger: &str,
    reason: &str,
    now: OffsetDateTime,
) -> AnnotationChanges {
    let names = operation.names();
    let mut changes = cleared(operation);
    changes
        .set(names.status, names::STATUS_FAILED)
        .set(names.state.trigger, trigger)
        .set(names.state.last_error, reason);
    if let Some(key) = names.last_failed_attempt_at {
        changes.set(key, format_time(now));
    }
    changes
}

/// The request for `trigger` ends failed with `reason`, and a Warning event says so once that
/// is recorded.
pub fn end_failed(
    operation: Operation,
    trigger: &str,
    reason: &str,
    now: OffsetDateTime,
) -> MachineUpdate {
    let worked = Some(trigger).filter(|t| !t.is_empty());
    let event = Event::warning(operation.names().machine_failed_event, reason);
    MachineUpdate::end(operation, worked, failed(operation, trigger, reason, now)).telling(event)
}

/// The trigger of an ended request was removed: forget which value that request was for, so
/// that setting the trigger again, even to the same value, is a new request.
pub fn forget_ended(operation: Operation) -> MachineUpdate {
    MachineUpdate::patch(AnnotationChanges::removing(&[operation
        .names()
        .state
        .trigger]))
}

/// What to record after a call to the node for attempt number `attempt` failed with `error`:
/// wait for a busy agent (not a failed attempt), schedule the next attempt with exponential
/// backoff, or, once attempts run out or trying again cannot help, end the request failed.
pub fn after_error(
    operation: Operation,
    machine: &MachineView,
    attempt: u32,
    error: &Error,
    now: OffsetDateTime,
    settings: &Settings,
) -> MachineUpdate {
    let state = &operation.names().state;
    match error {
        Error::Agent(e) if e.is_busy() => busy_wait(operation, machine, &e.to_string(), now),
        e if e.is_transient() && attempt < settings.max_attempts => {
            let mut changes = AnnotationChanges::default();
            changes
                .set(state.attempts, attempt.to_string())
                .set(
                    state.retry_at,
                    format_time(retry_at(now, settings.retry_base, attempt)),
                )
                .set(state.last_error, e.to_string());
            MachineUpdate::patch(changes)
        }
        e => {
            let trigger = machine
                .annotation(operation.names().trigger)
                .unwrap_or_default();
            let reason = failure_reason(&machine.name, attempt, e);
            end_failed(operation, trigger, &reason, now)
        }
    }
}

/// The node is busy (another step runs on it, or this request's own): look again after
/// [`busy_retry`] of how long the request has run. Not a failed attempt: the attempts are left
/// as they are.
pub fn busy_wait(
    operation: Operation,
    machine: &MachineView,
    why: &str,
    now: OffsetDateTime,
) -> MachineUpdate {
    let state = &operation.names().state;
    let running_for = parse_time(machine.annotation(state.started_at))
        .and_then(|started| Duration::try_from(now - started).ok())
        .unwrap_or_default();
    // The wake-up after this wait is the watch event of this very write, so the write must
    // change the Machine: annotations hold whole seconds, and a second wait within the same
    // second as the last would write the same retry time, which the API server does not store.
    let mut retry_at = now + busy_retry(running_for);
    if let Some(recorded) = parse_time(machine.annotation(state.retry_at))
        && retry_at.replace_nanosecond(0).unwrap_or(retry_at) <= recorded
    {
        retry_at = recorded + time::Duration::SECOND;
    }
    let mut changes = AnnotationChanges::default();
    changes
        .set(state.retry_at, format_time(retry_at))
        .set(state.last_error, format!("waiting: {why}"));
    MachineUpdate::patch(changes)
}

/// Why a Machine's request ended after `attempt` attempts, for its event and annotations.
pub fn failure_reason(machine: &str, attempt: u32, error: &Error) -> String {
    if error.is_transient() {
        format!("Machine {machine}: gave up after {attempt} attempts: {error}")
    } else {
        format!("Machine {machine}: {error}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::test_machine;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-01-01 12:00 UTC);

    #[test]
    fn the_end_of_work_is_recorded_only_while_the_trigger_is_the_one_worked_on() {
        let key = names::REFRESH_CERTIFICATES;
        let changes = AnnotationChanges::removing(&[key]);
        let mut fresh = test_machine(&[(key, "1y")]);
        fresh.resource_version = Some("42".into());
        let body = end_patch(&fresh, key, Some("1y"), &changes).expect("same trigger");
        assert_eq!(
            body["metadata"]["resourceVersion"], "42",
            "on the version read"
        );
        assert_eq!(body["metadata"]["annotations"][key], Value::Null);
        // A new request set another value meanwhile: its trigger stays, its work starts anew.
        assert_eq!(end_patch(&fresh, key, Some("90d"), &changes), None);
        assert_eq!(end_patch(&fresh, key, None, &changes), None);
        // The trigger was removed meanwhile: the work still ended.
        let removed = test_machine(&[]);
        assert!(end_patch(&removed, key, Some("1y"), &changes).is_some());
    }

    #[test]
    fn running_work_is_not_started_twice() {
        let running = Some(Duration::from_secs(4));
        assert_eq!(
            MachinePlan::await_work("w", None),
            MachinePlan {
                update: MachineUpdate::default(),
                work: Some("w"),
                next: Next::AwaitChange
            }
        );
        assert_eq!(
            MachinePlan::await_work("w", running),
            MachinePlan::wait(Next::After(Duration::from_secs(2)))
        );
        let every = Duration::from_secs(5);
        assert_eq!(
            MachinePlan::poll_work("w", every, running),
            MachinePlan::wait(Next::After(every))
        );
        assert_eq!(MachinePlan::poll_work("w", every, None).work, Some("w"));
        assert_eq!(
            MachinePlan::await_work("w", None).within(every).next,
            Next::After(every)
        );
    }

    /// A second busy wait within the second of the first still moves the retry time on: the
    /// write is what wakes the controller, and a write that changes nothing is not stored.
    #[test]
    fn every_busy_wait_writes_a_later_retry_time() {
        for operation in Operation::ALL {
            let state = &operation.names().state;
            let why = "another step runs";
            let fresh = test_machine(&[(state.started_at, "2026-01-01T12:00:00Z")]);
            let first = busy_wait(operation, &fresh, why, NOW);
            assert_eq!(
                first.patched().get(state.retry_at),
                Some(Some("2026-01-01T12:00:00Z")),
                "200 ms, cut to the second"
            );
            let waited = test_machine(&[
                (state.started_at, "2026-01-01T12:00:00Z"),
                (state.retry_at, "2026-01-01T12:00:00Z"),
            ]);
            let second = busy_wait(operation, &waited, why, NOW);
            assert_eq!(
                second.patched().get(state.retry_at),
                Some(Some("2026-01-01T12:00:01Z"))
            );
        }
    }

    /// Failed calls to the node: a busy agent is waited for, other transient errors are
    /// retried with backoff until the attempts run out, and the rest end the request at once.
    #[test]
    fn failed_calls_wait_retry_or_end_the_request() {
        let settings = Settings::default();
        for operation in Operation::ALL {
            let names = operation.names();
            let machine = test_machine(&[
                (names.trigger, "v1"),
                (names.state.started_at, "2026-01-01T11:59:00Z"),
            ]);
            let busy = Error::Agent(caretaker_agent_api::client::AgentError::Status {
                url: "https://10.0.0.1:9443".into(),
                status: 409,
                reason: caretaker_agent_api::BUSY.into(),
                message: "another step runs".into(),
            });
            let waiting = after_error(operation, &machine, 3, &busy, NOW, &settings);
            let waiting = waiting.patched();
            assert_eq!(
                waiting.get(names.state.retry_at),
                Some(Some("2026-01-01T12:00:30Z"))
            );
            assert_eq!(waiting.get(names.state.attempts), None, "not an attempt");

            let down = Error::NoAgentEndpoint {
                machine: "m".into(),
            };
            let retry = after_error(operation, &machine, 1, &down, NOW, &settings);
            let retry = retry.patched();
            assert_eq!(retry.get(names.state.attempts), Some(Some("1")));
            assert_eq!(
                retry.get(names.state.retry_at),
                Some(Some("2026-01-01T12:00:10Z"))
            );

            let last = after_error(
                operation,
                &machine,
                settings.max_attempts,
                &down,
                NOW,
                &settings,
            );
            let (worked, changes) = last.ended();
            assert_eq!(worked, Some("v1"));
            assert_eq!(changes.get(names.status), Some(Some(names::STATUS_FAILED)));
            let event = last.event.expect("told");
            assert_eq!(event.reason, names.machine_failed_event);
            assert!(
                event.note.contains("gave up after 3 attempts"),
                "{}",
                event.note
            );

            let refused = Error::NoNode {
                machine: "m".into(),
            };
            let ended = after_error(operation, &machine, 1, &refused, NOW, &settings);
            assert!(
                matches!(ended.write, Some(Write::End { .. })),
                "no retry can help"
            );
            assert_eq!(
                ended.event.unwrap().note,
                "Machine m: Machine m has no node"
            );
        }
    }

    #[test]
    fn failed_requests_keep_their_value_and_upgrades_their_time() {
        let refresh = failed(Operation::RefreshCertificates, "1y", "boom", NOW);
        let upgrade = failed(Operation::InPlaceUpgrade, "revision=5", "boom", NOW);
        assert_eq!(refresh.get(names::refresh_state::TRIGGER), Some(Some("1y")));
        assert_eq!(refresh.get(names::refresh_state::PLAN), Some(None));
        assert_eq!(
            upgrade.get(names::IN_PLACE_UPGRADE_LAST_FAILED_ATTEMPT_AT),
            Some(Some("2026-01-01T12:00:00Z"))
        );
        assert_eq!(
            refresh.get(names::IN_PLACE_UPGRADE_LAST_FAILED_ATTEMPT_AT),
            None
        );
    }

    use proptest::prelude::*;

    /// One pass of `operation`'s plan: its update, whether it starts work, when it looks again.
    fn pass(
        operation: Operation,
        m: &MachineView,
        running: Option<Duration>,
    ) -> (MachineUpdate, bool, Next) {
        let settings = Settings::default();
        let seen = Observed {
            machine: m,
            now: NOW,
            running,
        };
        match operation {
            Operation::RefreshCertificates => {
                let plan = super::super::refresh::plan(&seen, &settings);
                (plan.update, plan.work.is_some(), plan.next)
            }
            Operation::InPlaceUpgrade => {
                let plan = super::super::upgrade::plan(&seen, &settings);
                (plan.update, plan.work.is_some(), plan.next)
            }
        }
    }

    /// A Machine in any state of `operation`'s request.
    fn arbitrary_machine(operation: Operation) -> impl Strategy<Value = MachineView> {
        let names = operation.names();
        let values = match operation {
            Operation::RefreshCertificates => vec!["1y", "90d", "soon"],
            Operation::InPlaceUpgrade => vec!["revision=5", "revision=6", "1.33"],
        };
        let value = prop::option::of(prop::sample::select(values));
        let status = prop::option::of(prop::sample::select(vec![
            names::STATUS_IN_PROGRESS,
            names::STATUS_DONE,
            names::STATUS_FAILED,
            names::STATUS_CANCELLED,
        ]));
        let time = prop::option::of(prop::sample::select(vec![
            "2026-01-01T11:59:00Z",
            "2026-01-01T12:05:00Z",
            "garbage",
        ]));
        let attempts = prop::option::of(prop::sample::select(vec!["0", "2"]));
        let upgrade_ids = (prop::bool::ANY, prop::bool::ANY);
        let machine = (prop::bool::ANY, prop::bool::weighted(0.1), prop::bool::ANY);
        (
            value.clone(),
            status,
            value,
            time.clone(),
            attempts,
            time,
            upgrade_ids,
            machine,
        )
            .prop_map(
                move |(
                    trigger,
                    status,
                    recorded,
                    started,
                    attempts,
                    retry,
                    (change, request),
                    (node, deleting, expiry),
                )| {
                    let mut annotations = Vec::new();
                    annotations.extend(trigger.map(|v| (names.trigger, v)));
                    annotations.extend(status.map(|v| (names.status, v)));
                    annotations.extend(recorded.map(|v| (names.state.trigger, v)));
                    annotations.extend(started.map(|v| (names.state.started_at, v)));
                    annotations.extend(attempts.map(|v| (names.state.attempts, v)));
                    annotations.extend(retry.map(|v| (names.state.retry_at, v)));
                    if operation == Operation::InPlaceUpgrade {
                        annotations
                            .extend(change.then_some((names::IN_PLACE_UPGRADE_CHANGE_ID, "op-1")));
                        annotations
                            .extend(request.then_some((names::upgrade_state::REQUEST_ID, "u1")));
                    }
                    annotations.extend(
                        expiry.then_some((names::CERTIFICATES_EXPIRY, "2027-01-01T00:00:00Z")),
                    );
                    let mut m = test_machine(&annotations);
                    m.resource_version = Some("1".into());
                    m.node_name = node.then(|| "node-m".to_string());
                    m.being_deleted = deleting;
                    m
                },
            )
    }

    proptest! {
        /// Over Machines in any state, for both capabilities: work already running is never
        /// started twice and is looked at again on a timer; every event tells of a write; and a
        /// pass that writes makes progress: the next pass, over what it wrote, does not write
        /// the same again.
        #[test]
        fn passes_start_work_once_tell_what_they_write_and_make_progress(
            (operation, m) in prop_oneof![Just(Operation::RefreshCertificates), Just(Operation::InPlaceUpgrade)]
                .prop_flat_map(|op| (Just(op), arbitrary_machine(op))),
            running_ms in prop::option::of(0u64..120_000),
        ) {
            let running = running_ms.map(Duration::from_millis);
            let (update, works, next) = pass(operation, &m, running);
            let (idle_update, would_work, idle_next) = pass(operation, &m, None);
            prop_assert_eq!(&update, &idle_update, "running work changes what is written");
            if running.is_some() {
                prop_assert!(!works, "work started twice");
                if would_work {
                    prop_assert!(matches!(next, Next::After(_)), "waits for a change while work runs: {:?}", next);
                }
            } else {
                prop_assert_eq!(next, idle_next);
            }
            prop_assert!(update.event.is_none() || update.write.is_some(), "an event without a write: {:?}", update);
            let mut written = m.clone();
            match &update.write {
                None => return Ok(()),
                Some(Write::Patch(changes)) => changes.apply_to(&mut written.annotations),
                Some(Write::End { trigger, worked, changes }) => {
                    if end_patch(&m, trigger, worked.as_deref(), changes).is_none() {
                        return Ok(());
                    }
                    changes.apply_to(&mut written.annotations);
                }
            }
            let (again, _, _) = pass(operation, &written, None);
            prop_assert_ne!(again.write, update.write, "the same write twice over {:?}", m.annotations);
        }
    }
}
