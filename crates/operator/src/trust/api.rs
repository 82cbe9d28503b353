//! trust-manager's `Bundle` (`trust.cert-manager.io/v1alpha1`) as Rust types, and the names its
//! targets carry. The CRD is upstream's own (`deploy/upstream-crds/`): caretaker serves the same
//! API so it can replace trust-manager on a live cluster, and never generates this schema.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// The label on every target: the name of the Bundle that wrote it.
pub const BUNDLE_LABEL: &str = "trust.cert-manager.io/bundle";
/// The annotation on every target: trust-manager's hash of what it wrote ([`super::target::hash`]).
pub const HASH_ANNOTATION: &str = "trust.cert-manager.io/hash";
/// The field manager of every write: trust-manager's, so that taking over from it finds its own
/// fields already owned and writes nothing.
pub const FIELD_MANAGER: &str = "trust-manager";
/// The default JKS password (the CRD's default).
pub const DEFAULT_JKS_PASSWORD: &str = "changeit";
/// The one condition a Bundle's status holds.
pub const SYNCED: &str = "Synced";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "trust.cert-manager.io",
    version = "v1alpha1",
    kind = "Bundle",
    status = "BundleStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct BundleSpec {
    pub sources: Vec<BundleSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<BundleTarget>,
}

/// One source; exactly one of its fields is set (the CRD and the webhook check it).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BundleSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<SourceObjectKeySelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<SourceObjectKeySelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_line: Option<String>,
    #[serde(
        rename = "useDefaultCAs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub use_default_cas: Option<bool>,
}

/// A ConfigMap or Secret in the trust namespace, by name or by label selector, and which of its
/// keys to read.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SourceObjectKeySelector {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_all_keys: Option<bool>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BundleTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<TargetTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<TargetTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_formats: Option<AdditionalFormats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
}

/// A target kind: the key the PEM bundle goes under, and labels and annotations to add.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TargetTemplate {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<TargetMetadata>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TargetMetadata {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

impl TargetTemplate {
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.metadata
            .as_ref()
            .and_then(|m| m.annotations.clone())
            .unwrap_or_default()
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        self.metadata
            .as_ref()
            .and_then(|m| m.labels.clone())
            .unwrap_or_default()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct AdditionalFormats {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jks: Option<JksFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pkcs12: Option<Pkcs12Format>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct JksFormat {
    pub key: String,
    /// The CRD defaults it to `changeit`; an object stored without the default gets it too.
    #[serde(default = "default_jks_password")]
    pub password: String,
}

fn default_jks_password() -> String {
    DEFAULT_JKS_PASSWORD.to_string()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Pkcs12Format {
    pub key: String,
    /// `None` only for an object stored without the CRD's default (`""`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// `LegacyRC2` (also when empty), `LegacyDES` or `Modern2023`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BundleStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<Vec<Condition>>,
    #[serde(
        rename = "defaultCAVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_ca_version: Option<String>,
}

impl BundleStatus {
    /// The `Synced` condition, if there is one.
    pub fn synced(&self) -> Option<&Condition> {
        self.conditions.iter().flatten().find(|c| c.type_ == SYNCED)
    }
}
