//! The agent API between a hostile party and the operator: an agent of another node (its
//! serving certificate does not name the node the operator meant), one whose certificate
//! chains to another CA, one that answers with an endless body, and a host flooding a real
//! agent with idle connections.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::routing::get;
use caretaker_agent::server::{ServeLimits, serve_with};
use caretaker_agent::tls;
use caretaker_agent_api::client::{AgentClient, AgentError, MAX_REPLY_BYTES};
use caretaker_agent_api::tls::{ClientIdentity, DEFAULT_ALLOWED_CLIENT};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use caretaker_testkit::provision::agent_serving_leaf;

/// Serves `router` with mutual TLS as node `node` (address 127.0.0.1) under `ca`.
async fn start(ca: &CertificateAuthority, node: &str, router: Router) -> String {
    start_with(ca, node, router, ServeLimits::default()).await
}

/// [`start`] with these connection limits.
async fn start_with(
    ca: &CertificateAuthority,
    node: &str,
    router: Router,
    limits: ServeLimits,
) -> String {
    let serving = ca
        .issue(&agent_serving_leaf(node, &["127.0.0.1".parse().unwrap()]))
        .unwrap();
    let config = tls::server_config(
        &serving.certificate_pem,
        &serving.key.unwrap().to_pem(),
        &ca.certificate_pem(),
        DEFAULT_ALLOWED_CLIENT,
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "https://127.0.0.1:{}",
        listener.local_addr().unwrap().port()
    );
    tokio::spawn(serve_with(listener, config, router, limits));
    url
}

fn operator_identity(ca: &CertificateAuthority) -> ClientIdentity {
    let pair = ca
        .issue(&LeafSpec::new(DEFAULT_ALLOWED_CLIENT, Usage::Client))
        .unwrap();
    ClientIdentity::from_pem(
        &ca.certificate_pem(),
        &pair.certificate_pem,
        &pair.key.unwrap().to_pem(),
    )
    .unwrap()
}

fn client_for(identity: &ClientIdentity, names: &[&str]) -> AgentClient {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    AgentClient::for_node(identity, &names, Duration::from_secs(10)).unwrap()
}

fn health_router() -> Router {
    Router::new().route(
        "/v1/health",
        get(|| async { axum::Json(serde_json::json!({ "status": "ok", "version": "test" })) }),
    )
}

#[tokio::test]
async fn only_the_named_nodes_agent_is_accepted() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let identity = operator_identity(&ca);
    let url = start(&ca, "node-b", health_router()).await;

    // By the node's name, or by an address in its certificate, whatever the URL says.
    for names in [&["node-b"][..], &["node-a", "127.0.0.1"]] {
        client_for(&identity, names).health(&url).await.unwrap();
    }
    // Another node's names: refused in the handshake, before any request is sent.
    let err = client_for(&identity, &["node-a", "10.0.0.7"])
        .health(&url)
        .await
        .unwrap_err();
    match &err {
        AgentError::NotTheNode { mismatch, .. } => {
            assert_eq!(mismatch.expected, ["node-a", "10.0.0.7"]);
        }
        other => panic!("expected NotTheNode, got {other:?}"),
    }
    assert!(!err.is_transient(), "asking again cannot help");
    assert!(err.to_string().contains("node-a, 10.0.0.7"), "{err}");

    // A certificate naming the node but from another CA is a plain TLS failure, not a match.
    let other_ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let impostor = start(&other_ca, "node-a", health_router()).await;
    let err = client_for(&identity, &["node-a"])
        .health(&impostor)
        .await
        .unwrap_err();
    assert!(matches!(err, AgentError::Tls { .. }), "{err:?}");
}

#[tokio::test]
async fn an_endless_reply_is_cut_off_at_the_limit() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    // A fake agent that would send 3 GiB; it counts what it managed to hand over.
    let sent = Arc::new(AtomicUsize::new(0));
    let counter = sent.clone();
    let router = Router::new().route(
        "/v1/health",
        get(move || {
            let counter = counter.clone();
            async move {
                const CHUNK: usize = 64 * 1024;
                let chunks = (3usize << 30) / CHUNK;
                let stream = counted_zeros(chunks, CHUNK, counter);
                Body::from_stream(stream)
            }
        }),
    );
    let url = start(&ca, "node-a", router).await;
    let identity = operator_identity(&ca);
    let err = client_for(&identity, &["node-a"])
        .health(&url)
        .await
        .unwrap_err();
    assert!(
        matches!(err, AgentError::ReplyTooLarge { limit, .. } if limit == MAX_REPLY_BYTES),
        "{err:?}"
    );
    assert!(!err.is_transient());
    // The client stopped reading: the server could hand over little beyond the limit (what the
    // socket buffers hold), nowhere near the 3 GiB it offered.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let handed_over = sent.load(Ordering::SeqCst);
    assert!(
        handed_over < 64 * MAX_REPLY_BYTES,
        "{handed_over} bytes were produced"
    );
}

/// A stream of `chunks` chunks of `size` zero bytes that counts what is taken from it.
fn counted_zeros(
    chunks: usize,
    size: usize,
    counter: Arc<AtomicUsize>,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let chunk = Bytes::from(vec![0u8; size]);
    futures::stream::iter((0..chunks).map(move |_| {
        counter.fetch_add(size, Ordering::SeqCst);
        Ok(chunk.clone())
    }))
}

#[tokio::test]
async fn one_flooding_peer_cannot_take_every_slot() {
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    // Idle connections hold their slot for the whole handshake timeout: far longer than the
    // operator's client waits below.
    let limits = ServeLimits {
        max_connections: 16,
        max_connections_per_peer: 4,
        handshake_timeout: Duration::from_secs(120),
        ..ServeLimits::default()
    };
    let url = start_with(&ca, "node-a", health_router(), limits).await;
    let address: std::net::SocketAddr = url.trim_start_matches("https://").parse().unwrap();

    // The flood comes from another loopback address, as from another host: more connections
    // than the agent serves at once, each sending nothing.
    let mut flood = Vec::new();
    for _ in 0..40 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        flood.push(socket.connect(address).await.unwrap());
    }
    client_for(&operator_identity(&ca), &["node-a"])
        .health(&url)
        .await
        .expect("the operator is served beside the flood");
    drop(flood);
}

/// A TCP relay in front of `agent` that counts the connections made through it; `cut` closes
/// every connection open through it so far.
struct Relay {
    url: String,
    connections: Arc<AtomicUsize>,
    open: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Relay {
    async fn start(agent: &str) -> Self {
        let target = agent.trim_start_matches("https://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!(
            "https://127.0.0.1:{}",
            listener.local_addr().unwrap().port()
        );
        let connections = Arc::new(AtomicUsize::new(0));
        let open: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (counted, tasks) = (connections.clone(), open.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let target = target.clone();
                tasks.lock().unwrap().push(tokio::spawn(async move {
                    let mut outbound = tokio::net::TcpStream::connect(target).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }));
            }
        });
        Relay {
            url,
            connections,
            open,
        }
    }

    fn cut(&self) {
        for task in self.open.lock().unwrap().drain(..) {
            task.abort();
        }
    }
}

/// The plan status an agent reports for any plan id: `applying`.
fn plan_status_router() -> Router {
    Router::new().route(
        "/v1/certificates/plans/{id}",
        get(|| async { axum::Json(serde_json::json!({ "state": "applying" })) }),
    )
}

#[tokio::test]
async fn a_session_makes_its_calls_over_one_connection_and_replaces_one_the_agent_closed() {
    use caretaker_agent_api::refresh::PlanStatus;
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let identity = operator_identity(&ca);
    let agent = start(&ca, "node-a", plan_status_router()).await;
    let relay = Relay::start(&agent).await;
    let client = client_for(&identity, &["node-a"]);

    let mut session = client.session(&relay.url);
    for _ in 0..3 {
        assert_eq!(
            session.plan_status("p1").await.unwrap(),
            PlanStatus::Applying
        );
    }
    assert_eq!(
        relay.connections.load(Ordering::SeqCst),
        1,
        "one handshake for three calls"
    );

    // The connection goes away between two calls (the agent restarted, say): the next call
    // goes on a new one, and still gets its answer.
    relay.cut();
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        session.plan_status("p1").await.unwrap(),
        PlanStatus::Applying
    );
    assert_eq!(relay.connections.load(Ordering::SeqCst), 2);

    // A call outside a session has a connection of its own, as before.
    drop(session);
    client.plan_status(&relay.url, "p1").await.unwrap();
    client.plan_status(&relay.url, "p1").await.unwrap();
    assert_eq!(relay.connections.load(Ordering::SeqCst), 4);
}

/// Issue 34, L3: a hostile agent echoes a member name of almost 1 MiB (within the reply
/// limit), and answers an error with a message as long: the name is refused with an error
/// that says so without repeating it, and the message is cut to a bound, saying how much was
/// cut (both end up in status, events and logs). Before, both were taken whole.
#[tokio::test]
async fn echoed_member_names_and_error_messages_are_bounded() {
    use caretaker_agent_api::client::MAX_MESSAGE_BYTES;
    use caretaker_agent_api::etcd::MAX_MEMBER_NAME_BYTES;
    let ca = CertificateAuthority::create(&CaSpec::new("kubernetes")).unwrap();
    let long = "m".repeat(MAX_REPLY_BYTES - 1024);
    let (name, message) = (long.clone(), long.clone());
    let router = Router::new()
        .route(
            "/v1/etcd",
            get(move || {
                let name = name.clone();
                async move { axum::Json(serde_json::json!({"member": name, "revision": null})) }
            }),
        )
        .route(
            "/v1/health",
            get(move || {
                let message = message.clone();
                async move {
                    let body = serde_json::json!({"reason": "Internal", "message": message});
                    (
                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                        axum::Json(body),
                    )
                }
            }),
        );
    let url = start(&ca, "node-a", router).await;
    let client = client_for(&operator_identity(&ca), &["node-a"]);

    let err = client.etcd_installed(&url).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, AgentError::Protocol { .. }), "{err:?}");
    assert!(
        text.contains(&format!("over the {MAX_MEMBER_NAME_BYTES}")),
        "{text}"
    );
    assert!(
        text.len() < 512,
        "the name is not repeated: {} bytes",
        text.len()
    );

    let err = client.health(&url).await.unwrap_err();
    let AgentError::Status { message, .. } = &err else {
        panic!("expected a status error, got {err:?}");
    };
    assert!(
        message.len() < MAX_MESSAGE_BYTES + 64,
        "{} bytes",
        message.len()
    );
    assert!(
        message.ends_with("more bytes cut)"),
        "{}",
        &message[message.len() - 40..]
    );
}
