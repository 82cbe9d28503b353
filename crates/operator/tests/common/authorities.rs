//! What the tests of caretaker's own kinds share: caretaker's CRDs and namespaces on the
//! embedded API server, a CertificateAuthority object, waiting for a condition, and the
//! message of a refused write, a serving certificate's Secret.

use std::future::Future;
use std::time::{Duration, Instant};

use caretaker_api::v1alpha1::{self, CertificateAuthority};
use caretaker_pki::{LeafSpec, Usage};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

pub async fn install_caretaker_crds(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in v1alpha1::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
}

pub async fn create_namespace(client: &kube::Client, name: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).unwrap();
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
}

/// Waits until `check` gives something, for up to `seconds`.
pub async fn eventually<T, F, Fut>(what: &str, seconds: u64, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(seconds);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        if Instant::now() > deadline {
            panic!("never happened within {seconds}s: {what}");
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// CertificateAuthority `name`: CN `<name>-ca`, Secret `<name>-ca` and bundle
/// `<name>-ca-bundle` in `namespace`, with the fields of `spec` set over those.
pub fn certificate_authority(name: &str, namespace: &str, spec: Value) -> CertificateAuthority {
    let mut full = json!({
        "commonName": format!("{name}-ca"),
        "secret": {"name": format!("{name}-ca"), "namespace": namespace},
        "bundle": {"name": format!("{name}-ca-bundle"), "namespace": namespace},
    });
    for (key, value) in spec.as_object().unwrap() {
        full[key] = value.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
        "metadata": {"name": name}, "spec": full,
    }))
    .unwrap()
}

/// The message of a write the API server refused.
pub fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) => format!("{} {}", status.code, status.message),
        other => panic!("expected the API server to refuse, got {other:?}"),
    }
}

/// A `kubernetes.io/tls` Secret `namespace/name` with a serving certificate for 127.0.0.1
/// signed by `ca`.
pub fn tls_secret(ca: &caretaker_pki::CertificateAuthority, namespace: &str, name: &str) -> Secret {
    let leaf = ca
        .issue(
            &LeafSpec::new("caretaker-webhook", Usage::Server)
                .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
        )
        .unwrap();
    let key = leaf.key.as_ref().unwrap().to_pem();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": ByteString(leaf.certificate_pem.into_bytes()),
            "tls.key": ByteString(key.into_bytes()),
        },
    }))
    .unwrap()
}
