//! PATCH bodies: JSON patch (RFC 6902), JSON merge patch (RFC 7386) and strategic merge patch
//! (`strategic_merge`). Server-side apply lives in `apply`.

use axum::http::{HeaderMap, header};
use json_patch::PatchOperation;
use serde_json::Value;

use crate::error::ApiError;
use crate::patch::patch_meta::PatchMeta;
use crate::work::Deadline;

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

/// The most operations a JSON patch may hold, as kube-apiserver's `maxJSONPatchOperations`.
pub const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;

/// The most bytes a JSON patch's `copy` operations may add together, as kube-apiserver's
/// `JSONPatchMaxCopyBytes` (its request body limit, 3 MiB): a `copy` doubles what it copies,
/// so a handful of them in a small body would otherwise fill memory.
pub const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Why a JSON patch was not applied, worded as kube-apiserver's JSON patch library words it.
#[derive(Debug, thiserror::Error)]
pub enum JsonPatchError {
    #[error(
        "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {got}"
    )]
    TooManyOperations { got: usize },
    #[error(
        "Unable to complete the copy, the accumulated size increase of copy is {accumulated}, exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
    )]
    CopiesTooLarge { accumulated: usize },
    #[error("{0}")]
    Failed(json_patch::PatchError),
    #[error("{}", .0.message)]
    TimedOut(ApiError),
}

/// Applies the JSON patch `ops` to `doc` within kube-apiserver's limits: at most
/// [`MAX_JSON_PATCH_OPERATIONS`], and copies adding at most [`MAX_JSON_PATCH_COPY_BYTES`]
/// (each copy's source measured as JSON, as it stands when the copy runs); and by `deadline`
/// (10,000 insertions into a long list take seconds).
pub fn apply_json_patch(
    mut doc: Value,
    ops: &[PatchOperation],
    deadline: Deadline,
) -> Result<Value, JsonPatchError> {
    if ops.len() > MAX_JSON_PATCH_OPERATIONS {
        return Err(JsonPatchError::TooManyOperations { got: ops.len() });
    }
    let mut copied = 0;
    for (i, op) in ops.iter().enumerate() {
        deadline.check().map_err(JsonPatchError::TimedOut)?;
        if let PatchOperation::Copy(copy) = op
            && let Some(source) = doc.pointer(copy.from.as_str())
        {
            copied += encoded_len(source);
            if copied > MAX_JSON_PATCH_COPY_BYTES {
                return Err(JsonPatchError::CopiesTooLarge {
                    accumulated: copied,
                });
            }
        }
        // One operation at a time, on a copy nobody else sees: nothing to undo on failure.
        json_patch::patch_unsafe(&mut doc, std::slice::from_ref(op)).map_err(|mut e| {
            e.operation = i;
            JsonPatchError::Failed(e)
        })?;
    }
    Ok(doc)
}

/// The length of `value` encoded as JSON, without keeping the encoding.
fn encoded_len(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value).expect("JSON values encode");
    counter.0
}

/// Applies a JSON, merge or strategic patch to `target`, an object of the kind `meta`
/// describes (its lists' strategies, for strategic merge patch); 504 once `deadline` passes.
pub fn apply_patch(
    patch_type: PatchType,
    target: &Value,
    patch: &Value,
    meta: PatchMeta,
    deadline: Deadline,
) -> Result<Value, ApiError> {
    match patch_type {
        PatchType::Json => {
            let ops: json_patch::Patch = serde_json::from_value(patch.clone())
                .map_err(|e| ApiError::bad_request(format!("json patch: {e}")))?;
            apply_json_patch(target.clone(), &ops, deadline).map_err(|e| match e {
                JsonPatchError::TimedOut(timed_out) => timed_out,
                JsonPatchError::TooManyOperations { .. } => ApiError::new(
                    413,
                    "RequestEntityTooLarge",
                    format!("Request entity too large: {e}"),
                ),
                JsonPatchError::CopiesTooLarge { .. } | JsonPatchError::Failed(_) => ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                ),
            })
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
            crate::patch::strategic_merge::apply(target, p, meta, deadline)
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
            Deadline::from_now(),
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

    fn json_patch(target: &Value, ops: Value) -> Result<Value, ApiError> {
        apply_patch(PatchType::Json, target, &ops)
    }

    #[test]
    fn copies_add_at_most_the_copy_limit() {
        // Each copy doubles `/x`: twenty of them would make gigabytes of a 2 KB object.
        let target = json!({"x": {"v": "a".repeat(2_000)}});
        let doublings: Vec<Value> = (0..20)
            .map(|i| json!({"op": "copy", "from": "/x", "path": format!("/x/c{i}")}))
            .collect();
        let refused = json_patch(&target, Value::Array(doublings)).unwrap_err();
        assert_eq!((refused.code, refused.reason), (422, "Invalid"));
        assert!(
            refused
                .message
                .contains("Unable to complete the copy, the accumulated size increase of copy is")
                && refused.message.ends_with("exceeding the limit 3145728"),
            "{}",
            refused.message
        );
        // A copy as a client means it still works, and sizes count as the copies run.
        let out = json_patch(
            &target,
            json!([{"op": "copy", "from": "/x/v", "path": "/y"},
                   {"op": "copy", "from": "/y", "path": "/z"}]),
        )
        .unwrap();
        assert_eq!(out["z"], target["x"]["v"]);
        let copied = encoded_len(&target["x"]["v"]);
        let op = PatchOperation::Copy(json_patch::CopyOperation {
            from: "/x/v".parse().unwrap(),
            path: "/y".parse().unwrap(),
        });
        // Copies over the same place count too, though the object does not grow.
        let at_limit = vec![op.clone(); MAX_JSON_PATCH_COPY_BYTES / copied];
        assert!(apply_json_patch(target.clone(), &at_limit, Deadline::from_now()).is_ok());
        let repeated = vec![op; MAX_JSON_PATCH_COPY_BYTES / copied + 1];
        assert!(matches!(
            apply_json_patch(target, &repeated, Deadline::from_now()),
            Err(JsonPatchError::CopiesTooLarge { accumulated }) if accumulated > MAX_JSON_PATCH_COPY_BYTES
        ));
    }

    #[test]
    fn json_patches_hold_at_most_ten_thousand_operations() {
        let target = json!({"a": 1});
        let test = json!({"op": "test", "path": "/a", "value": 1});
        let at_limit = Value::Array(vec![test.clone(); MAX_JSON_PATCH_OPERATIONS]);
        assert_eq!(json_patch(&target, at_limit).unwrap(), target);
        let over = Value::Array(vec![test; MAX_JSON_PATCH_OPERATIONS + 1]);
        let refused = json_patch(&target, over).unwrap_err();
        assert_eq!(
            (refused.code, refused.reason, refused.message.as_str()),
            (
                413,
                "RequestEntityTooLarge",
                "Request entity too large: The allowed maximum operations in a JSON patch is 10000, got 10001"
            )
        );
    }

    #[test]
    fn a_failed_operation_is_named_by_its_place_in_the_patch() {
        let refused = json_patch(
            &json!({"a": 1}),
            json!([{"op": "add", "path": "/b", "value": 2},
                   {"op": "test", "path": "/a", "value": 9}]),
        )
        .unwrap_err();
        assert_eq!(refused.code, 422);
        assert!(
            refused
                .message
                .ends_with("operation '/1' failed at path '/a': value did not match"),
            "{}",
            refused.message
        );
    }
}
