//! The agent over its real mutual-TLS API, with real kubeadm-layout nodes in temp directories.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use caretaker_agent::command::CommandTemplate;
use caretaker_agent::layout::NodeLayout;
use caretaker_agent::refresh::Refresher;
use caretaker_agent::server::{AgentService, ServeLimits, serve_with};
use caretaker_agent::upgrade::Upgrader;
use caretaker_agent::{inventory, kubeconfig, tls};
use caretaker_agent_api::client::{AgentClient, AgentError};
use caretaker_agent_api::kubeadm::{NodeRole, SigningCa};
use caretaker_agent_api::refresh::{ApplyRequest, PlanRequest, PlanStatus, RefreshPlan};
use caretaker_agent_api::tls::{DEFAULT_ALLOWED_CLIENT, client_config};
use caretaker_agent_api::upgrade::{Operation, OperationState, ReleaseOption, UpgradeRequest};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, SigningPolicy, Ttl, Usage};
use caretaker_testkit::provision::{ClusterCas, NodeSpec, provision_node};

struct Node {
    dir: tempfile::TempDir,
    layout: NodeLayout,
    url: String,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl Node {
    fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }
}

fn leaf_pair(ca: &CertificateAuthority, spec: LeafSpec) -> (String, String) {
    let issued = ca.issue(&spec).unwrap();
    (issued.certificate_pem.clone(), issued.key.unwrap().to_pem())
}

#[derive(Default)]
struct Hooks {
    restart: Option<String>,
    upgrade: Option<String>,
    /// For both hooks; the agent's defaults when `None`.
    timeout: Option<Duration>,
}

impl Hooks {
    fn restart(command: impl Into<String>) -> Self {
        Hooks {
            restart: Some(command.into()),
            ..Hooks::default()
        }
    }

    fn upgrade(command: impl Into<String>) -> Self {
        Hooks {
            upgrade: Some(command.into()),
            ..Hooks::default()
        }
    }
}

async fn start_node(cas: &ClusterCas, role: NodeRole, hooks: Hooks) -> Node {
    start_node_with(cas, role, hooks, ServeLimits::default()).await
}

async fn start_node_with(
    cas: &ClusterCas,
    role: NodeRole,
    hooks: Hooks,
    limits: ServeLimits,
) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let layout = NodeLayout::new(dir.path().join("pki"), dir.path().join("kubeconfigs"));
    provision_node(
        &layout,
        cas,
        &NodeSpec {
            node_name: "node-1".into(),
            addresses: vec!["127.0.0.1".parse().unwrap()],
            role,
            control_plane_host: "cp.example".into(),
            server_url: "https://cp.example:6443".into(),
            validity: "30d".parse().unwrap(),
        },
    )
    .unwrap();
    let state = dir.path().join("state");
    let mut refresher = Refresher::new(layout.clone(), &state)
        .with_restart_command(hooks.restart.map(|c| CommandTemplate::parse(&c).unwrap()));
    let mut upgrader = Upgrader::new(
        &state,
        hooks.upgrade.map(|c| CommandTemplate::parse(&c).unwrap()),
    );
    if let Some(timeout) = hooks.timeout {
        refresher = refresher.with_restart_timeout(timeout);
        upgrader = upgrader.with_timeout(timeout);
    }
    let (cert, key) = leaf_pair(
        &cas.cluster,
        LeafSpec::new("caretaker-agent", Usage::Server)
            .with_dns_names(["localhost"])
            .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
    );
    let config = tls::server_config(
        &cert,
        &key,
        &cas.cluster.certificate_pem(),
        DEFAULT_ALLOWED_CLIENT,
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let router = AgentService::new(refresher, upgrader).router();
    let server = tokio::spawn(async move {
        let _ = serve_with(listener, config, router, limits).await;
    });
    Node {
        dir,
        layout,
        url,
        server,
    }
}

fn client_for(
    trust: &CertificateAuthority,
    signer: &CertificateAuthority,
    cn: &str,
) -> AgentClient {
    client_with_timeout(trust, signer, cn, Duration::from_secs(20))
}

fn client_with_timeout(
    trust: &CertificateAuthority,
    signer: &CertificateAuthority,
    cn: &str,
    timeout: Duration,
) -> AgentClient {
    let (cert, key) = leaf_pair(signer, LeafSpec::new(cn, Usage::Client));
    let config = client_config(&trust.certificate_pem(), &cert, &key).unwrap();
    AgentClient::new(config, timeout)
}

fn operator(cas: &ClusterCas) -> AgentClient {
    client_for(&cas.cluster, &cas.cluster, "caretaker-operator")
}

/// Signs every CSR of a plan with the right CA, allowing exactly what the plan asks.
fn sign_all(cas: &ClusterCas, plan: &RefreshPlan, ttl: &str) -> BTreeMap<String, String> {
    let ttl: Ttl = ttl.parse().unwrap();
    plan.requests
        .iter()
        .map(|r| {
            let policy = SigningPolicy {
                common_names: vec![r.common_name.clone()],
                organizations: r.organizations.clone(),
                dns_names: r.dns_names.clone(),
                ip_addresses: r.ip_addresses.clone(),
                usage: Some(r.usage),
            };
            let signed = cas
                .get(r.ca)
                .sign_request(&r.csr_pem, &policy, &ttl)
                .unwrap();
            (r.name.clone(), signed.certificate_pem)
        })
        .collect()
}

/// A certificate for the key and names of `csr_pem`, signed by `ca` like [`sign_all`] would
/// but with `change` made to it: what a signer that does not follow the CSR would return.
fn sign_altered(
    ca: &CertificateAuthority,
    csr_pem: &str,
    change: fn(&mut rcgen::CertificateParams),
) -> String {
    let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).unwrap();
    csr.params.not_before = time::OffsetDateTime::now_utc() - time::Duration::hours(1);
    csr.params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(30);
    change(&mut csr.params);
    let key = rcgen::KeyPair::from_pem(&ca.private_key_pem()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_pem(&ca.certificate_pem(), key).unwrap();
    csr.params
        .signed_by(&csr.public_key, &issuer)
        .unwrap()
        .pem()
}

/// Every file under `dir` with its contents, for "nothing changed" checks.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                files.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    files
}

/// The node's PKI and kubeconfig files, by path relative to its directory (`pki/...`,
/// `kubeconfigs/...`, the layout of a backup).
fn node_files(node: &Node) -> BTreeMap<PathBuf, Vec<u8>> {
    [&node.layout.pki_dir, &node.layout.kubeconfig_dir]
        .into_iter()
        .flat_map(|dir| snapshot(dir))
        .map(|(path, contents)| {
            let relative = path.strip_prefix(node.dir.path()).unwrap().to_path_buf();
            (relative, contents)
        })
        .collect()
}

/// Checks that `backup_dir` holds the files of `before` (from [`node_files`]) named in
/// `expected`, byte for byte, with keys still 0600, and nothing that was not there before.
fn assert_backup_holds(backup_dir: &Path, before: &BTreeMap<PathBuf, Vec<u8>>, expected: &[&str]) {
    let backup: BTreeMap<PathBuf, Vec<u8>> = snapshot(backup_dir)
        .into_iter()
        .map(|(path, contents)| {
            (
                path.strip_prefix(backup_dir).unwrap().to_path_buf(),
                contents,
            )
        })
        .collect();
    for name in expected {
        assert!(
            backup.contains_key(Path::new(name)),
            "{name} is not in the backup"
        );
    }
    for (path, contents) in &backup {
        assert!(
            before.get(path) == Some(contents),
            "{} in the backup is not the file as it was",
            path.display()
        );
        if path.extension().is_some_and(|e| e == "key") {
            assert_eq!(mode_of(&backup_dir.join(path)), 0o600, "{}", path.display());
        }
    }
}

/// The permission bits of `path`.
fn mode_of(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn openssl_verifies(ca: &CertificateAuthority, cert_pem: &str, dir: &Path) -> bool {
    std::fs::write(dir.join("verify-ca.crt"), ca.certificate_pem()).unwrap();
    std::fs::write(dir.join("verify-leaf.crt"), cert_pem).unwrap();
    Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(dir.join("verify-ca.crt"))
        .arg(dir.join("verify-leaf.crt"))
        .output()
        .unwrap()
        .status
        .success()
}

#[tokio::test]
async fn inventory_lists_control_plane_and_worker_certificates() {
    let cas = ClusterCas::create().unwrap();
    let cp = start_node(&cas, NodeRole::ControlPlane, Hooks::default()).await;
    let worker = start_node(&cas, NodeRole::Worker, Hooks::default()).await;
    let client = operator(&cas);

    let health = client.health(&cp.url).await.unwrap();
    assert_eq!(health.status, "ok");
    assert_eq!(health.release, None);

    let inventory = client.certificates(&cp.url).await.unwrap();
    let names: Vec<_> = inventory
        .certificates
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(names.len(), 13, "{names:?}");
    let by_name = |n: &str| inventory.entry(n).unwrap();
    assert_eq!(by_name("apiserver-etcd-client").ca, SigningCa::Etcd);
    assert_eq!(by_name("front-proxy-client").ca, SigningCa::FrontProxy);
    assert_eq!(by_name("etcd/peer").usage, Usage::Both);
    assert_eq!(
        by_name("admin.conf").certificate.common_name.as_deref(),
        Some("kubernetes-admin")
    );
    assert!(
        by_name("apiserver")
            .certificate
            .dns_names
            .contains(&"cp.example".to_string())
    );
    assert!(inventory.problems.is_empty(), "{:?}", inventory.problems);
    assert_eq!(inventory.authorities.len(), 3);

    let worker_inventory = client.certificates(&worker.url).await.unwrap();
    let names: Vec<_> = worker_inventory
        .certificates
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(names, ["kubelet.conf", "kubelet"]);
}

#[tokio::test]
async fn plan_then_apply_refreshes_every_certificate_in_place() {
    let cas = ClusterCas::create().unwrap();
    let node = start_node(&cas, NodeRole::ControlPlane, Hooks::restart("true")).await;
    let client = operator(&cas);
    // Modes an admin chose, which a refresh must keep.
    let chosen_modes = [("apiserver.crt", 0o640), ("etcd/peer.crt", 0o600)];
    for (name, mode) in chosen_modes {
        let path = node.layout.pki_dir.join(name);
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let before = inventory::discover(&node.layout);
    let files_before = node_files(&node);

    let plan = client
        .plan(&node.url, &PlanRequest::default())
        .await
        .unwrap();
    assert_eq!(plan.requests.len(), 13);
    // The new keys are staged on the node, 0600 in a 0700 directory, and never sent.
    let staged = node.state_dir().join("staged").join(&plan.plan_id);
    assert_eq!(mode_of(&staged), 0o700, "the staging directory");
    for entry in std::fs::read_dir(&staged).unwrap().flatten() {
        assert_eq!(mode_of(&entry.path()), 0o600, "{:?}", entry.path());
    }
    let plan_json = serde_json::to_string(&plan).unwrap();
    assert!(!plan_json.contains("PRIVATE KEY"));

    let certificates = sign_all(&cas, &plan, "1y");
    let outcome = client
        .apply(
            &node.url,
            &ApplyRequest {
                plan_id: plan.plan_id.clone(),
                certificates,
            },
        )
        .await
        .unwrap();
    assert_eq!(outcome.applied.len(), 13);
    assert!(outcome.restart.as_ref().unwrap().success);
    // The backup holds the old keys and kubeconfigs, not the new ones.
    assert_backup_holds(
        &outcome.backup_dir,
        &files_before,
        &[
            "pki/apiserver.key",
            "pki/etcd/peer.key",
            "kubeconfigs/admin.conf",
        ],
    );
    assert!(!staged.exists(), "the staged plan is consumed");

    let after = inventory::discover(&node.layout);
    for (old, new) in before.certificates.iter().zip(&after.certificates) {
        assert_eq!(old.name, new.name);
        assert_eq!(
            old.certificate.subject, new.certificate.subject,
            "{}",
            old.name
        );
        assert_eq!(
            old.certificate.dns_names, new.certificate.dns_names,
            "{}",
            old.name
        );
        assert_eq!(
            old.certificate.ip_addresses, new.certificate.ip_addresses,
            "{}",
            old.name
        );
        assert_ne!(
            old.certificate.serial, new.certificate.serial,
            "{}",
            old.name
        );
        assert!(new.certificate.not_after > old.certificate.not_after + time::Duration::days(300));
    }
    for (name, mode) in chosen_modes {
        assert_eq!(mode_of(&node.layout.pki_dir.join(name)), mode, "{name}");
    }
    assert_eq!(Some(outcome.earliest_not_after), after.earliest_expiry());

    // New files chain to the right CA and the keys on disk belong to them.
    let apiserver = std::fs::read_to_string(node.layout.pki_dir.join("etcd/peer.crt")).unwrap();
    assert!(openssl_verifies(&cas.etcd, &apiserver, node.dir.path()));
    assert!(!openssl_verifies(&cas.cluster, &apiserver, node.dir.path()));
    let key = caretaker_pki::PrivateKey::from_pem(
        &std::fs::read_to_string(node.layout.pki_dir.join("etcd/peer.key")).unwrap(),
    )
    .unwrap();
    let der = caretaker_pki::bundle::parse(&apiserver)
        .unwrap()
        .swap_remove(0);
    assert!(caretaker_pki::key_matches_certificate(&key, der.der()).unwrap());
    assert_eq!(mode_of(&node.layout.pki_dir.join("etcd/peer.key")), 0o600);

    // Kubeconfigs carry the new client certificate and its key.
    let admin = std::fs::read_to_string(node.layout.kubeconfig_dir.join("admin.conf")).unwrap();
    let admin_cert = kubeconfig::client_certificate_pem(&admin).unwrap();
    let admin_key =
        caretaker_pki::PrivateKey::from_pem(&kubeconfig::client_key_pem(&admin).unwrap()).unwrap();
    let admin_der = caretaker_pki::bundle::parse(&admin_cert)
        .unwrap()
        .swap_remove(0);
    assert!(caretaker_pki::key_matches_certificate(&admin_key, admin_der.der()).unwrap());
    assert!(admin.contains("server: https://cp.example:6443"));
    assert!(openssl_verifies(&cas.cluster, &admin_cert, node.dir.path()));

    // The plan is known as applied, with its outcome.
    match client.plan_status(&node.url, &plan.plan_id).await.unwrap() {
        PlanStatus::Applied { outcome: recorded } => {
            assert_eq!(recorded, outcome)
        }
        other => panic!("expected applied, got {other:?}"),
    }

    // A plan can be applied once.
    let again = client
        .apply(
            &node.url,
            &ApplyRequest {
                plan_id: plan.plan_id.clone(),
                certificates: sign_all(&cas, &plan, "1y"),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(again, AgentError::Status { status: 404, .. }),
        "{again}"
    );
}

#[tokio::test]
async fn a_bad_certificate_in_apply_changes_nothing_on_disk() {
    let cas = ClusterCas::create().unwrap();
    let node = start_node(&cas, NodeRole::Worker, Hooks::default()).await;
    let client = operator(&cas);
    let before = node_files(&node);

    let plan = client
        .plan(&node.url, &PlanRequest::default())
        .await
        .unwrap();
    let good = sign_all(&cas, &plan, "1y");

    // 1. A certificate for some other key (same subject, signed by the right CA).
    let mut foreign = good.clone();
    let (other, _) = leaf_pair(
        &cas.cluster,
        LeafSpec::new("system:node:node-1", Usage::Client).with_organizations(["system:nodes"]),
    );
    foreign.insert("kubelet.conf".into(), other);
    // 2. The right key but signed by another CA.
    let impostor = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let wrong_ca = ClusterCas {
        cluster: impostor,
        etcd: CertificateAuthority::create(&CaSpec::new("e")).unwrap(),
        front_proxy: CertificateAuthority::create(&CaSpec::new("f")).unwrap(),
    };
    let mut wrong_signer = good.clone();
    wrong_signer.insert(
        "kubelet".into(),
        sign_all(&wrong_ca, &plan, "1y")["kubelet"].clone(),
    );
    // 3. A private key where a certificate belongs.
    let mut key_instead = good.clone();
    key_instead.insert("kubelet".into(), cas.cluster.private_key_pem());
    // 4-8. The staged key, signed by the right CA, but not quite what the CSR asked for.
    let kubelet = plan.requests.iter().find(|r| r.name == "kubelet").unwrap();
    let altered = |change: fn(&mut rcgen::CertificateParams)| {
        let mut certificates = good.clone();
        certificates.insert(
            "kubelet".into(),
            sign_altered(&cas.cluster, &kubelet.csr_pem, change),
        );
        certificates
    };

    for (what, certificates, why) in [
        ("foreign key", foreign, "not for the key staged"),
        ("wrong CA", wrong_signer, "not signed by the node's ca"),
        ("a key", key_instead, "kubelet"),
        (
            "another subject",
            altered(|p| {
                p.distinguished_name
                    .push(rcgen::DnType::CommonName, "intruder")
            }),
            "subject or SANs",
        ),
        (
            "another SAN",
            altered(|p| {
                p.subject_alt_names
                    .push(rcgen::SanType::DnsName("evil.example".try_into().unwrap()))
            }),
            "subject or SANs",
        ),
        (
            "another usage",
            altered(|p| p.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth]),
            "extended key usages",
        ),
        (
            "a CA",
            altered(|p| p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained)),
            "a CA certificate",
        ),
        (
            "not yet valid",
            altered(|p| p.not_before = time::OffsetDateTime::now_utc() + time::Duration::days(1)),
            "not valid now",
        ),
    ] {
        let err = client
            .apply(
                &node.url,
                &ApplyRequest {
                    plan_id: plan.plan_id.clone(),
                    certificates,
                },
            )
            .await
            .expect_err(what);
        match &err {
            AgentError::Status {
                status: 422,
                message,
                ..
            } => {
                assert!(message.contains("nothing was changed"), "{what}: {message}");
                assert!(message.contains(why), "{what}: {message}");
                assert!(
                    !message.contains("BEGIN"),
                    "{what}: no PEM echoed: {message}"
                );
            }
            other => panic!("{what}: expected 422, got {other}"),
        }
        assert_eq!(before, node_files(&node), "{what}: files changed");
    }

    // The plan is still there, staged: the right certificates apply afterwards.
    assert!(matches!(
        client.plan_status(&node.url, &plan.plan_id).await.unwrap(),
        PlanStatus::Staged { .. }
    ));
    client
        .apply(
            &node.url,
            &ApplyRequest {
                plan_id: plan.plan_id.clone(),
                certificates: good,
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn requests_never_become_paths() {
    let cas = ClusterCas::create().unwrap();
    let node = start_node(&cas, NodeRole::Worker, Hooks::default()).await;
    let client = operator(&cas);
    let err = client
        .plan(
            &node.url,
            &PlanRequest {
                names: vec!["../../../etc/passwd".into()],
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Status { status: 400, message, .. } if message.contains("unknown certificate name")),
        "{err}"
    );
    let err = client
        .plan(
            &node.url,
            &PlanRequest {
                names: vec!["apiserver".into()],
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Status { status: 400, message, .. } if message.contains("no apiserver")),
        "{err}"
    );
    let err = client
        .apply(
            &node.url,
            &ApplyRequest {
                plan_id: "../../pki".into(),
                certificates: BTreeMap::new(),
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Status { status: 400, .. }),
        "{err}"
    );
    let err = client.operation(&node.url, "../../etc").await.unwrap_err();
    assert!(
        matches!(&err, AgentError::Status { status: 404, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_failed_restart_hook_is_reported_and_the_new_certificates_stay() {
    let cas = ClusterCas::create().unwrap();
    let node = start_node(&cas, NodeRole::Worker, Hooks::restart("sh -c {release}")).await;
    // `{release}` is not substituted for restarts: the hook runs as `sh -c {release}`, which
    // fails with sh's own error. What matters is the report.
    let client = operator(&cas);
    let files_before = node_files(&node);
    let plan = client
        .plan(&node.url, &PlanRequest::default())
        .await
        .unwrap();
    let outcome = client
        .apply(
            &node.url,
            &ApplyRequest {
                plan_id: plan.plan_id.clone(),
                certificates: sign_all(&cas, &plan, "90d"),
            },
        )
        .await
        .unwrap();
    let restart = outcome.restart.unwrap();
    assert!(!restart.success);
    assert_eq!(restart.exit_code, Some(127));
    assert!(
        restart.output_tail.contains("release"),
        "{}",
        restart.output_tail
    );
    assert_backup_holds(
        &outcome.backup_dir,
        &files_before,
        &["kubeconfigs/kubelet.conf", "pki/kubelet.key"],
    );
    let now = inventory::discover(&node.layout);
    assert_eq!(now.earliest_expiry(), Some(outcome.earliest_not_after));
}

/// A hook that exits at once but leaves a child holding its output, and records the child's pid.
fn backgrounding_hook(dir: &Path) -> (String, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let script = dir.join("background.sh");
    let pid_file = dir.join("child.pid");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nsleep 1000 &\necho $! > {}\necho started\n",
            pid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script.display().to_string(), pid_file)
}

/// Whether process `pid` (from a file) is gone, or a zombie nobody has reaped yet, within a
/// moment.
fn is_dead(pid_file: &Path) -> bool {
    let pid = std::fs::read_to_string(pid_file).unwrap();
    caretaker_testkit::process::exits_soon(pid.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_that_leave_a_child_holding_their_output_time_out_and_are_recorded() {
    let cas = ClusterCas::create().unwrap();
    let hooks_dir = tempfile::tempdir().unwrap();
    let (restart_hook, restart_child) = backgrounding_hook(&hooks_dir.path().join("r"));
    let (upgrade_hook, upgrade_child) = backgrounding_hook(&hooks_dir.path().join("u"));
    let node = start_node(
        &cas,
        NodeRole::Worker,
        Hooks {
            restart: Some(restart_hook),
            upgrade: Some(upgrade_hook),
            timeout: Some(Duration::from_secs(1)),
        },
    )
    .await;
    let client = operator(&cas);

    // The restart hook: the apply answers (the client allows 20 s, the child 1000 s).
    let plan = client
        .plan(&node.url, &PlanRequest::default())
        .await
        .unwrap();
    let outcome = client
        .apply(
            &node.url,
            &ApplyRequest {
                plan_id: plan.plan_id.clone(),
                certificates: sign_all(&cas, &plan, "90d"),
            },
        )
        .await
        .unwrap();
    let restart = outcome.restart.clone().unwrap();
    assert!(restart.timed_out && !restart.success, "{restart:?}");
    assert!(restart.output_tail.starts_with("started"), "{restart:?}");
    assert!(
        is_dead(&restart_child),
        "the restart hook's child was killed"
    );
    match client.plan_status(&node.url, &plan.plan_id).await.unwrap() {
        PlanStatus::Applied { outcome: recorded } => {
            assert_eq!(recorded, outcome, "the record is written")
        }
        other => panic!("expected applied, got {other:?}"),
    }

    // The upgrade hook: the operation fails as timed out, and so it is recorded.
    let op = client
        .start_upgrade(
            &node.url,
            &UpgradeRequest {
                release: "revision=3".into(),
                request_id: None,
            },
        )
        .await
        .unwrap();
    let failed = wait_finished(&client, &node.url, &op.id).await;
    assert_eq!(failed.state, OperationState::Failed, "{failed:?}");
    assert!(
        failed
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("did not finish within 1s"),
        "{failed:?}"
    );
    assert!(failed.output_tail.starts_with("started"), "{failed:?}");
    assert!(
        is_dead(&upgrade_child),
        "the upgrade hook's child was killed"
    );
    let record: Operation = serde_json::from_slice(
        &std::fs::read(node.state_dir().join(format!("operations/{}.json", op.id))).unwrap(),
    )
    .unwrap();
    assert_eq!(record, failed);
    assert_eq!(client.health(&node.url).await.unwrap().release, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_apply_outlives_its_client_and_others_are_told_to_wait() {
    let cas = ClusterCas::create().unwrap();
    let hooks_dir = tempfile::tempdir().unwrap();
    let hook = hooks_dir.path().join("restart.sh");
    let runs = hooks_dir.path().join("runs");
    std::fs::write(
        &hook,
        format!("#!/bin/sh\necho run >> {}\nsleep 3\n", runs.display()),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let node = start_node(
        &cas,
        NodeRole::Worker,
        Hooks::restart(hook.display().to_string()),
    )
    .await;
    let client = operator(&cas);
    let impatient = client_with_timeout(
        &cas.cluster,
        &cas.cluster,
        "caretaker-operator",
        Duration::from_millis(500),
    );
    let plan = client
        .plan(&node.url, &PlanRequest::default())
        .await
        .unwrap();
    let request = ApplyRequest {
        plan_id: plan.plan_id.clone(),
        certificates: sign_all(&cas, &plan, "1y"),
    };
    // The client gives up while the restart hook runs; the apply goes on.
    let err = impatient.apply(&node.url, &request).await.unwrap_err();
    assert!(matches!(err, AgentError::Timeout { .. }), "{err}");
    assert_eq!(
        client.plan_status(&node.url, &plan.plan_id).await.unwrap(),
        PlanStatus::Applying
    );
    // Anything else that would touch the files is told to wait, not queued and not failed.
    let again = client.apply(&node.url, &request).await.unwrap_err();
    let other = client
        .plan(&node.url, &PlanRequest::default())
        .await
        .unwrap_err();
    for busy in [&again, &other] {
        assert!(busy.is_busy(), "{busy}");
        assert!(
            matches!(busy, AgentError::Status { status: 409, message, .. } if message.contains(&plan.plan_id)),
            "{busy}"
        );
    }

    let mut status = PlanStatus::Applying;
    for _ in 0..200 {
        status = client.plan_status(&node.url, &plan.plan_id).await.unwrap();
        if status != PlanStatus::Applying {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let PlanStatus::Applied { outcome } = status else {
        panic!("expected applied, got {status:?}");
    };
    assert!(outcome.restart.unwrap().success);
    assert_eq!(
        std::fs::read_to_string(&runs).unwrap(),
        "run\n",
        "one hook run"
    );
    assert_eq!(
        inventory::discover(&node.layout).earliest_expiry(),
        Some(outcome.earliest_not_after)
    );
    // The node is free again.
    client
        .plan(&node.url, &PlanRequest::default())
        .await
        .unwrap();
}

#[tokio::test]
async fn old_backups_and_applied_records_are_pruned_to_the_last_three() {
    let cas = ClusterCas::create().unwrap();
    let node = start_node(&cas, NodeRole::Worker, Hooks::default()).await;
    let client = operator(&cas);
    let mut outcomes = Vec::new();
    for _ in 0..5 {
        let files_before = node_files(&node);
        let plan = client
            .plan(&node.url, &PlanRequest::default())
            .await
            .unwrap();
        let outcome = client
            .apply(
                &node.url,
                &ApplyRequest {
                    plan_id: plan.plan_id.clone(),
                    certificates: sign_all(&cas, &plan, "1y"),
                },
            )
            .await
            .unwrap();
        outcomes.push((plan.plan_id, outcome, files_before));
        // Distinct modification times, so "newest" is well defined.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let count = |dir: &str| {
        std::fs::read_dir(node.state_dir().join(dir))
            .unwrap()
            .count()
    };
    assert_eq!(count("backups"), 3);
    assert_eq!(count("applied"), 3);
    for (index, (plan_id, outcome, _)) in outcomes.iter().enumerate() {
        let kept = index >= 2;
        assert_eq!(outcome.backup_dir.exists(), kept, "backup {index}");
        let status = client.plan_status(&node.url, plan_id).await;
        assert_eq!(status.is_ok(), kept, "record {index}: {status:?}");
    }
    // What is kept still holds the keys each apply replaced, 0600.
    for (_, outcome, files_before) in &outcomes[2..] {
        assert_backup_holds(&outcome.backup_dir, files_before, &["pki/kubelet.key"]);
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_is_cut_off() {
    let cas = ClusterCas::create().unwrap();
    let limits = ServeLimits {
        handshake_timeout: Duration::from_secs(1),
        ..ServeLimits::default()
    };
    let node = start_node_with(&cas, NodeRole::Worker, Hooks::default(), limits).await;
    let address = node.url.trim_start_matches("https://");
    let mut silent = tokio::net::TcpStream::connect(address).await.unwrap();
    // It sends nothing; the agent closes the connection once the handshake timeout passes.
    let mut buffer = [0u8; 64];
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut silent, &mut buffer),
    )
    .await
    .expect("the agent must close a connection that never shakes hands");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    operator(&cas).health(&node.url).await.unwrap();
}

#[tokio::test]
async fn a_connection_beyond_the_cap_closes_the_oldest_silent_one() {
    let cas = ClusterCas::create().unwrap();
    let limits = ServeLimits {
        max_connections: 2,
        handshake_timeout: Duration::from_secs(120),
        ..ServeLimits::default()
    };
    let node = start_node_with(&cas, NodeRole::Worker, Hooks::default(), limits).await;
    let address = node.url.trim_start_matches("https://").to_string();
    let mut idle_1 = tokio::net::TcpStream::connect(&address).await.unwrap();
    let _idle_2 = tokio::net::TcpStream::connect(&address).await.unwrap();
    // Both slots are taken by connections that send nothing, and would be for the whole
    // handshake timeout: the operator is served all the same, in the oldest one's place.
    operator(&cas).health(&node.url).await.unwrap();
    let mut buffer = [0u8; 64];
    let read = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::io::AsyncReadExt::read(&mut idle_1, &mut buffer),
    )
    .await
    .expect("the agent closes the oldest silent connection to make room");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
}

#[tokio::test]
async fn clients_without_the_operators_certificate_get_no_answer() {
    let cas = ClusterCas::create().unwrap();
    let node = start_node(&cas, NodeRole::Worker, Hooks::default()).await;

    // Another CA's client certificate with the right name.
    let other = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let err = client_for(&cas.cluster, &other, "caretaker-operator")
        .health(&node.url)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Tls { .. } | AgentError::Protocol { .. }),
        "{err}"
    );

    // The right CA but another identity.
    let err = client_for(&cas.cluster, &cas.cluster, "system:node:node-1")
        .health(&node.url)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Tls { .. } | AgentError::Protocol { .. }),
        "{err}"
    );

    // No client certificate at all, and plain HTTP, need a client other than `AgentClient`:
    // `caretaker/tests/node_cli.rs` checks them against the agent binary with rustls.

    // And the operator's certificate works.
    operator(&cas).health(&node.url).await.unwrap();
}

fn upgrade_script(dir: &Path) -> String {
    let script = dir.join("upgrade.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nset -e\nif [ -e \"$(dirname \"$0\")/fail-upgrade\" ]; then echo \"upgrade to $1 failed: fail-upgrade exists\" >&2; exit 4; fi\necho \"upgrading to $1\"\nsleep \"${UPGRADE_SECONDS:-0.3}\"\necho \"$1\" > \"$(dirname \"$0\")/release\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script.display().to_string()
}

async fn wait_finished(client: &AgentClient, url: &str, id: &str) -> Operation {
    for _ in 0..200 {
        let op = client.operation(url, id).await.unwrap();
        if op.state.is_finished() {
            return op;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("operation {id} did not finish");
}

#[tokio::test]
async fn upgrades_succeed_fail_and_cancel() {
    let cas = ClusterCas::create().unwrap();
    let hooks_dir = tempfile::tempdir().unwrap();
    let script = upgrade_script(hooks_dir.path());
    let node = start_node(&cas, NodeRole::Worker, Hooks::upgrade(script)).await;
    let client = operator(&cas);

    // An option of an unknown form is refused, listing the accepted ones.
    let err = client
        .start_upgrade(
            &node.url,
            &UpgradeRequest {
                release: "1.33".into(),
                request_id: None,
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, AgentError::Status { status: 400, message, .. } if message.contains("channel=<channel>")),
        "{err}"
    );

    // Success: the release is recorded and reported by health.
    let request = UpgradeRequest {
        release: "channel=1.33/stable".into(),
        request_id: Some("req-1".into()),
    };
    let op = client.start_upgrade(&node.url, &request).await.unwrap();
    assert_eq!(op.state, OperationState::Running);
    // Starting again with the same request id is the same operation, not a second run.
    let same = client.start_upgrade(&node.url, &request).await.unwrap();
    assert_eq!(same.id, op.id);
    let busy = client
        .start_upgrade(
            &node.url,
            &UpgradeRequest {
                release: "revision=2".into(),
                request_id: None,
            },
        )
        .await
        .unwrap_err();
    // Busy, like a refresh step: the caller waits and asks again.
    assert!(busy.is_busy(), "{busy}");
    let done = wait_finished(&client, &node.url, &op.id).await;
    assert_eq!(done.state, OperationState::Succeeded, "{done:?}");
    assert!(
        done.output_tail
            .contains("upgrading to channel=1.33/stable")
    );
    assert!(done.finished_at.is_some());
    assert_eq!(
        std::fs::read_to_string(hooks_dir.path().join("release"))
            .unwrap()
            .trim(),
        "channel=1.33/stable"
    );
    assert_eq!(
        client.health(&node.url).await.unwrap().release.as_deref(),
        Some("channel=1.33/stable")
    );

    // Failure: exit code and output are reported; the release stays.
    std::fs::write(hooks_dir.path().join("fail-upgrade"), "").unwrap();
    let op = client
        .start_upgrade(
            &node.url,
            &UpgradeRequest {
                release: "revision=99".into(),
                request_id: None,
            },
        )
        .await
        .unwrap();
    let failed = wait_finished(&client, &node.url, &op.id).await;
    assert_eq!(failed.state, OperationState::Failed);
    assert_eq!(failed.exit_code, Some(4));
    assert!(
        failed.output_tail.contains("fail-upgrade exists"),
        "{}",
        failed.output_tail
    );
    assert_eq!(
        client.health(&node.url).await.unwrap().release.as_deref(),
        Some("channel=1.33/stable")
    );
    std::fs::remove_file(hooks_dir.path().join("fail-upgrade")).unwrap();

    // Cancel: the whole process group is killed (the script and its child), nothing is recorded.
    let slow_dir = tempfile::tempdir().unwrap();
    let (slow, pids) = long_running_hook(slow_dir.path());
    let slow_node = start_node(&cas, NodeRole::Worker, Hooks::upgrade(slow)).await;
    let op = client
        .start_upgrade(
            &slow_node.url,
            &UpgradeRequest {
                release: "channel=1.34/stable".into(),
                request_id: None,
            },
        )
        .await
        .unwrap();
    pids.wait_written().await;
    let cancelling = client.cancel(&slow_node.url, &op.id).await.unwrap();
    assert_eq!(cancelling.message.as_deref(), Some("cancel requested"));
    let finished = wait_finished(&client, &slow_node.url, &op.id).await;
    assert_eq!(finished.state, OperationState::Cancelled);
    assert!(finished.output_tail.contains("started"));
    assert!(is_dead(&pids.script), "the upgrade script was killed");
    assert!(is_dead(&pids.child), "the script's child was killed");
    assert!(!slow_dir.path().join("release").exists());
    assert_eq!(client.health(&slow_node.url).await.unwrap().release, None);
}

/// Where [`long_running_hook`] records its own pid and its child's.
struct HookPids {
    script: PathBuf,
    child: PathBuf,
}

impl HookPids {
    /// Waits until the hook has recorded both pids, so a cancel finds them running.
    async fn wait_written(&self) {
        for _ in 0..200 {
            let written = |p: &Path| std::fs::read_to_string(p).is_ok_and(|s| s.ends_with('\n'));
            if written(&self.script) && written(&self.child) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the hook never recorded its pids");
    }
}

/// An upgrade hook that runs a child for 30 s and waits for it, recording both pids, then
/// writes `release` beside itself. The child does not hold the hook's output, so the operation
/// ends when the script does and only the pids tell whether the child was stopped with it.
fn long_running_hook(dir: &Path) -> (String, HookPids) {
    let script = dir.join("slow.sh");
    let pids = HookPids {
        script: dir.join("script.pid"),
        child: dir.join("child.pid"),
    };
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho started\necho $$ > {}\nsleep 30 >/dev/null 2>&1 &\necho $! > {}\nwait\necho \"$1\" > \"$(dirname \"$0\")/release\"\n",
            pids.script.display(),
            pids.child.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script.display().to_string(), pids)
}

#[tokio::test]
async fn an_upgrade_running_when_the_agent_stopped_is_reported_failed_after_a_restart() {
    let cas = ClusterCas::create().unwrap();
    let hooks_dir = tempfile::tempdir().unwrap();
    let (slow, pids) = long_running_hook(hooks_dir.path());
    let node = start_node(&cas, NodeRole::Worker, Hooks::upgrade(slow.clone())).await;
    let client = operator(&cas);
    let op = client
        .start_upgrade(
            &node.url,
            &UpgradeRequest {
                release: "revision=8".into(),
                request_id: Some("r8".into()),
            },
        )
        .await
        .unwrap();
    pids.wait_written().await;

    // A new agent on the same state directory, as after the agent process restarted.
    let restarted = Upgrader::new(
        node.state_dir(),
        Some(CommandTemplate::parse(&slow).unwrap()),
    );
    let reported = restarted.get(&op.id).unwrap();
    assert_eq!(reported.state, OperationState::Failed, "{reported:?}");
    assert!(
        reported
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("outcome is unknown"),
        "{reported:?}"
    );
    assert!(reported.finished_at.is_some());
    assert_eq!(restarted.current_release(), None);
    // It is recorded so, not only reported.
    let record: Operation = serde_json::from_slice(
        &std::fs::read(node.state_dir().join(format!("operations/{}.json", op.id))).unwrap(),
    )
    .unwrap();
    assert_eq!(record, reported);

    // The first agent's hook is still running in this process: stop it.
    client.cancel(&node.url, &op.id).await.unwrap();
    assert!(is_dead(&pids.script) && is_dead(&pids.child));
}

/// Release options that reached the hook before the grammar was strict, and an overlong one.
fn hostile_releases() -> Vec<String> {
    let mut releases: Vec<String> = [
        "channel=$(id)",
        "channel=--classic",
        "channel=1.33/stable\u{202e}",
        "channel=1.33/st\u{e4}ble",
        "revision=..",
        "localPath=/../../etc/shadow",
    ]
    .map(String::from)
    .to_vec();
    releases.push(format!("localPath=/opt/{}.snap", "a".repeat(300)));
    releases
}

#[tokio::test]
async fn hostile_release_options_are_refused_and_never_reach_the_hook() {
    let cas = ClusterCas::create().unwrap();
    let hooks_dir = tempfile::tempdir().unwrap();
    let script = upgrade_script(hooks_dir.path());
    let node = start_node(&cas, NodeRole::Worker, Hooks::upgrade(script)).await;
    let client = operator(&cas);
    for release in hostile_releases() {
        let err = client
            .start_upgrade(
                &node.url,
                &UpgradeRequest {
                    release: release.clone(),
                    request_id: None,
                },
            )
            .await
            .unwrap_err();
        let shown = ReleaseOption::parse(&release).unwrap_err().to_string();
        assert!(
            matches!(&err, AgentError::Status { status: 400, message, .. } if *message == shown),
            "{release:?}: {err}"
        );
        assert!(shown.is_ascii(), "{shown}");
    }
    assert!(
        !node.state_dir().join("operations").exists(),
        "no operation was started"
    );
    assert!(
        !hooks_dir.path().join("release").exists(),
        "the hook never ran"
    );
}

#[tokio::test]
async fn an_agent_restart_remembers_operations() {
    let cas = ClusterCas::create().unwrap();
    let hooks_dir = tempfile::tempdir().unwrap();
    let script = upgrade_script(hooks_dir.path());
    let node = start_node(&cas, NodeRole::Worker, Hooks::upgrade(script.clone())).await;
    let client = operator(&cas);
    let op = client
        .start_upgrade(
            &node.url,
            &UpgradeRequest {
                release: "revision=7".into(),
                request_id: Some("r7".into()),
            },
        )
        .await
        .unwrap();
    wait_finished(&client, &node.url, &op.id).await;

    let reloaded = Upgrader::new(
        node.state_dir(),
        Some(CommandTemplate::parse(&script).unwrap()),
    );
    assert_eq!(
        reloaded.get(&op.id).unwrap().state,
        OperationState::Succeeded
    );
    assert_eq!(reloaded.current_release().as_deref(), Some("revision=7"));
    let again = reloaded.start(&UpgradeRequest {
        release: "revision=7".into(),
        request_id: Some("r7".into()),
    });
    assert_eq!(
        again.unwrap().id,
        op.id,
        "the same request is not run twice"
    );
}
