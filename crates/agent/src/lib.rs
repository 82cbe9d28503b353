//! caretaker's node agent: the counterpart of k8sd's Cluster API endpoints for kubeadm-style
//! nodes. It knows the node's certificates ([`inventory`]), refreshes them in two steps that keep
//! every private key on the node and every CA key off it ([`refresh`]), runs in-place upgrades
//! as asynchronous operations ([`upgrade`]), and serves all of it over mutual TLS ([`api`]).
//! [`offline`] is the `kubeadm certs`-like tooling that works without the operator.

pub mod api;
pub mod command;
pub mod inventory;
pub mod kubeconfig;
pub mod layout;
pub mod local;
pub mod offline;
pub mod provision;
pub mod refresh;
pub mod tls;
pub mod upgrade;

pub use layout::{NodeLayout, SigningCa};
