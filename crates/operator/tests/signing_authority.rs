//! The operator, not the node, decides what is signed, by which CA, for whom. Each test is an
//! attack from the security review, run against the real API server and real agents over
//! mutual TLS: a hostile node, a forged label, a forged agent endpoint, a rotated CA.

mod common;

use caretaker_agent::NodeLayout;
use caretaker_agent::inventory::discover;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_pki::files;
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use common::{NS, World, fast, world};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use caretaker_api::names;

/// Writes a pair issued by a CA of the attacker's own, as a root user on the node could.
fn plant_pair(layout: &NodeLayout, stem: &str, leaf: &LeafSpec) {
    let forger = CertificateAuthority::create(&CaSpec::new("attacker")).unwrap();
    caretaker_testkit::provision::write_pair(layout, stem, &forger, leaf).unwrap();
}

/// Waits for the refresh to fail and returns its Warning event's message.
async fn refused(world: &World, machine: &str) -> String {
    world
        .annotate(machine, names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status(machine, names::STATUS_FAILED).await;
    let event = world.event_with(machine, names::EVENT_REFRESH_FAILED).await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    event.message.unwrap_or_default()
}

/// No certificate on the node is issued by one of the cluster's CAs that was not before.
fn assert_unchanged(layout: &NodeLayout, before: &caretaker_agent_api::inventory::Inventory) {
    assert_eq!(&discover(layout), before, "nothing on the node changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_planting_etcd_or_front_proxy_certificates_gets_nothing_signed() {
    for (stem, ca_name) in [
        ("etcd/healthcheck-client", "etcd"),
        ("front-proxy-client", "front-proxy"),
    ] {
        let mut world = world(fast()).await;
        let layout = world
            .add_machine("w-0", NodeRole::Worker, "cp.example", None)
            .await;
        // The kubelet's own subject, so only the table's "not for workers" can stop it.
        plant_pair(
            &layout,
            stem,
            &LeafSpec::new("system:node:node-w-0", Usage::Client)
                .with_organizations(["system:nodes"]),
        );
        let before = discover(&layout);
        assert!(
            before.entry(stem).is_some(),
            "the agent sees the planted {stem}"
        );

        let message = refused(&world, "w-0").await;
        assert!(
            message.contains(stem) && message.contains("control-plane certificate"),
            "{ca_name}: {message}"
        );
        assert!(message.contains("nothing was signed"), "{message}");
        assert_unchanged(&layout, &before);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_labelled_control_plane_gets_no_admin_certificate() {
    let mut world = world(fast()).await;
    let layout = world
        .add_machine("w-0", NodeRole::Worker, "cp.example", None)
        .await;
    // The attack: the label, and an admin kubeconfig with a system:masters certificate.
    let forger = CertificateAuthority::create(&CaSpec::new("attacker")).unwrap();
    let admin = forger
        .issue(
            &LeafSpec::new("kubernetes-admin", Usage::Client)
                .with_organizations(["system:masters"]),
        )
        .unwrap();
    let text = caretaker_agent::kubeconfig::render(
        "kubernetes",
        "https://cp.example:6443",
        &world.cas.cluster.certificate_pem(),
        "kubernetes-admin",
        &admin.certificate_pem,
        &admin.key.unwrap().to_pem(),
    );
    files::write_atomic(
        &layout.kubeconfig_dir.join("admin.conf"),
        text.as_bytes(),
        files::PRIVATE_KEY_MODE,
    )
    .unwrap();
    let label = json!({ "metadata": { "labels": { names::CONTROL_PLANE_LABEL: "" } } });
    world
        .machines()
        .patch("w-0", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let before = discover(&layout);

    let message = refused(&world, "w-0").await;
    assert!(
        message.contains("is labelled cluster.x-k8s.io/control-plane but is not controlled by")
            && message.contains("CK8sControlPlane/c1-control-plane"),
        "{message}"
    );
    assert_unchanged(&layout, &before);
    assert_eq!(
        world.staged_plans("w-0"),
        0,
        "the node was not even asked for a plan"
    );

    // A real control-plane Machine (label and controller owner reference) still gets its
    // admin certificates.
    let cp = world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("cp-0", names::STATUS_DONE).await;
    let admin = discover(&cp);
    let admin = admin.entry("admin.conf").unwrap();
    assert_eq!(
        admin.certificate.issuer,
        world.cas.cluster.info().subject,
        "signed by the cluster CA"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_endpoint_pointing_at_another_node_is_refused() {
    let mut world = world(fast()).await;
    let a = world
        .add_machine("a", NodeRole::Worker, "cp.example", None)
        .await;
    let b = world
        .add_machine("b", NodeRole::Worker, "cp.example", None)
        .await;
    let (before_a, before_b) = (discover(&a), discover(&b));
    // Machine a's endpoint annotation now points at node b's agent.
    let b_url = world.agents[1].url.clone();
    world.annotate("a", names::AGENT_ENDPOINT, &b_url).await;

    let message = refused(&world, "a").await;
    assert!(
        message.contains("is not this Machine's node's agent") && message.contains("node-a"),
        "{message}"
    );
    assert_unchanged(&a, &before_a);
    assert_unchanged(&b, &before_b);
    assert_eq!(
        world.staged_plans("b"),
        0,
        "node b was never asked for a plan"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_ca_secret_signs_the_next_refresh() {
    let mut world = world(fast()).await;
    let layout = world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("cp-0", names::STATUS_DONE).await;
    assert!(world.ctx.credentials.is_loaded(NS, "c1").await);

    // A front-proxy CA rotation: the new CA is trusted on the node, then put in the Secret.
    let rotated = CertificateAuthority::create(&CaSpec::new("front-proxy-ca")).unwrap();
    files::write_atomic(
        &layout.pki_dir.join("front-proxy-ca.crt"),
        rotated.certificate_pem().as_bytes(),
        files::CERTIFICATE_MODE,
    )
    .unwrap();
    let secrets: Api<Secret> = Api::namespaced(world.client.clone(), NS);
    let data = json!({ "data": {
        "tls.crt": ByteString(rotated.certificate_pem().into_bytes()),
        "tls.key": ByteString(rotated.private_key_pem().into_bytes()),
    }});
    secrets
        .patch("c1-proxy", &PatchParams::default(), &Patch::Merge(&data))
        .await
        .unwrap();
    // The operator's Secret watch drops the cached CAs.
    let mut forgotten = false;
    for _ in 0..200 {
        if !world.ctx.credentials.is_loaded(NS, "c1").await {
            forgotten = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(forgotten, "the changed CA Secret was noticed");

    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "2y")
        .await;
    // Done again: the status of the first request is `done` too, so wait for the trigger to go.
    let mut refreshed = false;
    for _ in 0..400 {
        let annotations = world.annotations("cp-0").await;
        if !annotations.contains_key(names::REFRESH_CERTIFICATES) {
            assert_eq!(
                annotations[names::REFRESH_CERTIFICATES_STATUS],
                names::STATUS_DONE
            );
            refreshed = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(refreshed, "{:?}", world.annotations("cp-0").await);
    let inventory = discover(&layout);
    let proxy = &inventory.entry("front-proxy-client").unwrap().certificate;
    assert_eq!(
        proxy.authority_key_id,
        rotated.info().subject_key_id,
        "signed by the rotated front-proxy CA"
    );
    let kubelet = &inventory.entry("kubelet.conf").unwrap().certificate;
    assert_eq!(
        kubelet.authority_key_id,
        world.cas.cluster.info().subject_key_id,
        "the cluster CA did not change"
    );
}
