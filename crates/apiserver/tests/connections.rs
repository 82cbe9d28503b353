//! What idle and slow connections cost the server: connections that never start TLS, never
//! finish a request head or sit idle after one are closed, and a crowd of them cannot keep a
//! well-behaved client (`/healthz`) out. The limits are short here; the defaults are 10 s
//! (handshake), 30 s (request head), 90 s (idle) and 1,024 connections.

use std::time::Duration;

use caretaker_apiserver::{ApiServer, ConnectionLimits};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod common;
use common::RawHttp;

const LIMITS: ConnectionLimits = ConnectionLimits {
    handshake_timeout: Duration::from_secs(1),
    header_read_timeout: Duration::from_secs(1),
    idle_timeout: Duration::from_secs(2),
    max_connections: 16,
};

/// How long a test waits for the server to close a connection before calling it a hang:
/// far longer than any limit above, so that a slow machine does not fail the test.
const HANG: Duration = Duration::from_secs(30);

async fn server(tls: bool) -> ApiServer {
    ApiServer::builder()
        .tls(tls)
        .connection_limits(LIMITS)
        .start()
        .await
        .expect("start the API server")
}

/// Waits until the server closes `stream` (end of stream or reset); panics after [`HANG`].
async fn closed_by_server(stream: &mut TcpStream, what: &str) {
    let mut buf = [0u8; 1024];
    let closed = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(HANG, closed)
        .await
        .unwrap_or_else(|_| panic!("the server kept {what} open for {HANG:?}"));
}

async fn healthz(server: &ApiServer) -> String {
    server
        .client()
        .request_text(http::Request::get("/healthz").body(vec![]).unwrap())
        .await
        .expect("/healthz answers")
}

/// The reported attack: connections that never send a ClientHello stayed open for good, until
/// the server ran out of file descriptors and `/healthz` timed out.
#[tokio::test]
async fn connections_that_never_start_tls_are_closed_and_healthz_still_answers() {
    let server = server(true).await;
    // Three times the connection limit, none of them saying anything.
    let mut silent = Vec::new();
    for _ in 0..3 * LIMITS.max_connections {
        silent.push(TcpStream::connect(server.addr()).await.unwrap());
    }
    // A well-behaved client gets in while they are open: each new connection over the limit
    // closes the oldest one still in its handshake.
    assert_eq!(healthz(&server).await, "ok");
    // Every silent one is closed: those over the limit to make room, the rest when their
    // handshake time is up (nothing else would close the last ones).
    for (i, stream) in silent.iter_mut().enumerate() {
        closed_by_server(stream, &format!("silent connection {i}")).await;
    }
    assert_eq!(healthz(&server).await, "ok");
}

/// Slowloris: half a request line, then nothing.
#[tokio::test]
async fn a_request_head_that_never_ends_is_cut_off() {
    let server = server(false).await;
    let mut slow = TcpStream::connect(server.addr()).await.unwrap();
    slow.write_all(b"GET /healthz HT").await.unwrap();
    closed_by_server(&mut slow, "a connection with half a request line").await;

    // HTTP/2's equivalent: the connection preface and no frame after it.
    let mut slow = TcpStream::connect(server.addr()).await.unwrap();
    slow.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    closed_by_server(&mut slow, "an HTTP/2 connection that sent only its preface").await;

    assert_eq!(healthz(&server).await, "ok");
}

/// An HTTP/2 connection that has made its requests and stays open doing nothing is closed
/// (with a GOAWAY, so that its client opens a new one for its next request).
#[tokio::test]
async fn an_idle_http2_connection_is_closed() {
    let server = server(false).await;
    let stream = TcpStream::connect(server.addr()).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    let connection = tokio::spawn(connection);
    let request = http::Request::get(format!("{}/healthz", server.url()))
        .body(Empty::<bytes::Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"ok");
    tokio::time::timeout(HANG, connection)
        .await
        .expect("the server kept an idle HTTP/2 connection open")
        .unwrap()
        .expect("the connection ended cleanly, with a GOAWAY");
}

/// A request in progress is not idleness: a watch that outlasts every limit still gets its
/// events.
#[tokio::test]
async fn a_watch_outlives_the_idle_limits() {
    let server = server(false).await;
    let configmaps: Api<ConfigMap> = Api::namespaced(server.client(), "default");
    let rv = server.resource_version();
    let http = RawHttp::new(server.url());
    let watch = tokio::spawn(async move {
        http.stream_lines(&format!(
            "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}&timeoutSeconds=8"
        ))
        .await
    });
    // Longer than the request head and idle limits together.
    tokio::time::sleep(LIMITS.header_read_timeout + LIMITS.idle_timeout + Duration::from_secs(1))
        .await;
    let late: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "late"}})).unwrap();
    configmaps
        .create(&PostParams::default(), &late)
        .await
        .unwrap();
    let lines = watch.await.unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"ADDED\"") && l.contains("\"late\"")),
        "{lines:?}"
    );
}
