//! The one accept loop of caretaker's servers.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::table::{Connection, Connections};

/// Bounds on one server's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Connections open at once; see [`Connections`].
    pub max_connections: usize,
    /// Connections open at once from one IP address, with the same rule among its own
    /// (`max_connections` for no limit of its own).
    pub max_connections_per_peer: usize,
    /// How long to pause after a failed accept (out of file descriptors, say) before the next.
    pub accept_retry: Duration,
}

/// Accepts connections on `listener` until the future is dropped, which ends every connection
/// it serves. Each gets a place in the server's [`Connections`] (closing an idle one to make
/// room if need be) and is served by `serve(stream, peer, connection)` in a task of its own,
/// until that ends or the connection is told to close to make room for a newer one. A failed
/// accept never ends serving: it is logged and tried again after [`Bounds::accept_retry`].
/// `server` names the server in logs.
pub async fn serve<S, F>(listener: TcpListener, server: &'static str, bounds: Bounds, mut serve: S)
where
    S: FnMut(TcpStream, SocketAddr, Connection) -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let connections = Arc::new(Connections::new(
        bounds.max_connections,
        bounds.max_connections_per_peer,
    ));
    let mut tasks = JoinSet::new();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "{server}: cannot accept a connection; trying again shortly");
                tokio::time::sleep(bounds.accept_retry).await;
                continue;
            }
        };
        while tasks.try_join_next().is_some() {}
        let Some(slot) = connections.open(peer.ip()) else {
            tracing::warn!(%peer, limit = bounds.max_connections,
                per_peer = bounds.max_connections_per_peer,
                "{server}: refused a connection: every connection it could replace is in the middle of a request");
            continue;
        };
        let served = serve(stream, peer, slot.connection().clone());
        tasks.spawn(async move {
            tokio::select! {
                () = served => {}
                () = slot.connection().evicted() => {
                    tracing::debug!(%peer, "{server}: closed an idle connection to make room for a new one");
                }
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const BOUNDS: Bounds = Bounds {
        max_connections: 2,
        max_connections_per_peer: 2,
        accept_retry: Duration::from_millis(10),
    };

    /// A server whose connections each hold a request in progress (and send nothing) when
    /// `busy`, or stay idle in their handshake otherwise.
    async fn server(busy: bool) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(serve(
            listener,
            "test",
            BOUNDS,
            move |stream, _, connection| {
                // Busy before the next accept, as a server that is answering a request.
                let busy = busy.then(|| connection.busy());
                async move {
                    let _held = (stream, busy);
                    std::future::pending::<()>().await
                }
            },
        ));
        address
    }

    /// Reads from `stream` until the server closes it.
    async fn closed(stream: &mut TcpStream) {
        let mut buffer = [0u8; 16];
        while !matches!(stream.read(&mut buffer).await, Ok(0) | Err(_)) {}
    }

    #[tokio::test]
    async fn a_new_connection_closes_the_oldest_idle_one() {
        let address = server(false).await;
        let mut first = TcpStream::connect(address).await.unwrap();
        let _second = TcpStream::connect(address).await.unwrap();
        let _third = TcpStream::connect(address).await.unwrap();
        closed(&mut first).await;
    }

    #[tokio::test]
    async fn a_new_connection_is_refused_when_every_one_is_busy() {
        let address = server(true).await;
        let _first = TcpStream::connect(address).await.unwrap();
        let _second = TcpStream::connect(address).await.unwrap();
        let mut third = TcpStream::connect(address).await.unwrap();
        closed(&mut third).await;
    }
}
