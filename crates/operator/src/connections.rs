//! Bounds on the connections a server keeps open at once, shared by the servers of the
//! operator (the admission webhook, `/metrics` and the health probes): a new connection over
//! the limit closes the oldest one that is idle, so idle clients cannot keep a real request
//! out; only when every connection is in the middle of a request is the new one refused.
//! The same holds among one peer's connections (an IP address) under a per-peer limit, so one
//! client cannot take every connection.
//! Also the plain answers those servers give.

use std::collections::BTreeMap;
use std::net::IpAddr;
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
    per_peer: usize,
    open: Mutex<BTreeMap<u64, Arc<ConnectionState>>>,
    next: AtomicU64,
}

pub(crate) struct ConnectionState {
    /// Where the connection comes from.
    peer: IpAddr,
    /// The connection is ready for requests (a TLS server: its handshake is over).
    pub(crate) established: AtomicBool,
    /// Requests being answered (one at most with HTTP/1.1).
    busy: AtomicUsize,
    /// Told to close, to make room.
    pub(crate) close: Arc<tokio::sync::Notify>,
}

impl Connections {
    /// At most `limit` connections, and `per_peer` from one IP address.
    pub(crate) fn new(limit: usize, per_peer: usize) -> Self {
        Connections {
            limit: limit.max(1),
            per_peer: per_peer.max(1),
            open: Mutex::default(),
            next: AtomicU64::new(0),
        }
    }

    /// Room for a new connection from `peer`, made by closing the oldest idle one if need be
    /// (of `peer`'s own when it is at its limit, else of all): the oldest still in its
    /// handshake, else the oldest between requests. `None` when every connection that could
    /// make room is answering a request.
    pub(crate) fn open(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let peers = open.values().filter(|state| state.peer == peer).count();
        if peers >= self.per_peer {
            make_room(&mut open, |state| state.peer == peer)?;
        }
        if open.len() >= self.limit {
            make_room(&mut open, |_| true)?;
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(ConnectionState {
            peer,
            established: AtomicBool::default(),
            busy: AtomicUsize::default(),
            close: Arc::default(),
        });
        open.insert(id, state.clone());
        Some(Slot {
            connections: self.clone(),
            id,
            state,
        })
    }
}

/// Closes the oldest idle connection of those `among` picks: one still in its handshake first.
/// `None` when all of them are answering a request.
fn make_room(
    open: &mut BTreeMap<u64, Arc<ConnectionState>>,
    among: impl Fn(&ConnectionState) -> bool,
) -> Option<()> {
    let idle = |state: &ConnectionState| among(state) && state.busy.load(Ordering::SeqCst) == 0;
    let oldest = open
        .iter()
        .find(|(_, state)| !state.established.load(Ordering::SeqCst) && idle(state))
        .or_else(|| open.iter().find(|(_, state)| idle(state)))
        .map(|(id, _)| *id)?;
    if let Some(state) = open.remove(&oldest) {
        state.close.notify_one();
    }
    Some(())
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
        let connections = Arc::new(Connections::new(3, 3));
        let a = connections.open(HERE).unwrap();
        let b = connections.open(HERE).unwrap();
        let c = connections.open(HERE).unwrap();
        a.state.established.store(true, Ordering::SeqCst);
        b.state.established.store(true, Ordering::SeqCst);
        // c is still in its handshake: it goes first, though a and b are older.
        let d = connections.open(HERE).unwrap();
        assert!(is_told_to_close(&c) && !is_told_to_close(&a) && !is_told_to_close(&b));
        // Then the oldest idle one: a is busy, so b.
        let busy = Busy::new(&a.state);
        d.state.established.store(true, Ordering::SeqCst);
        let e = connections.open(HERE).unwrap();
        assert!(is_told_to_close(&b) && !is_told_to_close(&a));
        // All busy: a new connection is refused.
        let _busy = (Busy::new(&d.state), Busy::new(&e.state));
        assert!(connections.open(HERE).is_none());
        drop(busy);
        assert!(connections.open(HERE).is_some());
        assert!(is_told_to_close(&a));
    }

    #[test]
    fn closed_connections_free_their_room() {
        let connections = Arc::new(Connections::new(2, 2));
        let a = connections.open(HERE).unwrap();
        let b = connections.open(HERE).unwrap();
        let _busy = (Busy::new(&a.state), Busy::new(&b.state));
        assert!(connections.open(HERE).is_none());
        drop(b);
        assert!(connections.open(HERE).is_some());
    }

    #[test]
    fn one_peer_makes_room_among_its_own_connections() {
        let connections = Arc::new(Connections::new(10, 2));
        let other: IpAddr = "192.0.2.7".parse().unwrap();
        let theirs = connections.open(other).unwrap();
        let a = connections.open(HERE).unwrap();
        let b = connections.open(HERE).unwrap();
        // At its limit, a peer's new connection closes its own oldest idle one, not another's.
        let c = connections.open(HERE).unwrap();
        assert!(is_told_to_close(&a) && !is_told_to_close(&theirs));
        // A peer whose connections are all answering requests gets no more...
        let _busy = (Busy::new(&b.state), Busy::new(&c.state));
        assert!(connections.open(HERE).is_none());
        // ...while another peer still does.
        assert!(connections.open(other).is_some());
        assert!(!is_told_to_close(&b) && !is_told_to_close(&c));
    }

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    /// Whether `slot` was told to close (consumes the notification).
    fn is_told_to_close(slot: &Slot) -> bool {
        futures::FutureExt::now_or_never(slot.state.close.notified()).is_some()
    }
}
