//! caretaker's own validating admission webhook, for CertificateAuthority and
//! IssuedCertificate: what `kubectl apply` of a bad spec meets before anything is stored.
//!
//! - [`review`]: the `admission.k8s.io/v1` AdmissionReview on the wire.
//! - [`admit`]: the decision, pure but for asking [`Issuers`] whether a CertificateAuthority
//!   exists; its header lists the rules.
//! - [`certificate`]: the serving certificate, swapped without a restart when its Secret
//!   changes.
//! - [`serve`]: the HTTPS server and its [`Limits`].
//!
//! [`Webhook`] puts them together for `caretaker operator`: the listener, the certificate's
//! source, and [`ApiIssuers`] (a GET per IssuedCertificate review, so a CertificateAuthority
//! created a moment before, in the same `kubectl apply`, is found).

pub mod admit;
pub mod certificate;
pub mod review;
pub mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;

pub use admit::{BadReview, Issuers, Served};
pub use certificate::{CertificateError, CertificatePair, ServingCertificate};
pub use serve::Limits;

use crate::settings::BindAddress;
use crate::v1alpha1::CertificateAuthority;

/// Where the serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertificateSource {
    /// A `kubernetes.io/tls` Secret, watched: every change is served from the next handshake.
    Secret { namespace: String, name: String },
    /// A certificate and a key file (PEM), read once at start.
    Files { certificate: PathBuf, key: PathBuf },
}

impl std::fmt::Display for CertificateSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CertificateSource::Secret { namespace, name } => write!(f, "Secret {namespace}/{name}"),
            CertificateSource::Files { certificate, key } => {
                write!(f, "files {} and {}", certificate.display(), key.display())
            }
        }
    }
}

/// The CertificateAuthorities of the cluster, read when asked.
#[derive(Clone)]
pub struct ApiIssuers(pub Api<CertificateAuthority>);

impl Issuers for ApiIssuers {
    async fn exists(&self, name: &str) -> Result<bool, String> {
        self.0
            .get_opt(name)
            .await
            .map(|found| found.is_some())
            .map_err(|e| e.to_string())
    }
}

/// Why the webhook cannot start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: BindAddress,
        source: std::io::Error,
    },
    #[error("the serving certificate from {source_}: {error}")]
    Certificate {
        source_: CertificateSource,
        error: CertificateError,
    },
}

/// The webhook, listening, with its certificate source.
#[derive(Debug)]
pub struct Webhook {
    listener: tokio::net::TcpListener,
    source: CertificateSource,
    certificate: Arc<ServingCertificate>,
    limits: Limits,
}

impl Webhook {
    /// Listens on `address` and, for files, reads them: a port in use or files that cannot
    /// serve stop the operator at start, not at the first review.
    pub async fn bind(
        address: &BindAddress,
        source: CertificateSource,
        limits: Limits,
    ) -> Result<Webhook, WebhookError> {
        caretaker_agent_api::tls::install_crypto_provider();
        let certificate = ServingCertificate::new();
        if let CertificateSource::Files {
            certificate: cert,
            key,
        } = &source
        {
            let pair = CertificatePair::from_files(cert, key).map_err(|error| {
                WebhookError::Certificate {
                    source_: source.clone(),
                    error,
                }
            })?;
            certificate.set(pair);
        }
        let listener = address
            .listen()
            .await
            .map_err(|source| WebhookError::Listen {
                address: address.clone(),
                source,
            })?;
        Ok(Webhook {
            listener,
            source,
            certificate,
            limits,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The certificate being served (for readiness and tests).
    pub fn certificate(&self) -> Arc<ServingCertificate> {
        self.certificate.clone()
    }

    /// Serves until the task is dropped, reading CertificateAuthorities and the certificate's
    /// Secret with `client`.
    pub async fn run(self, client: kube::Client) {
        let address = self.local_addr().ok();
        let paths: Vec<&str> = Served::ALL.iter().map(|s| s.path()).collect();
        tracing::info!(?address, certificate = %self.source, paths = %paths.join(" "),
            "webhook serving");
        let issuers = ApiIssuers(Api::all(client.clone()));
        let server = serve::serve(
            self.listener,
            self.certificate.clone(),
            issuers,
            self.limits,
        );
        match self.source {
            CertificateSource::Secret { namespace, name } => {
                let secrets: Api<Secret> = Api::namespaced(client, &namespace);
                let watch = certificate::watch_secret(secrets, name, self.certificate);
                futures::join!(server, watch);
            }
            CertificateSource::Files { .. } => server.await,
        }
    }
}
