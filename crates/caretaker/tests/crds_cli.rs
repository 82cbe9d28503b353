//! `caretaker crds` as a user runs it: piped into the real kubectl against the embedded API
//! server, then the example objects created, listed and refused with kubectl.
//!
//! A missing kubectl fails the kubectl tests (see [`caretaker_testkit::kubectl`]).

mod common;

use std::process::Stdio;

use caretaker_api::v1alpha1::{
    CertificateAuthority, CertificateAuthorityStatus, Condition, IssuedCertificate,
    IssuedCertificateStatus, crds,
};
use caretaker_apiserver::TestServer;
use caretaker_operator::authority::{AuthorityPolicy, CertificatePolicy};
use caretaker_operator::etcd::policy::EtcdPolicy;
use caretaker_testkit::kubectl::Kubectl;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use common::{caretaker, caretaker_command, stderr, stdout};

/// The example, exactly as users write it.
const EXAMPLES: &str = "\
apiVersion: caretaker.dev/v1alpha1
kind: CertificateAuthority
metadata: {name: webhooks}
spec:
  commonName: webhooks-ca
  secret: {name: webhooks-ca, namespace: caretaker-system}          # type kubernetes.io/tls
  bundle: {name: webhooks-ca-bundle, namespace: caretaker-system}   # ConfigMap, key ca-bundle.crt
  keyAlgorithm: ECDSA-P256          # ECDSA-P384, Ed25519, RSA-2048/3072/4096
  validity: 10y
  renewAtPercent: 80                # or renewBefore: 60d (one of the two)
  trustPropagation: 5m
---
apiVersion: caretaker.dev/v1alpha1
kind: IssuedCertificate
metadata: {name: webhook-server, namespace: demo}
spec:
  issuerRef: {name: webhooks}
  secretName: webhook-server-tls
  commonName: webhook.demo.svc
  dnsNames: [webhook.demo.svc, webhook.demo.svc.cluster.local]
  ipAddresses: [127.0.0.1]
  usages: [server]                  # server, client
  keyAlgorithm: ECDSA-P256
  validity: 1y
  renewAtPercent: 80                # or renewBefore: 30d
";

#[test]
fn crds_prints_the_types_crds_as_yaml_the_same_every_run() {
    let first = caretaker(&["crds"]);
    assert!(first.status.success(), "{}", stderr(&first));
    assert_eq!(stderr(&first), "");
    let second = caretaker(&["crds"]);
    assert_eq!(first.stdout, second.stdout);

    let text = stdout(&first);
    assert!(text.starts_with("---\napiVersion: apiextensions.k8s.io/v1\n"));
    let printed: Vec<CustomResourceDefinition> = serde_saphyr::from_str_multiple(&text).unwrap();
    let as_json = |crds: &[CustomResourceDefinition]| serde_json::to_value(crds).unwrap();
    assert_eq!(as_json(&printed), as_json(&crds()));
    let names: Vec<_> = printed.iter().map(|c| c.metadata.name.clone()).collect();
    assert_eq!(
        names,
        [
            Some("certificateauthorities.caretaker.dev".to_string()),
            Some("issuedcertificates.caretaker.dev".to_string()),
            Some("etcdcertificates.caretaker.dev".to_string())
        ]
    );
}

/// deploy/ installs the CRDs from a checked-in copy (`kubectl apply -k` reads files): it must be
/// exactly what this build prints.
#[test]
fn the_deploy_manifests_hold_exactly_the_crds_caretaker_crds_prints() {
    let printed = caretaker(&["crds"]);
    assert!(printed.status.success(), "{}", stderr(&printed));
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/crds/caretaker.dev.yaml");
    let checked_in = std::fs::read_to_string(&file).expect("deploy/crds/caretaker.dev.yaml");
    assert!(
        checked_in == stdout(&printed),
        "deploy/crds/caretaker.dev.yaml differs from `caretaker crds`: run `cargo run -- crds > deploy/crds/caretaker.dev.yaml`"
    );
}

#[test]
fn the_reference_documents_every_field() {
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference.md"),
    )
    .unwrap();
    for crd in crds() {
        let kind = &crd.spec.names.kind;
        let section = reference
            .split(&format!("## {kind} ("))
            .nth(1)
            .unwrap_or_else(|| panic!("docs/reference.md has no section on {kind}"))
            .split("\n## ")
            .next()
            .unwrap();
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        for part in ["spec", "status"] {
            let properties = &schema["openAPIV3Schema"]["properties"][part]["properties"];
            for field in properties.as_object().unwrap().keys() {
                // IssuedCertificate's status refers to the CertificateAuthority's.
                let documented = section.contains(&format!("`{part}.{field}"))
                    || (part == "status" && reference.contains(&format!("`{part}.{field}")));
                assert!(documented, "docs/reference.md: {kind} {part}.{field}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_crds_then_lists_the_examples_with_their_columns() {
    let Some(kubectl) = Kubectl::find("kubectl_applies_the_crds") else {
        return;
    };
    let server = TestServer::start().await;
    let kubectl = kubectl.against(&server.kubeconfig());

    let applied = apply_crds(&kubectl).await;
    assert!(
        applied.contains("customresourcedefinition.apiextensions.k8s.io/certificateauthorities.caretaker.dev created"),
        "{applied}"
    );
    assert!(
        applied.contains("issuedcertificates.caretaker.dev created"),
        "{applied}"
    );
    // Applying the same output again changes nothing.
    assert!(apply_crds(&kubectl).await.contains("unchanged"));

    kubectl.ok(&["create", "namespace", "demo"], None).await;
    let created = kubectl.ok(&["apply", "-f", "-"], Some(EXAMPLES)).await;
    assert!(
        created.contains("certificateauthority.caretaker.dev/webhooks created"),
        "{created}"
    );
    assert!(
        created.contains("issuedcertificate.caretaker.dev/webhook-server created"),
        "{created}"
    );

    // What the API server stored reads back as the Rust types, and validates.
    let client = server.client();
    let cas: Api<CertificateAuthority> = Api::all(client.clone());
    let certificates: Api<IssuedCertificate> = Api::namespaced(client, "demo");
    let ca = cas.get("webhooks").await.unwrap();
    assert_eq!(
        AuthorityPolicy::from_spec(&ca.spec).unwrap().ca.common_name,
        "webhooks-ca"
    );
    let certificate = certificates.get("webhook-server").await.unwrap();
    assert_eq!(certificate.spec.ip_addresses, ["127.0.0.1"]);
    CertificatePolicy::from_spec(&certificate.spec).unwrap();

    // Before any status: the columns are there, empty.
    let table = kubectl.ok(&["get", "certificateauthorities"], None).await;
    assert_columns(&table);
    assert!(
        table.lines().nth(1).unwrap().starts_with("webhooks "),
        "{table}"
    );
    let table = kubectl
        .ok(&["get", "issuedcertificates", "-n", "demo"], None)
        .await;
    assert_columns(&table);
    assert!(
        table.lines().nth(1).unwrap().starts_with("webhook-server "),
        "{table}"
    );

    // With a status, as the controller will write it.
    let ready = Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Issued".into(),
        message: "current".into(),
        last_transition_time: "2025-01-01T00:00:00Z".into(),
        observed_generation: Some(1),
    };
    let ca_status = CertificateAuthorityStatus {
        certificate: IssuedCertificateStatus {
            conditions: vec![ready.clone()],
            serial_number: Some("01:02".into()),
            not_before: Some("2025-01-01T00:00:00Z".into()),
            not_after: Some("2035-01-01T00:00:00Z".into()),
            next_rotation: Some("2033-01-01T00:00:00Z".into()),
            observed_generation: Some(1),
        },
        ..Default::default()
    };
    let params = PatchParams::default();
    let patch = json!({ "status": ca_status });
    cas.patch_status("webhooks", &params, &Patch::Merge(&patch))
        .await
        .unwrap();
    let certificate_status = IssuedCertificateStatus {
        conditions: vec![ready],
        not_after: Some("2026-01-01T00:00:00Z".into()),
        next_rotation: Some("2025-10-20T00:00:00Z".into()),
        ..Default::default()
    };
    let patch = json!({ "status": certificate_status });
    certificates
        .patch_status("webhook-server", &params, &Patch::Merge(&patch))
        .await
        .unwrap();
    assert_eq!(cas.get("webhooks").await.unwrap().status, Some(ca_status));

    let row = kubectl
        .ok(&["get", "certificateauthority", "webhooks"], None)
        .await;
    assert_eq!(
        &cells(&row)[..4],
        [
            "webhooks",
            "True",
            "2035-01-01T00:00:00Z",
            "2033-01-01T00:00:00Z"
        ],
        "{row}"
    );
    let row = kubectl
        .ok(
            &["get", "issuedcertificate", "webhook-server", "-n", "demo"],
            None,
        )
        .await;
    assert_eq!(
        &cells(&row)[..4],
        [
            "webhook-server",
            "True",
            "2026-01-01T00:00:00Z",
            "2025-10-20T00:00:00Z"
        ],
        "{row}"
    );

    // The schema's descriptions reach users.
    let explained = kubectl
        .ok(
            &["explain", "certificateauthorities.spec.trustPropagation"],
            None,
        )
        .await;
    assert!(explained.contains("before it"), "{explained}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_defaults_omitted_fields_and_refuses_wrong_types() {
    let Some(kubectl) = Kubectl::find("the_schema_defaults_omitted_fields") else {
        return;
    };
    let server = TestServer::start().await;
    let kubectl = kubectl.against(&server.kubeconfig());
    apply_crds(&kubectl).await;
    kubectl.ok(&["create", "namespace", "demo"], None).await;

    let minimal = "\
apiVersion: caretaker.dev/v1alpha1
kind: CertificateAuthority
metadata: {name: minimal}
spec:
  commonName: minimal-ca
  secret: {name: minimal-ca, namespace: caretaker-system}
  bundle: {name: minimal-ca-bundle, namespace: caretaker-system}
  renewBefore: 60d
---
apiVersion: caretaker.dev/v1alpha1
kind: IssuedCertificate
metadata: {name: minimal, namespace: demo}
spec:
  issuerRef: {name: minimal}
  secretName: minimal-tls
  commonName: client-1
  usages: [client]
";
    kubectl.ok(&["apply", "-f", "-"], Some(minimal)).await;
    let ca = kubectl
        .json(&["get", "certificateauthority", "minimal"])
        .await;
    assert_eq!(
        ca["spec"],
        json!({
            "commonName": "minimal-ca",
            "secret": {"name": "minimal-ca", "namespace": "caretaker-system"},
            "bundle": {"name": "minimal-ca-bundle", "namespace": "caretaker-system"},
            "keyAlgorithm": "ECDSA-P256",
            "validity": "10y",
            "renewBefore": "60d",
            "trustPropagation": "5m",
        })
    );
    let certificate = kubectl
        .json(&["get", "issuedcertificate", "minimal", "-n", "demo"])
        .await;
    assert_eq!(certificate["spec"]["validity"], "1y");
    assert_eq!(certificate["spec"]["keyAlgorithm"], "ECDSA-P256");
    assert_eq!(certificate["spec"].get("renewAtPercent"), None);

    // What the schema can say is wrong, the API server refuses, naming the field.
    let wrong = |field: &str, value: Value| {
        let mut spec = json!({
            "issuerRef": {"name": "minimal"},
            "secretName": "wrong-tls",
            "commonName": "wrong",
            "usages": ["server"],
        });
        spec[field] = value;
        json!({
            "apiVersion": "caretaker.dev/v1alpha1",
            "kind": "IssuedCertificate",
            "metadata": {"name": "wrong", "namespace": "demo"},
            "spec": spec,
        })
        .to_string()
    };
    for (field, value) in [
        ("renewAtPercent", json!("eighty")),
        ("renewAtPercent", json!(0)),
        ("keyAlgorithm", json!("RSA-1024")),
        ("usages", json!(["both"])),
        ("usages", json!([])),
    ] {
        let refused = kubectl
            .fails(&["apply", "-f", "-"], Some(&wrong(field, value.clone())))
            .await;
        assert!(
            refused.contains(&format!("spec.{field}")),
            "{field}: {value}: {refused}"
        );
    }
    let refused = kubectl
        .fails(
            &["apply", "-f", "-"],
            Some(&wrong("renewAtPercent", json!("eighty"))),
        )
        .await;
    assert!(refused.contains("integer"), "{refused}");
    // Nothing was stored.
    let listed = kubectl
        .json(&["get", "issuedcertificates", "-n", "demo"])
        .await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");
}

fn assert_columns(table: &str) {
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .filter(|c| !c.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        header,
        ["NAME", "READY", "NOT AFTER", "NEXT ROTATION", "AGE"],
        "{table}"
    );
}

/// The cells of a table's first row (cells here hold no spaces).
fn cells(table: &str) -> Vec<&str> {
    table.lines().nth(1).unwrap().split_whitespace().collect()
}

/// `caretaker crds | kubectl apply -f -`, through a real pipe; kubectl's stdout.
async fn apply_crds(kubectl: &Kubectl) -> String {
    let mut apply = kubectl.command(&["apply", "-f", "-"]);
    let output = tokio::task::spawn_blocking(move || {
        let mut crds = caretaker_command()
            .arg("crds")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let output = apply.stdin(crds.stdout.take().unwrap()).output().unwrap();
        assert!(crds.wait().unwrap().success());
        output
    })
    .await
    .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output)
}

/// The EtcdCertificates example of its issue, as users write it.
const ETCD_EXAMPLE: &str = "\
apiVersion: caretaker.dev/v1alpha1
kind: EtcdCertificates
metadata: {name: etcd, namespace: etcd-system}
spec:
  members:
  - {name: m0, addresses: [127.0.0.1, m0.etcd.example]}
  memberSelector: {matchLabels: {node-role.kubernetes.io/control-plane: \"\"}}   # optional, over Nodes
  signer: {validity: 5y, renewAtPercent: 80, trustPropagation: 5m}
  metricsSigner: {validity: 5y, renewAtPercent: 80, trustPropagation: 5m}
  certificates: {validity: 3y, renewAtPercent: 80}
  quorum: {endpoints: [\"https://127.0.0.1:2379\"], clientSecretName: etcd-client}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_the_etcd_example_and_lists_it_with_its_columns() {
    let Some(kubectl) = Kubectl::find("kubectl_applies_the_etcd_example") else {
        return;
    };
    let server = TestServer::start().await;
    let kubectl = kubectl.against(&server.kubeconfig());
    apply_crds(&kubectl).await;
    kubectl
        .ok(&["create", "namespace", "etcd-system"], None)
        .await;
    let created = kubectl.ok(&["apply", "-f", "-"], Some(ETCD_EXAMPLE)).await;
    assert!(
        created.contains("etcdcertificates.caretaker.dev/etcd created"),
        "{created}"
    );
    let objects: Api<caretaker_api::v1alpha1::EtcdCertificates> =
        Api::namespaced(server.client(), "etcd-system");
    let stored = objects.get("etcd").await.unwrap();
    let policy = EtcdPolicy::from_spec(&stored.spec).unwrap();
    assert_eq!(policy.members[0].name, "m0");
    assert_eq!(policy.endpoints, ["https://127.0.0.1:2379"]);
    let table = kubectl
        .ok(&["get", "etcdcertificates", "-n", "etcd-system"], None)
        .await;
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "READY", "DEGRADED", "REVISION", "LATEST", "MEMBERS", "AGE"
        ],
        "{table}"
    );
    assert!(
        table.lines().nth(1).unwrap().starts_with("etcd "),
        "{table}"
    );
    // The revision columns, as a rollout through the agents leaves them.
    let status = json!({"status": {
        "allCertsRevision": "0123456789abcdef",
        "latestRevision": 4,
        "members": [
            {"name": "m0", "currentRevision": 4, "targetRevision": 0, "lastFailedRevision": 0},
            {"name": "m1", "currentRevision": 3, "targetRevision": 4, "lastFailedRevision": 4},
        ],
    }});
    objects
        .patch_status("etcd", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    let table = kubectl
        .ok(&["get", "etcdcertificates", "-n", "etcd-system"], None)
        .await;
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(row[3..6], ["0123456789abcdef", "4", "4,3"], "{table}");
}
