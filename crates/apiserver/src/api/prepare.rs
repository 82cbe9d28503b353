//! What the server fills in before an object is stored: kind-specific fields (before
//! mutating admission, so webhooks see them) and server-owned metadata (after it, so webhooks
//! cannot forge it).

use base64::Engine;
use serde_json::{Value, json};

use super::ApiState;
use crate::crd;
use crate::error::ApiError;
use crate::meta::{self, is_deleting, metadata_mut, name_of};
use crate::registry::{Flavor, ResourceDef};

impl ApiState {
    /// Kind-specific defaults and conversions applied to every stored write.
    pub(super) fn prepare_kind(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        match def.flavor {
            Flavor::Secret => {
                if let Some(Value::Object(string_data)) =
                    obj.as_object_mut().and_then(|m| m.remove("stringData"))
                {
                    let data = obj
                        .as_object_mut()
                        .expect("checked in decode")
                        .entry("data")
                        .or_insert_with(|| json!({}));
                    if !data.is_object() {
                        *data = json!({});
                    }
                    for (k, v) in string_data {
                        let encoded = base64::engine::general_purpose::STANDARD
                            .encode(v.as_str().unwrap_or(""));
                        data[k] = json!(encoded);
                    }
                }
                if let Some(data) = obj.get("data").and_then(Value::as_object) {
                    for (k, v) in data {
                        if base64::engine::general_purpose::STANDARD
                            .decode(v.as_str().unwrap_or(""))
                            .is_err()
                        {
                            return Err(ApiError::bad_request(format!(
                                "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data.{k}"
                            )));
                        }
                    }
                }
                if obj.get("type").is_none_or(|t| t.is_null() || t == "") {
                    obj["type"] = json!("Opaque");
                }
            }
            Flavor::Namespace => {
                if obj.pointer("/spec/finalizers").is_none() && old.is_none() {
                    obj["spec"] = json!({ "finalizers": ["kubernetes"] });
                }
                let phase = if is_deleting(obj) {
                    "Terminating"
                } else {
                    "Active"
                };
                if obj.get("status").is_none_or(|s| !s.is_object()) {
                    obj["status"] = json!({});
                }
                obj["status"]["phase"] = json!(phase);
                let name = name_of(obj).to_string();
                let labels = metadata_mut(obj)
                    .entry("labels")
                    .or_insert_with(|| json!({}));
                if labels.is_object() {
                    labels["kubernetes.io/metadata.name"] = json!(name);
                }
            }
            Flavor::CustomResourceDefinition => {
                let name = name_of(obj).to_string();
                let group = obj
                    .pointer("/spec/group")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let plural = obj
                    .pointer("/spec/names/plural")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                let accepted = !self.registry.plural_taken(&name, &group, &plural);
                crd::set_status(obj, accepted, &meta::now());
            }
            _ => {}
        }
        Ok(())
    }

    /// Sets server-owned metadata: on create from scratch, on update carried over from `old`.
    pub(super) fn stamp_metadata(def: &ResourceDef, obj: &mut Value, old: Option<&Value>) {
        let spec_changed = old.is_some_and(|o| spec_like(o) != spec_like(obj));
        let m = metadata_mut(obj);
        m.remove("selfLink");
        match old
            .and_then(|o| o.get("metadata"))
            .and_then(Value::as_object)
        {
            None => {
                m.insert("uid".into(), json!(meta::new_uid()));
                m.insert("creationTimestamp".into(), json!(meta::now()));
                m.remove("deletionTimestamp");
                m.remove("deletionGracePeriodSeconds");
                m.remove("resourceVersion");
                if def.tracks_generation() {
                    m.insert("generation".into(), json!(1));
                } else {
                    m.remove("generation");
                }
            }
            Some(old_meta) => {
                for k in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                    "generateName",
                ] {
                    match old_meta.get(k) {
                        Some(v) => m.insert(k.into(), v.clone()),
                        None => m.remove(k),
                    };
                }
                if def.tracks_generation() && spec_changed {
                    let g = old_meta
                        .get("generation")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    m.insert("generation".into(), json!(g + 1));
                }
            }
        }
    }
}

/// What a change of bumps `metadata.generation`: everything but metadata and status.
fn spec_like(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}
