//! Serving, the top layer: the server and its builder (`server`), routing and request handling
//! (`handlers`), media types and protobuf bodies, watch streams, connection limits and the
//! browser guard. Only the crate root imports it.

pub mod connections;
pub mod guard;
pub mod handlers;
pub mod media;
pub mod protobuf;
pub mod server;
pub mod watch;
