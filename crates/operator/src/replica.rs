//! One replica of `caretaker operator`: with an [`Election`], it stands by until it holds the
//! Lease; it then reconciles until it loses the Lease or is told to stop. Stopping takes no
//! new work and lets the reconciles already running finish, within [`SHUTDOWN_BOUND`], then
//! gives the Lease up so that a standby takes over at once.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::context::Context;
use crate::controllers;
use crate::leader::Election;

/// How long stopping waits for running reconciles (a Deployment's
/// `terminationGracePeriodSeconds` should leave a few seconds more: deploy/ gives 40).
pub const SHUTDOWN_BOUND: Duration = Duration::from_secs(30);
/// How long giving the Lease up may take after that.
pub const RELEASE_BOUND: Duration = Duration::from_secs(5);

/// Why a replica stopped reconciling against its will.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Stopped {
    #[error("leader election lost: {0}; stopping, so that only the Lease's holder reconciles")]
    LeadershipLost(String),
    #[error("leader election: {0}")]
    Election(String),
}

/// Runs the replica until `stop` completes (Ok) or it may no longer reconcile (Err).
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    mut election: Option<Election>,
    stop: impl Future<Output = ()>,
) -> Result<(), Stopped> {
    tokio::pin!(stop);
    ctx.metrics.set_leader(election.is_none());
    if let Some(election) = election.as_mut() {
        ctx.readiness.standing_by();
        tokio::select! {
            leading = election.leading() => leading.map_err(Stopped::Election)?,
            () = &mut stop => {
                tracing::info!("stopping while standing by");
                return Ok(());
            }
        }
        ctx.metrics.set_leader(true);
    }
    let controllers = controllers::run(ctx.clone(), namespace);
    tokio::pin!(controllers);
    let lost = async {
        match election.as_mut() {
            Some(election) => election.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        () = &mut controllers => {}
        why = lost => {
            ctx.metrics.set_leader(false);
            // Stop at once: another replica may already reconcile.
            return Err(Stopped::LeadershipLost(why));
        }
        () = &mut stop => {}
    }
    tracing::info!(bound = ?SHUTDOWN_BOUND, "stopping: taking no new work, waiting for running reconciles");
    ctx.shutdown.begin();
    let finished = tokio::select! {
        finished = ctx.shutdown.finished(SHUTDOWN_BOUND) => finished,
        () = &mut controllers => true,
    };
    if finished {
        tracing::info!("no reconcile running");
    } else {
        tracing::warn!(
            still_running = ctx.shutdown.still_running(),
            "stopping with reconciles still running after {SHUTDOWN_BOUND:?}: the next leader takes each up again"
        );
    }
    if let Some(election) = election {
        election.leave(RELEASE_BOUND).await;
    }
    ctx.metrics.set_leader(false);
    Ok(())
}
