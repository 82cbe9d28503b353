//! What kube-controller-manager puts in every namespace, and clients wait for: a `default`
//! ServiceAccount and a `kube-root-ca.crt` ConfigMap holding the CA the server is verified
//! with; both made again when deleted, the ConfigMap's data put back when changed.

use std::time::Duration;

use caretaker_apiserver::ApiServer;
use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::wait::{Condition, await_condition};
use serde_json::json;

mod common;

/// Waits (10 s at most, a hang's bound, not a latency's) until `name` in `api` meets `cond`.
async fn until<K>(api: &Api<K>, name: &str, cond: impl Condition<K>) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    tokio::time::timeout(
        Duration::from_secs(10),
        await_condition(api.clone(), name, cond),
    )
    .await
    .unwrap_or_else(|_| panic!("{name} never came"))
    .unwrap()
    .unwrap()
}

fn holds_ca(ca: &str) -> impl Condition<ConfigMap> + '_ {
    move |cm: Option<&ConfigMap>| {
        cm.and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get("ca.crt"))
            .is_some_and(|pem| pem == ca)
    }
}

fn exists<K>(object: Option<&K>) -> bool {
    object.is_some()
}

#[tokio::test]
async fn every_namespace_holds_a_default_service_account_and_the_root_ca() {
    let server = ApiServer::builder().tls(true).start().await.unwrap();
    let ca = server.ca_pem().unwrap().to_string();
    let client = server.client();

    // The namespaces there at start, and a new one.
    common::create_namespace(&client, "team", json!({})).await;
    for namespace in ["default", "kube-system", "team"] {
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        until(&accounts, "default", exists).await;
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        let root = until(&config_maps, "kube-root-ca.crt", holds_ca(&ca)).await;
        let annotations = root.metadata.annotations.unwrap_or_default();
        assert!(
            annotations["kubernetes.io/description"].starts_with("Contains a CA bundle"),
            "{annotations:?}"
        );
    }

    // Deleted: made again.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "team");
    let first = accounts.get("default").await.unwrap().metadata.uid.unwrap();
    accounts
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    until(&accounts, "default", move |sa: Option<&ServiceAccount>| {
        sa.and_then(|sa| sa.metadata.uid.as_deref())
            .is_some_and(|uid| uid != first)
    })
    .await;
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "team");
    let first = config_maps.get("kube-root-ca.crt").await.unwrap();
    config_maps
        .delete("kube-root-ca.crt", &DeleteParams::default())
        .await
        .unwrap();
    let again = until(
        &config_maps,
        "kube-root-ca.crt",
        move |cm: Option<&ConfigMap>| cm.is_some_and(|cm| cm.metadata.uid != first.metadata.uid),
    )
    .await;
    assert_eq!(again.data.unwrap()["ca.crt"], ca);

    // Changed: put back.
    let forged = json!({"data": {"ca.crt": "a CA of someone else's"}});
    config_maps
        .patch(
            "kube-root-ca.crt",
            &PatchParams::default(),
            &Patch::Merge(&forged),
        )
        .await
        .unwrap();
    let restored = until(&config_maps, "kube-root-ca.crt", holds_ca(&ca)).await;
    assert_eq!(restored.data.unwrap().len(), 1);
}

/// Over plain HTTP there is no CA to publish: the ConfigMap is there (clients wait for it),
/// its `ca.crt` empty.
#[tokio::test]
async fn without_tls_the_root_ca_config_map_is_empty() {
    let server = caretaker_apiserver::TestServer::start().await;
    let config_maps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    until(&config_maps, "kube-root-ca.crt", holds_ca("")).await;
}
