//! Mutual TLS between operator and agent, the agent's half: the server configuration, which
//! accepts exactly one client identity (by certificate common name), checked during the
//! handshake, so a wrong or missing client certificate gets nothing but a TLS alert. The
//! client's half is `caretaker_agent_api::tls`.

use std::sync::Arc;

use caretaker_agent_api::tls::{
    TlsError, certificates, install_crypto_provider, private_key, roots,
};
use caretaker_pki::CertificateInfo;
use rustls::DistinguishedName;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};

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

    caretaker_agent_api::delegate_signature_checks!();
}
