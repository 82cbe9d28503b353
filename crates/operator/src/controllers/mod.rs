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
use serde_json::{Value, json};
use time::OffsetDateTime;

use crate::Error;
use crate::context::Context;
use crate::machine;
use crate::machine::refresh::{format_time, retry_at};
use crate::names::RetryKeys;

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
        1 + rollout::PARENT_KINDS.len(),
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

/// When a capability wants to look at a Machine again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// When the Machine changes (its watch wakes the controller).
    AwaitChange,
    /// After this long, changed or not.
    After(Duration),
}

impl Next {
    /// The sooner of two wishes.
    pub fn sooner(self, other: Next) -> Next {
        match (self, other) {
            (Next::After(a), Next::After(b)) => Next::After(a.min(b)),
            (Next::After(a), Next::AwaitChange) | (Next::AwaitChange, Next::After(a)) => {
                Next::After(a)
            }
            (Next::AwaitChange, Next::AwaitChange) => Next::AwaitChange,
        }
    }
}

impl Next {
    /// Come back once `until` has passed (a little after, so the backoff has surely ended).
    pub fn at(until: OffsetDateTime, now: OffsetDateTime) -> Next {
        let wait = Duration::try_from(until - now).unwrap_or(Duration::ZERO);
        Next::After(wait + Duration::from_millis(50))
    }
}

/// The annotation changes that schedule the attempt after failed attempt number `attempt`,
/// with exponential backoff from `base`.
pub fn retry_changes(
    keys: RetryKeys,
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

/// Why a Machine's request ended after `attempt` attempts, for its event and annotations.
pub fn failure_reason(machine: &str, attempt: u32, error: &Error) -> String {
    if error.is_transient() {
        format!("Machine {machine}: gave up after {attempt} attempts: {error}")
    } else {
        format!("Machine {machine}: {error}")
    }
}
