//! `caretaker status certificates` (alias `expiry`) against the embedded API server: one table
//! of every kind caretaker keeps, the first to expire first, as a table and as JSON and YAML;
//! and never a byte of the private keys in the Secrets it reads.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use caretaker_apiserver::TestServer;
use caretaker_pki::{CaSpec, CertificateAuthority};
use caretaker_testkit::capi_objects::{self, ClusterObjects, MachineObject, MachineRole};
use caretaker_testkit::provision::ClusterCas;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};

use common::{caretaker_command, stderr, stdout};

async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap()
}

fn status(kubeconfig: &Path, subcommand: &str, args: &[&str]) -> Command {
    let mut command = caretaker_command();
    command
        .args(["status", subcommand, "--kubeconfig"])
        .arg(kubeconfig)
        .args(args);
    command
}

fn condition(type_: &str, status: &str, reason: &str) -> Value {
    json!({"type": type_, "status": status, "reason": reason, "message": "",
           "lastTransitionTime": "2026-01-01T00:00:00Z"})
}

/// Creates `object` of `resource` and, when given, sets its status subresource.
async fn create(
    client: &kube::Client,
    resource: &ApiResource,
    object: Value,
    status: Option<Value>,
) {
    let namespace = object["metadata"]["namespace"].as_str().map(str::to_string);
    let api: Api<DynamicObject> = match &namespace {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    };
    let name = object["metadata"]["name"].as_str().unwrap().to_string();
    let object: DynamicObject = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
    if let Some(status) = status {
        api.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": status })),
        )
        .await
        .unwrap();
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

fn self_signed(name: &str, days: u32) -> CertificateAuthority {
    let spec = CaSpec {
        validity: format!("{days}d").parse().unwrap(),
        ..CaSpec::new(name)
    };
    CertificateAuthority::create(&spec).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_table_of_every_kind_the_first_to_expire_first() {
    let server = TestServer::start().await;
    let tmp = tempfile::tempdir().unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    server.write_kubeconfig(&kubeconfig).unwrap();
    let client = server.client();

    // Nothing installed yet: a table with no row, and no error.
    let out = output(status(&kubeconfig, "certificates", &[])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("no certificates"), "{}", stdout(&out));

    capi_objects::install_upstream_crds(&client).await.unwrap();
    capi_objects::install_trust_manager_crds(&client)
        .await
        .unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in caretaker_api::v1alpha1::crds() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for name in ["demo", "etcd-system"] {
        let namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .unwrap();
    }

    // A Machine whose node certificates expire in 5 days, and one with none recorded.
    let cluster = ClusterObjects::new(&client, "default", "c1", "cp.example");
    cluster
        .create(&ClusterCas::create().unwrap())
        .await
        .unwrap();
    for name in ["cp-0", "cp-1"] {
        let machine = MachineObject {
            name,
            role: MachineRole::ControlPlane,
            node_name: name,
            address: "10.0.0.1",
            agent_url: "https://10.0.0.1:9443",
        };
        cluster.create_machine(&machine).await.unwrap();
    }
    let in_days = |days: i64| {
        let at = time::OffsetDateTime::now_utc() + time::Duration::days(days);
        at.replace_nanosecond(0)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let machine_expiry = in_days(5);
    let annotate = json!({"metadata": {"annotations": {
        "machine.cluster.x-k8s.io/certificates-expiry": machine_expiry.clone(),
        "v1beta2.k8sd.io/refresh-certificates-status": "failed",
    }}});
    cluster
        .api(&caretaker_api::cluster_api::machine_api_resource())
        .patch("cp-0", &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();

    // A CertificateAuthority (10 years), an IssuedCertificate past its renewal time (20 days).
    let caretaker = |kind: &str| {
        let plural = format!("{}s", kind.to_lowercase()).replace("tys", "ties");
        let plural = plural.replace("certificatess", "certificates");
        resource("caretaker.dev", "v1alpha1", kind, &plural)
    };
    create(
        &client,
        &caretaker("CertificateAuthority"),
        json!({"apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
               "metadata": {"name": "webhooks"},
               "spec": {"commonName": "webhooks",
                        "secret": {"name": "webhooks-ca", "namespace": "demo"},
                        "bundle": {"name": "webhooks-ca", "namespace": "demo"}}}),
        Some(
            json!({"notAfter": in_days(3650), "nextRotation": in_days(3000),
                    "conditions": [condition("Ready", "True", "Signing")]}),
        ),
    )
    .await;
    create(
        &client,
        &caretaker("IssuedCertificate"),
        json!({"apiVersion": "caretaker.dev/v1alpha1", "kind": "IssuedCertificate",
               "metadata": {"name": "web", "namespace": "demo"},
               "spec": {"issuerRef": {"name": "webhooks"}, "secretName": "web-tls",
                        "commonName": "web.demo.svc", "dnsNames": ["web.demo.svc"],
                        "usages": ["server"]}}),
        Some(json!({"notAfter": in_days(20), "nextRotation": in_days(-1),
                    "conditions": [condition("Ready", "True", "Issued"),
                                   condition("Degraded", "True", "SigningFailed")]})),
    )
    .await;

    // An EtcdCertificates, its signer (2 years) and etcd-all-certs with a peer certificate
    // (100 days) and its private key, which must never be shown.
    create(
        &client,
        &caretaker("EtcdCertificates"),
        json!({"apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
               "metadata": {"name": "etcd", "namespace": "etcd-system"},
               "spec": {"members": [{"name": "m0", "addresses": ["10.0.0.1"]}],
                        "quorum": {"endpoints": ["https://10.0.0.1:2379"]}}}),
        Some(
            json!({"signer": {"notAfter": in_days(730), "nextRotation": in_days(365)},
                    "conditions": [condition("Ready", "True", "CertificatesInPlace")]}),
        ),
    )
    .await;
    let peer = self_signed("etcd-peer-m0", 100);
    let key = peer.private_key_pem();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "etcd-all-certs", "namespace": "etcd-system"},
        "stringData": {
            "etcd-peer-m0.crt": peer.certificate_pem(),
            "etcd-peer-m0.key": key,
            "ca-bundle.crt": self_signed("signer", 1).certificate_pem(),
        },
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), "etcd-system")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    // A ClusterBundle whose target holds a CA of 50 days and one of 900.
    create(
        &client,
        &resource(
            "trust-manager.io",
            "v1alpha2",
            "ClusterBundle",
            "clusterbundles",
        ),
        json!({"apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle",
               "metadata": {"name": "roots"},
               "spec": {"inLineCAs": "x",
                        "target": {"configMap": {"data": [{"key": "ca.crt"}]},
                                   "namespaceSelector": {}}}}),
        None,
    )
    .await;
    let target: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "roots", "namespace": "demo",
                     "labels": {"trust-manager.io/bundle": "roots"}},
        "data": {"ca.crt": format!("{}{}", self_signed("a", 900).certificate_pem(),
                                   self_signed("b", 50).certificate_pem())},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "demo")
        .create(&PostParams::default(), &target)
        .await
        .unwrap();

    let expected = [
        ("Machine", "cp-0"),
        ("IssuedCertificate", "web"),
        ("ClusterBundle", "roots"),
        ("EtcdCertificate", "etcd-peer-m0"),
        ("EtcdSigner", "signer-ca"),
        ("CertificateAuthority", "webhooks"),
        ("EtcdSigner", "metrics-signer-ca"),
        ("Machine", "cp-1"),
    ];
    let key_body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();

    let out = output(status(&kubeconfig, "certificates", &[])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let table = stdout(&out);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("KIND"), "{table}");
    let shown: Vec<(String, String)> = lines[1..]
        .iter()
        .map(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            (cells[0].to_string(), cells[2].to_string())
        })
        .collect();
    let expected_owned: Vec<(String, String)> = expected
        .iter()
        .map(|(k, n)| (k.to_string(), n.to_string()))
        .collect();
    assert_eq!(shown, expected_owned, "{table}");
    assert!(lines[1].contains("refresh failed"), "{table}");
    assert!(lines[2].contains("(overdue)") && lines[2].contains("Degraded (SigningFailed)"));
    assert!(!table.contains(&key_body[..40]), "the key leaked:\n{table}");

    // The alias, and documents for scripts.
    let out = output(status(&kubeconfig, "expiry", &["-o", "json"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains(&key_body[..40]), "the key leaked:\n{text}");
    let document: Value = serde_json::from_str(&text).unwrap();
    let rows = document["certificates"].as_array().unwrap();
    let kinds: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_string(),
                r["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(kinds, expected_owned);
    assert_eq!(rows[0]["notAfter"], machine_expiry);
    assert_eq!(rows[7]["notAfter"], Value::Null);

    let out = output(status(&kubeconfig, "certificates", &["-o", "yaml"])).await;
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let yaml: Value = serde_saphyr::from_str(&stdout(&out)).unwrap();
    assert_eq!(yaml, document);
}

#[test]
fn help_explains_the_command() {
    let out = common::caretaker(&["status", "certificates", "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = stdout(&out);
    for word in [
        "expire first",
        "--output",
        "--watch",
        "json",
        "yaml",
        "RENEWAL",
        "key",
    ] {
        assert!(help.contains(word), "{word}:\n{help}");
    }
    let out = common::caretaker(&["status", "--help"]);
    assert!(stdout(&out).contains("expiry"), "{}", stdout(&out));
}
