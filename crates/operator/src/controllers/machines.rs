//! The Machine controller: one watch on Cluster API Machines, each reconcile dispatching to the
//! per-Machine capabilities.

use std::sync::Arc;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::Store;

use super::cache::MachineChanges;
use super::{machine_refresh, machine_upgrade};
use crate::Error;
use crate::context::Context;
use crate::machine::{self, MachineView};

/// Runs the controller over the shared Machine cache until its stream of changes ends.
pub async fn run(ctx: Arc<Context>, machines: Store<DynamicObject>, changes: MachineChanges) {
    Controller::for_stream_with(changes, machines, machine::api_resource())
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
    Ok(refresh.sooner(upgrade).into())
}

fn error_policy(_machine: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    super::requeue_after("machine", error, &ctx)
}
