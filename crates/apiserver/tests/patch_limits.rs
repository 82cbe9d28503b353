//! Patches built to exhaust the server: small bodies that grow without bound, and large ones
//! whose merging is slow. Each is refused or bounded, and the server keeps answering.

use std::io::{Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use caretaker_apiserver::TestServer;
use serde_json::{Value, json};

mod common;
use common::RawHttp;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
const PODS: &str = "/api/v1/namespaces/default/pods";
const JSON_PATCH: &str = "application/json-patch+json";

async fn create_configmap(http: &RawHttp, name: &str, data: Value) {
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                      "data": data});
    let reply = http
        .send("POST", CONFIGMAPS, "application/json", &body.to_string())
        .await;
    assert_eq!(reply.0, 201, "{}", reply.1);
}

/// The reported attack: one `add` then 22 `copy`s, each doubling what the first added (a 2 KB
/// body asking for gigabytes). The copies stop at kube-apiserver's 3 MiB with its 422, nothing
/// is written, and the server goes on answering; a copy as clients use it still works.
#[tokio::test]
async fn a_json_patch_copy_bomb_is_refused() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    create_configmap(&http, "target", json!({"k": "v"})).await;
    let path = format!("{CONFIGMAPS}/target");

    let mut bomb = vec![json!({"op": "add", "path": "/bomb", "value": {"x": "a".repeat(1_900)}})];
    bomb.extend(
        (0..22).map(|i| json!({"op": "copy", "from": "/bomb", "path": format!("/bomb/c{i}")})),
    );
    let body = Value::Array(bomb).to_string();
    assert!(body.len() < 4_000, "a small body: {}", body.len());
    let reply = http.send("PATCH", &path, JSON_PATCH, &body).await;
    assert_eq!(
        (reply.0, reply.1["reason"].as_str()),
        (422, Some("Invalid")),
        "{}",
        reply.1
    );
    let message = reply.1["message"].as_str().unwrap();
    assert!(
        message.contains("Unable to complete the copy, the accumulated size increase of copy is")
            && message.ends_with("exceeding the limit 3145728"),
        "{message}"
    );

    assert_eq!(http.request("GET", "/healthz", &[], "").await.0, 200);
    let stored = http.request("GET", &path, &[], "").await;
    assert_eq!(stored.1["data"], json!({"k": "v"}), "nothing written");

    let copy = json!([{"op": "copy", "from": "/data/k", "path": "/data/copied"}]);
    let reply = http
        .send("PATCH", &path, JSON_PATCH, &copy.to_string())
        .await;
    assert_eq!(reply.0, 200, "{}", reply.1);
    assert_eq!(reply.1["data"], json!({"k": "v", "copied": "v"}));
}

/// A JSON patch of more than 10,000 operations is refused as kube-apiserver refuses it (413),
/// before any of them is applied; 10,000 are taken.
#[tokio::test]
async fn a_json_patch_holds_at_most_ten_thousand_operations() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    create_configmap(&http, "target", json!({"k": "v"})).await;
    let path = format!("{CONFIGMAPS}/target");
    let test = json!({"op": "test", "path": "/data/k", "value": "v"});

    let mut ops = vec![test.clone(); 10_000];
    ops.push(json!({"op": "add", "path": "/data/added", "value": "yes"}));
    let reply = http
        .send("PATCH", &path, JSON_PATCH, &Value::Array(ops).to_string())
        .await;
    assert_eq!(
        (
            reply.0,
            reply.1["reason"].as_str(),
            reply.1["message"].as_str()
        ),
        (
            413,
            Some("RequestEntityTooLarge"),
            Some(
                "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001"
            )
        ),
        "{}",
        reply.1
    );
    let stored = http.request("GET", &path, &[], "").await;
    assert_eq!(stored.1["data"], json!({"k": "v"}), "nothing written");

    let mut ops = vec![test; 9_999];
    ops.push(json!({"op": "add", "path": "/data/added", "value": "yes"}));
    let reply = http
        .send("PATCH", &path, JSON_PATCH, &Value::Array(ops).to_string())
        .await;
    assert_eq!(reply.0, 200, "{}", reply.1);
    assert_eq!(reply.1["data"]["added"], "yes");
}

/// `GET /healthz` on a connection of its own, from a thread of its own (not the runtime the
/// server shares with this test): when it was asked and when it was answered.
fn healthz(addr: &str) -> (Instant, Instant) {
    let asked = Instant::now();
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    write!(
        stream,
        "GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    (asked, Instant::now())
}

/// The reported attack: two large strategic merge patches at once, each with tens of
/// thousands of `$retainKeys` and `$deleteFromPrimitiveList` entries against an object holding
/// as many keys and values. They held both async workers for a minute, and `/healthz` from
/// another client waited as long. Now the directives are linear and the merging runs off the
/// async workers: `/healthz` is answered within 100 ms all the while, and the patches do what
/// they say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_strategic_merge_patches_do_not_stall_other_requests() {
    const ARGS: usize = 40_000;
    const LABELS: usize = 5_000;
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let arg = |i: usize| format!("--flag-{i:06}");
    let label = |i: usize| format!("key-{i:06}");
    for name in ["a", "b"] {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "c", "image": "x", "args": (0..ARGS).map(arg).collect::<Vec<_>>()}],
            "nodeSelector": (0..LABELS).map(|i| (label(i), json!("v"))).collect::<serde_json::Map<_, _>>(),
        }});
        let reply = http
            .send("POST", PODS, "application/json", &pod.to_string())
            .await;
        assert_eq!(reply.0, 201, "{}", reply.1["message"]);
    }
    // Every arg and 40,000 more deleted; every label and 55,000 more retained.
    let patch = json!({"spec": {
        "containers": [{"name": "c",
            "$deleteFromPrimitiveList/args": (0..2 * ARGS).map(arg).collect::<Vec<_>>()}],
        "nodeSelector": {"$retainKeys": (0..12 * LABELS).map(label).collect::<Vec<_>>()},
    }})
    .to_string();
    assert!(patch.len() < 3 * 1024 * 1024, "{}", patch.len());

    let stop = Arc::new(AtomicBool::new(false));
    let checker = {
        let (addr, stop) = (server.addr().to_string(), stop.clone());
        std::thread::spawn(move || {
            let mut answers = vec![];
            while !stop.load(Ordering::SeqCst) {
                answers.push(healthz(&addr));
                std::thread::sleep(Duration::from_millis(5));
            }
            answers
        })
    };
    let patch_pod = |name: &str| {
        let (http, patch, path) = (&http, &patch, format!("{PODS}/{name}"));
        async move {
            let reply = http
                .send(
                    "PATCH",
                    &path,
                    "application/strategic-merge-patch+json",
                    patch,
                )
                .await;
            (reply, Instant::now())
        }
    };
    let sent = Instant::now();
    let ((a, a_done), (b, b_done)) = tokio::join!(patch_pod("a"), patch_pod("b"));
    stop.store(true, Ordering::SeqCst);
    let answers = checker.join().unwrap();

    for reply in [a, b] {
        assert_eq!(reply.0, 200, "{}", reply.1["message"]);
        assert_eq!(reply.1["spec"]["containers"][0]["args"], json!([]));
        let labels = reply.1["spec"]["nodeSelector"].as_object().unwrap();
        assert_eq!(labels.len(), LABELS);
    }
    let both_running = sent..a_done.min(b_done);
    let during: Vec<Duration> = answers
        .iter()
        .filter(|(asked, answered)| *answered > both_running.start && *asked < both_running.end)
        .map(|(asked, answered)| *answered - *asked)
        .collect();
    assert!(
        !during.is_empty(),
        "no /healthz while the patches ran ({:?})",
        both_running.end - both_running.start
    );
    let slowest = during.iter().max().unwrap();
    eprintln!(
        "slowest of {} /healthz while the patches ran for {:?}: {slowest:?}",
        during.len(),
        both_running.end - both_running.start
    );
    assert!(
        *slowest < Duration::from_millis(100),
        "/healthz took {slowest:?} while the patches ran ({} answers in {:?})",
        during.len(),
        both_running.end - both_running.start
    );
}
