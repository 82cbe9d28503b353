//! `etcd-all-certs` as it must be: every member's certificates and both bundles, under a
//! revision that hashes them.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::policy::MemberSpec;
use super::{AllCerts, Role, Signer, member_secret};

/// `etcd-all-certs` from every member's certificates and the bundles; `None` until every
/// member has all three and both bundles exist.
pub(super) fn desired_all_certs(
    members: &[MemberSpec],
    leaves: &BTreeMap<String, (String, String)>,
    bundles: &BTreeMap<Signer, String>,
) -> Option<AllCerts> {
    let mut data = BTreeMap::new();
    for member in members {
        for role in Role::MEMBER {
            let name = member_secret(role, &member.name);
            let (crt, key) = leaves.get(&name)?;
            data.insert(format!("{name}.crt"), crt.clone());
            data.insert(format!("{name}.key"), key.clone());
        }
    }
    for signer in Signer::ALL {
        data.insert(
            signer.all_certs_key().to_string(),
            bundles.get(&signer)?.clone(),
        );
    }
    Some(AllCerts {
        revision: revision_of(&data),
        data,
    })
}

/// A revision: the first 16 hex digits of SHA-256 over every key and value, in key order.
pub fn revision_of(data: &BTreeMap<String, String>) -> String {
    let mut hash = Sha256::new();
    for (key, value) in data {
        hash.update(key.as_bytes());
        hash.update([0]);
        hash.update(value.as_bytes());
        hash.update([0]);
    }
    hash.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a new revision changes, by key (never a value).
pub(super) fn change_of(
    old: Option<&BTreeMap<String, String>>,
    new: &BTreeMap<String, String>,
) -> String {
    let Some(old) = old else {
        return "the first revision".into();
    };
    let mut parts = Vec::new();
    let names = |keys: Vec<&String>| {
        keys.iter()
            .map(|k| k.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let added: Vec<&String> = new.keys().filter(|k| !old.contains_key(*k)).collect();
    let removed: Vec<&String> = old.keys().filter(|k| !new.contains_key(*k)).collect();
    let changed: Vec<&String> = new
        .iter()
        .filter(|(k, v)| old.get(*k).is_some_and(|o| o != *v))
        .map(|(k, _)| k)
        .collect();
    for (what, keys) in [("added", added), ("removed", removed), ("changed", changed)] {
        if !keys.is_empty() {
            parts.push(format!("{what} {}", names(keys)));
        }
    }
    parts.join("; ")
}
