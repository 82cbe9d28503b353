//! Hook commands (`--restart-command`, `--upgrade-command`), run without a shell.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use caretaker_agent_api::refresh::HookOutcome;

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

/// A hook that was started in its own process group, so that it and everything it started can
/// be killed together.
#[derive(Debug)]
pub struct RunningHook {
    child: Child,
}

impl RunningHook {
    pub fn spawn(template: &CommandTemplate, release: Option<&str>) -> std::io::Result<Self> {
        let (program, args) = template.argv(release);
        let child = Command::new(&program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        Ok(Self { child })
    }

    /// The process group id (the hook's pid), for [`kill_group`].
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the hook has exited and closed its output, for at most `timeout`. A hook
    /// that is still running then, or that left a child holding its output (`sleep 1000 &`),
    /// has timed out: its whole process group is killed and its output is no longer read.
    pub fn wait(mut self, timeout: Duration) -> HookOutcome {
        let deadline = Instant::now() + timeout;
        let mut streams: Vec<Box<dyn ReadFd>> = Vec::new();
        if let Some(s) = self.child.stdout.take() {
            streams.push(Box::new(s));
        }
        if let Some(s) = self.child.stderr.take() {
            streams.push(Box::new(s));
        }
        let mut output = Vec::new();
        let mut status = None;
        let timed_out = loop {
            if status.is_none() {
                status = self.child.try_wait().ok().flatten();
            }
            if status.is_some() && streams.is_empty() {
                break false;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break true;
            }
            // The exit is only seen by `try_wait`, so wake up now and then to look.
            let slice = left.min(EXIT_CHECK_INTERVAL);
            if streams.is_empty() {
                std::thread::sleep(slice);
            } else {
                read_ready(&mut streams, &mut output, slice);
            }
        };
        if timed_out {
            kill_group(self.pid());
            status = None;
        }
        // Reap the hook (after a kill it exits at once).
        let _ = self.child.wait();
        let mut output_tail = tail(&output);
        if timed_out {
            output_tail.push_str(&format!(
                "\n(killed after {}s: the hook or a process it left behind was still running)",
                timeout.as_secs_f32()
            ));
        }
        HookOutcome {
            success: status.is_some_and(|s| s.success()),
            exit_code: status.and_then(|s| s.code()),
            timed_out,
            output_tail,
        }
    }
}

/// How often a hook whose output is quiet is checked for having exited.
const EXIT_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// A hook's stdout or stderr.
trait ReadFd: Read + AsRawFd {}
impl<T: Read + AsRawFd> ReadFd for T {}

/// Waits up to `wait` for output on `streams`, appends what is there to `output` (keeping only
/// a bounded tail) and drops the streams that reached their end.
fn read_ready(streams: &mut Vec<Box<dyn ReadFd>>, output: &mut Vec<u8>, wait: Duration) {
    let mut fds: Vec<libc::pollfd> = streams
        .iter()
        .map(|s| libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let millis = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX).max(1);
    // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures that outlives the call.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, millis) };
    if ready <= 0 {
        return;
    }
    let mut buffer = [0u8; 4096];
    let mut ended = Vec::new();
    for (index, fd) in fds.iter().enumerate() {
        if fd.revents == 0 {
            continue;
        }
        // poll said it is readable (or closed), so this read does not block.
        match streams[index].read(&mut buffer) {
            Ok(0) | Err(_) => ended.push(index),
            Ok(n) => {
                output.extend_from_slice(&buffer[..n]);
                // Keep memory bounded: only the tail is ever reported.
                if output.len() > 4 * OUTPUT_TAIL_BYTES {
                    let excess = output.len() - OUTPUT_TAIL_BYTES;
                    output.drain(..excess);
                }
            }
        }
    }
    for index in ended.into_iter().rev() {
        streams.remove(index);
    }
}

/// Runs a command to completion (or kills it after `timeout`), keeping its output tail.
pub fn run_blocking(
    template: &CommandTemplate,
    release: Option<&str>,
    timeout: Duration,
) -> HookOutcome {
    match RunningHook::spawn(template, release) {
        Ok(hook) => hook.wait(timeout),
        Err(error) => HookOutcome {
            success: false,
            exit_code: None,
            timed_out: false,
            output_tail: format!("cannot start {}: {error}", template.argv(release).0),
        },
    }
}

/// Kills a process group started with `process_group(0)`.
pub fn kill_group(pid: u32) {
    // SAFETY: kill(2) with a negative pid signals the group; no memory is involved.
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
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

    #[test]
    fn a_child_left_holding_the_output_is_a_timeout_and_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("child.pid");
        let t = CommandTemplate::parse("sh -c {release}").unwrap();
        let script = format!(
            "sleep 1000 & echo $! > {}; echo started",
            pid_file.display()
        );
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(run_blocking(&t, Some(&script), Duration::from_secs(1)));
        });
        // Bounded by the timeout (plus slack for a loaded machine), not by the child.
        let outcome = finished
            .recv_timeout(Duration::from_secs(30))
            .expect("the hook's timeout bounds the wait");
        assert!(outcome.timed_out && !outcome.success, "{outcome:?}");
        assert_eq!(outcome.exit_code, None);
        assert!(outcome.output_tail.starts_with("started"), "{outcome:?}");
        assert!(
            outcome.output_tail.contains("killed after 1s"),
            "{outcome:?}"
        );
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        assert!(is_dead(pid.trim()), "the background child {pid} still runs");
    }

    /// Gone, or a zombie nobody has reaped yet.
    fn is_dead(pid: &str) -> bool {
        for _ in 0..100 {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat)
                    if stat
                        .rsplit(')')
                        .next()
                        .unwrap_or("")
                        .trim_start()
                        .starts_with('Z') =>
                {
                    return true;
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        false
    }
}
