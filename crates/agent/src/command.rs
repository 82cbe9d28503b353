//! Hook commands (`--restart-command`, `--upgrade-command`), run without a shell.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How much of a command's output is kept.
pub const OUTPUT_TAIL_BYTES: usize = 4096;

/// A program and its arguments, split on whitespace. `{release}` in an argument is replaced by
/// the release option; without a placeholder the option is appended as the last argument. No
/// shell is involved, so an option can never inject a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandTemplate {
    program: String,
    args: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("command template {0:?} is empty")]
pub struct EmptyCommand(pub String);

impl CommandTemplate {
    pub fn parse(template: &str) -> Result<Self, EmptyCommand> {
        let mut words = template.split_whitespace().map(str::to_string);
        let program = words.next().ok_or_else(|| EmptyCommand(template.into()))?;
        Ok(Self {
            program,
            args: words.collect(),
        })
    }

    /// The program and arguments for `release`, or the plain command when `None`.
    pub fn argv(&self, release: Option<&str>) -> (String, Vec<String>) {
        let mut args = self.args.clone();
        if let Some(release) = release {
            if args.iter().any(|a| a.contains("{release}")) {
                for arg in &mut args {
                    *arg = arg.replace("{release}", release);
                }
            } else {
                args.push(release.to_string());
            }
        }
        (self.program.clone(), args)
    }
}

/// How a finished hook ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookOutcome {
    pub success: bool,
    /// `None` when killed by a signal or on timeout.
    pub exit_code: Option<i32>,
    /// The last bytes of stdout and stderr together.
    pub output_tail: String,
}

/// Runs a command to completion (or kills it after `timeout`), keeping its output tail.
pub fn run_blocking(
    template: &CommandTemplate,
    release: Option<&str>,
    timeout: Duration,
) -> HookOutcome {
    let (program, args) = template.argv(release);
    let child = Command::new(&program)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so a timeout kills the children it started too.
        .process_group(0)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            return HookOutcome {
                success: false,
                exit_code: None,
                output_tail: format!("cannot start {program}: {e}"),
            };
        }
    };
    let readers = [
        child
            .stdout
            .take()
            .map(|mut s| std::thread::spawn(move || read_all(&mut s))),
        child
            .stderr
            .take()
            .map(|mut s| std::thread::spawn(move || read_all(&mut s))),
    ];
    // Wait in a helper thread so the hook's end is seen at once, and kill its process group if
    // it outlives the timeout.
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait().ok();
        let _ = done.send(());
        status
    });
    let timed_out = finished.recv_timeout(timeout).is_err();
    if timed_out {
        kill_group(pid);
    }
    let status = waiter.join().ok().flatten().filter(|_| !timed_out);
    let mut output = Vec::new();
    for reader in readers.into_iter().flatten() {
        output.extend(reader.join().unwrap_or_default());
    }
    let mut output_tail = tail(&output);
    if status.is_none() {
        output_tail.push_str(&format!("\n(killed after {}s)", timeout.as_secs()));
    }
    HookOutcome {
        success: status.is_some_and(|s| s.success()),
        exit_code: status.and_then(|s| s.code()),
        output_tail,
    }
}

/// Kills a process group started with `process_group(0)`.
pub fn kill_group(pid: u32) {
    // SAFETY: kill(2) with a negative pid signals the group; no memory is involved.
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
}

fn read_all(stream: &mut impl Read) -> Vec<u8> {
    let mut buffer = Vec::new();
    let _ = stream.read_to_end(&mut buffer);
    buffer
}

/// The last [`OUTPUT_TAIL_BYTES`] of `output` as text.
pub fn tail(output: &[u8]) -> String {
    let start = output.len().saturating_sub(OUTPUT_TAIL_BYTES);
    String::from_utf8_lossy(&output[start..])
        .trim_end()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_is_substituted_or_appended_never_shell_expanded() {
        let t = CommandTemplate::parse("/usr/bin/upgrade --to={release} now").unwrap();
        assert_eq!(
            t.argv(Some("channel=1.33/stable")).1,
            ["--to=channel=1.33/stable", "now"]
        );
        let t = CommandTemplate::parse("snap refresh").unwrap();
        assert_eq!(t.argv(Some("revision=42")).1, ["refresh", "revision=42"]);
        assert!(CommandTemplate::parse("   ").is_err());

        let echo = CommandTemplate::parse("echo").unwrap();
        let outcome = run_blocking(&echo, Some("$(touch /tmp/x); `id`"), Duration::from_secs(5));
        assert!(outcome.success);
        assert_eq!(outcome.output_tail, "$(touch /tmp/x); `id`");
    }

    #[test]
    fn failures_report_exit_code_and_output_and_timeouts_kill() {
        let t = CommandTemplate::parse("sh -c {release}").unwrap();
        let outcome = run_blocking(
            &t,
            Some("echo out; echo err >&2; exit 3"),
            Duration::from_secs(5),
        );
        assert!(!outcome.success);
        assert_eq!(outcome.exit_code, Some(3));
        assert!(outcome.output_tail.contains("out") && outcome.output_tail.contains("err"));

        let slow = run_blocking(&t, Some("sleep 5"), Duration::from_millis(100));
        assert!(!slow.success);
        assert_eq!(slow.exit_code, None);
        assert!(slow.output_tail.contains("killed"));

        let missing = CommandTemplate::parse("/nonexistent/hook").unwrap();
        let outcome = run_blocking(&missing, None, Duration::from_secs(1));
        assert!(!outcome.success && outcome.output_tail.contains("cannot start"));
    }
}
