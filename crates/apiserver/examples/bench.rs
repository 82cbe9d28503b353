//! Figures for the embedded API server. Run with:
//!
//!     cargo run --release -p caretaker-apiserver --example bench
//!
//! Prints: cold start of the in-process server, ConfigMap creates per second with 1 and with 8
//! concurrent clients, the median and 99th-percentile delay from issuing a write to receiving its
//! watch event, and resident memory with 100,000 stored ConfigMaps (in-memory SQLite).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use caretaker_apiserver::{ApiServer, TestServer};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "bench", "tier": "data"}},
        "data": {"config.yaml": format!("name: {name}\nreplicas: 3\nimage: example/app:1.2.3\n")}
    }))
    .unwrap()
}

fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn namespace(server: &ApiServer, name: &str) -> Api<ConfigMap> {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(server.client())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    Api::namespaced(server.client(), name)
}

/// Creates `total` ConfigMaps with `clients` concurrent clients; returns creates per second.
async fn create_rate(server: &ApiServer, ns: &str, clients: usize, total: usize) -> f64 {
    let api = namespace(server, ns).await;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let api = api.clone();
        tasks.push(tokio::spawn(async move {
            for i in (c..total).step_by(clients) {
                api.create(&PostParams::default(), &cm(&format!("cm-{i}")))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    // Cold start: build storage, listener and controllers, answer the first request.
    let mut starts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let server = TestServer::start().await;
        Api::<Namespace>::all(server.client())
            .get("default")
            .await
            .unwrap();
        starts.push(t.elapsed());
        server.shutdown().await;
    }
    starts.sort();
    println!(
        "cold start (start + first GET), median of 20: {:.1} ms",
        starts[10].as_secs_f64() * 1000.0
    );

    let server = TestServer::start().await;
    let one = create_rate(&server, "one-client", 1, 5_000).await;
    println!("ConfigMap creates/s, 1 client:   {one:.0}");
    let eight = create_rate(&server, "eight-clients", 8, 20_000).await;
    println!("ConfigMap creates/s, 8 clients:  {eight:.0}");

    // Write → watch event delay: time from issuing a create to receiving its ADDED event.
    let api = namespace(&server, "latency").await;
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let n = 2_000;
    let receiver = {
        let sent = sent.clone();
        tokio::spawn(async move {
            let mut delays = Vec::with_capacity(n);
            while delays.len() < n {
                if let Some(Ok(WatchEvent::Added(o))) = stream.next().await {
                    let at = Instant::now();
                    let name = o.metadata.name.unwrap();
                    if let Some(t) = sent.lock().unwrap().get(&name) {
                        delays.push(at - *t);
                    }
                }
            }
            delays
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    for i in 0..n {
        let name = format!("lat-{i}");
        sent.lock().unwrap().insert(name.clone(), Instant::now());
        api.create(&PostParams::default(), &cm(&name))
            .await
            .unwrap();
    }
    let mut delays = receiver.await.unwrap();
    delays.sort();
    println!(
        "write → watch event delay over {n} creates: median {:.2} ms, p99 {:.2} ms",
        percentile(&delays, 0.5).as_secs_f64() * 1000.0,
        percentile(&delays, 0.99).as_secs_f64() * 1000.0
    );

    // Fill up to 100,000 stored ConfigMaps.
    let stored = 5_000 + 20_000 + n;
    let rest = 100_000 - stored;
    let rate = create_rate(&server, "fill", 8, rest).await;
    println!("(filled {rest} more ConfigMaps at {rate:.0}/s)");
    // Measured before anything lists them all: a 100,000-item list response is itself large.
    let rss = resident_mib();
    let all: Api<ConfigMap> = Api::all(server.client());
    let count = all
        .list_metadata(&Default::default())
        .await
        .unwrap()
        .items
        .len();
    println!(
        "resident memory with {count} stored ConfigMaps (in-memory SQLite, server and clients in one process): {rss:.0} MiB"
    );
}
