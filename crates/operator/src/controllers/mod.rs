//! [`run`], which starts every controller, and [`ca_secrets`], which drops cached cluster CAs
//! when their Secrets change. Each feature's glue is in its folder:
//! [`crate::authority::controller`] (caretaker's own CAs and the certificates they issue),
//! [`crate::machine::controller`] (one Controller over Cluster API Machines,
//! each reconcile carrying out every per-Machine capability), [`crate::rollout::controller`]
//! (one Controller per parent kind: Cluster, CK8sControlPlane, MachineDeployment; both read
//! Machines from one watch-fed [`crate::machine::cache`]), [`crate::injection::controller`] (the
//! `caBundle` fields of webhook configurations, CRD conversion webhooks and APIServices),
//! [`crate::trust::controller`] (trust-manager's Bundles and ClusterBundles, or their
//! migration), and [`crate::etcd::controller`] (EtcdCertificates). [`run`] tells the readiness
//! ([`crate::metrics::Readiness`]) when the caches have synced. Every reconcile is counted and
//! timed in [`crate::metrics`] under its controller's name, every failed one by its category
//! ([`crate::runtime::requeue_after`]).

pub mod ca_secrets;

use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject};

use crate::context::Context;
use crate::machine::cache;
use crate::rollout::parent::{ParentKind, matters_to_clusters, matters_to_parents};

/// Runs every controller of the operator, over the Machines of `namespace` (all namespaces
/// when `None`), until their streams end.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let api = |resource: &ApiResource| -> Api<DynamicObject> {
        match &namespace {
            Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, resource),
            None => Api::all_with(ctx.client.clone(), resource),
        }
    };
    let (machine_resource, deployment_resource) = (
        caretaker_api::cluster_api::machine_api_resource(),
        caretaker_api::cluster_api::machine_deployment_api_resource(),
    );
    let (caches, keep_caches, mut changes) = cache::Caches::new(
        api(&machine_resource),
        machine_resource,
        api(&deployment_resource),
        deployment_resource,
        // The Machine controller hears of every change, each parent kind's only of those that
        // can change a pass's decision.
        std::iter::once(cache::every_change as cache::ChangeFilter)
            .chain(ParentKind::ALL.map(|kind| match kind {
                ParentKind::Cluster => matters_to_clusters as cache::ChangeFilter,
                ParentKind::ControlPlane | ParentKind::MachineDeployment => matters_to_parents,
            }))
            .collect(),
    );
    let machine_changes = changes.remove(0);
    // `/readyz` says ready once the controllers stop waiting on the caches, or at once in a
    // cluster without Cluster API (one that only uses caretaker's CAs): the Machine watch
    // cannot list there, and the Machine controllers idle until its CRDs appear.
    let ready = {
        let (caches, readiness, client) =
            (caches.clone(), ctx.readiness.clone(), ctx.client.clone());
        async move {
            tokio::select! {
                synced = caches.wait_until_ready() => if synced.is_err() {
                    return;
                },
                () = cluster_api_absent(client) => {
                    tracing::info!(crd = MACHINE_CRD, "Cluster API is not installed: the Machine controllers wait for its CRDs");
                }
            }
            readiness.caches_synced();
        }
    };
    let secrets = match &namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    futures::join!(
        crate::authority::controller::run(ctx.clone(), namespace.clone()),
        crate::injection::controller::run(ctx.clone(), namespace.clone()),
        ca_secrets::run(ctx.clone(), secrets),
        keep_caches,
        ready,
        crate::machine::controller::run(ctx.clone(), caches.machines(), machine_changes),
        crate::rollout::controller::run(ctx.clone(), api, caches, changes),
        crate::trust::controller::run(ctx.clone()),
        crate::trust::controller::migration::run(ctx.clone()),
        crate::etcd::controller::run(ctx.clone()),
    );
}

/// The CRD of Cluster API's Machines.
const MACHINE_CRD: &str = "machines.cluster.x-k8s.io";

/// Returns once the API server has said that Cluster API's Machine CRD is not installed;
/// never when it is (asking again after a failed request).
async fn cluster_api_absent(client: kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    loop {
        match crds.get_opt(MACHINE_CRD).await {
            Ok(None) => return,
            Ok(Some(_)) => return std::future::pending().await,
            Err(e) => tracing::debug!(error = %e, "cannot tell whether Cluster API is installed"),
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}
