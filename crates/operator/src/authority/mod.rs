//! Self-managed certificate authorities (`CertificateAuthority`, `IssuedCertificate`): when a CA
//! rotates, what its trust bundle holds, when a certificate it signed is issued again. Pure
//! decisions from observed state and the clock, no Kubernetes; the glue in
//! `controllers::authority` observes and applies them.
//!
//! Trust before sign: a new CA is first published in the bundle (beside every older CA that has
//! not expired) and in every injection point; only once `trust_propagation` has passed since
//! does it sign anything. Until then the CA it replaces keeps signing.

use std::time::Duration;

use caretaker_pki::{CaSpec, LeafSpec, RotationPolicy};

/// What a `CertificateAuthority` asks for, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthorityPolicy {
    /// Subject, validity and key algorithm of each CA generated.
    pub ca: CaSpec,
    /// When a CA is due to be replaced.
    pub rotation: RotationPolicy,
    /// How long a new CA is trusted everywhere before it signs.
    pub trust_propagation: Duration,
}

/// What an `IssuedCertificate` asks for, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct CertificatePolicy {
    /// Subject, names, usage, validity and key algorithm of each certificate issued.
    pub leaf: LeafSpec,
    /// When a certificate is due to be issued again.
    pub rotation: RotationPolicy,
}
