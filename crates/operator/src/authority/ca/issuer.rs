//! What a CA's certificates are issued from: the CA that signs now (or why none does) and
//! the bundle their `ca.crt` carries, as the CA Secret says or, while it is invalid, as the
//! last good CA and the published bundle say.

use std::time::Duration;

use time::OffsetDateTime;

use super::{AuthorityObserved, CaSecret, CaSecretState, invalid_message};
use crate::authority::bundle::Bundle;
use crate::authority::{CaKeyPair, Certificate};
use crate::timestamp::format_time;

/// Why no CA signs now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSigner {
    pub message: String,
    /// The CA is degraded (a person must act), rather than waiting for time.
    pub degraded: bool,
}

/// What the certificates of a CA are issued from: the CA that signs now and the bundle their
/// `ca.crt` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuerView {
    pub signer: Result<CaKeyPair, NoSigner>,
    /// `None` when unknown (nothing readable to go by): `ca.crt` is then left alone.
    pub bundle: Option<Bundle>,
}

impl IssuerView {
    /// The CAs a certificate of this issuer may be signed by: its bundle and the CA that
    /// signs now.
    pub fn candidates(&self) -> Vec<&Certificate> {
        self.bundle
            .iter()
            .flat_map(|b| b.certificates())
            .chain(self.signer.as_ref().ok().map(|s| &s.certificate))
            .collect()
    }

    /// The issuer as the CA Secret `secret` says at `now`.
    pub fn of(secret: &CaSecret, now: OffsetDateTime) -> Self {
        let signer = match &secret.current {
            Some(ca) if ca.signs_at(now) => Ok(ca.clone()),
            Some(ca) => Err(NoSigner {
                message: format!(
                    "the CA (serial {}) expired at {}; its successor signs once trusted everywhere",
                    ca.certificate.serial(),
                    format_time(ca.certificate.not_after())
                ),
                degraded: false,
            }),
            None => Err(NoSigner {
                message: "a re-created CA waits to be trusted everywhere before it signs".into(),
                degraded: false,
            }),
        };
        Self {
            signer,
            bundle: Some(secret.bundle(now)),
        }
    }

    /// The issuer as stored now, without deciding anything (for a controller of certificates
    /// that does not run the CA's plan): what the CA Secret says, or, while it is invalid,
    /// the last good CA and the published bundle.
    pub fn observed(seen: &AuthorityObserved, now: OffsetDateTime) -> Self {
        match &seen.secret {
            CaSecretState::Valid(secret) => Self::of(secret, now),
            CaSecretState::Invalid { reason } => {
                fallback(seen, &invalid_message(seen, reason), now)
            }
            CaSecretState::Absent => Self {
                signer: Err(NoSigner {
                    message: format!("the CA Secret {} does not exist yet", seen.secret_name),
                    degraded: false,
                }),
                bundle: seen
                    .bundle
                    .present()
                    .map(|_| Bundle::of(seen.bundle.cas().cloned(), now)),
            },
        }
    }
}

impl IssuerView {
    /// What the CA's IssuedCertificates are issued from, and what their `ca.crt` holds: the
    /// issuer as observed, except that with no `trust_propagation` a next CA enters `ca.crt`
    /// only once it signs. Nothing waits for `ca.crt` to trust it then (see [`super::plan`]), so
    /// each Secret takes the new CA up in the same write as its new certificate: one write
    /// per Secret for the rotation, where a `ca.crt` written ahead would be a second.
    pub fn for_certificates(
        seen: &AuthorityObserved,
        trust_propagation: Duration,
        now: OffsetDateTime,
    ) -> Self {
        let mut view = Self::observed(seen, now);
        if trust_propagation.is_zero()
            && let CaSecretState::Valid(secret) = &seen.secret
            && let Some(next) = &secret.next
            && let Some(bundle) = &mut view.bundle
        {
            let trusted = bundle.certificates().iter();
            let without = trusted.filter(|ca| ca.fingerprint() != next.fingerprint());
            *bundle = Bundle::of(without.cloned(), now);
        }
        view
    }
}

/// What a managed certificate of the CA may be signed by, to tell which CAs are in use
/// ([`AuthorityObserved::in_use`]): the issuer as observed, and every CA the published bundle
/// holds besides (one only the bundle holds stays while certificates it signed remain).
pub fn in_use_candidates(seen: &AuthorityObserved, now: OffsetDateTime) -> IssuerView {
    let mut view = IssuerView::observed(seen, now);
    let issuer = view.bundle.iter().flat_map(|b| b.certificates().iter());
    view.bundle = Some(Bundle::of(issuer.chain(seen.bundle.cas()).cloned(), now));
    view
}

/// The issuer while the CA Secret is invalid: the last good CA, and the published bundle with
/// it.
pub(super) fn fallback(seen: &AuthorityObserved, message: &str, now: OffsetDateTime) -> IssuerView {
    let last_good = seen.last_good.clone().filter(|ca| ca.signs_at(now));
    let published = seen.bundle.cas().cloned();
    let bundle = match &last_good {
        Some(ca) => Some(Bundle::of(published.chain([ca.certificate.clone()]), now)),
        None => seen.bundle.present().map(|_| Bundle::of(published, now)),
    };
    IssuerView {
        signer: last_good.ok_or_else(|| NoSigner {
            message: message.to_string(),
            degraded: true,
        }),
        bundle,
    }
}
