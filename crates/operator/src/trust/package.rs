//! The default CA package behind `useDefaultCAs: true`: trust-manager's JSON format
//! (`{"name", "bundle", "version"}`, loaded from `--default-package-location`), or the machine's
//! own CA store (`--default-package-from-system`), so a cluster needs no package image.

use std::path::{Path, PathBuf};

use caretaker_pki::{CertificatePool, PoolFilters};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// Where Linux distributions keep their CA store, in the order Go's crypto/x509 looks.
const SYSTEM_STORES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// A package of default CAs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DefaultPackage {
    pub name: String,
    pub bundle: String,
    pub version: String,
}

/// Why no package could be loaded; each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error(
        "can't load package at path {0:?} since it doesn't have the required \".json\" extension"
    )]
    NotJson(PathBuf),
    #[error("failed to open package on filesystem {path:?}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("failed to load package {path:?}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("no system CA store found (looked at $SSL_CERT_FILE and {})", SYSTEM_STORES.join(", "))]
    NoSystemStore,
}

impl DefaultPackage {
    /// trust-manager's `StringID`, recorded in `status.defaultCAVersion`:
    /// `<name>-<version>-<first 8 bytes of the bundle's SHA-256 in hex>`.
    pub fn string_id(&self) -> String {
        let hash = Sha256::digest(self.bundle.as_bytes());
        format!("{}-{}-{}", self.name, self.version, super::hex(&hash[..8]))
    }

    /// Reads a package file as trust-manager does: the name must end in `.json`, the bundle must
    /// be strict PEM, name and version must not be empty.
    pub fn load(path: &Path) -> Result<Self, PackageError> {
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            return Err(PackageError::NotJson(path.to_path_buf()));
        }
        let text = std::fs::read(path).map_err(|source| PackageError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |reason: String| PackageError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let package: Self = serde_json::from_slice(&text)
            .map_err(|e| invalid(format!("failed to parse package JSON: {e}")))?;
        package.validate().map_err(invalid)?;
        Ok(package)
    }

    /// A package of the machine's CA store (`$SSL_CERT_FILE`, else the first distribution
    /// store found). Its version is the first 12 hex digits of the store's SHA-256, so it changes
    /// exactly when the store does.
    pub fn from_system() -> Result<Self, PackageError> {
        let candidates = std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .into_iter()
            .chain(SYSTEM_STORES.iter().map(PathBuf::from));
        let path = candidates
            .into_iter()
            .find(|p| p.is_file())
            .ok_or(PackageError::NoSystemStore)?;
        let bundle = std::fs::read_to_string(&path).map_err(|source| PackageError::Read {
            path: path.clone(),
            source,
        })?;
        let hash = Sha256::digest(bundle.as_bytes());
        let version = super::hex(&hash[..6]);
        let package = Self {
            name: "caretaker-system".into(),
            bundle,
            version,
        };
        package
            .validate()
            .map_err(|reason| PackageError::Invalid { path, reason })?;
        Ok(package)
    }

    fn validate(&self) -> Result<(), String> {
        let mut pool =
            CertificatePool::new(PoolFilters::default(), time::OffsetDateTime::now_utc());
        pool.add_pem(self.bundle.as_bytes())
            .map_err(|e| format!("package bundle failed validation: {e}"))?;
        if self.name.is_empty() {
            return Err("package may not have an empty 'name'".into());
        }
        if self.version.is_empty() {
            return Err("package may not have an empty 'version'".into());
        }
        Ok(())
    }
}
