//! What a decision asks the controllers to write: annotation changes and events. Plain data,
//! so the decisions that produce them are tested without Kubernetes.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Value, json};

/// Keys of a string map to set or remove: an object's annotations, or a Secret's `data`.
/// Written as one JSON merge patch (`null` removes). `Debug` shows the keys and the sizes of the
/// values, never a value, because the same type carries private keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeyChanges(BTreeMap<&'static str, Option<String>>);

/// Changes to an object's annotations.
pub type AnnotationChanges = KeyChanges;

impl KeyChanges {
    /// Changes that remove each of `keys`.
    pub fn removing(keys: &[&'static str]) -> Self {
        Self(keys.iter().map(|key| (*key, None)).collect())
    }

    pub fn set(&mut self, key: &'static str, value: impl Into<String>) -> &mut Self {
        self.0.insert(key, Some(value.into()));
        self
    }

    pub fn remove(&mut self, key: &'static str) -> &mut Self {
        self.0.insert(key, None);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What the changes do to `key`: `Some(None)` removes it, `None` leaves it alone.
    pub fn get(&self, key: &str) -> Option<Option<&str>> {
        self.0.get(key).map(Option::as_deref)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&'static str, Option<&str>)> {
        self.0.iter().map(|(k, v)| (*k, v.as_deref()))
    }

    /// The changes as a merge patch of the map itself (`null` removes).
    pub fn to_json(&self) -> Value {
        json!(self.0)
    }

    /// The merge patch of these changes to annotations, written only on `resource_version`
    /// when given (the API server refuses it with 409 Conflict once the object has changed
    /// since).
    pub fn merge_patch(&self, resource_version: Option<&str>) -> Value {
        match resource_version {
            Some(version) => json!({ "metadata": {
                "resourceVersion": version,
                "annotations": self.to_json(),
            } }),
            None => json!({ "metadata": { "annotations": self.to_json() } }),
        }
    }

    /// Applies the changes to `map`, as the API server would.
    pub fn apply_to<V: for<'a> From<&'a str>>(&self, map: &mut BTreeMap<String, V>) {
        for (key, value) in &self.0 {
            match value {
                Some(value) => map.insert(key.to_string(), V::from(value)),
                None => map.remove(*key),
            };
        }
    }
}

impl fmt::Debug for KeyChanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (key, value) in &self.0 {
            match value {
                Some(value) => map.entry(key, &format_args!("<{} bytes>", value.len())),
                None => map.entry(key, &format_args!("<removed>")),
            };
        }
        map.finish()
    }
}

/// Severity of an event, as `kubectl describe` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

/// An event to publish about the object a decision is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub type_: EventType,
    /// The upstream reason (`CertificatesRefreshDone`, `RefreshCertsFailed`, …).
    pub reason: &'static str,
    /// What happened, for people.
    pub note: String,
    /// The events.k8s.io `action`: the reason, unless the upstream tool names its actions
    /// apart (trust-manager: `Synced`, `SyncFailed`).
    pub action: &'static str,
}

impl Event {
    pub fn normal(reason: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Normal,
            reason,
            note: note.into(),
            action: reason,
        }
    }

    pub fn warning(reason: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Warning,
            reason,
            note: note.into(),
            action: reason,
        }
    }

    pub fn with_action(self, action: &'static str) -> Self {
        Self { action, ..self }
    }
}

/// A condition of a status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Condition {
    pub(crate) fn new(status: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            reason,
            message: message.into(),
        }
    }

    pub(crate) fn as_expected() -> Self {
        Self::new(false, caretaker_api::names::REASON_AS_EXPECTED, "")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_set_and_remove_as_a_merge_patch_does() {
        let mut changes = AnnotationChanges::removing(&["a", "b"]);
        changes.set("b", "2").set("c", "3");
        assert_eq!(changes.get("a"), Some(None));
        assert_eq!(changes.get("b"), Some(Some("2")));
        assert_eq!(changes.get("d"), None);
        assert_eq!(
            changes.merge_patch(Some("7")),
            json!({ "metadata": { "resourceVersion": "7",
                "annotations": { "a": null, "b": "2", "c": "3" } } })
        );
        let mut annotations = BTreeMap::from([
            ("a".to_string(), "1".to_string()),
            ("d".to_string(), "4".to_string()),
        ]);
        changes.apply_to(&mut annotations);
        let expected =
            [("b", "2"), ("c", "3"), ("d", "4")].map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(annotations, BTreeMap::from(expected));
    }
}
