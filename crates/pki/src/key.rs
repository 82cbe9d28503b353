//! Private keys. A [`PrivateKey`] never prints its secret: its `Debug` shows only the
//! algorithm, and its PEM comes out only through [`PrivateKey::to_pem`].

use std::fmt;
use std::str::FromStr;

use rcgen::{KeyPair, PublicKeyData, RsaKeySize};

use crate::PkiError;

/// The key algorithms caretaker generates. ECDSA P-256 is the default: small, fast, and
/// what kubeadm uses when asked for ECDSA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KeyAlgorithm {
    #[default]
    EcdsaP256,
    EcdsaP384,
    Ed25519,
    Rsa2048,
    Rsa3072,
    Rsa4096,
}

impl KeyAlgorithm {
    /// Every algorithm, in the order help texts list them.
    pub const ALL: [KeyAlgorithm; 6] = [
        KeyAlgorithm::EcdsaP256,
        KeyAlgorithm::EcdsaP384,
        KeyAlgorithm::Ed25519,
        KeyAlgorithm::Rsa2048,
        KeyAlgorithm::Rsa3072,
        KeyAlgorithm::Rsa4096,
    ];

    /// The command-line name, such as `ecdsa-p256`.
    pub fn name(self) -> &'static str {
        match self {
            KeyAlgorithm::EcdsaP256 => "ecdsa-p256",
            KeyAlgorithm::EcdsaP384 => "ecdsa-p384",
            KeyAlgorithm::Ed25519 => "ed25519",
            KeyAlgorithm::Rsa2048 => "rsa-2048",
            KeyAlgorithm::Rsa3072 => "rsa-3072",
            KeyAlgorithm::Rsa4096 => "rsa-4096",
        }
    }

    pub(crate) fn is_rsa(self) -> bool {
        matches!(
            self,
            KeyAlgorithm::Rsa2048 | KeyAlgorithm::Rsa3072 | KeyAlgorithm::Rsa4096
        )
    }

    fn accepted() -> String {
        Self::ALL.map(Self::name).join(", ")
    }
}

impl fmt::Display for KeyAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KeyAlgorithm {
    type Err = PkiError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let wanted = value.trim().to_ascii_lowercase();
        Self::ALL
            .into_iter()
            .find(|a| a.name() == wanted)
            .ok_or_else(|| PkiError::UnknownAlgorithm {
                value: value.to_string(),
                accepted: Self::accepted(),
            })
    }
}

/// A private key and its public half.
pub struct PrivateKey {
    pair: KeyPair,
    algorithm: KeyAlgorithm,
}

impl PrivateKey {
    /// A fresh random key.
    pub fn generate(algorithm: KeyAlgorithm) -> Result<Self, PkiError> {
        let generated = match algorithm {
            KeyAlgorithm::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
            KeyAlgorithm::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
            KeyAlgorithm::Ed25519 => KeyPair::generate_for(&rcgen::PKCS_ED25519),
            KeyAlgorithm::Rsa2048 => {
                KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_2048)
            }
            KeyAlgorithm::Rsa3072 => {
                KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_3072)
            }
            KeyAlgorithm::Rsa4096 => {
                KeyPair::generate_rsa_for(&rcgen::PKCS_RSA_SHA256, RsaKeySize::_4096)
            }
        };
        let pair = generated.map_err(|e| PkiError::KeyGeneration {
            algorithm,
            reason: e.to_string(),
        })?;
        Ok(Self { pair, algorithm })
    }

    /// Reads a PKCS#8 (or SEC1 / PKCS#1) PEM private key. Errors never include the input.
    pub fn from_pem(pem: &str) -> Result<Self, PkiError> {
        let pair = KeyPair::from_pem(pem).map_err(|e| PkiError::InvalidKey(e.to_string()))?;
        let algorithm = crate::inspect::key_algorithm_of_spki(&pair.subject_public_key_info())
            .ok_or_else(|| PkiError::InvalidKey("unsupported key algorithm".into()))?;
        Ok(Self { pair, algorithm })
    }

    /// The key as PKCS#8 PEM. Write it only to files of mode 0600 or to Secrets.
    pub fn to_pem(&self) -> String {
        self.pair.serialize_pem()
    }

    pub fn algorithm(&self) -> KeyAlgorithm {
        self.algorithm
    }

    /// The DER SubjectPublicKeyInfo of the public half.
    pub fn public_key_der(&self) -> Vec<u8> {
        self.pair.subject_public_key_info()
    }

    pub(crate) fn pair(&self) -> &KeyPair {
        &self.pair
    }

    pub(crate) fn into_pair(self) -> KeyPair {
        self.pair
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PrivateKey")
            .field("algorithm", &self.algorithm)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_generates_and_round_trips_through_pem() {
        for algorithm in KeyAlgorithm::ALL {
            let key = PrivateKey::generate(algorithm).unwrap();
            assert_eq!(key.algorithm(), algorithm);
            let pem = key.to_pem();
            assert!(
                pem.starts_with("-----BEGIN PRIVATE KEY-----"),
                "{algorithm}"
            );
            let again = PrivateKey::from_pem(&pem).unwrap();
            assert_eq!(again.algorithm(), algorithm);
            assert_eq!(again.public_key_der(), key.public_key_der());
        }
    }

    #[test]
    fn algorithm_names_parse_and_unknown_ones_are_listed() {
        assert_eq!(
            "ECDSA-P384".parse::<KeyAlgorithm>().unwrap(),
            KeyAlgorithm::EcdsaP384
        );
        let err = "dsa-1024".parse::<KeyAlgorithm>().unwrap_err().to_string();
        assert!(err.contains("\"dsa-1024\""), "{err}");
        assert!(
            err.contains("ecdsa-p256, ecdsa-p384, ed25519, rsa-2048"),
            "{err}"
        );
    }

    #[test]
    fn debug_and_errors_never_show_key_material() {
        for algorithm in [KeyAlgorithm::EcdsaP256, KeyAlgorithm::Ed25519] {
            let key = PrivateKey::generate(algorithm).unwrap();
            assert_eq!(
                format!("{key:?}"),
                format!("PrivateKey {{ algorithm: {algorithm:?}, .. }}")
            );
            let pem = key.to_pem();
            let lines: Vec<&str> = pem.lines().collect();
            let body = lines[1..lines.len() - 1].join("\n");
            let reversed: String = body.chars().rev().collect();
            // Inputs that are almost keys: each carries real key material.
            let broken = [
                pem.replace(&body, &reversed),
                pem.replace(&body, &body[..body.len() / 2]),
                pem.replace("PRIVATE KEY", "PUBLIC KEY"),
                format!("{pem}trailing garbage {body}"),
                body.clone(),
                format!("-----BEGIN PRIVATE KEY-----\n{}\n", &body),
            ];
            for input in &broken {
                let Err(err) = PrivateKey::from_pem(input) else {
                    continue; // A parser that accepts it returns a key, not an error.
                };
                let err = err.to_string();
                // No line of key material, nor any 16-character piece of one, is echoed.
                for line in input.lines().filter(|l| !l.starts_with("-----")) {
                    let pieces = line.as_bytes().windows(16.min(line.len()));
                    for piece in pieces.map(|p| std::str::from_utf8(p).unwrap()) {
                        assert!(!err.contains(piece), "the error echoes {piece:?}: {err}");
                    }
                }
            }
        }
    }
}
