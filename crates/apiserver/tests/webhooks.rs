//! Admission webhooks called over TLS: a real HTTPS webhook server in the test process.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use base64::Engine;
use caretaker_apiserver::ApiServer;
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::discovery::ApiResource;
use rustls::pki_types::pem::PemObject;
use serde_json::{Value, json};

fn new_ca() -> CertificateAuthority {
    CertificateAuthority::create(&CaSpec::new("webhooks-ca")).unwrap()
}

/// An HTTPS admission webhook server: /allow, /deny, /mutate, /slow.
async fn start_webhook_server(ca: &CertificateAuthority, calls: Arc<AtomicUsize>) -> SocketAddr {
    caretaker_apiserver::install_crypto_provider();
    let serving = ca
        .issue(
            &LeafSpec::new("hooks.webhooks.svc", Usage::Server)
                .with_dns_names(["hooks.webhooks.svc"])
                .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
        )
        .unwrap();
    let key_pem = serving.key.as_ref().unwrap().to_pem();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![serving.certificate_der.clone().into()],
            rustls::pki_types::PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    async fn respond(
        State(calls): State<Arc<AtomicUsize>>,
        path: axum::http::Uri,
        Json(review): Json<Value>,
    ) -> Json<Value> {
        calls.fetch_add(1, Ordering::SeqCst);
        let uid = review["request"]["uid"].clone();
        let response = match path.path() {
            "/deny" => {
                json!({"uid": uid, "allowed": false, "status": {"code": 403, "reason": "Forbidden", "message": "no configmaps today"}})
            }
            "/mutate" => {
                let patch = json!([{"op": "add", "path": "/data/mutated", "value": "yes"}]);
                json!({"uid": uid, "allowed": true, "patchType": "JSONPatch",
                    "patch": base64::engine::general_purpose::STANDARD.encode(patch.to_string())})
            }
            "/slow" => {
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
        .route("/allow", post(respond))
        .route("/deny", post(respond))
        .route("/mutate", post(respond))
        .route("/slow", post(respond))
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

fn webhook_config(
    kind: &str,
    client_config: Value,
    failure_policy: &str,
    timeout: u64,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind, "metadata": {"name": "test-hooks"},
        "webhooks": [{
            "name": "configmaps.example.com", "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"], "resources": ["configmaps"], "scope": "*"}],
            "failurePolicy": failure_policy, "sideEffects": "None", "admissionReviewVersions": ["v1"], "timeoutSeconds": timeout
        }]
    }))
    .unwrap()
}

fn status(e: kube::Error) -> (u16, String, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone(), s.message.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn webhooks_allow_deny_mutate_and_fail() {
    let ca = new_ca();
    let calls = Arc::new(AtomicUsize::new(0));
    let hook_addr = start_webhook_server(&ca, calls.clone()).await;
    let server = ApiServer::builder()
        .webhook_service("webhooks", "hooks", hook_addr)
        .start()
        .await
        .unwrap();
    let client = server.client();
    let validating: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "ValidatingWebhookConfiguration",
            ),
            "validatingwebhookconfigurations",
        ),
    );
    let mutating: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(
                "admissionregistration.k8s.io",
                "v1",
                "MutatingWebhookConfiguration",
            ),
            "mutatingwebhookconfigurations",
        ),
    );
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca.certificate_pem());
    let url = |path: &str| json!({"url": format!("https://127.0.0.1:{}{path}", hook_addr.port()), "caBundle": ca_bundle});
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}})).unwrap()
    };
    let pp = PostParams::default();
    let dp = DeleteParams::default();

    // Allowed.
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", url("/allow"), "Fail", 5),
        )
        .await
        .unwrap();
    cms.create(&pp, &cm("allowed")).await.unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    validating.delete("test-hooks", &dp).await.unwrap();

    // Denied, with the webhook's status.
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", url("/deny"), "Fail", 5),
        )
        .await
        .unwrap();
    let (code, reason, message) = status(cms.create(&pp, &cm("denied")).await.unwrap_err());
    assert_eq!((code, reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        message,
        "admission webhook \"configmaps.example.com\" denied the request: no configmaps today"
    );
    assert!(cms.get_opt("denied").await.unwrap().is_none());
    validating.delete("test-hooks", &dp).await.unwrap();

    // The denying webhook also sees deletions once DELETE is in its rules.
    let mut deny_deletes =
        webhook_config("ValidatingWebhookConfiguration", url("/deny"), "Fail", 5);
    deny_deletes.data["webhooks"][0]["rules"][0]["operations"] = json!(["DELETE"]);
    validating.create(&pp, &deny_deletes).await.unwrap();
    let (code, _, message) = status(cms.delete("allowed", &dp).await.unwrap_err());
    assert_eq!(code, 403);
    assert!(message.contains("no configmaps today"), "{message}");
    assert!(cms.get_opt("allowed").await.unwrap().is_some());
    validating.delete("test-hooks", &dp).await.unwrap();

    // Mutated, through a service reference resolved by the service map.
    let service = json!({"service": {"namespace": "webhooks", "name": "hooks", "path": "/mutate", "port": 443}, "caBundle": ca_bundle});
    mutating
        .create(
            &pp,
            &webhook_config("MutatingWebhookConfiguration", service, "Fail", 5),
        )
        .await
        .unwrap();
    let created = cms.create(&pp, &cm("mutated")).await.unwrap();
    assert_eq!(created.data.unwrap()["mutated"], "yes");
    mutating.delete("test-hooks", &dp).await.unwrap();

    // Unreachable: Fail refuses the request, Ignore lets it through.
    let nowhere = json!({"url": "https://127.0.0.1:1/allow", "caBundle": ca_bundle});
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", nowhere.clone(), "Fail", 5),
        )
        .await
        .unwrap();
    let (code, reason, message) = status(cms.create(&pp, &cm("unreachable")).await.unwrap_err());
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
    cms.create(&pp, &cm("ignored")).await.unwrap();
    validating.delete("test-hooks", &dp).await.unwrap();

    // A caBundle that did not sign the webhook's certificate: the TLS handshake fails.
    let other = base64::engine::general_purpose::STANDARD.encode(new_ca().certificate_pem());
    let wrong_ca =
        json!({"url": format!("https://127.0.0.1:{}/allow", hook_addr.port()), "caBundle": other});
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", wrong_ca, "Fail", 5),
        )
        .await
        .unwrap();
    let (code, _, message) = status(cms.create(&pp, &cm("wrong-ca")).await.unwrap_err());
    assert_eq!(code, 500);
    assert!(message.contains("certificate"), "{message}");
    validating.delete("test-hooks", &dp).await.unwrap();

    // timeoutSeconds.
    validating
        .create(
            &pp,
            &webhook_config("ValidatingWebhookConfiguration", url("/slow"), "Fail", 1),
        )
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (code, _, message) = status(cms.create(&pp, &cm("slow")).await.unwrap_err());
    assert_eq!(code, 500);
    assert!(message.contains("context deadline exceeded"), "{message}");
    // /slow answers after 3 s: failing earlier proves timeoutSeconds was applied.
    assert!(started.elapsed() < Duration::from_millis(2900));
}
