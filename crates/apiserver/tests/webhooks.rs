//! Admission webhooks called over TLS: a real HTTPS webhook server in the test process.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use caretaker_apiserver::{ApiServer, Authorization, Subject};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::discovery::ApiResource;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

mod common;
use common::{api_status, create_namespace};

fn new_ca() -> CertificateAuthority {
    CertificateAuthority::create(&CaSpec::new("webhooks-ca")).unwrap()
}

/// The admission requests the webhook server received, one line each:
/// `<path> <operation> <namespace>/<name>`, with ` dryRun` when the review says so.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>, Arc<Mutex<Vec<Value>>>);

impl Calls {
    fn record(&self, path: &str, review: &Value) {
        let r = &review["request"];
        self.1.lock().unwrap().push(r["userInfo"].clone());
        let text = |v: &Value| v.as_str().unwrap_or("").to_string();
        let dry_run = if r["dryRun"] == true { " dryRun" } else { "" };
        let line = format!(
            "{path} {} {}/{}{dry_run}",
            text(&r["operation"]),
            text(&r["namespace"]),
            text(&r["name"])
        );
        self.0.lock().unwrap().push(line);
    }

    /// The `userInfo` of every review so far.
    fn users(&self) -> Vec<Value> {
        self.1.lock().unwrap().clone()
    }

    /// The calls since the last take.
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// An HTTPS admission webhook server. What it answers depends on the path's first segment:
/// /deny denies, /mutate adds `data.mutated`, /slow answers after 3 s, anything else allows. The
/// rest of the path only names the webhook in [`Calls`].
async fn start_webhook_server(ca: &CertificateAuthority, calls: Calls) -> SocketAddr {
    let serving = ca
        .issue(
            &LeafSpec::new("hooks.webhooks.svc", Usage::Server)
                .with_dns_names(["hooks.webhooks.svc"])
                .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
        )
        .unwrap();
    let key_pem = serving.key.as_ref().unwrap().to_pem();
    serve_webhooks(serving.certificate_der.clone(), &key_pem, calls).await
}

/// The webhook server of [`start_webhook_server`], serving `certificate_der` with `key_pem`.
async fn serve_webhooks(certificate_der: Vec<u8>, key_pem: &str, calls: Calls) -> SocketAddr {
    caretaker_apiserver::install_crypto_provider();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![certificate_der.into()],
            rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    async fn respond(
        State(calls): State<Calls>,
        path: axum::http::Uri,
        Json(review): Json<Value>,
    ) -> Json<Value> {
        calls.record(path.path(), &review);
        let uid = review["request"]["uid"].clone();
        let response = match path.path().split('/').nth(1).unwrap_or("") {
            "deny" => {
                json!({"uid": uid, "allowed": false, "status": {"code": 403, "reason": "Forbidden", "message": "no configmaps today"}})
            }
            "mutate" => {
                let patch = json!([{"op": "add", "path": "/data/mutated", "value": "yes"}]);
                json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                    "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string())})
            }
            "slow" => {
                tokio::time::sleep(Duration::from_secs(3)).await;
                json!({"uid": uid, "allowed": true})
            }
            _ => json!({"uid": uid, "allowed": true}),
        };
        Json(
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
        )
    }
    let router = axum::Router::new()
        .route("/{*path}", post(respond))
        .with_state(calls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, router) = (acceptor.clone(), router.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                    .await;
            });
        }
    });
    addr
}

/// An API server whose webhooks reach a webhook server signed by `ca`, with the clients the tests
/// need.
struct Fixture {
    server: ApiServer,
    calls: Calls,
    hook_addr: SocketAddr,
    ca_bundle: String,
    validating: Api<DynamicObject>,
    mutating: Api<DynamicObject>,
}

impl Fixture {
    async fn start() -> Self {
        Self::start_with(Authorization::AlwaysAllow).await
    }

    async fn start_with(authorization: Authorization) -> Self {
        let ca = new_ca();
        let calls = Calls::default();
        let hook_addr = start_webhook_server(&ca, calls.clone()).await;
        let server = ApiServer::builder()
            .webhook_service("webhooks", "hooks", hook_addr)
            .tls(authorization == Authorization::Rbac)
            .authorization(authorization)
            .start()
            .await
            .unwrap();
        let configurations = |kind: &str, plural: &str| -> Api<DynamicObject> {
            let gvk = kube::api::GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
            Api::all_with(
                server.client(),
                &ApiResource::from_gvk_with_plural(&gvk, plural),
            )
        };
        Fixture {
            validating: configurations(
                "ValidatingWebhookConfiguration",
                "validatingwebhookconfigurations",
            ),
            mutating: configurations(
                "MutatingWebhookConfiguration",
                "mutatingwebhookconfigurations",
            ),
            ca_bundle: base64::engine::general_purpose::STANDARD.encode(ca.certificate_pem()),
            server,
            calls,
            hook_addr,
        }
    }

    /// A clientConfig calling `path` on the webhook server by URL.
    fn url(&self, path: &str) -> Value {
        json!({"url": format!("https://127.0.0.1:{}{path}", self.hook_addr.port()), "caBundle": self.ca_bundle})
    }

    fn configmaps(&self, namespace: &str) -> Api<ConfigMap> {
        Api::namespaced(self.server.client(), namespace)
    }
}

/// One webhook for ConfigMap `operations`: failurePolicy Fail, timeoutSeconds 5.
fn webhook(name: &str, client_config: Value, operations: &[&str]) -> Value {
    json!({
        "name": name, "clientConfig": client_config,
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": operations, "resources": ["configmaps"], "scope": "*"}],
        "failurePolicy": "Fail", "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": 5
    })
}

fn configuration(kind: &str, webhooks: Vec<Value>) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "test-hooks"},
        "webhooks": webhooks
    }))
    .unwrap()
}

fn webhook_config(
    kind: &str,
    client_config: Value,
    failure_policy: &str,
    timeout: u64,
) -> DynamicObject {
    let mut hook = webhook(
        "configmaps.example.com",
        client_config,
        &["CREATE", "UPDATE"],
    );
    hook["failurePolicy"] = json!(failure_policy);
    hook["timeoutSeconds"] = json!(timeout);
    configuration(kind, vec![hook])
}

fn cm(name: &str, labels: Value) -> ConfigMap {
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .unwrap()
}

#[tokio::test]
async fn webhooks_allow_deny_mutate_and_fail() {
    let f = Fixture::start().await;
    let (validating, mutating) = (&f.validating, &f.mutating);
    let cms = f.configmaps("default");
    let pp = PostParams::default();
    let dp = DeleteParams::default();

    // Allowed.
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", f.url("/allow"), "Fail", 5),
        )
        .await
        .unwrap();
    cms.create(&pp, &cm("allowed", json!({}))).await.unwrap();
    assert_eq!(f.calls.take(), ["/allow CREATE default/allowed"]);
    validating.delete("test-hooks", &dp).await.unwrap();

    // Denied, with the webhook's status.
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", f.url("/deny"), "Fail", 5),
        )
        .await
        .unwrap();
    let Status {
        code,
        reason,
        message,
        ..
    } = api_status(cms.create(&pp, &cm("denied", json!({}))).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "admission webhook \"configmaps.example.com\" denied the request: no configmaps today"
    );
    assert!(cms.get_opt("denied").await.unwrap().is_none());
    validating.delete("test-hooks", &dp).await.unwrap();

    // The denying webhook also sees deletions once DELETE is in its rules.
    let mut deny_deletes =
        webhook_config("ValidatingWebhookConfiguration", f.url("/deny"), "Fail", 5);
    deny_deletes.data["webhooks"][0]["rules"][0]["operations"] = json!(["DELETE"]);
    validating.create(&pp, &deny_deletes).await.unwrap();
    let Status { code, message, .. } = api_status(cms.delete("allowed", &dp).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(message.contains("no configmaps today"), "{message}");
    assert!(cms.get_opt("allowed").await.unwrap().is_some());
    validating.delete("test-hooks", &dp).await.unwrap();

    // Mutated, through a service reference resolved by the service map.
    let service = json!({"service": {"namespace": "webhooks", "name": "hooks", "path": "/mutate", "port": 443}, "caBundle": f.ca_bundle});
    mutating
        .create(
            &pp,
            &webhook_config("MutatingWebhookConfiguration", service, "Fail", 5),
        )
        .await
        .unwrap();
    let created = cms.create(&pp, &cm("mutated", json!({}))).await.unwrap();
    assert_eq!(created.data.unwrap()["mutated"], "yes");
    mutating.delete("test-hooks", &dp).await.unwrap();

    // Unreachable: Fail refuses the request, Ignore lets it through.
    let nowhere = json!({"url": "https://127.0.0.1:1/allow", "caBundle": f.ca_bundle});
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", nowhere.clone(), "Fail", 5),
        )
        .await
        .unwrap();
    let Status {
        code,
        reason,
        message,
        ..
    } = api_status(
        cms.create(&pp, &cm("unreachable", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!((code, reason.as_str()), (500, "InternalError"));
    assert!(message.starts_with("Internal error occurred: failed calling webhook \"configmaps.example.com\": failed to call webhook: Post \"https://127.0.0.1:1/allow\""), "{message}");
    validating.delete("test-hooks", &dp).await.unwrap();
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", nowhere, "Ignore", 5),
        )
        .await
        .unwrap();
    cms.create(&pp, &cm("ignored", json!({}))).await.unwrap();
    validating.delete("test-hooks", &dp).await.unwrap();

    // A caBundle that did not sign the webhook's certificate: the TLS handshake fails.
    let other = base64::engine::general_purpose::STANDARD.encode(new_ca().certificate_pem());
    let wrong_ca = json!({"url": format!("https://127.0.0.1:{}/allow", f.hook_addr.port()), "caBundle": other});
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", wrong_ca, "Fail", 5),
        )
        .await
        .unwrap();
    let Status { code, message, .. } = api_status(
        cms.create(&pp, &cm("wrong-ca", json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 500);
    assert!(message.contains("certificate"), "{message}");
    validating.delete("test-hooks", &dp).await.unwrap();

    // timeoutSeconds.
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", f.url("/slow"), "Fail", 1),
        )
        .await
        .unwrap();
    // /slow would allow the request after 3 s; only timeoutSeconds (1 s) can make it fail, and
    // with kube-apiserver's deadline message.
    let Status { code, message, .. } =
        api_status(cms.create(&pp, &cm("slow", json!({}))).await.unwrap_err());
    assert_eq!(code, 500);
    assert!(message.contains("context deadline exceeded"), "{message}");
}

#[tokio::test]
async fn dry_run_all_persists_nothing_and_still_runs_admission() {
    let f = Fixture::start().await;
    let cms = f.configmaps("default");
    let pp = PostParams::default();
    cms.create(&pp, &cm("kept", json!({}))).await.unwrap();
    f.mutating
        .create(
            &pp,
            &configuration(
                "MutatingWebhookConfiguration",
                vec![webhook(
                    "mutate.example.com",
                    f.url("/mutate"),
                    &["CREATE", "UPDATE"],
                )],
            ),
        )
        .await
        .unwrap();
    f.validating
        .create(
            &pp,
            &configuration(
                "ValidatingWebhookConfiguration",
                vec![webhook(
                    "allow.example.com",
                    f.url("/allow"),
                    &["CREATE", "UPDATE", "DELETE"],
                )],
            ),
        )
        .await
        .unwrap();
    let rv = f.server.resource_version();
    let data = |c: &ConfigMap| c.data.clone().unwrap_or_default();

    // Each verb answers with the object it would have written, mutations included.
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let ghost = cms.create(&dry, &cm("ghost", json!({}))).await.unwrap();
    assert_eq!(data(&ghost)["mutated"], "yes");
    let mut changed = cms.get("kept").await.unwrap();
    changed.data = Some([("k".to_string(), "v2".to_string())].into());
    let replaced = cms.replace("kept", &dry, &changed).await.unwrap();
    assert_eq!(
        (
            data(&replaced)["k"].as_str(),
            data(&replaced)["mutated"].as_str()
        ),
        ("v2", "yes")
    );
    let patched = cms
        .patch(
            "kept",
            &PatchParams::default().dry_run(),
            &Patch::Merge(json!({"data": {"p": "1"}})),
        )
        .await
        .unwrap();
    assert_eq!(
        (
            data(&patched)["p"].as_str(),
            data(&patched)["mutated"].as_str()
        ),
        ("1", "yes")
    );
    let deleted = cms
        .delete("kept", &DeleteParams::default().dry_run())
        .await
        .unwrap()
        .left()
        .expect("a dry-run delete answers with the object");
    assert_eq!(deleted.metadata.name.as_deref(), Some("kept"));

    // Nothing was written: no new resourceVersion (so no watch event either), no ghost, kept as
    // it was.
    assert_eq!(f.server.resource_version(), rv);
    assert!(cms.get_opt("ghost").await.unwrap().is_none());
    assert_eq!(
        data(&cms.get("kept").await.unwrap()),
        [("k".to_string(), "v".to_string())].into()
    );
    // And every webhook saw every request, told it was a dry run.
    assert_eq!(
        f.calls.take(),
        [
            "/mutate CREATE default/ghost dryRun",
            "/allow CREATE default/ghost dryRun",
            "/mutate UPDATE default/kept dryRun",
            "/allow UPDATE default/kept dryRun",
            "/mutate UPDATE default/kept dryRun",
            "/allow UPDATE default/kept dryRun",
            "/allow DELETE default/kept dryRun",
        ]
    );
}

#[tokio::test]
async fn webhooks_are_called_only_for_their_namespace_and_object_selectors() {
    let f = Fixture::start().await;
    let pp = PostParams::default();
    for (name, labels) in [("picked", json!({"hooks": "on"})), ("other", json!({}))] {
        create_namespace(&f.server.client(), name, labels).await;
    }
    let namespaces: Api<Namespace> = Api::all(f.server.client());
    let watched = json!({"matchLabels": {"watched": "yes"}});
    let mut objects = webhook(
        "objects.example.com",
        f.url("/mutate/objects"),
        &["CREATE", "UPDATE"],
    );
    objects["objectSelector"] = watched.clone();
    let all = ["CREATE", "UPDATE", "DELETE"];
    let mut in_namespaces = webhook("namespaces.example.com", f.url("/allow/namespaces"), &all);
    in_namespaces["namespaceSelector"] =
        json!({"matchExpressions": [{"key": "hooks", "operator": "In", "values": ["on"]}]});
    let mut both = webhook("both.example.com", f.url("/allow/both"), &all);
    both["namespaceSelector"] = json!({"matchLabels": {"hooks": "on"}});
    both["objectSelector"] = watched;
    f.mutating
        .create(
            &pp,
            &configuration("MutatingWebhookConfiguration", vec![objects]),
        )
        .await
        .unwrap();
    f.validating
        .create(
            &pp,
            &configuration("ValidatingWebhookConfiguration", vec![in_namespaces, both]),
        )
        .await
        .unwrap();
    let (picked, other) = (f.configmaps("picked"), f.configmaps("other"));
    let mutated = |c: &ConfigMap| c.data.as_ref().is_some_and(|d| d.contains_key("mutated"));
    let yes = json!({"watched": "yes"});

    let c = other.create(&pp, &cm("plain", json!({}))).await.unwrap();
    assert!(!mutated(&c));
    assert_eq!(f.calls.take(), Vec::<String>::new());

    let c = other.create(&pp, &cm("seen", yes.clone())).await.unwrap();
    assert!(mutated(&c));
    assert_eq!(f.calls.take(), ["/mutate/objects CREATE other/seen"]);

    picked.create(&pp, &cm("plain", json!({}))).await.unwrap();
    assert_eq!(f.calls.take(), ["/allow/namespaces CREATE picked/plain"]);

    picked.create(&pp, &cm("seen", yes)).await.unwrap();
    assert_eq!(
        f.calls.take(),
        [
            "/mutate/objects CREATE picked/seen",
            "/allow/namespaces CREATE picked/seen",
            "/allow/both CREATE picked/seen",
        ]
    );

    // An update is selected when the old or the new object matches, as in Kubernetes.
    let unlabel = Patch::Merge(json!({"metadata": {"labels": {"watched": null}}}));
    other
        .patch("seen", &PatchParams::default(), &unlabel)
        .await
        .unwrap();
    assert_eq!(f.calls.take(), ["/mutate/objects UPDATE other/seen"]);

    let dp = DeleteParams::default();
    other.delete("plain", &dp).await.unwrap();
    assert_eq!(f.calls.take(), Vec::<String>::new());
    picked.delete("plain", &dp).await.unwrap();
    assert_eq!(f.calls.take(), ["/allow/namespaces DELETE picked/plain"]);

    // The namespace's labels are read at each request: labelling it selects it from then on.
    let label = Patch::Merge(json!({"metadata": {"labels": {"hooks": "on"}}}));
    namespaces
        .patch("other", &PatchParams::default(), &label)
        .await
        .unwrap();
    other.create(&pp, &cm("late", json!({}))).await.unwrap();
    assert_eq!(f.calls.take(), ["/allow/namespaces CREATE other/late"]);
}

/// A self-signed certificate with CA:TRUE, naming `names`, as some operator frameworks serve
/// their webhooks with: (DER, PEM, key PEM).
fn self_signed_ca_serving(names: &[&str]) -> (Vec<u8>, String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let certificate = params.self_signed(&key).unwrap();
    (
        certificate.der().to_vec(),
        certificate.pem(),
        key.serialize_pem(),
    )
}

/// kube-apiserver (Go's TLS) accepts a webhook serving a self-signed CA:TRUE certificate when
/// that certificate itself is the `caBundle`; so does this server. Only then: the same
/// certificate under another CA's bundle, or one not naming the host, is still refused.
#[tokio::test]
async fn a_self_signed_ca_serving_certificate_in_the_ca_bundle_is_accepted() {
    let calls = Calls::default();
    let (der, pem, key) = self_signed_ca_serving(&["127.0.0.1", "hooks.webhooks.svc"]);
    let addr = serve_webhooks(der, &key, calls.clone()).await;
    let server = ApiServer::builder().start().await.unwrap();
    let gvk = kube::api::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
    );
    let validating: Api<DynamicObject> = Api::all_with(
        server.client(),
        &ApiResource::from_gvk_with_plural(&gvk, "validatingwebhookconfigurations"),
    );
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let (pp, dp) = (PostParams::default(), DeleteParams::default());
    let encode = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let url = format!("https://127.0.0.1:{}/deny/self-signed", addr.port());
    let refusal = |result: Result<ConfigMap, kube::Error>| match result {
        Err(kube::Error::Api(status)) => status.message,
        other => panic!("expected a refusal, got {other:?}"),
    };

    // In the bundle: called, and its answer (a denial) is what the client sees.
    let config = webhook_config(
        "ValidatingWebhookConfiguration",
        json!({"url": url, "caBundle": encode(&pem)}),
        "Fail",
        5,
    );
    validating.create(&pp, &config).await.unwrap();
    let message = refusal(cms.create(&pp, &cm("one", json!({}))).await);
    assert!(message.contains("no configmaps today"), "{message}");
    assert_eq!(calls.take(), ["/deny/self-signed CREATE default/one"]);
    validating.delete("test-hooks", &dp).await.unwrap();

    // Another CA's bundle: the handshake fails, failurePolicy Fail refuses, no call.
    let other = new_ca();
    let config = webhook_config(
        "ValidatingWebhookConfiguration",
        json!({"url": url, "caBundle": encode(&other.certificate_pem())}),
        "Fail",
        5,
    );
    validating.create(&pp, &config).await.unwrap();
    let message = refusal(cms.create(&pp, &cm("two", json!({}))).await);
    assert!(message.contains("failed calling webhook"), "{message}");
    assert!(calls.take().is_empty());
    validating.delete("test-hooks", &dp).await.unwrap();

    // In the bundle but not naming the host the webhook is called at: refused too.
    let calls_elsewhere = Calls::default();
    let (der, pem, key) = self_signed_ca_serving(&["elsewhere.example"]);
    let addr = serve_webhooks(der, &key, calls_elsewhere.clone()).await;
    let url = format!("https://127.0.0.1:{}/deny/elsewhere", addr.port());
    let config = webhook_config(
        "ValidatingWebhookConfiguration",
        json!({"url": url, "caBundle": encode(&pem)}),
        "Fail",
        5,
    );
    validating.create(&pp, &config).await.unwrap();
    let message = refusal(cms.create(&pp, &cm("three", json!({}))).await);
    assert!(message.contains("failed calling webhook"), "{message}");
    assert!(calls_elsewhere.take().is_empty());
}

/// Reviews name who asks, with RBAC on; with everything allowed nobody is authenticated, and
/// they say `system:anonymous`.
#[tokio::test]
async fn reviews_carry_the_requesting_user_when_users_are_authenticated() {
    let open = Fixture::start().await;
    open.validating
        .create(
            &PostParams::default(),
            &webhook_config(
                "ValidatingWebhookConfiguration",
                open.url("/allow"),
                "Fail",
                5,
            ),
        )
        .await
        .unwrap();
    open.configmaps("default")
        .create(&PostParams::default(), &cm("a", json!({})))
        .await
        .unwrap();
    assert_eq!(open.calls.users()[0]["username"], "system:anonymous");

    let f = Fixture::start_with(Authorization::Rbac).await;
    f.validating
        .create(
            &PostParams::default(),
            &webhook_config("ValidatingWebhookConfiguration", f.url("/allow"), "Fail", 5),
        )
        .await
        .unwrap();
    f.configmaps("default")
        .create(&PostParams::default(), &cm("by-admin", json!({})))
        .await
        .unwrap();
    let admin = &f.calls.users()[0];
    assert_eq!(admin["username"], "caretaker-admin");
    assert!(
        admin["groups"]
            .as_array()
            .unwrap()
            .contains(&json!("system:masters")),
        "{admin}"
    );
    // A user RBAC lets write ConfigMaps.
    let rbac = |kind: &str, plural: &str| {
        let gvk = kube::api::GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", kind);
        Api::<DynamicObject>::all_with(
            f.server.client(),
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        )
    };
    let role: DynamicObject = serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "cm-writer"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]}]})).unwrap();
    rbac("ClusterRole", "clusterroles")
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: DynamicObject = serde_json::from_value(json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "alice-writes"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-writer"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]})).unwrap();
    rbac("ClusterRoleBinding", "clusterrolebindings")
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let alice = Subject::User {
        name: "alice".into(),
        groups: vec!["team".into()],
    };
    let client = kube::Client::try_from(f.server.kube_config_for(&alice).unwrap()).unwrap();
    Api::<ConfigMap>::namespaced(client, "default")
        .create(&PostParams::default(), &cm("by-alice", json!({})))
        .await
        .unwrap();
    let user = f.calls.users().last().unwrap().clone();
    assert_eq!(
        user,
        json!({"username": "alice", "groups": ["team", "system:authenticated"]})
    );
}
