//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch.
//! Server-side apply lives in `apply.rs`.
//!
//! Strategic merge patch is merge patch plus the list strategies the built-in kinds served here
//! declare (`finalizers` merged as a set, `ownerReferences` by uid, webhooks by name, conditions by
//! type) and the `$patch`, `$deleteFromPrimitiveList`, `$setElementOrder` and `$retainKeys`
//! directives kubectl sends.

use serde_json::{Map, Value};

use crate::error::ApiError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    Json,
    Merge,
    Strategic,
    Apply,
}

impl PatchType {
    /// The patch type a PATCH request's Content-Type names, if any.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        match media {
            "application/json-patch+json" => Some(PatchType::Json),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/apply-patch+yaml" => Some(PatchType::Apply),
            _ => None,
        }
    }

    /// The patch media types kube-apiserver accepts, in the order its 415 message lists them.
    /// Custom resources have no strategic merge patch.
    pub fn media_types(custom_resource: bool) -> &'static [&'static str] {
        if custom_resource {
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/apply-patch+yaml",
            ]
        } else {
            &[
                "application/json-patch+json",
                "application/merge-patch+json",
                "application/strategic-merge-patch+json",
                "application/apply-patch+yaml",
            ]
        }
    }
}

/// Applies a JSON, merge or strategic patch to `target`.
pub fn apply_patch(
    patch_type: PatchType,
    target: &Value,
    patch: &Value,
) -> Result<Value, ApiError> {
    match patch_type {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("json patch: {e}")))?;
            let mut doc = target.clone();
            json_patch::patch(&mut doc, &ops).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?;
            Ok(doc)
        }
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(ApiError::bad_request("merge patch must be a JSON object"));
            }
            let mut doc = target.clone();
            json_patch::merge(&mut doc, patch);
            Ok(doc)
        }
        PatchType::Strategic => {
            let Value::Object(p) = patch else {
                return Err(ApiError::bad_request(
                    "strategic merge patch must be a JSON object",
                ));
            };
            let mut doc = target.clone();
            strategic_merge(&mut doc, p, "");
            Ok(doc)
        }
        PatchType::Apply => Err(ApiError::internal(
            "apply patches are handled by server-side apply",
        )),
    }
}

/// The merge key of lists the served built-in kinds merge rather than replace.
fn list_merge_key(field: &str) -> Option<Option<&'static str>> {
    match field {
        "finalizers" => Some(None),
        "ownerReferences" => Some(Some("uid")),
        "webhooks" => Some(Some("name")),
        "conditions" => Some(Some("type")),
        _ => None,
    }
}

fn strategic_merge(target: &mut Value, patch: &Map<String, Value>, _path: &str) {
    if patch.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = patch.clone();
        p.remove("$patch");
        *target = Value::Object(p);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("made an object above");
    for (key, value) in patch {
        if key.starts_with("$setElementOrder/") || key == "$retainKeys" || key == "$patch" {
            continue;
        }
        if let Some(field) = key.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(list)), Value::Array(remove)) = (t.get_mut(field), value) {
                list.retain(|v| !remove.contains(v));
            }
            continue;
        }
        match value {
            Value::Null => {
                t.remove(key);
            }
            Value::Object(p) if p.get("$patch").and_then(Value::as_str) == Some("delete") => {
                t.remove(key);
            }
            Value::Object(p) => {
                strategic_merge(t.entry(key.clone()).or_insert(Value::Null), p, key)
            }
            Value::Array(items) => match (list_merge_key(key), t.get_mut(key)) {
                (Some(merge_key), Some(Value::Array(existing))) => {
                    merge_list(existing, items, merge_key)
                }
                _ => {
                    let cleaned: Vec<Value> = items
                        .iter()
                        .filter(|i| i.get("$patch").is_none())
                        .cloned()
                        .collect();
                    t.insert(key.clone(), Value::Array(cleaned));
                }
            },
            other => {
                t.insert(key.clone(), other.clone());
            }
        }
    }
}

fn merge_list(existing: &mut Vec<Value>, items: &[Value], merge_key: Option<&str>) {
    match merge_key {
        None => {
            for item in items {
                if !existing.contains(item) {
                    existing.push(item.clone());
                }
            }
        }
        Some(k) => {
            for item in items {
                let Some(id) = item.get(k) else { continue };
                let position = existing.iter().position(|e| e.get(k) == Some(id));
                let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
                match (position, item) {
                    (Some(i), _) if delete => {
                        existing.remove(i);
                    }
                    (Some(i), Value::Object(p)) => strategic_merge(&mut existing[i], p, k),
                    (None, _) if !delete => existing.push(item.clone()),
                    _ => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strategic_merge_of_finalizers_and_directives() {
        let target = json!({"metadata": {"finalizers": ["a"], "labels": {"x": "1", "y": "2"}}, "data": {"k": "v"}});
        let patch = json!({"metadata": {"finalizers": ["b"], "labels": {"x": null}, "$setElementOrder/finalizers": ["a", "b"]},
            "data": {"$patch": "replace", "n": "m"}});
        let out = apply_patch(PatchType::Strategic, &target, &patch).unwrap();
        assert_eq!(
            out,
            json!({"metadata": {"finalizers": ["a", "b"], "labels": {"y": "2"}}, "data": {"n": "m"}})
        );
        let out = apply_patch(
            PatchType::Strategic,
            &out,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn json_and_merge_patches() {
        let target = json!({"a": 1, "b": {"c": 2}});
        let out = apply_patch(
            PatchType::Json,
            &target,
            &json!([{"op": "replace", "path": "/a", "value": 5}]),
        )
        .unwrap();
        assert_eq!(out["a"], 5);
        assert!(
            apply_patch(
                PatchType::Json,
                &target,
                &json!([{"op": "test", "path": "/a", "value": 9}])
            )
            .is_err()
        );
        assert!(apply_patch(PatchType::Json, &target, &json!({"not": "a list"})).is_err());
        let out = apply_patch(
            PatchType::Merge,
            &target,
            &json!({"b": {"c": null, "d": 3}}),
        )
        .unwrap();
        assert_eq!(out, json!({"a": 1, "b": {"d": 3}}));
        assert_eq!(PatchType::from_content_type("application/xml"), None);
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8"),
            Some(PatchType::Merge)
        );
    }
}
