//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch
//! (`strategic_merge.rs`). Server-side apply lives in `apply.rs`.

use axum::http::{HeaderMap, header};
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

/// Each patch type and its media type.
const PATCH_MEDIA_TYPES: [(PatchType, &str); 4] = [
    (PatchType::Json, "application/json-patch+json"),
    (PatchType::Merge, "application/merge-patch+json"),
    (
        PatchType::Strategic,
        "application/strategic-merge-patch+json",
    ),
    (PatchType::Apply, "application/apply-patch+yaml"),
];

/// A request's Content-Type as [`PatchType::from_content_type`] reads it: "" when there is none
/// or it is not visible ASCII.
pub fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

impl PatchType {
    /// The patch type a PATCH request's Content-Type names, if any. The one reading of it:
    /// authorization and the handlers both ask here, so that no type can be one patch to the
    /// one and another to the other. Whitespace around the media type, its letter case and its
    /// parameters (`; charset=utf-8`) do not matter; anything else names no patch type (415).
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let media = content_type.split(';').next().unwrap_or("").trim();
        PATCH_MEDIA_TYPES
            .iter()
            .find(|(_, name)| media.eq_ignore_ascii_case(name))
            .map(|(patch_type, _)| *patch_type)
    }

    /// The media type that names this patch type.
    pub fn media_type(self) -> &'static str {
        PATCH_MEDIA_TYPES
            .iter()
            .find(|(patch_type, _)| *patch_type == self)
            .map(|(_, name)| *name)
            .expect("every patch type has a media type")
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
    }

    #[test]
    fn a_patch_type_is_read_whatever_its_padding_case_and_parameters() {
        for (patch_type, media_type) in PATCH_MEDIA_TYPES {
            assert_eq!(patch_type.media_type(), media_type);
            for variant in [
                media_type.to_string(),
                format!(" {media_type}"),
                format!("{media_type}\t "),
                format!("{media_type}; charset=utf-8"),
                format!("  {media_type} ;charset=utf-8"),
                media_type.to_ascii_uppercase(),
            ] {
                assert_eq!(
                    PatchType::from_content_type(&variant),
                    Some(patch_type),
                    "{variant:?}"
                );
            }
        }
        for unknown in [
            "",
            "application/xml",
            "application/json",
            "application/apply-patch",
            "application/apply-patch+cbor",
            "application/apply-patch+yaml2",
            "application/apply-patch+ yaml",
            "xapplication/merge-patch+json",
            "; application/merge-patch+json",
        ] {
            assert_eq!(PatchType::from_content_type(unknown), None, "{unknown:?}");
        }
    }
}
