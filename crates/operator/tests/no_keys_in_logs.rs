//! "Private keys never appear in logs": every log line of the operator, the agents, kube-rs and
//! the API server through a whole refresh, at trace level, and every Event, is searched for
//! every private key involved (the cluster's CA keys, each node's keys before and after, the
//! keys staged during the refresh).

mod common;

use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use common::logs::Captured;
use common::{fast, world};

/// The base64 lines of every PEM private key in `text`.
fn key_lines(text: &str, out: &mut Vec<String>) {
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("-----BEGIN") && line.contains("PRIVATE KEY") {
            inside = true;
        } else if line.starts_with("-----END") {
            inside = false;
        } else if inside && line.len() >= 16 {
            out.push(line.to_string());
        }
    }
}

/// Every private key under `dir`: PEM files and the base64 `client-key-data` of kubeconfigs.
fn keys_under(dir: &std::path::Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            keys_under(&path, out);
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        key_lines(&text, out);
        for line in text.lines() {
            if let Some(data) = line.trim().strip_prefix("client-key-data: ") {
                use base64::Engine;
                let pem = base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap();
                key_lines(&String::from_utf8(pem).unwrap(), out);
                out.push(data.to_string());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_private_key_reaches_a_log_line_or_an_event() {
    let captured = Captured::everywhere("trace");

    let mut world = world(fast()).await;
    let cp = world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    world
        .add_machine("w-0", NodeRole::Worker, "cp.example", None)
        .await;
    let mut keys = Vec::new();
    keys_under(world.dir.path(), &mut keys);
    for ca in [&world.cas.cluster, &world.cas.etcd, &world.cas.front_proxy] {
        key_lines(&ca.private_key_pem(), &mut keys);
    }
    let before = keys.len();

    for machine in ["cp-0", "w-0"] {
        world
            .annotate(machine, names::REFRESH_CERTIFICATES, "1y")
            .await;
    }
    for machine in ["cp-0", "w-0"] {
        world.wait_status(machine, names::STATUS_DONE).await;
    }
    // The new keys, and the staged and backed-up copies, are in the world's directory now.
    keys_under(world.dir.path(), &mut keys);
    assert!(
        keys.len() > before + 13,
        "the new keys were found too ({} before, {} after)",
        before,
        keys.len()
    );
    assert!(caretaker_agent::inventory::discover(&cp).certificates.len() == 13);

    let logs = captured.text();
    assert!(
        logs.contains("refreshing certificates"),
        "the operator's logs were captured"
    );
    let mut events = String::new();
    for machine in ["cp-0", "w-0"] {
        for event in world.events(machine).await {
            events.push_str(&format!("{event:?}\n"));
        }
    }
    for key in &keys {
        assert!(!logs.contains(key.as_str()), "a private key is in the logs");
        assert!(
            !events.contains(key.as_str()),
            "a private key is in an event"
        );
    }
}
