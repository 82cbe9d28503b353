//! Patches built to exhaust the server: small bodies that grow without bound, and large ones
//! whose merging is slow. Each is refused or bounded, and the server keeps answering.

use caretaker_apiserver::TestServer;
use serde_json::{Value, json};

mod common;
use common::RawHttp;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";
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
