//! In-place upgrades as asynchronous operations: the operator starts one, then reads its state
//! by id, so no request ever waits for the upgrade itself.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use caretaker_pki::files;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use crate::command::{CommandTemplate, HookOutcome, RunningHook, kill_group};
use crate::refresh::random_id;

/// A release option in one of the upstream forms. It is handed to the upgrade hook as an
/// argument, so only a strict grammar gets through: nothing a hook could read as a flag, a path
/// outside what was named, or text that displays differently from what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseOption(String);

/// The accepted forms, for messages.
pub const RELEASE_FORMS: &str = "channel=<channel> (e.g. channel=1.33/stable), \
revision=<revision> (e.g. revision=1234) or localPath=<absolute path> (e.g. \
localPath=/opt/k8s/k8s.snap)";

/// The longest release option accepted, in bytes.
pub const MAX_RELEASE_OPTION_LEN: usize = 256;

/// How much of a refused value a message repeats: enough to recognise it, never a wall of text.
const SHOWN_VALUE_CHARS: usize = 80;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unsupported upgrade option {}: {reason}; expected {RELEASE_FORMS}", shown(.value))]
pub struct BadReleaseOption {
    pub value: String,
    pub reason: String,
}

/// `value` quoted with every control, format (e.g. right-to-left override) and non-ASCII
/// character escaped, and cut short when long.
fn shown(value: &str) -> String {
    let mut quoted: String = value.chars().take(SHOWN_VALUE_CHARS).collect();
    if quoted.len() < value.len() {
        quoted.push_str("...");
    }
    let mut escaped = String::new();
    for c in format!("{quoted:?}").chars() {
        if c.is_ascii() {
            escaped.push(c);
        } else {
            escaped.extend(c.escape_unicode());
        }
    }
    escaped
}

impl ReleaseOption {
    pub fn parse(value: &str) -> Result<Self, BadReleaseOption> {
        match release_option_problem(value) {
            None => Ok(Self(value.to_string())),
            Some(reason) => Err(BadReleaseOption {
                value: value.to_string(),
                reason,
            }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Why `value` is not a release option, if it is not.
fn release_option_problem(value: &str) -> Option<String> {
    if value.len() > MAX_RELEASE_OPTION_LEN {
        return Some(format!(
            "it is longer than {MAX_RELEASE_OPTION_LEN} characters"
        ));
    }
    let problem = if !value.bytes().all(|b| b.is_ascii_graphic()) {
        "only printable ASCII without spaces is allowed"
    } else {
        match value.split_once('=') {
            None => "it is not of the form KIND=VALUE",
            Some(("channel", target)) if !is_channel(target) => {
                "a channel is TRACK/RISK[/BRANCH], each part lowercase letters, digits, dots and \
                 dashes, starting with a letter or digit"
            }
            Some(("revision", target))
                if target.is_empty() || !target.bytes().all(|b| b.is_ascii_digit()) =>
            {
                "a revision is a number"
            }
            Some(("localPath", target)) if !is_normalised_absolute_path(target) => {
                "a local path is absolute and normalised (no empty, '.' or '..' parts, no \
                 trailing '/')"
            }
            Some(("channel" | "revision" | "localPath", _)) => return None,
            Some(_) => "the kind is not channel, revision or localPath",
        }
    };
    Some(problem.to_string())
}

/// `TRACK/RISK[/BRANCH]`; a part never starts with a dash, so the whole never reads as a flag.
fn is_channel(target: &str) -> bool {
    let parts: Vec<&str> = target.split('/').collect();
    (2..=3).contains(&parts.len())
        && parts.iter().all(|part| {
            part.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
        })
}

fn is_normalised_absolute_path(target: &str) -> bool {
    target.strip_prefix('/').is_some_and(|rest| {
        rest.split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_upstream_release_forms_are_accepted() {
        for ok in [
            "channel=1.33/stable",
            "channel=latest/edge",
            "channel=1.33-classic/candidate/hotfix-2",
            "revision=1234",
            "localPath=/opt/k8s.snap",
            "localPath=/var/lib/snaps/k8s_1.33.snap",
        ] {
            assert!(ReleaseOption::parse(ok).is_ok(), "{ok}");
        }
        let overlong = format!("localPath=/{}", "a".repeat(MAX_RELEASE_OPTION_LEN));
        for (bad, why) in [
            ("1.33", "KIND=VALUE"),
            ("", "KIND=VALUE"),
            ("track=1.33", "the kind"),
            ("channel=", "TRACK/RISK"),
            ("channel=$(id)", "TRACK/RISK"),
            ("channel=`id`/stable", "TRACK/RISK"),
            ("channel=--classic", "TRACK/RISK"),
            ("channel=-x/stable", "TRACK/RISK"),
            ("channel=1.33", "TRACK/RISK"),
            ("channel=1.33/stable/a/b", "TRACK/RISK"),
            ("channel=1.33/Stable", "TRACK/RISK"),
            ("channel=1.33//stable", "TRACK/RISK"),
            ("channel=../stable", "TRACK/RISK"),
            ("channel=1.33/stable\u{202e}", "ASCII"),
            ("channel=1.33/st\u{e4}ble", "ASCII"),
            ("channel=1.33/stable\n--classic", "ASCII"),
            ("channel=a b", "ASCII"),
            ("revision=..", "number"),
            ("revision=-1", "number"),
            ("revision=1;rm", "number"),
            ("revision=", "number"),
            ("localPath=relative", "local path"),
            ("localPath=/../../etc/shadow", "local path"),
            ("localPath=/opt/../etc/shadow", "local path"),
            ("localPath=/opt/./k8s.snap", "local path"),
            ("localPath=/opt//k8s.snap", "local path"),
            ("localPath=/opt/k8s/", "local path"),
            ("localPath=/", "local path"),
            (overlong.as_str(), "longer than 256"),
        ] {
            let err = ReleaseOption::parse(bad).unwrap_err();
            assert_eq!(err.value, bad);
            let message = err.to_string();
            assert!(
                message.contains(why) && message.contains("channel=<channel>"),
                "{bad:?}: {message}"
            );
            // The message names the value, with anything that could hide what it is escaped.
            assert!(message.contains(&shown(bad)), "{bad:?}: {message}");
            assert!(message.is_ascii() && !message.contains('\n'), "{message}");
            assert!(message.len() < 600, "a long value is cut short: {message}");
        }
        assert_eq!(
            shown("channel=1.33/stable\u{202e}"),
            r#""channel=1.33/stable\u{202e}""#
        );
        assert_eq!(
            shown("channel=1.33/st\u{e4}ble"),
            r#""channel=1.33/st\u{e4}ble""#
        );
        assert_eq!(shown("revision=1\n2"), r#""revision=1\n2""#);
        assert_eq!(
            shown(&"a".repeat(100)),
            format!("\"{}...\"", "a".repeat(80))
        );
    }
}
