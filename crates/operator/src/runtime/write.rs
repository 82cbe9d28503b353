//! Writes of the objects a pass decides on (Secrets, ConfigMaps), each on the version the pass
//! read: a create never overwrites an object that appeared meanwhile, a patch applies only to
//! the version read. [`StepWriter`] carries out a plan's writes in order and stops at the first
//! conflict.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::{ByteString, NamespaceResourceScope};
use kube::Resource;
use kube::api::{Api, ObjectMeta, PartialObjectMeta, Patch, PatchParams, PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::Key;
use crate::Error;
use crate::changes::{AnnotationChanges, KeyChanges};
use crate::context::create_for_metadata;
use crate::ownership::Owner;
use caretaker_api::names::{self, SECRET_TYPE_TLS};

/// The field manager of caretaker's writes, as `managedFields` show it.
const FIELD_MANAGER: &str = "caretaker";

/// The key of a namespaced object.
pub(crate) fn key_of(meta: &ObjectMeta) -> Key {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// A Secret's `data` and annotations, as the decisions read them.
pub(crate) fn secret_content(
    secret: &Secret,
) -> (BTreeMap<String, Vec<u8>>, BTreeMap<String, String>) {
    (
        secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
        secret.metadata.annotations.clone().unwrap_or_default(),
    )
}

/// A ConfigMap's `data` and annotations, as the decisions read them.
pub(crate) fn config_map_content(
    config_map: &ConfigMap,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    (
        config_map.data.clone().unwrap_or_default(),
        config_map.metadata.annotations.clone().unwrap_or_default(),
    )
}

/// The outcome of a write.
pub(crate) enum Written {
    /// Written; the object's new `resourceVersion`.
    Done(String),
    /// Refused because the object changed (or appeared, or went) since it was read: its watch
    /// event brings a new pass.
    Conflict,
}

fn outcome<K: Resource>(
    result: Result<K, kube::Error>,
    gone_is_conflict: bool,
) -> Result<Written, Error> {
    match result {
        Ok(object) => Ok(Written::Done(
            object.meta().resource_version.clone().unwrap_or_default(),
        )),
        Err(kube::Error::Api(e)) if e.code == 409 || (gone_is_conflict && e.code == 404) => {
            Ok(Written::Conflict)
        }
        Err(e) => Err(e.into()),
    }
}

/// Creates the Secret `key` (type `kubernetes.io/tls`) for `owner` when `version` is `None`,
/// else merge-patches its `data` and annotations on `version`.
pub(crate) async fn write_secret(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    data: &KeyChanges,
    annotations: &AnnotationChanges,
) -> Result<Written, Error> {
    let changes = data.iter().map(|(k, v)| (k.to_string(), v)).collect();
    let typed = (SECRET_TYPE_TLS, changes);
    write_typed_secret(client, owner, key, version, typed, annotations).await
}

/// Creates the Secret `key` of `type_` for `owner` with the values `changes` sets when
/// `version` is `None`, else merge-patches them (a `None` removes its key) and the
/// annotations on `version`.
async fn write_typed_secret(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    (type_, changes): (&str, Vec<(String, Option<&str>)>),
    annotations: &AnnotationChanges,
) -> Result<Written, Error> {
    let secret = |metadata| Secret {
        metadata,
        type_: Some(type_.into()),
        data: Some(
            (changes.iter())
                .filter_map(|(k, v)| Some((k.clone(), ByteString((*v)?.as_bytes().to_vec()))))
                .collect(),
        ),
        ..Default::default()
    };
    let patch = (changes.iter())
        .map(|(k, v)| {
            let value = v.map_or(Value::Null, |v| Value::String(STANDARD.encode(v)));
            (k.clone(), value)
        })
        .collect();
    create_or_patch(client, owner, key, version, annotations, secret, patch).await
}

/// Creates the ConfigMap `key` for `owner` when `version` is `None`, else merge-patches its
/// `data` and annotations on `version`.
pub(crate) async fn write_config_map(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    data: &BTreeMap<&'static str, String>,
    annotations: &AnnotationChanges,
) -> Result<Written, Error> {
    let config_map = |metadata| ConfigMap {
        metadata,
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        ),
        ..Default::default()
    };
    let patch = data
        .iter()
        .map(|(k, v)| (k.to_string(), Value::String(v.clone())))
        .collect();
    create_or_patch(client, owner, key, version, annotations, config_map, patch).await
}

/// Creates the ConfigMap `key` for `owner` with `data` when `version` is `None`, else
/// replaces its data on `version`: the keys of `stored` (those it holds) not in `data` are
/// removed.
pub(crate) async fn write_replaced_config_map(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    (data, stored): (&BTreeMap<String, String>, &[String]),
) -> Result<Written, Error> {
    let config_map = |metadata| ConfigMap {
        metadata,
        data: Some(data.clone()),
        ..Default::default()
    };
    let set = data
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())));
    let removed = (stored.iter())
        .filter(|k| !data.contains_key(*k))
        .map(|k| (k.clone(), Value::Null));
    let patch = set.chain(removed).collect();
    let annotations = AnnotationChanges::default();
    create_or_patch(client, owner, key, version, &annotations, config_map, patch).await
}

/// Creates the Secret `key` (type Opaque) for `owner` with `data` when `version` is `None`,
/// else replaces its data on `version`: the keys of `stored` (those it holds) not in `data`
/// are removed.
pub(crate) async fn write_opaque_secret(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    (data, stored, annotations): (&BTreeMap<String, String>, &[String], &AnnotationChanges),
) -> Result<Written, Error> {
    let set = data.iter().map(|(k, v)| (k.clone(), Some(v.as_str())));
    let removed = (stored.iter())
        .filter(|k| !data.contains_key(*k))
        .map(|k| (k.clone(), None));
    let typed = ("Opaque", set.chain(removed).collect());
    write_typed_secret(client, owner, key, version, typed, annotations).await
}

/// Creates `key` as `object` makes it from its metadata (name, namespace, the label
/// [`names::MANAGED_BY`], `owner`'s mark [`names::OWNER`], the annotations set) when
/// `version` is `None`, else merge-patches `data`, the label, the mark (removing an adoption
/// request, [`names::ADOPT`]) and the annotation changes on `version`. A create is a create:
/// an object that appeared since the pass read none is never overwritten (409,
/// [`Written::Conflict`]: the next pass observes it); a patch applies only to the version the
/// pass decided on, whose [`claim`] allowed it.
pub(crate) async fn create_or_patch<K>(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: Option<&str>,
    annotations: &AnnotationChanges,
    object: impl FnOnce(ObjectMeta) -> K,
    data: serde_json::Map<String, Value>,
) -> Result<Written, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), &key.0);
    let mut annotations = annotations.clone();
    annotations
        .set(names::OWNER, owner.mark())
        .remove(names::ADOPT);
    match version {
        None => {
            let mut written = BTreeMap::new();
            annotations.apply_to(&mut written);
            let (label, value) = names::MANAGED_BY;
            let object = object(ObjectMeta {
                name: Some(key.1.clone()),
                namespace: Some(key.0.clone()),
                labels: Some(BTreeMap::from([(label.to_string(), value.to_string())])),
                annotations: (!written.is_empty()).then_some(written),
                ..Default::default()
            });
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..Default::default()
            };
            // Answered with the metadata alone, as a patch is below.
            outcome(
                create_for_metadata(client, &api, &params, &object).await,
                false,
            )
        }
        Some(version) => {
            // The label too: an object an earlier caretaker wrote without it gets it.
            let (label, value) = names::MANAGED_BY;
            let body = json!({
                "metadata": {
                    "resourceVersion": version,
                    "labels": { label: value },
                    "annotations": annotations.to_json(),
                },
                "data": data,
            });
            // Answered with the metadata alone: only its resourceVersion is used.
            let api: Api<PartialObjectMeta<K>> = Api::namespaced(client.clone(), &key.0);
            outcome(
                api.patch(&key.1, &patch_params(), &Patch::Merge(&body))
                    .await,
                true,
            )
        }
    }
}

/// Adopts `key` for `owner` ([`Claim::Adopt`]): writes the mark alone (and removes the
/// adoption request) on `version`, the version whose claim was read. Its content is kept: the
/// next pass reads it as `owner`'s.
pub(crate) async fn adopt<K>(
    client: &kube::Client,
    owner: &Owner,
    key: &Key,
    version: &str,
) -> Result<Written, Error>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + fmt::Debug,
{
    let unchanged = AnnotationChanges::default();
    let never = |_| -> K { unreachable!("an adopted object exists") };
    create_or_patch(
        client,
        owner,
        key,
        Some(version),
        &unchanged,
        never,
        Default::default(),
    )
    .await
}

pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::ResourceExt;

    use super::*;

    /// A write of an object the pass found absent is a create, never a patch or a replace:
    /// an object that appeared meanwhile (someone's, here) is left exactly as it is, and the
    /// outcome is a conflict (the next pass observes it). A re-created CA Secret and a first
    /// certificate Secret are written this way.
    #[tokio::test]
    async fn a_write_of_an_absent_object_never_overwrites_one_that_appeared() {
        let server = caretaker_apiserver::TestServer::start().await;
        let client = server.client();
        let key: Key = ("default".into(), "appeared".into());
        let secrets: Api<Secret> = Api::namespaced(client.clone(), &key.0);
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), &key.0);
        let theirs: Secret = serde_json::from_value(json!({
            "metadata": { "name": "appeared" },
            "data": { "password": STANDARD.encode("hunter2") },
        }))
        .unwrap();
        let theirs = secrets
            .create(&PostParams::default(), &theirs)
            .await
            .unwrap();
        let theirs_map: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": "appeared" }, "data": { "ca-bundle.crt": "theirs" },
        }))
        .unwrap();
        let theirs_map = config_maps
            .create(&PostParams::default(), &theirs_map)
            .await
            .unwrap();

        let mut data = KeyChanges::default();
        data.set("tls.crt", "new").set("tls.key", "new");
        let mut annotations = AnnotationChanges::default();
        annotations.set(names::CERTIFICATE_ISSUER, "webhooks-ca");
        let owner = Owner::new("IssuedCertificate", Some("default"), "web", "u1");
        let written = write_secret(&client, &owner, &key, None, &data, &annotations).await;
        assert!(matches!(written, Ok(Written::Conflict)));
        let bundle = BTreeMap::from([("ca-bundle.crt", "new".to_string())]);
        let written = write_config_map(&client, &owner, &key, None, &bundle, &annotations).await;
        assert!(matches!(written, Ok(Written::Conflict)));
        assert_eq!(secrets.get("appeared").await.unwrap(), theirs);
        assert_eq!(config_maps.get("appeared").await.unwrap(), theirs_map);

        // Absent, it is created, with the label and its owner's mark.
        secrets
            .delete("appeared", &Default::default())
            .await
            .unwrap();
        let written = write_secret(&client, &owner, &key, None, &data, &annotations).await;
        assert!(matches!(written, Ok(Written::Done(_))));
        let created = secrets.get("appeared").await.unwrap();
        assert_eq!(created.type_.as_deref(), Some(SECRET_TYPE_TLS));
        assert_eq!(
            created
                .labels()
                .get(names::MANAGED_BY.0)
                .map(String::as_str),
            Some(names::MANAGED_BY.1)
        );
        assert_eq!(
            created.annotations().get(names::OWNER),
            Some(&"IssuedCertificate/default/web/u1".to_string())
        );

        // A patch keeps the mark, and uses up an adoption request.
        let version = created.resource_version().unwrap();
        let request = json!({ "metadata": { "annotations": { names::ADOPT: "IssuedCertificate/default/web" } } });
        let requested = secrets
            .patch("appeared", &PatchParams::default(), &Patch::Merge(&request))
            .await
            .unwrap();
        assert_ne!(requested.resource_version().unwrap(), version);
        let version = requested.resource_version().unwrap();
        let written = adopt::<Secret>(&client, &owner, &key, &version).await;
        assert!(matches!(written, Ok(Written::Done(_))));
        let adopted = secrets.get("appeared").await.unwrap();
        assert!(!adopted.annotations().contains_key(names::ADOPT));
        assert_eq!(adopted.data, created.data, "adoption writes the mark alone");
    }
}
