//! The CPU cost of one rollout pass, without an API server: the decisions a MachineDeployment's
//! pass and its Cluster's pass make over 3 control-plane Machines and N workers halfway through
//! a certificate refresh, as the controllers make them on every change of a Machine they cover.
//! At max-parallel 1 a pass follows each finished Machine, so its cost is part of every
//! Machine's `done` -> next trigger (issue 32).
//!
//! `cargo run --release -p caretaker-operator --example rollout_pass_bench [-- WORKERS [ROUNDS]]`
//! (defaults: 1,000 workers, 2,000 rounds).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use caretaker_api::names::{self, Operation};
use caretaker_operator::machine::{MachineView, ObjectRef};
use caretaker_operator::rollout::chain::{self, ChainPlan, observe_children};
use caretaker_operator::rollout::parent::{ParentKind, ParentView, Rollout, no_work_here};
use caretaker_operator::rollout::{RolloutInput, RolloutPlan};

const CLUSTER: &str = "bench";
const DEPLOYMENT: &str = "bench-workers";
const CONTROL_PLANE: &str = "bench-control-plane";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let workers: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1000);
    let rounds: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let operation = Operation::RefreshCertificates;
    let names = operation.names();
    let cluster_request = format!("Cluster/{CLUSTER}/1");
    let request = format!("MachineDeployment/{DEPLOYMENT}/2");

    // A Cache's Machines: every control-plane Machine and the first half of the workers done,
    // the next worker running, the rest untouched.
    let mut machines = Vec::new();
    for i in 0..3 {
        let mut m = machine(&format!("{CONTROL_PLANE}-{i}"), true);
        finished(&mut m, names, &format!("ControlPlane/{CONTROL_PLANE}/3"));
        machines.push(Arc::new(m));
    }
    for i in 0..workers {
        let mut m = machine(&format!("{DEPLOYMENT}-{i:04}"), false);
        if i < workers / 2 {
            finished(&mut m, names, &request);
        } else if i == workers / 2 {
            m.annotations.insert(names.trigger.into(), "90d".into());
            m.annotations
                .insert(names.rollout_request.into(), request.clone());
            m.annotations
                .insert(names.status.into(), names::STATUS_IN_PROGRESS.into());
        }
        machines.push(Arc::new(m));
    }

    let mut deployment = parent(ParentKind::MachineDeployment, DEPLOYMENT);
    for (key, value) in [
        (names.trigger, "90d"),
        (names.status, names::STATUS_IN_PROGRESS),
        (names.rollout_request, request.as_str()),
        (names.rollout_trigger, "90d"),
        (names.cluster_request, cluster_request.as_str()),
    ] {
        deployment.annotations.insert(key.into(), value.into());
    }
    let rollout = Rollout {
        operation,
        request_id: request.clone(),
        trigger: Some("90d".into()),
        refused: None,
    };
    let mut cluster = parent(ParentKind::Cluster, CLUSTER);
    for (key, value) in [
        (names.trigger, "90d"),
        (names.status, names::STATUS_IN_PROGRESS),
        (names.rollout_request, cluster_request.as_str()),
        (names.rollout_trigger, "90d"),
    ] {
        cluster.annotations.insert(key.into(), value.into());
    }
    let cluster_rollout = Rollout {
        request_id: cluster_request.clone(),
        ..rollout.clone()
    };
    let children = vec![deployment.clone()];

    let deployment_pass = || {
        let covered: Vec<Arc<MachineView>> = machines
            .iter()
            .filter(|m| ParentKind::MachineDeployment.covers(DEPLOYMENT, m))
            .cloned()
            .collect();
        let input: RolloutInput = rollout.input(&deployment, &covered, &no_work_here);
        let plan = RolloutPlan::decide(&input);
        rollout.changes(&deployment, &covered, &plan, Duration::from_secs(1))
    };
    let cluster_pass = || {
        let covered: Vec<Arc<MachineView>> = machines
            .iter()
            .filter(|m| ParentKind::Cluster.covers(CLUSTER, m))
            .cloned()
            .collect();
        let input = observe_children(
            operation,
            CLUSTER,
            &cluster_request,
            1,
            false,
            &children,
            &covered,
        );
        let plan = ChainPlan::decide(&input);
        chain::changes(
            &cluster_rollout,
            &cluster,
            &children,
            &plan,
            Duration::from_secs(1),
        )
    };
    // The pass must find the running worker and start nothing else, or it times the wrong thing.
    let changes = deployment_pass();
    assert!(changes.start.is_empty(), "{changes:?}");

    println!(
        "one rollout pass over 3 control-plane Machines + {workers} workers, {rounds} rounds each"
    );
    for (label, pass) in [
        ("MachineDeployment pass", &deployment_pass as &dyn Fn() -> _),
        ("Cluster pass", &cluster_pass),
    ] {
        let started = Instant::now();
        for _ in 0..rounds {
            black_box(pass());
        }
        let per_pass = started.elapsed() / rounds;
        println!(
            "  {label:<24} {:>8.1} µs  ({:.2} µs per Machine)",
            per_pass.as_secs_f64() * 1e6,
            per_pass.as_secs_f64() * 1e6 / (workers + 3) as f64
        );
    }
}

/// A Machine as Cluster API and caretaker leave it: the labels Cluster API sets, the
/// annotations the agent and the Machine controller keep.
fn machine(name: &str, control_plane: bool) -> MachineView {
    let mut labels = BTreeMap::new();
    labels.insert(names::CLUSTER_NAME_LABEL.to_string(), CLUSTER.to_string());
    if control_plane {
        labels.insert(names::CONTROL_PLANE_LABEL.to_string(), String::new());
        labels.insert(
            names::CONTROL_PLANE_NAME_LABEL.to_string(),
            CONTROL_PLANE.to_string(),
        );
    } else {
        labels.insert(
            names::DEPLOYMENT_NAME_LABEL.to_string(),
            DEPLOYMENT.to_string(),
        );
        labels.insert(
            "cluster.x-k8s.io/set-name".to_string(),
            format!("{DEPLOYMENT}-7d9f8"),
        );
    }
    let mut annotations = BTreeMap::new();
    annotations.insert(
        names::CERTIFICATES_EXPIRY.to_string(),
        "2027-11-28T00:00:00Z".to_string(),
    );
    annotations.insert(
        names::AGENT_ENDPOINT.to_string(),
        "https://10.0.0.1:9443".to_string(),
    );
    MachineView {
        name: name.to_string(),
        namespace: "default".to_string(),
        cluster_name: CLUSTER.to_string(),
        node_name: Some(name.to_string()),
        addresses: vec!["10.0.0.1".to_string()],
        control_plane,
        controller: Some(ObjectRef {
            group: if control_plane {
                caretaker_api::cluster_api::CONTROL_PLANE_GROUP.to_string()
            } else {
                "cluster.x-k8s.io".to_string()
            },
            kind: if control_plane {
                "CK8sControlPlane"
            } else {
                "MachineSet"
            }
            .to_string(),
            name: CONTROL_PLANE.to_string(),
        }),
        being_deleted: false,
        labels,
        annotations,
        resource_version: Some("12345".to_string()),
        created_at: Some(1_700_000_000),
    }
}

/// Done for `request`, as the Machine controller leaves a Machine.
fn finished(m: &mut MachineView, names: &names::OperationNames, request: &str) {
    m.annotations
        .insert(names.rollout_request.into(), request.into());
    m.annotations
        .insert(names.status.into(), names::STATUS_DONE.into());
    m.annotations
        .insert(names.state.attempts.into(), "1".into());
}

fn parent(kind: ParentKind, name: &str) -> ParentView {
    ParentView {
        kind,
        name: name.to_string(),
        annotations: BTreeMap::new(),
        deployment_limits: BTreeMap::new(),
        resource_version: Some("1".to_string()),
        progress_age: None,
        cluster: Some(CLUSTER.to_string()),
    }
}
