//! Building a Bundle's certificate pool from its sources, as trust-manager builds it.
//!
//! Sources are read only from the trust namespace. The errors keep trust-manager's two kinds and
//! its messages: a missing source or key ([`SourceError::NotFound`], reason `SourceNotFound`, no
//! retry until something changes) and anything malformed ([`SourceError::Invalid`], reason
//! `SourceBuildError`, retried with backoff). Either way no target is touched.

use std::collections::BTreeMap;

use caretaker_pki::{CertificatePool, PoolFilters};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use time::OffsetDateTime;

use super::api::{BundleSource, SourceObjectKeySelector};
use super::package::DefaultPackage;
use super::selector::Selector;

/// Why a Bundle's sources could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// A source, a key or every certificate is missing.
    #[error("{0}")]
    NotFound(String),
    /// A source is malformed (bad PEM, a bad selector, includeAllKeys on a TLS Secret).
    #[error("{0}")]
    Invalid(String),
}

impl SourceError {
    /// The `Synced` reason trust-manager gives.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "SourceNotFound",
            Self::Invalid(_) => "SourceBuildError",
        }
    }

    /// The `Synced` message trust-manager gives.
    pub fn message(&self) -> String {
        match self {
            Self::NotFound(e) => format!("Bundle source was not found: {e}"),
            Self::Invalid(e) => format!("Failed to build bundle sources: {e}"),
        }
    }
}

/// What the sources read from: the trust namespace's ConfigMaps and Secrets, the default CA
/// package if one was loaded, and the operator's filters.
#[derive(Debug, Clone, Copy)]
pub struct SourceContext<'a> {
    pub namespace: &'a str,
    pub config_maps: &'a BTreeMap<String, ConfigMap>,
    pub secrets: &'a BTreeMap<String, Secret>,
    pub default_package: Option<&'a DefaultPackage>,
    pub filters: PoolFilters,
    pub now: OffsetDateTime,
}

/// A built bundle: the pool, and the default package's id when `useDefaultCAs: true` used it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltBundle {
    pub pool: CertificatePool,
    pub default_ca_version: Option<String>,
}

/// trust-manager's `BuildBundle`.
pub fn build(
    sources: &[BundleSource],
    from: &SourceContext<'_>,
) -> Result<BuiltBundle, SourceError> {
    let mut pool = CertificatePool::new(from.filters, from.now);
    let mut default_ca_version = None;
    for source in sources {
        if let Some(reference) = &source.config_map {
            add_config_maps(&mut pool, reference, from)?;
        } else if let Some(reference) = &source.secret {
            add_secrets(&mut pool, reference, from)?;
        } else if let Some(pem) = source.in_line.as_deref().filter(|p| !p.is_empty()) {
            pool.add_pem(pem.as_bytes()).map_err(|e| {
                SourceError::Invalid(format!("inline source contains invalid PEM data: {e}"))
            })?;
        } else if source.use_default_cas == Some(true) {
            let Some(package) = from.default_package else {
                return Err(SourceError::NotFound(
                    "no default package was specified when trust-manager was started; default CAs not available".into(),
                ));
            };
            pool.add_pem(package.bundle.as_bytes()).map_err(|e| {
                SourceError::Invalid(format!("default package contains invalid PEM data: {e}"))
            })?;
            default_ca_version = Some(package.string_id());
        }
    }
    if pool.is_empty() {
        return Err(SourceError::NotFound(
            "couldn't find any valid certificates in bundle".into(),
        ));
    }
    Ok(BuiltBundle {
        pool,
        default_ca_version,
    })
}

/// The objects a reference names: the one by name (missing is `NotFound`), or every one its
/// selector matches (none is not an error).
fn selected<'a, T>(
    kind: &str,
    plural: &str,
    reference: &SourceObjectKeySelector,
    objects: &'a BTreeMap<String, T>,
    labels: impl Fn(&T) -> Option<&BTreeMap<String, String>>,
    namespace: &str,
) -> Result<Vec<(&'a String, &'a T)>, SourceError> {
    if let Some(name) = reference.name.as_deref().filter(|n| !n.is_empty()) {
        return match objects.get_key_value(name) {
            Some(found) => Ok(vec![found]),
            None => Err(SourceError::NotFound(format!(
                "failed to get {kind} {namespace}/{name}: {plural} {name:?} not found"
            ))),
        };
    }
    let selector = Selector::parse(reference.selector.as_ref()).map_err(|e| {
        SourceError::Invalid(format!(
            "failed to parse label selector as Selector for {kind} in namespace {namespace}: {e}"
        ))
    })?;
    let empty = BTreeMap::new();
    Ok(objects
        .iter()
        .filter(|(_, object)| selector.matches(labels(object).unwrap_or(&empty)))
        .collect())
}

fn add_config_maps(
    pool: &mut CertificatePool,
    reference: &SourceObjectKeySelector,
    from: &SourceContext<'_>,
) -> Result<(), SourceError> {
    let namespace = from.namespace;
    let found = selected(
        "ConfigMap",
        "configmaps",
        reference,
        from.config_maps,
        |c| c.metadata.labels.as_ref(),
        namespace,
    )?;
    for (name, config_map) in found {
        let invalid = |key: &str, e| {
            SourceError::Invalid(format!(
                "invalid PEM data in ConfigMap {namespace}/{name} at key {key:?}: {e}"
            ))
        };
        let data = config_map.data.as_ref();
        let binary = config_map.binary_data.as_ref();
        if let Some(key) = reference.key.as_deref().filter(|k| !k.is_empty()) {
            let text = data.and_then(|d| d.get(key)).map(|v| v.as_bytes());
            let bytes = text.or_else(|| binary.and_then(|b| b.get(key)).map(|v| v.0.as_slice()));
            let Some(bytes) = bytes else {
                return Err(SourceError::NotFound(format!(
                    "no data found in ConfigMap {namespace}/{name} at key {key:?}"
                )));
            };
            pool.add_pem(bytes).map_err(|e| invalid(key, e))?;
        } else if reference.include_all_keys == Some(true) {
            for (key, value) in data.into_iter().flatten() {
                pool.add_pem(value.as_bytes())
                    .map_err(|e| invalid(key, e))?;
            }
            for (key, value) in binary.into_iter().flatten() {
                pool.add_pem(&value.0).map_err(|e| invalid(key, e))?;
            }
        }
    }
    Ok(())
}

fn add_secrets(
    pool: &mut CertificatePool,
    reference: &SourceObjectKeySelector,
    from: &SourceContext<'_>,
) -> Result<(), SourceError> {
    let namespace = from.namespace;
    let found = selected(
        "Secret",
        "secrets",
        reference,
        from.secrets,
        |s| s.metadata.labels.as_ref(),
        namespace,
    )?;
    for (name, secret) in found {
        let invalid = |key: &str, e| {
            SourceError::Invalid(format!(
                "invalid PEM data in Secret {namespace}/{name} at key {key:?}: {e}"
            ))
        };
        let data = secret.data.as_ref();
        if let Some(key) = reference.key.as_deref().filter(|k| !k.is_empty()) {
            let Some(value) = data.and_then(|d| d.get(key)) else {
                return Err(SourceError::NotFound(format!(
                    "no data found in Secret {namespace}/{name} at key {key:?}"
                )));
            };
            pool.add_pem(&value.0).map_err(|e| invalid(key, e))?;
        } else if reference.include_all_keys == Some(true) {
            if secret.type_.as_deref() == Some("kubernetes.io/tls") {
                return Err(SourceError::Invalid(format!(
                    "includeAllKeys is not supported for TLS Secrets such as {namespace}/{name}"
                )));
            }
            for (key, value) in data.into_iter().flatten() {
                pool.add_pem(&value.0).map_err(|e| invalid(key, e))?;
            }
        }
    }
    Ok(())
}
