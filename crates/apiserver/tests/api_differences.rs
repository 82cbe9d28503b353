//! Differences from kube-apiserver a client can see, each met as kube-apiserver meets it:
//! finalizers on an object being deleted, the code of a DELETE that does not finish at once,
//! watch options, metadata-only lists, field selectors, the watch's `ERROR` event, and the
//! fields kube-apiserver's defaulting fills in.

use caretaker_apiserver::TestServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

mod common;
use common::{RawHttp, api_status};

/// ConfigMap `default/NAME` holding finalizer `example.com/keep`, created through `api`.
async fn held_config_map(api: &Api<ConfigMap>, name: &str) {
    let cm = json!({"metadata": {"name": name, "finalizers": ["example.com/keep"]}});
    api.create(&PostParams::default(), &serde_json::from_value(cm).unwrap())
        .await
        .unwrap();
}

#[tokio::test]
async fn an_object_being_deleted_gains_no_finalizer() {
    let server = TestServer::start().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    held_config_map(&config_maps, "held").await;
    config_maps
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();

    let more = json!({"metadata": {"finalizers": ["example.com/keep", "example.com/more"]}});
    let refused = config_maps
        .patch("held", &PatchParams::default(), &Patch::Merge(&more))
        .await
        .map(|_| ())
        .map_err(api_status)
        .unwrap_err();
    assert_eq!((refused.code, refused.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        refused.message,
        "ConfigMap \"held\" is invalid: metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"example.com/more\"}"
    );

    // Taking the last one away still finishes the deletion.
    let none = json!({"metadata": {"finalizers": null}});
    config_maps
        .patch("held", &PatchParams::default(), &Patch::Merge(&none))
        .await
        .unwrap();
    assert!(config_maps.get_opt("held").await.unwrap().is_none());
}

#[tokio::test]
async fn a_deletion_that_does_not_finish_at_once_answers_200_with_the_object() {
    let server = TestServer::start().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps";
    let json = [("Content-Type", "application/json")];

    // Held by a finalizer: marked, answered 200 with the object as it now is.
    held_config_map(&config_maps, "held").await;
    let (code, marked) = http
        .request("DELETE", &format!("{path}/held"), &json, "")
        .await;
    assert_eq!(code, 200, "{marked}");
    assert_eq!(marked["kind"], "ConfigMap");
    assert!(
        marked["metadata"]["deletionTimestamp"].is_string(),
        "{marked}"
    );

    // Foreground propagation: waits for dependents behind its finalizer; 200 as well.
    let plain = json!({"metadata": {"name": "owner"}});
    config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(plain).unwrap(),
        )
        .await
        .unwrap();
    let foreground =
        r#"{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Foreground"}"#;
    let (code, marked) = http
        .request("DELETE", &format!("{path}/owner"), &json, foreground)
        .await;
    assert_eq!(code, 200, "{marked}");
    assert_eq!(marked["metadata"]["name"], "owner");

    // A namespace: its contents go first; 200 with the Namespace, Terminating.
    common::create_namespace(&server.client(), "doomed", json!({})).await;
    let (code, namespace) = http
        .request("DELETE", "/api/v1/namespaces/doomed", &json, "")
        .await;
    assert_eq!(code, 200, "{namespace}");
    assert_eq!(namespace["status"]["phase"], "Terminating");

    // Only the deprecated orphanDependents=false is answered 202.
    held_config_map(&config_maps, "legacy").await;
    let (code, marked) = http
        .request(
            "DELETE",
            &format!("{path}/legacy?orphanDependents=false"),
            &json,
            "",
        )
        .await;
    assert_eq!(code, 202, "{marked}");
    assert_eq!(marked["metadata"]["name"], "legacy");
}

#[tokio::test]
async fn send_initial_events_needs_resource_version_match_not_older_than() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=1";

    let (code, status) = http
        .request("GET", &format!("{path}&sendInitialEvents=true"), &[], "")
        .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["reason"], "Invalid");
    assert_eq!(
        status["message"],
        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
    );
    assert_eq!(status["details"]["kind"], "ListOptions");
    assert_eq!(status["details"]["group"], "meta.k8s.io");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "resourceVersionMatch"
    );

    // resourceVersionMatch alone is refused too, as upstream refuses it.
    let (code, status) = http
        .request(
            "GET",
            &format!("{path}&resourceVersionMatch=NotOlderThan"),
            &[],
            "",
        )
        .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"
    );

    // Both, as kube-rs's streaming lists and client-go's WatchList send them: the stream.
    let lines = http
        .stream_lines(&format!(
            "{path}&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
        ))
        .await;
    let events: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let end = |e: &Value| {
        e["type"] == "BOOKMARK"
            && e["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true"
    };
    assert!(events.iter().any(end), "{lines:?}");
}

/// Each item of a `PartialObjectMetadataList` is a `PartialObjectMetadata` of its own, as
/// kube-apiserver sets them: `kind` and `apiVersion` on every item, in either version.
#[tokio::test]
async fn partial_object_metadata_list_items_carry_kind_and_api_version() {
    let server = TestServer::start().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    for name in ["a", "b"] {
        let cm = json!({"metadata": {"name": name}, "data": {"k": "v"}});
        config_maps
            .create(&PostParams::default(), &serde_json::from_value(cm).unwrap())
            .await
            .unwrap();
    }
    let http = RawHttp::new(server.url());
    for version in ["v1", "v1beta1"] {
        let accept =
            format!("application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v={version}");
        for path in [
            "/api/v1/namespaces/default/configmaps",
            "/api/v1/configmaps?limit=1",
        ] {
            let (code, list) = http.request("GET", path, &[("Accept", &accept)], "").await;
            assert_eq!(code, 200, "{list}");
            assert_eq!(list["kind"], "PartialObjectMetadataList");
            let items = list["items"].as_array().unwrap();
            assert!(!items.is_empty(), "{list}");
            for item in items {
                assert_eq!(item["kind"], "PartialObjectMetadata", "{item}");
                assert_eq!(
                    item["apiVersion"],
                    format!("meta.k8s.io/{version}"),
                    "{item}"
                );
                assert!(item.get("data").is_none(), "{item}");
            }
        }
    }
}
