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

/// The `ERROR` event ending a watch from a resourceVersion past the retained history: `type`
/// first, its Status's fields in kube-apiserver's order, as every other Status is sent.
#[tokio::test]
async fn the_410_watch_event_is_written_in_kube_apiservers_field_order() {
    let server = caretaker_apiserver::ApiServer::builder()
        .watch_history(10)
        .start()
        .await
        .unwrap();
    let config_maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let first = json!({"metadata": {"name": "first"}});
    let first = config_maps
        .create(
            &PostParams::default(),
            &serde_json::from_value(first).unwrap(),
        )
        .await
        .unwrap();
    let from = first.metadata.resource_version.unwrap();
    // Past the history (compacted every 1,000 writes).
    for i in 0..1000 {
        let more = json!({"metadata": {"name": format!("x{i}")}});
        config_maps
            .create(
                &PostParams::default(),
                &serde_json::from_value(more).unwrap(),
            )
            .await
            .unwrap();
    }
    let lines = RawHttp::new(server.url())
        .stream_lines(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={from}"
        ))
        .await;
    let line = &lines[0];
    let prefix = format!(
        "{{\"type\":\"ERROR\",\"object\":{{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{{}},\"status\":\"Failure\",\"message\":\"too old resource version: {from} ("
    );
    assert!(line.starts_with(&prefix), "{line}");
    assert!(
        line.ends_with(")\",\"reason\":\"Expired\",\"code\":410}}"),
        "{line}"
    );
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

/// A field selector names fields its kind can be selected by (kube-apiserver's field label
/// conversions; a CRD's `selectableFields`), and others are 400 with upstream's message, not
/// an empty list.
#[tokio::test]
async fn field_selectors_take_only_the_fields_each_kind_supports() {
    let server = TestServer::start().await;
    let client = server.client();
    let http = RawHttp::new(server.url());
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(client.clone(), "default");
    let secret = json!({"metadata": {"name": "s"}, "type": "example.com/token",
        "data": {"a": "MQ=="}});
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(secret).unwrap(),
        )
        .await
        .unwrap();
    let get = |path: String| {
        let http = &http;
        async move { http.request("GET", &path, &[], "").await }
    };
    let refused = |status: &Value, message: &str| {
        assert_eq!(status["reason"], "BadRequest", "{status}");
        assert_eq!(status["message"], message);
    };

    // Secrets: type, name, namespace; not their data.
    let path = "/api/v1/namespaces/default/secrets";
    let (code, status) = get(format!("{path}?fieldSelector=data.a%3D1")).await;
    assert_eq!(code, 400, "{status}");
    refused(&status, "field label not supported: data.a");
    let (code, list) = get(format!("{path}?fieldSelector=type%3Dexample.com/token")).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["items"][0]["metadata"]["name"], "s");
    // The same in a watch.
    let (code, status) = get(format!("{path}?watch=1&fieldSelector=data.a%3D1")).await;
    assert_eq!(code, 400, "{status}");

    // A kind with no conversion of its own: metadata.name and metadata.namespace alone.
    let (code, status) =
        get("/api/v1/namespaces/default/configmaps?fieldSelector=data.a%3D1".into()).await;
    assert_eq!(code, 400, "{status}");
    refused(
        &status,
        "\"data.a\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\"",
    );
    let (code, _) = get(
        "/api/v1/namespaces/default/configmaps?fieldSelector=metadata.namespace%3Ddefault".into(),
    )
    .await;
    assert_eq!(code, 200);

    // Pods: spec.nodeName (and old clients' spec.host for it), status.phase.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), "default");
    let pod = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1",
        "containers": [{"name": "c", "image": "x:1"}]}});
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .unwrap();
    for selector in [
        "spec.nodeName%3Dn1",
        "spec.host%3Dn1",
        "status.phase%3DPending",
    ] {
        let (code, list) = get(format!(
            "/api/v1/namespaces/default/pods?fieldSelector={selector}"
        ))
        .await;
        assert_eq!(code, 200, "{list}");
        assert_eq!(list["items"][0]["metadata"]["name"], "p", "{selector}");
    }
    let (_, status) =
        get("/api/v1/namespaces/default/pods?fieldSelector=spec.hostname%3Dx".into()).await;
    refused(&status, "field label not supported: spec.hostname");

    // A field the object lacks reads as upstream's field set has it: Go's zero value.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = json!({"metadata": {"name": "n1"}});
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(node).unwrap(),
        )
        .await
        .unwrap();
    let (code, list) = get("/api/v1/nodes?fieldSelector=spec.unschedulable%3Dfalse".into()).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["items"][0]["metadata"]["name"], "n1", "{list}");

    // Jobs word it their own way.
    let (code, status) =
        get("/apis/batch/v1/namespaces/default/jobs?fieldSelector=spec.suspend%3Dtrue".into())
            .await;
    assert_eq!(code, 400);
    refused(
        &status,
        "field label \"spec.suspend\" not supported for batchv1.Job",
    );

    // A custom resource: metadata and the CRD's selectableFields.
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {
        "group": "example.com", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [{"name": "v1", "served": true, "storage": true,
            "selectableFields": [{"jsonPath": ".spec.color"}],
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                "type": "object", "properties": {
                    "color": {"type": "string"}, "size": {"type": "string"}}}}}}}]}});
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
    let widgets = "/apis/example.com/v1/namespaces/default/widgets";
    let body = r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w"},"spec":{"color":"red","size":"L"}}"#;
    let (code, created) = http.send("POST", widgets, "application/json", body).await;
    assert_eq!(code, 201, "{created}");
    let (code, list) = get(format!("{widgets}?fieldSelector=spec.color%3Dred")).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["items"][0]["metadata"]["name"], "w");
    let (code, status) = get(format!("{widgets}?fieldSelector=spec.size%3DL")).await;
    assert_eq!(code, 400);
    refused(&status, "field label not supported: spec.size");
}

/// A Service as kube-apiserver's defaulting and allocation leave it (the Python client's
/// `test_service_apis` reads these), and a Pod's QoS class.
#[tokio::test]
async fn services_and_pods_get_the_fields_kube_apiserver_fills_in() {
    let server = TestServer::start().await;
    let client = server.client();
    let services: Api<k8s_openapi::api::core::v1::Service> =
        Api::namespaced(client.clone(), "default");
    let create = |name: &str, spec: Value| {
        let services = services.clone();
        let service = json!({"metadata": {"name": name}, "spec": spec});
        async move {
            let created = services
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(service).unwrap(),
                )
                .await
                .unwrap();
            serde_json::to_value(created).unwrap()
        }
    };
    let ports = json!([{"port": 80}]);
    let plain = create("plain", json!({"selector": {"app": "a"}, "ports": ports})).await;
    assert_eq!(plain["status"], json!({"loadBalancer": {}}), "{plain}");
    assert_eq!(plain["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(plain["spec"]["ipFamilyPolicy"], "SingleStack");
    assert_eq!(plain["spec"]["internalTrafficPolicy"], "Cluster");
    assert_eq!(plain["spec"].get("externalTrafficPolicy"), None);

    let node_port = create("np", json!({"type": "NodePort", "ports": ports})).await;
    assert_eq!(node_port["spec"]["externalTrafficPolicy"], "Cluster");
    let headless = create("headless", json!({"clusterIP": "None", "ports": ports})).await;
    assert_eq!(headless["spec"]["ipFamilyPolicy"], "RequireDualStack");
    assert_eq!(headless["spec"]["ipFamilies"], json!(["IPv4"]));
    let external = create(
        "external",
        json!({"type": "ExternalName", "externalName": "example.com"}),
    )
    .await;
    assert_eq!(external["spec"].get("ipFamilies"), None);
    assert_eq!(external["spec"].get("internalTrafficPolicy"), None);
    assert_eq!(external["status"], json!({"loadBalancer": {}}));

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client, "default");
    for (name, resources, qos) in [
        ("best-effort", json!({}), "BestEffort"),
        (
            "guaranteed",
            json!({"limits": {"cpu": "500m", "memory": "1Gi"}}),
            "Guaranteed",
        ),
        (
            "burstable",
            json!({"requests": {"cpu": "0.5"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
            "Burstable",
        ),
    ] {
        let pod = json!({"metadata": {"name": name}, "spec": {"containers": [
            {"name": "c", "image": "x:1", "resources": resources}]}});
        let created = pods
            .create(
                &PostParams::default(),
                &serde_json::from_value(pod).unwrap(),
            )
            .await
            .unwrap();
        let status = created.status.unwrap();
        assert_eq!(status.qos_class.as_deref(), Some(qos), "{name}");
    }
}

/// `/openapi/v2` is the whole Swagger 2.0 document (it was empty): built-in kinds and custom
/// resources under kube-apiserver's definition names with their group-version-kind, every
/// reference to `#/definitions/…` resolving, and each object path's operations, PATCH with
/// `fieldValidation` (which kubectl looks for before it leaves validation to the server).
#[tokio::test]
async fn openapi_v2_is_the_whole_document() {
    let server = TestServer::start().await;
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(server.client());
    let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {
        "group": "example.com", "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [{"name": "v1", "served": true, "storage": true,
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {
                "type": "object", "properties": {"size": {"type": "integer"}}}}}}}]}});
    crds.create(
        &PostParams::default(),
        &serde_json::from_value(crd).unwrap(),
    )
    .await
    .unwrap();
    let http = RawHttp::new(server.url());
    let (code, doc) = http
        .request("GET", "/openapi/v2", &[("Accept", "application/json")], "")
        .await;
    assert_eq!(code, 200);
    assert_eq!(doc["swagger"], "2.0");
    let definitions = doc["definitions"].as_object().unwrap();
    let config_map = &definitions["io.k8s.api.core.v1.ConfigMap"];
    assert_eq!(
        config_map["x-kubernetes-group-version-kind"],
        json!([{"group": "", "version": "v1", "kind": "ConfigMap"}])
    );
    assert_eq!(
        config_map["properties"]["metadata"]["$ref"],
        "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
    );
    let widget = &definitions["com.example.v1.Widget"];
    assert_eq!(
        widget["properties"]["spec"]["properties"]["size"]["type"],
        "integer"
    );
    assert_eq!(
        widget["x-kubernetes-group-version-kind"],
        json!([{"group": "example.com", "version": "v1", "kind": "Widget"}])
    );
    let text = doc.to_string();
    for reference in text.split("\"$ref\":\"").skip(1) {
        let target = reference.split('"').next().unwrap();
        let name = target
            .strip_prefix("#/definitions/")
            .unwrap_or_else(|| panic!("{target}"));
        assert!(
            definitions.contains_key(name),
            "{name} is referred to but missing"
        );
    }
    for (path, kind) in [
        (
            "/api/v1/namespaces/{namespace}/configmaps/{name}",
            "ConfigMap",
        ),
        (
            "/apis/example.com/v1/namespaces/{namespace}/widgets/{name}",
            "Widget",
        ),
    ] {
        let patch = &doc["paths"][path]["patch"];
        assert_eq!(
            patch["x-kubernetes-group-version-kind"]["kind"], kind,
            "{path}"
        );
        assert!(
            patch["parameters"]
                .as_array()
                .unwrap()
                .contains(&json!({"name": "fieldValidation", "in": "query", "type": "string", "uniqueItems": true})),
            "{patch}"
        );
        assert!(
            patch["responses"]["200"]["schema"]["$ref"]
                .as_str()
                .unwrap()
                .starts_with("#/definitions/"),
            "{patch}"
        );
    }
}
