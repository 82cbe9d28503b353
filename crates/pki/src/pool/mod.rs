//! A certificate pool that reads and writes trust bundles byte for byte as trust-manager does.
//!
//! caretaker replaces a running trust-manager without rewriting its targets, so the bundle it
//! builds from the same sources must be the same bytes: PEM blocks found as Go finds them
//! ([`pem_blocks`]), certificates accepted or refused as Go's x509 parser does where it matters
//! (negative serial numbers; the one Debian CA that has one is skipped), optional filters for
//! expired and non-CA certificates, de-duplication by SHA-256 of the DER, and output sorted by
//! that hash, 64-column PEM, blocks joined by one newline and no newline at the end.
//!
//! Unlike [`crate::bundle`], text that holds no block is not an error here: trust-manager
//! accepts it and reports an empty bundle only once every source has been read.

mod go_name;
mod pem_blocks;

use std::collections::BTreeMap;

use base64::Engine;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::prelude::{FromDer, X509Certificate};

/// SHA-256 of the DER of Debian's "EC-ACC" CA, whose serial number is negative: Go refuses it, and
/// trust-manager skips it rather than failing every bundle built from Debian's CA store.
const EC_ACC_SHA256: &str = "88497f01602f3154246ae28c4d5aef10f1d87ebb76626f4ae0b7f95ba7968799";

/// Why a PEM source was refused. The messages are trust-manager's, so status conditions read the
/// same after a take-over; none shows a block's content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolError {
    #[error("invalid PEM block in bundle: only CERTIFICATE blocks are permitted but found '{0}'")]
    NotACertificate(String),
    #[error("invalid PEM block in bundle; blocks are not permitted to have PEM headers")]
    Headers,
    #[error("invalid PEM block in bundle; invalid PEM certificate: {0}")]
    Undecodable(String),
}

/// Which certificates a pool leaves out (trust-manager's `--filter-expired-certificates` and
/// `--filter-non-ca-certs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolFilters {
    pub expired: bool,
    pub non_ca: bool,
}

/// One certificate of a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PooledCertificate {
    der: Vec<u8>,
    sha256: [u8; 32],
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    is_ca: bool,
    go_subject: String,
}

impl PooledCertificate {
    /// Parses one DER certificate as Go's x509 parser would; `Ok(None)` for the one certificate
    /// trust-manager skips for compatibility.
    pub fn from_der(der: &[u8]) -> Result<Option<Self>, PoolError> {
        let sha256: [u8; 32] = Sha256::digest(der).into();
        if hex(&sha256) == EC_ACC_SHA256 {
            return Ok(None);
        }
        let (rest, certificate) =
            X509Certificate::from_der(der).map_err(|e| PoolError::Undecodable(e.to_string()))?;
        if !rest.is_empty() {
            return Err(PoolError::Undecodable("x509: trailing data".into()));
        }
        if certificate
            .raw_serial()
            .first()
            .is_some_and(|b| b & 0x80 != 0)
        {
            return Err(PoolError::Undecodable(
                "x509: negative serial number".into(),
            ));
        }
        let go_subject =
            go_name::subject_string(certificate.subject()).map_err(PoolError::Undecodable)?;
        Ok(Some(Self {
            der: der.to_vec(),
            sha256,
            not_before: certificate.validity().not_before.to_datetime(),
            not_after: certificate.validity().not_after.to_datetime(),
            is_ca: certificate.is_ca(),
            go_subject,
        }))
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }

    pub fn sha256(&self) -> &[u8; 32] {
        &self.sha256
    }

    pub fn not_before(&self) -> OffsetDateTime {
        self.not_before
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    pub fn is_ca(&self) -> bool {
        self.is_ca
    }

    /// The subject as Go's `pkix.Name.String()` writes it, e.g. `CN=root,O=example`.
    pub fn go_subject(&self) -> &str {
        &self.go_subject
    }

    /// trust-manager's name for the certificate in JKS and PKCS#12 stores:
    /// `<first 8 hex digits of the SHA-256>|<Go subject>`.
    pub fn alias(&self) -> String {
        format!("{}|{}", &hex(&self.sha256)[..8], self.go_subject)
    }

    /// One PEM block as Go's `pem.Encode` writes it, newline included.
    fn write_pem(&self, out: &mut String) {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let encoded = base64::engine::general_purpose::STANDARD.encode(&self.der);
        for line in encoded.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
}

/// A set of certificates keyed by the SHA-256 of their DER, which is also their output order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificatePool {
    certificates: BTreeMap<[u8; 32], PooledCertificate>,
    filters: PoolFilters,
    now: OffsetDateTime,
}

impl CertificatePool {
    /// An empty pool that applies `filters` as of `now`.
    pub fn new(filters: PoolFilters, now: OffsetDateTime) -> Self {
        Self {
            certificates: BTreeMap::new(),
            filters,
            now,
        }
    }

    /// Adds every certificate of a PEM text (trust-manager's `AddCertsFromPEM`). Text that holds
    /// no block adds nothing and is not an error; a block that is not a certificate, has headers
    /// or does not parse refuses the whole text.
    pub fn add_pem(&mut self, data: &[u8]) -> Result<(), PoolError> {
        for block in pem_blocks::blocks(data) {
            if block.label != "CERTIFICATE" {
                return Err(PoolError::NotACertificate(block.label));
            }
            if block.has_headers {
                return Err(PoolError::Headers);
            }
            if let Some(certificate) = PooledCertificate::from_der(&block.contents)? {
                self.add(certificate);
            }
        }
        Ok(())
    }

    /// Adds one certificate unless a filter leaves it out; says whether it is in the pool.
    pub fn add(&mut self, certificate: PooledCertificate) -> bool {
        if self.filters.expired && self.now > certificate.not_after {
            return false;
        }
        if self.filters.non_ca && !certificate.is_ca {
            return false;
        }
        self.certificates.insert(certificate.sha256, certificate);
        true
    }

    pub fn len(&self) -> usize {
        self.certificates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty()
    }

    /// The certificates in output order (SHA-256 of the DER, ascending).
    pub fn certificates(&self) -> impl ExactSizeIterator<Item = &PooledCertificate> {
        self.certificates.values()
    }

    /// The bundle as trust-manager writes it: blocks joined by `\n`, no trailing newline; empty
    /// for an empty pool.
    pub fn to_pem(&self) -> String {
        let mut out = String::with_capacity(self.certificates.len() * 1024);
        for certificate in self.certificates.values() {
            certificate.write_pem(&mut out);
        }
        out.truncate(out.trim_end().len());
        out
    }
}

/// Lowercase hex, as Go's `hex.EncodeToString` writes it.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
