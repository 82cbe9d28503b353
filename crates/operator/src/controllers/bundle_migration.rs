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
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use super::bundle::{BUNDLE_CRD, CLUSTER_BUNDLE_CRD, crd_installed, watched};
use crate::Error;
use crate::context::Context;
use crate::trust::api::{Bundle, FIELD_MANAGER};
use crate::trust::cluster_bundle::ClusterBundle;
use crate::trust::migration::{self, MIGRATION_MANAGER};
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
        let pass = migration::migrate(bundle, current.as_deref());
        if let Some(apply) = &pass.apply {
            let cluster_bundles: Api<ClusterBundle> = Api::all(self.ctx.client.clone());
            // Forced: the Bundle is what the ClusterBundle is applied from until the user takes
            // it over, and the migration's record is its own.
            let as_user = PatchParams::apply(&apply.manager).force();
            cluster_bundles
                .patch(&name, &as_user, &Patch::Apply(&apply.body))
                .await?;
            let as_migration = PatchParams::apply(MIGRATION_MANAGER).force();
            cluster_bundles
                .patch(&name, &as_migration, &Patch::Apply(&apply.record))
                .await?;
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
}
