//! Binary trust stores for Java and other TLS stacks: JKS and PKCS#12, written as trust-manager
//! writes them so that a store caretaker writes reads the same as one trust-manager wrote.

pub mod jks;
pub mod pkcs12;

pub use pkcs12::Pkcs12Profile;

/// Why a trust store could not be written. No message carries a password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TrustStoreError {
    #[error(
        "the certificate {alias:?} has a subject with characters outside UCS-2, which PKCS#12 names cannot hold"
    )]
    NotUcs2 { alias: String },
    #[error("the PKCS#12 password has characters outside UCS-2")]
    PasswordNotUcs2,
    #[error("the system's cryptography failed while encrypting the trust store")]
    Crypto,
}
