//! `--bundle-mode migrate`: each Bundle applied as the ClusterBundle of its name, and the
//! ClusterBundle's status mirrored back ([`crate::trust::migration`]), on watch-fed stores.
//!
//! | watched | a change wakes |
//! |---|---|
//! | Bundles | the Bundle (a deleted one wakes nothing: deletion changes nothing) |
//! | ClusterBundles | the Bundle of its name |
//!
//! Targets are not written here: the ClusterBundle controller takes them over.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::bundle::{BUNDLE_CRD, CLUSTER_BUNDLE_CRD, crd_installed, watched};
use crate::Error;
use crate::context::Context;
use crate::trust::api::{Bundle, FIELD_MANAGER};
use crate::trust::cluster_bundle::ClusterBundle;
use crate::trust::migration::{self, ClusterBundleApply, MIGRATION_MANAGER, Precondition};
use crate::trust::plan::{self, BundleMode};
use crate::trust::target::OwnerApi;

const CONTROLLER: &str = "bundle_migration";

struct Migration {
    ctx: Arc<Context>,
    cluster_bundles: Store<ClusterBundle>,
}

/// Runs until its streams end, in `--bundle-mode migrate` only; idle until both CRDs are
/// installed.
pub async fn run(ctx: Arc<Context>) {
    if ctx.settings.trust.bundles.mode != BundleMode::Migrate {
        return;
    }
    let client = ctx.client.clone();
    for crd in [BUNDLE_CRD, CLUSTER_BUNDLE_CRD] {
        if !crd_installed(Api::all(client.clone()), crd).await {
            return;
        }
    }
    tracing::info!("Bundles are migrated to ClusterBundles");
    let (cluster_bundles, changes) = watched(
        Api::<ClusterBundle>::all(client.clone()),
        watcher::Config::default(),
        |_| {},
    );
    let wakes = changes.map(|cb: ClusterBundle| ObjectRef::<Bundle>::new(&cb.name_any()));
    let stop = ctx.shutdown.signal();
    let migration = Arc::new(Migration {
        ctx,
        cluster_bundles,
    });
    Controller::new(Api::<Bundle>::all(client), watcher::Config::default())
        .reconcile_on(wakes)
        .graceful_shutdown_on(stop)
        .run(
            |bundle, migration: Arc<Migration>| async move {
                let _timer = migration.ctx.reconcile_started(CONTROLLER);
                migration.reconcile(&bundle).await
            },
            |_, error, migration| super::requeue_after(CONTROLLER, error, &migration.ctx),
            migration,
        )
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "Bundle migration failed");
            }
        })
        .await;
}

impl Migration {
    async fn reconcile(&self, bundle: &Bundle) -> Result<Action, Error> {
        if bundle.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        self.cluster_bundles
            .wait_until_ready()
            .await
            .map_err(|_| Error::CacheStopped)?;
        let name = bundle.name_any();
        let current = self.cluster_bundles.get(&ObjectRef::new(&name));
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let pass = migration::migrate(bundle, current.as_deref(), &now);
        if let Some(apply) = &pass.apply
            && !self.apply(&name, apply).await?
        {
            return Ok(Action::await_change());
        }
        if let Some((condition, default_ca_version)) = &pass.mirror {
            let version = default_ca_version.as_deref();
            let body = plan::status_body(OwnerApi::Bundle, &name, condition, version);
            let bundles: Api<Bundle> = Api::all(self.ctx.client.clone());
            let apply = PatchParams::apply(FIELD_MANAGER).force();
            bundles
                .patch_status(&name, &apply, &Patch::Apply(&body))
                .await?;
        }
        if let Some(event) = pass.event {
            self.ctx.event(&bundle.object_ref(&()), event).await;
        }
        Ok(Action::await_change())
    }

    /// Writes `apply` to the ClusterBundle `name` only while it is as the decision saw it:
    /// applied on the resourceVersion seen when it was this Bundle's (409 Conflict once it has
    /// changed: the next pass decides again); when the cache saw none, only if a read from the
    /// API server still finds none. Server-side apply has no create-only precondition, so a
    /// ClusterBundle created between that read and the apply (milliseconds) is the one case
    /// left; a create would record the user's manager as an Update, which their own later
    /// applies would conflict with.
    /// Whether it was written.
    async fn apply(&self, name: &str, apply: &ClusterBundleApply) -> Result<bool, Error> {
        let cluster_bundles: Api<ClusterBundle> = Api::all(self.ctx.client.clone());
        let version = match &apply.precondition {
            Precondition::Absent => {
                if cluster_bundles.get_metadata_opt(name).await?.is_some() {
                    // Made since the cache saw none: its watch event wakes the next pass.
                    return Ok(false);
                }
                None
            }
            Precondition::At(version) => Some(version.clone()),
        };
        // Forced: the Bundle is what the ClusterBundle is applied from until the user takes it
        // over, and the migration's record is its own.
        let as_user = PatchParams::apply(&apply.manager).force();
        let body = at_version(&apply.body, version);
        let written = cluster_bundles
            .patch(name, &as_user, &Patch::Apply(&body))
            .await?;
        let as_migration = PatchParams::apply(MIGRATION_MANAGER).force();
        let record = at_version(&apply.record, written.resource_version());
        cluster_bundles
            .patch(name, &as_migration, &Patch::Apply(&record))
            .await?;
        Ok(true)
    }
}

/// `body` with `resourceVersion` as its precondition (the API server refuses it with 409
/// Conflict once the object has changed since).
fn at_version(body: &Value, version: Option<String>) -> Value {
    let mut body = body.clone();
    if let Some(version) = version {
        body["metadata"]["resourceVersion"] = Value::String(version);
    }
    body
}
