//! Serving certificates: a self-signed CA and a server certificate for the loopback names,
//! and the client CA whose certificates identify users (CN the user, O its groups), kept in
//! the data directory so that a restarted server keeps the same CAs (and its kubeconfigs stay
//! valid).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::sync::Arc;

use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, PkiError, Ttl, Usage};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// PEM-encoded serving material.
#[derive(Clone)]
pub struct TlsMaterial {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// The CA of users' client certificates, and its key.
    pub client_ca_pem: String,
    pub client_ca_key_pem: String,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("ca_pem", &self.ca_pem)
            .field("cert_pem", &self.cert_pem)
            .field("client_ca_pem", &self.client_ca_pem)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating certificates: {0}")]
    Generate(#[from] PkiError),
    #[error("reading or writing certificates in {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("loading certificates: {0}")]
    Load(String),
}

/// Makes everything rustls in this process use aws-lc-rs. Safe to call more than once.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

impl TlsMaterial {
    /// A new CA and a server certificate for localhost, 127.0.0.1 and ::1.
    pub fn generate() -> Result<Self, TlsError> {
        let ca = CertificateAuthority::create(&CaSpec::new("caretaker-apiserver-ca"))?;
        // As long-lived as its CA: the data directory keeps both across restarts, and clients
        // trust the CA through their kubeconfig.
        let lifetime = Ttl::calendar(10, 0, 0).expect("10y is a valid TTL");
        let server = ca.issue(
            &LeafSpec::new("caretaker-apiserver", Usage::Server)
                .with_dns_names(["localhost"])
                .with_ip_addresses([Ipv4Addr::LOCALHOST.into(), Ipv6Addr::LOCALHOST.into()])
                .with_validity(lifetime),
        )?;
        let key = server.key.as_ref().expect("issue() returns the new key");
        let client_ca = Self::client_ca()?;
        Ok(TlsMaterial {
            ca_pem: ca.certificate_pem(),
            cert_pem: server.certificate_pem.clone(),
            key_pem: key.to_pem(),
            client_ca_pem: client_ca.certificate_pem(),
            client_ca_key_pem: client_ca.private_key_pem(),
        })
    }

    fn client_ca() -> Result<CertificateAuthority, TlsError> {
        Ok(CertificateAuthority::create(&CaSpec::new(
            "caretaker-apiserver-client-ca",
        ))?)
    }

    /// A client certificate and its key for `user` in `groups`, valid for a year.
    pub fn client_certificate(
        &self,
        user: &str,
        groups: &[String],
    ) -> Result<(String, String), TlsError> {
        let ca = CertificateAuthority::from_pem(&self.client_ca_pem, &self.client_ca_key_pem)?;
        let issued = ca.issue(
            &LeafSpec::new(user, Usage::Client)
                .with_organizations(groups.iter().cloned())
                .with_validity(Ttl::calendar(1, 0, 0).expect("1y is a valid TTL")),
        )?;
        let key = issued.key.as_ref().expect("issue() returns the new key");
        Ok((issued.certificate_pem.clone(), key.to_pem()))
    }

    /// Loads the material from `dir`, or generates and stores it there (owner-only, see
    /// [`crate::store::private_files`]).
    pub fn load_or_generate(dir: &Path) -> Result<Self, TlsError> {
        let io = |path: &Path| {
            let path = path.display().to_string();
            move |source| TlsError::Io { path, source }
        };
        let files = [
            dir.join("ca.crt"),
            dir.join("server.crt"),
            dir.join("server.key"),
        ];
        let client_files = [dir.join("client-ca.crt"), dir.join("client-ca.key")];
        crate::store::private_files::create_dir(dir).map_err(io(dir))?;
        let read = |p: &Path| {
            crate::store::private_files::restrict(p).map_err(io(p))?;
            std::fs::read_to_string(p).map_err(io(p))
        };
        let m = if files.iter().all(|f| f.exists()) {
            let (client_ca_pem, client_ca_key_pem) = if client_files.iter().all(|f| f.exists()) {
                (read(&client_files[0])?, read(&client_files[1])?)
            } else {
                // A data directory from before client certificates: the serving CA stays.
                let ca = Self::client_ca()?;
                (ca.certificate_pem(), ca.private_key_pem())
            };
            TlsMaterial {
                ca_pem: read(&files[0])?,
                cert_pem: read(&files[1])?,
                key_pem: read(&files[2])?,
                client_ca_pem,
                client_ca_key_pem,
            }
        } else {
            Self::generate()?
        };
        let all_files = files.iter().chain(&client_files);
        let contents = [
            &m.ca_pem,
            &m.cert_pem,
            &m.key_pem,
            &m.client_ca_pem,
            &m.client_ca_key_pem,
        ];
        for (path, content) in all_files.zip(contents) {
            if !path.exists() {
                crate::store::private_files::write(path, content).map_err(io(path))?;
            }
        }
        Ok(m)
    }

    pub fn ca_der(&self) -> Result<Vec<u8>, TlsError> {
        CertificateDer::from_pem_slice(self.ca_pem.as_bytes())
            .map(|c| c.to_vec())
            .map_err(|e| TlsError::Load(format!("CA certificate: {e}")))
    }

    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        install_crypto_provider();
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(|e| TlsError::Load(format!("server certificate: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| TlsError::Load(format!("server key: {e}")))?;
        // Client certificates are asked for, not required: a request without one is
        // anonymous, or authenticated by its bearer token. One that does not chain to the
        // client CA fails the handshake, as in kube-apiserver.
        let mut roots = rustls::RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(self.client_ca_pem.as_bytes()) {
            let ca = ca.map_err(|e| TlsError::Load(format!("client CA: {e}")))?;
            roots
                .add(ca)
                .map_err(|e| TlsError::Load(format!("client CA: {e}")))?;
        }
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .allow_unauthenticated()
            .build()
            .map_err(|e| TlsError::Load(format!("client CA: {e}")))?;
        let mut config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Load(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
