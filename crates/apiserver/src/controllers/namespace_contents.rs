//! kube-controller-manager's ServiceAccount controller and root-CA publisher: every namespace
//! not being deleted holds a `default` ServiceAccount and a `kube-root-ca.crt` ConfigMap whose
//! `ca.crt` is the CA clients verify the server with. Both are made again when deleted, and the
//! ConfigMap's data put back when someone changes it, as upstream does.

use serde_json::{Value, json};

use crate::api::ApiState;
use crate::error::ApiError;
use crate::meta::is_deleting;
use crate::store::storage::{Change, ChangeType};

pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
/// The key of the CA bundle in the ConfigMap.
const CA_KEY: &str = "ca.crt";
/// kube-controller-manager's annotation of the ConfigMap, word for word.
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters.";

/// The namespace whose contents a change may have to be made whole again: a namespace that was
/// written, or one whose `default` ServiceAccount went or whose root CA ConfigMap went or
/// changed.
pub fn namespace_to_check(change: &Change) -> Option<&str> {
    let key = &change.key;
    let deleted = change.kind == ChangeType::Deleted;
    match key.resource.as_str() {
        "/namespaces" if !deleted => Some(key.name.as_str()),
        "/serviceaccounts" if deleted && key.name == DEFAULT_SERVICE_ACCOUNT => {
            Some(key.namespace.as_str())
        }
        "/configmaps" if key.name == ROOT_CA_CONFIG_MAP => Some(key.namespace.as_str()),
        _ => None,
    }
}

/// The root CA ConfigMap `ca_pem` makes.
fn root_ca_config_map(ca_pem: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ROOT_CA_CONFIG_MAP,
            "annotations": {"kubernetes.io/description": DESCRIPTION},
        },
        "data": {CA_KEY: ca_pem},
    })
}

/// Makes `namespace` hold both, unless it is gone or going.
pub async fn ensure(api: &ApiState, namespace: &str, ca_pem: &str) -> Result<(), ApiError> {
    let core = |plural: &str| {
        api.registry
            .lookup("", "v1", plural)
            .ok_or_else(ApiError::unknown_resource)
    };
    let namespaces = core("namespaces")?;
    match api.store.get(&ApiState::key(&namespaces, "", namespace))? {
        Some(ns) if !is_deleting(&ns) => {}
        _ => return Ok(()),
    }
    let accounts = core("serviceaccounts")?;
    let account = ApiState::key(&accounts, namespace, DEFAULT_SERVICE_ACCOUNT);
    if api.store.get(&account)?.is_none() {
        let body = json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT_SERVICE_ACCOUNT}});
        ignore_taken(
            api.create(&accounts, namespace, body, &super::writer())
                .await,
        )?;
    }
    let config_maps = core("configmaps")?;
    let key = ApiState::key(&config_maps, namespace, ROOT_CA_CONFIG_MAP);
    let wanted = root_ca_config_map(ca_pem);
    match api.store.get(&key)? {
        None => {
            ignore_taken(
                api.create(&config_maps, namespace, wanted, &super::writer())
                    .await,
            )?;
        }
        Some(stored) if stored.get("data") != wanted.get("data") => {
            let mut repaired = config_maps.served(&stored);
            repaired["data"] = wanted["data"].clone();
            let writer = super::writer();
            let update = api.update(
                &config_maps,
                namespace,
                ROOT_CA_CONFIG_MAP,
                repaired,
                crate::api::Part::Main,
                &writer,
            );
            super::ignore_conflict(update.await)?;
        }
        Some(_) => {}
    }
    Ok(())
}

/// Every namespace's contents made whole (at start, and after falling behind the changes).
pub async fn ensure_everywhere(api: &ApiState, ca_pem: &str) -> Result<(), ApiError> {
    let (namespaces, _) = api.store.list("/namespaces", None, None)?;
    for ns in &namespaces {
        ensure(api, crate::meta::name_of(ns), ca_pem).await?;
    }
    Ok(())
}

/// Someone else made it first (or the namespace went meanwhile): nothing left to do.
fn ignore_taken<T>(r: Result<T, ApiError>) -> Result<(), ApiError> {
    match r {
        Err(e) if e.code == 409 || e.code == 404 => Ok(()),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::storage::ObjectKey;

    fn change(resource: &str, namespace: &str, name: &str, kind: ChangeType) -> Change {
        Change {
            rv: 1,
            key: ObjectKey {
                resource: resource.into(),
                namespace: namespace.into(),
                name: name.into(),
            },
            kind,
            object: Arc::new(json!({})),
            previous: None,
            encoded: Default::default(),
        }
    }

    #[test]
    fn what_sends_the_controllers_to_a_namespace() {
        use ChangeType::*;
        let cases = [
            (change("/namespaces", "", "team", Added), Some("team")),
            (change("/namespaces", "", "team", Deleted), None),
            (
                change("/serviceaccounts", "team", "default", Deleted),
                Some("team"),
            ),
            (
                change("/serviceaccounts", "team", "default", Modified),
                None,
            ),
            (change("/serviceaccounts", "team", "builder", Deleted), None),
            (
                change("/configmaps", "team", "kube-root-ca.crt", Modified),
                Some("team"),
            ),
            (
                change("/configmaps", "team", "kube-root-ca.crt", Deleted),
                Some("team"),
            ),
            (change("/configmaps", "team", "other", Deleted), None),
        ];
        for (change, wanted) in &cases {
            assert_eq!(namespace_to_check(change), *wanted, "{:?}", change.key);
        }
    }
}
