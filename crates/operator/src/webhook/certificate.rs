//! The webhook's serving certificate: one [`ServingCertificate`] that every new TLS handshake
//! asks for its certificate, swapped in place when its source changes, so a new certificate
//! is served without a restart (connections already open keep the one they started with).
//!
//! Its sources: a `kubernetes.io/tls` Secret, watched ([`watch_secret`]), and a certificate
//! and key file pair read at start ([`CertificatePair::from_files`]). A source that turns
//! unreadable, invalid or absent never takes away the last good certificate; before any good
//! one, every handshake is refused (and the log says why).
//!
//! Private keys never reach a log line, an error message or `Debug` output.

use std::path::Path;
use std::sync::{Arc, RwLock};

use caretaker_agent_api::tls;
use caretaker_pki::CertificateInfo;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use time::OffsetDateTime;

// The webhook's certificate is read from a Secret of the type and keys caretaker writes.
use caretaker_api::names::{SECRET_TYPE_TLS, TLS_CRT, TLS_KEY};

/// Why a certificate and key cannot serve. Messages name files, Secrets and certificates,
/// never the key's bytes.
#[derive(Debug, thiserror::Error)]
pub enum CertificateError {
    #[error("Secret {secret} is of type {found:?}; expected {SECRET_TYPE_TLS}")]
    SecretType { secret: String, found: String },
    #[error("Secret {secret} has no {key}")]
    MissingKey { secret: String, key: &'static str },
    #[error("cannot read {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("{what} is not UTF-8 text")]
    NotText { what: &'static str },
    #[error(transparent)]
    Pem(#[from] tls::TlsError),
    #[error("the private key cannot be used with the certificate: {0}")]
    Key(String),
    #[error("the certificate {subject} is not valid now (valid from {not_before} to {not_after})")]
    NotValidNow {
        subject: String,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    },
    #[error(
        "the certificate {subject} is not for servers: its extended key usages are {usages} \
         (no serverAuth)"
    )]
    NotForServers { subject: String, usages: String },
    #[error("the certificate cannot be read: {0}")]
    Certificate(String),
}

/// A serving certificate chain (leaf first) and its private key, checked to belong together
/// and to be valid.
#[derive(Clone)]
pub struct CertificatePair {
    key: Arc<CertifiedKey>,
    info: CertificateInfo,
}

impl std::fmt::Debug for CertificatePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificatePair")
            .field("subject", &self.info.subject)
            .field("serial", &self.info.serial)
            .field("not_after", &self.info.not_after)
            .finish_non_exhaustive()
    }
}

impl CertificatePair {
    /// The pair of PEM texts, valid at `now`.
    pub fn from_pem(
        certificate_pem: &[u8],
        key_pem: &[u8],
        now: OffsetDateTime,
    ) -> Result<Self, CertificateError> {
        let text = |bytes, what| {
            std::str::from_utf8(bytes).map_err(|_| CertificateError::NotText { what })
        };
        let chain =
            tls::certificates(text(certificate_pem, "the certificate")?, "the certificate")?;
        let key = tls::private_key(text(key_pem, "the private key")?)?;
        let info = CertificateInfo::from_der(&chain[0])
            .map_err(|e| CertificateError::Certificate(e.to_string()))?;
        if !info.is_valid_at(now) {
            return Err(CertificateError::NotValidNow {
                subject: info.subject,
                not_before: info.not_before,
                not_after: info.not_after,
            });
        }
        if !info.extended_key_usages.is_empty()
            && !info.extended_key_usages.iter().any(|u| u == "serverAuth")
        {
            return Err(CertificateError::NotForServers {
                subject: info.subject,
                usages: info.extended_key_usages.join(", "),
            });
        }
        // rustls' own errors here say what failed (unsupported key type, key mismatch), never
        // the key.
        let key =
            CertifiedKey::from_der(chain, key, &rustls::crypto::aws_lc_rs::default_provider())
                .map_err(|e| CertificateError::Key(e.to_string()))?;
        Ok(CertificatePair {
            key: Arc::new(key),
            info,
        })
    }

    /// `tls.crt` and `tls.key` of a `kubernetes.io/tls` Secret, valid at `now`.
    pub fn from_secret(secret: &Secret, now: OffsetDateTime) -> Result<Self, CertificateError> {
        let name = secret_name(secret);
        let found = secret.type_.as_deref().unwrap_or("Opaque");
        if found != SECRET_TYPE_TLS {
            return Err(CertificateError::SecretType {
                secret: name,
                found: found.into(),
            });
        }
        let data = |key: &'static str| {
            secret
                .data
                .as_ref()
                .and_then(|data| data.get(key))
                .filter(|value| !value.0.is_empty())
                .ok_or_else(|| CertificateError::MissingKey {
                    secret: name.clone(),
                    key,
                })
        };
        Self::from_pem(&data(TLS_CRT)?.0, &data(TLS_KEY)?.0, now)
    }

    /// The files `certificate` and `key` (PEM), valid now.
    pub fn from_files(certificate: &Path, key: &Path) -> Result<Self, CertificateError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| CertificateError::Read {
                path: path.display().to_string(),
                reason: e.to_string(),
            })
        };
        Self::from_pem(&read(certificate)?, &read(key)?, OffsetDateTime::now_utc())
    }

    /// What the certificate says.
    pub fn info(&self) -> &CertificateInfo {
        &self.info
    }
}

fn secret_name(secret: &Secret) -> String {
    format!(
        "{}/{}",
        secret.metadata.namespace.as_deref().unwrap_or(""),
        secret.metadata.name.as_deref().unwrap_or("")
    )
}

/// The certificate new handshakes get; none until one is [`ServingCertificate::set`].
#[derive(Default)]
pub struct ServingCertificate {
    current: RwLock<Option<CertificatePair>>,
    /// What [`watch_secret`] last read, usable or not.
    last_read: RwLock<SecretRead>,
}

/// What the watch of the certificate's Secret last read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum SecretRead {
    /// Nothing yet.
    #[default]
    Nothing,
    /// This version of the Secret (served, or refused as unusable).
    Version(String),
    /// The Secret does not exist.
    Gone,
}

impl std::fmt::Debug for ServingCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCertificate")
            .field("current", &*self.read())
            .finish()
    }
}

impl ServingCertificate {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Serves `pair` from the next handshake on. Whether it differs from the one served.
    pub fn set(&self, pair: CertificatePair) -> bool {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        let changed = current.as_ref().is_none_or(|old| {
            old.info.sha256_fingerprint != pair.info.sha256_fingerprint
                || old.key.cert != pair.key.cert
        });
        *current = Some(pair);
        changed
    }

    /// What the certificate being served says, if there is one.
    pub fn info(&self) -> Option<CertificateInfo> {
        self.read().as_ref().map(|pair| pair.info.clone())
    }

    pub fn is_set(&self) -> bool {
        self.read().is_some()
    }

    /// What the watch of the Secret last read: a version loaded (or refused, keeping the
    /// certificate served), or the Secret gone. Tells a caller that a change was seen.
    pub fn last_read(&self) -> SecretRead {
        self.last_read
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn note_read(&self, read: SecretRead) {
        *self.last_read.write().unwrap_or_else(|p| p.into_inner()) = read;
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Option<CertificatePair>> {
        self.current.read().unwrap_or_else(|p| p.into_inner())
    }
}

impl ResolvesServerCert for ServingCertificate {
    /// The current certificate, whatever name the client asked for; `None` (the handshake
    /// fails) before there is one.
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.read().as_ref().map(|pair| pair.key.clone())
    }
}

/// Keeps `target` serving the certificate in the Secret `name` of `secrets` (a namespaced
/// Api) until the watch ends, which it does not: every change of the Secret is read, and a
/// change that leaves it unusable (deleted, wrong type, a key that does not match, expired)
/// keeps the last good certificate, with a warning.
pub async fn watch_secret(secrets: Api<Secret>, name: String, target: Arc<ServingCertificate>) {
    let namespace = secrets.namespace().unwrap_or_default().to_string();
    let secret = format!("{namespace}/{name}");
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let events = watcher(secrets, config).default_backoff();
    futures::pin_mut!(events);
    // Whether the Secret was seen since the last (re)list began.
    let mut seen = false;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => seen = false,
            Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)) => {
                seen = true;
                load(&secret, &object, &target);
            }
            Ok(watcher::Event::Delete(_)) => gone(&secret, &target),
            Ok(watcher::Event::InitDone) if !seen => gone(&secret, &target),
            Ok(watcher::Event::InitDone) => {}
            Err(e) => {
                tracing::warn!(%secret, error = %e, "watching the webhook's certificate Secret")
            }
        }
    }
}

fn load(secret: &str, object: &Secret, target: &ServingCertificate) {
    match CertificatePair::from_secret(object, OffsetDateTime::now_utc()) {
        Ok(pair) => {
            let info = pair.info().clone();
            if target.set(pair) {
                tracing::info!(
                    %secret,
                    subject = %info.subject,
                    issuer = %info.issuer,
                    serial = %info.serial,
                    not_after = %info.not_after,
                    "the webhook serves a new certificate from its Secret"
                );
            }
        }
        Err(e) if target.is_set() => tracing::warn!(
            %secret,
            error = %e,
            "the webhook's certificate Secret is unusable; still serving the last good certificate"
        ),
        Err(e) => tracing::warn!(
            %secret,
            error = %e,
            "the webhook's certificate Secret is unusable; TLS handshakes are refused until it holds a valid certificate and key"
        ),
    }
    // Noted after the outcome is in place: whoever sees the version sees its effect.
    let version = object.metadata.resource_version.clone().unwrap_or_default();
    target.note_read(SecretRead::Version(version));
}

fn gone(secret: &str, target: &ServingCertificate) {
    if target.is_set() {
        tracing::warn!(%secret, "the webhook's certificate Secret is gone; still serving the last good certificate");
    } else {
        tracing::warn!(%secret, "the webhook's certificate Secret does not exist; TLS handshakes are refused until it does");
    }
    target.note_read(SecretRead::Gone);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};
    use k8s_openapi::ByteString;

    use super::*;

    fn ca() -> CertificateAuthority {
        CertificateAuthority::create(&CaSpec::new("webhook-ca")).unwrap()
    }

    /// A leaf of `ca` for `usage`: its certificate and key PEM.
    fn leaf(ca: &CertificateAuthority, usage: Usage) -> (String, String) {
        let leaf = ca
            .issue(&LeafSpec::new("webhook", usage).with_dns_names(["webhook.example"]))
            .unwrap();
        (
            leaf.certificate_pem.clone(),
            leaf.key.as_ref().unwrap().to_pem(),
        )
    }

    fn secret(type_: &str, data: &[(&str, &str)]) -> Secret {
        let mut secret = Secret {
            type_: Some(type_.into()),
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        };
        secret.metadata.namespace = Some("caretaker-system".into());
        secret.metadata.name = Some("webhook-tls".into());
        secret
    }

    #[test]
    fn a_tls_secret_gives_its_pair() {
        let ca = ca();
        let (cert, key) = leaf(&ca, Usage::Server);
        let pair = CertificatePair::from_secret(
            &secret(SECRET_TYPE_TLS, &[(TLS_CRT, &cert), (TLS_KEY, &key)]),
            OffsetDateTime::now_utc(),
        )
        .unwrap();
        assert_eq!(pair.info().common_name.as_deref(), Some("webhook"));
        assert_eq!(pair.info().issuer, ca.info().subject);
        assert!(!format!("{pair:?}").contains("PRIVATE"));
    }

    #[test]
    fn what_cannot_serve_is_named_without_the_key() {
        let ca = ca();
        let (cert, key) = leaf(&ca, Usage::Server);
        let (other_cert, other_key) = leaf(&ca, Usage::Server);
        let (client_cert, client_key) = leaf(&ca, Usage::Client);
        let now = OffsetDateTime::now_utc();
        let error = |secret: Secret| {
            let error = CertificatePair::from_secret(&secret, now)
                .unwrap_err()
                .to_string();
            for key in [&key, &other_key, &client_key] {
                let body: String = key.lines().filter(|l| !l.starts_with("-----")).collect();
                assert!(!error.contains(&body[..20]), "{error}");
            }
            error
        };
        assert_eq!(
            error(secret("Opaque", &[(TLS_CRT, &cert), (TLS_KEY, &key)])),
            "Secret caretaker-system/webhook-tls is of type \"Opaque\"; expected kubernetes.io/tls"
        );
        assert_eq!(
            error(secret(SECRET_TYPE_TLS, &[(TLS_CRT, &cert)])),
            "Secret caretaker-system/webhook-tls has no tls.key"
        );
        assert!(
            error(secret(
                SECRET_TYPE_TLS,
                &[(TLS_CRT, &cert), (TLS_KEY, &other_key)]
            ))
            .starts_with("the private key cannot be used with the certificate"),
        );
        assert!(
            error(secret(
                SECRET_TYPE_TLS,
                &[(TLS_CRT, &other_cert), (TLS_KEY, "garbage")]
            ))
            .contains("private key")
        );
        assert!(
            error(secret(
                SECRET_TYPE_TLS,
                &[(TLS_CRT, "garbage"), (TLS_KEY, &key)]
            ))
            .contains("certificate")
        );
        assert!(
            error(secret(
                SECRET_TYPE_TLS,
                &[(TLS_CRT, &client_cert), (TLS_KEY, &client_key)]
            ))
            .contains("is not for servers"),
        );
        let later = now + time::Duration::days(400 * 10);
        let expired =
            CertificatePair::from_pem(cert.as_bytes(), key.as_bytes(), later).unwrap_err();
        assert!(
            expired.to_string().contains("is not valid now"),
            "{expired}"
        );
    }

    #[test]
    fn the_served_certificate_is_swapped_in_place() {
        let serving = ServingCertificate::new();
        assert!(!serving.is_set());
        let now = OffsetDateTime::now_utc();
        let (cert, key) = leaf(&ca(), Usage::Server);
        let first = CertificatePair::from_pem(cert.as_bytes(), key.as_bytes(), now).unwrap();
        assert!(serving.set(first.clone()));
        assert!(
            !serving.set(first.clone()),
            "the same certificate again is no change"
        );
        let (cert, key) = leaf(&ca(), Usage::Both);
        let second = CertificatePair::from_pem(cert.as_bytes(), key.as_bytes(), now).unwrap();
        assert!(serving.set(second.clone()));
        assert_eq!(serving.info().unwrap().serial, second.info().serial);
        assert!(!format!("{serving:?}").contains("PRIVATE"));
    }
}
