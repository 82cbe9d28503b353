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
mod auth;
mod controllers;
mod error;
mod http;
mod meta;
mod patch;
mod schema;
mod selectors;
mod store;
mod tls;
mod user;
mod work;

pub use auth::{Access, Authorization};
pub use error::ApiError;
pub use http::connections::ConnectionLimits;
pub use http::server::{
    ADMIN_USER, ApiServer, ApiServerBuilder, DATABASE_FILE, KUBECONFIG_TOKEN_LIFETIME, ServerError,
    Subject, TestServer, kubeconfig_for,
};
pub use tls::install_crypto_provider;
