//! The checks every write of a full object starts with: apiVersion, kind, names and namespace
//! against the URL, metadata types, unknown fields (per `fieldValidation`), and for custom
//! resources structural-schema pruning and defaulting. The result is the storage form.

use serde_json::{Value, json};

use super::ApiState;
use super::options::{FieldValidation, WriteOptions};
use crate::error::ApiError;
use crate::patch::apply;
use crate::schema::structural;
use crate::store::events;
use crate::store::registry::{Flavor, ResourceDef};

/// Whether `field` is a top-level field of `def`'s built-in kind; None for kinds whose fields
/// are not known here. Unknown fields are dropped, as Go's decoder does.
fn known_builtin_field(def: &ResourceDef, field: &str) -> Option<bool> {
    let fields: &[&str] = match (def.flavor, def.plural.as_str()) {
        (Flavor::Generic, "configmaps") => &["data", "binaryData", "immutable"],
        (Flavor::Secret, _) => &["data", "stringData", "type", "immutable"],
        (Flavor::Namespace, _) => &["spec", "status"],
        (Flavor::CoreEvent, _) => return Some(events::is_core_field(field)),
        (Flavor::EventsV1Event, _) => return Some(events::is_v1_field(field)),
        (Flavor::Generic, "leases") => &["spec"],
        (Flavor::Generic, "validatingwebhookconfigurations" | "mutatingwebhookconfigurations") => {
            &["webhooks"]
        }
        (Flavor::CustomResourceDefinition, _) | (Flavor::Service | Flavor::Pod, _) => {
            &["spec", "status"]
        }
        (
            Flavor::Generic,
            "apiservices"
            | "deployments"
            | "replicationcontrollers"
            | "persistentvolumeclaims"
            | "replicasets"
            | "statefulsets"
            | "daemonsets"
            | "jobs"
            | "cronjobs"
            | "ingresses"
            | "networkpolicies"
            | "poddisruptionbudgets"
            | "clustertrustbundles",
        ) => &["spec", "status"],
        (Flavor::Generic, "serviceaccounts") => &[
            "secrets",
            "imagePullSecrets",
            "automountServiceAccountToken",
        ],
        (Flavor::Generic, "clusterroles") => &["rules", "aggregationRule"],
        (Flavor::Generic, "roles") => &["rules"],
        (Flavor::Generic, "clusterrolebindings" | "rolebindings") => &["subjects", "roleRef"],
        _ => return None,
    };
    Some(fields.contains(&field))
}

const OBJECT_META_FIELDS: &[&str] = &[
    "name",
    "generateName",
    "namespace",
    "selfLink",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "labels",
    "annotations",
    "ownerReferences",
    "finalizers",
    "managedFields",
];

/// What Go's `omitempty` leaves out: null, "", [] and {}.
fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        Value::Bool(_) | Value::Number(_) => false,
    }
}

fn is_string_map(v: Option<&Value>) -> bool {
    v.is_none_or(|v| {
        v.is_null()
            || v.as_object()
                .is_some_and(|m| m.values().all(Value::is_string))
    })
}

impl ApiState {
    /// Checks shared by every write of a full object; returns it in storage form with unknown fields dropped.
    pub(super) fn decode(
        &self,
        def: &ResourceDef,
        namespace: &str,
        url_name: Option<&str>,
        mut obj: Value,
        opts: &WriteOptions,
    ) -> Result<(Value, Vec<String>), ApiError> {
        let Some(map) = obj.as_object_mut() else {
            return Err(ApiError::bad_request(format!(
                "the body of the request must be a {} object",
                def.kind
            )));
        };
        let expected = def.api_version();
        if let Some(v) = map.get("apiVersion").and_then(Value::as_str)
            && !v.is_empty()
            && v != expected
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({expected})"
            )));
        }
        if let Some(k) = map.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != def.kind
        {
            return Err(ApiError::bad_request(format!(
                "the kind in the data ({k}) does not match the expected kind ({})",
                def.kind
            )));
        }
        map.insert("apiVersion".into(), json!(expected));
        map.insert("kind".into(), json!(def.kind));
        // kube-apiserver's words for a body that does not decode into the kind's Go type.
        let undecodable = |why: &str| {
            ApiError::bad_request(format!(
                "{kind} in version \"{version}\" cannot be handled as a {kind}: {why}",
                kind = def.kind,
                version = def.version
            ))
        };
        let mut unknown = Vec::new();
        let meta = map.entry("metadata").or_insert_with(|| json!({}));
        let Some(meta) = meta.as_object_mut() else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
        for k in meta
            .keys()
            .filter(|k| !OBJECT_META_FIELDS.contains(&k.as_str()))
            .cloned()
            .collect::<Vec<_>>()
        {
            meta.remove(&k);
            unknown.push(format!("metadata.{k}"));
        }
        // Go's omitempty: kube-apiserver never returns empty metadata fields, even when a
        // request sent them (protobuf bodies, as kubectl's generators send, always carry an
        // empty generateName). An empty managedFields list is kept: it asks for a reset.
        meta.retain(|k, v| k == "managedFields" || !is_empty(v));
        if !is_string_map(meta.get("labels")) || !is_string_map(meta.get("annotations")) {
            return Err(undecodable(
                "metadata labels and annotations must be maps of strings",
            ));
        }
        if let Some(managed) = meta.get_mut("managedFields") {
            apply::check_managed_fields(managed, &mut unknown).map_err(|e| undecodable(&e))?;
        }
        if meta.get("finalizers").is_some_and(|f| {
            !f.is_null() && !f.as_array().is_some_and(|a| a.iter().all(Value::is_string))
        }) {
            return Err(ApiError::bad_request(
                "metadata.finalizers must be a list of strings",
            ));
        }
        if let Some(url_name) = url_name {
            match meta.get("name").and_then(Value::as_str) {
                Some(n) if n != url_name => {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({n}) does not match the name on the URL ({url_name})"
                    )));
                }
                Some(_) => {}
                None => {
                    meta.insert("name".into(), json!(url_name));
                }
            }
        }
        if def.namespaced {
            match meta.get("namespace").and_then(Value::as_str) {
                Some(ns) if !ns.is_empty() && ns != namespace => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => {
                    meta.insert("namespace".into(), json!(namespace));
                }
            }
        } else {
            meta.remove("namespace");
        }
        for k in map
            .keys()
            .filter(|k| {
                !["apiVersion", "kind", "metadata"].contains(&k.as_str())
                    && known_builtin_field(def, k) == Some(false)
            })
            .cloned()
            .collect::<Vec<_>>()
        {
            map.remove(&k);
            unknown.push(k);
        }
        if matches!(def.plural.as_str(), "configmaps" | "secrets")
            && (!is_string_map(map.get("data"))
                || !is_string_map(map.get("binaryData"))
                || !is_string_map(map.get("stringData")))
        {
            return Err(undecodable("data values must be strings"));
        }
        if let Some(s) = def.schema.as_deref() {
            structural::prune(s, &mut obj, "", true, &mut unknown);
            structural::apply_defaults(s, &mut obj);
        }
        let obj = if def.flavor == Flavor::EventsV1Event {
            events::v1_to_core(&obj)
        } else {
            obj
        };
        let mut warnings = Vec::new();
        if !unknown.is_empty() {
            let described: Vec<String> = unknown
                .iter()
                .map(|f| format!("unknown field \"{f}\""))
                .collect();
            match opts.field_validation {
                FieldValidation::Strict => {
                    return Err(undecodable(&format!(
                        "strict decoding error: {}",
                        described.join(", ")
                    )));
                }
                FieldValidation::Warn => warnings = described,
                FieldValidation::Ignore => {}
            }
        }
        Ok((obj, warnings))
    }
}
