//! A Cluster's request, as the upstream proposals (002 and 004) specify it: the Cluster places
//! the same trigger on its `CK8sControlPlane`, waits for that object's status to become `done`
//! or `failed`, then does the same with each `MachineDeployment` in name order, and ends from
//! theirs. It never touches a Machine itself: each child's own rollout does, and each level
//! shows its status, progress and events.
//!
//! caretaker adds: the Cluster's `caretaker.dev/max-parallel` is a budget of workers for the
//! whole Cluster (one by default), shared out to the MachineDeployments in name order, so more
//! than one runs at once only when the budget allows; the Cluster's request id marks each child
//! request it placed ([`names::OperationNames::cluster_request`]), so removing the Cluster's
//! trigger cancels exactly those, and a user's own request on a child is told apart: the
//! Cluster waits for it to end (never preempts it).

use std::sync::Arc;
use std::time::Duration;

use super::parent::{
    ChildWrite, ParentChanges, ParentKind, ParentView, Rollout, no_work_here, observe,
    requested_at, requester,
};
use super::{MachineObservation, MachineProgress, Progress, RolloutPlan, Waiting};
use crate::changes::{AnnotationChanges, Event};
use crate::machine::MachineView;
use crate::schedule::Next;
use caretaker_api::names::{self, Operation, rollout_state};

/// Where a child stands with respect to *this* Cluster request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildState {
    /// No request on it: the Cluster may place its own.
    Free,
    /// Another request (a user's, or another Cluster request's) has not ended on it.
    Busy,
    /// The Cluster placed its request and it has not ended.
    Running,
    Done,
    /// It ended `failed`, or `cancelled` though the Cluster's request was not.
    Failed,
    /// It ended `cancelled` after the Cluster's request was cancelled (or never started).
    Cancelled,
}

/// One child of the Cluster as the chain needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildObservation {
    pub kind: ParentKind,
    pub name: String,
    pub state: ChildState,
    /// For a MachineDeployment: its own `max-parallel` (malformed counts as 1), if set.
    pub own_limit: Option<usize>,
    /// For a running MachineDeployment: the share of the Cluster's budget it was given.
    pub share: usize,
    /// Its Machines' progress for its request (placed) or its Machines (not yet placed).
    pub progress: Progress,
    /// Why it failed, in words, when known.
    pub failure: Option<String>,
}

impl ChildObservation {
    /// `Kind/name`.
    pub fn object(&self) -> String {
        format!("{}/{}", self.kind.api_resource().kind, self.name)
    }
}

/// A Cluster request and its children: the control plane first (if any), then the
/// MachineDeployments in name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainInput {
    pub cancelled: bool,
    /// The Cluster's budget of workers at once (at least 1).
    pub max_parallel: usize,
    pub children: Vec<ChildObservation>,
}

/// A child the Cluster places its request on now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Index in [`ChainInput::children`].
    pub child: usize,
    /// For a MachineDeployment: workers it may run at once for the Cluster.
    pub share: Option<usize>,
}

/// The decision for one pass over a Cluster request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainPlan {
    Continue {
        place: Vec<Placement>,
        /// Children (indexes) whose request the Cluster placed and now cancels.
        cancel: Vec<usize>,
        waiting: Option<Waiting>,
        progress: Progress,
    },
    Done {
        progress: Progress,
    },
    /// A child failed; others the Cluster placed still run.
    Stopping {
        child: String,
        reason: String,
        running: Vec<String>,
        progress: Progress,
    },
    Failed {
        child: String,
        reason: String,
        progress: Progress,
    },
    Cancelled {
        progress: Progress,
    },
}

impl ChainPlan {
    pub fn progress(&self) -> Progress {
        match self {
            ChainPlan::Continue { progress, .. }
            | ChainPlan::Done { progress }
            | ChainPlan::Stopping { progress, .. }
            | ChainPlan::Failed { progress, .. }
            | ChainPlan::Cancelled { progress } => *progress,
        }
    }

    pub fn decide(input: &ChainInput) -> ChainPlan {
        let children = &input.children;
        let mut progress = Progress::default();
        for child in children {
            progress.done += child.progress.done;
            progress.total += child.progress.total;
            progress.skipped += child.progress.skipped;
            progress.running += child.progress.running;
        }
        let running: Vec<usize> = (0..children.len())
            .filter(|i| children[*i].state == ChildState::Running)
            .collect();
        let failed = children.iter().find(|c| {
            c.state == ChildState::Failed || (c.state == ChildState::Cancelled && !input.cancelled)
        });
        if let Some(failed) = failed {
            let reason = match &failed.failure {
                Some(reason) => reason.clone(),
                None => format!("its request ended {:?}", failed.state).to_lowercase(),
            };
            let names: Vec<String> = running.iter().map(|i| children[*i].object()).collect();
            return if names.is_empty() {
                ChainPlan::Failed {
                    child: failed.object(),
                    reason,
                    progress,
                }
            } else {
                ChainPlan::Stopping {
                    child: failed.object(),
                    reason,
                    running: names,
                    progress,
                }
            };
        }
        if input.cancelled {
            return if running.is_empty() {
                ChainPlan::Cancelled { progress }
            } else {
                ChainPlan::Continue {
                    place: Vec::new(),
                    cancel: running,
                    waiting: None,
                    progress,
                }
            };
        }
        if children.iter().all(|c| c.state == ChildState::Done) {
            return ChainPlan::Done { progress };
        }
        let wait = |waiting: Option<Waiting>| ChainPlan::Continue {
            place: Vec::new(),
            cancel: Vec::new(),
            waiting,
            progress,
        };
        // The control plane first, alone.
        if let Some((i, plane)) = children
            .iter()
            .enumerate()
            .find(|(_, c)| c.kind == ParentKind::ControlPlane && c.state != ChildState::Done)
        {
            return match plane.state {
                ChildState::Free => ChainPlan::Continue {
                    place: vec![Placement {
                        child: i,
                        share: None,
                    }],
                    cancel: Vec::new(),
                    waiting: None,
                    progress,
                },
                ChildState::Busy => wait(Some(Waiting::ForRequest(plane.object()))),
                _ => wait(None),
            };
        }
        // Then the MachineDeployments in name order, while the budget has room.
        let budget = input.max_parallel.max(1);
        let used: usize = running.iter().map(|i| children[*i].share.max(1)).sum();
        let mut room = budget.saturating_sub(used);
        let mut place = Vec::new();
        let mut waiting = None;
        for (i, child) in children.iter().enumerate() {
            match child.state {
                ChildState::Done | ChildState::Running => continue,
                ChildState::Busy => {
                    if running.is_empty() && place.is_empty() {
                        waiting = Some(Waiting::ForRequest(child.object()));
                    }
                    break;
                }
                _ if room == 0 => break,
                _ => {
                    let share = child.own_limit.unwrap_or(room).clamp(1, room);
                    room -= share;
                    place.push(Placement {
                        child: i,
                        share: Some(share),
                    });
                }
            }
        }
        ChainPlan::Continue {
            place,
            cancel: Vec::new(),
            waiting,
            progress,
        }
    }
}

/// How `child` stands for the Cluster request `cluster_request` of `operation`.
pub fn child_state(operation: Operation, cluster_request: &str, child: &ParentView) -> ChildState {
    let names = operation.names();
    let status = child.annotation(names.status);
    let trigger = child.annotation(names.trigger);
    if child.annotation(names.cluster_request) == Some(cluster_request) {
        return match status {
            Some(names::STATUS_IN_PROGRESS) => ChildState::Running,
            Some(names::STATUS_DONE) => ChildState::Done,
            Some(names::STATUS_FAILED) => ChildState::Failed,
            Some(names::STATUS_CANCELLED) => ChildState::Cancelled,
            // Placed and not yet taken up, or its trigger removed before it was.
            _ if trigger.is_some() => ChildState::Running,
            _ => ChildState::Cancelled,
        };
    }
    let ended = matches!(
        status,
        Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED)
    );
    if status == Some(names::STATUS_IN_PROGRESS) || (trigger.is_some() && !ended) {
        ChildState::Busy
    } else {
        ChildState::Free
    }
}

/// What [`ChainPlan::decide`] needs, from the Cluster `cluster`'s children (control plane
/// first, then MachineDeployments in name order) and the Cluster's Machines.
///
/// A child's annotations are written by whoever may write the child, so the chain takes from
/// them only what that writer could bring about anyway (a wait, a failure), never the
/// Cluster's success: a child is the Cluster's only if it names the Cluster as its own, and
/// its `done` counts only when its Machines confirm it ([`unconfirmed_done`]). Either failing,
/// the child counts as failed, and the Cluster's request ends `failed` naming it.
pub fn observe_children(
    operation: Operation,
    cluster: &str,
    cluster_request: &str,
    max_parallel: usize,
    cancelled: bool,
    children: &[ParentView],
    machines: &[Arc<MachineView>],
) -> ChainInput {
    let names = operation.names();
    let children = children
        .iter()
        .map(|child| {
            let mut state = child_state(operation, cluster_request, child);
            let covered: Vec<Arc<MachineView>> = machines
                .iter()
                .filter(|m| child.kind.covers(&child.name, m))
                .cloned()
                .collect();
            let placed = !matches!(state, ChildState::Free | ChildState::Busy);
            let request = child
                .annotation(names.rollout_request)
                .filter(|_| placed)
                .unwrap_or_default();
            let observed = observe(operation, request, &covered, &no_work_here);
            let progress = Progress::of(&observed);
            let mut failure = observed
                .iter()
                .find(|m| placed && m.progress == MachineProgress::Failed)
                .map(|m| {
                    format!(
                        "Machine {} failed: {}",
                        m.name,
                        m.failure.as_deref().unwrap_or("unknown")
                    )
                });
            let object = format!("{}/{}", child.kind.api_resource().kind, child.name);
            if child.cluster.as_deref() != Some(cluster) {
                // Nothing is placed on it, and the request does not go on without it.
                state = ChildState::Failed;
                failure = Some(match &child.cluster {
                    Some(other) => format!(
                        "it belongs to Cluster {other}, not to {cluster}; nothing was placed on it"
                    ),
                    None => format!(
                        "it names no Cluster as its own (no spec.clusterName, owner Cluster or {} label); nothing was placed on it",
                        names::CLUSTER_NAME_LABEL
                    ),
                });
            } else if state == ChildState::Done
                && let Some(reason) =
                    unconfirmed_done(&object, request, cluster_request, &covered, &observed)
            {
                state = ChildState::Failed;
                failure = Some(reason);
            }
            let limit = |value: Option<&str>| {
                value.map(|v| v.parse::<usize>().ok().filter(|n| *n >= 1).unwrap_or(1))
            };
            ChildObservation {
                kind: child.kind,
                name: child.name.clone(),
                state,
                own_limit: limit(child.annotation(names::MAX_PARALLEL)),
                share: limit(child.annotation(rollout_state::CLUSTER_MAX_PARALLEL)).unwrap_or(1),
                progress,
                failure,
            }
        })
        .collect();
    ChainInput {
        cancelled,
        max_parallel,
        children,
    }
}

/// Why a child `object` that says `done` for Cluster request `cluster_request` is not believed,
/// if it is not. Its status and request id are only annotations on it; the Machines it covers
/// (`covered`, observed for its `request` as `observed`) are written by the Machine controller.
/// So its `done` counts only if its request id is its own and no older than the Cluster's
/// request (an earlier request's finished Machines prove nothing about this one), and every
/// Machine it covers is done for that request, except Machines the API server created after
/// the request began (a MachineDeployment scaled up after it finished).
fn unconfirmed_done(
    object: &str,
    request: &str,
    cluster_request: &str,
    covered: &[Arc<MachineView>],
    observed: &[MachineObservation],
) -> Option<String> {
    if requester(request) != Some(object) || requested_at(request) < requested_at(cluster_request) {
        return Some(format!(
            "it says done, but its request ({request:?}) is not one it began for this Cluster request; no Machine of it was done for this request"
        ));
    }
    // Creation times have whole seconds: a Machine created in the second the request began
    // may have existed before it, so it must be done too.
    let began = requested_at(request).div_euclid(1_000_000_000);
    let missing: Vec<&str> = covered
        .iter()
        .zip(observed)
        .filter(|(view, seen)| {
            seen.counted()
                && seen.progress != MachineProgress::Done
                && view
                    .created_at
                    .is_none_or(|created| i128::from(created) <= began)
        })
        .map(|(_, seen)| seen.name.as_str())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "it says done, but its request {request} did not finish {}",
            missing.join(", ")
        )
    })
}

/// The changes that carry out a Cluster's `plan` for request `rollout`: the trigger
/// placed on (or removed from) its children, then what [`Rollout::changes`] writes on the
/// parent for the same end, progress or wait.
pub fn changes(
    rollout: &Rollout,
    cluster: &ParentView,
    children: &[ParentView],
    plan: &ChainPlan,
    retry_base: Duration,
) -> ParentChanges {
    let as_rollout = match plan.clone() {
        ChainPlan::Continue {
            waiting, progress, ..
        } => RolloutPlan::Continue {
            start: Vec::new(),
            waiting,
            progress,
        },
        ChainPlan::Done { progress } => RolloutPlan::Done { progress },
        ChainPlan::Stopping {
            child,
            reason,
            running,
            progress,
        } => RolloutPlan::Stopping {
            machine: child,
            reason,
            running,
            progress,
        },
        ChainPlan::Failed {
            child,
            reason,
            progress,
        } => RolloutPlan::Failed {
            machine: child,
            reason,
            progress,
        },
        ChainPlan::Cancelled { progress } => RolloutPlan::Cancelled { progress },
    };
    let mut changes = rollout.changes(cluster, &[], &as_rollout, retry_base);
    if matches!(
        plan,
        ChainPlan::Continue { .. } | ChainPlan::Stopping { .. }
    ) {
        // The children's watches wake the Cluster; should one change be missed, it is
        // looked at again anyway while the request runs.
        changes.next = changes
            .next
            .sooner(Next::After(retry_base.max(Duration::from_secs(1))));
    }
    let ChainPlan::Continue { place, cancel, .. } = plan else {
        return changes;
    };
    let names = rollout.operation.names();
    let value = rollout.trigger.as_deref().unwrap_or_default();
    for placement in place {
        let Some(child) = children.get(placement.child) else {
            continue;
        };
        let mut annotations = AnnotationChanges::default();
        annotations
            .set(names.trigger, value)
            .set(names.cluster_request, rollout.request_id.as_str());
        // An ended earlier request's status would read as this one's result.
        if child.annotation(names.status).is_some() {
            annotations.remove(names.status);
        }
        match placement.share {
            Some(share) => annotations.set(rollout_state::CLUSTER_MAX_PARALLEL, share.to_string()),
            None => annotations.remove(rollout_state::CLUSTER_MAX_PARALLEL),
        };
        let object = format!("{}/{}", child.kind.api_resource().kind, child.name);
        changes.events.push(Event::normal(
            names.rollout_events.in_progress,
            format!(
                "{} = {value} placed on {object}; its status decides what comes next",
                names.trigger
            ),
        ));
        changes.children.push(ChildWrite {
            kind: child.kind,
            name: child.name.clone(),
            resource_version: child.resource_version.clone(),
            annotations,
        });
    }
    for index in cancel {
        let Some(child) = children.get(*index) else {
            continue;
        };
        if child.annotation(names.trigger).is_none() {
            continue;
        }
        changes.children.push(ChildWrite {
            kind: child.kind,
            name: child.name.clone(),
            resource_version: child.resource_version.clone(),
            annotations: AnnotationChanges::removing(&[names.trigger]),
        });
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use ChildState::*;

    fn child(kind: ParentKind, name: &str, state: ChildState) -> ChildObservation {
        ChildObservation {
            kind,
            name: name.into(),
            state,
            own_limit: None,
            share: 1,
            progress: Progress::default(),
            failure: None,
        }
    }

    fn md(name: &str, state: ChildState) -> ChildObservation {
        child(ParentKind::MachineDeployment, name, state)
    }

    fn plane(state: ChildState) -> ChildObservation {
        child(ParentKind::ControlPlane, "cp", state)
    }

    fn placed(plan: &ChainPlan) -> Vec<(usize, Option<usize>)> {
        match plan {
            ChainPlan::Continue { place, .. } => place.iter().map(|p| (p.child, p.share)).collect(),
            _ => Vec::new(),
        }
    }

    fn input(max_parallel: usize, children: Vec<ChildObservation>) -> ChainInput {
        ChainInput {
            cancelled: false,
            max_parallel,
            children,
        }
    }

    #[test]
    fn the_control_plane_first_then_deployments_in_name_order_within_the_budget() {
        let children = vec![plane(Free), md("a", Free), md("b", Free)];
        assert_eq!(placed(&ChainPlan::decide(&input(3, children))), [(0, None)]);
        let children = vec![plane(Running), md("a", Free), md("b", Free)];
        assert_eq!(placed(&ChainPlan::decide(&input(3, children))), []);
        // One at a time by default.
        let children = vec![plane(Done), md("a", Free), md("b", Free)];
        assert_eq!(
            placed(&ChainPlan::decide(&input(1, children))),
            [(1, Some(1))]
        );
        // A budget of 3: a's own limit of 1 leaves 2 for b.
        let mut a = md("a", Free);
        a.own_limit = Some(1);
        let children = vec![plane(Done), a, md("b", Free)];
        assert_eq!(
            placed(&ChainPlan::decide(&input(3, children))),
            [(1, Some(1)), (2, Some(2))]
        );
        // Without: a takes the whole budget, b waits.
        let children = vec![plane(Done), md("a", Free), md("b", Free)];
        assert_eq!(
            placed(&ChainPlan::decide(&input(3, children))),
            [(1, Some(3))]
        );
    }

    #[test]
    fn a_user_request_on_a_child_is_waited_for_never_preempted() {
        let plan = ChainPlan::decide(&input(1, vec![plane(Busy), md("a", Free)]));
        assert_eq!(
            plan,
            ChainPlan::Continue {
                place: vec![],
                cancel: vec![],
                waiting: Some(Waiting::ForRequest("CK8sControlPlane/cp".into())),
                progress: Progress::default(),
            }
        );
    }

    #[test]
    fn a_failed_child_fails_the_cluster_once_the_others_have_ended() {
        let mut failed = md("a", Failed);
        failed.failure = Some("Machine w-0 failed: boom".into());
        let stopping = ChainPlan::decide(&input(
            2,
            vec![plane(Done), failed.clone(), md("b", Running)],
        ));
        assert!(
            matches!(stopping, ChainPlan::Stopping { .. }),
            "{stopping:?}"
        );
        let plan = ChainPlan::decide(&input(2, vec![plane(Done), failed, md("b", Done)]));
        let ChainPlan::Failed { child, reason, .. } = plan else {
            panic!("{plan:?}");
        };
        assert_eq!(child, "MachineDeployment/a");
        assert!(
            reason.contains("w-0") && reason.contains("boom"),
            "{reason}"
        );
    }

    #[test]
    fn cancel_cancels_the_placed_children_then_ends() {
        let running = ChainInput {
            cancelled: true,
            ..input(1, vec![plane(Done), md("a", Running), md("b", Free)])
        };
        let plan = ChainPlan::decide(&running);
        assert!(
            matches!(&plan, ChainPlan::Continue { cancel, place, .. } if cancel == &[1] && place.is_empty())
        );
        let ended = ChainInput {
            cancelled: true,
            ..input(1, vec![plane(Done), md("a", Cancelled), md("b", Free)])
        };
        assert!(matches!(
            ChainPlan::decide(&ended),
            ChainPlan::Cancelled { .. }
        ));
    }

    // Forgeries by someone who may write a child (a MachineDeployment, a CK8sControlPlane)
    // but not the Cluster or its Machines.

    /// Made at 500 s; the Machines were created at 100 s.
    const CLUSTER_REQUEST: &str = "Cluster/c1/746a528800";
    const UPGRADE: Operation = Operation::InPlaceUpgrade;

    fn view(kind: ParentKind, name: &str, annotations: &[(&str, &str)]) -> ParentView {
        ParentView {
            kind,
            name: name.into(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            deployment_limits: Default::default(),
            resource_version: Some("1".into()),
            progress_age: None,
            cluster: Some("c1".into()),
        }
    }

    fn cluster_rollout() -> (Rollout, ParentView) {
        let names = UPGRADE.names();
        let cluster = view(
            ParentKind::Cluster,
            "c1",
            &[
                (names.trigger, "revision=2"),
                (names.status, names::STATUS_IN_PROGRESS),
                (names.rollout_request, CLUSTER_REQUEST),
                (names.rollout_trigger, "revision=2"),
            ],
        );
        let rollout = Rollout {
            operation: UPGRADE,
            request_id: CLUSTER_REQUEST.into(),
            trigger: Some("revision=2".into()),
            refused: None,
        };
        (rollout, cluster)
    }

    /// A worker of MachineDeployment `md` with these upgrade annotations.
    fn worker(name: &str, md: &str, annotations: &[(&str, &str)]) -> Arc<MachineView> {
        let mut m = crate::machine::test_machine(annotations);
        m.name = name.into();
        m.labels
            .insert(names::DEPLOYMENT_NAME_LABEL.into(), md.into());
        m.created_at = Some(100);
        Arc::new(m)
    }

    /// A MachineDeployment `md` that says its request `request` ended `done` for the Cluster.
    fn says_done(request: &str) -> ParentView {
        let names = UPGRADE.names();
        view(
            ParentKind::MachineDeployment,
            "md",
            &[
                (names.status, names::STATUS_DONE),
                (names.cluster_request, CLUSTER_REQUEST),
                (names.rollout_request, request),
            ],
        )
    }

    /// The Cluster's pass over its one MachineDeployment and these Machines.
    fn cluster_pass(
        child: ParentView,
        machines: &[Arc<MachineView>],
    ) -> (ChainPlan, ParentChanges) {
        let (rollout, cluster) = cluster_rollout();
        let children = [child];
        let input = observe_children(
            UPGRADE,
            "c1",
            CLUSTER_REQUEST,
            1,
            false,
            &children,
            machines,
        );
        let plan = ChainPlan::decide(&input);
        let changes = changes(&rollout, &cluster, &children, &plan, Duration::from_secs(1));
        (plan, changes)
    }

    fn done_for(request: &'static str) -> [(&'static str, &'static str); 2] {
        let names = UPGRADE.names();
        [
            (names.status, names::STATUS_DONE),
            (names.rollout_request, request),
        ]
    }

    #[test]
    fn a_child_that_says_done_is_believed_only_when_its_machines_were_done_by_its_request() {
        let names = UPGRADE.names();
        let own = "MachineDeployment/md/8bb2c97000"; // 600 s
        // Forged: the Cluster's mark and `done`, and an id of the child's own, but its Machines
        // were never upgraded.
        let untouched = [worker("w-0", "md", &[]), worker("w-1", "md", &[])];
        let (plan, changes) = cluster_pass(says_done(own), &untouched);
        let ChainPlan::Failed { child, reason, .. } = &plan else {
            panic!("a forged done ends the Cluster's request failed: {plan:?}");
        };
        assert_eq!(child, "MachineDeployment/md");
        assert!(reason.contains("w-0, w-1"), "{reason}");
        assert_eq!(
            changes.parent.get(names.status),
            Some(Some(names::STATUS_FAILED))
        );
        assert_eq!(
            changes.parent.get(names.release.unwrap()),
            None,
            "no release is claimed for the Cluster"
        );

        // Forged with the id of an earlier request of the child, whose Machines are done:
        // they prove nothing about this Cluster request.
        let old = "MachineDeployment/md/2e90edd000"; // 200 s
        let done_before = [
            worker("w-0", "md", &done_for("MachineDeployment/md/2e90edd000")),
            worker("w-1", "md", &done_for("MachineDeployment/md/2e90edd000")),
        ];
        let (plan, _) = cluster_pass(says_done(old), &done_before);
        assert!(matches!(plan, ChainPlan::Failed { .. }), "{plan:?}");
        // ... nor another object's request.
        let (plan, _) = cluster_pass(says_done("MachineDeployment/other/8bb2c97000"), &untouched);
        assert!(matches!(plan, ChainPlan::Failed { .. }), "{plan:?}");

        // Genuine: its request began after the Cluster's, and did every Machine; a Machine the
        // API server created after that request began (a scale-up) does not count against it.
        let mut scaled_up = (*worker("w-2", "md", &[])).clone();
        scaled_up.created_at = Some(1001);
        let done = [
            worker("w-0", "md", &done_for("MachineDeployment/md/e8d4a51000")),
            worker("w-1", "md", &done_for("MachineDeployment/md/e8d4a51000")),
            Arc::new(scaled_up.clone()),
        ];
        let (plan, changes) = cluster_pass(says_done("MachineDeployment/md/e8d4a51000"), &done);
        assert!(matches!(plan, ChainPlan::Done { .. }), "{plan:?}");
        assert_eq!(
            changes.parent.get(names.release.unwrap()),
            Some(Some("revision=2"))
        );
        // One created in the second the request began may have existed before it: not done,
        // not believed.
        scaled_up.created_at = Some(1000);
        let not_done = [done[0].clone(), done[1].clone(), Arc::new(scaled_up)];
        let (plan, _) = cluster_pass(says_done("MachineDeployment/md/e8d4a51000"), &not_done);
        assert!(matches!(plan, ChainPlan::Failed { .. }), "{plan:?}");
    }

    #[test]
    fn another_clusters_control_plane_gets_no_trigger_and_fails_the_request() {
        let (rollout, cluster) = cluster_rollout();
        for claim in [Some("c2"), None] {
            // Cluster c1's `controlPlaneRef` names a control plane that names c2 (or nothing).
            let mut plane = view(ParentKind::ControlPlane, "c2-control-plane", &[]);
            plane.cluster = claim.map(str::to_string);
            let children = [plane, view(ParentKind::MachineDeployment, "md", &[])];
            let input = observe_children(UPGRADE, "c1", CLUSTER_REQUEST, 1, false, &children, &[]);
            let plan = ChainPlan::decide(&input);
            let ChainPlan::Failed { child, reason, .. } = &plan else {
                panic!("{claim:?}: {plan:?}");
            };
            assert_eq!(child, "CK8sControlPlane/c2-control-plane");
            assert!(reason.contains("nothing was placed"), "{reason}");
            let changes = changes(&rollout, &cluster, &children, &plan, Duration::from_secs(1));
            assert!(changes.children.is_empty(), "{:?}", changes.children);
        }
    }

    /// Forged shares: a MachineDeployment's `caretaker.dev/cluster-max-parallel` is read back
    /// as the room it takes, so a share written larger than the Cluster gave keeps the Cluster
    /// from placing any other MachineDeployment beyond its budget (the excess is the writer's
    /// own workers, which its own request could run at any width), and one written smaller
    /// narrows only that MachineDeployment.
    #[test]
    fn a_forged_share_widens_only_its_own_machine_deployment() {
        let mut a = md("a", Running);
        a.share = 50;
        let plan = ChainPlan::decide(&input(2, vec![plane(Done), a, md("b", Free)]));
        assert_eq!(placed(&plan), []);
        let mut a = md("a", Running);
        a.share = 1;
        let plan = ChainPlan::decide(&input(2, vec![plane(Done), a, md("b", Free)]));
        assert_eq!(placed(&plan), [(2, Some(1))], "b gets only what a leaves");
    }

    proptest::proptest! {
        /// Whatever someone who may write the MachineDeployment (not its Machines) puts on it,
        /// the Cluster's request ends `done` only if every Machine of it that existed when the
        /// child's request began was done by that request, a request of the child's own begun
        /// after the Cluster's.
        #[test]
        fn no_forgery_on_a_child_makes_the_cluster_done_for_machines_nobody_did(
            status in proptest::option::of(proptest::sample::select(vec![
                names::STATUS_IN_PROGRESS, names::STATUS_DONE, names::STATUS_FAILED, names::STATUS_CANCELLED,
            ])),
            mark in proptest::option::of(proptest::sample::select(vec![CLUSTER_REQUEST, "Cluster/c1/2e90edd000"])),
            request in proptest::option::of(proptest::sample::select(REQUESTS.to_vec())),
            trigger in proptest::bool::ANY,
            machines in proptest::collection::vec(
                (
                    proptest::option::of(proptest::sample::select(REQUESTS.to_vec())),
                    proptest::option::of(proptest::sample::select(vec![
                        names::STATUS_DONE, names::STATUS_IN_PROGRESS, names::STATUS_FAILED,
                    ])),
                    proptest::bool::ANY,
                    proptest::sample::select(vec![100i64, 600, 700]),
                ),
                0..4,
            ),
        ) {
            let names = UPGRADE.names();
            let mut annotations: Vec<(&str, &str)> = Vec::new();
            annotations.extend(status.map(|s| (names.status, s)));
            annotations.extend(mark.map(|m| (names.cluster_request, m)));
            annotations.extend(request.map(|r| (names.rollout_request, r)));
            if trigger {
                annotations.push((names.trigger, "revision=2"));
            }
            let child = view(ParentKind::MachineDeployment, "md", &annotations);
            let machines: Vec<Arc<MachineView>> = machines
                .iter()
                .enumerate()
                .map(|(i, (tag, status, trigger, created))| {
                    let mut a: Vec<(&str, &str)> = Vec::new();
                    a.extend(tag.map(|t| (names.rollout_request, t)));
                    a.extend(status.map(|s| (names.status, s)));
                    if *trigger {
                        a.push((names.trigger, "revision=2"));
                    }
                    let mut m = (*worker(&format!("w-{i}"), "md", &a)).clone();
                    m.created_at = Some(*created);
                    Arc::new(m)
                })
                .collect();
            let (plan, _) = cluster_pass(child, &machines);
            if matches!(plan, ChainPlan::Done { .. }) {
                let request = request.unwrap_or_default();
                proptest::prop_assert!(request.starts_with("MachineDeployment/md/"));
                proptest::prop_assert!(requested_at(request) >= requested_at(CLUSTER_REQUEST));
                let began = requested_at(request) / 1_000_000_000;
                for m in machines.iter().filter(|m| i128::from(m.created_at.unwrap()) <= began) {
                    proptest::prop_assert_eq!(m.annotation(names.rollout_request), Some(request));
                    proptest::prop_assert_eq!(m.annotation(names.status), Some(names::STATUS_DONE));
                    proptest::prop_assert_eq!(m.annotation(names.trigger), None);
                }
            }
        }
    }

    /// Request ids a forger may pick: the child's own at 600 s (after the Cluster's, at 500 s),
    /// its own at 200 s (before), and another object's at 600 s.
    const REQUESTS: [&str; 3] = [
        "MachineDeployment/md/8bb2c97000",
        "MachineDeployment/md/2e90edd000",
        "MachineDeployment/other/8bb2c97000",
    ];
}
