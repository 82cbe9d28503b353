//! What the CertificateAuthority and IssuedCertificate passes remember between them, in this
//! process: each CA's Secret as last observed, what its certificates are issued from, the last
//! CA seen signing, the CAs it held ([`AuthorityMemory`]); and the certificate Secret writes
//! the store does not show yet ([`OwnWrites`]). Plain structs, tested without an API server.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use time::OffsetDateTime;

use super::CaKeyPair;
use super::ca::{CaSecretState, IssuerView};

/// An object of a namespace: (namespace, name).
type Key = (String, String);

/// How long a certificate pass trusts that a Secret it wrote will show up in the store. Until
/// the watch brings the write, the store still shows the version before it; a pass then
/// would issue again for nothing.
pub(crate) const WRITE_SETTLES: Duration = Duration::from_secs(10);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the passes remember of each CertificateAuthority (by name; what outlives its object
/// is kept with that object's UID).
#[derive(Default)]
pub(crate) struct AuthorityMemory {
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
}

impl AuthorityMemory {
    /// The CA Secret `key` at `version` as observed: `observe`d once per version.
    pub(crate) fn ca_secret(
        &self,
        key: &Key,
        version: &str,
        observe: impl FnOnce() -> CaSecretState,
    ) -> Arc<CaSecretState> {
        if let Some((seen, state)) = lock(&self.ca_secrets).get(key)
            && *seen == version
        {
            return state.clone();
        }
        let state = Arc::new(observe());
        lock(&self.ca_secrets).insert(key.clone(), (version.to_string(), state.clone()));
        state
    }

    /// The CA Secret `key` as observed, when it was at `version`.
    pub(crate) fn known_ca_secret(
        &self,
        key: &Key,
        version: Option<&str>,
    ) -> Option<Arc<CaSecretState>> {
        let known = lock(&self.ca_secrets);
        let (seen, state) = known.get(key)?;
        (Some(seen.as_str()) == version).then(|| state.clone())
    }

    /// The CA Secret `key` is gone.
    pub(crate) fn forget_ca_secret(&self, key: &Key) {
        lock(&self.ca_secrets).remove(key);
    }

    /// Notes what the certificates of `authority` are issued from now (`state` at `now`);
    /// whether that changed.
    pub(crate) fn issuer_changed(
        &self,
        authority: &str,
        state: &CaSecretState,
        now: OffsetDateTime,
    ) -> bool {
        let digest = issuer_digest(state, now);
        let before = lock(&self.issuers_seen).insert(authority.to_string(), digest.clone());
        before.as_ref() != Some(&digest)
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

    /// `authority` is gone.
    pub(crate) fn forget(&self, authority: &str) {
        lock(&self.last_good).remove(authority);
        lock(&self.remembered_cas).remove(authority);
        lock(&self.issuers_seen).remove(authority);
    }
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

/// The certificate Secret writes of this process the store does not show yet.
#[derive(Default)]
pub(crate) struct OwnWrites(HashMap<Key, OwnWrite>);

impl OwnWrites {
    pub(crate) fn note(
        &mut self,
        key: Key,
        before: Option<String>,
        after: String,
        by: Key,
        now: Instant,
    ) {
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
    pub(crate) fn behind(
        &mut self,
        key: &Key,
        stored: Option<&str>,
        now: Instant,
    ) -> Option<Duration> {
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
    pub(crate) fn shown(&mut self, key: &Key, stored: Option<&str>) -> Option<Key> {
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
    /// A pass of that certificate waits for the write to show ([`OwnWrites::behind`]).
    held: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
