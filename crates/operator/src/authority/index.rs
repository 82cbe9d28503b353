//! What the CertificateAuthority and IssuedCertificate controllers know of the certificates,
//! kept in step with the watches and read by the passes without a request: the
//! IssuedCertificates by the Secret they are kept in and by their issuer
//! ([`CertificateIndex`]), and what each certificate Secret says of the CAs in use
//! ([`LeafUses`]: each Secret version read once, checked against each CA once). Plain structs,
//! fed by watch events, tested without an API server.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use super::Certificate;
use super::secret_cache::CachedSecret;
use super::verified::Verified;
use crate::ownership::Owner;

/// An object of a namespace: (namespace, name).
type Key = (String, String);

/// What the index keeps of a certificate: its Secret, its issuer, its spec's generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Indexed {
    pub secret: Key,
    pub issuer: String,
    pub generation: Option<i64>,
}

/// The IssuedCertificates by the Secret they are kept in and by the CA that issues them.
#[derive(Debug, Default)]
pub(crate) struct CertificateIndex {
    entries: HashMap<Key, Indexed>,
    /// Nearly always one certificate per Secret: a list, not a set (whose first node alone
    /// takes room for eleven).
    by_secret: HashMap<Key, Vec<Key>>,
    by_issuer: HashMap<String, BTreeSet<Key>>,
}

impl CertificateIndex {
    /// Adds or updates the certificate `key` (kept in `entry.secret`, issued by
    /// `entry.issuer`); returns what it had.
    pub(crate) fn insert(&mut self, (key, entry): (Key, Indexed)) -> Option<Indexed> {
        let before = self.remove(&key);
        // `remove` above took it out of any list it was in.
        self.by_secret
            .entry(entry.secret.clone())
            .or_default()
            .push(key.clone());
        self.by_issuer
            .entry(entry.issuer.clone())
            .or_default()
            .insert(key.clone());
        self.entries.insert(key, entry);
        before
    }

    /// Removes a certificate; returns what it had.
    pub(crate) fn remove(&mut self, key: &Key) -> Option<Indexed> {
        let indexed = self.entries.remove(key)?;
        let Indexed { secret, issuer, .. } = &indexed;
        if let Some(keys) = self.by_secret.get_mut(secret) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_secret.remove(secret);
            }
        }
        if let Some(keys) = self.by_issuer.get_mut(issuer) {
            keys.remove(key);
            if keys.is_empty() {
                self.by_issuer.remove(issuer);
            }
        }
        Some(indexed)
    }

    /// The index of `certificates` alone; returns the certificates that are gone.
    pub(crate) fn rebuild(
        &mut self,
        certificates: impl IntoIterator<Item = (Key, Indexed)>,
    ) -> Vec<Key> {
        let before = std::mem::take(self);
        for certificate in certificates {
            self.insert(certificate);
        }
        before
            .entries
            .into_keys()
            .filter(|key| !self.entries.contains_key(key))
            .collect()
    }

    pub(crate) fn of_issuer(&self, issuer: &str) -> Vec<Key> {
        self.by_issuer
            .get(issuer)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// What the index keeps of the certificate `key`.
    pub(crate) fn get(&self, key: &Key) -> Option<&Indexed> {
        self.entries.get(key)
    }

    /// Every certificate indexed.
    pub(crate) fn keys(&self) -> Vec<Key> {
        self.entries.keys().cloned().collect()
    }

    /// Every CA some certificate names.
    pub(crate) fn issuers(&self) -> BTreeSet<String> {
        self.by_issuer.keys().cloned().collect()
    }

    /// The certificates kept in the Secret `secret`, with their issuers.
    pub(crate) fn in_secret(&self, secret: &Key) -> Vec<(Key, String)> {
        self.by_secret
            .get(secret)
            .into_iter()
            .flatten()
            .filter_map(|key| Some((key.clone(), self.entries.get(key)?.issuer.clone())))
            .collect()
    }
}

/// What a certificate Secret tells about the CAs in use, for one version of it and one set of
/// candidate CAs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeafUse {
    /// A readable certificate, signed by the candidate CA at this index, or by none; and the
    /// CAs (fingerprints) its `ca.crt` holds (none when it is missing or unreadable).
    Signed {
        signer: Option<usize>,
        ca_bundle: Arc<BTreeSet<String>>,
    },
    /// No readable certificate (or none caretaker can read from the store).
    Missing,
}

/// What is known of one version of a certificate Secret: whether it holds a readable leaf,
/// and whether each CA checked (by fingerprint) signed it.
#[derive(Debug, Clone)]
struct KnownLeaf {
    version: String,
    readable: bool,
    /// The CAs (fingerprints) its `ca.crt` holds.
    ca_bundle: Arc<BTreeSet<String>>,
    /// Each CA checked (shared, not copied: every certificate of the CA holds the same), and
    /// whether it signed the leaf.
    signed_by: Vec<(Certificate, bool)>,
}

impl KnownLeaf {
    /// Whether `ca` signed it, if that was checked.
    fn checked(&self, ca: &Certificate) -> Option<bool> {
        (self.signed_by.iter())
            .find(|(checked, _)| checked.fingerprint() == ca.fingerprint())
            .map(|(_, signed)| *signed)
    }

    /// Which of `candidates` signed it (the first), when that is known: every candidate up
    /// to the first that signed it (or all, if none did) was checked already.
    fn signer(&self, candidates: &[&Certificate]) -> Option<Option<usize>> {
        for (i, ca) in candidates.iter().enumerate() {
            match self.checked(ca) {
                None => return None,
                Some(true) => return Some(Some(i)),
                Some(false) => {}
            }
        }
        Some(None)
    }
}

/// Sets of strings kept once each, for as long as someone holds them.
#[derive(Default)]
struct SharedSets(Mutex<Vec<Arc<BTreeSet<String>>>>);

impl SharedSets {
    /// `set`, shared with everyone who holds an equal one.
    fn share(&self, set: BTreeSet<String>) -> Arc<BTreeSet<String>> {
        let mut kept = lock(&self.0);
        // Those only this list holds go.
        kept.retain(|kept| Arc::strong_count(kept) > 1);
        if let Some(same) = kept.iter().find(|kept| ***kept == set) {
            return same.clone();
        }
        let set = Arc::new(set);
        kept.push(set.clone());
        set
    }
}

/// The CAs (fingerprints) a `ca.crt` holds; none when it is missing or unreadable.
fn ca_bundle_of(ca_crt: Option<&[u8]>) -> BTreeSet<String> {
    let pem = ca_crt.and_then(|value| std::str::from_utf8(value).ok());
    pem.and_then(|pem| caretaker_pki::bundle::fingerprints(pem).ok())
        .map(BTreeSet::from_iter)
        .unwrap_or_default()
}

/// Locks, carrying on past a panic elsewhere (each map here is a cache, each entry whole).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What each certificate Secret says of the CAs in use, by Secret version and candidates.
#[derive(Default)]
pub(crate) struct LeafUses {
    known: Mutex<HashMap<Key, KnownLeaf>>,
    /// The distinct `ca.crt` contents of `known`: thousands of certificates of one CA hold the
    /// same bundle.
    ca_bundles: SharedSets,
}

impl LeafUses {
    /// Which of `candidates` (the first, in order) signed the certificate of `certificate` in
    /// the Secret `key` (`secret`, as stored). Each Secret version is read once, and checked
    /// against each CA once (what `verified` knows is not checked again): when the candidates
    /// change (a rotation adds a CA, retires one), only the new ones are checked.
    pub(crate) fn of(
        &self,
        certificate: &Owner,
        key: &Key,
        secret: Option<&CachedSecret>,
        candidates: &[&Certificate],
        verified: &Verified,
    ) -> LeafUse {
        let Some(secret) = secret else {
            return LeafUse::Missing;
        };
        if !secret.claim(certificate, key).owned() {
            // Another's Secret, or someone's: it tells nothing of what this certificate's
            // workload serves.
            return LeafUse::Missing;
        }
        let version = secret.resource_version().unwrap_or_default();
        let cached = {
            let known = lock(&self.known);
            let known = known.get(key).filter(|known| known.version == version);
            // Every candidate checked already (the common case): the answer, no copy.
            match known.map(|known| (known, known.signer(candidates))) {
                Some((known, _)) if !known.readable => return LeafUse::Missing,
                Some((known, Some(signer))) => {
                    return LeafUse::Signed {
                        signer,
                        ca_bundle: known.ca_bundle.clone(),
                    };
                }
                Some((known, None)) => Some(known.clone()),
                None => None,
            }
        };
        let mut parsed = None;
        let mut known = match cached {
            Some(known) => known,
            None => {
                let leaf = secret.leaf();
                let known = KnownLeaf {
                    version: version.to_string(),
                    readable: leaf.is_some(),
                    ca_bundle: self.ca_bundles.share(match leaf {
                        Some(_) => ca_bundle_of(secret.ca_crt()),
                        None => BTreeSet::new(),
                    }),
                    signed_by: Vec::new(),
                };
                parsed = Some(leaf);
                known
            }
        };
        if !known.readable {
            lock(&self.known).insert(key.clone(), known);
            return LeafUse::Missing;
        }
        known.signed_by.retain(|(checked, _)| {
            (candidates.iter()).any(|ca| ca.fingerprint() == checked.fingerprint())
        });
        for ca in candidates {
            let signed = match known.checked(ca) {
                Some(signed) => signed,
                None => {
                    let leaf = parsed.get_or_insert_with(|| secret.leaf());
                    let signed =
                        (leaf.as_ref()).is_some_and(|leaf| verified.is_issued_by(leaf, ca));
                    known.signed_by.push(((*ca).clone(), signed));
                    signed
                }
            };
            if signed {
                break;
            }
        }
        let signer = known
            .signer(candidates)
            .expect("checked up to the first signer");
        let ca_bundle = known.ca_bundle.clone();
        lock(&self.known).insert(key.clone(), known);
        LeafUse::Signed { signer, ca_bundle }
    }

    /// The Secret `key` is gone.
    pub(crate) fn forget(&self, key: &Key) {
        lock(&self.known).remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_sets_are_kept_once_while_held() {
        let sets = SharedSets::default();
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect();
        let first = sets.share(set(&["a", "b"]));
        let again = sets.share(set(&["b", "a"]));
        assert!(Arc::ptr_eq(&first, &again));
        let other = sets.share(set(&["a"]));
        assert!(!Arc::ptr_eq(&first, &other));
        drop((first, again));
        let _ = sets.share(set(&["c"]));
        assert_eq!(lock(&sets.0).len(), 2, "the set no one holds is gone");
    }

    /// What a Secret's cached checks tell without checking again: the first candidate that
    /// signed it once every one before it was checked, unknown while one is not.
    #[test]
    fn a_known_leaf_names_its_signer_only_from_checks_made() {
        let ca = |cn| {
            let pem = caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new(cn))
                .unwrap()
                .certificate_pem();
            Certificate::parse_pem(&pem).unwrap().remove(0)
        };
        let (old, new) = (ca("old"), ca("new"));
        let candidates = [&old, &new];
        let known = |checked: &[(&Certificate, bool)]| KnownLeaf {
            version: "1".into(),
            readable: true,
            ca_bundle: Arc::default(),
            signed_by: checked
                .iter()
                .map(|(ca, signed)| ((*ca).clone(), *signed))
                .collect(),
        };
        assert_eq!(known(&[]).signer(&candidates), None);
        assert_eq!(
            known(&[(&new, true)]).signer(&candidates),
            None,
            "old unchecked"
        );
        assert_eq!(known(&[(&old, false)]).signer(&candidates), None);
        assert_eq!(known(&[(&old, true)]).signer(&candidates), Some(Some(0)));
        assert_eq!(
            known(&[(&old, false), (&new, true)]).signer(&candidates),
            Some(Some(1))
        );
        assert_eq!(
            known(&[(&old, false), (&new, false)]).signer(&candidates),
            Some(None)
        );
    }

    /// The certificate `namespace`/`name`, kept in the Secret `secret`, issued by `issuer`.
    fn certificate(namespace: &str, name: &str, secret: &str, issuer: &str) -> (Key, Indexed) {
        let entry = Indexed {
            secret: key(namespace, secret),
            issuer: issuer.into(),
            generation: None,
        };
        (key(namespace, name), entry)
    }

    fn key(namespace: &str, name: &str) -> Key {
        (namespace.into(), name.into())
    }

    #[test]
    fn the_index_follows_secrets_and_issuers_through_changes() {
        let mut index = CertificateIndex::default();
        assert!(
            index
                .insert(certificate("a", "one", "tls", "ca1"))
                .is_none()
        );
        assert!(
            index
                .insert(certificate("a", "two", "tls", "ca1"))
                .is_none()
        );
        assert!(
            index
                .insert(certificate("b", "one", "tls", "ca2"))
                .is_none()
        );
        assert_eq!(
            index.in_secret(&key("a", "tls")),
            [
                (key("a", "one"), "ca1".into()),
                (key("a", "two"), "ca1".into())
            ]
        );
        assert_eq!(index.of_issuer("ca2"), [key("b", "one")]);
        // A new issuer and Secret: the old entries go.
        assert_eq!(
            index.insert(certificate("a", "two", "other", "ca2")),
            Some(Indexed {
                secret: key("a", "tls"),
                issuer: "ca1".into(),
                generation: None
            })
        );
        assert_eq!(
            index.in_secret(&key("a", "tls")),
            [(key("a", "one"), "ca1".into())]
        );
        assert_eq!(index.of_issuer("ca2"), [key("a", "two"), key("b", "one")]);
        assert_eq!(
            index.remove(&key("a", "one")).map(|i| i.issuer),
            Some("ca1".into())
        );
        assert!(index.in_secret(&key("a", "tls")).is_empty());
        assert!(index.of_issuer("ca1").is_empty());
        assert!(
            !index.by_secret.contains_key(&key("a", "tls")),
            "no empty entries"
        );
        index.rebuild([certificate("c", "x", "s", "ca3")]);
        assert_eq!(index.of_issuer("ca3"), [key("c", "x")]);
        assert!(index.of_issuer("ca2").is_empty());
    }

    /// What a certificate Secret says of the CAs in use, read from the stored Secret: the
    /// candidate that signed it (the old CA, as candidates change), none when none did, and
    /// nothing from a Secret that is not the certificate's own or holds no certificate.
    #[test]
    fn a_leaf_use_names_the_candidate_that_signed_it_from_its_own_secret_only() {
        use base64::Engine;
        use base64::engine::general_purpose::STANDARD;
        use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};

        use super::super::secret_cache::SecretCache;

        let make = |cn| CertificateAuthority::create(&CaSpec::new(cn)).unwrap();
        let (old, new) = (make("old"), make("new"));
        let parsed = |pem: &str| Certificate::parse_pem(pem).unwrap().remove(0);
        let (old_ca, new_ca) = (
            parsed(&old.certificate_pem()),
            parsed(&new.certificate_pem()),
        );
        let leaf = old.issue(&LeafSpec::new("web", Usage::Server)).unwrap();
        let secret = |version: &str, mark: &str, crt: &str| -> k8s_openapi::api::core::v1::Secret {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "web-tls", "namespace": "demo", "resourceVersion": version,
                              "annotations": { caretaker_api::names::OWNER: mark } },
                "type": "kubernetes.io/tls",
                "data": { "tls.crt": STANDARD.encode(crt), "tls.key": STANDARD.encode("k"),
                          "ca.crt": STANDARD.encode(old.certificate_pem()) },
            }))
            .unwrap()
        };
        let web = Owner::new("IssuedCertificate", Some("demo"), "web", "u1");
        let at = key("demo", "web-tls");
        let (cache, uses, verified) = (
            SecretCache::default(),
            LeafUses::default(),
            Verified::default(),
        );
        let use_of = |candidates: &[&Certificate]| {
            let stored = cache.get(&at);
            uses.of(&web, &at, stored.as_deref(), candidates, &verified)
        };
        let signed = |signer| LeafUse::Signed {
            signer,
            ca_bundle: Arc::new(BTreeSet::from([old_ca.fingerprint().to_string()])),
        };
        assert_eq!(use_of(&[&old_ca]), LeafUse::Missing, "not stored");

        let own = "IssuedCertificate/demo/web/u1";
        cache.apply(at.clone(), secret("1", own, &leaf.certificate_pem));
        assert_eq!(use_of(&[&old_ca]), signed(Some(0)));
        // A rotation: the new CA first, the old one still a candidate.
        assert_eq!(use_of(&[&new_ca, &old_ca]), signed(Some(1)));
        assert_eq!(use_of(&[&new_ca]), signed(None));

        cache.apply(
            at.clone(),
            secret("2", "IssuedCertificate/demo/web/u0", &leaf.certificate_pem),
        );
        assert_eq!(
            use_of(&[&old_ca]),
            LeafUse::Missing,
            "an earlier object's Secret"
        );
        cache.apply(at.clone(), secret("3", own, "not a certificate"));
        assert_eq!(use_of(&[&old_ca]), LeafUse::Missing, "no certificate");
        uses.forget(&at);
        assert!(lock(&uses.known).is_empty());
    }
}
