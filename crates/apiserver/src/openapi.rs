//! OpenAPI documents, as much as kubectl needs: per group/version v3 documents whose PATCH
//! operations declare the `fieldValidation` parameter (so kubectl leaves validation to the
//! server instead of validating client-side), and the schemas of custom resources (so
//! `kubectl explain` can describe them). Built-in kinds have no schemas here.

use serde_json::{Map, Value, json};

use crate::discovery::KUBERNETES_VERSION;
use crate::error::ApiError;
use crate::registry::{Registry, ResourceDef};

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

/// Swagger 2.0 document: no paths or definitions (kubectl falls back to OpenAPI v3).
pub fn v2(_registry: &Registry) -> Value {
    json!({ "swagger": "2.0", "info": info(), "paths": {}, "definitions": {} })
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
        let item = if def.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", def.plural)
        } else {
            format!("{prefix}/{}/{{name}}", def.plural)
        };
        let reference = json!({ "$ref": format!("#/components/schemas/{}", definition_name(def)) });
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
        schemas.insert(definition_name(def), schema);
    }
    Ok(
        json!({ "openapi": "3.0.0", "info": info(), "paths": paths, "components": { "schemas": schemas } }),
    )
}
