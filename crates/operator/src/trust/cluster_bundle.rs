//! trust-manager's `ClusterBundle` (`trust-manager.io/v1alpha2`, cluster-scoped), the renamed
//! Bundle, as Rust types over upstream's CRD (`deploy/upstream-crds/`), and the conversion from a
//! Bundle's spec as upstream's conversion writes it ([`from_bundle`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use super::api::{BundleSpec, BundleStatus, TargetTemplate};

/// The label on every ClusterBundle target: the ClusterBundle's name.
pub const CLUSTER_BUNDLE_LABEL: &str = "trust-manager.io/bundle";
/// The annotation on every ClusterBundle target: the hash of what was written.
pub const CLUSTER_HASH_ANNOTATION: &str = "trust-manager.io/hash";
/// The annotation with which a user takes a migrated ClusterBundle over (upstream's); caretaker
/// then stops applying the Bundle's spec to it.
pub const MIGRATED_ANNOTATION: &str = "trust-manager.io/migrated";

/// The annotation a converted ClusterBundle carries when its Bundle had a JKS target: the key
/// whose PKCS#12 entry is to be written in JKS, as before.
pub const JKS_KEY_ANNOTATION: &str = "internal.trust-manager.io/jks-key";

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "trust-manager.io",
    version = "v1alpha2",
    kind = "ClusterBundle",
    status = "BundleStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterBundleSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_refs: Option<Vec<SourceRef>>,
    #[serde(
        rename = "defaultCAs",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub default_cas: Option<DefaultCas>,
    #[serde(rename = "inLineCAs", default, skip_serializing_if = "Option::is_none")]
    pub in_line_cas: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ClusterBundleTarget>,
}

/// A ConfigMap or Secret in the trust namespace, by name or selector; `key` may hold `*`
/// wildcards (`*` alone: every key).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct SourceRef {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    pub key: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DefaultCas {
    /// `System` or `Disabled`.
    pub provider: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterBundleTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<KeyValueTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<KeyValueTarget>,
    /// Required in v1alpha2; `{}` selects every namespace.
    #[serde(default)]
    pub namespace_selector: LabelSelector,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct KeyValueTarget {
    pub data: Vec<TargetKeyValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<super::api::TargetMetadata>,
}

/// One key of a target and what is written under it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct TargetKeyValue {
    pub key: String,
    /// `PEM` (when absent) or `PKCS12`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// `LegacyRC2`, `LegacyDES` (when absent) or `Modern2023`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

/// A Bundle's spec as a ClusterBundle's, with the annotations the converted object carries
/// (upstream's `ConvertTo`): sources become `sourceRefs` (`includeAllKeys` as key `*`), inline
/// sources are joined into `inLineCAs`, `useDefaultCAs` becomes `defaultCAs.provider`, each
/// target key becomes a one-entry `data` list, additional formats are appended to every target
/// kind as PKCS#12 entries (a JKS one marked by [`JKS_KEY_ANNOTATION`], a PKCS#12 one with its
/// profile made explicit, `LegacyRC2` when unset, so its encryption does not change), and an
/// absent namespace selector becomes `{}` (every namespace, as before).
pub fn from_bundle(spec: &BundleSpec) -> (ClusterBundleSpec, BTreeMap<String, String>) {
    let mut out = ClusterBundleSpec::default();
    let mut annotations = BTreeMap::new();
    let mut refs = Vec::new();
    for source in &spec.sources {
        let reference = [
            ("ConfigMap", &source.config_map),
            ("Secret", &source.secret),
        ]
        .into_iter()
        .find_map(|(kind, r)| r.as_ref().map(|r| (kind, r)));
        if let Some((kind, reference)) = reference {
            let key = if reference.include_all_keys == Some(true) {
                "*".to_string()
            } else {
                reference.key.clone().unwrap_or_default()
            };
            refs.push(SourceRef {
                kind: kind.into(),
                name: reference.name.clone().filter(|n| !n.is_empty()),
                selector: reference.selector.clone(),
                key,
            });
        }
        if let Some(pem) = source.in_line.as_deref().filter(|p| !p.is_empty()) {
            out.in_line_cas = Some(match out.in_line_cas.take() {
                None => pem.to_string(),
                Some(before) => format!("{}\n{pem}", before.strip_suffix('\n').unwrap_or(&before)),
            });
        }
        if let Some(use_default) = source.use_default_cas {
            let provider = if use_default { "System" } else { "Disabled" };
            out.default_cas = Some(DefaultCas {
                provider: provider.into(),
            });
        }
    }
    out.source_refs = (!refs.is_empty()).then_some(refs);

    if let Some(target) = &spec.target {
        let kind = |template: &Option<TargetTemplate>| {
            template.as_ref().map(|t| KeyValueTarget {
                data: vec![TargetKeyValue {
                    key: t.key.clone(),
                    ..Default::default()
                }],
                metadata: t.metadata.clone(),
            })
        };
        let mut converted = ClusterBundleTarget {
            config_map: kind(&target.config_map),
            secret: kind(&target.secret),
            namespace_selector: target.namespace_selector.clone().unwrap_or_default(),
        };
        let mut extra = Vec::new();
        if let Some(formats) = &target.additional_formats {
            if let Some(jks) = &formats.jks {
                extra.push(TargetKeyValue {
                    key: jks.key.clone(),
                    format: Some("PKCS12".into()),
                    password: Some(jks.password.clone()),
                    profile: None,
                });
                annotations.insert(JKS_KEY_ANNOTATION.to_string(), jks.key.clone());
            }
            if let Some(pkcs12) = &formats.pkcs12 {
                extra.push(TargetKeyValue {
                    key: pkcs12.key.clone(),
                    format: Some("PKCS12".into()),
                    password: pkcs12.password.clone(),
                    profile: Some(
                        pkcs12
                            .profile
                            .clone()
                            .filter(|p| !p.is_empty())
                            .unwrap_or_else(|| "LegacyRC2".into()),
                    ),
                });
            }
        }
        for kind in [&mut converted.config_map, &mut converted.secret]
            .into_iter()
            .flatten()
        {
            kind.data.extend(extra.iter().cloned());
        }
        if converted.config_map.is_some()
            || converted.secret.is_some()
            || target.namespace_selector.is_some()
        {
            out.target = Some(converted);
        }
    }
    (out, annotations)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::trust::api::Bundle;

    fn convert(spec: serde_json::Value) -> serde_json::Value {
        let bundle: Bundle = serde_json::from_value(json!({
            "apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "b"}, "spec": spec,
        }))
        .unwrap();
        let (spec, annotations) = from_bundle(&bundle.spec);
        json!({"spec": spec, "annotations": annotations})
    }

    #[test]
    fn upstreams_migration_example_converts_as_upstream_expects() {
        // trust-manager's migration_test: inline source, ConfigMap key ca.crt, JKS key ca.jks.
        let converted = convert(json!({
            "sources": [{"inLine": "PEM4"}],
            "target": {"configMap": {"key": "ca.crt"}, "additionalFormats": {"jks": {"key": "ca.jks"}}},
        }));
        assert_eq!(
            converted,
            json!({
                "spec": {
                    "inLineCAs": "PEM4",
                    "target": {
                        "configMap": {"data": [
                            {"key": "ca.crt"},
                            {"key": "ca.jks", "format": "PKCS12", "password": "changeit"},
                        ]},
                        "namespaceSelector": {},
                    },
                },
                "annotations": {"internal.trust-manager.io/jks-key": "ca.jks"},
            })
        );
    }

    #[test]
    fn sources_inline_text_and_default_cas_convert() {
        let converted = convert(json!({
            "sources": [
                {"configMap": {"name": "roots", "key": "ca.crt"}},
                {"secret": {"selector": {"matchLabels": {"a": "b"}}, "includeAllKeys": true}},
                {"inLine": "one\n"},
                {"inLine": "two"},
                {"useDefaultCAs": true},
            ],
            "target": {
                "configMap": {"key": "ca.crt", "metadata": {"labels": {"x": "y"}}},
                "secret": {"key": "ca.crt"},
                "additionalFormats": {"pkcs12": {"key": "ca.p12", "password": ""}},
                "namespaceSelector": {"matchLabels": {"env": "prod"}},
            },
        }));
        assert_eq!(
            converted["spec"],
            json!({
                "sourceRefs": [
                    {"kind": "ConfigMap", "name": "roots", "key": "ca.crt"},
                    {"kind": "Secret", "selector": {"matchLabels": {"a": "b"}}, "key": "*"},
                ],
                "defaultCAs": {"provider": "System"},
                "inLineCAs": "one\ntwo",
                "target": {
                    "configMap": {"data": [{"key": "ca.crt"}, {"key": "ca.p12", "format": "PKCS12", "password": "", "profile": "LegacyRC2"}],
                                  "metadata": {"labels": {"x": "y"}}},
                    "secret": {"data": [{"key": "ca.crt"}, {"key": "ca.p12", "format": "PKCS12", "password": "", "profile": "LegacyRC2"}]},
                    "namespaceSelector": {"matchLabels": {"env": "prod"}},
                },
            })
        );
        assert_eq!(converted["annotations"], json!({}));
    }

    #[test]
    fn no_target_stays_no_target_and_false_default_cas_are_disabled() {
        let converted = convert(json!({"sources": [{"useDefaultCAs": false}]}));
        assert_eq!(
            converted["spec"],
            json!({"defaultCAs": {"provider": "Disabled"}})
        );
    }
}
