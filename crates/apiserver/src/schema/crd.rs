//! CustomResourceDefinitions: which resources a CRD serves, and the status conditions
//! (`NamesAccepted`, `Established`) that `kubectl wait --for condition=established` waits for.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::error::{FieldError, FieldErrorKind};
use crate::meta::strings_at;
use crate::store::registry::{Flavor, PrinterColumn, ResourceDef, ScalePaths};

fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// One ResourceDef per served version of the CRD.
pub fn served_resources(crd: &Value) -> Vec<ResourceDef> {
    let group = str_at(crd, "/spec/group");
    let plural = str_at(crd, "/spec/names/plural");
    let kind = str_at(crd, "/spec/names/kind");
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return vec![];
    }
    let singular = match str_at(crd, "/spec/names/singular") {
        "" => kind.to_lowercase(),
        s => s.to_string(),
    };
    let namespaced = str_at(crd, "/spec/scope") != "Cluster";
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    versions
        .iter()
        .filter(|v| v.get("served").and_then(Value::as_bool).unwrap_or(false))
        .filter_map(|v| {
            let version = v.get("name")?.as_str()?.to_string();
            let printer_columns = v
                .get("additionalPrinterColumns")
                .and_then(Value::as_array)
                .map(|cols| {
                    cols.iter()
                        .map(|c| PrinterColumn {
                            name: str_at(c, "/name").into(),
                            type_: str_at(c, "/type").into(),
                            json_path: str_at(c, "/jsonPath").into(),
                            priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                            description: str_at(c, "/description").into(),
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(ResourceDef {
                group: group.into(),
                version,
                plural: plural.into(),
                singular: singular.clone(),
                kind: kind.into(),
                namespaced,
                short_names: strings_at(crd, "/spec/names/shortNames"),
                categories: strings_at(crd, "/spec/names/categories"),
                has_status: v.pointer("/subresources/status").is_some(),
                storage_key: format!("{group}/{plural}"),
                flavor: Flavor::CustomResource,
                schema: v.pointer("/schema/openAPIV3Schema").cloned().map(Arc::new),
                printer_columns,
                scale: v.pointer("/subresources/scale").map(|s| ScalePaths {
                    spec_replicas: str_at(s, "/specReplicasPath").into(),
                    status_replicas: str_at(s, "/statusReplicasPath").into(),
                    label_selector: s
                        .get("labelSelectorPath")
                        .and_then(Value::as_str)
                        .map(String::from),
                }),
                selectable_fields: v
                    .get("selectableFields")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|f| str_at(f, "/jsonPath").trim_start_matches('.').to_string())
                    .collect(),
            })
        })
        .collect()
}

/// Checks what kube-apiserver refuses outright (a subset of its CRD validation).
pub fn validate(crd: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let group = str_at(crd, "/spec/group");
    let plural = str_at(crd, "/spec/names/plural");
    let name = str_at(crd, "/metadata/name");
    for (field, value) in [
        ("spec.group", group),
        ("spec.names.plural", plural),
        ("spec.names.kind", str_at(crd, "/spec/names/kind")),
    ] {
        if value.is_empty() {
            errs.push(FieldError::new(field, FieldErrorKind::Required, ""));
        }
    }
    if !group.is_empty() && !plural.is_empty() && name != format!("{plural}.{group}") {
        errs.push(FieldError::new(
            "metadata.name",
            FieldErrorKind::Invalid,
            format!("\"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    match str_at(crd, "/spec/scope") {
        "Cluster" | "Namespaced" => {}
        other => errs.push(FieldError::new(
            "spec.scope",
            FieldErrorKind::NotSupported,
            format!("\"{other}\": supported values: \"Cluster\", \"Namespaced\""),
        )),
    }
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let storage_versions = versions
        .iter()
        .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        .count();
    if storage_versions != 1 {
        errs.push(FieldError::new(
            "spec.versions",
            FieldErrorKind::Invalid,
            "must have exactly one version marked as storage version",
        ));
    }
    let conversion = str_at(crd, "/spec/conversion/strategy");
    if !conversion.is_empty() && conversion != "None" && conversion != "Webhook" {
        errs.push(FieldError::new(
            "spec.conversion.strategy",
            FieldErrorKind::NotSupported,
            format!("\"{conversion}\": supported values: \"None\", \"Webhook\""),
        ));
    }
    errs
}

/// Fills in the status a CRD gets from kube-apiserver's naming and establishing controllers.
pub fn set_status(crd: &mut Value, names_accepted: bool, now: &str) {
    let names = crd.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let mut accepted = names.clone();
    if accepted.get("singular").is_none()
        && let Some(kind) = names.get("kind").and_then(Value::as_str)
    {
        accepted["singular"] = json!(kind.to_lowercase());
    }
    if accepted.get("listKind").is_none()
        && let Some(kind) = names.get("kind").and_then(Value::as_str)
    {
        accepted["listKind"] = json!(format!("{kind}List"));
    }
    let storage_version = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
        })
        .and_then(|v| v.get("name").cloned());
    let mut stored: Vec<Value> = crd
        .pointer("/status/storedVersions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if let Some(sv) = storage_version
        && !stored.contains(&sv)
    {
        stored.push(sv);
    }
    let previous = crd
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let condition = |type_: &str, ok: bool, reason: &str, message: &str| {
        let status = if ok { "True" } else { "False" };
        // Keep lastTransitionTime when the status did not change, as condition helpers do.
        let since = previous
            .iter()
            .find(|c| c["type"] == type_ && c["status"] == status)
            .and_then(|c| c.get("lastTransitionTime").cloned())
            .unwrap_or(json!(now));
        json!({ "type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": since })
    };
    let conditions = if names_accepted {
        vec![
            condition("NamesAccepted", true, "NoConflicts", "no conflicts found"),
            condition(
                "Established",
                true,
                "InitialNamesAccepted",
                "the initial names have been accepted",
            ),
        ]
    } else {
        vec![
            condition(
                "NamesAccepted",
                false,
                "AlreadyInUse",
                "the plural name is already in use",
            ),
            condition(
                "Established",
                false,
                "NotAccepted",
                "not all names are accepted",
            ),
        ]
    };
    crd["status"] = json!({
        "acceptedNames": if names_accepted { accepted } else { json!({"plural": "", "kind": ""}) },
        "conditions": conditions,
        "storedVersions": stored,
    });
}
