//! Trust bundle benchmark (issue 13): one Bundle, or one ClusterBundle, targeting every namespace
//! of N (default 10,000) on the embedded API server, with trust-manager's own CRDs. It prints:
//!
//! - the time from the Bundle's creation until this benchmark's own watch has seen a target
//!   holding the bundle (by its hash annotation) in every namespace;
//! - the time from a change of the source ConfigMap until every target holds the new bundle;
//! - for namespaces created one at a time afterwards, the time until each one's target is seen
//!   (median and p99);
//! - the operator's writes during a steady state (default 60 s);
//! - the operator's memory (VmRSS, and VmHWM: the peak) and its CPU time.
//!
//! The operator runs in a child process (see `common`): all of `controllers::run`, as
//! `caretaker operator` runs it.
//!
//! `cargo run --release -p caretaker-operator --example bundle_bench [-- NAMESPACES [STEADY_SECONDS [KIND]]]`
//! (defaults: 10000 namespaces, 60 s, KIND `bundle`; or `clusterbundle`).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caretaker_apiserver::TestServer;
use caretaker_operator::trust::api::{Bundle, BundleTarget, TargetTemplate};
use caretaker_operator::trust::cluster_bundle::{ClusterBundle, ClusterBundleTarget};
use caretaker_operator::trust::target::{self, OwnerApi};
use caretaker_pki::{CaSpec, CertificateAuthority, CertificatePool, PoolFilters};
use common::{Operator, cpu_seconds, is_write, made, ms, verdict};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

const TRUST: &str = "cert-manager";

/// The goals of issue 13.
const GOAL_ALL_WRITTEN_S: f64 = 10.0;
const GOAL_SOURCE_CHANGE_S: f64 = 10.0;
const GOAL_NEW_NAMESPACE_P99_MS: f64 = 100.0;
const GOAL_STEADY_WRITES: u64 = 0;
const GOAL_MEMORY_MIB: f64 = 128.0;
/// Issue 33's goal for later work: targets per second as a share of the server's raw creates.
const GOAL_RAW_RATIO: f64 = 0.6;

/// How many namespaces are created one at a time to time their targets.
const NEW_NAMESPACES: usize = 100;

fn main() {
    let Some((args, runtime)) = common::start() else {
        return;
    };
    let count: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let steady: u64 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(60);
    let kind = match args.get(3).map(String::as_str) {
        None | Some("bundle") => OwnerApi::Bundle,
        Some("clusterbundle") => OwnerApi::ClusterBundle,
        Some(other) => {
            eprintln!("KIND must be bundle or clusterbundle, not {other:?}");
            std::process::exit(2);
        }
    };
    runtime.block_on(run(count, Duration::from_secs(steady), kind));
}

/// The object benchmarked: one target key `ca.crt` in every namespace, from ConfigMap `roots`.
fn object(kind: OwnerApi) -> Value {
    match kind {
        OwnerApi::Bundle => json!({
            "apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle", "metadata": {"name": "trust"},
            "spec": {"sources": [{"configMap": {"name": "roots", "key": "ca.crt"}}], "target": {"configMap": {"key": "ca.crt"}}},
        }),
        OwnerApi::ClusterBundle => json!({
            "apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle", "metadata": {"name": "trust"},
            "spec": {"sourceRefs": [{"kind": "ConfigMap", "name": "roots", "key": "ca.crt"}],
                     "target": {"configMap": {"data": [{"key": "ca.crt"}]}, "namespaceSelector": {}}},
        }),
    }
}

/// The hash annotation a target of [`object`] carries for these PEM texts.
fn hash_of(kind: OwnerApi, pems: &[&str]) -> String {
    let mut pool = CertificatePool::new(PoolFilters::default(), time::OffsetDateTime::now_utc());
    for pem in pems {
        pool.add_pem(pem.as_bytes()).unwrap();
    }
    let specs = match kind {
        OwnerApi::Bundle => target::bundle_specs(&BundleTarget {
            config_map: Some(TargetTemplate {
                key: "ca.crt".into(),
                metadata: None,
            }),
            ..Default::default()
        }),
        OwnerApi::ClusterBundle => {
            let cb: ClusterBundle = serde_json::from_value(object(kind)).unwrap();
            let target: &ClusterBundleTarget = cb.spec.target.as_ref().unwrap();
            target::cluster_bundle_specs(target, None)
        }
    };
    specs[0].1.hash(&pool.to_pem())
}

/// The hash each namespace's target holds, and when it was seen, from the benchmark's watch.
type Seen = Arc<Mutex<HashMap<String, (String, Instant)>>>;

async fn run(count: usize, steady: Duration, kind: OwnerApi) {
    let server = TestServer::start().await;
    let client = server.client();
    caretaker_testkit::capi_objects::install_trust_manager_crds(&client)
        .await
        .unwrap();
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let started = Instant::now();
    let create = |name: String| {
        let namespaces = namespaces.clone();
        async move {
            let namespace: Namespace =
                serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
            namespaces
                .create(&PostParams::default(), &namespace)
                .await
                .unwrap();
        }
    };
    futures::stream::iter(
        std::iter::once(TRUST.to_string()).chain((0..count).map(|i| format!("ns-{i:05}"))),
    )
    .for_each_concurrent(16, create)
    .await;
    let total = namespaces
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .len();
    eprintln!(
        "{total} namespaces created in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let (a, b, c) = (ca("root-a"), ca("root-b"), ca("root-c"));
    let sources: Api<ConfigMap> = Api::namespaced(client.clone(), TRUST);
    let source = |pem: String| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "roots"}, "data": {"ca.crt": pem}});
    sources
        .patch(
            "roots",
            &PatchParams::apply("bench"),
            &Patch::Apply(&source(format!("{a}\n{b}"))),
        )
        .await
        .unwrap();

    let seen: Seen = Arc::default();
    let watch = {
        let seen = seen.clone();
        let targets: Api<ConfigMap> = Api::all(client.clone());
        tokio::spawn(async move {
            let config = watcher::Config::default().labels(&format!("{}=trust", kind.label()));
            let mut events = std::pin::pin!(watcher(targets, config).applied_objects());
            while let Ok(Some(target)) = events.try_next().await {
                let namespace = target.metadata.namespace.clone().unwrap_or_default();
                let hash = target
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(kind.hash_annotation()))
                    .cloned()
                    .unwrap_or_default();
                seen.lock()
                    .unwrap()
                    .insert(namespace, (hash, Instant::now()));
            }
        })
    };

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, server.kubeconfig()).unwrap();
    let mut operator = Operator::start(&kubeconfig);
    let pid = operator.pid();
    // Let the operator's watches list before the clock starts.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (cpu_before, requests_before) = (cpu_seconds(pid), operator.requests());
    let created = Instant::now();
    let params = PostParams::default();
    match kind {
        OwnerApi::Bundle => {
            let bundle: Bundle = serde_json::from_value(object(kind)).unwrap();
            Api::all(client.clone())
                .create(&params, &bundle)
                .await
                .unwrap();
        }
        OwnerApi::ClusterBundle => {
            let bundle: ClusterBundle = serde_json::from_value(object(kind)).unwrap();
            Api::all(client.clone())
                .create(&params, &bundle)
                .await
                .unwrap();
        }
    }
    let first_hash = hash_of(kind, &[&a, &b]);
    let all_written = until_all(&seen, total, &first_hash, created).await;
    let first_requests = made(&requests_before, &operator.requests());
    let first_cpu = cpu_seconds(pid) - cpu_before;
    let after_first = operator.memory();

    let (cpu_before, requests_before) = (cpu_seconds(pid), operator.requests());
    let changed = Instant::now();
    sources
        .patch(
            "roots",
            &PatchParams::apply("bench"),
            &Patch::Apply(&source(format!("{a}\n{c}"))),
        )
        .await
        .unwrap();
    let second_hash = hash_of(kind, &[&a, &c]);
    let source_change = until_all(&seen, total, &second_hash, changed).await;
    let change_requests = made(&requests_before, &operator.requests());
    let change_cpu = cpu_seconds(pid) - cpu_before;

    let mut latencies = Vec::with_capacity(NEW_NAMESPACES);
    for i in 0..NEW_NAMESPACES {
        let name = format!("late-{i:03}");
        let asked = Instant::now();
        create(name.clone()).await;
        loop {
            if seen
                .lock()
                .unwrap()
                .get(&name)
                .is_some_and(|(hash, _)| *hash == second_hash)
            {
                latencies.push(asked.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];

    // Steady state: what the operator writes while nothing changes.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = operator.requests();
    tokio::time::sleep(steady).await;
    let steady_requests = made(&before, &operator.requests());
    let steady_writes: u64 = steady_requests
        .iter()
        .filter(|(kind, _)| is_write(kind))
        .map(|(_, n)| n)
        .sum();
    let (rss, hwm) = operator.memory();
    watch.abort();
    drop(operator);
    // The server's raw write rate, with objects the size of a target's data.
    let target = Api::<ConfigMap>::namespaced(client.clone(), "ns-00000")
        .get("trust")
        .await
        .unwrap();
    let payload = serde_json::to_string(&target.data).unwrap().len();
    let raw_rate = common::raw_create_rate(&client, payload).await;
    let first_rate = total as f64 / all_written.as_secs_f64();
    let change_rate = total as f64 / source_change.as_secs_f64();

    let per_target = |requests: &std::collections::BTreeMap<String, u64>| {
        requests
            .iter()
            .filter(|(kind, _)| kind.starts_with("PATCH configmaps"))
            .map(|(_, n)| *n as f64)
            .sum::<f64>()
            / total as f64
    };
    println!(
        "Trust bundles: one {}, {total} namespaces ({count} + the server's own and {TRUST})",
        kind.kind()
    );
    println!();
    println!("| goal | result | |");
    println!("|---|---|---|");
    println!(
        "| every target written < {GOAL_ALL_WRITTEN_S} s after the {} is created | {:.2} s | {} |",
        kind.kind(),
        all_written.as_secs_f64(),
        verdict(all_written.as_secs_f64() < GOAL_ALL_WRITTEN_S)
    );
    println!(
        "| a source change in every target < {GOAL_SOURCE_CHANGE_S} s | {:.2} s | {} |",
        source_change.as_secs_f64(),
        verdict(source_change.as_secs_f64() < GOAL_SOURCE_CHANGE_S)
    );
    println!(
        "| a new namespace's target, p99 < {GOAL_NEW_NAMESPACE_P99_MS} ms | p99 {:.1} ms, median {:.1} ms ({NEW_NAMESPACES} namespaces) | {} |",
        ms(p99),
        ms(p50),
        verdict(ms(p99) < GOAL_NEW_NAMESPACE_P99_MS)
    );
    println!(
        "| a source change's targets per second / the API server's raw write rate ≥ {GOAL_RAW_RATIO} × (later work) | {:.2} × ({change_rate:.0} / {raw_rate:.0} per s; first sync {:.2} ×) | {} |",
        change_rate / raw_rate,
        first_rate / raw_rate,
        verdict(change_rate / raw_rate >= GOAL_RAW_RATIO)
    );
    println!(
        "| writes in {} s of steady state = {GOAL_STEADY_WRITES} | {steady_writes} | {} |",
        steady.as_secs(),
        verdict(steady_writes == GOAL_STEADY_WRITES)
    );
    println!(
        "| operator resident memory < {GOAL_MEMORY_MIB} MiB | VmHWM {hwm:.1} MiB (VmRSS {rss:.1}; {:.1} after the first sync) | {} |",
        after_first.1,
        verdict(hwm < GOAL_MEMORY_MIB)
    );
    println!();
    println!(
        "First sync: {:.2} target writes per namespace, operator CPU {first_cpu:.2} s; requests: {first_requests:?}",
        per_target(&first_requests)
    );
    println!(
        "Source change: {:.2} target writes per namespace, operator CPU {change_cpu:.2} s; requests: {change_requests:?}",
        per_target(&change_requests)
    );
    println!("Steady state requests: {steady_requests:?}");
    println!(
        "The API server's raw write rate in this run: {raw_rate:.0} creates/s (ConfigMaps of \
         {payload} bytes of data, 8 clients, the operator stopped)"
    );
}

fn ca(name: &str) -> String {
    CertificateAuthority::create(&CaSpec::new(name))
        .unwrap()
        .certificate_pem()
}

/// Waits until every one of `total` namespaces' targets holds `hash`; the time since `since`.
async fn until_all(seen: &Seen, total: usize, hash: &str, since: Instant) -> Duration {
    let mut reported = Instant::now();
    loop {
        let done = seen
            .lock()
            .unwrap()
            .values()
            .filter(|(h, _)| h == hash)
            .count();
        if done >= total {
            let last = seen
                .lock()
                .unwrap()
                .values()
                .map(|(_, at)| *at)
                .max()
                .unwrap();
            return last.duration_since(since);
        }
        if reported.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "{done} of {total} targets hold the bundle after {:.1} s",
                since.elapsed().as_secs_f64()
            );
            reported = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
