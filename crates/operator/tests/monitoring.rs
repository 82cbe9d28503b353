//! deploy/monitoring as Prometheus, Grafana and the operator see it: the PrometheusRule's
//! groups pass `promtool check rules`, and `promtool test rules` on deploy/monitoring's
//! alerts-test.yaml (series that fire each alert and series that must not); the dashboard's
//! queries are PromQL; and every metric the rules and the dashboard name is one a running
//! operator exports on `/metrics`.
//!
//! promtool is Debian's `prometheus` package. Without it the promtool tests skip, saying so,
//! unless CARETAKER_REQUIRE_PROMTOOL=1 (which CI sets): then they fail.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_operator::metrics::{Limits, Metrics, serve_metrics};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use common::authorities::{certificate_authority, create_namespace, install_caretaker_crds};
use common::{NS, fast, unreachable_agent_url, world};

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/monitoring")
        .join(file)
}

fn read(file: &str) -> String {
    std::fs::read_to_string(monitoring(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// The PrometheusRule's `spec`: a Prometheus rules file's `groups`.
fn rule_groups() -> Value {
    let rule: Value = serde_saphyr::from_str(&read("prometheusrule.yaml")).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    rule["spec"].clone()
}

fn alert_names() -> BTreeSet<String> {
    let groups = rule_groups();
    let rules = groups["groups"].as_array().unwrap().iter();
    rules
        .flat_map(|g| g["rules"].as_array().unwrap().iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

fn dashboard() -> Value {
    serde_json::from_str(&read("dashboards/caretaker.json")).unwrap()
}

/// Every query of the dashboard's panels.
fn dashboard_queries() -> Vec<String> {
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().unwrap();
    let queries: Vec<String> = panels
        .iter()
        .filter_map(|p| p["targets"].as_array())
        .flatten()
        .map(|t| t["expr"].as_str().expect("each target has a query").into())
        .collect();
    assert!(queries.len() >= 10, "{queries:?}");
    queries
}

/// The `caretaker_*` metric names in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = BTreeSet::new();
    for (at, _) in text.match_indices("caretaker_") {
        if text[..at].chars().next_back().is_some_and(word) {
            continue;
        }
        let name: String = text[at..].chars().take_while(|c| word(*c)).collect();
        found.insert(name);
    }
    found
}

/// promtool, or `None` (the test skips, saying so) when it is not installed and CI's
/// CARETAKER_REQUIRE_PROMTOOL=1 is not set.
fn promtool(test: &str) -> Option<&'static str> {
    if Command::new("promtool").arg("--version").output().is_ok() {
        return Some("promtool");
    }
    if std::env::var("CARETAKER_REQUIRE_PROMTOOL").is_ok_and(|v| v == "1") {
        panic!("{test}: promtool is not installed and CARETAKER_REQUIRE_PROMTOOL=1");
    }
    eprintln!("{test}: skipped: promtool is not installed (Debian: apt-get install prometheus)");
    None
}

fn run(promtool: &str, dir: &Path, args: &[&str]) {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alerts_pass_promtool_check_and_test_rules() {
    let Some(promtool) = promtool("the_alerts_pass_promtool_check_and_test_rules") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // JSON is YAML: the rules file promtool reads, as alerts-test.yaml names it.
    let rules = serde_json::to_string_pretty(&rule_groups()).unwrap();
    std::fs::write(dir.path().join("caretaker-rules.yaml"), rules).unwrap();
    std::fs::write(
        dir.path().join("alerts-test.yaml"),
        read("alerts-test.yaml"),
    )
    .unwrap();
    run(
        promtool,
        dir.path(),
        &["check", "rules", "caretaker-rules.yaml"],
    );
    run(promtool, dir.path(), &["test", "rules", "alerts-test.yaml"]);
}

/// Each alert has a case in alerts-test.yaml where it fires: a rule promtool never saw fire
/// could be one that never does.
#[test]
fn every_alert_is_tested_firing() {
    let tests: Value = serde_saphyr::from_str(&read("alerts-test.yaml")).unwrap();
    let firing: BTreeSet<String> = (tests["tests"].as_array().unwrap().iter())
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap().iter())
        .filter(|case| case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()))
        .map(|case| case["alertname"].as_str().unwrap().to_string())
        .collect();
    let alerts = alert_names();
    assert_eq!(alerts.len(), 10, "{alerts:?}");
    assert_eq!(firing, alerts);
    // The OpenShift etcd operator's names, so its runbooks and silences apply.
    for upstream in [
        "etcdSignerCAExpirationWarning",
        "etcdSignerCAExpirationCritical",
    ] {
        assert!(alerts.contains(upstream), "{upstream}");
    }
}

#[test]
fn the_dashboards_queries_are_promql() {
    let Some(promtool) = promtool("the_dashboards_queries_are_promql") else {
        return;
    };
    // Each query as a recording rule, Grafana's interval variable given a value.
    let rules: Vec<Value> = (dashboard_queries().iter().enumerate())
        .map(|(i, query)| {
            json!({
                "record": format!("caretaker:dashboard_query_{i}"),
                "expr": query.replace("$__rate_interval", "5m"),
            })
        })
        .collect();
    let groups = json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("dashboard-queries.yaml"),
        groups.to_string(),
    )
    .unwrap();
    run(
        promtool,
        dir.path(),
        &["check", "rules", "dashboard-queries.yaml"],
    );
}

/// The kustomization names files that exist, and puts the dashboard in a ConfigMap Grafana's
/// sidecar loads.
#[test]
fn the_kustomization_installs_the_rules_and_the_dashboard() {
    let kustomization: Value = serde_saphyr::from_str(&read("kustomization.yaml")).unwrap();
    for resource in kustomization["resources"].as_array().unwrap() {
        let file = resource.as_str().unwrap();
        assert!(monitoring(file).is_file(), "{file}");
    }
    let resources: Vec<&str> = (kustomization["resources"].as_array().unwrap().iter())
        .filter_map(Value::as_str)
        .collect();
    assert!(resources.contains(&"prometheusrule.yaml"));
    let generator = &kustomization["configMapGenerator"][0];
    assert_eq!(generator["files"][0], "dashboards/caretaker.json");
    assert_eq!(generator["options"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(dashboard()["uid"], "caretaker-overview");
}

/// Drives a running operator until `/metrics` shows every metric the rules and the dashboard
/// name (a family of counters or a histogram appears once it has a series): Machines with an
/// agent and without one (a failed refresh of their MachineDeployment), a CertificateAuthority
/// that works, one refused (Degraded) and one whose Secret cannot be written (reconcile
/// errors). A metric named in deploy/monitoring that the operator does not export fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let mut named = metric_names(&read("prometheusrule.yaml"));
    named.extend(dashboard_queries().iter().flat_map(|q| metric_names(q)));
    assert!(named.len() >= 10, "{named:?}");

    let mut world = world(fast()).await;
    let address = metrics_server(world.ctx.metrics.clone()).await;
    world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    world
        .add_machine(
            "w-0",
            NodeRole::Worker,
            "cp.example",
            Some(&unreachable_agent_url()),
        )
        .await;
    let client = world.client.clone();
    install_caretaker_crds(&client).await;
    create_namespace(&client, "caretaker-system").await;
    let authorities: Api<caretaker_api::v1alpha1::CertificateAuthority> = Api::all(client.clone());
    let create = async |ca: caretaker_api::v1alpha1::CertificateAuthority| {
        authorities.create(&PostParams::default(), &ca).await
    };
    create(certificate_authority(
        "monitored",
        "caretaker-system",
        json!({}),
    ))
    .await
    .unwrap();
    // Someone else's Secret at the name: refused, Degraded.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "caretaker-system");
    let foreign: Secret =
        serde_json::from_value(json!({ "metadata": { "name": "taken-ca" }, "data": {} })).unwrap();
    secrets
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    create(certificate_authority(
        "taken",
        "caretaker-system",
        json!({}),
    ))
    .await
    .unwrap();
    // A Secret in a namespace that does not exist: every write of it fails.
    create(certificate_authority(
        "nowhere",
        "no-such-namespace",
        json!({}),
    ))
    .await
    .unwrap();
    // A refresh of the MachineDeployment fails on w-0's missing agent.
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        NS,
        &caretaker_api::cluster_api::machine_deployment_api_resource(),
    );
    let trigger = json!({ "metadata": { "annotations": { names::REFRESH_CERTIFICATES: "90d" } } });
    deployments
        .patch("c1-md-0", &PatchParams::default(), &Patch::Merge(&trigger))
        .await
        .unwrap();

    // And the series the alerts read, of what the test set up.
    let series = [
        ("caretaker_degraded", "name=\"taken\""),
        ("caretaker_rollout_status", "status=\"failed\""),
        (
            "caretaker_certificate_renewal_seconds",
            "name=\"monitored\"",
        ),
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let text = scrape(address).await;
        let missing = not_exported(&named, &text);
        let absent: Vec<_> = (series.iter())
            .filter(|(name, labels)| {
                !text
                    .lines()
                    .any(|l| l.starts_with(name) && l.contains(labels))
            })
            .collect();
        if missing.is_empty() && absent.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "named in deploy/monitoring, never exported: {missing:?}; no series {absent:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The names of `named` that a scrape's `text` has no sample of, nor declares as a gauge (a
/// collector's gauge may have no series here: no EtcdCertificates runs in this test).
fn not_exported(named: &BTreeSet<String>, text: &str) -> Vec<String> {
    let exposition = common::openmetrics::parse(text).unwrap();
    let mut exported: BTreeSet<&str> = (exposition.samples.iter())
        .map(|s| s.name.as_str())
        .collect();
    let gauges = exposition.types.iter().filter(|(_, kind)| *kind == "gauge");
    exported.extend(gauges.map(|(family, _)| family.as_str()));
    (named.iter())
        .filter(|name| !exported.contains(name.as_str()))
        .cloned()
        .collect()
}

async fn metrics_server(metrics: Arc<Metrics>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(serve_metrics(listener, metrics, Limits::default()));
    address
}

/// GET /metrics over HTTP/1.1, with hyper's client, as a Prometheus scrape does.
async fn scrape(address: std::net::SocketAddr) -> String {
    use http_body_util::BodyExt;
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = hyper::Request::get("/metrics")
        .header("host", address.to_string())
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    assert_eq!(response.status(), hyper::StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}
