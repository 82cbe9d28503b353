//! Bounds on the connections a server keeps open at once, shared by the servers of the
//! operator (the admission webhook, `/metrics` and the health probes): a new connection over
//! the limit closes the oldest one that is idle, so idle clients cannot keep a real request
//! out; only when every connection is in the middle of a request is the new one refused.
//! Also the plain answers those servers give.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{self, HeaderValue};
use hyper::{Response, StatusCode};

/// A `text/plain` answer: `message` and a newline.
pub(crate) fn text(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message + "\n")));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// `response`, after which the connection is closed: whatever the client sent after the
/// request's head (or part of its body) is not read, and is not going to be.
pub(crate) fn closing(mut response: Response<Full<Bytes>>) -> Response<Full<Bytes>> {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// The open connections, oldest first.
pub(crate) struct Connections {
    limit: usize,
    open: Mutex<BTreeMap<u64, Arc<ConnectionState>>>,
    next: AtomicU64,
}

#[derive(Default)]
pub(crate) struct ConnectionState {
    /// The connection is ready for requests (a TLS server: its handshake is over).
    pub(crate) established: AtomicBool,
    /// Requests being answered (one at most with HTTP/1.1).
    busy: AtomicUsize,
    /// Told to close, to make room.
    pub(crate) close: Arc<tokio::sync::Notify>,
}

impl Connections {
    pub(crate) fn new(limit: usize) -> Self {
        Connections {
            limit: limit.max(1),
            open: Mutex::default(),
            next: AtomicU64::new(0),
        }
    }

    /// Room for a new connection, made by closing the oldest idle one if need be; `None`
    /// when every connection is answering a request.
    pub(crate) fn open(self: &Arc<Self>) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= self.limit {
            let idle = |state: &ConnectionState| state.busy.load(Ordering::SeqCst) == 0;
            let oldest = open
                .iter()
                .find(|(_, state)| !state.established.load(Ordering::SeqCst) && idle(state))
                .or_else(|| open.iter().find(|(_, state)| idle(state)))
                .map(|(id, _)| *id)?;
            if let Some(state) = open.remove(&oldest) {
                state.close.notify_one();
            }
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(ConnectionState::default());
        open.insert(id, state.clone());
        Some(Slot {
            connections: self.clone(),
            id,
            state,
        })
    }
}

/// One open connection; it leaves [`Connections`] when dropped.
pub(crate) struct Slot {
    connections: Arc<Connections>,
    id: u64,
    pub(crate) state: Arc<ConnectionState>,
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

/// A request being answered on a connection.
pub(crate) struct Busy(Arc<ConnectionState>);

impl Busy {
    pub(crate) fn new(state: &Arc<ConnectionState>) -> Self {
        state.busy.fetch_add(1, Ordering::SeqCst);
        Busy(state.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_house_closes_the_oldest_idle_connection_handshakes_first() {
        let connections = Arc::new(Connections::new(3));
        let a = connections.open().unwrap();
        let b = connections.open().unwrap();
        let c = connections.open().unwrap();
        a.state.established.store(true, Ordering::SeqCst);
        b.state.established.store(true, Ordering::SeqCst);
        // c is still in its handshake: it goes first, though a and b are older.
        let d = connections.open().unwrap();
        assert!(is_told_to_close(&c) && !is_told_to_close(&a) && !is_told_to_close(&b));
        // Then the oldest idle one: a is busy, so b.
        let busy = Busy::new(&a.state);
        d.state.established.store(true, Ordering::SeqCst);
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

    /// Whether `slot` was told to close (consumes the notification).
    fn is_told_to_close(slot: &Slot) -> bool {
        futures::FutureExt::now_or_never(slot.state.close.notified()).is_some()
    }
}
