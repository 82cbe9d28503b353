//! The webhook's HTTPS server: TLS only (rustls with aws-lc-rs, the certificate from a
//! [`ServingCertificate`]), HTTP/1.1, one POST path per kind ([`Served::path`]), and bounds on
//! what a client may cost it ([`Limits`]).
//!
//! Answers: 200 with the AdmissionReview; 400 for a body that is not a review; 404 for another
//! path; 405 for another method; 408 for a body that stops arriving (nothing for
//! [`Limits::body_idle_timeout`]) or takes too long to arrive in all
//! ([`Limits::body_timeout`]); 413 for a body over the limit, refused from its
//! `Content-Length` before any of it is read, or as soon as a body without one passes the
//! limit; 415 for a body that is not JSON; 431 for a request head over 16 KiB or 64 headers;
//! 503 for a review not answered within the request timeout.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, SemaphorePermit};
use tokio_rustls::TlsAcceptor;

use super::admit::{Deprecations, Issuers, Served, review};
use super::certificate::ServingCertificate;
use crate::answers::{closing, text};
use caretaker_listener::{Bounds, Connection};

/// Bounds on what clients may cost the webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest request body read: kube-apiserver stores objects up to about 1.5 MiB, and
    /// a review of an UPDATE carries two of them.
    pub max_body_bytes: usize,
    /// The request bodies all connections together may hold at once: each part of a body
    /// takes its bytes of this budget as it arrives (waiting for them, within the request
    /// timeout, when it is spent), and gives them back with the answer. A crowd of clients
    /// cannot make the webhook buffer `max_connections` × `max_body_bytes`, and one that
    /// declares a large body and sends nothing holds nothing.
    pub max_body_bytes_in_flight: usize,
    /// How long a body may make no progress (no byte arriving) before the request is answered
    /// 408 and its connection closed.
    pub body_idle_timeout: Duration,
    /// How long a body may take to arrive in all (time spent waiting for its bytes; waiting
    /// for budget is not counted) before the request is answered 408 and its connection
    /// closed: a client trickling a byte now and then, never idle for `body_idle_timeout`,
    /// holds its share of the budget no longer than this. kube-apiserver sends a review's
    /// body at once, within a webhook timeout of at most 30 s (10 s by default).
    pub body_timeout: Duration,
    /// How long a request may take from its headers to its answer (reading the body
    /// included).
    pub request_timeout: Duration,
    /// How long a client may take to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long a connection may wait for a request's headers to arrive in full, idle
    /// keep-alive connections included.
    pub header_read_timeout: Duration,
    /// Connections open at once. A new connection over the limit closes the oldest one that
    /// is still in its handshake, or else the oldest between requests: idle connections
    /// cannot keep a real review out. Only when every connection is in the middle of a
    /// request is the new one refused.
    pub max_connections: usize,
    /// Connections open at once from one IP address, with the same rule among its own: one
    /// client cannot take every connection from the API server.
    pub max_connections_per_peer: usize,
    /// How long to pause after a failed accept (out of file descriptors) before the next.
    pub accept_retry: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 3 * 1024 * 1024,
            max_body_bytes_in_flight: 32 * 1024 * 1024,
            body_idle_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            max_connections: 256,
            max_connections_per_peer: 64,
            accept_retry: Duration::from_millis(200),
        }
    }
}

/// The server's TLS configuration: no client certificates (kube-apiserver presents none
/// unless configured to), HTTP/1.1, the certificate `certificate` holds at each handshake.
pub fn tls_config(certificate: Arc<ServingCertificate>) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("aws-lc-rs supports the default TLS versions")
        .with_no_client_auth()
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// Serves the webhook on `listener` until the task is dropped; never ends by itself (a failed
/// accept is logged and tried again).
pub async fn serve<I: Issuers + 'static>(
    listener: TcpListener,
    certificate: Arc<ServingCertificate>,
    issuers: I,
    limits: Limits,
    deprecations: Deprecations,
) {
    let acceptor = TlsAcceptor::from(Arc::new(tls_config(certificate.clone())));
    let body_budget = Semaphore::new(limits.max_body_bytes_in_flight.min(Semaphore::MAX_PERMITS));
    let handler = Arc::new(Handler {
        issuers,
        deprecations,
        limits,
        body_budget,
    });
    let bounds = Bounds {
        max_connections: limits.max_connections,
        max_connections_per_peer: limits.max_connections_per_peer,
        accept_retry: limits.accept_retry,
    };
    caretaker_listener::serve(listener, "webhook", bounds, |stream, peer, slot| {
        connection(
            acceptor.clone(),
            stream,
            peer,
            slot,
            handler.clone(),
            certificate.clone(),
        )
    })
    .await
}

async fn connection<I: Issuers + 'static>(
    acceptor: TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    slot: Connection,
    handler: Arc<Handler<I>>,
    certificate: Arc<ServingCertificate>,
) {
    let limits = handler.limits;
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) if !certificate.is_set() => {
            tracing::warn!(%peer, error = %e,
                "webhook: refused a TLS handshake: no serving certificate has been loaded yet");
            return;
        }
        Ok(Err(e)) => {
            tracing::info!(%peer, error = %e, "webhook: refused a TLS connection");
            return;
        }
        Err(_) => {
            tracing::info!(%peer, "webhook: TLS handshake timed out");
            return;
        }
    };
    slot.established();
    let service = hyper::service::service_fn(move |request| {
        let (handler, busy) = (handler.clone(), slot.busy());
        async move {
            let response = handler.respond(request).await;
            drop(busy);
            Ok::<_, Infallible>(response)
        }
    });
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_headers(MAX_HEADERS)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(tls), service)
        .await;
    if let Err(e) = served {
        tracing::debug!(%peer, error = %e, "webhook: connection ended with an error");
    }
}

/// Headers in one request; kube-apiserver sends about ten.
const MAX_HEADERS: usize = 64;
/// The connection's read buffer, and so the largest request head.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// What answers requests.
struct Handler<I> {
    issuers: I,
    deprecations: Deprecations,
    limits: Limits,
    /// Bytes of request bodies that may be held at once ([`Limits::max_body_bytes_in_flight`]).
    body_budget: Semaphore,
}

impl<I: Issuers> Handler<I> {
    async fn respond(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let timeout = self.limits.request_timeout;
        match tokio::time::timeout(timeout, self.answer(request)).await {
            Ok(response) => response,
            Err(_) => {
                tracing::warn!(?timeout, "webhook: a request was not answered in time");
                closing(text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("the request was not answered within {timeout:?}"),
                ))
            }
        }
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let Some(served) = Served::at(request.uri().path()) else {
            let paths: Vec<&str> = Served::ALL.iter().map(|s| s.path()).collect();
            return closing(text(
                StatusCode::NOT_FOUND,
                format!(
                    "no webhook at {}; served: {}",
                    request.uri().path(),
                    paths.join(", ")
                ),
            ));
        };
        if request.method() != Method::POST {
            let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "only POST".into());
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            return closing(response);
        }
        if !is_json(request.headers().get(header::CONTENT_TYPE)) {
            return closing(text(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "expected Content-Type: application/json".into(),
            ));
        }
        let max = self.limits.max_body_bytes;
        let too_large = || {
            closing(text(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {max} bytes"),
            ))
        };
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|length| length > max as u64) {
            return too_large();
        }
        let (body, _held) = match self.read_body(request.into_body()).await {
            Ok(read) => read,
            Err(BodyError::TooLarge) => return too_large(),
            Err(BodyError::Stalled) => {
                let idle = self.limits.body_idle_timeout;
                return closing(text(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the body stopped arriving: nothing for {idle:?}"),
                ));
            }
            Err(BodyError::TooSlow) => {
                let total = self.limits.body_timeout;
                return closing(text(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the body took longer than {total:?} to arrive"),
                ));
            }
            Err(BodyError::Unreadable(e)) => {
                return closing(text(
                    StatusCode::BAD_REQUEST,
                    format!("cannot read the body: {e}"),
                ));
            }
        };
        match review(&body, served, &self.issuers, self.deprecations).await {
            Ok(answer) => {
                if let Some(response) = &answer.response
                    && let Some(status) = &response.status
                {
                    tracing::info!(kind = served.kind(), uid = %response.uid, code = status.code,
                        message = %status.message, "webhook: denied");
                }
                let json = serde_json::to_vec(&answer).expect("a review serializes");
                let mut response = Response::new(Full::new(Bytes::from(json)));
                response.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                response
            }
            Err(e) => {
                tracing::info!(kind = served.kind(), error = %e, "webhook: bad request");
                text(StatusCode::BAD_REQUEST, e.to_string())
            }
        }
    }
}

impl<I> Handler<I> {
    /// Reads `body`: at most `max_body_bytes`, each part taking its bytes of the shared budget
    /// as it arrives (held, with the bytes, until the answer is sent), and given up when no
    /// byte arrives for `body_idle_timeout`, or once waiting for its bytes has taken
    /// `body_timeout` in all. Waiting for budget is not the client's slowness: only the
    /// request timeout bounds it.
    async fn read_body(
        &self,
        mut body: Incoming,
    ) -> Result<(Bytes, Option<SemaphorePermit<'_>>), BodyError> {
        let (max, idle) = (self.limits.max_body_bytes, self.limits.body_idle_timeout);
        let budget = self.body_budget_size();
        let mut read = BytesMut::new();
        let mut held: Option<SemaphorePermit<'_>> = None;
        // What is left of `body_timeout`, spent only while waiting for the client.
        let mut left = self.limits.body_timeout;
        loop {
            let waiting = tokio::time::Instant::now();
            let frame = match tokio::time::timeout(idle.min(left), body.frame()).await {
                Err(_) if left <= idle => return Err(BodyError::TooSlow),
                Err(_) => return Err(BodyError::Stalled),
                Ok(None) => return Ok((read.freeze(), held)),
                Ok(Some(Err(e))) => return Err(BodyError::Unreadable(e)),
                Ok(Some(Ok(frame))) => frame,
            };
            left = left.saturating_sub(waiting.elapsed());
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if read.len() + data.len() > max {
                return Err(BodyError::TooLarge);
            }
            // Never more than the whole budget, which a single part could otherwise wait for
            // forever.
            let bytes = data.len().min(budget.saturating_sub(held_bytes(&held)));
            if bytes > 0 {
                let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
                let permit = self
                    .body_budget
                    .acquire_many(bytes)
                    .await
                    .expect("the body budget is never closed");
                match &mut held {
                    Some(held) => held.merge(permit),
                    None => held = Some(permit),
                }
            }
            read.extend_from_slice(&data);
        }
    }

    fn body_budget_size(&self) -> usize {
        self.limits
            .max_body_bytes_in_flight
            .min(Semaphore::MAX_PERMITS)
    }
}

/// The bytes of budget `held` holds.
fn held_bytes(held: &Option<SemaphorePermit<'_>>) -> usize {
    held.as_ref().map_or(0, |p| p.num_permits())
}

/// Why a request's body was not read.
#[derive(Debug)]
enum BodyError {
    /// Past [`Limits::max_body_bytes`].
    TooLarge,
    /// Nothing arrived for [`Limits::body_idle_timeout`].
    Stalled,
    /// Not all of it arrived within [`Limits::body_timeout`].
    TooSlow,
    Unreadable(hyper::Error),
}

/// `application/json`, with or without parameters (`; charset=utf-8`).
fn is_json(content_type: Option<&HeaderValue>) -> bool {
    content_type
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_types() {
        let json = |v: &'static str| is_json(Some(&HeaderValue::from_static(v)));
        assert!(json("application/json"));
        assert!(json("application/json; charset=utf-8"));
        assert!(json("Application/JSON"));
        assert!(!json("application/yaml"));
        assert!(!json("text/plain"));
        assert!(!is_json(None));
    }
}
