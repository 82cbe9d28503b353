//! Certificate signing requests: made on the node (the key never leaves it), checked against a
//! [`SigningPolicy`] before a CA signs them.

use std::net::IpAddr;

use rcgen::{CertificateParams, DistinguishedName, DnType, IsCa, SanType};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::inspect::ip_from_bytes;
use crate::{PkiError, PrivateKey, Usage};

/// What a CSR asks for: the subject and SANs of the certificate and its usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsrSubject {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub usage: Usage,
}

impl CsrSubject {
    /// Creates a PEM CSR for this subject signed with `key`.
    pub fn to_csr_pem(&self, key: &PrivateKey) -> Result<String, PkiError> {
        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&self.common_name, &self.organizations);
        params.subject_alt_names = subject_alt_names(&self.dns_names, &self.ip_addresses)?;
        params.extended_key_usages = self.usage.extended_key_usages();
        params.is_ca = IsCa::ExplicitNoCa;
        let csr = params
            .serialize_request(key.pair())
            .map_err(|e| PkiError::Signing(e.to_string()))?;
        csr.pem().map_err(|e| PkiError::Signing(e.to_string()))
    }
}

pub(crate) fn distinguished_name(common_name: &str, organizations: &[String]) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    for organization in organizations {
        name.push(DnType::OrganizationName, organization.as_str());
    }
    name.push(DnType::CommonName, common_name);
    name
}

pub(crate) fn subject_alt_names(dns: &[String], ips: &[IpAddr]) -> Result<Vec<SanType>, PkiError> {
    let mut sans = Vec::with_capacity(dns.len() + ips.len());
    for name in dns {
        let ia5 = name
            .as_str()
            .try_into()
            .map_err(|e: rcgen::Error| PkiError::InvalidName {
                what: "DNS name",
                value: name.clone(),
                reason: e.to_string(),
            })?;
        sans.push(SanType::DnsName(ia5));
    }
    sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    Ok(sans)
}

/// A parsed CSR whose self-signature has been verified, with everything it asks for, including
/// what caretaker never signs (so a refusal can name it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateRequest {
    pub common_name: Option<String>,
    pub organizations: Vec<String>,
    /// Subject attributes other than CN and O, as `OID=value`.
    pub other_subject_attributes: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// SANs other than DNS and IP (emails, URIs, …), described.
    pub other_names: Vec<String>,
    /// The usage its extended key usages amount to, if they are server and/or client auth.
    pub usage: Option<Usage>,
    /// Extended key usages other than serverAuth and clientAuth.
    pub other_usages: Vec<String>,
    pub requests_ca: bool,
    /// OIDs of requested extensions caretaker does not sign.
    pub unsupported_extensions: Vec<String>,
    pub(crate) public_key_der: Vec<u8>,
}

impl CertificateRequest {
    /// Parses a PEM CSR and verifies its signature.
    pub fn from_pem(text: &str) -> Result<Self, PkiError> {
        let block = pem::parse(text).map_err(|e| PkiError::InvalidCsr(e.to_string()))?;
        if block.tag() != "CERTIFICATE REQUEST" && block.tag() != "NEW CERTIFICATE REQUEST" {
            return Err(PkiError::InvalidCsr(format!(
                "PEM block is labelled {:?}, not CERTIFICATE REQUEST",
                block.tag()
            )));
        }
        Self::from_der(block.contents())
    }

    /// Parses a DER CSR and verifies its signature.
    pub fn from_der(der: &[u8]) -> Result<Self, PkiError> {
        let (_, csr) = X509CertificationRequest::from_der(der)
            .map_err(|e| PkiError::InvalidCsr(e.to_string()))?;
        csr.verify_signature()
            .map_err(|_| PkiError::InvalidCsr("its signature does not verify".into()))?;
        let info = &csr.certification_request_info;

        let mut request = CertificateRequest {
            common_name: None,
            organizations: Vec::new(),
            other_subject_attributes: Vec::new(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            other_names: Vec::new(),
            usage: None,
            other_usages: Vec::new(),
            requests_ca: false,
            unsupported_extensions: Vec::new(),
            public_key_der: info.subject_pki.raw.to_vec(),
        };
        for attribute in info.subject.iter_attributes() {
            let value = attribute.as_str().unwrap_or("<non-text>").to_string();
            match attribute.attr_type().to_id_string().as_str() {
                "2.5.4.3" if request.common_name.is_none() => request.common_name = Some(value),
                "2.5.4.10" => request.organizations.push(value),
                oid => request
                    .other_subject_attributes
                    .push(format!("{oid}={value}")),
            }
        }
        for extension in csr.requested_extensions().into_iter().flatten() {
            match extension {
                ParsedExtension::SubjectAlternativeName(san) => {
                    for name in &san.general_names {
                        match name {
                            GeneralName::DNSName(dns) => request.dns_names.push(dns.to_string()),
                            GeneralName::IPAddress(bytes) => match ip_from_bytes(bytes) {
                                Some(ip) => request.ip_addresses.push(ip),
                                None => request.other_names.push("malformed IP address".into()),
                            },
                            other => request.other_names.push(other.to_string()),
                        }
                    }
                }
                ParsedExtension::ExtendedKeyUsage(eku) => {
                    request.usage = match (eku.server_auth, eku.client_auth) {
                        (true, true) => Some(Usage::Both),
                        (true, false) => Some(Usage::Server),
                        (false, true) => Some(Usage::Client),
                        (false, false) => None,
                    };
                    let others = [
                        (eku.any, "any"),
                        (eku.code_signing, "codeSigning"),
                        (eku.email_protection, "emailProtection"),
                        (eku.time_stamping, "timeStamping"),
                        (eku.ocsp_signing, "OCSPSigning"),
                    ];
                    request.other_usages.extend(
                        others
                            .iter()
                            .filter(|(set, _)| *set)
                            .map(|(_, name)| name.to_string())
                            .chain(eku.other.iter().map(|oid| oid.to_id_string())),
                    );
                }
                ParsedExtension::BasicConstraints(bc) => request.requests_ca |= bc.ca,
                // The signer sets key usages itself; what the CSR asks is irrelevant.
                ParsedExtension::KeyUsage(_) => {}
                _ => request
                    .unsupported_extensions
                    .push("an unsupported extension".into()),
            }
        }
        Ok(request)
    }

    /// A short description for messages: the CN, or `<no CN>`.
    pub fn describe(&self) -> String {
        match &self.common_name {
            Some(cn) => format!("CN={cn}"),
            None => "<no CN>".into(),
        }
    }
}

/// What a CA may sign for one request. Everything not listed is refused; CA:true never is
/// signed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SigningPolicy {
    /// Allowed common names (exact match).
    pub common_names: Vec<String>,
    /// Allowed organizations (exact match).
    pub organizations: Vec<String>,
    /// Allowed DNS SANs (compared case-insensitively).
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    /// The widest usage allowed; `Both` allows server, client or both.
    pub usage: Option<Usage>,
}

/// Why a CSR was refused. Each names the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("it asks to be a CA (basicConstraints CA:TRUE)")]
    CaRequested,
    #[error("it has no common name")]
    MissingCommonName,
    #[error("common name {0:?} is not allowed")]
    CommonName(String),
    #[error("organization {0:?} is not allowed")]
    Organization(String),
    #[error("subject attribute {0} is not allowed (only CN and O are signed)")]
    SubjectAttribute(String),
    #[error("DNS SAN {0:?} is not allowed")]
    DnsName(String),
    #[error("IP SAN {0} is not allowed")]
    IpAddress(IpAddr),
    #[error("SAN {0} is not allowed (only DNS and IP SANs are signed)")]
    OtherName(String),
    #[error("it asks for no server or client usage")]
    NoUsage,
    #[error("usage {requested} is not allowed (allowed: {allowed})")]
    Usage { requested: Usage, allowed: String },
    #[error("extended key usage {0} is not allowed")]
    OtherUsage(String),
    #[error("it asks for {0}, which caretaker does not sign")]
    Extension(String),
}

impl SigningPolicy {
    /// The first reason to refuse `request`, if any.
    pub fn check(&self, request: &CertificateRequest) -> Result<(), Refusal> {
        if request.requests_ca {
            return Err(Refusal::CaRequested);
        }
        if let Some(extension) = request.unsupported_extensions.first() {
            return Err(Refusal::Extension(extension.clone()));
        }
        let common_name = request
            .common_name
            .as_ref()
            .ok_or(Refusal::MissingCommonName)?;
        if !self.common_names.contains(common_name) {
            return Err(Refusal::CommonName(common_name.clone()));
        }
        if let Some(attribute) = request.other_subject_attributes.first() {
            return Err(Refusal::SubjectAttribute(attribute.clone()));
        }
        if let Some(o) = request
            .organizations
            .iter()
            .find(|o| !self.organizations.contains(o))
        {
            return Err(Refusal::Organization(o.clone()));
        }
        if let Some(dns) = request
            .dns_names
            .iter()
            .find(|d| !self.dns_names.iter().any(|a| a.eq_ignore_ascii_case(d)))
        {
            return Err(Refusal::DnsName(dns.clone()));
        }
        if let Some(ip) = request
            .ip_addresses
            .iter()
            .find(|ip| !self.ip_addresses.contains(ip))
        {
            return Err(Refusal::IpAddress(*ip));
        }
        if let Some(other) = request.other_names.first() {
            return Err(Refusal::OtherName(other.clone()));
        }
        if let Some(other) = request.other_usages.first() {
            return Err(Refusal::OtherUsage(other.clone()));
        }
        let requested = request.usage.ok_or(Refusal::NoUsage)?;
        match self.usage {
            Some(allowed) if allowed.permits(requested) => Ok(()),
            allowed => Err(Refusal::Usage {
                requested,
                allowed: allowed.map_or("none".into(), |u| u.to_string()),
            }),
        }
    }
}
