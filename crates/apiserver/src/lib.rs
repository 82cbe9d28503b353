//! A Kubernetes-compatible API server on SQLite, for one machine.
//!
//! It serves the built-in kinds caretaker needs, any CustomResourceDefinition created at run
//! time, watches, server-side apply, garbage collection and admission webhooks, faithfully
//! enough for kube-rs controllers and `kubectl`. Differences from kube-apiserver are listed in
//! the README.
//!
//! ```no_run
//! # async fn demo() {
//! let server = caretaker_apiserver::TestServer::start().await;
//! let client: kube::Client = server.client();
//! # }
//! ```

mod admission;
mod api;
mod apply;
mod auth;
mod builtin_schemas;
mod connections;
mod controllers;
mod crd;
mod discovery;
mod error;
mod events;
mod guard;
mod handlers;
mod media;
mod meta;
mod openapi;
mod patch;
mod patch_meta;
mod printers;
mod private_files;
mod protobuf;
mod registry;
mod schema;
mod selectors;
mod server;
mod storage;
mod strategic_merge;
mod table;
mod tls;
mod user;
mod watch;
mod work;

pub use auth::{Access, Authorization};
pub use connections::ConnectionLimits;
pub use error::ApiError;
pub use server::{
    ADMIN_USER, ApiServer, ApiServerBuilder, DATABASE_FILE, KUBECONFIG_TOKEN_LIFETIME, ServerError,
    Subject, TestServer, kubeconfig_for,
};
pub use tls::install_crypto_provider;
