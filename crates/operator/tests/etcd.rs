//! EtcdCertificates on a real three-member etcd cluster with peer and client TLS (Debian's
//! `etcd-server`), installed from `etcd-all-certs` by the harness as a static-pod installer
//! would, with the operator's controller running against the embedded API server.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use caretaker_api::v1alpha1::{EtcdCertificates, EtcdCertificatesStatus};
use caretaker_apiserver::TestServer;
use caretaker_operator::authority::Certificate;
use caretaker_operator::etcd::controller as etcd_certificates;
use caretaker_operator::{Context, Settings};
use common::authorities::{create_namespace, eventually, install_caretaker_crds};
use common::etcd::{EtcdCluster, Load, etcd_available};
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "etcd-system";

struct Setup {
    _server: caretaker_apiserver::ApiServer,
    client: kube::Client,
    cluster: EtcdCluster,
    operator: tokio::task::JoinHandle<()>,
    /// The operator's context: its metrics.
    ctx: Arc<Context>,
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.operator.abort();
    }
}

impl Setup {
    async fn new() -> Self {
        let server = TestServer::start().await;
        let client = server.client();
        install_caretaker_crds(&client).await;
        create_namespace(&client, NS).await;
        let cluster = EtcdCluster::new(&client, NS);
        let object = cluster.certificates_object(NS);
        Api::<EtcdCertificates>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        let ctx = Context::new(client.clone(), Settings::default());
        let operator = tokio::spawn(etcd_certificates::run(ctx.clone()));
        Self {
            _server: server,
            client,
            cluster,
            operator,
            ctx,
        }
    }

    fn objects(&self) -> Api<EtcdCertificates> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn condition(&self, type_: &str) -> Option<(String, String, String)> {
        let object = self.objects().get("etcd").await.ok()?;
        object
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status, c.reason, c.message))
    }

    async fn signer_serial(&self) -> String {
        let object = self.objects().get("etcd").await.unwrap();
        object
            .status
            .and_then(|s| s.signer)
            .and_then(|s| s.serial_number)
            .unwrap_or_default()
    }

    /// Installs revisions as they come until the operator has nothing left to do: Ready,
    /// not degraded, no next signer, and no new revision for a few seconds.
    async fn settle(&mut self) {
        self.settle_until(|status| {
            (status.conditions.iter()).any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .await
    }

    /// As [`Self::settle`], with `done` in place of Ready.
    async fn settle_until(&mut self, done: impl Fn(&EtcdCertificatesStatus) -> bool) {
        let mut quiet = 0;
        for _ in 0..600 {
            if self.cluster.install_if_changed().await {
                quiet = 0;
                continue;
            }
            let object = self.objects().get("etcd").await.unwrap();
            let status = object.status.unwrap_or_default();
            let ready = done(&status);
            let rotating = status.signer.as_ref().is_some_and(|s| {
                s.next_serial_number.is_some() || !s.previous_serial_numbers.is_empty()
            });
            quiet = if ready && !rotating { quiet + 1 } else { 0 };
            if quiet >= 20 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let status = self.objects().get("etcd").await.unwrap().status;
        panic!(
            "never settled; installed {:?}; status {status:#?}",
            self.cluster.installed
        );
    }

    /// The names of the operator's etcd expiry series (`EtcdSigner` and `EtcdCertificate`) in
    /// the harness's namespace, as `/metrics` shows them.
    fn expiry_series(&self) -> Vec<String> {
        let metrics = self.ctx.metrics.encode();
        let mut names: Vec<String> = metrics
            .lines()
            .filter(|l| l.starts_with("caretaker_certificate_expiration_seconds{"))
            .filter(|l| l.contains("kind=\"EtcdSigner\"") || l.contains("kind=\"EtcdCertificate\""))
            .filter(|l| l.contains(&format!("namespace=\"{NS}\"")))
            .filter_map(|l| {
                l.split("name=\"")
                    .nth(1)?
                    .split('"')
                    .next()
                    .map(str::to_string)
            })
            .collect();
        names.sort();
        names
    }

    async fn events(&self) -> Vec<Event> {
        Api::<Event>::namespaced(self.client.clone(), NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }
}

fn start_operator(client: &kube::Client) -> tokio::task::JoinHandle<()> {
    let ctx = Context::new(client.clone(), Settings::default());
    tokio::spawn(etcd_certificates::run(ctx))
}

/// The label the Node tests select members by.
const MEMBER_LABEL: &str = "etcd.caretaker.dev/member";

/// A Node labelled as a member, with these `(type, address)` status addresses.
async fn create_member_node(client: &kube::Client, name: &str, addresses: &[(&str, &str)]) {
    let addresses: Vec<_> = (addresses.iter())
        .map(|(type_, address)| json!({"type": type_, "address": address}))
        .collect();
    let node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {MEMBER_LABEL: "true"}},
        "status": {"addresses": addresses},
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// A fresh API server with the CRDs and the namespace, these member Nodes, and the
/// EtcdCertificates `etcd` selecting them (no listed member; its endpoint answers nothing).
async fn selecting_nodes(
    nodes: &[(&str, &[(&str, &str)])],
) -> (caretaker_apiserver::ApiServer, kube::Client) {
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    create_namespace(&client, NS).await;
    for (name, addresses) in nodes {
        create_member_node(&client, name, addresses).await;
    }
    let object: EtcdCertificates = serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
        "metadata": {"name": "etcd", "namespace": NS},
        "spec": {
            "memberSelector": {"matchLabels": {MEMBER_LABEL: "true"}},
            "quorum": {"endpoints": ["https://10.0.0.10:2379"]},
        },
    }))
    .unwrap();
    Api::<EtcdCertificates>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    (server, client)
}

/// The EtcdCertificates `etcd`'s condition `type_` when True: its reason and message.
async fn true_condition(client: &kube::Client, type_: &str) -> Option<(String, String)> {
    let object = Api::<EtcdCertificates>::namespaced(client.clone(), NS)
        .get("etcd")
        .await
        .ok()?;
    (object.status?.conditions.into_iter())
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| (c.reason, c.message))
}

/// The Warning events' messages with this reason, in the namespace.
async fn warnings(client: &kube::Client, reason: &str) -> Vec<String> {
    let events = Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    (events.items.into_iter())
        .filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect()
}

/// A certificate Secret's `tls.crt` subject common name.
fn common_name(secret: &Secret) -> Option<String> {
    let data = secret.data.as_ref().unwrap();
    let pem = String::from_utf8(data["tls.crt"].0.clone()).unwrap();
    Certificate::parse_pem(&pem).unwrap()[0]
        .info()
        .common_name
        .clone()
}

/// Issue 31, item 4 (a): a Node writer gives a selected Node a non-ASCII address. That Node
/// alone is refused and named (Degraded and a Warning); every other certificate is issued, and
/// one deleted is issued again. Before, signing failed (`Invalid IA5String`) and nothing was
/// issued at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_a_non_ascii_address_stops_no_other_certificate() {
    let (_server, client) = selecting_nodes(&[
        ("cp-0", &[("InternalIP", "10.0.0.10")]),
        (
            "cp-1",
            &[("InternalIP", "10.0.0.11"), ("Hostname", "cp-1.exämple")],
        ),
    ])
    .await;
    let _operator = start_operator(&client);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let all = eventually(
        "etcd-all-certs, etcd-client and cp-0's certificates",
        60,
        || async {
            for name in ["etcd-client", "etcd-metric-client", "etcd-peer-cp-0"] {
                secrets.get_opt(name).await.ok()??;
            }
            secrets.get_opt("etcd-all-certs").await.ok()?
        },
    )
    .await;
    let keys: Vec<String> = all.data.unwrap().into_keys().collect();
    assert!(
        keys.contains(&"etcd-serving-cp-0.crt".to_string()),
        "{keys:?}"
    );
    assert!(!keys.iter().any(|k| k.contains("cp-1")), "{keys:?}");
    assert!(secrets.get_opt("etcd-peer-cp-1").await.unwrap().is_none());
    let (reason, message) = eventually("Degraded naming cp-1", 30, || async {
        true_condition(&client, "EtcdCertSignerControllerDegraded").await
    })
    .await;
    assert_eq!(reason, "MemberRefused");
    assert!(
        message.starts_with("Node \"cp-1\" is not a member: status.addresses[1].address: \"cp-1.exämple\" is not a DNS name"),
        "{message}"
    );
    let warned = eventually("a Warning naming cp-1", 30, || async {
        let found = warnings(&client, "MemberRefused").await;
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert!(warned[0].contains("Node \"cp-1\""), "{warned:?}");

    // A certificate deleted is issued again (before, nothing was).
    let old = secrets.get("etcd-client").await.unwrap();
    secrets
        .delete("etcd-client", &Default::default())
        .await
        .unwrap();
    eventually("etcd-client issued again", 30, || async {
        let new = secrets.get_opt("etcd-client").await.ok()??;
        (new.metadata.uid != old.metadata.uid).then_some(())
    })
    .await;
}

/// Issue 31, item 4 (b): a Node named `metrics-cp-0` would have the serving Secret
/// `etcd-serving-metrics-cp-0`, which is member cp-0's metrics serving Secret. It is refused,
/// naming both; cp-0's certificate stays as issued, pass after pass. Before, the two members
/// replaced each other's certificate in that Secret about 90 times a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_named_after_a_members_metrics_secret_is_refused() {
    let (_server, client) = selecting_nodes(&[
        ("cp-0", &[("InternalIP", "10.0.0.10")]),
        ("metrics-cp-0", &[("InternalIP", "10.0.0.11")]),
    ])
    .await;
    let ctx = Context::new(client.clone(), Settings::default());
    let _operator = tokio::spawn(etcd_certificates::run(ctx.clone()));
    let (reason, message) = eventually("Degraded naming metrics-cp-0", 60, || async {
        true_condition(&client, "EtcdCertSignerControllerDegraded").await
    })
    .await;
    assert_eq!(reason, "MemberRefused");
    assert_eq!(
        message,
        "Node \"metrics-cp-0\" is not a member: its Secret \"etcd-serving-metrics-cp-0\" is \
         already Node \"cp-0\"'s"
    );
    let warned = warnings(&client, "MemberRefused").await;
    assert_eq!(warned, [message]);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let all = secrets.get("etcd-all-certs").await.unwrap();
    let keys: Vec<String> = all.data.unwrap().into_keys().collect();
    assert!(keys.contains(&"etcd-peer-cp-0.crt".to_string()), "{keys:?}");
    for refused in [
        "etcd-peer-metrics-cp-0",
        "etcd-serving-metrics-metrics-cp-0",
    ] {
        assert!(!keys.contains(&format!("{refused}.crt")), "{keys:?}");
    }
    assert!(
        secrets
            .get_opt("etcd-peer-metrics-cp-0")
            .await
            .unwrap()
            .is_none()
    );

    // Pass after pass (the endpoint answers nothing, so the controller asks every 2 s), cp-0's
    // metrics serving certificate is not written again.
    let metrics = secrets.get("etcd-serving-metrics-cp-0").await.unwrap();
    assert_eq!(
        common_name(&metrics).as_deref(),
        Some("system:etcd-metric:cp-0")
    );
    let passes = || reconciles(&ctx);
    let before = passes();
    eventually("three more passes", 30, || async {
        (passes() >= before + 3).then_some(())
    })
    .await;
    let after = secrets.get("etcd-serving-metrics-cp-0").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        metrics.metadata.resource_version
    );
}

/// The controller's passes so far, from its `caretaker_reconcile_total`.
fn reconciles(ctx: &Context) -> u64 {
    let metrics = ctx.metrics.encode();
    let line = (metrics.lines())
        .find(|l| l.starts_with("caretaker_reconcile_total{controller=\"etcd_certificates\"}"))
        .unwrap_or_default();
    line.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_a_three_member_tls_cluster_from_nothing() {
    if !etcd_available("bootstrap_a_three_member_tls_cluster_from_nothing") {
        return;
    }
    let mut setup = Setup::new().await;
    setup.cluster.bootstrap(60).await;
    setup.settle().await;
    let client = setup.cluster.client().await;
    client.put("hello", "world").await.unwrap();
    assert_eq!(client.get("hello").await.unwrap().as_deref(), Some("world"));
    let (revision, all) = setup.cluster.all_certs().await.unwrap();
    let object = setup.objects().get("etcd").await.unwrap();
    let status = object.status.unwrap();
    assert_eq!(
        status.all_certs_revision.as_deref(),
        Some(revision.as_str())
    );
    let names: Vec<&str> = status.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["m0", "m1", "m2"]);
    // Every member runs revision 1 (none has an agent: seen by the certificate it serves).
    assert_eq!(status.latest_revision, Some(1));
    assert!(
        status.members.iter().all(|m| m.current_revision == 1),
        "{:?}",
        status.members
    );
    assert_eq!(
        setup.cluster.installed.len(),
        1,
        "one revision from nothing"
    );
    // Every member certificate chains to its signer: etcd itself accepted the peer and
    // client ones; the metrics ones chain to the metrics signer.
    let metrics_ca = setup
        .cluster
        .config_maps()
        .get("etcd-metric-ca-bundle")
        .await
        .unwrap()
        .data
        .unwrap()["ca-bundle.crt"]
        .clone();
    let cas = Certificate::parse_pem(&metrics_ca).unwrap();
    for m in ["m0", "m1", "m2"] {
        let leaf =
            &Certificate::parse_pem(&all[&format!("etcd-serving-metrics-{m}.crt")]).unwrap()[0];
        assert!(
            cas.iter()
                .any(|ca| caretaker_pki::is_issued_by(leaf.der(), ca.der()).unwrap()),
            "{m}"
        );
    }
    let condition = setup
        .condition("EtcdCertSignerControllerDegraded")
        .await
        .unwrap();
    assert_eq!(condition.0, "False");
}

/// A client writes and reads continuously while the signer is rotated twice; the members
/// restart one at a time for each revision. Nothing fails, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signer_rotations_under_load_fail_no_operation_and_lose_no_write() {
    if !etcd_available("signer_rotations_under_load") {
        return;
    }
    let mut setup = Setup::new().await;
    setup.cluster.bootstrap(60).await;
    setup.settle().await;

    let client = setup.cluster.client().await;
    let load = Load::start(&setup.cluster, &client, 8);
    let stop = Arc::new(AtomicBool::new(false));

    // Every member is healthy throughout, but the one restarting (and the moment of a leader
    // election that its restart may cause).
    let health = setup.cluster.watch_health(client.clone(), stop.clone());
    let mut serials = vec![setup.signer_serial().await];
    for _ in 0..2 {
        let before = setup.cluster.installed.len();
        setup.cluster.force_rotation().await;
        setup.settle().await;
        serials.push(setup.signer_serial().await);
        assert_eq!(
            setup.cluster.installed.len() - before,
            3,
            "trust, certificates, the old signer gone: {:?}",
            setup.cluster.installed
        );
    }
    stop.store(true, Ordering::Relaxed);
    let load = load.stop().await;
    let unhealthy = health.await.unwrap();
    assert!(
        unhealthy.is_empty(),
        "members unhealthy while not restarting: {unhealthy:?}"
    );
    let (done, failed) = (load.done(), load.failed());
    let seconds = load.started.elapsed().as_secs_f64();
    eprintln!(
        "operations: {done} succeeded ({:.0}/s over {seconds:.1}s), {} failed; signers {serials:?}",
        done as f64 / seconds,
        failed.len()
    );
    assert!(failed.is_empty(), "failed operations: {failed:?}");
    assert!(done > 100, "the load ran: {done}");
    assert_eq!(
        serials
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3,
        "two new signers: {serials:?}"
    );
    // Every acknowledged write is there, with its last value.
    let lost = load.lost(&setup.cluster.client().await).await;
    assert!(lost.is_empty(), "lost writes: {lost:?}");
}

/// With a member stopped, a due rotation changes nothing that restarts a member; when the
/// member is back, the rotation goes on by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quorum_gate_holds_a_rotation_until_the_member_is_back() {
    if !etcd_available("the_quorum_gate_holds_a_rotation") {
        return;
    }
    let mut setup = Setup::new().await;
    setup.cluster.bootstrap(60).await;
    setup.settle().await;
    let (revision, _) = setup.cluster.all_certs().await.unwrap();
    setup.cluster.stop_member(2).await;
    setup.cluster.force_rotation().await;
    let (status, reason, message) = eventually("Degraded for quorum", 30, || async {
        setup
            .condition("EtcdCertSignerControllerDegraded")
            .await
            .filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "InsufficientQuorum")
    );
    assert!(
        message.starts_with(
            "skipping EtcdCertSignerController reconciliation due to insufficient quorum"
        ) && message.contains(&format!(
            "unhealthy: {} (",
            setup.cluster.members[2].client_url()
        )),
        "{message}"
    );
    // Held for a while: no new revision, and the bundle already trusts the next signer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(setup.cluster.all_certs().await.unwrap().0, revision);
    let bundle = setup
        .cluster
        .config_maps()
        .get("etcd-ca-bundle")
        .await
        .unwrap();
    assert_eq!(
        bundle.data.unwrap()["ca-bundle.crt"]
            .matches("BEGIN CERTIFICATE")
            .count(),
        2
    );
    let events = setup.events().await;
    let warnings = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("InsufficientQuorum"))
        .count();
    assert_eq!(warnings, 1, "said once");

    // Back: the rotation proceeds without anyone touching anything.
    setup.cluster.restart_stopped().await;
    setup.settle().await;
    assert_ne!(setup.cluster.all_certs().await.unwrap().0, revision);
    assert_eq!(
        setup
            .condition("EtcdCertSignerControllerDegraded")
            .await
            .unwrap()
            .0,
        "False"
    );
}

/// The operator killed in the middle of a rotation: started again, it finishes the rotation
/// with the signer it had made, and no revision is made twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_killed_mid_rotation_finishes_it_without_a_second_signer() {
    if !etcd_available("an_operator_killed_mid_rotation") {
        return;
    }
    let mut setup = Setup::new().await;
    setup.cluster.bootstrap(60).await;
    setup.settle().await;
    let (before, _) = setup.cluster.all_certs().await.unwrap();
    setup.cluster.force_rotation().await;
    // Killed once the trust revision is written, before the members took it up.
    eventually("the trust revision", 30, || async {
        let (revision, _) = setup.cluster.all_certs().await?;
        (revision != before).then_some(())
    })
    .await;
    setup.operator.abort();
    let next_of = |secret: k8s_openapi::api::core::v1::Secret| {
        String::from_utf8(secret.data.unwrap()["next.crt"].0.clone()).unwrap()
    };
    let next = next_of(setup.cluster.secrets().get("etcd-signer").await.unwrap());
    let installed = setup.cluster.installed.len();
    setup.cluster.install_if_changed().await;

    setup.operator = start_operator(&setup.client);
    setup.settle().await;
    let signer = setup.cluster.secrets().get("etcd-signer").await.unwrap();
    let current = String::from_utf8(signer.data.unwrap()["tls.crt"].0.clone()).unwrap();
    assert_eq!(current, next, "the signer made before the kill signs now");
    let revisions = &setup.cluster.installed[installed - 1..];
    assert_eq!(
        revisions.len(),
        4,
        "before, trust, certificates, old signer gone: {revisions:?}"
    );
    let distinct: std::collections::BTreeSet<_> = revisions.iter().collect();
    assert_eq!(distinct.len(), revisions.len(), "{revisions:?}");
}

/// Members selected from Nodes: each selected Node's name and addresses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_selected_by_label_are_members() {
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    create_namespace(&client, NS).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for (name, role, address) in [
        ("cp-0", true, "10.0.0.10"),
        ("cp-1", true, "10.0.0.11"),
        ("w-0", false, "10.0.0.20"),
    ] {
        let mut labels = serde_json::Map::new();
        if role {
            labels.insert("node-role.kubernetes.io/control-plane".into(), json!(""));
        }
        let node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": format!("{name}.example")}]},
        }))
        .unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let object: EtcdCertificates = serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
        "metadata": {"name": "etcd", "namespace": NS},
        "spec": {
            "memberSelector": {"matchLabels": {"node-role.kubernetes.io/control-plane": ""}},
            "quorum": {"endpoints": ["https://10.0.0.10:2379", "https://10.0.0.11:2379"]},
        },
    }))
    .unwrap();
    let objects: Api<EtcdCertificates> = Api::namespaced(client.clone(), NS);
    objects
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let _operator = start_operator(&client);
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(client.clone(), NS);
    let all = eventually("etcd-all-certs", 30, || async {
        secrets.get_opt("etcd-all-certs").await.ok()?
    })
    .await;
    let keys: Vec<String> = all.data.unwrap().into_keys().collect();
    assert!(
        keys.contains(&"etcd-peer-cp-0.crt".to_string())
            && keys.contains(&"etcd-peer-cp-1.crt".to_string())
    );
    assert!(!keys.iter().any(|k| k.contains("w-0")), "{keys:?}");
    let peer = secrets.get("etcd-peer-cp-1").await.unwrap();
    let pem = String::from_utf8(peer.data.unwrap()["tls.crt"].0.clone()).unwrap();
    let info = Certificate::parse_pem(&pem).unwrap()[0].info().clone();
    assert!(
        info.ip_addresses.contains(&"10.0.0.11".parse().unwrap()),
        "{info:?}"
    );
    assert!(
        info.dns_names.contains(&"cp-1.example".to_string())
            && info.dns_names.contains(&"cp-1".to_string())
    );
    let status = eventually("the members in the status", 30, || async {
        objects
            .get("etcd")
            .await
            .ok()?
            .status
            .filter(|s| !s.members.is_empty())
    })
    .await;
    let names: Vec<&str> = status.members.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, ["cp-0", "cp-1"]);
    // A Node labelled later joins.
    let patch = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}});
    nodes
        .patch("w-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually("w-0's certificates", 30, || async {
        secrets.get_opt("etcd-peer-w-0").await.ok()?.map(|_| ())
    })
    .await;
}

/// A member added to the list gets its certificates in exactly one new revision, and joins
/// with them; a member removed loses its certificates, again in one revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_added_costs_one_revision_and_a_member_removed_loses_its_certificates_and_series()
{
    if !etcd_available("a_member_added_costs_one_revision") {
        return;
    }
    let mut setup = Setup::new().await;
    setup.cluster.bootstrap(60).await;
    setup.settle().await;
    let first = setup.cluster.installed.len();
    let objects = setup.objects();
    let members = |names: &[&str]| -> serde_json::Value {
        json!({"spec": {"members": names.iter()
            .map(|m| json!({"name": m, "addresses": ["127.0.0.1"]}))
            .collect::<Vec<_>>()}})
    };
    objects
        .patch(
            "etcd",
            &PatchParams::default(),
            &Patch::Merge(&members(&["m0", "m1", "m2", "m3"])),
        )
        .await
        .unwrap();
    eventually("m3's certificates in etcd-all-certs", 30, || async {
        let (_, all) = setup.cluster.all_certs().await?;
        all.contains_key("etcd-peer-m3.crt").then_some(())
    })
    .await;
    setup.cluster.add_member().await;
    setup.settle().await;
    assert_eq!(
        setup.cluster.installed.len() - first,
        1,
        "{:?}",
        setup.cluster.installed
    );
    let client = setup.cluster.client().await;
    client.put("after-join", "yes").await.unwrap();

    setup.cluster.remove_last_member().await;
    objects
        .patch(
            "etcd",
            &PatchParams::default(),
            &Patch::Merge(&members(&["m0", "m1", "m2"])),
        )
        .await
        .unwrap();
    eventually("m3's certificates gone", 30, || async {
        let (_, all) = setup.cluster.all_certs().await?;
        let secret = setup.cluster.secrets().get_opt("etcd-peer-m3").await.ok()?;
        (!all.contains_key("etcd-peer-m3.crt") && secret.is_none()).then_some(())
    })
    .await;
    setup.settle().await;
    assert_eq!(
        setup.cluster.installed.len() - first,
        2,
        "{:?}",
        setup.cluster.installed
    );
    for gone in ["etcd-serving-m3", "etcd-serving-metrics-m3"] {
        assert!(
            setup
                .cluster
                .secrets()
                .get_opt(gone)
                .await
                .unwrap()
                .is_none(),
            "{gone}"
        );
    }
    assert_eq!(
        client.get("after-join").await.unwrap().as_deref(),
        Some("yes")
    );

    // The metrics follow: a removed member's certificates leave the expiry gauge, and every
    // series goes with the object (the etcd cluster keeps its certificates).
    let series = setup.expiry_series();
    assert!(series.contains(&"signer-ca".to_string()), "{series:?}");
    assert!(series.contains(&"etcd-peer-m0".to_string()), "{series:?}");
    assert!(!series.iter().any(|s| s.ends_with("-m3")), "{series:?}");
    objects.delete("etcd", &Default::default()).await.unwrap();
    eventually("the etcd expiry series gone", 30, || async {
        setup.expiry_series().is_empty().then_some(())
    })
    .await;
    assert!(
        setup
            .cluster
            .secrets()
            .get_opt("etcd-peer-m0")
            .await
            .unwrap()
            .is_some(),
        "deleting the object deletes no certificate"
    );
}

/// Issue 31, item 4: Node deletions wake the controller. On a settled cluster, with nothing
/// else changing, a refused Node deleted clears Degraded, and a member Node deleted leaves
/// `etcd-all-certs` and loses its Secrets. Before, a Node deletion was filtered out with the
/// heartbeats (its labels and addresses had not changed), and nothing happened until an
/// unrelated edit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_nodes_wake_the_controller() {
    if !etcd_available("deleted_nodes_wake_the_controller") {
        return;
    }
    let mut setup = Setup::new().await;
    setup.cluster.bootstrap(60).await;
    setup.settle().await;
    let selector = json!({"spec": {"memberSelector": {"matchLabels": {MEMBER_LABEL: "true"}}}});
    setup
        .objects()
        .patch("etcd", &PatchParams::default(), &Patch::Merge(&selector))
        .await
        .unwrap();
    create_member_node(&setup.client, "n-extra", &[("InternalIP", "127.0.0.1")]).await;
    create_member_node(&setup.client, "n-bad", &[("Hostname", "n-bad.exämple")]).await;
    setup
        .settle_until(|status| {
            let refused = (status.conditions.iter()).any(|c| {
                c.type_ == "EtcdCertSignerControllerDegraded"
                    && c.status == "True"
                    && c.message.contains("Node \"n-bad\"")
            });
            refused && status.members.iter().any(|m| m.name == "n-extra")
        })
        .await;
    let (_, all) = setup.cluster.all_certs().await.unwrap();
    assert!(all.contains_key("etcd-peer-n-extra.crt"));

    let nodes: Api<Node> = Api::all(setup.client.clone());
    nodes.delete("n-bad", &Default::default()).await.unwrap();
    eventually("Degraded cleared", 30, || async {
        let (status, reason, _) = setup.condition("EtcdCertSignerControllerDegraded").await?;
        (status == "False").then_some(reason)
    })
    .await;

    nodes.delete("n-extra", &Default::default()).await.unwrap();
    eventually("n-extra's certificates gone", 30, || async {
        let (_, all) = setup.cluster.all_certs().await?;
        let secret = setup
            .cluster
            .secrets()
            .get_opt("etcd-peer-n-extra")
            .await
            .ok()?;
        (!all.contains_key("etcd-peer-n-extra.crt") && secret.is_none()).then_some(())
    })
    .await;
    setup.settle().await;
}

/// Issue 34, L3: someone who may annotate Nodes gives a selected Node the agent endpoint
/// annotation (the Machine controller's) on a cluster that uses no agents (no `spec.agents`).
/// It is not an etcd agent: the revision is written and nothing stops at that member. Before,
/// the rollout stopped there (Degraded, `InstallerPodFailed`: "it has an agent endpoint but
/// spec.agents.caSecretName is not set").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_agent_endpoint_counts_only_where_agents_are_used() {
    let (_server, client) = selecting_nodes(&[("cp-0", &[("InternalIP", "10.0.0.10")])]).await;
    let annotation = json!({"metadata": {"annotations": {
        caretaker_api::names::AGENT_ENDPOINT: "https://127.0.0.1:1",
    }}});
    Api::<Node>::all(client.clone())
        .patch("cp-0", &PatchParams::default(), &Patch::Merge(&annotation))
        .await
        .unwrap();
    let _operator = start_operator(&client);
    let objects = Api::<EtcdCertificates>::namespaced(client.clone(), NS);
    // The status the pass that wrote etcd-all-certs left, its rollout included.
    let status = eventually("etcd-all-certs in the status", 60, || async {
        let status = objects.get("etcd").await.ok()?.status?;
        status.all_certs_revision.is_some().then_some(status)
    })
    .await;
    let degraded = (status.conditions.iter())
        .find(|c| c.type_ == "EtcdCertSignerControllerDegraded")
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(!degraded.contains("rollout stopped"), "{degraded}");
    assert!(!degraded.contains("agent"), "{degraded}");
    assert_eq!(
        warnings(&client, "InstallerPodFailed").await,
        Vec::<String>::new()
    );
}

/// Issue 34, L2: `spec.agents.caSecretName` names a TLS Secret of the namespace whose keeper
/// never agreed to it (any CA Secret there, say another component's). It is refused: Degraded
/// names the Secret and the annotation that would consent, and its CA signs nothing. Once the
/// Secret is annotated for this object, it is used (the refusal goes; the unreachable agent
/// is what the rollout then stops at). Before, any TLS Secret of the namespace was used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agents_ca_secret_without_consent_is_refused() {
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    create_namespace(&client, NS).await;
    let ca = caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new("other-ca"))
        .unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": "some-component-ca"},
        "type": "kubernetes.io/tls",
        "stringData": {"tls.crt": ca.certificate_pem(), "tls.key": ca.private_key_pem()},
    }))
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let object: EtcdCertificates = serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
        "metadata": {"name": "etcd", "namespace": NS},
        "spec": {
            "members": [{"name": "m0", "addresses": ["127.0.0.1"], "agentEndpoint": "https://127.0.0.1:9"}],
            "quorum": {"endpoints": ["https://127.0.0.1:9"]},
            "agents": {"caSecretName": "some-component-ca"},
        },
    }))
    .unwrap();
    Api::<EtcdCertificates>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let _operator = start_operator(&client);
    let (_, message) = eventually("Degraded naming the Secret", 60, || async {
        true_condition(&client, "EtcdCertSignerControllerDegraded")
            .await
            .filter(|(_, m)| m.contains("some-component-ca"))
    })
    .await;
    assert!(
        message.contains("caretaker.dev/etcd-agents-ca-for=\"EtcdCertificates/etcd-system/etcd\""),
        "{message}"
    );
    assert!(message.contains("its CA was not used"), "{message}");

    let consent = json!({"metadata": {"annotations": {
        "caretaker.dev/etcd-agents-ca-for": "EtcdCertificates/etcd-system/etcd",
    }}});
    secrets
        .patch(
            "some-component-ca",
            &PatchParams::default(),
            &Patch::Merge(&consent),
        )
        .await
        .unwrap();
    let (_, message) = eventually("the Secret used once it consents", 90, || async {
        true_condition(&client, "EtcdCertSignerControllerDegraded")
            .await
            .filter(|(_, m)| m.contains("\"m0\"") && !m.contains("some-component-ca"))
    })
    .await;
    assert!(message.contains("cannot be asked"), "{message}");
}

/// Issue 34, item 4: a pass whose write fails (here the API server refuses to change
/// `etcd-client`, made immutable with broken contents) says Degraded True with reason
/// `Error`, as the OpenShift etcd operator says any failed sync; the next good pass says
/// False with `AsExpected`. Before, a failed pass left the condition as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pass_is_degraded_with_error_and_a_good_one_as_expected() {
    let (_server, client) = selecting_nodes(&[("cp-0", &[("InternalIP", "10.0.0.10")])]).await;
    let _operator = start_operator(&client);
    let objects = Api::<EtcdCertificates>::namespaced(client.clone(), NS);
    let degraded = || async {
        let status = objects.get("etcd").await.ok()?.status?;
        (status.conditions.into_iter())
            .find(|c| c.type_ == "EtcdCertSignerControllerDegraded")
            .map(|c| (c.status, c.reason, c.message))
    };
    eventually("Degraded False, AsExpected", 60, || async {
        degraded()
            .await
            .filter(|(status, reason, _)| status == "False" && reason == "AsExpected")
    })
    .await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NS);
    let broken = json!({"immutable": true, "data": {"tls.crt": "YnJva2Vu"}});
    secrets
        .patch(
            "etcd-client",
            &PatchParams::default(),
            &Patch::Merge(&broken),
        )
        .await
        .unwrap();
    let (_, _, message) = eventually("Degraded True, Error", 60, || async {
        degraded()
            .await
            .filter(|(status, reason, _)| status == "True" && reason == "Error")
    })
    .await;
    assert!(message.contains("etcd-client"), "{message}");
    secrets
        .delete("etcd-client", &Default::default())
        .await
        .unwrap();
    eventually("Degraded False, AsExpected again", 60, || async {
        degraded()
            .await
            .filter(|(status, reason, _)| status == "False" && reason == "AsExpected")
    })
    .await;
}

/// Issue 34, item 4: OpenShift's CA ConfigMaps beside the bundles, as its etcd operator keeps
/// them: `etcd-serving-ca` and `etcd-peer-client-ca` hold `etcd-ca-bundle`'s `ca-bundle.crt`,
/// the metrics proxy's two `etcd-metric-ca-bundle`'s; each with caretaker's mark; and
/// `etcd-endpoints`. Before, none existed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openshifts_ca_config_maps_mirror_the_bundles() {
    let (_server, client) = selecting_nodes(&[("cp-0", &[("InternalIP", "10.0.0.10")])]).await;
    let _operator = start_operator(&client);
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client.clone(), NS);
    let bundle = |name: &'static str| {
        let config_maps = config_maps.clone();
        async move {
            let map = config_maps.get_opt(name).await.ok()??;
            map.data?.get("ca-bundle.crt").cloned()
        }
    };
    for (name, source) in [
        ("etcd-serving-ca", "etcd-ca-bundle"),
        ("etcd-peer-client-ca", "etcd-ca-bundle"),
        ("etcd-metrics-proxy-serving-ca", "etcd-metric-ca-bundle"),
        ("etcd-metrics-proxy-client-ca", "etcd-metric-ca-bundle"),
    ] {
        let (copy, original) = eventually(name, 60, || async {
            let copy = bundle(name).await?;
            let original = bundle(source).await?;
            (copy == original).then_some((copy, original))
        })
        .await;
        assert!(copy.contains("BEGIN CERTIFICATE"), "{name}: {copy}");
        assert_eq!(copy, original);
        let map = config_maps.get(name).await.unwrap();
        let owner = map.metadata.annotations.unwrap_or_default();
        assert!(
            owner
                .get("caretaker.dev/owner")
                .is_some_and(|o| o.contains("EtcdCertificates")),
            "{name}: {owner:?}"
        );
    }
    // etcd-endpoints: each member's address, by member name (OpenShift keys it by member ID).
    let endpoints = eventually("etcd-endpoints", 60, || async {
        config_maps.get_opt("etcd-endpoints").await.ok()??.data
    })
    .await;
    assert_eq!(
        endpoints,
        [("cp-0".to_string(), "10.0.0.10".to_string())].into()
    );
}
