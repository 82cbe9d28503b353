//! The bodies of in-place upgrades, and the one release option grammar both sides enforce:
//! the operator before it asks, the agent before it runs anything.

use std::fmt;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

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
