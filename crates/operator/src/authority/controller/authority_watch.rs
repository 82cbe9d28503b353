//! The watches the CertificateAuthority and IssuedCertificate controllers
//! ([`super::certificate_authority`], [`super::issued_certificate`]) share: one watch per kind
//! they read, each feeding a store ([`super::authorities::Stores`]) and the certificate index,
//! and the mapping of every change to the objects it concerns.
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

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DynamicObject, ObjectMeta};
use kube::runtime::reflector::Store;
use kube::runtime::reflector::store::Writer;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use time::OffsetDateTime;
use tokio::sync::watch;

use super::authorities::{Installed, OwnKind, Shared, Writers, bundle_key, ca_secret_key};
use crate::authority::index::Indexed;
use crate::authority::secret_cache::LAST_APPLIED;
use crate::injection::{self, SourceRef, TargetKind};
use crate::metrics::CertificateKind;
use crate::runtime::claims::owner_of;
use crate::runtime::watch_failures::Failing;
use crate::runtime::write::key_of;
use crate::runtime::{Key, lock};
use caretaker_api::v1alpha1::{self, CertificateAuthority, IssuedCertificate};

/// Whose watches fail, in the log.
const AUTHORITIES: &str = "CertificateAuthority/IssuedCertificate controllers";

/// How long a CA waits, after one of its certificates' Secrets changed, before its pass counts
/// the CAs in use again. A pass reads every certificate of the CA, and a rotation changes
/// thousands of Secrets in a burst: the changes within this time take one pass, not one each.
/// (A first change is never put off by later ones: a busy CA still runs this often.)
pub(super) const CERTIFICATES_SETTLE: Duration = Duration::from_secs(1);

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

/// What a watch of one of caretaker's own kinds tells its handler.
enum Seen<'a, K: Resource<DynamicType = ()> + 'static> {
    /// An event, already applied to the store.
    Event(&'a watcher::Event<K>, &'a Store<K>),
    /// The kind's CRD was removed: the store is empty now.
    CrdRemoved,
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
        let mut installed = shared.stores.installed.subscribe();
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
        let mut installed = self.stores.installed.subscribe();
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

/// A certificate's key: (namespace, name).
fn certificate_key(certificate: &IssuedCertificate) -> Key {
    (
        certificate.namespace().unwrap_or_default(),
        certificate.name_any(),
    )
}

/// What the index keeps of a certificate: its Secret, its issuer, its spec's generation.
fn indexed(certificate: &IssuedCertificate) -> (Key, Indexed) {
    let key = certificate_key(certificate);
    let entry = Indexed {
        secret: (key.0.clone(), certificate.spec.secret_name.clone()),
        issuer: certificate.spec.issuer_ref.name.clone(),
        generation: certificate.metadata.generation,
    };
    (key, entry)
}

/// The CertificateAuthority an injection target asks for, if it asks for one.
pub(super) fn authority_named(kind: TargetKind, target: &DynamicObject) -> Option<String> {
    match injection::request(kind, target) {
        Ok(Some(SourceRef::Authority { name })) if target.metadata.deletion_timestamp.is_none() => {
            Some(name)
        }
        _ => None,
    }
}

impl Shared {
    fn wake_authority(&self, name: &str) {
        let _ = self.feeds.wake_authorities.send(name.to_string());
    }

    /// Wakes the CA `name` [`CERTIFICATES_SETTLE`] from now, unless a wake-up is due already.
    fn wake_authority_settled(self: &Arc<Self>, name: &str) {
        if !lock(&self.feeds.settling).insert(name.to_string()) {
            return;
        }
        let (shared, name) = (self.clone(), name.to_string());
        tokio::spawn(async move {
            tokio::time::sleep(CERTIFICATES_SETTLE).await;
            // Out of the set first: a change from now on takes the next wake-up.
            lock(&shared.feeds.settling).remove(&name);
            shared.wake_authority(&name);
        });
    }

    fn wake_certificates_of(&self, authority: &str) {
        let keys = lock(&self.index).of_issuer(authority);
        for key in keys {
            let _ = self.feeds.wake_certificates.send(key);
        }
    }

    fn wake_every_authority(&self) {
        for authority in self.stores.authorities.state() {
            self.wake_authority(&authority.name_any());
        }
    }

    fn wake_every_certificate(&self) {
        let keys: Vec<Key> = lock(&self.index).keys();
        for key in keys {
            let _ = self.feeds.wake_certificates.send(key);
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
                let now = presence.observe(&event, *self.stores.installed.borrow());
                self.stores.installed.send_if_modified(|state| {
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
                    self.stores.synced.targets[synced].send_replace(true);
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
                    self.stores.secrets.apply(key.clone(), secret);
                    self.secret_changed(key);
                }
                watcher::Event::Delete(secret) => {
                    let key = key_of(&secret.metadata);
                    self.stores.secrets.delete(&key);
                    self.secret_changed(key);
                }
                watcher::Event::Init => self.stores.secrets.relist_started(),
                watcher::Event::InitApply(secret) => self
                    .stores
                    .secrets
                    .relisted(key_of(&secret.metadata), secret),
                watcher::Event::InitDone => {
                    // Secrets gone while the watch was down went with the relist.
                    self.stores.secrets.relist_done();
                    self.stores.synced.secrets.send_replace(true);
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
        let own = lock(&self.own_writes).shown(&key, version);
        if stored.is_none() {
            self.leaf_uses.forget(&key);
            self.authority_memory.forget_ca_secret(&key);
        }
        let now = OffsetDateTime::now_utc();
        for authority in self.stores.authorities.state() {
            if ca_secret_key(&authority.spec) != key {
                continue;
            }
            let name = authority.name_any();
            self.wake_authority(&name);
            let secret = stored.as_ref().map(|s| s.secret(&key));
            let state = self.ca_secret_state(&owner_of(&*authority), &key, secret.as_ref());
            if self.authority_memory.issuer_changed(&name, &state, now) {
                self.wake_certificates_of(&name);
            }
        }
        let certificates = lock(&self.index).in_secret(&key);
        let mut issuers = BTreeSet::new();
        for (certificate, issuer) in certificates {
            if own.as_ref() != Some(&certificate) {
                let _ = self.feeds.wake_certificates.send(certificate);
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
                    for authority in self.stores.authorities.state() {
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
        self.watch_own_kind(
            api,
            writer,
            installed,
            &self.stores.synced.authorities,
            seen,
        )
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
        let mut installed = self.stores.installed.subscribe();
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
                let _ = self.feeds.authority_objects.send(authority.clone());
                self.authority_seen(authority, known);
            }
            watcher::Event::Delete(authority) => {
                let name = authority.name_any();
                if let Some((_, secret)) = known.remove(&name) {
                    self.forget_authority(&name, &secret);
                }
            }
            watcher::Event::InitDone => {
                self.stores.synced.authorities.send_replace(true);
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
                    let _ = self.feeds.authority_objects.send((*authority).clone());
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
        for other in self.stores.authorities.state() {
            if other.name_any() != name {
                self.wake_authority(&other.name_any());
            }
        }
        for secret in secrets {
            let sharing = lock(&self.index).in_secret(secret);
            for (certificate, _) in sharing {
                let _ = self.feeds.wake_certificates.send(certificate);
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
            let kind = CertificateKind::CertificateAuthority.as_str();
            (self.ctx.metrics).set_degraded(kind, "", name, false);
        }
        self.authority_memory.forget(name);
        self.statuses
            .degraded
            .forget::<CertificateAuthority>("", name);
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
                let issuers: BTreeSet<String> = lock(&self.index).issuers();
                let gone = lock(&self.index).rebuild([]);
                self.forget_certificates(gone);
                for issuer in issuers {
                    self.wake_authority(&issuer);
                }
            }
        };
        let installed = |i: &Installed| i.certificates;
        self.watch_own_kind(
            api,
            writer,
            installed,
            &self.stores.synced.certificates,
            seen,
        )
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
                let _ = self.feeds.wake_certificates.send(other);
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
            self.statuses
                .degraded
                .forget::<IssuedCertificate>(&namespace, &name);
            (self.ctx.metrics).remove_certificate_expiry(
                CertificateKind::IssuedCertificate,
                &namespace,
                &name,
            );
            let kind = CertificateKind::IssuedCertificate.as_str();
            (self.ctx.metrics).set_degraded(kind, &namespace, &name, false);
        }
    }

    fn certificate_event(
        &self,
        event: &watcher::Event<IssuedCertificate>,
        store: &Store<IssuedCertificate>,
    ) {
        match event {
            watcher::Event::Apply(certificate) => {
                let key = certificate_key(certificate);
                let (before, now) = {
                    let mut index = lock(&self.index);
                    let before = index.insert(indexed(certificate));
                    (before, index.get(&key).cloned())
                };
                // A status write changes nothing the CA reads, nor any other certificate, and
                // its controller acts on a generation only once: it is not passed on (thousands
                // of copies would wait in the feed while a rotation writes their statuses).
                if before != now {
                    let _ = self.feeds.certificate_objects.send(certificate.clone());
                    self.certificate_moved(&key, before.into_iter().chain(now));
                }
            }
            watcher::Event::Delete(certificate) => {
                let key = certificate_key(certificate);
                self.forget_certificates([key.clone()]);
                let before = lock(&self.index).remove(&key);
                self.certificate_moved(&key, before);
            }
            watcher::Event::InitDone => {
                let listed = store.state();
                let issuers: BTreeSet<String> = {
                    let mut index = lock(&self.index);
                    let mut issuers: BTreeSet<String> = index.issuers();
                    let gone = index.rebuild(listed.iter().map(|c| indexed(c)));
                    issuers.extend(index.issuers());
                    drop(index);
                    self.forget_certificates(gone);
                    issuers
                };
                self.stores.synced.certificates.send_replace(true);
                for certificate in listed {
                    let _ = self.feeds.certificate_objects.send((*certificate).clone());
                }
                for issuer in issuers {
                    self.wake_authority(&issuer);
                }
            }
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
