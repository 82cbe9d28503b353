//! The OpenAPI v3 schemas of built-in kinds, generated from k8s-openapi's types (their field
//! documentation included), for `kubectl explain`: each kind with every schema it refers to,
//! under kube-apiserver's definition names (`io.k8s.api.core.v1.Pod`).

use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::api::{
    apps, batch, certificates, coordination, core, events, networking, policy, rbac,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1 as apiextensions;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1 as apiregistration;
use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde_json::{Map, Value};

/// A kind's schema: its definition name, and every definition (its own among them).
#[derive(Debug)]
pub struct KindSchema {
    pub name: String,
    pub definitions: Map<String, Value>,
}

type Generate = fn(&mut SchemaGenerator) -> Schema;

fn generate<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

/// (group, version, kind) of every built-in kind with a k8s-openapi type.
const KINDS: &[(&str, &str, &str, Generate)] = &[
    ("", "v1", "Namespace", generate::<core::v1::Namespace>),
    ("", "v1", "Node", generate::<core::v1::Node>),
    ("", "v1", "ConfigMap", generate::<core::v1::ConfigMap>),
    ("", "v1", "Secret", generate::<core::v1::Secret>),
    ("", "v1", "Event", generate::<core::v1::Event>),
    (
        "",
        "v1",
        "ServiceAccount",
        generate::<core::v1::ServiceAccount>,
    ),
    ("", "v1", "Service", generate::<core::v1::Service>),
    ("", "v1", "Pod", generate::<core::v1::Pod>),
    (
        "",
        "v1",
        "ReplicationController",
        generate::<core::v1::ReplicationController>,
    ),
    (
        "",
        "v1",
        "PersistentVolumeClaim",
        generate::<core::v1::PersistentVolumeClaim>,
    ),
    (
        "events.k8s.io",
        "v1",
        "Event",
        generate::<events::v1::Event>,
    ),
    (
        "coordination.k8s.io",
        "v1",
        "Lease",
        generate::<coordination::v1::Lease>,
    ),
    ("apps", "v1", "Deployment", generate::<apps::v1::Deployment>),
    ("apps", "v1", "ReplicaSet", generate::<apps::v1::ReplicaSet>),
    (
        "apps",
        "v1",
        "StatefulSet",
        generate::<apps::v1::StatefulSet>,
    ),
    ("apps", "v1", "DaemonSet", generate::<apps::v1::DaemonSet>),
    ("batch", "v1", "Job", generate::<batch::v1::Job>),
    ("batch", "v1", "CronJob", generate::<batch::v1::CronJob>),
    (
        "networking.k8s.io",
        "v1",
        "Ingress",
        generate::<networking::v1::Ingress>,
    ),
    (
        "networking.k8s.io",
        "v1",
        "NetworkPolicy",
        generate::<networking::v1::NetworkPolicy>,
    ),
    (
        "policy",
        "v1",
        "PodDisruptionBudget",
        generate::<policy::v1::PodDisruptionBudget>,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        generate::<rbac::v1::Role>,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        generate::<rbac::v1::ClusterRole>,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        generate::<rbac::v1::RoleBinding>,
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        generate::<rbac::v1::ClusterRoleBinding>,
    ),
    (
        "certificates.k8s.io",
        "v1beta1",
        "ClusterTrustBundle",
        generate::<certificates::v1beta1::ClusterTrustBundle>,
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        generate::<apiextensions::CustomResourceDefinition>,
    ),
    (
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        generate::<apiregistration::APIService>,
    ),
];

/// The schema of the built-in kind `group`/`version`/`kind`, if k8s-openapi has its type.
/// Generated once, on first use.
pub fn of(group: &str, version: &str, kind: &str) -> Option<&'static KindSchema> {
    static SCHEMAS: OnceLock<BTreeMap<(String, String, String), KindSchema>> = OnceLock::new();
    let schemas = SCHEMAS.get_or_init(|| {
        KINDS
            .iter()
            .map(|(group, version, kind, generate)| {
                let mut generator = SchemaSettings::openapi3().into_generator();
                let reference = generate(&mut generator);
                let name = reference
                    .get("$ref")
                    .and_then(Value::as_str)
                    .and_then(|r| r.rsplit('/').next())
                    .unwrap_or(kind)
                    .to_string();
                let definitions = generator.take_definitions(true);
                let key = (group.to_string(), version.to_string(), kind.to_string());
                (key, KindSchema { name, definitions })
            })
            .collect()
    });
    schemas.get(&(group.into(), version.into(), kind.into()))
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
