//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch
//! (`strategic_merge.rs`). Server-side apply lives in `apply.rs`.

use serde_json::Value;

use crate::error::ApiError;
use crate::patch_meta::PatchMeta;

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

/// Applies a JSON, merge or strategic patch to `target`, an object of the kind `meta`
/// describes (its lists' strategies, for strategic merge patch).
pub fn apply_patch(
    patch_type: PatchType,
    target: &Value,
    patch: &Value,
    meta: PatchMeta,
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
            crate::strategic_merge::apply(target, p, meta)
        }
        PatchType::Apply => Err(ApiError::internal(
            "apply patches are handled by server-side apply",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply_patch(
        patch_type: PatchType,
        target: &Value,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        super::apply_patch(
            patch_type,
            target,
            patch,
            PatchMeta::of("", "v1", "ConfigMap"),
        )
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
