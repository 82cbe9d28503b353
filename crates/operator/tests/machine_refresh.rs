//! Per-Machine certificate refresh end to end: the embedded API server with the real Cluster
//! API CRDs, real agents on loopback with kubeadm-layout nodes in temp directories, and the
//! controller.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use caretaker_agent::NodeLayout;
use caretaker_agent::local::LocalAgent;
use caretaker_agent::provision::{ClusterCas, NodeRole, NodeSpec, provision_node};
use caretaker_apiserver::TestServer;
use caretaker_operator::controllers::machine_refresh;
use caretaker_operator::{Context, Settings, machine, names};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Event, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "default";

fn fixture(name: &str) -> CustomResourceDefinition {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/fixtures/crds")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let value: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
    serde_json::from_value(value).unwrap()
}

struct World {
    server: caretaker_apiserver::ApiServer,
    client: kube::Client,
    cas: ClusterCas,
    dir: tempfile::TempDir,
    agents: Vec<LocalAgent>,
    controller: tokio::task::JoinHandle<()>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.controller.abort();
    }
}

async fn world(settings: Settings) -> World {
    let server = TestServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in [
        "cluster.x-k8s.io_clusters.yaml",
        "cluster.x-k8s.io_machines.yaml",
        "controlplane.cluster.x-k8s.io_ck8scontrolplanes.yaml",
    ] {
        crds.create(&PostParams::default(), &fixture(file))
            .await
            .unwrap();
    }
    let cas = ClusterCas::create().unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    for (suffix, ca) in [
        ("ca", &cas.cluster),
        ("etcd", &cas.etcd),
        ("proxy", &cas.front_proxy),
    ] {
        let mut data = BTreeMap::new();
        data.insert(
            "tls.crt".to_string(),
            ByteString(ca.certificate_pem().into_bytes()),
        );
        data.insert(
            "tls.key".to_string(),
            ByteString(ca.private_key_pem().into_bytes()),
        );
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(format!("c1-{suffix}")),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        };
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), NS, &machine::cluster_api_resource());
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2",
        "kind": "Cluster",
        "metadata": { "name": "c1" },
        "spec": { "controlPlaneEndpoint": { "host": "cp.example", "port": 6443 } }
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();

    let ctx = Context::new(client.clone(), settings);
    let controller = tokio::spawn(machine_refresh::run(ctx, None));
    World {
        server,
        client,
        cas,
        dir: tempfile::tempdir().unwrap(),
        agents: Vec::new(),
        controller,
    }
}

impl World {
    fn machines(&self) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), NS, &machine::api_resource())
    }

    /// Provisions a node (its apiserver certificate naming `endpoint_host`), starts its agent
    /// and creates its Machine. `agent_url` overrides the agent's URL (to point at nothing).
    async fn add_machine(
        &mut self,
        name: &str,
        role: NodeRole,
        endpoint_host: &str,
        agent_url: Option<&str>,
    ) -> NodeLayout {
        let node_dir = self.dir.path().join(name);
        let layout = NodeLayout::new(node_dir.join("pki"), node_dir.join("kubeconfigs"));
        provision_node(
            &layout,
            &self.cas,
            &NodeSpec {
                node_name: format!("node-{name}"),
                addresses: vec!["127.0.0.1".parse().unwrap()],
                role,
                control_plane_host: endpoint_host.into(),
                server_url: format!("https://{endpoint_host}:6443"),
                validity: "30d".parse().unwrap(),
            },
        )
        .unwrap();
        let agent = LocalAgent::start(
            layout.clone(),
            &node_dir.join("state"),
            &self.cas.cluster,
            None,
            None,
        )
        .await
        .unwrap();
        let url = agent_url.map_or(agent.url.clone(), str::to_string);
        self.agents.push(agent);

        let mut labels = json!({ "cluster.x-k8s.io/cluster-name": "c1" });
        if role == NodeRole::ControlPlane {
            labels[names::CONTROL_PLANE_LABEL] = json!("");
        }
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2",
            "kind": "Machine",
            "metadata": { "name": name, "labels": labels, "annotations": { names::AGENT_ENDPOINT: url } },
            "spec": {
                "clusterName": "c1",
                "bootstrap": { "dataSecretName": format!("{name}-bootstrap") },
                "infrastructureRef": { "apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "DockerMachine", "name": name }
            }
        }))
        .unwrap();
        self.machines()
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        let status = json!({ "status": {
            "nodeRef": { "name": format!("node-{name}") },
            "addresses": [{ "type": "InternalIP", "address": "127.0.0.1" }]
        }});
        self.machines()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        layout
    }

    async fn annotate(&self, name: &str, key: &str, value: &str) {
        let body = json!({ "metadata": { "annotations": { key: value } } });
        self.machines()
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
    }

    async fn annotations(&self, name: &str) -> BTreeMap<String, String> {
        self.machines()
            .get(name)
            .await
            .unwrap()
            .metadata
            .annotations
            .unwrap_or_default()
    }

    /// Waits until the Machine's refresh status is `status`.
    async fn wait_status(&self, name: &str, status: &str) -> BTreeMap<String, String> {
        for _ in 0..400 {
            let annotations = self.annotations(name).await;
            if annotations
                .get(names::REFRESH_CERTIFICATES_STATUS)
                .map(String::as_str)
                == Some(status)
            {
                return annotations;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "{name} never reached {status}: {:?}",
            self.annotations(name).await
        );
    }

    async fn events(&self, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }

    async fn event_with(&self, name: &str, reason: &str) -> Event {
        for _ in 0..100 {
            if let Some(e) = self
                .events(name)
                .await
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
            {
                return e;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "no {reason} event for {name}: {:?}",
            self.events(name).await
        );
    }
}

fn fast() -> Settings {
    Settings {
        max_attempts: 2,
        retry_base: Duration::from_millis(200),
        agent_timeout: Duration::from_secs(10),
        ..Settings::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_and_worker_machines_are_refreshed() {
    let mut world = world(fast()).await;
    let cp = world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    let worker = world
        .add_machine("worker-0", NodeRole::Worker, "cp.example", None)
        .await;

    // The expiry is filled in for Machines that were never refreshed.
    for name in ["cp-0", "worker-0"] {
        let mut found = None;
        for _ in 0..200 {
            found = world
                .annotations(name)
                .await
                .get(names::CERTIFICATES_EXPIRY)
                .cloned();
            if found.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(found.is_some(), "{name} has no expiry annotation");
    }
    let before = caretaker_agent::inventory::discover(&cp);

    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world
        .annotate("worker-0", names::REFRESH_CERTIFICATES, "90d")
        .await;
    for (name, layout, min_days) in [("cp-0", &cp, 360), ("worker-0", &worker, 85)] {
        let annotations = world.wait_status(name, names::STATUS_DONE).await;
        assert!(
            !annotations.contains_key(names::REFRESH_CERTIFICATES),
            "the trigger is removed"
        );
        let inventory = caretaker_agent::inventory::discover(layout);
        let expiry = annotations[names::CERTIFICATES_EXPIRY].clone();
        assert_eq!(
            Some(expiry),
            inventory
                .earliest_expiry()
                .map(caretaker_operator::machine::refresh::format_time),
            "{name}: the annotation is the earliest new notAfter"
        );
        for entry in &inventory.certificates {
            let days = (entry.certificate.not_after - time::OffsetDateTime::now_utc()).whole_days();
            assert!(
                days >= min_days,
                "{name} {} expires in {days} days",
                entry.name
            );
        }
        for key in names::refresh_state::ALL {
            assert!(!annotations.contains_key(key), "{name}: {key} left behind");
        }
        world
            .event_with(name, names::EVENT_REFRESH_IN_PROGRESS)
            .await;
        let done = world.event_with(name, names::EVENT_REFRESH_DONE).await;
        assert!(done.message.unwrap_or_default().contains("expire at"));
    }
    let after = caretaker_agent::inventory::discover(&cp);
    for (old, new) in before.certificates.iter().zip(&after.certificates) {
        assert_eq!(old.certificate.subject, new.certificate.subject);
        assert_eq!(old.certificate.dns_names, new.certificate.dns_names);
        assert_eq!(
            old.certificate.issuer, new.certificate.issuer,
            "{}: signed by the right CA",
            old.name
        );
    }
    world.server.url();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_triggers_fail_at_once_and_nothing_reaches_the_node() {
    let mut world = world(fast()).await;
    let layout = world
        .add_machine("m-0", NodeRole::Worker, "cp.example", None)
        .await;
    let before = caretaker_agent::inventory::discover(&layout);

    for (value, needle) in [
        ("1 year", "\"1 year\""),
        ("-5d", "\"-5d\""),
        ("20y", "cluster CA's own expiry"),
    ] {
        world
            .annotate("m-0", names::REFRESH_CERTIFICATES, value)
            .await;
        let annotations = world.wait_status("m-0", names::STATUS_FAILED).await;
        assert_eq!(annotations[names::REFRESH_CERTIFICATES], value);
        let mut message = String::new();
        for _ in 0..100 {
            let events = world.events("m-0").await;
            if let Some(e) = events.iter().find(|e| {
                e.reason.as_deref() == Some(names::EVENT_REFRESH_FAILED)
                    && e.message.as_deref().unwrap_or_default().contains(needle)
            }) {
                assert_eq!(e.type_.as_deref(), Some("Warning"));
                message = e.message.clone().unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            !message.is_empty(),
            "no Warning event naming {needle}: {:?}",
            world.events("m-0").await
        );
    }
    assert_eq!(
        caretaker_agent::inventory::discover(&layout),
        before,
        "nothing changed on the node"
    );
    let staged = world.dir.path().join("m-0/state/staged");
    assert!(
        !staged.exists() || std::fs::read_dir(&staged).unwrap().count() == 0,
        "no plan was made"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_asking_for_a_foreign_san_is_refused_and_nothing_is_signed() {
    let mut world = world(fast()).await;
    // This node's apiserver certificate names a host the Cluster does not have.
    let layout = world
        .add_machine("cp-0", NodeRole::ControlPlane, "evil.example", None)
        .await;
    let before = caretaker_agent::inventory::discover(&layout);
    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("cp-0", names::STATUS_FAILED).await;
    let event = world.event_with("cp-0", names::EVENT_REFRESH_FAILED).await;
    let message = event.message.unwrap_or_default();
    assert!(message.contains("evil.example"), "{message}");
    assert_eq!(caretaker_agent::inventory::discover(&layout), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_agent_is_retried_then_the_refresh_fails() {
    let mut world = world(fast()).await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    world
        .add_machine(
            "m-0",
            NodeRole::Worker,
            "cp.example",
            Some(&format!("https://127.0.0.1:{closed}")),
        )
        .await;
    world
        .annotate("m-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("m-0", names::STATUS_FAILED).await;
    let event = world.event_with("m-0", names::EVENT_REFRESH_FAILED).await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("gave up after 2 attempts") && message.contains("cannot connect"),
        "{message}"
    );
}

/// Plans and (optionally) applies a refresh of `url`'s node directly, as an operator that died
/// right afterwards would have.
async fn refresh_behind_the_operators_back(world: &World, url: &str, apply: bool) -> String {
    use caretaker_agent::refresh::{ApplyRequest, PlanRequest};
    let pair = world
        .cas
        .cluster
        .issue(&caretaker_pki::LeafSpec::new(
            "caretaker-operator",
            caretaker_pki::Usage::Client,
        ))
        .unwrap();
    let tls = caretaker_agent::tls::client_config(
        &world.cas.cluster.certificate_pem(),
        &pair.certificate_pem,
        &pair.key.unwrap().to_pem(),
    )
    .unwrap();
    let agent = caretaker_agent::api::AgentClient::new(tls, Duration::from_secs(10));
    let plan = agent.plan(url, &PlanRequest::default()).await.unwrap();
    if apply {
        let mut certificates = BTreeMap::new();
        for r in &plan.requests {
            let policy = caretaker_pki::SigningPolicy {
                common_names: vec![r.common_name.clone()],
                organizations: r.organizations.clone(),
                dns_names: r.dns_names.clone(),
                ip_addresses: r.ip_addresses.clone(),
                usage: Some(r.usage),
            };
            let signed = world
                .cas
                .get(r.ca)
                .sign_request(&r.csr_pem, &policy, &"1y".parse().unwrap())
                .unwrap();
            certificates.insert(r.name.clone(), signed.certificate_pem);
        }
        agent
            .apply(
                url,
                &ApplyRequest {
                    plan_id: plan.plan_id.clone(),
                    certificates,
                },
            )
            .await
            .unwrap();
    }
    plan.plan_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_operator_resumes_without_refreshing_twice() {
    let mut world = world(fast()).await;
    let applied_layout = world
        .add_machine("applied", NodeRole::Worker, "cp.example", None)
        .await;
    let staged_layout = world
        .add_machine("staged", NodeRole::Worker, "cp.example", None)
        .await;
    world.controller.abort();
    let before_staged = caretaker_agent::inventory::discover(&staged_layout);

    // One Machine's plan was applied, the other's only made, when the operator died.
    let applied_url = world.agents[0].url.clone();
    let staged_url = world.agents[1].url.clone();
    let applied_plan = refresh_behind_the_operators_back(&world, &applied_url, true).await;
    let staged_plan = refresh_behind_the_operators_back(&world, &staged_url, false).await;
    let after_apply = caretaker_agent::inventory::discover(&applied_layout);
    let started =
        caretaker_operator::machine::refresh::format_time(time::OffsetDateTime::now_utc());
    for (machine, plan) in [("applied", &applied_plan), ("staged", &staged_plan)] {
        for (key, value) in [
            (names::REFRESH_CERTIFICATES, "1y"),
            (
                names::REFRESH_CERTIFICATES_STATUS,
                names::STATUS_IN_PROGRESS,
            ),
            (names::refresh_state::TRIGGER, "1y"),
            (names::refresh_state::STARTED_AT, started.as_str()),
            (names::refresh_state::ATTEMPTS, "0"),
            (names::refresh_state::PLAN, plan.as_str()),
        ] {
            world.annotate(machine, key, value).await;
        }
    }

    let ctx = Context::new(world.client.clone(), fast());
    world.controller = tokio::spawn(machine_refresh::run(ctx, None));
    let applied = world.wait_status("applied", names::STATUS_DONE).await;
    assert_eq!(
        caretaker_agent::inventory::discover(&applied_layout),
        after_apply,
        "not refreshed a second time"
    );
    assert_eq!(
        applied[names::CERTIFICATES_EXPIRY],
        caretaker_operator::machine::refresh::format_time(after_apply.earliest_expiry().unwrap())
    );

    world.wait_status("staged", names::STATUS_DONE).await;
    let staged_after = caretaker_agent::inventory::discover(&staged_layout);
    assert_ne!(staged_after, before_staged, "the staged plan was completed");
    assert!(
        world
            .dir
            .path()
            .join(format!("staged/state/applied/{staged_plan}.json"))
            .exists(),
        "with the same plan"
    );
    let applied_plans = std::fs::read_dir(world.dir.path().join("staged/state/applied"))
        .unwrap()
        .count();
    assert_eq!(applied_plans, 1, "and no second plan");
}
