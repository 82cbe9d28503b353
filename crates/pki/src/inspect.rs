//! Reading certificates: what they say, and whether a key belongs to one.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;
use x509_parser::x509::SubjectPublicKeyInfo;

use crate::{KeyAlgorithm, PkiError, PrivateKey};

/// What a certificate says, in the terms people look for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateInfo {
    /// The subject as `CN=…, O=…`.
    pub subject: String,
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
    pub issuer: String,
    /// The issuer's common name, read from the name itself (a `, ` in it is no separator).
    #[serde(default)]
    pub issuer_common_name: Option<String>,
    /// Colon-separated lowercase hex, as openssl prints it.
    pub serial: String,
    #[serde(with = "time::serde::rfc3339")]
    pub not_before: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub not_after: OffsetDateTime,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub is_ca: bool,
    pub path_len: Option<u32>,
    /// Key usages as openssl names them (`Digital Signature`, `Certificate Sign`, …).
    pub key_usages: Vec<String>,
    /// Extended key usages (`serverAuth`, `clientAuth`, …).
    pub extended_key_usages: Vec<String>,
    pub subject_key_id: Option<String>,
    pub authority_key_id: Option<String>,
    /// Such as `ECDSA P-256`, `Ed25519`, `RSA 2048`.
    pub key_algorithm: String,
    /// SHA-256 of the DER, colon-separated hex.
    pub sha256_fingerprint: String,
}

impl CertificateInfo {
    /// The SHA-256 fingerprint of a certificate's DER, as [`Self::sha256_fingerprint`] says
    /// it, without decoding the certificate.
    pub fn fingerprint_of(der: &[u8]) -> String {
        hex(&Sha256::digest(der))
    }

    /// Inspects one DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, PkiError> {
        let cert = parse_der(der)?;
        Ok(describe(&cert, der))
    }

    /// Inspects the first certificate of a PEM text. Use [`crate::bundle`] for many.
    pub fn from_pem(pem: &str) -> Result<Self, PkiError> {
        let der = crate::bundle::first_certificate_der(pem)?;
        Self::from_der(&der)
    }

    /// Whether the certificate is valid at `now`.
    pub fn is_valid_at(&self, now: OffsetDateTime) -> bool {
        self.not_before <= now && now <= self.not_after
    }
}

pub(crate) fn parse_der(der: &[u8]) -> Result<X509Certificate<'_>, PkiError> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        Ok(_) => Err(PkiError::InvalidCertificate(
            "trailing bytes after the certificate".into(),
        )),
        Err(e) => Err(PkiError::InvalidCertificate(e.to_string())),
    }
}

fn describe(cert: &X509Certificate<'_>, der: &[u8]) -> CertificateInfo {
    let subject = cert.subject();
    let text = |attr: &x509_parser::x509::AttributeTypeAndValue<'_>| {
        attr.as_str().map(str::to_string).unwrap_or_default()
    };
    let mut info = CertificateInfo {
        subject: subject.to_string(),
        common_name: subject.iter_common_name().next().map(text),
        organizations: subject.iter_organization().map(text).collect(),
        issuer: cert.issuer().to_string(),
        issuer_common_name: cert.issuer().iter_common_name().next().map(text),
        serial: hex(cert.raw_serial()),
        not_before: cert.validity().not_before.to_datetime(),
        not_after: cert.validity().not_after.to_datetime(),
        dns_names: Vec::new(),
        ip_addresses: Vec::new(),
        is_ca: false,
        path_len: None,
        key_usages: Vec::new(),
        extended_key_usages: Vec::new(),
        subject_key_id: subject_key_id(cert).map(hex),
        authority_key_id: authority_key_id(cert).map(hex),
        key_algorithm: describe_public_key(cert.public_key()),
        sha256_fingerprint: CertificateInfo::fingerprint_of(der),
    };
    for extension in cert.extensions() {
        match extension.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    match name {
                        GeneralName::DNSName(dns) => info.dns_names.push(dns.to_string()),
                        GeneralName::IPAddress(bytes) => {
                            if let Some(ip) = ip_from_bytes(bytes) {
                                info.ip_addresses.push(ip);
                            }
                        }
                        _ => {}
                    }
                }
            }
            ParsedExtension::BasicConstraints(bc) => {
                info.is_ca = bc.ca;
                info.path_len = bc.path_len_constraint;
            }
            ParsedExtension::KeyUsage(ku) => {
                info.key_usages = ku
                    .to_string()
                    .split(", ")
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect();
            }
            ParsedExtension::ExtendedKeyUsage(eku) => {
                let flags = [
                    (eku.any, "any"),
                    (eku.server_auth, "serverAuth"),
                    (eku.client_auth, "clientAuth"),
                    (eku.code_signing, "codeSigning"),
                    (eku.email_protection, "emailProtection"),
                    (eku.time_stamping, "timeStamping"),
                    (eku.ocsp_signing, "OCSPSigning"),
                ];
                info.extended_key_usages = flags
                    .iter()
                    .filter(|(set, _)| *set)
                    .map(|(_, name)| name.to_string())
                    .chain(eku.other.iter().map(|oid| oid.to_id_string()))
                    .collect();
            }
            _ => {}
        }
    }
    info
}

pub(crate) fn ip_from_bytes(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

const OID_RSA: &str = "1.2.840.113549.1.1.1";
const OID_EC: &str = "1.2.840.10045.2.1";
const OID_ED25519: &str = "1.3.101.112";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";

fn describe_public_key(spki: &SubjectPublicKeyInfo<'_>) -> String {
    let algorithm = spki.algorithm.algorithm.to_id_string();
    match algorithm.as_str() {
        OID_RSA => match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => format!("RSA {}", rsa.key_size()),
            _ => "RSA".into(),
        },
        OID_EC => match curve_of(spki).as_deref() {
            Some(OID_P256) => "ECDSA P-256".into(),
            Some(OID_P384) => "ECDSA P-384".into(),
            Some(other) => format!("ECDSA ({other})"),
            None => "ECDSA".into(),
        },
        OID_ED25519 => "Ed25519".into(),
        other => other.to_string(),
    }
}

fn curve_of(spki: &SubjectPublicKeyInfo<'_>) -> Option<String> {
    let parameters = spki.algorithm.parameters.as_ref()?;
    Some(parameters.as_oid().ok()?.to_id_string())
}

/// The [`KeyAlgorithm`] of a DER SubjectPublicKeyInfo, when it is one caretaker makes.
pub(crate) fn key_algorithm_of_spki(spki_der: &[u8]) -> Option<KeyAlgorithm> {
    let (_, spki) = SubjectPublicKeyInfo::from_der(spki_der).ok()?;
    Some(match describe_public_key(&spki).as_str() {
        "ECDSA P-256" => KeyAlgorithm::EcdsaP256,
        "ECDSA P-384" => KeyAlgorithm::EcdsaP384,
        "Ed25519" => KeyAlgorithm::Ed25519,
        "RSA 2048" => KeyAlgorithm::Rsa2048,
        "RSA 3072" => KeyAlgorithm::Rsa3072,
        "RSA 4096" => KeyAlgorithm::Rsa4096,
        _ => return None,
    })
}

/// Whether `key` is the private half of the certificate's public key.
pub fn key_matches_certificate(key: &PrivateKey, certificate_der: &[u8]) -> Result<bool, PkiError> {
    let cert = parse_der(certificate_der)?;
    Ok(cert.public_key().raw == key.public_key_der().as_slice())
}

/// Whether `certificate_der` was signed by the CA `issuer_der`: the issuer name matches the
/// CA's subject, the authority key identifier (when both carry one) the CA's subject key
/// identifier, and the signature verifies with the CA's public key.
///
/// The key identifiers tell apart CAs of one name (each rotation's), without the signature
/// check that costs as much as signing: OpenSSL too refuses an issuer whose key identifier is
/// not the one the certificate names (`X509_V_ERR_AKID_SKID_MISMATCH`).
pub fn is_issued_by(certificate_der: &[u8], issuer_der: &[u8]) -> Result<bool, PkiError> {
    let certificate = parse_der(certificate_der)?;
    let issuer = parse_der(issuer_der)?;
    if certificate.issuer().as_raw() != issuer.subject().as_raw() {
        return Ok(false);
    }
    if let (Some(named), Some(own)) = (authority_key_id(&certificate), subject_key_id(&issuer))
        && named != own
    {
        return Ok(false);
    }
    Ok(certificate
        .verify_signature(Some(issuer.public_key()))
        .is_ok())
}

fn authority_key_id<'a>(certificate: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    certificate
        .extensions()
        .iter()
        .find_map(|extension| match extension.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(aki) => {
                aki.key_identifier.as_ref().map(|id| id.0)
            }
            _ => None,
        })
}

fn subject_key_id<'a>(certificate: &'a X509Certificate<'_>) -> Option<&'a [u8]> {
    certificate
        .extensions()
        .iter()
        .find_map(|extension| match extension.parsed_extension() {
            ParsedExtension::SubjectKeyIdentifier(id) => Some(id.0),
            _ => None,
        })
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    // Every certificate read makes one: one allocation, not one per byte.
    let mut text = String::with_capacity(bytes.len() * 3);
    for (i, b) in bytes.iter().enumerate() {
        if i > 0 {
            text.push(':');
        }
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    text
}
