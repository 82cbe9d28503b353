//! Cluster-wide rollout benchmark: a certificate refresh of 3 control planes + N workers on the
//! embedded API server, with real in-process agents whose restart hook takes a fixed time, at
//! the given max-parallel values. Prints the wall time, the ideal time for the same schedule
//! (the sum of the hook times along it), the operator's overhead per Machine, the API requests
//! the operator made per Machine (by kind), and the operator's memory.
//!
//! The operator runs in a child process (this example started again with `--operator
//! KUBECONFIG`: the same `controllers::run` that `caretaker operator` runs), so its memory is
//! read from `/proc` without the API server's or the agents'. Its client counts its requests
//! by kind and reports them on request.
//!
//! The agents do real work besides the hook (new keys, synced writes, backups, starting the
//! hook). That work is measured too, by refreshing one node directly, without the operator. The
//! operator's own time per Machine (issue 32) is the sum of its hand-offs as the benchmark's
//! watch sees them at max-parallel 1: trigger -> `in-progress`, `in-progress` -> plan recorded
//! minus the agent's plan, plan recorded -> `done` minus the agent's apply, `done` -> the next
//! trigger. Unlike wall time minus a separately measured agent time, it does not swing with
//! how fast the agents happened to be in either run.
//!
//! `cargo run --release -p caretaker-operator --example rollout_bench [-- HOOK_MS [WORKERS [MAX_PARALLEL...]]]`
//! (defaults: 100 ms, 100 workers, max-parallel 1 and 10). The scale check of issue 11:
//! `-- 20 1000 1` and `-- 100 1000 50`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caretaker_agent::NodeLayout;
use caretaker_agent::command::CommandTemplate;
use caretaker_agent::refresh::Refresher;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_agent_api::refresh::{ApplyRequest, PlanRequest};
use caretaker_api::names;
use caretaker_apiserver::TestServer;
use caretaker_pki::Ttl;
use caretaker_testkit::capi_objects::{self, ClusterObjects, MachineObject, MachineRole};
use caretaker_testkit::provision::{ClusterCas, NodeSpec, agent_serving_leaf, provision_node};
use common::{Operator, cpu_seconds, ms, verdict};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

const CONTROL_PLANES: usize = 3;

/// The goals of issue 11.
const GOAL_OWN_TIME_MS: f64 = 5.0;
const GOAL_WALL_RATIO: f64 = 1.1;
/// With the chain's writes on the CK8sControlPlane and MachineDeployments.
const GOAL_REQUESTS: f64 = 9.0;
const GOAL_MEMORY_MIB: f64 = 64.0;

fn main() {
    let Some((args, runtime)) = common::start() else {
        return;
    };
    let hook_ms: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let workers: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(100);
    let mut parallel: Vec<usize> = args[3.min(args.len())..]
        .iter()
        .map(|a| a.parse().expect("MAX_PARALLEL is a number"))
        .collect();
    if parallel.is_empty() {
        parallel = vec![1, 10];
    }
    println!(
        "rollout benchmark: {CONTROL_PLANES} control planes + {workers} workers, restart hook {hook_ms} ms, \
         operator in a child process"
    );
    let agent = agent_time(hook_ms);
    println!(
        "one refresh driven directly on an agent (plan + apply, no operator): {:.1} ms (plan {:.1} ms, apply {:.1} ms)",
        ms(agent.total()),
        ms(agent.plan),
        ms(agent.apply)
    );
    for max_parallel in parallel {
        runtime.block_on(run(hook_ms, workers, max_parallel, agent));
    }
}

/// The agents' own time for one refresh: plan and apply on a worker node driven directly,
/// averaged over a few rounds (signing, the operator's part, is not counted).
fn agent_time(hook_ms: u64) -> AgentTime {
    const ROUNDS: u32 = 10;
    let dir = tempfile::tempdir().unwrap();
    let cas = ClusterCas::create().unwrap();
    let hook = write_hook(dir.path(), hook_ms);
    let layout = provision(&cas, dir.path(), "direct", NodeRole::Worker);
    let refresher = Refresher::new(layout, dir.path().join("direct/state")).with_restart_command(
        Some(CommandTemplate::parse(hook.to_str().unwrap()).unwrap()),
    );
    let ttl: Ttl = "1y".parse().unwrap();
    let (mut plan_time, mut apply_time) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let plan = refresher.plan(&PlanRequest::default()).unwrap();
        plan_time += started.elapsed();
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
        apply_time += started.elapsed();
    }
    AgentTime {
        plan: plan_time / ROUNDS,
        apply: apply_time / ROUNDS,
    }
}

/// The agents' own time for one refresh, by call.
#[derive(Clone, Copy)]
struct AgentTime {
    plan: Duration,
    apply: Duration,
}

impl AgentTime {
    fn total(&self) -> Duration {
        self.plan + self.apply
    }
}

async fn run(hook_ms: u64, workers: usize, max_parallel: usize, agent: AgentTime) {
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
    let calls = AgentCalls::default();
    let machines_api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &caretaker_api::cluster_api::machine_api_resource(),
    );
    for i in 0..CONTROL_PLANES + workers {
        let (name, role) = if i < CONTROL_PLANES {
            (format!("cp-{i}"), NodeRole::ControlPlane)
        } else {
            (format!("w-{i}"), NodeRole::Worker)
        };
        agents.push(add_machine(&cluster, &cas, dir.path(), &name, role, &hook, &calls).await);
    }

    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let mut operator = Operator::start(&kubeconfig);
    // Let the operator fill in every expiry first, so the measurement covers the rollout only.
    wait_until(&machines_api, |ms| {
        ms.iter()
            .all(|m| m.annotations().contains_key(names::CERTIFICATES_EXPIRY))
    })
    .await;
    let before = operator.requests();
    let passes_before = operator.passes();
    let (rss_before, _) = operator.memory();
    let cpu_before = (cpu_seconds(operator.pid()), cpu_seconds(std::process::id()));

    let timeline = Timeline::watch(machines_api.clone());
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &caretaker_api::cluster_api::cluster_api_resource(),
    );
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
    let (rss, hwm) = operator.memory();
    let cpu_operator = cpu_seconds(operator.pid()) - cpu_before.0;
    let cpu_rest = cpu_seconds(std::process::id()) - cpu_before.1;
    let one = machines_api.get("w-3").await.unwrap();
    let one_size = serde_json::to_vec(&one).unwrap().len();
    let after = operator.requests();
    let passes = common::passes_made(&passes_before, &operator.passes());
    drop(operator);
    drop(agents);

    let total = CONTROL_PLANES + workers;
    let steps = (CONTROL_PLANES + workers.div_ceil(max_parallel)) as u32;
    let ideal = Duration::from_millis(hook_ms) * steps;
    let per_machine =
        |ideal: Duration| wall.saturating_sub(ideal).as_secs_f64() * 1000.0 / total as f64;
    let made = common::made(&before, &after);
    let requests = made.values().sum::<u64>() as f64 / total as f64;
    let beyond = per_machine(agent.total() * steps);
    let ratio = wall.as_secs_f64() / ideal.as_secs_f64();
    println!(
        "max-parallel {max_parallel:>2}: wall {:>6.2} s, ideal {:>6.2} s ({ratio:.2} x ideal), overhead {:>5.1} ms per Machine \
         (beyond the agents' measured time: {beyond:>5.1} ms), {requests:.2} API requests per Machine",
        wall.as_secs_f64(),
        ideal.as_secs_f64(),
        per_machine(ideal),
    );
    println!("  API requests by kind, per Machine:");
    for (kind, n) in &made {
        println!("    {kind:<40} {:>6.2}  ({n})", *n as f64 / total as f64);
    }
    println!("  the operator's passes (reconciles) by controller, per Machine:");
    for (controller, p) in &passes {
        println!(
            "    {controller:<40} {:>6.2}  ({} passes, {:.2} ms each on average)",
            p.count / total as f64,
            p.count,
            p.seconds * 1000.0 / p.count
        );
    }
    println!(
        "  operator memory ({total} Machines cached): VmRSS {rss:.1} MiB, VmHWM {hwm:.1} MiB \
         (VmRSS {rss_before:.1} MiB before the rollout; one Machine as served: {:.1} KiB of JSON, \
         {} managedFields entries)",
        one_size as f64 / 1024.0,
        one.metadata.managed_fields.as_ref().map_or(0, Vec::len)
    );
    println!(
        "  CPU during the rollout: operator {cpu_operator:.2} s ({:.1} ms per Machine), API server + agents \
         + this benchmark {cpu_rest:.2} s ({:.1} ms per Machine); {:.2} s of wall on {} cores",
        cpu_operator * 1000.0 / total as f64,
        cpu_rest * 1000.0 / total as f64,
        wall.as_secs_f64(),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if max_parallel == 1
        && let Some(own) = timeline.print(&calls)
    {
        println!(
            "  goal: the operator's own time < {GOAL_OWN_TIME_MS} ms per Machine at max-parallel 1: {} ({own:.1} ms)",
            verdict(own < GOAL_OWN_TIME_MS)
        );
    }
    if max_parallel == 50 {
        println!(
            "  goal: wall <= {GOAL_WALL_RATIO} x ideal at max-parallel 50: {} ({ratio:.2} x)",
            verdict(ratio <= GOAL_WALL_RATIO)
        );
    }
    println!(
        "  goal: API requests per Machine <= {GOAL_REQUESTS}: {} ({requests:.2})",
        verdict(requests <= GOAL_REQUESTS)
    );
    println!(
        "  goal: operator memory < {GOAL_MEMORY_MIB} MiB: {} (VmHWM {hwm:.1} MiB)",
        verdict(hwm < GOAL_MEMORY_MIB)
    );
}

/// When the benchmark's own watch first saw each worker Machine reach each step of its refresh:
/// the parent's trigger on it, `in-progress`, the agent's plan recorded, `done`.
struct Timeline {
    seen: Arc<Mutex<BTreeMap<String, [Option<Instant>; 4]>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    fn watch(machines: Api<DynamicObject>) -> Self {
        use futures::StreamExt;
        use kube::runtime::WatchStreamExt;
        let seen: Arc<Mutex<BTreeMap<String, [Option<Instant>; 4]>>> = Arc::default();
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let events = kube::runtime::watcher(machines, Default::default())
                .default_backoff()
                .applied_objects();
            let mut events = std::pin::pin!(events);
            while let Some(Ok(m)) = events.next().await {
                let now = Instant::now();
                let a = m.annotations();
                let status = a
                    .get(names::REFRESH_CERTIFICATES_STATUS)
                    .map(String::as_str);
                let steps = [
                    a.contains_key(names::REFRESH_CERTIFICATES),
                    status == Some(names::STATUS_IN_PROGRESS),
                    a.contains_key(names::refresh_state::PLAN),
                    status == Some(names::STATUS_DONE),
                ];
                let name = m.metadata.name.clone().unwrap_or_default();
                let mut seen = record.lock().unwrap();
                let times = seen.entry(name).or_default();
                for (step, reached) in steps.into_iter().enumerate() {
                    if reached && times[step].is_none() {
                        times[step] = Some(now);
                    }
                }
            }
        });
        Timeline { seen, task }
    }

    /// At max-parallel 1: the mean time of each step of a worker, and its agent's part of it
    /// as the agent served it in this run. Prints the hand-offs of one worker and returns their
    /// sum without the agent's work: the operator's own time per Machine, in ms.
    fn print(&self, calls: &AgentCalls) -> Option<f64> {
        let seen = self.seen.lock().unwrap();
        let calls = calls.lock().unwrap();
        let agent = |name: &str, call: &'static str| {
            calls
                .get(&(name.to_string(), call))
                .copied()
                .unwrap_or_default()
        };
        // Each worker's steps, and its agent's plan and apply.
        let mut workers: Vec<WorkerTimes> = seen
            .iter()
            .filter(|(name, _)| name.starts_with("w-"))
            .filter_map(|(name, t)| {
                let steps = [t[0]?, t[1]?, t[2]?, t[3]?];
                Some((steps, agent(name, "plan"), agent(name, "apply")))
            })
            .collect();
        workers.sort_by_key(|(t, _, _)| t[0]);
        if workers.len() < 2 {
            return None;
        }
        let n = workers.len() as f64;
        let mean = |f: &dyn Fn(&WorkerTimes) -> f64| workers.iter().map(f).sum::<f64>() / n;
        let start = mean(&|(t, _, _)| ms(t[1] - t[0]));
        let plan = mean(&|(t, _, _)| ms(t[2] - t[1]));
        let agent_plan = mean(&|(_, p, _)| ms(*p));
        let apply = mean(&|(t, _, _)| ms(t[3] - t[2]));
        let agent_apply = mean(&|(_, _, a)| ms(*a));
        let next = workers
            .windows(2)
            .map(|w| ms(w[1].0[0] - w[0].0[3]))
            .sum::<f64>()
            / (n - 1.0);
        println!(
            "  one worker at max-parallel 1, as the benchmark's watch saw it (mean of {} workers; \
             the agent's part as each agent served its calls):",
            workers.len()
        );
        println!(
            "    trigger set by the parent -> in-progress (Machine controller):  {start:>6.1} ms"
        );
        println!(
            "    in-progress -> plan recorded (reads, agent plan, patch):         {plan:>6.1} ms (the agent's plan {agent_plan:.1} ms)"
        );
        println!(
            "    plan recorded -> done (signing, agent apply, end record):        {apply:>6.1} ms (the agent's apply {agent_apply:.1} ms)"
        );
        println!(
            "    done -> next worker's trigger (parent controller):              {next:>6.1} ms"
        );
        let own = start + (plan - agent_plan) + (apply - agent_apply) + next;
        println!(
            "    the operator's own time per Machine (sum, without the agent's): {own:>6.1} ms"
        );
        Some(own)
    }
}

/// When a worker reached each step, and its agent's plan and apply time.
type WorkerTimes = ([Instant; 4], Duration, Duration);

impl Drop for Timeline {
    fn drop(&mut self) {
        self.task.abort();
    }
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
    calls: &AgentCalls,
) -> TimedAgent {
    let layout = provision(cas, root, name, role);
    let node = root.join(name);
    let restart = CommandTemplate::parse(hook.to_str().unwrap()).unwrap();
    let agent = TimedAgent::start(name, cas, layout, &node.join("state"), restart, calls).await;
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

/// Each Machine's agent calls as its agent served them: the time from the request's arrival to
/// its response, summed by call (`plan`, `apply`).
type AgentCalls = Arc<Mutex<BTreeMap<(String, &'static str), Duration>>>;

/// An in-process agent, as [`caretaker_testkit::local::LocalAgent`] starts one, whose plan and
/// apply calls are timed where it serves them: the agent's part of a hand-off in this very run,
/// not a separate measurement.
struct TimedAgent {
    url: String,
    task: tokio::task::JoinHandle<()>,
}

impl TimedAgent {
    async fn start(
        name: &str,
        cas: &ClusterCas,
        layout: NodeLayout,
        state: &Path,
        restart: CommandTemplate,
        calls: &AgentCalls,
    ) -> Self {
        use caretaker_agent::server::{AgentService, serve};
        let serving = cas
            .cluster
            .issue(&agent_serving_leaf(name, &["127.0.0.1".parse().unwrap()]))
            .unwrap();
        let key = serving.key.as_ref().unwrap().to_pem();
        let config = caretaker_agent::tls::server_config(
            &serving.certificate_pem,
            &key,
            &cas.cluster.certificate_pem(),
            caretaker_agent_api::tls::DEFAULT_ALLOWED_CLIENT,
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        let calls = (name.to_string(), calls.clone());
        let router = AgentService::new(
            Refresher::new(layout, state).with_restart_command(Some(restart)),
            caretaker_agent::upgrade::Upgrader::new(state, None),
        )
        .router()
        .layer(axum::middleware::from_fn_with_state(calls, time_call));
        let task = tokio::spawn(async move {
            let _ = serve(listener, config, router).await;
        });
        TimedAgent { url, task }
    }
}

impl Drop for TimedAgent {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn time_call(
    axum::extract::State((name, calls)): axum::extract::State<(String, AgentCalls)>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let call = match request.uri().path() {
        "/v1/certificates/plan" => Some("plan"),
        "/v1/certificates/apply" => Some("apply"),
        _ => None,
    };
    let started = Instant::now();
    let response = next.run(request).await;
    if let Some(call) = call {
        *calls.lock().unwrap().entry((name, call)).or_default() += started.elapsed();
    }
    response
}
