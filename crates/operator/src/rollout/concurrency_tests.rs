//! Concurrent requests at every level (issue 32), through the real pure decisions: users set
//! and remove triggers on a Cluster, its CK8sControlPlane and two MachineDeployments, for both
//! operations, with any value, in any order; Machines finish or fail in any order; each
//! parent's pass runs whenever it may. A model of the Machine controller stands in for the
//! agents; every write lands at once (the controller's version guards and its fresh look at
//! the control plane make its writes act on current state, which is what this model gives).
//!
//! What is exclusive, and checked after every step:
//! - a control-plane Machine is busy (asked for and not ended, or running) for at most one
//!   request at a time, and at most one control-plane Machine is busy at all, across both
//!   operations and all parents;
//! - a Machine is never started twice by one request;
//! - a Machine busy with one request is never re-tagged by another before it ends;
//!
//! and once users stop, every request ends (`done`, `failed` or `cancelled`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use time::OffsetDateTime;

use super::RolloutPlan;
use super::chain::{self, ChainPlan, observe_children};
use super::parent::{ParentKind, ParentStep, ParentView, blocked_by, no_work_here};
use crate::machine::{MachineView, ObjectRef, test_machine};
use caretaker_api::names::{self, Operation};

const OPS: [Operation; 2] = Operation::ALL;

fn values(op: Operation) -> [&'static str; 2] {
    match op {
        Operation::RefreshCertificates => ["30d", "60d"],
        Operation::InPlaceUpgrade => ["revision=1", "revision=2"],
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// A user sets (or overwrites) a trigger: parent 0 Cluster, 1 control plane, 2 and 3 the
    /// MachineDeployments.
    Request {
        parent: usize,
        op: usize,
        value: usize,
    },
    /// A user removes a trigger.
    Cancel { parent: usize, op: usize },
    /// The Machine controller moves one Machine on: takes a request up, or ends it.
    Machine { index: usize, succeeds: bool },
    /// One pass of a parent's controller.
    Pass { parent: usize },
    /// A user sets a trigger on a Machine itself.
    MachineRequest { index: usize, op: usize },
}

fn arbitrary_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0usize..4, 0usize..2, 0usize..2).prop_map(|(parent, op, value)| Step::Request { parent, op, value }),
        1 => (0usize..4, 0usize..2).prop_map(|(parent, op)| Step::Cancel { parent, op }),
        6 => (0usize..7, prop::bool::weighted(0.85)).prop_map(|(index, succeeds)| Step::Machine { index, succeeds }),
        8 => (0usize..4).prop_map(|parent| Step::Pass { parent }),
        1 => (0usize..7, 0usize..2).prop_map(|(index, op)| Step::MachineRequest { index, op }),
    ]
}

struct World {
    parents: Vec<ParentView>,
    machines: Vec<MachineView>,
    /// Starts per (request id, Machine).
    starts: HashMap<(String, String), usize>,
    clock: i128,
    /// A user asked a Machine directly: the operator cannot stop two control-plane Machines
    /// being asked so, only never start one beside another.
    asked_machines: bool,
}

fn machine(name: &str, deployment: Option<&str>) -> MachineView {
    let mut m = MachineView {
        name: name.into(),
        ..test_machine(&[])
    };
    match deployment {
        Some(d) => {
            m.labels
                .insert(names::DEPLOYMENT_NAME_LABEL.into(), d.into());
        }
        None => {
            m.control_plane = true;
            m.labels
                .insert(names::CONTROL_PLANE_LABEL.into(), String::new());
            m.labels
                .insert(names::CONTROL_PLANE_NAME_LABEL.into(), "cp".into());
            // Even a selector that matched it would not make a MachineDeployment cover it.
            m.labels
                .insert(names::DEPLOYMENT_NAME_LABEL.into(), "a".into());
            m.controller = Some(ObjectRef {
                group: caretaker_api::cluster_api::CONTROL_PLANE_GROUP.into(),
                kind: "CK8sControlPlane".into(),
                name: "cp".into(),
            });
        }
    }
    m
}

fn parent(kind: ParentKind, name: &str) -> ParentView {
    ParentView {
        kind,
        name: name.into(),
        annotations: BTreeMap::new(),
        deployment_limits: BTreeMap::new(),
        resource_version: None,
        progress_age: None,
        cluster: (kind != ParentKind::Cluster).then(|| "c1".to_string()),
    }
}

/// Busy for `op`: asked for and not ended, or running.
fn busy(m: &MachineView, op: Operation) -> bool {
    let names = op.names();
    let status = m.annotation(names.status);
    status == Some(names::STATUS_IN_PROGRESS)
        || (m.annotation(names.trigger).is_some()
            && !matches!(
                status,
                Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED)
            ))
}

impl World {
    fn new(max_parallel: usize) -> Self {
        let mut cluster = parent(ParentKind::Cluster, "c1");
        cluster
            .annotations
            .insert(names::MAX_PARALLEL.into(), max_parallel.to_string());
        Self {
            parents: vec![
                cluster,
                parent(ParentKind::ControlPlane, "cp"),
                parent(ParentKind::MachineDeployment, "a"),
                parent(ParentKind::MachineDeployment, "b"),
            ],
            machines: vec![
                machine("cp-0", None),
                machine("cp-1", None),
                machine("cp-2", None),
                machine("a-0", Some("a")),
                machine("a-1", Some("a")),
                machine("b-0", Some("b")),
                machine("b-1", Some("b")),
            ],
            starts: HashMap::new(),
            clock: 0,
            asked_machines: false,
        }
    }

    fn now(&mut self) -> OffsetDateTime {
        self.clock += 1;
        OffsetDateTime::from_unix_timestamp_nanos(1_800_000_000_000_000_000 + self.clock).unwrap()
    }

    fn views(&self) -> Vec<Arc<MachineView>> {
        self.machines.iter().cloned().map(Arc::new).collect()
    }

    /// The Machine controller, as far as the parents see it.
    fn machine_step(&mut self, index: usize, succeeds: bool) {
        let m = &mut self.machines[index];
        for op in OPS {
            let names = op.names();
            let status = m.annotation(names.status).map(str::to_string);
            let has_trigger = m.annotation(names.trigger).is_some();
            match status.as_deref() {
                Some(names::STATUS_IN_PROGRESS) if succeeds => {
                    m.annotations
                        .insert(names.status.into(), names::STATUS_DONE.into());
                    m.annotations.remove(names.trigger);
                    m.annotations.remove(names.state.last_error);
                }
                Some(names::STATUS_IN_PROGRESS) => {
                    m.annotations
                        .insert(names.status.into(), names::STATUS_FAILED.into());
                    m.annotations
                        .insert(names.state.last_error.into(), "boom".into());
                }
                Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED) => continue,
                _ if has_trigger => {
                    m.annotations
                        .insert(names.status.into(), names::STATUS_IN_PROGRESS.into());
                }
                _ => continue,
            }
            // One request moved on per step.
            return;
        }
    }

    fn pass(&mut self, index: usize) -> Result<(), TestCaseError> {
        for op in OPS {
            let now = self.now();
            let view = self.parents[index].clone();
            let machines: Vec<Arc<MachineView>> = self
                .views()
                .into_iter()
                .filter(|m| view.kind.covers(&view.name, m))
                .collect();
            let changes = match ParentStep::of(op, &view, now) {
                ParentStep::Idle | ParentStep::AutoRefresh => continue,
                ParentStep::Write(changes) => changes,
                ParentStep::Roll(rollout) if view.kind == ParentKind::Cluster => {
                    let children: Vec<ParentView> = self.parents[1..].to_vec();
                    let input = observe_children(
                        op,
                        &view.name,
                        &rollout.request_id,
                        rollout.max_parallel(&view),
                        rollout.trigger.is_none(),
                        &children,
                        &machines,
                    );
                    let plan = ChainPlan::decide(&input);
                    chain::changes(&rollout, &view, &children, &plan, Duration::from_secs(1))
                }
                ParentStep::Roll(rollout) => {
                    let mut input = rollout.input(&view, &machines, &no_work_here);
                    input.blocked_by = blocked_by(op, &view, &rollout.request_id, &[&view]);
                    let plan = RolloutPlan::decide(&input);
                    rollout.changes(&view, &machines, &plan, Duration::from_secs(1))
                }
            };
            let names = op.names();
            for start in &changes.start {
                let m = self
                    .machines
                    .iter_mut()
                    .find(|m| m.name == start.machine)
                    .unwrap();
                if let Some(Some(request)) = start.annotations.get(names.rollout_request) {
                    // Never a Machine another request has not finished with.
                    for other in OPS {
                        prop_assert!(
                            !busy(m, other),
                            "{} re-tagged by {request} while busy with {:?}: {:?}",
                            m.name,
                            m.annotation(other.names().rollout_request),
                            m.annotations
                        );
                    }
                    let count = self
                        .starts
                        .entry((request.to_string(), m.name.clone()))
                        .or_default();
                    *count += 1;
                    prop_assert_eq!(*count, 1, "{} started twice by {}", m.name, request);
                    if m.control_plane {
                        let name = m.name.clone();
                        let others: Vec<&str> = self
                            .machines
                            .iter()
                            .filter(|o| o.control_plane && o.name != name)
                            .filter(|o| OPS.iter().any(|op| busy(o, *op)))
                            .map(|o| o.name.as_str())
                            .collect();
                        prop_assert!(
                            others.is_empty(),
                            "{} started beside busy {:?}",
                            name,
                            others
                        );
                    }
                }
                let m = self
                    .machines
                    .iter_mut()
                    .find(|m| m.name == start.machine)
                    .unwrap();
                start.annotations.apply_to(&mut m.annotations);
            }
            for child in &changes.children {
                let c = self
                    .parents
                    .iter_mut()
                    .find(|p| p.kind == child.kind && p.name == child.name)
                    .unwrap();
                child.annotations.apply_to(&mut c.annotations);
            }
            changes
                .parent
                .apply_to(&mut self.parents[index].annotations);
        }
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        if self.asked_machines {
            return Ok(());
        }
        let busy_control_plane: Vec<&str> = self
            .machines
            .iter()
            .filter(|m| m.control_plane && OPS.iter().any(|op| busy(m, *op)))
            .map(|m| m.name.as_str())
            .collect();
        prop_assert!(
            busy_control_plane.len() <= 1,
            "control-plane Machines busy at once: {:?}\n{:#?}",
            busy_control_plane,
            self.machines
                .iter()
                .map(|m| (&m.name, &m.annotations))
                .collect::<Vec<_>>()
        );
        for m in &self.machines {
            prop_assert!(
                !OPS.iter().all(|op| busy(m, *op)),
                "{} busy with two requests: {:?}",
                m.name,
                m.annotations
            );
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    #[test]
    fn concurrent_requests_at_every_level_never_share_a_machine_and_all_end(
        steps in prop::collection::vec(arbitrary_step(), 10..120),
        max_parallel in 1usize..4,
    ) {
        let mut world = World::new(max_parallel);
        for step in steps {
            match step {
                Step::Request { parent, op, value } => {
                    let op = OPS[op];
                    world.parents[parent]
                        .annotations
                        .insert(op.names().trigger.into(), values(op)[value].into());
                }
                Step::Cancel { parent, op } => {
                    world.parents[parent].annotations.remove(OPS[op].names().trigger);
                }
                Step::Machine { index, succeeds } => world.machine_step(index, succeeds),
                Step::Pass { parent } => world.pass(parent)?,
                Step::MachineRequest { index, op } => {
                    let op = OPS[op];
                    let m = &mut world.machines[index];
                    // As a user would: on a Machine no request is busy with.
                    if !OPS.iter().any(|o| busy(m, *o)) {
                        m.annotations.insert(op.names().trigger.into(), values(op)[0].into());
                        m.annotations.remove(op.names().status);
                        world.asked_machines = true;
                    }
                }
            }
            world.check()?;
        }
        // Users stop; Machines succeed from now on. Every request ends.
        for _ in 0..200 {
            for parent in 0..4 {
                world.pass(parent)?;
                world.check()?;
            }
            for index in 0..world.machines.len() {
                world.machine_step(index, true);
                world.check()?;
            }
        }
        for p in &world.parents {
            for op in OPS {
                let names = op.names();
                prop_assert_ne!(
                    p.annotation(names.status),
                    Some(names::STATUS_IN_PROGRESS),
                    "{:?} {} never ended its {:?} request: {:?}",
                    p.kind,
                    &p.name,
                    op,
                    &p.annotations
                );
                prop_assert!(
                    p.annotation(names.trigger).is_none() || p.annotation(names.status).is_some(),
                    "{:?} {}: a trigger never taken up: {:?}",
                    p.kind,
                    &p.name,
                    &p.annotations
                );
            }
        }
    }
}
