//! A hostile host floods the agent with idle connections; the operator is still served.

use std::time::Duration;

use caretaker_agent::api::{AgentClient, ServeLimits, serve_with};
use caretaker_agent::provision::agent_serving_leaf;
use caretaker_agent::tls::{self, ClientIdentity};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};

#[tokio::test]
async fn one_flooding_peer_cannot_take_every_slot() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let serving = ca
        .issue(&agent_serving_leaf(
            "node-a",
            &["127.0.0.1".parse().unwrap()],
        ))
        .unwrap();
    let config = tls::server_config(
        &serving.certificate_pem,
        &serving.key.unwrap().to_pem(),
        &ca.certificate_pem(),
        tls::DEFAULT_ALLOWED_CLIENT,
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    // Idle connections hold their slot for the whole handshake timeout: far longer than the
    // operator's client waits below.
    let limits = ServeLimits {
        max_connections: 16,
        max_connections_per_peer: 4,
        handshake_timeout: Duration::from_secs(120),
        ..ServeLimits::default()
    };
    let router = axum::Router::new().route(
        "/v1/health",
        axum::routing::get(|| async {
            axum::Json(serde_json::json!({ "status": "ok", "version": "test" }))
        }),
    );
    tokio::spawn(serve_with(listener, config, router, limits));

    // The flood comes from another loopback address, as from another host: more connections
    // than the agent serves at once, each sending nothing.
    let mut flood = Vec::new();
    for _ in 0..40 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        flood.push(socket.connect(address).await.unwrap());
    }

    let pair = ca
        .issue(&LeafSpec::new(tls::DEFAULT_ALLOWED_CLIENT, Usage::Client))
        .unwrap();
    let identity = ClientIdentity::from_pem(
        &ca.certificate_pem(),
        &pair.certificate_pem,
        &pair.key.unwrap().to_pem(),
    )
    .unwrap();
    let operator =
        AgentClient::for_node(&identity, &["node-a".into()], Duration::from_secs(10)).unwrap();
    let url = format!("https://{address}");
    operator
        .health(&url)
        .await
        .expect("the operator is served beside the flood");
    drop(flood);
}
