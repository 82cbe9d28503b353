//! `caretaker status cluster` against the embedded API server.

use std::path::Path;
use std::process::Command;

use caretaker_apiserver::TestServer;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_progress_and_exits_by_outcome() {
    let server = TestServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for file in [
        "cluster.x-k8s.io_clusters.yaml",
        "cluster.x-k8s.io_machines.yaml",
    ] {
        let text = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../deploy/upstream-crds")
                .join(file),
        )
        .unwrap();
        let value: serde_json::Value = serde_saphyr::from_str(&text).unwrap();
        crds.create(
            &PostParams::default(),
            &serde_json::from_value(value).unwrap(),
        )
        .await
        .unwrap();
    }
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &caretaker_operator::machine::cluster_api_resource(),
    );
    let cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster", "metadata": { "name": "c1" },
        "spec": { "controlPlaneEndpoint": { "host": "cp.example", "port": 6443 } }
    }))
    .unwrap();
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .unwrap();

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
