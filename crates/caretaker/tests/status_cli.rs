//! `caretaker status cluster` against the embedded API server.

use std::process::Command;

use caretaker_agent::provision::ClusterCas;
use caretaker_apiserver::TestServer;
use caretaker_operator::capi_objects::{self, ClusterObjects};
use kube::api::{Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_progress_and_exits_by_outcome() {
    let server = TestServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let client = server.client();
    capi_objects::install_upstream_crds(&client).await.unwrap();
    let cluster = ClusterObjects::new(&client, "default", "c1", "cp.example");
    cluster
        .create(&ClusterCas::create().unwrap())
        .await
        .unwrap();
    let clusters = cluster.api(&caretaker_operator::machine::cluster_api_resource());

    let status = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_caretaker"));
        command
            .args(["status", "cluster", "c1", "--kubeconfig"])
            .arg(&kubeconfig)
            .args(args);
        command
    };
    let run = |mut command: Command| {
        let kubeconfig = kubeconfig.clone();
        let _ = kubeconfig;
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    let out = run(status(&[])).await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("no rollout requested"));

    for (status_value, progress, code) in [
        ("in-progress", "1/4", 2),
        ("failed", "1/4", 1),
        ("cancelled", "2/4", 1),
        ("done", "4/4", 0),
    ] {
        let body = json!({ "metadata": { "annotations": {
            "v1beta2.k8sd.io/refresh-certificates-status": status_value,
            "caretaker.dev/refresh-request": "r1",
            "caretaker.dev/refresh-rollout-trigger": "1y",
            "caretaker.dev/progress": progress,
        } } });
        clusters
            .patch("c1", &PatchParams::default(), &Patch::Merge(&body))
            .await
            .unwrap();
        let out = run(status(&[])).await.unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(code), "{status_value}: {stdout}");
        assert!(
            stdout.contains(&format!("status   {status_value}")),
            "{stdout}"
        );
        assert!(stdout.contains(&format!("] {progress}")), "{stdout}");
        assert!(stdout.contains("certificate refresh 1y"), "{stdout}");
    }

    let out = run({
        let mut c = Command::new(env!("CARGO_BIN_EXE_caretaker"));
        c.args(["status", "cluster", "nope", "--kubeconfig"])
            .arg(&kubeconfig);
        c
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("Cluster default/nope not found"));
}
