//! The targets of Bundles and ClusterBundles: whether one needs a write, and what the
//! server-side apply sends.
//!
//! trust-manager decides from a target's metadata alone (it never reads target data): a target
//! is up to date when the Bundle controls it (owner UID), it carries the Bundle's label, its
//! `trust.cert-manager.io/hash` annotation equals [`TargetSpec::hash`] of what would be written, and the data
//! keys owned by field manager `trust-manager` in `managedFields` are exactly the keys it writes
//! (someone else editing a key takes its ownership away, which is how drift is seen). caretaker
//! computes all of this exactly as trust-manager does, so the targets trust-manager wrote are
//! found up to date and taking over from it writes nothing.
//!
//! A ClusterBundle's targets follow the same rules under `trust-manager.io/bundle` and
//! `trust-manager.io/hash`. Upstream has no ClusterBundle controller, so its hash is caretaker's
//! own; what it covers is in [`cluster_bundle_specs`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use base64::Engine;
use caretaker_pki::CertificatePool;
use caretaker_pki::truststore::{Pkcs12Profile, TrustStoreError, jks, pkcs12};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::api::{BUNDLE_LABEL, BundleTarget, FIELD_MANAGER, HASH_ANNOTATION};
use super::cluster_bundle::{
    CLUSTER_BUNDLE_LABEL, CLUSTER_HASH_ANNOTATION, ClusterBundleTarget, KeyValueTarget,
};

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

/// The API of the object targets belong to: the names they carry differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OwnerApi {
    /// `trust.cert-manager.io/v1alpha1` `Bundle`.
    Bundle,
    /// `trust-manager.io/v1alpha2` `ClusterBundle`.
    ClusterBundle,
}

impl OwnerApi {
    pub fn api_version(self) -> &'static str {
        match self {
            Self::Bundle => "trust.cert-manager.io/v1alpha1",
            Self::ClusterBundle => "trust-manager.io/v1alpha2",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Self::Bundle => "Bundle",
            Self::ClusterBundle => "ClusterBundle",
        }
    }

    /// The label every target carries: its owner's name.
    pub fn label(self) -> &'static str {
        match self {
            Self::Bundle => BUNDLE_LABEL,
            Self::ClusterBundle => CLUSTER_BUNDLE_LABEL,
        }
    }

    /// The annotation that records the hash of what was written.
    pub fn hash_annotation(self) -> &'static str {
        match self {
            Self::Bundle => HASH_ANNOTATION,
            Self::ClusterBundle => CLUSTER_HASH_ANNOTATION,
        }
    }
}

/// The Bundle or ClusterBundle a target belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    pub api: OwnerApi,
    pub name: &'a str,
    pub uid: &'a str,
}

/// A binary trust store one target key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreFormat {
    Jks {
        password: String,
    },
    Pkcs12 {
        password: String,
        profile: Pkcs12Profile,
    },
}

/// What every target of one kind holds, whichever API asked for it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TargetSpec {
    /// The keys the PEM bundle is written under.
    pub pem_keys: Vec<String>,
    /// The keys binary stores are written under.
    pub stores: BTreeMap<String, StoreFormat>,
    pub annotations: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    /// What the hash covers between the PEM and the metadata: for a Bundle exactly what
    /// trust-manager's hash covers.
    pub hashed_settings: Vec<String>,
}

impl TargetSpec {
    /// trust-manager's `TrustBundleHash`: SHA-256 over the PEM, then the settings (for a
    /// Bundle: the JKS password, the PKCS#12 password and profile), then the annotations and
    /// labels as key+value in key order; lowercase hex.
    pub fn hash(&self, pem: &str) -> String {
        let mut sha = Sha256::new();
        sha.update(pem.as_bytes());
        for setting in &self.hashed_settings {
            sha.update(setting.as_bytes());
        }
        for (key, value) in self.annotations.iter().chain(self.labels.iter()) {
            sha.update(key.as_bytes());
            sha.update(value.as_bytes());
        }
        super::hex(&sha.finalize())
    }

    /// Every key a target of this spec holds.
    pub fn keys(&self) -> BTreeSet<String> {
        let pem = self.pem_keys.iter().cloned();
        pem.chain(self.stores.keys().cloned()).collect()
    }

    /// The binary stores, by key.
    pub fn encode_stores(
        &self,
        pool: &CertificatePool,
    ) -> Result<BTreeMap<String, Vec<u8>>, TrustStoreError> {
        let mut out = BTreeMap::new();
        for (key, format) in &self.stores {
            let bytes = match format {
                StoreFormat::Jks { password } => jks::encode(pool, password),
                StoreFormat::Pkcs12 { password, profile } => {
                    pkcs12::encode(pool, password, *profile)?
                }
            };
            out.insert(key.clone(), bytes);
        }
        Ok(out)
    }
}

/// A Bundle's target kinds: the PEM key of each, and the additional formats (PKCS#12 as
/// `LegacyRC2` when no profile is given) on both.
pub fn bundle_specs(target: &BundleTarget) -> Vec<(TargetKind, TargetSpec)> {
    let formats = target.additional_formats.as_ref();
    let mut stores = BTreeMap::new();
    let mut hashed_settings = Vec::new();
    if let Some(format) = formats.and_then(|f| f.jks.as_ref()) {
        let password = format.password.clone();
        hashed_settings.push(password.clone());
        stores.insert(format.key.clone(), StoreFormat::Jks { password });
    }
    if let Some(format) = formats.and_then(|f| f.pkcs12.as_ref()) {
        hashed_settings.extend(format.password.iter().cloned());
        hashed_settings.extend(format.profile.iter().cloned());
        let profile = format.profile.as_deref().and_then(Pkcs12Profile::from_api);
        stores.insert(
            format.key.clone(),
            StoreFormat::Pkcs12 {
                password: format.password.clone().unwrap_or_default(),
                profile: profile.unwrap_or(Pkcs12Profile::LegacyRc2),
            },
        );
    }
    [
        (TargetKind::ConfigMap, &target.config_map),
        (TargetKind::Secret, &target.secret),
    ]
    .into_iter()
    .filter_map(|(kind, template)| {
        let template = template.as_ref()?;
        let spec = TargetSpec {
            pem_keys: vec![template.key.clone()],
            stores: stores.clone(),
            annotations: template.annotations(),
            labels: template.labels(),
            hashed_settings: hashed_settings.clone(),
        };
        Some((kind, spec))
    })
    .collect()
}

/// A ClusterBundle's target kinds: each `data` entry is PEM, or PKCS#12 (`LegacyDES` when no
/// profile is given), or JKS for the key a converted Bundle marked with `jks_key`. Every entry's
/// key, format, password and profile are hashed, so any change of them is a write.
pub fn cluster_bundle_specs(
    target: &ClusterBundleTarget,
    jks_key: Option<&str>,
) -> Vec<(TargetKind, TargetSpec)> {
    let spec = |kind: &KeyValueTarget| {
        let mut spec = TargetSpec::default();
        for entry in &kind.data {
            let password = entry.password.clone().unwrap_or_default();
            let format = match entry.format.as_deref() {
                Some("PKCS12") if jks_key == Some(entry.key.as_str()) => {
                    Some(StoreFormat::Jks { password })
                }
                Some("PKCS12") => {
                    let profile = entry.profile.as_deref().and_then(Pkcs12Profile::from_api);
                    let profile = profile.unwrap_or(Pkcs12Profile::LegacyDes);
                    Some(StoreFormat::Pkcs12 { password, profile })
                }
                _ => None,
            };
            // NUL-separated, so that no two entries hash alike.
            let setting = match &format {
                None => format!("{}\0PEM\0", entry.key),
                Some(StoreFormat::Jks { password }) => {
                    format!("{}\0JKS\0{password}\0", entry.key)
                }
                Some(StoreFormat::Pkcs12 { password, profile }) => {
                    let profile = profile.api_name();
                    format!("{}\0PKCS12\0{password}\0{profile}\0", entry.key)
                }
            };
            spec.hashed_settings.push(setting);
            match format {
                Some(format) => {
                    spec.stores.insert(entry.key.clone(), format);
                }
                None => spec.pem_keys.push(entry.key.clone()),
            }
        }
        let metadata = kind.metadata.clone().unwrap_or_default();
        spec.annotations = metadata.annotations.unwrap_or_default();
        spec.labels = metadata.labels.unwrap_or_default();
        spec
    };
    [
        (TargetKind::ConfigMap, &target.config_map),
        (TargetKind::Secret, &target.secret),
    ]
    .into_iter()
    .filter_map(|(kind, template)| Some((kind, spec(template.as_ref()?))))
    .collect()
}

/// An owner reference of a target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerLink {
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub controller: bool,
}

/// What decides whether an existing target needs a write: its metadata only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedTarget {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub owners: Vec<OwnerLink>,
    /// The data keys field manager `trust-manager` owns.
    pub managed_keys: BTreeSet<String>,
    pub deleting: bool,
}

impl ObservedTarget {
    pub fn from_metadata(kind: TargetKind, metadata: &ObjectMeta) -> Self {
        let owners = metadata.owner_references.iter().flatten();
        let owners = owners
            .map(|r| OwnerLink {
                kind: r.kind.clone(),
                name: r.name.clone(),
                uid: r.uid.clone(),
                controller: r.controller == Some(true),
            })
            .collect();
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
            owners,
            managed_keys,
            deleting: metadata.deletion_timestamp.is_some(),
        }
    }

    /// The controller owner reference, if any.
    pub fn controller(&self) -> Option<&OwnerLink> {
        self.owners.iter().find(|o| o.controller)
    }

    /// Whether `owner` is this target's controller.
    pub fn controlled_by(&self, owner: &Owner<'_>) -> bool {
        self.controller().is_some_and(|c| c.uid == owner.uid)
    }

    /// The UID of a Bundle of `name` among the owners: while it is there, a ClusterBundle's
    /// writes keep it as a non-controller owner, so a downgrade finds its targets still owned.
    pub fn bundle_owner(&self, name: &str) -> Option<&str> {
        let bundle = OwnerApi::Bundle.kind();
        let found = self
            .owners
            .iter()
            .find(|o| o.kind == bundle && o.name == name);
        found.map(|o| o.uid.as_str())
    }

    /// Why `owner` must not write this target, if it must not: another object controls it.
    /// A controller of the same kind and name is an earlier incarnation of the owner (trust-manager
    /// takes those over too), and a ClusterBundle takes over from the Bundle of its name when
    /// `adopt_bundle` (migration).
    pub fn refusal(&self, owner: &Owner<'_>, adopt_bundle: bool) -> Option<String> {
        let controller = self.controller()?;
        let same_name = controller.name == owner.name;
        let own_kind = controller.kind == owner.api.kind();
        let adoptable = adopt_bundle
            && owner.api == OwnerApi::ClusterBundle
            && controller.kind == OwnerApi::Bundle.kind();
        if same_name && (own_kind || adoptable) {
            return None;
        }
        Some(format!(
            "it is controlled by {} {:?}",
            controller.kind, controller.name
        ))
    }

    /// trust-manager's `needsUpdate`.
    pub fn needs_update(&self, owner: &Owner<'_>, hash: &str, keys: &BTreeSet<String>) -> bool {
        let label = self.labels.get(owner.api.label()).map(String::as_str);
        let recorded = self.annotations.get(owner.api.hash_annotation());
        !self.controlled_by(owner)
            || label != Some(owner.name)
            || recorded.map(String::as_str) != Some(hash)
            || &self.managed_keys != keys
    }
}

/// The label and owner references every apply carries: the owner as controller, and the Bundle
/// `kept_bundle` (its UID) as a non-controller owner when a ClusterBundle keeps it.
fn owned_metadata(namespace: &str, owner: &Owner<'_>, kept_bundle: Option<&str>) -> Value {
    let mut references = vec![json!({
        "apiVersion": owner.api.api_version(),
        "kind": owner.api.kind(),
        "name": owner.name,
        "uid": owner.uid,
        "controller": true,
        "blockOwnerDeletion": true,
    })];
    if let Some(uid) = kept_bundle {
        references.push(json!({
            "apiVersion": OwnerApi::Bundle.api_version(),
            "kind": OwnerApi::Bundle.kind(),
            "name": owner.name,
            "uid": uid,
        }));
    }
    json!({
        "name": owner.name,
        "namespace": namespace,
        "labels": {owner.api.label(): owner.name},
        "ownerReferences": references,
    })
}

/// What every target of one kind holds: the same for every namespace of a pass.
#[derive(Debug, PartialEq)]
pub struct TargetContent {
    pub owner_api: OwnerApi,
    pub owner_name: String,
    pub owner_uid: String,
    pub spec: TargetSpec,
    pub hash: String,
    pub pem: Arc<str>,
    pub binary: Arc<BTreeMap<String, Vec<u8>>>,
}

/// The server-side apply body of a target: everything trust-manager owns in it. Keys it owned
/// before and no longer sends leave the target in the same write, and so do the label and hash
/// of a Bundle a ClusterBundle takes the target over from.
pub fn apply_body(
    kind: TargetKind,
    namespace: &str,
    content: &TargetContent,
    kept_bundle: Option<&str>,
) -> Value {
    let b64 = |bytes: &[u8]| base64::engine::general_purpose::STANDARD.encode(bytes);
    let owner = Owner {
        api: content.owner_api,
        name: &content.owner_name,
        uid: &content.owner_uid,
    };
    let mut metadata = owned_metadata(namespace, &owner, kept_bundle);
    let mut annotations = content.spec.annotations.clone();
    annotations.insert(owner.api.hash_annotation().into(), content.hash.clone());
    metadata["annotations"] = json!(annotations);
    let labels = metadata["labels"]
        .as_object_mut()
        .expect("labels is an object");
    for (key, value) in &content.spec.labels {
        labels.insert(key.clone(), value.clone().into());
    }
    let mut body = json!({"apiVersion": "v1", "kind": kind.as_str(), "metadata": metadata});
    let pem_keys = content.spec.pem_keys.iter();
    match kind {
        TargetKind::ConfigMap => {
            let text: BTreeMap<&String, &str> = pem_keys.map(|k| (k, &*content.pem)).collect();
            body["data"] = json!(text);
            if !content.binary.is_empty() {
                let binary: BTreeMap<&String, String> =
                    content.binary.iter().map(|(k, v)| (k, b64(v))).collect();
                body["binaryData"] = json!(binary);
            }
        }
        TargetKind::Secret => {
            let mut data: BTreeMap<&String, String> =
                content.binary.iter().map(|(k, v)| (k, b64(v))).collect();
            data.extend(pem_keys.map(|k| (k, b64(content.pem.as_bytes()))));
            body["data"] = json!(data);
        }
    }
    body
}

/// The apply that gives up a target no longer wanted: only the label and owner reference, so
/// every field trust-manager solely owned (data, hash, template metadata) is removed.
pub fn cleanup_body(kind: TargetKind, namespace: &str, owner: &Owner<'_>) -> Value {
    let metadata = owned_metadata(namespace, owner, None);
    json!({"apiVersion": "v1", "kind": kind.as_str(), "metadata": metadata})
}
