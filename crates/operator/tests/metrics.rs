//! `/metrics`, `/healthz` and `/readyz` served on ephemeral loopback ports and read with a real
//! HTTP client: readiness follows the operator's caches, a scrape shows the Machine controller
//! at work on the embedded API server, and what is not a scrape or a probe is refused, within
//! bounds.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_apiserver::TestServer;
use caretaker_operator::metrics::{
    self, Limits, Metrics, Readiness, mutual_tls, serve_health, serve_metrics, serve_metrics_tls,
};
use caretaker_operator::timestamp::parse_time;
use caretaker_operator::{Context, controllers};
use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request, StatusCode};
use hyper_util::rt::TokioIo;
use kube::api::DeleteParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use common::openmetrics::{self, Exposition};
use common::{fast, world};

/// Serves `/metrics` on an ephemeral loopback port.
async fn metrics_server(metrics: Arc<Metrics>, limits: Limits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(serve_metrics(listener, metrics, limits));
    address
}

/// Serves `/healthz` and `/readyz` on an ephemeral loopback port.
async fn health_server(readiness: Arc<Readiness>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(serve_health(listener, readiness, Limits::default()));
    address
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

/// One request over a new HTTP/1.1 connection, with hyper's client.
async fn request(address: SocketAddr, method: &str, path: &str, body: &str) -> Answer {
    let stream = TcpStream::connect(address).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("host", address.to_string())
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn get(address: SocketAddr, path: &str) -> Answer {
    request(address, "GET", path, "").await
}

/// A scrape, checked to be the OpenMetrics text format.
async fn scrape(address: SocketAddr) -> Exposition {
    let answer = get(address, "/metrics").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.body);
    assert_eq!(answer.headers["content-type"], metrics::CONTENT_TYPE);
    openmetrics::parse(&answer.body).unwrap_or_else(|e| panic!("{e}\n{}", answer.body))
}

/// Polls `check` every 100 ms for up to `within`.
async fn eventually<T>(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(started.elapsed() < within, "never: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_503_until_the_caches_have_synced() {
    let server = TestServer::start().await;
    let client = server.client();
    let ctx = Context::new(client.clone(), fast());
    let health = health_server(ctx.readiness.clone()).await;
    let healthz = get(health, "/healthz").await;
    assert_eq!(
        (healthz.status, healthz.body.as_str()),
        (StatusCode::OK, "ok\n")
    );
    let readyz = get(health, "/readyz").await;
    assert_eq!(readyz.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        readyz.body,
        "[-]caches: not synced yet\nreadyz check failed\n"
    );
    assert_eq!(readyz.headers["cache-control"], "no-store");

    // Once the controllers run, the first list fills the caches.
    caretaker_testkit::capi_objects::install_upstream_crds(&client)
        .await
        .unwrap();
    let controllers = tokio::spawn(controllers::run(ctx.clone(), None));
    eventually(Duration::from_secs(60), "/readyz answers 200", async || {
        let readyz = get(health, "/readyz").await;
        (readyz.status == StatusCode::OK).then_some(readyz.body)
    })
    .await;
    assert!(ctx.readiness.is_ready());
    controllers.abort();
}

/// A cluster without Cluster API (one that only uses caretaker's CAs) is ready too: the
/// Machine controllers wait there for CRDs that may never come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_answers_200_without_cluster_api() {
    let server = TestServer::start().await;
    let ctx = Context::new(server.client(), fast());
    let health = health_server(ctx.readiness.clone()).await;
    let controllers = tokio::spawn(controllers::run(ctx.clone(), None));
    eventually(Duration::from_secs(30), "/readyz answers 200", async || {
        let readyz = get(health, "/readyz").await;
        (readyz.status == StatusCode::OK).then_some(())
    })
    .await;
    controllers.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_shows_the_machine_controller_at_work() {
    let mut world = world(fast()).await;
    let metrics = metrics_server(world.ctx.metrics.clone(), Limits::default()).await;
    world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    let machine_expiry = [
        ("kind", "Machine"),
        ("namespace", common::NS),
        ("name", "cp-0"),
    ];
    let expiry_of = async |world: &common::World| -> f64 {
        let annotations = world.annotations("cp-0").await;
        let expiry = parse_time(
            annotations
                .get(names::CERTIFICATES_EXPIRY)
                .map(String::as_str),
        );
        expiry.expect("an expiry annotation").unix_timestamp() as f64
    };

    // The Machine's expiry, as its annotation says, once the controller has observed it.
    let first = eventually(
        Duration::from_secs(30),
        "the Machine's expiry series",
        async || {
            scrape(metrics)
                .await
                .get("caretaker_certificate_expiration_seconds", &machine_expiry)
        },
    )
    .await;
    let exposition = scrape(metrics).await;
    assert_eq!(first, expiry_of(&world).await);
    let machine = [("controller", "machine")];
    assert!(
        exposition
            .get("caretaker_reconcile_total", &machine)
            .unwrap()
            >= 1.0
    );
    assert!(
        exposition
            .get("caretaker_reconcile_duration_seconds_count", &machine)
            .unwrap()
            >= 1.0
    );
    assert!(
        exposition
            .get("caretaker_reconcile_total", &[("controller", "rollout")])
            .unwrap()
            >= 1.0,
        "the Cluster's rollout controller reconciled too"
    );
    assert_eq!(
        exposition.get(
            "caretaker_certificate_rotations_total",
            &[("kind", "Machine")]
        ),
        Some(0.0)
    );
    assert!(
        exposition.series("caretaker_ca_expiration_days").is_empty(),
        "no CertificateAuthority here"
    );

    // A refresh counts one rotation, and moves the expiry.
    world
        .annotate("cp-0", names::REFRESH_CERTIFICATES, "1y")
        .await;
    world.wait_status("cp-0", names::STATUS_DONE).await;
    let refreshed = expiry_of(&world).await;
    assert!(refreshed > first);
    let exposition = eventually(Duration::from_secs(30), "the new expiry", async || {
        let exposition = scrape(metrics).await;
        (exposition.get("caretaker_certificate_expiration_seconds", &machine_expiry)
            == Some(refreshed))
        .then_some(exposition)
    })
    .await;
    assert_eq!(
        exposition.get(
            "caretaker_certificate_rotations_total",
            &[("kind", "Machine")]
        ),
        Some(1.0)
    );
    assert!(
        exposition
            .series("caretaker_certificate_rotation_failures_total")
            .is_empty()
    );

    // A deleted Machine drops its series.
    world
        .machines()
        .delete("cp-0", &DeleteParams::default())
        .await
        .unwrap();
    eventually(Duration::from_secs(30), "the series is gone", async || {
        let exposition = scrape(metrics).await;
        exposition
            .series("caretaker_certificate_expiration_seconds")
            .is_empty()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn what_is_not_a_scrape_is_refused() {
    let metrics = metrics_server(Metrics::new(), Limits::default()).await;
    let answer = get(metrics, "/nope").await;
    assert_eq!(answer.status, StatusCode::NOT_FOUND);
    assert_eq!(answer.body, "nothing at /nope; served: /metrics\n");
    assert_eq!(get(metrics, "/healthz").await.status, StatusCode::NOT_FOUND);
    for method in ["POST", "PUT", "DELETE", "PATCH", "OPTIONS"] {
        let answer = request(metrics, method, "/metrics", "").await;
        assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(answer.headers["allow"], "GET, HEAD");
    }
    let answer = request(metrics, "POST", "/metrics", "{\"a\": 1}").await;
    assert_eq!(answer.status, StatusCode::METHOD_NOT_ALLOWED);
    let answer = request(metrics, "GET", "/metrics", "a body").await;
    assert_eq!(answer.status, StatusCode::PAYLOAD_TOO_LARGE);
    let head = request(metrics, "HEAD", "/metrics", "").await;
    assert_eq!((head.status, head.body.as_str()), (StatusCode::OK, ""));

    let health = health_server(Readiness::new()).await;
    assert_eq!(get(health, "/metrics").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        request(health, "POST", "/readyz", "").await.status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

/// Sends `head` on a new connection and reads until the server closes it (or 10 s pass).
async fn raw(address: SocketAddr, head: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    // The server may close before it has read everything: what it answered still counts.
    let _ = stream.write_all(head).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}

#[tokio::test]
async fn huge_request_heads_are_refused() {
    let metrics = metrics_server(Metrics::new(), Limits::default()).await;
    let big = format!(
        "GET /metrics HTTP/1.1\r\nhost: x\r\nx-filler: {}\r\n\r\n",
        "a".repeat(9 * 1024)
    );
    let answer = raw(metrics, big.as_bytes()).await;
    assert!(
        answer.starts_with("HTTP/1.1 431 "),
        "a head over 8 KiB: {answer}"
    );
    let many: String = (0..40).map(|i| format!("x-{i}: y\r\n")).collect();
    let answer = raw(
        metrics,
        format!("GET /metrics HTTP/1.1\r\nhost: x\r\n{many}\r\n").as_bytes(),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 431 "), "40 headers: {answer}");
    // A megabyte without an end of head: cut off, never read whole.
    let answer = raw(metrics, &vec![b'a'; 1024 * 1024]).await;
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 4"),
        "{answer}"
    );
    let answer = raw(
        metrics,
        b"POST /metrics HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000000\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    let answer = raw(
        metrics,
        b"GET /metrics HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 413 "), "{answer}");
    // Still serving.
    scrape(metrics).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_keep_a_scrape_out() {
    let limits = Limits::default();
    let metrics = metrics_server(Metrics::new(), limits).await;
    let mut idle = Vec::new();
    for _ in 0..500 {
        idle.push(TcpStream::connect(metrics).await.unwrap());
    }
    let started = Instant::now();
    scrape(metrics).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the scrape took {:?}",
        started.elapsed()
    );
    // The server keeps at most its limit of them: the others were closed to make room.
    let reads = idle.into_iter().map(|mut stream| async move {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(2), stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    });
    let closed = futures::future::join_all(reads)
        .await
        .into_iter()
        .filter(|closed| *closed)
        .count();
    assert!(
        closed >= 500 - limits.max_connections,
        "only {closed} of 500 idle connections were closed"
    );
}

#[tokio::test]
async fn idle_and_slow_connections_are_closed() {
    let limits = Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    };
    let metrics = metrics_server(Metrics::new(), limits).await;
    let closed_after = async |stream: &mut TcpStream| -> Duration {
        let started = Instant::now();
        let mut sink = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink))
            .await
            .expect("the server closes the connection")
            .ok();
        started.elapsed()
    };

    // Says nothing.
    let mut silent = TcpStream::connect(metrics).await.unwrap();
    assert!(closed_after(&mut silent).await < Duration::from_secs(2));

    // Sends its head a byte at a time, too slowly to finish in time.
    let mut slow = TcpStream::connect(metrics).await.unwrap();
    let trickle = tokio::spawn(async move {
        let started = Instant::now();
        for byte in b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n" {
            if slow.write_all(&[*byte]).await.is_err() {
                return (started.elapsed(), true);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut answer = Vec::new();
        let _ = slow.read_to_end(&mut answer).await;
        (started.elapsed(), answer.is_empty())
    });
    let (took, refused) = trickle.await.unwrap();
    assert!(refused, "the slow head got an answer");
    assert!(took < Duration::from_secs(3), "{took:?}");

    // Keeps its connection open after an answer, and then says nothing more.
    let mut kept = TcpStream::connect(metrics).await.unwrap();
    kept.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = [0u8; 12];
    kept.read_exact(&mut answer).await.unwrap();
    assert_eq!(&answer, b"HTTP/1.1 200");
    assert!(closed_after(&mut kept).await < Duration::from_secs(2));
}

#[tokio::test]
async fn a_scrape_is_the_text_format_prometheus_reads() {
    let metrics = Metrics::new();
    metrics.set_certificate_expiry(
        metrics::CertificateKind::CertificateAuthority,
        "",
        "webhooks",
        time::OffsetDateTime::now_utc() + time::Duration::days(3650),
    );
    metrics.reconciled("machine", Duration::from_millis(3));
    let address = metrics_server(metrics, Limits::default()).await;
    let exposition = scrape(address).await;
    let days = exposition
        .get("caretaker_ca_expiration_days", &[("name", "webhooks")])
        .unwrap();
    assert!((3649.9..=3650.0).contains(&days), "{days}");
    assert_eq!(
        exposition.get("caretaker_reconcile_total", &[("controller", "machine")]),
        Some(1.0)
    );
}

/// docs/reference.md lists every family a scrape can show, with its type.
#[test]
fn the_reference_lists_every_metric() {
    let reference = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/reference.md"),
    )
    .unwrap();
    let section = reference
        .split("## Metrics and health probes (`caretaker operator`)")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/reference.md has a section on metrics");
    let metrics = Metrics::new();
    let error = caretaker_operator::Error::CacheStopped;
    metrics.set_certificate_expiry(
        metrics::CertificateKind::CertificateAuthority,
        "",
        "ca",
        time::OffsetDateTime::now_utc(),
    );
    metrics.rotation_failed(metrics::CertificateKind::Machine, &error);
    metrics.reconciled("machine", Duration::from_millis(1));
    metrics.reconcile_failed("machine", &error);
    let progress = caretaker_operator::rollout::Progress {
        done: 0,
        total: 1,
        skipped: 0,
        running: 1,
    };
    metrics.set_rollout_progress(
        "Cluster",
        "default",
        "c1",
        "refresh-certificates",
        progress.by_state(),
    );
    metrics.set_rollout_status(
        "Cluster",
        "default",
        "c1",
        "refresh-certificates",
        Some("failed"),
    );
    metrics.set_degraded("CertificateAuthority", "", "ca", true);
    let exposition = openmetrics::parse(&metrics.encode()).unwrap();
    assert_eq!(exposition.types.len(), 14);
    for (family, kind) in &exposition.types {
        let name = match kind.as_str() {
            "counter" => format!("{family}_total"),
            _ => family.clone(),
        };
        assert!(
            section.contains(&format!("| `{name}` | {kind} |")),
            "{name} ({kind}) is not in the reference"
        );
    }
    for category in ["kube", "cache_stopped", "signing_refused"] {
        assert!(section.contains(&format!("`{category}`")), "{category}");
    }
}

/// GET `/metrics` over TLS with `client`: the status, or why there was none.
async fn get_over_tls(
    address: SocketAddr,
    client: rustls::ClientConfig,
) -> Result<StatusCode, String> {
    let stream = TcpStream::connect(address).await.unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector
        .connect(name, stream)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| format!("HTTP: {e}"))?;
    tokio::spawn(connection);
    let request = Request::get("/metrics")
        .header("host", "127.0.0.1")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .map_err(|_| "no answer in 10 s".to_string())?
        .map_err(|e| format!("request: {e}"))?;
    Ok(response.status())
}

#[tokio::test]
async fn over_mutual_tls_only_clients_of_the_ca_are_answered() {
    caretaker_agent_api::tls::install_crypto_provider();
    let ca = CertificateAuthority::create(&CaSpec::new("metrics-ca")).unwrap();
    let serving = ca
        .issue(
            &LeafSpec::new("caretaker-metrics", Usage::Server)
                .with_ip_addresses(["127.0.0.1".parse().unwrap()]),
        )
        .unwrap();
    let tls = mutual_tls(
        &serving.certificate_pem,
        &serving.key.as_ref().unwrap().to_pem(),
        &ca.certificate_pem(),
    )
    .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(serve_metrics_tls(
        listener,
        Metrics::new(),
        Limits::default(),
        tls,
    ));

    let client_of = |ca: &CertificateAuthority| {
        let pair = ca
            .issue(&LeafSpec::new("prometheus", Usage::Client))
            .unwrap();
        caretaker_agent_api::tls::ClientIdentity::from_pem(
            &ca.certificate_pem(),
            &pair.certificate_pem,
            &pair.key.unwrap().to_pem(),
        )
        .unwrap()
    };
    // A client of the CA: answered.
    let prometheus = client_of(&ca).config().unwrap();
    assert_eq!(get_over_tls(address, prometheus).await, Ok(StatusCode::OK));

    // No client certificate, or one of another CA: refused, whatever the request.
    let roots = caretaker_agent_api::tls::roots(&ca.certificate_pem()).unwrap();
    let anonymous = rustls::ClientConfig::builder()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    let refused = get_over_tls(address, anonymous).await;
    assert!(refused.is_err(), "{refused:?}");
    // It trusts the server's CA, but presents a certificate of another CA.
    let other = CertificateAuthority::create(&CaSpec::new("other-ca")).unwrap();
    let pair = other
        .issue(&LeafSpec::new("prometheus", Usage::Client))
        .unwrap();
    let stranger_config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(
            caretaker_agent_api::tls::certificates(&pair.certificate_pem, "c").unwrap(),
            caretaker_agent_api::tls::private_key(&pair.key.unwrap().to_pem()).unwrap(),
        )
        .unwrap();
    let refused = get_over_tls(address, stranger_config).await;
    assert!(refused.is_err(), "{refused:?}");
    // Plain HTTP: no answer.
    let answer = raw(address, b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n").await;
    assert!(!answer.contains("HTTP/1.1 200"), "{answer}");

    // Bad PEM is refused at start, naming what is wrong, never the key.
    let error =
        mutual_tls(&serving.certificate_pem, "not a key", &ca.certificate_pem()).unwrap_err();
    assert!(error.contains("private key"), "{error}");
    let error = mutual_tls(
        &serving.certificate_pem,
        &serving.key.as_ref().unwrap().to_pem(),
        "no CA",
    )
    .unwrap_err();
    assert!(error.starts_with("client CA: "), "{error}");
}
