//! The trust bundle test world: the embedded API server with trust-manager's CRDs, the trust
//! namespace, and the Bundle and ClusterBundle controllers started with chosen settings.

use std::sync::Arc;

use caretaker_operator::metrics::Metrics;
use caretaker_operator::trust::api::Bundle;
use caretaker_operator::trust::controller::{self as bundle, migration as bundle_migration};
use caretaker_operator::{Context, Settings};
use caretaker_pki::{CaSpec, CertificateAuthority, CertificatePool, PoolFilters};
use caretaker_testkit::capi_objects::install_trust_manager_crds;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::authorities::{create_namespace, eventually};

pub const TRUST: &str = "cert-manager";

pub struct Setup {
    pub server: caretaker_apiserver::ApiServer,
    pub client: kube::Client,
    controller: Option<tokio::task::JoinHandle<()>>,
    pub metrics: Arc<Metrics>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.stop();
    }
}

pub async fn setup(namespaces: &[&str]) -> Setup {
    setup_on(caretaker_apiserver::TestServer::start().await, namespaces).await
}

/// [`setup`] on `server` (one with RBAC on, for tests that act as a restricted user).
pub async fn setup_on(server: caretaker_apiserver::ApiServer, namespaces: &[&str]) -> Setup {
    let client = server.client();
    install_trust_manager_crds(&client).await.unwrap();
    for namespace in [TRUST].iter().chain(namespaces) {
        create_namespace(&client, namespace).await;
    }
    Setup {
        server,
        client,
        controller: None,
        metrics: Metrics::new(),
    }
}

impl Setup {
    pub fn start(&mut self) {
        self.start_with(Settings::default());
    }

    /// Stops the controllers (as a restart or a new version would).
    pub fn stop(&mut self) {
        if let Some(controller) = self.controller.take() {
            controller.abort();
        }
    }

    pub fn start_with(&mut self, settings: Settings) {
        self.stop();
        let ctx = Context::new(self.client.clone(), settings);
        self.metrics = ctx.metrics.clone();
        self.controller = Some(tokio::spawn(async move {
            futures::join!(bundle::run(ctx.clone()), bundle_migration::run(ctx));
        }));
    }

    pub fn config_maps(&self, namespace: &str) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), namespace)
    }

    pub fn bundles(&self) -> Api<Bundle> {
        Api::all(self.client.clone())
    }

    pub async fn create_bundle(&self, bundle: Value) {
        let bundle: Bundle = serde_json::from_value(bundle).unwrap();
        self.bundles()
            .create(&PostParams::default(), &bundle)
            .await
            .unwrap();
    }

    pub async fn put_source(&self, name: &str, pem: &str) {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"ca.crt": pem}});
        self.config_maps(TRUST)
            .patch(name, &PatchParams::apply("test"), &Patch::Apply(&object))
            .await
            .unwrap();
    }

    /// The target `trust` in `namespace` once it holds `pem` under `ca.crt`.
    pub async fn target_holding(&self, namespace: &str, pem: &str) -> ConfigMap {
        let configs = self.config_maps(namespace);
        eventually(&format!("{namespace}/trust holds the bundle"), 20, || {
            let configs = configs.clone();
            async move {
                let found = configs.get_opt("trust").await.unwrap()?;
                (found.data.as_ref()?.get("ca.crt")? == pem).then_some(found)
            }
        })
        .await
    }

    pub async fn synced(&self) -> (String, String, String) {
        let bundles = self.bundles();
        eventually("the Bundle has a Synced condition", 20, || {
            let bundles = bundles.clone();
            async move {
                let bundle = bundles.get("trust").await.unwrap();
                let condition = bundle
                    .status?
                    .conditions?
                    .into_iter()
                    .find(|c| c.type_ == "Synced")?;
                Some((condition.status, condition.reason, condition.message))
            }
        })
        .await
    }

    /// The reason and message of the Bundle's `Synced` condition once it is False.
    pub async fn not_synced(&self) -> (String, String) {
        let bundles = self.bundles();
        eventually("Synced turns False", 20, || {
            let bundles = bundles.clone();
            async move {
                let bundle = bundles.get("trust").await.unwrap();
                let condition = bundle.status?.conditions?.remove(0);
                (condition.status == "False").then_some((condition.reason, condition.message))
            }
        })
        .await
    }

    /// Waits until the target in `namespace` is gone.
    pub async fn target_gone(&self, namespace: &str) {
        let configs = self.config_maps(namespace);
        eventually(&format!("{namespace}/trust is gone"), 20, || {
            let configs = configs.clone();
            async move {
                configs
                    .get_opt("trust")
                    .await
                    .unwrap()
                    .is_none()
                    .then_some(())
            }
        })
        .await;
    }

    /// How many Bundle passes have ended.
    pub fn passes(&self) -> u64 {
        let text = self.metrics.encode();
        text.lines()
            .find(|l| l.starts_with("caretaker_reconcile_total{controller=\"bundle\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .map(|n| n.parse().unwrap())
            .unwrap_or(0)
    }

    pub async fn events(&self, reason: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), "default");
        let list = events.list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("trust"))
            .collect()
    }
}

/// A world serving [`simple_bundle`] from one CA's source with the default settings, once
/// `namespaces[0]`'s target holds it; and that CA's PEM.
pub async fn serving(namespaces: &[&str]) -> (Setup, String) {
    let mut setup = setup(namespaces).await;
    let a = ca("root-a");
    setup.put_source("roots", &a).await;
    setup.create_bundle(simple_bundle(None)).await;
    setup.start();
    setup.target_holding(namespaces[0], &canonical(&[&a])).await;
    (setup, a)
}

pub async fn all_namespaces(client: &kube::Client) -> Vec<String> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let list = namespaces.list(&ListParams::default()).await.unwrap();
    list.items
        .into_iter()
        .map(|n| n.metadata.name.unwrap())
        .collect()
}

pub fn ca(name: &str) -> String {
    CertificateAuthority::create(&CaSpec::new(name))
        .unwrap()
        .certificate_pem()
}

/// The bundle trust-manager writes for these PEM texts.
pub fn canonical(texts: &[&str]) -> String {
    let mut pool = CertificatePool::new(PoolFilters::default(), time::OffsetDateTime::now_utc());
    for text in texts {
        pool.add_pem(text.as_bytes()).unwrap();
    }
    pool.to_pem()
}

pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn simple_bundle(selector: Option<Value>) -> Value {
    let mut target = json!({"configMap": {"key": "ca.crt"}});
    if let Some(selector) = selector {
        target["namespaceSelector"] = selector;
    }
    json!({
        "apiVersion": "trust.cert-manager.io/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": "trust"},
        "spec": {
            "sources": [{"configMap": {"name": "roots", "key": "ca.crt"}}],
            "target": target,
        },
    })
}
