//! `caretaker status cluster` against the embedded API server.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use caretaker_apiserver::{ApiServer, TestServer};
use caretaker_testkit::capi_objects::{self, ClusterObjects};
use caretaker_testkit::provision::ClusterCas;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::json;

use common::{caretaker_command, stderr, stdout};

/// The embedded API server with the Cluster API CRDs and Cluster `c1`; a temp dir with its
/// kubeconfig as `kubeconfig`; the Clusters' API.
async fn cluster_c1() -> (ApiServer, tempfile::TempDir, Api<DynamicObject>) {
    let server = TestServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    server
        .write_kubeconfig(tmp.path().join("kubeconfig"))
        .unwrap();
    let client = server.client();
    capi_objects::install_upstream_crds(&client).await.unwrap();
    let cluster = ClusterObjects::new(&client, "default", "c1", "cp.example");
    cluster
        .create(&ClusterCas::create().unwrap())
        .await
        .unwrap();
    let clusters = cluster.api(&caretaker_api::cluster_api::cluster_api_resource());
    (server, tmp, clusters)
}

/// Writes the annotations the operator keeps on a Cluster during a certificate refresh
/// rollout: its status, request id, trigger (1y) and DONE/TOTAL progress.
async fn set_rollout(clusters: &Api<DynamicObject>, request: &str, status: &str, progress: &str) {
    let body = json!({ "metadata": { "annotations": {
        "v1beta2.k8sd.io/refresh-certificates-status": status,
        "caretaker.dev/refresh-request": request,
        "caretaker.dev/refresh-rollout-trigger": "1y",
        "caretaker.dev/progress": progress,
    } } });
    clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();
}

/// `caretaker status cluster CLUSTER --kubeconfig KUBECONFIG ARGS`.
fn status(kubeconfig: &Path, cluster: &str, args: &[&str]) -> Command {
    let mut command = caretaker_command();
    command
        .args(["status", "cluster", cluster, "--kubeconfig"])
        .arg(kubeconfig)
        .args(args);
    command
}

/// Runs `command` to its end, off the async runtime that serves the API server.
async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_progress_and_exits_by_outcome() {
    let (_server, tmp, clusters) = cluster_c1().await;
    let kubeconfig = tmp.path().join("kubeconfig");

    let out = output(status(&kubeconfig, "c1", &[])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("no rollout requested"));

    for (status_value, progress, code) in [
        ("in-progress", "1/4", 2),
        ("failed", "1/4", 1),
        ("cancelled", "2/4", 1),
        ("done", "4/4", 0),
    ] {
        set_rollout(&clusters, "r1", status_value, progress).await;
        let out = output(status(&kubeconfig, "c1", &[])).await;
        let stdout = stdout(&out);
        assert_eq!(out.status.code(), Some(code), "{status_value}: {stdout}");
        assert!(
            stdout.contains(&format!("status   {status_value}")),
            "{stdout}"
        );
        assert!(stdout.contains(&format!("] {progress}")), "{stdout}");
        assert!(stdout.contains("certificate refresh 1y"), "{stdout}");
    }

    let out = output(status(&kubeconfig, "nope", &[])).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("Cluster default/nope not found"));
}

/// A trigger the operator has not taken up yet is a request in progress, even while the
/// Cluster still shows the previous request as done: `--watch` waits for it (as the how-to's
/// `kubectl annotate` then `caretaker status cluster --watch` does) rather than ending at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_waits_for_a_new_trigger_the_operator_has_not_taken_up() {
    let (_server, tmp, clusters) = cluster_c1().await;
    let kubeconfig = tmp.path().join("kubeconfig");
    set_rollout(&clusters, "r1", "done", "3/3").await;
    // The user asks again (a finished request removed its trigger).
    let body = json!({ "metadata": { "annotations": {
        "v1beta2.k8sd.io/refresh-certificates": "2y",
    } } });
    clusters
        .patch("c1", &PatchParams::default(), &Patch::Merge(&body))
        .await
        .unwrap();

    let out = output(status(&kubeconfig, "c1", &[])).await;
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("certificate refresh 2y\nstatus   requested"),
        "{}",
        stdout(&out)
    );

    // The operator takes it up: request r2, for the trigger's value; done removes the trigger.
    let clusters = &clusters;
    let take_up = |status, progress| async move {
        set_rollout(clusters, "r2", status, progress).await;
        let trigger = (status != "done").then_some("2y");
        let body = json!({ "metadata": { "annotations": {
            "caretaker.dev/refresh-rollout-trigger": "2y",
            "v1beta2.k8sd.io/refresh-certificates": trigger,
        } } });
        clusters
            .patch("c1", &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
    };
    let mut watch = Watch::start(&kubeconfig);
    watch.shows("status   requested").await;
    take_up("in-progress", "1/3").await;
    watch.shows("] 1/3").await;
    take_up("done", "3/3").await;
    let exit_code = watch.exit_code().await;
    assert_eq!(exit_code, 0, "{}", watch.output());
}

/// A `caretaker status cluster c1 --watch` child: its stdout collected as it comes, killed when
/// dropped, so a test that panics leaves nothing running.
struct Watch {
    child: std::process::Child,
    output: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Watch {
    fn start(kubeconfig: &Path) -> Self {
        let mut child = status(kubeconfig, "c1", &["--watch"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let output = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let mut stdout = child.stdout.take().unwrap();
        let collected = output.clone();
        std::thread::spawn(move || {
            use std::io::Read as _;
            let mut buffer = [0u8; 4096];
            while let Ok(n @ 1..) = stdout.read(&mut buffer) {
                collected
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buffer[..n]));
            }
        });
        Watch { child, output }
    }

    fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// Waits until the output shows `text`, while the watch keeps running.
    async fn shows(&mut self, text: &str) {
        let deadline = Instant::now() + WATCH_TIMEOUT;
        while !self.output().contains(text) {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "--watch ended ({status}) before it showed {text:?}; it printed:\n{}",
                    self.output()
                );
            }
            if Instant::now() > deadline {
                panic!(
                    "--watch did not show {text:?} within {WATCH_TIMEOUT:?}; it printed:\n{}",
                    self.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the watch ends by itself; its exit code. Kills it and panics if it does not.
    async fn exit_code(&mut self) -> i32 {
        let deadline = Instant::now() + WATCH_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status
                    .code()
                    .expect("--watch exits, not killed by a signal");
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "--watch did not exit within {WATCH_TIMEOUT:?} of the rollout's end (killed \
                     it); it printed:\n{}",
                    self.output()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Far more than the watch's one-second refresh needs, even on a loaded machine.
const WATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// `--watch` follows a rollout as the operator advances it (the operator's progress
/// annotations on the Cluster, written here), keeps running while it is in progress, and ends
/// by itself when the rollout ends: exit 0 when done, 1 when failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_shows_the_progress_changing_and_exits_by_itself_when_the_rollout_ends() {
    let (_server, tmp, clusters) = cluster_c1().await;
    let kubeconfig = tmp.path().join("kubeconfig");
    let set = |request, status, progress| set_rollout(&clusters, request, status, progress);

    // Each round: a rollout in progress, advanced once, then ended with `end` at `last`.
    for (request, end, last, code) in [("r1", "done", "3/3", 0), ("r2", "failed", "2/3", 1)] {
        set(request, "in-progress", "1/3").await;
        let mut watch = Watch::start(&kubeconfig);
        watch.shows("] 1/3").await;
        set(request, "in-progress", "2/3").await;
        watch.shows("] 2/3").await;
        set(request, end, last).await;
        let exit_code = watch.exit_code().await;
        let output = watch.output();
        assert_eq!(exit_code, code, "{end}:\n{output}");
        // What it showed last, after the last view of the rollout in progress.
        let last_view = &output[output.rfind("status   in-progress").unwrap()..];
        assert!(
            last_view.contains(&format!("status   {end}"))
                && last_view.contains(&format!("] {last}")),
            "{end}: the end is not shown:\n{output}"
        );
    }
}
