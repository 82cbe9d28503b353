use std::collections::BTreeMap;
use std::sync::OnceLock;

use k8s_openapi::ByteString;
use kube::api::ObjectMeta;

use super::*;
use crate::changes::EventType;

/// Two CA certificates (PEM), made once.
fn cas() -> &'static (String, String) {
    static CAS: OnceLock<(String, String)> = OnceLock::new();
    CAS.get_or_init(|| {
        let ca = |cn| {
            caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new(cn))
                .unwrap()
                .certificate_pem()
        };
        (ca("old-ca"), ca("new-ca"))
    })
}

/// A bundle as the CA controller publishes it: the new CA and the old one, in its own order,
/// with a comment, all of which injection must keep byte for byte.
fn two_ca_bundle() -> String {
    let (old, new) = cas();
    format!("# webhooks-ca\n{new}{old}")
}

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).unwrap()
}

fn annotated(kind: TargetKind, key: &str, value: &str, data: Value) -> DynamicObject {
    let resource = kind.api_resource();
    let mut target = json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": { "name": "target", "resourceVersion": "42", "annotations": { key: value } },
    });
    for (k, v) in data.as_object().unwrap() {
        target[k] = v.clone();
    }
    object(target)
}

fn webhook(name: &str, ca_bundle: Option<&str>) -> Value {
    let mut client_config = json!({ "url": format!("https://{name}/validate") });
    if let Some(ca_bundle) = ca_bundle {
        client_config["caBundle"] = json!(ca_bundle);
    }
    json!({
        "name": name,
        "clientConfig": client_config,
        "rules": [{ "apiGroups": ["example.com"], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["widgets"] }],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Fail",
    })
}

/// One target of each kind, asking for CertificateAuthority `webhooks`, every caBundle field
/// empty or foreign.
fn targets() -> Vec<(TargetKind, DynamicObject)> {
    let webhooks = json!({ "webhooks": [
        webhook("a.example.com", None),
        webhook("b.example.com", Some(&b64(b"someone else's CA"))),
    ] });
    let crd = json!({ "spec": {
        "group": "example.com",
        "names": { "kind": "Widget", "plural": "widgets" },
        "scope": "Namespaced",
        "versions": [{ "name": "v1", "served": true, "storage": true,
                       "schema": { "openAPIV3Schema": { "type": "object" } } }],
        "conversion": { "strategy": "Webhook", "webhook": {
            "conversionReviewVersions": ["v1"],
            "clientConfig": { "service": { "namespace": "demo", "name": "convert", "path": "/convert" } },
        } },
    } });
    let api_service = json!({ "spec": {
        "group": "metrics.example.com", "version": "v1beta1",
        "service": { "namespace": "demo", "name": "metrics" },
        "groupPriorityMinimum": 100, "versionPriority": 100,
    } });
    [
        (TargetKind::ValidatingWebhookConfiguration, webhooks.clone()),
        (TargetKind::MutatingWebhookConfiguration, webhooks),
        (TargetKind::CustomResourceDefinition, crd),
        (TargetKind::ApiService, api_service),
    ]
    .into_iter()
    .map(|(kind, data)| (kind, annotated(kind, INJECT_CA_FROM, "webhooks", data)))
    .collect()
}

fn authority(name: &str, bundle_namespace: &str, bundle_name: &str) -> DynamicObject {
    object(json!({
        "apiVersion": "caretaker.dev/v1alpha1",
        "kind": "CertificateAuthority",
        "metadata": { "name": name },
        "spec": {
            "commonName": "webhooks-ca",
            "secret": { "name": "webhooks-ca", "namespace": "caretaker-system" },
            "bundle": { "name": bundle_name, "namespace": bundle_namespace },
        },
    }))
}

fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

fn secret(namespace: &str, name: &str, allow: Option<&str>, ca: Option<&[u8]>) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            annotations: allow
                .map(|v| BTreeMap::from([(ALLOW_DIRECT_INJECTION.to_string(), v.to_string())])),
            ..Default::default()
        },
        data: ca.map(|ca| BTreeMap::from([(SECRET_CA_KEY.to_string(), ByteString(ca.to_vec()))])),
        ..Default::default()
    }
}

/// The Secret where CertificateAuthority `webhooks` keeps its CAs, holding `keys` (as
/// [`crate::authority`] names them).
fn ca_secret(keys: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("webhooks-ca".into()),
            namespace: Some("caretaker-system".into()),
            ..Default::default()
        },
        data: Some(
            keys.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// The sources of CertificateAuthority `webhooks`, its bundle holding `bundle`, its Secret
/// both CAs of [`cas`] (the new one signing, the old one still trusted).
struct World {
    ca: DynamicObject,
    bundle: ConfigMap,
    keeps: Secret,
}

impl World {
    fn with(bundle: &str) -> Self {
        let (old, new) = cas();
        Self {
            ca: authority("webhooks", "caretaker-system", "webhooks-ca-bundle"),
            bundle: config_map(
                "caretaker-system",
                "webhooks-ca-bundle",
                &[(BUNDLE_KEY, bundle)],
            ),
            keeps: ca_secret(&[(TLS_CRT, new), ("tls.key", "(a key)"), (PREVIOUS_CRT, old)]),
        }
    }

    fn sources(&self) -> Sources<'_> {
        Sources {
            authority_crd_installed: true,
            authority: Some(&self.ca),
            config_map: Some(&self.bundle),
            authority_secret: Some(&self.keeps),
            secret: None,
            authority_refused: None,
        }
    }
}

/// The decision for a target, as the glue makes it.
fn decide_for(kind: TargetKind, target: &DynamicObject, sources: &Sources) -> Decision {
    match request(kind, target) {
        Ok(Some(source)) => decide(kind, target, &source, sources, None),
        Ok(None) => Decision::Idle,
        Err(e) => refuse_annotation(&e),
    }
}

/// RFC 7386, as the API server applies a merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Some(patch) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().unwrap();
    for (key, value) in patch {
        if value.is_null() {
            target.remove(key);
        } else {
            merge(target.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}

fn patched(target: &DynamicObject, patch: &Value) -> DynamicObject {
    let mut value = serde_json::to_value(target).unwrap();
    merge(&mut value, patch);
    object(value)
}

/// Every caBundle field of a target, decoded.
fn bundles(kind: TargetKind, target: &DynamicObject) -> Vec<Option<Vec<u8>>> {
    points(kind, &target.data)
        .iter()
        .map(|p| {
            p.current
                .and_then(Value::as_str)
                .map(|s| STANDARD.decode(s).unwrap())
        })
        .collect()
}

/// `value` without any caBundle field.
fn without_ca_bundles(mut value: Value) -> Value {
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.remove("caBundle");
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    value
}

fn write_of(decision: Decision) -> (Value, Event) {
    match decision {
        Decision::Write { patch, event } => (patch, event),
        other => panic!("expected a write, got {other:?}"),
    }
}

fn refusal_of(decision: Decision) -> Event {
    match decision {
        Decision::Refuse(event) => event,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn every_kind_gets_the_bundle_in_every_ca_bundle_field_and_then_nothing_is_written() {
    let bundle = two_ca_bundle();
    let world = World::with(&bundle);
    for (kind, target) in targets() {
        let (patch, event) = write_of(decide_for(kind, &target, &world.sources()));
        assert_eq!(
            patch["metadata"],
            json!({ "resourceVersion": "42" }),
            "{kind:?}"
        );
        assert_eq!(event.type_, EventType::Normal);
        assert_eq!(event.reason, EVENT_INJECTED);
        assert!(
            event.note.contains("CertificateAuthority webhooks")
                && event.note.contains("2 certificates"),
            "{kind:?}: {}",
            event.note
        );

        let after = patched(&target, &patch);
        let held = bundles(kind, &after);
        assert!(!held.is_empty(), "{kind:?}");
        for field in held {
            assert_eq!(
                field.as_deref(),
                Some(bundle.as_bytes()),
                "{kind:?}: the exact bytes"
            );
        }
        assert!(holds_bundle(kind, &after, bundle.as_bytes()), "{kind:?}");
        assert!(!holds_bundle(kind, &target, bundle.as_bytes()), "{kind:?}");
        assert_eq!(
            decide_for(kind, &after, &world.sources()),
            Decision::Idle,
            "{kind:?}: at steady state nothing is written"
        );
    }
}

#[test]
fn the_patch_changes_nothing_but_ca_bundle_fields() {
    let world = World::with(&two_ca_bundle());
    for (kind, target) in targets() {
        let (patch, _) = write_of(decide_for(kind, &target, &world.sources()));
        let after = patched(&target, &patch);
        let (mut before, mut after) = (
            serde_json::to_value(&target).unwrap(),
            serde_json::to_value(&after).unwrap(),
        );
        // The precondition names the version written on; it is not a change.
        for value in [&mut before, &mut after] {
            value["metadata"]
                .as_object_mut()
                .unwrap()
                .remove("resourceVersion");
        }
        assert_eq!(
            without_ca_bundles(before),
            without_ca_bundles(after),
            "{kind:?}"
        );
        let top: Vec<&String> = patch.as_object().unwrap().keys().collect();
        let expected = if kind.has_webhooks() {
            ["metadata", "webhooks"]
        } else {
            ["metadata", "spec"]
        };
        assert_eq!(top, expected, "{kind:?}");
    }
}

#[test]
fn webhooks_keep_their_order_and_every_other_field() {
    let world = World::with(&two_ca_bundle());
    let kind = TargetKind::ValidatingWebhookConfiguration;
    let mut first = webhook("a.example.com", None);
    first["timeoutSeconds"] = json!(7);
    first["clientConfig"]["service"] = json!({ "namespace": "demo", "name": "a", "port": 8443 });
    first["clientConfig"].as_object_mut().unwrap().remove("url");
    let target = annotated(
        kind,
        INJECT_CA_FROM,
        "webhooks",
        json!({ "webhooks": [first.clone(), webhook("b.example.com", None)] }),
    );
    let (patch, _) = write_of(decide_for(kind, &target, &world.sources()));
    let after = patched(&target, &patch);
    let hooks = after.data["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2);
    assert_eq!(hooks[0]["name"], "a.example.com");
    assert_eq!(hooks[1]["name"], "b.example.com");
    let mut expected = first;
    expected["clientConfig"]["caBundle"] = json!(b64(two_ca_bundle().as_bytes()));
    assert_eq!(hooks[0], expected);
}

#[test]
fn only_the_fields_that_differ_are_named_and_an_up_to_date_target_is_left_alone() {
    let bundle = two_ca_bundle();
    let world = World::with(&bundle);
    let kind = TargetKind::MutatingWebhookConfiguration;
    let target = annotated(
        kind,
        INJECT_CA_FROM,
        "webhooks",
        json!({ "webhooks": [
            webhook("a.example.com", Some(&b64(bundle.as_bytes()))),
            webhook("b.example.com", Some("not base64 at all")),
        ] }),
    );
    let (_, event) = write_of(decide_for(kind, &target, &world.sources()));
    assert!(
        event
            .note
            .starts_with("the caBundle of webhooks[1] (b.example.com) set to"),
        "{}",
        event.note
    );

    let current = annotated(
        kind,
        INJECT_CA_FROM,
        "webhooks",
        json!({ "webhooks": [
            webhook("a.example.com", Some(&b64(bundle.as_bytes()))),
            webhook("b.example.com", Some(&b64(bundle.as_bytes()))),
        ] }),
    );
    assert_eq!(decide_for(kind, &current, &world.sources()), Decision::Idle);
}

#[test]
fn a_bundle_with_one_more_ca_is_written_again() {
    let (old, _) = cas();
    let (kind, target) = targets().remove(3);
    let first = World::with(old);
    let (patch, event) = write_of(decide_for(kind, &target, &first.sources()));
    assert!(event.note.contains("(1 certificate)"), "{}", event.note);
    let after = patched(&target, &patch);
    assert_eq!(decide_for(kind, &after, &first.sources()), Decision::Idle);

    let second = World::with(&two_ca_bundle());
    let (patch, event) = write_of(decide_for(kind, &after, &second.sources()));
    assert!(event.note.contains("(2 certificates)"), "{}", event.note);
    assert_eq!(
        bundles(kind, &patched(&after, &patch)),
        [Some(two_ca_bundle().into_bytes())]
    );
}

#[test]
fn a_crd_without_a_conversion_webhook_is_left_alone() {
    let world = World::with(&two_ca_bundle());
    let kind = TargetKind::CustomResourceDefinition;
    for conversion in [
        json!(null),
        json!({ "strategy": "None" }),
        json!({ "strategy": "None", "webhook": { "clientConfig": { "url": "https://x" } } }),
    ] {
        let mut spec = json!({ "group": "example.com" });
        if !conversion.is_null() {
            spec["conversion"] = conversion.clone();
        }
        let target = annotated(kind, INJECT_CA_FROM, "webhooks", json!({ "spec": spec }));
        assert_eq!(request(kind, &target), Ok(None), "{conversion}");
        assert_eq!(
            decide(
                kind,
                &target,
                &SourceRef::Authority {
                    name: "webhooks".into()
                },
                &world.sources(),
                None
            ),
            Decision::Idle,
            "{conversion}"
        );
    }
    // A malformed annotation is reported even so.
    let target = annotated(kind, INJECT_CA_FROM, "Not A Name", json!({ "spec": {} }));
    assert!(request(kind, &target).is_err());
}

#[test]
fn a_conversion_webhook_without_client_config_gets_one() {
    let world = World::with(&two_ca_bundle());
    let kind = TargetKind::CustomResourceDefinition;
    let target = annotated(
        kind,
        INJECT_CA_FROM,
        "webhooks",
        json!({ "spec": { "conversion": { "strategy": "Webhook" } } }),
    );
    let (patch, event) = write_of(decide_for(kind, &target, &world.sources()));
    assert!(
        event
            .note
            .starts_with("spec.conversion.webhook.clientConfig.caBundle set to"),
        "{}",
        event.note
    );
    assert_eq!(
        bundles(kind, &patched(&target, &patch)),
        [Some(two_ca_bundle().into_bytes())]
    );
}

#[test]
fn webhook_configurations_without_webhooks_ask_for_nothing() {
    for data in [json!({}), json!({ "webhooks": [] })] {
        let kind = TargetKind::ValidatingWebhookConfiguration;
        let target = annotated(kind, INJECT_CA_FROM, "webhooks", data);
        assert_eq!(request(kind, &target), Ok(None));
    }
}

#[test]
fn targets_without_an_annotation_ask_for_nothing() {
    for (kind, mut target) in targets() {
        target.metadata.annotations = Some(BTreeMap::from([(
            "cert-manager.io/inject-ca-from".to_string(),
            "demo/webhook-cert".to_string(),
        )]));
        assert_eq!(
            request(kind, &target),
            Ok(None),
            "cert-manager's Certificate source is cainjector's, not caretaker's"
        );
        target.metadata.annotations = None;
        assert_eq!(request(kind, &target), Ok(None));
    }
}

#[test]
fn authority_names_are_parsed_strictly() {
    let kind = TargetKind::ApiService;
    let data = json!({ "spec": {} });
    let error = |value: &str| {
        request(kind, &annotated(kind, INJECT_CA_FROM, value, data.clone()))
            .unwrap_err()
            .to_string()
    };
    assert_eq!(
        error(""),
        "caretaker.dev/inject-ca-from: \"\" is not accepted: it is empty; expected the name of \
         a CertificateAuthority"
    );
    assert!(
        error("caretaker-system/webhooks").contains("cluster-scoped: give its name alone"),
        "{}",
        error("caretaker-system/webhooks")
    );
    for bad in [
        "Webhooks",
        "webhooks ",
        " webhooks",
        "-webhooks",
        "web_hooks",
        "a..b",
    ] {
        let message = error(bad);
        assert!(
            message.contains(&format!("{bad:?}"))
                && message.contains("expected the name of a CertificateAuthority"),
            "{bad:?}: {message}"
        );
    }
    assert_eq!(
        request(kind, &annotated(kind, INJECT_CA_FROM, "web.hooks-1", data)),
        Ok(Some(SourceRef::Authority {
            name: "web.hooks-1".into()
        }))
    );
}

#[test]
fn secret_references_are_parsed_strictly() {
    let kind = TargetKind::ApiService;
    let data = json!({ "spec": {} });
    let parse = |value: &str| {
        request(
            kind,
            &annotated(kind, INJECT_CA_FROM_SECRET, value, data.clone()),
        )
    };
    assert_eq!(
        parse("demo/webhook-ca"),
        Ok(Some(SourceRef::Secret {
            namespace: "demo".into(),
            name: "webhook-ca".into()
        }))
    );
    for (bad, problem) in [
        ("webhook-ca", "expected <namespace>/<name> of a Secret"),
        ("/webhook-ca", "expected <namespace>/<name> of a Secret"),
        ("demo/", "expected <namespace>/<name> of a Secret"),
        ("demo/a/b", "expected <namespace>/<name> of a Secret"),
        ("", "expected <namespace>/<name> of a Secret"),
        ("de.mo/webhook-ca", "is not a namespace name"),
        ("Demo/webhook-ca", "is not a namespace name"),
        ("demo/Webhook-CA", "is not a Secret name"),
        ("demo/webhook ca", "is not a Secret name"),
        ("demo/../../etc", "expected <namespace>/<name> of a Secret"),
    ] {
        let message = parse(bad).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!(
                "cert-manager.io/inject-ca-from-secret: {bad:?} is not accepted: "
            )) && message.contains(problem),
            "{bad:?}: {message}"
        );
    }
}

#[test]
fn huge_and_garbage_values_are_refused_in_a_bounded_escaped_message() {
    let kind = TargetKind::ValidatingWebhookConfiguration;
    let data = json!({ "webhooks": [webhook("a.example.com", None)] });
    let huge = "a/".repeat(100_000);
    let garbage = "\u{202e}demo\u{0}/\u{1b}[31mca\n";
    for (key, value) in [
        (INJECT_CA_FROM, huge.as_str()),
        (INJECT_CA_FROM_SECRET, huge.as_str()),
        (INJECT_CA_FROM, garbage),
        (INJECT_CA_FROM_SECRET, garbage),
    ] {
        let target = annotated(kind, key, value, data.clone());
        let event = refusal_of(decide_for(
            kind,
            &target,
            &World::with(&two_ca_bundle()).sources(),
        ));
        assert_eq!(event.reason, EVENT_REFUSED);
        assert_eq!(event.type_, EventType::Warning);
        assert!(event.note.len() < 600, "{} bytes", event.note.len());
        assert!(
            event.note.chars().all(|c| c.is_ascii() && !c.is_control()),
            "{:?}",
            event.note
        );
        assert!(event.note.contains(key), "{}", event.note);
        assert!(
            event
                .note
                .ends_with("nothing injected, caBundle left as it is")
        );
    }
    let target = annotated(kind, INJECT_CA_FROM, &huge, data);
    let message = request(kind, &target).unwrap_err().to_string();
    assert!(message.contains("... (200000 bytes)"), "{message}");
    assert!(shown(garbage).contains("\\u{202e}") && shown(garbage).contains("\\u{1b}"));
}

#[test]
fn both_annotations_at_once_are_refused() {
    let (kind, mut target) = targets().remove(0);
    target
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(INJECT_CA_FROM_SECRET.into(), "demo/webhook-ca".into());
    assert_eq!(request(kind, &target), Err(AnnotationError::BothSources));
    let event = refusal_of(decide_for(
        kind,
        &target,
        &World::with(&two_ca_bundle()).sources(),
    ));
    assert!(event.note.contains("remove one of them"), "{}", event.note);
}

/// Every way the CertificateAuthority source can be missing, with the words that name it.
#[test]
fn a_missing_authority_source_writes_nothing_and_says_what_is_missing() {
    let world = World::with(&two_ca_bundle());
    let other_ca = authority("other", "caretaker-system", "webhooks-ca-bundle");
    let no_bundle = object(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
        "metadata": { "name": "webhooks" }, "spec": { "commonName": "x" },
    }));
    let empty = config_map(
        "caretaker-system",
        "webhooks-ca-bundle",
        &[(BUNDLE_KEY, "")],
    );
    let no_key = config_map(
        "caretaker-system",
        "webhooks-ca-bundle",
        &[("ca.crt", cas().0.as_str())],
    );
    let elsewhere = config_map("default", "webhooks-ca-bundle", &[(BUNDLE_KEY, &cas().0)]);
    let cases: Vec<(Sources, &str, &str)> = vec![
        (
            Sources {
                authority: None,
                ..world.sources()
            },
            EVENT_SOURCE_MISSING,
            "CertificateAuthority webhooks not found;",
        ),
        (
            Sources {
                authority: None,
                authority_crd_installed: false,
                ..world.sources()
            },
            EVENT_SOURCE_MISSING,
            "CertificateAuthority webhooks not found (its CRD, certificateauthorities.caretaker.dev, is not installed)",
        ),
        (
            Sources {
                authority: Some(&other_ca),
                ..world.sources()
            },
            EVENT_SOURCE_MISSING,
            "CertificateAuthority webhooks not found",
        ),
        (
            Sources {
                authority: Some(&no_bundle),
                ..world.sources()
            },
            EVENT_REFUSED,
            "CertificateAuthority webhooks names no bundle ConfigMap in spec.bundle",
        ),
        (
            Sources {
                config_map: None,
                ..world.sources()
            },
            EVENT_SOURCE_MISSING,
            "ConfigMap caretaker-system/webhooks-ca-bundle, the trust bundle of CertificateAuthority webhooks, not found",
        ),
        (
            Sources {
                config_map: Some(&elsewhere),
                ..world.sources()
            },
            EVENT_SOURCE_MISSING,
            "ConfigMap caretaker-system/webhooks-ca-bundle, the trust bundle of CertificateAuthority webhooks, not found",
        ),
        (
            Sources {
                config_map: Some(&empty),
                ..world.sources()
            },
            EVENT_SOURCE_MISSING,
            "has no ca-bundle.crt or an empty one",
        ),
        (
            Sources {
                config_map: Some(&no_key),
                ..world.sources()
            },
            EVENT_SOURCE_MISSING,
            "has no ca-bundle.crt or an empty one",
        ),
        (
            // Its Secret or bundle is not its own: the signer's rule (`crate::ownership`).
            Sources {
                authority_refused: Some("Secret s/ca belongs to EtcdCertificates e/etcd"),
                ..world.sources()
            },
            EVENT_REFUSED,
            "CertificateAuthority webhooks: Secret s/ca belongs to EtcdCertificates e/etcd; nothing injected",
        ),
    ];
    for (kind, target) in targets() {
        for (sources, reason, words) in &cases {
            let event = refusal_of(decide_for(kind, &target, sources));
            assert_eq!(event.type_, EventType::Warning);
            assert_eq!(event.reason, *reason, "{words}");
            assert!(event.note.contains(words), "{kind:?}: {}", event.note);
            assert!(
                event
                    .note
                    .ends_with("nothing injected, caBundle left as it is")
            );
        }
    }
}

/// A certificate in the bundle ConfigMap that the CA's Secret does not keep (someone able to
/// write ConfigMaps added a CA of theirs) stops injection: the targets keep what they hold,
/// and the Warning names the certificate.
#[test]
fn a_bundle_holding_a_certificate_the_ca_does_not_keep_is_never_injected() {
    let (old, new) = cas();
    let intruder =
        caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new("intruder-ca"))
            .unwrap()
            .certificate_pem();
    let mut tampered = World::with(&format!("{new}{intruder}{old}"));
    for (kind, target) in targets() {
        let event = refusal_of(decide_for(kind, &target, &tampered.sources()));
        assert_eq!(event.reason, EVENT_REFUSED);
        assert!(
            event.note.starts_with(
                "the trust bundle of CertificateAuthority webhooks (ConfigMap \
                 caretaker-system/webhooks-ca-bundle, ca-bundle.crt) holds 1 certificate(s) that \
                 are none of the CAs its Secret caretaker-system/webhooks-ca keeps (the first: \
                 serial "
            ) && event.note.contains("subject CN=intruder-ca)"),
            "{kind:?}: {}",
            event.note
        );
        assert!(!event.note.contains("(a key)"), "{}", event.note);
    }

    // A CA the Secret no longer keeps is as foreign; every key the Secret keeps CAs in counts.
    let world = World::with(&two_ca_bundle());
    let (kind, target) = targets().remove(0);
    for keeps in [
        vec![(TLS_CRT, new.as_str())],
        vec![(TLS_CRT, "not a certificate"), (PREVIOUS_CRT, old.as_str())],
    ] {
        let secret = ca_secret(&keeps);
        let sources = Sources {
            authority_secret: Some(&secret),
            ..world.sources()
        };
        let event = refusal_of(decide_for(kind, &target, &sources));
        assert!(
            event.note.contains("holds 1 certificate(s)"),
            "{}",
            event.note
        );
    }
    for keeps in [
        vec![(TLS_CRT, old.as_str()), (NEXT_CRT, new.as_str())],
        vec![(NEXT_CRT, new.as_str()), (PREVIOUS_CRT, old.as_str())],
    ] {
        let secret = ca_secret(&keeps);
        let sources = Sources {
            authority_secret: Some(&secret),
            ..world.sources()
        };
        assert!(matches!(
            decide_for(kind, &target, &sources),
            Decision::Write { .. }
        ));
    }

    // The Secret missing, or elsewhere than spec.secret says: nothing is vouched for.
    let elsewhere = Secret {
        metadata: ObjectMeta {
            namespace: Some("default".into()),
            ..world.keeps.metadata.clone()
        },
        ..world.keeps.clone()
    };
    for secret in [None, Some(&elsewhere)] {
        let sources = Sources {
            authority_secret: secret,
            ..world.sources()
        };
        let event = refusal_of(decide_for(kind, &target, &sources));
        assert_eq!(event.reason, EVENT_SOURCE_MISSING);
        assert!(
            event.note.starts_with(
                "Secret caretaker-system/webhooks-ca, where CertificateAuthority webhooks keeps \
                 its CAs, not found"
            ),
            "{}",
            event.note
        );
    }
    let mut no_secret = world.ca.clone();
    no_secret.data["spec"]
        .as_object_mut()
        .unwrap()
        .remove("secret");
    let sources = Sources {
        authority: Some(&no_secret),
        ..world.sources()
    };
    let event = refusal_of(decide_for(kind, &target, &sources));
    assert_eq!(event.reason, EVENT_REFUSED);
    assert!(
        event
            .note
            .starts_with("CertificateAuthority webhooks names no Secret in spec.secret"),
        "{}",
        event.note
    );

    // Once the CA keeps the certificate (its controller's own next CA, say), it is injected.
    tampered.keeps = ca_secret(&[(TLS_CRT, new), (NEXT_CRT, &intruder), (PREVIOUS_CRT, old)]);
    assert!(matches!(
        decide_for(kind, &target, &tampered.sources()),
        Decision::Write { .. }
    ));
}

#[test]
fn a_bundle_that_is_not_certificates_is_never_injected() {
    let key = caretaker_pki::PrivateKey::generate(caretaker_pki::KeyAlgorithm::EcdsaP256)
        .unwrap()
        .to_pem();
    let with_key = format!("{}{key}", cas().0);
    for (bundle, words) in [
        ("not a certificate", "no PEM certificates found"),
        (with_key.as_str(), "not CERTIFICATE"),
        (
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            "not a decodable X.509 certificate",
        ),
    ] {
        let world = World::with(bundle);
        for (kind, target) in targets() {
            let event = refusal_of(decide_for(kind, &target, &world.sources()));
            assert_eq!(event.reason, EVENT_REFUSED);
            assert!(
                event.note.starts_with(
                    "the trust bundle of CertificateAuthority webhooks (ConfigMap \
                     caretaker-system/webhooks-ca-bundle, ca-bundle.crt) is not a bundle of PEM \
                     certificates"
                ) && event.note.contains(words),
                "{kind:?}: {}",
                event.note
            );
            assert!(!event.note.contains("PRIVATE KEY-----\n"), "{}", event.note);
        }
    }
}

fn secret_target(kind: TargetKind, value: &str) -> DynamicObject {
    let mut target = targets().into_iter().find(|(k, _)| *k == kind).unwrap().1;
    target.metadata.annotations = Some(BTreeMap::from([(
        INJECT_CA_FROM_SECRET.to_string(),
        value.to_string(),
    )]));
    target
}

#[test]
fn a_secret_that_allows_direct_injection_gives_its_ca_crt() {
    let ca = two_ca_bundle();
    let allowed = secret("demo", "webhook-ca", Some("true"), Some(ca.as_bytes()));
    let sources = Sources {
        secret: Some(&allowed),
        ..Default::default()
    };
    for kind in TargetKind::ALL {
        let target = secret_target(kind, "demo/webhook-ca");
        let (patch, event) = write_of(decide_for(kind, &target, &sources));
        assert!(
            event
                .note
                .ends_with("set to ca.crt of Secret demo/webhook-ca (2 certificates)"),
            "{}",
            event.note
        );
        let after = patched(&target, &patch);
        assert!(holds_bundle(kind, &after, ca.as_bytes()));
        assert_eq!(decide_for(kind, &after, &sources), Decision::Idle);
    }
}

#[test]
fn a_secret_that_does_not_allow_direct_injection_or_lacks_ca_crt_gives_nothing() {
    let ca = cas().0.as_bytes();
    let cases = [
        (
            secret("demo", "webhook-ca", None, Some(ca)),
            EVENT_REFUSED,
            "does not allow direct injection: it needs the annotation \
             cert-manager.io/allow-direct-injection: \"true\"",
        ),
        (
            secret("demo", "webhook-ca", Some("True"), Some(ca)),
            EVENT_REFUSED,
            "does not allow direct injection",
        ),
        (
            secret("demo", "webhook-ca", Some("yes"), Some(ca)),
            EVENT_REFUSED,
            "does not allow direct injection",
        ),
        (
            secret("demo", "webhook-ca", Some("true"), None),
            EVENT_SOURCE_MISSING,
            "Secret demo/webhook-ca has no ca.crt or an empty one",
        ),
        (
            secret("demo", "webhook-ca", Some("true"), Some(b"")),
            EVENT_SOURCE_MISSING,
            "Secret demo/webhook-ca has no ca.crt or an empty one",
        ),
        (
            secret("other", "webhook-ca", Some("true"), Some(ca)),
            EVENT_SOURCE_MISSING,
            "Secret demo/webhook-ca not found",
        ),
        (
            secret(
                "demo",
                "webhook-ca",
                Some("true"),
                Some(&[0xff, 0xfe, 0x00]),
            ),
            EVENT_REFUSED,
            "ca.crt of Secret demo/webhook-ca is not a bundle of PEM certificates: it is not text",
        ),
    ];
    for kind in TargetKind::ALL {
        let target = secret_target(kind, "demo/webhook-ca");
        for (secret, reason, words) in &cases {
            let sources = Sources {
                secret: Some(secret),
                ..Default::default()
            };
            let event = refusal_of(decide_for(kind, &target, &sources));
            assert_eq!(event.reason, *reason, "{words}");
            assert!(event.note.contains(words), "{kind:?}: {}", event.note);
        }
        let event = refusal_of(decide_for(kind, &target, &Sources::default()));
        assert_eq!(event.reason, EVENT_SOURCE_MISSING);
        assert!(event.note.starts_with("Secret demo/webhook-ca not found"));
    }
}

#[test]
fn an_operator_watching_one_namespace_reads_no_source_outside_it() {
    let ca = cas().0.clone();
    let allowed = secret("kube-system", "admin-ca", Some("true"), Some(ca.as_bytes()));
    let kind = TargetKind::ValidatingWebhookConfiguration;
    let target = secret_target(kind, "kube-system/admin-ca");
    let sources = Sources {
        secret: Some(&allowed),
        ..Default::default()
    };
    let event = refusal_of(decide(
        kind,
        &target,
        &request(kind, &target).unwrap().unwrap(),
        &sources,
        Some("demo"),
    ));
    assert_eq!(event.reason, EVENT_REFUSED);
    assert!(
        event.note.starts_with(
            "Secret kube-system/admin-ca is in namespace kube-system, outside namespace demo, \
             the only one the operator watches"
        ),
        "{}",
        event.note
    );
    assert!(!in_scope("kube-system", Some("demo")));
    assert!(in_scope("kube-system", None));

    let world = World::with(&ca);
    let (kind, target) = targets().remove(0);
    let source = request(kind, &target).unwrap().unwrap();
    let event = refusal_of(decide(
        kind,
        &target,
        &source,
        &world.sources(),
        Some("demo"),
    ));
    assert!(
        event.note.starts_with(
            "ConfigMap caretaker-system/webhooks-ca-bundle, the trust bundle of \
             CertificateAuthority webhooks, is in namespace caretaker-system, outside namespace demo"
        ),
        "{}",
        event.note
    );
    assert!(matches!(
        decide(
            kind,
            &target,
            &source,
            &world.sources(),
            Some("caretaker-system")
        ),
        Decision::Write { .. }
    ));
}

#[test]
fn an_api_service_that_skips_tls_verification_is_refused() {
    let world = World::with(&two_ca_bundle());
    let (kind, mut target) = targets().remove(3);
    target.data["spec"]["insecureSkipTLSVerify"] = json!(true);
    let event = refusal_of(decide_for(kind, &target, &world.sources()));
    assert_eq!(event.reason, EVENT_REFUSED);
    assert!(
        event.note.starts_with("spec.insecureSkipTLSVerify is true"),
        "{}",
        event.note
    );
}

#[test]
fn a_target_without_a_resource_version_gets_a_patch_without_one() {
    let world = World::with(&two_ca_bundle());
    let (kind, mut target) = targets().remove(3);
    target.metadata.resource_version = None;
    let (patch, _) = write_of(decide_for(kind, &target, &world.sources()));
    assert_eq!(patch.get("metadata"), None);
}

#[test]
fn changes_reach_exactly_the_targets_that_inject_from_them() {
    let of = |name: &str, key: &str, value: &str| {
        let kind = TargetKind::ApiService;
        let mut target = annotated(kind, key, value, json!({ "spec": {} }));
        target.metadata.name = Some(name.into());
        Arc::new(target)
    };
    let targets = [
        of("from-webhooks", INJECT_CA_FROM, "webhooks"),
        of("from-other", INJECT_CA_FROM, "other"),
        of("from-secret", INJECT_CA_FROM_SECRET, "demo/webhook-ca"),
        of("malformed", INJECT_CA_FROM, "Webhooks"),
        of("unannotated", "example.com/x", "webhooks"),
    ];
    let authorities = [
        Arc::new(authority(
            "webhooks",
            "caretaker-system",
            "webhooks-ca-bundle",
        )),
        Arc::new(authority("other", "caretaker-system", "other-bundle")),
        Arc::new(authority(
            "unused",
            "caretaker-system",
            "webhooks-ca-bundle",
        )),
    ];
    let names = |change: SourceChange| -> Vec<String> {
        concerned(&change, &authorities, &targets)
            .into_iter()
            .map(|t| t.metadata.name.clone().unwrap())
            .collect()
    };
    let cm = |namespace: &str, name: &str| SourceChange::ConfigMap {
        namespace: namespace.into(),
        name: name.into(),
    };
    assert_eq!(
        names(cm("caretaker-system", "webhooks-ca-bundle")),
        ["from-webhooks"]
    );
    assert_eq!(
        names(cm("caretaker-system", "other-bundle")),
        ["from-other"]
    );
    assert!(names(cm("default", "webhooks-ca-bundle")).is_empty());
    assert!(names(cm("caretaker-system", "kube-root-ca.crt")).is_empty());
    assert_eq!(
        names(SourceChange::Authority {
            name: "other".into()
        }),
        ["from-other"]
    );
    assert_eq!(
        names(SourceChange::Secret {
            namespace: "demo".into(),
            name: "webhook-ca".into()
        }),
        ["from-secret"]
    );
    assert!(
        names(SourceChange::Secret {
            namespace: "other".into(),
            name: "webhook-ca".into()
        })
        .is_empty()
    );
}

#[test]
fn each_kind_is_its_cluster_scoped_v1_resource() {
    let resources: Vec<(String, String, String)> = TargetKind::ALL
        .into_iter()
        .map(|kind| {
            let r = kind.api_resource();
            (r.api_version, r.kind, r.plural)
        })
        .collect();
    let expected = [
        (
            "admissionregistration.k8s.io/v1",
            "ValidatingWebhookConfiguration",
            "validatingwebhookconfigurations",
        ),
        (
            "admissionregistration.k8s.io/v1",
            "MutatingWebhookConfiguration",
            "mutatingwebhookconfigurations",
        ),
        (
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            "customresourcedefinitions",
        ),
        ("apiregistration.k8s.io/v1", "APIService", "apiservices"),
    ]
    .map(|(a, k, p)| (a.to_string(), k.to_string(), p.to_string()));
    assert_eq!(resources, expected);
}
