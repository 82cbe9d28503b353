//! ServiceAccount bearer tokens: JWTs signed with HMAC-SHA256 (`HS256`) under a key only the
//! server holds (`pki/serviceaccount.key` in its data directory, or a new one in memory), with
//! kube-apiserver's claims: issuer, subject `system:serviceaccount:NS:NAME`, audiences, issue
//! and expiry times, and under `kubernetes.io` the ServiceAccount's namespace, name and UID, and
//! the Secret or Pod the token is bound to, if any.
//!
//! This module makes and reads tokens and decides whether their claims hold: now
//! ([`Claims::check`]: not expired, for this server's audience) and against the objects they
//! name as stored now ([`ObjectRef::check`]: the same UID, not being deleted). The
//! authenticator reads those objects on every request, so deleting a ServiceAccount (or a bound
//! object), or deleting it and creating another of the same name, revokes its tokens; so does
//! replacing the key.

use std::path::Path;

use aws_lc_rs::hmac;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The issuer of the tokens, and the audience of this server's API (kube-apiserver's defaults
/// for `--service-account-issuer` and `--api-audiences` in most clusters): a token is accepted
/// only if it names this audience.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
pub const API_AUDIENCE: &str = ISSUER;

/// The JOSE header of every token; a token with any other is not one of ours.
const HEADER: &str = r#"{"alg":"HS256","typ":"JWT"}"#;

/// Why a bearer token authenticates nobody. Every one is answered 401 `Unauthorized`, as
/// kube-apiserver answers; the reason is only logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a token signed with this server's key")]
    NotOurs,
    #[error("the token expired at {0} (Unix time)")]
    Expired(i64),
    #[error("the token is not valid before {0} (Unix time)")]
    NotYetValid(i64),
    #[error("the token is not for this server's audience")]
    OtherAudience,
    #[error("the {kind} {name:?} the token names does not exist")]
    Gone { kind: &'static str, name: String },
    #[error(
        "the {kind} {name:?} the token names has been replaced (deleted and created again: its UID differs)"
    )]
    Replaced { kind: &'static str, name: String },
    #[error("the {kind} {name:?} the token names is being deleted")]
    Deleting { kind: &'static str, name: String },
}

/// An object a token names, by name and UID.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    pub name: String,
    pub uid: String,
}

impl ObjectRef {
    /// The name and UID of a stored object.
    pub fn of(object: &Value) -> ObjectRef {
        ObjectRef {
            name: crate::meta::name_of(object).to_string(),
            uid: crate::meta::uid_of(object).to_string(),
        }
    }

    /// Whether `stored`, the object of this name as stored now (a `kind`), is still the one
    /// named: it exists, has the same UID and is not being deleted.
    pub fn check(&self, kind: &'static str, stored: Option<&Value>) -> Result<(), TokenError> {
        let name = || self.name.clone();
        let stored = stored.ok_or_else(|| TokenError::Gone { kind, name: name() })?;
        if self.uid.is_empty() || crate::meta::uid_of(stored) != self.uid {
            return Err(TokenError::Replaced { kind, name: name() });
        }
        if stored.pointer("/metadata/deletionTimestamp").is_some() {
            return Err(TokenError::Deleting { kind, name: name() });
        }
        Ok(())
    }
}

/// The `kubernetes.io` claim: what the token is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubernetesClaims {
    pub namespace: String,
    pub serviceaccount: ObjectRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<ObjectRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ObjectRef>,
}

/// An object a token is bound to: it is valid only while that object exists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Binding {
    Secret(ObjectRef),
    Pod(ObjectRef),
}

/// A token's claims.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    pub iss: String,
    /// `system:serviceaccount:NAMESPACE:NAME`.
    pub sub: String,
    pub aud: Vec<String>,
    /// Issued at, not before and expiry, in seconds since the Unix epoch.
    pub iat: i64,
    pub nbf: i64,
    pub exp: i64,
    /// A random ID, told apart in logs.
    pub jti: String,
    #[serde(rename = "kubernetes.io")]
    pub kubernetes: KubernetesClaims,
}

impl Claims {
    /// The claims of a token for the ServiceAccount `account` (the stored object), issued at
    /// `now`, valid for `lifetime_seconds`, for `audiences`, bound to `binding` if given.
    pub fn new(
        account: &Value,
        audiences: Vec<String>,
        now: i64,
        lifetime_seconds: i64,
        binding: Option<Binding>,
    ) -> Claims {
        let namespace = crate::meta::namespace_of(account).to_string();
        let serviceaccount = ObjectRef::of(account);
        let (secret, pod) = match binding {
            None => (None, None),
            Some(Binding::Secret(secret)) => (Some(secret), None),
            Some(Binding::Pod(pod)) => (None, Some(pod)),
        };
        Claims {
            iss: ISSUER.into(),
            sub: crate::auth::service_account_user(&namespace, &serviceaccount.name),
            aud: audiences,
            iat: now,
            nbf: now,
            exp: now.saturating_add(lifetime_seconds),
            jti: crate::meta::new_uid(),
            kubernetes: KubernetesClaims {
                namespace,
                serviceaccount,
                secret,
                pod,
            },
        }
    }

    /// Whether the claims hold at `now` for a server of `audience`: before the expiry (a token
    /// is not valid at its `exp` second), not before `nbf`, and naming the audience.
    pub fn check(&self, now: i64, audience: &str) -> Result<(), TokenError> {
        if now >= self.exp {
            return Err(TokenError::Expired(self.exp));
        }
        if now < self.nbf {
            return Err(TokenError::NotYetValid(self.nbf));
        }
        if !self.aud.iter().any(|a| a == audience) {
            return Err(TokenError::OtherAudience);
        }
        Ok(())
    }
}

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
            crate::store::private_files::restrict(path)?;
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
        crate::store::private_files::write(path, &STANDARD.encode(secret))?;
        Ok(TokenKey::new(&secret))
    }

    /// The token of `claims`: `header.claims.signature`, each base64url without padding.
    pub fn sign(&self, claims: &Claims) -> String {
        let payload = serde_json::to_vec(claims).expect("claims serialize");
        let signed = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(HEADER),
            URL_SAFE_NO_PAD.encode(payload)
        );
        let tag = hmac::sign(&self.0, signed.as_bytes());
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The claims of a token this key signed (whether they hold is [`Claims::check`]'s
    /// question).
    pub fn read(&self, token: &str) -> Result<Claims, TokenError> {
        let (signed, tag) = token.rsplit_once('.').ok_or(TokenError::NotOurs)?;
        let (header, payload) = signed.split_once('.').ok_or(TokenError::NotOurs)?;
        if header != URL_SAFE_NO_PAD.encode(HEADER) {
            return Err(TokenError::NotOurs);
        }
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| TokenError::NotOurs)?;
        // Constant-time comparison.
        hmac::verify(&self.0, signed.as_bytes(), &tag).map_err(|_| TokenError::NotOurs)?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::NotOurs)?;
        serde_json::from_slice(&payload).map_err(|_| TokenError::NotOurs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_800_000_000;

    fn account(uid: &str) -> Value {
        json!({"metadata": {"namespace": "caretaker-system", "name": "caretaker", "uid": uid}})
    }

    fn claims() -> Claims {
        Claims::new(
            &account("uid-1"),
            vec![API_AUDIENCE.into()],
            NOW,
            3600,
            None,
        )
    }

    #[test]
    fn a_token_carries_its_claims_and_only_its_key_reads_it() {
        let key = TokenKey::new(&[7; 32]);
        let claims = claims();
        let token = key.sign(&claims);
        let read = key.read(&token).unwrap();
        assert_eq!(read, claims);
        assert_eq!(read.sub, "system:serviceaccount:caretaker-system:caretaker");
        assert_eq!(
            read.kubernetes.serviceaccount,
            ObjectRef {
                name: "caretaker".into(),
                uid: "uid-1".into()
            }
        );
        assert_eq!((read.iat, read.exp), (NOW, NOW + 3600));
        assert_eq!(
            TokenKey::new(&[8; 32]).read(&token),
            Err(TokenError::NotOurs)
        );
    }

    #[test]
    fn a_forged_or_altered_token_is_refused() {
        let key = TokenKey::new(&[7; 32]);
        let token = key.sign(&claims());
        let parts: Vec<&str> = token.split('.').collect();
        // The same signature on other claims: a longer life, another account.
        let mut forged = claims();
        forged.exp = NOW + 10 * 365 * 86400;
        forged.kubernetes.serviceaccount.uid = "uid-2".into();
        let forged = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).unwrap());
        assert_eq!(
            key.read(&format!("{}.{forged}.{}", parts[0], parts[2])),
            Err(TokenError::NotOurs)
        );
        // Another algorithm named in the header, with or without a signature.
        let none = URL_SAFE_NO_PAD.encode(r#"{"alg":"none","typ":"JWT"}"#);
        for bad in [
            "",
            ".",
            "..",
            "caretaker-no-auth",
            &format!("{none}.{}.", parts[1]),
            &format!("{none}.{}.{}", parts[1], parts[2]),
            &format!("{token}.extra"),
            &format!("{}.{}.AAAA", parts[0], parts[1]),
            &format!("{}.{}", parts[0], parts[1]),
        ] {
            assert_eq!(key.read(bad), Err(TokenError::NotOurs), "{bad:?}");
        }
    }

    #[test]
    fn claims_hold_until_the_expiry_second_and_only_for_this_servers_audience() {
        let claims = claims();
        assert_eq!(claims.check(NOW, API_AUDIENCE), Ok(()));
        assert_eq!(claims.check(NOW + 3599, API_AUDIENCE), Ok(()));
        assert_eq!(
            claims.check(NOW + 3600, API_AUDIENCE),
            Err(TokenError::Expired(NOW + 3600))
        );
        assert_eq!(
            claims.check(NOW - 1, API_AUDIENCE),
            Err(TokenError::NotYetValid(NOW))
        );
        let vault = Claims::new(&account("uid-1"), vec!["vault".into()], NOW, 3600, None);
        assert_eq!(
            vault.check(NOW, API_AUDIENCE),
            Err(TokenError::OtherAudience)
        );
    }

    #[test]
    fn a_named_object_must_be_the_same_one_and_not_going() {
        let named = ObjectRef::of(&account("uid-1"));
        assert_eq!(
            named.check("ServiceAccount", Some(&account("uid-1"))),
            Ok(())
        );
        let gone = TokenError::Gone {
            kind: "ServiceAccount",
            name: "caretaker".into(),
        };
        assert_eq!(named.check("ServiceAccount", None), Err(gone));
        // Deleted and created again under the same name: another UID.
        assert!(matches!(
            named.check("ServiceAccount", Some(&account("uid-2"))),
            Err(TokenError::Replaced { .. })
        ));
        let mut deleting = account("uid-1");
        deleting["metadata"]["deletionTimestamp"] = json!("2027-01-01T00:00:00Z");
        assert!(matches!(
            named.check("ServiceAccount", Some(&deleting)),
            Err(TokenError::Deleting { .. })
        ));
        // A reference without a UID names nothing.
        let no_uid = ObjectRef {
            name: "caretaker".into(),
            uid: String::new(),
        };
        assert!(matches!(
            no_uid.check("ServiceAccount", Some(&account(""))),
            Err(TokenError::Replaced { .. })
        ));
    }
}
