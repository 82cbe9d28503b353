//! Status writes and what this process remembers of them: conditions as the API shows them,
//! a status written only when it changed (and not again while the store shows the version
//! before this process's write), the Degraded message each object's last pass gave it (a
//! Warning is said once per problem), and [`refuse`]: a pass that acts on nothing shows why.

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use kube::api::{Api, Patch};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::lock;
use super::write::patch_params;
use crate::Error;
use crate::changes::Condition;
use crate::context::send_for_metadata;
use crate::timestamp::format_time;
use caretaker_api::v1alpha1;

/// What a controller's passes last said in their objects' statuses, in this process.
#[derive(Default)]
pub(crate) struct Statuses {
    /// What each object's last pass said was wrong with it.
    pub degraded: DegradedMemory,
    /// What each object's last status write said, until the store shows it.
    pub written: StatusMemory,
}

/// The Degraded message (or none) each object's last pass in this process gave its status,
/// with the object's uid. The next pass may read a status from before that write: it must not
/// say the same Warning again.
#[derive(Default)]
pub(crate) struct DegradedMemory(Mutex<HashMap<String, (String, Option<String>)>>);

impl DegradedMemory {
    /// What was last said to be wrong with `object` (the Degraded message a Warning told): what
    /// its last pass in this process decided, else `read`, the message in the status it was
    /// read with. Each kind finds its Degraded message in its own conditions, so callers pass
    /// messages.
    pub(crate) fn reported<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        read: Option<&str>,
    ) -> Option<String> {
        let meta = object.meta();
        match lock(&self.0).get(&Self::key(object)) {
            Some((uid, message)) if meta.uid.as_ref() == Some(uid) => message.clone(),
            _ => read.map(str::to_string),
        }
    }

    /// Remembers the Degraded message a pass gives `object`'s status (`now`), which its
    /// Warnings said; `read`: the message in the status it was read with.
    pub(crate) fn remember<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        read: Option<&str>,
        now: Option<&str>,
    ) {
        let mut memory = lock(&self.0);
        let key = Self::key(object);
        // Nothing wrong, before or now: a pass that reads the status before this write reads
        // that too, so there is nothing to remember (thousands of healthy objects).
        if now.is_none() && read.is_none() && !memory.contains_key(&key) {
            return;
        }
        let uid = object.meta().uid.clone().unwrap_or_default();
        memory.insert(key, (uid, now.map(str::to_string)));
    }

    pub(crate) fn forget<K: Resource<DynamicType = ()>>(&self, namespace: &str, name: &str) {
        lock(&self.0).remove(&format!("{}/{namespace}/{name}", K::kind(&())));
    }

    fn key<K: Resource<DynamicType = ()>>(object: &K) -> String {
        let namespace = object.meta().namespace.as_deref().unwrap_or("");
        format!("{}/{namespace}/{}", K::kind(&()), object.name_any())
    }
}

/// The status each object's last write in this process gave it, with the object's
/// `resourceVersion` before that write, until a pass reads the object as it is after. A pass
/// that starts before the watch brings the write compares with the status before it, and
/// would write the same status again. An entry stays until then (the watch bringing the write
/// is not enough: a pass may have read the object just before), so entries are digests, a few
/// bytes for each of thousands of certificates: (object, version before) -> status.
#[derive(Default)]
pub(crate) struct StatusMemory(Mutex<HashMap<u64, (u64, u64)>>);

impl StatusMemory {
    /// Whether `patch` (a status patch of `object`, as read; [`Self::patch_digest`]) is what
    /// this process wrote last, on the version `object` still is.
    fn written<K: Resource<DynamicType = ()>>(&self, object: &K, patch: u64) -> bool {
        let key = Self::digest(DegradedMemory::key(object));
        let version = Self::digest(&object.meta().resource_version);
        let mut written = lock(&self.0);
        match written.get(&key) {
            Some((before, digest)) if *before == version => *digest == patch,
            Some(_) => {
                // The store shows the write (or something later): the status read is current.
                written.remove(&key);
                false
            }
            None => false,
        }
    }

    fn remember<K: Resource<DynamicType = ()>>(&self, object: &K, patch: u64) {
        let key = Self::digest(DegradedMemory::key(object));
        let before = Self::digest(&object.meta().resource_version);
        lock(&self.0).insert(key, (before, patch));
    }

    /// A status patch's digest. On one version of an object (one status read), two patches
    /// are equal exactly when the statuses they write are.
    fn patch_digest(patch: &Value) -> u64 {
        Self::digest(patch.to_string())
    }

    fn digest(value: impl std::hash::Hash) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        // Fixed keys: the same value gives the same digest for the life of the process.
        BuildHasherDefault::<DefaultHasher>::default().hash_one(value)
    }
}

/// A status condition as the API shows it: `lastTransitionTime` kept from `old` unless the
/// status changed.
pub(crate) fn condition(
    old: &[v1alpha1::Condition],
    type_: &str,
    new: &Condition,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> v1alpha1::Condition {
    let status = if new.status { "True" } else { "False" };
    let since = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| format_time(now));
    v1alpha1::Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: new.reason.to_string(),
        message: new.message.clone(),
        last_transition_time: since,
        observed_generation: generation,
    }
}

/// The Ready and Degraded conditions.
pub(crate) fn conditions(
    old: &[v1alpha1::Condition],
    ready: &Condition,
    degraded: &Condition,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> Vec<v1alpha1::Condition> {
    vec![
        condition(old, v1alpha1::CONDITION_READY, ready, generation, now),
        condition(old, v1alpha1::CONDITION_DEGRADED, degraded, generation, now),
    ]
}

/// The conditions of an object refused for `reason`: not Ready and Degraded, both saying why.
pub(crate) fn refused_conditions(
    old: &[v1alpha1::Condition],
    reason: &'static str,
    message: &str,
    generation: Option<i64>,
    now: OffsetDateTime,
) -> Vec<v1alpha1::Condition> {
    let condition = |status| Condition {
        status,
        reason,
        message: message.to_string(),
    };
    conditions(old, &condition(false), &condition(true), generation, now)
}

/// The Degraded condition's message, when it is true.
pub(crate) fn degraded_message(conditions: &[v1alpha1::Condition]) -> Option<&str> {
    conditions
        .iter()
        .find(|c| c.type_ == v1alpha1::CONDITION_DEGRADED && c.status == "True")
        .map(|c| c.message.as_str())
}

/// Writes `status` to `name`'s status subresource, only when it differs from `old`; an
/// object deleted meanwhile needs none.
pub(crate) async fn write_status<K, S>(
    api: &Api<K>,
    name: &str,
    status: &S,
    old: &S,
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug,
    S: Serialize + PartialEq,
{
    if status == old {
        return Ok(());
    }
    send_status_patch(api, name, &status_patch(status, old)).await
}

/// Merge-patches `name`'s status subresource with `patch`; an object deleted meanwhile needs
/// none.
async fn send_status_patch<K>(api: &Api<K>, name: &str, patch: &Value) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug,
{
    let request = kube::core::Request::new(api.resource_url())
        .patch_subresource("status", name, &patch_params(), &Patch::Merge(&patch))
        .map_err(kube::Error::BuildRequest)?;
    let client = api.clone().into_client();
    match send_for_metadata::<K>(&client, request, "patch_status").await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

impl StatusMemory {
    /// Writes `object`'s status subresource, only when it changed: from `old`, the status
    /// `object` was read with, and from what this process wrote last, when the store does not
    /// show that write yet.
    pub(crate) async fn write<K, S>(
        &self,
        api: &Api<K>,
        object: &K,
        status: &S,
        old: &S,
    ) -> Result<(), Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug,
        S: Serialize + PartialEq,
    {
        if status == old {
            return Ok(());
        }
        let patch = status_patch(status, old);
        let digest = StatusMemory::patch_digest(&patch);
        if self.written(object, digest) {
            return Ok(());
        }
        send_status_patch(api, &object.name_any(), &patch).await?;
        self.remember(object, digest);
        Ok(())
    }
}

/// A merge patch that makes the status exactly `status`: the fields it leaves out are
/// removed (`null`), not kept.
pub(crate) fn status_patch<T: Serialize>(status: &T, old: &T) -> Value {
    let mut new = serde_json::to_value(status).unwrap_or_else(|_| json!({}));
    if let (Some(new), Ok(Value::Object(old))) = (new.as_object_mut(), serde_json::to_value(old)) {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
    }
    json!({ "status": new })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;
    use caretaker_api::names;

    /// A pass that reads its object's status from before the previous pass's write still knows
    /// what that pass said: a Warning is said once per problem. A re-created object (another
    /// uid) starts from its own status.
    #[test]
    fn what_a_pass_said_outlives_a_stale_status() {
        let memory = DegradedMemory::default();
        // Any kind will do: the memory knows objects by kind, namespace, name and uid.
        let object = |uid: &str| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": { "name": "bad", "namespace": "default", "uid": uid },
            }))
            .unwrap()
        };
        let (first, again) = (object("one"), object("two"));
        assert_eq!(memory.reported(&first, None), None);
        assert_eq!(memory.reported(&first, Some("old")).as_deref(), Some("old"));

        // Healthy before and after: nothing to remember, the status read says it all.
        memory.remember(&first, None, None);
        assert!(lock(&memory.0).is_empty());

        memory.remember(&first, None, Some("bad validity"));
        let stale = None;
        assert_eq!(
            memory.reported(&first, stale).as_deref(),
            Some("bad validity")
        );
        assert_eq!(
            memory.reported(&again, stale),
            None,
            "another object by that name"
        );

        // Fixed: a stale status still saying the problem does not hide its return.
        memory.remember(&first, Some("bad validity"), None);
        assert_eq!(memory.reported(&first, Some("bad validity")), None);

        memory.remember(&first, None, Some("bad validity"));
        memory.forget::<ConfigMap>("default", "bad");
        assert_eq!(memory.reported(&first, stale), None);
    }

    #[test]
    fn a_status_is_not_written_again_while_the_store_shows_the_version_before_it() {
        let memory = StatusMemory::default();
        let object = |version: &str| -> ConfigMap {
            serde_json::from_value(json!({
                "metadata": { "name": "web", "namespace": "demo", "resourceVersion": version },
            }))
            .unwrap()
        };
        let issued = StatusMemory::patch_digest(&json!({ "status": { "serialNumber": "02" } }));
        let other = StatusMemory::patch_digest(&json!({ "status": { "serialNumber": "03" } }));
        assert!(!memory.written(&object("7"), issued), "nothing written yet");
        memory.remember(&object("7"), issued);
        assert!(
            memory.written(&object("7"), issued),
            "the store still shows 7"
        );
        assert!(
            !memory.written(&object("7"), other),
            "another status is written"
        );
        // The store shows the write: the status read is current, and decides alone.
        assert!(!memory.written(&object("8"), issued));
        assert!(
            !memory.written(&object("7"), issued),
            "forgotten once caught up"
        );
    }

    #[test]
    fn conditions_keep_their_transition_time_until_the_status_changes() {
        let t0 = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        let t1 = t0 + time::Duration::hours(1);
        let ready = |status| Condition {
            status,
            reason: names::REASON_SIGNING,
            message: "m".into(),
        };
        let first = vec![condition(&[], "Ready", &ready(true), Some(1), t0)];
        assert_eq!(first[0].last_transition_time, format_time(t0));
        let same = condition(&first, "Ready", &ready(true), Some(2), t1);
        assert_eq!(same.last_transition_time, format_time(t0));
        assert_eq!(same.observed_generation, Some(2));
        let flipped = condition(&first, "Ready", &ready(false), Some(2), t1);
        assert_eq!(flipped.last_transition_time, format_time(t1));
        assert_eq!(flipped.status, "False");
    }

    #[test]
    fn a_status_patch_removes_what_the_new_status_leaves_out() {
        let old = v1alpha1::IssuedCertificateStatus {
            serial_number: Some("01".into()),
            observed_generation: Some(1),
            ..Default::default()
        };
        let new = v1alpha1::IssuedCertificateStatus {
            observed_generation: Some(2),
            ..Default::default()
        };
        assert_eq!(
            status_patch(&new, &old),
            json!({ "status": { "serialNumber": null, "observedGeneration": 2 } })
        );
    }
}
