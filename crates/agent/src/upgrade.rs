//! In-place upgrades as asynchronous operations: the operator starts one, then reads its state
//! by id, so no request ever waits for the upgrade itself.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use caretaker_pki::files;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio::io::AsyncReadExt;

use crate::command::{CommandTemplate, OUTPUT_TAIL_BYTES, kill_group, tail};
use crate::refresh::random_id;

/// A release option in one of the upstream forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseOption(String);

/// The accepted forms, for messages.
pub const RELEASE_FORMS: &str = "channel=<channel> (e.g. channel=1.33/stable), \
revision=<revision> (e.g. revision=1234) or localPath=<absolute path> (e.g. \
localPath=/opt/k8s/k8s.snap)";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported upgrade option {0:?}: expected {RELEASE_FORMS}")]
pub struct BadReleaseOption(pub String);

impl ReleaseOption {
    pub fn parse(value: &str) -> Result<Self, BadReleaseOption> {
        let bad = || BadReleaseOption(value.to_string());
        let (kind, target) = value.split_once('=').ok_or_else(bad)?;
        let plain = !target.is_empty()
            && target
                .chars()
                .all(|c| !c.is_whitespace() && !c.is_control());
        let ok = plain
            && match kind {
                "channel" => true,
                "revision" => target
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'),
                "localPath" => target.starts_with('/'),
                _ => false,
            };
        if ok {
            Ok(Self(value.to_string()))
        } else {
            Err(bad())
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReleaseOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OperationState {
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl OperationState {
    pub fn is_finished(self) -> bool {
        self != OperationState::Running
    }
}

/// One upgrade run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    pub id: String,
    pub release: String,
    /// The caller's idempotency key: starting again with the same key returns this operation.
    pub request_id: Option<String>,
    pub state: OperationState,
    pub exit_code: Option<i32>,
    /// Why it failed or was cancelled, in words.
    pub message: Option<String>,
    pub output_tail: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
}

/// Body of `POST /v1/upgrades`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeRequest {
    pub release: String,
    #[serde(default)]
    pub request_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    #[error(transparent)]
    BadOption(#[from] BadReleaseOption),
    #[error("invalid request id {0:?}: use 1 to 64 letters, digits, '-' or '.'")]
    BadRequestId(String),
    #[error("no upgrade command is configured on this agent (--upgrade-command)")]
    NotConfigured,
    #[error("upgrade {0} is still running")]
    Busy(String),
    #[error("no operation {0:?}")]
    UnknownOperation(String),
    #[error("cannot start the upgrade command: {0}")]
    Spawn(std::io::Error),
}

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
            state: Arc::new(Mutex::new(state)),
        }
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

        let (program, args) = command.argv(Some(release.as_str()));
        let mut child = tokio::process::Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(false)
            .spawn()
            .map_err(UpgradeError::Spawn)?;
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
        let pid = child.id().unwrap_or_default();
        state.running = Some((operation.id.clone(), pid));
        state
            .operations
            .insert(operation.id.clone(), operation.clone());
        drop(state);

        let output = Arc::new(Mutex::new(Vec::<u8>::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Unpin + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let output = output.clone();
            tokio::spawn(collect(stream, output));
        }
        let this = self.clone();
        let id = operation.id.clone();
        tokio::spawn(async move {
            let status = child.wait().await;
            // Let the readers drain what the process wrote last.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            this.finish(&id, status, &output);
        });
        Ok(operation)
    }

    fn finish(
        &self,
        id: &str,
        status: std::io::Result<std::process::ExitStatus>,
        output: &Mutex<Vec<u8>>,
    ) {
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
        operation.output_tail = tail(&output.lock().expect("output lock"));
        operation.finished_at = Some(OffsetDateTime::now_utc());
        if cancelled {
            operation.state = OperationState::Cancelled;
            operation.message = Some("cancelled: the upgrade command was stopped".into());
        } else {
            match status {
                Ok(status) if status.success() => {
                    operation.state = OperationState::Succeeded;
                    operation.exit_code = status.code();
                    let _ = files::write_atomic(
                        &self.state_dir.join("release"),
                        operation.release.as_bytes(),
                        0o644,
                    );
                }
                Ok(status) => {
                    operation.state = OperationState::Failed;
                    operation.exit_code = status.code();
                    operation.message = Some(match status.code() {
                        Some(code) => format!("the upgrade command exited with status {code}"),
                        None => "the upgrade command was killed by a signal".into(),
                    });
                }
                Err(e) => {
                    operation.state = OperationState::Failed;
                    operation.message = Some(format!("cannot wait for the upgrade command: {e}"));
                }
            }
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

async fn collect(
    mut stream: Box<dyn tokio::io::AsyncRead + Unpin + Send>,
    output: Arc<Mutex<Vec<u8>>>,
) {
    let mut buffer = [0u8; 1024];
    while let Ok(n) = stream.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let mut output = output.lock().expect("output lock");
        output.extend_from_slice(&buffer[..n]);
        // Keep memory bounded: only the tail is ever reported.
        if output.len() > 4 * OUTPUT_TAIL_BYTES {
            let excess = output.len() - OUTPUT_TAIL_BYTES;
            output.drain(..excess);
        }
    }
}

fn persist(state_dir: &std::path::Path, operation: &Operation) {
    let dir = state_dir.join("operations");
    if std::fs::create_dir_all(&dir).is_ok() {
        let bytes = serde_json::to_vec_pretty(operation).expect("operations serialize");
        let _ = files::write_atomic(&dir.join(format!("{}.json", operation.id)), &bytes, 0o644);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_upstream_release_forms_are_accepted() {
        for ok in [
            "channel=1.33/stable",
            "revision=1234",
            "localPath=/opt/k8s.snap",
            "channel=latest/edge",
        ] {
            assert!(ReleaseOption::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "1.33",
            "channel=",
            "track=1.33",
            "localPath=relative",
            "channel=a b",
            "revision=1;rm",
            "",
        ] {
            let err = ReleaseOption::parse(bad).unwrap_err().to_string();
            assert!(
                err.contains(&format!("{bad:?}")) && err.contains("channel=<channel>"),
                "{err}"
            );
        }
    }
}
