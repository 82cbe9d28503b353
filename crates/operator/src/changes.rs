//! What a decision asks the controllers to write: annotation changes and events. Plain data,
//! so the decisions that produce them are tested without Kubernetes.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// Changes to an object's annotations: set a value, or remove the annotation. Written as one
/// JSON merge patch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnnotationChanges(BTreeMap<&'static str, Option<String>>);

impl AnnotationChanges {
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

    /// The `metadata.annotations` of a merge patch (`null` removes).
    pub fn to_json(&self) -> Value {
        json!(self.0)
    }

    /// The merge patch of these changes, written only on `resource_version` when given (the API
    /// server refuses it with 409 Conflict once the object has changed since).
    pub fn merge_patch(&self, resource_version: Option<&str>) -> Value {
        match resource_version {
            Some(version) => json!({ "metadata": {
                "resourceVersion": version,
                "annotations": self.to_json(),
            } }),
            None => json!({ "metadata": { "annotations": self.to_json() } }),
        }
    }

    /// Applies the changes to `annotations`, as the API server would.
    pub fn apply_to(&self, annotations: &mut BTreeMap<String, String>) {
        for (key, value) in &self.0 {
            match value {
                Some(value) => annotations.insert(key.to_string(), value.clone()),
                None => annotations.remove(*key),
            };
        }
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
}

impl Event {
    pub fn normal(reason: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Normal,
            reason,
            note: note.into(),
        }
    }

    pub fn warning(reason: &'static str, note: impl Into<String>) -> Self {
        Self {
            type_: EventType::Warning,
            reason,
            note: note.into(),
        }
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
