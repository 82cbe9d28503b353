//! `caretaker demo` as a user runs it: real processes, real files.

mod common;

use std::io::BufRead as _;
use std::path::Path;
use std::process::Stdio;

use caretaker_agent::NodeLayout;
use caretaker_testkit::process::has_exited;
use common::{assert_one_error_line, caretaker, caretaker_command, stderr, stdout};

#[test]
fn the_demo_refreshes_every_machine_and_shows_before_and_after() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let stdout = run_small_demo(&dir, &["--refresh", "2y"]);
    assert!(
        stdout.contains("cluster-wide certificate refresh"),
        "{stdout}"
    );
    assert!(stdout.contains("status   done"), "{stdout}");
    assert!(stdout.contains("] 2/2"), "{stdout}");
    assert!(stdout.contains("EARLIEST EXPIRY BEFORE"), "{stdout}");

    assert!(dir.join("kubeconfig").exists());
    assert!(dir.join("operator.pid").exists());
    for machine in ["demo-cp-0", "demo-md-0-0"] {
        let node = dir.join("nodes").join(machine);
        for file in ["agent.pid", "upgrade.sh", "restart.sh"] {
            assert!(node.join(file).exists(), "{machine}/{file}");
        }
        let inventory = caretaker_agent::inventory::discover(&NodeLayout::new(
            node.join("pki"),
            node.join("kubeconfigs"),
        ));
        let days =
            (inventory.earliest_expiry().unwrap() - time::OffsetDateTime::now_utc()).whole_days();
        assert!(days > 700, "{machine}: {days} days left");
    }
    // The agents and the operator are gone.
    for pid_file in [
        dir.join("operator.pid"),
        dir.join("nodes/demo-cp-0/agent.pid"),
    ] {
        let pid = std::fs::read_to_string(&pid_file).unwrap();
        assert!(
            has_exited(pid.trim().parse().unwrap()),
            "{} still runs",
            pid_file.display()
        );
    }
}

#[test]
fn the_demo_upgrades_every_machine_in_place() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let stdout = run_small_demo(&dir, &["--upgrade-to", "channel=1.34/stable"]);
    assert!(
        stdout.contains("in-place upgrade channel=1.34/stable"),
        "{stdout}"
    );
    for machine in ["demo-cp-0", "demo-md-0-0"] {
        let release =
            std::fs::read_to_string(dir.join("nodes").join(machine).join("release")).unwrap();
        assert_eq!(release.trim(), "channel=1.34/stable");
    }
    let bad = caretaker_command()
        .args(["demo", "--upgrade-to", "1.34", "--state-dir"])
        .arg(tmp.path().join("other"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("channel=<channel>"));
}

/// Issue 34: `demo --etcd` runs a real etcd cluster whose members only caretaker's agents
/// restart, rotates its signer while a client writes, prints the members' revisions as they
/// move (1, then each of the rotation's three revisions) and ends with 0 failed writes.
#[test]
fn the_etcd_demo_rotates_the_signer_while_a_client_writes_and_loses_nothing() {
    if !caretaker_testkit::etcd::etcd_available("the_etcd_demo_rotates_the_signer") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let out = caretaker_command()
        .args(["demo", "--etcd", "--control-planes", "1", "--workers", "1"])
        .arg("--state-dir")
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = stdout(&out);
    assert!(out.status.success(), "{stdout}\n{}", stderr(&out));
    let lines: Vec<&str> = stdout.lines().map(str::trim).collect();
    for revision in 1..=4 {
        let everyone = format!(
            "latest revision {revision}: m0 at {revision}, m1 at {revision}, m2 at {revision}"
        );
        assert!(lines.contains(&everyone.as_str()), "{everyone}: {stdout}");
    }
    // One member at a time, in name order: each says so as it comes up on revision 2.
    let updated = |m: &str| {
        let phrase = format!("Updated node \"{m}\" from revision 1 to 2");
        (lines.iter().position(|l| l.contains(&phrase)))
            .unwrap_or_else(|| panic!("{phrase}: {stdout}"))
    };
    assert!(
        updated("m0") < updated("m1") && updated("m1") < updated("m2"),
        "{stdout}"
    );
    let summary = lines
        .iter()
        .find(|l| l.contains("writes, each read back"))
        .unwrap_or_else(|| panic!("no write count: {stdout}"));
    assert!(
        summary.contains(": 0 failed, 0 certificate errors")
            && summary.contains("every member healthy"),
        "{summary}"
    );
    let writes: usize = summary
        .trim_start_matches("==> etcd: ")
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(writes > 10, "{summary}");
    // Every etcd the demo started is gone.
    for m in ["m0", "m1", "m2"] {
        let pid = read_pid(&dir.join("etcd").join(m).join("etcd.pid"));
        assert!(
            caretaker_testkit::process::exits_soon(pid),
            "{m}'s etcd still runs"
        );
    }
}

/// Runs a demo of one control plane and one worker in `dir` with `extra` arguments; it must
/// succeed. Returns its output.
fn run_small_demo(dir: &std::path::Path, extra: &[&str]) -> String {
    let out = caretaker_command()
        .args(["demo", "--control-planes", "1", "--workers", "1"])
        .args(extra)
        .arg("--state-dir")
        .arg(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    stdout(&out)
}

#[test]
fn the_demo_refuses_a_used_state_dir_and_bad_values() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("something"), "x").unwrap();
    for (args, named) in [
        (
            vec!["demo", "--state-dir", tmp.path().to_str().unwrap()],
            "not empty",
        ),
        (
            vec![
                "demo",
                "--refresh",
                "1 year",
                "--state-dir",
                "/nonexistent-demo",
            ],
            "\"1 year\"",
        ),
    ] {
        assert_one_error_line(&caretaker(&args), named);
    }
}

#[test]
fn the_operator_names_a_bad_kubeconfig() {
    let out = caretaker(&["operator", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("/nonexistent/kubeconfig"));
    let out = caretaker(&["operator", "--retry-base", "soon"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("\"soon\""));
}

/// Issue 11: every DURATION flag is parsed by clap, so a bad value is a usage error (exit
/// status 2) that names the flag and the value, before the command does anything.
#[test]
fn a_bad_duration_is_a_usage_error_naming_the_flag_and_the_value() {
    for (command, flag) in [
        ("operator", "--retry-base"),
        ("operator", "--agent-timeout"),
        ("operator", "--upgrade-poll"),
        ("agent", "--restart-timeout"),
        ("agent", "--upgrade-timeout"),
    ] {
        for value in ["soon", "5x", "-1m", "0s", "1 h"] {
            let out = caretaker(&[command, &format!("{flag}={value}")]);
            let err = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{command} {flag}={value}: {err}"
            );
            assert!(
                err.contains(&format!("invalid value '{value}' for '{flag} <DURATION>'")),
                "{command} {flag}={value}: {err}"
            );
        }
    }
}

/// Where the demo is when it gets a signal.
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Half-way: everything started, the rollout not over (its operator is held with SIGSTOP).
    HalfWay,
    /// Done, and staying up with --keep-running.
    KeepRunning,
}

/// Issue 9, item 19: SIGTERM and SIGHUP, as `timeout`, systemd or a CI runner send them, stop
/// everything the demo started, as Ctrl-C does.
#[test]
fn a_signal_stops_the_demo_and_everything_it_started() {
    for (signal, phase) in [
        (libc::SIGTERM, Phase::HalfWay),
        (libc::SIGHUP, Phase::HalfWay),
        (libc::SIGINT, Phase::HalfWay),
        (libc::SIGTERM, Phase::KeepRunning),
        (libc::SIGHUP, Phase::KeepRunning),
    ] {
        let case = format!("signal {signal} {phase:?}");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("demo");
        let mut demo = caretaker_command()
            .args(["demo", "--control-planes", "1", "--workers", "1"])
            .args(matches!(phase, Phase::KeepRunning).then_some("--keep-running"))
            .arg("--state-dir")
            .arg(&dir)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let ready = match phase {
            Phase::HalfWay => "==> operator running",
            Phase::KeepRunning => "Press Ctrl-C to stop",
        };
        let mut output = String::new();
        let mut lines = std::io::BufReader::new(demo.stdout.take().unwrap()).lines();
        while !output.contains(ready) {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("{case}: the demo ended before {ready:?}:\n{output}"));
            output.push_str(&line.unwrap());
            output.push('\n');
        }
        let operator = read_pid(&dir.join("operator.pid"));
        if matches!(phase, Phase::HalfWay) {
            // The rollout cannot end while the operator is stopped: the demo stays half-way.
            // SAFETY: kill(2) on a pid the demo wrote; no memory is involved.
            unsafe { libc::kill(operator, libc::SIGSTOP) };
        }
        let recorded = [
            operator,
            read_pid(&dir.join("nodes/demo-cp-0/agent.pid")),
            read_pid(&dir.join("nodes/demo-md-0-0/agent.pid")),
        ];
        // One scan of /proc under a loaded machine has been seen to miss a process; look a few
        // times before concluding one is not running.
        let mut started = Vec::new();
        for _ in 0..20 {
            started = processes_naming(&dir, demo.id() as i32);
            if recorded.iter().all(|pid| started.contains(pid)) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        for pid in recorded {
            assert!(
                started.contains(&pid),
                "{case}: {pid} not in {started:?}; its stat: {:?}, cmdline: {:?}; logs:\n{}",
                std::fs::read_to_string(format!("/proc/{pid}/stat")),
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).into_owned()),
                demo_logs(&dir)
            );
        }

        // SAFETY: as above, on the demo this test started.
        unsafe { libc::kill(demo.id() as i32, signal) };
        let status = demo.wait().unwrap();
        let left = processes_naming(&dir, demo.id() as i32);
        for pid in &left {
            // SAFETY: as above; leftovers must not outlive the test.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "{case}: still running: {left:?}");
        let expected = match phase {
            Phase::HalfWay => 128 + signal,
            Phase::KeepRunning => 0,
        };
        assert_eq!(status.code(), Some(expected), "{case}: {status:?}");
    }
}

fn read_pid(file: &Path) -> i32 {
    let text = std::fs::read_to_string(file).unwrap();
    text.trim().parse().unwrap()
}

/// The live processes other than `except` whose command line names `dir`: the demo's agents,
/// its operator and anything they run from the demo's directory.
/// The operator's and the agents' logs of a demo, to say why a process is missing.
fn demo_logs(dir: &Path) -> String {
    let mut logs = vec![dir.join("operator.log")];
    for node in std::fs::read_dir(dir.join("nodes"))
        .into_iter()
        .flatten()
        .flatten()
    {
        logs.push(node.path().join("agent.log"));
    }
    logs.iter()
        .map(|l| {
            format!(
                "--- {}\n{}",
                l.display(),
                std::fs::read_to_string(l).unwrap_or_default()
            )
        })
        .collect()
}

fn processes_naming(dir: &Path, except: i32) -> Vec<i32> {
    let dir = dir.to_str().unwrap();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if pid != except && !has_exited(pid) && String::from_utf8_lossy(&cmdline).contains(dir) {
            found.push(pid);
        }
    }
    found
}
