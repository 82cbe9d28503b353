//! The `caretaker.dev/v1alpha1` API: [`CertificateAuthority`] (cluster-scoped) and
//! [`IssuedCertificate`] (namespaced), and `caretaker crds`' source, [`crds`].
//!
//! Specs keep what users wrote (TTLs, algorithm names, addresses as strings), so that one bad
//! object never stops a controller from reading the others; the operator validates a spec into
//! the policy it decides with, or reports every bad field at once.
//! Defaults live twice, on purpose: in the CRD schema, so the API server fills them in and
//! `kubectl explain` shows them, and in serde, so a spec read without them means the same.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};
use kube::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod certificate_authority;
mod etcd_certificates;
mod issued_certificate;

pub use certificate_authority::{
    CertificateAuthority, CertificateAuthoritySpec, CertificateAuthorityStatus, PreviousCa,
};
pub use etcd_certificates::{
    AgentSettings, CertificateSettings, EtcdCertificates, EtcdCertificatesSpec,
    EtcdCertificatesStatus, EtcdMember, MemberSelector, MemberStatus, QuorumSettings,
    SelectorRequirement, SignerSettings, SignerStatus,
};
pub use issued_certificate::{
    IssuedCertificate, IssuedCertificateSpec, IssuedCertificateStatus, IssuerReference,
};

pub const GROUP: &str = "caretaker.dev";
pub const VERSION: &str = "v1alpha1";

/// The key of a CertificateAuthority's trust bundle in its bundle ConfigMap (and the name
/// cert-manager's trust-manager and OpenShift's service-ca use).
pub const BUNDLE_KEY: &str = "ca-bundle.crt";

/// Condition type: the object's certificate is current and in place.
pub const CONDITION_READY: &str = "Ready";
/// Condition type: something stops caretaker from doing its work (its reason says what).
pub const CONDITION_DEGRADED: &str = "Degraded";

/// Rotation when a spec sets neither `renewAtPercent` nor `renewBefore` (library-go's 0.8).
/// Not a schema default: the API server would then add it beside a `renewBefore`.
pub const DEFAULT_RENEW_AT_PERCENT: i32 = 80;
pub const DEFAULT_KEY_ALGORITHM: &str = "ECDSA-P256";
pub const DEFAULT_CA_VALIDITY: &str = "10y";
pub const DEFAULT_CERTIFICATE_VALIDITY: &str = "1y";
pub const DEFAULT_TRUST_PROPAGATION: &str = "5m";

/// What `spec.keyAlgorithm` accepts (the schema's enum; the operator maps each to its key).
pub const KEY_ALGORITHM_NAMES: [&str; 6] = [
    "ECDSA-P256",
    "ECDSA-P384",
    "Ed25519",
    "RSA-2048",
    "RSA-3072",
    "RSA-4096",
];
/// What `spec.usages` of an IssuedCertificate accepts (the schema's enum).
pub const USAGE_NAMES: [&str; 2] = ["server", "client"];

/// caretaker's CustomResourceDefinitions, CertificateAuthority first, as `caretaker crds` prints
/// them: [`CustomResourceExt::crd`] with descriptions reflowed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    let mut crds = vec![
        CertificateAuthority::crd(),
        IssuedCertificate::crd(),
        EtcdCertificates::crd(),
    ];
    for version in crds.iter_mut().flat_map(|crd| crd.spec.versions.iter_mut()) {
        let schema = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut());
        if let Some(schema) = schema {
            reflow_descriptions(schema);
        }
    }
    crds
}

/// Joins the lines of each paragraph of every description: doc comments are wrapped at the
/// source's width, and `kubectl explain` would wrap those lines again, leaving ragged text.
fn reflow_descriptions(schema: &mut JSONSchemaProps) {
    if let Some(description) = &mut schema.description {
        *description = description
            .split("\n\n")
            .map(|paragraph| {
                paragraph
                    .lines()
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect::<Vec<_>>()
            .join("\n\n");
    }
    for property in schema.properties.iter_mut().flat_map(|p| p.values_mut()) {
        reflow_descriptions(property);
    }
    match &mut schema.items {
        Some(JSONSchemaPropsOrArray::Schema(items)) => reflow_descriptions(items),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => {
            items.iter_mut().for_each(reflow_descriptions)
        }
        None => {}
    }
}

/// A namespaced object: a Secret or a ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NamespacedName {
    /// The object's name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The object's namespace.
    #[schemars(length(min = 1))]
    pub namespace: String,
}

/// A condition, as `metav1.Condition`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready` or `Degraded`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[schemars(extend("enum" = ["True", "False", "Unknown"]))]
    pub status: String,
    /// Why, in CamelCase, for machines.
    pub reason: String,
    /// Why, for people.
    pub message: String,
    /// When `status` last changed, RFC 3339.
    #[schemars(extend("format" = "date-time"))]
    pub last_transition_time: String,
    /// The `metadata.generation` this condition was set for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// What caretaker last observed and did: an IssuedCertificate's status, and the part of a
/// CertificateAuthority's that speaks of the CA that signs now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertificateStatus {
    /// `Ready` and `Degraded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Serial number of the current certificate, colon-separated hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// Start of the current certificate's validity, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub not_before: Option<String>,
    /// End of the current certificate's validity, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub not_after: Option<String>,
    /// When the current certificate is due to be replaced, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "date-time"))]
    pub next_rotation: Option<String>,
    /// The `metadata.generation` last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl CertificateStatus {
    /// This status with new `conditions`, acted on at `generation`.
    pub fn with_conditions(&self, conditions: Vec<Condition>, generation: Option<i64>) -> Self {
        Self {
            conditions,
            observed_generation: generation,
            ..self.clone()
        }
    }
}

fn default_key_algorithm() -> String {
    DEFAULT_KEY_ALGORITHM.to_string()
}

fn default_ca_validity() -> String {
    DEFAULT_CA_VALIDITY.to_string()
}

fn default_certificate_validity() -> String {
    DEFAULT_CERTIFICATE_VALIDITY.to_string()
}

fn default_trust_propagation() -> String {
    DEFAULT_TRUST_PROPAGATION.to_string()
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

    /// The CRD's version schema and printer columns, as JSON.
    fn crd(kind: &str) -> Value {
        let crd = crds()
            .into_iter()
            .find(|crd| crd.spec.names.kind == kind)
            .unwrap();
        serde_json::to_value(crd).unwrap()
    }

    fn spec_schema(kind: &str) -> Value {
        crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"].clone()
    }

    #[test]
    fn names_scope_and_versions() {
        let ca = crd("CertificateAuthority");
        assert_eq!(
            ca["metadata"]["name"],
            "certificateauthorities.caretaker.dev"
        );
        assert_eq!(ca["spec"]["scope"], "Cluster");
        let issued = crd("IssuedCertificate");
        assert_eq!(
            issued["metadata"]["name"],
            "issuedcertificates.caretaker.dev"
        );
        assert_eq!(issued["spec"]["scope"], "Namespaced");
        let etcd = crd("EtcdCertificates");
        assert_eq!(etcd["metadata"]["name"], "etcdcertificates.caretaker.dev");
        assert_eq!(etcd["spec"]["scope"], "Namespaced");
        for crd in [ca, issued, etcd] {
            assert_eq!(crd["spec"]["group"], GROUP);
            let version = &crd["spec"]["versions"][0];
            assert_eq!(version["name"], VERSION);
            assert_eq!(version["subresources"]["status"], json!({}));
        }
    }

    /// Every `description` string in `value`.
    fn descriptions(value: &Value, found: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, value) in map {
                    match value {
                        Value::String(text) if key == "description" => found.push(text.clone()),
                        other => descriptions(other, found),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|item| descriptions(item, found)),
            _ => {}
        }
    }

    #[test]
    fn descriptions_are_reflowed_paragraphs() {
        let mut found = Vec::new();
        descriptions(&serde_json::to_value(crds()).unwrap(), &mut found);
        assert!(found.len() > 40, "{}", found.len());
        for description in found {
            assert!(
                !description.replace("\n\n", "").contains('\n'),
                "{description:?}"
            );
        }
        let spec = spec_schema("CertificateAuthority");
        assert_eq!(
            spec["properties"]["keyAlgorithm"]["description"],
            "Key algorithm of each new CA: ECDSA-P256 (the default), ECDSA-P384, Ed25519, \
             RSA-2048, RSA-3072 or RSA-4096."
        );
    }

    #[test]
    fn printer_columns() {
        for kind in ["CertificateAuthority", "IssuedCertificate"] {
            let columns = crd(kind)["spec"]["versions"][0]["additionalPrinterColumns"].clone();
            let names: Vec<&str> = columns
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c["name"].as_str().unwrap())
                .collect();
            assert_eq!(
                names,
                ["Ready", "Not After", "Next Rotation", "Age"],
                "{kind}"
            );
            assert_eq!(
                columns[0]["jsonPath"],
                ".status.conditions[?(@.type==\"Ready\")].status"
            );
        }
    }

    #[test]
    fn schema_defaults_are_the_rust_defaults() {
        let ca = spec_schema("CertificateAuthority")["properties"].clone();
        assert_eq!(ca["validity"]["default"], DEFAULT_CA_VALIDITY);
        assert_eq!(ca["trustPropagation"]["default"], DEFAULT_TRUST_PROPAGATION);
        assert_eq!(ca["keyAlgorithm"]["default"], DEFAULT_KEY_ALGORITHM);
        let issued = spec_schema("IssuedCertificate")["properties"].clone();
        assert_eq!(issued["validity"]["default"], DEFAULT_CERTIFICATE_VALIDITY);
        assert_eq!(issued["keyAlgorithm"]["default"], DEFAULT_KEY_ALGORITHM);
        // A defaulted renewAtPercent would sit beside every renewBefore.
        for properties in [ca, issued] {
            assert_eq!(properties["renewAtPercent"].get("default"), None);
            assert_eq!(properties["renewBefore"].get("default"), None);
        }
    }

    #[test]
    fn schema_enums_are_the_accepted_names() {
        for kind in ["CertificateAuthority", "IssuedCertificate"] {
            assert_eq!(
                spec_schema(kind)["properties"]["keyAlgorithm"]["enum"],
                json!(KEY_ALGORITHM_NAMES),
                "{kind}"
            );
        }
        let issued = spec_schema("IssuedCertificate");
        assert_eq!(
            issued["properties"]["usages"]["items"]["enum"],
            json!(USAGE_NAMES)
        );
        assert_eq!(issued["properties"]["usages"]["minItems"], 1);
    }

    #[test]
    fn status_field_names() {
        let status = CertificateAuthorityStatus {
            certificate: CertificateStatus {
                conditions: vec![Condition {
                    type_: CONDITION_READY.into(),
                    status: "True".into(),
                    reason: "Issued".into(),
                    message: "".into(),
                    last_transition_time: "2025-01-01T00:00:00Z".into(),
                    observed_generation: Some(1),
                }],
                not_after: Some("2035-01-01T00:00:00Z".into()),
                ..Default::default()
            },
            trusted_since: Some("2034-01-01T00:00:00Z".into()),
            previous_cas: vec![PreviousCa {
                serial_number: "01".into(),
                not_after: "2030-01-01T00:00:00Z".into(),
            }],
        };
        let value = serde_json::to_value(&status).unwrap();
        assert_eq!(
            value,
            json!({
                "conditions": [{"type": "Ready", "status": "True", "reason": "Issued",
                    "message": "", "lastTransitionTime": "2025-01-01T00:00:00Z",
                    "observedGeneration": 1}],
                "notAfter": "2035-01-01T00:00:00Z",
                "trustedSince": "2034-01-01T00:00:00Z",
                "previousCAs": [{"serialNumber": "01", "notAfter": "2030-01-01T00:00:00Z"}],
            })
        );
        assert_eq!(
            serde_json::from_value::<CertificateAuthorityStatus>(value).unwrap(),
            status
        );
    }
}
