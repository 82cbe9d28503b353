//! Issue 31's Secret take-overs, performed as an attacker would, against the embedded API
//! server with RBAC on and the CertificateAuthority, IssuedCertificate and EtcdCertificates
//! controllers running: every Secret and ConfigMap caretaker writes carries its owner's mark
//! (`caretaker.dev/owner`), and caretaker writes or signs from nothing that carries another's.
//!
//! - mallory, who may create CertificateAuthorities and IssuedCertificates and read her own
//!   namespace's Secrets, names the etcd signer's Secret as her CA's: the CA is refused
//!   (`ObjectInUse`, naming the EtcdCertificates), her certificate gets nothing, the signer is
//!   untouched;
//! - a CertificateAuthority naming a certificate's Secret is refused, and the certificate goes
//!   on being renewed (before, the victim was refused too);
//! - an IssuedCertificate naming an etcd member's Secret is refused, and nothing is written
//!   to that Secret (before, two controllers flipped it back and forth);
//! - with `--authority-secret-namespaces`, a CA Secret outside those namespaces is refused
//!   before anything is read.

mod common;

use std::time::Duration;

use caretaker_api::names;
use caretaker_api::v1alpha1::{CertificateAuthority, EtcdCertificates, IssuedCertificate};
use caretaker_apiserver::{ApiServer, Authorization, Subject};
use caretaker_operator::authority::controller as authority_controller;
use caretaker_operator::etcd::controller as etcd_certificates;
use caretaker_operator::trust::api::Bundle;
use caretaker_operator::trust::controller as bundle;
use caretaker_operator::{Context, Settings};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use caretaker_testkit::capi_objects::install_trust_manager_crds;
use common::authorities::{create_namespace, eventually, install_caretaker_crds};
use common::outage::Outage;
use common::trust;

const ETCD: &str = "etcd-system";
const TEAM: &str = "team";
const SYSTEM: &str = "caretaker-system";

struct World {
    server: ApiServer,
    admin: kube::Client,
    /// mallory: CertificateAuthorities (cluster-wide), and IssuedCertificates and Secrets in
    /// `team` only.
    mallory: kube::Client,
    controllers: Vec<tokio::task::JoinHandle<()>>,
    /// Between the controllers and the server, when asked for: stopping it cuts their
    /// watches.
    outage: Option<Outage>,
}

impl Drop for World {
    fn drop(&mut self) {
        for task in &self.controllers {
            task.abort();
        }
    }
}

fn settings() -> Settings {
    Settings {
        retry_base: Duration::from_millis(200),
        ..Settings::default()
    }
}

async fn apply<K>(api: &Api<K>, object: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

/// The server with RBAC, caretaker's CRDs, mallory's grants, an EtcdCertificates in
/// etcd-system (its members need not run: its first revision is written without them), and
/// the controllers with `settings`.
async fn world(settings: Settings) -> World {
    world_with(settings, false).await
}

/// [`world`], with the controllers reaching the server through an [`Outage`] when
/// `behind_outage`, and a short watch history: a watch cut long enough must list again.
async fn world_with(settings: Settings, behind_outage: bool) -> World {
    let mut builder = ApiServer::builder()
        .tls(true)
        .authorization(Authorization::Rbac);
    if behind_outage {
        builder = builder.watch_history(10);
    }
    let server = builder.start().await.unwrap();
    let admin = server.client();
    install_caretaker_crds(&admin).await;
    for namespace in [ETCD, TEAM, SYSTEM] {
        create_namespace(&admin, namespace).await;
    }
    let user =
        json!([{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "mallory" }]);
    apply(
        &Api::<ClusterRole>::all(admin.clone()),
        json!({ "metadata": { "name": "ca-author" }, "rules": [
            { "apiGroups": ["caretaker.dev"], "resources": ["certificateauthorities"],
              "verbs": ["create", "get", "list", "watch"] }] }),
    )
    .await;
    apply(
        &Api::<ClusterRoleBinding>::all(admin.clone()),
        json!({ "metadata": { "name": "mallory-ca-author" }, "subjects": user,
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ca-author" } }),
    )
    .await;
    apply(
        &Api::<Role>::namespaced(admin.clone(), TEAM),
        json!({ "metadata": { "name": "certificates" }, "rules": [
            { "apiGroups": ["caretaker.dev"], "resources": ["issuedcertificates"],
              "verbs": ["create", "get", "list", "watch"] },
            { "apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get", "list"] }] }),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(admin.clone(), TEAM),
        json!({ "metadata": { "name": "mallory-certificates" }, "subjects": user,
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "certificates" } }),
    )
    .await;
    let mallory = kube::Client::try_from(
        server
            .kube_config_for(&Subject::User {
                name: "mallory".into(),
                groups: vec![],
            })
            .unwrap(),
    )
    .unwrap();

    apply(
        &Api::<EtcdCertificates>::namespaced(admin.clone(), ETCD),
        json!({
            "apiVersion": "caretaker.dev/v1alpha1", "kind": "EtcdCertificates",
            "metadata": { "name": "etcd", "namespace": ETCD },
            "spec": {
                "members": [{ "name": "m0", "addresses": ["127.0.0.1"] }],
                "quorum": { "endpoints": ["https://127.0.0.1:1"] },
            },
        }),
    )
    .await;
    let (operator_client, outage) = match behind_outage {
        false => (admin.clone(), None),
        true => {
            let outage = Outage::start(server.url()).await;
            let mut config = server.kube_config();
            config.cluster_url = outage.url().parse().unwrap();
            (kube::Client::try_from(config).unwrap(), Some(outage))
        }
    };
    let operator = |settings: &Settings| Context::new(operator_client.clone(), settings.clone());
    let controllers = vec![
        tokio::spawn(authority_controller::run(operator(&settings), None)),
        tokio::spawn(etcd_certificates::run(operator(&settings))),
    ];
    World {
        server,
        admin,
        mallory,
        controllers,
        outage,
    }
}

impl World {
    async fn secret(&self, namespace: &str, name: &str) -> Option<Secret> {
        Api::<Secret>::namespaced(self.admin.clone(), namespace)
            .get_opt(name)
            .await
            .unwrap()
    }

    /// Waits for the Secret, then for its writes to stop: its content once `settle` passes
    /// with no change.
    async fn settled_secret(&self, namespace: &str, name: &str) -> Secret {
        let mut last = eventually(&format!("Secret {namespace}/{name}"), 20, || {
            self.secret(namespace, name)
        })
        .await;
        loop {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let now = self.secret(namespace, name).await.unwrap();
            if now.metadata.resource_version == last.metadata.resource_version {
                return now;
            }
            last = now;
        }
    }

    /// [`Self::settled_secret`], for a ConfigMap.
    async fn settled_config_map(&self, namespace: &str, name: &str) -> ConfigMap {
        let config_maps = Api::<ConfigMap>::namespaced(self.admin.clone(), namespace);
        let mut last = config_maps.get(name).await.unwrap();
        loop {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            let now = config_maps.get(name).await.unwrap();
            if now.metadata.resource_version == last.metadata.resource_version {
                return now;
            }
            last = now;
        }
    }

    async fn create_ca(&self, client: &kube::Client, name: &str, secret: (&str, &str)) {
        apply(
            &Api::<CertificateAuthority>::all(client.clone()),
            json!({
                "apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
                "metadata": { "name": name },
                "spec": {
                    "commonName": format!("{name}-ca"),
                    "secret": { "namespace": secret.0, "name": secret.1 },
                    "bundle": { "namespace": TEAM, "name": format!("{name}-ca-bundle") },
                    "trustPropagation": "0s",
                },
            }),
        )
        .await;
    }

    async fn create_certificate(
        &self,
        client: &kube::Client,
        namespace: &str,
        name: &str,
        issuer: &str,
        secret: &str,
    ) {
        apply(
            &Api::<IssuedCertificate>::namespaced(client.clone(), namespace),
            json!({
                "apiVersion": "caretaker.dev/v1alpha1", "kind": "IssuedCertificate",
                "metadata": { "name": name, "namespace": namespace },
                "spec": {
                    "issuerRef": { "name": issuer },
                    "secretName": secret,
                    "commonName": format!("{name}.svc"),
                    "dnsNames": [format!("{name}.svc")],
                    "usages": ["server", "client"],
                },
            }),
        )
        .await;
    }

    /// The condition `type_` of CertificateAuthority `name`: status, reason, message.
    async fn ca_condition(&self, name: &str, type_: &str) -> Option<(String, String, String)> {
        let ca = Api::<CertificateAuthority>::all(self.admin.clone())
            .get(name)
            .await
            .ok()?;
        let condition = (ca.status?.certificate.conditions)
            .into_iter()
            .find(|c| c.type_ == type_)?;
        Some((condition.status, condition.reason, condition.message))
    }

    async fn certificate_condition(
        &self,
        namespace: &str,
        name: &str,
        type_: &str,
    ) -> Option<(String, String, String)> {
        let certificate = Api::<IssuedCertificate>::namespaced(self.admin.clone(), namespace)
            .get(name)
            .await
            .ok()?;
        let condition = (certificate.status?.conditions)
            .into_iter()
            .find(|c| c.type_ == type_)?;
        Some((condition.status, condition.reason, condition.message))
    }

    /// Waits for a Warning event about `name` with `reason`; its message.
    async fn warning(&self, namespace: &str, name: &str, reason: &str) -> String {
        let events: Api<Event> = Api::namespaced(self.admin.clone(), namespace);
        eventually(&format!("a {reason} Warning about {name}"), 20, || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                (e.involved_object.name.as_deref() == Some(name)
                    && e.reason.as_deref() == Some(reason)
                    && e.type_.as_deref() == Some("Warning"))
                .then(|| e.message.unwrap_or_default())
            })
        })
        .await
    }
}

/// The same data, annotations and version: nothing was written.
fn assert_untouched(before: &Secret, after: &Secret, what: &str) {
    assert_eq!(
        before.metadata.resource_version, after.metadata.resource_version,
        "{what} was written"
    );
    assert_eq!(before.data, after.data, "{what}'s data changed");
}

/// The critical attack: a CertificateAuthority naming the etcd signer's Secret, then a
/// certificate from it in the attacker's own namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_naming_the_etcd_signer_signs_nothing_and_writes_nothing() {
    let world = world(settings()).await;
    let signer = world.settled_secret(ETCD, "etcd-signer").await;
    let mark = &signer.metadata.annotations.as_ref().unwrap()[names::OWNER];
    assert!(
        mark.starts_with("EtcdCertificates/etcd-system/etcd/"),
        "{mark}"
    );
    // mallory cannot read it herself.
    let as_mallory = Api::<Secret>::namespaced(world.mallory.clone(), ETCD);
    assert!(as_mallory.get("etcd-signer").await.is_err());

    world
        .create_ca(&world.mallory, "borrowed", (ETCD, "etcd-signer"))
        .await;
    world
        .create_certificate(&world.mallory, TEAM, "grab", "borrowed", "grab-tls")
        .await;

    let note = world
        .warning("default", "borrowed", names::REASON_OBJECT_IN_USE)
        .await;
    assert!(
        note.contains(
            "Secret etcd-system/etcd-signer belongs to EtcdCertificates etcd-system/etcd"
        ),
        "{note}"
    );
    // The status is written before the Warning: whoever reads the Warning finds it.
    let (status, reason, _) = world.ca_condition("borrowed", "Degraded").await.unwrap();
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", names::REASON_OBJECT_IN_USE)
    );
    let (ready, _, _) = world.ca_condition("borrowed", "Ready").await.unwrap();
    assert_eq!(ready, "False");
    eventually("grab not Ready", 20, || async {
        let (status, _, _) = world.certificate_condition(TEAM, "grab", "Ready").await?;
        (status == "False").then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        world.secret(TEAM, "grab-tls").await.is_none(),
        "a certificate was issued from the etcd signer"
    );
    assert!(world.secret(TEAM, "borrowed-ca-bundle").await.is_none());
    assert_untouched(
        &signer,
        &world.secret(ETCD, "etcd-signer").await.unwrap(),
        "etcd-signer",
    );
}

/// A CertificateAuthority naming a certificate's Secret is refused; the certificate, whose
/// mark the Secret carries, is not: it is renewed as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_naming_a_certificates_secret_is_refused_and_the_certificate_renews() {
    let world = world(settings()).await;
    world
        .create_ca(&world.admin, "issuer", (SYSTEM, "issuer-ca"))
        .await;
    world
        .create_certificate(&world.admin, TEAM, "web", "issuer", "web-tls")
        .await;
    let web = world.settled_secret(TEAM, "web-tls").await;

    world
        .create_ca(&world.admin, "thief", (TEAM, "web-tls"))
        .await;
    let note = world
        .warning("default", "thief", names::REASON_OBJECT_IN_USE)
        .await;
    assert!(
        note.contains("Secret team/web-tls belongs to IssuedCertificate team/web"),
        "{note}"
    );
    // The victim goes on: a new name is a new certificate.
    Api::<IssuedCertificate>::namespaced(world.admin.clone(), TEAM)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": { "dnsNames": ["web.svc", "www.svc"] } })),
        )
        .await
        .unwrap();
    eventually("web-tls renewed", 20, || async {
        let now = world.secret(TEAM, "web-tls").await?;
        (now.data.as_ref()?.get("tls.crt") != web.data.as_ref()?.get("tls.crt")).then_some(())
    })
    .await;
    let (status, reason, _) = world
        .certificate_condition(TEAM, "web", "Degraded")
        .await
        .unwrap();
    assert_eq!((status.as_str(), reason.as_str()), ("False", "AsExpected"));
    assert!(world.secret(TEAM, "thief-ca-bundle").await.is_none());
}

/// An IssuedCertificate naming an etcd member's Secret: refused, and the two controllers
/// never write it in turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_naming_an_etcd_members_secret_is_refused_not_fought_over() {
    let world = world(settings()).await;
    let serving = world.settled_secret(ETCD, "etcd-serving-m0").await;
    world
        .create_ca(&world.admin, "issuer", (SYSTEM, "issuer-ca"))
        .await;
    world
        .create_certificate(&world.admin, ETCD, "serving", "issuer", "etcd-serving-m0")
        .await;
    let note = world
        .warning(ETCD, "serving", names::REASON_OBJECT_IN_USE)
        .await;
    assert!(
        note.contains(
            "Secret etcd-system/etcd-serving-m0 belongs to EtcdCertificates etcd-system/etcd"
        ),
        "{note}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_untouched(
        &serving,
        &world.secret(ETCD, "etcd-serving-m0").await.unwrap(),
        "etcd-serving-m0",
    );
}

/// `--authority-secret-namespaces`: a CA Secret elsewhere is refused, whoever owns it (here
/// none: it does not exist).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_secrets_stay_in_the_namespaces_the_administrator_allows() {
    let world = world(Settings {
        authority_secret_namespaces: Some([SYSTEM.to_string()].into()),
        ..settings()
    })
    .await;
    world
        .create_ca(&world.mallory, "elsewhere", (TEAM, "elsewhere-ca"))
        .await;
    world
        .create_ca(&world.admin, "allowed", (SYSTEM, "allowed-ca"))
        .await;
    let note = world
        .warning("default", "elsewhere", names::REASON_NAMESPACE_NOT_ALLOWED)
        .await;
    assert!(
        note.contains("spec.secret.namespace: \"team\" is not a namespace CertificateAuthority Secrets may be in (--authority-secret-namespaces: caretaker-system)"),
        "{note}"
    );
    world.settled_secret(SYSTEM, "allowed-ca").await;
    assert!(world.secret(TEAM, "elsewhere-ca").await.is_none());
}

/// A CertificateAuthority deleted and created again under its name while the operator's
/// watch was cut (so that it lists again, and never sees the deletion): the new object, whose
/// author cannot read the old one's Secret, gets nothing signed by the old CA that the
/// operator remembers by that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_created_again_under_a_deleted_cas_name_signs_nothing_with_its_key() {
    let mut world = world_with(settings(), true).await;
    world
        .create_ca(&world.admin, "issuer", (SYSTEM, "issuer-ca"))
        .await;
    eventually("issuer Ready", 20, || async {
        let (status, _, _) = world.ca_condition("issuer", "Ready").await?;
        (status == "True").then_some(())
    })
    .await;

    // The operator is cut off; the administrator deletes the CA, mallory takes its name.
    world.outage.as_mut().unwrap().stop();
    Api::<CertificateAuthority>::all(world.admin.clone())
        .delete("issuer", &Default::default())
        .await
        .unwrap();
    world
        .create_ca(&world.mallory, "issuer", (SYSTEM, "issuer-ca"))
        .await;
    // Past the watch history: the operator's watches resume with a new list.
    let past = (world.server.resource_version() / 1000 + 1) * 1000 + 20;
    let filler = Api::<ConfigMap>::namespaced(world.admin.clone(), "default");
    for i in 0.. {
        if world.server.resource_version() > past {
            break;
        }
        apply(
            &filler,
            json!({ "metadata": { "name": format!("filler-{i}") } }),
        )
        .await;
    }
    world.outage.as_mut().unwrap().resume().await;

    // Once the operator acts on mallory's CA, it is refused (the Secret is the old one's)...
    eventually("mallory's issuer refused", 30, || async {
        let (status, reason, message) = world.ca_condition("issuer", "Degraded").await?;
        (status == "True"
            && reason == names::REASON_OBJECT_IN_USE
            && message.contains("belongs to an earlier CertificateAuthority issuer"))
        .then_some(())
    })
    .await;
    // ...and her certificate gets nothing from the old CA's key.
    world
        .create_certificate(&world.mallory, TEAM, "grab", "issuer", "grab-tls")
        .await;
    let (status, _, message) = eventually("grab's Ready condition", 20, || {
        world.certificate_condition(TEAM, "grab", "Ready")
    })
    .await;
    assert!(
        world.secret(TEAM, "grab-tls").await.is_none(),
        "a certificate was issued with the deleted CA's key (Ready {status}: {message})"
    );
    assert_eq!(status, "False", "{message}");
}

/// A CertificateAuthority whose bundle ConfigMap takes, first, the name a Bundle's target will
/// have (here in a namespace mallory cannot write): the Bundle takes it over, and the CA,
/// refused, leaves it (before, the two controllers wrote `ca-bundle.crt` in turn, some 80
/// times a second, the namespace trusting mallory's CA every other write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundle_target_squatted_by_a_cas_bundle_goes_to_the_bundle_not_fought_over() {
    let mut world = world(settings()).await;
    install_trust_manager_crds(&world.admin).await.unwrap();
    create_namespace(&world.admin, trust::TRUST).await;
    let roots = trust::ca("root-a");
    apply(
        &Api::<ConfigMap>::namespaced(world.admin.clone(), trust::TRUST),
        json!({ "metadata": { "name": "roots" }, "data": { "ca.crt": roots } }),
    )
    .await;

    apply(
        &Api::<CertificateAuthority>::all(world.mallory.clone()),
        json!({
            "apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
            "metadata": { "name": "squat" },
            "spec": {
                "commonName": "squat-ca",
                "secret": { "namespace": TEAM, "name": "squat-ca" },
                "bundle": { "namespace": SYSTEM, "name": "trust" },
                "trustPropagation": "0s",
            },
        }),
    )
    .await;
    let config_maps = Api::<ConfigMap>::namespaced(world.admin.clone(), SYSTEM);
    eventually("the CA's bundle at caretaker-system/trust", 20, || async {
        let found = config_maps.get_opt("trust").await.unwrap()?;
        found.data?.get("ca-bundle.crt").map(|_| ())
    })
    .await;

    let operator = Context::new(world.admin.clone(), settings());
    world.controllers.push(tokio::spawn(bundle::run(operator)));
    let mut bundle = trust::simple_bundle(None);
    bundle["spec"]["target"]["configMap"]["key"] = json!("ca-bundle.crt");
    apply(&Api::<Bundle>::all(world.admin.clone()), bundle).await;

    // The Bundle takes its target, as trust-manager takes any object at its target's name;
    // the CA leaves it to the Bundle, and nothing writes it any more.
    let note = world
        .warning("default", "squat", names::REASON_OBJECT_IN_USE)
        .await;
    assert!(
        note.contains("ConfigMap caretaker-system/trust is controlled by Bundle trust"),
        "{note}"
    );
    let settled = world.settled_config_map(SYSTEM, "trust").await;
    assert_eq!(
        settled.data.unwrap()["ca-bundle.crt"],
        trust::canonical(&[&roots])
    );
}

/// The webhook bootstrap's CertificateAuthority, squatted: mallory, who may create
/// CertificateAuthorities, makes `caretaker-webhook` first, with her own Secret and for every
/// namespace. The bootstrap used to keep it as it found it, then made the webhook's
/// certificate from it and the configuration that trusts it: mallory would hold a CA the API
/// server trusts for admission. Now it refuses, naming the object, and makes nothing after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_bootstrap_relies_on_no_ca_someone_else_made_at_its_name() {
    use caretaker_operator::webhook::bootstrap::{self, Bootstrap};
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;

    let world = world(settings()).await;
    world
        .create_ca(&world.mallory, bootstrap::NAME, (TEAM, "squat-ca"))
        .await;
    let objects = Bootstrap {
        namespace: SYSTEM.into(),
        service: "caretaker-webhook".into(),
        url: Some("https://127.0.0.1:9443".parse().unwrap()),
    }
    .objects();

    let refused = bootstrap::ensure_once(&world.admin, &objects)
        .await
        .expect_err("the bootstrap relied on mallory's CA");
    assert!(
        refused.to_string().starts_with(
            "CertificateAuthority caretaker-webhook exists and is not the webhook bootstrap's \
             (spec.secret is team/squat-ca, not caretaker-system/caretaker-webhook-ca; \
             spec.bundle is team/caretaker-webhook-ca-bundle, not caretaker-system/caretaker-webhook-ca-bundle; \
             spec.allowedNamespaces is [], not [\"caretaker-system\"])"
        ),
        "{refused}"
    );
    let certificates = Api::<IssuedCertificate>::namespaced(world.admin.clone(), SYSTEM);
    assert!(
        certificates
            .get_opt(bootstrap::NAME)
            .await
            .unwrap()
            .is_none()
    );
    let configurations = Api::<ValidatingWebhookConfiguration>::all(world.admin.clone());
    assert!(
        configurations
            .get_opt(bootstrap::NAME)
            .await
            .unwrap()
            .is_none()
    );

    // Once it is gone, the bootstrap makes its own; one of the same spec is its own,
    // whoever made it (it signs only in caretaker-system, from a Secret kept there).
    Api::<CertificateAuthority>::all(world.admin.clone())
        .delete(bootstrap::NAME, &Default::default())
        .await
        .unwrap();
    eventually("the squatted CA gone", 20, || async {
        let gone = Api::<CertificateAuthority>::all(world.admin.clone())
            .get_opt(bootstrap::NAME)
            .await
            .unwrap()
            .is_none();
        gone.then_some(())
    })
    .await;
    bootstrap::ensure_once(&world.admin, &objects)
        .await
        .unwrap();
    assert!(
        certificates
            .get_opt(bootstrap::NAME)
            .await
            .unwrap()
            .is_some()
    );
    bootstrap::ensure_once(&world.admin, &objects)
        .await
        .unwrap();
}

/// An upgrade from a caretaker whose objects carried no owner mark: the bootstrap hands its
/// own Secrets and ConfigMap over (at the names it fixes, in its namespace only), so its CA
/// goes on with its key rather than being refused; an object of that name elsewhere, or one
/// carrying another's mark, is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_bootstrap_hands_over_its_earlier_unmarked_objects_only() {
    use caretaker_operator::webhook::bootstrap::{self, Bootstrap};

    let world = world(settings()).await;
    let objects = Bootstrap {
        namespace: SYSTEM.into(),
        service: "caretaker-webhook".into(),
        url: None,
    }
    .objects();
    let earlier =
        caretaker_pki::CertificateAuthority::create(&caretaker_pki::CaSpec::new(bootstrap::NAME))
            .unwrap();
    let secret = |namespace: &str, annotations: Value| {
        json!({
            "metadata": { "name": bootstrap::CA_SECRET, "namespace": namespace,
                          "labels": { "app.kubernetes.io/managed-by": "caretaker" },
                          "annotations": annotations },
            "type": "kubernetes.io/tls",
            "stringData": { "tls.crt": earlier.certificate_pem(),
                            "tls.key": earlier.private_key_pem() },
        })
    };
    apply(
        &Api::<Secret>::namespaced(world.admin.clone(), SYSTEM),
        secret(SYSTEM, json!({})),
    )
    .await;
    apply(
        &Api::<Secret>::namespaced(world.admin.clone(), TEAM),
        secret(TEAM, json!({})),
    )
    .await;
    // The earlier CA, as an earlier bootstrap made it; refused until handed over.
    Api::<CertificateAuthority>::all(world.admin.clone())
        .create(&PostParams::default(), &objects.authority)
        .await
        .unwrap();
    world
        .warning("default", bootstrap::NAME, names::REASON_OBJECT_NOT_MANAGED)
        .await;

    bootstrap::ensure_once(&world.admin, &objects)
        .await
        .unwrap();
    eventually("the earlier CA Ready with its own key", 20, || async {
        let (status, _, _) = world.ca_condition(bootstrap::NAME, "Ready").await?;
        (status == "True").then_some(())
    })
    .await;
    let adopted = world.secret(SYSTEM, bootstrap::CA_SECRET).await.unwrap();
    let annotations = adopted.metadata.annotations.unwrap();
    assert!(
        annotations[names::OWNER].starts_with("CertificateAuthority/caretaker-webhook/"),
        "{annotations:?}"
    );
    assert_eq!(
        adopted.data.unwrap()["tls.crt"].0,
        earlier.certificate_pem().into_bytes(),
        "the earlier CA was replaced"
    );
    let elsewhere = world.secret(TEAM, bootstrap::CA_SECRET).await.unwrap();
    let annotations = elsewhere.metadata.annotations.unwrap_or_default();
    assert!(
        !annotations.contains_key(names::OWNER) && !annotations.contains_key(names::ADOPT),
        "outside its namespace: {annotations:?}"
    );
}

/// A CertificateAuthority whose bundle ConfigMap is in a namespace mallory may write: she adds
/// her own CA to `ca-bundle.crt`, and the CA Secret is deleted (to re-key) while the operator
/// is cut off. The new CA Secret used to copy every CA of the bundle into `previous.crt`,
/// trusted from then on (by the bundle, every injection point and every certificate's
/// `ca.crt`); now, the bundle being in another namespace than the CA Secret, only the CA
/// caretaker knew as this CA's stays, and her CA leaves the bundle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_planted_in_a_bundle_configmap_is_never_taken_as_trusted() {
    let mut world = world_with(settings(), true).await;
    let user =
        json!([{ "kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "mallory" }]);
    apply(
        &Api::<Role>::namespaced(world.admin.clone(), TEAM),
        json!({ "metadata": { "name": "config-maps" }, "rules": [
            { "apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch"] }] }),
    )
    .await;
    apply(
        &Api::<RoleBinding>::namespaced(world.admin.clone(), TEAM),
        json!({ "metadata": { "name": "mallory-config-maps" }, "subjects": user,
                "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "config-maps" } }),
    )
    .await;
    // Older CAs stay an hour: what the new CA Secret takes in is still there to be read.
    apply(
        &Api::<CertificateAuthority>::all(world.admin.clone()),
        json!({
            "apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
            "metadata": { "name": "shared" },
            "spec": {
                "commonName": "shared-ca",
                "secret": { "namespace": SYSTEM, "name": "shared-ca" },
                "bundle": { "namespace": TEAM, "name": "shared-ca-bundle" },
                "trustPropagation": "1h",
            },
        }),
    )
    .await;
    let original = world.settled_secret(SYSTEM, "shared-ca").await;
    let original = String::from_utf8(original.data.unwrap()["tls.crt"].0.clone()).unwrap();
    let planted = trust::ca("mallory-root");

    world.outage.as_mut().unwrap().stop();
    let bundles = Api::<ConfigMap>::namespaced(world.mallory.clone(), TEAM);
    let bundle = bundles.get("shared-ca-bundle").await.unwrap();
    let published = &bundle.data.unwrap()["ca-bundle.crt"];
    bundles
        .patch(
            "shared-ca-bundle",
            &PatchParams::default(),
            &Patch::Merge(&json!({ "data": { "ca-bundle.crt": format!("{published}{planted}") } })),
        )
        .await
        .unwrap();
    Api::<Secret>::namespaced(world.admin.clone(), SYSTEM)
        .delete("shared-ca", &Default::default())
        .await
        .unwrap();
    world.outage.as_mut().unwrap().resume().await;

    let remade = eventually("the CA Secret made again", 30, || async {
        world.secret(SYSTEM, "shared-ca").await.filter(|s| {
            s.data.as_ref().is_some_and(|d| {
                d.get("tls.crt").map(|c| c.0.as_slice()) != Some(original.as_bytes())
            })
        })
    })
    .await;
    let data = remade.data.unwrap();
    let previous = data
        .get("previous.crt")
        .map(|p| String::from_utf8(p.0.clone()).unwrap())
        .unwrap_or_default();
    assert!(
        !previous.contains(planted.trim()),
        "mallory's CA was taken in as an older CA of this one"
    );
    assert!(
        previous.contains(original.trim()),
        "the CA it had stays trusted: {previous}"
    );
    let settled = world.settled_config_map(TEAM, "shared-ca-bundle").await;
    assert!(!settled.data.unwrap()["ca-bundle.crt"].contains(planted.trim()));
}

/// CA-bundle injection by the signer's rule. An administrator's webhook configuration asks for
/// the bundle of CertificateAuthority `webhooks`, not made yet; mallory, who may only create
/// CertificateAuthorities, makes `webhooks` naming the etcd signer's Secret and bundle. Its
/// controller refuses it, but injection read the two without their marks, found every
/// certificate of the bundle kept in the Secret, and put the etcd signer in the webhook's
/// `caBundle`. Now it refuses, naming the owner, and injects nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injection_takes_nothing_from_a_ca_naming_another_objects_secret_and_bundle() {
    use caretaker_operator::injection::controller as ca_injection;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;

    let mut world = world(settings()).await;
    world.settled_secret(ETCD, "etcd-signer").await;
    let operator = Context::new(world.admin.clone(), settings());
    world
        .controllers
        .push(tokio::spawn(ca_injection::run(operator, None)));
    let configurations = Api::<ValidatingWebhookConfiguration>::all(world.admin.clone());
    apply(
        &configurations,
        json!({
            "metadata": { "name": "guarded",
                          "annotations": { names::injection::INJECT_CA_FROM: "webhooks" } },
            "webhooks": [{
                "name": "guarded.example.com",
                "clientConfig": { "url": "https://127.0.0.1:1/validate" },
                "rules": [{ "apiGroups": ["example.com"], "apiVersions": ["v1"],
                            "operations": ["CREATE"], "resources": ["gadgets"] }],
                "sideEffects": "None", "admissionReviewVersions": ["v1"],
                "failurePolicy": "Ignore",
            }],
        }),
    )
    .await;
    apply(
        &Api::<CertificateAuthority>::all(world.mallory.clone()),
        json!({
            "apiVersion": "caretaker.dev/v1alpha1", "kind": "CertificateAuthority",
            "metadata": { "name": "webhooks" },
            "spec": {
                "commonName": "webhooks-ca",
                "secret": { "namespace": ETCD, "name": "etcd-signer" },
                "bundle": { "namespace": ETCD, "name": "etcd-ca-bundle" },
            },
        }),
    )
    .await;

    let events: Api<Event> = Api::namespaced(world.admin.clone(), "default");
    let outcome = eventually("injection refused or done", 20, || async {
        let guarded = configurations.get("guarded").await.ok()?;
        let injected = (guarded.webhooks?.into_iter())
            .find_map(|hook| hook.client_config.ca_bundle)
            .map(|bundle| format!("injected {} bytes", bundle.0.len()));
        let refused = (events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter())
        .find(|e| {
            e.involved_object.name.as_deref() == Some("guarded")
                && e.reason.as_deref() == Some(names::injection::EVENT_REFUSED)
        })
        .and_then(|e| e.message);
        injected.or(refused)
    })
    .await;
    assert!(
        outcome.contains(
            "CertificateAuthority webhooks: ConfigMap etcd-system/etcd-ca-bundle belongs to EtcdCertificates etcd-system/etcd"
        ),
        "{outcome}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let guarded = configurations.get("guarded").await.unwrap();
    assert!(
        (guarded.webhooks.unwrap().iter()).all(|h| h.client_config.ca_bundle.is_none()),
        "the etcd signer was injected"
    );
}
