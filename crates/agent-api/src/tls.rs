//! Mutual TLS between operator and agent, the client's half. Both sides chain to the cluster
//! CA; the agent accepts exactly one client identity (by certificate common name, see
//! [`DEFAULT_ALLOWED_CLIENT`]; its server configuration is `caretaker_agent::tls`), and the
//! operator accepts only the agent of the node it means ([`ClientIdentity::config_for_node`]).
//! The PEM readers here serve both halves.

use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, RootCertStore};

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

/// Every certificate of `pem` (at least one); `what` names the text in errors.
pub fn certificates(
    pem: &str,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
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

/// The private key of `pem`; errors never repeat any of the text.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, TlsError> {
    // The error text of the PEM parser never includes the key, but say nothing specific anyway.
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).map_err(|_| TlsError::Pem {
        what: "the private key",
        reason: "no usable PKCS#8, SEC1 or PKCS#1 key found".into(),
    })
}

/// A root store of every certificate in the bundle `ca_pem`.
pub fn roots(ca_pem: &str) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for certificate in certificates(ca_pem, "the CA bundle")? {
        store
            .add(certificate)
            .map_err(|e| TlsError::Config(format!("CA certificate: {e}")))?;
    }
    Ok(Arc::new(store))
}

/// The operator's client configuration: the cluster CA to trust and its client pair. The
/// agent is verified by the URL's host; [`ClientIdentity::config_for_node`] verifies it by node.
pub fn client_config(
    ca_pem: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<rustls::ClientConfig, TlsError> {
    ClientIdentity::from_pem(ca_pem, cert_pem, key_pem)?.config()
}

/// The operator's side of mutual TLS: the CA agents must chain to and its client pair, from
/// which a client configuration is made for each agent it talks to.
#[derive(Clone)]
pub struct ClientIdentity {
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity").finish_non_exhaustive()
    }
}

impl ClientIdentity {
    pub fn from_pem(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<Self, TlsError> {
        install_crypto_provider();
        Ok(Self {
            roots: roots(ca_pem)?,
            chain: certificates(cert_pem, "the client certificate")?,
            key: Arc::new(private_key(key_pem)?),
        })
    }

    /// A configuration that verifies the agent by the host of the URL it is reached at.
    pub fn config(&self) -> Result<rustls::ClientConfig, TlsError> {
        self.finish(rustls::ClientConfig::builder().with_root_certificates(self.roots.clone()))
    }

    /// A configuration that accepts only an agent whose serving certificate names one of
    /// `names` (a node's name and addresses), wherever the URL points: a Machine's
    /// `caretaker.dev/agent-endpoint` annotation cannot send its signing to another node.
    pub fn config_for_node(&self, names: &[String]) -> Result<rustls::ClientConfig, TlsError> {
        let inner = WebPkiServerVerifier::builder(self.roots.clone())
            .build()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let names = names
            .iter()
            .filter_map(|n| ServerName::try_from(n.clone()).ok())
            .collect();
        let verifier = Arc::new(NodeVerifier { inner, names });
        self.finish(
            rustls::ClientConfig::builder()
                .dangerous()
                .with_custom_certificate_verifier(verifier),
        )
    }

    fn finish(
        &self,
        builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>,
    ) -> Result<rustls::ClientConfig, TlsError> {
        let mut config = builder
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(format!("client certificate and key: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The agent's serving certificate names none of a node's names.
#[derive(Debug, Clone, thiserror::Error)]
#[error("its serving certificate names none of {}", .expected.join(", "))]
pub struct NotTheNode {
    pub expected: Vec<String>,
}

/// WebPKI chain verification, then a check that the certificate is valid for one of a node's
/// names, whatever name the connection was made to.
#[derive(Debug)]
struct NodeVerifier {
    inner: Arc<WebPkiServerVerifier>,
    names: Vec<ServerName<'static>>,
}

/// The handshake-signature methods of a rustls certificate verifier (server or client side),
/// delegated to its `inner` WebPKI verifier: caretaker's verifiers add checks on the
/// certificate, never on signatures. The crate using it depends on `rustls`.
#[macro_export]
macro_rules! delegate_signature_checks {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &::rustls::pki_types::CertificateDer<'_>,
            dss: &::rustls::DigitallySignedStruct,
        ) -> Result<::rustls::client::danger::HandshakeSignatureValid, ::rustls::Error> {
            self.inner.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &::rustls::pki_types::CertificateDer<'_>,
            dss: &::rustls::DigitallySignedStruct,
        ) -> Result<::rustls::client::danger::HandshakeSignatureValid, ::rustls::Error> {
            self.inner.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<::rustls::SignatureScheme> {
            self.inner.supported_verify_schemes()
        }
    };
}

impl ServerCertVerifier for NodeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        for name in &self.names {
            match self
                .inner
                .verify_server_cert(end_entity, intermediates, name, ocsp_response, now)
            {
                Ok(verified) => return Ok(verified),
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => continue,
                Err(other) => return Err(other),
            }
        }
        let expected = self.names.iter().map(|n| n.to_str().into_owned()).collect();
        Err(rustls::Error::InvalidCertificate(CertificateError::Other(
            rustls::OtherError(Arc::new(NotTheNode { expected })),
        )))
    }

    crate::delegate_signature_checks!();
}

/// The node mismatch behind a failed handshake, if that is what failed it.
pub fn not_the_node(error: &std::io::Error) -> Option<&NotTheNode> {
    match error.get_ref()?.downcast_ref::<rustls::Error>()? {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            other.0.downcast_ref::<NotTheNode>()
        }
        _ => None,
    }
}
