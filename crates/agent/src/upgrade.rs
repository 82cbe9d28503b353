//! In-place upgrades as asynchronous operations: the operator starts one, then reads its state
//! by id, so no request ever waits for the upgrade itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use caretaker_agent_api::refresh::HookOutcome;
use caretaker_agent_api::upgrade::{
    BadReleaseOption, Operation, OperationState, ReleaseOption, UpgradeRequest,
};
use caretaker_pki::files;
use time::OffsetDateTime;

use crate::command::{CommandTemplate, RunningHook, kill_group};
use crate::refresh::random_id;

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    BadOption(#[from] BadReleaseOption),
    #[error("invalid request id {0:?}: use 1 to 64 letters, digits, '-' or '.'")]
    BadRequestId(String),
    #[error("no upgrade command is configured on this agent (--upgrade-command)")]
    NotConfigured,
    #[error("upgrade {0} is still running; ask again when it has finished")]
    Busy(String),
    #[error("no operation {0:?}")]
    UnknownOperation(String),
    #[error("cannot start the upgrade command: {0}")]
    Spawn(std::io::Error),
}

/// How long an upgrade may run unless configured otherwise.
pub const DEFAULT_UPGRADE_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Default)]
struct State {
    operations: BTreeMap<String, Operation>,
    /// The running operation and its process group.
    running: Option<(String, u32)>,
    /// The running operation was asked to stop.
    cancel_requested: bool,
}

/// Runs upgrades one at a time and remembers them in the state directory.
#[derive(Debug, Clone)]
pub struct Upgrader {
    state_dir: PathBuf,
    command: Option<CommandTemplate>,
    /// How long an upgrade may run before its process group is killed and it fails.
    timeout: Duration,
    state: Arc<Mutex<State>>,
}

impl Upgrader {
    /// Loads earlier operations. One that was running when the agent stopped is marked failed:
    /// its outcome is unknown.
    pub fn new(state_dir: impl Into<PathBuf>, command: Option<CommandTemplate>) -> Self {
        let state_dir = state_dir.into();
        let mut state = State::default();
        if let Ok(entries) = std::fs::read_dir(state_dir.join("operations")) {
            for entry in entries.flatten() {
                let Ok(bytes) = std::fs::read(entry.path()) else {
                    continue;
                };
                let Ok(mut operation) = serde_json::from_slice::<Operation>(&bytes) else {
                    continue;
                };
                if operation.state == OperationState::Running {
                    operation.state = OperationState::Failed;
                    operation.message = Some(
                        "the agent restarted while the upgrade ran; its outcome is unknown".into(),
                    );
                    operation.finished_at = Some(OffsetDateTime::now_utc());
                    persist(&state_dir, &operation);
                }
                state.operations.insert(operation.id.clone(), operation);
            }
        }
        Self {
            state_dir,
            command,
            timeout: DEFAULT_UPGRADE_TIMEOUT,
            state: Arc::new(Mutex::new(state)),
        }
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The release the last successful upgrade installed.
    pub fn current_release(&self) -> Option<String> {
        std::fs::read_to_string(self.state_dir.join("release"))
            .ok()
            .map(|s| s.trim().to_string())
    }

    pub fn get(&self, id: &str) -> Result<Operation, UpgradeError> {
        let state = self.state.lock().expect("upgrade state lock");
        state
            .operations
            .get(id)
            .cloned()
            .ok_or_else(|| UpgradeError::UnknownOperation(id.into()))
    }

    /// Starts an upgrade, or returns the operation already started with the same request id.
    pub fn start(&self, request: &UpgradeRequest) -> Result<Operation, UpgradeError> {
        let release = ReleaseOption::parse(&request.release)?;
        if let Some(id) = &request.request_id {
            let valid = !id.is_empty()
                && id.len() <= 64
                && id
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
            if !valid {
                return Err(UpgradeError::BadRequestId(id.clone()));
            }
        }
        let command = self.command.as_ref().ok_or(UpgradeError::NotConfigured)?;
        let mut state = self.state.lock().expect("upgrade state lock");
        if let Some(existing) = request.request_id.as_ref().and_then(|rid| {
            state
                .operations
                .values()
                .find(|o| o.request_id.as_ref() == Some(rid))
        }) {
            return Ok(existing.clone());
        }
        if let Some((running, _)) = &state.running {
            return Err(UpgradeError::Busy(running.clone()));
        }

        let hook =
            RunningHook::spawn(command, Some(release.as_str())).map_err(UpgradeError::Spawn)?;
        let operation = Operation {
            id: random_id(),
            release: release.to_string(),
            request_id: request.request_id.clone(),
            state: OperationState::Running,
            exit_code: None,
            message: None,
            output_tail: String::new(),
            started_at: OffsetDateTime::now_utc(),
            finished_at: None,
        };
        persist(&self.state_dir, &operation);
        state.running = Some((operation.id.clone(), hook.pid()));
        state
            .operations
            .insert(operation.id.clone(), operation.clone());
        drop(state);

        let this = self.clone();
        let id = operation.id.clone();
        tokio::task::spawn_blocking(move || {
            let outcome = hook.wait(this.timeout);
            this.finish(&id, outcome);
        });
        Ok(operation)
    }

    fn finish(&self, id: &str, outcome: HookOutcome) {
        let mut state = self.state.lock().expect("upgrade state lock");
        let mut cancelled = false;
        if state
            .running
            .as_ref()
            .is_some_and(|(running, _)| running == id)
        {
            state.running = None;
            cancelled = std::mem::take(&mut state.cancel_requested);
        }
        let Some(operation) = state.operations.get_mut(id) else {
            return;
        };
        operation.output_tail = outcome.output_tail;
        operation.exit_code = outcome.exit_code;
        operation.finished_at = Some(OffsetDateTime::now_utc());
        if cancelled {
            operation.state = OperationState::Cancelled;
            operation.message = Some("cancelled: the upgrade command was stopped".into());
        } else if outcome.success {
            operation.state = OperationState::Succeeded;
            let _ = files::write_atomic(
                &self.state_dir.join("release"),
                operation.release.as_bytes(),
                0o644,
            );
        } else {
            operation.state = OperationState::Failed;
            operation.message = Some(match outcome.exit_code {
                _ if outcome.timed_out => format!(
                    "the upgrade command did not finish within {}s and was killed",
                    self.timeout.as_secs()
                ),
                Some(code) => format!("the upgrade command exited with status {code}"),
                None => "the upgrade command was killed by a signal".into(),
            });
        }
        persist(&self.state_dir, operation);
    }

    /// Cancels a running upgrade by killing its process group; the operation turns `cancelled`
    /// once the process has exited. Cancelling a finished one returns it unchanged.
    pub fn cancel(&self, id: &str) -> Result<Operation, UpgradeError> {
        let mut state = self.state.lock().expect("upgrade state lock");
        let pid = match &state.running {
            Some((running, pid)) if running == id => Some(*pid),
            _ => None,
        };
        let operation = state
            .operations
            .get_mut(id)
            .ok_or_else(|| UpgradeError::UnknownOperation(id.into()))?;
        if let Some(pid) = pid {
            operation.message = Some("cancel requested".into());
            let operation = operation.clone();
            state.cancel_requested = true;
            kill_group(pid);
            return Ok(operation);
        }
        Ok(operation.clone())
    }
}

fn persist(state_dir: &std::path::Path, operation: &Operation) {
    let dir = state_dir.join("operations");
    if std::fs::create_dir_all(&dir).is_ok() {
        let bytes = serde_json::to_vec_pretty(operation).expect("operations serialize");
        let _ = files::write_atomic(&dir.join(format!("{}.json", operation.id)), &bytes, 0o644);
    }
}
