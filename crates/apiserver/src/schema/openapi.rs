//! OpenAPI documents, as much as kubectl needs: per group/version v3 documents whose PATCH
//! operations declare the `fieldValidation` parameter (so kubectl leaves validation to the
//! server instead of validating client-side), and the schemas of custom resources (so
//! `kubectl explain` can describe them), and the Swagger 2.0 document built from them.

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::schema::discovery::KUBERNETES_VERSION;
use crate::store::registry::{Registry, ResourceDef};

fn info() -> Value {
    json!({ "title": "Kubernetes (caretaker embedded API server)", "version": format!("v{}.{}.0", KUBERNETES_VERSION.0, KUBERNETES_VERSION.1) })
}

/// The OpenAPI definition name of a kind: reversed group, version, kind (`io.x-k8s.cluster.v1beta2.Cluster`).
fn definition_name(def: &ResourceDef) -> String {
    let group = if def.group.is_empty() {
        "io.k8s.api.core".to_string()
    } else {
        def.group.split('.').rev().collect::<Vec<_>>().join(".")
    };
    format!("{group}.{}.{}", def.version, def.kind)
}

fn gvk(def: &ResourceDef) -> Value {
    json!({ "group": def.group, "version": def.version, "kind": def.kind })
}

/// The Swagger 2.0 document: every group/version's paths and schemas, as their OpenAPI v3
/// documents have them (built from them), in Swagger 2.0's form: definitions referred to as
/// `#/definitions/…`, query parameters typed in place, responses' schemas without media types.
pub fn v2(registry: &Registry) -> Value {
    let mut paths = Map::new();
    let mut definitions = Map::new();
    for (group, versions) in registry.groups() {
        for version in versions {
            let Ok(v3) = v3_group_version(registry, &group, &version) else {
                continue;
            };
            for (path, item) in v3["paths"].as_object().into_iter().flatten() {
                paths.insert(path.clone(), v2_path_item(item));
            }
            for (name, schema) in v3["components"]["schemas"]
                .as_object()
                .into_iter()
                .flatten()
            {
                definitions
                    .entry(name.clone())
                    .or_insert_with(|| v2_schema(schema));
            }
        }
    }
    json!({ "swagger": "2.0", "info": info(), "paths": paths, "definitions": definitions })
}

/// A v3 path item's operations in Swagger 2.0's form.
fn v2_path_item(item: &Value) -> Value {
    let mut out = Map::new();
    for (method, operation) in item.as_object().into_iter().flatten() {
        let mut operation = operation.clone();
        let parameters: Vec<Value> = operation["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| json!({ "name": p["name"], "in": p["in"], "type": "string", "uniqueItems": true }))
            .collect();
        operation["parameters"] = json!(parameters);
        let schema =
            v2_schema(&operation["responses"]["200"]["content"]["application/json"]["schema"]);
        operation["responses"] = json!({ "200": { "description": "OK", "schema": schema } });
        out.insert(method.clone(), operation);
    }
    Value::Object(out)
}

/// A v3 schema in Swagger 2.0's form: references to `#/definitions/…`; a documented reference
/// (v3's `allOf` of the one reference) as the reference with its description beside it, as
/// kube-apiserver writes v2; no `nullable`, which v2 lacks.
fn v2_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(object) => {
            let mut out = Map::new();
            for (key, value) in object {
                match (key.as_str(), value) {
                    ("$ref", Value::String(target)) => {
                        let name = target.rsplit('/').next().unwrap_or_default();
                        out.insert(key.clone(), json!(format!("#/definitions/{name}")));
                    }
                    ("allOf", Value::Array(all))
                        if all.len() == 1 && all[0].get("$ref").is_some() =>
                    {
                        if let Value::Object(reference) = v2_schema(&all[0]) {
                            out.extend(reference);
                        }
                    }
                    ("nullable", _) => {}
                    // Properties, definitions and extensions hold names, not keywords.
                    ("properties", Value::Object(properties)) => {
                        let properties = properties
                            .iter()
                            .map(|(name, property)| (name.clone(), v2_schema(property)))
                            .collect();
                        out.insert(key.clone(), Value::Object(properties));
                    }
                    // Values, not schemas.
                    ("default" | "enum" | "example", value) => {
                        out.insert(key.clone(), value.clone());
                    }
                    (extension, value) if extension.starts_with("x-") => {
                        out.insert(key.clone(), value.clone());
                    }
                    _ => {
                        out.insert(key.clone(), v2_schema(value));
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(v2_schema).collect()),
        other => other.clone(),
    }
}

/// The media type of OpenAPI v2 in protobuf (gnostic's `openapi_v2.Document`), which kubectl
/// asks `/openapi/v2` for (`kubectl explain --output=plaintext-openapiv2`, and when it
/// validates a kind its OpenAPI v3 cache does not know yet: an object of a CRD created by the
/// same `kubectl apply`). (The second is its older spelling.)
const V2_PROTOBUF: [&str; 2] = [
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
];

/// Whether the request's `Accept` prefers the protobuf form: its first media range names it,
/// as kubectl's does. Anything else gets JSON, as kube-apiserver gives it.
pub fn wants_v2_protobuf(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .and_then(|accept| accept.split(',').next())
        .is_some_and(|first| {
            let media = first.split(';').next().unwrap_or("").trim();
            V2_PROTOBUF.contains(&media)
        })
}

/// [`v2`] in protobuf.
pub fn v2_protobuf(registry: &Registry) -> Vec<u8> {
    crate::schema::gnostic::encode(&v2(registry))
}

pub fn v3_root(registry: &Registry) -> Value {
    let mut paths = Map::new();
    for (group, versions) in registry.groups() {
        for v in versions {
            let gv_path = if group.is_empty() {
                format!("api/{v}")
            } else {
                format!("apis/{group}/{v}")
            };
            // The hash only has to change when the document does; the resource count and names are enough here.
            let defs = registry.resources_in(&group, &v);
            let hash = defs.iter().fold(defs.len() as u64, |h, d| {
                d.plural
                    .bytes()
                    .chain(
                        d.schema
                            .as_ref()
                            .map(|s| s.to_string())
                            .unwrap_or_default()
                            .bytes(),
                    )
                    .fold(h, |h, b| h.wrapping_mul(31).wrapping_add(b as u64))
            });
            paths.insert(
                gv_path.clone(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{gv_path}?hash={hash:016X}") }),
            );
        }
    }
    json!({ "paths": paths })
}

pub fn v3_group_version(
    registry: &Registry,
    group: &str,
    version: &str,
) -> Result<Value, ApiError> {
    let defs = registry.resources_in(group, version);
    if defs.is_empty() {
        return Err(ApiError::unknown_resource());
    }
    let prefix = if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    };
    let mut paths = Map::new();
    let mut schemas = Map::new();
    let query = |name: &str| json!({ "name": name, "in": "query", "schema": { "type": "string", "uniqueItems": true } });
    for def in &defs {
        // A built-in kind's schema comes from k8s-openapi, with every schema it refers to;
        // a custom resource's is its CRD's.
        let builtin = (def.flavor != crate::store::registry::Flavor::CustomResource)
            .then(|| crate::schema::builtin_schemas::of(&def.group, &def.version, &def.kind))
            .flatten();
        let name = builtin.map_or_else(|| definition_name(def), |b| b.name.clone());
        let item = if def.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", def.plural)
        } else {
            format!("{prefix}/{}/{{name}}", def.plural)
        };
        let reference = json!({ "$ref": format!("#/components/schemas/{name}") });
        let ok = json!({ "200": { "description": "OK", "content": { "application/json": { "schema": reference } } } });
        let operation = |id: &str, params: Vec<Value>| {
            json!({
                "operationId": format!("{id}{}", def.kind),
                "parameters": params,
                "responses": ok,
                "x-kubernetes-action": id,
                "x-kubernetes-group-version-kind": gvk(def),
            })
        };
        paths.insert(
            item,
            json!({
                "get": operation("get", vec![]),
                "put": operation("replace", vec![query("dryRun"), query("fieldManager"), query("fieldValidation")]),
                "patch": operation("patch", vec![query("dryRun"), query("fieldManager"), query("fieldValidation"), query("force")]),
                "delete": operation("delete", vec![query("dryRun"), query("propagationPolicy")]),
            }),
        );
        if let Some(builtin) = builtin {
            for (definition, schema) in &builtin.definitions {
                schemas
                    .entry(definition.clone())
                    .or_insert_with(|| schema.clone());
            }
            if let Some(own) = schemas.get_mut(&name) {
                own["x-kubernetes-group-version-kind"] = json!([gvk(def)]);
            }
            continue;
        }
        let mut schema = def.schema.as_deref().cloned().unwrap_or_else(
            || json!({ "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
        );
        schema["x-kubernetes-group-version-kind"] = json!([gvk(def)]);
        if let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert(
                "metadata".into(),
                json!({ "description": "Standard object's metadata.", "type": "object", "x-kubernetes-preserve-unknown-fields": true }),
            );
        }
        schemas.insert(name, schema);
    }
    Ok(
        json!({ "openapi": "3.0.0", "info": info(), "paths": paths, "components": { "schemas": schemas } }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openapi_v2_in_protobuf_holds_the_json_documents_paths_and_definitions() {
        use prost::Message;
        let registry = Registry::new();
        let json = v2(&registry);
        let bytes = v2_protobuf(&registry);
        let doc = crate::schema::gnostic::Document::decode(bytes.as_slice()).unwrap();
        assert_eq!(doc.swagger, "2.0");
        assert_eq!(doc.info.unwrap().title, json["info"]["title"]);
        assert_eq!(
            doc.paths.unwrap().path.len(),
            json["paths"].as_object().unwrap().len()
        );
        let definitions = doc.definitions.unwrap().additional_properties;
        assert_eq!(
            definitions.len(),
            json["definitions"].as_object().unwrap().len()
        );
        let config_map = definitions
            .iter()
            .find(|d| d.name == "io.k8s.api.core.v1.ConfigMap")
            .and_then(|d| d.value.as_ref())
            .unwrap();
        // Vendor extensions are YAML text (JSON is YAML).
        let gvk = config_map
            .vendor_extension
            .iter()
            .find(|e| e.name == "x-kubernetes-group-version-kind")
            .and_then(|e| e.value.as_ref())
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&gvk.yaml).unwrap(),
            json!([{"group": "", "version": "v1", "kind": "ConfigMap"}])
        );
        let data = config_map
            .properties
            .as_ref()
            .unwrap()
            .additional_properties
            .iter()
            .find(|p| p.name == "data")
            .and_then(|p| p.value.as_ref())
            .unwrap();
        assert_eq!(data.r#type.as_ref().unwrap().value, ["object"]);
        let values = data.additional_properties.as_ref().unwrap();
        assert_eq!(
            values
                .schema
                .as_ref()
                .unwrap()
                .r#type
                .as_ref()
                .unwrap()
                .value,
            ["string"]
        );
    }

    #[test]
    fn protobuf_is_served_only_to_who_asks_for_it_first() {
        let with = |accept: &str| {
            let mut headers = axum::http::HeaderMap::new();
            headers.insert(axum::http::header::ACCEPT, accept.parse().unwrap());
            wants_v2_protobuf(&headers)
        };
        assert!(with(V2_PROTOBUF[0]));
        assert!(with(
            "application/com.github.proto-openapi.spec.v2.v1.0+protobuf, application/json"
        ));
        assert!(!with("application/json"));
        assert!(!with(
            "application/json, application/com.github.proto-openapi.spec.v2@v1.0+protobuf"
        ));
        assert!(!wants_v2_protobuf(&axum::http::HeaderMap::new()));
    }
}
