//! caretaker's controllers, one folder per feature. Decisions are pure functions from observed
//! state to a plan of actions, tested without Kubernetes: a Machine's refresh and upgrade
//! ([`machine::refresh`], [`machine::upgrade`], their common pieces in [`machine::plan`]) and
//! what may be signed for it ([`machine::signing`]), cluster-wide rollouts ([`rollout`], a pass
//! over a parent in [`rollout::parent`], a Cluster's chain in [`rollout::chain`]), caretaker's
//! CAs ([`authority`]), etcd's certificates ([`etcd`]), trust-manager's Bundles ([`trust`]) and
//! which trust bundle goes into which `caBundle` field ([`injection`]). Plans are made of
//! [`changes`] (annotations to write, events to publish) and [`schedule::Next`]. The kube-rs
//! glue that observes and applies is each feature's `controller` ([`machine::controller`],
//! [`rollout::controller`], [`authority::controller`], [`etcd::controller`],
//! [`injection::controller`], [`trust::controller`]); [`controllers`] starts them all. What every controller shares imports no feature: [`runtime`] (writes on the
//! version read, status memory, refusals, the step executor), [`context`], [`credentials`] and
//! [`metrics`] (the metric families and the servers of `/metrics`, `/healthz` and `/readyz`).
//!
//! The Kubernetes-facing types are `caretaker-api`'s: caretaker's own API
//! (`caretaker.dev/v1alpha1`), every name users see, the Cluster API kinds. What a spec means
//! is decided here: [`validation`] checks its fields, and each feature reads the spec into the
//! policy it decides with ([`authority::policy`], [`etcd::policy`]); the admission webhook that
//! applies those checks to every write is [`webhook`].
//!
//! It talks to node agents through `caretaker-agent-api` (wire types, client, kubeadm facts)
//! and must not depend on `caretaker-agent` itself, nor on `caretaker-testkit` outside its
//! integration tests and benchmarks.

mod answers;
pub mod authority;
pub mod changes;
pub mod context;
pub mod controllers;
pub mod credentials;
mod error;
pub mod etcd;
pub mod injection;
pub mod leader;
pub mod machine;
pub mod metrics;
pub mod ownership;
pub mod process;
pub mod replica;
pub mod rollout;
pub mod runtime;
pub mod schedule;
mod settings;
pub mod shutdown;
pub mod timestamp;
pub mod trust;
pub mod validation;
pub mod webhook;

pub use context::Context;
pub use error::Error;
pub use settings::{BindAddress, Settings, TrustSettings};
