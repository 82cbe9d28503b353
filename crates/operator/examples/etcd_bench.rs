//! etcd certificates benchmark (issue 14): a real three-member etcd cluster with peer and
//! client TLS (Debian's `etcd-server`), its certificates from an EtcdCertificates
//! (`trustPropagation: 1s`) on the
//! embedded API server, installed by the testkit's harness (members restart one at a time onto
//! each new `etcd-all-certs`). Eight clients write and read back continuously (the v3 JSON
//! gateway over mutual TLS, one connection per request, failing over between members as
//! etcd's client does) while `etcd-signer` is rotated (the documented way: its
//! `auth.openshift.io/certificate-not-after` removed). Prints client operations per second
//! before, during and after the rotation, failed operations, and the longest time in which
//! no operation completed.
//!
//! `cargo run --release -p caretaker-operator --example etcd_bench [-- WINDOW_SECONDS]`
//! (default 15: the length of the before and after windows).

use std::time::{Duration, Instant};

use caretaker_api::v1alpha1::{self, EtcdCertificates};
use caretaker_apiserver::TestServer;
use caretaker_operator::etcd::controller as etcd_certificates;
use caretaker_operator::{Context, Settings};
use caretaker_testkit::etcd::{self, EtcdCluster, Load};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::json;

const NS: &str = "etcd-system";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let window: u64 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("WINDOW_SECONDS is a number"))
        .unwrap_or(15);
    if !etcd::etcd_available("etcd_bench") {
        std::process::exit(2);
    }
    let server = TestServer::start().await;
    let client = server.client();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in v1alpha1::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let namespace = serde_json::from_value::<Namespace>(json!({"metadata": {"name": NS}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let mut cluster = EtcdCluster::new(&client, NS);
    let object = cluster.certificates_object(NS);
    let objects: Api<EtcdCertificates> = Api::namespaced(client.clone(), NS);
    objects
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let ctx = Context::new(client.clone(), Settings::default());
    let _operator = tokio::spawn(etcd_certificates::run(ctx));
    cluster.bootstrap(60).await;
    println!(
        "etcd_bench: three members up on revision {:?}",
        cluster.installed
    );

    let etcd_client = cluster.client().await;
    let load = Load::start(&cluster, &etcd_client, 8);
    tokio::time::sleep(Duration::from_secs(window)).await;
    let rotation_start = load.started.elapsed();
    cluster.force_rotation().await;
    let first = cluster.installed.len();
    // The rotation ends once the third revision (the old signer gone) is installed.
    let deadline = Instant::now() + Duration::from_secs(300);
    while cluster.installed.len() < first + 3 {
        assert!(
            Instant::now() < deadline,
            "the rotation did not end within 300 s"
        );
        if !cluster.install_if_changed().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let rotation_end = load.started.elapsed();
    tokio::time::sleep(Duration::from_secs(window)).await;
    let end = load.started.elapsed();
    let load = load.stop().await;

    let mut done = load.completions.lock().unwrap().clone();
    done.sort_unstable();
    let rate = |from: Duration, to: Duration| {
        let n = done.iter().filter(|t| **t >= from && **t < to).count();
        n as f64 / (to - from).as_secs_f64()
    };
    let before = rate(Duration::ZERO, rotation_start);
    let during = rate(rotation_start, rotation_end);
    let after = rate(rotation_end, end);
    let longest_pause = done
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
        .as_millis();
    let failed = load.failed().len();
    println!(
        "rotation: {:.1} s, {} revisions installed ({:?})",
        (rotation_end - rotation_start).as_secs_f64(),
        cluster.installed.len() - first,
        &cluster.installed[first..]
    );
    println!(
        "client operations per second: before {before:.0}, during {during:.0}, after {after:.0}"
    );
    println!(
        "failed operations: {failed}; longest time with no operation completed: {longest_pause} ms"
    );
    println!(
        "goals: zero failed operations: {}; throughput during the rotation at least half of before: {} ({:.0}%)",
        if failed == 0 { "met" } else { "missed" },
        if during >= before / 2.0 {
            "met"
        } else {
            "missed"
        },
        100.0 * during / before
    );
}
