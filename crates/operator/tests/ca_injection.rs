//! CA-bundle injection against the embedded API server over real HTTP: the four target kinds,
//! someone overwriting a `caBundle`, a bundle that grows a second CA, cert-manager's
//! `inject-ca-from-secret` with and without the Secret's consent, missing sources, hostile
//! annotation values, and an operator without the CertificateAuthority CRD.
//!
//! Most tests run the injection controllers alone (`ca_injection::run`), so that they own
//! the bundle ConfigMaps they write; the last runs the whole operator.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use caretaker_api::names::injection as names;
use caretaker_api::v1alpha1::{self, CertificateAuthority};
use caretaker_apiserver::{ApiServer, TestServer};
use caretaker_operator::controllers;
use caretaker_operator::injection::TargetKind;
use caretaker_operator::injection::controller as ca_injection;
use caretaker_operator::{Context, Settings};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::authorities::{create_namespace, eventually, install_caretaker_crds};
use common::logs::Captured;

/// The embedded API server, with the injection controllers (or the whole operator) running.
struct Setup {
    _server: ApiServer,
    client: kube::Client,
    controllers: tokio::task::JoinHandle<()>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.controllers.abort();
    }
}

/// A server with the caretaker CRDs and the namespaces the tests use, and the injection
/// controllers reading sources from `scope` only, if given.
async fn injection(scope: Option<&str>) -> Setup {
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    for namespace in ["caretaker-system", "demo"] {
        create_namespace(&client, namespace).await;
    }
    let ctx = Context::new(client.clone(), common::fast());
    let controllers = tokio::spawn(ca_injection::run(ctx, scope.map(str::to_string)));
    Setup {
        _server: server,
        client,
        controllers,
    }
}

fn ca_pem(common_name: &str) -> String {
    caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new(common_name))
        .unwrap()
        .certificate_pem()
}

fn b64(text: &str) -> String {
    STANDARD.encode(text)
}

impl Setup {
    fn targets(&self, kind: TargetKind) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &kind.api_resource())
    }

    async fn create_authority(&self, name: &str, bundle: &str) {
        let cas: Api<CertificateAuthority> = Api::all(self.client.clone());
        let ca = serde_json::from_value(json!({
            "apiVersion": "caretaker.dev/v1alpha1",
            "kind": "CertificateAuthority",
            "metadata": { "name": name },
            "spec": {
                "commonName": format!("{name}-ca"),
                "secret": { "name": format!("{name}-ca"), "namespace": "caretaker-system" },
                "bundle": { "name": bundle, "namespace": "caretaker-system" },
            },
        }))
        .unwrap();
        cas.create(&PostParams::default(), &ca).await.unwrap();
    }

    /// The mark CertificateAuthority `webhooks`'s controller puts on its Secret and bundle
    /// (injection reads only those: see `caretaker_operator::ownership`); none while it does
    /// not exist.
    async fn webhooks_mark(&self) -> Value {
        let cas: Api<CertificateAuthority> = Api::all(self.client.clone());
        match cas.get_opt("webhooks").await.unwrap() {
            Some(ca) => json!({ caretaker_api::names::OWNER:
                format!("CertificateAuthority/webhooks/{}", ca.metadata.uid.unwrap()) }),
            None => json!({}),
        }
    }

    /// Creates or replaces the bundle ConfigMap `name` in caretaker-system, with the mark of
    /// CertificateAuthority `webhooks`.
    async fn publish_bundle(&self, name: &str, data: BTreeMap<String, String>) {
        let config_maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), "caretaker-system");
        let body = json!({ "apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": { "name": name, "annotations": self.webhooks_mark().await },
                           "data": data });
        config_maps
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }

    /// Publishes `bundle` in the bundle ConfigMap `name` of CertificateAuthority `webhooks`,
    /// as its controller would: the CAs first kept in its Secret (`webhooks-ca`), then
    /// published.
    async fn publish(&self, name: &str, bundle: &str) {
        self.keep_cas(bundle).await;
        let data = BTreeMap::from([(v1alpha1::BUNDLE_KEY.to_string(), bundle.to_string())]);
        self.publish_bundle(name, data).await;
    }

    /// Creates or replaces CertificateAuthority `webhooks`'s Secret, keeping `cas` (as
    /// `previous.crt`: any key the controller keeps CAs in vouches for them).
    async fn keep_cas(&self, cas: &str) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), "caretaker-system");
        let body = json!({ "apiVersion": "v1", "kind": "Secret",
                           "metadata": { "name": "webhooks-ca",
                                         "annotations": self.webhooks_mark().await },
                           "data": { "previous.crt": b64(cas) } });
        secrets
            .patch(
                "webhooks-ca",
                &PatchParams::apply("test").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }

    /// Creates or replaces a Secret with `ca.crt` (if given) and the annotations given.
    async fn put_secret(
        &self,
        namespace: &str,
        name: &str,
        annotations: &[(&str, &str)],
        ca: Option<&str>,
    ) {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        let mut body = json!({ "apiVersion": "v1", "kind": "Secret",
                               "metadata": { "name": name, "annotations": annotations } });
        if let Some(ca) = ca {
            body["data"] = json!({ "ca.crt": b64(ca) });
        }
        secrets
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(&body),
            )
            .await
            .unwrap();
    }

    /// Creates a target of `kind` named `name` with `annotations`; its caBundle fields hold
    /// `ca_bundle` (base64) when given.
    async fn create_target(
        &self,
        kind: TargetKind,
        name: &str,
        annotations: &[(&str, &str)],
        ca_bundle: Option<&str>,
    ) -> DynamicObject {
        let body = target(kind, name, annotations, ca_bundle);
        self.targets(kind)
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap()
    }

    async fn get(&self, kind: TargetKind, name: &str) -> DynamicObject {
        self.targets(kind).get(name).await.unwrap()
    }

    /// The target's caBundle fields, decoded (`None` for a field that is absent).
    async fn bundles(&self, kind: TargetKind, name: &str) -> Vec<Option<String>> {
        bundles(kind, &self.get(kind, name).await)
    }

    /// Waits until every caBundle field of the target holds `bundle`.
    async fn wait_holds(&self, kind: TargetKind, name: &str, bundle: &str) -> DynamicObject {
        eventually(&format!("{kind:?} {name} holds the bundle"), 20, || async {
            let target = self.get(kind, name).await;
            let held = bundles(kind, &target);
            (!held.is_empty() && held.iter().all(|b| b.as_deref() == Some(bundle)))
                .then_some(target)
        })
        .await
    }

    /// The events about the object named `name`.
    async fn events(&self, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }

    /// The messages of the events with `reason` about `name`.
    async fn notes(&self, name: &str, reason: &str) -> Vec<String> {
        self.events(name)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.message.unwrap_or_default())
            .collect()
    }

    /// Waits for an event with `reason` about `name`, and returns its message.
    async fn wait_event(&self, name: &str, reason: &str) -> String {
        eventually(&format!("a {reason} event about {name}"), 20, || async {
            self.notes(name, reason).await.pop()
        })
        .await
    }
}

fn webhook(name: &str, ca_bundle: Option<&str>) -> Value {
    let mut client_config = json!({ "url": format!("https://127.0.0.1:1/{name}") });
    if let Some(ca_bundle) = ca_bundle {
        client_config["caBundle"] = json!(ca_bundle);
    }
    // Rules no test object matches, so that the embedded API server never calls them.
    json!({
        "name": name,
        "clientConfig": client_config,
        "rules": [{ "apiGroups": ["example.com"], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["gadgets"] }],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Ignore",
        "timeoutSeconds": 3,
    })
}

fn target(
    kind: TargetKind,
    name: &str,
    annotations: &[(&str, &str)],
    ca_bundle: Option<&str>,
) -> Value {
    let resource = kind.api_resource();
    let annotations: BTreeMap<&str, &str> = annotations.iter().copied().collect();
    let mut body = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": { "name": name, "annotations": annotations },
    });
    match kind {
        TargetKind::ValidatingWebhookConfiguration | TargetKind::MutatingWebhookConfiguration => {
            body["webhooks"] = json!([
                webhook("a.injection.test", ca_bundle),
                webhook("b.injection.test", ca_bundle),
            ]);
        }
        TargetKind::CustomResourceDefinition => {
            let (plural, group) = name.split_once('.').unwrap();
            let mut client_config = json!({ "service": { "namespace": "demo", "name": "convert", "path": "/convert" } });
            if let Some(ca_bundle) = ca_bundle {
                client_config["caBundle"] = json!(ca_bundle);
            }
            body["spec"] = json!({
                "group": group,
                "names": { "kind": "Gizmo", "plural": plural, "singular": "gizmo", "listKind": "GizmoList" },
                "scope": "Namespaced",
                "versions": [
                    { "name": "v1", "served": true, "storage": true,
                      "schema": { "openAPIV3Schema": { "type": "object",
                          "x-kubernetes-preserve-unknown-fields": true } } },
                    { "name": "v2", "served": true, "storage": false,
                      "schema": { "openAPIV3Schema": { "type": "object",
                          "x-kubernetes-preserve-unknown-fields": true } } },
                ],
                "conversion": { "strategy": "Webhook", "webhook": {
                    "conversionReviewVersions": ["v1"], "clientConfig": client_config } },
            });
        }
        TargetKind::ApiService => {
            let (version, group) = name.split_once('.').unwrap();
            body["spec"] = json!({
                "group": group, "version": version,
                "service": { "namespace": "demo", "name": "metrics", "port": 443 },
                "groupPriorityMinimum": 1000, "versionPriority": 15,
            });
            if let Some(ca_bundle) = ca_bundle {
                body["spec"]["caBundle"] = json!(ca_bundle);
            }
        }
    }
    body
}

/// A name of the right shape for `kind`, from `stem`.
fn name_for(kind: TargetKind, stem: &str) -> String {
    match kind {
        TargetKind::CustomResourceDefinition => format!("{stem}s.injection.test"),
        TargetKind::ApiService => format!("v1.{stem}.injection.test"),
        _ => format!("{stem}-{}", kind.kind().to_lowercase()),
    }
}

fn bundles(kind: TargetKind, target: &DynamicObject) -> Vec<Option<String>> {
    let decode = |value: &Value| {
        value
            .as_str()
            .map(|s| String::from_utf8(STANDARD.decode(s).unwrap()).unwrap())
    };
    match kind {
        TargetKind::ValidatingWebhookConfiguration | TargetKind::MutatingWebhookConfiguration => {
            target.data["webhooks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| decode(&w["clientConfig"]["caBundle"]))
                .collect()
        }
        TargetKind::CustomResourceDefinition => {
            vec![decode(
                &target.data["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"],
            )]
        }
        TargetKind::ApiService => vec![decode(&target.data["spec"]["caBundle"])],
    }
}

/// The target as the test wrote it: no server-owned metadata, no caBundle fields.
fn as_written(target: &DynamicObject) -> Value {
    let mut value = serde_json::to_value(target).unwrap();
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("caBundle");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    let metadata = json!({
        "name": value["metadata"]["name"],
        "annotations": value["metadata"]["annotations"],
    });
    value["metadata"] = metadata;
    value.as_object_mut().unwrap().remove("status");
    value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_four_kinds_get_the_bundle_of_their_certificate_authority_and_nothing_else_changes() {
    let setup = injection(None).await;
    let bundle = ca_pem("webhooks-ca");
    setup
        .create_authority("webhooks", "webhooks-ca-bundle")
        .await;
    setup.publish("webhooks-ca-bundle", &bundle).await;
    for kind in TargetKind::ALL {
        let name = name_for(kind, "all");
        let created = setup
            .create_target(kind, &name, &[(names::INJECT_CA_FROM, "webhooks")], None)
            .await;
        let injected = setup.wait_holds(kind, &name, &bundle).await;
        assert_eq!(
            as_written(&injected),
            as_written(&created),
            "{kind:?}: only caBundle fields changed"
        );
        let note = setup.wait_event(&name, names::EVENT_INJECTED).await;
        assert!(
            note.contains("CertificateAuthority webhooks") && note.contains("(1 certificate)"),
            "{kind:?}: {note}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overwritten_ca_bundle_is_written_back() {
    let setup = injection(None).await;
    let bundle = ca_pem("webhooks-ca");
    setup
        .create_authority("webhooks", "webhooks-ca-bundle")
        .await;
    setup.publish("webhooks-ca-bundle", &bundle).await;
    let foreign = b64(&ca_pem("someone-else"));
    for kind in TargetKind::ALL {
        let name = name_for(kind, "overwritten");
        setup
            .create_target(kind, &name, &[(names::INJECT_CA_FROM, "webhooks")], None)
            .await;
        let injected = setup.wait_holds(kind, &name, &bundle).await;

        // Someone else writes their own CA into one field.
        let overwrite = match kind {
            TargetKind::ValidatingWebhookConfiguration
            | TargetKind::MutatingWebhookConfiguration => {
                let mut webhooks = injected.data["webhooks"].clone();
                webhooks[1]["clientConfig"]["caBundle"] = json!(foreign);
                json!({ "webhooks": webhooks })
            }
            TargetKind::CustomResourceDefinition => json!({ "spec": { "conversion": {
                "webhook": { "clientConfig": { "caBundle": foreign } } } } }),
            TargetKind::ApiService => json!({ "spec": { "caBundle": foreign } }),
        };
        let written = setup
            .targets(kind)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&overwrite))
            .await
            .unwrap();
        assert!(
            bundles(kind, &written)
                .iter()
                .any(|b| b.as_deref() != Some(bundle.as_str())),
            "{kind:?}: the overwrite landed"
        );
        setup.wait_holds(kind, &name, &bundle).await;
    }
}

/// Someone able to write ConfigMaps adds a CA of theirs to a CertificateAuthority's bundle:
/// no target trusts it. Each keeps what it holds, with one Warning naming the certificate;
/// once the bundle holds the CA's own again, injection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_added_to_the_bundle_by_someone_else_is_never_injected() {
    let setup = injection(None).await;
    let own = ca_pem("webhooks-ca");
    setup
        .create_authority("webhooks", "webhooks-ca-bundle")
        .await;
    setup.publish("webhooks-ca-bundle", &own).await;
    let kind = TargetKind::ValidatingWebhookConfiguration;
    let name = name_for(kind, "tampered");
    setup
        .create_target(kind, &name, &[(names::INJECT_CA_FROM, "webhooks")], None)
        .await;
    let injected = setup.wait_holds(kind, &name, &own).await;

    let tampered = format!("{own}{}", ca_pem("intruder-ca"));
    let data = BTreeMap::from([(v1alpha1::BUNDLE_KEY.to_string(), tampered)]);
    setup.publish_bundle("webhooks-ca-bundle", data).await;
    let warning = setup.wait_event(&name, names::EVENT_REFUSED).await;
    assert!(
        warning.contains(
            "holds 1 certificate(s) that are none of the CAs its Secret \
             caretaker-system/webhooks-ca keeps"
        ) && warning.contains("subject CN=intruder-ca)"),
        "{warning}"
    );
    // A pass of the target's own (a label) changes nothing and says nothing again.
    setup
        .targets(kind)
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "labels": { "touched": "yes" } } })),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = setup.get(kind, &name).await;
    assert_eq!(bundles(kind, &after), bundles(kind, &injected));
    assert_eq!(setup.notes(&name, names::EVENT_REFUSED).await.len(), 1);

    // The CA's next CA, kept first and then published, is injected.
    let next = ca_pem("webhooks-ca-2");
    setup
        .publish("webhooks-ca-bundle", &format!("{next}{own}"))
        .await;
    setup.wait_holds(kind, &name, &format!("{next}{own}")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ca_appended_to_the_bundle_reaches_every_target_and_then_nothing_is_written() {
    let setup = injection(None).await;
    let old = ca_pem("webhooks-ca-1");
    setup
        .create_authority("webhooks", "webhooks-ca-bundle")
        .await;
    setup.publish("webhooks-ca-bundle", &old).await;
    let mut names_ = Vec::new();
    for kind in TargetKind::ALL {
        let name = name_for(kind, "appended");
        setup
            .create_target(kind, &name, &[(names::INJECT_CA_FROM, "webhooks")], None)
            .await;
        setup.wait_holds(kind, &name, &old).await;
        names_.push((kind, name));
    }

    // The CA controller keeps the old CA beside the new one.
    let both = format!("{}{old}", ca_pem("webhooks-ca-2"));
    setup.publish("webhooks-ca-bundle", &both).await;
    for (kind, name) in &names_ {
        setup.wait_holds(*kind, name, &both).await;
    }

    // At steady state nothing is written, though every source is touched: the ConfigMap
    // (same bundle, a new label), the CertificateAuthority, and the target itself.
    let mut data = BTreeMap::from([(v1alpha1::BUNDLE_KEY.to_string(), both.clone())]);
    data.insert("note".into(), "unrelated".into());
    setup.publish_bundle("webhooks-ca-bundle", data).await;
    let cas: Api<CertificateAuthority> = Api::all(setup.client.clone());
    let label = json!({ "metadata": { "labels": { "touched": "yes" } } });
    cas.patch("webhooks", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let mut touched = Vec::new();
    for (kind, name) in &names_ {
        let target = setup
            .targets(*kind)
            .patch(name, &PatchParams::default(), &Patch::Merge(&label))
            .await
            .unwrap();
        touched.push(target.metadata.resource_version.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for ((kind, name), version) in names_.iter().zip(&touched) {
        let target = setup.get(*kind, name).await;
        assert_eq!(
            target.metadata.resource_version.as_ref(),
            Some(version),
            "{kind:?} {name} was written at steady state"
        );
        assert_eq!(
            setup.notes(name, names::EVENT_INJECTED).await.len(),
            2,
            "{kind:?}: one injection per bundle"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inject_ca_from_secret_needs_the_secrets_consent() {
    let setup = injection(None).await;
    let ca = ca_pem("cert-manager-ca");
    let original = b64("original");
    setup.put_secret("demo", "webhook-ca", &[], Some(&ca)).await;
    for kind in TargetKind::ALL {
        let name = name_for(kind, "from-secret");
        setup
            .create_target(
                kind,
                &name,
                &[(names::INJECT_CA_FROM_SECRET, "demo/webhook-ca")],
                Some(&original),
            )
            .await;
        let note = setup.wait_event(&name, names::EVENT_REFUSED).await;
        assert!(
            note.starts_with(
                "Secret demo/webhook-ca does not allow direct injection: it needs the annotation \
                 cert-manager.io/allow-direct-injection: \"true\""
            ),
            "{kind:?}: {note}"
        );
        assert!(
            setup
                .bundles(kind, &name)
                .await
                .iter()
                .all(|b| b.as_deref() == Some("original")),
            "{kind:?}: left as it was"
        );
    }

    // The Secret consents: every target takes its ca.crt.
    setup
        .put_secret(
            "demo",
            "webhook-ca",
            &[(names::ALLOW_DIRECT_INJECTION, "true")],
            Some(&ca),
        )
        .await;
    for kind in TargetKind::ALL {
        setup
            .wait_holds(kind, &name_for(kind, "from-secret"), &ca)
            .await;
    }

    // A new ca.crt follows.
    let rotated = format!("{}{ca}", ca_pem("cert-manager-ca-2"));
    setup
        .put_secret(
            "demo",
            "webhook-ca",
            &[(names::ALLOW_DIRECT_INJECTION, "true")],
            Some(&rotated),
        )
        .await;
    for kind in TargetKind::ALL {
        setup
            .wait_holds(kind, &name_for(kind, "from-secret"), &rotated)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_source_leaves_the_target_untouched_with_one_warning_naming_it() {
    let setup = injection(None).await;
    let original = b64("original");
    let kind = TargetKind::ValidatingWebhookConfiguration;
    let untouched = |setup: &Setup, name: &'static str| {
        let setup_targets = setup.targets(kind);
        async move {
            let target = setup_targets.get(name).await.unwrap();
            assert!(
                bundles(kind, &target)
                    .iter()
                    .all(|b| b.as_deref() == Some("original")),
                "{name}: never an empty or partial caBundle"
            );
        }
    };
    setup
        .create_target(
            kind,
            "missing-ca",
            &[(names::INJECT_CA_FROM, "webhooks")],
            Some(&original),
        )
        .await;
    let note = setup
        .wait_event("missing-ca", names::EVENT_SOURCE_MISSING)
        .await;
    assert_eq!(
        note,
        "CertificateAuthority webhooks not found; nothing injected, caBundle left as it is"
    );
    untouched(&setup, "missing-ca").await;

    // A pass over the same problem (the target relabelled) publishes nothing more.
    let label = json!({ "metadata": { "labels": { "touched": "yes" } } });
    setup
        .targets(kind)
        .patch("missing-ca", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        setup
            .notes("missing-ca", names::EVENT_SOURCE_MISSING)
            .await
            .len(),
        1,
        "the same warning once"
    );

    // The CA appears, without its ConfigMap; then the ConfigMap, without the key.
    setup
        .create_authority("webhooks", "webhooks-ca-bundle")
        .await;
    eventually("a warning naming the ConfigMap", 20, || async {
        setup
            .notes("missing-ca", names::EVENT_SOURCE_MISSING)
            .await
            .into_iter()
            .find(|n| {
                n.starts_with(
                    "ConfigMap caretaker-system/webhooks-ca-bundle, the trust bundle of \
                     CertificateAuthority webhooks, not found",
                )
            })
    })
    .await;
    untouched(&setup, "missing-ca").await;
    let other_key = BTreeMap::from([("ca.crt".to_string(), ca_pem("x"))]);
    setup.publish_bundle("webhooks-ca-bundle", other_key).await;
    eventually("a warning naming the key", 20, || async {
        setup
            .notes("missing-ca", names::EVENT_SOURCE_MISSING)
            .await
            .into_iter()
            .find(|n| n.contains("has no ca-bundle.crt or an empty one"))
    })
    .await;
    untouched(&setup, "missing-ca").await;

    // The bundle is published: injected.
    let bundle = ca_pem("webhooks-ca");
    setup.publish("webhooks-ca-bundle", &bundle).await;
    setup.wait_holds(kind, "missing-ca", &bundle).await;

    // A Secret that is missing, or lacks ca.crt, is named too.
    setup
        .create_target(
            kind,
            "missing-secret",
            &[(names::INJECT_CA_FROM_SECRET, "demo/absent")],
            Some(&original),
        )
        .await;
    let note = setup
        .wait_event("missing-secret", names::EVENT_SOURCE_MISSING)
        .await;
    assert!(note.starts_with("Secret demo/absent not found"), "{note}");
    setup
        .put_secret(
            "demo",
            "absent",
            &[(names::ALLOW_DIRECT_INJECTION, "true")],
            None,
        )
        .await;
    eventually("a warning naming ca.crt", 20, || async {
        setup
            .notes("missing-secret", names::EVENT_SOURCE_MISSING)
            .await
            .into_iter()
            .find(|n| n.starts_with("Secret demo/absent has no ca.crt or an empty one"))
    })
    .await;
    untouched(&setup, "missing-secret").await;
}

/// Attack: whoever may annotate a webhook configuration names a Secret they cannot read, in
/// another namespace, hoping the API server will trust its CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_in_another_namespace_without_consent_is_never_injected() {
    let setup = injection(None).await;
    let admin_ca = ca_pem("kube-system-admin-ca");
    setup
        .put_secret("kube-system", "admin-ca", &[], Some(&admin_ca))
        .await;
    let original = b64("original");
    let kind = TargetKind::MutatingWebhookConfiguration;
    setup
        .create_target(
            kind,
            "attacker",
            &[(names::INJECT_CA_FROM_SECRET, "kube-system/admin-ca")],
            Some(&original),
        )
        .await;
    let note = setup.wait_event("attacker", names::EVENT_REFUSED).await;
    assert!(
        note.contains("Secret kube-system/admin-ca does not allow direct injection"),
        "{note}"
    );
    // The Secret changing (still without consent) changes nothing.
    setup
        .put_secret(
            "kube-system",
            "admin-ca",
            &[(names::ALLOW_DIRECT_INJECTION, "false")],
            Some(&admin_ca),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let held = setup.bundles(kind, "attacker").await;
    assert!(
        held.iter().all(|b| b.as_deref() == Some("original")),
        "{held:?}"
    );
    assert!(
        setup
            .notes("attacker", names::EVENT_INJECTED)
            .await
            .is_empty()
    );
}

/// Attack: an operator that watches one namespace reads no Secret outside it, even one that
/// consents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_watching_one_namespace_injects_nothing_from_outside_it() {
    let setup = injection(Some("demo")).await;
    let ca = ca_pem("kube-system-ca");
    let consent = [(names::ALLOW_DIRECT_INJECTION, "true")];
    setup
        .put_secret("kube-system", "admin-ca", &consent, Some(&ca))
        .await;
    setup
        .put_secret("demo", "webhook-ca", &consent, Some(&ca))
        .await;
    let original = b64("original");
    let kind = TargetKind::ValidatingWebhookConfiguration;
    setup
        .create_target(
            kind,
            "outside",
            &[(names::INJECT_CA_FROM_SECRET, "kube-system/admin-ca")],
            Some(&original),
        )
        .await;
    setup
        .create_target(
            kind,
            "inside",
            &[(names::INJECT_CA_FROM_SECRET, "demo/webhook-ca")],
            Some(&original),
        )
        .await;
    setup.wait_holds(kind, "inside", &ca).await;
    let note = setup.wait_event("outside", names::EVENT_REFUSED).await;
    assert!(
        note.starts_with(
            "Secret kube-system/admin-ca is in namespace kube-system, outside namespace demo"
        ),
        "{note}"
    );
    let held = setup.bundles(kind, "outside").await;
    assert!(held.iter().all(|b| b.as_deref() == Some("original")));
}

/// Attack: annotation values made to hurt: 200 KB, control characters, a right-to-left
/// override, a path. Each is refused with one bounded, escaped Warning, the target is left as
/// it was, and the controller goes on serving the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_or_garbage_annotation_values_are_refused_cleanly() {
    let setup = injection(None).await;
    let bundle = ca_pem("webhooks-ca");
    setup
        .create_authority("webhooks", "webhooks-ca-bundle")
        .await;
    setup.publish("webhooks-ca-bundle", &bundle).await;
    let original = b64("original");
    let kind = TargetKind::ValidatingWebhookConfiguration;
    let huge = "w".repeat(200_000);
    let cases = [
        ("huge-name", names::INJECT_CA_FROM, huge.as_str()),
        ("huge-secret", names::INJECT_CA_FROM_SECRET, huge.as_str()),
        ("escape", names::INJECT_CA_FROM, "web\u{1b}[2J\u{202e}hooks"),
        (
            "path",
            names::INJECT_CA_FROM_SECRET,
            "demo/../../etc/passwd",
        ),
        (
            "namespaced-ca",
            names::INJECT_CA_FROM,
            "caretaker-system/webhooks",
        ),
    ];
    for (name, key, value) in cases {
        setup
            .create_target(kind, name, &[(key, value)], Some(&original))
            .await;
    }
    for (name, key, _) in cases {
        let note = setup.wait_event(name, names::EVENT_REFUSED).await;
        assert!(note.starts_with(key), "{name}: {note}");
        assert!(note.len() < 600, "{name}: {} bytes", note.len());
        assert!(
            note.chars().all(|c| c.is_ascii() && !c.is_control()),
            "{name}: {note:?}"
        );
        let held = setup.bundles(kind, name).await;
        assert!(
            held.iter().all(|b| b.as_deref() == Some("original")),
            "{name}"
        );
    }
    assert!(
        setup
            .wait_event("huge-name", names::EVENT_REFUSED)
            .await
            .contains("(200000 bytes)")
    );
    // The controller still serves a well-formed target.
    setup
        .create_target(
            kind,
            "well-formed",
            &[(names::INJECT_CA_FROM, "webhooks")],
            None,
        )
        .await;
    setup.wait_holds(kind, "well-formed", &bundle).await;
}

/// The whole operator, as `caretaker operator` runs it, in a fleet that uses only the Cluster
/// API features: no caretaker CRDs. It says so once, serves `inject-ca-from-secret`, tells
/// targets naming a CertificateAuthority that the CRD is missing, and serves them by itself
/// once the CRD, the CA and its bundle appear.
#[tokio::test(flavor = "current_thread")]
async fn without_the_certificate_authority_crd_the_operator_idles_then_starts_by_itself() {
    let (captured, _logs) = Captured::on_this_thread("caretaker_operator=debug");

    let server = TestServer::start().await;
    let client = server.client();
    caretaker_testkit::capi_objects::install_upstream_crds(&client)
        .await
        .unwrap();
    for namespace in ["caretaker-system", "demo"] {
        create_namespace(&client, namespace).await;
    }
    let ctx = Context::new(client.clone(), Settings::default());
    let setup = Setup {
        _server: server,
        client: client.clone(),
        controllers: tokio::spawn(controllers::run(ctx, None)),
    };

    let ca = ca_pem("cert-manager-ca");
    setup
        .put_secret(
            "demo",
            "webhook-ca",
            &[(names::ALLOW_DIRECT_INJECTION, "true")],
            Some(&ca),
        )
        .await;
    let kind = TargetKind::ApiService;
    setup
        .create_target(
            kind,
            "v1.from-secret.injection.test",
            &[(names::INJECT_CA_FROM_SECRET, "demo/webhook-ca")],
            None,
        )
        .await;
    setup
        .wait_holds(kind, "v1.from-secret.injection.test", &ca)
        .await;

    let name = "v1.from-authority.injection.test";
    setup
        .create_target(kind, name, &[(names::INJECT_CA_FROM, "webhooks")], None)
        .await;
    let note = setup.wait_event(name, names::EVENT_SOURCE_MISSING).await;
    assert_eq!(
        note,
        "CertificateAuthority webhooks not found (its CRD, certificateauthorities.caretaker.dev, \
         is not installed); nothing injected, caBundle left as it is"
    );

    // The CRD and its CA appear, the CA's controller makes its Secret and bundle; nothing
    // touches the target, yet it is served.
    install_caretaker_crds(&client).await;
    setup
        .create_authority("webhooks", "webhooks-ca-bundle")
        .await;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), "caretaker-system");
    // Whatever the bundle holds by then (another controller may publish its own CA in it).
    eventually("the target holds the CA's bundle", 20, || async {
        let published = configmaps.get("webhooks-ca-bundle").await.ok()?.data?;
        let published = published.get(v1alpha1::BUNDLE_KEY)?.clone();
        let held = setup.bundles(kind, name).await;
        (held == [Some(published)]).then_some(())
    })
    .await;

    // The CA's controller makes its bundle, whose change may be injected (the CA read fresh)
    // before injection's CRD watch has said it saw the CRD.
    eventually("injection says the CRD is installed", 20, || async {
        let logs = captured.text();
        logs.contains("the CertificateAuthority CRD is installed")
            .then_some(())
    })
    .await;
    let logs = captured.text();
    assert_eq!(
        logs.matches("the CertificateAuthority CRD is not installed")
            .count(),
        1,
        "said once:\n{logs}"
    );
    assert_eq!(
        logs.matches("the CertificateAuthority CRD is installed")
            .count(),
        1
    );
    assert!(
        !logs.contains("CA-bundle injection: cannot watch"),
        "no watch failed:\n{logs}"
    );
}
