//! Stopping cleanly on SIGTERM: every controller stops taking new events (kube-runtime's
//! `graceful_shutdown_on`), the reconciles already running finish, and the process waits for
//! them within a bound. A reconcile is the unit caretaker keeps safe: each one ends with what
//! it did written down, so one cut off by the bound, or a requeue still scheduled, is taken up
//! again by the next leader from what the objects say.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, watch};

/// Tells controllers to stop, and counts the reconciles still running.
#[derive(Debug)]
pub struct Shutdown {
    begun: watch::Sender<bool>,
    running: AtomicUsize,
    idle: Notify,
}

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown {
            begun: watch::channel(false).0,
            running: AtomicUsize::new(0),
            idle: Notify::new(),
        }
    }
}

/// Held while a reconcile runs.
#[derive(Debug)]
pub struct Running(Arc<Shutdown>);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl Shutdown {
    pub fn new() -> Arc<Shutdown> {
        Arc::new(Shutdown::default())
    }

    /// Stop taking new work.
    pub fn begin(&self) {
        self.begun.send_replace(true);
    }

    /// Completes once [`Self::begin`] was called: what `graceful_shutdown_on` takes.
    pub fn signal(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut begun = self.begun.subscribe();
        async move {
            // An error means the sender is gone: nobody can begin a shutdown any more.
            if begun.wait_for(|b| *b).await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Counts a reconcile as running until the returned guard is dropped.
    pub fn running(self: &Arc<Self>) -> Running {
        self.running.fetch_add(1, Ordering::AcqRel);
        Running(self.clone())
    }

    /// How many reconciles are running.
    pub fn still_running(&self) -> usize {
        self.running.load(Ordering::Acquire)
    }

    /// Waits until no reconcile runs, or `bound` has passed; true when none runs.
    pub async fn finished(&self, bound: Duration) -> bool {
        let idle = async {
            loop {
                let notified = self.idle.notified();
                if self.still_running() == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(bound, idle).await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn finished_waits_for_every_running_reconcile_within_the_bound() {
        let shutdown = Shutdown::new();
        assert!(
            shutdown.finished(Duration::from_millis(10)).await,
            "nothing runs"
        );
        let first = shutdown.running();
        let second = shutdown.running();
        let signal = shutdown.signal();
        shutdown.begin();
        signal.await;
        assert!(!shutdown.finished(Duration::from_millis(20)).await);
        drop(first);
        assert_eq!(shutdown.still_running(), 1);
        let waiter = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move { shutdown.finished(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(second);
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_signal_taken_after_the_shutdown_began_completes_at_once() {
        let shutdown = Shutdown::new();
        shutdown.begin();
        tokio::time::timeout(Duration::from_secs(1), shutdown.signal())
            .await
            .expect("the signal completes");
    }
}
