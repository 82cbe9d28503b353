//! Facts about certificates, checked once: which CA signed a leaf, and which key is a leaf's.
//!
//! Verifying a signature costs about as much as making one, and reading a private key to
//! compare it with its certificate about as much again; each leaf is observed several times:
//! by its certificate's pass before and after each write, and by its CA's pass counting what
//! the CA signs. Neither fact ever changes for the same pair, so a positive answer is kept, by
//! a digest of the two; a leaf issued here is known from its issuance and never checked. A
//! negative answer is not kept: the key identifiers give most of them without a signature
//! check ([`caretaker_pki::is_issued_by`]), and a key that is not the leaf's is a rare mistake.

use std::collections::HashMap;
use std::sync::Mutex;

use caretaker_pki::{KeyAlgorithm, PrivateKey, key_matches_certificate};
use sha2::{Digest, Sha256};

use super::{Certificate, KeyPem};

/// Facts kept before the older half is dropped: room for a signature and a key for each
/// certificate of a CA with thousands, and for their replacements while a rotation renews
/// them (a fact looked up in the older half moves to the newer one). The most a table of
/// 32,768 slots holds (seven eighths), so the room costs no more than 16,384 facts did: two
/// such tables, about 1.2 MB. With 16,384, a rotation of 10,000 certificates lost the older
/// half before most of them were renewed, and checked their signatures and keys again.
const GENERATION: usize = 28_672;

/// What is known to verify. Shared by every pass of the process.
#[derive(Default)]
pub struct Verified(Mutex<Generations>);

/// Two maps: a fact found in the older one moves to the newer; when the newer is full, the
/// older is dropped. What is in use stays, what is not leaves within two generations.
#[derive(Default)]
struct Generations {
    newer: HashMap<Pair, Fact>,
    older: HashMap<Pair, Fact>,
}

/// Half of the SHA-256 of what a fact is about: 128 bits, beyond guessing.
type Pair = [u8; 16];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fact {
    /// The CA signed the leaf.
    Signed,
    /// The key, of this algorithm, is the leaf's.
    KeyOf(KeyAlgorithm),
}

impl Verified {
    /// Whether `ca` signed `leaf` ([`caretaker_pki::is_issued_by`]), checked once per pair.
    pub fn is_issued_by(&self, leaf: &Certificate, ca: &Certificate) -> bool {
        let pair = signature(leaf, ca);
        if self.known(&pair) == Some(Fact::Signed) {
            return true;
        }
        let signed = caretaker_pki::is_issued_by(leaf.der(), ca.der()).unwrap_or(false);
        if signed {
            self.keep(pair, Fact::Signed);
        }
        signed
    }

    /// The algorithm of `key` (PEM) if it is `leaf`'s key, checked once per pair; `Err` with
    /// why it cannot be read, `Ok(None)` when it reads but is another's.
    pub fn key_of(&self, leaf: &Certificate, key: &str) -> Result<Option<KeyAlgorithm>, String> {
        let pair = key_pair(leaf, key);
        if let Some(Fact::KeyOf(algorithm)) = self.known(&pair) {
            return Ok(Some(algorithm));
        }
        let key = PrivateKey::from_pem(key).map_err(|e| e.to_string())?;
        if !key_matches_certificate(&key, leaf.der()).unwrap_or(false) {
            return Ok(None);
        }
        self.keep(pair, Fact::KeyOf(key.algorithm()));
        Ok(Some(key.algorithm()))
    }

    /// `ca` signed `leaf` here, for a new key of `algorithm`.
    pub fn issued(
        &self,
        leaf: &Certificate,
        key: &KeyPem,
        algorithm: KeyAlgorithm,
        ca: &Certificate,
    ) {
        self.keep(signature(leaf, ca), Fact::Signed);
        self.keep(key_pair(leaf, key.expose()), Fact::KeyOf(algorithm));
    }

    fn known(&self, pair: &Pair) -> Option<Fact> {
        let mut sets = self.lock();
        if let Some(fact) = sets.newer.get(pair) {
            return Some(*fact);
        }
        let fact = sets.older.remove(pair)?;
        sets.keep(*pair, fact);
        Some(fact)
    }

    fn keep(&self, pair: Pair, fact: Fact) {
        self.lock().keep(pair, fact);
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
    fn keep(&mut self, pair: Pair, fact: Fact) {
        if self.newer.len() >= GENERATION {
            self.older = std::mem::take(&mut self.newer);
        }
        self.newer.insert(pair, fact);
    }
}

/// The pair of a leaf and the CA that signed it.
fn signature(leaf: &Certificate, ca: &Certificate) -> Pair {
    // DER is self-delimiting: the two never run into each other.
    digest(&[b"signed", leaf.der(), ca.der()])
}

/// The pair of a leaf and its key.
fn key_pair(leaf: &Certificate, key: &str) -> Pair {
    digest(&[b"key", leaf.der(), key.as_bytes()])
}

fn digest(parts: &[&[u8]]) -> Pair {
    let digest = parts
        .iter()
        .fold(Sha256::new(), |hash, part| hash.chain_update(part))
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
        let verified = Verified::default();
        let (ca, ca_certificate) = new_ca("same-name");
        let (_, impostor) = new_ca("same-name");
        let leaf = leaf(&ca);
        assert!(!verified.is_issued_by(&leaf, &impostor));
        assert_eq!(verified.len(), 0, "a refusal is not kept");
        assert!(verified.is_issued_by(&leaf, &ca_certificate));
        assert_eq!(verified.len(), 1);
        assert!(verified.is_issued_by(&leaf, &ca_certificate));
        assert!(!verified.is_issued_by(&leaf, &impostor), "kept by pair");
    }

    /// What this process issued is known from the issuance (its signature, its key); a pair
    /// nobody vouched for is checked.
    #[test]
    fn a_leaf_signed_here_is_known_and_nothing_else_is() {
        let verified = Verified::default();
        let (ca, ca_certificate) = new_ca("ca");
        let (other, other_certificate) = new_ca("other");
        let (mine, theirs) = (leaf(&ca), leaf(&other));
        let key = KeyPem::new("not read: known from the issuance".into());
        verified.issued(&mine, &key, KeyAlgorithm::EcdsaP256, &ca_certificate);
        assert_eq!(verified.len(), 2);
        assert!(verified.is_issued_by(&mine, &ca_certificate));
        assert!(!verified.is_issued_by(&theirs, &ca_certificate));
        assert!(verified.is_issued_by(&theirs, &other_certificate));
        assert_eq!(
            verified.key_of(&mine, key.expose()),
            Ok(Some(KeyAlgorithm::EcdsaP256))
        );
    }

    /// A leaf's own key is read and compared once, and only then kept; another's key, or
    /// what is no key, is not.
    #[test]
    fn a_key_is_checked_and_only_the_leafs_own_is_kept() {
        let verified = Verified::default();
        let (ca, _) = new_ca("ca");
        let issued = ca.issue(&LeafSpec::new("leaf", Usage::Server)).unwrap();
        let leaf = Certificate::from_der(issued.certificate_der).unwrap();
        let own = issued.key.unwrap().to_pem();
        let other = ca
            .issue(&LeafSpec::new("leaf", Usage::Server))
            .unwrap()
            .key
            .unwrap()
            .to_pem();
        assert_eq!(verified.key_of(&leaf, &other), Ok(None));
        assert!(verified.key_of(&leaf, "no key").is_err());
        assert_eq!(verified.len(), 0, "refusals are not kept");
        assert_eq!(
            verified.key_of(&leaf, &own),
            Ok(Some(KeyAlgorithm::EcdsaP256))
        );
        assert_eq!(verified.len(), 1);
        assert_eq!(
            verified.key_of(&leaf, &own),
            Ok(Some(KeyAlgorithm::EcdsaP256))
        );
        assert_eq!(verified.key_of(&leaf, &other), Ok(None), "kept by pair");
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
        sets.keep(pair(0), Fact::Signed);
        for n in 1..=2 * GENERATION {
            sets.keep(pair(n), Fact::Signed);
            // Pair 0 is looked up all along, as a leaf in use is.
            if sets.older.remove(&pair(0)).is_some() {
                sets.keep(pair(0), Fact::Signed);
            }
            assert!(sets.newer.contains_key(&pair(0)) || sets.older.contains_key(&pair(0)));
        }
        assert!(sets.newer.len() + sets.older.len() <= 2 * GENERATION);
        assert!(!sets.newer.contains_key(&pair(1)) && !sets.older.contains_key(&pair(1)));
        // A generation was full when it became the older one (less pair 0, moved out), and
        // no table grew past the 32,768 slots 16,384 facts took (a grown one holds 57,344).
        assert_eq!(sets.older.len(), GENERATION - 1);
        assert!(sets.older.capacity() <= GENERATION && sets.newer.capacity() <= GENERATION);
    }
}
