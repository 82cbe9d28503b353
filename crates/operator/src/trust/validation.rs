//! trust-manager's admission rules for a Bundle ([`problems`], its webhook at
//! `/validate-trust-cert-manager-io-v1alpha1-bundle`) and a ClusterBundle
//! ([`cluster_bundle_problems`]), with its field paths and messages: every problem is listed, in
//! trust-manager's order, each as `<field>: <Invalid value: "<value>" | Forbidden>: <why>`.
//! Label selectors, labels and annotations are checked as apimachinery's validation checks
//! them, with its messages (trust-manager calls it); keys of a map are checked in key order,
//! where Go's map order is random.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::api::{Bundle, SourceObjectKeySelector, TargetMetadata};
use super::cluster_bundle::{ClusterBundle, KeyValueTarget};
use super::selector::{label_value_errors, qualified_name_errors};

/// The problems of `bundle`, none when it is valid.
pub fn problems(bundle: &Bundle) -> Vec<String> {
    let mut found = Vec::new();
    let spec = &bundle.spec;
    let mut sources = 0;
    let mut default_cas = 0;
    for (i, source) in spec.sources.iter().enumerate() {
        let path = format!("spec.sources[{i}]");
        let mut kinds = 0;
        for (kind, reference) in [
            ("configMap", &source.config_map),
            ("secret", &source.secret),
        ] {
            if let Some(reference) = reference {
                sources += 1;
                kinds += 1;
                object_key_selector(&mut found, &format!("{path}.{kind}"), kind, reference);
            }
        }
        if source.in_line.as_deref().is_some_and(|p| !p.is_empty()) {
            sources += 1;
            kinds += 1;
        }
        if let Some(use_default) = source.use_default_cas {
            default_cas += 1;
            kinds += 1;
            if use_default {
                sources += 1;
            }
        }
        if kinds != 1 {
            found.push(format!(
                "{path}: Forbidden: must define exactly one source type for each item but found {kinds} defined types"
            ));
        }
    }
    if sources == 0 {
        found.push("spec.sources: Forbidden: must define at least one source".into());
    }
    if default_cas > 1 {
        found.push(format!(
            "spec.sources: Forbidden: must request default CAs either once or not at all but got {default_cas} requests"
        ));
    }

    let target = spec.target.clone().unwrap_or_default();
    let name = bundle.metadata.name.as_deref().unwrap_or_default();
    for (kind, template, references) in [
        (
            "configMap",
            &target.config_map,
            spec.sources
                .iter()
                .map(|s| &s.config_map)
                .collect::<Vec<_>>(),
        ),
        (
            "secret",
            &target.secret,
            spec.sources.iter().map(|s| &s.secret).collect(),
        ),
    ] {
        let Some(template) = template else { continue };
        for (i, reference) in references.into_iter().enumerate() {
            let Some(reference) = reference else { continue };
            let source_name = reference.name.as_deref().unwrap_or_default();
            let key = reference.key.as_deref().unwrap_or_default();
            if source_name == name && key == template.key {
                found.push(format!(
                    "spec.sources[{i}].{kind}.{source_name}.{key}: Forbidden: cannot define the same source as target"
                ));
            }
        }
    }

    if let Some(formats) = &target.additional_formats {
        let mut keys: Vec<&str> = [&target.config_map, &target.secret]
            .into_iter()
            .flatten()
            .map(|t| t.key.as_str())
            .collect();
        let named = [
            ("jks", formats.jks.as_ref().map(|f| f.key.as_str())),
            ("pkcs12", formats.pkcs12.as_ref().map(|f| f.key.as_str())),
        ];
        for (format, key) in named {
            let Some(key) = key else { continue };
            if keys.contains(&key) {
                found.push(format!(
                    "spec.target.additionalFormats.{format}.key: Invalid value: {key:?}: key must be unique across all target output keys"
                ));
            }
            keys.push(key);
        }
    }

    for (kind, template) in [
        ("configMap", &target.config_map),
        ("secret", &target.secret),
    ] {
        if let Some(template) = template {
            let metadata = template.metadata.clone().unwrap_or_default();
            target_metadata(
                &mut found,
                &format!("spec.target.{kind}.metadata"),
                &metadata,
            );
        }
    }
    label_selector(
        &mut found,
        "spec.target.namespaceSelector",
        target.namespace_selector.as_ref(),
    );
    found
}

/// The problems of a ClusterBundle, none when it is valid: trust-manager's ClusterBundle webhook
/// (label selectors, target labels and annotations), preceded by the CRD's CEL rules, with their
/// messages, for API servers that do not run them.
pub fn cluster_bundle_problems(bundle: &ClusterBundle) -> Vec<String> {
    let mut found = Vec::new();
    let spec = &bundle.spec;
    for (i, reference) in spec.source_refs.iter().flatten().enumerate() {
        let path = format!("spec.sourceRefs[{i}]");
        let named = reference.name.as_deref().is_some_and(|n| !n.is_empty());
        if named == reference.selector.is_some() {
            found.push(format!(
                "{path}: Invalid value: exactly one of the fields in [name selector] must be set"
            ));
        }
        label_selector(
            &mut found,
            &format!("{path}.selector"),
            reference.selector.as_ref(),
        );
    }
    let Some(target) = &spec.target else {
        return found;
    };
    if target.config_map.is_none() && target.secret.is_none() {
        found.push(
            "spec.target: Invalid value: at least one of the fields in [configMap secret] must be set"
                .into(),
        );
    }
    for (kind, template) in [
        ("configMap", &target.config_map),
        ("secret", &target.secret),
    ] {
        let Some(KeyValueTarget { data, metadata }) = template else {
            continue;
        };
        for (i, entry) in data.iter().enumerate() {
            let pkcs12 = entry.format.as_deref() == Some("PKCS12");
            for (field, set) in [
                ("password", entry.password.is_some()),
                ("profile", entry.profile.is_some()),
            ] {
                if set && !pkcs12 {
                    found.push(format!(
                        "spec.target.{kind}.data[{i}].{field}: Forbidden: may only be set when format is 'PKCS12'"
                    ));
                }
            }
        }
        let metadata = metadata.clone().unwrap_or_default();
        let path = format!("spec.target.{kind}.metadata");
        let empty = BTreeMap::new();
        let annotations = metadata.annotations.as_ref().unwrap_or(&empty);
        let labels = metadata.labels.as_ref().unwrap_or(&empty);
        for (what, map) in [("annotations", annotations), ("labels", labels)] {
            if map.keys().any(|k| k.starts_with("trust-manager.io/")) {
                found.push(format!(
                    "{path}.{what}: Forbidden: must not use forbidden domains as prefixes (e.g., trust-manager.io)"
                ));
            }
        }
        validate_annotations(&mut found, &format!("{path}.annotations"), annotations);
        validate_labels(&mut found, &format!("{path}.labels"), labels);
    }
    label_selector(
        &mut found,
        "spec.target.namespaceSelector",
        Some(&target.namespace_selector),
    );
    found
}

fn object_key_selector(
    found: &mut Vec<String>,
    path: &str,
    kind: &str,
    reference: &SourceObjectKeySelector,
) {
    let name = reference.name.as_deref().unwrap_or_default();
    let key = reference.key.as_deref().unwrap_or_default();
    let all = reference.include_all_keys.unwrap_or(false);
    if name.is_empty() && reference.selector.is_none() {
        found.push(format!(
            "{path}: Invalid value: \"name: ' ', selector: nil\": must validate one and only one schema (oneOf): [name, selector]. Found none valid"
        ));
    }
    if !name.is_empty() && reference.selector.is_some() {
        found.push(format!(
            "{path}: Invalid value: \"name: {name}, selector: {{}}\": must validate one and only one schema (oneOf): [name, selector]. Found both set"
        ));
    }
    if key.is_empty() && !all {
        found.push(format!(
            "{path}: Invalid value: \"key: ' ', includeAllKeys: false\": source {kind} key must be defined when includeAllKeys is false"
        ));
    }
    if !key.is_empty() && all {
        found.push(format!(
            "{path}: Invalid value: \"key: {key}, includeAllKeys: true\": source {kind} key cannot be defined when includeAllKeys is true"
        ));
    }
    label_selector(
        found,
        &format!("{path}.selector"),
        reference.selector.as_ref(),
    );
}

fn target_metadata(found: &mut Vec<String>, path: &str, metadata: &TargetMetadata) {
    let empty = BTreeMap::new();
    let annotations = metadata.annotations.as_ref().unwrap_or(&empty);
    let labels = metadata.labels.as_ref().unwrap_or(&empty);
    for (what, map) in [("annotations", annotations), ("labels", labels)] {
        for key in map.keys() {
            for prefix in ["trust.cert-manager.io/", "trust-manager.io/"] {
                if key.starts_with(prefix) {
                    found.push(format!(
                        "{path}.{what}: Invalid value: {key:?}: {prefix}* {what} are not allowed"
                    ));
                }
            }
        }
        match what {
            "annotations" => validate_annotations(found, &format!("{path}.{what}"), map),
            _ => validate_labels(found, &format!("{path}.{what}"), map),
        }
    }
}

/// apimachinery's `ValidateLabels`: keys, then values, at the map's own path.
fn validate_labels(found: &mut Vec<String>, path: &str, labels: &BTreeMap<String, String>) {
    for (key, value) in labels {
        for why in qualified_name_errors(key) {
            found.push(format!("{path}: Invalid value: {key:?}: {why}"));
        }
        for why in label_value_errors(value) {
            found.push(format!("{path}: Invalid value: {value:?}: {why}"));
        }
    }
}

/// apimachinery's `ValidateAnnotations`: keys (checked lowercased) and the total size.
fn validate_annotations(
    found: &mut Vec<String>,
    path: &str,
    annotations: &BTreeMap<String, String>,
) {
    for key in annotations.keys() {
        for why in qualified_name_errors(&key.to_lowercase()) {
            found.push(format!("{path}: Invalid value: {key:?}: {why}"));
        }
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > 256 * 1024 {
        found.push(format!(
            "{path}: Too long: may not be more than 262144 bytes"
        ));
    }
}

/// apimachinery's `ValidateLabelSelector`.
fn label_selector(found: &mut Vec<String>, path: &str, selector: Option<&LabelSelector>) {
    let Some(selector) = selector else { return };
    let empty = BTreeMap::new();
    let labels = selector.match_labels.as_ref().unwrap_or(&empty);
    validate_labels(found, &format!("{path}.matchLabels"), labels);
    for (i, expression) in selector.match_expressions.iter().flatten().enumerate() {
        let at = format!("{path}.matchExpressions[{i}]");
        let values = expression.values.as_deref().unwrap_or_default();
        match expression.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => found.push(format!(
                "{at}.values: Required value: must be specified when `operator` is 'In' or 'NotIn'"
            )),
            "Exists" | "DoesNotExist" if !values.is_empty() => found.push(format!(
                "{at}.values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'"
            )),
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => found.push(format!(
                "{at}.operator: Invalid value: {other:?}: not a valid selector operator"
            )),
        }
        for why in qualified_name_errors(&expression.key) {
            found.push(format!(
                "{at}.key: Invalid value: {:?}: {why}",
                expression.key
            ));
        }
        for (j, value) in values.iter().enumerate() {
            for why in label_value_errors(value) {
                found.push(format!("{at}.values[{j}]: Invalid value: {value:?}: {why}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::trust::selector::{NAME_REGEX, NAME_SHAPE};

    /// The problems of a Bundle named `test-bundle` with this spec.
    fn of(spec: Value) -> Vec<String> {
        let bundle: Bundle = serde_json::from_value(json!({
            "apiVersion": "trust.cert-manager.io/v1alpha1",
            "kind": "Bundle",
            "metadata": {"name": "test-bundle"},
            "spec": spec,
        }))
        .unwrap();
        problems(&bundle)
    }

    const TARGET: &str = r#"{"configMap": {"key": "test"}}"#;

    fn target() -> Value {
        serde_json::from_str(TARGET).unwrap()
    }

    #[test]
    fn a_good_bundle_has_no_problem() {
        let spec = json!({
            "sources": [{"configMap": {"name": "roots", "key": "ca.crt"}}, {"useDefaultCAs": true}],
            "target": {"configMap": {"key": "ca.crt", "metadata": {"labels": {"app": "x"}}},
                       "additionalFormats": {"jks": {"key": "ca.jks"}, "pkcs12": {"key": "ca.p12"}},
                       "namespaceSelector": {"matchLabels": {"env": "prod"}}},
        });
        assert_eq!(of(spec), Vec::<String>::new());
    }

    #[test]
    fn sources_need_exactly_one_kind_each_and_one_effective_source() {
        assert_eq!(
            of(json!({"sources": [], "target": target()})),
            ["spec.sources: Forbidden: must define at least one source"]
        );
        assert_eq!(
            of(json!({"sources": [
                {"configMap": {"name": "a", "key": "k"}, "inLine": "x"},
                {"inLine": "x"},
                {"secret": {"name": "b", "key": "k"}, "useDefaultCAs": false},
            ], "target": target()})),
            [
                "spec.sources[0]: Forbidden: must define exactly one source type for each item but found 2 defined types",
                "spec.sources[2]: Forbidden: must define exactly one source type for each item but found 2 defined types",
            ]
        );
        assert_eq!(
            of(json!({"sources": [{}], "target": target()})),
            [
                "spec.sources[0]: Forbidden: must define exactly one source type for each item but found 0 defined types",
                "spec.sources: Forbidden: must define at least one source",
            ]
        );
        assert_eq!(
            of(json!({"sources": [{"useDefaultCAs": false}], "target": target()})),
            ["spec.sources: Forbidden: must define at least one source"],
            "useDefaultCAs: false is no source"
        );
        assert_eq!(
            of(
                json!({"sources": [{"useDefaultCAs": true}, {"useDefaultCAs": false}], "target": target()})
            ),
            [
                "spec.sources: Forbidden: must request default CAs either once or not at all but got 2 requests"
            ]
        );
    }

    #[test]
    fn name_or_selector_and_key_or_all_keys() {
        assert_eq!(
            of(
                json!({"sources": [{"configMap": {}}, {"inLine": "x"}, {"secret": {}}], "target": target()})
            ),
            [
                "spec.sources[0].configMap: Invalid value: \"name: ' ', selector: nil\": must validate one and only one schema (oneOf): [name, selector]. Found none valid",
                "spec.sources[0].configMap: Invalid value: \"key: ' ', includeAllKeys: false\": source configMap key must be defined when includeAllKeys is false",
                "spec.sources[2].secret: Invalid value: \"name: ' ', selector: nil\": must validate one and only one schema (oneOf): [name, selector]. Found none valid",
                "spec.sources[2].secret: Invalid value: \"key: ' ', includeAllKeys: false\": source secret key must be defined when includeAllKeys is false",
            ]
        );
        assert_eq!(
            of(json!({"sources": [
                {"configMap": {"name": "some-config-map", "selector": {}, "key": "test", "includeAllKeys": true}},
            ], "target": target()})),
            [
                "spec.sources[0].configMap: Invalid value: \"name: some-config-map, selector: {}\": must validate one and only one schema (oneOf): [name, selector]. Found both set",
                "spec.sources[0].configMap: Invalid value: \"key: test, includeAllKeys: true\": source configMap key cannot be defined when includeAllKeys is true",
            ]
        );
    }

    #[test]
    fn a_source_cannot_be_its_own_target() {
        assert_eq!(
            of(
                json!({"sources": [{"inLine": "x"}, {"configMap": {"name": "test-bundle", "key": "test"}}], "target": target()})
            ),
            [
                "spec.sources[1].configMap.test-bundle.test: Forbidden: cannot define the same source as target"
            ]
        );
    }

    #[test]
    fn output_keys_are_unique_and_reserved_metadata_is_refused() {
        assert_eq!(
            of(json!({"sources": [{"inLine": "x"}], "target": {
                "configMap": {"key": "bar"}, "additionalFormats": {"jks": {"key": "bar"}, "pkcs12": {"key": "bar"}}}})),
            [
                "spec.target.additionalFormats.jks.key: Invalid value: \"bar\": key must be unique across all target output keys",
                "spec.target.additionalFormats.pkcs12.key: Invalid value: \"bar\": key must be unique across all target output keys",
            ]
        );
        assert_eq!(
            of(
                json!({"sources": [{"inLine": "x"}], "target": {"configMap": {"key": "k", "metadata": {
                    "annotations": {"trust-manager.io/hash": "x"},
                    "labels": {"trust.cert-manager.io/bundle": "x"},
                }}}})
            ),
            [
                "spec.target.configMap.metadata.annotations: Invalid value: \"trust-manager.io/hash\": trust-manager.io/* annotations are not allowed",
                "spec.target.configMap.metadata.labels: Invalid value: \"trust.cert-manager.io/bundle\": trust.cert-manager.io/* labels are not allowed",
            ]
        );
    }

    #[test]
    fn selectors_and_label_keys_are_checked() {
        let problems = of(
            json!({"sources": [{"inLine": "x"}], "target": {"configMap": {"key": "k"},
            "namespaceSelector": {"matchLabels": {"@@@@": "x"}}}}),
        );
        assert_eq!(problems.len(), 1);
        assert_eq!(
            problems,
            [format!(
                "spec.target.namespaceSelector.matchLabels: Invalid value: \"@@@@\": name part must {NAME_SHAPE}"
            )]
        );
        let problems = of(
            json!({"sources": [{"inLine": "x"}], "target": {"configMap": {"key": "k", "metadata": {"labels": {"ok": "not ok"}}}}}),
        );
        assert_eq!(
            problems,
            [
                "spec.target.configMap.metadata.labels: Invalid value: \"not ok\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
            ]
        );
    }

    /// A ClusterBundle `validation-x` with this spec.
    fn of_cluster(spec: Value) -> Vec<String> {
        let bundle: ClusterBundle = serde_json::from_value(json!({
            "apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle",
            "metadata": {"name": "validation-x"}, "spec": spec,
        }))
        .unwrap();
        cluster_bundle_problems(&bundle)
    }

    fn cluster_target(kind: &str, entry: Value, metadata: Value) -> Value {
        json!({"namespaceSelector": {}, kind: {"data": [entry], "metadata": metadata}})
    }

    /// trust-manager's ClusterBundle validation test cases, with its expected messages.
    #[test]
    fn cluster_bundles_are_refused_as_upstreams_tests_expect() {
        let bad_name = format!("name part must {NAME_SHAPE}");
        assert_eq!(
            of_cluster(
                json!({"sourceRefs": [{"kind": "ConfigMap", "selector": {"matchLabels": {"@@@@": "test"}}, "key": "ca.crt"}]})
            ),
            [format!(
                "spec.sourceRefs[0].selector.matchLabels: Invalid value: \"@@@@\": {bad_name}"
            )]
        );
        for refs in [
            json!([{"kind": "ConfigMap", "key": "ca.crt"}]),
            json!([{"kind": "ConfigMap", "name": "ca", "selector": {}, "key": "ca.crt"}]),
        ] {
            assert_eq!(
                of_cluster(json!({"sourceRefs": refs})),
                [
                    "spec.sourceRefs[0]: Invalid value: exactly one of the fields in [name selector] must be set"
                ]
            );
        }
        assert_eq!(
            of_cluster(
                json!({"sourceRefs": [{"kind": "Secret", "selector": {}, "key": "*"}],
                "target": {"namespaceSelector": {"matchLabels": {"@@@@": "test"}}, "configMap": {"data": [{"key": "ca-bundle.crt"}]}}})
            ),
            [format!(
                "spec.target.namespaceSelector.matchLabels: Invalid value: \"@@@@\": {bad_name}"
            )]
        );
        assert_eq!(
            of_cluster(json!({"target": {"namespaceSelector": {}}})),
            [
                "spec.target: Invalid value: at least one of the fields in [configMap secret] must be set"
            ]
        );
        for kind in ["configMap", "secret"] {
            for what in ["annotations", "labels"] {
                let at = format!("spec.target.{kind}.metadata.{what}");
                let with = |key: &str| {
                    of_cluster(
                        json!({"target": cluster_target(kind, json!({"key": "ca.crt"}), json!({what: {key: "x"}}))}),
                    )
                };
                assert_eq!(
                    with("trust-manager.io/hash"),
                    [format!(
                        "{at}: Forbidden: must not use forbidden domains as prefixes (e.g., trust-manager.io)"
                    )]
                );
                assert_eq!(with("not-trust-manager.io/hash"), Vec::<String>::new());
                assert_eq!(
                    with("@@@@"),
                    [format!("{at}: Invalid value: \"@@@@\": {bad_name}")]
                );
                let long = "a".repeat(64);
                assert_eq!(
                    with(&long),
                    [format!(
                        "{at}: Invalid value: \"{long}\": name part must be no more than 63 bytes"
                    )]
                );
                assert_eq!(with(&format!("{long}/foo")), Vec::<String>::new());
            }
            let value = |v: &str, what: &str| {
                of_cluster(
                    json!({"target": cluster_target(kind, json!({"key": "ca.crt"}), json!({what: {"foo": v}}))}),
                )
            };
            let long = "a".repeat(64);
            assert_eq!(
                value("@@@@@", "annotations"),
                Vec::<String>::new(),
                "annotation values are free"
            );
            assert_eq!(
                value(&long, "labels"),
                [format!(
                    "spec.target.{kind}.metadata.labels: Invalid value: \"{long}\": must be no more than 63 bytes"
                )]
            );
            assert!(value("@@@@@", "labels")[0].starts_with(&format!("spec.target.{kind}.metadata.labels: Invalid value: \"@@@@@\": a valid label must be an empty string")));
            for (field, entry) in [
                (
                    "password",
                    json!({"key": "ca.crt", "password": "my-password"}),
                ),
                (
                    "profile",
                    json!({"key": "ca.crt", "format": "PEM", "profile": "Modern2023"}),
                ),
            ] {
                assert_eq!(
                    of_cluster(json!({"target": cluster_target(kind, entry, json!(null))})),
                    [format!(
                        "spec.target.{kind}.data[0].{field}: Forbidden: may only be set when format is 'PKCS12'"
                    )]
                );
            }
            let pkcs12 = json!({"key": "ca.p12", "format": "PKCS12", "password": "p", "profile": "Modern2023"});
            assert_eq!(
                of_cluster(json!({"target": cluster_target(kind, pkcs12, json!(null))})),
                Vec::<String>::new()
            );
        }
    }

    #[test]
    fn selector_expressions_are_checked_as_apimachinery_checks_them() {
        let selector = json!({"matchExpressions": [
            {"key": "a", "operator": "In"},
            {"key": "b", "operator": "Exists", "values": ["x"]},
            {"key": "c", "operator": "Near"},
            {"key": "/d", "operator": "NotIn", "values": ["ok", "not ok"]},
        ]});
        assert_eq!(
            of_cluster(json!({"target": {"namespaceSelector": selector, "secret": {"data": [{"key": "k"}]}}})),
            [
                "spec.target.namespaceSelector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'".to_string(),
                "spec.target.namespaceSelector.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'".into(),
                "spec.target.namespaceSelector.matchExpressions[2].operator: Invalid value: \"Near\": not a valid selector operator".into(),
                "spec.target.namespaceSelector.matchExpressions[3].key: Invalid value: \"/d\": prefix part must be non-empty".into(),
                format!("spec.target.namespaceSelector.matchExpressions[3].values[1]: Invalid value: \"not ok\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '({NAME_REGEX})?')"),
            ]
        );
    }
}
