//! A CertificateAuthority's trust bundle ([`Bundle`]) and the ConfigMap that publishes it
//! ([`BundleConfigMap`], observed as a [`BundleState`]).

use std::collections::{BTreeMap, BTreeSet};

use time::OffsetDateTime;

use super::{CA_BUNDLE_CRT, Certificate, ConfigMapContent, TlsAnnotations};
use crate::changes::AnnotationChanges;

/// CA certificates to trust: de-duplicated, none expired, in `caretaker_pki::TrustBundle`'s
/// order (subject, then notBefore, then SHA-256), so the same set always renders the same
/// bytes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bundle {
    certificates: Vec<Certificate>,
}

impl Bundle {
    /// The bundle of `certificates` as valid at `now`.
    pub fn of(certificates: impl IntoIterator<Item = Certificate>, now: OffsetDateTime) -> Self {
        let mut seen = BTreeSet::new();
        let mut kept: Vec<Certificate> = certificates
            .into_iter()
            .filter(|c| !c.expired_at(now) && seen.insert(c.fingerprint().to_string()))
            .collect();
        kept.sort_by(|a, b| order_key(a).cmp(&order_key(b)));
        Self { certificates: kept }
    }

    pub fn certificates(&self) -> &[Certificate] {
        &self.certificates
    }

    pub fn is_empty(&self) -> bool {
        self.certificates.is_empty()
    }

    pub fn contains(&self, fingerprint: &str) -> bool {
        self.certificates
            .iter()
            .any(|c| c.fingerprint() == fingerprint)
    }

    pub fn get(&self, fingerprint: &str) -> Option<&Certificate> {
        self.certificates
            .iter()
            .find(|c| c.fingerprint() == fingerprint)
    }

    /// The fingerprints, in order.
    pub fn fingerprints(&self) -> Vec<String> {
        self.certificates
            .iter()
            .map(|c| c.fingerprint().to_string())
            .collect()
    }

    /// Concatenated PEM, one block per certificate: what `ca-bundle.crt`, `ca.crt` and a
    /// `caBundle` hold.
    pub fn text(&self) -> String {
        self.certificates.iter().map(Certificate::pem).collect()
    }
}

/// The fingerprint is colon-separated lowercase hex of fixed length, so it orders as the
/// digest's bytes do.
fn order_key(c: &Certificate) -> (&str, OffsetDateTime, &str) {
    (&c.info().subject, c.not_before(), c.fingerprint())
}

/// What the bundle ConfigMap holds, or must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleConfigMap {
    /// `ca-bundle.crt`, in the order it is (or must be) written.
    pub certificates: Vec<Certificate>,
    /// library-go's annotations, describing the CA that signs now.
    pub annotations: TlsAnnotations,
}

impl BundleConfigMap {
    /// The ConfigMap publishing `bundle`, described as the bundle of `signer`.
    pub fn of(bundle: &Bundle, signer: Option<&Certificate>) -> Self {
        Self {
            certificates: bundle.certificates().to_vec(),
            annotations: signer
                .map(|c| TlsAnnotations::describing(c, super::issuer_name(c), false))
                .unwrap_or_default(),
        }
    }

    /// The `ca-bundle.crt` text.
    pub fn text(&self) -> String {
        self.certificates.iter().map(Certificate::pem).collect()
    }

    /// The ConfigMap `data` to write (a merge patch: other keys are left alone).
    pub fn data(&self) -> BTreeMap<&'static str, String> {
        BTreeMap::from([(CA_BUNDLE_CRT, self.text())])
    }

    pub fn annotation_changes(&self) -> AnnotationChanges {
        self.annotations.changes()
    }

    pub fn fingerprints(&self) -> Vec<String> {
        self.certificates
            .iter()
            .map(|c| c.fingerprint().to_string())
            .collect()
    }
}

/// The bundle ConfigMap as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleState {
    Absent,
    /// It exists but `ca-bundle.crt` is missing, empty or not strictly certificates (the
    /// reason never quotes its content).
    Unusable {
        reason: String,
    },
    Present(BundleConfigMap),
}

impl BundleState {
    /// Reads a ConfigMap's `data` and annotations (`None`: there is no such ConfigMap).
    pub fn observe(configmap: Option<ConfigMapContent<'_>>) -> Self {
        let Some((data, annotations)) = configmap else {
            return BundleState::Absent;
        };
        let text = data.get(CA_BUNDLE_CRT).map(String::as_str).unwrap_or("");
        if text.trim().is_empty() {
            return BundleState::Unusable {
                reason: format!("{CA_BUNDLE_CRT} is missing or empty"),
            };
        }
        match Certificate::parse_pem(text) {
            Ok(certificates) => BundleState::Present(BundleConfigMap {
                certificates,
                annotations: TlsAnnotations::read(annotations, false),
            }),
            Err(e) => BundleState::Unusable {
                reason: format!("{CA_BUNDLE_CRT}: {e}"),
            },
        }
    }

    /// The certificates it holds (none unless present).
    pub fn certificates(&self) -> &[Certificate] {
        match self {
            BundleState::Present(b) => &b.certificates,
            BundleState::Absent | BundleState::Unusable { .. } => &[],
        }
    }

    /// The CA certificates it holds: a leaf, or anything else that is not a CA, put there is
    /// nothing to trust as a CA.
    pub fn cas(&self) -> impl Iterator<Item = &Certificate> {
        self.certificates().iter().filter(|c| c.info().is_ca)
    }

    pub fn present(&self) -> Option<&BundleConfigMap> {
        match self {
            BundleState::Present(b) => Some(b),
            BundleState::Absent | BundleState::Unusable { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::model::{Model, at};
    use crate::authority::{CaKeyPair, PkiMint};
    use caretaker_pki::{CaSpec, TrustBundle};

    #[test]
    fn a_bundle_drops_duplicates_and_expired_cas_and_keeps_a_fixed_order() {
        let model = Model::new(at(0));
        let (a, b, c) = (
            model.ca_cert("ca", 100),
            model.ca_cert("ca", 100),
            model.ca_cert("ca", 10),
        );
        let later = at(50 * 86_400);
        let one = Bundle::of([a.clone(), b.clone(), c.clone(), a.clone()], later);
        let other = Bundle::of([b.clone(), a.clone()], later);
        assert_eq!(one, other, "the same set, the same bundle");
        assert_eq!(
            one.certificates().len(),
            2,
            "duplicate and expired CA dropped"
        );
        assert!(!one.contains(c.fingerprint()));
        assert_eq!(one.text(), other.text());
    }

    /// The bundle renders exactly what `caretaker_pki::TrustBundle` renders of the same CAs,
    /// and reads back as written.
    #[test]
    fn a_bundle_of_real_cas_is_pkis_trust_bundle_and_reads_back() {
        let cas: Vec<CaKeyPair> = ["zeta", "alpha", "alpha"]
            .iter()
            .map(|cn| crate::authority::Mint::create_ca(&PkiMint, &CaSpec::new(*cn)).unwrap())
            .collect();
        let now = OffsetDateTime::now_utc();
        let certificates: Vec<Certificate> = cas.iter().map(|ca| ca.certificate.clone()).collect();
        let bundle = Bundle::of(certificates.iter().chain(&certificates[..1]).cloned(), now);
        let pki = caretaker_pki::bundle::parse(
            &certificates
                .iter()
                .map(Certificate::pem)
                .collect::<String>(),
        )
        .unwrap();
        let (trust, _) = TrustBundle::normalize(pki, now);
        assert_eq!(bundle.text(), trust.to_pem());

        let written = BundleConfigMap::of(&bundle, Some(&cas[0].certificate));
        let data = written
            .data()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let mut annotations = BTreeMap::new();
        written.annotation_changes().apply_to(&mut annotations);
        assert_eq!(
            BundleState::observe(Some((&data, &annotations))),
            BundleState::Present(written)
        );
    }

    #[test]
    fn a_configmap_that_is_not_strictly_certificates_is_unusable_and_never_echoed() {
        let key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----\n";
        let data = BTreeMap::from([(CA_BUNDLE_CRT.to_string(), key.to_string())]);
        let none = BTreeMap::new();
        match BundleState::observe(Some((&data, &none))) {
            BundleState::Unusable { reason } => {
                assert!(reason.contains("not CERTIFICATE"), "{reason}");
                assert!(!reason.contains("c2VjcmV0"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            BundleState::observe(Some((&BTreeMap::new(), &none))),
            BundleState::Unusable { .. }
        ));
        assert_eq!(BundleState::observe(None), BundleState::Absent);
    }
}
