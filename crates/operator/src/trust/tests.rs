//! Bundle passes fed with objects directly: sources, targets, namespaces and status, checked
//! against trust-manager's documented behaviour.

use std::collections::{BTreeMap, BTreeSet};

use caretaker_pki::{CaSpec, CertificateAuthority, PoolFilters};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, FieldsV1, LabelSelector, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::api::*;
use super::cluster_bundle::{ClusterBundle, JKS_KEY_ANNOTATION};
use super::package::DefaultPackage;
use super::plan::{
    BundleMode, BundleSettings, NamespaceView, Observed, Outcome, TargetsView, TrustObject, plan,
};
use super::sources::{SourceContext, SourceError, build};
use super::target::{self, ObservedTarget, TargetKind};

const TRUST: &str = "cert-manager";
const UID: &str = "b-uid";

fn ca_pem(name: &str) -> String {
    CertificateAuthority::create(&CaSpec::new(name))
        .unwrap()
        .certificate_pem()
        .to_string()
}

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(TRUST.into()),
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

fn bundle(sources: Vec<BundleSource>, target: Option<BundleTarget>) -> Bundle {
    let mut bundle = Bundle::new("trust", BundleSpec { sources, target });
    bundle.metadata.uid = Some(UID.into());
    bundle.metadata.generation = Some(1);
    bundle
}

fn from_config_map(name: &str, key: &str) -> BundleSource {
    BundleSource {
        config_map: Some(SourceObjectKeySelector {
            name: Some(name.into()),
            key: Some(key.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn in_line(pem: &str) -> BundleSource {
    BundleSource {
        in_line: Some(pem.into()),
        ..Default::default()
    }
}

fn config_map_target(key: &str) -> Option<BundleTarget> {
    Some(BundleTarget {
        config_map: Some(TargetTemplate {
            key: key.into(),
            metadata: None,
        }),
        ..Default::default()
    })
}

/// The world one pass sees.
struct World {
    config_maps: BTreeMap<String, ConfigMap>,
    secrets: BTreeMap<String, Secret>,
    package: Option<DefaultPackage>,
    namespaces: BTreeMap<String, NamespaceView>,
    targets: BTreeMap<(TargetKind, String), ObservedTarget>,
    settings: BundleSettings,
}

impl World {
    fn new(namespaces: &[&str]) -> Self {
        Self {
            config_maps: BTreeMap::new(),
            secrets: BTreeMap::new(),
            package: None,
            namespaces: namespaces
                .iter()
                .map(|n| (n.to_string(), NamespaceView::default()))
                .collect(),
            targets: BTreeMap::new(),
            settings: BundleSettings::default(),
        }
    }

    fn sources(&self) -> SourceContext<'_> {
        SourceContext {
            namespace: TRUST,
            config_maps: &self.config_maps,
            secrets: &self.secrets,
            default_package: self.package.as_ref(),
            filters: PoolFilters::default(),
            now: time::OffsetDateTime::now_utc(),
        }
    }

    fn observe<'a>(&'a self, object: impl Into<TrustObject<'a>>) -> Observed<'a> {
        self.observed(object.into())
    }

    fn observed<'a>(&'a self, object: TrustObject<'a>) -> Observed<'a> {
        Observed {
            object,
            sources: self.sources(),
            namespaces: &self.namespaces,
            targets: TargetsView::new(vec![&self.targets]),
            settings: &self.settings,
            now: Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap()),
        }
    }

    /// Records every write of a plan as trust-manager's apply would leave the target's metadata.
    fn write_as_trust_manager<'b>(&mut self, object: impl Into<TrustObject<'b>>) {
        let writes = plan(&self.observed(object.into())).writes;
        for write in writes {
            let metadata: ObjectMeta =
                serde_json::from_value(write.body()["metadata"].clone()).unwrap();
            let body = write.body();
            let data_field = if write.kind == TargetKind::ConfigMap {
                "binaryData"
            } else {
                "data"
            };
            let mut fields = serde_json::Map::new();
            for field in ["data", data_field] {
                if let Some(keys) = body[field].as_object() {
                    let owned: serde_json::Map<_, _> =
                        keys.keys().map(|k| (format!("f:{k}"), json!({}))).collect();
                    fields
                        .entry(format!("f:{field}"))
                        .or_insert(json!({}))
                        .as_object_mut()
                        .unwrap()
                        .extend(owned);
                }
            }
            let metadata = ObjectMeta {
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some(FIELD_MANAGER.into()),
                    operation: Some("Apply".into()),
                    fields_v1: Some(FieldsV1(serde_json::Value::Object(fields))),
                    ..Default::default()
                }]),
                ..metadata
            };
            self.targets.insert(
                (write.kind, write.namespace),
                ObservedTarget::from_metadata(write.kind, &metadata),
            );
        }
    }
}

fn status_after(world: &World, bundle: &mut Bundle) {
    let change = plan(&world.observe(&*bundle))
        .status
        .expect("a status change");
    bundle.status = Some(BundleStatus {
        conditions: Some(vec![change.condition]),
        default_ca_version: change.default_ca_version,
    });
}

#[test]
fn the_hash_is_trust_managers_concatenation() {
    let sha = |text: &str| -> String {
        Sha256::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let hash = |target: BundleTarget| {
        let specs = target::bundle_specs(&target);
        let hashes: Vec<String> = specs.iter().map(|(_, spec)| spec.hash("PEM")).collect();
        assert_eq!(hashes.len(), 1);
        hashes[0].clone()
    };
    let plain = TargetTemplate {
        key: "ca.crt".into(),
        metadata: None,
    };
    let target = |template: &TargetTemplate, formats: Option<AdditionalFormats>| BundleTarget {
        config_map: Some(template.clone()),
        additional_formats: formats,
        ..Default::default()
    };
    assert_eq!(hash(target(&plain, None)), sha("PEM"));

    let formats = AdditionalFormats {
        jks: Some(JksFormat {
            key: "a.jks".into(),
            password: "changeit".into(),
        }),
        pkcs12: Some(Pkcs12Format {
            key: "a.p12".into(),
            password: Some("pw".into()),
            profile: Some("Modern2023".into()),
        }),
    };
    let with_metadata = TargetTemplate {
        key: "ca.crt".into(),
        metadata: Some(TargetMetadata {
            annotations: Some([("b".into(), "2".into()), ("a".into(), "1".into())].into()),
            labels: Some([("z".into(), "y".into())].into()),
        }),
    };
    assert_eq!(
        hash(target(&with_metadata, Some(formats))),
        sha("PEMchangeitpwModern2023a1b2zy")
    );
}

#[test]
fn a_first_pass_writes_every_matching_namespace_and_a_second_writes_nothing() {
    let mut world = World::new(&["default", "kube-system", TRUST]);
    let pem = ca_pem("root-a");
    world
        .config_maps
        .insert("roots".into(), config_map("roots", &[("ca.crt", &pem)]));
    let mut bundle = bundle(
        vec![from_config_map("roots", "ca.crt")],
        config_map_target("root-certs.pem"),
    );

    let first = plan(&world.observe(&bundle));
    assert_eq!(
        first.writes.len(),
        3,
        "the trust namespace is a target namespace too"
    );
    let body = &first.writes[0].body();
    assert_eq!(body["metadata"]["labels"][BUNDLE_LABEL], "trust");
    assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], UID);
    assert_eq!(body["metadata"]["ownerReferences"][0]["controller"], true);
    assert_eq!(
        body["metadata"]["ownerReferences"][0]["blockOwnerDeletion"],
        true
    );
    let written = body["data"]["root-certs.pem"].as_str().unwrap();
    assert!(written.starts_with("-----BEGIN CERTIFICATE-----\n") && !written.ends_with('\n'));
    assert!(body.get("binaryData").is_none());
    let change = first.status.clone().unwrap();
    assert_eq!(change.condition.reason, "Synced");
    assert_eq!(
        change.condition.message,
        "Successfully synced Bundle to all namespaces"
    );
    assert_eq!(change.event.type_, crate::changes::EventType::Normal);

    world.write_as_trust_manager(&bundle);
    status_after(&world, &mut bundle);
    let second = plan(&world.observe(&bundle));
    assert!(second.writes.is_empty(), "{:?}", second.writes);
    assert!(
        second.status.is_none(),
        "no status patch and no event when nothing changed"
    );
    assert!(second.cleanups.is_empty());
}

#[test]
fn targets_written_by_trust_manager_are_taken_over_without_a_write() {
    // What trust-manager leaves on a target, built by hand from its documented shape.
    let mut world = World::new(&["team-a", "team-b"]);
    let pem = ca_pem("root-a");
    let bundle = bundle(vec![in_line(&pem)], config_map_target("ca.crt"));
    let canonical = build(&bundle.spec.sources, &world.sources())
        .unwrap()
        .pool
        .to_pem();
    let specs = target::bundle_specs(bundle.spec.target.as_ref().unwrap());
    let hash = specs[0].1.hash(&canonical);
    for namespace in ["team-a", "team-b"] {
        let metadata = ObjectMeta {
            labels: Some([(BUNDLE_LABEL.to_string(), "trust".to_string())].into()),
            annotations: Some([(HASH_ANNOTATION.to_string(), hash.clone())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "trust.cert-manager.io/v1alpha1".into(),
                kind: "Bundle".into(),
                name: "trust".into(),
                uid: UID.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some("trust-manager".into()),
                operation: Some("Apply".into()),
                fields_v1: Some(FieldsV1(json!({
                    "f:data": {".": {}, "f:ca.crt": {}},
                    "f:metadata": {"f:labels": {"f:trust.cert-manager.io/bundle": {}}},
                }))),
                ..Default::default()
            }]),
            ..Default::default()
        };
        world.targets.insert(
            (TargetKind::ConfigMap, namespace.into()),
            ObservedTarget::from_metadata(TargetKind::ConfigMap, &metadata),
        );
    }
    assert!(plan(&world.observe(&bundle)).writes.is_empty());
}

#[test]
fn drift_is_seen_from_metadata_and_rewritten() {
    let mut world = World::new(&["team-a"]);
    let bundle = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("ca.crt"),
    );
    world.write_as_trust_manager(&bundle);
    let key = (TargetKind::ConfigMap, "team-a".to_string());
    let good = world.targets[&key].clone();

    let mut edits: Vec<(&str, ObservedTarget)> = Vec::new();
    let mut t = good.clone();
    t.managed_keys.clear();
    edits.push(("someone else took the key's ownership", t));
    let mut t = good.clone();
    t.annotations.insert(HASH_ANNOTATION.into(), "stale".into());
    edits.push(("the hash differs", t));
    let mut t = good.clone();
    t.labels.remove(BUNDLE_LABEL);
    edits.push(("the label is gone", t));
    let mut t = good.clone();
    t.owners.clear();
    edits.push(("the owner reference is gone", t));
    let mut t = good;
    t.managed_keys.insert("extra".into());
    edits.push(("trust-manager owns a key it no longer writes", t));
    for (why, edited) in edits {
        world.targets.insert(key.clone(), edited);
        assert_eq!(plan(&world.observe(&bundle)).writes.len(), 1, "{why}");
    }
}

#[test]
fn a_changed_key_is_one_write_with_only_the_new_key() {
    let mut world = World::new(&["team-a"]);
    let old = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("old.pem"),
    );
    world.write_as_trust_manager(&old);
    let new = bundle(old.spec.sources.clone(), config_map_target("new.pem"));
    let pass = plan(&world.observe(&new));
    assert_eq!(pass.writes.len(), 1);
    let body = pass.writes[0].body();
    let data = body["data"].as_object().unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["new.pem"]);
    assert!(pass.cleanups.is_empty());
}

#[test]
fn namespaces_that_stop_matching_are_given_up_only_if_this_bundle_controls_them() {
    let mut world = World::new(&["prod", "dev", "gone"]);
    let mut everywhere = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("ca.crt"),
    );
    world.write_as_trust_manager(&everywhere);
    world
        .namespaces
        .get_mut("prod")
        .unwrap()
        .labels
        .insert("env".into(), "prod".into());
    world.namespaces.get_mut("gone").unwrap().terminating = true;
    // "dev"'s target is controlled by another Bundle (another UID) with our label.
    world
        .targets
        .get_mut(&(TargetKind::ConfigMap, "dev".into()))
        .unwrap()
        .owners[0]
        .uid = "other".into();

    everywhere.spec.target.as_mut().unwrap().namespace_selector = Some(LabelSelector {
        match_labels: Some([("env".to_string(), "prod".to_string())].into()),
        ..Default::default()
    });
    let pass = plan(&world.observe(&everywhere));
    assert!(pass.writes.is_empty());
    assert_eq!(pass.cleanups, [(TargetKind::ConfigMap, "gone".to_string())]);
    assert_eq!(
        pass.status.unwrap().condition.message,
        "Successfully synced Bundle to namespaces that match this label selector: env=prod"
    );
}

#[test]
fn target_namespaces_restrict_where_targets_go() {
    let mut world = World::new(&["a", "b", "c"]);
    world.settings.target_namespaces = Some(BTreeSet::from(["b".to_string()]));
    let bundle = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("ca.crt"),
    );
    let pass = plan(&world.observe(&bundle));
    let namespaces: Vec<_> = pass.writes.iter().map(|w| w.namespace.as_str()).collect();
    assert_eq!(namespaces, ["b"]);
    assert_eq!(
        pass.status.unwrap().condition.message,
        "Successfully synced Bundle to all allowed namespaces"
    );
}

#[test]
fn broken_sources_touch_no_target_and_say_why_in_upstreams_words() {
    let mut world = World::new(&["team-a"]);
    let good = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("ca.crt"),
    );
    world.write_as_trust_manager(&good);

    let missing = bundle(
        vec![from_config_map("absent", "ca.crt")],
        config_map_target("ca.crt"),
    );
    let pass = plan(&world.observe(&missing));
    assert!(pass.writes.is_empty() && pass.cleanups.is_empty());
    assert_eq!(
        pass.outcome,
        Outcome::Done,
        "a missing source waits for a change"
    );
    let change = pass.status.unwrap();
    assert_eq!(change.condition.status, "False");
    assert_eq!(change.condition.reason, "SourceNotFound");
    assert_eq!(
        change.condition.message,
        "Bundle source was not found: failed to get ConfigMap cert-manager/absent: configmaps \"absent\" not found"
    );
    assert_eq!(change.event.type_, crate::changes::EventType::Warning);
    assert_eq!(change.event.reason, "SourceNotFound");

    world
        .config_maps
        .insert("roots".into(), config_map("roots", &[("other", "x")]));
    let no_key = bundle(
        vec![from_config_map("roots", "ca.crt")],
        config_map_target("ca.crt"),
    );
    assert_eq!(
        plan(&world.observe(&no_key))
            .status
            .unwrap()
            .condition
            .message,
        "Bundle source was not found: no data found in ConfigMap cert-manager/roots at key \"ca.crt\""
    );

    let key = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----";
    world
        .config_maps
        .insert("bad".into(), config_map("bad", &[("ca.crt", key)]));
    let private_key = bundle(
        vec![from_config_map("bad", "ca.crt")],
        config_map_target("ca.crt"),
    );
    let pass = plan(&world.observe(&private_key));
    assert!(pass.writes.is_empty() && pass.cleanups.is_empty());
    assert_eq!(
        pass.outcome,
        Outcome::Retry,
        "a malformed source is retried with backoff"
    );
    let change = pass.status.unwrap();
    assert_eq!(change.condition.reason, "SourceBuildError");
    assert_eq!(
        change.condition.message,
        "Failed to build bundle sources: invalid PEM data in ConfigMap cert-manager/bad at key \"ca.crt\": \
         invalid PEM block in bundle: only CERTIFICATE blocks are permitted but found 'PRIVATE KEY'"
    );
    assert!(!change.condition.message.contains("AAAA"));

    let empty = bundle(
        vec![in_line("no certificates here")],
        config_map_target("ca.crt"),
    );
    assert_eq!(
        plan(&world.observe(&empty))
            .status
            .unwrap()
            .condition
            .message,
        "Bundle source was not found: couldn't find any valid certificates in bundle"
    );
}

#[test]
fn secret_targets_need_the_flag() {
    let world = World::new(&["team-a"]);
    let mut with_secret = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("ca.crt"),
    );
    with_secret.spec.target.as_mut().unwrap().secret = Some(TargetTemplate {
        key: "ca.crt".into(),
        metadata: None,
    });
    let pass = plan(&world.observe(&with_secret));
    assert!(
        pass.writes.is_empty(),
        "not even the ConfigMap target is written"
    );
    let change = pass.status.unwrap();
    assert_eq!(change.condition.reason, "SecretTargetsDisabled");
    assert_eq!(
        change.condition.message,
        "Bundle has Secret targets but the feature is disabled"
    );

    let mut enabled = World::new(&["team-a"]);
    enabled.settings.secret_targets_enabled = true;
    let pass = plan(&enabled.observe(&with_secret));
    let kinds: Vec<_> = pass.writes.iter().map(|w| w.kind).collect();
    assert_eq!(kinds, [TargetKind::ConfigMap, TargetKind::Secret]);
    let secret = &pass.writes[1].body();
    assert!(
        secret.get("type").is_none(),
        "Secrets are created Opaque, as trust-manager's are"
    );
    assert!(secret["data"]["ca.crt"].as_str().is_some());
}

#[test]
fn selector_sources_read_every_match_and_none_is_not_an_error() {
    let mut world = World::new(&["team-a"]);
    let (a, b) = (ca_pem("root-a"), ca_pem("root-b"));
    for (name, pem) in [("one", &a), ("two", &b)] {
        let mut object = config_map(name, &[("ca.crt", pem)]);
        object.metadata.labels = Some([("trust".to_string(), "yes".to_string())].into());
        world.config_maps.insert(name.into(), object);
    }
    let by_label = |value: &str| BundleSource {
        config_map: Some(SourceObjectKeySelector {
            selector: Some(LabelSelector {
                match_labels: Some([("trust".to_string(), value.to_string())].into()),
                ..Default::default()
            }),
            key: Some("ca.crt".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let built = build(&[by_label("yes")], &world.sources()).unwrap();
    assert_eq!(built.pool.len(), 2);
    let nothing = build(&[by_label("no"), in_line(&a)], &world.sources()).unwrap();
    assert_eq!(nothing.pool.len(), 1);
}

#[test]
fn binary_data_keys_and_tls_secrets_follow_upstream() {
    let mut world = World::new(&[]);
    let pem = ca_pem("root-a");
    let mut binary = config_map("bin", &[]);
    binary.binary_data = Some(
        [(
            "ca.der.pem".to_string(),
            ByteString(pem.clone().into_bytes()),
        )]
        .into(),
    );
    world.config_maps.insert("bin".into(), binary);
    assert_eq!(
        build(&[from_config_map("bin", "ca.der.pem")], &world.sources())
            .unwrap()
            .pool
            .len(),
        1
    );

    world.secrets.insert(
        "tls".into(),
        Secret {
            metadata: ObjectMeta {
                name: Some("tls".into()),
                ..Default::default()
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some([("ca.crt".to_string(), ByteString(pem.into_bytes()))].into()),
            ..Default::default()
        },
    );
    let all_keys = BundleSource {
        secret: Some(SourceObjectKeySelector {
            name: Some("tls".into()),
            include_all_keys: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        build(&[all_keys], &world.sources()).unwrap_err(),
        SourceError::Invalid(
            "includeAllKeys is not supported for TLS Secrets such as cert-manager/tls".into()
        )
    );
}

#[test]
fn default_cas_record_the_package_version() {
    let mut world = World::new(&["team-a"]);
    let use_defaults = BundleSource {
        use_default_cas: Some(true),
        ..Default::default()
    };
    let mut bundle = bundle(vec![use_defaults.clone()], config_map_target("ca.crt"));
    assert_eq!(
        plan(&world.observe(&bundle))
            .status
            .unwrap()
            .condition
            .message,
        "Bundle source was not found: no default package was specified when trust-manager was started; default CAs not available"
    );

    let package = DefaultPackage {
        name: "pkg".into(),
        bundle: ca_pem("public-root"),
        version: "1.0".into(),
    };
    let id = package.string_id();
    assert!(
        id.starts_with("pkg-1.0-") && id.len() == "pkg-1.0-".len() + 16,
        "{id}"
    );
    world.package = Some(package);
    let pass = plan(&world.observe(&bundle));
    assert_eq!(
        pass.status.clone().unwrap().default_ca_version.as_deref(),
        Some(id.as_str())
    );

    // A failure keeps the recorded version.
    status_after(&world, &mut bundle);
    bundle.spec.sources.push(from_config_map("absent", "x"));
    assert_eq!(
        plan(&world.observe(&bundle))
            .status
            .unwrap()
            .default_ca_version
            .as_deref(),
        Some(id.as_str())
    );
}

#[test]
fn the_transition_time_changes_only_with_the_status() {
    let world = World::new(&["team-a"]);
    let mut bundle = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("ca.crt"),
    );
    let earlier = Time(k8s_openapi::jiff::Timestamp::from_second(1_000).unwrap());
    let synced = |status: &str| Condition {
        type_: SYNCED.into(),
        status: status.into(),
        reason: "Old".into(),
        message: "old".into(),
        last_transition_time: earlier.clone(),
        observed_generation: Some(1),
    };
    bundle.status = Some(BundleStatus {
        conditions: Some(vec![synced("True")]),
        default_ca_version: None,
    });
    assert_eq!(
        plan(&world.observe(&bundle))
            .status
            .unwrap()
            .condition
            .last_transition_time,
        earlier
    );
    bundle.status = Some(BundleStatus {
        conditions: Some(vec![synced("False")]),
        default_ca_version: None,
    });
    assert_ne!(
        plan(&world.observe(&bundle))
            .status
            .unwrap()
            .condition
            .last_transition_time,
        earlier
    );
}

#[test]
fn additional_formats_are_binary_data_and_keytool_grade() {
    let mut world = World::new(&["team-a"]);
    let mut bundle = bundle(
        vec![in_line(&ca_pem("root-a"))],
        config_map_target("ca.crt"),
    );
    bundle.spec.target.as_mut().unwrap().additional_formats = Some(AdditionalFormats {
        jks: Some(JksFormat {
            key: "ca.jks".into(),
            password: DEFAULT_JKS_PASSWORD.into(),
        }),
        pkcs12: Some(Pkcs12Format {
            key: "ca.p12".into(),
            password: Some(String::new()),
            profile: None,
        }),
    });
    let pass = plan(&world.observe(&bundle));
    let body = &pass.writes[0].body();
    let binary = body["binaryData"].as_object().unwrap();
    assert_eq!(binary.keys().collect::<Vec<_>>(), ["ca.jks", "ca.p12"]);
    world.write_as_trust_manager(&bundle);
    let owned = &world.targets[&(TargetKind::ConfigMap, "team-a".to_string())].managed_keys;
    assert_eq!(
        owned,
        &BTreeSet::from(["ca.crt".into(), "ca.jks".into(), "ca.p12".into()])
    );
    assert!(
        plan(&world.observe(&bundle)).writes.is_empty(),
        "binary keys count as written keys"
    );
}

fn cluster_bundle(spec: serde_json::Value) -> ClusterBundle {
    serde_json::from_value(json!({
        "apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle",
        "metadata": {"name": "trust", "uid": "cb-uid", "generation": 1},
        "spec": spec,
    }))
    .unwrap()
}

#[test]
fn a_cluster_bundle_writes_every_data_entry_under_its_own_names() {
    let mut world = World::new(&["team-a"]);
    let pem = ca_pem("root-a");
    let spec = |password: &str| {
        json!({"inLineCAs": pem, "target": {"namespaceSelector": {}, "configMap": {"data": [
            {"key": "ca.crt"}, {"key": "also.pem", "format": "PEM"},
            {"key": "ca.p12", "format": "PKCS12", "password": password},
        ]}}})
    };
    let cb = cluster_bundle(spec("pw"));
    let pass = plan(&world.observe(&cb));
    assert_eq!(pass.writes.len(), 1);
    let body = pass.writes[0].body();
    let metadata = &body["metadata"];
    assert_eq!(
        metadata["labels"],
        json!({"trust-manager.io/bundle": "trust"})
    );
    let hash = metadata["annotations"]["trust-manager.io/hash"]
        .as_str()
        .unwrap();
    assert_eq!(hash.len(), 64);
    assert_eq!(
        metadata["ownerReferences"],
        json!([{"apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle", "name": "trust",
                "uid": "cb-uid", "controller": true, "blockOwnerDeletion": true}])
    );
    let canonical = build(&[in_line(&pem)], &world.sources())
        .unwrap()
        .pool
        .to_pem();
    assert_eq!(
        body["data"],
        json!({"ca.crt": canonical, "also.pem": canonical})
    );
    assert!(
        body["binaryData"]["ca.p12"]
            .as_str()
            .is_some_and(|s| !s.is_empty())
    );
    let change = pass.status.unwrap();
    assert_eq!(
        change.condition.message,
        "Successfully synced ClusterBundle to all namespaces"
    );

    world.write_as_trust_manager(&cb);
    assert!(plan(&world.observe(&cb)).writes.is_empty(), "up to date");
    let changed = cluster_bundle(spec("another"));
    assert_eq!(
        plan(&world.observe(&changed)).writes.len(),
        1,
        "the hash covers the PKCS#12 password"
    );
}

#[test]
fn cluster_bundle_stores_default_to_legacy_des_and_a_converted_jks_key_stays_jks() {
    use caretaker_pki::truststore::Pkcs12Profile;
    let cb = cluster_bundle(
        json!({"target": {"namespaceSelector": {}, "secret": {"data": [
            {"key": "ca.crt"},
            {"key": "default.p12", "format": "PKCS12"},
            {"key": "modern.p12", "format": "PKCS12", "password": "pw", "profile": "Modern2023"},
            {"key": "ca.jks", "format": "PKCS12", "password": "changeit"},
        ]}}}),
    );
    let specs = target::cluster_bundle_specs(cb.spec.target.as_ref().unwrap(), Some("ca.jks"));
    let [(TargetKind::Secret, spec)] = specs.as_slice() else {
        panic!("{specs:?}")
    };
    assert_eq!(spec.pem_keys, ["ca.crt"]);
    assert_eq!(
        spec.stores,
        BTreeMap::from([
            (
                "ca.jks".to_string(),
                target::StoreFormat::Jks {
                    password: "changeit".into()
                }
            ),
            (
                "default.p12".to_string(),
                target::StoreFormat::Pkcs12 {
                    password: String::new(),
                    profile: Pkcs12Profile::LegacyDes
                }
            ),
            (
                "modern.p12".to_string(),
                target::StoreFormat::Pkcs12 {
                    password: "pw".into(),
                    profile: Pkcs12Profile::Modern2023
                }
            ),
        ])
    );
    assert_eq!(JKS_KEY_ANNOTATION, "internal.trust-manager.io/jks-key");
}

/// A world where Bundle `trust` wrote its targets, and the ClusterBundle converted from it.
fn bundle_world() -> (World, ClusterBundle) {
    let mut world = World::new(&["team-a", "team-b"]);
    let pem = ca_pem("root-a");
    let bundle = bundle(vec![in_line(&pem)], config_map_target("ca.crt"));
    world.write_as_trust_manager(&bundle);
    let cb = cluster_bundle(json!({"inLineCAs": pem, "target": {"namespaceSelector": {},
        "configMap": {"data": [{"key": "ca.crt"}]}}}));
    (world, cb)
}

#[test]
fn a_cluster_bundle_takes_a_bundles_targets_only_when_migrating() {
    let (mut world, cb) = bundle_world();
    let refused = plan(&world.observe(&cb));
    assert!(refused.writes.is_empty());
    let condition = refused.status.unwrap().condition;
    assert_eq!(condition.reason, "SyncConfigMapTargetFailed");
    assert!(
        condition
            .message
            .ends_with("it is controlled by Bundle \"trust\""),
        "{}",
        condition.message
    );

    world.settings.mode = BundleMode::Migrate;
    let adopted = plan(&world.observe(&cb));
    assert_eq!(adopted.writes.len(), 2, "one write per target");
    for write in &adopted.writes {
        let metadata = &write.body()["metadata"];
        assert_eq!(
            metadata["labels"],
            json!({"trust-manager.io/bundle": "trust"})
        );
        let owners = metadata["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 2);
        assert_eq!(
            (&owners[0]["kind"], &owners[0]["controller"]),
            (&json!("ClusterBundle"), &json!(true))
        );
        assert_eq!(
            owners[1],
            json!({"apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle", "name": "trust", "uid": UID}),
            "the Bundle stays, as a non-controller owner"
        );
    }
    world.write_as_trust_manager(&cb);
    assert!(
        plan(&world.observe(&cb)).writes.is_empty(),
        "taken over once"
    );

    // Once the Bundle is gone (the garbage collector dropped its reference), later writes do
    // not bring it back.
    for target in world.targets.values_mut() {
        target.owners.retain(|o| o.kind == "ClusterBundle");
    }
    let mut changed = cb.clone();
    changed.spec.in_line_cas = Some(ca_pem("root-b"));
    for write in plan(&world.observe(&changed)).writes {
        let owners = &write.body()["metadata"]["ownerReferences"];
        assert_eq!(owners.as_array().unwrap().len(), 1, "{owners}");
    }
}

#[test]
fn a_bundle_does_not_take_a_cluster_bundles_target_back() {
    let (mut world, cb) = bundle_world();
    world.settings.mode = BundleMode::Migrate;
    world.write_as_trust_manager(&cb);
    world.settings.mode = BundleMode::Serve;
    let pem = ca_pem("root-a");
    let bundle = bundle(vec![in_line(&pem)], config_map_target("ca.crt"));
    let pass = plan(&world.observe(&bundle));
    assert!(pass.writes.is_empty());
    let message = pass.status.unwrap().condition.message;
    assert!(
        message.ends_with("it is controlled by ClusterBundle \"trust\""),
        "{message}"
    );
}
