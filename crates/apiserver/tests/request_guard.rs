//! What a web page could make a browser send to the server, and what it gets: blind
//! cross-origin writes (`text/plain` posts) and reads through DNS rebinding (a foreign Host).

use caretaker_apiserver::{ApiServer, TestServer};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

mod common;
use common::RawHttp;

const CONFIGMAPS: &str = "/api/v1/namespaces/default/configmaps";

fn configmap(name: &str) -> String {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"k": "v"}})
        .to_string()
}

async fn configmap_names(server: &ApiServer) -> Vec<String> {
    Api::<ConfigMap>::namespaced(server.client(), "default")
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        // What the root-CA publisher keeps in every namespace.
        .filter(|name| name != "kube-root-ca.crt")
        .collect()
}

fn assert_status(reply: &(u16, Value), code: u16, reason: &str) {
    assert_eq!(
        (
            reply.0,
            reply.1["kind"].as_str(),
            reply.1["reason"].as_str()
        ),
        (code, Some("Status"), Some(reason)),
        "{}",
        reply.1
    );
}

/// The form a page can post cross-origin without a CORS preflight.
#[tokio::test]
async fn simple_cross_origin_posts_create_nothing() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());

    // The reported attack: a text/plain POST from a page elsewhere.
    let reply = http
        .request(
            "POST",
            CONFIGMAPS,
            &[
                ("Content-Type", "text/plain"),
                ("Origin", "http://attacker.example"),
            ],
            &configmap("from-attacker"),
        )
        .await;
    assert_status(&reply, 403, "Forbidden");
    assert!(
        reply.1["message"]
            .as_str()
            .unwrap()
            .contains("\"http://attacker.example\""),
        "{}",
        reply.1
    );

    // Either defence alone refuses it: the content types a form or fetch() may send without a
    // preflight are 415, as in kube-apiserver...
    for content_type in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let reply = http
            .send("POST", CONFIGMAPS, content_type, &configmap("blind"))
            .await;
        assert_status(&reply, 415, "UnsupportedMediaType");
        assert_eq!(
            reply.1["message"].as_str().unwrap(),
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/vnd.kubernetes.protobuf (got {content_type:?})"
            )
        );
    }
    // ...and so is any request whose Origin is not the server's own.
    let reply = http
        .request(
            "POST",
            CONFIGMAPS,
            &[
                ("Content-Type", "application/json"),
                ("Origin", "http://attacker.example"),
            ],
            &configmap("cors"),
        )
        .await;
    assert_status(&reply, 403, "Forbidden");
    assert!(configmap_names(&server).await.is_empty());

    // What clients send is still served: JSON, YAML, no Content-Type (JSON), and the
    // server's own origin.
    let own_origin = server.url().to_string();
    for (name, headers) in [
        ("json", vec![("Content-Type", "application/json")]),
        (
            "charset",
            vec![("Content-Type", "application/json; charset=utf-8")],
        ),
        ("yaml", vec![("Content-Type", "application/yaml")]),
        ("untyped", vec![]),
        (
            "same-origin",
            vec![
                ("Content-Type", "application/json"),
                ("Origin", own_origin.as_str()),
            ],
        ),
    ] {
        let reply = http
            .request("POST", CONFIGMAPS, &headers, &configmap(name))
            .await;
        assert_eq!(reply.0, 201, "{name}: {}", reply.1);
    }
    assert_eq!(
        configmap_names(&server).await,
        ["charset", "json", "same-origin", "untyped", "yaml"]
    );
}

#[tokio::test]
async fn writes_of_every_verb_check_the_content_type() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let path = format!("{CONFIGMAPS}/kept");
    assert_eq!(
        http.send("POST", CONFIGMAPS, "application/json", &configmap("kept"))
            .await
            .0,
        201
    );
    let reply = http
        .send("PUT", &path, "text/plain", &configmap("kept"))
        .await;
    assert_status(&reply, 415, "UnsupportedMediaType");
    let reply = http
        .send(
            "PATCH",
            &path,
            "text/plain",
            r#"{"data": {"k": "changed"}}"#,
        )
        .await;
    assert_status(&reply, 415, "UnsupportedMediaType");
    assert!(
        reply.1["message"].as_str().unwrap().starts_with(
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml"
        ),
        "{}",
        reply.1
    );
    let reply = http
        .send(
            "DELETE",
            &path,
            "text/plain",
            r#"{"propagationPolicy": "Background"}"#,
        )
        .await;
    assert_status(&reply, 415, "UnsupportedMediaType");
    let kept = Api::<ConfigMap>::namespaced(server.client(), "default")
        .get("kept")
        .await
        .unwrap();
    assert_eq!(kept.data.unwrap()["k"], "v");

    // A delete without a body needs no content type.
    let reply = http.send("DELETE", &path, "text/plain", "").await;
    assert_eq!(reply.0, 200, "{}", reply.1);
}

#[tokio::test]
async fn custom_resources_take_json_and_yaml_only() {
    let server = TestServer::start().await;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "gadgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "gadgets", "singular": "gadget", "kind": "Gadget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
    }))
    .unwrap();
    Api::<CustomResourceDefinition>::all(server.client())
        .create(&PostParams::default(), &crd)
        .await
        .unwrap();
    let http = RawHttp::new(server.url());
    let gadgets = "/apis/example.com/v1/namespaces/default/gadgets";
    let gadget =
        json!({"apiVersion": "example.com/v1", "kind": "Gadget", "metadata": {"name": "g"}})
            .to_string();
    let reply = http
        .send(
            "POST",
            gadgets,
            "application/vnd.kubernetes.protobuf",
            &gadget,
        )
        .await;
    assert_status(&reply, 415, "UnsupportedMediaType");
    assert!(
        reply.1["message"].as_str().unwrap().starts_with(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got"
        ),
        "{}",
        reply.1
    );
    let reply = http
        .send("POST", gadgets, "application/yaml", &gadget)
        .await;
    assert_eq!(reply.0, 201, "{}", reply.1);
}

/// DNS rebinding: a page on attacker.example re-resolves its name to the server's address, so
/// the browser lets it read the answers, but the Host header still names attacker.example.
#[tokio::test]
async fn a_foreign_host_cannot_read_secrets() {
    let server = TestServer::start().await;
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "ca"}, "stringData": {"tls.key": "PRIVATE KEY"}}),
    )
    .unwrap();
    Api::<Secret>::namespaced(server.client(), "default")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let http = RawHttp::new(server.url());
    let port = server.addr().port();
    let path = "/api/v1/namespaces/default/secrets/ca";

    for host in [
        format!("attacker.example:{port}"),
        "attacker.example".to_string(),
        format!("localhost.attacker.example:{port}"),
        format!("192.0.2.1:{port}"),
    ] {
        let reply = http.request("GET", path, &[("Host", &host)], "").await;
        assert_status(&reply, 403, "Forbidden");
        let message = reply.1["message"].as_str().unwrap();
        assert!(message.contains(&format!("{host:?}")), "{message}");
        assert!(reply.1.get("data").is_none());
    }
    // A foreign Host is refused before anything else, also for writes.
    let reply = http
        .request(
            "POST",
            CONFIGMAPS,
            &[
                ("Host", &format!("attacker.example:{port}")),
                ("Content-Type", "application/json"),
            ],
            &configmap("rebound"),
        )
        .await;
    assert_status(&reply, 403, "Forbidden");
    assert!(configmap_names(&server).await.is_empty());

    // The address in the kubeconfig and loopback names (tunnels, port forwards) are served.
    for host in [
        server.addr().to_string(),
        format!("localhost:{port}"),
        "localhost:16443".to_string(),
        format!("[::1]:{port}"),
    ] {
        let reply = http.request("GET", path, &[("Host", &host)], "").await;
        assert_eq!(reply.0, 200, "{host}: {}", reply.1);
        assert_eq!(reply.1["data"]["tls.key"], "UFJJVkFURSBLRVk=");
    }
}

/// A body larger than kube-apiserver's 3 MiB is refused with its 413 Status before anything
/// decodes it (a flood of huge bodies cannot make the server parse or merge them), and nothing
/// is stored; a large body under the limit is still taken.
#[tokio::test]
async fn bodies_over_three_mebibytes_are_refused() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let with_data = |name: &str, bytes: usize| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
               "data": {"k": "x".repeat(bytes)}})
        .to_string()
    };
    let reply = http
        .send(
            "POST",
            CONFIGMAPS,
            "application/json",
            &with_data("huge", 4 * 1024 * 1024),
        )
        .await;
    assert_status(&reply, 413, "RequestEntityTooLarge");
    assert_eq!(
        reply.1["message"],
        "Request entity too large: limit is 3145728"
    );
    // A strategic merge patch of the same size, against an object that exists.
    assert_eq!(
        http.send("POST", CONFIGMAPS, "application/json", &configmap("kept"))
            .await
            .0,
        201
    );
    let patch = json!({"metadata": {"finalizers": vec!["x"; 900_000]}}).to_string();
    assert!(patch.len() > 3 * 1024 * 1024);
    let reply = http
        .send(
            "PATCH",
            &format!("{CONFIGMAPS}/kept"),
            "application/strategic-merge-patch+json",
            &patch,
        )
        .await;
    assert_status(&reply, 413, "RequestEntityTooLarge");
    assert_eq!(configmap_names(&server).await, ["kept"]);
    let reply = http
        .send(
            "POST",
            CONFIGMAPS,
            "application/json",
            &with_data("large", 2 * 1024 * 1024),
        )
        .await;
    assert_eq!(reply.0, 201, "{}", reply.1["message"]);
}
