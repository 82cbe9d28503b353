//! Core verbs over real HTTP with a kube client.

use caretaker_apiserver::TestServer;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

mod common;
use common::{RawHttp, api_status, create_namespace};

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

/// Lists `lp` page by page through continue tokens, checking that only full pages carry a
/// token and that no token repeats; returns the names on each page.
async fn list_pages(cms: &Api<ConfigMap>, lp: ListParams) -> Vec<Vec<String>> {
    let limit = lp.limit.unwrap() as usize;
    let mut pages = vec![];
    let mut tokens = vec![];
    let mut page = cms.list(&lp).await.unwrap();
    loop {
        pages.push(
            page.items
                .iter()
                .map(|c| c.metadata.name.clone().unwrap())
                .collect::<Vec<_>>(),
        );
        match page.metadata.continue_.clone().filter(|c| !c.is_empty()) {
            Some(token) => {
                assert_eq!(page.items.len(), limit, "a page with a token is full");
                assert!(!tokens.contains(&token), "a token repeats: {tokens:?}");
                tokens.push(token.clone());
                page = cms.list(&lp.clone().continue_token(&token)).await.unwrap();
            }
            None => {
                assert!((1..=limit).contains(&page.items.len()), "{pages:?}");
                break;
            }
        }
    }
    pages
}

#[tokio::test]
async fn configmap_lifecycle_and_errors() {
    let server = TestServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");

    let created = cms
        .create(&PostParams::default(), &cm("a", json!({"app": "web"})))
        .await
        .unwrap();
    let meta = &created.metadata;
    assert!(meta.uid.as_ref().is_some_and(|u| u.len() == 36));
    assert!(meta.creation_timestamp.is_some());
    let rv1: u64 = meta.resource_version.as_ref().unwrap().parse().unwrap();

    let err = api_status(
        cms.create(&PostParams::default(), &cm("a", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(err.message, "configmaps \"a\" already exists");

    let err = api_status(cms.get("missing").await.unwrap_err());
    assert_eq!(
        (err.code, err.reason.as_str(), err.message.as_str()),
        (404, "NotFound", "configmaps \"missing\" not found")
    );

    // Update with the current resourceVersion works; with the old one it is a 409 Conflict.
    let mut changed = created.clone();
    changed.data = Some([("k".to_string(), "v2".to_string())].into());
    let updated = cms
        .replace("a", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = updated
        .metadata
        .resource_version
        .as_ref()
        .unwrap()
        .parse()
        .unwrap();
    assert!(rv2 > rv1);
    let err = api_status(
        cms.replace("a", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (409, "Conflict"));

    // generateName.
    let generated: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).unwrap();
    let g = cms
        .create(&PostParams::default(), &generated)
        .await
        .unwrap();
    assert!(
        g.metadata.name.as_ref().unwrap().starts_with("gen-")
            && g.metadata.name.as_ref().unwrap().len() == 9
    );

    // Invalid name: 422 Invalid.
    let err = api_status(
        cms.create(&PostParams::default(), &cm("Not_Valid", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));

    // Label selectors, limit and continue.
    for i in 0..5 {
        cms.create(
            &PostParams::default(),
            &cm(&format!("page-{i}"), json!({"app": "paged"})),
        )
        .await
        .unwrap();
    }
    // With a selector the server filters while paging; without one storage stops early. Both
    // must cut pages of exactly `limit` and hand out a token only while objects remain.
    let paged = list_pages(&cms, ListParams::default().labels("app=paged").limit(2)).await;
    assert_eq!(
        paged,
        [
            vec!["page-0", "page-1"],
            vec!["page-2", "page-3"],
            vec!["page-4"]
        ]
    );
    let all: Vec<String> = list_pages(&cms, ListParams::default().limit(3))
        .await
        .concat();
    let unpaged: Vec<String> = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    // With the namespace's kube-root-ca.crt, there from the start.
    assert_eq!(unpaged.len(), 8, "{unpaged:?}");
    assert_eq!(all, unpaged);
    // remainingItemCount: what is left after each page, as kube-apiserver counts it; not
    // given with a selector (kube-apiserver would have to scan to count).
    let first = cms.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(first.metadata.remaining_item_count, Some(5));
    let token = first.metadata.continue_.unwrap();
    let second = cms
        .list(&ListParams::default().limit(3).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(second.metadata.remaining_item_count, Some(2));
    let last = cms
        .list(
            &ListParams::default()
                .limit(3)
                .continue_token(&second.metadata.continue_.unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(last.metadata.remaining_item_count, None, "nothing remains");
    let selected = cms
        .list(&ListParams::default().labels("app=paged").limit(2))
        .await
        .unwrap();
    assert_eq!(selected.metadata.remaining_item_count, None);
    let web = cms
        .list(&ListParams::default().labels("app in (web)"))
        .await
        .unwrap();
    assert_eq!(web.items.len(), 1);
    let by_name = cms
        .list(&ListParams::default().fields("metadata.name=page-3"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);

    // Patches: merge, JSON, strategic.
    let p = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"m": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.data.unwrap()["m"], "1");
    let jp: json_patch::Patch =
        serde_json::from_value(json!([{"op": "add", "path": "/data/j", "value": "2"}])).unwrap();
    let p = cms
        .patch("a", &PatchParams::default(), &Patch::<()>::Json(jp))
        .await
        .unwrap();
    assert_eq!(p.data.as_ref().unwrap()["j"], "2");
    let p = cms
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Strategic(json!({"data": {"s": "3"}})),
        )
        .await
        .unwrap();
    assert_eq!(p.data.as_ref().unwrap().len(), 4);

    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(api_status(cms.get("a").await.unwrap_err()).code, 404);

    // Namespaced create in a missing namespace: 404 for the namespace.
    let nowhere: Api<ConfigMap> = Api::namespaced(client.clone(), "nowhere");
    let err = api_status(
        nowhere
            .create(&PostParams::default(), &cm("x", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (err.code, err.message.as_str()),
        (404, "namespaces \"nowhere\" not found")
    );

    // Secrets: stringData becomes base64 data.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s: Secret = serde_json::from_value(
        json!({"metadata": {"name": "s"}, "stringData": {"password": "hunter2"}}),
    )
    .unwrap();
    let s = secrets.create(&PostParams::default(), &s).await.unwrap();
    assert_eq!(s.data.unwrap()["password"].0, b"hunter2");
    assert_eq!(s.type_.as_deref(), Some("Opaque"));

    // Default namespaces exist.
    let namespaces: Api<Namespace> = Api::all(client);
    let ns = namespaces.get("kube-system").await.unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));
}

#[tokio::test]
async fn malformed_requests_get_status_errors() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    // Not JSON.
    let (code, body) = http
        .send(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            "{not json",
        )
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["reason"], "BadRequest");
    // Unknown resource.
    let (code, body) = http
        .send(
            "GET",
            "/api/v1/namespaces/default/widgets",
            "application/json",
            "",
        )
        .await;
    assert_eq!((code, body["reason"].as_str()), (404, Some("NotFound")));
    let (code, _) = http
        .send(
            "GET",
            "/apis/nope.example.com/v1/things",
            "application/json",
            "",
        )
        .await;
    assert_eq!(code, 404);
    // Unsupported patch type.
    let (code, body) = http
        .send(
            "PATCH",
            "/api/v1/namespaces/default",
            "application/xml",
            "<x/>",
        )
        .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (415, Some("UnsupportedMediaType"))
    );
    // POST to a named object.
    let (code, body) = http
        .send(
            "POST",
            "/api/v1/namespaces/default/configmaps/x",
            "application/json",
            "{}",
        )
        .await;
    assert_eq!(
        (code, body["reason"].as_str()),
        (405, Some("MethodNotAllowed"))
    );
    // The server still works and stored nothing.
    let (code, body) = http
        .send(
            "GET",
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            "",
        )
        .await;
    assert_eq!(code, 200);
    let names: Vec<&Value> = body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| &i["metadata"]["name"])
        .collect();
    assert_eq!(
        names,
        ["kube-root-ca.crt"],
        "what the root-CA publisher keeps there alone"
    );
}

#[tokio::test]
async fn kube_event_recorder_events_are_served_by_both_event_apis() {
    use k8s_openapi::api::core::v1::Event as CoreEvent;
    use k8s_openapi::api::events::v1::Event;
    use kube::Resource;
    use kube::runtime::events::{Event as NewEvent, EventType, Recorder, Reporter};

    let server = TestServer::start().await;
    let client = server.client();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let target = cms
        .create(&PostParams::default(), &cm("watched", json!({})))
        .await
        .unwrap();
    let reporter = Reporter {
        controller: "caretaker-test".into(),
        instance: Some("test-0".into()),
    };
    let recorder = Recorder::new(client.clone(), reporter);
    let event = NewEvent {
        type_: EventType::Normal,
        reason: "CertificatesRefreshDone".into(),
        note: Some("refreshed".into()),
        action: "Refresh".into(),
        secondary: None,
    };
    let reference = target.object_ref(&());
    recorder.publish(&event, &reference).await.unwrap();
    // The same event again becomes a series (a merge patch of the first).
    recorder.publish(&event, &reference).await.unwrap();

    let v1: Api<Event> = Api::namespaced(client.clone(), "default");
    let events = v1.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].reason.as_deref(), Some("CertificatesRefreshDone"));
    assert_eq!(events[0].series.as_ref().map(|s| s.count), Some(2));

    // kubectl describe finds events through core/v1 and involvedObject field selectors.
    let core: Api<CoreEvent> = Api::namespaced(client, "default");
    let selected = core
        .list(&ListParams::default().fields(&format!(
            "involvedObject.name=watched,involvedObject.uid={}",
            target.metadata.uid.unwrap()
        )))
        .await
        .unwrap()
        .items;
    assert_eq!(selected.len(), 1);
    assert_eq!(selected[0].message.as_deref(), Some("refreshed"));
    assert_eq!(
        selected[0].reporting_component.as_deref(),
        Some("caretaker-test")
    );
}

#[tokio::test]
async fn metadata_and_immutability_rules() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let pp = PostParams::default();

    let err = api_status(
        cms.create(&pp, &cm("bad-label", json!({"app": "no spaces"})))
            .await
            .unwrap_err(),
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"));
    assert!(
        err.message.starts_with(
            "ConfigMap \"bad-label\" is invalid: metadata.labels: Invalid value: \"no spaces\""
        ),
        "{}",
        err.message
    );
    let err = api_status(
        cms.create(&pp, &cm("bad-key", json!({"bad key": "x"})))
            .await
            .unwrap_err(),
    );
    assert_eq!(err.code, 422);

    let orphan: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "o", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": ""}]}})).unwrap();
    let err = api_status(cms.create(&pp, &orphan).await.unwrap_err());
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("metadata.ownerReferences[0].uid"),
        "{}",
        err.message
    );
    let two_controllers: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "two", "ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "a", "uid": "u1", "controller": true},
        {"apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle", "name": "b", "uid": "u2", "controller": true},
    ]}}))
    .unwrap();
    let err = api_status(cms.create(&pp, &two_controllers).await.unwrap_err());
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains(
            "Only one reference can have Controller set to true. Found \"true\" in references for Deployment/a and Bundle/b"
        ),
        "{}",
        err.message
    );

    let frozen: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "frozen"}, "data": {"k": "v"}, "immutable": true}),
    )
    .unwrap();
    cms.create(&pp, &frozen).await.unwrap();
    let err = api_status(
        cms.patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(err.code, 422);
    assert_eq!(
        err.message,
        "ConfigMap \"frozen\" is invalid: data: Forbidden: field is immutable when `immutable` is set"
    );
    // Metadata may still change.
    cms.patch(
        "frozen",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"ok": "yes"}}})),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn malformed_selectors_are_bad_requests() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    cms.create(&PostParams::default(), &cm("a", json!({"app": "web"})))
        .await
        .unwrap();
    let http = RawHttp::new(server.url());
    for (query, message) in [
        (
            "labelSelector=a!=!=b",
            "unable to parse requirement: found '!=', expected: identifier",
        ),
        (
            "labelSelector=app=web,",
            "found '', expected: identifier after ','",
        ),
        // Empty field: kube-apiserver has no such field to select on.
        ("fieldSelector==", "field label not supported: "),
        (
            "fieldSelector=metadata..name=a",
            "field label not supported: metadata..name",
        ),
    ] {
        for watch in ["", "&watch=true"] {
            let (code, body) = http
                .send(
                    "GET",
                    &format!("/api/v1/namespaces/default/configmaps?{query}{watch}"),
                    "application/json",
                    "",
                )
                .await;
            assert_eq!(
                (code, body["reason"].as_str(), body["message"].as_str()),
                (400, Some("BadRequest"), Some(message)),
                "{query}{watch}"
            );
        }
    }
    // Well-formed ones still select.
    let listed = cms
        .list(
            &ListParams::default()
                .labels("app in (web),!missing")
                .fields("metadata.name=a"),
        )
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
}

#[tokio::test]
async fn malformed_managed_fields_are_bad_requests() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    cms.create(&PostParams::default(), &cm("owned", json!({})))
        .await
        .unwrap();
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps/owned";
    let put = |managed: serde_json::Value| {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "owned", "managedFields": managed}, "data": {"k": "v2"}})
            .to_string()
    };
    for (managed, message) in [
        (
            json!("junk"),
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal string into Go struct field ObjectMeta.metadata.managedFields of type []v1.ManagedFieldsEntry",
        ),
        (
            json!([7]),
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ObjectMeta.metadata.managedFields of type v1.ManagedFieldsEntry",
        ),
        (
            json!([{"manager": 1, "operation": "Update"}]),
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: json: cannot unmarshal number into Go struct field ManagedFieldsEntry.metadata.managedFields.manager of type string",
        ),
        (
            json!([{"manager": "m", "time": "yesterday"}]),
            "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: metadata.managedFields[0].time: \"yesterday\" is not an RFC 3339 time",
        ),
    ] {
        let (code, body) = http
            .send("PUT", path, "application/json", &put(managed.clone()))
            .await;
        assert_eq!(
            (code, body["reason"].as_str(), body["message"].as_str()),
            (400, Some("BadRequest"), Some(message)),
            "{managed}"
        );
    }
    assert_eq!(cms.get("owned").await.unwrap().data.unwrap()["k"], "v");

    // Well-typed entries kube-apiserver's field manager cannot use are ignored, as there: the
    // update is tracked from the stored managedFields.
    let (code, body) = http
        .send(
            "PUT",
            path,
            "application/json",
            &put(json!([{"manager": "m", "operation": "Bogus", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {}}])),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    let stored = cms.get("owned").await.unwrap();
    assert_eq!(stored.data.unwrap()["k"], "v2");
    let managers: Vec<_> = stored
        .metadata
        .managed_fields
        .unwrap()
        .into_iter()
        .map(|e| (e.manager.unwrap(), e.operation.unwrap()))
        .collect();
    assert!(
        managers.iter().all(|(_, op)| op == "Update") && !managers.is_empty(),
        "{managers:?}"
    );
}

#[tokio::test]
async fn empty_metadata_fields_are_omitted() {
    let server = TestServer::start().await;
    let http = RawHttp::new(server.url());
    let (code, body) = http
        .send(
            "POST",
            "/api/v1/namespaces/default/configmaps",
            "application/json",
            r#"{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "plain", "generateName": "", "labels": {}, "finalizers": [], "annotations": null}}"#,
        )
        .await;
    assert_eq!(code, 201, "{body}");
    let meta = body["metadata"].as_object().unwrap();
    for absent in ["generateName", "labels", "finalizers", "annotations"] {
        assert!(!meta.contains_key(absent), "{absent} in {body}");
    }
    // kube-rs sends no generateName at all; none comes back either.
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let created = cms
        .create(&PostParams::default(), &cm("typed", json!({})))
        .await
        .unwrap();
    assert_eq!(created.metadata.generate_name, None);
}

#[tokio::test]
async fn deletecollection_deletes_exactly_the_selected_objects() {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};

    let server = TestServer::start().await;
    let client = server.client();
    create_namespace(&client, "elsewhere", json!({})).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let pp = PostParams::default();
    for (name, team) in [("a-0", "a"), ("b-0", "b"), ("a-1", "a"), ("b-1", "b")] {
        cms.create(&pp, &cm(name, json!({"team": team})))
            .await
            .unwrap();
    }
    // Selected by the labels, but in another namespace than the collection.
    let elsewhere: Api<ConfigMap> = Api::namespaced(client.clone(), "elsewhere");
    elsewhere
        .create(&pp, &cm("a-far", json!({"team": "a"})))
        .await
        .unwrap();

    let all: Api<ConfigMap> = Api::all(client);
    let rv = server.resource_version().to_string();
    let mut events = std::pin::pin!(all.watch(&WatchParams::default(), &rv).await.unwrap());

    let names = |items: &[ConfigMap]| -> Vec<String> {
        items
            .iter()
            .map(|c| c.metadata.name.clone().unwrap())
            .collect()
    };
    let deleted = cms
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("team=a"),
        )
        .await
        .unwrap()
        .left()
        .expect("the deleted objects, not a Status");
    assert_eq!(names(&deleted.items), ["a-0", "a-1"]);

    // A write after the deletions marks the end of their events: everything the watch reports
    // before it must be exactly one DELETED per deleted object.
    cms.create(&pp, &cm("marker", json!({}))).await.unwrap();
    let mut seen = vec![];
    loop {
        let event = tokio::time::timeout(std::time::Duration::from_secs(20), events.next())
            .await
            .expect("watch stalled")
            .expect("watch ended")
            .unwrap();
        match event {
            WatchEvent::Added(c) if c.metadata.name.as_deref() == Some("marker") => break,
            WatchEvent::Bookmark(_) => {}
            other => seen.push(match other {
                WatchEvent::Added(c) => ("ADDED", c.metadata.name.unwrap()),
                WatchEvent::Modified(c) => ("MODIFIED", c.metadata.name.unwrap()),
                WatchEvent::Deleted(c) => ("DELETED", c.metadata.name.unwrap()),
                e => panic!("unexpected watch event {e:?}"),
            }),
        }
    }
    assert_eq!(
        seen,
        [
            ("DELETED", "a-0".to_string()),
            ("DELETED", "a-1".to_string())
        ]
    );
}

#[tokio::test]
async fn a_write_that_changes_nothing_is_not_stored() {
    // As kube-apiserver: the same apply again, or an update with the object as it is, keeps the
    // resourceVersion (no write, no watch event); a real change gets a new one.
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let apply = PatchParams::apply("tester");
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "same"}, "data": {"k": "v"}});
    let first = cms
        .patch("same", &apply, &Patch::Apply(&body))
        .await
        .unwrap();
    let again = cms
        .patch("same", &apply, &Patch::Apply(&body))
        .await
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        first.metadata.resource_version
    );
    let replaced = cms
        .replace("same", &PostParams::default(), &again)
        .await
        .unwrap();
    assert_eq!(
        replaced.metadata.resource_version,
        first.metadata.resource_version
    );

    let changed = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "same"}, "data": {"k": "w"}});
    let after = cms
        .patch("same", &apply, &Patch::Apply(&changed))
        .await
        .unwrap();
    assert_ne!(
        after.metadata.resource_version,
        first.metadata.resource_version
    );
    assert_eq!(after.data.unwrap()["k"], "w");
}

/// Write options kube-apiserver refuses are refused, and nothing is written: a `dryRun` other
/// than `All` (which a careless client might take for a dry run) and a field manager over 128
/// bytes.
#[tokio::test]
async fn invalid_write_options_are_refused_and_write_nothing() {
    let server = TestServer::start().await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let http = RawHttp::new(server.url());
    let path = "/api/v1/namespaces/default/configmaps";
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}"#;
    let refused =
        |options: &str, problem: &str| format!("{options}.meta.k8s.io \"\" is invalid: {problem}");
    let bogus = r#"dryRun: Unsupported value: ["Bogus"]: supported values: "All""#;

    let (code, status) = http
        .send(
            "POST",
            &format!("{path}?dryRun=Bogus"),
            "application/json",
            body,
        )
        .await;
    assert_eq!(
        (code, status["reason"].as_str()),
        (422, Some("Invalid")),
        "{status}"
    );
    assert_eq!(status["message"], refused("CreateOptions", bogus));
    assert!(cms.get_opt("a").await.unwrap().is_none(), "nothing stored");

    let (code, _) = http
        .send(
            "POST",
            &format!("{path}?dryRun=All"),
            "application/json",
            body,
        )
        .await;
    assert_eq!(code, 201);
    assert!(cms.get_opt("a").await.unwrap().is_none(), "a dry run");

    let long = "m".repeat(129);
    let (code, status) = http
        .send(
            "PATCH",
            &format!("{path}/a?fieldManager={long}"),
            "application/apply-patch+yaml",
            body,
        )
        .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["message"],
        refused(
            "PatchOptions",
            "fieldManager: Too long: may not be more than 128 bytes"
        )
    );
    assert!(cms.get_opt("a").await.unwrap().is_none());
    let (code, status) = http
        .send(
            "PATCH",
            &format!("{path}/a?fieldManager={}", "m".repeat(128)),
            "application/apply-patch+yaml",
            body,
        )
        .await;
    assert_eq!(code, 201, "{status}");

    for query in ["dryRun=Bogus", "dryRun=All&dryRun=Bogus"] {
        let (code, status) = http
            .send(
                "DELETE",
                &format!("{path}/a?{query}"),
                "application/json",
                "",
            )
            .await;
        assert_eq!(code, 422, "{query}: {status}");
        assert!(
            cms.get_opt("a").await.unwrap().is_some(),
            "{query}: not deleted"
        );
    }
    let (code, status) = http
        .send(
            "PUT",
            &format!("{path}/a?dryRun=Bogus"),
            "application/json",
            body,
        )
        .await;
    assert_eq!(code, 422, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .starts_with("UpdateOptions.meta.k8s.io")
    );
}
