//! caretaker's own validating admission webhook, for CertificateAuthority and
//! IssuedCertificate: what `kubectl apply` of a bad spec meets before anything is stored.
//!
//! - [`review`]: the `admission.k8s.io/v1` AdmissionReview on the wire.
//! - [`admit`]: the decision, pure but for asking [`Issuers`] whether a CertificateAuthority
//!   exists; its header lists the rules.
//! - [`certificate`]: the serving certificate, swapped without a restart when its Secret
//!   changes.
//! - [`serve`]: the HTTPS server and its [`Limits`].
//! - [`bootstrap`]: the webhook's own CertificateAuthority, IssuedCertificate and
//!   configuration, made by caretaker at start (`--webhook-bootstrap`).
//!
//! [`Webhook`] puts them together for `caretaker operator`: the listener, the certificate's
//! source, and [`ApiIssuers`] (a GET per IssuedCertificate review, so a CertificateAuthority
//! created a moment before, in the same `kubectl apply`, is found).

pub mod admit;
pub mod bootstrap;
pub mod certificate;
pub mod review;
pub mod serve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration,
    WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::ObjectMeta;

pub use admit::{BUNDLE_DEPRECATED, BadReview, Deprecations, Issuers, Served};
pub use certificate::{CertificateError, CertificatePair, SecretRead, ServingCertificate};
pub use serve::Limits;

use crate::settings::BindAddress;
use caretaker_api::v1alpha1::{CertificateAuthority, CertificateAuthoritySpec};

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

/// Where the API server reaches the webhook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `https://HOST:PORT`, without a path.
    Url(String),
    /// A Service in front of the operator.
    Service {
        namespace: String,
        name: String,
        port: i32,
    },
}

/// A ValidatingWebhookConfiguration named `name` that sends this webhook every CREATE and
/// UPDATE of each kind it serves ([`Served`]), one webhook per kind (named after its resource,
/// as `certificateauthorities.caretaker.dev`), each at its path of `endpoint`, trusting the CA
/// certificates of `ca_bundle` (PEM). Calls that fail are refused (`failurePolicy: Fail`): an
/// object of these kinds is never stored unchecked, whatever its labels say.
pub fn configuration(
    name: &str,
    endpoint: &Endpoint,
    ca_bundle: &str,
) -> ValidatingWebhookConfiguration {
    let webhook = |served: Served| {
        let mut client_config = WebhookClientConfig {
            ca_bundle: Some(ByteString(ca_bundle.as_bytes().to_vec())),
            ..Default::default()
        };
        match endpoint {
            Endpoint::Url(base) => {
                client_config.url = Some(format!("{}{}", base.trim_end_matches('/'), served.path()))
            }
            Endpoint::Service {
                namespace,
                name,
                port,
            } => {
                client_config.service = Some(ServiceReference {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    path: Some(served.path().into()),
                    port: Some(*port),
                })
            }
        }
        ValidatingWebhook {
            name: served.webhook_name(),
            admission_review_versions: vec!["v1".into()],
            client_config,
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(10),
            // No objectSelector: a label anyone may set on their object must not skip these
            // checks. The bootstrap leaves out its own two objects by name.
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![served.group().into()]),
                api_versions: Some(vec![served.version().into()]),
                operations: Some(vec!["CREATE".into(), "UPDATE".into()]),
                resources: Some(vec![served.resource().into()]),
                scope: Some(
                    if served.namespaced() {
                        "Namespaced"
                    } else {
                        "Cluster"
                    }
                    .into(),
                ),
            }]),
            ..Default::default()
        }
    };
    ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        webhooks: Some(Served::ALL.into_iter().map(webhook).collect()),
    }
}

/// The CertificateAuthorities of the cluster, read when asked.
#[derive(Clone)]
pub struct ApiIssuers(pub Api<CertificateAuthority>);

impl Issuers for ApiIssuers {
    async fn spec(&self, name: &str) -> Result<Option<CertificateAuthoritySpec>, String> {
        self.0
            .get_opt(name)
            .await
            .map(|found| found.map(|ca| ca.spec))
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
    /// Files that cannot serve (their errors name them).
    #[error("serving certificate: {0}")]
    Certificate(CertificateError),
}

/// The webhook, listening, with its certificate source.
#[derive(Debug)]
pub struct Webhook {
    listener: tokio::net::TcpListener,
    source: CertificateSource,
    certificate: Arc<ServingCertificate>,
    limits: Limits,
    deprecations: Deprecations,
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
            let pair = CertificatePair::from_files(cert, key).map_err(WebhookError::Certificate)?;
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
            deprecations: Deprecations::default(),
        })
    }

    /// What allowed writes are warned about (`--bundle-mode migrate`: Bundles).
    pub fn warning_of(mut self, deprecations: Deprecations) -> Self {
        self.deprecations = deprecations;
        self
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
        let address = self.local_addr().map(|a| a.to_string()).unwrap_or_default();
        let paths: Vec<&str> = Served::ALL.iter().map(|s| s.path()).collect();
        tracing::info!(%address, certificate = %self.source, paths = %paths.join(" "),
            "webhook serving");
        let issuers = ApiIssuers(Api::all(client.clone()));
        let server = serve::serve(
            self.listener,
            self.certificate.clone(),
            issuers,
            self.limits,
            self.deprecations,
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn the_configuration_sends_each_kind_to_its_path() {
        let config = configuration(
            "caretaker",
            &Endpoint::Service {
                namespace: "caretaker-system".into(),
                name: "caretaker-webhook".into(),
                port: 443,
            },
            "PEM",
        );
        let value = serde_json::to_value(&config).unwrap();
        assert_eq!(value["metadata"]["name"], "caretaker");
        let webhook = &value["webhooks"][1];
        assert_eq!(webhook["name"], "issuedcertificates.caretaker.dev");
        assert_eq!(
            webhook["clientConfig"],
            json!({"caBundle": "UEVN", "service": {"namespace": "caretaker-system",
                   "name": "caretaker-webhook", "port": 443,
                   "path": "/validate-caretaker-dev-v1alpha1-issuedcertificate"}})
        );
        assert_eq!(
            webhook["rules"],
            json!([{"apiGroups": ["caretaker.dev"], "apiVersions": ["v1alpha1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["issuedcertificates"],
                    "scope": "Namespaced"}])
        );
        assert_eq!(webhook["failurePolicy"], "Fail");
        assert_eq!(webhook["sideEffects"], "None");
        assert_eq!(webhook["admissionReviewVersions"], json!(["v1"]));

        let config = configuration("c", &Endpoint::Url("https://127.0.0.1:9443/".into()), "");
        let webhook = &serde_json::to_value(&config).unwrap()["webhooks"][0];
        assert_eq!(webhook["name"], "certificateauthorities.caretaker.dev");
        assert_eq!(
            webhook["clientConfig"]["url"],
            "https://127.0.0.1:9443/validate-caretaker-dev-v1alpha1-certificateauthority"
        );
        assert_eq!(webhook["rules"][0]["scope"], "Cluster");
    }
}
