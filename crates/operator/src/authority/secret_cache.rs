//! The Secrets the CA controllers read, cached small. A CA with thousands of certificates
//! has thousands of Secrets cached at once, and a `Secret` as kube's store keeps it costs
//! three times what it holds: each of its maps (labels, annotations, data) is a B-tree whose
//! node has room for eleven entries, 544 bytes even for one entry, and the store keys it by a
//! copy of its name, namespace, version and uid. Here a Secret is its version and type, its
//! labels, annotations and data as exact slices, and its `ca.crt` once per distinct content
//! (the certificates of one CA hold the same bundle). A pass gets the Secret back whole
//! ([`CachedSecret::secret`]).
//!
//! What no pass reads is not kept: `managedFields`, kubectl's last applied configuration, and
//! the data of every Secret that is not `kubernetes.io/tls` (caretaker writes only those; a
//! pass that meets another type reads it fresh).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::ObjectMeta;

use crate::authority::{CA_CRT, Certificate, TLS_CRT, leaf};
use crate::ownership::{self, Claim, Owner};
use caretaker_api::names::SECRET_TYPE_TLS;

/// kubectl's copy of the last applied object: as large as the object, never read, dropped
/// from cached objects.
pub(crate) const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A Secret's namespace and name.
type Key = (String, String);

/// Keys and values, in the order of the map they came from.
type Pairs<V> = Box<[(String, V)]>;

/// One Secret as cached.
#[derive(Debug, PartialEq)]
pub(crate) struct CachedSecret {
    resource_version: Option<String>,
    type_: Option<String>,
    labels: Pairs<String>,
    annotations: Pairs<String>,
    /// Its controller owner reference, alone of its owner references ([`ownership::claim_by`]).
    controller: Option<Box<OwnerReference>>,
    /// Without `ca.crt`; `None` when not kept (not `kubernetes.io/tls`).
    data: Option<Pairs<Box<[u8]>>>,
    ca_crt: Option<Arc<[u8]>>,
}

impl CachedSecret {
    pub(crate) fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// Whether its data is cached: it is `kubernetes.io/tls`.
    pub(crate) fn has_data(&self) -> bool {
        self.data.is_some()
    }

    /// Whether `owner` may write it, as the Secret `key` ([`ownership::claim`]).
    pub(crate) fn claim(&self, owner: &Owner, key: &Key) -> Claim {
        let annotation = |name: &str| {
            (self.annotations.iter())
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        };
        let controller = (self.controller.as_deref()).map(|c| (c.kind.as_str(), c.name.as_str()));
        let object = format!("{}/{}", key.0, key.1);
        ownership::claim_by(owner, "Secret", &object, controller, annotation)
    }

    pub(crate) fn ca_crt(&self) -> Option<&[u8]> {
        self.ca_crt.as_deref()
    }

    /// The first certificate of `tls.crt`, unless its data is not cached or holds none to use.
    pub(crate) fn leaf(&self) -> Option<Certificate> {
        let tls_crt = (self.data.as_deref()?.iter()).find(|(k, _)| k == TLS_CRT)?;
        let data = BTreeMap::from([(TLS_CRT.to_string(), tls_crt.1.to_vec())]);
        leaf::read_leaf(&data).0.ok()
    }

    /// The Secret `key` whole again, as the watch brought it but for what is not kept.
    pub(crate) fn secret(&self, key: &Key) -> Secret {
        let map = |pairs: &[(String, String)]| {
            (!pairs.is_empty()).then(|| pairs.iter().cloned().collect::<BTreeMap<_, _>>())
        };
        let data = self.data.as_deref().map(|data| {
            let mut whole: BTreeMap<String, ByteString> = (data.iter())
                .map(|(k, v)| (k.clone(), ByteString(v.to_vec())))
                .collect();
            if let Some(ca_crt) = &self.ca_crt {
                whole.insert(CA_CRT.to_string(), ByteString(ca_crt.to_vec()));
            }
            whole
        });
        Secret {
            metadata: ObjectMeta {
                namespace: Some(key.0.clone()),
                name: Some(key.1.clone()),
                resource_version: self.resource_version.clone(),
                labels: map(&self.labels),
                annotations: map(&self.annotations),
                owner_references: (self.controller.as_deref()).map(|c| vec![c.clone()]),
                ..ObjectMeta::default()
            },
            type_: self.type_.clone(),
            data,
            ..Secret::default()
        }
    }
}

/// The cached Secrets by namespace and name, and the `ca.crt` contents they share.
#[derive(Default)]
pub(crate) struct SecretCache(Mutex<Cached>);

#[derive(Default)]
struct Cached {
    secrets: HashMap<Key, Arc<CachedSecret>>,
    /// What a relist brought so far; it replaces `secrets` when complete.
    relisted: Option<HashMap<Key, Arc<CachedSecret>>>,
    ca_crts: HashSet<Arc<[u8]>>,
}

impl SecretCache {
    pub(crate) fn get(&self, key: &Key) -> Option<Arc<CachedSecret>> {
        self.lock().secrets.get(key).cloned()
    }

    #[cfg(test)]
    fn keys(&self) -> Vec<Key> {
        self.lock().secrets.keys().cloned().collect()
    }

    /// The watch brought `secret`, the Secret `key`, created or changed.
    pub(crate) fn apply(&self, key: Key, secret: Secret) {
        let mut cached = self.lock();
        let secret = cached.compact(secret);
        cached.secrets.insert(key, Arc::new(secret));
        cached.forget_unheld_ca_crts();
    }

    /// The watch saw the Secret `key` deleted.
    pub(crate) fn delete(&self, key: &Key) {
        let mut cached = self.lock();
        cached.secrets.remove(key);
        cached.forget_unheld_ca_crts();
    }

    /// A relist starts: what it brings replaces the cache once it is complete.
    pub(crate) fn relist_started(&self) {
        self.lock().relisted = Some(HashMap::new());
    }

    pub(crate) fn relisted(&self, key: Key, secret: Secret) {
        let mut cached = self.lock();
        let secret = cached.compact(secret);
        cached
            .relisted
            .get_or_insert_default()
            .insert(key, Arc::new(secret));
    }

    /// The relist is complete: Secrets gone while the watch was down go with it.
    pub(crate) fn relist_done(&self) {
        let mut cached = self.lock();
        cached.secrets = cached.relisted.take().unwrap_or_default();
        cached.forget_unheld_ca_crts();
    }

    fn lock(&self) -> MutexGuard<'_, Cached> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Cached {
    fn compact(&mut self, secret: Secret) -> CachedSecret {
        let Secret {
            metadata,
            data,
            type_,
            ..
        } = secret;
        let controller = (metadata.owner_references.unwrap_or_default().into_iter())
            .find(|r| r.controller == Some(true))
            .map(Box::new);
        let labels = metadata.labels.unwrap_or_default();
        let mut annotations = metadata.annotations.unwrap_or_default();
        annotations.remove(LAST_APPLIED);
        let mut data = match type_.as_deref() == Some(SECRET_TYPE_TLS) {
            true => Some(data.unwrap_or_default()),
            false => None,
        };
        let ca_crt = (data.as_mut())
            .and_then(|data| data.remove(CA_CRT))
            .map(|ByteString(bytes)| self.share(bytes));
        CachedSecret {
            resource_version: metadata.resource_version,
            type_,
            labels: labels.into_iter().collect(),
            annotations: annotations.into_iter().collect(),
            controller,
            data: data.map(|data| {
                (data.into_iter())
                    .map(|(k, ByteString(v))| (k, v.into_boxed_slice()))
                    .collect()
            }),
            ca_crt,
        }
    }

    /// The one copy of a `ca.crt` content.
    fn share(&mut self, bytes: Vec<u8>) -> Arc<[u8]> {
        if let Some(same) = self.ca_crts.get(bytes.as_slice()) {
            return same.clone();
        }
        let new: Arc<[u8]> = bytes.into();
        self.ca_crts.insert(new.clone());
        new
    }

    /// Drops the contents no one holds any more (a few: one per bundle in use).
    fn forget_unheld_ca_crts(&mut self) {
        self.ca_crts
            .retain(|content| Arc::strong_count(content) > 1);
    }
}

#[cfg(test)]
mod tests {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde_json::json;

    use super::*;
    use caretaker_api::names;

    fn secret(name: &str, version: &str, type_: &str, ca_crt: &str) -> Secret {
        let (label, value) = names::MANAGED_BY;
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "demo", "resourceVersion": version,
                "uid": "0c0ffee0-0000-0000-0000-000000000000",
                "labels": { label: value },
                "annotations": { LAST_APPLIED: "{}", "keep": "1", names::OWNER: "IssuedCertificate/demo/web/u1" },
                "managedFields": [{ "manager": "kubectl" }],
            },
            "type": type_,
            "data": { "tls.crt": "bGVhZg==", "tls.key": "a2V5", CA_CRT: STANDARD.encode(ca_crt) },
        }))
        .unwrap()
    }

    fn key(name: &str) -> Key {
        ("demo".into(), name.into())
    }

    /// What a pass reads comes back whole: version, type, labels, annotations and data with
    /// `ca.crt`; what no pass reads does not.
    #[test]
    fn a_cached_secret_comes_back_as_the_passes_read_it() {
        let cache = SecretCache::default();
        let original = secret("web", "7", SECRET_TYPE_TLS, "bundle");
        cache.apply(key("web"), original.clone());
        let cached = cache.get(&key("web")).unwrap();
        assert!(cached.has_data());
        let web = Owner::new("IssuedCertificate", Some("demo"), "web", "u1");
        assert_eq!(cached.claim(&web, &key("web")), Claim::Own);
        let earlier = Owner::new("IssuedCertificate", Some("demo"), "web", "u0");
        assert!(!cached.claim(&earlier, &key("web")).allowed());
        assert_eq!(cached.resource_version(), Some("7"));
        assert_eq!(cached.ca_crt(), Some(&b"bundle"[..]));

        let back = cached.secret(&key("web"));
        let mut expected = original;
        expected.metadata.managed_fields = None;
        expected.metadata.uid = None;
        (expected.metadata.annotations.as_mut().unwrap()).remove(LAST_APPLIED);
        assert_eq!(back, expected);
    }

    #[test]
    fn only_tls_secrets_keep_their_data() {
        let cache = SecretCache::default();
        cache.apply(key("opaque"), secret("opaque", "1", "Opaque", "bundle"));
        let cached = cache.get(&key("opaque")).unwrap();
        assert!(!cached.has_data() && cached.ca_crt().is_none() && cached.leaf().is_none());
        let back = cached.secret(&key("opaque"));
        assert_eq!(back.data, None);
        assert_eq!(back.type_.as_deref(), Some("Opaque"));
        assert!(cache.lock().ca_crts.is_empty());
    }

    #[test]
    fn secrets_share_one_copy_of_each_ca_crt_while_one_holds_it() {
        let cache = SecretCache::default();
        cache.apply(key("web"), secret("web", "1", SECRET_TYPE_TLS, "both"));
        cache.apply(key("api"), secret("api", "2", SECRET_TYPE_TLS, "both"));
        let (web, api) = (
            cache.get(&key("web")).unwrap(),
            cache.get(&key("api")).unwrap(),
        );
        assert!(Arc::ptr_eq(
            web.ca_crt.as_ref().unwrap(),
            api.ca_crt.as_ref().unwrap()
        ));
        assert_eq!(cache.lock().ca_crts.len(), 1);

        cache.apply(key("web"), secret("web", "3", SECRET_TYPE_TLS, "new"));
        assert_eq!(cache.lock().ca_crts.len(), 2);
        drop((web, api));
        cache.apply(key("api"), secret("api", "4", SECRET_TYPE_TLS, "new"));
        assert_eq!(
            cache.lock().ca_crts.len(),
            1,
            "a content no Secret holds goes"
        );
        cache.delete(&key("web"));
        assert!(cache.get(&key("web")).is_none());
        cache.delete(&key("api"));
        assert!(cache.lock().ca_crts.is_empty() && cache.keys().is_empty());
    }

    /// A relist replaces the cache only once complete: until then passes read what was
    /// cached; after it, a Secret deleted while the watch was down is gone.
    #[test]
    fn a_relist_replaces_the_cache_once_complete() {
        let cache = SecretCache::default();
        cache.apply(key("gone"), secret("gone", "1", SECRET_TYPE_TLS, "old"));
        cache.apply(key("kept"), secret("kept", "2", SECRET_TYPE_TLS, "old"));
        cache.relist_started();
        cache.relisted(key("kept"), secret("kept", "3", SECRET_TYPE_TLS, "new"));
        assert_eq!(
            cache.get(&key("kept")).unwrap().resource_version(),
            Some("2")
        );
        assert!(cache.get(&key("gone")).is_some());
        cache.relist_done();
        assert_eq!(cache.keys(), [key("kept")]);
        assert_eq!(
            cache.get(&key("kept")).unwrap().resource_version(),
            Some("3")
        );
        assert_eq!(cache.lock().ca_crts.len(), 1);
    }
}
