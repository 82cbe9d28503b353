//! Which objects a controller may write: its own, absent ones, and those handed over to it
//! ([`crate::ownership`]), read from their metadata.

use kube::Resource;
use kube::api::ObjectMeta;

use super::Key;
use crate::ownership::{self, Claim, Owner};
use caretaker_api::names;

/// Whether `owner` may write the `kind` at `key`, `meta` when it exists
/// ([`ownership::claim_by`]).
pub(crate) fn claim(owner: &Owner, kind: &str, key: &Key, meta: Option<&ObjectMeta>) -> Claim {
    let Some(meta) = meta else {
        return Claim::Create;
    };
    let annotations = meta.annotations.as_ref();
    ownership::claim_by(
        owner,
        kind,
        &format!("{}/{}", key.0, key.1),
        controller(meta),
        |name| annotations?.get(name).map(String::as_str),
    )
}

/// The kind and name of an object's controller owner reference.
pub(crate) fn controller(meta: &ObjectMeta) -> Option<(&str, &str)> {
    let references = meta.owner_references.as_deref()?;
    let controller = references.iter().find(|r| r.controller == Some(true))?;
    Some((controller.kind.as_str(), controller.name.as_str()))
}

/// Why an object may not write its Secrets and ConfigMaps, from their `claims`: the reason
/// of the first refused (another's before someone's), and every refusal's message.
pub(crate) fn refusal(claims: &[Claim]) -> Option<(&'static str, String)> {
    let refused: Vec<(&'static str, &str)> = (claims.iter())
        .filter_map(|claim| match claim {
            Claim::Refused { reason, message } => Some((*reason, message.as_str())),
            _ => None,
        })
        .collect();
    let reason = (refused.iter())
        .map(|(reason, _)| *reason)
        .find(|reason| *reason == names::REASON_OBJECT_IN_USE)
        .or(refused.first().map(|(reason, _)| *reason))?;
    let messages: Vec<&str> = refused.iter().map(|(_, message)| *message).collect();
    Some((reason, messages.join("; ")))
}

/// Why the existing `kind` at `key` (`meta`) is not known to hold what `owner` wrote (its
/// content is then not `owner`'s to use: a CA to sign with, a bundle); `None` when it is.
pub(crate) fn not_owned(owner: &Owner, kind: &str, key: &Key, meta: &ObjectMeta) -> Option<String> {
    match claim(owner, kind, key, Some(meta)) {
        Claim::Own => None,
        Claim::Refused { message, .. } => Some(message),
        Claim::Create | Claim::Adopt => Some(format!(
            "{kind} {}/{} is not yet {owner}'s (it is handed over at its next write)",
            key.0, key.1
        )),
    }
}

/// The object a Secret or ConfigMap is written for, as its mark names it.
pub(crate) fn owner_of<K: Resource<DynamicType = ()>>(object: &K) -> Owner {
    let meta = object.meta();
    Owner::new(
        K::kind(&()),
        meta.namespace.as_deref(),
        meta.name.clone().unwrap_or_default(),
        meta.uid.clone().unwrap_or_default(),
    )
}
