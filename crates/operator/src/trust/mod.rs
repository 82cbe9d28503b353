//! trust-manager's Bundle and ClusterBundle, decided without Kubernetes: caretaker serves `Bundle`
//! (`trust.cert-manager.io/v1alpha1`) exactly as trust-manager does, so it can replace a running
//! trust-manager without rewriting one target; it serves `ClusterBundle`
//! (`trust-manager.io/v1alpha2`) with the same engine, and migrates Bundles to ClusterBundles as
//! the rename design describes.
//!
//! - [`api`]: the Bundle types and the names targets carry;
//! - [`cluster_bundle`]: the renamed API (`ClusterBundle`, `trust-manager.io/v1alpha2`), and a
//!   Bundle's spec converted to it as upstream converts it;
//! - [`sources`]: the certificate pool built from a Bundle's sources in the trust namespace, on
//!   `caretaker_pki`'s trust-manager-exact [`caretaker_pki::CertificatePool`];
//! - [`package`]: the default CA package (`useDefaultCAs`);
//! - [`target`]: whether a target needs a write (from its metadata alone), and the apply bodies;
//! - [`selector`]: label selectors as Kubernetes matches and prints them;
//! - [`plan`]: one pass over a Bundle or a ClusterBundle, as a [`plan::BundlePlan`];
//! - [`migration`]: a Bundle applied as its ClusterBundle, and its status mirrored back;
//! - [`validation`]: trust-manager's admission rules, with its messages.
//!
//! The kube-rs glue is [`controller`] and [`controller::migration`].

pub mod api;
pub mod cluster_bundle;
pub mod controller;
pub mod migration;
pub mod package;
pub mod plan;
pub mod selector;
pub mod sources;
pub mod target;
pub mod validation;

#[cfg(test)]
mod tests;

/// Lowercase hex, as Go's `hex.EncodeToString` writes the hashes trust-manager records.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
