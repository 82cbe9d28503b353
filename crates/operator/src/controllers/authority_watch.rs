//! What the CertificateAuthority and IssuedCertificate controllers
//! ([`super::certificate_authority`], [`super::issued_certificate`]) share: one watch per kind
//! they read, each feeding a store, and the mapping of every change to the objects it concerns.
//! Nothing polls: a pass runs when something it reads changes, or at its plan's wake-up time.
//!
//! | watched | kept | a change wakes |
//! |---|---|---|
//! | CustomResourceDefinitions | whether caretaker's two CRDs are installed; CRDs as injection targets | the CertificateAuthority a target names |
//! | Validating/MutatingWebhookConfigurations, APIServices | injection targets (trimmed) | the CertificateAuthority a target names (before and after) |
//! | CertificateAuthorities (once their CRD is installed) | all | the CA itself; on a spec change, every IssuedCertificate naming it |
//! | IssuedCertificates (once their CRD is installed) | all, and an index by Secret and by issuer | the certificate itself; its issuer (before and after) |
//! | Secrets | `kubernetes.io/tls` ones with their data, others without | a CA whose Secret it is (and, when what its certificates are issued from changed, every certificate naming the CA); a certificate kept in it, and its issuer |
//! | ConfigMaps | nothing | a CA whose bundle it is |
//!
//! While neither caretaker.dev CRD is installed only the CRD watch runs (a fleet that uses only
//! the Cluster API features sees nothing else); the log says so once, and the rest starts by
//! itself when a CRD appears.
//!
//! Stores answer only once listed: a CertificateAuthority's pass waits for the Secrets and
//! IssuedCertificates to be listed (a CA missing from an incomplete view of what signed the
//! certificates would be taken for unused), and counts the injection points as not yet
//! holding a new CA until every target kind is listed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::future::Future;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::{ByteString, NamespaceResourceScope};
use kube::api::{
    Api, DynamicObject, ObjectMeta, PartialObjectMeta, Patch, PatchParams, PostParams,
};
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::reflector::store::Writer;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, predicates, watcher};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::sync::{mpsc, watch};

use super::secret_cache::{CachedSecret, LAST_APPLIED, SecretCache};
use super::watch_failures::Failing;
use crate::Error;
use crate::authority::bundle::BundleState;
use crate::authority::ca::{AuthorityObserved, CaSecretState, IssuerView, Untrusting};
use crate::authority::verified::Verified;
use crate::authority::{self, CaKeyPair, Certificate, ObjectName, SECRET_TYPE_TLS, SecretData};
use crate::changes::AnnotationChanges;
use crate::context::{Context, create_for_metadata, send_for_metadata};
use crate::injection::{self, SourceRef, TargetKind};
use crate::metrics::CertificateKind;
use crate::names;
use crate::ownership::{self, Claim, Owner};
use crate::timestamp::format_time;
use crate::v1alpha1::{self, CertificateAuthority, CertificateAuthoritySpec, IssuedCertificate};

/// Whose watches fail, in the log.
const AUTHORITIES: &str = "CertificateAuthority/IssuedCertificate controllers";

/// An object of a namespace: (namespace, name).
pub(crate) type Key = (String, String);

/// The field manager of caretaker's writes, as `managedFields` show it.
const FIELD_MANAGER: &str = "caretaker";

/// How long a certificate pass trusts that a Secret it wrote will show up in the store. Until
/// the watch brings the write, the store still shows the version before it; a pass then
/// would issue again for nothing.
const WRITE_SETTLES: Duration = Duration::from_secs(10);

/// How long a CA waits, after one of its certificates' Secrets changed, before its pass counts
/// the CAs in use again. A pass reads every certificate of the CA, and a rotation changes
/// thousands of Secrets in a burst: the changes within this time take one pass, not one each.
/// (A first change is never put off by later ones: a busy CA still runs this often.)
const CERTIFICATES_SETTLE: Duration = Duration::from_secs(1);

/// Whether each of caretaker's CRDs is installed; `None` until the CRDs are listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Installed {
    pub authorities: Option<bool>,
    pub certificates: Option<bool>,
}

impl Installed {
    fn any(&self) -> bool {
        self.authorities == Some(true) || self.certificates == Some(true)
    }
}

/// The CRD names of CertificateAuthority and IssuedCertificate.
fn crd_names() -> [String; 2] {
    [
        format!("{}.{}", CertificateAuthority::plural(&()), v1alpha1::GROUP),
        format!("{}.{}", IssuedCertificate::plural(&()), v1alpha1::GROUP),
    ]
}

/// Follows whether caretaker's CRDs are installed, from the CRD watch's events.
#[derive(Debug, Default)]
struct Presence {
    /// Which of the two the list in progress has shown.
    listed: [bool; 2],
}

impl Presence {
    fn observe(&mut self, event: &watcher::Event<DynamicObject>, state: Installed) -> Installed {
        let names = crd_names();
        let which = |crd: &DynamicObject| {
            let name = crd.metadata.name.as_deref();
            names.iter().position(|n| Some(n.as_str()) == name)
        };
        let set = |mut state: Installed, i: usize, present: bool| {
            match i {
                0 => state.authorities = Some(present),
                _ => state.certificates = Some(present),
            }
            state
        };
        match event {
            watcher::Event::Init => {
                self.listed = [false; 2];
                state
            }
            watcher::Event::InitApply(crd) => {
                if let Some(i) = which(crd) {
                    self.listed[i] = true;
                }
                state
            }
            watcher::Event::InitDone => Installed {
                authorities: Some(self.listed[0]),
                certificates: Some(self.listed[1]),
            },
            watcher::Event::Apply(crd) => which(crd).map_or(state, |i| set(state, i, true)),
            watcher::Event::Delete(crd) => which(crd).map_or(state, |i| set(state, i, false)),
        }
    }
}

/// Whether each store has been listed.
struct Synced {
    secrets: watch::Sender<bool>,
    /// Also true while the CRD is not installed: there is nothing to list.
    authorities: watch::Sender<bool>,
    certificates: watch::Sender<bool>,
    targets: Vec<watch::Sender<bool>>,
}

async fn wait_synced(flag: &watch::Sender<bool>) -> Result<(), Error> {
    flag.subscribe()
        .wait_for(|synced| *synced)
        .await
        .map(|_| ())
        .map_err(|_| Error::CacheStopped)
}

/// What the index keeps of a certificate: its Secret, its issuer, its spec's generation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Indexed {
    secret: Key,
    issuer: String,
    generation: Option<i64>,
}

/// The IssuedCertificates by the Secret they are kept in and by the CA that issues them.
#[derive(Debug, Default)]
struct CertificateIndex {
    entries: HashMap<Key, Indexed>,
    /// Nearly always one certificate per Secret: a list, not a set (whose first node alone
    /// takes room for eleven).
    by_secret: HashMap<Key, Vec<Key>>,
    by_issuer: HashMap<String, BTreeSet<Key>>,
}

impl CertificateIndex {
    fn key(certificate: &IssuedCertificate) -> Key {
        (
            certificate.namespace().unwrap_or_default(),
            certificate.name_any(),
        )
    }

    /// Adds or updates a certificate; returns what it had.
    fn insert(&mut self, certificate: &IssuedCertificate) -> Option<Indexed> {
        let key = Self::key(certificate);
        let before = self.remove(&key);
        let secret = (key.0.clone(), certificate.spec.secret_name.clone());
        let issuer = certificate.spec.issuer_ref.name.clone();
        // `remove` above took it out of any list it was in.
        self.by_secret
            .entry(secret.clone())
            .or_default()
            .push(key.clone());
        self.by_issuer
            .entry(issuer.clone())
            .or_default()
            .insert(key.clone());
        self.entries.insert(
            key,
            Indexed {
                secret,
                issuer,
                generation: certificate.metadata.generation,
            },
        );
        before
    }

    /// Removes a certificate; returns what it had.
    fn remove(&mut self, key: &Key) -> Option<Indexed> {
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
    fn rebuild(&mut self, certificates: &[Arc<IssuedCertificate>]) -> Vec<Key> {
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

    fn of_issuer(&self, issuer: &str) -> Vec<Key> {
        self.by_issuer
            .get(issuer)
            .map(|keys| keys.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The certificates kept in the Secret `secret`, with their issuers.
    fn in_secret(&self, secret: &Key) -> Vec<(Key, String)> {
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
enum LeafUse {
    /// A readable certificate, signed by the candidate CA at this index, or by none; and the
    /// CAs (fingerprints) its `ca.crt` holds (none when it is missing or unreadable).
    Signed {
        signer: Option<usize>,
        ca_bundle: Arc<BTreeSet<String>>,
    },
    /// No readable certificate (or none caretaker can read from the store).
    Missing,
}

/// caretaker's own kinds (CertificateAuthority, IssuedCertificate), as the watches and the
/// controller runner take them.
pub(crate) trait OwnKind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

impl<K> OwnKind for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
}

/// What a watch of one of caretaker's own kinds tells its handler.
enum Seen<'a, K: Resource<DynamicType = ()> + 'static> {
    /// An event, already applied to the store.
    Event(&'a watcher::Event<K>, &'a Store<K>),
    /// The kind's CRD was removed: the store is empty now.
    CrdRemoved,
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

/// The certificate Secret writes of this process the store does not show yet.
#[derive(Default)]
struct OwnWrites(HashMap<Key, OwnWrite>);

impl OwnWrites {
    fn note(&mut self, key: Key, before: Option<String>, after: String, by: Key, now: Instant) {
        let write = OwnWrite {
            before,
            after,
            by,
            at: now,
            held: false,
        };
        self.0.insert(key, write);
    }

    /// How long a pass that reads the Secret `key` at `stored` waits for the watch to bring
    /// this process's write to it, if it is still the version before that write.
    fn behind(&mut self, key: &Key, stored: Option<&str>, now: Instant) -> Option<Duration> {
        let write = self.0.get_mut(key)?;
        let age = now.saturating_duration_since(write.at);
        if write.before.as_deref() == stored && age < WRITE_SETTLES {
            // The write's event must wake the certificate again.
            write.held = true;
            return Some(WRITE_SETTLES - age);
        }
        self.0.remove(key);
        None
    }

    /// Forgets the write to `key` once the store shows it (at `stored`) or something else;
    /// returns the certificate whose pass made it when `stored` is that write and no pass
    /// waits for it: that pass decided on what it wrote, and needs no other.
    fn shown(&mut self, key: &Key, stored: Option<&str>) -> Option<Key> {
        let write = self.0.get(key)?;
        if write.before.as_deref() == stored {
            return None;
        }
        let own = (Some(write.after.as_str()) == stored && !write.held).then(|| write.by.clone());
        self.0.remove(key);
        own
    }
}

/// A certificate Secret write of this process the store does not show yet.
struct OwnWrite {
    /// The Secret's version before the write (none: created).
    before: Option<String>,
    /// Its version after.
    after: String,
    /// The certificate (namespace, name) whose pass wrote it.
    by: Key,
    at: Instant,
    /// A pass of that certificate waits for the write to show ([`Shared::behind_own_write`]).
    held: bool,
}

/// The inputs of the two controllers: the objects they act on, and wake-ups of those objects
/// from changes of what they read.
pub(crate) struct AuthorityFeed {
    pub objects: mpsc::UnboundedReceiver<CertificateAuthority>,
    pub wake: mpsc::UnboundedReceiver<String>,
}

pub(crate) struct CertificateFeed {
    pub objects: mpsc::UnboundedReceiver<IssuedCertificate>,
    pub wake: mpsc::UnboundedReceiver<Key>,
}

/// The store writers, for [`run`].
pub(crate) struct Writers {
    authorities: Writer<CertificateAuthority>,
    certificates: Writer<IssuedCertificate>,
    targets: Vec<(TargetKind, Writer<DynamicObject>)>,
}

/// Everything the two controllers share.
pub(crate) struct Shared {
    pub ctx: Arc<Context>,
    /// The only namespace Secrets, ConfigMaps and IssuedCertificates are read from, if the
    /// operator watches only one.
    pub scope: Option<String>,
    installed: watch::Sender<Installed>,
    pub authorities: Store<CertificateAuthority>,
    pub certificates: Store<IssuedCertificate>,
    /// The Secrets of CAs and certificates (every Secret in scope, small).
    secrets: SecretCache,
    targets: Vec<(TargetKind, Store<DynamicObject>)>,
    synced: Synced,
    index: Mutex<CertificateIndex>,
    /// Each CA Secret as last read, by version: reading a CA's keys once per version, not
    /// once per certificate.
    ca_secrets: Mutex<HashMap<Key, (String, Arc<CaSecretState>)>>,
    /// What each CA's certificates were last known to be issued from (signer and bundle), so
    /// that a CA Secret write that changes neither wakes none of them.
    issuers_seen: Mutex<HashMap<String, String>>,
    /// The last CA each CertificateAuthority's pass saw signing, with that object's UID: it
    /// keeps signing while its Secret is invalid, for that object only (another of its name,
    /// made while a watch was cut, is another CA).
    last_good: Mutex<HashMap<String, (String, CaKeyPair)>>,
    /// The CAs (fingerprints) each CertificateAuthority's CA Secret held after its last pass,
    /// with that object's UID: the only CAs its bundle ConfigMap, when in another namespace
    /// than the CA Secret, may give back to it
    /// ([`crate::authority::ca::AuthorityObserved::remembered`]).
    remembered_cas: Mutex<HashMap<String, (String, BTreeSet<String>)>>,
    /// What each object's last pass said was wrong with it.
    pub degraded: DegradedMemory,
    /// What each object's last status write said, until the store shows it.
    statuses: StatusMemory,
    /// What each certificate Secret says of the CAs in use, by Secret version and candidates.
    leaf_uses: Mutex<HashMap<Key, KnownLeaf>>,
    /// Signatures and keys known to verify: those of the leaves this process issued, and
    /// those checked.
    pub verified: Verified,
    /// The distinct `ca.crt` contents of [`Shared::leaf_uses`]: thousands of certificates of
    /// one CA hold the same bundle.
    ca_bundles: SharedSets,
    /// Secrets a certificate pass wrote, until the store shows the write.
    written: Mutex<OwnWrites>,
    /// CAs to be woken once their certificates' Secrets settle ([`CERTIFICATES_SETTLE`]).
    settling: Mutex<HashSet<String>>,
    /// Held while a certificate's expiry series is set or removed (see
    /// [`Shared::record_certificate`]).
    series: Mutex<()>,
    wake_authorities: mpsc::UnboundedSender<String>,
    wake_certificates: mpsc::UnboundedSender<Key>,
    authority_objects: mpsc::UnboundedSender<CertificateAuthority>,
    certificate_objects: mpsc::UnboundedSender<IssuedCertificate>,
}

/// Locks, carrying on past a panic elsewhere (every map here is a cache or a memory of
/// writes, each entry whole).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The shared state, the writers [`run`] fills it with, and the controllers' inputs.
pub(crate) fn start(
    ctx: Arc<Context>,
    scope: Option<String>,
) -> (Arc<Shared>, Writers, AuthorityFeed, CertificateFeed) {
    let authorities = Writer::new(());
    let certificates = Writer::new(());
    let targets: Vec<(TargetKind, Writer<DynamicObject>)> = TargetKind::ALL
        .into_iter()
        .map(|kind| (kind, Writer::new(kind.api_resource())))
        .collect();
    let (authority_objects, authority_objects_rx) = mpsc::unbounded_channel();
    let (wake_authorities, wake_authorities_rx) = mpsc::unbounded_channel();
    let (certificate_objects, certificate_objects_rx) = mpsc::unbounded_channel();
    let (wake_certificates, wake_certificates_rx) = mpsc::unbounded_channel();
    let shared = Arc::new(Shared {
        ctx,
        scope,
        installed: watch::Sender::new(Installed::default()),
        authorities: authorities.as_reader(),
        certificates: certificates.as_reader(),
        secrets: SecretCache::default(),
        targets: targets.iter().map(|(k, w)| (*k, w.as_reader())).collect(),
        synced: Synced {
            secrets: watch::Sender::new(false),
            authorities: watch::Sender::new(false),
            certificates: watch::Sender::new(false),
            targets: targets.iter().map(|_| watch::Sender::new(false)).collect(),
        },
        index: Mutex::default(),
        ca_secrets: Mutex::default(),
        issuers_seen: Mutex::default(),
        last_good: Mutex::default(),
        remembered_cas: Mutex::default(),
        degraded: DegradedMemory::default(),
        statuses: StatusMemory::default(),
        leaf_uses: Mutex::default(),
        verified: Verified::default(),
        ca_bundles: SharedSets::default(),
        written: Mutex::default(),
        settling: Mutex::default(),
        series: Mutex::default(),
        wake_authorities,
        wake_certificates,
        authority_objects,
        certificate_objects,
    });
    let writers = Writers {
        authorities,
        certificates,
        targets,
    };
    (
        shared,
        writers,
        AuthorityFeed {
            objects: authority_objects_rx,
            wake: wake_authorities_rx,
        },
        CertificateFeed {
            objects: certificate_objects_rx,
            wake: wake_certificates_rx,
        },
    )
}

/// Runs every watch until the streams end: the CRD watch at once, the others once one of
/// caretaker's CRDs is installed.
pub(crate) async fn run(shared: Arc<Shared>, writers: Writers) {
    let Writers {
        authorities,
        certificates,
        mut targets,
    } = writers;
    let crd_at = targets
        .iter()
        .position(|(kind, _)| *kind == TargetKind::CustomResourceDefinition)
        .expect("CRDs are a target kind");
    let (_, crds) = targets.remove(crd_at);
    let rest = async {
        let mut installed = shared.installed.subscribe();
        if installed.wait_for(Installed::any).await.is_err() {
            return;
        }
        let client = shared.ctx.client.clone();
        let (secret_api, config_map_api): (Api<Secret>, Api<ConfigMap>) = match &shared.scope {
            Some(ns) => (
                Api::namespaced(client.clone(), ns),
                Api::namespaced(client.clone(), ns),
            ),
            None => (Api::all(client.clone()), Api::all(client.clone())),
        };
        let certificate_api: Api<IssuedCertificate> = match &shared.scope {
            Some(ns) => Api::namespaced(client.clone(), ns),
            None => Api::all(client.clone()),
        };
        futures::join!(
            shared.watch_secrets(secret_api),
            shared.watch_config_maps(config_map_api),
            futures::future::join_all(
                targets
                    .into_iter()
                    .map(|(kind, writer)| shared.watch_targets(kind, writer))
            ),
            shared.watch_authorities(Api::all(client), authorities),
            shared.watch_certificates(certificate_api, certificates),
        );
    };
    futures::join!(
        shared.watch_targets(TargetKind::CustomResourceDefinition, crds),
        shared.say_presence(),
        rest,
    );
}

impl Shared {
    /// Says once, and again whenever it changes, whether each controller has its CRD.
    async fn say_presence(&self) {
        let mut installed = self.installed.subscribe();
        let mut said = Installed::default();
        loop {
            let now = *installed.borrow_and_update();
            let [ca_crd, certificate_crd] = crd_names();
            for (was, is, kind, crd) in [
                (
                    said.authorities,
                    now.authorities,
                    "CertificateAuthority",
                    ca_crd,
                ),
                (
                    said.certificates,
                    now.certificates,
                    "IssuedCertificate",
                    certificate_crd,
                ),
            ] {
                match (was, is) {
                    (Some(true), Some(true)) | (Some(false), Some(false)) | (_, None) => {}
                    (_, Some(true)) => {
                        tracing::info!(kind, %crd, "CRD {crd} found: the {kind} controller runs")
                    }
                    (_, Some(false)) => {
                        tracing::info!(kind, %crd, "CRD {crd} absent: the {kind} controller stays idle until it appears")
                    }
                }
            }
            said = now;
            if installed.changed().await.is_err() {
                return;
            }
        }
    }
}

fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = &mut meta.annotations {
        annotations.remove(LAST_APPLIED);
    }
}

/// The Degraded message (or none) each object's last pass in this process gave its status,
/// with the object's uid. The next pass may read a status from before that write: it must not
/// say the same Warning again.
#[derive(Default)]
pub(crate) struct DegradedMemory(Mutex<HashMap<String, (String, Option<String>)>>);

impl DegradedMemory {
    /// What was last said to be wrong with `object` (the Degraded message a Warning told): what
    /// its last pass in this process decided, else `read`, the message in the status it was
    /// read with. Each kind finds its Degraded message in its own conditions, so callers pass
    /// messages.
    pub(crate) fn reported<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        read: Option<&str>,
    ) -> Option<String> {
        let meta = object.meta();
        match lock(&self.0).get(&Self::key(object)) {
            Some((uid, message)) if meta.uid.as_ref() == Some(uid) => message.clone(),
            _ => read.map(str::to_string),
        }
    }

    /// Remembers the Degraded message a pass gives `object`'s status (`now`), which its
    /// Warnings said; `read`: the message in the status it was read with.
    pub(crate) fn remember<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        read: Option<&str>,
        now: Option<&str>,
    ) {
        let mut memory = lock(&self.0);
        let key = Self::key(object);
        // Nothing wrong, before or now: a pass that reads the status before this write reads
        // that too, so there is nothing to remember (thousands of healthy objects).
        if now.is_none() && read.is_none() && !memory.contains_key(&key) {
            return;
        }
        let uid = object.meta().uid.clone().unwrap_or_default();
        memory.insert(key, (uid, now.map(str::to_string)));
    }

    pub(crate) fn forget<K: Resource<DynamicType = ()>>(&self, namespace: &str, name: &str) {
        lock(&self.0).remove(&format!("{}/{namespace}/{name}", K::kind(&())));
    }

    fn key<K: Resource<DynamicType = ()>>(object: &K) -> String {
        let namespace = object.meta().namespace.as_deref().unwrap_or("");
        format!("{}/{namespace}/{}", K::kind(&()), object.name_any())
    }
}

/// The status each object's last write in this process gave it, with the object's
/// `resourceVersion` before that write, until a pass reads the object as it is after. A pass
/// that starts before the watch brings the write compares with the status before it, and
/// would write the same status again. An entry stays until then (the watch bringing the write
/// is not enough: a pass may have read the object just before), so entries are digests, a few
/// bytes for each of thousands of certificates: (object, version before) -> status.
#[derive(Default)]
pub(crate) struct StatusMemory(Mutex<HashMap<u64, (u64, u64)>>);

impl StatusMemory {
    /// Whether `patch` (a status patch of `object`, as read; [`Self::patch_digest`]) is what
    /// this process wrote last, on the version `object` still is.
    fn written<K: Resource<DynamicType = ()>>(&self, object: &K, patch: u64) -> bool {
        let key = Self::digest(DegradedMemory::key(object));
        let version = Self::digest(&object.meta().resource_version);
        let mut written = lock(&self.0);
        match written.get(&key) {
            Some((before, digest)) if *before == version => *digest == patch,
            Some(_) => {
                // The store shows the write (or something later): the status read is current.
                written.remove(&key);
                false
            }
            None => false,
        }
    }

    fn remember<K: Resource<DynamicType = ()>>(&self, object: &K, patch: u64) {
        let key = Self::digest(DegradedMemory::key(object));
        let before = Self::digest(&object.meta().resource_version);
        lock(&self.0).insert(key, (before, patch));
    }

    /// A status patch's digest. On one version of an object (one status read), two patches
    /// are equal exactly when the statuses they write are.
    fn patch_digest(patch: &Value) -> u64 {
        Self::digest(patch.to_string())
    }

    fn digest(value: impl std::hash::Hash) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        // Fixed keys: the same value gives the same digest for the life of the process.
        BuildHasherDefault::<DefaultHasher>::default().hash_one(value)
    }
}

/// The key of a namespaced object.
fn key_of(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The CA Secret a CertificateAuthority names.
pub(crate) fn ca_secret_key(spec: &CertificateAuthoritySpec) -> Key {
    (spec.secret.namespace.clone(), spec.secret.name.clone())
}

/// The bundle ConfigMap a CertificateAuthority names.
pub(crate) fn bundle_key(spec: &CertificateAuthoritySpec) -> Key {
    (spec.bundle.namespace.clone(), spec.bundle.name.clone())
}

/// The CertificateAuthority an injection target asks for, if it asks for one.
fn authority_named(kind: TargetKind, target: &DynamicObject) -> Option<String> {
    match injection::request(kind, target) {
        Ok(Some(SourceRef::Authority { name })) if target.metadata.deletion_timestamp.is_none() => {
            Some(name)
        }
        _ => None,
    }
}

/// Whether `owner` may write the `kind` at `key`, `meta` when it exists
/// ([`ownership::claim_by`]).
pub(crate) fn claim(owner: &Owner, kind: &str, key: &Key, meta: Option<&ObjectMeta>) -> Claim {
    let Some(meta) = meta else {
        return Claim::Create;
    };
    let annotations = meta.annotations.as_ref();
    ownership::claim_by(
        owner,
        kind,
        &format!("{}/{}", key.0, key.1),
        controller(meta),
        |name| annotations?.get(name).map(String::as_str),
    )
}

/// The kind and name of an object's controller owner reference.
pub(crate) fn controller(meta: &ObjectMeta) -> Option<(&str, &str)> {
    let references = meta.owner_references.as_deref()?;
    let controller = references.iter().find(|r| r.controller == Some(true))?;
    Some((controller.kind.as_str(), controller.name.as_str()))
}

/// Why an object may not write its Secrets and ConfigMaps, from their `claims`: the reason
/// of the first refused (another's before someone's), and every refusal's message.
pub(crate) fn refusal(claims: &[Claim]) -> Option<(&'static str, String)> {
    let refused: Vec<(&'static str, &str)> = (claims.iter())
        .filter_map(|claim| match claim {
            Claim::Refused { reason, message } => Some((*reason, message.as_str())),
            _ => None,
        })
        .collect();
    let reason = (refused.iter())
        .map(|(reason, _)| *reason)
        .find(|reason| *reason == names::REASON_OBJECT_IN_USE)
        .or(refused.first().map(|(reason, _)| *reason))?;
    let messages: Vec<&str> = refused.iter().map(|(_, message)| *message).collect();
    Some((reason, messages.join("; ")))
}

/// Why the existing `kind` at `key` (`meta`) is not known to hold what `owner` wrote (its
/// content is then not `owner`'s to use: a CA to sign with, a bundle); `None` when it is.
pub(crate) fn not_owned(owner: &Owner, kind: &str, key: &Key, meta: &ObjectMeta) -> Option<String> {
    match claim(owner, kind, key, Some(meta)) {
        Claim::Own => None,
        Claim::Refused { message, .. } => Some(message),
        Claim::Create | Claim::Adopt => Some(format!(
            "{kind} {}/{} is not yet {owner}'s (it is handed over at its next write)",
            key.0, key.1
        )),
    }
}

/// The object a Secret or ConfigMap is written for, as its mark names it.
pub(crate) fn owner_of<K: Resource<DynamicType = ()>>(object: &K) -> Owner {
    let meta = object.meta();
    Owner::new(
        K::kind(&()),
        meta.namespace.as_deref(),
        meta.name.clone().unwrap_or_default(),
        meta.uid.clone().unwrap_or_default(),
    )
}

/// Whether an IssuedCertificate's status says Ready.
fn ready(certificate: &IssuedCertificate) -> bool {
    certificate.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == v1alpha1::CONDITION_READY && c.status == "True")
    })
}

/// A Secret's `data` and annotations, as the decisions read them.
pub(crate) fn secret_content(
    secret: &Secret,
) -> (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>) {
    (
        secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
        secret.metadata.annotations.clone().unwrap_or_default(),
    )
}

/// A ConfigMap's `data` and annotations, as the decisions read them.
pub(crate) fn config_map_content(
    config_map: &ConfigMap,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    (
        config_map.data.clone().unwrap_or_default(),
        config_map.metadata.annotations.clone().unwrap_or_default(),
    )
}

/// What certificates are issued from, in short: the signer and the bundle.
fn issuer_digest(state: &CaSecretState, now: OffsetDateTime) -> String {
    match state {
        CaSecretState::Absent => "absent".into(),
        CaSecretState::Invalid { .. } => "invalid".into(),
        CaSecretState::Valid(secret) => {
            let view = IssuerView::of(secret, now);
            format!(
                "{}|{}",
                view.signer.as_ref().map_or("-", |s| s.fingerprint()),
                view.bundle
                    .map(|b| b.fingerprints().join(","))
                    .unwrap_or_default()
            )
        }
    }
}

/// The outcome of a write.
pub(crate) enum Written {
    /// Written; the object's new `resourceVersion`.
    Done(String),
    /// Refused because the object changed (or appeared, or went) since it was read: its watch
    /// event brings a new pass.
    Conflict,
}

fn outcome<K: Resource>(
    result: Result<K, kube::Error>,
    gone_is_conflict: bool,
) -> Result<Written, Error> {
    match result {
        Ok(object) => Ok(Written::Done(
            object.meta().resource_version.clone().unwrap_or_default(),
        )),
        Err(kube::Error::Api(e)) if e.code == 409 || (gone_is_conflict && e.code == 404) => {
            Ok(Written::Conflict)
        }
        Err(e) => Err(e.into()),
    }
}

impl Shared {
    fn wake_authority(&self, name: &str) {
        let _ = self.wake_authorities.send(name.to_string());
    }

    /// Wakes the CA `name` [`CERTIFICATES_SETTLE`] from now, unless a wake-up is due already.
    fn wake_authority_settled(self: &Arc<Self>, name: &str) {
        if !lock(&self.settling).insert(name.to_string()) {
            return;
        }
        let (shared, name) = (self.clone(), name.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(CERTIFICATES_SETTLE).await;
            // Out of the set first: a change from now on takes the next wake-up.
            lock(&shared.settling).remove(&name);
            shared.wake_authority(&name);
        });
    }

    fn wake_certificates_of(&self, authority: &str) {
        let keys = lock(&self.index).of_issuer(authority);
        for key in keys {
            let _ = self.wake_certificates.send(key);
        }
    }

    fn wake_every_authority(&self) {
        for authority in self.authorities.state() {
            self.wake_authority(&authority.name_any());
        }
    }

    fn wake_every_certificate(&self) {
        let keys: Vec<Key> = lock(&self.index).entries.keys().cloned().collect();
        for key in keys {
            let _ = self.wake_certificates.send(key);
        }
    }

    async fn watch_targets(&self, kind: TargetKind, mut writer: Writer<DynamicObject>) {
        let api: Api<DynamicObject> = Api::all_with(self.ctx.client.clone(), &kind.api_resource());
        let mut presence = (kind == TargetKind::CustomResourceDefinition).then(Presence::default);
        // Which CA each target names, to wake the one it named before too.
        let mut named: HashMap<String, String> = HashMap::new();
        let synced = TargetKind::ALL
            .iter()
            .position(|k| *k == kind)
            .expect("every kind");
        let events = Failing::new(AUTHORITIES, kind.kind()).events(
            watcher(api, watcher::Config::default())
                .modify(crate::injection::trim(kind))
                .default_backoff(),
        );
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            if let Some(presence) = &mut presence {
                let now = presence.observe(&event, *self.installed.borrow());
                self.installed.send_if_modified(|state| {
                    let changed = *state != now;
                    *state = now;
                    changed
                });
            }
            writer.apply_watcher_event(&event);
            match &event {
                watcher::Event::Apply(target) | watcher::Event::Delete(target) => {
                    let name = target.name_any();
                    let now = match event {
                        watcher::Event::Apply(_) => authority_named(kind, target),
                        _ => None,
                    };
                    let before = match &now {
                        Some(ca) => named.insert(name, ca.clone()),
                        None => named.remove(&name),
                    };
                    for ca in now
                        .iter()
                        .chain(before.iter().filter(|b| Some(*b) != now.as_ref()))
                    {
                        self.wake_authority(ca);
                    }
                }
                watcher::Event::InitDone => {
                    named = writer
                        .as_reader()
                        .state()
                        .iter()
                        .filter_map(|t| Some((t.name_any(), authority_named(kind, t)?)))
                        .collect();
                    self.synced.targets[synced].send_replace(true);
                    // Until every kind was listed, a pass took the injection points for not
                    // holding a new CA; after a relist, what changed meanwhile is unknown.
                    self.wake_every_authority();
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            }
        }
    }

    async fn watch_secrets(self: &Arc<Self>, api: Api<Secret>) {
        let mut listed_before = false;
        let events = Failing::new(AUTHORITIES, "Secret")
            .events(watcher(api, watcher::Config::default()).default_backoff());
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                watcher::Event::Apply(secret) => {
                    let key = key_of(&secret.metadata);
                    self.secrets.apply(key.clone(), secret);
                    self.secret_changed(key);
                }
                watcher::Event::Delete(secret) => {
                    let key = key_of(&secret.metadata);
                    self.secrets.delete(&key);
                    self.secret_changed(key);
                }
                watcher::Event::Init => self.secrets.relist_started(),
                watcher::Event::InitApply(secret) => {
                    self.secrets.relisted(key_of(&secret.metadata), secret)
                }
                watcher::Event::InitDone => {
                    // Secrets gone while the watch was down went with the relist.
                    self.secrets.relist_done();
                    self.synced.secrets.send_replace(true);
                    if listed_before {
                        self.wake_every_authority();
                        self.wake_every_certificate();
                    }
                    listed_before = true;
                }
            }
        }
    }

    /// Wakes what a Secret concerns: the CAs whose Secret it is (and, if what their
    /// certificates are issued from changed, those certificates), and the certificates kept
    /// in it with their issuers.
    fn secret_changed(self: &Arc<Self>, key: Key) {
        let stored = self.stored_secret(&key);
        // A write of this process the store now shows: no pass needs to wait for it, and the
        // pass that made it needs no other.
        let version = stored.as_ref().and_then(|s| s.resource_version());
        let own = lock(&self.written).shown(&key, version);
        if stored.is_none() {
            lock(&self.leaf_uses).remove(&key);
            lock(&self.ca_secrets).remove(&key);
        }
        let now = OffsetDateTime::now_utc();
        for authority in self.authorities.state() {
            if ca_secret_key(&authority.spec) != key {
                continue;
            }
            let name = authority.name_any();
            self.wake_authority(&name);
            let secret = stored.as_ref().map(|s| s.secret(&key));
            let state = self.ca_secret_state(&owner_of(&*authority), &key, secret.as_ref());
            let digest = issuer_digest(&state, now);
            let before = lock(&self.issuers_seen).insert(name.clone(), digest.clone());
            if before.as_ref() != Some(&digest) {
                self.wake_certificates_of(&name);
            }
        }
        let certificates = lock(&self.index).in_secret(&key);
        let mut issuers = BTreeSet::new();
        for (certificate, issuer) in certificates {
            if own.as_ref() != Some(&certificate) {
                let _ = self.wake_certificates.send(certificate);
            }
            issuers.insert(issuer);
        }
        for issuer in issuers {
            self.wake_authority_settled(&issuer);
        }
    }

    async fn watch_config_maps(&self, api: Api<ConfigMap>) {
        let mut listed_before = false;
        let events = Failing::new(AUTHORITIES, "ConfigMap")
            .events(watcher(api, watcher::Config::default()).default_backoff());
        futures::pin_mut!(events);
        while let Some(event) = events.next().await {
            match event {
                watcher::Event::Apply(config_map) | watcher::Event::Delete(config_map) => {
                    let key = key_of(&config_map.metadata);
                    for authority in self.authorities.state() {
                        if bundle_key(&authority.spec) == key {
                            self.wake_authority(&authority.name_any());
                        }
                    }
                }
                watcher::Event::InitDone => {
                    if listed_before {
                        self.wake_every_authority();
                    }
                    listed_before = true;
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => {}
            }
        }
    }

    /// Keeps the CertificateAuthority store while its CRD is installed, and passes each CA on
    /// to its controller; a spec change wakes the certificates naming it.
    async fn watch_authorities(
        &self,
        api: Api<CertificateAuthority>,
        writer: Writer<CertificateAuthority>,
    ) {
        let mut known: HashMap<String, (Option<i64>, Key)> = HashMap::new();
        let seen = |seen: Seen<'_, CertificateAuthority>| match seen {
            Seen::Event(event, store) => self.authority_event(event, store, &mut known),
            // The CRD is gone, and every CA with it.
            Seen::CrdRemoved => {
                for (name, (_, secret)) in std::mem::take(&mut known) {
                    self.forget_authority(&name, &secret);
                }
            }
        };
        let installed = |i: &Installed| i.authorities;
        self.watch_own_kind(api, writer, installed, &self.synced.authorities, seen)
            .await;
    }

    /// Keeps the store of one of caretaker's own kinds while its CRD is installed (as
    /// `installed_now` reads [`Installed`]), telling `seen` of each event and of the CRD's
    /// removal. `synced` says whether the store is complete: at once when the CRD is absent
    /// (there is nothing to list), after the list when it is present.
    async fn watch_own_kind<K>(
        &self,
        api: Api<K>,
        mut writer: Writer<K>,
        installed_now: fn(&Installed) -> Option<bool>,
        synced: &watch::Sender<bool>,
        mut seen: impl FnMut(Seen<'_, K>),
    ) where
        K: OwnKind,
    {
        let mut installed = self.installed.subscribe();
        loop {
            let present = match installed.wait_for(|i| installed_now(i).is_some()).await {
                Ok(state) => installed_now(&state) == Some(true),
                Err(_) => return,
            };
            if !present {
                synced.send_replace(true);
                if installed
                    .wait_for(|i| installed_now(i) == Some(true))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            synced.send_replace(false);
            let events = Failing::new(AUTHORITIES, K::kind(&())).events(
                watcher(api.clone(), watcher::Config::default())
                    .modify(|object: &mut K| trim_meta(object.meta_mut()))
                    .default_backoff(),
            );
            futures::pin_mut!(events);
            loop {
                tokio::select! {
                    event = events.next() => match event {
                        Some(event) => {
                            writer.apply_watcher_event(&event);
                            seen(Seen::Event(&event, &writer.as_reader()));
                        }
                        None => return,
                    },
                    removed = async { installed.wait_for(|i| installed_now(i) != Some(true)).await.map(|_| ()) } => {
                        if removed.is_err() {
                            return;
                        }
                        writer.apply_watcher_event(&watcher::Event::Init);
                        writer.apply_watcher_event(&watcher::Event::InitDone);
                        seen(Seen::CrdRemoved);
                        break;
                    }
                }
            }
        }
    }

    fn authority_event(
        &self,
        event: &watcher::Event<CertificateAuthority>,
        store: &Store<CertificateAuthority>,
        known: &mut HashMap<String, (Option<i64>, Key)>,
    ) {
        match event {
            watcher::Event::Apply(authority) => {
                let _ = self.authority_objects.send(authority.clone());
                self.authority_seen(authority, known);
            }
            watcher::Event::Delete(authority) => {
                let name = authority.name_any();
                if let Some((_, secret)) = known.remove(&name) {
                    self.forget_authority(&name, &secret);
                }
            }
            watcher::Event::InitDone => {
                self.synced.authorities.send_replace(true);
                let listed = store.state();
                let names: BTreeSet<String> = listed.iter().map(|a| a.name_any()).collect();
                let gone: Vec<String> = known
                    .keys()
                    .filter(|name| !names.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    if let Some((_, secret)) = known.remove(&name) {
                        self.forget_authority(&name, &secret);
                    }
                }
                for authority in listed {
                    let _ = self.authority_objects.send((*authority).clone());
                    self.authority_seen(&authority, known);
                }
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }

    /// A CA as listed or changed: when its spec is new, its certificates plan again, and so
    /// does whatever may share its objects (the other CAs; certificates kept in its Secret,
    /// before and after).
    fn authority_seen(
        &self,
        authority: &CertificateAuthority,
        known: &mut HashMap<String, (Option<i64>, Key)>,
    ) {
        let name = authority.name_any();
        let now = (
            authority.metadata.generation,
            ca_secret_key(&authority.spec),
        );
        let before = known.insert(name.clone(), now.clone());
        if before.as_ref() == Some(&now) {
            return;
        }
        self.wake_certificates_of(&name);
        self.wake_sharing(&name, before.iter().map(|(_, s)| s).chain([&now.1]));
    }

    /// Wakes the CAs other than `name`, and the certificates kept in `secrets`.
    fn wake_sharing<'a>(&self, name: &str, secrets: impl IntoIterator<Item = &'a Key>) {
        for other in self.authorities.state() {
            if other.name_any() != name {
                self.wake_authority(&other.name_any());
            }
        }
        for secret in secrets {
            let sharing = lock(&self.index).in_secret(secret);
            for (certificate, _) in sharing {
                let _ = self.wake_certificates.send(certificate);
            }
        }
    }

    /// A CA that is gone: what this process remembers of it goes, its certificates say their
    /// issuer is missing, and what shared its objects may go on.
    fn forget_authority(&self, name: &str, secret: &Key) {
        {
            let _series = lock(&self.series);
            (self.ctx.metrics).remove_certificate_expiry(
                CertificateKind::CertificateAuthority,
                "",
                name,
            );
        }
        lock(&self.last_good).remove(name);
        lock(&self.remembered_cas).remove(name);
        lock(&self.issuers_seen).remove(name);
        self.degraded.forget::<CertificateAuthority>("", name);
        self.wake_certificates_of(name);
        self.wake_sharing(name, [secret]);
    }

    /// Keeps the IssuedCertificate store and index while its CRD is installed, and passes
    /// each certificate on to its controller; a change wakes its issuer (before and after).
    async fn watch_certificates(
        &self,
        api: Api<IssuedCertificate>,
        writer: Writer<IssuedCertificate>,
    ) {
        let seen = |seen: Seen<'_, IssuedCertificate>| match seen {
            Seen::Event(event, store) => self.certificate_event(event, store),
            Seen::CrdRemoved => {
                let issuers: BTreeSet<String> =
                    lock(&self.index).by_issuer.keys().cloned().collect();
                let gone = lock(&self.index).rebuild(&[]);
                self.forget_certificates(gone);
                for issuer in issuers {
                    self.wake_authority(&issuer);
                }
            }
        };
        let installed = |i: &Installed| i.certificates;
        self.watch_own_kind(api, writer, installed, &self.synced.certificates, seen)
            .await;
    }

    /// A certificate came, went or changed its spec: its issuers (before and after) count
    /// their certificates again, and the other certificates kept in its Secrets (before and
    /// after) see whether they still share it.
    fn certificate_moved(&self, key: &Key, entries: impl IntoIterator<Item = Indexed>) {
        let mut issuers = BTreeSet::new();
        for entry in entries {
            issuers.insert(entry.issuer);
            let sharing = lock(&self.index).in_secret(&entry.secret);
            for (other, _) in sharing.into_iter().filter(|(other, _)| other != key) {
                let _ = self.wake_certificates.send(other);
            }
        }
        for issuer in issuers {
            self.wake_authority(&issuer);
        }
    }

    /// Certificates that are gone leave the expiry gauge and this process's memory.
    fn forget_certificates(&self, keys: impl IntoIterator<Item = Key>) {
        let _series = lock(&self.series);
        for (namespace, name) in keys {
            self.degraded.forget::<IssuedCertificate>(&namespace, &name);
            (self.ctx.metrics).remove_certificate_expiry(
                CertificateKind::IssuedCertificate,
                &namespace,
                &name,
            );
        }
    }

    fn certificate_event(
        &self,
        event: &watcher::Event<IssuedCertificate>,
        store: &Store<IssuedCertificate>,
    ) {
        match event {
            watcher::Event::Apply(certificate) => {
                let key = CertificateIndex::key(certificate);
                let (before, now) = {
                    let mut index = lock(&self.index);
                    let before = index.insert(certificate);
                    (before, index.entries.get(&key).cloned())
                };
                // A status write changes nothing the CA reads, nor any other certificate, and
                // its controller acts on a generation only once: it is not passed on (thousands
                // of copies would wait in the feed while a rotation writes their statuses).
                if before != now {
                    let _ = self.certificate_objects.send(certificate.clone());
                    self.certificate_moved(&key, before.into_iter().chain(now));
                }
            }
            watcher::Event::Delete(certificate) => {
                let key = CertificateIndex::key(certificate);
                self.forget_certificates([key.clone()]);
                let before = lock(&self.index).remove(&key);
                self.certificate_moved(&key, before);
            }
            watcher::Event::InitDone => {
                let listed = store.state();
                let issuers: BTreeSet<String> = {
                    let mut index = lock(&self.index);
                    let mut issuers: BTreeSet<String> = index.by_issuer.keys().cloned().collect();
                    let gone = index.rebuild(&listed);
                    issuers.extend(index.by_issuer.keys().cloned());
                    drop(index);
                    self.forget_certificates(gone);
                    issuers
                };
                self.synced.certificates.send_replace(true);
                for certificate in listed {
                    let _ = self.certificate_objects.send((*certificate).clone());
                }
                for issuer in issuers {
                    self.wake_authority(&issuer);
                }
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

impl Shared {
    /// Runs one of the two controllers until its feed ends: on `objects` when their generation
    /// changed (status writes, its own, wake nothing) and on `wake`, at most `concurrency`
    /// passes at once (0: no limit). A failed pass shows in the object's status and events,
    /// and is counted under `controller`.
    pub(crate) async fn run_controller<K, Fut>(
        self: &Arc<Self>,
        controller: &'static str,
        objects: mpsc::UnboundedReceiver<K>,
        store: Store<K>,
        wake: impl Stream<Item = ObjectRef<K>> + Send + 'static,
        concurrency: u16,
        reconcile: impl FnMut(Arc<K>, Arc<Shared>) -> Fut,
    ) where
        K: OwnKind,
        Fut: Future<Output = Result<Action, Error>> + Send + 'static,
    {
        let objects = futures::stream::unfold(objects, |mut objects| async move {
            let object = objects.recv().await?;
            Some((Ok::<_, watcher::Error>(object), objects))
        })
        .predicate_filter(predicates::generation, Default::default());
        let error_policy = move |_: Arc<K>, error: &Error, shared: Arc<Shared>| {
            super::requeue_after(controller, error, &shared.ctx)
        };
        let mut reconcile = reconcile;
        let timed = move |object: Arc<K>, shared: Arc<Shared>| {
            let timer = shared.ctx.reconcile_started(controller);
            let pass = reconcile(object, shared);
            async move {
                let _timer = timer;
                pass.await
            }
        };
        Controller::for_stream_with(objects, store, ())
            .reconcile_on(wake)
            .with_config(Config::default().concurrency(concurrency))
            .graceful_shutdown_on(self.ctx.shutdown.signal())
            .run(timed, error_policy, self.clone())
            .for_each(|result| async move {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "{} reconcile failed", K::kind(&()));
                }
            })
            .await;
    }
}

/// What the passes read and write.
impl Shared {
    /// Records in the metrics what a pass left in place: when the certificate of `kind`
    /// `namespace`/`name` expires (its series goes when it has none), and whether the pass
    /// replaced a certificate (`rotated`).
    pub(crate) fn record_certificate(
        &self,
        kind: CertificateKind,
        (namespace, name): (&str, &str),
        rotated: bool,
        now: &authority::CertificateStatus,
    ) {
        let metrics = &self.ctx.metrics;
        {
            // A pass that ends after its object was deleted must not bring its series back:
            // the watch removes it, under this lock, once the store no longer holds it.
            let _series = lock(&self.series);
            let exists = match kind {
                CertificateKind::CertificateAuthority => {
                    self.authorities.get(&ObjectRef::new(name)).is_some()
                }
                _ => (self.certificates)
                    .get(&ObjectRef::new(name).within(namespace))
                    .is_some(),
            };
            match now.not_after {
                Some(not_after) if exists => {
                    metrics.set_certificate_expiry(kind, namespace, name, not_after)
                }
                _ => metrics.remove_certificate_expiry(kind, namespace, name),
            }
        }
        if rotated {
            metrics.rotated(kind);
        }
    }

    /// Waits until a CertificateAuthority's pass can see every certificate it issued: the
    /// Secrets and the IssuedCertificates are listed.
    pub(crate) async fn authority_inputs_synced(&self) -> Result<(), Error> {
        wait_synced(&self.synced.secrets).await?;
        wait_synced(&self.synced.certificates).await
    }

    /// Waits until an IssuedCertificate's pass can find its issuer and its Secret.
    pub(crate) async fn certificate_inputs_synced(&self) -> Result<(), Error> {
        wait_synced(&self.synced.secrets).await?;
        wait_synced(&self.synced.authorities).await
    }

    /// Whether the CertificateAuthority CRD is known not to be installed.
    pub(crate) fn authority_crd_missing(&self) -> bool {
        self.installed.borrow().authorities == Some(false)
    }

    fn stored_secret(&self, key: &Key) -> Option<Arc<CachedSecret>> {
        self.secrets.get(key)
    }

    /// A Secret as cached; or read fresh when the cache keeps it without its data (not
    /// `kubernetes.io/tls`).
    pub(crate) async fn secret(&self, key: &Key) -> Result<Option<Arc<Secret>>, Error> {
        match self.stored_secret(key) {
            None => Ok(None),
            Some(cached) if cached.has_data() => Ok(Some(Arc::new(cached.secret(key)))),
            Some(_) => {
                let api: Api<Secret> = Api::namespaced(self.ctx.client.clone(), &key.0);
                Ok(api.get_opt(&key.1).await?.map(Arc::new))
            }
        }
    }

    /// The CA Secret of `authority` as observed, read once per version.
    fn ca_secret_state(
        &self,
        authority: &Owner,
        key: &Key,
        secret: Option<&Secret>,
    ) -> Arc<CaSecretState> {
        let Some(secret) = secret else {
            return Arc::new(CaSecretState::Absent);
        };
        if let Some(reason) = not_owned(authority, "Secret", key, &secret.metadata) {
            // Not this CA's Secret: nothing signs from it.
            return Arc::new(CaSecretState::Invalid { reason });
        }
        let version = secret.resource_version().unwrap_or_default();
        if let Some((seen, state)) = lock(&self.ca_secrets).get(key)
            && *seen == version
        {
            return state.clone();
        }
        let (data, annotations) = secret_content(secret);
        let state = Arc::new(CaSecretState::observe(Some((&data, &annotations))));
        lock(&self.ca_secrets).insert(key.clone(), (version, state.clone()));
        state
    }

    /// The CA Secret `key` as observed, when the cache holds it (`authority`'s) at a version
    /// read already: every certificate pass asks, and needs no copy of the Secret for it.
    fn known_ca_secret_state(&self, authority: &Owner, key: &Key) -> Option<Arc<CaSecretState>> {
        let stored = self
            .stored_secret(key)
            .filter(|s| s.has_data() && s.claim(authority, key).owned())?;
        let known = lock(&self.ca_secrets);
        let (seen, state) = known.get(key)?;
        (Some(seen.as_str()) == stored.resource_version()).then(|| state.clone())
    }

    /// The last CA seen signing for CertificateAuthority `authority` of UID `uid`.
    pub(crate) fn last_good(&self, authority: &str, uid: &str) -> Option<CaKeyPair> {
        let last_good = lock(&self.last_good);
        let (seen_for, signer) = last_good.get(authority)?;
        (seen_for == uid).then(|| signer.clone())
    }

    /// Remembers the CA that signs for `authority` of UID `uid` now (none: forgets it).
    pub(crate) fn set_last_good(&self, authority: &str, uid: &str, signer: Option<CaKeyPair>) {
        let mut last_good = lock(&self.last_good);
        match signer {
            Some(signer) => last_good.insert(authority.to_string(), (uid.to_string(), signer)),
            None => last_good.remove(authority),
        };
    }

    /// The CAs CertificateAuthority `authority` of UID `uid` last held in its CA Secret (none
    /// known: empty).
    pub(crate) fn remembered_cas(&self, authority: &str, uid: &str) -> BTreeSet<String> {
        match lock(&self.remembered_cas).get(authority) {
            Some((seen_for, cas)) if seen_for == uid => cas.clone(),
            _ => BTreeSet::new(),
        }
    }

    /// Remembers the CAs `authority` of UID `uid` holds now (`None`: keeps what was known).
    pub(crate) fn remember_cas(&self, authority: &str, uid: &str, held: Option<BTreeSet<String>>) {
        if let Some(held) = held {
            lock(&self.remembered_cas).insert(authority.to_string(), (uid.to_string(), held));
        }
    }

    /// Why the operator cannot act on a CertificateAuthority's objects: one of them is
    /// outside the one namespace it watches.
    pub(crate) fn outside_scope(&self, spec: &CertificateAuthoritySpec) -> Option<String> {
        let scope = self.scope.as_deref()?;
        [
            ("spec.secret.namespace", &spec.secret.namespace),
            ("spec.bundle.namespace", &spec.bundle.namespace),
        ]
        .into_iter()
        .find(|(_, namespace)| namespace.as_str() != scope)
        .map(|(field, namespace)| {
            format!(
                "{field}: {namespace:?} is outside the namespace the operator watches ({scope:?})"
            )
        })
    }

    /// Why a CertificateAuthority with `spec` may not keep its CA there: the administrator
    /// confines CA Secrets to some namespaces (`--authority-secret-namespaces`, as
    /// cert-manager confines ClusterIssuers' to its cluster resource namespace), and its
    /// `spec.secret.namespace` is not one of them.
    pub(crate) fn secret_namespace_refused(
        &self,
        spec: &CertificateAuthoritySpec,
    ) -> Option<String> {
        let allowed = self.ctx.settings.authority_secret_namespaces.as_ref()?;
        let namespace = &spec.secret.namespace;
        (!allowed.contains(namespace)).then(|| {
            let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
            format!(
                "spec.secret.namespace: {namespace:?} is not a namespace CertificateAuthority Secrets may be in (--authority-secret-namespaces: {})",
                allowed.join(", ")
            )
        })
    }

    /// The CAs (fingerprints) every injection point naming `authority` holds, as
    /// [`AuthorityObserved::injected`] wants them: `None` when none names it; the bundle's CAs
    /// when every one holds exactly `published` (the bundle ConfigMap's `ca-bundle.crt`);
    /// none confirmed otherwise, or while a target kind is not listed yet.
    pub(crate) fn injected(
        &self,
        authority: &str,
        published: Option<&str>,
        bundle: &BundleState,
        untrusting: &mut Untrusting,
    ) -> Option<BTreeSet<String>> {
        let listed = self.synced.targets.iter().all(|s| *s.borrow());
        if !listed {
            return Some(BTreeSet::new());
        }
        let mut named = false;
        let mut all_hold = true;
        for (kind, store) in &self.targets {
            for target in store.state() {
                if authority_named(*kind, &target).as_deref() != Some(authority) {
                    continue;
                }
                named = true;
                let holds = published
                    .is_some_and(|text| injection::holds_bundle(*kind, &target, text.as_bytes()));
                if !holds {
                    untrusting.add(|| format!("{} {}", kind.kind(), target.name_any()));
                }
                all_hold &= holds;
            }
        }
        match (named, all_hold) {
            (false, _) => None,
            (true, true) => Some(
                bundle
                    .certificates()
                    .iter()
                    .map(|c| c.fingerprint().to_string())
                    .collect(),
            ),
            (true, false) => Some(BTreeSet::new()),
        }
    }

    /// The CAs that signed the existing certificates of every IssuedCertificate naming
    /// `authority` (among the issuer's candidates), whether one of them (with a valid spec) has
    /// no readable certificate, and the CAs the `ca.crt` of every one that is Ready holds:
    /// [`AuthorityObserved::in_use`], [`AuthorityObserved::certificates_missing`],
    /// [`AuthorityObserved::distributed`]; each Ready one whose `ca.crt` lacks a CA of
    /// `published` (fingerprints) is added to `untrusting`. Read from the stores, each Secret
    /// version once per set of candidates.
    pub(crate) fn certificates_of(
        &self,
        authority: &str,
        issuer: &IssuerView,
        published: &BTreeSet<String>,
        untrusting: &mut Untrusting,
    ) -> (BTreeSet<String>, bool, Option<BTreeSet<String>>) {
        let candidates = issuer.candidates();
        let keys = lock(&self.index).of_issuer(authority);
        let mut in_use = BTreeSet::new();
        let mut missing = false;
        let mut distributed: Option<BTreeSet<String>> = None;
        for key in keys {
            let Some(certificate) = self
                .certificates
                .get(&ObjectRef::new(&key.1).within(&key.0))
            else {
                continue;
            };
            let secret = (key.0.clone(), certificate.spec.secret_name.clone());
            match self.leaf_use(&owner_of(&*certificate), &secret, &candidates) {
                LeafUse::Signed { signer, ca_bundle } => {
                    // Without a copy per certificate: this runs for every certificate of the
                    // CA on each of its passes.
                    if let Some(signer) = signer.map(|i| candidates[i].fingerprint())
                        && !in_use.contains(signer)
                    {
                        in_use.insert(signer.to_string());
                    }
                    // Only a Ready certificate's: its controller writes `ca.crt` (one that
                    // cannot be written, refused say, is not Ready and holds nothing up).
                    if ready(&certificate) {
                        if !ca_bundle.is_superset(published) {
                            untrusting.add(|| {
                                format!("the ca.crt of IssuedCertificate {}/{}", key.0, key.1)
                            });
                        }
                        match &mut distributed {
                            None => distributed = Some((*ca_bundle).clone()),
                            Some(all) => all.retain(|ca| ca_bundle.contains(ca)),
                        }
                    }
                }
                // One whose spec never validates never gets a certificate: it serves none.
                LeafUse::Missing => missing |= certificate.spec.policy().is_ok(),
            }
        }
        (in_use, missing, distributed)
    }

    /// Which of `candidates` (the first, in order) signed the certificate in the Secret `key`.
    /// Each Secret version is read once, and checked against each CA once: when the
    /// candidates change (a rotation adds a CA, retires one), only the new ones are checked.
    fn leaf_use(&self, certificate: &Owner, key: &Key, candidates: &[&Certificate]) -> LeafUse {
        let Some(secret) = self.stored_secret(key) else {
            return LeafUse::Missing;
        };
        if !secret.claim(certificate, key).owned() {
            // Another's Secret, or someone's: it tells nothing of what this certificate's
            // workload serves.
            return LeafUse::Missing;
        }
        let version = secret.resource_version().unwrap_or_default();
        let cached = {
            let known = lock(&self.leaf_uses);
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
            lock(&self.leaf_uses).insert(key.clone(), known);
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
                        (leaf.as_ref()).is_some_and(|leaf| self.verified.is_issued_by(leaf, ca));
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
        lock(&self.leaf_uses).insert(key.clone(), known);
        LeafUse::Signed { signer, ca_bundle }
    }

    /// What the certificates of CertificateAuthority `name` are issued from now, from its
    /// Secret as stored ([`IssuerView::observed`]); or why there is nothing to issue from
    /// (the condition a certificate shows).
    pub(crate) async fn issuer(
        &self,
        name: &str,
        now: OffsetDateTime,
    ) -> Result<Result<IssuerView, authority::Condition>, Error> {
        let not_ready = |reason, message| authority::Condition {
            status: false,
            reason,
            message,
        };
        let Some(ca) = self.authorities.get(&ObjectRef::new(name)) else {
            let crd = if self.authority_crd_missing() {
                " (its CRD is not installed)"
            } else {
                ""
            };
            return Ok(Err(not_ready(
                names::REASON_ISSUER_NOT_FOUND,
                format!("CertificateAuthority {name} not found{crd}; waiting for it"),
            )));
        };
        let policy = match ca.spec.policy() {
            Ok(policy) => policy,
            Err(e) => {
                return Ok(Err(not_ready(
                    names::REASON_ISSUER_INVALID,
                    format!("CertificateAuthority {name} has an invalid spec: {e}"),
                )));
            }
        };
        if let Some(problem) =
            (self.outside_scope(&ca.spec)).or_else(|| self.secret_namespace_refused(&ca.spec))
        {
            return Ok(Err(not_ready(
                names::REASON_ISSUER_INVALID,
                format!("CertificateAuthority {name}: {problem}"),
            )));
        }
        let key = ca_secret_key(&ca.spec);
        let authority = owner_of(&*ca);
        let state = match self.known_ca_secret_state(&authority, &key) {
            Some(state) => state,
            None => self.ca_secret_state(&authority, &key, self.secret(&key).await?.as_deref()),
        };
        let bundle = match *state {
            CaSecretState::Valid(_) => BundleState::Absent,
            // Only then is the published bundle what certificates trust.
            CaSecretState::Absent | CaSecretState::Invalid { .. } => {
                let (namespace, bundle_name) = bundle_key(&ca.spec);
                let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), &namespace);
                let at = (namespace.clone(), bundle_name.clone());
                let config_map = (api.get_opt(&bundle_name).await?)
                    .filter(|c| not_owned(&authority, "ConfigMap", &at, &c.metadata).is_none());
                let content = config_map.as_ref().map(config_map_content);
                BundleState::observe(content.as_ref().map(|(d, a)| (d, a)))
            }
        };
        let seen = AuthorityObserved {
            secret_name: ObjectName::new(&key.0, &key.1),
            bundle_name: ObjectName::new(&ca.spec.bundle.namespace, &ca.spec.bundle.name),
            secret: (*state).clone(),
            bundle,
            injected: None,
            in_use: BTreeSet::new(),
            certificates_missing: false,
            distributed: None,
            untrusting: Default::default(),
            last_good: self.last_good(name, &ca.uid().unwrap_or_default()),
            remembered: None,
            reported_degraded: None,
        };
        Ok(Ok(IssuerView::for_certificates(
            &seen,
            policy.trust_propagation,
            now,
        )))
    }

    /// Notes that the pass of `certificate` wrote the Secret `key`, from version `before` to
    /// `after`.
    pub(crate) fn note_written(
        &self,
        key: Key,
        before: Option<String>,
        after: String,
        certificate: Key,
    ) {
        lock(&self.written).note(key, before, after, certificate, Instant::now());
    }

    /// Whether the store still shows the Secret `key` as it was before this process wrote it
    /// (at `stored`): then how long to wait for the watch to bring the write, at most.
    pub(crate) fn behind_own_write(&self, key: &Key, stored: Option<&str>) -> Option<Duration> {
        lock(&self.written).behind(key, stored, Instant::now())
    }
}

/// Creates the Secret `key` (type `kubernetes.io/tls`) for `owner` when `version` is `None`,
/// else merge-patches its `data` and annotations on `version`.
pub(crate) async fn write_secret(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    data: &SecretData,
    annotations: &AnnotationChanges,
) -> Result<Written, Error> {
    let secret = |metadata| Secret {
        metadata,
        type_: Some(SECRET_TYPE_TLS.into()),
        data: Some(
            data.iter()
                .filter_map(|(k, v)| Some((k.to_string(), ByteString(v?.as_bytes().to_vec()))))
                .collect(),
        ),
        ..Default::default()
    };
    let patch = data
        .iter()
        .map(|(k, v)| {
            let value = v.map_or(Value::Null, |v| Value::String(STANDARD.encode(v)));
            (k.to_string(), value)
        })
        .collect();
    create_or_patch(client, owner, key, version, annotations, secret, patch).await
}

/// Creates the ConfigMap `key` for `owner` when `version` is `None`, else merge-patches its
/// `data` and annotations on `version`.
pub(crate) async fn write_config_map(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    data: &BTreeMap<&'static str, String>,
    annotations: &AnnotationChanges,
) -> Result<Written, Error> {
    let config_map = |metadata| ConfigMap {
        metadata,
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        ),
        ..Default::default()
    };
    let patch = data
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.clone())))
        .collect();
    create_or_patch(client, owner, key, version, annotations, config_map, patch).await
}

/// Creates `key` as `object` makes it from its metadata (name, namespace, the label
/// [`names::MANAGED_BY`], `owner`'s mark [`names::OWNER`], the annotations set) when
/// `version` is `None`, else merge-patches `data`, the label, the mark (removing an adoption
/// request, [`names::ADOPT`]) and the annotation changes on `version`. A create is a create:
/// an object that appeared since the pass read none is never overwritten (409,
/// [`Written::Conflict`]: the next pass observes it); a patch applies only to the version the
/// pass decided on, whose [`claim`] allowed it.
pub(crate) async fn create_or_patch<K>(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    annotations: &AnnotationChanges,
    object: impl FnOnce(ObjectMeta) -> K,
    data: serde_json::Map<String, Value>,
) -> Result<Written, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), &key.0);
    let mut annotations = annotations.clone();
    annotations
        .set(names::OWNER, owner.mark())
        .remove(names::ADOPT);
    match version {
        None => {
            let mut written = BTreeMap::new();
            annotations.apply_to(&mut written);
            let (label, value) = names::MANAGED_BY;
            let object = object(ObjectMeta {
                name: Some(key.1.clone()),
                namespace: Some(key.0.clone()),
                labels: Some(BTreeMap::from([(label.to_string(), value.to_string())])),
                annotations: (!written.is_empty()).then_some(written),
                ..Default::default()
            });
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            // Answered with the metadata alone, as a patch is below.
            outcome(
                create_for_metadata(client, &api, &params, &object).await,
                false,
            )
        }
        Some(version) => {
            // The label too: an object an earlier caretaker wrote without it gets it.
            let (label, value) = names::MANAGED_BY;
            let body = json!({
                "metadata": {
                    "resourceVersion": version,
                    "labels": { label: value },
                    "annotations": annotations.to_json(),
                },
                "data": data,
            });
            // Answered with the metadata alone: only its resourceVersion is used.
            let api: Api<PartialObjectMeta<K>> = Api::namespaced(client.clone(), &key.0);
            outcome(
                api.patch(&key.1, &patch_params(), &Patch::Merge(&body))
                    .await,
                true,
            )
        }
    }
}

/// Adopts `key` for `owner` ([`Claim::Adopt`]): writes the mark alone (and removes the
/// adoption request) on `version`, the version whose claim was read. Its content is kept: the
/// next pass reads it as `owner`'s.
pub(crate) async fn adopt<K>(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: &str,
) -> Result<Written, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + fmt::Debug,
{
    let unchanged = AnnotationChanges::default();
    let never = |_| -> K { unreachable!("an adopted object exists") };
    create_or_patch(
        client,
        owner,
        key,
        Some(version),
        &unchanged,
        never,
        Default::default(),
    )
    .await
}

pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// A status condition as the API shows it: `lastTransitionTime` kept from `old` unless the
/// status changed.
pub(crate) fn condition(
    old: &[v1alpha1::Condition],
    type_: &str,
    new: &authority::Condition,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> v1alpha1::Condition {
    let status = if new.status { "True" } else { "False" };
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| format_time(now));
    v1alpha1::Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: new.reason.to_string(),
        message: new.message.clone(),
        last_transition_time: since,
        observed_generation: generation,
    }
}

/// The Ready and Degraded conditions.
pub(crate) fn conditions(
    old: &[v1alpha1::Condition],
    ready: &authority::Condition,
    degraded: &authority::Condition,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> Vec<v1alpha1::Condition> {
    vec![
        condition(old, v1alpha1::CONDITION_READY, ready, generation, now),
        condition(old, v1alpha1::CONDITION_DEGRADED, degraded, generation, now),
    ]
}

/// The conditions of an object refused for `reason`: not Ready and Degraded, both saying why.
/// The status of a certificate (an IssuedCertificate's, or a CertificateAuthority's CA that
/// signs now) once a plan's writes are in place.
pub(crate) fn certificate_status(
    planned: &authority::CertificateStatus,
    old: &v1alpha1::CertificateStatus,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> v1alpha1::CertificateStatus {
    v1alpha1::CertificateStatus {
        conditions: conditions(
            &old.conditions,
            &planned.ready,
            &planned.degraded,
            generation,
            now,
        ),
        serial_number: planned.serial.clone(),
        not_before: planned.not_before.map(format_time),
        not_after: planned.not_after.map(format_time),
        next_rotation: planned.next_rotation.map(format_time),
        observed_generation: generation,
    }
}

pub(crate) fn refused_conditions(
    old: &[v1alpha1::Condition],
    reason: &'static str,
    message: &str,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> Vec<v1alpha1::Condition> {
    let condition = |status| authority::Condition {
        status,
        reason,
        message: message.to_string(),
    };
    conditions(old, &condition(false), &condition(true), generation, now)
}

/// The Degraded condition's message, when it is true.
pub(crate) fn degraded_message(conditions: &[v1alpha1::Condition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| c.type_ == v1alpha1::CONDITION_DEGRADED && c.status == "True")
        .map(|c| c.message.as_str())
}

/// Writes `status` to `name`'s status subresource, only when it differs from `old`; an
/// object deleted meanwhile needs none.
pub(crate) async fn write_status<K, S>(
    api: &Api<K>,
    name: &str,
    status: &S,
    old: &S,
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug,
    S: Serialize + PartialEq,
{
    if status == old {
        return Ok(());
    }
    send_status_patch(api, name, &status_patch(status, old)).await
}

/// Merge-patches `name`'s status subresource with `patch`; an object deleted meanwhile needs
/// none.
async fn send_status_patch<K>(api: &Api<K>, name: &str, patch: &Value) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug,
{
    let request = kube::core::Request::new(api.resource_url())
        .patch_subresource("status", name, &patch_params(), &Patch::Merge(&patch))
        .map_err(kube::Error::BuildRequest)?;
    let client = api.clone().into_client();
    match send_for_metadata::<K>(&client, request, "patch_status").await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl Shared {
    /// Writes `object`'s status subresource, only when it changed: from `old`, the status
    /// `object` was read with, and from what this process wrote last, when the store does not
    /// show that write yet.
    pub(crate) async fn write_status<K, S>(
        &self,
        api: &Api<K>,
        object: &K,
        status: &S,
        old: &S,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug,
        S: Serialize + PartialEq,
    {
        if status == old {
            return Ok(());
        }
        let patch = status_patch(status, old);
        let digest = StatusMemory::patch_digest(&patch);
        if self.statuses.written(object, digest) {
            return Ok(());
        }
        send_status_patch(api, &object.name_any(), &patch).await?;
        self.statuses.remember(object, digest);
        Ok(())
    }
}

/// A merge patch that makes the status exactly `status`: the fields it leaves out are
/// removed (`null`), not kept.
pub(crate) fn status_patch<T: Serialize>(status: &T, old: &T) -> Value {
    let mut new = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let (Some(new), Ok(Value::Object(old))) = (new.as_object_mut(), serde_json::to_value(old)) {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
    }
    json!({ "status": new })
}

/// How long until `at`, for a requeue: exact, never negative, and at most a year (the
/// scheduler's queue holds at most about two; a pass then simply plans again).
pub(crate) fn until(at: OffsetDateTime) -> Duration {
    const YEAR: Duration = Duration::from_secs(365 * 86_400);
    let left = at - OffsetDateTime::now_utc();
    Duration::try_from(left).unwrap_or(Duration::ZERO).min(YEAR)
}

/// Runs CPU work (key generation, signing, parsing) off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => panic!("CPU work cancelled: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write of an object the pass found absent is a create, never a patch or a replace:
    /// an object that appeared meanwhile (someone's, here) is left exactly as it is, and the
    /// outcome is a conflict (the next pass observes it). A re-created CA Secret and a first
    /// certificate Secret are written this way.
    #[tokio::test]
    async fn a_write_of_an_absent_object_never_overwrites_one_that_appeared() {
        let server = caretaker_apiserver::TestServer::start().await;
        let client = server.client();
        let key: Key = ("default".into(), "appeared".into());
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &key.0);
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &key.0);
        let theirs: Secret = serde_json::from_value(json!({
            "metadata": { "name": "appeared" },
            "data": { "password": STANDARD.encode("hunter2") },
        }))
        .unwrap();
        let theirs = secrets
            .create(&PostParams::default(), &theirs)
            .await
            .unwrap();
        let theirs_map: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "appeared" }, "data": { "ca-bundle.crt": "theirs" },
        }))
        .unwrap();
        let theirs_map = config_maps
            .create(&PostParams::default(), &theirs_map)
            .await
            .unwrap();

        let mut data = SecretData::default();
        data.set(authority::TLS_CRT, "new")
            .set(authority::TLS_KEY, "new");
        let mut annotations = AnnotationChanges::default();
        annotations.set(names::CERTIFICATE_ISSUER, "webhooks-ca");
        let owner = Owner::new("IssuedCertificate", Some("default"), "web", "u1");
        let written = write_secret(&client, &owner, &key, None, &data, &annotations).await;
        assert!(matches!(written, Ok(Written::Conflict)));
        let bundle = BTreeMap::from([(authority::CA_BUNDLE_CRT, "new".to_string())]);
        let written = write_config_map(&client, &owner, &key, None, &bundle, &annotations).await;
        assert!(matches!(written, Ok(Written::Conflict)));
        assert_eq!(secrets.get("appeared").await.unwrap(), theirs);
        assert_eq!(config_maps.get("appeared").await.unwrap(), theirs_map);

        // Absent, it is created, with the label and its owner's mark.
        secrets
            .delete("appeared", &Default::default())
            .await
            .unwrap();
        let written = write_secret(&client, &owner, &key, None, &data, &annotations).await;
        assert!(matches!(written, Ok(Written::Done(_))));
        let created = secrets.get("appeared").await.unwrap();
        assert_eq!(created.type_.as_deref(), Some(SECRET_TYPE_TLS));
        assert_eq!(
            created
                .labels()
                .get(names::MANAGED_BY.0)
                .map(String::as_str),
            Some(names::MANAGED_BY.1)
        );
        assert_eq!(
            created.annotations().get(names::OWNER),
            Some(&"IssuedCertificate/default/web/u1".to_string())
        );

        // A patch keeps the mark, and uses up an adoption request.
        let version = created.resource_version().unwrap();
        let request = json!({ "metadata": { "annotations": { names::ADOPT: "IssuedCertificate/default/web" } } });
        let requested = secrets
            .patch("appeared", &PatchParams::default(), &Patch::Merge(&request))
            .await
            .unwrap();
        assert_ne!(requested.resource_version().unwrap(), version);
        let version = requested.resource_version().unwrap();
        let written = adopt::<Secret>(&client, &owner, &key, &version).await;
        assert!(matches!(written, Ok(Written::Done(_))));
        let adopted = secrets.get("appeared").await.unwrap();
        assert!(!adopted.annotations().contains_key(names::ADOPT));
        assert_eq!(adopted.data, created.data, "adoption writes the mark alone");
    }

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

    /// A pass that reads its object's status from before the previous pass's write still knows
    /// what that pass said: a Warning is said once per problem. A re-created object (another
    /// uid) starts from its own status.
    #[test]
    fn what_a_pass_said_outlives_a_stale_status() {
        let memory = DegradedMemory::default();
        // Any kind will do: the memory knows objects by kind, namespace, name and uid.
        let object = |uid: &str| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": { "name": "bad", "namespace": "default", "uid": uid },
            }))
            .unwrap()
        };
        let (first, again) = (object("one"), object("two"));
        assert_eq!(memory.reported(&first, None), None);
        assert_eq!(memory.reported(&first, Some("old")).as_deref(), Some("old"));

        // Healthy before and after: nothing to remember, the status read says it all.
        memory.remember(&first, None, None);
        assert!(lock(&memory.0).is_empty());

        memory.remember(&first, None, Some("bad validity"));
        let stale = None;
        assert_eq!(
            memory.reported(&first, stale).as_deref(),
            Some("bad validity")
        );
        assert_eq!(
            memory.reported(&again, stale),
            None,
            "another object by that name"
        );

        // Fixed: a stale status still saying the problem does not hide its return.
        memory.remember(&first, Some("bad validity"), None);
        assert_eq!(memory.reported(&first, Some("bad validity")), None);

        memory.remember(&first, None, Some("bad validity"));
        memory.forget::<ConfigMap>("default", "bad");
        assert_eq!(memory.reported(&first, stale), None);
    }

    /// The event of a certificate's own Secret write does not wake that certificate again
    /// (its pass decided on what it wrote), unless a pass waited for it meanwhile; anyone
    /// else's write does.
    #[test]
    fn a_certificates_own_write_does_not_wake_it_again() {
        let secret = || ("demo".to_string(), "web-tls".to_string());
        let web = ("demo".to_string(), "web".to_string());
        let now = Instant::now();
        let mut writes = OwnWrites::default();
        writes.note(secret(), Some("7".into()), "8".into(), web.clone(), now);
        assert_eq!(writes.shown(&secret(), Some("7")), None, "not shown yet");
        assert_eq!(writes.shown(&secret(), Some("8")), Some(web.clone()));
        assert_eq!(
            writes.shown(&secret(), Some("8")),
            None,
            "forgotten once shown"
        );

        // Someone else's write came first: it wakes the certificate, and the entry goes.
        writes.note(secret(), Some("8".into()), "9".into(), web.clone(), now);
        assert_eq!(writes.shown(&secret(), Some("10")), None);
        assert!(writes.0.is_empty());

        // A pass read the version before the write and waits: the write's event wakes it.
        writes.note(secret(), Some("10".into()), "11".into(), web.clone(), now);
        let wait = writes.behind(&secret(), Some("10"), now + Duration::from_secs(1));
        assert_eq!(wait, Some(WRITE_SETTLES - Duration::from_secs(1)));
        assert_eq!(writes.shown(&secret(), Some("11")), None);

        // A created Secret: before is none.
        writes.note(secret(), None, "1".into(), web.clone(), now);
        assert_eq!(
            writes.behind(&secret(), Some("1"), now),
            None,
            "the store shows it"
        );
        writes.note(secret(), None, "1".into(), web.clone(), now);
        assert_eq!(writes.shown(&secret(), None), None);
        assert_eq!(writes.shown(&secret(), Some("1")), Some(web));
    }

    #[test]
    fn a_status_is_not_written_again_while_the_store_shows_the_version_before_it() {
        let memory = StatusMemory::default();
        let object = |version: &str| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": { "name": "web", "namespace": "demo", "resourceVersion": version },
            }))
            .unwrap()
        };
        let issued = StatusMemory::patch_digest(&json!({ "status": { "serialNumber": "02" } }));
        let other = StatusMemory::patch_digest(&json!({ "status": { "serialNumber": "03" } }));
        assert!(!memory.written(&object("7"), issued), "nothing written yet");
        memory.remember(&object("7"), issued);
        assert!(
            memory.written(&object("7"), issued),
            "the store still shows 7"
        );
        assert!(
            !memory.written(&object("7"), other),
            "another status is written"
        );
        // The store shows the write: the status read is current, and decides alone.
        assert!(!memory.written(&object("8"), issued));
        assert!(
            !memory.written(&object("7"), issued),
            "forgotten once caught up"
        );
    }

    fn crd(name: &str) -> DynamicObject {
        DynamicObject::new(name, &TargetKind::CustomResourceDefinition.api_resource())
    }

    #[test]
    fn caretakers_crds_are_seen_coming_and_going() {
        let [ca, issued] = crd_names();
        assert_eq!(ca, "certificateauthorities.caretaker.dev");
        assert_eq!(issued, "issuedcertificates.caretaker.dev");
        let mut presence = Presence::default();
        let mut state = Installed::default();
        let mut feed = |event: watcher::Event<DynamicObject>| {
            state = presence.observe(&event, state);
            state
        };
        feed(watcher::Event::Init);
        assert_eq!(
            feed(watcher::Event::InitApply(crd(&issued))),
            Installed::default(),
            "unknown until listed"
        );
        let listed = feed(watcher::Event::InitDone);
        assert_eq!(
            listed,
            Installed {
                authorities: Some(false),
                certificates: Some(true)
            }
        );
        assert!(listed.any());
        let both = feed(watcher::Event::Apply(crd(&ca)));
        assert_eq!(both.authorities, Some(true));
        assert_eq!(
            feed(watcher::Event::Apply(crd("widgets.example.com"))),
            both
        );
        let none = {
            feed(watcher::Event::Delete(crd(&ca)));
            feed(watcher::Event::Delete(crd(&issued)))
        };
        assert!(!none.any());
        assert_eq!(none.authorities, Some(false));
    }

    fn certificate(namespace: &str, name: &str, secret: &str, issuer: &str) -> IssuedCertificate {
        serde_json::from_value(json!({
            "apiVersion": "caretaker.dev/v1alpha1",
            "kind": "IssuedCertificate",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "issuerRef": { "name": issuer }, "secretName": secret,
                      "commonName": "x", "usages": ["server"] },
        }))
        .unwrap()
    }

    fn key(namespace: &str, name: &str) -> Key {
        (namespace.into(), name.into())
    }

    #[test]
    fn the_index_follows_secrets_and_issuers_through_changes() {
        let mut index = CertificateIndex::default();
        assert!(
            index
                .insert(&certificate("a", "one", "tls", "ca1"))
                .is_none()
        );
        assert!(
            index
                .insert(&certificate("a", "two", "tls", "ca1"))
                .is_none()
        );
        assert!(
            index
                .insert(&certificate("b", "one", "tls", "ca2"))
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
            index.insert(&certificate("a", "two", "other", "ca2")),
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
        index.rebuild(&[Arc::new(certificate("c", "x", "s", "ca3"))]);
        assert_eq!(index.of_issuer("ca3"), [key("c", "x")]);
        assert!(index.of_issuer("ca2").is_empty());
    }

    #[test]
    fn conditions_keep_their_transition_time_until_the_status_changes() {
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let t1 = t0 + time::Duration::hours(1);
        let ready = |status| authority::Condition {
            status,
            reason: names::REASON_SIGNING,
            message: "m".into(),
        };
        let first = vec![condition(&[], "Ready", &ready(true), Some(1), t0)];
        assert_eq!(first[0].last_transition_time, format_time(t0));
        let same = condition(&first, "Ready", &ready(true), Some(2), t1);
        assert_eq!(same.last_transition_time, format_time(t0));
        assert_eq!(same.observed_generation, Some(2));
        let flipped = condition(&first, "Ready", &ready(false), Some(2), t1);
        assert_eq!(flipped.last_transition_time, format_time(t1));
        assert_eq!(flipped.status, "False");
    }

    #[test]
    fn a_status_patch_removes_what_the_new_status_leaves_out() {
        let old = v1alpha1::IssuedCertificateStatus {
            serial_number: Some("01".into()),
            observed_generation: Some(1),
            ..Default::default()
        };
        let new = v1alpha1::IssuedCertificateStatus {
            observed_generation: Some(2),
            ..Default::default()
        };
        assert_eq!(
            status_patch(&new, &old),
            json!({ "status": { "serialNumber": null, "observedGeneration": 2 } })
        );
    }

    #[test]
    fn requeues_are_exact_and_bounded() {
        let now = OffsetDateTime::now_utc();
        assert_eq!(until(now - time::Duration::hours(1)), Duration::ZERO);
        let soon = until(now + time::Duration::seconds(30));
        assert!(soon <= Duration::from_secs(30) && soon > Duration::from_secs(29));
        assert_eq!(
            until(now + time::Duration::days(3650)),
            Duration::from_secs(365 * 86_400)
        );
    }
}
