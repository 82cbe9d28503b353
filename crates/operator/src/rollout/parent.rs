//! One pass of a rollout controller over a parent (Cluster, CK8sControlPlane,
//! MachineDeployment) for one operation, as pure functions. The parent's annotations decide the
//! [`ParentStep`]: nothing, forget an ended request, reject or start a new one, or roll a running
//! one; a running request's [`RolloutPlan`] becomes the [`ParentChanges`] that carry it out
//! (Machines to start, annotations on the parent, events). The controller observes the parent
//! and its Machines, and applies the changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use caretaker_agent_api::upgrade::ReleaseOption;
use caretaker_pki::Ttl;
use kube::api::ApiResource;
use time::OffsetDateTime;

use super::{
    AutoRefresh, MachineObservation, MachineProgress, RequestState, Role, RolloutInput, RolloutPlan,
};
use crate::changes::{AnnotationChanges, Event};
use crate::machine::MachineView;
use crate::schedule::Next;
use crate::timestamp::parse_time;
use caretaker_api::names::{self, Operation, rollout_state};

/// The kinds a rollout can be asked on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParentKind {
    Cluster,
    ControlPlane,
    MachineDeployment,
}

impl ParentKind {
    /// Each with its own controller.
    pub const ALL: [ParentKind; 3] = [
        ParentKind::Cluster,
        ParentKind::ControlPlane,
        ParentKind::MachineDeployment,
    ];

    pub fn api_resource(self) -> ApiResource {
        match self {
            ParentKind::Cluster => caretaker_api::cluster_api::cluster_api_resource(),
            ParentKind::ControlPlane => caretaker_api::cluster_api::control_plane_api_resource(),
            ParentKind::MachineDeployment => {
                caretaker_api::cluster_api::machine_deployment_api_resource()
            }
        }
    }

    /// The name of the parent of this kind a Machine belongs to, if any.
    pub fn parent_of(self, m: &MachineView) -> Option<&str> {
        let name = match self {
            ParentKind::Cluster => Some(m.cluster_name.as_str()),
            ParentKind::MachineDeployment => m
                .labels
                .get(names::DEPLOYMENT_NAME_LABEL)
                .map(String::as_str),
            ParentKind::ControlPlane => m
                .labels
                .get(names::CONTROL_PLANE_NAME_LABEL)
                .map(String::as_str),
        };
        name.filter(|n| !n.is_empty())
    }

    /// Whether the parent of this kind named `parent` covers the Machine: a Cluster all its
    /// Machines, a control plane its control-plane Machines, a MachineDeployment its workers.
    /// A MachineDeployment never covers a control-plane Machine, whatever its labels say: one
    /// that carries the control-plane label or is controlled by a control plane is left out,
    /// so that only the control plane's own request (one Machine at a time) touches it.
    pub fn covers(self, parent: &str, m: &MachineView) -> bool {
        match self {
            ParentKind::Cluster => m.cluster_name == parent,
            ParentKind::MachineDeployment => {
                m.labels
                    .get(names::DEPLOYMENT_NAME_LABEL)
                    .map(String::as_str)
                    == Some(parent)
                    && !m.control_plane
                    && m.controller.as_ref().is_none_or(|owner| {
                        owner.group != caretaker_api::cluster_api::CONTROL_PLANE_GROUP
                    })
            }
            ParentKind::ControlPlane => {
                m.control_plane
                    && m.labels
                        .get(names::CONTROL_PLANE_NAME_LABEL)
                        .map(String::as_str)
                        == Some(parent)
            }
        }
    }
}

/// A parent as one pass observed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentView {
    pub kind: ParentKind,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    /// For a Cluster: the `caretaker.dev/max-parallel` values of its MachineDeployments that
    /// have one, by name, as written.
    pub deployment_limits: BTreeMap<String, String>,
    /// The version the pass saw it at (writes on a Cluster's children are made on it only).
    pub resource_version: Option<String>,
    /// How long ago this process last wrote the parent's progress; `None` if it has not since
    /// it started.
    pub progress_age: Option<Duration>,
    /// For a Cluster's child: the Cluster it names as its own (its `spec.clusterName`, its
    /// owner Cluster or its `cluster.x-k8s.io/cluster-name` label), if any. A Cluster places
    /// its request only on a child that names it: a Cluster's `controlPlaneRef` alone, written
    /// by whoever may write the Cluster, never makes another Cluster's control plane its own.
    pub cluster: Option<String>,
}

impl ParentView {
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }
}

/// What a pass does for one operation, from the parent's annotations alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParentStep {
    /// Nothing.
    Idle,
    /// No request on a Cluster that asks for automatic refresh: [`auto_refresh`] decides.
    AutoRefresh,
    /// Write these changes and nothing more: forget an ended request, or reject or start a new
    /// one.
    Write(ParentChanges),
    /// The request runs, or is being cancelled: its Machines decide.
    Roll(Rollout),
}

impl ParentStep {
    /// Decides the step of `operation` on `parent` at `now`.
    pub fn of(operation: Operation, parent: &ParentView, now: OffsetDateTime) -> ParentStep {
        let names = operation.names();
        let trigger = parent.annotation(names.trigger);
        let state = RequestState::of(
            trigger,
            parent.annotation(names.status),
            parent.annotation(names.rollout_trigger),
        );
        match state {
            // Not after a failure: its trigger is gone, and starting again at once would
            // repeat the failing rollout forever. A refresh asked for by hand (or the status
            // removed) lets it go on.
            RequestState::NoRequest
                if parent.kind == ParentKind::Cluster
                    && operation == Operation::RefreshCertificates
                    && parent.annotation(names.status) != Some(names::STATUS_FAILED)
                    && parent
                        .annotation(names::AUTO_REFRESH_CERTIFICATES)
                        .is_some() =>
            {
                ParentStep::AutoRefresh
            }
            RequestState::NoRequest | RequestState::Ended => ParentStep::Idle,
            RequestState::ForgetEnded => {
                ParentStep::Write(ParentChanges::writing(AnnotationChanges::removing(&[
                    names.rollout_trigger,
                ])))
            }
            RequestState::New { trigger } => {
                ParentStep::Write(match validate(operation, trigger) {
                    Err(reason) => reject(operation, trigger, reason),
                    Ok(()) => start(operation, parent, trigger, now),
                })
            }
            RequestState::InProgress => ParentStep::Roll(Rollout {
                operation,
                request_id: parent
                    .annotation(names.rollout_request)
                    .unwrap_or_default()
                    .to_string(),
                trigger: trigger.map(str::to_string),
                refused: None,
            }),
            // The running request goes on for the value it was started with.
            RequestState::Conflicting { trigger } => ParentStep::Roll(Rollout {
                operation,
                request_id: parent
                    .annotation(names.rollout_request)
                    .unwrap_or_default()
                    .to_string(),
                trigger: parent.annotation(names.rollout_trigger).map(str::to_string),
                refused: Some(trigger.to_string()),
            }),
        }
    }
}

/// Whether `value` is a trigger value the operation can carry out.
fn validate(operation: Operation, value: &str) -> Result<(), String> {
    match operation {
        Operation::RefreshCertificates => {
            value.parse::<Ttl>().map(|_| ()).map_err(|e| e.to_string())
        }
        Operation::InPlaceUpgrade => ReleaseOption::parse(value)
            .map(|_| ())
            .map_err(|e| e.to_string()),
    }
}

/// A new request with an unusable value ends `failed` at once; as every failed request, its
/// trigger goes and the value stays on record.
fn reject(operation: Operation, value: &str, reason: String) -> ParentChanges {
    let names = operation.names();
    let mut parent = AnnotationChanges::default();
    parent
        .set(names.status, names::STATUS_FAILED)
        .remove(names.rollout_trigger)
        .set(names.rollout_requested, value)
        .remove(names.trigger);
    ParentChanges {
        events: vec![Event::warning(names.rollout_events.failed, reason)],
        ..ParentChanges::writing(parent)
    }
}

/// A new request: a new id, `in-progress`, and a word about each limit it reads that is not one.
fn start(
    operation: Operation,
    parent: &ParentView,
    value: &str,
    now: OffsetDateTime,
) -> ParentChanges {
    let names = operation.names();
    let mut changes = AnnotationChanges::default();
    changes
        .set(names.status, names::STATUS_IN_PROGRESS)
        .set(names.rollout_request, request_id(parent, now))
        .set(names.rollout_trigger, value)
        .set(names.rollout_requested, value)
        .remove(rollout_state::WAITING)
        .remove(rollout_state::WAITING_FOR)
        .remove(rollout_state::REFUSED_TRIGGER);
    // A Cluster places its trigger with its mark and clears the status; a trigger beside a
    // status (or without the mark) is the user's own request, and an old mark is not its.
    let placed = parent.annotation(names.cluster_request).is_some()
        && parent.annotation(names.status).is_none();
    if !placed && parent.annotation(names.cluster_request).is_some() {
        changes.remove(names.cluster_request);
    }
    let note = format!(
        "rolling {} = {value} out over the Machines of {} {}",
        names.trigger,
        parent.kind.api_resource().kind,
        parent.name
    );
    let mut changes = ParentChanges {
        events: vec![Event::normal(names.rollout_events.in_progress, note)],
        ..ParentChanges::writing(changes)
    };
    // A new request names every malformed limit again, whatever an earlier one reported.
    changes.report_malformed_limits(parent, names.rollout_events.in_progress, "");
    changes
}

/// A new request's id: the object it was asked on (`Kind/name`), then when (hexadecimal
/// nanoseconds). A Machine tagged with it names the request it is busy with, and ids order
/// requests by age.
fn request_id(parent: &ParentView, now: OffsetDateTime) -> String {
    format!(
        "{}/{}/{:x}",
        parent.kind.api_resource().kind,
        parent.name,
        now.unix_timestamp_nanos()
    )
}

/// The object (`Kind/name`) a request id names, if it names one.
pub fn requester(request_id: &str) -> Option<&str> {
    request_id
        .rsplit_once('/')
        .map(|(object, _)| object)
        .filter(|object| object.contains('/'))
}

/// When a request was made (Unix nanoseconds), for ordering requests (ids that say nothing
/// count as oldest).
pub(super) fn requested_at(request_id: &str) -> i128 {
    let stamp = request_id.rsplit('/').next().unwrap_or_default();
    i128::from_str_radix(stamp, 16).unwrap_or(i128::MIN)
}

/// The older running request, among `overlapping`, that a request of `parent` with id
/// `request_id` must wait for, as its object (`Kind/name`). `overlapping` are the parents
/// whose Machines overlap `parent`'s: for a Cluster its control plane and MachineDeployments,
/// for those their Cluster, and `parent` itself (whose other operation overlaps). Of two
/// overlapping requests the older runs and the newer waits, so neither ever preempts the
/// other and the oldest running request never waits for another.
pub fn blocked_by(
    operation: Operation,
    parent: &ParentView,
    request_id: &str,
    overlapping: &[&ParentView],
) -> Option<String> {
    let mine = (requested_at(request_id), request_id);
    overlapping
        .iter()
        .flat_map(|other| Operation::ALL.map(|op| (*other, op)))
        .filter(|(other, op)| {
            !(other.kind == parent.kind && other.name == parent.name && *op == operation)
        })
        .filter_map(|(other, op)| {
            let names = op.names();
            (other.annotation(names.status) == Some(names::STATUS_IN_PROGRESS))
                .then(|| other.annotation(names.rollout_request))
                .flatten()
                .map(|id| ((requested_at(id), id), other))
        })
        .filter(|(theirs, _)| *theirs < mine)
        .min_by(|(a, _), (b, _)| a.cmp(b))
        .map(|(_, other)| format!("{}/{}", other.kind.api_resource().kind, other.name))
}

/// A `caretaker.dev/max-parallel` value, when it is a whole number of at least 1.
fn max_parallel(value: &str) -> Option<usize> {
    value.parse().ok().filter(|n| *n >= 1)
}

/// Whether a Machine's change from `old` to `new` can change what a parent's pass decides:
/// which parents cover it, its role, node and health check address, deletion, and the
/// annotations a pass reads. Other changes (the agent's plan id, attempt counts, a new
/// `resourceVersion` alone) do not wake the parents; a pass still reads the latest view.
pub fn matters_to_parents(old: &MachineView, new: &MachineView) -> bool {
    if is_a_start(old, new) {
        return false;
    }
    identity_changed(old, new)
        || PARENT_READS_ALWAYS
            .into_iter()
            .any(|key| old.annotation(key) != new.annotation(key))
        || Operation::ALL.into_iter().any(|op| {
            let names = op.names();
            status_as_parents_read_it(op, old) != status_as_parents_read_it(op, new)
                || [names.trigger, names.rollout_request, names.state.last_error]
                    .into_iter()
                    .any(|key| old.annotation(key) != new.annotation(key))
        })
}

/// Whether the change is exactly a start ([`MachineStart::for_request`]) on a Machine that had
/// no trigger for that operation. A start wakes no parent: the pass that wrote it decided with
/// it, and to every other request the Machine is now busy, so nothing another parent could do
/// becomes possible through it (a pass always reads the latest cache, and a start decided on
/// the older version is refused at that `resourceVersion`). At max-parallel 1 this halves a
/// MachineDeployment's passes, each of which reads every Machine it covers.
fn is_a_start(old: &MachineView, new: &MachineView) -> bool {
    if identity_changed(old, new) {
        return false;
    }
    Operation::ALL.into_iter().any(|op| {
        let names = op.names();
        let (Some(value), Some(request)) = (
            new.annotation(names.trigger),
            new.annotation(names.rollout_request),
        ) else {
            return false;
        };
        if old.annotation(names.trigger).is_some() {
            return false;
        }
        let mut started = old.annotations.clone();
        MachineStart::for_request(op, value, request, old)
            .annotations
            .apply_to(&mut started);
        started == new.annotations
    })
}

/// A Machine's status for `operation` as a parent's pass reads it: while its trigger is set,
/// `in-progress` reads as no status yet (the Machine runs either way, and a start leaves both
/// alone), so the Machine controller taking up a started Machine wakes no parent.
fn status_as_parents_read_it(operation: Operation, m: &MachineView) -> Option<&str> {
    let names = operation.names();
    let status = m.annotation(names.status);
    match status {
        Some(names::STATUS_IN_PROGRESS) if m.annotation(names.trigger).is_some() => None,
        other => other,
    }
}

/// Whether a Machine's change can change what a Cluster's pass decides: as
/// [`matters_to_parents`], without the Machine's own rollout state, and an expiry only when it
/// comes sooner. A Cluster's request goes through its children ([`super::chain`]), whose writes
/// wake it; the Machines' progress and failures reach its progress and events when they do (a
/// child writes changed progress within [`PROGRESS_INTERVAL`], and its end at once). An automatic refresh is due by the earliest expiry: a later one (each refreshed
/// Machine's) can only put it off, and the Cluster comes back when it was due anyway.
pub fn matters_to_clusters(old: &MachineView, new: &MachineView) -> bool {
    identity_changed(old, new)
        || old.annotation(names::AGENT_ENDPOINT) != new.annotation(names::AGENT_ENDPOINT)
        || expiry_came_sooner(old, new)
}

/// Whether the Machine's certificates expiry is now sooner than it was (or there was none).
fn expiry_came_sooner(old: &MachineView, new: &MachineView) -> bool {
    let expiry = |m: &MachineView| parse_time(m.annotation(names::CERTIFICATES_EXPIRY));
    expiry(new).is_some_and(|new| expiry(old).is_none_or(|old| new < old))
}

/// Which parents cover the Machine, its role, node and deletion.
fn identity_changed(old: &MachineView, new: &MachineView) -> bool {
    old.namespace != new.namespace
        || old.name != new.name
        || old.cluster_name != new.cluster_name
        || old.node_name != new.node_name
        || old.addresses != new.addresses
        || old.control_plane != new.control_plane
        || old.controller != new.controller
        || old.being_deleted != new.being_deleted
        || old.labels != new.labels
}

/// Machine annotations a pass reads whatever the operation: the expiry (automatic refresh) and
/// the agent's address (the control plane's health check).
const PARENT_READS_ALWAYS: [&str; 2] = [names::CERTIFICATES_EXPIRY, names::AGENT_ENDPOINT];

/// A request that runs on a parent, or is being cancelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    pub operation: Operation,
    pub request_id: String,
    /// The trigger value; `None` once the trigger was removed, which cancels the request.
    pub trigger: Option<String>,
    /// Another value the trigger now asks for, refused while this request runs.
    pub refused: Option<String>,
}

impl Rollout {
    /// Workers at once: the parent's own `max-parallel` (1 if unset or malformed), and no more
    /// than the share a Cluster request gave it, when a Cluster placed this request.
    pub fn max_parallel(&self, parent: &ParentView) -> usize {
        let own = parent
            .annotation(names::MAX_PARALLEL)
            .and_then(max_parallel)
            .unwrap_or(1);
        let placed = parent
            .annotation(self.operation.names().cluster_request)
            .is_some();
        match parent.annotation(rollout_state::CLUSTER_MAX_PARALLEL) {
            Some(share) if placed && parent.kind == ParentKind::MachineDeployment => {
                let share = max_parallel(share).unwrap_or(1);
                // A MachineDeployment without its own limit takes the Cluster's share whole.
                match parent.annotation(names::MAX_PARALLEL) {
                    Some(_) => own.min(share),
                    None => share,
                }
            }
            _ => own,
        }
    }

    /// What [`RolloutPlan::decide`] needs, from the parent and the Machines it covers (in the
    /// same order), and which of them this process runs work on. Agent health is assumed
    /// good: the controller checks it when a control-plane Machine would start
    /// ([`RolloutPlan::starts_control_plane`]).
    pub fn input(
        &self,
        parent: &ParentView,
        machines: &[Arc<MachineView>],
        working_here: WorkingHere<'_>,
    ) -> RolloutInput {
        RolloutInput {
            cancelled: self.trigger.is_none(),
            max_parallel: self.max_parallel(parent),
            // A MachineDeployment's own limit is the parent's; a control plane has no workers.
            deployment_limits: parent
                .deployment_limits
                .iter()
                .map(|(name, value)| (name.clone(), max_parallel(value).unwrap_or(1)))
                .collect(),
            blocked_by: None,
            machines: observe(self.operation, &self.request_id, machines, working_here),
        }
    }

    /// The changes that carry out `plan`: the Machines it starts, the parent's progress, its
    /// status once the request ends, and the events that say so. What the parent already
    /// says (progress, what the rollout waits for) is not written or reported again.
    pub fn changes(
        &self,
        parent: &ParentView,
        machines: &[Arc<MachineView>],
        plan: &RolloutPlan,
        retry_base: Duration,
    ) -> ParentChanges {
        let names = self.operation.names();
        let reasons = &names.rollout_events;
        let mut changes = ParentChanges::default();
        let progress = plan.progress();
        let progress_text = format!("{}/{}", progress.done, progress.total);
        self.report_refused(parent, &mut changes);
        let waiting_for = match plan {
            RolloutPlan::Continue {
                waiting: Some(super::Waiting::ForRequest(object)),
                ..
            } => Some(object.as_str()),
            _ => None,
        };
        let ended = matches!(
            plan,
            RolloutPlan::Done { .. } | RolloutPlan::Failed { .. } | RolloutPlan::Cancelled { .. }
        );
        self.report_waiting_for(parent, waiting_for, &mut changes);
        if ended && parent.annotation(rollout_state::REFUSED_TRIGGER).is_some() {
            changes.parent.remove(rollout_state::REFUSED_TRIGGER);
        }
        let mut end = |status: &str, event: Event| {
            changes
                .parent
                .set(names.status, status)
                .remove(rollout_state::WAITING);
            changes.events.push(event);
        };
        match plan {
            RolloutPlan::Continue { start, waiting, .. } => {
                let value = self.trigger.as_deref().unwrap_or_default();
                changes.start = start
                    .iter()
                    .filter_map(|name| machines.iter().find(|m| &m.name == name))
                    .map(|m| MachineStart::for_request(self.operation, value, &self.request_id, m))
                    .collect();
                changes.report_malformed_limits(
                    parent,
                    reasons.in_progress,
                    parent
                        .annotation(rollout_state::LIMITS_REPORTED)
                        .unwrap_or_default(),
                );
                if waiting_for.is_some() {
                    // The other request's end is not always a change this parent hears of.
                    changes.next = Next::After(retry_base.max(Duration::from_secs(1)));
                } else if let Some(waiting) = waiting {
                    changes.report_waiting(
                        parent,
                        Event::normal(reasons.in_progress, waiting.describe()),
                    );
                    // Agent health and node assignment are not all watched: look again.
                    changes.next = Next::After(retry_base.max(Duration::from_secs(1)));
                }
            }
            RolloutPlan::Done { progress } => {
                let note = format!(
                    "all {} Machines of {} {} are done ({} skipped)",
                    progress.total,
                    parent.kind.api_resource().kind,
                    parent.name,
                    progress.skipped
                );
                end(names::STATUS_DONE, Event::normal(reasons.done, note));
                changes.parent.remove(names.trigger);
                if let Some(release) = names.release {
                    changes
                        .parent
                        .set(release, self.trigger.as_deref().unwrap_or_default());
                }
            }
            // Still `in-progress`: the Machines it started change their nodes until they
            // finish, and a parent that said `failed` could get a new request that would take
            // their work for its own. Each finishing Machine wakes this parent again.
            RolloutPlan::Stopping {
                machine,
                reason,
                running,
                ..
            } => {
                let text = format!(
                    "{} failed: nothing new starts; the rollout ends failed once {} finish: {reason}",
                    failed_subject(machine),
                    running.join(", ")
                );
                changes.report_waiting(parent, Event::warning(reasons.in_progress, text));
            }
            // As upstream: a failed request's trigger goes, from the parent and from its failed
            // Machines, so that asking again is simply annotating again; what was asked for
            // stays in `rollout_requested`.
            RolloutPlan::Failed {
                machine, reason, ..
            } => {
                let note = format!(
                    "{} failed, the rollout stopped: {reason}",
                    failed_subject(machine)
                );
                end(names::STATUS_FAILED, Event::warning(reasons.failed, note));
                changes
                    .parent
                    .remove(names.trigger)
                    .remove(names.rollout_trigger);
                changes.start = machines
                    .iter()
                    .filter(|m| {
                        m.annotation(names.rollout_request) == Some(self.request_id.as_str())
                            && m.annotation(names.trigger).is_some()
                    })
                    .map(|m| MachineStart::removing_trigger(self.operation, m))
                    .collect();
            }
            RolloutPlan::Cancelled { .. } => {
                let note =
                    format!("cancelled after {progress_text} Machines: the trigger was removed");
                end(
                    names::STATUS_CANCELLED,
                    Event::normal(reasons.cancelled, note),
                );
            }
        }
        changes.write_progress(parent, &progress_text, ended);
        changes
    }

    /// Says once that the trigger's new value is refused while this request runs.
    fn report_refused(&self, parent: &ParentView, changes: &mut ParentChanges) {
        let names = self.operation.names();
        if let Some(value) = &self.refused
            && parent.annotation(rollout_state::REFUSED_TRIGGER) != Some(value.as_str())
        {
            changes
                .parent
                .set(rollout_state::REFUSED_TRIGGER, value.as_str());
            let note = format!(
                "{} = {value} refused: the request for {} ({}) runs on this object and is not preempted; it ends with the trigger removed, and then the new value can be asked for",
                names.trigger,
                self.trigger.as_deref().unwrap_or_default(),
                self.request_id,
            );
            changes
                .events
                .push(Event::warning(names.rollout_events.in_progress, note));
        }
    }

    /// Records the other request this one waits for (`None`: none now), and says so once.
    fn report_waiting_for(
        &self,
        parent: &ParentView,
        waiting_for: Option<&str>,
        changes: &mut ParentChanges,
    ) {
        let in_progress = self.operation.names().rollout_events.in_progress;
        if parent.annotation(rollout_state::WAITING_FOR) != waiting_for {
            match waiting_for {
                Some(object) => {
                    changes.parent.set(rollout_state::WAITING_FOR, object);
                    let note = format!(
                        "waiting for the request on {object} to end: it runs on Machines this request covers; neither preempts the other"
                    );
                    changes.events.push(Event::warning(in_progress, note));
                }
                None => {
                    changes.parent.remove(rollout_state::WAITING_FOR);
                }
            }
        }
    }
}

/// How often a running request's progress is written at most. Each write of a parent wakes
/// every controller that watches it (its own, and a Cluster's for its children), and at
/// max-parallel 1 a Machine ends every few hundred milliseconds: a write per Machine made the
/// parents' passes and writes the larger part of the operator's work on the critical path.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// What failed, in words: a Machine, or (in a Cluster's chain) a child `Kind/name`.
fn failed_subject(name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        format!("Machine {name}")
    }
}

/// Whether this process runs work of an operation on a Machine: state only the process itself
/// knows, whatever the Machine's annotations say.
pub type WorkingHere<'a> = &'a dyn Fn(Operation, &MachineView) -> bool;

/// For callers that run no Machine work: the decision tests, a Cluster's chain.
pub fn no_work_here(_: Operation, _: &MachineView) -> bool {
    false
}

/// Where each Machine stands for request `request_id`, in the order of `views`; agent health is
/// assumed good (see [`Rollout::input`]).
pub(super) fn observe(
    operation: Operation,
    request_id: &str,
    views: &[Arc<MachineView>],
    working_here: WorkingHere<'_>,
) -> Vec<MachineObservation> {
    let names = operation.names();
    views
        .iter()
        .map(|m| {
            let touched = m.annotation(names.rollout_request) == Some(request_id);
            let status = m.annotation(names.status);
            let progress = if !touched {
                MachineProgress::Untouched
            } else if m.annotation(names.trigger).is_some() {
                match status {
                    Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED) => {
                        MachineProgress::Failed
                    }
                    _ => MachineProgress::Running,
                }
            } else {
                match status {
                    Some(names::STATUS_DONE) => MachineProgress::Done,
                    Some(names::STATUS_IN_PROGRESS) => MachineProgress::Running,
                    // Tagged, trigger gone and no result: someone removed it; not done.
                    _ => MachineProgress::Failed,
                }
            };
            let failure = m
                .annotation(names.state.last_error)
                .map(str::to_string)
                .or_else(|| {
                    (progress == MachineProgress::Failed)
                        .then(|| format!("status {}", status.unwrap_or("unknown")))
                });
            MachineObservation {
                name: m.name.clone(),
                role: if m.control_plane {
                    Role::ControlPlane
                } else {
                    Role::Worker {
                        deployment: m
                            .labels
                            .get(names::DEPLOYMENT_NAME_LABEL)
                            .cloned()
                            .unwrap_or_default(),
                    }
                },
                has_node: m.node_name.is_some(),
                agent_healthy: true,
                being_deleted: m.being_deleted,
                progress,
                failure,
                held_by: held_by(operation, request_id, m, working_here),
            }
        })
        .collect()
}

/// The object of another request Machine `m` is busy with, for a request `request_id` of
/// `operation`: a request of either operation that has not ended on it (asked for and not yet
/// taken up, or running) and is not this one. A Machine tagged by no request was asked on
/// itself.
///
/// Busy means the Machine controller still has something to do: a trigger whose request has
/// not ended, an upgrade `in-progress` without its trigger (the controller cancels it on the
/// node, then ends it `cancelled`), or work this process runs (a trigger removed while it
/// ran). A refresh `in-progress` without a trigger and without work here is a leftover (or
/// written by hand): the Machine controller never acts on it again, and a request waiting for
/// it would wait forever.
fn held_by(
    operation: Operation,
    request_id: &str,
    m: &MachineView,
    working_here: WorkingHere<'_>,
) -> Option<String> {
    Operation::ALL.into_iter().find_map(|op| {
        let names = op.names();
        let tag = m.annotation(names.rollout_request);
        if op == operation && tag == Some(request_id) {
            return None;
        }
        let status = m.annotation(names.status);
        let ended = matches!(
            status,
            Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED)
        );
        let cancelling =
            op == Operation::InPlaceUpgrade && status == Some(names::STATUS_IN_PROGRESS);
        let busy =
            cancelling || (m.annotation(names.trigger).is_some() && !ended) || working_here(op, m);
        busy.then(|| {
            tag.and_then(requester)
                .map(str::to_string)
                .unwrap_or_else(|| format!("Machine/{}", m.name))
        })
    })
}

/// A Cluster's opt-in automatic refresh, on a pass without a refresh request: sets the trigger
/// once the earliest expiry of its Machines is within `before`, and otherwise comes back when
/// it will be. A malformed value is reported once (per value).
pub fn auto_refresh(
    cluster: &ParentView,
    machines: &[Arc<MachineView>],
    now: OffsetDateTime,
) -> ParentChanges {
    let Some(value) = cluster.annotation(names::AUTO_REFRESH_CERTIFICATES) else {
        return ParentChanges::default();
    };
    let auto = match AutoRefresh::parse(value) {
        Ok(auto) => auto,
        Err(_) if cluster.annotation(rollout_state::AUTO_REFRESH_REPORTED) == Some(value) => {
            return ParentChanges::default();
        }
        Err(reason) => {
            let mut reported = AnnotationChanges::default();
            reported.set(rollout_state::AUTO_REFRESH_REPORTED, value);
            let note = format!(
                "{}: {reason}; automatic refresh is off until it is fixed",
                names::AUTO_REFRESH_CERTIFICATES
            );
            return ParentChanges {
                events: vec![Event::warning(names::EVENT_REFRESH_CERTS_FAILED, note)],
                ..ParentChanges::writing(reported)
            };
        }
    };
    let earliest = machines
        .iter()
        .filter(|m| !m.being_deleted)
        .filter_map(|m| parse_time(m.annotation(names::CERTIFICATES_EXPIRY)))
        .min();
    let Some(earliest) = earliest else {
        return ParentChanges::default();
    };
    let due = auto.due_at(earliest);
    if due > now {
        // Nothing changes on its own as time passes: come back when it is due (at most hourly).
        let wait = Duration::try_from(due - now)
            .unwrap_or(Duration::ZERO)
            .min(Duration::from_secs(3600));
        return ParentChanges {
            next: Next::After(wait),
            ..ParentChanges::default()
        };
    }
    let mut trigger = AnnotationChanges::default();
    trigger.set(names::REFRESH_CERTIFICATES, auto.ttl.to_string());
    ParentChanges::writing(trigger)
}

mod changes;
#[cfg(test)]
mod tests;

pub use changes::{ChildWrite, MachineStart, ParentChanges};
