//! The ClusterBundle controller (`trust-manager.io/v1alpha2`) and the Bundle → ClusterBundle
//! migration (`--bundle-mode migrate`) against the embedded API server with trust-manager's own
//! CRDs: targets under the new names, the take-over of a Bundle's targets in one write each with
//! no moment without data, the user's field manager reused (shown with the real kubectl), and
//! deleting Bundles or the Bundle CRD losing no target.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use caretaker_operator::Settings;
use caretaker_operator::trust::cluster_bundle::ClusterBundle;
use caretaker_operator::trust::plan::BundleMode;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};

use common::authorities::eventually;
use common::trust::*;

fn migrating() -> Settings {
    let mut settings = Settings::default();
    settings.trust.bundles.mode = BundleMode::Migrate;
    settings
}

fn cluster_bundles(setup: &Setup) -> Api<ClusterBundle> {
    Api::all(setup.client.clone())
}

async fn label_namespace(setup: &Setup, namespace: &str, labels: Value) {
    let namespaces: Api<Namespace> = Api::all(setup.client.clone());
    let patch = json!({"metadata": {"labels": labels}});
    namespaces
        .patch(namespace, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The ClusterBundle `trust`'s `Synced` condition once it has one for its current generation.
async fn cluster_synced(setup: &Setup, status: &str) -> (String, String) {
    let objects = cluster_bundles(setup);
    eventually(&format!("the ClusterBundle is Synced={status}"), 20, || {
        let objects = objects.clone();
        async move {
            let cb = objects.get("trust").await.unwrap();
            let generation = cb.metadata.generation;
            let conditions = cb.status?.conditions?;
            let synced = conditions.into_iter().find(|c| c.type_ == "Synced")?;
            (synced.status == status && synced.observed_generation == generation)
                .then_some((synced.reason, synced.message))
        }
    })
    .await
}

/// The `trust` ConfigMaps of every namespace, by namespace.
async fn targets(setup: &Setup) -> BTreeMap<String, ConfigMap> {
    let all: Api<ConfigMap> = Api::all(setup.client.clone());
    let list = all
        .list(&ListParams::default().fields("metadata.name=trust"))
        .await
        .unwrap();
    list.items
        .into_iter()
        .map(|c| (c.metadata.namespace.clone().unwrap(), c))
        .collect()
}

/// A target's owner references as (kind, controller), in kind order.
fn owners(target: &ConfigMap) -> Vec<(String, bool)> {
    let refs = target.metadata.owner_references.iter().flatten();
    let mut owners: Vec<_> = refs
        .map(|r| (r.kind.clone(), r.controller == Some(true)))
        .collect();
    owners.sort();
    owners
}

/// A change to a target: its namespace, and its data under `ca.crt` (`None` for a deletion).
type TargetChange = (String, Option<String>);

/// Every change to a `trust` ConfigMap a watch sees from now on.
struct TargetLog {
    seen: Arc<Mutex<Vec<TargetChange>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TargetLog {
    async fn start(setup: &Setup) -> Self {
        let all: Api<ConfigMap> = Api::all(setup.client.clone());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let (ready, started) = tokio::sync::oneshot::channel();
        let log = seen.clone();
        let config = watcher::Config::default().fields("metadata.name=trust");
        let task = tokio::spawn(async move {
            let mut ready = Some(ready);
            let mut events = std::pin::pin!(watcher(all, config));
            while let Some(Ok(event)) = events.next().await {
                let entry = |c: &ConfigMap, data| (c.metadata.namespace.clone().unwrap(), data);
                match event {
                    watcher::Event::InitDone => {
                        if let Some(ready) = ready.take() {
                            let _ = ready.send(());
                        }
                    }
                    watcher::Event::Apply(c) => {
                        let data = c.data.as_ref().and_then(|d| d.get("ca.crt")).cloned();
                        log.lock()
                            .unwrap()
                            .push(entry(&c, Some(data.unwrap_or_default())));
                    }
                    watcher::Event::Delete(c) => log.lock().unwrap().push(entry(&c, None)),
                    watcher::Event::Init | watcher::Event::InitApply(_) => {}
                }
            }
        });
        started.await.unwrap();
        Self { seen, task }
    }

    fn changes(&self) -> Vec<TargetChange> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for TargetLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test]
async fn a_cluster_bundle_writes_its_targets_under_the_new_names() {
    let mut setup = setup(&["team-a", "team-b"]).await;
    label_namespace(&setup, "team-a", json!({"team": "a"})).await;
    let (a, b, c) = (ca("root-a"), ca("root-b"), ca("root-c"));
    setup.put_source("roots", &a).await;
    // A second source whose `*.crt` keys are read and whose other keys are not.
    let more = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "more"},
        "data": {"extra.crt": b, "notes.txt": "not PEM at all"}});
    setup
        .config_maps(TRUST)
        .patch("more", &PatchParams::apply("test"), &Patch::Apply(&more))
        .await
        .unwrap();
    let cb: ClusterBundle = serde_json::from_value(json!({
        "apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle",
        "metadata": {"name": "trust"},
        "spec": {
            "sourceRefs": [
                {"kind": "ConfigMap", "name": "roots", "key": "ca.crt"},
                {"kind": "ConfigMap", "name": "more", "key": "*.crt"},
            ],
            "inLineCAs": c,
            "target": {
                "configMap": {
                    "data": [{"key": "ca.crt"}, {"key": "ca.p12", "format": "PKCS12"}],
                    "metadata": {"labels": {"app": "payments"}},
                },
                "namespaceSelector": {"matchLabels": {"team": "a"}},
            },
        },
    }))
    .unwrap();
    cluster_bundles(&setup)
        .create(&PostParams::default(), &cb)
        .await
        .unwrap();
    setup.start();

    let bundle = canonical(&[&a, &b, &c]);
    let target = setup.target_holding("team-a", &bundle).await;
    let labels = target.metadata.labels.clone().unwrap();
    assert_eq!(labels["trust-manager.io/bundle"], "trust");
    assert_eq!(labels["app"], "payments");
    assert!(!labels.contains_key("trust.cert-manager.io/bundle"));
    let annotations = target.metadata.annotations.clone().unwrap();
    assert_eq!(annotations["trust-manager.io/hash"].len(), 64);
    assert_eq!(owners(&target), [("ClusterBundle".to_string(), true)]);
    let p12 = &target.binary_data.as_ref().unwrap()["ca.p12"];
    assert!(!p12.0.is_empty());
    let (reason, message) = cluster_synced(&setup, "True").await;
    assert_eq!(reason, "Synced");
    assert_eq!(
        message,
        "Successfully synced ClusterBundle to namespaces that match this label selector: team=a"
    );
    assert!(!targets(&setup).await.contains_key("team-b"));

    // A namespace that starts matching gets its target.
    label_namespace(&setup, "team-b", json!({"team": "a"})).await;
    setup.target_holding("team-b", &bundle).await;

    // A bad `*.crt` source key stops the pass: Synced False, and no target touched.
    let before = targets(&setup).await;
    let junk = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "more"},
        "data": {"extra.crt": b, "bad.crt": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"}});
    setup
        .config_maps(TRUST)
        .patch("more", &PatchParams::apply("test"), &Patch::Apply(&junk))
        .await
        .unwrap();
    let (reason, message) = cluster_synced(&setup, "False").await;
    assert_eq!(reason, "SourceBuildError", "{message}");
    assert!(message.contains("bad.crt"), "{message}");
    let after = targets(&setup).await;
    for (namespace, target) in &before {
        let version = |t: &ConfigMap| t.metadata.resource_version.clone();
        assert_eq!(version(target), version(&after[namespace]), "{namespace}");
    }

    // Deleting the ClusterBundle garbage-collects the targets it controls.
    cluster_bundles(&setup)
        .delete("trust", &DeleteParams::default())
        .await
        .unwrap();
    setup.target_gone("team-a").await;
    setup.target_gone("team-b").await;
}

#[tokio::test]
async fn in_serve_mode_a_bundle_and_a_cluster_bundle_of_one_name_do_not_fight() {
    let (setup, a) = serving(&["team-a"]).await;
    setup.synced().await;
    let cb: ClusterBundle = serde_json::from_value(json!({
        "apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle",
        "metadata": {"name": "trust"},
        "spec": {"inLineCAs": ca("root-b"),
                 "target": {"configMap": {"data": [{"key": "ca.crt"}]}, "namespaceSelector": {}}},
    }))
    .unwrap();
    cluster_bundles(&setup)
        .create(&PostParams::default(), &cb)
        .await
        .unwrap();
    let (reason, message) = cluster_synced(&setup, "False").await;
    assert_eq!(reason, "SyncConfigMapTargetFailed", "{message}");
    assert!(
        message.ends_with("it is controlled by Bundle \"trust\""),
        "{message}"
    );
    for (namespace, target) in targets(&setup).await {
        assert_eq!(
            owners(&target),
            [("Bundle".to_string(), true)],
            "{namespace}"
        );
        assert_eq!(
            target.data.unwrap()["ca.crt"],
            canonical(&[&a]),
            "{namespace}"
        );
    }
}

/// The rename design's sequence, as a user runs it with kubectl: trust-manager's Bundle applied
/// by the user's manager and served; caretaker switched to `--bundle-mode migrate`; the
/// ClusterBundle appears, applied as the user's manager, and takes every target over in one
/// write each with the data always there; the Bundle shows the ClusterBundle's status; the
/// user's own apply of the ClusterBundle does not conflict (another manager's does); deleting
/// the Bundle and then the Bundle CRD leaves every target in place.
#[tokio::test]
async fn the_migration_sequence_keeps_every_target_at_every_step() {
    let Some(kubectl) = caretaker_testkit::kubectl::Kubectl::find(
        "the_migration_sequence_keeps_every_target_at_every_step",
    ) else {
        return;
    };
    let mut setup = setup(&["team-a", "team-b", "team-c"]).await;
    let kubectl = kubectl.against(&setup.server.kubeconfig());
    let a = ca("root-a");
    let bundle = canonical(&[&a]);
    setup.put_source("roots", &a).await;
    let as_user = [
        "apply",
        "--server-side",
        "--field-manager=platform-team",
        "-f",
        "-",
    ];
    let bundle_manifest = "apiVersion: trust.cert-manager.io/v1alpha1\nkind: Bundle\nmetadata:\n  name: trust\nspec:\n  sources:\n  - configMap: {name: roots, key: ca.crt}\n  target:\n    configMap: {key: ca.crt}\n";
    kubectl.ok(&as_user, Some(bundle_manifest)).await;
    setup.start();
    let namespaces = all_namespaces(&setup.client).await;
    for namespace in &namespaces {
        setup.target_holding(namespace, &bundle).await;
    }
    let count = namespaces.len();

    // caretaker restarted with --bundle-mode migrate.
    let log = TargetLog::start(&setup).await;
    setup.start_with(migrating());
    let objects = cluster_bundles(&setup);
    let taken_over = eventually("every target is the ClusterBundle's", 20, || {
        let setup = &setup;
        async move {
            let found = targets(setup).await;
            found
                .values()
                .all(|t| owners(t) == [("Bundle".into(), false), ("ClusterBundle".into(), true)])
                .then_some(found)
        }
    })
    .await;
    assert_eq!(taken_over.len(), count);
    for (namespace, target) in &taken_over {
        let labels = target.metadata.labels.clone().unwrap();
        assert_eq!(
            labels.get("trust-manager.io/bundle").map(String::as_str),
            Some("trust")
        );
        assert!(
            !labels.contains_key("trust.cert-manager.io/bundle"),
            "{namespace}"
        );
        assert_eq!(
            target.data.as_ref().unwrap()["ca.crt"],
            bundle,
            "{namespace}"
        );
    }
    let cb = objects.get("trust").await.unwrap();
    assert!(cb.metadata.owner_references.is_none(), "no owner reference");
    let managers: Vec<String> = cb
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            e.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.get("f:spec").is_some())
        })
        .filter_map(|e| e.manager.clone())
        .collect();
    assert_eq!(
        managers,
        ["platform-team"],
        "the spec is applied as the user's manager"
    );
    cluster_synced(&setup, "True").await;
    let bundles = setup.bundles();
    eventually("the Bundle shows the ClusterBundle's Synced", 20, || {
        let bundles = bundles.clone();
        async move {
            let bundle = bundles.get("trust").await.unwrap();
            let conditions = bundle.status?.conditions?;
            let synced = conditions.iter().find(|c| c.type_ == "Synced")?;
            (synced.status == "True"
                && synced.message == "Successfully synced ClusterBundle to all namespaces"
                && synced.observed_generation == bundle.metadata.generation)
                .then_some(())
        }
    })
    .await;

    // One write per target, with the data there throughout.
    let changes = log.changes();
    let mut writes: BTreeMap<&str, usize> = BTreeMap::new();
    for (namespace, data) in &changes {
        assert_eq!(
            data.as_deref(),
            Some(bundle.as_str()),
            "{namespace}: {changes:?}"
        );
        *writes.entry(namespace).or_default() += 1;
    }
    assert_eq!(writes.len(), count, "{writes:?}");
    assert!(writes.values().all(|n| *n == 1), "{writes:?}");

    // The user switches their manifest to the ClusterBundle, as the same manager: no conflict.
    // Another manager changing what the user owns conflicts, as server-side apply should.
    let cluster_manifest = |key: &str| {
        format!(
            "apiVersion: trust-manager.io/v1alpha2\nkind: ClusterBundle\nmetadata:\n  name: trust\nspec:\n  sourceRefs:\n  - {{kind: ConfigMap, name: roots, key: \"{key}\"}}\n  target:\n    configMap:\n      data:\n      - key: ca.crt\n      metadata:\n        labels: {{team-owned: \"yes\"}}\n    namespaceSelector: {{}}\n"
        )
    };
    let refused = kubectl
        .fails(
            &[
                "apply",
                "--server-side",
                "--field-manager=someone-else",
                "-f",
                "-",
            ],
            Some(&cluster_manifest("*")),
        )
        .await;
    assert!(refused.to_lowercase().contains("conflict"), "{refused}");
    kubectl
        .ok(&as_user, Some(&cluster_manifest("ca.crt")))
        .await;
    eventually("targets carry the user's new label", 20, || {
        let setup = &setup;
        async move {
            let found = targets(setup).await;
            found
                .values()
                .all(|t| {
                    t.metadata
                        .labels
                        .as_ref()
                        .unwrap()
                        .contains_key("team-owned")
                })
                .then_some(())
        }
    })
    .await;

    // The Bundle goes: the ClusterBundle and every target stay.
    kubectl.ok(&["delete", "bundle", "trust"], None).await;
    eventually("the Bundle's owner references are gone", 20, || {
        let setup = &setup;
        async move {
            let found = targets(setup).await;
            (found.len() == count
                && found
                    .values()
                    .all(|t| owners(t) == [("ClusterBundle".into(), true)]))
            .then_some(())
        }
    })
    .await;
    // And so does the Bundle CRD.
    kubectl
        .ok(&["delete", "crd", "bundles.trust.cert-manager.io"], None)
        .await;
    let crds: Api<CustomResourceDefinition> = Api::all(setup.client.clone());
    eventually("the Bundle CRD is gone", 20, || {
        let crds = crds.clone();
        async move {
            crds.get_opt("bundles.trust.cert-manager.io")
                .await
                .unwrap()
                .is_none()
                .then_some(())
        }
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let left = targets(&setup).await;
    assert_eq!(left.len(), count);
    assert!(objects.get_opt("trust").await.unwrap().is_some());
    assert!(
        log.changes().iter().all(|(_, data)| data.is_some()),
        "no target was ever deleted"
    );
}

/// The rename design's catastrophic case: the Bundle CRD removed while Bundles exist. Served
/// as trust-manager serves them, every target goes with the Bundles (the control); migrated,
/// none does.
#[tokio::test]
async fn deleting_the_bundle_crd_with_bundles_in_it_deletes_no_migrated_target() {
    for mode in [BundleMode::Serve, BundleMode::Migrate] {
        let mut setup = setup(&["team-a", "team-b"]).await;
        let a = ca("root-a");
        setup.put_source("roots", &a).await;
        setup.create_bundle(simple_bundle(None)).await;
        let mut settings = Settings::default();
        settings.trust.bundles.mode = mode;
        setup.start_with(settings);
        let count = all_namespaces(&setup.client).await.len();
        eventually("every target is written", 20, || {
            let setup = &setup;
            async move {
                let found = targets(setup).await;
                let controller_kind = match mode {
                    BundleMode::Serve => "Bundle",
                    BundleMode::Migrate => "ClusterBundle",
                };
                let controlled = |t: &ConfigMap| {
                    owners(t)
                        .iter()
                        .any(|(kind, controller)| *controller && kind == controller_kind)
                };
                (found.len() == count && found.values().all(controlled)).then_some(())
            }
        })
        .await;

        let crds: Api<CustomResourceDefinition> = Api::all(setup.client.clone());
        crds.delete("bundles.trust.cert-manager.io", &DeleteParams::default())
            .await
            .unwrap();
        match mode {
            BundleMode::Serve => {
                eventually("the garbage collector deletes every target", 20, || {
                    let setup = &setup;
                    async move { targets(setup).await.is_empty().then_some(()) }
                })
                .await;
            }
            BundleMode::Migrate => {
                eventually("the Bundle owner references are dropped", 20, || {
                    let setup = &setup;
                    async move {
                        let found = targets(setup).await;
                        found
                            .values()
                            .all(|t| owners(t) == [("ClusterBundle".into(), true)])
                            .then_some(())
                    }
                })
                .await;
                assert_eq!(targets(&setup).await.len(), count);
                assert!(
                    cluster_bundles(&setup)
                        .get_opt("trust")
                        .await
                        .unwrap()
                        .is_some()
                );
            }
        }
    }
}

/// Waits until all `count` targets hold `bundle` and have exactly the owners `expected`.
async fn all_owned_by(setup: &Setup, count: usize, bundle: &str, expected: Vec<(String, bool)>) {
    eventually(
        &format!("every target is owned by {expected:?}"),
        20,
        || {
            let expected = expected.clone();
            async move {
                let found = targets(setup).await;
                let owned = found
                    .values()
                    .all(|t| owners(t) == expected && t.data.as_ref().unwrap()["ca.crt"] == bundle);
                (found.len() == count && owned).then_some(())
            }
        },
    )
    .await
}

/// Going back before the Bundles are deleted: Bundles served, then migrated, then caretaker
/// restarted in serve mode and the ClusterBundle deleted. Every target stays (the Bundle still
/// owns it) and the Bundle takes it back; while the ClusterBundle exists, the Bundle does not
/// take its targets.
#[tokio::test]
async fn going_back_before_the_bundles_are_deleted_loses_no_target() {
    let mut setup = setup(&["team-a", "team-b"]).await;
    let a = ca("root-a");
    let bundle = canonical(&[&a]);
    setup.put_source("roots", &a).await;
    setup.create_bundle(simple_bundle(None)).await;
    setup.start();
    let count = all_namespaces(&setup.client).await.len();
    all_owned_by(&setup, count, &bundle, vec![("Bundle".into(), true)]).await;
    setup.start_with(migrating());
    let both = vec![("Bundle".into(), false), ("ClusterBundle".into(), true)];
    all_owned_by(&setup, count, &bundle, both).await;

    let log = TargetLog::start(&setup).await;
    setup.start();
    let (reason, message) = setup.not_synced().await;
    assert_eq!(reason, "SyncConfigMapTargetFailed");
    assert!(
        message.ends_with("it is controlled by ClusterBundle \"trust\""),
        "{message}"
    );
    cluster_bundles(&setup)
        .delete("trust", &DeleteParams::default())
        .await
        .unwrap();
    all_owned_by(&setup, count, &bundle, vec![("Bundle".into(), true)]).await;
    let bundles = setup.bundles();
    eventually("the Bundle is Synced again", 20, || {
        let bundles = bundles.clone();
        async move {
            let conditions = bundles.get("trust").await.unwrap().status?.conditions?;
            conditions
                .iter()
                .any(|c| c.type_ == "Synced" && c.status == "True")
                .then_some(())
        }
    })
    .await;
    assert!(
        log.changes().iter().all(|(_, data)| data.is_some()),
        "no target was ever deleted"
    );
}

/// Issue 31, item 12: in migrate mode, a user who may only create Bundles names a ClusterBundle
/// left with the record of an earlier, deleted Bundle of that name (as every migrated
/// ClusterBundle is once its Bundle is gone). Before, the migration force-applied the user's
/// Bundle over it, putting their CA into every namespace; now the ClusterBundle is not this
/// Bundle's (another UID is recorded), so nothing is written and the Bundle says why. The first
/// half is the legitimate migration, which still works.
#[tokio::test]
async fn a_bundle_creator_cannot_take_over_a_clusterbundle_left_by_an_earlier_bundle() {
    use caretaker_apiserver::{ApiServer, Authorization, Subject};
    use k8s_openapi::api::events::v1::Event;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

    let server = ApiServer::builder()
        .tls(true)
        .authorization(Authorization::Rbac)
        .bookmark_interval(std::time::Duration::from_secs(1))
        .start()
        .await
        .unwrap();
    let mut setup = setup_on(server, &["team-a", "team-b"]).await;
    let a = ca("root-a");
    let bundle = canonical(&[&a]);
    setup.put_source("roots", &a).await;

    // The legitimate migration: the admin's Bundle becomes the ClusterBundle, then goes.
    setup.create_bundle(simple_bundle(None)).await;
    setup.start_with(migrating());
    let namespaces = all_namespaces(&setup.client).await;
    all_owned_by(
        &setup,
        namespaces.len(),
        &bundle,
        vec![("ClusterBundle".into(), true)],
    )
    .await;
    cluster_synced(&setup, "True").await;
    // A spec change is applied again, over the ClusterBundle this Bundle made.
    let selector = json!({"spec": {"target": {"namespaceSelector": {}}}});
    let changed = setup
        .bundles()
        .patch("trust", &PatchParams::default(), &Patch::Merge(&selector))
        .await
        .unwrap();
    assert_eq!(changed.metadata.generation, Some(2));
    let record = format!(
        "{}/{}",
        changed.metadata.uid.unwrap(),
        changed.metadata.generation.unwrap()
    );
    eventually("the new generation is applied", 20, || {
        let (objects, record) = (cluster_bundles(&setup), record.clone());
        async move {
            let cb = objects.get("trust").await.unwrap();
            let annotations = cb.metadata.annotations.unwrap_or_default();
            (annotations.get("caretaker.dev/migrated-from-bundle") == Some(&record)).then_some(())
        }
    })
    .await;
    let fields = serde_json::to_string(
        &cluster_bundles(&setup)
            .get("trust")
            .await
            .unwrap()
            .metadata
            .managed_fields,
    )
    .unwrap();
    assert!(
        !fields.contains("resourceVersion"),
        "the precondition is no owned field: {fields}"
    );
    setup
        .bundles()
        .delete("trust", &DeleteParams::default())
        .await
        .unwrap();
    all_owned_by(
        &setup,
        namespaces.len(),
        &bundle,
        vec![("ClusterBundle".into(), true)],
    )
    .await;
    let before = cluster_bundles(&setup).get("trust").await.unwrap();
    let annotations = before.metadata.annotations.clone().unwrap();
    assert!(annotations.contains_key("caretaker.dev/migrated-from-bundle"));

    // Mallory may create Bundles and nothing else.
    let roles: Api<ClusterRole> = Api::all(setup.client.clone());
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "bundle-creator"},
        "rules": [{"apiGroups": ["trust.cert-manager.io"], "resources": ["bundles"], "verbs": ["create"]}],
    });
    roles
        .create(
            &PostParams::default(),
            &serde_json::from_value(role).unwrap(),
        )
        .await
        .unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(setup.client.clone());
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "mallory-creates-bundles"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bundle-creator"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}],
    });
    bindings
        .create(
            &PostParams::default(),
            &serde_json::from_value(binding).unwrap(),
        )
        .await
        .unwrap();
    let mallory = Subject::User {
        name: "mallory".into(),
        groups: vec![],
    };
    let as_mallory =
        kube::Client::try_from(setup.server.kube_config_for(&mallory).unwrap()).unwrap();
    let denied = Api::<ClusterBundle>::all(as_mallory.clone())
        .get("trust")
        .await;
    assert!(denied.is_err(), "mallory may not even read ClusterBundles");

    // Mallory's Bundle of that name, with her own CA, applied as the ClusterBundle's manager.
    let m = ca("mallory");
    let attack = json!({
        "apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
        "metadata": {"name": "trust"},
        "spec": {"sources": [{"inLine": m}], "target": {"configMap": {"key": "ca.crt"}}},
    });
    let params = PostParams {
        field_manager: Some("caretaker-bundle-migration".into()),
        ..Default::default()
    };
    Api::<caretaker_operator::trust::api::Bundle>::all(as_mallory)
        .create(&params, &serde_json::from_value(attack).unwrap())
        .await
        .unwrap();

    // Refused: the Bundle says so, with a Warning naming the ClusterBundle...
    let (reason, message) = setup.not_synced().await;
    assert_eq!(reason, "MigrationRefused", "{message}");
    assert!(message.contains("ClusterBundle \"trust\""), "{message}");
    let events: Api<Event> = Api::namespaced(setup.client.clone(), "default");
    let warned = eventually("a Warning event names the ClusterBundle", 20, || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.unwrap();
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("MigrationRefused")
                    && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Bundle")
            })
        }
    })
    .await;
    assert_eq!(warned.type_.as_deref(), Some("Warning"));
    assert!(
        warned.note.unwrap().contains("ClusterBundle \"trust\""),
        "the event names the ClusterBundle"
    );
    // ...and the ClusterBundle and every target are as they were (the pass that decided the
    // refusal is the pass that would have applied).
    let after = cluster_bundles(&setup).get("trust").await.unwrap();
    assert_eq!(
        serde_json::to_value(&after.spec).unwrap(),
        serde_json::to_value(&before.spec).unwrap()
    );
    assert_eq!(after.metadata.annotations, before.metadata.annotations);
    assert_eq!(
        after.metadata.managed_fields,
        before.metadata.managed_fields
    );
    let found = targets(&setup).await;
    assert_eq!(found.len(), namespaces.len());
    for (namespace, target) in &found {
        let data = &target.data.as_ref().unwrap()["ca.crt"];
        assert_eq!(data, &bundle, "{namespace} holds only the admin's CA");
    }
}

/// Between the client and the API server: before the first POST or PATCH of ClusterBundle
/// `name` (not its status), the administrator creates theirs, `admin_spec`: a ClusterBundle
/// made after the migration decided there was none, however late.
struct CreateFirst<S> {
    inner: S,
    admin: kube::Client,
    name: &'static str,
    admin_spec: Value,
    done: Arc<std::sync::atomic::AtomicBool>,
}

impl<S> tower::Service<http::Request<kube::client::Body>> for CreateFirst<S>
where
    S: tower::Service<http::Request<kube::client::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let collection = "/apis/trust-manager.io/v1alpha2/clusterbundles";
        let path = request.uri().path();
        let first_write = matches!(*request.method(), http::Method::POST | http::Method::PATCH)
            && (path == collection || path == format!("{collection}/{}", self.name))
            && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst);
        let admin = self.admin.clone();
        let body = json!({
            "apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle",
            "metadata": {"name": self.name}, "spec": self.admin_spec,
        });
        let response = self.inner.call(request);
        Box::pin(async move {
            if first_write {
                Api::<ClusterBundle>::all(admin)
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(body).unwrap(),
                    )
                    .await
                    .unwrap();
            }
            response.await
        })
    }
}

struct CreateFirstLayer(kube::Client, Value, Arc<std::sync::atomic::AtomicBool>);

impl<S> tower::Layer<S> for CreateFirstLayer {
    type Service = CreateFirst<S>;

    fn layer(&self, inner: S) -> CreateFirst<S> {
        CreateFirst {
            inner,
            admin: self.0.clone(),
            name: "trust",
            admin_spec: self.1.clone(),
            done: self.2.clone(),
        }
    }
}

/// Issue 31, item 12's last window: mallory, who may only create Bundles, creates Bundle
/// `trust` while the administrator creates ClusterBundle `trust` of their own. Its watch has
/// not shown it yet when the migration decides there is none; it appears just before the
/// migration's first write. That write was a forced apply, written over the administrator's
/// ClusterBundle (mallory's CA in every namespace); now it is a create, refused (409), and the
/// next pass refuses the Bundle, the ClusterBundle untouched.
#[tokio::test]
async fn a_cluster_bundle_made_just_before_the_migrations_first_write_is_not_written_over() {
    use caretaker_apiserver::{ApiServer, Authorization, Subject};
    use caretaker_operator::Context;
    use caretaker_operator::trust::controller::{self as bundle, migration as bundle_migration};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

    let server = ApiServer::builder()
        .tls(true)
        .authorization(Authorization::Rbac)
        .start()
        .await
        .unwrap();
    let setup = setup_on(server, &["team-a"]).await;
    let a = ca("root-a");
    setup.put_source("roots", &a).await;
    for (api, body) in [
        (
            "roles",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "bundle-creator"},
                "rules": [{"apiGroups": ["trust.cert-manager.io"], "resources": ["bundles"], "verbs": ["create"]}],
            }),
        ),
        (
            "bindings",
            json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "mallory-creates-bundles"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "bundle-creator"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}],
            }),
        ),
    ] {
        let params = PostParams::default();
        match api {
            "roles" => Api::<ClusterRole>::all(setup.client.clone())
                .create(&params, &serde_json::from_value(body).unwrap())
                .await
                .map(|_| ()),
            _ => Api::<ClusterRoleBinding>::all(setup.client.clone())
                .create(&params, &serde_json::from_value(body).unwrap())
                .await
                .map(|_| ()),
        }
        .unwrap();
    }
    let admin_spec = json!({
        "sourceRefs": [{"kind": "ConfigMap", "name": "roots", "key": "ca.crt"}],
        "target": {"configMap": {"data": [{"key": "admins.crt"}]}},
    });
    let operator = kube::client::ClientBuilder::try_from(setup.server.kube_config())
        .unwrap()
        .with_layer(&CreateFirstLayer(
            setup.client.clone(),
            admin_spec.clone(),
            Arc::default(),
        ))
        .build();
    let ctx = Context::new(operator, migrating());
    let controllers = tokio::spawn(async move {
        futures::join!(bundle::run(ctx.clone()), bundle_migration::run(ctx));
    });

    let mallory = Subject::User {
        name: "mallory".into(),
        groups: vec![],
    };
    let as_mallory =
        kube::Client::try_from(setup.server.kube_config_for(&mallory).unwrap()).unwrap();
    let attack = json!({
        "apiVersion": "trust.cert-manager.io/v1alpha1", "kind": "Bundle",
        "metadata": {"name": "trust"},
        "spec": {"sources": [{"inLine": ca("mallory")}], "target": {"configMap": {"key": "ca.crt"}}},
    });
    Api::<caretaker_operator::trust::api::Bundle>::all(as_mallory)
        .create(
            &PostParams::default(),
            &serde_json::from_value(attack).unwrap(),
        )
        .await
        .unwrap();

    let (reason, message) = setup.not_synced().await;
    controllers.abort();
    assert_eq!(reason, "MigrationRefused", "{message}");
    let after = cluster_bundles(&setup).get("trust").await.unwrap();
    let spec = serde_json::to_value(&after.spec).unwrap();
    assert_eq!(
        (&spec["sourceRefs"], &spec["target"]["configMap"]),
        (
            &admin_spec["sourceRefs"],
            &admin_spec["target"]["configMap"]
        ),
        "the administrator's ClusterBundle was written over"
    );
    let annotations = after.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key("caretaker.dev/migrated-from-bundle"),
        "{annotations:?}"
    );
}
