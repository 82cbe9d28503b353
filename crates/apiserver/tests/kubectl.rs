//! The real kubectl against the server. A missing kubectl fails each test, because a skipped
//! test would still show `ok`. CARETAKER_SKIP_KUBECTL=1 opts out explicitly (the tests then pass
//! without running kubectl), unless CARETAKER_REQUIRE_KUBECTL=1, which CI sets, forbids that.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use caretaker_apiserver::{ApiServer, TestServer};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

/// The kubectl runner every crate's tests use. The API server sits below the test kit (which
/// links the operator and the agent), so its tests take the one source file rather than the
/// crate: an API server test builds no caretaker controller.
#[path = "../../testkit/src/kubectl.rs"]
mod kubectl;

use kubectl::Kubectl;

const CONFIGMAP: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\n  labels: {tier: web}\ndata:\n  mode: blue\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_on_builtin_kinds() {
    let Some(kubectl) = Kubectl::find("kubectl_on_builtin_kinds") else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());

    // Typed generators send protobuf.
    assert!(
        k.ok(&["create", "namespace", "team"], None)
            .await
            .contains("namespace/team created")
    );
    k.ok(
        &[
            "create",
            "configmap",
            "gen",
            "-n",
            "team",
            "--from-literal=a=b",
        ],
        None,
    )
    .await;
    k.ok(
        &[
            "create",
            "secret",
            "generic",
            "pw",
            "-n",
            "team",
            "--from-literal=password=s3cret",
        ],
        None,
    )
    .await;
    // Protobuf bodies carry generateName even when empty; like kube-apiserver, the server
    // omits empty fields.
    let generated = k.json(&["get", "configmap", "gen", "-n", "team"]).await;
    assert_eq!(
        generated["metadata"].get("generateName"),
        None,
        "{generated}"
    );
    let secret = k.json(&["get", "secret", "pw", "-n", "team"]).await;
    assert_eq!(secret["data"]["password"], "czNjcmV0");
    assert_eq!(secret["type"], "Opaque");

    // Client-side apply, twice.
    assert!(
        k.ok(&["apply", "-f", "-"], Some(CONFIGMAP))
            .await
            .contains("configmap/app created")
    );
    let changed = CONFIGMAP.replace("blue", "green");
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&changed))
            .await
            .contains("configmap/app configured")
    );
    assert!(
        k.ok(&["apply", "-f", "-"], Some(&changed))
            .await
            .contains("configmap/app unchanged")
    );

    let table = k.ok(&["get", "configmaps"], None).await;
    assert!(
        table
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .eq(["NAME", "DATA", "AGE"]),
        "{table}"
    );
    assert!(table.contains("app "), "{table}");

    k.ok(&["annotate", "configmap", "app", "owner=ops"], None)
        .await;
    k.ok(&["label", "configmap", "app", "env=prod"], None).await;
    k.ok(
        &[
            "patch",
            "configmap",
            "app",
            "-p",
            r#"{"data":{"strategic":"1"}}"#,
        ],
        None,
    )
    .await;
    k.ok(
        &[
            "patch",
            "configmap",
            "app",
            "--type=merge",
            "-p",
            r#"{"data":{"merge":"2"}}"#,
        ],
        None,
    )
    .await;
    k.ok(
        &[
            "patch",
            "configmap",
            "app",
            "--type=json",
            "-p",
            r#"[{"op":"add","path":"/data/json","value":"3"}]"#,
        ],
        None,
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let app = cms.get("app").await.unwrap();
    assert_eq!(app.metadata.annotations.as_ref().unwrap()["owner"], "ops");
    assert_eq!(app.metadata.labels.as_ref().unwrap()["env"], "prod");
    let data = app.data.unwrap();
    assert_eq!(
        (
            data["mode"].as_str(),
            data["strategic"].as_str(),
            data["merge"].as_str(),
            data["json"].as_str()
        ),
        ("green", "1", "2", "3")
    );

    let described = k.ok(&["describe", "configmap", "app"], None).await;
    assert!(
        described.contains("Name:         app") && described.contains("env=prod"),
        "{described}"
    );

    // Server-side apply: a second manager conflicts, then forces.
    let ssa = CONFIGMAP.replace("blue", "red");
    // Taking over fields that client-side apply set is a conflict, as in Kubernetes.
    let err = k
        .fails(
            &["apply", "--server-side", "--field-manager=first", "-f", "-"],
            Some(&ssa),
        )
        .await;
    assert!(
        err.contains("conflict with \"kubectl-client-side-apply\" using v1: .data.mode"),
        "{err}"
    );
    k.ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=first",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&ssa),
    )
    .await;
    // Applying again with the same values is no conflict.
    k.ok(
        &["apply", "--server-side", "--field-manager=first", "-f", "-"],
        Some(&ssa),
    )
    .await;
    let purple = CONFIGMAP.replace("blue", "purple");
    let err = k
        .fails(
            &[
                "apply",
                "--server-side",
                "--field-manager=second",
                "-f",
                "-",
            ],
            Some(&purple),
        )
        .await;
    assert!(
        err.contains("conflict") && err.contains(".data.mode"),
        "{err}"
    );
    k.ok(
        &[
            "apply",
            "--server-side",
            "--field-manager=second",
            "--force-conflicts",
            "-f",
            "-",
        ],
        Some(&purple),
    )
    .await;
    assert_eq!(
        cms.get("app").await.unwrap().data.unwrap()["mode"],
        "purple"
    );

    // Events, through both APIs.
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "app.1", "namespace": "default"},
        "regarding": {"kind": "ConfigMap", "name": "app", "namespace": "default"}, "reason": "Tested", "note": "hello from a test",
        "type": "Normal", "action": "Test", "reportingController": "tests", "reportingInstance": "tests-1",
        "eventTime": "2024-01-01T00:00:00.000000Z"});
    k.ok(&["create", "-f", "-"], Some(&event.to_string())).await;
    let events = k.ok(&["get", "events"], None).await;
    assert!(
        events.contains("Tested") && events.contains("hello from a test"),
        "{events}"
    );
    // kube-apiserver's columns: no NAME, the object as kind/name.
    let header: Vec<&str> = events
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .filter(|c| !c.trim().is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(
        header,
        ["LAST SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{events}"
    );
    assert!(events.contains("configmap/app"), "{events}");
    let core = k.json(&["get", "events.v1.", "app.1"]).await;
    assert_eq!(core["involvedObject"]["name"], "app");

    let err = k.fails(&["get", "configmap", "nope"], None).await;
    assert!(
        err.contains("Error from server (NotFound): configmaps \"nope\" not found"),
        "{err}"
    );
    k.ok(&["delete", "configmap", "app"], None).await;
    assert!(cms.get_opt("app").await.unwrap().is_none());
    k.ok(
        &[
            "delete",
            "namespace",
            "team",
            "--wait=true",
            "--timeout=20s",
        ],
        None,
    )
    .await;
}

/// Minimal valid objects of every fixture CRD's kind.
const FIXTURE_OBJECTS: &str = r#"
apiVersion: cluster.x-k8s.io/v1beta2
kind: Cluster
metadata: {name: c1}
spec:
  controlPlaneRef: {apiGroup: controlplane.cluster.x-k8s.io, kind: CK8sControlPlane, name: c1-cp}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: Machine
metadata: {name: m1}
spec:
  clusterName: c1
  bootstrap: {dataSecretName: bootstrap}
  infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DockerMachine, name: m1}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineDeployment
metadata: {name: md1}
spec:
  clusterName: c1
  replicas: 1
  selector: {matchLabels: {pool: a}}
  template:
    metadata: {labels: {pool: a}}
    spec:
      clusterName: c1
      bootstrap: {dataSecretName: bootstrap}
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DockerMachineTemplate, name: md1}
---
apiVersion: cluster.x-k8s.io/v1beta2
kind: MachineSet
metadata: {name: ms1}
spec:
  clusterName: c1
  selector: {matchLabels: {pool: a}}
  template:
    metadata: {labels: {pool: a}}
    spec:
      clusterName: c1
      bootstrap: {dataSecretName: bootstrap}
      infrastructureRef: {apiGroup: infrastructure.cluster.x-k8s.io, kind: DockerMachineTemplate, name: ms1}
---
apiVersion: controlplane.cluster.x-k8s.io/v1beta2
kind: CK8sControlPlane
metadata: {name: cp1}
spec:
  version: v1.33.0
  machineTemplate:
    infrastructureTemplate: {apiVersion: infrastructure.cluster.x-k8s.io/v1beta1, kind: DockerMachineTemplate, name: cp1}
---
apiVersion: trust-manager.io/v1alpha2
kind: ClusterBundle
metadata: {name: cb1}
spec:
  sourceRefs: [{kind: ConfigMap, name: ca, key: ca.crt}]
  target:
    namespaceSelector: {}
    configMap: {data: [{key: ca.crt}]}
---
apiVersion: trust.cert-manager.io/v1alpha1
kind: Bundle
metadata: {name: b1}
spec:
  sources: [{useDefaultCAs: true}]
  target: {configMap: {key: ca.crt}}
"#;

/// The upstream CRDs (Cluster API, CK8sControlPlane, trust-manager) kept in the repository.
fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/upstream-crds")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_installs_and_uses_the_fixture_crds() {
    let Some(kubectl) = Kubectl::find("kubectl_installs_and_uses_the_fixture_crds") else {
        return;
    };
    let dir = fixtures_dir();
    assert!(dir.is_dir(), "fixture CRDs expected at {}", dir.display());
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let fixtures = dir.to_str().unwrap();

    let out = k.ok(&["apply", "-f", fixtures], None).await;
    assert_eq!(out.matches(" created").count(), 7, "{out}");
    k.ok(
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=30s",
            "crd",
            "--all",
        ],
        None,
    )
    .await;
    // Re-applying unchanged CRDs is a no-op, server-side too.
    assert_eq!(
        k.ok(&["apply", "-f", fixtures], None)
            .await
            .matches(" unchanged")
            .count(),
        7
    );
    k.ok(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            fixtures,
        ],
        None,
    )
    .await;

    let out = k.ok(&["apply", "-f", "-"], Some(FIXTURE_OBJECTS)).await;
    assert_eq!(out.matches(" created").count(), 7, "{out}");
    for kind in [
        "clusters",
        "machines",
        "machinedeployments",
        "machinesets",
        "ck8scontrolplanes",
        "clusterbundles",
        "bundles",
    ] {
        let list = k.json(&["get", kind]).await;
        assert_eq!(list["items"].as_array().unwrap().len(), 1, "{kind}: {list}");
        k.ok(&["get", kind], None).await;
        k.ok(&["describe", kind], None).await;
    }
    // Printer columns come from the CRD.
    let table = k.ok(&["get", "machinedeployments"], None).await;
    assert!(
        table.starts_with("NAME")
            && table.contains("CLUSTER")
            && table.contains("md1")
            && table.contains("c1"),
        "{table}"
    );

    k.ok(&["label", "cluster", "c1", "env=test"], None).await;
    k.ok(
        &[
            "annotate",
            "machine",
            "m1",
            "v1beta2.k8sd.io/refresh-certificates=1y",
        ],
        None,
    )
    .await;
    k.ok(
        &[
            "patch",
            "machinedeployment",
            "md1",
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":3}}"#,
        ],
        None,
    )
    .await;
    let md = k.json(&["get", "machinedeployment", "md1"]).await;
    assert_eq!(md["spec"]["replicas"], 3);
    assert_eq!(md["metadata"]["generation"], 2);
    let m = k.json(&["get", "machine", "m1"]).await;
    assert_eq!(
        m["metadata"]["annotations"]["v1beta2.k8sd.io/refresh-certificates"],
        "1y"
    );
    // The patch made kubectl-patch the owner of spec.replicas: server-side apply of replicas: 1 conflicts.
    let err = k
        .fails(
            &["apply", "--server-side", "-f", "-"],
            Some(FIXTURE_OBJECTS),
        )
        .await;
    assert!(
        err.contains(
            "conflict with \"kubectl-patch\" using cluster.x-k8s.io/v1beta2: .spec.replicas"
        ),
        "{err}"
    );
    k.ok(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(FIXTURE_OBJECTS),
    )
    .await;
    assert_eq!(
        k.json(&["get", "machinedeployment", "md1"]).await["spec"]["replicas"],
        1
    );

    // Strict field validation (kubectl's default) and schema validation.
    let bad = "apiVersion: cluster.x-k8s.io/v1beta2\nkind: Cluster\nmetadata: {name: c2}\nspec: {paused: false, bogusField: 1}\n";
    let err = k.fails(&["apply", "-f", "-"], Some(bad)).await;
    assert!(
        err.contains("strict decoding error: unknown field \"spec.bogusField\""),
        "{err}"
    );
    let warned = k
        .run(&["apply", "--validate=warn", "-f", "-"], Some(bad))
        .await;
    let stderr = String::from_utf8_lossy(&warned.stderr);
    assert!(
        warned.status.success() && stderr.contains("unknown field \"spec.bogusField\""),
        "{stderr}"
    );
    let invalid = "apiVersion: controlplane.cluster.x-k8s.io/v1beta2\nkind: CK8sControlPlane\nmetadata: {name: cp2}\nspec: {}\n";
    let err = k.fails(&["apply", "-f", "-"], Some(invalid)).await;
    assert!(err.contains("spec.version: Required value"), "{err}");

    let explained = k.ok(&["explain", "cluster.spec"], None).await;
    assert!(explained.contains("KIND:       Cluster"), "{explained}");

    k.ok(&["delete", "-f", "-"], Some(FIXTURE_OBJECTS)).await;
    k.ok(&["delete", "cluster", "c2"], None).await;
    assert!(
        k.json(&["get", "clusters"]).await["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    k.ok(&["delete", "-f", fixtures], None).await;
    let err = k.fails(&["get", "clusters.cluster.x-k8s.io"], None).await;
    assert!(
        err.contains("the server doesn't have a resource type"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_watch_sees_changes() {
    let Some(kubectl) = Kubectl::find("kubectl_get_watch_sees_changes") else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let cms: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let create = |name: &str| {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        let cms = cms.clone();
        async move { cms.create(&PostParams::default(), &cm).await.unwrap() }
    };
    create("w0").await;
    let mut child = k
        .command(&[
            "get",
            "configmaps",
            "--watch",
            "--output-watch-events",
            "-o",
            "custom-columns=EVENT:.type,NAME:.object.metadata.name",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines: Vec<String> = Vec::new();
    let mut wait_for = async |lines: &mut Vec<String>, event: &str, name: &str| {
        while !lines.iter().any(|l| l.split_whitespace().eq([event, name])) {
            match tokio::time::timeout(Duration::from_secs(20), rx.recv()).await {
                Ok(Some(line)) => lines.push(line),
                _ => panic!("no {event} {name} from kubectl get -w; saw {lines:?}"),
            }
        }
    };
    // The initial list arrives as ADDED: the watch is established after that.
    wait_for(&mut lines, "ADDED", "w0").await;
    create("w1").await;
    create("w2").await;
    cms.delete("w1", &Default::default()).await.unwrap();
    wait_for(&mut lines, "ADDED", "w1").await;
    wait_for(&mut lines, "ADDED", "w2").await;
    wait_for(&mut lines, "DELETED", "w1").await;
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_over_https_trusts_the_kubeconfig_ca() {
    let Some(kubectl) = Kubectl::find("kubectl_over_https_trusts_the_kubeconfig_ca") else {
        return;
    };
    let server = ApiServer::builder().tls(true).start().await.unwrap();
    assert!(server.url().starts_with("https://"));
    let k = kubectl.against(&server.kubeconfig());
    let namespaces = k.ok(&["get", "namespaces", "-o", "name"], None).await;
    assert!(namespaces.contains("namespace/kube-system"), "{namespaces}");
    k.ok(&["apply", "--server-side", "-f", "-"], Some(CONFIGMAP))
        .await;
    assert_eq!(
        k.json(&["get", "configmap", "app"]).await["data"]["mode"],
        "blue"
    );
}

/// One file with a new CRD and an object of it: kubectl's OpenAPI v3 cache does not know the
/// kind yet, so it asks `/openapi/v2` in protobuf, which must parse (it got JSON and failed
/// with `proto: cannot parse invalid wire-format data`). kubectl then does what it does against
/// kube-apiserver: the CRD is created, the object's kind is not in the discovery it read before
/// (`ensure CRDs are installed first`), and the same apply run again creates it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_a_new_crd_and_an_object_of_it_from_one_file() {
    let Some(kubectl) =
        Kubectl::find("kubectl_applies_a_new_crd_and_an_object_of_it_from_one_file")
    else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let file = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.dev
spec:
  group: example.dev
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
---
apiVersion: example.dev/v1
kind: Widget
metadata: {name: w1}
spec: {size: 3}
";
    let first = k.run(&["apply", "-f", "-"], Some(file)).await;
    let (stdout, stderr) = (
        String::from_utf8_lossy(&first.stdout),
        String::from_utf8_lossy(&first.stderr),
    );
    assert!(
        stdout
            .contains("customresourcedefinition.apiextensions.k8s.io/widgets.example.dev created"),
        "{}\n{}",
        stdout,
        stderr
    );
    assert!(
        !stderr.contains("proto:") && !stderr.contains("error validating"),
        "{}",
        stderr
    );
    assert!(
        stderr.contains("ensure CRDs are installed first"),
        "{}",
        stderr
    );
    let out = k.ok(&["apply", "-f", "-"], Some(file)).await;
    assert!(
        out.contains("customresourcedefinition.apiextensions.k8s.io/widgets.example.dev unchanged")
            && out.contains("widget.example.dev/w1 created"),
        "{out}"
    );
    let widget = k.json(&["get", "widget", "w1"]).await;
    assert_eq!(widget["spec"]["size"], 3);
    // The server still validates: a wrong type is refused with the field named.
    let bad = file
        .replace("size: 3", "size: three")
        .replace("name: w1", "name: w2");
    let err = k.fails(&["apply", "-f", "-"], Some(&bad)).await;
    assert!(err.contains("spec.size"), "{err}");
}

/// `kubectl scale` on a custom resource whose CRD declares the scale subresource.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_scales_a_custom_resource_through_its_scale_subresource() {
    let Some(kubectl) =
        Kubectl::find("kubectl_scales_a_custom_resource_through_its_scale_subresource")
    else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: pools.example.dev
spec:
  group: example.dev
  names: {plural: pools, singular: pool, kind: Pool, listKind: PoolList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.size, statusReplicasPath: .status.ready, labelSelectorPath: .status.selector}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer}
              flavour: {type: string}
          status:
            type: object
            properties:
              ready: {type: integer}
              selector: {type: string}
";
    k.ok(&["apply", "-f", "-"], Some(crd)).await;
    k.ok(
        &[
            "wait",
            "--for",
            "condition=established",
            "--timeout=30s",
            "crd/pools.example.dev",
        ],
        None,
    )
    .await;
    let pool = "apiVersion: example.dev/v1\nkind: Pool\nmetadata: {name: p1}\nspec: {size: 1, flavour: blue}\n";
    k.ok(&["apply", "-f", "-"], Some(pool)).await;
    let discovery = k
        .ok(&["api-resources", "--api-group", "example.dev"], None)
        .await;
    assert!(discovery.contains("pools"), "{discovery}");

    let out = k.ok(&["scale", "pool/p1", "--replicas=4"], None).await;
    assert!(out.contains("pool.example.dev/p1 scaled"), "{out}");
    let p1 = k.json(&["get", "pool", "p1"]).await;
    assert_eq!(p1["spec"]["size"], 4);
    assert_eq!(p1["spec"]["flavour"], "blue", "nothing else changed");
    let scale: Value = serde_json::from_str(
        &k.ok(
            &[
                "get",
                "--raw",
                "/apis/example.dev/v1/namespaces/default/pools/p1/scale",
            ],
            None,
        )
        .await,
    )
    .unwrap();
    assert_eq!(scale["kind"], "Scale");
    assert_eq!(scale["apiVersion"], "autoscaling/v1");
    assert_eq!(scale["spec"]["replicas"], 4);
    assert_eq!(scale["status"]["replicas"], 0);
    // A patch of the Scale itself; one with a stale resourceVersion is refused with 409, one
    // with negative replicas with 422.
    let patch = |body: &'static str| {
        [
            "patch",
            "pool",
            "p1",
            "--subresource=scale",
            "--type=merge",
            "-p",
            body,
        ]
    };
    k.ok(&patch(r#"{"spec":{"replicas":6}}"#), None).await;
    assert_eq!(k.json(&["get", "pool", "p1"]).await["spec"]["size"], 6);
    let stale = r#"{"metadata":{"resourceVersion":"1"},"spec":{"replicas":2}}"#;
    let err = k.fails(&patch(stale), None).await;
    assert!(err.contains("the object has been modified"), "{err}");
    let err = k.fails(&patch(r#"{"spec":{"replicas":-1}}"#), None).await;
    assert!(err.contains("spec.replicas"), "{err}");
    assert_eq!(k.json(&["get", "pool", "p1"]).await["spec"]["size"], 6);
}

/// The workload and policy kinds clients' end-to-end suites create: stored, with their
/// defaults, status and scale subresources and columns (nothing runs them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_on_the_workload_kinds() {
    let Some(kubectl) = Kubectl::find("kubectl_on_the_workload_kinds") else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let objects = "apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80}]
---
apiVersion: v1
kind: Pod
metadata: {name: web-0, labels: {app: web}}
spec:
  containers: [{name: web, image: nginx}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx:1.27}]}
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: postgres:17}]}
---
apiVersion: batch/v1
kind: CronJob
metadata: {name: nightly}
spec:
  schedule: '0 3 * * *'
  jobTemplate: {spec: {template: {spec: {restartPolicy: Never, containers: [{name: j, image: busybox}]}}}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: web}
spec: {minAvailable: 1, selector: {matchLabels: {app: web}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny}
spec: {podSelector: {}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
";
    let created = k.ok(&["apply", "-f", "-"], Some(objects)).await;
    assert_eq!(created.matches(" created").count(), 8, "{created}");

    // Defaults a client notices.
    let service = k.json(&["get", "service", "web"]).await;
    let ip = service["spec"]["clusterIP"].as_str().unwrap().to_string();
    assert!(ip.starts_with("10.9") || ip.starts_with("10.1"), "{ip}");
    assert_eq!(service["spec"]["clusterIPs"], json!([ip]));
    assert_eq!(service["spec"]["type"], "ClusterIP");
    k.ok(&["label", "service", "web", "tier=front"], None).await;
    assert_eq!(
        k.json(&["get", "service", "web"]).await["spec"]["clusterIP"],
        ip.as_str(),
        "an update keeps the address"
    );
    let pod = k.json(&["get", "pod", "web-0"]).await;
    assert_eq!(pod["spec"]["restartPolicy"], "Always");
    assert_eq!(pod["spec"]["containers"][0]["imagePullPolicy"], "Always");
    assert_eq!(pod["status"]["phase"], "Pending");
    let db = k.json(&["get", "statefulset", "db"]).await;
    assert_eq!(db["spec"]["updateStrategy"]["type"], "RollingUpdate");
    assert_eq!(db["spec"]["template"]["spec"]["dnsPolicy"], "ClusterFirst");
    let nightly = k.json(&["get", "cronjob", "nightly"]).await;
    assert_eq!(nightly["spec"]["concurrencyPolicy"], "Allow");
    assert_eq!(nightly["spec"]["jobTemplate"]["spec"]["backoffLimit"], 6);

    // Status and scale subresources.
    k.ok(
        &[
            "patch",
            "deployment",
            "web",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status":{"replicas":2,"updatedReplicas":2,"availableReplicas":1}}"#,
        ],
        None,
    )
    .await;
    let table = k.ok(&["get", "deployments"], None).await;
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("UP-TO-DATE") && table.contains("AVAILABLE"),
        "{table}"
    );
    assert!(
        k.ok(&["scale", "deployment/web", "--replicas=5"], None)
            .await
            .contains("scaled")
    );
    let deployment = k.json(&["get", "deployment", "web"]).await;
    assert_eq!(deployment["spec"]["replicas"], 5);
    assert_eq!(
        deployment["status"]["availableReplicas"], 1,
        "the status stays"
    );
    assert_eq!(
        deployment["metadata"]["generation"], 2,
        "a spec change bumps the generation"
    );
    let scale: Value = serde_json::from_str(
        &k.ok(
            &[
                "get",
                "--raw",
                "/apis/apps/v1/namespaces/default/deployments/web/scale",
            ],
            None,
        )
        .await,
    )
    .unwrap();
    assert_eq!(scale["status"]["selector"], "app=web");
    assert!(
        k.ok(&["scale", "statefulset/db", "--replicas=3"], None)
            .await
            .contains("scaled")
    );

    // Computed columns, as kube-apiserver's printers compute them.
    let lines = |table: String| -> Vec<Vec<String>> {
        table
            .lines()
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect()
    };
    let pods = lines(k.ok(&["get", "pods"], None).await);
    assert_eq!(pods[0][..4], ["NAME", "READY", "STATUS", "RESTARTS"]);
    assert_eq!(pods[1][..4], ["web-0", "0/1", "Pending", "0"]);
    k.ok(&[
        "patch",
        "pod",
        "web-0",
        "--subresource=status",
        "--type=merge",
        "-p",
        r#"{"status":{"phase":"Running","podIP":"10.0.0.5","containerStatuses":[{"name":"web","ready":true,"restartCount":0,"image":"nginx","imageID":"","state":{"running":{}}}]}}"#,
    ], None)
    .await;
    let pods = lines(k.ok(&["get", "pods", "-o", "wide"], None).await);
    assert_eq!(pods[1][..4], ["web-0", "1/1", "Running", "0"]);
    assert_eq!(pods[1][5], "10.0.0.5");
    let deployments = lines(k.ok(&["get", "deployments"], None).await);
    assert_eq!(
        deployments[0][..4],
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE"]
    );
    assert_eq!(deployments[1][..4], ["web", "0/5", "2", "1"]);
    let services = lines(k.ok(&["get", "services"], None).await);
    assert_eq!(
        services[0][..5],
        ["NAME", "TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)"]
    );
    assert_eq!(
        [&services[1][..2], &services[1][3..5]].concat(),
        ["web", "ClusterIP", "<none>", "80/TCP"]
    );
    let statefulsets = lines(k.ok(&["get", "statefulsets"], None).await);
    assert_eq!(statefulsets[1][..2], ["db", "0/3"]);

    // Columns, and every kind listed by its short name.
    let cronjobs = k.ok(&["get", "cj"], None).await;
    assert!(
        cronjobs.contains("SCHEDULE") && cronjobs.contains("0 3 * * *"),
        "{cronjobs}"
    );
    let pdbs = k.ok(&["get", "pdb"], None).await;
    assert!(pdbs.contains("MIN AVAILABLE"), "{pdbs}");
    for short in ["po", "svc", "deploy", "sts", "cj", "pdb", "netpol", "pvc"] {
        k.ok(&["get", short], None).await;
    }
}

/// `kubectl patch`, `kubectl set env` and `kubectl apply` send strategic merge patches: lists
/// of built-in kinds merge by their keys (containers by name, env by name, ports by port), and
/// kubectl apply's directives remove and order items.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_strategic_merge_patches_merge_lists_by_key() {
    let Some(kubectl) = Kubectl::find("kubectl_strategic_merge_patches_merge_lists_by_key") else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let deployment = |image: &str, sidecar: bool| {
        let sidecar = if sidecar {
            "\n      - {name: log, image: busybox}"
        } else {
            ""
        };
        format!(
            "apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
spec:
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata: {{labels: {{app: web}}}}
    spec:
      containers:
      - name: web
        image: {image}
        env: [{{name: A, value: '1'}}]{sidecar}
"
        )
    };
    k.ok(&["apply", "-f", "-"], Some(&deployment("nginx:1.26", true)))
        .await;
    let containers = |d: &Value| d["spec"]["template"]["spec"]["containers"].clone();
    let env_names = |d: &Value| -> Vec<String> {
        containers(d)[0]["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap().to_string())
            .collect()
    };

    // A patch naming one container changes that container only.
    k.ok(&[
        "patch",
        "deployment",
        "web",
        "-p",
        r#"{"spec":{"template":{"spec":{"containers":[{"name":"web","env":[{"name":"B","value":"2"}]}]}}}}"#,
    ], None)
    .await;
    let d = k.json(&["get", "deployment", "web"]).await;
    assert_eq!(containers(&d).as_array().unwrap().len(), 2, "{d}");
    assert_eq!(containers(&d)[0]["image"], "nginx:1.26");
    assert_eq!(
        env_names(&d),
        ["B", "A"],
        "new items come first, as kube-apiserver puts them"
    );

    k.ok(&["set", "env", "deployment/web", "-c", "web", "C=3"], None)
        .await;
    let d = k.json(&["get", "deployment", "web"]).await;
    let mut names = env_names(&d);
    names.sort();
    assert_eq!(names, ["A", "B", "C"]);

    // kubectl apply deletes the container dropped from the file, updates the other, and keeps
    // what others added (env B and C were never in the file).
    k.ok(
        &["apply", "-f", "-"],
        Some(&deployment("nginx:1.27", false)),
    )
    .await;
    let d = k.json(&["get", "deployment", "web"]).await;
    let all = containers(&d);
    assert_eq!(all.as_array().unwrap().len(), 1, "{all}");
    assert_eq!(all[0]["name"], "web");
    assert_eq!(all[0]["image"], "nginx:1.27");
    let mut names = env_names(&d);
    names.sort();
    assert_eq!(names, ["A", "B", "C"]);

    // A Service's ports merge by port; a Pod's tolerations have no strategy and are replaced.
    k.ok(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1
kind: Service
metadata: {name: web}
spec: {ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers: [{name: c, image: busybox}]
  tolerations: [{key: a, operator: Exists}]
",
        ),
    )
    .await;
    k.ok(
        &[
            "patch",
            "service",
            "web",
            "-p",
            r#"{"spec":{"ports":[{"name":"https","port":443}]}}"#,
        ],
        None,
    )
    .await;
    let ports = k.json(&["get", "service", "web"]).await["spec"]["ports"].clone();
    let ports: Vec<i64> = ports
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_i64().unwrap())
        .collect();
    assert_eq!(ports, [443, 80]);
    k.ok(
        &[
            "patch",
            "pod",
            "p",
            "-p",
            r#"{"spec":{"tolerations":[{"key":"b","operator":"Exists"}]}}"#,
        ],
        None,
    )
    .await;
    let pod = k.json(&["get", "pod", "p"]).await;
    assert_eq!(
        pod["spec"]["tolerations"],
        json!([{"key": "b", "operator": "Exists"}])
    );

    // A patch item without its merge key is refused, and nothing changes.
    let refused = k
        .fails(
            &[
                "patch",
                "deployment",
                "web",
                "-p",
                r#"{"spec":{"template":{"spec":{"containers":[{"image":"x"}]}}}}"#,
            ],
            None,
        )
        .await;
    assert!(
        refused.contains("does not contain declared merge key: name"),
        "{refused}"
    );
    let d = k.json(&["get", "deployment", "web"]).await;
    assert_eq!(containers(&d)[0]["image"], "nginx:1.27");
}

/// `kubectl explain` of built-in kinds reads k8s-openapi's schemas, documentation included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_built_in_kinds() {
    let Some(kubectl) = Kubectl::find("kubectl_explains_built_in_kinds") else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let restart = k.ok(&["explain", "pods.spec.restartPolicy"], None).await;
    assert!(
        restart.contains("Restart policy for all containers"),
        "{restart}"
    );
    let deployment = k.ok(&["explain", "deployment.spec"], None).await;
    assert!(
        deployment.contains("replicas") && deployment.contains("<integer>"),
        "{deployment}"
    );
    let data = k.ok(&["explain", "configmaps.data"], None).await;
    assert!(data.contains("map[string]string"), "{data}");
}

/// `kubectl create token` (a TokenRequest, in protobuf): a token that authenticates as the
/// ServiceAccount, for as long as asked, bound to a Secret when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_creates_service_account_tokens() {
    let Some(kubectl) = Kubectl::find("kubectl_creates_service_account_tokens") else {
        return;
    };
    let server = ApiServer::builder()
        .tls(true)
        .authorization(caretaker_apiserver::Authorization::Rbac)
        .start()
        .await
        .unwrap();
    let k = kubectl.against(&server.kubeconfig());
    k.ok(&["create", "namespace", "team"], None).await;
    k.ok(&["create", "serviceaccount", "builder", "-n", "team"], None)
        .await;
    let as_token = |token: &str| {
        let mut config = server.kube_config();
        config.auth_info = Default::default();
        config.auth_info.token = Some(token.trim().to_string().into());
        kube::Client::try_from(config).unwrap()
    };
    let whoami = |client: kube::Client| async move {
        let denied = Api::<ConfigMap>::namespaced(client, "team")
            .list(&Default::default())
            .await
            .unwrap_err();
        match denied {
            kube::Error::Api(status) => status.message,
            other => panic!("{other:?}"),
        }
    };

    let token = k
        .ok(&["create", "token", "builder", "-n", "team"], None)
        .await;
    let message = whoami(as_token(&token)).await;
    assert!(
        message.contains("User \"system:serviceaccount:team:builder\" cannot list"),
        "{message}"
    );

    // A lifetime and a binding, as asked.
    k.ok(
        &["create", "secret", "generic", "session", "-n", "team"],
        None,
    )
    .await;
    let request = k
        .json(&[
            "create",
            "token",
            "builder",
            "-n",
            "team",
            "--duration",
            "20m",
            "--bound-object-kind",
            "Secret",
            "--bound-object-name",
            "session",
        ])
        .await;
    assert_eq!(request["spec"]["expirationSeconds"], 1200, "{request}");
    assert_eq!(request["spec"]["boundObjectRef"]["name"], "session");
    let bound = request["status"]["token"].as_str().unwrap().to_string();
    assert!(
        whoami(as_token(&bound))
            .await
            .contains("system:serviceaccount:team:builder")
    );
    k.ok(&["delete", "secret", "session", "-n", "team"], None)
        .await;
    match Api::<ConfigMap>::namespaced(as_token(&bound), "team")
        .list(&Default::default())
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 401),
        other => panic!("a token bound to a deleted Secret: {other:?}"),
    }

    // Shorter than kube's minimum, or for an account that does not exist: refused.
    let short = k
        .fails(
            &[
                "create",
                "token",
                "builder",
                "-n",
                "team",
                "--duration",
                "5m",
            ],
            None,
        )
        .await;
    assert!(
        short.contains("may not specify a duration less than 10 minutes"),
        "{short}"
    );
    let missing = k
        .fails(&["create", "token", "nobody", "-n", "team"], None)
        .await;
    assert!(
        missing.contains("serviceaccounts \"nobody\" not found"),
        "{missing}"
    );
}

/// `value` without what the server sets on its own: identity, times, namespace, owners, a
/// Service's allocated addresses; managedFields without their times.
fn without_server_fields(mut value: Value) -> Value {
    if let Some(meta) = value["metadata"].as_object_mut() {
        for server_set in [
            "uid",
            "resourceVersion",
            "creationTimestamp",
            "namespace",
            "ownerReferences",
        ] {
            meta.remove(server_set);
        }
        for entry in meta
            .get_mut("managedFields")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            entry.as_object_mut().unwrap().remove("time");
        }
    }
    if value["kind"] == "Service" {
        let spec = value["spec"].as_object_mut().unwrap();
        spec.remove("clusterIP");
        spec.remove("clusterIPs");
    }
    value
}

/// Whether every field of `printed` is in `stored` with the same value (nulls aside: Go's
/// zero times, which the server replaces).
fn holds(stored: &Value, printed: &Value) -> Result<(), String> {
    match (stored, printed) {
        (_, Value::Null) => Ok(()),
        (Value::Object(stored), Value::Object(printed)) => {
            printed.iter().try_for_each(|(key, value)| {
                holds(stored.get(key).unwrap_or(&Value::Null), value)
                    .map_err(|e| format!("{key}.{e}"))
            })
        }
        (Value::Array(stored), Value::Array(printed)) if stored.len() == printed.len() => stored
            .iter()
            .zip(printed)
            .enumerate()
            .try_for_each(|(i, (s, p))| holds(s, p).map_err(|e| format!("[{i}].{e}"))),
        _ if stored == printed => Ok(()),
        _ => Err(format!(": stored {stored}, printed {printed}")),
    }
}

/// kubectl's typed `create` commands send protobuf: each creates its object (415 before k8s-pb
/// decoded every built-in kind), and the object stored is what the same command prints with
/// `--dry-run=client -o json`, field for field, and the same as that JSON creates (in another
/// namespace or under another name), so no field is lost, renamed, retyped or added.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_typed_create_sends_protobuf_for_every_kind() {
    let Some(kubectl) = Kubectl::find("kubectl_typed_create_sends_protobuf_for_every_kind") else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    k.ok(&["create", "namespace", "team"], None).await;
    k.ok(&["create", "namespace", "twin"], None).await;
    // (resource to get, name, the create command's arguments)
    let commands: &[(&str, &str, &[&str])] = &[
        (
            "deployment",
            "web",
            &[
                "deployment",
                "web",
                "--image=nginx:1.27",
                "--port=80",
                "--replicas=0",
            ],
        ),
        (
            "job",
            "once",
            &["job", "once", "--image=busybox", "--", "echo", "hi"],
        ),
        (
            "cronjob",
            "nightly",
            &[
                "cronjob",
                "nightly",
                "--image=busybox",
                "--schedule=0 0 * * *",
                "--",
                "date",
            ],
        ),
        (
            "service",
            "api",
            &[
                "service",
                "clusterip",
                "api",
                "--tcp=80:8080",
                "--tcp=9090:metrics",
            ],
        ),
        ("serviceaccount", "builder", &["serviceaccount", "builder"]),
        (
            "role",
            "reader",
            &[
                "role",
                "reader",
                "--verb=get,list",
                "--resource=pods,deployments.apps",
            ],
        ),
        (
            "rolebinding",
            "reader",
            &[
                "rolebinding",
                "reader",
                "--role=reader",
                "--user=alice",
                "--serviceaccount=team:builder",
            ],
        ),
        (
            "clusterrole",
            "viewer",
            &[
                "clusterrole",
                "viewer",
                "--verb=get",
                "--resource=nodes",
                "--non-resource-url=/healthz",
            ],
        ),
        (
            "ingress",
            "site",
            &[
                "ingress",
                "site",
                "--class=default",
                "--rule=example.com/api*=api:80",
                "--rule=example.com/=web:http,tls=site-cert",
            ],
        ),
        (
            "poddisruptionbudget",
            "web",
            &[
                "poddisruptionbudget",
                "web",
                "--selector=app=web",
                "--min-available=50%",
            ],
        ),
        (
            "job",
            "manual",
            &["job", "manual", "--from=cronjob/nightly"],
        ),
    ];
    for (resource, name, args) in commands {
        // Flags go before a `--`, after which is the container's command.
        let with = |extra: &[&'static str]| {
            let end = args.iter().position(|a| *a == "--").unwrap_or(args.len());
            let mut all = vec!["create"];
            all.extend_from_slice(&args[..end]);
            all.extend_from_slice(&["-n", "team"]);
            all.extend_from_slice(extra);
            all.extend_from_slice(&args[end..]);
            all
        };
        let printed: Value =
            serde_json::from_str(&k.ok(&with(&["--dry-run=client", "-o", "json"]), None).await)
                .unwrap();
        k.ok(&with(&[]), None).await;
        let stored = k.json(&["get", resource, name, "-n", "team"]).await;
        if let Err(difference) = holds(&stored, &printed) {
            panic!("kubectl create {args:?}: {difference}\nstored {stored:#}\nprinted {printed:#}");
        }
        // The same object from JSON: in namespace twin, or, cluster-wide, named NAME-json.
        let mut from_json = printed.clone();
        let meta = from_json["metadata"].as_object_mut().unwrap();
        meta.remove("namespace");
        // The CronJob a Job was made from is in team.
        meta.remove("ownerReferences");
        let cluster_wide = *resource == "clusterrole";
        if cluster_wide {
            from_json["metadata"]["name"] = json!(format!("{name}-json"));
        }
        k.ok(
            &["create", "-n", "twin", "-f", "-"],
            Some(&from_json.to_string()),
        )
        .await;
        let twin = if cluster_wide {
            k.json(&["get", resource, &format!("{name}-json")]).await
        } else {
            k.json(&["get", resource, name, "-n", "twin"]).await
        };
        let mut twin = without_server_fields(twin);
        if cluster_wide {
            twin["metadata"]["name"] = json!(name);
        }
        assert_eq!(
            without_server_fields(stored),
            twin,
            "kubectl create {args:?}: protobuf and JSON stored differently"
        );
    }
}

/// `/openapi/v2` is the whole Swagger 2.0 document, in the protobuf form kubectl reads:
/// `kubectl explain --output=plaintext-openapiv2` finds a built-in kind and a custom resource
/// in it (it found nothing in the empty document served before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_explains_from_openapi_v2() {
    let Some(kubectl) = Kubectl::find("kubectl_explains_from_openapi_v2") else {
        return;
    };
    let server = TestServer::start().await;
    let k = kubectl.against(&server.kubeconfig());
    let crd = "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.dev
spec:
  group: example.dev
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              size: {type: integer, description: How many cogs the widget turns.}
";
    k.ok(&["apply", "-f", "-"], Some(crd)).await;
    let v2 = ["--output", "plaintext-openapiv2"];
    let config_map = k
        .ok(&[&["explain", "configmaps"][..], &v2].concat(), None)
        .await;
    assert!(
        config_map.contains("ConfigMap holds configuration data"),
        "{config_map}"
    );
    let replicas = k
        .ok(
            &[&["explain", "deployments.spec.replicas"][..], &v2].concat(),
            None,
        )
        .await;
    assert!(
        replicas.contains("<integer>") && replicas.contains("desired pods"),
        "{replicas}"
    );
    let widget = k
        .ok(&[&["explain", "widgets.spec"][..], &v2].concat(), None)
        .await;
    assert!(
        widget.contains("size") && widget.contains("How many cogs"),
        "{widget}"
    );
}
