//! Cluster-wide rollouts end to end: a parent's trigger rolls out over its Machines through the
//! real controllers, agents and API server.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use caretaker_agent::command::CommandTemplate;
use caretaker_agent::provision::NodeRole;
use caretaker_operator::{machine, names};
use common::{NS, World, fast, world};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

async fn create_parents(world: &World) {
    let planes: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        NS,
        &machine::control_plane_api_resource(),
    );
    let plane: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "controlplane.cluster.x-k8s.io/v1beta2", "kind": "CK8sControlPlane",
        "metadata": { "name": "c1-control-plane" },
        "spec": { "version": "v1.33.0", "machineTemplate": { "infrastructureTemplate": {
            "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "DockerMachineTemplate", "name": "t" } } }
    })).unwrap();
    planes.create(&PostParams::default(), &plane).await.unwrap();
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        world.client.clone(),
        NS,
        &machine::machine_deployment_api_resource(),
    );
    let template = json!({
        "metadata": { "labels": { "cluster.x-k8s.io/deployment-name": "c1-md-0" } },
        "spec": { "clusterName": "c1", "bootstrap": { "dataSecretName": "b" },
                  "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": "t" } }
    });
    let deployment: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": { "name": "c1-md-0" },
        "spec": { "clusterName": "c1", "selector": { "matchLabels": { "cluster.x-k8s.io/deployment-name": "c1-md-0" } }, "template": template }
    })).unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
}

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

async fn wait_parent(
    world: &World,
    resource: &kube::api::ApiResource,
    name: &str,
    key: &str,
    value: &str,
) -> std::collections::BTreeMap<String, String> {
    let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, resource);
    for _ in 0..600 {
        let annotations = api
            .get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default();
        if annotations.get(key).map(String::as_str) == Some(value) {
            return annotations;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "{name}: {key} never became {value}: {:?}",
        api.get(name).await.unwrap().metadata.annotations
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_refresh_covers_the_control_plane_then_every_worker() {
    let mut world = world(fast()).await;
    create_parents(&world).await;
    let mut layouts = vec![
        world
            .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
            .await,
    ];
    for i in 0..3 {
        layouts.push(
            world
                .add_machine(&format!("w-{i}"), NodeRole::Worker, "cp.example", None)
                .await,
        );
    }
    annotate_parent(
        &world,
        &machine::cluster_api_resource(),
        "c1",
        json!({
            names::REFRESH_CERTIFICATES: "1y", names::MAX_PARALLEL: "2"
        }),
    )
    .await;
    let annotations = wait_parent(
        &world,
        &machine::cluster_api_resource(),
        "c1",
        names::REFRESH_CERTIFICATES_STATUS,
        names::STATUS_DONE,
    )
    .await;
    assert_eq!(annotations[names::PROGRESS], "4/4");
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
    let request = &annotations[names::rollout_state::REFRESH_REQUEST];
    for name in ["cp-0", "w-0", "w-1", "w-2"] {
        assert_eq!(
            &world.annotations(name).await[names::rollout_state::REFRESH_REQUEST],
            request,
            "{name} tagged"
        );
    }
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
    create_parents(&world).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    world
        .add_machine(
            "w-0",
            NodeRole::Worker,
            "cp.example",
            Some(&format!("https://127.0.0.1:{closed}")),
        )
        .await;
    world
        .add_machine("w-1", NodeRole::Worker, "cp.example", None)
        .await;
    world
        .add_machine("w-2", NodeRole::Worker, "cp.example", None)
        .await;
    let md = machine::machine_deployment_api_resource();
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    for name in ["w-1", "w-2"] {
        let annotations = world.annotations(name).await;
        assert!(
            !annotations.contains_key(names::REFRESH_CERTIFICATES),
            "{name} must not start: {annotations:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_trigger_cancels_an_upgrade_rollout_after_running_work_finishes() {
    let mut world = world(fast()).await;
    create_parents(&world).await;
    let hooks = world.dir.path().join("hooks");
    std::fs::create_dir_all(&hooks).unwrap();
    let script = hooks.join("upgrade.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nsleep 1\necho \"$1\" >> \"$(dirname \"$0\")/releases\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    for i in 0..3 {
        let command = CommandTemplate::parse(script.to_str().unwrap()).unwrap();
        world
            .add_machine_with(
                &format!("w-{i}"),
                NodeRole::Worker,
                "cp.example",
                None,
                Some(command),
            )
            .await;
    }
    let md = machine::machine_deployment_api_resource();
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
