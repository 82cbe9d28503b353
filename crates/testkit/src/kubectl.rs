//! The real kubectl, for tests that check what users see: with a kubeconfig for one server and
//! a private discovery cache, run off the async runtime that serves the API server.
//!
//! A missing kubectl fails the kubectl tests, because a skipped test would still show `ok`.
//! CARETAKER_SKIP_KUBECTL=1 opts out explicitly, unless CARETAKER_REQUIRE_KUBECTL=1 (which CI
//! sets) forbids that.
//!
//! The API server's kubectl tests compile this file too (`#[path]`: they sit below the test
//! kit), so it uses only what they have: tempfile, serde_json and tokio.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

pub struct Kubectl {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Kubectl {
    /// kubectl ($KUBECTL, then PATH), or None (after saying why) when CARETAKER_SKIP_KUBECTL=1
    /// opts out. `test` names the test in the messages.
    pub fn find(test: &str) -> Option<Kubectl> {
        let set = |var: &str| std::env::var(var).as_deref() == Ok("1");
        let missing = "kubectl not found ($KUBECTL, PATH)";
        let bin = std::env::var_os("KUBECTL")
            .map(PathBuf::from)
            .into_iter()
            .chain(std::env::var_os("PATH").iter().flat_map(|paths| {
                std::env::split_paths(paths)
                    .map(|dir| dir.join("kubectl"))
                    .collect::<Vec<_>>()
            }))
            .find(|p| p.is_file());
        match bin {
            Some(bin) => Some(Kubectl {
                bin,
                dir: tempfile::tempdir().expect("a temporary directory"),
            }),
            None if set("CARETAKER_REQUIRE_KUBECTL") => {
                panic!("{test}: {missing} and CARETAKER_REQUIRE_KUBECTL=1")
            }
            None if set("CARETAKER_SKIP_KUBECTL") => {
                eprintln!("SKIPPED {test}: {missing}; CARETAKER_SKIP_KUBECTL=1");
                None
            }
            None => panic!(
                "{test}: {missing}; install kubectl, or set CARETAKER_SKIP_KUBECTL=1 to skip the kubectl tests"
            ),
        }
    }

    /// This kubectl, talking to the server of `kubeconfig` (the text of one).
    pub fn against(self, kubeconfig: &str) -> Self {
        std::fs::write(self.dir.path().join("kubeconfig"), kubeconfig).expect("write kubeconfig");
        self
    }

    /// `kubectl ARGS` with this kubeconfig and cache, to run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.bin);
        command
            .arg("--kubeconfig")
            .arg(self.dir.path().join("kubeconfig"))
            .arg("--cache-dir")
            .arg(self.dir.path().join("cache"))
            .args(args);
        command
    }

    /// Runs kubectl with `stdin`, on a blocking thread.
    pub async fn run(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut command = self.command(args);
        let stdin = stdin.map(String::from);
        tokio::task::spawn_blocking(move || {
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let mut child = command.spawn().expect("run kubectl");
            let mut input = child.stdin.take().expect("kubectl's stdin");
            input
                .write_all(stdin.unwrap_or_default().as_bytes())
                .expect("write kubectl's stdin");
            drop(input);
            child.wait_with_output().expect("wait for kubectl")
        })
        .await
        .expect("the kubectl thread")
    }

    /// kubectl's stdout, after checking that it succeeded.
    pub async fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let output = self.run(args, stdin).await;
        assert!(
            output.status.success(),
            "kubectl {args:?}: {}{}",
            stdout(&output),
            stderr(&output)
        );
        stdout(&output)
    }

    /// kubectl's stderr, after checking that it failed.
    pub async fn fails(&self, args: &[&str], stdin: Option<&str>) -> String {
        let output = self.run(args, stdin).await;
        assert!(
            !output.status.success(),
            "kubectl {args:?} should have failed: {}",
            stdout(&output)
        );
        stderr(&output)
    }

    /// `kubectl ARGS -o json`, parsed.
    pub async fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        serde_json::from_str(&self.ok(&all, None).await).expect("kubectl printed JSON")
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}
