//! trust-manager's admission rules for a Bundle, with its field paths and messages (its webhook
//! at `/validate-trust-cert-manager-io-v1alpha1-bundle`): every problem is listed, in
//! trust-manager's order, each as `<field>: <Invalid value: "<value>" | Forbidden>: <why>`.

use std::collections::BTreeMap;

use super::api::{Bundle, SourceObjectKeySelector, TargetMetadata};
use super::selector::{Selector, valid_label_value, valid_qualified_name};

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
    if let Err(e) = Selector::parse(target.namespace_selector.as_ref()) {
        found.push(format!("spec.target.namespaceSelector: {e}"));
    }
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
    if let Some(selector) = &reference.selector
        && let Err(e) = Selector::parse(Some(selector))
    {
        found.push(format!("{path}.selector: {e}"));
    }
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
            if let Err(why) = valid_qualified_name(key) {
                found.push(format!("{path}.{what}: Invalid value: {key:?}: {why}"));
            }
        }
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > 256 * 1024 {
        found.push(format!(
            "{path}.annotations: Too long: may not be more than 262144 bytes"
        ));
    }
    for (key, value) in labels {
        if let Err(why) = valid_label_value(value) {
            found.push(format!(
                "{path}.labels: Invalid value: {value:?}: {why} (label {key:?})"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;

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
        assert!(problems[0].starts_with("spec.target.namespaceSelector: key: Invalid value: \"@@@@\": name part must consist"), "{problems:?}");
        let problems = of(
            json!({"sources": [{"inLine": "x"}], "target": {"configMap": {"key": "k", "metadata": {"labels": {"ok": "not ok"}}}}}),
        );
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("\"not ok\""));
    }
}
