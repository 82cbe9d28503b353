//! A Machine as the Machine controller's pass saw it ([`MachineHandle`]), shared by the pass
//! ([`super::machines`]) and the work it starts ([`super::machine_refresh`],
//! [`super::machine_upgrade`]), which records its end through it.

use std::sync::Arc;

use kube::api::DynamicObject;

use crate::Error;
use crate::context::Context;
use crate::machine::MachineView;
use crate::machine::plan::{MachineUpdate, Write};
use crate::names::Operation;

/// A Machine as a pass saw it, and the context to act on it; cheap to clone into the work a
/// pass starts.
#[derive(Clone)]
pub(super) struct MachineHandle {
    pub ctx: Arc<Context>,
    pub object: Arc<DynamicObject>,
    pub view: MachineView,
}

impl MachineHandle {
    /// Writes an update on the Machine, then publishes its event if the write was recorded.
    pub async fn record(&self, update: MachineUpdate) -> Result<(), Error> {
        let (ctx, view) = (&self.ctx, &self.view);
        let recorded = match &update.write {
            None => true,
            Some(Write::Patch(changes)) => {
                ctx.patch_annotations(view, changes).await?;
                true
            }
            Some(Write::End {
                trigger,
                worked,
                changes,
            }) => {
                ctx.record_end(view, trigger, worked.as_deref(), changes)
                    .await?
            }
        };
        if recorded && let Some(event) = update.event {
            ctx.machine_event(&self.object, event).await;
        }
        Ok(())
    }
}

/// Logs why a call to a node failed; what follows (a wait, a retry, the end) is recorded on the
/// Machine.
pub(super) fn log_failed_call(
    operation: Operation,
    view: &MachineView,
    attempt: u32,
    error: &Error,
) {
    let work = operation.names().work;
    if matches!(error, Error::Agent(e) if e.is_busy()) {
        tracing::info!(machine = %view.name, work, reason = %error, "the agent is busy; waiting");
    } else {
        tracing::warn!(machine = %view.name, work, attempt, error = %error, "a call to the node failed");
    }
}
