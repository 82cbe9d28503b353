//! caretaker's Kubernetes-facing types, at the bottom of the workspace: its own API,
//! `caretaker.dev/v1alpha1` ([`v1alpha1`], the CRDs `caretaker crds` prints), the names it reads
//! and writes on other objects ([`names`], many of them fixed by upstream projects), and the
//! Cluster API kinds it watches ([`cluster_api`]).
//!
//! Types only: what a spec means to caretaker (its validation into policies) is the operator's,
//! so that the test kit, `caretaker crds` and the tests depend on the types and not on the
//! controllers.

pub mod cluster_api;
pub mod names;
pub mod v1alpha1;
