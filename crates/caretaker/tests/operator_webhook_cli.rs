//! `caretaker operator`'s admission webhook, metrics and probe flags, as a user runs the
//! binary: the help that explains them, the usage errors, and the webhook served from a
//! Secret, called by the embedded API server, beside `/metrics`, `/healthz` and `/readyz`.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use caretaker_api::v1alpha1::{CertificateAuthority as CaObject, crds};
use caretaker_apiserver::TestServer;
use caretaker_operator::webhook::{self, Endpoint};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use common::{assert_one_error_line, caretaker, caretaker_command, path, stderr, stdout};

#[test]
fn the_help_explains_the_webhook_flags_and_paths() {
    let out = caretaker(&["operator", "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = stdout(&out);
    for expected in [
        "--webhook-bind-address <ADDRESS>",
        "[default: :9443]",
        "--webhook-secret <NAMESPACE/NAME>",
        "--webhook-cert-path <DIR>",
        "--webhook-cert-name <FILE>",
        "--webhook-cert-key <FILE>",
        "--webhook-bootstrap <NAMESPACE/SERVICE>",
        "--webhook-url <URL>",
        "CertificateAuthority caretaker-webhook",
        "IssuedCertificate caretaker-webhook",
        "caretaker-webhook-tls",
        "caretaker.dev/inject-ca-from",
        "/validate-caretaker-dev-v1alpha1-certificateauthority",
        "/validate-caretaker-dev-v1alpha1-issuedcertificate",
        "kubernetes.io/tls",
    ] {
        assert!(help.contains(expected), "{expected}:\n{help}");
    }
}

#[test]
fn the_help_explains_the_metrics_and_probe_flags() {
    let out = caretaker(&["operator", "--help"]);
    let help = stdout(&out);
    for expected in [
        "--metrics-bind-address <ADDRESS>",
        "[default: :8080]",
        "--health-probe-bind-address <ADDRESS>",
        "[default: :8081]",
        "/metrics",
        "/healthz",
        "/readyz",
        "127.0.0.1:PORT",
        "0 turns it off",
        "--metrics-cert-path <DIR>",
        "--metrics-client-ca <FILE>",
        "mutual TLS",
    ] {
        assert!(help.contains(expected), "{expected}:\n{help}");
    }
}

#[test]
fn bad_webhook_flags_are_usage_errors() {
    for (args, says) in [
        (
            &["--webhook-secret", "webhook-tls"][..],
            "invalid value 'webhook-tls' for '--webhook-secret <NAMESPACE/NAME>': expected NAMESPACE/NAME",
        ),
        (&["--webhook-secret", "ns/"][..], "expected NAMESPACE/NAME"),
        (
            &["--webhook-bind-address", "9443"][..],
            "invalid value '9443' for '--webhook-bind-address <ADDRESS>': no port",
        ),
        (
            &["--webhook-secret", "ns/tls", "--webhook-cert-path", "/tmp"][..],
            "cannot be used with",
        ),
        (
            &["--metrics-bind-address", "8080"][..],
            "invalid value '8080' for '--metrics-bind-address <ADDRESS>': no port",
        ),
        (
            &["--health-probe-bind-address", "::1:8081"][..],
            "take brackets",
        ),
        (
            &["--metrics-cert-path", "/tmp"][..],
            "--metrics-client-ca <FILE>",
        ),
        (
            &["--metrics-client-ca", "/tmp/ca.crt"][..],
            "--metrics-cert-path <DIR>",
        ),
        (
            &["--webhook-cert-name", "cert.pem"][..],
            "--webhook-cert-path <DIR>",
        ),
        (
            &["--webhook-bootstrap", "caretaker-webhook"][..],
            "invalid value 'caretaker-webhook' for '--webhook-bootstrap <NAMESPACE/SERVICE>': expected NAMESPACE/NAME",
        ),
        (
            &[
                "--webhook-bootstrap",
                "ns/svc",
                "--webhook-secret",
                "ns/tls",
            ][..],
            "cannot be used with",
        ),
        (
            &[
                "--webhook-bootstrap",
                "ns/svc",
                "--webhook-cert-path",
                "/tmp",
            ][..],
            "cannot be used with",
        ),
        (
            &["--webhook-url", "https://127.0.0.1:9443"][..],
            "--webhook-bootstrap <NAMESPACE/SERVICE>",
        ),
        (
            &[
                "--webhook-bootstrap",
                "ns/svc",
                "--webhook-url",
                "http://127.0.0.1:9443",
            ][..],
            "invalid value 'http://127.0.0.1:9443' for '--webhook-url <URL>': expected https://HOST:PORT",
        ),
        (
            &[
                "--webhook-bootstrap",
                "ns/svc",
                "--webhook-url",
                "https://127.0.0.1:9443/x",
            ][..],
            "without a path",
        ),
    ] {
        let mut all = vec!["operator"];
        all.extend(args);
        let out = caretaker(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{args:?}: {}", stderr(&out));
    }
}

/// A kubeconfig for a server that is never reached: the commands below fail before.
fn unreached_kubeconfig(dir: &std::path::Path) -> std::path::PathBuf {
    let file = dir.join("kubeconfig");
    std::fs::write(
        &file,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\n\
         users:\n- name: u\n  user: {token: t}\ncontexts:\n- name: c\n  context: {cluster: c, user: u}\n\
         current-context: c\n",
    )
    .unwrap();
    file
}

#[test]
fn a_webhook_that_cannot_start_stops_the_operator_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = unreached_kubeconfig(dir.path());
    let missing = dir.path().join("missing");
    let out = caretaker(&[
        "operator",
        "--kubeconfig",
        path(&kubeconfig),
        "--webhook-cert-path",
        path(&missing),
    ]);
    let line = assert_one_error_line(&out, path(&missing.join("tls.crt")));
    assert!(
        line.starts_with("caretaker operator: admission webhook: "),
        "{line}"
    );

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let out = caretaker(&[
        "operator",
        "--kubeconfig",
        path(&kubeconfig),
        "--webhook-bind-address",
        &address,
        "--webhook-secret",
        "caretaker-system/webhook-tls",
    ]);
    let line = assert_one_error_line(&out, &format!("cannot listen on {address}"));
    assert!(line.contains("in use"), "{line}");

    // The bootstrap's objects must be in the namespace the operator watches.
    let out = caretaker(&[
        "operator",
        "--kubeconfig",
        path(&kubeconfig),
        "--namespace",
        "tenant",
        "--webhook-bootstrap",
        "caretaker-system/caretaker-webhook",
    ]);
    let line = assert_one_error_line(&out, "--webhook-bootstrap caretaker-system/");
    assert!(
        line.contains("the namespace must be the one --namespace watches (tenant)"),
        "{line}"
    );

    // Each server's own flag is named; the other one is off, not on its default port.
    for (flag, other) in [
        ("--metrics-bind-address", "--health-probe-bind-address"),
        ("--health-probe-bind-address", "--metrics-bind-address"),
    ] {
        let out = caretaker_command()
            .args(["operator", "--kubeconfig", path(&kubeconfig)])
            .args([other, "0", flag, &address])
            // Not the lines saying what is off.
            .env("RUST_LOG", "error")
            .output()
            .unwrap();
        let line = assert_one_error_line(&out, &format!("{flag}: cannot listen on {address}"));
        assert!(line.contains("in use"), "{line}");
    }

    // Mutual TLS for /metrics from files that are not there, or do not serve.
    let certs = dir.path().join("metrics-tls");
    std::fs::create_dir(&certs).unwrap();
    std::fs::write(certs.join("ca.crt"), "not a CA").unwrap();
    let with_tls = |certs: &std::path::Path| {
        caretaker_command()
            .args(["operator", "--kubeconfig", path(&kubeconfig)])
            .args(["--metrics-bind-address", "127.0.0.1:0"])
            .args(["--health-probe-bind-address", "0"])
            .args(["--metrics-cert-path", path(certs)])
            .args(["--metrics-client-ca", path(&certs.join("ca.crt"))])
            .env("RUST_LOG", "error")
            .output()
            .unwrap()
    };
    let out = with_tls(&certs);
    let line = assert_one_error_line(&out, path(&certs.join("tls.crt")));
    assert!(line.contains("--metrics-cert-path: cannot read"), "{line}");
    let ca = CertificateAuthority::create(&CaSpec::new("metrics-ca")).unwrap();
    let leaf = ca
        .issue(&LeafSpec::new("caretaker-metrics", Usage::Server))
        .unwrap();
    std::fs::write(certs.join("tls.crt"), &leaf.certificate_pem).unwrap();
    std::fs::write(certs.join("tls.key"), leaf.key.unwrap().to_pem()).unwrap();
    let out = with_tls(&certs);
    let line = assert_one_error_line(&out, "--metrics-cert-path: client CA: ");
    assert!(line.contains("not valid PEM"), "{line}");
}

/// A free loopback port for the operator's listeners ([`caretaker_testkit::ports`]).
fn free_port() -> u16 {
    caretaker_testkit::ports::reusable_port().unwrap()
}

/// GET `path` on `127.0.0.1:port`: the status line and the body.
async fn http_get(port: u16, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// The operator process; killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_serves_its_webhook_from_a_secret() {
    let server = TestServer::start().await;
    let client = server.client();
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds() {
        definitions
            .create(&PostParams::default(), &crd)
            .await
            .unwrap();
    }
    let namespace: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "caretaker-system"}})).unwrap();
    Api::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap();
    let ca = CertificateAuthority::create(&CaSpec::new("webhook-ca")).unwrap();
    let leaf = ca
        .issue(
            &LeafSpec::new("caretaker-webhook", Usage::Server)
                .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
        )
        .unwrap();
    let key_pem = leaf.key.as_ref().unwrap().to_pem();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "webhook-tls", "namespace": "caretaker-system"},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": ByteString(leaf.certificate_pem.clone().into_bytes()),
            "tls.key": ByteString(key_pem.clone().into_bytes()),
        },
    }))
    .unwrap();
    Api::namespaced(client.clone(), "caretaker-system")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let port = free_port();
    let (metrics_port, health_port) = (free_port(), free_port());
    let log = dir.path().join("operator.log");
    let operator = Running(
        caretaker_command()
            .args([
                "operator",
                "--kubeconfig",
                path(&kubeconfig),
                "--webhook-bind-address",
                &format!("127.0.0.1:{port}"),
                "--webhook-secret",
                "caretaker-system/webhook-tls",
                "--metrics-bind-address",
                &format!("127.0.0.1:{metrics_port}"),
                "--health-probe-bind-address",
                &format!("127.0.0.1:{health_port}"),
            ])
            // Everything, to show that not even trace lines (kube-rs, hyper, rustls) carry the
            // key.
            .env("RUST_LOG", "trace")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let configuration = webhook::configuration(
        "caretaker",
        &Endpoint::Url(format!("https://127.0.0.1:{port}")),
        &ca.certificate_pem(),
    );
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .unwrap();

    let cas: Api<CaObject> = Api::all(client.clone());
    let ca_object = |name: &str, validity: &str| -> CaObject {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"commonName": name, "validity": validity,
                     "secret": {"name": name, "namespace": "caretaker-system"},
                     "bundle": {"name": name, "namespace": "caretaker-system"}},
        }))
        .unwrap()
    };
    // Until the operator listens, the API server cannot call it and refuses the write.
    let started = Instant::now();
    let refused = loop {
        let message = match cas
            .create(&PostParams::default(), &ca_object("bad", "10x"))
            .await
        {
            Err(kube::Error::Api(status)) => status.message,
            other => panic!("the bad CertificateAuthority was not refused: {other:?}"),
        };
        if message.contains("denied the request") {
            break message;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the webhook never answered: {message}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        refused.contains(
            "CertificateAuthority \"bad\" is invalid: spec.validity: invalid TTL \"10x\""
        ),
        "{refused}"
    );
    cas.create(&PostParams::default(), &ca_object("good", "1y"))
        .await
        .unwrap();

    // The probes: alive; ready once the Cluster API CRDs exist and the caches have listed.
    assert_eq!(
        http_get(health_port, "/healthz").await,
        ("HTTP/1.1 200 OK".into(), "ok\n".into())
    );
    caretaker_testkit::capi_objects::install_upstream_crds(&client)
        .await
        .unwrap();
    let started = Instant::now();
    while http_get(health_port, "/readyz").await.0 != "HTTP/1.1 200 OK" {
        assert!(started.elapsed() < Duration::from_secs(60), "never ready");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The webhook configuration was reconciled by the CA-injection controllers.
    let (status, metrics) = http_get(metrics_port, "/metrics").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        metrics.contains("caretaker_reconcile_total{controller=\"ca_injection\"}"),
        "{metrics}"
    );
    assert!(metrics.ends_with("# EOF\n"), "{metrics}");
    drop(operator);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains("the webhook serves a new certificate from its Secret"),
        "{log}"
    );
    assert!(log.contains("TRACE"));
    // The key, as PEM lines and as the base64 of the Secret's data on the wire.
    let on_the_wire = base64::engine::general_purpose::STANDARD.encode(&key_pem);
    let mut secrets: Vec<&str> = key_pem
        .lines()
        .filter(|line| !line.starts_with("-----") && line.len() >= 16)
        .collect();
    secrets.extend(
        on_the_wire
            .as_bytes()
            .chunks(32)
            .skip(1)
            .map(|c| std::str::from_utf8(c).unwrap()),
    );
    for secret in secrets {
        assert!(
            !log.contains(secret),
            "the log holds the private key ({secret})"
        );
    }
}

/// The configuration docs/reference.md shows is the one `webhook::configuration` makes (but
/// for the placeholder caBundle), so users who copy it get the rules the webhook expects.
#[test]
fn the_reference_shows_the_configuration_the_webhook_expects() {
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference.md"),
    )
    .unwrap();
    let section = reference
        .split("## The admission webhook (`caretaker operator`)")
        .nth(1)
        .expect("docs/reference.md has a section on the admission webhook");
    let yaml = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a YAML example");
    let mut shown: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
    let expected = webhook::configuration(
        "caretaker",
        &Endpoint::Service {
            namespace: "caretaker-system".into(),
            name: "caretaker-webhook".into(),
            port: 443,
        },
        "",
    );
    let mut expected = serde_json::to_value(expected).unwrap();
    for configuration in [&mut shown, &mut expected] {
        for hook in configuration["webhooks"].as_array_mut().unwrap() {
            hook["clientConfig"]
                .as_object_mut()
                .unwrap()
                .remove("caBundle");
        }
    }
    expected["apiVersion"] = json!("admissionregistration.k8s.io/v1");
    expected["kind"] = json!("ValidatingWebhookConfiguration");
    assert_eq!(shown, expected);
}

/// `caretaker operator --webhook-bootstrap NAMESPACE/SERVICE` started with `kubeconfig`,
/// logging to `log`; its webhook on 127.0.0.1:`port`, called there by the API server.
fn bootstrapped_operator(
    kubeconfig: &std::path::Path,
    port: u16,
    log: &std::path::Path,
) -> Running {
    Running(
        caretaker_command()
            .args([
                "operator",
                "--kubeconfig",
                path(kubeconfig),
                "--webhook-bind-address",
                &format!("127.0.0.1:{port}"),
                "--webhook-bootstrap",
                "caretaker-system/caretaker-webhook",
                "--webhook-url",
                &format!("https://127.0.0.1:{port}"),
                "--metrics-bind-address",
                "0",
                "--health-probe-bind-address",
                "0",
            ])
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// Waits (30 s at most) until `log` holds `line`.
async fn wait_for_log(log: &std::path::Path, line: &str) -> String {
    let started = Instant::now();
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains(line) {
            return text;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the log never said {line:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The bootstrap on an empty cluster: it waits for the CRDs (saying so once, not stopping),
/// then makes its Namespace, CertificateAuthority, IssuedCertificate and webhook configuration;
/// started again, it makes what was deleted and keeps what a user changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_bootstrap_waits_for_the_crds_makes_its_objects_and_keeps_a_users_changes() {
    use caretaker_api::v1alpha1::IssuedCertificate;

    let server = TestServer::start().await;
    let client = server.client();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let port = free_port();
    let log = dir.path().join("operator.log");
    let mut operator = bootstrapped_operator(&kubeconfig, port, &log);

    let said = "webhook bootstrap waits for the caretaker.dev CRDs";
    wait_for_log(&log, said).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(operator.0.try_wait().unwrap(), None, "the operator stopped");
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches(said).count(), 1, "{text}");
    assert!(
        text.contains("caretaker crds | kubectl apply -f -"),
        "{text}"
    );

    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds() {
        definitions
            .create(&PostParams::default(), &crd)
            .await
            .unwrap();
    }
    let text = wait_for_log(&log, "webhook bootstrap done").await;
    assert!(
        text.contains(
            "Namespace caretaker-system, CertificateAuthority caretaker-webhook, \
             IssuedCertificate caretaker-system/caretaker-webhook, \
             ValidatingWebhookConfiguration caretaker-webhook"
        ),
        "{text}"
    );
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let configuration = configurations.get("caretaker-webhook").await.unwrap();
    assert_eq!(
        configuration.metadata.annotations.unwrap()["caretaker.dev/inject-ca-from"],
        "caretaker-webhook"
    );
    assert_eq!(
        configuration.webhooks.unwrap()[0]
            .client_config
            .url
            .as_deref(),
        Some(
            format!(
                "https://127.0.0.1:{port}/validate-caretaker-dev-v1alpha1-certificateauthority"
            )
            .as_str()
        )
    );
    let ca = Api::<CaObject>::all(client.clone())
        .get("caretaker-webhook")
        .await
        .unwrap();
    assert_eq!(ca.spec.secret.name, "caretaker-webhook-ca");
    let certificates: Api<IssuedCertificate> = Api::namespaced(client.clone(), "caretaker-system");
    let certificate = certificates.get("caretaker-webhook").await.unwrap();
    assert_eq!(certificate.spec.secret_name, "caretaker-webhook-tls");
    assert_eq!(certificate.spec.ip_addresses, ["127.0.0.1"]);
    drop(operator);

    // A user's change is kept; a deleted object is made again. (The configuration goes first:
    // while it exists, a change to the IssuedCertificate waits on a webhook.)
    configurations
        .delete("caretaker-webhook", &Default::default())
        .await
        .unwrap();
    // A patch, not a replace: the operator may have written the status since the read.
    certificates
        .patch(
            "caretaker-webhook",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "validity": "90d" } })),
        )
        .await
        .unwrap();
    let log = dir.path().join("operator-again.log");
    let _operator = bootstrapped_operator(&kubeconfig, port, &log);
    let text = wait_for_log(&log, "webhook bootstrap done").await;
    let done = text
        .lines()
        .find(|line| line.contains("webhook bootstrap done"))
        .unwrap();
    assert!(
        done.ends_with("=\u{1b}[0mValidatingWebhookConfiguration caretaker-webhook")
            || done.ends_with("=ValidatingWebhookConfiguration caretaker-webhook"),
        "{done}"
    );
    assert_eq!(
        certificates
            .get("caretaker-webhook")
            .await
            .unwrap()
            .spec
            .validity,
        "90d"
    );
    configurations.get("caretaker-webhook").await.unwrap();
}

/// The issue's end-to-end test: from an empty cluster (the caretaker.dev CRDs and nothing
/// else), `caretaker operator --webhook-bootstrap` makes its CA, its serving certificate and
/// its webhook configuration, injection fills the configuration's caBundle, the webhook serves,
/// and the API server, through it, refuses a bad CertificateAuthority and stores a good one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn from_an_empty_cluster_the_bootstrapped_webhook_refuses_a_bad_certificate_authority() {
    let server = TestServer::start().await;
    let client = server.client();
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in crds() {
        definitions
            .create(&PostParams::default(), &crd)
            .await
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let port = free_port();
    let log = dir.path().join("operator.log");
    let operator = bootstrapped_operator(&kubeconfig, port, &log);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();

    // The configuration's caBundle, filled by injection from the bootstrap CA's bundle.
    let configurations: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let started = Instant::now();
    let bundle = loop {
        let bundles: Vec<Vec<u8>> = configurations
            .get_opt("caretaker-webhook")
            .await
            .unwrap()
            .and_then(|c| c.webhooks)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|hook| hook.client_config.ca_bundle.map(|b| b.0))
            .collect();
        // One webhook per kind: CertificateAuthority, IssuedCertificate, EtcdCertificates,
        // Bundle, ClusterBundle.
        if bundles.len() == 5 && !bundles[0].is_empty() {
            assert!(bundles.iter().all(|b| *b == bundles[0]));
            break String::from_utf8(bundles[0].clone()).unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the caBundle was never injected:\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        bundle.starts_with("-----BEGIN CERTIFICATE-----"),
        "{bundle}"
    );
    let ca_bundle = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        client.clone(),
        "caretaker-system",
    )
    .get("caretaker-webhook-ca-bundle")
    .await
    .unwrap();
    assert_eq!(ca_bundle.data.unwrap()["ca-bundle.crt"], bundle);

    // Once the serving certificate is issued and served, the API server calls the webhook.
    let cas: Api<CaObject> = Api::all(client.clone());
    let ca_object = |name: &str, validity: &str| -> CaObject {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"commonName": name, "validity": validity,
                     "secret": {"name": name, "namespace": "caretaker-system"},
                     "bundle": {"name": name, "namespace": "caretaker-system"}},
        }))
        .unwrap()
    };
    let started = Instant::now();
    let refused = loop {
        let message = match cas
            .create(&PostParams::default(), &ca_object("bad", "10x"))
            .await
        {
            Err(kube::Error::Api(status)) => status.message,
            other => panic!("the bad CertificateAuthority was not refused: {other:?}"),
        };
        if message.contains("denied the request") {
            break message;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the webhook never answered: {message}\n{}",
            log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        refused.contains("admission webhook \"certificateauthorities.caretaker.dev\""),
        "{refused}"
    );
    assert!(
        refused.contains(
            "CertificateAuthority \"bad\" is invalid: spec.validity: invalid TTL \"10x\""
        ),
        "{refused}"
    );
    // Issue 31, item 13: the bootstrap's label, which earlier versions' configuration left out,
    // skips nothing.
    let mut labelled = ca_object("bad", "10x");
    labelled.metadata.labels =
        Some([("caretaker.dev/webhook-bootstrap".into(), "true".into())].into());
    match cas.create(&PostParams::default(), &labelled).await {
        Err(kube::Error::Api(status)) => {
            assert!(
                status.message.contains("denied the request"),
                "{}",
                status.message
            )
        }
        other => panic!("the labelled bad CertificateAuthority was not refused: {other:?}"),
    }
    cas.create(&PostParams::default(), &ca_object("good", "1y"))
        .await
        .unwrap();
    assert!(cas.get_opt("bad").await.unwrap().is_none());

    // The serving certificate is the IssuedCertificate's, for the Service's names and the URL's
    // address, signed by the bootstrap CA.
    let secret: Secret = Api::namespaced(client.clone(), "caretaker-system")
        .get("caretaker-webhook-tls")
        .await
        .unwrap();
    let data = secret.data.unwrap();
    let served =
        caretaker_pki::CertificateInfo::from_pem(std::str::from_utf8(&data["tls.crt"].0).unwrap())
            .unwrap();
    drop(operator);
    assert_eq!(
        served.dns_names,
        [
            "caretaker-webhook.caretaker-system.svc",
            "caretaker-webhook.caretaker-system.svc.cluster.local"
        ]
    );
    assert_eq!(
        served.ip_addresses,
        ["127.0.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    let issuer = caretaker_pki::CertificateInfo::from_pem(&bundle).unwrap();
    assert_eq!(served.issuer, issuer.subject);
    let log = log_text();
    assert!(log.contains("webhook bootstrap done"), "{log}");
    let key = String::from_utf8(data["tls.key"].0.clone()).unwrap();
    for line in key
        .lines()
        .filter(|line| !line.starts_with("-----") && line.len() >= 16)
    {
        assert!(!log.contains(line), "the log holds the private key");
    }
}

/// The Lease's holder, if any.
async fn lease_holder(client: &kube::Client) -> Option<String> {
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(client.clone(), "default")
        .get_opt("caretaker-operator")
        .await
        .unwrap()?
        .spec?
        .holder_identity
}

/// `caretaker operator --leader-elect` as the Pod `pod` with `kubeconfig`, serving /metrics and
/// the probes on the returned ports.
fn elected_operator(
    kubeconfig: &std::path::Path,
    pod: &str,
    log: &std::path::Path,
) -> (Running, u16, u16) {
    let (metrics, health) = (free_port(), free_port());
    let child = caretaker_command()
        .args([
            "operator",
            "--kubeconfig",
            path(kubeconfig),
            "--leader-elect",
            "--leader-election-namespace",
            "default",
            "--leader-election-lease-duration",
            "20s",
            "--webhook-bind-address",
            "0",
            "--metrics-bind-address",
            &format!("127.0.0.1:{metrics}"),
            "--health-probe-bind-address",
            &format!("127.0.0.1:{health}"),
        ])
        .env("POD_NAME", pod)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    (Running(child), metrics, health)
}

async fn eventually_true<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < within, "never within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_makes_the_leader_give_its_lease_to_the_standby_and_exit_0() {
    let server = TestServer::start().await;
    let client = server.client();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let (a_log, b_log) = (dir.path().join("a.log"), dir.path().join("b.log"));

    let (mut leader, leader_metrics, _) = elected_operator(&kubeconfig, "op-a", &a_log);
    eventually_true("op-a holds the Lease", Duration::from_secs(30), || async {
        lease_holder(&client)
            .await
            .is_some_and(|h| h.starts_with("op-a_"))
    })
    .await;
    let (_standby, standby_metrics, standby_health) = elected_operator(&kubeconfig, "op-b", &b_log);
    eventually_true(
        "op-b is ready as a standby",
        Duration::from_secs(30),
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", standby_health))
                .await
                .is_ok()
                && http_get(standby_health, "/readyz").await.0.contains("200")
        },
    )
    .await;
    assert!(
        http_get(leader_metrics, "/metrics")
            .await
            .1
            .contains("caretaker_leader 1")
    );
    assert!(
        http_get(standby_metrics, "/metrics")
            .await
            .1
            .contains("caretaker_leader 0")
    );

    // SIGTERM: the leader stops taking work, gives the Lease up and exits 0, well before the
    // Lease's 20 s would have run out.
    let stopping = Instant::now();
    let pid = i32::try_from(leader.0.id()).unwrap();
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let status = tokio::task::spawn_blocking(move || leader.0.wait().unwrap())
        .await
        .unwrap();
    assert!(
        status.success(),
        "{status:?}\n{}",
        std::fs::read_to_string(&a_log).unwrap()
    );
    let said = std::fs::read_to_string(&a_log).unwrap();
    assert!(said.contains("gave the leader Lease up"), "{said}");
    eventually_true("op-b holds the Lease", Duration::from_secs(10), || async {
        lease_holder(&client)
            .await
            .is_some_and(|h| h.starts_with("op-b_"))
    })
    .await;
    assert!(stopping.elapsed() < Duration::from_secs(15));
    eventually_true(
        "op-b says it leads",
        Duration::from_secs(5),
        || async move {
            http_get(standby_metrics, "/metrics")
                .await
                .1
                .contains("caretaker_leader 1")
        },
    )
    .await;
}
