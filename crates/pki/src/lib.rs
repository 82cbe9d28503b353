//! caretaker's certificate engine: keys, certificate authorities, leaf issuance, CSRs with a
//! signing policy, inspection, trust bundles, rotation timing and TTL parsing.
//!
//! Pure X.509: nothing here knows about Kubernetes, and the only I/O is writing files
//! atomically ([`files`]). Private keys never appear in `Debug` output or error messages.
//!
//! ```
//! use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
//!
//! let ca = CertificateAuthority::create(&CaSpec::new("example-ca")).unwrap();
//! let leaf = ca
//!     .issue(&LeafSpec::new("web", Usage::Server).with_dns_names(["web.example"]))
//!     .unwrap();
//! assert_eq!(leaf.info().issuer, ca.info().subject);
//! assert!(leaf.info().not_after <= ca.info().not_after);
//! ```

mod authority;
pub mod bundle;
mod csr;
mod der;
pub mod files;
mod inspect;
mod key;
pub mod pool;
pub mod rotation;
pub mod truststore;
pub mod ttl;

pub use authority::{CaSpec, CertificateAuthority, IssuedCertificate, LeafSpec, Usage};
pub use bundle::{BundleError, TrustBundle};
pub use csr::{CertificateRequest, CsrSubject, Refusal, SigningPolicy};
pub use inspect::{CertificateInfo, is_issued_by, key_matches_certificate};
pub use key::{KeyAlgorithm, PrivateKey};
pub use pool::{CertificatePool, PoolError, PoolFilters, PooledCertificate};
pub use rotation::RotationPolicy;
pub use ttl::{Ttl, TtlError};

/// Everything that can go wrong in this crate, outside bundle parsing and TTLs' own errors.
/// Messages name the offending value, never key material.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("unknown key algorithm {value:?}; accepted: {accepted}")]
    UnknownAlgorithm { value: String, accepted: String },
    #[error("unknown usage {0:?}; accepted: server, client, both")]
    UnknownUsage(String),
    #[error("could not generate a {algorithm} key: {reason}")]
    KeyGeneration {
        algorithm: KeyAlgorithm,
        reason: String,
    },
    #[error("not a usable private key: {0}")]
    InvalidKey(String),
    #[error("not a valid certificate: {0}")]
    InvalidCertificate(String),
    #[error("{subject} is not a CA certificate (its basicConstraints do not say CA:TRUE)")]
    NotACa { subject: String },
    #[error("the private key does not belong to the certificate {subject}")]
    KeyMismatch { subject: String },
    #[error("the CA {subject} expired at {not_after}")]
    CaExpired {
        subject: String,
        not_after: time::OffsetDateTime,
    },
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidName {
        what: &'static str,
        value: String,
        reason: String,
    },
    #[error("not a valid certificate signing request: {0}")]
    InvalidCsr(String),
    #[error("refused to sign the CSR for {subject}: {refusal}")]
    Refused { subject: String, refusal: Refusal },
    #[error("could not sign the certificate: {0}")]
    Signing(String),
    #[error(transparent)]
    Ttl(#[from] TtlError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
}
