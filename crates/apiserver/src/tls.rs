//! Serving certificates: a self-signed CA and a server certificate for the loopback names,
//! kept in the data directory so that a restarted server keeps the same CA (and its
//! kubeconfig stays valid).

use std::path::Path;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// PEM-encoded serving material.
#[derive(Debug, Clone)]
pub struct TlsMaterial {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
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
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "caretaker-apiserver-ca");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, &ca_key);

        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "caretaker-apiserver");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let cert = params.signed_by(&key, &issuer)?;
        Ok(TlsMaterial {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Loads the material from `dir`, or generates and stores it there (keys mode 0600).
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
        if files.iter().all(|f| f.exists()) {
            let read = |p: &Path| std::fs::read_to_string(p).map_err(io(p));
            return Ok(TlsMaterial {
                ca_pem: read(&files[0])?,
                cert_pem: read(&files[1])?,
                key_pem: read(&files[2])?,
            });
        }
        let m = Self::generate()?;
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        for (path, content) in files.iter().zip([&m.ca_pem, &m.cert_pem, &m.key_pem]) {
            write_private(path, content).map_err(io(path))?;
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
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .map_err(|e| TlsError::Load(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Writes a file readable by its owner only (it may hold a private key).
pub fn write_private(path: &Path, content: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(path)?;
    f.write_all(content.as_bytes())?;
    f.sync_all()
}
