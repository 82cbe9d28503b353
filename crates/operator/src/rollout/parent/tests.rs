use super::*;
use crate::changes::EventType;
use crate::machine::test_machine;
use crate::machine::{refresh, upgrade};
use proptest::prelude::*;
use time::macros::datetime;

const NOW: OffsetDateTime = datetime!(2026-01-01 12:00 UTC);
const RETRY_BASE: Duration = Duration::from_secs(10);
const OPS: [Operation; 2] = Operation::ALL;

fn parent(kind: ParentKind, annotations: &[(&str, &str)]) -> ParentView {
    ParentView {
        kind,
        name: "p".into(),
        annotations: annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        deployment_limits: BTreeMap::new(),
        resource_version: None,
        progress_age: None,
        cluster: None,
    }
}

fn valid(operation: Operation) -> &'static str {
    match operation {
        Operation::RefreshCertificates => "1y",
        Operation::InPlaceUpgrade => "channel=1.35/stable",
    }
}

/// `m` after `changes` are written.
fn patched(m: &MachineView, changes: &AnnotationChanges) -> MachineView {
    let mut m = m.clone();
    changes.apply_to(&mut m.annotations);
    m
}

/// `p` after `changes` are written.
fn written(p: &ParentView, changes: &ParentChanges) -> ParentView {
    let mut p = p.clone();
    changes.parent.apply_to(&mut p.annotations);
    p
}

#[test]
fn a_new_request_gets_an_id_and_says_so_and_a_bad_value_fails_at_once() {
    for op in OPS {
        let names = op.names();
        let value = valid(op);
        let p = parent(ParentKind::MachineDeployment, &[(names.trigger, value)]);
        let ParentStep::Write(changes) = ParentStep::of(op, &p, NOW) else {
            panic!("{op:?}: a new request is written");
        };
        assert_eq!(
            changes.parent.get(names.status),
            Some(Some(names::STATUS_IN_PROGRESS))
        );
        assert_eq!(changes.parent.get(names.rollout_trigger), Some(Some(value)));
        let id = format!("MachineDeployment/p/{:x}", NOW.unix_timestamp_nanos());
        assert_eq!(
            changes.parent.get(names.rollout_request),
            Some(Some(id.as_str()))
        );
        assert_eq!(changes.parent.get(rollout_state::WAITING), Some(None));
        assert!(changes.start.is_empty());
        assert_eq!(changes.events.len(), 1);
        assert_eq!(changes.events[0].reason, names.rollout_events.in_progress);
        assert!(
            changes.events[0].note.contains("MachineDeployment p"),
            "{:?}",
            changes.events[0]
        );
        // Once written, the request runs.
        let running = written(&p, &changes);
        assert_eq!(
            ParentStep::of(op, &running, NOW),
            ParentStep::Roll(Rollout {
                operation: op,
                request_id: id,
                trigger: Some(value.into()),
                refused: None,
            })
        );

        let bad = parent(ParentKind::Cluster, &[(names.trigger, "soon")]);
        let ParentStep::Write(changes) = ParentStep::of(op, &bad, NOW) else {
            panic!("{op:?}: a bad value is written failed");
        };
        assert_eq!(
            changes.parent.get(names.status),
            Some(Some(names::STATUS_FAILED))
        );
        // As every failed request: the trigger goes, what was asked for stays on record.
        assert_eq!(changes.parent.get(names.trigger), Some(None));
        assert_eq!(changes.parent.get(names.rollout_trigger), Some(None));
        assert_eq!(
            changes.parent.get(names.rollout_requested),
            Some(Some("soon"))
        );
        assert_eq!(changes.parent.get(names.rollout_request), None);
        assert_eq!(changes.events.len(), 1);
        assert_eq!(changes.events[0].type_, EventType::Warning);
        assert_eq!(changes.events[0].reason, names.rollout_events.failed);
        assert_eq!(
            ParentStep::of(op, &written(&bad, &changes), NOW),
            ParentStep::Idle,
            "{op:?}: a rejected value stays rejected"
        );
    }
}

#[test]
fn malformed_limits_are_named_when_the_request_starts() {
    let names = Operation::RefreshCertificates.names();
    let mut cluster = parent(
        ParentKind::Cluster,
        &[(names.trigger, "1y"), (names::MAX_PARALLEL, "0")],
    );
    cluster.deployment_limits = BTreeMap::from([
        ("md-a".to_string(), "2".to_string()),
        ("md-b".to_string(), "many".to_string()),
    ]);
    let ParentStep::Write(changes) = ParentStep::of(Operation::RefreshCertificates, &cluster, NOW)
    else {
        panic!("a new request");
    };
    let warnings: Vec<&str> = changes
        .events
        .iter()
        .filter(|e| e.type_ == EventType::Warning)
        .map(|e| e.note.as_str())
        .collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(warnings[0].contains("\"0\" on Cluster p"), "{warnings:?}");
    assert!(
        warnings[1].contains("\"many\" on MachineDeployment md-b"),
        "{warnings:?}"
    );
    // They count as 1.
    let input = Rollout {
        operation: Operation::RefreshCertificates,
        request_id: "r".into(),
        trigger: Some("1y".into()),
        refused: None,
    }
    .input(&cluster, &[], &no_work_here);
    assert_eq!(input.max_parallel, 1);
    assert_eq!(
        input.deployment_limits,
        BTreeMap::from([("md-a".to_string(), 2), ("md-b".to_string(), 1)])
    );
    // A control plane's Machines go one at a time whatever it says.
    let plane = parent(
        ParentKind::ControlPlane,
        &[(names.trigger, "1y"), (names::MAX_PARALLEL, "0")],
    );
    let ParentStep::Write(changes) = ParentStep::of(Operation::RefreshCertificates, &plane, NOW)
    else {
        panic!("a new request");
    };
    assert_eq!(changes.events.len(), 1);
}

/// A limit the running rollout reads malformed is reported once, when it first reads it:
/// one that reached the operator's cache after the start, or was edited mid-rollout.
#[test]
fn a_malformed_limit_seen_after_the_start_is_reported_once() {
    let operation = Operation::RefreshCertificates;
    let names = operation.names();
    let mut cluster = parent(ParentKind::Cluster, &[(names.trigger, "1y")]);
    let ParentStep::Write(start) = ParentStep::of(operation, &cluster, NOW) else {
        panic!("a new request");
    };
    cluster = written(&cluster, &start);
    let ParentStep::Roll(rollout) = ParentStep::of(operation, &cluster, NOW) else {
        panic!("a running request");
    };
    let worker = test_machine(&[]);
    let warnings_of_a_pass = |cluster: &ParentView| {
        let machines = [Arc::new(worker.clone())];
        let plan = RolloutPlan::decide(&rollout.input(cluster, &machines, &no_work_here));
        let changes = rollout.changes(cluster, &machines, &plan, RETRY_BASE);
        let warnings: Vec<String> = changes
            .events
            .iter()
            .filter(|e| e.type_ == EventType::Warning)
            .map(|e| e.note.clone())
            .collect();
        (warnings, written(cluster, &changes))
    };
    let (warnings, _) = warnings_of_a_pass(&cluster);
    assert!(warnings.is_empty(), "{warnings:?}");

    cluster.deployment_limits = BTreeMap::from([("md-b".to_string(), "many".to_string())]);
    let (warnings, after) = warnings_of_a_pass(&cluster);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains("\"many\" on MachineDeployment md-b"),
        "{warnings:?}"
    );
    let (warnings, after) = warnings_of_a_pass(&after);
    assert!(warnings.is_empty(), "reported once: {warnings:?}");

    // Another bad value is news; a fixed one is forgotten, so breaking it again is too.
    let mut edited = after.clone();
    edited
        .deployment_limits
        .insert("md-b".into(), "lots".into());
    let (warnings, edited) = warnings_of_a_pass(&edited);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let mut fixed = edited.clone();
    fixed.deployment_limits.insert("md-b".into(), "2".into());
    let (warnings, fixed) = warnings_of_a_pass(&fixed);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(fixed.annotation(rollout_state::LIMITS_REPORTED), None);
}

#[test]
fn ended_requests_are_forgotten_once_their_trigger_is_removed() {
    for op in OPS {
        let names = op.names();
        for status in [names::STATUS_FAILED, names::STATUS_CANCELLED] {
            let ended = [
                (names.trigger, valid(op)),
                (names.status, status),
                (names.rollout_trigger, valid(op)),
            ];
            let p = parent(ParentKind::Cluster, &ended);
            assert_eq!(ParentStep::of(op, &p, NOW), ParentStep::Idle);
            let removed = parent(ParentKind::Cluster, &ended[1..]);
            let ParentStep::Write(changes) = ParentStep::of(op, &removed, NOW) else {
                panic!("{op:?} {status}: forgotten");
            };
            assert_eq!(
                changes,
                ParentChanges::writing(AnnotationChanges::removing(&[names.rollout_trigger]))
            );
            assert_eq!(
                ParentStep::of(op, &written(&removed, &changes), NOW),
                ParentStep::Idle
            );
        }
    }
}

#[test]
fn a_removed_trigger_cancels_a_running_request() {
    let names = Operation::InPlaceUpgrade.names();
    let p = parent(
        ParentKind::Cluster,
        &[
            (names.status, names::STATUS_IN_PROGRESS),
            (names.rollout_request, "r1"),
            (names.rollout_trigger, "revision=5"),
        ],
    );
    let ParentStep::Roll(rollout) = ParentStep::of(Operation::InPlaceUpgrade, &p, NOW) else {
        panic!("it runs on");
    };
    assert_eq!(rollout.trigger, None);
    assert!(rollout.input(&p, &[], &no_work_here).cancelled);
}

/// Whatever an earlier request left on a Machine, starting it for a new request makes it
/// running for that request (never failed or done by it), and the Machine controller takes
/// it up, even when the trigger value is the earlier one.
#[test]
fn a_started_machine_carries_no_result_of_an_earlier_request() {
    for operation in OPS {
        let names = operation.names();
        let value = valid(operation);
        let statuses = [
            None,
            Some(names::STATUS_DONE),
            Some(names::STATUS_FAILED),
            Some(names::STATUS_CANCELLED),
        ];
        for status in statuses {
            for earlier_trigger in [None, Some(value)] {
                let mut earlier = vec![(names.rollout_request, "earlier-request")];
                earlier.extend(status.map(|s| (names.status, s)));
                earlier.extend(earlier_trigger.map(|t| (names.trigger, t)));
                earlier.extend(earlier_trigger.map(|t| (names.state.trigger, t)));
                earlier.push((names.state.last_error, "the earlier request's error"));
                let mut before = test_machine(&earlier);
                before.resource_version = Some("41".into());
                let seen = observe(operation, "new", &[Arc::new(before.clone())], &no_work_here);
                assert_eq!(seen[0].progress, MachineProgress::Untouched, "{earlier:?}");

                let start = MachineStart::for_request(operation, value, "new", &before);
                assert_eq!(
                    start.resource_version.as_deref(),
                    Some("41"),
                    "on the version seen"
                );
                let started = patched(&before, &start.annotations);
                let seen = observe(
                    operation,
                    "new",
                    &[Arc::new(started.clone())],
                    &no_work_here,
                );
                assert_eq!(seen[0].progress, MachineProgress::Running, "{earlier:?}");
                let taken_up = match operation {
                    Operation::RefreshCertificates => {
                        refresh::decide(&started, NOW)
                            == refresh::RefreshStep::Start {
                                trigger: value.into(),
                            }
                    }
                    Operation::InPlaceUpgrade => {
                        upgrade::decide(&started, NOW)
                            == upgrade::UpgradeStep::Start {
                                trigger: value.into(),
                            }
                    }
                };
                assert!(taken_up, "the Machine controller starts {earlier:?}");
            }
        }
    }
}

/// A Machine's annotations, read as where it stands for request `new`.
#[test]
fn observe_reads_each_machine_for_this_request_only() {
    let op = Operation::RefreshCertificates;
    let names = op.names();
    let (trigger, status, tag) = (names.trigger, names.status, names.rollout_request);
    type Case<'a> = (&'a [(&'a str, &'a str)], MachineProgress, Option<&'a str>);
    let cases: [Case; 8] = [
        (&[], MachineProgress::Untouched, None),
        (
            &[(tag, "old"), (status, names::STATUS_FAILED)],
            MachineProgress::Untouched,
            None,
        ),
        (
            &[(tag, "new"), (trigger, "1y")],
            MachineProgress::Running,
            None,
        ),
        (
            &[
                (tag, "new"),
                (trigger, "1y"),
                (status, names::STATUS_IN_PROGRESS),
            ],
            MachineProgress::Running,
            None,
        ),
        (
            &[
                (tag, "new"),
                (trigger, "1y"),
                (status, names::STATUS_FAILED),
                (names.state.last_error, "boom"),
            ],
            MachineProgress::Failed,
            Some("boom"),
        ),
        (
            &[(tag, "new"), (status, names::STATUS_DONE)],
            MachineProgress::Done,
            None,
        ),
        (
            &[(tag, "new"), (status, names::STATUS_IN_PROGRESS)],
            MachineProgress::Running,
            None,
        ),
        // Tagged, trigger gone and no result: someone removed it; not done.
        (
            &[(tag, "new")],
            MachineProgress::Failed,
            Some("status unknown"),
        ),
    ];
    for (annotations, progress, failure) in cases {
        let mut m = test_machine(annotations);
        m.labels
            .insert(names::DEPLOYMENT_NAME_LABEL.into(), "md-a".into());
        let seen = observe(op, "new", &[Arc::new(m.clone())], &no_work_here);
        assert_eq!(seen[0].progress, progress, "{annotations:?}");
        assert_eq!(seen[0].failure.as_deref(), failure, "{annotations:?}");
        assert_eq!(
            seen[0].role,
            Role::Worker {
                deployment: "md-a".into()
            }
        );
        assert!(seen[0].has_node && !seen[0].being_deleted);
    }
    let mut plane = test_machine(&[]);
    plane.control_plane = true;
    plane.node_name = None;
    let seen = observe(op, "new", &[Arc::new(plane)], &no_work_here);
    assert_eq!(
        (seen[0].role.clone(), seen[0].has_node),
        (Role::ControlPlane, false)
    );
}

/// Work running on the node keeps its status: the Machine controller continues it.
#[test]
fn starting_a_machine_keeps_a_running_status() {
    let running = test_machine(&[(names::IN_PLACE_UPGRADE_STATUS, names::STATUS_IN_PROGRESS)]);
    let start = MachineStart::for_request(Operation::InPlaceUpgrade, "revision=5", "new", &running);
    let started = patched(&running, &start.annotations);
    assert_eq!(
        started.annotation(names::IN_PLACE_UPGRADE_STATUS),
        Some(names::STATUS_IN_PROGRESS)
    );
    let seen = observe(
        Operation::InPlaceUpgrade,
        "new",
        &[Arc::new(started)],
        &no_work_here,
    );
    assert_eq!(seen[0].progress, MachineProgress::Running);
}

fn rollout(operation: Operation) -> Rollout {
    Rollout {
        operation,
        request_id: "r1".into(),
        trigger: Some(valid(operation).into()),
        refused: None,
    }
}

fn progress(done: usize, total: usize) -> super::super::Progress {
    super::super::Progress {
        done,
        total,
        ..Default::default()
    }
}

#[test]
fn an_ended_rollout_writes_its_status_and_says_why() {
    for op in OPS {
        let names = op.names();
        let p = parent(
            ParentKind::Cluster,
            &[(rollout_state::WAITING, "waiting for w-1")],
        );
        let ended = |plan| rollout(op).changes(&p, &[], &plan, RETRY_BASE);
        let reasons = &names.rollout_events;
        let cases = [
            (
                RolloutPlan::Done {
                    progress: progress(3, 3),
                },
                names::STATUS_DONE,
                Event::normal(
                    reasons.done,
                    "all 3 Machines of Cluster p are done (0 skipped)",
                ),
            ),
            (
                RolloutPlan::Failed {
                    machine: "w-0".into(),
                    reason: "boom".into(),
                    progress: progress(1, 3),
                },
                names::STATUS_FAILED,
                Event::warning(
                    reasons.failed,
                    "Machine w-0 failed, the rollout stopped: boom",
                ),
            ),
            (
                RolloutPlan::Cancelled {
                    progress: progress(1, 3),
                },
                names::STATUS_CANCELLED,
                Event::normal(
                    reasons.cancelled,
                    "cancelled after 1/3 Machines: the trigger was removed",
                ),
            ),
        ];
        for (plan, status, event) in cases {
            let changes = ended(plan.clone());
            assert_eq!(changes.parent.get(names.status), Some(Some(status)));
            assert_eq!(changes.parent.get(rollout_state::WAITING), Some(None));
            assert_eq!(changes.events, [event]);
            assert!(changes.start.is_empty());
            assert_eq!(changes.next, Next::AwaitChange);
            // A finished or failed request removes its trigger (as upstream); a cancelled one
            // had it removed already.
            let done = matches!(plan, RolloutPlan::Done { .. });
            let failed = matches!(plan, RolloutPlan::Failed { .. });
            let trigger = changes.parent.get(names.trigger);
            assert_eq!(trigger, (done || failed).then_some(None), "{plan:?}");
            if let (true, Some(release)) = (done, names.release) {
                assert_eq!(changes.parent.get(release), Some(Some(valid(op))));
            }
        }
    }
}

#[test]
fn progress_is_written_at_most_once_a_second_while_the_request_runs_and_at_once_when_it_ends() {
    let op = Operation::RefreshCertificates;
    let shown = |age: Option<Duration>| ParentView {
        progress_age: age,
        ..parent(ParentKind::MachineDeployment, &[(names::PROGRESS, "1/4")])
    };
    let running = RolloutPlan::Continue {
        start: Vec::new(),
        waiting: None,
        progress: progress(2, 4),
    };
    let written = |p: &ParentView, plan: &RolloutPlan| {
        let changes = rollout(op).changes(p, &[], plan, RETRY_BASE);
        let progress = changes.parent.get(names::PROGRESS);
        (progress.map(|p| p.map(str::to_string)), changes.next)
    };
    let recent = shown(Some(Duration::from_millis(300)));
    assert_eq!(
        written(&recent, &running),
        (None, Next::After(Duration::from_millis(700))),
        "written 300 ms ago: not again yet, but looked at again when due"
    );
    for due in [None, Some(PROGRESS_INTERVAL), Some(Duration::from_secs(5))] {
        assert_eq!(
            written(&shown(due), &running),
            (Some(Some("2/4".to_string())), Next::AwaitChange),
            "last written {due:?} ago"
        );
    }
    let first = ParentView {
        progress_age: Some(Duration::ZERO),
        ..parent(ParentKind::MachineDeployment, &[])
    };
    assert_eq!(
        written(&first, &running).0,
        Some(Some("2/4".into())),
        "none shown yet"
    );
    let ended = RolloutPlan::Done {
        progress: progress(4, 4),
    };
    assert_eq!(
        written(&recent, &ended).0,
        Some(Some("4/4".into())),
        "the end"
    );
    // Written with another change of the parent, which costs nothing more.
    let waiting = RolloutPlan::Continue {
        start: Vec::new(),
        waiting: Some(super::super::Waiting::ForNodes(vec!["w-1".into()])),
        progress: progress(2, 4),
    };
    assert_eq!(written(&recent, &waiting).0, Some(Some("2/4".into())));
    // Unchanged: nothing to write and nothing to come back for.
    let unchanged = RolloutPlan::Continue {
        start: Vec::new(),
        waiting: None,
        progress: progress(1, 4),
    };
    assert_eq!(written(&recent, &unchanged), (None, Next::AwaitChange));
}

#[test]
fn waiting_is_reported_once_and_looked_at_again() {
    let op = Operation::RefreshCertificates;
    let p = parent(ParentKind::MachineDeployment, &[(names::PROGRESS, "0/2")]);
    let plan = RolloutPlan::Continue {
        start: Vec::new(),
        waiting: Some(super::super::Waiting::ForNodes(vec!["w-1".into()])),
        progress: progress(0, 2),
    };
    let first = rollout(op).changes(&p, &[], &plan, RETRY_BASE);
    let text = "waiting for w-1 to get a node";
    assert_eq!(first.parent.get(rollout_state::WAITING), Some(Some(text)));
    assert_eq!(
        first.parent.get(names::PROGRESS),
        None,
        "unchanged progress is not written"
    );
    assert_eq!(
        first.events,
        [Event::normal(names::EVENT_REFRESH_CERTS_IN_PROGRESS, text)]
    );
    assert_eq!(first.next, Next::After(RETRY_BASE));
    let again = rollout(op).changes(&written(&p, &first), &[], &plan, Duration::ZERO);
    assert!(
        again.parent.is_empty() && again.events.is_empty(),
        "{again:?}"
    );
    assert_eq!(
        again.next,
        Next::After(Duration::from_secs(1)),
        "never a spin"
    );
}

#[test]
fn automatic_refresh_starts_when_due_waits_until_then_and_reports_a_bad_value_once() {
    let auto = names::AUTO_REFRESH_CERTIFICATES;
    let cluster = parent(ParentKind::Cluster, &[(auto, "ttl=1y,before=30d")]);
    assert_eq!(
        ParentStep::of(Operation::RefreshCertificates, &cluster, NOW),
        ParentStep::AutoRefresh
    );
    assert_eq!(
        ParentStep::of(Operation::InPlaceUpgrade, &cluster, NOW),
        ParentStep::Idle
    );
    let plane = ParentView {
        kind: ParentKind::ControlPlane,
        ..cluster.clone()
    };
    assert_eq!(
        ParentStep::of(Operation::RefreshCertificates, &plane, NOW),
        ParentStep::Idle
    );

    let expiring = |at: &str| Arc::new(test_machine(&[(names::CERTIFICATES_EXPIRY, at)]));
    let soon = [
        expiring("2026-01-20T12:00:00Z"),
        expiring("2027-01-01T00:00:00Z"),
    ];
    let started = auto_refresh(&cluster, &soon, NOW);
    assert_eq!(
        started.parent.get(names::REFRESH_CERTIFICATES),
        Some(Some("1y"))
    );
    let later = [expiring("2026-02-10T12:30:00Z")];
    let waiting = auto_refresh(&cluster, &later, NOW);
    assert!(waiting.parent.is_empty());
    assert_eq!(
        waiting.next,
        Next::After(Duration::from_secs(3600)),
        "at most hourly"
    );
    assert_eq!(auto_refresh(&cluster, &[], NOW), ParentChanges::default());

    let bad = parent(ParentKind::Cluster, &[(auto, "ttl=1y,before=later")]);
    let reported = auto_refresh(&bad, &soon, NOW);
    assert_eq!(reported.events.len(), 1);
    assert_eq!(reported.events[0].type_, EventType::Warning);
    assert!(reported.events[0].note.contains("ttl=1y,before=later"));
    assert_eq!(
        auto_refresh(&written(&bad, &reported), &soon, NOW),
        ParentChanges::default()
    );
}

fn arbitrary_parent_annotations() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    let names = Operation::RefreshCertificates.names();
    (
        prop::option::of(prop::sample::select(vec!["1y", "2y", "soon"])),
        prop::option::of(prop::sample::select(vec![
            names::STATUS_IN_PROGRESS,
            names::STATUS_DONE,
            names::STATUS_FAILED,
            names::STATUS_CANCELLED,
            "confused",
        ])),
        prop::option::of(prop::sample::select(vec!["1y", "2y", "soon"])),
        prop::option::of(Just("r0")),
    )
        .prop_map(move |(trigger, status, recorded, id)| {
            let mut a = Vec::new();
            a.extend(trigger.map(|v| (names.trigger, v)));
            a.extend(status.map(|v| (names.status, v)));
            a.extend(recorded.map(|v| (names.rollout_trigger, v)));
            a.extend(id.map(|v| (names.rollout_request, v)));
            a
        })
}

proptest! {
    /// A pass that only writes the parent (forget, reject, start) settles it: the next pass
    /// over what it wrote writes nothing more, and only a start makes the request run.
    #[test]
    fn a_written_step_settles_in_one_pass(annotations in arbitrary_parent_annotations()) {
        let op = Operation::RefreshCertificates;
        let names = op.names();
        let p = parent(ParentKind::MachineDeployment, &annotations);
        let step = ParentStep::of(op, &p, NOW);
        let in_progress = p.annotation(names.status) == Some(names::STATUS_IN_PROGRESS);
        // Another value beside a running request is refused, and that request runs on.
        let same = p.annotation(names.trigger).is_none() || p.annotation(names.rollout_trigger).is_some();
        prop_assert_eq!(matches!(step, ParentStep::Roll(_)), in_progress && same, "{:?}", step);
        if let ParentStep::Write(changes) = step {
            prop_assert!(changes.start.is_empty());
            let rejected = changes.parent.get(names.status) == Some(Some(names::STATUS_FAILED));
            let expected = rejected.then_some(None);
            prop_assert_eq!(changes.parent.get(names.trigger), expected, "the user's trigger is never written, and removed only on failure");
            let after = ParentStep::of(op, &written(&p, &changes), NOW);
            let starts = changes.parent.get(names.status) == Some(Some(names::STATUS_IN_PROGRESS));
            if starts {
                prop_assert!(matches!(&after, ParentStep::Roll(r) if Some(r.request_id.as_str()) != p.annotation(names.rollout_request)), "a new request has a new id: {:?}", after);
            } else {
                prop_assert_eq!(after, ParentStep::Idle);
            }
        }
    }

    /// The changes carry out exactly the plan: every Machine it starts, once, on the version
    /// seen and tagged with this request; a status only when it ends; and reported waits are
    /// not reported again.
    #[test]
    fn changes_carry_out_exactly_the_plan(
        machines in prop::collection::btree_map(0u8..12, super::super::tests::arbitrary_machine(), 0..10),
        max_parallel in 1usize..4,
        cancelled in prop::bool::ANY,
        upgrade in prop::bool::ANY,
    ) {
        let op = if upgrade { Operation::InPlaceUpgrade } else { Operation::RefreshCertificates };
        let names = op.names();
        let observed: Vec<MachineObservation> = machines
            .iter()
            .map(|(i, m)| MachineObservation { name: format!("m-{i}"), ..m.clone() })
            .collect();
        let views: Vec<Arc<MachineView>> = observed
            .iter()
            .map(|o| Arc::new(MachineView { name: o.name.clone(), resource_version: Some(format!("v-{}", o.name)), ..test_machine(&[]) }))
            .collect();
        let plan = RolloutPlan::decide(&RolloutInput {
            cancelled,
            max_parallel,
            deployment_limits: BTreeMap::new(),
            blocked_by: None,
            machines: observed,
        });
        let request = Rollout { trigger: (!cancelled).then(|| valid(op).to_string()), ..rollout(op) };
        let p = parent(ParentKind::Cluster, &[]);
        let changes = request.changes(&p, &views, &plan, RETRY_BASE);

        let started: Vec<&str> = changes.start.iter().map(|s| s.machine.as_str()).collect();
        let planned: Vec<&str> = match &plan {
            RolloutPlan::Continue { start, .. } => start.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        prop_assert_eq!(started, planned);
        for start in &changes.start {
            prop_assert_eq!(start.resource_version.clone(), Some(format!("v-{}", start.machine)));
            prop_assert_eq!(start.annotations.get(names.rollout_request), Some(Some("r1")));
            prop_assert_eq!(start.annotations.get(names.trigger), Some(Some(valid(op))));
        }
        let status = changes.parent.get(names.status);
        let expected = match &plan {
            RolloutPlan::Done { .. } => Some(Some(names::STATUS_DONE)),
            RolloutPlan::Failed { .. } => Some(Some(names::STATUS_FAILED)),
            RolloutPlan::Cancelled { .. } => Some(Some(names::STATUS_CANCELLED)),
            RolloutPlan::Continue { .. } | RolloutPlan::Stopping { .. } => None,
        };
        prop_assert_eq!(status, expected);
        let progress = plan.progress();
        let progress_text = format!("{}/{}", progress.done, progress.total);
        prop_assert_eq!(changes.parent.get(names::PROGRESS), Some(Some(progress_text.as_str())));
        // Every event tells of something written on the parent.
        for event in &changes.events {
            let written = changes.parent.get(rollout_state::WAITING) == Some(Some(event.note.as_str())) || status.is_some();
            prop_assert!(written, "{:?} with {:?}", event, changes.parent);
        }
        let again = request.changes(&written(&p, &changes), &views, &plan, RETRY_BASE);
        if matches!(plan, RolloutPlan::Continue { .. } | RolloutPlan::Stopping { .. }) {
            prop_assert!(again.parent.is_empty() && again.events.is_empty(), "said once: {:?}", again);
            prop_assert_eq!(again.next, changes.next);
        }
    }
}

/// Every annotation key a Machine may carry that the operator knows, and one it does not.
fn machine_annotation_keys() -> Vec<&'static str> {
    let mut keys = vec![
        names::CERTIFICATES_EXPIRY,
        names::AGENT_ENDPOINT,
        "example.com/unrelated",
    ];
    keys.extend(names::refresh_state::ALL);
    keys.extend(names::upgrade_state::ALL);
    for op in OPS {
        let names = op.names();
        keys.extend([
            names.trigger,
            names.status,
            names.rollout_request,
            names.rollout_trigger,
        ]);
    }
    keys
}

fn arbitrary_machine_edit() -> impl Strategy<Value = (MachineView, MachineView)> {
    let value = || {
        prop::option::of(prop::sample::select(vec![
            "1y",
            "r1",
            "r2",
            names::STATUS_IN_PROGRESS,
            names::STATUS_DONE,
            names::STATUS_FAILED,
            "2026-01-05T00:00:00Z",
            "2027-01-05T00:00:00Z",
            "https://10.0.0.9:9443",
        ]))
    };
    let annotations = move || {
        prop::collection::vec(
            (prop::sample::select(machine_annotation_keys()), value()),
            0..4,
        )
    };
    let rarely = || prop::bool::weighted(0.1);
    let deployment = || prop::option::of(prop::sample::select(vec!["md-1", "md-2"]));
    (
        annotations(),
        annotations(),
        (any::<bool>(), rarely(), rarely()),
        deployment(),
        deployment(),
    )
        .prop_map(
            move |(before, edits, (control_plane, deleting, moved), md_before, md_after)| {
                let mut old = test_machine(&[]);
                old.control_plane = control_plane;
                for (key, value) in before.into_iter().filter_map(|(k, v)| Some((k, v?))) {
                    old.annotations.insert(key.into(), value.into());
                }
                old.labels.extend(
                    md_before.map(|md| (names::DEPLOYMENT_NAME_LABEL.to_string(), md.into())),
                );
                let mut new = old.clone();
                for (key, value) in edits {
                    match value {
                        Some(value) => new.annotations.insert(key.into(), value.into()),
                        None => new.annotations.remove(key),
                    };
                }
                new.being_deleted = deleting;
                if moved {
                    new.labels.remove(names::DEPLOYMENT_NAME_LABEL);
                    new.labels.extend(
                        md_after.map(|md| (names::DEPLOYMENT_NAME_LABEL.to_string(), md.into())),
                    );
                }
                new.resource_version = Some("2".into());
                (old, new)
            },
        )
}

proptest! {
    // Most random edits do matter; enough of them do not.
    #![proptest_config(ProptestConfig { max_global_rejects: 100_000, ..ProptestConfig::default() })]

    /// A Machine change that does not wake the parents changes nothing a pass would see or
    /// write: which parents cover it, its observation for any request, its start, the
    /// automatic refresh and the agent it is health-checked at.
    #[test]
    fn a_change_that_does_not_wake_the_parents_changes_no_decision((old, new) in arbitrary_machine_edit()) {
        // A start changes decisions and wakes no parent: the next property says why that holds.
        prop_assume!(!matters_to_parents(&old, &new) && !is_a_start(&old, &new));
        for kind in ParentKind::ALL {
            prop_assert_eq!(kind.parent_of(&old), kind.parent_of(&new));
            for parent in ["c1", "md-1", "md-2"] {
                prop_assert_eq!(kind.covers(parent, &old), kind.covers(parent, &new));
            }
        }
        let (old, new) = (Arc::new(old), Arc::new(new));
        for op in OPS {
            for request in ["r1", "r2"] {
                prop_assert_eq!(
                    observe(op, request, std::slice::from_ref(&old), &no_work_here),
                    observe(op, request, std::slice::from_ref(&new), &no_work_here)
                );
                let start = |m: &MachineView| MachineStart::for_request(op, "1y", request, m).annotations;
                prop_assert_eq!(start(&old), start(&new));
            }
        }
        let auto = parent(ParentKind::Cluster, &[(names::AUTO_REFRESH_CERTIFICATES, "ttl=1y,before=30d")]);
        prop_assert_eq!(
            auto_refresh(&auto, std::slice::from_ref(&old), NOW),
            auto_refresh(&auto, std::slice::from_ref(&new), NOW)
        );
        prop_assert_eq!(old.agent_url(9443), new.agent_url(9443));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { max_global_rejects: 100_000, ..ProptestConfig::default() })]

    /// A Machine change that does not wake the Clusters changes nothing a Cluster's pass decides
    /// from Machines (which Cluster covers it, its health check) and never makes an automatic
    /// refresh due sooner (the Cluster comes back when the old expiry made it due, and then
    /// reads the new one); whatever wakes the other parents but not the Clusters is the
    /// Machine's rollout state, which reaches a Cluster through its children, or an expiry put
    /// off.
    #[test]
    fn a_change_that_does_not_wake_the_clusters_changes_no_cluster_decision((old, new) in arbitrary_machine_edit()) {
        prop_assume!(!matters_to_clusters(&old, &new));
        let (old, new) = (Arc::new(old), Arc::new(new));
        prop_assert_eq!(ParentKind::Cluster.parent_of(&old), ParentKind::Cluster.parent_of(&new));
        prop_assert_eq!(ParentKind::Cluster.covers("c1", &old), ParentKind::Cluster.covers("c1", &new));
        let auto = parent(ParentKind::Cluster, &[(names::AUTO_REFRESH_CERTIFICATES, "ttl=1y,before=30d")]);
        for before in [auto.clone(), parent(ParentKind::Cluster, &[(names::AUTO_REFRESH_CERTIFICATES, "ttl=1y,before=400d")])] {
            let (was, is) = (
                auto_refresh(&before, std::slice::from_ref(&old), NOW),
                auto_refresh(&before, std::slice::from_ref(&new), NOW),
            );
            let starts = |c: &ParentChanges| c.parent.get(names::REFRESH_CERTIFICATES).is_some();
            let wait = |c: &ParentChanges| match c.next {
                Next::After(wait) => wait,
                Next::AwaitChange => Duration::MAX,
            };
            prop_assert!(!starts(&is) || starts(&was), "made due sooner: {was:?} -> {is:?}");
            if !starts(&was) {
                prop_assert!(wait(&is) >= wait(&was), "{was:?} -> {is:?}");
            }
            prop_assert_eq!(was.events, is.events);
        }
        prop_assert_eq!(old.agent_url(9443), new.agent_url(9443));
        let expiry = |m: &MachineView| m.annotation(names::CERTIFICATES_EXPIRY).map(str::to_string);
        if matters_to_parents(&old, &new) && expiry(&old) == expiry(&new) {
            let state = |m: &MachineView| -> Vec<Option<String>> {
                OPS.iter()
                    .flat_map(|op| {
                        let names = op.names();
                        [names.trigger, names.status, names.rollout_request, names.state.last_error]
                    })
                    .map(|key| m.annotation(key).map(str::to_string))
                    .collect()
            };
            prop_assert_ne!(state(&old), state(&new));
        }
    }
}

proptest! {
    /// A start wakes no parent, and no parent needs it to: the request that made it counts
    /// the Machine running (its pass decided so when it wrote the start), and to every other
    /// request of either operation the Machine is busy, so hearing of the start could only
    /// make another parent wait on it, never start, finish or fail anything sooner.
    #[test]
    fn a_start_wakes_no_parent_and_makes_the_machine_busy_to_every_other_request(
        (old, _) in arbitrary_machine_edit(),
        op in prop::sample::select(OPS.to_vec()),
        request in prop::sample::select(vec!["r1", "r2"]),
    ) {
        prop_assume!(old.annotation(op.names().trigger).is_none());
        // Only a Machine free for this request is ever started.
        let free = Arc::new(old.clone());
        prop_assume!(observe(op, request, std::slice::from_ref(&free), &no_work_here)[0].held_by.is_none());
        let mut new = old.clone();
        MachineStart::for_request(op, "1y", request, &old).annotations.apply_to(&mut new.annotations);
        new.resource_version = Some("2".into());
        prop_assert!(is_a_start(&old, &new));
        prop_assert!(!matters_to_parents(&old, &new));
        let new = Arc::new(new);
        let seen = &observe(op, request, std::slice::from_ref(&new), &no_work_here)[0];
        prop_assert_eq!(seen.progress, MachineProgress::Running);
        prop_assert_eq!(&seen.held_by, &None);
        for other_op in OPS {
            for other in ["r1", "r2", "r3"] {
                if (other_op, other) == (op, request) {
                    continue;
                }
                let seen = &observe(other_op, other, std::slice::from_ref(&new), &no_work_here)[0];
                prop_assert!(seen.held_by.is_some(), "{other_op:?} {other}: {seen:?}");
            }
        }
    }
}

#[test]
fn a_start_on_a_machine_with_a_trigger_or_with_more_changed_wakes_the_parents() {
    let names = Operation::RefreshCertificates.names();
    let idle = test_machine(&[]);
    let start = |m: &MachineView| {
        let mut started = m.clone();
        MachineStart::for_request(Operation::RefreshCertificates, "1y", "r1", m)
            .annotations
            .apply_to(&mut started.annotations);
        started
    };
    assert!(!matters_to_parents(&idle, &start(&idle)));
    // A value changed under a running request is not a start.
    let asked = test_machine(&[(names.trigger, "90d")]);
    assert!(matters_to_parents(&asked, &start(&asked)));
    // Nor is a start written together with anything else a parent reads.
    let mut more = start(&idle);
    more.annotations
        .insert(names::AGENT_ENDPOINT.into(), "https://10.0.0.9:9443".into());
    assert!(matters_to_parents(&idle, &more));
}

#[test]
fn taking_up_a_start_and_the_agents_plan_id_do_not_wake_the_parents_and_a_result_does() {
    let names = Operation::RefreshCertificates.names();
    let started = test_machine(&[(names.trigger, "1y"), (names.rollout_request, "r1")]);
    let mut running = started.clone();
    running
        .annotations
        .insert(names.status.into(), names::STATUS_IN_PROGRESS.into());
    assert!(!matters_to_parents(&started, &running));
    let mut planned = running.clone();
    planned
        .annotations
        .insert(names::refresh_state::PLAN.into(), "plan-1".into());
    planned.resource_version = Some("7".into());
    assert!(!matters_to_parents(&running, &planned));
    let mut done = planned.clone();
    done.annotations.remove(names.trigger);
    done.annotations
        .insert(names.status.into(), names::STATUS_DONE.into());
    assert!(matters_to_parents(&planned, &done));
    // Without its trigger, `in-progress` is work the Machine controller still winds down.
    let mut winding_down = planned.clone();
    winding_down.annotations.remove(names.trigger);
    assert!(matters_to_parents(&planned, &winding_down));
}

#[test]
fn a_machine_deployment_never_covers_a_control_plane_machine() {
    let mut labelled = test_machine(&[]);
    labelled
        .labels
        .insert(names::DEPLOYMENT_NAME_LABEL.into(), "md".into());
    assert!(ParentKind::MachineDeployment.covers("md", &labelled));
    // The control-plane label, or a control plane as controller, leaves it out.
    let mut by_label = labelled.clone();
    by_label.control_plane = true;
    assert!(!ParentKind::MachineDeployment.covers("md", &by_label));
    let mut by_owner = labelled.clone();
    by_owner.controller = Some(crate::machine::ObjectRef {
        group: caretaker_api::cluster_api::CONTROL_PLANE_GROUP.into(),
        kind: "CK8sControlPlane".into(),
        name: "cp".into(),
    });
    assert!(!ParentKind::MachineDeployment.covers("md", &by_owner));
}

#[test]
fn another_value_on_a_running_parent_is_refused_once_and_the_request_runs_on() {
    for op in OPS {
        let names = op.names();
        let [first, second] = match op {
            Operation::RefreshCertificates => ["60d", "90d"],
            Operation::InPlaceUpgrade => ["revision=1", "revision=2"],
        };
        let p = parent(
            ParentKind::ControlPlane,
            &[
                (names.trigger, second),
                (names.status, names::STATUS_IN_PROGRESS),
                (names.rollout_trigger, first),
                (names.rollout_request, "r1"),
            ],
        );
        let ParentStep::Roll(rollout) = ParentStep::of(op, &p, NOW) else {
            panic!("{op:?}: the running request runs on");
        };
        assert_eq!(rollout.trigger.as_deref(), Some(first));
        assert_eq!(rollout.refused.as_deref(), Some(second));
        let m = test_machine(&[]);
        let machines = [Arc::new(m)];
        let plan = RolloutPlan::decide(&rollout.input(&p, &machines, &no_work_here));
        let changes = rollout.changes(&p, &machines, &plan, RETRY_BASE);
        // Started for the running request's value, not the new one.
        assert_eq!(
            changes.start[0].annotations.get(names.trigger),
            Some(Some(first))
        );
        let warnings: Vec<_> = changes
            .events
            .iter()
            .filter(|e| e.type_ == EventType::Warning)
            .collect();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].note.contains(second) && warnings[0].note.contains("refused"));
        let again = written(&p, &changes);
        let ParentStep::Roll(rollout) = ParentStep::of(op, &again, NOW) else {
            panic!()
        };
        let changes = rollout.changes(&again, &machines, &plan, RETRY_BASE);
        assert!(
            changes.events.is_empty(),
            "refused once: {:?}",
            changes.events
        );
    }
}

#[test]
fn a_wait_for_another_request_is_recorded_and_warned_of_once() {
    let op = Operation::RefreshCertificates;
    let p = parent(ParentKind::MachineDeployment, &[]);
    let mut rollout = rollout(op);
    rollout.request_id = "MachineDeployment/p/2".into();
    let other = parent(
        ParentKind::MachineDeployment,
        &[
            (
                Operation::InPlaceUpgrade.names().status,
                names::STATUS_IN_PROGRESS,
            ),
            (
                Operation::InPlaceUpgrade.names().rollout_request,
                "MachineDeployment/p/1",
            ),
        ],
    );
    let blocked = blocked_by(op, &p, &rollout.request_id, &[&other]);
    assert_eq!(blocked.as_deref(), Some("MachineDeployment/p"));
    // The older one is never blocked by the newer.
    let newer = parent(
        ParentKind::MachineDeployment,
        &[
            (
                Operation::InPlaceUpgrade.names().status,
                names::STATUS_IN_PROGRESS,
            ),
            (
                Operation::InPlaceUpgrade.names().rollout_request,
                "MachineDeployment/p/3",
            ),
        ],
    );
    assert_eq!(blocked_by(op, &p, &rollout.request_id, &[&newer]), None);
    let machines = [Arc::new(test_machine(&[]))];
    let mut input = rollout.input(&p, &machines, &no_work_here);
    input.blocked_by = blocked;
    let plan = RolloutPlan::decide(&input);
    let changes = rollout.changes(&p, &machines, &plan, RETRY_BASE);
    assert!(changes.start.is_empty());
    assert_eq!(
        changes.parent.get(rollout_state::WAITING_FOR),
        Some(Some("MachineDeployment/p"))
    );
    assert_eq!(changes.events.len(), 1);
    assert_eq!(changes.events[0].type_, EventType::Warning);
    let again = written(&p, &changes);
    let changes = rollout.changes(&again, &machines, &plan, RETRY_BASE);
    assert!(changes.events.is_empty());
}

#[test]
fn automatic_refresh_does_not_repeat_a_failed_rollout() {
    let names = Operation::RefreshCertificates.names();
    let auto = (names::AUTO_REFRESH_CERTIFICATES, "ttl=1y,before=30d");
    let failed = parent(
        ParentKind::Cluster,
        &[auto, (names.status, names::STATUS_FAILED)],
    );
    assert_eq!(
        ParentStep::of(Operation::RefreshCertificates, &failed, NOW),
        ParentStep::Idle
    );
    let done = parent(
        ParentKind::Cluster,
        &[auto, (names.status, names::STATUS_DONE)],
    );
    assert_eq!(
        ParentStep::of(Operation::RefreshCertificates, &done, NOW),
        ParentStep::AutoRefresh
    );
}

/// A control-plane Machine of control plane `p`, with these annotations.
fn control_plane_machine(name: &str, annotations: &[(&str, &str)]) -> Arc<MachineView> {
    let mut m = test_machine(annotations);
    m.name = name.into();
    m.control_plane = true;
    m.labels
        .insert(names::CONTROL_PLANE_LABEL.into(), String::new());
    m.labels
        .insert(names::CONTROL_PLANE_NAME_LABEL.into(), "p".into());
    Arc::new(m)
}

/// Someone who may write a Machine leaves `in-progress` on it without a trigger, naming some
/// request (or the operator stopped after a refresh's trigger was removed mid-run). The Machine
/// controller never acts on that again, so no request may wait for it: the control plane's
/// refresh goes on. Work this process still runs on a Machine holds it whatever its
/// annotations say, and an upgrade `in-progress` without a trigger is being cancelled.
#[test]
fn a_leftover_in_progress_without_a_trigger_holds_no_control_plane_machine() {
    let op = Operation::RefreshCertificates;
    let p = parent(ParentKind::ControlPlane, &[]);
    let rollout = rollout(op);
    let refresh = op.names();
    let forged = control_plane_machine(
        "cp-0",
        &[
            (refresh.status, names::STATUS_IN_PROGRESS),
            (refresh.rollout_request, "Cluster/elsewhere/1"),
        ],
    );
    let machines = [forged.clone(), control_plane_machine("cp-1", &[])];
    let plan = RolloutPlan::decide(&rollout.input(&p, &machines, &no_work_here));
    let RolloutPlan::Continue { start, waiting, .. } = &plan else {
        panic!("{plan:?}");
    };
    assert_eq!(waiting, &None, "it waits for nothing");
    assert_eq!(start, &["cp-0"], "the first control-plane Machine starts");

    // Work running here on cp-0 (of either operation) holds the whole control plane.
    for running in OPS {
        let working = move |o: Operation, m: &MachineView| o == running && m.name == "cp-0";
        let plan = RolloutPlan::decide(&rollout.input(&p, &machines, &working));
        assert!(
            matches!(
                &plan,
                RolloutPlan::Continue { start, waiting: Some(super::super::Waiting::ForRequest(_)), .. } if start.is_empty()
            ),
            "{running:?}: {plan:?}"
        );
    }
    // An upgrade in progress without its trigger is being cancelled on the node: it holds.
    let upgrade = Operation::InPlaceUpgrade.names();
    let cancelling = control_plane_machine("cp-0", &[(upgrade.status, names::STATUS_IN_PROGRESS)]);
    let machines = [cancelling, control_plane_machine("cp-1", &[])];
    let plan = RolloutPlan::decide(&rollout.input(&p, &machines, &no_work_here));
    assert!(
        matches!(&plan, RolloutPlan::Continue { start, .. } if start.is_empty()),
        "{plan:?}"
    );
}
