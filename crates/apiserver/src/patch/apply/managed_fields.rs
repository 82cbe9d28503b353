//! `metadata.managedFields`: its entries decoded and encoded, and the checks a request's own
//! list passes.

use serde_json::{Value, json};

use super::fields::{FieldSet, decode, encode};

/// One `managedFields` entry, decoded.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub manager: String,
    pub operation: String,
    pub api_version: String,
    pub time: String,
    pub subresource: Option<String>,
    pub fields: FieldSet,
}

pub(super) fn read_entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| Entry {
                    manager: e["manager"].as_str().unwrap_or("").into(),
                    operation: e["operation"].as_str().unwrap_or("Update").into(),
                    api_version: e["apiVersion"].as_str().unwrap_or("").into(),
                    time: e["time"].as_str().unwrap_or("").into(),
                    subresource: e
                        .get("subresource")
                        .and_then(Value::as_str)
                        .map(String::from),
                    fields: e.get("fieldsV1").map(decode).unwrap_or_default(),
                })
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn write_entries(obj: &mut Value, entries: &[Entry]) {
    let list: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(|e| {
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": e.time, "fieldsType": "FieldsV1", "fieldsV1": encode(&e.fields),
            });
            if let Some(s) = &e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    let meta = crate::meta::metadata_mut(obj);
    if list.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

/// Checks that `managedFields` decodes into Go's `[]ManagedFieldsEntry`, which kube-apiserver
/// answers with 400 when it does not; the error is in Go's words. Keys entries do not have
/// are removed and reported in `unknown`.
pub fn check_managed_fields(list: &mut Value, unknown: &mut Vec<String>) -> Result<(), String> {
    let mismatch = |v: &Value, field: &str, go_type: &str| {
        let json_type = match v {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        };
        format!("json: cannot unmarshal {json_type} into Go struct field {field} of type {go_type}")
    };
    let entries = match list {
        Value::Null => return Ok(()),
        Value::Array(entries) => entries,
        other => {
            return Err(mismatch(
                other,
                "ObjectMeta.metadata.managedFields",
                "[]v1.ManagedFieldsEntry",
            ));
        }
    };
    for (i, entry) in entries.iter_mut().enumerate() {
        let fields = match entry {
            Value::Null => continue,
            Value::Object(fields) => fields,
            other => {
                return Err(mismatch(
                    other,
                    "ObjectMeta.metadata.managedFields",
                    "v1.ManagedFieldsEntry",
                ));
            }
        };
        fields.retain(|key, _| {
            let known = matches!(
                key.as_str(),
                "manager"
                    | "operation"
                    | "apiVersion"
                    | "time"
                    | "fieldsType"
                    | "fieldsV1"
                    | "subresource"
            );
            if !known {
                unknown.push(format!("metadata.managedFields[{i}].{key}"));
            }
            known
        });
        for (key, value) in fields.iter() {
            let go_type = match key.as_str() {
                // Raw JSON in Go: anything decodes.
                "fieldsV1" => continue,
                "operation" => "v1.ManagedFieldsOperationType",
                "time" => "v1.Time",
                _ => "string",
            };
            if !value.is_string() && !value.is_null() {
                return Err(mismatch(
                    value,
                    &format!("ManagedFieldsEntry.metadata.managedFields.{key}"),
                    go_type,
                ));
            }
        }
        if let Some(time) = fields.get("time").and_then(Value::as_str)
            && crate::meta::parse_time(time).is_none()
        {
            return Err(format!(
                "metadata.managedFields[{i}].time: {time:?} is not an RFC 3339 time"
            ));
        }
    }
    Ok(())
}

/// Whether kube-apiserver's field manager accepts `list` as the object's new managedFields:
/// well-typed entries it cannot use are ignored in favour of the live object's.
pub(super) fn usable(list: &Value) -> bool {
    list.as_array().is_some_and(|entries| {
        entries.iter().all(|e| {
            matches!(e["operation"].as_str(), Some("Apply" | "Update"))
                && e["apiVersion"].as_str().is_some_and(|v| !v.is_empty())
                && e["fieldsType"] == "FieldsV1"
                && e.get("fieldsV1")
                    .is_none_or(|f| f.is_object() || f.is_null())
        })
    })
}

/// `[]` or `[{}]`: an explicit request to drop all managedFields (e.g. kubectl's client-side
/// to server-side apply migration).
pub(super) fn is_reset(list: &Value) -> bool {
    match list.as_array().map(Vec::as_slice) {
        Some([]) => true,
        Some([only]) => only.as_object().is_some_and(|m| m.is_empty()),
        _ => false,
    }
}
