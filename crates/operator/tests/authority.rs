//! The CertificateAuthority and IssuedCertificate controllers against the embedded API server
//! over real HTTP, with real certificates: first start, issuance (checked with `openssl
//! verify`), every trigger of a new certificate through the API, a CA rotation that is trusted
//! by an injection point before it signs anything, a tampered and a deleted CA Secret, an
//! operator restarted in the middle of a rotation, two CAs side by side, a steady state that
//! writes nothing, no private key outside Secrets, bad specs and a missing issuer, and an
//! operator started before caretaker's CRDs exist.
//!
//! Most tests run the two controllers alone (`authority::controller::run`) and play the
//! injection point's part by hand, so that they decide when it takes up a bundle; the steady
//! state runs CA-bundle injection too.
//!
//! Breaks of the glue each was seen to catch: injection points ignored (`injected` always
//! `None`: a leaf signed before the webhook configuration held its CA) and an empty `in_use`
//! (the old CA dropped while a certificate still used it), by the forced rotation; the issuer
//! cache never invalidated, by the forced rotation and the deleted CA Secret; the hostnames
//! annotation not read (a new certificate on every pass), by the triggers and the steady
//! state; `wake_at` ignored, by the certificate falling due; the last good CA not kept, by
//! the tampered Secret; a Warning on every pass, by the invalid spec; no wake-up when an issuer
//! appears, by the missing issuer; a CRD created later not noticed, by the start without
//! CRDs; Secrets created without their type, by the first start; no check of shared Secrets,
//! by the shared objects.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use caretaker_api::names;
use caretaker_api::v1alpha1::{CertificateAuthority, Condition, IssuedCertificate};
use caretaker_apiserver::{ApiServer, TestServer};
use caretaker_operator::authority::Certificate;
use caretaker_operator::authority::controller as authority_controller;
use caretaker_operator::injection::TargetKind;
use caretaker_operator::injection::controller as ca_injection;
use caretaker_operator::metrics::Metrics;
use caretaker_operator::{Context, Settings};
use caretaker_pki::{KeyAlgorithm, PrivateKey};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use common::authorities::{create_namespace, eventually, install_caretaker_crds};
use common::logs::Captured;
use common::openmetrics;

const SYSTEM: &str = "caretaker-system";
const DEMO: &str = "demo";

/// The embedded API server with caretaker's CRDs, and the controllers running.
struct Setup {
    _server: ApiServer,
    client: kube::Client,
    controllers: Option<tokio::task::JoinHandle<()>>,
    injection: Option<tokio::task::JoinHandle<()>>,
    /// The metrics of the controllers last started.
    metrics: Arc<Metrics>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop();
        if let Some(injection) = &self.injection {
            injection.abort();
        }
    }
}

fn settings() -> Settings {
    Settings {
        retry_base: Duration::from_millis(200),
        ..Settings::default()
    }
}

/// A server with caretaker's CRDs and the namespaces the tests use, and the two controllers.
async fn setup() -> Setup {
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    for namespace in [SYSTEM, DEMO] {
        create_namespace(&client, namespace).await;
    }
    let mut setup = Setup {
        _server: server,
        client,
        controllers: None,
        injection: None,
        metrics: Metrics::new(),
    };
    setup.start();
    setup
}

/// `base` with the fields of `changes` set (`null` removes one).
fn merged(mut base: Value, changes: Value) -> Value {
    for (key, change) in changes.as_object().unwrap() {
        if change.is_null() {
            base.as_object_mut().unwrap().remove(key);
        } else {
            base[key] = change.clone();
        }
    }
    base
}

impl Setup {
    /// Starts the two controllers (again), as a new process would: nothing in memory.
    fn start(&mut self) {
        let ctx = Context::new(self.client.clone(), settings());
        self.metrics = ctx.metrics.clone();
        self.controllers = Some(tokio::spawn(authority_controller::run(ctx, None)));
    }

    fn stop(&mut self) {
        if let Some(controllers) = self.controllers.take() {
            controllers.abort();
        }
    }

    /// Runs CA-bundle injection too.
    fn inject(&mut self) {
        let ctx = Context::new(self.client.clone(), settings());
        self.injection = Some(tokio::spawn(ca_injection::run(ctx, None)));
    }

    fn authorities(&self) -> Api<CertificateAuthority> {
        Api::all(self.client.clone())
    }

    fn certificates(&self) -> Api<IssuedCertificate> {
        Api::namespaced(self.client.clone(), DEMO)
    }

    fn secrets(&self, namespace: &str) -> Api<Secret> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn config_maps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), SYSTEM)
    }

    fn targets(&self, kind: TargetKind) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &kind.api_resource())
    }

    /// Creates CertificateAuthority `name`: CN `<name>-ca`, Secret `<name>-ca` and bundle
    /// `<name>-ca-bundle` in caretaker-system, with `changes` to the spec.
    async fn create_ca(&self, name: &str, changes: Value) {
        let spec = merged(
            json!({
                "commonName": format!("{name}-ca"),
                "secret": { "name": format!("{name}-ca"), "namespace": SYSTEM },
                "bundle": { "name": format!("{name}-ca-bundle"), "namespace": SYSTEM },
            }),
            changes,
        );
        let ca = serde_json::from_value(json!({
            "apiVersion": "caretaker.dev/v1alpha1",
            "kind": "CertificateAuthority",
            "metadata": { "name": name },
            "spec": spec,
        }))
        .unwrap();
        self.authorities()
            .create(&PostParams::default(), &ca)
            .await
            .unwrap();
    }

    /// Creates IssuedCertificate `name` in demo, issued by `issuer`, Secret `<name>-tls`,
    /// serving `<name>.demo.svc`, with `changes` to the spec.
    async fn create_certificate(&self, name: &str, issuer: &str, changes: Value) {
        let spec = merged(
            json!({
                "issuerRef": { "name": issuer },
                "secretName": format!("{name}-tls"),
                "commonName": format!("{name}.demo.svc"),
                "dnsNames": [format!("{name}.demo.svc")],
                "usages": ["server"],
            }),
            changes,
        );
        let certificate = serde_json::from_value(json!({
            "apiVersion": "caretaker.dev/v1alpha1",
            "kind": "IssuedCertificate",
            "metadata": { "name": name, "namespace": DEMO },
            "spec": spec,
        }))
        .unwrap();
        self.certificates()
            .create(&PostParams::default(), &certificate)
            .await
            .unwrap();
    }

    async fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.secrets(namespace).get_opt(name).await.unwrap()
    }

    /// Waits until the Secret exists and `check` holds of it.
    async fn wait_secret(
        &self,
        namespace: &str,
        name: &str,
        what: &str,
        check: impl Fn(&Secret) -> bool,
    ) -> Secret {
        eventually(what, 20, || async {
            self.secret(namespace, name).await.filter(|s| check(s))
        })
        .await
    }

    async fn bundle(&self, name: &str) -> Option<ConfigMap> {
        self.config_maps().get_opt(name).await.unwrap()
    }

    async fn authority(&self, name: &str) -> CertificateAuthority {
        self.authorities().get(name).await.unwrap()
    }

    async fn certificate(&self, name: &str) -> IssuedCertificate {
        self.certificates().get(name).await.unwrap()
    }

    /// Waits until the CertificateAuthority's condition `type_` has `status` and `reason`, for
    /// its current generation.
    async fn wait_ca_condition(&self, name: &str, type_: &str, status: &str, reason: &str) {
        eventually(
            &format!("{name} {type_}={status} ({reason})"),
            20,
            || async {
                let ca = self.authority(name).await;
                let generation = ca.metadata.generation;
                let conditions = ca
                    .status
                    .map(|s| s.certificate.conditions)
                    .unwrap_or_default();
                has(&conditions, generation, type_, status, reason).then_some(())
            },
        )
        .await
    }

    /// Waits until the IssuedCertificate's condition `type_` has `status` and `reason`, for its
    /// current generation.
    async fn wait_certificate_condition(
        &self,
        name: &str,
        type_: &str,
        status: &str,
        reason: &str,
    ) {
        eventually(
            &format!("{name} {type_}={status} ({reason})"),
            20,
            || async {
                let certificate = self.certificate(name).await;
                let generation = certificate.metadata.generation;
                let conditions = certificate.status.map(|s| s.conditions).unwrap_or_default();
                has(&conditions, generation, type_, status, reason).then_some(())
            },
        )
        .await
    }

    /// Waits until IssuedCertificate `name` is refused with `reason` (Degraded, a Warning
    /// whose note holds `part`), and checks that its Secret `<name>-tls` was not written.
    async fn wait_certificate_refused(&self, name: &str, reason: &str, part: &str) {
        self.wait_certificate_condition(name, "Degraded", "True", reason)
            .await;
        self.wait_note(DEMO, name, reason, part).await;
        assert!(self.secret(DEMO, &format!("{name}-tls")).await.is_none());
    }

    /// The events about the object named `name` in `namespace` (cluster-scoped objects' are in
    /// default).
    async fn events(&self, namespace: &str, name: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .collect()
    }

    /// The messages of the events with `reason` about `name`.
    async fn notes(&self, namespace: &str, name: &str, reason: &str) -> Vec<String> {
        self.events(namespace, name)
            .await
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .map(|e| e.message.unwrap_or_default())
            .collect()
    }

    /// Waits for an event with `reason` about `name` whose message contains `part`.
    async fn wait_note(&self, namespace: &str, name: &str, reason: &str, part: &str) -> String {
        eventually(
            &format!("a {reason} event about {name} saying {part:?}"),
            20,
            || async {
                self.notes(namespace, name, reason)
                    .await
                    .into_iter()
                    .find(|note| note.contains(part))
            },
        )
        .await
    }

    /// Merge-patches a Secret.
    async fn patch_secret(&self, namespace: &str, name: &str, patch: Value) -> Secret {
        self.secrets(namespace)
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap()
    }

    /// A ValidatingWebhookConfiguration with two webhooks that injects from `authority`.
    async fn create_webhook_configuration(&self, name: &str, authority: &str) {
        let webhook = |hook: &str| {
            json!({
                "name": hook,
                "clientConfig": { "url": format!("https://127.0.0.1:1/{hook}") },
                "rules": [{ "apiGroups": ["example.com"], "apiVersions": ["v1"],
                            "operations": ["CREATE"], "resources": ["gadgets"] }],
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Ignore",
            })
        };
        let body = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": { "name": name,
                          "annotations": { names::injection::INJECT_CA_FROM: authority } },
            "webhooks": [webhook("a.authority.test"), webhook("b.authority.test")],
        });
        self.targets(TargetKind::ValidatingWebhookConfiguration)
            .create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap();
    }

    /// Plays the injector: puts `bundle` in every caBundle of the webhook configuration.
    /// Returns the resourceVersion of the write.
    async fn inject_by_hand(&self, name: &str, bundle: &str) -> u64 {
        let api = self.targets(TargetKind::ValidatingWebhookConfiguration);
        let mut target = api.get(name).await.unwrap();
        for webhook in target.data["webhooks"].as_array_mut().unwrap() {
            webhook["clientConfig"]["caBundle"] = json!(STANDARD.encode(bundle));
        }
        let written = api
            .replace(name, &PostParams::default(), &target)
            .await
            .unwrap();
        version(&written.metadata)
    }

    /// The caBundles of a webhook configuration, decoded.
    async fn injected(&self, kind: TargetKind, name: &str) -> Vec<Option<String>> {
        let target = self.targets(kind).get(name).await.unwrap();
        target.data["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                w["clientConfig"]["caBundle"]
                    .as_str()
                    .map(|b| String::from_utf8(STANDARD.decode(b).unwrap()).unwrap())
            })
            .collect()
    }
}

/// Whether `conditions` hold `type_` with `status` and `reason`, observed at `generation`: a
/// status is written after the Secret, so the one of the spec before may still be there.
fn has(
    conditions: &[Condition],
    generation: Option<i64>,
    type_: &str,
    status: &str,
    reason: &str,
) -> bool {
    conditions.iter().any(|c| {
        c.type_ == type_
            && c.status == status
            && c.reason == reason
            && c.observed_generation == generation
    })
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {conditions:?}"))
}

/// A resourceVersion as a number (the embedded API server counts every write).
fn version(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version.as_deref().unwrap().parse().unwrap()
}

fn text(secret: &Secret, key: &str) -> String {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| String::from_utf8(v.0.clone()).unwrap())
        .unwrap_or_default()
}

fn annotation<'a>(meta: &'a kube::api::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The certificates of a PEM text (none when it is blank).
fn certificates(pem: &str) -> Vec<Certificate> {
    if pem.trim().is_empty() {
        return Vec::new();
    }
    Certificate::parse_pem(pem).unwrap()
}

/// The one certificate of `tls.crt`.
fn leaf(secret: &Secret) -> Certificate {
    let mut all = certificates(&text(secret, "tls.crt"));
    assert_eq!(all.len(), 1, "tls.crt holds the leaf alone");
    all.remove(0)
}

fn fingerprints(pem: &str) -> Vec<String> {
    certificates(pem)
        .iter()
        .map(|c| c.fingerprint().to_string())
        .collect()
}

fn signed_by(certificate: &Certificate, ca: &Certificate) -> bool {
    caretaker_pki::is_issued_by(certificate.der(), ca.der()).unwrap()
}

fn bundle_text(config_map: &ConfigMap) -> String {
    config_map.data.as_ref().unwrap()["ca-bundle.crt"].clone()
}

/// `openssl verify -purpose PURPOSE` of `leaf_pem` against `ca_pem`: its output.
fn openssl_verify(ca_pem: &str, leaf_pem: &str, purpose: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let (ca, leaf) = (dir.path().join("ca.pem"), dir.path().join("leaf.pem"));
    std::fs::write(&ca, ca_pem).unwrap();
    std::fs::write(&leaf, leaf_pem).unwrap();
    let out = Command::new("openssl")
        .args(["verify", "-purpose", purpose, "-CAfile"])
        .arg(&ca)
        .arg(&leaf)
        .output()
        .expect("openssl on PATH");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), said)
}

/// Waits until CertificateAuthority `name` is Ready and its certificate `certificate` holds
/// a leaf; returns the CA Secret and the certificate's Secret.
async fn settled(setup: &Setup, ca: &str, certificate: &str) -> (Secret, Secret) {
    setup
        .wait_ca_condition(ca, "Ready", "True", names::REASON_SIGNING)
        .await;
    setup
        .wait_certificate_condition(certificate, "Ready", "True", names::REASON_ISSUED)
        .await;
    let ca_secret = setup.secret(SYSTEM, &format!("{ca}-ca")).await.unwrap();
    let leaf_secret = setup
        .secret(DEMO, &format!("{certificate}-tls"))
        .await
        .unwrap();
    (ca_secret, leaf_secret)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_start_stores_the_ca_publishes_its_bundle_and_reports_ready() {
    let setup = setup().await;
    setup.create_ca("webhooks", json!({})).await;
    setup
        .wait_ca_condition("webhooks", "Ready", "True", names::REASON_SIGNING)
        .await;

    let secret = setup.secret(SYSTEM, "webhooks-ca").await.unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.as_ref().unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["tls.crt", "tls.key"],
        "no next or previous CA yet"
    );
    let [ca] = certificates(&text(&secret, "tls.crt")).try_into().unwrap();
    assert!(ca.info().is_ca);
    assert_eq!(ca.common_name(), "webhooks-ca");
    let key = PrivateKey::from_pem(&text(&secret, "tls.key")).unwrap();
    assert!(caretaker_pki::key_matches_certificate(&key, ca.der()).unwrap());
    assert_eq!(key.algorithm(), KeyAlgorithm::EcdsaP256);
    let meta = &secret.metadata;
    let not_after = caretaker_operator::timestamp::format_time(ca.not_after());
    assert_eq!(
        annotation(meta, names::CERTIFICATE_NOT_AFTER),
        Some(not_after.as_str())
    );
    assert_eq!(
        annotation(meta, names::CERTIFICATE_NOT_BEFORE),
        Some(caretaker_operator::timestamp::format_time(ca.not_before()).as_str())
    );
    assert_eq!(
        annotation(meta, names::CERTIFICATE_ISSUER),
        Some("webhooks-ca")
    );
    assert_eq!(annotation(meta, names::CERTIFICATE_HOSTNAMES), None);

    let bundle = setup.bundle("webhooks-ca-bundle").await.unwrap();
    assert_eq!(bundle_text(&bundle), text(&secret, "tls.crt"));
    assert_eq!(
        annotation(&bundle.metadata, names::CERTIFICATE_ISSUER),
        Some("webhooks-ca")
    );

    let authority = setup.authority("webhooks").await;
    let status = authority.status.unwrap();
    assert_eq!(
        status.certificate.serial_number.as_deref(),
        Some(ca.serial())
    );
    assert_eq!(status.certificate.not_after, Some(not_after));
    assert!(status.certificate.not_before.is_some() && status.certificate.next_rotation.is_some());
    assert_eq!(status.trusted_since, None);
    assert!(status.previous_cas.is_empty());
    assert_eq!(status.certificate.observed_generation, Some(1));
    let degraded = condition(&status.certificate.conditions, "Degraded");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("False", "AsExpected")
    );
    assert_eq!(
        condition(&status.certificate.conditions, "Ready").observed_generation,
        Some(1)
    );

    let made = setup
        .wait_note(
            "default",
            "webhooks",
            names::EVENT_SIGNER_UPDATE_REQUIRED,
            "secret doesn't exist",
        )
        .await;
    assert!(made.contains("signs at once"), "{made}");
    setup
        .wait_note(
            "default",
            "webhooks",
            names::EVENT_CA_BUNDLE_UPDATE_REQUIRED,
            "configmap doesn't exist",
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_issued_certificate_verifies_against_its_ca_with_its_names_usages_and_annotations() {
    let setup = setup().await;
    setup.create_ca("webhooks", json!({})).await;
    setup
        .create_certificate(
            "webhook-server",
            "webhooks",
            json!({
                "commonName": "webhook.demo.svc",
                "dnsNames": ["webhook.demo.svc", "webhook.demo.svc.cluster.local"],
                "ipAddresses": ["127.0.0.1"],
            }),
        )
        .await;
    setup
        .create_certificate(
            "client",
            "webhooks",
            json!({ "usages": ["client"], "dnsNames": null, "keyAlgorithm": "Ed25519" }),
        )
        .await;
    let (ca_secret, secret) = settled(&setup, "webhooks", "webhook-server").await;

    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    assert_eq!(
        secret.metadata.owner_references, None,
        "deleting the IssuedCertificate keeps its Secret"
    );
    let certificate = leaf(&secret);
    let bundle = bundle_text(&setup.bundle("webhooks-ca-bundle").await.unwrap());
    assert_eq!(text(&secret, "ca.crt"), bundle);
    let (ok, said) = openssl_verify(
        &text(&secret, "ca.crt"),
        &text(&secret, "tls.crt"),
        "sslserver",
    );
    assert!(ok, "openssl verify: {said}");
    assert!(said.contains(": OK"), "{said}");
    let ca = leaf_or_ca(&ca_secret);
    assert!(signed_by(&certificate, &ca));
    let key = PrivateKey::from_pem(&text(&secret, "tls.key")).unwrap();
    assert!(caretaker_pki::key_matches_certificate(&key, certificate.der()).unwrap());

    let info = certificate.info();
    assert_eq!(certificate.common_name(), "webhook.demo.svc");
    assert_eq!(
        info.dns_names,
        ["webhook.demo.svc", "webhook.demo.svc.cluster.local"]
    );
    assert_eq!(
        info.ip_addresses,
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    assert_eq!(info.extended_key_usages, ["serverAuth"]);
    assert!(!info.is_ca);
    let meta = &secret.metadata;
    assert_eq!(
        annotation(meta, names::CERTIFICATE_ISSUER),
        Some("webhooks-ca")
    );
    assert_eq!(
        annotation(meta, names::CERTIFICATE_HOSTNAMES),
        Some("127.0.0.1,webhook.demo.svc,webhook.demo.svc.cluster.local")
    );
    assert_eq!(
        annotation(meta, names::CERTIFICATE_NOT_AFTER),
        Some(caretaker_operator::timestamp::format_time(certificate.not_after()).as_str())
    );
    assert_eq!(
        annotation(meta, names::CERTIFICATE_NOT_BEFORE),
        Some(caretaker_operator::timestamp::format_time(certificate.not_before()).as_str())
    );

    let status = setup.certificate("webhook-server").await.status.unwrap();
    assert_eq!(status.serial_number.as_deref(), Some(certificate.serial()));
    assert!(status.next_rotation.is_some());
    assert_eq!(status.observed_generation, Some(1));
    setup
        .wait_note(
            DEMO,
            "webhook-server",
            names::EVENT_TARGET_UPDATE_REQUIRED,
            "secret doesn't exist",
        )
        .await;

    // A client certificate: clientAuth, no hostnames annotation, the key algorithm asked.
    setup
        .wait_certificate_condition("client", "Ready", "True", names::REASON_ISSUED)
        .await;
    let client = setup.secret(DEMO, "client-tls").await.unwrap();
    let client_leaf = leaf(&client);
    assert_eq!(client_leaf.info().extended_key_usages, ["clientAuth"]);
    assert_eq!(
        annotation(&client.metadata, names::CERTIFICATE_HOSTNAMES),
        None
    );
    assert_eq!(
        PrivateKey::from_pem(&text(&client, "tls.key"))
            .unwrap()
            .algorithm(),
        KeyAlgorithm::Ed25519
    );
    let (ok, said) = openssl_verify(
        &text(&client, "ca.crt"),
        &text(&client, "tls.crt"),
        "sslclient",
    );
    assert!(ok, "openssl verify: {said}");
}

/// The CA certificate of a CA Secret (`tls.crt`).
/// Two certificates of a CA with `trust_propagation`, settled; a forced rotation; every version
/// of their Secrets, in watch order, until both hold a leaf from the new CA. And the old CA.
async fn versions_through_a_rotation(trust_propagation: &str) -> (Vec<Secret>, Certificate) {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let setup = setup().await;
    setup
        .create_ca("webhooks", json!({ "trustPropagation": trust_propagation }))
        .await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    setup.create_certificate("api", "webhooks", json!({})).await;
    let (ca_secret, _) = settled(&setup, "webhooks", "web").await;
    setup
        .wait_certificate_condition("api", "Ready", "True", names::REASON_ISSUED)
        .await;
    let old_ca = leaf_or_ca(&ca_secret);

    let versions: Arc<Mutex<Vec<Secret>>> = Arc::default();
    let recorded = versions.clone();
    let recorder = tokio::spawn(
        watcher(setup.secrets(DEMO), watcher::Config::default()).for_each(move |event| {
            if let Ok(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) = event {
                recorded.lock().unwrap().push(s);
            }
            async {}
        }),
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } }),
        )
        .await;
    for name in ["web-tls", "api-tls"] {
        setup
            .wait_secret(DEMO, name, "a leaf from the new CA", |s| {
                !signed_by(&leaf(s), &old_ca)
            })
            .await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    recorder.abort();
    let versions = versions.lock().unwrap().clone();
    (versions, old_ca)
}

/// With time to propagate, a forced rotation: every version of the certificate Secrets,
/// watched in order, shows no leaf from the new CA while another Ready certificate's `ca.crt`
/// does not trust it yet (clients verify with `ca.crt`). The race this guards against is
/// timing-dependent; the unit test
/// `a_next_ca_is_trusted_only_once_every_ready_certificates_ca_crt_holds_it` pins the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ca_signs_only_once_every_certificates_ca_crt_trusts_it() {
    let (versions, old_ca) = versions_through_a_rotation("1s").await;
    let mut latest: BTreeMap<String, Secret> = BTreeMap::new();
    for secret in &versions {
        latest.insert(secret.metadata.name.clone().unwrap(), secret.clone());
        for (name, signed) in &latest {
            let leaf = leaf(signed);
            if signed_by(&leaf, &old_ca) {
                continue;
            }
            let issuer = certificates(&text(signed, "ca.crt"))
                .into_iter()
                .find(|ca| signed_by(&leaf, ca))
                .unwrap();
            for (other, held) in &latest {
                assert!(
                    fingerprints(&text(held, "ca.crt")).contains(&issuer.fingerprint().to_string()),
                    "{name} holds a leaf from the new CA while {other}'s ca.crt does not trust it"
                );
            }
        }
    }
}

/// With `trustPropagation: 0s` nothing waits for `ca.crt`: a rotation writes each certificate
/// Secret once up to its new leaf, whose `ca.crt` trusts the new CA and the old one (which
/// still signs the other certificate's leaf, or did a moment ago).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_propagation_time_a_rotation_writes_each_secret_once_up_to_its_new_leaf() {
    let (versions, old_ca) = versions_through_a_rotation("0s").await;
    for name in ["web-tls", "api-tls"] {
        let mine: Vec<&Secret> = versions
            .iter()
            .filter(|s| s.metadata.name.as_deref() == Some(name))
            .collect();
        let first_new = mine
            .iter()
            .position(|s| !signed_by(&leaf(s), &old_ca))
            .expect("a new leaf");
        // Before it: the version as settled, unchanged (a watch may repeat it on a relist).
        let before: BTreeSet<&str> = mine[..first_new]
            .iter()
            .filter_map(|s| s.metadata.resource_version.as_deref())
            .collect();
        assert_eq!(before.len(), 1, "{name} was written before its new leaf");
        let renewed = mine[first_new];
        let trusted = fingerprints(&text(renewed, "ca.crt"));
        let new_ca = certificates(&text(renewed, "ca.crt"))
            .into_iter()
            .find(|ca| signed_by(&leaf(renewed), ca))
            .expect("ca.crt trusts the new leaf's CA");
        assert!(trusted.contains(&old_ca.fingerprint().to_string()));
        assert!(trusted.contains(&new_ca.fingerprint().to_string()));
    }
}

fn leaf_or_ca(secret: &Secret) -> Certificate {
    certificates(&text(secret, "tls.crt")).remove(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_trigger_issues_a_new_certificate_through_the_api() {
    let setup = setup().await;
    setup.create_ca("webhooks", json!({})).await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (_, first) = settled(&setup, "webhooks", "web").await;
    let reissued = |before: &Secret| {
        let serial = leaf(before).serial().to_string();
        move |s: &Secret| {
            certificates(&text(s, "tls.crt"))
                .first()
                .is_some_and(|c| c.serial() != serial)
                && s.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(names::CERTIFICATE_NOT_AFTER))
        }
    };

    // library-go's forced rotation: remove certificate-not-after.
    setup
        .patch_secret(
            DEMO,
            "web-tls",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } }),
        )
        .await;
    let second = setup
        .wait_secret(DEMO, "web-tls", "a new certificate", reissued(&first))
        .await;
    setup
        .wait_note(
            DEMO,
            "web",
            names::EVENT_TARGET_UPDATE_REQUIRED,
            "missing notAfter",
        )
        .await;

    // And certificate-not-before, emptied: an empty value is a missing one (it read as a
    // malformed time, `bad expiry: ""`).
    setup
        .patch_secret(
            DEMO,
            "web-tls",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_BEFORE: "" } } }),
        )
        .await;
    let third = setup
        .wait_secret(DEMO, "web-tls", "a new certificate", reissued(&second))
        .await;
    setup
        .wait_note(
            DEMO,
            "web",
            names::EVENT_TARGET_UPDATE_REQUIRED,
            "missing notBefore",
        )
        .await;

    // Names changed in the spec.
    let certificates_api = setup.certificates();
    certificates_api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "dnsNames": ["web.demo.svc", "extra.demo.svc"] } })),
        )
        .await
        .unwrap();
    let fourth = setup
        .wait_secret(DEMO, "web-tls", "a certificate with the new name", |s| {
            leaf(s)
                .info()
                .dns_names
                .iter()
                .any(|n| n == "extra.demo.svc")
        })
        .await;
    let note = setup
        .wait_note(
            DEMO,
            "web",
            names::EVENT_TARGET_UPDATE_REQUIRED,
            "hostnames changed",
        )
        .await;
    assert!(note.contains("extra.demo.svc"), "{note}");
    assert_eq!(
        annotation(&fourth.metadata, names::CERTIFICATE_HOSTNAMES),
        Some("extra.demo.svc,web.demo.svc")
    );
    setup
        .wait_certificate_condition("web", "Ready", "True", names::REASON_ISSUED)
        .await;
    assert_eq!(
        setup
            .certificate("web")
            .await
            .status
            .unwrap()
            .observed_generation,
        Some(2)
    );

    // The key replaced by another key.
    let other = PrivateKey::generate(KeyAlgorithm::EcdsaP256)
        .unwrap()
        .to_pem();
    setup
        .patch_secret(
            DEMO,
            "web-tls",
            json!({ "data": { "tls.key": STANDARD.encode(&other) } }),
        )
        .await;
    let fifth = setup
        .wait_secret(DEMO, "web-tls", "a new certificate and key", |s| {
            reissued(&fourth)(s) && text(s, "tls.key") != other
        })
        .await;
    let key = PrivateKey::from_pem(&text(&fifth, "tls.key")).unwrap();
    assert!(caretaker_pki::key_matches_certificate(&key, leaf(&fifth).der()).unwrap());
    setup
        .wait_note(
            DEMO,
            "web",
            names::EVENT_TARGET_UPDATE_REQUIRED,
            "key not matching the certificate",
        )
        .await;

    // ca.crt edited: only ca.crt is written again; certificate and key stay.
    let foreign = caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new("x"))
        .unwrap()
        .certificate_pem();
    let edited = setup
        .patch_secret(
            DEMO,
            "web-tls",
            json!({ "data": { "ca.crt": STANDARD.encode(&foreign) } }),
        )
        .await;
    let bundle = bundle_text(&setup.bundle("webhooks-ca-bundle").await.unwrap());
    let sixth = setup
        .wait_secret(DEMO, "web-tls", "ca.crt written back", |s| {
            text(s, "ca.crt") == bundle
        })
        .await;
    assert_eq!(text(&sixth, "tls.crt"), text(&fifth, "tls.crt"));
    assert_eq!(text(&sixth, "tls.key"), text(&fifth, "tls.key"));
    assert_eq!(sixth.metadata.annotations, edited.metadata.annotations);
    setup
        .wait_note(
            DEMO,
            "web",
            names::EVENT_CA_BUNDLE_UPDATE_REQUIRED,
            "requires a new ca.crt",
        )
        .await;
    let targets = setup
        .notes(DEMO, "web", names::EVENT_TARGET_UPDATE_REQUIRED)
        .await;
    assert_eq!(
        targets.len(),
        5,
        "no new certificate for ca.crt: {targets:?}"
    );
    let _ = third;
}

/// A certificate falls due after its share of the validity asked, at that moment (the pass
/// that issued it asked to run again then), and is issued again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_is_issued_again_when_it_falls_due() {
    let setup = setup().await;
    setup.create_ca("webhooks", json!({})).await;
    setup
        .create_certificate(
            "short",
            "webhooks",
            json!({ "validity": "6s", "renewAtPercent": 50 }),
        )
        .await;
    let (_, first) = settled(&setup, "webhooks", "short").await;
    let issued_at = Instant::now();
    let serial = leaf(&first).serial().to_string();
    let second = setup
        .wait_secret(DEMO, "short-tls", "a new certificate once due", |s| {
            leaf(s).serial() != serial
        })
        .await;
    let waited = issued_at.elapsed();
    assert!(
        waited > Duration::from_millis(1500),
        "issued again too early: after {waited:?}"
    );
    let note = setup
        .wait_note(
            DEMO,
            "short",
            names::EVENT_TARGET_UPDATE_REQUIRED,
            "expiring: past its refresh time",
        )
        .await;
    assert!(note.contains("(50% of its validity)"), "{note}");
    let lifetime = leaf(&second).not_after() - leaf(&second).not_before();
    assert!(
        lifetime > time::Duration::minutes(5),
        "backdated, yet not due at once"
    );
}

/// A rotation forced by removing the CA Secret's `certificate-not-after`: the bundle holds old
/// and new CA, the certificate keeps its leaf from the old CA (and trusts both) while the
/// injection point does not hold the new bundle, however long; once it does, the new CA signs
/// after `trustPropagation`; the old CA stays in the bundle while a certificate signed by it
/// remains (one whose spec became invalid, so nothing issues it again), and leaves once none
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_ca_rotation_is_trusted_everywhere_before_it_signs_anything() {
    let setup = setup().await;
    setup
        .create_ca("webhooks", json!({ "trustPropagation": "2s" }))
        .await;
    setup.create_webhook_configuration("vwc", "webhooks").await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    setup
        .create_certificate("frozen", "webhooks", json!({}))
        .await;
    let (ca_secret, first) = settled(&setup, "webhooks", "web").await;
    let old_ca = leaf_or_ca(&ca_secret);
    let first_bundle = bundle_text(&setup.bundle("webhooks-ca-bundle").await.unwrap());
    setup.inject_by_hand("vwc", &first_bundle).await;
    // A certificate nothing issues again for now (its spec became invalid): its workload
    // still serves the old CA's leaf.
    setup
        .wait_certificate_condition("frozen", "Ready", "True", names::REASON_ISSUED)
        .await;
    let frozen = setup.secret(DEMO, "frozen-tls").await.unwrap();
    set_ip_addresses(&setup, "frozen", json!(["10.0.0.300"])).await;
    setup
        .wait_certificate_condition("frozen", "Degraded", "True", names::REASON_INVALID_SPEC)
        .await;

    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } }),
        )
        .await;
    let note = setup
        .wait_note(
            "default",
            "webhooks",
            names::EVENT_SIGNER_UPDATE_REQUIRED,
            "missing notAfter",
        )
        .await;
    assert!(
        note.contains("signs once trusted everywhere for 2s"),
        "{note}"
    );
    let both = eventually("the bundle holds old and new CA", 20, || async {
        let text = bundle_text(&setup.bundle("webhooks-ca-bundle").await?);
        (certificates(&text).len() == 2).then_some(text)
    })
    .await;
    assert!(fingerprints(&both).contains(&old_ca.fingerprint().to_string()));
    let stored = setup.secret(SYSTEM, "webhooks-ca").await.unwrap();
    let [new_ca] = certificates(&text(&stored, "next.crt")).try_into().unwrap();
    assert_eq!(leaf_or_ca(&stored), old_ca, "the old CA still signs");
    setup
        .wait_secret(DEMO, "web-tls", "ca.crt trusts both", |s| {
            text(s, "ca.crt") == both
        })
        .await;

    // Longer than trustPropagation: nothing signs with the new CA while the injection point
    // does not hold it, and the old CA, still in use, stays trusted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = setup.secret(DEMO, "web-tls").await.unwrap();
    assert_eq!(text(&waiting, "tls.crt"), text(&first, "tls.crt"));
    assert_eq!(
        bundle_text(&setup.bundle("webhooks-ca-bundle").await.unwrap()),
        both
    );
    let status = setup.authority("webhooks").await.status.unwrap();
    assert_eq!(status.trusted_since, None);
    assert_eq!(
        status.certificate.next_rotation, None,
        "unknown until trusted everywhere"
    );
    assert_eq!(
        status.certificate.serial_number.as_deref(),
        Some(old_ca.serial())
    );
    // It says what it waits for.
    let ready = condition(&status.certificate.conditions, "Ready");
    assert_eq!(ready.status, "True", "the old CA signs meanwhile");
    assert!(
        ready.message.ends_with(&format!(
            "; CA serial {} is not trusted yet by ValidatingWebhookConfiguration vwc",
            new_ca.serial()
        )),
        "{}",
        ready.message
    );

    let injecting = Instant::now();
    let injected_at = setup.inject_by_hand("vwc", &both).await;
    let reissued = setup
        .wait_secret(DEMO, "web-tls", "a leaf from the new CA", |s| {
            signed_by(&leaf(s), &new_ca)
        })
        .await;
    let waited = injecting.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "signed {waited:?} after the injection point held the new CA"
    );
    assert!(
        version(&reissued.metadata) > injected_at,
        "the injection point held the new CA before any certificate was signed by it"
    );
    setup
        .wait_note(
            "default",
            "webhooks",
            names::EVENT_SIGNER_PROMOTED,
            new_ca.serial(),
        )
        .await;
    setup
        .wait_note(
            DEMO,
            "web",
            names::EVENT_TARGET_UPDATE_REQUIRED,
            "issuer changed",
        )
        .await;

    // The old CA stays trusted while a certificate signed by it remains, however long.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = bundle_text(&setup.bundle("webhooks-ca-bundle").await.unwrap());
    assert_eq!(fingerprints(&still).len(), 2, "the old CA is still in use");
    let frozen_now = setup.secret(DEMO, "frozen-tls").await.unwrap();
    assert_eq!(text(&frozen_now, "tls.crt"), text(&frozen, "tls.crt"));
    let (ok, said) = openssl_verify(&still, &text(&frozen_now, "tls.crt"), "sslserver");
    assert!(ok, "{said}");
    set_ip_addresses(&setup, "frozen", json!(null)).await;
    setup
        .wait_secret(DEMO, "frozen-tls", "a leaf from the new CA", |s| {
            signed_by(&leaf(s), &new_ca)
        })
        .await;

    // Nothing uses the old CA any more: it leaves the bundle, and ca.crt follows.
    let last = eventually("the old CA leaves the bundle", 20, || async {
        let text = bundle_text(&setup.bundle("webhooks-ca-bundle").await?);
        (fingerprints(&text) == [new_ca.fingerprint().to_string()]).then_some(text)
    })
    .await;
    let final_secret = setup
        .wait_secret(DEMO, "web-tls", "ca.crt follows", |s| {
            text(s, "ca.crt") == last
        })
        .await;
    let (ok, said) = openssl_verify(&last, &text(&final_secret, "tls.crt"), "sslserver");
    assert!(ok, "{said}");
    let status = eventually("the status shows no previous CA", 20, || async {
        let status = setup.authority("webhooks").await.status?;
        status.previous_cas.is_empty().then_some(status)
    })
    .await;
    assert_eq!(
        status.certificate.serial_number.as_deref(),
        Some(new_ca.serial())
    );
    let ca_secret = setup.secret(SYSTEM, "webhooks-ca").await.unwrap();
    let keys: Vec<&String> = ca_secret.data.as_ref().unwrap().keys().collect();
    assert_eq!(keys, ["tls.crt", "tls.key"]);
}

async fn set_ip_addresses(setup: &Setup, certificate: &str, addresses: Value) {
    setup
        .certificates()
        .patch(
            certificate,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "ipAddresses": addresses } })),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tampered_ca_secret_degrades_and_nothing_is_regenerated() {
    let setup = setup().await;
    setup.create_ca("webhooks", json!({})).await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (ca_secret, leaf_secret) = settled(&setup, "webhooks", "web").await;
    let bundle = setup.bundle("webhooks-ca-bundle").await.unwrap();
    let good_key = text(&ca_secret, "tls.key");

    let tampered = setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "data": { "tls.key": STANDARD.encode("not a key QWERTY") } }),
        )
        .await;
    setup
        .wait_ca_condition(
            "webhooks",
            "Degraded",
            "True",
            names::REASON_CA_SECRET_INVALID,
        )
        .await;
    let warning = setup
        .wait_note(
            "default",
            "webhooks",
            names::EVENT_CA_SECRET_INVALID,
            "is invalid",
        )
        .await;
    assert!(warning.contains("nothing was regenerated"), "{warning}");
    assert!(
        !warning.contains("QWERTY"),
        "the value is never echoed: {warning}"
    );
    let status = setup.authority("webhooks").await.status.unwrap();
    let ready = condition(&status.certificate.conditions, "Ready");
    assert_eq!(ready.status, "True", "the last good CA signs: {ready:?}");
    assert!(ready.message.contains("last good CA"), "{ready:?}");

    // Woken again (a label on the Secret): no second Warning, no write.
    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "metadata": { "labels": { "touched": "yes" } } }),
        )
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let notes = setup
        .notes("default", "webhooks", names::EVENT_CA_SECRET_INVALID)
        .await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    let now = setup.secret(SYSTEM, "webhooks-ca").await.unwrap();
    assert_eq!(now.data, tampered.data, "nothing regenerated");
    assert_eq!(now.metadata.annotations, tampered.metadata.annotations);
    let bundle_now = setup.bundle("webhooks-ca-bundle").await.unwrap();
    assert_eq!(
        bundle_now.metadata.resource_version,
        bundle.metadata.resource_version
    );
    let leaf_now = setup.secret(DEMO, "web-tls").await.unwrap();
    assert_eq!(
        leaf_now.metadata.resource_version, leaf_secret.metadata.resource_version,
        "the certificate is left alone"
    );

    // Restored: degraded no more.
    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "data": { "tls.key": STANDARD.encode(&good_key) } }),
        )
        .await;
    setup
        .wait_ca_condition("webhooks", "Degraded", "False", "AsExpected")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_ca_secret_is_replaced_by_a_new_ca_with_an_event() {
    let setup = setup().await;
    setup
        .create_ca("webhooks", json!({ "trustPropagation": "1s" }))
        .await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (ca_secret, _) = settled(&setup, "webhooks", "web").await;
    let old_ca = leaf_or_ca(&ca_secret);

    setup
        .secrets(SYSTEM)
        .delete("webhooks-ca", &DeleteParams::default())
        .await
        .unwrap();
    let note = eventually("a second SignerUpdateRequired", 20, || async {
        let notes = setup
            .notes("default", "webhooks", names::EVENT_SIGNER_UPDATE_REQUIRED)
            .await;
        (notes.len() == 2).then(|| notes.into_iter().find(|n| n.contains("stay trusted")))?
    })
    .await;
    assert!(note.contains("secret doesn't exist"), "{note}");
    assert!(
        note.contains("the 1 CAs the bundle holds stay trusted"),
        "{note}"
    );

    // The new CA signs once trusted, the certificate comes from it, the old CA goes.
    let new_ca = new_ca_signs(&setup, &old_ca).await;
    eventually("the old CA leaves the bundle", 20, || async {
        let text = bundle_text(&setup.bundle("webhooks-ca-bundle").await?);
        (fingerprints(&text) == [new_ca.fingerprint().to_string()]).then_some(())
    })
    .await;
}

/// Waits until a CA other than `old` signs for CertificateAuthority `webhooks`, and
/// `web-tls` holds a leaf from it; returns that CA.
async fn new_ca_signs(setup: &Setup, old: &Certificate) -> Certificate {
    let stored = setup
        .wait_secret(SYSTEM, "webhooks-ca", "the new CA signs", |s| {
            certificates(&text(s, "tls.crt"))
                .first()
                .is_some_and(|c| c != old)
        })
        .await;
    let new_ca = leaf_or_ca(&stored);
    setup
        .wait_secret(DEMO, "web-tls", "a leaf from the new CA", |s| {
            signed_by(&leaf(s), &new_ca)
        })
        .await;
    new_ca
}

/// A deleted CA Secret while the bundle ConfigMap also holds a leaf (put there by hand): the
/// re-created Secret keeps the bundle's CA in `previous.crt` and nothing else, and reads back
/// valid (it was `CASecretInvalid` on the next pass, and nothing signed again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_created_ca_secret_keeps_only_cas_from_the_bundle() {
    let mut setup = setup().await;
    setup
        .create_ca("webhooks", json!({ "trustPropagation": "1s" }))
        .await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (ca_secret, leaf_secret) = settled(&setup, "webhooks", "web").await;
    let old_ca = leaf_or_ca(&ca_secret);

    // Stopped, so that the bundle with the leaf and the missing Secret are seen together by
    // an operator that never knew the old CA: the bundle is in the CA Secret's namespace, so
    // its CAs are taken back all the same (else the old CA's certificates lose trust).
    setup.stop();
    let bundle = bundle_text(&setup.bundle("webhooks-ca-bundle").await.unwrap());
    setup
        .config_maps()
        .patch(
            "webhooks-ca-bundle",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "data": {
                "ca-bundle.crt": bundle + &text(&leaf_secret, "tls.crt") } })),
        )
        .await
        .unwrap();
    setup
        .secrets(SYSTEM)
        .delete("webhooks-ca", &DeleteParams::default())
        .await
        .unwrap();
    setup.start();

    let recreated = setup
        .wait_secret(SYSTEM, "webhooks-ca", "a re-created CA Secret", |_| true)
        .await;
    assert_eq!(
        fingerprints(&text(&recreated, "previous.crt")),
        [old_ca.fingerprint().to_string()]
    );
    new_ca_signs(&setup, &old_ca).await;
    assert!(
        setup
            .notes("default", "webhooks", names::EVENT_CA_SECRET_INVALID)
            .await
            .is_empty()
    );
}

/// A valid CA swapped into the CA Secret (a backup restored, say) while the bundle ConfigMap
/// still holds the CA that signed the certificates in use: that CA stays in the bundle (it was
/// dropped at once), kept in `previous.crt` and counted unused only once the certificate is
/// issued again, for `trustPropagation`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_only_the_bundle_holds_stays_trusted_after_a_restore() {
    let mut setup = setup().await;
    setup
        .create_ca("webhooks", json!({ "trustPropagation": "1h" }))
        .await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (ca_secret, _) = settled(&setup, "webhooks", "web").await;
    let old_ca = leaf_or_ca(&ca_secret);

    // Restored while no operator runs: the one that starts never knew the old CA, but the
    // bundle is in the CA Secret's namespace, so the old CA it holds is taken back.
    setup.stop();
    let restored =
        caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new("webhooks-ca"))
            .unwrap();
    let restored_ca = certificates(&restored.certificate_pem()).remove(0);
    let time = caretaker_operator::timestamp::format_time;
    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({
                "metadata": { "annotations": {
                    names::CERTIFICATE_NOT_BEFORE: time(restored_ca.not_before()),
                    names::CERTIFICATE_NOT_AFTER: time(restored_ca.not_after()),
                } },
                "data": {
                    "tls.crt": STANDARD.encode(restored.certificate_pem()),
                    "tls.key": STANDARD.encode(restored.private_key_pem()),
                },
            }),
        )
        .await;
    setup.start();

    setup
        .wait_secret(DEMO, "web-tls", "a leaf from the restored CA", |s| {
            signed_by(&leaf(s), &restored_ca)
        })
        .await;
    let ca_secret = setup
        .wait_secret(SYSTEM, "webhooks-ca", "the old CA counted unused", |s| {
            annotation(&s.metadata, names::authority_state::UNUSED_SINCE)
                .is_some_and(|v| v.starts_with(old_ca.fingerprint()))
        })
        .await;
    assert_eq!(
        fingerprints(&text(&ca_secret, "previous.crt")),
        [old_ca.fingerprint().to_string()]
    );
    let mut both = vec![
        old_ca.fingerprint().to_string(),
        restored_ca.fingerprint().to_string(),
    ];
    both.sort();
    let mut held = fingerprints(&bundle_text(
        &setup.bundle("webhooks-ca-bundle").await.unwrap(),
    ));
    held.sort();
    assert_eq!(held, both, "the old CA stays trusted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_restarted_mid_rotation_makes_no_second_ca_and_loses_nothing() {
    let mut setup = setup().await;
    setup
        .create_ca("webhooks", json!({ "trustPropagation": "2s" }))
        .await;
    setup.create_webhook_configuration("vwc", "webhooks").await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (ca_secret, _) = settled(&setup, "webhooks", "web").await;
    let old_ca = leaf_or_ca(&ca_secret);

    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } }),
        )
        .await;
    let stored = setup
        .wait_secret(SYSTEM, "webhooks-ca", "the next CA stored", |s| {
            !text(s, "next.crt").is_empty()
        })
        .await;
    // The operator goes away right after storing the next CA, and a new one starts.
    setup.stop();
    let next = text(&stored, "next.crt");
    setup.start();

    let both = eventually("the bundle holds old and new CA", 20, || async {
        let text = bundle_text(&setup.bundle("webhooks-ca-bundle").await?);
        (certificates(&text).len() == 2).then_some(text)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = setup.secret(SYSTEM, "webhooks-ca").await.unwrap();
    assert_eq!(text(&after, "next.crt"), next, "the same next CA");
    assert_eq!(leaf_or_ca(&after), old_ca);
    assert!(fingerprints(&both).contains(&certificates(&next)[0].fingerprint().to_string()));

    // Stopped again; the injection point takes up the bundle while no operator runs; a new
    // one finds everything in place and nothing that changes any more.
    setup.stop();
    setup.inject_by_hand("vwc", &both).await;
    setup.start();
    let promoted = setup
        .wait_secret(SYSTEM, "webhooks-ca", "the next CA signs", |s| {
            text(s, "tls.crt") == next
        })
        .await;
    assert!(!text(&promoted, "previous.crt").is_empty());
    let new_ca = leaf_or_ca(&promoted);
    setup
        .wait_secret(DEMO, "web-tls", "a leaf from the next CA", |s| {
            signed_by(&leaf(s), &new_ca)
        })
        .await;
    let made = setup
        .notes("default", "webhooks", names::EVENT_SIGNER_UPDATE_REQUIRED)
        .await;
    assert_eq!(made.len(), 2, "the first CA and one successor: {made:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_certificate_authorities_share_nothing() {
    let setup = setup().await;
    setup
        .create_ca("alpha", json!({ "trustPropagation": "0s" }))
        .await;
    setup.create_ca("beta", json!({})).await;
    setup.create_certificate("a", "alpha", json!({})).await;
    setup.create_certificate("b", "beta", json!({})).await;
    let (alpha_secret, a) = settled(&setup, "alpha", "a").await;
    let (beta_secret, b) = settled(&setup, "beta", "b").await;
    let (alpha, beta) = (leaf_or_ca(&alpha_secret), leaf_or_ca(&beta_secret));
    assert_ne!(alpha, beta);
    assert_eq!(beta.common_name(), "beta-ca");
    let alpha_bundle = bundle_text(&setup.bundle("alpha-ca-bundle").await.unwrap());
    let beta_bundle = setup.bundle("beta-ca-bundle").await.unwrap();
    assert_eq!(
        fingerprints(&alpha_bundle),
        [alpha.fingerprint().to_string()]
    );
    assert_eq!(text(&a, "ca.crt"), alpha_bundle);
    assert_eq!(text(&b, "ca.crt"), bundle_text(&beta_bundle));
    let (crossed, _) = openssl_verify(
        &bundle_text(&beta_bundle),
        &text(&a, "tls.crt"),
        "sslserver",
    );
    assert!(
        !crossed,
        "alpha's certificate does not verify against beta's bundle"
    );

    // alpha rotates; nothing of beta's is written.
    setup
        .patch_secret(
            SYSTEM,
            "alpha-ca",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } }),
        )
        .await;
    setup
        .wait_secret(DEMO, "a-tls", "a leaf from alpha's new CA", |s| {
            !signed_by(&leaf(s), &alpha)
        })
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let beta_now = setup.secret(SYSTEM, "beta-ca").await.unwrap();
    assert_eq!(
        beta_now.metadata.resource_version,
        beta_secret.metadata.resource_version
    );
    assert_eq!(
        setup
            .bundle("beta-ca-bundle")
            .await
            .unwrap()
            .metadata
            .resource_version,
        beta_bundle.metadata.resource_version
    );
    assert_eq!(
        setup
            .secret(DEMO, "b-tls")
            .await
            .unwrap()
            .metadata
            .resource_version,
        b.metadata.resource_version
    );
    assert!(
        setup
            .notes("default", "beta", names::EVENT_SIGNER_UPDATE_REQUIRED)
            .await
            .len()
            == 1
    );
}

/// Two objects naming one Secret or ConfigMap would overwrite each other forever: the one whose
/// mark the object carries goes on, the other is refused (`ObjectInUse`, naming the owner)
/// and writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_that_would_share_a_secret_or_bundle_are_refused_not_fought_over() {
    let setup = setup().await;
    setup.create_ca("webhooks", json!({})).await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (ca_secret, web) = settled(&setup, "webhooks", "web").await;
    let bundle = setup.bundle("webhooks-ca-bundle").await.unwrap();

    // A second certificate in the same Secret, one in a CA's Secret, a CA on the same bundle.
    setup
        .create_certificate("copy", "webhooks", json!({ "secretName": "web-tls" }))
        .await;
    setup
        .create_ca(
            "local",
            json!({ "secret": { "name": "local-ca", "namespace": DEMO } }),
        )
        .await;
    setup
        .wait_ca_condition("local", "Ready", "True", names::REASON_SIGNING)
        .await;
    let local_secret = setup.secret(DEMO, "local-ca").await.unwrap();
    setup
        .create_certificate("thief", "webhooks", json!({ "secretName": "local-ca" }))
        .await;
    setup
        .create_ca(
            "twin",
            json!({ "bundle": { "name": "webhooks-ca-bundle", "namespace": SYSTEM } }),
        )
        .await;
    for certificate in ["copy", "thief"] {
        setup
            .wait_certificate_condition(
                certificate,
                "Degraded",
                "True",
                names::REASON_OBJECT_IN_USE,
            )
            .await;
    }
    setup
        .wait_ca_condition("twin", "Degraded", "True", names::REASON_OBJECT_IN_USE)
        .await;
    let note = setup
        .wait_note(DEMO, "thief", names::REASON_OBJECT_IN_USE, "local-ca")
        .await;
    assert!(
        note.contains("Secret demo/local-ca belongs to CertificateAuthority local (uid "),
        "{note}"
    );
    let note = setup
        .wait_note(DEMO, "copy", names::REASON_OBJECT_IN_USE, "web-tls")
        .await;
    assert!(
        note.contains("Secret demo/web-tls belongs to IssuedCertificate demo/web (uid "),
        "{note}"
    );
    setup
        .wait_note(
            "default",
            "twin",
            names::REASON_OBJECT_IN_USE,
            "ConfigMap caretaker-system/webhooks-ca-bundle belongs to CertificateAuthority webhooks",
        )
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unchanged = |a: &Secret, b: &Secret| {
        a.data == b.data && a.metadata.annotations == b.metadata.annotations
    };
    assert!(unchanged(
        &setup.secret(DEMO, "web-tls").await.unwrap(),
        &web
    ));
    assert!(unchanged(
        &setup.secret(DEMO, "local-ca").await.unwrap(),
        &local_secret
    ));
    assert!(unchanged(
        &setup.secret(SYSTEM, "webhooks-ca").await.unwrap(),
        &ca_secret
    ));
    assert!(setup.secret(SYSTEM, "twin-ca").await.is_none());
    assert_eq!(
        setup.bundle("webhooks-ca-bundle").await.unwrap().data,
        bundle.data
    );
    // The owners were never held up.
    setup
        .wait_certificate_condition("web", "Degraded", "False", "AsExpected")
        .await;
    setup
        .wait_ca_condition("webhooks", "Degraded", "False", "AsExpected")
        .await;
    assert!(
        setup
            .notes(DEMO, "web", names::REASON_OBJECT_IN_USE)
            .await
            .is_empty()
    );
    assert_eq!(
        setup
            .notes(DEMO, "thief", names::REASON_OBJECT_IN_USE)
            .await
            .len(),
        1
    );
}

/// A Secret and a ConfigMap that are someone's data, at the names a CertificateAuthority and
/// an IssuedCertificate ask for: nothing is written to them (caretaker's label on them
/// changes nothing), both say so (Degraded and a Warning naming the object and how to hand it
/// over), and each goes on once handed over: the ConfigMap by an adoption request naming the
/// CertificateAuthority, kept and taken over; the Secret deleted, and made again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn someones_secret_or_config_map_is_never_taken_over() {
    let setup = setup().await;
    let config_map = serde_json::from_value(json!({
        "metadata": { "name": "team-bundle", "namespace": SYSTEM },
        "data": { "ca-bundle.crt": "the team's own data" },
    }))
    .unwrap();
    setup
        .config_maps()
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
    // As an OpenShift operator's Secret: library-go's annotations do not make it caretaker's.
    let secret = serde_json::from_value(json!({
        "metadata": { "name": "web-tls", "namespace": DEMO, "annotations": {
            "auth.openshift.io/certificate-not-before": "2026-01-01T00:00:00Z",
            "auth.openshift.io/certificate-not-after": "2028-01-01T00:00:00Z",
            "auth.openshift.io/certificate-issuer": "openshift-service-serving-signer@1767225600",
        } },
        "data": { "password": STANDARD.encode("hunter2") },
    }))
    .unwrap();
    let team_secret = setup
        .secrets(DEMO)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    setup
        .create_ca(
            "webhooks",
            json!({ "bundle": { "name": "team-bundle", "namespace": SYSTEM } }),
        )
        .await;
    setup.create_certificate("web", "webhooks", json!({})).await;

    setup
        .wait_ca_condition(
            "webhooks",
            "Degraded",
            "True",
            names::REASON_OBJECT_NOT_MANAGED,
        )
        .await;
    let note = setup
        .wait_note(
            "default",
            "webhooks",
            names::REASON_OBJECT_NOT_MANAGED,
            "ConfigMap caretaker-system/team-bundle exists and names no owner",
        )
        .await;
    assert!(
        note.contains(
            "annotate it caretaker.dev/adopt=CertificateAuthority/webhooks to hand it over"
        ),
        "{note}"
    );
    let status = setup.authority("webhooks").await.status.unwrap();
    assert_eq!(
        condition(&status.certificate.conditions, "Ready").status,
        "False"
    );
    setup
        .wait_certificate_condition("web", "Degraded", "True", names::REASON_OBJECT_NOT_MANAGED)
        .await;
    setup
        .wait_note(
            DEMO,
            "web",
            names::REASON_OBJECT_NOT_MANAGED,
            "Secret demo/web-tls exists and names no owner",
        )
        .await;
    // caretaker's own label makes nothing caretaker's: only the adoption request does.
    setup
        .config_maps()
        .patch(
            "team-bundle",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "metadata": { "labels": {
                "app.kubernetes.io/managed-by": "caretaker" } } })),
        )
        .await
        .unwrap();
    let team_bundle = setup.bundle("team-bundle").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let unchanged = setup.bundle("team-bundle").await.unwrap();
    assert_eq!(unchanged.metadata, team_bundle.metadata, "nothing written");
    assert_eq!(unchanged.data, team_bundle.data);
    let unchanged = setup.secret(DEMO, "web-tls").await.unwrap();
    assert_eq!(unchanged.metadata, team_secret.metadata, "nothing written");
    assert_eq!(unchanged.data, team_secret.data);
    assert!(
        setup.secret(SYSTEM, "webhooks-ca").await.is_none(),
        "no CA made for a bundle that is not caretaker's"
    );
    // Said once.
    let notes = setup
        .notes("default", "webhooks", names::REASON_OBJECT_NOT_MANAGED)
        .await;
    assert_eq!(notes, [note]);

    // An adoption request for another object hands over nothing.
    let adopt =
        |reference: &str| json!({ "metadata": { "annotations": { names::ADOPT: reference } } });
    setup
        .config_maps()
        .patch(
            "team-bundle",
            &PatchParams::default(),
            &Patch::Merge(&adopt("CertificateAuthority/someone-else")),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(setup.secret(SYSTEM, "webhooks-ca").await.is_none());

    // Handed over: the ConfigMap by its adoption request, the Secret deleted.
    setup
        .config_maps()
        .patch(
            "team-bundle",
            &PatchParams::default(),
            &Patch::Merge(&adopt("CertificateAuthority/webhooks")),
        )
        .await
        .unwrap();
    setup
        .secrets(DEMO)
        .delete("web-tls", &DeleteParams::default())
        .await
        .unwrap();
    let (ca_secret, leaf_secret) = settled(&setup, "webhooks", "web").await;
    let authority_uid = setup.authority("webhooks").await.metadata.uid.unwrap();
    let web_uid = (setup.certificates().get("web").await.unwrap().metadata.uid).unwrap();
    for (meta, mark) in [
        (
            &ca_secret.metadata,
            format!("CertificateAuthority/webhooks/{authority_uid}"),
        ),
        (
            &leaf_secret.metadata,
            format!("IssuedCertificate/demo/web/{web_uid}"),
        ),
    ] {
        assert_eq!(meta.annotations.as_ref().unwrap()[names::OWNER], mark);
    }
    let adopted = setup.bundle("team-bundle").await.unwrap();
    let annotations = adopted.metadata.annotations.unwrap();
    assert_eq!(
        annotations[names::OWNER],
        format!("CertificateAuthority/webhooks/{authority_uid}")
    );
    assert!(
        !annotations.contains_key(names::ADOPT),
        "the request is used up"
    );
    assert_eq!(
        fingerprints(&bundle_text(&setup.bundle("team-bundle").await.unwrap())),
        fingerprints(&text(&ca_secret, "tls.crt"))
    );
}

/// Every managed object, with its resourceVersion.
async fn versions(setup: &Setup) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut note = |kind: &str, meta: &kube::api::ObjectMeta| {
        found.insert(
            format!(
                "{kind} {}/{}",
                meta.namespace.as_deref().unwrap_or(""),
                meta.name.as_deref().unwrap()
            ),
            meta.resource_version.clone().unwrap(),
        );
    };
    for ca in setup
        .authorities()
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        note("CertificateAuthority", &ca.metadata);
    }
    for certificate in setup
        .certificates()
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        note("IssuedCertificate", &certificate.metadata);
    }
    let secrets: Api<Secret> = Api::all(setup.client.clone());
    for secret in secrets.list(&ListParams::default()).await.unwrap() {
        note("Secret", &secret.metadata);
    }
    let config_maps: Api<ConfigMap> = Api::all(setup.client.clone());
    for config_map in config_maps.list(&ListParams::default()).await.unwrap() {
        note("ConfigMap", &config_map.metadata);
    }
    for kind in [
        TargetKind::ValidatingWebhookConfiguration,
        TargetKind::MutatingWebhookConfiguration,
    ] {
        for target in setup
            .targets(kind)
            .list(&ListParams::default())
            .await
            .unwrap()
        {
            note(kind.kind(), &target.metadata);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_steady_state_nothing_is_written() {
    let mut setup = setup().await;
    setup.inject();
    setup.create_ca("webhooks", json!({})).await;
    setup
        .create_ca("other", json!({ "trustPropagation": "1s" }))
        .await;
    setup.create_webhook_configuration("vwc", "webhooks").await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    setup
        .create_certificate("api", "webhooks", json!({ "usages": ["server", "client"] }))
        .await;
    setup.create_certificate("other", "other", json!({})).await;
    settled(&setup, "webhooks", "web").await;
    settled(&setup, "other", "other").await;
    setup
        .wait_certificate_condition("api", "Ready", "True", names::REASON_ISSUED)
        .await;
    let bundle = bundle_text(&setup.bundle("webhooks-ca-bundle").await.unwrap());
    eventually("the webhook configuration holds the bundle", 20, || async {
        let held = setup
            .injected(TargetKind::ValidatingWebhookConfiguration, "vwc")
            .await;
        held.iter()
            .all(|b| b.as_deref() == Some(bundle.as_str()))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    let before = versions(&setup).await;
    assert!(before.len() >= 8, "{before:?}");
    let events: Api<Event> = Api::all(setup.client.clone());
    let events_before = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .len();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(versions(&setup).await, before, "something was written");
    assert_eq!(
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        events_before,
        "something was said"
    );
}

/// Every private key that has been in a Secret during the test never shows in an Event, a
/// status or a ConfigMap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_private_key_reaches_an_event_a_status_or_a_config_map() {
    let setup = setup().await;
    setup
        .create_ca("webhooks", json!({ "trustPropagation": "0s" }))
        .await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    let (ca_secret, first) = settled(&setup, "webhooks", "web").await;
    let mut keys = vec![text(&ca_secret, "tls.key"), text(&first, "tls.key")];

    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } }),
        )
        .await;
    let old_ca = leaf_or_ca(&ca_secret);
    let second = setup
        .wait_secret(DEMO, "web-tls", "a leaf from the new CA", |s| {
            !signed_by(&leaf(s), &old_ca)
        })
        .await;
    keys.push(text(&second, "tls.key"));
    let rotated = setup.secret(SYSTEM, "webhooks-ca").await.unwrap();
    keys.push(text(&rotated, "tls.key"));

    // A valid key that is not the CA's: Degraded, and the message names no key.
    let foreign = PrivateKey::generate(KeyAlgorithm::EcdsaP256)
        .unwrap()
        .to_pem();
    keys.push(foreign.clone());
    setup
        .patch_secret(
            SYSTEM,
            "webhooks-ca",
            json!({ "data": { "tls.key": STANDARD.encode(&foreign) } }),
        )
        .await;
    setup
        .wait_ca_condition(
            "webhooks",
            "Degraded",
            "True",
            names::REASON_CA_SECRET_INVALID,
        )
        .await;
    setup
        .wait_note("default", "webhooks", names::EVENT_CA_SECRET_INVALID, "")
        .await;

    let mut seen = Vec::new();
    let events: Api<Event> = Api::all(setup.client.clone());
    for event in events.list(&ListParams::default()).await.unwrap() {
        seen.push(serde_json::to_string(&event).unwrap());
    }
    for ca in setup
        .authorities()
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        seen.push(serde_json::to_string(&ca).unwrap());
    }
    for certificate in setup
        .certificates()
        .list(&ListParams::default())
        .await
        .unwrap()
    {
        seen.push(serde_json::to_string(&certificate).unwrap());
    }
    let config_maps: Api<ConfigMap> = Api::all(setup.client.clone());
    for config_map in config_maps.list(&ListParams::default()).await.unwrap() {
        seen.push(serde_json::to_string(&config_map).unwrap());
    }
    assert!(seen.len() >= 6, "{}", seen.len());
    let bodies: Vec<&str> = keys
        .iter()
        .flat_map(|k| k.lines())
        .filter(|l| !l.starts_with("-----") && l.len() > 20)
        .collect();
    assert!(bodies.len() >= 5);
    for text in &seen {
        assert!(!text.contains("PRIVATE KEY"), "{text}");
        for body in &bodies {
            assert!(!text.contains(body), "a key in {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_spec_writes_nothing_and_warns_once_per_message() {
    let setup = setup().await;
    setup.create_ca("bad", json!({ "validity": "10x" })).await;
    setup
        .wait_ca_condition("bad", "Ready", "False", names::REASON_INVALID_SPEC)
        .await;
    setup
        .wait_ca_condition("bad", "Degraded", "True", names::REASON_INVALID_SPEC)
        .await;
    let warning = setup
        .wait_note(
            "default",
            "bad",
            names::REASON_INVALID_SPEC,
            "spec.validity",
        )
        .await;
    assert!(warning.contains("\"10x\""), "{warning}");
    assert!(warning.ends_with("nothing was written"), "{warning}");

    // Woken by its bundle ConfigMap appearing (handed over to it, for when it is fixed): the
    // same message, no second Warning.
    let config_map = serde_json::from_value(json!({
        "metadata": { "name": "bad-ca-bundle",
                      "annotations": { names::ADOPT: "CertificateAuthority/bad" } },
        "data": { "other": "x" },
    }))
    .unwrap();
    setup
        .config_maps()
        .create(&PostParams::default(), &config_map)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        setup
            .notes("default", "bad", names::REASON_INVALID_SPEC)
            .await
            .len(),
        1
    );
    assert!(setup.secret(SYSTEM, "bad-ca").await.is_none(), "no CA made");
    let untouched = setup.bundle("bad-ca-bundle").await.unwrap();
    assert_eq!(
        untouched.data.unwrap().keys().collect::<Vec<_>>(),
        ["other"]
    );

    // Another problem, another Warning.
    setup
        .authorities()
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "validity": "1y", "trustPropagation": "soon" } })),
        )
        .await
        .unwrap();
    setup
        .wait_note(
            "default",
            "bad",
            names::REASON_INVALID_SPEC,
            "spec.trustPropagation",
        )
        .await;
    assert_eq!(
        setup
            .notes("default", "bad", names::REASON_INVALID_SPEC)
            .await
            .len(),
        2
    );

    // An IssuedCertificate with a bad address: the same, in its namespace.
    setup
        .create_certificate("typo", "bad", json!({ "ipAddresses": ["10.0.0.300"] }))
        .await;
    setup
        .wait_certificate_refused("typo", names::REASON_INVALID_SPEC, "spec.ipAddresses[0]")
        .await;

    // Fixed: the CA is made.
    setup
        .authorities()
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "trustPropagation": "5m" } })),
        )
        .await
        .unwrap();
    setup
        .wait_ca_condition("bad", "Ready", "True", names::REASON_SIGNING)
        .await;
    let status = setup.authority("bad").await.status.unwrap();
    assert_eq!(status.certificate.observed_generation, Some(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_waits_for_its_missing_issuer_and_is_issued_when_it_appears() {
    let setup = setup().await;
    setup.create_certificate("early", "later", json!({})).await;
    setup
        .wait_certificate_condition("early", "Ready", "False", names::REASON_ISSUER_NOT_FOUND)
        .await;
    let status = setup.certificate("early").await.status.unwrap();
    assert!(
        condition(&status.conditions, "Ready")
            .message
            .contains("CertificateAuthority later not found"),
        "{status:?}"
    );
    assert!(setup.secret(DEMO, "early-tls").await.is_none());

    setup.create_ca("later", json!({})).await;
    settled(&setup, "later", "early").await;
}

/// Without caretaker's CRDs the controllers only watch for them, say so once, fail nothing;
/// once the CRDs appear they start by themselves.
#[tokio::test(flavor = "current_thread")]
async fn without_caretakers_crds_the_controllers_idle_then_start_by_themselves() {
    let (captured, _logs) = Captured::on_this_thread("caretaker_operator=debug");

    let server = TestServer::start().await;
    let client = server.client();
    let mut setup = Setup {
        _server: server,
        client: client.clone(),
        controllers: None,
        injection: None,
        metrics: Metrics::new(),
    };
    setup.start();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let logs = || captured.text();
    assert_eq!(
        logs()
            .matches("CRD certificateauthorities.caretaker.dev absent")
            .count(),
        1,
        "{}",
        logs()
    );
    assert_eq!(
        logs()
            .matches("CRD issuedcertificates.caretaker.dev absent")
            .count(),
        1
    );

    install_caretaker_crds(&client).await;
    for namespace in [SYSTEM, DEMO] {
        create_namespace(&client, namespace).await;
    }
    setup.create_ca("webhooks", json!({})).await;
    setup.create_certificate("web", "webhooks", json!({})).await;
    settled(&setup, "webhooks", "web").await;
    let logs = logs();
    assert_eq!(
        logs.matches("CRD certificateauthorities.caretaker.dev found")
            .count(),
        1,
        "{logs}"
    );
    assert!(!logs.contains("cannot watch"), "no watch failed:\n{logs}");
    assert!(!logs.contains("reconcile failed"), "{logs}");
}

/// The expiry gauges follow the CA and the leaf, a forced re-issue counts one rotation, and
/// deleted objects leave the gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_follow_each_certificate_and_its_rotations() {
    let setup = setup().await;
    setup.create_ca("metered", json!({})).await;
    setup.create_certificate("web", "metered", json!({})).await;
    let (ca_secret, first) = settled(&setup, "metered", "web").await;
    let scrape = || openmetrics::parse(&setup.metrics.encode()).unwrap();
    let ca_series = [
        ("kind", "CertificateAuthority"),
        ("namespace", ""),
        ("name", "metered"),
    ];
    let leaf_series = [
        ("kind", "IssuedCertificate"),
        ("namespace", DEMO),
        ("name", "web"),
    ];
    let seconds = |c: Certificate| c.not_after().unix_timestamp() as f64;
    let ca_not_after = seconds(leaf_or_ca(&ca_secret));
    let exposition = eventually("the expiry series", 20, || async {
        let exposition = scrape();
        (exposition.get("caretaker_certificate_expiration_seconds", &leaf_series)
            == Some(seconds(leaf(&first))))
        .then_some(exposition)
    })
    .await;
    assert_eq!(
        exposition.get("caretaker_certificate_expiration_seconds", &ca_series),
        Some(ca_not_after)
    );
    let days = exposition
        .get("caretaker_ca_expiration_days", &[("name", "metered")])
        .expect("the CA's days");
    assert!((3640.0..3660.0).contains(&days), "a 10y CA: {days} days");
    let rotations = |kind| {
        scrape()
            .get("caretaker_certificate_rotations_total", &[("kind", kind)])
            .unwrap()
    };
    assert_eq!(
        rotations("IssuedCertificate"),
        0.0,
        "issuing the first is no rotation"
    );
    assert_eq!(rotations("CertificateAuthority"), 0.0);
    for controller in ["certificate_authority", "issued_certificate"] {
        let passes = exposition.get("caretaker_reconcile_total", &[("controller", controller)]);
        assert!(passes >= Some(1.0), "{controller}: {passes:?}");
    }

    // A forced re-issue: one rotation, and the gauge moves to the new leaf.
    let serial = leaf(&first).serial().to_string();
    setup
        .patch_secret(
            DEMO,
            "web-tls",
            json!({ "metadata": { "annotations": { names::CERTIFICATE_NOT_AFTER: null } } }),
        )
        .await;
    let second = setup
        .wait_secret(DEMO, "web-tls", "a new certificate", |s| {
            leaf(s).serial() != serial
        })
        .await;
    eventually("one rotation counted", 20, || async {
        (rotations("IssuedCertificate") == 1.0).then_some(())
    })
    .await;
    assert_eq!(
        scrape().get("caretaker_certificate_expiration_seconds", &leaf_series),
        Some(seconds(leaf(&second)))
    );
    assert!(
        scrape()
            .series("caretaker_certificate_rotation_failures_total")
            .is_empty()
    );

    // Deleted objects leave the gauges.
    setup
        .certificates()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    setup
        .authorities()
        .delete("metered", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the series are gone", 20, || async {
        let exposition = scrape();
        (exposition
            .series("caretaker_certificate_expiration_seconds")
            .is_empty()
            && exposition.series("caretaker_ca_expiration_days").is_empty())
        .then_some(())
    })
    .await;
}

/// A CertificateAuthority with `allowedNamespaces` signs nothing for other namespaces, whatever
/// an IssuedCertificate there asks; allowing the namespace issues it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_signs_only_for_its_allowed_namespaces() {
    let setup = setup().await;
    setup
        .create_ca("fenced", json!({ "allowedNamespaces": [SYSTEM] }))
        .await;
    setup
        .wait_ca_condition("fenced", "Ready", "True", names::REASON_SIGNING)
        .await;
    setup
        .create_certificate("intruder", "fenced", json!({}))
        .await;
    setup
        .wait_certificate_refused(
            "intruder",
            names::REASON_NAMESPACE_NOT_ALLOWED,
            "issues only to namespaces caretaker-system, not to demo",
        )
        .await;

    setup
        .authorities()
        .patch(
            "fenced",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "allowedNamespaces": [SYSTEM, DEMO] } })),
        )
        .await
        .unwrap();
    setup
        .wait_certificate_condition("intruder", "Ready", "True", names::REASON_ISSUED)
        .await;
    assert!(setup.secret(DEMO, "intruder-tls").await.is_some());
}
