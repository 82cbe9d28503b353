//! The plumbing every controller shares: watches that say when they fail
//! ([`watch_failures`]), writes on the version read ([`write`]), who may write what
//! ([`claims`]), a plan's writes in order ([`steps`]), status writes and the memory of what
//! they said ([`status`]), a pass that refuses its object ([`refuse`]). It knows no feature:
//! the controllers give it their kinds and steps.

pub(crate) mod claims;
pub(crate) mod refuse;
pub(crate) mod status;
pub(crate) mod steps;
pub(crate) mod watch_failures;
pub(crate) mod write;

use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;
use kube::runtime::controller::Action;
use time::OffsetDateTime;

use crate::Error;
use crate::context::Context;
use crate::schedule::Next;

/// An object of a namespace: (namespace, name).
pub(crate) type Key = (String, String);

/// Locks, carrying on past a panic elsewhere (every map behind such a lock is a cache or a
/// memory of writes, each entry whole).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl From<Next> for Action {
    fn from(next: Next) -> Action {
        match next {
            Next::AwaitChange => Action::await_change(),
            Next::After(wait) => Action::requeue(wait),
        }
    }
}

/// After a failed reconcile of one of `controller`'s objects: counted by the error's
/// category, which decides when it runs again.
pub(crate) fn requeue_after(controller: &'static str, error: &Error, ctx: &Context) -> Action {
    tracing::warn!(controller, error = %error, category = error.metric_label(), "reconcile failed");
    ctx.metrics.reconcile_failed(controller, error);
    error.requeue(ctx.settings.retry_base).into()
}

/// Returns whether the CRD `name` is installed, waiting for it (false if waiting failed).
pub(crate) async fn crd_installed(crds: Api<CustomResourceDefinition>, name: &str) -> bool {
    if matches!(crds.get_opt(name).await, Ok(Some(_))) {
        return true;
    }
    tracing::info!(crd = name, "CRD not installed: its controller waits for it");
    let installed = kube::runtime::wait::await_condition(
        crds,
        name,
        |crd: Option<&CustomResourceDefinition>| crd.is_some(),
    );
    match installed.await {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(crd = name, error = %e, "stopped waiting for a CRD");
            false
        }
    }
}

/// How long until `at`, for a requeue: exact, never negative, and at most a year (the
/// scheduler's queue holds at most about two; a pass then simply plans again).
pub(crate) fn until(at: OffsetDateTime) -> Duration {
    const YEAR: Duration = Duration::from_secs(365 * 86_400);
    let left = at - OffsetDateTime::now_utc();
    Duration::try_from(left).unwrap_or(Duration::ZERO).min(YEAR)
}

/// Runs CPU work (key generation, signing, parsing) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("CPU work cancelled: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requeues_are_exact_and_bounded() {
        let now = OffsetDateTime::now_utc();
        assert_eq!(until(now - time::Duration::hours(1)), Duration::ZERO);
        let soon = until(now + time::Duration::seconds(30));
        assert!(soon <= Duration::from_secs(30) && soon > Duration::from_secs(29));
        assert_eq!(
            until(now + time::Duration::days(3650)),
            Duration::from_secs(365 * 86_400)
        );
    }
}
