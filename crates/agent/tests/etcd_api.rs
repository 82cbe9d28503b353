//! The agent's etcd installer over its real mutual-TLS API: what it refuses, as the operator's
//! client sees it. (Installs on a real etcd member: the operator's `etcd_agents` tests.)

use std::time::Duration;

use caretaker_agent::command::CommandTemplate;
use caretaker_agent::etcd::{EtcdConfig, EtcdInstaller, EtcdLayout};
use caretaker_agent::refresh::Refresher;
use caretaker_agent::server::{AgentService, serve};
use caretaker_agent::upgrade::Upgrader;
use caretaker_agent::{NodeLayout, tls};
use caretaker_agent_api::client::{AgentClient, AgentError};
use caretaker_agent_api::etcd::{InstallRequest, MemberFiles};
use caretaker_agent_api::refresh::PlanRequest;
use caretaker_agent_api::tls::{DEFAULT_ALLOWED_CLIENT, client_config};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};

fn pair(ca: &CertificateAuthority, spec: LeafSpec) -> (String, String) {
    let issued = ca.issue(&spec).unwrap();
    (issued.certificate_pem.clone(), issued.key.unwrap().to_pem())
}

/// m1's agent, its restart hook `hook` (the other tests' leaves a mark when it runs).
async fn m1_agent(
    dir: &std::path::Path,
    ca: &CertificateAuthority,
    hook: &str,
) -> (String, AgentClient) {
    let installer = EtcdInstaller::new(
        EtcdConfig {
            member: "m1".into(),
            dir: dir.join("pki"),
            names: EtcdLayout::Kubeadm.file_names(),
            client_url: "https://127.0.0.1:9".into(),
            restart: CommandTemplate::parse(hook).unwrap(),
            restart_timeout: Duration::from_secs(5),
            health_timeout: Duration::from_secs(1),
        },
        dir.join("state"),
    );
    let (cert, key) = pair(
        ca,
        LeafSpec::new("m1", Usage::Server).with_ip_addresses(["127.0.0.1".parse().unwrap()]),
    );
    let config =
        tls::server_config(&cert, &key, &ca.certificate_pem(), DEFAULT_ALLOWED_CLIENT).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    let layout = NodeLayout::new(dir.join("node-pki"), dir.join("node-kubeconfigs"));
    let router = AgentService::new(
        Refresher::new(layout, dir.join("state")),
        Upgrader::new(dir.join("state"), None),
    )
    .with_etcd(Some(installer))
    .router();
    tokio::spawn(async move {
        let _ = serve(listener, config, router).await;
    });
    let (cert, key) = pair(ca, LeafSpec::new(DEFAULT_ALLOWED_CLIENT, Usage::Client));
    let client = AgentClient::new(
        client_config(&ca.certificate_pem(), &cert, &key).unwrap(),
        Duration::from_secs(20),
    );
    (url, client)
}

fn files(ca: &CertificateAuthority, member: &str) -> MemberFiles {
    let both = |cn: String| {
        LeafSpec::new(&cn, Usage::Both).with_ip_addresses(["127.0.0.1".parse().unwrap()])
    };
    let (peer_certificate, peer_key) = pair(ca, both(format!("system:etcd-peer:{member}")));
    let (serving_certificate, serving_key) = pair(ca, both(format!("system:etcd-server:{member}")));
    MemberFiles {
        ca_bundle: ca.certificate_pem(),
        peer_certificate,
        peer_key,
        serving_certificate,
        serving_key,
    }
}

fn status_of(error: AgentError) -> (u16, String) {
    match error {
        AgentError::Status { status, reason, .. } => (status, reason),
        other => panic!("{other}"),
    }
}

/// The attacks: m0's files sent to m1's agent (403 WrongMember), and a body over 64 KiB (413,
/// not read). Nothing is written and the hook never runs.
#[tokio::test]
async fn another_members_files_and_oversized_bodies_are_refused_over_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
    let hook = format!("touch {}", dir.path().join("hook-ran").display());
    let (url, client) = m1_agent(dir.path(), &ca, &hook).await;
    let installed = client.etcd_installed(&url).await.unwrap();
    assert_eq!(
        (installed.member.as_str(), installed.revision),
        ("m1", None)
    );

    let request = InstallRequest {
        member: "m0".into(),
        revision: "0123456789abcdef".into(),
        files: files(&ca, "m0"),
    };
    let error = client.etcd_install(&url, &request).await.unwrap_err();
    assert_eq!(status_of(error), (403, "WrongMember".to_string()));

    let mut files = files(&ca, "m1");
    files.ca_bundle = files.ca_bundle.repeat(200);
    assert!(files.ca_bundle.len() > 64 * 1024);
    let request = InstallRequest {
        member: "m1".into(),
        revision: "0123456789abcdef".into(),
        files,
    };
    let error = client.etcd_install(&url, &request).await.unwrap_err();
    assert_eq!(status_of(error).0, 413);

    assert!(
        !dir.path().join("pki").exists()
            || std::fs::read_dir(dir.path().join("pki"))
                .unwrap()
                .next()
                .is_none()
    );
    assert!(!dir.path().join("hook-ran").exists());
    assert_eq!(client.etcd_installed(&url).await.unwrap().revision, None);
}

/// An etcd install and a certificate refresh never run at once on one node: kubeadm's etcd
/// peer and serving pairs are slots of both, so a refresh writing them during an install would
/// break the install's all-or-nothing and the revision it keeps for rollback. A refresh asked
/// for meanwhile is told the node is busy (409), and runs once the install has ended.
#[tokio::test]
async fn a_refresh_is_refused_while_an_etcd_revision_is_installed() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::create(&CaSpec::new("etcd-signer")).unwrap();
    let (url, client) = m1_agent(dir.path(), &ca, "sleep 2").await;
    let request = InstallRequest {
        member: "m1".into(),
        revision: "0123456789abcdef".into(),
        files: files(&ca, "m1"),
    };
    let install = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { client.etcd_install(&url, &request).await })
    };
    // The install writes the member's files before its hook (2 s) runs.
    let written = dir.path().join("pki").join("server.crt");
    for _ in 0..100 {
        if written.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(written.exists(), "the install wrote the member's files");

    let plan = PlanRequest { names: Vec::new() };
    let error = client.plan(&url, &plan).await.unwrap_err();
    assert_eq!(status_of(error), (409, "Busy".to_string()));

    // The install ends (its member answers no health check here) and frees the node.
    let _ = install.await.unwrap();
    let after = client.plan(&url, &plan).await;
    assert!(
        !matches!(after, Err(AgentError::Status { status: 409, .. })),
        "the node stayed busy: {after:?}"
    );
}
