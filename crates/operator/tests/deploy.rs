//! The operator as deploy/ installs it: `kubectl apply -k deploy/` on an API server that
//! authenticates and enforces RBAC, then the operator acting as deploy/'s ServiceAccount and
//! nothing more, through a representative run: its webhook bootstrapped and admitting,
//! Machine refreshes and rollouts of all three parent kinds with real agents, a
//! CertificateAuthority issuing with CA-bundle injection, and a ClusterBundle.
//!
//! Least privilege, measured: the server records every kind of request the ServiceAccount
//! made; no request may have been refused, and every grant of deploy/rbac.yaml must have been
//! used, but for the exceptions listed (each with its reason).

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use caretaker_agent_api::kubeadm::NodeRole;
use caretaker_api::names;
use caretaker_apiserver::{Access, ApiServer, Authorization, Subject};
use caretaker_operator::leader::{DEFAULT_LEASE, Election, LeaseSettings};
use caretaker_operator::webhook::bootstrap::{self, Bootstrap};
use caretaker_operator::webhook::{Limits, Webhook};
use caretaker_testkit::capi_objects;
use caretaker_testkit::kubectl::Kubectl;
use common::authorities::{certificate_authority, eventually, refusal};
use common::{NS, World, fast, world_on};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

const SYSTEM: &str = "caretaker-system";
const SERVICE: &str = "caretaker-webhook";
const ACCOUNT: &str = "caretaker";

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn operator_user() -> String {
    format!("system:serviceaccount:{SYSTEM}:{ACCOUNT}")
}

/// One (verb, group, resource, subresource) a rule grants, in `namespace` for a Role's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Grant {
    verb: String,
    group: String,
    resource: String,
    subresource: String,
    namespace: Option<String>,
}

fn grants(rules: &[PolicyRule], namespace: Option<&str>) -> Vec<Grant> {
    let mut out = Vec::new();
    for rule in rules {
        for group in rule.api_groups.iter().flatten() {
            for resource in rule.resources.iter().flatten() {
                let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
                for verb in &rule.verbs {
                    out.push(Grant {
                        verb: verb.clone(),
                        group: group.clone(),
                        resource: resource.into(),
                        subresource: subresource.into(),
                        namespace: namespace.map(String::from),
                    });
                }
            }
        }
    }
    out
}

fn used(grant: &Grant, log: &[Access]) -> bool {
    log.iter().any(|a| {
        a.allowed
            && a.verb == grant.verb
            && a.group == grant.group
            && a.resource == grant.resource
            && a.subresource == grant.subresource
            && grant.namespace.as_ref().is_none_or(|ns| *ns == a.namespace)
    })
}

/// Grants the representative run does not use, and why each is kept: (verb, group,
/// resource[/subresource], reason). Other tests run each of these paths as the admin.
#[rustfmt::skip]
const UNUSED_ON_PURPOSE: &[(&str, &str, &str, &str)] = &[
    ("delete", "", "secrets", "an EtcdCertificates member removed; a Bundle dropping a Secret target"),
    ("delete", "", "configmaps", "a Bundle or ClusterBundle dropping a target it no longer selects"),
    ("patch", "caretaker.dev", "etcdcertificates/status", "an EtcdCertificates (tests/etcd.rs, on a real etcd cluster)"),
    ("create", "trust-manager.io", "clusterbundles", "--bundle-mode migrate applies each Bundle as a new ClusterBundle"),
    ("patch", "trust-manager.io", "clusterbundles", "--bundle-mode migrate"),
    ("patch", "trust.cert-manager.io", "bundles/status", "a trust.cert-manager.io Bundle (this run has a ClusterBundle)"),
    ("patch", "apiregistration.k8s.io", "apiservices", "an APIService annotated for CA injection"),
    ("patch", "apiextensions.k8s.io", "customresourcedefinitions", "a CRD conversion webhook annotated for CA injection"),
    ("get", "cluster.x-k8s.io", "machines", "a refresh reads its Machine afresh only when its own last write is not at hand (after a conflict)"),
];

async fn parent_done(world: &World, resource: &kube::api::ApiResource, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, resource);
    eventually(&format!("{name}'s refresh done"), 60, || {
        let api = api.clone();
        async move {
            let annotations = api.get(name).await.ok()?.metadata.annotations?;
            (annotations
                .get(names::REFRESH_CERTIFICATES_STATUS)
                .map(String::as_str)
                == Some(names::STATUS_DONE))
            .then_some(())
        }
    })
    .await
}

async fn refresh_parent(world: &World, resource: &kube::api::ApiResource, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(world.client.clone(), NS, resource);
    // Without the status a Cluster's request left on its children (each shows its own), so
    // that `done` below is this request's.
    let trigger = json!({"metadata": {"annotations": {
        names::REFRESH_CERTIFICATES: "1y",
        names::REFRESH_CERTIFICATES_STATUS: null,
    }}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&trigger))
        .await
        .unwrap();
    parent_done(world, resource, name).await;
    // Ready for the next trigger.
    let clear = json!({"metadata": {"annotations": {names::REFRESH_CERTIFICATES_STATUS: null}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&clear))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_runs_as_its_deploy_service_account_with_only_the_grants_it_uses() {
    let Some(kubectl) = Kubectl::find("deploy") else {
        return;
    };
    // The webhook listens first, so that the API server knows where the Service's
    // caretaker-webhook.caretaker-system.svc is.
    let setup = Bootstrap {
        namespace: SYSTEM.into(),
        service: SERVICE.into(),
        url: None,
    };
    let webhook = Webhook::bind(
        &"127.0.0.1:0".parse().unwrap(),
        setup.certificate_source(),
        Limits::default(),
    )
    .await
    .unwrap();
    let server = ApiServer::builder()
        .tls(true)
        .authorization(Authorization::Rbac)
        .webhook_service(SYSTEM, SERVICE, webhook.local_addr().unwrap())
        .start()
        .await
        .unwrap();
    let admin = server.client();

    // What a user installs, as the cluster's admin.
    let kubectl = kubectl.against(&server.kubeconfig());
    let installed = kubectl
        .ok(&["apply", "-k", deploy_dir().to_str().unwrap()], None)
        .await;
    for object in [
        "namespace/caretaker-system created",
        "serviceaccount/caretaker created",
        "clusterrole.rbac.authorization.k8s.io/caretaker-operator created",
        "role.rbac.authorization.k8s.io/caretaker-operator created",
        "deployment.apps/caretaker-operator created",
    ] {
        assert!(installed.contains(object), "{object}:\n{installed}");
    }
    // Not the webhook configuration: the bootstrap makes it after its own objects.
    assert!(
        !installed.contains("validatingwebhookconfiguration"),
        "{installed}"
    );
    capi_objects::install_trust_manager_crds(&admin)
        .await
        .unwrap();

    // The operator as its ServiceAccount, with the webhook its bootstrap certifies.
    let operator = kube::Client::try_from(
        server
            .kube_config_for(&Subject::ServiceAccount {
                namespace: SYSTEM.into(),
                name: ACCOUNT.into(),
            })
            .unwrap(),
    )
    .unwrap();
    let webhook = tokio::spawn(webhook.run(operator.clone()));
    let bootstrapping = {
        let (operator, objects) = (operator.clone(), setup.objects());
        tokio::spawn(async move {
            bootstrap::ensure(operator, &objects, Duration::from_millis(200)).await
        })
    };
    // Leader election on the Lease deploy/ grants, as `caretaker operator --leader-elect`.
    let mut election = Election::join(
        operator.clone(),
        LeaseSettings {
            namespace: SYSTEM.into(),
            name: DEFAULT_LEASE.into(),
            identity: LeaseSettings::identity("deploy-test"),
            duration: Duration::from_secs(15),
        },
    )
    .await
    .unwrap();
    election.leading().await.unwrap();
    let mut world = world_on(server, operator, fast()).await;

    // The webhook serves with the certificate its bootstrap issued, and refuses a bad spec.
    let serving = Api::<Secret>::namespaced(world.client.clone(), SYSTEM);
    eventually("the webhook's serving Secret", 30, || {
        let serving = serving.clone();
        async move {
            serving
                .get_opt(bootstrap::SERVING_SECRET)
                .await
                .ok()
                .flatten()
        }
    })
    .await;
    // deploy/webhook.yaml is what the bootstrap made: applied by the admin after the first
    // start, it changes no webhook (and keeps the injected caBundle).
    kubectl
        .ok(
            &[
                "apply",
                "-f",
                deploy_dir().join("webhook.yaml").to_str().unwrap(),
            ],
            None,
        )
        .await;
    let installed_configuration = Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .get(bootstrap::NAME)
        .await
        .unwrap();
    let comparable = |c: &ValidatingWebhookConfiguration| {
        let mut hooks = serde_json::to_value(&c.webhooks).unwrap();
        for hook in hooks.as_array_mut().unwrap() {
            hook["clientConfig"]
                .as_object_mut()
                .unwrap()
                .remove("caBundle");
        }
        // kubectl adds its last-applied-configuration.
        let inject_from = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::injection::INJECT_CA_FROM).cloned());
        (hooks, inject_from, c.metadata.labels.clone())
    };
    assert_eq!(
        comparable(&installed_configuration),
        comparable(&setup.objects().configuration)
    );
    let authorities = Api::all(world.client.clone());
    let bad = certificate_authority("bad", "default", json!({"validity": "forever"}));
    let refused = eventually(
        "the webhook refusing a bad CertificateAuthority",
        30,
        || {
            let (authorities, bad) = (authorities.clone(), bad.clone());
            async move {
                let message = refusal(authorities.create(&PostParams::default(), &bad).await);
                message.contains("admission webhook").then_some(message)
            }
        },
    )
    .await;
    assert!(refused.contains("spec.validity"), "{refused}");

    // A CertificateAuthority issuing, injected into a webhook configuration.
    let apps = certificate_authority("apps", "default", json!({"trustPropagation": "0s"}));
    authorities
        .create(&PostParams::default(), &apps)
        .await
        .unwrap();
    let issued: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "caretaker.dev/v1alpha1", "kind": "IssuedCertificate",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"issuerRef": {"name": "apps"}, "secretName": "web-tls",
                 "commonName": "web.default.svc", "dnsNames": ["web.default.svc"], "usages": ["server"]},
    }))
    .unwrap();
    let issued_resource = kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("caretaker.dev", "v1alpha1", "IssuedCertificate"),
        "issuedcertificates",
    );
    Api::<DynamicObject>::namespaced_with(world.client.clone(), NS, &issued_resource)
        .create(&PostParams::default(), &issued)
        .await
        .unwrap();
    let injected: MutatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": {"name": "apps", "annotations": {names::injection::INJECT_CA_FROM: "apps"}},
        "webhooks": [{"name": "apps.example.dev", "admissionReviewVersions": ["v1"],
                      "sideEffects": "None", "clientConfig": {"url": "https://apps.example.dev/mutate"}}],
    }))
    .unwrap();
    let mutating = Api::<MutatingWebhookConfiguration>::all(world.client.clone());
    mutating
        .create(&PostParams::default(), &injected)
        .await
        .unwrap();
    let secrets = Api::<Secret>::namespaced(world.client.clone(), NS);
    eventually("the IssuedCertificate's Secret", 30, || {
        let secrets = secrets.clone();
        async move { secrets.get_opt("web-tls").await.ok().flatten() }
    })
    .await;
    // Forced renewal, the documented way: the Secret is patched with a new leaf.
    let first = secrets.get("web-tls").await.unwrap();
    let forget =
        json!({"metadata": {"annotations": {"auth.openshift.io/certificate-not-after": null}}});
    secrets
        .patch("web-tls", &PatchParams::default(), &Patch::Merge(&forget))
        .await
        .unwrap();
    eventually("the forced renewal", 30, || {
        let (secrets, first) = (secrets.clone(), first.data.clone());
        async move {
            let now = secrets.get("web-tls").await.ok()?;
            let renewed = now.data != first
                && now
                    .metadata
                    .annotations?
                    .contains_key("auth.openshift.io/certificate-not-after");
            renewed.then_some(())
        }
    })
    .await;
    // The CA rotated, the documented way: its leaf is re-issued by the new CA.
    let ca_secrets = Api::<Secret>::namespaced(world.client.clone(), NS);
    let before = secrets.get("web-tls").await.unwrap().data;
    ca_secrets
        .patch("apps-ca", &PatchParams::default(), &Patch::Merge(&forget))
        .await
        .unwrap();
    eventually("the leaf re-issued by the rotated CA", 60, || {
        let (secrets, before) = (secrets.clone(), before.clone());
        async move { (secrets.get("web-tls").await.ok()?.data != before).then_some(()) }
    })
    .await;
    eventually("the CA bundle injected", 30, || {
        let mutating = mutating.clone();
        async move {
            let hooks = mutating.get("apps").await.ok()?.webhooks?;
            hooks[0]
                .client_config
                .ca_bundle
                .as_ref()
                .filter(|b| !b.0.is_empty())?;
            Some(())
        }
    })
    .await;

    // Machines: each parent kind's refresh rollout, with real agents.
    world
        .add_machine("cp-0", NodeRole::ControlPlane, "cp.example", None)
        .await;
    world
        .add_machine("w-0", NodeRole::Worker, "cp.example", None)
        .await;
    refresh_parent(
        &world,
        &caretaker_api::cluster_api::cluster_api_resource(),
        "c1",
    )
    .await;
    for name in ["cp-0", "w-0"] {
        let annotations = world.annotations(name).await;
        assert_eq!(
            annotations
                .get(names::REFRESH_CERTIFICATES_STATUS)
                .map(String::as_str),
            Some(names::STATUS_DONE),
            "{name} refreshed: {annotations:?}"
        );
    }
    refresh_parent(
        &world,
        &caretaker_api::cluster_api::machine_deployment_api_resource(),
        "c1-md-0",
    )
    .await;
    let control_plane = world.cluster.control_plane_name();
    refresh_parent(
        &world,
        &caretaker_api::cluster_api::control_plane_api_resource(),
        &control_plane,
    )
    .await;

    // Where each rollout stands, on /metrics.
    let metrics = world.ctx.metrics.encode();
    for (kind, name, machines) in [
        ("Cluster", "c1", 2),
        ("MachineDeployment", "c1-md-0", 1),
        ("CK8sControlPlane", control_plane.as_str(), 1),
    ] {
        for state in ["total", "done"] {
            let series = format!(
                "caretaker_rollout_machines{{kind=\"{kind}\",namespace=\"{NS}\",name=\"{name}\",operation=\"refresh-certificates\",state=\"{state}\"}} {machines}"
            );
            assert!(metrics.contains(&series), "{series}\n{metrics}");
        }
    }

    // A ClusterBundle from the trust namespace's ConfigMap into every namespace.
    common::authorities::create_namespace(&world.client, "cert-manager").await;
    let roots: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "roots", "namespace": "cert-manager"},
        "data": {"ca.crt": common::trust::ca("root")},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(world.client.clone(), "cert-manager")
        .create(&PostParams::default(), &roots)
        .await
        .unwrap();
    let cluster_bundle: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "trust-manager.io/v1alpha2", "kind": "ClusterBundle",
        "metadata": {"name": "trust"},
        "spec": {"sourceRefs": [{"kind": "ConfigMap", "name": "roots", "key": "ca.crt"}],
                 "target": {"configMap": {"data": [{"key": "ca.crt"}]}, "namespaceSelector": {}}},
    }))
    .unwrap();
    let cluster_bundles = kube::api::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("trust-manager.io", "v1alpha2", "ClusterBundle"),
        "clusterbundles",
    );
    Api::<DynamicObject>::all_with(world.client.clone(), &cluster_bundles)
        .create(&PostParams::default(), &cluster_bundle)
        .await
        .unwrap();
    let targets = Api::<ConfigMap>::namespaced(world.client.clone(), NS);
    eventually("the ClusterBundle's target", 30, || {
        let targets = targets.clone();
        async move { targets.get_opt("trust").await.ok().flatten() }
    })
    .await;

    // What kubectl says the ServiceAccount may do.
    let as_operator = Kubectl::find("deploy").unwrap().against(
        &world
            .server
            .kubeconfig_for(&Subject::ServiceAccount {
                namespace: SYSTEM.into(),
                name: ACCOUNT.into(),
            })
            .unwrap(),
    );
    for allowed in [
        vec!["auth", "can-i", "list", "secrets", "--all-namespaces"],
        vec![
            "auth",
            "can-i",
            "patch",
            "machines.cluster.x-k8s.io",
            "-n",
            NS,
        ],
        vec![
            "auth",
            "can-i",
            "patch",
            "issuedcertificates.caretaker.dev",
            "--subresource",
            "status",
            "-n",
            NS,
        ],
        vec![
            "auth",
            "can-i",
            "get",
            "leases/caretaker-operator",
            "-n",
            SYSTEM,
        ],
    ] {
        assert_eq!(
            as_operator.ok(&allowed, None).await.trim(),
            "yes",
            "{allowed:?}"
        );
    }
    for denied in [
        vec![
            "auth",
            "can-i",
            "delete",
            "machines.cluster.x-k8s.io",
            "-n",
            NS,
        ],
        vec!["auth", "can-i", "get", "leases/someone-else", "-n", SYSTEM],
        vec!["auth", "can-i", "create", "clusterrolebindings"],
        vec![
            "auth",
            "can-i",
            "patch",
            "issuedcertificates.caretaker.dev",
            "-n",
            NS,
        ],
    ] {
        let out = as_operator.run(&denied, None).await;
        assert!(!out.status.success(), "{denied:?}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "no",
            "{denied:?}"
        );
    }
    let listed = as_operator
        .ok(&["auth", "can-i", "--list", "-n", SYSTEM], None)
        .await;
    assert!(listed.contains("leases.coordination.k8s.io"), "{listed}");
    assert!(listed.contains("[caretaker-operator]"), "{listed}");

    // Leaving gives the Lease up (a patch).
    election.leave(Duration::from_secs(5)).await;

    // Least privilege.
    let log: Vec<Access> = world
        .server
        .access_log()
        .into_iter()
        .filter(|a| a.user == operator_user())
        .collect();
    let refused: Vec<&Access> = log.iter().filter(|a| !a.allowed).collect();
    assert!(refused.is_empty(), "the operator was refused: {refused:#?}");
    let role = Api::<ClusterRole>::all(world.client.clone())
        .get("caretaker-operator")
        .await
        .unwrap();
    let local = Api::<Role>::namespaced(world.client.clone(), SYSTEM)
        .get("caretaker-operator")
        .await
        .unwrap();
    let mut granted = grants(role.rules.as_deref().unwrap_or_default(), None);
    granted.extend(grants(
        local.rules.as_deref().unwrap_or_default(),
        Some(SYSTEM),
    ));
    let exceptions: BTreeSet<(String, String, String)> = UNUSED_ON_PURPOSE
        .iter()
        .map(|(verb, group, resource, _)| {
            (verb.to_string(), group.to_string(), resource.to_string())
        })
        .collect();
    let mut unused = Vec::new();
    let mut needlessly_excepted = Vec::new();
    for grant in &granted {
        let key = (
            grant.verb.clone(),
            grant.group.clone(),
            if grant.subresource.is_empty() {
                grant.resource.clone()
            } else {
                format!("{}/{}", grant.resource, grant.subresource)
            },
        );
        match (used(grant, &log), exceptions.contains(&key)) {
            (false, false) => unused.push(grant),
            (true, true) => needlessly_excepted.push(key),
            _ => {}
        }
    }
    assert!(
        unused.is_empty(),
        "granted by deploy/rbac.yaml, never used: {unused:#?}\nused: {log:#?}"
    );
    assert!(
        needlessly_excepted.is_empty(),
        "listed as unused on purpose, but used: {needlessly_excepted:?}"
    );
    webhook.abort();
    bootstrapping.abort();
}
