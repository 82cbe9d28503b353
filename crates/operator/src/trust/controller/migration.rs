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
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::Value;

use super::{BUNDLE_CRD, CLUSTER_BUNDLE_CRD, watched};
use crate::Error;
use crate::context::Context;
use crate::runtime::crd_installed;
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
            |_, error, migration| crate::runtime::requeue_after(CONTROLLER, error, &migration.ctx),
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
    /// changed: the next pass decides again). When the cache saw none, it is first created
    /// (POST, create-only: server-side apply has none), so that a ClusterBundle made meanwhile,
    /// however late, is refused with 409 AlreadyExists and judged by the next pass, never
    /// written over; the apply then lands on the version created. The create is the
    /// migration's own (its field manager), and the forced apply that follows takes every
    /// field over for the user's manager, so their later applies own them.
    /// Whether it was written.
    async fn apply(&self, name: &str, apply: &ClusterBundleApply) -> Result<bool, Error> {
        let cluster_bundles: Api<ClusterBundle> = Api::all(self.ctx.client.clone());
        let created = apply.precondition == Precondition::Absent;
        let version = match &apply.precondition {
            Precondition::Absent => match create_only(&self.ctx.client, &apply.body).await? {
                Some(version) => version,
                // Made since the cache saw none: its watch event wakes the next pass.
                None => return Ok(false),
            },
            Precondition::At(version) => Some(version.clone()),
        };
        // Forced: the Bundle is what the ClusterBundle is applied from until the user takes it
        // over, and the migration's record is its own.
        let as_user = PatchParams::apply(&apply.manager).force();
        let body = at_version(&apply.body, version);
        let mut written = cluster_bundles
            .patch(name, &as_user, &Patch::Apply(&body))
            .await?;
        if created {
            // The create's record (the migration's Update entry) would keep co-owning every
            // field the user's apply also set: dropped, so the user's manager alone owns them.
            let kept: Vec<_> = (written.metadata.managed_fields.iter().flatten())
                .filter(|e| {
                    !(e.manager.as_deref() == Some(MIGRATION_MANAGER)
                        && e.operation.as_deref() == Some("Update"))
                })
                .cloned()
                .collect();
            let fields = serde_json::json!({"metadata": {
                "resourceVersion": written.resource_version(),
                "managedFields": kept,
            }});
            let params = PatchParams {
                field_manager: Some(MIGRATION_MANAGER.into()),
                ..Default::default()
            };
            written = cluster_bundles
                .patch(name, &params, &Patch::Merge(&fields))
                .await?;
        }
        let as_migration = PatchParams::apply(MIGRATION_MANAGER).force();
        let record = at_version(&apply.record, written.resource_version());
        cluster_bundles
            .patch(name, &as_migration, &Patch::Apply(&record))
            .await?;
        Ok(true)
    }
}

/// Creates the ClusterBundle `body` (POST, as the migration); its resourceVersion, or `None`
/// when one of its name exists (409).
async fn create_only(client: &kube::Client, body: &Value) -> Result<Option<Option<String>>, Error> {
    let resource = ApiResource::erase::<ClusterBundle>(&());
    let object: DynamicObject =
        serde_json::from_value(body.clone()).map_err(kube::Error::SerdeError)?;
    let params = PostParams {
        field_manager: Some(MIGRATION_MANAGER.into()),
        ..Default::default()
    };
    match Api::<DynamicObject>::all_with(client.clone(), &resource)
        .create(&params, &object)
        .await
    {
        Ok(created) => Ok(Some(created.resource_version())),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(e) => Err(e.into()),
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
