//! Validation of the object about to be stored: kind-specific rules, ObjectMeta rules every
//! kind shares, and custom resources' structural schema.

use serde_json::Value;

use super::ApiState;
use crate::error::{ApiError, FieldError, FieldErrorKind};
use crate::meta::{self, name_of};
use crate::schema::crd;
use crate::schema::structural;
use crate::store::registry::{Flavor, ResourceDef};

impl ApiState {
    /// Kind-specific rules and schema validation of the object about to be stored.
    pub(super) fn validate(
        &self,
        def: &ResourceDef,
        obj: &Value,
        old: Option<&Value>,
    ) -> Result<(), ApiError> {
        let creating = old.is_none();
        let name = name_of(obj);
        let mut errs: Vec<FieldError> = Vec::new();
        let name_problem = match def.flavor {
            Flavor::Namespace => meta::check_dns_label(name),
            // RBAC names are path segments (`system:discovery`), as custom resources' are.
            _ if def.group == "rbac.authorization.k8s.io" => path_segment_problem(name),
            Flavor::CustomResource => path_segment_problem(name),
            _ => meta::check_dns_subdomain(name),
        };
        errs.extend(metadata_errors(obj));
        if let Some(old) = old.filter(|old| meta::is_deleting(old)) {
            errs.extend(new_finalizers_error(obj, old));
        }
        // Immutable ConfigMaps and Secrets keep their data (and stay immutable).
        if matches!(def.plural.as_str(), "configmaps" | "secrets")
            && let Some(old) = old
            && old.get("immutable") == Some(&Value::Bool(true))
        {
            for field in ["data", "binaryData", "immutable"] {
                if old.get(field) != obj.get(field) {
                    errs.push(FieldError::new(
                        field,
                        FieldErrorKind::Forbidden,
                        "field is immutable when `immutable` is set",
                    ));
                }
            }
        }
        // kube-apiserver's limit on the total size of annotations (keys and values).
        const ANNOTATIONS_LIMIT: usize = 256 * 1024;
        let annotations_size: usize = obj
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
            .map(|a| {
                a.iter()
                    .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
                    .sum()
            })
            .unwrap_or(0);
        if annotations_size > ANNOTATIONS_LIMIT {
            errs.push(FieldError::new(
                "metadata.annotations",
                FieldErrorKind::TooLong,
                format!("must have at most {ANNOTATIONS_LIMIT} bytes"),
            ));
        }
        if creating && let Some(p) = name_problem {
            errs.push(FieldError::new(
                "metadata.name",
                FieldErrorKind::Invalid,
                format!("{name:?}: {p}"),
            ));
        }
        if def.flavor == Flavor::CustomResourceDefinition {
            errs.extend(crd::validate(obj));
        }
        if let Some(s) = def.schema.as_deref() {
            let mut body = obj.clone();
            if let Some(m) = body.as_object_mut() {
                m.remove("metadata");
                m.remove("apiVersion");
                m.remove("kind");
            }
            structural::validate(s, &body, "", &mut errs);
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(&def.group, &def.kind, name, &errs))
        }
    }
}

/// ObjectMeta rules every kind shares: label and annotation keys, label values, owner references.
fn metadata_errors(obj: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in ["labels", "annotations"] {
        for (k, v) in obj
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if let Some(p) = meta::check_qualified_name(k) {
                errs.push(FieldError::new(
                    format!("metadata.{field}"),
                    FieldErrorKind::Invalid,
                    format!("{k:?}: {p}"),
                ));
            }
            if field == "labels"
                && let Some(p) = meta::check_label_value(v.as_str().unwrap_or(""))
            {
                errs.push(FieldError::new(
                    "metadata.labels",
                    FieldErrorKind::Invalid,
                    format!("{v}: {p}"),
                ));
            }
        }
    }
    let owners = obj
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array);
    // kube-apiserver's ValidateOwnerReferences: one controller at most.
    let controllers: Vec<String> = owners
        .into_iter()
        .flatten()
        .filter(|r| r.get("controller") == Some(&Value::Bool(true)))
        .map(|r| {
            let text = |field: &str| r.get(field).and_then(Value::as_str).unwrap_or_default();
            format!("{}/{}", text("kind"), text("name"))
        })
        .collect();
    if let [first, second, ..] = controllers.as_slice() {
        errs.push(FieldError::new(
            "metadata.ownerReferences",
            FieldErrorKind::Invalid,
            format!(
                "{} references: Only one reference can have Controller set to true. Found \"true\" in references for {first} and {second}",
                owners.map_or(0, Vec::len)
            ),
        ));
    }
    for (i, r) in owners.into_iter().flatten().enumerate() {
        for field in ["apiVersion", "kind", "name", "uid"] {
            if r.get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                errs.push(FieldError::new(
                    format!("metadata.ownerReferences[{i}].{field}"),
                    FieldErrorKind::Invalid,
                    format!("\"\": {field} must not be empty"),
                ));
            }
        }
    }
    errs
}

/// kube-apiserver's `ValidateNoNewFinalizers`: an object being deleted may lose finalizers,
/// never gain one (what would remove it?).
fn new_finalizers_error(obj: &Value, old: &Value) -> Option<FieldError> {
    let before = meta::finalizers_of(old);
    let mut added: Vec<String> = meta::finalizers_of(obj)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if added.is_empty() {
        return None;
    }
    added.sort();
    added.dedup();
    // Go's `%#v` of the `[]string` of new finalizers.
    let quoted: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
    Some(FieldError::new(
        "metadata.finalizers",
        FieldErrorKind::Forbidden,
        format!(
            "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
            quoted.join(", ")
        ),
    ))
}

/// kube's `IsValidPathSegmentName`: the names of custom resources and RBAC objects.
fn path_segment_problem(name: &str) -> Option<String> {
    (name.contains('/') || name.contains('%') || name == "." || name == "..")
        .then(|| "may not contain '/' or '%' and may not be '.' or '..'".to_string())
}
