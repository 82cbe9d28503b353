//! Certificate authorities and what they issue.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::OnceLock;

use rcgen::{
    BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SerialNumber,
};
use time::OffsetDateTime;

use crate::csr::{distinguished_name, subject_alt_names};
use crate::inspect::parse_der;
use crate::{
    CertificateInfo, CertificateRequest, KeyAlgorithm, PkiError, PrivateKey, SigningPolicy, Ttl,
};

/// Certificates start this long in the past so that nodes whose clocks run slightly behind
/// accept them at once.
const CLOCK_SKEW_ALLOWANCE: time::Duration = time::Duration::minutes(5);

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Usage {
    Server,
    Client,
    Both,
}

impl Usage {
    /// Whether a certificate allowed `self` may be issued for `requested`.
    pub fn permits(self, requested: Usage) -> bool {
        self == Usage::Both || self == requested
    }

    pub(crate) fn extended_key_usages(self) -> Vec<ExtendedKeyUsagePurpose> {
        match self {
            Usage::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
            Usage::Both => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        }
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Usage::Server => "server",
            Usage::Client => "client",
            Usage::Both => "both",
        })
    }
}

impl FromStr for Usage {
    type Err = PkiError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim().to_ascii_lowercase().as_str() {
            "server" => Ok(Usage::Server),
            "client" => Ok(Usage::Client),
            "both" => Ok(Usage::Both),
            _ => Err(PkiError::UnknownUsage(value.to_string())),
        }
    }
}

/// A self-signed CA to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaSpec {
    pub common_name: String,
    pub validity: Ttl,
    /// How many intermediate CAs may follow; `None` for no limit.
    pub path_len: Option<u8>,
    pub algorithm: KeyAlgorithm,
}

impl CaSpec {
    /// A 10-year ECDSA P-256 CA that may sign leaves only (path length 0).
    pub fn new(common_name: impl Into<String>) -> Self {
        Self {
            common_name: common_name.into(),
            validity: Ttl::calendar(10, 0, 0).expect("10y is a valid TTL"),
            path_len: Some(0),
            algorithm: KeyAlgorithm::EcdsaP256,
        }
    }
}

/// A leaf certificate to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    pub common_name: String,
    pub organizations: Vec<String>,
    pub dns_names: Vec<String>,
    pub ip_addresses: Vec<IpAddr>,
    pub usage: Usage,
    /// Capped at the CA's own expiry.
    pub validity: Ttl,
    pub algorithm: KeyAlgorithm,
}

impl LeafSpec {
    /// A one-year ECDSA P-256 leaf without SANs.
    pub fn new(common_name: impl Into<String>, usage: Usage) -> Self {
        Self {
            common_name: common_name.into(),
            organizations: Vec::new(),
            dns_names: Vec::new(),
            ip_addresses: Vec::new(),
            usage,
            validity: Ttl::calendar(1, 0, 0).expect("1y is a valid TTL"),
            algorithm: KeyAlgorithm::EcdsaP256,
        }
    }

    pub fn with_dns_names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.dns_names.extend(names.into_iter().map(Into::into));
        self
    }

    pub fn with_ip_addresses(mut self, ips: impl IntoIterator<Item = IpAddr>) -> Self {
        self.ip_addresses.extend(ips);
        self
    }

    pub fn with_organizations<S: Into<String>>(mut self, o: impl IntoIterator<Item = S>) -> Self {
        self.organizations.extend(o.into_iter().map(Into::into));
        self
    }

    pub fn with_validity(mut self, validity: Ttl) -> Self {
        self.validity = validity;
        self
    }

    pub fn with_algorithm(mut self, algorithm: KeyAlgorithm) -> Self {
        self.algorithm = algorithm;
        self
    }
}

/// A freshly issued certificate and, unless it was signed from a CSR, its new key.
#[derive(Debug)]
pub struct IssuedCertificate {
    pub certificate_pem: String,
    pub certificate_der: Vec<u8>,
    /// `None` when signed from a CSR: the key stays with whoever made the CSR.
    pub key: Option<PrivateKey>,
    /// The requested validity reached past the CA's notAfter and was cut to it.
    pub capped_at_issuer: bool,
    /// Parsed on first use: bulk issuance rarely needs it.
    info: OnceLock<CertificateInfo>,
}

impl IssuedCertificate {
    /// What the new certificate says.
    pub fn info(&self) -> &CertificateInfo {
        self.info.get_or_init(|| {
            CertificateInfo::from_der(&self.certificate_der)
                .expect("a certificate this crate just signed parses")
        })
    }
}

/// A CA: its certificate and signing key.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    certificate_der: Vec<u8>,
    info: CertificateInfo,
    algorithm: KeyAlgorithm,
}

impl fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("subject", &self.info.subject)
            .field("not_after", &self.info.not_after)
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// Creates a self-signed CA with a fresh key.
    pub fn create(spec: &CaSpec) -> Result<Self, PkiError> {
        let key = PrivateKey::generate(spec.algorithm)?;
        let now = now_seconds();
        let not_before = now - CLOCK_SKEW_ALLOWANCE;
        let not_after = expiry(&spec.validity, now)?;

        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&spec.common_name, &[]);
        params.is_ca = IsCa::Ca(match spec.path_len {
            Some(n) => BasicConstraints::Constrained(n),
            None => BasicConstraints::Unconstrained,
        });
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        params.not_before = not_before;
        params.not_after = not_after;
        params.serial_number = Some(random_serial()?);
        let certificate = params
            .self_signed(key.pair())
            .map_err(|e| PkiError::Signing(e.to_string()))?;
        let der = certificate.der().to_vec();
        Self::from_parts(der, key)
    }

    /// Loads a CA from its PEM certificate and PEM private key, checking that the certificate
    /// is a CA and that the key is its own.
    pub fn from_pem(certificate_pem: &str, key_pem: &str) -> Result<Self, PkiError> {
        let der = crate::bundle::first_certificate_der(certificate_pem)?;
        let key = PrivateKey::from_pem(key_pem)?;
        Self::from_parts(der, key)
    }

    fn from_parts(certificate_der: Vec<u8>, key: PrivateKey) -> Result<Self, PkiError> {
        let info = CertificateInfo::from_der(&certificate_der)?;
        if !info.is_ca {
            return Err(PkiError::NotACa {
                subject: info.subject,
            });
        }
        let parsed = parse_der(&certificate_der)?;
        if parsed.public_key().raw != key.public_key_der().as_slice() {
            return Err(PkiError::KeyMismatch {
                subject: info.subject,
            });
        }
        let algorithm = key.algorithm();
        let issuer = Issuer::from_ca_cert_der(&certificate_der.as_slice().into(), key.into_pair())
            .map_err(|e| PkiError::InvalidCertificate(e.to_string()))?;
        Ok(Self {
            issuer,
            certificate_der,
            info,
            algorithm,
        })
    }

    pub fn info(&self) -> &CertificateInfo {
        &self.info
    }

    pub fn certificate_der(&self) -> &[u8] {
        &self.certificate_der
    }

    pub fn certificate_pem(&self) -> String {
        pem::encode(&pem::Pem::new("CERTIFICATE", self.certificate_der.clone()))
    }

    /// The CA's private key as PKCS#8 PEM, for writing to a 0600 file or a Secret.
    pub fn private_key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// Issues a leaf with a fresh key of `spec.algorithm`.
    pub fn issue(&self, spec: &LeafSpec) -> Result<IssuedCertificate, PkiError> {
        let key = PrivateKey::generate(spec.algorithm)?;
        let mut issued = self.sign(spec, key.pair(), key.algorithm().is_rsa())?;
        issued.key = Some(key);
        Ok(issued)
    }

    /// Issues a leaf for an existing key (the key is not returned).
    pub fn issue_for_key(
        &self,
        spec: &LeafSpec,
        key: &PrivateKey,
    ) -> Result<IssuedCertificate, PkiError> {
        self.sign(spec, key.pair(), key.algorithm().is_rsa())
    }

    /// Signs a PEM CSR after checking it against `policy`, valid for `validity` (capped at
    /// the CA's notAfter). The certificate carries only what the CSR asked for and the
    /// policy allowed; key usages and basic constraints are set here, never taken from the
    /// CSR.
    pub fn sign_request(
        &self,
        csr_pem: &str,
        policy: &SigningPolicy,
        validity: &Ttl,
    ) -> Result<IssuedCertificate, PkiError> {
        let request = CertificateRequest::from_pem(csr_pem)?;
        policy
            .check(&request)
            .map_err(|refusal| PkiError::Refused {
                subject: request.describe(),
                refusal,
            })?;
        let (Some(common_name), Some(usage)) = (request.common_name.clone(), request.usage) else {
            unreachable!("the policy check requires a common name and a usage");
        };
        let spec = LeafSpec {
            common_name,
            organizations: request.organizations.clone(),
            dns_names: request.dns_names.clone(),
            ip_addresses: request.ip_addresses.clone(),
            usage,
            validity: *validity,
            algorithm: KeyAlgorithm::default(),
        };
        let public_key = rcgen::SubjectPublicKeyInfo::from_der(&request.public_key_der)
            .map_err(|e| PkiError::InvalidCsr(e.to_string()))?;
        let is_rsa = crate::inspect::key_algorithm_of_spki(&request.public_key_der)
            .is_some_and(KeyAlgorithm::is_rsa);
        self.sign(&spec, &public_key, is_rsa)
    }

    fn sign(
        &self,
        spec: &LeafSpec,
        public_key: &impl rcgen::PublicKeyData,
        is_rsa: bool,
    ) -> Result<IssuedCertificate, PkiError> {
        let now = now_seconds();
        if self.info.not_after <= now {
            return Err(PkiError::CaExpired {
                subject: self.info.subject.clone(),
                not_after: self.info.not_after,
            });
        }
        let wanted_not_after = expiry(&spec.validity, now)?;
        let capped_at_issuer = wanted_not_after > self.info.not_after;

        let mut params = CertificateParams::default();
        params.distinguished_name = distinguished_name(&spec.common_name, &spec.organizations);
        params.subject_alt_names = subject_alt_names(&spec.dns_names, &spec.ip_addresses)?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // Only RSA keys encrypt key material in TLS key exchange.
        if is_rsa {
            params.key_usages.push(KeyUsagePurpose::KeyEncipherment);
        }
        params.extended_key_usages = spec.usage.extended_key_usages();
        params.use_authority_key_identifier_extension = true;
        params.not_before = (now - CLOCK_SKEW_ALLOWANCE).max(self.info.not_before);
        params.not_after = wanted_not_after.min(self.info.not_after);
        params.serial_number = Some(random_serial()?);

        let certificate = params
            .signed_by(public_key, &self.issuer)
            .map_err(|e| PkiError::Signing(e.to_string()))?;
        let certificate_der = certificate.der().to_vec();
        Ok(IssuedCertificate {
            certificate_pem: certificate.pem(),
            certificate_der,
            key: None,
            capped_at_issuer,
            info: OnceLock::new(),
        })
    }
}

fn now_seconds() -> OffsetDateTime {
    let now = OffsetDateTime::now_utc();
    now.replace_nanosecond(0).unwrap_or(now)
}

fn expiry(validity: &Ttl, start: OffsetDateTime) -> Result<OffsetDateTime, PkiError> {
    validity
        .expires_at(start)
        .ok_or_else(|| {
            PkiError::Ttl(crate::TtlError {
                value: validity.to_string(),
                problem: crate::ttl::TtlProblem::Overflow,
            })
        })
        .map(|t| t.replace_nanosecond(0).unwrap_or(t))
}

/// 128 random bits with the top bit cleared, so the DER INTEGER stays positive and 16 bytes.
fn random_serial() -> Result<SerialNumber, PkiError> {
    use aws_lc_rs::rand::{SecureRandom, SystemRandom};
    let mut bytes = [0u8; 16];
    SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| PkiError::Signing("the system random source failed".into()))?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}
