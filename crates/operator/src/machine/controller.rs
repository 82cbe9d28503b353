//! The Machine controller: one watch on Cluster API Machines, each reconcile making one `pass`
//! of each per-Machine capability: observe the Machine, decide with the capability's pure
//! `plan` ([`refresh::plan`], [`upgrade::plan`]), record the plan's update and start its work.
//! The work, calls to the node, is the capability's own (`work::refresh::run`,
//! `work::upgrade::run`, in [`super::work`]) and records its end through `MachineHandle::record`
//! ([`super::handle`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::api::DynamicObject;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::Store;
use time::OffsetDateTime;

use super::handle::MachineHandle;
use super::work;
use crate::context::Context;
use crate::machine::cache::MachineChanges;
use crate::machine::plan::{MachinePlan, Observed};
use crate::machine::{MachineView, refresh, upgrade};
use crate::metrics::CertificateKind;
use crate::schedule::{Next, busy_retry};
use crate::timestamp::parse_time;
use crate::{Error, Settings};
use caretaker_api::names::{self, Operation};

const REFRESH: Operation = Operation::RefreshCertificates;
const UPGRADE: Operation = Operation::InPlaceUpgrade;

/// The controller's name in logs and metrics.
const CONTROLLER: &str = "machine";

/// Runs the controller over the shared Machine cache until its stream of changes ends.
pub async fn run(ctx: Arc<Context>, machines: Store<DynamicObject>, changes: MachineChanges) {
    let metrics = ctx.metrics.clone();
    Controller::for_stream_with(
        changes,
        machines,
        caretaker_api::cluster_api::machine_api_resource(),
    )
    .graceful_shutdown_on(ctx.shutdown.signal())
    .run(reconcile, error_policy, ctx)
    .for_each(|result| {
        match result {
            // A change of a Machine no longer in the cache: it is gone, and its expiry
            // with it.
            Err(controller::Error::ObjectNotFound(gone)) => metrics.remove_certificate_expiry(
                CertificateKind::Machine,
                gone.namespace.as_deref().unwrap_or_default(),
                &gone.name,
            ),
            Err(e) => tracing::debug!(error = %e, "reconcile failed"),
            Ok(_) => {}
        }
        std::future::ready(())
    })
    .await;
}

async fn reconcile(object: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    let _timer = ctx.reconcile_started(CONTROLLER);
    let view = MachineView::from_object(&object);
    follow_expiry(&ctx, &view);
    let machine = MachineHandle {
        ctx,
        object,
        view,
        written: None,
    };
    let refresh = pass(&machine, REFRESH, refresh::plan, work::refresh::run).await?;
    let upgrade = pass(&machine, UPGRADE, upgrade::plan, work::upgrade::run).await?;
    Ok(refresh.sooner(upgrade).into())
}

fn error_policy(_machine: Arc<DynamicObject>, error: &Error, ctx: Arc<Context>) -> Action {
    crate::runtime::requeue_after(CONTROLLER, error, &ctx)
}

/// The Machine's series of `caretaker_certificate_expiration_seconds`: its certificates'
/// earliest expiry as its annotation says, or none while it has none.
fn follow_expiry(ctx: &Context, view: &MachineView) {
    let (kind, namespace, name) = (CertificateKind::Machine, &view.namespace, &view.name);
    match parse_time(view.annotation(names::CERTIFICATES_EXPIRY)) {
        Some(expiry) => ctx
            .metrics
            .set_certificate_expiry(kind, namespace, name, expiry),
        None => ctx.metrics.remove_certificate_expiry(kind, namespace, name),
    }
}

/// One pass of `operation` over a Machine: observe it, decide with `plan` (pure), and carry
/// the plan out: record its update, then start its work in the background (`run` does it).
async fn pass<W, F>(
    machine: &MachineHandle,
    operation: Operation,
    plan: fn(&Observed, &Settings) -> MachinePlan<W>,
    run: impl FnOnce(MachineHandle, W) -> F,
) -> Result<Next, Error>
where
    F: Future<Output = ()> + Send + 'static,
{
    let ctx = &machine.ctx;
    let seen = Observed {
        machine: &machine.view,
        now: OffsetDateTime::now_utc(),
        running: ctx.running_for(operation, &machine.view),
    };
    let plan = plan(&seen, &ctx.settings);
    let written = machine.record(plan.update).await?;
    let worker = MachineHandle {
        written,
        ..machine.clone()
    };
    if let Some(work) = plan.work
        && !ctx.spawn_for(operation, &machine.view, run(worker, work))
    {
        // The plan saw none running and a Machine's reconciles never overlap, so this work
        // started in between: look again soon.
        return Ok(Next::After(busy_retry(Duration::ZERO)));
    }
    Ok(plan.next)
}
