//! Bounds on what a connection may cost the server, as kube-apiserver's Go HTTP server has
//! them (and as caretaker's operator bounds its webhook): a TLS handshake must finish within
//! [`ConnectionLimits::handshake_timeout`]; a connection without a request in progress is
//! closed after [`ConnectionLimits::header_read_timeout`] before its first request and
//! [`ConnectionLimits::idle_timeout`] after (HTTP/1.1 must also send each request head in
//! full within `header_read_timeout`); and at most [`ConnectionLimits::max_connections`] are
//! open at once: a new one over the limit closes the oldest still in its handshake, or else
//! the oldest idle one, so idle clients cannot keep a real request (or `/healthz`) out. Only
//! when every connection is in the middle of a request (a watch counts) is a new one refused.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::{Request, Response};
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

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

/// The open connections, oldest first.
pub(crate) struct Connections {
    limit: usize,
    open: Mutex<BTreeMap<u64, Arc<ConnectionState>>>,
    next: AtomicU64,
}

/// What a connection is doing, watched by its idle deadline.
#[derive(Debug, Clone, Copy)]
struct Activity {
    /// Requests being answered (their response bodies included: a watch is in progress
    /// until its stream ends).
    busy: usize,
    /// Since when no request has been in progress.
    idle_since: Instant,
    /// Whether a request has been answered on it.
    answered: bool,
}

impl Activity {
    /// When a connection doing this is closed for idleness: never while a request is in
    /// progress; `header_read_timeout` after it opened if it has answered nothing yet,
    /// `idle_timeout` after its last answer otherwise.
    fn idle_deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        if self.busy > 0 {
            return None;
        }
        let limit = if self.answered {
            limits.idle_timeout
        } else {
            limits.header_read_timeout
        };
        Some(self.idle_since + limit)
    }
}

pub(crate) struct ConnectionState {
    /// The connection is ready for requests (a TLS server: its handshake is over).
    established: AtomicBool,
    activity: watch::Sender<Activity>,
    /// Told to close, to make room.
    close: Notify,
}

impl Connections {
    pub(crate) fn new(limit: usize) -> Self {
        Connections {
            limit: limit.max(1),
            open: Mutex::default(),
            next: AtomicU64::new(0),
        }
    }

    /// Room for a new connection, made by closing the oldest connection still in its
    /// handshake, or else the oldest idle one, if need be; `None` when every connection is
    /// answering a request.
    pub(crate) fn open(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= self.limit {
            let oldest = open
                .iter()
                .find(|(_, state)| !state.established.load(Ordering::SeqCst) && state.is_idle())
                .or_else(|| open.iter().find(|(_, state)| state.is_idle()))
                .map(|(id, _)| *id)?;
            if let Some(state) = open.remove(&oldest) {
                state.close.notify_one();
            }
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(ConnectionState {
            established: AtomicBool::new(false),
            activity: watch::Sender::new(Activity {
                busy: 0,
                idle_since: Instant::now(),
                answered: false,
            }),
            close: Notify::new(),
        });
        open.insert(id, state.clone());
        Some(Slot {
            connections: self.clone(),
            id,
            state,
        })
    }
}

impl ConnectionState {
    fn is_idle(&self) -> bool {
        self.activity.borrow().busy == 0
    }
}

/// One open connection; it leaves [`Connections`] when dropped.
pub(crate) struct Slot {
    connections: Arc<Connections>,
    id: u64,
    state: Arc<ConnectionState>,
}

impl Slot {
    /// The connection is ready for requests.
    pub(crate) fn established(&self) {
        self.state.established.store(true, Ordering::SeqCst);
    }

    /// Completes when the connection is told to close to make room for a new one.
    pub(crate) async fn evicted(&self) {
        self.state.close.notified().await
    }

    /// Completes once the connection has had no request in progress for its limit:
    /// `header_read_timeout` before its first answer, `idle_timeout` after.
    pub(crate) async fn idle_expired(&self, limits: &ConnectionLimits) {
        let mut activity = self.state.activity.subscribe();
        loop {
            let deadline = activity.borrow_and_update().idle_deadline(limits);
            match deadline {
                Some(deadline) => tokio::select! {
                    () = tokio::time::sleep_until(deadline) => return,
                    _ = activity.changed() => {}
                },
                // The channel cannot close while `self` holds its sender.
                None => drop(activity.changed().await),
            }
        }
    }

    /// `service`, counting its requests as this connection's (until their answers' bodies
    /// are sent or dropped).
    pub(crate) fn track<S>(&self, service: S) -> Tracked<S> {
        Tracked {
            inner: service,
            state: self.state.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        open.remove(&self.id);
    }
}

/// A request in progress on a connection.
struct Busy(Arc<ConnectionState>);

impl Busy {
    fn new(state: &Arc<ConnectionState>) -> Self {
        state.activity.send_modify(|a| a.busy += 1);
        Busy(state.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.activity.send_modify(|a| {
            a.busy -= 1;
            if a.busy == 0 {
                a.idle_since = Instant::now();
                a.answered = true;
            }
        });
    }
}

/// A connection's service that counts its requests in progress.
pub(crate) struct Tracked<S> {
    inner: S,
    state: Arc<ConnectionState>,
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
        let busy = Busy::new(&self.state);
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

    fn is_told_to_close(slot: &Slot) -> bool {
        futures::FutureExt::now_or_never(slot.evicted()).is_some()
    }

    #[test]
    fn a_full_house_closes_the_oldest_idle_connection_handshakes_first() {
        let connections = Arc::new(Connections::new(3));
        let a = connections.open().unwrap();
        let b = connections.open().unwrap();
        let c = connections.open().unwrap();
        a.established();
        b.established();
        // c is still in its handshake: it goes first, though a and b are older.
        let d = connections.open().unwrap();
        assert!(is_told_to_close(&c) && !is_told_to_close(&a) && !is_told_to_close(&b));
        // Then the oldest idle one: a is busy, so b.
        let busy = Busy::new(&a.state);
        d.established();
        let e = connections.open().unwrap();
        assert!(is_told_to_close(&b) && !is_told_to_close(&a));
        // All busy: a new connection is refused.
        let _busy = (Busy::new(&d.state), Busy::new(&e.state));
        assert!(connections.open().is_none());
        drop(busy);
        assert!(connections.open().is_some());
        assert!(is_told_to_close(&a));
    }

    #[test]
    fn closed_connections_free_their_room() {
        let connections = Arc::new(Connections::new(2));
        let a = connections.open().unwrap();
        let b = connections.open().unwrap();
        let _busy = (Busy::new(&a.state), Busy::new(&b.state));
        assert!(connections.open().is_none());
        drop(b);
        assert!(connections.open().is_some());
    }

    #[test]
    fn the_idle_deadline_counts_only_time_without_a_request() {
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(60),
            ..ConnectionLimits::default()
        };
        let since = Instant::now();
        let activity = |busy, answered| Activity {
            busy,
            idle_since: since,
            answered,
        };
        // Nothing asked yet: the header read timeout.
        assert_eq!(
            activity(0, false).idle_deadline(&limits),
            Some(since + Duration::from_secs(5))
        );
        // A request in progress (a watch, however long) is not idle time.
        assert_eq!(activity(1, false).idle_deadline(&limits), None);
        assert_eq!(activity(2, true).idle_deadline(&limits), None);
        // After an answer: the idle timeout, from the end of the last request.
        assert_eq!(
            activity(0, true).idle_deadline(&limits),
            Some(since + Duration::from_secs(60))
        );
    }

    #[test]
    fn requests_and_their_answers_bodies_keep_a_connection_busy() {
        let connections = Arc::new(Connections::new(1));
        let slot = connections.open().unwrap();
        let busy = Busy::new(&slot.state);
        assert!(!slot.state.is_idle());
        let body = TrackedBody {
            body: http_body_util::Empty::<bytes::Bytes>::new(),
            _busy: busy,
        };
        assert!(!slot.state.is_idle());
        drop(body);
        assert!(slot.state.is_idle());
        assert!(slot.state.activity.borrow().answered);
    }
}
