//! Just enough of Kubernetes' protobuf encoding to accept what kubectl's typed commands send
//! (`kubectl create namespace|configmap|secret|serviceaccount|token` post
//! `application/vnd.kubernetes.protobuf`).
//! Bodies are decoded into the same JSON the rest of the server works with; responses are
//! always JSON, which every client accepts. Other kinds in protobuf get 415.

use base64::Engine;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::http::media::JSON_OR_YAML;

const MAGIC: &[u8] = b"k8s\0";

/// One field of a protobuf message.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// Splits a message into (field number, value) pairs; None if malformed.
fn fields(buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let field = match key & 7 {
            0 => Field::Varint(varint(buf, &mut pos)?),
            1 => {
                pos = pos.checked_add(8).filter(|p| *p <= buf.len())?;
                continue;
            }
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len).filter(|e| *e <= buf.len())?;
                let bytes = &buf[pos..end];
                pos = end;
                Field::Bytes(bytes)
            }
            5 => {
                pos = pos.checked_add(4).filter(|p| *p <= buf.len())?;
                continue;
            }
            _ => return None,
        };
        out.push((key >> 3, field));
    }
    Some(out)
}

fn text(b: &[u8]) -> Option<Value> {
    Some(Value::String(std::str::from_utf8(b).ok()?.to_string()))
}

/// A map entry (key = 1, value = 2); `bytes_value` base64-encodes the value as JSON does.
fn map_entry(b: &[u8], bytes_value: bool) -> Option<(String, Value)> {
    let (mut k, mut v) = (String::new(), Value::String(String::new()));
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => k = std::str::from_utf8(x).ok()?.to_string(),
            (2, Field::Bytes(x)) if bytes_value => {
                v = json!(base64::engine::general_purpose::STANDARD.encode(x))
            }
            (2, Field::Bytes(x)) => v = text(x)?,
            _ => {}
        }
    }
    Some((k, v))
}

fn insert_entry(obj: &mut Map<String, Value>, key: &str, entry: (String, Value)) {
    let m = obj.entry(key).or_insert_with(|| json!({}));
    if let Some(m) = m.as_object_mut() {
        m.insert(entry.0, entry.1);
    }
}

fn push(obj: &mut Map<String, Value>, key: &str, v: Value) {
    let list = obj.entry(key).or_insert_with(|| json!([]));
    if let Some(l) = list.as_array_mut() {
        l.push(v);
    }
}

fn owner_reference(b: &[u8]) -> Option<Value> {
    let mut o = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => o.insert("kind".into(), text(x)?),
            (3, Field::Bytes(x)) => o.insert("name".into(), text(x)?),
            (4, Field::Bytes(x)) => o.insert("uid".into(), text(x)?),
            (5, Field::Bytes(x)) => o.insert("apiVersion".into(), text(x)?),
            (6, Field::Varint(x)) => o.insert("controller".into(), json!(x != 0)),
            (7, Field::Varint(x)) => o.insert("blockOwnerDeletion".into(), json!(x != 0)),
            _ => None,
        };
    }
    Some(Value::Object(o))
}

fn object_meta(b: &[u8]) -> Option<Value> {
    let mut m = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => {
                m.insert("name".into(), text(x)?);
            }
            (2, Field::Bytes(x)) => {
                m.insert("generateName".into(), text(x)?);
            }
            (3, Field::Bytes(x)) => {
                m.insert("namespace".into(), text(x)?);
            }
            (6, Field::Bytes(x)) => {
                m.insert("resourceVersion".into(), text(x)?);
            }
            (11, Field::Bytes(x)) => insert_entry(&mut m, "labels", map_entry(x, false)?),
            (12, Field::Bytes(x)) => insert_entry(&mut m, "annotations", map_entry(x, false)?),
            (13, Field::Bytes(x)) => push(&mut m, "ownerReferences", owner_reference(x)?),
            (14, Field::Bytes(x)) => push(&mut m, "finalizers", text(x)?),
            // uid, timestamps, generation and managedFields are server-owned on create.
            _ => {}
        }
    }
    Some(Value::Object(m))
}

fn decode_kind(kind: &str, raw: &[u8]) -> Option<Value> {
    let mut o = Map::new();
    for (n, f) in fields(raw)? {
        match (kind, n, f) {
            (_, 1, Field::Bytes(x)) => {
                o.insert("metadata".into(), object_meta(x)?);
            }
            ("ConfigMap", 2, Field::Bytes(x)) => insert_entry(&mut o, "data", map_entry(x, false)?),
            ("ConfigMap", 3, Field::Bytes(x)) => {
                insert_entry(&mut o, "binaryData", map_entry(x, true)?)
            }
            ("ConfigMap", 4, Field::Varint(x)) | ("Secret", 5, Field::Varint(x)) => {
                o.insert("immutable".into(), json!(x != 0));
            }
            ("Secret", 2, Field::Bytes(x)) => insert_entry(&mut o, "data", map_entry(x, true)?),
            ("Secret", 3, Field::Bytes(x)) => {
                o.insert("type".into(), text(x)?);
            }
            ("Secret", 4, Field::Bytes(x)) => {
                insert_entry(&mut o, "stringData", map_entry(x, false)?)
            }
            ("Namespace", 2, Field::Bytes(x)) => {
                let mut spec = Map::new();
                for (n, f) in fields(x)? {
                    if let (1, Field::Bytes(s)) = (n, f) {
                        push(&mut spec, "finalizers", text(s)?);
                    }
                }
                o.insert("spec".into(), Value::Object(spec));
            }
            ("SelfSubjectAccessReview", 2, Field::Bytes(x)) => {
                o.insert("spec".into(), access_review_spec(x)?);
            }
            ("SelfSubjectRulesReview", 2, Field::Bytes(x)) => {
                let mut spec = Map::new();
                for (n, f) in fields(x)? {
                    if let (1, Field::Bytes(namespace)) = (n, f) {
                        spec.insert("namespace".into(), text(namespace)?);
                    }
                }
                o.insert("spec".into(), Value::Object(spec));
            }
            ("ServiceAccount", 2, Field::Bytes(x)) => {
                push(&mut o, "secrets", reference(x, &OBJECT_REFERENCE)?)
            }
            ("ServiceAccount", 3, Field::Bytes(x)) => {
                push(&mut o, "imagePullSecrets", reference(x, &["name"])?)
            }
            ("ServiceAccount", 4, Field::Varint(x)) => {
                o.insert("automountServiceAccountToken".into(), json!(x != 0));
            }
            ("TokenRequest", 2, Field::Bytes(x)) => {
                o.insert("spec".into(), token_request_spec(x)?);
            }
            _ => {}
        }
    }
    Some(Value::Object(o))
}

/// A message of string fields numbered from 1, named `names` in order.
fn reference(b: &[u8], names: &[&str]) -> Option<Value> {
    let mut reference = Map::new();
    for (n, f) in fields(b)? {
        let name = usize::try_from(n)
            .ok()
            .and_then(|n| names.get(n.checked_sub(1)?));
        if let (Some(name), Field::Bytes(v)) = (name, f) {
            reference.insert((*name).into(), text(v)?);
        }
    }
    Some(Value::Object(reference))
}

/// `ObjectReference`'s fields (k8s.io/api/core/v1/generated.proto).
const OBJECT_REFERENCE: [&str; 7] = [
    "kind",
    "namespace",
    "name",
    "uid",
    "apiVersion",
    "resourceVersion",
    "fieldPath",
];

/// `TokenRequestSpec`: audiences = 1, boundObjectRef = 3 (kind = 1, apiVersion = 2, name = 3,
/// uid = 4), expirationSeconds = 4 (k8s.io/api/authentication/v1/generated.proto); `kubectl
/// create token` sends it in protobuf.
fn token_request_spec(b: &[u8]) -> Option<Value> {
    const BOUND_OBJECT_REFERENCE: [&str; 4] = ["kind", "apiVersion", "name", "uid"];
    let mut spec = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => push(&mut spec, "audiences", text(x)?),
            (3, Field::Bytes(x)) => {
                spec.insert(
                    "boundObjectRef".into(),
                    reference(x, &BOUND_OBJECT_REFERENCE)?,
                );
            }
            // An int64: a negative value is its two's complement.
            (4, Field::Varint(x)) => {
                spec.insert("expirationSeconds".into(), json!(x as i64));
            }
            _ => {}
        }
    }
    Some(Value::Object(spec))
}

/// `SelfSubjectAccessReviewSpec`: resourceAttributes = 1, nonResourceAttributes = 2
/// (k8s.io/api/authorization/v1/generated.proto); kubectl auth can-i sends it in protobuf.
fn access_review_spec(b: &[u8]) -> Option<Value> {
    const RESOURCE: [&str; 7] = [
        "namespace",
        "verb",
        "group",
        "version",
        "resource",
        "subresource",
        "name",
    ];
    const NON_RESOURCE: [&str; 2] = ["path", "verb"];
    let attributes = |b: &[u8], names: &[&str]| -> Option<Value> {
        let mut a = Map::new();
        for (n, f) in fields(b)? {
            let name = usize::try_from(n)
                .ok()
                .and_then(|n| names.get(n.checked_sub(1)?));
            if let (Some(name), Field::Bytes(x)) = (name, f) {
                a.insert((*name).into(), text(x)?);
            }
        }
        Some(Value::Object(a))
    };
    let mut spec = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => {
                spec.insert("resourceAttributes".into(), attributes(x, &RESOURCE)?);
            }
            (2, Field::Bytes(x)) => {
                spec.insert(
                    "nonResourceAttributes".into(),
                    attributes(x, &NON_RESOURCE)?,
                );
            }
            _ => {}
        }
    }
    Some(Value::Object(spec))
}

/// Decodes a protobuf-encoded ConfigMap, Secret, Namespace, ServiceAccount,
/// SelfSubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview (its metadata alone) or
/// TokenRequest into JSON.
pub fn decode(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "the body of the request is not a valid protobuf-encoded Kubernetes object",
        )
    };
    let envelope = body.strip_prefix(MAGIC).ok_or_else(bad)?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for (n, f) in fields(envelope).ok_or_else(bad)? {
        match (n, f) {
            (1, Field::Bytes(type_meta)) => {
                for (n, f) in fields(type_meta).ok_or_else(bad)? {
                    if let Field::Bytes(x) = f {
                        let s = String::from_utf8_lossy(x).into_owned();
                        match n {
                            1 => api_version = s,
                            2 => kind = s,
                            _ => {}
                        }
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    let known = match api_version.as_str() {
        "v1" => matches!(
            kind.as_str(),
            "ConfigMap" | "Secret" | "Namespace" | "ServiceAccount"
        ),
        "authentication.k8s.io/v1" => matches!(kind.as_str(), "TokenRequest" | "SelfSubjectReview"),
        "authorization.k8s.io/v1" => {
            matches!(
                kind.as_str(),
                "SelfSubjectAccessReview" | "SelfSubjectRulesReview"
            )
        }
        _ => false,
    };
    if !known {
        return Err(ApiError::unsupported_media_type(content_type, JSON_OR_YAML));
    }
    let mut obj = decode_kind(&kind, raw).ok_or_else(bad)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(n: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = vec![((n << 3) | 2) as u8, bytes.len() as u8];
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn decodes_a_configmap() {
        let meta = [
            field(1, b"cm"),
            field(11, &[field(1, b"app"), field(2, b"web")].concat()),
        ]
        .concat();
        let cm = [
            field(1, &meta),
            field(2, &[field(1, b"k"), field(2, b"v")].concat()),
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"ConfigMap")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &cm)].concat();
        let obj = decode(&body, "application/vnd.kubernetes.protobuf").unwrap();
        assert_eq!(
            obj,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cm", "labels": {"app": "web"}}, "data": {"k": "v"}})
        );
        assert!(decode(b"k8s\0\xff\xff", "x").is_err());

        // What `kubectl auth can-i patch machines/status -n fleet` sends.
        let attributes = [
            field(1, b"fleet"),
            field(2, b"patch"),
            field(3, b"cluster.x-k8s.io"),
            field(5, b"machines"),
            field(6, b"status"),
        ]
        .concat();
        let review = [field(1, &[]), field(2, &field(1, &attributes))].concat();
        let type_meta = [
            field(1, b"authorization.k8s.io/v1"),
            field(2, b"SelfSubjectAccessReview"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &review)].concat();
        assert_eq!(
            decode(&body, "application/vnd.kubernetes.protobuf").unwrap()["spec"],
            json!({"resourceAttributes": {"namespace": "fleet", "verb": "patch",
                "group": "cluster.x-k8s.io", "resource": "machines", "subresource": "status"}})
        );
        assert!(decode(b"nope", "x").is_err());

        // What `kubectl create serviceaccount builder` sends, and the other fields.
        let account = [
            field(1, &field(1, b"builder")),
            field(2, &[field(1, b"Secret"), field(3, b"old-token")].concat()),
            field(3, &field(1, b"registry")),
            vec![4 << 3, 0],
        ]
        .concat();
        let type_meta = [field(1, b"v1"), field(2, b"ServiceAccount")].concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &account)].concat();
        assert_eq!(
            decode(&body, "application/vnd.kubernetes.protobuf").unwrap(),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "builder"},
                "secrets": [{"kind": "Secret", "name": "old-token"}],
                "imagePullSecrets": [{"name": "registry"}],
                "automountServiceAccountToken": false})
        );

        // What `kubectl create token builder --audience vault --duration 20m
        // --bound-object-kind Secret --bound-object-name s` sends.
        let reference = [field(1, b"Secret"), field(2, b"v1"), field(3, b"s")].concat();
        let spec = [
            field(1, b"vault"),
            field(3, &reference),
            vec![4 << 3, 0xb0, 0x09], // expirationSeconds 1200
        ]
        .concat();
        let request = [field(1, &[]), field(2, &spec)].concat();
        let type_meta = [
            field(1, b"authentication.k8s.io/v1"),
            field(2, b"TokenRequest"),
        ]
        .concat();
        let body = [MAGIC.to_vec(), field(1, &type_meta), field(2, &request)].concat();
        assert_eq!(
            decode(&body, "application/vnd.kubernetes.protobuf").unwrap(),
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "metadata": {}, "spec": {"audiences": ["vault"], "expirationSeconds": 1200,
                "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": "s"}}})
        );
    }
}
