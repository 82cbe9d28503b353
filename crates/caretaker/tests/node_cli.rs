//! `caretaker certs` and `caretaker agent` as a node admin runs them.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use caretaker_agent::NodeLayout;
use caretaker_agent::api::AgentClient;
use caretaker_agent::provision::{ClusterCas, NodeRole, NodeSpec, provision_node};
use caretaker_agent::tls;
use caretaker_pki::files;
use caretaker_pki::{LeafSpec, Usage};

fn caretaker(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_caretaker"))
        .args(args)
        .output()
        .expect("run caretaker")
}

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
        layout.pki_dir.to_str().unwrap(),
        "--kubeconfig-dir",
        layout.kubeconfig_dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
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
        empty.to_str().unwrap(),
        "--kubeconfig-dir",
        empty.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no certificates found"));
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
            layout.pki_dir.to_str().unwrap(),
            "--kubeconfig-dir",
            layout.kubeconfig_dir.to_str().unwrap(),
            "--state-dir",
            state.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        caretaker(&args)
    };
    let nope = tmp.path().join("nope");

    let out = renew(&[
        "apiserver",
        "admin.conf",
        "--ca-dir",
        ca_dir.to_str().unwrap(),
        "--expires-in",
        "2y",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("renewed apiserver") && text.contains("renewed admin.conf"),
        "{text}"
    );
    let after = caretaker_agent::offline::inventory(&layout);
    let days = |inv: &caretaker_agent::inventory::Inventory, n: &str| {
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
                ca_dir.to_str().unwrap(),
                "--expires-in",
                "-1y",
            ],
            "-1y",
        ),
        (
            vec!["apiserverz", "--ca-dir", ca_dir.to_str().unwrap()],
            "apiserverz",
        ),
        (vec!["all", "--ca-dir", nope.to_str().unwrap()], "nope"),
    ] {
        let out = renew(&args);
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(named), "{err}");
    }
    assert_eq!(caretaker_agent::offline::inventory(&layout), after);

    // CAs that are not the node's: every check runs before anything is written.
    let other = ClusterCas::create().unwrap();
    let other_dir = tmp.path().join("other-cas");
    write_ca_dir(&other_dir, &other);
    let out = renew(&["all", "--ca-dir", other_dir.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing was changed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
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
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent.crt"));
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
