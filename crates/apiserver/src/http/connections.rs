//! Bounds on what a connection may cost the server, as kube-apiserver's Go HTTP server has
//! them (and as caretaker's operator bounds its webhook): a TLS handshake must finish within
//! [`ConnectionLimits::handshake_timeout`]; a connection without a request in progress is
//! closed after [`ConnectionLimits::header_read_timeout`] before its first request and
//! [`ConnectionLimits::idle_timeout`] after (HTTP/1.1 must also send each request head in
//! full within `header_read_timeout`); and at most [`ConnectionLimits::max_connections`] are
//! open at once (`caretaker_listener`'s table): a new one over the limit closes the oldest
//! still in its handshake, or else the oldest idle one, so idle clients cannot keep a real request (or `/healthz`) out. Only
//! when every connection is in the middle of a request (a watch counts) is a new one refused.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use caretaker_listener::{Busy, Connection};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response};

/// Bounds on the connections of one server; see the module's documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// How long a client may take to finish the TLS handshake.
    pub handshake_timeout: Duration,
    /// How long a new connection may take to start its first request, and an HTTP/1.1
    /// connection to send a request head in full (counted from the previous answer, so an
    /// idle HTTP/1.1 keep-alive connection is closed after it too).
    pub header_read_timeout: Duration,
    /// How long a connection that has made requests may stay without one in progress
    /// (HTTP/2 keep-alive; kube-apiserver's `IdleTimeout`).
    pub idle_timeout: Duration,
    /// Connections open at once.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            max_connections: 1024,
        }
    }
}

impl ConnectionLimits {
    /// Completes once `connection` has had no request in progress for its limit:
    /// `header_read_timeout` before its first answer, `idle_timeout` after.
    pub(crate) async fn idle_expired(&self, connection: &Connection) {
        connection
            .idle_expired(self.header_read_timeout, self.idle_timeout)
            .await
    }
}

/// `service`, counting its requests as `connection`'s (until their answers' bodies are sent or
/// dropped).
pub(crate) fn track<S>(connection: &Connection, service: S) -> Tracked<S> {
    Tracked {
        inner: service,
        connection: connection.clone(),
    }
}

/// A connection's service that counts its requests in progress.
pub(crate) struct Tracked<S> {
    inner: S,
    connection: Connection,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let busy = self.connection.busy();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| TrackedBody { body, _busy: busy }))
        })
    }
}

/// An answer's body; its request is in progress until it is dropped.
pub(crate) struct TrackedBody<B> {
    body: B,
    _busy: Busy,
}

impl<B: Body + Unpin> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};
    use std::sync::Arc;

    #[test]
    fn requests_and_their_answers_bodies_keep_a_connection_busy() {
        let connections = Arc::new(caretaker_listener::Connections::new(1, 1));
        let slot = connections.open(IpAddr::V4(Ipv4Addr::LOCALHOST)).unwrap();
        let connection = slot.connection();
        let body = TrackedBody {
            body: http_body_util::Empty::<bytes::Bytes>::new(),
            _busy: connection.busy(),
        };
        assert!(!connection.is_idle());
        drop(body);
        assert!(connection.is_idle());
    }
}
