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
#[cfg(test)]
mod tests;

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
        if let Some(other) = &input.blocked_by {
            return RolloutPlan::Continue {
                start: Vec::new(),
                waiting: Some(Waiting::ForRequest(other.clone())),
                progress,
            };
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
            return Self::next_on_control_plane(&machines, &control_plane, progress);
        }
        Self::next_on_workers(input, &covered, progress)
    }

    /// The next step while the control plane is not done: one Machine at a time, across all
    /// requests, and only while every control-plane Machine is sound.
    fn next_on_control_plane(
        machines: &[&MachineObservation],
        control_plane: &[&MachineObservation],
        progress: Progress,
    ) -> RolloutPlan {
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
            return RolloutPlan::Continue {
                start: Vec::new(),
                waiting: Some(Waiting::ForRequest(holder)),
                progress,
            };
        }
        // Every control-plane Machine, not only the next one, must be sound: a refresh
        // restarts components, and etcd needs its quorum while one member does.
        let unhealthy: Vec<String> = machines
            .iter()
            .filter(|m| {
                m.role == Role::ControlPlane && !m.being_deleted && !(m.has_node && m.agent_healthy)
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
        RolloutPlan::Continue {
            start: vec![next.name.clone()],
            waiting: None,
            progress,
        }
    }

    /// The next step once the control plane is done: workers, `max_parallel` at a time and no
    /// more of one MachineDeployment than its own limit.
    fn next_on_workers(
        input: &RolloutInput,
        covered: &[&MachineObservation],
        progress: Progress,
    ) -> RolloutPlan {
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
