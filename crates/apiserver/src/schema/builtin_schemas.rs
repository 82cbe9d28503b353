//! The built-in kinds as k8s-openapi types describe them: their OpenAPI v3 schemas (field
//! documentation included, for `kubectl explain`), each kind with every schema it refers to
//! under kube-apiserver's definition names (`io.k8s.api.core.v1.Pod`), and their merge, from
//! which strategic merge patch learns each list's strategy.

use std::sync::OnceLock;

use k8s_openapi::api::{
    admissionregistration, apps, authentication, authorization, autoscaling, batch, certificates,
    coordination, core, events, networking, policy, rbac,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1 as apiregistration;
use k8s_openapi::{DeepMerge, Resource};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// A built-in kind's schema and merge, both from its k8s-openapi type.
#[derive(Debug)]
pub struct KindSchema {
    /// kube-apiserver's definition name of the kind (`io.k8s.api.core.v1.Pod`).
    pub name: String,
    /// Every definition the kind refers to, its own among them.
    pub definitions: Map<String, Value>,
    /// k8s-openapi's `DeepMerge` of two objects of the kind, which follows the list strategies
    /// Kubernetes declares for each field (`patch_meta` learns them from it).
    pub merge: Merge,
    /// The kind's structure for server-side apply, built by `patch_meta` on first use.
    pub apply_schema: OnceLock<Value>,
}

impl KindSchema {
    /// The kind's own definition.
    pub fn root(&self) -> Option<&Value> {
        self.definitions.get(&self.name)
    }

    /// The schema a reference names, followed to the end; a documented reference is `allOf`
    /// that one reference.
    pub fn resolve<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match reference(schema).and_then(|name| self.definitions.get(name)) {
            Some(target) => self.resolve(target),
            None => schema,
        }
    }

    /// The schema of the field at `fields` below `schema` (as written in its parent, with its
    /// documentation), through list items and map values.
    pub fn field<'a>(&'a self, schema: &'a Value, fields: &[&str]) -> Option<&'a Value> {
        let Some((first, rest)) = fields.split_first() else {
            return Some(schema);
        };
        let node = self.element(self.resolve(schema));
        let child = node
            .get("properties")
            .and_then(|p| p.get(*first))
            .or_else(|| node.get("additionalProperties").filter(|a| a.is_object()))?;
        self.field(child, rest)
    }

    /// A list's item schema, or the schema itself when it is no list.
    pub fn element<'a>(&'a self, schema: &'a Value) -> &'a Value {
        match (
            schema.get("type").and_then(Value::as_str),
            schema.get("items"),
        ) {
            (Some("array"), Some(items)) => self.resolve(items),
            _ => schema,
        }
    }
}

/// The name of the definition a schema refers to: its `$ref`, or the one reference of its
/// `allOf`.
pub fn reference(schema: &Value) -> Option<&str> {
    let only = match schema
        .get("allOf")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
    {
        Some([only]) => only,
        _ => schema,
    };
    only.get("$ref")
        .and_then(Value::as_str)
        .and_then(|r| r.rsplit('/').next())
}

/// Merges `new` into `current`, both objects of one kind; `None` if either does not decode.
pub type Merge = fn(Value, Value) -> Option<Value>;

type Generate = fn(&mut SchemaGenerator) -> Schema;

struct Builtin {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    generate: Generate,
    merge: Merge,
}

const fn builtin<T>(group: &'static str, version: &'static str, kind: &'static str) -> Builtin
where
    T: JsonSchema + DeepMerge + Resource + DeserializeOwned + Serialize,
{
    Builtin {
        group,
        version,
        kind,
        generate: generate::<T>,
        merge: merge::<T>,
    }
}

fn generate<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

fn merge<T>(current: Value, new: Value) -> Option<Value>
where
    T: DeepMerge + Resource + DeserializeOwned + Serialize,
{
    // k8s-openapi checks apiVersion and kind when it decodes a kind.
    let typed = |mut value: Value| {
        let object = value.as_object_mut()?;
        object.insert("apiVersion".into(), T::API_VERSION.into());
        object.insert("kind".into(), T::KIND.into());
        serde_json::from_value::<T>(value).ok()
    };
    let mut current = typed(current)?;
    current.merge_from(typed(new)?);
    serde_json::to_value(current).ok()
}

/// Every built-in kind with a k8s-openapi type.
const KINDS: &[Builtin] = &[
    builtin::<core::v1::Namespace>("", "v1", "Namespace"),
    builtin::<core::v1::Node>("", "v1", "Node"),
    builtin::<core::v1::ConfigMap>("", "v1", "ConfigMap"),
    builtin::<core::v1::Secret>("", "v1", "Secret"),
    builtin::<core::v1::Event>("", "v1", "Event"),
    builtin::<core::v1::ServiceAccount>("", "v1", "ServiceAccount"),
    builtin::<core::v1::Service>("", "v1", "Service"),
    builtin::<core::v1::Pod>("", "v1", "Pod"),
    builtin::<core::v1::ReplicationController>("", "v1", "ReplicationController"),
    builtin::<core::v1::PersistentVolumeClaim>("", "v1", "PersistentVolumeClaim"),
    builtin::<events::v1::Event>("events.k8s.io", "v1", "Event"),
    builtin::<coordination::v1::Lease>("coordination.k8s.io", "v1", "Lease"),
    builtin::<apps::v1::Deployment>("apps", "v1", "Deployment"),
    builtin::<apps::v1::ReplicaSet>("apps", "v1", "ReplicaSet"),
    builtin::<apps::v1::StatefulSet>("apps", "v1", "StatefulSet"),
    builtin::<apps::v1::DaemonSet>("apps", "v1", "DaemonSet"),
    builtin::<autoscaling::v1::Scale>("autoscaling", "v1", "Scale"),
    builtin::<batch::v1::Job>("batch", "v1", "Job"),
    builtin::<batch::v1::CronJob>("batch", "v1", "CronJob"),
    builtin::<networking::v1::Ingress>("networking.k8s.io", "v1", "Ingress"),
    builtin::<networking::v1::NetworkPolicy>("networking.k8s.io", "v1", "NetworkPolicy"),
    builtin::<policy::v1::PodDisruptionBudget>("policy", "v1", "PodDisruptionBudget"),
    builtin::<rbac::v1::Role>("rbac.authorization.k8s.io", "v1", "Role"),
    builtin::<rbac::v1::ClusterRole>("rbac.authorization.k8s.io", "v1", "ClusterRole"),
    builtin::<rbac::v1::RoleBinding>("rbac.authorization.k8s.io", "v1", "RoleBinding"),
    builtin::<rbac::v1::ClusterRoleBinding>(
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
    ),
    builtin::<certificates::v1beta1::ClusterTrustBundle>(
        "certificates.k8s.io",
        "v1beta1",
        "ClusterTrustBundle",
    ),
    builtin::<admissionregistration::v1::ValidatingWebhookConfiguration>(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
    ),
    builtin::<admissionregistration::v1::MutatingWebhookConfiguration>(
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
    ),
    builtin::<apiextensions::CustomResourceDefinition>(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
    ),
    builtin::<apiregistration::APIService>("apiregistration.k8s.io", "v1", "APIService"),
    // Created, answered, never stored: their schemas name the fields of their protobuf bodies.
    builtin::<authentication::v1::TokenRequest>("authentication.k8s.io", "v1", "TokenRequest"),
    builtin::<authentication::v1::SelfSubjectReview>(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
    ),
    builtin::<authorization::v1::SelfSubjectAccessReview>(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
    ),
    builtin::<authorization::v1::SelfSubjectRulesReview>(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
    ),
];

/// The schema of the built-in kind `group`/`version`/`kind`, if k8s-openapi has its type.
/// Each kind's is generated on its first use (writes look theirs up; a kind nobody uses costs
/// nothing).
pub fn of(group: &str, version: &str, kind: &str) -> Option<&'static KindSchema> {
    static SCHEMAS: [OnceLock<KindSchema>; KINDS.len()] = [const { OnceLock::new() }; KINDS.len()];
    let at = KINDS
        .iter()
        .position(|b| (b.group, b.version, b.kind) == (group, version, kind))?;
    Some(SCHEMAS[at].get_or_init(|| {
        let builtin = &KINDS[at];
        let mut generator = SchemaSettings::openapi3().into_generator();
        let reference = (builtin.generate)(&mut generator);
        let name = reference
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.rsplit('/').next())
            .unwrap_or(builtin.kind)
            .to_string();
        KindSchema {
            name,
            definitions: generator.take_definitions(true),
            merge: builtin.merge,
            apply_schema: OnceLock::new(),
        }
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_has_its_documented_fields_and_every_schema_it_refers_to() {
        let pod = of("", "v1", "Pod").expect("Pods have a schema");
        assert_eq!(pod.name, "io.k8s.api.core.v1.Pod");
        let spec = &pod.definitions["io.k8s.api.core.v1.PodSpec"];
        let restart = &spec["properties"]["restartPolicy"]["description"];
        assert!(
            restart.as_str().unwrap().contains("Restart policy"),
            "{restart}"
        );
        // Every reference resolves within the definitions.
        let text = serde_json::to_string(&pod.definitions).unwrap();
        for reference in text.split("\"$ref\":\"").skip(1) {
            let target = reference.split('"').next().unwrap();
            let name = target
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("{target}"));
            assert!(
                pod.definitions.contains_key(name),
                "{name} is referred to but missing"
            );
        }
        assert!(of("", "v1", "Nothing").is_none());
    }
}
