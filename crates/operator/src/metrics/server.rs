//! The plain-HTTP servers of `/metrics` ([`serve_metrics`], `--metrics-bind-address`) and of
//! `/healthz` and `/readyz` ([`serve_health`], `--health-probe-bind-address`).
//!
//! Plain HTTP, as controller-runtime serves them: kubelet's probes and a Prometheus scrape
//! speak it without any set-up, and these answers hold nothing secret (counts, durations,
//! expiry dates and the names of the objects they are about). What the project's rule, that
//! every endpoint refuses what is not its own, asks of a server without mutual TLS, they do:
//!
//! - They answer GET and HEAD on their own paths only: 404 for another path, 405 (with
//!   `Allow`) for another method on theirs.
//! - They take no body: a request that declares one (`Content-Length` above 0, or a
//!   `Transfer-Encoding`) gets 413 and its connection is closed unread.
//! - Request heads are bounded ([`Limits::max_header_bytes`], at most 32 headers): a larger one
//!   gets 431 and its connection is closed.
//! - A connection must send a whole request head within [`Limits::header_read_timeout`] of
//!   opening or of its last answer (idle keep-alive included), and must take its answer's
//!   bytes within [`Limits::write_timeout`], or it is closed.
//! - At most [`Limits::max_connections`] are open at once; a new one over the limit closes the
//!   oldest idle one (see [`caretaker_listener::Connections`]), so idle clients cannot keep a
//!   scrape or a probe out.
//!
//! Where the network is not trusted, bind `--metrics-bind-address` to `127.0.0.1:8080` (a
//! sidecar scrapes it), turn it off with `0`, or serve `/metrics` over mutual TLS
//! ([`serve_metrics_tls`] with a [`mutual_tls`] configuration): then only a client whose
//! certificate chains to the given CA gets past the handshake.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;

use super::{CONTENT_TYPE, Metrics};
use crate::answers::{closing, text};
use caretaker_listener::{Bounds, Connection};

/// Bounds on what clients may cost these servers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a connection may take to send a whole request head, counted from its opening
    /// or from its last answer: idle keep-alive connections are closed after it too. A
    /// Prometheus scrape or a kubelet probe sends its head at once.
    pub header_read_timeout: Duration,
    /// How long a write of an answer may wait on a client that reads nothing.
    pub write_timeout: Duration,
    /// How long a client may take to finish the TLS handshake (mutual TLS only).
    pub handshake_timeout: Duration,
    /// The largest request head (request line and headers) read, in bytes.
    pub max_header_bytes: usize,
    /// Connections open at once; see [`caretaker_listener::Connections`].
    pub max_connections: usize,
    /// How long to pause after a failed accept (out of file descriptors) before the next.
    pub accept_retry: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            max_header_bytes: 8 * 1024,
            max_connections: 64,
            accept_retry: Duration::from_millis(200),
        }
    }
}

/// What `/readyz` answers: ready once the operator's caches have had their first complete
/// list (the moment the controllers stop waiting on them), and from then on; or, with
/// `--leader-elect`, as soon as the replica stands by: a standby serves the webhook and
/// `/metrics` with no cache at all.
#[derive(Debug, Default)]
pub struct Readiness {
    caches_synced: AtomicBool,
    standing_by: AtomicBool,
}

impl Readiness {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The caches have synced.
    pub fn caches_synced(&self) {
        if !self.caches_synced.swap(true, Ordering::SeqCst) {
            tracing::info!("caches synced: /readyz answers 200");
        }
    }

    /// The replica stands by for the leader Lease.
    pub fn standing_by(&self) {
        if !self.standing_by.swap(true, Ordering::SeqCst) {
            tracing::info!("standing by for the leader Lease: /readyz answers 200");
        }
    }

    pub fn is_ready(&self) -> bool {
        self.caches_synced.load(Ordering::SeqCst) || self.standing_by.load(Ordering::SeqCst)
    }
}

/// Serves `/metrics` on `listener` until the task is dropped; never ends by itself.
pub async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>, limits: Limits) {
    serve(listener, Routes::Metrics(metrics), limits, None).await
}

/// The TLS configuration of `/metrics` over mutual TLS, made by [`mutual_tls`].
pub type TlsConfig = Arc<rustls::ServerConfig>;

/// [`serve_metrics`] over TLS with `tls`, made by [`mutual_tls`].
pub async fn serve_metrics_tls(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    limits: Limits,
    tls: TlsConfig,
) {
    let acceptor = TlsAcceptor::from(tls);
    serve(listener, Routes::Metrics(metrics), limits, Some(acceptor)).await
}

/// Serves `/healthz` and `/readyz` on `listener` until the task is dropped; never ends by
/// itself.
pub async fn serve_health(listener: TcpListener, readiness: Arc<Readiness>, limits: Limits) {
    serve(listener, Routes::Health(readiness), limits, None).await
}

/// A TLS configuration for `/metrics` (TLS 1.2 and 1.3, HTTP/1.1) serving `certificate_pem`
/// (leaf first) with `key_pem`, that takes only clients whose certificate chains to a CA of
/// `client_ca_pem`: a client without one, or with another, gets nothing but a TLS alert.
/// Errors name the PEM that is wrong, never repeating the key.
pub fn mutual_tls(
    certificate_pem: &str,
    key_pem: &str,
    client_ca_pem: &str,
) -> Result<TlsConfig, String> {
    use caretaker_agent_api::tls::{certificates, private_key, roots};
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let roots = roots(client_ca_pem).map_err(|e| format!("client CA: {e}"))?;
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
            .build()
            .map_err(|e| format!("client CA: {e}"))?;
    let chain =
        certificates(certificate_pem, "the serving certificate").map_err(|e| e.to_string())?;
    let key = private_key(key_pem).map_err(|e| e.to_string())?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| format!("serving certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What one server answers.
enum Routes {
    Metrics(Arc<Metrics>),
    Health(Arc<Readiness>),
}

const METRICS: &str = "/metrics";
const HEALTHZ: &str = "/healthz";
const READYZ: &str = "/readyz";

impl Routes {
    fn name(&self) -> &'static str {
        match self {
            Routes::Metrics(_) => "metrics",
            Routes::Health(_) => "health probes",
        }
    }

    fn paths(&self) -> &'static [&'static str] {
        match self {
            Routes::Metrics(_) => &[METRICS],
            Routes::Health(_) => &[HEALTHZ, READYZ],
        }
    }

    /// The answer to `request`; its body is never read.
    fn respond<B>(&self, request: &Request<B>) -> Response<Full<Bytes>> {
        let path = request.uri().path();
        if !self.paths().contains(&path) {
            return closing(text(
                StatusCode::NOT_FOUND,
                format!("nothing at {path}; served: {}", self.paths().join(", ")),
            ));
        }
        if request.method() != Method::GET && request.method() != Method::HEAD {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD".into());
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return closing(response);
        }
        if has_body(request) {
            return closing(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                "these requests take no body".into(),
            ));
        }
        match (self, path) {
            (Routes::Metrics(metrics), _) => {
                let mut response = Response::new(Full::new(Bytes::from(metrics.encode())));
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
                no_store(response)
            }
            (Routes::Health(readiness), READYZ) if !readiness.is_ready() => no_store(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "[-]caches: not synced yet\nreadyz check failed".into(),
            )),
            (Routes::Health(_), _) => no_store(text(StatusCode::OK, "ok".into())),
        }
    }
}

/// Whether the request declares a body: a `Content-Length` other than 0, or any
/// `Transfer-Encoding`.
fn has_body<B>(request: &Request<B>) -> bool {
    let headers = request.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get_all(header::CONTENT_LENGTH)
            .iter()
            .any(|length| length.as_bytes() != b"0")
}

async fn serve(listener: TcpListener, routes: Routes, limits: Limits, tls: Option<TlsAcceptor>) {
    let server = routes.name();
    if let Ok(address) = listener.local_addr() {
        let over = if tls.is_some() {
            "mutual TLS"
        } else {
            "plain HTTP"
        };
        tracing::info!(%address, paths = %routes.paths().join(" "), "{server}: serving over {over}");
    }
    let routes = Arc::new(routes);
    let bounds = Bounds {
        max_connections: limits.max_connections,
        // No per-peer limit: a scraper and the kubelet's probes are few, known clients.
        max_connections_per_peer: limits.max_connections,
        accept_retry: limits.accept_retry,
    };
    caretaker_listener::serve(listener, server, bounds, |stream, _, slot| {
        connection(stream, slot, routes.clone(), limits, tls.clone())
    })
    .await
}

async fn connection(
    stream: TcpStream,
    slot: Connection,
    routes: Arc<Routes>,
    limits: Limits,
    tls: Option<TlsAcceptor>,
) {
    let stream = WriteTimeout::new(stream, limits.write_timeout);
    let Some(acceptor) = tls else {
        // No handshake: the connection can be asked for a request at once.
        slot.established();
        return http(stream, slot, routes, limits).await;
    };
    match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => {
            slot.established();
            http(tls, slot, routes, limits).await
        }
        Ok(Err(e)) => tracing::info!(error = %e, "metrics: refused a TLS connection"),
        Err(_) => tracing::info!("metrics: a TLS handshake timed out"),
    }
}

/// Answers the requests of one connection, ready for them.
async fn http<I>(io: I, slot: Connection, routes: Arc<Routes>, limits: Limits)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        let busy = slot.busy();
        let response = routes.respond(&request);
        drop(busy);
        std::future::ready(Ok::<_, Infallible>(response))
    });
    let io = TokioIo::new(io);
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(32)
        // The smallest read buffer hyper allows; a request head is at most 8 KiB anyway.
        .max_buf_size(limits.max_header_bytes.max(8192))
        .serve_connection(io, service)
        .await;
    if let Err(e) = served {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// `response`, which no cache keeps: each answer is of its moment.
fn no_store(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A stream whose writes fail (`TimedOut`) once one has waited `limit` for the peer to take
/// data: a client that stops reading its answer loses its connection.
struct WriteTimeout<S> {
    inner: S,
    limit: Duration,
    /// Since when the pending write has been waiting, as the moment it gives up.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteTimeout<S> {
    fn new(inner: S, limit: Duration) -> Self {
        WriteTimeout {
            inner,
            limit,
            stalled: None,
        }
    }

    /// Passes on a write's result; a pending one gives up after the limit.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if result.is_ready() {
            self.stalled = None;
            return result;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no data for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    fn request(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut builder = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn only_get_and_head_on_known_paths_without_a_body() {
        let readiness = Readiness::new();
        let health = Routes::Health(readiness.clone());
        let status = |routes: &Routes, method: Method, path: &str, headers: &[(&str, &str)]| {
            routes.respond(&request(method, path, headers)).status()
        };
        assert_eq!(status(&health, Method::GET, HEALTHZ, &[]), StatusCode::OK);
        assert_eq!(status(&health, Method::HEAD, HEALTHZ, &[]), StatusCode::OK);
        assert_eq!(
            status(&health, Method::GET, READYZ, &[]),
            StatusCode::SERVICE_UNAVAILABLE
        );
        readiness.caches_synced();
        assert_eq!(status(&health, Method::GET, READYZ, &[]), StatusCode::OK);
        assert_eq!(
            status(&health, Method::GET, "/readyz?verbose", &[]),
            StatusCode::OK,
            "a query does not change the path"
        );
        assert_eq!(
            status(&health, Method::GET, METRICS, &[]),
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            status(&health, Method::GET, "/healthz/", &[]),
            StatusCode::NOT_FOUND
        );
        let refused = health.respond(&request(Method::POST, HEALTHZ, &[]));
        assert_eq!(refused.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(refused.headers()[header::ALLOW], "GET, HEAD");
        assert_eq!(refused.headers()[header::CONNECTION], "close");
        for method in [Method::PUT, Method::DELETE, Method::OPTIONS, Method::TRACE] {
            assert_eq!(
                status(&health, method, HEALTHZ, &[]),
                StatusCode::METHOD_NOT_ALLOWED
            );
        }
        for body in [
            &[("content-length", "1")][..],
            &[("transfer-encoding", "chunked")][..],
        ] {
            assert_eq!(
                status(&health, Method::GET, HEALTHZ, body),
                StatusCode::PAYLOAD_TOO_LARGE
            );
        }
        assert_eq!(
            status(&health, Method::GET, HEALTHZ, &[("content-length", "0")]),
            StatusCode::OK
        );

        let metrics = Routes::Metrics(Metrics::new());
        let answer = metrics.respond(&request(Method::GET, METRICS, &[]));
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(answer.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(answer.headers()[header::CACHE_CONTROL], "no-store");
        assert_eq!(
            status(&metrics, Method::GET, HEALTHZ, &[]),
            StatusCode::NOT_FOUND
        );
    }

    #[tokio::test]
    async fn a_write_the_peer_never_takes_fails_after_the_limit() {
        let (ours, _theirs) = tokio::io::duplex(64);
        let mut stream = WriteTimeout::new(ours, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let error = stream.write_all(&[0; 4096]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(100));

        // A peer that reads, however slowly, keeps the writes going.
        let (ours, mut theirs) = tokio::io::duplex(64);
        let reader = tokio::spawn(async move {
            let mut sink = Vec::new();
            tokio::io::AsyncReadExt::read_to_end(&mut theirs, &mut sink)
                .await
                .map(|_| sink.len())
        });
        let mut stream = WriteTimeout::new(ours, Duration::from_millis(100));
        stream.write_all(&[0; 4096]).await.unwrap();
        stream.shutdown().await.unwrap();
        drop(stream);
        assert_eq!(reader.await.unwrap().unwrap(), 4096);
    }
}
