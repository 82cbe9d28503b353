//! What a pass writes and says: the [`ParentChanges`] that carry out a decision, the start of
//! each Machine ([`MachineStart`]) and, for a Cluster, the writes on its children
//! ([`ChildWrite`]).

use std::time::Duration;

use caretaker_api::names::{self, Operation, rollout_state};

use super::{PROGRESS_INTERVAL, ParentKind, ParentView, max_parallel};
use crate::changes::{AnnotationChanges, Event};
use crate::machine::MachineView;
use crate::schedule::Next;

/// What a pass writes and says, in the order the controller applies it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParentChanges {
    /// Machines to start. If one of them changed since the plan saw it, the pass stops there
    /// and the Machine's change brings a fresh one.
    pub start: Vec<MachineStart>,
    /// For a Cluster: the triggers placed on or removed from its children, after the
    /// Machines and before the Cluster itself.
    pub children: Vec<ChildWrite>,
    /// Then the parent's annotations.
    pub parent: AnnotationChanges,
    /// Then the events on the parent, once what they tell of is written.
    pub events: Vec<Event>,
    /// When to look at the parent again, besides when it or one of its Machines changes.
    pub next: Next,
}

impl ParentChanges {
    pub(super) fn writing(parent: AnnotationChanges) -> Self {
        Self {
            parent,
            ..Self::default()
        }
    }

    /// Writes the parent's progress `text` if it changed and is due: with any other write of
    /// the parent (it costs nothing more), when the request ends, when the parent shows none
    /// yet, or when this process last wrote it [`PROGRESS_INTERVAL`] ago or more (or never).
    /// Otherwise the pass comes back when it is due.
    pub(super) fn write_progress(&mut self, parent: &ParentView, text: &str, ended: bool) {
        let shown = parent.annotation(names::PROGRESS);
        if shown == Some(text) {
            return;
        }
        let wait = match parent.progress_age {
            Some(age) if shown.is_some() && !ended && self.parent.is_empty() => {
                PROGRESS_INTERVAL.saturating_sub(age)
            }
            _ => Duration::ZERO,
        };
        if wait.is_zero() {
            self.parent.set(names::PROGRESS, text);
        } else {
            self.next = self.next.sooner(Next::After(wait));
        }
    }

    /// Warns of each malformed limit the rollout reads that is not in `reported` (a
    /// [`rollout_state::LIMITS_REPORTED`] value) and records the ones it reads now. Limits are
    /// read at every pass, not only at the start: a MachineDeployment edited mid-rollout, or one
    /// whose edit reached the operator's cache after the request started, is reported too.
    pub(super) fn report_malformed_limits(
        &mut self,
        parent: &ParentView,
        reason: &'static str,
        reported: &str,
    ) {
        let malformed = malformed_limits(parent);
        let already: Vec<&str> = reported.split(',').collect();
        for limit in &malformed {
            if !already.contains(&limit.key.as_str()) {
                self.events
                    .push(Event::warning(reason, limit.note.as_str()));
            }
        }
        let keys: Vec<&str> = malformed.iter().map(|l| l.key.as_str()).collect();
        let keys = keys.join(",");
        if parent
            .annotation(rollout_state::LIMITS_REPORTED)
            .unwrap_or_default()
            != keys
        {
            if keys.is_empty() {
                self.parent.remove(rollout_state::LIMITS_REPORTED);
            } else {
                self.parent
                    .set(rollout_state::LIMITS_REPORTED, keys.as_str());
            }
        }
    }

    /// Records what the rollout waits for and says so, unless the parent says it already: the
    /// same wait is reported once.
    pub(super) fn report_waiting(&mut self, parent: &ParentView, event: Event) {
        if parent.annotation(rollout_state::WAITING) != Some(event.note.as_str()) {
            self.parent.set(rollout_state::WAITING, event.note.as_str());
            self.events.push(event);
        }
    }
}

/// The write that starts one Machine for a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineStart {
    pub namespace: String,
    pub machine: String,
    /// The version the plan saw the Machine at: the write is made on that version only.
    pub resource_version: Option<String>,
    pub annotations: AnnotationChanges,
}

impl MachineStart {
    /// Removes the trigger from Machine `m`, whose request failed (on the version seen).
    pub fn removing_trigger(operation: Operation, m: &MachineView) -> Self {
        let mut annotations = AnnotationChanges::default();
        annotations.remove(operation.names().trigger);
        Self {
            namespace: m.namespace.clone(),
            machine: m.name.clone(),
            resource_version: m.resource_version.clone(),
            annotations,
        }
    }

    /// Starts Machine `m` for request `request_id` with trigger value `value`.
    ///
    /// A Machine's status is the result of the last request it ran. An ended one (`done`,
    /// `failed`, `cancelled`) belongs to an earlier request: left in place beside this
    /// request's tag it would read as this request's result before the Machine controller has
    /// begun (a stale `failed` ended new requests at once), and the Machine controller would
    /// take an unchanged trigger for the ended request. So the same write that tags the Machine
    /// clears it. The write is made only on the version the plan saw untouched by this request
    /// (a lagging cache could otherwise restart a Machine this request has finished), so it
    /// never clears a result this request produced, and a restarted operator still finds its
    /// finished Machines finished. A Machine `in-progress` is busy with another request and is
    /// never started ([`RolloutPlan::decide`] leaves it); were it written anyway, its status
    /// would stay, as that work still runs on the node.
    pub fn for_request(
        operation: Operation,
        value: &str,
        request_id: &str,
        m: &MachineView,
    ) -> Self {
        let names = operation.names();
        let mut annotations = AnnotationChanges::default();
        annotations
            .set(names.trigger, value)
            .set(names.rollout_request, request_id);
        if m.annotation(names.status)
            .is_some_and(|status| status != names::STATUS_IN_PROGRESS)
        {
            annotations.remove(names.status);
        }
        Self {
            namespace: m.namespace.clone(),
            machine: m.name.clone(),
            resource_version: m.resource_version.clone(),
            annotations,
        }
    }
}

/// A write on a Cluster's child (made only on the version the pass saw).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildWrite {
    pub kind: ParentKind,
    pub name: String,
    pub resource_version: Option<String>,
    pub annotations: AnnotationChanges,
}

/// A `caretaker.dev/max-parallel` a rollout of `parent` reads that is not a whole number of at
/// least 1 (such a limit counts as 1).
struct MalformedLimit {
    /// `Kind/name=value`: what [`rollout_state::LIMITS_REPORTED`] records.
    key: String,
    note: String,
}

fn malformed_limits(parent: &ParentView) -> Vec<MalformedLimit> {
    if parent.kind == ParentKind::ControlPlane {
        return Vec::new(); // control-plane Machines always go one at a time
    }
    let own = parent
        .annotation(names::MAX_PARALLEL)
        .map(|value| (parent.kind.api_resource().kind, &parent.name, value));
    let deployments = parent
        .deployment_limits
        .iter()
        .map(|(name, value)| ("MachineDeployment".to_string(), name, value.as_str()));
    own.into_iter()
        .chain(deployments)
        .filter(|(_, _, value)| max_parallel(value).is_none())
        .map(|(kind, name, value)| MalformedLimit {
            key: format!("{kind}/{name}={value}"),
            note: format!(
                "{} {value:?} on {kind} {name} is not a whole number of at least 1; its workers go one at a time",
                names::MAX_PARALLEL,
            ),
        })
        .collect()
}
