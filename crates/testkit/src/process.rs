//! Processes a test started (hooks, their children, agents) and expects to be stopped.

use std::time::Duration;

/// Whether process `pid` has exited: gone, or a zombie nobody has reaped yet.
pub fn has_exited(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state is the first field after the command name in parentheses.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
    }
}

/// Whether process `pid` exits within 2 s: a killed process needs a moment to go.
pub fn exits_soon(pid: i32) -> bool {
    for _ in 0..100 {
        if has_exited(pid) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
