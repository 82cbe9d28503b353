//! The kube-rs glue. [`machines`] runs one Controller over Cluster API Machines whose reconcile
//! carries out each per-Machine capability in turn: [`machine_refresh`] and
//! [`machine_upgrade`]. [`rollout`] runs one Controller per parent kind (Cluster,
//! CK8sControlPlane, MachineDeployment). All of them read Machines from one watch-fed
//! [`cache`]. [`ca_secrets`] drops cached CAs when their Secrets change. [`run`] starts
//! everything.

pub mod ca_secrets;
pub mod cache;
pub mod machine_refresh;
pub mod machine_upgrade;
pub mod machines;
pub mod rollout;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::Error;
use crate::context::Context;
use crate::machine;
use crate::names::RequestBookkeeping;
use crate::schedule::{Next, busy_retry, retry_at};
use crate::timestamp::{format_time, parse_time};

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
        machine::api_resource(),
        machine::machine_deployment_api_resource(),
    );
    let (caches, keep_caches, mut changes) = cache::Caches::new(
        api(&machine_resource),
        machine_resource,
        api(&deployment_resource),
        deployment_resource,
        1 + crate::rollout::parent::ParentKind::ALL.len(),
    );
    let machine_changes = changes.remove(0);
    let secrets = match &namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    futures::join!(
        ca_secrets::run(ctx.clone(), secrets),
        keep_caches,
        machines::run(ctx.clone(), caches.machines(), machine_changes),
        rollout::run(ctx.clone(), api, caches, changes),
    );
}

impl From<Next> for Action {
    fn from(next: Next) -> Action {
        match next {
            Next::AwaitChange => Action::await_change(),
            Next::After(wait) => Action::requeue(wait),
        }
    }
}

/// After a failed reconcile of one of `controller`'s objects: the error's category decides
/// when it runs again.
fn requeue_after(controller: &'static str, error: &Error, ctx: &Context) -> Action {
    tracing::warn!(controller, error = %error, category = error.metric_label(), "reconcile failed");
    error.requeue(ctx.settings.retry_base).into()
}

/// When to look again at a Machine whose `capability` work is already running in this process.
pub fn busy(ctx: &Context, capability: &str, machine: &machine::MachineView) -> Next {
    Next::After(busy_retry(ctx.running_for(capability, machine)))
}

/// The annotation changes that schedule the attempt after failed attempt number `attempt`,
/// with exponential backoff from `base`.
pub fn retry_changes(
    keys: &RequestBookkeeping,
    attempt: u32,
    base: Duration,
    error: &Error,
) -> BTreeMap<String, Value> {
    let now = OffsetDateTime::now_utc();
    BTreeMap::from([
        (keys.attempts.to_string(), json!(attempt.to_string())),
        (
            keys.retry_at.to_string(),
            json!(format_time(retry_at(now, base, attempt))),
        ),
        (keys.last_error.to_string(), json!(error.to_string())),
    ])
}

/// The annotation changes that make a Machine wait for an agent that answered busy (another
/// step runs on the node): look again after [`busy_retry`] of how long the request has run
/// since `started_at`. Not a failed attempt: `keys.attempts` is left as it is.
pub fn busy_wait_changes(
    keys: &RequestBookkeeping,
    started_at: Option<&str>,
    why: &str,
) -> BTreeMap<String, Value> {
    let now = OffsetDateTime::now_utc();
    let running_for = parse_time(started_at)
        .and_then(|started| Duration::try_from(now - started).ok())
        .unwrap_or_default();
    BTreeMap::from([
        (
            keys.retry_at.to_string(),
            json!(format_time(now + busy_retry(running_for))),
        ),
        (
            keys.last_error.to_string(),
            json!(format!("waiting: {why}")),
        ),
    ])
}

/// Why a Machine's request ended after `attempt` attempts, for its event and annotations.
pub fn failure_reason(machine: &str, attempt: u32, error: &Error) -> String {
    if error.is_transient() {
        format!("Machine {machine}: gave up after {attempt} attempts: {error}")
    } else {
        format!("Machine {machine}: {error}")
    }
}
