//! Cluster-wide rollouts end to end: a parent's trigger rolls out over its Machines through the
//! real controllers, agents and API server.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use caretaker_agent::command::CommandTemplate;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_operator::machine;
use caretaker_testkit::capi_objects::ClusterObjects;
use common::hooks::{concurrency, concurrency_of, logging_scripts};
use common::{NS, World, fast, unreachable_agent_url, world};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use serde_json::json;

async fn annotate_parent(
    world: &World,
    resource: &kube::api::ApiResource,
    name: &str,
    annotations: serde_json::Value,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, resource);
    let body = json!({ "metadata": { "annotations": annotations } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();
}

/// Sets `annotations` (a trigger) on the parent and waits until its `status` annotation is
/// `done`; returns the parent's annotations then.
async fn roll_out(
    world: &World,
    resource: &kube::api::ApiResource,
    name: &str,
    annotations: serde_json::Value,
    status: &str,
) -> BTreeMap<String, String> {
    annotate_parent(world, resource, name, annotations).await;
    wait_parent(world, resource, name, status, names::STATUS_DONE).await
}

async fn wait_parent(
    world: &World,
    resource: &kube::api::ApiResource,
    name: &str,
    key: &str,
    value: &str,
) -> BTreeMap<String, String> {
    wait_parent_until(world, resource, name, &format!("{key} = {value}"), |a| {
        a.get(key).map(String::as_str) == Some(value)
    })
    .await
}

/// Waits until the parent's annotations satisfy `done` (described by `what`) and returns them.
async fn wait_parent_until(
    world: &World,
    resource: &kube::api::ApiResource,
    name: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, resource);
    for _ in 0..600 {
        let annotations = api
            .get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default();
        if done(&annotations) {
            return annotations;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{name}: never {what}: {:?}",
        api.get(name).await.unwrap().metadata.annotations
    );
}

impl ParentAnnotations for World {
    async fn parent_annotations(
        &self,
        resource: &kube::api::ApiResource,
        name: &str,
    ) -> BTreeMap<String, String> {
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), NS, resource);
        api.get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
    }
}

trait ParentAnnotations {
    async fn parent_annotations(
        &self,
        resource: &kube::api::ApiResource,
        name: &str,
    ) -> BTreeMap<String, String>;
}

/// The order and the limit as the agents see them: each node's restart hook (run by a refresh)
/// logs when it starts and ends, and sleeps long enough for runs to overlap when they may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_refresh_covers_the_control_plane_then_every_worker() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.6");
    let mut layouts = vec![
        world
            .add_restartable("cp-0", NodeRole::ControlPlane, make("cp-0"))
            .await,
    ];
    // Four workers two at a time: an implementation that ignores the limit runs more than two
    // at once, one that serialises everything never runs two.
    for i in 0..4 {
        let name = format!("w-{i}");
        layouts.push(
            world
                .add_restartable(&name, NodeRole::Worker, make(&name))
                .await,
        );
    }
    let annotations = roll_out(
        &world,
        &caretaker_api::cluster_api::cluster_api_resource(),
        "c1",
        json!({ names::REFRESH_CERTIFICATES: "1y", names::MAX_PARALLEL: "2" }),
        names::REFRESH_CERTIFICATES_STATUS,
    )
    .await;
    assert_eq!(annotations[names::PROGRESS], "5/5");
    assert!(
        !annotations.contains_key(names::REFRESH_CERTIFICATES),
        "the trigger is removed when done"
    );
    for layout in &layouts {
        let days = (caretaker_agent::inventory::discover(layout)
            .earliest_expiry()
            .unwrap()
            - time::OffsetDateTime::now_utc())
        .whole_days();
        assert!(days > 360, "{days}");
    }
    // The Cluster went through its children, as the proposals say: each ran its own request
    // (marked as the Cluster's) over its Machines, and shows its own status.
    let cluster_request = &annotations[names::rollout_state::REFRESH_REQUEST];
    for (resource, child, machines) in [
        (
            caretaker_api::cluster_api::control_plane_api_resource(),
            "c1-control-plane",
            &["cp-0"][..],
        ),
        (
            caretaker_api::cluster_api::machine_deployment_api_resource(),
            "c1-md-0",
            &["w-0", "w-1", "w-2", "w-3"][..],
        ),
    ] {
        let child_annotations = wait_parent(
            &world,
            &resource,
            child,
            names::REFRESH_CERTIFICATES_STATUS,
            names::STATUS_DONE,
        )
        .await;
        assert_eq!(
            &child_annotations[names::rollout_state::REFRESH_CLUSTER_REQUEST],
            cluster_request,
            "{child} marked as the Cluster's"
        );
        assert!(
            !child_annotations.contains_key(names::REFRESH_CERTIFICATES),
            "{child}: trigger removed when done"
        );
        for name in machines {
            assert_eq!(
                &world.annotations(name).await[names::rollout_state::REFRESH_REQUEST],
                &child_annotations[names::rollout_state::REFRESH_REQUEST],
                "{name} tagged by {child}'s request"
            );
        }
        world
            .event_with(child, names::EVENT_REFRESH_CERTS_DONE)
            .await;
    }

    let (_, runs) = concurrency(&log);
    assert_eq!(
        runs.into_iter().collect::<Vec<_>>(),
        ["cp-0", "w-0", "w-1", "w-2", "w-3"].map(|name| (name.to_string(), 1)),
        "every node restarted once"
    );
    assert_control_plane_before_workers(&log);
    let (workers_at_once, _) = concurrency_of(&log, |m| m.starts_with("w-"));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        workers_at_once <= 2,
        "max-parallel 2 ignored: {workers_at_once} workers at once:\n{text}"
    );
    assert_eq!(
        workers_at_once, 2,
        "max-parallel 2 unused: the workers went one at a time:\n{text}"
    );
    world
        .event_with("c1", names::EVENT_REFRESH_CERTS_IN_PROGRESS)
        .await;
    world
        .event_with("c1", names::EVENT_REFRESH_CERTS_DONE)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_failed_machine_stops_a_machine_deployment_rollout() {
    let mut world = world(fast()).await;
    world
        .add_machine(
            "w-0",
            NodeRole::Worker,
            "cp.example",
            Some(&unreachable_agent_url()),
        )
        .await;
    let mut untouched = Vec::new();
    for name in ["w-1", "w-2"] {
        let layout = world
            .add_machine(name, NodeRole::Worker, "cp.example", None)
            .await;
        untouched.push((name, caretaker_agent::inventory::discover(&layout), layout));
    }
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(
        &world,
        &md,
        "c1-md-0",
        json!({ names::REFRESH_CERTIFICATES: "90d" }),
    )
    .await;
    wait_parent(
        &world,
        &md,
        "c1-md-0",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_FAILED,
    )
    .await;
    let event = world
        .event_with("c1-md-0", names::EVENT_REFRESH_CERTS_FAILED)
        .await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("w-0") && message.contains("cannot connect"),
        "{message}"
    );
    // `failed` is final: nothing of this request runs or starts any more.
    for (name, before, layout) in &untouched {
        let annotations = world.annotations(name).await;
        for key in [
            names::REFRESH_CERTIFICATES,
            names::REFRESH_CERTIFICATES_STATUS,
            names::rollout_state::REFRESH_REQUEST,
        ] {
            assert!(
                !annotations.contains_key(key),
                "{name} must not start: {annotations:?}"
            );
        }
        assert_eq!(
            &caretaker_agent::inventory::discover(layout),
            before,
            "{name}'s certificates"
        );
    }
}

/// The first failure stops the rollout, but the parent reports `failed` only once the Machines
/// it started have finished: until then their work still changes the nodes, and a new request
/// on a `failed` parent would take that work for its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_rollout_ends_only_after_its_running_machines_finish() {
    let mut world = world(fast()).await;
    let hooks = world.dir.path().join("hooks");
    let gate = hooks.join("gate");
    let fails = upgrade_script(
        &hooks.join("fails.sh"),
        "echo 'no such release' >&2\nexit 1",
    );
    let slow = upgrade_script(
        &hooks.join("slow.sh"),
        &format!(
            "{}\necho \"$1\" >> {log}",
            wait_for_gate(&gate),
            log = hooks.join("releases").display()
        ),
    );
    world.add_upgradable("w-0", NodeRole::Worker, fails).await;
    world
        .add_upgradable("w-1", NodeRole::Worker, slow.clone())
        .await;
    world.add_upgradable("w-2", NodeRole::Worker, slow).await;
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(
        &world,
        &md,
        "c1-md-0",
        json!({ names::MAX_PARALLEL: "2", names::IN_PLACE_UPGRADE_TO: "channel=1.34/stable" }),
    )
    .await;
    world
        .wait_for("w-0", names::IN_PLACE_UPGRADE_STATUS, names::STATUS_FAILED)
        .await;
    // The parent has taken in w-0's failure (it says so, or it ended) while w-1 is held.
    let seen = wait_parent_until(&world, &md, "c1-md-0", "saw w-0 fail", |a| {
        a.get(names::IN_PLACE_UPGRADE_STATUS).map(String::as_str) == Some(names::STATUS_FAILED)
            || a.get(names::rollout_state::WAITING)
                .is_some_and(|w| w.contains("w-0 failed"))
    })
    .await;
    assert_eq!(
        seen[names::IN_PLACE_UPGRADE_STATUS],
        names::STATUS_IN_PROGRESS,
        "no final state while w-1 still runs: {seen:?}"
    );
    assert!(
        seen[names::rollout_state::WAITING].contains("w-1"),
        "{seen:?}"
    );
    assert_eq!(
        world.annotations("w-1").await[names::IN_PLACE_UPGRADE_STATUS],
        names::STATUS_IN_PROGRESS
    );

    std::fs::write(&gate, "").unwrap();
    let ended = wait_parent(
        &world,
        &md,
        "c1-md-0",
        names::IN_PLACE_UPGRADE_STATUS,
        names::STATUS_FAILED,
    )
    .await;
    assert_eq!(ended[names::PROGRESS], "1/3", "w-1 finished first");
    assert_eq!(
        world.annotations("w-1").await[names::IN_PLACE_UPGRADE_STATUS],
        names::STATUS_DONE
    );
    let message = world
        .event_with("c1-md-0", names::EVENT_UPGRADE_FAILED)
        .await
        .message
        .unwrap_or_default();
    assert!(
        message.contains("w-0") && message.contains("no such release"),
        "{message}"
    );
    let untouched = world.annotations("w-2").await;
    assert!(
        !untouched.contains_key(names::IN_PLACE_UPGRADE_TO)
            && !untouched.contains_key(names::IN_PLACE_UPGRADE_STATUS)
            && !untouched.contains_key(names::rollout_state::UPGRADE_REQUEST),
        "w-2 must not start: {untouched:?}"
    );
    assert_eq!(
        std::fs::read_to_string(hooks.join("releases")).unwrap(),
        "channel=1.34/stable\n",
        "only w-1 upgraded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_trigger_cancels_an_upgrade_rollout_after_running_work_finishes() {
    let mut world = world(fast()).await;
    let hooks = world.dir.path().join("hooks");
    let command = upgrade_script(
        &hooks.join("upgrade.sh"),
        "sleep 1\necho \"$1\" >> \"$(dirname \"$0\")/releases\"",
    );
    for i in 0..3 {
        world
            .add_upgradable(&format!("w-{i}"), NodeRole::Worker, command.clone())
            .await;
    }
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(
        &world,
        &md,
        "c1-md-0",
        json!({ names::IN_PLACE_UPGRADE_TO: "channel=1.34/stable" }),
    )
    .await;
    world
        .wait_for(
            "w-0",
            names::IN_PLACE_UPGRADE_STATUS,
            names::STATUS_IN_PROGRESS,
        )
        .await;
    annotate_parent(
        &world,
        &md,
        "c1-md-0",
        json!({ names::IN_PLACE_UPGRADE_TO: null }),
    )
    .await;
    let annotations = wait_parent(
        &world,
        &md,
        "c1-md-0",
        names::IN_PLACE_UPGRADE_STATUS,
        names::STATUS_CANCELLED,
    )
    .await;
    assert_eq!(
        annotations[names::PROGRESS],
        "1/3",
        "the running Machine finished"
    );
    world
        .event_with("c1-md-0", names::EVENT_UPGRADE_CANCELLED)
        .await;
    assert_eq!(
        std::fs::read_to_string(hooks.join("releases")).unwrap(),
        "channel=1.34/stable\n",
        "only one Machine upgraded"
    );
    assert_eq!(
        world.annotations("w-0").await[names::IN_PLACE_UPGRADE_STATUS],
        names::STATUS_DONE
    );
    assert!(
        !world
            .annotations("w-1")
            .await
            .contains_key(names::IN_PLACE_UPGRADE_STATUS)
    );
}

/// An upgrade command: a shell script at `path` running `body` (the release in `$1`).
fn upgrade_script(path: &std::path::Path, body: &str) -> CommandTemplate {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    CommandTemplate::parse(path.to_str().unwrap()).unwrap()
}

/// Shell lines that wait until file `gate` exists; bounded (20 s), so that a failing test that
/// never opens the gate still ends.
fn wait_for_gate(gate: &std::path::Path) -> String {
    format!(
        "i=0\nwhile [ ! -e {gate} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done",
        gate = gate.display()
    )
}

/// Checks, from the shared log of [`logging_scripts`], that every control-plane Machine
/// (`cp-*`) had ended its run before the first worker (`w-*`) started one.
fn assert_control_plane_before_workers(log: &std::path::Path) {
    let text = std::fs::read_to_string(log).unwrap();
    let first_worker = text
        .lines()
        .position(|l| l.starts_with("start w-"))
        .unwrap_or_else(|| panic!("no worker ran:\n{text}"));
    let control_plane_ends = text.lines().filter(|l| l.starts_with("end cp-")).count();
    let ended_before_workers = text
        .lines()
        .take(first_worker)
        .filter(|l| l.starts_with("end cp-"))
        .count();
    assert!(
        control_plane_ends > 0,
        "no control-plane Machine ran:\n{text}"
    );
    assert_eq!(
        ended_before_workers, control_plane_ends,
        "a worker started before the control plane had finished:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_parallel_is_respected_as_the_agents_see_it() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.6");
    for i in 0..5 {
        let name = format!("w-{i}");
        world
            .add_upgradable(&name, NodeRole::Worker, make(&name))
            .await;
    }
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    let annotations = roll_out(
        &world,
        &md,
        "c1-md-0",
        json!({ names::IN_PLACE_UPGRADE_TO: "revision=9", names::MAX_PARALLEL: "2" }),
        names::IN_PLACE_UPGRADE_STATUS,
    )
    .await;
    assert_eq!(annotations[names::IN_PLACE_UPGRADE_RELEASE], "revision=9");
    assert_eq!(annotations[names::PROGRESS], "5/5");
    let (max, runs) = concurrency(&log);
    assert_eq!(
        max, 2,
        "never more than max-parallel at once, and the parallelism is used"
    );
    assert!(
        runs.values().all(|n| *n == 1) && runs.len() == 5,
        "{runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_deployment_limit_holds_within_a_cluster_rollout() {
    let mut world = world(fast()).await;
    world
        .cluster
        .create_machine_deployment("c1-md-1")
        .await
        .unwrap();
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.6");
    world
        .add_upgradable("cp-0", NodeRole::ControlPlane, make("cp-0"))
        .await;
    for (deployment, prefix) in [("c1-md-0", "a"), ("c1-md-1", "b")] {
        world.deployment = deployment.into();
        for i in 0..3 {
            let name = format!("{prefix}-{i}");
            world
                .add_upgradable(&name, NodeRole::Worker, make(&name))
                .await;
        }
    }
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(&world, &md, "c1-md-0", json!({ names::MAX_PARALLEL: "1" })).await;
    annotate_parent(
        &world,
        &md,
        "c1-md-1",
        json!({ names::MAX_PARALLEL: "many" }),
    )
    .await;
    let clusters = caretaker_api::cluster_api::cluster_api_resource();
    roll_out(
        &world,
        &clusters,
        "c1",
        json!({ names::IN_PLACE_UPGRADE_TO: "revision=11", names::MAX_PARALLEL: "3" }),
        names::IN_PLACE_UPGRADE_STATUS,
    )
    .await;

    let (in_a, _) = concurrency_of(&log, |m| m.starts_with("a-"));
    let (in_b, _) = concurrency_of(&log, |m| m.starts_with("b-"));
    let (overall, runs) = concurrency(&log);
    assert_eq!(
        in_a, 1,
        "c1-md-0's own limit of 1 holds under the Cluster's 3"
    );
    assert_eq!(in_b, 1, "a malformed limit counts as 1");
    assert_eq!(
        overall, 2,
        "the two deployments still ran beside each other"
    );
    assert_eq!(runs.len(), 7);
    let warning = world
        .events("c1")
        .await
        .into_iter()
        .find(|e| e.type_.as_deref() == Some("Warning"))
        .expect("a Warning event about the malformed limit");
    let note = warning.message.unwrap_or_default();
    assert!(
        note.contains("\"many\"") && note.contains("MachineDeployment c1-md-1"),
        "{note}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_resumes_a_rollout_without_repeating_machines() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.5");
    for i in 0..3 {
        let name = format!("w-{i}");
        world
            .add_upgradable(&name, NodeRole::Worker, make(&name))
            .await;
    }
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(
        &world,
        &md,
        "c1-md-0",
        json!({ names::IN_PLACE_UPGRADE_TO: "revision=10" }),
    )
    .await;
    wait_parent(&world, &md, "c1-md-0", names::PROGRESS, "1/3").await;
    world.controller.abort();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let ctx = caretaker_operator::Context::new(world.client.clone(), fast());
    world.controller = tokio::spawn(common::run_controllers(ctx));
    wait_parent(
        &world,
        &md,
        "c1-md-0",
        names::IN_PLACE_UPGRADE_STATUS,
        names::STATUS_DONE,
    )
    .await;
    let (max, runs) = concurrency(&log);
    assert_eq!(max, 1);
    assert_eq!(
        runs.values().copied().collect::<Vec<_>>(),
        [1, 1, 1],
        "no Machine done twice: {runs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_refresh_goes_one_machine_at_a_time() {
    let mut world = world(fast()).await;
    for i in 0..3 {
        world
            .add_machine(
                &format!("cp-{i}"),
                NodeRole::ControlPlane,
                "cp.example",
                None,
            )
            .await;
    }
    world
        .add_machine("w-0", NodeRole::Worker, "cp.example", None)
        .await;
    let cp = caretaker_api::cluster_api::control_plane_api_resource();
    let annotations = roll_out(
        &world,
        &cp,
        "c1-control-plane",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
        names::REFRESH_CERTIFICATES_STATUS,
    )
    .await;
    assert_eq!(
        annotations[names::PROGRESS],
        "3/3",
        "the worker is not covered"
    );
    assert!(
        !world
            .annotations("w-0")
            .await
            .contains_key(names::rollout_state::REFRESH_REQUEST)
    );
    // One at a time: each control-plane Machine's refresh started after the previous one's ended.
    let mut spans = Vec::new();
    for name in ["cp-0", "cp-1", "cp-2"] {
        let events = world.events(name).await;
        let at = |reason: &str| {
            events
                .iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .and_then(|e| e.event_time.clone())
                .unwrap()
                .0
        };
        spans.push((
            at(names::EVENT_REFRESH_IN_PROGRESS),
            at(names::EVENT_REFRESH_DONE),
        ));
    }
    spans.sort();
    for pair in spans.windows(2) {
        assert!(
            pair[1].0 >= pair[0].1,
            "overlapping control-plane refreshes: {spans:?}"
        );
    }
}

/// Waits until Machine `name`'s annotations satisfy `done` (described by `what`).
async fn wait_machine_until(
    world: &World,
    name: &str,
    what: &str,
    done: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    wait_parent_until(
        world,
        &caretaker_api::cluster_api::machine_api_resource(),
        name,
        what,
        done,
    )
    .await
}

/// Waits until the operator has recorded when Machine `name`'s certificates expire.
async fn wait_expiry_recorded(world: &World, name: &str) -> BTreeMap<String, String> {
    wait_machine_until(world, name, "had its certificates' expiry recorded", |a| {
        a.contains_key(names::CERTIFICATES_EXPIRY)
    })
    .await
}

/// Two Clusters whose nodes' certificates expire in 30 days: c2 asks for a refresh 60 days
/// before expiry, so it is due; c1 only 7 days before, so it is not. In the time c2's refresh
/// takes from start to done, c1 starts nothing: an implementation that ignored `before` would
/// have refreshed both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn automatic_refresh_starts_when_expiry_is_within_before_and_not_earlier() {
    let mut world = world(fast()).await;
    world
        .add_machine("w-0", NodeRole::Worker, "cp.example", None)
        .await;
    world.cluster = ClusterObjects::new(&world.client, NS, "c2", "cp.example");
    world.cluster.create(&world.cas).await.unwrap();
    world
        .cluster
        .create_machine_deployment("c2-md-0")
        .await
        .unwrap();
    world.deployment = "c2-md-0".into();
    world
        .add_machine("x-0", NodeRole::Worker, "cp.example", None)
        .await;
    let not_due = wait_expiry_recorded(&world, "w-0").await;
    wait_expiry_recorded(&world, "x-0").await;

    let clusters = caretaker_api::cluster_api::cluster_api_resource();
    annotate_parent(
        &world,
        &clusters,
        "c1",
        json!({ names::AUTO_REFRESH_CERTIFICATES: "ttl=1y,before=7d" }),
    )
    .await;
    let due = roll_out(
        &world,
        &clusters,
        "c2",
        json!({ names::AUTO_REFRESH_CERTIFICATES: "ttl=1y,before=60d" }),
        names::REFRESH_CERTIFICATES_STATUS,
    )
    .await;
    assert_eq!(due[names::PROGRESS], "1/1");
    let expiry = world.annotations("x-0").await[names::CERTIFICATES_EXPIRY].clone();
    assert!(
        expiry.starts_with(&(time::OffsetDateTime::now_utc().year() + 1).to_string()),
        "c2's node got a year: {expiry}"
    );

    let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, &clusters);
    let c1 = api.get("c1").await.unwrap().metadata.annotations.unwrap();
    for key in [
        names::REFRESH_CERTIFICATES,
        names::REFRESH_CERTIFICATES_STATUS,
        names::rollout_state::REFRESH_REQUEST,
    ] {
        assert!(
            !c1.contains_key(key),
            "c1's refresh is not due for 23 days, yet it started: {c1:?}"
        );
    }
    let w0 = world.annotations("w-0").await;
    assert!(
        !w0.contains_key(names::rollout_state::REFRESH_REQUEST)
            && !w0.contains_key(names::REFRESH_CERTIFICATES),
        "w-0 must not be refreshed: {w0:?}"
    );
    assert_eq!(
        w0[names::CERTIFICATES_EXPIRY],
        not_due[names::CERTIFICATES_EXPIRY],
        "w-0's certificates are unchanged"
    );
}

/// A bad `auto-refresh-certificates` value gets one Warning event, however often the Cluster is
/// reconciled afterwards (here by an upgrade rollout, which reconciles it at every step and each
/// time reads the bad value); a different bad value is reported in turn, and a fixed one starts
/// the refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_automatic_refresh_value_is_reported_once() {
    let mut world = world(fast()).await;
    let upgrade = upgrade_script(&world.dir.path().join("hooks/upgrade.sh"), "true");
    world.add_upgradable("w-0", NodeRole::Worker, upgrade).await;
    wait_expiry_recorded(&world, "w-0").await;
    let clusters = caretaker_api::cluster_api::cluster_api_resource();
    let reports = |events: Vec<k8s_openapi::api::core::v1::Event>, value: &str| {
        events
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(names::EVENT_REFRESH_CERTS_FAILED)
                    && e.type_.as_deref() == Some("Warning")
                    && e.message.as_deref().is_some_and(|m| m.contains(value))
            })
            .count()
    };

    let bad = "ttl=1y,before=later";
    annotate_parent(
        &world,
        &clusters,
        "c1",
        json!({ names::AUTO_REFRESH_CERTIFICATES: bad }),
    )
    .await;
    world
        .event_with("c1", names::EVENT_REFRESH_CERTS_FAILED)
        .await;
    roll_out(
        &world,
        &clusters,
        "c1",
        json!({ names::IN_PLACE_UPGRADE_TO: "revision=2" }),
        names::IN_PLACE_UPGRADE_STATUS,
    )
    .await;
    let events = world.events("c1").await;
    assert_eq!(
        reports(events.clone(), bad),
        1,
        "{bad} reported once, not on every reconcile; events of c1: {:?}",
        events.iter().map(|e| &e.reason).collect::<Vec<_>>()
    );

    let other = "ttl=1y;before=30d";
    annotate_parent(
        &world,
        &clusters,
        "c1",
        json!({ names::AUTO_REFRESH_CERTIFICATES: other }),
    )
    .await;
    wait_parent(
        &world,
        &clusters,
        "c1",
        names::rollout_state::AUTO_REFRESH_REPORTED,
        other,
    )
    .await;
    // The Warning is recorded after the annotation that remembers it is written.
    let mut events = world.events("c1").await;
    for _ in 0..200 {
        if reports(events.clone(), other) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        events = world.events("c1").await;
    }
    assert_eq!(reports(events.clone(), other), 1, "{other} reported");
    assert_eq!(reports(events, bad), 1, "{bad} not reported again");

    roll_out(
        &world,
        &clusters,
        "c1",
        json!({ names::AUTO_REFRESH_CERTIFICATES: "ttl=1y,before=60d" }),
        names::REFRESH_CERTIFICATES_STATUS,
    )
    .await;
    let expiry = world.annotations("w-0").await[names::CERTIFICATES_EXPIRY].clone();
    assert!(
        expiry.starts_with(&(time::OffsetDateTime::now_utc().year() + 1).to_string()),
        "{expiry}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_upgrade_covers_three_control_planes_and_two_machine_deployments() {
    let mut world = world(fast()).await;
    world
        .cluster
        .create_machine_deployment("c1-md-1")
        .await
        .unwrap();
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.1");
    for i in 0..3 {
        let name = format!("cp-{i}");
        world
            .add_upgradable(&name, NodeRole::ControlPlane, make(&name))
            .await;
    }
    for i in 0..5 {
        let name = format!("w-{i}");
        world.deployment = if i < 3 {
            "c1-md-0".into()
        } else {
            "c1-md-1".into()
        };
        world
            .add_upgradable(&name, NodeRole::Worker, make(&name))
            .await;
    }
    let clusters = caretaker_api::cluster_api::cluster_api_resource();
    let annotations = roll_out(
        &world,
        &clusters,
        "c1",
        json!({ names::IN_PLACE_UPGRADE_TO: "channel=1.34/stable", names::MAX_PARALLEL: "3" }),
        names::IN_PLACE_UPGRADE_STATUS,
    )
    .await;
    assert_eq!(annotations[names::PROGRESS], "8/8");
    assert_eq!(
        annotations[names::IN_PLACE_UPGRADE_RELEASE],
        "channel=1.34/stable"
    );
    let (max, runs) = concurrency(&log);
    assert!(max <= 3, "{max}");
    assert_eq!(runs.len(), 8);
    assert!(runs.values().all(|n| *n == 1));
    assert_control_plane_before_workers(&log);
    world.event_with("c1", names::EVENT_UPGRADE_DONE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_control_plane_machine_stops_the_cluster_rollout() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.1");
    for i in 0..3 {
        let name = format!("cp-{i}");
        world
            .add_upgradable(&name, NodeRole::ControlPlane, make(&name))
            .await;
    }
    world
        .add_upgradable("w-0", NodeRole::Worker, make("w-0"))
        .await;
    // cp-1's upgrade command fails.
    std::fs::write(
        world.dir.path().join("hooks/cp-1/upgrade.sh"),
        "#!/bin/sh\necho \"no space left on device\" >&2\nexit 1\n",
    )
    .unwrap();
    let clusters = caretaker_api::cluster_api::cluster_api_resource();
    annotate_parent(
        &world,
        &clusters,
        "c1",
        json!({ names::IN_PLACE_UPGRADE_TO: "revision=3" }),
    )
    .await;
    wait_parent(
        &world,
        &clusters,
        "c1",
        names::IN_PLACE_UPGRADE_STATUS,
        names::STATUS_FAILED,
    )
    .await;
    let event = world.event_with("c1", names::EVENT_UPGRADE_FAILED).await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("cp-1") && message.contains("no space left on device"),
        "{message}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, runs) = concurrency(&log);
    assert_eq!(
        runs.keys().collect::<Vec<_>>(),
        ["cp-0"],
        "nothing after cp-1 started: {runs:?}"
    );
    for name in ["cp-2", "w-0"] {
        assert!(
            !world
                .annotations(name)
                .await
                .contains_key(names::IN_PLACE_UPGRADE_TO),
            "{name}"
        );
    }
    // Issue 32, the proposal's failure scenario: `failed` on the Machine, its parent and the
    // Cluster, and no trigger left on any of them; what was asked for stays on record.
    let cp1 = world.annotations("cp-1").await;
    assert_eq!(cp1[names::IN_PLACE_UPGRADE_STATUS], names::STATUS_FAILED);
    assert!(!cp1.contains_key(names::IN_PLACE_UPGRADE_TO), "{cp1:?}");
    let planes = caretaker_api::cluster_api::control_plane_api_resource();
    let plane = wait_parent(
        &world,
        &planes,
        "c1-control-plane",
        names::IN_PLACE_UPGRADE_STATUS,
        names::STATUS_FAILED,
    )
    .await;
    world
        .event_with("c1-control-plane", names::EVENT_UPGRADE_FAILED)
        .await;
    let cluster = world.parent_annotations(&clusters, "c1").await;
    for (what, annotations) in [("CK8sControlPlane", &plane), ("Cluster", &cluster)] {
        assert!(
            !annotations.contains_key(names::IN_PLACE_UPGRADE_TO),
            "{what} keeps no trigger: {annotations:?}"
        );
        assert_eq!(
            annotations[names::rollout_state::UPGRADE_REQUESTED],
            "revision=3",
            "{what}"
        );
    }
    assert_eq!(
        cluster[names::IN_PLACE_UPGRADE_STATUS],
        names::STATUS_FAILED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_upgrade_and_a_two_deployment_cluster_refresh() {
    let mut world = world(fast()).await;
    world
        .cluster
        .create_machine_deployment("c1-md-1")
        .await
        .unwrap();
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.1");
    for i in 0..3 {
        let name = format!("cp-{i}");
        world
            .add_upgradable(&name, NodeRole::ControlPlane, make(&name))
            .await;
    }
    let mut layouts = Vec::new();
    for i in 0..5 {
        let name = format!("w-{i}");
        world.deployment = if i < 3 {
            "c1-md-0".into()
        } else {
            "c1-md-1".into()
        };
        layouts.push(
            world
                .add_upgradable(&name, NodeRole::Worker, make(&name))
                .await,
        );
    }

    // The control plane alone: only its three Machines, one at a time.
    let cp = caretaker_api::cluster_api::control_plane_api_resource();
    let annotations = roll_out(
        &world,
        &cp,
        "c1-control-plane",
        json!({ names::IN_PLACE_UPGRADE_TO: "revision=21" }),
        names::IN_PLACE_UPGRADE_STATUS,
    )
    .await;
    assert_eq!(annotations[names::PROGRESS], "3/3");
    assert_eq!(annotations[names::IN_PLACE_UPGRADE_RELEASE], "revision=21");
    let (max, runs) = concurrency(&log);
    assert_eq!(max, 1);
    assert_eq!(runs.keys().collect::<Vec<_>>(), ["cp-0", "cp-1", "cp-2"]);
    world
        .event_with("c1-control-plane", names::EVENT_UPGRADE_DONE)
        .await;

    // Then a certificate refresh of the whole Cluster: 3 control planes + 5 workers in two
    // MachineDeployments.
    let clusters = caretaker_api::cluster_api::cluster_api_resource();
    let annotations = roll_out(
        &world,
        &clusters,
        "c1",
        json!({ names::REFRESH_CERTIFICATES: "2y", names::MAX_PARALLEL: "2" }),
        names::REFRESH_CERTIFICATES_STATUS,
    )
    .await;
    assert_eq!(annotations[names::PROGRESS], "8/8");
    for layout in &layouts {
        let days = (caretaker_agent::inventory::discover(layout)
            .earliest_expiry()
            .unwrap()
            - time::OffsetDateTime::now_utc())
        .whole_days();
        assert!(days > 700, "{days}");
    }
    for name in ["cp-0", "cp-1", "cp-2", "w-0", "w-4"] {
        assert_eq!(
            world.annotations(name).await[names::REFRESH_CERTIFICATES_STATUS],
            names::STATUS_DONE,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_without_a_node_wait_and_deleted_ones_are_skipped() {
    let mut world = world(fast()).await;
    world
        .add_machine("w-0", NodeRole::Worker, "cp.example", None)
        .await;
    world
        .add_machine("w-1", NodeRole::Worker, "cp.example", None)
        .await;
    world
        .add_machine("w-2", NodeRole::Worker, "cp.example", None)
        .await;
    // w-1 loses its node; w-2 is being deleted (a finalizer keeps it around).
    let no_node = json!({ "status": { "nodeRef": null } });
    world
        .machines()
        .patch_status("w-1", &PatchParams::default(), &Patch::Merge(&no_node))
        .await
        .unwrap();
    let finalizer = json!({ "metadata": { "finalizers": ["test.caretaker.dev/hold"] } });
    world
        .machines()
        .patch("w-2", &PatchParams::default(), &Patch::Merge(&finalizer))
        .await
        .unwrap();
    world
        .machines()
        .delete("w-2", &Default::default())
        .await
        .unwrap();

    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(
        &world,
        &md,
        "c1-md-0",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
    )
    .await;
    wait_parent(&world, &md, "c1-md-0", names::PROGRESS, "1/2").await;
    world
        .event_with("c1-md-0", names::EVENT_REFRESH_CERTS_IN_PROGRESS)
        .await;
    let mut saw_wait = false;
    for _ in 0..100 {
        if world.events("c1-md-0").await.iter().any(|e| {
            e.message
                .as_deref()
                .unwrap_or_default()
                .contains("waiting for w-1 to get a node")
        }) {
            saw_wait = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        saw_wait,
        "an event says the rollout waits for w-1: {:?}",
        world.events("c1-md-0").await
    );

    let node = json!({ "status": { "nodeRef": { "name": "node-w-1" } } });
    world
        .machines()
        .patch_status("w-1", &PatchParams::default(), &Patch::Merge(&node))
        .await
        .unwrap();
    let annotations = wait_parent(
        &world,
        &md,
        "c1-md-0",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_DONE,
    )
    .await;
    assert_eq!(
        annotations[names::PROGRESS],
        "2/2",
        "the Machine being deleted is not counted"
    );
    assert!(
        !world
            .annotations("w-2")
            .await
            .contains_key(names::REFRESH_CERTIFICATES),
        "w-2 was skipped"
    );
}

/// The two operations, as the new-request-after-an-end cases need them.
#[derive(Debug, Clone, Copy)]
enum Operation {
    Refresh,
    Upgrade,
}

impl Operation {
    fn trigger(self) -> &'static str {
        match self {
            Operation::Refresh => names::REFRESH_CERTIFICATES,
            Operation::Upgrade => names::IN_PLACE_UPGRADE_TO,
        }
    }
    fn status(self) -> &'static str {
        match self {
            Operation::Refresh => names::REFRESH_CERTIFICATES_STATUS,
            Operation::Upgrade => names::IN_PLACE_UPGRADE_STATUS,
        }
    }
    fn request(self) -> &'static str {
        match self {
            Operation::Refresh => names::rollout_state::REFRESH_REQUEST,
            Operation::Upgrade => names::rollout_state::UPGRADE_REQUEST,
        }
    }
    fn request_trigger(self) -> &'static str {
        match self {
            Operation::Refresh => names::rollout_state::REFRESH_TRIGGER,
            Operation::Upgrade => names::rollout_state::UPGRADE_TRIGGER,
        }
    }
    /// The trigger values of the ended request and of the new one.
    fn values(self) -> [&'static str; 2] {
        match self {
            Operation::Refresh => ["1y", "2y"],
            Operation::Upgrade => ["channel=1.34/stable", "channel=1.35/stable"],
        }
    }
}

/// How the first request ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// At the second of four workers, whose agent cannot be reached.
    Failed,
    /// Its trigger removed while the first worker runs.
    Cancelled,
}

/// A request ends as `end` says; once the cause is fixed, a new request (the trigger removed,
/// then set again, to a new value or to the same one, with `max_parallel`) must cover all four
/// workers: those the ended request finished are done again (their agents see a second run),
/// and no Machine's old status is taken for the new request's result.
async fn a_new_request_after(
    end: End,
    operation: Operation,
    parent: &kube::api::ApiResource,
    parent_name: &str,
    max_parallel: &str,
    same_value: bool,
) {
    let mut world = world(fast()).await;
    // Long enough a run for the trigger to be removed while the first one still runs.
    let seconds = match end {
        End::Failed => "0",
        End::Cancelled => "0.5",
    };
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), seconds);
    let mut layouts = Vec::new();
    for i in 0..4 {
        let name = format!("w-{i}");
        // Both hooks log, so the log shows each node's every refresh (its restart hook) and
        // every upgrade.
        let (restart, upgrade) = (Some(make(&name)), Some(make(&name)));
        layouts.push(
            world
                .add_machine_with(
                    &name,
                    NodeRole::Worker,
                    "cp.example",
                    None,
                    restart,
                    upgrade,
                )
                .await,
        );
    }
    if end == End::Failed {
        world
            .annotate("w-1", names::AGENT_ENDPOINT, &unreachable_agent_url())
            .await;
    }
    let [first, new_value] = operation.values();
    let second = if same_value { first } else { new_value };
    annotate_parent(
        &world,
        parent,
        parent_name,
        json!({ operation.trigger(): first }),
    )
    .await;
    let removed = json!({ names::MAX_PARALLEL: max_parallel, operation.trigger(): null });
    let ended = match end {
        End::Failed => {
            let failed = wait_parent(
                &world,
                parent,
                parent_name,
                operation.status(),
                names::STATUS_FAILED,
            )
            .await;
            assert_eq!(failed[names::PROGRESS], "1/4");
            assert_eq!(
                world.annotations("w-1").await[operation.status()],
                names::STATUS_FAILED
            );
            world
                .annotate("w-1", names::AGENT_ENDPOINT, &world.agents[1].url)
                .await;
            annotate_parent(&world, parent, parent_name, removed).await;
            failed
        }
        End::Cancelled => {
            world
                .wait_for("w-0", operation.status(), names::STATUS_IN_PROGRESS)
                .await;
            annotate_parent(&world, parent, parent_name, removed).await;
            wait_parent(
                &world,
                parent,
                parent_name,
                operation.status(),
                names::STATUS_CANCELLED,
            )
            .await
        }
    };
    // A Cluster's request goes through its MachineDeployment: the Machines carry that one's id.
    let tagged_by = |parent_annotations: &BTreeMap<String, String>| {
        let parent_annotations = parent_annotations.clone();
        let world = &world;
        async move {
            if parent.kind == "Cluster" {
                let md = caretaker_api::cluster_api::machine_deployment_api_resource();
                let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, &md);
                let child = api
                    .get("c1-md-0")
                    .await
                    .unwrap()
                    .metadata
                    .annotations
                    .unwrap_or_default();
                child.get(operation.request()).cloned()
            } else {
                parent_annotations.get(operation.request()).cloned()
            }
        }
    };
    let ended_tag = tagged_by(&ended).await;
    let mut statuses = BTreeMap::new();
    let mut finished = Vec::new();
    for i in 0..4 {
        let name = format!("w-{i}");
        let machine = world.annotations(&name).await;
        if machine.get(operation.request()) == ended_tag.as_ref()
            && machine.get(operation.status()).map(String::as_str) == Some(names::STATUS_DONE)
        {
            finished.push(name.clone());
        }
        statuses.insert(name, machine.get(operation.status()).cloned());
    }
    assert!(
        finished.contains(&"w-0".to_string()),
        "w-0 finished by the ended request: {statuses:?}"
    );
    // The removal is seen (the ended request's value forgotten) before the trigger returns.
    wait_parent_until(
        &world,
        parent,
        parent_name,
        "forgot the ended request's trigger",
        |a| !a.contains_key(operation.request_trigger()),
    )
    .await;
    for (name, status) in &statuses {
        assert_eq!(
            world.annotations(name).await.get(operation.status()),
            status.as_ref(),
            "nothing restarts {name} before the trigger is set again"
        );
    }
    annotate_parent(
        &world,
        parent,
        parent_name,
        json!({ operation.trigger(): second }),
    )
    .await;
    let a_new_one_ended = |a: &BTreeMap<String, String>| {
        a.get(operation.request()) != ended.get(operation.request())
            && [names::STATUS_DONE, names::STATUS_FAILED]
                .contains(&a.get(operation.status()).map_or("", String::as_str))
    };
    let annotations = wait_parent_until(
        &world,
        parent,
        parent_name,
        "ended a new request",
        a_new_one_ended,
    )
    .await;
    assert_eq!(
        annotations[operation.status()],
        names::STATUS_DONE,
        "the new request failed: {:?}",
        world
            .events(parent_name)
            .await
            .into_iter()
            .filter_map(|e| e.message)
            .collect::<Vec<_>>()
    );
    assert_eq!(annotations[names::PROGRESS], "4/4");
    let new_tag = tagged_by(&annotations).await;
    // As the agents see it: what the ended request finished runs again, the rest once.
    let (_, runs) = concurrency(&log);
    for i in 0..4 {
        let name = format!("w-{i}");
        let expected = if finished.contains(&name) { 2 } else { 1 };
        assert_eq!(
            runs.get(&name).copied().unwrap_or(0),
            expected,
            "{name} must run {expected} time(s) in all (finished by the ended request: \
             {finished:?}); the agents saw {runs:?}"
        );
        let machine = world.annotations(&name).await;
        assert_eq!(machine[operation.status()], names::STATUS_DONE, "{name}");
        assert_eq!(
            machine.get(operation.request()),
            new_tag.as_ref(),
            "{name} done by the new request"
        );
    }
    match operation {
        Operation::Refresh => {
            for layout in &layouts {
                let expiry = caretaker_agent::inventory::discover(layout)
                    .earliest_expiry()
                    .unwrap();
                let days = (expiry - time::OffsetDateTime::now_utc()).whole_days();
                let ttl_days = second.parse::<caretaker_pki::Ttl>().unwrap().approximate();
                let ttl_days = (ttl_days.as_secs() / 86_400) as i64;
                assert!(days > ttl_days - 2, "{second} gave {days} days");
            }
        }
        Operation::Upgrade => {
            assert_eq!(annotations[names::IN_PLACE_UPGRADE_RELEASE], second);
        }
    }
}

/// Issue 9, item 13: the recovery how-to's new request, for both operations, on a
/// MachineDeployment and on a Cluster, one and two at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_request_after_a_failed_rollout_covers_every_machine() {
    let parents = [
        (
            caretaker_api::cluster_api::machine_deployment_api_resource(),
            "c1-md-0",
        ),
        (caretaker_api::cluster_api::cluster_api_resource(), "c1"),
    ];
    for operation in [Operation::Refresh, Operation::Upgrade] {
        for (parent, parent_name) in &parents {
            for max_parallel in ["1", "2"] {
                eprintln!(
                    "case: {operation:?} on {} {parent_name}, max-parallel {max_parallel}",
                    parent.kind
                );
                a_new_request_after(
                    End::Failed,
                    operation,
                    parent,
                    parent_name,
                    max_parallel,
                    false,
                )
                .await;
            }
        }
    }
}

/// `kubectl annotate --overwrite` with an unchanged value changes nothing, so a failed rollout
/// is retried by removing the parent's trigger and adding the same value again: a new request
/// that redoes every Machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_trigger_removed_and_added_again_retries_a_failed_rollout() {
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    a_new_request_after(End::Failed, Operation::Refresh, &md, "c1-md-0", "1", true).await;
    let cluster = caretaker_api::cluster_api::cluster_api_resource();
    a_new_request_after(End::Failed, Operation::Upgrade, &cluster, "c1", "2", true).await;
}

/// A cancelled rollout is retried the same way: setting the trigger again (after its removal
/// cancelled the request) is a new request with a new id, and it redoes the Machines the
/// cancelled request finished, as their agents see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_request_after_a_cancelled_rollout_redoes_every_machine() {
    let cluster = caretaker_api::cluster_api::cluster_api_resource();
    a_new_request_after(
        End::Cancelled,
        Operation::Refresh,
        &cluster,
        "c1",
        "2",
        true,
    )
    .await;
    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    a_new_request_after(
        End::Cancelled,
        Operation::Upgrade,
        &md,
        "c1-md-0",
        "1",
        false,
    )
    .await;
}

/// The control-plane gate end to end: while the agent of one control-plane Machine (cp-1, not
/// the next to go) is down, a Cluster refresh starts nothing, not even the healthy cp-0, and says
/// what it waits for. When the agent comes back at the same address (so nothing about the
/// Machine changes in the API server), the rollout goes on by itself to done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_control_plane_agent_holds_a_cluster_rollout_until_it_recovers() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0");
    for name in ["cp-0", "cp-1"] {
        world
            .add_restartable(name, NodeRole::ControlPlane, make(name))
            .await;
    }
    world
        .add_restartable("w-0", NodeRole::Worker, make("w-0"))
        .await;
    let mut cp1_agent = common::outage::Outage::start(&world.agents[1].url).await;
    world
        .annotate("cp-1", names::AGENT_ENDPOINT, &cp1_agent.url())
        .await;
    cp1_agent.stop();

    let clusters = caretaker_api::cluster_api::cluster_api_resource();
    annotate_parent(
        &world,
        &clusters,
        "c1",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
    )
    .await;
    // The control plane's own request waits, and says so on its object.
    let planes = caretaker_api::cluster_api::control_plane_api_resource();
    let held = wait_parent_until(
        &world,
        &planes,
        "c1-control-plane",
        "waiting for the health of cp-1's agent",
        |a| {
            a.get(names::rollout_state::WAITING)
                .is_some_and(|w| w.contains("cp-1") && w.contains("healthy agent"))
        },
    )
    .await;
    let waiting = &held[names::rollout_state::WAITING];
    assert!(!waiting.contains("cp-0"), "only cp-1 is named: {waiting}");
    assert_eq!(
        held[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_IN_PROGRESS
    );
    assert_eq!(held[names::PROGRESS], "0/2");
    let cluster = wait_parent(&world, &clusters, "c1", names::PROGRESS, "0/3").await;
    assert_eq!(
        cluster[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_IN_PROGRESS
    );
    let said = world.events("c1-control-plane").await.into_iter().any(|e| {
        e.reason.as_deref() == Some(names::EVENT_REFRESH_CERTS_IN_PROGRESS)
            && e.message.as_deref() == Some(waiting.as_str())
    });
    assert!(said, "an event says what the rollout waits for: {waiting}");
    for name in ["cp-0", "cp-1", "w-0"] {
        let annotations = world.annotations(name).await;
        assert!(
            !annotations.contains_key(names::rollout_state::REFRESH_REQUEST)
                && !annotations.contains_key(names::REFRESH_CERTIFICATES),
            "{name} must not start while cp-1's agent is down: {annotations:?}"
        );
    }
    let (_, runs) = concurrency(&log);
    assert!(runs.is_empty(), "no node restarted: {runs:?}");

    cp1_agent.resume().await;
    let done = wait_parent(
        &world,
        &clusters,
        "c1",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_DONE,
    )
    .await;
    assert_eq!(done[names::PROGRESS], "3/3");
    assert!(
        !done.contains_key(names::rollout_state::WAITING),
        "the wait is over: {done:?}"
    );
    let (_, runs) = concurrency(&log);
    assert_eq!(runs.len(), 3, "every node restarted: {runs:?}");
    assert_control_plane_before_workers(&log);
}

/// A lagging cache never starts a Machine twice (docs/orchestration.md): a Machine is started
/// only at the version the decision saw. The test plays a reconcile whose cache still holds w-0
/// as it was before this request started it, and starts it as the controller does
/// ([`start_machines`]) after the request has finished it: the API server refuses the write,
/// w-0 is not started again, and the rollout goes on to done with each node refreshed once.
///
/// [`start_machines`]: caretaker_operator::rollout::controller::start_machines
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_view_of_a_machine_never_starts_it_again() {
    use caretaker_operator::rollout::controller::{self as rollout, Started};

    let mut world = world(fast()).await;
    let hooks = world.dir.path().join("hooks");
    let (log, make) = logging_scripts(hooks.clone(), "0");
    world
        .add_restartable("w-0", NodeRole::Worker, make("w-0"))
        .await;
    // w-1 goes second and its restart waits for a gate: the rollout stays in progress.
    let gate = hooks.join("gate");
    make("w-1");
    let gated = upgrade_script(
        &hooks.join("w-1/gated.sh"),
        &format!(
            "{}\nexec {}",
            wait_for_gate(&gate),
            hooks.join("w-1/upgrade.sh").display()
        ),
    );
    world.add_restartable("w-1", NodeRole::Worker, gated).await;
    let stale = machine::MachineView::from_object(&world.machines().get("w-0").await.unwrap());

    let md = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(
        &world,
        &md,
        "c1-md-0",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
    )
    .await;
    let parent = wait_parent(&world, &md, "c1-md-0", names::PROGRESS, "1/2").await;
    let request = &parent[names::rollout_state::REFRESH_REQUEST];
    let w0 = world.annotations("w-0").await;
    assert_eq!(w0[names::REFRESH_CERTIFICATES_STATUS], names::STATUS_DONE);
    assert_eq!(&w0[names::rollout_state::REFRESH_REQUEST], request);

    let started = rollout::start_machines(
        &world.client,
        names::Operation::RefreshCertificates,
        "1y",
        request,
        &[&stale],
    )
    .await
    .unwrap();
    let after = world.annotations("w-0").await;
    assert_eq!(
        started,
        Started::Stale("w-0".into()),
        "the write at w-0's stale version must be refused; w-0 now: {after:?}"
    );
    assert!(
        !after.contains_key(names::REFRESH_CERTIFICATES)
            && after[names::REFRESH_CERTIFICATES_STATUS] == names::STATUS_DONE,
        "w-0 was started again: {after:?}"
    );

    std::fs::write(&gate, "").unwrap();
    let done = wait_parent(
        &world,
        &md,
        "c1-md-0",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_DONE,
    )
    .await;
    assert_eq!(done[names::PROGRESS], "2/2");
    let (_, runs) = concurrency(&log);
    assert_eq!(
        runs.into_iter().collect::<Vec<_>>(),
        [("w-0".to_string(), 1), ("w-1".to_string(), 1)],
        "each node refreshed once"
    );
}

/// Watches every change of every Machine until dropped, and records the most control-plane
/// Machines busy at once: asked for and not ended, or running, for either operation.
struct BusyWatch {
    most: std::sync::Arc<std::sync::Mutex<(usize, Vec<String>)>>,
    task: tokio::task::JoinHandle<()>,
}

impl BusyWatch {
    fn start(world: &World) -> Self {
        use futures::StreamExt;
        let api: Api<DynamicObject> = Api::namespaced_with(
            world.client.clone(),
            NS,
            &caretaker_api::cluster_api::machine_api_resource(),
        );
        let most = std::sync::Arc::new(std::sync::Mutex::new((0, Vec::new())));
        let record = most.clone();
        let task = tokio::spawn(async move {
            let mut busy: BTreeMap<String, bool> = BTreeMap::new();
            let mut changes = kube::runtime::watcher(api, Default::default())
                .applied_objects()
                .boxed();
            while let Some(Ok(m)) = changes.next().await {
                let labels = m.metadata.labels.clone().unwrap_or_default();
                if !labels.contains_key(names::CONTROL_PLANE_LABEL) {
                    continue;
                }
                let a = m.metadata.annotations.clone().unwrap_or_default();
                let is_busy = [
                    (
                        names::REFRESH_CERTIFICATES,
                        names::REFRESH_CERTIFICATES_STATUS,
                    ),
                    (names::IN_PLACE_UPGRADE_TO, names::IN_PLACE_UPGRADE_STATUS),
                ]
                .into_iter()
                .any(|(trigger, status)| {
                    let status = a.get(status).map(String::as_str);
                    status == Some(names::STATUS_IN_PROGRESS)
                        || (a.contains_key(trigger)
                            && !matches!(
                                status,
                                Some(names::STATUS_FAILED) | Some(names::STATUS_CANCELLED)
                            ))
                });
                busy.insert(m.metadata.name.clone().unwrap_or_default(), is_busy);
                let now: Vec<String> = busy
                    .iter()
                    .filter(|(_, b)| **b)
                    .map(|(n, _)| n.clone())
                    .collect();
                let mut most = record.lock().unwrap();
                if now.len() > most.0 {
                    *most = (now.len(), now);
                }
            }
        });
        Self { most, task }
    }

    fn most(&self) -> (usize, Vec<String>) {
        self.most.lock().unwrap().clone()
    }
}

impl Drop for BusyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Issue 32: `kubectl annotate cluster c1 refresh-certificates=60d` and, at the same moment,
/// `kubectl annotate ck8scontrolplane c1-control-plane refresh-certificates=90d`. The control
/// plane's own request (set first here, by a few milliseconds) runs; the Cluster's waits for it
/// (one Warning naming it), then goes through the control plane and the MachineDeployment.
/// Both end `done`, each Machine is refreshed once per request that covers it, and a watch on
/// every Machine change never sees two control-plane Machines busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_request_and_a_control_plane_request_at_once_both_finish_one_machine_at_a_time() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.2");
    for name in ["cp-0", "cp-1", "cp-2", "w-0", "w-1"] {
        let role = if name.starts_with("cp") {
            NodeRole::ControlPlane
        } else {
            NodeRole::Worker
        };
        world.add_restartable(name, role, make(name)).await;
    }
    let watch = BusyWatch::start(&world);
    let (planes, clusters) = (
        caretaker_api::cluster_api::control_plane_api_resource(),
        caretaker_api::cluster_api::cluster_api_resource(),
    );
    annotate_parent(
        &world,
        &planes,
        "c1-control-plane",
        json!({ names::REFRESH_CERTIFICATES: "90d" }),
    )
    .await;
    annotate_parent(
        &world,
        &clusters,
        "c1",
        json!({ names::REFRESH_CERTIFICATES: "60d" }),
    )
    .await;
    let cluster = wait_parent(
        &world,
        &clusters,
        "c1",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_DONE,
    )
    .await;
    assert_eq!(cluster[names::PROGRESS], "5/5");
    assert!(!cluster.contains_key(names::REFRESH_CERTIFICATES));
    assert!(!cluster.contains_key(names::rollout_state::WAITING_FOR));
    let plane = wait_parent(
        &world,
        &planes,
        "c1-control-plane",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_DONE,
    )
    .await;
    assert_eq!(
        plane[names::rollout_state::REFRESH_CLUSTER_REQUEST],
        cluster[names::rollout_state::REFRESH_REQUEST],
        "the control plane's last request was the Cluster's"
    );
    let plane_done = world
        .events("c1-control-plane")
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(names::EVENT_REFRESH_CERTS_DONE))
        .count();
    assert_eq!(
        plane_done, 2,
        "the user's request and the Cluster's both ended done"
    );
    let waits: Vec<String> = world
        .events("c1")
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.message)
        .collect();
    assert_eq!(waits.len(), 1, "one Warning: {waits:?}");
    assert!(
        waits[0].contains("CK8sControlPlane/c1-control-plane"),
        "{waits:?}"
    );

    let (_, runs) = concurrency(&log);
    let text = std::fs::read_to_string(&log).unwrap();
    for (name, expected) in [
        ("cp-0", 2),
        ("cp-1", 2),
        ("cp-2", 2),
        ("w-0", 1),
        ("w-1", 1),
    ] {
        assert_eq!(
            runs.get(name).copied(),
            Some(expected),
            "{name} refreshed once per request covering it:\n{text}"
        );
    }
    let (most, at) = watch.most();
    assert_eq!(most, 1, "control-plane Machines busy at once: {at:?}");
}

/// Each level shows a Cluster request while it runs, not only once it has ended: the control
/// plane is `in-progress` with the Cluster's mark and its own event while the workers have not
/// started, then the MachineDeployment while the control plane is `done`, and the Cluster stays
/// `in-progress` throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_level_shows_a_cluster_request_while_it_runs() {
    let mut world = world(fast()).await;
    // Restarts long enough for each phase to be seen.
    let (_log, make) = logging_scripts(world.dir.path().join("hooks"), "1.5");
    world
        .add_restartable("cp-0", NodeRole::ControlPlane, make("cp-0"))
        .await;
    world
        .add_restartable("w-0", NodeRole::Worker, make("w-0"))
        .await;
    let cluster = caretaker_api::cluster_api::cluster_api_resource();
    let plane = caretaker_api::cluster_api::control_plane_api_resource();
    let deployment = caretaker_api::cluster_api::machine_deployment_api_resource();
    annotate_parent(
        &world,
        &cluster,
        "c1",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
    )
    .await;

    let plane_during = wait_parent(
        &world,
        &plane,
        "c1-control-plane",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_IN_PROGRESS,
    )
    .await;
    assert_eq!(plane_during[names::REFRESH_CERTIFICATES], "1y");
    let cluster_during = world.parent_annotations(&cluster, "c1").await;
    assert_eq!(
        cluster_during[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_IN_PROGRESS
    );
    assert_eq!(
        plane_during[names::rollout_state::REFRESH_CLUSTER_REQUEST],
        cluster_during[names::rollout_state::REFRESH_REQUEST],
        "the control plane's request is marked as the Cluster's"
    );
    let workers_during = world.parent_annotations(&deployment, "c1-md-0").await;
    assert!(
        !workers_during.contains_key(names::REFRESH_CERTIFICATES),
        "the workers wait for the control plane: {workers_during:?}"
    );
    world
        .event_with("c1-control-plane", names::EVENT_REFRESH_CERTS_IN_PROGRESS)
        .await;

    let workers_during = wait_parent(
        &world,
        &deployment,
        "c1-md-0",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_IN_PROGRESS,
    )
    .await;
    assert_eq!(workers_during[names::REFRESH_CERTIFICATES], "1y");
    let plane_after = world.parent_annotations(&plane, "c1-control-plane").await;
    assert_eq!(
        plane_after[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_DONE
    );
    assert_eq!(
        world.parent_annotations(&cluster, "c1").await[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_IN_PROGRESS,
        "the Cluster waits for its last child"
    );
    world
        .event_with("c1-md-0", names::EVENT_REFRESH_CERTS_IN_PROGRESS)
        .await;

    wait_parent(
        &world,
        &cluster,
        "c1",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_DONE,
    )
    .await;
    world
        .event_with("c1", names::EVENT_REFRESH_CERTS_DONE)
        .await;
}

// Forgeries by someone who may write some objects of the namespace but not others (issue 32's
// user-visible marks). Each performs the attack through the API server and checks that the
// operator's decision does not follow it.

/// Someone who may write the MachineDeployment (not the Cluster, not its Machines) writes the
/// Cluster's mark, `done` and a fresh request id of its own on it before the Cluster reaches
/// it. The Cluster must not report `done` for Machines nobody refreshed: its request ends
/// `failed`, naming the MachineDeployment, and the worker was never restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_done_on_a_machine_deployment_never_makes_the_cluster_done() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "1.0");
    world
        .add_restartable("cp-0", NodeRole::ControlPlane, make("cp-0"))
        .await;
    world
        .add_restartable("w-0", NodeRole::Worker, make("w-0"))
        .await;
    let (clusters, deployments) = (
        caretaker_api::cluster_api::cluster_api_resource(),
        caretaker_api::cluster_api::machine_deployment_api_resource(),
    );
    annotate_parent(
        &world,
        &clusters,
        "c1",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
    )
    .await;
    // Forged while the control plane runs the Cluster's request, before the Cluster reaches
    // the workers.
    wait_parent(
        &world,
        &caretaker_api::cluster_api::control_plane_api_resource(),
        "c1-control-plane",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_IN_PROGRESS,
    )
    .await;
    let cluster = world.parent_annotations(&clusters, "c1").await;
    let forged_id = format!(
        "MachineDeployment/c1-md-0/{:x}",
        time::OffsetDateTime::now_utc().unix_timestamp_nanos()
    );
    annotate_parent(
        &world,
        &deployments,
        "c1-md-0",
        json!({
            names::rollout_state::REFRESH_CLUSTER_REQUEST: cluster[names::rollout_state::REFRESH_REQUEST],
            names::REFRESH_CERTIFICATES_STATUS: names::STATUS_DONE,
            names::rollout_state::REFRESH_REQUEST: forged_id,
            names::PROGRESS: "1/1",
        }),
    )
    .await;
    let ended = wait_parent_until(&world, &clusters, "c1", "ended", |a| {
        matches!(
            a.get(names::REFRESH_CERTIFICATES_STATUS)
                .map(String::as_str),
            Some(names::STATUS_DONE | names::STATUS_FAILED)
        )
    })
    .await;
    let (_, runs) = concurrency(&log);
    assert_eq!(
        ended[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_FAILED,
        "the Cluster believed a forged done; restarts: {runs:?}"
    );
    assert!(!ended.contains_key(names::REFRESH_CERTIFICATES));
    let failed = world
        .event_with("c1", names::EVENT_REFRESH_CERTS_FAILED)
        .await;
    let note = failed.message.unwrap_or_default();
    assert!(
        note.contains("MachineDeployment/c1-md-0") && note.contains("w-0"),
        "{note}"
    );
    assert_eq!(runs.get("w-0"), None, "w-0 restarted");
    assert_eq!(runs.get("cp-0"), Some(&1), "the control plane was done");
}

/// Someone who may write Cluster c2 (not c1's objects) points its `controlPlaneRef` at c1's
/// control plane and asks for a refresh. caretaker must not place c2's trigger there: c2's
/// request ends `failed`, and c1's control plane and Machines are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_naming_another_clusters_control_plane_places_nothing_on_it() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.2");
    world
        .add_restartable("cp-0", NodeRole::ControlPlane, make("cp-0"))
        .await;
    let (clusters, planes) = (
        caretaker_api::cluster_api::cluster_api_resource(),
        caretaker_api::cluster_api::control_plane_api_resource(),
    );
    let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, &clusters);
    let c2: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
        "metadata": { "name": "c2" },
        "spec": {
            "controlPlaneEndpoint": { "host": "cp2.example", "port": 6443 },
            "controlPlaneRef": { "apiGroup": "controlplane.cluster.x-k8s.io", "kind": "CK8sControlPlane", "name": "c1-control-plane" }
        }
    }))
    .unwrap();
    api.create(&kube::api::PostParams::default(), &c2)
        .await
        .unwrap();
    annotate_parent(
        &world,
        &clusters,
        "c2",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
    )
    .await;
    let ended = wait_parent_until(&world, &clusters, "c2", "ended", |a| {
        matches!(
            a.get(names::REFRESH_CERTIFICATES_STATUS)
                .map(String::as_str),
            Some(names::STATUS_DONE | names::STATUS_FAILED)
        )
    })
    .await;
    let plane = world.parent_annotations(&planes, "c1-control-plane").await;
    assert_eq!(
        ended[names::REFRESH_CERTIFICATES_STATUS],
        names::STATUS_FAILED,
        "c2 went through c1's control plane: {plane:?}"
    );
    assert!(
        !plane.contains_key(names::REFRESH_CERTIFICATES),
        "{plane:?}"
    );
    assert!(
        !plane.contains_key(names::rollout_state::REFRESH_CLUSTER_REQUEST),
        "{plane:?}"
    );
    assert!(
        !plane.contains_key(names::REFRESH_CERTIFICATES_STATUS),
        "{plane:?}"
    );
    let note = world
        .event_with("c2", names::EVENT_REFRESH_CERTS_FAILED)
        .await
        .message
        .unwrap_or_default();
    assert!(note.contains("CK8sControlPlane/c1-control-plane"), "{note}");
    assert!(
        !world
            .annotations("cp-0")
            .await
            .contains_key(names::rollout_state::REFRESH_REQUEST)
    );
    assert_eq!(concurrency(&log).1.get("cp-0"), None);
}

/// Someone who may write one control-plane Machine leaves `in-progress` on it, naming some
/// request, without a trigger (as an operator stopped after the trigger was removed mid-run
/// would also leave it). The Machine controller never acts on that, so waiting for it would
/// stall every request on the control plane forever; the control plane's refresh goes on and
/// refreshes both Machines, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_in_progress_on_a_control_plane_machine_stalls_no_request() {
    let mut world = world(fast()).await;
    let (log, make) = logging_scripts(world.dir.path().join("hooks"), "0.3");
    for name in ["cp-0", "cp-1"] {
        world
            .add_restartable(name, NodeRole::ControlPlane, make(name))
            .await;
    }
    world
        .annotate(
            "cp-0",
            names::REFRESH_CERTIFICATES_STATUS,
            names::STATUS_IN_PROGRESS,
        )
        .await;
    world
        .annotate(
            "cp-0",
            names::rollout_state::REFRESH_REQUEST,
            "Cluster/elsewhere/1",
        )
        .await;
    let watch = BusyWatch::start(&world);
    let planes = caretaker_api::cluster_api::control_plane_api_resource();
    let plane = roll_out(
        &world,
        &planes,
        "c1-control-plane",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
        names::REFRESH_CERTIFICATES_STATUS,
    )
    .await;
    assert_eq!(plane[names::PROGRESS], "2/2");
    let (most_at_once, runs) = concurrency(&log);
    assert_eq!(
        runs.into_iter().collect::<Vec<_>>(),
        [("cp-0".to_string(), 1), ("cp-1".to_string(), 1)]
    );
    assert_eq!(most_at_once, 1);
    // cp-0, shown busy by the forgery, is the one started first: never two at once.
    let (most, at) = watch.most();
    assert_eq!(most, 1, "control-plane Machines busy at once: {at:?}");
}

/// Someone who may write in namespace `other` makes a MachineDeployment there under the name of
/// c1's own, naming Cluster c1, with a worker Machine of it. A Cluster request goes only through
/// the children and Machines of its own namespace: c1's request ends `done` over its own
/// Machines, and nothing in `other` gets its trigger, its mark or its request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_request_never_reaches_into_another_namespace() {
    let mut world = world(fast()).await;
    let (_log, make) = logging_scripts(world.dir.path().join("hooks"), "0.1");
    world
        .add_restartable("w-0", NodeRole::Worker, make("w-0"))
        .await;
    common::authorities::create_namespace(&world.client, "other").await;
    let deployments = caretaker_api::cluster_api::machine_deployment_api_resource();
    let other_deployments: Api<DynamicObject> =
        Api::namespaced_with(world.client.clone(), "other", &deployments);
    let other_machines: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        "other",
        &caretaker_api::cluster_api::machine_api_resource(),
    );
    let post = kube::api::PostParams::default();
    let deployment: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": { "name": "c1-md-0" },
        "spec": {
            "clusterName": "c1",
            "selector": { "matchLabels": { names::DEPLOYMENT_NAME_LABEL: "c1-md-0" } },
            "template": world.cluster.machine_template("c1-md-0")
        }
    }))
    .unwrap();
    other_deployments.create(&post, &deployment).await.unwrap();
    let intruder: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
        "metadata": {
            "name": "w-9",
            "labels": { names::DEPLOYMENT_NAME_LABEL: "c1-md-0", names::CLUSTER_NAME_LABEL: "c1" }
        },
        "spec": {
            "clusterName": "c1",
            "bootstrap": { "dataSecretName": "w-9-bootstrap" },
            "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "w-9" }
        }
    }))
    .unwrap();
    other_machines.create(&post, &intruder).await.unwrap();

    let cluster = roll_out(
        &world,
        &caretaker_api::cluster_api::cluster_api_resource(),
        "c1",
        json!({ names::REFRESH_CERTIFICATES: "1y" }),
        names::REFRESH_CERTIFICATES_STATUS,
    )
    .await;
    assert_eq!(cluster[names::PROGRESS], "1/1");
    let theirs = other_deployments
        .get("c1-md-0")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        !theirs.keys().any(|k| k.contains("refresh")),
        "written in another namespace: {theirs:?}"
    );
    let machine = other_machines
        .get("w-9")
        .await
        .unwrap()
        .metadata
        .annotations
        .unwrap_or_default();
    assert!(
        !machine.keys().any(|k| k.contains("refresh")),
        "written in another namespace: {machine:?}"
    );
}
