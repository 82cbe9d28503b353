//! `caretaker certs` and `caretaker agent` as a node admin runs them.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use caretaker_agent::NodeLayout;
use caretaker_agent_api::client::AgentClient;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_agent_api::tls;
use caretaker_pki::files;
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use caretaker_testkit::provision::{ClusterCas, NodeSpec, provision_node};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use common::{assert_one_error_line, caretaker, path, stderr, stdout};

fn provision(dir: &Path, cas: &ClusterCas, role: NodeRole) -> NodeLayout {
    let layout = NodeLayout::new(dir.join("pki"), dir.join("kubeconfigs"));
    provision_node(
        &layout,
        cas,
        &NodeSpec {
            node_name: "cp-0".into(),
            addresses: vec!["127.0.0.1".parse().unwrap()],
            role,
            control_plane_host: "10.0.0.10".into(),
            server_url: "https://10.0.0.10:6443".into(),
            validity: "30d".parse().unwrap(),
        },
    )
    .unwrap();
    layout
}

/// Writes the cluster's CAs with their keys in kubeadm layout, as an admin would have them.
fn write_ca_dir(dir: &Path, cas: &ClusterCas) {
    std::fs::create_dir_all(dir.join("etcd")).unwrap();
    for (stem, ca) in [
        ("ca", &cas.cluster),
        ("etcd/ca", &cas.etcd),
        ("front-proxy-ca", &cas.front_proxy),
    ] {
        files::write_atomic(
            &dir.join(format!("{stem}.crt")),
            ca.certificate_pem().as_bytes(),
            0o644,
        )
        .unwrap();
        files::write_atomic(
            &dir.join(format!("{stem}.key")),
            ca.private_key_pem().as_bytes(),
            0o600,
        )
        .unwrap();
    }
}

#[test]
fn check_expiration_lists_every_certificate_like_kubeadm() {
    let tmp = tempfile::tempdir().unwrap();
    let cas = ClusterCas::create().unwrap();
    let layout = provision(tmp.path(), &cas, NodeRole::ControlPlane);
    let out = caretaker(&[
        "certs",
        "check-expiration",
        "--pki-dir",
        path(&layout.pki_dir),
        "--kubeconfig-dir",
        path(&layout.kubeconfig_dir),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("CERTIFICATE "), "{text}");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .to_string()
    };
    assert!(
        line("apiserver").contains(" 29d ") || line("apiserver").contains(" 30d "),
        "{}",
        line("apiserver")
    );
    assert!(line("apiserver-etcd-client").contains("etcd/ca"));
    assert!(line("front-proxy-client").contains("front-proxy-ca"));
    assert!(line("admin.conf").contains(" ca "));
    // The node has no CA keys: the CAs are externally managed.
    assert!(
        line("front-proxy-ca").trim_end().ends_with("yes"),
        "{}",
        line("front-proxy-ca")
    );

    let empty = tmp.path().join("empty");
    let out = caretaker(&[
        "certs",
        "check-expiration",
        "--pki-dir",
        path(&empty),
        "--kubeconfig-dir",
        path(&empty),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no certificates found"));
}

#[test]
fn renew_replaces_certificates_with_the_given_cas() {
    let tmp = tempfile::tempdir().unwrap();
    let cas = ClusterCas::create().unwrap();
    let layout = provision(tmp.path(), &cas, NodeRole::ControlPlane);
    let ca_dir = tmp.path().join("cas");
    write_ca_dir(&ca_dir, &cas);
    let before = caretaker_agent::offline::inventory(&layout);
    let state = tmp.path().join("state");
    let renew = |extra: &[&str]| {
        let mut args = vec![
            "certs",
            "renew",
            "--pki-dir",
            path(&layout.pki_dir),
            "--kubeconfig-dir",
            path(&layout.kubeconfig_dir),
            "--state-dir",
            path(&state),
        ];
        args.extend_from_slice(extra);
        caretaker(&args)
    };
    let nope = tmp.path().join("nope");

    let out = renew(&[
        "apiserver",
        "admin.conf",
        "--ca-dir",
        path(&ca_dir),
        "--expires-in",
        "2y",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("renewed apiserver") && text.contains("renewed admin.conf"),
        "{text}"
    );
    let after = caretaker_agent::offline::inventory(&layout);
    let days = |inv: &caretaker_agent_api::inventory::Inventory, n: &str| {
        (inv.entry(n).unwrap().certificate.not_after - time::OffsetDateTime::now_utc()).whole_days()
    };
    assert!(days(&after, "apiserver") > 700);
    assert!(days(&after, "admin.conf") > 700);
    assert_eq!(
        days(&after, "scheduler.conf"),
        days(&before, "scheduler.conf"),
        "others untouched"
    );
    assert_eq!(
        after.entry("apiserver").unwrap().certificate.dns_names,
        before.entry("apiserver").unwrap().certificate.dns_names
    );

    // Bad input: one line naming the value, nothing changed.
    for (args, named) in [
        (
            vec![
                "apiserver",
                "--ca-dir",
                path(&ca_dir),
                "--expires-in",
                "-1y",
            ],
            "-1y",
        ),
        (vec!["apiserverz", "--ca-dir", path(&ca_dir)], "apiserverz"),
        (vec!["all", "--ca-dir", path(&nope)], "nope"),
    ] {
        assert_one_error_line(&renew(&args), named);
    }
    assert_eq!(caretaker_agent::offline::inventory(&layout), after);

    // CAs that are not the node's: every check runs before anything is written.
    let other = ClusterCas::create().unwrap();
    let other_dir = tmp.path().join("other-cas");
    write_ca_dir(&other_dir, &other);
    let out = renew(&["all", "--ca-dir", path(&other_dir)]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("nothing was changed"),
        "{}",
        stderr(&out)
    );
    assert_eq!(caretaker_agent::offline::inventory(&layout), after);
}

/// A `caretaker agent` process serving a worker node in `dir`, started through `sh -c
/// "SHELL_PREFIX exec caretaker agent ..."` (to lower its limits, say).
struct AgentProcess {
    child: tokio::process::Child,
    client: AgentClient,
    url: String,
}

fn spawn_agent(
    dir: &Path,
    cas: &ClusterCas,
    layout: &NodeLayout,
    shell_prefix: &str,
) -> AgentProcess {
    let serving = cas
        .cluster
        .issue(
            &LeafSpec::new("agent", Usage::Server)
                .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
        )
        .unwrap();
    std::fs::write(dir.join("agent.crt"), &serving.certificate_pem).unwrap();
    files::write_atomic(
        &dir.join("agent.key"),
        serving.key.as_ref().unwrap().to_pem().as_bytes(),
        0o600,
    )
    .unwrap();
    std::fs::write(dir.join("ca.crt"), cas.cluster.certificate_pem()).unwrap();
    let port = caretaker_testkit::ports::reusable_port().unwrap();
    let p = |name: &str| dir.join(name).display().to_string();
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{shell_prefix} exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_caretaker"))
        .args(["agent", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--pki-dir",
            &layout.pki_dir.display().to_string(),
            "--kubeconfig-dir",
            &layout.kubeconfig_dir.display().to_string(),
        ])
        .args([
            "--tls-cert",
            &p("agent.crt"),
            "--tls-key",
            &p("agent.key"),
            "--client-ca",
            &p("ca.crt"),
            "--state-dir",
            &p("state"),
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    let client_pair = cas
        .cluster
        .issue(&LeafSpec::new("caretaker-operator", Usage::Client))
        .unwrap();
    let client = AgentClient::new(
        tls::client_config(
            &cas.cluster.certificate_pem(),
            &client_pair.certificate_pem,
            &client_pair.key.unwrap().to_pem(),
        )
        .unwrap(),
        Duration::from_secs(5),
    );
    AgentProcess {
        child,
        client,
        url: format!("https://127.0.0.1:{port}"),
    }
}

impl AgentProcess {
    /// Waits until the agent answers a health request.
    async fn wait_healthy(&self) {
        for _ in 0..100 {
            if self.client.health(&self.url).await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the agent at {} never answered", self.url);
    }
}

#[tokio::test]
async fn the_agent_command_serves_mutual_tls() {
    let tmp = tempfile::tempdir().unwrap();
    let cas = ClusterCas::create().unwrap();
    let layout = provision(tmp.path(), &cas, NodeRole::Worker);
    let AgentProcess {
        mut child,
        client,
        url,
    } = spawn_agent(tmp.path(), &cas, &layout, "");
    let p = |name: &str| tmp.path().join(name).display().to_string();
    let mut inventory = None;
    for _ in 0..100 {
        if let Ok(found) = client.certificates(&url).await {
            inventory = Some(found);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let inventory = inventory.expect("the agent answers");
    assert_eq!(inventory.certificates.len(), 2);
    child.kill().await.unwrap();

    // A missing serving certificate is one clear error.
    let out = caretaker(&[
        "agent",
        "--tls-cert",
        "/nonexistent.crt",
        "--tls-key",
        &p("agent.key"),
        "--client-ca",
        &p("ca.crt"),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("/nonexistent.crt"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_survives_running_out_of_file_descriptors() {
    let tmp = tempfile::tempdir().unwrap();
    let cas = ClusterCas::create().unwrap();
    let layout = provision(tmp.path(), &cas, NodeRole::Worker);
    let mut agent = spawn_agent(tmp.path(), &cas, &layout, "ulimit -n 48 &&");
    agent.wait_healthy().await;

    // Far more plain TCP connections than the agent has descriptors, sending nothing.
    let address = agent.url.trim_start_matches("https://").to_string();
    let mut flood = Vec::new();
    for _ in 0..120 {
        // Refused only once the agent has gone, which the assertion below reports.
        if let Ok(stream) = tokio::net::TcpStream::connect(&address).await {
            flood.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        agent.child.try_wait().unwrap().is_none(),
        "the agent must not exit when accept fails"
    );
    drop(flood);
    // Once descriptors are free again it serves the operator as before.
    agent.wait_healthy().await;
    assert!(agent.child.try_wait().unwrap().is_none());
}

/// How a test client connects to the agent.
#[derive(Clone, Copy)]
enum Connection {
    /// TCP only, speaking HTTP in the clear.
    Plain,
    /// TLS trusting the cluster CA, without a client certificate.
    NoCertificate,
    /// TLS trusting the cluster CA, with a client certificate for `common_name` from the
    /// cluster CA or, with `another_ca`, from a CA of the same name made for the occasion.
    Certificate {
        another_ca: bool,
        common_name: &'static str,
    },
}

const OPERATOR: Connection = Connection::Certificate {
    another_ca: false,
    common_name: tls::DEFAULT_ALLOWED_CLIENT,
};

/// Sends `GET /v1/health` to the agent at `url` over `connection` with rustls directly (not
/// the agent's client, whose own checks could hide what the agent does) and returns every
/// byte of the answer, or the error that ended the exchange.
async fn raw_health(
    cas: &ClusterCas,
    url: &str,
    connection: Connection,
) -> std::io::Result<Vec<u8>> {
    let tcp = tokio::net::TcpStream::connect(url.trim_start_matches("https://")).await?;
    tls::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    let ca = CertificateDer::from_pem_slice(cas.cluster.certificate_pem().as_bytes()).unwrap();
    roots.add(ca).unwrap();
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match connection {
        Connection::Plain => return exchange(tcp).await,
        Connection::NoCertificate => builder.with_no_client_auth(),
        Connection::Certificate {
            another_ca,
            common_name,
        } => {
            let other;
            let signer = if another_ca {
                other = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
                &other
            } else {
                &cas.cluster
            };
            let pair = signer
                .issue(&LeafSpec::new(common_name, Usage::Client))
                .unwrap();
            let chain =
                vec![CertificateDer::from_pem_slice(pair.certificate_pem.as_bytes()).unwrap()];
            let key = PrivateKeyDer::from_pem_slice(pair.key.unwrap().to_pem().as_bytes()).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
    };
    let server = ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server, tcp)
        .await?;
    exchange(tls).await
}

async fn exchange(mut stream: impl AsyncRead + AsyncWrite + Unpin) -> std::io::Result<Vec<u8>> {
    stream
        .write_all(b"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    stream.flush().await?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok(answer)
}

/// Whether `answer` is the agent's 200 to a health request.
fn is_ok_answer(answer: &[u8]) -> bool {
    answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"}")
}

/// Starts the agent binary, checks that a client connecting as `refused` gets no HTTP answer
/// (the handshake or the first request fails), and that the operator is served right after.
async fn assert_refused(refused: Connection) {
    let tmp = tempfile::tempdir().unwrap();
    let cas = ClusterCas::create().unwrap();
    let layout = provision(tmp.path(), &cas, NodeRole::Worker);
    let agent = spawn_agent(tmp.path(), &cas, &layout, "");
    agent.wait_healthy().await;
    // The same path succeeds for the operator, so a refusal below is the agent's doing.
    let served = raw_health(&cas, &agent.url, OPERATOR).await.unwrap();
    assert!(
        is_ok_answer(&served),
        "{}",
        String::from_utf8_lossy(&served)
    );

    // A bound, not a timing: the agent must end the connection rather than hold it open.
    let answer = tokio::time::timeout(
        Duration::from_secs(30),
        raw_health(&cas, &agent.url, refused),
    )
    .await
    .expect("the agent ends a refused connection");
    if let Ok(bytes) = &answer {
        assert!(
            !bytes.starts_with(b"HTTP/"),
            "an HTTP answer: {}",
            String::from_utf8_lossy(bytes)
        );
    }

    let served = raw_health(&cas, &agent.url, OPERATOR).await.unwrap();
    assert!(
        is_ok_answer(&served),
        "{}",
        String::from_utf8_lossy(&served)
    );
}

#[tokio::test]
async fn the_agent_command_refuses_a_client_without_a_certificate() {
    assert_refused(Connection::NoCertificate).await;
}

#[tokio::test]
async fn the_agent_command_refuses_a_client_certificate_with_another_common_name() {
    // From the cluster CA: only the name is wrong.
    assert_refused(Connection::Certificate {
        another_ca: false,
        common_name: "system:node:cp-0",
    })
    .await;
}

#[tokio::test]
async fn the_agent_command_refuses_a_client_certificate_from_another_ca() {
    // The right name: only the signer is wrong.
    assert_refused(Connection::Certificate {
        another_ca: true,
        common_name: tls::DEFAULT_ALLOWED_CLIENT,
    })
    .await;
}

#[tokio::test]
async fn the_agent_command_gives_plain_http_no_answer() {
    assert_refused(Connection::Plain).await;
}
