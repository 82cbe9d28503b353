//! caretaker's node agent: the counterpart of k8sd's Cluster API endpoints for kubeadm-style
//! nodes. It knows the node's certificates ([`inventory`]), refreshes them in two steps that keep
//! every private key on the node and every CA key off it ([`refresh`]), runs in-place upgrades
//! as asynchronous operations ([`upgrade`]), installs etcd revisions for its own member ([`etcd`]), and serves all of it over mutual TLS ([`server`],
//! [`tls`]). [`offline`] is the `kubeadm certs`-like tooling that works without the operator.
//!
//! What goes over the wire, the client the operator uses and the kubeadm facts both sides share
//! are `caretaker_agent_api`. This crate must not depend on the operator, and nothing but the
//! binary, the test kit and tests should depend on it.

pub mod command;
pub mod etcd;
pub mod inventory;
pub mod kubeconfig;
pub mod layout;
pub mod offline;
pub mod refresh;
pub mod server;
pub mod tls;
pub mod upgrade;

pub use layout::NodeLayout;
