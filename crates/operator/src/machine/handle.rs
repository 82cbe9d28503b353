//! A Machine as the Machine controller's pass saw it ([`MachineHandle`]), shared by the pass
//! ([`super::controller`]) and the work it starts ([`super::work`]), which records its end through it.

use std::sync::Arc;

use kube::api::DynamicObject;

use crate::Error;
use crate::context::Context;
use crate::machine::MachineView;
use crate::machine::plan::{MachineUpdate, Write};
use caretaker_api::names::Operation;

/// A Machine as a pass saw it, and the context to act on it; cheap to clone into the work a
/// pass starts.
#[derive(Clone)]
pub(in crate::machine) struct MachineHandle {
    pub ctx: Arc<Context>,
    pub object: Arc<DynamicObject>,
    pub view: MachineView,
    /// The Machine as the API server had it at this process's last write to it (or read of
    /// it) after `view` was observed, if there was one: work that would read the Machine fresh
    /// starts from it instead, and an end is first written on its version.
    pub written: Option<MachineView>,
}

impl MachineHandle {
    /// Writes an update on the Machine, then publishes its event if the write was recorded.
    /// Returns the Machine as a patch left it (`None` when nothing was patched).
    pub async fn record(&self, update: MachineUpdate) -> Result<Option<MachineView>, Error> {
        let (ctx, view) = (&self.ctx, &self.view);
        let (recorded, written) = match &update.write {
            None => (true, None),
            Some(Write::Patch(changes)) => {
                let object = ctx.patch_annotations(view, changes).await?;
                (true, Some(MachineView::from_object(&object)))
            }
            Some(Write::End {
                trigger,
                worked,
                changes,
            }) => {
                let known = self.written.as_ref();
                let recorded = ctx
                    .record_end_after(view, known, trigger, worked.as_deref(), changes)
                    .await?;
                (recorded, None)
            }
        };
        if recorded && let Some(event) = update.event {
            ctx.publish_machine_event(&self.object, event);
        }
        Ok(written)
    }
}

/// Logs why a call to a node failed; what follows (a wait, a retry, the end) is recorded on the
/// Machine.
pub(in crate::machine) fn log_failed_call(
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
