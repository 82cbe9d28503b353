//! EtcdCertificates whose revisions caretaker's agents install: a real three-member etcd 3.4
//! cluster with peer and client certificate authentication, each member with its own agent
//! (the real server, over mutual TLS) whose restart hook stops and starts the member. The test
//! provisions the members once and never installs or restarts anything after that.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use caretaker_agent::command::CommandTemplate;
use caretaker_agent::etcd::{EtcdConfig, EtcdInstaller, EtcdLayout};
use caretaker_api::v1alpha1::{EtcdCertificates, EtcdCertificatesStatus};
use caretaker_apiserver::TestServer;
use caretaker_operator::etcd::controller as etcd_certificates;
use caretaker_operator::{Context, Settings};
use common::authorities::{create_namespace, eventually, install_caretaker_crds};
use common::etcd::{Load, etcd_available};
use common::etcd_agents::{AGENTS_CA_SECRET, AgentCluster, start_agent};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "etcd-system";

struct Setup {
    _server: caretaker_apiserver::ApiServer,
    client: kube::Client,
    cluster: AgentCluster,
    operator: tokio::task::JoinHandle<()>,
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
        let cluster = AgentCluster::new(&client, NS).await;
        let object = cluster.certificates_object(NS);
        objects(&client)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
        let ctx = Context::new(client.clone(), Settings::default());
        let operator = tokio::spawn(etcd_certificates::run(ctx));
        Self {
            _server: server,
            client,
            cluster,
            operator,
        }
    }

    /// A Setup whose members run and are settled at revision 1; `None` (the test skips,
    /// saying so) without etcd.
    async fn bootstrapped(test: &str) -> Option<Self> {
        if !etcd_available(test) {
            return None;
        }
        let setup = Self::new().await;
        setup.cluster.bootstrap(60).await;
        setup.settle(120, 1).await;
        Some(setup)
    }

    async fn status(&self) -> EtcdCertificatesStatus {
        let object = objects(&self.client).get("etcd").await.unwrap();
        object.status.unwrap_or_default()
    }

    /// Waits, installing nothing, until the operator has nothing left to do: Ready, no signer
    /// rotating, the newest revision at least `at_least`, every member at it, for 4 s in a row.
    async fn settle(&self, seconds: u64, at_least: i64) -> EtcdCertificatesStatus {
        let deadline = Instant::now() + Duration::from_secs(seconds);
        let mut quiet = 0;
        loop {
            let status = self.status().await;
            if settled(&status) && status.latest_revision >= Some(at_least) {
                quiet += 1;
                if quiet >= 20 {
                    return status;
                }
            } else {
                quiet = 0;
            }
            assert!(
                Instant::now() < deadline,
                "never settled in {seconds}s; status {status:#?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn events(&self, reason: &str) -> Vec<String> {
        events(&self.client, reason).await
    }
}

fn objects(client: &kube::Client) -> Api<EtcdCertificates> {
    Api::namespaced(client.clone(), NS)
}

async fn events(client: &kube::Client, reason: &str) -> Vec<String> {
    let list = Api::<Event>::namespaced(client.clone(), NS)
        .list(&ListParams::default())
        .await
        .unwrap();
    (list.items.into_iter())
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter_map(|e| e.message)
        .collect()
}

fn condition<'a>(
    status: &'a EtcdCertificatesStatus,
    type_: &str,
) -> Option<&'a caretaker_api::v1alpha1::Condition> {
    status.conditions.iter().find(|c| c.type_ == type_)
}

fn settled(status: &EtcdCertificatesStatus) -> bool {
    let ready = condition(status, "Ready").is_some_and(|c| c.status == "True");
    let rotating = status
        .signer
        .as_ref()
        .is_some_and(|s| s.next_serial_number.is_some() || !s.previous_serial_numbers.is_empty());
    let latest = status.latest_revision.unwrap_or(-1);
    ready
        && !rotating
        && !status.members.is_empty()
        && status.members.iter().all(|m| m.current_revision == latest)
}

/// Re-issues one member's serving certificate the documented way (its not-after annotation
/// removed): one revision.
async fn force_certificate_rotation(client: &kube::Client, secret: &str) {
    let patch =
        json!({"metadata": {"annotations": {"auth.openshift.io/certificate-not-after": null}}});
    Api::<Secret>::namespaced(client.clone(), NS)
        .patch(secret, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Forces a rotation of `etcd-signer`: three revisions (trust, certificates, untrust).
async fn force_signer_rotation(client: &kube::Client) {
    force_certificate_rotation(client, "etcd-signer").await;
}

/// Per member, how long each spell of not answering healthy lasted, in seconds.
type Outages = Vec<(String, Vec<f64>)>;

/// Asks every member for its health every 100 ms until told to stop; returns, per member, how
/// long each spell of not answering healthy lasted (its restarts, as a client sees them).
fn watch_outages(
    cluster: &AgentCluster,
    client: &common::etcd::EtcdClient,
) -> (
    Arc<std::sync::atomic::AtomicBool>,
    tokio::task::JoinHandle<Outages>,
) {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let members: Vec<(String, String)> = (cluster.members.iter())
        .map(|m| (m.name.clone(), m.client_url()))
        .collect();
    let (client, stopping) = (client.clone(), stop.clone());
    let task = tokio::spawn(async move {
        let mut spells: Outages = members
            .iter()
            .map(|(n, _)| (n.clone(), Vec::new()))
            .collect();
        let mut down_since: Vec<Option<Instant>> = vec![None; members.len()];
        while !stopping.load(Ordering::Relaxed) {
            for (i, (_, url)) in members.iter().enumerate() {
                let healthy = client.healthy(url).await;
                match (healthy, down_since[i]) {
                    (false, None) => down_since[i] = Some(Instant::now()),
                    (true, Some(since)) => {
                        spells[i]
                            .1
                            .push((since.elapsed().as_secs_f64() * 10.0).round() / 10.0);
                        down_since[i] = None;
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        spells
    });
    (stop, task)
}

/// Issue 34: bootstrap, a signer rotation and a forced certificate rotation while clients
/// write without pause (every endpoint, transient errors retried, each write read back): the
/// agents install every revision and restart the members one at a time; no write is lost, no
/// client and no member sees a certificate error, and every member ends healthy at the newest
/// revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_roll_every_revision_out_under_load_losing_nothing() {
    if !etcd_available("the_agents_roll_every_revision_out_under_load_losing_nothing") {
        return;
    }
    let setup = Setup::new().await;
    setup.cluster.bootstrap(60).await;
    let first = setup.settle(120, 1).await;
    assert_eq!(first.latest_revision, Some(1), "{first:#?}");
    // Provisioned by hand, each member got revision 1 installed once by its agent.
    let updated = setup.events("NodeCurrentRevisionChanged").await;
    assert_eq!(updated.len(), 3, "{updated:#?}");
    let pids = setup.cluster.pids();

    let client = setup.cluster.client().await;
    let apis = (
        setup.cluster.secrets().clone(),
        setup.cluster.config_maps().clone(),
    );
    let load = Load::start_with(apis, &client, 4);
    let outages = watch_outages(&setup.cluster, &client);
    let started = Instant::now();
    force_signer_rotation(&setup.client).await;
    let rotated = setup.settle(300, 4).await;
    eprintln!(
        "signer rotation: revision 1 -> {:?} in {:.1}s",
        rotated.latest_revision,
        started.elapsed().as_secs_f64()
    );
    let after_signer = client.retries.load(Ordering::Relaxed);
    let started = Instant::now();
    force_certificate_rotation(&setup.client, "etcd-serving-m1").await;
    let certificate = setup.settle(120, 5).await;
    eprintln!(
        "certificate rotation: revision {:?} -> {:?} in {:.1}s",
        rotated.latest_revision,
        certificate.latest_revision,
        started.elapsed().as_secs_f64()
    );
    let load = load.stop().await;
    outages.0.store(true, Ordering::Relaxed);
    let outages = outages.1.await.unwrap();
    eprintln!("each member's restarts, seconds unhealthy: {outages:?}");

    let (done, failed) = (load.done(), load.failed());
    let retries = client.retries.load(Ordering::Relaxed);
    eprintln!(
        "operations: {done} succeeded, {} failed; transient retries: {after_signer} over the \
         signer rotation, {} over the certificate rotation",
        failed.len(),
        retries - after_signer
    );
    assert!(failed.is_empty(), "failed operations: {failed:?}");
    assert!(done > 100, "the load ran: {done}");
    let certificate_errors = client.certificate_errors.lock().unwrap().clone();
    assert!(
        certificate_errors.is_empty(),
        "certificate errors: {certificate_errors:?}"
    );
    let (in_logs, probes) = setup.cluster.tls_errors_in_logs();
    eprintln!("members' logs: {probes} refusals of the operator's trust probe");
    assert!(
        in_logs.is_empty(),
        "TLS errors in the members' logs: {in_logs:?}"
    );
    // Every acknowledged write is there with its last value.
    let lost = load.lost(&setup.cluster.client().await).await;
    assert!(lost.is_empty(), "lost writes: {lost:?}");
    // The signer rotation is three revisions, the certificate one: 1 -> 4 -> 5.
    assert_eq!(rotated.latest_revision, Some(4), "{rotated:#?}");
    assert_eq!(certificate.latest_revision, Some(5), "{certificate:#?}");
    for i in 0..3 {
        setup.cluster.wait_healthy(i, 10).await;
    }
    // Restarted by the agents' hooks: every member has a new process.
    let now = setup.cluster.pids();
    for (i, (before, after)) in pids.iter().zip(&now).enumerate() {
        assert_ne!(before, after, "member m{i} was never restarted");
    }
    let updated = setup.events("NodeCurrentRevisionChanged").await;
    for m in ["m0", "m1", "m2"] {
        let phrase =
            format!("Updated node \"{m}\" from revision 4 to 5 because static pod is ready");
        assert!(updated.contains(&phrase), "{phrase}: {updated:#?}");
    }
    assert!(setup.events("InstallerPodFailed").await.is_empty());
}

/// Issue 34: member m1's restart hook fails. The rollout installs on m0, stops at m1 with
/// Degraded naming it (the previous files back on m1), leaves m2 untouched; fixing the hook
/// resumes it by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_hook_stops_the_rollout_at_its_member_and_fixing_it_resumes() {
    let Some(setup) = Setup::bootstrapped("a_failing_hook_stops_the_rollout_at_its_member").await
    else {
        return;
    };
    let files_of_m1 = std::fs::read(setup.cluster.members[1].pki().join("server.crt")).unwrap();
    let pids = setup.cluster.pids();
    setup.cluster.break_hook(1);
    force_certificate_rotation(&setup.client, "etcd-serving-m2").await;

    let client = setup.client.clone();
    let message = eventually("Degraded naming m1", 60, || {
        let client = client.clone();
        async move {
            let object = objects(&client).get("etcd").await.ok()?;
            let status = object.status?;
            let degraded = condition(&status, "EtcdCertSignerControllerDegraded")?;
            (degraded.status == "True" && degraded.message.contains("\"m1\""))
                .then(|| (degraded.reason.clone(), degraded.message.clone()))
        }
    })
    .await;
    assert_eq!(message.0, "InstallerPodFailed", "{message:?}");
    assert!(message.1.contains("restart refused"), "{message:?}");
    let failed = setup.events("InstallerPodFailed").await;
    assert!(
        failed
            .iter()
            .any(|f| f.starts_with("Failed to install revision 2 count 1 on node \"m1\"")),
        "{failed:#?}"
    );
    // A few more passes: m2 is never restarted, m1 keeps its files and process.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let now = setup.cluster.pids();
    assert_ne!(now[0], pids[0], "m0 was installed first");
    assert_eq!(now[1], pids[1], "m1's hook failed: not restarted");
    assert_eq!(now[2], pids[2], "m2 is untouched while m1 fails");
    assert_eq!(
        std::fs::read(setup.cluster.members[1].pki().join("server.crt")).unwrap(),
        files_of_m1,
        "m1's previous files are back"
    );
    let status = setup.status().await;
    let m1 = status.members.iter().find(|m| m.name == "m1").unwrap();
    assert_eq!(
        (
            m1.current_revision,
            m1.target_revision,
            m1.last_failed_revision
        ),
        (1, 2, 2)
    );
    let m2 = status.members.iter().find(|m| m.name == "m2").unwrap();
    assert_eq!(m2.current_revision, 1);

    setup.cluster.fix_hook(1);
    let status = setup.settle(120, 2).await;
    assert_eq!(status.latest_revision, Some(2));
    let degraded = condition(&status, "EtcdCertSignerControllerDegraded").unwrap();
    assert_eq!(degraded.status, "False", "{degraded:?}");
    let now = setup.cluster.pids();
    assert_ne!(now[1], pids[1]);
    assert_ne!(now[2], pids[2]);
}

/// The attack (issue 34): m0's agent endpoint leads to m1's node (127.0.0.2), whose agent
/// presents its own, valid certificate (naming m1 and 127.0.0.2) and would take m0's files.
/// The operator refuses it in the TLS handshake and sends nothing: no file reaches it, and
/// Degraded names m0. A client that verified the agent by the URL's host, or took any
/// certificate from the agents' CA, would have sent m1's node m0's keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hostile_agent_at_a_members_endpoint_gets_nothing() {
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    create_namespace(&client, NS).await;
    // The agents' CA, in a Secret as the cluster has it.
    let agents = AgentCluster::new(&client, NS).await;
    let dir = tempfile::tempdir().unwrap();
    let hostile = EtcdInstaller::new(
        EtcdConfig {
            // It would take anything named m0, were it sent.
            member: "m0".into(),
            dir: dir.path().join("pki"),
            names: EtcdLayout::Kubeadm.file_names(),
            client_url: "https://127.0.0.1:9".into(),
            restart: CommandTemplate::parse("true").unwrap(),
            restart_timeout: Duration::from_secs(5),
            health_timeout: Duration::from_secs(1),
        },
        dir.path().join("state"),
    );
    // m1's node and its certificate, at the endpoint the spec gives for m0.
    let m1_address = Some([127, 0, 0, 2].into());
    let (url, _task) =
        start_agent(&agents.agents_ca, ("m1", m1_address), dir.path(), hostile).await;
    let object: EtcdCertificates = serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
        "metadata": {"name": "etcd", "namespace": NS},
        "spec": {
            "members": [
                {"name": "m0", "addresses": ["127.0.0.1"], "agentEndpoint": url},
                {"name": "m1", "addresses": ["127.0.0.2"]},
                {"name": "m2", "addresses": ["127.0.0.3"]},
            ],
            "quorum": {"endpoints": ["https://127.0.0.1:9"]},
            "agents": {"caSecretName": AGENTS_CA_SECRET},
        },
    }))
    .unwrap();
    objects(&client)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let ctx = Context::new(client.clone(), Settings::default());
    let operator = tokio::spawn(etcd_certificates::run(ctx));
    let c = client.clone();
    let message = eventually("Degraded naming m0", 60, || {
        let client = c.clone();
        async move {
            let status = objects(&client).get("etcd").await.ok()?.status?;
            let degraded = condition(&status, "EtcdCertSignerControllerDegraded")?;
            (degraded.status == "True" && degraded.message.contains("\"m0\""))
                .then(|| degraded.message.clone())
        }
    })
    .await;
    assert!(message.contains("names none of"), "{message}");
    operator.abort();
    let sent: Vec<_> = std::fs::read_dir(dir.path().join("pki"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(sent.is_empty(), "files reached the hostile agent: {sent:?}");
    assert!(!dir.path().join("state/etcd/current.json").exists());
    let _ = Arc::new(());
}

/// The same attack on a running cluster, where the gate is open and an install would go
/// ahead: m0's endpoint leads to m1's node. Nothing reaches it, the rollout stops at m0 with
/// Degraded naming it, and no member is restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_quorum_a_hostile_agent_at_a_members_endpoint_still_gets_nothing() {
    if !etcd_available("with_quorum_a_hostile_agent_at_a_members_endpoint_still_gets_nothing") {
        return;
    }
    let server = TestServer::start().await;
    let client = server.client();
    install_caretaker_crds(&client).await;
    create_namespace(&client, NS).await;
    let cluster = AgentCluster::new(&client, NS).await;
    let dir = tempfile::tempdir().unwrap();
    let hostile = EtcdInstaller::new(
        EtcdConfig {
            member: "m0".into(),
            dir: dir.path().join("pki"),
            names: EtcdLayout::Kubeadm.file_names(),
            client_url: cluster.members[0].client_url(),
            restart: CommandTemplate::parse("true").unwrap(),
            restart_timeout: Duration::from_secs(5),
            health_timeout: Duration::from_secs(1),
        },
        dir.path().join("state"),
    );
    let m1_node = Some([127, 0, 0, 2].into());
    let (url, _task) = start_agent(&cluster.agents_ca, ("m1", m1_node), dir.path(), hostile).await;
    let mut object = cluster.certificates_object(NS);
    object.spec.members[0].agent_endpoint = Some(url);
    objects(&client)
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let ctx = Context::new(client.clone(), Settings::default());
    let operator = tokio::spawn(etcd_certificates::run(ctx));
    cluster.bootstrap(60).await;
    let pids = cluster.pids();
    let c = client.clone();
    let message = eventually("Degraded naming m0", 60, || {
        let client = c.clone();
        async move {
            let status = objects(&client).get("etcd").await.ok()?.status?;
            let degraded = condition(&status, "EtcdCertSignerControllerDegraded")?;
            (degraded.status == "True" && degraded.message.contains("\"m0\""))
                .then(|| degraded.message.clone())
        }
    })
    .await;
    assert!(message.contains("names none of"), "{message}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    operator.abort();
    let sent: Vec<_> = std::fs::read_dir(dir.path().join("pki"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(sent.is_empty(), "files reached the hostile agent: {sent:?}");
    assert_eq!(cluster.pids(), pids, "no member was restarted");
}

/// Issue 34: the quorum gate closes partway through a rollout. m0's hook restarts m0 onto the
/// new revision and, before its agent reports, the test stops m2 (behind its agent's back):
/// the gate is closed when the operator comes to m1. While it is closed m1 is not restarted
/// (same pid, still at the old revision), and the status says why (Degraded
/// `InsufficientQuorum`, Ready naming m1 as waiting for quorum). When m2 is back the rollout
/// resumes by itself and ends with every member at the new revision, with no write lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quorum_gate_holds_a_rollout_partway_and_it_resumes_when_the_member_is_back() {
    let Some(setup) = Setup::bootstrapped("the_quorum_gate_holds_a_rollout_partway").await else {
        return;
    };
    let client = setup.cluster.client().await;
    let apis = (
        setup.cluster.secrets().clone(),
        setup.cluster.config_maps().clone(),
    );
    let load = Load::start_with(apis, &client, 2);
    setup.cluster.hold_hook(0);
    let pids = setup.cluster.pids();
    force_certificate_rotation(&setup.client, "etcd-serving-m1").await;

    // m0 is restarted onto revision 2 first (name order); its hook then waits.
    let cluster = &setup.cluster;
    eventually("m0's hook restarted it", 60, || async move {
        cluster.hook_restarted(0).then_some(())
    })
    .await;
    setup.cluster.wait_healthy(0, 30).await;
    setup.cluster.stop_member(2);
    setup.cluster.release_hook(0);

    let c = setup.client.clone();
    let (degraded, ready) = eventually("the gate holding m1", 60, || {
        let client = c.clone();
        async move {
            let status = objects(&client).get("etcd").await.ok()?.status?;
            let m0 = status.members.iter().find(|m| m.name == "m0")?;
            let degraded = condition(&status, "EtcdCertSignerControllerDegraded")?;
            let ready = condition(&status, "Ready")?;
            (m0.current_revision == 2 && degraded.reason == "InsufficientQuorum")
                .then(|| (degraded.clone(), ready.clone()))
        }
    })
    .await;
    assert_eq!(degraded.status, "True", "{degraded:?}");
    assert!(
        degraded.message.contains("insufficient quorum"),
        "{degraded:?}"
    );
    assert_eq!(ready.status, "False", "{ready:?}");
    assert!(
        ready.message.contains("\"m1\" waits for quorum"),
        "{ready:?}"
    );
    // Several passes with the gate closed (they come every 2 s, doubling): m1 stays as it was.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let now = setup.cluster.pids();
    assert_ne!(now[0], pids[0], "m0 was installed");
    assert_eq!(
        now[1], pids[1],
        "m1 was restarted while the gate was closed"
    );
    let status = setup.status().await;
    let m1 = status.members.iter().find(|m| m.name == "m1").unwrap();
    assert_eq!(m1.current_revision, 1, "{status:#?}");
    let degraded = condition(&status, "EtcdCertSignerControllerDegraded").unwrap();
    assert_eq!(degraded.reason, "InsufficientQuorum", "{status:#?}");

    // m2 back: the rollout resumes by itself and ends at revision 2 everywhere.
    setup.cluster.start_member(2);
    setup.cluster.wait_healthy(2, 30).await;
    let status = setup.settle(120, 2).await;
    assert_eq!(status.latest_revision, Some(2), "{status:#?}");
    for m in &status.members {
        assert_eq!(m.current_revision, 2, "{status:#?}");
    }
    let degraded = condition(&status, "EtcdCertSignerControllerDegraded").unwrap();
    assert_eq!(degraded.status, "False", "{degraded:?}");
    let after = setup.cluster.pids();
    assert_ne!(after[1], pids[1], "m1 was installed once the gate opened");
    let load = load.stop().await;
    let failed = load.failed();
    assert!(failed.is_empty(), "failed operations: {failed:?}");
    assert!(load.done() > 10, "the load ran: {}", load.done());
    let lost = load.lost(&setup.cluster.client().await).await;
    assert!(lost.is_empty(), "lost writes: {lost:?}");
}
