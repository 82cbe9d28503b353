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
use crate::machine::refresh::{format_time, parse_time, retry_at};
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

/// How soon to look again at work that has been running for `running_for` (in this process,
/// or on the node): half that, within bounds. Most work ends by patching its Machine, which
/// wakes the controller anyway; this only bounds how late an end that changes nothing is seen,
/// so a long wait costs a few reconciles, not five a second.
pub fn busy_retry(running_for: Duration) -> Duration {
    (running_for / 2).clamp(BUSY_RETRY_MIN, BUSY_RETRY_MAX)
}

const BUSY_RETRY_MIN: Duration = Duration::from_millis(200);
const BUSY_RETRY_MAX: Duration = Duration::from_secs(30);

/// When to look again at a Machine whose `capability` work is already running in this process.
pub fn busy(ctx: &Context, capability: &str, machine: &machine::MachineView) -> Next {
    Next::After(busy_retry(ctx.running_for(capability, machine)))
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

/// The annotation changes that make a Machine wait for an agent that answered busy (another
/// step runs on the node): look again after [`busy_retry`] of how long the request has run
/// since `started_at`. Not a failed attempt: `keys.attempts` is left as it is.
pub fn busy_wait_changes(
    keys: RetryKeys,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_work_is_looked_at_with_a_growing_backoff_not_a_fixed_spin() {
        // Looking again as `busy_retry` says while work runs for 10 minutes.
        let mut looked = Vec::new();
        let mut elapsed = Duration::ZERO;
        while elapsed < Duration::from_secs(600) {
            let wait = busy_retry(elapsed);
            looked.push(wait);
            elapsed += wait;
        }
        assert!(looked.windows(2).all(|w| w[0] <= w[1]), "{looked:?}");
        assert_eq!(looked[0], Duration::from_millis(200), "a quick first look");
        assert_eq!(*looked.last().unwrap(), BUSY_RETRY_MAX);
        // A fixed 200 ms spin would look 3,000 times.
        assert!(looked.len() < 40, "{} looks: {looked:?}", looked.len());
        let first_minute = looked
            .iter()
            .scan(Duration::ZERO, |t, w| {
                *t += *w;
                Some(*t)
            })
            .take_while(|t| *t <= Duration::from_secs(60))
            .count();
        assert!(
            first_minute < 20,
            "{first_minute} looks in the first minute"
        );
    }
}
