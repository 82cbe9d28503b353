//! Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`,
//! which kubectl's typed commands and client-go's typed clients send), decoded by k8s-pb's
//! generated types into the same JSON the rest of the server works with. Answers stay JSON,
//! which every client accepts.
//!
//! k8s-pb's prost messages have neither serde nor reflection, so the JSON is made from each
//! decoded message's `Debug` text (`printed`), its fields named by the kind's own OpenAPI schema
//! (prost's snake_case `pod_cidr` is the schema's `podCIDR`: names are matched without case and
//! underscores, never re-cased), and Go's JSON rules applied where protobuf differs: a value
//! field's zero that Go writes in protobuf but leaves out of JSON (`omitted_zeros`), an inlined
//! struct (a Volume's `volumeSource`) merged into its parent, and Kubernetes' own types (`Time`,
//! `MicroTime`, `IntOrString`, `Quantity`, `RawExtension`, …) as their JSON forms.

mod omitted_zeros;
mod printed;

use base64::Engine;
use k8s_pb::api::{
    admissionregistration, apps, authentication, authorization, autoscaling, batch, certificates,
    coordination, core, events, networking, policy, rbac,
};
use prost::Message;
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::http::media::JSON_OR_YAML;
use crate::schema::builtin_schemas::{self, KindSchema};
use printed::Printed;

const MAGIC: &[u8] = b"k8s\0";

/// A kind's message decoded by its k8s-pb type, as its `Debug` text.
type Print = fn(&[u8]) -> Result<String, prost::DecodeError>;

fn print<T: Message + Default + std::fmt::Debug>(raw: &[u8]) -> Result<String, prost::DecodeError> {
    T::decode(raw).map(|message| format!("{message:?}"))
}

/// Every built-in kind served whose body may be protobuf (custom resources have no protobuf
/// form; CustomResourceDefinition and APIService, whose types k8s-pb has but this table has not,
/// are sent as JSON by every client), by apiVersion and kind.
const KINDS: &[(&str, &str, Print)] = &[
    ("v1", "Namespace", print::<core::v1::Namespace>),
    ("v1", "Node", print::<core::v1::Node>),
    ("v1", "ConfigMap", print::<core::v1::ConfigMap>),
    ("v1", "Secret", print::<core::v1::Secret>),
    ("v1", "Event", print::<core::v1::Event>),
    ("v1", "ServiceAccount", print::<core::v1::ServiceAccount>),
    ("v1", "Service", print::<core::v1::Service>),
    ("v1", "Pod", print::<core::v1::Pod>),
    (
        "v1",
        "ReplicationController",
        print::<core::v1::ReplicationController>,
    ),
    (
        "v1",
        "PersistentVolumeClaim",
        print::<core::v1::PersistentVolumeClaim>,
    ),
    ("events.k8s.io/v1", "Event", print::<events::v1::Event>),
    (
        "coordination.k8s.io/v1",
        "Lease",
        print::<coordination::v1::Lease>,
    ),
    ("apps/v1", "Deployment", print::<apps::v1::Deployment>),
    ("apps/v1", "ReplicaSet", print::<apps::v1::ReplicaSet>),
    ("apps/v1", "StatefulSet", print::<apps::v1::StatefulSet>),
    ("apps/v1", "DaemonSet", print::<apps::v1::DaemonSet>),
    ("autoscaling/v1", "Scale", print::<autoscaling::v1::Scale>),
    ("batch/v1", "Job", print::<batch::v1::Job>),
    ("batch/v1", "CronJob", print::<batch::v1::CronJob>),
    (
        "networking.k8s.io/v1",
        "Ingress",
        print::<networking::v1::Ingress>,
    ),
    (
        "networking.k8s.io/v1",
        "NetworkPolicy",
        print::<networking::v1::NetworkPolicy>,
    ),
    (
        "policy/v1",
        "PodDisruptionBudget",
        print::<policy::v1::PodDisruptionBudget>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "Role",
        print::<rbac::v1::Role>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        print::<rbac::v1::ClusterRole>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "RoleBinding",
        print::<rbac::v1::RoleBinding>,
    ),
    (
        "rbac.authorization.k8s.io/v1",
        "ClusterRoleBinding",
        print::<rbac::v1::ClusterRoleBinding>,
    ),
    (
        "certificates.k8s.io/v1beta1",
        "ClusterTrustBundle",
        print::<certificates::v1beta1::ClusterTrustBundle>,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingWebhookConfiguration",
        print::<admissionregistration::v1::ValidatingWebhookConfiguration>,
    ),
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
        print::<admissionregistration::v1::MutatingWebhookConfiguration>,
    ),
    (
        "authentication.k8s.io/v1",
        "TokenRequest",
        print::<authentication::v1::TokenRequest>,
    ),
    (
        "authentication.k8s.io/v1",
        "SelfSubjectReview",
        print::<authentication::v1::SelfSubjectReview>,
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectAccessReview",
        print::<authorization::v1::SelfSubjectAccessReview>,
    ),
    (
        "authorization.k8s.io/v1",
        "SelfSubjectRulesReview",
        print::<authorization::v1::SelfSubjectRulesReview>,
    ),
];

/// Decodes a protobuf body: kube's envelope (`k8s\0` and a `runtime.Unknown` holding the
/// apiVersion, kind and the object's bytes), then the object as its kind's JSON. A kind without
/// a protobuf form here is 415, naming the types to send instead.
pub fn decode(body: &[u8], content_type: &str) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "the body of the request is not a valid protobuf-encoded Kubernetes object",
        )
    };
    let envelope = body.strip_prefix(MAGIC).ok_or_else(bad)?;
    let unknown =
        k8s_pb::apimachinery::pkg::runtime::Unknown::decode(envelope).map_err(|_| bad())?;
    let type_meta = unknown.type_meta.unwrap_or_default();
    let api_version = type_meta.api_version.unwrap_or_default();
    let kind = type_meta.kind.unwrap_or_default();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let (Some((_, _, print)), Some(schema)) = (
        KINDS
            .iter()
            .find(|(v, k, _)| (*v, *k) == (api_version.as_str(), kind.as_str())),
        builtin_schemas::of(group, version, &kind),
    ) else {
        return Err(ApiError::unsupported_media_type(content_type, JSON_OR_YAML));
    };
    let raw = unknown.raw.as_deref().unwrap_or_default();
    within_field_budget(raw)?;
    let text = print(raw).map_err(|_| bad())?;
    let printed = printed::parse(&text).ok_or_else(bad)?;
    let root = schema.root().ok_or_else(bad)?;
    let mut object = Json { kind: schema }
        .value(&printed, root, &schema.name)
        .map_err(|_| bad())?
        .unwrap_or_else(|| json!({}));
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    Ok(object)
}

/// The most fields (at every depth) a protobuf body may hold. A decoded message is far larger
/// than its wire form (an empty Container is 2 bytes on the wire and about 2 KB as a prost
/// struct, then its `Debug` text and its JSON), so a 3 MiB body of empty messages would take
/// gigabytes; the fields are counted on the wire before anything is decoded. Objects that
/// clients create hold hundreds; a ConfigMap's map entry counts 3.
pub const MAX_PROTOBUF_FIELDS: usize = 30_000;
/// How deep the count follows nested messages (prost itself stops at 100).
const MAX_PROTOBUF_DEPTH: usize = 100;

/// Refuses (413) a body with more than [`MAX_PROTOBUF_FIELDS`] fields, counting those of every
/// length-delimited value that reads as a message too (a string that happens to read as one is
/// counted as well: the count is an upper bound, never an allocation).
fn within_field_budget(raw: &[u8]) -> Result<(), ApiError> {
    let mut budget = MAX_PROTOBUF_FIELDS;
    if count_fields(raw, 0, &mut budget).is_none() && budget == 0 {
        return Err(ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "the protobuf body holds more than {MAX_PROTOBUF_FIELDS} fields; send it as JSON"
            ),
        ));
    }
    Ok(())
}

/// Counts the fields of `bytes` read as a message against `budget`; `None` when they do not
/// read as one (then nothing of them is counted further by the caller) or the budget ran out.
fn count_fields(mut bytes: &[u8], depth: usize, budget: &mut usize) -> Option<()> {
    fn varint(bytes: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = bytes.split_first()?;
            *bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    while !bytes.is_empty() {
        *budget = budget.checked_sub(1)?;
        let key = varint(&mut bytes)?;
        if key >> 3 == 0 {
            return None;
        }
        match key & 7 {
            0 => {
                varint(&mut bytes)?;
            }
            1 => bytes = bytes.get(8..)?,
            5 => bytes = bytes.get(4..)?,
            2 => {
                let length = usize::try_from(varint(&mut bytes)?).ok()?;
                let (value, rest) = (bytes.get(..length)?, bytes.get(length..)?);
                bytes = rest;
                if depth < MAX_PROTOBUF_DEPTH && !value.is_empty() {
                    // Counted only if it reads as a message; a budget spent inside is final.
                    let before = *budget;
                    if count_fields(value, depth + 1, budget).is_none() {
                        if *budget == 0 {
                            return None;
                        }
                        *budget = before;
                    }
                }
            }
            _ => return None,
        }
    }
    Some(())
}

/// A value that does not have its field's type.
#[derive(Debug)]
struct Mistyped;

/// The JSON of printed messages of one kind, named and typed by the kind's schema.
struct Json {
    kind: &'static KindSchema,
}

impl Json {
    /// `schema` with its references followed, and the name of the definition it ends at (or
    /// `definition`, the one it is written in, if it is no reference).
    fn resolve(
        &self,
        schema: &'static Value,
        definition: &'static str,
    ) -> (&'static Value, &'static str) {
        let kind: &'static KindSchema = self.kind;
        match builtin_schemas::reference(schema)
            .and_then(|name| kind.definitions.get_key_value(name))
        {
            Some((name, target)) => self.resolve(target, name),
            None => (schema, definition),
        }
    }

    /// `printed` as JSON of `schema` (written in the definition `definition`); None for an
    /// absent optional field.
    fn value(
        &self,
        printed: &Printed,
        schema: &'static Value,
        definition: &'static str,
    ) -> Result<Option<Value>, Mistyped> {
        let (schema, definition) = self.resolve(schema, definition);
        Ok(Some(match printed {
            Printed::None => return Ok(None),
            Printed::Some(inner) => return self.value(inner, schema, definition),
            Printed::Str(text) => json!(text),
            Printed::Bool(flag) => json!(flag),
            Printed::Number(number) => number
                .parse::<i64>()
                .map(Value::from)
                .or_else(|_| number.parse::<f64>().map(Value::from))
                .map_err(|_| Mistyped)?,
            // Bytes are a list of numbers; JSON has them in base64.
            Printed::Bytes(bytes) if schema["type"] == "string" => {
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            }
            Printed::List(empty) if empty.is_empty() && schema["type"] == "string" => json!(""),
            Printed::Bytes(numbers) => json!(numbers),
            Printed::List(items) => {
                let item = schema.get("items").ok_or(Mistyped)?;
                let items = items
                    .iter()
                    .map(|i| self.value(i, item, definition))
                    .collect::<Result<Vec<_>, _>>()?;
                Value::Array(
                    items
                        .into_iter()
                        .map(|i| i.unwrap_or(Value::Null))
                        .collect(),
                )
            }
            Printed::Map(entries) => {
                let values = schema
                    .get("additionalProperties")
                    .filter(|s| s.is_object())
                    .ok_or(Mistyped)?;
                let mut map = Vec::new();
                for (key, value) in entries {
                    let Printed::Str(key) = key else {
                        return Err(Mistyped);
                    };
                    let value = self.value(value, values, definition)?;
                    map.push((key.clone(), value.unwrap_or(Value::Null)));
                }
                // Sorted by key, as Go writes maps (prost's are hash maps).
                map.sort_by(|(a, _), (b, _)| a.cmp(b));
                Value::Object(map.into_iter().collect())
            }
            Printed::Message(name, fields) => match special(name, fields)? {
                Some(value) => value,
                None => Value::Object(self.object(fields, schema, definition)?),
            },
        }))
    }

    /// A message's fields as the properties of `schema`, the definition `definition`.
    fn object(
        &self,
        fields: &[(String, Printed)],
        schema: &'static Value,
        definition: &'static str,
    ) -> Result<Map<String, Value>, Mistyped> {
        let properties = schema.get("properties").and_then(Value::as_object);
        let mut object = Map::new();
        for (field, printed) in fields {
            // An empty repeated field or map is no field on the wire: Go decodes it as nil,
            // which its JSON leaves out.
            if matches!(printed, Printed::List(l) if l.is_empty())
                || matches!(printed, Printed::Map(m) if m.is_empty())
            {
                continue;
            }
            let wanted = plain(field);
            let property = properties
                .into_iter()
                .flatten()
                .find(|(name, _)| plain(name) == wanted);
            match property {
                Some((name, property)) => {
                    let Some(value) = self.value(printed, property, definition)? else {
                        continue;
                    };
                    if is_zero(&value) && omitted_when_zero(definition, name) {
                        continue;
                    }
                    object.insert(name.clone(), value);
                }
                // A Go struct inlined into its parent's JSON is a message of its own in
                // protobuf (a Volume's `volumeSource`, a Probe's `handler`).
                None => {
                    let inlined = match printed {
                        Printed::Some(inner) => inner.as_ref(),
                        other => other,
                    };
                    if let Printed::Message(_, fields) = inlined {
                        object.extend(self.object(fields, schema, definition)?);
                    }
                    // Else a field the server's schema lacks: dropped, as unknown fields are.
                }
            }
        }
        Ok(object)
    }
}

/// Whether Go's JSON leaves the field `name` of `definition` out when it is zero, where Go's
/// protobuf writes it (a value field with `omitempty`, not a pointer).
fn omitted_when_zero(definition: &str, name: &str) -> bool {
    omitted_zeros::OMITTED_ZEROS
        .iter()
        .any(|(d, names)| *d == definition && names.contains(&name))
}

/// A field or property name without case or underscores, the same for prost's and JSON's.
fn plain(name: &str) -> String {
    name.chars()
        .filter(|c| *c != '_')
        .flat_map(char::to_lowercase)
        .collect()
}

/// Go's zero values of scalars.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

/// Kubernetes' types whose JSON is not their fields (apimachinery's custom JSON marshalers),
/// by their k8s-pb names; None for any other message.
fn special(name: &str, fields: &[(String, Printed)]) -> Result<Option<Value>, Mistyped> {
    let field = |wanted: &str| {
        fields
            .iter()
            .find(|(f, _)| f == wanted)
            .map(|(_, printed)| match printed {
                Printed::Some(inner) => inner.as_ref(),
                other => other,
            })
            .filter(|printed| **printed != Printed::None)
    };
    let text = |wanted: &str| match field(wanted) {
        Some(Printed::Str(s)) => Ok(Some(s.clone())),
        None => Ok(None),
        Some(_) => Err(Mistyped),
    };
    let number = |wanted: &str| match field(wanted) {
        Some(Printed::Number(n)) => n.parse::<i64>().map_err(|_| Mistyped),
        None => Ok(0),
        Some(_) => Err(Mistyped),
    };
    let bytes = |wanted: &str| match field(wanted) {
        Some(Printed::Bytes(bytes)) => Ok(Some(bytes.clone())),
        Some(Printed::List(empty)) if empty.is_empty() => Ok(Some(Vec::new())),
        None => Ok(None),
        Some(_) => Err(Mistyped),
    };
    Ok(Some(match name {
        // Go's zero time is null; any other is RFC 3339 in UTC, to the second (Time) or the
        // microsecond (MicroTime).
        "Time" | "MicroTime" => {
            let (seconds, nanos) = (number("seconds")?, number("nanos")?);
            if (seconds, nanos) == (0, 0) {
                return Ok(Some(Value::Null));
            }
            let at = time::OffsetDateTime::from_unix_timestamp(seconds)
                .ok()
                .and_then(|t| t.replace_nanosecond(u32::try_from(nanos).ok()?).ok())
                .ok_or(Mistyped)?;
            let seconds = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                at.year(),
                u8::from(at.month()),
                at.day(),
                at.hour(),
                at.minute(),
                at.second()
            );
            if name == "Time" {
                json!(format!("{seconds}Z"))
            } else {
                json!(format!("{seconds}.{:06}Z", at.microsecond()))
            }
        }
        // `type` 1 is a string, anything else the integer.
        "IntOrString" => match number("type")? {
            1 => json!(text("str_val")?.unwrap_or_default()),
            _ => json!(number("int_val")?),
        },
        "Quantity" => json!(text("string")?.unwrap_or_default()),
        "Duration" => json!(text("duration")?.unwrap_or_default()),
        // Embedded JSON, written as it is (a managedFields entry's fields, a raw object).
        "RawExtension" | "FieldsV1" => match bytes("raw")? {
            Some(raw) => serde_json::from_slice(&raw).map_err(|_| Mistyped)?,
            None => Value::Null,
        },
        _ => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_pb::apimachinery::pkg::api::resource::Quantity;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};
    use k8s_pb::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

    /// `message` as kubectl sends it: kube's envelope around it.
    fn body(api_version: &str, kind: &str, message: &impl Message) -> Vec<u8> {
        envelope(api_version, kind, message.encode_to_vec())
    }

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
            }),
            raw: Some(raw),
            content_encoding: Some(String::new()),
            content_type: Some(String::new()),
        };
        [MAGIC.to_vec(), unknown.encode_to_vec()].concat()
    }

    fn some(s: &str) -> Option<String> {
        Some(s.into())
    }

    /// What Go's protobuf writes for every ObjectMeta: its value fields, zero or not.
    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: some(name),
            generate_name: some(""),
            namespace: some(""),
            self_link: some(""),
            uid: some(""),
            resource_version: some(""),
            generation: Some(0),
            creation_timestamp: Some(Time::default()),
            labels: BTreeMap::from([("app".into(), "web".into())]),
            ..Default::default()
        }
    }

    /// The attack: empty Containers cost 2 bytes each on the wire and kilobytes decoded; a
    /// body of many is refused before anything is decoded, while a ConfigMap with thousands of
    /// keys still decodes.
    #[test]
    fn a_body_of_too_many_fields_is_refused_before_it_is_decoded() {
        use k8s_pb::api::core::v1 as core;
        let pod = core::Pod {
            metadata: Some(meta("flood")),
            spec: Some(core::PodSpec {
                containers: vec![core::Container::default(); MAX_PROTOBUF_FIELDS],
                ..Default::default()
            }),
            ..Default::default()
        };
        let flood = body("v1", "Pod", &pod);
        assert!(flood.len() < 100 * 1024, "{} bytes", flood.len());
        let refused = decode(&flood, PROTOBUF).unwrap_err();
        assert_eq!(refused.code, 413, "{}", refused.message);
        assert!(
            refused.message.contains("30000 fields"),
            "{}",
            refused.message
        );

        let keys = 5_000;
        let config_map = core::ConfigMap {
            metadata: Some(meta("many-keys")),
            data: (0..keys)
                .map(|i| (format!("k{i}"), format!("v{i}")))
                .collect(),
            ..Default::default()
        };
        let decoded = decode(&body("v1", "ConfigMap", &config_map), PROTOBUF).unwrap();
        assert_eq!(decoded["data"].as_object().unwrap().len(), keys);
        assert_eq!(decoded["data"]["k4999"], "v4999");
    }

    #[test]
    fn a_deployment_is_the_json_go_would_write() {
        use k8s_pb::api::core::v1 as core;
        let container = core::Container {
            name: some("web"),
            image: some("nginx"),
            working_dir: some(""),
            ports: vec![core::ContainerPort {
                container_port: Some(80),
                host_port: Some(0),
                protocol: some("TCP"),
                ..Default::default()
            }],
            resources: Some(core::ResourceRequirements {
                limits: BTreeMap::from([(
                    "cpu".into(),
                    Quantity {
                        string: some("500m"),
                    },
                )]),
                ..Default::default()
            }),
            liveness_probe: Some(core::Probe {
                handler: Some(core::ProbeHandler {
                    http_get: Some(core::HttpGetAction {
                        path: some("/"),
                        port: Some(IntOrString {
                            r#type: Some(1),
                            int_val: Some(0),
                            str_val: some("http"),
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                initial_delay_seconds: Some(0),
                ..Default::default()
            }),
            security_context: Some(core::SecurityContext {
                allow_privilege_escalation: Some(false),
                ..Default::default()
            }),
            stdin: Some(false),
            tty: Some(false),
            ..Default::default()
        };
        let deployment = apps::v1::Deployment {
            metadata: Some(meta("web")),
            spec: Some(apps::v1::DeploymentSpec {
                replicas: Some(0),
                min_ready_seconds: Some(0),
                paused: Some(false),
                selector: Some(k8s_pb::apimachinery::pkg::apis::meta::v1::LabelSelector {
                    match_labels: BTreeMap::from([("app".into(), "web".into())]),
                    ..Default::default()
                }),
                strategy: Some(apps::v1::DeploymentStrategy::default()),
                template: Some(core::PodTemplateSpec {
                    metadata: Some(meta("")),
                    spec: Some(core::PodSpec {
                        containers: vec![container],
                        volumes: vec![core::Volume {
                            name: some("data"),
                            volume_source: Some(core::VolumeSource {
                                empty_dir: Some(core::EmptyDirVolumeSource::default()),
                                ..Default::default()
                            }),
                        }],
                        host_network: Some(false),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            status: Some(apps::v1::DeploymentStatus {
                replicas: Some(0),
                ..Default::default()
            }),
        };
        let decoded = decode(&body("apps/v1", "Deployment", &deployment), PROTOBUF).unwrap();
        assert_eq!(
            decoded,
            json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "creationTimestamp": null, "labels": {"app": "web"}},
                "spec": {
                    // A pointer's zero is a value; a value field's zero (minReadySeconds,
                    // paused) is what Go's JSON leaves out.
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": "web"}},
                    "strategy": {},
                    "template": {
                        "metadata": {"creationTimestamp": null, "labels": {"app": "web"}},
                        "spec": {
                            "containers": [{
                                "name": "web",
                                "image": "nginx",
                                "ports": [{"containerPort": 80, "protocol": "TCP"}],
                                "resources": {"limits": {"cpu": "500m"}},
                                "livenessProbe": {"httpGet": {"path": "/", "port": "http"}},
                                "securityContext": {"allowPrivilegeEscalation": false}
                            }],
                            "volumes": [{"name": "data", "emptyDir": {}}]
                        }
                    }
                },
                "status": {}
            })
        );
    }

    #[test]
    fn names_come_from_the_schema_and_kubernetes_types_are_their_json() {
        use k8s_pb::api::core::v1 as core;
        // prost's `pod_cidr` and `pod_cid_rs` are `podCIDR` and `podCIDRs`.
        let node = core::Node {
            metadata: Some(meta("n1")),
            spec: Some(core::NodeSpec {
                pod_cidr: some("10.0.0.0/24"),
                pod_cid_rs: vec!["10.0.0.0/24".into()],
                ..Default::default()
            }),
            status: None,
        };
        let decoded = decode(&body("v1", "Node", &node), PROTOBUF).unwrap();
        assert_eq!(
            decoded["spec"],
            json!({"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"]})
        );

        // Bytes are base64, a port an integer, times RFC 3339.
        let secret = core::Secret {
            metadata: Some(meta("s")),
            data: BTreeMap::from([("k".into(), b"\x00\xffv".to_vec())]),
            r#type: some("Opaque"),
            ..Default::default()
        };
        let decoded = decode(&body("v1", "Secret", &secret), PROTOBUF).unwrap();
        assert_eq!(decoded["data"], json!({"k": "AP92"}));
        let service = core::Service {
            metadata: Some(meta("svc")),
            spec: Some(core::ServiceSpec {
                cluster_ip: some("None"),
                ports: vec![core::ServicePort {
                    port: Some(80),
                    target_port: Some(IntOrString {
                        r#type: Some(0),
                        int_val: Some(8080),
                        str_val: some(""),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            status: None,
        };
        let decoded = decode(&body("v1", "Service", &service), PROTOBUF).unwrap();
        assert_eq!(
            decoded["spec"],
            json!({"clusterIP": "None", "ports": [{"port": 80, "targetPort": 8080}]})
        );
        let event = core::Event {
            metadata: Some(meta("e")),
            first_timestamp: Some(Time {
                seconds: Some(1_700_000_000),
                nanos: Some(0),
            }),
            event_time: Some(MicroTime {
                seconds: Some(1_700_000_000),
                nanos: Some(123_456_789),
            }),
            ..Default::default()
        };
        let decoded = decode(&body("v1", "Event", &event), PROTOBUF).unwrap();
        assert_eq!(decoded["firstTimestamp"], "2023-11-14T22:13:20Z");
        assert_eq!(decoded["eventTime"], "2023-11-14T22:13:20.123456Z");
    }

    #[test]
    fn what_is_not_a_served_kind_in_protobuf_is_refused() {
        let malformed = decode(b"k8s\0\xff\xff", PROTOBUF).unwrap_err();
        assert_eq!(malformed.code, 400);
        assert_eq!(decode(b"nope", PROTOBUF).unwrap_err().code, 400);
        let custom = decode(&body("example.dev/v1", "Widget", &meta("w")), PROTOBUF).unwrap_err();
        assert_eq!(custom.code, 415);
        // A ConfigMap's field 2 (data) as a varint: not a ConfigMap.
        let wrong = decode(&envelope("v1", "ConfigMap", vec![2 << 3, 1]), PROTOBUF).unwrap_err();
        assert_eq!(wrong.code, 400);
    }

    #[test]
    fn reviews_and_token_requests_decode() {
        use authentication::v1 as authn;
        use authorization::v1 as authz;
        // What `kubectl auth can-i patch machines/status -n fleet` sends.
        let review = authz::SelfSubjectAccessReview {
            metadata: Some(ObjectMeta::default()),
            spec: Some(authz::SelfSubjectAccessReviewSpec {
                resource_attributes: Some(authz::ResourceAttributes {
                    namespace: some("fleet"),
                    verb: some("patch"),
                    group: some("cluster.x-k8s.io"),
                    version: some(""),
                    resource: some("machines"),
                    subresource: some("status"),
                    name: some(""),
                    ..Default::default()
                }),
                non_resource_attributes: None,
            }),
            status: None,
        };
        let decoded = decode(
            &body(
                "authorization.k8s.io/v1",
                "SelfSubjectAccessReview",
                &review,
            ),
            PROTOBUF,
        )
        .unwrap();
        assert_eq!(
            decoded["spec"],
            json!({"resourceAttributes": {"namespace": "fleet", "verb": "patch",
                "group": "cluster.x-k8s.io", "resource": "machines", "subresource": "status"}})
        );
        // What `kubectl create token builder --audience vault --duration 20m
        // --bound-object-kind Secret --bound-object-name s` sends.
        let request = authn::TokenRequest {
            metadata: Some(ObjectMeta::default()),
            spec: Some(authn::TokenRequestSpec {
                audiences: vec!["vault".into()],
                expiration_seconds: Some(1200),
                bound_object_ref: Some(authn::BoundObjectReference {
                    kind: some("Secret"),
                    api_version: some("v1"),
                    name: some("s"),
                    u_id: some(""),
                }),
            }),
            status: None,
        };
        let decoded = decode(
            &body("authentication.k8s.io/v1", "TokenRequest", &request),
            PROTOBUF,
        )
        .unwrap();
        assert_eq!(
            decoded,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                "metadata": {}, "spec": {"audiences": ["vault"], "expirationSeconds": 1200,
                "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": "s"}}})
        );
    }
}
