//! The accept loop ([`serve`]) and connection table ([`Connections`]) every caretaker server
//! shares: the operator's admission webhook, `/metrics` and health probes, the node agent's
//! API and the embedded API server. Each server passes its name, its [`Bounds`] and what serves
//! one connection (its TLS handshake and HTTP); the table decides which connections stay open.

mod accept;
mod table;

pub use accept::{Bounds, serve};
pub use table::{Busy, Connection, Connections, Slot};
