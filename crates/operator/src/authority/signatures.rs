//! Which CA signed which leaf, checked once.
//!
//! Verifying a signature costs about as much as making one, and each leaf is observed several
//! times: by its certificate's pass before and after each write, and by its CA's pass counting
//! what the CA signs. Whether one certificate signed another never changes, so a positive
//! answer is kept, by a digest of the two; a leaf signed here is known from its signing and
//! never checked. A negative answer is not kept: the key identifiers give most of them without
//! a signature check ([`caretaker_pki::is_issued_by`]).

use std::collections::HashSet;
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::Certificate;

/// Pairs kept before the older half is dropped: room for each certificate of a CA with
/// thousands, before and after a rotation. At most twice this many, 17 bytes each.
const GENERATION: usize = 16_384;

/// Signatures known to verify. Shared by every pass of the process.
#[derive(Default)]
pub struct Signatures(Mutex<Generations>);

/// Two sets: a pair found in the older one moves to the newer; when the newer is full, the
/// older is dropped. What is in use stays, what is not leaves within two generations.
#[derive(Default)]
struct Generations {
    newer: HashSet<Pair>,
    older: HashSet<Pair>,
}

/// Half of the SHA-256 of a leaf's DER and its CA's: 128 bits, beyond guessing.
type Pair = [u8; 16];

impl Signatures {
    /// Whether `ca` signed `leaf` ([`caretaker_pki::is_issued_by`]), checked once per pair.
    pub fn is_issued_by(&self, leaf: &Certificate, ca: &Certificate) -> bool {
        let pair = pair(leaf, ca);
        if self.known(&pair) {
            return true;
        }
        let signed = caretaker_pki::is_issued_by(leaf.der(), ca.der()).unwrap_or(false);
        if signed {
            self.keep(pair);
        }
        signed
    }

    /// `ca` signed `leaf` here.
    pub fn signed(&self, leaf: &Certificate, ca: &Certificate) {
        self.keep(pair(leaf, ca));
    }

    fn known(&self, pair: &Pair) -> bool {
        let mut sets = self.lock();
        if sets.newer.contains(pair) {
            return true;
        }
        if sets.older.remove(pair) {
            sets.keep(*pair);
            return true;
        }
        false
    }

    fn keep(&self, pair: Pair) {
        self.lock().keep(pair);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let sets = self.lock();
        sets.newer.len() + sets.older.len()
    }
}

impl Generations {
    fn keep(&mut self, pair: Pair) {
        if self.newer.len() >= GENERATION {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(pair);
    }
}

fn pair(leaf: &Certificate, ca: &Certificate) -> Pair {
    // DER is self-delimiting: the two never run into each other.
    let digest = Sha256::new()
        .chain_update(leaf.der())
        .chain_update(ca.der())
        .finalize();
    let mut pair = [0; 16];
    pair.copy_from_slice(&digest[..16]);
    pair
}

#[cfg(test)]
mod tests {
    use caretaker_pki::{CaSpec, CertificateAuthority, LeafSpec, Usage};

    use super::*;

    fn new_ca(name: &str) -> (CertificateAuthority, Certificate) {
        let ca = CertificateAuthority::create(&CaSpec::new(name)).unwrap();
        let certificate = Certificate::from_der(ca.certificate_der().to_vec()).unwrap();
        (ca, certificate)
    }

    fn leaf(ca: &CertificateAuthority) -> Certificate {
        let issued = ca.issue(&LeafSpec::new("leaf", Usage::Server)).unwrap();
        Certificate::from_der(issued.certificate_der).unwrap()
    }

    #[test]
    fn a_signature_is_checked_and_only_a_good_one_is_kept() {
        let signatures = Signatures::default();
        let (ca, ca_certificate) = new_ca("same-name");
        let (_, impostor) = new_ca("same-name");
        let leaf = leaf(&ca);
        assert!(!signatures.is_issued_by(&leaf, &impostor));
        assert_eq!(signatures.len(), 0, "a refusal is not kept");
        assert!(signatures.is_issued_by(&leaf, &ca_certificate));
        assert_eq!(signatures.len(), 1);
        assert!(signatures.is_issued_by(&leaf, &ca_certificate));
        assert!(!signatures.is_issued_by(&leaf, &impostor), "kept by pair");
    }

    /// What this process signed is known from the signing; a pair nobody vouched for is checked.
    #[test]
    fn a_leaf_signed_here_is_known_and_nothing_else_is() {
        let signatures = Signatures::default();
        let (ca, ca_certificate) = new_ca("ca");
        let (other, other_certificate) = new_ca("other");
        let (mine, theirs) = (leaf(&ca), leaf(&other));
        signatures.signed(&mine, &ca_certificate);
        assert_eq!(signatures.len(), 1);
        assert!(signatures.is_issued_by(&mine, &ca_certificate));
        assert!(!signatures.is_issued_by(&theirs, &ca_certificate));
        assert!(signatures.is_issued_by(&theirs, &other_certificate));
    }

    /// Bounded: pairs in use stay, the others leave within two generations.
    #[test]
    fn pairs_in_use_stay_and_the_others_go() {
        let mut sets = Generations::default();
        let pair = |n: usize| -> Pair {
            let mut pair = [0; 16];
            pair[..8].copy_from_slice(&n.to_le_bytes());
            pair
        };
        sets.keep(pair(0));
        for n in 1..=2 * GENERATION {
            sets.keep(pair(n));
            // Pair 0 is looked up all along, as a leaf in use is.
            if sets.older.remove(&pair(0)) {
                sets.keep(pair(0));
            }
            assert!(sets.newer.contains(&pair(0)) || sets.older.contains(&pair(0)));
        }
        assert!(sets.newer.len() + sets.older.len() <= 2 * GENERATION);
        assert!(!sets.newer.contains(&pair(1)) && !sets.older.contains(&pair(1)));
    }
}
