//! A Bundle's targets: whether one needs a write, and what the server-side apply sends.
//!
//! trust-manager decides from a target's metadata alone (it never reads target data): a target
//! is up to date when the Bundle controls it (owner UID), it carries the Bundle's label, its
//! `trust.cert-manager.io/hash` annotation equals [`hash`] of what would be written, and the data
//! keys owned by field manager `trust-manager` in `managedFields` are exactly the keys it writes
//! (someone else editing a key takes its ownership away, which is how drift is seen). caretaker
//! computes all of this exactly as trust-manager does, so the targets trust-manager wrote are
//! found up to date and taking over from it writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use base64::Engine;
use caretaker_pki::CertificatePool;
use caretaker_pki::truststore::{Pkcs12Profile, TrustStoreError, jks, pkcs12};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::api::{AdditionalFormats, BUNDLE_LABEL, FIELD_MANAGER, HASH_ANNOTATION, TargetTemplate};

/// The two kinds a Bundle writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetKind {
    ConfigMap,
    Secret,
}

impl TargetKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigMap => "ConfigMap",
            Self::Secret => "Secret",
        }
    }

    /// The data fields whose keys trust-manager owns in this kind.
    pub fn data_fields(self) -> &'static [&'static str] {
        match self {
            Self::ConfigMap => &["data", "binaryData"],
            Self::Secret => &["data"],
        }
    }
}

/// The Bundle a target belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    pub name: &'a str,
    pub uid: &'a str,
}

/// trust-manager's `TrustBundleHash`: SHA-256 over the PEM, the JKS password, the PKCS#12
/// password and profile, then the template's annotations and labels as key+value in key order;
/// lowercase hex.
pub fn hash(pem: &str, formats: Option<&AdditionalFormats>, template: &TargetTemplate) -> String {
    let mut sha = Sha256::new();
    sha.update(pem.as_bytes());
    if let Some(jks) = formats.and_then(|f| f.jks.as_ref()) {
        sha.update(jks.password.as_bytes());
    }
    if let Some(pkcs12) = formats.and_then(|f| f.pkcs12.as_ref()) {
        if let Some(password) = &pkcs12.password {
            sha.update(password.as_bytes());
        }
        if let Some(profile) = &pkcs12.profile {
            sha.update(profile.as_bytes());
        }
    }
    for (key, value) in template
        .annotations()
        .iter()
        .chain(template.labels().iter())
    {
        sha.update(key.as_bytes());
        sha.update(value.as_bytes());
    }
    super::hex(&sha.finalize())
}

/// The keys a target of `template` holds: the PEM key and the binary formats' keys.
pub fn keys(template: &TargetTemplate, formats: Option<&AdditionalFormats>) -> BTreeSet<String> {
    let mut keys = BTreeSet::from([template.key.clone()]);
    if let Some(formats) = formats {
        keys.extend(formats.jks.iter().map(|j| j.key.clone()));
        keys.extend(formats.pkcs12.iter().map(|p| p.key.clone()));
    }
    keys
}

/// What decides whether an existing target needs a write: its metadata only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedTarget {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// The UID of the controller owner reference, if any.
    pub controller_uid: Option<String>,
    /// The data keys field manager `trust-manager` owns.
    pub managed_keys: BTreeSet<String>,
    pub deleting: bool,
}

impl ObservedTarget {
    pub fn from_metadata(kind: TargetKind, metadata: &ObjectMeta) -> Self {
        let controller_uid = metadata
            .owner_references
            .iter()
            .flatten()
            .find(|r| r.controller == Some(true))
            .map(|r| r.uid.clone());
        let mut managed_keys = BTreeSet::new();
        for entry in metadata.managed_fields.iter().flatten() {
            if entry.manager.as_deref() != Some(FIELD_MANAGER) {
                continue;
            }
            let Some(fields) = entry.fields_v1.as_ref().map(|f| &f.0) else {
                continue;
            };
            for field in kind.data_fields() {
                let owned = fields.get(format!("f:{field}")).and_then(Value::as_object);
                for path in owned.into_iter().flat_map(|o| o.keys()) {
                    if let Some(key) = path.strip_prefix("f:") {
                        managed_keys.insert(key.to_string());
                    }
                }
            }
        }
        Self {
            labels: metadata.labels.clone().unwrap_or_default(),
            annotations: metadata.annotations.clone().unwrap_or_default(),
            controller_uid,
            managed_keys,
            deleting: metadata.deletion_timestamp.is_some(),
        }
    }

    /// Whether `owner` is this target's controller.
    pub fn controlled_by(&self, owner: &Owner<'_>) -> bool {
        self.controller_uid.as_deref() == Some(owner.uid)
    }

    /// trust-manager's `needsUpdate`.
    pub fn needs_update(&self, owner: &Owner<'_>, hash: &str, keys: &BTreeSet<String>) -> bool {
        !self.controlled_by(owner)
            || self.labels.get(BUNDLE_LABEL).map(String::as_str) != Some(owner.name)
            || self.annotations.get(HASH_ANNOTATION).map(String::as_str) != Some(hash)
            || &self.managed_keys != keys
    }
}

/// The binary stores a target holds, by key.
pub fn binary_formats(
    pool: &CertificatePool,
    formats: Option<&AdditionalFormats>,
) -> Result<BTreeMap<String, Vec<u8>>, TrustStoreError> {
    let mut out = BTreeMap::new();
    let Some(formats) = formats else {
        return Ok(out);
    };
    if let Some(format) = &formats.jks {
        out.insert(format.key.clone(), jks::encode(pool, &format.password));
    }
    if let Some(format) = &formats.pkcs12 {
        let profile = format
            .profile
            .as_deref()
            .and_then(Pkcs12Profile::from_api)
            .unwrap_or(Pkcs12Profile::LegacyRc2);
        let password = format.password.as_deref().unwrap_or_default();
        out.insert(format.key.clone(), pkcs12::encode(pool, password, profile)?);
    }
    Ok(out)
}

/// The label and controller owner reference every apply carries.
fn owned_metadata(namespace: &str, owner: &Owner<'_>) -> Value {
    json!({
        "name": owner.name,
        "namespace": namespace,
        "labels": {BUNDLE_LABEL: owner.name},
        "ownerReferences": [{
            "apiVersion": "trust.cert-manager.io/v1alpha1",
            "kind": "Bundle",
            "name": owner.name,
            "uid": owner.uid,
            "controller": true,
            "blockOwnerDeletion": true,
        }],
    })
}

/// What every target of one kind holds: the same for every namespace of a pass.
#[derive(Debug, PartialEq)]
pub struct TargetContent {
    pub owner_name: String,
    pub owner_uid: String,
    pub template: TargetTemplate,
    pub hash: String,
    pub pem: Arc<str>,
    pub binary: Arc<BTreeMap<String, Vec<u8>>>,
}

/// The server-side apply body of a target: everything trust-manager owns in it. Keys it owned
/// before and no longer sends leave the target in the same write.
pub fn apply_body(kind: TargetKind, namespace: &str, content: &TargetContent) -> Value {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let owner = Owner {
        name: &content.owner_name,
        uid: &content.owner_uid,
    };
    let mut metadata = owned_metadata(namespace, &owner);
    let mut annotations = content.template.annotations();
    annotations.insert(HASH_ANNOTATION.into(), content.hash.clone());
    metadata["annotations"] = json!(annotations);
    let labels = metadata["labels"]
        .as_object_mut()
        .expect("labels is an object");
    for (key, value) in content.template.labels() {
        labels.insert(key, value.into());
    }
    let mut body = json!({"apiVersion": "v1", "kind": kind.as_str(), "metadata": metadata});
    let key = content.template.key.clone();
    match kind {
        TargetKind::ConfigMap => {
            body["data"] = json!({key: &*content.pem});
            if !content.binary.is_empty() {
                let binary: BTreeMap<&String, String> =
                    content.binary.iter().map(|(k, v)| (k, b64(v))).collect();
                body["binaryData"] = json!(binary);
            }
        }
        TargetKind::Secret => {
            let mut data: BTreeMap<&String, String> =
                content.binary.iter().map(|(k, v)| (k, b64(v))).collect();
            data.insert(&key, b64(content.pem.as_bytes()));
            body["data"] = json!(data);
        }
    }
    body
}

/// The apply that gives up a target no longer wanted: only the label and owner reference, so
/// every field trust-manager solely owned (data, hash, template metadata) is removed.
pub fn cleanup_body(kind: TargetKind, namespace: &str, owner: &Owner<'_>) -> Value {
    json!({"apiVersion": "v1", "kind": kind.as_str(), "metadata": owned_metadata(namespace, owner)})
}
