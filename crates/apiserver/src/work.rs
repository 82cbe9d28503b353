//! Keeping CPU-heavy request work off the async workers that answer every other request.
//!
//! On the async workers, two large patches were enough to hold every worker for a minute:
//! `/healthz` from another client waited as long. Two mechanisms now keep the workers free:
//!
//! - Merging a patch (any kind) runs on a pool of blocking threads, one place per core
//!   ([`available_parallelism`](std::thread::available_parallelism)), taken in order of
//!   arrival, within a time budget ([`run`]): a request whose merge is not done by its
//!   [`Deadline`] is answered 504 `Timeout`, as kube-apiserver's request timeout answers it.
//!   The merge checks the deadline as it goes and stops there; work that cannot check it is
//!   abandoned to finish alone, keeping its place in the pool until it does, so that
//!   abandoned work cannot pile up.
//! - A request with a large body, and the write pipeline of a large object (field
//!   bookkeeping and storage of tens of thousands of fields take a second), hand their
//!   worker's other tasks to a new worker thread while they run ([`hand_over_worker`]). That
//!   work is linear in the body and the object, both bounded, so it has no deadline.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::error::ApiError;

/// How long one request's heavy work may take, its wait for a place in the pool included.
/// kube-apiserver gives a whole patch request 34 s; the work done here takes milliseconds for
/// any body under the 3 MiB limit, so a tenth of a minute is ample and bounds what a hostile
/// request can take.
pub const BUDGET: Duration = Duration::from_secs(10);

/// Requests with bodies at least this large are served with [`hand_over_worker`]; smaller
/// ones decode in microseconds.
pub const LARGE_BODY: usize = 64 * 1024;

/// When a request's heavy work must be done.
#[derive(Debug, Clone, Copy)]
pub struct Deadline(Instant);

impl Deadline {
    /// [`BUDGET`] from now.
    pub fn from_now() -> Self {
        Self::after(BUDGET)
    }

    pub fn after(budget: Duration) -> Self {
        Deadline(Instant::now() + budget)
    }

    /// 504 `Timeout` once the deadline has passed: work calls this as it goes, and stops.
    pub fn check(self) -> Result<(), ApiError> {
        if Instant::now() >= self.0 {
            Err(timed_out())
        } else {
            Ok(())
        }
    }
}

/// kube-apiserver's answer to a request that ran out of time.
pub fn timed_out() -> ApiError {
    ApiError {
        details: Some(json!({})),
        ..ApiError::timeout(
            "Timeout: request did not complete within requested timeout - context deadline exceeded",
        )
    }
}

fn pool() -> &'static Arc<Semaphore> {
    static POOL: OnceLock<Arc<Semaphore>> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Arc::new(Semaphore::new(threads))
    })
}

/// Runs `work` on the pool, by `deadline`: its answer, or 504 `Timeout` when the deadline
/// passes first (waiting for a place, or working).
pub async fn run<T: Send + 'static>(
    deadline: Deadline,
    work: impl FnOnce(Deadline) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let due = tokio::time::Instant::from_std(deadline.0);
    let place = tokio::time::timeout_at(due, pool().clone().acquire_owned())
        .await
        .map_err(|_| timed_out())?
        .expect("the pool is never closed");
    let task = tokio::task::spawn_blocking(move || {
        let _place = place;
        work(deadline)
    });
    match tokio::time::timeout_at(due, task).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(failed)) => Err(ApiError::internal(format!(
            "Internal error occurred: {failed}"
        ))),
        Err(_) => Err(timed_out()),
    }
}

/// Whether `value` is large enough for [`hand_over_worker`]: more than about 4,000 fields and
/// list items, or strings of about a mebibyte. Looks at no more than that.
pub fn is_large(value: &Value) -> bool {
    /// A node counts one, a string one more per 256 bytes.
    const LARGE: usize = 4096;
    fn weigh(value: &Value, budget: &mut usize) -> bool {
        let weight = match value {
            Value::String(s) => 1 + s.len() / 256,
            _ => 1,
        };
        let Some(left) = budget.checked_sub(weight) else {
            return true;
        };
        *budget = left;
        match value {
            Value::Array(items) => items.iter().any(|v| weigh(v, budget)),
            Value::Object(fields) => fields.values().any(|v| weigh(v, budget)),
            _ => false,
        }
    }
    weigh(value, &mut LARGE.clone())
}

/// Runs `work`, a future with long stretches of synchronous work (the write pipeline of a
/// large object), without holding an async worker: on a multi-threaded runtime the worker's
/// other requests are handed to a new worker thread while this thread drives `work` to its end.
/// A current-thread runtime (most tests) has no worker to hand over: there `work` is awaited.
pub async fn hand_over_worker<T>(work: impl Future<Output = T>) -> T {
    let runtime = tokio::runtime::Handle::current();
    if runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread {
        tokio::task::block_in_place(|| runtime.block_on(work))
    } else {
        work.await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_values_are_told_from_small_ones_by_a_bounded_look() {
        let fields = |n: usize| Value::Object((0..n).map(|i| (i.to_string(), json!(i))).collect());
        assert!(!is_large(
            &json!({"metadata": {"name": "x"}, "data": fields(100)})
        ));
        assert!(is_large(&json!({"data": fields(5_000)})));
        assert!(!is_large(&json!({"data": {"pem": "x".repeat(100 * 1024)}})));
        assert!(is_large(
            &json!({"data": {"pem": "x".repeat(2 * 1024 * 1024)}})
        ));
        assert!(is_large(&json!({"list": vec![json!([1]); 3_000]})));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_handed_over_worker_goes_on_serving_other_tasks() {
        // The runtime's only worker is taken by work that blocks; another task still runs,
        // before that work ends (without the hand-over it would wait for the worker).
        let (started, blocking) = std::sync::mpsc::channel();
        let blocked = tokio::spawn(hand_over_worker(async move {
            started.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            Instant::now()
        }));
        blocking.recv().unwrap();
        let other_ran = tokio::spawn(async { Instant::now() }).await.unwrap();
        assert!(other_ran < blocked.await.unwrap());
        assert_eq!(hand_over_worker(async { 7 }).await, 7);
    }

    #[tokio::test]
    async fn work_past_its_deadline_is_answered_504_at_the_deadline() {
        // Work that never looks at its deadline is answered for at the deadline, and left to
        // finish alone.
        let finished = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = finished.clone();
        let answer = run(Deadline::after(Duration::from_millis(50)), move |_| {
            std::thread::sleep(Duration::from_millis(500));
            done.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await;
        assert!(!finished.load(std::sync::atomic::Ordering::SeqCst));
        let error = answer.unwrap_err();
        assert_eq!((error.code, error.reason), (504, "Timeout"));
        assert_eq!(
            error.status_body(),
            "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"Timeout: request did not complete within requested timeout - context deadline exceeded\",\"reason\":\"Timeout\",\"details\":{},\"code\":504}\n"
        );

        let checked = run(Deadline::after(Duration::from_millis(50)), |deadline| {
            loop {
                deadline.check()?;
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let error = checked.await.map(|()| "never done").unwrap_err();
        assert_eq!(error.code, 504);
        assert_eq!(
            run(Deadline::from_now(), |_| Ok(7)).await.unwrap(),
            7,
            "work in time is answered"
        );
    }
}
