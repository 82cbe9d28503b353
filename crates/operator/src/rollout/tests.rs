use super::*;
use proptest::prelude::*;

fn cp(name: &str, progress: MachineProgress) -> MachineObservation {
    MachineObservation {
        name: name.into(),
        role: Role::ControlPlane,
        has_node: true,
        agent_healthy: true,
        being_deleted: false,
        progress,
        failure: None,
        held_by: None,
    }
}

fn worker(name: &str, deployment: &str, progress: MachineProgress) -> MachineObservation {
    MachineObservation {
        role: Role::Worker {
            deployment: deployment.into(),
        },
        ..cp(name, progress)
    }
}

fn input(machines: Vec<MachineObservation>) -> RolloutInput {
    RolloutInput {
        cancelled: false,
        max_parallel: 1,
        deployment_limits: BTreeMap::new(),
        blocked_by: None,
        machines,
    }
}

fn started(plan: &RolloutPlan) -> Vec<String> {
    match plan {
        RolloutPlan::Continue { start, .. } => start.clone(),
        _ => Vec::new(),
    }
}

use MachineProgress::*;

#[test]
fn control_planes_go_first_and_one_at_a_time() {
    let plan = RolloutPlan::decide(&input(vec![
        worker("w-0", "md", Untouched),
        cp("cp-1", Untouched),
        cp("cp-0", Untouched),
    ]));
    assert_eq!(started(&plan), ["cp-0"]);
    let plan = RolloutPlan::decide(&input(vec![
        worker("w-0", "md", Untouched),
        cp("cp-1", Untouched),
        cp("cp-0", Running),
    ]));
    assert_eq!(started(&plan), Vec::<String>::new());
    let plan = RolloutPlan::decide(&input(vec![
        worker("w-0", "md", Untouched),
        cp("cp-1", Untouched),
        cp("cp-0", Done),
    ]));
    assert_eq!(started(&plan), ["cp-1"]);
    let plan = RolloutPlan::decide(&input(vec![
        worker("w-0", "md", Untouched),
        cp("cp-1", Done),
        cp("cp-0", Done),
    ]));
    assert_eq!(started(&plan), ["w-0"]);
}

#[test]
fn an_unhealthy_control_plane_machine_blocks_the_control_plane() {
    let mut sick = cp("cp-2", Done);
    sick.agent_healthy = false;
    let plan = RolloutPlan::decide(&input(vec![cp("cp-0", Done), cp("cp-1", Untouched), sick]));
    assert_eq!(
        plan,
        RolloutPlan::Continue {
            start: vec![],
            waiting: Some(Waiting::ForControlPlaneHealth(vec!["cp-2".into()])),
            progress: Progress {
                done: 2,
                total: 3,
                skipped: 0,
                running: 0
            },
        }
    );
}

#[test]
fn workers_respect_max_parallel_and_wait_for_nodes() {
    let mut nodeless = worker("w-3", "md", Untouched);
    nodeless.has_node = false;
    let machines = vec![
        cp("cp-0", Done),
        worker("w-0", "md", Running),
        worker("w-1", "md", Untouched),
        worker("w-2", "md", Untouched),
        nodeless,
    ];
    let plan = RolloutPlan::decide(&RolloutInput {
        max_parallel: 2,
        ..input(machines)
    });
    match plan {
        RolloutPlan::Continue { start, waiting, .. } => {
            assert_eq!(start, ["w-1"]);
            assert_eq!(waiting, Some(Waiting::ForNodes(vec!["w-3".into()])));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_machine_deployment_limit_holds_within_a_wider_cluster_limit() {
    let machines = vec![
        cp("cp-0", Done),
        worker("a-0", "md-a", Running),
        worker("a-1", "md-a", Untouched),
        worker("a-2", "md-a", Untouched),
        worker("b-0", "md-b", Untouched),
        worker("b-1", "md-b", Untouched),
    ];
    let limited = RolloutInput {
        max_parallel: 3,
        deployment_limits: BTreeMap::from([("md-a".to_string(), 1)]),
        ..input(machines.clone())
    };
    // md-a is at its limit of 1; the Cluster's other two slots go to md-b.
    assert_eq!(started(&RolloutPlan::decide(&limited)), ["b-0", "b-1"]);
    // Without md-a's own limit, its Machines come first.
    assert_eq!(
        started(&RolloutPlan::decide(&RolloutInput {
            max_parallel: 3,
            ..input(machines)
        })),
        ["a-1", "a-2"]
    );
}

#[test]
fn the_first_failure_stops_everything() {
    let mut failed = worker("w-0", "md", Failed);
    failed.failure = Some("agent unreachable".into());
    let plan = RolloutPlan::decide(&input(vec![
        cp("cp-0", Done),
        failed,
        worker("w-1", "md", Running),
        worker("w-2", "md", Untouched),
    ]));
    assert_eq!(
        plan,
        RolloutPlan::Stopping {
            machine: "w-0".into(),
            reason: "agent unreachable".into(),
            running: vec!["w-1".into()],
            progress: Progress {
                done: 1,
                total: 4,
                skipped: 0,
                running: 1
            },
        }
    );
}

#[test]
fn a_failed_rollout_ends_only_once_its_running_machines_have_finished() {
    let mut failed = worker("w-0", "md", Failed);
    failed.failure = Some("upgrade failed".into());
    for last_one in [Done, Failed] {
        let plan = RolloutPlan::decide(&RolloutInput {
            max_parallel: 2,
            ..input(vec![
                cp("cp-0", Done),
                failed.clone(),
                worker("w-1", "md", last_one),
                worker("w-2", "md", Untouched),
            ])
        });
        // The first failure is the one reported, whatever the others did since.
        assert_eq!(
            plan,
            RolloutPlan::Failed {
                machine: "w-0".into(),
                reason: "upgrade failed".into(),
                progress: Progress {
                    done: if last_one == Done { 2 } else { 1 },
                    total: 4,
                    skipped: 0,
                    running: 0
                },
            }
        );
    }
}

#[test]
fn cancel_lets_running_work_finish_then_ends() {
    let running = RolloutInput {
        cancelled: true,
        max_parallel: 3,
        ..input(vec![
            cp("cp-0", Done),
            worker("w-0", "md", Running),
            worker("w-1", "md", Untouched),
        ])
    };
    assert_eq!(
        started(&RolloutPlan::decide(&running)),
        Vec::<String>::new()
    );
    assert!(matches!(
        RolloutPlan::decide(&running),
        RolloutPlan::Continue { .. }
    ));
    let finished = RolloutInput {
        machines: vec![
            cp("cp-0", Done),
            worker("w-0", "md", Done),
            worker("w-1", "md", Untouched),
        ],
        ..running
    };
    assert!(matches!(
        RolloutPlan::decide(&finished),
        RolloutPlan::Cancelled { .. }
    ));
}

#[test]
fn machines_being_deleted_are_skipped() {
    let mut leaving = worker("w-1", "md", Untouched);
    leaving.being_deleted = true;
    let plan = RolloutPlan::decide(&input(vec![
        cp("cp-0", Done),
        worker("w-0", "md", Done),
        leaving,
    ]));
    assert_eq!(
        plan,
        RolloutPlan::Done {
            progress: Progress {
                done: 2,
                total: 2,
                skipped: 1,
                running: 0
            }
        }
    );
}

pub(super) fn arbitrary_machine() -> impl Strategy<Value = MachineObservation> {
    (
        0u8..6,
        // Mostly workers with few failures, so that max-parallel and a MachineDeployment's
        // own limit are what decides most plans.
        prop::bool::weighted(0.25),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.1),
        prop_oneof![
            4 => Just(Untouched),
            3 => Just(Running),
            3 => Just(Done),
            1 => Just(Failed)
        ],
    )
        .prop_map(
            |(n, is_cp, has_node, healthy, deleting, progress)| MachineObservation {
                name: format!("m-{n}"),
                role: if is_cp {
                    Role::ControlPlane
                } else {
                    Role::Worker {
                        deployment: format!("md-{}", n % 2),
                    }
                },
                has_node,
                agent_healthy: healthy,
                being_deleted: deleting,
                progress,
                failure: None,
                held_by: None,
            },
        )
}

proptest! {
    #[test]
    fn plans_never_break_the_rules(
        machines in prop::collection::btree_map(0u8..12, arbitrary_machine(), 0..10),
        max_parallel in 1usize..4,
        md0_limit in prop::option::of(1usize..3),
        cancelled in prop::bool::ANY,
    ) {
        let machines: Vec<MachineObservation> = machines
            .into_iter()
            .map(|(i, m)| MachineObservation { name: format!("m-{i}"), ..m })
            .collect();
        let deployment_limits: BTreeMap<String, usize> =
            md0_limit.map(|limit| ("md-0".to_string(), limit)).into_iter().collect();
        let input = RolloutInput { cancelled, max_parallel, deployment_limits, blocked_by: None, machines: machines.clone() };
        let plan = RolloutPlan::decide(&input);
        let by_name = |n: &str| machines.iter().find(|m| m.name == n).unwrap();
        let running = |cp: bool| machines.iter().filter(|m| (m.role == Role::ControlPlane) == cp && m.progress == Running && !(m.being_deleted && m.progress == Untouched)).count();
        if let RolloutPlan::Continue { start, .. } = &plan {
            prop_assert!(!cancelled || start.is_empty(), "nothing starts after cancel");
            for name in start {
                let m = by_name(name);
                prop_assert_eq!(m.progress, Untouched, "only untouched Machines start");
                prop_assert!(m.has_node && !m.being_deleted);
            }
            let cps: Vec<_> = start.iter().filter(|n| by_name(n).role == Role::ControlPlane).collect();
            prop_assert!(cps.len() <= 1, "one control-plane Machine at a time");
            if !cps.is_empty() {
                prop_assert_eq!(running(true), 0);
                prop_assert_eq!(start.len(), 1, "no workers alongside the control plane");
                let all_sound = machines.iter().filter(|m| m.role == Role::ControlPlane && !m.being_deleted).all(|m| m.has_node && m.agent_healthy);
                prop_assert!(all_sound, "control plane only while all its Machines are healthy");
            }
            let workers = start.len() - cps.len();
            if workers > 0 {
                prop_assert!(workers + running(false) <= max_parallel, "max-parallel respected");
                if let Some(limit) = md0_limit {
                    let in_md0 = |m: &MachineObservation| m.role == Role::Worker { deployment: "md-0".into() };
                    let md0_running = machines.iter().filter(|m| in_md0(m) && m.progress == Running).count();
                    let md0_started = start.iter().filter(|n| in_md0(by_name(n))).count();
                    prop_assert!(md0_started == 0 || md0_running + md0_started <= limit, "a MachineDeployment's own limit respected");
                }
                let cp_unfinished = machines.iter().any(|m| m.role == Role::ControlPlane && m.progress != Done && !(m.being_deleted && m.progress == Untouched));
                prop_assert!(!cp_unfinished, "workers only after the control plane");
            }
        }
        let covered: Vec<&MachineObservation> = machines.iter().filter(|m| !(m.being_deleted && m.progress == Untouched)).collect();
        let progress = plan.progress();
        prop_assert_eq!(progress.total, covered.len(), "covered Machines counted");
        prop_assert_eq!(progress.total + progress.skipped, machines.len(), "every Machine counted once");
        prop_assert_eq!(progress.done, covered.iter().filter(|m| m.progress == Done).count());
        prop_assert_eq!(progress.running, covered.iter().filter(|m| m.progress == Running).count());
        if matches!(plan, RolloutPlan::Done { .. }) {
            prop_assert!(covered.iter().all(|m| m.progress == Done), "done means every covered Machine is done");
        }
        if matches!(plan, RolloutPlan::Cancelled { .. } | RolloutPlan::Failed { .. }) {
            prop_assert_eq!(progress.running, 0, "an ended request has nothing running");
        }
        if let RolloutPlan::Continue { start, .. } = &plan {
            // Free slots and a ready worker with room in its MachineDeployment: one starts.
            let in_md0 = |m: &MachineObservation| m.role == Role::Worker { deployment: "md-0".into() };
            let md0_running = covered.iter().filter(|m| in_md0(m) && m.progress == Running).count();
            let room = |m: &MachineObservation| !in_md0(m) || md0_limit.is_none_or(|limit| md0_running < limit);
            let cp_done = covered.iter().filter(|m| m.role == Role::ControlPlane).all(|m| m.progress == Done);
            let workers_running = covered.iter().filter(|m| m.role != Role::ControlPlane && m.progress == Running).count();
            let ready = covered.iter().any(|m| m.role != Role::ControlPlane && m.progress == Untouched && m.has_node && room(m));
            if !cancelled && cp_done && workers_running < max_parallel && ready {
                prop_assert!(!start.is_empty(), "a free slot and a ready worker, yet nothing starts");
            }
        }
        let mut covered_running: Vec<String> = machines.iter().filter(|m| m.progress == Running).map(|m| m.name.clone()).collect();
        covered_running.sort();
        if machines.iter().any(|m| m.progress == Failed) {
            match &plan {
                RolloutPlan::Stopping { running, .. } => {
                    prop_assert!(!running.is_empty());
                    let mut running = running.clone();
                    running.sort();
                    prop_assert_eq!(running, covered_running.clone(), "it waits for exactly the running Machines");
                }
                RolloutPlan::Failed { .. } => {
                    prop_assert!(covered_running.is_empty(), "a failed rollout ends only once nothing runs");
                }
                other => prop_assert!(false, "a failure stops the rollout: {:?}", other),
            }
        }
    }
}
