//! Structural schemas of CustomResourceDefinitions: pruning of unknown fields, defaulting and
//! validation, in that order (as kube-apiserver does for custom resources).
//!
//! Covered: type, nullable, properties, additionalProperties, items, required, enum, pattern,
//! min/maxLength, minimum/maximum (and exclusive), min/maxItems, min/maxProperties,
//! allOf/anyOf/oneOf/not, x-kubernetes-preserve-unknown-fields, x-kubernetes-int-or-string,
//! x-kubernetes-embedded-resource. Not covered: x-kubernetes-validations (CEL), format, uniqueItems.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::{Map, Value};

use crate::error::{FieldError, FieldErrorKind};

fn is_true(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

fn child_path(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// Fields every object keeps whatever its schema says.
const TYPE_META: &[&str] = &["apiVersion", "kind", "metadata"];

/// Removes fields the schema does not declare; returns their paths (for fieldValidation).
pub fn prune(
    schema: &Value,
    value: &mut Value,
    path: &str,
    is_root: bool,
    unknown: &mut Vec<String>,
) {
    let keep_type_meta = is_root || is_true(schema, "x-kubernetes-embedded-resource");
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties");
            let preserve = is_true(schema, "x-kubernetes-preserve-unknown-fields");
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                if keep_type_meta && TYPE_META.contains(&key.as_str()) {
                    continue;
                }
                let field_path = child_path(path, &key);
                let sub_schema = properties
                    .and_then(|p| p.get(&key))
                    .or(additional.filter(|a| a.is_object()));
                match sub_schema {
                    Some(s) => {
                        if let Some(v) = map.get_mut(&key) {
                            prune(s, v, &field_path, false, unknown);
                        }
                    }
                    None if preserve || additional == Some(&Value::Bool(true)) => {}
                    None => {
                        map.remove(&key);
                        unknown.push(field_path);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(item_schema, item, &format!("{path}[{i}]"), false, unknown);
                }
            }
        }
        _ => {}
    }
}

/// Fills in `default`s of absent properties, recursively, wherever the parent object exists.
pub fn apply_defaults(schema: &Value, value: &mut Value) {
    match value {
        Value::Object(map) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (key, prop) in props {
                    let absent = map
                        .get(key)
                        .is_none_or(|v| v.is_null() && !is_true(prop, "nullable"));
                    if absent && let Some(default) = prop.get("default") {
                        map.insert(key.clone(), default.clone());
                    }
                    if let Some(v) = map.get_mut(key) {
                        apply_defaults(prop, v);
                    }
                }
            }
            if let Some(additional) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for v in map.values_mut() {
                    apply_defaults(additional, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for item in items {
                    apply_defaults(item_schema, item);
                }
            }
        }
        _ => {}
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

fn compiled(pattern: &str) -> Option<regex::Regex> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<regex::Regex>>>> = OnceLock::new();
    let mut cache = CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    cache
        .entry(pattern.to_string())
        .or_insert_with(|| regex::Regex::new(pattern).ok())
        .clone()
}

/// Validates `value` against `schema`; errors name fields with dotted paths (`spec.replicas`).
pub fn validate(schema: &Value, value: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let invalid = |errs: &mut Vec<FieldError>, msg: String| {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            format!("{}: {msg}", short(value)),
        ))
    };
    if value.is_null() {
        if !is_true(schema, "nullable") && schema.get("type").is_some() {
            let t = schema["type"].as_str().unwrap_or("");
            errs.push(FieldError::new(
                path,
                FieldErrorKind::TypeInvalid,
                format!("\"null\": {path} in body must be of type {t}: \"null\""),
            ));
        }
        return;
    }
    let actual = json_type(value);
    if is_true(schema, "x-kubernetes-int-or-string") {
        if actual != "integer" && actual != "string" {
            errs.push(FieldError::new(
                path,
                FieldErrorKind::TypeInvalid,
                format!("\"{actual}\": {path} in body must be of type int-or-string: \"{actual}\""),
            ));
            return;
        }
    } else if let Some(t) = schema.get("type").and_then(Value::as_str) {
        let ok = t == actual || (t == "number" && actual == "integer");
        if !ok {
            errs.push(FieldError::new(
                path,
                FieldErrorKind::TypeInvalid,
                format!("\"{actual}\": {path} in body must be of type {t}: \"{actual}\""),
            ));
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(short).collect();
        errs.push(FieldError::new(
            path,
            FieldErrorKind::NotSupported,
            format!("{}: supported values: {}", short(value), list.join(", ")),
        ));
    }
    match value {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && len > max
            {
                errs.push(FieldError::new(
                    path,
                    FieldErrorKind::TooLong,
                    format!("may not be more than {max} bytes"),
                ));
            }
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && len < min
            {
                invalid(
                    errs,
                    format!("{path} in body should be at least {min} chars long"),
                );
            }
            if let Some(p) = schema.get("pattern").and_then(Value::as_str)
                && compiled(p).is_some_and(|re| !re.is_match(s))
            {
                invalid(errs, format!("{path} in body should match '{p}'"));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(0.0);
            if let Some(min) = schema.get("minimum").and_then(Value::as_f64) {
                if is_true(schema, "exclusiveMinimum") && x <= min {
                    invalid(errs, format!("{path} in body should be greater than {min}"));
                } else if x < min {
                    invalid(
                        errs,
                        format!("{path} in body should be greater than or equal to {min}"),
                    );
                }
            }
            if let Some(max) = schema.get("maximum").and_then(Value::as_f64) {
                if is_true(schema, "exclusiveMaximum") && x >= max {
                    invalid(errs, format!("{path} in body should be less than {max}"));
                } else if x > max {
                    invalid(
                        errs,
                        format!("{path} in body should be less than or equal to {max}"),
                    );
                }
            }
        }
        Value::Array(items) => {
            if let Some(max) = schema.get("maxItems").and_then(Value::as_u64)
                && items.len() as u64 > max
            {
                errs.push(FieldError::new(
                    path,
                    FieldErrorKind::TooMany,
                    format!("{}: must have at most {max} items", items.len()),
                ));
            }
            if let Some(min) = schema.get("minItems").and_then(Value::as_u64)
                && (items.len() as u64) < min
            {
                invalid(
                    errs,
                    format!("{path} in body should have at least {min} items"),
                );
            }
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    validate(item_schema, item, &format!("{path}[{i}]"), errs);
                }
            }
        }
        Value::Object(map) => validate_object(schema, map, path, errs),
        _ => {}
    }
    validate_combinators(schema, value, path, errs);
}

fn validate_object(
    schema: &Value,
    map: &Map<String, Value>,
    path: &str,
    errs: &mut Vec<FieldError>,
) {
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for key in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(key) {
                errs.push(FieldError::new(
                    child_path(path, key),
                    FieldErrorKind::Required,
                    "",
                ));
            }
        }
    }
    if let Some(max) = schema.get("maxProperties").and_then(Value::as_u64)
        && map.len() as u64 > max
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::TooMany,
            format!("{}: must have at most {max} items", map.len()),
        ));
    }
    if let Some(min) = schema.get("minProperties").and_then(Value::as_u64)
        && (map.len() as u64) < min
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            format!("{path} in body should have at least {min} properties"),
        ));
    }
    let props = schema.get("properties").and_then(Value::as_object);
    let additional = schema.get("additionalProperties").filter(|a| a.is_object());
    for (key, v) in map {
        // The root's metadata is ObjectMeta, validated elsewhere, whatever the schema says.
        if path.is_empty() && key == "metadata" {
            continue;
        }
        if let Some(s) = props.and_then(|p| p.get(key)).or(additional) {
            validate(s, v, &child_path(path, key), errs);
        }
    }
}

fn validate_combinators(schema: &Value, value: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let branch_ok = |s: &Value| {
        let mut e = Vec::new();
        validate(s, value, path, &mut e);
        e.is_empty()
    };
    if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
        for s in all {
            validate(s, value, path, errs);
        }
    }
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array)
        && !any.iter().any(branch_ok)
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            format!(
                "{}: {path} in body must match at least one schema (anyOf)",
                short(value)
            ),
        ));
    }
    if let Some(one) = schema.get("oneOf").and_then(Value::as_array)
        && one.iter().filter(|s| branch_ok(s)).count() != 1
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            format!(
                "{}: {path} in body must match exactly one schema (oneOf)",
                short(value)
            ),
        ));
    }
    if let Some(not) = schema.get("not")
        && branch_ok(not)
    {
        errs.push(FieldError::new(
            path,
            FieldErrorKind::Invalid,
            format!(
                "{}: {path} in body must not match the schema (not)",
                short(value)
            ),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "required": ["size"], "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                "port": {"x-kubernetes-int-or-string": true, "anyOf": [{"type": "integer"}, {"type": "string"}]},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}}
            }},
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
        }})
    }

    #[test]
    fn prunes_unknown_fields_and_reports_them() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
            "spec": {"size": 1, "bogus": 1, "free": {"anything": {"x": 1}}, "labels": {"a": "b"}}, "extra": true});
        let mut unknown = vec![];
        prune(&schema(), &mut obj, "", true, &mut unknown);
        assert_eq!(unknown, vec!["extra", "spec.bogus"]);
        assert_eq!(obj["spec"]["free"]["anything"]["x"], 1);
        assert_eq!(obj["metadata"]["name"], "a");
    }

    #[test]
    fn defaults_then_validates() {
        let mut obj = json!({"spec": {"size": 3}});
        apply_defaults(&schema(), &mut obj);
        assert_eq!(obj["spec"]["mode"], "a");
        let mut errs = vec![];
        validate(&schema(), &obj, "", &mut errs);
        assert!(errs.is_empty(), "{errs:?}");

        let bad = json!({"spec": {"size": 11, "mode": "c", "name": "ABCDEFG", "port": true, "tags": ["a", "b", "c"]}});
        let mut errs = vec![];
        validate(&schema(), &bad, "", &mut errs);
        let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
        assert!(text.contains(&"spec.size: Invalid value: 11: spec.size in body should be less than or equal to 10".to_string()), "{text:?}");
        assert!(
            text.contains(
                &"spec.mode: Unsupported value: \"c\": supported values: \"a\", \"b\"".to_string()
            ),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.starts_with("spec.name: Too long")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.contains("should match '^[a-z]+$'")),
            "{text:?}"
        );
        assert!(
            text.iter()
                .any(|t| t.starts_with("spec.port: Invalid value")),
            "{text:?}"
        );
        assert!(
            text.iter().any(|t| t.starts_with("spec.tags: Too many: 3")),
            "{text:?}"
        );

        let mut errs = vec![];
        validate(&schema(), &json!({"spec": {}}), "", &mut errs);
        assert_eq!(errs[0].to_string(), "spec.size: Required value");
    }
}
