//! Java KeyStore (JKS) trust stores, written byte for byte as trust-manager writes them.
//!
//! Layout (keystore-go v4, which trust-manager uses with ordered aliases): magic `FEEDFEED`,
//! version 2, the entry count, then per certificate in alias order a trusted-certificate entry
//! (tag 2, the alias, its creation time in Unix milliseconds, type `X509`, the DER), and last a
//! SHA-1 over the password (each byte after a zero byte, as UTF-16BE of ASCII), the words
//! `Mighty Aphrodite` and everything before it: Java's integrity check. Aliases are lowercased
//! and sorted; the creation time is the certificate's notBefore, so the output depends only on
//! the certificates and the password.

use aws_lc_rs::digest;

use crate::pool::CertificatePool;

const MAGIC: u32 = 0xFEED_FEED;
const VERSION: u32 = 2;
const TRUSTED_CERTIFICATE: u32 = 2;
const WHITENER: &[u8] = b"Mighty Aphrodite";

/// A JKS trust store of every certificate of `pool`, protected by `password`.
pub fn encode(pool: &CertificatePool, password: &str) -> Vec<u8> {
    let mut entries: Vec<(String, &crate::pool::PooledCertificate)> = pool
        .certificates()
        .map(|certificate| (certificate.alias().to_lowercase(), certificate))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));

    let mut out = Vec::with_capacity(64 + entries.len() * 1200);
    out.extend_from_slice(&MAGIC.to_be_bytes());
    out.extend_from_slice(&VERSION.to_be_bytes());
    out.extend_from_slice(&(entries.len() as u32).to_be_bytes());
    for (alias, certificate) in &entries {
        out.extend_from_slice(&TRUSTED_CERTIFICATE.to_be_bytes());
        write_string(&mut out, alias);
        let millis = certificate.not_before().unix_timestamp_nanos() / 1_000_000;
        out.extend_from_slice(&(millis as u64).to_be_bytes());
        write_string(&mut out, "X509");
        out.extend_from_slice(&(certificate.der().len() as u32).to_be_bytes());
        out.extend_from_slice(certificate.der());
    }

    let mut sha1 = digest::Context::new(&digest::SHA1_FOR_LEGACY_USE_ONLY);
    let password_bytes: Vec<u8> = password.bytes().flat_map(|b| [0, b]).collect();
    sha1.update(&password_bytes);
    sha1.update(WHITENER);
    sha1.update(&out);
    out.extend_from_slice(sha1.finish().as_ref());
    out
}

/// A length-prefixed string as keystore-go writes it (u16 length, then the bytes). Aliases longer
/// than 65,535 bytes cannot occur: a subject that long would not fit a certificate either.
fn write_string(out: &mut Vec<u8>, text: &str) {
    let bytes = &text.as_bytes()[..text.len().min(u16::MAX as usize)];
    out.extend_from_slice(&(bytes.len() as u16).to_be_bytes());
    out.extend_from_slice(bytes);
}
