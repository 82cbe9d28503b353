//! PKCS#12 trust stores with the structure trust-manager's encoder (go-pkcs12) writes, so Java and
//! OpenSSL read them the same way.
//!
//! One certificate bag per certificate, in the pool's order, each with a `friendlyName` (the
//! trust-manager alias, as a BMPString) and Java's trusted-key-usage attribute
//! (`2.16.840.1.113894.746875.1.1` = anyExtendedKeyUsage), which makes Java treat the entry as a
//! trust anchor. All bags sit in one SafeContents, which is:
//! - with an empty password: stored as is, without a MAC (go-pkcs12's `Passwordless`, whatever
//!   the profile, as trust-manager does); the output depends only on the certificates;
//! - otherwise encrypted and MACed as the profile says, with a fresh random salt and IV each time:
//!   `LegacyRC2` (PBE-SHA1-RC2-40, SHA-1 MAC), `LegacyDES` (PBE-SHA1-3DES, SHA-1 MAC) or
//!   `Modern2023` (PBES2 with PBKDF2-HMAC-SHA-256 and AES-256-CBC, SHA-256 MAC, 2048 iterations).

use std::num::NonZeroU32;

use aws_lc_rs::cipher::{AES_256, EncryptionContext, PaddedBlockEncryptingKey, UnboundCipherKey};
use aws_lc_rs::{digest, hmac, pbkdf2, rand};
use cipher::{BlockEncrypt, KeyInit};

use super::TrustStoreError;
use crate::der::{self, EXPLICIT_0, IMPLICIT_0};
use crate::pool::CertificatePool;

const DATA: &[u64] = &[1, 2, 840, 113549, 1, 7, 1];
const ENCRYPTED_DATA: &[u64] = &[1, 2, 840, 113549, 1, 7, 6];
const CERT_BAG: &[u64] = &[1, 2, 840, 113549, 1, 12, 10, 1, 3];
const X509_CERTIFICATE: &[u64] = &[1, 2, 840, 113549, 1, 9, 22, 1];
const FRIENDLY_NAME: &[u64] = &[1, 2, 840, 113549, 1, 9, 20];
const JAVA_TRUSTED_KEY_USAGE: &[u64] = &[2, 16, 840, 1, 113894, 746875, 1, 1];
const ANY_EXTENDED_KEY_USAGE: &[u64] = &[2, 5, 29, 37, 0];
const PBE_SHA1_RC2_40: &[u64] = &[1, 2, 840, 113549, 1, 12, 1, 6];
const PBE_SHA1_3DES: &[u64] = &[1, 2, 840, 113549, 1, 12, 1, 3];
const PBES2: &[u64] = &[1, 2, 840, 113549, 1, 5, 13];
const PBKDF2: &[u64] = &[1, 2, 840, 113549, 1, 5, 12];
const HMAC_SHA256: &[u64] = &[1, 2, 840, 113549, 2, 9];
const AES_256_CBC: &[u64] = &[2, 16, 840, 1, 101, 3, 4, 1, 42];
const SHA1: &[u64] = &[1, 3, 14, 3, 2, 26];
const SHA256: &[u64] = &[2, 16, 840, 1, 101, 3, 4, 2, 1];

/// How a password-protected store is encrypted (trust-manager's `profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pkcs12Profile {
    LegacyRc2,
    LegacyDes,
    Modern2023,
}

impl Pkcs12Profile {
    /// The profile named as in trust-manager's API (`LegacyRC2`, `LegacyDES`, `Modern2023`).
    pub fn from_api(name: &str) -> Option<Self> {
        match name {
            "LegacyRC2" => Some(Self::LegacyRc2),
            "LegacyDES" => Some(Self::LegacyDes),
            "Modern2023" => Some(Self::Modern2023),
            _ => None,
        }
    }

    /// The name trust-manager's API gives this profile.
    pub fn api_name(self) -> &'static str {
        match self {
            Self::LegacyRc2 => "LegacyRC2",
            Self::LegacyDes => "LegacyDES",
            Self::Modern2023 => "Modern2023",
        }
    }

    fn iterations(self) -> u32 {
        2048
    }

    fn salt_len(self) -> usize {
        match self {
            Self::Modern2023 => 16,
            Self::LegacyRc2 | Self::LegacyDes => 8,
        }
    }
}

/// A PKCS#12 trust store of every certificate of `pool`.
pub fn encode(
    pool: &CertificatePool,
    password: &str,
    profile: Pkcs12Profile,
) -> Result<Vec<u8>, TrustStoreError> {
    let trusted_usage = der::sequence(&[
        &der::oid(JAVA_TRUSTED_KEY_USAGE),
        &der::set_of(vec![der::oid(ANY_EXTENDED_KEY_USAGE)]),
    ]);
    let mut bags = Vec::with_capacity(pool.len());
    for certificate in pool.certificates() {
        let alias = certificate.alias();
        let name = bmp_string(&alias).ok_or(TrustStoreError::NotUcs2 { alias })?;
        let friendly_name = der::sequence(&[
            &der::oid(FRIENDLY_NAME),
            &der::set_of(vec![der::tlv(der::BMP_STRING, &name)]),
        ]);
        let cert_bag = der::sequence(&[
            &der::oid(X509_CERTIFICATE),
            &der::tlv(EXPLICIT_0, &der::octet_string(certificate.der())),
        ]);
        bags.push(der::sequence(&[
            &der::oid(CERT_BAG),
            &der::tlv(EXPLICIT_0, &cert_bag),
            &der::set_of(vec![trusted_usage.clone(), friendly_name]),
        ]));
    }
    let safe_contents = der::tlv(der::SEQUENCE, &bags.concat());

    let (safe, mac) = if password.is_empty() {
        let safe = der::sequence(&[
            &der::oid(DATA),
            &der::tlv(EXPLICIT_0, &der::octet_string(&safe_contents)),
        ]);
        (safe, None)
    } else {
        let encrypted = encrypt(&safe_contents, password, profile)?;
        let safe = der::sequence(&[&der::oid(ENCRYPTED_DATA), &der::tlv(EXPLICIT_0, &encrypted)]);
        (safe, Some(()))
    };
    let authenticated_safe = der::tlv(der::SEQUENCE, &safe);

    let mut pfx = vec![
        der::integer(3),
        der::sequence(&[
            &der::oid(DATA),
            &der::tlv(EXPLICIT_0, &der::octet_string(&authenticated_safe)),
        ]),
    ];
    if mac.is_some() {
        pfx.push(mac_data(&authenticated_safe, password, profile)?);
    }
    Ok(der::tlv(der::SEQUENCE, &pfx.concat()))
}

/// EncryptedData over the SafeContents, with the profile's algorithm and fresh randomness.
fn encrypt(
    plain: &[u8],
    password: &str,
    profile: Pkcs12Profile,
) -> Result<Vec<u8>, TrustStoreError> {
    let salt = random(profile.salt_len())?;
    let iterations = profile.iterations();
    let (algorithm, ciphertext) = match profile {
        Pkcs12Profile::LegacyRc2 | Pkcs12Profile::LegacyDes => {
            let bmp = bmp_password(password)?;
            let kdf = |id, size| {
                pkcs12_kdf(
                    &digest::SHA1_FOR_LEGACY_USE_ONLY,
                    &salt,
                    &bmp,
                    iterations,
                    id,
                    size,
                )
            };
            let iv: [u8; 8] = kdf(2, 8).try_into().expect("eight bytes");
            let (oid, ciphertext) = if profile == Pkcs12Profile::LegacyRc2 {
                let rc2 = rc2::Rc2::new_with_eff_key_len(&kdf(1, 5), 40);
                (PBE_SHA1_RC2_40, cbc_encrypt(&rc2, iv, plain))
            } else {
                let tdes = des::TdesEde3::new_from_slice(&kdf(1, 24))
                    .map_err(|_| TrustStoreError::Crypto)?;
                (PBE_SHA1_3DES, cbc_encrypt(&tdes, iv, plain))
            };
            let parameters = der::sequence(&[&der::octet_string(&salt), &der::integer(iterations)]);
            (der::algorithm(oid, Some(&parameters)), ciphertext)
        }
        Pkcs12Profile::Modern2023 => {
            let iv: [u8; 16] = random(16)?.try_into().expect("sixteen bytes");
            let mut key = [0u8; 32];
            let rounds = NonZeroU32::new(iterations).expect("iterations are positive");
            pbkdf2::derive(
                pbkdf2::PBKDF2_HMAC_SHA256,
                rounds,
                &salt,
                password.as_bytes(),
                &mut key,
            );
            let unbound =
                UnboundCipherKey::new(&AES_256, &key).map_err(|_| TrustStoreError::Crypto)?;
            let aes = PaddedBlockEncryptingKey::cbc_pkcs7(unbound)
                .map_err(|_| TrustStoreError::Crypto)?;
            let mut ciphertext = plain.to_vec();
            aes.less_safe_encrypt(&mut ciphertext, EncryptionContext::Iv128(iv.into()))
                .map_err(|_| TrustStoreError::Crypto)?;
            let kdf = der::algorithm(
                PBKDF2,
                Some(&der::sequence(&[
                    &der::octet_string(&salt),
                    &der::integer(iterations),
                    &der::algorithm(HMAC_SHA256, None),
                ])),
            );
            let scheme = der::algorithm(AES_256_CBC, Some(&der::octet_string(&iv)));
            let parameters = der::sequence(&[&kdf, &scheme]);
            (der::algorithm(PBES2, Some(&parameters)), ciphertext)
        }
    };
    let content_info = der::sequence(&[
        &der::oid(DATA),
        &algorithm,
        &der::tlv(IMPLICIT_0, &ciphertext),
    ]);
    Ok(der::sequence(&[&der::integer(0), &content_info]))
}

/// MacData: an HMAC over the AuthenticatedSafe with a key from the PKCS#12 KDF (id 3). The
/// iteration count is left out when it is 1, its DER default.
fn mac_data(
    authenticated_safe: &[u8],
    password: &str,
    profile: Pkcs12Profile,
) -> Result<Vec<u8>, TrustStoreError> {
    let salt = random(profile.salt_len())?;
    let bmp = bmp_password(password)?;
    let (hash, hmac_algorithm, oid, iterations) = match profile {
        Pkcs12Profile::Modern2023 => (&digest::SHA256, hmac::HMAC_SHA256, SHA256, 2048),
        Pkcs12Profile::LegacyRc2 | Pkcs12Profile::LegacyDes => (
            &digest::SHA1_FOR_LEGACY_USE_ONLY,
            hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            SHA1,
            1,
        ),
    };
    let key = pkcs12_kdf(hash, &salt, &bmp, iterations, 3, hash.output_len());
    let tag = hmac::sign(&hmac::Key::new(hmac_algorithm, &key), authenticated_safe);
    let digest_info =
        der::sequence(&[&der::algorithm(oid, None), &der::octet_string(tag.as_ref())]);
    let mut parts = vec![digest_info, der::octet_string(&salt)];
    if iterations != 1 {
        parts.push(der::integer(iterations));
    }
    Ok(der::tlv(der::SEQUENCE, &parts.concat()))
}

/// RFC 7292 appendix B.2: the key derivation PKCS#12's own PBE and MAC use.
fn pkcs12_kdf(
    hash: &'static digest::Algorithm,
    salt: &[u8],
    password: &[u8],
    iterations: u32,
    id: u8,
    size: usize,
) -> Vec<u8> {
    const V: usize = 64;
    let repeat = |data: &[u8]| -> Vec<u8> {
        let len = data.len().div_ceil(V) * V;
        data.iter().copied().cycle().take(len).collect()
    };
    let mut input = repeat(salt);
    input.extend(repeat(password));
    let diversifier = [id; V];
    let mut out = Vec::with_capacity(size);
    while out.len() < size {
        let mut context = digest::Context::new(hash);
        context.update(&diversifier);
        context.update(&input);
        let mut a = context.finish();
        for _ in 1..iterations {
            a = digest::digest(hash, a.as_ref());
        }
        out.extend_from_slice(a.as_ref());
        let b: Vec<u8> = a.as_ref().iter().copied().cycle().take(V).collect();
        for block in input.chunks_mut(V) {
            // block = (block + b + 1) mod 2^(8V)
            let mut carry = 1u16;
            for (x, y) in block.iter_mut().zip(&b).rev() {
                let sum = u16::from(*x) + u16::from(*y) + carry;
                *x = sum as u8;
                carry = sum >> 8;
            }
        }
    }
    out.truncate(size);
    out
}

/// PKCS#7 padding and CBC with an 8-byte block cipher.
fn cbc_encrypt<C: BlockEncrypt>(cipher: &C, iv: [u8; 8], plain: &[u8]) -> Vec<u8> {
    let pad = 8 - plain.len() % 8;
    let mut data = plain.to_vec();
    data.extend(std::iter::repeat_n(pad as u8, pad));
    let mut previous = iv;
    for chunk in data.chunks_mut(8) {
        for (x, p) in chunk.iter_mut().zip(previous) {
            *x ^= p;
        }
        cipher.encrypt_block(chunk.into());
        previous.copy_from_slice(chunk);
    }
    data
}

/// UCS-2 big-endian, as go-pkcs12 writes names; `None` if a character is outside the BMP.
fn bmp_string(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len() * 2);
    for c in text.chars() {
        let unit = u16::try_from(u32::from(c)).ok()?;
        out.extend_from_slice(&unit.to_be_bytes());
    }
    Some(out)
}

/// The password as the PKCS#12 KDF takes it: UCS-2 with a terminating zero.
fn bmp_password(password: &str) -> Result<Vec<u8>, TrustStoreError> {
    let mut bmp = bmp_string(password).ok_or(TrustStoreError::PasswordNotUcs2)?;
    bmp.extend([0, 0]);
    Ok(bmp)
}

fn random(len: usize) -> Result<Vec<u8>, TrustStoreError> {
    let mut bytes = vec![0; len];
    rand::fill(&mut bytes).map_err(|_| TrustStoreError::Crypto)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kdf_matches_a_known_answer() {
        // From the PKCS#12 KDF test vectors widely used by implementations (password "smeg",
        // salt 0A58CF64530D823F, one iteration, SHA-1): key id 1, 24 bytes.
        let password = bmp_password("smeg").unwrap();
        let salt = [0x0a, 0x58, 0xcf, 0x64, 0x53, 0x0d, 0x82, 0x3f];
        let key = pkcs12_kdf(
            &digest::SHA1_FOR_LEGACY_USE_ONLY,
            &salt,
            &password,
            1,
            1,
            24,
        );
        let hex: String = key.iter().map(|b| format!("{b:02X}")).collect();
        assert_eq!(hex, "8AAAE6297B6CB04642AB5B077851284EB7128F1A2A7FBCA3");
    }

    #[test]
    fn names_outside_the_bmp_are_refused() {
        assert_eq!(bmp_string("ab").unwrap(), [0, b'a', 0, b'b']);
        assert!(bmp_string("emoji \u{1F600}").is_none());
    }
}
