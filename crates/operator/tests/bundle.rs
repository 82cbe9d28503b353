//! The Bundle controller (trust-manager's `Bundle`) against the embedded API server with
//! trust-manager's own CRD: targets in every namespace written as trust-manager writes them,
//! new and relabelled namespaces, a source change, a broken source that touches no target, and a
//! take-over from a running trust-manager that writes nothing.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use caretaker_operator::Settings;
use caretaker_operator::trust::api::{BUNDLE_LABEL, Bundle, HASH_ANNOTATION};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use common::authorities::{create_namespace, eventually};
use common::trust::*;

#[tokio::test]
async fn targets_reach_every_namespace_as_trust_manager_writes_them_and_follow_changes() {
    let mut setup = setup(&["team-a", "team-b"]).await;
    let (a, b) = (ca("root-a"), ca("root-b"));
    setup
        .put_source("roots", &format!("# comment\n{b}\n{a}"))
        .await;
    setup.create_bundle(simple_bundle(None)).await;
    setup.start();

    let expected = canonical(&[&a, &b]);
    let bundle = setup.bundles().get("trust").await.unwrap();
    for namespace in all_namespaces(&setup.client).await {
        let target = setup.target_holding(&namespace, &expected).await;
        let meta = &target.metadata;
        assert_eq!(meta.labels.as_ref().unwrap()[BUNDLE_LABEL], "trust");
        assert_eq!(
            meta.annotations.as_ref().unwrap()[HASH_ANNOTATION],
            sha256_hex(&expected)
        );
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Bundle", "trust")
        );
        assert_eq!(owner.uid, bundle.metadata.uid.clone().unwrap());
        assert_eq!(
            (owner.controller, owner.block_owner_deletion),
            (Some(true), Some(true))
        );
        let managers: Vec<_> = meta
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert_eq!(managers, ["trust-manager"]);
    }
    assert_eq!(
        setup.synced().await,
        (
            "True".into(),
            "Synced".into(),
            "Successfully synced Bundle to all namespaces".into()
        )
    );
    let synced_events = setup.events("Synced").await;
    assert_eq!(synced_events.len(), 1, "one event for the one change");
    assert_eq!(synced_events[0].action.as_deref(), Some("Synced"));

    // A namespace created later gets its target.
    create_namespace(&setup.client, "team-c").await;
    setup.target_holding("team-c", &expected).await;

    // A source change reaches every target.
    let c = ca("root-c");
    setup.put_source("roots", &format!("{a}\n{c}")).await;
    let changed = canonical(&[&a, &c]);
    for namespace in all_namespaces(&setup.client).await {
        setup.target_holding(&namespace, &changed).await;
    }

    // With a selector, namespaces that stop matching lose their target.
    let namespaces: Api<Namespace> = Api::all(setup.client.clone());
    let label = json!({"metadata": {"labels": {"trust": "yes"}}});
    namespaces
        .patch("team-a", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .unwrap();
    let selector =
        json!({"spec": {"target": {"namespaceSelector": {"matchLabels": {"trust": "yes"}}}}});
    setup
        .bundles()
        .patch("trust", &PatchParams::default(), &Patch::Merge(&selector))
        .await
        .unwrap();
    for namespace in all_namespaces(&setup.client)
        .await
        .iter()
        .filter(|n| *n != "team-a")
    {
        setup.target_gone(namespace).await;
    }
    assert!(
        setup
            .config_maps("team-a")
            .get_opt("trust")
            .await
            .unwrap()
            .is_some()
    );
    let bundles = setup.bundles();
    eventually("the message names the selector", 20, || {
        let bundles = bundles.clone();
        async move {
            let status = bundles.get("trust").await.unwrap().status?;
            let message = &status.conditions?[0].message;
            (message == "Successfully synced Bundle to namespaces that match this label selector: trust=yes").then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_broken_source_touches_no_target_and_says_why() {
    let (setup, a) = serving(&["team-a"]).await;
    let before = setup.target_holding("team-a", &canonical(&[&a])).await;

    let key = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END PRIVATE KEY-----";
    setup.put_source("roots", &format!("{a}\n{key}")).await;
    let (reason, message) = setup.not_synced().await;
    assert_eq!(reason, "SourceBuildError");
    assert_eq!(
        message,
        "Failed to build bundle sources: invalid PEM data in ConfigMap cert-manager/roots at key \"ca.crt\": \
         invalid PEM block in bundle: only CERTIFICATE blocks are permitted but found 'PRIVATE KEY'"
    );
    assert!(!message.contains("c2VjcmV0"));
    let warnings = setup.events("SourceBuildError").await;
    assert!(!warnings.is_empty());
    assert_eq!(warnings[0].type_.as_deref(), Some("Warning"));
    assert_eq!(warnings[0].action.as_deref(), Some("SyncFailed"));
    let after = setup.config_maps("team-a").get("trust").await.unwrap();
    assert_eq!(
        after.metadata.resource_version, before.metadata.resource_version,
        "the target is untouched"
    );
}

#[tokio::test]
async fn taking_over_from_trust_manager_rewrites_nothing() {
    let mut setup = setup(&["team-a", "team-b"]).await;
    let a = ca("root-a");
    setup.put_source("roots", &a).await;
    setup.create_bundle(simple_bundle(None)).await;
    let bundle = setup.bundles().get("trust").await.unwrap();
    let uid = bundle.metadata.uid.clone().unwrap();

    // What a running trust-manager left: its server-side applies, by its field manager.
    let pem = canonical(&[&a]);
    let trust_manager = PatchParams::apply("trust-manager").force();
    let namespaces = all_namespaces(&setup.client).await;
    assert!(
        namespaces.len() >= 7,
        "the server's own namespaces too: {namespaces:?}"
    );
    for namespace in &namespaces {
        let target = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {
                "name": "trust", "namespace": namespace,
                "labels": {BUNDLE_LABEL: "trust"},
                "annotations": {HASH_ANNOTATION: sha256_hex(&pem)},
                "ownerReferences": [{"apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
                    "name": "trust", "uid": uid, "controller": true, "blockOwnerDeletion": true}],
            },
            "data": {"ca.crt": pem},
        });
        setup
            .config_maps(namespace)
            .patch("trust", &trust_manager, &Patch::Apply(&target))
            .await
            .unwrap();
    }
    let status = json!({
        "apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle", "metadata": {"name": "trust"},
        "status": {"conditions": [{"type": "Synced", "status": "True", "reason": "Synced",
            "message": "Successfully synced Bundle to all namespaces",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]},
    });
    setup
        .bundles()
        .patch_status("trust", &trust_manager, &Patch::Apply(&status))
        .await
        .unwrap();
    let versions = |setup: &Setup| {
        let (setup_client, namespaces) = (setup.client.clone(), namespaces.clone());
        async move {
            let mut versions = BTreeMap::new();
            for namespace in &namespaces {
                let configs: Api<ConfigMap> = Api::namespaced(setup_client.clone(), namespace);
                let target = configs.get("trust").await.unwrap();
                versions.insert(namespace.to_string(), target.metadata.resource_version);
            }
            let bundles: Api<Bundle> = Api::all(setup_client);
            versions.insert(
                "bundle".into(),
                bundles
                    .get("trust")
                    .await
                    .unwrap()
                    .metadata
                    .resource_version,
            );
            versions
        }
    };
    let before = versions(&setup).await;

    setup.start();
    eventually("caretaker has passed over the Bundle", 20, || {
        let passes = setup.passes();
        async move { (passes >= 1).then_some(()) }
    })
    .await;
    // A write would wake another pass; give it the time to show.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        versions(&setup).await,
        before,
        "no target and no status was written"
    );
    assert!(
        setup.events("Synced").await.is_empty(),
        "nothing changed, so no event"
    );
}

#[tokio::test]
async fn deleting_the_bundle_garbage_collects_its_targets() {
    // trust-manager's behaviour: targets are owned by their Bundle, and go with it.
    let (setup, _) = serving(&["team-a"]).await;
    setup
        .bundles()
        .delete("trust", &kube::api::DeleteParams::default())
        .await
        .unwrap();
    for namespace in all_namespaces(&setup.client).await {
        setup.target_gone(&namespace).await;
    }
    assert!(
        setup
            .config_maps(TRUST)
            .get_opt("roots")
            .await
            .unwrap()
            .is_some(),
        "the source stays"
    );
}

#[tokio::test]
async fn secret_targets_carry_java_stores_that_keytool_opens() {
    let mut setup = setup(&["team-a"]).await;
    let (a, b) = (ca("root-a"), ca("root-b"));
    setup.put_source("roots", &format!("{a}\n{b}")).await;
    let mut bundle = simple_bundle(None);
    bundle["spec"]["target"] = json!({
        "secret": {"key": "ca.crt"},
        "additionalFormats": {"jks": {"key": "bundle.jks", "password": "changeit"},
                              "pkcs12": {"key": "bundle.p12", "password": ""}},
    });
    setup.create_bundle(bundle).await;
    let mut settings = Settings::default();
    settings.trust.bundles.secret_targets_enabled = true;
    setup.start_with(settings);

    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(setup.client.clone(), "team-a");
    let secret = eventually("the Secret target", 20, || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("trust").await.unwrap() }
    })
    .await;
    assert_eq!(secret.type_.as_deref(), Some("Opaque"));
    let data = secret.data.unwrap();
    assert_eq!(
        String::from_utf8(data["ca.crt"].0.clone()).unwrap(),
        canonical(&[&a, &b])
    );
    let dir = tempfile::tempdir().unwrap();
    for (key, store_type, password) in [
        ("bundle.jks", "JKS", Some("changeit")),
        ("bundle.p12", "PKCS12", None),
    ] {
        let file = dir.path().join(key);
        std::fs::write(&file, &data[key].0).unwrap();
        let mut keytool = std::process::Command::new("keytool");
        keytool
            .args(["-list", "-storetype", store_type, "-keystore"])
            .arg(&file);
        if let Some(password) = password {
            keytool.args(["-storepass", password]);
        }
        let Ok(output) = keytool.stdin(std::process::Stdio::null()).output() else {
            assert!(
                std::env::var("CARETAKER_REQUIRE_KEYTOOL").is_err(),
                "keytool is not installed and CARETAKER_REQUIRE_KEYTOOL=1"
            );
            eprintln!("skipped the keytool check of {key}: keytool is not installed");
            continue;
        };
        let listing = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{key}: {listing}");
        assert_eq!(
            listing.matches("trustedCertEntry").count(),
            2,
            "{key}: {listing}"
        );
    }

    // Without the flag, the same Bundle is refused and nothing is written.
    let mut off = crate::setup(&["team-b"]).await;
    off.put_source("roots", &a).await;
    let mut bundle = simple_bundle(None);
    bundle["spec"]["target"] = json!({"configMap": {"key": "ca.crt"}, "secret": {"key": "ca.crt"}});
    off.create_bundle(bundle).await;
    off.start();
    assert_eq!(
        off.synced().await,
        (
            "False".into(),
            "SecretTargetsDisabled".into(),
            "Bundle has Secret targets but the feature is disabled".into()
        )
    );
    assert!(
        off.config_maps("team-b")
            .get_opt("trust")
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn kubectl_shows_bundles_as_it_shows_trust_managers() {
    let Some(kubectl) = caretaker_testkit::kubectl::Kubectl::find(
        "kubectl_shows_bundles_as_it_shows_trust_managers",
    ) else {
        return;
    };
    let mut setup = setup(&["team-a"]).await;
    let kubectl = kubectl.against(&setup.server.kubeconfig());
    let a = ca("root-a");
    setup.put_source("roots", &a).await;
    setup.start();
    let manifest = "apiVersion: trust.cert-manager.io/v1alpha1\nkind: Bundle\nmetadata:\n  name: trust\nspec:\n  sources:\n  - configMap: {name: roots, key: ca.crt}\n  target:\n    configMap: {key: root-certs.pem}\n";
    let applied = kubectl
        .run(&["apply", "--server-side", "-f", "-"], Some(manifest))
        .await;
    assert!(
        applied.status.success(),
        "{}",
        String::from_utf8_lossy(&applied.stderr)
    );
    setup.synced().await;

    let got = kubectl.run(&["get", "bundles"], None).await;
    let text = String::from_utf8_lossy(&got.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap()
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(
        header,
        [
            "NAME",
            "CONFIGMAP TARGET",
            "SECRET TARGET",
            "SYNCED",
            "REASON",
            "AGE"
        ],
        "{text}"
    );
    // The empty Secret Target column shows as nothing or <none>, as kubectl shows it.
    let row: Vec<&str> = lines
        .next()
        .unwrap()
        .split_whitespace()
        .filter(|c| *c != "<none>")
        .collect();
    assert_eq!(
        &row[..4],
        ["trust", "root-certs.pem", "True", "Synced"],
        "{text}"
    );

    let targets = kubectl
        .run(
            &[
                "get",
                "configmaps",
                "-A",
                "-l",
                "trust.cert-manager.io/bundle=trust",
                "-o",
                "name",
            ],
            None,
        )
        .await;
    let listed = String::from_utf8_lossy(&targets.stdout).lines().count();
    assert_eq!(
        listed,
        all_namespaces(&setup.client).await.len(),
        "one target per namespace"
    );
}

#[tokio::test]
async fn an_edited_target_is_restored_and_a_users_own_keys_are_kept() {
    let (setup, a) = serving(&["team-a"]).await;
    let expected = canonical(&[&a]);

    // Someone replaces the bundle with their own CA and adds a key of their own: an update by
    // another field manager, which takes the ownership of ca.crt away from trust-manager's.
    let forged = ca("attacker");
    let configs = setup.config_maps("team-a");
    let mut edited = configs.get("trust").await.unwrap();
    let data = edited.data.get_or_insert_with(Default::default);
    data.insert("ca.crt".into(), forged.clone());
    data.insert("mine.txt".into(), "kept".into());
    configs
        .replace(
            "trust",
            &PostParams {
                field_manager: Some("intruder".into()),
                ..Default::default()
            },
            &edited,
        )
        .await
        .unwrap();

    let restored = setup.target_holding("team-a", &expected).await;
    let data = restored.data.unwrap();
    assert!(
        !data["ca.crt"].contains(forged.lines().nth(1).unwrap()),
        "the forged CA is gone"
    );
    assert_eq!(
        data["mine.txt"], "kept",
        "keys trust-manager does not own stay"
    );
}

#[tokio::test]
async fn a_source_of_junk_and_a_huge_source_touch_no_target() {
    let (setup, a) = serving(&["team-a"]).await;
    let before = setup.target_holding("team-a", &canonical(&[&a])).await;

    // 900 KiB of text with no certificate in it: the bundle would be empty, so nothing is
    // written and the Bundle says why.
    setup
        .put_source("roots", &"not a certificate\n".repeat(50_000))
        .await;
    let (reason, _) = setup.not_synced().await;
    assert_eq!(reason, "SourceNotFound");
    let after = setup.config_maps("team-a").get("trust").await.unwrap();
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
    assert_eq!(after.data, before.data);
}

#[tokio::test]
async fn a_target_name_taken_by_another_controller_is_reported_not_stolen() {
    let mut setup = setup(&["team-a"]).await;
    let a = ca("root-a");
    setup.put_source("roots", &a).await;
    // A ConfigMap of the Bundle's name, already controlled by something else.
    let taken = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "trust", "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
            "name": "app", "uid": "0b0b0b0b-0000-4000-8000-000000000001", "controller": true}]},
        "data": {"app.conf": "x"},
    });
    setup
        .config_maps("team-a")
        .patch("trust", &PatchParams::apply("app"), &Patch::Apply(&taken))
        .await
        .unwrap();
    setup.create_bundle(simple_bundle(None)).await;
    setup.start();
    let (reason, message) = setup.not_synced().await;
    assert_eq!(reason, "SyncConfigMapTargetFailed", "{message}");
    assert!(
        message.starts_with("Failed to sync bundle ConfigMap to namespace \"team-a\": "),
        "{message}"
    );
    let kept = setup.config_maps("team-a").get("trust").await.unwrap();
    let owners = kept.metadata.owner_references.unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(owners[0].kind, "Deployment");
}
