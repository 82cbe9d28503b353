//! CustomResourceDefinitions, server-side apply, finalizers, garbage collection and namespaces.

use std::time::Duration;

use caretaker_apiserver::TestServer;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::core::Status;
use serde_json::{Value, json};

mod common;
use common::{RawHttp, api_status, create_namespace};

fn widget_crd(scope: &str) -> CustomResourceDefinition {
    let schema = json!({"type": "object", "properties": {
        "spec": {"type": "object", "required": ["size"], "properties": {
            "size": {"type": "integer", "minimum": 1},
            "color": {"type": "string", "enum": ["red", "blue"], "default": "red"}}},
        "status": {"type": "object", "properties": {"ready": {"type": "boolean"},
            "conditions": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"],
                "items": {"type": "object", "required": ["type", "status"],
                    "properties": {"type": {"type": "string"}, "status": {"type": "string"}}}}}}}});
    serde_json::from_value(json!({
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": scope,
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [
                {"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": schema},
                 "subresources": {"status": {}},
                 "additionalPrinterColumns": [{"name": "Size", "type": "integer", "jsonPath": ".spec.size"}]},
                {"name": "v1beta1", "served": true, "storage": false, "schema": {"openAPIV3Schema": schema}}
            ]}
    }))
    .unwrap()
}

fn widgets(client: &Client, version: &str, ns: Option<&str>) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("example.com", version, "Widget"),
        "widgets",
    );
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

fn widget(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec})).unwrap()
}

#[tokio::test]
async fn crds_are_served_validated_and_removed() {
    let server = TestServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = crds
        .create(&PostParams::default(), &widget_crd("Namespaced"))
        .await
        .unwrap();
    let conditions = crd.status.unwrap().conditions.unwrap();
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
    );
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == "NamesAccepted" && c.status == "True")
    );

    let w = widgets(&client, "v1", Some("default"));
    // Unknown fields are pruned, defaults applied, status dropped on create.
    let mut body = widget("w1", json!({"size": 2, "bogus": true}));
    body.data["status"] = json!({"ready": true});
    let created = w.create(&PostParams::default(), &body).await.unwrap();
    assert_eq!(created.data["spec"], json!({"size": 2, "color": "red"}));
    assert!(created.data.get("status").is_none());
    assert_eq!(created.metadata.generation, Some(1));

    // Strict field validation turns the unknown field into a 400.
    let bogus = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w9"}, "spec": {"size": 1, "bogus": 1}});
    let (code, body) = RawHttp::new(server.url())
        .send(
            "POST",
            "/apis/example.com/v1/namespaces/default/widgets?fieldValidation=Strict",
            "application/json",
            &bogus.to_string(),
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        body["message"],
        "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: unknown field \"spec.bogus\""
    );

    // Schema validation: 422 with kube-apiserver's wording.
    let Status {
        code,
        reason,
        message,
        ..
    } = api_status(
        w.create(
            &PostParams::default(),
            &widget("bad", json!({"size": 0, "color": "green"})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (422, "Invalid"));
    assert!(
        message.starts_with("Widget.example.com \"bad\" is invalid: ["),
        "{message}"
    );
    assert!(
        message.contains(
            "spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1"
        ),
        "{message}"
    );
    assert!(
        message.contains(
            "spec.color: Unsupported value: \"green\": supported values: \"red\", \"blue\""
        ),
        "{message}"
    );
    let Status { code, message, .. } = api_status(
        w.create(&PostParams::default(), &widget("bad", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (code, message.as_str()),
        (
            422,
            "Widget.example.com \"bad\" is invalid: spec.size: Required value"
        )
    );

    // Status subresource: the main resource ignores status, /status ignores everything else.
    let patched = w
        .patch_status(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"size": 9}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["ready"], true);
    assert_eq!(patched.data["spec"]["size"], 2);
    let patched = w
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": false}, "spec": {"size": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["ready"], true);
    assert_eq!(patched.data["spec"]["size"], 3);
    assert_eq!(patched.metadata.generation, Some(2));

    // Strategic merge patch is for built-in kinds only, as in kube-apiserver.
    let Status { code, reason, .. } = api_status(
        w.patch(
            "w1",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"size": 4}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (415, "UnsupportedMediaType"));
    // Annotations are limited to 256 KiB in total.
    let big = json!({"metadata": {"annotations": {"big": "x".repeat(300 * 1024)}}});
    let Status { code, message, .. } = api_status(
        w.patch("w1", &PatchParams::default(), &Patch::Merge(big))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 422);
    assert!(
        message.contains("metadata.annotations: Too long: must have at most 262144 bytes"),
        "{message}"
    );

    // The same object through the other version (conversion None).
    let beta = widgets(&client, "v1beta1", Some("default"));
    let via_beta = beta.get("w1").await.unwrap();
    assert_eq!(via_beta.types.unwrap().api_version, "example.com/v1beta1");
    assert_eq!(via_beta.data["spec"]["size"], 3);
    // A watch through v1beta1 sees a write through v1 as v1beta1 (not as it was stored).
    let since = via_beta.metadata.resource_version.clone().unwrap();
    let watch = beta
        .watch(&WatchParams::default().timeout(5), &since)
        .await
        .unwrap();
    futures::pin_mut!(watch);
    let relabel = json!({"metadata": {"labels": {"seen-through": "v1"}}});
    w.patch("w1", &PatchParams::default(), &Patch::Merge(&relabel))
        .await
        .unwrap();
    let Some(Ok(WatchEvent::Modified(seen))) = futures::StreamExt::next(&mut watch).await else {
        panic!("no change seen through v1beta1");
    };
    assert_eq!(seen.types.unwrap().api_version, "example.com/v1beta1");
    assert_eq!(seen.metadata.labels.unwrap()["seen-through"], "v1");
    assert_eq!(
        widgets(&client, "v1", None)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Deleting the CRD removes its objects and stops serving it.
    crds.delete("widgets.example.com", &DeleteParams::default())
        .await
        .unwrap();
    let code = api_status(w.get("w1").await.unwrap_err()).code;
    assert_eq!(code, 404);
    crds.create(&PostParams::default(), &widget_crd("Cluster"))
        .await
        .unwrap();
    let cluster = widgets(&client, "v1", None);
    assert!(
        cluster
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    cluster
        .create(
            &PostParams::default(),
            &widget("global", json!({"size": 1})),
        )
        .await
        .unwrap();
    assert_eq!(
        cluster.get("global").await.unwrap().metadata.namespace,
        None
    );
}

#[tokio::test]
async fn server_side_apply_ownership_conflicts_and_force() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let cfg = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data});
    let alice = PatchParams::apply("alice");
    let created = cms
        .patch(
            "ssa",
            &alice,
            &Patch::Apply(cfg(json!({"a": "1", "b": "2"}))),
        )
        .await
        .unwrap();
    let mf = created.metadata.managed_fields.unwrap();
    assert_eq!(mf.len(), 1);
    assert_eq!(mf[0].manager.as_deref(), Some("alice"));
    assert_eq!(mf[0].operation.as_deref(), Some("Apply"));

    let bob = PatchParams::apply("bob");
    let Status {
        code,
        reason,
        message,
        ..
    } = api_status(
        cms.patch("ssa", &bob, &Patch::Apply(cfg(json!({"a": "9"}))))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (409, "Conflict"));
    assert_eq!(
        message,
        "Apply failed with 1 conflict: conflict with \"alice\" using v1: .data.a"
    );

    let forced = cms
        .patch(
            "ssa",
            &bob.clone().force(),
            &Patch::Apply(cfg(json!({"a": "9"}))),
        )
        .await
        .unwrap();
    assert_eq!(forced.data.as_ref().unwrap()["a"], "9");
    let managers: Vec<_> = forced
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert_eq!(managers, vec!["alice", "bob"]);

    // alice drops b from her configuration: b is removed. a now belongs to bob and stays.
    let after = cms
        .patch("ssa", &alice, &Patch::Apply(cfg(json!({}))))
        .await
        .unwrap();
    assert_eq!(
        after.data.unwrap(),
        [("a".to_string(), "9".to_string())].into()
    );
}

fn container_names(deployment: &Deployment) -> Vec<String> {
    let value = serde_json::to_value(deployment).unwrap();
    value["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

/// Server-side apply of a built-in kind merges its lists by their keys, as kube-apiserver's
/// structured merge does: two managers own different containers of one Deployment, and only
/// the same field of the same container conflicts.
#[tokio::test]
async fn server_side_apply_merges_built_in_lists_by_key() {
    let server = TestServer::start().await;
    let deployments: Api<Deployment> = Api::namespaced(server.client(), "default");
    let cfg = |containers: Value| {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
               "spec": {"selector": {"matchLabels": {"app": "web"}},
                        "template": {"metadata": {"labels": {"app": "web"}},
                                     "spec": {"containers": containers}}}})
    };
    let alice = PatchParams::apply("alice");
    let bob = PatchParams::apply("bob");
    let web = json!([{"name": "web", "image": "nginx:1.27"}]);
    deployments
        .patch("web", &alice, &Patch::Apply(cfg(web.clone())))
        .await
        .unwrap();
    let both = deployments
        .patch(
            "web",
            &bob,
            &Patch::Apply(cfg(json!([{"name": "log", "image": "busybox"}]))),
        )
        .await
        .unwrap();
    let names = container_names(&both);
    assert_eq!(names, ["web", "log"]);
    let fields = serde_json::to_string(&both.metadata.managed_fields).unwrap();
    assert!(fields.contains(r#"k:{\"name\":\"log\"}"#), "{fields}");

    let conflict = api_status(
        deployments
            .patch(
                "web",
                &bob,
                &Patch::Apply(cfg(json!([{"name": "log", "image": "busybox"},
                                         {"name": "web", "image": "nginx:1.28"}]))),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!(conflict.code, 409);
    assert_eq!(
        conflict.message,
        "Apply failed with 1 conflict: conflict with \"alice\" using apps/v1: \
         .spec.template.spec.containers[name=\"web\"].image"
    );

    // Alice leaves: her container goes, bob's stays.
    let after = deployments
        .patch("web", &alice, &Patch::Apply(cfg(json!([]))))
        .await
        .unwrap();
    let names = container_names(&after);
    assert_eq!(names, ["log"]);
}

#[tokio::test]
async fn finalizers_garbage_collection_and_namespace_deletion() {
    let server = TestServer::start().await;
    let client = server.client();
    create_namespace(&client, "gc", json!({})).await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "gc");
    let make = |name: &str, owner: Option<&ConfigMap>, finalizers: Vec<&str>| -> ConfigMap {
        let mut meta = json!({"name": name, "finalizers": finalizers});
        if let Some(o) = owner {
            meta["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": o.metadata.name, "uid": o.metadata.uid}]);
        }
        serde_json::from_value(json!({"metadata": meta})).unwrap()
    };

    // Finalizers hold deletion until removed.
    cms.create(
        &PostParams::default(),
        &make("held", None, vec!["example.com/hold"]),
    )
    .await
    .unwrap();
    cms.delete("held", &DeleteParams::default()).await.unwrap();
    let held = cms.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_status(cms.get("held").await.unwrap_err()).code, 404);

    // Background: dependents go after the owner.
    let owner = cms
        .create(&PostParams::default(), &make("owner", None, vec![]))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &make("child", Some(&owner), vec![]))
        .await
        .unwrap();
    cms.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    eventually(|| async { cms.get_opt("child").await.unwrap().is_none() }).await;

    // Orphan: dependents stay, without the owner reference.
    let owner = cms
        .create(&PostParams::default(), &make("owner2", None, vec![]))
        .await
        .unwrap();
    cms.create(
        &PostParams::default(),
        &make("child2", Some(&owner), vec![]),
    )
    .await
    .unwrap();
    cms.delete("owner2", &DeleteParams::orphan()).await.unwrap();
    eventually(|| async { cms.get_opt("owner2").await.unwrap().is_none() }).await;
    let child = cms.get("child2").await.unwrap();
    assert!(
        child
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // Foreground: the owner waits (deletionTimestamp set) until its dependents are gone.
    let owner = cms
        .create(&PostParams::default(), &make("owner3", None, vec![]))
        .await
        .unwrap();
    cms.create(
        &PostParams::default(),
        &make("child3", Some(&owner), vec!["example.com/slow"]),
    )
    .await
    .unwrap();
    cms.delete("owner3", &DeleteParams::foreground())
        .await
        .unwrap();
    eventually(|| async {
        cms.get("child3")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    })
    .await;
    let waiting = cms.get("owner3").await.unwrap();
    assert!(
        waiting
            .metadata
            .finalizers
            .unwrap()
            .contains(&"foregroundDeletion".to_string())
    );
    cms.patch(
        "child3",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually(|| async { cms.get_opt("owner3").await.unwrap().is_none() }).await;

    // A dependent another owner still holds survives its owner's deletion, background or
    // foreground, and only loses the reference to it (kube's "solid owner" rule).
    let keeper = cms
        .create(&PostParams::default(), &make("keeper", None, vec![]))
        .await
        .unwrap();
    for (owner_name, params) in [
        ("owner4", DeleteParams::background()),
        ("owner5", DeleteParams::foreground()),
    ] {
        let owner = cms
            .create(&PostParams::default(), &make(owner_name, None, vec![]))
            .await
            .unwrap();
        let mut shared = make("shared", Some(&owner), vec![]);
        let keeper_ref = make("x", Some(&keeper), vec![]).metadata.owner_references;
        let refs = shared.metadata.owner_references.as_mut().unwrap();
        refs.extend(keeper_ref.unwrap());
        cms.create(&PostParams::default(), &shared).await.unwrap();
        cms.delete(owner_name, &params).await.unwrap();
        eventually(|| async { cms.get_opt(owner_name).await.unwrap().is_none() }).await;
        let kept = cms.get("shared").await.unwrap();
        let owners: Vec<String> = kept
            .metadata
            .owner_references
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(owners, ["keeper"], "{owner_name}");
        cms.delete("shared", &DeleteParams::default())
            .await
            .unwrap();
        eventually(|| async { cms.get_opt("shared").await.unwrap().is_none() }).await;
    }

    // Namespace deletion removes its contents, then the namespace.
    cms.create(&PostParams::default(), &make("content", None, vec![]))
        .await
        .unwrap();
    namespaces
        .delete("gc", &DeleteParams::default())
        .await
        .unwrap();
    let terminating = namespaces.get_opt("gc").await.unwrap();
    if let Some(ns) = terminating {
        assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Terminating"));
    }
    eventually(|| async { namespaces.get_opt("gc").await.unwrap().is_none() }).await;
    assert!(
        cms.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

async fn eventually<F, Fut>(mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("condition not reached in 5 s");
}

#[tokio::test]
async fn crds_and_their_objects_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = caretaker_apiserver::ApiServer::builder()
        .data_dir(dir.path())
        .start()
        .await
        .unwrap();
    Api::<CustomResourceDefinition>::all(first.client())
        .create(&PostParams::default(), &widget_crd("Namespaced"))
        .await
        .unwrap();
    widgets(&first.client(), "v1", Some("default"))
        .create(&PostParams::default(), &widget("kept", json!({"size": 5})))
        .await
        .unwrap();
    let rv = first.resource_version();
    first.shutdown().await;

    let second = caretaker_apiserver::ApiServer::builder()
        .data_dir(dir.path())
        .start()
        .await
        .unwrap();
    assert_eq!(second.resource_version(), rv);
    let w = widgets(&second.client(), "v1", Some("default"));
    assert_eq!(w.get("kept").await.unwrap().data["spec"]["size"], 5);
    // Validation still applies: the schema came back with the CRD.
    assert_eq!(
        api_status(
            w.create(&PostParams::default(), &widget("bad", json!({"size": 0})))
                .await
                .unwrap_err()
        )
        .code,
        422
    );
}

#[tokio::test]
async fn server_side_apply_of_status_conditions_merges_by_key() {
    let server = TestServer::start().await;
    let client = server.client();
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&PostParams::default(), &widget_crd("Namespaced"))
        .await
        .unwrap();
    let w = widgets(&client, "v1", Some("default"));
    w.create(&PostParams::default(), &widget("w", json!({"size": 1})))
        .await
        .unwrap();
    let status = |conditions: Value| json!({"apiVersion": "example.com/v1", "kind": "Widget", "status": {"conditions": conditions}});
    w.patch_status(
        "w",
        &PatchParams::apply("controller-a"),
        &Patch::Apply(status(json!([{"type": "A", "status": "True"}]))),
    )
    .await
    .unwrap();
    let after = w
        .patch_status(
            "w",
            &PatchParams::apply("controller-b"),
            &Patch::Apply(status(json!([{"type": "B", "status": "False"}]))),
        )
        .await
        .unwrap();
    assert_eq!(
        after.data["status"]["conditions"],
        json!([{"type": "A", "status": "True"}, {"type": "B", "status": "False"}])
    );
    let Status { code, message, .. } = api_status(
        w.patch_status(
            "w",
            &PatchParams::apply("controller-b"),
            &Patch::Apply(status(json!([{"type": "A", "status": "False"}]))),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(code, 409);
    assert!(
        message.contains("conflict with \"controller-a\"")
            && message.contains(".status.conditions[type=\"A\"].status"),
        "{message}"
    );
    // controller-a drops its condition; controller-b's stays.
    let after = w
        .patch_status(
            "w",
            &PatchParams::apply("controller-a"),
            &Patch::Apply(status(json!([]))),
        )
        .await
        .unwrap();
    assert_eq!(
        after.data["status"]["conditions"],
        json!([{"type": "B", "status": "False"}])
    );
    assert_eq!(after.data["spec"]["size"], 1);
}
