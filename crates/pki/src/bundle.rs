//! Trust bundles: strict parsing, de-duplication, deterministic order, expiry pruning.
//!
//! A bundle is published to every workload, so parsing is strict: any PEM block that is not
//! a `CERTIFICATE` (a private key pasted by mistake, say) or any certificate that does not
//! decode is an error, and the error names the block's position and label, never its content.

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};
use time::OffsetDateTime;

use crate::CertificateInfo;

/// A bundle that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    #[error("no PEM certificates found")]
    NoCertificates,
    #[error("the PEM text is malformed: {0}")]
    MalformedPem(String),
    #[error(
        "PEM block {index} is labelled {label:?}, not CERTIFICATE; only certificates are \
         accepted here (the block's content is not shown)"
    )]
    NotACertificate { index: usize, label: String },
    #[error("PEM block {index} is not a decodable X.509 certificate: {reason}")]
    Undecodable { index: usize, reason: String },
}

/// One certificate of a bundle with what is needed to order and prune it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleCertificate {
    der: Vec<u8>,
    sha256: [u8; 32],
    info: CertificateInfo,
}

impl BundleCertificate {
    /// Decodes one DER certificate.
    pub fn from_der(der: Vec<u8>) -> Result<Self, crate::PkiError> {
        let info = CertificateInfo::from_der(&der)?;
        let sha256 = Sha256::digest(&der).into();
        Ok(Self { der, sha256, info })
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }

    pub fn info(&self) -> &CertificateInfo {
        &self.info
    }

    pub fn to_pem(&self) -> String {
        pem::encode(&pem::Pem::new("CERTIFICATE", self.der.clone()))
    }

    fn order_key(&self) -> (&str, OffsetDateTime, &[u8; 32]) {
        (&self.info.subject, self.info.not_before, &self.sha256)
    }
}

/// Parses every PEM block of `text` strictly. Text outside PEM blocks (comments) is ignored.
pub fn parse(text: &str) -> Result<Vec<BundleCertificate>, BundleError> {
    let blocks = pem::parse_many(text).map_err(|e| BundleError::MalformedPem(e.to_string()))?;
    if blocks.is_empty() {
        return Err(BundleError::NoCertificates);
    }
    blocks
        .into_iter()
        .enumerate()
        .map(|(i, block)| {
            let index = i + 1;
            if block.tag() != "CERTIFICATE" {
                return Err(BundleError::NotACertificate {
                    index,
                    label: block.tag().to_string(),
                });
            }
            BundleCertificate::from_der(block.into_contents()).map_err(|e| {
                BundleError::Undecodable {
                    index,
                    reason: e.to_string(),
                }
            })
        })
        .collect()
}

/// The SHA-256 fingerprints of the certificates of a PEM text, in order, without decoding
/// them: what a bundle holds, when only that matters. The PEM is read as strictly as by
/// [`parse`]; a block whose DER is not a certificate still has a fingerprint, one no
/// certificate has.
pub fn fingerprints(text: &str) -> Result<Vec<String>, BundleError> {
    let blocks = pem::parse_many(text).map_err(|e| BundleError::MalformedPem(e.to_string()))?;
    if blocks.is_empty() {
        return Err(BundleError::NoCertificates);
    }
    (blocks.iter().enumerate())
        .map(|(i, block)| match block.tag() {
            "CERTIFICATE" => Ok(CertificateInfo::fingerprint_of(block.contents())),
            label => Err(BundleError::NotACertificate {
                index: i + 1,
                label: label.to_string(),
            }),
        })
        .collect()
}

/// The DER of the first certificate of a strictly parsed PEM text.
pub(crate) fn first_certificate_der(text: &str) -> Result<Vec<u8>, crate::PkiError> {
    let mut certificates = parse(text)?;
    Ok(certificates.swap_remove(0).der)
}

/// A normalized bundle: no duplicates, no expired certificates, in a deterministic order
/// (subject, then notBefore, then SHA-256), so the same set always renders the same bytes and
/// writers can skip no-op updates.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrustBundle {
    certificates: Vec<BundleCertificate>,
}

/// Why a certificate was left out of a [`TrustBundle`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DropReason {
    /// The same DER was already in the bundle.
    Duplicate,
    /// Its notAfter was before the time the bundle was built.
    Expired,
}

/// A certificate left out of a [`TrustBundle`], for reports and events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedCertificate {
    pub subject: String,
    pub sha256_fingerprint: String,
    pub not_after: OffsetDateTime,
    pub reason: DropReason,
}

impl TrustBundle {
    /// Builds a bundle of `certificates` as valid at `now`, reporting what was dropped.
    pub fn normalize(
        certificates: impl IntoIterator<Item = BundleCertificate>,
        now: OffsetDateTime,
    ) -> (Self, Vec<DroppedCertificate>) {
        let mut seen = BTreeSet::new();
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for certificate in certificates {
            let reason = if !seen.insert(certificate.sha256) {
                DropReason::Duplicate
            } else if certificate.info.not_after < now {
                DropReason::Expired
            } else {
                kept.push(certificate);
                continue;
            };
            dropped.push(DroppedCertificate {
                subject: certificate.info.subject.clone(),
                sha256_fingerprint: certificate.info.sha256_fingerprint.clone(),
                not_after: certificate.info.not_after,
                reason,
            });
        }
        kept.sort_by(|a, b| a.order_key().cmp(&b.order_key()));
        (Self { certificates: kept }, dropped)
    }

    /// Parses `text` strictly and normalizes it at `now`.
    pub fn from_pem(
        text: &str,
        now: OffsetDateTime,
    ) -> Result<(Self, Vec<DroppedCertificate>), BundleError> {
        Ok(Self::normalize(parse(text)?, now))
    }

    pub fn certificates(&self) -> &[BundleCertificate] {
        &self.certificates
    }

    pub fn len(&self) -> usize {
        self.certificates.len()
    }

    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty()
    }

    /// Concatenated PEM, one block per certificate.
    pub fn to_pem(&self) -> String {
        self.certificates
            .iter()
            .map(BundleCertificate::to_pem)
            .collect()
    }
}
