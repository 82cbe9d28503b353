//! Mutual TLS between operator and agent. Both sides chain to the cluster CA; the agent accepts
//! exactly one client identity (by certificate common name), checked during the handshake, so a
//! wrong or missing client certificate gets nothing but a TLS alert.

use std::sync::Arc;

use caretaker_pki::CertificateInfo;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};

/// The client identity the agent accepts unless told otherwise.
pub const DEFAULT_ALLOWED_CLIENT: &str = "caretaker-operator";

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what} is not valid PEM: {reason}")]
    Pem { what: &'static str, reason: String },
    #[error("{0}")]
    Config(String),
}

/// Makes every rustls user in this process use aws-lc-rs. Safe to call more than once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn certificates(pem: &str, what: &'static str) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            what,
            reason: e.to_string(),
        })?;
    if certificates.is_empty() {
        return Err(TlsError::Pem {
            what,
            reason: "no certificate found".into(),
        });
    }
    Ok(certificates)
}

fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    // The error text of the PEM parser never includes the key, but say nothing specific anyway.
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| TlsError::Pem {
        what: "the private key",
        reason: "no usable PKCS#8, SEC1 or PKCS#1 key found".into(),
    })
}

fn roots(ca_pem: &str) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for certificate in certificates(ca_pem, "the CA bundle")? {
        store
            .add(certificate)
            .map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// The agent's server configuration: its serving pair, the CA client certificates must chain
/// to, and the one client common name it accepts.
pub fn server_config(
    cert_pem: &str,
    key_pem: &str,
    client_ca_pem: &str,
    allowed_client: &str,
) -> Result<rustls::ServerConfig, TlsError> {
    install_crypto_provider();
    let inner = WebPkiClientVerifier::builder(roots(client_ca_pem)?)
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let verifier = Arc::new(AllowedClient {
        inner,
        common_name: allowed_client.to_string(),
    });
    let mut config = rustls::ServerConfig::builder()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            certificates(cert_pem, "the serving certificate")?,
            private_key(key_pem)?,
        )
        .map_err(|e| TlsError::Config(format!("serving certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The operator's client configuration: the cluster CA to trust and its client pair.
pub fn client_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<rustls::ClientConfig, TlsError> {
    install_crypto_provider();
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(
            certificates(cert_pem, "the client certificate")?,
            private_key(key_pem)?,
        )
        .map_err(|e| TlsError::Config(format!("client certificate and key: {e}")))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// WebPKI chain verification plus a check of the client's common name.
#[derive(Debug)]
struct AllowedClient {
    inner: Arc<dyn ClientCertVerifier>,
    common_name: String,
}

impl ClientCertVerifier for AllowedClient {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let info = CertificateInfo::from_der(end_entity)
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        if info.common_name.as_deref() == Some(self.common_name.as_str()) {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
