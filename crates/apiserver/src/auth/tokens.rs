//! ServiceAccount bearer tokens: `caretaker-sa.<namespace/name, base64url>.<HMAC-SHA256 of it>`,
//! made and checked with a key only the server holds (`pki/serviceaccount.key` in its data
//! directory). A token names a ServiceAccount and nothing else: no expiry, no audience. It stops
//! working when its ServiceAccount is deleted (the server checks that it exists on every request)
//! or when the key is replaced.

use std::path::Path;

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

const PREFIX: &str = "caretaker-sa";

/// The key tokens are signed with.
pub struct TokenKey(hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(…)")
    }
}

impl TokenKey {
    /// 32 bytes of key material.
    pub fn new(secret: &[u8]) -> TokenKey {
        TokenKey(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    fn random_secret() -> std::io::Result<[u8; 32]> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| std::io::Error::other(e.to_string()))?;
        Ok(secret)
    }

    /// A new random key, for a server that keeps nothing on disk.
    pub fn generate() -> std::io::Result<TokenKey> {
        Ok(TokenKey::new(&Self::random_secret()?))
    }

    /// The key in `path` (base64, owner-only), made there first if it does not exist.
    pub fn load_or_generate(path: &Path) -> std::io::Result<TokenKey> {
        use base64::engine::general_purpose::STANDARD;
        if path.exists() {
            crate::private_files::restrict(path)?;
            let text = std::fs::read_to_string(path)?;
            let secret = STANDARD
                .decode(text.trim())
                .map_err(|_| std::io::Error::other(format!("{} is not base64", path.display())))?;
            if secret.len() < 32 {
                return Err(std::io::Error::other(format!(
                    "{} holds {} bytes; a token key needs 32",
                    path.display(),
                    secret.len()
                )));
            }
            return Ok(TokenKey::new(&secret));
        }
        let secret = Self::random_secret()?;
        crate::private_files::write(path, &STANDARD.encode(secret))?;
        Ok(TokenKey::new(&secret))
    }

    /// A token for the ServiceAccount `namespace`/`name`.
    pub fn token_for(&self, namespace: &str, name: &str) -> String {
        let subject = format!("{namespace}/{name}");
        let tag = hmac::sign(&self.0, subject.as_bytes());
        format!(
            "{PREFIX}.{}.{}",
            URL_SAFE_NO_PAD.encode(&subject),
            URL_SAFE_NO_PAD.encode(tag.as_ref())
        )
    }

    /// The (namespace, name) a token was made for, if this key made it.
    pub fn verify(&self, token: &str) -> Option<(String, String)> {
        let mut parts = token.split('.');
        let (Some(PREFIX), Some(subject), Some(tag), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let subject = URL_SAFE_NO_PAD.decode(subject).ok()?;
        let tag = URL_SAFE_NO_PAD.decode(tag).ok()?;
        // Constant-time comparison.
        hmac::verify(&self.0, &subject, &tag).ok()?;
        let subject = String::from_utf8(subject).ok()?;
        let (namespace, name) = subject.split_once('/')?;
        Some((namespace.to_string(), name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_names_its_service_account_and_only_its_key_accepts_it() {
        let key = TokenKey::new(&[7; 32]);
        let token = key.token_for("caretaker-system", "caretaker");
        assert_eq!(
            key.verify(&token),
            Some(("caretaker-system".into(), "caretaker".into()))
        );
        assert_eq!(TokenKey::new(&[8; 32]).verify(&token), None);
    }

    #[test]
    fn a_forged_or_altered_token_is_refused() {
        let key = TokenKey::new(&[7; 32]);
        let token = key.token_for("team", "reader");
        let parts: Vec<&str> = token.split('.').collect();
        // The same signature on another subject.
        let other = URL_SAFE_NO_PAD.encode("kube-system/admin");
        assert_eq!(
            key.verify(&format!("{}.{other}.{}", parts[0], parts[2])),
            None
        );
        for bad in [
            "",
            "caretaker-sa",
            "caretaker-sa..",
            "caretaker-no-auth",
            &format!("{token}.extra"),
            &format!("{}.{}.AAAA", parts[0], parts[1]),
            &token.replace("caretaker-sa", "other"),
        ] {
            assert_eq!(key.verify(bad), None, "{bad:?}");
        }
    }
}
