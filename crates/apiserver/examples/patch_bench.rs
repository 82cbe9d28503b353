//! Large strategic merge patches against the embedded API server. Run with:
//!
//!     cargo run --release -p caretaker-apiserver --example patch_bench
//!
//! Prints: the time of one patch of 80,000 `$retainKeys` against a ConfigMap of 80,000 keys,
//! and of one of 80,000 `$deleteFromPrimitiveList` values against a list of 80,000 (issue 31:
//! 16 s when each directive scanned the other side), then the slowest `/healthz` from another
//! client while two of the first kind run at once (it waited 61 s).

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use caretaker_apiserver::{ApiServer, TestServer};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};

const N: usize = 80_000;

fn key(i: usize) -> String {
    format!("key-{i:06}")
}

fn arg(i: usize) -> String {
    format!("--flag-{i:06}")
}

async fn configmap(server: &ApiServer, name: &str) -> Api<ConfigMap> {
    let api: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let data: Map<String, Value> = (0..N).map(|i| (key(i), json!("v"))).collect();
    let cm = json!({"metadata": {"name": name}, "data": data});
    api.create(&PostParams::default(), &serde_json::from_value(cm).unwrap())
        .await
        .unwrap();
    api
}

/// Retains the second half of the keys (and as many absent ones).
fn retain_patch() -> Value {
    json!({"data": {"$retainKeys": (N / 2..N + N / 2).map(key).collect::<Vec<_>>()}})
}

/// `GET /healthz` on a connection and a thread of its own; how long it took.
fn healthz(addr: &str) -> Duration {
    let asked = Instant::now();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    asked.elapsed()
}

#[tokio::main]
async fn main() {
    let server = TestServer::start().await;
    let params = PatchParams::default();

    let api = configmap(&server, "retain").await;
    let patch = retain_patch();
    let t = Instant::now();
    let patched = api
        .patch("retain", &params, &Patch::Strategic(&patch))
        .await
        .unwrap();
    println!(
        "one patch of {N} $retainKeys against {N} keys: {:.0} ms ({} keys kept)",
        t.elapsed().as_secs_f64() * 1000.0,
        patched.data.unwrap_or_default().len()
    );

    let pods: Api<Pod> = Api::namespaced(server.client(), "default");
    let pod = json!({"metadata": {"name": "args"}, "spec": {"containers": [
        {"name": "c", "image": "x", "args": (0..N).map(arg).collect::<Vec<_>>()}]}});
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    let patch = json!({"spec": {"containers": [{"name": "c",
        "$deleteFromPrimitiveList/args": (N / 2..N + N / 2).map(arg).collect::<Vec<_>>()}]}});
    let t = Instant::now();
    let patched = pods
        .patch("args", &params, &Patch::Strategic(&patch))
        .await
        .unwrap();
    let left = patched.spec.unwrap().containers[0].args.clone();
    println!(
        "one patch of {N} $deleteFromPrimitiveList values against {N}: {:.0} ms ({} values left)",
        t.elapsed().as_secs_f64() * 1000.0,
        left.unwrap_or_default().len()
    );

    let (a, b) = (configmap(&server, "a").await, configmap(&server, "b").await);
    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (addr, stop) = (server.addr().to_string(), stop.clone());
        std::thread::spawn(move || {
            let mut slowest = Duration::ZERO;
            let mut answers = 0;
            while !stop.load(Ordering::SeqCst) {
                slowest = slowest.max(healthz(&addr));
                answers += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            (slowest, answers)
        })
    };
    let patch = retain_patch();
    let patch = Patch::Strategic(&patch);
    let t = Instant::now();
    let (ra, rb) = tokio::join!(a.patch("a", &params, &patch), b.patch("b", &params, &patch),);
    let both = t.elapsed();
    stop.store(true, Ordering::SeqCst);
    ra.unwrap();
    rb.unwrap();
    let (slowest, answers) = checker.join().unwrap();
    println!(
        "two such $retainKeys patches at once: {:.0} ms; slowest of {answers} /healthz meanwhile: {:.1} ms",
        both.as_secs_f64() * 1000.0,
        slowest.as_secs_f64() * 1000.0
    );
}
