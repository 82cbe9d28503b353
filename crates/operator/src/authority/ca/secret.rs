//! The CA Secret: what it holds (the CA that signs now, the next and the older ones, and the
//! rotation's bookkeeping), read back as caretaker wrote it or refused with the reason, and
//! written out again.

use std::collections::BTreeMap;

use time::OffsetDateTime;

use crate::authority::bundle::Bundle;
use crate::authority::{CaKeyPair, Certificate, SecretContent, SecretData, TlsAnnotations};
use crate::changes::AnnotationChanges;
use crate::timestamp::{format_time, parse_time};
use caretaker_api::names::{NEXT_CRT, NEXT_KEY, PREVIOUS_CRT, TLS_CRT, TLS_KEY, authority_state};

/// What the CA Secret holds, or must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CaSecret {
    /// `tls.crt`/`tls.key`: the CA that signs now. `None` only while a re-created CA waits
    /// to be trusted (then `next` is set).
    pub current: Option<CaKeyPair>,
    /// `next.crt`/`next.key`: the CA a rotation introduces.
    pub next: Option<CaKeyPair>,
    /// `previous.crt`: older CAs still trusted, in bundle order.
    pub previous: Vec<Certificate>,
    /// `caretaker.dev/next-trusted-at`.
    pub next_trusted_at: Option<OffsetDateTime>,
    /// `caretaker.dev/unused-since`, by fingerprint.
    pub unused_since: BTreeMap<String, OffsetDateTime>,
    /// library-go's annotations (describing `current`).
    pub annotations: TlsAnnotations,
}

impl CaSecret {
    /// Every CA it holds, current first.
    pub(super) fn certificates(&self) -> impl Iterator<Item = &Certificate> {
        self.current
            .iter()
            .chain(&self.next)
            .map(|ca| &ca.certificate)
            .chain(&self.previous)
    }

    /// The trust bundle of these CAs at `now`.
    pub fn bundle(&self, now: OffsetDateTime) -> Bundle {
        Bundle::of(self.certificates().cloned(), now)
    }

    /// The Secret `data` to write (a merge patch: absent parts are removed, other keys left
    /// alone). `tls.crt` and `tls.key` are always written, empty while nothing signs, since a
    /// `kubernetes.io/tls` Secret must have both.
    pub fn data(&self) -> SecretData {
        let mut data = SecretData::default();
        match &self.current {
            Some(ca) => data
                .set(TLS_CRT, ca.certificate.pem())
                .set(TLS_KEY, ca.key.expose()),
            None => data.set(TLS_CRT, "").set(TLS_KEY, ""),
        };
        match &self.next {
            Some(ca) => data
                .set(NEXT_CRT, ca.certificate.pem())
                .set(NEXT_KEY, ca.key.expose()),
            None => data.remove(NEXT_CRT).remove(NEXT_KEY),
        };
        match self.previous.is_empty() {
            true => data.remove(PREVIOUS_CRT),
            false => data.set(
                PREVIOUS_CRT,
                self.previous
                    .iter()
                    .map(Certificate::pem)
                    .collect::<String>(),
            ),
        };
        data
    }

    /// The annotations to write: library-go's and the rotation's bookkeeping.
    pub fn annotation_changes(&self) -> AnnotationChanges {
        let mut changes = self.annotations.changes();
        match self.next_trusted_at {
            Some(t) => changes.set(authority_state::NEXT_TRUSTED_AT, format_time(t)),
            None => changes.remove(authority_state::NEXT_TRUSTED_AT),
        };
        match self.unused_since.is_empty() {
            true => changes.remove(authority_state::UNUSED_SINCE),
            false => changes.set(
                authority_state::UNUSED_SINCE,
                self.unused_since
                    .iter()
                    .map(|(fp, t)| format!("{fp}={}", format_time(*t)))
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        };
        changes
    }

    fn observe(
        data: &BTreeMap<String, Vec<u8>>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<Self, String> {
        let current = key_pair(data, TLS_CRT, TLS_KEY)?;
        let next = key_pair(data, NEXT_CRT, NEXT_KEY)?;
        if current.is_none() && next.is_none() {
            return Err(format!("{TLS_CRT} and {TLS_KEY} are empty"));
        }
        let previous = match text(data, PREVIOUS_CRT) {
            None => Vec::new(),
            Some(pem) => {
                let certificates =
                    Certificate::parse_pem(pem).map_err(|e| format!("{PREVIOUS_CRT}: {e}"))?;
                if let Some(c) = certificates.iter().find(|c| !c.info().is_ca) {
                    return Err(format!(
                        "{PREVIOUS_CRT} holds {}, which is not a CA certificate",
                        c.info().subject
                    ));
                }
                certificates
            }
        };
        let unused_since = annotations
            .get(authority_state::UNUSED_SINCE)
            .map(|value| {
                value
                    .split(',')
                    .filter_map(|entry| {
                        let (fp, t) = entry.trim().split_once('=')?;
                        Some((fp.to_string(), parse_time(Some(t))?))
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            current,
            next,
            previous,
            next_trusted_at: parse_time(
                annotations
                    .get(authority_state::NEXT_TRUSTED_AT)
                    .map(String::as_str),
            ),
            unused_since,
            annotations: TlsAnnotations::read(annotations, false),
        })
    }
}

/// The non-blank text of `key`.
fn text<'a>(data: &'a BTreeMap<String, Vec<u8>>, key: &str) -> Option<&'a str> {
    let bytes = data.get(key)?;
    match std::str::from_utf8(bytes) {
        Ok(s) if s.trim().is_empty() => None,
        Ok(s) => Some(s),
        // Not UTF-8: certainly not PEM; let the parser say so.
        Err(_) => Some("\u{fffd}"),
    }
}

/// The key pair under `crt`/`key`: both blank is none; one without the other, or a pair that
/// does not hold together, is an error naming what is wrong (never the key).
fn key_pair(
    data: &BTreeMap<String, Vec<u8>>,
    crt: &str,
    key: &str,
) -> Result<Option<CaKeyPair>, String> {
    match (text(data, crt), text(data, key)) {
        (None, None) => Ok(None),
        (Some(_), None) => Err(format!("{key} is missing or empty while {crt} is set")),
        (None, Some(_)) => Err(format!("{crt} is missing or empty while {key} is set")),
        (Some(c), Some(k)) => CaKeyPair::from_pem(c, k)
            .map(Some)
            .map_err(|e| format!("{crt}/{key}: {e}")),
    }
}

/// The CA Secret as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSecretState {
    Absent,
    /// Unreadable or tampered with: the reason names what is wrong, never key material.
    Invalid {
        reason: String,
    },
    Valid(Box<CaSecret>),
}

impl CaSecretState {
    /// Reads a Secret's `data` and annotations (`None`: there is no such Secret).
    pub fn observe(secret: Option<SecretContent<'_>>) -> Self {
        match secret {
            None => CaSecretState::Absent,
            Some((data, annotations)) => match CaSecret::observe(data, annotations) {
                Ok(secret) => CaSecretState::Valid(Box::new(secret)),
                Err(reason) => CaSecretState::Invalid { reason },
            },
        }
    }
}
