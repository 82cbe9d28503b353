//! Cluster-wide rollouts as a pure decision: given a parent's request and the observed state of
//! the Machines it covers, what starts next and how the rollout stands. One plan serves both
//! operations (certificate refresh and in-place upgrade); they differ only in the annotations
//! the controller reads and writes.
//!
//! Rules (DESIGN section 6): control-plane Machines strictly one at a time, and only while every
//! control-plane Machine has a node and a healthy agent; then workers, `max_parallel` at a time
//! and no more of one MachineDeployment than its own limit;
//! the first failure stops the rollout and it ends `failed` once running work has finished; a
//! cancelled request starts nothing new and ends once running work has finished; Machines
//! being deleted are skipped; Machines without a node wait.
//!
//! One request per Machine (issue 32): a Machine busy with another request (the other
//! operation, another parent's request, or a trigger set on the Machine itself) is never
//! started; no control-plane Machine starts while any control-plane Machine is busy, whoever
//! asked; and a request waits, starting nothing, while an older request whose Machines overlap
//! its own runs ([`RolloutInput::blocked_by`]). So requests never preempt each other, and the
//! control plane has at most one busy Machine across all requests together.
//!
//! [`parent`] holds the rest of a pass over a parent: from its annotations to a
//! [`parent::ParentStep`], and from a plan to the changes that carry it out.

pub mod chain;
#[cfg(test)]
mod concurrency_tests;
pub mod controller;
pub mod parent;

use std::collections::BTreeMap;

/// The role of a Machine in a rollout, in rollout order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    ControlPlane,
    /// A worker of the named MachineDeployment.
    Worker {
        deployment: String,
    },
}

/// Where a Machine stands with respect to *this* request (earlier requests do not count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MachineProgress {
    /// Not started by this request.
    Untouched,
    /// Started by this request and not finished.
    Running,
    Done,
    Failed,
}

/// What the controller observed about one Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineObservation {
    pub name: String,
    pub role: Role,
    pub has_node: bool,
    /// The agent answered its last health check.
    pub agent_healthy: bool,
    pub being_deleted: bool,
    pub progress: MachineProgress,
    /// Why it failed, when it did.
    pub failure: Option<String>,
    /// The object (`Kind/name`) of another request the Machine is busy with, if any: it is
    /// not started, and while it is a control-plane Machine no control-plane Machine starts.
    pub held_by: Option<String>,
}

impl MachineObservation {
    /// Whether the rollout counts this Machine: one being deleted that it never touched is
    /// skipped.
    pub fn counted(&self) -> bool {
        !self.being_deleted || self.progress != MachineProgress::Untouched
    }

    /// The worker's MachineDeployment (empty for control-plane Machines).
    fn deployment(&self) -> &str {
        match &self.role {
            Role::Worker { deployment } => deployment,
            Role::ControlPlane => "",
        }
    }
}

/// A parent's request and its Machines, in any order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolloutInput {
    /// The trigger was removed from the parent.
    pub cancelled: bool,
    /// Workers allowed in progress at once (at least 1).
    pub max_parallel: usize,
    /// Limits set on MachineDeployments themselves, by name: at most this many of the
    /// deployment's workers in progress at once, whatever `max_parallel` allows.
    pub deployment_limits: BTreeMap<String, usize>,
    /// An older request whose Machines overlap this one's is still running (its object,
    /// `Kind/name`): nothing starts until it has ended.
    pub blocked_by: Option<String>,
    pub machines: Vec<MachineObservation>,
}

/// Counts for `caretaker.dev/progress` and the status view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Progress {
    pub done: usize,
    /// Machines the rollout covers (skipped ones excluded).
    pub total: usize,
    pub skipped: usize,
    pub running: usize,
}

impl Progress {
    /// The counts over the Machines a rollout observed; a Machine being deleted that it never
    /// touched is skipped.
    pub fn of<'a>(observed: impl IntoIterator<Item = &'a MachineObservation>) -> Self {
        let mut progress = Progress::default();
        for machine in observed {
            if !machine.counted() {
                progress.skipped += 1;
                continue;
            }
            progress.total += 1;
            match machine.progress {
                MachineProgress::Done => progress.done += 1,
                MachineProgress::Running => progress.running += 1,
                MachineProgress::Untouched | MachineProgress::Failed => {}
            }
        }
        progress
    }

    /// The counts by the `state` label of `caretaker_rollout_machines`.
    pub fn by_state(&self) -> [(&'static str, usize); 4] {
        [
            ("total", self.total),
            ("done", self.done),
            ("running", self.running),
            ("skipped", self.skipped),
        ]
    }
}

/// Why nothing (more) can start right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// These Machines have no node yet.
    ForNodes(Vec<String>),
    /// Control-plane Machines without a node or a healthy agent block the control plane.
    ForControlPlaneHealth(Vec<String>),
    /// Another request (its object, `Kind/name`) runs on Machines this one needs.
    ForRequest(String),
}

impl Waiting {
    /// In words, for the parent's `caretaker.dev/rollout-waiting` and its event.
    pub fn describe(&self) -> String {
        match self {
            Waiting::ForNodes(names) => format!("waiting for {} to get a node", names.join(", ")),
            Waiting::ForControlPlaneHealth(names) => format!(
                "waiting: control-plane Machines {} have no node or no healthy agent",
                names.join(", ")
            ),
            Waiting::ForRequest(object) => format!(
                "waiting for the request on {object} to end: it runs on Machines this request covers, and is not preempted"
            ),
        }
    }
}

/// The decision for one pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RolloutPlan {
    /// Start these Machines now (possibly none, while others run or wait).
    Continue {
        start: Vec<String>,
        waiting: Option<Waiting>,
        progress: Progress,
    },
    /// Every covered Machine is done.
    Done { progress: Progress },
    /// A Machine failed: nothing new starts, and these Machines, started by this request, still
    /// run. The request does not end yet: ended, the parent would report a final state while
    /// its work still changes nodes, and the next request would adopt that work as its own.
    Stopping {
        machine: String,
        reason: String,
        running: Vec<String>,
        progress: Progress,
    },
    /// A Machine failed and nothing runs any more: the parent ends `failed`.
    Failed {
        machine: String,
        reason: String,
        progress: Progress,
    },
    /// The request was cancelled and nothing runs any more.
    Cancelled { progress: Progress },
}

impl RolloutPlan {
    /// How the rollout stands.
    pub fn progress(&self) -> Progress {
        match self {
            RolloutPlan::Continue { progress, .. }
            | RolloutPlan::Done { progress }
            | RolloutPlan::Failed { progress, .. }
            | RolloutPlan::Stopping { progress, .. }
            | RolloutPlan::Cancelled { progress } => *progress,
        }
    }

    /// Whether the plan starts a control-plane Machine of `input`: only that step is gated on
    /// the health of the control plane's agents.
    pub fn starts_control_plane(&self, input: &RolloutInput) -> bool {
        let RolloutPlan::Continue { start, .. } = self else {
            return false;
        };
        start.iter().any(|name| {
            input
                .machines
                .iter()
                .any(|m| &m.name == name && m.role == Role::ControlPlane)
        })
    }

    /// Decides the next step of a rollout.
    pub fn decide(input: &RolloutInput) -> RolloutPlan {
        let mut machines: Vec<&MachineObservation> = input.machines.iter().collect();
        machines.sort_by(|a, b| (&a.role, &a.name).cmp(&(&b.role, &b.name)));
        let covered: Vec<&MachineObservation> =
            machines.iter().copied().filter(|m| m.counted()).collect();
        let progress = Progress::of(machines.iter().copied());

        if let Some(failed) = covered
            .iter()
            .find(|m| m.progress == MachineProgress::Failed)
        {
            let (machine, reason) = (
                failed.name.clone(),
                failed.failure.clone().unwrap_or_else(|| "unknown".into()),
            );
            let running: Vec<String> = covered
                .iter()
                .filter(|m| m.progress == MachineProgress::Running)
                .map(|m| m.name.clone())
                .collect();
            return if running.is_empty() {
                RolloutPlan::Failed {
                    machine,
                    reason,
                    progress,
                }
            } else {
                RolloutPlan::Stopping {
                    machine,
                    reason,
                    running,
                    progress,
                }
            };
        }
        if input.cancelled {
            return if progress.running == 0 {
                RolloutPlan::Cancelled { progress }
            } else {
                RolloutPlan::Continue {
                    start: Vec::new(),
                    waiting: None,
                    progress,
                }
            };
        }
        if progress.done == progress.total {
            return RolloutPlan::Done { progress };
        }
        let idle = |waiting: Waiting| RolloutPlan::Continue {
            start: Vec::new(),
            waiting: Some(waiting),
            progress,
        };
        if let Some(other) = &input.blocked_by {
            return idle(Waiting::ForRequest(other.clone()));
        }

        let control_plane: Vec<&MachineObservation> = covered
            .iter()
            .copied()
            .filter(|m| m.role == Role::ControlPlane)
            .collect();
        if control_plane
            .iter()
            .any(|m| m.progress != MachineProgress::Done)
        {
            if control_plane
                .iter()
                .any(|m| m.progress == MachineProgress::Running)
            {
                return RolloutPlan::Continue {
                    start: Vec::new(),
                    waiting: None,
                    progress,
                };
            }
            // Another request's control-plane Machine at work: at most one at a time, across
            // all requests together.
            if let Some(holder) = machines
                .iter()
                .find(|m| m.role == Role::ControlPlane && m.held_by.is_some())
                .and_then(|m| m.held_by.clone())
            {
                return idle(Waiting::ForRequest(holder));
            }
            // Every control-plane Machine, not only the next one, must be sound: a refresh
            // restarts components, and etcd needs its quorum while one member does.
            let unhealthy: Vec<String> = machines
                .iter()
                .filter(|m| {
                    m.role == Role::ControlPlane
                        && !m.being_deleted
                        && !(m.has_node && m.agent_healthy)
                })
                .map(|m| m.name.clone())
                .collect();
            if !unhealthy.is_empty() {
                return RolloutPlan::Continue {
                    start: Vec::new(),
                    waiting: Some(Waiting::ForControlPlaneHealth(unhealthy)),
                    progress,
                };
            }
            let next = control_plane
                .iter()
                .find(|m| m.progress == MachineProgress::Untouched)
                .expect("an unfinished, not running control-plane Machine is untouched");
            return RolloutPlan::Continue {
                start: vec![next.name.clone()],
                waiting: None,
                progress,
            };
        }

        let workers: Vec<&MachineObservation> = covered
            .iter()
            .copied()
            .filter(|m| m.role != Role::ControlPlane)
            .collect();
        let running = workers
            .iter()
            .filter(|m| m.progress == MachineProgress::Running)
            .count();
        let mut running_per_deployment: BTreeMap<&str, usize> = BTreeMap::new();
        for m in workers
            .iter()
            .filter(|m| m.progress == MachineProgress::Running)
        {
            *running_per_deployment.entry(m.deployment()).or_default() += 1;
        }
        let mut slots = input.max_parallel.max(1).saturating_sub(running);
        let untouched = workers
            .iter()
            .filter(|m| m.progress == MachineProgress::Untouched);
        let (held, free): (Vec<&MachineObservation>, Vec<&MachineObservation>) =
            untouched.copied().partition(|m| m.held_by.is_some());
        let (ready, nodeless): (Vec<&MachineObservation>, Vec<&MachineObservation>) =
            free.into_iter().partition(|m| m.has_node);
        let mut start = Vec::new();
        for m in ready {
            if slots == 0 {
                break;
            }
            let limit = input
                .deployment_limits
                .get(m.deployment())
                .map_or(usize::MAX, |limit| (*limit).max(1));
            let in_progress = running_per_deployment.entry(m.deployment()).or_default();
            if *in_progress < limit {
                *in_progress += 1;
                slots -= 1;
                start.push(m.name.clone());
            }
        }
        // Machines busy with another request are left for later; when nothing of this request
        // can move for them, the wait names that request.
        let stuck = start.is_empty() && running == 0;
        let waiting = match held.first().and_then(|m| m.held_by.clone()) {
            Some(holder) if stuck => Some(Waiting::ForRequest(holder)),
            _ => (!nodeless.is_empty())
                .then(|| Waiting::ForNodes(nodeless.iter().map(|m| m.name.clone()).collect())),
        };
        RolloutPlan::Continue {
            start,
            waiting,
            progress,
        }
    }
}

#[cfg(test)]
mod tests {
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
            .prop_map(|(n, is_cp, has_node, healthy, deleting, progress)| {
                MachineObservation {
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
                }
            })
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
}

/// Where a parent's request stands, from its trigger, its status and the trigger value its
/// current (or last) request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestState<'a> {
    /// No trigger and nothing to finish.
    NoRequest,
    /// The trigger of an ended (`failed` or `cancelled`) request was removed: forget the value
    /// it was for, so that the trigger set again, even to the same value, is a new request
    /// (`kubectl annotate --overwrite` with an unchanged value changes nothing, so removing and
    /// re-adding is how a request is retried).
    ForgetEnded,
    /// A new request: the first, a new value, or the trigger set again after an end (a
    /// finished request removes its trigger, so a trigger beside `done` is new too).
    New { trigger: &'a str },
    /// The request runs (or is being cancelled: its trigger was removed while it ran).
    InProgress,
    /// The request runs and the trigger now asks for another value: a second request on the
    /// same object, refused (the running one is never preempted; it runs on for its value).
    Conflicting { trigger: &'a str },
    /// This request ended `failed` or `cancelled` and its trigger is still there: it stays so.
    Ended,
}

impl<'a> RequestState<'a> {
    pub fn of(trigger: Option<&'a str>, status: Option<&str>, recorded: Option<&str>) -> Self {
        const IN_PROGRESS: &str = caretaker_api::names::STATUS_IN_PROGRESS;
        let ended = matches!(
            status,
            Some(caretaker_api::names::STATUS_FAILED)
                | Some(caretaker_api::names::STATUS_CANCELLED)
        );
        match trigger {
            None if status == Some(IN_PROGRESS) => RequestState::InProgress,
            None if ended && recorded.is_some() => RequestState::ForgetEnded,
            None => RequestState::NoRequest,
            Some(value) if recorded == Some(value) && status == Some(IN_PROGRESS) => {
                RequestState::InProgress
            }
            Some(value) if recorded.is_some() && status == Some(IN_PROGRESS) => {
                RequestState::Conflicting { trigger: value }
            }
            Some(value) if recorded == Some(value) && ended => RequestState::Ended,
            Some(value) => RequestState::New { trigger: value },
        }
    }
}

#[cfg(test)]
mod request_state_tests {
    use super::RequestState::{self, *};

    const NEW: RequestState<'static> = New { trigger: "1y" };
    use caretaker_api::names::{STATUS_CANCELLED, STATUS_DONE, STATUS_FAILED, STATUS_IN_PROGRESS};

    #[test]
    fn removing_and_re_adding_the_trigger_of_an_ended_request_is_a_new_request() {
        for end in [STATUS_FAILED, STATUS_CANCELLED] {
            // The same value stays ended while the trigger stays ...
            assert_eq!(RequestState::of(Some("1y"), Some(end), Some("1y")), Ended);
            // ... its removal forgets the value ...
            assert_eq!(RequestState::of(None, Some(end), Some("1y")), ForgetEnded);
            assert_eq!(RequestState::of(None, Some(end), None), NoRequest);
            // ... so the same value set again is new, as is any other value.
            assert_eq!(RequestState::of(Some("1y"), Some(end), None), NEW);
            assert_eq!(
                RequestState::of(Some("2y"), Some(end), Some("1y")),
                New { trigger: "2y" }
            );
        }
        assert_eq!(
            RequestState::of(Some("1y"), Some(STATUS_DONE), Some("1y")),
            NEW
        );
        assert_eq!(
            RequestState::of(None, Some(STATUS_DONE), Some("1y")),
            NoRequest
        );
        assert_eq!(RequestState::of(Some("1y"), None, None), NEW);
        assert_eq!(RequestState::of(None, None, None), NoRequest);
    }

    #[test]
    fn a_running_request_runs_on_and_its_removed_trigger_cancels_it() {
        let running = Some(STATUS_IN_PROGRESS);
        assert_eq!(
            RequestState::of(Some("1y"), running, Some("1y")),
            InProgress
        );
        assert_eq!(RequestState::of(None, running, Some("1y")), InProgress);
        // Another value while it runs is refused, not a new request that would preempt it.
        assert_eq!(
            RequestState::of(Some("2y"), running, Some("1y")),
            Conflicting { trigger: "2y" }
        );
    }
}

/// Opt-in automatic refresh of a Cluster:
/// `caretaker.dev/auto-refresh-certificates: "ttl=1y,before=30d"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoRefresh {
    /// The TTL of the refreshed certificates.
    pub ttl: caretaker_pki::Ttl,
    /// Refresh when the earliest Machine expiry is this close.
    pub before: caretaker_pki::Ttl,
}

impl AutoRefresh {
    pub fn parse(value: &str) -> Result<Self, String> {
        let (mut ttl, mut before) = (None, None);
        for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, v) = part.split_once('=').ok_or_else(|| {
                format!(
                    "invalid {:?}: {part:?} is not key=value; expected \"ttl=1y,before=30d\"",
                    value
                )
            })?;
            let parsed = v
                .trim()
                .parse::<caretaker_pki::Ttl>()
                .map_err(|e| format!("invalid {value:?}: {key}: {e}"))?;
            match key.trim() {
                "ttl" => ttl = Some(parsed),
                "before" => before = Some(parsed),
                other => {
                    return Err(format!(
                        "invalid {value:?}: unknown key {other:?}; expected ttl and before"
                    ));
                }
            }
        }
        match (ttl, before) {
            (Some(ttl), Some(before)) => Ok(Self { ttl, before }),
            _ => Err(format!(
                "invalid {value:?}: both ttl and before are required, as in \"ttl=1y,before=30d\""
            )),
        }
    }

    /// When a refresh is due, given the earliest expiry of the Cluster's Machines.
    pub fn due_at(&self, earliest_expiry: time::OffsetDateTime) -> time::OffsetDateTime {
        let before =
            time::Duration::try_from(self.before.approximate()).unwrap_or(time::Duration::MAX);
        earliest_expiry
            .checked_sub(before)
            .unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
    }
}

#[cfg(test)]
mod auto_refresh_tests {
    use super::AutoRefresh;
    use time::macros::datetime;

    #[test]
    fn parses_and_rejects_naming_the_value() {
        let auto = AutoRefresh::parse("ttl=1y, before=30d").unwrap();
        assert_eq!(auto.ttl.to_string(), "1y");
        assert_eq!(
            auto.due_at(datetime!(2026-02-01 0:00 UTC)),
            datetime!(2026-01-02 0:00 UTC)
        );
        for bad in [
            "ttl=1y",
            "before=30d",
            "ttl=1y,before=soon",
            "ttl=1y;before=30d",
            "ttl=1y,after=3d",
            "",
        ] {
            let err = AutoRefresh::parse(bad).unwrap_err();
            assert!(err.contains(&format!("{bad:?}")), "{err}");
        }
    }
}
