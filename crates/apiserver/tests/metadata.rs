//! Metadata-only requests (`Accept: application/json;as=PartialObjectMetadata…`), as metadata
//! informers (kube-rs's `metadata_watcher`, client-go's metadata client) make them: get, list and
//! watch answer with metadata alone, and what cannot be served is 406.

use std::time::Duration;

use caretaker_apiserver::TestServer;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};

mod common;
use common::RawHttp;

const PAYLOAD: &str = "a bundle nobody asked for";
const ITEM: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
const LIST: &str = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1";

fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "trust"}, "annotations": {"note": "kept"}},
        "data": {"ca.crt": PAYLOAD.repeat(100)},
    }))
    .unwrap()
}

/// `object` is a `meta.k8s.io/v1` PartialObjectMetadata of ConfigMap `name`, and nothing more.
fn is_partial(object: &Value, name: &str) {
    assert_eq!(object["kind"], "PartialObjectMetadata", "{object}");
    assert_eq!(object["apiVersion"], "meta.k8s.io/v1");
    assert_eq!(object["metadata"]["name"], name);
    assert_eq!(object["metadata"]["labels"]["app"], "trust");
    assert_eq!(object["metadata"]["annotations"]["note"], "kept");
    let fields: Vec<&String> = object.as_object().unwrap().keys().collect();
    assert_eq!(fields, ["apiVersion", "kind", "metadata"], "{object}");
    assert!(!object.to_string().contains(PAYLOAD));
}

/// A server holding ConfigMap `default/one`.
async fn with_one_config_map() -> (caretaker_apiserver::ApiServer, Api<ConfigMap>) {
    let server = TestServer::start().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    config_maps
        .create(&PostParams::default(), &config_map("one"))
        .await
        .unwrap();
    (server, config_maps)
}

#[tokio::test]
async fn get_list_and_watch_answer_with_metadata_alone() {
    let (server, _) = with_one_config_map().await;
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps";

    // The namespace's kube-root-ca.crt aside.
    let only_one = format!("{path}?fieldSelector=metadata.name%3Done");
    let (code, list) = http
        .request("GET", &only_one, &[("Accept", LIST)], "")
        .await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["kind"], "PartialObjectMetadataList");
    assert_eq!(list["apiVersion"], "meta.k8s.io/v1");
    assert!(list["metadata"]["resourceVersion"].is_string());
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    is_partial(&items[0], "one");

    let (code, one) = http
        .request("GET", &format!("{path}/one"), &[("Accept", ITEM)], "")
        .await;
    assert_eq!(code, 200, "{one}");
    is_partial(&one, "one");

    // client-go's metadata client asks for protobuf first; JSON is what is served.
    let client_go = format!(
        "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,{ITEM}"
    );
    let (code, one) = http
        .request("GET", &format!("{path}/one"), &[("Accept", &client_go)], "")
        .await;
    assert_eq!(code, 200, "{one}");
    is_partial(&one, "one");

    let lines = http
        .stream_lines_with(
            &format!("{only_one}&watch=true&timeoutSeconds=1&allowWatchBookmarks=true"),
            &[("Accept", ITEM)],
        )
        .await;
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "ADDED", "{events:?}");
    is_partial(&events[0]["object"], "one");
    for event in &events {
        assert_eq!(event["object"]["kind"], "PartialObjectMetadata", "{event}");
    }
}

/// A write answers in the representation asked for, as a read does (kube-apiserver transforms
/// every single-object answer): create, update, patch and delete, metadata alone or as a Table.
#[tokio::test]
async fn writes_answer_with_metadata_alone_when_asked() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps";
    let json = ("Content-Type", "application/json");
    let body = serde_json::to_string(&config_map("one")).unwrap();

    let (code, created) = http
        .request("POST", path, &[("Accept", ITEM), json], &body)
        .await;
    assert_eq!(code, 201, "{created}");
    is_partial(&created, "one");

    let patch = json!({"metadata": {"labels": {"round": "2"}}, "data": {"extra": "x"}});
    let merge = ("Content-Type", "application/merge-patch+json");
    let (code, patched) = http
        .request(
            "PATCH",
            &format!("{path}/one"),
            &[("Accept", ITEM), merge],
            &patch.to_string(),
        )
        .await;
    assert_eq!(code, 200, "{patched}");
    is_partial(&patched, "one");
    assert_eq!(patched["metadata"]["labels"]["round"], "2");
    // The answer names the version the write made: what a writer needs to go on from.
    let (_, stored) = http.request("GET", &format!("{path}/one"), &[], "").await;
    assert_eq!(
        stored["data"]["extra"], "x",
        "the patch was applied: {stored}"
    );
    assert_eq!(
        patched["metadata"]["resourceVersion"],
        stored["metadata"]["resourceVersion"]
    );

    let table = "application/json;as=Table;g=meta.k8s.io;v=v1";
    let (code, replaced) = http
        .request(
            "PUT",
            &format!("{path}/one"),
            &[("Accept", table), json],
            &stored.to_string(),
        )
        .await;
    assert_eq!(code, 200, "{replaced}");
    assert_eq!(replaced["kind"], "Table", "{replaced}");
    assert_eq!(replaced["rows"][0]["cells"][0], "one", "{replaced}");

    let (code, deleted) = http
        .request("DELETE", &format!("{path}/one"), &[("Accept", ITEM)], "")
        .await;
    assert_eq!(code, 200, "{deleted}");
    is_partial(&deleted, "one");
}

/// A write asking for a representation that is not served is refused before it is made:
/// nothing is written.
#[tokio::test]
async fn a_write_asking_for_what_is_not_served_writes_nothing() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps";
    let body = serde_json::to_string(&config_map("one")).unwrap();
    let headers = [("Accept", LIST), ("Content-Type", "application/json")];
    let (code, status) = http.request("POST", path, &headers, &body).await;
    assert_eq!(code, 406, "{status}");
    assert_eq!(status["reason"], "NotAcceptable");
    let (code, _) = http.request("GET", &format!("{path}/one"), &[], "").await;
    assert_eq!(code, 404, "the refused create stored nothing");
}

#[tokio::test]
async fn representations_that_are_not_served_are_406() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps";
    for (accept, at) in [
        (
            "application/json;as=Foo;g=meta.k8s.io;v=v1",
            path.to_string(),
        ),
        // A list asked for as a single object's representation, and the other way round.
        (ITEM, path.to_string()),
        (LIST, format!("{path}/x")),
    ] {
        let (code, status) = http.request("GET", &at, &[("Accept", accept)], "").await;
        assert_eq!(code, 406, "{accept} at {at}: {status}");
        assert_eq!(status["reason"], "NotAcceptable");
        assert_eq!(status["kind"], "Status");
    }
}

/// kube-rs's metadata informer (a watcher over `Api<PartialObjectMeta<_>>`, which asks for
/// metadata only) against the server: the objects and their changes arrive, as metadata, while
/// a watch of whole objects sees the same change whole (watches share each change's encoding
/// by form).
#[tokio::test]
async fn kube_rs_metadata_watcher_sees_objects_and_changes() {
    let (server, config_maps) = with_one_config_map().await;
    // The namespace's kube-root-ca.crt aside.
    let one = "metadata.name=one";
    let listed = config_maps
        .list_metadata(&ListParams::default().fields(one))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(listed.items[0].metadata.name.as_deref(), Some("one"));

    let metadata: Api<PartialObjectMeta<ConfigMap>> = Api::namespaced(server.client(), "default");
    let mut seen =
        std::pin::pin!(watcher(metadata, watcher::Config::default().fields(one)).applied_objects());
    let first = tokio::time::timeout(Duration::from_secs(10), seen.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.metadata.name.as_deref(), Some("one"));
    assert_eq!(first.types.as_ref().unwrap().kind, "PartialObjectMetadata");

    let mut whole = std::pin::pin!(
        watcher(config_maps.clone(), watcher::Config::default().fields(one)).applied_objects()
    );
    let listed_whole = tokio::time::timeout(Duration::from_secs(10), whole.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(listed_whole.data.is_some());

    let label = json!({"metadata": {"labels": {"app": "changed"}}});
    config_maps
        .patch("one", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(10), seen.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        changed.types.as_ref().unwrap().kind,
        "PartialObjectMetadata"
    );
    let labels = changed.metadata.labels.unwrap();
    assert_eq!(labels["app"], "changed");
    let changed_whole = tokio::time::timeout(Duration::from_secs(10), whole.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(changed_whole.metadata.labels.unwrap()["app"], "changed");
    assert_eq!(
        changed_whole.data.unwrap()["ca.crt"],
        PAYLOAD.repeat(100),
        "the whole object, though a metadata watch sent the change first"
    );
}
