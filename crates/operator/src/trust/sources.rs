//! Building a Bundle's (or ClusterBundle's) certificate pool from its sources, as trust-manager
//! builds it.
//!
//! Sources are read only from the trust namespace. The errors keep trust-manager's two kinds and
//! its messages: a missing source or key ([`SourceError::NotFound`], reason `SourceNotFound`, no
//! retry until something changes) and anything malformed ([`SourceError::Invalid`], reason
//! `SourceBuildError`, retried with backoff). Either way no target is touched.

use std::collections::BTreeMap;

use caretaker_pki::{CertificatePool, PoolFilters};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use time::OffsetDateTime;

use super::api::{BundleSource, SourceObjectKeySelector};
use super::cluster_bundle::{ClusterBundleSpec, SourceRef};
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

/// trust-manager's `BuildBundle`: a Bundle's sources in order.
pub fn build(
    sources: &[BundleSource],
    from: &SourceContext<'_>,
) -> Result<BuiltBundle, SourceError> {
    let mut pool = CertificatePool::new(from.filters, from.now);
    let mut default_ca_version = None;
    for source in sources {
        if let Some(reference) = &source.config_map {
            let reference = Reference::from_bundle(reference);
            add_objects(&mut pool, &reference, from.config_maps, from.namespace)?;
        } else if let Some(reference) = &source.secret {
            let reference = Reference::from_bundle(reference);
            add_objects(&mut pool, &reference, from.secrets, from.namespace)?;
        } else if let Some(pem) = source.in_line.as_deref().filter(|p| !p.is_empty()) {
            add_in_line(&mut pool, pem)?;
        } else if source.use_default_cas == Some(true) {
            default_ca_version = Some(add_default_cas(&mut pool, from)?);
        }
    }
    finish(pool, default_ca_version)
}

/// A ClusterBundle's sources, read as a Bundle's are: `sourceRefs` in order, then `inLineCAs`,
/// then the default CAs when `defaultCAs.provider` is `System`.
pub fn build_cluster(
    spec: &ClusterBundleSpec,
    from: &SourceContext<'_>,
) -> Result<BuiltBundle, SourceError> {
    let mut pool = CertificatePool::new(from.filters, from.now);
    for source in spec.source_refs.iter().flatten() {
        let reference = Reference::from_source_ref(source);
        match source.kind.as_str() {
            "ConfigMap" => add_objects(&mut pool, &reference, from.config_maps, from.namespace)?,
            "Secret" => add_objects(&mut pool, &reference, from.secrets, from.namespace)?,
            other => {
                return Err(SourceError::Invalid(format!(
                    "unsupported source kind {other:?}: expected ConfigMap or Secret"
                )));
            }
        }
    }
    if let Some(pem) = spec.in_line_cas.as_deref().filter(|p| !p.is_empty()) {
        add_in_line(&mut pool, pem)?;
    }
    let provider = spec.default_cas.as_ref().map(|d| d.provider.as_str());
    let default_ca_version = match provider {
        Some("System") => Some(add_default_cas(&mut pool, from)?),
        _ => None,
    };
    finish(pool, default_ca_version)
}

fn add_in_line(pool: &mut CertificatePool, pem: &str) -> Result<(), SourceError> {
    pool.add_pem(pem.as_bytes())
        .map_err(|e| SourceError::Invalid(format!("inline source contains invalid PEM data: {e}")))
}

/// Adds the default CA package; returns its version.
fn add_default_cas(
    pool: &mut CertificatePool,
    from: &SourceContext<'_>,
) -> Result<String, SourceError> {
    let Some(package) = from.default_package else {
        return Err(SourceError::NotFound(
            "no default package was specified when trust-manager was started; default CAs not available".into(),
        ));
    };
    pool.add_pem(package.bundle.as_bytes()).map_err(|e| {
        SourceError::Invalid(format!("default package contains invalid PEM data: {e}"))
    })?;
    Ok(package.string_id())
}

fn finish(
    pool: CertificatePool,
    default_ca_version: Option<String>,
) -> Result<BuiltBundle, SourceError> {
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

/// Which keys of a source object are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys<'a> {
    /// Nothing (a Bundle reference with neither `key` nor `includeAllKeys`).
    None,
    One(&'a str),
    All,
    /// A ClusterBundle key with `*` wildcards.
    Matching(&'a str),
}

/// A source object reference of either API: by name, or by selector; and which keys.
struct Reference<'a> {
    name: Option<&'a str>,
    selector: Option<&'a LabelSelector>,
    keys: Keys<'a>,
}

impl<'a> Reference<'a> {
    fn from_bundle(reference: &'a SourceObjectKeySelector) -> Self {
        let keys = match reference.key.as_deref().filter(|k| !k.is_empty()) {
            Some(key) => Keys::One(key),
            None if reference.include_all_keys == Some(true) => Keys::All,
            None => Keys::None,
        };
        Self {
            name: reference.name.as_deref().filter(|n| !n.is_empty()),
            selector: reference.selector.as_ref(),
            keys,
        }
    }

    /// `key: "*"` is every key, as upstream's conversion of `includeAllKeys` means it.
    fn from_source_ref(reference: &'a SourceRef) -> Self {
        let keys = match reference.key.as_str() {
            "*" => Keys::All,
            key if key.contains('*') => Keys::Matching(key),
            key => Keys::One(key),
        };
        Self {
            name: reference.name.as_deref().filter(|n| !n.is_empty()),
            selector: reference.selector.as_ref(),
            keys,
        }
    }
}

/// Whether `key` matches `pattern`, where `*` stands for any run of characters.
fn glob_matches(pattern: &str, key: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = key.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// A ConfigMap or Secret as a source reads it.
trait SourceObject {
    const KIND: &'static str;
    const PLURAL: &'static str;
    fn labels(&self) -> Option<&BTreeMap<String, String>>;
    /// The value at `key` (a ConfigMap's `data`, else its `binaryData`).
    fn value(&self, key: &str) -> Option<&[u8]>;
    /// Every value, `data` first.
    fn values(&self) -> Vec<(&String, &[u8])>;
    fn is_tls(&self) -> bool {
        false
    }
}

impl SourceObject for ConfigMap {
    const KIND: &'static str = "ConfigMap";
    const PLURAL: &'static str = "configmaps";

    fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.labels.as_ref()
    }

    fn value(&self, key: &str) -> Option<&[u8]> {
        let text = self
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .map(|v| v.as_bytes());
        text.or_else(|| {
            let binary = self.binary_data.as_ref()?;
            binary.get(key).map(|v| v.0.as_slice())
        })
    }

    fn values(&self) -> Vec<(&String, &[u8])> {
        let text = self.data.iter().flatten().map(|(k, v)| (k, v.as_bytes()));
        let binary = self.binary_data.iter().flatten();
        text.chain(binary.map(|(k, v)| (k, v.0.as_slice())))
            .collect()
    }
}

impl SourceObject for Secret {
    const KIND: &'static str = "Secret";
    const PLURAL: &'static str = "secrets";

    fn labels(&self) -> Option<&BTreeMap<String, String>> {
        self.metadata.labels.as_ref()
    }

    fn value(&self, key: &str) -> Option<&[u8]> {
        self.data.as_ref()?.get(key).map(|v| v.0.as_slice())
    }

    fn values(&self) -> Vec<(&String, &[u8])> {
        let data = self.data.iter().flatten();
        data.map(|(k, v)| (k, v.0.as_slice())).collect()
    }

    fn is_tls(&self) -> bool {
        self.type_.as_deref() == Some("kubernetes.io/tls")
    }
}

/// The objects a reference names: the one by name (missing is `NotFound`), or every one its
/// selector matches (none is not an error).
fn selected<'a, T: SourceObject>(
    reference: &Reference<'_>,
    objects: &'a BTreeMap<String, T>,
    namespace: &str,
) -> Result<Vec<(&'a String, &'a T)>, SourceError> {
    let (kind, plural) = (T::KIND, T::PLURAL);
    if let Some(name) = reference.name {
        return match objects.get_key_value(name) {
            Some(found) => Ok(vec![found]),
            None => Err(SourceError::NotFound(format!(
                "failed to get {kind} {namespace}/{name}: {plural} {name:?} not found"
            ))),
        };
    }
    let selector = Selector::parse(reference.selector).map_err(|e| {
        SourceError::Invalid(format!(
            "failed to parse label selector as Selector for {kind} in namespace {namespace}: {e}"
        ))
    })?;
    let empty = BTreeMap::new();
    Ok(objects
        .iter()
        .filter(|(_, object)| selector.matches(object.labels().unwrap_or(&empty)))
        .collect())
}

/// Adds what `reference` names among `objects` (trust-manager's `configMapBundleSource` and
/// `secretBundleSource`).
fn add_objects<T: SourceObject>(
    pool: &mut CertificatePool,
    reference: &Reference<'_>,
    objects: &BTreeMap<String, T>,
    namespace: &str,
) -> Result<(), SourceError> {
    let kind = T::KIND;
    for (name, object) in selected(reference, objects, namespace)? {
        let invalid = |key: &str, e| {
            SourceError::Invalid(format!(
                "invalid PEM data in {kind} {namespace}/{name} at key {key:?}: {e}"
            ))
        };
        match reference.keys {
            Keys::None => {}
            Keys::One(key) => {
                let Some(bytes) = object.value(key) else {
                    return Err(SourceError::NotFound(format!(
                        "no data found in {kind} {namespace}/{name} at key {key:?}"
                    )));
                };
                pool.add_pem(bytes).map_err(|e| invalid(key, e))?;
            }
            Keys::All | Keys::Matching(_) => {
                // A TLS Secret's other key is its private key.
                if object.is_tls() {
                    return Err(SourceError::Invalid(format!(
                        "includeAllKeys is not supported for TLS Secrets such as {namespace}/{name}"
                    )));
                }
                for (key, bytes) in object.values() {
                    if let Keys::Matching(pattern) = reference.keys
                        && !glob_matches(pattern, key)
                    {
                        continue;
                    }
                    pool.add_pem(bytes).map_err(|e| invalid(key, e))?;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::glob_matches;

    #[test]
    fn a_wildcard_matches_any_run_of_characters_within_a_key() {
        for (pattern, key) in [
            ("*.crt", "ca.crt"),
            ("*.crt", ".crt"),
            ("ca-*", "ca-2026"),
            ("a*b*c", "aXXbYYc"),
            ("a*b*c", "abc"),
            ("*", "anything"),
            ("**", ""),
        ] {
            assert!(glob_matches(pattern, key), "{pattern} should match {key}");
        }
        for (pattern, key) in [
            ("*.crt", "ca.key"),
            ("ca-*", "root-ca"),
            ("a*b*c", "acb"),
            ("a*a", "a"),
            ("ca.crt", "ca.crt.old"),
        ] {
            assert!(
                !glob_matches(pattern, key),
                "{pattern} should not match {key}"
            );
        }
    }
}
