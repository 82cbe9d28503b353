//! OpenAPI documents, as much as kubectl needs: per group/version v3 documents whose PATCH
//! operations declare the `fieldValidation` parameter (so kubectl leaves validation to the
//! server instead of validating client-side), and the schemas of custom resources (so
//! `kubectl explain` can describe them). Built-in kinds have no schemas here.

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

/// Swagger 2.0 document: no paths or definitions (kubectl falls back to OpenAPI v3).
pub fn v2(_registry: &Registry) -> Value {
    json!({ "swagger": "2.0", "info": info(), "paths": {}, "definitions": {} })
}

/// The media type of OpenAPI v2 in protobuf (gnostic's `openapi_v2.Document`), which kubectl
/// asks `/openapi/v2` for when it validates a kind its OpenAPI v3 cache does not know yet (an
/// object of a CRD created by the same `kubectl apply`).
/// (The second is its older spelling.)
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

/// [`v2`] as protobuf: `Document { swagger: "2.0" (1), info (2): { title (1), version (2) },
/// paths (8): {} }`, so that kubectl finds no definition and leaves validation to the server.
pub fn v2_protobuf() -> Vec<u8> {
    fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2];
        let mut len = bytes.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
        out.extend_from_slice(bytes);
        out
    }
    let info = info();
    let text = |key: &str| info[key].as_str().unwrap_or_default().as_bytes().to_vec();
    let info = [field(1, &text("title")), field(2, &text("version"))].concat();
    [field(1, b"2.0"), field(2, &info), field(8, &[])].concat()
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
    fn openapi_v2_in_protobuf_is_a_document_with_its_version_and_no_paths() {
        let bytes = v2_protobuf();
        // swagger = "2.0"
        assert_eq!(&bytes[..5], &[0x0a, 3, b'2', b'.', b'0']);
        // info, holding the title and version of the JSON form
        assert_eq!(bytes[5], 0x12);
        let info_len = bytes[6] as usize;
        let info = &bytes[7..7 + info_len];
        let title = v2(&Registry::new())["info"]["title"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(&info[..2], &[0x0a, title.len() as u8]);
        assert_eq!(&info[2..2 + title.len()], title.as_bytes());
        // paths, empty, last
        assert_eq!(&bytes[7 + info_len..], &[0x42, 0]);
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
