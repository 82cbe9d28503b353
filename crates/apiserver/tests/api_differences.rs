//! Differences from kube-apiserver a client can see, each met as kube-apiserver meets it:
//! finalizers on an object being deleted, the code of a DELETE that does not finish at once,
//! watch options, metadata-only lists, field selectors, the watch's `ERROR` event, and the
//! fields kube-apiserver's defaulting fills in.

use caretaker_apiserver::TestServer;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod common;
use common::api_status;

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
