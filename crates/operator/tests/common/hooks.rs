//! Restart and upgrade hooks that log when each node's run starts and ends, to one shared
//! file: what the agents saw, for tests of order, limits and repeats.

use std::os::unix::fs::PermissionsExt;

use caretaker_agent::command::CommandTemplate;

/// Per-Machine hook scripts (upgrade or restart commands) that log `start NAME T` and
/// `end NAME T` to one shared file, sleeping `seconds` in between.
pub fn logging_scripts(
    root: std::path::PathBuf,
    seconds: &str,
) -> (std::path::PathBuf, impl Fn(&str) -> CommandTemplate + use<>) {
    std::fs::create_dir_all(&root).unwrap();
    let log = root.join("log");
    let root2 = root.clone();
    let seconds = seconds.to_string();
    let make = move |name: &str| {
        let dir = root2.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("upgrade.sh");
        std::fs::write(
            &script,
            format!("#!/bin/sh\necho \"start {name} $(date +%s.%N)\" >> {log}\nsleep {seconds}\necho \"end {name} $(date +%s.%N)\" >> {log}\n", log = root2.join("log").display()),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        CommandTemplate::parse(script.to_str().unwrap()).unwrap()
    };
    (log, make)
}

/// The most upgrades that ran at once, and how often each Machine ran, from the shared log.
pub fn concurrency(log: &std::path::Path) -> (usize, std::collections::BTreeMap<String, usize>) {
    concurrency_of(log, |_| true)
}

/// Like [`concurrency`], counting only the Machines `only` accepts.
pub fn concurrency_of(
    log: &std::path::Path,
    only: impl Fn(&str) -> bool,
) -> (usize, std::collections::BTreeMap<String, usize>) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut events: Vec<(f64, i32)> = Vec::new();
    let mut runs = std::collections::BTreeMap::new();
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if !only(parts[1]) {
            continue;
        }
        let t: f64 = parts[2].parse().unwrap();
        if parts[0] == "start" {
            events.push((t, 1));
            *runs.entry(parts[1].to_string()).or_insert(0) += 1;
        } else {
            events.push((t, -1));
        }
    }
    events.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let (mut now, mut max) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        max = max.max(now);
    }
    (max as usize, runs)
}
