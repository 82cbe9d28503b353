//! The connections a server holds open, oldest first, and the rule that makes room for a new
//! one: over a limit, the oldest idle connection it may replace is told to close (one still in
//! its handshake first, else one between requests); only when every such connection is in the
//! middle of a request is the new one refused. Under the per-peer limit the same rule holds
//! among one IP address's own connections, so one client cannot take every connection.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// The open connections of one server.
#[derive(Debug)]
pub struct Connections {
    limit: usize,
    per_peer: usize,
    open: Mutex<BTreeMap<u64, Arc<State>>>,
    next: AtomicU64,
}

/// What one connection is doing; shared by its [`Slot`] and its [`Connection`] handles.
#[derive(Debug)]
struct State {
    /// Where the connection comes from.
    peer: IpAddr,
    /// The connection is ready for requests (a TLS server: its handshake is over).
    established: AtomicBool,
    activity: watch::Sender<Activity>,
    /// Told to close, to make room.
    close: Notify,
}

/// A connection's requests, watched by its idle deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Activity {
    /// Requests being answered.
    busy: usize,
    /// Since when no request has been in progress.
    idle_since: Instant,
    /// Whether a request has been answered on it.
    answered: bool,
}

impl Activity {
    /// When a connection doing this is closed for idleness: never while a request is in
    /// progress; `before_first_answer` after it opened if it has answered nothing yet,
    /// `after_an_answer` after its last answer otherwise.
    fn idle_deadline(
        &self,
        before_first_answer: Duration,
        after_an_answer: Duration,
    ) -> Option<Instant> {
        if self.busy > 0 {
            return None;
        }
        let limit = if self.answered {
            after_an_answer
        } else {
            before_first_answer
        };
        Some(self.idle_since + limit)
    }
}

impl Connections {
    /// At most `limit` connections, and `per_peer` from one IP address (both at least 1).
    pub fn new(limit: usize, per_peer: usize) -> Self {
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
    pub fn open(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let peers = open.values().filter(|state| state.peer == peer).count();
        if peers >= self.per_peer {
            make_room(&mut open, |state| state.peer == peer)?;
        }
        if open.len() >= self.limit {
            make_room(&mut open, |_| true)?;
        }
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        let state = Arc::new(State {
            peer,
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
            connection: Connection(state),
        })
    }

    /// Connections open now.
    pub fn len(&self) -> usize {
        self.open.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Tells the oldest idle connection of those `among` picks to close, one still in its
/// handshake first, and forgets it. `None` when all of them are answering a request.
fn make_room(open: &mut BTreeMap<u64, Arc<State>>, among: impl Fn(&State) -> bool) -> Option<()> {
    let idle = |state: &State| among(state) && state.is_idle();
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

impl State {
    fn is_idle(&self) -> bool {
        self.activity.borrow().busy == 0
    }
}

/// One open connection's place in [`Connections`]; it leaves the table when dropped.
#[derive(Debug)]
pub struct Slot {
    connections: Arc<Connections>,
    id: u64,
    connection: Connection,
}

impl Slot {
    /// The handle the connection's server uses.
    pub fn connection(&self) -> &Connection {
        &self.connection
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

/// What a server tells the table about one of its connections.
#[derive(Debug, Clone)]
pub struct Connection(Arc<State>);

impl Connection {
    /// The connection is ready for requests (its TLS handshake, if any, is over): from now on
    /// it makes room for a new one only when no connection still in its handshake can.
    pub fn established(&self) {
        self.0.established.store(true, Ordering::SeqCst);
    }

    /// A request in progress on the connection, until the guard is dropped: a busy connection
    /// is never closed to make room.
    pub fn busy(&self) -> Busy {
        self.0.activity.send_modify(|a| a.busy += 1);
        Busy(self.0.clone())
    }

    /// `request`, during which the connection is busy (from this call on, not only once it
    /// is polled).
    pub fn busy_during<F: Future>(&self, request: F) -> impl Future<Output = F::Output> + use<F> {
        let busy = self.busy();
        async move {
            let output = request.await;
            drop(busy);
            output
        }
    }

    /// Whether no request is in progress on the connection.
    pub fn is_idle(&self) -> bool {
        self.0.is_idle()
    }

    /// Completes when the connection is told to close to make room for a new one.
    pub async fn evicted(&self) {
        self.0.close.notified().await
    }

    /// Completes once the connection has had no request in progress for its limit:
    /// `before_first_answer` from its opening until it has answered a request,
    /// `after_an_answer` from its last answer after.
    pub async fn idle_expired(&self, before_first_answer: Duration, after_an_answer: Duration) {
        let mut activity = self.0.activity.subscribe();
        loop {
            let deadline = activity
                .borrow_and_update()
                .idle_deadline(before_first_answer, after_an_answer);
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
}

/// A request in progress on a connection; see [`Connection::busy`].
#[derive(Debug)]
pub struct Busy(Arc<State>);

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    const HERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);
    const THERE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));

    fn table(limit: usize, per_peer: usize) -> Arc<Connections> {
        Arc::new(Connections::new(limit, per_peer))
    }

    /// Whether `slot` was told to close (consumes the notification).
    fn is_told_to_close(slot: &Slot) -> bool {
        let evicted = pin!(slot.connection().evicted());
        let mut context = Context::from_waker(Waker::noop());
        evicted.poll(&mut context) == Poll::Ready(())
    }

    #[test]
    fn a_full_house_closes_the_oldest_idle_connection_handshakes_first() {
        let connections = table(3, 3);
        let a = connections.open(HERE).unwrap();
        let b = connections.open(HERE).unwrap();
        let c = connections.open(HERE).unwrap();
        a.connection().established();
        b.connection().established();
        // c is still in its handshake: it goes first, though a and b are older.
        let d = connections.open(HERE).unwrap();
        assert!(is_told_to_close(&c) && !is_told_to_close(&a) && !is_told_to_close(&b));
        // Then the oldest idle one: a is busy, so b.
        let busy = a.connection().busy();
        d.connection().established();
        let e = connections.open(HERE).unwrap();
        assert!(is_told_to_close(&b) && !is_told_to_close(&a));
        // All busy: a new connection is refused.
        let _busy = (d.connection().busy(), e.connection().busy());
        assert!(connections.open(HERE).is_none());
        drop(busy);
        assert!(connections.open(HERE).is_some());
        assert!(is_told_to_close(&a));
    }

    #[test]
    fn closed_connections_free_their_room() {
        let connections = table(2, 2);
        let a = connections.open(HERE).unwrap();
        let b = connections.open(HERE).unwrap();
        let _busy = (a.connection().busy(), b.connection().busy());
        assert!(connections.open(HERE).is_none());
        drop(b);
        assert_eq!(connections.len(), 1);
        assert!(connections.open(HERE).is_some());
    }

    #[test]
    fn a_connection_told_to_close_leaves_the_table_at_once() {
        let connections = table(1, 1);
        let a = connections.open(HERE).unwrap();
        let _b = connections.open(HERE).unwrap();
        assert!(is_told_to_close(&a));
        // a's task has not ended yet, but its room is b's.
        assert_eq!(connections.len(), 1);
        drop(a);
        assert_eq!(connections.len(), 1);
    }

    #[test]
    fn one_peer_makes_room_among_its_own_connections() {
        let connections = table(10, 2);
        let theirs = connections.open(THERE).unwrap();
        let a = connections.open(HERE).unwrap();
        let b = connections.open(HERE).unwrap();
        // At its limit, a peer's new connection closes its own oldest idle one, not another's.
        let c = connections.open(HERE).unwrap();
        assert!(is_told_to_close(&a) && !is_told_to_close(&theirs));
        // A peer whose connections are all answering requests gets no more...
        let _busy = (b.connection().busy(), c.connection().busy());
        assert!(connections.open(HERE).is_none());
        // ...while another peer still does.
        assert!(connections.open(THERE).is_some());
        assert!(!is_told_to_close(&b) && !is_told_to_close(&c));
    }

    #[test]
    fn a_flooding_peer_holds_no_more_than_its_share() {
        let connections = table(16, 4);
        let flood: Vec<Slot> = (0..40).filter_map(|_| connections.open(THERE)).collect();
        assert_eq!(flood.len(), 40, "each new one replaces the flood's oldest");
        assert_eq!(connections.len(), 4);
        assert!(connections.open(HERE).is_some());
    }

    #[test]
    fn requests_keep_a_connection_busy_until_their_guards_drop() {
        let connections = table(1, 1);
        let slot = connections.open(HERE).unwrap();
        let connection = slot.connection().clone();
        assert!(connection.is_idle());
        let (first, second) = (connection.busy(), connection.busy());
        drop(first);
        assert!(!connection.is_idle());
        drop(second);
        assert!(connection.is_idle());
        assert!(slot.connection().0.activity.borrow().answered);
    }

    #[test]
    fn the_idle_deadline_counts_only_time_without_a_request() {
        let (before, after) = (Duration::from_secs(5), Duration::from_secs(60));
        let since = Instant::now();
        let activity = |busy, answered| Activity {
            busy,
            idle_since: since,
            answered,
        };
        // Nothing asked yet: the first limit.
        assert_eq!(
            activity(0, false).idle_deadline(before, after),
            Some(since + before)
        );
        // A request in progress (a watch, however long) is not idle time.
        assert_eq!(activity(1, false).idle_deadline(before, after), None);
        assert_eq!(activity(2, true).idle_deadline(before, after), None);
        // After an answer: the second, from the end of the last request.
        assert_eq!(
            activity(0, true).idle_deadline(before, after),
            Some(since + after)
        );
    }
}
