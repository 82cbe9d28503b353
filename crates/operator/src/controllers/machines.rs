//! The Machine controller: one watch on Cluster API Machines, each reconcile dispatching to the
//! per-Machine capabilities.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::{Api, DynamicObject};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;

use super::{Next, machine_refresh, machine_upgrade};
use crate::Error;
use crate::context::Context;
use crate::machine::{self, MachineView};

/// Runs the controller until the stream ends.
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let resource = machine::api_resource();
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(ctx.client.clone(), ns, &resource),
        None => Api::all_with(ctx.client.clone(), &resource),
    };
    Controller::new_with(api, watcher::Config::default(), resource)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::debug!(error = %e, "reconcile failed");
            }
        })
        .await;
}

async fn reconcile(object: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    let view = MachineView::from_object(&object);
    let refresh = machine_refresh::reconcile(&object, &view, &ctx).await?;
    let upgrade = machine_upgrade::reconcile(&object, &view, &ctx).await?;
    Ok(match refresh.sooner(upgrade) {
        Next::AwaitChange => Action::await_change(),
        Next::After(wait) => Action::requeue(wait),
    })
}

fn error_policy(_machine: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(error = %error, category = error.metric_label(), "machine reconcile failed");
    Action::requeue(ctx.settings.retry_base)
}
