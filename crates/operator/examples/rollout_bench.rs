//! Cluster-wide rollout benchmark: a certificate refresh of 3 control planes + 100 workers on the
//! embedded API server, with real in-process agents whose restart hook takes a fixed time, at
//! max-parallel 1 and 10. Prints the wall time, the ideal time for the same schedule (the sum of
//! the hook times along it), the operator's overhead per Machine, and the API requests the
//! operator made per Machine.
//!
//! The agents do real work besides the hook (new keys, synced writes, backups, starting the
//! hook). That work is measured too, by refreshing one node directly, without the operator, and
//! a second overhead figure subtracts it: what the operator alone adds.
//!
//! `cargo run --release -p caretaker-operator --example rollout_bench [-- HOOK_MS [WORKERS]]`

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use caretaker_agent::NodeLayout;
use caretaker_agent::command::CommandTemplate;
use caretaker_agent::refresh::Refresher;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_agent_api::refresh::{ApplyRequest, PlanRequest};
use caretaker_apiserver::TestServer;
use caretaker_operator::controllers;
use caretaker_operator::{Context, Settings, machine, names};
use caretaker_pki::Ttl;
use caretaker_testkit::capi_objects::{self, ClusterObjects, MachineObject, MachineRole};
use caretaker_testkit::local::LocalAgent;
use caretaker_testkit::provision::{ClusterCas, NodeSpec, agent_serving_leaf, provision_node};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

const CONTROL_PLANES: usize = 3;

#[tokio::main]
async fn main() {
    // RUST_LOG=info shows the operator's progress with timestamps.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .try_init();
    let args: Vec<String> = std::env::args().collect();
    let hook_ms: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let workers: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100);
    println!(
        "rollout benchmark: {CONTROL_PLANES} control planes + {workers} workers, restart hook {hook_ms} ms"
    );
    let agent = agent_time(hook_ms);
    println!(
        "one refresh driven directly on an agent (plan + apply, no operator): {:.1} ms",
        agent.as_secs_f64() * 1000.0
    );
    for max_parallel in [1usize, 10] {
        run(hook_ms, workers, max_parallel, agent).await;
    }
}

/// The agents' own time for one refresh: plan and apply on a worker node driven directly,
/// averaged over a few rounds (signing, the operator's part, is not counted).
fn agent_time(hook_ms: u64) -> Duration {
    const ROUNDS: u32 = 10;
    let dir = tempfile::tempdir().unwrap();
    let cas = ClusterCas::create().unwrap();
    let hook = write_hook(dir.path(), hook_ms);
    let layout = provision(&cas, dir.path(), "direct", NodeRole::Worker);
    let refresher = Refresher::new(layout, dir.path().join("direct/state")).with_restart_command(
        Some(CommandTemplate::parse(hook.to_str().unwrap()).unwrap()),
    );
    let ttl: Ttl = "1y".parse().unwrap();
    let mut agent = Duration::ZERO;
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let plan = refresher.plan(&PlanRequest::default()).unwrap();
        agent += started.elapsed();
        let certificates = plan
            .requests
            .iter()
            .map(|request| {
                // Exactly what the request asks for: the operator's own checks are its part.
                let signed = cas
                    .get(request.ca)
                    .sign_request(&request.csr_pem, &request.exact_policy(), &ttl)
                    .unwrap();
                (request.name.clone(), signed.certificate_pem)
            })
            .collect();
        let started = Instant::now();
        refresher
            .apply(&ApplyRequest {
                plan_id: plan.plan_id,
                certificates,
            })
            .unwrap();
        agent += started.elapsed();
    }
    agent / ROUNDS
}

async fn run(hook_ms: u64, workers: usize, max_parallel: usize, agent: Duration) {
    let server = TestServer::start().await;
    let client = server.client();
    let dir = tempfile::tempdir().unwrap();
    capi_objects::install_upstream_crds(&client).await.unwrap();
    let cas = ClusterCas::create().unwrap();
    let cluster = ClusterObjects::new(&client, "default", "c1", "cp.example");
    cluster.create(&cas).await.unwrap();
    cluster.create_machine_deployment("c1-md-0").await.unwrap();

    let hook = write_hook(dir.path(), hook_ms);
    let mut agents = Vec::new();
    let machines_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &machine::api_resource());
    for i in 0..CONTROL_PLANES + workers {
        let (name, role) = if i < CONTROL_PLANES {
            (format!("cp-{i}"), NodeRole::ControlPlane)
        } else {
            (format!("w-{i}"), NodeRole::Worker)
        };
        agents.push(add_machine(&cluster, &cas, dir.path(), &name, role, &hook).await);
    }

    // The operator's client counts its requests.
    let requests = Arc::new(AtomicU64::new(0));
    let counter = requests.clone();
    let operator_client = kube::client::ClientBuilder::try_from(server.kube_config())
        .unwrap()
        .with_layer(&tower::util::MapRequestLayer::new(move |request| {
            counter.fetch_add(1, Ordering::Relaxed);
            request
        }))
        .build();
    let settings = Settings {
        retry_base: Duration::from_secs(1),
        ..Settings::default()
    };
    let ctx = Context::new(operator_client, settings);
    let controllers = tokio::spawn(async move {
        controllers::run(ctx, None).await;
    });
    // Let the operator fill in every expiry first, so the measurement covers the rollout only.
    wait_until(&machines_api, |ms| {
        ms.iter()
            .all(|m| m.annotations().contains_key(names::CERTIFICATES_EXPIRY))
    })
    .await;
    let before = requests.load(Ordering::Relaxed);

    let clusters: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "default", &machine::cluster_api_resource());
    let started = Instant::now();
    let body = json!({ "metadata": { "annotations": { names::REFRESH_CERTIFICATES: "1y", names::MAX_PARALLEL: max_parallel.to_string() } } });
    clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();
    loop {
        let cluster = clusters.get("c1").await.unwrap();
        let status = cluster
            .annotations()
            .get(names::REFRESH_CERTIFICATES_STATUS)
            .cloned();
        if status.as_deref() == Some(names::STATUS_DONE) {
            break;
        }
        assert_ne!(
            status.as_deref(),
            Some(names::STATUS_FAILED),
            "the rollout failed: {:?}",
            cluster.annotations()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let wall = started.elapsed();
    let made = requests.load(Ordering::Relaxed) - before;
    controllers.abort();
    drop(agents);

    let total = CONTROL_PLANES + workers;
    let steps = (CONTROL_PLANES + workers.div_ceil(max_parallel)) as u32;
    let ideal = Duration::from_millis(hook_ms) * steps;
    let per_machine =
        |ideal: Duration| wall.saturating_sub(ideal).as_secs_f64() * 1000.0 / total as f64;
    println!(
        "max-parallel {max_parallel:>2}: wall {:>6.2} s, ideal {:>6.2} s, overhead {:>5.1} ms per Machine \
         (beyond the agents' measured time: {:>5.1} ms), {:.1} API requests per Machine",
        wall.as_secs_f64(),
        ideal.as_secs_f64(),
        per_machine(ideal),
        per_machine(agent * steps),
        made as f64 / total as f64
    );
}

/// A restart hook that takes `hook_ms`.
fn write_hook(dir: &Path, hook_ms: u64) -> std::path::PathBuf {
    let hook = dir.join("hook.sh");
    std::fs::write(
        &hook,
        format!("#!/bin/sh\nsleep {}\n", hook_ms as f64 / 1000.0),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    hook
}

/// A node directory with certificates from `cas`.
fn provision(cas: &ClusterCas, root: &Path, name: &str, role: NodeRole) -> NodeLayout {
    let node = root.join(name);
    let layout = NodeLayout::new(node.join("pki"), node.join("kubeconfigs"));
    let spec = NodeSpec {
        node_name: name.to_string(),
        addresses: vec!["127.0.0.1".parse().unwrap()],
        role,
        control_plane_host: "cp.example".into(),
        server_url: "https://cp.example:6443".into(),
        validity: "30d".parse().unwrap(),
    };
    provision_node(&layout, cas, &spec).unwrap();
    layout
}

trait Annotations {
    fn annotations(&self) -> BTreeMap<String, String>;
}

impl Annotations for DynamicObject {
    fn annotations(&self) -> BTreeMap<String, String> {
        self.metadata.annotations.clone().unwrap_or_default()
    }
}

async fn wait_until(api: &Api<DynamicObject>, done: impl Fn(&[DynamicObject]) -> bool) {
    loop {
        let list = api.list(&Default::default()).await.unwrap();
        if done(&list.items) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn add_machine(
    cluster: &ClusterObjects,
    cas: &ClusterCas,
    root: &Path,
    name: &str,
    role: NodeRole,
    hook: &Path,
) -> LocalAgent {
    let layout = provision(cas, root, name, role);
    let node = root.join(name);
    let restart = CommandTemplate::parse(hook.to_str().unwrap()).unwrap();
    let agent = LocalAgent::start(
        &agent_serving_leaf(name, &["127.0.0.1".parse().unwrap()]),
        layout,
        &node.join("state"),
        &cas.cluster,
        Some(restart),
        None,
    )
    .await
    .unwrap();
    cluster
        .create_machine(&MachineObject {
            name,
            role: MachineRole::of(role, "c1-md-0"),
            node_name: name,
            address: "127.0.0.1",
            agent_url: &agent.url,
        })
        .await
        .unwrap();
    agent
}
